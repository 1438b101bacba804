"""Which view messages are still undecided, however `repair` rewrote them.

The view holds other objects than the raw history not only where a decision replaced or hid
a message but also where `agentctx.boundaries.repair` renamed a duplicate tool-call id (and
its result) or left out blank text blocks. So what a strategy may still decide is read from
the ledger, not from object identity; the decision then anchors on the raw message, and
rendering renames its result again, so the view stays provider-valid:

```python
original = undecided(ctx.ledger, ctx.raw, ctx.view, ctx.origins, j)
if isinstance(original, ToolResultMessage):
    ctx.take(ReplaceResult(anchor(ctx.raw, ctx.origins[j]), (TextBlock("[cleared]"),), "why"))
```
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from agentctx.boundaries import repaired_message
from agentctx.messages import AssistantMessage, ToolCall, ToolResultMessage, UserMessage

if TYPE_CHECKING:
    from collections.abc import Sequence

    from agentctx.ledger import Ledger
    from agentctx.messages import Message

__all__ = ["alone", "decided", "raw_calls", "undecided"]


def decided(ledger: Ledger, index: int) -> bool:
    """Whether a decision is anchored at raw ``index`` or a span hides it."""
    return bool(ledger.decisions_at(index)) or ledger.span_covering(index) is not None


def undecided(
    ledger: Ledger,
    raw: Sequence[Message],
    view: Sequence[Message],
    origins: Sequence[int],
    j: int,
) -> Message | None:
    """The raw message that ``view[j]`` shows with no decision applied, else ``None``.

    ``None`` also when ``view[j]`` is not that raw message as `repair` sends it: a stub result
    or a leading summary repair added, or a stand-in of the caller's.
    """
    i = origins[j]
    if not 0 <= i < len(raw) or decided(ledger, i):
        return None
    original, shown = raw[i], view[j]
    return original if shown is original or _repaired(shown, original) else None


def alone(calls: Sequence[ToolCall]) -> list[ToolCall]:
    """The calls of ``calls`` (one message's) that are the only ones with their ids:
    decisions name calls by id, so only such a call can change alone. O(calls)."""
    counts = Counter(c.id for c in calls)
    return [c for c in calls if counts[c.id] == 1]


def raw_calls(original: AssistantMessage, shown: AssistantMessage) -> dict[int, ToolCall]:
    """For each call of ``shown`` (``original`` as the view sends it), by its ``id()``, the
    call of ``original`` it stands for, in O(calls) for all of them.

    A call whose raw id names another call of ``original`` too is left out: decisions name
    calls by id, so none could change that call alone.
    """
    calls = original.tool_calls
    counts = Counter(c.id for c in calls)
    return {
        id(call): mine
        for call, mine in zip(shown.tool_calls, calls, strict=False)
        if counts[mine.id] == 1
    }


def _repaired(shown: Message, original: Message) -> bool:
    """Whether `repair` alone (renamed tool-call ids, blank text left out) turns ``original``
    into ``shown``."""
    if isinstance(shown, ToolResultMessage) and isinstance(original, ToolResultMessage):
        if shown.content != original.content:
            # Repair said a failed tool's empty output, or left out blank text beside others.
            cleaned = repaired_message(original)
            if not isinstance(cleaned, ToolResultMessage):
                return False
            original = cleaned
        return (
            shown.content == original.content
            and shown.tool_name == original.tool_name
            and shown.is_error == original.is_error
            and shown.extra == original.extra
        )
    cleaned = repaired_message(original)
    if isinstance(shown, UserMessage):
        return shown == cleaned
    if not isinstance(shown, AssistantMessage) or not isinstance(cleaned, AssistantMessage):
        return False
    if (shown.stop_reason, shown.usage, shown.model, shown.extra) != (
        cleaned.stop_reason,
        cleaned.usage,
        cleaned.model,
        cleaned.extra,
    ) or len(shown.content) != len(cleaned.content):
        return False
    return all(
        a == b
        or (
            isinstance(a, ToolCall)
            and isinstance(b, ToolCall)
            and (a.name, a.arguments, a.extra) == (b.name, b.arguments, b.extra)
        )
        for a, b in zip(shown.content, cleaned.content, strict=True)
    )
