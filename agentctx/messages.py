"""The neutral message model every other part of agentctx works on.

A history is a ``Sequence[Message]``. Messages and blocks are frozen, slotted dataclasses:
build them once, never mutate them, share them freely between the raw history and views.
They copy, deep-copy and pickle (to snapshot a history or hand it to another process); a copy
is equal to its original and is counted afresh.

```python
from agentctx import AssistantMessage, ToolCall, ToolResultMessage, UserMessage

history = [
    UserMessage.of("Fix the failing test in tests/test_io.py"),
    AssistantMessage.of(tool_calls=[ToolCall("call_1", "read", {"path": "tests/test_io.py"})]),
    ToolResultMessage.of("call_1", "def test_io(): ...", tool_name="read"),
]
```

Provider fields agentctx does not model (timestamps, ``cache_control``, citations, ids) ride
in each object's ``extra`` mapping, and whole blocks it does not know ride as
``OpaqueBlock``; adapters put them back, so a round trip is lossless.

`to_dict` / `from_dict` give the canonical JSON form; `fingerprint` hashes it. Both are what
the ledger, the stores and the tests use to name a message without trusting object identity.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from math import isfinite
from types import MappingProxyType
from typing import Any, ClassVar, TypeAlias

from agentctx.errors import UnsupportedMessageError

__all__ = [
    "INSTRUCTION_ROLES",
    "THINKING_DROPPED",
    "AssistantContent",
    "AssistantMessage",
    "Block",
    "ImageBlock",
    "Message",
    "OpaqueBlock",
    "RedactedThinkingBlock",
    "SummaryMessage",
    "TextBlock",
    "ThinkingBlock",
    "ToolCall",
    "ToolResultContent",
    "ToolResultMessage",
    "Usage",
    "UserContent",
    "UserMessage",
    "block_from_dict",
    "USAGE_RULE",
    "bad_usage_field",
    "block_to_dict",
    "canonical_json",
    "check_history",
    "fingerprint",
    "from_dict",
    "is_instruction",
    "finite_arguments",
    "json_problem",
    "sendable_json",
    "sendable_text",
    "sent_at",
    "text_fields",
    "text_of",
    "to_dict",
    "with_text",
    "written_arguments",
]

JSONMap: TypeAlias = Mapping[str, Any]
_EMPTY: JSONMap = MappingProxyType({})


# What each field holds, checked when a message or block is made (so `prepare` need not):
# a wrong type fails there, as `UnsupportedMessageError`, not deep inside a later count.
_Fields: TypeAlias = tuple[tuple[str, type | tuple[type, ...], str], ...]
_AN_EXTRA = ("extra", Mapping, "a mapping")
_EXTRA_FIELD: _Fields = (_AN_EXTRA,)


# Copies and pickles are made through the constructor: a `MappingProxyType` (what `from_dict`
# and `of` keep in ``extra``, ``arguments`` and ``payload``) neither pickles nor deep-copies,
# and a message's cached fingerprint and token estimate belong to the object, not its copy.
def _init_names(cls: type) -> list[str]:
    return [f.name for f in fields(cls) if f.init]


def _reduce(obj: Any) -> tuple[Any, tuple[Any, ...]]:
    values = [getattr(obj, name) for name in _init_names(type(obj))]
    return _rebuilt, (type(obj), [dict(v) if isinstance(v, Mapping) else v for v in values])


def _rebuilt(cls: type, values: list[Any]) -> Any:
    return cls(*[(MappingProxyType(v) if v else _EMPTY) if type(v) is dict else v for v in values])


def _check_fields(obj: object, fields: _Fields) -> None:
    for name, kinds, want in fields:
        value = getattr(obj, name)
        if not isinstance(value, kinds):
            raise UnsupportedMessageError(
                None, f"{type(obj).__name__}.{name} of type {type(value).__name__} (takes {want})"
            )


def _check_content(message: Any, kinds: tuple[type, ...]) -> None:
    """``message.content`` is a tuple of ``kinds`` blocks; a list of them becomes one."""
    content = message.content
    if type(content) is not tuple:
        if not isinstance(content, list | tuple):
            name = type(message).__name__
            hint = f" ({name}.of(text) makes one from text)" if isinstance(content, str) else ""
            raise UnsupportedMessageError(
                None,
                f"{name}.content of type {type(content).__name__} (takes a tuple of blocks)" + hint,
            )
        content = tuple(content)
        object.__setattr__(message, "content", content)
    for block in content:
        if not isinstance(block, kinds):
            raise UnsupportedMessageError(
                None, f"{type(block).__name__} in {type(message).__name__}.content"
            )


@dataclass(frozen=True, slots=True)
class TextBlock:
    """Plain text."""

    text: str
    extra: JSONMap = field(default_factory=lambda: _EMPTY)
    type: ClassVar[str] = "text"
    __reduce__ = _reduce

    def __post_init__(self) -> None:
        _check_fields(self, _TEXT_FIELDS)


@dataclass(frozen=True, slots=True)
class ImageBlock:
    """An image, base64 ``data`` or a ``url`` (then ``data`` holds the URL)."""

    media_type: str
    data: str
    source: str = "base64"
    extra: JSONMap = field(default_factory=lambda: _EMPTY)
    type: ClassVar[str] = "image"
    __reduce__ = _reduce

    def __post_init__(self) -> None:
        _check_fields(self, _IMAGE_FIELDS)


@dataclass(frozen=True, slots=True)
class ThinkingBlock:
    """Provider reasoning. ``signature`` is opaque and must go back byte for byte."""

    thinking: str
    signature: str | None = None
    extra: JSONMap = field(default_factory=lambda: _EMPTY)
    type: ClassVar[str] = "thinking"
    __reduce__ = _reduce

    def __post_init__(self) -> None:
        _check_fields(self, _THINKING_FIELDS)


@dataclass(frozen=True, slots=True)
class RedactedThinkingBlock:
    """Encrypted reasoning (Anthropic ``redacted_thinking``, OpenAI ``encrypted_content``)."""

    data: str
    extra: JSONMap = field(default_factory=lambda: _EMPTY)
    type: ClassVar[str] = "redacted_thinking"
    __reduce__ = _reduce

    def __post_init__(self) -> None:
        _check_fields(self, _REDACTED_FIELDS)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call the assistant asked for; ``arguments`` is the parsed JSON object."""

    id: str
    name: str
    arguments: JSONMap
    extra: JSONMap = field(default_factory=lambda: _EMPTY)
    type: ClassVar[str] = "tool_call"
    __reduce__ = _reduce

    def __post_init__(self) -> None:
        _check_fields(self, _CALL_FIELDS)


