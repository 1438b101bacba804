"""Recall: every placeholder resolves to the original bytes, also after a restart; the memory
store never evicts what the view references; the tool reads 50k-char outputs in pages."""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio.lowlevel
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentctx import recall_tool
from agentctx.blocking import BlockingContextManager
from agentctx.boundaries import repair
from agentctx.budget import Budget
from agentctx.errors import ConfigError, StoreError
from agentctx.ledger import Ledger, ReplaceArguments, ReplaceResult, anchor, render
from agentctx.manager import ContextManager
from agentctx.messages import (
    AssistantMessage,
    ImageBlock,
    Message,
    TextBlock,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    canonical_json,
    text_of,
)
from agentctx.recall import MemoryRecallStore, SQLiteRecallStore
from agentctx.recall.store import (
    AppendingLedgerStore,
    escape_literal,
    expand_references,
    recall_id,
    recall_reference,
)
from agentctx.recall.tool import recall_page
from agentctx.recall.writer import RecallWriter
from agentctx.strategies import DeterministicCompaction, ExpiryPass, ToolOutputPipeline
from agentctx.strategies.llm import LlmCompaction
from agentctx.strategies.trail import span_text
from agentctx.strategy import Chain
from agentctx.summarizer import REQUIRED_SECTIONS
from agentctx.testing import ScriptedSummarizer, assert_view_ok, synthetic_session

from .helpers import assistant, call, result, user
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


@pytest.mark.parametrize("fold", ["same length", "other length"])
def test_a_search_with_more_matches_than_shown_goes_on_from_the_offset_it_gives(fold: str) -> None:
    """(Hostile run EC, 5) The answer said to "read on from offset=..." where more lines
    matched than it showed, but a search ignored ``offset``: the same call, made again with
    it, gave the same answer, and the rest of the matches could not be reached."""
    store = MemoryRecallStore()
    lines = [f"{'FAILED' if i % 2 else 'passed'} test_{i}" for i in range(3000)]
    if fold == "other length":
        lines[0] += " Straße"  # casefold makes it longer: matched line by line
    content = "\n".join(lines)
    rid = store.put("s", content)
    seen: list[str] = []
    offset = 0
    for _ in range(20):
        answer = recall_page(store, "s", rid, offset=offset, limit=4000, pattern="failed")
        head, *found = answer.split("\n")
        seen += [line.split(": ", 1)[1] for line in found]
        more = re.search(r"search on from offset=(\d+)", head)
        if more is None:
            break
        assert int(more.group(1)) > offset
        offset = int(more.group(1))
        assert f"lines from offset {offset} match" in recall_page(
            store, "s", rid, offset=offset, pattern="failed"
        )
    assert seen == [line for line in lines if "FAILED" in line]  # each once, in order
    numbered = recall_page(store, "s", rid, offset=offset, pattern="failed").split("\n")[1]
    assert numbered.split(": ")[0] == str(lines.index(numbered.split(": ", 1)[1]) + 1)
    # An offset inside a line searches from the next one.
    inside = recall_page(store, "s", rid, offset=len(lines[0]) + 3, pattern="failed")
    assert inside.split("\n")[1] == "4: FAILED test_3"


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
        # Found by a hostile run (R, finding 4): ints too long to format (a parser other than
        # json's gives them) raised ValueError from the answer's text.
        for huge in (10**5000, -(10**5000), float(10**300)):
            for name in ("offset", "limit"):
                assert (await ctx.handle_recall({"id": rid, name: huge})).startswith(
                    "[recall_context"
                )
        assert "past the end" in await ctx.handle_recall({"id": rid, "offset": 10**5000})


async def test_recall_answers_values_the_tool_would_not_take_as_the_tool_does() -> None:
    """Found by a hostile run (AH, finding 2): `ContextManager.recall` passed its arguments
    on unchecked, and a model's values handed to it (``args.get("id")``) raised a bare
    `TypeError` from deep inside; it answers as `handle_recall` does, blocking or not."""
    store = MemoryRecallStore()
    async with ContextManager(Budget(context_window=100_000), recall=store) as ctx:
        rid = store.put(ctx.session_id, "0123456789" * 10)
        recall: Any = ctx.recall
        for args, why in [
            ((None,), "`id` is required"),
            ((rid, 1.5), "`offset` must be a whole number"),
            ((rid, 0, None, ["x"]), "`pattern` must be a text"),
            ((rid, 0, None, 5), "`pattern` must be a text"),
            ((rid, 0, 0), "`limit` must be a whole number >= 1, got 0"),  # (AJ 6) uncapped
        ]:
            assert why in await recall(*args), args
        assert (await recall(rid, "10", 5)).endswith("\n01234")  # as a model writes them


