"""The recall store protocols, content-addressed ids, and the in-memory store.

Ids are content-addressed and scoped by session: ``ctx-`` + 16 hex digits of a hash of the
session id and the content. The same content in the same session always gets the same id,
and one session can never name, let alone read, another session's entry. Because an id never
depends on the store's answer, a strategy gets it without waiting for the store: the manager
hands strategies a write-behind `agentctx.recall.writer.RecallWriter` that writes to the
store off the event loop (see there).

Besides `RecallStore` (and `LedgerStore` to resume sessions) a store may offer, and the
writer then uses:

- ``blocking = False`` (class attribute): its calls never wait on I/O, so the writer calls it
  inline instead of from a worker thread (`MemoryRecallStore`);
- ``put_many(session_id, contents)``: many entries in one round trip;
- ``update_pins(session_id, added, removed)`` (or ``pin(session_id, rids)``, the exact set):
  which entries the session's ledger references now, so they are kept;
- ``release(session_id)``: the session ended, its entries need no longer be kept for it.

A stored text may name another entry with a `recall_reference` token instead of repeating it
(a dropped span that holds a condensed turn or a truncated result names their ids); what the
recall tool gives the model is the text with each reference expanded (`expand_references`),
so each original is stored about once and still comes back whole in one call. The rest of
such a text is escaped (`escape_literal`), so that text which only reads like a reference
comes back as it was. ``get`` returns the stored text itself, references unexpanded.
"""

from __future__ import annotations

import hashlib
import re
import sys
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from agentctx._check import whole
from agentctx.errors import StoreDataError, StoreError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

__all__ = [
    "AppendingLedgerStore",
    "LedgerStore",
    "MemoryRecallStore",
    "PinningStore",
    "RecallStore",
    "SessionStateStore",
    "escape_literal",
    "expand_references",
    "recall_id",
    "recall_reference",
    "references",
    "vouched",
]


def recall_id(session_id: str, content: str) -> str:
    """The deterministic recall id of ``content`` in ``session_id``."""
    h = hashlib.blake2b(digest_size=8)
    h.update(session_id.encode("utf-8", "surrogatepass"))
    h.update(b"\0")
    h.update(content.encode("utf-8", "surrogatepass"))
    return "ctx-" + h.hexdigest()


def vouched(session_id: str, rid: str, content: str) -> str:
    """``content`` read from a store under ``rid``, checked to be what that id names.

    Recall ids are content hashes, and a store keeps the first value written under an id
    (an insert that ignores, a set if absent): a wrong value found there would be handed to
    the model as the original. Raises `StoreDataError` when ``content`` is not what ``rid``
    names."""
    if recall_id(session_id, content) != rid:
        raise StoreDataError(
            f"recall store holds other content under {rid} than the content that id names"
        )
    return content


# A reference, or literal text that reads like one, escaped (`escape_literal`): one backslash
# more after the braces than it had.
_TOKEN = re.compile(r"\{\{(\\*)recall:(?:(ctx-[0-9a-f]{16})\}\})?")
_LITERAL = re.compile(r"\{\{(\\*)recall:")
MAX_EXPANDED_CHARS = 16_000_000
"""The most characters one entry expands to (`expand_references`): past it a reference stays
a pointer to its id (or the token itself), which the recall tool reads on its own."""


def recall_reference(rid: str) -> str:
    """The token a stored text puts where content already stored under ``rid`` belongs, so
    it is not stored twice; reading it back (`expand_references`) puts the content there.
    The text around it must be escaped with `escape_literal`."""
    return f"{{{{recall:{rid}}}}}"


def references(text: str) -> list[str]:
    """The ids the `recall_reference` tokens of stored ``text`` name, each once, in order
    (not escaped literal text that reads like one)."""
    if "recall:" not in text:
        return []
    return list(dict.fromkeys(m[2] for m in _TOKEN.finditer(text) if m[2] and not m[1]))


def escape_literal(text: str) -> str:
    """``text`` as an entry holds it, so that nothing in it reads as a `recall_reference`
    (a tool output that prints one, say): ``{{recall:`` becomes ``{{\\recall:``, and each
    backslash already there gets one more. `expand_references` takes one off again.
    `RecallWriter.put` stores what it is given this way; a text that holds references of its
    own escapes the rest with this and is stored with `RecallWriter.put_references`."""
    if "recall:" not in text:  # most texts: one search in C
        return text
    return _LITERAL.sub(lambda m: "{{\\" + m.group(1) + "recall:", text)


