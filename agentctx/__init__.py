"""agentctx keeps long-running LLM agents inside their context window."""

from agentctx.budget import Budget
from agentctx.errors import (
    AgentCtxError,
    BudgetExceededError,
    ConfigError,
    StoreError,
    TranscriptFormatError,
    UnsupportedMessageError,
)
from agentctx.events import (
    BudgetExceeded,
    ContextCompacted,
    Event,
    HistoryResynced,
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
from agentctx.recall import MemoryRecallStore, RecallStore
from agentctx.strategies import DeterministicCompaction
from agentctx.strategy import Chain, CompactionContext, CompactionStrategy
from agentctx.tokens import MessageCounter, TokenCounter

__all__ = [
    "AgentCtxError",
    "AssistantMessage",
    "Budget",
    "BudgetExceeded",
    "BudgetExceededError",
    "Chain",
    "CompactionContext",
    "CompactionStrategy",
    "ConfigError",
    "ContextCompacted",
    "ContextManager",
    "DeterministicCompaction",
    "Event",
    "HistoryResynced",
    "ImageBlock",
    "Ledger",
    "MemoryRecallStore",
    "Message",
    "MessageCounter",
    "OpaqueBlock",
    "RecallStore",
    "RedactedThinkingBlock",
    "StoreError",
    "SummaryMessage",
    "SummaryStats",
    "TextBlock",
    "ThinkingBlock",
    "TokenCounter",
    "ToolCall",
    "ToolResultMessage",
    "TranscriptFormatError",
    "TranscriptRepaired",
    "UnsupportedMessageError",
    "Usage",
    "UserMessage",
]
