"""Checked by mypy --strict (tests/test_typing.py), never run: every method of a wrapped client
returns the SDK's own type, as the unwrapped client's does."""

from __future__ import annotations

from typing import assert_type

import anthropic
import openai
import pydantic
from anthropic.lib.streaming import (
    AsyncMessageStream,
    BetaAsyncMessageStream,
    BetaMessageStream,
    MessageStream,
)
from anthropic.lib.tools import (
    BetaAsyncStreamingToolRunner,
    BetaAsyncToolRunner,
    BetaStreamingToolRunner,
    BetaToolRunner,
)
from anthropic.types import (
    Message,
    MessageParam,
    MessageTokensCount,
    ParsedMessage,
    RawMessageStreamEvent,
)
from anthropic.types.beta import BetaMessage, BetaMessageTokensCount, BetaRawMessageStreamEvent
from anthropic.types.beta.parsed_beta_message import ParsedBetaMessage
from openai.lib.streaming.chat import AsyncChatCompletionStream, ChatCompletionStream
from openai.lib.streaming.responses import AsyncResponseStream, ResponseStream
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionMessageParam,
    ParsedChatCompletion,
)
from openai.types.responses import (
    InputTokenCountResponse,
    ParsedResponse,
    Response,
    ResponseInputParam,
    ResponseStreamEvent,
)

from agentctx import ContextManager
from agentctx.providers.anthropic import WrappedAnthropic, WrappedAsyncAnthropic
from agentctx.providers.anthropic import wrap as wrap_anthropic
from agentctx.providers.openai import WrappedAsyncOpenAI, WrappedOpenAI
from agentctx.providers.openai import wrap as wrap_openai


class Answer(pydantic.BaseModel):
    answer: str


M = "claude-sonnet-5-5"


async def async_anthropic(
    raw: anthropic.AsyncAnthropic, ctx: ContextManager, history: list[MessageParam]
) -> None:
    client = wrap_anthropic(raw, ctx)
    assert_type(client, WrappedAsyncAnthropic[anthropic.AsyncAnthropic])
    assert_type(client.with_options(timeout=5), WrappedAsyncAnthropic[anthropic.AsyncAnthropic])

    messages = client.messages
    assert_type(await messages.create(messages=history, model=M, max_tokens=1024), Message)
    assert_type(
        await messages.create(messages=history, stream=True, model=M, max_tokens=1024),
        anthropic.AsyncStream[RawMessageStreamEvent],
    )
    assert_type(
        await messages.parse(messages=history, model=M, max_tokens=1024), ParsedMessage[None]
    )
    assert_type(
        await messages.parse(messages=history, output_format=Answer, model=M, max_tokens=1024),
        ParsedMessage[Answer],
    )
    async with messages.stream(messages=history, model=M, max_tokens=1024) as stream:
        assert_type(stream, AsyncMessageStream[None])
    async with messages.stream(
        messages=history, output_format=Answer, model=M, max_tokens=1024
    ) as parsed:
        assert_type(parsed, AsyncMessageStream[Answer])
    assert_type(await messages.count_tokens(model=M, messages=history), MessageTokensCount)

    beta = client.beta.messages
    assert_type(await beta.create(messages=history, model=M, max_tokens=1024), BetaMessage)
    assert_type(
        await beta.create(messages=history, stream=True, model=M, max_tokens=1024),
        anthropic.AsyncStream[BetaRawMessageStreamEvent],
    )
    assert_type(
        await beta.parse(messages=history, model=M, max_tokens=1024), ParsedBetaMessage[None]
    )
    assert_type(
        await beta.parse(messages=history, output_format=Answer, model=M, max_tokens=1024),
        ParsedBetaMessage[Answer],
    )
    async with beta.stream(messages=history, model=M, max_tokens=1024) as beta_stream:
        assert_type(beta_stream, BetaAsyncMessageStream[None])
    assert_type(await beta.count_tokens(model=M, messages=history), BetaMessageTokensCount)
    assert_type(
        beta.tool_runner(messages=history, tools=[], model=M, max_tokens=1024),
        BetaAsyncToolRunner[None],
    )
    assert_type(
        beta.tool_runner(
            messages=history, tools=[], output_format=Answer, model=M, max_tokens=1024
        ),
        BetaAsyncToolRunner[Answer],
    )
    assert_type(
        beta.tool_runner(messages=history, tools=[], stream=True, model=M, max_tokens=1024),
        BetaAsyncStreamingToolRunner[None],
    )