@dataclass(frozen=True, slots=True)
class OpaqueBlock:
    """A provider block agentctx carries through untouched (server tools, compaction, ...)."""

    provider: str
    payload: JSONMap
    type: ClassVar[str] = "opaque"
    __reduce__ = _reduce

    def __post_init__(self) -> None:
        _check_fields(self, _OPAQUE_FIELDS)


def written_arguments(arguments: Mapping[str, Any], raw: object) -> str | None:
    """The arguments string the model wrote, when it is what goes back instead of fresh JSON
    of ``arguments``: ``raw``, a call's ``extra["arguments"]``, which the OpenAI adapters keep
    when it is not that JSON (other spacing, no JSON object, nesting deeper than Python
    parses), for as long as it still says ``arguments``. A compaction that rewrote the
    arguments leaves it stale: then ``None``."""
    if not isinstance(raw, str):
        return None
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        value = None
    return raw if ((value == arguments) if isinstance(value, dict) else not arguments) else None


UserContent: TypeAlias = TextBlock | ImageBlock | OpaqueBlock
ToolResultContent: TypeAlias = TextBlock | ImageBlock | OpaqueBlock
AssistantContent: TypeAlias = (
    TextBlock | ThinkingBlock | RedactedThinkingBlock | ToolCall | OpaqueBlock
)
Block: TypeAlias = (
    TextBlock | ImageBlock | ThinkingBlock | RedactedThinkingBlock | ToolCall | OpaqueBlock
)

