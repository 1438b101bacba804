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
cold anyway, over the trigger), and then aim at the budget's target ratio, so the prefix
cache breaks rarely. The task (first user message), the latest user message and the newest
complete turn are never condensed or dropped; nor is signed thinking of the in-flight tool
loop. When the budget cannot be met even so, the manager reports it.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentctx import boundaries as b
from agentctx.events import ContextCompacted
from agentctx.ledger import ReplaceArguments, ReplaceResult, ReplaceSpan, anchor
from agentctx.messages import (
    AssistantMessage,
    Message,
    SummaryMessage,
    TextBlock,
    ToolCall,
    ToolResultMessage,
    text_of,
)
from agentctx.summarizer import serialize_transcript

if TYPE_CHECKING:
    from collections.abc import Sequence

    from agentctx.strategy import CompactionContext

__all__ = ["COMPACTION_MARKER", "DeterministicCompaction", "describe_call", "truncate_text"]

COMPACTION_MARKER = "[Context compacted: earlier messages were removed to fit the context window]"
_ID_KEYS = ("path", "file_path", "file", "filename", "command", "cmd", "pattern", "query", "url")


def truncate_text(text: str, max_lines: int, max_chars: int, note: str = "") -> str:
    """Head and tail of ``text`` within ``max_lines`` lines and ``max_chars`` characters.

    The marker line says how much was cut and is counted in both limits, so applying the
    function to its own output returns it unchanged. ``note`` (e.g. a recall hint) is added
    to the marker.
    """
    lines = text.split("\n")
    suffix = f"; {note}" if note else ""
    if len(lines) > max_lines and max_lines >= 3:
        keep = max_lines - 1
        head, tail = (keep + 1) // 2, keep // 2
        cut = lines[head : len(lines) - tail]
        marker = (
            f"[... {len(cut)} lines ({sum(map(len, cut)) + len(cut)} chars) truncated{suffix} ...]"
        )
        lines = lines[:head] + [marker] + (lines[len(lines) - tail :] if tail else [])
        text = "\n".join(lines)
    if len(text) > max_chars:
        marker_room = 80 + len(suffix)
        keep = max(0, max_chars - marker_room)
        head, tail = (keep + 1) // 2, keep // 2
        removed = len(text) - head - tail
        marker = f"\n[... {removed} chars truncated{suffix} ...]\n"
        text = text[:head] + marker + (text[len(text) - tail :] if tail else "")
    return text


def describe_call(call: ToolCall, width: int = 200) -> str:
    """``name(key=value)`` with the argument that identifies what the call touched."""
    args = call.arguments
    for key in _ID_KEYS:
        value = args.get(key)
        if isinstance(value, str) and value:
            return f"{call.name}({key}={_clip(value, width)})"
    for key, value in args.items():
        if isinstance(value, str) and value:
            return f"{call.name}({key}={_clip(value, width)})"
    return f"{call.name}()"


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


_MIN_DROP_GAIN = 64  # tokens; below this a drop only churns the marker and the cache
_TRAIL_HEADER = "Files and commands touched in that part:"
_TRAIL_LIMIT = 4000


def _is_marker(m: Message) -> bool:
    return isinstance(m, SummaryMessage) and m.text.startswith(COMPACTION_MARKER)


def _is_paid_summary(m: Message) -> bool:
    """A summary that is not this strategy's own marker (a briefing someone paid for)."""
    return isinstance(m, SummaryMessage) and not _is_marker(m)


def _marker_with_trail(dropped: Sequence[Message], rid: str | None = None) -> SummaryMessage:
    """The constant marker, then what the dropped span touched, so the artifact trail stays.

    Its bytes are fixed when the decision is taken, like every replacement; an earlier marker
    or condensed turn inside the span passes its own trail on. ``rid`` is the recall id of the
    dropped text; an earlier marker inside the span passes its ids on too, so every dropped
    part stays one recall call away.
    """
    ids = [i for m in dropped if _is_marker(m) for i in _marker_ids(m)]
    if rid is not None:
        ids.append(rid)
    head = COMPACTION_MARKER
    if ids:
        head += " (" + ", ".join(f"recall_context id={i}" for i in dict.fromkeys(ids)) + ")"
    lines = [f"- {item}" for item in _fit_trail(_trail_items(dropped))]
    if not lines:
        return SummaryMessage(head)
    return SummaryMessage("\n".join([head, _TRAIL_HEADER, *lines]))


