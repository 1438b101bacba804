"""Typed events, and the hub that delivers them without ever letting a subscriber reach the loop.

```python
async with ContextManager(...) as ctx:
    ctx.subscribe(lambda e: print(e.to_json()))          # callback, sync or async
    async for event in ctx.events():                    # or an async iterator
        if isinstance(event, ContextCompacted): ...
```

Every event has a frozen JSON shape (``to_json()``): ``{"type": "<camelCase name>", ...}`` with
camelCase fields. Token counts are ints, fractions are 0-1 floats, money is USD with unknown
as ``null``.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import logging
import math
import warnings
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, TypeAlias

import anyio

from agentctx._log import log, stdlib_logger
from agentctx.errors import ConfigError
from agentctx.messages import Usage

if TYPE_CHECKING:
    from anyio.abc import TaskGroup
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

__all__ = [
    "BudgetExceeded",
    "CompactionWarning",
    "ContextCompacted",
    "Event",
    "EventHub",
    "HistoryResynced",
    "StoreDegraded",
    "StoreRecovered",
    "Subscriber",
    "SubscriberWarning",
    "SummaryRejected",
    "SummaryStale",
    "SummaryStats",
    "TranscriptRepaired",
]


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def _json_value(value: Any) -> Any:
    if isinstance(value, Usage):
        return {
            "inputTokens": value.input_tokens,
            "outputTokens": value.output_tokens,
            "cacheReadTokens": value.cache_read_tokens,
            "cacheWriteTokens": value.cache_write_tokens,
        }
    if isinstance(value, SummaryStats):
        return _fields_json(value)
    if isinstance(value, tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _fields_json(obj: Any) -> dict[str, Any]:
    return {_camel(f.name): _json_value(getattr(obj, f.name)) for f in fields(obj)}


class _Event:
    __slots__ = ()

    def to_json(self) -> dict[str, Any]:
        """The event's frozen JSON shape."""
        name = type(self).__name__
        return {"type": name[0].lower() + name[1:], **_fields_json(self)}


@dataclass(frozen=True, slots=True)
class SummaryStats:
    """What one summarizer request cost, whether or not its briefing was used."""

    messages_summarized: int
    usage: Usage
    cost_usd: float | None
    model: str | None = None


@dataclass(frozen=True, slots=True)
class ContextCompacted(_Event):
    """A compaction changed the view.

    ``method`` is ``deterministic``, ``pipeline``, ``summarized`` or ``provider``; ``actions``
    says in a few words each what was done (``truncated read(path=a.py) 48213->9880 chars``);
    ``summary`` is set when a summarizer request was made, even if its briefing was not used.
    """

    method: str
    strategy: str
    messages_before: int
    messages_after: int
    tokens_before: int
    tokens_after: int
    decisions: int
    actions: tuple[str, ...] = ()
    summary: SummaryStats | None = None


@dataclass(frozen=True, slots=True)
class BudgetExceeded(_Event):
    """The view is over the hard budget and could not be brought under it without dropping
    the task, the latest user message or the newest complete turn."""

    tokens: int
    budget: int
    usage_fraction: float


@dataclass(frozen=True, slots=True)
class TranscriptRepaired(_Event):
    """The view was repaired so the provider accepts it (see `agentctx.boundaries.repair`).

    ``repairs`` are ``"<kind>@<raw index>[:<tool call id>]"`` strings, reported once each;
    a renamed duplicate tool-call id adds the new one: ``"duplicate_call_id@7:call_0->call_0-2"``.
    The kinds are those of `agentctx.boundaries.Repair`. During a call of a wrapped SDK
    client (`agentctx.providers`) the index is the one in the list the call was given
    (``messages``, or a Responses ``input``), leading system / developer messages counted; a
    message made of several items (a Responses assistant turn) is named by the first.
    """

    repairs: tuple[str, ...]


class _Naming:
    """How the repairs of one call name their messages, until its `naming_repairs` block
    ends (``None`` then: a task the call started keeps this object in its context, and must
    neither rename later repairs nor keep the call's map alive)."""

    __slots__ = ("item_of",)

    def __init__(self, item_of: Callable[[int], int]) -> None:
        self.item_of: Callable[[int], int] | None = item_of


