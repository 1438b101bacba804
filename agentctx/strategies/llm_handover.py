"""A briefing that waits to be spliced, handed from one worker of a session to the next.

A worker that ends (its manager closes) with a billed briefing not yet spliced puts it in the
session's saved state (`ContextManager.session_state`); the next worker of the session splices
it when its view needs it, as the last one would have, instead of paying for another. The
briefing is named by the raw messages its span starts and ends with (position and
fingerprint, as a ledger decision is): on a history where they are not the same, it is not
taken (`SummaryStale` ``history_changed``).
"""

from __future__ import annotations

import bisect
import json
from typing import TYPE_CHECKING, Any

from agentctx.errors import UnsupportedMessageError
from agentctx.events import SummaryStats
from agentctx.messages import Usage, fingerprint, from_dict, to_dict
from agentctx.strategies.llm_request import Job, Ready

if TYPE_CHECKING:
    from agentctx.strategy import CompactionContext

__all__ = ["MOST_HANDOVER_CHARS", "handed_in", "handover_state"]

MOST_HANDOVER_CHARS = 1 << 18
"""The largest briefing (its text and provider-native messages, in characters of JSON) handed
over; a larger one would crowd the session's saved state (`ContextManager.session_state`)."""


def handover_state(ready: Ready) -> dict[str, Any] | None:
    """``ready`` as JSON-able data for the next worker, or ``None`` when it is too large to
    hand over."""
    job = ready.job
    native = [to_dict(m) for m in ready.messages]
    if len(ready.text) + len(json.dumps(native)) > MOST_HANDOVER_CHARS:
        return None
    return {
        "briefing": {
            "start": job.ends[0],
            "end": job.ends[1],
            "at": [job.start, job.cut],
            "text": ready.text,
            "messages": native,
            "model": ready.model,
            "messages_summarized": job.span_messages,
            "armed_tokens": job.armed_tokens,
        }
    }


def handed_in(state: object, ctx: CompactionContext) -> Ready | SummaryStats | None:
    """The briefing a last worker handed over in ``state`` (what `handover_state` made), made
    ready for ``ctx``'s history; the statistics of one that history no longer holds the span
    of (for `SummaryStale`); ``None`` when ``state`` holds none that can be read. Its usage
    and cost are zero: the last worker paid for it, and said so as it closed."""
    d = state.get("briefing") if isinstance(state, dict) else None
    if not isinstance(d, dict):
        return None
    at, text, model = d.get("at"), d.get("text"), d.get("model")
    messages, summarized = d.get("messages"), d.get("messages_summarized")
    armed = d.get("armed_tokens")
    if not (
        isinstance(at, list)
        and len(at) == 2
        and all(type(i) is int for i in at)
        and type(text) is str
        and isinstance(messages, list)
        and (model is None or type(model) is str)
        and type(summarized) is int
        and type(armed) is int
        and type(d.get("start")) is str
        and type(d.get("end")) is str
    ):
        return None
    try:
        native = tuple(from_dict(m) for m in messages)
    except (UnsupportedMessageError, RecursionError):
        return None
    if not text.strip() and not native:
        return None
    start, cut = at
    raw, view, origins = ctx.raw, ctx.view, ctx.origins
    if not (
        0 <= start < cut <= len(raw)
        and fingerprint(raw[start]) == d["start"]
        and fingerprint(raw[cut - 1]) == d["end"]
    ):
        return SummaryStats(0, Usage(), 0.0, model)
    first = bisect.bisect_left(origins, start)
    vc = bisect.bisect_left(origins, cut)
    job = Job(
        start=start,
        cut=cut,
        rewinds=ctx.rewinds,
        messages=(),
        previous=None,
        span_messages=max(0, summarized),
        armed_tokens=max(0, armed),
        limit=ctx.budget.limit,
        first=first,
        conversation=tuple(view[:vc]),
        ends=(d["start"], d["end"]),
    )
    return Ready(job, text, Usage(), 0.0, model, native)
