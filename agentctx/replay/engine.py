"""Replay a recorded session request by request through a strategy, against a simulated cache.

```python
report = await replay(load_transcript(path).messages, budget=Budget(context_window=50_000))
print(report.cost_with, report.cost_without, report.cache_breaks)
```

Each assistant message of the transcript marks one model call; the request for it is every
message before it. The same requests are priced twice, with compaction and without, against
an ideal provider prefix cache: what the previous request already sent (byte-identical
messages from the start) is a cache read, the rest a cache write. A *cache break* is a
request that does not start with everything the previous one sent.

The replay runs on the transcript's own clock (`ReplayClock`): background work that sleeps on
it (a summarizer's simulated latency) finishes when the replay reaches that time, so
briefings arrive and splice as they would have in the session, without real waiting. Real
work (a request to a real summarizer) holds the clock (`ReplayClock.held`) while it runs and
then sleeps its measured latency on it, so it takes that many seconds of session time.

Pass ``facts`` (e.g. `agentctx.replay.retention.early_paths` of the transcript) to measure
after every compaction how many of them the model can still see or recall in one call
(`ReplayReport.retention`).
"""

from __future__ import annotations

import bisect
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from operator import add
from typing import TYPE_CHECKING

import anyio

# The manager's own prefix check: it grows the list it holds instead of slicing the other.
from agentctx._follow import starts_with
from agentctx.boundaries import repair
from agentctx.events import (
    BudgetExceeded,
    CompactionWarning,
    ContextCompacted,
    Event,
    HistoryResynced,
    SummaryRejected,
    SummaryStale,
    SummaryStats,
    TranscriptRepaired,
)
from agentctx.manager import ContextManager
from agentctx.messages import AssistantMessage, Message, Usage, fingerprint, sent_at
from agentctx.pricing import Price
from agentctx.recall import MemoryRecallStore
from agentctx.replay.retention import Fact, Retention, RetentionMeter
from agentctx.strategies.llm_config import briefing_text
from agentctx.tokens import MessageCounter

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence

    from agentctx.budget import Budget
    from agentctx.strategy import CompactionStrategy

__all__ = [
    "SONNET_MODEL",
    "SONNET_PRICE",
    "TIME_JITTER",
    "ReplayClock",
    "ReplayReport",
    "RequestRow",
    "replay",
    "replay_problem",
    "request_times",
]


def replay_problem(messages: Sequence[Message]) -> str | None:
    """Why ``messages`` have nothing `replay` can send (what a transcript file should have
    held), or ``None``: no model call after the first message, or a first request that holds
    nothing once repaired (only tool results answering no call: an excerpt)."""
    first = next(
        (i for i, m in enumerate(messages) if isinstance(m, AssistantMessage) and i > 0), None
    )
    if first is None:
        return "a model call to replay (an assistant message after the first message); it has none"
    if not repair(messages[:first])[0]:
        return (
            "something to send at its first model call; once repaired it holds nothing (only "
            "tool results answering no call)"
        )
    return None


SONNET_PRICE = Price(3.0, 15.0, 0.3, 3.75, 6.0)
"""What `replay` prices requests at unless told otherwise: Claude Sonnet 4.6 list prices."""

SONNET_MODEL = "claude-sonnet-4-6"
"""The model whose prices `SONNET_PRICE` are (no long-context surcharge), to name them."""


@dataclass(frozen=True, slots=True)
class RequestRow:
    """One model call of the replay."""

    number: int
    raw_messages: int
    view_messages: int
    tokens_without: int
    tokens_with: int
    cache_read: int
    cache_write: int
    cache_break: bool
    cold_rewrite: bool
    over_budget: bool
    actions: tuple[str, ...]
    notes: tuple[str, ...] = ()
    """Other events since the previous request: summaries rejected or stale, warnings."""
    summarized: int = 0
    """Messages a briefing replaced in this request (0: no splice)."""
    cache_read_without: int = 0
    cache_write_without: int = 0
    cost_with: float = 0.0
    """Simulated input cost of this request with compaction, in USD."""
    cost_without: float = 0.0
    """Simulated input cost of this request without compaction, in USD."""
    briefings: tuple[str, ...] = ()
    """The text of each briefing spliced into the view for this request (no marker)."""

    @property
    def repaired(self) -> bool:
        """Whether the view was repaired (`TranscriptRepaired`): it sends other than the
        history, with or without compaction."""
        return any(n.startswith(_REPAIRED) for n in self.notes)


