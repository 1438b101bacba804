"""Hostile use of the wrapped SDK clients, through the real SDKs against the fake servers: a
tool result with blank blocks, a history given as a generator, arguments nested past what
Python parses, a stream that ends in an error event, a blocking client used after close or
from its own loop thread. Each test is the reproduction of a finding."""

from __future__ import annotations

import functools
import json
from typing import Any

import anthropic
import anyio
import openai
import pydantic
import pytest

from agentctx import (
    Budget,
    ConfigError,
    ContextManager,
    Event,
    MemoryRecallStore,
    TranscriptRepaired,
    UnsupportedMessageError,
)
from agentctx.adapters import assemble_anthropic_stream
from agentctx.providers import anthropic as ant_provider
from agentctx.providers import openai as oai_provider
from agentctx.providers.middleware import as_middleware
from agentctx.strategy import CompactionContext
from agentctx.testing.servers import FakeAnthropic, FakeOpenAI, Reply

TOOLS = [{"name": "read", "description": "r", "input_schema": {"type": "object"}}]
CHAT_TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]
RESP_TOOLS = [{"type": "function", "name": "read", "parameters": {"type": "object"}}]
DEEP = "[" * 2000 + "]" * 2000  # arguments a misbehaving model wrote: JSON, too deep to parse


def with_result(content: Any) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "the task"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "read", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": content}],
        },
    ]


async def test_blank_text_blocks_in_a_tool_result_are_sent_as_anthropic_takes_them() -> None:
    """An empty text block in a tool result's list was sent as it was; Anthropic answers 400
    ("text content blocks must be non-empty", or "... non-whitespace text")."""
    events: list[Event] = []
    with FakeAnthropic(default=Reply.text("ok")) as server:
        async with ContextManager(Budget(context_window=100_000)) as ctx:
            ctx.subscribe(events.append)
            raw = anthropic.AsyncAnthropic(base_url=server.url, api_key="k", max_retries=0)
            async with ant_provider.wrap(raw, ctx) as client:
                for content in (
                    [{"type": "text", "text": ""}],  # a tool's empty output, as a list
                    [{"type": "text", "text": "out"}, {"type": "text", "text": "   "}],
                    [{"type": "text", "text": ""}, {"type": "text", "text": " \n"}],
                ):
                    await client.messages.create(
                        model="m", max_tokens=64, tools=TOOLS, messages=with_result(content)
                    )
    assert [r.status for r in server.requests] == [200, 200, 200], server.requests[-1].error
    sent = [r.json["messages"][-1]["content"][0] for r in server.requests]
    assert sent[0]["content"] == ""
    assert sent[1]["content"] in ("out", [{"type": "text", "text": "out"}])
    assert not sent[2].get("content")
    repaired = [e for e in events if isinstance(e, TranscriptRepaired)]
    assert any("empty_text" in r for e in repaired for r in e.repairs)


@pytest.mark.parametrize("provider", ["anthropic", "openai-chat"])
async def test_the_middleware_compacts_a_history_given_as_a_generator(provider: str) -> None:
    """Both SDKs take any iterable of messages; `wrap` made a list of it first, the
    middleware sent a generator on uncompacted, the whole history, in silence."""
    big = "\n".join(f"line {i} " + "x" * 80 for i in range(3000))
    if provider == "anthropic":
        history = [*with_result(big), {"role": "assistant", "content": "ok"}]
        history.append({"role": "user", "content": "next"})
        server: Any = FakeAnthropic(default=Reply.text("ok"))
    else:
        history = [
            {"role": "user", "content": "the task"},
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "read", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": big},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "next"},
        ]
        server = FakeOpenAI(default=Reply.text("ok"))
    sizes = []
    with server:
        budget = Budget(context_window=20_000, reserve_output=1_000)
        async with ContextManager(budget, recall=MemoryRecallStore()) as ctx:
            middleware = as_middleware(ctx, provider)  # type: ignore[arg-type]
            a_client = anthropic.AsyncAnthropic(base_url=server.url, api_key="k")
            o_client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="k")
            tools = TOOLS if provider == "anthropic" else CHAT_TOOLS

            async def call_next(request: dict[str, Any]) -> Any:
                if provider == "anthropic":
                    return await a_client.messages.create(**request)
                return await o_client.chat.completions.create(**request)

            async with a_client, o_client:
                for messages in (list(history), (m for m in history)):
                    request = {"model": "m", "max_tokens": 100, "messages": messages}
                    await middleware({**request, "tools": tools}, call_next)
                    sizes.append(len(server.requests[-1].body))
    assert [r.status for r in server.requests] == [200, 200]
    assert sizes[0] == sizes[1] < len(json.dumps(history)) / 4


