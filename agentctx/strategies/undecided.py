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

from typing import TYPE_CHECKING

from agentctx.boundaries import repaired_message
from agentctx.messages import AssistantMessage, ToolCall, ToolResultMessage, UserMessage

if TYPE_CHECKING:
    from collections.abc import Sequence

    from agentctx.ledger import Ledger
    from agentctx.messages import Message

__all__ = ["alone", "decided", "raw_call", "undecided"]


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


def alone(call: ToolCall, calls: Sequence[ToolCall]) -> bool:
    """Whether ``call`` is the only one of ``calls`` (its message's) with its id: decisions
    name calls by id, so only such a call can change alone."""
    return sum(c.id == call.id for c in calls) == 1


def raw_call(
    original: AssistantMessage, shown: AssistantMessage, call: ToolCall
) -> ToolCall | None:
    """The call of ``original`` that ``call``, a call of ``shown`` (``original`` as the view
    sends it), stands for.

    ``None`` when its raw id names another call of ``original`` too: decisions name calls by
    id, so none could change that call alone.
    """
    k = next((k for k, c in enumerate(shown.tool_calls) if c is call), None)
    calls = original.tool_calls
    if k is None or k >= len(calls):
        return None
    mine = calls[k]
    return mine if alone(mine, calls) else None


def _repaired(shown: Message, original: Message) -> bool:
    """Whether `repair` alone (renamed tool-call ids, blank text left out) turns ``original``
    into ``shown``."""
    if isinstance(shown, ToolResultMessage) and isinstance(original, ToolResultMessage):
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
