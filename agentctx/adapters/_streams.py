"""What the stream assemblers of every provider share."""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from agentctx.errors import UnsupportedMessageError

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["MAX_INDEX_GAP", "grow_to", "malformed"]

MAX_INDEX_GAP = 16
"""How far past the parts seen a stream's part (a block, a content or summary part) may be:
the APIs number them in order, so an index much further on is a broken stream, and filling
the gap up to it could take all the memory."""


def grow_to(parts: list[dict[str, Any]], index: int, what: str) -> None:
    """Add empty parts to ``parts`` up to ``index``; `UnsupportedMessageError` naming
    ``what`` for an index more than `MAX_INDEX_GAP` past them."""
    if index - len(parts) > MAX_INDEX_GAP:
        raise UnsupportedMessageError(
            None, f"stream {what} index {index} far past the {len(parts)} seen"
        )
    parts.extend({} for _ in range(index + 1 - len(parts)))


@contextmanager
def malformed(what: str) -> Iterator[None]:
    """Turn a lookup on a malformed event (a missing key, an index or a part of the wrong
    type) into `UnsupportedMessageError` naming ``what``."""
    try:
        yield
    except UnsupportedMessageError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        raise UnsupportedMessageError(None, f"malformed {what} ({e!r})") from None
