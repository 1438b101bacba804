"""Property-based checks of the invariants (docs/invariants.md) over generated histories,
driven as real callers do."""

from __future__ import annotations

import pickle
import random
import tempfile
import threading
from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from agentctx.adapters import to_anthropic, to_openai_chat, to_openai_responses
from agentctx.boundaries import LEFT_OUT
from agentctx.budget import Budget
from agentctx.errors import StoreError
from agentctx.events import BudgetExceeded, Event, TranscriptRepaired
from agentctx.ledger import Ledger, render
from agentctx.manager import ContextManager
from agentctx.messages import (
    AssistantMessage,
    ImageBlock,
    Message,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
    canonical_json,
    text_of,
)
from agentctx.recall import LedgerStore, MemoryRecallStore, RecallStore, SQLiteRecallStore
from agentctx.strategies import DeterministicCompaction, ToolOutputPipeline
from agentctx.strategies.llm import LlmCompaction
from agentctx.strategy import Chain, CompactionStrategy
from agentctx.testing import ScriptedSummarizer, assert_view_ok
from agentctx.testing._validate import validate_anthropic, validate_chat, validate_responses
from agentctx.testing.scripted import Outcome
from agentctx.view import ViewState

from .helpers import png, returns_within

_texts = st.text(alphabet=st.sampled_from("abc xyz\n{}:;/.\"'#é字"), min_size=0, max_size=40)


@st.composite
def output(draw: st.DrawFn) -> str:
    unit = draw(_texts) or "x"
    lines = draw(st.integers(1, 400))
    return "\n".join(f"{unit} {i}" for i in range(lines))


@st.composite
def sessions(draw: st.DrawFn) -> list[list[Message]]:
    """Groups appended between model calls: tool steps (parallel, aborted, with thinking),
    final answers, new user prompts, and now and then an orphan result."""
    groups: list[list[Message]] = [[UserMessage.of("task: " + draw(_texts))]]
    for n in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["tool", "tool", "tool", "answer", "aborted", "orphan"]))
        thinking = draw(st.booleans())
        blocks: list[Any] = [ThinkingBlock(f"think {n}", f"sig{n}")] if thinking else []
        if kind == "answer":
            blocks.append(TextBlock(f"answer {n}"))
            groups.append([AssistantMessage(tuple(blocks), "stop"), UserMessage.of(f"next {n}")])
            continue
        width = draw(st.integers(1, 4))
        calls = [
            ToolCall(
                f"c{n}_{k}",
                draw(st.sampled_from(["read", "bash", "write"])),
                {"path": f"p{n}_{k}", "content": draw(output()) if draw(st.booleans()) else "x"},
            )
            for k in range(width)
        ]
        blocks.extend(calls)
        step: list[Message] = [AssistantMessage(tuple(blocks), "tool_use")]
        if kind == "aborted":
            answered = calls[: draw(st.integers(0, width - 1))]
            step += [ToolResultMessage.of(c.id, draw(output())) for c in answered]
            step.append(UserMessage.of("interrupted"))
        else:
            step += [
                ToolResultMessage.of(c.id, draw(output()), is_error=draw(st.booleans()))
                for c in calls
            ]
            if kind == "orphan":
                step.append(ToolResultMessage.of(f"ghost{n}", "orphan"))
        groups.append(step)
    return groups


def fingerprints(view: list[Message]) -> list[str]:
    return [canonical_json(m) for m in view]


