"""OpenAI Chat Completions messages and responses <-> neutral messages, lossless both ways.

```python
from agentctx.adapters.openai_chat import (
    from_openai_chat, message_from_openai_chat_response, split_openai_chat_system,
    to_openai_chat,
)

system, rest = split_openai_chat_system(params["messages"])
history = from_openai_chat(rest)
view = await ctx.prepare(history)
resp = client.chat.completions.create(model=..., messages=system + to_openai_chat(view))
history.append(message_from_openai_chat_response(resp.to_dict()))
```

Split the leading system / developer messages off first: they are the request's fixed
overhead, and left in the history the first of them would pass for the task. One that does
reach `from_openai_chat` (say in the middle of a history) becomes a `UserMessage` marked
with its role, and goes back as what it was.

Mapping: ``text`` / ``image_url`` parts become `TextBlock` / `ImageBlock` (data URLs as
base64 images), other parts ``OpaqueBlock("openai_chat", part)``; function ``tool_calls``
become `ToolCall`, and so do ``custom`` ones (``{"input": text}`` as their arguments, so they
pair with their tool messages; one whose id, name, arguments or input is not a string, which
the API refuses, is refused with `UnsupportedMessageError`); a call with no ``type``, or a
null one (some compatible servers leave it out) is read as a function call and sent back with
``"type": "function"``, which the API requires; a call of another type is refused with
`UnsupportedMessageError` (the API takes none, and its tool message would answer no call);
an assistant message's ``audio`` (an earlier spoken answer, by id) is
``OpaqueBlock("openai_chat.audio", {"audio": ...})``;
``tool`` messages become `ToolResultMessage` (``tool_name`` from the ``name`` field, else from the
call); an ``image_url`` part of a ``tool`` (or assistant) message, which the API refuses there
(it takes images in user messages only) but a compatible server may take, is
``OpaqueBlock("openai_chat", part)``, sent back as it came, while an `ImageBlock` in a tool
result (a screenshot read from Anthropic's format) is refused by `to_openai_chat`; an
assistant ``refusal`` string is a `TextBlock` with ``extra["refusal"] = True``; a
``reasoning_content`` string (vLLM, DeepSeek and other compatible servers) is a
`ThinkingBlock` without signature.

``arguments`` is a JSON string on the wire and a parsed object in `ToolCall`: when the
string is not what ``json.dumps`` would write (spacing, escapes, invalid JSON), the original
rides in ``extra["arguments"]`` and goes back byte for byte for as long as the parsed
arguments are unchanged. Other unmodeled fields ride flat in the block's ``extra``.

Message-level details ride in ``extra["openai_chat"]``: ``role`` (system / developer),
``content`` (the content form when not the default: "string", "list", "null", "absent"),
``name`` (the tool message carried a ``name``), ``tool_calls`` (a null ``tool_calls`` value,
sent back; an empty array, which compatible servers return and the API refuses, is left
out), ``fields`` (unknown keys, sent back verbatim), ``response`` (response metadata, never
sent).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, TypeAlias, TypeVar

from agentctx._usage import usage_of
from agentctx.adapters._streams import malformed
from agentctx.errors import UnsupportedMessageError
from agentctx.messages import (
    AssistantContent,
    AssistantMessage,
    ImageBlock,
    Message,
    OpaqueBlock,
    SummaryMessage,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserContent,
    UserMessage,
    sendable_json,
    written_arguments,
)

__all__ = [
    "CALL_PROVIDER",
    "KEY",
    "PROVIDER",
    "assemble_openai_chat_stream",
    "from_openai_chat",
    "message_from_openai_chat_response",
    "split_openai_chat_system",
    "to_openai_chat",
]

PROVIDER = "openai_chat"
"""The ``provider`` of the `OpaqueBlock` holding a content part this adapter does not model."""
CALL_PROVIDER = "openai_chat.tool_call"
"""The ``provider`` of the `OpaqueBlock` holding a tool call that is not a function call."""
AUDIO_PROVIDER = "openai_chat.audio"
"""The ``provider`` of the `OpaqueBlock` holding an assistant message's ``audio`` (a spoken
answer sent back by its id): content of the message, which no repair calls empty."""
KEY = "openai_chat"
"""The message ``extra`` key holding this adapter's message-level details."""
_CUSTOM = "custom"  # a custom tool's call: ``{"type": "custom", "custom": {name, input}}``

