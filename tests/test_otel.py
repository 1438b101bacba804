"""OpenTelemetry: spans for deciding prepare() calls and summarizer requests, through the SDK's
in-memory exporter on a provider passed explicitly (the global one is never touched)."""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Iterator

import anyio
import anyio.lowlevel
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv.attributes import error_attributes
from opentelemetry.trace import SpanKind, StatusCode

from agentctx import (
    AssistantMessage,
    Budget,
    BudgetExceededError,
    Chain,
    ConfigError,
    ContextManager,
    DeterministicCompaction,
    LlmCompaction,
    LlmCompactionConfig,
    Message,
    ToolCall,
    ToolResultMessage,
    UnsupportedMessageError,
    Usage,
    UserMessage,
)
from agentctx.integrations.otel import PREPARE_SPAN, OtelTracer
from agentctx.pricing import price_for
from agentctx.strategy import CompactionContext, Quiet
from agentctx.testing.scripted import Outcome, ScriptedSummarizer

from .helpers import tool_turn, user

BRIEFING = (
    "## Goal\nShip the parser.\n## Constraints\nKeep the API.\n## Decisions\nUse LALR.\n"
    "## Files touched\nsrc/parser.py\n## Open items\nWrite tests."
)
WORDS = ["alpha", "beta", "gamma", "delta", "parser", "cache", "config", "token", "budget", "retry"]


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    exporter.clear()


@pytest.fixture
def tracer(exporter: InMemorySpanExporter) -> OtelTracer:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return OtelTracer(provider)


