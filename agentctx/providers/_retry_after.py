"""``Retry-After`` of an HTTP error response, in seconds (shared by the summarizers)."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["retry_after_seconds"]


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """Seconds the server asked to wait: ``retry-after-ms``, else ``retry-after`` (seconds or
    an HTTP date); ``None`` when absent or unreadable. ``headers`` should be case-insensitive
    (an ``httpx`` ``Headers``)."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            value = float(ms) / 1000.0
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value >= 0:
            return value
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        try:
            when = parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return max(0.0, (when - datetime.now(UTC)).total_seconds())
    return value if math.isfinite(value) and value >= 0 else None
