from __future__ import annotations

import re
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentctx.budget import Budget
from agentctx.events import CompactionWarning, ContextCompacted, Event
from agentctx.ledger import ReplaceSpan
from agentctx.manager import ContextManager
from agentctx.messages import (
    AssistantMessage,
    Message,
    SummaryMessage,
    TextBlock,
    ThinkingBlock,
    ToolResultMessage,
    text_of,
)
from agentctx.recall import MemoryRecallStore
from agentctx.strategies.deterministic import (
    COMPACTION_MARKER,
    DeterministicCompaction,
    describe_call,
    truncate_text,
)
from agentctx.testing import assert_view_ok, drive

from .helpers import assistant, call, cut_off_write, result, returns_within, tool_turn, user

RECALL_ID = re.compile(r"ctx-[0-9a-f]{16}")


_long_lines = st.lists(st.text(alphabet="ab \udcff字", max_size=400), max_size=40).map("\n".join)


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="ab \n\udcff字", max_size=3000) | _long_lines,
    max_lines=st.integers(3, 50),
    max_chars=st.integers(200, 2000),
)
def test_truncation_is_idempotent_and_bounded(text: str, max_lines: int, max_chars: int) -> None:
    once = truncate_text(text, max_lines, max_chars, "recall_context id=ctx-1")
    assert truncate_text(once, max_lines, max_chars, "recall_context id=ctx-1") == once
    assert len(once) <= max(len(text), max_chars)
    assert once.count("\n") < max(max_lines, text.count("\n") + 1)
    if once != text:
        assert "truncated" in once


_MARKER = re.compile(r"\[\.\.\. (?:(\d+) lines \((\d+) chars\)|(\d+) chars(?: in (\d+) lines)?) ")


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="ab\n字", max_size=3000) | _long_lines,
    max_lines=st.integers(3, 50),
    max_chars=st.integers(200, 2000),
)
def test_truncation_shows_the_start_and_end_and_counts_what_it_hides(
    text: str, max_lines: int, max_chars: int
) -> None:
    out = truncate_text(text, max_lines, max_chars, "note")
    if out == text:
        return
    markers = list(_MARKER.finditer(out))
    assert len(markers) == 1, out
    marker = markers[0]
    head = out[: marker.start()]
    tail = out[out.index("...]", marker.end()) + 4 :]
    lines, line_chars, chars, spans = marker.groups()
    if lines is not None:  # whole lines: the line breaks around the marker are the text's
        head, tail = head.removesuffix("\n"), tail.removeprefix("\n")
        assert int(line_chars) == len(text) - len(head) - len(tail) - 1
        assert int(lines) == text.count("\n") - head.count("\n") - tail.count("\n") - 1
    else:
        head, tail = head.removesuffix("\n"), tail.removeprefix("\n")
        assert int(chars) == len(text) - len(head) - len(tail)
        hidden = text[len(head) : len(text) - len(tail)]
        assert int(spans or 1) == hidden.count("\n") + 1
    assert text.startswith(head) and text.endswith(tail)


def _truncate_by_split(text: str, max_lines: int, max_chars: int, note: str) -> str:
    """The obvious line cut (split, keep head and tail, join): what `truncate_text` must
    return without splitting the whole text, when it fits in ``max_chars``."""
    lines = text.split("\n")
    if len(lines) > max_lines >= 3:
        head, tail = max_lines // 2, (max_lines - 1) // 2
        cut = lines[head : len(lines) - tail]
        chars = sum(map(len, cut)) + len(cut)
        marker = f"[... {len(cut)} lines ({chars} chars) truncated; {note} ...]"
        text = "\n".join([*lines[:head], marker, *lines[len(lines) - tail :]])
    return text


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="a \n\r\udcff字", max_size=2000),
    max_lines=st.integers(1, 40),
    max_chars=st.integers(200, 100_000),
)
def test_truncation_keeps_the_lines_a_split_keeps(
    text: str, max_lines: int, max_chars: int
) -> None:
    note = "recall_context id=ctx-1"
    split = _truncate_by_split(text, max_lines, max_chars, note)
    if len(split) <= max_chars:
        assert truncate_text(text, max_lines, max_chars, note) == split


def test_truncation_marker_tells_the_truth() -> None:
    text = "\n".join(f"line {i}" for i in range(1000))
    out = truncate_text(text, 10, 100_000)
    assert out.count("\n") == 9
    assert "[... 991 lines" in out
    assert out.startswith("line 0\n") and out.endswith("line 999")


def test_one_marker_with_the_texts_numbers_when_kept_lines_are_still_too_long() -> None:
    """Found from outside: a line cut and then a character cut of its output showed two
    markers, the second counting the first's text and the head no longer the text's start
    (short head lines, long tail lines), or one marker seven times under what it hid (long
    lines everywhere)."""
    note = "recall_context id=ctx-0123456789abcdef"
    mixed = "\n".join(
        [f"short {i}" for i in range(800)] + [f"long {i} " + "L" * 1000 for i in range(200)]
    )
    wide = "\n".join(f"{i:04d} " + "y" * 295 for i in range(1000))
    for text in (mixed, wide):
        out = truncate_text(text, 200, 20_000, note)
        assert len(out) <= 20_000 and out.count("\n") < 200
        (marker,) = re.findall(r"\n\[\.\.\. (\d+) chars in (\d+) lines truncated; ", out)
        head, _, rest = out.partition("\n[... ")
        tail = rest.partition(" ...]\n")[2]
        assert text.startswith(head) and text.endswith(tail)
        assert int(marker[0]) == len(text) - len(head) - len(tail)
        assert int(marker[1]) == text.count("\n", len(head), len(text) - len(tail)) + 1


