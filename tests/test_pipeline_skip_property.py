"""`nothing_to_take` against running every pass, over generated sessions: whatever the
session (tool loops long and short, thinking, user shell output, batches answered one result
per call, system or developer messages mid-history, user text steering a running loop,
results answering no call, idle gaps, rewinds, summaries of the caller's own, usage reports
or none) and
whatever the pipeline's settings, a call that skips the passes sends what running them sends,
and the session takes the same decisions."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentctx.budget import Budget
from agentctx.manager import ContextManager
from agentctx.messages import (
    AssistantMessage,
    Message,
    SummaryMessage,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from agentctx.recall import MemoryRecallStore
from agentctx.strategies import ToolOutputPipeline
from agentctx.strategies import pipeline as pipeline_module
from agentctx.strategies.pipeline import BudgetPass, EmergencyPass, ExpiryPass
from agentctx.testing import assert_view_ok

# One event per call: a step of the tool loop (a batch of 1-3 calls, answered at once or one
# result per call), a user turn (or user shell output), an idle gap, a rewind, a summary.
step = st.tuples(
    st.just("step"),
    st.integers(1, 3),  # calls in the batch
    st.sampled_from((40, 2_000, 12_000)),  # characters of each result
    st.booleans(),  # thinking
    st.booleans(),  # answered one result per call
    st.sampled_from((2.0, 9.0, 40.0)),  # seconds since the last event
)
event = st.one_of(
    step,
    st.tuples(
        st.just("user"),
        st.booleans(),  # user shell output
        st.sampled_from((5.0, 120.0)),
        st.sampled_from(("user", "user", "system", "developer")),  # or an instruction
    ),
    st.tuples(st.just("steer")),  # user text right after results
    st.tuples(st.just("orphan")),  # a result answering no call
    st.tuples(st.just("gap"), st.sampled_from((200.0, 400.0, 4_000.0))),
    st.tuples(st.just("rewind"), st.integers(1, 6)),
    st.tuples(st.just("summary")),
)
pipelines = st.builds(
    lambda expire, thinking, keep, clear, l2, cap: ToolOutputPipeline(
        l0=ExpiryPass(expire_seconds=expire, thinking_expire_seconds=thinking, keep_recent=keep),
        clear_at_least=clear,
        l2=l2,
        budget=BudgetPass(max_chars_per_turn=cap),
    ),
    st.sampled_from((60.0, 300.0, 1_800.0)),
    st.sampled_from((60.0, 300.0)),
    st.sampled_from((0, 2, 5)),
    st.sampled_from((None, 2_000, 6_000)),
    st.sampled_from((None, EmergencyPass(), EmergencyPass(usage_fraction=0.6))),
    st.sampled_from((30_000, 200_000)),
)


async def _session(
    strategy: ToolOutputPipeline, events: list[Any], window: int, observe: bool, skip: bool
) -> list[tuple[Any, ...]]:
    real = pipeline_module.nothing_to_take
    pipeline_module.nothing_to_take = real if skip else (lambda *_: False)  # type: ignore[assignment]
    try:
        return await _calls(strategy, events, window, observe)
    finally:
        pipeline_module.nothing_to_take = real


async def _calls(
    strategy: ToolOutputPipeline, events: list[Any], window: int, observe: bool
) -> list[tuple[Any, ...]]:
    clock = [1_700_000_000.0]
    store = MemoryRecallStore()
    history: list[Message] = [UserMessage.of("Task: make src/cache/core.py twice as fast.")]
    pending: list[Message] = []  # results still to come, one a call
    trace: list[tuple[Any, ...]] = []
    n = 0

    def stamp() -> dict[str, Any]:
        return {"timestamp": int(clock[0] * 1000)}

    async with ContextManager(
        Budget(context_window=window, reserve_output=1_000),
        strategy=strategy,
        recall=store,
        clock=lambda: clock[0],
        session_id="s",
        on_over_budget="send",
    ) as ctx:
        for e in events:
            kind = e[0]
            if pending:
                history.append(pending.pop(0))
            elif kind == "step":
                _, calls, size, thinking, one_by_one, seconds = e
                clock[0] += seconds
                blocks: list[Any] = [ThinkingBlock(f"plan {n} " * 60, "sig")] if thinking else []
                results: list[Message] = []
                for _ in range(calls):
                    n += 1
                    blocks.append(ToolCall(f"c{n}", "read", {"path": f"src/f{n}.py"}))
                    out = "\n".join(f"src/f{n}.py:{i}: v = f({i})" for i in range(size // 24))
                    results.append(
                        ToolResultMessage(
                            f"c{n}", (TextBlock(out or "ok"),), "read", False, stamp()
                        )
                    )
                history.append(AssistantMessage(tuple(blocks), "tool_use", extra=stamp()))
                if one_by_one:
                    history.append(results[0])
                    pending = results[1:]
                else:
                    history += results
            elif kind == "user":
                clock[0] += e[2]
                extra = stamp() if e[3] == "user" else {**stamp(), "role": e[3]}
                if e[1]:
                    shell = "\n".join(f"$ make {i}: ok" for i in range(300))
                    shell_extra = {**extra, "source": "bash_execution"}
                    history.append(UserMessage((TextBlock(shell),), shell_extra))
                else:
                    history.append(UserMessage((TextBlock("Next: the parser."),), extra))
            elif kind == "steer":
                clock[0] += 1
                history.append(UserMessage((TextBlock("Also check the tests."),), stamp()))
            elif kind == "orphan":
                lost = ToolResultMessage("gone", (TextBlock("z" * 3000),), "read", False, stamp())
                history.append(lost)
            elif kind == "gap":
                clock[0] += e[1]
                history.append(UserMessage((TextBlock("Still there?"),), stamp()))
            elif kind == "rewind":
                cut = max(1, len(history) - 2 * e[1])
                while cut > 1 and isinstance(history[cut], ToolResultMessage):
                    cut -= 1
                del history[cut:]
                history.append(UserMessage((TextBlock("Let us try again."),), stamp()))
            else:
                history.append(SummaryMessage("Earlier: read src/f1.py and src/f2.py."))
            view = await ctx.prepare(history)
            assert_view_ok(view, ctx.raw)
            trace.append((view, ctx.prompt_tokens, ctx.ledger.decisions, store.bytes_held))
            if observe:
                await anyio.lowlevel.checkpoint()
                ctx.observe(Usage(int(ctx.prompt_tokens * 1.03), 100))
                await anyio.lowlevel.checkpoint()
    return trace


@given(
    pipelines,
    st.lists(event, min_size=20, max_size=90),
    st.sampled_from((12_000, 40_000, 120_000)),
    st.booleans(),
)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_skipping_the_passes_sends_what_running_them_sends(
    strategy: ToolOutputPipeline, events: list[Any], window: int, observe: bool
) -> None:
    skipped = anyio.run(_session, strategy, events, window, observe, True)
    every = anyio.run(_session, strategy, events, window, observe, False)
    for k, (a, b) in enumerate(zip(skipped, every, strict=True)):
        assert a == b, f"call {k}"
