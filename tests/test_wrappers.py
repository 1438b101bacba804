"""`wrap` through the real SDKs against the fake servers: byte-stable requests, usage,
untouched parameters, compaction the server accepts, streaming."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import openai
import pytest

from agentctx import (
    Budget,
    ConfigError,
    ContextCompacted,
    ContextManager,
    Event,
    MemoryRecallStore,
    UnsupportedMessageError,
)
from agentctx.providers import anthropic as ant_provider
from agentctx.providers import openai as oai_provider
from agentctx.testing.servers import FakeAnthropic, FakeOpenAI, RecordedRequest, Reply

MODEL = "claude-test"
SYSTEM = "You are a careful coding agent."
TOOLS = [
    {
        "name": "read",
        "description": "Read a file.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]
CHAT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read",
            "description": "Read a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]
RESP_TOOLS = [{"type": "function", "name": "read", "parameters": {"type": "object"}}]
TASK = "Read the files a0.py to a9.py and tell me what they do."


def file_body(i: int, lines: int = 60) -> str:
    return "\n".join(
        f"def f{i}_{n}(x):  # helper {n} of module a{i}\n    return x + {n}" for n in range(lines)
    )


def script(n: int, thinking: str | None = None) -> list[Reply]:
    calls = [Reply.tool_call("read", {"path": f"a{i}.py"}, thinking=thinking) for i in range(n)]
    return [*calls, Reply.text("They are helper modules.")]


def compactions(manager: ContextManager) -> list[ContextCompacted]:
    seen: list[ContextCompacted] = []

    def on(event: Event) -> None:
        if isinstance(event, ContextCompacted):
            seen.append(event)

    manager.subscribe(on)
    return seen


def assert_prefix_stable(requests: list[RecordedRequest], key: str, breaks: int = 0) -> None:
    """Each request's ``key`` list starts with the whole previous one, except ``breaks`` times."""
    broken = 0
    for before, after in zip(requests, requests[1:], strict=False):
        a, b = before.json[key], after.json[key]
        if json.dumps(b[: len(a)]).encode() != json.dumps(a).encode():
            broken += 1
    assert broken <= breaks


def assert_all_ok(requests: list[RecordedRequest]) -> None:
    assert [r.status for r in requests] == [200] * len(requests), [r.error for r in requests]


@pytest.fixture
async def manager() -> AsyncIterator[ContextManager]:
    m = ContextManager(Budget(context_window=200_000))
    yield m
    await m.aclose()


@pytest.fixture
async def small() -> AsyncIterator[ContextManager]:
    budget = Budget(context_window=9_000, reserve_output=1_000)
    m = ContextManager(budget, recall=MemoryRecallStore())
    yield m
    await m.aclose()


# ================================================================== Anthropic


async def anthropic_loop(
    client: Any, turns: int, stream: bool = False, **params: Any
) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    for _ in range(turns + 1):
        if stream:
            events = [
                e
                async for e in await client.messages.create(messages=history, stream=True, **params)
            ]
            content = [e.content_block.to_dict() for e in events if e.type == "content_block_start"]
            for e in events:  # fill in the streamed text / tool input
                if e.type == "content_block_delta" and e.delta.type == "text_delta":
                    content[e.index]["text"] += e.delta.text
                if e.type == "content_block_delta" and e.delta.type == "input_json_delta":
                    content[e.index].setdefault("_json", "")
                    content[e.index]["_json"] += e.delta.partial_json
            for b in content:
                if "_json" in b:
                    b["input"] = json.loads(b.pop("_json"))
        else:
            resp = await client.messages.create(messages=history, **params)
            content = [b.to_dict() for b in resp.content]
        history.append({"role": "assistant", "content": content})
        uses = [b for b in content if b["type"] == "tool_use"]
        if not uses:
            break
        history.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": u["id"],
                        "content": file_body(int(u["input"]["path"][1])),
                    }
                    for u in uses
                ],
            }
        )
    return history