_settings = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_settings
@given(groups=sessions(), window=st.integers(2_000, 40_000), owned=st.booleans())
async def test_every_view_keeps_the_invariants(
    groups: list[list[Message]], window: int, owned: bool
) -> None:
    budget = Budget(context_window=window, reserve_output=500)
    events: list[Event] = []
    async with ContextManager(
        budget, recall=MemoryRecallStore(), on_over_budget="send", session_id="p"
    ) as ctx:
        ctx.subscribe(events.append)
        history: list[Message] = []
        previous: list[str] = []
        for group in groups:
            history = [*history, *group]
            snapshot = fingerprints(history)
            version = ctx.ledger.version
            seen = len(events)
            view = await ctx.prepare(history)
            # input never mutated; every view provider-valid, task and latest user kept,
            # signed thinking untouched (assert_view_ok)
            assert fingerprints(history) == snapshot
            assert_view_ok(view, ctx.raw)
            # the view's kept estimate (vector sums, memoized per call) is a recount's
            counter = ctx.counter
            recount = counter.overhead + counter.count_many(view)
            assert abs(ctx.prompt_tokens - recount) <= len(view)
            current = fingerprints(view)
            # a view (markers, summaries, repaired messages) pickles as it is
            assert fingerprints(pickle.loads(pickle.dumps(view))) == current
            # re-running prepare on settled history is a byte-identical no-op
            again = await ctx.prepare(view if owned else history)
            assert fingerprints(again) == current
            # appending leaves the prefix byte-identical unless a decision was taken; the
            # last message of the previous view may have been a stub for a pending batch
            if ctx.ledger.version == version:
                assert current[: len(previous)] == previous
            # rendering is deterministic, also from a ledger restored from JSON
            restored = render(ctx.raw, Ledger.from_json(ctx.ledger.to_json()))
            assert fingerprints(restored.messages) == current
            # over budget only with the task and newest turn alone too big, and then said so
            if ctx.prompt_tokens > budget.limit:
                assert any(isinstance(e, BudgetExceeded) for e in events[seen:])
            previous = current
            if owned:
                history = list(view)


# --------------------------------------------------------------------------------------
# Hostile histories: every built-in strategy, with and without a recall store, both modes,
# and histories as real callers and servers produce them: rewound and edited between calls,
# tool-call ids repeated across turns and within a batch, whitespace-only text, a start on
# an assistant message, lone surrogates. Every view is checked by `check_view` and, in wire
# form, by the fake servers' validators (the real APIs' rules).

_SURROGATES = ["\ud800", "\udfff", "\udc80"]
_hostile_texts = st.text(
    alphabet=st.sampled_from([*"abc xyz\n\t{}:;/.\"'#é字", *_SURROGATES]), max_size=30
)
_blank = st.sampled_from(["", " ", "\n", " \t\n"])
_IMAGE = ImageBlock("image/png", png(40, 30))
BRIEFING = (
    "## Goal\nFinish the task.\n## Constraints\nNone.\n## Decisions\nKeep going.\n"
    "## Files touched\nsrc/x.py\n## Open items\nTests."
)
STRATEGIES = ("deterministic", "pipeline", "chain", "llm", "llm-flaky")
STORES = ("none", "memory", "sqlite", "failing")
TOOLS = [{"name": n, "input_schema": {"type": "object"}} for n in ("read", "bash", "write")]


@st.composite
def hostile_output(draw: st.DrawFn) -> str:
    unit = draw(_hostile_texts) or "x"
    return "\n".join(f"{unit} {i}" for i in range(draw(st.integers(1, 200))))


@st.composite
def hostile_step(draw: st.DrawFn, n: int, ids: str) -> list[Message]:
    """One model call's worth of messages: a tool step (maybe parallel, aborted, with blank
    text before the calls), an answer and the next prompt (maybe blank)."""
    kind = draw(st.sampled_from(["tool", "tool", "tool", "answer", "aborted", "orphan"]))
    reasoning = draw(st.sampled_from(["none", "none", "signed", "redacted"]))
    blocks: list[Any] = []
    if reasoning == "signed":
        blocks.append(ThinkingBlock(f"think {n}", f"sig{n}"))
    elif reasoning == "redacted":
        blocks.append(RedactedThinkingBlock(f"ZW5jcnlwdGVk{n}" * 20))
    if kind == "answer":
        blocks.append(TextBlock(draw(st.sampled_from([f"answer {n}", " ", "\n"]))))
        prompt = draw(st.one_of(_blank, _hostile_texts.map(lambda t: f"next {n} {t}")))
        pictured = (TextBlock(prompt), _IMAGE) if draw(st.integers(0, 3)) == 0 else None
        asked = UserMessage(pictured) if pictured else UserMessage.of(prompt)
        return [AssistantMessage(tuple(blocks), "stop"), asked]
    if draw(st.booleans()):
        blocks.append(TextBlock(draw(_blank) or "\n"))  # whitespace before the calls
    width = draw(st.integers(1, 3))
    naming = {"unique": lambda k: f"c{n}_{k}", "per_turn": lambda k: f"call_{k}"}
    calls = [
        ToolCall(
            naming.get(ids, lambda k: "call_0")(k),
            draw(st.sampled_from(["read", "bash", "write"])),
            {
                "path": f"p{n}_{k}",
                "content": draw(hostile_output()) if draw(st.booleans()) else "x",
            },
        )
        for k in range(width)
    ]
    blocks.extend(calls)
    step: list[Message] = [AssistantMessage(tuple(blocks), "tool_use")]
    if kind == "aborted":
        answered = calls[: draw(st.integers(0, width - 1))]
        step += [ToolResultMessage.of(c.id, draw(hostile_output())) for c in answered]
        return [*step, UserMessage.of("interrupted")]
    for c in calls:
        text = draw(hostile_output() | _blank)  # blank: a tool that printed nothing, failed or not
        output = ToolResultMessage.of(c.id, text, is_error=draw(st.booleans()))
        if draw(st.integers(0, 3)) == 0:  # a screenshot beside the text
            output = replace(output, content=(*output.content, _IMAGE))
        step.append(output)
    if kind == "orphan":
        step.append(ToolResultMessage.of(f"ghost{n}", "orphan"))
    return step


