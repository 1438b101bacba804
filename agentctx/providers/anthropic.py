"""`wrap` an ``anthropic`` client so ``messages.create`` / ``messages.stream`` send compacted views.

```python
client = wrap(anthropic.AsyncAnthropic(), manager)
resp = await client.messages.create(model=MODEL, max_tokens=4096, system=SYSTEM,
                                    tools=TOOLS, messages=history)   # full history, every time
history.append({"role": "assistant", "content": [b.to_dict() for b in resp.content]})
```

``messages`` is converted with `from_anthropic`, compacted with ``manager.prepare`` and sent
back with `to_anthropic`; when nothing new was decided the request bytes equal the previous
call's plus the new messages, so the provider's prompt cache keeps hitting. ``system``,
``tools`` and every other argument go through untouched. The response's usage is given to
``manager.observe``; ``stream=True`` returns the SDK stream wrapped so that its usage is
recorded when it has been read to the end, and ``messages.stream(...)`` works the same way.

With ``cache_breakpoints=True`` the wrapper also marks up to the API's four ``cache_control``
breakpoints, counting the caller's own (see `place_breakpoints`).

The blocking ``anthropic.Anthropic`` works the same way: ``with wrap(anthropic.Anthropic(),
manager) as client:`` runs the manager on an event loop of its own in a daemon thread (its
background summaries included) until the ``with`` block ends or ``client.close()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, Literal, Self, TypeVar, overload

from agentctx.errors import MissingExtraError
from agentctx.providers._blocking import BlockingClient, LoopThread
from agentctx.providers._convert import Compactor, place_breakpoints, send, send_blocking

try:
    from anthropic import Anthropic, AsyncAnthropic
except ImportError as exc:
    raise MissingExtraError("anthropic", exc.name, needed_by=__name__) from exc

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from types import TracebackType

    from anthropic.types import Message as SDKMessage
    from anthropic.types import RawMessageStreamEvent

    from agentctx.manager import ContextManager
    from agentctx.providers._stream import ObservedStream, ObservedSyncStream

__all__ = ["WrappedAnthropic", "WrappedAsyncAnthropic", "place_breakpoints", "wrap"]

A = TypeVar("A", bound=AsyncAnthropic)
S = TypeVar("S", bound=Anthropic)


def _record_snapshot(compactor: Compactor, stream: Any) -> None:
    snapshot = stream.current_message_snapshot
    if snapshot is not None and getattr(snapshot, "usage", None) is not None:
        compactor.record(snapshot)


class _StreamManager:
    """``messages.stream(...)``: prepares the view on entry, records the usage on a clean exit."""

    def __init__(self, inner: Any, compactor: Compactor, kwargs: dict[str, Any]) -> None:
        self._inner = inner
        self._compactor = compactor
        self._kwargs = kwargs
        self._cm: Any = None
        self._stream: Any = None

    async def __aenter__(self) -> Any:
        self._cm = self._inner.stream(**await self._compactor.request(self._kwargs))
        self._stream = await self._cm.__aenter__()
        return self._stream

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc_type is None:
                _record_snapshot(self._compactor, self._stream)
        finally:
            await self._cm.__aexit__(exc_type, exc, tb)


class _Messages:
    def __init__(self, inner: Any, compactor: Compactor) -> None:
        self._inner = inner
        self._compactor = compactor

    @overload
    async def create(
        self, *, messages: Iterable[Mapping[str, Any]], stream: Literal[True], **kwargs: Any
    ) -> ObservedStream[RawMessageStreamEvent]: ...

    @overload
    async def create(
        self,
        *,
        messages: Iterable[Mapping[str, Any]],
        stream: Literal[False] | None = None,
        **kwargs: Any,
    ) -> SDKMessage: ...

    async def create(
        self, *, messages: Iterable[Mapping[str, Any]], stream: bool | None = None, **kwargs: Any
    ) -> SDKMessage | ObservedStream[RawMessageStreamEvent]:
        """``messages.create`` with ``messages`` compacted; returns the SDK's own object
        (with ``stream=True``, its stream, which records the usage when read to the end)."""
        if stream is not None:
            kwargs["stream"] = stream
        kwargs["messages"] = list(messages)
        return await send(self._compactor, self._inner.create, kwargs)  # type: ignore[no-any-return]

    def stream(self, *, messages: Iterable[Mapping[str, Any]], **kwargs: Any) -> _StreamManager:
        """``async with client.messages.stream(messages=history, ...) as stream:``."""
        return _StreamManager(self._inner, self._compactor, {**kwargs, "messages": list(messages)})

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class WrappedAsyncAnthropic(Generic[A]):
    """An ``AsyncAnthropic`` whose ``messages`` compact; everything else is the client's."""

    def __init__(self, client: A, manager: ContextManager, *, cache_breakpoints: bool) -> None:
        self.client = client
        self.manager = manager
        compactor = Compactor(manager, "anthropic", cache_breakpoints=cache_breakpoints)
        self.messages = _Messages(client.messages, compactor)

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


