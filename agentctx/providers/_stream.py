"""Hand every event of an SDK stream to a callback once the stream is complete.

Complete is the API's last event (Anthropic ``message_stop``, a Responses
``response.completed`` / ``incomplete`` / ``failed``, a Chat Completions chunk with the usage
and no choices), handed over once that event has been read and before the caller gets it (a
loop that stops at it, or a connection dropped right after it, records it all the same), or
else the end of the stream. Once only; a callback that raises is logged, never raised into
the caller's loop, which has every event already.

`observe_stream` / `observe_sync_stream` return the SDK's own stream object (an
``AsyncStream`` / ``Stream``, so its type, ``response``, ``close`` and everything else are the
SDK's) with its event iterator wrapped: the SDK streams iterate ``self._iterator``, which the
SDK's own thread helpers wrap the same way. A stream without one (another SDK version, a test
double) gets the `ObservedStream` / `ObservedSyncStream` proxy instead.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

from agentctx._log import log

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
    has been read to its last event (see the module docs)."""
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


_LAST_EVENTS = frozenset(
    {"message_stop", "response.completed", "response.incomplete", "response.failed"}
)


def _is_last(event: Mapping[str, Any]) -> bool:
    """Whether ``event`` is the last its API sends (a Chat Completions stream's is the chunk
    with the usage and no choices: servers that report usage in every chunk give choices)."""
    if event.get("type") in _LAST_EVENTS:
        return True
    return event.get("choices") == [] and isinstance(event.get("usage"), Mapping)


def _hand_over(done: Done, events: list[Mapping[str, Any]]) -> None:
    try:
        done(events)
    except Exception:  # every event was the caller's already: theirs is not to fail now
        log.exception("a stream's usage was not recorded")


class _Events:
    """The events of one stream so far, handed to ``done`` once: at the last event, or at
    the end for a stream that ends without one."""

    __slots__ = ("_done", "_seen")

    def __init__(self, done: Done) -> None:
        self._done: Done | None = done
        self._seen: list[Mapping[str, Any]] = []

    def add(self, event: object) -> None:
        if self._done is None:
            return
        d = event_dict(event)
        self._seen.append(d)
        if _is_last(d):
            self.end()

    def end(self) -> None:
        done, self._done = self._done, None
        if done is not None and self._seen:
            _hand_over(done, self._seen)


async def _observed_async(events: AsyncIterator[Any], done: Done) -> AsyncIterator[Any]:
    seen = _Events(done)
    async for event in events:
        seen.add(event)
        yield event
    seen.end()


def _observed(events: Iterator[Any], done: Done) -> Iterator[Any]:
    seen = _Events(done)
    for event in events:
        seen.add(event)
        yield event
    seen.end()


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
        self._events = _Events(done)
        self._iterator: AsyncIterator[T] | None = None

    def __aiter__(self) -> AsyncIterator[T]:
        return self

    async def __anext__(self) -> T:
        if self._iterator is None:
            self._iterator = self._stream.__aiter__()
        try:
            event: T = await self._iterator.__anext__()
        except StopAsyncIteration:
            self._events.end()
            raise
        self._events.add(event)
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
        self._events = _Events(done)
        self._iterator: Iterator[T] | None = None

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self._iterator is None:
            self._iterator = iter(self._stream)
        try:
            event: T = next(self._iterator)
        except StopIteration:
            self._events.end()
            raise
        self._events.add(event)
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
