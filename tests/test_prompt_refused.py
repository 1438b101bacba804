"""A prompt the provider refuses as longer than its context window: read from the SDK's own
error, calibrated on, compacted to fit and sent once more (`wrap`, `as_middleware`), or
observed by a loop of its own (`ContextManager.observe`).

The fake servers count a character a quarter token; agentctx's estimate of long English
words is well under that, so a history the session takes for one that fits is refused, as
a real tokenizer denser than the estimate would refuse it."""

from __future__ import annotations

import json
import re
from typing import Any

import anthropic
import anyio
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentctx import (
    AssistantMessage,
    Budget,
    BudgetExceededError,
    CompactionWarning,
    ContextCompacted,
    ContextManager,
    Event,
    Message,
    Usage,
    UserMessage,
)
from agentctx._overflow import Overflow, floor_share, overflow_of
from agentctx.errors import ConfigError
from agentctx.ledger import Ledger
from agentctx.providers import anthropic as ant_provider
from agentctx.providers import openai as oai_provider
from agentctx.providers.middleware import as_middleware
from agentctx.testing import _wire as wire
from agentctx.testing import check_view
from agentctx.testing._validate import Invalid
from agentctx.testing.servers import FakeAnthropic, FakeOpenAI, Reply

WINDOW = 3_000
# 844 characters, 211 tokens to the servers; the session, uncalibrated, counts the
# requests made of it at about 1.6x less.
WORDS = "configuration management information " * 8 + "the quick brown fox jumps over it. " * 12
TURNS = 13


def budget() -> Budget:
    return Budget(context_window=WINDOW, reserve_output=500)


def anthropic_history(turns: int) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = []
    for n in range(turns):
        history += [
            {"role": "user", "content": f"Read document {n}."},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": f"t{n}", "name": "read", "input": {}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": f"t{n}", "content": WORDS}],
            },
            {"role": "assistant", "content": "Read it."},
        ]
    return [*history, {"role": "user", "content": "Summarize the documents."}]


def chat_history(turns: int) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = []
    for n in range(turns):
        call = {"id": f"c{n}", "type": "function", "function": {"name": "read", "arguments": "{}"}}
        history += [
            {"role": "user", "content": f"Read document {n}."},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{n}", "content": WORDS},
            {"role": "assistant", "content": "Read it."},
        ]
    return [*history, {"role": "user", "content": "Summarize the documents."}]


def responses_history(turns: int) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = []
    for n in range(turns):
        history += [
            {"role": "user", "content": f"Read document {n}."},
            {"type": "function_call", "call_id": f"c{n}", "name": "read", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"c{n}", "output": WORDS},
            {"role": "assistant", "content": "Read it."},
        ]
    return [*history, {"role": "user", "content": "Summarize the documents."}]


ANTHROPIC_TOOLS = [{"name": "read", "description": "Read.", "input_schema": {"type": "object"}}]
CHAT_TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]
RESPONSES_TOOLS = [{"type": "function", "name": "read", "parameters": {"type": "object"}}]


def watch(ctx: ContextManager) -> list[Event]:
    seen: list[Event] = []
    ctx.subscribe(seen.append)
    return seen


def refusals(events: list[Event]) -> list[CompactionWarning]:
    return [e for e in events if isinstance(e, CompactionWarning) and e.code == "prompt_refused"]


# -- reading the errors ------------------------------------------------------------------


class _Error(Exception):
    def __init__(self, text: str, status: int = 400, code: str | None = None) -> None:
        super().__init__(text)
        self.status_code = status
        self.code = code


@pytest.mark.parametrize(
    ("text", "code", "expected"),
    [
        ("prompt is too long: 208310 tokens > 200000 maximum", None, Overflow(208_310, 200_000)),
        (
            "Error code: 400 - {'type': 'error', 'error': {'type': 'invalid_request_error', "
            "'message': 'input length and `max_tokens` exceed context limit: 188240 + 21333 > "
            "200000, decrease input length or `max_tokens` and try again'}}",
            None,
            Overflow(188_240, 200_000 - 21_333, 21_333),
        ),
        (
            "This model's maximum context length is 128000 tokens. However, your messages "
            "resulted in 130255 tokens. Please reduce the length of the messages.",
            "context_length_exceeded",
            Overflow(130_255, 128_000),
        ),
        (
            "This model's maximum context length is 4096 tokens. However, you requested 5000 "
            "tokens (4000 in the messages, 1000 in the completion).",
            None,
            Overflow(4_000, 3_096, 1_000),
        ),
        (  # With tools, OpenAI's count of the prompt is in two parts.
            "This model's maximum context length is 16385 tokens. However, you requested 16610 "
            "tokens (14138 in the messages, 226 in the functions, and 2246 in the completion).",
            "context_length_exceeded",
            Overflow(14_364, 16_385 - 2_246, 2_246),
        ),
        (  # vLLM's usual wording.
            "This model's maximum context length is 32768 tokens. However, you requested 32818 "
            "tokens in the messages, Please reduce the length of the messages. None",
            None,
            Overflow(32_818, 32_768),
        ),
        (  # DeepSeek's: the output may be in it, so it is no count of the prompt.
            "This model's maximum context length is 65536 tokens. However, you requested 81920 "
            "tokens.",
            None,
            Overflow(None, 65_536),
        ),
        (
            "Your input exceeds the context window of this model. Please adjust your input "
            "and try again.",
            "context_length_exceeded",
            Overflow(None, None),
        ),
        ("Invalid value for 'model'", "context_length_exceeded", Overflow(None, None)),
        # A count past any window is no count.
        (
            "prompt is too long: 9999999999999999 tokens > 200000 maximum",
            None,
            Overflow(None, 200_000),
        ),
        ("messages: text content blocks must be non-empty", None, None),
        (  # Vertex AI's (found by a re-run, DO 7).
            "Unable to submit request because the input token count is 1251952 but model "
            "only supports up to 1048576. Reduce the input token count and try again.",
            None,
            Overflow(1_251_952, 1_048_576),
        ),
        (  # Gemini's wording (found by a hostile run, DM 4: read as no count).
            "400 INVALID_ARGUMENT. {'error': {'code': 400, 'message': 'The input token count "
            "(1214865) exceeds the maximum number of tokens allowed (1048576).'}}",
            None,
            Overflow(1_214_865, 1_048_576),
        ),
    ],
)
def test_a_refusal_is_read_as_each_api_words_it(
    text: str, code: str | None, expected: Overflow | None
) -> None:
    assert overflow_of(_Error(text, code=code)) == expected