_REPAIRED = "repaired: "  # how a note on a repair begins (`_note`)


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """Per-request rows and session totals of a replay."""

    rows: tuple[RequestRow, ...]
    budget_tokens: int
    cost_with: float
    cost_without: float
    compactions: int
    """Requests whose view a compaction changed (one strategy or several, in one call)."""
    cache_breaks: int
    cold_rewrites: int
    final_view: tuple[Message, ...]
    summaries: tuple[SummaryStats, ...] = ()
    """Every billed summarizer request, spliced or not."""
    splices: int = 0
    """Briefings spliced into the view."""
    events: tuple[Event, ...] = ()
    """Every event of the session, in order."""
    retention: Retention | None = None
    """How many of the ``facts`` given to `replay` stayed visible or recallable after each
    compaction; ``None`` when no facts were given."""
    timestamps_out_of_order: int = 0
    """Requests whose recorded time was later than the times after it (`request_times`),
    read as the next one's instead."""

    @property
    def tokens_with(self) -> int:
        """Prompt tokens sent over the session with compaction."""
        return sum(r.tokens_with for r in self.rows)

    @property
    def tokens_without(self) -> int:
        """Prompt tokens sent over the session without compaction."""
        return sum(r.tokens_without for r in self.rows)

    @property
    def over_budget(self) -> int:
        """Requests that went over the hard budget."""
        return sum(r.over_budget for r in self.rows)

    @property
    def rejections(self) -> list[SummaryRejected]:
        """The summarizer requests that produced no briefing, in order."""
        return [e for e in self.events if isinstance(e, SummaryRejected)]