def test_blocking_recall_answers_values_the_tool_would_not_take() -> None:
    manager = ContextManager(Budget(context_window=100_000), recall=MemoryRecallStore())
    with BlockingContextManager(manager) as ctx:
        recall: Any = ctx.recall
        assert "`id` is required" in recall(None)
        assert "`limit` must be a whole number" in recall("ctx-0000000000000000", 0, -3)


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


# -- content that reads like agentctx's own reference tokens -----------------------------------

FAKE = "{{recall:ctx-0123456789abcdef}}"
BRIEFING = "\n".join(f"## {name}\nNothing yet." for name in REQUIRED_SECTIONS)


def _planted(history: list[Message], real: str) -> list[Message]:
    """``history`` with each tool output and each call's arguments holding text that reads
    like references: one to an id never stored, one to the entry ``real`` (another entry of
    the same session), and already-escaped forms."""
    lines = f"\nprinted: {FAKE} and {{{{recall:{real}}}}} and {{{{\\recall:x}}}} {{{{\\\\recall:"
    out: list[Message] = []
    for m in history:
        if isinstance(m, ToolResultMessage):
            text = text_of(m.content) + lines
            m = ToolResultMessage.of(m.tool_call_id, text, tool_name=m.tool_name)
        elif isinstance(m, AssistantMessage) and m.tool_calls:
            calls = [
                ToolCall(c.id, c.name, {**c.arguments, "note": "x" * 900 + lines})
                for c in m.tool_calls
            ]
            m = AssistantMessage.of(text_of(m.content) or None, tool_calls=calls)
        out.append(m)
    return out


@pytest.mark.parametrize("strategy", ["tiers", "pipeline", "llm"])
async def test_cleared_text_that_reads_like_a_reference_is_recalled_as_it_was(
    strategy: str, tmp_path: Path
) -> None:
    """A tool output or argument holding ``{{recall:ctx-...}}`` comes back from recall as it
    was: not rewritten to "not kept", not replaced by the entry it names, in every store."""
    for store in (MemoryRecallStore(), SQLiteRecallStore(tmp_path / f"{strategy}.db")):
        real = store.put("planted", "SECRET ENTRY OF THIS SESSION")
        history = _planted(aged_session(), real)
        built: Any = {
            "tiers": lambda: None,
            "pipeline": lambda: Chain([ToolOutputPipeline(), DeterministicCompaction()]),
            "llm": lambda: LlmCompaction(ScriptedSummarizer([], default=BRIEFING)),
        }[strategy]()
        async with ContextManager(
            Budget(context_window=12_000, reserve_output=2_000),
            strategy=built,
            recall=store,
            session_id="planted",
            on_over_budget="send",
        ) as ctx:
            view: list[Message] = []
            for k in [*range(2, len(history), 2), len(history)]:
                view = await ctx.prepare(history[:k])
                await anyio.lowlevel.checkpoint()
            ids = set(RID.findall("\n".join(canonical_json(m) for m in view))) - {real}
            recalled = "\n".join([await ctx.recall(rid, limit=10**9) for rid in ids])
        assert ids
        assert "not kept" not in recalled and "SECRET ENTRY" not in recalled
        visible = "\n".join(getattr(m, "text", None) or text_of(m.content) for m in view)  # type: ignore[union-attr]
        gone = [
            text_of(r.content)
            for r in history
            if isinstance(r, ToolResultMessage) and text_of(r.content) not in visible
        ]
        assert gone
        for text in gone:
            assert text in recalled


@given(st.lists(st.sampled_from(["{", "}", "\\", "recall:", "ctx-", "0" * 16, "a"])).map("".join))
def test_escaped_text_expands_to_itself(text: str) -> None:
    assert expand_references(escape_literal(text), lambda rid: "ENTRY") == text


def test_references_expand_within_a_limit() -> None:
    entries = {f"ctx-{i:016x}": escape_literal(f"entry {i} ") * 100 for i in range(3)}
    text = escape_literal("{{recall:ctx-0000000000000000}} ") + "".join(
        recall_reference(rid) for rid in entries
    )
    full = expand_references(text, entries.get)
    assert full == "{{recall:ctx-0000000000000000}} " + "".join(
        f"entry {i} " * 100 for i in range(3)
    )
    capped = expand_references(text, entries.get, limit=len(text) + 1500)
    assert capped.count("entry 0 ") == 100 and "entry 2" not in capped
    assert 'too long to include here; recall_context(id="ctx-0000000000000002")' in capped


def test_the_writer_stores_put_text_escaped_and_entries_as_they_are() -> None:
    store = MemoryRecallStore()
    writer = RecallWriter(store, "w", emit=lambda event: None, ledger=Ledger())
    literal = writer.put("w", FAKE)
    entry = writer.put_references("w", recall_reference(literal))
    assert writer.get("w", literal) == escape_literal(FAKE) != FAKE
    assert writer.get("w", entry) == recall_reference(literal)
    assert expand_references(writer.get("w", entry) or "", lambda r: writer.get("w", r)) == FAKE