def test_gemini_s_sdk_error_gives_its_status_as_code() -> None:
    class ClientError(Exception):  # google-genai's: no status_code
        code = 400

    text = "The input token count (5000) exceeds the maximum number of tokens allowed (4000)."
    assert overflow_of(ClientError(text)) == Overflow(5_000, 4_000)
    ClientError.code = 500
    assert overflow_of(ClientError(text)) is None


def test_a_group_of_refusals_is_one_with_the_largest_count() -> None:
    """pydantic-ai's FallbackModel raises every model's refusal as a group (DM 3)."""
    refusals = [
        _Error("prompt is too long: 5000 tokens > 3000 maximum"),
        _Error(
            "This model's maximum context length is 3000 tokens. However, your messages "
            "resulted in 5600 tokens."
        ),
    ]
    assert overflow_of(ExceptionGroup("all failed", refusals)) == Overflow(5_600, 3_000)
    assert overflow_of(ExceptionGroup("all failed", [*refusals, _Error("overloaded", 529)])) is None


def test_only_an_http_400_is_a_refusal_of_the_prompt() -> None:
    text = "prompt is too long: 208310 tokens > 200000 maximum"
    assert overflow_of(_Error(text, status=500)) is None
    assert overflow_of(_Error(text, status=413)) is None
    assert overflow_of(ValueError(text)) is None  # no status: no provider's answer
    assert overflow_of(text) is None

    class Unprintable(_Error):
        def __str__(self) -> str:
            raise RuntimeError("no text")

    assert overflow_of(Unprintable(text)) is None


# -- wrapped clients: refused, calibrated, compacted, sent again ---------------------------


async def test_a_wrapped_anthropic_call_refused_as_too_long_is_compacted_and_sent_again() -> None:
    async with (
        FakeAnthropic(context_window=WINDOW, default=Reply.text("done")) as server,
        ContextManager(budget()) as ctx,
        anthropic.AsyncAnthropic(base_url=server.url, api_key="test", max_retries=0) as raw,
    ):
        events = watch(ctx)
        client = ant_provider.wrap(raw, ctx)
        history = anthropic_history(TURNS)
        resp = await client.messages.create(
            model="m", max_tokens=100, tools=ANTHROPIC_TOOLS, messages=history
        )
        assert resp.content[0].text == "done"
        assert [r.status for r in server.requests] == [400, 200]
        first, second = server.requests
        assert "prompt is too long" in (first.error or "")
        assert len(second.body) < len(first.body) // 2
        (warning,) = refusals(events)
        assert "calibrated" in warning.message
        assert any(isinstance(e, ContextCompacted) for e in events)
        assert ctx.usage.prompt_tokens == second.usage.prompt_tokens  # the refusal billed 0
        # The next call goes on from the compacted view, accepted at once.
        history += [{"role": "assistant", "content": "done"}, {"role": "user", "content": "ok"}]
        await client.messages.create(
            model="m", max_tokens=100, tools=ANTHROPIC_TOOLS, messages=history
        )
        assert [r.status for r in server.requests] == [400, 200, 200]


async def test_a_wrapped_anthropic_stream_refused_as_too_long_is_compacted_and_opened_again() -> (
    None
):
    async with (
        FakeAnthropic(context_window=WINDOW, default=Reply.text("done")) as server,
        ContextManager(budget()) as ctx,
        anthropic.AsyncAnthropic(base_url=server.url, api_key="test", max_retries=0) as raw,
    ):
        events = watch(ctx)
        client = ant_provider.wrap(raw, ctx)
        async with client.messages.stream(
            model="m", max_tokens=100, tools=ANTHROPIC_TOOLS, messages=anthropic_history(TURNS)
        ) as stream:
            final = await stream.get_final_message()
        assert final.content[0].text == "done"
        assert [r.status for r in server.requests] == [400, 200]
        assert len(refusals(events)) == 1


def test_a_blocking_wrapped_anthropic_call_refused_as_too_long_is_sent_again() -> None:
    import anyio

    async def serve() -> None:
        async with FakeAnthropic(context_window=WINDOW, default=Reply.text("done")) as server:
            await anyio.to_thread.run_sync(lambda: _blocking(server.url))
            assert [r.status for r in server.requests] == [400, 200]

    anyio.run(serve)


def _blocking(url: str) -> None:
    ctx = ContextManager(budget())
    with ant_provider.wrap(
        anthropic.Anthropic(base_url=url, api_key="test", max_retries=0), ctx
    ) as client:
        resp = client.messages.create(
            model="m", max_tokens=100, tools=ANTHROPIC_TOOLS, messages=anthropic_history(TURNS)
        )
        assert resp.content[0].text == "done"


async def test_a_wrapped_chat_call_refused_as_too_long_is_compacted_and_sent_again() -> None:
    async with (
        FakeOpenAI(context_window=WINDOW, default=Reply.text("done")) as server,
        ContextManager(budget()) as ctx,
        openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="test", max_retries=0) as raw,
    ):
        events = watch(ctx)
        client = oai_provider.wrap(raw, ctx)
        resp = await client.chat.completions.create(
            model="m", max_completion_tokens=100, tools=CHAT_TOOLS, messages=chat_history(TURNS)
        )
        assert resp.choices[0].message.content == "done"
        assert [r.status for r in server.requests] == [400, 200]
        (warning,) = refusals(events)
        assert f"(it takes {WINDOW} prompt tokens)" in warning.message


async def test_a_responses_refusal_that_gives_no_count_is_taken_as_the_least_it_can_be() -> None:
    async with (
        FakeOpenAI(context_window=WINDOW, default=Reply.text("done")) as server,
        ContextManager(budget()) as ctx,
        openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="test", max_retries=0) as raw,
    ):
        events = watch(ctx)
        client = oai_provider.wrap(raw, ctx)
        resp = await client.responses.create(
            model="m", max_output_tokens=100, tools=RESPONSES_TOOLS, input=responses_history(TURNS)
        )
        assert resp.output_text == "done"
        assert [r.status for r in server.requests] == [400, 200]
        (warning,) = refusals(events)
        assert "the least it held" in warning.message


