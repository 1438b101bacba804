"""What every wrapper and the middleware do around one model call, in the SDK's dict formats.

`Compactor` turns the keyword arguments of an SDK call into the ones to send (the history
compacted, everything else untouched, Anthropic ``cache_control`` breakpoints placed when
asked, the budget's default output reserve following the request's ``max_tokens``) and
records the usage of what came back. `send` / `send_blocking` do one call, `StreamManager` /
`SyncStreamManager` one ``stream(...)`` helper, `refuse` says no to an entry point that would
send a history uncompacted. It imports no vendor SDK.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, Literal, NoReturn, TypeVar, get_args

from agentctx._log import log
from agentctx._overflow import overflow_of
from agentctx._usage import usage_of
from agentctx.adapters import (
    assemble_anthropic_stream,
    assemble_openai_chat_stream,
    assemble_openai_responses_stream,
    split_openai_chat_system,
    split_openai_responses_system,
    to_anthropic,
    to_openai_chat,
    to_openai_responses,
)
from agentctx.errors import ConfigError, UnsupportedMessageError
from agentctx.events import naming_repairs
from agentctx.providers._history import ConvertedHistory, plain
from agentctx.providers._stream import observe_stream, observe_sync_stream, reported_usage

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from types import TracebackType

    from agentctx.manager import ContextManager
    from agentctx.messages import Message
    from agentctx.providers._blocking import LoopThread

__all__ = [
    "MAX_BREAKPOINTS",
    "Compactor",
    "Guarded",
    "Provider",
    "Refused",
    "Resource",
    "StreamManager",
    "SyncStreamManager",
    "history_list",
    "place_breakpoints",
    "refuse",
    "send",
    "send_blocking",
]

S = TypeVar("S")
T = TypeVar("T")

_ASSEMBLE: dict[str, Callable[[list[Mapping[str, Any]]], object]] = {
    "anthropic": assemble_anthropic_stream,
    "openai-chat": assemble_openai_chat_stream,
    "openai-responses": assemble_openai_responses_stream,
}

Provider = Literal["anthropic", "openai-chat", "openai-responses"]
# Where each API takes the output limit of a request, in the order they are looked for.
_MAX_TOKENS: dict[str, tuple[str, ...]] = {
    "anthropic": ("max_tokens",),
    "openai-chat": ("max_completion_tokens", "max_tokens"),
    "openai-responses": ("max_output_tokens",),
}
_RESPONSE_VIEWS = frozenset({"with_raw_response", "with_streaming_response"})
_READ_AGAIN = (Sequence, Mapping, str, bytes)  # what counting leaves for the SDK to read
MAX_BREAKPOINTS = 4  # Anthropic rejects a request with more cache_control blocks than this
# The cache looks for an earlier hit about 20 blocks back from a breakpoint; a turn that adds
# more than this many blocks needs a breakpoint of its own where the previous request ended.
_LOOKBACK_BLOCKS = 18
# Blocks the API accepts cache_control on (never thinking, redacted thinking or empty text).
_CACHEABLE = frozenset(
    {"text", "image", "document", "tool_use", "tool_result", "server_tool_use", "search_result"}
)


_EMPTY = "history: it is empty, and a provider takes no request without messages"


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One request as it is sent.

    Attributes:
        kwargs: the SDK call's keyword arguments, the history compacted.
        given: the caller's, one-shot iterators read into lists: what to make it again from.
        view: the view sent; ``None`` when the history went as it was (server-side state, a
            string input): its usage then counts no view of the session's.
        asked: the request's output limit (``None``: none given).
        placed: the view and how many messages the request holds, when breakpoints were
            placed in it.
    """

    kwargs: dict[str, Any]
    given: dict[str, Any]
    view: list[Message] | None
    asked: int | None = None
    placed: tuple[list[Message], int] | None = None