def test_expansion_stays_within_its_limit_whatever_stands_in_for_a_reference() -> None:
    text = "".join(recall_reference(f"ctx-{i:016x}") for i in range(100))
    entries = {"ctx-0000000000000001": "x" * 5_000}
    for limit in (len(text), len(text) + 10, len(text) + 400, len(text) + 6_000):
        assert len(expand_references(text, entries.get, limit=limit)) <= limit


def test_a_span_entry_holds_the_raw_messages_and_only_the_ids_placeholders_name() -> None:
    """A message repair changed (a renamed call id) is stored as it was recorded; an id it
    merely mentions is text, not a reference that pulls that entry in."""
    mention = "the output is under ctx-2f2790d8906a0444 and recall_context id=ctx-0a"
    raw: list[Message] = [
        UserMessage.of("task"),
        AssistantMessage((TextBlock(mention), ToolCall("id|1", "read", {"p": "a"})), "tool_use"),
        ToolResultMessage.of("id|1", "small"),
    ]
    view, origins, _ = repair(raw)
    assert view[1] != raw[1]  # the call id was renamed
    entry = span_text(view, origins, raw, 0, len(view), Ledger())
    assert entry == span_text(raw, range(len(raw)), raw, 0, len(raw), Ledger())
    assert "{{recall:" not in entry and mention in entry


@pytest.mark.parametrize("arguments_cleared", [False, True])
def test_a_span_entry_holds_every_result_of_a_batch_repair_reordered(
    arguments_cleared: bool,
) -> None:
    """Found by hostile testing: repair puts a missing result's stub after its batch, at its
    call's origin, so origins do not rise there; the result before the stub stood for
    ``raw[i:stub's origin]``, nothing, and was stored only through the stub (twice over),
    or not at all when the batch's arguments were cleared with a recall id (the stub took
    that decision's stored text). Each raw message is now stored once."""
    raw: list[Message] = [
        UserMessage.of("task"),
        AssistantMessage(
            (
                ToolCall("c5", "bash", {"command": "x" * 900}),
                ToolCall("c6", "bash", {}),
                ToolCall("c7", "bash", {}),
            ),
            "tool_use",
        ),  # fmt: skip
        ToolResultMessage.of("c6", "six"),
        ToolResultMessage(
            "c7", (TextBlock("seven"), ImageBlock("image/png", "iVBOR"), TextBlock(""))
        ),
        AssistantMessage.of("done"),
    ]
    ledger = Ledger()
    if arguments_cleared:
        rid = "ctx-" + "1" * 16
        ledger.add(ReplaceArguments(anchor(raw, 1), "c5", {"command": "[x]"}, "args", rid), raw)
    rendered = render(raw, ledger)
    view, origins = rendered.messages, rendered.origins
    assert origins == [0, 1, 2, 3, 1, 4]  # the stub for c5 after its batch
    entry = span_text(view, origins, raw, 1, len(view), ledger)
    assert entry.count("seven") == 1 and entry.count("six") == 1


class _Counting(SQLiteRecallStore):
    """A SQLite store that counts the ledger bytes each save hands it, written in the call
    that took the decisions (as a store that does no I/O is), so every call saves."""

    ledger_bytes = 0
    blocking = False

    def save_ledger(self, session_id: str, ledger_json: str) -> None:
        self.ledger_bytes += len(ledger_json)
        super().save_ledger(session_id, ledger_json)

    def extend_ledger(self, session_id: str, parts: Sequence[str], start: int) -> bool:
        self.ledger_bytes += sum(map(len, parts))
        return super().extend_ledger(session_id, parts, start)


