"""agentctx keeps long-running LLM agents inside their context window."""

__version__ = "0.1.0"

from typing import TYPE_CHECKING

from agentctx.budget import Budget, BudgetExceededError
from agentctx.errors import (
    AgentCtxError,
    ConfigError,
    MissingExtraError,
    StoreError,
    SummarizerError,
    TranscriptFormatError,
    UnsupportedMessageError,
)
from agentctx.events import (
    BudgetExceeded,
    CompactionWarning,
    ContextCompacted,
    Event,
    HistoryResynced,
    StoreDegraded,
    StoreRecovered,
    SummaryRejected,
    SummaryStale,
    SummaryStats,
    TranscriptRepaired,
)
from agentctx.ledger import Ledger
from agentctx.manager import ContextManager
from agentctx.messages import (
    AssistantMessage,
    ImageBlock,
    Message,
    OpaqueBlock,
    RedactedThinkingBlock,
    SummaryMessage,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from agentctx.recall import (
    RECALL_TOOL_NAME,
    LedgerStore,
    MemoryRecallStore,
    RecallStore,
    SQLiteRecallStore,
    recall_tool,
)
from agentctx.strategies import DeterministicCompaction, ToolOutputPipeline
from agentctx.strategies.llm import LlmCompaction, LlmCompactionConfig, RetryPolicy
from agentctx.strategy import Chain, CompactionContext, CompactionStrategy
from agentctx.summarizer import Summarizer, SummaryRequest, SummaryResult
from agentctx.tokens import MessageCounter, TokenCounter

if TYPE_CHECKING:
    from agentctx.blocking import BlockingContextManager


def __getattr__(name: str) -> object:
    # The blocking API runs a loop thread (anyio.from_thread, which imports asyncio): async
    # callers, who have asyncio already, should not pay for it at import.
    if name == "BlockingContextManager":
        from agentctx.blocking import BlockingContextManager

        return BlockingContextManager
    raise AttributeError(f"module 'agentctx' has no attribute {name!r}")


__all__ = [
    "AgentCtxError",
    "AssistantMessage",
    "BlockingContextManager",
    "Budget",
    "BudgetExceeded",
    "BudgetExceededError",
    "Chain",
    "CompactionContext",
    "CompactionStrategy",
    "CompactionWarning",
    "ConfigError",
    "ContextCompacted",
    "ContextManager",
    "DeterministicCompaction",
    "Event",
    "HistoryResynced",
    "ImageBlock",
    "Ledger",
    "LedgerStore",
    "LlmCompaction",
    "LlmCompactionConfig",
    "MemoryRecallStore",
    "Message",
    "MessageCounter",
    "MissingExtraError",
    "OpaqueBlock",
    "RECALL_TOOL_NAME",
    "RecallStore",
    "RedactedThinkingBlock",
    "RetryPolicy",
    "SQLiteRecallStore",
    "StoreDegraded",
    "StoreError",
    "StoreRecovered",
    "Summarizer",
    "SummarizerError",
    "SummaryMessage",
    "SummaryRejected",
    "SummaryRequest",
    "SummaryResult",
    "SummaryStale",
    "SummaryStats",
    "TextBlock",
    "ThinkingBlock",
    "TokenCounter",
    "ToolCall",
    "ToolOutputPipeline",
    "ToolResultMessage",
    "TranscriptFormatError",
    "TranscriptRepaired",
    "UnsupportedMessageError",
    "Usage",
    "UserMessage",
    "__version__",
    "recall_tool",
]
