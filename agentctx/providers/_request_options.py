"""Checking a summarizer's ``request_options`` against the SDK method they will be sent to."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agentctx.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["check_request_options"]


def check_request_options(
    method: Callable[..., Any], options: Mapping[str, Any], reserved: frozenset[str]
) -> dict[str, Any]:
    """``options`` as a dict, or `ConfigError` naming what ``method`` would reject or what
    the summarizer sets itself (``reserved``) — said when the summarizer is made, not as a
    failed background request on every compaction."""
    options = dict(options)
    extra = options.get("extra_body")
    if "stream" in options or (isinstance(extra, Mapping) and "stream" in extra):
        # The reply would be a stream, which the summarizer reads as an unreadable one.
        raise ConfigError("request_options cannot set stream: a summary is read whole")
    taken = sorted(reserved & options.keys())
    if taken:
        raise ConfigError(f"request_options cannot set {', '.join(taken)}: the summarizer does")
    parameters = inspect.signature(method).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        unknown = sorted(options.keys() - parameters.keys())
        if unknown:
            raise ConfigError(
                f"request_options has {', '.join(unknown)}, which {method.__qualname__} does not"
                " take; pass fields the SDK does not know yet in extra_body"
            )
    return options
