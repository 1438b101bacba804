"""Anthropic Messages API params and responses <-> neutral messages, lossless both ways.

```python
from agentctx.adapters.anthropic import (
    from_anthropic, message_from_anthropic_response, to_anthropic,
)

history = from_anthropic(params["messages"])          # request params -> neutral
view = await ctx.prepare(history)
resp = client.messages.create(model=..., system=system, messages=to_anthropic(view))
history.append(message_from_anthropic_response(resp.to_dict()))
```

The system prompt stays in the request's own ``system`` parameter: it is fixed overhead,
never part of the history agentctx compacts.

Mapping: ``text`` / ``image`` / ``thinking`` / ``redacted_thinking`` / ``tool_use`` become
their neutral blocks (a ``tool_use`` whose id or name is not a string or input not an object,
which the API refuses, is refused with `UnsupportedMessageError`); every ``tool_result``
becomes a `ToolResultMessage` (a user message holding a parallel batch becomes several, and
goes back as one); any other block (document, server tools and their results, compaction,
...) rides as ``OpaqueBlock("anthropic", block)``.
Block fields agentctx does not model (``cache_control``, ``citations``, ``caller``, ...) ride
flat in the block's ``extra``. A block that would not render back byte for byte is kept
opaque instead, so ``to_anthropic(from_anthropic(p)) == p`` holds for every request the API
takes. What it refuses is repaired: a ``tool_result`` whose content is a list of one blank
(empty or whitespace) text block, a block the API refuses, goes back as that text as a
string, which it takes; one with ``is_error`` and no content but blank text (a tool that
failed without output), which it refuses however written, goes back saying
`agentctx.boundaries.FAILED_WITHOUT_OUTPUT`, as `repair` makes it in a view; a user message
with ``tool_result`` blocks after other blocks (text a hook put first), which it refuses,
goes back with its results first, the other blocks after them in their order.

Message-level details ride in ``extra["anthropic"]``, a dict that may hold:
``content`` ("string" / "list" / "absent": the content form, when not the default one),
``join`` (whether this message shares the previous one's API user message, when the default
rule - a tool result after a tool result joins, anything else starts a new message - is
wrong), ``is_error`` (an explicit non-true ``is_error`` value of a tool_result),
``fields`` (unknown keys of the API message, on its first neutral message), ``block``
(unknown keys of a tool_result block: ``cache_control``, ...), both sent back verbatim, and
``response`` (the response's metadata: id, raw stop_reason and usage, ...; never sent).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, TypeAlias

from agentctx._usage import usage_of
from agentctx.adapters._streams import grow_to, malformed
from agentctx.boundaries import FAILED_WITHOUT_OUTPUT
from agentctx.errors import UnsupportedMessageError
from agentctx.messages import (
    AssistantContent,
    AssistantMessage,
    ImageBlock,
    Message,
    OpaqueBlock,
    RedactedThinkingBlock,
    SummaryMessage,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    UserContent,
    UserMessage,
    json_problem,
)

__all__ = [
    "KEY",
    "PROVIDER",
    "assemble_anthropic_stream",
    "from_anthropic",
    "message_from_anthropic_response",
    "to_anthropic",
]

PROVIDER = "anthropic"
"""The ``provider`` of the `OpaqueBlock` this adapter makes and accepts."""
KEY = "anthropic"
"""The message ``extra`` key holding this adapter's message-level details."""

JSON: TypeAlias = dict[str, Any]
_EMPTY: Mapping[str, Any] = MappingProxyType({})
# Neutral stop reasons; others (stop_sequence, refusal, pause_turn, ...) are kept verbatim.
_STOP_REASONS = {
    "end_turn": "stop",
    "tool_use": "tool_use",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
}
_UserSide: TypeAlias = UserMessage | ToolResultMessage | SummaryMessage


def _freeze(d: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(d)) if d else _EMPTY


def _rest(d: Mapping[str, Any], *known: str) -> JSON:
    return {k: v for k, v in d.items() if k not in known}


def _info(m: Message) -> Mapping[str, Any]:
    info = m.extra.get(KEY)
    return info if isinstance(info, Mapping) else _EMPTY


def _plain_text(blocks: tuple[object, ...]) -> bool:
    return len(blocks) == 1 and isinstance(blocks[0], TextBlock) and not blocks[0].extra


# ---------------------------------------------------------------------------------------
# Blocks


