"""agentctx for LangChain v1: a middleware for ``create_agent`` that sends compacted views.

```python
from langchain.agents import create_agent

from agentctx.integrations.langchain import AgentCtxMiddleware, context_manager

# trigger / keep read as SummarizationMiddleware's: compact above 100k tokens, keep 20 messages
async with context_manager(trigger=("tokens", 100_000), keep=("messages", 20)) as ctx:
    agent = create_agent(model, tools, middleware=[AgentCtxMiddleware(ctx)])
    state = await agent.ainvoke({"messages": [HumanMessage(task)]})
```

``AgentCtxMiddleware(ctx)`` takes any `ContextManager` (one per conversation, entered around
its ``ainvoke`` / ``astream`` calls); `context_manager` makes one from LangChain's vocabulary.
Before each model call (``awrap_model_call``) the middleware converts the agent state's whole
message list with `from_langchain` (what is new, and any message changed in place since the
last call: each is compared with a copy taken when it was converted), calls ``ctx.prepare`` on
it and hands the model `to_langchain` of the view; the state itself is never rewritten (unlike
``SummarizationMiddleware``, which replaces it), so the graph's checkpoints keep every message.
The response's ``usage_metadata`` goes to ``ctx.observe``; a prompt the provider refuses as
longer than its window is observed too, and sent once more compacted to fit
(`AgentCtxMiddleware.awrap_model_call`). Only the async path is supported:
a synchronous ``invoke`` fails with LangChain's own "use ainvoke" error.

Conversion: ``HumanMessage`` is a `UserMessage`, ``AIMessage`` an `AssistantMessage` (its
content blocks: text a `TextBlock`, Anthropic ``thinking`` / ``redacted_thinking`` and
standard ``reasoning`` blocks reasoning blocks, images `ImageBlock`, anything else an
`OpaqueBlock`; then its ``tool_calls`` as `ToolCall`), ``ToolMessage`` a `ToolResultMessage`
(``status="error"`` is ``is_error``), a ``SystemMessage`` after the first message a
`UserMessage`. Leading ``SystemMessage`` s stay at the front of every view untouched; a
``tool_use`` content block that repeats a tool call rides with its message. Every neutral
message names its source in ``extra["langchain"]``, and `to_langchain` maps the view back onto
the messages it was prepared from: an unchanged message is the very object, a changed one a
copy (``model_copy``) with only what changed replaced; a summary is a ``HumanMessage``. So
``to_langchain(from_langchain(m), m) == m``, message for message.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from agentctx._overflow import overflow_of
from agentctx._snapshots import Converted
from agentctx._usage import usage_inside
from agentctx.budget import Budget
from agentctx.errors import ConfigError, MissingExtraError, UnsupportedMessageError
from agentctx.manager import ContextManager
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
    Usage,
    UserMessage,
    fingerprint,
    text_of,
)
from agentctx.recall.tool import recall_tool as agentctx_recall_tool
from agentctx.strategies.deterministic import DeterministicCompaction

try:
    # Imported first, so that a missing framework is named as itself.
    import langchain  # noqa: F401
    from langchain.agents.middleware import AgentMiddleware, AgentState, ModelResponse
    from langchain_core.messages import (
        AIMessage,
        AnyMessage,
        BaseMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
    )
    from langchain_core.tools import BaseTool, StructuredTool
except ImportError as exc:
    raise MissingExtraError("langchain", exc.name, needed_by=__name__) from exc

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from langchain.agents.middleware import ExtendedModelResponse, ModelRequest
    from langchain_core.language_models import BaseChatModel

    from agentctx.strategy import CompactionStrategy

__all__ = [
    "KEY",
    "PROVIDER",
    "AgentCtxMiddleware",
    "ContextSize",
    "context_manager",
    "from_langchain",
    "recall_tool",
    "to_langchain",
]

KEY = "langchain"
"""The ``extra`` key naming a neutral message's source: ``[index]`` in the message list; on a
block ``["content", n]`` (``["content"]`` for string content) or ``["tool_calls", n]``."""
PROVIDER = "langchain"
"""The ``provider`` of the `OpaqueBlock` for a content block agentctx does not model."""

ContextSize: TypeAlias = tuple[Literal["fraction", "tokens", "messages"], int | float]
"""LangChain's ``ContextSize``: ``("tokens", N)``, ``("fraction", f)`` or ``("messages", n)``."""