JSON: TypeAlias = dict[str, Any]
M = TypeVar("M", UserMessage, ToolResultMessage, AssistantMessage)
_EMPTY: Mapping[str, Any] = MappingProxyType({})
_ABSENT = object()
_INSTRUCTIONS = ("system", "developer")
_STOP_REASONS = {
    "stop": "stop",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "length",
    "content_filter": "refusal",
}


# ---------------------------------------------------------------------------------------
# Helpers shared with the Responses adapter


def freeze(d: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(d)) if d else _EMPTY


def rest(d: Mapping[str, Any], *known: str) -> JSON:
    return {k: v for k, v in d.items() if k not in known}


def info_of(m: Message, key: str) -> Mapping[str, Any]:
    info = m.extra.get(key)
    return info if isinstance(info, Mapping) else _EMPTY


def with_info(m: M, key: str, info: Mapping[str, Any]) -> M:
    """``m`` with ``extra[key] = info`` (unchanged when ``info`` is empty)."""
    if not info:
        return m
    extra = freeze({**m.extra, key: dict(info)})
    new: Message
    match m:
        case UserMessage(content):
            new = UserMessage(content, extra)
        case ToolResultMessage(call_id, content, name, is_error):
            new = ToolResultMessage(call_id, content, name, is_error, extra)
        case AssistantMessage(content, reason, usage, model):
            new = AssistantMessage(content, reason, usage, model, extra)
        case _:
            raise UnsupportedMessageError(None, type(m).__name__)
    return new


def plain_text(blocks: Sequence[object]) -> bool:
    return len(blocks) == 1 and isinstance(blocks[0], TextBlock) and not blocks[0].extra


def dumps_arguments(arguments: Mapping[str, Any]) -> str:
    """Tool arguments as OpenAI writes them: compact JSON, UTF-8 kept (of any mapping). A lone
    surrogate (a model's JSON can escape half a pair) stays escaped: UTF-8 cannot carry it.
    `TypeError` or `ValueError` for what JSON cannot hold (bytes, NaN)."""
    return sendable_json(
        json.dumps(
            arguments, ensure_ascii=False, separators=(",", ":"), default=_as_dict, allow_nan=False
        )
    )


