"""An SDK stream proxy that hands every event to a callback once the stream is complete."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

if TYPE_CHECKING:
    from types import TracebackType

T = TypeVar("T")

__all__ = ["ObservedStream", "event_dict"]


def event_dict(event: object) -> Mapping[str, Any]:
    """The plain dict of one SDK stream event (a pydantic model with ``to_dict``)."""
    to_dict = getattr(event, "to_dict", None)
    if callable(to_dict):
        d = to_dict()
        if isinstance(d, Mapping):
            return d
    return event if isinstance(event, Mapping) else {}


class ObservedStream(Generic[T]):
    """Iterates ``stream`` unchanged; when it ends, calls ``done`` with every event's dict.

    Everything else (``response``, ``close``, ``async with``) is the SDK stream's own.
    """

    def __init__(self, stream: Any, done: Callable[[list[Mapping[str, Any]]], None]) -> None:
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
