"""The provider summarizers, through the real `anthropic` and `openai` SDKs over sockets."""

from __future__ import annotations

import gc
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anthropic
import anyio
import openai
import pytest

from agentctx import Budget, Chain, ContextManager, DeterministicCompaction, Usage
from agentctx._usage import billed_usage
from agentctx.errors import ConfigError, SummarizerError
from agentctx.events import ContextCompacted, Event, SummaryRejected
from agentctx.messages import Message
from agentctx.providers._retry_after import retry_after_seconds
from agentctx.providers.anthropic_compaction import AnthropicCompactionSummarizer
from agentctx.providers.anthropic_summarizer import AnthropicSummarizer
from agentctx.providers.openai_compaction import OpenAICompactionSummarizer
from agentctx.providers.openai_summarizer import OpenAIChatSummarizer, OpenAIResponsesSummarizer
from agentctx.strategies.llm import SUMMARY_MARKER, LlmCompaction, LlmCompactionConfig
from agentctx.summarizer import (
    REQUIRED_SECTIONS,
    Summarizer,
    SummaryRequest,
    SummaryResult,
    missing_sections,
)
from agentctx.testing import drive, synthetic_session
from agentctx.testing.servers import FakeAnthropic, FakeOpenAI, FakeServer, Reply

KINDS = ["anthropic", "chat", "responses"]
REQUEST = SummaryRequest(system="You summarize.", prompt="Summarize: hello.", max_tokens=300)


def briefing(goal: str = "Refactor the session cache in src/cache/file_0.py.") -> str:
    bodies = {
        "Goal": goal,
        "Constraints": "Keep the API.",
        "Decisions": "Use an LRU cache.",
        "Files touched": "src/cache/file_0.py",
        "Open items": "Write tests.",
    }
    return "\n".join(f"## {name}\n{bodies.get(name, 'None.')}" for name in REQUIRED_SECTIONS)


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """Unclosed clients or sockets warn when collected, and warnings are errors."""
    yield
    gc.collect(1)  # young garbage, cheap


@pytest.fixture(autouse=True, scope="module")
def no_cyclic_leaks() -> Iterator[None]:
    yield
    gc.collect()


def test_briefing_is_valid() -> None:
    assert missing_sections(briefing()) == []


@dataclass
class Setup:
    server: FakeServer
    summarizer: AnthropicSummarizer | OpenAIChatSummarizer | OpenAIResponsesSummarizer
    kind: str


@asynccontextmanager
async def setup(kind: str, *replies: Reply, http_timeout: float = 10.0) -> AsyncIterator[Setup]:
    """A fake server with ``replies`` queued and a summarizer on a caller-owned client."""
    if kind == "anthropic":
        async with (
            FakeAnthropic(list(replies)) as server,
            anthropic.AsyncAnthropic(
                base_url=server.url, api_key="test", max_retries=5, timeout=http_timeout
            ) as client,
        ):
            yield Setup(server, AnthropicSummarizer("claude-haiku-4-5", client=client), kind)
        return
    async with (
        FakeOpenAI(list(replies)) as oserver,
        openai.AsyncOpenAI(
            base_url=oserver.url + "/v1", api_key="test", max_retries=5, timeout=http_timeout
        ) as oclient,
    ):
        cls = OpenAIChatSummarizer if kind == "chat" else OpenAIResponsesSummarizer
        yield Setup(oserver, cls("gpt-test-mini", client=oclient), kind)


# ---------------------------------------------------------------------------------------
# Normal replies