_A_STR = "a str"
_STR_OR_NONE = (str, type(None))
_TEXT_FIELDS: _Fields = (("text", str, _A_STR), _AN_EXTRA)
_IMAGE_FIELDS: _Fields = (
    ("media_type", str, _A_STR),
    ("data", str, _A_STR),
    ("source", str, _A_STR),
    _AN_EXTRA,
)
_THINKING_FIELDS: _Fields = (
    ("thinking", str, _A_STR),
    ("signature", _STR_OR_NONE, "a str or None"),
    _AN_EXTRA,
)
_REDACTED_FIELDS: _Fields = (("data", str, _A_STR), _AN_EXTRA)
_CALL_FIELDS: _Fields = (
    ("id", str, _A_STR),
    ("name", str, _A_STR),
    ("arguments", Mapping, "a mapping"),
    _AN_EXTRA,
)
_OPAQUE_FIELDS: _Fields = (("provider", str, _A_STR), ("payload", Mapping, "a mapping"))
_USER_BLOCKS = (TextBlock, ImageBlock, OpaqueBlock)
_ASSISTANT_BLOCKS = (TextBlock, ThinkingBlock, RedactedThinkingBlock, ToolCall, OpaqueBlock)


@dataclass(frozen=True, slots=True)
class Usage:
    """Token usage of one model response, Anthropic-style: ``input_tokens`` is uncached.

    OpenAI reports cached tokens inside its prompt count; adapters subtract them so that
    `prompt_tokens` means the same thing for every provider.

    ``cache_write_1h_tokens`` is the part of ``cache_write_tokens`` written with Anthropic's
    1-hour TTL (``usage.cache_creation.ephemeral_1h_input_tokens``), which costs more than a
    5-minute write; 0 when there was none or the provider did not say. It is a subset, never
    added on top: ``cache_write_tokens`` stays the total written.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0

    @property
    def prompt_tokens(self) -> int:
        """Everything the model read: uncached input plus cache reads and writes."""
        return self.input_tokens + self.cache_read_tokens + self.cache_write_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
            self.cache_write_1h_tokens + other.cache_write_1h_tokens,
        )


USAGE_FIELDS = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "cache_write_1h_tokens",
)


MOST_TOKENS = 10**9
"""More tokens than any model's window holds: a usage count past it is no request's (a
proxy's session total, a garbled field), read as no count or refused where usage is read."""


USAGE_RULE = (
    f"token counts are ints from 0 to {MOST_TOKENS:,}, and cache_write_1h_tokens is the part "
    "of cache_write_tokens written for an hour"
)
"""What `bad_usage_field` checks, for the errors that name a field it returns."""


def bad_usage_field(usage: Usage) -> str | None:
    """The first field of ``usage`` that breaks `USAGE_RULE` (no ``int``, a ``bool``, below
    0, past `MOST_TOKENS`; ``cache_write_1h_tokens`` above ``cache_write_tokens``), else
    ``None``. `Usage` holds what it is given; what reads it checks it here."""
    for name in USAGE_FIELDS:
        count = getattr(usage, name)
        if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= MOST_TOKENS:
            return name
    if usage.cache_write_1h_tokens > usage.cache_write_tokens:
        return "cache_write_1h_tokens"
    return None


_ASSISTANT_FIELDS: _Fields = (
    ("stop_reason", _STR_OR_NONE, "a str or None"),
    ("usage", (Usage, type(None)), "a Usage or None"),
    ("model", _STR_OR_NONE, "a str or None"),
    _AN_EXTRA,
)
_RESULT_FIELDS: _Fields = (
    ("tool_call_id", str, _A_STR),
    ("tool_name", _STR_OR_NONE, "a str or None"),
    ("is_error", bool, "a bool"),
    _AN_EXTRA,
)
_SUMMARY_FIELDS: _Fields = (("text", str, _A_STR), _AN_EXTRA)


# Each message caches its fingerprint in a private slot: computing it means serializing the
# message, and the hot path asks for it on every call. A second slot holds the token estimate
# of the `MessageCounter` that last counted it, so a message seen for the first time is counted
# without being serialized at all.
_NO_FP = ""


@dataclass(frozen=True, slots=True)
class UserMessage:
    """A message from the user (or the host, speaking as the user)."""

    content: tuple[UserContent, ...]
    extra: JSONMap = field(default_factory=lambda: _EMPTY)
    _fp: str = field(default=_NO_FP, init=False, repr=False, compare=False)
    _tk: Any = field(default=None, init=False, repr=False, compare=False)
    role: ClassVar[str] = "user"
    __reduce__ = _reduce

    def __post_init__(self) -> None:
        _check_content(self, _USER_BLOCKS)
        _check_fields(self, _EXTRA_FIELD)

    @classmethod
    def of(cls, text: str, **extra: Any) -> UserMessage:
        """A user message holding one text block."""
        return cls((TextBlock(text),), MappingProxyType(extra) if extra else _EMPTY)


@dataclass(frozen=True, slots=True)
class AssistantMessage:
    """A model response. ``stop_reason`` is the neutral one: stop, tool_use, length, ..."""

    content: tuple[AssistantContent, ...]
    stop_reason: str | None = None
    usage: Usage | None = None
    model: str | None = None
    extra: JSONMap = field(default_factory=lambda: _EMPTY)
    _fp: str = field(default=_NO_FP, init=False, repr=False, compare=False)
    _tk: Any = field(default=None, init=False, repr=False, compare=False)
    role: ClassVar[str] = "assistant"
    __reduce__ = _reduce

    def __post_init__(self) -> None:
        _check_content(self, _ASSISTANT_BLOCKS)
        _check_fields(self, _ASSISTANT_FIELDS)

    @classmethod
    def of(
        cls,
        text: str = "",
        *,
        tool_calls: Iterable[ToolCall] = (),
        stop_reason: str | None = None,
        usage: Usage | None = None,
    ) -> AssistantMessage:
        """An assistant message from text and tool calls."""
        calls = tuple(tool_calls)
        blocks: tuple[AssistantContent, ...] = ((TextBlock(text),) if text else ()) + calls
        reason = stop_reason or ("tool_use" if calls else "stop")
        return cls(blocks, reason, usage)

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The tool calls of this message, in order."""
        return tuple([b for b in self.content if isinstance(b, ToolCall)])  # a list: 3x faster


@dataclass(frozen=True, slots=True)
class ToolResultMessage:
    """The result of one tool call, linked by ``tool_call_id``."""

    tool_call_id: str
    content: tuple[ToolResultContent, ...]
    tool_name: str | None = None
    is_error: bool = False
    extra: JSONMap = field(default_factory=lambda: _EMPTY)
    _fp: str = field(default=_NO_FP, init=False, repr=False, compare=False)
    _tk: Any = field(default=None, init=False, repr=False, compare=False)
    role: ClassVar[str] = "tool"
    __reduce__ = _reduce

    def __post_init__(self) -> None:
        _check_content(self, _USER_BLOCKS)
        _check_fields(self, _RESULT_FIELDS)

    @classmethod
    def of(
        cls, tool_call_id: str, text: str, *, tool_name: str | None = None, is_error: bool = False
    ) -> ToolResultMessage:
        """A tool result holding one text block."""
        return cls(tool_call_id, (TextBlock(text),), tool_name, is_error)


@dataclass(frozen=True, slots=True)
class SummaryMessage:
    """Text that stands in for compacted history; sent to the model as a user message."""

    text: str
    extra: JSONMap = field(default_factory=lambda: _EMPTY)
    _fp: str = field(default=_NO_FP, init=False, repr=False, compare=False)
    _tk: Any = field(default=None, init=False, repr=False, compare=False)
    role: ClassVar[str] = "summary"
    __reduce__ = _reduce

    def __post_init__(self) -> None:
        _check_fields(self, _SUMMARY_FIELDS)


Message: TypeAlias = UserMessage | AssistantMessage | ToolResultMessage | SummaryMessage
_MESSAGE_TYPES = (UserMessage, AssistantMessage, ToolResultMessage, SummaryMessage)


def text_of(blocks: Iterable[Block]) -> str:
    """The text of the text blocks, joined by newlines."""
    return "\n".join(b.text for b in blocks if isinstance(b, TextBlock))


def text_fields(blocks: Iterable[Block]) -> JSONMap:
    """The fields (``extra``) of the text blocks, a later block's over an earlier's: what one
    text block standing for them all keeps (a caller's ``cache_control``, often on the last)."""
    merged: dict[str, Any] = {}
    for b in blocks:
        if isinstance(b, TextBlock) and b.extra:
            merged.update(b.extra)
    return MappingProxyType(merged) if merged else _EMPTY


def with_text(content: Sequence[ToolResultContent], text: str) -> tuple[ToolResultContent, ...]:
    """A tool result's ``content`` with its text blocks (several: an MCP tool's items) as one
    holding ``text``, in the first one's place (first, when there is none) and with their
    fields (`text_fields`: a caller's ``cache_control``); the other blocks (a screenshot
    beside a page's text, provider blocks) as they are, where they are."""
    new = TextBlock(text, text_fields(content))
    k = next((j for j, b in enumerate(content) if isinstance(b, TextBlock)), None)
    if k is None:
        return (new, *content)
    return tuple(
        new if j == k else b
        for j, b in enumerate(content)
        if j == k or not isinstance(b, TextBlock)
    )


THINKING_DROPPED = "agentctx_thinking_dropped"
"""The ``extra`` key set on an assistant message whose reasoning a decision left out
(`agentctx.ledger.DropThinking`): an adapter then sends nothing that refers to it (the
Responses API rejects an item id whose reasoning item is not sent)."""

TOOL_STEP = "agentctx_tool_step"
"""The ``extra`` key set (to ``True``) on an assistant message that holds a tool call and its
output as provider items (the Responses API's built-in client tools: ``computer_call`` and
``computer_call_output``, ``shell_call`` and its output, ...): a step of its turn, like a call
and its result, never the turn's answer, so compaction may take it as it takes other steps."""

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def sendable_text(text: str) -> str:
    """``text`` as a request can carry it: each lone surrogate (which UTF-8 cannot encode)
    replaced by U+FFFD, the length kept; ``text`` itself when it holds none. For text
    agentctx makes or passes on (a briefing, a recall page): a caller's own is sent as given."""
    return _LONE_SURROGATE.sub("\ufffd", text) if _LONE_SURROGATE.search(text) else text


def sendable_json(text: str) -> str:
    """JSON ``text`` as a request can carry it: each lone surrogate escaped (``\\ud83d``), the
    same JSON value; ``text`` itself when it holds none."""
    if not _LONE_SURROGATE.search(text):
        return text
    return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m[0]):04x}", text)