async def test_arguments_nested_past_what_python_parses_are_sent_as_written() -> None:
    """A model's arguments 2,000 levels deep: every later wrapped OpenAI call raised a bare
    `RecursionError`; the raw SDK sends them and the server takes them."""
    chat = [
        {"role": "user", "content": "the task"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "read", "arguments": DEEP}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "error: arguments must be an object"},
    ]
    responses = [
        {"role": "user", "content": "the task"},
        {"type": "function_call", "call_id": "c1", "name": "read", "arguments": DEEP},
        {"type": "function_call_output", "call_id": "c1", "output": "error: not an object"},
    ]
    with FakeOpenAI(default=Reply.text("ok")) as server:
        async with ContextManager(Budget(context_window=100_000)) as ctx:
            raw = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
            async with oai_provider.wrap(raw, ctx) as client:
                await client.chat.completions.create(model="m", messages=chat, tools=CHAT_TOOLS)
                stream = await client.chat.completions.create(
                    model="m", messages=chat, tools=CHAT_TOOLS, stream=True
                )
                async for _ in stream:
                    pass
        async with ContextManager(Budget(context_window=100_000)) as ctx:
            raw = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
            async with oai_provider.wrap(raw, ctx) as client:
                await client.responses.create(model="m", input=responses, tools=RESP_TOOLS)
    assert [r.status for r in server.requests] == [200, 200, 200]
    sent = [server.requests[0].json["messages"][1], server.requests[2].json["input"][1]]
    assert sent[0]["tool_calls"][0]["function"]["arguments"] == DEEP
    assert sent[1]["arguments"] == DEEP


def test_a_streamed_tool_input_nested_past_what_python_parses_ends_the_stream_as_usual() -> None:
    """The wrapped stream raised `RecursionError` after its last event, inside the caller's
    loop, where the raw SDK's ended as usual: the input is kept as the block started it."""
    deep = '{"a": ' + DEEP + "}"
    events = [
        {"type": "message_start", "message": {"id": "m1", "type": "message", "role": "assistant",
                                              "content": [], "usage": {"input_tokens": 9}}},
        {"type": "content_block_start", "index": 0,
         "content_block": {"type": "tool_use", "id": "t1", "name": "read", "input": {}}},
        *(
            {"type": "content_block_delta", "index": 0,
             "delta": {"type": "input_json_delta", "partial_json": deep[k : k + 500]}}
            for k in range(0, len(deep), 500)
        ),
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"},
         "usage": {"output_tokens": 900}},
        {"type": "message_stop"},
    ]  # fmt: skip
    message = assemble_anthropic_stream(events)
    assert message["content"][0]["input"] == {}
    assert message["usage"]["output_tokens"] == 900


@pytest.mark.parametrize("helper", [False, True], ids=["create", "stream"])
async def test_a_responses_stream_ending_in_an_error_event_is_handed_over_as_the_sdk_does(
    helper: bool,
) -> None:
    """The raw SDK hands a Responses stream's ``error`` event over as its last event (its
    ``stream()`` helper raises its own error); wrapped, the stream raised
    `UnsupportedMessageError` after it, from recording the usage of a response that failed."""
    script = [Reply.stream_error(after_events=2)] * 2

    async def read(client: Any) -> list[str] | Exception:
        try:
            if helper:
                async with client.responses.stream(model="m", input="the task") as stream:
                    return [e.type async for e in stream]
            stream = await client.responses.create(model="m", input="the task", stream=True)
            return [e.type async for e in stream]
        except Exception as e:  # what the SDK raises, compared below
            return e

    with FakeOpenAI(script, default=Reply.text("ok")) as server:
        raw = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
        async with raw, ContextManager(Budget(context_window=100_000)) as ctx:
            expected = await read(raw)
            got = await read(oai_provider.wrap(raw, ctx))
            after = await ctx.prepare([])  # the session goes on
    if isinstance(expected, Exception):
        assert type(got) is type(expected) and str(got) == str(expected)
    else:
        assert got == expected and expected[-1] == "error"
    assert after == []