class Compactor:
    """Compacts the history of one provider's SDK calls in projection mode.

    Args:
        manager: the session.
        provider: ``anthropic``, ``openai-chat`` or ``openai-responses``.
        cache_breakpoints: Anthropic only — place ``cache_control`` breakpoints (see
            `place_breakpoints`).
    """

    def __init__(
        self, manager: ContextManager, provider: str, *, cache_breakpoints: bool = False
    ) -> None:
        if provider not in get_args(Provider):
            raise ConfigError(f"unknown provider {provider!r}")
        if cache_breakpoints and provider != "anthropic":
            raise ConfigError("cache_breakpoints are Anthropic's; OpenAI caches prefixes itself")
        self.manager = manager
        self.provider = provider
        self.cache_breakpoints = cache_breakpoints
        self._key = "input" if provider == "openai-responses" else "messages"
        self._history = ConvertedHistory(provider)
        # The last request the provider answered (one refused, failed or not sent is tried
        # again, and must be made the same): its view, to find where its cache ends, and
        # its output limit (``None``: none given), with which a count is made.
        self._sent: list[Message] = []
        self._sent_length = 0
        self._asked: int | None = None
        self._requested = False
        self._said_not_rebuilt = False  # a stream the assembler gave up on was logged

    async def request(self, kwargs: Mapping[str, Any], *, count: bool = False) -> dict[str, Any]:
        """The keyword arguments to send: the history compacted, the rest as given.

        A Responses call that continues server-side state (``previous_response_id`` or
        ``conversation``) holds only the new items, and a string ``input`` is not a history:
        both are sent as they are. The request's output limit (``max_tokens``,
        ``max_completion_tokens`` or ``max_output_tokens``) is the output reserve of this
        call unless ``Budget.reserve_output`` was set (`Budget.for_output`). ``count=True``
        is for a token count of what would be sent: no breakpoints are placed, so the next
        real request still places them against the previous one. A count asks for no output:
        it is made with the output limit of the last request (the next one will likely ask
        for as much), or, before any, with none (counted against the default reserve, it
        would compact a history that the request after it sends whole).
        """
        return (await self._compacted(dict(kwargs), count)).kwargs

    async def _compacted(self, kwargs: dict[str, Any], count: bool) -> Outgoing:
        """`request`, with the view it sends (``None``: the history goes as it was);
        ``kwargs`` are what to make it again from (`Outgoing.given`)."""
        outgoing = dict(kwargs)
        history = kwargs.get(self._key)
        if isinstance(history, Iterable) and not isinstance(history, Sequence | Mapping | bytes):
            # A generator or a view the SDK would read to its end: read once, here, and that
            # list is what is compacted and sent.
            history = outgoing[self._key] = list(history)
        if (
            not isinstance(history, Sequence)
            or isinstance(history, str)
            or kwargs.get("previous_response_id")
            or kwargs.get("conversation")
        ):
            return Outgoing(outgoing, kwargs, None)
        max_tokens = asked = self._max_tokens(kwargs)
        if count and max_tokens is None:
            max_tokens = self._asked if self._requested else 0
        if self.provider == "anthropic":  # its system prompt is no message
            view = await self._prepare(list(history), 0, max_tokens)
            for key in ("system", "tools"):  # their breakpoints are counted: read them once
                value = outgoing.get(key)
                if isinstance(value, Iterable) and not isinstance(value, _READ_AGAIN):
                    outgoing[key] = list(value)
            room = MAX_BREAKPOINTS - _top_marks(outgoing.get("system"))
            room -= _top_marks(outgoing.get("tools"))
            if not view:  # (what `ContextManager.prepare` gives an empty history)
                raise UnsupportedMessageError(None, _EMPTY)
            messages, marked = within_marks(to_anthropic(view), max(0, room))
            placed = None
            if self.cache_breakpoints and not count:
                messages = self._place(view, messages, room - marked)
                placed = (view, len(messages))
            outgoing[self._key] = messages
            return Outgoing(outgoing, kwargs, view, asked, placed)
        # Leading system / developer messages are sent as they are.
        if self.provider == "openai-chat":
            system, rest = split_openai_chat_system(history)
            render = to_openai_chat
        else:
            system, rest = split_openai_responses_system(history)
            render = to_openai_responses
        view = await self._prepare(rest, len(system), max_tokens)
        if not view and not system:
            raise UnsupportedMessageError(None, _EMPTY)
        outgoing[self._key] = [*(plain(m) for m in system), *render(view)]
        return Outgoing(outgoing, kwargs, view, asked)

    async def to_send(self, kwargs: Mapping[str, Any]) -> Outgoing:
        """The request to send for the SDK call's ``kwargs`` (`request`), what to make it again
        from, and the view it sends."""
        # Read once: the first attempt (or the SDK sending it) would leave a retry nothing.
        given = {k: list(v) if isinstance(v, Iterator) else v for k, v in kwargs.items()}
        return await self._compacted(given, False)

    def answered(self, request: Outgoing) -> None:
        """The provider answered ``request`` (a response, or a stream it opened): the next
        request places its breakpoints against it, and a count asks for its output limit.
        Until then a retry of a request that failed is made as that request was. (One sent
        as it was, server-side state, says nothing of the next one's limit.)"""
        if request.view is not None:
            self._asked, self._requested = request.asked, True
        if request.placed is not None:
            self._sent, self._sent_length = request.placed

    def resendable(self, refused: Outgoing, error: BaseException) -> bool:
        """Whether ``error`` is the provider refusing ``refused`` as longer than its context
        window, and its history was compacted (`resend` may make it again)."""
        return refused.view is not None and overflow_of(error) is not None

    async def resend(self, refused: Outgoing, error: BaseException) -> Outgoing | None:
        """The request ``refused`` again, after ``error`` answered it: when that is the
        provider refusing the prompt as longer than its context window, the session observes
        it (`ContextManager.observe`: the counts calibrate on the provider's) and compacts the
        history again. ``None`` (raise ``error``) for any other error, a history sent as it
        was (server-side state, a string input), or a view the same as the one refused
        (nothing to gain from sending it again). `BudgetExceededError` (raised inside the
        ``except`` of ``error``, so that is its ``__context__``) when the history cannot be
        compacted to the provider's count."""
        if not self.resendable(refused, error):
            return None
        self.manager.observe(error)
        again = await self.to_send(refused.given)
        return None if again.view == refused.view else again

    async def _prepare(self, rest: list[Any], offset: int, max_tokens: int | None) -> list[Message]:
        """The view of the history after its ``offset`` leading instructions (``rest``); the
        repairs the session reports meanwhile (`TranscriptRepaired`) name the caller's own
        indexes, a message made of several items (a Responses assistant turn) its first."""
        messages = self._convert(rest, offset)
        # The message -> item map is the conversion's own: nothing is spent on it unless a
        # repair is reported.
        with self._history.items_of() as item_of, naming_repairs(lambda i: offset + item_of(i)):
            return await self.manager.prepare(messages, max_tokens=max_tokens)

    def _convert(self, rest: list[Any], offset: int) -> list[Message]:
        """The neutral messages of the history after its ``offset`` leading instructions; an
        `UnsupportedMessageError` names the item's index in the caller's own list."""
        try:
            return self._history.convert(rest)
        except UnsupportedMessageError as error:
            if not offset or error.index is None:
                raise
            raise UnsupportedMessageError(error.index + offset, error.kind) from None

    def _max_tokens(self, kwargs: Mapping[str, Any]) -> int | None:
        for key in _MAX_TOKENS[self.provider]:
            value = kwargs.get(key)
            # An SDK's omit/NOT_GIVEN sentinel, None or a bool is no limit of this request's.
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        return None

    def _place(self, view: list[Message], messages: list[Any], room: int) -> list[Any]:
        previous, length = self._sent, self._sent_length
        extends = 0 < len(previous) <= len(view) and all(
            a is b for a, b in zip(previous, view, strict=False)
        )
        return place_breakpoints(messages, room, previous_end=length - 1 if extends else None)

    def record(self, response: object, *, calibrate: bool = True) -> None:
        """Record the usage of a complete response (an SDK object or its dict); ``calibrate``:
        whether it counts the view the session sent (`ContextManager.observe`)."""
        # Read by field, not serialized: a parsed response (ParsedChatCompletion[Model])
        # warns when dumped, and only its usage is needed.
        self._observe(response, calibrate)

    def record_stream(self, events: list[Mapping[str, Any]], *, calibrate: bool = True) -> None:
        """`record` for a stream read to its last event, from its events' dicts."""
        if any(e.get("type") == "error" for e in events):
            # The server ended the stream with an error: no response, no usage to record.
            # (The SDK raises it, or, for Responses, hands it over as the last event.)
            return
        try:
            response: object = _ASSEMBLE[self.provider](events)
        except Exception as error:
            # The SDK read this stream; that its shape is not one the assembler rebuilds is
            # no reason to fail the caller's loop, after every event was handed over. What
            # the session needs of it is the usage it reported.
            self._not_rebuilt(error)
            response = {"usage": reported_usage(self.provider, events)}
        self._observe(response, calibrate)

    def _not_rebuilt(self, error: Exception) -> None:
        if self._said_not_rebuilt:
            return
        self._said_not_rebuilt = True
        log.warning(
            "stream not rebuilt: only the usage it reported is recorded (said once a client)",
            provider=self.provider,
            error=repr(error),
        )

    def _observe(self, response: object, calibrate: bool) -> None:
        usage = usage_of(response)
        if usage is not None:  # e.g. a chat stream without include_usage: nothing to learn
            self.manager.observe(usage, calibrate=calibrate)


