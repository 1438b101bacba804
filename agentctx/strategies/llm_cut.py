"""Where `LlmCompaction` cuts the view for a summary, and whether that span can still be spliced.

```python
cut = choose_cut(ctx, keep_first=1, retain=8_000)    # a Cut, or why there is none
rewinds = ctx.rewinds                                 # raw[:raw_cut] is what it summarizes
...                                                   # later, when the briefing is back:
if intact(ctx, raw_cut, rewinds) and (where := extent(ctx.ledger.spans, start, raw_cut)):
    end, carried = where                              # splice raw [start, end), then carried
```

Cuts are view indexes; `intact` and `extent` work in raw positions, which decisions taken in
the meantime do not renumber.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from agentctx import boundaries as b

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from agentctx.ledger import ReplaceSpan
    from agentctx.messages import Message
    from agentctx.strategy import CompactionContext

__all__ = ["MIN_SUMMARIZED_SPAN", "Cut", "NoCut", "choose_cut", "extent", "head_end", "intact"]

MIN_SUMMARIZED_SPAN = 4
"""A span of fewer view messages is not worth a request or a cache break."""

NoCut = Literal["short", "tail", "protected"]
"""Why there is no span: the history is short, the retained tail swallows it, or what is left
is protected for now."""


@dataclass(frozen=True, slots=True)
class Cut:
    """The span to summarize: view messages ``[start, end)``."""

    start: int
    end: int


def head_end(view: Sequence[Message], keep_first: int) -> int:
    """View index where the head (sent verbatim, never summarized) ends: through the task and
    at least ``keep_first`` messages, pulled back to a safe cut."""
    task = b.task_index(view)
    head = max(keep_first, 0 if task is None else task + 1)
    return b.safe_cut(view, min(head, len(view)))


def choose_cut(ctx: CompactionContext, keep_first: int, retain: int) -> Cut | NoCut:
    """The span to summarize in ``ctx.view``, or why there is none.

    The span is the oldest stretch between the head and a tail of about ``retain`` tokens that
    holds no protected message (invariants 2 and 3): the latest user message, the newest
    complete turn, signed thinking of the in-flight tool loop (nothing after that is
    summarized). Both ends are safe cuts, so no tool batch is split.
    """
    view = ctx.view
    n = len(view)
    head = head_end(view, keep_first)
    count, count_many = ctx.counter.count, ctx.counter.count_many
    cut, kept = n, 0
    while cut > head and kept < retain:
        cut -= 1
        kept += count(view[cut])
    by_tail = b.safe_cut(view, cut)
    end = by_tail
    for j in range(max(head, ctx.in_flight_start()), end):
        if b.has_thinking(view[j]):
            end = b.safe_cut(view, j)
            break
    barriers: list[tuple[int, int]] = []
    latest = b.latest_user_index(view)
    if latest is not None:
        barriers.append((latest, latest + 1))
    complete = ctx.protected_turn
    if complete is not None:
        barriers.append(complete)
    start = head
    for lo, hi in sorted(barriers):
        if hi <= start or lo >= end:
            continue
        if b.safe_cut(view, lo) - start >= MIN_SUMMARIZED_SPAN:
            end = b.safe_cut(view, lo)
            break
        start = max(start, hi)  # too little before it: try the stretch after it
    if end - start >= MIN_SUMMARIZED_SPAN:
        return Cut(start, end)
    if by_tail - head >= MIN_SUMMARIZED_SPAN:
        return "protected"  # transient: the latest user message or turn moves on
    # Only one reason is a misconfiguration: a tail that swallows the history even at the
    # limit. A history that is merely short grows out of it, and must not spend the one-shot
    # warning.
    limit = ctx.budget.limit
    if ctx.prompt_tokens > limit or count_many(view[:head]) + retain >= limit:
        return "tail"
    return "short"


def intact(ctx: CompactionContext, cut: int, rewinds: int) -> bool:
    """Whether ``ctx.raw[:cut]`` is still what it was when `CompactionContext.rewinds` was
    ``rewinds``: no rewind or edit since cut the history back below ``cut``. (A history cut
    back and extended again with equal messages counts as changed.)"""
    low = ctx.rewound_to(rewinds)
    return low is None or low >= cut


def extent(
    spans: Iterable[ReplaceSpan], start: int, cut: int
) -> tuple[int, tuple[Message, ...]] | None:
    """Where a splice of raw ``[start, cut)`` ends given the visible ``spans``, and the
    replacement it carries on; ``None`` when it cannot be spliced any more.

    A span that starts inside ``[start, cut)`` and runs past ``cut`` (the tiers dropped or
    condensed there meanwhile) is taken in whole: the splice ends where it ends and sends its
    replacement after the briefing, byte for byte, so nothing it stood for is lost. A span
    across ``start`` cannot be merged. Spans strictly inside are replaced with the rest.
    """
    for span in spans:
        x, y = span.at.index, span.end
        if x < start < y:
            return None
        if x < cut < y:
            return y, span.replacement
    return cut, ()
