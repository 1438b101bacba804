"""One `ToolOutputPipeline` run over one view: what each pass proposes, and taking them.

Internal to `agentctx.strategies.pipeline`, which holds the passes' settings and decides which
proposals a call takes.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentctx import boundaries as b
from agentctx.ledger import DropThinking, ReplaceArguments, ReplaceResult, ReplaceSpan, anchor
from agentctx.messages import (
    AssistantMessage,
    ImageBlock,
    OpaqueBlock,
    SummaryMessage,
    TextBlock,
    ToolResultMessage,
    UserMessage,
    finite_arguments,
    is_instruction,
    sent_at,
    text_of,
    with_text,
)
from agentctx.recall.store import escape_literal, recall_id
from agentctx.strategies.trail import ID_STAND_IN, describe_call, put_entry
from agentctx.strategies.undecided import raw_calls, undecided
from agentctx.tokens.estimate import Estimator, default_estimator

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from agentctx.ledger import Decision
    from agentctx.messages import Block, Message, ToolCall
    from agentctx.strategies.pipeline import (
        BudgetPass,
        CondensePass,
        EmergencyPass,
        ExpiryPass,
        MicroCompact,
        ToolOutputPipeline,
    )
    from agentctx.strategy import CompactionContext

__all__ = ["Memo", "Proposal", "Run", "condense"]

_COMMAND_KEYS = frozenset({"command", "cmd"})
# An import or definition line: ``^\s*(import|export)\s`` or ``\b(function|...)\s+\w`` in
# the line. The text is searched at once for the keywords (each alternative starts with a
# literal, so the regex engine skips to their first letters); where the line starts and the
# word boundary are checked on each keyword found. [^\S\n] is \s within a line.
_KEYWORD = re.compile(
    r"import[^\S\n]|export[^\S\n]|function[^\S\n]+\w|class[^\S\n]+\w|interface[^\S\n]+\w"
    r"|type[^\S\n]+\w|const[^\S\n]+\w|let[^\S\n]+\w|var[^\S\n]+\w|def[^\S\n]+\w"
)
_INDENT = re.compile(r"[^\S\n]*")
_WORD = re.compile(r"\w")


def _defines(text: str, at: int, line_start: int, indent_end: int) -> bool:
    """Whether the keyword `_KEYWORD` found at ``at`` makes its line (from ``line_start``,
    indented up to ``indent_end``) an import or definition line."""
    if text.startswith(("import", "export"), at):
        return at == indent_end
    return at == line_start or _WORD.match(text, at - 1) is None


def condense(text: str, head: int, tail: int, max_ratio: float) -> str:
    """Head, tail and the import/definition lines between, or a clipped prefix as fallback."""
    lines = text.split("\n")
    n = len(lines)
    limit = max_ratio * len(text)
    if n > head + tail:
        out = lines[:head]
        kept = lines[n - tail :]
        head_chars, tail_chars = sum(map(len, out)), sum(map(len, kept))
        # The joined length so far: the parts and a newline between each two.
        size = head_chars + tail_chars + head + tail - 1
        # One search of the middle lines for the keywords, not a search per line: condensing
        # a long result is what a call that first sees it outside the protected turns spends
        # most of its time on.
        pos = head_chars + head  # the start of line ``line``
        end = len(text) - tail_chars - tail if tail else len(text)
        line = done = head  # lines before ``done`` are in ``out`` or counted as omitted
        # Newlines before ``counted`` are in ``line``, and ``indent`` is where line ``line``'s
        # indentation ends: keywords on one long line (``xdef`` after ``xdef``) are counted
        # from the last one, not from the line's start, or they cost the line's length each.
        scan = counted = indent = pos
        while size <= limit:
            m = _KEYWORD.search(text, scan, end)
            if m is None:
                break
            at = m.start()
            if newlines := text.count("\n", counted, at):
                line += newlines
                pos = indent = text.rfind("\n", counted, at) + 1
            counted = at
            if indent == pos and (lead := _INDENT.match(text, pos, end)) is not None:
                indent = lead.end()
            if not _defines(text, at, pos, indent):
                scan = at + 1  # keywords may overlap (``xdef class A``)
                continue
            if line > done:
                marker = f"[... {line - done} lines omitted]"
                out.append(marker)
                size += len(marker) + 1
            out.append(lines[line])
            size += len(lines[line]) + 1
            done = line + 1
            nl = text.find("\n", at, end)
            if nl < 0:
                break  # that was the last middle line
            pos = scan = counted = indent = nl + 1
            line += 1
        if size <= limit:
            if n - tail > done:
                marker = f"[... {n - tail - done} lines omitted]"
                out.append(marker)
                size += len(marker) + 1
            out.extend(kept)
            condensed = "\n".join(out)
            if len(condensed) <= limit:
                return condensed
    return text[: int(limit)] + "\n[... truncated for space]"


@dataclass(slots=True)
class Proposal:
    """A decision a pass would take, with what it frees and whether it touches only unsent
    messages."""

    decision: Decision
    freed: int
    fresh: bool
    action: str
    unit: int = -1  # raw index of the message it belongs with (a call's arguments: its result)
    rid: str | None = None  # the recall id of what it replaces, stored when it is taken

    def __post_init__(self) -> None:
        if self.unit < 0:
            self.unit = self.decision.at.index


class _Scan:
    """What a view's messages say about its structure, kept while they stay the same."""

    __slots__ = (
        "boundary",
        "calls",
        "latest_user",
        "messages",
        "results",
        "shaped",
        "shell",
        "shell_full_upto",
        "sizes",
        "stamps",
        "full_upto",
        "task",
        "turn_chars",
        "turn_of",
        "turn_results",
        "turns",
    )

    def __init__(self) -> None:
        self.messages: list[Message] = []  # the view scanned so far
        self.calls: dict[str, tuple[int, ToolCall]] = {}  # call id: view index, call
        self.turn_of: list[int] = []  # per view message: the user turns up to it
        self.turns = 0
        # View indices of the task and the latest user message, as the invariants read them
        # (`b.task_index`, `b.latest_user_index`): a system or developer message in the
        # history is neither, nor a user turn, unless no user message came before it.
        self.task: int | None = None
        self.latest_user: int | None = None
        self.boundary = -1  # the last summary's view index
        self.results: list[int] = []  # view indices of the results the passes may touch
        self.sizes: dict[int, int] = {}  # per result: the characters of its text
        self.turn_results: dict[int, list[int]] = {}  # per user turn: its results, in order
        self.turn_chars: dict[int, int] = {}  # per user turn: the characters of its results
        self.stamps: list[float | None] = []  # per view message: its timestamp, in seconds
        self.shaped: list[int] = []  # of user shell output and of steps with thinking (L0)
        self.shell: list[int] = []  # of user shell output alone
        self.full_upto = 0  # results[:full_upto] (outside the newest turn) estimated in full
        self.shell_full_upto = 0  # the same for shell

    def read(self, cfg: ToolOutputPipeline, ctx: CompactionContext, n: int) -> None:
        """Read ``ctx.view[n:]``, the messages appended to the view scanned so far (which
        ``messages`` already holds)."""
        view = ctx.view
        for j in range(n, len(view)):
            m = view[j]
            if isinstance(m, AssistantMessage):
                for c in m.tool_calls:
                    self.calls[c.id] = (j, c)
                if b.has_thinking(m):
                    self.shaped.append(j)
            elif isinstance(m, UserMessage):
                latest = self.latest_user
                spoken_before = latest is not None and not is_instruction(view[latest])
                if b.opens_turn(m, spoken_before):  # the latest user message, as turns go
                    self.turns += 1
                    self.latest_user = j
                if self.task is None or (not spoken_before and not is_instruction(m)):
                    self.task = j  # the first user message, the first one spoken once one is
                if m.extra.get("source") == "bash_execution":
                    self.shaped.append(j)
                    self.shell.append(j)
            elif isinstance(m, SummaryMessage):
                self.boundary = j
            self.turn_of.append(self.turns)
            self.stamps.append(sent_at(m))
            if isinstance(m, ToolResultMessage) and _candidate(cfg, ctx, self.calls, j, m):
                self.results.append(j)
                size = self.sizes[j] = _text_len(m.content)
                self.turn_results.setdefault(self.turns, []).append(j)
                self.turn_chars[self.turns] = self.turn_chars.get(self.turns, 0) + size