async def attempt(
    compactor: Compactor, kwargs: Mapping[str, Any], call: Callable[[dict[str, Any]], Awaitable[T]]
) -> tuple[T, Outgoing]:
    """``call`` with the request to send for ``kwargs``, and that request; made once more,
    compacted to the provider's count, when the provider refuses it as too long
    (`Compactor.resend`)."""
    request = await compactor.to_send(kwargs)
    try:
        result = await call(request.kwargs)
    except Exception as error:
        again = await compactor.resend(request, error)
        if again is None:
            raise
        result = await call(again.kwargs)
        compactor.answered(again)
    else:
        compactor.answered(request)
    return result, request


def attempt_blocking(
    loop: LoopThread,
    compactor: Compactor,
    kwargs: Mapping[str, Any],
    call: Callable[[dict[str, Any]], T],
) -> tuple[T, Outgoing]:
    """`attempt` for a blocking ``call``; the session's work runs on the manager's ``loop``."""
    request = loop.call(compactor.to_send, kwargs)
    try:
        result = call(request.kwargs)
    except Exception as error:
        # Told here, not on the loop: another error is raised as it came, also where the
        # loop is gone (the client closed from another thread mid-call).
        if not compactor.resendable(request, error):
            raise
        again = loop.call(compactor.resend, request, error)
        if again is None:
            raise
        result = call(again.kwargs)
        compactor.answered(again)
    else:
        compactor.answered(request)
    return result, request


