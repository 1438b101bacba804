"""Built-in compaction strategies."""

from agentctx.strategies.deterministic import DeterministicCompaction
from agentctx.strategies.pipeline import (
    BudgetPass,
    CondensePass,
    EmergencyPass,
    ExpiryPass,
    MicroCompact,
    ToolOutputPipeline,
)

__all__ = [
    "BudgetPass",
    "CondensePass",
    "DeterministicCompaction",
    "EmergencyPass",
    "ExpiryPass",
    "MicroCompact",
    "ToolOutputPipeline",
]