# A context variable, not a manager attribute: calls of one session overlap (one waits for
# its turn while another's strategy awaits), and each task's repairs are its own call's.
_NAMING: contextvars.ContextVar[_Naming | None] = contextvars.ContextVar(
    "agentctx_repair_naming", default=None
)


@contextlib.contextmanager
def naming_repairs(item_of: Callable[[int], int]) -> Iterator[None]:
    """Within the block, the `TranscriptRepaired` events of this task's ``prepare`` name
    ``item_of(index)`` for each raw message index: how a provider wrapper has them name the
    caller's own list, which it converted to the messages the manager was given.

    ```python
    with naming_repairs(lambda i: offset + item_of(i)):
        view = await manager.prepare(messages)
    ```
    """
    naming = _Naming(item_of)
    token = _NAMING.set(naming)
    try:
        yield
    finally:
        naming.item_of = None
        _NAMING.reset(token)


def repaired_index(index: int) -> int:
    """The index a `TranscriptRepaired` names for raw message ``index`` (`naming_repairs`)."""
    naming = _NAMING.get()
    item_of = None if naming is None else naming.item_of
    return index if item_of is None else item_of(index)


@dataclass(frozen=True, slots=True)
class HistoryResynced(_Event):
    """The history passed in did not extend the known one (rewound or edited), or its new
    messages followed a raw tail the view had left out (results answering no call): the
    session resynchronized at ``index`` and dropped the decisions anchored after it."""

    index: int
    dropped_decisions: int


@dataclass(frozen=True, slots=True)
class SummaryRejected(_Event):
    """A summarizer request produced no usable briefing; nothing was spliced.

    ``reason`` is ``stop_reason`` (the model stopped on length, refusal or error), ``empty``,
    ``malformed`` (a required section is missing), ``failed`` (the request raised),
    ``timeout`` (the last attempt timed out), ``deadline`` (the overall deadline, backoff
    included, ran out) or ``too_large`` (the briefing is no shorter than the messages it
    would replace). ``summary`` carries the usage and cost when a response was billed
    (``messagesSummarized`` is then 0), ``None`` when no response arrived.
    """

    reason: str
    detail: str
    attempts: int
    summary: SummaryStats | None = None


@dataclass(frozen=True, slots=True)
class SummaryStale(_Event):
    """A finished briefing was discarded unspliced because it no longer fits the history.

    ``reason`` is ``history_changed`` (the history it summarized was rewound or edited),
    ``superseded`` (other compaction already replaced that part of the view), ``updated``
    (its update took its place), ``unused`` (the session ended before the briefing was
    needed) or ``handed_over`` (the session ended before it was needed, and its saved state
    hands it to the session's next worker, whose splice then costs nothing). ``summary``
    carries what the request cost (``messagesSummarized`` 0).
    """

    reason: str
    summary: SummaryStats | None = None


@dataclass(frozen=True, slots=True)
class CompactionWarning(_Event):
    """A strategy is configured or running in a way that makes it useless; said once.

    ``code`` is e.g. ``inert`` (no span can ever be summarized under these settings),
    ``losing_race`` (briefings keep arriving too late: use a faster summarizer),
    ``no_task_group`` (background work, recall store writes included, needs
    ``async with ContextManager(...)``), ``slow_close`` (background work ignored cancellation
    when the session closed: what it leaves is reported once it ends), ``strategy_close``
    (the strategy's ``close`` raised; the session closed all the same), ``recall_evicted``
    (a `MemoryRecallStore` too small for what open sessions reference evicted some of it) or
    ``implausible_usage`` (a usage report over the context window and over 4x the estimate
    of the view sent, left out of the calibration), ``prompt_refused`` (the provider refused
    a view as longer than its context window, and the counts were calibrated on its count;
    said each time), ``background_failed`` (a task started in the session's background work,
    a strategy's on ``ctx.tasks``, raised; the session goes on; said each time) or
    ``interrupted`` (a ``prepare`` ended
    with an exception, or was cancelled, after its strategy took decisions: they stay, and the
    next view shows them; said each time).
    """

    code: str
    message: str


