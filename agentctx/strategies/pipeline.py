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
the budget, so the next one is as far away as the target puts it. When expiring every result
could not reach the target anyway, the tiers go first (they would drop those results' turns in
the same call), and the passes expire only what stays in view. L2's usage fraction no
longer forces a rewrite by itself on a warm cache: breaking there would spend a tenth of the
budget's headroom on every rewrite. A call that provably takes nothing (a step of the running
tool loop on a warm cache, where no batch can pay yet) skips the passes (`nothing_to_take`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from agentctx._check import fraction, got, number, whole
from agentctx.errors import ConfigError
from agentctx.events import ContextCompacted
from agentctx.strategies.deterministic import DeterministicCompaction
from agentctx.strategies.pipeline_run import (
    Memo,
    Proposal,
    Run,
    condense,
    memo_version,
    nothing_to_take,
)
from agentctx.strategy import check_strategy, end_session

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from agentctx.budget import Budget
    from agentctx.events import Event
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
_MEMO_SESSIONS = 16  # sessions sharing one pipeline whose work is kept between calls


@dataclass(frozen=True, slots=True, kw_only=True)
class MicroCompact:
    """MC: after ``gap_seconds`` without a model call, clear all but ``keep_recent`` results."""

    gap_seconds: float = 3600.0
    keep_recent: int = 5

    def __post_init__(self) -> None:
        number(self, "gap_seconds")
        whole(self, "keep_recent")


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetPass:
    """Budget: at most ``max_chars_per_turn`` of tool-result text per user turn."""

    max_chars_per_turn: int = 200_000
    preview_chars: int = 2000

    def __post_init__(self) -> None:
        whole(self, "max_chars_per_turn")
        whole(self, "preview_chars")


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

    def __post_init__(self) -> None:
        number(self, "expire_seconds")
        whole(self, "protect_recent_turns")
        whole(self, "keep_recent")
        # text[-0:] is the whole text: a tail of 0 characters would keep everything.
        whole(self, "user_shell_chars", minimum=1)
        number(self, "thinking_expire_seconds")


@dataclass(frozen=True, slots=True, kw_only=True)
class CondensePass:
    """L1: condense results longer than ``threshold_chars`` outside the protected turns."""

    threshold_chars: int = 8000
    head_lines: int = 10
    tail_lines: int = 5
    protect_recent_turns: int = 2
    max_ratio: float = 0.4

    def __post_init__(self) -> None:
        whole(self, "threshold_chars")
        whole(self, "head_lines")
        whole(self, "tail_lines")
        whole(self, "protect_recent_turns")
        fraction(self, "max_ratio")


@dataclass(frozen=True, slots=True, kw_only=True)
class EmergencyPass:
    """L2: at ``usage_fraction`` (0-1) of the budget, expire results outside protected turns."""

    usage_fraction: float = 0.9
    protect_recent_turns: int = 3

    def __post_init__(self) -> None:
        fraction(self, "usage_fraction")
        whole(self, "protect_recent_turns")


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
            (``None``: the budget's, 0.1 by default, which is lower). Each rewrite breaks the
            prefix cache once, so the deeper it goes, the longer until the next one and the
            smaller the prefix every request in between reads (benchmarks/frontier.py).
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
    # Per session (by id), the passes' work kept between calls; a few sessions at most.
    _memos: dict[str, Memo] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        if self.fallback is not None:
            check_strategy(self.fallback)
        passes = (
            ("mc", MicroCompact),
            ("budget", BudgetPass),
            ("l0", ExpiryPass),
            ("l1", CondensePass),
            ("l2", EmergencyPass),
        )
        for name, kind in passes:
            value = getattr(self, name)
            if value is not None and not isinstance(value, kind):
                raise ConfigError(
                    f"ToolOutputPipeline.{name} must be a pass config ({kind.__name__}) or "
                    f"None; got {got(self, name)}"
                )
        for name in ("exclude_tools", "compactable_tools"):
            tools = getattr(self, name)
            if tools is None and name == "compactable_tools":
                continue
            if not isinstance(tools, frozenset | set) or not all(isinstance(t, str) for t in tools):
                raise ConfigError(
                    f"ToolOutputPipeline.{name} must be a frozenset of tool names; got "
                    + got(self, name)
                )
        whole(self, "argument_chars")
        whole(self, "clear_at_least", optional=True)
        number(self, "cache_ttl_seconds")
        fraction(self, "target_ratio", optional=True)

    def batch_threshold(self, limit: int) -> int:
        """What a batch rewriting the sent prefix must free to be taken, for a hard budget of
        ``limit`` tokens (``clear_at_least``, or half of it)."""
        return self.clear_at_least if self.clear_at_least is not None else limit // 2

    def _memo(self, ctx: CompactionContext) -> Memo:
        memos = self._memos
        memo = memos.pop(ctx.session_id, None)
        if memo is None or memo.version != memo_version(ctx):
            memo = Memo(memo_version(ctx), memo)  # decisions and rewinds change what they see
        memos[ctx.session_id] = memo
        while len(memos) > _MEMO_SESSIONS:
            del memos[next(iter(memos))]
        return memo

    def close(self, emit: Callable[[Event], None]) -> None:
        """The session ended: the fallback is told, if it has a ``close`` (a briefing an
        `LlmCompaction` fallback was billed for and never spliced is reported)."""
        if self.fallback is not None:
            end_session(self.fallback, emit)

    async def compact(self, ctx: CompactionContext) -> None:
        """Propose with every pass, then take the batch if it pays (see the module doc)."""
        if nothing_to_take(self, ctx, self._memos.get(ctx.session_id)):
            return
        report = _Report(ctx, type(self).__name__)
        if isinstance(self.fallback, DeterministicCompaction):
            # Sized on a result that is cut down anyway, the passes would expire the newest
            # complete turn's output, and the tiers drop older history, for nothing.
            report.actions += self.fallback.cut_oversized(ctx)
        run = Run(self, ctx, self._memo(ctx))
        run.memo.unpaying = False  # set again below if this run takes nothing
        run.memo.steady = None
        run.propose_all()
        budget = ctx.budget
        if self.target_ratio is not None and self.target_ratio < budget.target_ratio:
            budget = replace(budget, target_ratio=self.target_ratio)
        tokens_before = ctx.prompt_tokens
        cold = ctx.idle_seconds is not None and ctx.idle_seconds > self.cache_ttl_seconds
        threshold = self.batch_threshold(budget.limit)
        if (
            tokens_before > budget.limit
            and self.fallback is not None
            and not any(p.fresh for p in run.proposals)
            and run.beyond_expiry(budget.target_tokens)
        ):
            # Over the budget, and expiring every result the passes may touch would still
            # leave the prompt above the target: the tiers then drop the stretch those
            # results are in, in this same call. Placeholders made first would only be
            # dropped with it (a hundred of them a call, half its time), so the tiers go
            # first. Only the results of the newest complete turn, which no tier drops, are
            # expired before them (the tiers would cut them otherwise, and a cut result is
            # not expired); after them, what else they kept above the target.
            target = budget.target_tokens
            report.took(run.expire_to_target(1, target, within=ctx.protected_turn or (0, 0)))
            if ctx.prompt_tokens > target:
                await self._land(ctx, budget, report)
            if ctx.prompt_tokens > target:
                report.took(Run(self, ctx, self._memo(ctx)).expire_to_target(1, target))
            report.emit()
            return
        if run.deferred is not None and (
            cold or tokens_before > budget.limit or _paying(run.proposals) >= threshold
        ):
            # L2 deferred only what this call could take in exactly these cases (there is
            # nothing fresh to take first: the prompt is still ``tokens_before``).
            run.propose_deferred()
        if not run.proposals and tokens_before <= budget.limit and not cold:
            if tokens_before >= threshold:
                _note_unpaying(run, 0, threshold)
            report.emit()
            return
        # Decisions about messages not sent yet cost no cache write: always taken, and then
        # they may be enough to stay within the budget without touching the sent prefix.
        fresh = [p for p in run.proposals if p.fresh]
        stale = [p for p in run.proposals if not p.fresh]
        for p in fresh:
            run.take(p)
        tokens = ctx.prompt_tokens if fresh else tokens_before
        forced = tokens > budget.limit
        paying = _paying(stale) >= threshold
        taken = list(fresh)
        if cold or paying:
            # The whole prompt is written again anyway, or the batch pays for the rewrite.
            for p in stale:
                run.take(p)
            taken += stale
        elif forced:
            # Rewriting what was sent: the oldest due decisions first, as many as reach the
            # target, so every rewrite lands near it and the next is as far away as it puts it.
            taken += run.take_until(stale, budget.target_tokens)
        rewrites = any(not p.fresh for p in taken)
        if (forced or cold or rewrites) and ctx.prompt_tokens > budget.target_tokens:
            # The prefix is rewritten in this call anyway: go all the way to the target in
            # this same call, so no second rewrite follows a few calls later. Over the hard
            # budget only the newest turn is spared; otherwise the turns L2 protects are.
            protect = 1 if forced or self.l2 is None else self.l2.protect_recent_turns
            taken += run.expire_to_target(protect, budget.target_tokens)
        report.took(taken)
        if not taken and tokens_before >= threshold:
            # Over half the budget, most calls take nothing: what this one found lets the
            # next ones skip the passes (`nothing_to_take`) until it could change.
            _note_unpaying(run, _paying(stale), threshold)
        rewrites = rewrites or any(not p.fresh for p in taken)
        if (forced or cold or rewrites) and ctx.prompt_tokens > budget.target_tokens:
            await self._land(ctx, budget, report)
        report.emit()

    async def _land(self, ctx: CompactionContext, budget: Budget, report: _Report) -> None:
        """Have the fallback tiers condense what the passes cannot reach (arguments, text,
        turns), in the same call and to the same target. What was taken before is reported
        first; the fallback reports its own work."""
        if self.fallback is None:
            return
        report.emit()
        # For this call their hard budget is the trigger: a rewrite that huge output of the
        # in-flight loop leaves above it would be followed by another within a few calls, so
        # that output is cut now instead. Below it the recent steps stay as they are: the
        # next rewrite is as far away.
        trigger = max(1, budget.trigger_tokens)
        ratio = min(1.0, max(1, budget.target_tokens) / trigger)
        aim = replace(budget, hard_budget=trigger, trigger_ratio=ratio, target_ratio=ratio)
        hard_limit = budget.limit if ctx.hard_limit is None else ctx.hard_limit
        await self.fallback.compact(
            replace(ctx, budget=aim, give_way_above=trigger, hard_limit=hard_limit)
        )
        report.skip()


class _Report:
    """The `ContextCompacted` events of a pipeline call, one for each stretch of its own work
    (before and after its fallback, which reports its own): each compaction is reported once,
    by the strategy that took it, so the events of a call add up to what it saved."""

    def __init__(self, ctx: CompactionContext, strategy: str) -> None:
        self._ctx = ctx
        self._strategy = strategy
        self.actions: list[str] = []
        self._mark()

    def _mark(self) -> None:
        ctx = self._ctx
        self._decisions, self._messages = len(ctx.taken), len(ctx.view)
        self._tokens = ctx.prompt_tokens

    def took(self, taken: Sequence[Proposal]) -> None:
        self.actions += (p.action for p in taken)

    def emit(self) -> None:
        """Report what was taken since the last report, counted in full."""
        ctx = self._ctx
        decisions = len(ctx.taken) - self._decisions
        if decisions:
            ctx.counter.refine(ctx.view)  # what was cut or put in place was counted quickly
            ctx.emit(
                ContextCompacted(
                    method="pipeline",
                    strategy=self._strategy,
                    messages_before=self._messages,
                    messages_after=len(ctx.view),
                    tokens_before=self._tokens,
                    tokens_after=ctx.prompt_tokens,
                    decisions=decisions,
                    actions=tuple(self.actions),
                )
            )
        self.actions = []
        self._mark()

    def skip(self) -> None:
        """Leave out of the next report what was taken since the last one (the fallback's)."""
        if len(self._ctx.taken) != self._decisions:
            self._ctx.counter.refine(self._ctx.view)
        self._mark()


def _note_unpaying(run: Run, paying: int, threshold: int) -> None:
    """Note on the run's memo whether no stale batch can pay before the next user turn."""
    memo = run.memo
    if memo.threshold != threshold:
        memo.threshold, memo.paying_turn = threshold, -1
    # Found able to pay earlier in this turn (for this threshold): it still is.
    if memo.paying_turn != run.turns:
        memo.unpaying = run.cannot_pay(paying, threshold)
        if not memo.unpaying:
            memo.paying_turn = run.turns
    if not memo.unpaying:
        memo.steady = run.steady()


def _paying(proposals: list[Proposal]) -> int:
    """What the stale ones of ``proposals`` free towards a batch worth a rewrite."""
    # The emergency pass's proposals are the budget's to force: counting them as a
    # worthwhile batch would break the cache at the emergency fraction, not at the budget.
    return sum(p.freed for p in proposals if not p.fresh and p.decision.reason != "l2")
