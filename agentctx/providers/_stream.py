"""SDK stream proxies that hand every event to a callback once the stream is complete."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

if TYPE_CHECKING:
    from types import TracebackType

T = TypeVar("T")

__all__ = ["ObservedStream", "ObservedSyncStream", "event_dict"]

Done = Callable[[list[Mapping[str, Any]]], None]


def event_dict(event: object) -> Mapping[str, Any]:
    """The plain dict of one SDK object (a pydantic model with ``to_dict``)."""
    to_dict = getattr(event, "to_dict", None)
    if callable(to_dict):
        d = to_dict()
        if isinstance(d, Mapping):
            return d
    return event if isinstance(event, Mapping) else {}


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