async def test_the_middleware_calls_next_again_with_the_history_compacted_to_fit() -> None:
    async with (
        FakeAnthropic(context_window=WINDOW, default=Reply.text("done")) as server,
        ContextManager(budget()) as ctx,
        anthropic.AsyncAnthropic(base_url=server.url, api_key="test", max_retries=0) as client,
    ):
        middleware = as_middleware(ctx, "anthropic")
        sent: list[int] = []

        async def call_next(request: dict[str, Any]) -> Any:
            sent.append(len(request["messages"]))
            return await client.messages.create(**request)

        request = {"model": "m", "max_tokens": 100, "tools": ANTHROPIC_TOOLS}
        resp = await middleware({**request, "messages": anthropic_history(TURNS)}, call_next)
        assert resp.content[0].text == "done"
        assert len(sent) == 2 and sent[1] < sent[0]


# -- what is not sent again ---------------------------------------------------------------


async def test_a_window_below_the_budget_is_said_and_the_refusal_raised_once() -> None:
    """The budget says 30k, the model takes 3k: calibrating cannot bring the view under a
    limit the model does not have, so the refusal is raised after one attempt, and the
    warning names the window to set."""
    async with (
        FakeAnthropic(context_window=WINDOW, default=Reply.text("done")) as server,
        ContextManager(Budget(context_window=30_000, reserve_output=500)) as ctx,
        anthropic.AsyncAnthropic(base_url=server.url, api_key="test", max_retries=0) as raw,
    ):
        events = watch(ctx)
        client = ant_provider.wrap(raw, ctx)
        with pytest.raises(anthropic.BadRequestError, match="prompt is too long"):
            await client.messages.create(
                model="m", max_tokens=100, tools=ANTHROPIC_TOOLS, messages=anthropic_history(TURNS)
            )
        assert [r.status for r in server.requests] == [400]
        (warning,) = refusals(events)
        assert "set Budget.context_window" in warning.message
        assert ctx.usage.prompt_tokens == 0


async def test_other_errors_are_raised_as_they_were_and_not_sent_again() -> None:
    refusal = Reply.error(400, message="messages.1.content: tool_use ids must be unique")
    async with (
        FakeAnthropic(replies=[refusal, Reply.server_error(500)]) as server,
        ContextManager(budget()) as ctx,
        anthropic.AsyncAnthropic(base_url=server.url, api_key="test", max_retries=0) as raw,
    ):
        events = watch(ctx)
        client = ant_provider.wrap(raw, ctx)
        for expected in (anthropic.BadRequestError, anthropic.InternalServerError):
            with pytest.raises(expected):
                await client.messages.create(
                    model="m", max_tokens=100, tools=ANTHROPIC_TOOLS, messages=anthropic_history(2)
                )
        assert [r.status for r in server.requests] == [400, 500]
        assert refusals(events) == []


# -- a loop of its own --------------------------------------------------------------------


async def test_a_loop_of_its_own_observes_the_refusal_and_the_next_prepare_fits() -> None:
    async with (
        FakeAnthropic(context_window=WINDOW, default=Reply.text("done")) as server,
        ContextManager(budget()) as ctx,
        anthropic.AsyncAnthropic(base_url=server.url, api_key="test", max_retries=0) as client,
    ):
        from agentctx.adapters import from_anthropic, to_anthropic

        history = from_anthropic(anthropic_history(TURNS))
        view = await ctx.prepare(history)
        with pytest.raises(anthropic.BadRequestError) as refused:
            await client.messages.create(
                model="m", max_tokens=100, tools=ANTHROPIC_TOOLS, messages=to_anthropic(view)
            )
        ctx.observe(refused.value)
        assert ctx.usage.prompt_tokens == 0
        view = await ctx.prepare(history)
        assert check_view(view, ctx.raw) == []
        resp = await client.messages.create(
            model="m", max_tokens=100, tools=ANTHROPIC_TOOLS, messages=to_anthropic(view)
        )
        ctx.observe(resp)
        assert [r.status for r in server.requests] == [400, 200]


async def test_observe_refuses_an_error_that_is_no_refusal_of_the_prompt() -> None:
    async with ContextManager(budget()) as ctx:
        await ctx.prepare([UserMessage.of("hi")])
        with pytest.raises(ConfigError, match="longer than its context window"):
            ctx.observe(_Error("rate limited", status=429))
        with pytest.raises(ConfigError, match="longer than its context window"):
            ctx.observe(RuntimeError("boom"))


async def test_a_refusal_before_any_view_changes_nothing() -> None:
    async with ContextManager(budget()) as ctx:
        events = watch(ctx)
        ctx.observe(_Error("prompt is too long: 5000 tokens > 3000 maximum"))
        assert refusals(events) == [] and ctx.usage.prompt_tokens == 0


async def test_a_refusal_counting_what_no_calibration_makes_of_the_view_says_it_was_not_used() -> (
    None
):
    """Not fitted (it would price every later message off), but the refused view counts it:
    a task alone of that size cannot be sent, and the next prepare says so."""
    async with ContextManager(budget()) as ctx:
        events = watch(ctx)
        history = [UserMessage.of("hi")]
        await ctx.prepare(history)
        multipliers = tuple(ctx.counter.multipliers)
        ctx.observe(_Error("prompt is too long: 50000000 tokens > 3000 maximum"))
        (warning,) = refusals(events)
        assert "not used to calibrate" in warning.message
        assert [e.code for e in events if isinstance(e, CompactionWarning)] == ["prompt_refused"]
        assert ctx.prompt_tokens == 50_000_000
        assert ctx.counter.multipliers == multipliers
        with pytest.raises(BudgetExceededError):
            await ctx.prepare(history)


