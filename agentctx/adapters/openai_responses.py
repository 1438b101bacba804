"""OpenAI Responses API input items and responses <-> neutral messages, lossless both ways.

```python
from agentctx.adapters.openai_responses import (
    from_openai_responses, message_from_openai_response, to_openai_responses,
)

history = from_openai_responses(params["input"])
view = await ctx.prepare(history)
resp = client.responses.create(model=..., instructions=..., input=to_openai_responses(view))
history.append(message_from_openai_response(resp.to_dict()))
```

Keep the system prompt in ``instructions``, or split leading system / developer items off
with `split_openai_responses_system` (a system item left in the history becomes a
`UserMessage` marked with its role).

Mapping: each user / system / developer message item is a `UserMessage`
(``input_text`` / ``input_image`` parts as `TextBlock` / `ImageBlock`, other parts opaque);
each ``function_call_output`` and ``custom_tool_call_output`` is a `ToolResultMessage` (one
made elsewhere, a repair's stub, goes back as the output its call's kind takes);
every run of other items is one `AssistantMessage`: assistant message items give `TextBlock`
(a refusal part has ``extra["refusal"] = True``), ``function_call`` gives `ToolCall` whose id
is the ``call_id`` (the item's own ``id`` rides in ``extra["id"]``), ``custom_tool_call`` a
`ToolCall` whose arguments are ``{"input": text}``, ``reasoning`` gives a
`ThinkingBlock` (summary text, ``encrypted_content`` as signature) or, without summary, a
`RedactedThinkingBlock`, and anything else (compaction, web search, unknown items) rides as
``OpaqueBlock("openai_responses", item)``. Items that would not render back exactly are
kept opaque, so ``to_openai_responses(from_openai_responses(p)) == p`` holds for every input
whose outputs follow their calls and whose reasoning items are each followed by an item the
model made.
Built-in tools' items (``computer_call``, ``shell_call``, ... and their outputs) are opaque
too: a call and its output with nothing between them (and the items before them in the run)
are one message, a step of its turn (`agentctx.messages.TOOL_STEP`) that compaction may drop
as it drops other steps; its reasoning is sent back, so while its loop runs a step that
carries reasoning is kept whole. An output placed after function call outputs (a batch mixing
both kinds) is a message of its own, which compaction may keep or drop apart from the call's:
`to_openai_responses` leaves out such an output whose call is not in the input, and the call
of a built-in tool the client runs (``computer_call``, ``local_shell_call``, ``shell_call``,
``apply_patch_call``) whose output is not, which the API refuses, and reasoning with no item
the model made after it (a caller took back the call it led to), which it refuses too. An
output whose call an ``item_reference`` stands for (a call stored server-side) is refused with
`UnsupportedMessageError`: which call it answers is not known here. (A request that continues
server-side state, ``previous_response_id``, holds outputs of calls made before it: the
wrapped clients send it as it is, unconverted.)

Block ``extra`` holds the unmodeled fields of the part or item, flat; the first text block of
a message item that is not the plain ``{"role": "assistant", "content": text}`` form carries
``extra["item"]`` (the item with its content emptied) and the next parts of that item carry
``extra["item"] = "continue"``. Message-level details ride in ``extra["openai_responses"]``:
``role``, ``content`` (content / output form when not the default), ``fields`` (unknown item
keys, sent back) and ``response`` (response metadata, never sent).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeAlias

from agentctx._usage import usage_of
from agentctx.adapters._streams import grow_to, malformed
from agentctx.adapters.openai_chat import (
    form_ok,
    freeze,
    image_from_url,
    image_url,
    info_of,
    parse_arguments,
    plain_text,
    render_arguments,
    rest,
    with_info,
)
from agentctx.errors import UnsupportedMessageError
from agentctx.messages import (
    THINKING_DROPPED,
    TOOL_STEP,
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
)

__all__ = [
    "KEY",
    "PROVIDER",
    "assemble_openai_responses_stream",
    "from_openai_responses",
    "message_from_openai_response",
    "split_openai_responses_system",
    "to_openai_responses",
]

PROVIDER = "openai_responses"
"""The ``provider`` of the `OpaqueBlock` this adapter makes and accepts."""
KEY = "openai_responses"
"""The message ``extra`` key holding this adapter's message-level details."""