def test_a_blocking_client_used_after_close_or_on_its_own_loop_thread_is_a_config_error() -> None:
    """Both raised anyio's bare `RuntimeError` ("This portal is not running", "This method
    cannot be called from the event loop thread") where `BlockingContextManager`, on the same
    loop thread, raises `ConfigError`."""
    history = [{"role": "user", "content": "the task"}]
    outcomes: list[BaseException] = []
    with FakeAnthropic(default=Reply.text("ok")) as server:
        raw = anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0)
        client = ant_provider.wrap(raw, ContextManager(50_000))

        def on_event(event: Event) -> None:
            try:
                client.messages.create(model="m", max_tokens=10, messages=history)
            except ConfigError as e:
                outcomes.append(e)

        client.manager.subscribe(on_event)
        # A history that opens with an assistant message gets a repair: an event.
        opening = [{"role": "assistant", "content": "hello"}, *history]
        client.messages.create(model="m", max_tokens=10, messages=opening)
        client.close()
        with pytest.raises(ConfigError, match="closed"):
            client.messages.create(model="m", max_tokens=10, messages=history)
    assert len(outcomes) == 1 and "loop thread" in str(outcomes[0])
    assert len(server.requests) == 1


def _write(cid: str, arguments: str) -> dict[str, Any]:
    call = {"id": cid, "type": "function", "function": {"name": "write", "arguments": arguments}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


@pytest.mark.parametrize("route", ["rewritten", "named in a marker"])
async def test_arguments_holding_half_a_surrogate_pair_are_sent_once_compacted(route: str) -> None:
    """Found by a hostile run (M, finding 1): a model's JSON arguments may escape half a
    surrogate pair (ASCII text, which the raw SDK sends). Once a decision rewrote them
    (truncated arguments) or a marker named them (a dropped turn), agentctx wrote the lone
    surrogate itself, and the wrapped call raised a bare `UnicodeEncodeError`."""
    if route == "rewritten":
        args = json.dumps({"path": "a.py", "content": "x = 1\n" * 3000, "note": "half \ud83d"})
        history = [{"role": "user", "content": "Write files."}, _write("c1", args)]
        history += [{"role": "tool", "tool_call_id": "c1", "content": "ok"}]
        history += [{"role": "assistant", "content": "done"}, {"role": "user", "content": "go on"}]
        budget = Budget(context_window=8_000, reserve_output=200, target_ratio=0.7)
    else:
        args = json.dumps({"path": "a\ud83d.py"})
        history = [{"role": "user", "content": "Write files."}, _write("c1", args)]
        history += [{"role": "tool", "tool_call_id": "c1", "content": "line\n" * 3000}]
        for i in range(2, 6):
            history += [
                _write(f"c{i}", "{}"),
                {"role": "tool", "tool_call_id": f"c{i}", "content": "ok\n" * 10},
            ]
        history += [{"role": "user", "content": "go on"}]
        budget = Budget(context_window=3_000, reserve_output=200)
    assert args.isascii() and "\\ud83d" in args
    with FakeOpenAI(default=Reply.text("ok")) as server:
        async with ContextManager(budget) as ctx:
            raw = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
            async with oai_provider.wrap(raw, ctx) as client:
                await client.chat.completions.create(model="m", messages=history, max_tokens=100)
            assert len(ctx.ledger)  # compacted
    assert [r.status for r in server.requests] == [200]
    sent = json.dumps(server.requests[0].json, ensure_ascii=False)
    # Escaped in the JSON of rewritten arguments; replaced in a marker's text.
    assert "\\\\ud83d" in sent if route == "rewritten" else "write(path=a\ufffd.py)" in sent


def test_openai_cache_writes_are_read_wherever_usage_is() -> None:
    """Found by a hostile run (V, finding 2): the openai SDK reports cache writes inside the
    prompt (``prompt_tokens_details`` / ``input_tokens_details.cache_write_tokens``); `observe`,
    the adapters, the summarizers and the openai-agents hooks each read usage their own way,
    and all but the hooks took them for uncached input, so the cost came out short."""
    from agents.usage import Usage as AgentsUsage
    from openai.types.completion_usage import CompletionUsage, PromptTokensDetails
    from openai.types.responses.response_usage import (
        InputTokensDetails,
        OutputTokensDetails,
        ResponseUsage,
    )

    from agentctx import Usage
    from agentctx.adapters import (
        message_from_openai_chat_response,
        message_from_openai_response,
    )
    from agentctx.integrations.openai_agents import _observe

    chat = CompletionUsage(
        prompt_tokens=10_000,
        completion_tokens=100,
        total_tokens=10_100,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=2_000, cache_write_tokens=7_000),
    )
    details = InputTokensDetails(cached_tokens=2_000, cache_write_tokens=7_000)
    responses = ResponseUsage(
        input_tokens=10_000,
        output_tokens=100,
        total_tokens=10_100,
        input_tokens_details=details,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
    )
    expected = Usage(1_000, 100, 2_000, 7_000)
    for usage in (chat, responses):
        ctx = ContextManager(200_000)
        ctx.observe(usage)
        assert ctx.usage == expected
    reply = {"role": "assistant", "content": "x"}
    choice = {"index": 0, "message": reply, "finish_reason": "stop"}
    chat_reply = {"choices": [choice], "usage": chat.model_dump()}
    assert message_from_openai_chat_response(chat_reply).usage == expected
    output = [{"type": "message", "role": "assistant", "content": []}]
    response = {"status": "completed", "output": output, "usage": responses.model_dump()}
    assert message_from_openai_response(response).usage == expected
    ctx = ContextManager(200_000)
    hooked = AgentsUsage(1, 10_000, details, 100, OutputTokensDetails(reasoning_tokens=0), 10_100)
    _observe(ctx, type("Response", (), {"usage": hooked})())  # type: ignore[arg-type]
    assert ctx.usage == expected


