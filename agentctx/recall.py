"""Where cleared content goes, so the agent can fetch it back by id.

Ids are content-addressed and scoped by session: ``ctx-`` + 16 hex digits of a hash of the
session id and the content. The same content in the same session always gets the same id,
and one session can never name, let alone read, another session's entry.

```python
store = SQLiteRecallStore("agent.db")          # durable; also keeps each session's ledger
async with ContextManager(budget, recall=store, session_id="run-42") as ctx: ...
```
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from agentctx.errors import StoreError

if TYPE_CHECKING:
    import os
    from collections.abc import Iterable

__all__ = [
    "LedgerStore",
    "MemoryRecallStore",
    "RecallStore",
    "SQLiteRecallStore",
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


class SQLiteRecallStore:
    """A durable store in one SQLite file (WAL), safe for many sessions in one process.

    Also a `LedgerStore`: a new `ContextManager` with the same ``session_id`` resumes the
    session's decisions and renders the same view.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS recall (session TEXT NOT NULL, id TEXT NOT NULL, "
                "content TEXT NOT NULL, PRIMARY KEY (session, id)) WITHOUT ROWID"
            )
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS ledger (session TEXT PRIMARY KEY, json TEXT NOT NULL)"
            )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open recall store {self.path}: {exc}") from exc

    def put(self, session_id: str, content: str) -> str:
        """Store ``content`` for ``session_id`` and return its recall id."""
        rid = recall_id(session_id, content)
        self._run(
            "INSERT OR IGNORE INTO recall (session, id, content) VALUES (?, ?, ?)",
            (session_id, rid, content.encode("utf-8", "surrogatepass").decode("utf-8", "replace")),
        )
        return rid

    def get(self, session_id: str, rid: str) -> str | None:
        """The content stored under ``rid`` for ``session_id``, or ``None``."""
        row = self._run(
            "SELECT content FROM recall WHERE session = ? AND id = ?", (session_id, rid)
        )
        return row[0] if row else None

    def load_ledger(self, session_id: str) -> str | None:
        """The saved ledger JSON of ``session_id``, or ``None``."""
        row = self._run("SELECT json FROM ledger WHERE session = ?", (session_id,))
        return row[0] if row else None

    def save_ledger(self, session_id: str, ledger_json: str) -> None:
        """Save the ledger JSON of ``session_id``."""
        self._run(
            "INSERT INTO ledger (session, json) VALUES (?, ?) "
            "ON CONFLICT(session) DO UPDATE SET json = excluded.json",
            (session_id, ledger_json),
        )

    def close(self) -> None:
        """Close the database file."""
        with self._lock:
            self._db.close()

    def _run(self, sql: str, args: tuple[str, ...]) -> tuple[str, ...] | None:
        with self._lock:
            try:
                row: tuple[str, ...] | None = self._db.execute(sql, args).fetchone()
            except sqlite3.Error as exc:
                raise StoreError(f"recall store {self.path}: {exc}") from exc
        return row