async def send(
    compactor: Compactor, create: Callable[..., Awaitable[Any]], kwargs: dict[str, Any]
) -> Any:
    """``create`` (an SDK method) with the compacted ``kwargs``; the usage is recorded now, or
    when the stream it returns (the SDK's own) has been read to its last event. A prompt the
    provider refuses as too long is compacted to its count and sent once more
    (`Compactor.resend`)."""
    result, request = await attempt(compactor, kwargs, lambda sent: create(**sent))
    compacted = request.view is not None
    if kwargs.get("stream"):
        return observe_stream(result, partial(compactor.record_stream, calibrate=compacted))
    compactor.record(result, calibrate=compacted)
    return result


def send_blocking(
    loop: LoopThread, compactor: Compactor, create: Callable[..., Any], kwargs: dict[str, Any]
) -> Any:
    """`send` for a blocking SDK method; the session's work runs on the manager's ``loop``."""
    result, request = attempt_blocking(loop, compactor, kwargs, lambda sent: create(**sent))
    compacted = request.view is not None
    if kwargs.get("stream"):
        return observe_sync_stream(result, _recorder(loop, compactor, calibrate=compacted))
    loop.call(partial(compactor.record, result, calibrate=compacted))
    return result


def history_list(messages: object) -> list[Any]:
    """``messages`` as given to a wrapped call, read once into a list; `UnsupportedMessageError`
    (a `TypeError`) for what is no history: ``None``, a number, a string, a single dict."""
    if isinstance(messages, Mapping | str | bytes) or not isinstance(messages, Iterable):
        raise UnsupportedMessageError(
            None,
            f"messages of type {type(messages).__name__}: messages must be a list (or an "
            "iterable) of message dicts",
        )
    return list(messages)


