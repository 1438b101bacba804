"""The `Summarizer` protocol: one standalone request that turns a transcript into a briefing.

`LlmCompaction` builds the request (system prompt, the span as plain text, the instruction)
and decides about timeouts, retries and validation; a summarizer only sends it to a model.

```python
class MySummarizer:
    model = "my-cheap-model"            # optional: used for pricing when the result names none

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        try:
            reply = await client.complete(
                system=request.system, prompt=request.prompt, max_tokens=request.max_tokens
            )
        except RateLimited as e:
            raise SummarizerError(str(e), retryable=True, status=429, retry_after=e.wait) from e
        return SummaryResult(
            text=reply.text,
            stop_reason=normalize_stop_reason(reply.finish_reason),
            usage=Usage(input_tokens=reply.prompt_tokens, output_tokens=reply.completion_tokens),
            model=reply.model,
        )
```

Rules for implementations: turn off the SDK's own retries (agentctx's guards are the only
ones), raise `SummarizerError` with ``retryable`` set by `is_retryable_status` for HTTP
errors, let cancellation propagate untouched, and report the provider's usage as it was
billed (Anthropic-style: ``input_tokens`` uncached).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias, runtime_checkable

from agentctx._check import preview
from agentctx.errors import SummarizerError
from agentctx.messages import (
    MOST_TOKENS,
    USAGE_RULE,
    AssistantMessage,
    ImageBlock,
    OpaqueBlock,
    RedactedThinkingBlock,
    SummaryMessage,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
    bad_usage_field,
    json_problem,
    sendable_text,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from agentctx.messages import Message

__all__ = [
    "DEFAULT_INSTRUCTION",
    "DEFAULT_SYSTEM_PROMPT",
    "DEFAULT_UPDATE_INSTRUCTION",
    "REQUIRED_SECTIONS",
    "RETRYABLE_STATUS",
    "StopReason",
    "Summarizer",
    "SummaryRequest",
    "SummaryResult",
    "build_prompt",
    "check_briefing",
    "check_result",
    "is_native_compaction",
    "is_retryable_status",
    "missing_sections",
    "normalize_stop_reason",
    "serialize_transcript",
]

StopReason: TypeAlias = Literal["stop", "length", "refusal", "error"]
"""Why the model stopped, in neutral terms. Only ``stop`` means a complete briefing."""

RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})
"""HTTP statuses worth retrying: timeouts, conflicts, rate limits, overload, server errors."""


def is_retryable_status(status: int | None) -> bool:
    """Whether an HTTP error with ``status`` may succeed if sent again (any 5xx does)."""
    return status is not None and (status in RETRYABLE_STATUS or 500 <= status < 600)


_STOP_REASONS: dict[str, StopReason] = {
    # complete
    "stop": "stop",
    "end_turn": "stop",
    "stop_sequence": "stop",
    "completed": "stop",
    "eos": "stop",
    # truncated
    "length": "length",
    "max_tokens": "length",
    "max_output_tokens": "length",
    "model_context_window_exceeded": "length",
    "incomplete": "length",
    # declined
    "refusal": "refusal",
    "content_filter": "refusal",
    "safety": "refusal",
}


def normalize_stop_reason(raw: str | None) -> StopReason:
    """Map a provider's stop / finish reason to `StopReason`; anything unknown is ``error``.

    ``end_turn`` / ``stop_sequence`` (Anthropic), ``stop`` (OpenAI Chat), ``completed``
    (OpenAI Responses) give ``stop``; ``max_tokens`` / ``length`` / ``max_output_tokens`` give
    ``length``; ``refusal`` / ``content_filter`` give ``refusal``. A missing reason, a tool
    call or a pause is not a finished briefing, so it is ``error``.
    """
    if not isinstance(raw, str):
        return "error"
    return _STOP_REASONS.get(raw.strip().lower(), "error")


@dataclass(frozen=True, slots=True, kw_only=True)
class SummaryRequest:
    """One summarization request, ready to send.

    Send ``system`` as the system prompt and ``prompt`` as the only user message, with at
    most ``max_tokens`` output tokens, no tools, no prompt caching. The other fields say what
    ``prompt`` is made of, for logging and tests.

    Attributes:
        system: the system prompt.
        prompt: the user message: the previous briefing (if any), the transcript, the
            instruction.
        max_tokens: cap on the briefing's length in output tokens.
        transcript: the summarized span as plain text (capped per block and in total).
        previous_briefing: the briefing this request updates, for an incremental summary.
        messages: how many view messages the span holds (a previous briefing counts as one).
        attempt: 1 for the first attempt, 2 for the first retry, and so on.
        conversation: the view from its start through the end of the span, as neutral
            messages (the head, an earlier briefing, the span). A provider-native compaction
            (`agentctx.providers.anthropic_compaction`,
            `agentctx.providers.openai_compaction`) sends these instead of ``prompt``; text
            summarizers ignore it.
    """

    system: str
    prompt: str
    max_tokens: int
    transcript: str = ""
    previous_briefing: str | None = None
    messages: int = 0
    attempt: int = 1
    conversation: tuple[Message, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class SummaryResult:
    """What the model returned.

    Attributes:
        text: the briefing (the concatenated text of the response).
        stop_reason: why it stopped; see `normalize_stop_reason`.
        usage: the tokens the request was billed for.
        model: the model that answered, as the provider named it (used for pricing).
        messages: a provider-native briefing: the messages to splice in place of the span
            (e.g. an assistant message holding the provider's opaque, signed compaction
            block), instead of a `SummaryMessage` made from ``text``. They are spliced byte
            for byte and ``required_sections`` do not apply (the content is opaque); they
            may not hold tool calls or tool results. Empty (the default) for a text briefing.
        usage_known: ``False`` when the reply's usage stated a count that is no token count
            (negative, a fraction, a string, past any request; ``usage`` has it as 0) or none
            at all: the reply is then reported and counted at ``cost_usd=None``, never priced
            on the rest (`agentctx._usage.read_usage` reads an SDK's usage so).
    """

    text: str
    stop_reason: StopReason
    usage: Usage = field(default_factory=Usage)
    model: str | None = None
    messages: tuple[Message, ...] = ()
    usage_known: bool = True


_STOPS = frozenset({"stop", "length", "refusal", "error"})


def check_result(result: object) -> SummaryResult:
    """``result`` when a summarizer returned a well-formed `SummaryResult`; otherwise a
    non-retryable `SummarizerError` saying what is wrong with it.

    `LlmCompaction` calls it on every reply, at the edge, because everything after it adds
    usage up, prices it and splices the text: ``text`` must be a ``str``, ``stop_reason`` a
    `StopReason`, ``model`` a ``str`` or ``None``, and ``usage`` a `Usage` that keeps
    `USAGE_RULE` (a negative count would make the reported spend negative). A failed
    check is reported like a failed request: `SummaryRejected` with reason ``failed`` and
    this message as the detail.
    """
    if not isinstance(result, SummaryResult):
        raise _bad(f"{preview(result)}, not a SummaryResult")
    if not isinstance(result.text, str):
        raise _bad(f"text that is {preview(result.text)}, not a str")
    if (text := sendable_text(result.text)) is not result.text:
        # Decoded from JSON, a reply can hold a lone surrogate, which no request can carry:
        # spliced as it is, every later view could not be sent.
        result = replace(result, text=text)
    if not isinstance(result.stop_reason, str) or result.stop_reason not in _STOPS:
        raise _bad(f"stop_reason {preview(result.stop_reason)}, not one of {sorted(_STOPS)}")
    if result.model is not None and not isinstance(result.model, str):
        raise _bad(f"model {preview(result.model)}, not a str or None")
    usage = result.usage
    if not isinstance(usage, Usage):
        raise _bad(f"usage {preview(usage)}, not a Usage")
    if (name := bad_usage_field(usage)) is not None:
        count = preview(getattr(usage, name))
        raise _bad(f"usage.{name}={count}; {USAGE_RULE}")
    if usage.prompt_tokens + usage.output_tokens > MOST_TOKENS:
        raise _bad(f"usage of {preview(usage.prompt_tokens)} prompt tokens, past any request")
    if not isinstance(result.usage_known, bool):
        raise _bad(f"usage_known {preview(result.usage_known)}, not a bool")
    if not isinstance(result.messages, tuple):
        raise _bad(f"messages {preview(result.messages)}, not a tuple")
    for m in result.messages:
        # A replacement that opened or answered a tool call would orphan its partner.
        if not isinstance(m, UserMessage | AssistantMessage | SummaryMessage) or (
            isinstance(m, AssistantMessage) and m.tool_calls
        ):
            raise _bad(
                f"a message to splice that is {preview(m)}; only user, assistant "
                "(without tool calls) and summary messages may replace a span"
            )
        if problem := _opaque_problem(m):
            # Decoded from JSON, a provider's item can hold a lone surrogate; signed, it
            # cannot be repaired, and spliced as it is, every later view could not be sent.
            raise _bad(f"a message to splice holding {problem}")
    messages = tuple(map(_sendable, result.messages))
    if any(a is not b for a, b in zip(messages, result.messages, strict=True)):
        result = replace(result, messages=messages)
    return result


def _sendable(m: Message) -> Message:
    """``m`` with each lone surrogate of its text replaced (`sendable_text`), as a text
    briefing's is: spliced as it is, every later view could not be sent."""
    if isinstance(m, SummaryMessage):
        text = sendable_text(m.text)
        return m if text is m.text else replace(m, text=text)
    if not isinstance(m, UserMessage | AssistantMessage) or all(
        not isinstance(b, TextBlock) or sendable_text(b.text) is b.text for b in m.content
    ):
        return m
    content = tuple(
        TextBlock(sendable_text(b.text), b.extra) if isinstance(b, TextBlock) else b
        for b in m.content
    )
    message: Any = m  # either kind: its content holds what it held, repaired
    repaired: Message = replace(message, content=content)
    return repaired


def _opaque_problem(m: Message) -> str | None:
    """What no request could carry in an opaque block of ``m`` (a provider's item): what
    JSON cannot hold, or a lone surrogate (which UTF-8 cannot encode)."""
    for block in getattr(m, "content", ()):
        if isinstance(block, OpaqueBlock):
            if found := json_problem(block.payload, "a provider's item"):
                return found
            text = json.dumps(block.payload, ensure_ascii=False)
            if sendable_text(text) is not text:
                return (
                    "a provider's item holding a lone surrogate, which no request can carry "
                    "(UTF-8 cannot encode it); it is signed, so it is not repaired"
                )
    return None


def _holds_something(m: Message) -> bool:
    if isinstance(m, SummaryMessage):
        return bool(m.text.strip())
    return any(not isinstance(b, TextBlock) or b.text.strip() for b in m.content)


def _bad(what: str) -> SummarizerError:
    return SummarizerError(f"the summarizer returned {what}", retryable=False)


@runtime_checkable
class Summarizer(Protocol):
    """Sends a `SummaryRequest` to a model. One required method.

    An implementation may also have a ``model`` attribute (``str``); `LlmCompaction` prices
    a result that names no model with it.
    """

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        """Send ``request`` once (no retries of its own); raise `SummarizerError` on failure."""
        ...


# ---------------------------------------------------------------------------------------
# What `LlmCompaction` sends: prompts, the transcript, and the checks a briefing must pass

REQUIRED_SECTIONS: tuple[str, ...] = (
    "Goal",
    "Constraints",
    "Decisions",
    "Files touched",
    "Open items",
)
"""The markdown headings a briefing must have before it may replace history."""

DEFAULT_SYSTEM_PROMPT = (
    "You are a context summarization assistant. You write structured handoff briefings of "
    "agent conversations, so that the work can continue with the briefing in place of the "
    "original messages."
)

_SECTION_GUIDE = (
    "## Goal\n"
    "What the user is trying to accomplish, verbatim where possible, and where the work "
    "stands.\n"
    "## Constraints\n"
    "The conditions the agent was given: requirements, limits, hard dependencies, things "
    "ruled out, stated preferences. A reader who keeps the decisions but loses the conditions "
    "that forced them cannot tell which decisions still bind.\n"
    "## Decisions\n"
    "What was decided, and why.\n"
    "## Files touched\n"
    "Every file path, command, URL and identifier the work touched, and what was done to it.\n"
    "## Open items\n"
    "Unresolved questions and the concrete next steps.\n"
)

DEFAULT_INSTRUCTION = (
    "Summarize the conversation above as a handoff briefing for an agent that will continue "
    "this work without access to the original messages. Use exactly these markdown headings, "
    'in this order, and write "None." under a heading with nothing to report:\n'
    + _SECTION_GUIDE
    + "Be dense and factual. Keep exact identifiers (paths, names, versions, numbers, error "
    "codes): they are what the next agent cannot reconstruct."
)

DEFAULT_UPDATE_INSTRUCTION = (
    "UPDATE the previous briefing above with the conversation that followed it. Keep "
    "everything in the previous briefing that still holds, add what the new messages add, "
    "change what they changed, and drop only what is resolved or superseded. Answer with the "
    "complete updated briefing, using exactly these markdown headings, in this order, and "
    'write "None." under a heading with nothing to report:\n'
    + _SECTION_GUIDE
    + "Be dense and factual. Keep exact identifiers (paths, names, versions, numbers, error "
    "codes): they are what the next agent cannot reconstruct."
)

TRANSCRIPT_BLOCK_CHARS = 2_000
"""Cap on the characters of one block (text, tool result) in the transcript."""

TRANSCRIPT_ARGUMENT_CHARS = 300
"""Cap on the characters of one tool call's arguments in the transcript."""

TRANSCRIPT_TOTAL_CHARS = 480_000
"""Cap on the whole transcript (about 120k tokens: it fits the smallest summarizer anyone
routes this at). The span grows with the main model's window, so per-block caps alone let a
1M-context session hand a small summarizer more than it can read; every request would fail."""

_OMITTED = "[... {n} earlier messages omitted: transcript size cap ...]"


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]} [... {len(text) - limit} chars cut]"


