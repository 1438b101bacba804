"""Giving way (`DeterministicCompaction._give_way`): what is cut when the tiers land too high."""

from __future__ import annotations

import re

import pytest

from agentctx import RECALL_TOOL_NAME, Budget, ContextManager, MemoryRecallStore
from agentctx.ledger import ReplaceResult
from agentctx.messages import Message, ToolResultMessage, text_of
from agentctx.strategies.deterministic import DeterministicCompaction
from agentctx.strategy import CompactionStrategy
from agentctx.testing import assert_view_ok

from .helpers import assistant, call, result, user

RECALL_ID = re.compile(r"recall_context id=(ctx-[0-9a-f]{16})")


def _strategy(kind: str) -> CompactionStrategy:
    from agentctx import Chain, ToolOutputPipeline

    if kind == "deterministic":
        return DeterministicCompaction()
    if kind == "pipeline":
        return ToolOutputPipeline()
    return Chain([ToolOutputPipeline(), DeterministicCompaction()])


async def _page_through(
    ctx: ContextManager, history: list[Message], budget: Budget, pages: int
) -> None:
    """Owned mode: the model reads ``pages`` pages of the output the view truncated, with the
    recall tool, one a step; each view is valid, within the budget, and shows the page it
    just read whole."""
    history = list(await ctx.prepare(history))
    found = RECALL_ID.search(text_of(history[-1].content))  # type: ignore[union-attr]
    assert found is not None
    arguments: dict[str, object] = {"id": found.group(1)}
    for k in range(pages):
        page = await ctx.handle_recall(arguments)
        history += [
            assistant(call(f"r{k}", RECALL_TOOL_NAME, **arguments)),
            result(f"r{k}", page, RECALL_TOOL_NAME),
        ]
        history = list(await ctx.prepare(history))
        assert_view_ok(history, ctx.raw)
        assert ctx.prompt_tokens <= budget.limit
        shown = history[-1]
        assert isinstance(shown, ToolResultMessage)
        assert text_of(shown.content) == page, f"page {k} was cut"
        offset = re.search(r"next offset=(\d+)", page)
        assert offset is not None
        arguments = {"id": found.group(1), "offset": int(offset.group(1))}


@pytest.mark.parametrize("kind", ["deterministic", "pipeline", "chain"])
async def test_the_page_just_recalled_is_not_cut_while_older_output_can_be(kind: str) -> None:
    """Found by a hostile run (DF, finding 1): with a limit of 8,000 tokens, a model paging
    through a truncated pytest log with the recall tool got every other page cut to 8 lines
    and a new recall id, though the page (about 2,800 tokens) would have fit: the prompt
    sat at about 610 tokens after the cut. Giving way cut the newest result, recalled or
    not, down to the target before it tried the protections that only need the trigger;
    cutting the older page was enough. The newest step's recalled output now stays whole
    unless the prompt cannot come under the budget otherwise."""
    budget = Budget(context_window=9_000, reserve_output=1_000)
    log = "\n".join(
        f"tests/test_{i}.py::test_{i} {'FAILED' if i % 97 == 0 else 'PASSED'}"
        for i in range(20_000)
    )
    history: list[Message] = [
        user("Task: list every failing test"),
        assistant(call("c0", "bash", command="pytest")),
        result("c0", log, "bash"),
    ]
    async with ContextManager(budget, recall=MemoryRecallStore(), strategy=_strategy(kind)) as ctx:
        await _page_through(ctx, history, budget, 8)


async def test_the_page_just_recalled_is_cut_only_as_far_as_the_budget_needs() -> None:
    """What was just recalled still gives way when nothing else can: cut down to the
    budget, not to the floor the other output reaches."""
    budget = Budget(context_window=3_300, reserve_output=1_000)  # 2,300 tokens
    store = MemoryRecallStore()
    page = "\n".join(f"src/mod_{i}.py:{i * 7919 % 9973}: value = compute({i})" for i in range(180))
    history: list[Message] = [
        user("Task: find the values"),
        assistant(call("a", "bash", command="grep -rn value src")),
        result("a", "\n".join(f"line {i}" for i in range(400)), "bash"),
        assistant(call("r", RECALL_TOOL_NAME, id="ctx-0123456789abcdef")),
        result("r", page, RECALL_TOOL_NAME),
    ]
    async with ContextManager(budget, recall=store) as ctx:
        view = await ctx.prepare(history)
        assert ctx.prompt_tokens <= budget.limit
    assert_view_ok(view, history)
    shown = text_of(view[-1].content)  # type: ignore[union-attr]
    assert shown != page
    assert shown.count("\n") + 1 > 16  # more than the 8 lines of the floor