JSON: TypeAlias = dict[str, Any]
_ABSENT = object()
_STEP = freeze({TOOL_STEP: True})
_EMPTY_EXTRA = freeze({})
_INSTRUCTIONS = ("system", "developer")
_CUSTOM_CALL = "custom_tool_call"
_OUTPUTS = ("function_call_output", "custom_tool_call_output")  # items that answer a call
# Built-in tools the client runs: the API refuses an input holding one's call without its
# output ("No tool output found for computer call ...").
_ANSWERED_BUILT_INS = frozenset(
    {"computer_call", "local_shell_call", "shell_call", "apply_patch_call"}
)
_INCOMPLETE = {"max_output_tokens": "length", "content_filter": "refusal"}
# What a response says about itself; the settings it echoes from the request are left out.
_RESPONSE_KEYS = (
    "id",
    "object",
    "created_at",
    "completed_at",
    "status",
    "incomplete_details",
    "error",
    "usage",
    "service_tier",
)


def _content(content: object, index: int) -> tuple[Any, str]:
    if content is _ABSENT:
        return None, "absent"
    if content is None:
        return None, "null"
    if isinstance(content, str):
        return content, "string"
    if isinstance(content, list) and all(isinstance(p, Mapping) for p in content):
        return content, "list"
    raise UnsupportedMessageError(index, f"content of type {type(content).__name__}")


# ---------------------------------------------------------------------------------------
# Parts


def _part(p: Mapping[str, Any]) -> UserContent:
    kind = p.get("type")
    block: UserContent | None = None
    if kind == "input_text" and isinstance(p.get("text"), str):
        block = TextBlock(p["text"], freeze(rest(p, "type", "text")))
    elif kind == "input_image" and isinstance(p.get("image_url"), str):
        block = image_from_url(p["image_url"], rest(p, "type", "image_url"))
    if block is not None and _render_part(block, 0) == p:
        return block
    return OpaqueBlock(PROVIDER, p)


def _render_part(block: object, index: int) -> JSON:
    match block:
        case TextBlock(text, extra):
            return {**extra, "type": "input_text", "text": text}
        case ImageBlock(extra=extra):
            return {**extra, "type": "input_image", "image_url": image_url(block)}
        case OpaqueBlock(provider, payload) if provider == PROVIDER:
            return dict(payload)
        case OpaqueBlock(provider, _):
            raise UnsupportedMessageError(index, f"{provider} opaque block in a Responses item")
    raise UnsupportedMessageError(index, f"{type(block).__name__} in a Responses item")


def _parts(content: str | Sequence[Mapping[str, Any]] | None) -> tuple[UserContent, ...]:
    if isinstance(content, str):
        return (TextBlock(content),)
    return tuple(_part(p) for p in content or ())


def _put(d: JSON, key: str, blocks: Sequence[object], form: object, index: int) -> None:
    if not form_ok(form, blocks):
        form = "string" if plain_text(blocks) else "list"
    if form == "string":
        d[key] = blocks[0].text  # type: ignore[attr-defined]
    elif form == "list":
        d[key] = [_render_part(b, index) for b in blocks]
    elif form == "null":
        d[key] = None


# ---------------------------------------------------------------------------------------
# Assistant-side items


def _out_part(p: Mapping[str, Any]) -> TextBlock | None:
    kind = p.get("type")
    if kind == "output_text" and isinstance(p.get("text"), str):
        return TextBlock(p["text"], freeze(rest(p, "type", "text")))
    if kind == "refusal" and isinstance(p.get("refusal"), str):
        return TextBlock(p["refusal"], freeze({**rest(p, "type", "refusal"), "refusal": True}))
    return None


def _render_out_part(b: TextBlock) -> JSON:
    extra = rest(b.extra, "item", "refusal")
    if b.extra.get("refusal") is True:
        return {**extra, "type": "refusal", "refusal": b.text}
    return {**extra, "type": "output_text", "text": b.text}


