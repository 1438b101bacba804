"""Recall stores that fail: the agent never waits on them, never stops for them, and loses
nothing a store kept.

Each fault runs a real store under a live session: SQLite locked by another process (a real
``BEGIN EXCLUSIVE`` in a subprocess), its file removed, its file made read-only; a real
``redis-server`` frozen (SIGSTOP/SIGCONT) and killed then restarted on the same port. Every
``prepare()`` is timed and the event loop is watched by a heartbeat; every view is checked;
the events must say what degraded and what recovered; after recovery every recall id the
final view names resolves in a fresh client, references included. Then regressions for what a
hostile tester found: a failed ledger save caught up (item 2), files removed or replaced
(4), lone surrogates (4, 7), decision cost independent of history length (10), stored bytes
and `MemoryRecallStore`'s bound (11).
"""

from __future__ import annotations

import cProfile
import json
import os
import pstats
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest
import redis

from agentctx import (
    Budget,
    CompactionWarning,
    ConfigError,
    ContextManager,
    Event,
    Ledger,
    MemoryRecallStore,
    SQLiteRecallStore,
    StoreDataError,
    StoreDegraded,
    StoreError,
    StoreRecovered,
)
from agentctx.ledger import ReplaceResult, ReplaceSpan, anchor
from agentctx.messages import (
    AssistantMessage,
    Message,
    SummaryMessage,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    canonical_json,
    text_of,
    to_dict,
)
from agentctx.recall.redis import RedisRecallStore
from agentctx.recall.store import expand_references, recall_id, references
from agentctx.recall.writer import RecallWriter
from agentctx.strategies import ToolOutputPipeline
from agentctx.testing import assert_view_ok, synthetic_session

from .test_recall_redis import free_port

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

RID = re.compile(r"ctx-[0-9a-f]{16}")
STALL = 0.3  # seconds; a store call on the loop would take 1-2 s (its timeout, the deadline)
BUDGET = Budget(context_window=12_000, reserve_output=2_000)


# -- the session under a fault ----------------------------------------------------------


def manager(store: Any, session: str) -> ContextManager:
    return ContextManager(BUDGET, recall=store, session_id=session, on_over_budget="send")


async def wait_until(done: Callable[[], bool], seconds: float) -> bool:
    """Whether ``done()`` came true within ``seconds`` (polled every 50 ms)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if done():
            return True
        await anyio.sleep(0.05)
    return done()


@dataclass
class Outcome:
    stalls: list[float] = field(default_factory=list)  # wall time of each prepare()
    lag: float = 0.0  # the event loop's longest stall, as a 5 ms heartbeat saw it
    events: list[Event] = field(default_factory=list)
    view: list[Message] = field(default_factory=list)
    ledger_json: str = ""

    def store_events(self) -> list[tuple[str, str]]:
        return [
            (type(e).__name__, e.reason if isinstance(e, StoreDegraded) else "")
            for e in self.events
            if isinstance(e, StoreDegraded | StoreRecovered)
        ]


async def run_session(
    store: Any,
    session: str,
    *,
    fault: Callable[[], None],
    recover: Callable[[], None] | None,
    calls: int = 70,
    fault_at: int = 20,
    recover_at: int = 45,
) -> Outcome:
    """A seeded session in owned mode, a model call (50 ms) between prepares; ``fault`` runs
    before call ``fault_at``, ``recover`` before ``recover_at`` once the outage is reported
    (up to 15 s); then up to 15 s for the writer to catch up, and the close."""
    out = Outcome()

    def degraded() -> bool:
        return any(isinstance(e, StoreDegraded) for e in out.events)

    async with ContextManager(
        BUDGET, recall=store, session_id=session, on_over_budget="send"
    ) as ctx:
        ctx.subscribe(out.events.append)
        async with anyio.create_task_group() as tg:
            done = anyio.Event()

            async def heartbeat() -> None:
                while not done.is_set():
                    t0 = time.perf_counter()
                    await anyio.sleep(0.005)
                    out.lag = max(out.lag, time.perf_counter() - t0 - 0.005)

            # Not the store's doing either: anyio's thread pool starts on its first call.
            # (structlog, which a first log line would import, is imported as the manager
            # starts, since pytest's handlers hear the agentctx logger.)
            await anyio.to_thread.run_sync(lambda: None)
            tg.start_soon(heartbeat)
            view: list[Message] = []
            for n, group in enumerate(synthetic_session(5, calls, mean_output_lines=30)):
                if n == fault_at:
                    await anyio.to_thread.run_sync(fault)
                if n == recover_at and recover is not None:
                    # The outage lasts until the manager has reported it: how many calls that
                    # takes depends on how fast they are, against the store's own timeouts.
                    await wait_until(degraded, 15)
                    await anyio.to_thread.run_sync(recover)
                t0 = time.perf_counter()
                view = await ctx.prepare([*view, *group])
                out.stalls.append(time.perf_counter() - t0)
                assert_view_ok(view, ctx.raw)
                await anyio.sleep(0.05)
            if recover is not None:
                await wait_until(lambda: any(isinstance(e, StoreRecovered) for e in out.events), 15)
            done.set()
        out.view, out.ledger_json = view, ctx.ledger.to_json()
    return out


def assert_never_stalled(out: Outcome) -> None:
    worst = max(out.stalls)
    print(f"prepare() max {worst * 1000:.0f} ms, loop lag max {out.lag * 1000:.0f} ms")
    assert worst < STALL, f"prepare() took {worst:.2f} s"
    assert out.lag < STALL, f"the event loop stalled {out.lag:.2f} s"


def assert_everything_resolves(store: Any, session: str, out: Outcome) -> int:
    """Every recall id the final view names is in ``store``, and so is everything its entry
    refers to; the store holds the session's latest ledger."""
    ids = {rid for m in out.view for rid in RID.findall(canonical_json(m))}
    assert ids, "the session should have cleared something"
    for rid in ids:
        content = store.get(session, rid)
        assert content is not None, rid
        assert "not kept]" not in expand_references(content, lambda r: store.get(session, r))
    assert store.load_ledger(session) == out.ledger_json
    return len(ids)


# -- SQLite ------------------------------------------------------------------------------

_HOLD_LOCK = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
sys.stdin.readline()
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.readline()
db.execute("COMMIT")
"""


class Locker:
    """Another process that holds the database's write lock from `lock` to `release` (started
    beforehand: a fork mid-session would hold the loop's GIL for a while)."""

    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HOLD_LOCK, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout

    def lock(self) -> None:
        self.stdin.write("lock\n")
        self.stdin.flush()
        assert self.stdout.readline().strip() == "locked"

    def release(self) -> None:
        self.stdin.write("release\n")
        self.stdin.close()
        assert self.proc.wait(timeout=10) == 0
        self.stdout.close()