def _recorder(
    loop: LoopThread, compactor: Compactor, *, calibrate: bool
) -> Callable[[list[Any]], None]:
    return lambda events: loop.call(partial(compactor.record_stream, events, calibrate=calibrate))


def _observe_helper(stream: Any, observe: Callable[..., Any], done: Callable[..., Any]) -> None:
    """Observe the raw SDK stream under an SDK ``stream(...)`` helper's stream: the helper
    reads its events from ``_raw_stream``, lazily, after this."""
    raw = getattr(stream, "_raw_stream", None)
    if raw is None:
        log.warning("stream usage not recorded: unknown stream helper", kind=type(stream).__name__)
        return
    stream._raw_stream = observe(raw, done)


class StreamManager(Generic[S]):
    """What an async wrapper's ``stream(...)`` returns: ``async with`` compacts the history,
    opens the SDK's own ``stream(...)`` helper and gives its stream (type ``S``); the usage is
    recorded once its last event has been read (``get_final_message()`` and the like
    read them)."""

    def __init__(
        self, open_stream: Callable[..., Any], compactor: Compactor, kwargs: dict[str, Any]
    ) -> None:
        self._open = open_stream
        self._compactor = compactor
        self._kwargs = kwargs
        self._cm: Any = None

    async def __aenter__(self) -> S:
        async def enter(sent: dict[str, Any]) -> S:
            self._cm = self._open(**sent)
            stream: S = await self._cm.__aenter__()
            return stream

        stream, request = await attempt(self._compactor, self._kwargs, enter)
        record = partial(self._compactor.record_stream, calibrate=request.view is not None)
        _observe_helper(stream, observe_stream, record)
        return stream

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._cm is not None:
            await self._cm.__aexit__(exc_type, exc, tb)


class SyncStreamManager(Generic[S]):
    """`StreamManager` for a blocking wrapper: ``with client.messages.stream(...) as s:``."""

    def __init__(
        self,
        open_stream: Callable[..., Any],
        compactor: Compactor,
        loop: LoopThread,
        kwargs: dict[str, Any],
    ) -> None:
        self._open = open_stream
        self._compactor = compactor
        self._loop = loop
        self._kwargs = kwargs
        self._cm: Any = None

    def __enter__(self) -> S:
        def enter(sent: dict[str, Any]) -> S:
            self._cm = self._open(**sent)
            stream: S = self._cm.__enter__()
            return stream

        stream, request = attempt_blocking(self._loop, self._compactor, self._kwargs, enter)
        record = _recorder(self._loop, self._compactor, calibrate=request.view is not None)
        _observe_helper(stream, observe_sync_stream, record)
        return stream

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._cm is not None:
            self._cm.__exit__(exc_type, exc, tb)


class Refused:
    """An SDK attribute (``with_raw_response``, ``beta.chat``, ...) whose methods would send
    the history uncompacted: calling one, however deep (``.completions.parse(...)``), raises
    the `refuse` error naming it."""

    def __init__(self, what: str, covered: str) -> None:
        self._what = what
        self._covered = covered

    def __getattr__(self, name: str) -> Refused:
        if name.startswith("__"):
            raise AttributeError(name)
        return Refused(f"{self._what}.{name}", self._covered)

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        refuse(self._what, self._covered)


