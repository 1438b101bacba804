"""Regression tests for what hostile testing broke in the manager's lifecycle, resync and ledger:
rewinds that hid protected messages, cancellation and bugs in the background summarizer,
billed briefings lost at close, corrupt saved ledgers, decisions that could not apply."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import agentctx.manager as manager_module
from agentctx import (
    Budget,
    BudgetExceeded,
    Chain,
    CompactionWarning,
    ConfigError,
    ContextCompacted,
    ContextManager,
    DeterministicCompaction,
    Event,
    HistoryResynced,
    LlmCompaction,
    LlmCompactionConfig,
    MemoryRecallStore,
    Message,
    SQLiteRecallStore,
    StoreError,
    SummaryRejected,
    SummaryRequest,
    SummaryResult,
    SummaryStale,
    TextBlock,
    ThinkingBlock,
    ToolOutputPipeline,
    ToolResultMessage,
    UnsupportedMessageError,
    Usage,
    UserMessage,
)
from agentctx.boundaries import MISSING_RESULT_TEXT
from agentctx.ledger import Ledger, ReplaceResult, ReplaceSpan, anchor, render
from agentctx.messages import (
    AssistantMessage,
    SummaryMessage,
    ToolCall,
    canonical_json,
    fingerprint,
    from_dict,
    text_of,
    to_dict,
)
from agentctx.strategy import CompactionContext
from agentctx.testing import assert_view_ok, synthetic_session
from agentctx.testing.scripted import Outcome, ScriptedSummarizer
from agentctx.tokens import MessageCounter

from .helpers import assistant, call, result, user

BRIEFING = (
    "## Goal\nShip the parser.\n## Constraints\nKeep the API.\n## Decisions\nUse LALR.\n"
    "## Files touched\nsrc/parser.py\n## Open items\nWrite tests."
)


def questions(n: int, *, thinking: bool = False) -> list[Message]:
    """The task, then ``n`` turns of question, a read call, a 60-line result and an answer."""
    history: list[Message] = [user("the task: fix the parser")]
    for i in range(n):
        body = "\n".join(f"line {k} of file {i}" for k in range(60))
        history += [
            user(f"question {i}"),
            assistant(call(f"r{i}"), thinking=f"plan {i}" if thinking else None),
            result(f"r{i}", body),
            assistant(text=f"answer {i}"),
        ]
    return history


def texts(view: list[Message]) -> list[str]:
    return [m.text if not hasattr(m, "content") else text_of(m.content) for m in view]  # type: ignore[union-attr]


# ---------------------------------------------------------------------------------------
# 1. A rewind never hides what the shorter history protects


@pytest.mark.parametrize(
    ("window", "make"),
    [
        (3_600, lambda: Chain([ToolOutputPipeline(), DeterministicCompaction()])),
        (2_600, DeterministicCompaction),
        (3_000, DeterministicCompaction),
    ],
)
async def test_a_rewind_keeps_the_latest_user_message_and_the_newest_turn(
    window: int, make: Callable[[], Any]
) -> None:
    history = questions(12)
    async with ContextManager(
        Budget(context_window=window, reserve_output=500), strategy=make(), on_over_budget="send"
    ) as ctx:
        await ctx.prepare(history)
        rewound = history[:-12]  # the user rewinds three turns
        view = await ctx.prepare(rewound)
    assert_view_ok(view, rewound)
    seen = texts(view)
    assert "question 8" in seen  # the latest user message of the rewound history
    assert "answer 8" in seen  # its turn is the newest complete one: never condensed
    # Its tool result is there too (whole, or cleared to a placeholder: output may be).
    assert any(isinstance(m, ToolResultMessage) and m.tool_call_id == "r8" for m in view)


async def test_a_rewind_to_a_turn_with_signed_thinking_sends_its_thinking_verbatim() -> None:
    history = questions(12, thinking=True)
    async with ContextManager(
        Budget(context_window=3_000, reserve_output=500), on_over_budget="send"
    ) as ctx:
        await ctx.prepare(history)
        rewound = history[:-12]
        view = await ctx.prepare(rewound)
    assert_view_ok(view, rewound)
    thinking = [
        b for m in view if isinstance(m, AssistantMessage) for b in m.content
        if isinstance(b, ThinkingBlock)
    ]  # fmt: skip
    assert ThinkingBlock("plan 8", "sig-plan 8") in thinking


def test_the_ledger_drops_what_covers_a_protected_message() -> None:
    history = questions(3)
    ledger = Ledger()
    from agentctx.ledger import ReplaceSpan

    summary = AssistantMessage((TextBlock("condensed"),), "stop")
    last = len(history)
    ledger.add(ReplaceSpan(anchor(history, 10), last, anchor(history, last - 1), (summary,), "x"))
    assert ledger.drop_protected(history)  # the newest complete turn was under it
    assert len(ledger) == 0


# ---------------------------------------------------------------------------------------
# 20. A decision that cannot apply is refused, not silently ignored


class ImageDropper:
    """The custom strategy sketch filled in literally: replace the image the user sent."""

    async def compact(self, ctx: CompactionContext) -> None:
        for i, m in enumerate(ctx.raw):
            if isinstance(m, UserMessage) and i == 0:
                ctx.take(ReplaceResult(anchor(ctx.raw, i), (TextBlock("[image]"),), "custom"))


async def test_a_decision_that_does_not_fit_its_message_is_a_config_error() -> None:
    async with ContextManager(1_000_000, strategy=ImageDropper()) as ctx:
        with pytest.raises(ConfigError, match="ReplaceResult is anchored at message 0, a User"):
            await ctx.prepare([user("look at this")])
        assert len(ctx.ledger) == 0


def test_check_fits_names_what_is_wrong() -> None:
    from agentctx.ledger import Anchor, ReplaceArguments, check_fits

    history = questions(1)
    with pytest.raises(ConfigError, match="which the AssistantMessage at message 2 does not"):
        check_fits(ReplaceArguments(anchor(history, 2), "nope", {}, "x"), history)
    with pytest.raises(ConfigError, match="not the message it names"):
        check_fits(ReplaceResult(Anchor(3, "bad"), (TextBlock("x"),), "x"), history)
    check_fits(ReplaceResult(anchor(history, 3), (TextBlock("x"),), "x"), history)


# ---------------------------------------------------------------------------------------
# 15. A corrupt saved ledger: a typed error, and a session that goes on


@pytest.mark.parametrize(
    "saved",
    ['[{"kind": "Keep", "at": [0, "ab"', "{}", '[{"kind": "ReplaceSpan", "at": [0]}]', "[[1]]"],
)
def test_an_unreadable_ledger_is_a_store_error(saved: str) -> None:
    with pytest.raises(StoreError, match="the saved ledger is unreadable"):
        Ledger.from_json(saved)


async def test_a_session_with_a_corrupt_saved_ledger_starts_over_and_says_so(
    tmp_path: Path,
) -> None:
    store = SQLiteRecallStore(tmp_path / "s.db")
    store.save_ledger("run-1", '[{"kind": "Keep", "at": [0, "ab"')  # truncated
    events: list[Event] = []
    async with ContextManager(100_000, recall=store, session_id="run-1") as ctx:
        ctx.subscribe(events.append)
        view = await ctx.prepare(questions(2))
    warnings = [e for e in events if isinstance(e, CompactionWarning)]
    assert [w.code for w in warnings] == ["ledger_unreadable"]
    assert "unreadable" in warnings[0].message and len(view) == 9
    store.close()


_EDITS: list[tuple[str, str, object]] = [
    ("ReplaceSpan", "at", [1.0, None]),  # None: keep the fingerprint
    ("ReplaceSpan", "at", [-1, None]),
    ("ReplaceSpan", "at", [True, None]),
    ("ReplaceSpan", "at", ["3", None]),
    ("ReplaceSpan", "end", 1.5),
    ("ReplaceSpan", "end", 0),
    ("ReplaceSpan", "last", [-2, None]),
    ("ReplaceSpan", "reason", None),
    ("ReplaceResult", "at", [2.0, None]),
    ("ReplaceResult", "recall_id", 7),
]


@pytest.mark.parametrize(("kind", "key", "value"), _EDITS)
async def test_a_saved_ledger_edited_by_hand_is_unreadable_not_a_crash(
    tmp_path: Path, kind: str, key: str, value: object
) -> None:
    """Found by a hostile run: an anchor index that was a float, negative or a string in a
    saved ledger loaded, then failed the resumed session's first call with a TypeError or
    a RecursionError (the view rendered it before the stale decisions were dropped)."""
    import json

    history = questions(12)
    long_output = "\n".join(f"build step {k}" for k in range(500))
    history[1:1] = [user("build it"), assistant(call("b")), result("b", long_output)]
    history[4:4] = [assistant(text="built")]
    store = SQLiteRecallStore(tmp_path / "s.db")
    async with ContextManager(
        Budget(context_window=1_800, reserve_output=200), recall=store, session_id="run-1"
    ) as first:
        await first.prepare(history)
    saved = json.loads(first.ledger.to_json())
    target = next(d for d in saved if d["kind"] == kind)
    if isinstance(value, list) and value[1] is None:
        value = [value[0], target[key][1]]
    target[key] = value
    store.save_ledger("run-1", json.dumps(saved))
    events: list[Event] = []
    async with ContextManager(
        Budget(context_window=1_800, reserve_output=200), recall=store, session_id="run-1"
    ) as ctx:
        ctx.subscribe(events.append)
        view = await ctx.prepare(history)
        assert_view_ok(view, history)
    assert [e.code for e in events if isinstance(e, CompactionWarning)] == ["ledger_unreadable"]
    store.close()


@pytest.mark.parametrize("error", [StoreError("database is locked"), ConnectionError("down")])
async def test_a_store_down_when_a_worker_starts_does_not_stop_the_session(
    tmp_path: Path, error: Exception
) -> None:
    """Found by the hostile-history generator with a store that fails at random: loading the
    saved ledger raised out of ``ContextManager(...)`` itself, so a worker that started while
    the store was down could not run at all."""

    class Down(SQLiteRecallStore):
        def load_ledger(self, session_id: str) -> str | None:
            raise error

    store = Down(tmp_path / "s.db")
    events: list[Event] = []
    async with ContextManager(100_000, recall=store, session_id="run-1") as ctx:
        ctx.subscribe(events.append)
        view = await ctx.prepare(questions(2))
        await ctx.prepare([*questions(2), user("more")])
    warnings = [e for e in events if isinstance(e, CompactionWarning)]
    assert [w.code for w in warnings] == ["ledger_unavailable"]
    assert str(error) in warnings[0].message and len(view) == 9
    store.close()


def _condensed_before_the_last_question() -> tuple[list[Message], Ledger]:
    """Four turns, and a span over the first two: fine while a later turn is the newest."""
    from agentctx.ledger import ReplaceSpan
    from agentctx.messages import SummaryMessage

    history = questions(4)  # the task, then turns at 1, 5, 9 and 13
    summary = (SummaryMessage("[turns 0-1]"),)
    return history, Ledger([ReplaceSpan(anchor(history, 1), 9, anchor(history, 8), summary, "x")])


@pytest.mark.parametrize("source", ["store", "argument"])
async def test_decisions_made_elsewhere_give_way_to_what_a_shorter_history_protects(
    tmp_path: Path, source: str
) -> None:
    """Found by a wide run of the hostile-history generator: a worker resuming a saved ledger
    on a history cut back after a span's end (its anchors all still match) sent a view
    without the latest user message and the newest complete turn, which now sat inside the
    span. Decisions are checked against what the first history protects, not only against
    its anchors, whether they come from the store or from ``ledger=``."""
    history, ledger = _condensed_before_the_last_question()
    cut = history[:9]  # the last two turns gone: the span's anchors all still match
    store = SQLiteRecallStore(tmp_path / "s.db")
    store.save_ledger("run-1", ledger.to_json())
    given = Ledger.from_json(ledger.to_json()) if source == "argument" else None
    async with ContextManager(100_000, recall=store, session_id="run-1", ledger=given) as ctx:
        view = await ctx.prepare([*cut, user("and then?")])
        assert_view_ok(view, ctx.raw)
        assert "question 1" in texts(view) and "answer 1" in texts(view)
        assert len(ctx.ledger) == 0
    store.close()


async def test_decisions_made_elsewhere_that_still_fit_render_the_view_they_did(
    tmp_path: Path,
) -> None:
    """On the history they were made on (and on one that only grew), the checks drop
    nothing: a resumed worker sends exactly what the last one did."""
    history, ledger = _condensed_before_the_last_question()
    store = SQLiteRecallStore(tmp_path / "s.db")
    store.save_ledger("run-1", ledger.to_json())
    async with ContextManager(100_000, recall=store, session_id="run-1") as ctx:
        view = await ctx.prepare(history)
        assert len(ctx.ledger) == 1 and "[turns 0-1]" in texts(view)
        assert_view_ok(view, ctx.raw)
    store.close()


# ---------------------------------------------------------------------------------------
# 5, 6. Only the manager's own cancel ends background work; a summarizer bug is a failure


class Misbehaving:
    """A summarizer whose first call raises ``first``; later calls answer with a briefing."""

    model = "claude-haiku-4-5"

    def __init__(self, first: BaseException | None) -> None:
        self.first = first
        self.calls = 0

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.calls += 1
        await anyio.lowlevel.checkpoint()
        if self.calls == 1 and self.first is not None:
            raise self.first
        return SummaryResult(
            text=BRIEFING, stop_reason="stop", usage=Usage(input_tokens=100, output_tokens=50)
        )


class CustomBase(BaseException):
    pass


def tool_turn(i: int) -> list[Message]:
    body = "\n".join(f"ok {n}" for n in range(40))
    return [
        UserMessage.of(f"run command {i}"),
        assistant(call(f"call-{i}", "bash", command=f"cmd {i}")),
        result(f"call-{i}", body, "bash"),
        AssistantMessage.of(f"done {i}"),
    ]


async def run_until_spliced(ctx: ContextManager, llm: LlmCompaction, turns: int = 40) -> bool:
    history: list[Message] = [user("the task")]
    for i in range(turns):
        history += tool_turn(i)
        await ctx.prepare(history)
        for _ in range(5):
            await anyio.lowlevel.checkpoint()
        if llm.spend.requests and any(m for m in ctx.ledger.spans if m.reason == "llm"):
            return True
    return any(s for s in ctx.ledger.spans if "llm" in s.reason or "brief" in s.reason)


@pytest.mark.parametrize(
    "first",
    [asyncio.CancelledError(), CustomBase("bug"), GeneratorExit(), RuntimeError("bug")],
    ids=["stray-cancel", "custom-base-exception", "generator-exit", "exception"],
)
async def test_a_summarizer_bug_is_a_failed_request_and_work_goes_on(
    first: BaseException,
) -> None:
    summarizer = Misbehaving(first)
    llm = LlmCompaction(summarizer, LlmCompactionConfig(trigger_ratio=0.3))
    events: list[Event] = []
    body_finished = False
    async with ContextManager(
        Budget(context_window=3_000, reserve_output=1_000),
        strategy=Chain([llm, DeterministicCompaction()]),
    ) as ctx:
        ctx.subscribe(events.append)

        async def async_subscriber(event: Event) -> None:
            await anyio.lowlevel.checkpoint()

        ctx.subscribe(async_subscriber)
        await run_until_spliced(ctx, llm)
        body_finished = True
    assert body_finished  # the caller's own code was never cancelled
    failed = [e for e in events if isinstance(e, SummaryRejected) and e.reason == "failed"]
    assert len(failed) == 1 and type(first).__name__ in failed[0].detail
    assert summarizer.calls >= 2  # background summarization went on after the failure
    assert llm.spend.requests >= 1


@pytest.mark.parametrize("exc", ["KeyboardInterrupt()", "SystemExit(3)"])
def test_an_interrupt_in_a_summarizer_leaves_as_itself(exc: str) -> None:
    """Caught inside the coroutine (hostile run U, finding 1: it left ``async with`` as a
    group inside a group, the background work's task group being inside the manager's; only
    asyncio raising it again out of the loop let a catch outside ``anyio.run`` see it)."""
    # In a process of its own: asyncio lets an interrupt out of the event loop at once.
    code = f"""
