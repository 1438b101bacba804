"""Hostile input at the edges: the recall tool's model-written arguments, summarizer results,
configuration values and transcript files. Each test is the reproduction of a finding; the
fix made it a clear answer or a typed error instead of a hang, a crash or a traceback."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agentctx
from agentctx.budget import Budget, fraction_from_percent
from agentctx.errors import ConfigError, SummarizerError, TranscriptFormatError
from agentctx.events import Event, SummaryRejected
from agentctx.importers import (
    MAX_TRANSCRIPT_BYTES,
    claude_code,
    detect_format,
    load_transcript,
    openhands,
    pi,
    swe_agent,
)
from agentctx.importers._common import as_int
from agentctx.manager import ContextManager
from agentctx.messages import (
    AssistantMessage,
    Message,
    ToolResultMessage,
    Usage,
    UserMessage,
    to_dict,
)
from agentctx.pricing import Price
from agentctx.recall import MemoryRecallStore, SQLiteRecallStore, recall_tool
from agentctx.recall.tool import MAX_LIMIT
from agentctx.replay.cli import main
from agentctx.strategies import (
    BudgetPass,
    CondensePass,
    DeterministicCompaction,
    EmergencyPass,
    ExpiryPass,
    MicroCompact,
    ToolOutputPipeline,
)
from agentctx.strategies.llm import LlmCompaction, LlmCompactionConfig
from agentctx.strategy import Chain
from agentctx.summarizer import REQUIRED_SECTIONS, SummaryRequest, SummaryResult, check_result

from .corpus import corpus_file

# ---------------------------------------------------------------------------------------
# The recall_context tool (items 7, 8, 13)

# Any answer: at most a page, plus its header.
BOUND = MAX_LIMIT + 1_000


@asynccontextmanager
async def recall_manager(store: Any) -> AsyncIterator[ContextManager]:
    async with ContextManager(Budget(context_window=100_000), recall=store) as ctx:
        yield ctx


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "memory":
        yield MemoryRecallStore()
        return
    sqlite = SQLiteRecallStore(tmp_path / "recall.db")
    yield sqlite
    sqlite.close()


async def ask(ctx: ContextManager, arguments: object) -> str:
    """``ctx.handle_recall(arguments)``, awaited when it is a coroutine."""
    answer: Any = ctx.handle_recall(arguments)
    if inspect.isawaitable(answer):
        answer = await answer
    assert isinstance(answer, str)
    return answer


def no_surrogates(text: str) -> bool:
    return not re.search("[\ud800-\udfff]", text)


async def test_a_catastrophic_pattern_is_searched_as_literal_text_in_linear_time(
    store: Any,
) -> None:
    """Item 8: ``(a+)+$`` over ``"a" * 26 + "!"`` blocked the event loop for 20 s."""
    async with recall_manager(store) as ctx:
        rid = store.put(ctx.session_id, "a" * 26 + "!")
        started = time.perf_counter()
        answer = await ask(ctx, {"id": rid, "pattern": "(a+)+$"})
        assert time.perf_counter() - started < 2  # the pattern backtracking took 20 s
        assert answer.startswith(f"[recall_context {rid}: 0 lines match '(a+)+$'")
        # Literal, case-insensitive, per line; a big input stays fast too.
        big = store.put(ctx.session_id, ("a" * 5_000 + "\n") * 2_000 + "x (A+)+$ y")
        started = time.perf_counter()
        answer = await ask(ctx, {"id": big, "pattern": "(a+)+$"})
        assert time.perf_counter() - started < 2  # the pattern backtracking took 20 s
        assert "1 lines match" in answer and answer.endswith("2001: x (A+)+$ y")
    description = recall_tool("anthropic")["description"]
    assert "not a regular expression" in description


async def test_lone_surrogates_in_any_argument_get_a_clear_answer(store: Any) -> None:
    """Item 7: ``{"id": "\\ud800"}`` raised (UnicodeEncodeError in the SQLite store)."""
    async with recall_manager(store) as ctx:
        rid = store.put(ctx.session_id, "line one\nline two")
        for arguments, expected in [
            ({"id": "\ud800"}, "is not a recall id"),
            ({"id": "ctx-\udcff" + "0" * 15}, "is not a recall id"),
            ({"id": rid, "pattern": "\ud800"}, "unpaired UTF-16 surrogates"),
            ({"id": rid, "offset": "\ud800"}, "`offset` must be a whole number"),
            ({"id": rid, "limit": "\udfff"}, "`limit` must be a whole number"),
        ]:
            answer = await ask(ctx, arguments)
            assert expected in answer, arguments
            assert no_surrogates(answer)
            answer.encode("utf-8")  # sendable as is
        # Lone surrogates in the stored content are shown as U+FFFD, offsets unchanged.
        odd = "ab\udcffcd"
        oid = store.put(ctx.session_id, odd)
        page = await ask(ctx, {"id": oid, "offset": 1, "limit": 3})
        if isinstance(store, MemoryRecallStore):
            assert page.endswith("\nb\ufffdc")
        assert no_surrogates(page)


async def test_every_argument_is_validated_and_bad_input_is_echoed_short(store: Any) -> None:
    """Item 13: ``offset="²"`` and ``limit="9"*5000`` raised ValueError; grep ignored ``limit``
    (10 MB back, exempt from truncation); "not found" echoed a 5 MB id."""
    async with recall_manager(store) as ctx:
        rid = store.put(ctx.session_id, "0123456789" * 10)
        assert "`offset` must be a whole number >= 0, got '²'" in await ask(
            ctx, {"id": rid, "offset": "²"}
        )
        answer = await ask(ctx, {"id": rid, "limit": "9" * 5000})
        assert "`limit` must be a whole number from 1 to" in answer and len(answer) < 300
        for bad in ("-1", "1_000", "+5", " 1e3", "0x10", "١٢"):  # only plain ASCII digits
            assert "`offset` must be a whole number" in await ask(
                ctx, {"id": rid, "offset": bad}
            ), bad
        assert "`offset` must be a whole number >= 0, got -3" in await ask(
            ctx, {"id": rid, "offset": -3}
        )
        assert "`limit` must be a whole number from 1" in await ask(ctx, {"id": rid, "limit": 0})
        assert "`limit` must be a whole number from 1" in await ask(ctx, {"id": rid, "limit": 1.5})
        assert (await ask(ctx, {"id": rid, "offset": 10.0, "limit": "5"})).endswith("\n01234")
        assert "the offset is past the end (100 chars)" in await ask(
            ctx, {"id": rid, "offset": 10**30}
        )
        # Found by a hostile run (BF 4): the bound, not the offset sent, was echoed.
        assert "1000000000000000000" not in await ask(ctx, {"id": rid, "offset": 1e20})
        assert "offset 100 is past the end" in await ask(ctx, {"id": rid, "offset": 100})
        assert "got a list" in await ask(ctx, {"id": rid, "limit": [[[[1]]]]})

        # "not found" never echoes more than a short prefix of a huge id
        answer = await ask(ctx, {"id": "x" * 5_000_000})
        assert "is not a recall id" in answer and len(answer) < 300
        answer = await ask(ctx, {"id": "ctx-0000000000000000"})
        assert answer == '[recall_context] id "ctx-0000000000000000" was not found in this session.'

        # a huge page request is capped, and the header tells where to read on
        huge = store.put(ctx.session_id, "y" * 10_000_000)
        answer = await ask(ctx, {"id": huge, "limit": 100})
        assert answer.endswith("\n" + "y" * 100)
        answer = await ask(ctx, {"id": huge, "limit": 10**9})
        assert len(answer) < BOUND and f"next offset={MAX_LIMIT}" in answer

        # grep applies `limit` to the total text of the lines it returns (10 MB before)
        lines = store.put(
            ctx.session_id, "\n".join(f"match {i} " + "z" * 100 for i in range(100_000))
        )
        answer = await ask(ctx, {"id": lines, "pattern": "match", "limit": 100})
        head, body = answer.split("\n", 1)
        assert len(body) <= 100 and body.startswith("1: match 0 zzz")
        assert "10000+ lines match" in head and "more not shown" in head
        answer = await ask(ctx, {"id": lines, "pattern": "MATCH 5 "})
        assert answer.split("\n", 1)[0].startswith(f"[recall_context {lines}: 1 lines match")
        # a 10 MB line is shown around its match, with where the match is
        answer = await ask(ctx, {"id": huge, "pattern": "yyy"})
        assert len(answer) < 1_000 and "a line of 10000000 chars" in answer
        needle = store.put(ctx.session_id, "q" * 1_000_000 + "NEEDLE" + "q" * 1_000_000)
        answer = await ask(ctx, {"id": needle, "pattern": "needle"})
        assert "NEEDLE" in answer and len(answer) < 1_000
        offset = int(re.findall(r"offset=(\d+)", answer)[-1])
        part = await ask(ctx, {"id": needle, "offset": offset, "limit": 400})
        assert "NEEDLE" in part
        # patterns: bounded length, one line
        assert "at most 500" in await ask(ctx, {"id": rid, "pattern": "p" * 100_000})
        assert "cannot hold a line break" in await ask(ctx, {"id": rid, "pattern": "a\nb"})


_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=50),
    st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), max_size=5),
    st.sampled_from(["", "0", "10", "²", "9" * 5000, "x" * 200_000, "(a+)+$", "ctx-"]),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)
_KEYS = st.sampled_from(["id", "offset", "limit", "pattern", "extra", "\ud800"])


async def test_handle_recall_answers_anything_with_a_bounded_text(tmp_path: Path) -> None:
    """Arbitrary JSON-ish argument mappings (lone surrogates, huge strings, nested values,
    wrong types): a str of bounded length without lone surrogates, never an exception."""
    sqlite = SQLiteRecallStore(tmp_path / "fuzz.db")
    memory = MemoryRecallStore()
    content = "alpha\nBeta (a+)+$ \udcff\n" + "g" * 30_000
    async with recall_manager(memory) as m, recall_manager(sqlite) as s:
        managers = [(m, memory.put(m.session_id, content)), (s, sqlite.put(s.session_id, content))]

        @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(
            arguments=st.dictionaries(_KEYS, _VALUES, max_size=5),
            real_id=st.booleans(),
            other=_VALUES,
        )
        def check(arguments: dict[str, Any], real_id: bool, other: Any) -> None:
            for ctx, rid in managers:
                if real_id:
                    arguments = {**arguments, "id": rid}
                for given_arguments in (arguments, other):
                    answer = anyio.from_thread.run(ask, ctx, given_arguments)
                    assert isinstance(answer, str) and len(answer) < BOUND
                    assert no_surrogates(answer)

        # Hypothesis runs in a worker thread; each call goes back to the event loop, so the
        # test holds whether handle_recall is a plain or an async method.
        await anyio.to_thread.run_sync(check)
    sqlite.close()


# ---------------------------------------------------------------------------------------
# Configuration values (item 17)


def test_context_manager_names_the_default_reserve_it_rejected() -> None:
    """``ContextManager(10_000)`` failed without saying the reserve was the default 16,000."""
    with pytest.raises(ConfigError) as caught:
        ContextManager(10_000)
    message = str(caught.value)
    assert "reserve_output=16000 (the default)" in message
    assert "context_window=10000" in message


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: EmergencyPass(usage_fraction=90), "EmergencyPass.usage_fraction"),
        (lambda: EmergencyPass(usage_fraction=-1), "usage_fraction=-1"),
        (lambda: EmergencyPass(usage_fraction=float("nan")), "usage_fraction=nan"),
        (lambda: EmergencyPass(usage_fraction="0.9"), "usage_fraction='0.9'"),
        (lambda: EmergencyPass(protect_recent_turns=True), "protect_recent_turns=True"),
        (lambda: ExpiryPass(expire_seconds=-1), "ExpiryPass.expire_seconds"),
        (lambda: ExpiryPass(thinking_expire_seconds=-0.5), "thinking_expire_seconds=-0.5"),
        (lambda: ExpiryPass(keep_recent=-2), "keep_recent=-2"),
        (lambda: ExpiryPass(user_shell_chars=0), "user_shell_chars=0"),
        (lambda: ExpiryPass(expire_seconds=float("inf")), "expire_seconds=inf"),
        (lambda: MicroCompact(gap_seconds=-1), "MicroCompact.gap_seconds"),
        (lambda: MicroCompact(keep_recent=2.5), "keep_recent=2.5"),
        (lambda: BudgetPass(max_chars_per_turn=-1), "BudgetPass.max_chars_per_turn"),
        (lambda: BudgetPass(preview_chars=False), "preview_chars=False"),
        (lambda: CondensePass(max_ratio=1.5), "CondensePass.max_ratio"),
        (lambda: CondensePass(head_lines=-1), "head_lines=-1"),
        (lambda: ToolOutputPipeline(target_ratio=40), "target_ratio=40"),
        (lambda: ToolOutputPipeline(clear_at_least=-5), "clear_at_least=-5"),
        (lambda: ToolOutputPipeline(cache_ttl_seconds=-1), "cache_ttl_seconds=-1"),
        (
            lambda: ToolOutputPipeline(l2=0.9),
            "ToolOutputPipeline.l2 must be a pass config (EmergencyPass)",
        ),
        (lambda: ToolOutputPipeline(exclude_tools="recall_context"), "exclude_tools='recall"),
        (lambda: DeterministicCompaction(max_lines=True), "max_lines=True"),
        (lambda: DeterministicCompaction(max_chars=0), "DeterministicCompaction.max_chars"),
        (lambda: DeterministicCompaction(keep_recent_steps=-1), "keep_recent_steps=-1"),
        (lambda: DeterministicCompaction(cold_cache_seconds=-1.0), "cold_cache_seconds=-1.0"),
        (lambda: Budget(context_window=True), "context_window=True"),
        (lambda: Budget(context_window="200000"), "context_window='200000'"),
        (lambda: Budget(context_window=50_000, reserve_output=-1), "reserve_output=-1"),
        (lambda: Budget(context_window=50_000, trigger_ratio=75), "not a percentage"),
        (lambda: Budget(context_window=50_000, target_ratio=0.9), "trigger_ratio=0.75 (the"),
        (lambda: Budget(context_window=50_000, hard_budget=0), "hard_budget=0"),
        (lambda: Budget(context_window=50_000, hard_budget=1.5), "hard_budget=1.5"),
        (lambda: fraction_from_percent(True), "must be a number, got True"),
        # Found by hostile testing: an empty one was replaced by a random one, so a second
        # worker given the same (empty) id resumed nothing, and said nothing.
        (lambda: ContextManager(50_000, session_id=""), "session_id is a non-empty string"),
        (lambda: ContextManager(50_000, session_id=7), "got 7"),
    ],
)
def test_config_errors_name_the_field_and_the_value(make: Any, expected: str) -> None:
    """Fractions outside 0-1, negative counts and ages, non-numbers and bools were accepted."""
    with pytest.raises(ConfigError) as caught:
        make()
    assert expected in str(caught.value)


def test_the_defaults_and_edge_values_are_accepted() -> None:
    ToolOutputPipeline()
    DeterministicCompaction()
    EmergencyPass(usage_fraction=1)
    ExpiryPass(expire_seconds=0, keep_recent=0, protect_recent_turns=0)
    ToolOutputPipeline(target_ratio=None, clear_at_least=0, exclude_tools=frozenset())
    DeterministicCompaction(cold_cache_seconds=None, keep_recent_steps=0)
    Budget(context_window=1, reserve_output=0, trigger_ratio=1, target_ratio=1)


# ---------------------------------------------------------------------------------------
# Summarizer results (item 16)

BRIEFING = "\n".join(f"## {name}\nNone." for name in REQUIRED_SECTIONS)


class Returns:
    """A summarizer returning ``result`` on every call, whatever it is."""

    model = "claude-haiku-4-5"

    def __init__(self, result: object) -> None:
        self.result = result
        self.calls = 0

    async def summarize(self, request: SummaryRequest) -> Any:
        self.calls += 1
        return self.result


async def summarize_with(result: object) -> tuple[list[SummaryRejected], LlmCompaction]:
    summarizer = Returns(result)
    llm = LlmCompaction(
        summarizer, LlmCompactionConfig(trigger_ratio=0.3, price=Price(1.0, 5.0, 0.1, 1.25))
    )
    events: list[Event] = []
    async with ContextManager(
        Budget(context_window=3_000, reserve_output=1_000),
        strategy=Chain([llm, DeterministicCompaction()]),
        on_over_budget="send",
    ) as ctx:
        ctx.subscribe(events.append)
        view: list[Message] = []
        for i in range(20):
            turn = [UserMessage.of(f"user {i} " + "word " * 60), AssistantMessage.of("ok " * 60)]
            view = await ctx.prepare([*view, *turn])
            await anyio.sleep(0.005)
            if any(isinstance(e, SummaryRejected) for e in events):
                break
    assert summarizer.calls >= 1
    return [e for e in events if isinstance(e, SummaryRejected)], llm


@pytest.mark.parametrize(
    ("result", "detail"),
    [
        (SummaryResult(text=None, stop_reason="stop"), "text that is None, not a str"),  # type: ignore[arg-type]
        (None, "the summarizer returned None, not a SummaryResult"),
        ({"text": BRIEFING}, "a dict, not a SummaryResult"),
        (SummaryResult(text=BRIEFING, stop_reason="done"), "stop_reason 'done'"),  # type: ignore[arg-type]
        (SummaryResult(text=BRIEFING, stop_reason="stop", model=7), "model 7"),  # type: ignore[arg-type]
        (
            SummaryResult(
                text=BRIEFING,
                stop_reason="stop",
                usage=Usage(input_tokens=-1000, output_tokens=-1000),
            ),
            "usage.input_tokens=-1000; token counts are ints from 0 to 1,000,000,000",
        ),
        (
            SummaryResult(text=BRIEFING, stop_reason="stop", usage=Usage(output_tokens="12")),  # type: ignore[arg-type]
            "usage.output_tokens='12'",
        ),
        (
            SummaryResult(text=BRIEFING, stop_reason="stop", usage=Usage(cache_read_tokens=True)),
            "usage.cache_read_tokens=True",
        ),
        (
            SummaryResult(text=BRIEFING, stop_reason="stop", usage={"input_tokens": 1}),
            "usage a dict",
        ),  # type: ignore[arg-type]
    ],
)
async def test_a_malformed_summarizer_result_is_a_failed_request_with_a_reason(
    result: object, detail: str
) -> None:
    """A ``None`` text gave ``SummaryRejected(reason="")``; negative usage a negative spend.
    What a refused result reports it was billed is counted as any usage is read (a count
    that is no token count is 0), in the rejection's ``summary`` (found by a hostile run, AM
    finding 3: a billed reply's usage was dropped with the result). A reply that came is
    billed whatever it holds: one with no usage it can be read from, at a cost no one told
    (BT summaries 1: such replies went missing from the spend)."""
    rejected, llm = await summarize_with(result)
    assert rejected, "the malformed result was not rejected"
    first = rejected[0]
    assert first.reason == "failed" and first.attempts == 1  # not retried
    assert detail in first.detail
    assert all(e.reason and e.detail for e in rejected)
    assert all(e.summary is not None for e in rejected)
    spend = llm.spend
    assert spend.requests == len(rejected)
    assert (spend.cost_usd or 0.0) >= 0.0 and min(vars_of(spend.usage)) >= 0
    billed = [e.summary.usage for e in rejected if e.summary is not None]
    expected = Usage(input_tokens=1) if detail == "usage a dict" else Usage()
    assert billed == [expected] * len(rejected)


def vars_of(usage: Usage) -> list[int]:
    return [
        usage.input_tokens,
        usage.output_tokens,
        usage.cache_read_tokens,
        usage.cache_write_tokens,
        usage.cache_write_1h_tokens,
    ]


def test_check_result_accepts_a_well_formed_result() -> None:
    good = SummaryResult(text=BRIEFING, stop_reason="stop", usage=Usage(10, 5), model="m")
    assert check_result(good) is good
    with pytest.raises(SummarizerError) as caught:
        check_result(SummaryResult(text=BRIEFING, stop_reason="stop", usage=Usage(-1)))
    assert caught.value.retryable is False and str(caught.value)
    # Hostile run U: a usage of 10**30 tokens was priced as it was.
    with pytest.raises(SummarizerError, match="token counts are ints from 0 to"):
        check_result(SummaryResult(text=BRIEFING, stop_reason="stop", usage=Usage(10**30)))


def test_a_native_briefing_is_made_sendable_and_an_empty_one_is_refused() -> None:
    """Found by a hostile run (U, finding 4): the messages of a provider-native briefing went
    unchecked: a lone surrogate in their text was spliced as it was (no later view could be
    encoded), and messages holding nothing replaced the span as a briefing."""
    from agentctx.messages import SummaryMessage, TextBlock
    from agentctx.summarizer import check_briefing

    odd = (UserMessage.of("brief \ud800 x"), SummaryMessage("summary \udfff"))
    checked = check_result(SummaryResult(text="", stop_reason="stop", messages=odd))
    assert checked.messages == (UserMessage.of("brief \ufffd x"), SummaryMessage("summary \ufffd"))
    assert check_briefing(checked) is None
    blank = (AssistantMessage((), "stop"), UserMessage((TextBlock("  "),)), SummaryMessage(""))
    refused = check_briefing(
        check_result(SummaryResult(text="", stop_reason="stop", messages=blank))
    )
    assert refused is not None and refused[0] == "empty"


@pytest.mark.parametrize(
    "payload",
    [
        {"type": "compaction", "content": "What was done so far \ud800", "signature": "sig"},
        {"type": "compaction", "id": "cmp_1", "encrypted_content": "enc\udfff"},
    ],
    ids=["anthropic", "openai"],
)
def test_a_native_item_holding_a_lone_surrogate_is_refused(payload: dict[str, str]) -> None:
    """Found by a hostile run: a provider's compaction item decoded from JSON with a lone
    surrogate was spliced as it was, and every later request failed to encode. Signed, it
    cannot be repaired: the reply is a failed attempt."""
    from agentctx.messages import OpaqueBlock

    item = (AssistantMessage((OpaqueBlock("p", payload),), "stop"),)
    with pytest.raises(SummarizerError, match="lone surrogate"):
        check_result(SummaryResult(text="", stop_reason="stop", messages=item))
    clean = {k: v.encode("utf-8", "replace").decode() for k, v in payload.items()}
    item = (AssistantMessage((OpaqueBlock("p", clean),), "stop"),)
    assert check_result(SummaryResult(text="", stop_reason="stop", messages=item)).messages == item


def _deep(n: int) -> dict[str, object]:
    inner: dict[str, object] = {}
    for _ in range(n):
        inner = {"a": inner}
    return inner


@pytest.mark.parametrize(
    "payload",
    [{"content": b"bytes"}, {"content": {1, 2}}, _deep(5000)],
    ids=["bytes", "set", "deep"],
)
def test_a_native_item_no_json_can_hold_is_a_summarizer_error(payload: dict[str, object]) -> None:
    """Found by a hostile run of the check above: what JSON cannot hold made its encoder
    raise TypeError or RecursionError out of `check_result`, and the billed reply was
    counted nowhere."""
    from agentctx.messages import OpaqueBlock

    item = (AssistantMessage((OpaqueBlock("p", payload),), "stop"),)
    with pytest.raises(SummarizerError, match="a message to splice holding a provider's item"):
        check_result(SummaryResult(text="", stop_reason="stop", messages=item))


async def test_a_briefing_with_a_lone_surrogate_is_spliced_as_text_a_request_can_carry() -> None:
    """Found by hostile testing: a reply decoded from JSON can hold a lone surrogate; the
    briefing was spliced as it was and no later view could be encoded as UTF-8 (every model
    call failed). `check_result` replaces each with U+FFFD."""
    from agentctx import Chain, ContextManager, DeterministicCompaction, LlmCompaction
    from agentctx.adapters.anthropic import to_anthropic
    from agentctx.testing.scripted import ScriptedSummarizer

    odd = SummaryResult(text=BRIEFING + " \ud800", stop_reason="stop", usage=Usage(10, 5))
    assert check_result(odd).text == BRIEFING + " \ufffd"
    summarizer = ScriptedSummarizer(default=BRIEFING + " \ud800")
    llm = LlmCompaction(summarizer)
    history: list[Message] = [UserMessage.of("the task")]
    spliced = False
    async with ContextManager(
        Budget(context_window=6_000, reserve_output=1_000),
        strategy=Chain([llm, DeterministicCompaction()]),
    ) as ctx:
        for k in range(40):
            history += [
                AssistantMessage.of(f"answer {k} " + "word " * 150),
                UserMessage.of(f"q{k}"),
            ]
            view = await ctx.prepare(history)
            json.dumps(to_anthropic(view), ensure_ascii=False).encode("utf-8")  # sendable
            spliced = spliced or any("\ufffd" in getattr(m, "text", "") for m in view)
            await anyio.sleep(0.01)  # the briefing is written between calls
    assert spliced


@pytest.mark.parametrize("strategy", ["default", "pipeline"])
async def test_a_model_s_nan_in_long_arguments_leaves_them_as_written(strategy: str) -> None:
    """(Hostile run ED, 5) A model's ``NaN`` in a Chat call's arguments (Python parses it)
    beside a long file body: cutting the body made a `ReplaceArguments` keeping the NaN,
    which the ledger refuses, so every call raised `ConfigError` once compaction reached
    that call. Uncut, they go back as the model wrote them; cut, the NaN kept beside the
    cut is null, which JSON holds."""
    from agentctx import Chain, DeterministicCompaction, ToolOutputPipeline
    from agentctx.adapters import from_openai_chat, to_openai_chat
    from agentctx.testing import assert_view_ok

    body = "\n".join(f"row {i}, value {i * 3}" for i in range(4000))
    written = '{"path":"data.csv","threshold":NaN,"content":' + json.dumps(body) + "}"
    call = {"id": "c1", "type": "function", "function": {"name": "write", "arguments": written}}
    chat: list[dict[str, Any]] = [
        {"role": "user", "content": "write the data file"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "written"},
    ]
    chosen = (
        DeterministicCompaction()
        if strategy == "default"
        else Chain([ToolOutputPipeline(), DeterministicCompaction()])
    )
    async with ContextManager(
        Budget(context_window=16_000, reserve_output=1_000), strategy=chosen
    ) as ctx:
        for k in range(30):
            chat += [
                {"role": "assistant", "content": f"step {k} " + "ok " * 200},
                {"role": "user", "content": f"next {k} " + "more " * 200},
            ]
            history = from_openai_chat(chat)
            view = await ctx.prepare(history)
            assert_view_ok(view, history)
            for m in to_openai_chat(view):
                for c in m.get("tool_calls") or ():
                    sent = c["function"]["arguments"]
                    assert sent == written or ('"threshold":null' in sent and len(sent) < 1000)
    assert len(ctx.ledger) > 0  # compacted


@asynccontextmanager
async def summarizer_closed(summarizer: Any) -> AsyncIterator[None]:
    try:
        yield
    finally:
        await summarizer.aclose()


async def test_a_lone_surrogate_in_the_history_fails_no_summary_request() -> None:
    """(Hostile run EA, 3) The transcript of a summary request is text agentctx writes, but a
    tool's undecodable output (a lone surrogate) went into it as it was: the SDK could not
    encode the request, so every summary of the stretch holding it failed unsent."""
    from agentctx import Chain, DeterministicCompaction, LlmCompaction, ToolCall
    from agentctx.messages import ToolResultMessage
    from agentctx.providers.anthropic_summarizer import AnthropicSummarizer
    from agentctx.summarizer import serialize_transcript
    from agentctx.testing import FakeAnthropic, Reply

    odd = ToolResultMessage.of("c1", "bytes: \udc9f end", tool_name="read")
    assert serialize_transcript([odd]).endswith("bytes: \ufffd end")
    failed: list[SummaryRejected] = []
    with FakeAnthropic(default=Reply.text(BRIEFING)) as srv:
        summarizer = AnthropicSummarizer("claude-haiku-4-5", api_key="t", base_url=srv.url)
        async with (
            summarizer_closed(summarizer),
            ContextManager(
                Budget(context_window=20_000, reserve_output=2_000),
                strategy=Chain([LlmCompaction(summarizer), DeterministicCompaction()]),
            ) as ctx,
        ):
            ctx.subscribe(lambda e: failed.append(e) if isinstance(e, SummaryRejected) else None)
            history: list[Message] = [UserMessage.of("the task")]
            for i in range(40):
                mark = "\udc9f" if i == 1 else ""
                out = f"out {mark} {i}\n" * 300
                call = ToolCall(id=f"c{i}", name="read", arguments={"path": f"f{i}"})
                history += [
                    AssistantMessage.of(tool_calls=[call]),
                    ToolResultMessage.of(f"c{i}", out, tool_name="read"),
                ]
                await ctx.prepare(history)
                await anyio.sleep(0.02)  # the summary is asked for between calls
    assert srv.requests and not failed, failed


# ---------------------------------------------------------------------------------------
# Transcript files (item 14)

LOADERS: list[Any] = [
    load_transcript,
    detect_format,
    pi.load,
    claude_code.load,
    swe_agent.load,
    openhands.load,
    openhands.load_instances,
]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_or_a_device_is_refused_before_reading(tmp_path: Path) -> None:
    """A FIFO hung forever; a symlink to /dev/zero read until MemoryError. In a process of its
    own, so that a regression fails on the timeout instead of hanging the test run."""
    fifo = tmp_path / "session.jsonl"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.jsonl"
    zero.symlink_to("/dev/zero")
    code = f"""