INSTRUCTION_ROLES = ("system", "developer")
"""The roles of a system or developer message in the middle of a history, which the adapters
carry as a `UserMessage` with ``extra["role"]`` set (see `is_instruction`)."""


def is_instruction(m: Message) -> bool:
    """Whether ``m`` is a system or developer message in the middle of the history: an
    instruction to the model, not the user speaking, so never the task or the latest user
    message the invariants protect (a harness's reminder after the question does not take
    its place)."""
    return isinstance(m, UserMessage) and m.extra.get("role") in INSTRUCTION_ROLES


_LATEST_MS = 253_402_300_800_000  # the year 10000: past it, a timestamp is no time


def sent_at(message: Message) -> float | None:
    """When ``message`` was made, in epoch seconds, from its ``extra["timestamp"]`` (epoch
    milliseconds, as the importers and integrations write it); ``None`` without one, or for
    one that is no time (not a number, not finite, negative, past the year 9999)."""
    stamp = message.extra.get("timestamp")
    # Not a bool (nor another subclass); NaN fails the range.
    if (type(stamp) is int or type(stamp) is float) and 0 <= stamp < _LATEST_MS:
        return stamp / 1000
    return None


# ---------------------------------------------------------------------------------------
# Canonical serialization


def _extra(d: dict[str, Any], extra: JSONMap) -> dict[str, Any]:
    if extra:
        d["extra"] = dict(extra)
    return d


