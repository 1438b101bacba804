"""`wrap` an ``anthropic`` client so every call that carries the history sends a compacted view.

```python
client = wrap(anthropic.AsyncAnthropic(), manager)
resp = await client.messages.create(model=MODEL, max_tokens=4096, system=SYSTEM,
                                    tools=TOOLS, messages=history)   # full history, every time
history.append({"role": "assistant", "content": resp.content})
```

Covered, on ``AsyncAnthropic`` and ``Anthropic`` alike: ``messages.create`` (``stream=True``
too), ``messages.stream``, ``messages.parse``, ``messages.count_tokens`` and the same four on
``beta.messages``, plus ``beta.messages.tool_runner``, whose every request goes through the
wrapped ``beta.messages.create`` (the runner is made on the wrapped client, and runs without
a server-side message thread, which would hold the history where it cannot be compacted).
``count_tokens`` counts the compacted view, what the next call would send if it asks for
the output the last one did (before any, for none).

``messages`` is converted with `from_anthropic` (SDK objects in it, such as ``resp.content``
appended as it came, are taken as the dicts the SDK would send), compacted with
``manager.prepare`` and sent back with `to_anthropic`; when nothing new was decided the
request bytes equal the previous call's plus the new messages, so the prompt cache keeps
hitting. ``system``, ``tools`` and every other argument go through untouched; ``max_tokens``
also sets the output reserve of the call unless ``Budget.reserve_output`` was set. Usage is
given to ``manager.observe``; a stream (``stream=True`` gives the SDK's own ``AsyncStream``)
records it once its last event has been read. Every method returns the SDK's own type.

A request the provider refuses as longer than its context window (its ``BadRequestError``
says so) is observed (`ContextManager.observe`: the counts calibrate on the provider's
count), compacted again and sent once more; the error is raised when that cannot change the
view (the provider's window is below the budget's, say: a `CompactionWarning` says so).

Refused with `ConfigError`, as they would send the history uncompacted:
``messages.batches.create``, ``beta.messages.thread``, and ``with_raw_response`` /
``with_streaming_response`` (use the unwrapped ``wrapped.client`` for those).
``with_options`` / ``copy`` return a wrapped client on the same session; everything else
passes through.

With ``cache_breakpoints=True`` the wrapper also marks up to the API's four ``cache_control``
breakpoints, counting the caller's own (see `place_breakpoints`).

The blocking ``anthropic.Anthropic`` works the same way: ``with wrap(anthropic.Anthropic(),
manager) as client:`` runs the manager on an event loop of its own in a daemon thread (its
background summaries included) until the ``with`` block ends or ``client.close()``.
"""

from __future__ import annotations

import inspect
from typing import (
    TYPE_CHECKING,
    Any,
    Generic,
    Literal,
    NoReturn,
    Self,
    TypeAlias,
    TypeVar,
    overload,
)

from agentctx.errors import ConfigError, MissingExtraError
from agentctx.providers._blocking import BlockingClient, LoopThread
from agentctx.providers._convert import (
    Compactor,
    Guarded,
    Refused,
    Resource,
    StreamManager,
    SyncStreamManager,
    history_list,
    place_breakpoints,
    refuse,
    send,
    send_blocking,
)
from agentctx.providers._native import NativeChecked, check_native

try:
    from anthropic import Anthropic, AsyncAnthropic
except ImportError as exc:
    raise MissingExtraError("anthropic", exc.name, needed_by=__name__) from exc

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from types import TracebackType

    from anthropic import AsyncStream, Stream
    from anthropic.lib.streaming import (
        AsyncMessageStream,
        BetaAsyncMessageStream,
        BetaMessageStream,
        MessageStream,
    )
    from anthropic.lib.tools import (
        BetaAsyncStreamingToolRunner,
        BetaAsyncToolRunner,
        BetaStreamingToolRunner,
        BetaToolRunner,
    )
    from anthropic.types import Message as SDKMessage
    from anthropic.types import MessageTokensCount, ParsedMessage, RawMessageStreamEvent
    from anthropic.types.beta import (
        BetaMessage,
        BetaMessageTokensCount,
        BetaRawMessageStreamEvent,
    )
    from anthropic.types.beta.parsed_beta_message import ParsedBetaMessage

    from agentctx.manager import ContextManager

    History: TypeAlias = Iterable[Mapping[str, Any]]