async def test_a_refusal_far_over_the_estimate_is_compacted_not_sent_again_as_it_was() -> None:
    """Found by two hostile runs (DN 1, DM 5): a refusal counting over four times the
    estimate and over the window (two 70-page PDFs by URL, counted at five pages each; 750
    thumbnails) was dropped as implausible: the next prepare gave the refused view again,
    and the wrapper raised the refusal where dropping older content would fit."""
    from agentctx.adapters import from_anthropic

    async with ContextManager(budget()) as ctx:
        events = watch(ctx)
        history = from_anthropic(anthropic_history(9))
        refused = await ctx.prepare(history)
        counted = 5 * max(ctx.prompt_tokens, WINDOW)
        ctx.observe(_Error(f"prompt is too long: {counted} tokens > {WINDOW} maximum"))
        assert ctx.prompt_tokens == counted
        view = await ctx.prepare(history)
        assert view != refused and len(view) < len(refused)
        assert check_view(view, history) == []
        assert any(isinstance(e, ContextCompacted) for e in events)


# -- found by a re-run (DG) ----------------------------------------------------------------


async def test_a_retry_sends_the_tools_system_and_input_given_as_generators() -> None:
    """Found by a hostile run (DG, finding 1): the retry was made again from the caller's
    arguments, whose generators the first attempt had read: Anthropic's went out with
    ``tools: []`` and ``system: []`` (refused), and a Responses ``input`` generator went
    out empty, answered, with the session's history reset to nothing."""
    system = [{"type": "text", "text": "You are terse."}]
    async with (
        FakeAnthropic(context_window=WINDOW, default=Reply.text("done")) as server,
        ContextManager(budget()) as ctx,
        anthropic.AsyncAnthropic(base_url=server.url, api_key="t", max_retries=0) as raw,
    ):
        client = ant_provider.wrap(raw, ctx)
        await client.messages.create(
            model="m",
            max_tokens=100,
            tools=(tool for tool in ANTHROPIC_TOOLS),
            system=(block for block in system),
            messages=anthropic_history(TURNS),
        )
        first, second = server.requests
        assert (first.status, second.status) == (400, 200)
        assert second.json["tools"] == ANTHROPIC_TOOLS and second.json["system"] == system
    async with (
        FakeOpenAI(context_window=WINDOW, default=Reply.text("done")) as server,
        ContextManager(budget()) as ctx,
        openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="t", max_retries=0) as raw,
    ):
        history = responses_history(TURNS)
        reply = await oai_provider.wrap(raw, ctx).responses.create(
            model="m",
            max_output_tokens=100,
            tools=(tool for tool in RESPONSES_TOOLS),
            input=(item for item in history),
        )
        assert reply.output_text == "done"
        first, second = server.requests
        assert (first.status, second.status) == (400, 200)
        assert second.json["tools"] == RESPONSES_TOOLS and second.json["input"]
        assert len(ctx.raw) == len(history)


async def test_a_refusal_of_one_call_is_retried_while_another_call_is_in_flight() -> None:
    """Found by a hostile run (DG, finding 3): the view sent was one field of the wrapper,
    which a call made meanwhile overwrote (a call continuing server-side state set it to
    none): the refused call got the raw error, unobserved, not sent again."""
    async with (
        FakeOpenAI(context_window=WINDOW, default=Reply.text("done")) as server,
        ContextManager(budget()) as ctx,
        openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="t", max_retries=0) as raw,
    ):
        events = watch(ctx)
        client = oai_provider.wrap(raw, ctx)
        stored = (await raw.responses.create(model="m", input="start")).id
        answers: dict[str, str] = {}

        async def long_call() -> None:
            reply = await client.responses.create(
                model="m",
                max_output_tokens=100,
                tools=RESPONSES_TOOLS,
                input=responses_history(TURNS),
            )
            answers["long"] = reply.output_text

        async def chained_call() -> None:
            reply = await client.responses.create(
                model="m", previous_response_id=stored, input="hi"
            )
            answers["chained"] = reply.output_text

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(long_call)
            tasks.start_soon(chained_call)
        assert answers == {"long": "done", "chained": "done"}
        assert len(refusals(events)) == 1


class _ChatWithFunctions(FakeOpenAI):
    """Refuses as OpenAI words it when tools are sent: the prompt in two parts (the fake's
    first segment of a chat request is its tools)."""

    functions = 0

    def _segments(self, path: str, body: Any) -> list[str]:
        segments: list[str] = super()._segments(path, body)
        self.functions = wire.estimate_tokens(segments[0])
        return segments

    def _too_long(self, path: str, total: int, window: int) -> Any:
        return Invalid(
            f"This model's maximum context length is {window + 500} tokens. However, you "
            f"requested {total + 500} tokens ({total - self.functions} in the messages, "
            f"{self.functions} in the functions, and 500 in the completion). Please reduce the "
            "length of the messages, functions, or completion.",
            "messages",
            "context_length_exceeded",
        )


async def test_openai_s_count_with_tools_is_the_messages_and_the_functions() -> None:
    """Found by a hostile run (DG, finding 2): only the messages' part of OpenAI's count was
    read when tools were sent, so a prompt over the limit by less than its tools was taken
    for one under it: the same view, the refusal raised, not sent again."""
    description = "Reads one document of the archive by its number and returns its text. " * 3
    tools = [
        {"type": "function", "function": {"name": f"tool_{i}", "description": description}}
        for i in range(6)
    ]
    async with (
        _ChatWithFunctions(context_window=WINDOW - 500, default=Reply.text("done")) as server,
        ContextManager(budget()) as ctx,
        openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="t", max_retries=0) as raw,
    ):
        events = watch(ctx)
        client = oai_provider.wrap(raw, ctx)
        await client.chat.completions.create(
            model="m",
            max_completion_tokens=500,
            tools=[*tools, *CHAT_TOOLS],
            messages=chat_history(8),
        )
        assert [r.status for r in server.requests] == [400, 200]
        (warning,) = refusals(events)
        messages, functions = re.findall(
            r"(\d+) in the (?:messages|functions)", server.requests[0].error
        )
        assert f"a prompt of {int(messages) + int(functions)} tokens" in warning.message