Content: TypeAlias = str | list[str | dict[Any, Any]]


# ---------------------------------------------------------------------------------------
# LangChain -> neutral


def _frozen(d: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(d))


def _image(item: Mapping[str, Any]) -> ImageBlock | None:
    """The image of a content item in any form LangChain takes: OpenAI's ``image_url``, the
    standard ``image`` (``base64`` or ``url``; the older ``source_type`` with ``data``), and
    Anthropic's own ``image`` with a ``source``."""
    kind = item.get("type")
    url: object = None
    if kind == "image_url":
        inner = item.get("image_url")
        url = inner.get("url") if isinstance(inner, Mapping) else inner
    elif kind == "image":
        source = item.get("source")
        if isinstance(item.get("base64"), str):
            return ImageBlock(str(item.get("mime_type") or ""), item["base64"])
        if item.get("source_type") == "base64" and isinstance(item.get("data"), str):
            return ImageBlock(str(item.get("mime_type") or ""), item["data"])
        if (
            isinstance(source, Mapping)
            and source.get("type") == "base64"
            and isinstance(source.get("data"), str)
        ):
            return ImageBlock(str(source.get("media_type") or ""), source["data"])
        url = source.get("url") if isinstance(source, Mapping) else item.get("url")
    if not isinstance(url, str):
        return None
    if url.startswith("data:") and ";base64," in url:
        media_type, data = url[5:].split(";base64,", 1)
        return ImageBlock(media_type, data)
    return ImageBlock("", url, "url")


# Content items that repeat a call: Anthropic's, and v1's (a call, or one the model wrote
# arguments for that do not parse), with the field that holds its arguments.
_CALL_ITEMS = {"tool_use": "input", "tool_call": "args", "invalid_tool_call": "args"}


def _block(item: str | Mapping[str, Any], key: list[Any], calls: AbstractSet[str] | None) -> Any:
    """The neutral block of one content item; ``None`` for one that repeats a tool call.

    ``calls`` is None for a user-side message, where reasoning blocks are carried as opaque.
    """
    k = _frozen({KEY: key})
    if isinstance(item, str):
        return TextBlock(item, k)
    kind = item.get("type")
    if kind == "text" and isinstance(item.get("text"), str):
        return TextBlock(item["text"], k)
    if calls is not None:
        if kind == "thinking" and isinstance(item.get("thinking"), str):
            signature = item.get("signature")
            signed = signature if isinstance(signature, str) else None
            return ThinkingBlock(item["thinking"], signed, k)
        if kind == "reasoning" and isinstance(item.get("reasoning"), str):
            return ThinkingBlock(item["reasoning"], None, k)
        if kind == "redacted_thinking" and isinstance(item.get("data"), str):
            return RedactedThinkingBlock(item["data"], k)
        if kind in _CALL_ITEMS and item.get("id") in calls:
            return None
    image = _image(item)
    if image is not None:
        marked = item.get("cache_control")  # where an image that gives way leaves it
        extra = k if marked is None else _frozen({KEY: key, "cache_control": marked})
        return ImageBlock(image.media_type, image.data, image.source, extra)
    return OpaqueBlock(PROVIDER, _frozen({KEY: key, "item": dict(item)}))


def _blocks(content: Content, calls: AbstractSet[str] | None = None) -> list[Any]:
    if isinstance(content, str):
        return [TextBlock(content, _frozen({KEY: ["content"]}))] if content else []
    blocks = (_block(item, ["content", n], calls) for n, item in enumerate(content))
    return [b for b in blocks if b is not None]


def _convert(i: int, m: BaseMessage) -> Message:
    extra = _frozen({KEY: [i]})
    if isinstance(m, AIMessage):
        made = [*m.tool_calls, *m.invalid_tool_calls]
        calls = {call_id for c in made if (call_id := c.get("id"))}
        blocks: list[AssistantContent] = _blocks(m.content, calls)
        for n, c in enumerate(m.tool_calls):
            key = _frozen({KEY: ["tool_calls", n]})
            blocks.append(ToolCall(c.get("id") or "", c["name"], dict(c["args"]), key))
        for n, bad in enumerate(m.invalid_tool_calls):
            # Arguments the model wrote that do not parse: a call all the same, which the
            # agent answers with the error (providers send it as one), so it pairs with that
            # answer; its written arguments ride in ``extra`` (counted, sent back as written).
            written = {"arguments": bad.get("args") or ""}
            key = _frozen({KEY: ["invalid_tool_calls", n], **written})
            blocks.append(ToolCall(bad.get("id") or "", bad.get("name") or "", {}, key))
        reason = "tool_use" if m.tool_calls or m.invalid_tool_calls else "stop"
        return AssistantMessage(tuple(blocks), reason, extra=extra)
    if isinstance(m, ToolMessage):
        result = tuple(_blocks(m.content))
        return ToolResultMessage(m.tool_call_id, result, m.name, m.status == "error", extra)
    if isinstance(m, HumanMessage | SystemMessage):
        if isinstance(m, SystemMessage):
            extra = _frozen({KEY: [i], "role": "system"})
        return UserMessage(tuple(_blocks(m.content) or [TextBlock("")]), extra)
    raise UnsupportedMessageError(i, f"LangChain message of type {type(m).__name__}")


