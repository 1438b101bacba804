"""The acceptance cases of the TypeScript seed's tool-output passes, ported.

Where a seed case encoded a defect of that implementation, the test keeps the case's intent,
checks the fixed behaviour, and says so in its docstring.
"""

from __future__ import annotations

import gc
import hashlib
import math
import random
import re
from typing import Any

import anyio.lowlevel
import pytest

from agentctx.budget import Budget
from agentctx.events import BudgetExceeded, ContextCompacted, Event
from agentctx.importers import load_transcript
from agentctx.ledger import ReplaceResult, shown_positions
from agentctx.manager import ContextManager
from agentctx.messages import (
    AssistantMessage,
    ImageBlock,
    Message,
    SummaryMessage,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
    canonical_json,
    text_of,
)
from agentctx.recall import MemoryRecallStore
from agentctx.replay import replay
from agentctx.strategies import pipeline as pipeline_module
from agentctx.strategies import pipeline_run
from agentctx.strategies.deterministic import COMPACTION_MARKER, DeterministicCompaction
from agentctx.strategies.pipeline import (
    BudgetPass,
    CondensePass,
    EmergencyPass,
    ExpiryPass,
    MicroCompact,
    ToolOutputPipeline,
)
from agentctx.strategies.trail import condensed_line, marker_with_trail
from agentctx.strategy import Chain
from agentctx.testing import assert_view_ok, synthetic_session
from agentctx.tokens import MessageCounter

from .corpus import corpus_file

NOW = 1_800_000_000.0
MIN = 60.0
BIG = Budget(context_window=2_000_000, reserve_output=1_000)


def ts(age_min: float) -> dict[str, Any]:
    return {"timestamp": int((NOW - age_min * MIN) * 1000)}


def u(text: str, age: float = 0) -> UserMessage:
    return UserMessage((TextBlock(text),), ts(age))


def a(
    *ids: str, age: float = 0, thinking: str | None = None, name: str = "read"
) -> AssistantMessage:
    blocks: list[Any] = [ThinkingBlock(thinking, "sig")] if thinking else []
    blocks += [ToolCall(i, name, {"path": f"src/{i}.ts"}) for i in ids]
    if not blocks:
        blocks = [TextBlock("ok")]
    return AssistantMessage(tuple(blocks), "tool_use" if ids else "stop", extra=ts(age))


def r(i: str, text: str, age: float = 0, name: str = "read") -> ToolResultMessage:
    return ToolResultMessage(i, (TextBlock(text),), name, False, ts(age))


def pipeline(**kw: Any) -> ToolOutputPipeline:
    kw.setdefault("clear_at_least", 0)
    return ToolOutputPipeline(**kw)


async def run(history: list[Message], strategy: ToolOutputPipeline, **kw: Any) -> list[Message]:
    kw.setdefault("recall", MemoryRecallStore())
    async with ContextManager(
        kw.pop("budget", BIG), strategy=strategy, clock=lambda: NOW, session_id="s", **kw
    ) as ctx:
        view = await ctx.prepare(history)
    assert_view_ok(view, history)
    return view


def txt(m: Message) -> str:
    assert isinstance(m, ToolResultMessage)
    return text_of(m.content)


async def test_ac1_expired_results_are_replaced_protected_turns_kept() -> None:
    """Changed: the seed's expired result is 17 characters, which a placeholder would grow;
    here it is longer (a short one stays: `test_an_expired_result_shorter_than_...`)."""
    file_a = "content of file A\n" * 10
    history = [
        u("task 1", 40),
        a("c1", age=40),
        r("c1", file_a, 35),
        u("task 2", 20),
        a("c2", age=20),
        r("c2", "content of file B", 15),
        u("task 3", 1),
    ]
    store = MemoryRecallStore()
    view = await run(history, pipeline(l0=ExpiryPass(keep_recent=0)), recall=store)
    expired = txt(view[2])
    assert "Tool result expired" in expired and "content of file A" not in expired
    assert "read(path=src/c1.ts)" in expired  # the artifact trail survives
    rid = re.search(r"ctx-[0-9a-f]{16}", expired)
    assert rid and store.get("s", rid.group()) == file_a
    assert txt(view[5]) == "content of file B"


@pytest.mark.parametrize(
    "passes",
    [
        {"l0": ExpiryPass(keep_recent=0)},
        {"l0": None, "mc": MicroCompact(gap_seconds=600, keep_recent=1)},
        {"l0": None, "l2": EmergencyPass(usage_fraction=0.001, protect_recent_turns=2)},
    ],
    ids=["l0", "mc", "l2"],
)
async def test_an_expired_result_that_costs_less_than_its_placeholder_stays(
    passes: Any,
) -> None:
    """Found by hostile testing (FB, DY 3): an empty, one-word or short result (a `git
    status`, an edit's confirmation) was expired to a placeholder costing more tokens than
    itself, which grew the prompt and pointed recall at next to nothing. Such a result now
    stays, whichever pass expires it, and its call's long arguments still go; a short result
    denser than the placeholder (CJK, hex: DY 2) is still replaced."""
    long_write = {"path": "src/w.ts", "content": "line\n" * 2000}
    status = "On branch main\nChanges not staged for commit:\n\tmodified:   src/app.py\n"
    history: list[Message] = [
        u("task 1", 40),
        a("c1", age=40),
        r("c1", "ok", 35),
        a("c2", age=39),
        r("c2", "", 35),
        AssistantMessage((ToolCall("c3", "write", long_write),), "tool_use", extra=ts(38)),
        r("c3", "Wrote 10000 bytes", 35, "write"),
        a("c4", age=37),
        r("c4", status, 35, "bash"),
        a("c5", age=37),
        r("c5", "content of file A " * 20, 35),
        a("c6", age=37),
        r("c6", "配置管理信息系统的设计与实现方法研究" * 8, 35),  # 144 characters, 80 tokens
        a("c7", age=37),
        r("c7", "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08" * 2, 35),
        u("task 2", 20),
        a("c9", age=20),
        r("c9", "content of file B", 15),
        u("task 3", 1),
    ]
    view = await run(history, pipeline(**passes))
    kept = [txt(view[j]) for j in (2, 4, 6, 8)]
    assert kept == ["ok", "", "Wrote 10000 bytes", status]
    assert all("result expired:" in txt(view[j]) for j in (10, 12, 14))
    call = view[5]
    assert isinstance(call, AssistantMessage)
    assert "[cleared: 10000 chars" in call.tool_calls[0].arguments["content"]


async def test_a_cold_compaction_of_short_results_does_not_grow_the_prompt() -> None:
    """Found by hostile testing (DY 3): a hundred one-line edit confirmations, then an idle
    gap: micro-compaction expired every one into a longer placeholder, and the event said
    5,049 -> 5,828 tokens."""
    history: list[Message] = [u("task", 120)]
    for k in range(100):
        history += [a(f"e{k}", age=110 - k / 100), r(f"e{k}", f"Edited src/m{k}.py: 1 line", 109)]
    events: list[Event] = []
    mc = pipeline(l0=None, l2=None, mc=MicroCompact(gap_seconds=600, keep_recent=2))
    async with ContextManager(
        BIG, strategy=mc, clock=lambda: NOW, recall=MemoryRecallStore()
    ) as ctx:
        ctx.subscribe(events.append)
        view = await ctx.prepare([*history, u("next", 0)])
        assert_view_ok(view, ctx.raw)
    grown = [
        e for e in events if isinstance(e, ContextCompacted) and e.tokens_after > e.tokens_before
    ]
    assert not grown, grown
    assert sum("expired" in txt(m) for m in view if isinstance(m, ToolResultMessage)) == 0