async def test_anthropic_tool_loop_is_byte_stable_and_records_usage(
    manager: ContextManager,
) -> None:
    params: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 512,
        "system": SYSTEM,
        "tools": TOOLS,
        "metadata": {"user_id": "u-42"},
        "tool_choice": {"type": "auto"},
        "stop_sequences": ["END"],
    }
    async with FakeAnthropic(script(5)) as srv:
        raw = anthropic.AsyncAnthropic(base_url=srv.url, api_key="test", max_retries=0)
        async with ant_provider.wrap(raw, manager) as client:
            history = await anthropic_loop(client, 5, **params)
            # everything else on the client passes through
            assert client.api_key == "test"
            count = await client.messages.count_tokens(model=MODEL, messages=history[:1])
            assert count.input_tokens > 0
    calls = [r for r in srv.requests if r.path == "/v1/messages"]
    assert len(calls) == 6
    assert_all_ok(calls)
    assert_prefix_stable(calls, "messages")
    for r in calls:
        assert {k: v for k, v in r.json.items() if k != "messages"} == params
    # nothing was compacted: the last request is the caller's history minus its final reply
    assert calls[-1].json["messages"] == history[:-1]
    billed = [r.usage for r in calls if r.usage is not None]
    assert manager.usage.output_tokens == sum(b.output_tokens for b in billed)
    assert manager.usage.cache_read_tokens == sum(b.cache_read for b in billed) > 0
    assert manager.usage.prompt_tokens > 0


async def test_anthropic_small_budget_compacts_and_stays_valid(small: ContextManager) -> None:
    seen = compactions(small)
    async with FakeAnthropic(script(10)) as srv:
        raw = anthropic.AsyncAnthropic(base_url=srv.url, api_key="test", max_retries=0)
        async with ant_provider.wrap(raw, small) as client:
            history = await anthropic_loop(
                client, 10, model=MODEL, max_tokens=512, system=SYSTEM, tools=TOOLS
            )
    assert_all_ok(srv.requests)
    assert seen, "the small budget should have compacted"
    assert sum(e.tokens_before - e.tokens_after for e in seen) > 0
    last = srv.requests[-1].json["messages"]
    assert len(json.dumps(last)) < len(json.dumps(history[:-1]))
    # prefix-stable except where a compaction rewrote the view
    assert_prefix_stable(srv.requests, "messages", breaks=len(seen))
    assert small.usage.output_tokens > 0


async def test_anthropic_thinking_survives_signature_check(manager: ContextManager) -> None:
    async with FakeAnthropic(script(3, thinking="Let me look at the next file.")) as srv:
        raw = anthropic.AsyncAnthropic(base_url=srv.url, api_key="test", max_retries=0)
        async with ant_provider.wrap(raw, manager) as client:
            await anthropic_loop(
                client,
                3,
                model=MODEL,
                max_tokens=4096,
                tools=TOOLS,
                thinking={"type": "enabled", "budget_tokens": 1024},
            )
    assert_all_ok(srv.requests)
    assert_prefix_stable(srv.requests, "messages")


async def test_anthropic_stream_records_usage(manager: ContextManager) -> None:
    async with FakeAnthropic(script(3)) as srv:
        raw = anthropic.AsyncAnthropic(base_url=srv.url, api_key="test", max_retries=0)
        async with ant_provider.wrap(raw, manager) as client:
            await anthropic_loop(client, 3, stream=True, model=MODEL, max_tokens=512, tools=TOOLS)
            assert manager.usage.output_tokens == sum(
                r.usage.output_tokens for r in srv.requests if r.usage
            )
            before = manager.usage.output_tokens
            async with client.messages.stream(
                model=MODEL, max_tokens=512, messages=[{"role": "user", "content": "hi"}]
            ) as stream:
                text = await stream.get_final_text()
            assert text == "ok"
            assert manager.usage.output_tokens > before
    assert_all_ok(srv.requests)
    assert all(r.stream for r in srv.requests)
    assert_prefix_stable(srv.requests[:4], "messages")


# ================================================================== OpenAI Chat Completions