def _leading_system(messages: Sequence[BaseMessage]) -> int:
    n = 0
    while n < len(messages) and isinstance(messages[n], SystemMessage):
        n += 1
    return n


def from_langchain(messages: Sequence[BaseMessage]) -> list[Message]:
    """Neutral messages for a LangChain message list (see the module docstring).

    Leading ``SystemMessage`` s are left out (`to_langchain` puts them back in front).
    Raises `UnsupportedMessageError` (with the index) for a message of another type.
    """
    start = _leading_system(messages)
    return [_convert(i, m) for i, m in enumerate(messages) if i >= start]


# ---------------------------------------------------------------------------------------
# neutral -> LangChain


def _item(b: object) -> str | dict[str, Any] | None:
    """A LangChain content item for a neutral block agentctx made or changed."""
    if isinstance(b, TextBlock):
        # A caller's cache breakpoint stays where it was (on the line standing for an image
        # that gave way).
        marked = b.extra.get("cache_control")
        if marked is not None:
            return {"type": "text", "text": b.text, "cache_control": marked}
        return {"type": "text", "text": b.text}
    if isinstance(b, ImageBlock):
        url = b.data if b.source == "url" else f"data:{b.media_type};base64,{b.data}"
        return {"type": "image_url", "image_url": {"url": url}}
    if (
        isinstance(b, OpaqueBlock)
        and b.provider == PROVIDER
        and isinstance(b.payload.get("item"), Mapping)
    ):
        return dict(b.payload["item"])
    return None  # a block of another format: nothing to rebuild it from


def _kept(b: object, was: Content) -> str | dict[str, Any] | None:
    """The content item of ``was`` that block ``b`` was made from, as the view has it: an image
    the view did not change is that item itself (its ``detail``, ``cache_control``, ``id`` and
    form kept); a text the view cut keeps the item's other fields. ``None``: a block made
    anew, or one whose item says something else now."""
    key = _key(_extra_of(b))
    if (
        isinstance(was, str)
        or key is None
        or len(key) != 2
        or key[0] != "content"
        or type(key[1]) is not int
        or not 0 <= key[1] < len(was)
    ):
        return None
    item = was[key[1]]
    if isinstance(b, TextBlock):
        if isinstance(item, str):
            return b.text
        return {**item, "text": b.text} if item.get("type") == "text" else None
    if isinstance(b, ImageBlock) and isinstance(item, dict):
        image = _image(item)
        same = image is not None and (image.media_type, image.data, image.source) == (
            b.media_type,
            b.data,
            b.source,
        )
        return item if same else None
    return None


def _content(blocks: Sequence[object], was: Content) -> Content:
    """Content for changed blocks, in the form the message had (a str stays a str); each
    block goes back as the item it was made from (`_kept`) where it can."""
    if isinstance(was, str) and all(isinstance(b, TextBlock) for b in blocks):
        return text_of(blocks)  # type: ignore[arg-type]
    items = [kept if (kept := _kept(b, was)) is not None else _item(b) for b in blocks]
    return [i for i in items if i is not None]


def _key(extra: Mapping[str, Any]) -> list[Any] | None:
    key = extra.get(KEY)
    return key if isinstance(key, list) and key else None


class _History:
    def __init__(self, messages: Sequence[BaseMessage], neutral: Sequence[Message]) -> None:
        self.messages = messages
        self.at: dict[int, Message] = {}
        for m in neutral:
            key = _key(m.extra)
            if key is not None and type(key[0]) is int:
                self.at[key[0]] = m

    def source(self, m: Message) -> tuple[BaseMessage, Message] | None:
        key = _key(m.extra)
        if key is None or type(key[0]) is not int or key[0] not in self.at:
            return None
        return self.messages[key[0]], self.at[key[0]]