def _render_block(block: object, index: int | None) -> JSON:
    """One neutral block as an Anthropic content block (modeled fields win over extras)."""
    match block:
        case TextBlock(text, extra):
            return {**extra, "type": "text", "text": text}
        case ImageBlock(media_type, data, source, extra):
            if source == "url":
                src: JSON = {"type": "url", "url": data}
            else:
                src = {"type": source, "media_type": media_type, "data": data}
            return {**extra, "type": "image", "source": src}
        case ThinkingBlock(thinking, signature, extra):
            d = {**extra, "type": "thinking", "thinking": thinking}
            if signature is not None:
                d["signature"] = signature
            return d
        case RedactedThinkingBlock(data, extra):
            return {**extra, "type": "redacted_thinking", "data": data}
        case ToolCall(id_, name, arguments, extra):
            # What JSON cannot hold (bytes, NaN) the SDK fails to send: refused here, typed.
            if problem := json_problem(arguments, "tool call arguments", finite=True):
                raise UnsupportedMessageError(index, problem)
            return {**extra, "type": "tool_use", "id": id_, "name": name, "input": dict(arguments)}
        case OpaqueBlock(provider, payload) if provider == PROVIDER:
            return dict(payload)
        case OpaqueBlock(provider, _):
            raise UnsupportedMessageError(index, f"{provider} opaque block in an Anthropic request")
    raise UnsupportedMessageError(index, f"{type(block).__name__} in an Anthropic message")


def _parse_block(
    b: Mapping[str, Any], index: int | None = None
) -> TextBlock | ImageBlock | AssistantContent:
    """The neutral block for an Anthropic block; opaque unless it renders back exactly."""
    kind = b.get("type")
    block: TextBlock | ImageBlock | AssistantContent | None = None
    if kind == "text" and isinstance(b.get("text"), str):
        block = TextBlock(b["text"], _freeze(_rest(b, "type", "text")))
    elif kind == "image" and isinstance(src := b.get("source"), Mapping):
        extra = _freeze(_rest(b, "type", "source"))
        if src.get("type") == "url" and isinstance(src.get("url"), str):
            block = ImageBlock("", src["url"], "url", extra)
        elif isinstance(src.get("media_type"), str) and isinstance(src.get("data"), str):
            block = ImageBlock(src["media_type"], src["data"], str(src.get("type")), extra)
    elif kind == "thinking" and isinstance(b.get("thinking"), str):
        sig = b.get("signature")
        known = ("type", "thinking", "signature") if isinstance(sig, str) else ("type", "thinking")
        block = ThinkingBlock(
            b["thinking"], sig if isinstance(sig, str) else None, _freeze(_rest(b, *known))
        )
    elif kind == "redacted_thinking" and isinstance(b.get("data"), str):
        block = RedactedThinkingBlock(b["data"], _freeze(_rest(b, "type", "data")))
    elif kind == "tool_use" and _all_of(b, id=str, name=str, input=Mapping):
        extra = _freeze(_rest(b, "type", "id", "name", "input"))
        block = ToolCall(b["id"], b["name"], b["input"], extra)
    if block is not None and _render_block(block, index) == b:
        return block
    return OpaqueBlock(PROVIDER, b)


def _all_of(b: Mapping[str, Any], **kinds: type) -> bool:
    return all(isinstance(b.get(key), kind) for key, kind in kinds.items())


def _user_block(b: Mapping[str, Any]) -> UserContent:
    block = _parse_block(b)
    return (
        block
        if isinstance(block, TextBlock | ImageBlock | OpaqueBlock)
        else OpaqueBlock(PROVIDER, b)
    )


def _assistant_block(b: Mapping[str, Any], index: int | None) -> AssistantContent:
    block = _parse_block(b, index)
    if isinstance(block, OpaqueBlock) and b.get("type") == "tool_use":
        # Opaque, its result would answer no call (and be dropped as an orphan): the API
        # refuses the block anyway ("tool_use.input: Input should be a valid dictionary").
        raise UnsupportedMessageError(
            index, "tool_use block whose id or name is not a string, or input not an object"
        )
    return block if not isinstance(block, ImageBlock) else OpaqueBlock(PROVIDER, b)


def _blocks(index: int, content: object) -> list[Mapping[str, Any]]:
    if not isinstance(content, list):
        raise UnsupportedMessageError(index, f"content of type {type(content).__name__}")
    for b in content:
        if not isinstance(b, Mapping):
            raise UnsupportedMessageError(index, f"content block of type {type(b).__name__}")
    return content


# ---------------------------------------------------------------------------------------
# Requests


def _default_form(blocks: tuple[object, ...], *, result: bool = False) -> str:
    if result and not blocks:
        return "absent"
    return "string" if _plain_text(blocks) else "list"


