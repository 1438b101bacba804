"""agentctx keeps long-running LLM agents inside their context window."""

__version__ = "0.1.0"

from typing import TYPE_CHECKING

from agentctx._lazy import lazy_attributes
from agentctx.budget import Budget, BudgetExceededError
from agentctx.errors import (
    AgentCtxError,
    ConfigError,
    MissingExtraError,
    StoreDataError,
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
    recall_tool,
)
from agentctx.strategies import DeterministicCompaction
from agentctx.strategy import Chain, CompactionContext, CompactionStrategy, Quiet
from agentctx.summarizer import Summarizer, SummaryRequest, SummaryResult
from agentctx.tokens import MessageCounter, TokenCounter

if TYPE_CHECKING:
    from agentctx.blocking import BlockingContextManager
    from agentctx.recall.sqlite import SQLiteRecallStore
    from agentctx.strategies.llm import LlmCompaction, LlmCompactionConfig, RetryPolicy
    from agentctx.strategies.pipeline import ToolOutputPipeline

# Imported on first use: what only some sessions need costs the others nothing at import
# (the blocking API's loop thread brings asyncio; the LLM strategy, the pipeline and SQLite
# are a fifth of the package's import time).
_LAZY = {
    "BlockingContextManager": "agentctx.blocking",
    "LlmCompaction": "agentctx.strategies.llm",
    "LlmCompactionConfig": "agentctx.strategies.llm",
    "RetryPolicy": "agentctx.strategies.llm",
    "SQLiteRecallStore": "agentctx.recall.sqlite",
    "ToolOutputPipeline": "agentctx.strategies.pipeline",
}


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())

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
    "Quiet",
    "RECALL_TOOL_NAME",
    "RecallStore",
    "RedactedThinkingBlock",
    "RetryPolicy",
    "SQLiteRecallStore",
    "StoreDataError",
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