def test_ten_megabyte_output_is_bounded() -> None:
    out = truncate_text("x" * 10_000_000, 200, 20_000)
    assert len(out) <= 20_000
    assert "9980" in out  # the marker states how many characters were cut


def test_describe_call_names_what_was_touched() -> None:
    assert describe_call(call("a", path="src/a.py")) == "read(path=src/a.py)"
    assert describe_call(call("b", "bash", command="ls  -la\nsrc")) == "bash(command=ls -la src)"


async def test_tiers_keep_task_latest_user_and_newest_turn() -> None:
    turns = [[user("task: refactor src/cache.py")]]
    for n in range(40):
        turns.append(tool_turn(n, lines=120))
        if n % 8 == 7:
            turns.append([assistant(text=f"done {n}"), user(f"now step {n}")])
    events: list[Event] = []
    async with ContextManager(
        Budget(context_window=16_000, reserve_output=1_000), recall=MemoryRecallStore()
    ) as ctx:
        ctx.subscribe(events.append)
        views = await drive(ctx, turns)
    compactions = [e for e in events if isinstance(e, ContextCompacted)]
    assert compactions and all(e.tokens_after < e.tokens_before for e in compactions)
    actions = " ".join(a for e in compactions for a in e.actions)
    assert "dropped" in actions  # condensing every old turn would not reach the target
    last = views[-1]
    assert last[0] == turns[0][0]
    assert any(isinstance(m, SummaryMessage) and m.text.startswith(COMPACTION_MARKER) for m in last)
    assert ctx.prompt_tokens <= ctx.budget.limit


def _stepped_session(steps: int, lines: int, every: int) -> list[list[Message]]:
    """A task, then tool steps with a user prompt after every ``every`` of them."""
    turns = [[user("task: refactor src/cache.py")]]
    for n in range(steps):
        turns.append(tool_turn(n, lines=lines))
        if n % every == every - 1:
            turns.append([assistant(text=f"done {n}"), user(f"now step {n}")])
    return turns


async def test_old_turns_are_condensed_when_that_reaches_the_target() -> None:
    events: list[Event] = []
    budget = Budget(context_window=9_000, reserve_output=1_000, target_ratio=0.65)
    async with ContextManager(budget, recall=MemoryRecallStore(), session_id="s") as ctx:
        ctx.subscribe(events.append)
        views = await drive(ctx, _stepped_session(12, lines=100, every=2))
        (compaction,) = [e for e in events if isinstance(e, ContextCompacted)]
        assert compaction.actions == ("condensed 2 old turns to one line each",)
        lines = [text_of(m.content) for m in views[-1] if isinstance(m, AssistantMessage)]
        condensed = [t for t in lines if t.startswith("[Earlier turn, condensed]")]
        assert len(condensed) == 2
        for line in condensed:  # each one recall away, its tools named
            rid = line.split("recall_context id=")[1].split(")")[0]
            assert "line 0 of output" in (await ctx.recall(rid))
            assert "Tools: read(path=" in line
        assert compaction.tokens_after <= budget.target_tokens + budget.target_tokens // 10


@pytest.mark.parametrize("window", [9_000, 9_500, 12_000, 16_000])
@pytest.mark.parametrize("target_ratio", [0.1, 0.3, 0.5])
async def test_no_turn_is_condensed_only_to_be_dropped_in_the_same_call(
    window: int, target_ratio: float
) -> None:
    # Where condensing every old turn fell short of the target, the tier condensed them all
    # and the drop tier then hid their lines behind its marker in the same call: lines,
    # recall entries and decisions made for nothing, a third of a long session's decision
    # time. A turn condensed in a call is in the view that call returns. (Not always with a
    # target close to the trigger: where the next turn would overshoot the target by more
    # than the slack, the drop tier cuts the rest and its span can take a line with it.)
    budget = Budget(context_window=window, reserve_output=1_000, target_ratio=target_ratio)
    history: list[Message] = []
    kinds: set[str] = set()
    async with ContextManager(budget, recall=MemoryRecallStore()) as ctx:
        for turn in _stepped_session(40, lines=100, every=4):
            history += turn
            taken = len(ctx.ledger)
            view = await ctx.prepare(history)
            assert_view_ok(view, ctx.raw)
            shown = {text_of(m.content) for m in view if isinstance(m, AssistantMessage)}
            for d in ctx.ledger.added_since(taken):
                kinds.add(d.reason)
                if isinstance(d, ReplaceSpan) and d.reason == "condense":
                    assert text_of(d.replacement[0].content) in shown
    assert "drop" in kinds


async def test_truncated_output_is_recallable() -> None:
    big = "\n".join(f"row {i}" for i in range(5_000))
    history = [user("task"), assistant(call("a")), result("a", big), assistant(text="ok"),
               user("next"), *tool_turn(1, lines=3)]  # fmt: skip
    store = MemoryRecallStore()
    async with ContextManager(
        Budget(context_window=6_000, reserve_output=1_000), recall=store, session_id="s1"
    ) as ctx:
        view = await ctx.prepare(history)
    cut = next(m for m in view if isinstance(m, ToolResultMessage) and m.tool_call_id == "a")
    text = text_of(cut.content)
    rid = text.split("recall_context id=")[1].split(" ")[0].split(";")[0]
    assert store.get("s1", rid) == big
    assert store.get("other-session", rid) is None


