"""`CachedSummarizer`: a real summarizer in a replay, in session time, with its replies kept.

```python
from agentctx.providers.anthropic_summarizer import AnthropicSummarizer
from agentctx.replay.cached_summarizer import CachedSummarizer, SummaryCache

clock = ReplayClock()
cache = SummaryCache(default_cache_path())          # ~/.cache/agentctx/summaries.jsonl
summarizer = CachedSummarizer(AnthropicSummarizer("claude-haiku-4-5"), cache, clock=clock)
strategy = Chain([LlmCompaction(summarizer, fallback=tiers, clock=clock, sleep=clock.sleep), tiers])
report = await replay(messages, budget=budget, strategy=strategy, clock=clock)
```

Each request is looked up in the cache first, by `request_key`: a SHA-256 of the model, the
system prompt, the prompt and the output cap, so the same request to the same model is sent
once, ever. A miss goes to the real summarizer; its reply (text, stop reason, usage, model)
and its measured wall latency are appended to the cache file as one JSON line at once, so an
interrupted replay keeps every reply it paid for, and a rerun of the same replay sends
nothing: its requests are the same because the latencies, read back, put every briefing at
the same point of the session.

With a ``clock`` (the replay's `ReplayClock`), the latency is session time: the clock is held
while the real request runs (the replay waits for it, however long it takes), then the
summarizer sleeps the measured latency on the clock, so the briefing comes back that many
seconds of the transcript later, as it would have in the session. A cached reply sleeps its
recorded latency. Failed requests are not cached (the next run tries again).

The cache file is JSON lines, one reply per line (last one wins; a line cut short by a killed
run is skipped). One `SummaryCache` may be shared by replays running in several threads.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from agentctx.errors import ConfigError, SummarizerError
from agentctx.messages import Usage, fingerprint, from_dict, to_dict
from agentctx.summarizer import SummaryResult, check_result

if TYPE_CHECKING:
    from agentctx.events import SummaryRejected
    from agentctx.replay.engine import ReplayClock
    from agentctx.summarizer import Summarizer, SummaryRequest

__all__ = [
    "GIVE_UP_AFTER",
    "NOT_SENT",
    "CachedReply",
    "CachedSummarizer",
    "SummarizerHealth",
    "SummaryCache",
    "default_cache_path",
    "is_server_failure",
    "never_sent",
    "refused",
    "request_key",
]

_USAGE = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "cache_write_1h_tokens",
)


def default_cache_path() -> Path:
    """``$XDG_CACHE_HOME/agentctx/summaries.jsonl`` (``~/.cache/agentctx/summaries.jsonl``
    when ``XDG_CACHE_HOME`` is unset): one cache for every transcript, so replaying a
    session again, from any directory, reuses what its summaries cost."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "agentctx" / "summaries.jsonl"


def request_key(
    model: str | None, request: SummaryRequest, max_tokens: int, *, conversation: bool = False
) -> str:
    """The cache key of ``request`` sent to ``model`` with an output cap of ``max_tokens``;
    with ``conversation``, of its `SummaryRequest.conversation` too (what a provider-native
    summarizer sends instead of the prompt)."""
    fields: list[object] = [model or "", request.system, request.prompt, max_tokens]
    if conversation:
        fields.append([fingerprint(m) for m in request.conversation])
    data = json.dumps(fields, ensure_ascii=False).encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True)
class CachedReply:
    """A summarizer's reply and how long it took, in wall seconds."""

    result: SummaryResult
    latency: float


def _to_json(key: str, model: str | None, reply: CachedReply) -> str:
    r = reply.result
    line = {
        "key": key,
        "model": model,
        "latency": round(reply.latency, 3),
        "result": {
            "text": r.text,
            "stop_reason": r.stop_reason,
            "model": r.model,
            "usage": {name: getattr(r.usage, name) for name in _USAGE},
            # Left out when as by default, so lines written before read the same.
            **({} if r.usage_known else {"usage_known": False}),
            **({"messages": [to_dict(m) for m in r.messages]} if r.messages else {}),
        },
    }
    return json.dumps(line, ensure_ascii=False)