async def test_a_long_sessions_ledger_is_saved_a_decision_at_a_time(tmp_path: Path) -> None:
    """Found by a hostile run (R, finding 5): every save wrote the whole ledger again, so
    a session wrote the square of its ledger (3.4 GB over 509 saves at 47k messages, the
    slowest save near the writer's deadline). Each save now writes what the ledger added;
    a resync that drops decisions rewrites from the first one it dropped; a resumed worker
    reads the same ledger."""
    store = _Counting(tmp_path / "a.db")
    budget = Budget(context_window=12_000, reserve_output=2_000)
    history: list[Message] = []
    async with ContextManager(budget, recall=store, session_id="s", on_over_budget="send") as ctx:
        for group in synthetic_session(5, 300, mean_output_lines=30):
            history += group
            await ctx.prepare(history)
        saved = ctx.ledger.to_json()
        assert len(json.loads(saved)) > 100
        assert store.ledger_bytes < 2 * len(saved)  # each decision about once
        rewound = history[: len(history) // 2]  # a rewind drops the later decisions
        await ctx.prepare(rewound)
        assert json.loads(store.load_ledger("s") or "") == json.loads(ctx.ledger.to_json())
        # The store loses the ledger behind the writer's back (hostile run Q, finding 3:
        # Redis restarted empty then held only what was saved after): it is saved whole.
        with sqlite3.connect(tmp_path / "a.db") as db:
            db.execute("DELETE FROM ledger_part")
        for group in synthetic_session(6, 40, mean_output_lines=30):
            rewound += group
            await ctx.prepare(rewound)
        final = ctx.ledger.to_json()
    assert json.loads(store.load_ledger("s") or "") == json.loads(final)
    async with ContextManager(budget, recall=store, session_id="s") as again:
        view = await again.prepare(rewound)
    assert again.ledger.to_json() == final
    assert_view_ok(view, rewound)
    store.close()


def check_extend_ledger(store: Any) -> None:
    """`AppendingLedgerStore`'s contract, on ``store``."""
    assert isinstance(store, AppendingLedgerStore)
    store.extend_ledger("x", ['{"a": 1}', '{"b": 2}', '{"c": 3}'], 0)
    assert json.loads(store.load_ledger("x")) == [{"a": 1}, {"b": 2}, {"c": 3}]
    store.extend_ledger("x", ['{"d": 4}'], 2)  # the third one dropped, one more after
    assert json.loads(store.load_ledger("x")) == [{"a": 1}, {"b": 2}, {"d": 4}]
    store.extend_ledger("x", [], 1)
    assert json.loads(store.load_ledger("x")) == [{"a": 1}]
    store.save_ledger("x", '[{"whole": true}]')  # a whole save replaces the parts
    assert json.loads(store.load_ledger("x")) == [{"whole": True}]
    store.extend_ledger("x", ['{"e": 5}'], 0)  # and the parts a whole save
    assert json.loads(store.load_ledger("x")) == [{"e": 5}]
    store.extend_ledger("x", [], 0)
    assert store.load_ledger("x") in (None, "[]")
    assert store.load_ledger("y") is None
    # Fewer than `start` held (lost since): nothing written, and it says so.
    assert store.extend_ledger("y", ['{"f": 6}'], 1) is False
    assert store.load_ledger("y") is None
    assert store.extend_ledger("y", ['{"f": 6}'], 0) is True


def test_the_sqlite_store_saves_a_ledger_a_decision_at_a_time(tmp_path: Path) -> None:
    store = SQLiteRecallStore(tmp_path / "a.db")
    check_extend_ledger(store)
    store.close()


def test_a_chain_of_references_of_any_depth_expands_whole() -> None:
    """A stretch dropped again and again refers to the entry of the drop before it (hostile
    run W, finding 2): a chain as deep as the session's drops. Expanded by recursion to 16
    levels, what lay deeper read as "not kept" though it was kept."""
    from agentctx.recall.store import expand_references, recall_reference

    entries = {"ctx-0000000000000000": "part 0"}
    for k in range(1, 300):
        entries[f"ctx-{k:016x}"] = recall_reference(f"ctx-{k - 1:016x}") + f"\npart {k}"
    whole = expand_references(recall_reference(f"ctx-{299:016x}"), entries.get)
    assert whole == "\n".join(f"part {k}" for k in range(300))
    looped = {"ctx-000000000000000a": "a " + recall_reference("ctx-000000000000000a")}
    assert "reads it]" in expand_references(looped["ctx-000000000000000a"], looped.get)


async def test_a_search_of_a_large_entry_runs_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by a hostile run (W, finding 6): a pattern search of an 8 MB entry ran on the
    event loop, and where casefolding changes the text's length (a "ß") it is a Python loop
    over every line: the loop stalled for up to 0.6 s. A long entry is searched in a worker
    thread (only the store read was off the loop)."""
    import threading

    from agentctx import ContextManager
    from agentctx.recall import writer

    searched_in: list[int] = []
    page = writer.recall_page

    def recorded(*args: Any, **kwargs: Any) -> str:
        searched_in.append(threading.get_ident())
        return page(*args, **kwargs)

    monkeypatch.setattr(writer, "recall_page", recorded)
    store = MemoryRecallStore()
    async with ContextManager(20_000, recall=store, session_id="s") as ctx:
        small = store.put("s", "Straße\nok\n")
        large = store.put("s", "Straße\n" + "line\n" * 400_000)
        assert "1 lines match" in await ctx.recall(small, pattern="strasse")
        assert "1 lines match" in await ctx.recall(large, pattern="strasse")
    assert searched_in[0] == threading.get_ident() != searched_in[1]


def test_an_entry_the_store_cannot_read_is_said_in_its_place() -> None:
    """Found by a hostile run (Y, finding 2): a marker names only its own id, its entry
    referring to the drops before it; one entry down the chain that the store could not read
    made the whole recall fail, every dropped message behind it out of reach. It is said in
    its place; the rest is read."""
    from agentctx.errors import StoreDataError
    from agentctx.recall.store import expand_references, recall_reference

    entries = {f"ctx-{k:016x}": f"part {k}" for k in range(3)}
    top = "".join(recall_reference(rid) + "\n" for rid in entries)

    def fetch(rid: str) -> str | None:
        if rid == "ctx-0000000000000001":
            raise StoreDataError("row unreadable")
        return entries.get(rid)

    whole = expand_references(top, fetch)
    assert whole.startswith("part 0\n[ctx-0000000000000001: could not be read (row unreadable)")
    assert whole.endswith("part 2\n")


def test_a_memory_store_shared_by_threads_keeps_its_accounting() -> None:
    """Found by a hostile run (AB, finding 3): sessions on several threads (each
    `BlockingContextManager` runs its own loop thread) share a store that is called inline,
    with no lock: `RuntimeError: OrderedDict mutated during iteration` (a store outage to the
    sessions) and a byte count that drifted past ``max_bytes``; so did a pickle of it taken
    while they wrote."""
    import pickle
    import sys
    import threading

    store = MemoryRecallStore(max_bytes=200_000)
    failures: list[BaseException] = []

    def session(w: int) -> None:
        try:
            for s in range(40):
                sid = f"w{w}-s{s}"
                rids = store.put_many(sid, [f"{sid} entry {k} " + "x" * 2_000 for k in range(12)])
                store.pin(sid, rids[:6])
                store.update_pins(sid, rids[6:9], rids[:2])
                for rid in rids:
                    store.get(sid, rid)
                store.release(sid)
        except BaseException as e:  # reported by the main thread
            failures.append(e)

    def snapshot() -> None:  # a checkpoint of the store while its sessions write (run AG, 3)
        try:
            for _ in range(300):
                twin = pickle.loads(pickle.dumps(store))
                held = [*twin._free.values(), *twin._held.values()]
                assert twin.bytes_held == sum(map(sys.getsizeof, held))
        except BaseException as e:  # reported by the main thread
            failures.append(e)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        threads = [threading.Thread(target=session, args=(w,)) for w in range(8)]
        threads.append(threading.Thread(target=snapshot))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert failures == []
    held = [*store._free.values(), *store._held.values()]
    assert store.bytes_held == sum(map(sys.getsizeof, held)) <= store.max_bytes
    assert not store._pins and not store._held
    twin = pickle.loads(pickle.dumps(store))  # the lock is the copy's own
    assert twin.bytes_held == store.bytes_held and len(twin) == len(store)


@pytest.mark.parametrize("max_bytes", [-1, "64MB", 1.5, True, float("nan")])
def test_a_memory_store_size_that_cannot_work_is_refused_when_made(max_bytes: object) -> None:
    """It was taken, and every later put failed with a bare `TypeError` (a hostile run)."""
    with pytest.raises(ConfigError, match="max_bytes"):
        MemoryRecallStore(max_bytes)  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout", [-5, "1", float("nan")])
def test_a_sqlite_store_timeout_that_cannot_work_is_refused_when_made(
    tmp_path: Path, timeout: object
) -> None:
    with pytest.raises(ConfigError, match="timeout"):
        SQLiteRecallStore(tmp_path / "a.db", timeout=timeout)  # type: ignore[arg-type]


async def test_a_reference_the_store_could_not_read_is_read_again_on_the_next_recall() -> None:
    """ "A reference the store cannot read right now is said in its place" (docs/recall.md):
    the expansion saying so was cached, and every later recall said it again after the store
    had recovered (found by a hostile run)."""

    class FailsOnce(MemoryRecallStore):
        failing: set[str] = set()

        def get(self, session_id: str, rid: str) -> str | None:
            if rid in self.failing:
                self.failing.discard(rid)
                raise StoreError("timed out")
            return super().get(session_id, rid)

    store = FailsOnce()
    inner = store.put("s", "the inner original")
    outer = store.put("s", escape_literal("before ") + recall_reference(inner) + " after")
    store.failing.add(inner)
    async with ContextManager(100_000, recall=store, session_id="s") as ctx:
        first = await ctx.recall(outer)
        assert "could not be read (timed out)" in first
        for _ in range(2):
            assert (await ctx.recall(outer)).endswith("before the inner original after")


@pytest.mark.parametrize("header", ["plain header", "Straße header", "ﬁle header"])
def test_a_long_matching_line_is_shown_around_its_match_whatever_casefolding_does(
    header: str,
) -> None:
    """Found by a hostile run (BF 3): one "ß" or ligature anywhere in an entry (casefolding
    changes its length) and a long matching line was shown from its start, without the
    match."""
    store = MemoryRecallStore()
    line = "x" * 5000 + " Straße NEEDLE-FOUND-HERE " + "y" * 5000
    rid = store.put("s", header + "\n" + line)
    for pattern in ("needle-found", "STRASSE needle"):
        out = recall_page(store, "s", rid, pattern=pattern)
        assert "1 lines match" in out and "NEEDLE-FOUND-HERE" in out, out
        start = int(re.search(r"this part starts at offset=(\d+)", out)[1])  # type: ignore[index]
        shown = out.split("\n")[1].removeprefix("2: ...")[:40]
        assert (header + "\n" + line)[start:].startswith(shown)


async def test_a_search_keeps_nothing_of_an_entry_once_its_session_closed() -> None:
    """Found by a hostile run (BT scale 3): the casefold kept for a search again was held at
    module level, so a 10 MB entry searched once stayed in memory, twice, for the rest of
    the process."""
    import gc
    import sys

    store: MemoryRecallStore | None = MemoryRecallStore()
    assert store is not None
    rid = store.put("s", "".join(f"line {i} of a large entry\n" for i in range(100_000)))
    entry = store.get("s", rid)
    ctx: ContextManager | None = ContextManager(100_000, recall=store, session_id="s")
    assert ctx is not None
    async with ctx:
        assert "1 lines match" in await ctx.recall(rid, pattern="line 99999 ")
        assert "line 5 of" in await ctx.recall(rid, pattern="LINE 5 OF")  # narrowed
    ctx = store = None  # the session and its store are gone
    gc.collect()
    assert sys.getrefcount(entry) == 2  # ``entry`` and the call's argument: nothing else


# -- found by a hostile run (CD) -----------------------------------------------------------


@pytest.mark.parametrize("kind", ["BLOB", "TEXT"])
def test_a_sqlite_value_that_is_not_utf8_is_a_data_error_however_stored(
    tmp_path: Path, kind: str
) -> None:
    """(CD 3) Stored as TEXT, such a value made SQLite's own decoding fail: a plain
    `StoreError` ("try again later", which never helps) quoting the row, where a BLOB gave
    `StoreDataError`. Ledger and state read the same way."""
    from agentctx.errors import StoreDataError

    store = SQLiteRecallStore(tmp_path / "r.db")
    (rid,) = store.put_many("s", ["fine"])
    store.save_ledger("s", "[]")
    store.save_state("s", "{}")
    other = sqlite3.connect(tmp_path / "r.db", isolation_level=None)
    value = "x'ff41'" if kind == "BLOB" else "CAST(x'ff41' AS TEXT)"
    other.execute(f"UPDATE recall SET content = {value}")
    other.execute(f"UPDATE ledger SET json = {value}")
    other.execute(f"UPDATE state SET json = {value}")
    other.close()
    for read in (lambda: store.get("s", rid), lambda: store.load_ledger("s")):
        with pytest.raises(StoreDataError, match="not UTF-8"):
            read()
    with pytest.raises(StoreDataError, match="not UTF-8"):
        store.load_state("s")
    store.close()


def test_each_recall_tool_definition_is_a_copy_of_its_own() -> None:
    """(CD 4) Every definition shared one schema dict: one caller making its copy strict
    changed every later definition, for every provider."""
    mine = recall_tool("openai-chat")
    mine["function"]["parameters"]["additionalProperties"] = False
    mine["function"]["parameters"]["required"].append("offset")
    for provider in ("anthropic", "openai-chat", "openai-responses"):
        text = json.dumps(recall_tool(provider))  # type: ignore[arg-type]
        assert "additionalProperties" not in text and '["id", "offset"]' not in text


def test_an_empty_entry_answers_an_offset_past_its_end_as_past_the_end() -> None:
    """(CD 5) An empty entry answered offset 5 with "chars 5-0 of 0"."""
    store = MemoryRecallStore()
    (rid,) = store.put_many("s", [""])
    assert recall_page(store, "s", rid, 0) == f"[recall_context {rid}: chars 0-0 of 0; end]\n"
    assert "past the end (0 chars)" in recall_page(store, "s", rid, 5)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_forget_deletes_one_sessions_data_and_no_others(tmp_path: Path, kind: str) -> None:
    store: Any = MemoryRecallStore() if kind == "memory" else SQLiteRecallStore(tmp_path / "f.db")
    (gone,) = store.put_many("s", ["gone"])
    (kept,) = store.put_many("t", ["kept"])
    if kind == "memory":
        store.pin("s", [gone])
    else:
        for s in ("s", "t"):
            store.save_ledger(s, "[]")
            store.save_state(s, "{}")
    store.forget("s")
    assert store.get("s", gone) is None and store.get("t", kept) == "kept"
    if kind == "sqlite":
        assert store.load_ledger("s") is None and store.load_state("s") is None
        assert store.load_ledger("t") == "[]" and store.load_state("t") == "{}"
        store.close()
    else:
        alone = MemoryRecallStore()
        alone.put_many("t", ["kept"])
        assert len(store) == 1 and store.bytes_held == alone.bytes_held


# -- found by a hostile run (CG): a worker per request, at scale --------------------------------


async def test_a_rewind_serializes_only_the_messages_that_name_a_recall_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(CG 1) A dropped decision's entry stays kept while the history names it: every raw
    message was serialized, on the loop, to look (2.2 s at 50k messages)."""
    import agentctx.recall._named as named_module

    serialized: list[Message] = []
    real = named_module.canonical_json

    def counting(m: Message) -> str:
        serialized.append(m)
        return real(m)

    monkeypatch.setattr(named_module, "canonical_json", counting)
    history: list[Message] = [user("task")]
    for k in range(150):
        history += [assistant(call(f"c{k}", "ls", path=f"d{k}")), result(f"c{k}", f"f{k}.py")]
    cut = len(history)
    log = "\n".join(f"line {i}: " + "x" * 60 for i in range(2_000))
    history += [assistant(call("big", "test")), result("big", log), user("and now?")]
    async with ContextManager(
        Budget(context_window=12_000, reserve_output=1_000), recall=MemoryRecallStore()
    ) as ctx:
        view = await ctx.prepare(history)
        assert any("ctx-" in canonical_json(m) for m in view)  # the log, cut, recallable
        serialized.clear()
        rewound = [*history[:cut], user("something else")]
        assert_view_ok(await ctx.prepare(rewound), rewound)
    assert len(serialized) < 5  # it was every message of the history: 302


async def test_a_resumed_worker_appends_to_the_ledger_it_resumed(tmp_path: Path) -> None:
    """(CG 2) A resumed worker's first save rewrote the whole ledger (megabytes, for a worker
    per request) to add the few decisions it took."""
    saves: list[tuple[int, int]] = []

    class Counting(SQLiteRecallStore):
        def extend_ledger(self, session_id: str, parts: Sequence[str], start: int) -> bool:
            saves.append((start, len(parts)))
            return super().extend_ledger(session_id, parts, start)

    store = Counting(tmp_path / "s.db")
    history: list[Message] = [user("task")]
    for k in range(60):
        history += [assistant(call(f"c{k}", "cat", path=f"f{k}")), result(f"c{k}", "y" * 3_000)]
    budget = Budget(context_window=16_000, reserve_output=1_000)
    async with ContextManager(budget, recall=store, session_id="s") as a:
        await a.prepare(history)
        held = len(a.ledger)
    assert held >= 1 and saves
    saves.clear()
    for k in range(60, 75):
        history += [assistant(call(f"c{k}", "cat", path=f"f{k}")), result(f"c{k}", "y" * 3_000)]
    async with ContextManager(budget, recall=store, session_id="s") as b:
        await b.prepare(history)
        added = len(b.ledger) - held
    assert added > 0
    assert saves == [(held, added)]


def test_a_recall_id_anywhere_in_a_message_keeps_its_entry_named() -> None:
    """(CH 7) The faster look for recall ids read text only: an id in an image's URL, a
    signature, a call's id or name, a result's tool name or a model name was no longer
    found, and its entry could be let go after a rewind."""
    from agentctx.messages import RedactedThinkingBlock, ThinkingBlock
    from agentctx.recall._named import NamedInRaw

    rid = "ctx-0123456789abcdef"
    messages: list[Message] = [
        user("plain"),
        UserMessage((ImageBlock("", f"https://x/{rid}.png", "url"),)),
        AssistantMessage((ThinkingBlock("t", signature=rid),)),
        AssistantMessage((RedactedThinkingBlock(rid),)),
        AssistantMessage((ToolCall(rid, "f", {}),)),
        AssistantMessage((ToolCall("c", f"read_{rid}", {}),)),
        ToolResultMessage("c", (TextBlock("x"),), tool_name=rid),
        AssistantMessage((TextBlock("x"),), model=rid),
        AssistantMessage((ToolCall("c", "f", {"deep": [{"id": rid}]}),)),
    ]
    followed = NamedInRaw()  # one history after another: each read where it differs
    for m in messages[1:]:
        assert NamedInRaw().named({rid}, [messages[0], m]) == {rid}, m
        assert followed.named({rid}, [messages[0], m]) == {rid}, m
    assert NamedInRaw().named({rid}, [messages[0]]) == set()
    assert followed.named({rid}, [messages[0]]) == set()


async def test_rewinds_that_drop_decisions_read_only_what_changed_with_a_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(Hostile run EC, 3) With a recall store, each edit that dropped a decision read every
    raw message again, on the loop, for the ids a dropped decision named: 0.15-0.2 s a call
    at 20k messages, 0.7-0.9 s at 50k, against 11 ms with no store. The first such rewind
    reads the history once; the next read only what changed since."""
    import agentctx.recall._named as named_module

    read: list[Message] = []
    real = named_module._names_one

    def counting(m: Message) -> bool:
        read.append(m)
        return real(m)

    monkeypatch.setattr(named_module, "_names_one", counting)
    history: list[Message] = [user("task")]
    for k in range(600):
        history += [assistant(call(f"c{k}", "ls", path=f"d{k}")), result(f"c{k}", f"f{k}.py")]
    reads = []
    async with ContextManager(
        Budget(context_window=60_000, reserve_output=1_000), recall=MemoryRecallStore()
    ) as ctx:
        for k in range(3):
            big = [assistant(call(f"big{k}", "test")), result(f"big{k}", "x\n" * 30_000)]
            view = await ctx.prepare([*history, *big])
            assert any("ctx-" in canonical_json(m) for m in view)  # cut, recallable
            read.clear()
            history += [big[0], result(f"big{k}", f"short output {k}")]  # the harness edits it
            assert_view_ok(await ctx.prepare(history), history)
            reads.append(len(read))
    assert reads[0] >= 1_200 and max(reads[1:]) <= 4, reads


def test_a_file_of_another_schema_with_nulls_is_a_store_data_error(tmp_path: Path) -> None:
    """Found by a hostile run (CS 9): `SQLiteRecallStore` on a file another tool made (the
    same table names, no NOT NULL, NULL values) raised a bare TypeError from get,
    load_state and load_ledger. Now each is a StoreDataError."""
    from agentctx.errors import StoreDataError

    path = tmp_path / "foreign.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE recall (session, id, content)")
    db.execute("CREATE TABLE state (session, json)")
    db.execute("CREATE TABLE ledger (session, json)")
    db.execute("INSERT INTO recall VALUES ('s', 'ctx-0000000000000001', NULL)")
    db.execute("INSERT INTO state VALUES ('s', NULL)")
    db.execute("INSERT INTO ledger VALUES ('s', NULL)")
    db.commit()
    db.close()
    store = SQLiteRecallStore(path)
    try:
        with pytest.raises(StoreDataError, match="NULL"):
            store.get("s", "ctx-0000000000000001")
        with pytest.raises(StoreDataError, match="NULL"):
            store.load_state("s")
        with pytest.raises(StoreDataError, match="NULL"):
            store.load_ledger("s")
    finally:
        store.close()


def test_other_content_at_a_recall_id_is_not_handed_over_as_the_original(tmp_path: Path) -> None:
    """Found by a hostile run (CS 10): wrong data already at a recall id (INSERT OR IGNORE
    keeps what is there) was handed to the model as the original. Recall ids are content
    hashes: now what a read finds must be the content its id names, or it is a
    StoreDataError, which the recall tool turns into an explanation."""
    from agentctx.errors import StoreDataError

    path = tmp_path / "r.db"
    store = SQLiteRecallStore(path)
    try:
        rid = recall_id("s", "the original")
        db = sqlite3.connect(path)
        db.execute("INSERT INTO recall (session, id, content) VALUES ('s', ?, 'forged')", (rid,))
        db.commit()
        db.close()
        assert store.put("s", "the original") == rid  # kept what was there
        with pytest.raises(StoreDataError, match=rid):
            store.get("s", rid)
        other = store.put("s", "another")
        assert store.get("s", other) == "another"
    finally:
        store.close()


def test_a_limit_of_many_digits_is_capped_not_refused() -> None:
    """Found by a hostile run (CS 13): ``recall_context`` with ``{"limit":
    "99999999999999999999"}`` (a digit string) was refused, where the docs say digit strings
    are accepted and larger values capped to 8000. Now a plain digit string of up to as
    many digits as int() reads is read, and capped."""
    from agentctx.recall.tool import MAX_LIMIT, recall_arguments

    rid = recall_id("s", "x")
    for limit, read in [
        ("99999999999999999999", MAX_LIMIT),
        (" " + "9" * 4300, MAX_LIMIT),  # as many digits as int() reads: not converted
        ("0" * 40 + "12", 12),
    ]:
        parsed = recall_arguments({"id": rid, "limit": limit})
        assert isinstance(parsed, tuple), parsed
        assert parsed[2] == read
    for limit in ("-5", "1e9", "+5", "0" * 30, "9" * 4301):
        assert isinstance(recall_arguments({"id": rid, "limit": limit}), str)