def test_cache_counts_past_the_prompt_are_not_taken() -> None:
    """Found by a hostile run (U, finding 3): a server that said 50 tokens were read from the
    cache of a 5-token prompt was billed for 50."""
    from agentctx import Usage
    from agentctx._usage import usage_of

    chat = {
        "prompt_tokens": 5,
        "completion_tokens": 1,
        "prompt_tokens_details": {"cached_tokens": 50},
    }
    assert usage_of(chat) == Usage(0, 1, 5, 0)
    details = {"cached_tokens": 3, "cache_write_tokens": 9}
    responses = {"input_tokens": 5, "output_tokens": 1, "input_tokens_details": details}
    assert usage_of(responses) == Usage(0, 1, 3, 2)


def test_token_counts_written_as_json_floats_are_read() -> None:
    """Found by a hostile run (X, finding 5): ``usage_of`` took ints only, so a usage whose
    counts a JSON encoder wrote as floats (``1200.0``) was dropped whole by the adapters."""
    from agentctx import Usage
    from agentctx._usage import usage_of

    chat = {"prompt_tokens": 1200.0, "completion_tokens": 5.0}
    assert usage_of(chat) == Usage(1200, 5, 0, 0)
    details = {"cached_tokens": 20.0}
    responses = {"input_tokens": 100.0, "output_tokens": 5, "input_tokens_details": details}
    assert usage_of(responses) == Usage(80, 5, 20, 0)
    anthropic_odd = {"input_tokens": float("inf"), "output_tokens": float("nan")}
    assert usage_of(anthropic_odd) == Usage(0, 0, 0, 0)


async def test_text_before_a_calls_results_goes_after_them_and_the_results_are_sent() -> None:
    """Found by a hostile run (BG 1): a user turn of text (a hook's note) then the results
    of the calls before it was read as a user message and two results answering no call:
    both were left out as orphans and stubbed "interrupted", the model told its tools never
    ran. The API refuses text before the results; they go first, the text after."""
    calls = {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": "t1", "name": "read", "input": {"path": "a.py"}},
            {"type": "tool_use", "id": "t2", "name": "read", "input": {"path": "b.py"}},
        ],
    }
    note = {"type": "text", "text": "Here are the results."}
    one = {"type": "tool_result", "tool_use_id": "t1", "content": "A-CONTENT"}
    two = {"type": "tool_result", "tool_use_id": "t2", "content": "B-CONTENT"}
    events: list[Event] = []
    with FakeAnthropic(default=Reply.text("ok")) as server:
        async with ContextManager(Budget(context_window=100_000)) as ctx:
            ctx.subscribe(events.append)
            raw = anthropic.AsyncAnthropic(base_url=server.url, api_key="k", max_retries=0)
            async with ant_provider.wrap(raw, ctx) as client:
                for blocks in ([note, one, two], [one, note, two]):
                    messages = [
                        {"role": "user", "content": "TASK: read a.py and b.py"},
                        calls,
                        {"role": "user", "content": blocks},
                    ]
                    await client.messages.create(
                        model="m", max_tokens=64, tools=TOOLS, messages=messages
                    )
    assert [r.status for r in server.requests] == [200, 200], server.requests[-1].error
    for request in server.requests:
        assert request.json["messages"][-1]["content"] == [one, two, note]
    assert not [e for e in events if isinstance(e, TranscriptRepaired)]


