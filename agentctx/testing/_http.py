"""A small HTTP/1.1 server on anyio, run in its own thread, for the fake provider servers.

It runs its own event loop in a named thread so one server serves sync and async clients
alike, and can be started and stopped from any thread or task (pytest-asyncio runs fixture
setup and teardown in different tasks, which an in-loop task group would not survive).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
from anyio.abc import SocketAttribute
from anyio.from_thread import start_blocking_portal
from anyio.streams.buffered import BufferedByteReceiveStream

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping, Sequence
    from concurrent.futures import Future

    from anyio.abc import SocketStream, TaskStatus
    from anyio.from_thread import BlockingPortal

__all__ = ["GONE", "Exchange", "HttpRequest", "HttpServer"]

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 256 * 1024 * 1024
PIECE_BYTES = 64

REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Request Entity Too Large",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
    529: "Overloaded",
}

# Everything a vanished client can make a send or receive raise.
GONE = (
    anyio.EndOfStream,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.IncompleteRead,
    OSError,
)


class _BadRequest(Exception):
    pass


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """A parsed request; header names are lower-case, repeated headers joined by ``, ``."""

    method: str
    target: str
    headers: Mapping[str, str]
    body: bytes

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    @property
    def keep_alive(self) -> bool:
        return self.headers.get("connection", "").lower() != "close"


class Exchange:
    """The response side of one request on a connection.

    Either `respond` once, or `start_stream` / `send_event`* / `end_stream`; `reset`,
    `close_now` and `wait_for_disconnect` end the connection instead. ``reusable`` says
    whether the connection may serve another request afterwards.
    """

    def __init__(self, stream: SocketStream, reader: BufferedByteReceiveStream) -> None:
        self._stream = stream
        self._reader = reader
        self.reusable = True

    async def respond(
        self,
        status: int,
        headers: Sequence[tuple[str, str]],
        body: bytes,
        *,
        piece_delay: float = 0.0,
    ) -> None:
        """Send a whole response; with ``piece_delay``, trickle the body in 64-byte pieces."""
        head = _head(status, [*headers, ("content-length", str(len(body)))])
        if piece_delay <= 0:
            await self._stream.send(head + body)
            return
        await self._stream.send(head)
        for start in range(0, len(body), PIECE_BYTES):
            await anyio.sleep(piece_delay)
            await self._stream.send(body[start : start + PIECE_BYTES])

    async def respond_partial(
        self, status: int, headers: Sequence[tuple[str, str]], body: bytes, pieces: int
    ) -> None:
        """Send the head promising all of ``body`` but only ``pieces`` 64-byte pieces of it."""
        head = _head(status, [*headers, ("content-length", str(len(body)))])
        await self._stream.send(head + body[: pieces * PIECE_BYTES])

    async def start_stream(self, status: int, headers: Sequence[tuple[str, str]]) -> None:
        """Send the head of a chunked response (used for SSE)."""
        await self._stream.send(_head(status, [*headers, ("transfer-encoding", "chunked")]))

    async def send_event(self, data: bytes) -> None:
        """Send one chunk of a chunked response."""
        if data:
            await self._stream.send(b"%x\r\n%s\r\n" % (len(data), data))

    async def end_stream(self) -> None:
        await self._stream.send(b"0\r\n\r\n")

    async def reset(self) -> None:
        """Abort the connection with a TCP RST once what was sent has been acknowledged."""
        self.reusable = False
        sock: socket.socket = self._stream.extra(SocketAttribute.raw_socket)
        # Wait (briefly) until the peer has acknowledged what was sent, so the RST cannot
        # overtake data the client should still see. Linux reports unacknowledged bytes;
        # elsewhere a short pause has to do.
        for _ in range(200):
            unacked = _unacked(sock)
            if unacked is None:
                await anyio.sleep(0.01)
                break
            if unacked == 0:
                break
            await anyio.sleep(0.001)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await self._stream.aclose()

    async def close_now(self) -> None:
        """Close the connection cleanly (FIN), whatever was promised."""
        self.reusable = False
        await self._stream.aclose()

    async def wait_for_disconnect(self) -> None:
        """Block until the client closes the connection (or the server stops)."""
        self.reusable = False
        with contextlib.suppress(*GONE):
            while True:
                await self._reader.receive()


def _unacked(sock: socket.socket) -> int | None:
    """Bytes sent on ``sock`` not yet acknowledged by the peer (None where unknown)."""
    if not sys.platform.startswith("linux"):
        return None
    import fcntl

    siocoutq = 0x5411  # SIOCOUTQ (= TIOCOUTQ) on Linux
    try:
        out = fcntl.ioctl(sock.fileno(), siocoutq, b"\0\0\0\0")
    except OSError:
        return None
    return int(struct.unpack("i", out)[0])


def _head(status: int, headers: Sequence[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}"]
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _read_request(reader: BufferedByteReceiveStream) -> HttpRequest:
    head = await reader.receive_until(b"\r\n\r\n", MAX_HEAD_BYTES)
    try:
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        method, target, _version = request_line.split(" ", 2)
    except ValueError as exc:
        raise _BadRequest("malformed request line") from exc
    headers: dict[str, str] = {}
    for line in header_lines:
        name, sep, value = line.partition(":")
        if not sep:
            raise _BadRequest(f"malformed header line {line!r}")
        key = name.strip().lower()
        headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _read_chunked(reader)
    else:
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError as exc:
            raise _BadRequest("bad content-length") from exc
        if length < 0 or length > MAX_BODY_BYTES:
            raise _BadRequest("content-length out of range")
        body = await reader.receive_exactly(length) if length else b""
    return HttpRequest(method.upper(), target, headers, body)


async def _read_chunked(reader: BufferedByteReceiveStream) -> bytes:
    parts: list[bytes] = []
    total = 0
    while True:
        size_line = await reader.receive_until(b"\r\n", 1024)
        try:
            size = int(size_line.split(b";", 1)[0].strip(), 16)
        except ValueError as exc:
            raise _BadRequest("bad chunk size") from exc
        if size == 0:
            while await reader.receive_until(b"\r\n", MAX_HEAD_BYTES):  # trailers
                pass
            return b"".join(parts)
        total += size
        if total > MAX_BODY_BYTES:
            raise _BadRequest("body too large")
        parts.append(await reader.receive_exactly(size))
        await reader.receive_exactly(2)


class HttpServer:
    """Serves ``handler(request, exchange)`` on 127.0.0.1 at an ephemeral port.

    `start` and `stop` may be called from any thread; `stop` cancels requests in progress,
    closes every connection and joins the server thread.
    """

    def __init__(
        self, handler: Callable[[HttpRequest, Exchange], Awaitable[None]], *, name: str
    ) -> None:
        self._handler = handler
        self._name = name
        self._stack: contextlib.ExitStack | None = None
        self._scope: anyio.CancelScope | None = None
        self._future: Future[None] | None = None
        self._portal: BlockingPortal | None = None
        self._lock = threading.Lock()
        self.port = 0
        self.errors: list[BaseException] = []
        self.connections = 0

    def start(self) -> int:
        with self._lock:
            if self._stack is not None:
                raise RuntimeError(f"{self._name} is already running")
            stack = contextlib.ExitStack()
            portal = stack.enter_context(start_blocking_portal(name=self._name))
            try:
                self._future, self.port = portal.start_task(self._serve, name=self._name)
            except BaseException:
                stack.close()
                raise
            self._stack = stack
            self._portal = portal
            return self.port

    def stop(self) -> None:
        with self._lock:
            stack, self._stack = self._stack, None
            if stack is None:
                return
            try:
                scope, future, portal = self._scope, self._future, self._portal
                if scope is not None and portal is not None:
                    portal.call(scope.cancel)
                if future is not None:
                    future.result(timeout=30)
            finally:
                stack.close()  # stops the portal's event loop and joins its thread

    async def _serve(self, *, task_status: TaskStatus[int]) -> None:
        with anyio.CancelScope() as scope:
            self._scope = scope
            listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
            async with listener, anyio.create_task_group() as tg:
                task_status.started(listener.extra(SocketAttribute.local_port))
                await listener.serve(self._connection, task_group=tg)

    async def _connection(self, stream: SocketStream) -> None:
        self.connections += 1
        async with stream:
            reader = BufferedByteReceiveStream(stream)
            while True:
                try:
                    request = await _read_request(reader)
                except _BadRequest as exc:
                    with contextlib.suppress(*GONE):
                        body = f"bad request: {exc}".encode()
                        await stream.send(
                            _head(
                                400,
                                [
                                    ("content-type", "text/plain"),
                                    ("content-length", str(len(body))),
                                    ("connection", "close"),
                                ],
                            )
                            + body
                        )
                    return
                except (*GONE, anyio.DelimiterNotFound):
                    return
                exchange = Exchange(stream, reader)
                try:
                    await self._handler(request, exchange)
                except GONE:
                    return
                except Exception as exc:  # a bug in the handler must not stop the server
                    self.errors.append(exc)
                    return
                if not (exchange.reusable and request.keep_alive):
                    return
