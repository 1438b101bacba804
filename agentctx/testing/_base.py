"""The machinery both fake servers share: lifecycle, scripting, recording, billing, faults."""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import anyio

from agentctx.testing import _wire as wire
from agentctx.testing._http import GONE, HttpServer
from agentctx.testing._reply import Reply
from agentctx.testing._validate import Invalid, sign
from agentctx.testing._wire import Billing

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from types import TracebackType
    from typing import Self

    from agentctx.testing._http import Exchange, HttpRequest

__all__ = ["FakeServer", "RecordedRequest", "Rendered"]


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request a fake server received, and what it answered.

    ``json`` is the parsed body (None if it was not JSON), ``body`` the exact bytes;
    ``headers`` have lower-case names. ``status`` is None when no response head was sent
    (hang, immediate reset). ``error`` is the message of an error answer, ``reply`` the
    scripted reply used (None when validation or routing answered), ``usage`` the token
    numbers reported (None for errors).
    """

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes
    json: Any
    stream: bool
    status: int | None
    reply: Reply | None
    error: str | None
    usage: Billing | None


@dataclass(frozen=True, slots=True)
class Rendered:
    body: dict[str, Any]
    events: list[bytes]


class FakeServer:
    """What `FakeAnthropic` and `FakeOpenAI` share (see them for the options): lifecycle,
    scripting, recording, simulated caching, faults. Not instantiated directly."""

    _request_id_header: ClassVar[str]  # the header carrying the request id

    def __init__(
        self,
        replies: Iterable[Reply] = (),
        *,
        default: Reply | Callable[[Any], Reply] | None = None,
        validate: bool = True,
        check_signatures: bool = True,
        context_window: int | None = None,
        caching: bool | Literal["breakpoints"] = True,
        cache_ttl: float | None = None,
        require_auth: bool = True,
    ) -> None:
        self.default: Reply | Callable[[Any], Reply] = default or Reply.text("ok")
        self.validate = validate
        self.check_signatures = check_signatures
        self.context_window = context_window
        self.caching = caching
        self.require_auth = require_auth
        self._queue: deque[Reply] = deque(replies)
        self._requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._cache = wire.PrefixCache(cache_ttl)
        self._ids = wire.Ids()
        self._count = 0
        self._in_progress = 0
        self._http = HttpServer(self._handle, name=f"{type(self).__name__}-{id(self):x}")
        self._init_state()

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> Self:
        """Start listening (in a new thread); returns self. Prefer ``with`` / ``async with``."""
        self._http.start()
        return self

    def close(self) -> None:
        """Stop: cancel requests in progress, close every connection, join the thread."""
        self._http.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def port(self) -> int:
        return self._http.port

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``, without a path (OpenAI clients want ``url + "/v1"``)."""
        return f"http://127.0.0.1:{self._http.port}"

    # ---------------------------------------------------------------- scripting and records

    def enqueue(self, *replies: Reply) -> None:
        """Append replies to the queue; each valid request takes the first one."""
        with self._lock:
            self._queue.extend(replies)

    @property
    def remaining(self) -> int:
        """How many queued replies have not been used yet."""
        with self._lock:
            return len(self._queue)

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received so far, oldest first (a copy)."""
        with self._lock:
            return list(self._requests)

    @property
    def connections(self) -> int:
        """How many TCP connections were accepted (keep-alive reuse keeps this low)."""
        return self._http.connections

    @property
    def errors(self) -> list[BaseException]:
        """Exceptions raised by the fake server itself (its bugs); each was answered 500."""
        return list(self._http.errors)

    def clear_cache(self) -> None:
        """Forget every cached prefix, as if the provider's cache had expired."""
        with self._lock:
            self._cache.clear()

    @staticmethod
    def signature_for(thinking: str) -> str:
        """The signature this server gives (and accepts for) a thinking block's text."""
        return sign(thinking)

    # ---------------------------------------------------------------- per-API hooks

    def _init_state(self) -> None:
        """Set up per-API state (called at the end of ``__init__``)."""

    def _endpoints(self) -> Sequence[str]:
        raise NotImplementedError

    def _auth_problem(self, headers: Mapping[str, str]) -> tuple[int, str] | None:
        raise NotImplementedError

    def _check(self, path: str, body: Any) -> Invalid | None:
        raise NotImplementedError

    def _segments(self, path: str, body: Any) -> list[str]:
        raise NotImplementedError

    def _render(self, path: str, body: Any, reply: Reply, billing: Billing) -> Rendered:
        raise NotImplementedError

    def _error_json(
        self, status: int, error_type: str | None, message: str | None, extra: Mapping[str, object]
    ) -> tuple[int, dict[str, Any], str]:
        """(status, body, message) of an error answer, defaults filled in per API."""
        raise NotImplementedError

    def _invalid_json(self, invalid: Invalid) -> dict[str, Any]:
        raise NotImplementedError

    def _stream_fault(self, reply: Reply, path: str, sent: int) -> bytes:
        raise NotImplementedError

    def _count_tokens(self, path: str, body: Any) -> dict[str, Any] | None:
        return None

    def _check_headers(self, path: str, body: Any, headers: Mapping[str, str]) -> Invalid | None:
        """Rules that depend on the request's headers too (betas); after `_check`."""
        return None

    def _cache_points(self, body: Any) -> list[int] | None:
        """Indices of the segments holding an explicit cache breakpoint (None: this API
        caches automatically)."""
        return None

    def _sse_headers(self) -> list[tuple[str, str]]:
        return [("content-type", "text/event-stream; charset=utf-8"), ("cache-control", "no-cache")]

    # ---------------------------------------------------------------- request handling

    async def _handle(self, request: HttpRequest, exchange: Exchange) -> None:
        call = _Call(self, request, exchange)
        with self._lock:
            self._in_progress += 1
        try:
            await self._dispatch(call)
        except GONE:
            raise
        except Exception as exc:  # answer a bug of the fake as a 500 and keep serving
            self._http.errors.append(exc)
            await call.fail(500, None, f"fake server bug: {exc!r}")
        finally:
            with self._lock:
                self._in_progress -= 1

    @property
    def in_progress(self) -> int:
        """Requests being handled right now (a ``hang`` holds one open until the client
        gives up): 0 after a test means nothing was left hanging."""
        return self._in_progress

    async def _dispatch(self, call: _Call) -> None:
        request, body = call.request, call.body
        path = request.path
        if path not in self._endpoints():
            return await call.fail(404, None, f"Not found: {request.method} {path}")
        if request.method != "POST":
            return await call.fail(405, "invalid_request_error", f"{request.method} not allowed")
        problem = self._auth_problem(request.headers) if self.require_auth else None
        if problem:
            return await call.fail(problem[0], None, problem[1])
        if not isinstance(body, dict):
            message = "There was an error parsing the body of your request: not a JSON object."
            return await call.reject(Invalid(message))
        invalid = self._check(path, body) if self.validate else None
        if invalid is None and self.validate:
            invalid = self._check_headers(path, body, request.headers)
        if invalid:
            return await call.reject(invalid)
        counted = self._count_tokens(path, body)
        if counted is not None:
            call.record(200)
            return await self._send_json(call.exchange, 200, counted)
        segments = self._segments(path, body)
        total = sum(wire.estimate_tokens(s) for s in segments)
        if self.context_window is not None and total > self.context_window:
            return await call.reject(self._too_long(path, total, self.context_window))
        reply = self._next_reply(body)
        if reply.delay > 0:
            await anyio.sleep(reply.delay)
        points = self._cache_points(body) if self.caching == "breakpoints" else None
        await self._answer(call, reply, segments, points)

    def _too_long(self, path: str, total: int, window: int) -> Invalid:
        raise NotImplementedError

    def _next_reply(self, body: Any) -> Reply:
        with self._lock:
            self._count += 1
            if self._queue:
                return self._queue.popleft()
        default = self.default
        return default if isinstance(default, Reply) else default(body)

    async def _answer(
        self, call: _Call, reply: Reply, segments: list[str], points: list[int] | None
    ) -> None:
        kind, exchange = reply.kind, call.exchange
        if kind == "error":
            return await call.fail(
                reply.status, reply.error_type, reply.message, reply, reply.headers, reply.extra
            )
        if kind == "stream_error" and not call.stream:
            status = 529 if reply.error_type == "overloaded_error" else 500
            return await call.fail(status, reply.error_type, reply.message, reply)
        if kind == "hang" or (kind == "reset" and reply.after_events == 0):
            call.record(None, reply)
            if kind == "hang":
                return await exchange.wait_for_disconnect()
            return await exchange.reset()
        billing = self._bill(reply, segments, points)
        rendered = self._render(call.request.path, call.body, reply, billing)
        call.record(200, reply, usage=billing)
        if call.stream:
            return await self._stream(call.request.path, reply, rendered.events, exchange)
        if kind == "malformed":
            return await exchange.respond(200, self._json_headers(), reply.body)
        payload = wire.dumps(rendered.body).encode()
        if kind == "reset" or kind == "disconnect":
            pieces = reply.after_events
            await exchange.respond_partial(200, self._json_headers(), payload, pieces)
            return await (exchange.reset() if kind == "reset" else exchange.close_now())
        delay = reply.event_delay
        await exchange.respond(200, self._json_headers(), payload, piece_delay=delay)

    async def _stream(
        self, path: str, reply: Reply, events: list[bytes], exchange: Exchange
    ) -> None:
        await exchange.start_stream(200, [*self._sse_headers(), *self._id_header()])
        cut = len(events) if reply.kind == "message" else min(reply.after_events, len(events))
        for n, event in enumerate(events[:cut]):
            if n and reply.event_delay > 0:
                await anyio.sleep(reply.event_delay)
            await exchange.send_event(event)
        if reply.kind == "reset":
            return await exchange.reset()
        if reply.kind == "disconnect":
            return await exchange.close_now()
        if reply.kind in ("stream_error", "malformed"):
            await exchange.send_event(self._stream_fault(reply, path, cut))
        await exchange.end_stream()

    def _bill(self, reply: Reply, segments: list[str], points: list[int] | None) -> Billing:
        with self._lock:
            if points is not None:
                cached, written, total = self._cache.lookup_breakpoints(segments, points)
                uncached = total - cached - written
            elif self.caching:
                cached, total = self._cache.lookup(segments, store=True)
                uncached, written = 0, total - cached
            else:
                total = sum(wire.estimate_tokens(s) for s in segments)
                cached, uncached, written = 0, total, 0

        def pick(scripted: int | None, simulated: int) -> int:
            return simulated if scripted is None else scripted

        return Billing(
            input_tokens=pick(reply.input_tokens, uncached),
            cache_read=pick(reply.cache_read, cached),
            cache_write=pick(reply.cache_write, written),
            output_tokens=pick(reply.output_tokens, wire.output_estimate(reply)),
        )

    def _id_header(self) -> list[tuple[str, str]]:
        return [(self._request_id_header, self._ids.new("req"))]

    def _json_headers(self) -> list[tuple[str, str]]:
        return [("content-type", "application/json"), *self._id_header()]

    async def _send_json(
        self,
        exchange: Exchange,
        status: int,
        payload: object,
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        await exchange.respond(
            status, [*self._json_headers(), *headers], wire.dumps(payload).encode()
        )


class _Call:
    """One request being answered: its parsed body, and how to record and refuse it."""

    def __init__(self, server: FakeServer, request: HttpRequest, exchange: Exchange) -> None:
        self.server = server
        self.request = request
        self.exchange = exchange
        try:
            self.body: Any = json.loads(request.body) if request.body else None
        except ValueError:
            self.body = None
        self.stream = isinstance(self.body, dict) and self.body.get("stream") is True

    def record(
        self,
        status: int | None,
        reply: Reply | None = None,
        error: str | None = None,
        usage: Billing | None = None,
    ) -> None:
        request = self.request
        recorded = RecordedRequest(
            request.method,
            request.path,
            dict(request.headers),
            request.body,
            self.body,
            self.stream,
            status,
            reply,
            error,
            usage,
        )
        with self.server._lock:
            self.server._requests.append(recorded)

    async def fail(
        self,
        status: int,
        error_type: str | None,
        message: str | None,
        reply: Reply | None = None,
        headers: Sequence[tuple[str, str]] = (),
        extra: Mapping[str, object] | None = None,
    ) -> None:
        """Answer an HTTP error in the provider's shape (defaults per status)."""
        status, payload, text = self.server._error_json(status, error_type, message, extra or {})
        self.record(status, reply, text)
        await self.server._send_json(self.exchange, status, payload, headers)

    async def reject(self, invalid: Invalid) -> None:
        """Answer HTTP 400 for an invalid request."""
        self.record(400, None, invalid.message)
        await self.server._send_json(self.exchange, 400, self.server._invalid_json(invalid))