# ``json.dumps`` with options builds an encoder on every call: a recall entry of a condensed
# turn serializes each of its calls, a dozen or more a turn on the decision path.
_ARGUMENTS_JSON = json.JSONEncoder(ensure_ascii=False, default=str)


def _arguments(arguments: Mapping[str, Any], limit: int) -> str:
    # Clip long strings before serializing, so a 10 MB argument costs no more than a short one.
    clipped = {k: v[: limit + 1] if isinstance(v, str) else v for k, v in arguments.items()}
    try:
        text = _ARGUMENTS_JSON.encode(clipped)
    except (TypeError, ValueError):  # pragma: no cover - arguments are parsed JSON
        text = repr(clipped)
    return _clip(text, limit)


def _message_text(m: Message, block: int, argument: int) -> str:
    lines: list[str] = []
    if isinstance(m, SummaryMessage):
        lines.append(f"Summary: {_clip(m.text, block)}")
    elif isinstance(m, ToolResultMessage):
        label = "tool error" if m.is_error else "tool result"
        name = m.tool_name or "tool"
        for r in m.content:
            if isinstance(r, TextBlock):
                lines.append(f"[{label}: {name}] {_clip(r.text, block)}")
            else:
                lines.append(f"[{label}: {name}] [{r.type} omitted]")
    else:
        speaker = "User" if isinstance(m, UserMessage) else "Assistant"
        for b in m.content:
            if isinstance(b, TextBlock):
                lines.append(f"{speaker}: {_clip(b.text, block)}")
            elif isinstance(b, ToolCall):
                lines.append(f"[tool call] {b.name}({_arguments(b.arguments, argument)})")
            elif isinstance(b, ThinkingBlock | RedactedThinkingBlock):
                lines.append("[thinking omitted]")
            elif isinstance(b, ImageBlock):
                lines.append("[image omitted]")
            else:
                lines.append(f"[{b.provider} block omitted]")
    return "\n".join(lines)


