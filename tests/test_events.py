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


async def _compactions_per_call(strategy: str) -> list[tuple[list[ContextCompacted], int, int]]:
    """Each compacting call of a synthetic session under the replay's ``strategy``: its
    `ContextCompacted` events, the decisions the ledger gained and the prompt it returned."""
    clock = ReplayClock(1_000.0)
    calls: list[tuple[list[ContextCompacted], int, int]] = []
    events: list[object] = []
    async with ContextManager(
        Budget(context_window=40_000),
        strategy=build_strategy(strategy, clock, delay=5.0),
        clock=clock,
        session_id="adds-up",
    ) as ctx:
        ctx.subscribe(events.append)
        history: list[Message] = []
        for group in synthetic_session(seed=1, calls=60):
            history += group
            await clock.advance(clock() + 10.0)
            seen, decisions = len(events), len(ctx.ledger)
            await ctx.prepare(history)
            compacted = [e for e in events[seen:] if isinstance(e, ContextCompacted)]
            if compacted:
                calls.append((compacted, len(ctx.ledger) - decisions, ctx.prompt_tokens))
        await clock.advance(clock())
    return calls


@pytest.mark.parametrize("strategy", ["deterministic", "pipeline", "llm"])
async def test_the_events_of_a_call_add_up_to_what_it_did(strategy: str) -> None:
    """Summing ``tokens_before - tokens_after`` and ``decisions`` over the events of a call
    gives what the call saved and took (as examples/compaction_events.py sums them): each
    compaction is reported once, by the strategy that ran it, however many fallbacks it ran
    inside (found by a hostile run: the pipeline's tiers and its own event both counted the
    tiers' work, and each event counted every decision of the call so far)."""
    calls = await _compactions_per_call(strategy)
    assert len(calls) >= 3
    for compacted, taken, returned in calls:
        assert sum(e.decisions for e in compacted) == taken
        for earlier, later in itertools.pairwise(compacted):
            assert later.tokens_before == pytest.approx(earlier.tokens_after, rel=0.02)
        # The last one measures the view the call returned (counted in full).
        assert compacted[-1].tokens_after == returned
