"""What every wrapper and the middleware do around one model call, in the SDK's dict formats.

`Compactor` turns the keyword arguments of an SDK call into the ones to send (the history
compacted, everything else untouched, Anthropic ``cache_control`` breakpoints placed when
asked) and records the usage of what came back. It imports no vendor SDK.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, get_args

from agentctx.adapters import (
    assemble_anthropic_stream,
    assemble_openai_chat_stream,
    assemble_openai_responses_stream,
    from_anthropic,
    from_openai_chat,
    from_openai_responses,
    message_from_anthropic_response,
    message_from_openai_chat_response,
    message_from_openai_response,
    split_openai_chat_system,
    split_openai_responses_system,
    to_anthropic,
    to_openai_chat,
    to_openai_responses,
)
from agentctx.errors import ConfigError, UnsupportedMessageError
from agentctx.providers._stream import ObservedStream, ObservedSyncStream, event_dict

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from agentctx.manager import ContextManager
    from agentctx.messages import Message
    from agentctx.providers._blocking import LoopThread

__all__ = [
    "MAX_BREAKPOINTS",
    "Compactor",
    "Provider",
    "place_breakpoints",
    "send",
    "send_blocking",
]

Provider = Literal["anthropic", "openai-chat", "openai-responses"]
MAX_BREAKPOINTS = 4  # Anthropic rejects a request with more cache_control blocks than this
# The cache looks for an earlier hit about 20 blocks back from a breakpoint; a turn that adds
# more than this many blocks needs a breakpoint of its own where the previous request ended.
_LOOKBACK_BLOCKS = 18
# Blocks the API accepts cache_control on (never thinking, redacted thinking or empty text).
_CACHEABLE = frozenset(
    {"text", "image", "document", "tool_use", "tool_result", "server_tool_use", "search_result"}
)


class Compactor:
    """Compacts the history of one provider's SDK calls in projection mode.

    Args:
        manager: the session.
        provider: ``anthropic``, ``openai-chat`` or ``openai-responses``.
        cache_breakpoints: Anthropic only — place ``cache_control`` breakpoints (see
            `place_breakpoints`).
    """

    def __init__(
        self, manager: ContextManager, provider: str, *, cache_breakpoints: bool = False
    ) -> None:
        if provider not in get_args(Provider):
            raise ConfigError(f"unknown provider {provider!r}")
        if cache_breakpoints and provider != "anthropic":
            raise ConfigError("cache_breakpoints are Anthropic's; OpenAI caches prefixes itself")
        self.manager = manager
        self.provider = provider
        self.cache_breakpoints = cache_breakpoints
        self._key = "input" if provider == "openai-responses" else "messages"
        self._sent: list[Message] = []  # the previous view, to find where its cache ends
        self._sent_length = 0

    async def request(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments to send: the history compacted, the rest as given.

        A Responses call that continues server-side state (``previous_response_id`` or
        ``conversation``) holds only the new items, and a string ``input`` is not a history:
        both are sent as they are.
        """
        outgoing = dict(kwargs)
        history = kwargs.get(self._key)
        if (
            not isinstance(history, Sequence)
            or isinstance(history, str)
            or kwargs.get("previous_response_id")
            or kwargs.get("conversation")
        ):
            return outgoing
        if self.provider == "anthropic":
            view = await self.manager.prepare(from_anthropic(list(history)))
            messages = to_anthropic(view)
            if self.cache_breakpoints:
                messages = self._place(kwargs, view, messages)
            outgoing[self._key] = messages
        elif self.provider == "openai-chat":
            system, rest = split_openai_chat_system(list(history))
            view = await self.manager.prepare(from_openai_chat(rest))
            outgoing[self._key] = [*system, *to_openai_chat(view)]
        else:
            system, rest = split_openai_responses_system(list(history))
            view = await self.manager.prepare(from_openai_responses(rest))
            outgoing[self._key] = [*system, *to_openai_responses(view)]
        return outgoing

    def _place(
        self, kwargs: Mapping[str, Any], view: list[Message], messages: list[Any]
    ) -> list[Any]:
        previous, length = self._sent, self._sent_length
        extends = 0 < len(previous) <= len(view) and all(
            a is b for a, b in zip(previous, view, strict=False)
        )
        self._sent, self._sent_length = view, len(messages)
        used = _count(kwargs.get("system")) + _count(kwargs.get("tools")) + _count(messages)
        return place_breakpoints(
            messages,
            MAX_BREAKPOINTS - used,
            previous_end=length - 1 if extends else None,
        )

    def record(self, response: object) -> None:
        """Record the usage of a complete response (an SDK object or its dict)."""
        data = response if isinstance(response, Mapping) else event_dict(response)
        if data:
            self._observe(data)

    def record_stream(self, events: list[Mapping[str, Any]]) -> None:
        """Record the usage of a stream read to its end, from its events' dicts."""
        if self.provider == "anthropic":
            self._observe(assemble_anthropic_stream(events))
        elif self.provider == "openai-chat":
            self._observe(assemble_openai_chat_stream(events))
        else:
            self._observe(assemble_openai_responses_stream(events))

    def _observe(self, data: Mapping[str, Any]) -> None:
        try:
            if self.provider == "anthropic":
                usage = message_from_anthropic_response(data).usage
            elif self.provider == "openai-chat":
                usage = message_from_openai_chat_response(data).usage
            else:
                usage = message_from_openai_response(data).usage
        except UnsupportedMessageError:  # e.g. a stream without choices: nothing to learn
            return
        if usage is not None:
            self.manager.observe(usage)