async def test_sqlite_locked_by_another_process(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    store = SQLiteRecallStore(path)
    locker = Locker(path)
    out = await run_session(store, "locked", fault=locker.lock, recover=locker.release)
    assert_never_stalled(out)
    assert out.store_events() == [("StoreDegraded", "unavailable"), ("StoreRecovered", "")]
    degraded = next(e for e in out.events if isinstance(e, StoreDegraded))
    assert "locked" in degraded.detail and degraded.store == "SQLiteRecallStore"
    store.close()
    assert assert_everything_resolves(SQLiteRecallStore(path), "locked", out) > 3


async def test_sqlite_file_removed_mid_session(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    store = SQLiteRecallStore(path)

    def remove() -> None:
        for p in tmp_path.glob("agent.db*"):
            p.unlink()

    out = await run_session(store, "removed", fault=remove, recover=None)
    assert_never_stalled(out)
    # said once when it started, and what the close could not write; never written silently
    # into the unlinked file
    assert out.store_events() == [("StoreDegraded", "unavailable"), ("StoreDegraded", "closed")]
    first, closed = (e for e in out.events if isinstance(e, StoreDegraded))
    assert "removed" in first.detail
    assert closed.lost and closed.ledger_unsaved
    with pytest.raises(StoreError, match="removed"):
        store.put("removed", "more")
    store.close()


async def test_sqlite_file_made_read_only(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    store = SQLiteRecallStore(path)
    files = [path, tmp_path / "agent.db-wal"]  # never -shm: it is mapped, writes to it fault

    def chattr(flag: str) -> bool:
        done = [subprocess.run(["chattr", flag, str(f)], capture_output=True) for f in files]
        return all(r.returncode == 0 for r in done)

    def read_only() -> None:
        # Root writes through a chmod, so the file is made immutable; where chattr is not
        # available, the connection is told the database is read-only.
        if shutil.which("chattr") is None or not chattr("+i"):
            store._db.execute("PRAGMA query_only = ON")

    def writable() -> None:
        chattr("-i")
        store._db.execute("PRAGMA query_only = OFF")

    try:
        out = await run_session(store, "ro", fault=read_only, recover=writable)
    finally:
        chattr("-i")
    assert_never_stalled(out)
    assert out.store_events() == [("StoreDegraded", "unavailable"), ("StoreRecovered", "")]
    store.close()
    assert assert_everything_resolves(SQLiteRecallStore(path), "ro", out) > 3


# -- Redis -------------------------------------------------------------------------------


class RedisServer:
    """A ``redis-server`` on 127.0.0.1 that keeps its data across a restart (AOF, fsync'd)."""

    def __init__(self, directory: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed (./scripts/test installs it)")
        self.binary, self.dir, self.port = binary, directory, free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
            + ["--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.dir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url)
        try:
            for _ in range(500):
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    time.sleep(0.02)
            pytest.fail("redis-server did not start")
        finally:
            client.close()

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.proc.terminate()
            self.proc.wait(timeout=10)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    s = RedisServer(tmp_path)
    s.start()
    yield s
    s.stop()


async def test_redis_frozen_then_thawed(server: RedisServer) -> None:
    store = RedisRecallStore(server.url, prefix="frozen")
    out = await run_session(
        store,
        "s",
        fault=lambda: server.signal(signal.SIGSTOP),
        recover=lambda: server.signal(signal.SIGCONT),
    )
    assert_never_stalled(out)
    assert out.store_events() == [("StoreDegraded", "unavailable"), ("StoreRecovered", "")]
    store.close()
    fresh = RedisRecallStore(server.url, prefix="frozen")
    assert assert_everything_resolves(fresh, "s", out) > 3
    fresh.close()


async def test_redis_killed_then_restarted_on_the_same_port(server: RedisServer) -> None:
    store = RedisRecallStore(server.url, prefix="restart")
    out = await run_session(store, "s", fault=server.kill, recover=server.start)
    assert_never_stalled(out)
    assert out.store_events() == [("StoreDegraded", "unavailable"), ("StoreRecovered", "")]
    store.close()
    fresh = RedisRecallStore(server.url, prefix="restart")
    assert assert_everything_resolves(fresh, "s", out) > 3
    fresh.close()


async def test_recall_while_the_store_is_down_answers_the_model(server: RedisServer) -> None:
    store = RedisRecallStore(server.url, prefix="down")
    async with ContextManager(BUDGET, recall=store, session_id="s", on_over_budget="send") as ctx:
        read, rid = store.put("s", "read before"), store.put("s", "kept before the outage")
        assert "read before" in await ctx.recall(read)
        server.signal(signal.SIGSTOP)
        try:
            t0 = time.perf_counter()
            answer = await ctx.handle_recall({"id": rid})
            assert time.perf_counter() - t0 < 3  # the deadline, not a hang
        finally:
            server.signal(signal.SIGCONT)
        assert answer.startswith("[recall_context] the recall store is unavailable right now")
        assert "kept before the outage" in await ctx.recall(rid)
    store.close()


# -- item 2: a failed ledger save is caught up --------------------------------------------


class Flaky:
    """A SQLite store whose writes fail while ``down`` (and count the ledger saves)."""

    def __init__(self, path: Path) -> None:
        self.inner = SQLiteRecallStore(path)
        self.down = False
        self.saves = 0

    def _check(self) -> None:
        if self.down:
            raise StoreError("database is locked (injected)")

    def put(self, session_id: str, content: str) -> str:
        self._check()
        return self.inner.put(session_id, content)

    def get(self, session_id: str, rid: str) -> str | None:
        return self.inner.get(session_id, rid)

    def load_ledger(self, session_id: str) -> str | None:
        return self.inner.load_ledger(session_id)

    def save_ledger(self, session_id: str, ledger_json: str) -> None:
        self._check()
        self.saves += 1
        self.inner.save_ledger(session_id, ledger_json)


async def test_a_failed_ledger_save_is_caught_up_without_a_new_decision(tmp_path: Path) -> None:
    store = Flaky(tmp_path / "agent.db")
    groups = synthetic_session(2, 60, mean_output_lines=30)
    events: list[Event] = []
    async with ContextManager(BUDGET, recall=store, session_id="s", on_over_budget="send") as ctx:
        ctx.subscribe(events.append)
        view: list[Message] = []
        for group in groups[:40]:
            view = await ctx.prepare([*view, *group])
            await anyio.sleep(0.01)
        assert len(ctx.ledger) > 3
        store.down = True
        for group in groups[40:]:  # decisions taken while every save fails
            view = await ctx.prepare([*view, *group])
            await anyio.sleep(0.01)
        decided = ctx.ledger.to_json()
        assert store.load_ledger("s") != decided
        store.down = False
        # No new decision from here on: what is unsaved is saved anyway, in the background.
        assert await wait_until(lambda: store.load_ledger("s") == decided, 10)
        assert ctx.ledger.to_json() == decided
    assert [type(e).__name__ for e in events if isinstance(e, StoreDegraded | StoreRecovered)] == [
        "StoreDegraded",
        "StoreRecovered",
    ]
    # a restarted worker resumes every decision
    async with ContextManager(BUDGET, recall=store, session_id="s", on_over_budget="send") as again:
        assert again.ledger.to_json() == decided


async def test_without_async_with_writes_run_inline_and_say_so(tmp_path: Path) -> None:
    store = SQLiteRecallStore(tmp_path / "agent.db")
    ctx = ContextManager(BUDGET, recall=store, session_id="s", on_over_budget="send")
    events: list[Event] = []
    ctx.subscribe(events.append)
    view: list[Message] = []
    for group in synthetic_session(2, 40, mean_output_lines=30):
        view = await ctx.prepare([*view, *group])
    assert len(ctx.ledger) > 3 and store.load_ledger("s") == ctx.ledger.to_json()
    warnings = [e for e in events if isinstance(e, CompactionWarning)]
    assert [w.code for w in warnings] == ["no_task_group"]
    await ctx.aclose()
    store.close()


# -- item 4: a removed or replaced file, exact round trips ---------------------------------


def test_sqlite_notices_its_file_removed_or_replaced(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    store = SQLiteRecallStore(path)
    rid = store.put("s", "before")
    path.unlink()
    with pytest.raises(StoreError, match="removed"):
        store.put("s", "after")
    with pytest.raises(StoreError, match="removed"):
        store.save_ledger("s", "[]")
    assert store.get("s", rid) == "before"  # reads go on from the open file
    store.close()
    other = SQLiteRecallStore(tmp_path / "other.db")
    other.close()
    store = SQLiteRecallStore(path)
    os.replace(tmp_path / "other.db", path)
    with pytest.raises(StoreError, match="replaced"):
        store.put("s", "after")
    store.close()


def test_sqlite_notices_its_write_ahead_log_removed_or_replaced(tmp_path: Path) -> None:
    """(Hostile run EC, 1) Only the database file was checked: with its -wal file removed
    (a clean-up of stray files), writes went on into the unlinked log, with no event; the
    next connection to open the file found none of them, nor what the log held before."""
    path = tmp_path / "agent.db"
    store = SQLiteRecallStore(path)
    store.put("s", "before")
    (tmp_path / "agent.db-wal").unlink()
    with pytest.raises(StoreError, match="write-ahead log .* removed"):
        store.put("s", "after")
    store.close()
    store = SQLiteRecallStore(path)
    store.put("s", "before")
    os.replace(tmp_path / "agent.db-shm", tmp_path / "agent.db-wal")  # another file there
    with pytest.raises(StoreError, match="write-ahead log .* replaced"):
        store.put("s", "after")
    store.close()


@pytest.mark.parametrize("damage", ["cut short", "overwritten"])
def test_sqlite_damaged_in_place_is_unreadable_for_the_next_reader(
    tmp_path: Path, damage: str
) -> None:
    """(Hostile run EC, 2) A file cut short or overwritten in place (the same file, so the
    identity check passes) is noticed when SQLite reads the pages that changed: what it
    holds then cannot be read however often one tries, `StoreDataError`, not `StoreError`."""
    path = tmp_path / "agent.db"
    store = SQLiteRecallStore(path)
    rid = store.put("s", "before")
    store.close()  # the last connection: what the log held is in the file
    with path.open("r+b") as f:
        if damage == "cut short":
            f.truncate(1024)
        else:
            f.write(os.urandom(path.stat().st_size))
    with pytest.raises(StoreDataError):
        SQLiteRecallStore(path).get("s", rid)


def test_a_vacuum_elsewhere_is_no_fault(tmp_path: Path) -> None:
    """(Hostile run ED, 1) The file's size was checked at each write: a VACUUM from another
    connection, which shrinks the file and loses nothing, was said to have cut it short."""
    path = tmp_path / "agent.db"
    store = SQLiteRecallStore(path)
    kept = store.put("s", "kept")
    for k in range(200):
        store.put("old", f"entry {k} " + "x" * 4000)
    store.forget("old")
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the pages are in the file
    store.put("s", "between")
    other.execute("VACUUM")
    other.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the file shrinks
    other.close()
    store.put("s", "after")  # no StoreError
    assert store.get("s", kept) == "kept"
    store.close()


async def test_a_damaged_sqlite_file_is_unreadable_not_unavailable(tmp_path: Path) -> None:
    """(Hostile run EC, 2) A worker resuming a malformed file was told its ledger was
    unavailable (and the model told to try a recall again later): what trying again will
    not clear is `StoreDataError`, and such a ledger ``ledger_unreadable``."""
    path = tmp_path / "agent.db"
    history: list[Message] = []
    for group in synthetic_session(2, 40, mean_output_lines=30):
        history += group
    first = SQLiteRecallStore(path)
    async with ContextManager(BUDGET, recall=first, session_id="s") as ctx:
        view = await ctx.prepare(history)
    first.close()  # the last connection: what the log held is in the file now
    assert RID.search("".join(map(canonical_json, view)))  # decisions were saved
    with path.open("r+b") as f:  # the pages after the first two: garbage
        f.seek(8192)
        f.write(b"\xff" * (path.stat().st_size - 8192))
    warnings: list[CompactionWarning] = []
    store = SQLiteRecallStore(path)
    async with ContextManager(BUDGET, recall=store, session_id="s") as resumed:
        resumed.subscribe(
            lambda e: warnings.append(e) if isinstance(e, CompactionWarning) else None
        )
        await resumed.prepare(history)
    assert [w.code for w in warnings][:1] == ["ledger_unreadable"], warnings
    with pytest.raises(StoreDataError, match="malformed"):
        store.load_ledger("s")
    store.close()


@pytest.mark.parametrize("named", ["file: URI", "relative path, then chdir"])
def test_sqlite_notices_its_file_removed_however_it_was_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, named: str
) -> None:
    """Found by hostile testing: a path starting with ``file:`` (which this SQLite reads as a
    URI) turned the check off, and writes went on into the unlinked file: no
    `StoreDegraded`, no ledger for the next worker. A relative path was checked against
    the working directory of the moment."""
    monkeypatch.chdir(tmp_path)
    store = SQLiteRecallStore("file:agent.db" if named == "file: URI" else "agent.db")
    store.put("s", "before")
    if named != "file: URI":
        (tmp_path / "elsewhere").mkdir()
        monkeypatch.chdir(tmp_path / "elsewhere")
        store.put("s", "still there")  # the file did not go anywhere
    (tmp_path / "agent.db").unlink()
    with pytest.raises(StoreError, match="removed"):
        store.save_ledger("s", "[]")
    store.close()
    in_memory = SQLiteRecallStore(":memory:")  # nothing to check
    assert in_memory.put("s", "x") and in_memory.save_ledger("s", "[]") is None
    in_memory.close()


def test_sqlite_gives_back_exactly_what_it_stored(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    store = SQLiteRecallStore(path)
    name = os.fsdecode(b"caf\xe9.py")
    text = f"{name}: half an emoji \ud83d, ✓"
    session = os.fsdecode(b"run-\xff")  # a session named after a file
    rid = store.put(session, text)
    assert store.get(session, rid) == text
    assert store.get(session.replace("\udcff", "\\udcff"), rid) is None
    store.save_ledger(session, json.dumps([{"x": text}], ensure_ascii=False))
    assert json.loads(store.load_ledger(session) or "")[0]["x"] == text
    store.close()
    # rows an earlier version wrote as text still read
    db = sqlite3.connect(path)
    db.execute("INSERT INTO recall VALUES ('old', ?, 'legacy ✓')", (recall_id("old", "legacy ✓"),))
    db.execute("INSERT INTO ledger VALUES ('old', '[]')")
    db.commit()
    db.close()
    store = SQLiteRecallStore(path)
    assert store.get("old", recall_id("old", "legacy ✓")) == "legacy ✓"
    assert store.load_ledger("old") == "[]"
    store.close()


# -- item 7: lone surrogates through a whole session, per store ---------------------------


def surrogate_session(turns: int = 12) -> list[list[Message]]:
    name = os.fsdecode(b"caf\xe9.py")  # what os.fsdecode makes of a Latin-1 file name
    groups: list[list[Message]] = [[UserMessage.of(f"Task: fix src/{name}")]]
    for n in range(1, turns):
        path = f"src/{name}_{n}"
        out = "\n".join(f"{path}:{i}: half an emoji \ud83d in {name}" for i in range(400))
        groups.append(
            [
                AssistantMessage((ToolCall(f"c{n}", "read", {"path": path}),), "tool_use"),
                ToolResultMessage(f"c{n}", (TextBlock(out),), "read"),
            ]
        )
    return groups


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
async def test_lone_surrogates_never_break_a_session(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if kind == "sqlite":
        store: Any = SQLiteRecallStore(tmp_path / "agent.db")
    else:
        store = RedisRecallStore(request.getfixturevalue("server").url, prefix="sur")
    session = os.fsdecode(b"run-\xff")
    events: list[Event] = []
    async with ContextManager(
        BUDGET, recall=store, session_id=session, on_over_budget="send"
    ) as ctx:
        ctx.subscribe(events.append)
        view: list[Message] = []
        for group in surrogate_session():
            view = await ctx.prepare([*view, *group])
            assert_view_ok(view, ctx.raw)
    assert not [e for e in events if isinstance(e, StoreDegraded)]
    checked = 0
    for d in ctx.ledger.decisions:
        if isinstance(d, ReplaceResult) and d.recall_id:
            assert store.get(session, d.recall_id) == text_of(ctx.raw[d.at.index].content)  # type: ignore[union-attr]
            checked += 1
    assert checked > 3
    assert Ledger.from_json(store.load_ledger(session)).to_json() == ctx.ledger.to_json()
    store.close()


# -- item 10: a decision costs what it touches, not the length of the history --------------


def long_history(n: int, store: MemoryRecallStore) -> tuple[list[Message], Ledger]:
    """``n`` messages, almost all behind one dropped span, each result cleared with a recall id
    (as a long session leaves them), and the store holding those entries."""
    raw: list[Message] = [UserMessage.of("Task: keep the cache fast")]
    k = 0
    while len(raw) < n - 4:
        raw += [
            AssistantMessage((ToolCall(f"c{k}", "read", {"path": f"src/f{k}.py"}),), "tool_use"),
            ToolResultMessage(f"c{k}", (TextBlock(f"contents of src/f{k}.py\n" * 20),), "read"),
        ]
        k += 1
    ledger = Ledger()
    for i, m in enumerate(raw):
        if isinstance(m, ToolResultMessage):
            rid = store.put("s", text_of(m.content))
            ledger.add(ReplaceResult(anchor(raw, i), (TextBlock(f"[cleared {rid}]"),), "x", rid))
    end = len(raw)
    ledger.add(ReplaceSpan(anchor(raw, 1), end, anchor(raw, end - 1), (SummaryMessage("."),), "x"))
    raw += [AssistantMessage.of("done"), UserMessage.of("next step")]
    return raw, ledger


async def decision_calls(n: int) -> int:
    """Python function calls (a count of work that does not depend on the machine's load) of
    five prepare() calls that each take a decision (a truncation), ``n`` raw messages and n/2
    ledger decisions in."""
    store = MemoryRecallStore(max_bytes=64 * 1024 * 1024)
    raw, ledger = long_history(n, store)
    budget = Budget(context_window=6_000, reserve_output=1_000)
    profile = cProfile.Profile()
    async with ContextManager(budget, recall=store, session_id="s", ledger=ledger) as ctx:
        history = await ctx.prepare(raw)
        for k in range(5):
            big = "\n".join(f"line {i} of output {k}" for i in range(2_000))
            history = [
                *history,
                AssistantMessage((ToolCall(f"x{k}", "bash", {"command": "make"}),), "tool_use"),
                ToolResultMessage(f"x{k}", (TextBlock(big),), "bash"),
            ]
            decisions = len(ctx.ledger)
            profile.enable()
            history = await ctx.prepare(history)
            profile.disable()
            assert len(ctx.ledger) > decisions  # this call decided
    return int(pstats.Stats(profile).total_calls)  # type: ignore[attr-defined]


async def test_decision_cost_does_not_grow_with_history() -> None:
    # Before: 190 ms at 10k, 630-810 ms at 30k (the whole ledger serialized and scanned for
    # ids on every decision, the memory store scanning every entry per put); then the newest
    # complete turn read from the whole raw history on every look (445k calls at 10k, 1.3M at
    # 30k). Counted, not timed: a timed test fails on a busy machine.
    short, long = await decision_calls(10_000), await decision_calls(30_000)
    print(f"five deciding prepare() calls: {short} function calls at 10k messages, {long} at 30k")
    assert long < 1.5 * short


# -- item 11: stored bytes and the memory store's bound ------------------------------------


async def test_recall_stores_each_raw_message_about_once() -> None:
    store = MemoryRecallStore(max_bytes=1 << 40)
    budget = Budget(context_window=20_000, reserve_output=2_000)
    async with ContextManager(budget, recall=store, session_id="s", on_over_budget="send") as ctx:
        view: list[Message] = []
        for group in synthetic_session(7, 600, mean_output_lines=40):
            view = await ctx.prepare([*view, *group])
        raw_bytes = sum(len(json.dumps(to_dict(m), ensure_ascii=False)) for m in ctx.raw)
        ids = {rid for m in view for rid in RID.findall(canonical_json(m))}
        # and every id the view names still gives back whole originals
        for rid in list(ids)[:20]:
            assert "not kept]" not in await ctx.recall(rid, limit=2**62)
    print(f"stored {store.bytes_held / raw_bytes:.2f}x the raw history")
    assert store.bytes_held < 1.5 * raw_bytes


async def test_memory_store_honours_its_bound_across_sessions() -> None:
    store = MemoryRecallStore(max_bytes=200_000)
    largest = 0
    warnings: list[str] = []
    for n in range(3):
        budget = Budget(context_window=12_000, reserve_output=2_000)
        async with ContextManager(
            budget, recall=store, session_id=f"s{n}", on_over_budget="send"
        ) as ctx:
            ctx.subscribe(
                lambda e: warnings.append(e.code) if isinstance(e, CompactionWarning) else None
            )
            view: list[Message] = []
            for group in synthetic_session(n, 150, mean_output_lines=40):
                view = await ctx.prepare([*view, *group])
                entries = [*store._free.values(), *store._held.values()]
                largest = max([largest, *map(sys.getsizeof, entries)])
                assert store.bytes_held <= store.max_bytes + largest
    assert store.bytes_held <= store.max_bytes + largest
    assert store._pins == {} and not store._held  # closed sessions pin nothing
    # what the sessions referenced did not fit: said once per session that saw it happen
    assert store.evicted_pinned > 0 and 1 <= warnings.count("recall_evicted") <= 3


async def test_proposals_nobody_took_are_neither_kept_nor_pinned() -> None:
    store = MemoryRecallStore(max_bytes=30_000)
    pipeline = ToolOutputPipeline(clear_at_least=10**9)  # proposes, never takes
    budget = Budget(context_window=200_000)
    async with ContextManager(budget, strategy=pipeline, recall=store, session_id="s") as ctx:
        view: list[Message] = []
        for group in synthetic_session(1, 80, mean_output_lines=40):
            view = await ctx.prepare([*view, *group])
        assert len(ctx.ledger) == 0
        assert store.bytes_held == 0 and not store._pins


def test_memory_store_evicts_in_constant_time_and_pins_incrementally() -> None:
    store = MemoryRecallStore(max_bytes=100_000)
    pinned = [store.put("s", f"pinned {i} " * 100) for i in range(20)]
    store.update_pins("s", pinned, ())
    t0 = time.perf_counter()
    for i in range(20_000):
        store.put("s", f"free {i} " * 100)
    assert time.perf_counter() - t0 < 2  # was a scan of every entry per put
    assert all(store.get("s", r) is not None for r in pinned)
    assert store.bytes_held <= store.max_bytes + 1_000
    store.update_pins("s", (), pinned[:10])
    store.release("s")
    assert store._pins == {}


# -- the writer itself ---------------------------------------------------------------------


def test_the_ledger_the_writer_saves_is_the_ledgers_json(tmp_path: Path) -> None:
    store = SQLiteRecallStore(tmp_path / "agent.db")
    raw, ledger = long_history(40, MemoryRecallStore())
    writer = RecallWriter(store, "s", emit=lambda e: None, ledger=Ledger())
    writer.record(ledger, ())  # another ledger: taken whole
    writer.settle(None)
    assert store.load_ledger("s") == ledger.to_json()
    ledger.drop_from(20)  # a resync
    writer.record(ledger, ())
    writer.settle(None)
    assert store.load_ledger("s") == ledger.to_json()
    store.close()


async def test_an_overflowing_buffer_drops_the_oldest_and_says_so(tmp_path: Path) -> None:
    store = Flaky(tmp_path / "agent.db")
    store.down = True
    events: list[Event] = []
    async with ContextManager(BUDGET, recall=store, session_id="s", on_over_budget="send") as ctx:
        ctx.subscribe(events.append)
        assert ctx._writer is not None
        ctx._writer.max_pending_bytes = 20_000
        view: list[Message] = []
        for group in synthetic_session(3, 60, mean_output_lines=30):
            view = await ctx.prepare([*view, *group])
            await anyio.sleep(0.001)  # the model call: the writer tries, and finds it down
        overflow = [e for e in events if isinstance(e, StoreDegraded) and e.reason == "overflow"]
        assert overflow
        lost = overflow[0].lost[0]
        assert "not recallable: it was dropped before the recall store took it" in await ctx.recall(
            lost
        )
    closed = [e for e in events if isinstance(e, StoreDegraded) and e.reason == "closed"]
    assert len(closed) == 1 and closed[0].ledger_unsaved and closed[0].lost


async def test_one_call_clearing_more_than_the_bound_is_all_written_to_a_working_store(
    tmp_path: Path,
) -> None:
    """Found by a hostile run (BT store 2): the bound on unwritten entries, meant for an
    outage, applied to a healthy store too: a call clearing more than it dropped the oldest
    entries before any write was tried, and their recalls said the store was unavailable."""
    store = SQLiteRecallStore(tmp_path / "agent.db")
    events: list[Event] = []
    async with ContextManager(BUDGET, recall=store, session_id="s", on_over_budget="send") as ctx:
        ctx.subscribe(events.append)
        assert ctx._writer is not None
        ctx._writer.max_pending_bytes = 20_000
        history: list[Message] = [
            m for g in synthetic_session(3, 60, mean_output_lines=30) for m in g
        ]
        view = await ctx.prepare(history)  # one call: everything it clears at once
        assert ctx._writer._ready_bytes > 20_000  # more than the bound, pending
        assert await ctx._writer.flush()
        ids = {rid for m in view for rid in RID.findall(canonical_json(m))}
        assert len(ids) > 5
        for rid in ids:
            assert "not recallable" not in await ctx.recall(rid)
    assert not [e for e in events if isinstance(e, StoreDegraded)]


async def test_what_a_loop_that_never_yields_leaves_unwritten_stays_bounded(
    tmp_path: Path,
) -> None:
    """Found by a hostile run (BU 3), of the fix above: with the bound applied only while the
    store was down, a working store the loop never gave a turn to write (a replay awaiting
    nothing else), or one slower than the calls, had the writer hold without limit."""
    store = SQLiteRecallStore(tmp_path / "agent.db")
    events: list[Event] = []
    history: list[Message] = [UserMessage.of("task")]
    async with ContextManager(BUDGET, recall=store, session_id="s", on_over_budget="send") as ctx:
        ctx.subscribe(events.append)
        assert ctx._writer is not None
        ctx._writer.max_pending_bytes = 200_000
        for group in synthetic_session(5, 80, mean_output_lines=60):
            history = [*history, *group]
            before = ctx._writer._ready_bytes
            await ctx.prepare(history)  # and nothing else awaited: the writer never runs
            fresh = max(0, ctx._writer._ready_bytes - before)
            assert ctx._writer._ready_bytes <= 200_000 + fresh
    overflow = [e for e in events if isinstance(e, StoreDegraded) and e.reason == "overflow"]
    assert overflow and all(e.lost for e in overflow)


async def test_a_value_that_is_not_text_is_a_store_error_and_a_ledger_that_is_unreadable(
    tmp_path: Path,
) -> None:
    """Found by hostile testing: a row another program wrote as bytes that are not UTF-8 made
    `get` and `load_ledger` raise a bare `UnicodeDecodeError`, and a resumed session said the
    store was down (``ledger_unavailable``) where its ledger could not be read."""
    path = tmp_path / "recall.db"
    store = SQLiteRecallStore(path)
    rid = store.put("s", "original content")
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("UPDATE recall SET content = ? WHERE id = ?", (b"\xff\xfe not text", rid))
    other.execute("INSERT INTO ledger (session, json) VALUES (?, ?)", ("s", b"[\xff]"))
    other.close()
    for read in (lambda: store.get("s", rid), lambda: store.load_ledger("s")):
        with pytest.raises(StoreDataError, match="not UTF-8"):
            read()
    events: list[Event] = []
    async with ContextManager(BUDGET, recall=store, session_id="s") as ctx:
        ctx.subscribe(events.append)
        await ctx.prepare([UserMessage.of("the task")])
        answer = await ctx.handle_recall({"id": rid})
    assert answer.startswith("[recall_context]") and "not UTF-8" in answer
    assert "cannot be read" in answer and "try again later" not in answer
    assert [e.code for e in events if isinstance(e, CompactionWarning)] == ["ledger_unreadable"]
    store.close()


async def test_a_redis_key_of_another_type_is_unreadable_not_unavailable(
    server: RedisServer,
) -> None:
    """Found by hostile testing: a recall key or the ledger key holding a list (WRONGTYPE)
    had the model told to try again later, and the resumed session say the store was down
    (``ledger_unavailable``): neither changes by trying again."""
    rid = recall_id("s", "hello")
    client = redis.Redis.from_url(server.url)
    client.rpush(f"agentctx:s:r:{rid}", "x")
    client.rpush("agentctx:s:ledger", "x")
    client.close()
    store = RedisRecallStore(server.url)
    with pytest.raises(StoreDataError, match="WRONGTYPE"):
        store.get("s", rid)
    events: list[Event] = []
    async with ContextManager(BUDGET, recall=store, session_id="s") as ctx:
        ctx.subscribe(events.append)
        await ctx.prepare([UserMessage.of("the task")])
        answer = await ctx.handle_recall({"id": rid})
    assert "cannot be read" in answer and "try again later" not in answer
    assert [e.code for e in events if isinstance(e, CompactionWarning)] == ["ledger_unreadable"]
    store.close()


def _forged(raw: list[Message], kind: str) -> ReplaceResult | ReplaceSpan:
    """A decision whose anchors match ``raw`` but which `take` refuses."""
    result = next(i for i in range(2, 30) if isinstance(raw[i], ToolResultMessage))
    if kind == "result holding a call and reasoning":
        blocks = (ToolCall("zz", "n", {}), ThinkingBlock("forged", "sig"))
        return ReplaceResult(anchor(raw, result), blocks, "x")  # type: ignore[arg-type]
    if kind == "result anchored at the task":
        return ReplaceResult(anchor(raw, 0), (TextBlock("x"),), "x")
    end = next(i for i in range(2, 30) if isinstance(raw[i], AssistantMessage))
    forged = AssistantMessage((ThinkingBlock("forged", "sig"), TextBlock("summary")))
    return ReplaceSpan(anchor(raw, 1), end, anchor(raw, end - 1), (forged,), "x")


@pytest.mark.parametrize(
    "kind",
    [
        "span with forged reasoning",
        "result holding a call and reasoning",
        "result anchored at the task",
    ],
)
@pytest.mark.parametrize("handed", ["saved", "passed in"])
async def test_a_ledger_holding_a_decision_take_refuses_is_read_as_unreadable(
    tmp_path: Path, kind: str, handed: str
) -> None:
    """Found by hostile testing: a saved ledger was adopted as it was read, where `take`
    checks what a strategy decides, so an edited ledger whose anchors still matched put
    forged signed reasoning, or a tool call inside a tool result, into every view."""
    raw = [m for group in synthetic_session(seed=2, calls=40) for m in group]
    ledger = Ledger([_forged(raw, kind)])
    store = SQLiteRecallStore(tmp_path / "recall.db")
    events: list[Event] = []
    if handed == "saved":
        store.save_ledger("s", ledger.to_json())
        ctx = ContextManager(Budget(context_window=400_000), recall=store, session_id="s")
    else:
        ctx = ContextManager(Budget(context_window=400_000), ledger=ledger, session_id="s")
    ctx.subscribe(events.append)
    async with ctx:
        view = await ctx.prepare(raw)
        assert len(ctx.ledger) == 0
    assert view == raw
    assert_view_ok(view, raw)
    (warning,) = [e for e in events if isinstance(e, CompactionWarning)]
    assert warning.code == "ledger_unreadable" and "decisions start over" in warning.message
    store.close()


def test_a_redis_value_that_is_not_text_is_a_store_error() -> None:
    from agentctx.recall.redis import _decode

    assert _decode(b"caf\xc3\xa9") == "café"
    with pytest.raises(StoreDataError, match="not UTF-8"):
        _decode(b"\xff\xfe")


@pytest.mark.parametrize("entered", [True, False], ids=["async with", "first prepare"])
async def test_a_store_that_does_not_answer_at_the_start_never_stalls_the_loop(
    entered: bool,
) -> None:
    """Found by hostile testing: the manager read the saved ledger in its constructor, on the
    event loop, which a frozen Redis server stalled for its whole timeout (or for good, with
    a client that has none)."""
    import threading

    thawed = threading.Event()

    class Frozen(MemoryRecallStore):
        def load_ledger(self, session_id: str) -> str | None:
            thawed.wait(30)
            return None

        def save_ledger(self, session_id: str, ledger_json: str) -> None:
            pass

    gaps: list[float] = []

    async def heartbeat() -> None:
        last = time.perf_counter()
        while True:
            await anyio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    events: list[Event] = []
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(heartbeat)
            ctx = ContextManager(BUDGET, recall=Frozen(), session_id="s")
            ctx.subscribe(events.append)
            if entered:
                async with ctx:
                    view = await ctx.prepare([UserMessage.of("the task")])
            else:
                view = await ctx.prepare([UserMessage.of("the task")])
                await ctx.aclose()
            tg.cancel_scope.cancel()
    finally:
        thawed.set()
    assert max(gaps) < STALL
    assert text_of(view[0].content) == "the task"  # type: ignore[union-attr]
    (warning,) = [e for e in events if isinstance(e, CompactionWarning)]
    assert warning.code == "ledger_unavailable" and "no answer" in warning.message


@pytest.mark.parametrize("entry", ["not read before", "read before"])
async def test_an_inline_store_that_fails_to_read_gets_the_model_an_explanation(
    entry: str,
) -> None:
    """Found by a hostile run: a store that never waits on I/O (``blocking = False``) is read
    inline, and its own error on a read reached the agent loop out of ``handle_recall``,
    while the same error on a write was mapped to `StoreError`."""

    class Flaky(MemoryRecallStore):
        down = False

        def get(self, session_id: str, rid: str) -> str | None:
            if self.down:
                raise ConnectionError("cache node went away")
            return super().get(session_id, rid)

    store = Flaky()
    history: list[Message] = [UserMessage.of("the task")]
    for i in range(30):
        body = "\n".join(f"line {n} of output {i}" for n in range(200))
        history += [
            AssistantMessage((ToolCall(f"c{i}", "bash", {"command": "ls"}),), "tool_use"),
            ToolResultMessage(f"c{i}", (TextBlock(body),), "bash"),
        ]
    async with ContextManager(
        Budget(context_window=4_000, reserve_output=1_000), recall=store, session_id="s"
    ) as ctx:
        view = await ctx.prepare(history)
        rids = sorted(set(re.findall(r"ctx-[0-9a-f]{16}", repr(view))))
        rid = rids[0]
        first = await ctx.handle_recall({"id": rid})
        assert first.startswith(f"[recall_context {rid}")
        store.down = True
        if entry == "not read before":
            rid = rids[1]
        answer = await ctx.handle_recall({"id": rid})
        if entry == "read before":  # kept expanded: the store is not asked again
            assert answer == first
        else:
            assert "the recall store is unavailable right now" in answer
            assert "ConnectionError: cache node went away" in answer


async def test_a_release_the_store_never_took_is_reported(server: RedisServer) -> None:
    """Found by a hostile run (AB, finding 2): a session that closed while Redis was out of
    reach left its entries there without their expiry, for good, and said nothing (only
    `StoreDegraded` ``unavailable``): the release was never reported as what was not written
    is. It is now (``closed``)."""
    store = RedisRecallStore(server.url, prefix="release", ttl_seconds=60)
    events: list[Event] = []
    history: list[Message] = [UserMessage.of("the task")]
    budget = Budget(context_window=8_000, reserve_output=1_000)
    async with ContextManager(budget, recall=store, session_id="s") as ctx:
        ctx.subscribe(events.append)
        for k in range(6):
            call = ToolCall(f"c{k}", "read", {"path": f"f{k}.py"})
            output = "\n".join(f"line {n} of f{k}" for n in range(600))
            history += [
                AssistantMessage((call,)),
                ToolResultMessage(f"c{k}", (TextBlock(output),), "read"),
            ]
            await ctx.prepare(history)
        assert any(getattr(d, "recall_id", None) for d in ctx.ledger.decisions)
        await anyio.sleep(0.5)  # the background writes reach the store
        assert store._pinned.get("s")
        server.kill()
    closed = [e for e in events if isinstance(e, StoreDegraded) and e.reason == "closed"]
    assert len(closed) == 1 and "Connection refused" in closed[0].detail
    assert not any(isinstance(e, StoreRecovered) for e in events)
    store.close()


class _Forgetful(MemoryRecallStore):
    """A store that lost some entries (evicted, a server restarted empty)."""

    def __init__(self) -> None:
        super().__init__()
        self.forgotten: set[str] = set()

    def get(self, session_id: str, rid: str) -> str | None:
        return None if rid in self.forgotten else super().get(session_id, rid)


async def test_an_entry_lost_inside_another_is_reported_and_read_again() -> None:
    """Found by a hostile run (BF 2): an entry a marker's entry refers to was lost, and the
    recall of the marker said "not kept" in its place with no event, while a recall of the
    lost id itself reported it; the answer was cached, so the entry found again later was
    never shown."""
    store = _Forgetful()
    events: list[object] = []
    async with ContextManager(
        Budget(context_window=9_000, reserve_output=1_000), recall=store, session_id="s"
    ) as ctx:
        ctx.subscribe(events.append)
        history: list[Message] = [UserMessage.of("task: do things")]
        for k in range(40):
            output = "\n".join(f"step {k} line {i} " + "z" * 50 for i in range(250))
            history += [
                AssistantMessage(
                    content=(ToolCall(id=f"c{k}", name="run", arguments={"cmd": f"ls {k}"}),)
                ),
                ToolResultMessage.of(f"c{k}", output, tool_name="run"),
            ]
            view = await ctx.prepare(history)
        ids = set(RID.findall(repr(view)))
        for _ in range(250):  # the writer writes off the event loop
            if all(store.get("s", rid) is not None for rid in ids):
                break
            await anyio.sleep(0.02)
        outer, inner = next(
            (rid, refs[0]) for rid in sorted(ids) if (refs := references(store.get("s", rid) or ""))
        )
        events.clear()
        store.forgotten.add(inner)
        answer = await ctx.handle_recall({"id": outer, "limit": 200_000})
        assert f"[{inner}: not kept]" in answer
        missing = [e for e in events if isinstance(e, StoreDegraded) and e.reason == "missing"]
        assert [e.lost for e in missing] == [(inner,)]
        store.forgotten.clear()
        answer = await ctx.handle_recall({"id": outer, "limit": 200_000})
        assert "not kept" not in answer


async def test_an_entry_found_missing_after_an_outage_is_not_said_to_be_the_outage() -> None:
    """(Hostile run EC, 4) A `StoreDegraded` ``missing`` event carried the store's last
    error, of an outage already over (``Connection refused``) when the store had just
    answered that it does not hold the entry."""

    class Down(_Forgetful):
        down = False

        def put_many(self, session_id: str, contents: Sequence[str]) -> list[str]:
            if self.down:
                raise StoreError("Connection refused")
            return super().put_many(session_id, contents)

    store = Down()
    events: list[object] = []
    async with ContextManager(
        Budget(context_window=9_000, reserve_output=1_000), recall=store, session_id="s"
    ) as ctx:
        ctx.subscribe(events.append)
        store.down = True
        history: list[Message] = [UserMessage.of("task: do things")]
        for k in range(12):
            output = "\n".join(f"step {k} line {i} " + "z" * 50 for i in range(250))
            call = ToolCall(id=f"c{k}", name="run", arguments={"cmd": f"ls {k}"})
            history += [
                AssistantMessage(content=(call,)),
                ToolResultMessage.of(f"c{k}", output, tool_name="run"),
            ]
            view = await ctx.prepare(history)
        store.down = False
        with anyio.fail_after(10):
            while not any(isinstance(e, StoreRecovered) for e in events):
                await ctx.prepare(history)
                await anyio.sleep(0.05)
        rid = RID.findall(repr(view))[0]
        store.forgotten.add(rid)
        answer = await ctx.handle_recall({"id": rid})
    assert "no longer holds it" in answer, answer
    down = next(e for e in events if isinstance(e, StoreDegraded))
    missing = next(e for e in events if isinstance(e, StoreDegraded) and e.reason == "missing")
    assert "Connection refused" in down.detail
    assert "Connection refused" not in missing.detail and missing.lost == (rid,)


def _job(i: int, tag: str, lines: int = 3000) -> list[Message]:
    out = "\n".join(f"{tag}{i}: output line {k} " + "x" * 20 for k in range(lines))
    return [
        AssistantMessage((ToolCall(f"c{i}", "bash", {"command": f"job {i}"}),)),
        ToolResultMessage.of(f"c{i}", out, tool_name="bash"),
    ]


async def test_entries_an_owned_history_still_names_stay_kept_after_an_edit() -> None:
    """Found by a hostile run (BH 2): an owned-mode caller edited its task; the resync
    dropped every decision, the placeholders of the view it kept stayed in its history, and
    the entries they name were no longer kept from eviction: other work on the same store
    evicted them, and recall said "not found" for ids the view showed."""
    store = MemoryRecallStore(max_bytes=1_500_000)
    budget = Budget(context_window=40_000, reserve_output=1_000)
    async with ContextManager(budget, recall=store, session_id="A", on_over_budget="send") as a:
        history: list[Message] = [UserMessage.of("task: run the jobs")]
        for i in range(3):
            history = list(await a.prepare([*history, *_job(i, "A")]))
        history[0] = UserMessage.of("task: run the jobs, all of them")
        view = list(await a.prepare([*history, UserMessage.of("go on")]))
        assert not a.ledger.decisions
        shown = sorted(set(RID.findall("".join(canonical_json(m) for m in view))))
        assert shown
        for i in range(20):  # other work on the store: what no session keeps goes first
            store.put("B", f"B{i}\n" + "y" * 100_000)
        for rid in shown:
            assert (await a.recall(rid, 0, 40)).startswith(f"[recall_context {rid}: chars 0-")


async def test_an_id_a_tool_printed_is_not_an_entry_the_store_lost() -> None:
    """Found by a hostile run (BH 3): a tool output that printed a recall id, once
    truncated, made the session take the id for one of its entries: its recall reported a
    store loss (`StoreDegraded` missing) and told the model the store no longer held it."""
    fake = "ctx-0123456789abcdef"
    events: list[Event] = []
    async with ContextManager(
        Budget(context_window=6_000, reserve_output=1_000),
        recall=MemoryRecallStore(),
        session_id="s",
    ) as ctx:
        ctx.subscribe(events.append)
        output = f"see recall_context id={fake} for details\n" + "\n".join(
            f"line {i}" for i in range(5000)
        )
        history: list[Message] = [
            UserMessage.of("task: look at the logs"),
            AssistantMessage((ToolCall("c1", "bash", {"command": "cat log"}),)),
            ToolResultMessage.of("c1", output, tool_name="bash"),
        ]
        view = await ctx.prepare(history)
        shown = text_of(view[2].content)
        assert fake in shown and "truncated" in shown
        answer = await ctx.handle_recall({"id": fake})
    assert "was not found in this session" in answer
    assert not [e for e in events if isinstance(e, StoreDegraded)]


class _ClearWithErrors:
    """A strategy of one's own that names two entries in its placeholder: the error lines
    and, as its recall id, the whole output."""

    async def compact(self, ctx: Any) -> None:
        for j, m in enumerate(ctx.view):
            text = text_of(m.content) if isinstance(m, ToolResultMessage) else ""
            if len(text) > 1000 and ctx.undecided(j) is not None:
                whole = ctx.recall.put(ctx.session_id, text)
                errors = ctx.recall.put(
                    ctx.session_id, "\n".join(x for x in text.splitlines() if "ERROR" in x)
                )
                note = (
                    f"[cleared; errors: recall_context id={errors}; all: recall_context id={whole}]"
                )
                ctx.take(
                    ReplaceResult(
                        anchor(ctx.raw, ctx.origins[j]), (TextBlock(note),), "clear", whole
                    )
                )


async def test_every_entry_a_placeholder_names_is_kept_not_only_its_recall_id() -> None:
    """Found by a hostile run (BJ 1), a regression of this stop's fix for ids a tool
    printed: a decision's entries were taken to be its recall id alone, so a second entry
    a strategy of one's own named in its placeholder was never written."""
    output = "\n".join(f"ERROR boom {k}" if k % 50 == 0 else f"fine {k}" for k in range(300))
    async with ContextManager(
        Budget(context_window=100_000),
        strategy=_ClearWithErrors(),
        recall=MemoryRecallStore(),
        session_id="s",
    ) as ctx:
        history: list[Message] = [
            UserMessage.of("task"),
            AssistantMessage((ToolCall("c1", "bash", {}),)),
            ToolResultMessage.of("c1", output, tool_name="bash"),
        ]
        view = await ctx.prepare(history)
        errors, whole = RID.findall(text_of(view[-1].content))
        lines = "\n".join(f"ERROR boom {k}" for k in range(0, 300, 50))
        assert (await ctx.recall(errors)).endswith(lines)
        assert (await ctx.recall(whole)).endswith("fine 299")


async def test_an_id_a_spans_trail_names_is_not_an_entry_the_store_lost() -> None:
    """Found by a hostile run (BJ 2): the model recalled an id that never existed; once a
    span dropped that step, its marker's trail named the call, and the id was taken for an
    entry the store had lost (`StoreDegraded` missing, "no longer holds it")."""
    bogus = "ctx-0123456789abcdef"
    events: list[Event] = []
    async with ContextManager(
        Budget(context_window=12_000, reserve_output=1_000),
        recall=MemoryRecallStore(),
        session_id="s",
    ) as ctx:
        ctx.subscribe(events.append)
        first = await ctx.recall(bogus)
        history: list[Message] = [
            UserMessage.of("task"),
            AssistantMessage((ToolCall("r0", "recall_context", {"id": bogus}),)),
            ToolResultMessage.of("r0", first, tool_name="recall_context"),
        ]
        for i in range(1, 30):
            history += [
                AssistantMessage(
                    (TextBlock(f"s{i}"), ToolCall(f"c{i}", "read", {"path": f"f{i}"}))
                ),
                ToolResultMessage.of(
                    f"c{i}", "\n".join(f"l{k} " + "y" * 60 for k in range(30)), tool_name="read"
                ),
            ]
            await ctx.prepare(history)
        spans = [d for d in ctx.ledger.decisions if isinstance(d, ReplaceSpan)]
        assert any(bogus in str(d) for d in spans)
        assert "was not found in this session" in first
        assert "was not found in this session" in await ctx.recall(bogus)
    assert not [e for e in events if isinstance(e, StoreDegraded)]


def _works_in_a_forked_child(name: str, *, locked: bool = False) -> None:
    """A store at ``name`` (Python source of the file name) used by a child forked from a
    process that used it first (``locked``: while a writer thread of the parent held its
    lock) reads the parent's entry and writes its own."""
    lock, unlock = ("store._lock.acquire()", "store._lock.release()") if locked else ("", "")
    script = f"""
import os, signal, sys, tempfile
from agentctx import SQLiteRecallStore
store = SQLiteRecallStore(os.path.join(tempfile.mkdtemp(), {name}))
rid = store.put("s", "the parent's entry")
{lock}
pid = os.fork()
if pid == 0:
    signal.alarm(10)
    ok = store.get("s", rid) == "the parent's entry"
    ok = ok and store.get("s", store.put("s", "the child's")) == "the child's"
    os._exit(0 if ok else 1)
_, status = os.waitpid(pid, 0)
{unlock}
sys.exit(os.waitstatus_to_exitcode(status))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()


def test_a_sqlite_store_works_in_a_child_forked_while_a_thread_was_inside_it() -> None:
    """Found by a hostile run (BN 2): a fork while the parent's writer thread held the
    store's lock left the child's copy of that lock held for good (and the child on the
    parent's SQLite connection, which SQLite forbids): every call there failed or hung."""
    _works_in_a_forked_child('"a.db"', locked=True)


@pytest.mark.parametrize("path", [None, 5, "", "bytes", "a\0.db", "a\ud800.db"])
def test_a_sqlite_path_that_names_no_file_is_a_config_error(tmp_path: Path, path: object) -> None:
    """Found by a hostile run (BT 3): ``None`` and ``5`` escaped as a bare `TypeError`, and
    ``""`` was taken: SQLite opens it as a private temporary database, every entry and
    ledger gone at close, where a durable store was asked for."""
    if path == "bytes":
        path = os.fsencode(tmp_path / "a.db")
    with pytest.raises(ConfigError, match="must name the database file"):
        SQLiteRecallStore(path)  # type: ignore[arg-type]


def test_a_sqlite_file_whose_name_is_not_utf8_opens_and_reopens_in_a_forked_child() -> None:
    """Found by a hostile run (BT 3): a path that is not UTF-8 (a byte name read with
    ``os.fsdecode``) failed to open with "Could not decode to UTF-8 column 'file'"."""
    _works_in_a_forked_child('os.fsdecode(b"\\xff\\xfe.db")')


class _Flaky(SQLiteRecallStore):
    """A store whose writes fail while ``down``."""

    down = False

    def put_many(self, session_id: str, contents: Any) -> list[str]:
        if self.down:
            raise StoreError("the disk is busy")
        return super().put_many(session_id, contents)


class _NamesItAgain:
    """Clears a result and puts its entry; once the history was cut back, names that entry
    again in another placeholder without putting it (as a briefing asked for before the cut
    names what it summarized)."""

    def __init__(self) -> None:
        self.rid: str | None = None

    async def compact(self, ctx: Any) -> None:
        for j, m in enumerate(ctx.view):
            if isinstance(m, ToolResultMessage) and ctx.undecided(j) is not None:
                rid = None
                if self.rid is None:
                    self.rid = rid = ctx.recall.put(ctx.session_id, text_of(m.content))
                note = f"[cleared; recall_context id={self.rid}]"
                ctx.take(
                    ReplaceResult(anchor(ctx.raw, ctx.origins[j]), (TextBlock(note),), "x", rid)
                )
                return


async def test_an_entry_named_again_after_a_rewind_is_written_though_not_put_again(
    tmp_path: Path,
) -> None:
    """Found by a fuzzer (BP 1): an entry not written yet (the store slow or down) whose
    decision a rewind dropped was thrown away; named again by a later decision (a briefing
    asked for before the rewind) it was kept live with nothing to write, and its recall said
    the store had lost it."""
    store = _Flaky(tmp_path / "r.db")
    strategy = _NamesItAgain()
    task = UserMessage.of("task")

    def step(k: int, text: str) -> list[Message]:
        return [
            AssistantMessage((ToolCall(f"c{k}", "bash", {}),)),
            ToolResultMessage.of(f"c{k}", text, tool_name="bash"),
        ]

    async with ContextManager(
        Budget(context_window=100_000), strategy=strategy, recall=store, session_id="s"
    ) as ctx:
        store.down = True
        await ctx.prepare([task, *step(1, "the first output")])
        await ctx.prepare([task])  # rewound before it was written
        await ctx.prepare([task, *step(2, "the second output")])
        store.down = False
        assert strategy.rid is not None
        for _ in range(200):
            if store.get("s", strategy.rid) is not None:
                break
            await ctx.prepare([task, *step(2, "the second output")])
            await anyio.sleep(0.05)
        assert (await ctx.recall(strategy.rid)).endswith("the first output")


def test_a_forked_child_reopens_the_file_the_store_opened_and_nothing_else() -> None:
    """Found by a hostile run (BQ 1), a regression of the fix above: the child reopened the
    path as given (after a chdir, a new empty file), a store in memory as an empty one, and
    a closed store opened again."""
    script = """
import os, sys, tempfile
from agentctx import SQLiteRecallStore
from agentctx.errors import StoreError

def in_child(read):
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(0 if read() else 1)
        except StoreError:
            os._exit(2)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

base = tempfile.mkdtemp()
os.mkdir(os.path.join(base, "a")); os.mkdir(os.path.join(base, "b"))
os.chdir(os.path.join(base, "a"))
relative = SQLiteRecallStore("rel.db")
rid = relative.put("s", "kept")
os.chdir(os.path.join(base, "b"))
memory = SQLiteRecallStore(":memory:")
mid = memory.put("s", "in memory")
closed = SQLiteRecallStore(os.path.join(base, "c.db"))
closed.close()
codes = [
    in_child(lambda: relative.get("s", rid) == "kept"),
    in_child(lambda: memory.get("s", mid) == "in memory"),
    in_child(lambda: closed.get("s", "x") is None),
]
sys.exit(0 if codes == [0, 0, 2] and os.listdir(".") == [] else 1)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
