"""The package logger: structlog over the stdlib ``agentctx`` logger.

Silent unless the application configures logging; key-value lines when it does. structlog is
imported on the first log call, so ``import agentctx`` does not pay for it.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["log", "stdlib_logger"]

stdlib_logger = logging.getLogger("agentctx")
# A library's logger stays quiet until the application configures logging; without this the
# stdlib's last-resort handler would print warnings to stderr.
stdlib_logger.addHandler(logging.NullHandler())


class _Logger:
    """Builds the structlog logger the first time it is used, then forwards to it."""

    __slots__ = ("_bound",)

    def __init__(self) -> None:
        self._bound: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._bound is None:
            import structlog

            self._bound = structlog.wrap_logger(
                stdlib_logger,
                wrapper_class=structlog.stdlib.BoundLogger,
                processors=[
                    structlog.stdlib.filter_by_level,
                    structlog.processors.format_exc_info,
                    structlog.processors.KeyValueRenderer(key_order=["event"], sort_keys=True),
                ],
            )
        return getattr(self._bound, name)


log: Any = _Logger()