def expand_references(
    text: str, fetch: Callable[[str], str | None], *, limit: int = MAX_EXPANDED_CHARS
) -> str:
    """``text`` with each `recall_reference` replaced by what ``fetch(rid)`` returns for
    it, references in that expanded too (a missing one says so in its place), and literal
    text escaped with `escape_literal` back as it was. Past ``limit`` characters in all, a
    reference is left as a pointer to its id; so is one inside its own expansion (a cycle).

    Read with a stack, not by recursion: a stretch dropped again and again refers to the
    entry of the drop before it, as deep as the session has drops."""
    left = limit - len(text)
    out: list[str] = []
    todo: list[tuple[str, int, str | None]] = [(text, 0, None)]  # (text, read up to, its id)
    open_ids: list[str] = []  # the ids being expanded, outermost first
    while todo:
        text, at, rid = todo.pop()
        found = _TOKEN.search(text, at) if "recall:" in text else None
        if found is None:
            out.append(text[at:])
            if rid is not None:
                open_ids.pop()
            continue
        out.append(text[at : found.start()])
        todo.append((text, found.end(), rid))
        token, escapes, ref = found.group(0), found.group(1), found.group(2)
        if escapes:  # literal text: one backslash fewer
            out.append(token[:2] + token[3:])
            continue
        if ref is None:  # not a reference, nor escaped (stored by an older version)
            out.append(token)
            continue
        try:
            content = None if ref in open_ids else fetch(ref)
        except StoreError as error:
            # One entry the store cannot read now: said in its place, the rest still read.
            said = f'could not be read ({error}); recall_context(id="{ref}") may read it'
        else:
            if content is not None and len(content) <= left + len(token):
                left -= len(content) - len(token)
                open_ids.append(ref)
                todo.append((content, 0, ref))
                continue
            if content is None and ref not in open_ids:
                said = "not kept"
            else:
                said = f'too long to include here; recall_context(id="{ref}") reads it'
        said = f"[{ref}: {said}]"
        if len(said) - len(token) > left:
            out.append(token)  # what is left holds not even that: the id as it was written
            continue
        left -= len(said) - len(token)
        out.append(said)
    return "".join(out)


@runtime_checkable
class RecallStore(Protocol):
    """Keeps original content under its recall id, per session.

    ``get`` returns exactly the string ``put`` stored, lone surrogates included; a store that
    cannot read or write raises `StoreError`.
    """

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


@runtime_checkable
class AppendingLedgerStore(LedgerStore, Protocol):
    """A `LedgerStore` that saves a ledger a decision at a time (optional): each save then
    writes what the ledger added since the last one, not the whole ledger again, which over
    a long session would write its size once a call (gigabytes at 50k messages)."""

    def extend_ledger(self, session_id: str, parts: Sequence[str], start: int) -> bool:
        """Save the ledger of ``session_id`` as the first ``start`` decisions this method
        saved, then ``parts`` (each one decision's JSON), atomically; `load_ledger` gives
        the whole JSON list back. ``False``, with nothing written, when the store holds fewer
        than ``start`` of them (lost since: a server restarted empty, an expiry): the writer
        then saves them all."""
        ...


@runtime_checkable
class SessionStateStore(Protocol):
    """A `LedgerStore` that also keeps what a worker learned of a session besides its
    decisions (optional): its token calibration and when it last called the model, as a
    JSON text, so a worker resuming the session counts and times as the last one did."""

    def load_state(self, session_id: str) -> str | None:
        """The saved state JSON of ``session_id``, or ``None``."""
        ...

    def save_state(self, session_id: str, state_json: str) -> None:
        """Save the state JSON of ``session_id``."""
        ...


@runtime_checkable
class PinningStore(Protocol):
    """A store that keeps the entries a session's ledger still references (optional)."""

    def update_pins(self, session_id: str, added: Iterable[str], removed: Iterable[str]) -> None:
        """``added`` are referenced by ``session_id`` from now on, ``removed`` no longer."""
        ...

    def release(self, session_id: str) -> None:
        """``session_id`` ended: nothing is kept for it any more."""
        ...


def _size(content: str) -> int:
    return sys.getsizeof(content)  # what the string holds in memory, header included


