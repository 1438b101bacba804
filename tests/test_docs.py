"""The documentation's worked example of a custom strategy runs against the real API.

The strict build of the site itself (broken links, anchors, docstrings) runs in scripts/test.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

from agentctx import (
    AssistantMessage,
    Budget,
    Chain,
    ContextCompacted,
    ContextManager,
    DeterministicCompaction,
    MemoryRecallStore,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from agentctx.messages import text_of
from agentctx.testing import check_view

DOCS = Path(__file__).resolve().parents[1] / "docs"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _python_blocks(page: str) -> list[str]:
    return _BLOCK.findall((DOCS / page).read_text(encoding="utf-8"))


def _strategy_class() -> Any:
    """The ``ClearOldSearches`` class, defined by executing its code block."""
    (source,) = [b for b in _python_blocks("custom-strategy.md") if "class ClearOldSearches" in b]
    namespace: dict[str, Any] = {"__name__": "docs_example"}
    exec(compile(source, "docs/custom-strategy.md", "exec", dont_inherit=True), namespace)
    return namespace["ClearOldSearches"]


async def test_custom_strategy_example_compacts_validly_and_recallably() -> None:
    clear_old_searches = _strategy_class()
    events: list[Any] = []
    # The example clears search results and nothing else: a target it can reach.
    budget = Budget(context_window=6_000, reserve_output=1_000, target_ratio=0.5)
    async with ContextManager(
        budget,
        strategy=Chain([clear_old_searches(), DeterministicCompaction()]),
        recall=MemoryRecallStore(),
    ) as ctx:
        ctx.subscribe(events.append)
        history: list[Any] = [UserMessage.of("Find where the configuration is loaded.")]
        for n in range(12):
            view = await ctx.prepare(history)
            assert check_view(view, ctx.raw) == []
            assert ctx.prompt_tokens <= budget.limit
            # call_0 twice: repair renames the second (and its result), still clearable
            call = ToolCall(f"call_{max(n - 1, 0)}", "search", {"query": f"config {n}"})
            output = "\n".join(f"src/mod{n}/file{k}.py: config = load()" for k in range(60))
            history += [
                AssistantMessage.of(tool_calls=[call]),
                ToolResultMessage.of(call.id, output, tool_name="search"),
            ]
        view = await ctx.prepare(history)
        again = await ctx.prepare(history)

    assert check_view(view, ctx.raw) == []
    assert again == view  # a fixed point: nothing new is taken for the same history
    ours = [e for e in events if isinstance(e, ContextCompacted)]
    assert ours and all(e.strategy == "ClearOldSearches" for e in ours)
    assert all(e.tokens_after < e.tokens_before for e in ours)
    # It lands near the target, not just under the limit.
    assert all(e.tokens_after <= budget.target_tokens + budget.limit // 10 for e in ours)
    placeholder = view[2].content[0].text  # type: ignore[union-attr]
    renamed = view[4]
    assert isinstance(renamed, ToolResultMessage) and renamed.tool_call_id == "call_0-2"
    assert text_of(renamed.content).startswith("[search output cleared")
    match = re.search(r"recall_context id=(ctx-[0-9a-f]{16})", placeholder)
    assert match is not None, placeholder
    page = ctx.handle_recall({"id": match[1], "limit": 100})
    if inspect.isawaitable(page):  # recall reads the store off the event loop
        page = await page
    assert "src/mod0/file0.py: config = load()" in page


def test_custom_strategy_usage_block_builds_a_manager() -> None:
    (usage,) = [b for b in _python_blocks("custom-strategy.md") if "ClearOldSearches()" in b]
    namespace: dict[str, Any] = {"ClearOldSearches": _strategy_class()}
    exec(compile(usage, "docs/custom-strategy.md", "exec", dont_inherit=True), namespace)
    assert isinstance(namespace["ctx"], ContextManager)