def _as_dict(value: object) -> dict[str, Any]:
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def parse_arguments(raw: str) -> tuple[Mapping[str, Any], str | None]:
    """The arguments object and, when `dumps_arguments` would not give it back, ``raw``."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, or nested past what Python parses
        return {}, raw
    if not isinstance(value, dict):
        return {}, raw
    try:
        again = dumps_arguments(value)
    except ValueError:  # NaN, which Python parses and JSON does not hold: kept as written
        return value, raw
    return value, None if again == raw else raw


def render_arguments(arguments: Mapping[str, Any], raw: object, index: int | None = None) -> str:
    """The arguments string: ``raw`` while it still says ``arguments`` (`written_arguments`),
    else fresh JSON; `UnsupportedMessageError` (naming message ``index``) for arguments JSON
    cannot hold (bytes, NaN), which the request could not carry."""
    written = written_arguments(arguments, raw)
    if written is not None:
        return written
    try:
        return dumps_arguments(arguments)
    except (TypeError, ValueError) as e:
        raise UnsupportedMessageError(
            index, f"tool call arguments JSON cannot hold ({e})"
        ) from None


def image_from_url(url: str, extra: Mapping[str, Any]) -> ImageBlock:
    if url.startswith("data:") and ";base64," in url:
        media_type, data = url[5:].split(";base64,", 1)
        return ImageBlock(media_type, data, "base64", freeze(extra))
    return ImageBlock("", url, "url", freeze(extra))


def image_url(block: ImageBlock) -> str:
    if block.source == "url":
        return block.data
    return f"data:{block.media_type};base64,{block.data}"


def count(d: object, key: str) -> int:
    value = d.get(key) if isinstance(d, Mapping) else None
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def content_of(content: object, index: int) -> tuple[list[Mapping[str, Any]] | str | None, str]:
    """Message content and its form: "string", "list", "null" or "absent"."""
    if content is _ABSENT:
        return None, "absent"
    if content is None:
        return None, "null"
    if isinstance(content, str):
        return content, "string"
    if isinstance(content, list) and all(isinstance(p, Mapping) for p in content):
        return content, "list"
    raise UnsupportedMessageError(index, f"content of type {type(content).__name__}")


def form_ok(form: object, blocks: Sequence[object]) -> bool:
    if form == "string":
        return plain_text(blocks)
    return form == "list" or (form in ("null", "absent") and not blocks)


# ---------------------------------------------------------------------------------------
# Parts and tool calls


def _part(p: Mapping[str, Any]) -> UserContent:
    kind = p.get("type")
    block: UserContent | None = None
    if kind == "text" and isinstance(p.get("text"), str):
        block = TextBlock(p["text"], freeze(rest(p, "type", "text")))
    elif kind == "image_url" and isinstance(inner := p.get("image_url"), Mapping):
        url = inner.get("url")
        extra = rest(p, "type", "image_url")
        if len(inner) > 1:
            extra["image_url"] = rest(inner, "url")
        block = image_from_url(url, extra) if isinstance(url, str) else None
    if block is not None and _render_part(block, 0) == p:
        return block
    return OpaqueBlock(PROVIDER, p)


def _render_part(block: object, index: int) -> JSON:
    match block:
        case TextBlock(text, extra):
            return {**extra, "type": "text", "text": text}
        case ImageBlock(extra=extra):
            inner = {**extra.get("image_url", _EMPTY), "url": image_url(block)}
            return {**rest(extra, "image_url"), "type": "image_url", "image_url": inner}
        case OpaqueBlock(provider, payload) if provider == PROVIDER:
            return dict(payload)
        case OpaqueBlock(provider, _):
            raise UnsupportedMessageError(
                index, f"{provider} opaque block in an OpenAI Chat message"
            )
    raise UnsupportedMessageError(index, f"{type(block).__name__} in an OpenAI Chat message")


def _call(tc: Mapping[str, Any]) -> ToolCall | OpaqueBlock:
    custom = tc.get("custom")
    if (
        tc.get("type") == _CUSTOM
        and isinstance(tc.get("id"), str)
        and isinstance(custom, Mapping)
        and isinstance(custom.get("name"), str)
        and isinstance(custom.get("input"), str)
    ):
        # A custom tool's call (free-form ``input`` text): a `ToolCall` with ``{"input":
        # text}`` as its arguments, so it pairs with its tool message as a function call does.
        extra = {**rest(tc, "id", "custom"), "type": _CUSTOM}
        if len(custom) > 2:
            extra["custom"] = rest(custom, "name", "input")
        call = ToolCall(tc["id"], custom["name"], {"input": custom["input"]}, freeze(extra))
        if _render_call(call) == tc:
            return call
    fn = tc.get("function")
    if tc.get("type") is None and isinstance(fn, Mapping):
        # Some compatible servers (Azure AI Inference) leave the type out of a function call
        # (the SDK's ``model_dump()`` then writes null); the API requires it: read as a
        # function call, sent back with it.
        tc = {**tc, "type": "function"}
    if (
        tc.get("type") == "function"
        and isinstance(tc.get("id"), str)
        and isinstance(fn, Mapping)
        and isinstance(fn.get("name"), str)
        and isinstance(fn.get("arguments"), str)
    ):
        arguments, raw = parse_arguments(fn["arguments"])
        extra = rest(tc, "id", "type", "function")
        if len(fn) > 2:
            extra["function"] = rest(fn, "name", "arguments")
        if raw is not None:
            extra["arguments"] = raw
        call = ToolCall(tc["id"], fn["name"], arguments, freeze(extra))
        if _render_call(call) == tc:
            return call
    return OpaqueBlock(CALL_PROVIDER, tc)


def _render_call(call: ToolCall, index: int | None = None) -> JSON:
    if call.extra.get("type") == _CUSTOM:
        text = call.arguments.get("input")
        if not isinstance(text, str):  # arguments a caller's own strategy replaced
            text = render_arguments(call.arguments, None, index)
        custom = {**call.extra.get("custom", _EMPTY), "name": call.name, "input": text}
        return {**rest(call.extra, "custom"), "id": call.id, "custom": custom}
    extra = rest(call.extra, "arguments", "function")
    fn = {
        **call.extra.get("function", _EMPTY),
        "name": call.name,
        "arguments": render_arguments(call.arguments, call.extra.get("arguments"), index),
    }
    return {**extra, "id": call.id, "type": "function", "function": fn}


# ---------------------------------------------------------------------------------------
# Requests


def split_openai_chat_system(
    messages: Sequence[Mapping[str, Any]],
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """The leading system / developer messages, and the rest (both lists of the same dicts)."""
    n = 0
    while n < len(messages) and _role(messages[n]) in _INSTRUCTIONS:
        n += 1
    return list(messages[:n]), list(messages[n:])


def _role(message: object) -> object:
    return message.get("role") if isinstance(message, Mapping) else None


def from_openai_chat(
    messages: Iterable[Mapping[str, Any]], *, start: int = 0, names: dict[str, str] | None = None
) -> list[Message]:
    """Neutral messages for Chat Completions request ``messages``.

    Raises `UnsupportedMessageError` (with the index) for an unknown role (``function`` is
    one), a tool message without ``tool_call_id``, or content of the wrong type.

    A history converted in parts converts as it does whole when each part gets its ``start``
    index in the whole and the tool names of the calls before it (``names``, call id to name:
    updated with the part's own).
    """
    out: list[Message] = []
    names = {} if names is None else names
    for index, msg in enumerate(messages, start):
        if not isinstance(msg, Mapping):
            raise UnsupportedMessageError(index, f"message of type {type(msg).__name__}")
        role = msg.get("role")
        if role == "assistant":
            m = _assistant(index, msg, response=False)
            names.update((c.id, c.name) for c in m.tool_calls)
            out.append(m)
        elif role == "tool":
            out.append(_tool(index, msg, names))
        elif role == "user" or role in _INSTRUCTIONS:
            content, form = content_of(msg.get("content", _ABSENT), index)
            blocks = (TextBlock(content),) if isinstance(content, str) else _parts(content)
            info: JSON = {"role": role} if role != "user" else {}
            if form != ("string" if plain_text(blocks) else "list"):
                info["content"] = form
            if fields := rest(msg, "role", "content"):
                info["fields"] = fields
            marked = freeze({"role": role} if role in _INSTRUCTIONS else {})
            out.append(with_info(UserMessage(blocks, marked), KEY, info))  # `is_instruction`
        else:
            raise UnsupportedMessageError(index, f"role {role!r}")
    return out


def _parts(content: Sequence[Mapping[str, Any]] | None) -> tuple[UserContent, ...]:
    return tuple(_part(p) for p in content or ())


def _assistant(index: int, msg: Mapping[str, Any], *, response: bool) -> AssistantMessage:
    blocks: list[AssistantContent] = []
    known = ["role", "content", "tool_calls"]
    info: JSON = {}
    if isinstance(reasoning := msg.get("reasoning_content"), str):
        blocks.append(ThinkingBlock(reasoning))
        known.append("reasoning_content")
    content, form = content_of(msg.get("content", _ABSENT), index)
    texts: list[AssistantContent] = []
    if isinstance(content, str):
        texts.append(TextBlock(content))
    for p in content if isinstance(content, list) else ():
        part = _part(p)
        texts.append(part if not isinstance(part, ImageBlock) else OpaqueBlock(PROVIDER, p))
    if form != _default_form(texts):
        info["content"] = form
    blocks.extend(texts)
    if isinstance(refusal := msg.get("refusal"), str):
        blocks.append(TextBlock(refusal, freeze({"refusal": True})))
        known.append("refusal")
    if not response and isinstance(audio := msg.get("audio"), Mapping):
        blocks.append(OpaqueBlock(AUDIO_PROVIDER, {"audio": audio}))
        known.append("audio")
    calls = msg.get("tool_calls")
    if isinstance(calls, list) and calls:
        for tc in calls:
            if not isinstance(tc, Mapping):
                raise UnsupportedMessageError(index, f"tool call of type {type(tc).__name__}")
            call = _call(tc)
            if isinstance(call, OpaqueBlock):
                # Opaque, its tool message would answer no call (and be dropped as an
                # orphan) while the request kept the call: the API refuses such a call anyway
                # ("expected a string", or a type other than function and custom).
                kind = tc.get("type")
                what = (
                    f"{kind} tool call whose id, name, arguments or input is not a string"
                    if kind in ("function", _CUSTOM)
                    else f"tool call of type {kind!r} (the API takes function and custom calls)"
                )
                raise UnsupportedMessageError(index, what)
            blocks.append(call)
    elif "tool_calls" in msg:
        info["tool_calls"] = calls
    fields = rest(msg, *known)
    if response:
        return AssistantMessage(tuple(blocks), extra=freeze({KEY: {"response": fields}}))
    if fields:
        info["fields"] = fields
    return with_info(AssistantMessage(tuple(blocks)), KEY, info)


def _default_form(texts: Sequence[object]) -> str:
    if not texts:
        return "null"
    return "string" if plain_text(texts) else "list"


def _tool(index: int, msg: Mapping[str, Any], names: Mapping[str, str]) -> ToolResultMessage:
    call_id = msg.get("tool_call_id")
    if not isinstance(call_id, str):
        raise UnsupportedMessageError(index, "tool message without a tool_call_id")
    content, form = content_of(msg.get("content", _ABSENT), index)
    blocks: tuple[UserContent, ...]
    if isinstance(content, str):
        blocks = (TextBlock(content),)
    else:
        # An image part, which the API takes in user messages only, rides as it came (a
        # compatible server may take it), as it does in an assistant message: an `ImageBlock`
        # here is one `to_openai_chat` refuses.
        parts = [(_part(p), p) for p in content or ()]
        blocks = tuple(
            b if not isinstance(b, ImageBlock) else OpaqueBlock(PROVIDER, p) for b, p in parts
        )
    info: JSON = {}
    if form != ("string" if plain_text(blocks) else "list"):
        info["content"] = form
    known = ["role", "tool_call_id", "content"]
    name = msg.get("name")
    if isinstance(name, str):
        info["name"] = True
        known.append("name")
    if fields := rest(msg, *known):
        info["fields"] = fields
    tool_name = name if isinstance(name, str) else names.get(call_id)
    return with_info(ToolResultMessage(call_id, blocks, tool_name), KEY, info)


def to_openai_chat(messages: Iterable[Message]) -> list[JSON]:
    """Chat Completions ``messages`` for neutral messages (the inverse of `from_openai_chat`).

    Put the system messages split off by `split_openai_chat_system` in front. A
    `SummaryMessage` is sent as a user message. Text goes before tool calls, as the format
    has it. Raises `UnsupportedMessageError` for what Chat Completions cannot carry: a
    signed or redacted thinking block, an `ImageBlock` in a tool result (a tool message takes
    text only, a string or text parts: an image goes in a user message), or an opaque block
    of another provider.
    """
    out: list[JSON] = []
    for index, m in enumerate(messages):
        info = info_of(m, KEY)
        d: JSON = dict(info.get("fields", _EMPTY))
        if isinstance(m, UserMessage):
            role = info.get("role")
            d["role"] = role if role in _INSTRUCTIONS else "user"
            _put_content(d, m.content, info.get("content"), "list", index)
        elif isinstance(m, SummaryMessage):
            d.update(role="user", content=m.text)
        elif isinstance(m, ToolResultMessage):
            if any(isinstance(b, ImageBlock) for b in m.content):
                raise UnsupportedMessageError(
                    index,
                    "image in a tool result: a Chat Completions tool message takes text only "
                    "(a string or text parts); send the image in a user message",
                )
            d.update(role="tool", tool_call_id=m.tool_call_id)
            _put_content(d, m.content, info.get("content"), "list", index)
            if info.get("name") and m.tool_name is not None:
                d["name"] = m.tool_name
        elif isinstance(m, AssistantMessage):
            _render_assistant(d, m, info, index)
        else:
            raise UnsupportedMessageError(index, f"item of type {type(m).__name__}")
        out.append(d)
    return out


def _put_content(d: JSON, blocks: Sequence[object], form: object, empty: str, index: int) -> None:
    if not form_ok(form, blocks):
        form = "string" if plain_text(blocks) else (empty if not blocks else "list")
    if form == "string":
        d["content"] = blocks[0].text  # type: ignore[attr-defined]
    elif form == "list":
        d["content"] = [_render_part(b, index) for b in blocks]
    elif form == "null":
        d["content"] = None


def _render_assistant(d: JSON, m: AssistantMessage, info: Mapping[str, Any], index: int) -> None:
    d["role"] = "assistant"
    texts: list[object] = []
    refusals: list[str] = []
    calls: list[JSON] = []
    for b in m.content:
        if isinstance(b, ThinkingBlock) and b.signature is None and "reasoning_content" not in d:
            d["reasoning_content"] = b.thinking
        elif isinstance(b, TextBlock) and b.extra.get("refusal") is True:
            refusals.append(b.text)
        elif isinstance(b, TextBlock):
            texts.append(b)
        elif isinstance(b, ToolCall):
            calls.append(_render_call(b, index))
        elif isinstance(b, OpaqueBlock) and b.provider == CALL_PROVIDER:
            calls.append(dict(b.payload))
        elif isinstance(b, OpaqueBlock) and b.provider == AUDIO_PROVIDER:
            d["audio"] = b.payload["audio"]
        elif isinstance(b, OpaqueBlock):
            texts.append(b)
        else:
            kind = f"{b.type} block" if not isinstance(b, ThinkingBlock) else "second or signed"
            raise UnsupportedMessageError(index, f"{kind} in an OpenAI Chat assistant message")
    _put_content(d, texts, info.get("content"), "null", index)
    if refusals:
        d["refusal"] = "".join(refusals)
    if calls:
        d["tool_calls"] = calls
    elif "tool_calls" in info and info["tool_calls"] != []:  # an empty array the API refuses
        d["tool_calls"] = info["tool_calls"]


# ---------------------------------------------------------------------------------------
# Responses and streams


def chat_usage(usage: object) -> Usage | None:
    """Neutral usage: OpenAI counts cache reads and writes inside ``prompt_tokens``; they
    are taken out (`usage_of`)."""
    return usage_of(usage) if isinstance(usage, Mapping) else None


def message_from_openai_chat_response(
    resp: Mapping[str, Any], *, choice: int = 0
) -> AssistantMessage:
    """The `AssistantMessage` of one choice of a Chat Completions response.

    ``finish_reason``: stop -> stop, tool_calls -> tool_use, length -> length,
    content_filter -> refusal, others verbatim. Usage as in `Usage` (cache reads and
    writes taken out of ``prompt_tokens``). Response metadata stays in
    ``extra["openai_chat"]["response"]``.
    """
    choices = resp.get("choices")
    if not isinstance(choices, list) or not 0 <= choice < len(choices):
        raise UnsupportedMessageError(None, f"Chat Completions response without choice {choice}")
    ch = choices[choice]
    msg = ch.get("message") if isinstance(ch, Mapping) else None
    if not isinstance(msg, Mapping):
        raise UnsupportedMessageError(None, "Chat Completions choice without a message")
    m = _assistant(0, msg, response=True)
    reason = ch.get("finish_reason")
    model = resp.get("model")
    meta = {**rest(resp, "choices", "model"), "choice": rest(ch, "message")}
    meta["message"] = m.extra[KEY]["response"]
    return AssistantMessage(
        m.content,
        _STOP_REASONS.get(reason, reason) if isinstance(reason, str) else None,
        chat_usage(resp.get("usage")),
        model if isinstance(model, str) else None,
        freeze({KEY: {"response": meta}}),
    )


def assemble_openai_chat_stream(chunks: Iterable[Mapping[str, Any]]) -> JSON:
    """The ``chat.completion`` dict a stream amounts to, from its parsed chunk dicts.

    Text, refusal and reasoning pieces are joined; tool calls are assembled by ``index``;
    the usage chunk (``stream_options.include_usage``) becomes ``usage``.
    """
    resp: JSON = {"object": "chat.completion"}
    choices: dict[int, JSON] = {}
    calls: dict[int, dict[int, JSON]] = {}
    with malformed("Chat Completions stream"):
        for chunk in chunks:
            for key in ("id", "created", "model", "system_fingerprint", "service_tier"):
                if chunk.get(key) is not None:
                    resp[key] = chunk[key]
            if chunk.get("usage") is not None:
                resp["usage"] = chunk["usage"]
            for ch in chunk.get("choices") or ():
                i = ch.get("index", 0)
                state = choices.setdefault(
                    i, {"index": i, "message": {"role": "assistant", "content": None}}
                )
                msg = state["message"]
                for key, value in (ch.get("delta") or {}).items():
                    if key == "tool_calls":
                        for tc in value or ():
                            _merge_call(calls.setdefault(i, {}), tc)
                    elif isinstance(value, str) and key != "role":
                        msg[key] = (msg.get(key) or "") + value
                    elif value is not None:
                        msg[key] = value
                if ch.get("finish_reason") is not None or "finish_reason" not in state:
                    state["finish_reason"] = ch.get("finish_reason")
                if ch.get("logprobs") is not None:
                    state["logprobs"] = ch["logprobs"]
        for i, state in choices.items():
            if calls.get(i):
                made = [_finished_call(calls[i][k]) for k in sorted(calls[i])]
                state["message"]["tool_calls"] = made
        resp["choices"] = [choices[i] for i in sorted(choices)]  # a null index: malformed
    return resp


def _merge_call(calls: dict[int, JSON], delta: Mapping[str, Any]) -> None:
    """Add a tool call's delta: the pieces of its ``function`` (or ``custom``, or any other
    kind's) object are joined, its other fields taken as they come."""
    call = calls.setdefault(delta.get("index", len(calls)), {"id": None, "type": "function"})
    for key, value in delta.items():
        if isinstance(value, Mapping):
            part = call.setdefault(key, {})
            for name, piece in value.items():
                if isinstance(piece, str):
                    part[name] = part.get(name, "") + piece
                elif piece is not None:
                    part[name] = piece
        elif value is not None and key != "index":
            call[key] = value


def _finished_call(call: JSON) -> JSON:
    """A call as a response holds it: a function call's name and arguments, a custom one's
    name and input, present even when the stream sent none."""
    fields = {"function": ("name", "arguments"), "custom": ("name", "input")}.get(call["type"])
    if fields is not None:
        part = call.setdefault(call["type"], {})
        for name in fields:
            part.setdefault(name, "")
    return call
