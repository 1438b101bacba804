"""`wrap` an ``openai`` client so ``chat.completions.create`` and ``responses.create`` send
compacted views.

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

The blocking ``openai.OpenAI`` works the same way: ``with wrap(openai.OpenAI(), manager) as
client:`` runs the manager on an event loop of its own in a daemon thread (its background
summaries included) until the ``with`` block ends or ``client.close()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, Literal, Self, TypeVar, overload

from agentctx.errors import MissingExtraError
from agentctx.providers._blocking import BlockingClient, LoopThread
from agentctx.providers._convert import Compactor, send, send_blocking

try:
    from openai import AsyncOpenAI, OpenAI
except ImportError as exc:
    raise MissingExtraError("openai", exc.name, needed_by=__name__) from exc

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from types import TracebackType

    from openai.types.chat import ChatCompletion, ChatCompletionChunk
    from openai.types.responses import Response, ResponseStreamEvent

    from agentctx.manager import ContextManager
    from agentctx.providers._stream import ObservedStream, ObservedSyncStream

__all__ = ["WrappedAsyncOpenAI", "WrappedOpenAI", "wrap"]

A = TypeVar("A", bound=AsyncOpenAI)
S = TypeVar("S", bound=OpenAI)


class _Endpoint:
    """One ``create`` method of the async client: compacts, calls, records the usage."""

    def __init__(self, inner: Any, compactor: Compactor) -> None:
        self._inner = inner
        self._compactor = compactor

    async def _create(self, kwargs: dict[str, Any]) -> Any:
        return await send(self._compactor, self._inner.create, kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Completions(_Endpoint):
    @overload
    async def create(
        self, *, messages: Iterable[Mapping[str, Any]], stream: Literal[True], **kwargs: Any
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
        self, *, messages: Iterable[Mapping[str, Any]], stream: bool | None = None, **kwargs: Any
    ) -> ChatCompletion | ObservedStream[ChatCompletionChunk]:
        """``chat.completions.create`` with ``messages`` compacted; the SDK's own result."""
        if stream is not None:
            kwargs["stream"] = stream
        kwargs["messages"] = list(messages)
        return await self._create(kwargs)  # type: ignore[no-any-return]


class _Chat:
    def __init__(self, inner: Any, completions: Any) -> None:
        self._inner = inner
        self.completions = completions

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Responses(_Endpoint):
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
        return await self._create(kwargs)  # type: ignore[no-any-return]


class WrappedAsyncOpenAI(Generic[A]):
    """An ``AsyncOpenAI`` whose ``chat.completions`` and ``responses`` compact; everything
    else is the client's."""

    def __init__(self, client: A, manager: ContextManager) -> None:
        self.client = client
        self.manager = manager
        completions = _Completions(client.chat.completions, Compactor(manager, "openai-chat"))
        self.chat = _Chat(client.chat, completions)
        self.responses = _Responses(client.responses, Compactor(manager, "openai-responses"))

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


# ------------------------------------------------------------------- the blocking client


class _SyncEndpoint:
    def __init__(self, inner: Any, compactor: Compactor, loop: LoopThread) -> None:
        self._inner = inner
        self._compactor = compactor
        self._loop = loop

    def _create(self, kwargs: dict[str, Any]) -> Any:
        return send_blocking(self._loop, self._compactor, self._inner.create, kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _SyncCompletions(_SyncEndpoint):
    @overload
    def create(
        self, *, messages: Iterable[Mapping[str, Any]], stream: Literal[True], **kwargs: Any
    ) -> ObservedSyncStream[ChatCompletionChunk]: ...

    @overload
    def create(
        self,
        *,
        messages: Iterable[Mapping[str, Any]],
        stream: Literal[False] | None = None,
        **kwargs: Any,
    ) -> ChatCompletion: ...

    def create(
        self, *, messages: Iterable[Mapping[str, Any]], stream: bool | None = None, **kwargs: Any
    ) -> ChatCompletion | ObservedSyncStream[ChatCompletionChunk]:
        """``chat.completions.create`` with ``messages`` compacted; the SDK's own result."""
        if stream is not None:
            kwargs["stream"] = stream
        kwargs["messages"] = list(messages)
        return self._create(kwargs)  # type: ignore[no-any-return]


class _SyncResponses(_SyncEndpoint):
    @overload
    def create(
        self, *, stream: Literal[True], **kwargs: Any
    ) -> ObservedSyncStream[ResponseStreamEvent]: ...

    @overload
    def create(self, *, stream: Literal[False] | None = None, **kwargs: Any) -> Response: ...

    def create(
        self, *, stream: bool | None = None, **kwargs: Any
    ) -> Response | ObservedSyncStream[ResponseStreamEvent]:
        """``responses.create`` with ``input`` compacted; the SDK's own result."""
        if stream is not None:
            kwargs["stream"] = stream
        return self._create(kwargs)  # type: ignore[no-any-return]


class WrappedOpenAI(BlockingClient, Generic[S]):
    """An ``OpenAI`` whose ``chat.completions`` and ``responses`` compact; everything else is
    the client's. Use it in a ``with`` block or call `close`: it owns the manager's loop."""

    client: S

    def __init__(self, client: S, manager: ContextManager) -> None:
        super().__init__(client, manager)
        loop = self._loop
        chat = Compactor(manager, "openai-chat")
        self.chat = _Chat(client.chat, _SyncCompletions(client.chat.completions, chat, loop))
        responses = Compactor(manager, "openai-responses")
        self.responses = _SyncResponses(client.responses, responses, loop)


@overload
def wrap(client: A, manager: ContextManager) -> WrappedAsyncOpenAI[A]: ...


@overload
def wrap(client: S, manager: ContextManager) -> WrappedOpenAI[S]: ...


def wrap(client: A | S, manager: ContextManager) -> WrappedAsyncOpenAI[A] | WrappedOpenAI[S]:
    """A thin proxy of ``client`` (``AsyncOpenAI`` or ``OpenAI``) whose
    ``chat.completions.create`` and ``responses.create`` send the compacted view of the full
    history they are given and record usage."""
    if isinstance(client, AsyncOpenAI):
        return WrappedAsyncOpenAI(client, manager)
    if isinstance(client, OpenAI):
        return WrappedOpenAI(client, manager)
    raise TypeError(f"wrap() takes an openai.AsyncOpenAI or OpenAI, got {type(client).__name__}")
