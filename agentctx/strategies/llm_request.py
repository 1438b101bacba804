"""The request side of `LlmCompaction`: one summarization at a time, in the background, under
its guards, with every billed response accounted for.

```python
requests = Requester(summarizer, config, on_failure=lambda job: ...)
if requests.start(job, ctx.tasks, ctx.emit):   # False while one runs or the group is closing
    ...
ready = requests.take()                        # a validated briefing, once one is back
print(requests.spend)                          # usage and cost of every billed response
```

Guards: a timeout per attempt and a deadline over all attempts and the waits between them;
retries of retryable errors only (`SummarizerError.retryable`, timeouts) per `RetryPolicy`;
cancellation (`cancel`, or the task group closing); the slot is free again however the
request ends. A briefing becomes ready only if it ends on ``stop``, is not empty and has every
required section; otherwise, or when its span went stale meanwhile, it is reported with its
cost (`SummaryRejected`, `SummaryStale`) and dropped.

Sizing (`agentctx.strategies.llm_sizing`): with ``summarizer_context_window`` set, each request
is sized to fit the summarizer's window; a request the server still refuses as too large is
sent again at once with half the transcript, and later requests keep the smaller size.
"""

from __future__ import annotations

import random as _random
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import anyio

from agentctx import telemetry
from agentctx._log import log
from agentctx._usage import Unpriced, billed_usage
from agentctx.errors import SummarizerError
from agentctx.events import CompactionWarning, SummaryRejected, SummaryStale, SummaryStats
from agentctx.messages import Usage
from agentctx.pricing import price_for
from agentctx.strategies.llm_sizing import fit_request, too_large
from agentctx.summarizer import (
    SummaryRequest,
    check_briefing,
    check_result,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from anyio.abc import TaskGroup

    from agentctx.events import Event
    from agentctx.messages import Message
    from agentctx.strategies.llm_config import LlmCompactionConfig
    from agentctx.summarizer import Summarizer, SummaryResult

__all__ = ["Job", "Ready", "Requester", "SummarizerSpend"]


@dataclass(frozen=True, slots=True)
class SummarizerSpend:
    """What the summarizer cost this session: every billed response, used or not.

    ``cost_usd`` is ``None`` once any response had no known price.
    """

    usage: Usage
    cost_usd: float | None
    requests: int


@dataclass(slots=True, eq=False)
class Job:
    """One summarization, from arming to its end.

    Attributes:
        start: raw index where the span starts (a previous briefing's span start, if any).
        cut: raw index the span ends before.
        rewinds: `CompactionContext.rewinds` when armed: a rewind or edit after it that cuts
            the history back below ``cut`` leaves the briefing nothing to splice into.
        messages: the view messages sent as the transcript.
        previous: the briefing this job updates, if any.
        span_messages: view messages the briefing replaces.
        armed_tokens: prompt size when armed.
        limit: the hard budget when armed.
        first: where the view messages the briefing replaces begin in ``conversation``: a
            briefing no shorter than they are is too large, however the view changed since.
        stale: why its briefing can no longer be spliced, once known (it is then not sent,
            or reported as stale when it arrives).
        conversation: the view through the end of the span when armed, for a
            provider-native summarizer (`SummaryRequest.conversation`).
        base: the ready, not yet spliced briefing this job brings up to date (``previous``
            is its text). If it still waits when this one is accepted, this one takes its
            place and it is reported as `SummaryStale` ``updated``.
    """

    start: int
    cut: int
    rewinds: int
    messages: tuple[Message, ...]
    previous: str | None
    span_messages: int
    armed_tokens: int
    limit: int
    first: int
    stale: str | None = None
    scope: anyio.CancelScope | None = None
    owner: TaskGroup | None = None
    started: bool = False
    conversation: tuple[Message, ...] = ()
    base: Ready | None = None


@dataclass(frozen=True, slots=True)
class Ready:
    """A validated, billed briefing waiting to be spliced: ``text``, or the provider-native
    ``messages`` that replace the span as they are (`SummaryResult.messages`)."""

    job: Job
    text: str
    usage: Usage
    cost: float | None
    model: str | None
    messages: tuple[Message, ...] = ()

    def stats(self, summarized: int) -> SummaryStats:
        """The event's summary statistics, with ``summarized`` messages replaced."""
        return SummaryStats(summarized, self.usage, self.cost, self.model)


class Requester:
    """Sends the summary requests of one `LlmCompaction` (see the module docs).

    Args:
        summarizer: sends each attempt.
        config: timeout, deadline, retry policy, prompt texts, transcript caps, price.
        clock, sleep, random: monotonic seconds, an async sleep and a [0, 1) random source
            (tests inject fakes). Defaults: anyio's clock and sleep, `random.random`.
        on_failure: called with the job when a request gave no usable briefing (failed,
            timed out, rejected), so the caller can wait before asking again.
    """

    def __init__(
        self,
        summarizer: Summarizer,
        config: LlmCompactionConfig,
        *,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        random: Callable[[], float] | None = None,
        on_failure: Callable[[Job], None] | None = None,
    ) -> None:
        self.summarizer = summarizer
        self.config = config
        self.inflight: Job | None = None
        self.ready: Ready | None = None
        self._clock = clock or anyio.current_time
        self._sleep = sleep or anyio.sleep
        self._random = random or _random.random
        self._on_failure = on_failure or (lambda job: None)
        self._usage = Usage()
        self._cost: float | None = 0.0
        self._billed = 0
        # Cap on the transcript's characters, learned from the servers: half of one they
        # refused as too large, so the same failure is not repeated.
        self._max_chars: int | None = None
        self._warned_window = False

    @property
    def spend(self) -> SummarizerSpend:
        """Usage and cost of every billed response so far."""
        return SummarizerSpend(self._usage, self._cost, self._billed)

    def start(self, job: Job, tasks: TaskGroup, emit: Callable[[Event], None]) -> bool:
        """Run ``job`` in ``tasks``; ``False`` if one is in flight or the group is closing."""
        self.reap(tasks, emit)
        if self.inflight is not None:
            return False
        self.inflight = job
        job.owner = tasks
        try:
            tasks.start_soon(self._run, job, emit, name="agentctx-llm-compaction")
        except RuntimeError:  # the task group is closing
            self.inflight = None
            return False
        telemetry.request_started()
        return True

    def reap(self, tasks: TaskGroup | None, emit: Callable[[Event], None]) -> None:
        """Free the slot of a request whose task was cancelled before it ever ran.

        Such a task never reaches its own cleanup, and its cancellation took its task group
        down (the manager runs background work in a new one, ``tasks``): a failed request.
        """
        job = self.inflight
        if job is not None and not job.started and job.owner is not tasks:
            self.inflight = None
            emit(SummaryRejected("failed", "its task was cancelled before it started", 0, None))
            self._on_failure(job)

    def take(self) -> Ready | None:
        """The ready briefing, if any; the slot is empty afterwards."""
        ready, self.ready = self.ready, None
        return ready

    def give_back(self, ready: Ready, emit: Callable[[Event], None]) -> None:
        """Put a briefing `take` handed out back in the slot: its splice was cut short.
        An update of it that arrived meanwhile keeps the slot; this one is then reported as
        one an update replaced."""
        if self.ready is None:
            self.ready = ready
        else:
            emit(SummaryStale("updated", ready.stats(0)))

    def cancel(self) -> None:
        """Cancel the request in flight, if any."""
        job = self.inflight
        if job is not None and job.scope is not None:
            job.scope.cancel()

    async def _run(self, job: Job, emit: Callable[[Event], None]) -> None:
        job.started = True
        try:
            with anyio.CancelScope() as scope:
                job.scope = scope
                try:
                    await self._summarize(job, emit)
                except BaseException as e:
                    if _ends_background_work(e, job):
                        raise
                    # A bug, or a cancellation that is not the manager's: a failed request
                    # that must not take the manager's background work down with it.
                    _forget_stray_cancel(e)
                    log.exception("llm compaction: background summary failed")
                    emit(SummaryRejected("failed", f"{type(e).__name__}: {e}", 0, None))
                    self._on_failure(job)
        finally:
            # However the task ends (done, failed, timed out, cancelled), the slot is free.
            if self.inflight is job:
                self.inflight = None

    def _request(self, job: Job) -> SummaryRequest | str:
        """The request for ``job``, sized (see `fit_request`); why not, when it cannot fit."""
        cfg = self.config
        fit = fit_request(
            job.messages,
            job.previous,
            cfg,
            window=cfg.summarizer_context_window,
            max_chars=self._max_chars,
        )
        if isinstance(fit, str):
            return fit
        return SummaryRequest(
            system=cfg.system_prompt,
            prompt=fit.prompt,
            max_tokens=fit.max_tokens,
            transcript=fit.transcript,
            previous_briefing=job.previous,
            messages=job.span_messages,
            conversation=job.conversation,
        )

    def _shrink(self, request: SummaryRequest, emit: Callable[[Event], None], detail: str) -> None:
        """A server refused ``request`` as too large: later ones carry half its transcript, or
        half the cap it was sent under (the newest message is kept whole, so a transcript
        may be longer than its cap), each refusal halving it again."""
        sent = len(request.transcript)
        self._max_chars = min(sent, self._max_chars or sent) // 2
        window = self.config.summarizer_context_window
        message = (
            f"the summarizer refused a request as too large ({detail}); requests now carry at "
            f"most {self._max_chars} characters of transcript. "
            + (
                "Set LlmCompactionConfig.summarizer_context_window to the summarizer "
                "model's context window (see LlmCompactionConfig.small_model)"
                if window is None
                else f"Is summarizer_context_window={window} the model's real window?"
            )
        )
        log.warning("llm compaction: " + message)
        if not self._warned_window:
            self._warned_window = True
            emit(CompactionWarning("summarizer_window", message))

    async def _summarize(self, job: Job, emit: Callable[[Event], None]) -> None:
        request = self._request(job)
        if isinstance(request, str):
            log.warning("llm compaction: request does not fit", detail=request)
            if not self._warned_window:
                self._warned_window = True
                emit(CompactionWarning("summarizer_window", request))
            emit(SummaryRejected("failed", f"not sent: {request}", 0, None))
            self._on_failure(job)
            return
        cfg = self.config
        result, attempts, reason, detail, billed = await self._attempts(request, job, emit)
        if result is None and reason == "stale":
            log.debug("llm compaction: request dropped before sending", detail=detail)
            return
        if result is None:
            log.warning("llm compaction: no briefing", reason=reason, detail=detail)
            emit(SummaryRejected(reason, detail, attempts, billed))
            self._on_failure(job)
            return
        ready = self._bill(job, result)
        problem = check_briefing(result, cfg.required_sections)
        if problem is not None:
            log.warning("llm compaction: briefing rejected", reason=problem[0], detail=problem[1])
            emit(SummaryRejected(problem[0], problem[1], attempts, ready.stats(0)))
            self._on_failure(job)
            return
        if job.stale is not None:
            emit(SummaryStale(job.stale, ready.stats(0)))
            return
        if job.base is not None and self.ready is job.base:
            # The update takes the waiting briefing's place; what that one cost is reported
            # now, as every billed request is, in an event of its own.
            emit(SummaryStale("updated", job.base.stats(0)))
        self.ready = ready

    async def _attempts(
        self, request: SummaryRequest, job: Job, emit: Callable[[Event], None]
    ) -> tuple[SummaryResult | None, int, str, str, SummaryStats | None]:
        """Send ``request`` until it succeeds or may not be retried; never past the deadline.
        One refused as too large is sent again at once, smaller (see `_shrink`). Without a
        result, the last element is what the last attempt's reply cost, if one came and was
        billed; a billed reply retried is reported at once (`SummaryRejected`)."""
        cfg = self.config
        deadline = self._clock() + cfg.deadline
        attempt = 0
        while True:
            if job.stale is not None:  # known useless before it was sent: not sent
                return None, attempt, "stale", f"not sent: {job.stale.replace('_', ' ')}", None
            attempt += 1
            remaining = deadline - self._clock()
            if remaining <= 0:
                detail = f"deadline of {cfg.deadline:g} s passed"
                return None, attempt - 1, "deadline", detail, None
            limit = min(cfg.timeout, remaining)
            retry_after: float | None = None
            billed: SummaryStats | None = None  # what this attempt's reply cost, if billed
            replied = False
            try:
                with (
                    telemetry.attempt(self.summarizer, cfg.price, request, attempt) as traced,
                    anyio.fail_after(limit),  # inside the span: it sees the TimeoutError
                ):
                    reply = await self.summarizer.summarize(replace(request, attempt=attempt))
                    replied = True
                    try:
                        result = check_result(reply)  # malformed: a failed attempt, not retried
                    except SummarizerError as e:
                        if e.usage is None:  # a reply came all the same, and was billed
                            e.usage = getattr(reply, "usage", None)
                            unpriced = getattr(reply, "usage_known", True) is False
                            if unpriced and isinstance(e.usage, Usage):
                                e.usage = Unpriced(e.usage)  # as it would have been priced
                        raise
                    traced.result = result
                return result, attempt, "", "", None
            except TimeoutError:
                reason = "timeout" if limit >= cfg.timeout else "deadline"
                detail = f"attempt {attempt} had no reply after {limit:g} s"
                retryable = reason == "timeout"
            except SummarizerError as e:
                reason, retryable, retry_after = "failed", e.retryable, e.retry_after
                status = f" (HTTP {e.status})" if e.status is not None else ""
                detail = f"attempt {attempt}: {e}{status}"
                read = billed_usage(e.usage)
                if read is None and replied:  # a reply with no usage: billed all the same
                    read = Usage(), False
                if read is not None:  # a reply came, unusable, and was billed
                    usage, known = read
                    billed = SummaryStats(0, usage, *self._charge(usage, None, known=known))
                if too_large(e) and getattr(self.summarizer, "sends_conversation", False):
                    # Less transcript would be the same request: it fails, and the next
                    # one's span (a view grown or compacted since) is its own.
                    return None, attempt, reason, detail, billed
                if too_large(e):
                    self._shrink(request, emit, str(e))
                    smaller = self._request(job)
                    if (
                        attempt >= cfg.retry.max_attempts
                        or isinstance(smaller, str)
                        or len(smaller.transcript) >= len(request.transcript)
                    ):  # it would be refused again (a summarizer may call that retryable)
                        return None, attempt, reason, detail, billed
                    if billed is not None:
                        emit(SummaryRejected(reason, detail, attempt, billed))
                    request = smaller
                    continue
            except BaseException as e:
                if _ends_background_work(e, job):
                    raise
                # A summarizer bug (any exception, a custom BaseException, a CancelledError
                # of its own or someone cancelling this task) fails this request; it must not
                # reach the manager's task group, where it would end all background work.
                _forget_stray_cancel(e)
                log.exception("llm compaction: summarizer raised")
                reason, retryable = "failed", False
                detail = f"attempt {attempt}: {type(e).__name__}: {e}"
            if not retryable or attempt >= cfg.retry.max_attempts:
                return None, attempt, reason, detail, billed
            delay = cfg.retry.delay(attempt, retry_after, self._random())
            if self._clock() + delay >= deadline:
                detail = f"{detail}; a retry in {delay:g} s would pass it"
                return None, attempt, "deadline", detail, billed
            if billed is not None:  # reported now, as every billed request is, once
                emit(SummaryRejected(reason, detail, attempt, billed))
            log.info("llm compaction: retrying", attempt=attempt, delay=delay, detail=detail)
            await self._sleep(delay)

    def _bill(self, job: Job, result: SummaryResult) -> Ready:
        cost, model = self._charge(result.usage, result.model, known=result.usage_known)
        return Ready(job, result.text.strip(), result.usage, cost, model, result.messages)

    def _charge(
        self, usage: Usage, model: str | None, *, known: bool = True
    ) -> tuple[float | None, str | None]:
        """Add one billed reply to the spend; its cost (``None`` unless ``known``: counts
        read as 0 would price it too low) and the model it is priced as."""
        model = model or getattr(self.summarizer, "model", None)
        model = model if isinstance(model, str) else None
        price = self.config.price if self.config.price is not None else price_for(model)
        cost = price.reply_cost(usage) if price is not None and known else None
        self._usage = self._usage + usage
        self._billed += 1
        self._cost = None if self._cost is None or cost is None else self._cost + cost
        return cost, model


def _ends_background_work(e: BaseException, job: Job) -> bool:
    """Whether ``e`` must leave the request as it is: an interrupt, or a cancellation that a
    cancel scope around the request asked for (the manager closing, `Requester.cancel`)."""
    if isinstance(e, KeyboardInterrupt | SystemExit):
        return True
    if not isinstance(e, anyio.get_cancelled_exc_class()):
        return False
    scope, owner = job.scope, job.owner
    return (
        (scope is not None and scope.cancel_called)
        or (owner is not None and owner.cancel_scope.cancel_called)
        or anyio.current_effective_deadline() == float("-inf")
    )


def _forget_stray_cancel(e: BaseException) -> None:
    """Take back the asyncio cancel request behind a cancellation no scope asked for (someone
    called ``task.cancel()``), so the rest of the task's work is not cancelled with it."""
    if not isinstance(e, anyio.get_cancelled_exc_class()):
        return
    import asyncio  # only the asyncio backend has task-level cancel requests

    try:
        task = asyncio.current_task()
    except RuntimeError:  # not running on asyncio
        return
    if task is not None and task.cancelling():
        task.uncancel()