@dataclass(frozen=True)
class Step:
    """What the caller does before the next prepare(): append ``messages`` after cutting its
    history back to ``cut`` (a fraction of its length; ``None``: no cut), or after editing
    the message at ``edit`` (a fraction) to hold ``text``."""

    messages: list[Message]
    cut: float | None = None
    edit: float | None = None
    text: str = ""
    report: float | None = None  # after the call: a usage report of this times the estimate
    restart: bool = False  # then a new worker goes on (projection mode, a store with ledgers)


@st.composite
def hostile_sessions(draw: st.DrawFn) -> list[Step]:
    ids = draw(st.sampled_from(["unique", "per_turn", "same"]))
    lead = draw(st.sampled_from(["user", "user", "assistant", "assistant_tools"]))
    first: list[Message] = []
    if lead == "assistant":
        first.append(AssistantMessage.of(draw(st.sampled_from(["Hello.", "How can I help?"]))))
    elif lead == "assistant_tools":
        first += draw(hostile_step(-1, ids))[:2]
        first = [m for m in first if not isinstance(m, UserMessage)]
    first.append(UserMessage.of(draw(st.one_of(_blank, _hostile_texts.map("task: {}".format)))))
    steps = [Step(first)]
    for n in range(draw(st.integers(1, 25))):
        messages = draw(hostile_step(n, ids))
        change = draw(st.sampled_from(["append"] * 6 + ["cut", "edit"]))
        fraction = draw(st.floats(0, 1))
        # The provider's count, as a multiple of the estimate: near it, far off either way,
        # none (an aborted turn), another request's (a host adding its own context).
        report = draw(st.none() | st.floats(0.7, 1.5) | st.sampled_from([0.0, 0.05, 40.0]))
        restart = draw(st.sampled_from([False] * 7 + [True]))
        if change == "cut":
            steps.append(Step(messages, cut=fraction, report=report, restart=restart))
        elif change == "edit":
            text = draw(_hostile_texts)
            steps.append(Step(messages, edit=fraction, text=text, report=report, restart=restart))
        else:
            steps.append(Step(messages, report=report, restart=restart))
    return steps


def _apply(history: list[Message], step: Step) -> list[Message]:
    if step.cut is not None:
        history = history[: max(1, int(step.cut * len(history)))]
    elif step.edit is not None and history:
        i = min(int(step.edit * len(history)), len(history) - 1)
        m = history[i]
        if isinstance(m, UserMessage):
            history = [*history[:i], UserMessage.of(step.text), *history[i + 1 :]]
        elif isinstance(m, ToolResultMessage):
            edited = ToolResultMessage.of(m.tool_call_id, step.text or "edited", is_error=True)
            history = [*history[:i], edited, *history[i + 1 :]]
        else:
            history = history[: max(1, i)]
    return [*history, *step.messages]


def _edited_only_at(before: list[Message], history: list[Message], checked: set[int]) -> bool:
    """Whether ``history`` extends ``before`` but for messages replaced at unchecked positions."""
    if len(history) < len(before) or not before:
        return False
    changed = {i for i, m in enumerate(before) if canonical_json(history[i]) != canonical_json(m)}
    return bool(changed) and not changed & checked


def _strategy(name: str) -> CompactionStrategy:
    if name == "deterministic":
        return DeterministicCompaction()
    if name == "pipeline":
        return ToolOutputPipeline()
    if name == "chain":
        return Chain([ToolOutputPipeline(), DeterministicCompaction()])
    if name == "llm-flaky":
        return LlmCompaction(ScriptedSummarizer(_FLAKY * 4, default=BRIEFING))
    return LlmCompaction(ScriptedSummarizer(default=BRIEFING))


