"""`RecallWriter`: what stands between the strategies and the recall store, so store I/O
never runs on the event loop and an outage never stops the agent.

Design. Recall ids are content-addressed (`recall_id`), so a strategy never needs the store's
answer to name what it clears. The manager owns one writer per session and hands it to the
strategies as ``ctx.recall``; it has the store's ``put``/``get``:

- ``put`` computes the id and keeps the content in memory. At the end of each `prepare`
  (`settle`) the entries that a decision taken names are kept to be written; the others
  (proposals nobody took) are dropped: nothing references them, so nothing is written or
  pinned for them.
- The ledger's references are tracked per decision (`record`: the ids in the decisions just
  taken; the whole ledger again only after decisions were dropped, on a resync, each
  decision read once while the ledger holds it), so a decision costs what it touches, never
  the length of the history. The ledger JSON the store keeps is the decisions' JSON joined,
  each serialized once when taken. The ids a dropped decision named stay kept while the raw
  history names them (`NamedInRaw`: the session's first such rewind reads the history
  once, about 4 us a message; the next ones only what changed).
- Writes run off the loop, in the manager's task group: each store call in a worker thread
  under a short deadline (``deadline``), one at a time, in order: pins, entries (in batches),
  then the latest unsaved ledger ("latest unsaved wins": a failed save stays pending until a
  later one succeeds, whether or not the ledger changed again). A store whose calls never
  wait on I/O (``blocking = False``, e.g. `MemoryRecallStore`) is called inline instead.
- A failure (an error or a missed deadline) emits `StoreDegraded` ``unavailable`` once;
  what was not written stays in memory, bounded by ``max_pending_bytes`` (past it the oldest
  unwritten entries are dropped and reported, `StoreDegraded` ``overflow``), and is retried
  with exponential backoff; the first complete flush after it emits `StoreRecovered`.
- ``get`` answers from memory first (what is not written yet), then from the store; the
  manager's `ContextManager.recall` reads through `aget`, in a thread under the deadline.
- On close (`aclose`) what is pending is flushed within ``close_seconds``; what could not be
  written is reported (`StoreDegraded` ``closed``), and the session's pins are released.

Without a task group (a manager used without ``async with``), writes to a blocking store run
inline at the end of `prepare`, bounded by the store's own timeouts and skipped while backing
off; a `CompactionWarning` ``no_task_group`` says so once.
"""

from __future__ import annotations

import functools
import re
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from agentctx._log import log
from agentctx.errors import ConfigError, StoreDataError, StoreError
from agentctx.events import CompactionWarning, StoreDegraded, StoreRecovered
from agentctx.ledger import Ledger, ReplaceSpan, decision_json
from agentctx.messages import (
    SummaryMessage,
    text_of,
)
from agentctx.recall._named import RECALL_ID, NamedInRaw
from agentctx.recall.store import (
    AppendingLedgerStore,
    LedgerStore,
    SessionStateStore,
    escape_literal,
    expand_references,
    recall_id,
)
from agentctx.recall.tool import recall_page

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence, Set

    from anyio.abc import TaskGroup

    from agentctx.events import Event
    from agentctx.ledger import Decision
    from agentctx.messages import Message
    from agentctx.recall.store import RecallStore

__all__ = ["RecallWriter"]

# How agentctx's own placeholders name the entries they stand for: a marker's or a condensed
# line's note, a briefing's last line. Text a tool printed or a model wrote may name any id.
_ID_NOTE = r"recall_context id=ctx-[0-9a-f]{16}"
_OWN_NOTE = re.compile(rf"^\[[^\]\n]*\] \(({_ID_NOTE}(?:, {_ID_NOTE})*)\)")
_BRIEFING_ENTRY = re.compile(r'in full: recall_context\(id="(ctx-[0-9a-f]{16})"\)\]$')


def _vouched(decision: Decision) -> list[str]:
    """The ids ``decision`` was taken with entries under (so an id it names that the store
    does not hold was lost): its own recall id; a span's, the ids its placeholders' own
    notes name. Not the ids in what it kept of a tool's output or a model's text."""
    rid = getattr(decision, "recall_id", None)
    if rid is not None:
        return [rid]
    if not isinstance(decision, ReplaceSpan):
        return []
    ids: list[str] = []
    for m in decision.replacement:
        text = m.text if isinstance(m, SummaryMessage) else text_of(getattr(m, "content", ()))
        if note := _OWN_NOTE.match(text):
            ids += RECALL_ID.findall(note.group(1))
        if entry := _BRIEFING_ENTRY.search(text):
            ids.append(entry.group(1))
    return ids


