"""`SdkSummarizer`: `ScriptedSummarizer`'s interface, played through a real SDK summarizer.

The scenario tests script a summarizer with `Outcome`s (a reply and its stop reason, a failure
with a status and ``Retry-After``, a hang, a delay). `SdkSummarizer` takes the same script and
constructor, and the same counters (``requests``, ``completed``, ``failed``, ``cancelled``,
``in_flight``, ``pending``, ``push``, ``model``, ``default``), but forwards every call to a real
`AnthropicSummarizer`, `OpenAIChatSummarizer` or `OpenAIResponsesSummarizer` whose client points
at a fake server of its own (`FakeAnthropic` / `FakeOpenAI` on 127.0.0.1). Each outcome is
translated into the `Reply` the server gives for that request (`to_reply`); a script may also
hold `Reply`s directly, for the faults no `Outcome` expresses (malformed JSON, a connection
reset, a slow trickle).

How a reply is tied to its request: the outcome is taken when the call starts, as
`ScriptedSummarizer` does, and the server asks for it (its ``default`` is a function of the
request body) when the request reaches it. The server answers in order, one request per call;
unlike a reply queue, a call cancelled before its request reached the server (the manager
closed right after arming) leaves no reply behind for the next request to take. The server
checks that the request carries the call's prompt exactly as `LlmCompaction` built it.

`quiesce` is the real-socket counterpart of the scenarios' ``settle``: a `ScriptedSummarizer`
answers an outcome without a delay within a few event-loop checkpoints, before the next turn,
and `quiesce` waits until every such call of a live `SdkSummarizer` has its answer (and every
delayed or hanging call has at least reached the server), so the scenarios see the same
ordering of turns and replies over sockets.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Literal

import anyio
import anyio.lowlevel

from agentctx.errors import SummarizerError
from agentctx.providers.anthropic_summarizer import AnthropicSummarizer
from agentctx.providers.openai_summarizer import OpenAIChatSummarizer, OpenAIResponsesSummarizer
from agentctx.summarizer import SummaryRequest, SummaryResult, is_retryable_status
from agentctx.testing.scripted import Outcome, ScriptedSummarizer
from agentctx.testing.servers import FakeAnthropic, FakeOpenAI, Reply

__all__ = [
    "BACKENDS",
    "SDK_BACKENDS",
    "Backend",
    "Scripted",
    "SdkSummarizer",
    "SummarizerFactory",
    "Unsupported",
    "poll",
    "quiesce",
    "to_reply",
]

Backend = Literal["scripted", "anthropic", "openai-chat", "openai-responses"]
BACKENDS: tuple[Backend, ...] = ("scripted", "anthropic", "openai-chat", "openai-responses")
SDK_BACKENDS: tuple[Backend, ...] = BACKENDS[1:]

Item = Outcome | str | Reply

HTTP_TIMEOUT = 600.0  # the SDK's own timeout never fires first: LlmCompaction's guards decide
SETTLE_LIMIT = 10.0  # seconds quiesce may wait before the test fails


class Unsupported(ValueError):
    """An outcome this backend's fake server cannot give (the test must not ask for it)."""


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


# Outcome stop reasons in the fake server's vocabulary. ``error`` (neither finished, cut nor
# refused) is a tool-use stop without a tool call: Anthropic ``tool_use``, Chat ``tool_calls``.
_STOP = {"stop": "end_turn", "length": "max_tokens", "refusal": "refusal", "error": "tool_use"}


def to_reply(item: Item, backend: Backend) -> Reply:
    """The `Reply` a fake server gives for ``item`` so that ``backend``'s SDK summarizer
    returns (or raises) what a `ScriptedSummarizer` would for it.

    Raises `Unsupported` for an outcome the server cannot give: a per-outcome model (the
    server answers with the request's), an ``error`` stop on the Responses API (a response
    is ``completed`` or ``incomplete`` there), a failure whose ``retryable`` disagrees with
    its status, a non-retryable failure without a status.
    """
    if isinstance(item, Reply):
        return item
    outcome = Outcome.reply(item) if isinstance(item, str) else item
    if outcome.model is not None:
        raise Unsupported("the fake server answers with the summarizer's model")
    if outcome.delay == "hang":
        return Reply.hang()
    delay = outcome.delay or 0.0
    error = outcome.error
    if error is not None:
        if error.status is None:
            if not error.retryable:
                raise Unsupported("a non-retryable failure needs an HTTP status")
            reply = Reply.reset()  # a connection error: retryable, no status
        else:
            if error.retryable != is_retryable_status(error.status):
                raise Unsupported(f"HTTP {error.status} is retryable={not error.retryable}")
            headers = {}
            if error.retry_after is not None:
                headers["retry-after"] = _seconds(error.retry_after)
            reply = Reply.error(error.status, message=str(error), headers=headers)
        return dataclasses.replace(reply, delay=delay)
    if outcome.stop_reason == "error" and backend == "openai-responses":
        raise Unsupported("the fake Responses API has no failed or unfinished response")
    usage: dict[str, Any] = {}
    if outcome.usage is not None:
        u = outcome.usage
        if u.cache_write_tokens and backend != "anthropic":
            raise Unsupported("OpenAI reports cache writes as uncached input")
        usage = {
            "input_tokens": u.input_tokens,
            "output_tokens": u.output_tokens,
            "cache_read": u.cache_read_tokens,
            "cache_write": u.cache_write_tokens,
        }
    return Reply.text(outcome.text, stop_reason=_STOP[outcome.stop_reason], delay=delay, **usage)


