"""Recall: every placeholder resolves to the original bytes, also after a restart; the memory
store never evicts what the view references; the tool reads 50k-char outputs in pages."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from agentctx import recall_tool
from agentctx.budget import Budget
from agentctx.ledger import ReplaceArguments, ReplaceResult
from agentctx.manager import ContextManager
from agentctx.messages import Message, ToolResultMessage, canonical_json, text_of
from agentctx.recall import MemoryRecallStore, SQLiteRecallStore
from agentctx.recall.tool import recall_page
from agentctx.strategies import ExpiryPass, ToolOutputPipeline
from agentctx.testing import synthetic_session

from .test_pipeline import NOW

RID = re.compile(r"ctx-[0-9a-f]{16}")


def aged_session() -> list[Message]:
    """A 60-call synthetic session; the replay clock runs ten days later, so all of it is old."""
    return [m for g in synthetic_session(3, 60, mean_output_lines=30) for m in g]


async def replay(store: Any, history: list[Message], session: str) -> tuple[list[Message], Any]:
    cfg = ToolOutputPipeline(l0=ExpiryPass(keep_recent=2, protect_recent_turns=1), clear_at_least=0)
    async with ContextManager(
        Budget(context_window=40_000, reserve_output=4_000),
        strategy=cfg,
        recall=store,
        session_id=session,
        clock=lambda: NOW + 10 * 86_400,
        on_over_budget="send",
    ) as ctx:
        view = await ctx.prepare(history)
        return view, ctx.ledger


def check_round_trip(store: Any, session: str, history: list[Message], ledger: Any) -> int:
    checked = 0
    for d in ledger.decisions:
        if isinstance(d, ReplaceResult) and d.recall_id:
            assert store.get(session, d.recall_id) == text_of(history[d.at.index].content)  # type: ignore[union-attr]
            checked += 1
        if isinstance(d, ReplaceArguments) and d.recall_id:
            assert store.get(session, d.recall_id) is not None
            checked += 1
    return checked


async def test_every_placeholder_resolves_from_memory() -> None:
    history = aged_session()
    store = MemoryRecallStore()
    view, ledger = await replay(store, history, "mem")
    assert check_round_trip(store, "mem", history, ledger) > 5
    for m in view:
        for rid in RID.findall(canonical_json(m)):
            assert store.get("mem", rid) is not None


async def test_sqlite_store_survives_a_restart(tmp_path: Path) -> None:
    history = aged_session()
    path = tmp_path / "agent.db"
    store = SQLiteRecallStore(path)
    view, ledger = await replay(store, history, "run-1")
    store.close()
    reopened = SQLiteRecallStore(path)
    assert check_round_trip(reopened, "run-1", history, ledger) > 5
    # a new manager on the same session resumes the ledger and renders the same view
    async with ContextManager(
        Budget(context_window=40_000, reserve_output=4_000),
        strategy=ToolOutputPipeline(mc=None, budget=None, l0=None, l1=None, l2=None),
        recall=reopened,
        session_id="run-1",
        on_over_budget="send",
    ) as again:
        resumed = await again.prepare(history)
    assert [canonical_json(m) for m in resumed] == [canonical_json(m) for m in view]
    assert (
        reopened.get(
            "other-session",
            RID.findall(canonical_json(view[2]))[0]
            if RID.findall(canonical_json(view[2]))
            else "ctx-0",
        )
        is None
    )
    reopened.close()


def test_memory_store_never_evicts_pinned_entries() -> None:
    store = MemoryRecallStore(max_bytes=1_000)
    keep = store.put("s", "k" * 600)
    store.pin("s", {keep})
    others = [store.put("s", str(i) * 300) for i in range(5)]
    store.pin("s", {keep})
    assert store.get("s", keep) == "k" * 600
    assert sum(store.get("s", r) is not None for r in others) < 5


def test_recall_pages_and_grep_a_50k_output() -> None:
    store = MemoryRecallStore()
    content = "\n".join(f"line {i}: {'error' if i % 97 == 0 else 'ok'}" for i in range(4000))
    rid = store.put("s", content)
    pages, offset = [], 0
    while True:
        page = recall_page(store, "s", rid, offset=offset, limit=8000)
        head, body = page.split("\n", 1)
        pages.append(body)
        if head.endswith("; end]"):
            break
        offset = int(re.search(r"next offset=(\d+)", head).group(1))  # type: ignore[union-attr]
    assert "".join(pages) == content and len(pages) == len(content) // 8000 + 1
    grep = recall_page(store, "s", rid, pattern=r"error")
    assert grep.splitlines()[1] == "1: line 0: error" and "42 lines match" in grep
    assert "not found" in recall_page(store, "other", rid)
    # the pattern is literal text: "(" is searched for, not compiled
    assert "0 lines match '('" in recall_page(store, "s", rid, pattern="(")


def test_tool_definitions() -> None:
    assert recall_tool("anthropic")["input_schema"]["required"] == ["id"]
    assert recall_tool("openai-chat")["function"]["name"] == "recall_context"
    assert recall_tool("openai-responses")["type"] == "function"


async def test_handle_recall_takes_the_models_raw_arguments() -> None:
    store = MemoryRecallStore()
    async with ContextManager(Budget(context_window=100_000), recall=store) as ctx:
        rid = store.put(ctx.session_id, "0123456789" * 10)
        assert (await ctx.handle_recall({"id": rid, "offset": "10", "limit": 5})).endswith(
            "\n01234"
        )
        assert (await ctx.handle_recall({"id": rid, "pattern": "0123", "extra": 1})).startswith(
            f"[recall_context {rid}: 1 lines match"
        )
        assert await ctx.handle_recall({"id": rid, "offset": None}) == await ctx.recall(rid)
        for bad, why in [
            ({}, "`id` is required"),
            ({"id": 7}, "`id` is required"),
            ("ctx-1", "must be an object"),
            ({"id": rid, "limit": "lots"}, "`limit` must be a whole number"),
            ({"id": rid, "offset": True}, "`offset` must be a whole number"),
            ({"id": rid, "pattern": ["x"]}, "`pattern` must be a text"),
        ]:
            assert why in await ctx.handle_recall(bad), bad
        assert "not found" in await ctx.handle_recall({"id": "ctx-0000000000000000"})


async def test_condensed_and_dropped_parts_are_recallable_in_one_call() -> None:
    """With a recall store the deterministic tiers keep what they condense or drop: each
    condensed turn and each dropped span names a recall id, and every tool output that left
    the view is found by one ``recall_context`` call on an id the view shows."""
    history = aged_session()
    store = MemoryRecallStore()
    async with ContextManager(
        Budget(context_window=12_000, reserve_output=2_000),
        recall=store,
        session_id="tiers",
        on_over_budget="send",
    ) as ctx:
        view: list[Message] = []
        for group in synthetic_session(3, 60, mean_output_lines=30):
            view = await ctx.prepare([*view, *group])
        shown = "\n".join(canonical_json(m) for m in view)
        ids = set(RID.findall(shown))
        condensed = [m for m in view if text_of(getattr(m, "content", ())).startswith("[Earlier")]
        markers = [m for m in view if getattr(m, "text", "").startswith("[Context compacted")]
        assert markers and RID.search(markers[0].text)  # type: ignore[attr-defined]
        recalled = {rid: await ctx.recall(rid, limit=10**9) for rid in ids}
        assert all("not found" not in page for page in recalled.values())
        visible = "\n".join(getattr(m, "text", None) or text_of(m.content) for m in view)  # type: ignore[union-attr]
        gone = [
            r
            for r in history
            if isinstance(r, ToolResultMessage) and text_of(r.content) not in visible
        ]
        assert gone, "the small budget should have cleared tool outputs"
        for r in gone:
            # the store's own copy of a truncated result also counts: one call either way
            assert any(text_of(r.content) in page for page in recalled.values()), r.tool_call_id
    assert condensed or len(markers) >= 1
