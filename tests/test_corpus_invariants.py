"""The invariants (docs/invariants.md) on every real transcript the importers handle,
replayed call by call in both modes at a budget tight enough to force compaction."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from agentctx.budget import Budget
from agentctx.importers import load_transcript
from agentctx.manager import ContextManager
from agentctx.messages import AssistantMessage, Message, canonical_json
from agentctx.recall import MemoryRecallStore
from agentctx.testing import assert_view_ok

from .corpus import corpus_files

if TYPE_CHECKING:
    from pathlib import Path

FILES = corpus_files("pi") + corpus_files("claude-code")
FILES = [f for f in FILES if f.suffix == ".jsonl"]


def calls(messages: list[Message]) -> list[int]:
    return [i for i, m in enumerate(messages) if isinstance(m, AssistantMessage) and i > 0]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
@pytest.mark.parametrize("mode", ["owned", "projection"])
async def test_real_sessions_keep_every_invariant(path: Path, mode: str) -> None:
    messages = list(load_transcript(path).messages)
    budget = Budget(context_window=40_000, reserve_output=8_000)
    async with ContextManager(
        budget, recall=MemoryRecallStore(), on_over_budget="send", session_id=path.name
    ) as ctx:
        caller: list[Message] = []
        taken = 0
        over = 0
        for i in calls(messages):
            # feed each request as that mode's caller would: the full history, or the last
            # view plus what happened since
            new = messages[taken:i]
            taken = i
            caller = [*caller, *new] if mode == "owned" else list(messages[:i])
            view = await ctx.prepare(caller)
            assert_view_ok(view, ctx.raw)
            over += ctx.prompt_tokens > budget.limit
            if mode == "owned":
                caller = view
        again = await ctx.prepare(caller)
        assert [canonical_json(m) for m in again] == [canonical_json(m) for m in view]
        assert list(ctx.raw) == messages[:taken]
    assert over == 0


def test_the_corpus_is_there() -> None:
    assert len(FILES) >= 8