import anyio
from agentctx import Budget, ContextManager, LlmCompaction, LlmCompactionConfig
from tests.test_hardening_manager import Misbehaving, run_until_spliced

async def main():
    llm = LlmCompaction(Misbehaving({exc}), LlmCompactionConfig(trigger_ratio=0.3))
    budget = Budget(context_window=3_000, reserve_output=1_000)
    try:
        async with ContextManager(budget, strategy=llm) as ctx:
            await run_until_spliced(ctx, llm)
            await anyio.sleep(1)
    except {exc.split("(")[0]} as e:
        print("caught as itself", type(e).__name__)
try:
    anyio.run(main)
except {exc.split("(")[0]}:
    pass  # asyncio raises the interrupt once more out of the loop
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[1]
    )
    assert done.stdout.strip() == f"caught as itself {exc.split('(')[0]}", done.stderr


# The cancelled task's coroutine was never awaited: Python says so when it is collected.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_cancelling_the_request_task_before_it_starts_is_a_failed_request() -> None:
    summarizer = ScriptedSummarizer([], default=BRIEFING)
    llm = LlmCompaction(summarizer, LlmCompactionConfig(trigger_ratio=0.3))
    events: list[Event] = []
    async with ContextManager(
        Budget(context_window=3_000, reserve_output=1_000),
        strategy=Chain([llm, DeterministicCompaction()]),
    ) as ctx:
        ctx.subscribe(events.append)

        async def async_subscriber(event: Event) -> None:
            await anyio.lowlevel.checkpoint()

        ctx.subscribe(async_subscriber)
        history: list[Message] = [user("the task")]
        cancelled = 0
        for i in range(40):
            history += tool_turn(i)
            await ctx.prepare(history)
            if not cancelled and llm.phase == "in_flight":
                for task in asyncio.all_tasks():  # before it ever ran
                    if task.get_name() == "agentctx-llm-compaction":
                        task.cancel()
                        cancelled += 1
            await anyio.sleep(0.01)
        assert cancelled == 1
        assert llm.phase != "in_flight" or summarizer.requests
    failed = [e for e in events if isinstance(e, SummaryRejected) and e.reason == "failed"]
    assert [e.detail for e in failed] == ["its task was cancelled before it started"]
    assert summarizer.requests  # later requests were sent
    assert llm.spend.requests == len(summarizer.requests)


# ---------------------------------------------------------------------------------------
# 3. A briefing that completes while the manager closes is reported, exactly once


class ArrivesDuringClose:
    """A response already on its way: it completes even though the request is cancelled."""

    model = "claude-haiku-4-5"

    def __init__(self) -> None:
        self.called = anyio.Event()
        self.release = anyio.Event()

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.called.set()
        with anyio.CancelScope(shield=True):
            await self.release.wait()
        return SummaryResult(
            text=BRIEFING, stop_reason="stop", usage=Usage(input_tokens=100, output_tokens=50)
        )


async def test_a_briefing_completing_during_close_is_reported_once() -> None:
    summarizer = ArrivesDuringClose()
    llm = LlmCompaction(summarizer, LlmCompactionConfig(trigger_ratio=0.3))
    events: list[Event] = []
    async with (
        anyio.create_task_group() as tg,
        ContextManager(Budget(context_window=3_000, reserve_output=1_000), strategy=llm) as ctx,
    ):
        ctx.subscribe(events.append)
        history: list[Message] = [user("the task")]
        for i in range(40):
            history += tool_turn(i)
            await ctx.prepare(history)
            await anyio.lowlevel.checkpoint()
            if summarizer.called.is_set():
                break

        async def release_soon() -> None:
            await anyio.lowlevel.checkpoint()
            summarizer.release.set()

        tg.start_soon(release_soon)
    billed = [e for e in events if isinstance(e, SummaryStale | SummaryRejected) and e.summary]
    assert llm.spend.requests == 1
    assert len(billed) == 1 and billed[0].summary is not None
    assert billed[0].summary.usage == llm.spend.usage
    assert llm.phase == "idle"


def test_outcome_import_is_used() -> None:
    assert Outcome.reply("x").text == "x"


# ---------------------------------------------------------------------------------------
# 18. A view never goes over the budget unseen; 19. the budget is met wherever it can be


def prose(words: int) -> str:
    vocabulary = ["parser", "budget", "token", "cache", "retry", "config", "module", "review"]
    return " ".join(vocabulary[(k * 7) % len(vocabulary)] for k in range(words))


async def test_dense_new_output_is_counted_in_full_before_it_can_cross_the_budget() -> None:
    events: list[Event] = []
    async with ContextManager(
        Budget(context_window=5_000, reserve_output=1_000), on_over_budget="send"
    ) as ctx:
        ctx.subscribe(events.append)
        history: list[Message] = [user("the task: " + prose(900)), AssistantMessage.of(prose(900))]
        view = await ctx.prepare(history)
        ctx.counter.refine(view)
        ctx.observe(Usage(input_tokens=ctx.counter.count_many(view)))  # as a loop does
        body = "\n".join(f"ok {n}" for n in range(400))
        history += [user("run it"), assistant(call("b1", "bash", command="make")),
                    result("b1", body, "bash")]  # fmt: skip
        view = await ctx.prepare(history)
        full = ctx.counter.overhead + sum(ctx.counter.count_full(m) for m in view)
    over = [e for e in events if type(e).__name__ == "BudgetExceeded"]
    assert full <= ctx.budget.limit or over


async def test_protections_beyond_the_invariants_give_way_before_raising() -> None:
    history: list[Message] = []
    async with ContextManager(Budget(context_window=3_000, reserve_output=1_000)) as ctx:
        for i in range(6):
            body = "\n".join(f"ok {n}" for n in range(400))
            history += [user(f"run {i}"), assistant(call(f"b{i}", "bash", command=f"make {i}")),
                        result(f"b{i}", body, "bash")]  # fmt: skip
            view = await ctx.prepare(history)  # raised BudgetExceededError from the 3rd call
            assert ctx.prompt_tokens <= ctx.budget.limit
            assert_view_ok(view, history)
            assert texts(view)[-3] == f"run {i}"  # the latest user message, whole


async def test_the_error_reports_what_the_protected_messages_take() -> None:
    from agentctx import BudgetExceededError

    huge = "\n".join(f"{n:08x}" for n in range(3_000))
    async with ContextManager(Budget(context_window=3_000, reserve_output=1_000)) as ctx:
        with pytest.raises(BudgetExceededError) as caught:
            await ctx.prepare([user("the task " + huge)])
    error = caught.value
    assert error.protected is not None and error.protected > error.budget
    assert f"newest turn alone take {error.protected}" in str(error)


async def test_giving_way_truncates_the_newest_result_rather_than_dropping_it() -> None:
    big = "\n".join(f"{k}: " + "x" * 120 for k in range(100))  # ~13k chars, under max_chars
    history: list[Message] = [user("the task"), assistant(call("a1")), result("a1", big),
                              assistant(call("a2")), result("a2", big)]  # fmt: skip
    async with ContextManager(Budget(context_window=8_000, reserve_output=1_000)) as ctx:
        view = await ctx.prepare(history)
        assert ctx.prompt_tokens <= ctx.budget.limit
    assert_view_ok(view, history)
    newest = [m for m in view if isinstance(m, ToolResultMessage) and m.tool_call_id == "a2"]
    assert newest and text_of(newest[0].content).startswith("0: xxx")  # cut, not dropped


async def test_a_resumed_worker_renders_the_view_the_last_one_sent(tmp_path: Path) -> None:
    from agentctx._synthetic import synthetic_session

    groups = synthetic_session(seed=3, calls=120)
    store = SQLiteRecallStore(tmp_path / "s.db")
    budget = Budget(context_window=30_000, reserve_output=4_000)
    history: list[Message] = []
    async with ContextManager(budget, recall=store, session_id="w") as first:
        for group in groups:
            history += group
            view = await first.prepare(history)  # projection mode, as a restarted loop is
    assert len(first.ledger) > 0
    async with ContextManager(budget, recall=store, session_id="w") as second:
        again = await second.prepare(history)
    assert again == view
    store.close()