def _message_item(item: Mapping[str, Any]) -> list[AssistantContent]:
    content = item.get("content")
    if isinstance(content, str):
        texts: list[TextBlock | None] = [TextBlock(content)]
    elif isinstance(content, list) and content and all(isinstance(p, Mapping) for p in content):
        texts = [_out_part(p) for p in content]
    else:
        return [OpaqueBlock(PROVIDER, item)]
    blocks = [b for b in texts if b is not None]
    if len(blocks) < len(texts):
        return [OpaqueBlock(PROVIDER, item)]
    if len(blocks) > 1 or _render_items(blocks, 0) != [item]:
        meta = {**item, "content": "" if isinstance(content, str) else []}
        blocks = [
            TextBlock(b.text, freeze({**b.extra, "item": meta if n == 0 else "continue"}))
            for n, b in enumerate(blocks)
        ]
    if _render_items(blocks, 0) != [item]:
        return [OpaqueBlock(PROVIDER, item)]
    return list(blocks)


def _function_call(item: Mapping[str, Any]) -> ToolCall | OpaqueBlock:
    call_id, name, raw = item.get("call_id"), item.get("name"), item.get("arguments")
    if isinstance(call_id, str) and isinstance(name, str) and isinstance(raw, str):
        arguments, kept = parse_arguments(raw)
        extra = rest(item, "type", "call_id", "name", "arguments")
        if kept is not None:
            extra["arguments"] = kept
        call = ToolCall(call_id, name, arguments, freeze(extra))
        if _render_call(call) == item:
            return call
    return OpaqueBlock(PROVIDER, item)


def _custom_call(item: Mapping[str, Any]) -> ToolCall | OpaqueBlock:
    """A custom tool call (free-form ``input`` text): a `ToolCall` with ``{"input": text}``
    as its arguments, so it pairs with its output as a function call does."""
    call_id, name, text = item.get("call_id"), item.get("name"), item.get("input")
    if isinstance(call_id, str) and isinstance(name, str) and isinstance(text, str):
        extra = {**rest(item, "call_id", "name", "input"), "type": _CUSTOM_CALL}
        call = ToolCall(call_id, name, {"input": text}, freeze(extra))
        if _render_call(call) == item:
            return call
    return OpaqueBlock(PROVIDER, item)


def _render_call(call: ToolCall, index: int | None = None) -> JSON:
    if call.extra.get("type") == _CUSTOM_CALL:
        text = call.arguments.get("input")
        if not isinstance(text, str):  # arguments a caller's own strategy replaced
            text = render_arguments(call.arguments, None, index)
        return {**call.extra, "call_id": call.id, "name": call.name, "input": text}
    return {
        **rest(call.extra, "arguments"),
        "type": "function_call",
        "call_id": call.id,
        "name": call.name,
        "arguments": render_arguments(call.arguments, call.extra.get("arguments"), index),
    }


def _summary(text: str) -> list[JSON]:
    return [{"type": "summary_text", "text": text}] if text else []


def _joined(summary: object) -> str | None:
    if not isinstance(summary, list):
        return None
    texts = [s.get("text") if isinstance(s, Mapping) else None for s in summary]
    if not all(isinstance(t, str) for t in texts):
        return None
    return "\n\n".join(texts)  # type: ignore[arg-type]


def _reasoning(item: Mapping[str, Any]) -> AssistantContent:
    summary, secret = item.get("summary"), item.get("encrypted_content")
    text = _joined(summary)
    if text is None or not (secret is None or isinstance(secret, str)):
        return OpaqueBlock(PROVIDER, item)
    extra = rest(item, "type", *(("encrypted_content",) if isinstance(secret, str) else ()))
    if summary == _summary(text):
        del extra["summary"]
    block: AssistantContent
    if summary or secret is None:
        block = ThinkingBlock(text, secret, freeze(extra))
    else:
        block = RedactedThinkingBlock(secret, freeze(extra))
    return block if _render_reasoning(block) == item else OpaqueBlock(PROVIDER, item)


def _render_reasoning(block: ThinkingBlock | RedactedThinkingBlock) -> JSON:
    if isinstance(block, ThinkingBlock):
        text, secret = block.thinking, block.signature
    else:
        text, secret = "", block.data
    summary = block.extra.get("summary")
    if _joined(summary) != text:  # no summary recorded, or the text was rewritten since
        summary = _summary(text)
    d = {**rest(block.extra, "summary"), "type": "reasoning", "summary": summary}
    if secret is not None:
        d["encrypted_content"] = secret
    return d