def block_to_dict(block: Block) -> dict[str, Any]:
    match block:
        case TextBlock(text, extra):
            return _extra({"type": "text", "text": text}, extra)
        case ImageBlock(media_type, data, source, extra):
            image = {"type": "image", "media_type": media_type, "data": data, "source": source}
            return _extra(image, extra)
        case ThinkingBlock(thinking, signature, extra):
            return _extra({"type": "thinking", "thinking": thinking, "signature": signature}, extra)
        case RedactedThinkingBlock(data, extra):
            return _extra({"type": "redacted_thinking", "data": data}, extra)
        case ToolCall(id_, name, arguments, extra):
            call = {"type": "tool_call", "id": id_, "name": name, "arguments": dict(arguments)}
            return _extra(call, extra)
        case OpaqueBlock(provider, payload):
            return {"type": "opaque", "provider": provider, "payload": dict(payload)}
    raise UnsupportedMessageError(None, type(block).__name__)


def _usage_to_dict(usage: Usage) -> dict[str, int]:
    d = {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cache_read_tokens": usage.cache_read_tokens,
        "cache_write_tokens": usage.cache_write_tokens,
    }
    if usage.cache_write_1h_tokens:
        # Only when there is one, so the canonical JSON (and every fingerprint) of a message
        # without 1-hour writes is what it was before the field existed.
        d["cache_write_1h_tokens"] = usage.cache_write_1h_tokens
    return d