def _from_json(line: str) -> tuple[str, CachedReply] | None:
    """The key and reply of one line, or ``None`` for a line that is not one (cut short,
    edited, from another version)."""
    try:
        data = json.loads(line)
        raw = data["result"]
        usage = Usage(**{name: raw["usage"].get(name, 0) for name in _USAGE})
        result = check_result(
            SummaryResult(
                text=raw["text"],
                stop_reason=raw["stop_reason"],
                usage=usage,
                model=raw.get("model"),
                messages=tuple(map(from_dict, raw.get("messages", ()))),
                usage_known=raw.get("usage_known", True),
            )
        )
        latency = float(data["latency"])
        key = data["key"]
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError, SummarizerError):
        # (An `UnsupportedMessageError`, a message that cannot be read, is a TypeError.)
        return None
    if not isinstance(key, str) or not latency >= 0 or latency == float("inf"):
        return None
    return key, CachedReply(result, latency)


class SummaryCache:
    """Summarizer replies by `request_key`, kept in the JSON-lines file ``path`` (``None``:
    in memory only). The file and its folder are created on the first reply stored.

    ``hits`` and ``sent`` count the lookups answered from the cache and the requests a real
    summarizer's server answered (with a reply or an error, or still running when
    ``--summarizer-timeout`` ran out; not one whose connection failed or that could not be
    encoded), each attempt, since this object was made. ``write_error`` says why the file
    could not be written (``None`` while every reply was): the replies are kept in memory
    all the same, since each one was paid for.
    """

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = Path(path) if path is not None else None
        self.hits = 0
        self.sent = 0
        self.write_error: str | None = None
        self._lock = threading.Lock()
        self._replies: dict[str, CachedReply] = {}
        if self.path is not None and self.path.exists():
            if not self.path.is_file():  # a pipe would block the open for good
                raise ConfigError(f"{self.path}: the summary cache must be a file")
            with self.path.open(encoding="utf-8", errors="surrogateescape") as f:
                for line in f:
                    parsed = _from_json(line)
                    if parsed is not None:
                        self._replies[parsed[0]] = parsed[1]

    def __len__(self) -> int:
        return len(self._replies)

    def get(self, key: str) -> CachedReply | None:
        """The reply stored under ``key``, counted as a hit; ``None`` if there is none."""
        with self._lock:
            reply = self._replies.get(key)
            if reply is not None:
                self.hits += 1
            return reply

    def sending(self) -> None:
        """Count a request that reached the real summarizer (`sent`)."""
        with self._lock:
            self.sent += 1

    def put(self, key: str, reply: CachedReply, *, model: str | None = None) -> None:
        """Store ``reply`` under ``key`` (``model``: the model it was sent to, for people
        reading the file) and append it to the file at once. A file that cannot be written
        is recorded in `write_error` (the first reason), never raised: the reply is paid for
        and the replay goes on with it."""
        with self._lock:
            self._replies[key] = reply
            if self.path is None:
                return
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a", encoding="utf-8", errors="surrogateescape") as f:
                    f.write(_to_json(key, model, reply) + "\n")
            except OSError as exc:
                if self.write_error is None:
                    self.write_error = f"{type(exc).__name__}: {exc.strerror or exc}"


GIVE_UP_AFTER = 3
"""Failed requests in a row (timeouts or server errors) after which a `SummarizerHealth`
stops asking the summarizer."""


NOT_SENT = "not sent: the summarizer"
"""How the `SummarizerError` of a request refused once given up begins (never sent, unpaid)."""

# A rejection's detail is "attempt <n>: <the last attempt's error>": a refusal's words at the
# start, where a server's own error text (after the SDK's "<provider>: HTTP <status>: ")
# cannot stand.
_REFUSED = re.compile(r"(?:attempt \d+: )?" + re.escape(NOT_SENT) + " ")


def refused(detail: str) -> bool:
    """Whether a `SummaryRejected` of ``detail`` ended on a refusal once the summarizer was
    given up: its last attempt was never sent (the refusal is not retried)."""
    return _REFUSED.match(detail) is not None


