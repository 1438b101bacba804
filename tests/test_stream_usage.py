"""A wrapped stream's usage is recorded at the API's last event, before the caller gets it.

Found by a hostile run (DE, finding 1): usage was recorded only when the stream's iterator
was exhausted. A loop that stops at the last event (``if event.type == "message_stop":
break``, ``return event.response`` at ``response.completed``), which has every event and the
usage, recorded nothing, on all three APIs, async and blocking, ``create(stream=True)`` and
the ``stream()`` helpers; so did a connection dropped right after the last event. The
session then never calibrated, and sent requests over its limit. And (finding 2) a blocking
stream read to its end after its session closed raised agentctx's `ConfigError` from its
last ``next()``, after every event was delivered."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx2
import openai

from agentctx import Budget, ContextManager
from agentctx.providers import anthropic as ant_provider
from agentctx.providers import openai as oai_provider
from agentctx.testing.servers import FakeAnthropic, FakeOpenAI, Reply

HI = [{"role": "user", "content": "hi"}]


def session() -> ContextManager:
    return ContextManager(Budget(context_window=200_000))


async def test_an_anthropic_stream_left_at_message_stop_records_its_usage() -> None:
    async with (
        FakeAnthropic() as server,
        session() as ctx,
        anthropic.AsyncAnthropic(base_url=server.url, api_key="t", max_retries=0) as raw,
    ):
        client = ant_provider.wrap(raw, ctx)
        stream = await client.messages.create(model="m", max_tokens=64, messages=HI, stream=True)
        async for event in stream:
            if event.type == "message_stop":
                break
        await stream.close()
        (request,) = server.requests
        assert ctx.usage.prompt_tokens == request.usage.prompt_tokens > 0
        assert ctx.usage.output_tokens == request.usage.output_tokens > 0


async def test_an_anthropic_stream_helper_left_at_message_stop_records_its_usage() -> None:
    async with (
        FakeAnthropic() as server,
        session() as ctx,
        anthropic.AsyncAnthropic(base_url=server.url, api_key="t", max_retries=0) as raw,
    ):
        client = ant_provider.wrap(raw, ctx)
        async with client.messages.stream(model="m", max_tokens=64, messages=HI) as stream:
            async for event in stream:
                if event.type == "message_stop":
                    break
        assert ctx.usage.prompt_tokens == server.requests[0].usage.prompt_tokens > 0


async def test_a_responses_stream_returned_from_at_completed_records_its_usage() -> None:
    async with (
        FakeOpenAI() as server,
        session() as ctx,
        openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="t", max_retries=0) as raw,
    ):
        client = oai_provider.wrap(raw, ctx)

        async def answer() -> Any:
            stream = await client.responses.create(model="m", input=HI, stream=True)
            async for event in stream:
                if event.type == "response.completed":
                    return event.response
            raise AssertionError("no response.completed")

        response = await answer()
        assert ctx.usage.prompt_tokens == response.usage.input_tokens > 0
        assert ctx.usage.output_tokens == response.usage.output_tokens


async def test_a_chat_stream_left_at_its_usage_chunk_records_it() -> None:
    async with (
        FakeOpenAI() as server,
        session() as ctx,
        openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="t", max_retries=0) as raw,
    ):
        client = oai_provider.wrap(raw, ctx)
        stream = await client.chat.completions.create(model="m", messages=HI, stream=True)
        usage = None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
                break
        await stream.close()
        assert usage is not None
        assert ctx.usage.prompt_tokens == usage.prompt_tokens > 0
        assert ctx.usage.output_tokens == usage.completion_tokens


async def test_a_connection_dropped_after_the_last_event_still_records_the_usage() -> None:
    # Dropped right after the stream's last event (message_stop, the seventh of a short
    # reply's), as the test's first assertion checks.
    async with (
        FakeAnthropic(replies=[Reply.disconnect(after_events=7, text="ok")]) as server,
        session() as ctx,
        anthropic.AsyncAnthropic(base_url=server.url, api_key="t", max_retries=0) as raw,
    ):
        client = ant_provider.wrap(raw, ctx)
        stream = await client.messages.create(model="m", max_tokens=64, messages=HI, stream=True)
        seen = []
        try:
            async for event in stream:
                seen.append(event.type)
        except anthropic.APIConnectionError:
            pass
        assert seen[-1] == "message_stop"
        assert ctx.usage.output_tokens > 0


async def test_a_stream_read_to_its_end_records_its_usage_once() -> None:
    async with (
        FakeAnthropic() as server,
        session() as ctx,
        anthropic.AsyncAnthropic(base_url=server.url, api_key="t", max_retries=0) as raw,
    ):
        client = ant_provider.wrap(raw, ctx)
        async with client.messages.stream(model="m", max_tokens=64, messages=HI) as stream:
            await stream.get_final_message()
        assert ctx.usage.prompt_tokens == server.requests[0].usage.prompt_tokens > 0


def test_a_blocking_stream_left_at_message_stop_records_its_usage() -> None:
    with FakeAnthropic() as server:
        ctx = session()
        with (
            ant_provider.wrap(
                anthropic.Anthropic(base_url=server.url, api_key="t", max_retries=0), ctx
            ) as client,
            client.messages.stream(model="m", max_tokens=64, messages=HI) as stream,
        ):
            for event in stream:
                if event.type == "message_stop":
                    break
        assert ctx.usage.prompt_tokens == server.requests[0].usage.prompt_tokens > 0


def test_a_blocking_stream_read_after_its_session_closed_ends_as_the_sdk_s_does() -> None:
    with FakeAnthropic() as server, httpx2.Client() as http:
        client = ant_provider.wrap(
            anthropic.Anthropic(base_url=server.url, api_key="t", max_retries=0), session()
        )
        own = client.with_options(http_client=http)  # a copy on the same session
        stream = own.messages.create(model="m", max_tokens=64, messages=HI, stream=True)
        client.close()  # the session ends (its wrapper owns the loop)
        seen = [event.type for event in stream]
        assert seen[-1] == "message_stop"