async def test_giving_way_skips_the_levels_that_cannot_be_enough() -> None:
    # The running loop's output is too large for the target at every halving level but the
    # last few: once the older turns are condensed and dropped, giving way goes straight to
    # the first level that is enough, no deeper, and leaves the view as the level-by-level
    # loop did.
    per = 1_400
    history = [user("task: speed up src/x.py")]
    for n in range(8):
        history += tool_turn(n, lines=150)
    history += [assistant(text="done"), user("next: the other half"), *tool_turn(30, lines=150),
                assistant(text="half done"), user("now the rest"), *tool_turn(20, lines=per),
                *tool_turn(21, lines=per), assistant(call("big", "bash", command="grep -rn v")),
                result("big", "\n".join(f"src/x.py:{i}: v_{i} = f({i})" for i in range(per)),
                       "bash")]  # fmt: skip
    budget = Budget(context_window=60_000, reserve_output=8_000, target_ratio=0.02)
    async with ContextManager(budget) as ctx:
        view = await ctx.prepare(history)
        assert ctx.prompt_tokens <= budget.target_tokens
        newest = ctx.ledger.decisions_at(len(history) - 1)
    # 200 lines; the last level skipped (25), as the level-by-level loop left the running
    # loop's output before the level that is enough; 12 (that loop took five decisions).
    assert [d.reason for d in newest] == ["truncate"] * 3
    shown = next(m for m in view if isinstance(m, ToolResultMessage) and m.tool_call_id == "big")
    assert text_of(shown.content).count("\n") + 1 == 12  # halving 200 -> 100 -> 50 -> 25 -> 12


def _kept_turn_history(page: str = "", *, old: int = 5) -> list[Message]:
    """A session whose newest complete turn holds most of what cannot be dropped: ``old``
    earlier turns, then a question answered after three reads of 150 lines and, if given,
    a recalled ``page``; then the latest user message with a read the model just asked for."""
    history = [user("task: speed up src/x.py")]
    for n in range(20, 20 + old):
        history += [*tool_turn(n, lines=150), assistant(text=f"step {n} done"), user(f"go on {n}")]
    history += [user("next: read the parser")]
    for n in range(1, 4):
        history += tool_turn(n, lines=150)
    if page:
        history += [
            assistant(call("rc", "recall_context", id="ctx-1")),
            result("rc", page, "recall_context"),
        ]
    history += [assistant(text="the parser is slow in lex()"), user("now fix lex()")]
    history += [assistant(call("new", "read", path="src/lex.py"))]
    history += [result("new", "\n".join(f"lex line {i}" for i in range(150)), "read")]
    return history


async def test_the_newest_complete_turn_is_cut_down_when_it_holds_the_landing_up() -> None:
    # Found on pi/before-compaction@100k: a compaction landed at 30k of a 10k target, 19.5k
    # of it the newest complete turn's steps, which no tier cut (below the trigger, nothing
    # gives way); the next compaction came that much sooner, and the session cost more than
    # a peer that compacts everything. Its output is now cut down, each with a recall id,
    # and its messages all kept; the running loop's result, which the model just asked
    # for, and the recall tool's page stay whole.
    page = "\n".join(f"recalled line {i}" for i in range(100))
    history = _kept_turn_history(page)
    store = MemoryRecallStore()
    budget = Budget(context_window=9_000, reserve_output=1_000)
    async with ContextManager(budget, recall=store, session_id="s") as ctx:
        view = await ctx.prepare(history)
        assert_view_ok(view, history)
        tokens = ctx.prompt_tokens
    turn = history.index(user("next: read the parser"))
    answer = history.index(assistant(text="the parser is slow in lex()"))
    shown = {v.tool_call_id: text_of(v.content) for v in view if isinstance(v, ToolResultMessage)}
    for m in history[turn : answer + 1]:  # every message of the turn is still there
        assert m.tool_call_id in shown if isinstance(m, ToolResultMessage) else m in view
    for cid in ("c1_0", "c2_0", "c3_0"):
        text = shown[cid]
        assert text.count("\n") < 20
        rid = text.split("recall_context id=")[1].split()[0].rstrip(";]")
        assert "line 149 of output" in (store.get("s", rid) or "")
    assert shown["rc"] == page
    assert shown["new"] == text_of(history[-1].content)
    # What is left: the task, the marker, the turn's lines and the two whole outputs.
    assert tokens < 2 * sum(ctx.counter.count(m) for m in history[-3:]) + 1_000


async def test_a_landing_at_the_target_leaves_the_newest_complete_turn_whole() -> None:
    # Only a landing the tiers leave above the target cuts the turn down: with enough older
    # history to condense and drop, it stays as it was.
    history = _kept_turn_history(old=25)
    budget = Budget(context_window=30_000, reserve_output=1_000, target_ratio=0.5)
    async with ContextManager(budget) as ctx:
        view = await ctx.prepare(history)
        assert_view_ok(view, history)
        assert ctx.prompt_tokens <= budget.target_tokens * 1.1
        assert ctx.ledger.decisions  # it did compact
    turn = history.index(user("next: read the parser"))
    assert all(m in view for m in history[turn:])


