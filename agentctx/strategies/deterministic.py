"""`DeterministicCompaction`: three cheap, lossy-in-order tiers that need no model.

1. **Truncate** long tool output and long string arguments of completed tool calls to head
   and tail. The marker counts against the line budget, so truncating again is a no-op.
2. **Condense** old completed turns: the assistant part of a turn becomes one line naming
   what it did (its text, the files it touched and the commands it ran). Oldest first; where
   one more turn would overshoot the target by over a tenth of it, the smallest turn that is
   enough, or else the drop tier, so every compaction lands near the target.
3. **Drop** the smallest middle span that reaches the target, behind one constant marker that
   lists the files and commands of what it replaced.

The artifact trail survives every tier: a condensed turn or a marker lists each file once,
with the tools that touched it (``read+edit(path=...)``), including files named in shell
commands, before the commands themselves; condensing or dropping them again carries their
lists on, so early file paths stay visible however often a stretch is compacted.

Tiers run only when the prompt is over the hard budget (or, when the provider cache has gone
cold anyway, over three times the target, or the trigger where that is not under the limit:
the rewrite then costs no extra cache write), and then aim at the budget's target ratio, so
the prefix cache breaks rarely. The task (first user message), the latest user message and
the newest complete turn are never condensed or dropped; nor is signed thinking of the
in-flight tool loop. Where what they keep before the running loop (the newest complete
turn's steps, the recent steps) holds a landing above the target, in a call that rewrites
the cached prefix anyway, their tool output and long arguments are cut shorter, as far as
the target needs and down to a few lines. Images in tool results, which recall cannot hold,
are left as they are by tier 1 and give way last, oldest first, only when the prompt is
over the hard budget otherwise. When the budget cannot be met even so, the manager reports
it.
"""

from __future__ import annotations

import functools
import json
from bisect import bisect_left
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from agentctx import boundaries as b
from agentctx._check import got, number, whole
from agentctx.errors import ConfigError
from agentctx.events import ContextCompacted
from agentctx.ledger import (
    ReplaceArguments,
    ReplaceResult,
    ReplaceSpan,
    anchor,
    protected_positions,
    render_message,
)
from agentctx.messages import (
    AssistantMessage,
    ImageBlock,
    Message,
    SummaryMessage,
    TextBlock,
    ToolCall,
    ToolResultContent,
    ToolResultMessage,
    UserMessage,
    finite_arguments,
    text_fields,
    text_of,
    with_text,
    written_arguments,
)
from agentctx.strategies.trail import (
    COMPACTION_MARKER,
    ID_STAND_IN,
    condensed_line,
    describe_call,
    describe_images,
    is_marker,
    is_paid_summary,
    marker_with_trail,
    put_entry,
    span_text,
    truncate_parts,
    truncate_text,
)
from agentctx.strategies.undecided import alone, undecided
from agentctx.strategy import Quiet
from agentctx.tokens.estimate import compact_json, image_tokens

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence, Set

    from agentctx.strategy import CompactionContext

__all__ = ["COMPACTION_MARKER", "DeterministicCompaction", "describe_call", "truncate_text"]

_MIN_DROP_GAIN = 64  # tokens; below this a drop only churns the marker and the cache
_FLOOR_LINES, _FLOOR_CHARS = 8, 600  # the shortest tool output giving way leaves
_GIVE_WAY_ROUNDS = 12
# No token is shorter than a UTF-8 byte, so a quick count (bytes / 3, JSON / 3.5) is at most
# this far below the full one: messages under a size by it are, without estimating in full.
_FULL_OVER_QUICK = 3.5
_COLD_FACTOR = 3  # with a cold cache, compact once the prompt is this many targets


def _hard_limit(ctx: CompactionContext) -> int:
    """The call's hard budget (`CompactionContext.hard_limit`)."""
    return ctx.budget.limit if ctx.hard_limit is None else ctx.hard_limit


def warm_and_sent(ctx: CompactionContext, cold: bool) -> bool:
    """Whether rewriting what was sent would cost a cache write in this call: something was
    sent, the cache is known to be warm (a call's idle time says so: the tiers run for
    another strategy see none), and no decision of the call rewrote it yet."""
    return bool(ctx.sent) and ctx.idle_seconds is not None and not cold and not ctx.breaking_cache


def _newest_step(view: Sequence[Message]) -> tuple[int, int]:
    """View positions ``[start, end)`` of the newest step's results (user text sent after
    them, in their turn, aside); ``start == end`` when the view does not end in results."""
    end = len(view)
    while end > 0 and isinstance(view[end - 1], UserMessage):
        end -= 1  # steering text sent after the results, in their turn
    start = end
    while start > 0 and isinstance(view[start - 1], ToolResultMessage):
        start -= 1
    return start, end


def _ceiling(ctx: CompactionContext) -> int:
    """Where a landing is too high to keep the comforts: the trigger, unless the strategy
    running these tiers says otherwise (`CompactionContext.give_way_above`)."""
    above = ctx.give_way_above
    return ctx.budget.trigger_tokens if above is None else above


def _smallest_span(
    view: Sequence[Message],
    segments: list[list[int]],
    need: int,
    count: Callable[[Message], int],
    marker_cost: int,
) -> tuple[tuple[int, int, int] | None, list[tuple[int, int, int]]]:
    """The smallest span of a segment that frees ``need`` behind a marker, as (freed, start,
    end), or ``None``; and each segment whole, for when none does. Spans start at a message
    that is not a tool result and end before one."""
    best: tuple[int, int, int] | None = None
    whole: list[tuple[int, int, int]] = []
    for seg in segments:
        if not seg:
            continue
        cuts = [j for j in seg if not isinstance(view[j], ToolResultMessage)]
        end_limit = seg[-1] + 1
        if not cuts:
            continue
        prefix = [0]
        for j in range(seg[0], end_limit):
            prefix.append(prefix[-1] + count(view[j]))
        base = seg[0]
        ends = [c for c in cuts if c > cuts[0]] + [end_limit]
        if end_limit < len(view) and isinstance(view[end_limit], ToolResultMessage):
            ends = ends[:-1]
        if not ends:
            continue
        whole.append(
            (prefix[ends[-1] - base] - prefix[cuts[0] - base] - marker_cost, cuts[0], ends[-1])
        )
        e_idx = 0
        for a in cuts:
            while e_idx < len(ends) and (
                ends[e_idx] <= a
                or prefix[ends[e_idx] - base] - prefix[a - base] - marker_cost < need
            ):
                e_idx += 1
            if e_idx == len(ends):
                break
            freed = prefix[ends[e_idx] - base] - prefix[a - base] - marker_cost
            if best is None or freed < best[0]:
                best = (freed, a, ends[e_idx])
    return best, whole