def _form_ok(form: object, blocks: tuple[object, ...]) -> bool:
    return (
        form == "list"
        or (form == "string" and _plain_text(blocks))
        or (form == "absent" and not blocks)
    )


def from_anthropic(
    messages: Iterable[Mapping[str, Any]],
    *,
    start: int = 0,
    names: dict[str, str] | None = None,
    previous: Message | None = None,
) -> list[Message]:
    """Neutral messages for the ``messages`` of an Anthropic Messages request.

    Raises `UnsupportedMessageError` (with the message index) for a role other than user or
    assistant, or content that is neither a string nor a list of objects.

    A history converted in parts (the messages a request added to the last one's) converts
    as it does whole when each part gets its ``start`` index in the whole, the tool names of
    the calls before it (``names``, call id to name: updated with the part's own) and the
    neutral message before it (``previous``).
    """
    out: list[Message] = []
    names = {} if names is None else names  # tool_use id -> name, so results know their tool
    for index, msg in enumerate(messages, start):
        if not isinstance(msg, Mapping):
            raise UnsupportedMessageError(index, f"message of type {type(msg).__name__}")
        role, content = msg.get("role"), msg.get("content")
        fields = _rest(msg, "role", "content")
        if role == "assistant":
            info: JSON = {"fields": fields} if fields else {}
            if isinstance(content, str):
                blocks: tuple[AssistantContent, ...] = (TextBlock(content),)
                info["content"] = "string"
            else:
                blocks = tuple(_assistant_block(b, index) for b in _blocks(index, content))
            for b in blocks:
                if isinstance(b, ToolCall):
                    names[b.id] = b.name
            out.append(AssistantMessage(blocks, extra=_freeze({KEY: info} if info else {})))
        elif role == "user":
            pieces = _user_pieces(index, content, names)
            for n, (piece, piece_info) in enumerate(pieces):
                default_join = isinstance(piece, ToolResultMessage) and isinstance(
                    out[-1] if out else previous, ToolResultMessage
                )
                if (n > 0) != default_join:
                    piece_info["join"] = n > 0
                if n == 0 and fields:
                    piece_info["fields"] = fields
                if piece_info:
                    piece = _with_info(piece, piece_info)
                out.append(piece)
        else:
            raise UnsupportedMessageError(index, f"role {role!r}")
    return out


def _with_info(m: UserMessage | ToolResultMessage, info: JSON) -> UserMessage | ToolResultMessage:
    extra = _freeze({**m.extra, KEY: info})
    if isinstance(m, UserMessage):
        return UserMessage(m.content, extra)
    return ToolResultMessage(m.tool_call_id, m.content, m.tool_name, m.is_error, extra)


def _user_pieces(
    index: int, content: object, names: Mapping[str, str]
) -> list[tuple[UserMessage | ToolResultMessage, JSON]]:
    """A user message as neutral messages: each tool_result alone, other runs as one."""
    if isinstance(content, str):
        return [(UserMessage((TextBlock(content),)), {})]
    raw = _blocks(index, content)
    results = [b for b in raw if _is_result(b)]
    if results and not all(_is_result(b) for b in raw[: len(results)]):
        # The API takes a call's results only first in the message after it ("tool_use ids
        # were found without tool_result blocks immediately after"): read as written, the
        # results would follow a user message and be left out as answering no call.
        raw = [*results, *(b for b in raw if not _is_result(b))]
    pieces: list[tuple[UserMessage | ToolResultMessage, JSON]] = []
    run: list[UserContent] = []

    def flush() -> None:
        if run:
            pieces.append((UserMessage(tuple(run)), {}))
            run.clear()

    for b in raw:
        if _is_result(b):
            flush()
            pieces.append(_tool_result(index, b, names))
        else:
            run.append(_user_block(b))
    flush()
    if not pieces:  # content == []
        return [(UserMessage(()), {})]
    first, info = pieces[0]
    if len(pieces) == 1 and isinstance(first, UserMessage) and _plain_text(first.content):
        info["content"] = "list"  # a lone plain text block the default would send as a string
    return pieces


def _is_result(b: Mapping[str, Any]) -> bool:
    return b.get("type") == "tool_result" and isinstance(b.get("tool_use_id"), str)