__all__ = ["WrappedAnthropic", "WrappedAsyncAnthropic", "place_breakpoints", "wrap"]

A = TypeVar("A", bound=AsyncAnthropic)
S = TypeVar("S", bound=Anthropic)
T = TypeVar("T")

COVERED = (
    "messages.create / stream / parse / count_tokens, beta.messages.create / stream / parse / "
    "count_tokens / tool_runner"
)


def _unthreaded(tool_runner: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The runner's arguments without a server-side message thread: a threaded turn sends only
    the new messages and the server holds the rest, where nothing can compact it."""
    try:
        takes_thread = "thread" in inspect.signature(tool_runner).parameters
    except (TypeError, ValueError):
        takes_thread = False
    return {**kwargs, "thread": False} if takes_thread else kwargs


class _Resource(Resource):
    """What ``messages`` and ``beta.messages`` share, async and blocking: the refusals and the
    pass-through of everything else."""

    _what = "messages"
    _covered = COVERED

    @property
    def batches(self) -> Any:
        """The SDK's ``batches``; ``create`` is refused (a batch is sent uncompacted)."""
        what = f"{self._what}.batches"
        return Guarded(self._inner.batches, what, COVERED, frozenset({"create"}))


class _Messages(_Resource):
    """``AsyncAnthropic.messages``, compacting."""

    @overload
    async def create(
        self, *, messages: History, stream: Literal[True], **kwargs: Any
    ) -> AsyncStream[RawMessageStreamEvent]: ...

    @overload
    async def create(
        self, *, messages: History, stream: Literal[False] | None = None, **kwargs: Any
    ) -> SDKMessage: ...

    @overload
    async def create(
        self, *, messages: History, stream: bool, **kwargs: Any
    ) -> SDKMessage | AsyncStream[RawMessageStreamEvent]: ...

    async def create(
        self, *, messages: History, stream: bool | None = None, **kwargs: Any
    ) -> SDKMessage | AsyncStream[RawMessageStreamEvent]:
        """``messages.create`` with ``messages`` compacted; returns the SDK's own object
        (with ``stream=True``, its stream, which records the usage when read to the end)."""
        if stream is not None:
            kwargs["stream"] = stream
        kwargs["messages"] = history_list(messages)
        return await send(self._compactor, self._inner.create, kwargs)  # type: ignore[no-any-return]

    @overload
    async def parse(
        self, *, messages: History, output_format: type[T], **kwargs: Any
    ) -> ParsedMessage[T]: ...

    @overload
    async def parse(
        self, *, messages: History, output_format: None = None, **kwargs: Any
    ) -> ParsedMessage[None]: ...

    async def parse(self, *, messages: History, **kwargs: Any) -> ParsedMessage[Any]:
        """``messages.parse`` with ``messages`` compacted."""
        kwargs["messages"] = history_list(messages)
        return await send(self._compactor, self._inner.parse, kwargs)  # type: ignore[no-any-return]

    @overload
    def stream(
        self, *, messages: History, output_format: type[T], **kwargs: Any
    ) -> StreamManager[AsyncMessageStream[T]]: ...

    @overload
    def stream(
        self, *, messages: History, output_format: None = None, **kwargs: Any
    ) -> StreamManager[AsyncMessageStream[None]]: ...

    def stream(self, *, messages: History, **kwargs: Any) -> StreamManager[Any]:
        """``async with client.messages.stream(messages=history, ...) as stream:`` — the SDK's
        ``AsyncMessageStream``; compacts on entry, records the usage once read to the end."""
        kwargs["messages"] = history_list(messages)
        return StreamManager(self._inner.stream, self._compactor, kwargs)

    async def count_tokens(self, *, messages: History, **kwargs: Any) -> MessageTokensCount:
        """``messages.count_tokens`` of the compacted view: what ``create`` would send."""
        kwargs["messages"] = history_list(messages)
        sent = await self._compactor.request(kwargs, count=True)
        return await self._inner.count_tokens(**sent)  # type: ignore[no-any-return]


class _BetaMessages(_Resource):
    """``AsyncAnthropic.beta.messages``, compacting; ``tool_runner`` compacts every turn."""

    _what = "beta.messages"

    def __init__(self, inner: Any, compactor: Compactor, client: WrappedAsyncAnthropic[Any]):
        super().__init__(inner, compactor)
        self._client = client

    @overload
    async def create(
        self, *, messages: History, stream: Literal[True], **kwargs: Any
    ) -> AsyncStream[BetaRawMessageStreamEvent]: ...

    @overload
    async def create(
        self, *, messages: History, stream: Literal[False] | None = None, **kwargs: Any
    ) -> BetaMessage: ...

    @overload
    async def create(
        self, *, messages: History, stream: bool, **kwargs: Any
    ) -> BetaMessage | AsyncStream[BetaRawMessageStreamEvent]: ...

    async def create(
        self, *, messages: History, stream: bool | None = None, **kwargs: Any
    ) -> BetaMessage | AsyncStream[BetaRawMessageStreamEvent]:
        """``beta.messages.create`` with ``messages`` compacted (see `_Messages.create`)."""
        if stream is not None:
            kwargs["stream"] = stream
        kwargs["messages"] = history_list(messages)
        return await send(self._compactor, self._inner.create, kwargs)  # type: ignore[no-any-return]

    @overload
    async def parse(
        self, *, messages: History, output_format: type[T], **kwargs: Any
    ) -> ParsedBetaMessage[T]: ...

    @overload
    async def parse(
        self, *, messages: History, output_format: None = None, **kwargs: Any
    ) -> ParsedBetaMessage[None]: ...

    async def parse(self, *, messages: History, **kwargs: Any) -> ParsedBetaMessage[Any]:
        """``beta.messages.parse`` with ``messages`` compacted."""
        kwargs["messages"] = history_list(messages)
        return await send(self._compactor, self._inner.parse, kwargs)  # type: ignore[no-any-return]

    @overload
    def stream(
        self, *, messages: History, output_format: type[T], **kwargs: Any
    ) -> StreamManager[BetaAsyncMessageStream[T]]: ...

    @overload
    def stream(
        self, *, messages: History, output_format: None = None, **kwargs: Any
    ) -> StreamManager[BetaAsyncMessageStream[None]]: ...

    def stream(self, *, messages: History, **kwargs: Any) -> StreamManager[Any]:
        """``async with client.beta.messages.stream(...) as stream:`` (see `_Messages.stream`)."""
        kwargs["messages"] = history_list(messages)
        return StreamManager(self._inner.stream, self._compactor, kwargs)

    async def count_tokens(self, *, messages: History, **kwargs: Any) -> BetaMessageTokensCount:
        """``beta.messages.count_tokens`` of the compacted view: what ``create`` would send."""
        kwargs["messages"] = history_list(messages)
        sent = await self._compactor.request(kwargs, count=True)
        return await self._inner.count_tokens(**sent)  # type: ignore[no-any-return]

    @overload
    def tool_runner(
        self, *, stream: Literal[True], output_format: type[T], **kwargs: Any
    ) -> BetaAsyncStreamingToolRunner[T]: ...

    @overload
    def tool_runner(
        self, *, stream: Literal[True], output_format: None = None, **kwargs: Any
    ) -> BetaAsyncStreamingToolRunner[None]: ...

    @overload
    def tool_runner(
        self, *, output_format: type[T], stream: Literal[False] = False, **kwargs: Any
    ) -> BetaAsyncToolRunner[T]: ...

    @overload
    def tool_runner(
        self, *, output_format: None = None, stream: Literal[False] = False, **kwargs: Any
    ) -> BetaAsyncToolRunner[None]: ...

    def tool_runner(self, **kwargs: Any) -> Any:
        """The SDK's ``beta.messages.tool_runner`` on the wrapped client: each turn's request
        goes through the wrapped ``create``, so the history is compacted before every one."""
        resource = type(self._inner)(self._client)  # the SDK's resource, on the wrapped client
        return resource.tool_runner(**_unthreaded(self._inner.tool_runner, kwargs))

    def thread(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Refused: a message thread keeps the history on the server, out of agentctx's reach;
        use ``tool_runner`` or ``create`` with the full history."""
        refuse("beta.messages.thread", COVERED)


class _Beta:
    def __init__(self, inner: Any, messages: Any) -> None:
        self._inner = inner
        self.messages = messages

    @property
    def with_raw_response(self) -> Any:
        return Refused("beta.with_raw_response", COVERED)

    @property
    def with_streaming_response(self) -> Any:
        return Refused("beta.with_streaming_response", COVERED)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _AsyncBeta(_Beta):
    messages: _BetaMessages


class WrappedAsyncAnthropic(Generic[A]):
    """An ``AsyncAnthropic`` whose ``messages`` and ``beta.messages`` compact; calls that would
    send a history uncompacted are refused; everything else is the client's."""

    def __init__(
        self,
        client: A,
        manager: ContextManager,
        *,
        cache_breakpoints: bool,
        compactor: Compactor | None = None,
    ) -> None:
        self.client = client
        self.manager = manager
        self._compactor = compactor or NativeChecked(
            manager, "anthropic", cache_breakpoints=cache_breakpoints
        )
        self._cache_breakpoints = cache_breakpoints
        self.messages = _Messages(client.messages, self._compactor)
        self.beta = _AsyncBeta(
            client.beta, _BetaMessages(client.beta.messages, self._compactor, self)
        )

    def with_options(self, **options: Any) -> Self:
        """``client.with_options(...)``, wrapped, on the same session."""
        return type(self)(
            self.client.with_options(**options),
            self.manager,
            cache_breakpoints=self._cache_breakpoints,
            compactor=self._compactor,
        )

    copy = with_options

    @property
    def with_raw_response(self) -> Any:
        """Refused: use ``wrapped.client`` to send the history as it is."""
        return Refused("with_raw_response", COVERED)

    @property
    def with_streaming_response(self) -> Any:
        """Refused: use ``wrapped.client`` to send the history as it is."""
        return Refused("with_streaming_response", COVERED)

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


class _SyncResource(_Resource):
    def __init__(self, inner: Any, compactor: Compactor, loop: LoopThread) -> None:
        super().__init__(inner, compactor)
        self._loop = loop

    def _send(self, method: Any, kwargs: dict[str, Any]) -> Any:
        return send_blocking(self._loop, self._compactor, method, kwargs)

    def _count(self, kwargs: dict[str, Any]) -> Any:
        sent = self._loop.call(lambda: self._compactor.request(kwargs, count=True))
        return self._inner.count_tokens(**sent)


class _SyncMessages(_SyncResource):
    """``Anthropic.messages``, compacting (see `_Messages`)."""

    @overload
    def create(
        self, *, messages: History, stream: Literal[True], **kwargs: Any
    ) -> Stream[RawMessageStreamEvent]: ...

    @overload
    def create(
        self, *, messages: History, stream: Literal[False] | None = None, **kwargs: Any
    ) -> SDKMessage: ...

    @overload
    def create(
        self, *, messages: History, stream: bool, **kwargs: Any
    ) -> SDKMessage | Stream[RawMessageStreamEvent]: ...

    def create(
        self, *, messages: History, stream: bool | None = None, **kwargs: Any
    ) -> SDKMessage | Stream[RawMessageStreamEvent]:
        """``messages.create`` with ``messages`` compacted (see `_Messages.create`)."""
        if stream is not None:
            kwargs["stream"] = stream
        kwargs["messages"] = history_list(messages)
        return self._send(self._inner.create, kwargs)  # type: ignore[no-any-return]

    @overload
    def parse(
        self, *, messages: History, output_format: type[T], **kwargs: Any
    ) -> ParsedMessage[T]: ...

    @overload
    def parse(
        self, *, messages: History, output_format: None = None, **kwargs: Any
    ) -> ParsedMessage[None]: ...

    def parse(self, *, messages: History, **kwargs: Any) -> ParsedMessage[Any]:
        """``messages.parse`` with ``messages`` compacted."""
        kwargs["messages"] = history_list(messages)
        return self._send(self._inner.parse, kwargs)  # type: ignore[no-any-return]

    @overload
    def stream(
        self, *, messages: History, output_format: type[T], **kwargs: Any
    ) -> SyncStreamManager[MessageStream[T]]: ...

    @overload
    def stream(
        self, *, messages: History, output_format: None = None, **kwargs: Any
    ) -> SyncStreamManager[MessageStream[None]]: ...

    def stream(self, *, messages: History, **kwargs: Any) -> SyncStreamManager[Any]:
        """``with client.messages.stream(messages=history, ...) as stream:``."""
        kwargs["messages"] = history_list(messages)
        return SyncStreamManager(self._inner.stream, self._compactor, self._loop, kwargs)

    def count_tokens(self, *, messages: History, **kwargs: Any) -> MessageTokensCount:
        """``messages.count_tokens`` of the compacted view: what ``create`` would send."""
        kwargs["messages"] = history_list(messages)
        return self._count(kwargs)  # type: ignore[no-any-return]


class _SyncBetaMessages(_SyncResource):
    """``Anthropic.beta.messages``, compacting (see `_BetaMessages`)."""

    _what = "beta.messages"

    def __init__(
        self, inner: Any, compactor: Compactor, loop: LoopThread, client: WrappedAnthropic[Any]
    ) -> None:
        super().__init__(inner, compactor, loop)
        self._client = client

    @overload
    def create(
        self, *, messages: History, stream: Literal[True], **kwargs: Any
    ) -> Stream[BetaRawMessageStreamEvent]: ...

    @overload
    def create(
        self, *, messages: History, stream: Literal[False] | None = None, **kwargs: Any
    ) -> BetaMessage: ...

    @overload
    def create(
        self, *, messages: History, stream: bool, **kwargs: Any
    ) -> BetaMessage | Stream[BetaRawMessageStreamEvent]: ...

    def create(
        self, *, messages: History, stream: bool | None = None, **kwargs: Any
    ) -> BetaMessage | Stream[BetaRawMessageStreamEvent]:
        """``beta.messages.create`` with ``messages`` compacted."""
        if stream is not None:
            kwargs["stream"] = stream
        kwargs["messages"] = history_list(messages)
        return self._send(self._inner.create, kwargs)  # type: ignore[no-any-return]

    @overload
    def parse(
        self, *, messages: History, output_format: type[T], **kwargs: Any
    ) -> ParsedBetaMessage[T]: ...

    @overload
    def parse(
        self, *, messages: History, output_format: None = None, **kwargs: Any
    ) -> ParsedBetaMessage[None]: ...

    def parse(self, *, messages: History, **kwargs: Any) -> ParsedBetaMessage[Any]:
        """``beta.messages.parse`` with ``messages`` compacted."""
        kwargs["messages"] = history_list(messages)
        return self._send(self._inner.parse, kwargs)  # type: ignore[no-any-return]

    @overload
    def stream(
        self, *, messages: History, output_format: type[T], **kwargs: Any
    ) -> SyncStreamManager[BetaMessageStream[T]]: ...

    @overload
    def stream(
        self, *, messages: History, output_format: None = None, **kwargs: Any
    ) -> SyncStreamManager[BetaMessageStream[None]]: ...

    def stream(self, *, messages: History, **kwargs: Any) -> SyncStreamManager[Any]:
        """``with client.beta.messages.stream(messages=history, ...) as stream:``."""
        kwargs["messages"] = history_list(messages)
        return SyncStreamManager(self._inner.stream, self._compactor, self._loop, kwargs)

    def count_tokens(self, *, messages: History, **kwargs: Any) -> BetaMessageTokensCount:
        """``beta.messages.count_tokens`` of the compacted view: what ``create`` would send."""
        kwargs["messages"] = history_list(messages)
        return self._count(kwargs)  # type: ignore[no-any-return]

    @overload
    def tool_runner(
        self, *, stream: Literal[True], output_format: type[T], **kwargs: Any
    ) -> BetaStreamingToolRunner[T]: ...

    @overload
    def tool_runner(
        self, *, stream: Literal[True], output_format: None = None, **kwargs: Any
    ) -> BetaStreamingToolRunner[None]: ...

    @overload
    def tool_runner(
        self, *, output_format: type[T], stream: Literal[False] = False, **kwargs: Any
    ) -> BetaToolRunner[T]: ...

    @overload
    def tool_runner(
        self, *, output_format: None = None, stream: Literal[False] = False, **kwargs: Any
    ) -> BetaToolRunner[None]: ...

    def tool_runner(self, **kwargs: Any) -> Any:
        """The SDK's ``beta.messages.tool_runner`` on the wrapped client (see
        `_BetaMessages.tool_runner`)."""
        resource = type(self._inner)(self._client)
        return resource.tool_runner(**_unthreaded(self._inner.tool_runner, kwargs))

    def thread(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Refused (see `_BetaMessages.thread`)."""
        refuse("beta.messages.thread", COVERED)


class _SyncBeta(_Beta):
    messages: _SyncBetaMessages


class WrappedAnthropic(BlockingClient, Generic[S]):
    """An ``Anthropic`` whose ``messages`` and ``beta.messages`` compact; calls that would send
    a history uncompacted are refused; everything else is the client's.

    Use it in a ``with`` block or call `close`: it owns the loop the manager runs on.
    """

    client: S

    def __init__(
        self,
        client: S,
        manager: ContextManager,
        *,
        cache_breakpoints: bool,
        compactor: Compactor | None = None,
        loop: LoopThread | None = None,
    ) -> None:
        super().__init__(client, manager, loop)
        self._compactor = compactor or NativeChecked(
            manager, "anthropic", cache_breakpoints=cache_breakpoints
        )
        self._cache_breakpoints = cache_breakpoints
        self.messages = _SyncMessages(client.messages, self._compactor, self._loop)
        beta_messages = _SyncBetaMessages(client.beta.messages, self._compactor, self._loop, self)
        self.beta = _SyncBeta(client.beta, beta_messages)

    def with_options(self, **options: Any) -> Self:
        """``client.with_options(...)``, wrapped, on the same session and loop (closing it
        closes the copy, not the loop)."""
        return type(self)(
            self.client.with_options(**options),
            self.manager,
            cache_breakpoints=self._cache_breakpoints,
            compactor=self._compactor,
            loop=self._loop,
        )

    copy = with_options

    @property
    def with_raw_response(self) -> Any:
        """Refused: use ``wrapped.client`` to send the history as it is."""
        return Refused("with_raw_response", COVERED)

    @property
    def with_streaming_response(self) -> Any:
        """Refused: use ``wrapped.client`` to send the history as it is."""
        return Refused("with_streaming_response", COVERED)


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
    """A thin proxy of ``client`` whose calls that carry the history (``messages`` and
    ``beta.messages``: ``create``, ``stream``, ``parse``, ``count_tokens``, ``tool_runner``)
    send the compacted view of the full history they are given and record usage in
    ``manager``; the others that would send it uncompacted raise `ConfigError`.

    ``client`` is an ``AsyncAnthropic`` or an ``Anthropic``; ``cache_breakpoints=True``
    places ``cache_control`` breakpoints where they pay (see `place_breakpoints`).
    A ``manager`` that compacts with another API's native compaction (such as
    `OpenAICompactionSummarizer`) is refused with `ConfigError`.
    """
    if isinstance(client, AsyncAnthropic | Anthropic):
        check_native(manager, ("anthropic",))
    if isinstance(client, AsyncAnthropic):
        return WrappedAsyncAnthropic(client, manager, cache_breakpoints=cache_breakpoints)
    if isinstance(client, Anthropic):
        return WrappedAnthropic(client, manager, cache_breakpoints=cache_breakpoints)
    raise ConfigError(
        f"wrap() takes an anthropic.AsyncAnthropic or Anthropic, got {type(client).__name__}"
    )
