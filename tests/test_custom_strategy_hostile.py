"""Custom strategies as the attacker: code agentctx does not control, buggy or written
loosely against the docs. Each test is the reproduction of a finding of a hostile run (DL);
each fails on the code before its fix."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from agentctx import (
    AssistantMessage,
    CompactionWarning,
    ContextManager,
    DeterministicCompaction,
    MemoryRecallStore,
    TextBlock,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from agentctx.errors import ConfigError
from agentctx.ledger import Ledger, ReplaceArguments, ReplaceResult, anchor
from agentctx.messages import Message
from agentctx.recall import SQLiteRecallStore
from agentctx.strategy import CompactionContext
from agentctx.testing import check_view


def questions(n: int) -> list[Message]:
    """The task, then n turns of: a question, a read call, its 60-line result, an answer."""
    history: list[Message] = [UserMessage.of("the task: fix the parser")]
    for i in range(n):
        body = "\n".join(f"line {k} of file {i}" for k in range(60))
        history += [
            UserMessage.of(f"question {i}"),
            AssistantMessage((ToolCall(f"r{i}", "read", {"path": f"src/{i}.py"}),), "tool_use"),
            ToolResultMessage(f"r{i}", (TextBlock(body),), "read", False),
            AssistantMessage((TextBlock(f"answer {i}"),), "stop"),
        ]
    return history


async def test_a_failing_background_task_of_a_strategy_does_not_end_the_loop() -> None:
    """DL 1, high: a task a strategy started on ``ctx.tasks`` that raised ended the
    manager's background task group, which cancelled the caller's code inside ``async
    with``: the loop ended in two ExceptionGroups, with no event. It is said
    (`CompactionWarning` ``background_failed``) and the session goes on."""

    class Background:
        async def compact(self, ctx: CompactionContext) -> None:
            async def job() -> None:
                await anyio.sleep(0.01)
                raise ValueError("bug in the strategy's background job")

            if ctx.tasks is not None:
                ctx.tasks.start_soon(job)

    said: list[str] = []
    async with ContextManager(100_000, strategy=Background()) as ctx:
        ctx.subscribe(lambda e: said.append(e.code) if isinstance(e, CompactionWarning) else None)
        for _ in range(3):
            await ctx.prepare(questions(3))
            await anyio.sleep(0.05)  # the model call, which the failure cancelled
    assert said == ["background_failed"] * 3


async def test_nan_in_arguments_a_strategy_takes_is_refused() -> None:
    """DL 2, high: `take` accepted NaN in `ReplaceArguments`, and every later request of the
    session failed with a bare ValueError when encoded."""

    class Rounds:
        async def compact(self, ctx: CompactionContext) -> None:
            ctx.take(ReplaceArguments(anchor(ctx.raw, 2), "r0", {"score": float("nan")}, "mine"))

    async with ContextManager(100_000, strategy=Rounds()) as ctx:
        with pytest.raises(ConfigError, match="JSON cannot hold"):
            await ctx.prepare(questions(1))


async def test_a_decision_taken_after_its_call_ended_is_refused() -> None:
    """DL 3, medium: a strategy that kept its context took a decision between calls; it was
    saved, but this worker never sent it, so a resumed worker sent another view."""

    class KeepsCtx:
        ctx: CompactionContext | None = None

        async def compact(self, ctx: CompactionContext) -> None:
            self.ctx = ctx

    strategy = KeepsCtx()
    async with ContextManager(100_000, strategy=strategy) as ctx:
        await ctx.prepare(questions(3))
        kept = strategy.ctx
        assert kept is not None
        with pytest.raises(ConfigError, match="after its prepare\\(\\) call ended"):
            kept.take(ReplaceResult(anchor(kept.raw, 3), (TextBlock("[cleared]"),), "late"))
        assert len(ctx.ledger) == 0


@pytest.mark.parametrize("returned", ["coroutine", True, "cleared"])
async def test_compact_returning_what_is_no_quiet_is_refused(returned: object) -> None:
    """DL 4, medium: a wrapper that forgot ``await`` returned its inner strategy's coroutine;
    it was read as "not quiet", the budget was not met, and the error blamed the history."""

    class Returns:
        inner = DeterministicCompaction()

        async def compact(self, ctx: CompactionContext) -> Any:
            if returned == "coroutine":
                return self.inner.compact(ctx)
            return returned

    async with ContextManager(100_000, strategy=Returns()) as ctx:
        with pytest.raises(ConfigError, match="an await is missing|returns a Quiet or None"):
            await ctx.prepare(questions(2))


async def test_emitting_what_is_no_event_is_refused() -> None:
    """DL 5, medium: ``ctx.emit("...")`` reached every subscriber as an event, or raised a
    bare AttributeError with debug logging on."""

    class Emits:
        async def compact(self, ctx: CompactionContext) -> None:
            ctx.emit("cleared 3 results")  # type: ignore[arg-type]

    async with ContextManager(100_000, strategy=Emits()) as ctx:
        with pytest.raises(ConfigError, match="takes an event"):
            await ctx.prepare(questions(1))


async def test_a_close_that_raises_an_interrupt_still_closes_the_session(tmp_path: Any) -> None:
    """DL 6, medium: a strategy close() raising KeyboardInterrupt skipped the store's last
    writes (a resumed worker found none of the decisions) and the end of the event
    iterators, and was called a second time. The interrupt leaves once the session closed."""

    class Interrupted:
        async def compact(self, ctx: CompactionContext) -> None:
            if not ctx.ledger.decisions_at(3):
                ctx.take(ReplaceResult(anchor(ctx.raw, 3), (TextBlock("[cleared]"),), "mine"))

        closes = 0

        def close(self, emit: Any) -> None:
            type(self).closes += 1
            raise KeyboardInterrupt

    db = str(tmp_path / "s.db")
    history = questions(3)
    ended = anyio.Event()
    async with ContextManager(
        100_000, strategy=Interrupted(), recall=SQLiteRecallStore(db), session_id="s"
    ) as ctx:

        async def reader() -> None:
            async for _ in ctx.events():
                pass
            ended.set()

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(reader)
            await ctx.prepare(history)
            with pytest.raises(KeyboardInterrupt):
                await ctx.aclose()
            with anyio.fail_after(2):  # the event iterators ended with the session
                await ended.wait()
    assert Interrupted.closes == 1  # the exit of ``async with`` did not close it again
    async with ContextManager(100_000, recall=SQLiteRecallStore(db), session_id="s") as again:
        await again.prepare(history)
        assert len(again.ledger) == 1


async def test_a_decision_taken_again_as_it_is_changes_nothing() -> None:
    """DL 7, low: a strategy taking the same decision on every call grew the ledger by four
    a call (the fixed-point loop) and was warned of thrash, though no byte changed."""

    class Again:
        async def compact(self, ctx: CompactionContext) -> None:
            ctx.take(ReplaceResult(anchor(ctx.raw, 3), (TextBlock("[cleared]"),), "again"))

    said: list[str] = []
    history = questions(3)
    async with ContextManager(100_000, strategy=Again()) as ctx:
        ctx.subscribe(lambda e: said.append(e.code) if isinstance(e, CompactionWarning) else None)
        for k in range(4):
            history = [*history, AssistantMessage.of(f"a{k}"), UserMessage.of(f"q{k}")]
            view = await ctx.prepare(history)
            assert check_view(view, ctx.raw) == []
        assert len(ctx.ledger) == 1
    assert "thrash" not in said


@pytest.mark.parametrize("handed", [{1: "a", "1": "b"}, {True: "yes"}, (1, 2)])
async def test_a_hand_over_json_would_change_is_left_out(handed: object) -> None:
    """DL 8, low: a hand-over with keys that are no strings (or a tuple) was changed on its
    way to the next worker (an entry lost, ``True`` made ``"true"``), not left out."""

    class Hands:
        def __init__(self, state: object = None) -> None:
            self.state, self.got = state, None

        async def compact(self, ctx: CompactionContext) -> None:
            return None

        def hand_over(self) -> object:
            return self.state

        def take_over(self, state: object) -> None:
            self.got = state  # type: ignore[assignment]

    first = ContextManager(100_000, strategy=Hands(handed))
    async with first:
        await first.prepare(questions(1))
        state, ledger = first.session_state(), first.ledger.to_json()
    assert "strategy" not in json.loads(state)
    following = Hands()
    async with ContextManager(
        100_000, strategy=following, ledger=Ledger.from_json(ledger), state=state
    ) as then:
        await then.prepare(questions(1))
    assert following.got is None


@pytest.mark.parametrize("content", [b"\x89PNG raw tool output", 123])
async def test_recall_put_of_what_is_no_text_is_refused(content: object) -> None:
    """DL 9, low: ``ctx.recall.put`` with bytes raised "a bytes-like object is required, not
    'str'", backwards for a call passed bytes."""

    class Keeps:
        async def compact(self, ctx: CompactionContext) -> None:
            assert ctx.recall is not None
            ctx.recall.put(ctx.session_id, content)  # type: ignore[arg-type]

    async with ContextManager(100_000, strategy=Keeps(), recall=MemoryRecallStore()) as ctx:
        with pytest.raises(ConfigError, match="keeps text"):
            await ctx.prepare(questions(1))