async def chat_loop(client: Any, turns: int, stream: bool = False, **params: Any) -> list[Any]:
    history: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": TASK},
    ]
    for _ in range(turns + 1):
        if stream:
            chunks = [
                c
                async for c in await client.chat.completions.create(
                    messages=history,
                    stream=True,
                    stream_options={"include_usage": True},
                    **params,
                )
            ]
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            calls: dict[int, dict[str, Any]] = {}
            for c in chunks:
                for d in (c.choices[0].delta.tool_calls or []) if c.choices else []:
                    slot = calls.setdefault(
                        d.index,
                        {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                    )
                    slot["id"] += d.id or ""
                    slot["function"]["name"] += d.function.name or ""
                    slot["function"]["arguments"] += d.function.arguments or ""
            msg: dict[str, Any] = {"role": "assistant", "content": text or None}
            if calls:
                msg["tool_calls"] = list(calls.values())
        else:
            resp = await client.chat.completions.create(messages=history, **params)
            m = resp.choices[0].message
            msg = {"role": "assistant", "content": m.content}
            if m.tool_calls:
                msg["tool_calls"] = [tc.to_dict() for tc in m.tool_calls]
        history.append(msg)
        if "tool_calls" not in msg:
            break
        for tc in msg["tool_calls"]:
            path = json.loads(tc["function"]["arguments"])["path"]
            history.append(
                {"role": "tool", "tool_call_id": tc["id"], "content": file_body(int(path[1]))}
            )
    return history


async def test_openai_chat_tool_loop(manager: ContextManager) -> None:
    params: dict[str, Any] = {
        "model": "gpt-test",
        "tools": CHAT_TOOLS,
        "temperature": 0.5,
        "metadata": {"run": "7"},
        "seed": 3,
    }
    async with FakeOpenAI(script(4)) as srv:
        raw = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="test", max_retries=0)
        async with oai_provider.wrap(raw, manager) as client:
            history = await chat_loop(client, 4, **params)
            assert client.api_key == "test"
    assert len(srv.requests) == 5
    assert_all_ok(srv.requests)
    assert_prefix_stable(srv.requests, "messages")
    for r in srv.requests:
        assert r.json["messages"][0] == {"role": "system", "content": SYSTEM}
        assert {k: v for k, v in r.json.items() if k != "messages"} == params
    assert srv.requests[-1].json["messages"] == history[:-1]
    billed = [r.usage for r in srv.requests if r.usage is not None]
    assert manager.usage.output_tokens == sum(b.output_tokens for b in billed)
    assert manager.usage.cache_read_tokens == sum(b.cache_read for b in billed) > 0


async def test_openai_chat_small_budget_and_stream(small: ContextManager) -> None:
    seen = compactions(small)
    async with FakeOpenAI(script(10)) as srv:
        raw = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="test", max_retries=0)
        async with oai_provider.wrap(raw, small) as client:
            await chat_loop(client, 10, stream=True, model="gpt-test", tools=CHAT_TOOLS)
    assert_all_ok(srv.requests)
    assert seen
    assert_prefix_stable(srv.requests, "messages", breaks=len(seen))
    assert small.usage.output_tokens == sum(r.usage.output_tokens for r in srv.requests if r.usage)


# ================================================================== OpenAI Responses


async def responses_loop(client: Any, turns: int, stream: bool = False, **params: Any) -> list[Any]:
    items: list[dict[str, Any]] = [
        {"role": "developer", "content": SYSTEM},
        {"role": "user", "content": TASK},
    ]
    for _ in range(turns + 1):
        if stream:
            events = [
                e async for e in await client.responses.create(input=items, stream=True, **params)
            ]
            done = next(e for e in events if e.type == "response.completed")
            output = [o.to_dict() for o in done.response.output]
        else:
            resp = await client.responses.create(input=items, **params)
            output = [o.to_dict() for o in resp.output]
        items += output
        calls = [o for o in output if o["type"] == "function_call"]
        if not calls:
            break
        for c in calls:
            path = json.loads(c["arguments"])["path"]
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": c["call_id"],
                    "output": file_body(int(path[1])),
                }
            )
    return items


async def test_openai_responses_tool_loop(manager: ContextManager) -> None:
    params: dict[str, Any] = {
        "model": "gpt-test",
        "tools": RESP_TOOLS,
        "instructions": "Be brief.",
        "temperature": 0.1,
        "store": False,
    }
    async with FakeOpenAI(script(4)) as srv:
        raw = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="test", max_retries=0)
        client = oai_provider.wrap(raw, manager)
        async with client:
            items = await responses_loop(client, 4, **params)
    assert_all_ok(srv.requests)
    assert_prefix_stable(srv.requests, "input")
    for r in srv.requests:
        assert {k: v for k, v in r.json.items() if k != "input"} == params
    assert srv.requests[-1].json["input"] == items[: len(srv.requests[-1].json["input"])]
    assert manager.usage.output_tokens == sum(
        r.usage.output_tokens for r in srv.requests if r.usage
    )


