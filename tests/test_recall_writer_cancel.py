"""A `RecallWriter` store call cancelled before its worker thread starts, while the thread
runs, or after the thread's work returned: the caller gets the cancellation, the writer stays
ready for the next call (no `StoreDegraded`, no wait for the deadline), store calls never
overlap, and what the cancelled call did not confirm is written by a later one. A real SQLite
file store, the real writer, the real `ContextManager`."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import anyio.from_thread
import anyio.lowlevel

from agentctx import (
    Budget,
    ContextManager,
    Event,
    Ledger,
    SQLiteRecallStore,
    StoreDegraded,
    StoreRecovered,
)
from agentctx.ledger import ReplaceResult, anchor
from agentctx.messages import (
    AssistantMessage,
    Message,
    TextBlock,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from agentctx.recall.writer import RecallWriter
from agentctx.testing import synthetic_session

if TYPE_CHECKING:
    from collections.abc import Callable

DEADLINE = 2.0
PROMPT = 1.0  # seconds; a call waiting on a marker nobody clears takes the whole deadline
CONTENT = "contents of src/cache.py\n" * 40


class Watched:
    """A SQLite store that counts its ledger saves, counts calls that overlap, and runs
    ``before_save`` / ``after_save`` (in the worker thread) around the next ledger save."""

    def __init__(self, path: Path) -> None:
        self.inner = SQLiteRecallStore(path)
        self.saves = 0
        self.overlaps = 0
        self.before_save: Callable[[], None] | None = None
        self.after_save: Callable[[], None] | None = None
        self.returned = threading.Event()  # a ledger save returned
        self._running = 0
        self._count = threading.Lock()

    def _enter(self) -> None:
        with self._count:
            self._running += 1
            if self._running > 1:
                self.overlaps += 1

    def _exit(self) -> None:
        with self._count:
            self._running -= 1

    def put(self, session_id: str, content: str) -> str:
        self._enter()
        try:
            return self.inner.put(session_id, content)
        finally:
            self._exit()

    def get(self, session_id: str, rid: str) -> str | None:
        return self.inner.get(session_id, rid)

    def load_ledger(self, session_id: str) -> str | None:
        return self.inner.load_ledger(session_id)

    def save_ledger(self, session_id: str, ledger_json: str) -> None:
        self._enter()
        try:
            before, self.before_save = self.before_save, None
            if before is not None:
                before()
            self.inner.save_ledger(session_id, ledger_json)
            self.saves += 1
            after, self.after_save = self.after_save, None
            if after is not None:
                after()
        finally:
            self._exit()
            self.returned.set()


def new_writer(
    tmp_path: Path, *, deadline: float = DEADLINE
) -> tuple[RecallWriter, Watched, Ledger, str, list[Event]]:
    """A writer on a `Watched` store with one decision taken (it clears a tool result) and
    nothing written yet; the ledger, the recall id, the events."""
    store = Watched(tmp_path / "agent.db")
    events: list[Event] = []
    writer = RecallWriter(store, "s", emit=events.append, ledger=Ledger(), deadline=deadline)
    raw: list[Message] = [
        UserMessage.of("Task: keep the cache fast"),
        AssistantMessage((ToolCall("c0", "read", {"path": "src/cache.py"}),), "tool_use"),
        ToolResultMessage("c0", (TextBlock(CONTENT),), "read"),
    ]
    rid = writer.put("s", CONTENT)
    ledger = Ledger()
    ledger.add(ReplaceResult(anchor(raw, 2), (TextBlock(f"[cleared {rid}]"),), "x", rid))
    writer.record(ledger, ledger.decisions)
    return writer, store, ledger, rid, events


async def assert_served_promptly_then_closed(
    writer: RecallWriter, store: Watched, ledger: Ledger, rid: str, events: list[Event]
) -> None:
    """The next call and the close are served without waiting out the deadline and write
    everything: the store holds the ledger and the entry, nothing is reported lost."""
    t0 = time.monotonic()
    assert await writer.flush()
    assert time.monotonic() - t0 < PROMPT
    assert store.load_ledger("s") == ledger.to_json()
    t0 = time.monotonic()
    await writer.aclose()
    assert time.monotonic() - t0 < PROMPT
    assert store.get("s", rid) == CONTENT
    assert writer.pending == (0, 0, False)
    assert not writer.degraded and not writer.lost(rid)
    assert [e for e in events if isinstance(e, StoreDegraded)] == []
    assert store.overlaps == 0
    store.inner.close()


class NoThreadFree:
    """Takes the only worker thread there is (each test's event loop has its own limiter),
    so that a store call waits before its thread starts until `free`."""

    def __init__(self) -> None:
        self.limiter = anyio.to_thread.current_default_thread_limiter()
        self.limiter.total_tokens = 1
        self.limiter.acquire_on_behalf_of_nowait(self)

    def free(self) -> None:
        self.limiter.release_on_behalf_of(self)


async def test_a_write_cancelled_before_its_thread_starts_leaves_the_writer_ready(
    tmp_path: Path,
) -> None:
    writer, store, ledger, rid, events = new_writer(tmp_path)
    threads = NoThreadFree()
    reached = False
    with anyio.move_on_after(0.1) as scope:
        await writer.flush()
        reached = True
    threads.free()
    assert scope.cancelled_caught and not reached  # the cancellation reached the caller
    assert store.saves == 0 and writer.pending[2]  # nothing ran; the ledger is still due
    await assert_served_promptly_then_closed(writer, store, ledger, rid, events)
    assert store.saves == 1


async def test_a_write_past_its_deadline_before_its_thread_starts_recovers_at_once(
    tmp_path: Path,
) -> None:
    writer, store, ledger, rid, events = new_writer(tmp_path, deadline=0.2)
    threads = NoThreadFree()
    assert not await writer.flush()  # late: counts as a failure, once
    threads.free()
    assert await writer.flush()  # the next call is not held by the one that never started
    assert [type(e) for e in events] == [StoreDegraded, StoreRecovered]
    assert isinstance(events[0], StoreDegraded) and events[0].reason == "unavailable"
    events.clear()
    assert store.saves == 1
    await assert_served_promptly_then_closed(writer, store, ledger, rid, events)


async def test_a_write_cancelled_while_its_thread_runs_is_waited_for(tmp_path: Path) -> None:
    writer, store, ledger, rid, events = new_writer(tmp_path)
    release = threading.Event()
    reached = False
    with anyio.CancelScope() as scope:

        def cancel_and_stall() -> None:
            anyio.from_thread.run_sync(scope.cancel)
            release.wait(5)

        store.before_save = cancel_and_stall
        await writer.flush()
        reached = True
    assert scope.cancelled_caught and not reached  # abandoned: the thread does not hold it
    assert store.saves == 0 and not store.returned.is_set()
    # The abandoned thread still holds the store: the next call waits for it, no longer.
    threading.Timer(0.2, release.set).start()
    await assert_served_promptly_then_closed(writer, store, ledger, rid, events)
    assert store.saves == 2  # the cancelled save finished; its answer was lost, so saved again


async def test_a_write_cancelled_after_its_thread_returned(tmp_path: Path) -> None:
    writer, store, ledger, rid, events = new_writer(tmp_path)
    loop = asyncio.get_running_loop()
    reached = False
    with anyio.CancelScope() as scope:

        def once_returned_cancel() -> None:  # on the loop, which it holds until then
            store.returned.wait(5)
            scope.cancel()

        store.after_save = lambda: loop.call_soon_threadsafe(once_returned_cancel)
        await writer.flush()
        reached = True
    assert scope.cancelled_caught and not reached
    assert store.saves == 1 and store.load_ledger("s") == ledger.to_json()
    assert writer.pending[2]  # the answer never arrived: saved again by the next call
    await assert_served_promptly_then_closed(writer, store, ledger, rid, events)
    assert store.saves == 2


async def test_a_read_cancelled_before_its_thread_starts_leaves_the_writer_ready(
    tmp_path: Path,
) -> None:
    first, store, ledger, rid, events = new_writer(tmp_path)
    await first.aclose()  # the entry is in the store, no longer in memory
    writer = RecallWriter(store, "s", emit=events.append, ledger=ledger, saved=True)
    threads = NoThreadFree()
    reached = False
    with anyio.move_on_after(0.1) as scope:
        await writer.page(rid, 0, 100, None)
        reached = True
    threads.free()
    assert scope.cancelled_caught and not reached
    t0 = time.monotonic()
    assert CONTENT.splitlines()[0] in await writer.page(rid, 0, 100, None)
    assert time.monotonic() - t0 < PROMPT
    assert events == []
    store.inner.close()


async def test_a_session_closed_as_its_first_write_starts_writes_it_promptly(
    tmp_path: Path,
) -> None:
    """The manager cancels its background writes on close: one that `prepare` started just
    before is cancelled before its thread starts; the close then writes everything."""
    store = SQLiteRecallStore(tmp_path / "agent.db")
    events: list[Event] = []
    budget = Budget(context_window=12_000, reserve_output=2_000)
    async with ContextManager(budget, recall=store, session_id="s", on_over_budget="send") as ctx:
        ctx.subscribe(events.append)
        view: list[Message] = []
        for group in synthetic_session(2, 40, mean_output_lines=30):
            view = await ctx.prepare([*view, *group])
            if len(ctx.ledger):
                break
        assert len(ctx.ledger)
        # One turn of the loop: the background write takes its lock; then the session ends.
        await anyio.lowlevel.checkpoint()
        t0 = time.monotonic()
    assert time.monotonic() - t0 < PROMPT
    assert [e for e in events if isinstance(e, StoreDegraded)] == []
    assert store.load_ledger("s") == ctx.ledger.to_json()
    store.close()