class ReplayClock:
    """The replay's clock: the transcript's time, moved by the replay, with an async ``sleep``
    that returns once the replay has moved the clock past its end (no real waiting).

    Pass one to `replay` and give its ``sleep`` to whatever should take simulated time, e.g.
    ``OfflineSummarizer(delay=10, sleep=clock.sleep)``.
    """

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._sleepers: list[tuple[float, anyio.Event]] = []
        self._holds = 0
        self._released: anyio.Event | None = None

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        """Wait until the clock has moved ``seconds`` past now."""
        if seconds <= 0:
            await anyio.lowlevel.checkpoint()
            return
        woken = anyio.Event()
        self._sleepers.append((self.now + seconds, woken))
        await woken.wait()

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold the clock while real work runs: `advance` waits until every hold is released.

        Map real work onto session time like this (what
        `agentctx.replay.cached_summarizer.CachedSummarizer` does with a real summarizer):

        ```python
        with clock.held():
            started = time.monotonic()
            result = await real_request()
            latency = time.monotonic() - started
        await clock.sleep(latency)   # the wall latency, as seconds of session time
        ```

        Releasing and sleeping in one step (no await between them, as above) lets no other
        request of the replay slip in between.
        """
        self._holds += 1
        try:
            yield
        finally:
            self._holds -= 1
            if not self._holds and self._released is not None:
                self._released.set()
                self._released = None

    async def _wait_released(self) -> None:
        # A held clock (a real request in flight) does not move: the session's next request
        # waits for it, however long it takes in wall time.
        while self._holds:
            if self._released is None:
                self._released = anyio.Event()
            await self._released.wait()
            await anyio.wait_all_tasks_blocked()

    async def advance(self, to: float) -> None:
        """Let started work reach its first wait, wait for held work (`held`), move the clock
        to ``to`` (never back) and let every sleeper due by then run until all tasks wait
        again."""
        # Work started since the last call (a request just armed) runs up to its first wait
        # first, so that its sleep starts at the time it was started, not at this one.
        await anyio.wait_all_tasks_blocked()
        await self._wait_released()
        self.now = max(self.now, to)
        due = [s for s in self._sleepers if s[0] <= self.now]
        if not due:
            return
        self._sleepers = [s for s in self._sleepers if s[0] > self.now]
        for _, woken in due:
            woken.set()
        await anyio.wait_all_tasks_blocked()


def _note(event: Event) -> str | None:
    """A few words on an event that is not a compaction of the view, for the report."""
    if isinstance(event, SummaryRejected):
        return f"summary rejected ({event.reason}): {event.detail}"
    if isinstance(event, SummaryStale):
        return f"summary discarded ({event.reason})"
    if isinstance(event, CompactionWarning):
        return f"warning {event.code}"
    if isinstance(event, BudgetExceeded):
        return f"over budget: {event.tokens} > {event.budget} tokens"
    if isinstance(event, TranscriptRepaired):
        # What the view sends differently from the history, compaction or none: without
        # it, a result dropped as answering no call read as tokens saved.
        kinds = Counter(r.partition("@")[0] for r in event.repairs)
        return _REPAIRED + ", ".join(f"{k} x{n}" for k, n in kinds.items())
    if isinstance(event, HistoryResynced):
        return f"history resynced at message {event.index}"
    return None


def _billed(event: Event) -> SummaryStats | None:
    if isinstance(event, ContextCompacted | SummaryRejected | SummaryStale):
        return event.summary
    return None


class _PrefixCache:
    """An ideal prefix cache with a TTL: reads what the previous request sent unchanged from
    the start, unless more than ``ttl`` seconds passed, when everything is written again.

    Each request costs O(what changed): the messages sent are compared with the previous
    ones in C, and their tokens are the calibrated total of a per-slot vector sum kept up to
    date (`MessageCounter.vector`), as the manager keeps its view's. What a request adds is
    given its full estimate here (`MessageCounter.refine`): the rest got it when it was
    added."""

    def __init__(self, counter: MessageCounter, ttl: float) -> None:
        self._counter = counter
        self._ttl = ttl
        self._previous: list[Message] = []
        self._vector = [0.0] * len(counter.slots)  # of ``_previous``
        self._at: float | None = None

    def send(
        self, messages: Sequence[Message], overhead: int, now: float
    ) -> tuple[int, int, bool, bool]:
        """``(read, write, broke, cold)``: ``broke`` only when a warm prefix was rewritten."""
        cold = self._at is not None and now - self._at > self._ttl
        self._at = now
        previous = self._previous
        n = len(previous)
        if starts_with(messages, previous):
            same, kept = n, self._vector
        else:  # a rewrite: where it starts, found by content, and what stays summed anew
            same = 0
            for a, b in zip(messages, previous, strict=False):
                if a is not b and fingerprint(a) != fingerprint(b):
                    break
                same += 1
            kept = self._sum(messages[:same])
            previous[:] = messages[:same]
        new = messages[same:]
        self._counter.refine(new)
        added = self._sum(new)
        previous += new
        self._vector = list(map(add, kept, added))
        rewrote = same < n
        total = self._counter.total
        if n and not cold:
            read, write = total(kept) + overhead, total(added)
        else:
            read, write = 0, total(self._vector) + overhead
        return read, write, rewrote and not cold, rewrote and cold

    @property
    def vector(self) -> list[float]:
        """The uncalibrated per-slot sum of what the last request sent."""
        return self._vector

    def _sum(self, messages: Iterable[Message]) -> list[float]:
        vector = self._counter.vector
        out = [0.0] * len(self._counter.slots)
        for m in messages:
            out[:] = map(add, out, vector(m))
        return out


def _cache_usage(read: int, write: int, cache_ttl: float) -> Usage:
    """A request's simulated cache traffic; writes that must outlive Anthropic's 5-minute TTL
    are 1-hour writes, which `Price.cost` bills at the 1-hour rate."""
    return Usage(
        cache_read_tokens=read,
        cache_write_tokens=write,
        cache_write_1h_tokens=write if cache_ttl > 300.0 else 0,
    )


TIME_JITTER = 60.0
"""Seconds a recorded time may run ahead of a later one and still be read as it is: records
written by more than one process are seconds out of order, and a minute of session time
moves little (the simulated cache lives five)."""


def request_times(stamps: Sequence[float | None]) -> tuple[list[float | None], int]:
    """The session time of each request from its recorded ``stamps`` (`sent_at` of each
    call, ``None`` where there is none), and how many were read as out of order.

    The clock only moves forward, so one stamp far ahead (a record stamped 2099) would stop
    session time for the rest of the replay. The stamps believed are the longest run of them
    that never goes back in time (a longest non-decreasing subsequence): a lone outlier,
    late or early, is what breaks the order, however many stamps it sits among. Any other
    stamp is read within the two believed stamps around it: one more than `TIME_JITTER`
    seconds later than the next believed one is read as that one (counted); one less late is
    left as it is, as one earlier than the last believed one is (the forward-only clock
    reads it as that one anyway).
    """
    known = [(k, t) for k, t in enumerate(stamps) if t is not None]
    # Patience sorting: tails[j] is the index into ``known`` ending the best run of length j+1.
    tails: list[int] = []
    before: list[int] = [-1] * len(known)
    for j, (_, t) in enumerate(known):
        # The first run whose last stamp is later than t.
        lo = bisect.bisect_right(tails, t, key=lambda i: known[i][1])
        before[j] = tails[lo - 1] if lo else -1
        if lo == len(tails):
            tails.append(j)
        else:
            tails[lo] = j
    believed: set[int] = set()
    j = tails[-1] if tails else -1
    while j >= 0:
        believed.add(j)
        j = before[j]
    times: list[float | None] = list(stamps)
    late = 0
    upper = float("inf")
    for j in range(len(known) - 1, -1, -1):
        k, t = known[j]
        if j in believed:
            upper = t
        elif t > upper + TIME_JITTER:
            times[k] = upper
            late += 1
    return times, late


async def replay(
    messages: Sequence[Message],
    *,
    budget: Budget,
    strategy: CompactionStrategy | None = None,
    price: Price = SONNET_PRICE,
    session_id: str = "replay",
    cache_ttl: float = 300.0,
    clock: ReplayClock | None = None,
    progress: Callable[[int, int], None] | None = None,
    facts: Sequence[Fact] | None = None,
    prefix: Sequence[Message] = (),
) -> ReplayReport:
    """Replay ``messages`` call by call through ``strategy`` and price both ways.

    Recorded usage on assistant messages calibrates the token accounting (the system prompt
    and tool schemas the transcript does not contain are measured from it). The simulated
    cache expires after ``cache_ttl`` seconds of the transcript's own time; a rewrite after
    that is a cold rewrite (nothing cached is lost), not a cache break. A ``cache_ttl``
    above 300 s stands for Anthropic's 1-hour cache: its writes pay ``price.cache_write_1h``.

    ``clock`` is the transcript's clock (a new `ReplayClock` if omitted); share it with a
    summarizer's simulated delay. Briefings come back in the manager's task group while the
    replay advances the clock, before the request they would have been ready for.

    ``progress``, if given, is called after each request with ``(done, total)`` requests,
    e.g. to drive a progress bar; it runs in the replay's loop, so it should be quick.

    ``facts`` (say `agentctx.replay.retention.early_paths` of ``messages``) are checked after
    every request that compacted: each fact already in the history must be in the view's
    visible text or one ``recall_context`` call away; `ReplayReport.retention` sums it up.

    ``prefix``: what every request sent ahead of ``messages`` and no compaction touches (the
    system prompt and demonstrations a transcript records, `Transcript.system` and
    `Transcript.demonstrations`). Its tokens are in every request's size and cost and leave
    that much less of the budget to the view; recorded usage calibrates what is left over.
    """
    rows: list[RequestRow] = []
    events: list[Event] = []
    cost_with = cost_without = 0.0
    compactions = 0
    view: list[Message] = []
    clock = clock if clock is not None else ReplayClock()
    meter = RetentionMeter(facts) if facts is not None else None
    previous: list[Message] = []  # the view of the request before
    fixed = MessageCounter(lazy=False).count_many(prefix)  # in full: no quick first count
    async with ContextManager(
        budget.lowered(fixed),
        strategy=strategy,
        recall=MemoryRecallStore(),
        session_id=session_id,
        on_over_budget="send",
        clock=clock,
    ) as ctx:
        ctx.subscribe(events.append)
        cache_with = _PrefixCache(ctx.counter, cache_ttl)
        cache_without = _PrefixCache(ctx.counter, cache_ttl)
        calls = [i for i, m in enumerate(messages) if isinstance(m, AssistantMessage) and i > 0]
        # The request so far, grown call by call: each call costs what it adds (the history
        # is not copied, refined or counted again; ``cache_without`` keeps its vector sum).
        request: list[Message] = []
        times, out_of_order = request_times([sent_at(messages[i]) for i in calls])
        for number, i in enumerate(calls, start=1):
            request += messages[len(request) : i]
            stamp = times[number - 1]
            seen = len(events)
            # The transcript's own clock, so ages and idle gaps are the session's; background
            # work due by then (a briefing) completes first.
            await clock.advance(stamp if stamp is not None else clock() + 30.0)
            now = clock()
            view = await ctx.prepare(request)
            overhead = ctx.counter.overhead + fixed
            # Sending refines what each side adds (`_PrefixCache`), so the view's count and
            # the request's sum below are of full estimates.
            read, write, broke, cold = cache_with.send(view, overhead, now)
            read0, write0, _, _ = cache_without.send(request, overhead, now)
            tokens_with = ctx.prompt_tokens + fixed
            tokens_without = overhead + ctx.counter.total(cache_without.vector)
            cost = price.cost(_cache_usage(read, write, cache_ttl))
            cost0 = price.cost(_cache_usage(read0, write0, cache_ttl))
            cost_with += cost
            cost_without += cost0
            new = events[seen:]
            compacted = [e for e in new if isinstance(e, ContextCompacted)]
            compactions += bool(compacted)
            actions = tuple(a for e in compacted for a in e.actions)
            notes = tuple(n for n in map(_note, new) if n is not None)
            summarized = sum(
                e.summary.messages_summarized
                for e in new
                if isinstance(e, ContextCompacted) and e.summary is not None
            )
            spliced: tuple[str, ...] = ()
            if summarized:  # the briefings the view shows that the one before did not
                shown = set(map(briefing_text, previous))
                spliced = tuple(
                    t for t in map(briefing_text, view) if t is not None and t not in shown
                )
            previous = view
            rows.append(
                RequestRow(
                    number=number,
                    raw_messages=len(request),
                    view_messages=len(view),
                    tokens_without=tokens_without,
                    tokens_with=tokens_with,
                    cache_read=read,
                    cache_write=write,
                    cache_break=broke,
                    cold_rewrite=cold,
                    over_budget=tokens_with > budget.limit,
                    actions=actions,
                    notes=notes,
                    summarized=summarized,
                    cache_read_without=read0,
                    cache_write_without=write0,
                    cost_with=cost,
                    cost_without=cost0,
                    briefings=spliced,
                )
            )
            if meter is not None and any(isinstance(e, ContextCompacted) for e in new):
                await meter.check(ctx, view, len(request))
            usage = messages[i].usage  # type: ignore[union-attr]
            messages_only = tokens_without - overhead
            reported = usage.prompt_tokens - fixed if usage is not None else 0
            if 0.8 * messages_only < reported < 3 * messages_only:
                # Only reports that can describe this request: after the recorded agent
                # compacted on its own, its requests were much smaller than the raw history.
                ctx.counter.observe(request, reported, vector=cache_without.vector)
            if progress is not None:
                progress(number, len(calls))
        # A real request still in flight at the end is waited for, not cancelled: it is
        # billed either way, and a summary cache keeps its reply for the next run.
        await clock.advance(clock())
    return ReplayReport(
        rows=tuple(rows),
        budget_tokens=budget.limit,
        cost_with=cost_with,
        cost_without=cost_without,
        compactions=compactions,
        cache_breaks=sum(r.cache_break for r in rows),
        cold_rewrites=sum(r.cold_rewrite for r in rows),
        final_view=tuple(view),
        summaries=tuple(s for s in map(_billed, events) if s is not None),
        splices=sum(isinstance(e, ContextCompacted) and e.method == "summarized" for e in events),
        events=tuple(events),
        retention=meter.result() if meter is not None else None,
        timestamps_out_of_order=out_of_order,
    )