async def test_a_worker_resuming_a_cut_back_history_decides_on_its_view_in_full(
    tmp_path: Path,
) -> None:
    """A resumed ledger's decisions after the history's end are dropped, and what they hid is
    in view again. It was measured on quick counts: the strategy saw 4,674 tokens and took
    nothing, the view went out at 5,251 against a limit of 5,000, unsaid, and the next call
    with the same history compacted (found by a hostile run)."""
    from agentctx._synthetic import synthetic_session

    groups = synthetic_session(seed=7, calls=60, mean_output_lines=30)
    store = SQLiteRecallStore(tmp_path / "s.db")
    history: list[Message] = []
    async with ContextManager(
        Budget(context_window=12_000, reserve_output=2_000), recall=store, session_id="w"
    ) as first:
        for group in groups:
            history += group
            await first.prepare(history)
    cut = history[: len(history) // 3]
    tighter = Budget(context_window=6_000, reserve_output=1_000)
    async with ContextManager(tighter, recall=store, session_id="w") as second:
        events: list[Event] = []
        second.subscribe(events.append)
        view = await second.prepare(cut)
        # Decisions that no longer fit are dropped as a rewind drops them, and said so (an
        # upgrade that converts a provider's items otherwise dropped them unsaid).
        (resynced,) = [e for e in events if isinstance(e, HistoryResynced)]
        assert resynced.dropped_decisions > 0 and resynced.index < len(cut)
        fresh = MessageCounter()
        fresh.refine(view)
        # Counted in full (quick counts are hundreds of tokens higher); the view's sum is
        # rounded once, the messages' counts each, so they may differ by half a token a
        # message.
        in_full = fresh.estimate_prompt(view)
        assert abs(second.prompt_tokens - in_full) <= len(view) / 2
        assert max(second.prompt_tokens, in_full) <= tighter.limit
        assert await second.prepare(cut) == view  # nothing left to decide
    assert_view_ok(view, cut)
    store.close()


@pytest.mark.parametrize("entered", [False, True], ids=["first prepare", "async with"])
async def test_a_resume_cancelled_while_the_ledger_is_read_is_read_again(
    tmp_path: Path, entered: bool
) -> None:
    """Found by hostile testing: cancelling the first `prepare` (or the entry) while the saved
    ledger was being read cleared it as read; the retried call started over silently, sent
    another view than the last worker's, then overwrote the saved ledger."""
    import time

    from agentctx._synthetic import synthetic_session

    class SlowToRead(SQLiteRecallStore):
        def load_ledger(self, session_id: str) -> str | None:
            time.sleep(0.3)
            return super().load_ledger(session_id)

    groups = synthetic_session(seed=10, calls=120)
    budget = Budget(context_window=30_000)
    store = SQLiteRecallStore(tmp_path / "s.db")
    history: list[Message] = []
    async with ContextManager(budget, recall=store, session_id="s") as first:
        for group in groups:
            history += group
            view = await first.prepare(list(history))
    store.close()
    async with ContextManager(budget, session_id="fresh") as fresh:
        assert await fresh.prepare(history) != view  # so starting over would show

    slow = SlowToRead(tmp_path / "s.db")
    second = ContextManager(budget, recall=slow, session_id="s")
    events: list[Event] = []
    second.subscribe(events.append)
    with anyio.move_on_after(0.05) as scope:
        if entered:
            async with second:
                pass
        else:
            await second.prepare(history)
    assert scope.cancelled_caught
    async with second:
        again = await second.prepare(history)
    assert again == view
    assert not [e for e in events if isinstance(e, CompactionWarning) and "ledger" in e.code]
    slow.close()


# -- a raw tail the view left out ---------------------------------------------------------


@pytest.mark.parametrize("owned", [False, True])
async def test_messages_after_a_tail_the_view_left_out_replace_that_tail(owned: bool) -> None:
    # Repair leaves a result answering no call out of the view; the caller's next messages
    # follow the view: in projection mode the caller edited that result and went on, in owned
    # mode it never held it. Either way the raw history becomes what the caller holds, once,
    # and later calls extend it (it used to keep the stale tail and, in projection mode,
    # resync on every later call, growing the raw history: 5, 8, 11 for histories of 4, 6, 8).
    events: list[Event] = []
    async with ContextManager(100_000) as ctx:
        ctx.subscribe(events.append)
        view = await ctx.prepare([user("the task"), ToolResultMessage.of("ghost", "no call")])
        assert texts(view) == ["the task"]
        edited = ToolResultMessage.of("ghost", "edited", is_error=True)
        held = [*view] if owned else [user("the task"), edited]
        for k in range(4):
            held += [assistant(text=f"answer {k}"), user(f"next {k}")]
            view = await ctx.prepare(held)
            assert_view_ok(view, ctx.raw)
            assert list(map(fingerprint, ctx.raw)) == list(map(fingerprint, held))
            assert texts(view)[-2:] == [f"answer {k}", f"next {k}"]
            if owned:
                held = list(view)
        # No view showed that tail and no decision goes with it: it was no rewind of what the
        # caller held (an owned caller never held it, and the event came on about a third
        # of owned sessions in a hostile run, EA 4).
        assert not [e for e in events if isinstance(e, HistoryResynced)]


# -- a new message the estimate undercounts ----------------------------------------------


class _Words:
    """Counts words; ``dense`` words cost ``extra`` times as much to the "provider"."""

    def __init__(self, extra: float = 1.0) -> None:
        self.extra = extra

    def count(self, text: str) -> int:
        words = text.split()
        dense = sum(w == "dense" for w in words)
        return len(words) - dense + round(dense * self.extra)


@pytest.mark.parametrize(
    "strategy",
    [
        DeterministicCompaction,
        lambda: LlmCompaction(ScriptedSummarizer([Outcome.hang()])),  # never back in time
    ],
)
async def test_a_new_result_the_estimate_undercounts_never_crosses_the_limit(
    strategy: Callable[[], Any],
) -> None:
    # The calibrated estimate of content unlike what was reported before can fall short by
    # a few percent (4 % on a 10k-token result of pi/before-compaction in o200k, where the
    # llm strategy sent a request 36 tokens over its budget while it waited for a briefing
    # just under the limit). Messages no request has sent yet get a margin.
    budget = Budget(context_window=12_000, reserve_output=2_000)
    provider = MessageCounter(_Words(extra=1.06), lazy=False)
    async with ContextManager(
        budget, strategy=strategy(), counter=MessageCounter(_Words()), on_over_budget="send"
    ) as ctx:
        history: list[Message] = [user("the task: " + "plain " * 50)]
        sizes: list[int] = []
        for i in range(200):
            view = await ctx.prepare(history)
            sent = provider.count_many(view)
            sizes.append(sent)
            ctx.observe(Usage(sent, 10))
            left = budget.limit - ctx.prompt_tokens
            if left < 1_500:
                # a dense result that just fits by the estimate
                history += [assistant(call(f"c{i}")), result(f"c{i}", "dense " * (left - 40))]
            else:
                history += [assistant(call(f"c{i}")), result(f"c{i}", "plain " * 400)]
            history.append(user(f"go on {i}"))
        assert max(sizes) <= budget.limit
        assert sum(s > budget.limit - 1_500 for s in sizes) > 5  # it did ride up near the limit


async def test_a_message_the_calibration_prices_below_its_estimate_never_crosses_the_limit() -> (
    None
):
    # Found re-running peers.py with the recall tool counted: on pi/before-compaction@50k the
    # calibration priced long write arguments at about 0.83 of their estimate, a new write's
    # cost 18 % more than that, and ToolOutputPipeline sent a request 285 tokens over the
    # budget (the margin for unsent messages was 10 % of the calibrated count). Where the
    # calibration prices content below its base estimate, the margin is taken on the base.
    def write(cid: str, chars: int, k: int) -> list[Message]:
        digits = ", ".join(str(i * 7919 % 100003 + k) for i in range(chars))
        content = ("const table = [" + digits)[:chars]
        return [assistant(call(cid, "write", path=f"src/{cid}.js", content=content)), result(cid)]

    plain = MessageCounter()
    budget = Budget(context_window=40_000, reserve_output=1_000)
    async with ContextManager(budget) as ctx:
        history: list[Message] = [user("task: write the tables")]
        for r in range(6):
            history += write(f"w{r}", 6_000, r)
            view = await ctx.prepare(history)
            # The provider counts these at 0.8 of the estimate: the calibration learns it.
            ctx.observe(Usage(input_tokens=int(0.8 * sum(map(plain.count_full, view)))))
        await anyio.lowlevel.checkpoint()
        old = len(history)
        history += write("big", 40_000, 99)  # this one costs what the estimate says
        view = await ctx.prepare(history)
    kept = {id(m) for m in history[old:]}
    provider = sum(
        plain.count_full(m) if id(m) in kept else 0.8 * plain.count_full(m) for m in view
    )
    assert provider <= budget.limit


async def test_media_the_calibration_prices_below_their_estimate_widen_no_margin() -> None:
    # Found by a re-run (DU E): screenshots a provider bills at 85 tokens, which the
    # calibration prices at a quarter of their estimate; the margin for unsent messages took
    # them at their base estimate too, four times their count, and the session compacted
    # 19 times in 300 steps where 16 kept it under the limit. Only classes of text are taken
    # at their base: an image's base estimate is a guess at a floor.
    from agentctx import ContextCompacted, ImageBlock, MemoryRecallStore, ToolResultMessage

    from .helpers import png

    plain = MessageCounter()

    def billed(view: list[Message]) -> int:
        total = 700
        for m in view:
            images = [b for b in getattr(m, "content", ()) if isinstance(b, ImageBlock)]
            if images and isinstance(m, ToolResultMessage):
                rest = tuple(b for b in m.content if not isinstance(b, ImageBlock))
                total += plain.count_full(dataclasses.replace(m, content=rest)) + 85 * len(images)
            else:
                total += plain.count_full(m)
        return total

    history: list[Message] = [user("task: check the pages")]
    now = [0.0]
    budget = Budget(context_window=60_000, reserve_output=2_000)
    events: list[Any] = []
    sizes: list[int] = []
    async with ContextManager(budget, recall=MemoryRecallStore(), clock=lambda: now[0]) as ctx:
        ctx.subscribe(events.append)
        for n in range(300):
            now[0] += 10  # a warm cache
            blocks = (TextBlock("page text " * (50 + (n * 37) % 550)),) + tuple(
                ImageBlock("image/png", png(1000, 1000) + "A" * (4 * (n * 10 + k)))
                for k in range(6)
            )
            history += [
                assistant(call(f"c{n}", "screenshot", url=f"https://x/{n}")),
                ToolResultMessage(f"c{n}", blocks, "screenshot"),
            ]
            view = await ctx.prepare(history)
            sizes.append(billed(view))
            ctx.observe(Usage(input_tokens=sizes[-1]))
    assert max(sizes) <= budget.limit
    assert sum(isinstance(e, ContextCompacted) for e in events) <= 16


async def test_a_result_many_times_the_limit_leaves_a_budget_to_decide_on() -> None:
    # The margin for messages no request has sent yet was sized on all of them: a result
    # twenty times the limit lowered the budget the strategies decide on to one token, so they
    # compacted all they could (LlmCompaction dropped the whole stretch its briefing in flight
    # summarized: hostile run H, finding 3). At most the limit's worth of them can be sent.
    seen: list[Budget] = []

    class Recording:
        def __init__(self) -> None:
            self.inner = DeterministicCompaction()

        async def compact(self, ctx: CompactionContext) -> None:
            seen.append(ctx.budget)
            await self.inner.compact(ctx)

    budget = Budget(context_window=12_000, reserve_output=2_000)
    async with ContextManager(budget, strategy=Recording()) as ctx:
        history: list[Message] = [user("the task")]
        for i in range(20):
            history += [assistant(call(f"c{i}")), result(f"c{i}", "plain words " * 200)]
        await ctx.prepare(history)
        history += [assistant(call("big")), result("big", "plain words " * 100_000)]
        view = await ctx.prepare(history)
        assert_view_ok(view, ctx.raw)
    assert min(b.limit for b in seen) >= budget.limit * 0.9


# -- the newest complete turn, behind turns condensed to one line ---------------------------


async def test_the_newest_complete_turn_survives_turns_condensed_after_it() -> None:
    # A turn condensed to one line ends in an answer in the view, so it passed for the newest
    # complete turn, and the real one (older, a long loop that ended in an answer) was
    # condensed in turn: its answer was gone. Found by the invariant check on every view.
    body = "\n".join(f"line {k} of the output" for k in range(40))
    history: list[Message] = [user("the task")]
    for k in range(6):
        history += [assistant(call(f"a{k}")), result(f"a{k}", body)]
    history.append(assistant(text="the answer to the task"))
    async with ContextManager(
        Budget(context_window=5_000, reserve_output=1_000), on_over_budget="send"
    ) as ctx:
        for n in range(12):  # turns the user interrupts: none of them ends in an answer
            history += [user(f"next {n}"), assistant(call(f"c{n}")), result(f"c{n}", body)]
            view = await ctx.prepare(history)
            assert_view_ok(view, ctx.raw)
        assert "the answer to the task" in texts(view)
        assert ctx.ledger.spans  # the turns after it were condensed or dropped


async def test_an_answer_followed_by_more_calls_keeps_its_turn_the_newest_complete_one() -> None:
    # Found by the hostile run: the model answers, then goes on calling tools with no user
    # message between. That turn stopped counting as complete, so the newest complete turn
    # moved back to an older one, which the tiers had already condensed while the newer turn
    # held the place: its question and answer were gone from every later view (and the LLM
    # strategy's tiers raised ConfigError at `take`). A turn with an answer stays complete.
    words = ["alpha", "beta", "gamma", "delta", "parser", "cache", "config", "token", "budget"]
    words.append("retry")

    def prose(i: int, n: int) -> str:
        return " ".join(words[(i * 7 + k) % len(words)] for k in range(n))

    def build(kind: str, i: int, n: int, width: int = 1) -> list[Message]:
        if kind == "turn":
            reply = f"assistant reply {i}: {prose(i + 1, n)}"
            return [user(f"user message {i}: {prose(i, n)}"), assistant(text=reply)]
        if kind == "cont":  # more calls after the answer, no user message between
            more = call(f"x{i}", "read", path=f"src/x{i}.py")
            return [assistant(more), result(more.id, prose(i, n))]
        body = "\n".join(f"ok {k} of {i} {prose(k, 3)}" for k in range(n))
        calls = [call(f"c{i}_{k}", "bash", command=f"cmd {i}") for k in range(width)]
        return [
            user(f"run command {i}"),
            assistant(*calls),
            *(result(c.id, body, name="bash") for c in calls),
        ]

    steps = [
        ("tool", 4, 28), ("tool", 6, 7), ("tool", 7, 33), ("tool", 9, 36), ("tool", 10, 4, 2),
        ("cont", 11, 62), ("tool", 12, 53), ("tool", 13, 49), ("tool", 14, 25, 3),
        ("tool", 16, 60), ("tool", 18, 43, 2), ("tool", 19, 8), ("tool", 20, 44),
        ("cont", 22, 54), ("tool", 23, 51, 2), ("tool", 24, 60, 3), ("cont", 25, 43),
        ("tool", 26, 52), ("tool", 29, 7, 3), ("tool", 30, 37, 3), ("cont", 31, 119),
        ("tool", 32, 30), ("cont", 34, 129), ("tool", 35, 35, 3), ("turn", 36, 53),
        ("tool", 37, 21), ("tool", 48, 59, 3), ("turn", 49, 27), ("turn", 50, 42),
        ("tool", 51, 21), ("tool", 52, 19, 2), ("cont", 53, 96), ("tool", 54, 15),
        ("turn", 55, 15), ("cont", 56, 44),
    ]  # fmt: skip
    history: list[Message] = [user("TASK: refactor the parser; keep the API stable.")]
    async with ContextManager(
        Budget(context_window=3_000, reserve_output=1_000), on_over_budget="send"
    ) as ctx:
        for kind, *args in steps:
            history += build(kind, *args)  # type: ignore[arg-type]
            assert_view_ok(await ctx.prepare(history), ctx.raw)
        assert ctx.ledger.spans  # the tiers did condense and drop turns


# ---------------------------------------------------------------------------------------
# Calls that overlap: a strategy that awaits inside compact lets another call in


class _Yielding(DeterministicCompaction):
    """The default strategy, giving the event loop a turn before it decides (as one that
    awaits a worker thread for its CPU work would)."""

    async def compact(self, ctx: CompactionContext) -> None:
        await anyio.sleep(0.01)
        await super().compact(ctx)


@pytest.mark.parametrize("window", [200_000, 3_000])  # no decision; decisions on both calls
async def test_overlapping_calls_each_get_the_view_of_their_own_history(window: int) -> None:
    """Two calls of one session that overlap (one suspended in the strategy while the other
    starts) take turns: each returns the view of the history it was given, never one that
    the other call appended to."""
    short = questions(3)
    long = [*short, user("question 3"), assistant(text="answer 3")]
    for first, second in [(short, long), (long, short)]:
        views: dict[int, list[Message]] = {}
        async with ContextManager(
            Budget(context_window=window, reserve_output=500), strategy=_Yielding()
        ) as ctx:

            async def run(history: list[Message], views: dict[int, list[Message]] = views) -> None:
                views[len(history)] = await ctx.prepare(history)

            with anyio.fail_after(5):  # a turn never handed on would hang here
                async with anyio.create_task_group() as tg:
                    tg.start_soon(run, first)
                    await anyio.sleep(0.001)  # the first call is inside compact
                    tg.start_soon(run, second)
        for history in (short, long):
            view = views[len(history)]
            assert_view_ok(view, history)
            # what the view ends with is the history's own newest message, as it is
            assert view[-1] is history[-1], f"{len(history)} messages: view ends elsewhere"
            if window == 200_000:
                assert view == history


async def test_a_call_cancelled_inside_the_strategy_lets_the_waiting_call_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    history = questions(3)
    waits: list[int] = []
    wait = ContextManager._wait_for_turn

    async def counted(self: ContextManager) -> None:
        waits.append(1)
        await wait(self)

    monkeypatch.setattr(ContextManager, "_wait_for_turn", counted)
    async with ContextManager(
        Budget(context_window=3_000, reserve_output=500), strategy=_Yielding()
    ) as ctx:
        views: list[list[Message]] = []

        async def second() -> None:
            views.append(await ctx.prepare(history))

        with anyio.fail_after(5):  # a turn never handed on would hang here
            async with anyio.create_task_group() as tg:
                with anyio.CancelScope() as first:
                    tg.start_soon(second)
                    first.cancel()  # the first call is cancelled once it awaits in compact
                    await ctx.prepare(history[:5])
        assert first.cancelled_caught
        assert waits == [1]  # the second call waited for the first
        assert len(views) == 1
        assert_view_ok(views[0], history)
        assert views[0][-1] is history[-1]
        longer = [*history, user("question 3"), assistant(text="answer 3")]
        view = await ctx.prepare(longer)
        assert_view_ok(view, longer)
        assert view[-1] is longer[-1]


# ---------------------------------------------------------------------------------------
# 16. A strategy's own decisions: what no view may lose or could send is refused at `take`


def _guarded_history() -> list[Message]:
    """The task, an old turn whose answer carries signed thinking, a newest complete turn,
    then a running tool loop whose step carries signed thinking."""
    from agentctx.testing._validate import sign

    def think(text: str) -> ThinkingBlock:
        return ThinkingBlock(text, sign(text))

    return [
        user("the task: fix the parser"),  # 0: the task
        AssistantMessage((think("old plan"), TextBlock("looked at it")), "end_turn"),  # 1
        user("and the lexer?"),  # 2
        AssistantMessage.of("the lexer is fine"),  # 3: [2, 4) the newest complete turn
        user("now run the tests"),  # 4: the latest user message
        assistant(call("t1", "bash"), thinking="run them"),  # 5: the running loop
        result("t1", "2 failed"),  # 6
    ]


class _TakesOnce:
    def __init__(self, make: Callable[[CompactionContext], Any]) -> None:
        self.make, self.done = make, False

    async def compact(self, ctx: CompactionContext) -> None:
        if not self.done:
            self.done = True
            ctx.take(self.make(ctx))


def _span(a: int, b: int, *replacement: Message) -> Callable[[CompactionContext], Any]:
    from agentctx.ledger import ReplaceSpan
    from agentctx.messages import SummaryMessage

    body = replacement or (SummaryMessage("(condensed)"),)
    return lambda ctx: ReplaceSpan(anchor(ctx.raw, a), b, anchor(ctx.raw, b - 1), body, "mine")


def _drop_thinking(i: int) -> Callable[[CompactionContext], Any]:
    from agentctx.ledger import DropThinking

    return lambda ctx: DropThinking(anchor(ctx.raw, i), "mine")


def _forged() -> AssistantMessage:
    return AssistantMessage((ThinkingBlock("forged", "bad-signature"), TextBlock("x")), "end_turn")


@pytest.mark.parametrize(
    ("case", "make", "refused"),
    [
        ("span over the task", _span(0, 2), "would hide raw message 0"),
        ("span over the latest user message", _span(4, 5), "would hide raw message 4"),
        ("span over the newest complete turn's answer", _span(3, 4), "would hide raw message 3"),
        ("thinking of the running loop", _drop_thinking(5), "is in the running tool loop"),
        ("reasoning the span does not hold", _span(1, 2, _forged()), "carries reasoning"),
        ("the old turn's thinking", _drop_thinking(1), None),
        ("a span over the old turn", _span(1, 2), None),
    ],
)
async def test_a_strategy_cannot_hide_what_every_view_keeps(
    case: str, make: Callable[[CompactionContext], Any], refused: str | None
) -> None:
    """Found by a hostile run: a custom strategy's span over the task or the latest user
    message, or its thinking drop in the running loop, was accepted by `take` and sent; the
    manager only dropped such decisions after a rewind."""
    history = _guarded_history()
    async with ContextManager(100_000, strategy=_TakesOnce(make)) as ctx:
        if refused is None:
            view = await ctx.prepare(history)
            assert len(ctx.ledger) == 1
        else:
            with pytest.raises(ConfigError, match=refused):
                await ctx.prepare(history)
            assert len(ctx.ledger) == 0
            view = await ctx.prepare(history)  # the strategy took its one chance
        assert_view_ok(view, history)


def _misanchored(case: str) -> Callable[[CompactionContext], Any]:
    from agentctx.ledger import Anchor, ReplaceArguments
    from agentctx.messages import SummaryMessage, fingerprint

    def make(ctx: CompactionContext) -> Any:
        raw = ctx.raw
        at, last = anchor(raw, 1), anchor(raw, 2)
        body = (SummaryMessage("(condensed)"),)
        return {
            "bool index": ReplaceArguments(Anchor(True, fingerprint(raw[1])), "t1", {}, "r"),  # type: ignore[arg-type]
            "str index": ReplaceSpan(Anchor("1", at.fingerprint), 3, last, body, "r"),  # type: ignore[arg-type]
            "end past the history": ReplaceSpan(at, 99, last, body, "r"),
            "float end": ReplaceSpan(at, 3.0, last, body, "r"),  # type: ignore[arg-type]
            "no anchor": ReplaceSpan(None, 3, last, body, "r"),  # type: ignore[arg-type]
            "not a decision": "clear everything",
        }[case]

    return make


@pytest.mark.parametrize(
    "case",
    ["bool index", "str index", "end past the history", "float end", "no anchor", "not a decision"],
)
async def test_a_decision_that_is_not_one_is_refused_by_take(case: str) -> None:
    """`take` raised `IndexError`, `TypeError` or `AttributeError` for these, and took an
    anchor at index `True`: the saved ledger then held `[true, ...]`, which no worker can read,
    and a resumed session lost every decision (found by a hostile run)."""
    history = _guarded_history()
    async with ContextManager(100_000, strategy=_TakesOnce(_misanchored(case))) as ctx:
        with pytest.raises(ConfigError):
            await ctx.prepare(history)
        assert len(ctx.ledger) == 0
        assert_view_ok(await ctx.prepare(history), history)


@pytest.mark.parametrize("where", ["manager", "chain", "pipeline fallback", "llm fallback"])
def test_a_strategy_class_for_an_instance_is_refused_when_made(where: str) -> None:
    """A forgotten ``()`` was taken, and every prepare then failed with a bare `TypeError`."""
    from agentctx import Chain, DeterministicCompaction, LlmCompaction, ToolOutputPipeline

    cls: Any = DeterministicCompaction
    with pytest.raises(ConfigError, match=r"DeterministicCompaction\(\) rather than"):
        if where == "manager":
            ContextManager(100_000, strategy=cls)
        elif where == "chain":
            Chain([cls])
        elif where == "pipeline fallback":
            ToolOutputPipeline(fallback=cls)
        else:
            LlmCompaction(ScriptedSummarizer(), fallback=cls)


def _looped() -> dict[str, Any]:
    looped: dict[str, Any] = {}
    looped["self"] = looped
    return looped


@pytest.mark.parametrize(
    ("kind", "field", "bad"),
    [
        ("ReplaceSpan", "replacement", ("text",)),
        ("ReplaceArguments", "arguments", None),
        ("ReplaceArguments", "arguments", [1, 2]),
        ("ReplaceArguments", "arguments", {"p": {1, 2}}),
        ("ReplaceArguments", "arguments", {"p": b"raw"}),
        ("ReplaceArguments", "arguments", _looped()),
        ("ReplaceResult", "content", "cleared"),
        ("ReplaceResult", "content", (ThinkingBlock("t", "s"),)),
        ("ReplaceResult", "recall_id", 123),
        ("Keep", "reason", object()),
    ],
    ids=lambda v: v if isinstance(v, str) else type(v).__name__,
)
async def test_a_decision_no_view_could_send_is_refused_at_take(
    kind: str, field: str, bad: Any
) -> None:
    """Found by a hostile run: `take` accepted a decision whose contents no message can hold;
    every later call then failed with an AttributeError, a TypeError or a RecursionError
    (the decision stayed in the ledger), or sent what the provider refuses."""
    from agentctx.ledger import Keep, ReplaceArguments, ReplaceSpan

    history = questions(2)

    def make(ctx: CompactionContext) -> Any:
        at = anchor(ctx.raw, 3)
        if kind == "ReplaceSpan":
            return ReplaceSpan(anchor(ctx.raw, 2), 4, anchor(ctx.raw, 3), bad, "mine")
        if kind == "ReplaceArguments":
            return ReplaceArguments(anchor(ctx.raw, 2), "r0", bad, "mine")
        if kind == "ReplaceResult":
            content = bad if field == "content" else (TextBlock("[cleared]"),)
            rid = bad if field == "recall_id" else None
            return ReplaceResult(at, content, "mine", rid)
        return Keep(at, bad)

    async with ContextManager(100_000, strategy=_TakesOnce(make)) as ctx:
        with pytest.raises(ConfigError, match=f"{kind} .*{field.split('_')[0]}"):
            await ctx.prepare(history)
        assert len(ctx.ledger) == 0
        view = await ctx.prepare(history)
        assert_view_ok(view, history)


def test_a_quiet_or_a_strategy_that_cannot_work_is_refused_when_made() -> None:
    """Found by a hostile run: a `Quiet` with a text for its tokens failed the next call,
    after the strategy had been replaced; a strategy object without an async ``compact``
    failed the first call with an AttributeError or a TypeError."""
    from agentctx.strategy import Quiet

    with pytest.raises(ConfigError, match="Quiet.tokens"):
        Quiet("never")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="Quiet.idle_seconds"):
        Quiet(1_000, float("nan"))

    class SyncCompact:
        def compact(self, ctx: CompactionContext) -> None:
            return None

    for strategy in (object(), "deterministic", SyncCompact()):
        with pytest.raises(ConfigError, match="async def compact"):
            ContextManager(100_000, strategy=strategy)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="async def compact"):
            Chain([DeterministicCompaction(), strategy])  # type: ignore[list-item]