from agentctx.errors import TranscriptFormatError
from tests.test_hardening_input import LOADERS
for path in ({str(fifo)!r}, {str(zero)!r}, {str(tmp_path)!r}):
    for load in LOADERS:
        try:
            load(path)
        except TranscriptFormatError as e:
            print(e.line, e.expected)
"""
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parents[1],
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    n = len(LOADERS)
    assert lines == (
        ["0 a regular file, not a FIFO"] * n
        + ["0 a regular file, not a character device"] * n
        + ["0 a regular file, not a directory"] * n
    )


def test_the_bytes_read_are_bounded(tmp_path: Path) -> None:
    path = tmp_path / "history.json"
    path.write_text(json.dumps([to_dict(UserMessage.of("x" * 5_000))]), "utf-8")
    assert load_transcript(path).format == "neutral"
    for load in LOADERS:
        with pytest.raises(TranscriptFormatError) as caught:
            load(path, max_bytes=1_000)
        assert caught.value.line == 0
        assert "at most 1000 bytes (max_bytes)" in caught.value.expected
    assert MAX_TRANSCRIPT_BYTES >= 100 * 1024 * 1024


@pytest.mark.parametrize(
    ("name", "text", "line"),
    [
        ("deep.json", "[" * 200_000 + "]" * 200_000, 1),
        ("deep.jsonl", '{"type": "message", "x": ' + "[" * 200_000 + "]" * 200_000 + "}", 1),
        (
            "deep-later.json",
            '[\n{"role": "user",\n"content": ' + "[" * 5_000 + "]" * 5_000 + "}]",
            3,
        ),
        (
            "deep-second.jsonl",
            '{"type": "session", "version": 3, "id": "s"}\n{"type": "x", "y": '
            + "[" * 100_000
            + "]" * 100_000
            + "}",
            2,
        ),
        ("deep.traj", '{"history": [\n' + "[" * 100_000 + "]" * 100_000 + "]}", 2),
    ],
)
def test_deep_nesting_is_a_format_error_naming_the_line(
    tmp_path: Path, name: str, text: str, line: int
) -> None:
    """JSON nested 200k deep raised RecursionError."""
    path = tmp_path / name
    path.write_text(text, "utf-8")
    with pytest.raises(TranscriptFormatError) as caught:
        load_transcript(path)
    assert caught.value.path == str(path) and caught.value.line == line
    assert "nested less deeply" in caught.value.expected
    if name.endswith(".traj"):
        with pytest.raises(TranscriptFormatError, match="nested less deeply"):
            swe_agent.load(path)


@pytest.mark.parametrize("end", ["", "\\"], ids=["quote", "odd-backslash"])
def test_deep_nesting_with_an_unterminated_string_is_refused_in_linear_time(
    tmp_path: Path, end: str
) -> None:
    """Found by a hostile run (AK, finding 4): finding the line of the deepest nesting read
    an unterminated string again from every escaped quote inside it: a 164 KB file took 11 s
    to be refused, a 1 MB one hours; and (AL, finding 1) so it did still when the text ended
    in a lone backslash. 64,000 escaped quotes now take milliseconds (the bound leaves a
    thousand times that for a loaded machine)."""
    path = tmp_path / "deep.json"
    path.write_text('{"a":\n' + "[" * 100_000 + '"' + '\\"' * 64_000 + end, "utf-8")
    started = time.thread_time()
    with pytest.raises(TranscriptFormatError, match="nested less deeply") as caught:
        load_transcript(path)
    assert time.thread_time() - started < 2.0
    assert caught.value.line == 2


def test_a_transcript_giving_every_call_one_id_imports_in_linear_time(tmp_path: Path) -> None:
    """Found by a hostile run (AK, finding 3): calls that all had the id ``call_0`` (as some
    OpenAI-compatible servers give them) were renamed by counting up from ``#2`` each time:
    16,000 turns took 14 s to import. They keep the names they had (``call_0#2``, ...)."""
    history: list[dict[str, Any]] = [{"role": "user", "content": "the task"}]
    for i in range(20_000):
        call = {"id": "call_0", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        history += [
            {"role": "assistant", "content": f"step {i}", "tool_calls": [call]},
            {"role": "tool", "content": f"out {i}", "tool_call_ids": ["call_0"]},
        ]
    path = tmp_path / "one-id.traj"
    path.write_text(json.dumps({"history": history}), "utf-8")
    started = time.thread_time()
    messages = load_transcript(path).messages
    assert time.thread_time() - started < 10.0  # 14 s for 16,000 before; about 1 s now
    ids = [c.id for m in messages if isinstance(m, AssistantMessage) for c in m.tool_calls]
    assert ids[:3] == ["call_0", "call_0#2", "call_0#3"] and len(set(ids)) == 20_000
    results = [m.tool_call_id for m in messages if isinstance(m, ToolResultMessage)]
    assert results == ids


@pytest.mark.parametrize(
    ("text", "line", "expected"),
    [
        ('{"type": []}\n', 1, "a record with 'type' as a string (found list)"),
        ('{"type": "session"}\n{"type": {"a": 1}}\n', 2, "'type' as a string"),
        ("[" + "1" * 5000 + "]", 1, "limit"),  # Python refuses ints of over 4300 digits
        ('{"type": "message", "n": ' + "1" * 5000 + "}", 1, "limit"),
        (
            json.dumps([{"role": "assistant", "content": [], "usage": {"input_tokens": "12"}}]),
            1,
            "message 0 in agentctx's form with 'usage.input_tokens' as a whole number >= 0 "
            "(found '12')",
        ),
        (
            json.dumps(
                [
                    {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                    {"role": "assistant", "content": [], "usage": {"input_tokens": -5}},
                ],
                indent=1,
            ),
            11,
            "message 1 in agentctx's form with 'usage.input_tokens' as a whole number",
        ),
        (
            json.dumps([{"role": "assistant", "content": [], "usage": {"tokens": 1}}]),
            1,
            "'usage' keys among input_tokens",
        ),
        (
            json.dumps([{"role": "assistant", "content": [], "stop_reason": ["stop"]}]),
            1,
            "'stop_reason' as a string (found list)",
        ),
        (
            json.dumps([{"role": "tool", "tool_call_id": "c", "content": [], "is_error": "no"}]),
            1,
            "'is_error' as true or false (found str)",
        ),
        (
            json.dumps([{"role": "user", "content": [{"type": "image", "source": 1}]}]),
            1,
            "content block 0 with 'source' as a string (found int)",
        ),
        (
            json.dumps([{"role": "user", "content": [], "extra": [1, 2]}]),
            1,
            "'extra' as an object (found list)",
        ),
    ],
)
def test_wrong_types_in_known_fields_are_format_errors(
    tmp_path: Path, text: str, line: int, expected: str
) -> None:
    """A first line ``{"type": []}`` and neutral usage ``{"input_tokens": "12"}`` gave
    tracebacks (TypeError: unhashable; a str token count carried into prices)."""
    path = tmp_path / "transcript.json"
    path.write_text(text, "utf-8")
    with pytest.raises(TranscriptFormatError) as caught:
        load_transcript(path)
    assert caught.value.path == str(path) and caught.value.line == line
    assert expected in caught.value.expected


def test_claude_code_and_pi_records_with_a_type_that_is_no_string(tmp_path: Path) -> None:
    """Their own loaders (the format chosen by the caller) say so too, with the line."""
    source = corpus_file("claude-code", "spotter-short.jsonl").read_text("utf-8").splitlines()
    record = json.loads(source[1])
    record["type"] = []
    path = tmp_path / "cc.jsonl"
    path.write_text("\n".join([source[0], json.dumps(record), *source[2:]]), "utf-8")
    for load in (claude_code.load, load_transcript):
        with pytest.raises(TranscriptFormatError, match="'type' as a string") as caught:
            load(path)
        assert caught.value.line == 2
    source = corpus_file("pi", "before-compaction.jsonl").read_text("utf-8").splitlines()
    record = json.loads(source[3])
    record["type"] = {"message": True}
    path = tmp_path / "pi.jsonl"
    path.write_text("\n".join([*source[:3], json.dumps(record), *source[4:]]), "utf-8")
    for load in (pi.load, load_transcript):
        with pytest.raises(TranscriptFormatError, match="'type' as a string") as caught:
            load(path)
        assert caught.value.line == 4


def test_malformed_token_counts_are_zero_not_a_crash() -> None:
    """``Infinity`` (which Python's json reads) crashed int(); negative counts went through."""
    for bad in (float("inf"), float("nan"), -5, -1e300, True, "12", None, [1]):
        assert as_int(bad) == 0
    assert as_int(12) == 12 and as_int(12.9) == 12


_WRONG = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**20), 10**20),
    st.floats(),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
SMALL_CORPUS = [
    corpus_file("pi", "before-compaction.jsonl"),
    corpus_file("claude-code", "spotter-short.jsonl"),
    corpus_file("swe-agent", "demo-function_calling_simple.traj"),
    corpus_file("openhands", "v1-sdk-goal-events.jsonl"),
    corpus_file("openhands", "v0-trajs-basic.json"),
]


def _paths(value: Any, at: tuple[Any, ...] = (), depth: int = 0) -> Iterator[tuple[Any, ...]]:
    yield at
    if depth < 6 and isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*at, key), depth + 1)
    elif depth < 6 and isinstance(value, list):
        for i, item in enumerate(value[:4]):
            yield from _paths(item, (*at, i), depth + 1)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_field_of_a_real_transcript_set_to_a_wrong_type_is_no_traceback(
    data: st.DataObject,
) -> None:
    """Every corpus format, one field anywhere replaced by a value of another type: the file
    loads, or raises `TranscriptFormatError`; never anything else."""
    source = data.draw(st.sampled_from(SMALL_CORPUS))
    text = source.read_text("utf-8")
    records = (
        [json.loads(raw) for raw in text.splitlines()[:30] if raw.strip()]
        if source.suffix == ".jsonl"
        else [json.loads(text)]
    )
    k = data.draw(st.integers(0, len(records) - 1))
    at = data.draw(st.sampled_from(list(_paths(records[k]))))
    wrong = data.draw(_WRONG)
    if not at:
        records[k] = wrong
    else:
        parent = records[k]
        for step in at[:-1]:
            parent = parent[step]
        parent[at[-1]] = wrong
    body = "\n".join(json.dumps(r) for r in records)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / source.name
        path.write_text(body, "utf-8")
        try:
            load_transcript(path)
        except TranscriptFormatError as e:
            assert e.path == str(path) and e.expected