@dataclass(frozen=True, slots=True)
class StoreDegraded(_Event):
    """The recall store did not take what compaction gave it; the agent goes on.

    ``reason`` is ``unavailable`` (a write failed or ran past its deadline: what was not
    written stays in memory and is retried with backoff; said once per outage, `StoreRecovered`
    follows), ``overflow`` (the memory kept for unwritten entries is full: the oldest of them,
    ``lost``, were dropped; a recall of them says the store was unavailable), ``closed``
    (the session closed before the store took ``lost``, when ``ledger_unsaved`` its latest
    ledger, or the end of the session, which releases what it kept: a `RedisRecallStore`'s
    entries then keep no expiry) or ``missing`` (a recall found the store without ``lost``,
    an entry it had been given and the session still names: a server restarted empty, an
    eviction; said once per entry, and the model is told). ``store`` is the store's type,
    ``detail`` the error; ``pending_entries`` and ``pending_bytes`` what is still waiting to
    be written.
    """

    reason: str
    store: str
    detail: str
    pending_entries: int
    pending_bytes: int
    ledger_unsaved: bool
    lost: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class StoreRecovered(_Event):
    """The recall store took writes again after `StoreDegraded` ``unavailable``, everything
    kept in the meantime included; ``seconds`` is how long the outage lasted."""

    store: str
    seconds: float


Event: TypeAlias = (
    ContextCompacted
    | BudgetExceeded
    | TranscriptRepaired
    | HistoryResynced
    | SummaryRejected
    | SummaryStale
    | CompactionWarning
    | StoreDegraded
    | StoreRecovered
)
Subscriber: TypeAlias = Callable[[Event], None | Awaitable[None]]


class SubscriberWarning(RuntimeWarning):
    """An event subscriber raised; the loop went on. Issued once per subscriber."""


# The hub whose async callback the current task runs (see `EventHub.runs_callback`).
_CALLBACK_OF: contextvars.ContextVar[EventHub | None] = contextvars.ContextVar(
    "agentctx_callback_of", default=None
)


