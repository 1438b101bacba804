"""`ToolOutputPipeline`: cheap passes over tool output, each sticky and recallable.

The passes of pi-context-engineering, in its order, with its defaults:

- **MC** (micro-compact): after an idle gap, clear old compactable results, keep the newest.
- **Budget**: cap the tool-result text of each user turn; the largest go first, with a preview.
- **L0**: expire results by age outside the protected turns and the newest ones; keep only the
  tail of long user-run shell output; drop the thinking of completed turns.
- **L1**: condense long results to head, tail, import and definition lines.
- **L2**: at a usage fraction, expire every result outside the protected turns.

Unlike the seed, every replacement is a ledger decision with a content-addressed recall id,
so it is byte-identical on every later call; placeholders name the tool, what it touched, the
size and the recall id; large arguments of completed calls are cleared with their results;
signed thinking is only ever dropped whole, in completed turns; recall results are exempt.

Lossy decisions are batched for the prefix cache. Proposals about messages not sent yet cost
no cache write and are always taken. Proposals about messages the provider has already seen
rewrite the cached prefix, so they wait until the prompt is over the hard budget, or together
(L2's aside) they free ``clear_at_least`` tokens, or the cache is cold. A rewrite then takes
the oldest of them first, as many as bring the prompt to the target (``target_ratio``), expires
further results oldest first if they are not enough, and hands what is left to the
deterministic tiers in the same call: every rewrite lands near the target, never just under
the budget, so the next one is as far away as the target puts it. L2's usage fraction no
longer forces a rewrite by itself on a warm cache: breaking there would spend a tenth of the
budget's headroom on every rewrite.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from agentctx import boundaries as b
from agentctx.errors import ConfigError
from agentctx.events import ContextCompacted
from agentctx.ledger import DropThinking, ReplaceArguments, ReplaceResult, ReplaceSpan, anchor
from agentctx.messages import (
    AssistantMessage,
    SummaryMessage,
    TextBlock,
    ToolResultMessage,
    UserMessage,
    text_of,
)
from agentctx.strategies.deterministic import DeterministicCompaction, describe_call

if TYPE_CHECKING:
    from collections.abc import Iterator

    from agentctx.ledger import Decision
    from agentctx.messages import Message
    from agentctx.strategy import CompactionContext, CompactionStrategy

__all__ = [
    "BudgetPass",
    "CondensePass",
    "EmergencyPass",
    "ExpiryPass",
    "MicroCompact",
    "ToolOutputPipeline",
    "condense",
]

RECALL_TOOL = "recall_context"
_COMMAND_KEYS = frozenset({"command", "cmd"})
_DEFINITION = re.compile(
    r"^\s*(import|export)\s|\b(function|class|interface|type|const|let|var|def)\s+\w"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class MicroCompact:
    """MC: after ``gap_seconds`` without a model call, clear all but ``keep_recent`` results."""

    gap_seconds: float = 3600.0
    keep_recent: int = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetPass:
    """Budget: at most ``max_chars_per_turn`` of tool-result text per user turn."""

    max_chars_per_turn: int = 200_000
    preview_chars: int = 2000


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpiryPass:
    """L0: expire results older than ``expire_seconds`` outside the protected turns and the
    ``keep_recent`` newest; keep the last ``user_shell_chars`` of user-run shell output; drop
    thinking of completed turns older than ``thinking_expire_seconds``."""

    expire_seconds: float = 1800.0
    protect_recent_turns: int = 2
    keep_recent: int = 5
    user_shell_chars: int = 4000
    thinking_expire_seconds: float = 300.0


@dataclass(frozen=True, slots=True, kw_only=True)
class CondensePass:
    """L1: condense results longer than ``threshold_chars`` outside the protected turns."""

    threshold_chars: int = 8000
    head_lines: int = 10
    tail_lines: int = 5
    protect_recent_turns: int = 2
    max_ratio: float = 0.4


@dataclass(frozen=True, slots=True, kw_only=True)
class EmergencyPass:
    """L2: at ``usage_fraction`` (0-1) of the budget, expire results outside protected turns."""

    usage_fraction: float = 0.9
    protect_recent_turns: int = 3


def condense(text: str, head: int, tail: int, max_ratio: float) -> str:
    """Head, tail and the import/definition lines between, or a clipped prefix as fallback."""
    lines = text.split("\n")
    if len(lines) > head + tail:
        out = lines[:head]
        omitted = 0
        for line in lines[head : len(lines) - tail]:
            if _DEFINITION.search(line):
                if omitted:
                    out.append(f"[... {omitted} lines omitted]")
                    omitted = 0
                out.append(line)
            else:
                omitted += 1
        if omitted:
            out.append(f"[... {omitted} lines omitted]")
        out.extend(lines[len(lines) - tail :])
        condensed = "\n".join(out)
        if len(condensed) <= max_ratio * len(text):
            return condensed
    return text[: int(max_ratio * len(text))] + "\n[... truncated for space]"


@dataclass(slots=True)
class _Proposal:
    decision: Decision
    freed: int
    fresh: bool
    action: str
    unit: int = -1  # raw index of the message it belongs with (a call's arguments: its result)

    def __post_init__(self) -> None:
        if self.unit < 0:
            self.unit = self.decision.at.index


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolOutputPipeline:
    """The MC / Budget / L0 / L1 / L2 passes; set a pass to ``None`` to disable it.

    Attributes:
        exclude_tools: tools whose results no pass touches (recall and memory tools).
        compactable_tools: if set, only these tools' results are compacted by MC (the seed's
            list was one agent's tool names; by default every tool not excluded counts).
        argument_chars: string arguments longer than this of a completed call are cleared
            together with its result.
        clear_at_least: tokens a batch of cache-breaking decisions must free to be taken;
            ``None`` means half the hard budget, so rewrites stay rare.
        cache_ttl_seconds: the provider's prefix-cache lifetime (Anthropic 300 or 3600,
            OpenAI 300-600); after it the cache is cold and compaction is free.
        target_ratio: the fraction (0-1) of the hard budget that a batch rewriting the sent
            prefix compacts down to, when lower than the budget's own ``target_ratio``
            (``None``: the budget's). Each rewrite breaks the prefix cache once, so the deeper
            it goes, the longer until the next one and the smaller the prefix every request
            in between reads: on the pi sessions 0.4 rather than 0.5 takes 6 rewrites instead
            of 7 and 13 instead of 16 on before-compaction (100k, 50k) and 6-14 % less input
            cost (benchmarks/cache_breaks.py).
        fallback: when a call rewrites the sent prefix (or must, being over the budget) and
            the passes leave the prompt above the target, these tiers condense the rest in the
            same call, to the target; ``None`` leaves it to whatever is chained after.
    """

    mc: MicroCompact | None = field(default_factory=MicroCompact)
    budget: BudgetPass | None = field(default_factory=BudgetPass)
    l0: ExpiryPass | None = field(default_factory=ExpiryPass)
    l1: CondensePass | None = field(default_factory=CondensePass)
    l2: EmergencyPass | None = field(default_factory=EmergencyPass)
    exclude_tools: frozenset[str] = frozenset({RECALL_TOOL, "memory"})
    compactable_tools: frozenset[str] | None = None
    argument_chars: int = 1000
    clear_at_least: int | None = None
    cache_ttl_seconds: float = 300.0
    target_ratio: float | None = 0.4
    fallback: CompactionStrategy | None = field(default_factory=DeterministicCompaction)

    def __post_init__(self) -> None:
        ratio = self.target_ratio
        if ratio is not None and not (math.isfinite(ratio) and 0 < ratio <= 1):
            raise ConfigError(f"target_ratio is a 0-1 fraction, got {ratio!r}")

    async def compact(self, ctx: CompactionContext) -> None:
        """Propose with every pass, then take the batch if it pays (see the module doc)."""
        run = _Run(self, ctx)
        run.propose_all()
        budget = ctx.budget
        if self.target_ratio is not None and self.target_ratio < budget.target_ratio:
            budget = replace(budget, target_ratio=self.target_ratio)
        messages_before = len(ctx.view)
        tokens_before = _tokens(ctx)
        cold = ctx.idle_seconds is not None and ctx.idle_seconds > self.cache_ttl_seconds
        if not run.proposals and tokens_before <= budget.limit and not cold:
            return
        # Decisions about messages not sent yet cost no cache write: always taken, and then
        # they may be enough to stay within the budget without touching the sent prefix.
        fresh = [p for p in run.proposals if p.fresh]
        stale = [p for p in run.proposals if not p.fresh]
        for p in fresh:
            ctx.take(p.decision)
        tokens = _tokens(ctx) if fresh else tokens_before
        forced = tokens > budget.limit
        threshold = self.clear_at_least if self.clear_at_least is not None else budget.limit // 2
        # The emergency pass's proposals are the budget's to force: counting them as a
        # worthwhile batch would break the cache at the emergency fraction, not at the budget.
        paying = sum(p.freed for p in stale if p.decision.reason != "l2") >= threshold
        taken = list(fresh)
        if cold or paying:
            # The whole prompt is written again anyway, or the batch pays for the rewrite.
            for p in stale:
                ctx.take(p.decision)
            taken += stale
        elif forced:
            # Rewriting what was sent: the oldest due decisions first, as many as reach the
            # target, so every rewrite lands near it and the next is as far away as it puts it.
            taken += run.take_until(stale, budget.target_tokens)
        rewrites = any(not p.fresh for p in taken)
        if (forced or cold or rewrites) and _tokens(ctx) > budget.target_tokens:
            # The prefix is rewritten in this call anyway: go all the way to the target in
            # this same call, so no second rewrite follows a few calls later. Over the hard
            # budget only the newest turn is spared; otherwise the turns L2 protects are.
            protect = 1 if forced or self.l2 is None else self.l2.protect_recent_turns
            taken += run.expire_to_target(protect, budget.target_tokens)
        if taken:
            ctx.emit(
                ContextCompacted(
                    method="pipeline",
                    strategy=type(self).__name__,
                    messages_before=messages_before,
                    messages_after=len(ctx.view),
                    tokens_before=tokens_before,
                    tokens_after=ctx.prompt_tokens,
                    decisions=len(taken),
                    actions=tuple(p.action for p in taken),
                )
            )
        rewrites = rewrites or any(not p.fresh for p in taken)
        if (
            self.fallback is not None
            and (forced or cold or rewrites)
            and _tokens(ctx) > budget.target_tokens
        ):
            # What the passes cannot reach (arguments, text, turns) the tiers condense, in the
            # same call and to the same target. For this call their hard budget is the
            # trigger: a rewrite that huge output of the in-flight loop leaves above it would
            # be followed by another within a few calls, so that output is cut now instead.
            trigger = max(1, budget.trigger_tokens)
            ratio = min(1.0, max(1, budget.target_tokens) / trigger)
            aim = replace(budget, hard_budget=trigger, trigger_ratio=ratio, target_ratio=ratio)
            await self.fallback.compact(replace(ctx, budget=aim))


def _tokens(ctx: CompactionContext) -> int:
    """The prompt size after the decisions taken so far (the view renders first)."""
    _ = ctx.origins
    return ctx.prompt_tokens


class _Run:
    """One pipeline run over one view: the proposals, with what each already claimed."""

    def __init__(self, cfg: ToolOutputPipeline, ctx: CompactionContext) -> None:
        self.cfg, self.ctx = cfg, ctx
        self.view, self.origins, self.raw = ctx.view, ctx.origins, ctx.raw
        self.proposals: list[_Proposal] = []
        self.claimed: set[int] = set()
        self.now = ctx.clock()
        self.calls = {
            c.id: (j, c)
            for j, m in enumerate(self.view)
            if isinstance(m, AssistantMessage)
            for c in m.tool_calls
        }
        users = [j for j, m in enumerate(self.view) if isinstance(m, UserMessage)]
        self.turn_of = [0] * len(self.view)
        t = 0
        for j in range(len(self.view)):
            if t < len(users) and users[t] == j:
                t += 1
            self.turn_of[j] = t
        self.turns = t
        summaries = [j for j, m in enumerate(self.view) if isinstance(m, SummaryMessage)]
        self.boundary = summaries[-1] if summaries else -1
        self.loop_start = b.in_flight_start(self.view)
        self.results = [j for j, m in enumerate(self.view) if self._candidate(j, m)]

    # -- what may be touched -------------------------------------------------------------

    def _candidate(self, j: int, m: Message) -> bool:
        if not isinstance(m, ToolResultMessage):
            return False
        i = self.origins[j]
        if self.raw[i] is not m or self.ctx.ledger.span_covering(i):
            return False  # already replaced, or hidden by a summary
        return self._name(m) not in self.cfg.exclude_tools

    def _name(self, m: ToolResultMessage) -> str:
        call = self.calls.get(m.tool_call_id)
        return m.tool_name or (call[1].name if call else "tool")

    def _protected(self, j: int, turns: int) -> bool:
        return self.turn_of[j] > self.turns - turns

    def _age(self, j: int) -> float | None:
        stamp = self.view[j].extra.get("timestamp")
        return self.now - stamp / 1000 if isinstance(stamp, int | float) else None

    # -- building decisions --------------------------------------------------------------

    def _placeholder(self, j: int, kind: str, text: str, rid: str | None) -> str:
        m = self.view[j]
        assert isinstance(m, ToolResultMessage)
        call = self.calls.get(m.tool_call_id)
        what = describe_call(call[1]) if call else self._name(m)
        lines = text.count("\n") + 1
        status = ", error" if m.is_error else ""
        where = f' Use recall_context(id="{rid}") to read it.' if rid else ""
        return f"[{kind}: {what} -> {lines} lines, {len(text)} chars{status}.{where}]"

    def _store(self, text: str) -> str | None:
        recall = self.ctx.recall
        return recall.put(self.ctx.session_id, text) if recall is not None else None

    def _replace(self, j: int, new_text: str, reason: str, action: str, rid: str | None) -> None:
        m = self.view[j]
        assert isinstance(m, ToolResultMessage)
        i = self.origins[j]
        replacement = ToolResultMessage(
            m.tool_call_id, (TextBlock(new_text),), m.tool_name, m.is_error, m.extra
        )
        count = self.ctx.counter
        freed = count.count_full(m) - count.count_full(replacement)
        decision = ReplaceResult(anchor(self.raw, i), (TextBlock(new_text),), reason, rid)
        self._add(_Proposal(decision, freed, i >= self.ctx.sent, action), i)
        self._clear_arguments(m.tool_call_id, reason, i)

    def _add(self, proposal: _Proposal, i: int) -> None:
        self.claimed.add(i)
        self.proposals.append(proposal)

    def _clear_arguments(self, call_id: str, reason: str, unit: int) -> None:
        found = self.calls.get(call_id)
        if found is None or found[0] >= self.loop_start:
            return  # never the in-flight tool loop's calls
        j, call = found
        i = self.origins[j]
        if self.raw[i] is not self.view[j]:
            return
        long_args = {
            k: v
            for k, v in call.arguments.items()
            if isinstance(v, str) and len(v) > self.cfg.argument_chars
        }
        if not long_args:
            return
        rid = self._store(_json(dict(long_args)))
        args: dict[str, Any] = dict(call.arguments)
        for key, value in long_args.items():
            note = f' recall_context(id="{rid}")' if rid else ""
            # A command's first line names what it ran on (``cat > x.py << EOF``): it stays.
            head = value.split("\n", 1)[0][:200] + "\n" if key in _COMMAND_KEYS else ""
            args[key] = f"{head}[cleared: {len(value)} chars{note}]"
        freed = sum(len(v) - len(str(args[k])) for k, v in long_args.items()) // 4
        decision = ReplaceArguments(anchor(self.raw, i), call.id, args, reason, rid)
        self.proposals.append(
            _Proposal(
                decision,
                freed,
                i >= self.ctx.sent,
                f"cleared arguments of {describe_call(call)}",
                unit,
            )
        )

    def _expire(self, j: int, kind: str, reason: str, *, only_if_smaller: bool = False) -> None:
        m = self.view[j]
        assert isinstance(m, ToolResultMessage)
        text = text_of(m.content)
        if only_if_smaller and len(self._placeholder(j, kind, text, "ctx-" + "0" * 16)) >= len(
            text
        ):
            # A placeholder as long as the result frees nothing; its call's long arguments may.
            self.claimed.add(self.origins[j])
            self._clear_arguments(m.tool_call_id, reason, self.origins[j])
            return
        rid = self._store(text)
        new = self._placeholder(j, kind, text, rid)
        self._replace(j, new, reason, f"{reason}: {self._name(m)}", rid)

    # -- the passes ----------------------------------------------------------------------

    def propose_all(self) -> None:
        cfg = self.cfg
        if cfg.mc is not None:
            self._mc(cfg.mc)
        if cfg.budget is not None:
            self._budget(cfg.budget)
        if cfg.l0 is not None:
            self._l0(cfg.l0)
        if cfg.l1 is not None:
            self._l1(cfg.l1)
        if cfg.l2 is not None:
            self._l2(cfg.l2)

    def _open(self, j: int, *, after_boundary: bool = True) -> bool:
        return self.origins[j] not in self.claimed and (not after_boundary or j > self.boundary)

    def _mc(self, mc: MicroCompact) -> None:
        idle = self.ctx.idle_seconds
        last = [j for j, m in enumerate(self.view) if isinstance(m, AssistantMessage)]
        gap = idle if idle is not None else (self._age(last[-1]) if last else None)
        if gap is None or gap <= mc.gap_seconds:
            return
        allowed = self.cfg.compactable_tools
        picks = [
            j
            for j in self.results
            if self._open(j) and (allowed is None or self._name(self.view[j]) in allowed)  # type: ignore[arg-type]
        ]
        for j in picks[: max(0, len(picks) - mc.keep_recent)]:
            self._expire(j, "Old tool result expired", "mc")

    def _budget(self, cfg: BudgetPass) -> None:
        groups: dict[int, list[int]] = {}
        for j in self.results:
            groups.setdefault(self.turn_of[j], []).append(j)
        for members in groups.values():
            sizes = {j: len(text_of(self.view[j].content)) for j in members if self._open(j)}  # type: ignore[union-attr]
            total = sum(sizes.values())
            for j in sorted(sizes, key=lambda k: (-sizes[k], k)):
                if total <= cfg.max_chars_per_turn:
                    break
                text = text_of(self.view[j].content)  # type: ignore[union-attr]
                rid = self._store(text)
                where = f' (recall_context id="{rid}")' if rid else ""
                preview = text[: cfg.preview_chars]
                new = f"[Persisted output{where}. Preview: {preview}... Total: {len(text)} chars]"
                if len(new) >= len(text):
                    break
                self._replace(j, new, "budget", f"persisted {self._name(self.view[j])} output", rid)  # type: ignore[arg-type]
                total -= sizes[j] - len(new)

    def _l0(self, cfg: ExpiryPass) -> None:
        recent = set(self.results[-cfg.keep_recent :]) if cfg.keep_recent else set()
        for j in self.results:
            age = self._age(j)
            if (
                age is not None
                and age > cfg.expire_seconds
                and not self._protected(j, cfg.protect_recent_turns)
                and j not in recent
                and self._open(j, after_boundary=False)
            ):
                self._expire(j, "Tool result expired", "l0")
        latest = b.latest_user_index(self.view)
        for j, m in enumerate(self.view):
            i = self.origins[j]
            if (
                isinstance(m, UserMessage)
                and m.extra.get("source") == "bash_execution"
                and j != latest
            ):
                text = text_of(m.content)
                if len(text) > cfg.user_shell_chars and self.raw[i] is m and i not in self.claimed:
                    rid = self._store(text)
                    note = f' recall_context(id="{rid}")' if rid else ""
                    tail = text[-cfg.user_shell_chars :]
                    new = f"... [truncated{note}. Total: {len(text)} chars]\n\n{tail}"
                    replacement = UserMessage((TextBlock(new),), m.extra)
                    freed = self.ctx.counter.count_full(m) - self.ctx.counter.count_full(
                        replacement
                    )
                    decision = ReplaceSpan(
                        anchor(self.raw, i), i + 1, anchor(self.raw, i), (replacement,), "l0-shell"
                    )
                    self._add(
                        _Proposal(
                            decision,
                            freed,
                            i >= self.ctx.sent,
                            "kept the tail of user shell output",
                        ),
                        i,
                    )
            elif (
                isinstance(m, AssistantMessage)
                and j < self.loop_start - 1
                and b.has_thinking(m)
                and self.raw[i] is m
                and (age := self._age(j)) is not None
                and age > cfg.thinking_expire_seconds
            ):
                thinking = [
                    blk for blk in m.content if blk.type in ("thinking", "redacted_thinking")
                ]
                freed = (
                    sum(
                        len(getattr(blk, "thinking", "") or getattr(blk, "data", ""))
                        for blk in thinking
                    )
                    // 4
                )
                self.proposals.append(
                    _Proposal(
                        DropThinking(anchor(self.raw, i), "l0-thinking"),
                        freed,
                        i >= self.ctx.sent,
                        "dropped thinking of a completed turn",
                    )
                )

    def _l1(self, cfg: CondensePass) -> None:
        for j in self.results:
            if self._protected(j, cfg.protect_recent_turns) or not self._open(j):
                continue
            text = text_of(self.view[j].content)  # type: ignore[union-attr]
            if len(text) <= cfg.threshold_chars:
                continue
            rid = self._store(text)
            body = condense(text, cfg.head_lines, cfg.tail_lines, cfg.max_ratio)
            where = f' (recall_context id="{rid}")' if rid else ""
            new = f"[Condensed{where}: {self._placeholder(j, 'was', text, None)[1:-1]}]\n{body}"
            self._replace(j, new, "l1", f"condensed {self._name(self.view[j])} output", rid)  # type: ignore[arg-type]

    def _l2(self, cfg: EmergencyPass) -> None:
        if self.ctx.prompt_tokens < cfg.usage_fraction * self.ctx.budget.limit:
            return
        for j in self.results:
            if not self._protected(j, cfg.protect_recent_turns) and self._open(j):
                self._expire(j, "Tool result expired", "l2")

    def take_until(self, proposals: list[_Proposal], target: int) -> list[_Proposal]:
        """Take ``proposals`` oldest first, whole units (a result with its call's arguments),
        until the prompt is at ``target``; return those taken."""
        units: dict[int, list[_Proposal]] = {}
        for p in sorted(proposals, key=lambda p: p.unit):
            units.setdefault(p.unit, []).append(p)
        return self._take_units(iter(units.values()), target)

    def expire_to_target(self, protect_turns: int, target: int) -> list[_Proposal]:
        """Expire the oldest results outside the newest ``protect_turns`` turns and the
        in-flight tool loop until the prompt is at ``target``; return what was taken."""

        def units() -> Iterator[list[_Proposal]]:
            for j in self.results:
                if self._protected(j, protect_turns) or j >= self.loop_start or not self._open(j):
                    continue
                before = len(self.proposals)
                self._expire(j, "Tool result expired", "budget-forced", only_if_smaller=True)
                unit = self.proposals[before:]
                del self.proposals[before:]
                if unit:
                    yield unit

        return self._take_units(units(), target)

    def _take_units(self, units: Iterator[list[_Proposal]], target: int) -> list[_Proposal]:
        # Each proposal carries its own estimate of what it frees, so the view is rendered
        # again only when those say the target is reached, not after every decision.
        ctx = self.ctx
        taken: list[_Proposal] = []
        need = _tokens(ctx) - target
        freed = 0
        for unit in units:
            if need <= 0:
                break
            if sum(p.freed for p in unit) <= 0:
                continue  # a placeholder no smaller than what it replaces only churns the cache
            for p in unit:
                ctx.take(p.decision)
                freed += p.freed
            taken += unit
            if freed >= need:
                need, freed = _tokens(ctx) - target, 0
        return taken


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)