def _text_len(blocks: Iterable[Block]) -> int:
    """``len(text_of(blocks))``, without joining a copy of a long output."""
    n = -1
    for block in blocks:
        if isinstance(block, TextBlock):
            n += len(block.text) + 1
    return max(n, 0)


def _candidate(
    cfg: ToolOutputPipeline,
    ctx: CompactionContext,
    calls: dict[str, tuple[int, ToolCall]],
    j: int,
    m: ToolResultMessage,
) -> bool:
    """Whether the passes may touch the result ``m``, ``ctx.view[j]``."""
    if undecided(ctx.ledger, ctx.raw, ctx.view, ctx.origins, j) is None:
        return False  # already replaced, hidden by a summary, or a stub repair added
    return _tool_name(calls, m) not in cfg.exclude_tools


def _tool_name(calls: dict[str, tuple[int, ToolCall]], m: ToolResultMessage) -> str:
    """The name of the tool the result ``m`` answers (its own, else its call's)."""
    call = calls.get(m.tool_call_id)
    return m.tool_name or (call[1].name if call else "tool")


@dataclass(frozen=True, slots=True)
class Steady:
    """How long the last run's stale proposals stay what they are (`Run.steady`) while the
    view grows only by steps of the running tool loop: until the clock reaches ``until``
    (the first result or step with thinking that L0 leaves now comes of age), while the user
    turns stay ``turns`` and, if ``pushable`` (a new result would push one that is due out of
    L0's ``keep_recent`` newest), while the results stay ``results``."""

    until: float
    turns: int
    results: int
    pushable: bool


def memo_version(ctx: CompactionContext) -> tuple[int, int]:
    """What a `Memo` holds for: the ledger's version and the session's rewinds. An edit the
    manager follows by cutting the raw history back can leave the ledger as it was while
    the raw history holds other messages at the memo's indexes, even the very objects its
    entries were made for (an owned caller's view, its tool-call ids rewritten, taken as
    the raw history): a proposal made then would be anchored to a message no longer there."""
    return ctx.ledger.version, ctx.rewinds


class Memo:
    """What the passes worked out for raw messages (a condensed body, what a replacement
    frees), kept between the calls of one session while the ledger and the raw history
    before the new messages are unchanged (`memo_version`): a call that takes nothing then
    redoes none of it. Each entry holds the message it was made for and is used only for
    that same object."""

    __slots__ = (
        "entries",
        "paying_turn",
        "scan",
        "steady",
        "threshold",
        "turn_held",
        "unpaying",
        "unread",
        "version",
        "worth",
    )

    def __init__(self, version: tuple[int, int], earlier: Memo | None = None) -> None:
        self.version = version
        self.entries: dict[tuple[Any, ...], tuple[Message, Any]] = {}
        # Whether a placeholder pays for each result (`Run.pays`), by raw index and
        # placeholder kind, with the result and its call's message as the view shows them:
        # made of those alone, so kept for the session (``earlier``'s), not sized again after
        # every decision.
        self.worth: dict[tuple[int, str], tuple[Message, Message | None, bool]] = (
            {} if earlier is None else earlier.worth
        )
        self.scan: _Scan | None = None
        # Whether the last run, which took nothing, found that no stale batch can pay before
        # the next user turn (`Run.cannot_pay`); and the user turn in which a run last found
        # that one can (age only adds to a batch: no run need ask again in that turn).
        self.unpaying = False
        self.paying_turn = -1
        self.threshold = -1  # the batch threshold they were found for (a call's budget moves it)
        # Set by the last run when a stale batch can pay but did not: until when its stale
        # proposals stay what they were (`Run.steady`).
        self.steady: Steady | None = None
        # What the messages after the scan hold (`_unread`), as of the last skipped call.
        self.unread: tuple[Any, ...] | None = None
        # The user turn among them whose checks hold for good (`nothing_to_take`).
        self.turn_held: tuple[int, int, Message] | None = None

    def get(self, key: tuple[Any, ...], m: Message) -> Any:
        hit = self.entries.get(key)
        return hit[1] if hit is not None and hit[0] is m else None

    def put(self, key: tuple[Any, ...], m: Message, value: Any) -> None:
        self.entries[key] = (m, value)