# A summarizer that fails in every way it can, in turn: errors to retry and not, a reply
# without the sections, one cut off, one that lands calls later, one that never comes.
_FLAKY = [
    Outcome.fail(status=500),
    Outcome.reply("Nothing to report."),
    Outcome.reply(BRIEFING, delay=0.005),
    Outcome.fail(status=400),
    Outcome.reply(BRIEFING[:30], stop_reason="length"),
    Outcome.hang(),
    Outcome.reply(BRIEFING),
]


def _without_reasoning(m: Message) -> Message:
    if isinstance(m, ToolResultMessage):  # a Chat tool message takes text only
        texts = tuple(b for b in m.content if not isinstance(b, ImageBlock))
        return replace(m, content=texts) if len(texts) < len(m.content) else m
    if not isinstance(m, AssistantMessage):
        return m
    kept = tuple(b for b in m.content if not isinstance(b, ThinkingBlock | RedactedThinkingBlock))
    # a message that was all reasoning says nothing on Chat
    return AssistantMessage(kept or (TextBlock("."),), m.stop_reason, m.usage, m.model, m.extra)


def wire_problems(view: list[Message]) -> list[str]:
    """What the fake servers (the real APIs' rules) say about ``view`` in each wire format."""
    problems = []
    anthropic = {"model": "m", "max_tokens": 16, "tools": TOOLS, "messages": to_anthropic(view)}
    problems.append(validate_anthropic(anthropic, check_signatures=False))
    # Chat cannot carry signed reasoning, nor an image in a tool message
    unsigned = [_without_reasoning(m) for m in view]
    problems.append(validate_chat({"model": "m", "messages": to_openai_chat(unsigned)}))
    items = to_openai_responses(view)
    problems.append(validate_responses({"model": "m", "input": items}, items))
    return [p.message for p in problems if p is not None]