async def test_short_results_that_stay_do_not_wake_the_passes() -> None:
    """Found by hostile testing (DY 1): short results that stay were counted as what a stale
    batch could free, and woke the passes as each came of age: 12x the runs on a session of
    1,500 calls where most results are short."""
    runs = [0]
    real = pipeline_run.Run.propose_all

    def counted(self: Any) -> None:
        runs[0] += 1
        real(self)

    async def session(short: float) -> int:
        runs[0] = 0
        rng, clock = random.Random(1), [NOW]
        budget = Budget(context_window=2_000_000, hard_budget=60_000)
        async with ContextManager(
            budget,
            strategy=ToolOutputPipeline(),
            clock=lambda: clock[0],
            recall=MemoryRecallStore(),
        ) as ctx:
            history: list[Message] = [UserMessage((TextBlock("Task: fix the cache"),), ts(0))]
            for n in range(1, 1501):
                clock[0] += 20
                stamp = {"timestamp": int(clock[0] * 1000)}
                if n % 15 == 0:
                    new: list[Message] = [
                        AssistantMessage((TextBlock("done with that"),), "stop", extra=stamp),
                        UserMessage((TextBlock(f"Next step {n}"),), stamp),
                    ]
                else:
                    body = (
                        rng.choice(["", "ok", "Wrote 120 bytes", "done", "File saved."])
                        if rng.random() < short
                        else "\n".join(f"line {k} of m{n}: v = {k * n}" for k in range(60))
                    )
                    call = ToolCall(f"c{n}", "read", {"path": f"src/m{n}.py"})
                    new = [
                        AssistantMessage((call,), "tool_use", extra=stamp),
                        ToolResultMessage(f"c{n}", (TextBlock(body),), "read", False, stamp),
                    ]
                history = await ctx.prepare([*history, *new])
                ctx.observe(Usage(input_tokens=ctx.prompt_tokens))
                await anyio.lowlevel.checkpoint()
        return runs[0]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pipeline_run.Run, "propose_all", counted)
        assert await session(0.9) <= 60  # 43 here, 39 before short results stayed, 501 as found


async def test_ac2_user_shell_output_keeps_its_tail() -> None:
    """Changed: the seed truncated even the latest user message; the task and the latest
    user message are never compacted here (docs/invariants.md, "The task survives"), so a
    later prompt follows it."""
    shell = UserMessage(
        (TextBlock("$ cat file.txt\n" + "x" * 10_000),), {"source": "bash_execution"}
    )
    history: list[Message] = [u("task"), shell, a(), u("next")]
    view = await run(history, pipeline())
    out = text_of(view[1].content)  # type: ignore[union-attr]
    assert "[truncated" in out and "Total: 10015 chars" in out and out.endswith("x" * 4000)
    assert "ctx-" in out


async def test_ac3_thinking_of_completed_turns_is_dropped_whole_never_edited() -> None:
    """Changed: the seed rewrote thinking text in the running tool loop and kept the old
    signature; here signed thinking is dropped whole, only in completed turns,
    and the in-flight loop's thinking goes back byte for byte."""
    history = [
        u("task", 30),
        a("c1", age=20, thinking="deep analysis"),
        r("c1", "x", 20),
        a(age=19),
        u("next", 10),
        a("c2", age=6, thinking="current analysis"),
        r("c2", "y", 6),
    ]
    view = await run(history, pipeline())
    assert not any(isinstance(blk, ThinkingBlock) for blk in view[1].content)  # type: ignore[union-attr]
    assert view[5] is history[5]


async def test_ac4_broken_pairing_is_repaired_not_a_reason_to_stop() -> None:
    """Changed: the seed returned the original messages whenever pairing failed, switching
    every pass off for the whole session; here the view is repaired and compaction goes on."""
    history = [
        u("task", 60),
        a("c1", "c2", age=59),
        r("c1", "A" * 1000, 58),
        u("t2", 50),
        r("ghost", "orphan", 50),
        a(age=49),
        u("t3", 1),
        a(age=1),
        u("t4", 0),
    ]
    view = await run(history, pipeline(l0=ExpiryPass(keep_recent=0)))
    assert "Tool result expired" in txt(view[2])


async def test_ac7_condensation_keeps_imports_and_definitions() -> None:
    lines = [f"// head comment line {i}" for i in range(10)]
    lines += ["import { readFile } from 'fs';", "import { parse } from 'path';"]
    lines += ["  return someValueWithALongerNameToPadLength();"] * 100
    lines += [
        "function processData(input: string): string {",
        "export type Config = { debug: boolean };",
    ]
    lines += ["  return someValueWithALongerNameToPadLength();"] * 300
    lines += [f"// tail comment {i}" for i in range(5)]
    content = "\n".join(lines)
    history = [u("read file"), a("c1"), r("c1", content), a(), u("next")]
    view = await run(history, pipeline(l1=CondensePass(protect_recent_turns=0)))
    text = txt(view[2])
    assert text.startswith('[Condensed (recall_context id="ctx-')
    for kept in ("import { readFile }", "function processData", "export type Config", "[..."):
        assert kept in text
    assert len(text) < len(content)


async def test_ac8_emergency_expiry_at_a_usage_fraction() -> None:
    """Changed: the seed compared pi's 0-100 percentage with 0.9, so L2 fired on almost every
    call; usage here is the 0-1 fraction of the budget, computed by agentctx."""
    history = [
        u("t1", 20),
        a("c1", age=20),
        r("c1", "content-1 " * 400, 20),
        u("t2", 10),
        a("c2", age=10),
        r("c2", "content-2", 10),
        u("t3", 5),
        a("c3", age=5),
        r("c3", "content-3", 5),
        u("t4", 1),
    ]
    async with ContextManager(BIG, strategy=pipeline(l2=None), clock=lambda: NOW) as probe:
        await probe.prepare(history)
        probe.counter.refine(probe.raw)  # full estimates, as the manager uses near the budget
        tokens = probe.prompt_tokens
    under = Budget(context_window=2_000_000, hard_budget=int(tokens / 0.95))
    view = await run(history, pipeline(), budget=under)
    assert "Tool result expired" in txt(view[2])
    assert txt(view[5]) == "content-2"
    calm = Budget(context_window=2_000_000, hard_budget=int(tokens / 0.5))
    assert txt((await run(history, pipeline(), budget=calm))[2]).startswith("content-1")


async def test_ac10_every_pass_disabled_returns_the_history() -> None:
    history = [u("hello", 70), a("c1", age=69), r("c1", "big content here", 60), u("x")]
    off = ToolOutputPipeline(mc=None, budget=None, l0=None, l1=None, l2=None)
    view = await run(history, off)
    assert all(x is y for x, y in zip(view, history, strict=True))


def mc_history() -> list[Message]:
    h: list[Message] = [u("task", 70)]
    for k in range(1, 9):
        h += [a(f"c{k}", age=68 - k / 10), r(f"c{k}", f"content-{k}\n" * 20, 67 - k / 10)]
    return [*h, a(age=65)]


@pytest.mark.parametrize("by", ["l0", "l1", "budget"])
async def test_a_result_with_an_image_keeps_its_image_when_its_text_is_replaced(by: str) -> None:
    """Found by hostile testing: a result of text and an image, expired, condensed or
    persisted, came back as the placeholder alone: the image was in neither the view nor
    the recall entry, and nothing said it had been there. Only the text is stored for
    recall; the image stays."""
    image = ImageBlock("image/png", "iVBORw0KGgo" * 200)
    page = "\n".join(f"def line_{k}(): return {k}" for k in range(400))
    shot = ToolResultMessage("c1", (TextBlock(page), image), "screenshot", False, ts(40))
    history = [u("task 1", 40), a("c1", age=40, name="screenshot"), shot]
    history += [u("task 2", 20), a("c2", age=20), r("c2", "content of file B", 15), u("task 3", 1)]
    passes: dict[str, Any] = {"l0": None, "l1": None, "budget": None}
    passes[by] = {
        "l0": ExpiryPass(keep_recent=0),
        "l1": CondensePass(head_lines=2, tail_lines=2, protect_recent_turns=1),
        "budget": BudgetPass(max_chars_per_turn=100),
    }[by]
    store = MemoryRecallStore()
    view = await run(history, pipeline(**passes), recall=store)
    shown = view[2]
    assert isinstance(shown, ToolResultMessage) and shown is not shot
    assert shown.content[1:] == (image,)
    rid = re.search(r"ctx-[0-9a-f]{16}", txt(shown))
    assert rid and store.get("s", rid.group()) == page