@pytest.mark.parametrize(
    ("reports", "ratio"), [(0, 1.5), (0, 2.4), (0, 3.0), (10, 1.2), (10, 1.5), (20, 2.0)]
)
async def test_a_calibrated_session_compacts_the_view_the_provider_refused(
    reports: int, ratio: float
) -> None:
    """Found by a hostile run (DG, finding 5): after usage reports that agreed with the
    session's counts, a refusal was one more point of the fit, and the refused view still
    counted under the limit (2,219 for a provider's 4,504): the next prepare gave it again,
    and the wrapper raised the refusal. And a first refusal far over the estimate (2.4x)
    made the fit take most of it for the request overhead, which then filled the budget:
    the next prepare raised `BudgetExceededError` where compacting more fit."""
    from agentctx.adapters import from_openai_chat

    async with ContextManager(budget()) as ctx:
        raw: list[dict[str, Any]] = [{"role": "user", "content": "Summarize the documents."}]
        n = 0
        while True:
            n += 1
            raw += [
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": f"{n} " + WORDS[:200]},
            ]
            refused = await ctx.prepare(from_openai_chat(raw))
            if n <= reports:
                ctx.observe(Usage(input_tokens=ctx.prompt_tokens))  # the provider agrees
            elif ctx.prompt_tokens > 2_250:
                break
        counted = int(ctx.prompt_tokens * ratio)
        ctx.observe(_Error(f"prompt is too long: {counted} tokens > {WINDOW} maximum"))
        assert ctx.prompt_tokens >= counted
        view = await ctx.prepare(from_openai_chat(raw))
        assert view != refused and ctx.prompt_tokens <= ctx.budget.limit


async def test_a_reserve_below_the_output_asked_for_is_what_the_warning_names() -> None:
    """Found by a hostile run (DG, finding 6): with the model's own window and a reserve
    below the request's max_tokens, the warning said to set context_window to the model's,
    which it was."""
    async with ContextManager(Budget(context_window=200_000, reserve_output=16_000)) as ctx:
        events = watch(ctx)
        await ctx.prepare([UserMessage.of("hi")])
        ctx.observe(
            _Error(
                "input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000, "
                "decrease input length or `max_tokens` and try again"
            )
        )
        (warning,) = refusals(events)
        assert "keep Budget.reserve_output at least the output requests ask for" in warning.message


async def test_a_refusal_observed_without_calibrating_changes_nothing() -> None:
    """Found by a hostile run (DJ, finding 2): ``observe(error, calibrate=False)`` (a side
    request, not the session's view, refused) calibrated on it all the same: a 9k view
    counted 32k, and the next prepare cut 121 messages to 8."""
    history: list[Any] = [UserMessage.of("Task: review the repo.")]
    for i in range(60):
        history += [AssistantMessage.of(f"step {i} " + "analysis " * 120), UserMessage.of("go")]
    async with ContextManager(Budget(context_window=30_000, reserve_output=1_000)) as ctx:
        events = watch(ctx)
        view = await ctx.prepare(history)
        tokens = ctx.prompt_tokens
        ctx.observe(_Error("prompt is too long: 32000 tokens > 30000 maximum"), calibrate=False)
        assert ctx.prompt_tokens == tokens and await ctx.prepare(history) == view
        assert refusals(events) == []
        with pytest.raises(ConfigError):
            ctx.observe(_Error("rate limited", status=429), calibrate=False)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (  # vLLM's current wording
            "This model's maximum context length is 4096 tokens. However, your request has 6200 "
            "input tokens. Please reduce the length of the input messages.",
            Overflow(6_200, 4_096),
        ),
        (  # OpenRouter's
            "This endpoint's maximum context length is 128000 tokens. However, you requested "
            "about 130000 tokens (128000 of text input, 2000 in the output). Please reduce the "
            "length of either one.",
            Overflow(128_000, 126_000, 2_000),
        ),
        (  # vLLM's refusal of an output limit too large: the prompt fit
            "'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum "
            "context length is 4096 tokens and your request has 2778 input tokens "
            "(8000 > 4096 - 2778).",
            None,
        ),
    ],
)
def test_the_wordings_found_by_the_second_re_run(text: str, expected: Overflow | None) -> None:
    """Found by a hostile run (DJ, finding 3): vLLM's current wording and OpenRouter's were
    read as giving no count, so the session calibrated on one token over its limit, far
    under the provider's count, and the one retry was refused again; vLLM's refusal of an
    output limit was read as one of the prompt."""
    assert overflow_of(_Error(text)) == expected


async def test_a_refusal_after_usage_reports_keeps_the_overhead_they_showed() -> None:
    """Found by a hostile run (DM 1): a refusal's fit held the overhead at half the budget
    even where reports had shown it larger (a 2,800-token system prompt at a 3,500 limit);
    the multipliers, clamped, then priced the messages at a fraction of their size, and
    requests went over the window with no event. Only a refusal that is the session's first
    report is held so."""
    async with ContextManager(Budget(context_window=4_000, reserve_output=500)) as ctx:
        history: list[Message] = [UserMessage.of("Summarize the documents.")]
        for n in range(6):
            history += [AssistantMessage.of(f"Read {n}."), UserMessage.of(f"{n} " + WORDS[:300])]
            await ctx.prepare(history)
            shown = ctx.prompt_tokens - ctx.counter.overhead
            ctx.observe(Usage(input_tokens=2_800 + shown))  # the provider agrees, plus the prompt
        assert ctx.counter.overhead > 2_500
        counted = ctx.prompt_tokens + 200
        ctx.observe(_Error(f"prompt is too long: {counted} tokens > 3500 maximum"))
        assert ctx.counter.overhead > 2_500
        assert ctx.prompt_tokens >= counted


def _png(width: int, height: int, seed: int) -> str:
    """Base64 of a PNG's signature and header (its size is all the estimate reads), then
    bytes that make each image another one."""
    import base64
    import struct
    import zlib

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + header
    ihdr = struct.pack(">I", len(header)) + chunk + struct.pack(">I", zlib.crc32(chunk))
    return base64.b64encode(b"\x89PNG\r\n\x1a\n" + ihdr + seed.to_bytes(4, "big")).decode()


