"""The public surface is a contract: this test fails when it drifts."""

from __future__ import annotations

import subprocess
import sys

import agentctx

EXPECTED = {
    "AgentCtxError", "AssistantMessage", "Budget", "BudgetExceeded", "BudgetExceededError",
    "Chain", "CompactionContext", "CompactionStrategy", "ConfigError", "ContextCompacted",
    "ContextManager", "DeterministicCompaction", "Event", "HistoryResynced", "ImageBlock",
    "Ledger", "LedgerStore", "MemoryRecallStore", "SQLiteRecallStore", "ToolOutputPipeline",
    "RECALL_TOOL_NAME", "recall_tool", "LlmCompaction", "LlmCompactionConfig", "RetryPolicy",
    "Summarizer", "SummaryRequest", "SummaryResult", "SummarizerError", "SummaryRejected",
    "SummaryStale", "CompactionWarning", "Message", "MessageCounter", "OpaqueBlock", "RecallStore",
    "RedactedThinkingBlock", "StoreError", "SummaryMessage", "SummaryStats", "TextBlock",
    "ThinkingBlock", "TokenCounter", "ToolCall", "ToolResultMessage", "TranscriptFormatError",
    "TranscriptRepaired", "UnsupportedMessageError", "Usage", "UserMessage", "MissingExtraError",
    "StoreDataError", "StoreDegraded", "StoreRecovered", "__version__", "BlockingContextManager",
    "Quiet",
}  # fmt: skip


def test_all_is_sorted_complete_and_importable() -> None:
    assert list(agentctx.__all__) == sorted(agentctx.__all__)
    assert set(agentctx.__all__) == EXPECTED
    for name in agentctx.__all__:
        assert getattr(agentctx, name) is not None


def test_errors_share_one_root() -> None:
    for name in ("BudgetExceededError", "ConfigError", "StoreError", "StoreDataError",
                 "TranscriptFormatError",
                 "UnsupportedMessageError", "MissingExtraError"):  # fmt: skip
        assert issubclass(getattr(agentctx, name), agentctx.AgentCtxError)


def test_import_agentctx_imports_no_vendor_sdk() -> None:
    code = (
        "import sys, agentctx; "
        "bad = [m for m in ('anthropic', 'openai', 'tiktoken', 'httpx') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


async def test_a_manager_is_weakly_referenced_and_patched_as_a_plain_object_is() -> None:
    """Its attributes live in slots (for speed), and it still takes a weak reference and a
    method patched on the instance (``mock.patch.object``)."""
    import weakref
    from unittest import mock

    manager = agentctx.ContextManager(100_000)
    assert weakref.ref(manager)() is manager
    with mock.patch.object(manager, "prepare", return_value=[]) as prepare:
        assert await manager.prepare([]) == [] and prepare.await_count == 1
    assert "prepare" not in vars(manager)