def sync_anthropic(
    raw: anthropic.Anthropic, ctx: ContextManager, history: list[MessageParam]
) -> None:
    with wrap_anthropic(raw, ctx) as client:
        assert_type(client, WrappedAnthropic[anthropic.Anthropic])
        assert_type(client.copy(timeout=5), WrappedAnthropic[anthropic.Anthropic])

        messages = client.messages
        assert_type(messages.create(messages=history, model=M, max_tokens=1024), Message)
        assert_type(
            messages.create(messages=history, stream=True, model=M, max_tokens=1024),
            anthropic.Stream[RawMessageStreamEvent],
        )
        assert_type(
            messages.parse(messages=history, output_format=Answer, model=M, max_tokens=1024),
            ParsedMessage[Answer],
        )
        with messages.stream(messages=history, model=M, max_tokens=1024) as stream:
            assert_type(stream, MessageStream[None])
        assert_type(messages.count_tokens(model=M, messages=history), MessageTokensCount)

        beta = client.beta.messages
        assert_type(beta.create(messages=history, model=M, max_tokens=1024), BetaMessage)
        assert_type(
            beta.create(messages=history, stream=True, model=M, max_tokens=1024),
            anthropic.Stream[BetaRawMessageStreamEvent],
        )
        assert_type(beta.parse(messages=history, model=M, max_tokens=1024), ParsedBetaMessage[None])
        with beta.stream(
            messages=history, output_format=Answer, model=M, max_tokens=1024
        ) as beta_stream:
            assert_type(beta_stream, BetaMessageStream[Answer])
        assert_type(beta.count_tokens(model=M, messages=history), BetaMessageTokensCount)
        assert_type(
            beta.tool_runner(messages=history, tools=[], model=M, max_tokens=1024),
            BetaToolRunner[None],
        )
        assert_type(
            beta.tool_runner(messages=history, tools=[], stream=True, model=M, max_tokens=1024),
            BetaStreamingToolRunner[None],
        )


async def async_openai(
    raw: openai.AsyncOpenAI,
    ctx: ContextManager,
    messages: list[ChatCompletionMessageParam],
    items: ResponseInputParam,
) -> None:
    client = wrap_openai(raw, ctx)
    assert_type(client, WrappedAsyncOpenAI[openai.AsyncOpenAI])
    assert_type(client.with_options(timeout=5), WrappedAsyncOpenAI[openai.AsyncOpenAI])

    chat = client.chat.completions
    assert_type(await chat.create(model="m", messages=messages), ChatCompletion)
    assert_type(
        await chat.create(model="m", messages=messages, stream=True),
        openai.AsyncStream[ChatCompletionChunk],
    )
    assert_type(await chat.parse(model="m", messages=messages), ParsedChatCompletion[None])
    assert_type(
        await chat.parse(model="m", messages=messages, response_format=Answer),
        ParsedChatCompletion[Answer],
    )
    async with chat.stream(model="m", messages=messages) as stream:
        assert_type(stream, AsyncChatCompletionStream[None])

    responses = client.responses
    assert_type(await responses.create(model="m", input=items), Response)
    assert_type(
        await responses.create(model="m", input=items, stream=True),
        openai.AsyncStream[ResponseStreamEvent],
    )
    assert_type(
        await responses.parse(model="m", input=items, text_format=Answer), ParsedResponse[Answer]
    )
    async with responses.stream(model="m", input=items) as events:
        assert_type(events, AsyncResponseStream[None])
    assert_type(await responses.input_tokens.count(model="m", input=items), InputTokenCountResponse)


def sync_openai(
    raw: openai.OpenAI,
    ctx: ContextManager,
    messages: list[ChatCompletionMessageParam],
    items: ResponseInputParam,
) -> None:
    with wrap_openai(raw, ctx) as client:
        assert_type(client, WrappedOpenAI[openai.OpenAI])

        chat = client.chat.completions
        assert_type(chat.create(model="m", messages=messages), ChatCompletion)
        assert_type(
            chat.create(model="m", messages=messages, stream=True),
            openai.Stream[ChatCompletionChunk],
        )
        assert_type(
            chat.parse(model="m", messages=messages, response_format=Answer),
            ParsedChatCompletion[Answer],
        )
        with chat.stream(model="m", messages=messages, response_format=Answer) as stream:
            assert_type(stream, ChatCompletionStream[Answer])

        responses = client.responses
        assert_type(responses.create(model="m", input=items), Response)
        assert_type(
            responses.create(model="m", input=items, stream=True),
            openai.Stream[ResponseStreamEvent],
        )
        assert_type(responses.parse(model="m", input=items), ParsedResponse[None])
        with responses.stream(model="m", input=items, text_format=Answer) as events:
            assert_type(events, ResponseStream[Answer])
        assert_type(responses.input_tokens.count(model="m", input=items), InputTokenCountResponse)