class Resource:
    """An SDK resource passed through, as a wrapper's subclasses do for the methods they do
    not compact; ``with_raw_response`` / ``with_streaming_response`` are refused (they would
    send the history as given)."""

    _what = ""  # the resource's path on the client, for the errors (``messages``, ...)
    _covered = ""  # what the wrapper compacts, for the errors

    def __init__(self, inner: Any, compactor: Compactor) -> None:
        self._inner = inner
        self._compactor = compactor

    @property
    def with_raw_response(self) -> Any:
        """Refused: use the unwrapped ``wrapped.client`` to send the history as it is."""
        return Refused(f"{self._what}.with_raw_response", self._covered)

    @property
    def with_streaming_response(self) -> Any:
        """Refused: use the unwrapped ``wrapped.client`` to send the history as it is."""
        return Refused(f"{self._what}.with_streaming_response", self._covered)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class Guarded:
    """An SDK resource passed through except its methods in ``refused``, which would send a
    history uncompacted (``batches.create``, ...) and raise the `refuse` error instead; a
    dotted name refuses a method of a resource under it (``items.create``)."""

    def __init__(self, inner: Any, what: str, covered: str, refused: frozenset[str]) -> None:
        self._inner = inner
        self._what = what
        self._covered = covered
        self._refused = refused

    def __getattr__(self, name: str) -> Any:
        if name in self._refused:
            return Refused(f"{self._what}.{name}", self._covered)
        inner = getattr(self._inner, name)
        what = f"{self._what}.{name}"
        if name in _RESPONSE_VIEWS:  # `.with_raw_response.create` sends as `.create` does
            return Guarded(inner, what, self._covered, self._refused)
        under = frozenset(r.partition(".")[2] for r in self._refused if r.startswith(name + "."))
        return Guarded(inner, what, self._covered, under) if under else inner


def refuse(what: str, covered: str) -> NoReturn:
    """Raise the `ConfigError` of an entry point ``wrap`` does not compact: it would send the
    history as it is, so it is refused rather than passed through in silence."""
    raise ConfigError(
        f"{what} is not covered by agentctx's wrap(): it would send the history uncompacted. "
        f"Covered: {covered}. To send a history as it is, use the unwrapped client "
        "(wrapped.client)."
    )


def place_breakpoints(
    messages: list[Any], room: int, *, previous_end: int | None = None
) -> list[Any]:
    """Anthropic ``messages`` with up to ``room`` ``cache_control`` breakpoints added.

    In order of what they pay for: the last message (this request's prefix is written, the
    next request reads it); where the previous request ended, when more blocks than the
    cache's lookback were added since (so that prefix is still read); the first message, the
    task, which compaction never rewrites (so tools, system and task stay cached across a
    compaction). Messages that get one are copied; the others are the same objects. None goes
    before a message the caller marked with a 1-hour TTL (a tool result's blocks included):
    the API takes longer TTLs first.
    """
    if room <= 0 or not messages:
        return messages
    last = len(messages) - 1
    targets = [last]
    if (
        previous_end is not None
        and 0 <= previous_end < last
        and _blocks_between(messages, previous_end, last) > _LOOKBACK_BLOCKS
    ):
        targets.append(previous_end)
    targets.append(0)
    out = list(messages)
    placed = 0
    floor = _last_long_ttl(messages)
    for index in dict.fromkeys(targets):
        if placed == room:
            break
        if index < floor:
            continue
        marked = _mark(out[index])
        if marked is not None:
            out[index] = marked
            placed += 1
    return out


def _mark(message: Any) -> dict[str, Any] | None:
    if not isinstance(message, Mapping):
        return None
    content = message.get("content")
    if isinstance(content, str):
        if not content:
            return None
        block = {"type": "text", "text": content, "cache_control": {"type": "ephemeral"}}
        return {**message, "content": [block]}
    if not isinstance(content, list):
        return None
    for i in range(len(content) - 1, -1, -1):
        block = content[i]
        if not isinstance(block, Mapping) or block.get("type") not in _CACHEABLE:
            continue
        if _marks_of(block):  # marked already, or a tool result's own blocks are
            return None
        if block.get("type") == "text" and not block.get("text"):
            continue
        blocks = list(content)
        blocks[i] = {**block, "cache_control": {"type": "ephemeral"}}
        return {**message, "content": blocks}
    return None


