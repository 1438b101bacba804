"""`wrap` an ``openai`` client so every call that carries the history sends a compacted view.

```python
client = wrap(openai.AsyncOpenAI(), manager)
resp = await client.responses.create(model=MODEL, tools=TOOLS, input=items)  # full history
items += resp.output
```

Covered, on ``AsyncOpenAI`` and ``OpenAI`` alike: ``chat.completions.create`` (``stream=True``
too), ``chat.completions.parse`` and ``chat.completions.stream``; ``responses.create``
(``stream=True`` too), ``responses.parse``, ``responses.stream`` and
``responses.input_tokens.count``, which counts the compacted view, what the next call would
send if it asks for the output the last one did (before any, for none). Every method
returns the SDK's own type.

Leading ``system`` / ``developer`` messages (or Responses message items) are split off and
sent untouched; the rest (SDK objects in it, such as a ``ChatCompletionMessage`` or
``resp.output`` items, taken as the dicts the SDK would send) is converted to neutral
messages, compacted with ``manager.prepare`` and converted back, so when nothing new was
decided the request is the previous one plus the new messages. Every other argument goes
through untouched; ``max_completion_tokens`` / ``max_tokens`` / ``max_output_tokens`` also
set the output reserve of the call unless ``Budget.reserve_output`` was set. Usage is given to
``manager.observe``; a stream records it once its last event has been read. A Chat
Completions stream is sent with ``stream_options={"include_usage": True}`` merged into the
caller's (the API reports streamed usage only then; its last chunk has no ``choices``).

A request the provider refuses as longer than its context window (its ``BadRequestError``
says so) is observed (`ContextManager.observe`: the counts calibrate on the provider's
count), compacted again and sent once more; the error is raised when that cannot change the
view (the provider's window is below the budget's, say: a `CompactionWarning` says so).

A Responses call that continues server-side state (``previous_response_id`` or
``conversation``) holds only the new items, so it is sent as it is, and so is a string
``input``; the usage of either is added to the session's spend, not calibrated on (it counts no
view of the session's).

Refused with `ConfigError`, as they would send the history uncompacted: ``responses.compact``,
``responses.connect`` (the WebSocket), ``beta.chat`` and ``beta.responses``, and
``with_raw_response`` / ``with_streaming_response`` (use the unwrapped ``wrapped.client``
for those). ``with_options`` / ``copy`` return a wrapped client on the same session;
everything else passes through.

The blocking ``openai.OpenAI`` works the same way: ``with wrap(openai.OpenAI(), manager) as
client:`` runs the manager on an event loop of its own in a daemon thread (its background
summaries included) until the ``with`` block ends or ``client.close()``.
"""

from __future__ import annotations

from collections.abc import Mapping
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
    refuse,
    send,
    send_blocking,
)
from agentctx.providers._native import NativeChecked, check_native

try:
    from openai import AsyncOpenAI, OpenAI
except ImportError as exc:
    raise MissingExtraError("openai", exc.name, needed_by=__name__) from exc

if TYPE_CHECKING:
    from collections.abc import Iterable
    from types import TracebackType

    from openai import AsyncStream, Stream
    from openai.lib.streaming.chat import AsyncChatCompletionStream, ChatCompletionStream
    from openai.lib.streaming.responses import AsyncResponseStream, ResponseStream
    from openai.types.chat import ChatCompletion, ChatCompletionChunk, ParsedChatCompletion
    from openai.types.responses import (
        InputTokenCountResponse,
        ParsedResponse,
        Response,
        ResponseStreamEvent,
    )

    from agentctx.manager import ContextManager

    History: TypeAlias = Iterable[Mapping[str, Any]]

__all__ = ["WrappedAsyncOpenAI", "WrappedOpenAI", "wrap"]

A = TypeVar("A", bound=AsyncOpenAI)
S = TypeVar("S", bound=OpenAI)
T = TypeVar("T")

COVERED = (
    "chat.completions.create / parse / stream, responses.create / parse / stream / "
    "input_tokens.count"
)