def _changed_ai(m: AssistantMessage, source: AIMessage, was: AssistantMessage) -> AIMessage:
    old = {tuple(k): b for b in was.content if (k := _key(_extra_of(b))) is not None}
    now = {tuple(k): b for b in m.content if (k := _key(_extra_of(b))) is not None}
    calls: list[Any] = []
    invalid: list[Any] = []
    # (valid or not, call id in the source) -> for each call with that id, in the source's
    # order, the id and the arguments the view has for it, or None where it is unchanged
    # (a batch may repeat an id: its content items follow the calls one by one).
    changed: dict[tuple[bool, str], list[tuple[int, tuple[str, object] | None]]] = {}
    for b in m.content:
        key = _key(_extra_of(b))
        if not isinstance(b, ToolCall):
            continue
        if key is None:
            calls.append(
                {"name": b.name, "args": dict(b.arguments), "id": b.id, "type": "tool_call"}
            )
            continue
        valid = key[0] != "invalid_tool_calls"
        original = (source.tool_calls if valid else source.invalid_tool_calls)[key[1]]
        sent, now_said = original, None
        if old.get(tuple(key)) != b:
            args: object = dict(b.arguments)
            if not valid:
                # Arguments a decision cut down are sent as the JSON they now are.
                written = b.extra.get("arguments") if not b.arguments else None
                args = written if isinstance(written, str) else json.dumps(args)
            now_said = (b.id, args)
            sent = {**original, "id": b.id, "args": args}
        changed.setdefault((valid, original.get("id") or ""), []).append((key[1], now_said))
        (calls if valid else invalid).append(sent)
    said = {
        which: [s for _, s in sorted(entries, key=lambda e: e[0])]
        for which, entries in changed.items()
    }
    met: dict[tuple[bool, str], int] = {}
    added = [b for b in m.content if isinstance(b, TextBlock) and _key(b.extra) is None]
    content: Content
    if isinstance(source.content, str):
        kept = [b for b in m.content if isinstance(b, TextBlock)]
        content = text_of(kept)
    else:
        content = []
        for n, item in enumerate(source.content):
            block = now.get(("content", n))
            if ("content", n) in old and block is None:
                continue  # dropped (thinking)
            if isinstance(block, TextBlock) and block != old[("content", n)]:
                item = {**item, "text": block.text} if isinstance(item, dict) else block.text
            elif (
                isinstance(item, dict)
                and item.get("type") in _CALL_ITEMS
                and (which := (item["type"] != "invalid_tool_call", item.get("id"))) in said
            ):
                # A content item repeating a call says what the call says now.
                nth = met[which] = met.get(which, -1) + 1
                current = said[which][nth] if nth < len(said[which]) else None
                if current is not None:
                    item = {**item, "id": current[0], _CALL_ITEMS[item["type"]]: current[1]}
            content.append(item)
        content += [{"type": "text", "text": b.text} for b in added]
    update = {"content": content, "tool_calls": calls, "invalid_tool_calls": invalid}
    return source.model_copy(update=update)


def _extra_of(b: object) -> Mapping[str, Any]:
    if isinstance(b, OpaqueBlock):
        return b.payload
    extra = getattr(b, "extra", None)
    return extra if isinstance(extra, Mapping) else {}


def _back_one(m: Message, h: _History) -> BaseMessage:
    found = h.source(m)
    if found is not None:
        source, was = found
        if m is was or fingerprint(m) == fingerprint(was):
            return source
        if isinstance(m, AssistantMessage) and isinstance(source, AIMessage):
            assert isinstance(was, AssistantMessage)
            return _changed_ai(m, source, was)
        if isinstance(m, ToolResultMessage) and isinstance(source, ToolMessage):
            update: dict[str, Any] = {"tool_call_id": m.tool_call_id}
            if not isinstance(was, ToolResultMessage) or m.content != was.content:
                # Else only the id changed (`repair` renamed a duplicate): content stays as is.
                update["content"] = _content(m.content, source.content)
            return source.model_copy(update=update)
        if isinstance(m, UserMessage) and isinstance(source, HumanMessage | SystemMessage):
            return source.model_copy(update={"content": _content(m.content, source.content)})
    # A message agentctx made: a summary, a condensed turn, a stub result.
    if isinstance(m, SummaryMessage):
        return HumanMessage(m.text)
    if isinstance(m, AssistantMessage):
        calls = [
            {"name": c.name, "args": dict(c.arguments), "id": c.id, "type": "tool_call"}
            for c in m.tool_calls
        ]
        return AIMessage(
            content=_content([b for b in m.content if not isinstance(b, ToolCall)], ""),
            tool_calls=calls,
        )
    if isinstance(m, ToolResultMessage):
        return ToolMessage(
            _content(m.content, ""),
            tool_call_id=m.tool_call_id,
            name=m.tool_name,
            status="error" if m.is_error else "success",
        )
    return HumanMessage(_content(m.content, ""))


