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

Repair (`repair`, applied by `agentctx.ledger.render` to every view, reported by the manager
in `TranscriptRepaired` events) changes only the view, never the raw history; each rule is
deterministic and depends only on what comes before it in the view, so appending messages
never changes bytes already rendered:

- **tool pairing**: each tool call gets exactly one result, right after its assistant message;
  a missing one becomes a stub error result (`MISSING_RESULT_TEXT`), a result that answers no
  open call, or one already answered, is left out;
- **blank text**: empty and whitespace-only text blocks are left out of user and assistant
  messages (Anthropic: "text content blocks must contain non-whitespace text"), except in an
  assistant message with reasoning, where each is filled in place with `EMPTY_TEXT` (its
  reasoning must come back where the model put it); a message
  left with no content holds `EMPTY_TEXT` instead, so turns keep their shape (the latest user
  message stays a user message); a blank summary is left out; a tool result's blank blocks
  are left out where other blocks stand beside them (alone, one is the tool's empty output,
  which the Anthropic adapter sends as a string); a failed tool's result (``is_error``) with
  no content but blank text holds `FAILED_WITHOUT_OUTPUT` instead (Anthropic: "content cannot
  be empty if `is_error` is true");
- **duplicate tool-call ids** (servers that number calls per response, ``call_0`` on every
  turn, or repeat one within a batch; Anthropic: "tool_use ids must be unique", OpenAI:
  "Duplicate value for 'tool_call_id'"): a call whose id the view already used is renamed
  ``<id>-2`` (``-3``, ... the first suffix not used yet; cut to 40 characters, OpenAI's
  limit, when the id fits in 40), and its result with it. Within a batch the k-th result
  carrying an id answers the k-th call carrying it;
- **call ids Anthropic refuses** ("String should match pattern '^[a-zA-Z0-9_-]+$'", ids
  made by another provider, such as ``call_1|fc_2``): each other character becomes ``_``
  (an empty id ``call``), with a suffix as above if that id is taken; its result follows;
- **assistant first** (Anthropic: 'first message must use the "user" role'): a view that
  would start with an assistant message starts with a `SummaryMessage` holding
  `LEADING_TEXT`, which every adapter sends as a user message. It is a summary, not a
  `UserMessage`, so it is not the task and opens no turn: strategies reading the view still
  find the real first user message.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from agentctx.messages import (
    TOOL_STEP,
    AssistantMessage,
    Message,
    RedactedThinkingBlock,
    SummaryMessage,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    is_instruction,
)

if TYPE_CHECKING:
    from collections.abc import Sequence, Set

__all__ = [
    "EMPTY_TEXT",
    "FAILED_WITHOUT_OUTPUT",
    "LEADING_TEXT",
    "LEFT_OUT",
    "MISSING_RESULT_TEXT",
    "CompleteTurns",
    "Provider",
    "Repair",
    "answered_call_ids",
    "has_thinking",
    "in_flight_start",
    "latest_user_index",
    "needs_no_repair",
    "newest_complete_turn",
    "opens_turn",
    "repair",
    "repaired_message",
    "safe_cut",
    "task_index",
    "turn_starts",
    "validate",
]

Provider = Literal["anthropic", "openai"]

MISSING_RESULT_TEXT = "[agentctx: no result was recorded for this tool call; it was interrupted]"
EMPTY_TEXT = "(empty)"
FAILED_WITHOUT_OUTPUT = "(the tool failed without output)"
LEADING_TEXT = "[agentctx: the recorded history starts with an assistant message]"

# OpenAI Chat rejects longer tool-call ids; a renamed id stays within it when the original did.
_ID_LIMIT = 40


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
    """Index of the first user message: the task (a system or developer message in the
    history, `is_instruction`, only when no user message is there). ``None`` if none."""
    first = None
    for i, m in enumerate(messages):
        if isinstance(m, UserMessage):
            if not is_instruction(m):
                return i
            first = i if first is None else first
    return first


def latest_user_index(messages: Sequence[Message]) -> int | None:
    """Index of the latest user message (not a system or developer message after it:
    `is_instruction`, unless no user message is there), ``None`` if none."""
    last = None
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if isinstance(m, UserMessage):
            if not is_instruction(m):
                return i
            last = i if last is None else last
    return last


def in_flight_start(messages: Sequence[Message]) -> int:
    """Index where the in-flight tool loop starts: right after the latest user message. When
    the history ends with user messages sent right after tool results (a steering message,
    a hook's text), those go out in the results' turn (Anthropic joins them into one user
    message), so the loop they interrupt is still the request's last assistant turn, and
    what it must keep as it was (its signed thinking) starts after the latest user message
    before them (a system or developer message is none, `latest_user_index`)."""
    return loop_start_after(messages, latest_user_index(messages))


def loop_start_after(messages: Sequence[Message], latest: int | None) -> int:
    """`in_flight_start` of ``messages`` whose latest user message is at ``latest`` (known
    already: no scan for it)."""
    k = len(messages)
    while k > 0 and isinstance(messages[k - 1], UserMessage):
        k -= 1
    if k == len(messages) or not (k > 0 and isinstance(messages[k - 1], ToolResultMessage)):
        return 0 if latest is None else latest + 1
    # Steering text after tool results: the loop starts after the latest user message before
    # it, read as `latest_user_index` reads one (an instruction is none, unless no user
    # message is there): else the loop would start later while the history ends so, and
    # move back once it goes on.
    fallback = None
    for i in range(k - 1, -1, -1):
        m = messages[i]
        if isinstance(m, UserMessage):
            if not is_instruction(m):
                return i + 1
            if fallback is None:
                fallback = i
    return 0 if fallback is None else fallback + 1


def newest_complete_turn(messages: Sequence[Message]) -> tuple[int, int] | None:
    """``[start, end)`` of the newest turn with an answer: from its user message (the
    question) through its last assistant answer with no calls (``end - 1``). Tool calls the
    model goes on making after that answer, with no user message between, do not make the
    turn incomplete again: on appends the newest complete turn only moves forward, so it is
    never one a compaction already took while a newer turn held the place.

    A system or developer message (`is_instruction`) starts no turn, unless no user message
    came before it: it is part of the turn it is sent in, as it is never the latest user
    message (`latest_user_index`).

    Read from the end: O(the messages after its answer), and back to the user message
    before an instruction that follows it."""
    answer = None  # one past the last answer of the turn being read
    instruction = None  # the newest instruction before that answer
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if isinstance(m, UserMessage):
            if answer is None:
                continue
            if not is_instruction(m):
                return i, answer
            if instruction is None:
                instruction = i
        elif answer is None and _answers(m):
            answer = i + 1
    if instruction is None or answer is None:
        return None
    return instruction, answer


def opens_turn(m: UserMessage, spoken_before: bool) -> bool:
    """Whether the user message ``m`` opens a turn, ``spoken_before`` telling whether a user
    message that is no instruction came before it: a system or developer message
    (`is_instruction`) opens none once one did (`newest_complete_turn`)."""
    return not spoken_before or not is_instruction(m)


def _answers(m: Message) -> bool:
    """Whether ``m`` answers its turn: an assistant message with no calls (nor a call and
    its output as provider items, `TOOL_STEP`)."""
    return isinstance(m, AssistantMessage) and not m.tool_calls and not m.extra.get(TOOL_STEP)


class CompleteTurns:
    """`newest_complete_turn` of a history that only grows at its end, in O(new messages).

    Call `update` after each append (any other change: a new instance); `newest` answers
    for the history as last updated."""

    __slots__ = ("_answered", "_closed", "_open", "_seen", "_spoken")

    def __init__(self) -> None:
        self._seen = 0
        self._spoken: int | None = None  # the latest user message that is no instruction
        self._open: int | None = None  # where the last turn seen starts
        self._closed: tuple[int, int] | None = None  # newest complete turn before it
        self._answered: int | None = None  # one past the last turn's last answer, if any

    def update(self, messages: Sequence[Message]) -> None:
        """Read the messages appended since the last call."""
        for i in range(self._seen, len(messages)):
            m = messages[i]
            if isinstance(m, UserMessage):
                if opens_turn(m, self._spoken is not None):
                    if self._answered is not None and self._open is not None:
                        self._closed = self._open, self._answered
                    self._open, self._answered = i, None
                if not is_instruction(m):
                    self._spoken = i
            elif _answers(m):
                self._answered = i + 1
        self._seen = len(messages)

    def cut(self, index: int) -> bool:
        """Forget the messages from ``index`` on (the history was cut back there), when they
        changed nothing read so far (no turn opened, nobody spoke, no answer among them):
        editing the newest step of a long tool loop then reads nothing again. ``False``,
        with nothing changed, otherwise: make a new instance."""
        if index >= self._seen:
            return True
        answer = None if self._answered is None else self._answered - 1
        if any(i is not None and i >= index for i in (self._spoken, self._open, answer)):
            return False
        self._seen = index
        return True

    @property
    def latest_user(self) -> int | None:
        """Index of the latest user message seen (`latest_user_index`)."""
        return self._spoken if self._spoken is not None else self._open

    @property
    def newest(self) -> tuple[int, int] | None:
        """``[start, end)`` of the newest complete turn, as `newest_complete_turn` says."""
        if self._answered is not None and self._open is not None:
            return self._open, self._answered
        return self._closed


_REASONING = (ThinkingBlock, RedactedThinkingBlock)


def has_thinking(message: Message) -> bool:
    """Whether an assistant message carries (possibly signed) reasoning blocks."""
    # A loop over a tuple: the scans call this on every step, and `A | B` builds a union
    # each time and a generator costs a frame (about half the time of a call).
    if isinstance(message, AssistantMessage):
        for block in message.content:
            if isinstance(block, _REASONING):
                return True
    return False


LEFT_OUT = frozenset({"orphan_result", "duplicate_result", "empty_summary"})
"""The `Repair` kinds that leave a message of the history out of the view."""


@dataclass(frozen=True, slots=True)
class Repair:
    """One change `repair` made so the view is provider-valid.

    ``kind`` is one of:

    - ``missing_result``: a stub error result was added for a call that has none;
    - ``orphan_result``: a result without its call was left out;
    - ``duplicate_result``: a second result for the same call was left out;
    - ``empty_text``: empty or whitespace-only text blocks were left out of a message (in an
      assistant message with reasoning: each filled in place with `EMPTY_TEXT`);
    - ``empty_message``: a user or assistant message left with no content holds `EMPTY_TEXT`;
    - ``empty_error``: a failed tool's result (``is_error``) with no content but blank text
      holds `FAILED_WITHOUT_OUTPUT`;
    - ``empty_summary``: a summary with no non-whitespace text was left out;
    - ``duplicate_call_id``: a call whose id the view already used was renamed to ``new_id``
      (its result too);
    - ``invalid_call_id``: a call id with a character other than ASCII letters, digits, ``_``
      and ``-`` (or none) was renamed to ``new_id``, each such character an ``_`` (its
      result too);
    - ``leading_assistant``: a summary holding `LEADING_TEXT` was put before the assistant
      message the view would have started with.

    ``index`` is the position in the output of `repair` of the message concerned (for a
    message left out: its position in the input); ``origin`` is that message's origin (see
    `repair`: a raw index when rendering), which names a repair across renders;
    ``tool_call_id`` is set for the tool kinds (the original id for ``duplicate_call_id``).
    """

    kind: str
    index: int
    tool_call_id: str | None = None
    new_id: str | None = None
    origin: int = -1


_SPOKEN = (UserMessage, AssistantMessage)  # a tuple: isinstance takes it faster than a union


def _blank(block: object) -> bool:
    # isspace stops at the first other character; strip() would copy a long text first
    return isinstance(block, TextBlock) and _blank_text(block.text)


def _blank_text(text: str) -> bool:
    return not text or text.isspace()


def repaired_message(m: Message) -> Message | None:
    """``m`` without blank text blocks, as `repair` sends it; ``None`` for a blank summary.

    A user or assistant message left with no content holds `EMPTY_TEXT`; a message with
    nothing to repair is returned as is (the same object).
    """
    return _cleaned(m)[0]


def _cleaned(m: Message) -> tuple[Message | None, str | None]:
    """`repaired_message` and the kind of repair it made (``None``: none)."""
    if isinstance(m, _SPOKEN):
        if m.content:
            # Read inline: this runs on every new message of every call.
            for b in m.content:
                if isinstance(b, TextBlock) and (not b.text or b.text.isspace()):
                    break
            else:
                return m, None
        if isinstance(m, AssistantMessage) and has_thinking(m):
            # Reasoning must come back as the model gave it, at its places (Anthropic checks
            # the latest assistant message's blocks by position; a Responses reasoning item
            # needs the message item after it; a Chat answer with only reasoning needs text):
            # a blank block is filled in place, not left out, with its fields (an item's id).
            filled = tuple(
                replace(b, text=EMPTY_TEXT)
                if isinstance(b, TextBlock) and _blank_text(b.text)
                else b
                for b in m.content
            )
            filled_message = AssistantMessage(filled, m.stop_reason, m.usage, m.model, m.extra)
            return filled_message, "empty_text"
        kept = tuple(b for b in m.content if not _blank(b))
        kind = "empty_text" if kept else "empty_message"
        kept = kept or (TextBlock(EMPTY_TEXT),)
        if isinstance(m, UserMessage):
            return UserMessage(kept, m.extra), kind  # type: ignore[arg-type]
        return AssistantMessage(kept, m.stop_reason, m.usage, m.model, m.extra), kind  # type: ignore[arg-type]
    if isinstance(m, SummaryMessage) and _blank_text(m.text):
        return None, "empty_summary"
    if isinstance(m, ToolResultMessage):
        return _cleaned_result(m)
    return m, None


def _cleaned_result(m: ToolResultMessage) -> tuple[ToolResultMessage, str | None]:
    if _failed_blank(m):
        said = (TextBlock(FAILED_WITHOUT_OUTPUT),)
        return ToolResultMessage(m.tool_call_id, said, m.tool_name, True, m.extra), "empty_error"
    if _blank_beside_others(m.content):
        # One blank block is a tool's empty output (sent as an empty string); beside other
        # blocks it is a list entry Anthropic rejects.
        left = tuple(b for b in m.content if not _blank(b))
        return ToolResultMessage(m.tool_call_id, left, m.tool_name, m.is_error, m.extra), (
            "empty_text"
        )
    return m, None


def _blank_beside_others(content: Sequence[object]) -> bool:
    return len(content) > 1 and any(_blank(b) for b in content)


def _failed_blank(m: ToolResultMessage) -> bool:
    """Whether ``m`` is a failed tool's result with nothing but blank text."""
    return m.is_error and all(_blank(b) for b in m.content)


def _needs_cleaning(m: ToolResultMessage) -> bool:
    return _blank_beside_others(m.content) or _failed_blank(m)


_ID_REJECTED = re.compile(r"[^a-zA-Z0-9_-]")  # Anthropic: tool_use ids match ^[a-zA-Z0-9_-]+$


def _valid_id(call_id: str) -> bool:
    # Cheaper than the regex on every call of every new message.
    return call_id.isascii() and (
        call_id.isalnum() or call_id.replace("_", "a").replace("-", "a").isalnum()
    )


def _fresh_id(call_id: str, used: Set[str], new: set[str]) -> str:
    """The first of ``<id>-2``, ``<id>-3``, ... that is neither in ``used`` nor in ``new``."""
    k = 2
    while True:
        suffix = f"-{k}"
        candidate = call_id + suffix
        if len(candidate) > _ID_LIMIT >= len(call_id):
            candidate = call_id[: _ID_LIMIT - len(suffix)] + suffix
        if candidate not in used and candidate not in new:
            return candidate
        k += 1


class _Call:
    """A call of the batch being answered: its id in the input and in the view."""

    __slots__ = ("answered", "call_id", "name", "view_id")

    def __init__(self, call_id: str, view_id: str, name: str) -> None:
        self.call_id, self.view_id, self.name = call_id, view_id, name
        self.answered = False


class _Batch(list[_Call]):
    """The calls of the latest assistant message, in order, found by id in O(1): a batch of
    thousands of parallel calls is answered one result at a time."""

    __slots__ = ("by_call", "by_view")

    def __init__(self) -> None:
        super().__init__()
        self.by_call: dict[str, list[_Call]] = {}
        self.by_view: dict[str, list[_Call]] = {}  # by the renamed id, where it was renamed

    def add(self, call: _Call) -> None:
        self.append(call)
        self.by_call.setdefault(call.call_id, []).append(call)
        if call.view_id != call.call_id:
            self.by_view.setdefault(call.view_id, []).append(call)

    def clear(self) -> None:
        super().clear()
        self.by_call.clear()
        self.by_view.clear()


def _answering(batch: _Batch, call_id: str) -> tuple[_Call | None, bool]:
    """The first unanswered call of the batch ``call_id`` answers, and whether the batch has
    a call with that id at all. A result may name a call by its input id or, for a caller
    that answered the view, by its renamed one."""
    known = False
    for calls in (batch.by_call.get(call_id), batch.by_view.get(call_id)):
        if calls:
            known = True
            for call in calls:
                if not call.answered:
                    return call, True
    return None, known


def repair(
    messages: Sequence[Message],
    origins: Sequence[int] | None = None,
    *,
    continues: Set[str] | None = None,
) -> tuple[list[Message], list[int], list[Repair]]:
    """Make ``messages`` provider-valid by the rules in the module docs; valid input comes
    back as the same objects.

    Returns the repaired messages, the origin of each (taken from ``origins``, default: input
    positions; a stub or a placeholder takes the origin of the message it belongs with) and
    the repairs. The output never starts with a tool result.

    ``continues`` is for repairing the rest of a view whose start was repaired already (see
    `agentctx.view`): the tool-call ids that start uses. ``None`` means ``messages`` open
    the view, so the assistant-first rule applies to them.
    """
    src = origins if origins is not None else range(len(messages))
    out: list[Message] = []
    out_origin: list[int] = []
    repairs: list[Repair] = []
    used: Set[str] = continues if continues is not None else frozenset()
    new_ids: set[str] = set()  # ids this call of repair gave out, on top of ``used``
    batch = _Batch()  # the calls of the latest assistant message, in order
    batch_origin = 0
    opened = continues is not None

    def close_batch() -> None:
        for call in batch:
            if not call.answered:
                stub = (TextBlock(MISSING_RESULT_TEXT),)
                out.append(ToolResultMessage(call.view_id, stub, call.name, is_error=True))
                out_origin.append(batch_origin)
                repairs.append(
                    Repair("missing_result", len(out) - 1, call.view_id, origin=batch_origin)
                )
        batch.clear()

    for i, m in enumerate(messages):
        if isinstance(m, ToolResultMessage):
            call, known = _answering(batch, m.tool_call_id)
            if call is None:
                dropped = "duplicate_result" if known else "orphan_result"
                repairs.append(Repair(dropped, i, m.tool_call_id, origin=src[i]))
                continue
            call.answered = True
            if call.view_id != m.tool_call_id:
                m = ToolResultMessage(call.view_id, m.content, m.tool_name, m.is_error, m.extra)
            m, kind = _cleaned_result(m)
            if kind is not None:
                failed = m.tool_call_id if kind == "empty_error" else None
                repairs.append(Repair(kind, len(out), failed, origin=src[i]))
            out.append(m)
            out_origin.append(src[i])
            continue
        close_batch()
        cleaned, kind = _cleaned(m)
        if cleaned is None:
            repairs.append(Repair("empty_summary", i, origin=src[i]))
            continue
        if not opened and isinstance(cleaned, AssistantMessage):
            out.append(SummaryMessage(LEADING_TEXT))
            out_origin.append(src[i])
            repairs.append(Repair("leading_assistant", 0, origin=src[i]))
        opened = True
        if kind is not None:
            repairs.append(Repair(kind, len(out), origin=src[i]))
        if isinstance(cleaned, AssistantMessage) and cleaned.tool_calls:
            cleaned = _unique_calls(cleaned, used, new_ids, batch, len(out), src[i], repairs)
            batch_origin = src[i]
        out.append(cleaned)
        out_origin.append(src[i])
    close_batch()
    return out, out_origin, repairs


def needs_no_repair(messages: Sequence[Message], used: Set[str]) -> bool:
    """Whether `repair` returns ``messages`` as they are, with no repair and every call
    answered, when they continue a view that uses the tool-call ids ``used`` (the common
    append: one or more turns, each batch of calls answered in order). A quick check, so it
    may say no for messages repair would still leave alone."""
    return answered_call_ids(messages, used) is not None


def answered_call_ids(messages: Sequence[Message], used: Set[str]) -> list[str] | None:
    """The tool-call ids of ``messages`` in order when they need no repair (see
    `needs_no_repair`), else ``None``: the check and the ids a view adds, in one pass."""
    ids: list[str] = []
    batch = answered = 0  # where the open batch starts in ``ids``, how many are answered
    for m in messages:
        if isinstance(m, ToolResultMessage):
            if batch + answered == len(ids) or m.tool_call_id != ids[batch + answered]:
                return None
            if (len(m.content) > 1 or m.is_error) and _needs_cleaning(m):  # a call saved for most
                return None
            answered += 1
            continue
        if batch + answered != len(ids) or _cleaned(m)[0] is not m:
            return None
        batch, answered = len(ids), 0
        if isinstance(m, AssistantMessage):
            for call in m.content:
                if isinstance(call, ToolCall):
                    if call.id in used or not _valid_id(call.id):
                        return None
                    ids.append(call.id)
    if batch + answered != len(ids) or (len(ids) > 1 and len(set(ids)) < len(ids)):
        return None  # a batch left open gets stubs; a repeated id is renamed
    return ids


def _unique_calls(
    m: AssistantMessage,
    used: Set[str],
    new_ids: set[str],
    batch: _Batch,
    index: int,
    origin: int,
    repairs: list[Repair],
) -> AssistantMessage:
    """``m`` with every call id the view already used renamed; opens ``batch``."""
    renamed = False
    blocks: list[object] = []
    for b in m.content:
        if isinstance(b, ToolCall):
            call_id = view_id = b.id
            if not _valid_id(call_id):
                view_id = _ID_REJECTED.sub("_", call_id) or "call"
                if view_id in used or view_id in new_ids:
                    view_id = _fresh_id(view_id, used, new_ids)
                repairs.append(Repair("invalid_call_id", index, call_id, view_id, origin))
            elif call_id in used or call_id in new_ids:
                view_id = _fresh_id(call_id, used, new_ids)
                repairs.append(Repair("duplicate_call_id", index, call_id, view_id, origin))
            if view_id != call_id:
                b = ToolCall(view_id, b.name, b.arguments, b.extra)
                renamed = True
            new_ids.add(view_id)
            batch.add(_Call(call_id, view_id, b.name))
        blocks.append(b)
    if not renamed:
        return m
    return AssistantMessage(tuple(blocks), m.stop_reason, m.usage, m.model, m.extra)  # type: ignore[arg-type]


_WHITESPACE = "text content blocks must contain non-whitespace text"


def validate(messages: Sequence[Message], provider: Provider = "anthropic") -> list[str]:
    """Every reason a provider would reject ``messages``; an empty list means valid.

    Checks the rules both APIs enforce (each call answered exactly once, right after its
    assistant message and before anything else; no result without its call; unique call ids
    across the whole request; no empty content) plus Anthropic's (the first message is a
    user turn; no whitespace-only text). Messages follow the real APIs' wording.
    """
    problems: list[str] = []
    if not messages:
        return ["empty message list"]
    first = messages[0]
    if isinstance(first, ToolResultMessage):
        problems.append("starts with a tool result")
    if provider == "anthropic" and not isinstance(first, UserMessage | SummaryMessage):
        problems.append('anthropic: first message must use the "user" role')
    seen_ids: set[str] = set()
    open_calls: Counter[str] = Counter()
    open_at = -1
    for i, m in enumerate(messages):
        if isinstance(m, ToolResultMessage):
            if not open_calls[m.tool_call_id]:
                problems.append(f"message {i}: result for {m.tool_call_id!r} answers no open call")
            open_calls[m.tool_call_id] -= 1
            if provider == "anthropic" and _blank_beside_others(m.content):
                problems.append(
                    f"message {i}: a tool result's text content blocks must contain "
                    "non-whitespace text"
                )
            if provider == "anthropic" and _failed_blank(m):
                problems.append(f"message {i}: content cannot be empty if `is_error` is true")
            continue
        if +open_calls:
            problems.append(f"message {open_at}: calls {sorted(+open_calls)} have no result")
        open_calls = Counter()
        if isinstance(m, UserMessage | AssistantMessage):
            if not m.content:
                problems.append(f"message {i}: empty content")
            if any(isinstance(b, TextBlock) and not b.text for b in m.content):
                problems.append(f"message {i}: empty text block")
            elif provider == "anthropic" and any(_blank(b) for b in m.content):
                problems.append(
                    f"message {i}: text content blocks must contain non-whitespace text"
                )
        if isinstance(m, SummaryMessage):
            if not m.text:
                problems.append(f"message {i}: empty summary")
            elif provider == "anthropic" and _blank_text(m.text):
                problems.append(
                    f"message {i}: text content blocks must contain non-whitespace text"
                )
        if isinstance(m, AssistantMessage):
            for call in m.tool_calls:
                if call.id in seen_ids:
                    problems.append(
                        f"message {i}: tool_use ids must be unique ({call.id!r})"
                        if provider == "anthropic"
                        else f"message {i}: Duplicate value for 'tool_call_id' of {call.id!r}"
                    )
                seen_ids.add(call.id)
                open_calls[call.id] += 1
            open_at = i
    if +open_calls:
        problems.append(f"message {open_at}: calls {sorted(+open_calls)} have no result")
    return problems