def serialize_transcript(
    messages: Sequence[Message],
    *,
    block_chars: int = TRANSCRIPT_BLOCK_CHARS,
    argument_chars: int = TRANSCRIPT_ARGUMENT_CHARS,
    total_chars: int = TRANSCRIPT_TOTAL_CHARS,
) -> str:
    """``messages`` as plain text for a summarization request, capped per block and in total.

    Text and tool results are clipped to ``block_chars`` each and tool arguments to
    ``argument_chars`` (identifiers matter, repetition does not); thinking, images and opaque
    blocks become placeholders. Past ``total_chars`` the oldest messages are dropped first and
    one line says how many; only a single newest message larger than the cap can overshoot it.
    Work is bounded by the caps, not by the size of the messages. A lone surrogate becomes
    U+FFFD.
    """
    parts: list[str] = []
    size = 0
    omitted = 0
    for i in range(len(messages) - 1, -1, -1):
        text = _message_text(messages[i], block_chars, argument_chars)
        if not text:
            continue
        if parts and size + len(text) + 1 > total_chars:
            omitted = i + 1
            break
        parts.append(text)
        size += len(text) + 1
    parts.reverse()
    if omitted:
        parts.insert(0, _OMITTED.format(n=omitted))
    # As all text agentctx sends (`sendable_text`): a tool's undecodable output would fail
    # every request made of the stretch it is in.
    return sendable_text("\n".join(parts))