async def test_reasoning_whose_call_the_caller_took_back_is_not_sent() -> None:
    """Found by a hostile run (BG 2): a caller rewound its last tool step (the call and
    its output) and steered; the reasoning item before the call was sent with nothing the
    model made after it, and the API refused every request from then on ("provided without
    its required following item")."""
    reply = Reply.tool_call("read", {"path": "a.py"}, thinking="I should read a.py")
    with FakeOpenAI([reply], default=Reply.text("ok")) as server:
        async with ContextManager(Budget(context_window=100_000)) as ctx:
            raw = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
            async with oai_provider.wrap(raw, ctx) as client:
                items: list[Any] = [{"role": "user", "content": "TASK: inspect the repo"}]
                response = await client.responses.create(
                    model="m", input=items, tools=RESP_TOOLS, store=False
                )
                items += [o.to_dict() for o in response.output]
                assert [i["type"] for i in items[1:]] == ["reasoning", "function_call"]
                steer = {"role": "user", "content": "Don't read files; list them instead."}
                for rewound in ([*items[:-1], steer], items[:-1]):
                    await client.responses.create(
                        model="m", input=rewound, tools=RESP_TOOLS, store=False
                    )
                # Reasoning the model followed with its call is still sent.
                items.append(
                    {"type": "function_call_output", "call_id": items[-1]["call_id"], "output": "x"}
                )
                await client.responses.create(model="m", input=items, tools=RESP_TOOLS, store=False)
    assert [r.status for r in server.requests] == [200] * 4, server.requests[-1].error
    sent = [[i.get("type", "message") for i in r.json["input"]] for r in server.requests[1:]]
    assert sent == [
        ["message", "message"],
        ["message"],
        ["message", "reasoning", "function_call", "function_call_output"],
    ]


class Read(pydantic.BaseModel):
    path: str


async def test_responses_parse_output_goes_back_as_the_sdk_sends_it() -> None:
    """Found by a hostile run (CT 1): ``items += resp.output`` after ``responses.parse`` sent
    the SDK's ``parsed_arguments`` of a function call and ``parsed`` of an output text back
    (dumped without the SDK's ``__api_exclude__``), which the API rejects ("Unknown parameter:
    'input[1].parsed_arguments'", openai-python issue #2720). Now the items go as the SDK
    itself sends them."""
    replies = [Reply.tool_call("Read", {"path": "a.py"}), Reply.text('{"path": "b.py"}')]
    with FakeOpenAI(replies, default=Reply.text("done")) as server:
        async with ContextManager(Budget(context_window=100_000)) as ctx:
            raw = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
            tools = [openai.pydantic_function_tool(Read)]
            items: list[Any] = [{"role": "user", "content": "read a.py"}]
            async with oai_provider.wrap(raw, ctx) as client:
                resp = await client.responses.parse(model="m", input=items, tools=tools)
                items += resp.output
                call = resp.output[0]
                assert call.type == "function_call"
                output = {"type": "function_call_output", "call_id": call.call_id, "output": "1"}
                items.append(output)
                resp = await client.responses.parse(model="m", input=items, text_format=Read)
                assert resp.output_parsed == Read(path="b.py")
                items += [*resp.output, {"role": "user", "content": "thanks"}]
                await client.responses.parse(model="m", input=items, tools=tools)
        sent = server.requests[-1]
        assert sent.status == 200
        assert "parsed_arguments" not in sent.json["input"][1]
        assert "parsed" not in sent.json["input"][3]["content"][0]


async def test_sdk_objects_nested_in_a_message_dict_are_sent_as_the_sdk_sends_them() -> None:
    """Found by a hostile run (CT 4): SDK objects were converted only as a message or a block of
    its ``content``, so ``{"role": "assistant", "content": msg.content, "tool_calls":
    msg.tool_calls}`` (Chat tool call objects in a dict) and a ``tool_result`` holding SDK
    ``TextBlock`` objects were refused with UnsupportedMessageError, where the unwrapped SDK
    sends them. Now SDK objects are converted wherever they sit, as the SDK sends them."""
    with FakeOpenAI([Reply.tool_call("read", {"path": "a"})], default=Reply.text("ok")) as server:
        async with ContextManager(Budget(context_window=100_000)) as ctx:
            raw = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
            history: list[Any] = [{"role": "user", "content": "read a"}]
            async with oai_provider.wrap(raw, ctx) as client:
                resp = await client.chat.completions.create(
                    model="m", messages=history, tools=CHAT_TOOLS
                )
                msg = resp.choices[0].message
                assert msg.tool_calls
                history += [
                    {"role": "assistant", "content": msg.content, "tool_calls": msg.tool_calls},
                    {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "1"},
                ]
                await raw.chat.completions.create(model="m", messages=history, tools=CHAT_TOOLS)
                await client.chat.completions.create(model="m", messages=history, tools=CHAT_TOOLS)
        unwrapped, wrapped = server.requests[-2:]
        assert wrapped.status == 200
        assert (
            wrapped.json["messages"][1]["tool_calls"] == unwrapped.json["messages"][1]["tool_calls"]
        )
    with FakeAnthropic(
        [Reply.tool_call("read", {"path": "a"})], default=Reply.text("ok")
    ) as server:
        async with ContextManager(Budget(context_window=100_000)) as ctx:
            araw = anthropic.AsyncAnthropic(base_url=server.url, api_key="k", max_retries=0)
            history = [{"role": "user", "content": "read a"}]
            async with ant_provider.wrap(araw, ctx) as aclient:
                message = await aclient.messages.create(
                    model="m", max_tokens=100, messages=history, tools=TOOLS
                )
                call = message.content[-1]
                assert call.type == "tool_use"
                blocks = [anthropic.types.TextBlock(type="text", text="1")]
                result = {"type": "tool_result", "tool_use_id": call.id, "content": blocks}
                history += [
                    {"role": "assistant", "content": message.content},
                    {"role": "user", "content": [result]},
                ]
                await araw.messages.create(model="m", max_tokens=100, messages=history, tools=TOOLS)
                await aclient.messages.create(
                    model="m", max_tokens=100, messages=history, tools=TOOLS
                )
        unwrapped, wrapped = server.requests[-2:]
        assert wrapped.status == 200
        assert wrapped.json["messages"][2] == unwrapped.json["messages"][2]