# ---------------------------------------------------------------------------------------
# Entering a manager: once, and never after it closed; a history read once


async def test_a_manager_is_entered_once_and_never_after_it_closed() -> None:
    # Found by the hostile run: entering again after the close raised anyio's RuntimeError
    # ("Child exited without calling task_status.started()"); entering twice overwrote the
    # task group, raised an AttributeError on the way out and left background tasks running.
    ctx = ContextManager(Budget(context_window=50_000))
    async with ctx:
        with pytest.raises(ConfigError, match="entered already"):
            await ctx.__aenter__()
        assert await ctx.prepare([user("task")])
    with pytest.raises(ConfigError, match="closed"):
        async with ctx:
            pass
    tasks = {t.get_coro().__qualname__ for t in asyncio.all_tasks()}  # type: ignore[union-attr]
    assert not any(name.startswith("ContextManager.") for name in tasks)


async def test_a_manager_entered_on_one_loop_refuses_calls_from_another_thread() -> None:
    """Found by a hostile run (BT 2): ``prepare`` from another thread (its own event loop)
    was taken, racing the session's state with the loop that entered it; a background
    summary started from there failed as cancelled, after it was paid for."""
    history = [user("task")]
    ctx = ContextManager(Budget(context_window=50_000), recall=MemoryRecallStore())
    async with ctx:
        view = await ctx.prepare(history)

        def elsewhere() -> list[str]:
            refused = []
            for call in (
                lambda: ctx.prepare(history),
                lambda: ctx.recall("ctx-0"),
                lambda: ctx.handle_recall({"id": "ctx-0"}),
            ):
                try:
                    asyncio.run(call())
                except ConfigError as e:
                    refused.append(str(e))
            try:
                ctx.observe(Usage(input_tokens=10))
            except ConfigError as e:
                refused.append(str(e))
            try:  # BU docs 3: a close from elsewhere broke the loop that owns the manager
                asyncio.run(ctx.aclose())
            except ConfigError as e:
                refused.append(str(e))
            return refused

        refused = await anyio.to_thread.run_sync(elsewhere)
        assert len(refused) == 5
        assert all("thread other than the one whose event loop entered" in r for r in refused)
        assert await ctx.prepare(history) == view  # its own loop goes on
        ctx.observe(Usage(input_tokens=10))

    def closed_elsewhere() -> str:
        try:
            asyncio.run(ctx.prepare(history))
        except ConfigError as e:
            return str(e)
        return ""

    assert "closed" in await anyio.to_thread.run_sync(closed_elsewhere)


async def test_a_history_given_as_a_generator_is_read_once() -> None:
    # docs/invariants.md: "a history given as a generator or another one-pass iterable: read
    # once into a list". `prepare` itself took only sequences (a TypeError from len()).
    history = [user("task"), assistant(call("a")), result("a", "out")]
    async with ContextManager(Budget(context_window=50_000)) as ctx:
        assert await ctx.prepare(m for m in history) == history  # type: ignore[arg-type]
        history += [assistant(text="done")]
        assert await ctx.prepare(iter(history)) == history  # type: ignore[arg-type]
        with pytest.raises(UnsupportedMessageError, match="history of type int"):
            await ctx.prepare(7)  # type: ignore[arg-type]
        with pytest.raises(UnsupportedMessageError):
            await ctx.prepare({"role": "user"})  # type: ignore[arg-type]


async def test_a_strategy_calling_its_own_sessions_prepare_gets_a_config_error() -> None:
    """Found by hostile testing: a strategy whose `compact` awaited its own manager's
    `prepare` waited for the very call running it, for good, with no error."""
    held: list[ContextManager] = []

    class CallsBack:
        async def compact(self, ctx: Any) -> None:
            await held[0].prepare([UserMessage.of("inner")])

    async with ContextManager(200_000, strategy=CallsBack()) as ctx:
        held.append(ctx)
        with anyio.fail_after(5), pytest.raises(ConfigError, match="own strategy"):
            await ctx.prepare([UserMessage.of("outer")])
        ctx.strategy = DeterministicCompaction()  # the session goes on
        assert await ctx.prepare([UserMessage.of("outer")]) == [UserMessage.of("outer")]