def nothing_to_take(cfg: ToolOutputPipeline, ctx: CompactionContext, memo: Memo | None) -> bool:
    """Whether a run of the passes over ``ctx`` would take nothing, told without running
    them: the call's new messages are a step of the running tool loop that no pass touches
    yet (and nothing else is unsent), or a new user turn with the prompt under the threshold
    (what it leaves unprotected cannot pay) and only plain text unsent before it, the cache
    is warm, the prompt is under the budget, and no stale batch can pay (the prompt is
    under the threshold, or the last run, at this threshold, found none can before the next
    user turn, or none can until something comes of age: `Steady`), and what a run would
    size is sized in full already (as `observe` leaves it). Such a call then costs what the
    tiers' own no-decision call does. What it changes: a run memoizes what each proposal
    frees when it first makes it, under the calibration of then, so where the calibration
    moved a batch can reach its threshold a call earlier or later (a proposal first made on
    a later call; a batch sized before the calibration fell, which can then free more than
    the prompt now counts).

    ``memo`` is the session's memo from the last run; its scan tells what is new."""
    idle = ctx.idle_seconds
    if memo is None or memo.scan is None or memo.version != memo_version(ctx) or idle is None:
        return False
    scan = memo.scan
    if idle > cfg.cache_ttl_seconds or (cfg.mc is not None and idle > cfg.mc.gap_seconds):
        return False
    budget = ctx.budget
    limit = budget.limit
    # A stale batch frees at most what the prompt holds (counted as the view is: in full
    # once `observe` saw it sent), or what the last run found it could grow to: under the
    # threshold none pays.
    threshold = cfg.batch_threshold(limit)
    tokens = ctx.prompt_tokens
    if tokens > limit:
        return False
    steady = None
    if tokens >= threshold and (memo.threshold != threshold or not memo.unpaying):
        # What the last run found holds at its own threshold only (a call's budget moves
        # it). A stale batch can pay and did not: a run now proposes the same (each sized
        # when first made) while nothing comes of age and the turn goes on.
        steady = memo.steady if memo.threshold == threshold else None
        if (
            steady is None
            or ctx.clock() >= steady.until
            or steady.turns != scan.turns
            or (steady.pushable and len(scan.results) != steady.results)
        ):
            return False
    # At L2's fraction a run defers L2 (every result it picks was sent, outside the turn
    # the loop is in), which then waits for a paying batch like any stale proposal, having
    # refined what is refined already.
    for passes in (cfg.l0, cfg.l1, cfg.l2):
        if passes is not None and passes.protect_recent_turns < 1:
            return False
    view, origins = ctx.view, ctx.origins
    n = len(scan.messages)
    # The scanned messages are still the view's (a rewind or a batch answered would render
    # its end again) and all sent: the new ones are the only unsent messages.
    if not 0 < n <= len(view) or view[n - 1] is not scan.messages[-1] or origins[n - 1] >= ctx.sent:
        return False
    if not _estimated_in_full(ctx, scan):
        return False
    unread = _unread(memo, ctx, n)
    if unread is None:
        return False
    chars, turn, results = unread
    if results and steady is not None and steady.pushable:
        return False
    # In the newest turn, within the running loop: protected from L0 and L1; only the
    # budget pass could take one of them, when the turn's results pass its cap.
    if cfg.budget is not None and chars > cfg.budget.max_chars_per_turn:
        return False
    if turn >= 0:
        # A user turn moves what the passes protect. What it leaves unprotected was sent:
        # a batch of it frees at most the prompt, under the threshold none pays.
        if tokens >= threshold:
            return False
        if memo.turn_held != (ctx.rewinds, turn, view[turn]):
            # What came before it unsent would be taken at once: only plain text then,
            # which no pass touches. The turn it ends leaves the newest: a run would size
            # what the passes may now replace in it (results, calls' arguments, thinking),
            # as `_estimated_in_full` asks of the turns before. O(that turn), until all of
            # it was sent and held: then both hold on every later call (a message sent
            # stays sent, an estimate in full stays in full).
            sent, is_full = ctx.sent, ctx.counter.is_full
            if not all(_plain(view[j]) for j in range(n, turn + 1) if origins[j] >= sent):
                return False
            start = scan.latest_user or 0
            if not all(is_full(view[j]) for j in range(start, turn) if origins[j] < sent):
                return False
            if origins[turn] < sent:
                memo.turn_held = (ctx.rewinds, turn, view[turn])
        memo.unpaying = False  # found for the turn before: the next run finds it again
    if len(view) - n > _UNREAD_AT_MOST:
        # A long stretch of skipped calls: the scan reads it now, as the next run would,
        # so that run, or a user turn before it, reads only what is new again (a few new
        # messages each call cost less to look over, `_unread`, than to scan).
        scan.messages += view[n:]
        scan.read(cfg, ctx, n)
    return True


_UNREAD_AT_MOST = 64  # messages after the scan that a skipped call leaves unread
_ROUNDING = 1e-3  # seconds: more than a float rounds a timestamp near today's clock by