# Every strategy with every store, a few sessions each (about 25 s in all on 2 cores). No
# shrinking: a session is costly to replay, and a hang costs the 5 s guard per attempt, so
# a failure is reported as found (the example database replays it first next time).
# Derandomized: the suite's verdict may not depend on which sessions a run happens to draw.
# A wider search (derandomize=False, 400 sessions per strategy, memory store) found nothing
# once a raw tail the view left out was handled (test_hardening_manager).
@pytest.mark.filterwarnings("ignore:Generating overly large repr")  # a failing session's
@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("strategy", STRATEGIES)
@settings(
    max_examples=5,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
@given(steps=hostile_sessions(), owned=st.booleans(), window=st.integers(2_000, 30_000))
async def test_hostile_histories_give_views_every_provider_accepts(
    strategy: str, store: str, steps: list[Step], owned: bool, window: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        recall: RecallStore | None = None
        if store == "memory":
            recall = MemoryRecallStore()
        elif store == "sqlite":
            recall = SQLiteRecallStore(Path(tmp) / "recall.db")
        elif store == "failing":
            recall = _FailingStore(Path(tmp) / "recall.db", seed=window)
        try:
            await _drive_hostile(steps, strategy, recall, owned, window)
        finally:
            if isinstance(recall, SQLiteRecallStore):
                recall.close()


# Message objects carry their estimates (each counter's, up to 16, then a memo found by
# fingerprint) and their fingerprints: managers fed the same objects, in one event loop and
# in threads of their own (the blocking API), must each keep their own sums and every rule.
@pytest.mark.filterwarnings("ignore:Generating overly large repr")
@settings(
    max_examples=6,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.generate],
)
@given(
    steps=hostile_sessions(),
    runs=st.lists(
        st.tuples(
            st.sampled_from(STRATEGIES), st.booleans(), st.integers(2_000, 30_000), st.booleans()
        ),
        min_size=2,
        max_size=20,
    ),
)
async def test_sessions_sharing_message_objects_keep_their_own_counts(
    steps: list[Step], runs: list[tuple[str, bool, int, bool]]
) -> None:
    errors: list[BaseException] = []

    def in_thread(strategy: str, owned: bool, window: int) -> None:
        try:
            anyio.run(_drive_hostile, steps, strategy, MemoryRecallStore(), owned, window, False)
        except BaseException as e:  # reported from the test's thread
            errors.append(e)

    threads = [
        threading.Thread(target=in_thread, args=(strategy, owned, window), daemon=True)
        for strategy, owned, window, threaded in runs
        if threaded
    ]
    for thread in threads:
        thread.start()
    with returns_within(120):
        async with anyio.create_task_group() as tg:
            for strategy, owned, window, threaded in runs:
                if not threaded:
                    store = MemoryRecallStore()
                    tg.start_soon(_drive_hostile, steps, strategy, store, owned, window, False)
    for thread in threads:
        thread.join(120)
        assert not thread.is_alive(), "a session in a thread did not finish within 120 s"
    if errors:
        raise errors[0]


# A decision renders the view again only from the first message it touches (the prefix
# before a safe cut stays): every such render must be what rendering it all gives.
@pytest.mark.filterwarnings("ignore:Generating overly large repr")
@pytest.mark.parametrize("strategy", STRATEGIES)
@settings(max_examples=8, derandomize=True, deadline=None, phases=[Phase.generate])
@given(steps=hostile_sessions(), owned=st.booleans(), window=st.integers(2_000, 30_000))
async def test_rendering_from_the_first_decided_message_is_rendering_it_all(
    strategy: str, steps: list[Step], owned: bool, window: int
) -> None:
    refresh, truncate = ViewState.refresh, ViewState.truncate

    def cut_and_compared(state: ViewState, index: int) -> int:
        # A rewind renders again from where it cut too (or a dropped decision began).
        dropped = truncate(state, index)
        check(state)
        return dropped

    def compared(state: ViewState) -> None:
        refresh(state)
        check(state)

    def check(state: ViewState) -> None:
        full = render(state.raw, state.ledger)
        assert fingerprints(state.view) == fingerprints(full.messages)
        assert state.origins == full.origins
        # Where a left-out message sat in what was repaired depends on where that began.
        assert [replace(r, index=0) for r in state.repairs] == [
            replace(r, index=0) for r in full.repairs
        ]
        # The kept sums, with what left them taken out: the sums made anew, to rounding (the
        # unsettled tail, an open batch and its stubs, is counted message by message, each
        # rounded on its own).
        tail = len(state.view) - state._prefix_len
        assert abs(state.tokens - _summed_anew(state)) <= 1 + tail / 2
        raw = state.raw
        assert state.shown == [
            i
            for m, i in zip(full.messages, full.origins, strict=True)
            if raw[i] is m or state._repaired(raw[i], m, i)
        ]
        settled = state.view[: state._prefix_len]
        assert state._prefix_keys == Counter(state._counter.keyed_vectors(settled)[0])
        assert state._prefix_ids == {
            c.id for m in settled if isinstance(m, AssistantMessage) for c in m.tool_calls
        }
        assert state._shown_in_prefix == bisect_left(state.shown, state._settled_raw)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ViewState, "refresh", compared)
        patch.setattr(ViewState, "truncate", cut_and_compared)
        await _drive_hostile(steps, strategy, MemoryRecallStore(), owned, window)


def test_the_rendering_check_sees_partial_renders() -> None:
    """The property above is not vacuous: a session of the corpus shape renders from a kept
    prefix most of the times a decision lands."""
    raw = [UserMessage.of("task")]
    for k in range(30):
        raw += [
            AssistantMessage((ToolCall(f"c{k}", "read", {"path": f"f{k}.py"}),)),
            ToolResultMessage.of(f"c{k}", "x\n" * 400, tool_name="read"),
        ]
    from agentctx.ledger import ReplaceResult, anchor
    from agentctx.tokens import MessageCounter

    state = ViewState(MessageCounter())
    state.append(raw)
    before = list(state.view)
    state.ledger.add(ReplaceResult(anchor(raw, 50), (TextBlock("[cut]"),), "test"), raw)
    state.refresh()
    assert all(a is b for a, b in zip(state.view[:49], before[:49], strict=True))
    assert text_of(state.view[50].content) == "[cut]"
    assert fingerprints(state.view) == fingerprints(render(raw, state.ledger).messages)


def _summed_anew(state: ViewState) -> int:
    """The view's tokens from its messages' estimates, summed from nothing."""
    counter = state._counter
    vectors = [counter.vector(m) for m in state.view]
    return counter.total([sum(column) for column in zip(*vectors, strict=True)])