def spans(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def turn(i: int, words: int = 60) -> list[Message]:
    prose = " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(words))
    return [UserMessage.of(f"user {i}: {prose}"), AssistantMessage.of(f"reply {i}: {prose}")]


def test_the_semantic_convention_names_are_the_current_ones() -> None:
    # The integration spells them out (the extra brings only opentelemetry-api).
    assert gen_ai.GEN_AI_OPERATION_NAME == "gen_ai.operation.name"
    assert gen_ai.GEN_AI_REQUEST_MODEL == "gen_ai.request.model"
    assert gen_ai.GEN_AI_RESPONSE_MODEL == "gen_ai.response.model"
    assert gen_ai.GEN_AI_REQUEST_MAX_TOKENS == "gen_ai.request.max_tokens"
    assert gen_ai.GEN_AI_RESPONSE_FINISH_REASONS == "gen_ai.response.finish_reasons"
    assert gen_ai.GEN_AI_USAGE_INPUT_TOKENS == "gen_ai.usage.input_tokens"
    assert gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS == "gen_ai.usage.output_tokens"
    assert gen_ai.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS == "gen_ai.usage.cache_read.input_tokens"
    assert (
        gen_ai.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS
        == "gen_ai.usage.cache_creation.input_tokens"
    )
    assert gen_ai.GEN_AI_PROVIDER_NAME == "gen_ai.provider.name"
    assert gen_ai.GEN_AI_CONVERSATION_ID == "gen_ai.conversation.id"
    assert error_attributes.ERROR_TYPE == "error.type"


async def test_one_span_per_deciding_call_with_its_sizes_and_events(
    exporter: InMemorySpanExporter, tracer: OtelTracer
) -> None:
    budget = Budget(context_window=6_000, reserve_output=1_000)
    history: list[Message] = [user("task")]
    deciding = 0
    async with ContextManager(budget, tracer=tracer, session_id="s1") as ctx:
        await ctx.prepare(history)  # decides nothing: no span
        assert exporter.get_finished_spans() == ()
        for n in range(30):
            history += tool_turn(n, lines=60)
            version = ctx.ledger.version
            await ctx.prepare(history)
            deciding += ctx.ledger.version != version
        version = ctx.ledger.version
        await ctx.prepare(history)  # settled: nothing new, no span
        assert ctx.ledger.version == version
    found = spans(exporter, PREPARE_SPAN)
    assert deciding > 0 and len(found) == deciding == len(exporter.get_finished_spans())
    for span in found:
        attrs = span.attributes or {}
        assert span.kind is SpanKind.INTERNAL
        assert span.status.status_code is StatusCode.UNSET
        assert attrs["gen_ai.conversation.id"] == "s1"
        assert attrs["agentctx.strategy"] == "DeterministicCompaction"
        assert attrs["agentctx.budget.limit"] == budget.limit
        assert attrs["agentctx.decisions"] > 0  # type: ignore[operator]
        assert attrs["agentctx.tokens.after"] <= budget.limit < attrs["agentctx.tokens.before"]  # type: ignore[operator]
        assert attrs["agentctx.messages.after"] <= attrs["agentctx.messages.before"]  # type: ignore[operator]
        assert span.start_time is not None and span.end_time is not None
        assert span.start_time <= span.end_time
        (event,) = [e for e in span.events if e.name == "contextCompacted"]
        ev = event.attributes or {}
        assert ev["strategy"] == "DeterministicCompaction"
        assert ev["tokensAfter"] == attrs["agentctx.tokens.after"]
        assert ev["decisions"] == attrs["agentctx.decisions"]
        assert isinstance(ev["actions"], tuple) and ev["actions"]
        assert "summary" not in ev  # null fields are left out
        assert span.start_time <= event.timestamp <= span.end_time


async def test_a_call_over_budget_is_an_error_span_with_the_budget_event(
    exporter: InMemorySpanExporter, tracer: OtelTracer
) -> None:
    budget = Budget(context_window=1_500, reserve_output=1_000)
    async with ContextManager(budget, tracer=tracer) as ctx:
        with pytest.raises(BudgetExceededError):
            await ctx.prepare([user("task " + "word " * 2_000)])
    (span,) = spans(exporter, PREPARE_SPAN)
    assert span.status.status_code is StatusCode.ERROR
    attrs = span.attributes or {}
    assert attrs["error.type"] == "agentctx.budget.BudgetExceededError"
    assert attrs["agentctx.messages.after"] == 1
    (event,) = [e for e in span.events if e.name == "budgetExceeded"]
    ev = event.attributes or {}
    assert ev["budget"] == budget.limit and ev["tokens"] > budget.limit  # type: ignore[operator]
    assert ev["usageFraction"] > 1.0  # type: ignore[operator]


async def test_a_call_refused_before_its_strategy_ran_measures_nothing(
    exporter: InMemorySpanExporter, tracer: OtelTracer
) -> None:
    """Found by a hostile run: a history refused as it came in was an error span saying the
    budget was 0 and the view 0 tokens."""
    async with ContextManager(Budget(context_window=20_000), tracer=tracer) as ctx:
        with pytest.raises(UnsupportedMessageError):
            await ctx.prepare([user("hello"), "bogus"])  # type: ignore[list-item]
    (span,) = spans(exporter, PREPARE_SPAN)
    attrs = span.attributes or {}
    assert attrs["error.type"] == "agentctx.errors.UnsupportedMessageError"
    assert not {"agentctx.budget.limit", "agentctx.tokens.before"} & set(attrs)


async def test_a_call_whose_count_failed_is_an_error_span_and_its_error_alone(
    exporter: InMemorySpanExporter, tracer: OtelTracer
) -> None:
    """Found by a re-run: a count of one's own counter that failed before the strategy ran
    failed again as the span was made (the tokens after), so no span was recorded and the
    caller got a second error chained onto the first."""
    from agentctx.tokens import MessageCounter

    class Flaky:
        def count(self, text: str) -> int:
            return -3 if "poison" in text else len(text) // 4

    counter = MessageCounter(Flaky(), lazy=False)
    async with ContextManager(Budget(context_window=20_000), counter=counter, tracer=tracer) as ctx:
        await ctx.prepare([user("hello")])
        with pytest.raises(ConfigError, match="Flaky counted -3") as raised:
            await ctx.prepare([user("hello"), user("poison")])
    assert raised.value.__context__ is None
    (span,) = spans(exporter, PREPARE_SPAN)
    assert (span.attributes or {})["error.type"] == "agentctx.errors.ConfigError"


async def test_a_call_cancelled_while_its_strategy_awaits_is_an_error_span(
    exporter: InMemorySpanExporter, tracer: OtelTracer
) -> None:
    """Found by hostile testing: the span of a cancelled call had status UNSET, no
    ``error.type`` and ``agentctx.messages.after`` 0, an ordinary call that emptied the view."""

    class Awaiting:
        def __init__(self) -> None:
            self.inner = DeterministicCompaction()

        async def compact(self, ctx: CompactionContext) -> Quiet | None:
            quiet = await self.inner.compact(ctx)
            await anyio.lowlevel.checkpoint()  # where the call is cancelled
            return quiet

    history = [user("task")] + [m for n in range(30) for m in tool_turn(n, lines=60)]
    budget = Budget(context_window=6_000, reserve_output=1_000)
    async with ContextManager(budget, strategy=Awaiting(), tracer=tracer) as ctx:
        with anyio.CancelScope() as scope:

            async def cancel() -> None:
                scope.cancel()

            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel)  # runs once the strategy awaits
                await ctx.prepare(history)
        assert scope.cancelled_caught
        await ctx.prepare(history)  # the session goes on
        view = await ctx.prepare([*history, user("more")])
    cancelled, *done = spans(exporter, PREPARE_SPAN)
    assert cancelled.status.status_code is StatusCode.ERROR
    attrs = cancelled.attributes or {}
    assert "CancelledError" in str(attrs["error.type"])
    assert "agentctx.messages.after" not in attrs and attrs["agentctx.decisions"] > 0  # type: ignore[operator]
    assert all(s.status.status_code is not StatusCode.ERROR for s in done)
    assert all((s.attributes or {})["agentctx.messages.after"] > 0 for s in done)  # type: ignore[operator]
    assert view[0] == history[0]