def _marker_ids(marker: Message) -> list[str]:
    assert isinstance(marker, SummaryMessage)
    return _RECALL_ID.findall(marker.text.split("\n", 1)[0])


def _span_text(
    view: Sequence[Message], origins: Sequence[int], raw: Sequence[Message], start: int, end: int
) -> str:
    """What a recall of the condensed or dropped view part ``[start, end)`` returns: the raw
    messages it stands for, in full, as plain text, so one call finds any of them (an earlier
    marker in the part is left out: the new marker passes its recall ids on)."""
    originals: list[Message] = []
    for j in range(start, end):
        if not _is_marker(view[j]):
            stop = origins[j + 1] if j + 1 < len(origins) else len(raw)
            originals += raw[origins[j] : stop]
    return serialize_transcript(
        originals, block_chars=sys.maxsize, argument_chars=sys.maxsize, total_chars=sys.maxsize
    )


_CONDENSED = "[Earlier turn, condensed]"
_RECALL_ID = re.compile(r"ctx-[0-9a-f]{16}")
_ID_STAND_IN = "ctx-" + "0" * 16  # as long as a real recall id, for sizing a replacement
_RECALL_NOTE = re.compile(
    r"\(recall_context id=ctx-[0-9a-f]{16}(?:, recall_context id=ctx-[0-9a-f]{16})*\) ?"
)
_FAILED_SUFFIX = re.compile(r" (\d+) call\(s\) failed\.$")
_PATH_KEYS = frozenset({"path", "file_path", "file", "filename"})
_ITEM = re.compile(r"([\w.-]+(?:\+[\w.-]+)*)\((\w+)=(.*)\)", re.S)
_ITEM_SEPARATOR = re.compile(r", (?=[\w.-]+(?:\+[\w.-]+)*\()")
_PATH_TOKEN = re.compile(r"(?:[\w.-]+/)+[\w.-]+\.\w{1,5}")
_MORE = re.compile(r"\.\.\. and \d+ more|\+\d+ more")


def _call_items(call: ToolCall) -> list[str]:
    """``name(key=value)`` of a call, and ``name(path=p)`` for each file its command names
    beyond where that description is clipped."""
    described = describe_call(call, width=200)
    items = [described]
    for key, value in call.arguments.items():
        if key in ("command", "cmd") and isinstance(value, str):
            first = value.split("\n", 1)[0]
            items += [
                f"{call.name}(path={p})"
                for p in dict.fromkeys(_PATH_TOKEN.findall(first))
                if p not in described
            ]
    return items


def _split_condensed(text: str) -> tuple[str, list[str], int]:
    """Text, trail items and failed-call count of a tier-2 one-liner (``("", [], 0)`` if
    ``text`` is not one), so condensing or dropping it again keeps all three."""
    if not text.startswith(_CONDENSED):
        return "", [], 0
    body = text.removeprefix(_CONDENSED).strip()
    note = _RECALL_NOTE.match(body)
    if note:
        body = body[note.end() :]
    failed = _FAILED_SUFFIX.search(body)
    errors = int(failed.group(1)) if failed else 0
    if failed:
        body = body[: failed.start()]
    body, _, listed = body.partition(" Tools: ") if " Tools: " in body else (body, "", "")
    if body.startswith("Tools: "):
        body, listed = "", body.removeprefix("Tools: ")
    items = [
        item
        for item in _ITEM_SEPARATOR.split(listed.removesuffix("."))
        if item and not _MORE.fullmatch(item)
    ]
    return body.strip(), items, errors


def _condensed_tools(text: str) -> list[str]:
    """The trail items of a tier-2 one-liner."""
    return _split_condensed(text)[1]


def _trail_items(messages: Sequence[Message]) -> list[str]:
    """What ``messages`` touched, oldest first, including trails that compaction left."""
    items: list[str] = []
    for m in messages:
        if _is_marker(m):
            assert isinstance(m, SummaryMessage)
            for line in m.text.split("\n")[2:]:
                item = line.removeprefix("- ")
                if not _MORE.match(item):
                    items.append(item)
        elif isinstance(m, AssistantMessage):
            for call in m.tool_calls:
                items += _call_items(call)
            items += _condensed_tools(text_of(m.content))
    return items