@pytest.mark.parametrize("kind", KINDS)
async def test_normal_reply_text_usage_stop_reason(kind: str) -> None:
    reply = Reply.text(briefing(), input_tokens=100, output_tokens=7, cache_read=40, cache_write=10)
    async with setup(kind, reply) as s:
        assert isinstance(s.summarizer, Summarizer)
        result = await s.summarizer.summarize(REQUEST)
        body = s.server.requests[-1].json
    assert result.text == briefing()
    assert result.stop_reason == "stop"
    assert result.model == s.summarizer.model
    if kind == "anthropic":
        assert result.usage == Usage(100, 7, 40, 10)
        assert body["system"] == REQUEST.system
        assert body["messages"] == [{"role": "user", "content": REQUEST.prompt}]
        assert body["max_tokens"] == 300
        assert "tools" not in body
    else:
        # OpenAI's prompt count (150) includes the 40 cache reads and the 10 writes: input
        # is the rest
        assert result.usage == Usage(100, 7, 40, 10)
        assert result.usage.prompt_tokens == 150
    if kind == "chat":
        assert body["messages"] == [
            {"role": "system", "content": REQUEST.system},
            {"role": "user", "content": REQUEST.prompt},
        ]
        assert body["max_completion_tokens"] == 300
    if kind == "responses":
        assert body["instructions"] == REQUEST.system
        assert body["input"] == REQUEST.prompt
        assert body["max_output_tokens"] == 300
        assert body["store"] is False


@pytest.mark.parametrize("kind", KINDS)
async def test_simulated_cache_usage_adds_up(kind: str) -> None:
    async with setup(kind, Reply.text("a"), Reply.text("b")) as s:
        first = await s.summarizer.summarize(REQUEST)
        second = await s.summarizer.summarize(REQUEST)
        billed = [r.usage for r in s.server.requests]
    for result, bill in zip((first, second), billed, strict=True):
        assert bill is not None
        assert result.usage.prompt_tokens == bill.prompt_tokens
        assert result.usage.cache_read_tokens == bill.cache_read
        assert result.usage.cache_write_tokens == bill.cache_write
        assert result.usage.output_tokens == bill.output_tokens
    assert second.usage.cache_read_tokens > 0 and first.usage.cache_write_tokens > 0


async def test_max_tokens_override_and_max_tokens_param() -> None:
    async with FakeAnthropic([Reply.text("x")]) as server:
        async with AnthropicSummarizer(
            "claude-haiku-4-5", api_key="k", base_url=server.url, max_tokens=1234
        ) as summarizer:
            await summarizer.summarize(REQUEST)
        assert server.requests[-1].json["max_tokens"] == 1234
    async with FakeOpenAI([Reply.text("x")]) as oserver:
        async with OpenAIChatSummarizer(
            "local-model", api_key="k", base_url=oserver.url + "/v1", token_limit_param="max_tokens"
        ) as chat:
            await chat.summarize(REQUEST)
        sent = oserver.requests[-1].json
        assert sent["max_tokens"] == 300 and "max_completion_tokens" not in sent


async def test_request_options_reach_the_server() -> None:
    effort = {"output_config": {"effort": "low"}, "metadata": {"user_id": "u-1"}}
    async with FakeAnthropic([Reply.text("x")]) as server:
        async with AnthropicSummarizer(
            api_key="k", base_url=server.url, request_options=effort
        ) as summarizer:
            await summarizer.summarize(REQUEST)
        sent = server.requests[-1].json
        assert sent["output_config"] == {"effort": "low"} and sent["metadata"] == {"user_id": "u-1"}
        assert sent["model"] == "claude-haiku-5-5"  # the default: a current cheap model
    reasoning = {"reasoning_effort": "low"}
    async with FakeOpenAI([Reply.text("x"), Reply.text("y")]) as oserver:
        url = oserver.url + "/v1"
        async with OpenAIChatSummarizer(
            "m", api_key="k", base_url=url, request_options=reasoning
        ) as chat:
            await chat.summarize(REQUEST)
        async with OpenAIResponsesSummarizer(
            "m", api_key="k", base_url=url, request_options={"reasoning": {"effort": "low"}}
        ) as responses:
            await responses.summarize(REQUEST)
        chat_sent, responses_sent = (r.json for r in oserver.requests)
        assert chat_sent["reasoning_effort"] == "low" and chat_sent["max_completion_tokens"] == 300
        assert responses_sent["reasoning"] == {"effort": "low"}
        assert responses_sent["max_output_tokens"] == 300


@pytest.mark.parametrize("kind", KINDS)
async def test_max_tokens_is_length(kind: str) -> None:
    async with setup(kind, Reply.max_tokens("## Goal\ncut")) as s:
        result = await s.summarizer.summarize(REQUEST)
    assert result.stop_reason == "length"


