"""agentctx for pydantic-ai: a capability that sends compacted views and leaves the history whole.

```python
from pydantic_ai import Agent

from agentctx import Budget, ContextManager
from agentctx.integrations.pydantic_ai import AgentCtxCapability

agent = Agent("anthropic:claude-sonnet-4-5", tools=[read_file])
async with ContextManager(Budget(context_window=200_000)) as ctx:  # one per conversation
    result = await agent.run(task, capabilities=[AgentCtxCapability(ctx)])
    more = await agent.run(follow_up, message_history=result.all_messages(),
                           capabilities=[AgentCtxCapability(ctx)])
```

Before every attempt at a model request (``prepare_model_request``, once the serving model is
known) the capability converts the run's whole history with `from_pydantic_ai` (what is new,
and any message changed in place since the last request, as a history processor may do: each
is compared with a copy taken when it was converted), calls ``ctx.prepare`` on it and sends
`to_pydantic_ai` of the view. Only the request changes: the run's history
(``result.all_messages()``) stays complete, so pass it back in as usual. After each response
its usage goes to ``ctx.observe``; a prompt the provider refuses as longer than its window is
observed too, and the request attempted once more, compacted to fit
(`AgentCtxCapability.on_model_request_error`). Give the agent (or each run) the capability
of that conversation's manager; enter the manager yourself, around the runs, on the event
loop they run on: ``agent.run``, ``agent.iter`` and ``agent.run_stream`` are supported, and so
is ``agent.run_sync`` with a manager that is not entered (deterministic strategies only, as
background summaries need ``async with``).

Conversion: each `ModelResponse` is one `AssistantMessage`, a block per part (`TextPart` a
`TextBlock`, `ThinkingPart` a `ThinkingBlock` with its signature, or a `RedactedThinkingBlock`
when it only has a signature, `ToolCallPart` a `ToolCall`, any other part an `OpaqueBlock`).
Each `ModelRequest` gives a `ToolResultMessage` per `ToolReturnPart` (and per retry that
answers a tool call), then a `UserMessage` per `UserPromptPart` (and per retry feedback).
System prompts, instruction and settings records, and parts agentctx does not know ride along
with their request untouched; a request with none of the parts above is one `UserMessage` of
opaque blocks. Every neutral message names where it came from in ``extra["pydantic_ai"]``,
and `to_pydantic_ai` maps the view back onto the history it was prepared from: a message the
view did not change is the very object of the history; a changed one is a copy with only the
changed parts replaced (a tool return's content, a call's arguments, dropped thinking); a
summary is a `UserPromptPart` in the request it follows. So
``to_pydantic_ai(from_pydantic_ai(h), h) == h``, message for message.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, cast

from agentctx._overflow import overflow_of
from agentctx._snapshots import Converted
from agentctx._usage import usage_inside
from agentctx.errors import MissingExtraError, UnsupportedMessageError
from agentctx.messages import (
    THINKING_DROPPED,
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
    ToolResultContent,
    ToolResultMessage,
    Usage,
    UserContent,
    UserMessage,
    fingerprint,
    text_of,
)
from agentctx.recall.tool import recall_tool as agentctx_recall_tool

try:
    # Imported first, so that a missing framework is named as itself.
    import pydantic_ai  # noqa: F401
    import pydantic_core
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.messages import (
        ERROR_OUTCOMES,
        BinaryContent,
        ImageUrl,
        ModelMessage,
        ModelMessagesTypeAdapter,
        ModelRequest,
        ModelRequestPart,
        ModelResponse,
        ModelResponsePart,
        RetryFeedbackPart,
        RetryPromptPart,
        TextContent,
        TextPart,
        ThinkingPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )
    from pydantic_ai.tools import Tool
    from pydantic_ai.toolsets import FunctionToolset
    from pydantic_core import SchemaValidator, core_schema
except ImportError as exc:
    raise MissingExtraError("pydantic-ai", exc.name, needed_by=__name__) from exc

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from pydantic_ai.messages import UserContent as PydanticUserContent
    from pydantic_ai.models import ModelRequestContext
    from pydantic_ai.tools import RunContext
    from pydantic_ai.usage import RequestUsage

    from agentctx.manager import ContextManager

__all__ = [
    "KEY",
    "PROVIDER",
    "AgentCtxCapability",
    "from_pydantic_ai",
    "recall_tool",
    "to_pydantic_ai",
]

KEY = "pydantic_ai"
"""The ``extra`` key naming where a neutral message or block came from: ``[message, part]``
for a request's part, ``[message]`` for a response or a whole request, a part index on a block."""
PROVIDER = "pydantic_ai"
"""The ``provider`` of the `OpaqueBlock` for a part agentctx does not model."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NO_CONTENT = MappingProxyType({"parts": 0})


# ---------------------------------------------------------------------------------------
# pydantic-ai -> neutral


def _extra(key: object, stamp: datetime | None) -> Mapping[str, Any]:
    extra: dict[str, Any] = {KEY: key}
    if isinstance(stamp, datetime):
        # Epoch milliseconds: what age-based strategies read (`ContextManager`'s ``clock``).
        extra["timestamp"] = int(stamp.timestamp() * 1000)
    return MappingProxyType(extra)


def _dump(part: object, j: int) -> Mapping[str, Any]:
    """A part as JSON, for an opaque block: what it costs, and which part it is."""
    dumped = pydantic_core.to_jsonable_python(part, bytes_mode="base64", fallback=repr)
    return MappingProxyType({KEY: j, "part": dumped})


def _url_media_type(item: ImageUrl) -> str:
    """The image's media type, or "" where pydantic-ai cannot tell it from the URL (a signed
    or CDN URL: its ``media_type`` raises; the model is sent the URL all the same)."""
    try:
        return item.media_type
    except ValueError:
        return ""


def _user_blocks(content: str | Sequence[Any]) -> tuple[UserContent, ...]:
    if isinstance(content, str):
        return (TextBlock(content),)
    blocks: list[UserContent] = []
    for n, item in enumerate(content):
        if isinstance(item, str):
            blocks.append(TextBlock(item))
        elif isinstance(item, TextContent):
            blocks.append(TextBlock(item.content))
        elif isinstance(item, ImageUrl):
            blocks.append(ImageBlock(_url_media_type(item), item.url, "url"))
        elif isinstance(item, BinaryContent) and item.is_image:
            blocks.append(ImageBlock(item.media_type, item.base64))
        else:
            blocks.append(OpaqueBlock(PROVIDER, _dump(item, n)))
    return tuple(blocks)


def _tool_return(i: int, j: int, part: ToolReturnPart) -> ToolResultMessage:
    text = part.model_response_str(wrap_if_error=False)
    blocks: list[ToolResultContent] = [TextBlock(text)] if text else []
    blocks += [b for b in _user_blocks(part.files) if not isinstance(b, TextBlock)]
    is_error = part.outcome in ERROR_OUTCOMES
    return ToolResultMessage(
        part.tool_call_id, tuple(blocks), part.tool_name, is_error, _extra([i, j], part.timestamp)
    )


def _request_part(i: int, j: int, part: ModelRequestPart) -> Message | None:
    """The neutral message of one request part; ``None`` for parts that ride along."""
    if isinstance(part, ToolReturnPart):
        return _tool_return(i, j, part)
    if isinstance(part, RetryPromptPart):
        text = part.model_response()
        extra = _extra([i, j], part.timestamp)
        if part.tool_name is not None:
            return ToolResultMessage(
                part.tool_call_id, (TextBlock(text),), part.tool_name, True, extra
            )
        return UserMessage((TextBlock(text),), extra)
    if isinstance(part, RetryFeedbackPart):
        return UserMessage((TextBlock(part.model_response()),), _extra([i, j], part.timestamp))
    if isinstance(part, UserPromptPart):
        return UserMessage(_user_blocks(part.content), _extra([i, j], part.timestamp))
    return None


def _request(i: int, m: ModelRequest) -> list[Message]:
    results: list[Message] = []
    users: list[Message] = []
    for j, part in enumerate(m.parts):
        n = _request_part(i, j, part)
        if n is not None:
            # Tool results first, as every provider wants them right after their calls.
            (results if isinstance(n, ToolResultMessage) else users).append(n)
    if not results and not users:
        # Nothing conversational (only system prompts or records): one opaque stand-in keeps
        # the request in its place in the view.
        blocks = tuple(OpaqueBlock(PROVIDER, _dump(p, j)) for j, p in enumerate(m.parts))
        users.append(
            UserMessage(blocks or (OpaqueBlock(PROVIDER, _NO_CONTENT),), _extra([i], None))
        )
    return results + users


def _response_block(j: int, part: ModelResponsePart) -> AssistantContent:
    key = MappingProxyType({KEY: j})
    if isinstance(part, TextPart):
        return TextBlock(part.content, key)
    if isinstance(part, ThinkingPart):
        if not part.content and part.signature is not None:
            return RedactedThinkingBlock(part.signature, key)
        return ThinkingBlock(part.content, part.signature, key)
    if isinstance(part, ToolCallPart):
        return ToolCall(part.tool_call_id, part.tool_name, part.args_as_dict(), key)
    return OpaqueBlock(PROVIDER, _dump(part, j))


def _response(i: int, m: ModelResponse) -> AssistantMessage:
    blocks = tuple(_response_block(j, p) for j, p in enumerate(m.parts))
    # Usage and model stay out: pydantic-ai fills them in while the response is recorded, and
    # a neutral message must not change once agentctx has seen it.
    reason = "tool_use" if any(isinstance(b, ToolCall) for b in blocks) else "stop"
    return AssistantMessage(blocks, reason, extra=_extra([i], m.timestamp))


def _convert(i: int, m: ModelMessage) -> list[Message]:
    if isinstance(m, ModelResponse):
        return [_response(i, m)]
    if isinstance(m, ModelRequest):
        return _request(i, m)
    raise UnsupportedMessageError(i, f"pydantic-ai message of type {type(m).__name__}")


def from_pydantic_ai(messages: Sequence[ModelMessage]) -> list[Message]:
    """Neutral messages for a pydantic-ai message history (see the module docstring).

    Raises `UnsupportedMessageError` (with the index) for an item that is no `ModelRequest`
    or `ModelResponse`.
    """
    out: list[Message] = []
    for i, m in enumerate(messages):
        out.extend(_convert(i, m))
    return out


# ---------------------------------------------------------------------------------------
# neutral -> pydantic-ai


def _user_content(
    blocks: Sequence[object], sources: Sequence[object] = ()
) -> str | list[PydanticUserContent]:
    """Neutral content as a prompt's (or a tool return's) content: a str when all plain text.
    ``sources``: the items of the part it was made from, whose texts (a `TextContent` with
    its ``metadata``, a `StructuredContent` with its ``value``) and images (with their
    ``vendor_metadata``) are taken back as they were."""
    items: list[PydanticUserContent] = []
    taken: set[int] = set()  # each source item stands for one block, in order
    for b in blocks:
        if isinstance(b, TextBlock):
            items.append(_text(b, sources, taken))
        elif isinstance(b, ImageBlock):
            items.append(_image(b, sources, taken))
        elif isinstance(b, OpaqueBlock) and b.provider == PROVIDER and "part" in b.payload:
            items.append(_rebuilt(b.payload["part"]))
        else:  # never dropped unsaid: a document or a file is often what the task is about
            raise UnsupportedMessageError(
                None,
                f"a {type(b).__name__} of {getattr(b, 'provider', '?')!r} in a prompt or "
                "tool return sent through pydantic-ai, which has no part for it",
            )
    if all(type(item) is str for item in items):
        return text_of(blocks)  # type: ignore[arg-type]
    return items


def _taken(sources: Sequence[object], taken: set[int], made: Callable[[object], bool]) -> object:
    """The first source item not taken yet that ``made`` says the block was made from."""
    for i, item in enumerate(sources):
        if i not in taken and made(item):
            taken.add(i)
            return item
    return None


def _text(b: TextBlock, sources: Sequence[object], taken: set[int]) -> PydanticUserContent:
    item = _taken(
        sources,
        taken,
        lambda i: (
            i == b.text if type(i) is str else isinstance(i, TextContent) and i.content == b.text
        ),
    )
    return item if isinstance(item, TextContent) else b.text


def _image(b: ImageBlock, sources: Sequence[object], taken: set[int]) -> PydanticUserContent:
    item = _taken(
        sources,
        taken,
        lambda i: (
            (b.source == "url" and isinstance(i, ImageUrl) and i.url == b.data)
            or (isinstance(i, BinaryContent) and i.is_image and i.base64 == b.data)
        ),
    )
    if isinstance(item, ImageUrl | BinaryContent):
        return item
    if b.source == "url":
        return ImageUrl(b.data, media_type=b.media_type or None)
    try:
        data = base64.b64decode(b.data, validate=True)
    except (binascii.Error, ValueError):
        raise UnsupportedMessageError(None, "image block with bad base64 data") from None
    return BinaryContent(data, media_type=b.media_type)


def _rebuilt(dumped: object) -> PydanticUserContent:
    """A prompt item (a document, audio, video, a file URL) from its `_dump`: read back as
    pydantic-ai reads a stored history, bytes from base64."""
    stored = [{"kind": "request", "parts": [{"part_kind": "user-prompt", "content": [dumped]}]}]
    try:
        (request,) = ModelMessagesTypeAdapter.validate_json(json.dumps(stored))
        part = request.parts[0]
        if isinstance(part, UserPromptPart) and not isinstance(part.content, str):
            return part.content[0]
        problem = f"read back as {type(part).__name__}"
    except (ValueError, TypeError, IndexError) as e:  # pydantic's ValidationError: ValueError
        problem = str(e)
    raise UnsupportedMessageError(None, f"a pydantic-ai prompt item that cannot be read: {problem}")


def _key(extra: Mapping[str, Any]) -> tuple[int, ...] | None:
    key = extra.get(KEY)
    if isinstance(key, list | tuple) and all(type(k) is int for k in key):
        return tuple(key)
    return None


class _History:
    """One history, its neutral messages, and where each came from."""

    def __init__(self, messages: Sequence[ModelMessage], neutral: Sequence[Message]) -> None:
        self.messages = messages
        self.neutral = neutral
        self.at: dict[tuple[int, ...], Message] = {}
        self.own: dict[int, set[int]] = {}  # request index -> parts with a neutral message
        for m in neutral:
            key = _key(m.extra)
            if key is not None:
                self.at[key] = m
                if len(key) == 2:
                    self.own.setdefault(key[0], set()).add(key[1])

    def original(self, m: Message, kind: type) -> tuple[tuple[int, ...], Any] | None:
        """(key, message of the history) for a view message made from this history."""
        key = _key(m.extra)
        if key is None or key not in self.at or not 0 <= key[0] < len(self.messages):
            return None
        source = self.messages[key[0]]
        return (key, source) if isinstance(source, kind) else None

    def unchanged(self, m: Message, key: tuple[int, ...]) -> bool:
        o = self.at[key]
        return m is o or fingerprint(m) == fingerprint(o)


def _stamp(out: Sequence[ModelMessage], messages: Sequence[ModelMessage]) -> datetime:
    """A deterministic timestamp for a message agentctx made: the one before it, if any."""
    for m in reversed(out):
        if m.timestamp is not None:
            return m.timestamp
    for m in messages:
        if m.timestamp is not None:
            return m.timestamp
    return _EPOCH


def _changed_part(m: Message, was: Message, part: ModelRequestPart) -> ModelRequestPart:
    """``part`` as the view changed it: its content, or only the call id `repair` renamed."""
    if isinstance(m, ToolResultMessage) and isinstance(was, ToolResultMessage):
        if m.content == was.content and type(part) is ToolReturnPart:
            # mypy does not narrow a generic class by ``type() is``; it is the plain class.
            return dataclasses.replace(
                cast("ToolReturnPart[Any]", part), tool_call_id=m.tool_call_id
            )
        content = _user_content(m.content, part.files if isinstance(part, ToolReturnPart) else ())
        if type(part) is ToolReturnPart:
            plain = cast("ToolReturnPart[Any]", part)
            return dataclasses.replace(plain, content=content, tool_call_id=m.tool_call_id)
        if isinstance(part, ToolReturnPart):
            # A typed return (tool search, capability load) has content of a set shape, which
            # agentctx's text is not: it goes back as a plain return.
            return ToolReturnPart(
                part.tool_name,
                content,
                m.tool_call_id,
                metadata=part.metadata,
                timestamp=part.timestamp,
                outcome=part.outcome,
            )
        if isinstance(part, RetryPromptPart):
            # What pydantic-ai makes of a retry that answers a call (the class is deprecated).
            return ToolReturnPart(
                part.tool_name or m.tool_name or "",
                content,
                m.tool_call_id,
                outcome="retried",
                timestamp=part.timestamp,
            )
    if isinstance(m, UserMessage):
        if isinstance(part, UserPromptPart):
            sources = () if isinstance(part.content, str) else part.content
            return dataclasses.replace(part, content=_user_content(m.content, sources))
        if isinstance(part, RetryFeedbackPart):
            return dataclasses.replace(part, content=text_of(m.content))
        if isinstance(part, RetryPromptPart):
            return UserPromptPart(text_of(m.content), timestamp=part.timestamp)
    return part


def _new_part(m: Message, stamp: datetime) -> ModelRequestPart:
    """A request part for a message agentctx made (a summary, a stub result)."""
    if isinstance(m, SummaryMessage):
        return UserPromptPart(m.text, timestamp=stamp)
    if isinstance(m, ToolResultMessage):
        outcome: Literal["failed", "success"] = "failed" if m.is_error else "success"
        return ToolReturnPart(
            m.tool_name or "",
            _user_content(m.content),
            m.tool_call_id,
            outcome=outcome,
            timestamp=stamp,
        )
    return UserPromptPart(_user_content(m.content), timestamp=stamp)


def _requests(run: Sequence[Message], h: _History, out: list[ModelMessage]) -> list[ModelMessage]:
    """The requests for a run of user-side view messages (between two responses)."""
    groups: list[tuple[int | None, list[Message]]] = []
    for m in run:
        found = h.original(m, ModelRequest)
        i = found[0][0] if found is not None else None
        if groups and (i is None or groups[-1][0] == i or groups[-1][0] is None):
            if groups[-1][0] is None and i is not None:
                groups[-1] = (i, groups[-1][1])
            groups[-1][1].append(m)
        else:
            groups.append((i, [m]))
    requests: list[ModelMessage] = []
    for i, members in groups:
        stamp = _stamp(requests or out, h.messages)
        if i is None:
            requests.append(ModelRequest([_new_part(m, stamp) for m in members], timestamp=stamp))
            continue
        requests.append(_request_back(i, members, h, stamp))
    return requests


def _request_back(i: int, members: Sequence[Message], h: _History, stamp: datetime) -> ModelRequest:
    source = h.messages[i]
    assert isinstance(source, ModelRequest)
    before: list[ModelRequestPart] = []  # agentctx's messages ahead of this request's own
    after: list[ModelRequestPart] = []
    mine: dict[int, ModelRequestPart] = {}
    whole = False
    for m in members:
        key = _key(m.extra)
        if key is None or key not in h.at or key[0] != i:
            (after if mine or whole else before).append(_new_part(m, stamp))
        elif len(key) == 1:
            whole = True
        else:
            part = source.parts[key[1]]
            mine[key[1]] = part if h.unchanged(m, key) else _changed_part(m, h.at[key], part)
    own = h.own.get(i, set())
    parts: list[ModelRequestPart] = []
    for j, part in enumerate(source.parts):
        if j in mine:
            parts.append(mine[j])
        elif whole or j not in own:
            parts.append(part)  # rides along with its request
    parts = before + parts + after
    if len(parts) == len(source.parts) and all(map(_same, parts, source.parts)):
        return source
    return dataclasses.replace(source, parts=parts)


def _same(a: object, b: object) -> bool:
    return a is b


def _changed_block(b: AssistantContent, was: AssistantContent, part: Any) -> Any:
    if isinstance(b, ToolCall) and isinstance(part, ToolCallPart):
        args = part.args
        if isinstance(was, ToolCall) and b.arguments != was.arguments:
            new = dict(b.arguments)
            args = pydantic_core.to_json(new).decode() if isinstance(args, str) else new
        return dataclasses.replace(part, tool_call_id=b.id, args=args)
    if isinstance(b, TextBlock) and isinstance(part, TextPart):
        # A stored item id would make the provider use its own copy of the old text.
        return dataclasses.replace(part, content=b.text, id=None)
    return part


def _response_back(m: AssistantMessage, h: _History, stamp: datetime) -> ModelResponse:
    found = h.original(m, ModelResponse)
    if found is not None and h.unchanged(m, found[0]):
        return found[1]  # type: ignore[no-any-return]
    source: ModelResponse | None = found[1] if found is not None else None
    was = h.at[found[0]] if found is not None else None
    parts: list[ModelResponsePart] = []
    for b in m.content:
        j = (b.payload if isinstance(b, OpaqueBlock) else b.extra).get(KEY)
        if (
            source is not None
            and isinstance(was, AssistantMessage)
            and type(j) is int
            and 0 <= j < len(source.parts)
        ):
            old = was.content[j]
            part = source.parts[j]
            parts.append(part if b == old else _changed_block(b, old, part))
        elif isinstance(b, TextBlock):
            parts.append(TextPart(b.text))
        elif isinstance(b, ToolCall):
            parts.append(ToolCallPart(b.name, dict(b.arguments), b.id))
        # Reasoning and opaque blocks need their provider's fields: not made up here.
    if m.extra.get(THINKING_DROPPED):
        # A stored item's id names the reasoning item it followed, which is not sent: the
        # Responses API refuses it, as the Responses adapter knows (`THINKING_DROPPED`).
        parts = [_without_item_id(p) for p in parts]
    if source is not None:
        return dataclasses.replace(source, parts=parts)
    return ModelResponse(parts, timestamp=stamp)


def _without_item_id(part: ModelResponsePart) -> ModelResponsePart:
    """``part`` without its item id, in its stored item too (a computer call keeps the item
    it came as in ``provider_details``, which the Responses model sends as it is)."""
    item_id = getattr(part, "id", None)
    if item_id is None:
        return part
    details = getattr(part, "provider_details", None)
    if isinstance(details, Mapping):
        details = {
            k: {f: v for f, v in item.items() if f != "id"}
            if isinstance(item, Mapping) and item.get("id") == item_id
            else item
            for k, item in details.items()
        }
        return dataclasses.replace(part, id=None, provider_details=details)  # type: ignore[arg-type]
    return dataclasses.replace(part, id=None)  # type: ignore[arg-type]


def _back(view: Sequence[Message], h: _History) -> list[ModelMessage]:
    out: list[ModelMessage] = []
    run: list[Message] = []
    for m in view:
        if isinstance(m, AssistantMessage):
            out += _requests(run, h, out)
            run = []
            out.append(_response_back(m, h, _stamp(out, h.messages)))
        else:
            run.append(m)
    out += _requests(run, h, out)
    return out


def to_pydantic_ai(view: Sequence[Message], messages: Sequence[ModelMessage]) -> list[ModelMessage]:
    """The pydantic-ai messages to send for ``view``, a view prepared from ``messages``.

    Messages the view left as they were are the objects of ``messages`` themselves; see the
    module docstring for the rest.
    """
    return _back(view, _History(messages, from_pydantic_ai(messages)))


# ---------------------------------------------------------------------------------------
# The capability


def _usage(u: RequestUsage) -> Usage:
    # pydantic-ai counts cache reads and writes inside input_tokens; agentctx's input is the
    # uncached part.
    return usage_inside(
        u.input_tokens,
        u.output_tokens,
        u.cache_read_tokens,
        u.cache_write_tokens,
        u.cache_write_1h_tokens,
    )


class _Converter:
    """`from_pydantic_ai` with memory: a message that still equals the copy taken when it was
    converted (the same index on the previous call) gives the same neutral objects (so the
    manager matches them by identity, not by hashing them again); one changed in place, and
    all after it, is converted again (`agentctx._snapshots`)."""

    def __init__(self) -> None:
        self._converted: Converted[list[Message]] = Converted()

    def neutral(self, messages: Sequence[ModelMessage]) -> list[Message]:
        parts = self._converted.update(messages, _convert)  # type: ignore[arg-type]
        return [m for part in parts for m in part]


_WHOLE = "\x00agentctx arguments"  # the model's arguments that are no JSON object (no key of its)


def _as_keywords(arguments: object) -> object:
    return arguments if isinstance(arguments, dict) else {_WHOLE: arguments}


def recall_tool(manager: ContextManager) -> Tool[Any]:
    """The ``recall_context`` tool, answered by ``manager.handle_recall``: bounded pages,
    and an explanation for any JSON arguments it cannot use (JSON that is no object too: they
    reach it as they came, as the schema's checks are its own). Text that is no JSON gets
    pydantic-ai's own retry prompt, under its retry limit, as any tool's does.
    `AgentCtxCapability` adds it by itself when the manager has a recall store."""
    spec = agentctx_recall_tool("openai-responses")

    async def recall_context(**arguments: Any) -> str:
        given: object = arguments[_WHOLE] if arguments.keys() == {_WHOLE} else arguments
        return await manager.handle_recall(given)

    tool = Tool.from_schema(recall_context, spec["name"], spec["description"], spec["parameters"])
    # pydantic-ai calls the function with the arguments as keywords: a list or a null would
    # fail that call and end the run; wrapped, it gets its explanation like any other.
    tool.function_schema.validator = SchemaValidator(
        core_schema.no_info_plain_validator_function(_as_keywords)
    )
    return tool


_FIRST_VERSION = "2.64.0"  # of pydantic-ai-slim with `prepare_model_request`


def _installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pydantic-ai-slim")
    except PackageNotFoundError:
        return "(version unknown)"


@dataclasses.dataclass
class AgentCtxCapability(AbstractCapability[Any]):
    """A pydantic-ai capability that sends ``manager``'s compacted view of each request.

    ``Agent(..., capabilities=[AgentCtxCapability(ctx)])`` or per run with
    ``agent.run(..., capabilities=[AgentCtxCapability(ctx)])``; one manager per
    conversation, entered (``async with``) around its runs. ``observe=False`` leaves the
    responses' usage out of the manager's token accounting (test models report made-up
    numbers). ``recall``: whether the agent gets the ``recall_context`` tool (`recall_tool`)
    to read back what compaction cleared; by default when the manager has a recall store
    (``False`` for an agent with a ``recall_context`` tool of its own: pydantic-ai refuses
    two tools of one name).
    """

    manager: ContextManager
    observe: bool = True
    recall: bool | None = None
    _converter: _Converter = dataclasses.field(default_factory=_Converter, init=False, repr=False)
    # The last attempt's history and view, and whether it was the retry of a refused one.
    _sent: tuple[list[Message], list[Message], bool] | None = dataclasses.field(
        default=None, init=False, repr=False
    )
    _retrying: bool = dataclasses.field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        # Before 2.64 pydantic-ai calls no hook that can replace a request's messages: the
        # capability would be taken, and every request would go out whole.
        if not hasattr(AbstractCapability, "prepare_model_request"):
            raise MissingExtraError(
                "pydantic-ai",
                "pydantic_ai",
                needed_by="AgentCtxCapability",
                why=f"pydantic-ai-slim {_installed_version()} has no prepare_model_request "
                f"hook; it came in {_FIRST_VERSION}",
            )

    @classmethod
    def get_serialization_name(cls) -> str | None:
        """Not in agent specs: it holds a live manager."""
        return None

    def get_toolset(self) -> FunctionToolset[Any] | None:
        """The ``recall_context`` tool, when the agent gets it (``recall``)."""
        wanted = self.manager.recall_store is not None if self.recall is None else self.recall
        return FunctionToolset([recall_tool(self.manager)]) if wanted else None

    async def prepare_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        """Replace the request's messages (not the run's history) with the compacted view."""
        messages = list(request_context.messages)
        neutral = self._converter.neutral(messages)
        view = await self.manager.prepare(neutral)
        self._sent, self._retrying = (neutral, view, self._retrying), False
        request_context.messages = _back(view, _History(messages, neutral))
        return request_context

    async def on_model_request_error(
        self, ctx: RunContext[Any], *, request_context: ModelRequestContext, error: Exception
    ) -> ModelResponse:
        """A prompt the provider refused as longer than its context window: the manager
        observes the refusal (its counts calibrate on the provider's, `ContextManager.observe`)
        and the request is attempted once more (`RetryModelRequest`), compacted to fit. The
        error is raised as it came when compacting cannot change the view, when the retry is
        refused too, and for any other error; `BudgetExceededError` (the refusal as its
        ``__context__``) when the history cannot be compacted to the provider's count."""
        from pydantic_ai.exceptions import RetryModelRequest

        sent, self._sent = self._sent, None
        if sent is None or sent[2] or overflow_of(error) is None:
            raise error
        neutral, view, _ = sent
        self.manager.observe(error)
        if await self.manager.prepare(neutral) == view:
            raise error
        self._retrying = True
        raise RetryModelRequest()

    async def after_model_request(
        self,
        ctx: RunContext[Any],
        *,
        request_context: ModelRequestContext,
        response: ModelResponse,
    ) -> ModelResponse:
        """Give the response's usage to the manager."""
        usage = _usage(response.usage)
        if self.observe and usage.prompt_tokens > 0:
            self.manager.observe(usage)
        return response