# ---------------------------------------------------------------------------------------
# The command line (item 14): every input error is one line on stderr and exit status 2


def bad_inputs(folder: Path) -> dict[str, Path]:
    """Transcript files that each broke the importers, by name."""
    files = {
        "type-list": ('{"type": []}\n', "t.jsonl"),
        "deep": ("[" * 200_000 + "]" * 200_000, "deep.json"),
        "neutral-usage": (
            json.dumps([{"role": "assistant", "content": [], "usage": {"input_tokens": "12"}}]),
            "n.json",
        ),
        "huge-int": ("[" + "1" * 5000 + "]", "i.json"),
        "not-utf8": ("", "b.jsonl"),
    }
    paths = {}
    for name, (text, file) in files.items():
        path = folder / file
        path.write_text(text, "utf-8")
        paths[name] = path
    paths["not-utf8"].write_bytes(b'{"type": "\xff"}\n')
    zero = folder / "zero.jsonl"
    zero.symlink_to("/dev/zero")
    paths["dev-zero"] = zero
    paths["directory"] = folder
    paths["missing"] = folder / "missing.jsonl"
    return paths


def test_cli_input_errors_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, path in bad_inputs(tmp_path).items():
        assert main(["replay", str(path)]) == 2, name
        out, err = capsys.readouterr()
        assert "Traceback" not in err and not out, name
        if name == "directory":  # a folder of transcripts: one line per file it skips
            lines = err.splitlines()
            assert all(line.startswith("agentctx: skipped ") for line in lines[:-1]), err
            assert lines[-1] == "agentctx: no transcript to replay", err
            continue
        assert err.startswith("agentctx: ") and err.count("\n") == 1, (name, err)
    assert main(["replay", "--context-window", "1000"]) == 2
    err = capsys.readouterr().err
    assert "reserve_output=16000, context_window=1000" in err and err.count("\n") == 1

    def raising(error: BaseException) -> Any:
        def load(path: object) -> Any:
            raise error

        return load

    for error in (
        MemoryError(),
        RecursionError("maximum recursion depth exceeded\nwhile decoding"),
        TranscriptFormatError("a\nb.jsonl", 3, "an object"),
    ):
        monkeypatch.setattr("agentctx.replay.cli.load_transcript", raising(error))
        assert main(["replay", "x.jsonl"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("agentctx: ") and err.count("\n") == 1, err
    assert capsys.readouterr().err == ""


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_cli_input_errors_from_python_m_agentctx(tmp_path: Path) -> None:
    paths = bad_inputs(tmp_path)
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    chosen = [fifo, paths["deep"], paths["dev-zero"], paths["type-list"]]
    for path in chosen:
        done = subprocess.run(
            [sys.executable, "-m", "agentctx", "replay", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=Path(__file__).parents[1],
        )
        assert done.returncode == 2, (path, done.stderr)
        assert done.stderr.startswith("agentctx: ") and done.stderr.count("\n") == 1, done.stderr
        assert "Traceback" not in done.stderr and done.stdout == ""


# -- messages built by hand with what JSON cannot hold ------------------------------------


def _nested(depth: int) -> list[Any]:
    top: list[Any] = []
    inner = top
    for _ in range(depth):
        inner.append([])
        inner = inner[0]
    return top


def _cyclic() -> dict[str, Any]:
    looped: dict[str, Any] = {}
    looped["self"] = looped
    return looped


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ({(1, 2): "pair"}, "key of type tuple"),
        ({"when": __import__("datetime").date(2026, 1, 2)}, "holding a date"),
        ({"ids": {1, 2}}, "holding a set"),
        ({"a": [{"b": b"raw"}]}, "holding a bytes"),
        ({"loop": _cyclic()}, "inside themselves"),
        ({"deep": _nested(5_000)}, "nested too deep"),
    ],
)
async def test_tool_arguments_json_cannot_hold_are_a_typed_error(
    arguments: dict[Any, Any], says: str
) -> None:
    """Arguments built by hand (a model's, parsed from JSON, always pass) used to raise
    TypeError or RecursionError from the estimator's encoder, on the first prepare() or on
    the first decision, or to drop every later usage report in the background."""
    from agentctx.errors import UnsupportedMessageError
    from agentctx.messages import ToolCall, ToolResultMessage

    bad = AssistantMessage((ToolCall("c1", "f", arguments),))
    history = [UserMessage.of("task"), bad, ToolResultMessage.of("c1", "ok")]
    async with ContextManager(50_000, session_id="s") as ctx:
        with pytest.raises(UnsupportedMessageError, match=says) as caught:
            await ctx.prepare(history)
        assert caught.value.index == 1
        assert ctx.raw == []  # nothing of it was taken in
        fine = [UserMessage.of("task")]
        assert await ctx.prepare(fine) == fine


async def test_arguments_json_can_hold_pass() -> None:
    """Shared sub-lists, tuples, nesting a parser allows and non-finite floats are JSON."""
    from agentctx.messages import ToolCall, ToolResultMessage

    shared = [1, 2]
    arguments = {"a": [shared, shared], "t": (1, "x"), "deep": _nested(200), "n": float("nan")}
    history = [
        UserMessage.of("task"),
        AssistantMessage((ToolCall("c1", "f", arguments),)),
        ToolResultMessage.of("c1", "ok"),
    ]
    async with ContextManager(50_000, session_id="s") as ctx:
        assert await ctx.prepare(history) == history
        assert ctx.counter.count_full(history[1]) > 0


def test_a_fingerprint_of_what_json_cannot_hold_is_a_typed_error() -> None:
    from agentctx.errors import UnsupportedMessageError
    from agentctx.messages import fingerprint

    odd = UserMessage.of("hi", when=__import__("datetime").date(2026, 1, 2))
    with pytest.raises(UnsupportedMessageError, match="JSON cannot hold"):
        fingerprint(odd)


@pytest.mark.parametrize(
    "make",
    [
        lambda: agentctx.Budget(context_window=200_000, trigger_ratio=10**400),
        lambda: agentctx.Budget(context_window=200_000, target_ratio=10**400),
        lambda: agentctx.LlmCompactionConfig(timeout=None),
        lambda: agentctx.LlmCompactionConfig(keep_first="1"),
        lambda: agentctx.LlmCompactionConfig(deadline=0),
        lambda: agentctx.RetryPolicy(base_delay=None),
        lambda: agentctx.RetryPolicy(jitter=2),
        lambda: agentctx.MessageCounter(max_entries=None),
        lambda: agentctx.MessageCounter(max_observations=2.0),
        lambda: agentctx.MessageCounter(message_overhead=float("nan")),
        lambda: agentctx.MessageCounter(message_overhead=-(10**6)),
        lambda: agentctx.MessageCounter(prior=float("inf")),
        lambda: agentctx.MessageCounter(decay=0),
        lambda: agentctx.MessageCounter("cl100k_base"),  # hostile run X: counted all text as 0
        lambda: agentctx.MessageCounter(object()),
        lambda: agentctx.MessageCounter(prior=10**400),
        lambda: agentctx.ContextManager(200_000, counter=5),
        lambda: agentctx.ContextManager(200_000, ledger="[]"),
        lambda: agentctx.ContextManager(200_000, clock=5),
        lambda: agentctx.Chain(None),
        # Hostile run BT (finding 1): settings read only once a summary was asked for (or
        # paid for) were taken, and failed then: every briefing thrown away after it was
        # billed, or a bare TypeError out of prepare().
        lambda: agentctx.LlmCompactionConfig(price="free"),
        lambda: agentctx.LlmCompactionConfig(required_sections="Goal"),
        lambda: agentctx.LlmCompactionConfig(required_sections=("Goal", "")),
        lambda: agentctx.LlmCompactionConfig(system_prompt=None),
        lambda: agentctx.LlmCompactionConfig(instruction=" "),
        lambda: agentctx.LlmCompactionConfig(update_instruction=b"go"),
        lambda: agentctx.LlmCompactionConfig(retry="10"),
        lambda: agentctx.LlmCompactionConfig(cold_cache_seconds="10"),
        lambda: agentctx.LlmCompactionConfig(cold_cache_seconds=float("nan")),
        lambda: agentctx.LlmCompactionConfig(protect_paid_work="no"),
        lambda: agentctx.MessageCounter(counter=[]),  # a list has a count() of its own
        lambda: agentctx.Quiet(tokens=1.5),
        lambda: agentctx.Quiet(tokens=10**30),
    ],
)
def test_a_setting_of_the_wrong_type_or_size_is_a_config_error(make: Any) -> None:
    """Found by a hostile run (V, finding 8): these escaped as bare `OverflowError` (a ratio
    checked with ``math.isfinite`` on a huge int), `TypeError` or `AttributeError`, or were
    taken (a negative message overhead gave negative prompt sizes)."""
    with pytest.raises(agentctx.ConfigError):
        make()


@pytest.mark.parametrize("reading", ["now", None, float("nan"), 10**400])
async def test_a_clock_that_gives_no_time_is_a_config_error(reading: object) -> None:
    """Found by a hostile run (V, finding 8): a clock returning a string failed as a bare
    `TypeError` in the manager, one returning None deep inside `ToolOutputPipeline`."""
    strategy = agentctx.Chain([agentctx.ToolOutputPipeline(), agentctx.DeterministicCompaction()])
    ctx = agentctx.ContextManager(20_000, clock=lambda: reading, strategy=strategy)
    with pytest.raises(agentctx.ConfigError, match="the clock returned"):
        async with ctx:
            await ctx.prepare([UserMessage.of("the task")])


def test_backoff_past_a_thousand_attempts_stays_a_number() -> None:
    """Found by a hostile run (X, finding 3): ``2.0 ** attempt`` overflowed past 1024
    attempts, and the request failed as a bug after the 1025th."""
    policy = agentctx.RetryPolicy(max_attempts=5000, base_delay=1.0, max_delay=30.0, jitter=0)
    assert policy.delay(1025, None, 0.0) == policy.delay(5000, None, 0.0) == 30.0
