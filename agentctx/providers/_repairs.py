"""The repairs of a wrapped call named by the caller's indexes, not the manager's.

The manager names a repaired message (`TranscriptRepaired`) by its index in the neutral
history it was given. A wrapper converts the caller's list first, so that index is not the
caller's: the leading system / developer messages of a Chat or Responses request are split
off, an Anthropic user message holding several tool results is a message per result, and a
Responses assistant turn (its message, reasoning and function call items in a row) is one
message. While a wrapped call prepares (`naming_items`), the session's event hub rewrites each
`TranscriptRepaired` to the caller's indexes before any subscriber sees it.

```python
name_repairs_by_caller(manager)               # once: the Compactor does it
with naming_items(lambda i: offset + item_of(i)):
    view = await manager.prepare(messages)    # its repairs name the caller's items
```
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

from agentctx.events import EventHub, TranscriptRepaired

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from agentctx.events import Event

__all__ = ["name_repairs_by_caller", "naming_items"]


class _Naming:
    """The caller's index of each message of a wrapped call, until its `naming_items` ends
    (``None`` then: a task the call started keeps this object in its context, and must
    neither rename later repairs nor keep the call's map alive)."""

    __slots__ = ("item_of",)

    def __init__(self, item_of: Callable[[int], int]) -> None:
        self.item_of: Callable[[int], int] | None = item_of


# The wrapped call preparing in this context, if any. A context variable, not an attribute:
# calls of one session overlap (one waits for its turn while another's strategy awaits), and
# each task reports its own repairs.
_NAMING: ContextVar[_Naming | None] = ContextVar("agentctx_naming", default=None)

# A repair as the manager writes it: "<kind>@<raw index>[:<tool call id>][-><new id>]".
_REPAIR = re.compile(r"([^@]*)@(\d+)")


def name_repairs_by_caller(manager: object) -> None:
    """Have ``manager``'s `TranscriptRepaired` events name the caller's items during
    `naming_items`; a manager done already, or one with no event hub of its own, is left as
    it is."""
    # The manager emits the event from inside prepare, to its hub: that hub's emit is the
    # one place the event passes before a subscriber has it.
    hub = getattr(manager, "_hub", None)
    if isinstance(hub, EventHub) and not isinstance(hub.emit, _CallerEmit):
        hub.emit = _CallerEmit(hub.emit)  # type: ignore[method-assign]


@contextmanager
def naming_items(item_of: Callable[[int], int]) -> Iterator[None]:
    """Within the block, the repairs the session reports name ``item_of(index)`` for each
    of its message indexes: the index of that message's item in the list the caller
    passed (blocks nest; each task sees its own)."""
    naming = _Naming(item_of)
    token = _NAMING.set(naming)
    try:
        yield
    finally:
        naming.item_of = None
        _NAMING.reset(token)


class _CallerEmit:
    """An `EventHub`'s ``emit`` that rewrites a `TranscriptRepaired` in a wrapped call."""

    __slots__ = ("_emit",)

    def __init__(self, emit: Callable[[Event], None]) -> None:
        self._emit = emit

    def __call__(self, event: Event) -> None:
        naming = _NAMING.get()
        item_of = None if naming is None else naming.item_of
        if item_of is not None and isinstance(event, TranscriptRepaired):
            event = TranscriptRepaired(tuple(_renamed(r, item_of) for r in event.repairs))
        self._emit(event)


def _renamed(repair: str, item_of: Callable[[int], int]) -> str:
    """``repair`` with its index the caller's; one not written as the manager writes them is
    left as it is."""
    match = _REPAIR.match(repair)
    if match is None:
        return repair
    kind, index = match.groups()
    return f"{kind}@{item_of(int(index))}{repair[match.end() :]}"
