"""The package logger: structlog over the stdlib ``agentctx`` logger.

Silent unless the application configures logging; key-value lines when it does. structlog is
imported on the first log call a handler would hear (or by `warm_logger`), so neither
``import agentctx`` nor a session that nobody logs pays for it: importing it (and the
``rich`` it pulls in when installed) takes tens of milliseconds, a stall on the event loop.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import anyio

__all__ = ["log", "stdlib_logger", "warm_logger"]

stdlib_logger = logging.getLogger("agentctx")
# A library's logger stays quiet until the application configures logging; without this the
# stdlib's last-resort handler would print warnings to stderr.
stdlib_logger.addHandler(logging.NullHandler())


_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "exception": logging.ERROR,
    "critical": logging.CRITICAL,
}


def heard(level: int = logging.CRITICAL) -> bool:
    """Whether a record at ``level`` (by default: at some level) would reach a handler other
    than the package's `~logging.NullHandler`."""
    if not stdlib_logger.isEnabledFor(level):
        return False
    logger: logging.Logger | None = stdlib_logger
    while logger is not None:
        for handler in logger.handlers:
            if not isinstance(handler, logging.NullHandler) and level >= handler.level:
                return True
        if not logger.propagate:
            return False
        logger = logger.parent
    return False  # the NullHandler keeps the stdlib's last-resort handler out


def _silent(*args: Any, **kwargs: Any) -> None:
    return None


async def warm_logger() -> None:
    """If logging is configured and structlog not imported yet, import it in a thread of its
    own and wait for it, so a session's first log line does not stall the event loop.

    A plain thread, ended when this returns: anyio's pool would keep a worker thread alive
    after the session."""
    if log.built or not heard():
        return
    thread = threading.Thread(target=log.build, name="agentctx-logging", daemon=True)
    thread.start()
    # Polled: setting an anyio.Event from a thread anyio did not start needs an anyio newer
    # than the one this package supports, and this runs once per process.
    while thread.is_alive():  # noqa: ASYNC110
        await anyio.sleep(0.005)


class _Logger:
    """Builds the structlog logger the first time a handler would hear it, then forwards to
    it; until then a log call checks the stdlib configuration and returns."""

    __slots__ = ("_bound",)

    def __init__(self) -> None:
        self._bound: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._bound is None:
            level = _LEVELS.get(name)
            if level is not None and not heard(level):
                return _silent
            self.build()
        return getattr(self._bound, name)

    @property
    def built(self) -> bool:
        return self._bound is not None

    def build(self) -> None:
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


log: Any = _Logger()