def never_sent(rejection: SummaryRejected) -> bool:
    """Whether no attempt of ``rejection``'s request was sent: its first was refused."""
    return rejection.attempts == 1 and refused(rejection.detail)


# Statuses that say the summarizer cannot answer any request until someone acts: a key or
# a permission refused.
_STUCK = frozenset({401, 403})


def is_server_failure(error: SummarizerError) -> bool:
    """Whether ``error`` says the summarizer failed, not the request: a 5xx (529, overloaded,
    too), a 401 or 403 (a key, a permission), a 429 whose error code is OpenAI's
    ``insufficient_quota`` (no later request fares better), or no status at all on a
    retryable error (a connection that failed or was cut, the SDK's own timeout, a 200 that
    could not be read). Another 4xx (400, 404, 413, 422, a 429 for a rate limit, which the
    next request may pass, whatever its text says of quotas) is the server at work answering
    about that request: no failure."""
    status = error.status
    if status is None:
        return error.retryable
    if status == 429:
        return error.code == "insufficient_quota"
    return status >= 500 or status in _STUCK


class SummarizerHealth:
    """Whether a real summarizer still answers, shared by the replays of one command (and
    their threads): after ``give_up_after`` failed requests in a row (timeouts, or server
    errors: `is_server_failure`) it is no longer asked, so a server that accepts and never
    answers, or answers every request with an error, costs a few requests, not three per
    briefing for the whole replay.

    ```python
    health = SummarizerHealth()
    summarizer = CachedSummarizer(real, cache, timeout=60, health=health)
    ...                                  # the replays
    if health.given_up:
        print(health.failures_in_a_row, health.last_failure, health.not_sent)
    ```

    ``given_up`` says whether it stopped asking; ``not_sent`` counts the attempts refused
    since, unsent (the retry of a request sent before it gave up is one too). Of the run of
    failures, ``timeouts_in_a_row`` were timeouts, and ``last_failure`` says why the last one
    failed.
    """

    def __init__(self, give_up_after: int = GIVE_UP_AFTER) -> None:
        self.give_up_after = give_up_after
        self.failures_in_a_row = 0
        self.timeouts_in_a_row = 0
        self.last_failure: str | None = None
        self.not_sent = 0
        self._lock = threading.Lock()

    @property
    def given_up(self) -> bool:
        """Whether the summarizer is no longer asked."""
        return self.failures_in_a_row >= self.give_up_after

    @property
    def only_timeouts(self) -> bool:
        """Whether every failure of the run was a timeout (how the output words it)."""
        return self.timeouts_in_a_row == self.failures_in_a_row

    def admit(self) -> bool:
        """Whether a request may be sent; a refusal is counted in ``not_sent`` (attempts
        refused unsent: a retry of a request sent before it gave up is one too)."""
        with self._lock:
            if self.given_up:
                self.not_sent += 1
                return False
            return True

    def answered(self) -> None:
        """A reply came (or an error that is no server failure): the run of failures is
        over."""
        with self._lock:
            if not self.given_up:  # (a request sent before it gave up: it stays given up)
                self.failures_in_a_row = 0
                self.timeouts_in_a_row = 0

    def failed(self, reason: str, *, timeout: bool = False) -> None:
        """A request failed for ``reason`` (a server error, or with ``timeout`` no reply in
        time)."""
        with self._lock:
            if self.given_up:  # the failure it gave up on is the one to tell
                return
            self.failures_in_a_row += 1
            if timeout:
                self.timeouts_in_a_row += 1
            self.last_failure = reason

    def refusal(self) -> str:
        """Why a request is not sent once given up, for its `SummarizerError`."""
        if self.only_timeouts:
            return f"{NOT_SENT} timed out {self.give_up_after} times in a row"
        return f"{NOT_SENT} failed {self.give_up_after} requests in a row"