@pytest.mark.parametrize("kind", KINDS)
async def test_refusal(kind: str) -> None:
    async with setup(kind, Reply.refusal("I can't help with that.")) as s:
        result = await s.summarizer.summarize(REQUEST)
    assert result.stop_reason == "refusal"


@pytest.mark.parametrize("kind", KINDS)
async def test_empty(kind: str) -> None:
    async with setup(kind, Reply.empty()) as s:
        result = await s.summarizer.summarize(REQUEST)
    assert result.text == ""


# ---------------------------------------------------------------------------------------
# Errors: one SummarizerError each, retryable as documented, no SDK retries


async def failure(kind: str, reply: Reply, *, http_timeout: float = 10.0) -> SummarizerError:
    async with setup(kind, reply, Reply.text("never reached"), http_timeout=http_timeout) as s:
        with pytest.raises(SummarizerError) as info:
            await s.summarizer.summarize(REQUEST)
        # SDK retries are off although the caller's client had max_retries=5
        assert len(s.server.requests) == 1
    error = info.value
    assert isinstance(error.__cause__, anthropic.APIError | openai.APIError | json.JSONDecodeError)
    return error


@pytest.mark.parametrize("kind", KINDS)
async def test_rate_limited_is_retryable_with_retry_after(kind: str) -> None:
    error = await failure(kind, Reply.rate_limited(retry_after=2))
    assert (error.retryable, error.status, error.retry_after) == (True, 429, 2.0)


@pytest.mark.parametrize("kind", KINDS)
async def test_overloaded_is_retryable(kind: str) -> None:
    error = await failure(kind, Reply.overloaded())
    assert error.retryable
    assert error.status == (529 if kind == "anthropic" else 503)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("status", [500, 502, 503])
async def test_server_error_is_retryable(kind: str, status: int) -> None:
    error = await failure(kind, Reply.server_error(status))
    assert (error.retryable, error.status) == (True, status)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("status", [400, 401, 403, 404])
async def test_client_errors_are_not_retryable(kind: str, status: int) -> None:
    error = await failure(kind, Reply.error(status))
    assert (error.retryable, error.status) == (False, status)


@pytest.mark.parametrize("kind", KINDS)
async def test_hang_times_out_retryable(kind: str) -> None:
    error = await failure(kind, Reply.hang(), http_timeout=0.2)
    assert error.retryable and error.status is None
    assert isinstance(error.__cause__, anthropic.APITimeoutError | openai.APITimeoutError)


@pytest.mark.parametrize("kind", KINDS)
async def test_reset_is_retryable(kind: str) -> None:
    error = await failure(kind, Reply.reset())
    assert error.retryable and error.status is None
    assert isinstance(error.__cause__, anthropic.APIConnectionError | openai.APIConnectionError)


@pytest.mark.parametrize("kind", KINDS)
async def test_malformed_body_is_retryable(kind: str) -> None:
    error = await failure(kind, Reply.malformed())
    assert error.retryable


@pytest.mark.parametrize(
    "body",
    [
        b"{}",
        b"null",
        b'{"choices": [{"message": null}]}',
        # Hostile run X: an int past what Python reads, JSON nested too deep, a text of
        # another type (refused later as a bug of the summarizer's, never retried).
        b'{"usage": {"input_tokens": ' + b"9" * 5001 + b"}}",
        b"[" * 200_000 + b"]" * 200_000,
        b'{"choices": [{"index": 0, "message": {"role": "assistant", "content": 5}, '
        b'"finish_reason": "stop"}], "content": [{"type": "text", "text": 5}], '
        b'"output": [{"type": "message", "content": [{"type": "output_text", "text": 5}]}]}',
    ],
    ids=["empty", "null", "no-message", "huge-int", "deep", "text-not-str"],
)
@pytest.mark.parametrize("kind", KINDS)
async def test_a_body_of_another_shape_is_retryable(kind: str, body: bytes) -> None:
    """Found by a hostile run (U, finding 2): a 200 whose JSON is of another shape (a proxy's,
    a look-alike server's) left the summarizers as a bare `TypeError` or `AttributeError`,
    which `LlmCompaction` takes for a bug of the summarizer's: never retried."""
    async with setup(kind, Reply.malformed(body)) as s:
        with pytest.raises(SummarizerError) as info:
            await s.summarizer.summarize(REQUEST)
    error = info.value
    assert error.retryable and "unreadable" in str(error)
    # A 200 came: billed, at the usage it states or an unknown amount. A body whose usage
    # could not be read at all (null, a list) was counted nowhere (found by a hostile run).
    assert billed_usage(error.usage) is not None


