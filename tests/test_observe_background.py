"""`observe` records a usage report; the calibration it needs (a full estimate of what the
request sent that was new) runs in the manager's background work once the caller yields, and
every count read through the manager sees it applied, whenever it ran (issue 10: observe()
cost more than a prepare() that decides nothing)."""

from __future__ import annotations

import logging
from typing import Literal

import anyio
import anyio.lowlevel
import pytest

from agentctx import Budget, ContextManager, MessageCounter, Usage
from agentctx.messages import Message
from agentctx.recall import MemoryRecallStore
from agentctx.testing import assert_view_ok, synthetic_session

Mode = Literal["yield", "no-yield", "outside"]


async def replay(mode: Mode) -> list[tuple[int, int, int, int]]:
    """One seeded session with a usage report after every call; what each call sent."""
    counter = MessageCounter()
    ctx = ContextManager(
        Budget(context_window=24_000, reserve_output=4_000),
        counter=counter,
        recall=MemoryRecallStore(),
        session_id="s",
        clock=lambda: 0.0,
        on_over_budget="send",
    )
    trace = []

    async def run() -> None:
        view: list[Message] = []
        for group in synthetic_session(3, 120, mean_output_lines=40):
            view = await ctx.prepare([*view, *group])
            assert_view_ok(view, ctx.raw)
            # A provider's count: what agentctx estimates plus a system prompt it never saw.
            ctx.observe(Usage(input_tokens=round(1.07 * ctx.prompt_tokens) + 900))
            if mode == "yield":
                await anyio.lowlevel.checkpoint()  # the agent runs its tools
            trace.append((len(view), ctx.prompt_tokens, len(ctx.ledger), counter.observations))

    if mode == "outside":
        await run()
    else:
        async with ctx:
            await run()
    return trace


async def test_when_the_calibration_runs_changes_nothing_sent() -> None:
    applied_in_background = await replay("yield")
    applied_at_the_next_read = await replay("no-yield")
    applied_at_once = await replay("outside")
    assert applied_in_background == applied_at_the_next_read == applied_at_once
    assert applied_at_once[-1][2] > 3  # the session compacted, on calibrated counts
    assert applied_at_once[-1][3] > 10


async def test_observe_estimates_nothing_until_the_caller_yields(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counter = MessageCounter()
    full: list[object] = []
    make_exact = MessageCounter._make_exact
    monkeypatch.setattr(
        MessageCounter,
        "_make_exact",
        lambda self, m, e: (full.append(m), make_exact(self, m, e))[1],
    )
    async with ContextManager(Budget(context_window=50_000), counter=counter) as ctx:
        groups = synthetic_session(0, 3, mean_output_lines=80)
        view = await ctx.prepare([m for g in groups for m in g])
        full.clear()
        ctx.observe(Usage(input_tokens=9_000))
        assert full == [] and counter.observations == 0  # recorded, not applied
        await anyio.lowlevel.checkpoint()
        assert len(full) == len(view) and counter.observations == 1  # applied meanwhile
        ctx.observe(Usage(input_tokens=9_100))
        assert counter.observations == 1
        assert ctx.prompt_tokens > 9_000  # a read through the manager applies it at once
        assert counter.observations == 2
        assert len(full) == len(view)  # nothing new since the last report: nothing estimated


async def test_a_report_that_fails_in_the_background_is_logged_and_work_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    counter = MessageCounter()

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug in calibration")

    async with ContextManager(Budget(context_window=50_000), counter=counter) as ctx:
        groups = synthetic_session(0, 4, mean_output_lines=20)
        view = await ctx.prepare([m for g in groups[:3] for m in g])
        with monkeypatch.context() as patched:
            patched.setattr(counter, "observe", broken)
            with caplog.at_level(logging.ERROR, logger="agentctx"):
                ctx.observe(Usage(input_tokens=5_000))
                await anyio.lowlevel.checkpoint()
        assert "usage report not applied" in caplog.text
        # The background work and the session go on: the next report is applied.
        view = await ctx.prepare([*view, *groups[3]])
        ctx.observe(Usage(input_tokens=5_500))
        await anyio.lowlevel.checkpoint()
        assert counter.observations == 1
        assert_view_ok(view, ctx.raw)


async def test_a_report_belongs_to_the_view_it_was_on_even_when_the_next_call_rewinds() -> None:
    async def session(apply_in_background: bool) -> tuple[int, int, tuple[float, ...]]:
        counter = MessageCounter()
        async with ContextManager(
            Budget(context_window=30_000, reserve_output=4_000),
            counter=counter,
            session_id="s",
            clock=lambda: 0.0,
        ) as ctx:
            groups = synthetic_session(5, 40, mean_output_lines=30)
            history = [m for g in groups[:30] for m in g]
            await ctx.prepare(history)
            ctx.observe(Usage(input_tokens=round(1.1 * ctx.prompt_tokens)))
            if apply_in_background:
                await anyio.lowlevel.checkpoint()
            # The caller rewinds: the report is still the one for the view it sent.
            view = await ctx.prepare(history[: len(history) // 2])
            assert_view_ok(view, ctx.raw)
            return ctx.prompt_tokens, counter.observations, counter.multipliers

    assert await session(apply_in_background=False) == await session(apply_in_background=True)


def test_the_blocking_api_reads_counts_the_loop_thread_calibrates_in_the_background() -> None:
    # The manager lives on a loop thread: observe() returns before the calibration ran there,
    # and a read of the counts from the caller's thread waits for it rather than see half.
    from agentctx.blocking import BlockingContextManager

    groups = synthetic_session(2, 30, mean_output_lines=30)
    seen = []
    for _ in range(2):
        manager = ContextManager(
            Budget(context_window=20_000, reserve_output=4_000), session_id="s", clock=lambda: 0.0
        )
        with BlockingContextManager(manager) as ctx:
            view: list[Message] = []
            trace = []
            for group in groups:
                view = ctx.prepare([*view, *group])
                ctx.observe(Usage(input_tokens=round(1.05 * manager.prompt_tokens) + 700))
                trace.append((manager.prompt_tokens, len(view), manager.counter.observations))
            seen.append(trace)
    assert seen[0] == seen[1]
    assert seen[0][-1][2] > 10  # calibrated on every report (the fit keeps the last 16)