class CachedSummarizer:
    """A `Summarizer` that answers from a `SummaryCache`, else from ``summarizer`` (and
    stores the reply), in session time when given the replay's ``clock`` (module docs).

    Args:
        summarizer: the real summarizer, e.g. `AnthropicSummarizer`.
        cache: where replies are looked up and stored.
        clock: the replay's clock: latencies become session time on it. ``None``: a hit
            answers at once and a miss takes its real time.
        timeout: wall seconds a request may take, whatever the replay clock says (it is
            held while the request runs); a request past it fails as a retryable
            `SummarizerError`. ``None``: no bound of its own.
        health: shared by the replays of a command, to stop asking a summarizer that timed
            out or failed several times in a row (`SummarizerHealth`); ``None``: always
            asked.
    """

    def __init__(
        self,
        summarizer: Summarizer,
        cache: SummaryCache,
        *,
        clock: ReplayClock | None = None,
        timeout: float | None = None,
        health: SummarizerHealth | None = None,
    ) -> None:
        self.summarizer = summarizer
        self.cache = cache
        self.clock = clock
        self.timeout = timeout
        self.health = health
        model = getattr(summarizer, "model", None)
        self.model: str | None = model if isinstance(model, str) else None

    def key(self, request: SummaryRequest) -> str:
        """The cache key of ``request`` for this summarizer's model and output cap."""
        cap = getattr(self.summarizer, "max_tokens", None)
        cap = cap if isinstance(cap, int) else request.max_tokens
        native = getattr(self.summarizer, "sends_conversation", False) is True
        return request_key(self.model, request, cap, conversation=native)

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        """The cached reply to ``request``, or the real summarizer's (stored before it is
        returned); either after its latency in session time when there is a clock."""
        key = self.key(request)
        hit = self.cache.get(key)
        if hit is not None:
            await self._elapse(hit.latency)
            return hit.result
        health = self.health
        if health is not None and not health.admit():
            raise SummarizerError(health.refusal(), retryable=False)
        clock = self.clock
        failure: SummarizerError | None = None
        with clock.held() if clock is not None else nullcontext():
            started = time.monotonic()
            try:
                result = check_result(await self._ask(request))
            except SummarizerError as exc:
                failure = exc
            latency = time.monotonic() - started
            if failure is None:
                self.cache.put(key, CachedReply(result, latency), model=self.model)
        # Released and asleep in one step (no await between): see ReplayClock.held.
        await self._elapse(latency if clock is not None else 0.0)
        if failure is not None:
            raise failure
        return result

    async def _ask(self, request: SummaryRequest) -> SummaryResult:
        """The real summarizer's reply; past `timeout` wall seconds, a retryable
        `SummarizerError`. How it went is told to `health` (`_count_failure`)."""
        try:
            result = await self._send(request)
        except TimeoutError:
            if self.timeout is None:  # the summarizer's own, passed on as it came
                raise
            self.cache.sending()  # in flight when its time ran out
            error = SummarizerError(
                f"no reply after {self.timeout:g} s (--summarizer-timeout)", retryable=True
            )
            if self.health is not None:
                self.health.failed(str(error), timeout=True)
            raise error from None
        except SummarizerError as exc:
            if exc.status is not None or exc.usage is not None:  # a server answered it
                self.cache.sending()
            self._count_failure(exc)
            raise
        self.cache.sending()
        if self.health is not None:
            self.health.answered()
        return result

    async def _send(self, request: SummaryRequest) -> SummaryResult:
        if self.timeout is None:
            return await self.summarizer.summarize(request)
        # Wall time: the replay clock stands still while the request runs.
        with anyio.fail_after(self.timeout):
            return await self.summarizer.summarize(request)

    def _count_failure(self, error: SummarizerError) -> None:
        """Tell `health` of a request that failed with ``error``: a failure of the summarizer
        (`is_server_failure`) counts towards giving up; an error about the request itself (a
        400, a rate limit's 429) means the server works."""
        if self.health is None:
            return
        if is_server_failure(error):
            self.health.failed(str(error))
        else:
            self.health.answered()

    async def _elapse(self, seconds: float) -> None:
        if self.clock is not None:
            await self.clock.sleep(seconds)

    async def aclose(self) -> None:
        """Close the real summarizer's client if it has an ``aclose`` (the SDK summarizers)."""
        close: Any = getattr(self.summarizer, "aclose", None)
        if close is not None:
            await close()
