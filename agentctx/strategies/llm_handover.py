"""A briefing that waits to be spliced, handed from one worker of a session to the next.

A worker that ends (its manager closes) with a billed briefing not yet spliced puts it in the
session's saved state (`ContextManager.session_state`); the next worker of the session splices
it when its view needs it, as the last one would have, instead of paying for another. The
briefing names the raw messages it summarized, and those before it, by digests of their
fingerprints, and the history after it as the last worker had it: on a history where they
are not the same (cut back, edited in or before the span), where its span holds a message
every view shows (or, the history cut back since, one the tiers keep, as after a rewind), or
where other compaction already replaced its whole span, it is not taken, and `SummaryStale`
says why. Only a briefing is taken for one: the provider's compaction with the span's own
user messages, a summary message, or text.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from typing import TYPE_CHECKING, Any

from agentctx.boundaries import repaired_message
from agentctx.errors import UnsupportedMessageError
from agentctx.events import SummaryStats
from agentctx.ledger import protected_positions, shown_positions
from agentctx.messages import (
    AssistantMessage,
    OpaqueBlock,
    SummaryMessage,
    TextBlock,
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
            "head": _digest(raw, 0, job.start),
            # The history after the span as this worker last had it: one that only grew
            # since reads the span as this worker would; one cut back (and grown again),
            # more strictly, as after a rewind.
            "seen": [len(raw), _digest(raw, job.cut, len(raw))],
            "text": ready.text,
            "messages": [to_dict(m) for m in ready.messages],
            "model": ready.model,
            "messages_summarized": job.span_messages,
            "armed_tokens": job.armed_tokens,
        }
    }
    return state if len(json.dumps(state)) <= MOST_HANDOVER_CHARS else None


def _a_briefing(native: Sequence[Message], span: Sequence[Message]) -> bool:
    """Whether ``native`` is what a provider's compaction returns for ``span``: its
    compaction (an assistant message of the provider's compaction block, and text), with the
    span's own user messages where the provider keeps them (OpenAI's: as the view showed
    them), or a summary message or text (a summarizer of one's own): never a call, a result,
    or a user message the span does not hold."""
    if not native:
        return True
    if all(isinstance(m, UserMessage) for m in native):
        return False  # the span's own user messages alone summarize nothing
    users: set[str] = set()
    for m in span:
        if isinstance(m, UserMessage):
            shown = repaired_message(m)  # (a blank block left out, an empty one said)
            users.update(fingerprint(x) for x in (m, shown) if x is not None)
    for m in native:
        if isinstance(m, SummaryMessage):
            continue
        if isinstance(m, UserMessage):
            if fingerprint(m) not in users:
                return False
        elif not isinstance(m, AssistantMessage) or not m.content:
            return False
        elif any(isinstance(b, TextBlock) and "item" in b.extra for b in m.content):
            return False  # (a Responses item an adapter would send: a call, an instruction)
        elif any(_compaction(b) for b in m.content):
            if not all(isinstance(b, TextBlock) or _compaction(b) for b in m.content):
                return False
        elif any(key in m.extra for key in _RENDERED) or not all(
            isinstance(b, TextBlock) for b in m.content
        ):
            return False  # text alone, with nothing an adapter sends as a call or a role
    return True


# What an adapter renders from a message's ``extra`` (fields, calls, roles).
_RENDERED = ("openai_chat", "openai_responses", "anthropic")


def _compaction(block: object) -> bool:
    return isinstance(block, OpaqueBlock) and is_native_compaction(AssistantMessage((block,)))


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
    if not (text.strip() or native):
        return None
    stats = SummaryStats(0, Usage(), 0.0, model)
    start, cut = at
    raw = ctx.raw
    if not (0 <= start < cut <= len(raw)) or _digest(raw, start, cut) != span:
        return "history_changed", stats
    if d.get("head") != _digest(raw, 0, start):
        return "history_changed", stats  # what it was a briefing after was edited
    if not _a_briefing(native, raw[start:cut]):
        return None
    seen = d.get("seen")
    grown = (
        isinstance(seen, list)
        and len(seen) == 2
        and type(seen[0]) is int
        and cut <= seen[0] <= len(raw)
        and _digest(raw, cut, seen[0]) == seen[1]
    )
    # Grown only, the span holds nothing every view shows (as the last worker would have
    # found); cut back between the workers, nothing the tiers keep either (as a worker
    # finds after a rewind: a turn that is the newest complete one again keeps its steps).
    kept = shown_positions(raw) if grown else protected_positions(raw)
    if any(start <= i < cut for i in kept):
        return "history_changed", stats
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