class EventHub:
    """Fans events out to callbacks and iterators; nothing a subscriber does reaches the emitter.

    Sync callbacks run inline and must be quick; async callbacks run as tasks in the owning
    task group. Iterators get a bounded buffer; when a reader falls that far behind, further
    events for it are dropped and logged.
    """

    def __init__(self, buffer: int = 1024) -> None:
        self._callbacks: list[Subscriber] = []
        self._streams: list[MemoryObjectSendStream[Event]] = []
        self._buffer = buffer
        self._tasks: TaskGroup | None = None
        self._held: list[tuple[Awaitable[None], Subscriber]] | None = None
        self._warned: set[int] = set()
        self.closed = False

    def bind(self, tasks: TaskGroup | None) -> None:
        """Run async callbacks in ``tasks`` (the manager's task group); ``None`` unbinds."""
        self._tasks = tasks

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call ``callback`` with every event; returns a function that unsubscribes it.
        Raises `ConfigError` for what is not callable, and for a generator function, which
        calling would never run."""
        if not callable(callback):
            raise ConfigError(
                f"an event subscriber must be a function or an async function; got "
                f"{type(callback).__name__} {callback!r:.80}"
            )
        if inspect.isasyncgenfunction(callback) or inspect.isgeneratorfunction(callback):
            raise ConfigError(
                f"an event subscriber must be a function or an async function; got the "
                f"generator function {callback!r}, whose body calling it would never run"
            )
        self._callbacks.append(callback)
        return lambda: self._callbacks.remove(callback) if callback in self._callbacks else None

    def stream(self) -> AsyncIterator[Event]:
        """Iterate over events emitted from this call on (not from the first read), until
        the hub closes (at once on a closed hub). An iterator dropped unread stops
        buffering."""
        send, receive = anyio.create_memory_object_stream[Event](self._buffer)
        iterator = self._iterate(send, receive)
        if self.closed:
            send.close()
        else:
            self._streams.append(send)
        # A generator never started runs no ``finally``: this ends its streams instead.
        weakref.finalize(iterator, self._forget, send, receive)
        return iterator

    def _forget(
        self, send: MemoryObjectSendStream[Event], receive: MemoryObjectReceiveStream[Event]
    ) -> None:
        if send in self._streams:
            self._streams.remove(send)
        send.close()
        receive.close()

    async def _iterate(
        self, send: MemoryObjectSendStream[Event], receive: MemoryObjectReceiveStream[Event]
    ) -> AsyncIterator[Event]:
        try:
            async with receive:
                async for event in receive:
                    yield event
        finally:
            if send in self._streams:
                self._streams.remove(send)
            send.close()

    def emit(self, event: Event) -> None:
        """Deliver ``event`` to every subscriber; never raises for what a subscriber does.
        What is no event (an agentctx event, or one of a strategy's own with a ``to_json``
        method, as agentctx's have: a string, a dict, ``None``) is `ConfigError`."""
        if not isinstance(event, _Event) and not callable(getattr(event, "to_json", None)):
            raise ConfigError(
                "emit() takes an event (agentctx.events, or one with a to_json() method); got "
                + type(event).__name__
            )
        if stdlib_logger.isEnabledFor(logging.DEBUG):
            try:
                log.debug(type(event).__name__, **event.to_json())
            except Exception:  # a strategy's own event, whose JSON has keys of its own
                log.debug(type(event).__name__)
        for callback in list(self._callbacks):
            try:
                result = callback(event)
            except Exception as e:
                self._subscriber_failed(callback, e)
                continue
            if inspect.isawaitable(result):
                self._run_later(result, callback)
        for send in list(self._streams):
            try:
                send.send_nowait(event)
            except anyio.WouldBlock:
                log.warning("event iterator is full; event dropped", dropped=type(event).__name__)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._streams.remove(send)

    def _run_later(self, awaitable: Awaitable[None], callback: Subscriber) -> None:
        if self._held is not None:
            self._held.append((awaitable, callback))
            return
        if self._tasks is not None:
            try:
                self._tasks.start_soon(self._run_async, awaitable, callback)
                return
            except RuntimeError:  # the group is closing; handled below
                pass
        if inspect.iscoroutine(awaitable):
            awaitable.close()
        log.error("async subscriber needs `async with ContextManager(...)`")
        self._warn_once(
            callback,
            f"agentctx async event subscriber {callback!r} is not run: the manager is not "
            "entered (`async with ContextManager(...)`), so its events are dropped",
        )

    def collect_async(self) -> None:
        """Hold async callbacks from now on, for `drain` (the manager does this on close,
        when its task group is gone)."""
        if self._held is None:
            self._held = []

    async def drain(self) -> None:
        """Run the async callbacks held since `collect_async`, in order."""
        while self._held:
            awaitable, callback = self._held.pop(0)
            await self._run_async(awaitable, callback)

    async def _run_async(self, awaitable: Awaitable[None], callback: Subscriber) -> None:
        running = _CALLBACK_OF.set(self)
        try:
            await awaitable
        except Exception as e:
            self._subscriber_failed(callback, e)
        finally:
            _CALLBACK_OF.reset(running)

    def runs_callback(self) -> bool:
        """Whether the calling code runs inside one of this hub's async callbacks (a task of
        the group it is bound to, when not draining)."""
        return _CALLBACK_OF.get() is self

    def _subscriber_failed(self, callback: Subscriber, error: Exception) -> None:
        """Log every failure; warn once per subscriber, so it is seen without logging set up
        (the library's logger has only a NullHandler)."""
        log.error("event subscriber raised", subscriber=repr(callback), exc_info=error)
        self._warn_once(
            callback,
            f"agentctx event subscriber {callback!r} raised {type(error).__name__}: {error} "
            "(further failures of it are only logged)",
        )

    def _warn_once(self, callback: Subscriber, message: str) -> None:
        key = id(callback)
        if key not in self._warned:
            self._warned.add(key)
            # Warnings made errors (python -W error) still never reach the loop.
            with contextlib.suppress(Warning):
                warnings.warn(message, SubscriberWarning, stacklevel=3)

    def close(self) -> None:
        """End every iterator; async callbacks still held are dropped."""
        self.closed = True
        for awaitable, _ in self._held or ():
            if inspect.iscoroutine(awaitable):
                awaitable.close()
        self._held = None
        for send in self._streams:
            send.close()
        self._streams.clear()
