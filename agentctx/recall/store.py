"""The recall store protocols, content-addressed ids, and the in-memory store.

Ids are content-addressed and scoped by session: ``ctx-`` + 16 hex digits of a hash of the
session id and the content. The same content in the same session always gets the same id,
and one session can never name, let alone read, another session's entry.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = [
    "LedgerStore",
    "MemoryRecallStore",
    "RecallStore",
    "recall_id",
]


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


@runtime_checkable
class LedgerStore(Protocol):
    """A store that also keeps each session's ledger, so another process resumes it."""

    def load_ledger(self, session_id: str) -> str | None:
        """The saved ledger JSON of ``session_id``, or ``None``."""
        ...

    def save_ledger(self, session_id: str, ledger_json: str) -> None:
        """Save the ledger JSON of ``session_id``."""
        ...


class MemoryRecallStore:
    """A process-local store bounded by bytes.

    Entries the session still references (`pin`) are never evicted; past ``max_bytes`` the
    least recently used unreferenced entries go first.
    """

    def __init__(self, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._pinned: dict[str, set[str]] = {}
        self._bytes = 0

    def put(self, session_id: str, content: str) -> str:
        """Store ``content`` for ``session_id`` and return its recall id."""
        rid = recall_id(session_id, content)
        key = (session_id, rid)
        if key in self._entries:
            self._entries.move_to_end(key)
            return rid
        self._entries[key] = content
        self._bytes += len(content)
        # A new entry is about to be referenced by a placeholder: pin it right away.
        self._pinned.setdefault(session_id, set()).add(rid)
        self._evict()
        return rid

    def get(self, session_id: str, rid: str) -> str | None:
        """The content stored under ``rid`` for ``session_id``, or ``None``."""
        key = (session_id, rid)
        content = self._entries.get(key)
        if content is not None:
            self._entries.move_to_end(key)
        return content

    def pin(self, session_id: str, rids: Iterable[str]) -> None:
        """Mark exactly ``rids`` as still referenced by ``session_id``'s view."""
        self._pinned[session_id] = set(rids)
        self._evict()

    def __len__(self) -> int:
        return len(self._entries)

    def _evict(self) -> None:
        if self._bytes <= self.max_bytes:
            return
        for key in list(self._entries):
            if self._bytes <= self.max_bytes:
                break
            session, rid = key
            if rid in self._pinned.get(session, ()):
                continue
            self._bytes -= len(self._entries.pop(key))