async def test_a_view_returned_near_the_limit_is_under_it_counted_in_full() -> None:
    """Found by a hostile run (R, finding 6): messages counted quickly on calls far from the
    limit were never counted in full, and the prompt came to ride just under the limit on
    those counts: 9,652 of 10,000 tokens, 10,013 in full, with no `BudgetExceeded`. A worker
    resuming the session, which counts in full, took two decisions more on the same history
    and broke the prompt cache at hand-over."""
    budget = Budget(context_window=12_000, reserve_output=2_000)
    history: list[Any] = []
    events: list[Event] = []
    async with ContextManager(budget, session_id="s", on_over_budget="send") as a:
        a.subscribe(events.append)
        for group in synthetic_session(1, 401, mean_output_lines=40):
            history += group
            events.clear()
            sent = await a.prepare(history)
            said = any(isinstance(e, BudgetExceeded) for e in events)
            full = MessageCounter()  # counted in full apart: the session's own counts as it does
            tokens = full.overhead + sum(map(full.count_full, sent))
            assert tokens <= budget.limit or said, len(history)
        saved = a.ledger.to_json()
    async with ContextManager(budget, ledger=Ledger.from_json(saved)) as b:
        again = await b.prepare([from_dict(to_dict(m)) for m in history])
    assert [canonical_json(m) for m in again] == [canonical_json(m) for m in sent]
    assert len(b.ledger) == len(Ledger.from_json(saved))


@pytest.mark.parametrize(
    ("seed", "briefed"),
    [*((seed, False) for seed in range(12)), *((seed, True) for seed in range(40))],
)
async def test_owned_histories_that_retry_go_back_or_rewind_mean_what_they_hold(
    seed: int, briefed: bool
) -> None:
    """Found by hostile runs (Q, S, T) in turn, each against the last fix: an owned caller
    that retries a call, retries it with more, goes back to a view or an input of one of the
    last few calls that decided (not from before a rewind that cut what it shows), or cuts
    its view back, holds a history that means the raw messages it stands for. The raw
    history must be exactly that after each call, the view valid, and `HistoryResynced` only
    on a history that leaves what came before it. ``briefed``: with briefings before the
    tiers, so more calls decide (T's last seed, and seed 37 here: an input two calls back,
    the call after it deciding, was read against that call's view)."""
    rng = random.Random(seed)
    groups = synthetic_session(seed, 120, mean_output_lines=rng.choice([20, 40, 80]))
    events: list[Event] = []
    strategy: Any = DeterministicCompaction()
    if briefed:
        llm = LlmCompaction(
            ScriptedSummarizer([], default=BRIEFING), LlmCompactionConfig(trigger_ratio=0.5)
        )
        strategy = Chain([llm, strategy])
    budget = Budget(context_window=9_000, reserve_output=1_000)
    async with ContextManager(budget, strategy=strategy, on_over_budget="send") as ctx:
        ctx.subscribe(events.append)
        meaning: list[Message] = list(groups[0])
        history = list(meaning)
        view = await ctx.prepare(history)
        calls = [(history, meaning, view, 0)]  # (history, what it means, view, call number)
        decided: list[int] = []
        cuts: list[tuple[int, int]] = []  # (call number, where a rewind cut)
        for number, group in enumerate(groups[1:60], start=1):
            act = rng.choices(["on", "retry", "more", "back", "input", "cut"], [8, 3, 3, 4, 2, 2])[
                0
            ]
            rewinds = act in ("back", "input", "cut")
            if act == "on":
                history, meaning = [*view, *group], [*meaning, *group]
            elif act in ("retry", "more"):
                history, meaning = calls[-1][0], calls[-1][1]
                if act == "more":
                    history, meaning = [*history, *group], [*meaning, *group]
            elif act in ("back", "input"):
                fine = [
                    c
                    for c in calls[-6:]
                    if not any(n > c[3] and cut < len(c[1]) for n, cut in cuts)
                    and sum(n > c[3] for n in decided) <= 4
                ]
                h, m, v, _ = rng.choice(fine or calls[-1:])
                history, meaning = [*(v if act == "back" else h), *group], [*m, *group]
            else:
                origins = list(ctx._state.origins)
                at = [
                    j
                    for j in range(2, len(view))
                    if isinstance(view[j], UserMessage | AssistantMessage)
                    and fingerprint(view[j]) == fingerprint(ctx.raw[origins[j]])
                ]
                if not at:
                    history, meaning, rewinds = [*view, *group], [*meaning, *group], False
                else:
                    j = rng.choice(at)
                    history, meaning = [*view[:j], *group], [*meaning[: origins[j]], *group]
            version, seen = ctx.ledger.version, len(events)
            view = await ctx.prepare(history)
            if ctx.ledger.version != version:
                decided.append(number)
            resynced = [e for e in events[seen:] if isinstance(e, HistoryResynced)]
            cuts += [(number, e.index) for e in resynced]
            assert list(map(fingerprint, ctx.raw)) == list(map(fingerprint, meaning)), (number, act)
            assert_view_ok(view, ctx.raw)
            assert rewinds or not resynced, (number, act)
            calls.append((history, meaning, view, number))


async def test_a_call_cancelled_while_deciding_is_retried_as_it_was_given() -> None:
    """Found by a hostile run (T, finding 4): a call cancelled while its strategy awaited
    had synced and repaired its history (a stub for a call with no result) but not noted it,
    so the same history passed again read as a rewind: `HistoryResynced`, decisions dropped."""

    class Slow:
        def __init__(self) -> None:
            self.inner, self.block = DeterministicCompaction(), False

        async def compact(self, ctx: CompactionContext) -> Any:
            quiet = await self.inner.compact(ctx)
            if self.block:
                await anyio.sleep(10)  # a strategy awaiting what it started
            return quiet

    strategy = Slow()
    events: list[Event] = []
    async with ContextManager(
        Budget(context_window=9_000, reserve_output=1_000), strategy=strategy
    ) as ctx:
        ctx.subscribe(events.append)
        first = [user("the task")] + [m for i in range(12) for m in _read_turn(i)]
        view = await ctx.prepare(first)
        tail = [assistant(call("lost", "bash", cmd="ls")), user("stop, do something else")]
        strategy.block = True
        with anyio.move_on_after(0.05):
            await ctx.prepare([*view, *tail])
        strategy.block = False
        seen = len(events)
        again = await ctx.prepare([*view, *tail])
    assert not any(isinstance(e, HistoryResynced) for e in events[seen:])
    assert list(map(fingerprint, ctx.raw)) == list(map(fingerprint, [*first, *tail]))
    assert_view_ok(again, ctx.raw)


def _read_turn(i: int) -> list[Message]:
    out = "\n".join(f"{i}:{j} " + f"word{j * 7 % 101} " * 6 for j in range(60))
    return [assistant(call(f"c{i}", "read", path=f"f{i}")), result(f"c{i}", out, "read")]


@pytest.mark.parametrize("report", [5 * 10**8, 50_000])  # past 10**9: refused (CR 7, below)
async def test_one_implausible_usage_report_does_not_lock_the_session(report: int) -> None:
    """Found by a hostile run (V, finding 1): one report far past the view and the context
    window (a proxy's session total, a wrong object) raised the view's estimate past any
    limit: past a billion tokens through the cap on the shortfall, under it through the
    fitted overhead. Every later call raised `BudgetExceededError`, so no request went out
    and no sane report could mend it. Such a report is now left out of the calibration and
    said once; a large report the window allows (a long system prompt) is still taken."""
    events: list[Event] = []
    async with ContextManager(Budget(context_window=40_000, reserve_output=4_000)) as ctx:
        ctx.subscribe(events.append)
        history: list[Message] = [UserMessage.of("task: say hi " * 50)]
        await ctx.prepare(history)
        before = ctx.prompt_tokens
        for i in range(3):
            ctx.observe(Usage(input_tokens=report))
            history += [assistant(text=f"hi {i}"), user(f"again {i}")]
            await ctx.prepare(history)
            assert ctx.prompt_tokens < before + 100
        warned = [e for e in events if isinstance(e, CompactionWarning)]
        assert [w.code for w in warned] == ["implausible_usage"]
        ctx.observe(Usage(input_tokens=30_000))  # a 30k system prompt the window allows
        await ctx.prepare(history)
        assert ctx.prompt_tokens > 29_000


async def test_correct_usage_reports_after_the_hosts_prompt_shrinks_are_calibrated_on() -> None:
    """Found by a re-run (CU 1) against a check tried this round: reports under a third of
    the estimate were left out as a slip (Anthropic's ``input_tokens`` without the cache
    reads). Once a host dropped a 28k system prompt, every correct report fell under a third
    of the estimate its fitted overhead still held, and the session stayed 30k high for the
    rest of its life. The check is gone: a report is taken whatever its size below."""
    events: list[Event] = []
    counter = MessageCounter()
    history: list[Message] = [user("task: fix the failing test")]
    async with ContextManager(Budget(context_window=200_000)) as ctx:
        ctx.subscribe(events.append)
        for i in range(20):
            history += _read_turn(i)
            await ctx.prepare(history)
            true = (30_000 if i < 8 else 1_500) + counter.count_many(history)
            ctx.observe(Usage(input_tokens=true))
        await ctx.prepare(history)
        assert abs(ctx.prompt_tokens - true) < 0.1 * true
    assert not [e for e in events if isinstance(e, CompactionWarning)]