def to_dict(message: Message) -> dict[str, Any]:
    """The canonical JSON-compatible form of a message (the inverse of `from_dict`)."""
    match message:
        case UserMessage(content, extra):
            d: dict[str, Any] = {"role": "user", "content": [block_to_dict(b) for b in content]}
        case AssistantMessage(content, stop_reason, usage, model, extra):
            d = {"role": "assistant", "content": [block_to_dict(b) for b in content]}
            if stop_reason is not None:
                d["stop_reason"] = stop_reason
            if usage is not None:
                d["usage"] = _usage_to_dict(usage)
            if model is not None:
                d["model"] = model
        case ToolResultMessage(call_id, content, tool_name, is_error, extra):
            d = {
                "role": "tool",
                "tool_call_id": call_id,
                "content": [block_to_dict(b) for b in content],
            }
            if tool_name is not None:
                d["tool_name"] = tool_name
            if is_error:
                d["is_error"] = True
        case SummaryMessage(text, extra):
            d = {"role": "summary", "text": text}
        case _:
            raise UnsupportedMessageError(None, type(message).__name__)
    return _extra(d, extra)


def _want(d: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = d.get(key)
    if not isinstance(value, kind):
        raise UnsupportedMessageError(None, f"{where}: field {key!r} missing or not {kind}")
    return value


def _shown(value: object) -> str:
    """``value`` in an error message: a str cut short, None, or else its type (``repr`` of a
    huge int or a deep container raises)."""
    if isinstance(value, str):
        return repr(value[:40]) + ("..." if len(value) > 40 else "")
    if value is None or (type(value) is int and -(10**18) < value < 10**18):
        return repr(value)
    return f"a {type(value).__name__}"


def _extra_of(d: Mapping[str, Any], where: str) -> JSONMap:
    extra = d.get("extra")
    if extra is None:
        return _EMPTY
    if not isinstance(extra, Mapping):
        raise UnsupportedMessageError(None, f"{where}: field 'extra' is no object")
    return MappingProxyType(dict(extra))


def _usage_from(u: Mapping[str, Any]) -> Usage:
    unknown = [key for key in u if key not in USAGE_FIELDS]
    if unknown:
        raise UnsupportedMessageError(None, f"usage field {_shown(unknown[0])}")
    usage = Usage(**u)
    if (name := bad_usage_field(usage)) is not None:
        raise UnsupportedMessageError(None, f"usage: {name} {_shown(u[name])} ({USAGE_RULE})")
    return usage


def block_from_dict(d: Any) -> Block:
    if not isinstance(d, Mapping):
        raise UnsupportedMessageError(None, f"block is {type(d).__name__}, not an object")
    kind = d.get("type")
    where = f"{_shown(kind)} block"
    extra = _extra_of(d, where)
    if kind == "text":
        return TextBlock(_want(d, "text", str, where), extra)
    if kind == "image":
        return ImageBlock(
            _want(d, "media_type", str, where),
            _want(d, "data", str, where),
            d.get("source", "base64"),
            extra,
        )
    if kind == "thinking":
        return ThinkingBlock(_want(d, "thinking", str, where), d.get("signature"), extra)
    if kind == "redacted_thinking":
        return RedactedThinkingBlock(_want(d, "data", str, where), extra)
    if kind == "tool_call":
        return ToolCall(
            _want(d, "id", str, where),
            _want(d, "name", str, where),
            _want(d, "arguments", Mapping, where),
            extra,
        )
    if kind == "opaque":
        return OpaqueBlock(_want(d, "provider", str, where), _want(d, "payload", Mapping, where))
    raise UnsupportedMessageError(None, f"block type {_shown(kind)}")


def from_dict(d: Mapping[str, Any]) -> Message:
    """Rebuild a message from `to_dict` output; raises `UnsupportedMessageError` otherwise."""
    if not isinstance(d, Mapping):
        raise UnsupportedMessageError(None, f"message is {type(d).__name__}, not an object")
    role = d.get("role")
    where = f"{_shown(role)} message"
    extra = _extra_of(d, where)
    if role == "summary":
        return SummaryMessage(_want(d, "text", str, where), extra)
    blocks = tuple(block_from_dict(b) for b in _want(d, "content", list, where))
    if role == "user":
        return UserMessage(blocks, extra)  # type: ignore[arg-type]
    if role == "assistant":
        u = d.get("usage")
        usage = _usage_from(u) if isinstance(u, Mapping) else None
        return AssistantMessage(blocks, d.get("stop_reason"), usage, d.get("model"), extra)  # type: ignore[arg-type]
    if role == "tool":
        return ToolResultMessage(
            _want(d, "tool_call_id", str, "tool message"),
            blocks,  # type: ignore[arg-type]
            d.get("tool_name"),
            False if (error := d.get("is_error")) is None else error,
            extra,
        )
    raise UnsupportedMessageError(None, f"role {_shown(role)}")


# One encoder for every call: ``json.dumps`` with options builds a new one each time.
_CANONICAL_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_json(message: Message) -> str:
    """Deterministic JSON text of a message: sorted keys, no whitespace, UTF-8 kept.

    Raises `UnsupportedMessageError` for a message holding what JSON cannot (in ``extra``:
    `check_history` checks the arguments and payloads a history brings)."""
    data = to_dict(message)
    with _json_errors():
        return _CANONICAL_JSON.encode(data)


@contextlib.contextmanager
def _json_errors() -> Iterator[None]:
    """A message's JSON that cannot be written is an `UnsupportedMessageError`."""
    try:
        yield
    except (TypeError, ValueError, RecursionError) as e:
        raise UnsupportedMessageError(None, f"content JSON cannot hold ({e})") from e


def fingerprint(message: Message) -> str:
    """A stable 128-bit hex digest of the message's canonical form, cached on the message."""
    fp = message._fp
    if fp:
        return fp
    digest = hashlib.blake2b(digest_size=16)
    data = to_dict(message)
    with _json_errors():
        if _strings_chars(data) < _HASHED_IN_PIECES_FROM:
            digest.update(_CANONICAL_JSON.encode(data).encode("utf-8", "surrogatepass"))
        else:
            # The same bytes, a piece at a time: whole, the JSON of a tool's binary output (a
            # control character is six characters escaped, at four bytes each beside one
            # character past Latin-1) took 45 times its size, 2 GB for 50 MB.
            _hash_json(data, digest)
    fp = digest.hexdigest()
    object.__setattr__(message, "_fp", fp)
    return fp


_HASHED_IN_PIECES_FROM = 1 << 20  # characters of the strings a message's JSON holds
_PIECE = 1 << 16


def _strings_chars(data: object) -> int:
    """Characters of the strings ``data`` holds, nested ones too (counted until there are
    enough to hash in pieces): texts, a file written whole in a call's arguments, an image's
    data, fields, payloads."""
    n = 0
    stack: list[object] = [data]
    while stack and n < _HASHED_IN_PIECES_FROM:
        value = stack.pop()
        if type(value) is str:
            n += len(value)
        elif isinstance(value, Mapping):
            stack.extend(value.values())
        elif type(value) is list or type(value) is tuple:
            stack.extend(value)
    return n


def _hash_json(value: object, digest: Any) -> None:
    """Feed ``digest`` the UTF-8 of ``value``'s canonical JSON (`canonical_json`), long
    strings escaped a piece at a time (JSON escapes each character on its own)."""
    if type(value) is str and len(value) > _PIECE:
        digest.update(b'"')
        for i in range(0, len(value), _PIECE):
            piece = _CANONICAL_JSON.encode(value[i : i + _PIECE])[1:-1]
            digest.update(piece.encode("utf-8", "surrogatepass"))
        digest.update(b'"')
    elif type(value) is dict and all(type(k) is str for k in value):
        digest.update(b"{")
        for n, key in enumerate(sorted(value)):
            digest.update(b"," if n else b"")
            _hash_json(key, digest)
            digest.update(b":")
            _hash_json(value[key], digest)
        digest.update(b"}")
    elif type(value) is list or type(value) is tuple:
        digest.update(b"[")
        for n, item in enumerate(value):
            digest.update(b"," if n else b"")
            _hash_json(item, digest)
        digest.update(b"]")
    else:
        digest.update(_CANONICAL_JSON.encode(value).encode("utf-8", "surrogatepass"))


def check_history(history: Sequence[object], offset: int = 0) -> None:
    """Raise `UnsupportedMessageError` naming the first item that is not a neutral message,
    or whose tool call arguments or opaque payload hold what JSON cannot (they are counted
    and sent as JSON; a model's arguments parsed from JSON always pass).

    ``offset`` is added to the reported index (for checking the new tail of a history).
    """
    for i, m in enumerate(history):
        if not isinstance(m, _MESSAGE_TYPES):
            raise UnsupportedMessageError(i + offset, f"item of type {type(m).__name__}")
        if isinstance(m, _CARRY_JSON):
            for b in m.content:
                if type(b) is TextBlock:
                    continue  # most blocks, passed at the cost of one comparison
                if isinstance(b, ToolCall):
                    found = json_problem(b.arguments, "tool call arguments")
                elif isinstance(b, OpaqueBlock):
                    found = json_problem(b.payload, "opaque payload")
                else:
                    continue
                if found:
                    raise UnsupportedMessageError(i + offset, found)


def json_problem(value: Mapping[str, Any], what: str, *, finite: bool = False) -> str | None:
    """What in ``value`` JSON cannot hold (a key that is not a string, a value that is not a
    string, number, bool, None, list or dict, nesting past the encoder's depth or a
    container inside itself; with ``finite``, NaN or an infinity, which Python writes and
    a provider's SDK refuses to send), else ``None``. O(items), without recursion."""
    if type(value) is dict:  # the common case first: a flat dict of strings and numbers
        for key, item in value.items():
            kind = type(item)
            if (
                type(key) is not str
                or kind not in _SCALARS
                or (kind is int and _huge(item))
                or (finite and kind is float and not isfinite(item))
            ):
                break
        else:
            return None
    if not isinstance(value, Mapping):
        return f"{what} of type {type(value).__name__} (not a mapping)"
    stack: list[object] = [dict(value)]  # a mapping at the top, as `to_dict` writes it
    seen: set[int] = set()
    shared = False
    while stack:
        container = stack.pop()
        if id(container) in seen:
            shared = True  # the same object twice: a cycle, or only shared (asked below)
            continue
        seen.add(id(container))
        if isinstance(container, dict):
            for key, item in container.items():
                if type(key) is not str:
                    return f"{what} with a key of type {type(key).__name__}"
                if not isinstance(item, _SCALAR_BASES) and item is not None:
                    stack.append(item)
                elif (problem := _scalar_problem(item, what, finite)) is not None:
                    return problem
        elif isinstance(container, list | tuple):
            for item in container:
                if not isinstance(item, _SCALAR_BASES) and item is not None:
                    stack.append(item)
                elif (problem := _scalar_problem(item, what, finite)) is not None:
                    return problem
        else:
            return f"{what} holding a {type(container).__name__}"
    if shared or len(seen) > _DEPTH_CHECK_FROM:
        try:  # what only an encoder tells apart: a cycle, or too deep to encode
            json.dumps(dict(value))
        except (ValueError, RecursionError):
            return f"{what} nested too deep or inside themselves"
    return None


def finite_arguments(arguments: Mapping[str, Any]) -> Mapping[str, Any]:
    """``arguments`` with each NaN or infinity (a model's JSON Python parsed) as ``None``,
    which JSON holds: what a decision keeps of arguments it cuts. ``arguments`` themselves
    when they hold none."""
    if json_problem(arguments, "", finite=True) is None:
        return arguments
    return _finite(arguments)  # type: ignore[no-any-return]


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def _scalar_problem(item: object, what: str, finite: bool) -> str | None:
    if isinstance(item, int) and _huge(item):
        return f"{what} holding an integer of more digits than Python writes"
    if finite and isinstance(item, float) and not isfinite(item):
        return f"{what} holding {item!r}, which JSON cannot hold"
    return None


_DEPTH_CHECK_FROM = 256  # containers past which `json_problem` asks the encoder about depth
_BIG = 10**4000  # ints this large may be past what ``str`` writes (4300 digits by default)


def _huge(n: int) -> bool:
    """Whether ``n`` has more digits than Python writes (`sys.set_int_max_str_digits`): JSON
    of it raises `ValueError`. One comparison for any int a model writes."""
    if -_BIG < n < _BIG:
        return False
    try:
        str(n)
    except ValueError:
        return True
    return False


_SCALARS = frozenset((str, int, float, bool, type(None)))
_SCALAR_BASES = (str, int, float)  # their subclasses too (an IntEnum): encoded as they are
_CARRY_JSON = (AssistantMessage, UserMessage)  # the messages with arguments or payloads