@pytest.mark.parametrize(
    ("kind", "count"),
    # The fake OpenAI server adds the counts up (total_tokens): a string only for Anthropic.
    [(kind, count) for kind in KINDS for count in (-50, 50.5, 10**30)]
    + [("anthropic", "50"), ("anthropic", False)],
)
async def test_a_usage_count_that_is_no_token_count_leaves_the_reply_unpriced(
    kind: str, count: Any
) -> None:
    """Found by a hostile run: the SDK's usage was read with such a count as 0 and the reply
    priced on the rest (``cost_usd=0.0001`` for output_tokens -50), where the docs say it is
    counted at ``cost_usd=None``."""
    async with setup(kind, Reply.text(briefing(), input_tokens=100, output_tokens=count)) as s:
        result = await s.summarizer.summarize(REQUEST)
    assert result.text == briefing()
    assert result.usage.output_tokens == (50 if count == 50.5 else 0)
    assert not result.usage_known
    async with setup(kind, Reply.text(briefing(), input_tokens=100, output_tokens=7)) as s:
        assert (await s.summarizer.summarize(REQUEST)).usage_known


async def test_an_unpriced_reply_is_spent_at_an_unknown_cost() -> None:
    class Unpriced:
        model = "claude-haiku-4-5"

        async def summarize(self, request: SummaryRequest) -> SummaryResult:
            return SummaryResult(
                text=briefing(), stop_reason="stop", usage=Usage(100, 0), usage_known=False
            )

    events, _, _ = await run_session(summarizer=Unpriced())
    assert summarized(events)
    costs = [e.summary.cost_usd for e in events if getattr(e, "summary", None) is not None]
    assert costs and all(cost is None for cost in costs)


async def test_an_unpriced_reply_refused_by_the_strategy_stays_unpriced() -> None:
    """Found by a hostile run: a reply saying ``usage_known=False`` that `check_result` then
    refused was priced on its counts all the same."""

    class RefusedUnpriced:
        model = "claude-haiku-4-5"

        async def summarize(self, request: SummaryRequest) -> SummaryResult:
            bad: Any = "finished"  # no StopReason: refused
            return SummaryResult(
                text=briefing(), stop_reason=bad, usage=Usage(100, 50), usage_known=False
            )

    summarizer = RefusedUnpriced()
    llm = LlmCompaction(summarizer, LlmCompactionConfig(timeout=5))
    events: list[Event] = []
    async with ContextManager(
        Budget(context_window=LIMIT + 1_000, reserve_output=1_000),
        strategy=Chain([llm, DeterministicCompaction()]),
    ) as manager:
        manager.subscribe(events.append)
        history: list[Message] = []
        for group in synthetic_session(seed=3, calls=60, mean_output_lines=10):
            history = (await drive(manager, [[*history, *group]]))[-1]
            await anyio.sleep(0.02)
            if llm.spend.requests:
                break
    rejected = [e for e in events if isinstance(e, SummaryRejected)]
    assert rejected and all(e.summary is not None and e.summary.cost_usd is None for e in rejected)
    assert llm.spend.requests >= 1 and llm.spend.cost_usd is None
    assert llm.spend.usage.output_tokens == 50 * llm.spend.requests


@pytest.mark.parametrize("kind", KINDS)
async def test_cancellation_propagates_untouched(kind: str) -> None:
    async with setup(kind, Reply.hang()) as s:
        with anyio.move_on_after(0.1) as scope:
            await s.summarizer.summarize(REQUEST)
        assert scope.cancelled_caught


