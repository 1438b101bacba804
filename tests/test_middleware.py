"""The middleware form, through the real SDKs against the fake servers."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest

from agentctx import Budget, ConfigError, ContextManager
from agentctx.providers.middleware import as_middleware
from agentctx.testing.servers import FakeAnthropic, FakeOpenAI, Reply


def body(i: int) -> str:
    return "\n".join(f"def f{i}_{n}(x):\n    return x + {n}" for n in range(60))


@pytest.mark.parametrize("breakpoints", [False, True])
async def test_anthropic_middleware_compacts_observes_and_passes_params(breakpoints: bool) -> None:
    replies = [Reply.tool_call("read", {"path": f"a{i}.py"}) for i in range(12)]
    caching = "breakpoints" if breakpoints else False
    with FakeAnthropic(replies, default=Reply.text("done"), caching=caching) as srv:
        client = anthropic.AsyncAnthropic(base_url=srv.url, api_key="test", max_retries=0)
        async with client, ContextManager(Budget(context_window=6_000, reserve_output=500)) as ctx:
            middleware = as_middleware(ctx, "anthropic", cache_breakpoints=breakpoints)

            async def call(request: dict[str, Any]) -> Any:
                return await client.messages.create(**request)

            history: list[dict[str, Any]] = [{"role": "user", "content": "read a0..a11"}]
            tools = [{"name": "read", "description": "read", "input_schema": {"type": "object"}}]
            for i in range(12):
                request = {"model": "m", "max_tokens": 64, "messages": history, "tools": tools}
                reply = await middleware(request, call)
                use = next(b for b in reply.content if b.type == "tool_use")
                history = [
                    *history,
                    {"role": "assistant", "content": [b.to_dict() for b in reply.content]},
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": use.id, "content": body(i)}
                        ],
                    },
                ]
    assert all(r.status == 200 for r in srv.requests)  # the server validates every transcript
    assert all(r.json["tools"] == tools for r in srv.requests)
    sent = [len(json.dumps(r.json["messages"])) for r in srv.requests]
    assert sent[-1] < len(json.dumps(history))  # compacted
    assert ctx.usage.output_tokens > 0 and ctx.usage.prompt_tokens > 0
    # with breakpoints the fake server (caching only at breakpoints) reads a cached prefix
    assert (ctx.usage.cache_read_tokens > 0) == breakpoints


async def test_openai_chat_middleware_keeps_the_system_message() -> None:
    with FakeOpenAI([Reply.text("hi")], default=Reply.text("again")) as srv:
        client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="test", max_retries=0)
        async with client, ContextManager(Budget(context_window=100_000)) as ctx:
            middleware = as_middleware(ctx, "openai-chat")

            async def call(request: dict[str, Any]) -> Any:
                return await client.chat.completions.create(**request)

            messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "x"}]
            await middleware({"model": "m", "messages": messages, "temperature": 0.2}, call)
    sent = srv.requests[0].json
    assert sent["messages"] == messages and sent["temperature"] == 0.2
    assert ctx.usage.prompt_tokens > 0


def test_unknown_provider_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="gemini"):
        as_middleware(ContextManager(100_000), "gemini")  # type: ignore[arg-type]


async def test_a_request_that_is_no_mapping_is_an_unsupported_message() -> None:
    """(Hostile run EA, 9) A request that is no dict of keyword arguments raised a bare
    AttributeError from deep inside the compaction."""
    from agentctx import UnsupportedMessageError

    async def call_next(request: dict[str, Any]) -> Any:
        raise AssertionError("nothing is sent")

    middleware = as_middleware(ContextManager(Budget(context_window=30_000)), "anthropic")
    with pytest.raises(UnsupportedMessageError, match="request of type list"):
        await middleware([{"role": "user", "content": "t"}], call_next)  # type: ignore[arg-type]
