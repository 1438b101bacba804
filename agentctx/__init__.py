"""agentctx keeps long-running LLM agents inside their context window."""

from agentctx.errors import (
    AgentCtxError,
    BudgetExceededError,
    ConfigError,
    StoreError,
    TranscriptFormatError,
    UnsupportedMessageError,
)
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

__all__ = [
    "AgentCtxError",
    "AssistantMessage",
    "BudgetExceededError",
    "ConfigError",
    "ImageBlock",
    "Message",
    "OpaqueBlock",
    "RedactedThinkingBlock",
    "StoreError",
    "SummaryMessage",
    "TextBlock",
    "ThinkingBlock",
    "ToolCall",
    "ToolResultMessage",
    "TranscriptFormatError",
    "UnsupportedMessageError",
    "Usage",
    "UserMessage",
]
