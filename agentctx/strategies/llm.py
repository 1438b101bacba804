"""`LlmCompaction`: summarize old history on a cheap model in the background, splice it in later.

```python
from agentctx import Chain, ContextManager, DeterministicCompaction
from agentctx.strategies.llm import LlmCompaction

strategy = Chain([LlmCompaction(summarizer), DeterministicCompaction()])
async with ContextManager(budget, strategy=strategy) as ctx:
    ...
    print(strategy.strategies[0].spend)     # what the summarizer cost this session
```

Always chain it in front of `DeterministicCompaction`: the deterministic tiers act whenever no
usable briefing is ready (not yet back, failed, rejected, stale), so the loop never waits.

How it works, turn by turn (``prepare`` never awaits the summarizer):

```text
turn N   view above trigger_ratio · limit
  └── start: summarize view[head:cut) in a standalone request (a task in the manager's group)
turn N+1..M   loop continues untouched; the request runs
turn M   view above the limit and the briefing is back and valid
  └── splice: ReplaceSpan(head..cut) -> SummaryMessage(SUMMARY_MARKER + briefing)
```

- The head (everything through the task, at least ``keep_first`` messages) is sent verbatim
  and never summarized; the tail keeps ``retain_tail_tokens`` (default ``min(20k, limit/4)``).
  The span is the oldest stretch in between on safe step boundaries (never inside a tool
  batch) holding no protected message: the latest user message, the newest complete turn,
  signed thinking of the in-flight tool loop.
- Requests are armed against the view this call returns. When the view is over the limit
  the tiers after this strategy are about to rewrite it, so arming waits one call. One
  request at a time; retries, timeouts and an overall deadline bound it.
- A briefing is spliced only if the raw history it summarized is unchanged (rewinds and
  edits make it stale), it ends on ``stop``, is not empty, has every required section, and
  still saves tokens. Otherwise it is reported and dropped. If the tiers dropped or condensed
  a stretch running from inside its span past the cut meanwhile, the splice takes that
  stretch too and sends its replacement right after the briefing, byte for byte.
- If the splice is still over the limit, the ``fallback`` tiers run on the tail only, so the
  briefing that was paid for survives; if head and briefing cannot fit at all, the briefing
  is discarded and the event says ``method="deterministic"``.
- Over the limit with the briefing not back yet, the tiers first run on what follows the
  span being summarized, just far enough to get under the limit: the request stays valid and
  the rewrite touches only the recent end of the prefix cache. An earlier briefing is kept
  the same way. What is still over the limit is left to the tiers after this strategy.
- When the provider's cache has gone cold, a ready briefing is spliced above the trigger.
- A later request updates the previous briefing (sent along with the new span) instead of
  summarizing a summary.
- Every billed request shows up once in an event (`ContextCompacted.summary`,
  `SummaryRejected` or `SummaryStale`) and in `LlmCompaction.spend`.

One instance per session.
"""

from __future__ import annotations

import bisect
import math
import operator
import random as _random
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

import anyio

