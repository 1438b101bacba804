"""How a history handed to `ContextManager.prepare` relates to what the session holds.

Each check costs what the view depends on, not the history's length: lists compare in C, a
message is compared by identity, equality, or fingerprint (a history converted again from
provider dicts), and only where the view reads it (see `ContextManager.prepare`).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from operator import itemgetter
from typing import TYPE_CHECKING

from agentctx.boundaries import LEFT_OUT
from agentctx.errors import UnsupportedMessageError
from agentctx.messages import AssistantMessage, Message, ToolResultMessage, fingerprint

if TYPE_CHECKING:
    from agentctx.view import ViewState

_WHOLE_COMPARE = 32  # see extends_raw


def same_message(a: Message, b: Message) -> bool:
    # What is no message is never the same (it is refused once read as new).
    return a is b or a == b or (isinstance(a, Message) and fingerprint(a) == fingerprint(b))


def sliceable(history: object) -> bool:
    """Whether ``history`` is a sequence that slices (a `deque` is a `Sequence` that does
    not: it is read as any other iterable)."""
    if not isinstance(history, Sequence):
        return False
    try:
        history[:0]
    except TypeError:
        return False
    return True


def read_once(history: object) -> list[Message]:
    """A history given as a generator or another one-pass iterable, as the list it yields
    (what is then compacted and sent); `UnsupportedMessageError` for no iterable of them."""
    if not isinstance(history, Iterable) or isinstance(history, Mapping):
        kind = type(history).__name__
        raise UnsupportedMessageError(None, f"history of type {kind} (pass a list of messages)")
    return list(history)


def starts_with(history: Sequence[Message], prefix: list[Message]) -> bool:
    """Whether ``history`` begins with ``prefix``, item for item the same object or equal.

    A list compares two lists' items by address before anything else, touching no message,
    while a slice of the history would count a reference to each of its messages: on a long
    history, long out of the CPU's caches, that costs several times the comparison. So
    ``prefix`` is compared at the history's length: grown by the history's tail, then cut
    back (the comparison of a list of another length stops at the lengths).
    """
    n = len(prefix)
    if type(history) is not list:
        return history[:n] == prefix
    if len(history) < n:
        return False
    prefix += history[n:]
    try:
        return history == prefix
    finally:
        del prefix[n:]


def common_prefix(a: Sequence[Message], b: list[Message]) -> int:
    """Length of the common prefix: messages are the same when they are one object, equal
    (list comparison does both in C), or of one fingerprint."""
    n = min(len(a), len(b))
    # `a` at least as long as `b`: compared without slicing it (`starts_with`).
    whole = starts_with(a, b) if n == len(b) else a[:n] == b[:n]
    if whole:
        return n
    # Where they part, by comparing halves in C: a rewind or an edit near the end leaves a
    # long equal stretch, which walked in Python cost a fingerprint a message (made anew for
    # messages converted again: 80 ms a call at 10k messages).
    lo, hi = 0, n
    while hi - lo > 8:
        mid = (lo + hi) // 2
        part = a[lo:mid]
        if (part if type(part) is list else list(part)) == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    while lo < n and same_message(a[lo], b[lo]):
        lo += 1
    return lo


def extends_raw(history: Sequence[Message], state: ViewState) -> bool:
    """Whether ``history`` is the raw history with messages appended, judged by what the view
    depends on: every message it shows as it is or repaired, and the last one. Cost
    O(view), not O(history): a message a decision already replaced (cleared, condensed,
    summarized) is not compared, so editing it in place changes nothing sent (see
    `ContextManager.prepare`).
    """
    raw = state.raw
    n = len(raw)
    if len(history) < n:
        return False
    if n == 0:
        return True
    shown = state.shown
    last, known = history[n - 1], raw[n - 1]
    # A list compares in C at about a nanosecond a message (`starts_with`); picking out the
    # shown ones costs twenty times that each, and reads them. While the history is not much
    # longer than the view, the caller's own objects (the last one is) are compared whole.
    if last is known and n <= _WHOLE_COMPARE * len(shown) and starts_with(history, raw):
        return True
    # What repair left out (a result answering no call) is compared too: fixed in place, it
    # would answer its call, where the view goes on sending a stub for it.
    left_out = [r.origin for r in state.repairs if r.kind in LEFT_OUT and r.origin < n]
    if left_out and not all(same_message(history[i], raw[i]) for i in left_out):
        return False
    if len(shown) > 1:
        pick = itemgetter(*shown)
        if (last is known or last == known) and pick(history) == pick(raw):
            return True
    # Equal messages that are other objects (a history converted again from provider dicts).
    return same_message(history[n - 1], raw[n - 1]) and all(
        same_message(history[i], raw[i]) for i in shown
    )


def extends_view(history: Sequence[Message], state: ViewState) -> bool:
    """Whether ``history`` is the view last returned with messages appended (owned mode)."""
    view = state.view
    n = len(view)
    if len(history) < n:
        return False
    # The last message first: a history that is not the view mostly differs there (a stub
    # repair added for an open call, where the history holds its result), and the full
    # comparison then walks every message, reading each one's fingerprint.
    return n == 0 or (
        same_message(history[n - 1], view[n - 1]) and common_prefix(history, view) == n
    )


def newest_reply(raw: Sequence[Message]) -> int | None:
    """Index of the newest assistant message of ``raw`` (how many messages its prompt
    held); ``None`` when there is none."""
    for i in range(len(raw) - 1, -1, -1):
        if isinstance(raw[i], AssistantMessage):
            return i
    return None


def shown_until(state: ViewState) -> int:
    """The raw index past what the view's messages stand for: the raw history after it is a
    tail the view left out. O(last tool batch)."""
    view, origins = state.view, state.origins
    if not view:
        return 0
    # Stubs for missing results take the origin of their call's message, after the results.
    k = len(view) - 1
    top = origins[k]
    while k > 0 and isinstance(view[k], ToolResultMessage):
        k -= 1
        top = max(top, origins[k])
    span = state.ledger.span_covering(top)
    return span.end if span is not None else top + 1


def raw_from(
    view: Sequence[Message], origins: Sequence[int], raw: Sequence[Message], k: int
) -> int:
    """The raw index where what ``view[k:]`` stands for begins: the origin of the first of
    them that stands for a raw message. A stub for a missing result stands for none: it
    takes the origin of its call's message, which ``view[:k]`` holds when it leads."""
    while k < len(view):
        origin = origins[k]
        if not isinstance(view[k], ToolResultMessage) or isinstance(raw[origin], ToolResultMessage):
            return origin
        k += 1
    return len(raw)


def view_below(
    view: list[Message], origins: list[int], raw: Sequence[Message], end: int, cut: int
) -> tuple[list[Message], list[int], int]:
    """The leading messages of ``view`` (which stands for ``raw[:end]``) that stand for
    ``raw[:cut]`` at most, their origins, and the raw length they stand for."""
    if end <= cut:
        return view, origins, end
    j = bisect.bisect_left(origins, cut)
    while j > 0 and raw_from(view, origins, raw, j) > cut:
        j -= 1
    return view[:j], origins[:j], raw_from(view, origins, raw, j)