def _immediate(reply: Reply) -> bool:
    """Whether ``reply`` comes at once (what `quiesce` waits for), as a `ScriptedSummarizer`
    outcome without a delay does."""
    return reply.kind != "hang" and reply.delay <= 0 and reply.event_delay <= 0


def _prompt_of(backend: Backend, body: Any) -> object:
    """The prompt a summarizer request carries on the wire."""
    try:
        if backend == "anthropic":
            return body["messages"][0]["content"]
        if backend == "openai-chat":
            return body["messages"][-1]["content"]
        return body["input"]
    except (KeyError, IndexError, TypeError):
        return None


@dataclasses.dataclass(eq=False)
class _Call:
    request: SummaryRequest
    reply: Reply
    served: bool = False  # the server took the reply (the request reached it)
    done: bool = False  # the call returned, raised or was cancelled


class Scripted(ScriptedSummarizer):
    """`ScriptedSummarizer` that also records when each call started (``started``), as
    `SdkSummarizer` does."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.started: list[float] = []

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.started.append(anyio.current_time())
        return await super().summarize(request)


_LIVE: set[SdkSummarizer] = set()


class SdkSummarizer:
    """A `ScriptedSummarizer` look-alike that sends every call through a real SDK.

    Args:
        backend: which SDK summarizer and fake server (not ``scripted``).
        script, default: as for `ScriptedSummarizer`; items may also be `Reply`s. Once the
            script is used up with no default, the server answers HTTP 400 (non-retryable).
        model: the summarizer's model, sent to the server and reported back (``None``: a model
            without a price, reported as ``model = None`` here).

    Attributes (besides `ScriptedSummarizer`'s):
        server: the fake server; ``server.requests`` records the wire side.
        sdk: the SDK summarizer calls are forwarded to.
        started: `anyio.current_time` when each call started.
        problems: what went wrong on the wire side (asserted empty by `aclose`).
    """

    def __init__(
        self,
        backend: Backend,
        script: Iterable[Item] = (),
        *,
        default: Item | None = None,
        model: str | None = "scripted-summarizer",
    ) -> None:
        if backend == "scripted":
            raise ValueError("use ScriptedSummarizer for the scripted backend")
        self.backend = backend
        self._script: deque[Reply] = deque(to_reply(o, backend) for o in script)
        self.default = to_reply(default, backend) if default is not None else None
        self.model = model
        self.requests: list[SummaryRequest] = []
        self.started: list[float] = []
        self.completed = 0
        self.failed = 0
        self.cancelled = 0
        self.in_flight = 0
        self.problems: list[str] = []
        self._lock = threading.Lock()
        self._current: _Call | None = None
        self._calls: list[_Call] = []
        self.sdk: AnthropicSummarizer | OpenAIChatSummarizer | OpenAIResponsesSummarizer
        name = model or "unpriced-summarizer"
        # Replies without explicit usage are billed by the server's estimate. Caching is off
        # (a summary request asks for none): all of the prompt is uncached input, as in the
        # scripted estimate.
        self.server: FakeAnthropic | FakeOpenAI
        if backend == "anthropic":
            self.server = FakeAnthropic(default=self._serve, caching=False).start()
            self.sdk = AnthropicSummarizer(
                name, api_key="test", base_url=self.server.url, timeout=HTTP_TIMEOUT
            )
        else:
            self.server = FakeOpenAI(default=self._serve, caching=False).start()
            cls = OpenAIChatSummarizer if backend == "openai-chat" else OpenAIResponsesSummarizer
            self.sdk = cls(
                name, api_key="test", base_url=self.server.url + "/v1", timeout=HTTP_TIMEOUT
            )
        _LIVE.add(self)

    def push(self, *outcomes: Item) -> None:
        """Append outcomes to the script."""
        self._script.extend(to_reply(o, self.backend) for o in outcomes)

    @property
    def pending(self) -> int:
        """Scripted outcomes not used yet."""
        return len(self._script)

    @property
    def settled(self) -> bool:
        """Every call in flight reached the server, and every immediate one has its answer."""
        with self._lock:
            return all(c.served and (c.done or not _immediate(c.reply)) for c in self._calls)

    def _serve(self, body: Any) -> Reply:
        """The server's ``default``: the reply of the call waiting (in the server thread)."""
        with self._lock:
            call = self._current
            if call is None or call.served:
                # A request whose call is over (cancelled before it got here): nobody reads it.
                return Reply.error(400, message="no call is waiting for this request")
            if _prompt_of(self.backend, body) != call.request.prompt:
                self.problems.append("a request reached the server with another call's prompt")
                return Reply.error(400, message="unexpected prompt")
            call.served = True
            return call.reply

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        """Record ``request``, take the next outcome, and send the request through the SDK."""
        self.requests.append(request)
        self.started.append(anyio.current_time())
        reply = self._script.popleft() if self._script else self.default
        if reply is None:
            reply = Reply.error(400, message="the script is used up")
        call = _Call(request, reply)
        with self._lock:
            if self._current is not None:
                self.problems.append("two calls at once: replies could not be told apart")
            self._current = call
            self._calls.append(call)
        self.in_flight += 1
        try:
            result = await self.sdk.summarize(request)
        except anyio.get_cancelled_exc_class():
            self.cancelled += 1
            raise
        except SummarizerError:
            self.failed += 1
            raise
        finally:
            self.in_flight -= 1
            with self._lock:
                call.done = True
                self._calls.remove(call)
                if self._current is call:
                    self._current = None
        self.completed += 1
        return result

    async def aclose(self) -> None:
        """Check the server has no request left hanging and no fault of its own, then close
        the client and the server. Raises `AssertionError` listing what went wrong."""
        _LIVE.discard(self)
        problems = list(self.problems)
        if self.in_flight:
            problems.append(f"{self.in_flight} call(s) still in flight")
        # A cancelled request closes its connection; the server notices within moments.
        if not await poll(lambda: not self.server.in_progress, 2.0, 0.005):
            problems.append(f"{self.server.in_progress} request(s) left hanging on the server")
        await self.sdk.aclose()
        self.server.close()
        problems += [f"fake server bug: {e!r}" for e in self.server.errors]
        if problems:
            raise AssertionError(f"{self.backend}: " + "; ".join(problems))


def _all_settled() -> bool:
    return all(s.settled for s in list(_LIVE))


async def quiesce(limit: float = SETTLE_LIMIT) -> None:
    """Wait until every live `SdkSummarizer` is `settled`, and stays so over a few
    checkpoints (a retry after a fake sleep starts right away). Returns at once when no
    `SdkSummarizer` is live, so a scripted run sees no extra checkpoints."""
    if not _LIVE:
        return
    with anyio.fail_after(limit):
        while True:
            await poll(_all_settled, limit)
            for _ in range(3):
                await anyio.lowlevel.checkpoint()
            if _all_settled():
                return


async def poll(done: Callable[[], bool], limit: float, interval: float = 0.001) -> bool:
    """Wait until ``done()`` (checked every ``interval`` seconds) or ``limit`` seconds passed;
    returns ``done()``. For conditions that change in another thread, which no event reports."""
    with anyio.move_on_after(limit):
        while not done():  # noqa: ASYNC110 - set by the server thread
            await anyio.sleep(interval)
    return done()


_warm: set[Backend] = set()


async def _warm_up(backend: Backend) -> None:
    """One request per SDK and process, so its first-call costs (building the response
    models) do not land inside a test's timeout."""
    if backend == "scripted" or backend in _warm:
        return
    _warm.add(backend)
    summarizer = SdkSummarizer(backend, default="warm")
    try:
        await summarizer.summarize(SummaryRequest(system="s", prompt="p", max_tokens=256))
    finally:
        await summarizer.aclose()


class SummarizerFactory:
    """Makes the summarizers of one test on one backend: ``make(script, default=...)``.

    ``timeout``: a per-attempt timeout that ends a hang quickly yet leaves a normal reply a
    wide margin on this backend (a scripted reply takes no time, a request over a socket some
    milliseconds, more on a loaded machine).
    """

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.sdk = backend != "scripted"
        self.timeout = 1.0 if self.sdk else 0.05  # 0.6 s: a reply late at times under load
        self.made: list[Scripted | SdkSummarizer] = []

    def __call__(
        self,
        script: Iterable[Item] = (),
        *,
        default: Item | None = None,
        model: str | None = "scripted-summarizer",
    ) -> Scripted | SdkSummarizer:
        made: Scripted | SdkSummarizer
        if self.backend == "scripted":
            items = list(script)
            if any(isinstance(o, Reply) for o in [*items, default]):
                raise Unsupported("a Reply needs a fake server")
            made = Scripted(items, default=default, model=model)
        else:
            made = SdkSummarizer(self.backend, script, default=default, model=model)
        self.made.append(made)
        return made

    async def setup(self) -> None:
        await _warm_up(self.backend)

    async def aclose(self) -> None:
        """Close every summarizer made; fail if one left a request hanging or a task."""
        errors: list[str] = []
        for made in self.made:
            if isinstance(made, SdkSummarizer):
                try:
                    await made.aclose()
                except AssertionError as e:
                    errors.append(str(e))
            elif made.in_flight:
                errors.append(f"scripted: {made.in_flight} call(s) still in flight")
        leaked = [
            t.get_name()
            for t in asyncio.all_tasks()
            if not t.done() and t is not asyncio.current_task()
        ]
        if leaked:
            errors.append(f"tasks left running: {leaked}")
        gc.collect(1)  # unclosed sockets or clients warn when collected; warnings are errors
        if errors:
            raise AssertionError("\n".join(errors))