def build_prompt(
    transcript: str,
    previous_briefing: str | None,
    *,
    instruction: str = DEFAULT_INSTRUCTION,
    update_instruction: str = DEFAULT_UPDATE_INSTRUCTION,
) -> str:
    """The user message of a request: a fresh summary, or an update of ``previous_briefing``."""
    conversation = f"<conversation>\n{transcript}\n</conversation>"
    if previous_briefing is None:
        return f"{conversation}\n\n{instruction}"
    previous = f"<previous-briefing>\n{previous_briefing}\n</previous-briefing>"
    return f"{previous}\n\n{conversation}\n\n{update_instruction}"


# The title runs to the end of the line: a closing run of blanks and hashes is punctuation
# to `_norm`. (A lazy title before such a run scanned the run again from every position of
# the title: a model's line of 80,000 blanks took 13 s.)
_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*)$", re.MULTILINE)


def _norm(title: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9]+", " ", title.lower()).split())


def missing_sections(text: str, required: Sequence[str] = REQUIRED_SECTIONS) -> list[str]:
    """The ``required`` section names with no markdown heading in ``text``.

    A heading matches a name case-insensitively, ignoring punctuation; a plural or a longer
    title that starts with the name counts (``## Open items and next steps``).
    """
    headings = [_norm(h) for h in _HEADING.findall(text)]
    missing = []
    for name in required:
        want = _norm(name)
        if not any(h == want or h == want + "s" or h.startswith(want + " ") for h in headings):
            missing.append(name)
    return missing