async def test_an_unsupported_item_is_named_by_its_index_in_the_callers_history() -> None:
    """Found by a hostile run (CT 5): the Chat and Responses wrappers split off the leading
    system / developer messages and converted the rest from index 0, so
    UnsupportedMessageError.index was short by the number of them. Now it names the index in
    the caller's own list."""
    instructions = [{"role": "system", "content": "a"}, {"role": "developer", "content": "b"}]
    history = [
        *instructions,
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": 5},  # index 4
    ]
    with FakeOpenAI(default=Reply.text("ok")) as server:
        async with ContextManager(Budget(context_window=100_000)) as ctx:
            raw = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
            async with oai_provider.wrap(raw, ctx) as client:
                with pytest.raises(UnsupportedMessageError) as chat:
                    await client.chat.completions.create(model="m", messages=history)
                with pytest.raises(UnsupportedMessageError) as responses:
                    await client.responses.create(model="m", input=history)
    assert (chat.value.index, responses.value.index) == (4, 4)
    assert str(chat.value).startswith("message 4: ")


@pytest.mark.parametrize("messages", [None, 5, {"role": "user", "content": "hi"}, "hi"])
async def test_messages_that_are_no_history_are_an_unsupported_message_error(
    messages: Any,
) -> None:
    """Found by a hostile run (CT 6): ``messages=None`` or ``5`` gave a bare TypeError from
    ``list(messages)``, and a single dict was read as its keys ("message 0: unsupported message
    of type str"). Now each is UnsupportedMessageError (still a TypeError) saying what
    ``messages`` must be, and nothing is sent."""
    with FakeAnthropic() as ant_server, FakeOpenAI() as oai_server:
        async with ContextManager(Budget(context_window=100_000)) as ctx:
            araw = anthropic.AsyncAnthropic(base_url=ant_server.url, api_key="k", max_retries=0)
            oraw = openai.AsyncOpenAI(base_url=oai_server.url + "/v1", api_key="k", max_retries=0)
            async with (
                ant_provider.wrap(araw, ctx) as aclient,
                oai_provider.wrap(oraw, ctx) as oclient,
            ):
                calls = [
                    aclient.messages.create(model="m", max_tokens=10, messages=messages),
                    oclient.chat.completions.create(model="m", messages=messages),
                ]
                for call in calls:
                    with pytest.raises(UnsupportedMessageError, match="messages must be a list"):
                        await call
        assert not ant_server.requests
        assert not oai_server.requests


