"""Run the fallback tiers on part of the view, so `LlmCompaction` can make room around a span
it is summarizing, or around a briefing it spliced, without the tiers touching either.

```python
actions = await run_tiers(fallback, ctx, start=vc, aim=capped(trigger))      # view[vc:] only
actions = await run_tiers(fallback, ctx, start=va, fence=vc, aim=capped(t))  # not across vc
actions = await run_tiers(fallback, ctx, instead=(va, vc, briefing), delta=d)  # around it
```
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from agentctx.boundaries import task_index
from agentctx.budget import Budget
from agentctx.events import ContextCompacted
from agentctx.ledger import ReplaceSpan
from agentctx.messages import SummaryMessage, UserMessage
from agentctx.strategies.llm_config import SUMMARY_MARKER
from agentctx.strategy import CompactionContext

if TYPE_CHECKING:
    from collections.abc import Sequence

    from agentctx.events import Event
    from agentctx.ledger import Decision
    from agentctx.messages import Message
    from agentctx.strategy import CompactionStrategy

__all__ = ["capped", "run_tiers"]

_SYNTHETIC_HEAD = UserMessage.of("[agentctx: the head and the briefing come before this point]")
_FENCE = SummaryMessage(f"{SUMMARY_MARKER}\n\n(the briefing being written ends here)")


def capped(limit: int, target: int | None = None) -> Budget:
    """A budget whose limit is ``limit`` tokens and whose target is ``target`` (default: the
    limit itself, so the tiers stop as soon as they are under it)."""
    limit = max(1, limit)
    ratio = 1.0 if target is None else min(1.0, max(1, target) / limit)
    return Budget(context_window=limit, reserve_output=0, trigger_ratio=1.0, target_ratio=ratio)


async def run_tiers(
    fallback: CompactionStrategy,
    ctx: CompactionContext,
    *,
    start: int | None = None,
    fence: int | None = None,
    instead: tuple[int, int, Message] | None = None,
    delta: int = 0,
    aim: Budget | None = None,
    give_way_above: int | None = None,
    rewriting: bool = False,
) -> list[str]:
    """Run ``fallback`` on ``ctx.view[start:]`` (all of it for ``None``), as if the prompt
    were ``delta`` tokens larger, against ``aim`` (default: the session's budget); return the
    actions of the events it emitted, which are folded into the caller's own.

    A synthetic user message stands in for everything before ``start`` (when the task is
    not in the part), so the tiers treat it as the task and cut only after it. With
    ``fence`` a synthetic briefing sits before ``view[fence]``, and with
    ``instead=(i, j, briefing)`` the briefing stands in for ``view[i:j]`` (count its
    difference in ``delta``): the tiers never condense or drop a briefing, so none of their
    decisions touches it or runs across it. ``give_way_above``: see
    `CompactionContext.give_way_above` (default: ``aim``'s trigger). ``rewriting``: the
    caller takes a decision rewriting what was sent before once they are done (a splice), so
    the call rewrites it anyway (`CompactionContext.breaking_cache`). Other events pass
    through to ``ctx.emit``.
    """
    collected: list[str] = []

    def emit(event: Event) -> None:
        if isinstance(event, ContextCompacted):
            collected.extend(event.actions)
        else:
            ctx.emit(event)

    view, origins, raw = ctx.view, ctx.origins, ctx.raw

    def position(k: int) -> int:
        return origins[k] if k < len(view) else len(raw)

    # Fixed in raw positions: decisions inside the part renumber the view.
    first = position(start) if start is not None else 0
    # Where the task itself is in the part (a history opening with the assistant's steps),
    # the tiers must take it for the task, not a stand-in before it that they cut after.
    head = start is not None and ((task := task_index(raw)) is None or task < first)
    overlay: tuple[int, int, Message] | None = None
    if instead is not None:
        overlay = (position(instead[0]), position(instead[1]), instead[2])
    elif fence is not None and fence < len(view):
        overlay = (position(fence), position(fence), _FENCE)
    cache: list[tuple[int, list[Message], list[int]]] = []

    def part() -> tuple[Sequence[Message], Sequence[int]]:
        if start is None and overlay is None:
            return ctx.view, ctx.origins
        version = ctx.ledger.version
        if not cache or cache[0][0] != version:
            view, origins = ctx.view, ctx.origins
            lo = bisect.bisect_left(origins, first)
            messages: list[Message] = list(view[lo:])
            positions: list[int] = list(origins[lo:])
            if overlay is not None:
                a, z, stand_in = overlay
                i = bisect.bisect_left(origins, a, lo) - lo
                j = bisect.bisect_left(origins, z, lo) - lo
                messages[i:j] = [stand_in]
                positions[i:j] = [a]
            if head:
                messages.insert(0, _SYNTHETIC_HEAD)
                positions.insert(0, origins[lo - 1] if lo > 0 else 0)
            cache[:] = [(version, messages, positions)]
        return cache[0][1], cache[0][2]

    counter = ctx.counter
    sub = _PartContext(
        session_id=ctx.session_id,
        raw=raw,
        budget=aim or ctx.budget,
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
        _complete_turn=ctx._complete_turn,
        _latest_user=ctx._latest_user,
        _cuts=ctx._cuts,
        taken=ctx.taken,
        give_way_above=give_way_above,
        _media_share=ctx._media_share,
        _rewriting=rewriting or ctx._rewriting,
        followed=ctx.followed,
        hard_limit=ctx.budget.limit if ctx.hard_limit is None else ctx.hard_limit,
    )
    await fallback.compact(sub)
    return collected


class _PartContext(CompactionContext):
    """The context the fallback tiers see: a decision that repeats a visible span exactly is
    ignored, so a tier that keeps re-taking one reaches its fixed point instead of looping."""

    def take(self, decision: Decision) -> None:
        if isinstance(decision, ReplaceSpan) and any(
            s.at == decision.at and s.end == decision.end and s.replacement == decision.replacement
            for s in self.ledger.spans
        ):
            return
        super().take(decision)
