"""Messages that `repair` rewrote are compacted like any other.

`repair` renames duplicate tool-call ids (with their results) and leaves out blank text
blocks, so the view holds other objects than the raw history for those messages although no
decision touched them. Each test runs a session twice through the real `ContextManager`: once
with what repair must fix, once with the history repair turns it into. Both must get the same
decisions and the same view, every view passing `check_view`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import pytest

from agentctx.boundaries import EMPTY_TEXT
from agentctx.budget import Budget
from agentctx.ledger import DropThinking, ReplaceArguments, ReplaceResult, ReplaceSpan
from agentctx.manager import ContextManager
from agentctx.messages import (
    THINKING_DROPPED,
    AssistantMessage,
    Message,
    SummaryMessage,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    fingerprint,
    text_of,
)
from agentctx.recall import MemoryRecallStore
from agentctx.strategies.llm import LlmCompaction
from agentctx.strategies.llm_config import SUMMARY_MARKER
from agentctx.strategies.pipeline import ToolOutputPipeline
from agentctx.testing import check_view, drive
from agentctx.testing.scripted import Outcome, ScriptedSummarizer

from .helpers import assistant, call, result, user

if TYPE_CHECKING:
    from collections.abc import Callable

    from agentctx.ledger import Decision
    from agentctx.strategy import CompactionStrategy

NOW = 1_800_000_000.0
BIG = "\n".join(f"row {i}: value {i * 7} of the listing, unchanged" for i in range(400))
SOURCE = "\n".join(f"def step_{i}(x):\n    return x + {i}" for i in range(800))
SMALL = Budget(context_window=10_000, reserve_output=1_000, trigger_ratio=0.8, target_ratio=0.5)
HUGE = Budget(context_window=2_000_000, reserve_output=1_000)


def _shape(d: Decision) -> tuple[Any, ...]:
    """What a decision does, without its fingerprints (the two histories differ in ids)."""
    body: Any = None
    if isinstance(d, ReplaceResult):
        body = d.content
    elif isinstance(d, ReplaceArguments):
        body = dict(d.arguments)
    elif isinstance(d, ReplaceSpan):
        body = (d.end, d.replacement)
    return type(d).__name__, d.at.index, d.reason, body


async def _run(
    history: list[Message], strategy: CompactionStrategy | None, budget: Budget
) -> tuple[list[Message], list[Decision]]:
    async with ContextManager(
        budget, strategy=strategy, recall=MemoryRecallStore(), clock=lambda: NOW, session_id="s"
    ) as ctx:
        view = await ctx.prepare(history)
        decisions = list(ctx.ledger.decisions)
    assert check_view(view, history) == []
    for d in decisions:
        assert d.at.fingerprint == fingerprint(history[d.at.index]), "anchored on the raw message"
    return view, decisions


async def _same_compaction(
    repaired: list[Message],
    plain: list[Message],
    make: Callable[[], CompactionStrategy | None],
    budget: Budget,
) -> tuple[list[Message], list[Decision]]:
    view, decisions = await _run(repaired, make(), budget)
    plain_view, plain_decisions = await _run(plain, make(), budget)
    assert [_shape(d) for d in decisions] == [_shape(d) for d in plain_decisions]
    assert view == plain_view
    return view, decisions


def _parallel(second_id: str) -> list[Message]:
    """One batch of two large reads; with ``second_id="call_0"`` repair renames the second."""
    return [
        user("task"),
        assistant(call("call_0"), call(second_id, path="src/other.py")),
        result("call_0", BIG),
        result(second_id, BIG),
        assistant(text="ok"),
        user("again"),
        assistant(text="fine"),
        user("last"),
    ]


async def test_a_result_renamed_by_repair_is_truncated_like_its_twin() -> None:
    view, decisions = await _same_compaction(
        _parallel("call_0"), _parallel("call_0-2"), lambda: None, SMALL
    )
    cut = {d.at.index for d in decisions if isinstance(d, ReplaceResult)}
    assert cut == {2, 3}
    renamed = view[3]
    assert isinstance(renamed, ToolResultMessage) and renamed.tool_call_id == "call_0-2"
    assert len(text_of(renamed.content)) < len(BIG)


@pytest.mark.parametrize("mode", ["owned", "projection"])
async def test_a_driven_session_with_a_renamed_result_matches_its_twin(
    mode: Literal["owned", "projection"],
) -> None:
    """Later calls keep the decisions, in either mode; `drive` checks every view."""

    async def views(second_id: str) -> list[list[Message]]:
        history = _parallel(second_id)
        turns = [history[:6], [*history[6:], assistant(text="more"), user("and more")]]
        async with ContextManager(SMALL, recall=MemoryRecallStore(), session_id="s") as ctx:
            return await drive(ctx, turns, mode=mode)

    repaired, plain = await views("call_0"), await views("call_0-2")
    assert repaired == plain
    results = [m for m in repaired[-1] if isinstance(m, ToolResultMessage)]
    assert [m.tool_call_id for m in results] == ["call_0", "call_0-2"]
    assert all(len(text_of(m.content)) < len(BIG) for m in results)


def _long_arguments(blank: bool) -> list[Message]:
    """A completed write with a long argument; with ``blank`` its message has a blank text
    block, which repair leaves out."""
    write = call("w", "write", path="src/big.py", content=SOURCE)
    blocks: tuple[Any, ...] = ((TextBlock("  "),) if blank else ()) + (write,)
    return [
        user("task"),
        AssistantMessage(blocks, "tool_use"),
        result("w", "ok", "write"),
        assistant(text="written"),
        user("again"),
        assistant(text="fine"),
        user("last"),
    ]


async def test_arguments_of_a_message_repair_cleaned_are_truncated() -> None:
    _, decisions = await _same_compaction(
        _long_arguments(True), _long_arguments(False), lambda: None, SMALL
    )
    assert [type(d) for d in decisions if d.at.index == 1] == [ReplaceArguments]


def _steps(second_id: str) -> list[Message]:
    """Two old steps whose server numbered calls per response: ``call_0`` twice unless
    ``second_id`` says otherwise. The second has expired signed thinking."""
    stamp = {"timestamp": int((NOW - 3600) * 1000)}
    second = AssistantMessage(
        (
            ThinkingBlock("plan the second build", "sig-2"),
            ToolCall(second_id, "bash", {"command": "make all " + "-j " * 600}),
        ),
        "tool_use",
        extra=stamp,
    )
    return [
        user("task"),
        assistant(call("call_0", "bash", command="make test " + "-v " * 600)),
        result("call_0", BIG, "bash"),
        assistant(text="tests ran"),
        user("now build"),
        second,
        result(second_id, BIG, "bash"),
        assistant(text="built"),
        user("step 3"),
        assistant(text="ok"),
        user("step 4"),
        assistant(text="ok"),
        user("last"),
    ]


async def test_the_pipeline_condenses_results_and_arguments_renamed_by_repair() -> None:
    view, decisions = await _same_compaction(
        _steps("call_0"), _steps("call_0-2"), lambda: ToolOutputPipeline(clear_at_least=0), HUGE
    )
    assert {(type(d), d.at.index) for d in decisions} >= {
        (ReplaceResult, 6),
        (ReplaceArguments, 5),
        (DropThinking, 5),
    }
    arguments = next(d for d in decisions if isinstance(d, ReplaceArguments) and d.at.index == 5)
    assert arguments.call_id == "call_0", "named as in the raw message"
    renamed = view[6]
    assert isinstance(renamed, ToolResultMessage) and renamed.tool_call_id == "call_0-2"
    assert text_of(renamed.content).startswith("[Condensed")


async def test_the_tiers_of_llm_compaction_truncate_a_renamed_result() -> None:
    """Over the limit with nothing to splice, `LlmCompaction` compacts what follows an
    earlier briefing with its own tiers (`run_tiers`)."""
    briefing = SummaryMessage(f"{SUMMARY_MARKER}\n\n## Goal\nShip the parser.")

    def session(second_id: str) -> list[Message]:
        history = _parallel(second_id)
        return [history[0], briefing, *history[1:]]

    def make() -> LlmCompaction:
        return LlmCompaction(ScriptedSummarizer(default=Outcome.fail(status=400)))

    _, decisions = await _same_compaction(session("call_0"), session("call_0-2"), make, SMALL)
    assert {d.at.index for d in decisions if isinstance(d, ReplaceResult)} == {3, 4}


def test_check_view_takes_an_answer_whatever_became_of_its_reasoning() -> None:
    """Repair fills blank text in place beside reasoning and leaves it out beside none: an
    answer whose reasoning was dropped shows neither, and is still the answer."""
    a, b = ThinkingBlock("a", "s1"), ThinkingBlock("b", "s2")
    blank, done = TextBlock(EMPTY_TEXT), TextBlock("done")
    answer = AssistantMessage((a, TextBlock(""), TextBlock(" "), b, done), "stop")
    raw = [user("task"), answer, user("next")]
    kept = AssistantMessage((a, blank, blank, b, done), "stop")
    dropped = AssistantMessage((done,), "stop", extra={THINKING_DROPPED: True})
    other = AssistantMessage((TextBlock("other"),), "stop")
    assert check_view([raw[0], kept, raw[2]], raw) == []
    assert check_view([raw[0], dropped, raw[2]], raw) == []
    assert any("answer" in p for p in check_view([raw[0], other, raw[2]], raw))