async def test_a_history_item_inside_itself_is_refused_at_once_as_the_sdk_refuses_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by a re-run (CU 4) of the fix above: the walk that converts SDK objects wherever
    they sit kept no record of what it had walked, so a block holding itself twice (in its
    ``citations``) cost two to the power of the walk's depth (64) on the event loop: the
    wrapped call never returned, where the unwrapped SDK raises at once. Each part is now
    walked once. (The walk is cut to 20 levels here, so that the old walk, 2**20 steps,
    fails this test instead of hanging it.)"""
    from agentctx.providers import _history

    monkeypatch.setattr(_history, "_MAX_DEPTH", 20)
    walked: list[object] = []
    walk = _history._plain_mapping

    def counted(value: Any, depth: int, *rest: Any) -> Any:
        walked.append(value)
        return walk(value, depth, *rest)

    monkeypatch.setattr(_history, "_plain_mapping", counted)
    block: dict[str, Any] = {"type": "text", "text": "hi"}
    block["citations"] = [block, block]
    history = [{"role": "user", "content": [block]}]
    with FakeAnthropic([], default=Reply.text("ok")) as server:
        raw = anthropic.AsyncAnthropic(base_url=server.url, api_key="k", max_retries=0)
        with pytest.raises(ValueError, match="Circular reference") as unwrapped:
            await raw.messages.create(model="m", max_tokens=10, messages=history)  # type: ignore[arg-type]
        async with (
            ContextManager(Budget(context_window=100_000)) as ctx,
            ant_provider.wrap(raw, ctx) as client,
        ):
            with pytest.raises(ValueError) as wrapped:
                await client.messages.create(model="m", max_tokens=10, messages=history)  # type: ignore[arg-type]
    assert str(wrapped.value) == str(unwrapped.value)
    assert len(walked) < 10  # the message and the block, once each a conversion


def _repairs(events: list[Event]) -> list[str]:
    return [r for e in events if isinstance(e, TranscriptRepaired) for r in e.repairs]


async def test_anthropic_repairs_are_named_by_their_index_in_the_callers_messages() -> None:
    """Found by a hostile run (CT 5): a TranscriptRepaired event of a wrapped call named the
    manager's message indexes, and a user message holding several tool results is one
    message per result there, so every index after it was past the caller's."""
    messages = [
        {"role": "user", "content": "the task"},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "a", "name": "read", "input": {}},
                {"type": "tool_use", "id": "b", "name": "read", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "a", "content": "A"},
                {"type": "tool_result", "tool_use_id": "b", "content": "B"},
            ],
        },
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "c", "name": "read", "input": {}}],
        },
        {"role": "user", "content": "go on"},  # 4: call c (3) has no result
        {"role": "assistant", "content": "ok"},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "ghost", "content": "?"},  # 6
                {"type": "text", "text": "next"},
            ],
        },
    ]
    events: list[Event] = []
    with FakeAnthropic(default=Reply.text("ok")) as server:
        async with ContextManager(Budget(context_window=100_000)) as ctx:
            ctx.subscribe(events.append)
            raw = anthropic.AsyncAnthropic(base_url=server.url, api_key="k", max_retries=0)
            async with ant_provider.wrap(raw, ctx) as client:
                await client.messages.create(
                    model="m", max_tokens=64, system="be brief", tools=TOOLS, messages=messages
                )
    assert [r.status for r in server.requests] == [200], server.requests[-1].error
    assert _repairs(events) == ["missing_result@3:c", "orphan_result@6:ghost"]


_CALL = {"type": "function", "function": {"name": "read", "arguments": "{}"}}
CHAT_REPAIRED = [
    {"role": "system", "content": "be brief"},
    {"role": "developer", "content": "use the tools"},
    {"role": "user", "content": "the task"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", **_CALL}]},
    {"role": "tool", "tool_call_id": "c1", "content": "out"},
    {"role": "tool", "tool_call_id": "ghost", "content": "?"},  # 5
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c2", **_CALL}]},  # 6
    {"role": "user", "content": "next"},
]
CHAT_REPAIRS = ["orphan_result@5:ghost", "missing_result@6:c2"]


async def test_chat_repairs_are_named_by_their_index_in_the_callers_messages() -> None:
    """CT 5: the Chat wrapper splits off the leading system / developer messages, and a
    TranscriptRepaired event of its call named indexes short by the number of them."""
    events: list[Event] = []
    with FakeOpenAI(default=Reply.text("ok")) as server:
        async with ContextManager(Budget(context_window=100_000)) as ctx:
            ctx.subscribe(events.append)
            raw = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
            async with oai_provider.wrap(raw, ctx) as client:
                await client.chat.completions.create(
                    model="m", tools=CHAT_TOOLS, messages=CHAT_REPAIRED
                )
    assert [r.status for r in server.requests] == [200], server.requests[-1].error
    assert _repairs(events) == CHAT_REPAIRS


def test_a_blocking_clients_repairs_are_named_by_the_callers_indexes() -> None:
    """CT 5, through a blocking client: its calls prepare on the wrapper's loop thread."""
    events: list[Event] = []
    manager = ContextManager(Budget(context_window=100_000))
    manager.subscribe(events.append)
    with FakeOpenAI(default=Reply.text("ok")) as server:
        raw = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
        with oai_provider.wrap(raw, manager) as client:
            client.chat.completions.create(model="m", tools=CHAT_TOOLS, messages=CHAT_REPAIRED)
    assert [r.status for r in server.requests] == [200], server.requests[-1].error
    assert _repairs(events) == CHAT_REPAIRS


async def test_responses_repairs_are_named_by_their_index_in_the_callers_input() -> None:
    """CT 5: the Responses wrapper splits off the leading instructions and makes one message
    of an assistant turn's items (its text, its function calls), so a TranscriptRepaired
    event of its call named indexes far short of the caller's. A repair of a merged
    message names its first item; the call id names the call within it."""
    turn = [
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "reading"}],
        },
        {"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "read", "arguments": "{}"},
    ]
    items = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": "the task"},
        *turn,  # 2, 3, 4: one message, whose call c2 has no output
        {"type": "function_call_output", "call_id": "c1", "output": "out"},
        {"type": "function_call_output", "call_id": "ghost", "output": "?"},  # 6
        {"role": "user", "content": "next"},
        {"type": "function_call", "call_id": "c3", "name": "read", "arguments": "{}"},  # 8
        {"role": "user", "content": "and then"},
    ]
    events: list[Event] = []
    with FakeOpenAI(default=Reply.text("ok")) as server:
        async with ContextManager(Budget(context_window=100_000)) as ctx:
            ctx.subscribe(events.append)
            raw = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
            async with oai_provider.wrap(raw, ctx) as client:
                await client.responses.create(model="m", tools=RESP_TOOLS, input=items)
    assert [r.status for r in server.requests] == [200], server.requests[-1].error
    assert _repairs(events) == [
        "orphan_result@6:ghost",
        "missing_result@2:c2",
        "missing_result@8:c3",
    ]


