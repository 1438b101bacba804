"""`SQLiteRecallStore`: recall entries and ledgers in one SQLite file, the embedded default.

```python
store = SQLiteRecallStore("agent.db")          # durable; also keeps each session's ledger
async with ContextManager(budget, recall=store, session_id="run-42") as ctx: ...
```

The manager never calls it on the event loop: its writer runs each call in a worker thread
under a deadline, so a database another process holds locked only delays the writes (they
are retried), never the agent. A call waits at most ``timeout`` seconds for a lock, then
raises `StoreError`.

Content and ledgers are stored as UTF-8 bytes encoded with ``surrogatepass``, so what comes
back is exactly what was stored, lone surrogates included (a file name from `os.fsdecode`, a
half emoji cut out of JSON). Rows an older version wrote as text still read.

Before every write the store checks that its path still names the file it opened: a database
removed or replaced under a running session raises `StoreError` instead of silently writing
into an unlinked file nobody will ever read.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import urllib.parse
import weakref
from typing import TYPE_CHECKING

from agentctx._check import number, preview
from agentctx.errors import ConfigError, StoreDataError, StoreError
from agentctx.recall.store import recall_id, vouched

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["SQLiteRecallStore"]

# What SQLite says of a file that is not, or no longer, a database it can read: what trying
# again will not clear (`StoreDataError`).
_DAMAGED = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})


def _store_error(what: str, exc: Exception) -> StoreError:
    code = getattr(exc, "sqlite_errorcode", None)
    damaged = code is not None and code & 0xFF in _DAMAGED
    return (StoreDataError if damaged else StoreError)(f"{what}: {exc}")


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _session(session_id: str) -> str | bytes:
    """The key of ``session_id``: as text (what earlier versions wrote), or as bytes when it
    holds lone surrogates (a session named after a file, say), which text cannot carry."""
    try:
        session_id.encode("utf-8")
    except UnicodeEncodeError:
        return _encode(session_id)
    return session_id


def _reopen_in_child() -> None:
    """After ``fork``, in the child: each open store's own lock and connection, as SQLite
    forbids using the parent's (and a thread of the parent may have held the lock then,
    held for good in the child's copy). The file the store opened, never a new one: one
    removed since, or a store closed or in memory, keeps the connection it had (each call on
    a closed one raises `StoreError`; a database in memory lives only in its connection)."""
    for store in list(_OPEN):
        store._lock = threading.Lock()
        if store._closed or not store._file:
            continue
        # Never closed here (closing the last connection checkpoints the parent's file).
        _INHERITED.append(store._db)
        try:
            uri = "file:" + urllib.parse.quote(os.fsencode(store._file)) + "?mode=rw"
            store._db = store._connect(uri, uri=True)
        except sqlite3.Error:
            store._db = sqlite3.connect(":memory:", check_same_thread=False)
            store._db.close()


_OPEN: weakref.WeakSet[SQLiteRecallStore] = weakref.WeakSet()
_INHERITED: list[sqlite3.Connection] = []
os.register_at_fork(after_in_child=_reopen_in_child)


def _decode(value: bytes | str | None) -> str:
    # Values are read as BLOBs: a TEXT value that is not UTF-8 made SQLite's own decoding
    # fail as an OperationalError, a store "down" that trying again would never bring up.
    if isinstance(value, str):
        return value
    if value is None:  # a table of another schema, with no NOT NULL: no retry fills it
        raise StoreDataError("recall store holds NULL where text belongs (another schema?)")
    try:
        return bytes(value).decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as e:  # written by something else: a store error, not a crash
        raise StoreDataError(f"recall store holds a value that is not UTF-8 text: {e}") from e


def _file_name(name: str) -> bool:
    """Whether the OS takes ``name`` as a file name: no NUL, and (a lone surrogate) bytes."""
    try:
        return b"\0" not in os.fsencode(name)
    except UnicodeEncodeError:
        return False


class SQLiteRecallStore:
    """A durable store in one SQLite file (WAL), safe for many sessions in one process.

    Also a `LedgerStore`: a new `ContextManager` with the same ``session_id`` resumes the
    session's decisions and renders the same view. A child process made with ``fork`` may
    go on using the store (it opens its own connection at the fork).

    Args:
        path: the database file (created if missing).
        timeout: seconds a call waits for another connection's lock before `StoreError`.
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = 1.0) -> None:
        name = os.fspath(path) if isinstance(path, str | os.PathLike) else None
        if not isinstance(name, str) or not name or not _file_name(name):
            # SQLite opens "" as a private temporary database, gone at close.
            raise ConfigError(
                "SQLiteRecallStore path must name the database file (a str or os.PathLike of "
                f"str the OS takes as a file name); got {preview(path)}"
            )
        self.path = name
        self.timeout = timeout
        number(self, "timeout")
        self._lock = threading.Lock()
        try:
            self._db = self._connect()
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS recall (session TEXT NOT NULL, id TEXT NOT NULL, "
                "content TEXT NOT NULL, PRIMARY KEY (session, id)) WITHOUT ROWID"
            )
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS ledger (session TEXT PRIMARY KEY, json TEXT NOT NULL)"
            )
            # A ledger saved a decision at a time (`extend_ledger`), where a whole one is not.
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS ledger_part (session TEXT NOT NULL, n INTEGER NOT "
                "NULL, json TEXT NOT NULL, PRIMARY KEY (session, n)) WITHOUT ROWID"
            )
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS state (session TEXT PRIMARY KEY, json TEXT NOT NULL)"
            )
            self._file, self._identity = self._opened_file()
            self._wal: tuple[int, int] | None = None
        except sqlite3.Error as exc:
            raise _store_error(f"cannot open recall store {self.path}", exc) from exc
        self._closed = False
        _OPEN.add(self)

    def _connect(self, target: str | None = None, *, uri: bool = False) -> sqlite3.Connection:
        db = sqlite3.connect(
            self.path if target is None else target,
            timeout=self.timeout,
            check_same_thread=False,
            isolation_level=None,
            uri=uri,
        )
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        return db

    def put(self, session_id: str, content: str) -> str:
        """Store ``content`` for ``session_id`` and return its recall id."""
        return self.put_many(session_id, [content])[0]

    def put_many(self, session_id: str, contents: Sequence[str]) -> list[str]:
        """Store each of ``contents`` in one transaction; return their recall ids."""
        rids = [recall_id(session_id, c) for c in contents]
        session = _session(session_id)
        rows = [(session, rid, _encode(c)) for rid, c in zip(rids, contents, strict=True)]
        self._transaction(
            ("INSERT OR IGNORE INTO recall (session, id, content) VALUES (?, ?, ?)", rows)
        )
        return rids

    def get(self, session_id: str, rid: str) -> str | None:
        """The content stored under ``rid`` for ``session_id``, or ``None``."""
        row = self._run(
            "SELECT CAST(content AS BLOB) FROM recall WHERE session = ? AND id = ?",
            (_session(session_id), rid),
        )
        return None if row is None else vouched(session_id, rid, _decode(row[0]))

    def load_ledger(self, session_id: str) -> str | None:
        """The saved ledger JSON of ``session_id``, or ``None``."""
        session = _session(session_id)
        with self._lock:
            try:
                parts = self._db.execute(
                    "SELECT CAST(json AS BLOB) FROM ledger_part WHERE session = ? ORDER BY n",
                    (session,),
                ).fetchall()
                row = (
                    None
                    if parts
                    else self._db.execute(
                        "SELECT CAST(json AS BLOB) FROM ledger WHERE session = ?", (session,)
                    ).fetchone()
                )
            except (sqlite3.Error, UnicodeError) as exc:
                raise _store_error(f"recall store {self.path}", exc) from exc
        if parts:
            return "[" + ", ".join(_decode(part) for (part,) in parts) + "]"
        return None if row is None else _decode(row[0])

    def load_state(self, session_id: str) -> str | None:
        """The saved state JSON of ``session_id`` (`SessionStateStore`), or ``None``."""
        row = self._run(
            "SELECT CAST(json AS BLOB) FROM state WHERE session = ?", (_session(session_id),)
        )
        return None if row is None else _decode(row[0])

    def save_state(self, session_id: str, state_json: str) -> None:
        """Save the state JSON of ``session_id`` (`SessionStateStore`)."""
        self._transaction(
            (
                "INSERT INTO state (session, json) VALUES (?, ?) "
                "ON CONFLICT(session) DO UPDATE SET json = excluded.json",
                [(_session(session_id), _encode(state_json))],
            )
        )

    def save_ledger(self, session_id: str, ledger_json: str) -> None:
        """Save the ledger JSON of ``session_id``."""
        session = _session(session_id)
        self._transaction(
            ("DELETE FROM ledger_part WHERE session = ?", [(session,)]),
            (
                "INSERT INTO ledger (session, json) VALUES (?, ?) "
                "ON CONFLICT(session) DO UPDATE SET json = excluded.json",
                [(session, _encode(ledger_json))],
            ),
        )

    def extend_ledger(self, session_id: str, parts: Sequence[str], start: int) -> bool:
        """Save the ledger of ``session_id`` as its first ``start`` decisions as saved, then
        ``parts`` (one decision's JSON each), in one transaction: a save costs what the
        ledger added, not the whole ledger (`AppendingLedgerStore`). ``False``, with
        nothing written, when fewer than ``start`` are there (rows deleted since)."""
        session = _session(session_id)
        rows = [(session, start + k, _encode(part)) for k, part in enumerate(parts)]
        return self._transaction(
            ("DELETE FROM ledger WHERE session = ?", [(session,)]),
            ("DELETE FROM ledger_part WHERE session = ? AND n >= ?", [(session, start)]),
            ("INSERT INTO ledger_part (session, n, json) VALUES (?, ?, ?)", rows),
            check=(
                "SELECT COUNT(*) = ? FROM ledger_part WHERE session = ? AND n < ?",
                (start, session, start),
            ),
        )

    def forget(self, session_id: str) -> None:
        """Delete everything this store keeps of ``session_id`` (its entries, ledger and
        state), to end it for good or as its data must go. Not while a worker runs the
        session: what it writes next is kept again."""
        rows = [(_session(session_id),)]
        tables = ("recall", "ledger", "ledger_part", "state")
        self._transaction(*((f"DELETE FROM {t} WHERE session = ?", rows) for t in tables))

    def close(self) -> None:
        """Close the database file."""
        with self._lock:
            self._closed = True
            self._db.close()

    def _opened_file(self) -> tuple[str, tuple[int, int] | None]:
        """The file SQLite opened, as it names it (absolute, and the one a ``file:`` URI
        names, which this build reads), so neither a later chdir nor a URI hides it; and its
        identity. No file for a database in memory."""
        # As bytes: a file name need not be UTF-8 (the path it was opened by may not be).
        self._db.text_factory = bytes
        try:
            row = self._db.execute("PRAGMA database_list").fetchone()
        finally:
            self._db.text_factory = str
        file = os.fsdecode(row[2]) if row else ""
        try:
            st = os.stat(file) if file else None
        except OSError:
            st = None
        return file, None if st is None else (st.st_dev, st.st_ino)

    def _check_file(self) -> None:
        """Raise `StoreError` when the path no longer names the file this store opened, or
        its write-ahead log: SQLite would go on writing into a file nobody will read. Two
        ``stat`` calls, a few microseconds, per write. (Never a descriptor of the file of
        its own: closing one drops every POSIX lock the process holds on the file, SQLite's
        too. Nor its size: a VACUUM elsewhere shrinks it as much as a file cut short does,
        which SQLite tells when it reads the pages that are gone.)"""
        if self._identity is None:
            return
        try:
            st = os.stat(self._file)
        except OSError as exc:
            raise StoreError(
                f"recall store {self.path}: the database file was removed while in use ({exc})"
            ) from exc
        if (st.st_dev, st.st_ino) != self._identity:
            raise StoreError(
                f"recall store {self.path}: the database file was replaced while in use"
            )
        try:
            wal = os.stat(self._file + "-wal")
        except OSError:
            if self._wal is not None:
                raise StoreError(
                    f"recall store {self.path}: its write-ahead log ({self._file}-wal) was "
                    "removed while in use"
                ) from None
            return
        if self._wal is None:
            self._wal = (wal.st_dev, wal.st_ino)
        elif (wal.st_dev, wal.st_ino) != self._wal:
            raise StoreError(
                f"recall store {self.path}: its write-ahead log ({self._file}-wal) was "
                "replaced while in use"
            )

    def _transaction(
        self,
        *steps: tuple[str, Sequence[tuple[object, ...]]],
        check: tuple[str, tuple[object, ...]] | None = None,
    ) -> bool:
        """Run each statement over its rows, all in one write transaction; ``False``, with
        nothing written, when the ``check`` query (run first) answers false."""
        with self._lock:
            self._check_file()
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    if check is not None and not self._db.execute(*check).fetchone()[0]:
                        self._db.execute("ROLLBACK")
                        return False
                    for sql, rows in steps:
                        self._db.executemany(sql, rows)
                    self._db.execute("COMMIT")
                except BaseException:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    raise
            except (sqlite3.Error, UnicodeError) as exc:
                raise _store_error(f"recall store {self.path}", exc) from exc
        return True

    def _run(self, sql: str, args: tuple[str | bytes, ...]) -> tuple[str | bytes, ...] | None:
        with self._lock:
            try:
                row: tuple[str | bytes, ...] | None = self._db.execute(sql, args).fetchone()
            except (sqlite3.Error, UnicodeError) as exc:
                raise _store_error(f"recall store {self.path}", exc) from exc
        return row