class MemoryRecallStore:
    """A process-local store bounded by bytes (what the strings take in memory).

    Past ``max_bytes`` the least recently used entries that no open session references go
    first, in O(1) each; entries a session's ledger references (`pin`, `update_pins`) go
    only when they alone are over the bound, oldest pin first (`evicted_pinned` counts
    them). A session's pins are released when it ends (`release`), so a closed session's
    entries are evicted before anyone's. It never holds more than ``max_bytes`` plus the
    newest entry (`bytes_held`). Sessions on several threads may share one (each
    `BlockingContextManager` runs its own loop thread).
    """

    blocking = False  # never waits on I/O: the manager's writer calls it inline

    def __init__(self, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        whole(self, "max_bytes")
        self.evicted_pinned = 0
        self._free: OrderedDict[tuple[str, str], str] = OrderedDict()  # LRU, oldest first
        self._held: OrderedDict[tuple[str, str], str] = OrderedDict()  # pinned, oldest first
        self._pins: dict[str, set[str]] = {}
        self._bytes = 0
        self._lock = threading.Lock()  # it is called inline, from each session's loop thread

    @property
    def bytes_held(self) -> int:
        """The memory the stored strings take."""
        return self._bytes

    def forget(self, session_id: str) -> None:
        """Delete everything this store keeps of ``session_id``."""
        with self._lock:
            for entries in (self._free, self._held):
                for key in [k for k in entries if k[0] == session_id]:
                    self._bytes -= _size(entries.pop(key))
            self._pins.pop(session_id, None)

    def __getstate__(self) -> dict[str, object]:
        with self._lock:  # a copy of the store as it is between two calls of its sessions
            state = {name: value for name, value in vars(self).items() if name != "_lock"}
            state["_free"], state["_held"] = self._free.copy(), self._held.copy()
            state["_pins"] = {session: set(pins) for session, pins in self._pins.items()}
            return state

    def __setstate__(self, state: dict[str, object]) -> None:
        vars(self).update(state)
        self._lock = threading.Lock()

    def put(self, session_id: str, content: str) -> str:
        """Store ``content`` for ``session_id`` and return its recall id."""
        with self._lock:
            return self._put(session_id, content)

    def _put(self, session_id: str, content: str) -> str:
        rid = recall_id(session_id, content)
        key = (session_id, rid)
        if key in self._held:
            return rid
        if key in self._free:
            self._free.move_to_end(key)
            return rid
        if rid in self._pins.get(session_id, ()):
            self._held[key] = content
        else:
            self._free[key] = content
        self._bytes += _size(content)
        self._evict(key)
        return rid

    def put_many(self, session_id: str, contents: Sequence[str]) -> list[str]:
        """`put` each of ``contents``."""
        with self._lock:
            return [self._put(session_id, c) for c in contents]

    def get(self, session_id: str, rid: str) -> str | None:
        """The content stored under ``rid`` for ``session_id``, or ``None``."""
        key = (session_id, rid)
        with self._lock:
            content = self._held.get(key)
            if content is None:
                content = self._free.get(key)
                if content is not None:
                    self._free.move_to_end(key)
            return content

    def pin(self, session_id: str, rids: Iterable[str]) -> None:
        """Mark exactly ``rids`` as still referenced by ``session_id``."""
        new = set(rids)
        with self._lock:
            old = self._pins.get(session_id, set())
            self._update_pins(session_id, new - old, old - new)

    def update_pins(self, session_id: str, added: Iterable[str], removed: Iterable[str]) -> None:
        """``added`` are referenced by ``session_id`` from now on, ``removed`` no longer: in
        O(1) per id."""
        with self._lock:
            self._update_pins(session_id, added, removed)

    def _update_pins(self, session_id: str, added: Iterable[str], removed: Iterable[str]) -> None:
        pins = self._pins.setdefault(session_id, set())
        for rid in removed:
            if rid in pins:
                pins.discard(rid)
                key = (session_id, rid)
                content = self._held.pop(key, None)
                if content is not None:
                    self._free[key] = content
        for rid in added:
            if rid not in pins:
                pins.add(rid)
                key = (session_id, rid)
                content = self._free.pop(key, None)
                if content is not None:
                    self._held[key] = content
        if not pins:
            del self._pins[session_id]
        self._evict()

    def release(self, session_id: str) -> None:
        """``session_id`` ended: its entries are kept only while there is room, and go first."""
        with self._lock:
            for rid in self._pins.pop(session_id, ()):
                key = (session_id, rid)
                content = self._held.pop(key, None)
                if content is not None:
                    self._free[key] = content
                    self._free.move_to_end(key, last=False)
            self._evict()

    def __len__(self) -> int:
        return len(self._free) + len(self._held)

    def _evict(self, newest: tuple[str, str] | None = None) -> None:
        for entries, pinned in ((self._free, False), (self._held, True)):
            while self._bytes > self.max_bytes and entries:
                key = next(iter(entries))
                if key == newest:
                    if len(entries) == 1:
                        break
                    entries.move_to_end(key)
                    continue
                self._bytes -= _size(entries.pop(key))
                if pinned:
                    self.evicted_pinned += 1
