"""Turns, tool batches, safe cut points, repair and validation: the one place that knows them.

Every strategy asks this module where it may cut; every view passes through `repair` before it
leaves agentctx, and every test view through `validate`.

Vocabulary:

- a **turn** starts at a `UserMessage` and runs to the next one (a `SummaryMessage` stands
  for compacted history inside whatever turn it sits in; it starts none);
- a **step** is one `AssistantMessage` plus the tool results that answer its calls (a parallel
  batch is one step; it is never split);
- a **safe cut** is an index where a history may be split: any message but a tool result,
  once the history is repaired;
- the **in-flight tool loop** is everything after the latest user message: its signed thinking
  goes back byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from agentctx.messages import (
    AssistantMessage,
    Message,
    RedactedThinkingBlock,
    SummaryMessage,
    TextBlock,
    ThinkingBlock,
    ToolResultMessage,
    UserMessage,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "MISSING_RESULT_TEXT",
    "Provider",
    "Repair",
    "has_thinking",
    "in_flight_start",
    "latest_user_index",
    "newest_complete_turn",
    "repair",
    "safe_cut",
    "task_index",
    "turn_starts",
    "validate",
]

Provider = Literal["anthropic", "openai"]

MISSING_RESULT_TEXT = "[agentctx: no result was recorded for this tool call; it was interrupted]"


def turn_starts(messages: Sequence[Message]) -> list[int]:
    """Indexes of the messages that open a turn, in order."""
    return [i for i, m in enumerate(messages) if isinstance(m, UserMessage)]


def safe_cut(messages: Sequence[Message], index: int) -> int:
    """Pull ``index`` back until splitting there separates no tool call from its result.

    The fixed point of "pull back past tool results" and "pull back past an assistant message
    whose calls are answered after ``index``": on a repaired history both reduce to stepping
    back over tool results onto the assistant message that opened them.
    """
    i = max(0, min(index, len(messages)))
    while 0 < i < len(messages) and isinstance(messages[i], ToolResultMessage):
        i -= 1
    return i


def task_index(messages: Sequence[Message]) -> int | None:
    """Index of the first user message: the task. ``None`` if there is none."""
    for i, m in enumerate(messages):
        if isinstance(m, UserMessage):
            return i
    return None


def latest_user_index(messages: Sequence[Message]) -> int | None:
    """Index of the latest user message, ``None`` if there is none."""
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], UserMessage):
            return i
    return None


def in_flight_start(messages: Sequence[Message]) -> int:
    """Index where the in-flight tool loop starts: right after the latest user message."""
    latest = latest_user_index(messages)
    return 0 if latest is None else latest + 1


def newest_complete_turn(messages: Sequence[Message]) -> tuple[int, int] | None:
    """``[start, end)`` of the newest turn that ended in an assistant answer with no calls."""
    end = len(messages)
    for start in reversed(turn_starts(messages)):
        last = messages[end - 1]
        if end - 1 > start and isinstance(last, AssistantMessage) and not last.tool_calls:
            return start, end
        end = start
    return None


def has_thinking(message: Message) -> bool:
    """Whether an assistant message carries (possibly signed) reasoning blocks."""
    return isinstance(message, AssistantMessage) and any(
        isinstance(b, ThinkingBlock | RedactedThinkingBlock) for b in message.content
    )


@dataclass(frozen=True, slots=True)
class Repair:
    """One change `repair` made so the view is provider-valid.

    ``kind`` is ``missing_result`` (a stub error result was added for a call that has none),
    ``orphan_result`` (a result without its call was left out), ``duplicate_result`` (a second
    result for the same call was left out), ``empty_text`` (an empty text block was left out)
    or ``empty_message`` (a message with no content was left out). ``index`` is the position
    in the input of `repair`; ``tool_call_id`` is set for the tool kinds.
    """

    kind: str
    index: int
    tool_call_id: str | None = None


def _without_empty_text(m: Message) -> Message | None:
    """Drop empty text blocks (providers reject them); ``None`` when nothing is left."""
    if isinstance(m, UserMessage | AssistantMessage):
        if not any(isinstance(b, TextBlock) and not b.text for b in m.content):
            return m if m.content else None
        kept = tuple(b for b in m.content if not (isinstance(b, TextBlock) and not b.text))
        if not kept:
            return None
        if isinstance(m, UserMessage):
            return UserMessage(kept, m.extra)  # type: ignore[arg-type]
        return AssistantMessage(kept, m.stop_reason, m.usage, m.model, m.extra)  # type: ignore[arg-type]
    if isinstance(m, SummaryMessage) and not m.text:
        return None
    return m


def repair(
    messages: Sequence[Message], origins: Sequence[int] | None = None
) -> tuple[list[Message], list[int], list[Repair]]:
    """Make ``messages`` provider-valid by the documented rule, without touching valid input.

    Rule: each tool call gets exactly one result, in the contiguous run of results right
    after its assistant message; a call with none gets a stub error result (`MISSING_RESULT_TEXT`)
    at the end of that run; a result that answers no open call, or answers one twice, is left
    out; empty text blocks and messages left empty are left out. The output never starts with
    a tool result. Returns the repaired messages, the origin of each (taken from ``origins``,
    default: input positions; a stub takes its assistant message's origin) and the repairs.
    """
    src = origins if origins is not None else range(len(messages))
    out: list[Message] = []
    out_origin: list[int] = []
    repairs: list[Repair] = []
    pending: dict[str, str | None] = {}  # open call id -> tool name, in call order
    answered: set[str] = set()
    batch_origin = 0

    def close_batch() -> None:
        for call_id, name in pending.items():
            if call_id not in answered:
                stub = (TextBlock(MISSING_RESULT_TEXT),)
                out.append(ToolResultMessage(call_id, stub, name, is_error=True))
                out_origin.append(batch_origin)
                repairs.append(Repair("missing_result", len(out) - 1, call_id))
        pending.clear()
        answered.clear()

    for i, m in enumerate(messages):
        if isinstance(m, ToolResultMessage):
            if m.tool_call_id not in pending:
                repairs.append(Repair("orphan_result", i, m.tool_call_id))
                continue
            if m.tool_call_id in answered:
                repairs.append(Repair("duplicate_result", i, m.tool_call_id))
                continue
            answered.add(m.tool_call_id)
            out.append(m)
            out_origin.append(src[i])
            continue
        close_batch()
        cleaned = _without_empty_text(m)
        if cleaned is None:
            repairs.append(Repair("empty_message", i))
            continue
        if cleaned is not m:
            repairs.append(Repair("empty_text", i))
        out.append(cleaned)
        out_origin.append(src[i])
        if isinstance(cleaned, AssistantMessage):
            for call in cleaned.tool_calls:
                pending.setdefault(call.id, call.name)
            batch_origin = src[i]
    close_batch()
    return out, out_origin, repairs


def validate(messages: Sequence[Message], provider: Provider = "anthropic") -> list[str]:
    """Every reason a provider would reject ``messages``; an empty list means valid.

    Checks the rules both APIs enforce (each call answered exactly once, right after its
    assistant message and before anything else; no result without its call; unique call ids;
    no empty content) plus Anthropic's (the first message is a user turn).
    """
    problems: list[str] = []
    if not messages:
        return ["empty message list"]
    first = messages[0]
    if isinstance(first, ToolResultMessage):
        problems.append("starts with a tool result")
    if provider == "anthropic" and not isinstance(first, UserMessage | SummaryMessage):
        problems.append("anthropic: first message must be a user message")
    seen_ids: set[str] = set()
    open_calls: set[str] = set()
    open_at = -1
    for i, m in enumerate(messages):
        if isinstance(m, ToolResultMessage):
            if m.tool_call_id not in open_calls:
                problems.append(f"message {i}: result for {m.tool_call_id!r} answers no open call")
            open_calls.discard(m.tool_call_id)
            continue
        if open_calls:
            problems.append(f"message {open_at}: calls {sorted(open_calls)} have no result")
            open_calls = set()
        if isinstance(m, UserMessage | AssistantMessage):
            if not m.content:
                problems.append(f"message {i}: empty content")
            if any(isinstance(b, TextBlock) and not b.text for b in m.content):
                problems.append(f"message {i}: empty text block")
        if isinstance(m, SummaryMessage) and not m.text:
            problems.append(f"message {i}: empty summary")
        if isinstance(m, AssistantMessage):
            for call in m.tool_calls:
                if call.id in seen_ids:
                    problems.append(f"message {i}: duplicate tool call id {call.id!r}")
                seen_ids.add(call.id)
                open_calls.add(call.id)
            open_at = i
    if open_calls:
        problems.append(f"message {open_at}: calls {sorted(open_calls)} have no result")
    return problems