@pytest.mark.parametrize("note", [False, True], ids=["as-refused", "with-a-note"])
@pytest.mark.parametrize("ended", [False, True], ids=["running", "ended"])
@pytest.mark.parametrize(("side", "billed"), [(128, 255), (32, 258)], ids=["thumbnails", "icons"])
async def test_a_refusal_of_many_small_images_in_the_running_loop_is_compacted_in_one_go(
    side: int, billed: int, ended: bool, note: bool
) -> None:
    """Found by a re-run (DO 1): thumbnails a provider bills at 255 tokens each, estimated at
    22, in a tool loop still running (signed thinking: its steps cannot go, only the images
    can). The refusal's excess counted for the refused view only: the first decision ended
    it, so each refusal let one result's images go, and 11 refusals did not fit. What no fit
    explains is now laid on the media the view keeps, and one refusal brings it under.
    Icons (DO 2), estimated below the line that replaces them, were never left out, and
    every later prepare raised `BudgetExceededError`: what leaving one out frees now counts
    its share of the refusal. A loop that ended (its answer given, a new question asked)
    is the newest complete turn, whose results' images give way all the same (DQ 1: they
    were taken for protected, and each refusal let one result's go again). A retry whose
    history got a note after the refusal compacts as far (DQ 2: it lost the share)."""
    from agentctx import ImageBlock, TextBlock, ThinkingBlock, ToolCall, ToolResultMessage
    from agentctx.tokens import MessageCounter

    plain = MessageCounter()
    image_estimate = plain.count_full(
        UserMessage((ImageBlock("image/png", _png(side, side, 0)),))
    ) - plain.count_full(UserMessage(()))

    def provider_count(view: list[Message], ctx: ContextManager) -> int:
        """The session's own estimate, but each image at what the provider bills."""
        images = sum(isinstance(b, ImageBlock) for m in view for b in getattr(m, "content", ()))
        return ctx.counter.count_many(view) + images * (billed - image_estimate)

    raw: list[Message] = [UserMessage.of("task: audit the catalogue")]
    for s in range(30):
        call = ToolCall(f"c{s}", "thumbs", {"page": s})
        raw.append(AssistantMessage((ThinkingBlock(f"step {s}", signature=f"sig{s}"), call)))
        thumbs = tuple(ImageBlock("image/png", _png(side, side, 100 * s + i)) for i in range(40))
        raw.append(ToolResultMessage(f"c{s}", (TextBlock(f"page {s}"), *thumbs), "thumbs"))
    if ended:
        raw += [AssistantMessage.of("All pages read."), UserMessage.of("Which pages differ?")]
    async with ContextManager(Budget(context_window=200_000, reserve_output=8_000)) as ctx:
        refused = await ctx.prepare(raw)
        counted = provider_count(refused, ctx)
        assert counted > 4 * ctx.prompt_tokens and counted > 200_000
        ctx.observe(_Error(f"prompt is too long: {counted} tokens > 200000 maximum"))
        if note:
            raw = [*raw, UserMessage.of("That was too long; go on with less.")]
        view = await ctx.prepare(raw)
        assert provider_count(view, ctx) <= ctx.budget.limit
        assert check_view(view, raw) == []
        assert view[0] == raw[0]


async def test_a_refusal_s_excess_is_laid_on_media_compaction_may_leave_out_not_the_task_s() -> (
    None
):
    """Found by a re-run (DP 1): the task carried screenshots, an old turn a PDF by URL
    (estimated at five pages, billed a million tokens). The refusal's excess was laid on
    all the media, the task's too: the PDF's turn went, yet the view still counted 300k it
    no longer held, and every later prepare raised `BudgetExceededError`. It is laid on
    what compaction may leave out; and it applies to the history refused only (DP 3, 4): a
    rewind or a new message ends it, with or without a usage report."""
    from agentctx import ImageBlock, OpaqueBlock, TextBlock, ToolCall, ToolResultMessage

    pdf = OpaqueBlock("anthropic", {"type": "document", "source": {"type": "url", "url": "x"}})
    task = (TextBlock("task: match these mockups"),) + tuple(
        ImageBlock("image/png", _png(1000, 1000, i)) for i in range(4)
    )
    raw: list[Message] = [
        UserMessage(task),
        AssistantMessage((ToolCall("p", "fetch", {"url": "spec"}),)),
        ToolResultMessage("p", (pdf,), "fetch"),
        AssistantMessage.of("I read the spec."),
        UserMessage.of("ok, now build it"),
    ]
    for t in range(5):
        raw += [
            AssistantMessage((ToolCall(f"e{t}", "edit", {"f": t}),)),
            ToolResultMessage(f"e{t}", (TextBlock("edited " * 100),), "edit"),
        ]
    raw += [AssistantMessage.of("Built it."), UserMessage.of("check the colours")]
    async with ContextManager(Budget(context_window=200_000, reserve_output=8_000)) as ctx:
        await ctx.prepare(raw)
        estimate = ctx.prompt_tokens
        ctx.observe(_Error(f"prompt is too long: {estimate + 987_500} tokens > 200000 maximum"))
        view = await ctx.prepare(raw)
        assert not any(isinstance(b, OpaqueBlock) for m in view for b in getattr(m, "content", ()))
        assert view[0] == raw[0]  # the task, screenshots and all
        assert ctx.prompt_tokens < 20_000  # what the view holds, nothing laid on the task
        # The next call's history is another one: nothing of the refusal is laid on it.
        more = [*raw, AssistantMessage.of("Done."), UserMessage.of("thanks")]
        await ctx.prepare(more)
        assert ctx.prompt_tokens < 20_000


@pytest.mark.parametrize("kind", ["deterministic", "llm"])
async def test_a_refusal_of_icons_is_compacted_by_every_strategy(kind: str) -> None:
    """Found by a re-run (DP 2): `LlmCompaction`'s fallback tiers ran on a context without
    the refusal's share of each image, and the icons lock came back under it."""
    from agentctx import (
        DeterministicCompaction,
        ImageBlock,
        LlmCompaction,
        TextBlock,
        ThinkingBlock,
        ToolCall,
        ToolResultMessage,
    )
    from agentctx.testing import Outcome, ScriptedSummarizer

    strategy = (
        DeterministicCompaction()
        if kind == "deterministic"
        else LlmCompaction(ScriptedSummarizer([Outcome.hang()] * 5))
    )
    raw: list[Message] = [UserMessage.of("task: audit the icons")]
    for s in range(30):
        call = ToolCall(f"c{s}", "icons", {"page": s})
        raw.append(AssistantMessage((ThinkingBlock(f"step {s}", signature=f"sig{s}"), call)))
        icons = tuple(ImageBlock("image/png", _png(32, 32, 100 * s + i)) for i in range(40))
        raw.append(ToolResultMessage(f"c{s}", (TextBlock(f"page {s}"), *icons), "icons"))
    budget = Budget(context_window=200_000, reserve_output=8_000)
    async with ContextManager(budget, strategy=strategy) as ctx:
        await ctx.prepare(raw)
        counted = ctx.prompt_tokens + 1200 * 255
        ctx.observe(_Error(f"prompt is too long: {counted} tokens > 200000 maximum"))
        view = await ctx.prepare(raw)
        images = sum(isinstance(b, ImageBlock) for m in view for b in getattr(m, "content", ()))
        assert 0 < images < 1200
        assert check_view(view, raw) == []