def _step(cid: str, lines: int, *, thinking: bool = False) -> list[Message]:
    """One read and its result of ``lines`` lines; with signed thinking, if asked."""
    body = "\n".join(f"line {i} of output {cid}" for i in range(lines))
    blocks: tuple[ThinkingBlock, ...] = (ThinkingBlock(f"plan {cid}", f"sig-{cid}"),)
    return [
        AssistantMessage(
            (*(blocks if thinking else ()), call(cid, path=f"src/{cid}.py")), "tool_use"
        ),
        result(cid, body),
    ]


async def test_a_landing_above_the_trigger_still_gives_way_to_the_target() -> None:
    # Found by hostile run DR: cutting the newest complete turn's output took a landing from
    # above the trigger to just under it, so the comforts did not give way, and the call
    # rewrote the cached prefix to free almost nothing: another rewrite came two calls later.
    # Above the trigger giving way takes the prompt to the target, as it did. (The call
    # that brings a huge result only cuts it: back under the budget, it rewrites nothing.)
    history = [user("task: speed up src/x.py")]
    for n in range(3):
        history += _step(f"old{n}", 40)
    history += [assistant(text="the parser is slow in lex()"), user("now fix lex()")]
    for n in range(4):
        history += _step(f"loop{n}", 190, thinking=True)  # signed: the loop is not dropped
    budget = Budget(context_window=12_000, reserve_output=1_000)
    async with ContextManager(budget) as ctx:
        await ctx.prepare(history)
        landings, rewrites = [], 0
        for k in range(12):
            sent, n = ctx._sent, len(ctx.ledger)
            history += _step(
                "big" if k == 0 else f"more{k}", 3000 if k == 0 else 190, thinking=True
            )
            assert_view_ok(await ctx.prepare(history), history)
            if any(d.at.index < sent for d in ctx.ledger.decisions[n:]):
                rewrites += 1
                landings.append(ctx.prompt_tokens)
            elif k == 0:
                assert budget.trigger_tokens < ctx.prompt_tokens <= budget.limit
        assert rewrites == len(landings) == 2
        assert all(t <= budget.target_tokens * 1.5 for t in landings)


async def test_a_rewrite_lands_deeper_by_cutting_the_loop_s_earlier_output() -> None:
    # Found by hostile run DV: in a 10k window, each step reading a 3,000-line file, the
    # rewrites landed at 5.6k of a 900 target, held there by the running loop's recent
    # steps (their output at tier 1's 200 lines): the next result crossed the budget again,
    # a rewrite every other call. A rewrite now cuts the loop's earlier output to a quarter
    # of tier 1's limits too (the newest result, just asked for, stays): deeper, rarer.
    history = [user("task: speed up src/x.py")]
    for n in range(3):
        history += _step(f"c{n}", 30)
    history += [assistant(text="the parser is slow in lex()"), user("now fix lex()")]
    budget = Budget(context_window=10_000, reserve_output=1_000)
    async with ContextManager(budget, recall=MemoryRecallStore(), session_id="s") as ctx:
        await ctx.prepare(history)
        landings = []
        for k in range(12):
            sent, n = ctx._sent, len(ctx.ledger)
            history += _step(f"s{k}", 3000)
            view = await ctx.prepare(history)
            assert_view_ok(view, history)
            if any(d.at.index < sent for d in ctx.ledger.decisions[n:]):
                landings.append(ctx.prompt_tokens)
                newest = text_of(view[-1].content)  # tier 1's cut of it, not the quarter's
                assert len(newest.splitlines()) > 50
    assert 1 <= len(landings) <= 3
    assert all(t < 0.4 * budget.limit for t in landings)


@pytest.mark.parametrize("arrives", ["alone", "steered", "with_a_step_after"])
async def test_a_huge_new_result_cut_under_the_budget_rewrites_nothing_sent(arrives: str) -> None:
    # Found by hostile run DS (4): a step whose new result alone passed the budget had it
    # cut (not sent: no cache write), and then the tiers went on to the target, dropping
    # the step before behind the marker: a rewrite of the cached prefix on every such call,
    # and the thrash warning. Hostile run DV: the same when a hook's text follows the result,
    # or a second step does (a caller that skipped a model call's prepare).
    history = [user("task: speed up src/x.py")]
    for n in range(3):
        history += _step(f"c{n}", 150)
    history += [assistant(text="the parser is slow in lex()"), user("now fix lex()")]
    budget = Budget(context_window=20_000, reserve_output=1_000)
    events: list[object] = []
    async with ContextManager(budget) as ctx:
        ctx.subscribe(events.append)
        await ctx.prepare(history)
        rewrites = 0
        for k in range(11):
            sent, n = ctx._sent, len(ctx.ledger)
            history += _step(f"s{k}", 3000)
            if arrives == "steered":
                history += [user(f"(hook: lint ok {k})")]
            elif arrives == "with_a_step_after":
                history += _step(f"t{k}", 5)
            view = await ctx.prepare(history)
            assert_view_ok(view, history)
            new = ctx.ledger.decisions[n:]
            assert any(d.at.index >= sent and d.reason == "truncate" for d in new)
            rewrites += any(d.at.index < sent for d in new)
            assert ctx.prompt_tokens <= budget.limit
    assert rewrites == 1  # once the cut results themselves fill the budget
    assert not [e for e in events if isinstance(e, CompactionWarning)]