async def test_openai_responses_small_budget_stream(small: ContextManager) -> None:
    seen = compactions(small)
    async with FakeOpenAI(script(10)) as srv:
        raw = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="test", max_retries=0)
        async with oai_provider.wrap(raw, small) as client:
            await responses_loop(client, 10, stream=True, model="gpt-test", tools=RESP_TOOLS)
    assert_all_ok(srv.requests)
    assert seen
    assert_prefix_stable(srv.requests, "input", breaks=len(seen))
    assert small.usage.output_tokens == sum(r.usage.output_tokens for r in srv.requests if r.usage)


async def test_wrap_rejects_the_wrong_client(manager: ContextManager) -> None:
    # A `ConfigError`, as every error of the library (hostile run EB, 4: a bare TypeError).
    with pytest.raises(ConfigError, match="got AsyncOpenAI"):
        ant_provider.wrap(openai.AsyncOpenAI(api_key="x"), manager)  # type: ignore[type-var]
    with pytest.raises(ConfigError, match="got AsyncAnthropic"):
        oai_provider.wrap(anthropic.AsyncAnthropic(api_key="x"), manager)  # type: ignore[type-var]


def test_importing_providers_imports_no_sdk() -> None:
    import subprocess
    import sys

    code = (
        "import sys, agentctx, agentctx.providers; "
        "print(any(m in sys.modules for m in ('anthropic', 'openai', 'structlog', 'rich')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


async def test_openai_responses_stateful_and_string_input_pass_through(
    manager: ContextManager,
) -> None:
    async with FakeOpenAI([Reply.text("one"), Reply.text("two")]) as srv:
        raw = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="test", max_retries=0)
        async with oai_provider.wrap(raw, manager) as client:
            first = await client.responses.create(model="gpt-test", input="Hello")
            follow = [{"role": "user", "content": "And then?"}]
            await client.responses.create(
                model="gpt-test", input=follow, previous_response_id=first.id
            )
    assert_all_ok(srv.requests)
    assert srv.requests[0].json["input"] == "Hello"
    assert srv.requests[1].json["input"] == follow
    assert srv.requests[1].json["previous_response_id"] == first.id
    assert manager.usage.output_tokens == sum(
        r.usage.output_tokens for r in srv.requests if r.usage
    )


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_a_developer_reminder_after_the_question_does_not_take_its_place(api: str) -> None:
    """Found by hostile testing: a developer message a harness appends mid-history (the
    adapters carry it as a user message marked with its role) was protected as the latest
    user message, and the user's actual question was summarized away."""
    history: list[dict[str, Any]] = [{"role": "user", "content": "TASK"}]

    def steps(tag: str, n: int) -> None:
        for i in range(n):
            out = "\n".join(
                f"line {k} of output {i}: content to fill tokens {k * i}" for k in range(80)
            )
            if api == "chat":
                history.append({"role": "assistant", "content": None, "tool_calls": [
                    {"id": f"{tag}{i}", "type": "function",
                     "function": {"name": "read", "arguments": "{}"}}]})  # fmt: skip
                history.append({"role": "tool", "tool_call_id": f"{tag}{i}", "content": out})
            else:
                history.append({"type": "function_call", "call_id": f"{tag}{i}", "name": "read",
                                "arguments": "{}"})  # fmt: skip
                history.append(
                    {"type": "function_call_output", "call_id": f"{tag}{i}", "output": out}
                )

    steps("a", 6)
    history += [
        {"role": "assistant", "content": "answer 1"},
        {"role": "user", "content": "QUESTION 2"},
    ]
    steps("b", 8)
    history.append({"role": "developer", "content": "reminder: be concise"})
    async with FakeOpenAI(default=Reply.text("ok")) as srv:
        raw = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="t", max_retries=0)
        async with ContextManager(
            Budget(context_window=6_000, reserve_output=500), recall=MemoryRecallStore()
        ) as ctx:
            client = oai_provider.wrap(raw, ctx)
            if api == "chat":
                await client.chat.completions.create(model="m", messages=history)  # type: ignore[arg-type]
            else:
                await client.responses.create(model="m", input=history)  # type: ignore[arg-type]
            assert ctx.budget.limit >= ctx.prompt_tokens
        await raw.close()
    (request,) = srv.requests
    assert request.status == 200
    sent = json.dumps(request.json)
    assert "QUESTION 2" in sent and "reminder: be concise" in sent and "TASK" in sent