def _fit_trail(items: Sequence[str], limit: int = _TRAIL_LIMIT) -> list[str]:
    """Distinct trail items within about ``limit`` characters.

    Files come first, one line each with the tools that touched them merged
    (``read+edit(path=...)``), since they are the artifact trail; then commands and the
    rest, oldest first, in what the files leave of ``limit`` (at least a quarter of it). A
    file that only commands name is listed when one of those commands is not shown. What
    does not fit is counted.
    """
    files: dict[str, list[str]] = {}  # path -> tools that named it as a path argument
    named: dict[str, list[str]] = {}  # path -> items (commands, ...) whose text names it
    others: list[str] = []
    for item in dict.fromkeys(items):
        m = _ITEM.fullmatch(item)
        if m and m.group(2) in _PATH_KEYS:
            names = files.setdefault(m.group(3), [])
            names += [n for n in m.group(1).split("+") if n not in names]
            continue
        others.append(item)
        for path in _PATH_TOKEN.findall(item):
            files.setdefault(path, [])
            named.setdefault(path, []).append(item)
    room = max(limit // 4, limit - sum(len(p) + 12 for p, n in files.items() if n))
    shown: list[str] = []
    for item in others:
        if len(item) + 3 > room:
            break
        shown.append(item)
        room -= len(item) + 3
    visible = set(shown)
    lines: list[str] = []
    size = 0
    omitted = len(others) - len(shown)
    for path, names in files.items():
        hidden = [i for i in named.get(path, ()) if i not in visible]
        if not names and not hidden:
            continue  # only commands that are shown name it
        names = names + [
            n for n in dict.fromkeys(i.split("(", 1)[0] for i in hidden) if n not in names
        ]
        line = f"{'+'.join(names)}(path={path})"
        if size + len(line) > limit:
            omitted += 1
            continue
        lines.append(line)
        size += len(line) + 3
    lines += shown
    if omitted:
        lines.append(f"... and {omitted} more")
    return lines


def _slack(target: int) -> int:
    """How far from the target a compaction may land: a tenth of it."""
    return max(_MIN_DROP_GAIN, target // 10)


def _tokens(ctx: CompactionContext) -> int:
    """The prompt size after the decisions taken so far (the view renders first)."""
    _ = ctx.origins
    return ctx.prompt_tokens


def _result_text(m: ToolResultMessage) -> str:
    return text_of(m.content)


@dataclass(frozen=True, slots=True, kw_only=True)
class DeterministicCompaction:
    """Truncate, condense, drop; aimed at the budget's target ratio.

    Attributes:
        max_lines: tool output longer than this is cut to head and tail (tier 1).
        max_chars: ... and so is output longer than this many characters.
        max_argument_chars: string arguments of completed calls longer than this are cut.
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

    async def compact(self, ctx: CompactionContext) -> None:
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
        due = tokens > budget.limit or (
            (cold or ctx.breaking_cache) and tokens > budget.trigger_tokens
        )
        if due and ctx.counter.refine(ctx.view):
            # New messages carry a quick, high estimate until now: decide on the full one.
            tokens = ctx.prompt_tokens
            due = tokens > budget.limit or (
                (cold or ctx.breaking_cache) and tokens > budget.trigger_tokens
            )
        if not due:
            return
        before_messages = len(ctx.view)
        actions: list[str] = []
        target = budget.target_tokens
        # Repeat to a fixed point, so calling again with the same history takes nothing new.
        while True:
            taken = len(ctx.taken)
            ctx.counter.refine(ctx.view)  # replacements start with quick estimates
            self._truncate(ctx, actions, in_flight=False)
            if _tokens(ctx) > target:
                self._condense(ctx, actions, target, precise=True)
            if _tokens(ctx) > target:
                self._drop_middle(ctx, actions, target)
            if _tokens(ctx) > target + _slack(target):  # what the drop tier cannot cut
                self._condense(ctx, actions, target, precise=False)
            if _tokens(ctx) > budget.limit:
                self._truncate(ctx, actions, in_flight=True)
            ctx.counter.refine(ctx.view)  # judge the round on full estimates
            if len(ctx.taken) == taken or ctx.prompt_tokens <= target:
                break
        if actions:
            ctx.emit(
                ContextCompacted(
                    method="deterministic",
                    strategy=type(self).__name__,
                    messages_before=before_messages,
                    messages_after=len(ctx.view),
                    tokens_before=tokens,
                    tokens_after=ctx.prompt_tokens,
                    decisions=len(ctx.taken),
                    actions=tuple(actions),
                )
            )

    # -- tier 1 -------------------------------------------------------------------------

    def _truncate(self, ctx: CompactionContext, actions: list[str], *, in_flight: bool) -> None:
        view, origins, raw = ctx.view, ctx.origins, ctx.raw
        loop_start = b.in_flight_start(view)
        lo, hi = (loop_start, len(view)) if in_flight else (0, loop_start)
        names = {
            c.id: c.name for m in view if isinstance(m, AssistantMessage) for c in m.tool_calls
        }
        pending: list[Any] = []
        for j in range(lo, hi):
            m, i = view[j], origins[j]
            if raw[i] is not m or ctx.ledger.span_covering(i):
                continue
            if isinstance(m, ToolResultMessage):
                name = m.tool_name or names.get(m.tool_call_id, "tool")
                if name in self.exempt_tools or len(m.content) != 1:
                    continue
                text = _result_text(m)
                if text.count("\n") < self.max_lines and len(text) <= self.max_chars:
                    continue
                note = self._recall_note(ctx, text)
                short = truncate_text(text, self.max_lines, self.max_chars, note)
                if len(short) >= len(text):
                    continue
                rid = note.removeprefix("recall_context id=") or None
                pending.append(ReplaceResult(anchor(raw, i), (TextBlock(short),), "truncate", rid))
                actions.append(f"truncated {name} result {len(text)}->{len(short)} chars")
            elif isinstance(m, AssistantMessage) and not in_flight:
                for call in m.tool_calls:
                    new_args, cut = self._shrink_arguments(ctx, call)
                    if cut:
                        rid = self._recall_id(
                            ctx, json.dumps(dict(call.arguments), ensure_ascii=False)
                        )
                        pending.append(
                            ReplaceArguments(anchor(raw, i), call.id, new_args, "truncate", rid)
                        )
                        actions.append(f"truncated arguments of {describe_call(call)}")
        for decision in pending:
            ctx.take(decision)

    def _shrink_arguments(
        self, ctx: CompactionContext, call: ToolCall
    ) -> tuple[dict[str, Any], bool]:
        limit = self.max_argument_chars
        out: dict[str, Any] = {}
        cut = False
        for key, value in call.arguments.items():
            if isinstance(value, str) and len(value) > limit:
                out[key] = truncate_text(value, max(3, limit // 80), limit)
                cut = True
            else:
                out[key] = value
        return out, cut

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
        tail = min(self._recent_start(view), b.in_flight_start(view) - 1)
        protected = b.newest_complete_turn(view)
        starts = b.turn_starts(view)
        count = ctx.counter.count
        need = ctx.prompt_tokens - target
        # Oldest turns first, and where one turn would overshoot the target, the smallest turn
        # that is enough instead, so the prompt lands near the target on every compaction
        # (the next one is then as far away as the target puts it). When ``precise``, an
        # overshoot of more than a tenth of the target is left to the drop tier, which cuts
        # finer; this tier runs again without ``precise`` for what that tier cannot cut.
        slack = _slack(target)
        eligible: list[tuple[int, int, AssistantMessage, int]] = []  # start, end, line, gain
        available = 0
        for k, s in enumerate(starts):
            e = starts[k + 1] if k + 1 < len(starts) else len(view)
            if e > tail or (precise and available >= need + slack):
                break
            part = view[s + 1 : e]
            if not part or (s, e) == protected or any(map(_is_paid_summary, part)):
                continue
            if len(part) == 1 and ctx.ledger.span_covering(origins[s + 1]):
                continue
            size = sum(map(count, part))
            if size <= _MIN_DROP_GAIN:
                continue
            # Sized with a stand-in id; the real one is made only for the turns condensed.
            line = self._one_line(part, _ID_STAND_IN if ctx.recall is not None else None)
            replacement = AssistantMessage((TextBlock(line),), "stop")
            gain = size - ctx.counter.count_full(replacement)
            if gain > 0:
                eligible.append((s + 1, e, replacement, gain))
                available += gain
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
                rid = ctx.recall.put(ctx.session_id, _span_text(view, origins, raw, s, e))
                line = text_of(replacement.content).replace(_ID_STAND_IN, rid, 1)
                replacement = AssistantMessage((TextBlock(line),), "stop")
            ctx.take(ReplaceSpan(anchor(raw, a), z, anchor(raw, z - 1), (replacement,), "condense"))
        if pending:
            actions.append(f"condensed {len(pending)} old turns to one line each")

    @staticmethod
    def _one_line(part: Sequence[Message], rid: str | None = None) -> str:
        texts: list[str] = []
        errors = 0
        for m in part:
            if isinstance(m, AssistantMessage):
                t = text_of(m.content).strip()
                earlier, _, failed = _split_condensed(t)
                if t.startswith(_CONDENSED):
                    t, errors = earlier, errors + failed  # condensed again: keep its trail
                if t:
                    texts.append(t)
            elif isinstance(m, ToolResultMessage) and m.is_error:
                errors += 1
        items = _trail_items(part)
        line = _CONDENSED
        # A marker the turn absorbed is left out of the turn's recall entry: its ids go on.
        ids = [i for m in part if _is_marker(m) for i in _marker_ids(m)]
        if rid is not None:
            ids.append(rid)
        if ids:
            line += " (" + ", ".join(f"recall_context id={i}" for i in dict.fromkeys(ids)) + ")"
        if texts:
            line += " " + _clip(" ".join(texts), 200)
        if items:
            line += f" Tools: {', '.join(_fit_trail(items))}."
        if errors:
            line += f" {errors} call(s) failed."
        return line

    # -- tier 3 -------------------------------------------------------------------------

    def _drop_middle(self, ctx: CompactionContext, actions: list[str], target: int) -> None:
        view, origins, raw = ctx.view, ctx.origins, ctx.raw
        task = b.task_index(view)
        latest = b.latest_user_index(view)
        if task is None:
            return
        tail = self._recent_start(view)
        complete = b.newest_complete_turn(view) or (0, 0)
        loop_start = b.in_flight_start(view)
        count = ctx.counter.count
        marker = SummaryMessage(COMPACTION_MARKER)
        marker_cost = ctx.counter.count_full(marker)
        # Segments of droppable view positions, split at protected messages.
        segments: list[list[int]] = [[]]
        for j in range(task + 1, tail):
            m = view[j]
            barrier = (
                j == latest
                or _is_paid_summary(m)
                or complete[0] <= j < complete[1]
                or (j >= loop_start and b.has_thinking(m))
            )
            if barrier:
                segments.append([])
                continue
            segments[-1].append(j)
        need = ctx.prompt_tokens - target
        if need <= 0:
            return
        best: tuple[int, int, int] | None = None  # (freed, start, end) of the smallest sufficient
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
        chosen = [best] if best is not None else [w for w in whole if w[0] > 0]
        for freed, a, e in chosen:
            if a > 0 and _is_marker(view[a - 1]):
                a -= 1  # grow the earlier marker's span instead of adding a second marker
            start, end = origins[a], (origins[e] if e < len(view) else len(raw))
            recall = ctx.recall
            trail = _marker_with_trail(view[a:e], _ID_STAND_IN if recall is not None else None)
            freed = sum(map(count, view[a:e])) - ctx.counter.count_full(trail)
            if freed < min(need, _MIN_DROP_GAIN):
                continue  # the trail would cost about what the span frees
            if recall is not None:
                rid = recall.put(ctx.session_id, _span_text(view, origins, raw, a, e))
                trail = SummaryMessage(trail.text.replace(_ID_STAND_IN, rid, 1))
            ctx.take(ReplaceSpan(anchor(raw, start), end, anchor(raw, end - 1), (trail,), "drop"))
            actions.append(f"dropped {e - a} messages ({freed} tokens) behind the marker")