from agentctx import boundaries as b
from agentctx._log import log
from agentctx.budget import Budget
from agentctx.errors import ConfigError, SummarizerError
from agentctx.events import (
    CompactionWarning,
    ContextCompacted,
    SummaryRejected,
    SummaryStale,
    SummaryStats,
)
from agentctx.ledger import Decision, ReplaceSpan, anchor
from agentctx.messages import Message, SummaryMessage, Usage, UserMessage, fingerprint
from agentctx.pricing import Price, price_for
from agentctx.strategies.deterministic import DeterministicCompaction
from agentctx.strategy import CompactionContext
from agentctx.summarizer import (
    DEFAULT_INSTRUCTION,
    DEFAULT_SYSTEM_PROMPT,
    DEFAULT_UPDATE_INSTRUCTION,
    REQUIRED_SECTIONS,
    TRANSCRIPT_BLOCK_CHARS,
    TRANSCRIPT_TOTAL_CHARS,
    SummaryRequest,
    SummaryResult,
    build_prompt,
    check_briefing,
    serialize_transcript,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from agentctx.events import Event
    from agentctx.strategy import CompactionStrategy
    from agentctx.summarizer import Summarizer

__all__ = [
    "DEFAULT_RETAIN_TAIL_TOKENS",
    "SUMMARY_MARKER",
    "LlmCompaction",
    "LlmCompactionConfig",
    "RetryPolicy",
    "SummarizerSpend",
    "is_briefing",
]

SUMMARY_MARKER = "[Context compacted: a briefing on the earlier conversation, which it replaces]"
"""Constant first line of every spliced briefing, so splices are recognizable."""

DEFAULT_RETAIN_TAIL_TOKENS = 20_000
"""Ceiling of the default retained tail; the default is ``min(this, limit // 4)``."""

MIN_SUMMARIZED_SPAN = 4
"""A span of fewer view messages is not worth a request or a cache break."""

MIN_SUMMARY_TOKENS = 256
"""Floor of ``max_summary_tokens``: below it no model fits the five sections."""

_SYNTHETIC_HEAD = UserMessage.of("[agentctx: the head and the briefing come before this point]")


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """Retries of one summarization: exponential backoff with jitter, clamped ``Retry-After``.

    Attempts are numbered from 1; after failed attempt ``n`` the wait is
    ``min(max_delay, base_delay * 2 ** (n - 1))``, shortened by up to ``jitter`` (a 0-1
    fraction) at random, or the provider's ``Retry-After`` clamped to ``max_retry_after``.
    Only retryable errors (`SummarizerError.retryable`, timeouts) are retried.
    """

    max_attempts: int = 3
    base_delay: float = 1.0
    max_delay: float = 30.0
    jitter: float = 0.5
    max_retry_after: float = 60.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError(f"max_attempts must be >= 1, got {self.max_attempts}")
        for name in ("base_delay", "max_delay", "max_retry_after"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")
        if not 0 <= self.jitter <= 1:
            raise ConfigError(f"jitter is a 0-1 fraction, got {self.jitter!r}")

    def delay(self, attempt: int, retry_after: float | None, rand: float) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based); ``rand`` is in [0, 1)."""
        if retry_after is not None and math.isfinite(retry_after):
            return min(max(0.0, retry_after), self.max_retry_after)
        backoff = min(self.max_delay, self.base_delay * 2.0 ** max(0, attempt - 1))
        return backoff * (1.0 - self.jitter * rand)


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmCompactionConfig:
    """Settings of `LlmCompaction`.

    Attributes:
        trigger_ratio: 0-1 fraction of the limit where a background summary starts;
            ``None`` uses the budget's ``trigger_ratio``.
        retain_tail_tokens: tokens of recent messages kept verbatim after the briefing;
            ``None`` derives ``min(DEFAULT_RETAIN_TAIL_TOKENS, limit // 4)`` on every call (a
            fixed 20k would silently disable the strategy on small windows). An explicit
            value is used as given; a one-time `CompactionWarning` says when it leaves
            nothing to summarize.
        keep_first: view messages always sent verbatim at the start (at least through the
            task, the first user message).
        max_summary_tokens: cap on the briefing (floor 256); a briefing that hits it stops on
            ``length`` and is rejected.
        timeout: seconds one attempt may take.
        deadline: seconds all attempts and the waits between them may take together.
        retry: the retry policy.
        price: USD prices of the summarizer model; ``None`` looks the model up in
            `agentctx.pricing` (unknown models cost ``None``, never 0).
        system_prompt, instruction, update_instruction: the request's texts; the update
            instruction is used when a previous briefing is sent along.
        required_sections: markdown headings a briefing must have (empty: no check).
        warn_after_fallbacks: consecutive over-limit calls without a splice (after a request
            was made) before a ``losing_race`` warning; it re-arms after a splice.
        cold_cache_seconds: after this long without a model call the provider's prefix cache
            has expired, so a ready briefing is spliced above the trigger already (a rewrite
            is free then); ``None`` splices only over the limit.
        protect_paid_work: over the limit with no briefing to splice, first run the fallback
            tiers on what follows the span in flight (just under the limit) and on what
            follows an earlier briefing, so neither is lost; ``False`` leaves every fallback
            to the strategies chained after this one.
        transcript_block_chars, transcript_total_chars: transcript caps.
    """

    trigger_ratio: float | None = None
    retain_tail_tokens: int | None = None
    keep_first: int = 1
    max_summary_tokens: int = 2_000
    timeout: float = 120.0
    deadline: float = 300.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    price: Price | None = None
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    instruction: str = DEFAULT_INSTRUCTION
    update_instruction: str = DEFAULT_UPDATE_INSTRUCTION
    required_sections: tuple[str, ...] = REQUIRED_SECTIONS
    warn_after_fallbacks: int = 5
    cold_cache_seconds: float | None = 300.0
    protect_paid_work: bool = True
    transcript_block_chars: int = TRANSCRIPT_BLOCK_CHARS
    transcript_total_chars: int = TRANSCRIPT_TOTAL_CHARS

    def __post_init__(self) -> None:
        ratio = self.trigger_ratio
        if ratio is not None and not (math.isfinite(ratio) and 0 < ratio <= 1):
            raise ConfigError(f"trigger_ratio is a 0-1 fraction, got {ratio!r}")
        if self.retain_tail_tokens is not None and self.retain_tail_tokens < 0:
            raise ConfigError("retain_tail_tokens must be >= 0")
        if self.keep_first < 0 or self.warn_after_fallbacks < 1:
            raise ConfigError("keep_first must be >= 0 and warn_after_fallbacks >= 1")
        for name in ("timeout", "deadline"):
            value = getattr(self, name)
            if not (value > 0 and not math.isnan(value)):
                raise ConfigError(f"{name} must be positive seconds, got {value!r}")
        if self.transcript_block_chars < 1 or self.transcript_total_chars < 1:
            raise ConfigError("transcript caps must be positive")
        if self.max_summary_tokens < MIN_SUMMARY_TOKENS:
            log.warning(
                "max_summary_tokens below the floor; using the floor",
                requested=self.max_summary_tokens,
                floor=MIN_SUMMARY_TOKENS,
            )
            object.__setattr__(self, "max_summary_tokens", MIN_SUMMARY_TOKENS)


@dataclass(frozen=True, slots=True)
class SummarizerSpend:
    """What the summarizer cost this session: every billed response, used or not.

    ``cost_usd`` is ``None`` once any response had no known price.
    """

    usage: Usage
    cost_usd: float | None
    requests: int


@dataclass(slots=True, eq=False)
class _Job:
    """One summarization, from arming to its end."""

    start: int  # raw index where the span starts (a previous briefing's span start, if any)
    cut: int  # raw index the span ends before
    prefix: tuple[Message, ...]  # raw[:cut] when armed: what must be unchanged to splice
    messages: tuple[Message, ...]  # view messages sent as the transcript
    previous: str | None  # the briefing this job updates
    span_messages: int  # view messages the briefing replaces
    armed_tokens: int
    limit: int
    stale: str | None = None  # why its briefing can no longer be spliced, once known
    scope: anyio.CancelScope | None = None


@dataclass(frozen=True, slots=True)
class _Ready:
    job: _Job
    text: str
    usage: Usage
    cost: float | None
    model: str | None

    def stats(self, summarized: int) -> SummaryStats:
        return SummaryStats(summarized, self.usage, self.cost, self.model)


@dataclass(frozen=True, slots=True)
class _Cut:
    start: int  # view index where the span starts
    end: int  # view index the span ends before


def is_briefing(message: Message) -> bool:
    """Whether ``message`` is a briefing `LlmCompaction` spliced."""
    return isinstance(message, SummaryMessage) and message.text.startswith(SUMMARY_MARKER)


def _briefing_text(message: Message) -> str | None:
    if isinstance(message, SummaryMessage) and message.text.startswith(SUMMARY_MARKER):
        return message.text.removeprefix(SUMMARY_MARKER).strip()
    return None


class LlmCompaction:
    """Background LLM summarization as a `CompactionStrategy` (see the module docs).

    Args:
        summarizer: sends the requests (route it to a fast, cheap model).
        config: the settings.
        fallback: the tiers run on the tail of a splice that is still over the limit, and on
            the part after an earlier briefing when no new one is ready; pass the same
            `DeterministicCompaction` you chain after this strategy. Default: a default one.
        clock, sleep, random: monotonic seconds, an async sleep and a [0, 1) random source
            for deadlines, backoff and jitter (tests inject fakes). Defaults: anyio's clock
            and sleep, `random.random`.
    """

    def __init__(
        self,
        summarizer: Summarizer,
        config: LlmCompactionConfig | None = None,
        *,
        fallback: CompactionStrategy | None = None,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        random: Callable[[], float] | None = None,
    ) -> None:
        self.summarizer = summarizer
        self.config = config if config is not None else LlmCompactionConfig()
        self.fallback: CompactionStrategy = fallback or DeterministicCompaction()
        self._clock = clock or anyio.current_time
        self._sleep = sleep or anyio.sleep
        self._random = random or _random.random
        self._inflight: _Job | None = None
        self._ready: _Ready | None = None
        self._ctx: CompactionContext | None = None  # the context of the previous call
        self._known = 0  # len(raw) at the previous call: a smaller ctx.sent means a rewind
        self._version = -1  # ledger version at the end of the previous call
        self._fell_back = False  # over the limit with nothing spliced in the previous call
        self._deferred = False
        self._next_arm_tokens = 0
        self._requests_started = 0
        self._fallbacks = 0
        self._warned: set[str] = set()
        self._usage = Usage()
        self._cost: float | None = 0.0
        self._billed = 0

    # -- inspection ---------------------------------------------------------------------

    @property
    def phase(self) -> Literal["idle", "in_flight", "ready"]:
        """``in_flight`` while a request runs, ``ready`` while a briefing waits to be spliced."""
        if self._inflight is not None:
            return "in_flight"
        return "ready" if self._ready is not None else "idle"

    @property
    def spend(self) -> SummarizerSpend:
        """Usage and cost of every billed summarizer response this session."""
        return SummarizerSpend(self._usage, self._cost, self._billed)

    def retain_tail_for(self, limit: int) -> int:
        """The retained tail in tokens for a hard budget of ``limit`` tokens."""
        explicit = self.config.retain_tail_tokens
        return explicit if explicit is not None else min(DEFAULT_RETAIN_TAIL_TOKENS, limit // 4)

    def cancel(self) -> None:
        """Cancel the request in flight, if any (the manager's close does this too)."""
        job = self._inflight
        if job is not None and job.scope is not None:
            job.scope.cancel()

    # -- the hot path -------------------------------------------------------------------

    async def compact(self, ctx: CompactionContext) -> None:
        """Splice a ready briefing when over the limit; start a request past the trigger."""
        # prepare() may call a strategy several times with the same context (to a fixed
        # point); the rewind check belongs to the first call only.
        if ctx is not self._ctx and ctx.sent < self._known:
            self._after_rewind(ctx)
        self._ctx = ctx
        if ctx.ledger.version != self._version:
            if self._fell_back:  # the tiers after this strategy compacted in the last call
                self._count_fallback(ctx.emit)
            self._check_superseded(ctx)
            self._next_arm_tokens = 0  # a different view: arming may be worth trying again
        self._fell_back = False
        limit = ctx.budget.limit
        tokens = ctx.prompt_tokens
        cold = self._ready is not None and self._cold(ctx) and tokens > self._trigger(ctx)
        if (tokens > limit or cold) and self._ready is not None and ctx.counter.refine(ctx.view):
            # About to decide on a splice: new messages carry quick, deliberately high
            # estimates. (With nothing to splice, refining is left to the tiers that act.)
            tokens = ctx.prompt_tokens
        if tokens > limit:
            await self._over_limit(ctx, tokens)
        elif cold and self._ready is not None and tokens > self._trigger(ctx):
            # The provider's prefix cache has expired anyway: splicing now costs no cache
            # write, and leaves the tiers nothing to do at the next crossing.
            ready, self._ready = self._ready, None
            if await self._splice(ctx, ready, tokens):
                self._fallbacks = 0
                self._warned.discard("losing_race")
        self._arm(ctx)
        self._known = len(ctx.raw)
        self._version = ctx.ledger.version

    async def _over_limit(self, ctx: CompactionContext, tokens: int) -> None:
        ready, self._ready = self._ready, None
        if ready is not None and await self._splice(ctx, ready, tokens):
            self._fallbacks = 0
            self._warned.discard("losing_race")
            return
        version = ctx.ledger.version
        await self._protect_briefing(ctx, tokens)
        if self._requests_started:
            if ctx.ledger.version != version:
                self._count_fallback(ctx.emit)
            else:
                self._fell_back = True  # counted next call if the tiers after us act

    def _trigger(self, ctx: CompactionContext) -> int:
        ratio = self.config.trigger_ratio
        budget = ctx.budget
        return budget.trigger_tokens if ratio is None else int(budget.limit * ratio)

    def _cold(self, ctx: CompactionContext) -> bool:
        ttl = self.config.cold_cache_seconds
        return ttl is not None and ctx.idle_seconds is not None and ctx.idle_seconds > ttl

    def _count_fallback(self, emit: Callable[[Event], None]) -> None:
        self._fallbacks += 1
        if self._fallbacks >= self.config.warn_after_fallbacks:
            self._warn(
                emit,
                "losing_race",
                f"{self._fallbacks} compactions in a row fell back to the deterministic tiers "
                "because no briefing was ready; route summarization to a faster model or "
                "lower trigger_ratio",
            )

    # -- arming -------------------------------------------------------------------------

    def _arm(self, ctx: CompactionContext) -> None:
        if self._inflight is not None or self._ready is not None:
            return
        budget = ctx.budget
        tokens = ctx.prompt_tokens
        trigger = self._trigger(ctx)
        # Arming decides on the current estimates (exact for what observe() saw, quick and
        # high for the rest): refining here would put O(history) work on a call that takes
        # no decision. At worst a request starts a little early.
        if tokens <= trigger:
            self._deferred = False
            return
        if tokens > budget.limit and not self._deferred:
            # The tiers after this strategy rewrite the view in this call: a request armed
            # now would summarize bytes they are about to replace. Arm on what they return.
            self._deferred = True
            return
        self._deferred = False
        if tokens < self._next_arm_tokens:
            return
        step = max(1, budget.limit // 100)
        if ctx.tasks is None:
            self._warn(
                ctx.emit,
                "no_task_group",
                "LlmCompaction needs `async with ContextManager(...)` to run summaries in the "
                "background; until then every compaction is deterministic",
            )
            return
        cut = self._choose_cut(ctx)
        if isinstance(cut, str):
            self._next_arm_tokens = tokens + step
            if cut == "tail":
                retain = self.retain_tail_for(budget.limit)
                self._warn(
                    ctx.emit,
                    "inert",
                    f"past the trigger ({tokens} of {budget.limit} tokens) no span is left to "
                    f"summarize after keeping a {retain}-token tail, so every compaction will "
                    "be deterministic; lower retain_tail_tokens or raise trigger_ratio",
                )
            else:
                log.debug("llm compaction: nothing to summarize yet", why=cut)
            return
        self._spawn(ctx, cut, tokens)

    def _head(self, view: Sequence[Message]) -> int:
        task = b.task_index(view)
        head = max(self.config.keep_first, 0 if task is None else task + 1)
        return b.safe_cut(view, min(head, len(view)))

    def _choose_cut(self, ctx: CompactionContext) -> _Cut | str:
        """The span to summarize, or why there is none: ``short``, ``tail`` or ``protected``.

        The span is the oldest stretch between the head and the retained tail that holds no
        protected message (invariants 2 and 3): the latest user message, the newest complete
        turn, signed thinking of the in-flight tool loop (nothing after that is summarized).
        """
        view = ctx.view
        n = len(view)
        head = self._head(view)
        retain = self.retain_tail_for(ctx.budget.limit)
        count, count_many = ctx.counter.count, ctx.counter.count_many
        cut, kept = n, 0
        while cut > head and kept < retain:
            cut -= 1
            kept += count(view[cut])
        by_tail = b.safe_cut(view, cut)
        end = by_tail
        for j in range(max(head, b.in_flight_start(view)), end):
            if b.has_thinking(view[j]):
                end = b.safe_cut(view, j)
                break
        barriers: list[tuple[int, int]] = []  # protected [from, to) ranges
        latest = b.latest_user_index(view)
        if latest is not None:
            barriers.append((latest, latest + 1))
        complete = b.newest_complete_turn(view)
        if complete is not None:
            barriers.append(complete)
        start = head
        for lo, hi in sorted(barriers):
            if hi <= start or lo >= end:
                continue
            if b.safe_cut(view, lo) - start >= MIN_SUMMARIZED_SPAN:
                end = b.safe_cut(view, lo)
                break
            start = max(start, hi)  # too little before it: try the stretch after it
        if end - start >= MIN_SUMMARIZED_SPAN:
            return _Cut(start, end)
        if by_tail - head >= MIN_SUMMARIZED_SPAN:
            return "protected"  # transient: the latest user message or turn moves on
        # Only one reason is a misconfiguration: a tail that swallows the history even at the
        # limit. A history that is merely short grows out of it, and must not spend the
        # one-shot warning.
        limit = ctx.budget.limit
        if ctx.prompt_tokens > limit or count_many(view[:head]) + retain >= limit:
            return "tail"
        return "short"

    def _spawn(self, ctx: CompactionContext, cut: _Cut, tokens: int) -> None:
        view, origins, raw = ctx.view, ctx.origins, ctx.raw
        raw_cut = origins[cut.end] if cut.end < len(view) else len(raw)
        span = view[cut.start : cut.end]
        # The newest earlier briefing in the span is updated, not summarized as a summary.
        mine = [k for k, m in enumerate(span) if is_briefing(m)]
        previous = _briefing_text(span[mine[-1]]) if mine else None
        job = _Job(
            start=origins[cut.start],
            cut=raw_cut,
            prefix=tuple(raw[:raw_cut]),
            messages=tuple(m for k, m in enumerate(span) if not mine or k != mine[-1]),
            previous=previous,
            span_messages=cut.end - cut.start,
            armed_tokens=tokens,
            limit=ctx.budget.limit,
        )
        assert ctx.tasks is not None
        self._inflight = job
        try:
            ctx.tasks.start_soon(self._run, job, ctx.emit, name="agentctx-llm-compaction")
        except RuntimeError:  # the task group is closing
            self._inflight = None
            return
        self._requests_started += 1
        log.debug("llm compaction: summarizing", start=job.start, cut=job.cut, tokens=tokens)

    # -- the background request -----------------------------------------------------------

    async def _run(self, job: _Job, emit: Callable[[Event], None]) -> None:
        try:
            with anyio.CancelScope() as scope:
                job.scope = scope
                try:
                    await self._summarize(job, emit)
                except Exception as e:  # a bug here must not take the manager's tasks down
                    log.exception("llm compaction: background summary failed")
                    emit(SummaryRejected("failed", f"{type(e).__name__}: {e}", 0, None))
        finally:
            # However the task ends (done, failed, timed out, cancelled), the slot is free.
            if self._inflight is job:
                self._inflight = None

    async def _summarize(self, job: _Job, emit: Callable[[Event], None]) -> None:
        cfg = self.config
        transcript = serialize_transcript(
            job.messages,
            block_chars=cfg.transcript_block_chars,
            total_chars=cfg.transcript_total_chars,
        )
        request = SummaryRequest(
            system=cfg.system_prompt,
            prompt=build_prompt(
                transcript,
                job.previous,
                instruction=cfg.instruction,
                update_instruction=cfg.update_instruction,
            ),
            max_tokens=cfg.max_summary_tokens,
            transcript=transcript,
            previous_briefing=job.previous,
            messages=job.span_messages,
        )
        result, attempts, reason, detail = await self._attempts(request, job)
        if result is None and reason == "stale":
            log.debug("llm compaction: request dropped before sending", detail=detail)
            return
        if result is None:
            log.warning("llm compaction: no briefing", reason=reason, detail=detail)
            emit(SummaryRejected(reason, detail, attempts, None))
            self._next_arm_tokens = job.armed_tokens + max(1, job.limit // 20)
            return
        ready = self._bill(job, result)
        problem = check_briefing(result, cfg.required_sections)
        if problem is not None:
            log.warning("llm compaction: briefing rejected", reason=problem[0], detail=problem[1])
            emit(SummaryRejected(problem[0], problem[1], attempts, ready.stats(0)))
            self._next_arm_tokens = job.armed_tokens + max(1, job.limit // 20)
            return
        if job.stale is not None:
            emit(SummaryStale(job.stale, ready.stats(0)))
            return
        self._ready = ready

    async def _attempts(
        self, request: SummaryRequest, job: _Job
    ) -> tuple[SummaryResult | None, int, str, str]:
        """Send ``request`` until it succeeds or may not be retried; never past the deadline."""
        cfg = self.config
        deadline = self._clock() + cfg.deadline
        attempt = 0
        while True:
            if job.stale is not None:  # known useless before it was sent: not sent
                return None, attempt, "stale", f"not sent: {job.stale.replace('_', ' ')}"
            attempt += 1
            remaining = deadline - self._clock()
            if remaining <= 0:
                return None, attempt - 1, "deadline", f"deadline of {cfg.deadline:g} s passed"
            limit = min(cfg.timeout, remaining)
            retry_after: float | None = None
            try:
                with anyio.fail_after(limit):
                    result = await self.summarizer.summarize(replace(request, attempt=attempt))
                return result, attempt, "", ""
            except TimeoutError:
                reason = "timeout" if limit >= cfg.timeout else "deadline"
                detail = f"attempt {attempt} had no reply after {limit:g} s"
                retryable = reason == "timeout"
            except SummarizerError as e:
                reason, retryable, retry_after = "failed", e.retryable, e.retry_after
                status = f" (HTTP {e.status})" if e.status is not None else ""
                detail = f"attempt {attempt}: {e}{status}"
            except Exception as e:  # a summarizer bug must not reach the manager's task group
                log.exception("llm compaction: summarizer raised")
                reason, retryable = "failed", False
                detail = f"attempt {attempt}: {type(e).__name__}: {e}"
            if not retryable or attempt >= cfg.retry.max_attempts:
                return None, attempt, reason, detail
            delay = cfg.retry.delay(attempt, retry_after, self._random())
            if self._clock() + delay >= deadline:
                return None, attempt, "deadline", f"{detail}; a retry in {delay:g} s would pass it"
            log.info("llm compaction: retrying", attempt=attempt, delay=delay, detail=detail)
            await self._sleep(delay)

    def _bill(self, job: _Job, result: SummaryResult) -> _Ready:
        model = result.model or getattr(self.summarizer, "model", None)
        model = model if isinstance(model, str) else None
        price = self.config.price if self.config.price is not None else price_for(model)
        cost = price.cost(result.usage) if price is not None else None
        self._usage = self._usage + result.usage
        self._billed += 1
        self._cost = None if self._cost is None or cost is None else self._cost + cost
        return _Ready(job, result.text.strip(), result.usage, cost, model)

    # -- splicing -----------------------------------------------------------------------

    def _after_rewind(self, ctx: CompactionContext) -> None:
        """The history was rewound or edited: drop what no longer matches, right away."""
        self._next_arm_tokens = 0
        self._deferred = False
        ready = self._ready
        if ready is not None and not _intact(ctx.raw, ready.job):
            self._ready = None
            ctx.emit(SummaryStale("history_changed", ready.stats(0)))
        job = self._inflight
        if job is not None and not _intact(ctx.raw, job):
            job.stale = "history_changed"  # reported with its cost when it arrives

    def _check_superseded(self, ctx: CompactionContext) -> None:
        """Other decisions replaced part of a pending span: that briefing can never splice."""
        ready = self._ready
        if ready is not None and _extent(ctx, ready.job) is None:
            self._ready = None
            ctx.emit(SummaryStale("superseded", ready.stats(0)))
        job = self._inflight
        if job is not None and job.stale is None and _extent(ctx, job) is None:
            job.stale = "superseded"

    async def _splice(self, ctx: CompactionContext, ready: _Ready, tokens: int) -> bool:
        job = ready.job
        if not _intact(ctx.raw, job):
            ctx.emit(SummaryStale("history_changed", ready.stats(0)))
            return False
        a = job.start
        view, origins = ctx.view, ctx.origins
        extent = _extent(ctx, job)
        va = bisect.bisect_left(origins, a)
        if extent is None or va >= len(view) or origins[va] != a:
            ctx.emit(SummaryStale("superseded", ready.stats(0)))
            return False
        cut, carried = extent
        vc = bisect.bisect_left(origins, cut)
        counter = ctx.counter
        region = counter.count_many(view[va:vc])
        message = SummaryMessage(f"{SUMMARY_MARKER}\n\n{ready.text}")
        size = counter.count_full(message) + counter.count_many(carried)
        if vc <= va or size >= region:  # other compaction shrank that part below the briefing
            ctx.emit(SummaryStale("superseded", ready.stats(0)))
            return False
        budget = ctx.budget
        limit = budget.limit
        before = len(view)
        actions: list[str] = []
        fits = counter.overhead + counter.count_many(view[:va]) + size <= limit
        trigger = max(1, budget.trigger_tokens)
        if fits and ctx.prompt_tokens - region + size > trigger:
            # Still above the trigger: shrink only the tail, to the target (the splice breaks
            # the prefix cache from here on anyway). The briefing sits where the drop tier
            # starts cutting, so the tiers over the whole view would delete what was paid for.
            aim = Budget(
                context_window=trigger,
                reserve_output=0,
                trigger_ratio=1.0,
                target_ratio=min(1.0, max(1, budget.target_tokens) / trigger),
            )
            actions += await self._run_fallback(ctx, vc, size - region, aim)
            fits = ctx.prompt_tokens - region + size <= limit
        if not fits:
            reason = "discarded a briefing: the head and the briefing do not fit the budget"
            log.warning("llm compaction: " + reason)
            actions = [reason, *actions, *await self._run_fallback(ctx, None, 0)]
            self._emit_compacted(ctx, "deterministic", tokens, before, actions, ready.stats(0))
            return False
        try:
            ctx.take(
                ReplaceSpan(
                    anchor(ctx.raw, a),
                    cut,
                    anchor(ctx.raw, cut - 1),
                    (message, *carried),
                    "summarize",
                )
            )
        except ConfigError:  # pragma: no cover - the overlap check above rules this out
            ctx.emit(SummaryStale("superseded", ready.stats(0)))
            return False
        merged = " and the compacted stretch after it" if carried else ""
        actions.insert(
            0, f"spliced a briefing over {vc - va} messages{merged} ({region}->{size} tokens)"
        )
        stats = ready.stats(job.span_messages)
        self._emit_compacted(ctx, "summarized", tokens, before, actions, stats)
        log.info(
            "llm compaction: spliced",
            messages=job.span_messages,
            tokens_before=tokens,
            tokens_after=ctx.prompt_tokens,
            input_tokens=stats.usage.input_tokens,
            output_tokens=stats.usage.output_tokens,
            cost_usd=stats.cost_usd,
        )
        return True

    async def _protect_briefing(self, ctx: CompactionContext, tokens: int) -> None:
        """Over the limit with nothing to splice: compact without wasting paid work.

        While a request is in flight, first try to get just under the limit by compacting
        only what follows its span: the briefing then still fits when it arrives, and the
        rewrite touches only the recent end of the prefix cache. Failing that, compact what
        follows an earlier briefing, so the tiers do not drop it. What remains over the limit
        is left to the tiers after this strategy.
        """
        if not self.config.protect_paid_work:
            return
        limit = ctx.budget.limit
        version = ctx.ledger.version
        before = len(ctx.view)
        actions: list[str] = []
        job = self._inflight
        extent = _extent(ctx, job) if job is not None and job.stale is None else None
        if extent is not None:
            end = bisect.bisect_left(ctx.origins, extent[0])
            if 0 < end < len(ctx.view) and ctx.origins[end] == extent[0]:
                # Just under the trigger, not the limit: once this call rewrites the sent
                # prefix, tiers chained after this strategy compact anything above the trigger
                # all the way to the target, which would take the span in flight with it.
                just_under = Budget(
                    context_window=max(1, ctx.budget.trigger_tokens),
                    reserve_output=0,
                    trigger_ratio=1.0,
                    target_ratio=1.0,
                )
                actions = await self._run_fallback(ctx, end, 0, just_under)
        head = self._head(ctx.view)
        if ctx.prompt_tokens > limit and head < len(ctx.view) and is_briefing(ctx.view[head]):
            actions += await self._run_fallback(ctx, head + 1, 0)
        if ctx.ledger.version != version:
            self._emit_compacted(ctx, "deterministic", tokens, before, actions, None)

    async def _run_fallback(
        self, ctx: CompactionContext, start: int | None, delta: int, budget: Budget | None = None
    ) -> list[str]:
        """Run the fallback tiers on ``view[start:]`` (all of it for ``None``), as if the rest
        of the prompt were ``delta`` tokens larger, against ``budget`` (default: the session's);
        return what they did.

        A synthetic user message stands in for everything before ``start``, so the tiers
        treat it as the task and cut only after it. Their event is folded into ours.
        """
        collected: list[str] = []

        def emit(event: Event) -> None:
            if isinstance(event, ContextCompacted):
                collected.extend(event.actions)
            else:
                ctx.emit(event)

        cache: list[tuple[int, list[Message], list[int]]] = []

        def part() -> tuple[Sequence[Message], Sequence[int]]:
            if start is None:
                return ctx.view, ctx.origins
            version = ctx.ledger.version
            if not cache or cache[0][0] != version:
                view, origins = ctx.view, ctx.origins
                before = origins[start - 1] if start > 0 else 0
                cache[:] = [(version, [_SYNTHETIC_HEAD, *view[start:]], [before, *origins[start:]])]
            return cache[0][1], cache[0][2]

        counter = ctx.counter
        sub = _FallbackContext(
            session_id=ctx.session_id,
            raw=ctx.raw,
            budget=budget or ctx.budget,
            counter=counter,
            ledger=ctx.ledger,
            recall=ctx.recall,
            clock=ctx.clock,
            idle_seconds=None,
            emit=emit,
            tasks=ctx.tasks,
            sent=ctx.sent,
            _view=part,
            _view_tokens=lambda: ctx.prompt_tokens - counter.overhead + delta,
            taken=ctx.taken,
        )
        await self.fallback.compact(sub)
        return collected

    def _emit_compacted(
        self,
        ctx: CompactionContext,
        method: str,
        tokens: int,
        messages_before: int,
        actions: list[str],
        summary: SummaryStats | None,
    ) -> None:
        ctx.emit(
            ContextCompacted(
                method=method,
                strategy=type(self).__name__,
                messages_before=messages_before,
                messages_after=len(ctx.view),
                tokens_before=tokens,
                tokens_after=ctx.prompt_tokens,
                decisions=len(ctx.taken),
                actions=tuple(actions),
                summary=summary,
            )
        )

    def _warn(self, emit: Callable[[Event], None], code: str, message: str) -> None:
        if code in self._warned:
            return
        self._warned.add(code)
        log.warning("llm compaction: " + message, code=code)
        emit(CompactionWarning(code, message))


class _FallbackContext(CompactionContext):
    """The context the fallback tiers see: a decision that repeats a visible span exactly is
    ignored, so a tier that keeps re-taking one reaches its fixed point instead of looping."""

    def take(self, decision: Decision) -> None:
        if isinstance(decision, ReplaceSpan) and any(
            s.at == decision.at and s.end == decision.end and s.replacement == decision.replacement
            for s in self.ledger.spans
        ):
            return
        super().take(decision)


def _intact(raw: Sequence[Message], job: _Job) -> bool:
    """Whether ``raw`` still starts with the messages the job summarized (by content)."""
    prefix = job.prefix
    if len(raw) < len(prefix):
        return False
    # Identity first (O(cut) pointer compares); content where a rewind put in new objects.
    if all(map(operator.is_, prefix, raw)):
        return True
    return all(
        x is y or fingerprint(x) == fingerprint(y) for x, y in zip(prefix, raw, strict=False)
    )


def _extent(ctx: CompactionContext, job: _Job) -> tuple[int, tuple[Message, ...]] | None:
    """Where a splice of the job's span ends now, and the replacement it carries on.

    A visible span that starts inside the job's span and runs past its cut (the tiers dropped
    or condensed there while the request ran) is taken in whole: the splice ends where it ends
    and sends its replacement after the briefing, byte for byte, so nothing it stood for is
    lost. A span across the job's start cannot be merged: ``None``, the briefing is stale.
    """
    a, cut = job.start, job.cut
    for span in ctx.ledger.spans:
        x, y = span.at.index, span.end
        if x < a < y:
            return None
        if x < cut < y:
            return y, span.replacement
    return cut, ()
