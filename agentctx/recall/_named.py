"""Which recall ids the raw history names, followed as it grows and is cut back.

A decision dropped by a rewind or an edit leaves its recall entry pinned while a raw message
still names it (an owned caller's history holds the placeholders of the view it kept, a
model's tool call may quote an id). `NamedInRaw` answers that in O(what changed since it
last looked): the messages it read are compared with the history in C, and only those
after the first that differs are read again.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING

from agentctx._follow import common_prefix
from agentctx.messages import (
    AssistantMessage,
    ImageBlock,
    OpaqueBlock,
    RedactedThinkingBlock,
    SummaryMessage,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    canonical_json,
)

if TYPE_CHECKING:
    from collections.abc import Sequence, Set

    from agentctx.messages import Message

RECALL_ID = re.compile(r"ctx-[0-9a-f]{16}")


class NamedInRaw:
    """The recall ids named by the messages of a raw history: `named` of the history."""

    __slots__ = ("_held", "_messages", "_names")

    def __init__(self) -> None:
        self._messages: list[Message] = []  # as last read
        self._names: list[tuple[str, ...]] = []  # the ids each of them names
        self._held: Counter[str] = Counter()  # by how many of them

    def named(self, ids: Set[str], raw: Sequence[Message]) -> set[str]:
        """Those of ``ids`` that messages of ``raw`` name."""
        self._follow(raw)
        held = self._held
        return {rid for rid in ids if rid in held}

    def _follow(self, raw: Sequence[Message]) -> None:
        messages, names, held = self._messages, self._names, self._held
        n = common_prefix(raw, messages)
        for gone in names[n:]:
            for rid in gone:
                held[rid] -= 1
                if not held[rid]:
                    del held[rid]
        del messages[n:], names[n:]
        for m in raw[n:]:
            found = _names_in(m)
            messages.append(m)
            names.append(found)
            held.update(found)


def _names_in(m: Message) -> tuple[str, ...]:
    # Serialized only where a string names one: all of them took seconds on the loop for a
    # long session's rewind. (Nested past what the walk takes: serialized.)
    try:
        maybe = _names_one(m)
    except RecursionError:
        maybe = True
    return tuple(RECALL_ID.findall(canonical_json(m))) if maybe else ()


def _names_one(m: Message) -> bool:
    """Whether a string of ``m`` (any field of it or of its blocks) holds ``ctx-``."""
    if _holds_id([getattr(m, name) for name in _FIELDS[type(m)]]):
        return True
    if isinstance(m, SummaryMessage):
        return False
    for b in m.content:
        if isinstance(b, TextBlock):  # (most blocks: checked without the general walk)
            if "ctx-" in b.text or (b.extra and _holds_id(b.extra)):
                return True
        elif _holds_id([getattr(b, name) for name in _FIELDS[type(b)]]):
            return True
    return False


# Each message and block type's fields but its content (walked block by block).
_FIELDS = {
    t: tuple(f.name for f in dataclasses.fields(t) if f.name != "content" and f.name[0] != "_")
    for t in (
        UserMessage,
        AssistantMessage,
        ToolResultMessage,
        SummaryMessage,
        TextBlock,
        ThinkingBlock,
        RedactedThinkingBlock,
        ImageBlock,
        ToolCall,
        OpaqueBlock,
    )
}


def _holds_id(value: object) -> bool:
    if isinstance(value, str):
        return "ctx-" in value
    # Most fields are told apart before the abstract `Mapping` check, which costs more.
    if value is None or isinstance(value, int | float):
        return False
    if isinstance(value, list | tuple):
        return any(map(_holds_id, value))
    if isinstance(value, dict | Mapping):
        return any(map(_holds_id, value.values())) or any(map(_holds_id, value.keys()))
    return False
