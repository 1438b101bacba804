"""The JSON shape of every event is frozen: downstream dashboards parse it."""

from __future__ import annotations

import itertools
import json

import pytest

from agentctx.budget import Budget
from agentctx.events import (
    BudgetExceeded,
    ContextCompacted,
    HistoryResynced,
    SummaryStats,
    TranscriptRepaired,
)
from agentctx.manager import ContextManager
from agentctx.messages import Message, Usage
from agentctx.replay import ReplayClock
from agentctx.replay.jobs import build_strategy
from agentctx.replay.offline_summarizer import OfflineSummarizer
from agentctx.strategies import DeterministicCompaction, ToolOutputPipeline
from agentctx.strategies.llm import LlmCompaction
from agentctx.strategy import Chain, CompactionStrategy
from agentctx.testing import synthetic_session


def test_context_compacted_shape() -> None:
    event = ContextCompacted(
        method="summarized",
        strategy="LlmCompaction",
        messages_before=40,
        messages_after=12,
        tokens_before=90_000,
        tokens_after=30_000,
        decisions=1,
        actions=("summarized 28 messages",),
        summary=SummaryStats(28, Usage(1000, 200, 0, 0), None, "claude-haiku-4-5"),
    )
    assert event.to_json() == {
        "type": "contextCompacted",
        "method": "summarized",
        "strategy": "LlmCompaction",
        "messagesBefore": 40,
        "messagesAfter": 12,
        "tokensBefore": 90_000,
        "tokensAfter": 30_000,
        "decisions": 1,
        "actions": ["summarized 28 messages"],
        "summary": {
            "messagesSummarized": 28,
            "usage": {
                "inputTokens": 1000,
                "outputTokens": 200,
                "cacheReadTokens": 0,
                "cacheWriteTokens": 0,
            },
            "costUsd": None,
            "model": "claude-haiku-4-5",
        },
    }
    json.dumps(event.to_json())


def test_other_event_shapes() -> None:
    assert BudgetExceeded(120, 100, 1.2).to_json() == {
        "type": "budgetExceeded",
        "tokens": 120,
        "budget": 100,
        "usageFraction": 1.2,
    }
    assert TranscriptRepaired(("missing_result@3:c1",)).to_json() == {
        "type": "transcriptRepaired",
        "repairs": ["missing_result@3:c1"],
    }
    assert HistoryResynced(7, 2).to_json() == {
        "type": "historyResynced",
        "index": 7,
        "droppedDecisions": 2,
    }


# -- the events of a call add up -----------------------------------------------------------


def _strategy(name: str, clock: ReplayClock) -> CompactionStrategy:
    if name == "pipeline over llm":  # the pipeline's fallback splices briefings
        summarizer = OfflineSummarizer(5.0, sleep=clock.sleep)
        llm = LlmCompaction(summarizer, clock=clock, sleep=clock.sleep)
        return Chain([ToolOutputPipeline(fallback=llm), DeterministicCompaction()])
    return build_strategy(name, clock, delay=5.0)


def _requests(strategy: CompactionStrategy) -> int:
    """Summarizer requests billed to the `LlmCompaction` in ``strategy``, wherever it is."""
    if isinstance(strategy, LlmCompaction):
        return strategy.spend.requests
    inner = [*getattr(strategy, "strategies", ()), getattr(strategy, "fallback", None)]
    return sum(_requests(s) for s in inner if s is not None)


async def _compactions_per_call(
    strategy: str, seed: int
) -> tuple[list[tuple[list[ContextCompacted], int, int]], list[object], int]:
    """Each compacting call of a synthetic session under ``strategy``: its `ContextCompacted`
    events, the decisions the ledger gained and the prompt it returned; every event; the
    summarizer requests billed."""
    clock = ReplayClock(1_000.0)
    made = _strategy(strategy, clock)
    calls: list[tuple[list[ContextCompacted], int, int]] = []
    events: list[object] = []
    async with ContextManager(
        Budget(context_window=40_000),
        strategy=made,
        clock=clock,
        session_id="adds-up",
    ) as ctx:
        ctx.subscribe(events.append)
        history: list[Message] = []
        for group in synthetic_session(seed=seed, calls=60):
            history += group
            await clock.advance(clock() + 10.0)
            seen, decisions = len(events), len(ctx.ledger)
            await ctx.prepare(history)
            compacted = [e for e in events[seen:] if isinstance(e, ContextCompacted)]
            if compacted:
                calls.append((compacted, len(ctx.ledger) - decisions, ctx.prompt_tokens))
        await clock.advance(clock())
    return calls, events, _requests(made)


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("strategy", ["deterministic", "pipeline", "llm", "pipeline over llm"])
async def test_the_events_of_a_call_add_up_to_what_it_did(strategy: str, seed: int) -> None:
    """Summing ``tokens_before - tokens_after`` and ``decisions`` over the events of a call
    gives what the call saved and took (as examples/compaction_events.py sums them): each
    compaction is reported once, by the strategy that took it, counted in full (found by
    hostile runs: the pipeline's own event spanned its tiers' work, which they reported too;
    each event counted every decision of the call so far; a briefing's event measured it on
    a first estimate; folded into the pipeline's event, a fallback's briefing lost its
    bill)."""
    calls, events, requests = await _compactions_per_call(strategy, seed)
    assert len(calls) >= 3
    for compacted, taken, returned in calls:
        assert sum(e.decisions for e in compacted) == taken
        for earlier, later in itertools.pairwise(compacted):
            assert later.tokens_before == pytest.approx(earlier.tokens_after, rel=0.02)
        # The last one measures the view the call returned (counted in full).
        assert compacted[-1].tokens_after == returned
    if "llm" in strategy:  # every billed briefing in exactly one event
        billed = [e for e in events if getattr(e, "summary", None) is not None]
        assert len(billed) == requests > 0