# -- a call sent as it is ------------------------------------------------------------------


async def test_a_responses_call_sent_as_it_is_leaves_the_session_s_counts_alone() -> None:
    """Found by a docs check (DD, finding 1): a Responses call that continues server-side
    state (or has a string input) is sent uncompacted, as documented, but its usage was
    recorded against the session's last view: the server's count of its own short chain
    calibrated a 34k-token view down to 6k, and the next ordinary call went over the
    window, refused, with no event. Its usage is spent (`ctx.usage`), not calibrated on."""
    async with (
        FakeOpenAI(default=Reply.text("ok"), context_window=44_000) as server,
        ContextManager(Budget(context_window=44_000)) as ctx,
        openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as raw,
    ):
        other = await raw.responses.create(model="m", input=[{"role": "user", "content": "hi"}])
        client = oai_provider.wrap(raw, ctx)
        items: list[Any] = [{"role": "user", "content": "task"}]
        for i in range(5):
            items.append({"role": "user", "content": f"note {i} " + "lorem ipsum dolor " * 1500})
            reply = await client.responses.create(model="m", input=items, max_output_tokens=1000)
            items += [o.to_dict() for o in reply.output]
        tokens, usage = ctx.prompt_tokens, ctx.usage
        await client.responses.create(
            model="m", previous_response_id=other.id, input=[{"role": "user", "content": "q"}]
        )
        await client.responses.create(model="m", input="a string input")
        async with client.responses.stream(model="m", input="a streamed string input") as stream:
            await stream.get_final_response()
        # Spent, so counted in the session's usage; not the view's size, so no calibration.
        assert ctx.prompt_tokens == tokens
        side = [r.usage for r in server.requests[-3:]]
        assert ctx.usage.prompt_tokens == usage.prompt_tokens + sum(u.prompt_tokens for u in side)
        items.append({"role": "user", "content": "more " + "lorem ipsum dolor " * 2500})
        await client.responses.create(model="m", input=items, max_output_tokens=1000)
        assert all(r.status == 200 for r in server.requests), [r.error for r in server.requests]


async def test_an_empty_history_is_refused_before_anything_is_sent() -> None:
    """(Hostile run EB, 3) ``messages=[]`` went to the provider, which refuses it (400 "at
    least one message is required"), while a history repair leaves empty was refused before
    sending: both are `UnsupportedMessageError` now, with nothing sent. A Chat history of
    its system message alone is a request, and is sent."""
    with FakeAnthropic() as ant, FakeOpenAI() as oai:
        async with ContextManager(Budget(context_window=30_000)) as manager:
            client = anthropic.AsyncAnthropic(base_url=ant.url, api_key="t", max_retries=0)
            async with ant_provider.wrap(client, manager) as wrapped:
                for ask in (wrapped.messages.create, wrapped.messages.count_tokens):
                    with pytest.raises(UnsupportedMessageError, match="it is empty"):
                        await ask(model=MODEL, max_tokens=10, messages=[])
            chat = openai.AsyncOpenAI(base_url=oai.url + "/v1", api_key="t", max_retries=0)
            async with oai_provider.wrap(chat, manager) as wrapped_chat:
                with pytest.raises(UnsupportedMessageError, match="it is empty"):
                    await wrapped_chat.chat.completions.create(model=MODEL, messages=[])
                with pytest.raises(UnsupportedMessageError, match="it is empty"):
                    await wrapped_chat.responses.create(model=MODEL, input=[])
                system = [{"role": "system", "content": "You are terse."}]
                await wrapped_chat.chat.completions.create(model=MODEL, messages=system)
    assert ant.requests == [] and len(oai.requests) == 1
