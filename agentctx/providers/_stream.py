"""Hand every event of an SDK stream to a callback once the stream is complete.

`observe_stream` / `observe_sync_stream` return the SDK's own stream object (an
``AsyncStream`` / ``Stream``, so its type, ``response``, ``close`` and everything else are the
SDK's) with its event iterator wrapped: the SDK streams iterate ``self._iterator``, which the
SDK's own thread helpers wrap the same way. A stream without one (another SDK version, a test
double) gets the `ObservedStream` / `ObservedSyncStream` proxy instead.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

if TYPE_CHECKING:
    from types import TracebackType

T = TypeVar("T")

__all__ = [
    "ObservedStream",
    "ObservedSyncStream",
    "event_dict",
    "observe_stream",
    "observe_sync_stream",
    "reported_usage",
]

Done = Callable[[list[Mapping[str, Any]]], None]


def observe_stream(stream: Any, done: Done) -> Any:
    """``stream`` (an SDK ``AsyncStream``), calling ``done`` with every event's dict once it
    has been read to the end."""
    try:
        events = stream._iterator
    except AttributeError:
        return ObservedStream[Any](stream, done)
    stream._iterator = _observed_async(events, done)
    return stream


def observe_sync_stream(stream: Any, done: Done) -> Any:
    """`observe_stream` for a blocking SDK ``Stream``."""
    try:
        events = stream._iterator
    except AttributeError:
        return ObservedSyncStream[Any](stream, done)
    stream._iterator = _observed(events, done)
    return stream


async def _observed_async(events: AsyncIterator[Any], done: Done) -> AsyncIterator[Any]:
    seen: list[Mapping[str, Any]] = []
    async for event in events:
        seen.append(event_dict(event))
        yield event
    if seen:
        done(seen)


def _observed(events: Iterator[Any], done: Done) -> Iterator[Any]:
    seen: list[Mapping[str, Any]] = []
    for event in events:
        seen.append(event_dict(event))
        yield event
    if seen:
        done(seen)


def event_dict(event: object) -> Mapping[str, Any]:
    """The plain dict of one SDK object (a pydantic model with ``to_dict``)."""
    dump = getattr(event, "model_dump", None)
    if callable(dump) and callable(getattr(event, "to_dict", None)):
        # What ``to_dict()`` gives, without the serializer warnings of an event whose field
        # holds what its type did not expect (a list where text was): the SDK read it quietly.
        d = dump(by_alias=True, exclude_unset=True, warnings=False)
        if isinstance(d, Mapping):
            return d
    to_dict = getattr(event, "to_dict", None)
    if callable(to_dict):
        d = to_dict()
        if isinstance(d, Mapping):
            return d
    return event if isinstance(event, Mapping) else {}


def reported_usage(provider: str, events: list[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The usage a stream's events report, read without rebuilding the response: for a
    stream whose shape the assembler does not take (``None``: it reported none)."""
    if provider == "anthropic":
        return _anthropic_usage(events)
    found: Mapping[str, Any] | None = None
    for event in events:
        holder = event if provider == "openai-chat" else event.get("response")
        usage = holder.get("usage") if isinstance(holder, Mapping) else None
        if isinstance(usage, Mapping):
            found = usage  # the last report is the whole stream's
    return found


def _anthropic_usage(events: list[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """``message_start``'s usage updated by each ``message_delta``'s, as the SDK does."""
    usage: dict[str, Any] = {}
    for event in events:
        kind = event.get("type")
        holder = event.get("message") if kind == "message_start" else event
        part = holder.get("usage") if isinstance(holder, Mapping) else None
        if kind in ("message_start", "message_delta") and isinstance(part, Mapping):
            usage.update({k: v for k, v in part.items() if v is not None})
    return usage or None


class ObservedStream(Generic[T]):
    """Iterates an SDK ``AsyncStream`` unchanged; when it ends, calls ``done`` with every
    event's dict. Everything else (``response``, ``close``, ``async with``) is the stream's."""

    def __init__(self, stream: Any, done: Done) -> None:
        self._stream = stream
        self._done = done
        self._events: list[Mapping[str, Any]] = []
        self._iterator: AsyncIterator[T] | None = None

    def __aiter__(self) -> AsyncIterator[T]:
        return self

    async def __anext__(self) -> T:
        if self._iterator is None:
            self._iterator = self._stream.__aiter__()
        try:
            event: T = await self._iterator.__anext__()
        except StopAsyncIteration:
            events, self._events = self._events, []
            if events:
                self._done(events)
            raise
        self._events.append(event_dict(event))
        return event

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stream.close()

    async def close(self) -> None:
        await self._stream.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class ObservedSyncStream(Generic[T]):
    """`ObservedStream` for an SDK's blocking ``Stream``."""

    def __init__(self, stream: Any, done: Done) -> None:
        self._stream = stream
        self._done = done
        self._events: list[Mapping[str, Any]] = []
        self._iterator: Iterator[T] | None = None

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self._iterator is None:
            self._iterator = iter(self._stream)
        try:
            event: T = next(self._iterator)
        except StopIteration:
            events, self._events = self._events, []
            if events:
                self._done(events)
            raise
        self._events.append(event_dict(event))
        return event

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stream.close()

    def close(self) -> None:
        self._stream.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