def _icons_asked_about(icons: int, pages: int) -> tuple[list[Message], int]:
    """A session of ``pages`` tool results of catalogue text, then a latest user message of
    ``icons`` 32x32 icons (billed 258 tokens each, estimated at about 22); and what the
    estimate is short of per icon."""
    from agentctx import ImageBlock, TextBlock, ToolCall, ToolResultMessage
    from agentctx.tokens import MessageCounter

    plain = MessageCounter()
    icon = ImageBlock("image/png", _png(32, 32, 0))
    short = 258 - (plain.count_full(UserMessage((icon,))) - plain.count_full(UserMessage(())))
    raw: list[Message] = [UserMessage.of("task: help me with the catalogue")]
    for t in range(pages):
        text = f"line {t} of the catalogue, with its prices and its stock\n" * 120
        raw += [
            AssistantMessage((ToolCall(f"c{t}", "read", {"page": t}),)),
            ToolResultMessage(f"c{t}", (TextBlock(text),), "read"),
            AssistantMessage.of(f"read page {t}"),
            UserMessage.of(f"next {t}"),
        ]
    asked = (TextBlock("which of these icons are broken?"),) + tuple(
        ImageBlock("image/png", _png(32, 32, 1 + i)) for i in range(icons)
    )
    raw[-1] = UserMessage(asked)
    return raw, short


def _billed(view: list[Message], short: int) -> int:
    """What the provider counts: each message as estimated in full, each icon at 258."""
    from agentctx import ImageBlock
    from agentctx.tokens import MessageCounter

    plain = MessageCounter(lazy=False)
    images = sum(isinstance(b, ImageBlock) for m in view for b in getattr(m, "content", ()))
    return sum(map(plain.count_full, view)) + images * short


async def _refused_first(ctx: ContextManager, raw: list[Message], short: int) -> tuple[int, int]:
    """Prepare ``raw``, then observe the provider refusing the view at what it bills: that
    count, and the session's estimate of the view before it."""
    counted = _billed(await ctx.prepare(raw), short)
    estimate = ctx.prompt_tokens
    ctx.observe(_Error(f"prompt is too long: {counted} tokens > 200000 maximum"))
    return counted, estimate


async def test_a_refusal_of_media_only_the_latest_user_message_holds_raises_at_the_retry() -> None:
    """Found by a re-run (DQ 3): a refusal far over the estimate of a view whose only media
    are the latest user message's (1,000 icons the provider bills 258 tokens each) counted
    for the refused view alone: each retry compacted the history away, was sent, and was
    refused again, until `BudgetExceededError`. Those media now carry what no fit explains
    while they are in view, so the retry says at once that the budget cannot be met."""
    raw, short = _icons_asked_about(1_000, 12)
    async with ContextManager(Budget(context_window=200_000, reserve_output=8_000)) as ctx:
        counted, estimate = await _refused_first(ctx, raw, short)
        assert counted > 4 * estimate and counted > 200_000
        with pytest.raises(BudgetExceededError) as caught:
            await ctx.prepare(raw)
        assert caught.value.tokens > ctx.budget.limit
        assert caught.value.protected > ctx.budget.limit  # the icons, as the provider counts
        # The user takes the icons out (an edit): nothing of the refusal is laid on the rest.
        edited = [*raw[:-1], UserMessage.of("which of these icons are broken? (see the list)")]
        view = await ctx.prepare(edited)
        assert ctx.prompt_tokens < 50_000 and view[-1] == edited[-1]


async def test_a_refusal_of_media_the_rest_leaves_room_for_is_compacted_to_fit() -> None:
    """The same with icons that fit the budget alone: the retry compacts the rest until the
    view with the icons, as the provider counts it, is under the budget."""
    raw, short = _icons_asked_about(650, 25)
    async with ContextManager(Budget(context_window=200_000, reserve_output=8_000)) as ctx:
        counted, estimate = await _refused_first(ctx, raw, short)
        assert counted > 4 * estimate and counted > 200_000
        view = await ctx.prepare(raw)
        assert _billed(view, short) <= ctx.budget.limit
        assert check_view(view, raw) == []
        assert view[0] == raw[0] and view[-1] == raw[-1]


async def test_media_just_under_the_budget_alone_are_fitted_not_refused_again() -> None:
    """Found by a re-run (DU A): with icons that alone take 188k of a 192k budget, the retry
    raised `BudgetExceededError`: a 2 % margin on the whole excess (3.7k) was laid on them.
    What the provider counted is laid as it is."""
    raw, short = _icons_asked_about(730, 10)
    async with ContextManager(Budget(context_window=200_000, reserve_output=8_000)) as ctx:
        await _refused_first(ctx, raw, short)
        view = await ctx.prepare(raw)
        assert _billed(view, short) <= ctx.budget.limit
        assert view[-1] == raw[-1]


async def test_media_in_the_newest_complete_turn_s_question_raise_at_the_retry() -> None:
    """Found by a re-run (DU B): the icons were in the newest complete turn's question, the
    user asking again after its answer. Compaction keeps that message, but its media were
    taken for media compaction may leave out: the retry was sent and refused again, and then
    `BudgetExceededError` said the protected messages took 2k."""
    raw, short = _icons_asked_about(1_000, 12)
    raw += [AssistantMessage.of("Looking at them now."), UserMessage.of("and the broken ones?")]
    async with ContextManager(Budget(context_window=200_000, reserve_output=8_000)) as ctx:
        await _refused_first(ctx, raw, short)
        with pytest.raises(BudgetExceededError) as caught:
            await ctx.prepare(raw)
        assert caught.value.protected > ctx.budget.limit