def _render_items(blocks: Sequence[AssistantContent], index: int) -> list[JSON]:
    """The input items for the blocks of one `AssistantMessage`."""
    items: list[JSON] = []
    open_item: JSON | None = None  # the message item later parts may continue
    for b in blocks:
        if isinstance(b, TextBlock):
            marker = b.extra.get("item")
            part = _render_out_part(b)
            if marker == "continue" and open_item is not None:
                open_item["content"].append(part)
                continue
            plain = part == {"type": "output_text", "text": b.text}
            if isinstance(marker, Mapping):
                item = dict(marker)
                item["content"] = (
                    b.text if isinstance(marker.get("content"), str) and plain else [part]
                )
            elif plain:
                item = {"role": "assistant", "content": b.text}
            else:
                item = {"type": "message", "role": "assistant", "content": [part]}
            items.append(item)
            open_item = item if isinstance(item["content"], list) else None
            continue
        open_item = None
        if isinstance(b, ToolCall):
            items.append(_render_call(b, index))
        elif isinstance(b, ThinkingBlock | RedactedThinkingBlock):
            items.append(_render_reasoning(b))
        elif b.provider == PROVIDER:
            items.append(dict(b.payload))
        else:
            raise UnsupportedMessageError(index, f"{b.provider} opaque block in a Responses input")
    return items


def _assistant_side(item: Mapping[str, Any]) -> list[AssistantContent]:
    kind = item.get("type")
    if kind in ("message", None) and item.get("role") == "assistant":
        return _message_item(item)
    if kind == "function_call":
        return [_function_call(item)]
    if kind == _CUSTOM_CALL:
        return [_custom_call(item)]
    if kind == "reasoning":
        return [_reasoning(item)]
    return [OpaqueBlock(PROVIDER, item)]


# ---------------------------------------------------------------------------------------
# Requests