def _unread(memo: Memo, ctx: CompactionContext, n: int) -> tuple[int, int, bool] | None:
    """What ``ctx.view[n:]``, the messages after the scan, hold: the characters of the newest
    turn's results, the view index of the last user message among them (-1: none), whether
    any is a result; ``None`` when one is a summary or a system or developer message. Kept
    on ``memo`` with the messages it was found in, for the next skipped call: while they are
    still the view's (the tail a repair renders again, stubs for results still to come, can
    change), it looks only at what is new to it. Lists compare in C, by identity first."""
    view = ctx.view
    kept = memo.unread
    seen: list[Message] = []
    if kept is not None and kept[0] == n and kept[1] == ctx.rewinds:
        seen = kept[2]
        if view[n : n + len(seen)] != seen:
            seen = []
    if seen:
        chars, turn, results = kept[3], kept[4], kept[5]  # type: ignore[index]
    else:
        assert memo.scan is not None
        chars, turn, results = memo.scan.turn_chars.get(memo.scan.turns, 0), -1, False
    start = n + len(seen)
    for j in range(start, len(view)):
        m = view[j]
        if isinstance(m, ToolResultMessage):
            results = True
            chars += _text_len(m.content)
        elif isinstance(m, UserMessage) and not is_instruction(m):
            turn, chars = j, 0  # the results after it are the newest turn's
        elif not isinstance(m, AssistantMessage):
            return None  # a summary, or an instruction: a run reads where it stands
    if len(view) > start:
        memo.unread = (n, ctx.rewinds, view[n:], chars, turn, results)
    return chars, turn, results


def _plain(m: Message) -> bool:
    """A user message that is no shell output, or an answer with no calls and no thinking."""
    if isinstance(m, UserMessage):
        return m.extra.get("source") != "bash_execution"
    return isinstance(m, AssistantMessage) and not m.tool_calls and not b.has_thinking(m)


def _estimated_in_full(ctx: CompactionContext, scan: _Scan) -> bool:
    """Whether the messages the passes would size outside the newest turn (results, users'
    shell output) already carry their full estimates, as `observe` leaves what was sent: a
    run would then change no estimate in the view, so skipping it changes nothing the
    manager decides on either. O(messages new since the last time it held): a message's
    full estimate stays, so each list is read from where it last held."""
    is_full, view, turn_of, newest = ctx.counter.is_full, ctx.view, scan.turn_of, scan.turns
    results, k = scan.results, scan.full_upto
    while k < len(results) and turn_of[results[k]] < newest:
        if not is_full(view[results[k]]):
            return False
        k += 1
    scan.full_upto = k
    shell, k = scan.shell, scan.shell_full_upto
    while k < len(shell) and turn_of[shell[k]] < newest:  # the latest user's turn is newest
        if not is_full(view[shell[k]]):
            return False
        k += 1
    scan.shell_full_upto = k
    return True