def test_retry_after_forms() -> None:
    assert retry_after_seconds({"retry-after": "2"}) == 2.0
    assert retry_after_seconds({"retry-after": "0.05"}) == 0.05
    assert retry_after_seconds({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert retry_after_seconds({"retry-after": "Thu, 01 Jan 1970 00:00:00 GMT"}) == 0.0
    assert retry_after_seconds({"retry-after": "soon"}) is None
    assert retry_after_seconds({"retry-after": "-1"}) is None
    assert retry_after_seconds({}) is None


async def test_owned_client_is_made_without_sdk_retries() -> None:
    async with FakeOpenAI([Reply.server_error(500)]) as server:
        summarizer = OpenAIResponsesSummarizer("m", api_key="k", base_url=server.url + "/v1")
        assert summarizer.client.max_retries == 0
        with pytest.raises(SummarizerError):
            await summarizer.summarize(REQUEST)
        await summarizer.aclose()
        assert len(server.requests) == 1
    ant = AnthropicSummarizer(api_key="k", base_url="http://127.0.0.1:9")
    assert ant.client.max_retries == 0 and ant.model == "claude-haiku-5-5"
    await ant.aclose()


# ---------------------------------------------------------------------------------------
# End to end: LlmCompaction on a real SDK against the fake server

LIMIT = 12_000


async def run_session(
    *replies: Reply, summarizer: Summarizer | None = None
) -> tuple[list[Event], list[list[Message]], FakeAnthropic]:
    events: list[Event] = []
    views: list[list[Message]] = []
    budget = Budget(context_window=LIMIT + 1_000, reserve_output=1_000)
    async with (
        FakeAnthropic(list(replies), default=Reply.text(briefing())) as server,
        anthropic.AsyncAnthropic(base_url=server.url, api_key="test", timeout=5) as client,
    ):
        summarizer = summarizer or AnthropicSummarizer(client=client)
        llm = LlmCompaction(summarizer, LlmCompactionConfig(timeout=5))
        chain = Chain([llm, DeterministicCompaction()])
        async with ContextManager(budget, strategy=chain) as manager:
            manager.subscribe(events.append)
            history: list[Message] = []
            for group in synthetic_session(seed=3, calls=60, mean_output_lines=10):
                view = (await drive(manager, [[*history, *group]]))[-1]
                assert manager.prompt_tokens <= LIMIT
                manager.observe(Usage(input_tokens=manager.counter.count_many(view)))
                history = view
                views.append(view)
                await anyio.sleep(0.02)  # the model call of this turn
        assert llm.spend.requests >= 1
    return events, views, server


def summarized(events: list[Event]) -> list[ContextCompacted]:
    return [e for e in events if isinstance(e, ContextCompacted) and e.method == "summarized"]


def has_briefing(view: list[Message]) -> bool:
    return any(SUMMARY_MARKER in getattr(m, "text", "") for m in view)


async def test_end_to_end_splices_a_briefing() -> None:
    events, views, server = await run_session()
    spliced = summarized(events)
    assert spliced, [type(e).__name__ for e in events]
    stats = spliced[0].summary
    assert stats is not None
    assert stats.usage.prompt_tokens > 0 and stats.usage.output_tokens > 0
    assert stats.model == "claude-haiku-5-5"
    assert any(has_briefing(v) for v in views)
    assert not [e for e in events if isinstance(e, SummaryRejected)]
    first = server.requests[0].json
    assert first["model"] == "claude-haiku-5-5" and "<conversation>" in str(first["messages"])


async def test_end_to_end_retries_a_rate_limit_then_splices() -> None:
    events, views, server = await run_session(Reply.rate_limited(retry_after=0.05))
    assert server.requests[0].status == 429
    assert len(server.requests) >= 2
    spliced = summarized(events)
    assert spliced and spliced[0].summary is not None
    assert spliced[0].summary.usage.output_tokens > 0
    assert not [e for e in events if isinstance(e, SummaryRejected)]
    assert any(has_briefing(v) for v in views)


def test_request_options_are_checked_when_the_summarizer_is_made() -> None:
    with pytest.raises(ConfigError, match="temprature"):
        AnthropicSummarizer(api_key="k", request_options={"temprature": 0})
    with pytest.raises(ConfigError, match="max_tokens"):
        AnthropicSummarizer(api_key="k", request_options={"max_tokens": 9})
    with pytest.raises(ConfigError, match="store"):
        OpenAIResponsesSummarizer("m", api_key="k", request_options={"store": True})
    with pytest.raises(ConfigError, match="reasoning"):
        OpenAIChatSummarizer("m", api_key="k", request_options={"reasoning": {}})
    extra = {"extra_body": {"new_field": 1}}  # what the SDK does not know yet goes here
    assert AnthropicSummarizer(api_key="k", request_options=extra).request_options == extra


@pytest.mark.parametrize(
    "make",
    [
        lambda o: AnthropicSummarizer(api_key="k", request_options=o),
        lambda o: OpenAIChatSummarizer("m", api_key="k", request_options=o),
        lambda o: OpenAIResponsesSummarizer("m", api_key="k", request_options=o),
        lambda o: AnthropicCompactionSummarizer("m", api_key="k", request_options=o),
    ],
    ids=["anthropic", "openai chat", "openai responses", "anthropic native"],
)
def test_a_stream_request_option_is_refused_when_the_summarizer_is_made(make: Any) -> None:
    """Found by a hostile run: ``{"stream": True}`` was taken; every billed reply then came
    back as a stream, failed as unreadable, was retried, and was counted nowhere. The same
    in ``extra_body``, where the error for unknown options sends them."""
    with pytest.raises(ConfigError, match="stream"):
        make({"stream": True})
    with pytest.raises(ConfigError, match="stream"):
        make({"extra_body": {"stream": True}})


@pytest.mark.parametrize(
    ("provider", "make"),
    [
        ("anthropic", lambda c: AnthropicSummarizer(client=c)),
        ("openai", lambda c: OpenAIChatSummarizer("m", client=c)),
        ("openai", lambda c: OpenAIResponsesSummarizer("m", client=c)),
        ("anthropic", lambda c: AnthropicCompactionSummarizer("m", client=c)),
        ("openai", lambda c: OpenAICompactionSummarizer("m", client=c)),
    ],
    ids=["anthropic", "openai chat", "openai responses", "anthropic native", "openai native"],
)
@pytest.mark.parametrize("wrapped", [False, True], ids=["client", "wrapped client"])
def test_a_blocking_client_is_refused_when_the_summarizer_is_made(
    provider: str, make: Any, wrapped: bool
) -> None:
    """Found by hostile testing: `AnthropicSummarizer(client=anthropic.Anthropic())` was
    accepted; each summary then ran its HTTP call on the session's loop (stalling it) and
    failed awaiting what it returned, so every billed summary was thrown away."""
    from agentctx.providers import anthropic as ant_provider
    from agentctx.providers import openai as oai_provider

    client: Any
    if provider == "anthropic":
        client = anthropic.Anthropic(api_key="x", base_url="http://127.0.0.1:9")
        wrap: Any = ant_provider.wrap
    else:
        client = openai.OpenAI(api_key="x", base_url="http://127.0.0.1:9/v1")
        wrap = oai_provider.wrap
    if wrapped:
        client = wrap(client, ContextManager(Budget(context_window=200_000)))
    try:
        with pytest.raises(ConfigError, match="Async"):
            make(client)
    finally:
        client.close()


@pytest.mark.parametrize(
    "status",
    [10**5000, -1, 42, True, "429", 429.0],
    ids=["5000 digits", "negative", "42", "True", "a string", "a float"],
)
def test_a_status_no_server_sends_is_none(status: object) -> None:
    """Found by a hostile run (BQ 3): a summarizer of one's own gave a status of 10**5000;
    the request's own failure text could not format it and raised instead of reporting."""
    assert SummarizerError("x", retryable=False, status=status).status is None  # type: ignore[arg-type]
    assert SummarizerError("x", retryable=True, status=529).status == 529