async def test_mc_clears_all_but_the_newest_after_an_idle_gap_and_it_sticks() -> None:
    """Changed: the seed's MC fired only on the first call after the gap, so the originals came
    back on the next call and the cache broke twice; here the decision is in
    the ledger and holds on every later call."""
    history = mc_history()
    mc_only = pipeline(budget=None, l0=None, l1=None, l2=None, mc=MicroCompact(keep_recent=5))
    now = [NOW]
    async with ContextManager(BIG, strategy=mc_only, clock=lambda: now[0]) as ctx:
        view = await ctx.prepare(history)
        assert [("Old tool result expired" in txt(view[j])) for j in (2, 4, 6, 8)] == [True] * 3 + [
            False
        ]
        assert txt(view[8]) == "content-4\n" * 20
        now[0] += 5
        later = await ctx.prepare([*history, u("back again")])
        assert later[: len(view)] == view


async def test_mc_does_not_fire_within_the_gap() -> None:
    history = [u("task", 30), a("c1", age=30), r("c1", "content-1", 29), a(age=29)]
    view = await run(history, pipeline(l0=None, l2=None))
    assert txt(view[2]) == "content-1"


async def test_recall_results_are_never_compacted() -> None:
    history: list[Message] = [u("task", 70)]
    for k in range(8):
        history += [
            a(f"c{k}", age=68, name="recall_context"),
            r(f"c{k}", "recalled " * 3000, 67, "recall_context"),
        ]
    history.append(a(age=65))
    view = await run(
        history,
        pipeline(
            l0=ExpiryPass(keep_recent=0, protect_recent_turns=0),
            l1=CondensePass(protect_recent_turns=0),
        ),
    )
    assert all(x is y for x, y in zip(view, history, strict=True))


async def test_budget_persists_the_largest_result_of_a_turn() -> None:
    small, big = "a" * 20_000, "B" * 170_000
    history = [
        u("task"),
        a("c1", "c2", "c3", "c4", "c5"),
        *(r(f"c{k}", small) for k in range(1, 5)),
        r("c5", big),
        a(),
        u("next"),
    ]
    store = MemoryRecallStore()
    view = await run(history, pipeline(l1=None), recall=store)
    text = txt(view[6])
    assert "[Persisted output" in text and "Total: 170000 chars" in text
    assert txt(view[2]) == small
    assert len([k for k in range(2, 7) if txt(view[k]).startswith("[Persisted")]) == 1


async def test_budget_is_per_turn() -> None:
    small = "a" * 20_000
    history = [
        u("t1"),
        a("c1", "c2", "c3"),
        *(r(f"c{k}", small) for k in (1, 2, 3)),
        u("t2"),
        a("c4", "c5", "c6"),
        *(r(f"c{k}", small) for k in (4, 5, 6)),
    ]
    budget_only = pipeline(mc=None, l0=None, l1=None, l2=None)
    view = await run(history, budget_only)
    assert all(x is y for x, y in zip(view, history, strict=True))


async def test_persisted_output_is_byte_identical_on_later_turns() -> None:
    """TC-3-01 and TC-3-02: the seed froze only Budget decisions; here every pass is frozen."""
    big = "X" * 150_000
    cfg = pipeline(budget=BudgetPass(max_chars_per_turn=100_000, preview_chars=100), l1=None)
    turn1: list[Message] = [u("task1"), a("c1"), r("c1", big)]
    async with ContextManager(
        BIG, strategy=cfg, clock=lambda: NOW, recall=MemoryRecallStore()
    ) as ctx:
        v1 = await ctx.prepare(turn1)
        v2 = await ctx.prepare([*turn1, a(), u("task2"), a("c2"), r("c2", "small")])
    assert "[Persisted output" in txt(v1[2]) and v2[2] == v1[2]


async def test_compact_boundary_shields_what_came_before_it() -> None:
    history = [
        u("t0", 120),
        a("c0", age=119),
        r("c0", "old-1", 119),
        u("t1", 110),
        a(age=109),
        SummaryMessage("summary of prior work"),
        a("c3", "c4", "c5", "c6", age=80),
        r("c3", "fresh-1\n" * 20, 79),
        r("c4", "fresh-2\n" * 20, 78),
        r("c5", "fresh-3\n" * 20, 77),
        r("c6", "fresh-4\n" * 20, 76),
        a(age=65),
    ]
    view = await run(history, pipeline(mc=MicroCompact(keep_recent=1), l0=None, l2=None))
    assert txt(view[2]) == "old-1"
    assert [("expired" in txt(view[j])) for j in (7, 8, 9, 10)] == [True, True, True, False]


async def test_l1_protects_recent_turns() -> None:
    big = "line\n" * 3000
    inside = [u("task", 1), a("c1", age=1), r("c1", big), u("followup")]
    assert txt((await run(inside, pipeline()))[2]) == big
    outside = [
        u("task1", 10),
        a("c1", age=10),
        r("c1", big, 9),
        u("task2", 5),
        a("c2", age=5),
        r("c2", "small", 4),
        u("task3", 1),
    ]
    assert txt((await run(outside, pipeline()))[2]).startswith("[Condensed")


async def test_l0_keeps_the_newest_results() -> None:
    history: list[Message] = [u("task", 60)]
    for k, age in enumerate((58, 54, 49, 44, 39, 36, 34, 32), start=1):
        history += [a(f"c{k}", age=age + 1), r(f"c{k}", f"content-{k}\n" * 20, age)]
    history.append(u("end"))
    view = await run(history, pipeline(l0=ExpiryPass(keep_recent=5, protect_recent_turns=0)))
    assert ["expired" in txt(view[2 * k]) for k in range(1, 9)] == [True] * 3 + [False] * 5


async def test_arguments_of_completed_calls_are_cleared_with_their_results() -> None:
    body = "x = 1\n" * 2000
    history = [
        u("task", 60),
        AssistantMessage(
            (ToolCall("w1", "write", {"path": "a.py", "content": body}),), "tool_use", extra=ts(59)
        ),
        r("w1", "wrote a.py", 58, "write"),
        u("t2", 40),
        a(age=39),
        u("t3", 1),
    ]
    view = await run(history, pipeline(l0=ExpiryPass(keep_recent=0)))
    args = view[1].tool_calls[0].arguments  # type: ignore[union-attr]
    assert args["path"] == "a.py" and args["content"].startswith("[cleared: 12000 chars")


async def test_recall_ids_are_deterministic_and_session_scoped() -> None:
    """Changed: the seed drew a random id on every call, so each request
    differed from the last; here ids are content-addressed within the session."""
    file_a = "content of file A\n" * 10
    history = [u("task 1", 40), a("c1", age=40), r("c1", file_a, 35), u("t", 1)]
    cfg = pipeline(l0=ExpiryPass(keep_recent=0, protect_recent_turns=1))
    one, two = await run(history, cfg), await run(history, cfg)
    assert txt(one[2]) == txt(two[2])
    store = MemoryRecallStore()
    async with ContextManager(
        BIG, strategy=cfg, clock=lambda: NOW, recall=store, session_id="other"
    ) as ctx:
        other = await ctx.prepare(history)
    rid = re.search(r"ctx-[0-9a-f]{16}", txt(other[2])).group()  # type: ignore[union-attr]
    assert rid not in txt(one[2])
    assert store.get("s", rid) is None and store.get("other", rid) == file_a


async def test_cache_breaking_decisions_wait_for_a_worthwhile_batch() -> None:
    cfg = ToolOutputPipeline(
        l0=ExpiryPass(keep_recent=0, protect_recent_turns=1), clear_at_least=4000
    )
    h: list[Message] = [u("task 1", 40), a("c1", age=40), r("c1", "A" * 400, 35)]
    async with ContextManager(BIG, strategy=cfg, clock=lambda: NOW) as ctx:
        await ctx.prepare(h)  # sent once: changing it now breaks the prefix cache
        h = [*h, u("t", 34)]
        assert txt((await ctx.prepare(h))[2]) == "A" * 400  # 100 tokens do not pay for a break
        h = [*h, a("c2", age=34), r("c2", "B" * 40_000, 33)]
        assert txt((await ctx.prepare(h))[2]) == "A" * 400
        h = [*h, u("t2", 0)]
        view = await ctx.prepare(h)  # now both are due and together they pay
        assert "expired" in txt(view[2]) and "expired" in txt(view[5])