def split_openai_responses_system(
    items: Sequence[Mapping[str, Any]],
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """The leading system / developer message items, and the rest (the same dicts)."""
    n = 0
    while (
        n < len(items) and isinstance(items[n], Mapping) and items[n].get("role") in _INSTRUCTIONS
    ):
        n += 1
    return list(items[:n]), list(items[n:])


def from_openai_responses(
    items: str | Iterable[Mapping[str, Any]],
    *,
    start: int = 0,
    names: dict[str, str] | None = None,
) -> list[Message]:
    """Neutral messages for a Responses ``input`` (a list of items, or a plain string).

    Raises `UnsupportedMessageError` (with the item index) for a message item with an
    unknown role, an item with neither type nor role, or content of the wrong type.

    A history converted in parts converts as it does whole when each part gets its ``start``
    index in the whole and what the parts before it gave (``names``, updated with the part's
    own: the calls' tool names by id, the built-in tools' calls, whether an ``item_reference``
    came; `known_calls` makes it from their messages), and no part starts inside a run of
    assistant-side items (`is_assistant_side`): the run is one assistant message.
    """
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    out: list[Message] = []
    run: list[AssistantContent] = []
    names = {} if names is None else names
    for index, item in enumerate(items, start):
        if not isinstance(item, Mapping):
            raise UnsupportedMessageError(index, f"item of type {type(item).__name__}")
        kind, role = item.get("type"), item.get("role")
        if kind in ("message", None) and role is not None and role != "assistant":
            if role != "user" and role not in _INSTRUCTIONS:
                raise UnsupportedMessageError(index, f"role {role!r}")
            _flush(out, run)
            out.append(_user_item(index, item))
        elif kind in _OUTPUTS and isinstance(item.get("call_id"), str):
            if item["call_id"] not in names:
                _refuse_if_referenced(index, item, names)
            _flush(out, run)
            out.append(_output(index, item, names))
        elif isinstance(kind, str) or role == "assistant":
            if isinstance(kind, str) and kind.endswith("_call_output"):
                call = _built_in(kind.removesuffix("_output"), str(answered_call(item)))
                if call not in names:
                    _refuse_if_referenced(index, item, names)
            _note_given(item, names)
            blocks = _assistant_side(item)
            names.update((b.id, b.name) for b in blocks if isinstance(b, ToolCall))
            run.extend(blocks)
            if isinstance(kind, str) and kind.endswith("_call_output"):
                _flush(out, run, step=True)
        else:
            raise UnsupportedMessageError(index, "item with neither type nor role")
    _flush(out, run)
    return out


_REFERENCED = "\0item_reference"  # the key in ``names`` saying a reference came before


def known_calls(messages: Sequence[Message]) -> dict[str, str]:
    """The ``names`` `from_openai_responses` keeps between the parts of a history, for the
    messages it made of the parts so far: the calls' tool names by id, the built-in tools'
    calls by id (their item type as name), and whether an ``item_reference`` came."""
    names: dict[str, str] = {}
    for m in messages:
        if isinstance(m, AssistantMessage):
            for b in m.content:
                if isinstance(b, ToolCall):
                    names[b.id] = b.name
                elif isinstance(b, OpaqueBlock) and b.provider == PROVIDER:
                    _note_given(b.payload, names)
    return names


def _note_given(item: Mapping[str, Any], names: dict[str, str]) -> None:
    kind, call_id = item.get("type"), item.get("call_id")
    if kind == "item_reference":
        names[_REFERENCED] = kind
    elif isinstance(kind, str) and kind.endswith("_call") and isinstance(call_id, str):
        names[_built_in(kind, call_id)] = kind


def answered_call(output: Mapping[str, Any]) -> object:
    """The ``call_id`` of the call a built-in tool's output item answers: its own
    ``call_id``, or, for a ``local_shell_call_output`` (typed with no ``call_id``), its
    ``id``, which the API documents as the call's."""
    call_id = output.get("call_id")
    if call_id is None and output.get("type") == "local_shell_call_output":
        return output.get("id")
    return call_id


def _built_in(kind: str, call_id: str) -> str:
    """The key in ``names`` of a built-in tool's call (apart from the calls' tool names)."""
    return f"\0{kind}\0{call_id}"


def _refuse_if_referenced(index: int, output: Mapping[str, Any], names: dict[str, str]) -> None:
    """Refuse ``output``, whose call is not in the input, when a reference before it may
    stand for that call: which call it answers is not known here, so it could be neither kept
    with its call nor left out honestly."""
    if _REFERENCED in names:
        raise UnsupportedMessageError(
            index,
            f"a {output['type']} whose call may be given by an item_reference: which call it "
            "answers is stored server-side, so compaction cannot keep them together; send the "
            "call item itself, or continue with previous_response_id (sent as it is)",
        )


def is_assistant_side(item: object) -> bool:
    """Whether a Responses input item (a reasoning item, an assistant message, a function
    call, ...) joins the items beside it in one assistant message."""
    if not isinstance(item, Mapping):
        return False
    kind, role = item.get("type"), item.get("role")
    if kind in ("message", None) and role is not None and role != "assistant":
        return False
    if kind in _OUTPUTS and isinstance(item.get("call_id"), str):
        return False
    return isinstance(kind, str) or role == "assistant"


def _flush(out: list[Message], run: list[AssistantContent], *, step: bool = False) -> None:
    """End the run of assistant-side items as one message; ``step``: it ends with a built-in
    tool's output, a step of the turn (`TOOL_STEP`)."""
    if run:
        out.append(AssistantMessage(tuple(run), extra=_STEP if step else _EMPTY_EXTRA))
        run.clear()


def _user_item(index: int, item: Mapping[str, Any]) -> UserMessage:
    content, form = _content(item.get("content", _ABSENT), index)
    blocks = _parts(content)
    info: JSON = {"role": item["role"]} if item["role"] != "user" else {}
    if form != ("string" if plain_text(blocks) else "list"):
        info["content"] = form
    if fields := rest(item, "role", "content"):
        info["fields"] = fields
    marked = freeze({"role": item["role"]} if item["role"] in _INSTRUCTIONS else {})
    return with_info(UserMessage(blocks, marked), KEY, info)  # `is_instruction` reads the role


def _output(index: int, item: Mapping[str, Any], names: Mapping[str, str]) -> ToolResultMessage:
    call_id: str = item["call_id"]
    output, form = _content(item.get("output", _ABSENT), index)
    blocks = _parts(output)
    info: JSON = {} if item["type"] == "function_call_output" else {"type": item["type"]}
    if form != ("string" if plain_text(blocks) else "list"):
        info["content"] = form
    if fields := rest(item, "type", "call_id", "output"):
        info["fields"] = fields
    return with_info(ToolResultMessage(call_id, blocks, names.get(call_id)), KEY, info)


def to_openai_responses(messages: Iterable[Message]) -> list[JSON]:
    """Responses ``input`` items for neutral messages (the inverse of `from_openai_responses`).

    A `SummaryMessage` is sent as a user message; ``is_error`` has no place in the format
    and is dropped. Raises `UnsupportedMessageError` for an opaque block of another provider.
    """
    out: list[JSON] = []
    custom: set[str] = set()  # the ids of the custom tool calls sent so far
    for index, m in enumerate(messages):
        info = info_of(m, KEY)
        d: JSON = dict(info.get("fields", {}))
        if isinstance(m, UserMessage):
            role = info.get("role")
            d["role"] = role if role in _INSTRUCTIONS else "user"
            _put(d, "content", m.content, info.get("content"), index)
        elif isinstance(m, SummaryMessage):
            d.update(role="user", content=m.text)
        elif isinstance(m, ToolResultMessage):
            kind = info.get("type")
            if kind not in _OUTPUTS:  # made here (a repair's stub): it answers as its call asks
                custom_call = m.tool_call_id in custom
                kind = "custom_tool_call_output" if custom_call else "function_call_output"
            d.update(type=kind, call_id=m.tool_call_id)
            _put(d, "output", m.content, info.get("content"), index)
        elif isinstance(m, AssistantMessage):
            custom.update(
                b.id
                for b in m.content
                if isinstance(b, ToolCall) and b.extra.get("type") == _CUSTOM_CALL
            )
            items = _render_items(m.content, index)
            if m.extra.get(THINKING_DROPPED):
                # A stored item's id names the reasoning item it followed, which is not sent:
                # the API rejects it ("provided without its required 'reasoning' item").
                items = [{k: v for k, v in item.items() if k != "id"} for item in items]
            out.extend(items)
            continue
        else:
            raise UnsupportedMessageError(index, f"item of type {type(m).__name__}")
        out.append(d)
    return _sendable(out)


def _sendable(items: list[JSON]) -> list[JSON]:
    """``items`` without what the API refuses there and compaction or the caller can leave:
    a built-in tool's output whose call is not among them, or the call of a built-in tool the
    client runs whose output is not (one placed after function call outputs is a message of
    its own, which compaction may drop or keep apart from the call's), and reasoning with no
    item the model made after it (a caller that took back the call the reasoning led to, or
    compaction the call: "provided without its required following item")."""
    made: set[tuple[str, object]] = set()
    outputs: set[tuple[str, object]] = set()  # built-in calls answered after them
    for item in items:
        if not isinstance(kind := item.get("type"), str):
            continue
        # Only string ids pair a call with its output (an item of another shape rides as
        # it came, and would not hash).
        if kind.endswith("_call_output"):
            cid = answered_call(item)
            if isinstance(cid, str) and (call := (kind.removesuffix("_output"), cid)) in made:
                outputs.add(call)
        elif kind in _ANSWERED_BUILT_INS and isinstance(cid := item.get("call_id"), str):
            made.add((kind, cid))
    calls: set[tuple[str, str]] = set()
    kept: list[JSON] = []
    waiting: list[JSON] = []  # reasoning items, kept once an item the model made follows
    for item in items:
        kind = item.get("type", "message")
        output = isinstance(kind, str) and kind.endswith("_call_output")
        cid = answered_call(item) if output else item.get("call_id")
        if isinstance(kind, str) and isinstance(cid, str) and kind not in _OUTPUTS:
            if not output:
                if kind in _ANSWERED_BUILT_INS and (kind, cid) not in outputs:
                    continue
                calls.add((kind, cid))
            elif (kind.removesuffix("_output"), cid) not in calls:
                continue
        if kind == "reasoning":
            waiting.append(item)
            continue
        if waiting:
            if kind not in _OUTPUTS and (kind != "message" or item.get("role") == "assistant"):
                kept += waiting
            waiting.clear()
        kept.append(item)
    return kept


# ---------------------------------------------------------------------------------------
# Responses and streams


def message_from_openai_response(resp: Mapping[str, Any]) -> AssistantMessage:
    """The `AssistantMessage` of a Responses API response: all its output items, in order.

    Stop reason: ``tool_use`` when it calls a function, ``refusal`` when it refuses, else
    ``stop``; an incomplete response gives ``length`` (max_output_tokens) or ``refusal``
    (content_filter); failed / cancelled / in_progress statuses are kept verbatim. Usage as in
    `Usage` (cache reads and writes taken out of ``input_tokens``).
    """
    output = resp.get("output")
    if not isinstance(output, list):
        raise UnsupportedMessageError(None, "Responses response without an output list")
    blocks: list[AssistantContent] = []
    for item in output:
        if not isinstance(item, Mapping):
            raise UnsupportedMessageError(None, f"output item of type {type(item).__name__}")
        blocks.extend(_assistant_side(item))
    status = resp.get("status")
    details = resp.get("incomplete_details")
    if status == "incomplete":
        why = details.get("reason") if isinstance(details, Mapping) else None
        reason = _INCOMPLETE.get(why, why) if isinstance(why, str) else "incomplete"
    elif status in ("completed", None):
        refused = any(isinstance(b, TextBlock) and b.extra.get("refusal") for b in blocks)
        called = any(isinstance(b, ToolCall) for b in blocks)
        reason = "tool_use" if called else "refusal" if refused else "stop"
    else:
        reason = str(status)
    usage = resp.get("usage")
    model = resp.get("model")
    return AssistantMessage(
        tuple(blocks),
        reason,
        usage_of(usage) if isinstance(usage, Mapping) else None,
        model if isinstance(model, str) else None,
        freeze({KEY: {"response": {k: resp[k] for k in _RESPONSE_KEYS if k in resp}}}),
    )


def assemble_openai_responses_stream(events: Iterable[Mapping[str, Any]]) -> JSON:
    """The response dict one Responses stream amounts to, from its parsed event dicts.

    The response is the last ``response.*`` snapshot (``response.completed`` when the
    stream finished); when that has no output (a stream cut off early), the output items are
    rebuilt from the item, part and delta events. Raises `UnsupportedMessageError` on an
    ``error`` event, a part index more than 16 past the parts seen, or a
    malformed event.
    """
    snapshot: JSON = {}
    items: dict[int, JSON] = {}
    with malformed("Responses stream"):
        for event in events:
            kind = event.get("type")
            if kind == "error":
                raise UnsupportedMessageError(None, f"stream error event {dict(event)!r}")
            if isinstance(event.get("response"), Mapping):
                snapshot = dict(event["response"])
                continue
            if "output_index" not in event:
                continue
            at = event["output_index"]
            if kind in ("response.output_item.added", "response.output_item.done"):
                items[at] = _copy_item(event["item"])
                continue
            item = items.setdefault(at, {})
            if kind in ("response.content_part.added", "response.content_part.done"):
                _slot(item, "content", event["content_index"]).update(event["part"])
            elif kind in (
                "response.reasoning_summary_part.added",
                "response.reasoning_summary_part.done",
            ):
                _slot(item, "summary", event["summary_index"]).update(event["part"])
            elif kind == "response.function_call_arguments.delta":
                item["arguments"] = item.get("arguments", "") + event["delta"]
            elif kind == "response.function_call_arguments.done":
                item["arguments"] = event["arguments"]
            elif kind is not None and "summary_index" in event:
                _text(_slot(item, "summary", event["summary_index"]), "text", kind, event)
            elif kind is not None and "content_index" in event:
                key = "refusal" if kind.startswith("response.refusal") else "text"
                _text(_slot(item, "content", event["content_index"]), key, kind, event)
        # The final snapshot's output is authoritative (the server may re-encrypt reasoning
        # between output_item.done and response.completed); without one, use what streamed.
        if items and not snapshot.get("output"):
            snapshot["output"] = [items[k] for k in sorted(items)]  # (an index of no number)
    return snapshot


def _copy_item(item: Mapping[str, Any]) -> JSON:
    # Parts and summaries get text appended later; never touch the caller's event objects.
    copy = dict(item)
    for key in ("content", "summary"):
        if isinstance(copy.get(key), list):
            copy[key] = [dict(p) if isinstance(p, Mapping) else p for p in copy[key]]
    return copy


def _slot(item: JSON, key: str, at: int) -> JSON:
    found = item.get(key)  # none yet, or null as an item may start
    parts: list[JSON] = found if isinstance(found, list) else []
    item[key] = parts
    grow_to(parts, at, key)
    if not isinstance(parts[at], dict):
        parts[at] = {}
    return parts[at]


def _text(part: JSON, key: str, kind: str, event: Mapping[str, Any]) -> None:
    if kind.endswith(".delta") and isinstance(event.get("delta"), str):
        part[key] = part.get(key, "") + event["delta"]
    elif kind.endswith(".done") and isinstance(event.get(key), str):
        part[key] = event[key]
