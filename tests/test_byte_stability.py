"""Over many successive calls on a growing history, the rendered prefix changes only at calls
that took a new batch of decisions, and each change starts at the first newly replaced message."""

from __future__ import annotations

import pytest

from agentctx.budget import Budget
from agentctx.importers import load_transcript
from agentctx.ledger import ReplaceSpan
from agentctx.manager import ContextManager
from agentctx.messages import AssistantMessage, Message, canonical_json
from agentctx.recall import MemoryRecallStore
from agentctx.strategies import DeterministicCompaction, ToolOutputPipeline
from agentctx.strategy import Chain
from agentctx.testing import assert_view_ok, synthetic_session

from .corpus import corpus_file


def first_change(a: list[str], b: list[str]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


async def check_stability(requests: list[list[Message]], budget: Budget, times: list[float]) -> int:
    strategy = Chain([ToolOutputPipeline(), DeterministicCompaction()])
    batches = 0
    now = [0.0]
    async with ContextManager(
        budget,
        strategy=strategy,
        recall=MemoryRecallStore(),
        clock=lambda: now[0],
        on_over_budget="send",
    ) as ctx:
        previous: list[str] = []
        previous_origins: list[int] = []
        for history, at in zip(requests, times, strict=True):
            now[0] = at
            taken = len(ctx.ledger)
            view = await ctx.prepare(history)
            assert_view_ok(view, ctx.raw)
            current = [canonical_json(m) for m in view]
            new = ctx.ledger.decisions[taken:]
            if not new:
                assert current[: len(previous)] == previous
            else:
                batches += 1
                earliest = min(d.at.index for d in new)
                # the first view position standing for a raw message at or after it
                allowed = next(
                    (j for j, o in enumerate(previous_origins) if o >= earliest),
                    len(previous),
                )
                assert first_change(previous, current) >= allowed
                assert all(isinstance(d, ReplaceSpan) or d.at.index < len(ctx.raw) for d in new)
            previous, previous_origins = current, list(ctx._state.origins)
    return batches


async def test_fifty_calls_on_a_growing_synthetic_history() -> None:
    groups = synthetic_session(7, 120, mean_output_lines=40)
    requests, history = [], []
    for g in groups:
        history = [*history, *g]
        requests.append(history)
    times = [1_700_000_000.0 + 20.0 * n for n in range(len(requests))]
    batches = await check_stability(requests, Budget(context_window=50_000), times)
    assert 1 <= batches < len(requests) // 4  # rewrites are rare, and they happen


@pytest.mark.parametrize("name", ["large-session.jsonl", "before-compaction.jsonl"])
async def test_pi_sessions_request_by_request(name: str) -> None:
    messages = list(load_transcript(corpus_file("pi", name)).messages)
    calls = [i for i, m in enumerate(messages) if isinstance(m, AssistantMessage) and i > 0]
    requests = [messages[:i] for i in calls]
    times = [(messages[i].extra.get("timestamp") or 0) / 1000 for i in calls]
    batches = await check_stability(requests, Budget(context_window=100_000), times)
    assert batches < len(requests) // 10
