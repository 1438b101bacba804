"""Retention: after each compaction, can the model still see an early fact or get it back?

```python
from agentctx.replay.retention import early_paths

report = await replay(messages, budget=budget, strategy=strategy, facts=early_paths(messages))
print(report.retention.worst, report.retention.mean)   # shares of the facts, 0..1
```

The method is benchmarks/retention.py's. A *fact* is a piece of text with the raw index of
the message that first holds it. In a synthetic session facts can be planted (unique lines
of text); a real transcript has none, so `early_paths` takes the file paths the agent touched
in the first third of its steps (values of ``*path*`` tool arguments and path-like words of
shell commands). After every request that compacted, each fact already in the history is
checked:

- *in view*: a substring of what the model reads in the view (`visible_text`: text blocks,
  tool calls with their arguments, briefings; not thinking);
- *recall*: not in view, but a recall id the view shows (``ctx-`` + 16 hex) answers
  ``recall_context(id, pattern=fact)`` with at least one matching line: one call away;
- *lost*: neither.

`Retention` sums the checks up: the share kept at the worst check (the figure to hold against
a target such as 95 %) and on average, and the split over all (check, fact) pairs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentctx.messages import AssistantMessage, SummaryMessage, TextBlock, ToolCall
from agentctx.recall.store import references
from agentctx.strategies.trail import paths_in

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from agentctx.manager import ContextManager
    from agentctx.messages import Message

__all__ = ["Fact", "Retention", "RetentionMeter", "early_paths", "visible_text"]

RECALL_ID = re.compile(r"ctx-[0-9a-f]{16}")
_MATCHES = re.compile(r"^\[recall_context ctx-[0-9a-f]{16}: (\d+) lines match")


@dataclass(frozen=True, slots=True)
class Fact:
    """A piece of text the model should keep access to, first held by raw message ``index``."""

    kind: str
    text: str
    index: int


@dataclass(frozen=True, slots=True)
class Retention:
    """What the checks found (shares are 0..1; ``worst`` and ``mean`` are ``None`` when
    nothing compacted, so there was nothing to check)."""

    facts: int
    """Facts given (the whole session's)."""
    checks: int
    """Requests that compacted, each followed by a check."""
    worst: float | None
    """The share of the facts so far kept (in view or recallable) at the worst check."""
    mean: float | None
    """That share averaged over the checks."""
    in_view: int = 0
    """(check, fact) pairs found in the view."""
    recall: int = 0
    """(check, fact) pairs one recall away."""
    lost: int = 0
    """(check, fact) pairs lost."""

    def as_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict."""
        return {
            "facts": self.facts,
            "checks": self.checks,
            "worst": self.worst,
            "mean": self.mean,
            "in_view": self.in_view,
            "recall": self.recall,
            "lost": self.lost,
        }


def combine(parts: Sequence[Retention]) -> Retention:
    """Several replays' retention as one: the worst check of all, the mean over all checks."""
    checks = sum(p.checks for p in parts)
    worst = [p.worst for p in parts if p.worst is not None]
    weighted = sum(p.mean * p.checks for p in parts if p.mean is not None)
    return Retention(
        facts=sum(p.facts for p in parts),
        checks=checks,
        worst=min(worst) if worst else None,
        mean=weighted / checks if checks else None,
        in_view=sum(p.in_view for p in parts),
        recall=sum(p.recall for p in parts),
        lost=sum(p.lost for p in parts),
    )


def early_paths(messages: Sequence[Message]) -> list[Fact]:
    """Paths touched in the first third of the assistant steps: values of ``*path*``
    arguments and path-like words of the first line of shell commands (``command``/``cmd``)."""
    steps = [i for i, m in enumerate(messages) if isinstance(m, AssistantMessage)]
    found: dict[str, int] = {}
    for i in steps[: len(steps) // 3]:
        m = messages[i]
        assert isinstance(m, AssistantMessage)
        for call in m.tool_calls:
            for key, value in call.arguments.items():
                if not isinstance(value, str):
                    continue
                if "path" in key.lower():
                    found.setdefault(value, i)
                elif key in ("command", "cmd"):
                    # (A regex of these paths read a long run of "a/a/..." again from each
                    # start: 9 s for one 40 KB command.)
                    for p in paths_in(value.split("\n", 1)[0]):
                        found.setdefault(p, i)
    return [Fact("path", p, i) for p, i in found.items() if p.strip()]


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _strings(v)


def visible_text(view: Sequence[Message]) -> str:
    """What the model reads in ``view``: text blocks, tool-call names and arguments (as JSON
    and as plain strings, so escaping hides nothing), briefings. Not thinking."""
    parts: list[str] = []
    for m in view:
        if isinstance(m, SummaryMessage):
            parts.append(m.text)
            continue
        for blk in m.content:
            if isinstance(blk, TextBlock):
                parts.append(blk.text)
            elif isinstance(blk, ToolCall):
                args = dict(blk.arguments)
                parts.append(f"{blk.name} {json.dumps(args, ensure_ascii=False, default=str)}")
                parts.extend(_strings(args))
    return "\n".join(parts)


async def recallable(ctx: ContextManager, ids: Sequence[str], fact: str) -> bool:
    """Whether one ``recall_context(id, pattern=fact)`` call on an id shown in the view
    returns the fact (`returned_by` each id)."""
    for rid in ids:
        if fact in await returned_by(ctx, rid, (fact,)):
            return True
    return False


async def returned_by(ctx: ContextManager, rid: str, facts: Sequence[str]) -> set[str]:
    """Which of ``facts`` one ``recall_context(rid, pattern=fact)`` call returns (the whole
    text of the entry finds the candidates, references to other entries followed as the tool
    follows them; the call itself decides)."""
    whole = await ctx.recall(rid, limit=2**62)
    found = set()
    for fact in facts:
        if fact in whole:
            m = _MATCHES.match(await ctx.recall(rid, pattern=fact))  # literal text
            if m and int(m.group(1)) > 0:
                found.add(fact)
    return found


class RetentionMeter:
    """Checks ``facts`` after each compaction; `replay` drives it when given ``facts``."""

    def __init__(self, facts: Sequence[Fact]) -> None:
        self.facts = list(facts)
        self.shares: list[float] = []
        self.in_view = self.recall = self.lost = 0
        # The facts each recall id returns, read once: an entry never changes (its id is a
        # hash of its content), and reading every entry again on each check, for each fact,
        # made a long session's replay cubic in its length.
        self._returns: dict[str, set[str]] = {}

    async def _returned(self, ctx: ContextManager, rid: str, texts: Sequence[str]) -> set[str]:
        """What one recall of ``rid`` returns of ``texts``: what the entries it refers to
        return (each read once: a stretch dropped again refers to the drop before it, so
        reading each expansion whole made a long replay quadratic), and what its own text
        holds, which the tool call decides (`returned_by`)."""
        found = self._returns.get(rid)
        if found is not None:
            return found
        writer = ctx._writer
        own = None if writer is None else writer.get(ctx.session_id, rid)
        if own is None:  # not kept: the call says what it says
            found = await returned_by(ctx, rid, texts)
        else:
            found = set()
            for ref in references(own):
                found |= await self._returned(ctx, ref, texts)
            if mine := [t for t in texts if t not in found and t in own]:
                found |= await returned_by(ctx, rid, mine)
        self._returns[rid] = found
        return found

    async def check(self, ctx: ContextManager, view: Sequence[Message], raw: int) -> float:
        """Check the facts among the first ``raw`` messages against ``view``; returns the
        share kept."""
        text = visible_text(view)
        ids = list(dict.fromkeys(RECALL_ID.findall(text)))
        texts = [f.text for f in self.facts]
        for rid in ids:
            await self._returned(ctx, rid, texts)
        emitted = [f for f in self.facts if f.index < raw]
        kept = 0
        for fact in emitted:
            if fact.text in text:
                self.in_view += 1
            elif any(fact.text in self._returns[rid] for rid in ids):
                self.recall += 1
            else:
                self.lost += 1
                continue
            kept += 1
        share = kept / len(emitted) if emitted else 1.0
        self.shares.append(share)
        return share

    def result(self) -> Retention:
        """The checks so far, summed up."""
        shares = self.shares
        return Retention(
            facts=len(self.facts),
            checks=len(shares),
            worst=min(shares) if shares else None,
            mean=sum(shares) / len(shares) if shares else None,
            in_view=self.in_view,
            recall=self.recall,
            lost=self.lost,
        )
