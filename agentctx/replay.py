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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentctx.events import ContextCompacted, Event
from agentctx.manager import ContextManager
from agentctx.messages import AssistantMessage, Message, Usage, fingerprint
from agentctx.pricing import Price
from agentctx.recall import MemoryRecallStore

if TYPE_CHECKING:
    from collections.abc import Sequence

    from agentctx.budget import Budget
    from agentctx.strategy import CompactionStrategy
    from agentctx.tokens import MessageCounter

__all__ = ["ReplayReport", "RequestRow", "SONNET_PRICE", "replay"]

SONNET_PRICE = Price(3.0, 15.0, 0.3, 3.75, 6.0)  # Claude Sonnet 4.x list prices


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


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """Per-request rows and session totals of a replay."""

    rows: tuple[RequestRow, ...]
    budget_tokens: int
    cost_with: float
    cost_without: float
    compactions: int
    cache_breaks: int
    cold_rewrites: int
    final_view: tuple[Message, ...]

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


class _PrefixCache:
    """An ideal prefix cache with a TTL: reads what the previous request sent unchanged from
    the start, unless more than ``ttl`` seconds passed, when everything is written again."""

    def __init__(self, counter: MessageCounter, ttl: float) -> None:
        self._count = counter.count
        self._ttl = ttl
        self._previous: list[str] = []
        self._at: float | None = None

    def send(
        self, messages: Sequence[Message], overhead: int, now: float
    ) -> tuple[int, int, bool, bool]:
        """``(read, write, broke, cold)``: ``broke`` only when a warm prefix was rewritten."""
        cold = self._at is not None and now - self._at > self._ttl
        self._at = now
        prints = [fingerprint(m) for m in messages]
        same = 0
        for a, b in zip(prints, self._previous, strict=False):
            if a != b:
                break
            same += 1
        rewrote = same < len(self._previous)
        warm = bool(self._previous) and not cold
        if not warm:
            same = 0
        read = sum(self._count(m) for m in messages[:same]) + (overhead if warm else 0)
        write = sum(self._count(m) for m in messages[same:]) + (0 if warm else overhead)
        self._previous = prints
        return read, write, rewrote and not cold, rewrote and cold


def _cache_usage(read: int, write: int, cache_ttl: float) -> Usage:
    """A request's simulated cache traffic; writes that must outlive Anthropic's 5-minute TTL
    are 1-hour writes, which `Price.cost` bills at the 1-hour rate."""
    return Usage(
        cache_read_tokens=read,
        cache_write_tokens=write,
        cache_write_1h_tokens=write if cache_ttl > 300.0 else 0,
    )


async def replay(
    messages: Sequence[Message],
    *,
    budget: Budget,
    strategy: CompactionStrategy | None = None,
    price: Price = SONNET_PRICE,
    session_id: str = "replay",
    cache_ttl: float = 300.0,
) -> ReplayReport:
    """Replay ``messages`` call by call through ``strategy`` and price both ways.

    Recorded usage on assistant messages calibrates the token accounting (the system prompt
    and tool schemas the transcript does not contain are measured from it). The simulated
    cache expires after ``cache_ttl`` seconds of the transcript's own time; a rewrite after
    that is a cold rewrite (nothing cached is lost), not a cache break. A ``cache_ttl``
    above 300 s stands for Anthropic's 1-hour cache: its writes pay ``price.cache_write_1h``.
    """
    rows: list[RequestRow] = []
    events: list[Event] = []
    cost_with = cost_without = 0.0
    view: list[Message] = []
    now = [0.0]
    async with ContextManager(
        budget,
        strategy=strategy,
        recall=MemoryRecallStore(),
        session_id=session_id,
        on_over_budget="send",
        clock=lambda: now[0],
    ) as ctx:
        ctx.subscribe(events.append)
        cache_with = _PrefixCache(ctx.counter, cache_ttl)
        cache_without = _PrefixCache(ctx.counter, cache_ttl)
        calls = [i for i, m in enumerate(messages) if isinstance(m, AssistantMessage) and i > 0]
        for number, i in enumerate(calls, start=1):
            request = messages[:i]
            stamp = messages[i].extra.get("timestamp")
            # The transcript's own clock, so ages and idle gaps are the session's.
            now[0] = stamp / 1000 if isinstance(stamp, int | float) else now[0] + 30.0
            seen = len(events)
            view = await ctx.prepare(request)
            ctx.counter.refine(request)  # full estimates for the accounting below
            ctx.counter.refine(view)
            overhead = ctx.counter.overhead
            tokens_with = ctx.prompt_tokens
            tokens_without = overhead + ctx.counter.count_many(request)
            read, write, broke, cold = cache_with.send(view, overhead, now[0])
            read0, write0, _, _ = cache_without.send(request, overhead, now[0])
            cost_with += price.cost(_cache_usage(read, write, cache_ttl))
            cost_without += price.cost(_cache_usage(read0, write0, cache_ttl))
            actions = tuple(
                a for e in events[seen:] if isinstance(e, ContextCompacted) for a in e.actions
            )
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
                )
            )
            usage = messages[i].usage  # type: ignore[union-attr]
            messages_only = tokens_without - overhead
            if usage is not None and 0.8 * messages_only < usage.prompt_tokens < 3 * messages_only:
                # Only reports that can describe this request: after the recorded agent
                # compacted on its own, its requests were much smaller than the raw history.
                ctx.counter.observe(request, usage.prompt_tokens)
    return ReplayReport(
        rows=tuple(rows),
        budget_tokens=budget.limit,
        cost_with=cost_with,
        cost_without=cost_without,
        compactions=sum(isinstance(e, ContextCompacted) for e in events),
        cache_breaks=sum(r.cache_break for r in rows),
        cold_rewrites=sum(r.cold_rewrite for r in rows),
        final_view=tuple(view),
    )
