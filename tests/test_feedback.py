"""Feedback a user sees without configuring logging: compaction that rewrites the cached
prefix call after call is warned about once, with the setting to change."""

from __future__ import annotations

from agentctx import CompactionWarning, ContextManager, Event, TextBlock, ToolResultMessage
from agentctx.ledger import ReplaceResult, anchor
from agentctx.messages import Message
from agentctx.strategy import CompactionContext
from agentctx.tokens import MessageCounter

from .helpers import tool_turn, user


class MaskOneMore:
    """The peers' costly habit: every call, clear one more old tool result."""

    async def compact(self, ctx: CompactionContext) -> None:
        for i, m in enumerate(ctx.raw[: ctx.sent]):  # already sent, so cached
            if isinstance(m, ToolResultMessage) and not ctx.ledger.decisions_at(i):
                ctx.take(ReplaceResult(anchor(ctx.raw, i), (TextBlock("[cleared]"),), "mask"))
                return


def thrash_warnings(events: list[Event]) -> list[CompactionWarning]:
    return [e for e in events if isinstance(e, CompactionWarning) and e.code == "thrash"]


async def test_rewriting_the_cached_prefix_call_after_call_is_warned_once() -> None:
    events: list[Event] = []
    clock = iter(range(0, 10_000, 10))  # 10 s between calls: the cache stays warm
    async with ContextManager(
        1_000_000, strategy=MaskOneMore(), clock=lambda: float(next(clock))
    ) as ctx:
        ctx.subscribe(events.append)
        history: list[Message] = [user("the task")]
        for n in range(8):
            history += tool_turn(n, lines=5)
            await ctx.prepare(history)
    warnings = thrash_warnings(events)
    assert len(warnings) == 1  # once per streak
    assert "3 of the last 6 calls" in warnings[0].message
    assert "target_ratio" in warnings[0].message


class MaskOneMoreEvery:
    """`MaskOneMore` on every ``k``-th call of `prepare` only (once in it)."""

    def __init__(self, k: int) -> None:
        self.k, self.calls = k, 0
        self.seen: CompactionContext | None = None

    async def compact(self, ctx: CompactionContext) -> None:
        if ctx is self.seen:
            return  # the call's fixed-point round
        self.seen, self.calls = ctx, self.calls + 1
        if self.calls % self.k == 0:
            await MaskOneMore().compact(ctx)


async def _warned(k: int, calls: int) -> int:
    events: list[Event] = []
    clock = iter(range(0, 10_000, 10))
    strategy = MaskOneMoreEvery(k)
    async with ContextManager(
        1_000_000, strategy=strategy, clock=lambda: float(next(clock))
    ) as ctx:
        ctx.subscribe(events.append)
        history: list[Message] = [user("the task")]
        for n in range(calls):
            history += tool_turn(n, lines=5)
            await ctx.prepare(history)
    return len(thrash_warnings(events))


async def test_rewriting_every_other_call_is_warned_and_now_and_then_is_not() -> None:
    # Found by hostile run DV: a session cutting each huge new result (no rewrite) and
    # rewriting the cached prefix on every other call was never warned: a call between two
    # rewrites ended the streak.
    assert await _warned(2, 14) == 1
    assert await _warned(4, 40) == 0


async def test_rewrites_after_the_cache_went_cold_are_no_thrash() -> None:
    events: list[Event] = []
    clock = iter(range(0, 100_000, 600))  # 10 minutes between calls: nothing cached
    async with ContextManager(
        1_000_000, strategy=MaskOneMore(), clock=lambda: float(next(clock))
    ) as ctx:
        ctx.subscribe(events.append)
        history: list[Message] = [user("the task")]
        for n in range(8):
            history += tool_turn(n, lines=5)
            await ctx.prepare(history)
    assert thrash_warnings(events) == []


async def test_a_strategy_reads_the_prompt_size_its_decision_left() -> None:
    # A custom strategy that takes a decision and reads ctx.prompt_tokens at once (without
    # reading ctx.view first) must see the view as it now renders, not the one before.
    seen: list[tuple[int, int]] = []

    class ClearOneAndMeasure:
        async def compact(self, ctx: CompactionContext) -> None:
            if seen:
                return
            before = ctx.prompt_tokens
            for i, m in enumerate(ctx.raw):
                if isinstance(m, ToolResultMessage):
                    ctx.take(ReplaceResult(anchor(ctx.raw, i), (TextBlock("[cleared]"),), "x"))
                    seen.append((before, ctx.prompt_tokens))
                    return

    # Full counts from the start: the prepare counts what a round of decisions put in the
    # view in full when the round ends, which would move a quick first count the strategy read.
    counter = MessageCounter(lazy=False)
    async with ContextManager(1_000_000, strategy=ClearOneAndMeasure(), counter=counter) as ctx:
        history: list[Message] = [user("the task"), *tool_turn(0, lines=400), user("go on")]
        await ctx.prepare(history)
        ((before, after),) = seen
        assert after < before
        assert after == ctx.prompt_tokens
