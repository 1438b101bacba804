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
turn N+1..M   loop continues untouched; the request runs, then its briefing waits
  └── update (view grew by limit/10): briefing + view[cut:cut') -> a briefing of [head:cut')
turn M   view above the limit and the briefing is back and valid
  └── splice: ReplaceSpan(head..cut') -> SummaryMessage(SUMMARY_MARKER + briefing),
      then the tiers on what follows it if the prompt is still above the target
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
- Over the limit with the briefing not back yet, the ``fallback`` tiers make room without
  touching the span's ends, just under the trigger (above it, the tiers after this strategy
  would compact all the way to the target, through the span): first on what follows the
  span, which rewrites only the recent end of the prefix cache, then, if that is not enough,
  inside the span, which the briefing replaces whole anyway. An earlier briefing is kept the
  same way. What is still over the limit is left to the tiers after this strategy; used
  alone (no strategy follows it in a `Chain`), the fallback takes it to the target.
- While a briefing waits for the limit, the view goes on growing behind its span. Each time
  it has grown by ``update_ratio`` of the limit (default a tenth) since the waiting briefing
  was asked for, a follow-up request updates it: its text and what the view holds after its
  span, up to the retained tail, go out as an update. The update takes its place when it is
  back and valid (the one it replaced is reported as `SummaryStale` ``updated``); one that
  fails leaves the waiting briefing as it was. So the briefing spliced covers everything but
  about the retained tail, not just the history up to when it was first asked for. An update
  still out when the limit comes is spliced later, over the briefing spliced meanwhile.
- If the splice is still above the budget's target, the tiers run on the tail, to the target
  (the splice rewrites the prefix cache from there on anyway), so a splice lands at least as
  deep as the tiers alone would have, and the next compaction is as far away; if it is still
  over the limit, they run before the span too, around the briefing, which they never
  drop. The briefing is discarded (the event says ``method="deterministic"``) only if head
  and briefing do not fit, or if dropping it is what lets the rest fit; when the rest alone
  is over the limit (protected messages), it is kept.
- After a request found nothing to summarize, or failed, the next one waits until the view
  has grown a little, unless any decision (the tiers', or this strategy's own) changed it.
- When the provider's cache has gone cold, a ready briefing is spliced above the trigger.
- A later request updates the previous briefing (sent along with the new span) instead of
  summarizing a summary, whether that briefing is spliced already or still waits.
- A provider-native summarizer (`agentctx.providers.anthropic_compaction`,
  `agentctx.providers.openai_compaction`) reads `SummaryRequest.conversation` and returns the
  messages to splice (`SummaryResult.messages`: the provider's opaque compaction block); they
  are spliced as they are, under the same checks, and the tiers never condense or drop them.
  Being opaque, one that waits is never updated.
- With ``summarizer_context_window`` set, every request is sized to the summarizer's window
  (`agentctx.strategies.llm_sizing`); one a server refuses as too large is sent again smaller.
- Every billed request shows up once in an event (`ContextCompacted.summary`,
  `SummaryRejected` or `SummaryStale`) and in `LlmCompaction.spend`.

Settings live in `agentctx.strategies.llm_config`, the request and its guards in
`agentctx.strategies.llm_request`, the choice of span in `agentctx.strategies.llm_cut`.
One instance per session: one given to a second `ContextManager` while the first is open
raises `ConfigError` on the second's first call (the first's close frees it).
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Literal