_FIRST_BACKOFF = 0.2
_MAX_BACKOFF = 5.0
_EXPANSIONS_BYTES = 16 * 1024 * 1024  # recall texts kept expanded, for paging through them
_POLL = 0.01  # how often a call waits for the previous one, abandoned at its deadline, to end
_Key = tuple[str, str]  # (session id, recall id)


def _size(content: str) -> int:
    return sys.getsizeof(content)


@dataclass(frozen=True, slots=True)
class _Read:
    """A decision as the writer reads it: its JSON (kept where the store saves ledgers),
    the recall ids it names and those it vouches for (`_vouched`)."""

    decision: Decision
    json: str
    ids: tuple[str, ...]
    vouched: tuple[str, ...]


@dataclass(slots=True)
class _Job:
    work: Callable[[], object]
    done: Callable[[], None]
    undo: Callable[[], None]


def _nothing() -> None:
    return None


class RecallWriter:
    """The session's write-behind buffer in front of ``store`` (see the module docstring).

    Args:
        store: the recall store.
        session_id: the manager's session; entries of other sessions are not kept.
        emit: where `StoreDegraded`, `StoreRecovered` and `CompactionWarning` go.
        ledger: the session's ledger as the manager starts with it.
        saved: whether ``store`` already holds that ledger (it was resumed from it).
        deadline: seconds one store call may take before it counts as failed.
        close_seconds: how long `aclose` keeps trying to write what is pending.
        max_pending_bytes: the memory unwritten entries may take.
        batch_bytes: about how much one write sends.
    """

    # Declared, so that reading them stays on CPython's fast path however many there are;
    # ``__dict__`` and ``__weakref__`` keep what a plain class allows (patching a method on
    # an instance, a weak reference).
    __slots__ = (
        "__dict__",
        "__weakref__",
        "_backoff",
        "_blocking",
        "_busy",
        "_closed",
        "_count",
        "_degraded_since",
        "_draining",
        "_emit",
        "_evictions_seen",
        "_expansions",
        "_expansions_bytes",
        "_folded",
        "_keeps_ledger",
        "_known",
        "_last_error",
        "_ledger",
        "_ledger_dirty",
        "_ledger_epoch",
        "_ledger_saved",
        "_state_dirty",
        "_state_epoch",
        "_state_of",
        "_state_saved",
        "_live",
        "_lock",
        "_lost",
        "_missing",
        "_vouched",
        "_name",
        "_named",
        "_new",
        "_parts",
        "_pins_added",
        "_pins_removed",
        "_ready",
        "_ready_bytes",
        "_unkept",
        "_unkept_bytes",
        "_release",
        "_retry_at",
        "_version",
        "_warned_evicted",
        "_warned_inline",
        "batch_bytes",
        "close_seconds",
        "deadline",
        "max_pending_bytes",
        "session_id",
        "store",
    )

    def __init__(
        self,
        store: RecallStore,
        session_id: str,
        *,
        emit: Callable[[Event], None],
        ledger: Ledger,
        saved: bool = False,
        state: Callable[[], str] | None = None,
        deadline: float = 2.0,
        close_seconds: float = 3.0,
        max_pending_bytes: int = 64 * 1024 * 1024,
        batch_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        self.store = store
        self.session_id = session_id
        self.deadline = deadline
        self.close_seconds = close_seconds
        self.max_pending_bytes = max_pending_bytes
        self.batch_bytes = batch_bytes
        self._emit = emit
        self._name = type(store).__name__
        self._blocking = bool(getattr(store, "blocking", True))
        self._keeps_ledger = isinstance(store, LedgerStore)
        self._new: dict[_Key, str] = {}  # put since the last settle
        self._ready: OrderedDict[_Key, str] = OrderedDict()  # referenced, not yet written
        self._ready_bytes = 0
        self._live: set[str] = set()  # ids the ledger references
        self._named = NamedInRaw()  # ... or the raw history does, once the ledger no more
        self._known: dict[int, _Read] = {}  # the ledger's decisions as read, by their id()
        self._pins_added: set[str] = set()  # changes to `_live` the store was not told yet
        self._pins_removed: set[str] = set()
        self._lost: set[str] = set()  # dropped unwritten (overflow, close)
        self._unkept: OrderedDict[_Key, str] = OrderedDict()  # unwritten, named no more
        self._unkept_bytes = 0
        self._missing: set[str] = set()  # written, then not in the store when recalled
        # Ids a decision was taken with entries under, or this writer was given an entry for:
        # one the store does not hold was lost (other ids the ledger names may be any text).
        self._vouched: set[str] = set()
        self._parts: list[str] = []  # each decision's JSON, when the store keeps ledgers
        self._ledger: Ledger | None = None
        self._version = -1
        self._count = 0
        self._ledger_dirty = False
        self._ledger_epoch = 0
        # Of `_parts`, how many the store holds as they are (an `AppendingLedgerStore` has
        # only what was added since to save); none until this writer saved them, or all of
        # a ledger it resumed (set below).
        self._ledger_saved = 0
        # The session's state (`SessionStateStore`): saved with each new ledger and at close.
        self._state_of = state if isinstance(store, SessionStateStore) else None
        self._state_dirty = False
        self._state_epoch = 0
        self._state_saved: str | None = None
        self._release = False
        self._degraded_since: float | None = None
        self._last_error = ""
        self._retry_at = 0.0
        self._backoff = _FIRST_BACKOFF
        self._busy: _Turn | None = None  # the last write's hold on the store
        self._lock: anyio.Lock | None = None
        self._expansions: OrderedDict[str, str] = OrderedDict()
        self._expansions_bytes = 0
        self._folded = ("", "")  # the last entry searched, and its casefold
        self._draining = False
        self._warned_inline = False
        self._warned_evicted = False
        self._evictions_seen = getattr(store, "evicted_pinned", 0)
        self._closed = False
        self.record(ledger, ())
        self._ledger_dirty = self._keeps_ledger and not saved and len(ledger) > 0
        if saved:
            # The store holds these decisions: the first save appends what follows them (a
            # worker per request rewrote the whole ledger, megabytes, to add a few).
            self._ledger_saved = len(self._parts)
        self._state_dirty = False  # nothing learned yet

    # -- the store interface strategies see -----------------------------------------------

    def put(self, session_id: str, content: str) -> str:
        """The recall id of ``content``; it is written if a decision taken now names it. The
        recall tool gives it back as it is (stored escaped: `escape_literal`)."""
        if type(content) is not str:
            return self.put_references(session_id, content)  # refused there, by type
        return self.put_references(session_id, escape_literal(content))

    def put_references(self, session_id: str, content: str) -> str:
        """`put` for a text that names other entries with `recall_reference` tokens, which
        the recall tool expands; the rest of it escaped with `escape_literal`. Both take text:
        anything else (bytes, a number, a session id that is no string) is `ConfigError`."""
        if type(session_id) is not str or type(content) is not str:
            raise ConfigError(
                "a recall store keeps text under a session's id (str, str); got "
                f"{type(session_id).__name__} and {type(content).__name__}"
            )
        rid = recall_id(session_id, content)
        if session_id == self.session_id and rid in self._live and rid not in self._lost:
            return rid  # written already, or on its way
        self._new[(session_id, rid)] = content
        return rid

    def get(self, session_id: str, rid: str) -> str | None:
        """What ``rid`` stands for: from memory if not written yet, else from the store (in
        the calling thread: on the event loop, use `aget`)."""
        hit = self._buffered(session_id, rid)
        return hit if hit is not None else self.store.get(session_id, rid)

    async def aget(self, session_id: str, rid: str) -> str | None:
        """`get` without blocking the event loop: a store that does I/O is read in a worker
        thread, under the deadline. Raises `StoreError` when the store fails or is late."""
        hit = self._buffered(session_id, rid)
        if hit is not None:
            return hit
        read = functools.partial(self.store.get, session_id, rid)
        found: str | None
        if self._blocking:
            found = await self._call(read, exclusive=False)
        else:  # inline, its errors mapped as a worker thread's are
            found = self._guarded(read, None)
        return found

    async def page(self, rid: str, offset: int, limit: int, pattern: str | None) -> str:
        """What the ``recall_context`` tool answers (`recall_page`), read off the loop: a
        store that is down, or an entry dropped unwritten, gets the model an explanation."""
        if self.lost(rid):
            return (
                f'[recall_context] id "{rid}" is not recallable: it was dropped before the '
                "recall store took it (the store was down or behind)."
            )
        try:
            content = await self.expanded(rid) if RECALL_ID.fullmatch(rid) else None
        except StoreDataError as exc:
            return (
                f'[recall_context] id "{rid}" cannot be read from the recall store ({exc}); '
                "trying again will not change that."
            )
        except StoreError as exc:
            return (
                f"[recall_context] the recall store is unavailable right now ({exc}); "
                "try again later."
            )
        if content is None and rid in self._live and rid in self._vouched:
            self._report_missing(rid)
            return (
                f'[recall_context] id "{rid}" is not recallable: it was cleared from this '
                "conversation, and the recall store no longer holds it."
            )
        read = functools.partial(
            recall_page,
            _Fetched(content, self._casefold),
            self.session_id,
            rid,
            offset,
            limit,
            pattern,
        )
        if pattern is not None and content is not None and len(content) > _GREP_ON_LOOP:
            # A search is linear in the entry, in Python where casefolding changes its
            # length: on a few MB, a noticeable stall of the loop.
            return await anyio.to_thread.run_sync(read)
        return read()

    def _casefold(self, text: str) -> str:
        last, folded = self._folded
        if last is not text:  # an entry read again is the same object (`expanded` keeps it)
            folded = text.casefold()
            self._folded = (text, folded)
        return folded

    def _report_missing(self, rid: str) -> None:
        """Say once that the store lost an entry the ledger names (a server restarted
        empty, an eviction): to the model, "not found" would read as a mistyped id."""
        if rid not in self._missing:
            self._missing.add(rid)
            log.error("recall store lost an entry the session names", id=rid)
            # The store answered (a failing one is not asked): the detail is that answer,
            # not the last error, which may be of an outage long over.
            detail = "the store holds no entry under this id, written earlier"
            self._emit(self._degraded_event("missing", (rid,), detail))

    async def expanded(self, rid: str) -> str | None:
        """What ``rid`` stands for in full: its entry with the `recall_reference` tokens in
        it replaced by what they name (read off the loop like `aget`; the last few are
        cached, entries never change)."""
        hit = self._expansions.get(rid)
        if hit is not None:
            self._expansions.move_to_end(rid)
            return hit
        expand = functools.partial(self._expand, rid)
        if self._blocking:
            read: tuple[str | None, bool, list[str]] = await self._call(expand, exclusive=False)
        else:
            read = self._guarded(expand, None)
        text, whole, absent = read
        for ref in absent:
            if ref in self._live and ref in self._vouched:
                self._report_missing(ref)
        # A reference the store could not read right now, or did not hold, is said in its
        # place: not kept, so the next call reads it again.
        if whole and not absent and text is not None and _size(text) <= _EXPANSIONS_BYTES:
            self._expansions[rid] = text
            self._expansions_bytes += _size(text)
            while self._expansions_bytes > _EXPANSIONS_BYTES:
                self._expansions_bytes -= _size(self._expansions.popitem(last=False)[1])
        return text

    def _expand(self, rid: str) -> tuple[str | None, bool, list[str]]:
        """`expanded`'s text, whether every reference in it was read, and the references
        the store did not hold."""
        session = self.session_id
        content = self.get(session, rid)
        if content is None:
            return None, True, []
        failed = False
        absent: list[str] = []

        def fetch(ref: str) -> str | None:
            nonlocal failed
            try:
                found = self.get(session, ref)
            except StoreError:
                failed = True
                raise
            if found is None:
                absent.append(ref)
            return found

        return expand_references(content, fetch), not failed, absent

    def lost(self, rid: str) -> bool:
        """Whether ``rid`` was dropped unwritten (the store was unavailable too long)."""
        return rid in self._lost

    @property
    def degraded(self) -> bool:
        """Whether the store is failing now."""
        return self._degraded_since is not None

    @property
    def pending(self) -> tuple[int, int, bool]:
        """Entries and bytes waiting to be written, and whether the ledger is unsaved."""
        return len(self._ready), self._ready_bytes, self._ledger_unsaved

    # -- what the manager calls -----------------------------------------------------------

    def record(
        self, ledger: Ledger, taken: Sequence[Decision], raw: Sequence[Message] = ()
    ) -> None:
        """Note the decisions ``taken`` since the last call (the whole ledger again when
        anything else changed it: a resync, a resumed ledger's stale decisions). ``raw``: the
        session's raw history: an entry a dropped decision named stays kept while raw names it
        (an owned-mode caller's history holds the placeholders of the view it kept)."""
        n = len(taken)
        if (
            ledger is self._ledger
            and ledger.version == self._version + n
            and len(ledger) == self._count + n
        ):
            if not n:
                return
            for d in taken:
                read = self._read(d, self._known)
                for rid in read.ids:
                    self._pin(rid)
                self._vouched.update(read.vouched)
                if self._keeps_ledger:
                    self._parts.append(read.json)
        else:
            self._rebuild(ledger, raw)
        self._ledger, self._version, self._count = ledger, ledger.version, len(ledger)
        self._ledger_dirty = self._keeps_ledger
        self._ledger_epoch += 1
        self.note_state()

    @property
    def keeps_state(self) -> bool:
        """Whether the store saves the session's state (`SessionStateStore`)."""
        return self._state_of is not None

    def note_state(self) -> None:
        """The session's state (calibration, last call) changed: save it with the next
        writes, when the store keeps it."""
        if self._state_of is not None:
            self._state_dirty = True
            self._state_epoch += 1

    def settle(self, tasks: TaskGroup | None) -> None:
        """End of a `prepare`: keep what the ledger names, drop the rest, and write (in
        ``tasks`` when the store does I/O; inline otherwise)."""
        fresh = self._admit()
        # What this call cleared gets one try at a store that works, however much it is (a
        # bound applied first would drop what the store takes); what earlier calls left
        # unwritten (the store down, slow, or never given the loop) is bounded.
        self._bound(keep=fresh if self._degraded_since is None else frozenset())
        if not self._has_work():
            return
        if not self._blocking:
            self._flush_inline()
        elif tasks is not None:
            if not self._draining:
                self._draining = True
                try:
                    tasks.start_soon(self._drain, name=f"agentctx recall writer {self._name}")
                except RuntimeError:  # the group is closing: `aclose` writes what is left
                    self._draining = False
        else:
            if not self._warned_inline:
                self._warned_inline = True
                self._emit(
                    CompactionWarning(
                        "no_task_group",
                        f"{self._name} is written inline in prepare(): use "
                        "`async with ContextManager(...)` so store I/O runs off the loop",
                    )
                )
            if time.monotonic() >= self._retry_at:
                self._flush_inline()

    async def flush(self) -> bool:
        """Write everything pending now; ``True`` when nothing is left."""
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:
            wrote = False
            try:
                while (job := self._next_job()) is not None:
                    try:
                        await self._call(job.work)
                    except BaseException:
                        job.undo()
                        raise
                    job.done()
                    wrote = True
            except StoreError as exc:
                self._failed(exc)
                return False
        if wrote:
            self._succeeded()
        return True

    async def aclose(self) -> None:
        """Write what is pending within ``close_seconds``, release the session's pins, and
        report what could not be written. Run it shielded: it is bounded."""
        if self._closed:
            return
        self._closed = True
        self._admit()
        self.note_state()  # the calibration and last call as the session ends
        self._release = callable(getattr(self.store, "release", None))
        if self._blocking:
            with anyio.move_on_after(self.close_seconds):
                for _ in range(1_000_000):  # until written or out of time
                    if await self.flush():
                        break
                    await anyio.sleep(min(0.25, max(0.0, self._retry_at - time.monotonic())))
        else:
            self._flush_inline()
        self._report_unwritten()
        self._folded = ("", "")  # up to twice an entry of 16 M characters

    # -- bookkeeping ----------------------------------------------------------------------

    @property
    def _ledger_unsaved(self) -> bool:
        return self._keeps_ledger and self._ledger_dirty

    def _buffered(self, session_id: str, rid: str) -> str | None:
        key = (session_id, rid)
        hit = self._new.get(key)
        return hit if hit is not None else self._ready.get(key)

    def _pin(self, rid: str) -> None:
        if rid not in self._live:
            self._live.add(rid)
            if rid in self._pins_removed:
                self._pins_removed.discard(rid)
            else:
                self._pins_added.add(rid)
            key = (self.session_id, rid)
            content = self._unkept.pop(key, None)
            if content is not None:  # named again (a briefing, a marker passing it on)
                self._unkept_bytes -= _size(content)
                self._ready[key] = content
                self._ready_bytes += _size(content)

    def _unpin(self, rid: str) -> None:
        self._live.discard(rid)
        if rid in self._pins_added:
            self._pins_added.discard(rid)
        else:
            self._pins_removed.add(rid)
        key = (self.session_id, rid)
        content = self._ready.pop(key, None)
        if content is not None:
            # Not written, and no longer named; kept a while, as what named it (a rewound
            # decision) may be named again without the entry being put again.
            self._ready_bytes -= _size(content)
            self._unkept[key] = content
            self._unkept_bytes += _size(content)
            while self._unkept_bytes > self.max_pending_bytes:
                self._unkept_bytes -= _size(self._unkept.popitem(last=False)[1])

    def _rebuild(self, ledger: Ledger, raw: Sequence[Message]) -> None:
        known, self._known = self._known, {}
        parts: list[str] = []
        live: set[str] = set()
        for d in ledger.decisions:
            read = self._read(d, known)
            parts.append(read.json)
            live.update(read.ids)
            self._vouched.update(read.vouched)
        if gone := self._live - live:
            live |= self._named.named(gone, raw)
        for rid in live - self._live:
            self._pin(rid)
        for rid in self._live - live:
            self._unpin(rid)
        # A new list: a save running in a thread keeps joining the one it started with.
        if self._keeps_ledger:
            kept = 0
            for old, new in zip(self._parts[: self._ledger_saved], parts, strict=False):
                if old != new:
                    break
                kept += 1
            self._ledger_saved = kept
        self._parts = parts if self._keeps_ledger else []

    def _read(self, decision: Decision, known: dict[int, _Read]) -> _Read:
        """What the writer needs of ``decision``, from ``known`` if read before: each
        decision is serialized once while the ledger holds it, however often a rewind has
        the whole ledger gone through again."""
        read = known.get(id(decision))
        if read is None or read.decision is not decision:
            js = decision_json(decision)
            json = js if self._keeps_ledger else ""
            read = _Read(decision, json, tuple(RECALL_ID.findall(js)), tuple(_vouched(decision)))
        self._known[id(decision)] = read
        return read

    def _admit(self) -> set[_Key]:
        """Take what the decisions just taken name into what is to be written; returns
        the keys it added."""
        new, self._new = self._new, {}
        added: set[_Key] = set()
        for key, content in new.items():
            session, rid = key
            if session != self.session_id or rid not in self._live:
                continue  # a proposal nobody took: nothing references it
            self._lost.discard(rid)
            self._vouched.add(rid)
            if key not in self._ready:
                self._ready[key] = content
                self._ready_bytes += _size(content)
                added.add(key)
        return added

    def _bound(self, keep: Set[_Key] = frozenset()) -> None:
        """Drop the oldest unwritten entries (not those in ``keep``) past
        ``max_pending_bytes``, and say so."""
        if self._ready_bytes <= self.max_pending_bytes:
            return
        dropped: list[str] = []
        for key in list(self._ready):
            if self._ready_bytes <= self.max_pending_bytes or len(self._ready) <= 1:
                break
            if key in keep:
                continue
            content = self._ready.pop(key)
            self._ready_bytes -= _size(content)
            self._lost.add(key[1])
            dropped.append(key[1])
        if dropped:
            log.error("recall store behind; unwritten entries dropped", lost=len(dropped))
            self._emit(self._degraded_event("overflow", tuple(dropped)))

    def _has_work(self) -> bool:
        return bool(
            self._ready
            or self._pins_added
            or self._pins_removed
            or self._ledger_unsaved
            or self._state_dirty
            or self._release
        )

    def _degraded_event(
        self, reason: str, lost: tuple[str, ...] = (), detail: str | None = None
    ) -> StoreDegraded:
        return StoreDegraded(
            reason,
            self._name,
            self._last_error if detail is None else detail,
            len(self._ready),
            self._ready_bytes,
            self._ledger_unsaved,
            lost,
        )

    def _failed(self, exc: StoreError) -> None:
        now = time.monotonic()
        self._last_error = str(exc)
        self._retry_at = now + self._backoff
        self._backoff = min(self._backoff * 2, _MAX_BACKOFF)
        if self._degraded_since is None:
            self._degraded_since = now
            log.warning("recall store unavailable; writes kept and retried", error=str(exc))
            self._emit(self._degraded_event("unavailable"))
        else:
            log.debug("recall store still unavailable", error=str(exc))
        self._bound()

    def _succeeded(self) -> None:
        self._backoff = _FIRST_BACKOFF
        self._retry_at = 0.0
        if self._degraded_since is not None:
            seconds = time.monotonic() - self._degraded_since
            self._degraded_since = None
            log.info("recall store recovered", seconds=round(seconds, 3))
            self._emit(StoreRecovered(self._name, seconds))

    def _report_unwritten(self) -> None:
        # A release the store never took leaves the session's entries pinned there (a
        # `RedisRecallStore`'s without their expiry): said as what was not written is.
        unreleased = self._release
        if self._ready or self._ledger_unsaved or unreleased:
            lost = tuple(rid for _, rid in self._ready)
            self._lost.update(lost)
            log.error(
                "session closed with recall entries, ledger or release unwritten",
                entries=len(lost),
                ledger_unsaved=self._ledger_unsaved,
                unreleased=unreleased,
            )
            self._emit(self._degraded_event("closed", lost))

    # -- writing --------------------------------------------------------------------------

    def _next_job(self) -> _Job | None:
        store, session = self.store, self.session_id
        if self._pins_added or self._pins_removed:
            added, removed = self._pins_added, self._pins_removed
            self._pins_added, self._pins_removed = set(), set()
            update = getattr(store, "update_pins", None)
            pin = getattr(store, "pin", None)
            if callable(update):
                work: Callable[[], object] = functools.partial(update, session, added, removed)
            elif callable(pin):
                work = functools.partial(pin, session, set(self._live))
            else:
                work = _nothing
            return _Job(work, _nothing, functools.partial(self._unsent, added, removed))
        if self._ready:
            batch: list[tuple[_Key, str]] = []
            size = 0
            for key, content in self._ready.items():
                if batch and size + _size(content) > self.batch_bytes:
                    break
                batch.append((key, content))
                size += _size(content)
            return _Job(
                functools.partial(self._write, batch),
                functools.partial(self._written, batch),
                _nothing,
            )
        if self._ledger_unsaved:
            parts, n, epoch = self._parts, len(self._parts), self._ledger_epoch
            assert isinstance(store, LedgerStore)
            if isinstance(store, AppendingLedgerStore):
                start = self._ledger_saved
                save = functools.partial(_extend_ledger, store, session, parts, start, n)
            else:
                save = functools.partial(_save_ledger, store, session, parts, n)
            return _Job(save, functools.partial(self._saved, epoch, parts, n), _nothing)
        if self._state_dirty and self._state_of is not None:
            assert isinstance(store, SessionStateStore)
            text, epoch = self._state_of(), self._state_epoch
            if text != self._state_saved:
                save_state = functools.partial(store.save_state, session, text)
                return _Job(
                    save_state, functools.partial(self._state_written, epoch, text), _nothing
                )
            self._state_dirty = False
        release = getattr(store, "release", None)
        if self._release and callable(release):
            return _Job(functools.partial(release, session), self._released, _nothing)
        return None

    def _state_written(self, epoch: int, text: str) -> None:
        self._state_saved = text
        if self._state_epoch == epoch:
            self._state_dirty = False

    def _released(self) -> None:
        self._release = False

    def _unsent(self, added: set[str], removed: set[str]) -> None:
        for rid in added:
            if rid in self._live:
                self._pins_added.add(rid)
        for rid in removed:
            if rid not in self._live:
                self._pins_removed.add(rid)

    def _write(self, batch: list[tuple[_Key, str]]) -> None:
        store = self.store
        put_many = getattr(store, "put_many", None)
        contents = [content for _, content in batch]
        session = self.session_id
        rids = put_many(session, contents) if callable(put_many) else None
        if rids is None:
            rids = [store.put(session, c) for c in contents]
        expected = [rid for (_, rid), _ in batch]
        if list(rids) != expected:
            raise StoreError(f"{self._name} returned other recall ids than recall_id()")

    def _written(self, batch: list[tuple[_Key, str]]) -> None:
        for key, content in batch:
            if self._ready.get(key) is content:
                del self._ready[key]
                self._ready_bytes -= _size(content)
            self._lost.discard(key[1])

    def _saved(self, epoch: int, parts: list[str], n: int) -> None:
        if self._parts is parts:  # else a rebuild since kept what still matches
            self._ledger_saved = max(self._ledger_saved, n)
        if self._ledger_epoch == epoch:
            self._ledger_dirty = False

    def _flush_inline(self) -> None:
        wrote = False
        try:
            while (job := self._next_job()) is not None:
                try:
                    self._guarded(job.work, None)
                except BaseException:
                    job.undo()
                    raise
                job.done()
                wrote = True
        except StoreError as exc:
            self._failed(exc)
            return
        if wrote:
            self._succeeded()
            self._check_evictions()

    def _check_evictions(self) -> None:
        """Say once when a bounded store had to evict entries a ledger still references."""
        evicted = getattr(self.store, "evicted_pinned", 0)
        if isinstance(evicted, int) and evicted > self._evictions_seen and not self._warned_evicted:
            self._warned_evicted = True
            bound = getattr(self.store, "max_bytes", None)
            log.warning("recall store evicted referenced entries", evicted=evicted, max_bytes=bound)
            self._emit(
                CompactionWarning(
                    "recall_evicted",
                    f"{self._name}(max_bytes={bound}) is too small for what open sessions "
                    f"reference: {evicted - self._evictions_seen} referenced entries were "
                    "evicted and their recall ids now answer not found; raise max_bytes or use "
                    "a durable store",
                )
            )

    async def _drain(self) -> None:
        try:
            while self._has_work():
                delay = self._retry_at - time.monotonic()
                if delay > 0:
                    await anyio.sleep(delay)
                await self.flush()
        finally:
            self._draining = False

    async def _call(self, work: Callable[[], Any], *, exclusive: bool = True) -> Any:
        """``work()`` in a worker thread within the deadline, as `StoreError` when it fails.

        Writes run one at a time: a write abandoned at its deadline (the thread cannot be
        stopped; the store's own timeouts end it) is waited for, within the next one's
        deadline, so threads never pile up on a stuck store. A write abandoned before its
        thread started never runs and is not waited for."""
        try:
            with anyio.fail_after(self.deadline):
                turn = None
                if exclusive:
                    await self._previous_call_ended()
                    turn = self._busy = _Turn()
                try:
                    return await anyio.to_thread.run_sync(
                        self._guarded, work, turn, abandon_on_cancel=True
                    )
                finally:
                    if turn is not None:
                        # Cancelled (or late) before a thread took the work, no thread will
                        # ever end this turn: the next call must not wait for one.
                        turn.give_up()
        except TimeoutError as exc:
            raise StoreError(f"{self._name}: no answer within {self.deadline:g} s") from exc

    async def _previous_call_ended(self) -> None:
        busy = self._busy
        if busy is None:
            return
        for _ in range(
            1_000_000
        ):  # a thread's end cannot be awaited: poll (the caller's deadline bounds it)
            if busy.ended.is_set():
                return
            await anyio.sleep(_POLL)

    def _guarded(self, work: Callable[[], Any], turn: _Turn | None) -> Any:
        if turn is not None and not turn.take():
            return None  # its caller is gone and the next call may be running already
        try:
            return work()
        except StoreError:
            raise
        except Exception as exc:  # a store's own error type, mapped at this edge
            raise StoreError(f"{self._name}: {type(exc).__name__}: {exc}") from exc
        finally:
            if turn is not None:
                turn.ended.set()


class _Turn:
    """One write's hold on the store: the worker thread calls `take` before the work, the
    caller `give_up` when it stops waiting; ``ended`` is set once no thread runs the work or
    ever will."""

    __slots__ = ("_given_up", "_lock", "_taken", "ended")

    def __init__(self) -> None:
        # The thread's start and the caller's cancellation race: one lock decides which
        # came first, so a write never runs after the next one was let through.
        self._lock = threading.Lock()
        self._taken = False
        self._given_up = False
        self.ended = threading.Event()

    def take(self) -> bool:
        """In the worker thread, before the work: whether to run it."""
        with self._lock:
            self._taken = not self._given_up
            return self._taken

    def give_up(self) -> None:
        """When the caller stops waiting: a work no thread took yet never runs."""
        with self._lock:
            if self._taken:
                return
            self._given_up = True
        self.ended.set()


_GREP_ON_LOOP = 1 << 20  # characters of an entry searched on the loop; a longer one in a thread


class _Fetched:
    """One entry already read, in the shape `recall_page` reads from, with the writer's
    casefold (the last one kept, for the session's life only)."""

    def __init__(self, content: str | None, casefold: Callable[[str], str]) -> None:
        self._content = content
        self.casefold = casefold

    def put(self, session_id: str, content: str) -> str:
        raise NotImplementedError

    def get(self, session_id: str, rid: str) -> str | None:
        return self._content


def _extend_ledger(
    store: AppendingLedgerStore, session_id: str, parts: list[str], start: int, n: int
) -> None:
    """Save what ``parts[:n]`` added after the first ``start``; all of it when the store no
    longer holds those (lost since)."""
    if not store.extend_ledger(session_id, parts[start:n], start):
        store.extend_ledger(session_id, parts[:n], 0)


def _save_ledger(store: LedgerStore, session_id: str, parts: list[str], n: int) -> None:
    store.save_ledger(session_id, "[" + ", ".join(parts[:n]) + "]")
