"""The session's raw history and its cached view, kept in step at O(new messages) per call.

The view of the settled prefix of the raw history never changes until a decision is taken or
the history is rewound, so it is rendered once and reused; only the unsettled tail (a tool
batch still waiting for results, whose stubs `repair` adds) is rendered again on each call.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from dataclasses import replace
from functools import reduce
from operator import add, sub
from typing import TYPE_CHECKING

from agentctx.boundaries import CompleteTurns, answered_call_ids, safe_cut
from agentctx.ledger import (
    Ledger,
    Rendered,
    ReplaceSpan,
    render,
    render_message,
    shown_positions,
)
from agentctx.messages import AssistantMessage, Message, ToolResultMessage

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence

    from agentctx.boundaries import Repair
    from agentctx.ledger import Decision
    from agentctx.tokens import MessageCounter

__all__ = ["ViewState"]

# Settling this many messages at once (a rebuild) sums their vectors slot by slot; fewer (a
# call's new messages) are added one at a time, which costs less for a few.
_TRANSPOSE_FROM = 8
_READ_TURNS_FROM = 32  # an append this long reads its turns at once (see `append`)
_PATCH_AT_MOST = 32  # decisions added since the last render that `refresh` patches in place


def _settle_point(raw: Sequence[Message]) -> int:
    """Index before which appending can no longer change the rendering."""
    n = i = len(raw)
    while i > 0 and isinstance(raw[i - 1], ToolResultMessage):
        i -= 1
    if i > 0:
        last = raw[i - 1]
        if isinstance(last, AssistantMessage):
            calls = [c.id for c in last.tool_calls]
            answered = [m.tool_call_id for m in raw[i:n]]  # type: ignore[union-attr]
            # Counted, not a set: a batch may repeat an id, one result per call (see `repair`).
            if calls and calls != answered and Counter(calls) - Counter(answered):
                return i - 1
    return n


def _fold(
    vec: list[float], vectors: Sequence[tuple[float, ...]], op: Callable[[float, float], float]
) -> None:
    """Fold ``vectors`` into ``vec`` with ``op`` (add or sub), slot by slot, in order."""
    if len(vectors) < _TRANSPOSE_FROM:
        for vector in vectors:
            vec[:] = map(op, vec, vector)
    else:  # slot by slot, in view order: the same sums, without a list per message
        columns = zip(*vectors, strict=True)
        vec[:] = [reduce(op, col, v) for v, col in zip(vec, columns, strict=True)]


def _call_ids(messages: Sequence[Message]) -> Iterator[str]:
    return (c.id for m in messages if isinstance(m, AssistantMessage) for c in m.tool_calls)


class ViewState:
    """Raw history, ledger and the rendered view of one session."""

    __slots__ = (
        "_counter",
        "_prefix_ids",
        "_prefix_keys",
        "_prefix_len",
        "_prefix_vec",
        "__weakref__",
        "_rendered",
        "_settled_raw",
        "_shown_in_prefix",
        "_tokens_memo",
        "_version",
        "cuts",
        "ledger",
        "origins",
        "raw",
        "repairs",
        "repairs_version",
        "shown",
        "turns",
        "view",
    )

    def __init__(self, counter: MessageCounter, ledger: Ledger | None = None) -> None:
        self.raw: list[Message] = []
        # The raw history's newest complete turn, read up to date when asked for: only a
        # strategy that decides needs it.
        self.turns = CompleteTurns()
        self.ledger = ledger if ledger is not None else Ledger()
        self.view: list[Message] = []
        self.origins: list[int] = []
        # Raw indices of the messages the view shows as they are or repaired (a call id
        # renamed, a blank block left out), in view order: what a history passed in must
        # still hold for the view to stay true to it.
        self.shown: list[int] = []
        self._shown_in_prefix = 0  # how many of them are in view[:_prefix_len]
        self.repairs: list[Repair] = []
        self.repairs_version = 0
        # Where each cut back of the raw history (a rewind, an edit) went to, in order: what
        # was computed from raw[:i] still holds while no later cut went below i.
        self.cuts: list[int] = []
        self._counter = counter
        self._settled_raw = 0  # raw[:_settled_raw] renders to view[:_prefix_len] for good
        self._prefix_len = 0
        # Token accounting of the settled prefix as a per-slot vector sum, so calibration
        # changes cost O(slots) and refined estimates are applied as deltas.
        self._prefix_vec = [0.0] * len(counter.slots)
        self._prefix_keys: Counter[object] = Counter()  # estimate keys of the prefix: how often
        # Tool-call ids of view[:_prefix_len]: the tail is repaired as their continuation.
        self._prefix_ids: set[str] = set()
        counter.on_refined(self._refined)
        # ``tokens`` as (view version, counter generation, value): read several times a call.
        self._tokens_memo = (-1, -1, 0)
        self._version = 0  # bumped whenever the view or its prefix vector changes
        # The ledger's (version, decisions) the view was last rendered under: what `refresh`
        # renders again is what the decisions added since then touch.
        self._rendered = (self.ledger.version, len(self.ledger))

    # -- changes ------------------------------------------------------------------------

    def append(self, messages: Sequence[Message]) -> None:
        """Append new raw messages and bring the view up to date."""
        if not messages:
            return
        start = len(self.raw)
        self.raw.extend(messages)
        if len(messages) > _READ_TURNS_FROM:
            # A bulk append (a loaded or resumed history) is read for turns now, so the first
            # decision after it does not; a call's few new messages wait for a decision.
            self.turns.update(self.raw)
        if not self._append_as_is(start, messages):
            self._render_tail()

    def _append_as_is(self, start: int, messages: Sequence[Message]) -> bool:
        """The common append, in O(new messages) without a render: everything before is
        settled, no decision touches the new messages and they need no repair, so the view
        grows by them as they are and they settle at once."""
        keep = self._prefix_len
        if not (
            keep == len(self.view)
            and keep
            and self._settled_raw == start
            and self.ledger.end <= start
            and not (self.repairs and self.repairs[-1].index >= keep)
        ):
            return False
        ids = answered_call_ids(messages, self._prefix_ids)
        if ids is None:
            return False
        self._version += 1
        self.view += messages
        indices = range(start, len(self.raw))
        self.origins += indices
        self.shown += indices
        self._settle_prefix(len(self.view), len(self.raw), ids)
        return True

    def truncate(self, index: int) -> int:
        """Cut the raw history back to ``index``; drop decisions after it; return how many.
        The view is rendered again from there only (from where a dropped decision began, if
        lower): what comes before it renders as it did, so editing the newest message costs
        O(what it changes), not O(history)."""
        del self.raw[index:]
        self.cuts.append(index)
        if not self.turns.cut(index):
            self.turns = CompleteTurns()
        dropped = self.ledger.drop_from(index)
        self.repairs_version += 1  # as a rebuild: what the view was rendered under changed
        # A tool batch whose results were cut is open again: it renders whole, stubs and all.
        self._render_from(min([_settle_point(self.raw), *(d.at.index for d in dropped)]))
        return len(dropped)

    def refresh(self) -> None:
        """Bring the view up to date with the ledger: render again from the first message the
        decisions added since the last render touch (everything, after any was dropped)."""
        ledger = self.ledger
        version, count = self._rendered
        added = len(ledger) - count
        if ledger.version == version:
            return
        if (
            added <= 0
            or ledger.version != version + added
            or ledger.renderings > 2 * len(self.view) + 64
        ):
            # Only a full render lets the ledger drop what it rendered for messages hidden
            # since (a few times a long session).
            self.rebuild()
            return
        added_since = ledger.added_since(count)
        if added <= _PATCH_AT_MOST and self._patch(added_since):
            self._rendered = (ledger.version, len(ledger))
            return
        self._render_from(min(d.at.index for d in added_since))

    def _render_from(self, cut: int) -> None:
        """Render the view again from raw message ``cut`` on. Render is per message and
        `repair` keeps to its batch, so the view before a safe cut at or below it (not inside
        a span) stays as it is."""
        ledger = self.ledger
        while True:
            cut = safe_cut(self.raw, cut)
            span = ledger.span_covering(cut)
            if span is None or span.at.index >= cut:
                break
            cut = span.at.index
        if cut < self._settled_raw:
            stop = bisect_left(self.origins, cut)
            if not stop:
                self.rebuild()
                return
            # The settled prefix shrinks to what stays: what leaves it is taken out of its
            # sums, or, when that is most of it, what stays is summed anew.
            if stop < self._prefix_len - stop:
                self._clear_prefix()
                self._settle_prefix(stop, cut)
            else:
                self._unsettle(stop, cut)
        self._render_tail()

    def _patch(self, decisions: Sequence[Decision]) -> bool:
        """Apply per-message ``decisions`` in place, tool batch by tool batch, in O(batch)
        each, where rendering again from the first would cost O(view) (a strategy that reads
        the view after each `take` would be quadratic). Only where each batch is settled,
        shown one message for one, and needs no repair before or after: else ``False``, with
        nothing changed. Render is per message and `repair` keeps to its batch, so what the
        patch leaves is what a full render gives."""
        raw, ledger, origins = self.raw, self.ledger, self.origins
        batches: dict[int, int] = {}
        for d in decisions:
            if isinstance(d, ReplaceSpan):
                return False
            start = safe_cut(raw, d.at.index)
            if start not in batches:
                end = start + 1
                while end < len(raw) and isinstance(raw[end], ToolResultMessage):
                    end += 1
                batches[start] = end
        plans: list[tuple[int, int, int, list[Message]]] = []
        for start, end in batches.items():
            j = bisect_left(origins, start)
            k = j + end - start
            if (
                end > self._settled_raw
                or k > self._prefix_len
                or origins[j:k] != list(range(start, end))
                or (k < len(origins) and origins[k] < end)  # a stub repair added
                or ledger.hides_any(start, end)
                or any(start <= r.origin < end for r in self.repairs)
            ):
                return False
            new = [render_message(raw, ledger, i) for i in range(start, end)]
            ids = answered_call_ids(new, frozenset())
            if ids is None or ids != answered_call_ids(self.view[j:k], frozenset()):
                return False
            plans.append((start, end, j, new))
        counter, held, shown = self._counter, self._prefix_keys, self.shown
        for start, end, j, new in plans:
            old = self.view[j : j + len(new)]
            self.view[j : j + len(new)] = new
            gone, gone_vectors = counter.keyed_vectors(old)
            come, come_vectors = counter.keyed_vectors(new)
            for key in gone:
                held[key] -= 1
                if held[key] <= 0:
                    del held[key]
            for key in come:
                held[key] = held.get(key, 0) + 1
            _fold(self._prefix_vec, gone_vectors, sub)
            _fold(self._prefix_vec, come_vectors, add)
            lo, hi = bisect_left(shown, start), bisect_left(shown, end)
            shown[lo:hi] = [
                i
                for i, m in zip(range(start, end), new, strict=True)
                if raw[i] is m or self._repaired(raw[i], m, i)
            ]
        self._shown_in_prefix = bisect_left(shown, self._settled_raw)
        self._version += 1
        return True

    def rebuild(self) -> None:
        """Render everything again (after new decisions)."""
        self._clear_prefix()
        self.view, self.origins, self.repairs = [], [], []
        self.shown = []
        self.repairs_version += 1
        self._render_tail()

    def _clear_prefix(self) -> None:
        self._settled_raw = 0
        self._prefix_len = 0
        self._prefix_vec = [0.0] * len(self._counter.slots)
        self._prefix_keys = Counter()
        self._prefix_ids = set()
        self._shown_in_prefix = 0

    def _render_tail(self) -> None:
        self._version += 1
        self._rendered = (self.ledger.version, len(self.ledger))
        start = self._settled_raw
        span = self.ledger.span_covering(start)
        if span is not None and span.at.index < start:
            start = span.at.index
            self.rebuild()
            return
        keep = self._prefix_len
        continues = self._prefix_ids if keep else None  # nothing before: the tail opens the view
        tail: Rendered = render(self.raw, self.ledger, start, continues)
        self.view[keep:] = tail.messages
        self.origins[keep:] = tail.origins
        raw = self.raw
        del self.shown[self._shown_in_prefix :]
        self.shown += [
            i
            for m, i in zip(tail.messages, tail.origins, strict=True)
            if raw[i] is m or self._repaired(raw[i], m, i)
        ]
        # A repair belongs with the raw message it was made for: one that left a message out
        # of the view has no position in it to tell prefix from tail.
        if tail.repairs or (self.repairs and self.repairs[-1].origin >= start):
            prefix_repairs = [r for r in self.repairs if r.origin < start]
            self.repairs = prefix_repairs + [replace(r, index=r.index + keep) for r in tail.repairs]
            self.repairs_version += 1
        settle = _settle_point(self.raw)
        span = self.ledger.span_covering(settle)
        if span is not None:
            settle = span.at.index
        if settle > self._settled_raw:
            view, origins = self.view, self.origins
            stop = keep
            while stop < len(view) and origins[stop] < settle:
                stop += 1
            self._settle_prefix(stop, settle)

    def _repaired(self, original: Message, rendered: Message, i: int) -> bool:
        """Whether ``rendered`` (at origin ``i``) is ``original`` repaired: not a decision's
        replacement, nor a message repair added (a stub, a leading summary)."""
        ledger = self.ledger
        return (
            type(rendered) is type(original)
            and not ledger.decisions_at(i)
            and ledger.span_covering(i) is None
        )

    def _settle_prefix(self, stop: int, settle: int, ids: Iterable[str] | None = None) -> None:
        """Add ``view[_prefix_len:stop]`` to the settled prefix, which then stands for
        ``raw[:settle]``; ``ids``: their tool-call ids, when the caller has them already."""
        keep = self._prefix_len
        if stop > keep:
            settled = self.view[keep:stop]
            keys, vectors = self._counter.keyed_vectors(settled)
            held = self._prefix_keys
            if len(keys) < _TRANSPOSE_FROM:  # `update` costs an ABC check for a call's few
                for key in keys:
                    held[key] = held.get(key, 0) + 1
            else:
                held.update(keys)
            _fold(self._prefix_vec, vectors, add)
            self._prefix_ids.update(_call_ids(settled) if ids is None else ids)
            # Raw indices of what the view shows as is or repaired rise with it (`shown`).
            self._shown_in_prefix = bisect_left(self.shown, settle)
        self._prefix_len = stop
        self._settled_raw = settle

    def _unsettle(self, stop: int, settle: int) -> None:
        """Take ``view[stop:_prefix_len]`` out of the settled prefix, which then stands for
        ``raw[:settle]``."""
        left = self.view[stop : self._prefix_len]
        if not left:  # the raw messages that leave it left nothing in the view
            self._settled_raw = settle
            return
        keys, vectors = self._counter.keyed_vectors(left)
        held = self._prefix_keys
        held.subtract(keys)
        for key in keys:
            if held[key] <= 0:
                del held[key]
        _fold(self._prefix_vec, vectors, sub)
        # Repair keeps a view's call ids distinct: none that leaves is also one that stays.
        self._prefix_ids.difference_update(_call_ids(left))
        self._shown_in_prefix = bisect_left(self.shown, settle)
        self._prefix_len = stop
        self._settled_raw = settle

    def _refined(self, key: object, delta: tuple[float, ...]) -> None:
        """The counter replaced the vector of the messages estimated as ``key``."""
        times = self._prefix_keys.get(key)
        if times:
            vec = self._prefix_vec
            vec[:] = map(add, vec, delta if times == 1 else [d * times for d in delta])
        self._version += 1

    # -- reading ------------------------------------------------------------------------

    def complete_turn(self) -> tuple[int, int] | None:
        """``[start, end)`` of the raw history's newest complete turn (`newest_complete_turn`),
        in O(messages appended since the last time it was asked for)."""
        self.turns.update(self.raw)
        return self.turns.newest

    def latest_user(self) -> int | None:
        """Raw index of the latest user message, in O(messages appended since asked)."""
        self.turns.update(self.raw)
        return self.turns.latest_user

    def shown_positions(self) -> set[int]:
        """`agentctx.ledger.shown_positions` of the raw history, its turns read as they
        grew rather than searched for from the end again."""
        return shown_positions(self.raw, self.latest_user(), self.complete_turn())

    def vector(self) -> list[float]:
        """The uncalibrated per-slot sum of the view's messages (`MessageCounter.vector`)."""
        total = list(self._prefix_vec)
        vector = self._counter.vector
        for m in self.view[self._prefix_len :]:
            total[:] = map(add, total, vector(m))
        return total

    @property
    def tokens(self) -> int:
        """Estimated tokens of the view's messages (no system prompt or tools)."""
        counter = self._counter
        key = (self._version, counter.generation)
        version, generation, tokens = self._tokens_memo
        if (version, generation) == key:
            return tokens
        tail = self.view[self._prefix_len :]
        tokens = counter.total(self._prefix_vec) + (counter.count_many(tail) if tail else 0)
        self._tokens_memo = (*key, tokens)
        return tokens