async def test_a_correct_report_on_text_the_estimator_prices_high_is_calibrated_on() -> None:
    """Found by the same re-run (CU 2): the estimator prices runs of em dashes, ellipses and
    ideographic spaces up to 16x what o200k counts; a correct report on a document ruled
    with them was refused under the same check. Such reports, and a view of images whose
    size cannot be read (estimated at the most an image costs), calibrate."""
    from agentctx.messages import ImageBlock

    doc = "".join(f"{'—' * 30}\nItem {i}\n" for i in range(300))
    images = tuple(ImageBlock("image/png", f"https://x.test/{i}.png", "url") for i in range(20))
    for history in (
        [
            user("task: summarise notes.md"),
            assistant(call("c1", path="notes.md")),
            result("c1", doc),
        ],
        [UserMessage((TextBlock("Which of these is a cat?"), *images))],
    ):
        events: list[Event] = []
        async with ContextManager(Budget(context_window=200_000)) as ctx:
            ctx.subscribe(events.append)
            await ctx.prepare(history)
            estimate = ctx.prompt_tokens
            ctx.observe(Usage(input_tokens=estimate // 5))
            await ctx.prepare(history)
            assert ctx.prompt_tokens < estimate // 2
        assert not [e for e in events if isinstance(e, CompactionWarning)]


async def test_a_strategy_whose_close_raises_still_closes_the_session() -> None:
    """Found by a hostile run (V, finding 5): a strategy's ``close`` that raised left the
    manager half closed: the event iterator the docs recommend reading never ended, the
    task group the manager entered was never left (the caller's own group then failed on a
    cancel scope), and the strategies after it in a `Chain` were never told."""

    class CloseRaises:
        async def compact(self, ctx: CompactionContext) -> None:
            return None

        def close(self, emit: Callable[[Event], None]) -> None:
            raise RuntimeError("close broke")

    told: list[str] = []

    class Told(DeterministicCompaction):
        def close(self, emit: Callable[[Event], None]) -> None:
            told.append("told")

    ctx = ContextManager(
        Budget(context_window=20_000, reserve_output=2_000),
        strategy=Chain([CloseRaises(), Told()]),
    )
    seen: list[object] = []
    ended = anyio.Event()

    async def read() -> None:
        async for event in ctx.events():
            seen.append(event)
        ended.set()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(read)
        await anyio.lowlevel.checkpoint()
        with pytest.raises(RuntimeError, match="close broke"):
            async with ctx:
                await ctx.prepare([UserMessage.of("task")])
        with anyio.fail_after(2):
            await ended.wait()
    assert told == ["told"]
    assert [e.code for e in seen if isinstance(e, CompactionWarning)] == ["strategy_close"]
    await ctx.aclose()  # closed: raises nothing more
    with pytest.raises(ConfigError):
        await ctx.prepare([UserMessage.of("task")])


async def test_event_iterators_end_on_a_closed_manager_and_unread_ones_are_let_go() -> None:
    """Found by a hostile run (V, finding 6): `events` on a closed manager never ended, and
    an iterator made and dropped unread stayed registered, buffering every event (with a
    warning per event once full)."""
    import gc

    ctx = ContextManager(20_000)
    async with ctx:
        await ctx.prepare([UserMessage.of("task")])
    with anyio.fail_after(2):
        assert [e async for e in ctx.events()] == []
    async with ContextManager(20_000) as other:
        for _ in range(5):
            other.events()
        gc.collect()
        assert other._hub._streams == []
        other.emit(CompactionWarning("x", "y"))


async def test_a_briefing_whose_reply_reports_no_usage_costs_an_unknown_amount() -> None:
    """Found by a hostile run (U, finding 3): an OpenAI-compatible server that leaves usage
    out made every billed briefing cost $0.00 at a known price; money not known is `None`."""

    class NoUsage:
        async def summarize(self, request: SummaryRequest) -> SummaryResult:
            return SummaryResult(text=BRIEFING, stop_reason="stop", model="gpt-4.1-mini")

    llm = LlmCompaction(NoUsage(), LlmCompactionConfig(trigger_ratio=0.3))
    events: list[Event] = []
    budget = Budget(context_window=3_000, reserve_output=1_000)
    async with ContextManager(budget, strategy=llm) as ctx:
        ctx.subscribe(events.append)
        await run_until_spliced(ctx, llm, turns=12)
    assert llm.spend.requests >= 1 and llm.spend.cost_usd is None
    stats = [e.summary for e in events if getattr(e, "summary", None) is not None]
    assert any(isinstance(e, ContextCompacted) and e.method == "summarized" for e in events)
    assert stats and all(s.cost_usd is None for s in stats)


async def test_a_large_parallel_batch_with_missing_results_is_read_once_per_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by a hostile run (W, finding 1): with an assistant message of N parallel calls,
    some unanswered, one `prepare` over the budget cost O(stubs x calls x rounds): each stub
    repair added (its origin the batch's message) had tier 1 read every call's arguments
    again, and each result looked its call up by walking the batch (4,000 calls, 3,300
    stubs: 29 s). Counted, not timed: the batch's message is read once per pass of tier 1,
    and the batch is walked once per render, not once per result."""
    from agentctx import boundaries, ledger
    from agentctx.strategies import deterministic

    n, answered = 600, 200
    calls = tuple(ToolCall(f"c{i}", "read", {"path": f"src/f{i}.py"}) for i in range(n))
    history: list[Message] = [user("the task"), AssistantMessage(calls, "tool_use")]
    history += [result(f"c{i}", f"line {i}\n" * 40, name="read") for i in range(answered)]
    read = {"batch": 0, "passes": 0, "walks": 0, "renders": 0}
    cuttable, truncate = (
        deterministic.DeterministicCompaction._cuttable,
        deterministic.DeterministicCompaction._truncate,
    )
    repair, walk = boundaries.repair, boundaries._Batch.__iter__

    def counted_cuttable(self: Any, m: Message) -> bool:
        read["batch"] += m is history[1]
        return cuttable(self, m)

    def counted_truncate(self: Any, *args: Any, **kwargs: Any) -> None:
        read["passes"] += 1
        truncate(self, *args, **kwargs)

    def counted_repair(*args: Any, **kwargs: Any) -> Any:
        read["renders"] += 1
        return repair(*args, **kwargs)

    def counted_walk(self: Any) -> Any:
        read["walks"] += 1
        return walk(self)

    monkeypatch.setattr(deterministic.DeterministicCompaction, "_cuttable", counted_cuttable)
    monkeypatch.setattr(deterministic.DeterministicCompaction, "_truncate", counted_truncate)
    monkeypatch.setattr(ledger, "repair", counted_repair)
    monkeypatch.setattr(boundaries._Batch, "__iter__", counted_walk)
    budget = Budget(context_window=20_000, reserve_output=2_000)
    async with ContextManager(budget, on_over_budget="send") as ctx:
        view = await ctx.prepare(history)
    assert read["passes"] and read["batch"] <= read["passes"]
    assert read["walks"] <= 2 * read["renders"] + 2
    assert_view_ok(view, ctx.raw)
    assert sum(isinstance(m, ToolResultMessage) for m in view) == n  # the stubs are there


async def test_a_marker_names_one_recall_id_however_often_its_stretch_was_dropped() -> None:
    """Found by a hostile run (W, finding 2): each drop's marker copied the ids of every
    earlier marker it absorbed, so the floor of the prompt grew by about 40 characters a drop
    (398 ids, 16k characters after 400 drops) until calls went over the budget. A marker now
    names its own id, whose entry refers to the earlier ones: every dropped message is still
    one recall away."""
    import random

    from agentctx.strategies.trail import is_marker

    rng = random.Random(0)
    store = MemoryRecallStore()
    budget = Budget(context_window=8_000, reserve_output=1_000)
    async with ContextManager(budget, recall=store, session_id="s") as ctx:
        history: list[Message] = [user("the task")]
        drops = n = 0
        while drops < 40:
            n += 1
            words = " ".join(rng.choice(("yes", "ok", "sure", "file", "run")) for _ in range(4))
            history += [AssistantMessage.of(f"{words} {n}"), user(f"go on {n}")]
            version = ctx.ledger.version
            view = await ctx.prepare(history)
            drops += ctx.ledger.version != version
        markers = [m for m in view if is_marker(m)]
        assert markers and all(m.text.count("recall_context id=") == 1 for m in markers)
        shown = {text_of(m.content) for m in view if isinstance(m, AssistantMessage)}
        ids = [i for m in view for i in _ids(m.text if is_marker(m) else text_of(m.content))]
        recalled = "".join([await ctx.recall(rid, limit=10**9) for rid in ids])
        for m in history[1:]:
            if isinstance(m, AssistantMessage) and text_of(m.content) not in shown:
                assert text_of(m.content) in recalled


def _ids(text: str) -> list[str]:
    import re

    return re.findall(r"recall_context id=(ctx-[0-9a-f]+)", text)


async def test_a_close_that_raises_is_said_once_when_the_close_is_slow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by a hostile run (X, finding 6): after a slow close, the strategy's ``close`` is
    called again for what background work left late, and a ``close`` that raised was said
    (and kept) twice."""
    from agentctx import manager

    monkeypatch.setattr(manager, "_CLOSE_SECONDS", 0.2)  # the library waits 5 s

    class Raising(DeterministicCompaction):
        calls = 0

        def close(self, emit: Callable[[Event], None]) -> None:
            Raising.calls += 1
            raise RuntimeError(f"close broke #{Raising.calls}")

    said: list[str] = []

    async def stubborn(event: Event) -> None:  # an async subscriber that ignores cancellation
        if isinstance(event, CompactionWarning):
            said.append(event.code)
            if event.code == "go":
                with anyio.CancelScope(shield=True):
                    await anyio.sleep(0.6)

    ctx = ContextManager(100_000, strategy=Raising())
    ctx.subscribe(stubborn)
    with pytest.raises(RuntimeError, match="close broke #1"):
        async with ctx:
            await ctx.prepare([UserMessage.of("the task")])
            ctx.emit(CompactionWarning("go", "the subscriber starts"))
            await anyio.sleep(0.05)
    assert Raising.calls == 2 and said.count("strategy_close") == 1


async def test_an_edit_of_the_view_held_is_not_read_as_a_go_back_to_an_older_input() -> None:
    """Found by a hostile run (Y, finding 1): with two summaries of the same text, an edit of
    the message after the summary in the view the caller holds matched an older kept input
    as far as the view, and the older input won the tie: the raw history was cut back to what
    that input stood for (six messages gone, `HistoryResynced`)."""
    plan: list[tuple[int, int]] = []  # the span the next call summarizes, once

    class Scripted:
        async def compact(self, ctx: CompactionContext) -> None:
            if plan:
                a, b = plan.pop()
                summary = (SummaryMessage("S"),)
                ctx.take(ReplaceSpan(anchor(ctx.raw, a), b, anchor(ctx.raw, b - 1), summary, "t"))

    events: list[Event] = []
    budget = Budget(context_window=400, reserve_output=10)
    async with ContextManager(budget, strategy=Scripted(), on_over_budget="send") as ctx:
        ctx.subscribe(events.append)
        plan.append((1, 3))
        history: list[Message] = [user("task"), user("u1"), assistant(text="a1"), user("u2")]
        history += [assistant(text="a2")]
        view = await ctx.prepare(history)
        meaning = list(history)
        plan.append((3, 5))  # a rewind (u2 edited) and a decision in one call
        new = [user("u2 edited"), assistant(text="a2'"), user("u3"), assistant(text="a3")]
        history = [*view[:2], *new, user("u4")]
        meaning = [*meaning[:3], *history[2:]]
        view = await ctx.prepare(history)
        plan.append((1, 9))  # a later summary of the same text over more
        grown = [assistant(text="a4"), user("u5"), assistant(text="a5"), user("u6")]
        history, meaning = [*view, *grown], [*meaning, *grown]
        view = await ctx.prepare(history)
        seen = len(events)
        edited = user("u5 edited")
        meaning = [*meaning[: ctx._state.origins[2]], edited]
        await ctx.prepare([*view[:2], edited])
        assert list(map(fingerprint, ctx.raw)) == list(map(fingerprint, meaning))
        assert [e.index for e in events[seen:] if isinstance(e, HistoryResynced)] == [9]


async def test_a_result_of_text_and_an_image_has_its_text_cut() -> None:
    """Found by a hostile run (AA, finding 1): tier 1 cut only results of one text block, so
    a browser tool's page text beside its screenshot was never cut: 105k tokens sent against
    a 16k limit, `BudgetExceeded`. The text is cut; the image stays, in its place."""
    from agentctx.messages import ImageBlock

    image = ImageBlock("image/png", "iVBORw0KGgo=")
    content = (TextBlock("line of log output\n" * 20_000), image)
    history: list[Message] = [
        user("the task"),
        assistant(call("c1", "read", path="a.log")),
        ToolResultMessage("c1", content, "read"),
    ]
    events: list[Event] = []
    budget = Budget(context_window=20_000, reserve_output=4_000)
    async with ContextManager(budget, recall=MemoryRecallStore()) as ctx:
        ctx.subscribe(events.append)
        view = await ctx.prepare(history)
    assert ctx.prompt_tokens <= budget.limit and not any(
        isinstance(e, BudgetExceeded) for e in events
    )
    assert_view_ok(view, ctx.raw)
    (shown,) = [m for m in view if isinstance(m, ToolResultMessage)]
    assert shown.content[1] == image and isinstance(shown.content[0], TextBlock)
    assert "recall_context id=" in shown.content[0].text


async def test_a_result_of_several_text_blocks_is_cut_as_one_keeping_its_fields() -> None:
    """Found by a hostile run (AC, findings 4 and 5): tier 1 cut a result's text only when it
    was one block, so an MCP tool's result of several text items was never cut (12,891 tokens
    against an 11,000 limit, `BudgetExceededError`); and the block it cut lost its fields (a
    caller's ``cache_control``). The text blocks are cut as one text, each keeping its part of
    the head and tail where it stands, with its fields (run AE, finding 2: the breakpoint is on
    the last), around the image between them (run DN, finding 8: the order is kept)."""
    from agentctx.messages import ImageBlock

    image = ImageBlock("image/png", "iVBORw0KGgo=")
    marked = {"cache_control": {"type": "ephemeral", "ttl": "1h"}}
    content = (
        TextBlock("first part of the listing\n" * 1_200),
        image,
        TextBlock("second part of the listing\n" * 1_200, marked),  # where breakpoints go
    )
    history: list[Message] = [
        user("the task"),
        assistant(call("c1", "list", path="/")),
        ToolResultMessage("c1", content, "list"),
    ]
    events: list[Event] = []
    budget = Budget(context_window=15_000, reserve_output=4_000)
    async with ContextManager(budget, recall=MemoryRecallStore()) as ctx:
        ctx.subscribe(events.append)
        view = await ctx.prepare(history)
        assert ctx.prompt_tokens <= budget.limit
        assert not any(isinstance(e, BudgetExceeded) for e in events)
        assert_view_ok(view, ctx.raw)
        (shown,) = [m for m in view if isinstance(m, ToolResultMessage)]
        head, kept, tail = shown.content
        assert kept == image and isinstance(head, TextBlock) and isinstance(tail, TextBlock)
        assert tail.extra == marked and not head.extra
        assert head.text.startswith("first part") and "first part" not in tail.text
        assert tail.text.rstrip().endswith("second part of the listing")
        (rid,) = re.findall(r"recall_context id=(\S+)", head.text)
        page = await ctx.recall(rid.rstrip(")]."), limit=100_000)
    assert text_of(content) in page  # both parts, one recall away


class _Awaiting:
    """The tiers, after awaiting ``seconds`` in `compact` (another task's work, say)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.inner = DeterministicCompaction()
        self.entered = anyio.Event()

    async def compact(self, ctx: CompactionContext) -> object:
        self.entered.set()
        await anyio.sleep(self.seconds)
        return await self.inner.compact(ctx)


def _questions(n: int) -> list[Message]:
    """A task, then ``n`` questions each answered after a tool step."""
    from .helpers import tool_turn

    history: list[Message] = [user("the task")]
    for k in range(n):
        history += [user(f"q{k}"), *tool_turn(k, lines=120), assistant(text=f"a{k}")]
    return history


async def test_a_close_while_another_task_prepares_waits_for_that_call() -> None:
    """Found by a hostile run (AB, finding 6): `aclose` from another task while `prepare`
    awaited inside its strategy closed the session under it: the call then decided and
    returned after the close (its `ContextCompacted` after the event iterators had ended, its
    store writes inline, a wrong `no_task_group` warning). The close now waits for it, and a
    call made once the close has begun is refused."""

    history = _questions(30)
    strategy = _Awaiting(0.2)
    seen: list[Event] = []
    store = MemoryRecallStore()
    budget = Budget(context_window=9_000, reserve_output=1_000)
    manager = ContextManager(budget, strategy=strategy, recall=store, on_over_budget="send")
    order: list[str] = []
    async with manager:

        async def listen() -> None:
            async for event in manager.events():
                seen.append(event)

        async def call() -> None:
            await manager.prepare(history)
            order.append("prepared")

        async with anyio.create_task_group() as tg:
            tg.start_soon(listen)
            tg.start_soon(call)
            await strategy.entered.wait()
            await manager.aclose()
            order.append("closed")
            with pytest.raises(ConfigError, match="closed"):
                await manager.prepare(history)
    assert order == ["prepared", "closed"]
    assert any(isinstance(e, ContextCompacted) for e in seen)  # before the stream ended
    assert not any(isinstance(e, CompactionWarning) for e in seen)
    assert len(manager.ledger) > 0


@pytest.mark.parametrize("kind", ["base64", "digit grid"])
async def test_a_dense_result_cut_by_the_pipeline_is_counted_in_full(kind: str) -> None:
    """Found by a hostile run (AF, finding 1): `ToolOutputPipeline` cut a 60 KB result of
    dense output (base64, a grid of digits) to 20k characters, and the cut text was counted
    only at a few characters a token: 13.7k-19.8k tokens went out against a 10k limit, and
    nothing said so. What decisions put in the view is counted in full before the view is
    measured again, so the next round cuts further."""
    import base64
    import json

    from agentctx.tokens.exact import ExactCounter

    rng = random.Random(7)
    dense = {
        "base64": base64.b64encode(rng.randbytes(45_000)).decode(),
        "digit grid": json.dumps([[rng.randint(0, 9) for _ in range(100)] for _ in range(300)]),
    }[kind]
    exact = MessageCounter(ExactCounter("o200k_base"), lazy=False)  # no quick first counts
    for strategy in (
        ToolOutputPipeline(),
        Chain([ToolOutputPipeline(), DeterministicCompaction()]),
    ):
        budget = Budget(context_window=26_000)
        async with ContextManager(budget, strategy=strategy) as ctx:
            history: list[Message] = [user("What is in logo.png? Show me its bytes.")]
            await ctx.prepare(history)
            history += [
                assistant(call("c1", "bash", command="base64 logo.png")),
                result("c1", dense, "bash"),
            ]
            view = await ctx.prepare(history)
        assert exact.overhead + exact.count_many(view) <= budget.limit


async def test_a_result_the_pipeline_replaces_keeps_its_texts_fields() -> None:
    """Found by a hostile run (AE, finding 2): `ToolOutputPipeline` made its stand-in for a
    result (a persisted preview of 200k characters) a bare text block: a caller's cache
    breakpoint on it was lost, and with it that request's prompt-cache read or write."""
    marked = {"cache_control": {"type": "ephemeral"}}
    output = "\n".join(f"line {i} " + "x" * 60 for i in range(4_000))  # past 200k characters
    history: list[Message] = [
        user("fix the failing test"),
        assistant(call("t1", "mcp_read")),
        ToolResultMessage("t1", (TextBlock(output, marked),), "mcp_read"),
    ]
    budget = Budget(context_window=200_000, reserve_output=1_000)  # fits: the pass persists it
    async with ContextManager(budget, strategy=ToolOutputPipeline()) as ctx:
        view = await ctx.prepare(history)
    (shown,) = [m for m in view if isinstance(m, ToolResultMessage)]
    assert shown.content[0].text.startswith("[Persisted output")  # type: ignore[union-attr]
    assert [b.extra for b in shown.content] == [marked]


async def test_a_call_that_outlives_the_closes_wait_is_refused_when_it_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by a hostile run (AE, finding 6): past the close's bounded wait, the other task's
    call went on, decided after the close, and left its recall entry pinned for good, with no
    event. The close says so (`slow_close`), and the call raises `ConfigError` when it ends,
    its decisions unsaved."""
    monkeypatch.setattr(manager_module, "_CLOSE_SECONDS", 0.3)

    history = _questions(30)
    strategy = _Awaiting(0.8)
    store = MemoryRecallStore()
    events: list[Event] = []
    budget = Budget(context_window=9_000, reserve_output=1_000)
    manager = ContextManager(budget, strategy=strategy, recall=store, session_id="s")
    manager.subscribe(events.append)
    outcome: list[BaseException] = []
    async with manager:

        async def call() -> None:
            try:
                await manager.prepare(history)
            except ConfigError as e:
                outcome.append(e)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await strategy.entered.wait()
            await manager.aclose()
    assert [str(e) for e in outcome] == ["this ContextManager closed while this call ran"]
    assert [e.code for e in events if isinstance(e, CompactionWarning)] == ["slow_close"]
    assert not store._pins  # nothing left pinned


async def test_a_call_with_the_newest_call_unanswered_compares_no_whole_history(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by a hostile run (AG, finding 4): a loop calling `prepare` before the tools ran
    (its newest call unanswered, a stub in each view) had each call compare the whole
    history with the view, message by message, by fingerprint: 1 ms a call at 20k messages.
    The view's last message is compared first, and there they differ."""
    import agentctx._follow as follow

    history: list[Message] = [user("the task")]
    for k in range(3_000):
        history += [assistant(call(f"c{k}", "read", path=f"f{k}")), result(f"c{k}", f"ok {k}")]
    compared = 0
    same = follow.same_message

    def counted(a: Message, b: Message) -> bool:
        nonlocal compared
        compared += 1
        return same(a, b)

    async with ContextManager(Budget(context_window=1_000_000)) as ctx:
        await ctx.prepare(history[:-1])  # the last call unanswered: a stub in the view
        monkeypatch.setattr(follow, "same_message", counted)
        for end in range(len(history) + 1, len(history) + 40, 2):
            history += [assistant(call(f"x{end}", "read")), result(f"x{end}", "ok")]
            await ctx.prepare(history[:-1])
    assert 0 < compared < 200  # a few a call, not 6,000


async def test_a_call_near_the_limit_counts_in_full_only_what_is_new_since_the_report() -> None:
    """A call near the limit counts its new messages in full; messages left on quick counts
    by earlier calls add the whole view. A usage report counts in full everything it was
    sent, but that debt was not cleared: near the limit, every call of a loop that reports
    each response counted the whole view again (48 of 470 calls of the pi session at 50k), a
    no-decision call O(history)."""
    asked: list[int] = []

    class Counting(MessageCounter):
        def refine(self, messages: Any) -> int:
            messages = list(messages)
            asked.append(len(messages))
            return super().refine(messages)

    budget = Budget(context_window=12_000, reserve_output=2_000)
    history: list[Any] = []
    sent: list[Any] = []
    near = 0
    async with ContextManager(budget, counter=Counting(), on_over_budget="send") as ctx:
        for group in synthetic_session(3, 300, mean_output_lines=30):
            history += group
            version = ctx.ledger.version
            asked.clear()
            before, sent = sent, await ctx.prepare(history)
            assert_view_ok(sent, history)
            # (A view over the limit is counted in full before the call says it is.)
            if ctx.ledger.version == version and asked and ctx.prompt_tokens <= budget.limit:
                near += 1
                assert sent[: len(before)] == before  # no decision: the view only grew
                assert max(asked) <= len(sent) - len(before), (len(history), asked)
            full = MessageCounter()
            ctx.observe(Usage(input_tokens=full.overhead + sum(map(full.count_full, sent))))
            await anyio.lowlevel.checkpoint()  # the report is applied in the background
    assert near >= 20  # calls that counted their new messages in full: near the limit


async def test_an_async_subscriber_that_closes_the_session_does_not_wait_for_itself() -> None:
    """Found by a hostile run (AI, finding 2): a watchdog subscriber (async, so a task of the
    manager's background work) that closed the session waited the close's whole bound for
    the work it is part of, 5 s, and the close then blamed a blocking summarizer call
    (`slow_close`). It closes at once; the subscriber is cancelled at its next await."""
    events: list[Event] = []
    after_close: list[str] = []
    ctx = ContextManager(Budget(context_window=4_000, reserve_output=500), on_over_budget="send")

    async def watchdog(event: Event) -> None:
        if isinstance(event, ContextCompacted):
            await ctx.aclose()
            after_close.append("returned")
            await anyio.sleep(10)  # cancelled: the background work it belongs to ends
            after_close.append("slept")

    history: list[Any] = [user("the task")]
    streamed: list[Event] = []
    with anyio.fail_after(3):
        async with ctx:
            ctx.subscribe(events.append)
            ctx.subscribe(watchdog)
            stream = ctx.events()
            with pytest.raises(ConfigError, match="closed"):
                for n in range(200):
                    history += [assistant(call(f"c{n}", "read")), result(f"c{n}", "x " * 400)]
                    await ctx.prepare(history)
                    await anyio.lowlevel.checkpoint()
            # (AJ, finding 1) The event streams end, as they do on any close: a reader
            # inside ``async with`` waited for them until it exited.
            streamed += [e async for e in stream]
            assert [e async for e in ctx.events()] == []
    assert after_close == ["returned"]
    assert not [e for e in events if isinstance(e, CompactionWarning)]
    assert streamed == events


async def test_an_edit_of_the_last_message_of_a_history_converted_again_compares_in_c(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by a hostile run (AK, finding 2): a projection caller that converts its history
    from dicts for every call (equal messages, new objects) and edits the last message had
    the history compared message by message, each by a fingerprint made anew: 80 ms a call
    at 10k messages. The equal stretch is found by comparing halves in C; fingerprints are
    made only where the histories part."""
    made: list[int] = []
    import agentctx._follow as follow

    real = follow.fingerprint

    def counted(message: Message) -> str:
        made.append(1)
        return real(message)

    monkeypatch.setattr(follow, "fingerprint", counted)
    history: list[Message] = [user("the task")]
    for n in range(1_000):
        history += [assistant(call(f"c{n}", "read")), result(f"c{n}", "line\n" * 40)]
    dicts = [to_dict(m) for m in history]
    budget = Budget(context_window=20_000, reserve_output=2_000)
    async with ContextManager(budget, on_over_budget="send") as ctx:
        await ctx.prepare([from_dict(d) for d in dicts])
        for k in range(3):
            dicts[-1] = to_dict(user(f"edited {k}"))
            made.clear()
            view = await ctx.prepare([from_dict(d) for d in dicts])
            assert 0 < len(made) < 100, len(made)  # 4,000 a call before
            assert view[-1] == user(f"edited {k}") and len(ctx.raw) == len(dicts)


async def test_a_summarizer_that_closes_the_session_does_not_wait_for_itself() -> None:
    """Found by a hostile run (AL, finding 6): a summarizer (a task the strategy starts)
    that closed the session waited the close's whole bound for the work it is part of, and
    the close blamed a blocking call twice (`slow_close`), as an async subscriber's did
    before. It closes at once; what it was billed is reported once."""
    ctx: list[ContextManager] = []

    class Closing(ScriptedSummarizer):
        async def summarize(self, request: SummaryRequest) -> SummaryResult:
            await ctx[0].aclose()
            return await super().summarize(request)

    tiers = DeterministicCompaction()
    llm = LlmCompaction(Closing([], default=BRIEFING), fallback=tiers)
    budget = Budget(context_window=8_000, reserve_output=500)
    manager = ContextManager(budget, strategy=Chain([llm, tiers]), on_over_budget="send")
    ctx.append(manager)
    events: list[Event] = []
    history: list[Any] = [user("the task")]
    with anyio.fail_after(3):
        async with manager:
            manager.subscribe(events.append)
            with pytest.raises(ConfigError, match="closed"):
                for n in range(300):
                    history += [assistant(call(f"c{n}", "read")), result(f"c{n}", "x " * 300)]
                    await manager.prepare(history)
                    await anyio.sleep(0.005)
    assert not [e for e in events if isinstance(e, CompactionWarning)]
    billed = [e for e in events if getattr(e, "summary", None) is not None]
    assert llm.spend.requests == len(billed) == 1


async def test_a_close_after_one_from_inside_still_waits_its_bound_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by a hostile run (AN, finding 6): once an async subscriber had closed the
    session (not waiting for the work it is part of), the loop's own close returned at once
    as closed already, and ``async with`` then waited for a summarizer blocking in a thread,
    unbounded and unsaid. That close waits its bound and says `slow_close`, once."""
    monkeypatch.setattr(manager_module, "_CLOSE_SECONDS", 0.3)

    class InAThread(ScriptedSummarizer):
        async def summarize(self, request: SummaryRequest) -> SummaryResult:
            await anyio.to_thread.run_sync(time.sleep, 1.0)
            return await super().summarize(request)

    tiers = DeterministicCompaction()
    llm = LlmCompaction(
        InAThread([], default=BRIEFING), LlmCompactionConfig(trigger_ratio=0.3), fallback=tiers
    )
    budget = Budget(context_window=5_000, reserve_output=1_000)
    ctx = ContextManager(budget, strategy=Chain([llm, tiers]), on_over_budget="send")
    events: list[Event] = []

    async def watchdog(event: Event) -> None:
        if isinstance(event, ContextCompacted) and llm.phase == "in_flight":
            await ctx.aclose()

    history: list[Any] = [user("the task")]
    with anyio.fail_after(5):
        async with ctx:
            ctx.subscribe(events.append)
            ctx.subscribe(watchdog)
            with pytest.raises(ConfigError, match="closed"):
                for i in range(200):
                    history += [
                        user(f"q{i} " + "word " * 80),
                        assistant(text=f"a{i} " + "word " * 80),
                    ]
                    await ctx.prepare(history)
                    await anyio.sleep(0.01)
    assert [e.code for e in events if isinstance(e, CompactionWarning)] == ["slow_close"]
    assert llm.spend.requests == len([e for e in events if getattr(e, "summary", None)]) == 1


@pytest.mark.parametrize(
    ("name", "value"), [("recall", "redis://localhost:6379"), ("tracer", "otel"), ("recall", {})]
)
def test_a_recall_store_or_tracer_that_is_none_is_refused_when_made(
    name: str, value: object
) -> None:
    """A URL for a store was taken: every write then failed unsaid but for a StoreDegraded,
    and cleared content was never kept; a tracer that is none traced nothing, its errors in
    a log nobody reads (found by a hostile run)."""
    with pytest.raises(ConfigError, match=f"{name} is a"):
        ContextManager(100_000, **{name: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("max_tokens", ["4096", -1, 1.5, True])
async def test_max_tokens_is_checked_whatever_the_reserve(max_tokens: object) -> None:
    """With a reserve of one's own, ``max_tokens`` was not looked at (found by a hostile run)."""
    async with ContextManager(Budget(context_window=50_000, reserve_output=4_000)) as ctx:
        with pytest.raises(ConfigError, match="max_tokens"):
            await ctx.prepare([user("hi")], max_tokens=max_tokens)  # type: ignore[arg-type]


def test_an_observe_whose_clock_fails_changes_nothing() -> None:
    """The usage was added before the clock was read: each retry added it again."""
    now = [1_000.0]
    ctx = ContextManager(100_000, clock=lambda: now[0])
    now[0] = math.nan
    for _ in range(2):
        with pytest.raises(ConfigError, match="clock"):
            ctx.observe(Usage(input_tokens=1_000))
    assert ctx.usage == Usage()


@pytest.mark.parametrize(
    ("before", "given", "index"),
    [(2, [0, "dict"], 1), (1, ["dict"], 0), (3, [0, "str", 2], 1)],
)
async def test_a_non_message_where_the_session_has_one_is_refused_by_its_index(
    before: int, given: list[object], index: int
) -> None:
    """After a first call, an item that is no message where the session already had one (a
    provider dict passed by mistake, a rewind to one) raised a bare `AttributeError` from the
    comparison with what was there (found by a hostile run of the docs)."""
    known = [user("the task"), AssistantMessage.of("hi"), user("next")]
    odd = {"dict": {"role": "assistant", "content": "x"}, "str": "x"}
    history = [known[g] if isinstance(g, int) else odd[g] for g in given]
    async with ContextManager(100_000) as ctx:
        view = await ctx.prepare(known[:before])
        with pytest.raises(UnsupportedMessageError) as refused:
            await ctx.prepare(history)  # type: ignore[arg-type]
        assert refused.value.index == index
        assert await ctx.prepare(known[:before]) == view  # nothing changed


async def test_a_message_of_a_subclass_with_the_same_content_is_the_same_message() -> None:
    """Refusing what is no message at a known place must not read a message of a subclass
    (a framework's own, the same content) as an edit: it resynced, and compacted again."""

    class Tagged(UserMessage):
        pass

    history: list[Message] = [user("the task"), AssistantMessage.of("hi"), user("next")]
    again = [history[0], history[1], Tagged(history[2].content)]
    events: list[Event] = []
    async with ContextManager(100_000) as ctx:
        view = await ctx.prepare(history)
        ctx.subscribe(events.append)
        assert await ctx.prepare(again) == view
    assert events == []


@pytest.mark.parametrize("mode", ["projection", "owned"])
async def test_a_rewind_of_the_last_step_keeps_what_was_dropped_in_the_turn_before(
    mode: str,
) -> None:
    """Found by a hostile run (BH 1): cutting back the last step of the running turn (a
    retry) undid the spans the tiers had dropped in the previous turn while it ran, which
    had completed since: the prompt was rewritten from the turn's first step and grew past
    the limit, though the rewind cut nothing near them. A turn's steps dropped while it ran
    stay dropped once it completes, whatever is rewound after it."""

    def step(i: int) -> list[Message]:
        out = "\n".join(
            f"step {i} line {k}: " + "lorem ipsum dolor sit amet " * 3 for k in range(120)
        )
        return [
            assistant(call(f"c{i}", "read", path=f"f{i}.py"), text=f"doing step {i}"),
            result(f"c{i}", out),
        ]

    events: list[Event] = []
    async with ContextManager(
        Budget(context_window=30_000, reserve_output=2_000),
        recall=MemoryRecallStore(),
        session_id="s",
        on_over_budget="send",
    ) as ctx:
        ctx.subscribe(events.append)
        history: list[Message] = [user("task: refactor"), assistant(text="ok"), user("the parser")]
        view = await ctx.prepare(history)

        async def send(more: list[Message]) -> list[Message]:
            nonlocal history
            history = [*(view if mode == "owned" else history), *more]
            return list(await ctx.prepare(history))

        for i in range(25):  # a long running turn: the tiers drop its early steps
            view = await send(step(i))
        view = await send([assistant(text="parser done"), user("now the cache")])
        for i in range(25, 27):
            view = await send(step(i))
        spans = [d for d in ctx.ledger.decisions if isinstance(d, ReplaceSpan)]
        assert spans and all(s.end <= 50 for s in spans)
        seen = len(events)
        rewound = list(await ctx.prepare(history[:-2]))  # the caller drops its last step
        assert rewound == view[:-2]
        assert [d for d in ctx.ledger.decisions if isinstance(d, ReplaceSpan)] == spans
        resynced = [e for e in events[seen:] if isinstance(e, HistoryResynced)]
        assert [e.dropped_decisions for e in resynced] == [0]
        assert list(await ctx.prepare(history)) == view  # the retry: the same view again


class _NoCompaction:
    async def compact(self, ctx: CompactionContext) -> None:
        return None


async def test_a_session_that_stays_over_the_budget_is_not_counted_again_whole_each_call() -> None:
    """Found by a hostile run (CC 6): each call over the limit refined the whole view, though
    only what the call added could still be on a quick count: a session that stays over it
    (``agentctx replay --strategy none`` on 64k messages: 34 s) was quadratic."""
    counted: list[int] = []

    class Counting(MessageCounter):
        def refine(self, messages: Any) -> int:
            messages = list(messages)
            counted.append(len(messages))
            return super().refine(messages)

    history: list[Message] = [user("task")]
    async with ContextManager(
        Budget(context_window=3_000, reserve_output=1_000),
        strategy=_NoCompaction(),
        counter=Counting(),
        on_over_budget="send",
    ) as ctx:
        for k in range(400):
            history += [AssistantMessage.of(f"step {k} " + "word " * 20), user(f"go on {k}")]
            await ctx.prepare(history)
    assert ctx.prompt_tokens > 3_000  # over the limit all along
    assert sum(counted) < 20 * len(history)  # it was about len(history) ** 2 / 2


class _TakesThenFails:
    """Takes one decision on its first call, then raises or awaits (a worker thread, say)."""

    def __init__(self, how: str) -> None:
        self.how, self.calls = how, 0

    async def compact(self, ctx: CompactionContext) -> None:
        self.calls += 1
        if self.calls == 1:
            rid = (
                ctx.recall.put(ctx.session_id, text_of(ctx.raw[2].content)) if ctx.recall else None
            )
            cleared = (TextBlock(f"[cleared; recall_context id={rid}]"),)
            ctx.take(ReplaceResult(anchor(ctx.raw, 2), cleared, "cleared", rid))
            if self.how == "raise":
                raise RuntimeError("a bug in the strategy")
            await anyio.sleep(60)


@pytest.mark.parametrize("how", ["raise", "cancel"])
async def test_a_call_that_ends_after_a_decision_sends_it_from_the_next_view_on(
    how: str, tmp_path: Path
) -> None:
    """Found by a hostile run: a decision taken by a strategy that then raised, or was
    cancelled while it awaited, stayed in the ledger (and was saved with the next decision)
    but the manager's views never rendered it, so a worker resuming the session sent another
    view than the last one sent, and the decision surfaced on some later render."""
    history: list[Message] = [
        user("task"),
        assistant(call("c1", "read", path="a")),
        result("c1", "ORIGINAL " * 500),
        assistant(text="done"),
        user("next"),
    ]
    budget = Budget(context_window=100_000)
    path = tmp_path / "session.db"
    events: list[Event] = []
    async with ContextManager(
        budget, strategy=_TakesThenFails(how), recall=SQLiteRecallStore(path), session_id="S"
    ) as ctx:
        ctx.subscribe(events.append)
        with pytest.raises(RuntimeError if how == "raise" else TimeoutError):
            with anyio.fail_after(0.2):
                await ctx.prepare(history)
        # No ContextCompacted reports the decision: a warning says the next view shows it.
        (warning,) = [e for e in events if isinstance(e, CompactionWarning)]
        assert warning.code == "interrupted" and "1 decision(s) (cleared)" in warning.message
        history += [assistant(text="a2"), user("u3")]
        view = await ctx.prepare(history)
        assert view == render(ctx.raw, ctx.ledger).messages
        assert "[cleared; recall_context id=ctx-" in text_of(view[2].content)
    strategy = _TakesThenFails(how)
    strategy.calls = 1  # takes nothing more
    async with ContextManager(
        budget, strategy=strategy, recall=SQLiteRecallStore(path), session_id="S"
    ) as resumed:
        assert await resumed.prepare(history) == view


async def test_the_raw_history_read_back_is_a_copy_the_session_does_not_go_on_from() -> None:
    """Found by a hostile run (CR 2): `ContextManager.raw` was the manager's own list; a
    caller that went on from it (``h = ctx.raw; h.append(...)``) grew the session's history
    behind its back, the next call saw nothing new, and the latest user message never
    reached a view. It is now a copy."""
    async with ContextManager(Budget(context_window=50_000)) as ctx:
        await ctx.prepare([UserMessage.of("task")])
        history = ctx.raw
        history += [assistant(text="answer"), user("second question")]
        view = await ctx.prepare(history)
        assert_view_ok(view, history)
        assert [text_of(m.content) for m in view] == ["task", "answer", "second question"]
        assert ctx.raw == history and ctx.raw is not ctx.raw


async def test_a_result_repair_left_out_is_compared_so_fixing_it_in_place_is_seen() -> None:
    """Found by a hostile run (CR 3): a result whose id matched no call was left out and its
    call sent a stub; a projection caller that fixed the id in place and went on was never
    compared there (the view does not show it), so every later view still told the model
    its tool was interrupted. What repair leaves out is compared now."""
    async with ContextManager(Budget(context_window=50_000)) as ctx:
        history: list[Message] = [
            user("task"),
            assistant(call("call_1", "read", path="a.py")),
            result("call_l", "print('hello')", "read"),  # a harness's typo in the id
            user("what does a.py print?"),
        ]
        view = await ctx.prepare(history)
        assert MISSING_RESULT_TEXT in [text_of(m.content) for m in view]
        history[2] = result("call_1", "print('hello')", "read")
        history += [assistant(text="Let me check."), user("go on")]
        view = await ctx.prepare(history)
        assert_view_ok(view, history)
        texts = [text_of(m.content) for m in view]
        assert "print('hello')" in texts and MISSING_RESULT_TEXT not in texts
        assert ctx.raw == history


@pytest.mark.parametrize("window", [10**8, 50_000])
async def test_editing_the_newest_message_renders_only_what_it_changes(window: int) -> None:
    """Found by a hostile run (CR 4): editing or regenerating the newest message (a retried
    tool) took no decision, yet rendered the whole history again and searched it from the
    end for its turns: 130-370 ms a call at 40k messages in one tool loop. The view is now
    rendered again from the cut, and the turns read as they grew are kept across it."""
    import agentctx.view as view_module

    starts: list[int] = []
    render_from = view_module.render

    def recorded(raw: Any, ledger: Any, start: int = 0, continues: Any = None) -> Any:
        starts.append(start)
        return render_from(raw, ledger, start, continues)

    history: list[Message] = [user("task")]
    for k in range(1000):
        history += [assistant(call(f"c{k}", "read", path=f"f{k}")), result(f"c{k}", "x\n" * 20)]
    async with ContextManager(Budget(context_window=window)) as ctx:
        await ctx.prepare(history)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(view_module, "render", recorded)
            for k in range(3):
                history = [*history[:-1], result(history[-1].tool_call_id, f"retried {k}")]  # type: ignore[attr-defined]
                view = await ctx.prepare(history)
                assert_view_ok(view, history)
                assert ctx.raw == history
    assert starts and min(starts) >= len(history) - 2


async def test_a_history_that_does_not_slice_is_read_as_an_iterable() -> None:
    """Found by a hostile run (CR 5): a `collections.deque` is a `Sequence`, so it was taken
    as one and sliced: a bare `TypeError` on the first call."""
    from collections import deque

    history = deque([user("task"), assistant(text="hi"), user("go on")])
    async with ContextManager(Budget(context_window=50_000)) as ctx:
        view = await ctx.prepare(history)  # type: ignore[arg-type]
        assert view == list(history)
        history.append(assistant(text="again"))
        history.append(user("and on"))
        assert await ctx.prepare(history) == list(history)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "usage",
    [Usage(10**12, 5), Usage(100, 1, 0, 10, 50), Usage(input_tokens=5, cache_read_tokens=10**10)],
)
async def test_observe_refuses_a_usage_object_past_the_usage_rules(usage: Usage) -> None:
    """Found by a hostile run (CR 7): a usage dict holding 10**12 input tokens was refused,
    the same count as a `Usage` was taken and added to ``ctx.usage`` for good; so was a
    ``cache_write_1h_tokens`` above ``cache_write_tokens`` (the part written for an hour)."""
    async with ContextManager(Budget(context_window=50_000)) as ctx:
        await ctx.prepare([user("task")])
        with pytest.raises(ConfigError, match="token counts are ints from 0"):
            ctx.observe(usage)
        assert ctx.usage == Usage()


async def test_a_budget_the_markers_fill_says_so() -> None:
    """Found by a hostile run (DF, finding 5): at a 1,400-token limit the drop tier's own
    markers (each keeps its list of files and commands whole) took 854 of the 1,418 tokens
    left, and `BudgetExceededError` blamed "a custom strategy, or one that only clears tool
    output" or signed reasoning and images, none of which the view held."""
    from agentctx.budget import BudgetExceededError
    from agentctx.messages import SummaryMessage, TextBlock, ToolCall, ToolResultMessage

    budget = Budget(context_window=1_500, reserve_output=100)
    async with ContextManager(budget, recall=MemoryRecallStore()) as ctx:
        history: list[Message] = [UserMessage.of("Task: fix the failing test in src/app.py")]
        for i in range(80):
            command = f"grep -rn pattern_{i} src/module_{i}/handler_{i}.py"
            output = "\n".join(f"out {i} line {j} " + "z" * 40 for j in range(60))
            history += [
                AssistantMessage(
                    (TextBlock(f"step {i}"), ToolCall(f"c{i}", "bash", {"command": command})),
                    "tool_use",
                ),
                ToolResultMessage.of(f"c{i}", output, tool_name="bash"),
            ]
            if i % 5 == 4:
                history += [AssistantMessage.of(f"answer {i}"), UserMessage.of(f"next {i}")]
            try:
                history = list(await ctx.prepare(history))
            except BudgetExceededError as error:
                markers = [m for m in error.view if isinstance(m, SummaryMessage)]
                assert error.markers == sum(map(ctx.counter.count, markers)) > 0
                said = f"standing for what was dropped or summarized take {error.markers} "
                assert said in str(error)
                return
    raise AssertionError("the budget was met: the reproduction no longer reproduces")


async def test_a_budget_the_markers_fill_whole_blames_nothing_else() -> None:
    """Found by a hostile run (DJ, finding 5): with the protected part and the markers
    making up the whole estimate, the message still blamed a custom strategy, signed
    reasoning or images."""
    from agentctx.budget import BudgetExceededError

    error = BudgetExceededError(382, 250, [], 158, markers=224)
    assert "take 224" in str(error) and "custom strategy" not in str(error)
    assert "custom strategy" in str(BudgetExceededError(400, 250, [], 158, markers=224))