class _HistoryResources:
    """The client's other resources whose calls send a history, with those calls refused:
    ``decisions.create`` (a Responses input), ``conversations.create`` and
    ``conversations.items.create`` (items), and ``beta.threads`` (Assistants messages)."""

    client: Any

    @property
    def decisions(self) -> Any:
        return Guarded(self.client.decisions, "decisions", COVERED, frozenset({"create"}))

    @property
    def conversations(self) -> Any:
        refused = frozenset({"create", "items.create"})
        return Guarded(self.client.conversations, "conversations", COVERED, refused)


def _with_usage(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Chat Completions reports a stream's usage only when asked; the session needs it."""
    options = kwargs.get("stream_options")
    kwargs["stream_options"] = {
        **(options if isinstance(options, Mapping) else {}),
        "include_usage": True,
    }
    return kwargs


class _Resource(Resource):
    _covered = COVERED


class _Completions(_Resource):
    """``AsyncOpenAI.chat.completions``, compacting."""

    _what = "chat.completions"

    @overload
    async def create(
        self, *, messages: History, stream: Literal[True], **kwargs: Any
    ) -> AsyncStream[ChatCompletionChunk]: ...

    @overload
    async def create(
        self, *, messages: History, stream: Literal[False] | None = None, **kwargs: Any
    ) -> ChatCompletion: ...

    @overload
    async def create(
        self, *, messages: History, stream: bool, **kwargs: Any
    ) -> ChatCompletion | AsyncStream[ChatCompletionChunk]: ...

    async def create(
        self, *, messages: History, stream: bool | None = None, **kwargs: Any
    ) -> ChatCompletion | AsyncStream[ChatCompletionChunk]:
        """``chat.completions.create`` with ``messages`` compacted; the SDK's own result (a
        stream asks for ``include_usage`` and records the usage once read to the end)."""
        if stream is not None:
            kwargs["stream"] = stream
        if stream:
            _with_usage(kwargs)
        kwargs["messages"] = history_list(messages)
        return await send(self._compactor, self._inner.create, kwargs)  # type: ignore[no-any-return]

    @overload
    async def parse(
        self, *, messages: History, response_format: type[T], **kwargs: Any
    ) -> ParsedChatCompletion[T]: ...

    @overload
    async def parse(
        self, *, messages: History, response_format: None = None, **kwargs: Any
    ) -> ParsedChatCompletion[None]: ...

    async def parse(self, *, messages: History, **kwargs: Any) -> ParsedChatCompletion[Any]:
        """``chat.completions.parse`` with ``messages`` compacted."""
        kwargs["messages"] = history_list(messages)
        return await send(self._compactor, self._inner.parse, kwargs)  # type: ignore[no-any-return]

    @overload
    def stream(
        self, *, messages: History, response_format: type[T], **kwargs: Any
    ) -> StreamManager[AsyncChatCompletionStream[T]]: ...

    @overload
    def stream(
        self, *, messages: History, response_format: None = None, **kwargs: Any
    ) -> StreamManager[AsyncChatCompletionStream[None]]: ...

    def stream(self, *, messages: History, **kwargs: Any) -> StreamManager[Any]:
        """``async with client.chat.completions.stream(messages=history, ...) as stream:`` —
        the SDK's ``AsyncChatCompletionStream``; compacts on entry, asks for
        ``include_usage`` and records the usage once read to the end."""
        kwargs["messages"] = history_list(messages)
        return StreamManager(self._inner.stream, self._compactor, _with_usage(kwargs))


class _Chat:
    def __init__(self, inner: Any, completions: Any) -> None:
        self._inner = inner
        self.completions = completions

    @property
    def with_raw_response(self) -> Any:
        return Refused("chat.with_raw_response", COVERED)

    @property
    def with_streaming_response(self) -> Any:
        return Refused("chat.with_streaming_response", COVERED)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _AsyncChat(_Chat):
    completions: _Completions


class _InputTokens(_Resource):
    """``AsyncOpenAI.responses.input_tokens``: ``count`` counts the compacted view."""

    _what = "responses.input_tokens"

    async def count(self, **kwargs: Any) -> InputTokenCountResponse:
        """``responses.input_tokens.count`` of the compacted ``input``: what ``create`` would
        send."""
        sent = await self._compactor.request(kwargs, count=True)
        return await self._inner.count(**sent)  # type: ignore[no-any-return]


class _Responses(_Resource):
    """``AsyncOpenAI.responses``, compacting."""

    _what = "responses"

    def __init__(self, inner: Any, compactor: Compactor) -> None:
        super().__init__(inner, compactor)
        self.input_tokens = _InputTokens(inner.input_tokens, compactor)

    @overload
    async def create(
        self, *, stream: Literal[True], **kwargs: Any
    ) -> AsyncStream[ResponseStreamEvent]: ...

    @overload
    async def create(self, *, stream: Literal[False] | None = None, **kwargs: Any) -> Response: ...

    @overload
    async def create(
        self, *, stream: bool, **kwargs: Any
    ) -> Response | AsyncStream[ResponseStreamEvent]: ...

    async def create(
        self, *, stream: bool | None = None, **kwargs: Any
    ) -> Response | AsyncStream[ResponseStreamEvent]:
        """``responses.create`` with ``input`` compacted; the SDK's own result."""
        if stream is not None:
            kwargs["stream"] = stream
        return await send(self._compactor, self._inner.create, kwargs)  # type: ignore[no-any-return]

    @overload
    async def parse(self, *, text_format: type[T], **kwargs: Any) -> ParsedResponse[T]: ...

    @overload
    async def parse(self, *, text_format: None = None, **kwargs: Any) -> ParsedResponse[None]: ...

    async def parse(self, **kwargs: Any) -> ParsedResponse[Any]:
        """``responses.parse`` with ``input`` compacted."""
        return await send(self._compactor, self._inner.parse, kwargs)  # type: ignore[no-any-return]

    @overload
    def stream(
        self, *, text_format: type[T], **kwargs: Any
    ) -> StreamManager[AsyncResponseStream[T]]: ...

    @overload
    def stream(
        self, *, text_format: None = None, **kwargs: Any
    ) -> StreamManager[AsyncResponseStream[None]]: ...

    def stream(self, **kwargs: Any) -> StreamManager[Any]:
        """``async with client.responses.stream(input=items, ...) as stream:`` — the SDK's
        ``AsyncResponseStream``; compacts on entry, records the usage once read to the end.
        ``stream(response_id=...)`` (resuming a background response) sends no history."""
        return StreamManager(self._inner.stream, self._compactor, kwargs)

    def compact(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Refused: it sends the history for the server to compact, uncompacted by agentctx."""
        refuse("responses.compact", COVERED)

    def connect(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Refused: a WebSocket session sends its history past the wrapper."""
        refuse("responses.connect", COVERED)


class _Beta:
    """``client.beta`` with its history-carrying ``chat``, ``responses`` and ``threads``
    refused."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    @property
    def chat(self) -> Any:
        return Refused("beta.chat", COVERED)

    @property
    def responses(self) -> Any:
        return Refused("beta.responses", COVERED)

    @property
    def threads(self) -> Any:
        return Refused("beta.threads", COVERED)

    @property
    def with_raw_response(self) -> Any:
        return Refused("beta.with_raw_response", COVERED)

    @property
    def with_streaming_response(self) -> Any:
        return Refused("beta.with_streaming_response", COVERED)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Compactors:
    """The two formats' compactors of one wrapped client, shared by its ``with_options``
    copies."""

    def __init__(self, manager: ContextManager) -> None:
        self.chat = NativeChecked(manager, "openai-chat")
        self.responses = NativeChecked(manager, "openai-responses")


class WrappedAsyncOpenAI(_HistoryResources, Generic[A]):
    """An ``AsyncOpenAI`` whose ``chat.completions`` and ``responses`` compact; calls that
    would send a history uncompacted are refused; everything else is the client's."""

    def __init__(
        self, client: A, manager: ContextManager, *, compactors: _Compactors | None = None
    ) -> None:
        self.client = client
        self.manager = manager
        self._compactors = compactors or _Compactors(manager)
        completions = _Completions(client.chat.completions, self._compactors.chat)
        self.chat = _AsyncChat(client.chat, completions)
        self.responses = _Responses(client.responses, self._compactors.responses)
        self.beta = _Beta(client.beta)

    def with_options(self, **options: Any) -> Self:
        """``client.with_options(...)``, wrapped, on the same session."""
        return type(self)(
            self.client.with_options(**options), self.manager, compactors=self._compactors
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


class _SyncCompletions(_SyncResource):
    """``OpenAI.chat.completions``, compacting (see `_Completions`)."""

    _what = "chat.completions"

    @overload
    def create(
        self, *, messages: History, stream: Literal[True], **kwargs: Any
    ) -> Stream[ChatCompletionChunk]: ...

    @overload
    def create(
        self, *, messages: History, stream: Literal[False] | None = None, **kwargs: Any
    ) -> ChatCompletion: ...

    @overload
    def create(
        self, *, messages: History, stream: bool, **kwargs: Any
    ) -> ChatCompletion | Stream[ChatCompletionChunk]: ...

    def create(
        self, *, messages: History, stream: bool | None = None, **kwargs: Any
    ) -> ChatCompletion | Stream[ChatCompletionChunk]:
        """``chat.completions.create`` with ``messages`` compacted (see `_Completions.create`)."""
        if stream is not None:
            kwargs["stream"] = stream
        if stream:
            _with_usage(kwargs)
        kwargs["messages"] = history_list(messages)
        return self._send(self._inner.create, kwargs)  # type: ignore[no-any-return]

    @overload
    def parse(
        self, *, messages: History, response_format: type[T], **kwargs: Any
    ) -> ParsedChatCompletion[T]: ...

    @overload
    def parse(
        self, *, messages: History, response_format: None = None, **kwargs: Any
    ) -> ParsedChatCompletion[None]: ...

    def parse(self, *, messages: History, **kwargs: Any) -> ParsedChatCompletion[Any]:
        """``chat.completions.parse`` with ``messages`` compacted."""
        kwargs["messages"] = history_list(messages)
        return self._send(self._inner.parse, kwargs)  # type: ignore[no-any-return]

    @overload
    def stream(
        self, *, messages: History, response_format: type[T], **kwargs: Any
    ) -> SyncStreamManager[ChatCompletionStream[T]]: ...

    @overload
    def stream(
        self, *, messages: History, response_format: None = None, **kwargs: Any
    ) -> SyncStreamManager[ChatCompletionStream[None]]: ...

    def stream(self, *, messages: History, **kwargs: Any) -> SyncStreamManager[Any]:
        """``with client.chat.completions.stream(messages=history, ...) as stream:`` (see
        `_Completions.stream`)."""
        kwargs["messages"] = history_list(messages)
        return SyncStreamManager(
            self._inner.stream, self._compactor, self._loop, _with_usage(kwargs)
        )


class _SyncChat(_Chat):
    completions: _SyncCompletions


class _SyncInputTokens(_SyncResource):
    """``OpenAI.responses.input_tokens``: ``count`` counts the compacted view."""

    _what = "responses.input_tokens"

    def count(self, **kwargs: Any) -> InputTokenCountResponse:
        """``responses.input_tokens.count`` of the compacted ``input``."""
        sent = self._loop.call(lambda: self._compactor.request(kwargs, count=True))
        return self._inner.count(**sent)  # type: ignore[no-any-return]


class _SyncResponses(_SyncResource):
    """``OpenAI.responses``, compacting (see `_Responses`)."""

    _what = "responses"

    def __init__(self, inner: Any, compactor: Compactor, loop: LoopThread) -> None:
        super().__init__(inner, compactor, loop)
        self.input_tokens = _SyncInputTokens(inner.input_tokens, compactor, loop)

    @overload
    def create(self, *, stream: Literal[True], **kwargs: Any) -> Stream[ResponseStreamEvent]: ...

    @overload
    def create(self, *, stream: Literal[False] | None = None, **kwargs: Any) -> Response: ...

    @overload
    def create(self, *, stream: bool, **kwargs: Any) -> Response | Stream[ResponseStreamEvent]: ...

    def create(
        self, *, stream: bool | None = None, **kwargs: Any
    ) -> Response | Stream[ResponseStreamEvent]:
        """``responses.create`` with ``input`` compacted; the SDK's own result."""
        if stream is not None:
            kwargs["stream"] = stream
        return self._send(self._inner.create, kwargs)  # type: ignore[no-any-return]

    @overload
    def parse(self, *, text_format: type[T], **kwargs: Any) -> ParsedResponse[T]: ...

    @overload
    def parse(self, *, text_format: None = None, **kwargs: Any) -> ParsedResponse[None]: ...

    def parse(self, **kwargs: Any) -> ParsedResponse[Any]:
        """``responses.parse`` with ``input`` compacted."""
        return self._send(self._inner.parse, kwargs)  # type: ignore[no-any-return]

    @overload
    def stream(
        self, *, text_format: type[T], **kwargs: Any
    ) -> SyncStreamManager[ResponseStream[T]]: ...

    @overload
    def stream(
        self, *, text_format: None = None, **kwargs: Any
    ) -> SyncStreamManager[ResponseStream[None]]: ...

    def stream(self, **kwargs: Any) -> SyncStreamManager[Any]:
        """``with client.responses.stream(input=items, ...) as stream:`` (see
        `_Responses.stream`)."""
        return SyncStreamManager(self._inner.stream, self._compactor, self._loop, kwargs)

    def compact(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Refused (see `_Responses.compact`)."""
        refuse("responses.compact", COVERED)

    def connect(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Refused (see `_Responses.connect`)."""
        refuse("responses.connect", COVERED)


class WrappedOpenAI(_HistoryResources, BlockingClient, Generic[S]):
    """An ``OpenAI`` whose ``chat.completions`` and ``responses`` compact; calls that would
    send a history uncompacted are refused; everything else is the client's. Use it in a
    ``with`` block or call `close`: it owns the manager's loop."""

    client: S

    def __init__(
        self,
        client: S,
        manager: ContextManager,
        *,
        compactors: _Compactors | None = None,
        loop: LoopThread | None = None,
    ) -> None:
        super().__init__(client, manager, loop)
        self._compactors = compactors or _Compactors(manager)
        completions = _SyncCompletions(client.chat.completions, self._compactors.chat, self._loop)
        self.chat = _SyncChat(client.chat, completions)
        self.responses = _SyncResponses(client.responses, self._compactors.responses, self._loop)
        self.beta = _Beta(client.beta)

    def with_options(self, **options: Any) -> Self:
        """``client.with_options(...)``, wrapped, on the same session and loop (closing it
        closes the copy, not the loop)."""
        return type(self)(
            self.client.with_options(**options),
            self.manager,
            compactors=self._compactors,
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
def wrap(client: A, manager: ContextManager) -> WrappedAsyncOpenAI[A]: ...


@overload
def wrap(client: S, manager: ContextManager) -> WrappedOpenAI[S]: ...


def wrap(client: A | S, manager: ContextManager) -> WrappedAsyncOpenAI[A] | WrappedOpenAI[S]:
    """A thin proxy of ``client`` (``AsyncOpenAI`` or ``OpenAI``) whose calls that carry the
    history (``chat.completions.create`` / ``parse`` / ``stream``, ``responses.create`` /
    ``parse`` / ``stream`` / ``input_tokens.count``) send the compacted view of the full
    history they are given and record usage; the others that would send it uncompacted raise
    `ConfigError`.

    A ``manager`` that compacts with Anthropic's native compaction is refused with
    `ConfigError`; one that compacts with `OpenAICompactionSummarizer` (Responses items) has
    its ``chat.completions`` calls refused so, before anything is compacted or sent."""
    if isinstance(client, AsyncOpenAI | OpenAI):
        check_native(manager, ("openai-chat", "openai-responses"))
    if isinstance(client, AsyncOpenAI):
        return WrappedAsyncOpenAI(client, manager)
    if isinstance(client, OpenAI):
        return WrappedOpenAI(client, manager)
    raise ConfigError(f"wrap() takes an openai.AsyncOpenAI or OpenAI, got {type(client).__name__}")
