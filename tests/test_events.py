"""The JSON shape of every event is frozen: downstream dashboards parse it."""

from __future__ import annotations

import json

from agentctx.events import (
    BudgetExceeded,
    ContextCompacted,
    HistoryResynced,
    SummaryStats,
    TranscriptRepaired,
)
from agentctx.messages import Usage


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