def _tool_result(
    index: int, b: Mapping[str, Any], names: Mapping[str, str]
) -> tuple[ToolResultMessage, JSON]:
    call_id: str = b["tool_use_id"]
    content = b.get("content")
    info: JSON = {}
    blocks: tuple[UserContent, ...]
    if content is None:  # absent, or an explicit null that rides in "block"
        blocks, form = (), "absent"
    elif isinstance(content, str):
        blocks, form = (TextBlock(content),), "string"
    else:
        blocks, form = tuple(_user_block(x) for x in _blocks(index, content)), "list"
    if form != _default_form(blocks, result=True):
        info["content"] = form
    is_error = b.get("is_error")
    if "is_error" in b and is_error is not True:
        info["is_error"] = is_error
    known = ("type", "tool_use_id", "is_error") + (("content",) if content is not None else ())
    fields = _rest(b, *known)
    if fields:
        info["block"] = fields
    return ToolResultMessage(call_id, blocks, names.get(call_id), is_error is True), info


def to_anthropic(messages: Iterable[Message]) -> list[JSON]:
    """Anthropic request ``messages`` for neutral messages (the inverse of `from_anthropic`).

    Consecutive tool results go into one user message (a parallel batch); a
    `SummaryMessage` is sent as a user message holding its text; assistant messages at the
    end whose last block is thinking (a response cut off during it, which the API refuses)
    are left out. Raises
    `UnsupportedMessageError` for an opaque block of another provider.
    """
    out: list[JSON] = []
    group: list[tuple[int, _UserSide]] = []
    previous: Message | None = None
    for index, m in enumerate(messages):
        if isinstance(m, AssistantMessage):
            if group:
                out.append(_render_user(group))
                group = []
            out.append(_render_assistant(index, m))
        elif isinstance(m, UserMessage | ToolResultMessage | SummaryMessage):
            join = _info(m).get("join")
            if not isinstance(join, bool):
                join = isinstance(m, ToolResultMessage) and isinstance(previous, ToolResultMessage)
            if group and not join:
                out.append(_render_user(group))
                group = []
            group.append((index, m))
        else:
            raise UnsupportedMessageError(index, f"item of type {type(m).__name__}")
        previous = m
    if group:
        out.append(_render_user(group))
    elif out and _ends_in_thinking(out[-1]["content"]):
        # A response cut off during its thinking: the API refuses a final block that is
        # thinking (and, thinking off, any in the final assistant message). The assistant
        # messages at the end, one turn to the API, are left out whole (what is left must not
        # end the request in their place), and the request asks for the answer again, as the
        # Responses adapter leaves out a trailing reasoning item.
        while out and out[-1]["role"] == "assistant":
            out.pop()
    return out


def _ends_in_thinking(content: object) -> bool:
    return (
        isinstance(content, list)
        and bool(content)
        and content[-1].get("type") in ("thinking", "redacted_thinking")
    )


def _render_assistant(index: int, m: AssistantMessage) -> JSON:
    info = _info(m)
    content: object
    if info.get("content") == "string" and _plain_text(m.content):
        content = m.content[0].text  # type: ignore[union-attr]
    else:
        content = [_render_block(b, index) for b in m.content]
    return {**info.get("fields", _EMPTY), "role": "assistant", "content": content}


def _render_user(group: list[tuple[int, _UserSide]]) -> JSON:
    index, first = group[0]
    info = _info(first)
    content: list[JSON] = []
    for i, m in group:
        if isinstance(m, ToolResultMessage):
            content.append(_render_result(i, m))
        elif isinstance(m, SummaryMessage):
            content.append({"type": "text", "text": m.text})
        else:
            content.extend(_render_block(b, i) for b in m.content)
    body: object = content
    if len(group) == 1 and not isinstance(first, ToolResultMessage):
        blocks = first.content if isinstance(first, UserMessage) else (TextBlock(first.text),)
        form = info.get("content")
        if not _form_ok(form, blocks) or form == "absent":
            form = _default_form(blocks)
        if form == "string":
            body = content[0]["text"]
    return {**info.get("fields", _EMPTY), "role": "user", "content": body}


def _render_result(index: int, m: ToolResultMessage) -> JSON:
    info = _info(m)
    d: JSON = {**info.get("block", _EMPTY), "type": "tool_result", "tool_use_id": m.tool_call_id}
    form = info.get("content")
    if not _form_ok(form, m.content):
        form = _default_form(m.content, result=True)
    if form == "list" and _plain_text(m.content) and not m.content[0].text.strip():  # type: ignore[union-attr]
        # A tool's blank output: as a list entry Anthropic rejects it, as a string it is taken.
        form = "string"
    if form == "string":
        d["content"] = m.content[0].text  # type: ignore[union-attr]
    elif form == "list":
        d["content"] = [_render_block(b, index) for b in m.content]
    if m.is_error and all(isinstance(b, TextBlock) and not b.text.strip() for b in m.content):
        # A failed tool's blank output: Anthropic takes no empty content with is_error.
        d["content"] = FAILED_WITHOUT_OUTPUT
    if m.is_error:
        d["is_error"] = True
    elif "is_error" in info:
        d["is_error"] = info["is_error"]
    return d


