"""Where cleared content goes, so the agent can fetch it back by id.

Ids are content-addressed and scoped by session: ``ctx-`` + 16 hex digits of a hash of the
session id and the content. The same content in the same session always gets the same id,
and one session can never name, let alone read, another session's entry.
"""

from __future__ import annotations

import hashlib
from typing import Protocol, runtime_checkable

__all__ = ["MemoryRecallStore", "RecallStore", "recall_id"]


def recall_id(session_id: str, content: str) -> str:
    """The deterministic recall id of ``content`` in ``session_id``."""
    h = hashlib.blake2b(digest_size=8)
    h.update(session_id.encode("utf-8", "surrogatepass"))
    h.update(b"\0")
    h.update(content.encode("utf-8", "surrogatepass"))
    return "ctx-" + h.hexdigest()


@runtime_checkable
class RecallStore(Protocol):
    """Keeps original content under its recall id, per session."""

    def put(self, session_id: str, content: str) -> str:
        """Store ``content`` for ``session_id`` and return its recall id."""
        ...

    def get(self, session_id: str, rid: str) -> str | None:
        """The content stored under ``rid`` for ``session_id``, or ``None``."""
        ...


class MemoryRecallStore:
    """A process-local recall store: a dict per session."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], str] = {}

    def put(self, session_id: str, content: str) -> str:
        """Store ``content`` for ``session_id`` and return its recall id."""
        rid = recall_id(session_id, content)
        self._entries[(session_id, rid)] = content
        return rid

    def get(self, session_id: str, rid: str) -> str | None:
        """The content stored under ``rid`` for ``session_id``, or ``None``."""
        return self._entries.get((session_id, rid))