async def session_with_summaries(
    tracer: OtelTracer, summarizer: ScriptedSummarizer, turns: int = 30
) -> list[str]:
    llm = LlmCompaction(summarizer, LlmCompactionConfig(trigger_ratio=0.5))
    budget = Budget(context_window=3_000, reserve_output=1_000)
    history: list[Message] = []
    names: list[str] = []
    async with ContextManager(budget, strategy=Chain([llm, DeterministicCompaction()]),
                              tracer=tracer, session_id="s2") as ctx:  # fmt: skip
        ctx.subscribe(lambda e: names.append(type(e).__name__))
        for i in range(turns):
            history += turn(i)
            view = await ctx.prepare(history)
            ctx.observe(Usage(input_tokens=ctx.counter.count_many(view)))
            for _ in range(3):
                await anyio.lowlevel.checkpoint()
    return names


async def test_a_summarizer_request_is_a_genai_client_span_with_usage_and_cost(
    exporter: InMemorySpanExporter, tracer: OtelTracer
) -> None:
    usage = Usage(input_tokens=1_000, output_tokens=200, cache_read_tokens=300)
    summarizer = ScriptedSummarizer(
        default=Outcome.reply(BRIEFING, usage=usage), model="claude-haiku-4-5"
    )
    names = await session_with_summaries(tracer, summarizer)
    assert "ContextCompacted" in names
    chats = spans(exporter, "chat claude-haiku-4-5")
    assert chats and len(chats) == len(summarizer.requests)
    price = price_for("claude-haiku-4-5")
    assert price is not None
    prepares = {s.context.span_id: s for s in spans(exporter, PREPARE_SPAN)}
    for span in chats:
        attrs = span.attributes or {}
        assert span.kind is SpanKind.CLIENT
        assert span.status.status_code is StatusCode.UNSET
        assert attrs[gen_ai.GEN_AI_OPERATION_NAME] == "chat"
        assert attrs[gen_ai.GEN_AI_REQUEST_MODEL] == "claude-haiku-4-5"
        assert attrs[gen_ai.GEN_AI_RESPONSE_MODEL] == "claude-haiku-4-5"
        assert attrs[gen_ai.GEN_AI_REQUEST_MAX_TOKENS] > 0  # type: ignore[operator]
        assert attrs[gen_ai.GEN_AI_RESPONSE_FINISH_REASONS] == ("stop",)
        assert attrs[gen_ai.GEN_AI_USAGE_INPUT_TOKENS] == 1_300  # cached tokens included
        assert attrs[gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS] == 200
        assert attrs[gen_ai.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 300
        assert attrs[gen_ai.GEN_AI_CONVERSATION_ID] == "s2"
        assert attrs["agentctx.cost_usd"] == pytest.approx(price.cost(usage))
        assert attrs["agentctx.summary.messages"] > 0  # type: ignore[operator]
        assert attrs["agentctx.summary.attempt"] == 1
        assert gen_ai.GEN_AI_PROVIDER_NAME not in attrs  # a scripted summarizer has none
        # linked to the prepare call that started it, which says so
        (link,) = span.links
        started = prepares[link.context.span_id]
        assert (started.attributes or {})["agentctx.summary.requests_started"] == 1
    # the splice is a span event with the summarizer's cost
    spliced = [
        e
        for s in prepares.values()
        for e in s.events
        if e.name == "contextCompacted" and (e.attributes or {})["method"] == "summarized"
    ]
    assert spliced
    ev = spliced[0].attributes or {}
    assert ev["summary.model"] == "claude-haiku-4-5"
    assert ev["summary.usage.inputTokens"] == 1_000
    assert ev["summary.costUsd"] == pytest.approx(price.cost(usage))


async def test_a_failed_attempt_is_an_error_span_and_unknown_cost_is_left_out(
    exporter: InMemorySpanExporter, tracer: OtelTracer
) -> None:
    summarizer = ScriptedSummarizer(
        [Outcome.fail(status=400)], default=Outcome.reply(BRIEFING), model="my-own-model"
    )
    await session_with_summaries(tracer, summarizer)
    chats = spans(exporter, "chat my-own-model")
    assert len(chats) == len(summarizer.requests) >= 2
    failed, *rest = sorted(chats, key=lambda s: s.start_time or 0)
    attrs = failed.attributes or {}
    assert failed.status.status_code is StatusCode.ERROR
    assert "HTTP 400" in (failed.status.description or "")
    assert attrs[error_attributes.ERROR_TYPE] == "agentctx.errors.SummarizerError"
    assert attrs["http.response.status_code"] == 400
    assert gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS not in attrs
    for span in rest:
        attrs = span.attributes or {}
        assert span.status.status_code is StatusCode.UNSET
        assert attrs[gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS] > 0  # type: ignore[operator]
        assert "agentctx.cost_usd" not in attrs  # no known price


async def test_a_reply_reporting_no_tokens_has_no_cost_on_its_span_as_in_the_spend(
    exporter: InMemorySpanExporter, tracer: OtelTracer
) -> None:
    """A server that leaves usage out billed the reply all the same: its cost is unknown, as
    the events and `LlmCompaction.spend` say, not $0 (found by a hostile run: the span said
    0.0)."""
    summarizer = ScriptedSummarizer(
        default=Outcome.reply(BRIEFING, usage=Usage()), model="claude-haiku-4-5"
    )
    await session_with_summaries(tracer, summarizer)
    chats = spans(exporter, "chat claude-haiku-4-5")
    assert chats and len(chats) == len(summarizer.requests)
    for span in chats:
        assert "agentctx.cost_usd" not in (span.attributes or {})


async def test_a_timed_out_attempt_is_an_error_span(
    exporter: InMemorySpanExporter, tracer: OtelTracer
) -> None:
    summarizer = ScriptedSummarizer([Outcome.hang()], default=Outcome.reply(BRIEFING))
    llm = LlmCompaction(summarizer, LlmCompactionConfig(trigger_ratio=0.5, timeout=0.05))
    budget = Budget(context_window=3_000, reserve_output=1_000)
    history: list[Message] = []
    async with ContextManager(budget, strategy=Chain([llm, DeterministicCompaction()]),
                              tracer=tracer) as ctx:  # fmt: skip
        for i in range(12):
            history += turn(i)
            await ctx.prepare(history)
            await anyio.sleep(0.02)
        await anyio.sleep(0.1)
    timed_out = [s for s in exporter.get_finished_spans() if s.name.startswith("chat")]
    assert timed_out
    attrs = timed_out[0].attributes or {}
    assert timed_out[0].status.status_code is StatusCode.ERROR
    assert attrs[error_attributes.ERROR_TYPE] == "TimeoutError"


async def test_a_tracer_that_raises_never_reaches_the_loop() -> None:
    class Broken:
        def prepared(self, call: object) -> None:
            raise RuntimeError("exporter down")

        def attempt(self, attempt: object) -> object:
            raise RuntimeError("exporter down")

    summarizer = ScriptedSummarizer(default=BRIEFING)
    names = await session_with_summaries(Broken(), summarizer)  # type: ignore[arg-type]
    assert "ContextCompacted" in names and summarizer.completed > 0


def test_without_opentelemetry_the_integration_names_the_extra_and_the_library_works() -> None:
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "import anyio\n"
        "import agentctx\n"
        "from agentctx import AssistantMessage as A, Budget, ContextManager, MissingExtraError\n"
        "from agentctx import UserMessage as U\n"
        "try:\n"
        "    import agentctx.integrations.otel\n"
        "except MissingExtraError as exc:\n"
        "    print(exc.extra, exc.module, sep='|')\n"
        "async def main():\n"
        "    async with ContextManager(Budget(context_window=2_000, reserve_output=500)) as c:\n"
        "        h = []\n"
        "        for i in range(40):\n"
        "            h += [U.of(f'ask {i} ' + 'word ' * 40), A.of(f'answer {i} ' + 'ok ' * 40)]\n"
        "            await c.prepare(h)\n"
        "    print(len(c.ledger) > 0)\n"
        "anyio.run(main)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["otel|opentelemetry", "True"]


def test_import_agentctx_imports_no_opentelemetry() -> None:
    code = (
        "import sys, agentctx, agentctx.manager, agentctx.strategies.llm\n"
        "print([m for m in sys.modules if m.startswith('opentelemetry')])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def _exported_values(exporter: InMemorySpanExporter) -> list[object]:
    values: list[object] = []
    for span in exporter.get_finished_spans():
        values += [span.name, span.status.description or ""]
        for attributes in [span.attributes, *(e.attributes for e in span.events)]:
            for value in (attributes or {}).values():
                values += value if isinstance(value, tuple) else [value]
    return values


def _exportable(value: object) -> bool:
    if isinstance(value, str):
        return len(value) <= 4096 and value.encode("utf-8", "strict") is not None
    if isinstance(value, bool):
        return True
    if isinstance(value, int):
        return -(2**63) <= value < 2**63
    return not isinstance(value, float) or math.isfinite(value)


async def test_text_a_model_or_a_transcript_wrote_is_exported_bounded_and_valid(
    exporter: InMemorySpanExporter, tracer: OtelTracer
) -> None:
    """Found by a hostile run (BO 1): a 200 KB tool name with a lone surrogate went out
    whole in every action of a span's event, 2.4 M characters, which an OTLP exporter
    refuses with the whole batch; a session id too."""
    name = "read\ud800" + "a" * 200_000
    history: list[Message] = [UserMessage.of("task")]
    for i in range(12):
        history += [
            AssistantMessage((ToolCall(f"c{i}", name, {"path": "x.py"}),)),
            ToolResultMessage.of(f"c{i}", "line\n" * 3000, tool_name=name),
        ]
    async with ContextManager(
        Budget(context_window=200_000, reserve_output=1_000),
        tracer=tracer,
        session_id="s\udc00" + "x" * 100_000,
    ) as ctx:
        await ctx.prepare(history)
    values = _exported_values(exporter)
    assert any(isinstance(v, str) and v.startswith("truncated read") for v in values)
    assert all(_exportable(v) for v in values)


async def test_what_a_summarizer_server_says_is_exported_bounded_and_valid(
    exporter: InMemorySpanExporter, tracer: OtelTracer
) -> None:
    """Found by a hostile run (BO 2): an error message and a response's model name of a
    megabyte with a lone surrogate went out whole, and a status of 10**30, past what OTLP
    encodes (a status no server sends is now none at all)."""
    huge = "m\ud800" + "y" * 1_000_000
    summarizer = ScriptedSummarizer(
        [Outcome.fail(status=10**30, message=huge)],
        default=Outcome.reply(BRIEFING, model=huge),
        model="my-own-model",
    )
    await session_with_summaries(tracer, summarizer)
    chats = spans(exporter, "chat my-own-model")
    assert len(chats) >= 2
    failed = [s for s in chats if s.status.status_code is StatusCode.ERROR]
    assert failed and all("http.response.status_code" not in (s.attributes or {}) for s in failed)
    assert all(_exportable(v) for v in _exported_values(exporter))


async def test_a_custom_events_name_keys_and_numbers_are_exported_bounded_and_valid(
    exporter: InMemorySpanExporter, tracer: OtelTracer
) -> None:
    """Found by a hostile run (BQ 2, 3): a custom event's name and keys went out whole with
    their lone surrogates, and an integer of 5,000 digits raised from the tracer."""

    class Raw:
        def to_json(self) -> dict[object, object]:
            return {
                "type": "custom\udc00" + "T" * 10_000,
                "key\ud800" + "K" * 10_000: "v",
                "n": {"x" * 9_000: 10**5000},
                "items": [10**5000],
            }

    class Emitting:
        async def compact(self, ctx: CompactionContext) -> None:
            ctx.emit(Raw())  # type: ignore[arg-type]

    async with ContextManager(
        Budget(context_window=200_000), strategy=Emitting(), tracer=tracer
    ) as ctx:
        await ctx.prepare([UserMessage.of("task")])
    (span,) = spans(exporter, PREPARE_SPAN)
    (event,) = span.events
    keys = list(event.attributes or {})
    assert [event.name, *keys] and all(_exportable(v) for v in [event.name, *keys])
    assert all(_exportable(v) for v in _exported_values(exporter))