async def test_a_call_that_takes_nothing_works_on_the_new_messages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What the view's messages say about its structure is kept between calls, and what the
    # passes propose about sent messages (due, but not paying for a rewrite yet) comes from
    # the memo: each recall id is worked out once, and stored only with a decision taken.
    scanned: list[int] = []
    hashed: list[str] = []
    candidate, rid_of = pipeline_run._candidate, pipeline_run.recall_id

    def counting_candidate(*args: Any) -> bool:
        scanned.append(args[3])
        return candidate(*args)

    def counting_rid(session_id: str, content: str) -> str:
        hashed.append(content)
        return rid_of(session_id, content)

    monkeypatch.setattr(pipeline_run, "_candidate", counting_candidate)
    monkeypatch.setattr(pipeline_run, "recall_id", counting_rid)
    now = [NOW]
    cfg = ToolOutputPipeline(clear_at_least=10**9)  # a stale batch never pays here
    store = MemoryRecallStore()

    def stamp() -> dict[str, Any]:
        return {"timestamp": int(now[0] * 1000)}

    history: list[Message] = [UserMessage((TextBlock("the task"),), stamp())]
    async with ContextManager(BIG, strategy=cfg, recall=store, clock=lambda: now[0]) as ctx:
        await ctx.prepare(history)
        idle = 0
        seen: set[int] = set()  # each message is scanned once (a call may skip the passes)
        for k in range(40):
            now[0] += 5 * MIN
            call = ToolCall(f"c{k}", "read", {"path": f"src/m{k}.ts"})
            new: list[Message] = [
                UserMessage((TextBlock(f"step {k}"),), stamp()),
                AssistantMessage((call,), "tool_use", extra=stamp()),
                ToolResultMessage(
                    call.id, (TextBlock(f"src/m{k}.ts\n" + code(120)),), "read", False, stamp()
                ),
            ]
            history = [*history, *new]
            scanned.clear()
            version = ctx.ledger.version
            await ctx.prepare(history)
            if ctx.ledger.version == version and k > 0:
                idle += 1
                assert not seen.intersection(scanned)
                seen.update(scanned)
        assert idle > 30
        assert len(ctx.ledger) == 0 and store.bytes_held == 0  # due, never taken
        assert len(hashed) == len(set(hashed)) > 10  # each expired result hashed once


async def test_a_rewind_that_drops_no_decision_scans_the_view_again() -> None:
    # Found by the hostile sessions (tests/test_properties.py): the scan kept between calls
    # must not outlive a view cut back while the ledger stays as it was.
    shell = UserMessage((TextBlock("$ ls\nsrc"),), {"source": "bash_execution", **ts(0)})
    history: list[Message] = [u("the task"), a(), u("and then"), a(thinking="hm"), shell]
    async with ContextManager(BIG, strategy=pipeline(), clock=lambda: NOW) as ctx:
        await ctx.prepare(history)
        version = ctx.ledger.version
        for cut in (3, 2, 5, 1):
            view = await ctx.prepare(history[:cut])
            assert ctx.ledger.version == version  # nothing to drop: the memo stays
            assert_view_ok(view, history[:cut])
            assert view == history[:cut]


# -- cache-aware scheduling: when a rewrite happens, and how deep it goes ------------------

QUIET = {"mc": None, "l0": None, "l1": None}  # only L2 and the budget decide below


def code(lines: int) -> str:
    """Output whose quick token estimate is close to its full one."""
    return "".join(f"const value{i} = compute(input{i}, {i});\n" for i in range(lines))


def turns(first: int, last: int, lines: int, age: float = 90) -> list[Message]:
    out: list[Message] = []
    for k in range(first, last + 1):
        body = f"contents of src/c{k}.ts\n" + code(lines)
        out += [u(f"step {k}", age - k), a(f"c{k}", age=age - k), r(f"c{k}", body, age - k)]
    return out


async def tokens_of(history: list[Message]) -> int:
    """The full estimate of ``history``'s prompt, as the pipeline decides on it."""
    inert = ToolOutputPipeline(mc=None, budget=None, l0=None, l1=None, l2=None, fallback=None)
    async with ContextManager(BIG, strategy=inert, clock=lambda: NOW) as probe:
        await probe.prepare(history)
        probe.counter.refine(probe.raw)
        return probe.prompt_tokens


def limited(tokens: int) -> Budget:
    return Budget(context_window=2_000_000, hard_budget=tokens)


async def test_a_rewrite_landing_under_the_trigger_cuts_the_loop_to_a_quarter_not_a_few_lines() -> (
    None
):
    """One running tool loop of equal reads, over the budget: the fallback tiers drop what
    they may, and the newest steps (their ``keep_recent_steps``) hold the prompt above the
    target, under the trigger. This rewrite breaks the cache anyway: the loop's earlier reads
    are cut, each with its recall id, to no less than a quarter of tier 1's limits (50 of
    their 100 lines), so the next rewrite is further away; the newest read, which the model
    just asked for, stays whole. Giving way (output cut to a few lines) is for a landing above
    the trigger, as with the tiers alone. (The tiers once ran with their trigger at the
    target and gave way on every such rewrite: the three newest reads were cut from 4,469 to
    1,131 characters.)"""
    budget = Budget(context_window=21_000, reserve_output=1_000)
    events: list[Event] = []
    recall = MemoryRecallStore()
    async with ContextManager(
        budget, strategy=ToolOutputPipeline(), clock=lambda: NOW, recall=recall
    ) as ctx:
        ctx.subscribe(events.append)
        history: list[Message] = [u("Speed up the cache.")]
        view = await ctx.prepare(history)
        n = 0
        while not any(isinstance(e, ContextCompacted) for e in events):
            n += 1
            body = "\n".join(f"src/m{n}.py:{k}: v{k} = compute({k}, {n})" for k in range(100))
            history += [a(f"c{n}"), r(f"c{n}", body)]
            view = await ctx.prepare([*view, *history[-2:]])
            assert n < 40
        assert_view_ok(view, history)
        assert ctx.prompt_tokens < budget.trigger_tokens
    *earlier, newest = [txt(m) for m in view if isinstance(m, ToolResultMessage)][-3:]
    assert newest == txt(history[-1])
    for shown, read in zip(earlier, history[-5:-2:2], strict=True):
        assert "recall_context" in shown and shown != txt(read)
        assert len(shown.splitlines()) >= 50  # a quarter of tier 1's 200 lines, not a few


async def test_the_emergency_fraction_waits_for_the_budget_on_a_warm_cache() -> None:
    """Changed deliberately: reaching L2's usage fraction (0.9) used to count as forced, so on
    a warm cache every rewrite came at 90 % of the budget and a tenth of the headroom was
    lost each time (4 extra breaks on pi/before-compaction at 100k). Now L2's proposals wait,
    like any batch, for the budget; then one call goes all the way to the target, the oldest
    results first, and the calls after it take nothing new."""
    first = [u("task", 100), *turns(1, 8, 100)]
    second = [*first, a(age=10), u("step 9", 9), a("c9", age=9), r("c9", code(400), 9)]
    third = [*second, a(age=8), u("step 10", 7), a("c10", age=7), r("c10", code(200), 7)]
    fourth = [*third, a(age=6), u("step 11", 5)]
    budget = limited(int(await tokens_of(second) / 0.95))
    assert budget.limit < await tokens_of(third)
    events: list[Event] = []
    strategy = ToolOutputPipeline(**QUIET)
    recall = MemoryRecallStore()
    async with ContextManager(budget, strategy=strategy, clock=lambda: NOW, recall=recall) as ctx:
        ctx.subscribe(events.append)
        v1 = await ctx.prepare(first)
        assert ctx.prompt_tokens < 0.9 * budget.limit and len(ctx.ledger) == 0
        v2 = await ctx.prepare(second)  # at 95 %: L2 would expire results, but not yet
        assert ctx.prompt_tokens >= 0.9 * budget.limit
        assert v2[: len(v1)] == v1 and len(ctx.ledger) == 0
        v3 = await ctx.prepare(third)  # over the budget: one rewrite, down to the target
        assert_view_ok(v3, ctx.raw)
        assert ctx.prompt_tokens <= 0.4 * budget.limit
        expired = ["expired" in txt(m) for m in v3 if isinstance(m, ToolResultMessage)]
        assert expired[0] and not all(expired)  # oldest first, and only as many as needed
        decisions = len(ctx.ledger)
        v4 = await ctx.prepare(fourth)
        assert v4[: len(v3)] == v3 and len(ctx.ledger) == decisions
    assert sum(isinstance(e, BudgetExceeded) for e in events) == 0


