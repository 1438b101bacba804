"""`wrap` an ``anthropic.AsyncAnthropic`` client so ``messages.create`` sends compacted views.

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
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, Literal, Self, TypeVar, overload

from anthropic import AsyncAnthropic

from agentctx.adapters import (
    assemble_anthropic_stream,
    from_anthropic,
    message_from_anthropic_response,
    to_anthropic,
)
from agentctx.providers._stream import ObservedStream, event_dict

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from types import TracebackType

    from anthropic.types import Message as SDKMessage
    from anthropic.types import RawMessageStreamEvent

    from agentctx.manager import ContextManager

__all__ = ["WrappedAsyncAnthropic", "wrap"]

C = TypeVar("C", bound=AsyncAnthropic)


async def _view(manager: ContextManager, messages: Iterable[Mapping[str, Any]]) -> list[Any]:
    return to_anthropic(await manager.prepare(from_anthropic(list(messages))))


def _observe(manager: ContextManager, response: Mapping[str, Any]) -> None:
    usage = message_from_anthropic_response(response).usage
    if usage is not None:
        manager.observe(usage)


def _observe_events(manager: ContextManager, events: list[Mapping[str, Any]]) -> None:
    _observe(manager, assemble_anthropic_stream(events))


class _StreamManager:
    """``messages.stream(...)``: prepares the view on entry, records the usage on a clean exit."""

    def __init__(self, inner: Any, manager: ContextManager, messages: Any, kwargs: Any) -> None:
        self._inner = inner
        self._manager = manager
        self._messages = messages
        self._kwargs = kwargs
        self._cm: Any = None
        self._stream: Any = None

    async def __aenter__(self) -> Any:
        view = await _view(self._manager, self._messages)
        self._cm = self._inner.stream(messages=view, **self._kwargs)
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
                snapshot = self._stream.current_message_snapshot
                if snapshot is not None and getattr(snapshot, "usage", None) is not None:
                    _observe(self._manager, snapshot.to_dict())
        finally:
            await self._cm.__aexit__(exc_type, exc, tb)


class _Messages:
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
        self,
        *,
        messages: Iterable[Mapping[str, Any]],
        stream: bool | None = None,
        **kwargs: Any,
    ) -> SDKMessage | ObservedStream[RawMessageStreamEvent]:
        """``messages.create`` with ``messages`` compacted; returns the SDK's own object
        (with ``stream=True``, its stream, which records the usage when read to the end)."""
        view = await _view(self._manager, messages)
        if stream is not None:
            kwargs["stream"] = stream
        result = await self._inner.create(messages=view, **kwargs)
        if stream:
            manager = self._manager
            return ObservedStream(result, lambda events: _observe_events(manager, events))
        _observe(self._manager, event_dict(result))
        return result  # type: ignore[no-any-return]

    def stream(self, *, messages: Iterable[Mapping[str, Any]], **kwargs: Any) -> _StreamManager:
        """``async with client.messages.stream(messages=history, ...) as stream:``."""
        return _StreamManager(self._inner, self._manager, messages, kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class WrappedAsyncAnthropic(Generic[C]):
    """An ``AsyncAnthropic`` whose ``messages`` compact; everything else is the client's."""

    def __init__(self, client: C, manager: ContextManager) -> None:
        self.client = client
        self.manager = manager
        self.messages = _Messages(client.messages, manager)

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


def wrap(client: C, manager: ContextManager) -> WrappedAsyncAnthropic[C]:
    """A thin proxy of ``client`` whose ``messages.create`` / ``messages.stream`` send the
    compacted view of the full history they are given and record usage in ``manager``."""
    if not isinstance(client, AsyncAnthropic):
        raise TypeError(f"wrap() takes an anthropic.AsyncAnthropic, got {type(client).__name__}")
    return WrappedAsyncAnthropic(client, manager)