def _slack(target: int) -> int:
    """How far from the target a compaction may land: a tenth of it."""
    return max(_MIN_DROP_GAIN, target // 10)


_MARKER = SummaryMessage(COMPACTION_MARKER)


@functools.lru_cache(maxsize=1024)
def _line_message(line: str) -> AssistantMessage:
    """One message per condensed line: every decision call sizes the same old turns again,
    and a counter keeps its estimate on the message object it counted."""
    return AssistantMessage((TextBlock(line),), "stop")


def _result_text(m: ToolResultMessage) -> str:
    return text_of(m.content)


def _has_text(m: ToolResultMessage) -> bool:
    return any(isinstance(b, TextBlock) for b in m.content)


def _interleaved(content: tuple[ToolResultContent, ...]) -> bool:
    """Whether another block (an image) stands between two text blocks of ``content``."""
    kinds = [isinstance(block, TextBlock) for block in content]
    if True not in kinds:
        return False
    first, last = kinds.index(True), len(kinds) - 1 - kinds[::-1].index(True)
    return not all(kinds[first : last + 1])


def _cut(
    content: tuple[ToolResultContent, ...], text: str, parts: tuple[int, str, int]
) -> tuple[ToolResultContent, ...]:
    """``content`` with ``text``, its blocks' text joined (`_result_text`), cut as
    `truncate_parts` says: in one block in the first one's place (`with_text`), unless
    another block stands between two of them (a page's caption, its screenshot, its
    accessibility tree): then each keeps its own part of the head and the tail where it
    stands, the marker where the cut starts, and a block cut whole is left out (its fields
    go to the marker's), so the text and the images keep their order."""
    head, marker, tail = parts
    if not _interleaved(content):
        return with_text(content, text[:head] + marker + text[tail:])
    out: list[ToolResultContent] = []
    marked = -1  # where the marker went in ``out``
    left: dict[str, object] = {}  # the fields of blocks cut whole
    start = 0
    for block in content:
        if not isinstance(block, TextBlock):
            out.append(block)
            continue
        end = start + len(block.text)  # the joined text puts one newline after each block
        piece = text[start : min(end, head)]
        if marked < 0 and head <= end:
            piece += marker
            marked = len(out)
        piece += text[max(start, tail) : end]
        start = end + 1
        if piece:
            out.append(TextBlock(piece, block.extra))
        else:
            left.update(block.extra)
    if left and marked >= 0:
        cut = out[marked]
        assert isinstance(cut, TextBlock)
        out[marked] = TextBlock(cut.text, text_fields((TextBlock("", left), cut)))
    return tuple(out)


def _images(content: tuple[ToolResultContent, ...]) -> int:
    return sum(isinstance(block, ImageBlock) for block in content)


def _omit_images(content: tuple[ToolResultContent, ...], k: int) -> tuple[ToolResultContent, ...]:
    """``content`` with its first ``k`` images each replaced, in its place, by a line naming
    its media type and size (`describe_images`; no recall id: recall holds text), with a
    caller's ``cache_control`` on it. Applied to its own output with ``m``, it gives what it
    gives the original with ``k + m``: the images left are the newest."""
    out: list[ToolResultContent] = []
    for block in content:
        if isinstance(block, ImageBlock) and k > 0:
            k -= 1
            # A caller's cache breakpoint on the image stays where it was.
            kept = {key: v for key, v in block.extra.items() if key == "cache_control"}
            block = TextBlock(f"[{describe_images((block,))} omitted to fit the context]", kept)
        out.append(block)
    return tuple(out)


def _deep_enough(
    ctx: CompactionContext, lines: int, chars: int, need: int, arguments: int, spare: Set[int]
) -> tuple[tuple[int, int], tuple[int, int] | None]:
    """The first of the halving limits from ``(lines, chars)`` at which cutting every tool
    result in the view but those at ``spare`` could free ``need`` tokens; and the last level
    skipped on the way, if the running loop's results must first be cut to it (see below),
    else ``None``. Never past a level that would cut an argument shorter than ``arguments``,
    the limit they were cut to so far (they are cut once, at the first level they exceed,
    and are not sized here).

    Giving way halves the limits round after round until the prompt is small enough; each
    round cuts and estimates every long result again. Sized by characters here (a result's
    tokens shrink with its text), the rounds that could not be enough are skipped. Each of
    them would have cut the running loop's results too (the older ones alone not being
    enough), so these are cut to the last one first, unless the level returned cuts no
    older result: then it cuts them further anyway.
    """
    view, origins, raw, count = ctx.view, ctx.origins, ctx.raw, ctx.counter.count
    loop_start = ctx.in_flight_start()
    # Per result: tokens and characters shown, characters and lines of the original, and
    # whether it is in the running loop.
    results: list[tuple[int, int, int, int, bool]] = []
    longest = 0  # the longest argument: levels above it cut none
    for j, shown in enumerate(view):
        if isinstance(shown, AssistantMessage):
            for call in shown.tool_calls:
                for value in _cuttable_arguments(call).values():
                    if isinstance(value, str):
                        longest = max(longest, len(value))
                    elif isinstance(value, list | dict):
                        longest = max(longest, len(compact_json(value)))
            continue
        i = origins[j]
        if not isinstance(shown, ToolResultMessage) or not 0 <= i < len(raw) or j in spare:
            continue
        original = raw[i]
        if not isinstance(original, ToolResultMessage) or not _has_text(original):
            continue
        text = _result_text(original)
        results.append(
            (
                count(shown),
                len(_result_text(shown)),
                len(text),
                text.count("\n") + 1,
                j >= loop_start,
            )
        )

    def freed(lines: int, chars: int) -> tuple[float, float]:
        """Tokens cutting to these limits frees before the running loop, and in it."""
        older = running = 0.0
        for tokens, shown_chars, length, line_count, in_loop in results:
            kept = min(length, chars, length * lines // line_count + 80)
            if kept < shown_chars:
                if in_loop:
                    running += tokens * (1 - kept / shown_chars)
                else:
                    older += tokens * (1 - kept / shown_chars)
        return older, running

    last: tuple[int, int] | None = None
    arguments = min(arguments, longest)
    while (lines > _FLOOR_LINES or chars > _FLOOR_CHARS) and chars >= arguments:
        if sum(freed(lines, chars)) >= need:
            break
        last = (lines, chars)
        lines, chars = max(_FLOOR_LINES, lines // 2), max(_FLOOR_CHARS, chars // 2)
    if last is not None and not freed(lines, chars)[0]:
        last = None  # no older result is cut to the level returned: it cuts the loop's too
    return (lines, chars), last


def _cuttable_arguments(call: ToolCall) -> Mapping[str, Any]:
    """The arguments tier 1 may cut: the parsed object or, when the model wrote no JSON
    object (a call cut off at the output limit), the string it wrote, under ``arguments``:
    it is sent back as written (`written_arguments`), so it counts, and cut, it goes back as
    that object."""
    if not call.arguments:
        written = written_arguments(call.arguments, call.extra.get("arguments"))
        if written:
            return {"arguments": written}
    return call.arguments


@dataclass(frozen=True, slots=True, kw_only=True)
class DeterministicCompaction:
    """Truncate, condense, drop; aimed at the budget's target ratio.

    Attributes:
        max_lines: tool output longer than this is cut to head and tail (tier 1).
        max_chars: ... and so is output longer than this many characters.
        max_argument_chars: arguments of completed calls longer than this are cut (a list or
            object as its JSON text).
        keep_recent_steps: the newest assistant steps never condensed or dropped.
        exempt_tools: tools whose output is never truncated (e.g. the recall tool itself).
        cold_cache_seconds: when the last call is older than this the provider cache is cold,
            so compacting above the trigger costs no extra cache write; ``None`` disables.
    """

    max_lines: int = 200
    max_chars: int = 20_000
    max_argument_chars: int = 2_000
    keep_recent_steps: int = 3
    exempt_tools: frozenset[str] = frozenset({"recall_context"})
    cold_cache_seconds: float | None = 300.0

    def __post_init__(self) -> None:
        # Head and tail need a line each besides the marker: below 3 lines are not cut.
        whole(self, "max_lines", minimum=3)
        whole(self, "max_chars", minimum=1)
        whole(self, "max_argument_chars", minimum=1)
        whole(self, "keep_recent_steps")
        tools = self.exempt_tools
        if not isinstance(tools, frozenset | set) or not all(isinstance(t, str) for t in tools):
            raise ConfigError(
                "DeterministicCompaction.exempt_tools must be a frozenset of tool names; got "
                + got(self, "exempt_tools")
            )
        number(self, "cold_cache_seconds", optional=True)

    async def compact(self, ctx: CompactionContext) -> Quiet | None:
        """Add the decisions needed to bring the prompt to the target, if it is due."""
        tokens = ctx.prompt_tokens
        budget = ctx.budget
        cold = (
            self.cold_cache_seconds is not None
            and ctx.idle_seconds is not None
            and ctx.idle_seconds > self.cold_cache_seconds
        )
        # Above the trigger, a call whose prefix is already being rewritten (cold cache, or an
        # earlier strategy in the chain broke it) goes all the way to the target: same break.
        due = self._due(ctx, tokens, cold)
        if due and ctx.counter.refine(ctx.view):
            # New messages carry a quick, high estimate until now: decide on the full one.
            tokens = ctx.prompt_tokens
            due = self._due(ctx, tokens, cold)
        if not due:
            # While the cache stays warm, only the prompt passing the budget makes it due.
            return Quiet(budget.limit, self.cold_cache_seconds)
        before_messages, before_decisions = len(ctx.view), len(ctx.taken)
        actions: list[str] = []
        target = budget.target_tokens
        slack = _slack(target)
        if self.cut_new_enough(ctx, actions, cold):
            self._report(ctx, tokens, before_messages, before_decisions, actions)
            return None
        # Repeat to a fixed point, so calling again with the same history takes nothing new.
        while True:
            taken = len(ctx.taken)
            ctx.counter.refine(ctx.view)  # replacements start with quick estimates
            self._truncate(ctx, actions, in_flight=False)
            if ctx.prompt_tokens > target:
                self._condense(ctx, actions, target, precise=True)
            # Within the slack of the target, the prompt has landed: the drop tier, which cuts
            # whole steps, would take it further below than it is above.
            if ctx.prompt_tokens > target + slack:
                self._drop_middle(ctx, actions, target)
            if ctx.prompt_tokens > target + slack:  # what the drop tier cannot cut
                self._condense(ctx, actions, target, precise=False)
            if ctx.prompt_tokens > budget.limit:
                self._truncate(ctx, actions, in_flight=True)
            ctx.counter.refine(ctx.view)  # judge the round on full estimates
            if len(ctx.taken) == taken or ctx.prompt_tokens <= target + slack:
                break
        # Under the trigger (above it, giving way takes the prompt to the target), and only
        # in a call that rewrites the cached prefix anyway.
        if target + slack < ctx.prompt_tokens <= _ceiling(ctx) and (
            cold or not ctx.sent or ctx.breaking_cache
        ):
            self._cut_kept(ctx, actions, target)
        if ctx.prompt_tokens > _ceiling(ctx):
            # Landing above the trigger, the next few new messages would force another
            # rewrite, call after call: the comforts give way down to the trigger.
            self._give_way(ctx, actions, target)
            # Over the hard budget even so: what holds it there is images no tier removed
            # (in the newest step's results, or the newest complete turn's). They go only
            # then, not being recallable, but down to the trigger: to the hard budget, each
            # new step would cross it again and rewrite the cached prefix for one image.
            ctx.counter.refine(ctx.view)
            if ctx.prompt_tokens > _hard_limit(ctx):
                self._drop_images(ctx, actions, _ceiling(ctx))
        self._report(ctx, tokens, before_messages, before_decisions, actions)
        return None

    def cut_new_enough(self, ctx: CompactionContext, actions: list[str], cold: bool) -> bool:
        """Cut the newest step's results where they hold the prompt over the budget, as
        `compact` does first; whether that was all the call needs: the prompt is back under
        the budget, and the cut touched only what was not sent, in a call that would
        otherwise rewrite the cached prefix (`warm_and_sent`). Going on to the target then
        would rewrite it on every step that brings such a result, each dropping the step
        before. ``actions`` gets what was cut."""
        taken = len(ctx.taken)
        self._cut_oversized(ctx, actions)
        if len(ctx.taken) == taken or not warm_and_sent(ctx, cold):
            return False
        ctx.counter.refine(ctx.view)
        return ctx.prompt_tokens <= ctx.budget.limit

    def cut_oversized(self, ctx: CompactionContext) -> list[str]:
        """Over the limit, cut down the newest step's results when, kept whole, they would
        hold the prompt above the trigger even with all else dropped, as `compact` does
        first: for a strategy run before this one that sizes its own work on the prompt
        (`ToolOutputPipeline`). Returns what it did, for that strategy's own event."""
        actions: list[str] = []
        if ctx.prompt_tokens > ctx.budget.limit:
            self._cut_oversized(ctx, actions)
        return actions

    def _report(
        self, ctx: CompactionContext, tokens: int, messages: int, decisions: int, actions: list[str]
    ) -> None:
        """The call's `ContextCompacted`, from the prompt, view and ledger as it found them."""
        if actions:
            ctx.emit(
                ContextCompacted(
                    method="deterministic",
                    strategy=type(self).__name__,
                    messages_before=messages,
                    messages_after=len(ctx.view),
                    tokens_before=tokens,
                    tokens_after=ctx.prompt_tokens,
                    decisions=len(ctx.taken) - decisions,
                    actions=tuple(actions),
                )
            )

    def _cut_oversized(self, ctx: CompactionContext, actions: list[str]) -> None:
        # The newest step's results, kept whole, can hold the prompt above the give-way
        # ceiling with what no tier drops (the protected messages, the step's call): then
        # they are cut in this call whatever else is done, exempt ones too. Sized with them
        # whole, the tiers would drop older, cached history for nothing. So are the results
        # of the running loop's other steps not sent yet (a caller that skipped a model
        # call's `prepare` brings two), which nothing sent would otherwise make room for.
        view = ctx.view
        newest, end = _newest_step(view)
        loop = ctx.in_flight_start()
        if newest == end or newest <= loop:
            return
        if ctx.sent:
            unsent = max(bisect_left(ctx.origins, ctx.sent), loop + 1)
            newest = next(
                (j for j in range(unsent, newest) if isinstance(view[j], ToolResultMessage)),
                newest,
            )
        ceiling = _ceiling(ctx) - ctx.counter.overhead
        kept = [view[j] for j in protected_positions(view) if j < newest - 1]
        kept += view[newest - 1 :]
        counter = ctx.counter
        if sum(map(counter.count, kept)) * _FULL_OVER_QUICK <= ceiling:
            return  # even in full
        whole = sum(map(counter.count_full, kept))
        if whole <= ceiling:
            return
        # The page the model just recalled stays whole while the prompt can meet the hard
        # budget with it (giving way cuts it last, and only as far as that needs).
        fits = whole <= _hard_limit(ctx) - counter.overhead
        spare = self._spared(ctx, newest) if fits else frozenset()
        relaxed = self._relaxed(self.max_lines, self.max_chars, self.keep_recent_steps)
        relaxed._truncate(ctx, actions, in_flight=True, start=newest, spare=spare)

    @staticmethod
    def _due(ctx: CompactionContext, tokens: int, cold: bool) -> bool:
        budget = ctx.budget
        if tokens > budget.limit:
            return True
        if ctx.breaking_cache:
            return tokens > budget.trigger_tokens
        # A cold cache writes the whole prompt again anyway: compacting now costs no extra
        # write and puts the next rewrite further away, once there is enough to free.
        if not cold:
            return False
        cold_at = budget.target_tokens * _COLD_FACTOR
        # At a target ratio that high, three targets never come under the limit.
        return tokens > (cold_at if cold_at < budget.limit else budget.trigger_tokens)

    # -- over the budget whatever the tiers did --------------------------------------

    def _give_way(self, ctx: CompactionContext, actions: list[str], target: int) -> None:
        """Still above the trigger: every protection beyond the invariants gives way.

        The invariants protect the task, the latest user message, the newest complete turn
        and signed reasoning in the running tool loop; the truncation floor, the exemption of
        recalled output and ``keep_recent_steps`` are this strategy's own comfort. First tool
        output is cut ever shorter (down to a few lines), then the recent steps may be
        condensed or dropped too, all but the newest (whose result the model just asked
        for), down to the trigger: landing just under the hard budget would have the next
        few new messages force another rewrite, call after call. The newest step's results of
        ``exempt_tools`` (the page the model just recalled) stay whole through all that, and
        are cut only as far as the prompt must to come under the budget. Only over the budget
        does the manager then say it cannot be met.
        """
        lines, chars = self.max_lines, self.max_chars
        ran_chars = chars  # the character limit of the last round run
        ceiling = _ceiling(ctx)
        recent = min(1, self.keep_recent_steps)
        # Output is cut down to the target, as every compaction aims (so the next new result
        # does not cross the budget again at once); recent steps go only as far as the
        # trigger needs. What was just recalled goes last: cut, the model would recall it
        # again, under a new id, and find it cut again the call after.
        passes = ((self.keep_recent_steps, target, True), (recent, ceiling, True))
        for k, (keep, goal, sparing) in enumerate((*passes, (recent, _hard_limit(ctx), False))):
            if k and ctx.prompt_tokens <= goal:
                return
            if not sparing:
                if not self._spared(ctx):
                    return
                lines, chars = self.max_lines, self.max_chars  # cut it no shorter than needed
            # Once tiers 2 and 3 find nothing at this protection, cutting output shorter only
            # shrinks what they could free: later rounds leave them out (the last pass has
            # the protection of the one before).
            tiers_idle = not sparing
            for _ in range(_GIVE_WAY_ROUNDS):  # halving reaches the floor well within these
                before = ctx.prompt_tokens
                if before <= goal:
                    break
                taken = len(ctx.taken)
                ctx.counter.refine(ctx.view)
                spare = self._spared(ctx) if sparing else frozenset()
                if tiers_idle:  # only cutting output is left: no need to go level by level
                    need = ctx.prompt_tokens - goal
                    cut_to = min(self.max_argument_chars, ran_chars)
                    (lines, chars), last = _deep_enough(ctx, lines, chars, need, cut_to, spare)
                    if last is not None:
                        # What the skipped levels left: each cut output again from the
                        # original, so only the running loop's (cut after the older results,
                        # none being enough) stays as the last of them left it.
                        relaxed = self._relaxed(*last, keep)
                        relaxed._truncate(ctx, actions, in_flight=True, again=True, spare=spare)
                        ctx.counter.refine(ctx.view)  # as each round ends
                relaxed = self._relaxed(lines, chars, keep)
                ran_chars = chars
                relaxed._truncate(ctx, actions, in_flight=False, again=True)
                loop_cut = ctx.prompt_tokens > goal
                if loop_cut:
                    relaxed._truncate(ctx, actions, in_flight=True, again=True, spare=spare)
                if not tiers_idle and ctx.prompt_tokens > target:
                    cut = len(ctx.taken)
                    relaxed._condense(ctx, actions, target, precise=False)
                    if ctx.prompt_tokens > target:
                        relaxed._drop_middle(ctx, actions, target)
                    tiers_idle = len(ctx.taken) == cut
                ctx.counter.refine(ctx.view)
                floor = lines <= _FLOOR_LINES and chars <= _FLOOR_CHARS
                if floor and (
                    len(ctx.taken) == taken
                    or ctx.prompt_tokens >= before
                    # Another round at the floor would cut all output as this one did.
                    or (tiers_idle and loop_cut)
                ):
                    break  # at the floor and nothing more to gain
                lines, chars = max(_FLOOR_LINES, lines // 2), max(_FLOOR_CHARS, chars // 2)

    def _cut_kept(self, ctx: CompactionContext, actions: list[str], target: int) -> None:
        """Landing above the target (under the trigger) once the tiers are done, in a call
        that rewrites the cached prefix anyway: what holds the prompt there is what they keep
        whole (the newest complete turn's steps, whose output and arguments may be cut down,
        the recent steps, and the running loop). Those are cut shorter, each with its recall
        id, as far as the target needs: landing deeper puts the next rewrite further away.
        Before the running loop first, down to the floor giving way cuts to; then in it, all
        but the newest step's results (what the model just asked for), down to a quarter of
        tier 1's limits (its arguments to the arguments' limit, as giving way cuts them). The
        output of ``exempt_tools`` stays as it is."""
        floors = ((_FLOOR_LINES, _FLOOR_CHARS), self._loop_floor())
        for in_flight, (lines, chars) in zip((False, True), floors, strict=True):
            if ctx.prompt_tokens <= target:
                return
            loop = ctx.in_flight_start()
            lo, hi = (loop, _newest_step(ctx.view)[0]) if in_flight else (0, loop)
            floor = self._relaxed(lines, chars, self.keep_recent_steps, exempt=True)
            if floor._cuts_in(ctx.view, lo, hi):  # (cheap: sizing reads every original)
                self._cut_down(ctx, actions, target, (lines, chars), in_flight=in_flight)

    def _loop_floor(self) -> tuple[int, int]:
        """How short the running loop's output is cut when a landing needs it: a quarter of
        tier 1's limits (the model read it a step or two ago), never under giving way's."""
        return max(_FLOOR_LINES, self.max_lines // 4), max(_FLOOR_CHARS, self.max_chars // 4)

    def _cut_down(
        self,
        ctx: CompactionContext,
        actions: list[str],
        target: int,
        floor: tuple[int, int],
        *,
        in_flight: bool,
    ) -> None:
        """Cut the output and arguments before the running loop, or in it (all but the newest
        step's results), by halving limits, until the prompt is at ``target`` or they are at
        ``floor`` (lines, characters)."""
        least_lines, least_chars = floor
        lines, chars = self.max_lines, self.max_chars
        while ctx.prompt_tokens > target and (lines > least_lines or chars > least_chars):
            view = ctx.view
            newest = frozenset(range(*_newest_step(view)))
            spare = newest if in_flight else frozenset(range(ctx.in_flight_start(), len(view)))
            lines, chars = max(least_lines, lines // 2), max(least_chars, chars // 2)
            (lines, chars), _ = _deep_enough(
                ctx, lines, chars, ctx.prompt_tokens - target, 0, spare
            )
            lines, chars = max(least_lines, lines), max(least_chars, chars)
            cut = self._relaxed(lines, chars, self.keep_recent_steps, exempt=True)
            cut._truncate(ctx, actions, in_flight=in_flight, again=True, spare=newest)
            ctx.counter.refine(ctx.view)

    def _cuts_in(self, view: Sequence[Message], lo: int, hi: int) -> bool:
        """Whether tier 1 at this strategy's limits would cut any of ``view[lo:hi]`` as shown:
        a result's text not of ``exempt_tools`` (named by the result, or by its call), or an
        argument."""
        names: dict[str, str] = {}
        for m in view[lo:hi]:
            if isinstance(m, AssistantMessage):
                names.update((c.id, c.name) for c in m.tool_calls)
                if self._cuttable(m):
                    return True
            elif (
                isinstance(m, ToolResultMessage)
                and self._cuttable(m)
                and (m.tool_name or names.get(m.tool_call_id)) not in self.exempt_tools
            ):
                return True
        return False

    def _drop_images(self, ctx: CompactionContext, actions: list[str], goal: int) -> None:
        """Leave out images of tool results, oldest first, each for a line naming its media
        type and size, until the prompt is at ``goal`` (the hard budget).

        The last thing to give way: an image is not recallable (recall holds text), so every
        other tier and comfort goes first, and only as many images go as the budget needs.
        Those of old turns went with their turns (condensed or dropped); what is left is in
        the results no tier drops: the newest step's, the newest complete turn's (whose
        results may be cut down, as their text is).
        """
        counter, raw, ledger = ctx.counter, ctx.raw, ctx.ledger
        j = 0
        while True:
            counter.refine(ctx.view)  # decided on full estimates
            need = ctx.prompt_tokens - goal
            if need <= 0:
                return
            view, origins = ctx.view, ctx.origins
            while j < len(view) and not (
                isinstance(view[j], ToolResultMessage)
                and any(isinstance(block, ImageBlock) for block in view[j].content)  # type: ignore[union-attr]
                and 0 <= origins[j] < len(raw)
                and type(raw[origins[j]]) is ToolResultMessage  # not a stub repair added
                and ledger.span_covering(origins[j]) is None
            ):
                j += 1
            if j == len(view):
                return
            shown, i = view[j], origins[j]
            assert isinstance(shown, ToolResultMessage)
            base = render_message(raw, ledger, i)  # as decided, before repair
            assert isinstance(base, ToolResultMessage)
            # What leaving out each image frees, as the counter (calibrated) sees it, and of
            # what a refusal laid on the media (a provider that bills small images a floor).
            share = ctx._media_share
            gains = [
                counter.count_full(replace(shown, content=(image,)))
                - counter.count_full(replace(shown, content=_omit_images((image,), 1)))
                + (round(share * image_tokens(image)) if share else 0)
                for image in base.content
                if isinstance(image, ImageBlock)
            ]
            k, freed = 0, 0
            while k < len(gains) and freed < need:
                freed += gains[k]
                k += 1
            if sum(gains) <= 0:  # images smaller than their lines (icons): none would free any
                j += 1
                continue
            ctx.take(ReplaceResult(anchor(raw, i), _omit_images(base.content, k), "give-way-image"))
            after = ctx.view[j]
            if not isinstance(after, ToolResultMessage) or _images(after.content) == len(gains):
                j += 1  # taken before and superseded: `take` left it as it was
                continue
            name = shown.tool_name or "tool"
            actions.append(f"left out {k} of {len(gains)} images of a result of {name}")

    def _spared(self, ctx: CompactionContext, start: int | None = None) -> frozenset[int]:
        """View positions of the newest step's results of ``exempt_tools`` (and of the steps
        from view position ``start`` on), which giving way leaves whole while the prompt can
        come under the budget otherwise."""
        view = ctx.view
        newest, end = _newest_step(view)
        if newest == end or not self.exempt_tools:
            return frozenset()
        start = newest if start is None else min(start, newest)
        names = {
            c.id: c.name
            for step in view[start - 1 : end]
            if isinstance(step, AssistantMessage)
            for c in step.tool_calls
        }
        spared: list[int] = []
        for j in range(start, end):
            m = view[j]
            if isinstance(m, ToolResultMessage) and (
                (m.tool_name or names.get(m.tool_call_id)) in self.exempt_tools
            ):
                spared.append(j)
        return frozenset(spared)

    def _relaxed(
        self, lines: int, chars: int, keep: int, *, exempt: bool = False
    ) -> DeterministicCompaction:
        """This strategy with the comforts that give way relaxed to these limits; with
        ``exempt``, ``exempt_tools`` still exempt."""
        return DeterministicCompaction(
            max_lines=lines,
            max_chars=chars,
            max_argument_chars=min(self.max_argument_chars, chars),
            keep_recent_steps=keep,
            exempt_tools=self.exempt_tools if exempt else frozenset(),
            cold_cache_seconds=self.cold_cache_seconds,
        )

    # -- tier 1 -------------------------------------------------------------------------

    def _truncate(
        self,
        ctx: CompactionContext,
        actions: list[str],
        *,
        in_flight: bool,
        again: bool = False,
        start: int | None = None,
        spare: Set[int] = frozenset(),
    ) -> None:
        """Cut down the results (and arguments) before the running loop, or in it (from
        view position ``start`` on, if given); the results at view positions in ``spare``
        are left as they are."""
        view, origins, raw = ctx.view, ctx.origins, ctx.raw
        loop_start = ctx.in_flight_start()
        lo, hi = (loop_start, len(view)) if in_flight else (0, loop_start)
        if start is not None:
            lo = max(lo, start)
        names: dict[str, str] | None = None
        pending: list[Any] = []
        for j in range(lo, hi):
            shown, i = view[j], origins[j]
            # Whatever the ledger says, only a raw message this tier would cut can give a
            # decision: the view scan is called several times a decision, most of it on
            # messages short enough, so that is checked before the ledger is asked. A stub
            # repair added for a missing result has nothing to cut (its origin is its call's
            # message, cut at its own place): asking would read the whole batch per stub.
            if 0 <= i < len(raw) and (
                (isinstance(shown, ToolResultMessage) and type(raw[i]) is not ToolResultMessage)
                or not self._cuttable(raw[i])
            ):
                continue
            if ctx.ledger.span_covering(i):
                continue
            # Undecided by the ledger, not by identity: repair's renamed ids and dropped blank
            # text make other objects of messages no decision touched.
            m = undecided(ctx.ledger, raw, view, origins, j)
            replaced = m is None
            if m is None:
                # Already replaced; a result or arguments are cut again, from the original,
                # when giving way (a stub repair added has none: its origin is the call's
                # message).
                m = raw[i]
                if not (again and isinstance(m, ToolResultMessage | AssistantMessage)):
                    continue
            if isinstance(m, ToolResultMessage) and isinstance(shown, ToolResultMessage):
                if names is None:
                    names = {
                        c.id: c.name
                        for v in view
                        if isinstance(v, AssistantMessage)
                        for c in v.tool_calls
                    }
                name = m.tool_name or names.get(shown.tool_call_id, "tool")
                if name in self.exempt_tools or j in spare or not _has_text(m):
                    continue
                text = _result_text(m)
                stand_in = f"recall_context id={ID_STAND_IN}" if ctx.recall is not None else ""
                # Images the view no longer shows (given way: `_drop_images`) stay left out
                # of a result cut again from its original.
                omitted = _images(m.content) - _images(shown.content) if replaced else 0
                if replaced:
                    short = truncate_text(text, self.max_lines, self.max_chars, stand_in)
                    sized = len(short)
                    if omitted or _interleaved(m.content):  # sized as it would be sent
                        parts = truncate_parts(text, self.max_lines, self.max_chars, stand_in)
                        cut = m.content if parts is None else _cut(m.content, text, parts)
                        sized = len(text_of(_omit_images(cut, omitted)))
                    if len(_result_text(shown)) <= sized:
                        continue  # what is sent now is already this short
                if not self._too_long(text):
                    continue
                note = self._recall_note(ctx, text)
                parts = truncate_parts(text, self.max_lines, self.max_chars, note)
                if parts is None:
                    continue
                short = text[: parts[0]] + parts[1] + text[parts[2] :]
                if len(short) >= len(text):
                    continue
                rid = note.removeprefix("recall_context id=") or None
                kept = _omit_images(_cut(m.content, text, parts), omitted)
                pending.append(ReplaceResult(anchor(raw, i), kept, "truncate", rid))
                actions.append(f"truncated {name} result {len(text)}->{len(short)} chars")
            elif isinstance(m, AssistantMessage) and (
                not in_flight or (again and not b.has_thinking(m))
            ):
                # Arguments in the running loop are cut only when giving way, and never in a
                # message whose signed reasoning must go back as it was.
                stand_in = f"recall_context id={ID_STAND_IN}" if ctx.recall is not None else ""
                sent = (
                    {c.id: _cuttable_arguments(c) for c in shown.tool_calls}
                    if replaced and isinstance(shown, AssistantMessage)
                    else {}
                )
                for call in alone(m.tool_calls):
                    arguments = _cuttable_arguments(call)
                    shorter, shortened = self._shrink_arguments(arguments, stand_in)
                    if not shortened:
                        continue  # none is longer than its cut would be
                    now = sent.get(call.id)
                    if now is not None and len(compact_json(now)) <= len(compact_json(shorter)):
                        continue  # what is sent now is already this short
                    whole = json.dumps(dict(arguments), ensure_ascii=False)
                    note = self._recall_note(ctx, whole)
                    rid = note.removeprefix("recall_context id=") or None
                    new_args, _ = self._shrink_arguments(arguments, note)
                    cut_args = finite_arguments(new_args)  # a model's NaN beside the cut: null
                    pending.append(
                        ReplaceArguments(anchor(raw, i), call.id, cut_args, "truncate", rid)
                    )
                    actions.append(f"truncated arguments of {describe_call(call)}")
        for decision in pending:
            ctx.take(decision)

    def _cuttable(self, m: Message) -> bool:
        """Whether ``m`` has what `_truncate` cuts: a result's text over the line or character
        limit, or a string argument over ``max_argument_chars``."""
        # Read from the blocks directly: this runs on every message of the view, and
        # ``text_of`` and ``tool_calls`` build a string and a tuple each time.
        if isinstance(m, ToolResultMessage):
            if len(m.content) == 1:  # the common case, without a list
                block = m.content[0]
                return isinstance(block, TextBlock) and self._too_long(block.text)
            return _has_text(m) and self._too_long(_result_text(m))
        if isinstance(m, AssistantMessage):
            return any(
                self._too_long_argument(v)
                for call in m.content
                if isinstance(call, ToolCall)
                for v in _cuttable_arguments(call).values()
            )
        return False

    def _too_long(self, text: str) -> bool:
        """Whether tier 1 cuts ``text``, a tool result's."""
        return len(text) > self.max_chars or text.count("\n") >= self.max_lines

    def _too_long_argument(self, value: object) -> bool:
        """Whether tier 1 cuts ``value``, an argument of a completed call: a string, or a list
        or object whose JSON is, longer than ``max_argument_chars``."""
        if isinstance(value, str):
            return len(value) > self.max_argument_chars
        return isinstance(value, list | dict) and len(compact_json(value)) > self.max_argument_chars

    def _shrink_arguments(
        self, arguments: Mapping[str, Any], note: str
    ) -> tuple[dict[str, Any], bool]:
        """``arguments`` with each that is too long cut to its head and tail (a list or an
        object as its JSON text), the marker naming ``note`` (the recall id of them all), and
        whether one was; one its cut would not make shorter (a small ``max_argument_chars``)
        stays as it is."""
        limit = self.max_argument_chars
        out: dict[str, Any] = {}
        shortened = False
        for key, value in arguments.items():
            out[key] = value
            if self._too_long_argument(value):
                text = value if isinstance(value, str) else compact_json(value)
                cut = truncate_text(text, max(3, limit // 80), limit, note)
                if len(cut) < len(text):
                    out[key], shortened = cut, True
        return out, shortened

    def _recall_note(self, ctx: CompactionContext, text: str) -> str:
        rid = self._recall_id(ctx, text)
        return f"recall_context id={rid}" if rid else ""

    @staticmethod
    def _recall_id(ctx: CompactionContext, text: str) -> str | None:
        return ctx.recall.put(ctx.session_id, text) if ctx.recall is not None else None

    # -- protected positions ------------------------------------------------------------

    def _recent_start(self, view: Sequence[Message]) -> int:
        """View index of the oldest of the ``keep_recent_steps`` newest assistant steps."""
        if self.keep_recent_steps == 0:
            return len(view)
        steps = [j for j, m in enumerate(view) if isinstance(m, AssistantMessage)]
        return steps[-self.keep_recent_steps] if len(steps) >= self.keep_recent_steps else 0

    # -- tier 2 -------------------------------------------------------------------------

    def _condense(
        self, ctx: CompactionContext, actions: list[str], target: int, *, precise: bool
    ) -> None:
        view, origins = ctx.view, ctx.origins
        tail = min(self._recent_start(view), ctx.in_flight_start() - 1)
        protected = ctx.protected_turn or (0, 0)
        starts = b.turn_starts(view)
        count = ctx.counter.count
        need = ctx.prompt_tokens - target
        # Oldest turns first, and where one turn would overshoot the target, the smallest turn
        # that is enough instead, so the prompt lands near the target on every compaction
        # (the next one is then as far away as the target puts it). When ``precise``, an
        # overshoot of more than a tenth of the target is left to the drop tier, which cuts
        # finer, and so is a need no condensing reaches: the drop tier would then hide the
        # condensed turns behind its marker in the same call (their lines, recall entries and
        # decisions made for nothing), so it cuts the turns whole instead. This tier runs
        # again without ``precise`` for what that tier cannot cut.
        slack = _slack(target)
        turns: list[tuple[int, int, int]] = []  # start, end, tokens
        for k, s in enumerate(starts):
            e = starts[k + 1] if k + 1 < len(starts) else len(view)
            if e > tail:
                break
            part = view[s + 1 : e]
            overlaps = s < protected[1] and e > protected[0]
            if not part or overlaps or any(map(is_paid_summary, part)):
                continue
            if len(part) == 1 and ctx.ledger.span_covering(origins[s + 1]):
                continue
            size = sum(map(count, part))
            if size > _MIN_DROP_GAIN:
                turns.append((s + 1, e, size))
        if precise and sum(size for *_, size in turns) < need:
            return  # even the turns' whole size is short of the need: their lines are too
        eligible: list[tuple[int, int, AssistantMessage, int]] = []  # start, end, line, gain
        available = 0
        for s, e, size in turns:
            if precise and available >= need + slack:
                break
            # Sized with a stand-in id; the real one is made only for the turns condensed.
            line = condensed_line(view[s:e], ID_STAND_IN if ctx.recall is not None else None)
            replacement = _line_message(line)
            gain = size - ctx.counter.count_full(replacement)
            if gain > 0:
                eligible.append((s, e, replacement, gain))
                available += gain
        if precise and available < need:
            return
        pending: list[tuple[int, int, AssistantMessage]] = []
        freed = 0
        for k, (s, e, replacement, gain) in enumerate(eligible):
            rest = need - freed
            if rest <= 0:
                break
            if gain - rest > slack:
                best = min((x for x in eligible[k:] if x[3] >= rest), key=lambda x: x[3])
                if not precise or best[3] - rest <= slack:
                    pending.append(best[:3])
                break
            pending.append((s, e, replacement))
            freed += gain
        raw = ctx.raw
        for s, e, replacement in pending:
            a, z = origins[s], (origins[e] if e < len(view) else len(raw))
            if ctx.recall is not None:
                rid = put_entry(
                    ctx.recall, ctx.session_id, span_text(view, origins, raw, s, e, ctx.ledger)
                )
                line = text_of(replacement.content).replace(ID_STAND_IN, rid, 1)
                replacement = AssistantMessage((TextBlock(line),), "stop")
            ctx.take(ReplaceSpan(anchor(raw, a), z, anchor(raw, z - 1), (replacement,), "condense"))
        if pending:
            actions.append(f"condensed {len(pending)} old turns to one line each")

    # -- tier 3 -------------------------------------------------------------------------

    def _drop_middle(self, ctx: CompactionContext, actions: list[str], target: int) -> None:
        view, origins, raw = ctx.view, ctx.origins, ctx.raw
        task = b.task_index(view)
        latest = b.latest_user_index(view)
        if task is None:
            return
        tail = self._recent_start(view)
        complete = ctx.protected_turn or (0, 0)
        loop_start = ctx.in_flight_start()
        count = ctx.counter.count
        marker_cost = ctx.counter.count_full(_MARKER)
        need = ctx.prompt_tokens - target
        if need <= 0:
            return

        def segments(spare: Set[int]) -> list[list[int]]:
            """Droppable view positions, split at protected messages and at ``spare``
            origins."""
            out: list[list[int]] = [[]]
            for j in range(task + 1, tail):
                m = view[j]
                if (
                    j == latest
                    or is_paid_summary(m)
                    or complete[0] <= j < complete[1]
                    or (j >= loop_start and b.has_thinking(m))
                    or origins[j] in spare
                ):
                    out.append([])
                else:
                    out[-1].append(j)
            return out

        # A turn condensed in this call stays in the view it returns where a span without it
        # will do: hidden now, its line, recall entry and decision were made for nothing.
        condensed = {
            d.at.index for d in ctx.taken if isinstance(d, ReplaceSpan) and d.reason == "condense"
        }
        best, whole = _smallest_span(view, segments(condensed), need, count, marker_cost)
        if best is None and condensed:
            best, whole = _smallest_span(view, segments(frozenset()), need, count, marker_cost)
        chosen = [best] if best is not None else [w for w in whole if w[0] > 0]
        for freed, a, e in chosen:
            if a > 0 and is_marker(view[a - 1]):
                a -= 1  # grow the earlier marker's span instead of adding a second marker
            if all(map(is_marker, view[a:e])):
                continue  # a marker dropped again passes its whole trail on: nothing is freed
            span_tokens = sum(map(count, view[a:e]))
            if span_tokens - marker_cost < min(need, _MIN_DROP_GAIN):
                continue  # even a bare marker would cost about what the span frees
            start, end = origins[a], (origins[e] if e < len(view) else len(raw))
            # The real recall id before sizing: the message sized is the one taken, so its
            # estimate (a trail runs to a few KB) is made once. An id not taken is not written.
            recall = ctx.recall
            rid = None
            if recall is not None:
                text = span_text(view, origins, raw, a, e, ctx.ledger)
                rid = put_entry(recall, ctx.session_id, text)
            trail = marker_with_trail(view[a:e], rid)
            freed = span_tokens - ctx.counter.count_full(trail)
            if freed < min(need, _MIN_DROP_GAIN):
                continue  # the trail would cost about what the span frees
            ctx.take(ReplaceSpan(anchor(raw, start), end, anchor(raw, end - 1), (trail,), "drop"))
            actions.append(f"dropped {e - a} messages ({freed} tokens) behind the marker")