async def test_no_result_is_expired_only_to_be_dropped_in_the_same_call() -> None:
    """Over the budget, where expiring every result the passes may touch cannot reach the
    target, the tiers drop the old turns in the same call anyway. Every result in them used
    to be expired first (a placeholder, a recall entry and a full estimate each), then hidden
    with them behind the marker: 8 of the 9 placeholders of this call, and about a hundred a
    call, half its time, in `long_session.py`'s session. Now the tiers go first; the passes
    expire only what stays in view (here the newest complete turn's result), landing where
    they did."""
    first = [u("task", 100), *turns(1, 8, 100)]
    second = [*first, a(age=10), u("step 9", 9), a("c9", age=9), r("c9", code(400), 9)]
    third = [*second, a(age=8), u("step 10", 7), a("c10", age=7), r("c10", code(200), 7)]
    budget = limited(int(await tokens_of(second) / 0.95))
    strategy = ToolOutputPipeline(**QUIET)
    recall = MemoryRecallStore()
    async with ContextManager(budget, strategy=strategy, clock=lambda: NOW, recall=recall) as ctx:
        await ctx.prepare(first)
        await ctx.prepare(second)
        view = await ctx.prepare(third)
        assert_view_ok(view, ctx.raw)
        ledger = ctx.ledger
        replaced = [d for d in ledger.decisions if isinstance(d, ReplaceResult)]
        assert replaced and ledger.spans
        assert [d for d in replaced if ledger.span_covering(d.at.index)] == []
        shown = [txt(m) for m in view if isinstance(m, ToolResultMessage)]
        assert len(shown) == 2 and "expired" in shown[0] and "src/c9.ts" in shown[0]
        assert shown[1] == code(200)
        assert ctx.prompt_tokens <= 0.2 * budget.limit  # 2,519 tokens of 14,836 both ways


async def test_a_forced_rewrite_reaches_the_target_in_the_same_call() -> None:
    """What expiring results cannot free (here the text of long answers) the deterministic
    tiers condense or drop in the same call, instead of in a second rewrite a few calls
    later."""
    history: list[Message] = [u("task: port src/a.ts", 100)]
    for k in range(1, 9):
        history += [
            u(f"step {k}", 90 - k),
            AssistantMessage((TextBlock(f"notes {k} " + "long explanation " * 600),), "stop"),
        ]
    history += [u("step 9", 1), a("c9", age=1), r("c9", "word " * 100, 1)]
    budget = limited(int(await tokens_of(history) / 1.05))
    async with ContextManager(
        budget, strategy=ToolOutputPipeline(**QUIET), clock=lambda: NOW, recall=MemoryRecallStore()
    ) as ctx:
        await ctx.prepare(history[:-6])
        view = await ctx.prepare(history)
        assert_view_ok(view, ctx.raw)
        assert ctx.prompt_tokens <= 0.4 * budget.limit
        assert any(
            "[Earlier turn, condensed]" in text_of(m.content)
            for m in view
            if isinstance(m, AssistantMessage)
        ) or any(isinstance(m, SummaryMessage) and COMPACTION_MARKER in m.text for m in view)


async def test_expiry_to_the_target_skips_results_a_placeholder_would_not_shrink() -> None:
    """A placeholder is about 40 tokens; replacing a shorter result only churns the cache."""
    history: list[Message] = [u("task", 100)]
    for k in range(1, 7):
        body = "ok" if k % 2 else "word " * 1500
        history += [u(f"step {k}", 90 - k), a(f"c{k}", age=90 - k), r(f"c{k}", body, 90 - k)]
    history += [u("step 7", 1), a("c7", age=1), r("c7", "word " * 300, 1)]
    budget = limited(int(await tokens_of(history) / 1.05))
    cfg = ToolOutputPipeline(**QUIET, l2=None, fallback=None)
    async with ContextManager(budget, strategy=cfg, clock=lambda: NOW) as ctx:
        await ctx.prepare(history[:-3])
        view = await ctx.prepare(history)
    small = [txt(view[j]) for j in range(3, 19, 3) if txt(history[j]) == "ok"]
    assert small == ["ok", "ok", "ok"]
    assert "expired" in txt(view[6])