class _FailingStore(SQLiteRecallStore):
    """SQLite failing a third of its calls (seeded): writes are retried, reads answer that
    the store is down, and a new worker may find no ledger, or an older one."""

    def __init__(self, path: Path, seed: int) -> None:
        super().__init__(path)
        self._fails = random.Random(seed)

    def _maybe_fail(self) -> None:
        if self._fails.random() < 1 / 3:
            raise StoreError("the store is down")

    def put_many(self, session_id: str, contents: Sequence[str]) -> list[str]:
        self._maybe_fail()
        return super().put_many(session_id, contents)

    def get(self, session_id: str, rid: str) -> str | None:
        self._maybe_fail()
        return super().get(session_id, rid)

    def load_ledger(self, session_id: str) -> str | None:
        self._maybe_fail()
        return super().load_ledger(session_id)

    def save_ledger(self, session_id: str, ledger_json: str) -> None:
        self._maybe_fail()
        super().save_ledger(session_id, ledger_json)


async def _drive_hostile(
    steps: list[Step],
    strategy: str,
    recall: RecallStore | None,
    owned: bool,
    window: int,
    guarded: bool = True,
) -> None:
    """Run ``steps`` through one session, checking every view; ``guarded``: each call under
    an alarm (the main thread's, one at a time: sessions run side by side go unguarded)."""
    budget = Budget(context_window=window, reserve_output=500)

    def within() -> AbstractContextManager[None]:
        return returns_within(5) if guarded else nullcontext()

    events: list[Event] = []
    history: list[Message] = []
    previous: list[str] = []
    reported: set[str] = set()
    todo = list(steps)
    while todo:
        async with ContextManager(
            budget,
            strategy=_strategy(strategy),
            recall=recall,
            on_over_budget="send",
            session_id="h",
        ) as ctx:
            ctx.subscribe(events.append)
            reported.clear()  # a new worker reports what it repairs anew
            while todo:
                step = todo.pop(0)
                before = list(ctx.raw)
                # What prepare() compares of a projection-mode history (O(view)): the
                # messages the view shows as they are, what repair left out, and the last one.
                state = ctx._state
                left_out = {r.origin for r in state.repairs if r.kind in LEFT_OUT}
                checked = {*state.shown, *left_out, len(before) - 1}
                history = _apply(history, step)
                appended = step.cut is None and step.edit is None
                snapshot = fingerprints(history)
                unseen = not owned and _edited_only_at(before, history, checked)
                version = ctx.ledger.version
                seen = len(events)
                with within():
                    view = await ctx.prepare(history)
                assert fingerprints(history) == snapshot  # the input is never mutated
                if unseen:  # an edit of what a decision replaced: documented as not seen
                    assert list(ctx.raw) == [*before, *history[len(before) :]]
                elif not owned:  # the caller's history is the raw history
                    assert fingerprints(list(ctx.raw)) == snapshot
                assert_view_ok(view, ctx.raw)  # every invariant and provider rule
                assert wire_problems(view) == []
                current = fingerprints(view)
                decided = ctx.ledger.version
                with within():
                    again = await ctx.prepare(view if owned else history)
                if ctx.ledger.version == decided:  # no briefing landed in between
                    assert fingerprints(again) == current
                restored = render(ctx.raw, Ledger.from_json(ctx.ledger.to_json()))
                assert fingerprints(restored.messages) == fingerprints(again)
                # A new worker renders what the last one sent, unless the store it resumed
                # from failed (no ledger, or an older one).
                exact = not (isinstance(recall, _FailingStore) and len(before) == 0)
                if appended and ctx.ledger.version == version and exact:
                    assert current[: len(previous)] == previous
                if ctx.prompt_tokens > budget.limit:
                    assert any(isinstance(e, BudgetExceeded) for e in events[seen:])
                if not appended:
                    reported.clear()  # a rewind may bring back what was reported before it
                for e in events[seen:]:
                    if isinstance(e, TranscriptRepaired):
                        assert not reported & set(e.repairs)  # each repair is reported once
                        reported.update(e.repairs)
                previous = fingerprints(again)
                history = list(again) if owned else history
                if step.report is not None:
                    ctx.observe(Usage(int(ctx.prompt_tokens * step.report), 10))
                for _ in range(3):  # the model call: background work (a briefing) may land
                    await anyio.lowlevel.checkpoint()
                # The view's kept sums, through calibrations and refined estimates, are what
                # summing its messages' estimates anew gives.
                assert abs(ctx._state.tokens - _summed_anew(ctx._state)) <= 1
                if step.restart and not owned and isinstance(recall, LedgerStore):
                    break  # the session goes on in another worker, from the saved ledger
