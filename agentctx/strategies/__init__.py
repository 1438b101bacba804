"""Built-in compaction strategies."""

from agentctx.strategies.deterministic import DeterministicCompaction

__all__ = ["DeterministicCompaction"]