class Run:
    """One pipeline run over one view: the proposals, with what each already claimed."""

    def __init__(self, cfg: ToolOutputPipeline, ctx: CompactionContext, memo: Memo) -> None:
        self.cfg, self.ctx, self.memo = cfg, ctx, memo
        self.view, self.origins, self.raw = ctx.view, ctx.origins, ctx.raw
        self.proposals: list[Proposal] = []
        # What the proposals' recall ids stand for: stored only with a decision taken, so the
        # many a call proposes and does not take (stale, not paying yet) cost a memo lookup.
        self.contents: dict[str, str] = {}
        self.claimed: set[int] = set()
        self._raw_calls: dict[int, tuple[Message, Message, dict[int, ToolCall]]] = {}
        # L2, due but not proposed: everything it would propose rewrites the sent prefix,
        # which only a cold cache, a paying batch or the budget takes (see `propose_all`).
        self.deferred: EmergencyPass | None = None
        self.now = ctx.clock()
        scan = memo.scan
        view = self.view
        n = len(scan.messages) if scan is not None else 0
        if scan is not None:
            # Extended by what is new, then compared whole: lists compare in C, by identity
            # first, where a slice or a copy of the view would touch each of its messages.
            scan.messages += view[n:]
            if scan.messages != view:
                scan = None  # cut back (a rewind), or its end rendered again (a batch answered)
        if scan is None:
            scan, n = _Scan(), 0
            scan.messages = list(view)
        self.calls, self.turn_of, self.results = scan.calls, scan.turn_of, scan.results
        self.sizes, self.stamps, self.turn_results = scan.sizes, scan.stamps, scan.turn_results
        scan.read(cfg, ctx, n)  # what a call with no decision adds: the new messages
        memo.scan = self.scan = scan
        self.turns, self.boundary = scan.turns, scan.boundary
        # Where the in-flight tool loop starts, as `take` reads it.
        self.loop_start = ctx.in_flight_start()

    # -- what may be touched -------------------------------------------------------------

    def _undecided(self, j: int) -> Message | None:
        # By the ledger, not by identity: repair renames ids and drops blank text of
        # messages no decision touched.
        return undecided(self.ctx.ledger, self.raw, self.view, self.origins, j)

    def _name(self, m: ToolResultMessage) -> str:
        return _tool_name(self.calls, m)

    def _protected(self, j: int, turns: int) -> bool:
        return self.turn_of[j] > self.turns - turns

    def _age(self, j: int) -> float | None:
        stamp = self.stamps[j]
        return None if stamp is None else self.now - stamp

    # -- building decisions --------------------------------------------------------------

    def _placeholder(self, j: int, kind: str, text: str, rid: str | None) -> str:
        """What stands in for ``text``, the result ``view[j]`` holds."""
        m = self.view[j]
        assert isinstance(m, ToolResultMessage)
        key = ("placeholder", kind, rid, self.origins[j])
        made: str | None = self.memo.get(key, m)
        if made is None:
            call = self.calls.get(m.tool_call_id)
            what = describe_call(call[1]) if call else self._name(m)
            lines = text.count("\n") + 1
            status = ", error" if m.is_error else ""
            where = f' Use recall_context(id="{rid}") to read it.' if rid else ""
            images = sum(isinstance(b, ImageBlock) for b in m.content)
            if images and kind != "was":
                # Only the text expired: the model still sees the image, and is told so.
                kind = kind.replace("result expired", "result's text expired")
                status += ", its image kept" if images == 1 else f", its {images} images kept"
                where = where.replace("read it.", "read the text.")
            made = f"[{kind}: {what} -> {lines} lines, {len(text)} chars{status}.{where}]"
            self.memo.put(key, m, made)
        return made

    def _store(self, text: str, key: tuple[Any, ...], m: Message) -> str | None:
        """The recall id ``text`` (made from ``m``, remembered as ``key``) will have."""
        if self.ctx.recall is None:
            return None
        made: tuple[str, str] | None = self.memo.get(key, m)
        if made is None:
            stored = escape_literal(text)  # the entry holds it as it is (see `take`)
            made = (recall_id(self.ctx.session_id, stored), stored)
            self.memo.put(key, m, made)
        rid, stored = made
        self.contents[rid] = stored
        return rid

    def take(self, proposal: Proposal) -> None:
        """Take ``proposal``'s decision, storing what its recall id stands for."""
        ctx = self.ctx
        if proposal.rid is not None and ctx.recall is not None:
            # Escaped when proposed, so its id was known before it is written.
            put_entry(ctx.recall, ctx.session_id, self.contents[proposal.rid])
        ctx.take(proposal.decision)

    def _replace(self, j: int, new_text: str, reason: str, action: str, rid: str | None) -> None:
        m = self.view[j]
        assert isinstance(m, ToolResultMessage)
        i = self.origins[j]
        key = (new_text, i, reason)
        made = self.memo.get(key, m)
        if made is None:
            # Only the text is stored for recall: what else the result holds (an image) is
            # kept as it is, where it is, not lost, and so are the text's fields (a cache
            # breakpoint). The new text stands where the first text block did.
            content = with_text(m.content, new_text)
            decision = ReplaceResult(anchor(self.raw, i), content, reason, rid)
            if m is self.raw[i]:
                # The view will show this very object once the decision is taken: its
                # estimate, made here, is not made again then.
                replacement = self.ctx.ledger.preview(decision, self.raw)
            else:  # as the view shows it (repair may have renamed its call id)
                replacement = ToolResultMessage(
                    m.tool_call_id, decision.content, m.tool_name, m.is_error, m.extra
                )
            count = self.ctx.counter
            freed = count.count_full(m) - count.count_full(replacement)
            made = (decision, freed)
            self.memo.put(key, m, made)
        decision, freed = made
        self._add(Proposal(decision, freed, i >= self.ctx.sent, action, rid=rid), i)
        self._clear_arguments(m.tool_call_id, reason, i)

    def _add(self, proposal: Proposal, i: int) -> None:
        self.claimed.add(i)
        self.proposals.append(proposal)

    def _clear_arguments(self, call_id: str, reason: str, unit: int) -> None:
        found = self.calls.get(call_id)
        if found is None or found[0] >= self.loop_start:
            return  # never the in-flight tool loop's calls
        j, shown = found
        i, message = self.origins[j], self.view[j]
        key = ("args", i, shown.id, reason)
        made: tuple[Any, ...] | None = self.memo.get(key, message)
        if made is None:
            made = self._arguments_cleared(j, shown, reason)
            self.memo.put(key, message, made)
        if not made:
            return
        decision, freed, action, rid, text = made
        if rid is not None:
            self.contents[rid] = text
        self.proposals.append(Proposal(decision, freed, i >= self.ctx.sent, action, unit, rid))

    def _arguments_cleared(self, j: int, shown: ToolCall, reason: str) -> tuple[Any, ...]:
        """``(decision, freed, action, rid, stored text)`` clearing the long arguments of the
        call ``shown`` in ``view[j]``; ``()`` when it has none (or is not undecided)."""
        i, message = self.origins[j], self.view[j]
        original = self._undecided(j)
        if not isinstance(original, AssistantMessage) or not isinstance(message, AssistantMessage):
            return ()
        # Named as in the raw message: the decision anchors there, and rendering renames it.
        # Mapped once per message: a batch of n calls has up to n results asking.
        known = self._raw_calls.get(j)
        if known is None or known[0] is not message or known[1] is not original:
            known = self._raw_calls[j] = (message, original, raw_calls(original, message))
        call = known[2].get(id(shown))
        if call is None:
            return ()
        long_args = self._long_arguments(call)
        if not long_args:
            return ()
        text = escape_literal(_json(dict(long_args)))
        rid = recall_id(self.ctx.session_id, text) if self.ctx.recall is not None else None
        args: dict[str, Any] = dict(call.arguments)
        for key, value in long_args.items():
            note = f' recall_context(id="{rid}")' if rid else ""
            # A command's first line names what it ran on (``cat > x.py << EOF``): it stays.
            head = value.split("\n", 1)[0][:200] + "\n" if key in _COMMAND_KEYS else ""
            args[key] = f"{head}[cleared: {len(value)} chars{note}]"
        freed = sum(len(v) - len(str(args[k])) for k, v in long_args.items()) // 4
        # A model's NaN kept beside the cut: as null.
        kept = finite_arguments(args)
        decision = ReplaceArguments(anchor(self.raw, i), call.id, kept, reason, rid)
        return decision, freed, f"cleared arguments of {describe_call(call)}", rid, text

    def _expire(self, j: int, kind: str, reason: str, *, reuse: bool = True) -> None:
        """Propose replacing result ``view[j]`` by a placeholder, where one pays (`pays`);
        ``reuse``: its proposals are kept for later calls (`_keep_unit`)."""
        m = self.view[j]
        assert isinstance(m, ToolResultMessage)
        i = self.origins[j]
        if reuse and self._reuse_unit(("unit", kind, reason, i), m, i):
            return
        if not self.pays(j, kind):
            # The result stays as it is; its call's long arguments may still go.
            self.claimed.add(i)
            self._clear_arguments(m.tool_call_id, reason, i)
            return
        text = text_of(m.content)
        rid = self._store(text, ("rid", i), m)
        new = self._placeholder(j, kind, text, rid)
        before = len(self.proposals)
        self._replace(j, new, reason, f"{reason}: {self._name(m)}", rid)
        if reuse:
            self._keep_unit(("unit", kind, reason, i), m, self.proposals[before:])

    def pays(self, j: int, kind: str = "Tool result expired") -> bool:
        """Whether a placeholder of ``kind`` costs fewer tokens than the text of result
        ``view[j]`` (for an empty one, ``ok`` or a short ``git status`` it would cost more,
        and beside an image alone it would point recall at nothing). Both are counted
        by the default estimator, uncalibrated, so the answer is the message's alone and the
        same on every call; a text over twice the placeholder's length pays without counting
        (it would need 6 characters a token, a placeholder runs 3)."""
        m = self.view[j]
        assert isinstance(m, ToolResultMessage)
        found = self.calls.get(m.tool_call_id)  # the placeholder describes the call
        call = self.view[found[0]] if found is not None else None
        key = (self.origins[j], kind)
        known = self.memo.worth.get(key)
        if known is not None and known[0] is m and known[1] is call:
            return known[2]
        text = text_of(m.content)
        stand_in = ID_STAND_IN if self.ctx.recall is not None else None  # as long as its id
        placeholder = self._placeholder(j, kind, text, stand_in)
        if len(text) > 2 * len(placeholder):
            worth = True
        else:
            count = _estimator().count
            worth = count(placeholder) < count(text)
        self.memo.worth[key] = (m, call, worth)
        return worth

    # A result due for expiry stays due on every later call until a decision is taken (old
    # results outside the protected turns, near the budget every one): its proposals, with
    # its call's arguments, are kept whole in the memo (reset with the ledger version) and
    # reused while nothing they were made from changed, one lookup instead of five.

    def _keep_unit(self, key: tuple[Any, ...], m: ToolResultMessage, unit: list[Proposal]) -> None:
        if any(p.fresh for p in unit):
            return  # taken on this call anyway
        found = self.calls.get(m.tool_call_id)  # the call: its arguments, how it is described
        shown = self.view[found[0]] if found is not None else None
        args = found is not None and found[0] < self.loop_start  # cleared with the result?
        stored = tuple((p.rid, self.contents[p.rid]) for p in unit if p.rid is not None)
        last = max((p.decision.at.index for p in unit), default=-1)
        self.memo.put(key, m, (found, shown, args, tuple(unit), stored, last))

    def _reuse_unit(self, key: tuple[Any, ...], m: ToolResultMessage, i: int) -> bool:
        """Propose what `_expire` made for ``m`` under ``key`` on an earlier call, if it would
        make exactly that again; whether it did."""
        kept = self.memo.get(key, m)
        if kept is None:
            return False
        found, shown, args, unit, stored, last = kept
        if self.calls.get(m.tool_call_id) is not found:
            return False  # the view was scanned again: its call may be another message
        if found is not None and (
            self.view[found[0]] is not shown or (found[0] < self.loop_start) != args
        ):
            return False
        if last >= self.ctx.sent:
            return False  # a rewind: they are about unsent messages again
        for rid, text in stored:
            self.contents[rid] = text
        self.claimed.add(i)
        self.proposals += unit
        return True

    # -- the passes ----------------------------------------------------------------------

    def propose_all(self) -> None:
        """Run every pass; L2's proposals may be left to `propose_deferred` (``deferred``)."""
        cfg = self.cfg
        if cfg.mc is not None:
            self._mc(cfg.mc)
        if cfg.budget is not None:
            self._budget(cfg.budget)
        if cfg.l0 is not None:
            self._l0(cfg.l0)
        if cfg.l1 is not None:
            self._l1(cfg.l1)
        l2 = cfg.l2
        if l2 is None or self.ctx.prompt_tokens < l2.usage_fraction * self.ctx.budget.limit:
            return
        picks = self._l2_picks(l2)
        if self._defer_l2(picks):
            # Near the budget every call is due for L2, on every result outside the protected
            # turns: building (and counting) all those placeholders on each call that takes
            # none was most of the pipeline's slow calls. Only the refinement of the results'
            # estimates, which the counting did on the way, is kept: later calls see it.
            self.deferred = l2
            self.ctx.counter.refine(self.view[j] for j in picks)
        else:
            self._l2(picks)

    def cannot_pay(self, paying: int, threshold: int) -> bool:
        """Whether no stale batch can free ``threshold`` before the next user turn (or
        decision), from ``paying`` (what this run's stale proposals free) on: until then only
        age makes more due (L0), so every result outside the turns L0 protects that it has
        not expired yet (an L1 body can still become a placeholder), with its call, and every
        step with thinking or shell output count whole, with a quarter more for what
        calibration may still add to their estimates; a result no placeholder pays for counts
        only its call, where that has arguments long enough to clear (`_ages_alone`)."""
        room = (threshold - 1 - paying) * 4 // 5  # what may join, a quarter more being < left
        l0 = self.cfg.l0
        if l0 is None or room < 0:
            return room >= 0  # without L0 nothing ages: what is due stays due, alone
        expired = {p.unit for p in self.proposals if p.decision.reason == "l0"}
        count, origins = self.ctx.counter.count, self.origins
        for j in self.scan.shaped:
            room -= count(self.view[j])
        for j in self.results:
            if room < 0:
                return False
            if (
                not self._protected(j, l0.protect_recent_turns)
                and origins[j] not in expired
                and not self._ages_alone(j)
            ):
                # What no placeholder pays for stays: its call's long arguments may go.
                room -= self._with_call(j, result=self.pays(j))
        return room >= 0

    def steady(self) -> Steady:
        """What keeps this run's stale proposals as they are on later calls (`Steady`): L0 is
        the only pass that time moves; within a turn the results and steps it may yet expire
        are those outside its protected turns. Counted whatever other pass claimed them
        first (L1 runs after L0, which would claim them once due)."""
        l0, results, turns = self.cfg.l0, self.results, self.turns
        until, pushable = math.inf, False
        latest = self.scan.latest_user
        if self.loop_start != (0 if latest is None else latest + 1):
            # The history ends with user messages right after results (`b.in_flight_start`):
            # the next call's loop starts after them, and what it leaves before may be due
            # at once. That call runs the passes.
            until = -math.inf
        elif l0 is not None:
            now, stamps, turn_of = self.now, self.stamps, self.turn_of
            protected_from = turns - l0.protect_recent_turns
            recent = set(results[-l0.keep_recent :]) if l0.keep_recent else set()
            for j in results:
                at = stamps[j]
                if at is None or turn_of[j] > protected_from:
                    continue
                # (asked last: a result whose expiry would change nothing moves neither)
                if now - at <= l0.expire_seconds:
                    if at + l0.expire_seconds < until and not self._ages_alone(j):
                        until = at + l0.expire_seconds
                elif j in recent and not pushable and not self._ages_alone(j):
                    pushable = True
            for j in self.scan.shaped:
                at = stamps[j]
                if (
                    at is not None
                    and j < self.loop_start - 1
                    and isinstance(self.view[j], AssistantMessage)
                    and now - at <= l0.thinking_expire_seconds
                ):
                    until = min(until, at + l0.thinking_expire_seconds)
        # Short of the exact instant: ``now - at > expire`` is what L0 asks, in floats.
        return Steady(until - _ROUNDING, turns, len(results), pushable)

    def _with_call(self, j: int, *, result: bool = True) -> int:
        """Tokens of the result ``view[j]`` (unless not ``result``) and of the message
        holding its call."""
        m = self.view[j]
        count = self.ctx.counter.count
        found = self.calls.get(m.tool_call_id)  # type: ignore[union-attr]
        call = count(self.view[found[0]]) if found is not None else 0
        return count(m) + call if result else call

    def _ages_alone(self, j: int) -> bool:
        """Whether expiring result ``view[j]`` would change nothing: no placeholder pays for
        it and its call has no argument long enough to clear."""
        if self.pays(j):
            return False
        found = self.calls.get(self.view[j].tool_call_id)  # type: ignore[union-attr]
        return found is None or not self._long_arguments(found[1])

    def _long_arguments(self, call: ToolCall) -> dict[str, str]:
        """The string arguments of ``call`` long enough to clear (``argument_chars``)."""
        limit = self.cfg.argument_chars
        return {k: v for k, v in call.arguments.items() if isinstance(v, str) and len(v) > limit}

    def _defer_l2(self, picks: list[int]) -> bool:
        # With a proposal about unsent messages the call takes decisions anyway, and these
        # come in order with L2's own; then L2 proposes at once, as it always did.
        sent = self.ctx.sent
        return not any(p.fresh for p in self.proposals) and all(
            self.origins[j] < sent for j in picks
        )

    def propose_deferred(self) -> None:
        """Make the proposals L2 left for later (``deferred``), before any is taken: the
        same, in the same order, as if it had made them in `propose_all`."""
        if self.deferred is not None:
            self._l2(self._l2_picks(self.deferred))
            self.deferred = None

    def _open(self, j: int, *, after_boundary: bool = True) -> bool:
        return self.origins[j] not in self.claimed and (not after_boundary or j > self.boundary)

    def _mc(self, mc: MicroCompact) -> None:
        idle = self.ctx.idle_seconds
        if idle is None:
            last = next(
                (
                    j
                    for j in range(len(self.view) - 1, -1, -1)
                    if isinstance(self.view[j], AssistantMessage)
                ),
                None,
            )
            gap = None if last is None else self._age(last)
        else:
            gap = idle
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
        every, chars = self.sizes, self.scan.turn_chars
        for turn, members in self.turn_results.items():
            if chars[turn] <= cfg.max_chars_per_turn:
                continue  # within the budget even before what other passes claimed
            sizes = {j: every[j] for j in members if self._open(j)}
            total = sum(sizes.values())
            for j in sorted(sizes, key=lambda k: (-sizes[k], k)):
                if total <= cfg.max_chars_per_turn:
                    break
                text = text_of(self.view[j].content)  # type: ignore[union-attr]
                rid = self._store(text, ("rid", self.origins[j]), self.view[j])
                where = f' (recall_context id="{rid}")' if rid else ""
                preview = text[: cfg.preview_chars]
                new = f"[Persisted output{where}. Preview: {preview}... Total: {len(text)} chars]"
                if len(new) >= len(text):
                    break
                self._replace(j, new, "budget", f"persisted {self._name(self.view[j])} output", rid)  # type: ignore[arg-type]
                total -= sizes[j] - len(new)

    def _l0(self, cfg: ExpiryPass) -> None:
        recent = set(self.results[-cfg.keep_recent :]) if cfg.keep_recent else set()
        # Old enough first, in one pass (every call walks the results; few are that old).
        now, stamps, expire = self.now, self.stamps, cfg.expire_seconds
        old = [j for j in self.results if (at := stamps[j]) is not None and now - at > expire]
        # Near the end of a long session most results are old: `_protected` and `_open`
        # inline, a few calls less for each on every call.
        turn_of, newest, origins, claimed = self.turn_of, self.turns, self.origins, self.claimed
        protected_from = newest - cfg.protect_recent_turns
        for j in old:
            if turn_of[j] <= protected_from and j not in recent and origins[j] not in claimed:
                self._expire(j, "Tool result expired", "l0")
        kept = (self.scan.latest_user, self.scan.task)  # what every view shows as it is
        for j in self.scan.shaped:
            m, i = self.view[j], self.origins[j]
            if (
                isinstance(m, UserMessage)
                and m.extra.get("source") == "bash_execution"
                and j not in kept
            ):
                text = text_of(m.content)
                if (
                    len(text) > cfg.user_shell_chars
                    and self._undecided(j) is not None
                    and i not in self.claimed
                ):
                    rid = self._store(text, ("rid", i), m)
                    # Kept with what it frees: the view then shows the very replacement
                    # sized here (one made again would carry only a quick estimate).
                    made = self.memo.get(("shell", i, rid), m)
                    if made is None:
                        note = f' recall_context(id="{rid}")' if rid else ""
                        tail = text[-cfg.user_shell_chars :]
                        new = f"... [truncated{note}. Total: {len(text)} chars]\n\n{tail}"
                        replacement = UserMessage((TextBlock(new),), m.extra)
                        count = self.ctx.counter.count_full
                        made = (
                            ReplaceSpan(
                                anchor(self.raw, i),
                                i + 1,
                                anchor(self.raw, i),
                                (replacement,),
                                "l0-shell",
                            ),
                            count(m) - count(replacement),
                        )
                        self.memo.put(("shell", i, rid), m, made)
                    decision, freed = made
                    self._add(
                        Proposal(
                            decision,
                            freed,
                            i >= self.ctx.sent,
                            "kept the tail of user shell output",
                            rid=rid,
                        ),
                        i,
                    )
            elif (
                isinstance(m, AssistantMessage)  # in `shaped`: a step with thinking
                and j < self.loop_start - 1
                and (age := self._age(j)) is not None
                and age > cfg.thinking_expire_seconds
            ):
                # Due on every later call until a batch pays: made once per ledger version.
                made = self.memo.get(("thinking", i), m)
                if made is None:
                    made = self._thinking_dropped(j, m)
                    self.memo.put(("thinking", i), m, made)
                if made:
                    decision, freed = made
                    self.proposals.append(
                        Proposal(
                            decision,
                            freed,
                            i >= self.ctx.sent,
                            "dropped thinking of a completed turn",
                        )
                    )

    def _thinking_dropped(
        self, j: int, step: AssistantMessage
    ) -> tuple[DropThinking, int] | tuple[()]:
        """``(decision, freed)`` dropping the thinking of ``step``, ``view[j]``; ``()`` when a
        decision touches it already, or it holds provider items (see `check_fits`)."""
        if self._undecided(j) is None or any(isinstance(b, OpaqueBlock) for b in step.content):
            return ()
        freed = sum(
            len(getattr(blk, "thinking", "") or getattr(blk, "data", ""))
            for blk in step.content
            if blk.type in ("thinking", "redacted_thinking")
        )
        return DropThinking(anchor(self.raw, self.origins[j]), "l0-thinking"), freed // 4

    def _l1(self, cfg: CondensePass) -> None:
        sizes, threshold = self.sizes, cfg.threshold_chars
        for j in [j for j in self.results if sizes[j] > threshold]:
            if self._protected(j, cfg.protect_recent_turns) or not self._open(j):
                continue
            m = self.view[j]
            assert isinstance(m, ToolResultMessage)
            i = self.origins[j]
            # Due on every later call until a batch pays, as an expiry is: kept whole.
            if self._reuse_unit(("unit", "l1", i), m, i):
                continue
            text = text_of(m.content)
            rid = self._store(text, ("rid", i), m)
            body = self.memo.get(("l1", i), m)
            if body is None:
                body = condense(text, cfg.head_lines, cfg.tail_lines, cfg.max_ratio)
                self.memo.put(("l1", i), m, body)
            where = f' (recall_context id="{rid}")' if rid else ""
            new = f"[Condensed{where}: {self._placeholder(j, 'was', text, None)[1:-1]}]\n{body}"
            before = len(self.proposals)
            self._replace(j, new, "l1", f"condensed {self._name(m)} output", rid)
            self._keep_unit(("unit", "l1", i), m, self.proposals[before:])

    def _l2_picks(self, cfg: EmergencyPass) -> list[int]:
        turns = cfg.protect_recent_turns
        return [j for j in self.results if not self._protected(j, turns) and self._open(j)]

    def _l2(self, picks: list[int]) -> None:
        for j in picks:  # each claims only itself: the picks stay open as it goes
            self._expire(j, "Tool result expired", "l2")

    def beyond_expiry(self, target: int) -> bool:
        """Whether the prompt would stay above ``target`` with every result the passes may
        touch (and its call) gone, outside the newest turn and the in-flight tool loop (what
        `expire_to_target` spares when forced): no placeholder, however many, reaches it."""
        most = sum(
            self._with_call(j)
            for j in self.results
            if not self._protected(j, 1) and j < self.loop_start
        )
        return self.ctx.prompt_tokens - most > target

    def take_until(self, proposals: list[Proposal], target: int) -> list[Proposal]:
        """Take ``proposals`` oldest first, whole units (a result with its call's arguments),
        until the prompt is at ``target``; return those taken."""
        units: dict[int, list[Proposal]] = {}
        for p in sorted(proposals, key=lambda p: p.unit):
            units.setdefault(p.unit, []).append(p)
        return self._take_units(iter(units.values()), target)

    def expire_to_target(
        self, protect_turns: int, target: int, within: tuple[int, int] | None = None
    ) -> list[Proposal]:
        """Expire the oldest results outside the newest ``protect_turns`` turns and the
        in-flight tool loop (and inside view positions ``within``, if given) until the prompt
        is at ``target``; return what was taken."""
        lo, hi = within if within is not None else (0, len(self.view))

        def units() -> Iterator[list[Proposal]]:
            for j in self.results:
                if not lo <= j < hi:
                    continue
                if self._protected(j, protect_turns) or j >= self.loop_start or not self._open(j):
                    continue
                before = len(self.proposals)
                self._expire(j, "Tool result expired", "budget-forced", reuse=False)
                unit = self.proposals[before:]
                del self.proposals[before:]
                if unit:
                    yield unit

        return self._take_units(units(), target)

    def _take_units(self, units: Iterator[list[Proposal]], target: int) -> list[Proposal]:
        # Each proposal carries its own estimate of what it frees, so the view is rendered
        # again only when those say the target is reached, not after every decision.
        ctx = self.ctx
        taken: list[Proposal] = []
        need = ctx.prompt_tokens - target
        freed = 0
        for unit in units:
            if need <= 0:
                break
            if sum(p.freed for p in unit) <= 0:
                continue  # a placeholder no smaller than what it replaces only churns the cache
            for p in unit:
                self.take(p)
                freed += p.freed
            taken += unit
            if freed >= need:
                need, freed = ctx.prompt_tokens - target, 0
        return taken


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


@functools.cache
def _estimator() -> Estimator:
    """The default estimator, made once (it looks for tiktoken when made)."""
    return default_estimator()