class _SyncStreamManager:
    def __init__(
        self, inner: Any, compactor: Compactor, loop: LoopThread, kwargs: dict[str, Any]
    ) -> None:
        self._inner = inner
        self._compactor = compactor
        self._loop = loop
        self._kwargs = kwargs
        self._cm: Any = None
        self._stream: Any = None

    def __enter__(self) -> Any:
        self._cm = self._inner.stream(**self._loop.call(self._compactor.request, self._kwargs))
        self._stream = self._cm.__enter__()
        return self._stream

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc_type is None:
                self._loop.call(_record_snapshot, self._compactor, self._stream)
        finally:
            self._cm.__exit__(exc_type, exc, tb)


class _SyncMessages:
    def __init__(self, inner: Any, compactor: Compactor, loop: LoopThread) -> None:
        self._inner = inner
        self._compactor = compactor
        self._loop = loop

    @overload
    def create(
        self, *, messages: Iterable[Mapping[str, Any]], stream: Literal[True], **kwargs: Any
    ) -> ObservedSyncStream[RawMessageStreamEvent]: ...

    @overload
    def create(
        self,
        *,
        messages: Iterable[Mapping[str, Any]],
        stream: Literal[False] | None = None,
        **kwargs: Any,
    ) -> SDKMessage: ...

    def create(
        self, *, messages: Iterable[Mapping[str, Any]], stream: bool | None = None, **kwargs: Any
    ) -> SDKMessage | ObservedSyncStream[RawMessageStreamEvent]:
        """``messages.create`` with ``messages`` compacted (see `_Messages.create`)."""
        if stream is not None:
            kwargs["stream"] = stream
        kwargs["messages"] = list(messages)
        return send_blocking(self._loop, self._compactor, self._inner.create, kwargs)  # type: ignore[no-any-return]

    def stream(self, *, messages: Iterable[Mapping[str, Any]], **kwargs: Any) -> _SyncStreamManager:
        """``with client.messages.stream(messages=history, ...) as stream:``."""
        kwargs["messages"] = list(messages)
        return _SyncStreamManager(self._inner, self._compactor, self._loop, kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class WrappedAnthropic(BlockingClient, Generic[S]):
    """An ``Anthropic`` whose ``messages`` compact; everything else is the client's.

    Use it in a ``with`` block or call `close`: it owns the loop the manager runs on.
    """

    client: S

    def __init__(self, client: S, manager: ContextManager, *, cache_breakpoints: bool) -> None:
        super().__init__(client, manager)
        compactor = Compactor(manager, "anthropic", cache_breakpoints=cache_breakpoints)
        self.messages = _SyncMessages(client.messages, compactor, self._loop)


@overload
def wrap(
    client: A, manager: ContextManager, *, cache_breakpoints: bool = False
) -> WrappedAsyncAnthropic[A]: ...


@overload
def wrap(
    client: S, manager: ContextManager, *, cache_breakpoints: bool = False
) -> WrappedAnthropic[S]: ...


def wrap(
    client: A | S, manager: ContextManager, *, cache_breakpoints: bool = False
) -> WrappedAsyncAnthropic[A] | WrappedAnthropic[S]:
    """A thin proxy of ``client`` whose ``messages.create`` / ``messages.stream`` send the
    compacted view of the full history they are given and record usage in ``manager``.

    ``client`` is an ``AsyncAnthropic`` or an ``Anthropic``; ``cache_breakpoints=True``
    places ``cache_control`` breakpoints where they pay (see `place_breakpoints`).
    """
    if isinstance(client, AsyncAnthropic):
        return WrappedAsyncAnthropic(client, manager, cache_breakpoints=cache_breakpoints)
    if isinstance(client, Anthropic):
        return WrappedAnthropic(client, manager, cache_breakpoints=cache_breakpoints)
    raise TypeError(
        f"wrap() takes an anthropic.AsyncAnthropic or Anthropic, got {type(client).__name__}"
    )