from agentctx._log import log
from agentctx.errors import ConfigError
from agentctx.events import CompactionWarning, ContextCompacted, SummaryRejected, SummaryStale
from agentctx.ledger import ReplaceSpan, anchor, protected_positions
from agentctx.messages import SummaryMessage
from agentctx.strategies.deterministic import DeterministicCompaction, warm_and_sent
from agentctx.strategies.llm_config import (
    DEFAULT_RETAIN_TAIL_TOKENS,
    SUMMARY_MARKER,
    LlmCompactionConfig,
    RetryPolicy,
    briefing_text,
    is_briefing,
)
from agentctx.strategies.llm_cut import Cut, choose_cut, extent, head_end, intact
from agentctx.strategies.llm_handover import handed_in, handover_state
from agentctx.strategies.llm_request import Job, Requester, SummarizerSpend
from agentctx.strategies.llm_tiers import capped, run_tiers
from agentctx.strategies.trail import put_entry, span_text
from agentctx.strategy import Quiet, check_strategy, end_session
from agentctx.summarizer import is_native_compaction

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from agentctx.events import Event, SummaryStats
    from agentctx.messages import Message
    from agentctx.strategies.llm_request import Ready
    from agentctx.strategy import CompactionContext, CompactionStrategy
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


class LlmCompaction:
    """Background LLM summarization as a `CompactionStrategy` (see the module docs).

    Args:
        summarizer: sends the requests (route it to a fast, cheap model).
        config: the settings.
        fallback: the tiers run on the tail of a splice that is still over the limit, and on
            the part after an earlier briefing when no new one is ready; pass the same
            `DeterministicCompaction` you chain after this strategy. Default: a default one.
        clock: monotonic seconds, for deadlines and backoff (tests inject fakes). Default:
            anyio's clock.
        sleep: an async sleep, for backoff (tests inject fakes). Default: anyio's sleep.
        random: a [0, 1) random source, for jitter (tests inject fakes). Default:
            `random.random`.
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
        self.config = config if config is not None else LlmCompactionConfig()
        self.fallback: CompactionStrategy = (
            DeterministicCompaction() if fallback is None else check_strategy(fallback)
        )
        self._requests = Requester(
            summarizer,
            self.config,
            clock=clock,
            sleep=sleep,
            random=random,
            on_failure=self._after_failure,
        )
        self._ctx: CompactionContext | None = None  # the context of the previous call
        self._rewinds = 0  # ctx.rewinds at the previous call: a larger one means a rewind
        self._reported = 0  # len(ctx.taken) that this call's events counted up to
        self._version = -1  # ledger version at the end of the previous call
        self._fell_back = False  # over the limit with nothing spliced in the previous call
        # The call that put arming off over the limit and its raw length, until one arms.
        self._deferred: tuple[CompactionContext, int] | None = None
        # (ledger version, tokens): no new request below that size while the view is the same
        # (nothing to summarize yet, or the last request failed); any decision lifts it.
        self._hold = (-1, 0)
        self._requests_started = 0
        self._fallbacks = 0
        self._warned: set[str] = set()
        self._handed_in: object = None  # what the last worker handed over, until the first call
        self._handed_over: Ready | None = None
        self._received: Ready | None = None  # the briefing taken over, as it was handed in
        # The session (`ContextManager`) this instance serves, until it closes: a briefing
        # asked for in one session must never be spliced into another's view.
        self._session: object = None
        self._holder_emit: Callable[[Event], None] | None = None

    # -- inspection ---------------------------------------------------------------------

    @property
    def summarizer(self) -> Summarizer:
        """The summarizer the requests go to."""
        return self._requests.summarizer

    @property
    def phase(self) -> Literal["idle", "in_flight", "ready"]:
        """``in_flight`` while a request runs, ``ready`` while a briefing waits to be spliced."""
        if self._requests.inflight is not None:
            return "in_flight"
        return "ready" if self._requests.ready is not None else "idle"

    @property
    def spend(self) -> SummarizerSpend:
        """Usage and cost of every billed summarizer response this session."""
        return self._requests.spend

    def retain_tail_for(self, limit: int) -> int:
        """The retained tail in tokens for a hard budget of ``limit`` tokens."""
        explicit = self.config.retain_tail_tokens
        return explicit if explicit is not None else min(DEFAULT_RETAIN_TAIL_TOKENS, limit // 4)

    def cancel(self) -> None:
        """Cancel the request in flight, if any (the manager's close does this too)."""
        self._requests.cancel()

    def close(self, emit: Callable[[Event], None]) -> None:
        """The session ended (the manager calls this on close): a briefing that was billed
        and still waits to be spliced is reported as `SummaryStale` ``handed_over`` when
        `hand_over` gave it out for the next worker, else ``unused``, so every paid request
        shows up in an event. The fallback is told too, if it has a ``close``. The close of
        another session than the one this instance serves (one it refused) changes nothing."""
        if self._session is not None and emit != self._holder_emit:
            return
        inflight = self._requests.inflight
        if inflight is not None and not inflight.started:
            self._requests.inflight = inflight = None  # its task was cancelled: it never ran
        if inflight is None:
            self._session = self._holder_emit = None
        # else a request that ignored the close's cancellation still runs: its briefing is
        # this session's, which holds the instance until the close's report after it ends.
        ready, self._requests.ready = self._requests.ready, None
        if ready is not None and not (ready is self._received is self._handed_over):
            # (One this worker was handed and hands on was paid for, and said, by another.)
            reason = "handed_over" if ready is self._handed_over else "unused"
            emit(SummaryStale(reason, ready.stats(0)))
        end_session(self.fallback, emit)

    def hand_over(self) -> object:
        """What the session's next worker starts from (JSON-able, for
        `ContextManager.session_state`): the briefing that waits to be spliced, if any, so
        that worker splices it instead of paying for another. One handed over and still
        waiting when the session ends is reported as `SummaryStale` ``handed_over``."""
        ready, ctx = self._requests.ready, self._ctx
        if ready is None or ctx is None:
            # One handed in and not looked at yet (this worker never ran): handed on as is.
            return self._handed_in
        state = handover_state(ready, ctx.raw)
        if state is not None:
            self._handed_over = ready
        return state

    def take_over(self, state: object) -> None:
        """Start from what the session's last worker handed over (`hand_over`): its briefing
        waits here, checked against the history on the first call, and is spliced when the
        view needs it. Its usage is counted with that worker's, not this one's `spend`."""
        self._handed_in = state

    def _serve(self, ctx: CompactionContext) -> None:
        if self._session is not None:
            raise ConfigError(
                "this LlmCompaction already serves another ContextManager that is still open "
                "(or closed with a summarizer request that ignored cancellation still running): "
                "its briefings, its requests and its spend are one session's, and another "
                "session's would be spliced into this one's view; make one per session (one "
                "that served a session that closed can serve the next)"
            )
        if ctx.tasks is not None:
            # Inside ``async with``, whose close frees it (without, no request can run, so
            # there is nothing another session could be handed). Its close is told from
            # another's by the event channel it is given, the session's own.
            self._session, self._holder_emit = ctx._session, ctx.emit

    # -- the hot path -------------------------------------------------------------------

    async def compact(self, ctx: CompactionContext) -> Quiet | None:
        """Splice a ready briefing when over the limit; start a request past the trigger."""
        if ctx._session is not self._session:
            self._serve(ctx)
        if self._handed_in is not None:
            self._take_handed_in(ctx)
        # prepare() may call a strategy several times with the same context (to a fixed
        # point); the rewind check belongs to the first call only.
        if ctx is not self._ctx and ctx.rewinds != self._rewinds:
            self._after_rewind(ctx)
        if ctx is not self._ctx:
            self._requests.reap(ctx.tasks, ctx.emit)
        self._ctx = ctx
        self._reported = len(ctx.taken)
        if ctx.ledger.version != self._version:
            if self._fell_back:  # the tiers after this strategy compacted in the last call
                self._count_fallback(ctx.emit)
            self._check_superseded(ctx)
        self._fell_back = False
        limit = ctx.budget.limit
        tokens = ctx.prompt_tokens
        waiting = self._requests.ready is not None
        cold = waiting and self._cold(ctx) and tokens > self._trigger(ctx)
        if (tokens > limit or cold) and waiting and ctx.counter.refine(ctx.view):
            # About to decide on a splice: new messages carry quick (mostly high)
            # estimates. (With nothing to splice, refining is left to the tiers that act.)
            tokens = ctx.prompt_tokens
        if tokens > limit:
            await self._over_limit(ctx, tokens)
        elif cold and tokens > self._trigger(ctx) and await self._splice_ready(ctx, tokens):
            # The provider's prefix cache has expired anyway: splicing now costs no cache
            # write, and leaves the tiers nothing to do at the next crossing.
            self._fallbacks = 0
            self._warned.discard("losing_race")
        self._arm(ctx)
        self._rewinds = ctx.rewinds
        self._version = ctx.ledger.version
        requests = self._requests
        if (
            requests.inflight is None
            and requests.ready is None
            and not self._fell_back
            and self._deferred is None
        ):
            # With no briefing asked for or waiting, no fallback to count and no arming put
            # off (a call it skipped would not clear the flag), only passing the trigger
            # (which arms one) or the budget (the tiers) does anything.
            return Quiet(min(self._trigger(ctx), limit))
        return None

    def _take_handed_in(self, ctx: CompactionContext) -> None:
        state, self._handed_in = self._handed_in, None
        requests = self._requests
        if requests.ready is not None or requests.inflight is not None:
            return  # (taken over after this instance's own work began: its own goes on)
        ready = handed_in(state, ctx)
        if isinstance(ready, tuple):
            ctx.emit(SummaryStale(*ready))
        elif ready is None:
            self._warn(
                ctx.emit,
                "state_unreadable",
                "the briefing the session's last worker handed over could not be read; "
                "this worker asks for its own",
            )
        else:
            requests.ready = self._received = ready

    async def _over_limit(self, ctx: CompactionContext, tokens: int) -> None:
        if await self._splice_ready(ctx, tokens):
            self._fallbacks = 0
            self._warned.discard("losing_race")
            return
        before = len(ctx.view)
        cut: list[str] = []
        fallback, cold = self.fallback, self._cold(ctx)
        # Over the budget on the newest results alone: cut down (not sent: no cache write),
        # the prompt may be back under it, with no briefing needed yet.
        if (
            isinstance(fallback, DeterministicCompaction)
            and warm_and_sent(ctx, cold)
            and fallback.cut_new_enough(ctx, cut, cold)
        ):
            self._emit_compacted(ctx, "deterministic", tokens, before, cut, None)
            return
        version = ctx.ledger.version
        await self._protect_briefing(ctx, tokens, before, cut)
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
        if self._requests.inflight is not None:
            return
        budget = ctx.budget
        tokens = ctx.prompt_tokens
        trigger = self._trigger(ctx)
        # Arming decides on the current estimates (exact for what observe() saw, quick and
        # high for the rest): refining here would put O(history) work on a call that takes
        # no decision. At worst a request starts a little early.
        if tokens <= trigger:
            self._deferred = None
            return
        deferred = self._deferred
        if tokens > budget.limit and (
            deferred is None or (deferred[0] is not ctx and ctx.sent < deferred[1])
        ):
            # The tiers after this strategy rewrite the view in this call: a request armed
            # now would summarize bytes they are about to replace. Arm on what they return
            # (a call cancelled before it sent a view returned nothing).
            self._deferred = (ctx, len(ctx.raw))
            return
        self._deferred = None
        if ctx.ledger.version == self._hold[0] and tokens < self._hold[1]:
            return
        ready = self._requests.ready
        if ready is not None and (
            ready.messages
            or self.config.update_ratio is None
            or tokens - ready.job.armed_tokens < self._update_step(budget.limit)
        ):
            # Waiting to be spliced, and what was added since it was asked for is still too
            # little to pay for an update (a provider-native briefing is never updated).
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
        cut = choose_cut(ctx, self.config.keep_first, self.retain_tail_for(budget.limit))
        if isinstance(cut, str):
            self._hold = (ctx.ledger.version, tokens + step)
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
        if ready is not None:
            if not self._update(ctx, ready, cut, tokens):
                self._hold = (ctx.ledger.version, tokens + self._update_step(budget.limit))
            return
        self._spawn(ctx, cut, tokens)

    def _update_step(self, limit: int) -> int:
        """Growth of the view (tokens) since a waiting briefing was asked for that is worth a
        request bringing it up to date."""
        # The default, a tenth of the limit: with the default tail (a quarter at most) and at
        # most this much left uncovered, head, briefing and tail land under the default
        # target. On the pi sessions a twentieth or a fortieth cost more requests and saved
        # no more (benchmarks/llm_landing.py).
        return max(1, int(limit * (self.config.update_ratio or 1.0)))

    def _update(self, ctx: CompactionContext, ready: Ready, cut: Cut, tokens: int) -> bool:
        """Ask for ``ready`` brought up to date through ``cut``: its text and what the view
        holds after its span (with the stretch it would carry, `extent`) go out as an update,
        so once spliced it covers everything but the retained tail. ``False``: not now."""
        view, origins, raw = ctx.view, ctx.origins, ctx.raw
        job = ready.job
        where = _extent(ctx, job)
        va = bisect.bisect_left(origins, job.start)
        if where is None or va >= len(view) or origins[va] != job.start or cut.start > va:
            return False  # the next call drops it as superseded, or its span moved
        end, carried = where
        after = bisect.bisect_left(origins, end)
        raw_cut = origins[cut.end] if cut.end < len(view) else len(raw)
        if raw_cut <= end or cut.end - after < 1:
            return False
        update = Job(
            start=job.start,
            cut=raw_cut,
            rewinds=ctx.rewinds,
            messages=(*carried, *view[after : cut.end]),
            previous=ready.text,
            span_messages=cut.end - va,
            armed_tokens=tokens,
            limit=ctx.budget.limit,
            first=va,
            conversation=tuple(view[: cut.end]),
            base=ready,
        )
        assert ctx.tasks is not None
        if not self._requests.start(update, ctx.tasks, ctx.emit):
            return False
        self._requests_started += 1
        log.debug("llm compaction: updating", start=job.start, cut=raw_cut, tokens=tokens)
        return True

    def _spawn(self, ctx: CompactionContext, cut: Cut, tokens: int) -> None:
        view, origins, raw = ctx.view, ctx.origins, ctx.raw
        raw_cut = origins[cut.end] if cut.end < len(view) else len(raw)
        span = view[cut.start : cut.end]
        # The newest earlier briefing in the span is updated, not summarized as a summary.
        mine = [k for k, m in enumerate(span) if is_briefing(m)]
        previous = briefing_text(span[mine[-1]]) if mine else None
        job = Job(
            start=origins[cut.start],
            cut=raw_cut,
            rewinds=ctx.rewinds,
            messages=tuple(m for k, m in enumerate(span) if not mine or k != mine[-1]),
            previous=previous,
            span_messages=cut.end - cut.start,
            armed_tokens=tokens,
            limit=ctx.budget.limit,
            first=cut.start,
            conversation=tuple(view[: cut.end]),
        )
        assert ctx.tasks is not None
        if not self._requests.start(job, ctx.tasks, ctx.emit):
            return
        self._requests_started += 1
        log.debug("llm compaction: summarizing", start=job.start, cut=job.cut, tokens=tokens)

    def _after_failure(self, job: Job) -> None:
        """No usable briefing came back: ask again only once the view has grown a bit."""
        self._hold = (self._version, job.armed_tokens + max(1, job.limit // 20))

    # -- splicing -----------------------------------------------------------------------

    def _after_rewind(self, ctx: CompactionContext) -> None:
        """The history was rewound or edited: drop what no longer matches, right away."""
        self._hold = (-1, 0)
        self._deferred = None
        requests = self._requests
        ready = requests.ready
        if ready is not None and not intact(ctx, ready.job.cut, ready.job.rewinds):
            requests.ready = None
            ctx.emit(SummaryStale("history_changed", ready.stats(0)))
        job = requests.inflight
        if job is not None and not intact(ctx, job.cut, job.rewinds):
            job.stale = "history_changed"  # reported with its cost when it arrives

    def _check_superseded(self, ctx: CompactionContext) -> None:
        """Other decisions replaced part of a pending span: that briefing can never splice."""
        requests = self._requests
        ready = requests.ready
        if ready is not None and _extent(ctx, ready.job) is None:
            requests.ready = None
            ctx.emit(SummaryStale("superseded", ready.stats(0)))
        job = requests.inflight
        if job is not None and job.stale is None and _extent(ctx, job) is None:
            job.stale = "superseded"

    @staticmethod
    def _briefing(ctx: CompactionContext, text: str, va: int, vc: int) -> SummaryMessage:
        """The briefing message for view part ``[va, vc)``; with a recall store it names the
        id under which that part is kept in full, so what the briefing leaves out is one
        ``recall_context`` call away, as under the tiers' markers."""
        if ctx.recall is None:
            return SummaryMessage(f"{SUMMARY_MARKER}\n\n{text}")
        # The tiers' markers inside name recall ids the briefing does not show: the part's
        # entry refers to them, or what they hid would be recallable no more.
        part = span_text(ctx.view, ctx.origins, ctx.raw, va, vc, ctx.ledger)
        rid = put_entry(ctx.recall, ctx.session_id, part)
        where = f'[The {vc - va} messages it replaces, in full: recall_context(id="{rid}")]'
        return SummaryMessage(f"{SUMMARY_MARKER}\n\n{text}\n\n{where}")

    async def _splice_ready(self, ctx: CompactionContext, tokens: int) -> bool:
        """Splice the briefing waiting in its slot, if any; whether it was spliced."""
        ready = self._requests.take()
        if ready is None:
            return False
        try:
            return await self._splice(ctx, ready, tokens)
        except BaseException:
            # Cut short where the fallback tiers await (the call cancelled), before it was
            # spliced or reported: it was paid for, so it waits for a later call again.
            self._requests.give_back(ready, ctx.emit)
            raise

    async def _splice(self, ctx: CompactionContext, ready: Ready, tokens: int) -> bool:
        job = ready.job
        if not intact(ctx, job.cut, job.rewinds):
            ctx.emit(SummaryStale("history_changed", ready.stats(0)))
            return False
        a = job.start
        view, origins = ctx.view, ctx.origins
        where = _extent(ctx, job)
        va = bisect.bisect_left(origins, a)
        if where is None or va >= len(view) or origins[va] != a:
            ctx.emit(SummaryStale("superseded", ready.stats(0)))
            return False
        cut, carried = where
        if ctx.rewound_to(job.rewinds) is not None and any(
            a <= i < cut for i in protected_positions(ctx.raw)
        ):
            # A rewind since the request (to after the span: one into it made it stale
            # above) can leave what is protected inside it: the latest user message, the
            # newest complete turn (the turns after it gone or not answered), the running
            # loop's signed reasoning. Without one none can be there: the cut kept them out
            # and they only move later. (The check reads the whole running loop: in an
            # agent that runs on its own from one task, the whole history.)
            ctx.emit(SummaryStale("history_changed", ready.stats(0)))
            return False
        vc = bisect.bisect_left(origins, cut)
        counter = ctx.counter
        region = counter.count_many(view[va:vc])
        # A provider-native briefing is spliced as the provider returned it, byte for byte.
        briefing = ready.messages or (self._briefing(ctx, ready.text, va, vc),)
        size = sum(map(counter.count_full, briefing)) + counter.count_many(carried)
        if vc <= va or size >= region:
            armed = sum(map(counter.count_full, job.conversation[job.first :]))
            if size >= armed:  # so when it was asked for: the briefing is too long
                detail = f"the briefing ({size} tokens) would replace {armed} tokens"
                ctx.emit(SummaryRejected("too_large", detail, 1, ready.stats(0)))
                self._after_failure(job)
            else:  # compaction since then shrank that part below the briefing
                ctx.emit(SummaryStale("superseded", ready.stats(0)))
            return False
        budget = ctx.budget
        limit = budget.limit
        before = len(view)
        actions: list[str] = []
        problem = None
        head = min(va, head_end(view, self.config.keep_first))
        if counter.overhead + counter.count_many(view[:head]) + size > limit:
            problem = "the head and the briefing do not fit the budget"
        elif ctx.prompt_tokens - region + size > max(1, budget.target_tokens):
            rewriting = a < ctx.sent  # the splice will rewrite what was sent: the tiers may too
            # Still above the target: shrink the tail to it, so the splice lands as deep as
            # the tiers would have and the next compaction is as far away (the splice breaks
            # the prefix cache from here on anyway, and the tail is the newest part of it).
            # The recent steps give way only above the trigger, as the tiers' own do.
            update = self._requests.inflight
            end = max(cut, update.cut) if update is not None and update.base is ready else cut
            tail = bisect.bisect_left(origins, end)
            if tail < len(view):
                actions += await run_tiers(
                    self.fallback,
                    ctx,
                    start=tail,
                    delta=size - region,
                    aim=capped(budget.target_tokens),
                    give_way_above=budget.trigger_tokens,
                    rewriting=rewriting,
                )
            trigger = max(1, budget.trigger_tokens)
            if end > cut and ctx.prompt_tokens - region + size > trigger:
                # This briefing's update in flight replaces what lies before its end, so that
                # stretch was left to it: cut into now only as far as just under the trigger
                # (above it the tiers after this strategy take it to the target, across its
                # end), and never across its end.
                vc, fence = (bisect.bisect_left(ctx.origins, i) for i in (cut, end))
                actions += await run_tiers(
                    self.fallback,
                    ctx,
                    start=vc,
                    fence=fence if fence < len(ctx.view) else None,
                    delta=size - region,
                    aim=capped(trigger),
                    rewriting=rewriting,
                )
            if ctx.prompt_tokens - region + size > limit and va > head:
                # Still over the limit: make room before the span too, around the briefing
                # as it will be (the tiers never drop a briefing), just under the limit.
                # (one briefing message stands for a native replacement of several)
                stand_in = (va, vc, briefing[0] if len(briefing) == 1 else _NATIVE_STAND_IN)
                aim = capped(limit)
                actions += await run_tiers(
                    self.fallback,
                    ctx,
                    instead=stand_in,
                    delta=size - region,
                    aim=aim,
                    rewriting=rewriting,
                )
                va = bisect.bisect_left(ctx.origins, a)
                vc = bisect.bisect_left(ctx.origins, cut)
            if ctx.prompt_tokens - region > limit:
                # Over the limit even without the span: the rest may not be dropped (the
                # newest complete turn, the in-flight loop), so discarding the briefing would
                # not meet the budget either, only lose what was paid for.
                actions.append("still over the budget: the rest is protected")
            elif ctx.prompt_tokens - region + size > limit:
                problem = "the rest fits the budget only without it"
        if problem is not None:
            reason = f"discarded a briefing: {problem}"
            log.warning("llm compaction: " + reason)
            actions = [reason, *actions, *await run_tiers(self.fallback, ctx)]
            self._emit_compacted(ctx, "deterministic", tokens, before, actions, ready.stats(0))
            return False
        try:
            ctx.take(
                ReplaceSpan(
                    anchor(ctx.raw, a),
                    cut,
                    anchor(ctx.raw, cut - 1),
                    (*briefing, *carried),
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
        update = self._requests.inflight
        if update is not None and update.base is ready:
            # Its growth since it was asked for is measured on the view as it is now.
            update.armed_tokens -= tokens - ctx.prompt_tokens
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

    async def _protect_briefing(
        self, ctx: CompactionContext, tokens: int, before: int, actions: list[str]
    ) -> None:
        """Over the limit with nothing to splice: compact without wasting paid work.

        While a request is in flight, get just under the trigger by compacting what follows
        its span first, then, if that is not enough, inside the span: no decision crosses
        either end of it, so the briefing still splices when it arrives. Failing that,
        compact what follows an earlier briefing, so the tiers do not drop it. What remains
        over the limit is left to the tiers after this strategy; used alone (none follow),
        the fallback takes it to the target, as they would.
        """
        version = ctx.ledger.version
        job = self._requests.inflight if self.config.protect_paid_work else None
        where = _extent(ctx, job) if job is not None and job.stale is None else None
        if job is not None and where is not None:
            # Just under the trigger, not the limit: once this call rewrites the sent prefix,
            # the tiers after this strategy compact anything above the trigger all the way to
            # the target, and the stretch they drop then runs across the span's ends.
            trigger = max(1, ctx.budget.trigger_tokens)
            fallback, origins = self.fallback, ctx.origins
            end = bisect.bisect_left(origins, where[0])
            if 0 < end < len(ctx.view) and origins[end] == where[0]:
                actions += await run_tiers(fallback, ctx, start=end, aim=capped(trigger))
            origins = ctx.origins
            start = bisect.bisect_left(origins, job.start)
            end = bisect.bisect_left(origins, where[0])
            if ctx.prompt_tokens > trigger and 0 < start < end < len(ctx.view):
                # The briefing replaces the span whole, so what the tiers condense or drop
                # strictly inside it leaves the splice valid (and saving what is left).
                aim = capped(trigger)
                actions += await run_tiers(fallback, ctx, start=start, fence=end, aim=aim)
        head = head_end(ctx.view, self.config.keep_first)
        view = ctx.view
        if (
            self.config.protect_paid_work
            and ctx.prompt_tokens > ctx.budget.limit
            and head < len(view)
            and (is_briefing(view[head]) or is_native_compaction(view[head]))
        ):
            actions += await run_tiers(self.fallback, ctx, start=head + 1)
        if not ctx.followed and ctx.prompt_tokens > ctx.budget.limit:
            actions += await run_tiers(self.fallback, ctx)
        if ctx.ledger.version != version or actions:
            self._emit_compacted(ctx, "deterministic", tokens, before, actions, None)

    def _emit_compacted(
        self,
        ctx: CompactionContext,
        method: str,
        tokens: int,
        messages_before: int,
        actions: list[str],
        summary: SummaryStats | None,
    ) -> None:
        ctx.counter.refine(ctx.view)  # a briefing spliced in was counted quickly
        ctx.emit(
            ContextCompacted(
                method=method,
                strategy=type(self).__name__,
                messages_before=messages_before,
                messages_after=len(ctx.view),
                tokens_before=tokens,
                tokens_after=ctx.prompt_tokens,
                decisions=len(ctx.taken) - self._reported,
                actions=tuple(actions),
                summary=summary,
            )
        )
        self._reported = len(ctx.taken)

    def _warn(self, emit: Callable[[Event], None], code: str, message: str) -> None:
        if code in self._warned:
            return
        self._warned.add(code)
        log.warning("llm compaction: " + message, code=code)
        emit(CompactionWarning(code, message))


_NATIVE_STAND_IN = SummaryMessage(f"{SUMMARY_MARKER}\n\n(a provider-native briefing)")


def _extent(ctx: CompactionContext, job: Job) -> tuple[int, tuple[Message, ...]] | None:
    """Where a splice of ``job``'s span ends now, and what it carries (see `extent`)."""
    return extent(ctx.ledger.spans, job.start, job.cut)