class _Gate:
    """A strategy whose first compact waits until ``opened`` is set: a call of the session
    that awaits while another starts."""

    def __init__(self) -> None:
        self.waiting = anyio.Event()
        self.opened = anyio.Event()

    async def compact(self, ctx: CompactionContext) -> None:
        if not self.opened.is_set():
            self.waiting.set()
            await self.opened.wait()


async def test_repairs_of_a_call_overlapped_by_another_name_its_own_items() -> None:
    """CT 5: the indexes of a call's repairs are read once its strategy has run; a call of
    the same client that started meanwhile, with another history, must not change them."""
    calls = [{"type": "tool_use", "id": i, "name": "read", "input": {}} for i in "ab"]
    results = [{"type": "tool_result", "tool_use_id": i, "content": i} for i in "ab"]
    first = [
        {"role": "user", "content": "the task"},
        {"role": "assistant", "content": calls},
        {"role": "user", "content": results},  # 2: two messages to the manager
        {"role": "assistant", "content": [{**calls[0], "id": "c"}]},
        {"role": "user", "content": "go on"},  # call c (3) has no result
    ]
    other = [{"role": r, "content": str(n)} for n, r in enumerate(["user", "assistant"] * 3)]
    gate, events = _Gate(), list[Event]()
    with FakeAnthropic(default=Reply.text("ok")) as server:
        async with ContextManager(Budget(context_window=100_000), strategy=gate) as ctx:
            ctx.subscribe(events.append)
            raw = anthropic.AsyncAnthropic(base_url=server.url, api_key="k", max_retries=0)
            async with ant_provider.wrap(raw, ctx) as client, anyio.create_task_group() as tg:
                for messages in (first, other):
                    tg.start_soon(
                        functools.partial(
                            client.messages.create,
                            model="m",
                            max_tokens=64,
                            tools=TOOLS,
                            messages=messages,
                        )
                    )
                    await gate.waiting.wait()
                await anyio.wait_all_tasks_blocked()  # the second converted, waits its turn
                gate.opened.set()
    assert [r.status for r in server.requests] == [200, 200], server.requests[-1].error
    assert _repairs(events) == ["missing_result@3:c"]


async def test_a_renamed_call_id_keeps_its_new_id_named_by_the_callers_index() -> None:
    """CT 5: a repair that renames a call id says the new id after the index; only the
    index is the caller's."""
    turn = [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", **_CALL}]},
        {"role": "tool", "tool_call_id": "c1", "content": "out"},
    ]
    messages = [{"role": "system", "content": "be brief"}, CHAT_REPAIRED[2], *turn, *turn]
    events: list[Event] = []
    with FakeOpenAI(default=Reply.text("ok")) as server:
        async with ContextManager(Budget(context_window=100_000)) as ctx:
            ctx.subscribe(events.append)
            raw = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
            async with oai_provider.wrap(raw, ctx) as client:
                await client.chat.completions.create(model="m", tools=CHAT_TOOLS, messages=messages)
    assert [r.status for r in server.requests] == [200], server.requests[-1].error
    assert _repairs(events) == ["duplicate_call_id@4:c1->c1-2"]
