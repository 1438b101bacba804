"""`SQLiteRecallStore`: recall entries and ledgers in one SQLite file, the embedded default.

```python
store = SQLiteRecallStore("agent.db")          # durable; also keeps each session's ledger
async with ContextManager(budget, recall=store, session_id="run-42") as ctx: ...
```
"""

from __future__ import annotations

import sqlite3
import threading
from typing import TYPE_CHECKING

from agentctx.errors import StoreError
from agentctx.recall.store import recall_id

if TYPE_CHECKING:
    import os

__all__ = ["SQLiteRecallStore"]


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
