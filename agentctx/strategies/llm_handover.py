"""A briefing that waits to be spliced, handed from one worker of a session to the next.

A worker that ends (its manager closes) with a billed briefing not yet spliced puts it in the
session's saved state (`ContextManager.session_state`); the next worker of the session splices
it when its view needs it, as the last one would have, instead of paying for another. The
briefing names the raw messages it summarized by a digest of their fingerprints: on a history
where they are not the same (cut back, edited anywhere in the span), where its span now holds
a message every view shows (a history cut back to before the turn after it), or where other
compaction already replaced its whole span, it is not taken, and `SummaryStale` says why.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from typing import TYPE_CHECKING, Any

from agentctx.errors import UnsupportedMessageError
from agentctx.events import SummaryStats
from agentctx.ledger import shown_positions
from agentctx.messages import (
    AssistantMessage,
    Usage,
    UserMessage,
    fingerprint,
    from_dict,
    to_dict,
)
from agentctx.strategies.llm_request import Job, Ready
from agentctx.summarizer import is_native_compaction

if TYPE_CHECKING:
    from collections.abc import Sequence

    from agentctx.messages import Message
    from agentctx.strategy import CompactionContext

__all__ = ["MOST_HANDOVER_CHARS", "handed_in", "handover_state"]

MOST_HANDOVER_CHARS = 1 << 18
"""The largest briefing handed over, in characters of its JSON (ASCII, as the session's saved
state is written); a larger one would crowd that state (`ContextManager.session_state`)."""


def _digest(raw: Sequence[Message], start: int, cut: int) -> str:
    fingerprints = "\n".join(fingerprint(raw[i]) for i in range(start, cut))
    return hashlib.sha256(fingerprints.encode("utf-8", "surrogatepass")).hexdigest()


def handover_state(ready: Ready, raw: Sequence[Message]) -> dict[str, Any] | None:
    """``ready``, a briefing of ``raw[start:cut]``, as JSON-able data for the next worker;
    ``None`` when ``raw`` no longer holds its span or it is too large to hand over."""
    job = ready.job
    if not 0 <= job.start < job.cut <= len(raw):
        return None
    state = {
        "briefing": {
            "at": [job.start, job.cut],
            "span": _digest(raw, job.start, job.cut),
            "text": ready.text,
            "messages": [to_dict(m) for m in ready.messages],
            "model": ready.model,
            "messages_summarized": job.span_messages,
            "armed_tokens": job.armed_tokens,
        }
    }
    return state if len(json.dumps(state)) <= MOST_HANDOVER_CHARS else None


def handed_in(state: object, ctx: CompactionContext) -> Ready | tuple[str, SummaryStats] | None:
    """The briefing a last worker handed over in ``state`` (what `handover_state` made), made
    ready for ``ctx``'s history; why that history cannot take it and its statistics (for
    `SummaryStale`); ``None`` when ``state`` holds none that can be read. Its usage and cost
    are zero: the last worker paid for it, and said so as it closed."""
    d = state.get("briefing") if isinstance(state, dict) else None
    if not isinstance(d, dict):
        return None
    at, text, model, span = d.get("at"), d.get("text"), d.get("model"), d.get("span")
    messages, summarized = d.get("messages"), d.get("messages_summarized")
    armed = d.get("armed_tokens")
    if not (
        isinstance(at, list)
        and len(at) == 2
        and all(type(i) is int for i in at)
        and type(text) is str
        and type(span) is str
        and isinstance(messages, list)
        and (model is None or type(model) is str)
        and type(summarized) is int
        and type(armed) is int
    ):
        return None
    try:
        native = tuple(from_dict(m) for m in messages)
    except (UnsupportedMessageError, RecursionError):
        return None
    # A briefing is its text, or the provider's own compaction (with the user messages
    # OpenAI's keeps): never a call, a result or another message of the model's.
    if native and not (
        any(map(is_native_compaction, native))
        and all(
            isinstance(m, UserMessage)
            or (isinstance(m, AssistantMessage) and is_native_compaction(m) and not m.tool_calls)
            for m in native
        )
    ):
        return None
    if not (text.strip() or native):
        return None
    stats = SummaryStats(0, Usage(), 0.0, model)
    start, cut = at
    raw = ctx.raw
    if not (0 <= start < cut <= len(raw)) or _digest(raw, start, cut) != span:
        return "history_changed", stats
    if any(start <= i < cut for i in shown_positions(raw)):
        return "history_changed", stats  # cut back: a message every view shows is in it
    if any(s.at.index <= start and cut <= s.end for s in ctx.ledger.spans):
        return "superseded", stats  # its span replaced whole already (an update spliced)
    view, origins = ctx.view, ctx.origins
    job = Job(
        start=start,
        cut=cut,
        rewinds=ctx.rewinds,
        messages=(),
        previous=None,
        span_messages=max(0, summarized),
        armed_tokens=max(0, armed),
        limit=ctx.budget.limit,
        first=bisect.bisect_left(origins, start),
        conversation=tuple(view[: bisect.bisect_left(origins, cut)]),
    )
    return Ready(job, text, Usage(), 0.0, model, native)