async def test_new_dense_output_is_counted_in_full_before_deciding() -> None:
    """The one request over the budget on pi/before-compaction at 50k: a new result is
    first counted at a few characters a token, and dense output (hashes, paths) costs up to
    1.6x that, so it passed the budget unseen. Near the budget the new messages are counted
    in full before the pipeline decides."""
    dense = " ".join(hashlib.sha256(str(i).encode()).hexdigest() for i in range(400))
    history = [u("task", 100), *turns(1, 6, 150)]
    new = [a(age=10), u("step 7", 9), a("c7", age=9), r("c7", dense, 9)]
    full = await tokens_of([*history, *new])
    async with ContextManager(BIG, strategy=ToolOutputPipeline(), clock=lambda: NOW) as probe:
        await probe.prepare([*history, *new])
        quick = probe.prompt_tokens  # first-seen messages carry their quick estimate
    assert quick < full
    budget = limited((quick + full) // 2)
    events: list[Event] = []
    async with ContextManager(
        budget, strategy=ToolOutputPipeline(**QUIET), clock=lambda: NOW, recall=MemoryRecallStore()
    ) as ctx:
        ctx.subscribe(events.append)
        await ctx.prepare(history)
        view = await ctx.prepare([*history, *new])
        assert_view_ok(view, ctx.raw)
    assert not any(isinstance(e, BudgetExceeded) for e in events)
    assert any(isinstance(e, ContextCompacted) for e in events)


async def test_a_cleared_command_keeps_its_first_line() -> None:
    """The first line of a shell command names what it ran on (``cat > x.py << EOF``), so it
    stays when the heredoc after it is cleared: the artifact trail keeps the file."""
    command = "cat > /tmp/fix_markdown.py << 'EOF'\n" + "print('fix')\n" * 200 + "EOF"
    history = [
        u("task", 60),
        AssistantMessage((ToolCall("b1", "bash", {"command": command}),), "tool_use", extra=ts(59)),
        r("b1", "done " * 300, 58, "bash"),
        u("t2", 40),
        a(age=39),
        u("t3", 1),
    ]
    view = await run(history, pipeline(l0=ExpiryPass(keep_recent=0)))
    cleared = view[1].tool_calls[0].arguments["command"]  # type: ignore[union-attr]
    assert cleared.startswith("cat > /tmp/fix_markdown.py << 'EOF'\n[cleared: ")
    assert "/tmp/fix_markdown.py" in txt(view[2])


# -- the artifact trail through the tiers a rewrite falls back to --------------------------


def test_condensing_a_condensed_turn_again_keeps_its_trail() -> None:
    """A drop can merge two turns, so a one-line turn gets condensed again: it used to be
    clipped as plain text, losing every file it named (7 of 21 early paths on
    pi/before-compaction at 100k)."""
    first = condensed_line(
        [
            AssistantMessage(
                (TextBlock("Reading."), ToolCall("r1", "read", {"path": "src/a.ts"})), "tool_use"
            ),
            r("r1", "x"),
            AssistantMessage(
                (ToolCall("e1", "edit", {"path": "src/a.ts", "old": "x"}),), "tool_use"
            ),
            r("e1", "ok"),
        ]
    )
    again = condensed_line(
        [
            AssistantMessage((TextBlock(first),), "stop"),
            AssistantMessage(
                (ToolCall("b1", "bash", {"command": "grep -n x src/b.ts"}),), "tool_use"
            ),
            r("b1", "1: x"),
        ]
    )
    assert again.count("[Earlier turn, condensed]") == 1
    assert "read+edit(path=src/a.ts)" in again and "grep -n x src/b.ts" in again


def test_a_marker_lists_every_file_before_the_commands() -> None:
    """Commands fill the trail fast (200 characters each); the files touched come first, each
    once, and a file that only an omitted command names keeps a line of its own."""
    dropped: list[Message] = [u("step")]
    for k in range(60):
        calls = [
            ToolCall(f"r{k}", "read", {"path": f"src/module_{k % 20}/file_{k % 20}.ts"}),
            ToolCall(
                f"b{k}",
                "bash",
                {
                    "command": f"cd /repo && npm test -- --grep case{k} "
                    + "-v " * 50
                    + f"test/spec_{k}.ts"
                },
            ),
        ]
        dropped += [
            AssistantMessage(tuple(calls), "tool_use"),
            r(f"r{k}", "x"),
            r(f"b{k}", "ok", name="bash"),
        ]
    marker = marker_with_trail(dropped)
    text = marker.text
    assert text.startswith(COMPACTION_MARKER) and "... and" in text
    assert all(f"read(path=src/module_{k}/file_{k}.ts)" in text for k in range(20))
    assert all(f"test/spec_{k}.ts" in text for k in range(60))
    again = marker_with_trail([marker, *dropped[:4]])  # an earlier marker passes its trail on
    assert all(f"test/spec_{k}.ts" in again.text for k in range(60))


# -- on a real session ---------------------------------------------------------------------


def _least_breaks(messages: list[Message], limit: int, sizes: list[int]) -> int:
    """ceil((S0 + G - B) / (B - R)), the fewest prefix rewrites any compaction needs, whatever
    the strategy: S0 the first request, S0 + G the last, R = S0 + the mean size of the tail
    that holds the last 10 tool results with their calls, over the requests above B."""
    counter = MessageCounter()
    ends = [i for i, m in enumerate(messages) if isinstance(m, AssistantMessage) and i]
    tails = []
    for end, size in zip(ends, sizes, strict=True):
        if size <= limit:
            continue
        results = [j for j in range(end) if isinstance(messages[j], ToolResultMessage)][-10:]
        start = results[0] if results else end
        while start > 0 and not isinstance(messages[start], AssistantMessage):
            start -= 1  # back to the call of the oldest of them
        tails.append(counter.count_many(messages[start:end]))
    least = sizes[0] + sum(tails) / len(tails)
    return math.ceil((sizes[-1] - limit) / (limit - least))


async def test_pi_session_at_50k_holds_the_budget_with_near_minimal_breaks() -> None:
    """pi/before-compaction at a 50k budget, request by request (benchmarks/cache_breaks.py
    prints all cells): 0 requests over budget, breaks within 1.1x the theoretical minimum,
    cost under the cheapest peer that holds the budget (x0.22), early file paths visible."""
    messages = list(load_transcript(corpus_file("pi", "before-compaction.jsonl")).messages)
    budget = Budget(context_window=66_000, reserve_output=16_000)
    strategy = Chain([ToolOutputPipeline(), DeterministicCompaction()])
    report = await replay(messages, budget=budget, strategy=strategy)
    rows = report.rows
    minimum = _least_breaks(messages, budget.limit, [r.tokens_without for r in rows])
    assert report.over_budget == 0
    assert report.cache_breaks <= 1.1 * minimum, (report.cache_breaks, minimum)
    assert report.cost_with / report.cost_without <= 0.22
    final = "\n".join(canonical_json(m) for m in report.final_view)
    early = [m for m in messages if isinstance(m, AssistantMessage)][: len(rows) // 3]
    paths = {str(c.arguments["path"]) for m in early for c in m.tool_calls if "path" in c.arguments}
    assert sum(p in final for p in paths) >= 0.95 * len(paths)


def _pipeline_manager() -> ContextManager:
    """The pipeline then the tiers at a 29k budget, with a recall store."""
    strategy = Chain([ToolOutputPipeline(), DeterministicCompaction()])
    budget = Budget(context_window=30_000, reserve_output=1_000)
    return ContextManager(
        budget, strategy=strategy, recall=MemoryRecallStore(), on_over_budget="send"
    )


async def test_a_placeholder_is_estimated_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each placeholder was estimated in full twice: once to size its proposal, and again
    once taken, as the view showed another object made of the same decision (a sixth of a
    pipeline decision's time). The view shows the object the proposal was sized on now."""
    estimated: dict[str, int] = {}
    full = MessageCounter._base

    def counted(self: MessageCounter, message: Message) -> Any:
        if isinstance(message, ToolResultMessage) and "expired" in text_of(message.content):
            text = text_of(message.content)
            estimated[text] = estimated.get(text, 0) + 1
        return full(self, message)

    monkeypatch.setattr(MessageCounter, "_base", counted)
    async with _pipeline_manager() as ctx:
        history: list[Message] = []
        for group in synthetic_session(seed=5, calls=150):
            history += group
            await ctx.prepare(history)
            ctx.observe(Usage(input_tokens=ctx.prompt_tokens))
            await anyio.lowlevel.checkpoint()  # what observe left to the background runs
    assert len(estimated) > 50
    assert max(estimated.values()) == 1, sorted(estimated.values())[-5:]


async def test_a_session_keeps_no_rendering_of_what_spans_now_hide() -> None:
    """Found at 100k messages: the ledger kept what it rendered for every decided message,
    those a span had since hidden (shown again only if a rewind drops the span) included:
    with `ToolOutputPipeline`, 2.7 of the 5.7 objects per message agentctx held for the
    garbage collector. What it keeps now follows what the view shows."""
    groups = synthetic_session(seed=5, calls=700)
    async with _pipeline_manager() as ctx:
        history: list[Message] = []
        for group in groups:
            history += group
            view = await ctx.prepare(history)
            ctx.observe(Usage(input_tokens=ctx.prompt_tokens))
        gc.collect()
        key = ctx.counter._key
        kept = {id(m) for m in history} | {id(m) for m in view}
        kept |= {id(m) for span in ctx.ledger.spans for m in span.replacement}
        stray = [
            o
            for o in gc.get_objects()
            if isinstance(o, (ToolResultMessage, AssistantMessage, UserMessage, SummaryMessage))
            and getattr(o._tk, "owner", None) is key
            and id(o) not in kept
        ]
        decided = len({d.at.index for d in ctx.ledger.decisions})
    assert decided > 300
    # Renderings are kept for what the view shows, and by the tiers' bounded caches: not
    # one per decision (1,012 here before).
    assert len(stray) < decided // 2, (len(stray), len(view), decided)


# -- a call no pass can take anything on skips the passes -------------------------------------


def _loop_session(seed: int, steps: int) -> list[tuple[float, list[Message]]]:
    """(clock, new messages) per model call: a tool loop of reads of every size (some over
    `CondensePass.threshold_chars`, a few over the budget), 2-20 s apart, with a user prompt
    every dozen steps, after a shell run of the user's now and then."""
    rng = random.Random(seed)
    now, out = NOW, []
    for n in range(steps):
        now += rng.uniform(2, 20)
        stamp = {"timestamp": int(now * 1000)}
        if n % 12 == 11:
            turn: list[Message] = [AssistantMessage.of(f"done {n}")]
            if rng.random() < 0.3:  # the user ran a command, then asked (one batch)
                shell = "$ make\n" + "ok\n" * rng.randint(10, 3_000)
                turn.append(UserMessage((TextBlock(shell),), {**stamp, "source": "bash_execution"}))
            turn.append(UserMessage((TextBlock(f"next {n}"),), stamp))
            out.append((now, turn))
            continue
        lines = min(4_000, int(rng.paretovariate(1.2) * 8))
        body = "\n".join(f"src/m{n}.py:{k}: v{k} = f({k}, {n})" for k in range(lines))
        out.append((now, [a(f"c{n}", age=0), r(f"c{n}", body)]))
    return out


@pytest.mark.parametrize(
    ("seed", "window", "owned", "passes"),
    [
        (1, 30_000, True, {}),
        (2, 60_000, False, {}),
        (3, 60_000, True, {"budget": BudgetPass(max_chars_per_turn=20_000)}),
    ],
)
async def test_skipping_the_passes_when_nothing_can_be_taken_changes_no_view(
    seed: int,
    window: int,
    owned: bool,
    passes: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`nothing_to_take` lets a call skip the passes (in a running tool loop, under half the
    budget or what the last run found a stale batch could free): the same session, with it
    and with the passes run on every call, sends the same view on every call, rewinds and a
    budget pass that acts on new results included, and it did skip, above half the budget
    too."""
    session = _loop_session(seed, 500)
    real = pipeline_module.nothing_to_take
    skipped = above_half = 0

    def counted(cfg: ToolOutputPipeline, ctx: Any, memo: Any) -> bool:
        nonlocal skipped, above_half
        found = real(cfg, ctx, memo)
        skipped += found
        above_half += found and ctx.prompt_tokens >= ctx.budget.limit // 2
        return found

    async def views() -> list[list[str]]:
        clock = [NOW]
        sent: list[list[str]] = []
        budget = Budget(context_window=window, reserve_output=2_000)
        async with ContextManager(
            budget,
            strategy=ToolOutputPipeline(**passes),
            clock=lambda: clock[0],
            recall=MemoryRecallStore(),
            session_id="s",  # recall ids name it
            # Reports made from the estimate feed the calibration back on itself (its fitted
            # overhead climbs to 60 % of the budget on some seeds): a view judged over the
            # budget is still compared, not raised on.
            on_over_budget="send",
        ) as ctx:
            history: list[Message] = [u("task: make src/m0.py fast")]
            view = await ctx.prepare(history)
            for k, (now, new) in enumerate(session):
                clock[0] = now
                if not owned and k % 97 == 96:
                    history = history[: len(history) - 7]  # a rewind, then on again
                history = [*(view if owned else history), *new]
                view = await ctx.prepare(history)
                assert_view_ok(view, ctx.raw)
                sent.append([canonical_json(m) for m in view])
                # The model call reports its usage (a little off the estimate: calibration
                # moves), and the background estimates in full what was sent.
                ctx.observe(Usage(int(ctx.prompt_tokens * (1.02 + 0.03 * (k % 3))), 100))
                await anyio.lowlevel.checkpoint()
        return sent

    monkeypatch.setattr(pipeline_module, "nothing_to_take", counted)
    with_skips = await views()
    monkeypatch.setattr(pipeline_module, "nothing_to_take", lambda *args: False)
    assert await views() == with_skips
    assert skipped > len(session) // 4
    assert above_half > 0  # by what the last run found could pay, not only by the prompt


async def test_without_usage_reports_the_skip_changes_no_view(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No `observe`: the view's estimates stay quick, and a run of the passes sizes the old
    results it proposes in full, which moves the prompt's estimate (here over L2's fraction,
    so the run decides). Skipping such a run decided a call later (found by fuzzing this
    session: call 92); the skip now waits until what a run would size is sized in full."""
    session = _loop_session(4, 120)
    strategy = {
        "l0": ExpiryPass(expire_seconds=120, protect_recent_turns=1),
        "l1": CondensePass(threshold_chars=2_000),
    }

    async def views() -> list[list[str]]:
        clock = [NOW]
        sent: list[list[str]] = []
        rng = random.Random(4)
        async with ContextManager(
            Budget(context_window=12_000, reserve_output=2_000),
            strategy=ToolOutputPipeline(**strategy),
            clock=lambda: clock[0],
            recall=MemoryRecallStore(),
            session_id="s",
        ) as ctx:
            history: list[Message] = [u("task")]
            await ctx.prepare(history)
            for now, new in session:
                clock[0] = now + (rng.random() < 0.02) * 400  # now and then an idle gap
                if rng.random() < 0.02:
                    history = history[: max(1, len(history) - rng.randint(1, 9))]
                history = [*history, *new]
                view = await ctx.prepare(history)
                sent.append([canonical_json(m) for m in view])
        return sent

    with_skips = await views()
    monkeypatch.setattr(pipeline_module, "nothing_to_take", lambda *args: False)
    assert await views() == with_skips


async def test_a_call_the_skip_would_pass_over_never_decides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What `nothing_to_take` promises, asked on every call of a session that runs the
    passes anyway: no call it says takes nothing takes a decision. Results due a minute
    after they came and small batches that pay, so batches grow towards paying while the
    loop runs on and are taken above half the budget, where the skip relies on what the last
    run found could pay. (The views of a session with skips can differ from this one's: a
    proposal a skipped call did not make is sized under the calibration of the call that
    makes it.)"""
    strategy = ToolOutputPipeline(
        l0=ExpiryPass(expire_seconds=60, protect_recent_turns=1), clear_at_least=4_000
    )
    said = decided = above_half = 0
    clock = [NOW]
    async with ContextManager(
        Budget(context_window=60_000, reserve_output=2_000),
        strategy=strategy,
        clock=lambda: clock[0],
        recall=MemoryRecallStore(),
        session_id="s",
        # Its reports run 2-8 % over the estimate: near the end the newest turn alone may be
        # judged over the budget, which is not what this test asks about.
        on_over_budget="send",
    ) as ctx:
        real = pipeline_module.nothing_to_take
        verdicts: list[bool] = []

        def asked(cfg: ToolOutputPipeline, c: Any, memo: Any) -> bool:
            verdicts.append(real(cfg, c, memo))
            return False  # the passes run on every call

        monkeypatch.setattr(pipeline_module, "nothing_to_take", asked)
        view = await ctx.prepare([u("task: make src/m0.py fast")])
        for k, (now, new) in enumerate(_loop_session(4, 800)):
            clock[0] = now
            verdicts.clear()
            version = ctx.ledger.version
            tokens = ctx.prompt_tokens
            view = await ctx.prepare([*view, *new])
            if verdicts[:1] == [True]:
                said += 1
                above_half += tokens >= ctx.budget.limit // 2
                assert ctx.ledger.version == version, f"call {k} decided"
            decided += ctx.ledger.version != version
            ctx.observe(Usage(int(ctx.prompt_tokens * (1.02 + 0.03 * (k % 3))), 100))
            await anyio.lowlevel.checkpoint()
    assert said > 100 and above_half > 20 and decided > 5


def _lines(k: int, chars: int) -> str:
    return "\n".join(f"src/f{k}.py:{i}: v = f({i})" for i in range(chars // 24))


@pytest.mark.parametrize(
    "case",
    [
        "thinking before an instruction",
        "shell output before one",
        "shell output as task",
        "thinking before a result answering no call",
    ],
)
async def test_a_system_or_developer_message_is_no_user_turn_for_the_passes(case: str) -> None:
    """Found by a hostile run (one in five of its generated sessions raised): a system or developer
    message a harness appends mid-history (a `UserMessage` with ``extra["role"]``) is no
    user turn where the invariants are read (`boundaries.latest_user_index`), but the
    pipeline took it for one. It then proposed to drop the thinking of the turn the
    instruction follows, still the running tool loop's, or to cut down the shell output
    before it, the latest user message, and `prepare` raised `ConfigError`. The same held
    for user shell output that is the task, and for a result answering no call before the
    next user message: repair leaves it out of the view, where the pipeline read the turn
    as ended, while `take` reads the raw history, where user text after a result steers
    the running loop."""
    clock = [1_700_000_000.0]

    def stamp() -> dict[str, Any]:
        return {"timestamp": int(clock[0] * 1000)}

    shell = UserMessage((TextBlock(_lines(0, 9000)),), {"source": "bash_execution"})
    history: list[Message] = [shell if case == "shell output as task" else UserMessage.of("Go.")]
    strategy = ToolOutputPipeline(
        l0=ExpiryPass(expire_seconds=60, thinking_expire_seconds=20, user_shell_chars=500),
        clear_at_least=2_000,
        fallback=None,
    )
    async with ContextManager(
        Budget(context_window=8_000, reserve_output=1_000),
        strategy=Chain([strategy, DeterministicCompaction()]),
        clock=lambda: clock[0],
        on_over_budget="send",
    ) as ctx:

        async def call(*new: Message) -> list[Message]:
            history.extend(new)
            view = await ctx.prepare(history)
            assert_view_ok(view, ctx.raw)
            clock[0] += 30
            return view

        if case == "shell output before one":
            await call(AssistantMessage((TextBlock("ok"),), "stop", extra=stamp()))
            await call(
                UserMessage((TextBlock(_lines(1, 9000)),), {**stamp(), "source": "bash_execution"})
            )
        plan = ThinkingBlock("plan " * 200, "sig")
        await call(
            AssistantMessage((plan, ToolCall("c1", "read", {"path": "a"})), extra=stamp()),
            ToolResultMessage("c1", (TextBlock(_lines(1, 6000)),), "read", False, stamp()),
        )
        await call(
            AssistantMessage((ToolCall("c2", "read", {"path": "b"}),), extra=stamp()),
            ToolResultMessage("c2", (TextBlock(_lines(2, 12_000)),), "read", False, stamp()),
        )
        await call(AssistantMessage((TextBlock("done."),), "stop", extra=stamp()))
        clock[0] += 600
        if case == "thinking before a result answering no call":
            orphan = ToolResultMessage("gone", (TextBlock("z" * 5000),), "read", False, stamp())
            view = await call(orphan, UserMessage((TextBlock("Run the tests."),), stamp()))
        else:
            instruction = UserMessage((TextBlock("Run the tests."),), {**stamp(), "role": "system"})
            view = await call(instruction)
        # What every view keeps is still there, whole.
        for i in shown_positions(ctx.raw):
            assert ctx.raw[i] in view


async def _wide_batch_calls(n: int, strategy: Any) -> int:
    """Python function calls (counted, not timed) of one deciding prepare() over an old,
    finished turn holding one batch of ``n`` parallel calls and their results."""
    import cProfile
    import pstats

    calls = [ToolCall(f"p{i}", "f", {"i": i}) for i in range(n)]
    batch = [
        AssistantMessage.of("fan out", tool_calls=calls),
        *(ToolResultMessage.of(f"p{i}", f"out {i} " * 20) for i in range(n)),
    ]
    history = [
        UserMessage.of("Task"),
        *batch,
        AssistantMessage.of("done"),
        UserMessage.of("next"),
        AssistantMessage.of("ok"),
        UserMessage.of("go"),
    ]
    profile = cProfile.Profile()
    async with ContextManager(
        Budget(context_window=30 * n, reserve_output=n),  # the batch is over the limit
        strategy=strategy,
        recall=MemoryRecallStore(),
        on_over_budget="send",
    ) as ctx:
        profile.enable()
        view = await ctx.prepare(history)
        profile.disable()
        assert ctx.ledger.decisions
        assert_view_ok(view, ctx.raw)
    return int(pstats.Stats(profile).total_calls)  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["pipeline", "tiers"])
async def test_a_wide_parallel_batch_costs_a_decision_linear_work(kind: str) -> None:
    """Found by a hostile run (BT scale 1): each expired result of a batch looked its call up
    among all the batch's calls, and counted how many shared its id, so one decision over
    a batch of 8k calls held the event loop 6 s (50k: past 2 minutes)."""

    def strategy() -> Any:
        if kind == "pipeline":
            return Chain([ToolOutputPipeline(), DeterministicCompaction()])
        return DeterministicCompaction()

    small, large = (
        await _wide_batch_calls(500, strategy()),
        await _wide_batch_calls(2_000, strategy()),
    )
    print(f"{kind}: {small} function calls at 500 calls in a batch, {large} at 2,000")
    assert large < 6 * small  # 4x the batch; quadratic work is 16x


@pytest.mark.parametrize(("turns", "window"), [(8, 20_000), (30, 10_000)])
async def test_a_worker_taking_a_session_over_sends_the_view_the_last_one_sent(
    tmp_path: Any, turns: int, window: int
) -> None:
    """Found by a fuzzer (BV 1): a worker resuming a session read every message as not sent
    yet, so on its first call the pipeline took what the last worker had held back to keep
    the cache warm (old thinking, expired results), rewriting the prefix the hand-over was
    to keep cached."""
    from agentctx.recall import SQLiteRecallStore

    now = [1_700_000_000.0]

    def turn(i: int) -> list[Message]:
        call = ToolCall(f"call_{i}", "read", {"path": f"f{i}.py"})
        stamp = {"timestamp": int(now[0] * 1000)}
        return [
            UserMessage.of(f"question {i}", **stamp),
            AssistantMessage(
                (ThinkingBlock(f"thinking about {i} " * 20, f"sig{i}"), call),
                "tool_use",
                extra=stamp,
            ),
            ToolResultMessage(
                call.id, (TextBlock(f"contents of f{i}.py\n" * 30),), "read", extra=stamp
            ),
            AssistantMessage((TextBlock(f"answer {i}"),), "stop", extra=stamp),
        ]

    store = SQLiteRecallStore(tmp_path / "s.db")

    def worker() -> ContextManager:
        return ContextManager(
            Budget(context_window=window, reserve_output=1_000),
            strategy=Chain([ToolOutputPipeline(), DeterministicCompaction()]),
            recall=store,
            session_id="run-42",
            clock=lambda: now[0],
        )

    history: list[Message] = []
    async with worker() as first:
        for i in range(turns):  # a call a minute: the cache stays warm, old thinking ages out
            now[0] += 60
            history += turn(i)
            sent = await first.prepare(history)
        took = len(first.ledger)
    async with worker() as second:  # the same store, session, history and instant
        events: list[Event] = []
        second.subscribe(events.append)
        resumed = await second.prepare(history)
    assert [canonical_json(m) for m in resumed] == [canonical_json(m) for m in sent]
    assert not [e for e in events if isinstance(e, ContextCompacted)]
    print(f"{turns} turns: the first worker took {took} decisions")


async def test_an_owned_edit_of_a_session_whose_ids_the_view_rewrites_is_followed() -> None:
    """Found by a hostile run (CR 1): in owned mode, with tool-call ids the view rewrites
    (Kimi's ``functions.bash:0``: characters Anthropic refuses), an edit of the task had the
    raw history taken from the caller's view, whose objects the pipeline's memo had entries
    for; the ledger was unchanged, so the memo held, and every later call raised
    `ConfigError` (a decision anchored to a message no longer there): the session was dead.
    The memo now holds for the rewinds it was made under too."""

    def batch(n: int) -> list[Message]:
        ids = [f"functions.bash:{n}{k}" for k in range(2)]
        calls = tuple(ToolCall(i, "bash", {"cmd": i}) for i in ids)
        return [AssistantMessage(calls, "tool_use")] + [
            ToolResultMessage.of(i, f"out{n} " * 3000) for i in ids
        ]

    def turn(n: int) -> list[Message]:
        return [AssistantMessage.of(f"answer {n}"), UserMessage.of(f"next {n}")]

    async with ContextManager(Budget(context_window=60_000), strategy=ToolOutputPipeline()) as ctx:
        view = await ctx.prepare([UserMessage.of("task")])
        for group in (batch(0), turn(1), batch(2), turn(3), batch(4)):
            view = await ctx.prepare(view + group)
        edited = [UserMessage.of("task (typo fixed)"), *view[1:], *turn(5)]
        view = await ctx.prepare(edited)
        assert_view_ok(view, ctx.raw)
        assert text_of(view[0].content) == "task (typo fixed)"
        view = await ctx.prepare([*view, *batch(6)])
        assert_view_ok(view, ctx.raw)


PIXEL = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5E"
    "rkJggg=="
)


@pytest.mark.parametrize(
    "content, failed",
    [
        ((TextBlock(""),), True),  # shown as "(the tool failed without output)"
        ((TextBlock(""), ImageBlock("image/png", PIXEL)), False),  # the blank text left out
    ],
    ids=["empty-error", "blank-beside-an-image"],
)
async def test_a_result_repair_rewrote_still_has_its_call_s_arguments_cleared(
    content: tuple[Any, ...], failed: bool
) -> None:
    """Found by hostile testing (DY 4): a result repair rewrote was read as decided, so no
    pass touched it, nor its call's long arguments: a failed write kept its 6,000 characters
    in every request."""
    write = {"path": "a.py", "content": "q = 1\n" * 1000}
    history: list[Message] = [
        u("task 1", 40),
        AssistantMessage((ToolCall("c1", "write", write),), "tool_use", extra=ts(40)),
        ToolResultMessage("c1", content, "write", failed, ts(35)),
        u("task 2", 20),
        a("c2", age=20),
        r("c2", "B" * 300, 15),
        u("task 3", 1),
    ]
    view = await run(history, pipeline(l0=ExpiryPass(keep_recent=0)))
    call = view[1]
    assert isinstance(call, AssistantMessage)
    assert call.tool_calls[0].arguments["content"].startswith("[cleared: 6000 chars")
    shown = view[2]
    assert isinstance(shown, ToolResultMessage)
    if failed:  # as repair says it: the result stays, its placeholder would cost more
        assert txt(shown) == "(the tool failed without output)"
    else:
        assert [b.type for b in shown.content] == ["image"]
