"""Built-in compaction strategies."""

from typing import TYPE_CHECKING

from agentctx._lazy import lazy_attributes
from agentctx.strategies.deterministic import DeterministicCompaction

if TYPE_CHECKING:
    from agentctx.strategies.pipeline import (
        BudgetPass,
        CondensePass,
        EmergencyPass,
        ExpiryPass,
        MicroCompact,
        ToolOutputPipeline,
    )

# The pipeline is imported on first use: the default strategy's sessions never load it.
_PASSES = ("BudgetPass", "CondensePass", "EmergencyPass", "ExpiryPass", "MicroCompact")
_LAZY = dict.fromkeys((*_PASSES, "ToolOutputPipeline"), "agentctx.strategies.pipeline")
__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())

__all__ = [
    "BudgetPass",
    "CondensePass",
    "DeterministicCompaction",
    "EmergencyPass",
    "ExpiryPass",
    "MicroCompact",
    "ToolOutputPipeline",
]
