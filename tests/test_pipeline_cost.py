"""What `ToolOutputPipeline` leaves undone on calls that take no decision, and that leaving it
undone changes nothing: the same session sends the same views, counts the same tokens and
takes the same decisions with each saving switched off."""

from __future__ import annotations

import random
import re
from typing import TYPE_CHECKING, Any

import anyio.lowlevel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentctx.budget import Budget
from agentctx.manager import ContextManager
from agentctx.messages import (
    AssistantMessage,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from agentctx.recall import MemoryRecallStore
from agentctx.strategies import DeterministicCompaction, ToolOutputPipeline, pipeline_run
from agentctx.strategies import pipeline as pipeline_module
from agentctx.strategies.pipeline import (
    BudgetPass,
    CondensePass,
    EmergencyPass,
    ExpiryPass,
    condense,
)
from agentctx.strategy import Chain
from agentctx.testing import assert_view_ok

from .helpers import returns_within

if TYPE_CHECKING:
    from collections.abc import Iterator

WORDS = ("cache", "parser", "token", "budget", "stream", "index", "query", "client")


def steps(seed: int, clock: list[float], turn_every: int = 8) -> Iterator[list[Message]]:
    """An agent loop with heavy-tailed output, a user prompt every ``turn_every`` steps,
    thinking, user shell output and now and then an idle gap long enough to let the prefix
    cache go cold (and, rarely, micro-compaction's)."""
    rng = random.Random(seed)
    yield [UserMessage.of("Task: make src/cache/core.py twice as fast.")]
    n = 0
    while True:
        n += 1
        gap = rng.choice((3, 7, 15)) if rng.random() > 0.03 else rng.choice((400, 4000))
        clock[0] += gap
        stamp = {"timestamp": int(clock[0] * 1000)}
        if n % turn_every == 0:
            text = " ".join(rng.choice(WORDS) for _ in range(10))
            prompt: Message = UserMessage((TextBlock(f"Next: {text}"),), stamp)
            if rng.random() < 0.3:
                shell = "\n".join(f"$ make {i}: ok {text}" for i in range(rng.randint(50, 400)))
                prompt = UserMessage((TextBlock(shell),), {**stamp, "source": "bash_execution"})
            yield [AssistantMessage((TextBlock(f"Done: {text}."),), "stop", extra=stamp), prompt]
            continue
        lines = min(600, max(1, int(rng.paretovariate(1.2) * 8)))
        path = f"src/{rng.choice(WORDS)}/f{n}.py"
        out = "\n".join(
            f"def f{i}(x):" if i % 11 == 0 else f"{path}:{i}: v = compute({i}, {n})"
            for i in range(lines)
        )
        args: dict[str, Any] = {"path": path}
        if rng.random() < 0.1:
            args = {"command": f"cat > {path} << EOF\n" + "x = 1\n" * 300 + "EOF"}
        blocks: list[Any] = [ThinkingBlock(f"plan {n} " * 40, "sig")] if n % 5 == 0 else []
        blocks.append(ToolCall(f"c{n}", "bash" if "command" in args else "read", args))
        yield [
            AssistantMessage(tuple(blocks), "tool_use", extra=stamp),
            ToolResultMessage(f"c{n}", (TextBlock(out),), "read", False, stamp),
        ]


async def session(
    strategy: Any,
    *,
    calls: int,
    window: int,
    rewind_at: int | None,
    observe: bool,
    turn_every: int = 8,
) -> list[tuple[Any, ...]]:
    """Per call: the view sent, its tokens, the decisions so far and what recall holds.
    Without usage reports (``observe``) estimates stay quick until something counts them in
    full, as the passes do with what they propose to replace."""
    clock = [1_700_000_000.0]
    store = MemoryRecallStore()
    trace: list[tuple[Any, ...]] = []
    budget = Budget(context_window=window, reserve_output=1_000)
    async with ContextManager(
        budget,
        strategy=strategy,
        recall=store,
        clock=lambda: clock[0],
        session_id="s",
        on_over_budget="send",
    ) as ctx:
        source = steps(1, clock, turn_every)
        history: list[Message] = []
        for k in range(calls):
            if k == rewind_at:
                del history[len(history) // 2 :]  # the user rewinds: later decisions go
            history += next(source)
            view = await ctx.prepare(history)
            assert_view_ok(view, ctx.raw)
            trace.append((view, ctx.prompt_tokens, ctx.ledger.decisions, store.bytes_held))
            if not observe:
                continue
            await anyio.lowlevel.checkpoint()
            # A report a little off the estimate: calibration moves on every call.
            ctx.observe(Usage(int(ctx.prompt_tokens * (1.02 + 0.05 * (k % 3))), 100))
            await anyio.lowlevel.checkpoint()
    return trace


# Each with a rewind after the savings have worked for a while or without, with usage
# reports or without, and the saving it exercises most.
SHORT = ExpiryPass(expire_seconds=60)  # results are due for expiry a few calls after they came
CASES: list[tuple[Any, int, int | None, bool, str]] = [
    (Chain([ToolOutputPipeline(), DeterministicCompaction()]), 12_000, 150, True, "l2"),
    (ToolOutputPipeline(fallback=None), 12_000, None, True, "l2"),
    (ToolOutputPipeline(clear_at_least=3_000, target_ratio=None), 12_000, 120, True, "l2"),
    (ToolOutputPipeline(l2=EmergencyPass(usage_fraction=0.5)), 12_000, 150, False, "l2"),
    (
        Chain([ToolOutputPipeline(l0=SHORT, clear_at_least=10**9), DeterministicCompaction()]),
        12_000,
        150,
        False,
        "units",
    ),
    (ToolOutputPipeline(l0=SHORT, clear_at_least=10**9), 12_000, None, False, "units"),
    (ToolOutputPipeline(l0=SHORT, clear_at_least=8_000), 30_000, 150, True, "units"),
    # L1's units reused, with no expiry to claim their results first
    (
        ToolOutputPipeline(l0=None, l1=CondensePass(threshold_chars=2_000), clear_at_least=10**9),
        12_000,
        150,
        False,
        "l1",
    ),
    # far under the threshold: user turns skip the passes too (no stale batch can pay)
    (ToolOutputPipeline(l0=SHORT), 400_000, 150, True, "user turns"),
    # over it, a batch that can pay and does not yet: skipped while nothing comes of age
    (ToolOutputPipeline(), 80_000, 150, True, "steady"),
]


@pytest.mark.parametrize("case", range(len(CASES)))
async def test_the_savings_change_nothing_sent(case: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """L2 deferred on calls that cannot take it, and expiries, condensed results and thinking
    drops reused from an earlier call: the same session with these switched off sends the
    same."""
    strategy, window, rewind_at, observe, saving = CASES[case]
    deferred: list[bool] = []
    reused: list[bool] = []
    thinking: list[bool] = []
    defer, reuse = pipeline_run.Run._defer_l2, pipeline_run.Run._reuse_unit
    get = pipeline_run.Memo.get

    def deferring(run: pipeline_run.Run, picks: list[int]) -> bool:
        deferred.append(defer(run, picks))
        return deferred[-1]

    def reusing(run: pipeline_run.Run, key: tuple[Any, ...], m: Any, i: int) -> bool:
        reused.append(reuse(run, key, m, i))
        return reused[-1]

    def getting(memo: pipeline_run.Memo, key: tuple[Any, ...], m: Any) -> Any:
        found = get(memo, key, m)
        if key[0] == "thinking":
            thinking.append(found is not None)
        return found

    monkeypatch.setattr(pipeline_run.Run, "_defer_l2", deferring)
    monkeypatch.setattr(pipeline_run.Run, "_reuse_unit", reusing)
    monkeypatch.setattr(pipeline_run.Memo, "get", getting)
    # Every call runs the passes here: skipping them where nothing can be taken is a saving
    # of its own (tests/test_pipeline.py), and would leave these two less to do.
    monkeypatch.setattr(pipeline_module, "nothing_to_take", lambda *_: False)
    kept = await session(strategy, calls=200, window=window, rewind_at=rewind_at, observe=observe)
    assert sum(deferred if saving == "l2" else reused) > 10  # the saving is exercised
    if saving != "l1":  # L0 runs: its thinking drops wait for a batch too
        assert sum(thinking) > 10
    monkeypatch.setattr(pipeline_run.Run, "_defer_l2", lambda *_: False)
    monkeypatch.setattr(pipeline_run.Run, "_reuse_unit", lambda *_: False)
    monkeypatch.setattr(
        pipeline_run.Memo,
        "get",
        lambda memo, key, m: None if key[0] == "thinking" else get(memo, key, m),
    )
    plain = await session(strategy, calls=200, window=window, rewind_at=rewind_at, observe=observe)
    assert len(kept[-1][2]) > 10
    for k, (a, b) in enumerate(zip(kept, plain, strict=True)):
        assert a == b, f"call {k}"


async def test_near_the_budget_a_call_that_takes_nothing_builds_no_l2_placeholder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Over L2's usage fraction every result outside the protected turns is due; building,
    # hashing and counting each one's placeholder on every call was most of the slow calls.
    expired: list[str] = []
    due: list[int] = []
    expire, picks_of = pipeline_run.Run._expire, pipeline_run.Run._l2_picks

    def counting(run: pipeline_run.Run, j: int, kind: str, reason: str, **kw: Any) -> None:
        expired.append(reason)
        expire(run, j, kind, reason, **kw)

    def picking(run: pipeline_run.Run, cfg: Any) -> list[int]:
        picks = picks_of(run, cfg)
        due.append(len(picks))
        return picks

    monkeypatch.setattr(pipeline_run.Run, "_expire", counting)
    monkeypatch.setattr(pipeline_run.Run, "_l2_picks", picking)
    idle_near_budget = 0
    clock = [1_700_000_000.0]
    # A stale batch never pays here, and L2 is due for long stretches.
    cfg = ToolOutputPipeline(clear_at_least=10**9, l2=EmergencyPass(usage_fraction=0.5))
    budget = Budget(context_window=40_000, reserve_output=1_000)
    async with ContextManager(
        budget, strategy=cfg, clock=lambda: clock[0], on_over_budget="send"
    ) as ctx:
        source = steps(2, clock)
        history: list[Message] = []
        for _ in range(400):
            history += next(source)
            version = ctx.ledger.version
            expired.clear()
            due.clear()
            await ctx.prepare(history)
            if due and due[0] > 3 and ctx.ledger.version == version:
                idle_near_budget += 1  # L2 was due on several results, and nothing was taken
                assert "l2" not in expired
    assert idle_near_budget > 5


# -- L1's condensing, one regex pass over the text instead of a search per line ---------------

_PER_LINE = re.compile(
    r"^\s*(import|export)\s|\b(function|class|interface|type|const|let|var|def)\s+\w"
)


def condense_per_line(text: str, head: int, tail: int, max_ratio: float) -> str:
    """`condense` as it was: a search per line (the reference it must agree with)."""
    lines = text.split("\n")
    if len(lines) > head + tail:
        out = lines[:head]
        omitted = 0
        for line in lines[head : len(lines) - tail]:
            if _PER_LINE.search(line):
                if omitted:
                    out.append(f"[... {omitted} lines omitted]")
                    omitted = 0
                out.append(line)
            else:
                omitted += 1
        if omitted:
            out.append(f"[... {omitted} lines omitted]")
        out.extend(lines[len(lines) - tail :])
        condensed = "\n".join(out)
        if len(condensed) <= max_ratio * len(text):
            return condensed
    return text[: int(max_ratio * len(text))] + "\n[... truncated for space]"


# Lines a per-line search and a whole-text one could disagree on: keywords at a line's end
# or start, whitespace other than a space next to a newline, several definitions in a line.
FRAGMENTS = (
    "import",
    "export",
    "import x",
    " import\t",
    "class",
    "class ",
    "class X",
    "def",
    "def f(x):",
    "xdef y",
    "const",
    "let",
    "var v",
    "type T",
    "function",
    "interface I",
    "\r",
    "\t",
    "\x0b",
    "\x0c",
    "\u2028",
    "\u00a0",
    " ",
    "x",
    "é",
    "_",
    "1",
    "(",
    "=",
    "\n",
    "\n",
    "xdef class A",
    "imports",
    "typeclass ",
    "le",
    "t v",
    "\n",
    "\n\n",
    "\nimport",
    "class\n",
    "def\n f",
    "import\n",
    "\r\n",
)


@given(
    st.lists(st.sampled_from(FRAGMENTS), max_size=80),
    st.integers(0, 4),
    st.integers(0, 4),
    st.sampled_from((0.0, 0.2, 0.4, 0.7, 1.0)),
)
@settings(max_examples=1500, deadline=None)
def test_condense_finds_the_lines_a_per_line_search_finds(
    parts: list[str], head: int, tail: int, ratio: float
) -> None:
    text = "".join(parts)
    assert condense(text, head, tail, ratio) == condense_per_line(text, head, tail, ratio)


def test_condense_agrees_on_long_code() -> None:
    rng = random.Random(3)
    for _ in range(200):
        lines = [
            rng.choice(("", "  ", "\t")) + rng.choice(FRAGMENTS) + rng.choice(FRAGMENTS)
            for _ in range(rng.randint(0, 400))
        ]
        text = "\n".join(lines)
        for head, tail, ratio in ((10, 5, 0.4), (0, 0, 1.0), (3, 0, 0.9), (0, 7, 0.6)):
            assert condense(text, head, tail, ratio) == condense_per_line(text, head, tail, ratio)


async def test_an_expiry_kept_from_the_in_flight_loop_gets_its_arguments_cleared_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A result due while its call is in the in-flight loop keeps its call's arguments; once
    a user message ends that loop they are cleared with it: the expiry proposed on the
    earlier call is not reused as it was."""

    async def run() -> list[Message]:
        clock = [1_700_000_000.0]

        def at(seconds: float) -> dict[str, Any]:
            clock[0] += seconds
            return {"timestamp": int(clock[0] * 1000)}

        command = "cat > src/x.py << EOF\n" + "x = 1\n" * 400 + "EOF"
        call = ToolCall("c1", "bash", {"command": command})
        history: list[Message] = [UserMessage((TextBlock("task"),), at(0))]
        history += [
            AssistantMessage((call,), "tool_use", extra=at(1)),
            ToolResultMessage("c1", (TextBlock("ok\n" * 300),), "bash", False, at(1)),
        ]
        now = ToolOutputPipeline(
            l0=ExpiryPass(expire_seconds=60, protect_recent_turns=0, keep_recent=0),
            clear_at_least=10**9,  # nothing stale is taken until the cache is cold
        )
        async with ContextManager(
            BIG, strategy=now, clock=lambda: clock[0], recall=MemoryRecallStore(), session_id="s"
        ) as ctx:
            await ctx.prepare(history)
            clock[0] += 120  # c1's result is due, its call still in flight
            history += [AssistantMessage((ToolCall("c2", "read", {"path": "a"}),), "tool_use")]
            history += [ToolResultMessage("c2", (TextBlock("a"),), "read", False, at(0))]
            await ctx.prepare(history)
            assert len(ctx.ledger) == 0
            history += [AssistantMessage.of("done"), UserMessage((TextBlock("next"),), at(10))]
            await ctx.prepare(history)  # the loop is over: the arguments may go too
            assert len(ctx.ledger) == 0
            clock[0] += 600  # a cold cache: every due proposal is taken
            return await ctx.prepare([*history, UserMessage((TextBlock("again"),), at(0))])

    kept = await run()
    monkeypatch.setattr(pipeline_run.Run, "_reuse_unit", lambda *_: False)
    assert kept == await run()
    cleared = kept[1]
    assert isinstance(cleared, AssistantMessage) and "[cleared" in str(cleared.tool_calls[0])


BIG = Budget(context_window=2_000_000, reserve_output=1_000)


@pytest.mark.parametrize("case", range(len(CASES)))
async def test_skipping_the_passes_changes_nothing_sent(
    case: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call that `nothing_to_take` lets skip the passes: the same session with every call
    running them sends the same, takes the same decisions and stores the same, in every
    configuration above (an emergency fraction at half the budget, batches that never pay,
    results due a minute after they came)."""
    strategy, window, rewind_at, observe, saving = CASES[case]
    real = pipeline_module.nothing_to_take
    skipped: list[bool] = []
    steady: list[bool] = []  # skipped over the threshold, a batch able to pay

    def counted(cfg: Any, ctx: Any, memo: Any) -> bool:
        skipped.append(real(cfg, ctx, memo))
        over = ctx.prompt_tokens >= cfg.batch_threshold(ctx.budget.limit)
        steady.append(skipped[-1] and over and not memo.unpaying)
        return skipped[-1]

    monkeypatch.setattr(pipeline_module, "nothing_to_take", counted)
    kept = await session(strategy, calls=200, window=window, rewind_at=rewind_at, observe=observe)
    monkeypatch.setattr(pipeline_module, "nothing_to_take", lambda *_: False)
    plain = await session(strategy, calls=200, window=window, rewind_at=rewind_at, observe=observe)
    assert sum(skipped) > 10
    if saving == "steady":
        # (five at least: compactions that land deeper leave fewer calls over the threshold)
        assert sum(steady) >= 5
    for k, (a, b) in enumerate(zip(kept, plain, strict=True)):
        assert a == b, f"call {k}"


@pytest.mark.parametrize("word", ["xdef ", "ximport ", "  import x; import "])
def test_condense_reads_one_long_line_of_keywords_once(word: str) -> None:
    # Found by the hostile run: each keyword on a line counted the line's newlines and read
    # its indentation from the line's start again: 2 MB of "xdef " on one line took 123 s.
    text = "head\n" * 5 + word * 200_000 + "\n" + "tail\n" * 5
    with returns_within(5):
        condensed = condense(text, 3, 3, 0.9)
    assert condensed == condense_per_line(text, 3, 3, 0.9)


async def test_a_call_in_the_tool_loop_reads_only_what_is_new_with_thinking_in_the_history() -> (
    None
):
    """Found by the hostile run: whether the messages outside the newest turn carry their
    full estimates was read again over every step with thinking, on every call: a call
    that takes nothing cost O(history) (1.4 ms at 27k messages, growing). Each list is now
    read from where it last held. Work is counted as the pipeline's lines run (a trace),
    not timed."""
    import sys
    from types import FrameType

    lines = [0]

    def trace(frame: FrameType, event: str, arg: object) -> Any:
        if frame.f_code.co_filename != pipeline_run.__file__:
            return None
        if event == "line":
            lines[0] += 1
        return trace

    async def lines_of_the_last_call(turns: int) -> int:
        clock = [0.0]
        history: list[Message] = [UserMessage.of("the task")]
        async with ContextManager(
            BIG, strategy=ToolOutputPipeline(), clock=lambda: clock[0]
        ) as ctx:
            n = 0
            for t in range(turns + 1):
                for _ in range(6):
                    n += 1
                    thought = ThinkingBlock(f"thought {n}", f"sig{n}")
                    history += [
                        AssistantMessage((thought, ToolCall(f"c{n}", "bash", {"cmd": "ls"}))),
                        ToolResultMessage.of(f"c{n}", f"out {n}"),
                    ]
                    clock[0] += 1
                    lines[0] = 0
                    previous = sys.gettrace()
                    sys.settrace(trace)
                    try:
                        await ctx.prepare(history)
                    finally:
                        sys.settrace(previous)
                    ctx.observe(Usage(input_tokens=ctx.prompt_tokens))
                    await anyio.lowlevel.checkpoint()
                history += [AssistantMessage.of(f"answer {t}"), UserMessage.of(f"next {t}")]
                await ctx.prepare(history)  # a user turn: skipped as well (the next test)
                ctx.observe(Usage(input_tokens=ctx.prompt_tokens))
                await anyio.lowlevel.checkpoint()
            assert not ctx.ledger.decisions
        return lines[0]

    # What a skipped call leaves unread is read by the first one past a few dozen messages:
    # the last call reads at most that many more, however long the session (8,495 lines at
    # 200 turns, 935 at 20, when nothing read them between runs).
    short, long = await lines_of_the_last_call(20), await lines_of_the_last_call(200)
    assert long <= short + 6 * pipeline_run._UNREAD_AT_MOST


async def test_far_under_the_threshold_a_user_turn_skips_the_passes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by the hostile run: every user turn ran the passes, which proposed an expiry for
    every old result again (none can pay while the prompt is under the batch threshold):
    38 ms a turn at 3,500 results. Under the threshold, with nothing unsent for a pass to
    take and what the ended turn holds sized in full, most user turns skip them too
    (`test_skipping_the_passes_changes_nothing_sent` checks that this changes nothing)."""
    runs: list[int] = []
    init = pipeline_run.Run.__init__

    def counted(run: pipeline_run.Run, *args: Any) -> None:
        runs.append(len(args[1].view))
        init(run, *args)

    monkeypatch.setattr(pipeline_run.Run, "__init__", counted)
    clock = [1_700_000_000.0]
    source = steps(1, clock)
    history: list[Message] = []
    user_turns = skipped = 0
    async with ContextManager(
        Budget(context_window=400_000, reserve_output=1_000),
        strategy=ToolOutputPipeline(l0=SHORT),
        clock=lambda: clock[0],
    ) as ctx:
        for _ in range(200):
            new = next(source)
            history += new
            before = len(runs)
            await ctx.prepare(history)
            if any(isinstance(m, UserMessage) for m in new):
                user_turns += 1
                skipped += len(runs) == before
            ctx.observe(Usage(ctx.prompt_tokens, 100))
            await anyio.lowlevel.checkpoint()
        assert ctx.prompt_tokens < 100_000  # under the batch threshold all along
    assert user_turns > 20 and skipped > user_turns // 2  # 17 of 25; 0 before


@pytest.mark.parametrize("case", ["results age", "thinking ages", "pushed out"])
async def test_over_the_threshold_the_tool_loop_skips_the_passes_until_a_batch_can_pay(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over the batch threshold, with a stale batch able to pay and not paying yet, every
    call of the tool loop ran the passes (half the calls of the pi sessions, 0.1-0.2 ms
    each). Between runs only time (L0's ages) or a new result (pushing an old one out of
    L0's newest ``keep_recent``) can add to the batch: calls skip until one does, and take
    the batch on the same call as running every pass would. The first turn's results (or
    the thinking of its steps) come of age during the third turn's tool loop, or are due at
    its start and kept only as the newest results, until the loop's push them out."""
    thinking = case == "thinking ages"
    gap = 400.0 if case == "pushed out" else 10.0
    strategy = ToolOutputPipeline(
        l0=ExpiryPass(expire_seconds=10**6 if thinking else 300),
        l1=None,
        l2=None,
        clear_at_least=6_000,
        fallback=None,
    )
    big = "\n".join(f"src/core/f{i}.py:{i}: value = compute({i})" for i in range(160))

    def history_of(t0: float) -> list[tuple[float, list[Message]]]:
        out: list[tuple[float, list[Message]]] = []
        t = t0

        def step(k: int, text: str) -> list[Message]:
            stamp = {"timestamp": int(t * 1000)}
            call = ToolCall(f"c{k}", "read", {"path": f"f{k}"})
            plan = (ThinkingBlock(f"plan {k} " * 800, "sig"),) if thinking and k < 6 else ()
            return [
                AssistantMessage((*plan, call), extra=stamp),
                ToolResultMessage(f"c{k}", (TextBlock(text),), "read", False, stamp),
            ]

        out.append((t, [UserMessage.of("Task: speed up src/core.")]))
        for k in range(6):
            t += 1
            out.append((t, step(k, f"{k} {big}" if not thinking else f"{k} ok")))
        t += gap
        out.append((t, [UserMessage.of("Next: the parser.")]))
        t += 1
        out.append((t, [UserMessage.of("Next: the cache.")]))
        for k in range(6, 66):
            t += 10
            out.append((t, step(k, f"ok {k}")))
        return out

    real = pipeline_module.nothing_to_take

    async def run(skipping: bool) -> tuple[list[Any], int, list[int]]:
        steady: list[bool] = []

        def counted(cfg: Any, ctx: Any, memo: Any) -> bool:
            skip = real(cfg, ctx, memo) if skipping else False
            over = ctx.prompt_tokens >= cfg.batch_threshold(ctx.budget.limit)
            steady.append(skip and over and not memo.unpaying)
            return skip

        monkeypatch.setattr(pipeline_module, "nothing_to_take", counted)
        clock = [1_700_000_000.0]
        sent: list[Any] = []
        taken_at: list[int] = []
        history: list[Message] = []
        async with ContextManager(
            Budget(context_window=40_000, reserve_output=1_000),
            strategy=strategy,
            clock=lambda: clock[0],
            on_over_budget="send",
        ) as ctx:
            for k, (t, new) in enumerate(history_of(clock[0])):
                clock[0] = t
                history += new
                before = len(ctx.ledger)
                view = await ctx.prepare(history)
                assert_view_ok(view, ctx.raw)
                sent.append(view)
                if len(ctx.ledger) > before:
                    taken_at.append(k)
                ctx.observe(Usage(ctx.prompt_tokens, 100))
                await anyio.lowlevel.checkpoint()
        return sent, sum(steady), taken_at

    every, _, taken = await run(skipping=False)
    skipped, steady, taken_skipping = await run(skipping=True)
    assert taken == taken_skipping
    # The batch is taken inside the third turn's loop, not on a user turn.
    assert len(taken) == 1 and 9 < taken[0] < 60
    if gap < 300:
        assert steady > 20  # the loop's calls until the results come of age
    for k, (a, b) in enumerate(zip(every, skipped, strict=True)):
        assert a == b, f"call {k}"


async def test_a_result_arriving_for_a_stub_is_sized_on_the_call_it_arrives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A skipped call keeps what it found after the scan for the next one (`_unread`). A
    batch answered one result per call shows a stub for each result still to come, which
    the next call's view replaces: what was kept about the stub must not stand for the
    result. Here the last result passes the budget pass's cap for the turn, on the call it
    arrives, as it does when every call runs the passes."""
    strategy = ToolOutputPipeline(budget=BudgetPass(max_chars_per_turn=20_000))
    real = pipeline_module.nothing_to_take

    async def run(skipping: bool) -> tuple[list[Any], int]:
        skipped = 0

        def counted(*args: Any) -> bool:
            nonlocal skipped
            skip = real(*args) if skipping else False
            skipped += skip
            return skip

        monkeypatch.setattr(pipeline_module, "nothing_to_take", counted)
        sent: list[Any] = []
        history: list[Message] = [UserMessage.of("Task: read the three files.")]
        ids = [f"c{k}" for k in range(3)]
        batch = AssistantMessage(tuple(ToolCall(i, "read", {"path": f"{i}.py"}) for i in ids))
        sizes = (3_000, 3_000, 30_000)
        clock = [1_700_000_000.0]
        async with ContextManager(
            Budget(context_window=200_000, reserve_output=1_000),
            strategy=strategy,
            clock=lambda: clock[0],
        ) as ctx:
            for k in range(4):
                history += [AssistantMessage((TextBlock(f"step {k}"),)), UserMessage.of("go on")]
                sent.append(await ctx.prepare(history))
                ctx.observe(Usage(ctx.prompt_tokens, 10))
                clock[0] += 5
            history.append(batch)
            for i, size in zip(ids, sizes, strict=True):
                history.append(ToolResultMessage(i, (TextBlock("x\n" * (size // 2)),), "read"))
                view = await ctx.prepare(history)
                assert_view_ok(view, ctx.raw)
                sent.append(view)
                ctx.observe(Usage(ctx.prompt_tokens, 10))
                clock[0] += 5
        return sent, skipped

    every, _ = await run(skipping=False)
    kept, skipped = await run(skipping=True)
    assert skipped >= 2  # the calls before the last result
    assert any("Persisted output" in str(m) for m in every[-1])  # the cap took the big one
    for k, (a, b) in enumerate(zip(every, kept, strict=True)):
        assert a == b, f"call {k}"


async def test_a_call_asking_for_more_output_runs_the_passes_at_its_own_threshold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by a hostile run: what the last run found about paying (no batch can pay, or
    none can until something comes of age) was for its budget's batch threshold. A call
    asking for more output (``max_tokens``) lowers the limit, so the threshold, and a batch
    that did not pay before pays now: the call skipped it. It now runs the passes."""
    strategy = ToolOutputPipeline(
        l0=ExpiryPass(expire_seconds=60, keep_recent=0, protect_recent_turns=1),
        l1=None,
        l2=None,
        budget=None,
        mc=None,
        fallback=None,
    )
    real = pipeline_module.nothing_to_take

    def out(k: str, lines: int) -> str:
        return "\n".join(f"src/{k}.py:{i}: value = compute({i})" for i in range(lines))

    async def run(skipping: bool) -> list[Any]:
        monkeypatch.setattr(
            pipeline_module, "nothing_to_take", real if skipping else (lambda *_: False)
        )
        clock = [1_700_000_000.0]

        def step(k: str, lines: int = 1) -> list[Message]:
            stamp = {"timestamp": int(clock[0] * 1000)}
            return [
                AssistantMessage((ToolCall(k, "read", {"path": k}),), extra=stamp),
                ToolResultMessage(k, (TextBlock(out(k, lines)),), "read", False, stamp),
            ]

        sent = []
        history: list[Message] = [UserMessage.of("Go."), *step("c1", 2000)]
        history += [AssistantMessage((TextBlock("done"),), "stop"), UserMessage.of("Next.")]
        history += step("c2", 1000)
        async with ContextManager(
            Budget(context_window=60_000),
            strategy=strategy,
            clock=lambda: clock[0],
            on_over_budget="send",
        ) as ctx:
            for k, output in enumerate((1_000, 1_000, 10_000)):
                if k:
                    clock[0] += 61 if k == 1 else 0  # c1 comes of age
                    history += step(f"s{k}")
                sent.append((await ctx.prepare(history, max_tokens=output), ctx.ledger.decisions))
                await anyio.lowlevel.checkpoint()
                ctx.observe(Usage(ctx.prompt_tokens, 10))
                await anyio.lowlevel.checkpoint()
        return sent

    every, skipped = await run(skipping=False), await run(skipping=True)
    assert len(every[-1][1]) > len(every[-2][1])  # the lower threshold lets the batch pay
    assert skipped == every
