"""The package logger: structlog over the stdlib ``agentctx`` logger.

Silent unless the application configures logging; key-value lines when it does.
"""

from __future__ import annotations

import logging

import structlog

_logger = logging.getLogger("agentctx")
# A library's logger stays quiet until the application configures logging; without this the
# stdlib's last-resort handler would print warnings to stderr.
_logger.addHandler(logging.NullHandler())

log: structlog.stdlib.BoundLogger = structlog.wrap_logger(
    _logger,
    wrapper_class=structlog.stdlib.BoundLogger,
    processors=[
        structlog.stdlib.filter_by_level,
        structlog.processors.format_exc_info,
        structlog.processors.KeyValueRenderer(key_order=["event"], sort_keys=True),
    ],
)