def _last_long_ttl(messages: list[Any]) -> int:
    """The index of the last message holding a breakpoint with a 1-hour TTL (-1: none)."""
    for i in range(len(messages) - 1, -1, -1):
        if any(_long(mark) for _, _, _, mark in _message_marks(messages, i)):
            return i
    return -1


def _long(mark: Mapping[str, Any]) -> bool:
    return mark.get("ttl") == "1h"


def _blocks_between(messages: list[Any], start: int, end: int) -> int:
    n = 0
    for message in messages[start + 1 : end + 1]:
        content = message.get("content") if isinstance(message, Mapping) else None
        n += len(content) if isinstance(content, list) else 1
    return n


def within_marks(messages: list[Any], room: int) -> tuple[list[Any], int]:
    """Anthropic ``messages`` with at most ``room`` ``cache_control`` marks, none with the
    default TTL before one of an hour (the API takes longer TTLs first), and how many marks they
    hold. Past ``room`` the oldest go first, the first message's last (the task, a mark a
    caller means to keep). A tool call or result a decision cut down keeps the mark it had
    then, and the caller's later edits of it are not read (`ContextManager.prepare`): once the
    caller moved its marks on, the old ones went out beside the new, past the API's four or
    before a 1-hour mark, and the request was refused."""
    marks = [at for i in range(len(messages)) for at in _message_marks(messages, i)]
    last_long = max((n for n, at in enumerate(marks) if _long(at[3])), default=0)
    drop = [at for at in marks[:last_long] if not _long(at[3])]
    kept = [at for n, at in enumerate(marks) if n >= last_long or _long(at[3])]
    if len(kept) > room:
        kept.sort(key=lambda at: at[0] == 0)  # stable: the oldest first, the task's last
        drop += kept[: len(kept) - room]
    if not drop:
        return messages, len(marks)
    out = list(messages)
    for i, j, k, _ in drop:
        content = list(out[i]["content"])
        content[j] = _unmarked(content[j], k)
        out[i] = {**out[i], "content": content}
    return out, len(marks) - len(drop)


def _message_marks(
    messages: list[Any], i: int
) -> list[tuple[int, int, int | None, Mapping[str, Any]]]:
    """The marks of message ``i``: (message, block, inner block or None, the mark)."""
    m = messages[i]
    content = m.get("content") if isinstance(m, Mapping) else None
    if not isinstance(content, list):
        return []
    return [
        (i, j, k, mark)
        for j, block in enumerate(content)
        if isinstance(block, Mapping)
        for k, mark in _marks_of(block)
    ]


def _marks_of(block: Mapping[str, Any]) -> list[tuple[int | None, Mapping[str, Any]]]:
    """The marks of a content block: its own (``None``), then those of its inner blocks (a
    tool result's content) by index. A mark is a mapping (``None`` is none)."""
    own = block.get("cache_control")
    marks: list[tuple[int | None, Mapping[str, Any]]] = (
        [(None, own)] if isinstance(own, Mapping) else []
    )
    inner = block.get("content") if block.get("type") == "tool_result" else None
    if isinstance(inner, list):
        marks += [
            (k, mark)
            for k, b in enumerate(inner)
            if isinstance(b, Mapping) and isinstance(mark := b.get("cache_control"), Mapping)
        ]
    return marks


def _top_marks(value: object) -> int:
    """The marks of ``system`` or ``tools`` (a string has none; a list has its items')."""
    if not isinstance(value, list | tuple):
        return 0
    return sum(isinstance(v, Mapping) and len(_marks_of(v)) for v in value)


def _unmarked(block: Mapping[str, Any], k: int | None) -> dict[str, Any]:
    """``block`` without its own mark (``k`` None) or that of its inner block ``k``."""
    if k is None:
        return {f: v for f, v in block.items() if f != "cache_control"}
    inner = list(block["content"])
    inner[k] = {f: v for f, v in inner[k].items() if f != "cache_control"}
    return {**block, "content": inner}