# ---------------------------------------------------------------------------------------
# Responses and streams


def message_from_anthropic_response(resp: Mapping[str, Any]) -> AssistantMessage:
    """The `AssistantMessage` of a Messages API response (``resp.to_dict()`` or the JSON).

    ``stop_reason``: end_turn -> stop, tool_use -> tool_use, max_tokens and
    model_context_window_exceeded -> length; others (refusal, pause_turn, stop_sequence,
    ...) verbatim. ``usage.input_tokens`` is the uncached input, as Anthropic reports it.
    The response's metadata stays in ``extra["anthropic"]["response"]``.
    """
    content = resp.get("content")
    if not isinstance(content, list):
        raise UnsupportedMessageError(None, "Anthropic response without a content list")
    blocks = tuple(_assistant_block(b, None) for b in _blocks(0, content))
    reason = resp.get("stop_reason")
    usage = resp.get("usage")
    model = resp.get("model")
    return AssistantMessage(
        blocks,
        _STOP_REASONS.get(reason, reason) if isinstance(reason, str) else None,
        usage_of(usage) if isinstance(usage, Mapping) else None,
        model if isinstance(model, str) else None,
        _freeze({KEY: {"response": _rest(resp, "content", "model", "role")}}),
    )


def assemble_anthropic_stream(events: Iterable[Mapping[str, Any]]) -> JSON:
    """The response dict a Messages API stream amounts to, from its parsed SSE event dicts.

    Feed it to `message_from_anthropic_response`. Tool input arrives as JSON fragments and is
    parsed when its block stops (kept as ``{}`` if the stream broke off mid-object). Raises
    `UnsupportedMessageError` for an ``error`` event, an event before ``message_start``, a
    block index more than 16 past the blocks seen, or a malformed event.
    """
    message: JSON | None = None
    partial: dict[int, str] = {}
    with malformed("Anthropic stream"):
        for event in events:
            kind = event.get("type")
            if kind in ("ping", "message_stop"):
                continue
            if kind == "error":
                raise UnsupportedMessageError(None, f"stream error event {event.get('error')!r}")
            if kind == "message_start":
                start = event["message"]
                message = {**start, "content": list(start.get("content") or [])}
                continue
            if message is None:
                raise UnsupportedMessageError(None, f"stream event {kind!r} before message_start")
            blocks: list[JSON] = message["content"]
            if kind == "content_block_start":
                index = event.get("index", len(blocks))
                grow_to(blocks, index, "block")
                blocks[index] = dict(event["content_block"])
            elif kind == "content_block_delta":
                _apply_delta(blocks[event["index"]], event["delta"], partial, event["index"])
            elif kind == "content_block_stop":
                text = partial.pop(event["index"], "")
                if text:
                    # Cut off mid-object, or nested past what Python parses: keep the input
                    # content_block_start gave.
                    with contextlib.suppress(ValueError, RecursionError):
                        blocks[event["index"]]["input"] = json.loads(text)
            elif kind == "message_delta":
                for key, value in (event.get("delta") or {}).items():
                    message[key] = value
                usage = {**(message.get("usage") or {})}
                usage.update({k: v for k, v in (event.get("usage") or {}).items() if v is not None})
                message["usage"] = usage
                message.update(_rest(event, "type", "delta", "usage"))
    if message is None:
        raise UnsupportedMessageError(None, "stream without message_start")
    return message


def _apply_delta(block: JSON, delta: Mapping[str, Any], partial: dict[int, str], i: int) -> None:
    kind = delta.get("type")
    if kind == "text_delta":
        block["text"] = block.get("text", "") + delta["text"]
    elif kind == "input_json_delta":
        partial[i] = partial.get(i, "") + delta["partial_json"]
    elif kind == "thinking_delta":
        block["thinking"] = block.get("thinking", "") + delta["thinking"]
    elif kind == "signature_delta":
        block["signature"] = delta["signature"]
    elif kind == "citations_delta":
        block["citations"] = [*(block.get("citations") or []), delta["citation"]]
    elif kind == "compaction_delta":
        if delta.get("content") is not None:
            block["content"] = (block.get("content") or "") + delta["content"]
        if delta.get("encrypted_content") is not None:
            block["encrypted_content"] = delta["encrypted_content"]