def check_briefing(
    result: SummaryResult, required: Sequence[str] = REQUIRED_SECTIONS
) -> tuple[str, str] | None:
    """``(reason, detail)`` when ``result`` must not replace history, ``None`` when it may.

    Splicing deletes the span it replaces, so a briefing is checked first: the model must
    have stopped on its own (a ``length`` stop lost the sections at the end, a ``refusal`` is
    not a briefing), the text must not be empty, and every ``required`` heading must be there.
    A provider-native briefing (``result.messages``) is opaque: only its stop is checked, and
    that some message of it holds something (no blank text only).
    Reasons: ``stop_reason``, ``empty``, ``malformed``.
    """
    if result.stop_reason != "stop":
        return "stop_reason", f"the summarizer stopped with {result.stop_reason!r}"
    if result.messages:
        if not any(map(_holds_something, result.messages)):
            return "empty", "the summarizer's messages to splice hold nothing"
        return None
    if not result.text.strip():
        return "empty", "the summarizer returned no text"
    missing = missing_sections(result.text, required)
    if missing:
        return "malformed", "missing sections: " + ", ".join(missing)
    return None


def is_native_compaction(message: Message) -> bool:
    """Whether ``message`` carries a provider's own compaction (an Anthropic ``compaction``
    block, an OpenAI ``compaction`` item, as the adapters or the pydantic-ai and LangChain
    integrations carry it): a briefing someone paid for, which only that provider can read
    and which the deterministic tiers must never condense or drop."""
    return isinstance(message, AssistantMessage) and any(
        isinstance(b, OpaqueBlock) and _is_compaction(b) for b in message.content
    )


def _is_compaction(block: OpaqueBlock) -> bool:
    payload = block.payload
    if payload.get("type") == "compaction":
        return True
    # The integrations keep a framework's own part or content item whole, under their key.
    wrapped = {"pydantic_ai": ("part", "part_kind"), "langchain": ("item", "type")}
    where = wrapped.get(block.provider)
    if where is None:
        return False
    inner = payload.get(where[0])
    return isinstance(inner, Mapping) and inner.get(where[1]) == "compaction"