async def test_cutting_only_what_was_not_sent_leaves_the_sent_turn_as_it_was() -> None:
    # Found by hostile run DR: a call over the limit only by its new result, which tier 1 cut,
    # also cut the newest complete turn's output, rewriting the cached prefix in a call that
    # would not have.
    history = [user("task: speed up src/x.py")]
    for n in range(3):
        history += _step(f"c{n}", 150)
    history += [assistant(text="the parser is slow in lex()"), user("now fix lex()")]
    history += [assistant(call("new", path="src/lex.py"))]
    budget = Budget(context_window=20_000, reserve_output=1_000)
    async with ContextManager(budget) as ctx:
        first = await ctx.prepare(history)
        sent = ctx._sent
        history += [result("new", "\n".join(f"lex line {i}" for i in range(3000)))]
        view = await ctx.prepare(history)
        assert_view_ok(view, history)
        assert [d.at.index for d in ctx.ledger.decisions] == [len(history) - 1]
    assert view[:sent] == first[:sent]


def _sizings(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One item for each time the tiers size cutting output before the running loop shorter
    (`_deep_enough` sparing the loop), which reads every original in the view."""
    from agentctx.strategies import deterministic

    sized: list[int] = []
    real = deterministic._deep_enough

    def counted(*args: Any, **kwargs: Any) -> object:
        ctx, spare = args[0], args[-1]
        if spare and min(spare) == ctx.in_flight_start():
            sized.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(deterministic, "_deep_enough", counted)
    return sized


async def test_a_turn_cut_to_the_floor_is_not_sized_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # Found by hostile run DR: once the newest complete turn's output was at the floor, every
    # later deciding call sized cutting it again, reading each original (twice as slow at 10k
    # messages). Nothing left to cut, it is not sized.
    sized = _sizings(monkeypatch)
    history = [user("task: audit the repo"), user("read every file")]
    for n in range(200):
        history += _step(f"c{n}", 30)
    history += [assistant(text="read them all"), user("now fix lex()")]
    budget = Budget(context_window=60_000, reserve_output=1_000)
    async with ContextManager(budget) as ctx:
        await ctx.prepare(history)
        calls = []
        for k in range(12):
            history += _step(f"s{k}", 1_600, thinking=True)
            sent, n, before = ctx._sent, len(ctx.ledger), len(sized)
            view = await ctx.prepare(history)
            assert_view_ok(view, history)
            rewrote = any(d.at.index < sent for d in ctx.ledger.decisions[n:])
            calls.append((rewrote, len(sized) - before))
    # (A call that only cuts its own new result, back under the budget, sizes nothing; the
    # running loop's steps, new on each call, are sized apart.)
    deciding = [s for rewrote, s in calls if rewrote]
    assert len(deciding) >= 2 and not any(deciding[1:])
    assert not any(s for rewrote, s in calls if not rewrote)


def _write(cid: str, chars: int) -> list[Message]:
    """A write of ``chars`` characters of minified code (one line) and its short result."""
    content = ("const table = [" + ", ".join(str(i * 7919 % 100003) for i in range(chars)))[:chars]
    return [assistant(call(cid, "write", path=f"src/{cid}.js", content=content)), result(cid, "ok")]


async def test_arguments_tier_1_cut_are_cut_again_when_the_budget_needs_it() -> None:
    # Found by hostile run DS: twelve writes of 10,000 characters in the newest complete turn
    # were cut to 2,000 each and never again: `BudgetExceededError`, saying the protected
    # messages alone were over the budget, where twelve writes of 1,990 characters fit. An
    # argument already cut is cut again from the original, as a result is.
    history = [user("task: write the tables")]
    for n in range(12):
        history += _write(f"w{n}", 10_000)
    history += [assistant(text="wrote them"), user("now run the tests")]
    budget = Budget(context_window=10_000, reserve_output=1_000)
    async with ContextManager(budget, recall=MemoryRecallStore(), session_id="s") as ctx:
        view = await ctx.prepare(history)
        assert_view_ok(view, history)
        assert ctx.prompt_tokens <= budget.limit
    for m in view:
        if isinstance(m, AssistantMessage):
            for c in m.tool_calls:
                assert len(c.arguments["content"]) < 2_000


async def test_the_recall_tool_s_page_named_by_its_call_alone_is_not_sized_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Found by hostile run DS: a recalled page whose result names no tool (its call does) was
    # taken for output the kept turn's cut could shorten, so each call sized the cut again,
    # reading every original, to leave the page (exempt) as it was.
    sized = _sizings(monkeypatch)
    page = "\n".join(f"recalled line {i}" for i in range(150))
    history: list[Message] = [
        user("task: fix lex()"),
        assistant(call("r0", "recall_context", id="ctx-0123456789abcdef")),
        ToolResultMessage("r0", (TextBlock(page),), None, False),
        assistant(text="recalled it"),
        user("go on"),
    ]
    now = [0.0]
    budget = Budget(context_window=20_000, reserve_output=1_000)
    async with ContextManager(budget, recall=MemoryRecallStore(), clock=lambda: now[0]) as ctx:
        for k in range(12):
            history += _step(f"s{k}", 100)
            now[0] += 400  # a cold cache: each call may compact
            view = await ctx.prepare(history)
    assert not sized
    assert any(isinstance(m, ToolResultMessage) and text_of(m.content) == page for m in view)


async def test_a_briefing_splice_lands_as_deep_as_the_tiers_would() -> None:
    # Found by hostile run DS: the tiers `LlmCompaction` runs on the tail before a splice took
    # the call for one that rewrote nothing sent (the splice is taken after them), so they
    # left the newest complete turn's output whole: the splice landed just under the trigger
    # and the next rewrite came 16 calls after, not 32.
    from agentctx import Chain, LlmCompaction
    from agentctx.testing import ScriptedSummarizer

    history = [user("task: speed up the parser")]
    for t in range(12):
        history += [*_step(f"o{t}", 40), assistant(text=f"answer {t}"), user(f"question {t + 1}")]
    for n in range(4):
        history += _step(f"k{n}", 150)
    history += [assistant(text="the parser is slow in lex()"), user("now fix lex()")]
    briefing = (
        "## Goal\nShip.\n## Constraints\nKeep the API.\n## Decisions\nUse LALR.\n"
        "## Files touched\nsrc/parser.py\n## Open items\nWrite tests."
    )
    budget = Budget(context_window=16_000, reserve_output=1_000)
    strategy = Chain(
        [
            LlmCompaction(ScriptedSummarizer(default=briefing), fallback=DeterministicCompaction()),
            DeterministicCompaction(),
        ]
    )
    landings = []
    async with ContextManager(budget, strategy=strategy, recall=MemoryRecallStore()) as ctx:
        for k in range(60):
            history += _step(f"s{k}", 30, thinking=True)
            sent, n = ctx._sent, len(ctx.ledger)
            view = await ctx.prepare(history)
            assert_view_ok(view, history)
            if any(d.at.index < sent for d in ctx.ledger.decisions[n:]):
                landings.append(ctx.prompt_tokens)
            await anyio.sleep(0.01)
    # 10,981 of a trigger at 11,250 before, and three rewrites in the sixty calls.
    assert landings and landings[0] < 0.75 * budget.trigger_tokens
    assert len(landings) <= 2


# -- hostile input: arguments the model wrote; paths in model-written text --------------------


async def test_arguments_that_are_no_json_object_are_cut_to_meet_the_budget() -> None:
    # Found by the hostile run: a write cut off at the output limit (arguments that are no
    # JSON object) went back as written, 48k tokens counted as `{}`; counted, tier 1 had no
    # argument to cut and the budget could not be met. It cuts the string the model wrote.
    import json

    from agentctx.adapters.openai_chat import to_openai_chat
    from agentctx.tokens import MessageCounter

    raw, history = cut_off_write(2500)
    budget = Budget(context_window=40_000, reserve_output=4_000)
    async with ContextManager(budget, recall=MemoryRecallStore()) as ctx:
        view = await ctx.prepare(history)
        assert_view_ok(view, ctx.raw)
    sent = to_openai_chat(view)[1]["tool_calls"][0]["function"]["arguments"]
    arguments = json.loads(sent)
    assert list(arguments) == ["arguments"]
    assert re.search(r"chars truncated; recall_context id=ctx-\w+ \.\.\.\]", arguments["arguments"])
    assert arguments["arguments"].startswith(raw[:500])
    assert len(sent) < len(raw) // 20
    assert MessageCounter(lazy=False).estimate_prompt(view) < budget.limit


async def test_cut_arguments_name_their_recall_id_in_the_view() -> None:
    """Found by a hostile run: tier 1 stored a long argument's original under a recall id that
    nothing in the view named (tool results' markers did), so the model could not read it
    back."""
    import json

    body = "\n".join(f"line {i}: x = compute({i})  # some code here" for i in range(3000))
    history = [
        user("task: write the big file"),
        assistant(call("c1", "write", path="big.py", content=body)),
        result("c1", "Wrote 3000 lines", "write"),
        assistant(text="done"),
        user("now something else"),
    ]
    async with ContextManager(
        Budget(context_window=20_000, reserve_output=2_000), recall=MemoryRecallStore()
    ) as ctx:
        view = await ctx.prepare(history)
        assert_view_ok(view, ctx.raw)
        (decision,) = ctx.ledger.decisions
        shown = view[1].content[0].arguments["content"]
        assert decision.recall_id and f"recall_context id={decision.recall_id}" in shown
        page = await ctx.recall(decision.recall_id, 0, 10**7)
        assert json.loads(page.partition("\n")[2]) == {"path": "big.py", "content": body}


async def test_an_argument_its_cut_would_not_shorten_stays_as_it_is() -> None:
    """Found by a hostile run: with a small ``max_argument_chars`` the marker (a recall id in
    it) was longer than the argument it stood for, and every call's arguments grew."""
    history: list[Message] = [user("task")]
    for n in range(40):
        tags = ["alpha", "beta", "gamma", "delta"]
        history += [assistant(call(f"c{n}", "edit", tags=tags)), result(f"c{n}", "x" * 2000)]
    history += [assistant(text="done"), user("next")]
    strategy = DeterministicCompaction(max_argument_chars=30)
    async with ContextManager(
        Budget(context_window=20_000, reserve_output=1_000),
        strategy=strategy,
        recall=MemoryRecallStore(),
    ) as ctx:
        view = await ctx.prepare(history)
        assert_view_ok(view, ctx.raw)
        assert view[1].content[0].arguments == {"tags": ["alpha", "beta", "gamma", "delta"]}
        assert not any(d.reason == "truncate" and d.at.index % 2 for d in ctx.ledger.decisions)


@pytest.mark.parametrize(
    "value",
    [
        [f"todo item {i}" for i in range(3000)],
        {f"key_{i}": i for i in range(3000)},
    ],
)
async def test_a_long_list_or_object_argument_is_cut_to_meet_the_budget(value: object) -> None:
    """Found by a hostile run: tier 1 cut string arguments only, so the newest step's list of
    3000 items (17k tokens) stayed whole, and a 6000-token budget was declared unmeetable,
    the error blaming "a custom strategy". A list or object is cut as its JSON text."""
    import json

    from agentctx.tokens import MessageCounter

    history = [
        user("task: plan the work"),
        assistant(call("c1", "write_todos", path="todo.md", items=value)),
        result("c1", "ok", "write_todos"),
    ]
    budget = Budget(context_window=8_000, reserve_output=2_000)
    async with ContextManager(budget, recall=MemoryRecallStore()) as ctx:
        view = await ctx.prepare(history)
        assert_view_ok(view, ctx.raw)
        # Cut, then cut again from the original as giving way goes down to the target.
        decision = ctx.ledger.decisions[-1]
        arguments = view[1].content[0].arguments
        assert arguments["path"] == "todo.md"  # short ones stay as they were
        items = arguments["items"]
        assert isinstance(items, str)
        assert items.startswith(json.dumps(value, separators=(",", ":"))[:100])
        assert f"recall_context id={decision.recall_id}" in items
        assert MessageCounter(lazy=False).estimate_prompt(view) < budget.limit


@given(st.text(alphabet="ab./-_1 é/x", max_size=60))
@settings(max_examples=3000, deadline=None)
def test_paths_in_finds_what_the_path_pattern_finds(text: str) -> None:
    import re

    from agentctx.strategies.trail import paths_in

    pattern = re.compile(r"(?:[\w.-]+/)+[\w.-]+\.\w{1,5}")
    assert paths_in(text) == pattern.findall(text)


@pytest.mark.parametrize("text", ["a/" * 200_000, "a.b/" * 100_000 + "/", "x/." * 100_000])
def test_paths_in_reads_a_long_run_of_path_characters_once(text: str) -> None:
    # Found by the hostile run: the pattern backtracked from every start of such a run, so
    # an assistant text imitating a condensed line made `prepare` quadratic (10 s at 32 KB).
    from agentctx.strategies.trail import paths_in

    with returns_within(5):  # minutes, read with the pattern
        paths_in(text)


async def test_a_summary_of_the_callers_that_starts_like_a_marker_is_not_taken_for_one() -> None:
    """Found by hostile testing: markers were known by their text alone, so a summary of the
    caller's starting with the marker's text (one carried over from an earlier run) was
    dropped by tier 3 as a marker: left out of the new recall entry as recallable already,
    its content was in neither the view nor the store, and the ids its first line named
    (made up, here) went on into the new marker."""
    note = "NOTE FROM AN EARLIER SESSION: the deploy target is staging-7, never prod"
    fake = "ctx-0123456789abcdef"
    carried = SummaryMessage(f"{COMPACTION_MARKER} (recall_context id={fake})\n{note}")
    history: list[Message] = [user("the task"), carried]
    for t in range(30):
        history += [*tool_turn(t, lines=150), assistant(text=f"done {t}"), user(f"q{t}")]
    store = MemoryRecallStore()
    async with ContextManager(
        Budget(context_window=26_000), recall=store, session_id="s", on_over_budget="send"
    ) as ctx:
        view = await ctx.prepare(history)
        assert ctx.ledger.decisions
        assert_view_ok(view, history)
        shown = "\n".join(
            m.text if isinstance(m, SummaryMessage) else text_of(m.content)  # type: ignore[union-attr]
            for m in view
        )
        recalled = [await ctx.recall(rid, 0, 10**9) for rid in set(RECALL_ID.findall(shown))]
    assert note in shown or any(note in text for text in recalled)
    markers = [m for m in view if m is not carried and isinstance(m, SummaryMessage)]
    assert markers and not any(fake in m.text for m in markers)


def _lines(n: int, tag: str) -> str:
    return "\n".join(f"{tag} {i:05d} " + "x" * 30 for i in range(n))


@pytest.mark.parametrize("kind", ["deterministic", "pipeline", "llm"])
async def test_a_result_too_large_to_send_alone_is_cut_before_older_history_is_touched(
    kind: str,
) -> None:
    """Found by a hostile run (K, findings 1 and 2): a new result over the limit by itself
    is cut down in the call it arrives in whatever else is done, but the tiers sized their
    work on it whole, and dropped an older turn in the cached prefix (the pipeline first
    expired the newest complete turn's output too): a cache rewrite, and lost context, for
    nothing. It is now cut first, and what else is needed is sized after."""
    from agentctx import Chain, LlmCompaction, ToolOutputPipeline
    from agentctx.testing.scripted import Outcome, ScriptedSummarizer

    strategy = {
        "deterministic": DeterministicCompaction,
        "pipeline": lambda: Chain([ToolOutputPipeline(), DeterministicCompaction()]),
        "llm": lambda: Chain(
            [LlmCompaction(ScriptedSummarizer([Outcome.hang()])), DeterministicCompaction()]
        ),
    }[kind]()
    budget = Budget(context_window=6_000, reserve_output=1_000, target_ratio=0.5)
    history = [
        user("the task: fix the bug"),
        user("question A"),
        assistant(call("a1")),
        result("a1", _lines(20, "A")),
        assistant(text="answer A"),
        user("question B"),
        assistant(call("b1")),
        result("b1", _lines(25, "B")),
        assistant(text="answer B"),
        user("build it"),
    ]
    async with ContextManager(budget, strategy=strategy) as ctx:
        await ctx.prepare(history)
        sent = len(history)
        history += [
            assistant(call("c1", "bash", command="make")),
            result("c1", "\n".join(f"BUILD {i:05d}" for i in range(1_400)), "bash"),
        ]
        view = await ctx.prepare(history)
        assert_view_ok(view, ctx.raw)
        assert [d.at.index for d in ctx.ledger.decisions] == [sent + 1]  # the new result only
        assert view[:sent] == history[:sent]  # the cached prefix as it was sent
        assert ctx.prompt_tokens <= budget.target_tokens


@pytest.mark.parametrize(
    ("target_ratio", "fill", "compacts"),
    [
        (0.1, 0.2, False),  # under three targets: a cold cache alone is no reason
        (0.1, 0.4, True),  # over three targets (under the trigger): the rewrite costs no write
        (0.5, 0.6, False),  # three targets over the limit: under the trigger
        (0.5, 0.9, True),  # over the trigger, under the limit (found by hostile run K: never)
    ],
)
async def test_a_cold_cache_compacts_over_three_targets_or_else_the_trigger(
    target_ratio: float, fill: float, compacts: bool
) -> None:
    budget = Budget(context_window=12_000, reserve_output=2_000, target_ratio=target_ratio)
    now = [0.0]
    async with ContextManager(budget, clock=lambda: now[0]) as ctx:
        history = [user("the task")]
        n = 0
        while ctx.prompt_tokens < fill * budget.limit:
            history += [user(f"question {n}"), *tool_turn(n, lines=30), assistant(text="done")]
            n += 1
            await ctx.prepare(history)
            now[0] += 10
        assert not ctx.ledger.decisions and ctx.prompt_tokens < budget.limit
        now[0] += 301  # past cold_cache_seconds: nothing cached any more
        history.append(user("go on"))
        await ctx.prepare(history)
        assert bool(ctx.ledger.decisions) is compacts


@pytest.mark.parametrize("new", ["one result", "just under", "a batch", "an exempt result"])
@pytest.mark.parametrize("kind", ["deterministic", "pipeline"])
async def test_results_that_keep_the_prompt_over_the_trigger_are_cut_before_older_history(
    kind: str, new: str
) -> None:
    """Found by hostile runs K2 and L: the newest step's results, under the limit (0.8 of it,
    each), came with the prompt over the limit. Left whole while the tiers made room, they
    had them drop 11 of 12 cached turns (the pipeline expired the newest complete turn's
    output first), find the prompt still above the trigger, and cut the results anyway to
    give way: landing at a fifth of the target. So it went for one result just under the
    prompt's ceiling without the protected messages counted, for a parallel batch each of
    whose results was under it, and for an exempt tool's result (giving way cuts that too).
    Results that with what no tier drops hold the prompt above the trigger are now cut
    first; what else lands the prompt at the target is sized after."""
    from agentctx import Chain, ToolOutputPipeline

    def output(lines: int, tag: str) -> str:
        return "\n".join(
            f"{tag} {i}: value_{i * 7919 % 99991} = f(x{i}, y{i})" for i in range(lines)
        )

    strategy = (
        DeterministicCompaction()
        if kind == "deterministic"
        else Chain([ToolOutputPipeline(), DeterministicCompaction()])
    )
    budget = Budget(context_window=60_000, reserve_output=10_000, target_ratio=0.6)
    history = [user("the task: implement the feature")]
    for k in range(12):  # old turns, each reading 150 lines (under the tiers' 200)
        history += [
            user(f"request {k}"),
            assistant(call(f"o{k}")),
            result(f"o{k}", output(150, f"old{k}")),
            assistant(text=f"answer {k}"),
        ]
    history.append(user("run the tests"))
    name = "recall_context" if new == "an exempt result" else "bash"
    sizes = {"just under": [1_950], "a batch": [1_050, 1_050]}
    lines = sizes.get(new, [2_300])
    calls = [call(f"n{k}", name) for k in range(len(lines))]
    results = [result(f"n{k}", output(n, f"new{k}"), name) for k, n in enumerate(lines)]
    async with ContextManager(budget, strategy=strategy) as ctx:
        await ctx.prepare(history)
        newest = history[-3]  # the newest complete turn's output
        counted = sum(map(ctx.counter.count_full, results))
        if new in sizes:  # over the trigger only with what no tier drops
            assert counted < budget.trigger_tokens < counted + 3_000
        history += [assistant(*calls), *results]
        view = await ctx.prepare(history)
        assert_view_ok(view, ctx.raw)
        assert newest in view
        assert not [s for s in ctx.ledger.spans if s.reason == "drop"]  # condensed at most
        assert ctx.prompt_tokens >= budget.target_tokens * 0.8