def _with_screenshot(raw: list[Message]) -> list[Message]:
    """``raw`` with the first page read as a screenshot too: media compaction may leave out."""
    from agentctx import ImageBlock, TextBlock, ToolResultMessage

    shot = ImageBlock("image/png", _png(200, 150, 99_999))
    return [*raw[:2], ToolResultMessage("c0", (TextBlock("page 0"), shot), "read"), *raw[3:]]


async def test_a_refusal_of_icons_beside_a_screenshot_raises_at_the_retry() -> None:
    """Found by a re-run (DU C): the icons the latest user message holds (760, billed 196k)
    beside one screenshot in an old tool result. The whole excess was laid on the screenshot:
    leaving it out cleared it, and the retry went out at 197.9k, over the 192k budget (with
    775 icons it was refused again). Each image carries its part of a floor the estimates
    fall short of: the retry says at once that the budget cannot be met."""
    raw, short = _icons_asked_about(760, 30)
    async with ContextManager(Budget(context_window=200_000, reserve_output=8_000)) as ctx:
        counted, estimate = await _refused_first(ctx, _with_screenshot(raw), short)
        assert counted > 4 * estimate and counted > 200_000
        with pytest.raises(BudgetExceededError) as caught:
            await ctx.prepare(_with_screenshot(raw))
        assert caught.value.protected > ctx.budget.limit


async def test_a_refusal_of_icons_beside_a_screenshot_is_compacted_to_fit() -> None:
    """The same with icons that fit alone: the retry leaves the screenshot and the pages out
    as far as the view, as the provider counts it, fits the budget."""
    raw, short = _icons_asked_about(700, 30)
    async with ContextManager(Budget(context_window=200_000, reserve_output=8_000)) as ctx:
        await _refused_first(ctx, _with_screenshot(raw), short)
        view = await ctx.prepare(_with_screenshot(raw))
        assert _billed(view, short) <= ctx.budget.limit
        assert view[0] == raw[0] and view[-1] == raw[-1]


@given(
    st.lists(st.tuples(st.floats(0, 2_000), st.booleans()), min_size=1, max_size=40),
    st.floats(0, 1e6),
)
def test_a_floor_shares_out_the_whole_excess(
    images: list[tuple[float, bool]], excess: float
) -> None:
    kept = floor_share(excess, images)
    rest = floor_share(excess, [(e, not k) for e, k in images])
    assert 0 <= kept <= excess and 0 <= rest <= excess
    # All of it, unless the floor it takes is past any provider's (300 tokens an image).
    whole = min(excess, sum(max(0.0, 300 - e) for e, _ in images))
    assert floor_share(excess, [(e, True) for e, _ in images]) == pytest.approx(whole, abs=1e-6)
    assert kept + rest == pytest.approx(whole, rel=1e-9, abs=1e-6)


def test_a_floor_is_what_each_small_image_is_short_of() -> None:
    # 3 icons estimated at 2 and a screenshot at 40, billed 258 each: 3 * 256 + 218 short.
    images = [(2.0, True), (2.0, True), (2.0, True), (40.0, False)]
    assert floor_share(3 * 256 + 218, images) == pytest.approx(3 * 256)
    # Found by a re-run (DW 1): large screenshots billed tile by tile, ten times their
    # estimate, made a floor of 1,735 that 300 pasted icons were charged: the retry raised
    # where leaving the screenshots out fits. No provider's floor is past 300 tokens.
    icons = [(22.0, True)] * 300
    shots = [(1_534.0, False)] * 10
    assert floor_share(220_000, icons + shots) == pytest.approx(300 * (300 - 22))


async def test_a_worker_taking_the_session_over_after_a_refusal_counts_it(tmp_path: Any) -> None:
    """Found by a re-run (DU D): a worker that observed a refusal of 1,000 icons stopped; the
    next worker knew nothing of it and sent the refused view again. The session's saved
    state carries a refusal no usage report answered: the next worker raises at once, and
    with icons that fit, compacts the rest to fit them."""
    from agentctx import SQLiteRecallStore

    path = str(tmp_path / "s.db")
    limits = Budget(context_window=200_000, reserve_output=8_000)
    for icons, fits in ((1_000, False), (650, True)):
        raw, short = _icons_asked_about(icons, 25)
        session = f"job-{icons}"
        async with ContextManager(limits, recall=SQLiteRecallStore(path), session_id=session) as a:
            await _refused_first(a, raw, short)
        async with ContextManager(limits, recall=SQLiteRecallStore(path), session_id=session) as b:
            if fits:
                view = await b.prepare(raw)
                assert _billed(view, short) <= limits.limit and view[-1] == raw[-1]
            else:
                with pytest.raises(BudgetExceededError):
                    await b.prepare(raw)


@pytest.mark.parametrize(
    "refused",
    [
        {"media": None, "kept": [1e6, 100.0, 9, [0, 8]]},  # well formed: taken
        {"media": [float("nan"), 1, 10], "kept": [-5, 1, 10, [0]]},
        {"media": [1e6, 1, True], "kept": [1e6, 1, 10, [10]]},
        {"media": "x", "kept": [1e6, 1, 10, "01"]},
        {"media": [1e6], "kept": [1e6, 1, 10, [0, 1, 2, 3]]},
        # Found by a re-run (DW 2): media of 0 (or a denormal) divided by, on every prepare.
        {"media": [1000, 0, 9], "kept": [1000, 1e-320, 9, [0]]},
        [1, 2],
    ],
)
async def test_a_saved_refusal_that_is_none_is_left_out(refused: object) -> None:
    raw, _ = _icons_asked_about(100, 2)
    state = json.dumps({"version": 1, "last_call": None, "refused": refused})
    limits = Budget(context_window=200_000, reserve_output=8_000)
    well_formed = isinstance(refused, dict) and refused["media"] is None
    async with ContextManager(limits, ledger=Ledger(), state=state) as ctx:
        if well_formed:
            with pytest.raises(BudgetExceededError):
                await ctx.prepare(raw)
        else:
            await ctx.prepare(raw)
            assert ctx.prompt_tokens < 20_000