def _back(view: Sequence[Message], h: _History) -> list[BaseMessage]:
    front = list(h.messages[: _leading_system(h.messages)])
    return front + [_back_one(m, h) for m in view]


def to_langchain(view: Sequence[Message], messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    """The LangChain messages to send for ``view``, a view prepared from ``messages``.

    Messages the view left as they were are the objects of ``messages`` themselves; see the
    module docstring for the rest.
    """
    return _back(view, _History(messages, from_langchain(messages)))


# ---------------------------------------------------------------------------------------
# Budget from LangChain's vocabulary


def _max_input_tokens(model: BaseChatModel | None, what: str) -> int:
    profile = getattr(model, "profile", None) if model is not None else None
    limit = profile.get("max_input_tokens") if isinstance(profile, Mapping) else None
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ConfigError(
            f"{what} is a fraction of the model's max_input_tokens: pass model= with a profile "
            'that has it (ChatModel(..., profile={"max_input_tokens": ...})) or use ("tokens", N)'
        )
    return limit


def _tokens(size: object, model: BaseChatModel | None, what: str) -> int:
    if not (isinstance(size, tuple) and len(size) == 2):
        raise ConfigError(
            f'{what} is a ("tokens" | "fraction" | "messages", value) tuple; got {size!r}'
        )
    kind, value = size
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{what} needs a number; got {size!r}")
    if kind == "tokens" and value >= 1:
        return int(value)
    if kind == "fraction" and 0 < value <= 1:
        return max(1, int(_max_input_tokens(model, f"{what}={size!r}") * value))
    raise ConfigError(f'{what}: ("tokens", N >= 1) or ("fraction", 0 < f <= 1); got {size!r}')


def context_manager(
    *,
    trigger: ContextSize,
    keep: ContextSize | None = None,
    model: BaseChatModel | None = None,
    strategy: CompactionStrategy | None = None,
    **kwargs: Any,
) -> ContextManager:
    """A `ContextManager` set up the way ``SummarizationMiddleware`` reads ``trigger`` and ``keep``.

    ``trigger=("tokens", N)`` (or ``("fraction", f)`` of ``model.profile["max_input_tokens"]``)
    is the hard budget: the prompt agentctx compacts to stay under. ``keep`` is what compaction
    keeps: ``("tokens", T)`` / ``("fraction", f)`` the size it brings the prompt down to
    (``Budget.target_ratio``), ``("messages", n)`` the newest steps it never condenses or drops
    (``DeterministicCompaction(keep_recent_steps=ceil(n / 2))``: a step is an assistant message
    and its tool results). Without ``keep``, half the budget (``Budget.target_ratio=0.5``, where a
    bare `Budget` lands at 0.1) and agentctx's default 3 steps.
    A ``("messages", n)`` trigger has no token equivalent and is refused (`ConfigError`), as is
    ``keep=("messages", n)`` with a ``strategy`` of your own. Other keyword arguments go to
    `ContextManager`.
    """
    limit = _tokens(trigger, model, "trigger")
    window = limit
    if model is not None and trigger[0] == "fraction":
        window = _max_input_tokens(model, "trigger")
    target_ratio = 0.5
    if isinstance(keep, tuple) and len(keep) == 2 and keep[0] == "messages":
        n = keep[1]
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError(f'keep=("messages", n) needs a whole n >= 0; got {keep!r}')
        if strategy is not None:
            raise ConfigError(
                'keep=("messages", n) configures the default strategy; pass one or the other'
            )
        strategy = DeterministicCompaction(keep_recent_steps=math.ceil(n / 2))
    elif keep is not None:
        target_ratio = min(1.0, _tokens(keep, model, "keep") / limit)
    budget = Budget(
        context_window=window,
        reserve_output=0,  # LangChain's limits are on the input alone
        trigger_ratio=max(0.75, target_ratio),
        target_ratio=target_ratio,
        hard_budget=limit,
    )
    return ContextManager(budget, strategy=strategy, **kwargs)


# ---------------------------------------------------------------------------------------
# The middleware


def _usage(message: BaseMessage) -> Usage | None:
    meta = getattr(message, "usage_metadata", None)
    if not meta:
        return None
    details = meta.get("input_token_details") or {}
    # LangChain counts cache reads and writes inside input_tokens.
    return usage_inside(
        meta.get("input_tokens"),
        meta.get("output_tokens"),
        details.get("cache_read"),
        details.get("cache_creation"),
    )


class _Converter:
    """`from_langchain` with memory: a message that still equals the copy taken when it was
    converted (the same index on the previous call) gives the same neutral object (the
    manager then matches it by identity); one changed in place, and all after it, is
    converted again (`agentctx._snapshots`)."""

    def __init__(self) -> None:
        self._converted: Converted[Message | None] = Converted()  # None: a system message

    def neutral(self, messages: Sequence[BaseMessage]) -> list[Message]:
        start = _leading_system(messages)

        def convert(i: int, m: object) -> Message | None:
            return None if i < start else _convert(i, m)  # type: ignore[arg-type]

        return [m for m in self._converted.update(messages, convert) if m is not None]


def recall_tool(manager: ContextManager) -> StructuredTool:
    """The ``recall_context`` tool, answered by ``manager.handle_recall`` (bounded pages,
    and an explanation for arguments it cannot use). `AgentCtxMiddleware` registers it by
    itself when the manager has a recall store."""
    spec = agentctx_recall_tool("openai-responses")

    async def recall_context(**arguments: Any) -> str:
        return await manager.handle_recall(arguments)

    return StructuredTool.from_function(
        coroutine=recall_context,
        name=spec["name"],
        description=spec["description"],
        args_schema=spec["parameters"],
    )


class AgentCtxMiddleware(AgentMiddleware[AgentState[Any], Any, Any]):
    """Sends the model ``manager``'s compacted view of the agent's messages on every call.

    ``create_agent(model, tools, middleware=[AgentCtxMiddleware(ctx)])``; one manager per
    conversation (thread), entered (``async with``) around its ``ainvoke`` / ``astream``
    calls. ``observe=False`` keeps the responses' ``usage_metadata`` out of the manager's token
    accounting (fake models report none, or made-up numbers). ``recall``: whether the agent
    gets the ``recall_context`` tool (`recall_tool`) to read back what compaction cleared; by
    default when the manager has a recall store.
    """

    def __init__(
        self, manager: ContextManager, *, observe: bool = True, recall: bool | None = None
    ) -> None:
        super().__init__()
        self.manager = manager
        self.observe = observe
        self._converter = _Converter()
        wanted = manager.recall_store is not None if recall is None else recall
        self.tools: Sequence[BaseTool] = [recall_tool(manager)] if wanted else []

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any] | AIMessage | ExtendedModelResponse[Any]:
        """Call the model with the compacted view instead of the whole message list.

        A prompt the provider refuses as longer than its context window (the SDK's error, or
        LangChain's ``ContextOverflowError``) is observed (the manager's counts calibrate on
        the provider's, `ContextManager.observe`), compacted to fit and sent once more; the
        error is raised as it came when compacting cannot change the view, when the second
        request is refused too, and for any other error; `BudgetExceededError` (the refusal
        as its ``__context__``) when the history cannot be compacted to the provider's count."""
        messages: list[AnyMessage] = list(request.messages)
        neutral = self._converter.neutral(messages)
        history = _History(messages, neutral)
        view = await self.manager.prepare(neutral)
        try:
            response = await handler(request.override(messages=_back(view, history)))  # type: ignore[arg-type]
        except Exception as error:
            if overflow_of(error) is None:
                raise
            self.manager.observe(error)
            again = await self.manager.prepare(neutral)
            if again == view:
                raise
            response = await handler(request.override(messages=_back(again, history)))  # type: ignore[arg-type]
        if self.observe:
            for message in response.result:
                usage = _usage(message)
                if usage is not None and usage.prompt_tokens > 0:
                    self.manager.observe(usage)
        return response