async def send(
    compactor: Compactor, create: Callable[..., Awaitable[Any]], kwargs: dict[str, Any]
) -> Any:
    """``create`` (an SDK method) with the compacted ``kwargs``; the usage is recorded now, or
    when the stream it returns has been read to the end."""
    result = await create(**await compactor.request(kwargs))
    if kwargs.get("stream"):
        return ObservedStream[Any](result, compactor.record_stream)
    compactor.record(result)
    return result


def send_blocking(
    loop: LoopThread, compactor: Compactor, create: Callable[..., Any], kwargs: dict[str, Any]
) -> Any:
    """`send` for a blocking SDK method; the session's work runs on the manager's ``loop``."""
    result = create(**loop.call(compactor.request, kwargs))
    if kwargs.get("stream"):
        return ObservedSyncStream[Any](
            result, lambda events: loop.call(compactor.record_stream, events)
        )
    loop.call(compactor.record, result)
    return result


def place_breakpoints(
    messages: list[Any], room: int, *, previous_end: int | None = None
) -> list[Any]:
    """Anthropic ``messages`` with up to ``room`` ``cache_control`` breakpoints added.

    In order of what they pay for: the last message (this request's prefix is written, the
    next request reads it); where the previous request ended, when more blocks than the
    cache's lookback were added since (so that prefix is still read); the first message, the
    task, which compaction never rewrites (so tools, system and task stay cached across a
    compaction). Messages that get one are copied; the others are the same objects.
    """
    if room <= 0 or not messages:
        return messages
    last = len(messages) - 1
    targets = [last]
    if (
        previous_end is not None
        and 0 <= previous_end < last
        and _blocks_between(messages, previous_end, last) > _LOOKBACK_BLOCKS
    ):
        targets.append(previous_end)
    targets.append(0)
    out = list(messages)
    placed = 0
    for index in dict.fromkeys(targets):
        if placed == room:
            break
        marked = _mark(out[index])
        if marked is not None:
            out[index] = marked
            placed += 1
    return out


def _mark(message: Any) -> dict[str, Any] | None:
    if not isinstance(message, Mapping):
        return None
    content = message.get("content")
    if isinstance(content, str):
        if not content:
            return None
        block = {"type": "text", "text": content, "cache_control": {"type": "ephemeral"}}
        return {**message, "content": [block]}
    if not isinstance(content, list):
        return None
    for i in range(len(content) - 1, -1, -1):
        block = content[i]
        if not isinstance(block, Mapping) or block.get("type") not in _CACHEABLE:
            continue
        if "cache_control" in block:
            return None
        if block.get("type") == "text" and not block.get("text"):
            continue
        blocks = list(content)
        blocks[i] = {**block, "cache_control": {"type": "ephemeral"}}
        return {**message, "content": blocks}
    return None


def _blocks_between(messages: list[Any], start: int, end: int) -> int:
    n = 0
    for message in messages[start + 1 : end + 1]:
        content = message.get("content") if isinstance(message, Mapping) else None
        n += len(content) if isinstance(content, list) else 1
    return n


def _count(value: object) -> int:
    if isinstance(value, Mapping):
        return ("cache_control" in value) + sum(
            _count(v) for k, v in value.items() if k != "cache_control"
        )
    if isinstance(value, list):
        return sum(_count(v) for v in value)
    return 0
