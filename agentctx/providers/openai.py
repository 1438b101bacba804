"""`wrap` an ``openai.AsyncOpenAI`` client so ``chat.completions.create`` and
``responses.create`` send compacted views.

```python
client = wrap(openai.AsyncOpenAI(), manager)
resp = await client.responses.create(model=MODEL, tools=TOOLS, input=items)  # full history
items += [item.to_dict() for item in resp.output]
```

Leading ``system`` / ``developer`` messages (or Responses message items) are split off and
sent untouched; the rest is converted to neutral messages, compacted with
``manager.prepare`` and converted back, so when nothing new was decided the request is the
previous one plus the new messages. Every other argument goes through untouched. Usage is
given to ``manager.observe``; with ``stream=True`` the SDK stream is wrapped and the usage
is recorded once it has been read to the end (Chat Completions reports streamed usage only
with ``stream_options={"include_usage": True}``, which is the caller's to pass).

A Responses call that continues server-side state (``previous_response_id`` or
``conversation``) holds only the new items, so it is sent as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, Literal, Self, TypeVar, overload

from openai import AsyncOpenAI

from agentctx.adapters import (
    assemble_openai_chat_stream,
    assemble_openai_responses_stream,
    from_openai_chat,
    from_openai_responses,
    message_from_openai_chat_response,
    message_from_openai_response,
    split_openai_chat_system,
    split_openai_responses_system,
    to_openai_chat,
    to_openai_responses,
)
from agentctx.errors import UnsupportedMessageError
from agentctx.providers._stream import ObservedStream, event_dict

if TYPE_CHECKING:
    from types import TracebackType

    from openai.types.chat import ChatCompletion, ChatCompletionChunk
    from openai.types.responses import Response, ResponseStreamEvent

    from agentctx.manager import ContextManager
    from agentctx.messages import AssistantMessage

__all__ = ["WrappedAsyncOpenAI", "wrap"]

C = TypeVar("C", bound=AsyncOpenAI)
_Reader = Callable[[Mapping[str, Any]], "AssistantMessage"]


def _observe(manager: ContextManager, response: Mapping[str, Any], read: _Reader) -> None:
    try:
        usage = read(response).usage
    except UnsupportedMessageError:  # e.g. a stream without choices: nothing to learn from
        return
    if usage is not None:
        manager.observe(usage)


async def _call(
    manager: ContextManager,
    method: Any,
    kwargs: dict[str, Any],
    read: _Reader,
    assemble: Callable[[list[Mapping[str, Any]]], Mapping[str, Any]],
) -> Any:
    result = await method(**kwargs)
    if kwargs.get("stream"):
        return ObservedStream[Any](result, lambda events: _observe(manager, assemble(events), read))
    _observe(manager, event_dict(result), read)
    return result


class _Completions:
    def __init__(self, inner: Any, manager: ContextManager) -> None:
        self._inner = inner
        self._manager = manager

    @overload
    async def create(
        self,
        *,
        messages: Iterable[Mapping[str, Any]],
        stream: Literal[True],
        **kwargs: Any,
    ) -> ObservedStream[ChatCompletionChunk]: ...

    @overload
    async def create(
        self,
        *,
        messages: Iterable[Mapping[str, Any]],
        stream: Literal[False] | None = None,
        **kwargs: Any,
    ) -> ChatCompletion: ...

    async def create(
        self,
        *,
        messages: Iterable[Mapping[str, Any]],
        stream: bool | None = None,
        **kwargs: Any,
    ) -> ChatCompletion | ObservedStream[ChatCompletionChunk]:
        """``chat.completions.create`` with ``messages`` compacted; the SDK's own result."""
        system, rest = split_openai_chat_system(list(messages))
        view = await self._manager.prepare(from_openai_chat(rest))
        kwargs["messages"] = [*system, *to_openai_chat(view)]
        if stream is not None:
            kwargs["stream"] = stream
        return await _call(  # type: ignore[no-any-return]
            self._manager,
            self._inner.create,
            kwargs,
            message_from_openai_chat_response,
            assemble_openai_chat_stream,
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Chat:
    def __init__(self, inner: Any, manager: ContextManager) -> None:
        self._inner = inner
        self.completions = _Completions(inner.completions, manager)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Responses:
    def __init__(self, inner: Any, manager: ContextManager) -> None:
        self._inner = inner
        self._manager = manager

    @overload
    async def create(
        self, *, stream: Literal[True], **kwargs: Any
    ) -> ObservedStream[ResponseStreamEvent]: ...

    @overload
    async def create(self, *, stream: Literal[False] | None = None, **kwargs: Any) -> Response: ...

    async def create(
        self, *, stream: bool | None = None, **kwargs: Any
    ) -> Response | ObservedStream[ResponseStreamEvent]:
        """``responses.create`` with ``input`` compacted; the SDK's own result."""
        if stream is not None:
            kwargs["stream"] = stream
        items = kwargs.get("input")
        stateful = kwargs.get("previous_response_id") or kwargs.get("conversation")
        if isinstance(items, Sequence) and not isinstance(items, str) and not stateful:
            system, rest = split_openai_responses_system(items)
            view = await self._manager.prepare(from_openai_responses(rest))
            kwargs["input"] = [*system, *to_openai_responses(view)]
        return await _call(  # type: ignore[no-any-return]
            self._manager,
            self._inner.create,
            kwargs,
            message_from_openai_response,
            assemble_openai_responses_stream,
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class WrappedAsyncOpenAI(Generic[C]):
    """An ``AsyncOpenAI`` whose ``chat.completions`` and ``responses`` compact; everything
    else is the client's."""

    def __init__(self, client: C, manager: ContextManager) -> None:
        self.client = client
        self.manager = manager
        self.chat = _Chat(client.chat, manager)
        self.responses = _Responses(client.responses, manager)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    async def __aenter__(self) -> Self:
        await self.client.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.client.__aexit__(exc_type, exc, tb)


def wrap(client: C, manager: ContextManager) -> WrappedAsyncOpenAI[C]:
    """A thin proxy of ``client`` whose ``chat.completions.create`` and ``responses.create``
    send the compacted view of the full history they are given and record usage."""
    if not isinstance(client, AsyncOpenAI):
        raise TypeError(f"wrap() takes an openai.AsyncOpenAI, got {type(client).__name__}")
    return WrappedAsyncOpenAI(client, manager)