async def test_a_large_parallel_batch_is_cut_once_straight_to_the_level_it_needs() -> None:
    """Found by a hostile run (DF, finding 3): one assistant message with 6,000 parallel
    calls (15 MB of results) blocked the event loop for about 4 s. Giving way cut every
    result three times (two halving levels the argument limit would not let it skip,
    though no argument was anywhere near it, and the level before the one returned, for the
    older results' sake when there were none), estimating each cut in full, then ran rounds
    at the floor that could cut nothing. Each result is now cut once."""
    n = 400
    body = {i: "\n".join(f"def f{i}_{j}(): return {j}" for j in range(100)) for i in range(n)}
    history: list[Message] = [
        user("Task: audit every module"),
        assistant(*(call(f"p{i}", "read", path=f"src/m{i}.py") for i in range(n))),
        *(result(f"p{i}", body[i], "read") for i in range(n)),
    ]
    budget = Budget(context_window=60_000, reserve_output=1_000)
    async with ContextManager(budget, on_over_budget="send") as ctx:
        view = await ctx.prepare(history)
        cuts = [d for d in ctx.ledger.decisions if isinstance(d, ReplaceResult)]
    assert_view_ok(view, history)
    assert ctx.prompt_tokens > budget.target_tokens  # even the floor is not enough
    assert len(cuts) == n
    assert all(text_of(m.content).count("\n") + 1 <= 8 for m in view[2:])  # type: ignore[union-attr]


@pytest.mark.parametrize("kind", ["deterministic", "pipeline", "chain"])
async def test_a_page_recalled_beside_a_long_task_is_not_cut_before_the_budget_needs_it(
    kind: str,
) -> None:
    """Found by a hostile run (DK, finding 2): with a task of 4,000 tokens, the task and the
    page passed the trigger, and the cut made when the newest step's output holds the
    prompt over it (`_cut_oversized`) cut the page, exemptions off, though the prompt fit
    the budget with it whole; a pipeline then had its fallback give way at the trigger, its
    stand-in for the hard budget, and cut the page a second time."""
    budget = Budget(context_window=9_000, reserve_output=1_000)  # limit 8,000, trigger 6,000
    task = "Task: list every failing test.\n" + "\n".join(
        f"- requirement {i}: module {i} keeps its public API" for i in range(300)
    )
    log = "\n".join(
        f"tests/test_{i}.py::test_{i} {'FAILED' if i % 97 == 0 else 'PASSED'}"
        for i in range(20_000)
    )
    history: list[Message] = [
        user(task),
        assistant(call("c0", "bash", command="pytest")),
        result("c0", log, "bash"),
    ]
    async with ContextManager(budget, recall=MemoryRecallStore(), strategy=_strategy(kind)) as ctx:
        await _page_through(ctx, history, budget, 6)


async def test_a_page_recalled_in_an_unsent_step_before_the_newest_is_not_cut() -> None:
    """Two steps brought in one call (a caller that skipped a model call's prepare): the
    results of the older one are cut with the newest's when they would hold the prompt over
    the trigger, but a page it recalled stays whole while the prompt fits the budget with it,
    as the newest step's does."""
    budget = Budget(context_window=9_000, reserve_output=1_000)
    log = "\n".join(
        f"tests/test_{i}.py::test_{i} {'FAILED' if i % 97 == 0 else 'PASSED'}"
        for i in range(20_000)
    )
    history: list[Message] = [
        user("Task: list every failing test."),
        assistant(call("c0", "bash", command="pytest")),
        result("c0", log, "bash"),
    ]
    async with ContextManager(budget, recall=MemoryRecallStore()) as ctx:
        view = list(await ctx.prepare(history))
        found = RECALL_ID.search(text_of(view[-1].content))  # type: ignore[union-attr]
        assert found is not None
        page = await ctx.handle_recall({"id": found.group(1)})
        view += [
            assistant(call("r0", RECALL_TOOL_NAME, id=found.group(1))),
            result("r0", page, RECALL_TOOL_NAME),
            assistant(call("s1", "bash", command="ls")),
            result("s1", "a\nb", "bash"),
        ]
        view = list(await ctx.prepare(view))
        assert_view_ok(view, ctx.raw)
        assert ctx.prompt_tokens <= budget.limit
        (shown,) = [m for m in view if isinstance(m, ToolResultMessage) and m.tool_call_id == "r0"]
        assert text_of(shown.content) == page
