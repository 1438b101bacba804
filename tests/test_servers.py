"""The fake provider servers, exercised with the real `anthropic` and `openai` SDKs over sockets."""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import httpx2
import openai
import pytest

from agentctx.testing.servers import (
    FakeAnthropic,
    FakeOpenAI,
    FakeToolCall,
    RecordedRequest,
    Reply,
)

MODEL = "claude-test"
USER = [{"role": "user", "content": "List the files."}]
TOOLS = [
    {
        "name": "read",
        "description": "Read a file.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]
OA_TOOLS = [
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


def _server_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(("FakeAnthropic", "FakeOpenAI"))]


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """Every test leaves no server thread behind and no unclosed socket to warn about."""
    yield
    gc.collect(1)  # young garbage, cheap: surfaces ResourceWarnings inside the test
    assert _server_threads() == []


@pytest.fixture(autouse=True, scope="module")
def no_cyclic_leaks() -> Iterator[None]:
    yield
    gc.collect()  # a full pass costs ~0.1 s with the SDKs loaded: once per module


async def _other_tasks() -> set[asyncio.Task[Any]]:
    """Tasks still pending besides this one, after giving short-lived ones a moment: the SDKs
    leave async-generator finalisers behind when a stream ends early (``[DONE]``, an error)."""
    deadline = time.monotonic() + 1
    while True:
        others = asyncio.all_tasks() - {asyncio.current_task()}
        if not others or time.monotonic() > deadline:
            return others
        await asyncio.sleep(0.001)


@pytest.fixture
async def ant() -> AsyncIterator[FakeAnthropic]:
    # started in the fixture's setup task and stopped in its teardown task, as users will
    async with FakeAnthropic() as server:
        yield server
    assert server.errors == []


@pytest.fixture
async def aclient(ant: FakeAnthropic) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(base_url=ant.url, api_key="test", max_retries=0) as client:
        yield client
    assert await _other_tasks() == set()


@pytest.fixture
async def oai() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server
    assert server.errors == []


@pytest.fixture
async def oclient(oai: FakeOpenAI) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=oai.url + "/v1", api_key="test", max_retries=0
    ) as client:
        yield client
    assert await _other_tasks() == set()


async def _create(client: anthropic.AsyncAnthropic, messages: Any = USER, **kw: Any) -> Any:
    kw.setdefault("max_tokens", 256)
    return await client.messages.create(model=MODEL, messages=messages, **kw)


def _types(events: list[Any]) -> list[str]:
    return [e.type for e in events]


# ================================================================== Anthropic: replies


async def test_anthropic_text_reply_and_recording(
    ant: FakeAnthropic, aclient: anthropic.AsyncAnthropic
) -> None:
    ant.enqueue(Reply.text("Two files: a.py and b.py."))
    message = await _create(aclient, system="You are terse.")
    assert message.id == "msg_fake000001"
    assert message.model == MODEL
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == "Two files: a.py and b.py."
    assert message.stop_reason == "end_turn"
    (request,) = ant.requests
    assert isinstance(request, RecordedRequest)
    assert (request.method, request.path, request.status, request.stream) == (
        "POST",
        "/v1/messages",
        200,
        False,
    )
    assert request.json["messages"] == USER
    assert request.json["system"] == "You are terse."
    # anthropic 2.x sends the key as a bearer token; older SDKs as x-api-key
    assert request.headers.get("x-api-key", request.headers.get("authorization")) in (
        "test",
        "Bearer test",
    )
    assert "anthropic-version" in request.headers
    assert json.loads(request.body) == request.json
    assert ant.remaining == 0


async def test_anthropic_default_reply_when_queue_is_empty(
    ant: FakeAnthropic, aclient: anthropic.AsyncAnthropic
) -> None:
    assert (await _create(aclient)).content[0].text == "ok"
    ant.default = lambda body: Reply.text(f"echo: {body['messages'][-1]['content']}")
    assert (await _create(aclient)).content[0].text == "echo: List the files."


async def test_anthropic_stream_event_order(
    ant: FakeAnthropic, aclient: anthropic.AsyncAnthropic
) -> None:
    ant.enqueue(
        Reply.tool_call("read", {"path": "src/a.py"}, text="Reading it.", thinking="I need a.py")
    )
    stream = await _create(aclient, stream=True, tools=TOOLS)
    events = [event async for event in stream]
    assert _types(events) == [
        "message_start",
        "content_block_start",  # thinking
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",  # signature_delta
        "content_block_stop",
        "content_block_start",  # text
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",  # tool_use
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    deltas = [e.delta.type for e in events if e.type == "content_block_delta"]
    assert deltas[:4] == ["thinking_delta"] * 3 + ["signature_delta"]
    assert deltas[4:6] == ["text_delta"] * 2
    assert deltas[6:] == ["input_json_delta"] * 3
    assert events[-2].delta.stop_reason == "tool_use"
    assert events[0].message.usage.output_tokens == 1
    assert events[-2].usage.output_tokens > 1
    assert ant.requests[0].stream is True


async def test_anthropic_stream_helper_accumulates_blocks(
    ant: FakeAnthropic, aclient: anthropic.AsyncAnthropic
) -> None:
    ant.enqueue(
        Reply.tool_calls(
            [
                FakeToolCall("read", {"path": "a.py"}),
                FakeToolCall("read", {"path": "b.py"}, "toolu_b"),
            ],
            text="Reading both.",
            thinking="Two files to read.",
        )
    )
    async with aclient.messages.stream(
        model=MODEL, max_tokens=2048, messages=USER, tools=TOOLS
    ) as stream:
        text = "".join([piece async for piece in stream.text_stream])
        final = await stream.get_final_message()
    assert text == "Reading both."
    thinking, said, first, second = final.content
    assert thinking.type == "thinking"
    assert thinking.thinking == "Two files to read."
    assert thinking.signature == FakeAnthropic.signature_for("Two files to read.")
    assert said.text == "Reading both."
    assert (first.id, first.input) == ("toolu_fake000001", {"path": "a.py"})
    assert (second.id, second.input) == ("toolu_b", {"path": "b.py"})
    assert final.stop_reason == "tool_use"
    assert final.usage.cache_creation_input_tokens == ant.requests[0].usage.cache_write


async def test_anthropic_tool_loop_round_trip_with_thinking(
    ant: FakeAnthropic, aclient: anthropic.AsyncAnthropic
) -> None:
    """The server accepts its own signed thinking sent back in the in-flight tool loop."""
    ant.enqueue(
        Reply.tool_call("read", {"path": "a.py"}, thinking="Look at a.py"), Reply.text("Done.")
    )
    thinking = {"type": "enabled", "budget_tokens": 1024}
    first = await _create(aclient, tools=TOOLS, thinking=thinking, max_tokens=2048)
    call = first.content[-1]
    history = [
        *USER,
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "print(1)"}],
        },
    ]
    second = await _create(aclient, history, tools=TOOLS, thinking=thinking, max_tokens=2048)
    assert second.content[0].text == "Done."


@pytest.mark.parametrize(
    ("reply", "stop_reason", "content"),
    [
        (Reply.max_tokens("Cut"), "max_tokens", [("text", "Cut")]),
        (Reply.refusal(), "refusal", [("text", "I can't help with that.")]),
        (Reply.empty(), "end_turn", []),
        (Reply.text("Hi", stop_reason="pause_turn"), "pause_turn", [("text", "Hi")]),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_stop_reasons(
    ant: FakeAnthropic,
    aclient: anthropic.AsyncAnthropic,
    reply: Reply,
    stop_reason: str,
    content: list[tuple[str, str]],
    stream: bool,
) -> None:
    ant.enqueue(reply)
    if stream:
        async with aclient.messages.stream(model=MODEL, max_tokens=64, messages=USER) as s:
            message = await s.get_final_message()
    else:
        message = await _create(aclient)
    assert message.stop_reason == stop_reason
    assert [(b.type, b.text) for b in message.content] == content


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_scripted_usage(
    ant: FakeAnthropic, aclient: anthropic.AsyncAnthropic, stream: bool
) -> None:
    ant.enqueue(Reply.text("x", input_tokens=5, output_tokens=7, cache_read=1111, cache_write=418))
    if stream:
        async with aclient.messages.stream(model=MODEL, max_tokens=64, messages=USER) as s:
            usage = (await s.get_final_message()).usage
    else:
        usage = (await _create(aclient)).usage
    assert (usage.input_tokens, usage.output_tokens) == (5, 7)
    assert (usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (1111, 418)
    assert usage.cache_creation is not None
    assert usage.cache_creation.ephemeral_5m_input_tokens == 418


async def test_anthropic_slow_trickle(ant: FakeAnthropic) -> None:
    """Each event arrives within the read timeout although the whole stream takes longer."""
    ant.enqueue(Reply.slow("one two three", event_delay=0.05))
    async with anthropic.AsyncAnthropic(
        base_url=ant.url, api_key="t", max_retries=0, timeout=0.25
    ) as client:
        started = time.monotonic()
        stream = await _create(client, stream=True)
        arrivals = [time.monotonic() async for _ in stream]
    # 9 events (the SDK hides `ping`), 8 gaps of 50 ms
    assert len(arrivals) == 8
    assert arrivals[-1] - started >= 0.35
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    assert min(gaps) >= 0.04


async def test_anthropic_count_tokens(
    ant: FakeAnthropic, aclient: anthropic.AsyncAnthropic
) -> None:
    counted = await aclient.messages.count_tokens(model=MODEL, messages=USER)
    message = await _create(aclient)
    usage = message.usage
    total = usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
    assert counted.input_tokens == total
    assert ant.remaining == 0 and len(ant.requests) == 2


# ================================================================== Anthropic: faults


async def test_anthropic_rate_limit_shows_retry_after(
    ant: FakeAnthropic, aclient: anthropic.AsyncAnthropic
) -> None:
    ant.enqueue(Reply.rate_limited(retry_after=2))
    with pytest.raises(anthropic.RateLimitError) as info:
        await _create(aclient)
    assert info.value.status_code == 429
    assert info.value.response.headers["retry-after"] == "2"
    assert info.value.body["error"]["type"] == "rate_limit_error"
    assert ant.requests[0].status == 429


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("reply", "error", "status"),
    [
        (Reply.overloaded(), anthropic.OverloadedError, 529),
        (Reply.server_error(), anthropic.InternalServerError, 500),
        (Reply.server_error(503), anthropic.InternalServerError, 503),
        (Reply.error(400, message="prompt is too long"), anthropic.BadRequestError, 400),
    ],
)
async def test_anthropic_http_errors(
    ant: FakeAnthropic,
    aclient: anthropic.AsyncAnthropic,
    reply: Reply,
    error: type[anthropic.APIStatusError],
    status: int,
    stream: bool,
) -> None:
    ant.enqueue(reply)
    with pytest.raises(error) as info:
        await _create(aclient, stream=stream)
    assert info.value.status_code == status
    assert info.value.body["type"] == "error"
    # the connection stays usable, as with the real API
    assert (await _create(aclient)).content[0].text == "ok"


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_hang_times_out_and_server_sees_the_disconnect(
    ant: FakeAnthropic, stream: bool
) -> None:
    ant.enqueue(Reply.hang())
    async with anthropic.AsyncAnthropic(
        base_url=ant.url, api_key="test", max_retries=0, timeout=0.2
    ) as client:
        assert ant.in_progress == 0
        with pytest.raises(anthropic.APITimeoutError):
            await _create(client, stream=stream)
        assert ant.requests[0].status is None
        for _ in range(200):  # the server notices the client gave up
            if ant.in_progress == 0:
                break
            await asyncio.sleep(0.01)
        assert ant.in_progress == 0
        assert (await _create(client.with_options(timeout=10))).content[0].text == "ok"


async def test_anthropic_reset_is_a_connection_error(
    ant: FakeAnthropic, aclient: anthropic.AsyncAnthropic
) -> None:
    ant.enqueue(Reply.reset(), Reply.reset(after_events=2), Reply.disconnect(1))
    for _ in range(3):
        with pytest.raises(anthropic.APIConnectionError):
            await _create(aclient)
    assert [r.status for r in ant.requests] == [None, 200, 200]


@pytest.mark.parametrize("fault", [Reply.reset(after_events=3), Reply.disconnect(3)])
async def test_anthropic_connection_lost_mid_stream(
    ant: FakeAnthropic, aclient: anthropic.AsyncAnthropic, fault: Reply
) -> None:
    """The anthropic SDK does not wrap transport errors raised while iterating a stream."""
    ant.enqueue(fault)
    stream = await _create(aclient, stream=True)
    seen: list[str] = []
    with pytest.raises((anthropic.APIConnectionError, httpx2.TransportError)):
        async for event in stream:
            seen.append(event.type)
    assert seen == ["message_start", "content_block_start"]  # ping is swallowed by the SDK


async def test_anthropic_error_event_mid_stream(
    ant: FakeAnthropic, aclient: anthropic.AsyncAnthropic
) -> None:
    ant.enqueue(Reply.stream_error("overloaded_error", "Overloaded", after_events=4))
    stream = await _create(aclient, stream=True)
    seen: list[str] = []
    with pytest.raises(anthropic.APIStatusError) as info:
        async for event in stream:
            seen.append(event.type)
    assert seen == ["message_start", "content_block_start", "content_block_delta"]
    assert info.value.body["error"]["type"] == "overloaded_error"
    # not streamed, the same reply is the matching HTTP error
    ant.enqueue(Reply.stream_error("overloaded_error"))
    with pytest.raises(anthropic.OverloadedError):
        await _create(aclient)


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_malformed_json(
    ant: FakeAnthropic, aclient: anthropic.AsyncAnthropic, stream: bool
) -> None:
    ant.enqueue(Reply.malformed())
    with pytest.raises(json.JSONDecodeError):
        result = await _create(aclient, stream=stream)
        async for _ in result:
            pass


# ================================================================== Anthropic: validation


def _assistant_calls(*ids: str) -> dict[str, Any]:
    calls = [{"type": "tool_use", "id": i, "name": "read", "input": {}} for i in ids]
    return {"role": "assistant", "content": calls}


def _results(*ids: str, text: str | None = None) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = [
        {"type": "tool_result", "tool_use_id": i, "content": "ok"} for i in ids
    ]
    if text is not None:
        blocks.append({"type": "text", "text": text})
    return {"role": "user", "content": blocks}


INVALID_ANTHROPIC: list[tuple[str, list[dict[str, Any]], str]] = [
    (
        "orphan tool_result",
        [*USER, {"role": "assistant", "content": "Sure."}, _results("toolu_x")],
        "messages.2.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_x",
    ),
    (
        "tool_use without result",
        [*USER, _assistant_calls("toolu_1", "toolu_2"), _results("toolu_1")],
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: "
        "toolu_2",
    ),
    (
        "result not immediately after",
        [
            *USER,
            _assistant_calls("toolu_1"),
            {"role": "user", "content": "wait"},
            {"role": "assistant", "content": "ok"},
            _results("toolu_1"),
        ],
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after",
    ),
    (
        "text before tool_result",
        [
            *USER,
            _assistant_calls("toolu_1"),
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "here"},
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"},
                ],
            },
        ],
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after",
    ),
    (
        "duplicate tool_use id",
        [*USER, _assistant_calls("toolu_1"), _results("toolu_1"), _assistant_calls("toolu_1")],
        "messages.3.content.0: tool_use ids must be unique",
    ),
    (
        "duplicate tool_result",
        [*USER, _assistant_calls("toolu_1"), _results("toolu_1", "toolu_1")],
        "found multiple `tool_result` blocks with id: toolu_1",
    ),
    (
        "empty text block",
        [{"role": "user", "content": [{"type": "text", "text": ""}]}],
        "messages.0.content.0: text content blocks must be non-empty",
    ),
    (
        "whitespace text block",
        [{"role": "user", "content": [{"type": "text", "text": " \n"}]}],
        "text content blocks must contain non-whitespace text",
    ),
    (
        "empty content",
        [*USER, {"role": "assistant", "content": []}, {"role": "user", "content": "more"}],
        "messages.1: all messages must have non-empty content",
    ),
    (
        "first message from assistant",
        [{"role": "assistant", "content": "Hi"}, *USER],
        'messages: first message must use the "user" role',
    ),
    (
        "bad role",
        [{"role": "tool", "content": "x"}],
        "messages.0.role: Input should be 'user' or 'assistant'",
    ),
    (
        "tool_use in a user message",
        [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "r", "input": {}}]}],
        "messages.0.content.0: Input tag 'tool_use' found using 'type' does not match",
    ),
    (
        "bad tool_use id",
        [*USER, _assistant_calls("call 1"), _results("call 1")],
        "messages.1.content.0.tool_use.id: String should match pattern",
    ),
    (
        "forged thinking signature",
        [
            *USER,
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "edited", "signature": "sig-edited"},
                    {"type": "text", "text": "Hi"},
                ],
            },
            {"role": "user", "content": "go on"},
        ],
        "messages.1.content.0: Invalid `signature` in `thinking` block",
    ),
    (
        "trailing whitespace in final assistant message",
        [*USER, {"role": "assistant", "content": "Prefill "}],
        "final assistant content cannot end with trailing whitespace",
    ),
]


@pytest.mark.parametrize(
    ("messages", "expected"),
    [pytest.param(m, e, id=name) for name, m, e in INVALID_ANTHROPIC],
)
async def test_anthropic_rejects_invalid_transcripts(
    ant: FakeAnthropic,
    aclient: anthropic.AsyncAnthropic,
    messages: list[dict[str, Any]],
    expected: str,
) -> None:
    ant.enqueue(Reply.text("never sent"))
    with pytest.raises(anthropic.BadRequestError) as info:
        await _create(aclient, messages, tools=TOOLS)
    body = info.value.body
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert expected in body["error"]["message"]
    assert ant.remaining == 1  # an invalid request does not consume the script
    assert ant.requests[0].status == 400
    assert ant.requests[0].error is not None and expected in ant.requests[0].error


async def test_anthropic_request_level_rules(
    ant: FakeAnthropic, aclient: anthropic.AsyncAnthropic
) -> None:
    history = [*USER, _assistant_calls("toolu_1"), _results("toolu_1")]
    with pytest.raises(anthropic.BadRequestError, match="must define tools"):
        await _create(aclient, history)
    unsigned_loop = [
        *USER,
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Reading."},
                {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {}},
            ],
        },
        _results("toolu_1"),
    ]
    thinking = {"type": "enabled", "budget_tokens": 1024}
    with pytest.raises(anthropic.BadRequestError, match=r"messages\.1\.content\.0\.type: Expected"):
        await _create(aclient, unsigned_loop, tools=TOOLS, thinking=thinking, max_tokens=2048)
    with pytest.raises(anthropic.BadRequestError, match="greater than `thinking.budget_tokens`"):
        await _create(aclient, thinking=thinking, max_tokens=1024)
    marked = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": f"part {i}", "cache_control": {"type": "ephemeral"}}
                for i in range(5)
            ],
        }
    ]
    with pytest.raises(anthropic.BadRequestError, match="A maximum of 4 blocks with cache_control"):
        await _create(aclient, marked)


async def test_anthropic_accepts_merged_turns_and_prefill(
    ant: FakeAnthropic, aclient: anthropic.AsyncAnthropic
) -> None:
    """Consecutive same-role messages are one turn, as on the real API."""
    messages = [
        *USER,
        _assistant_calls("toolu_1"),
        _results("toolu_1"),
        {"role": "user", "content": "Also check b.py."},
        {"role": "assistant", "content": "Checking"},
    ]
    assert (await _create(aclient, messages, tools=TOOLS)).content[0].text == "ok"


async def test_anthropic_signature_check_can_be_disabled(aclient: anthropic.AsyncAnthropic) -> None:
    messages = [
        *USER,
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "from a real session", "signature": "EqQBCk..."},
                {"type": "text", "text": "Hi"},
            ],
        },
        {"role": "user", "content": "go on"},
    ]
    async with (
        FakeAnthropic(check_signatures=False) as lenient,
        anthropic.AsyncAnthropic(base_url=lenient.url, api_key="t", max_retries=0) as client,
    ):
        assert (await _create(client, messages)).content[0].text == "ok"


async def test_anthropic_context_window() -> None:
    async with (
        FakeAnthropic(context_window=50) as small,
        anthropic.AsyncAnthropic(base_url=small.url, api_key="t", max_retries=0) as client,
    ):
        await _create(client)
        with pytest.raises(anthropic.BadRequestError, match=r"prompt is too long: \d+ tokens > 50"):
            await _create(client, [{"role": "user", "content": "x" * 400}])


# ================================================================== Anthropic: caching


async def test_anthropic_prefix_cache_grows_and_breaks(
    ant: FakeAnthropic, aclient: anthropic.AsyncAnthropic
) -> None:
    system = "You are a coding agent. " * 20
    first = (await _create(aclient, system=system)).usage
    assert first.cache_read_input_tokens == 0
    assert first.input_tokens == 0
    size_1 = first.cache_creation_input_tokens
    assert size_1 > 100

    turn_2 = [*USER, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "next"}]
    second = (await _create(aclient, turn_2, system=system)).usage
    assert second.cache_read_input_tokens == size_1
    assert second.cache_creation_input_tokens > 0

    # a cache_control marker and string-vs-block content do not change what is cached
    turn_2b = [
        {"role": "user", "content": [{"type": "text", "text": "List the files."}]},
        {"role": "assistant", "content": "ok"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "next", "cache_control": {"type": "ephemeral"}}],
        },
    ]
    third = (await _create(aclient, turn_2b, system=system)).usage
    assert third.cache_read_input_tokens == size_1 + second.cache_creation_input_tokens
    assert third.cache_creation_input_tokens == 0

    # an edit in the first message re-bills everything after the system prompt
    edited = [{"role": "user", "content": "List the files!"}, *turn_2[1:]]
    fourth = (await _create(aclient, edited, system=system)).usage
    assert 0 < fourth.cache_read_input_tokens < size_1  # only model + system + tools survive
    # a new system prompt breaks the whole cache
    fifth = (await _create(aclient, system="Different.")).usage
    assert fifth.cache_read_input_tokens == 0

    # the recorded bytes show what was sent: the first message never changed until turn 4
    bodies = [r.json["messages"] for r in ant.requests]
    assert bodies[1][:1] == bodies[0] and bodies[2][0] != bodies[0][0]


async def test_anthropic_cache_clear_ttl_and_off() -> None:
    async with (
        FakeAnthropic(cache_ttl=0.1) as server,
        anthropic.AsyncAnthropic(base_url=server.url, api_key="t", max_retries=0) as client,
    ):
        await _create(client)
        assert (await _create(client)).usage.cache_read_input_tokens > 0
        server.clear_cache()
        assert (await _create(client)).usage.cache_read_input_tokens == 0
        await asyncio.sleep(0.15)
        assert (await _create(client)).usage.cache_read_input_tokens == 0
    async with (
        FakeAnthropic(caching=False) as server,
        anthropic.AsyncAnthropic(base_url=server.url, api_key="t", max_retries=0) as client,
    ):
        await _create(client)
        usage = (await _create(client)).usage
        assert usage.cache_read_input_tokens == usage.cache_creation_input_tokens == 0
        assert usage.input_tokens > 0


# ================================================================== OpenAI Chat Completions


async def test_chat_text_reply(oai: FakeOpenAI, oclient: openai.AsyncOpenAI) -> None:
    oai.enqueue(Reply.text("Two files."))
    completion = await oclient.chat.completions.create(model="gpt-test", messages=USER)
    choice = completion.choices[0]
    assert (choice.message.content, choice.finish_reason) == ("Two files.", "stop")
    assert completion.id == "chatcmpl-fake000001"
    assert completion.usage is not None
    assert completion.usage.prompt_tokens > 0
    assert oai.requests[0].headers["authorization"] == "Bearer test"
    assert oai.requests[0].path == "/v1/chat/completions"


@pytest.mark.parametrize(
    ("reply", "finish", "content", "refusal"),
    [
        (Reply.max_tokens("Cut"), "length", "Cut", None),
        (Reply.refusal("No."), "stop", None, "No."),
        (Reply.empty(), "stop", "", None),
    ],
)
async def test_chat_stop_reasons(
    oai: FakeOpenAI,
    oclient: openai.AsyncOpenAI,
    reply: Reply,
    finish: str,
    content: str | None,
    refusal: str | None,
) -> None:
    oai.enqueue(reply)
    completion = await oclient.chat.completions.create(model="m", messages=USER)
    message = completion.choices[0].message
    assert (completion.choices[0].finish_reason, message.content, message.refusal) == (
        finish,
        content,
        refusal,
    )


async def test_chat_stream_with_tool_calls_and_usage(
    oai: FakeOpenAI, oclient: openai.AsyncOpenAI
) -> None:
    oai.enqueue(
        Reply.tool_calls(
            [FakeToolCall("read", {"path": "a.py"}), FakeToolCall("read", {"path": "b.py"})],
            text="Reading.",
        )
    )
    stream = await oclient.chat.completions.create(
        model="m",
        messages=USER,
        tools=OA_TOOLS,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            entry = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            entry["id"] += delta.id or ""
            assert delta.function is not None
            entry["name"] += delta.function.name or ""
            entry["arguments"] += delta.function.arguments or ""
    assert text == "Reading."
    assert [json.loads(c["arguments"]) for c in calls.values()] == [
        {"path": "a.py"},
        {"path": "b.py"},
    ]
    assert [c["id"] for c in calls.values()] == ["call_fake000001", "call_fake000002"]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "tool_calls" and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert all(c.usage is None for c in chunks[:-1])


async def test_chat_stream_without_usage_chunk(
    oai: FakeOpenAI, oclient: openai.AsyncOpenAI
) -> None:
    stream = await oclient.chat.completions.create(model="m", messages=USER, stream=True)
    chunks = [chunk async for chunk in stream]
    assert all(c.choices for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"


async def test_chat_tool_loop_and_cached_tokens(
    oai: FakeOpenAI, oclient: openai.AsyncOpenAI
) -> None:
    oai.enqueue(Reply.tool_call("read", {"path": "a.py"}), Reply.text("Done."))
    messages: list[Any] = [{"role": "system", "content": "Be terse. " * 30}, *USER]
    first = await oclient.chat.completions.create(model="m", messages=messages, tools=OA_TOOLS)
    call = first.choices[0].message.tool_calls[0]
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "print(1)"},
    ]
    second = await oclient.chat.completions.create(model="m", messages=messages, tools=OA_TOOLS)
    assert second.choices[0].message.content == "Done."
    assert first.usage is not None and second.usage is not None
    assert first.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens == first.usage.prompt_tokens
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


INVALID_CHAT: list[tuple[str, list[dict[str, Any]], str, str | None]] = [
    (
        "tool call without answer",
        [
            *USER,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "read", "arguments": "{}"},
                    }
                ],
            },
            {"role": "user", "content": "and?"},
        ],
        "The following tool_call_ids did not have response messages: call_1",
        "messages.[1].role",
    ),
    (
        "orphan tool message",
        [*USER, {"role": "tool", "tool_call_id": "call_9", "content": "x"}],
        "messages with role 'tool' must be a response to a preceeding message with 'tool_calls'",
        "messages.[1].role",
    ),
    (
        "unknown tool_call_id",
        [
            *USER,
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "read", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_2", "content": "x"},
        ],
        "'tool_call_id' of 'call_2' not found in 'tool_calls' of previous message",
        "messages.[2].tool_call_id",
    ),
    (
        "arguments as an object",
        [
            *USER,
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "read", "arguments": {}},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "x"},
        ],
        "expected a string, but got an object instead",
        "messages[1].tool_calls[0].function.arguments",
    ),
    (
        "assistant with null content",
        [*USER, {"role": "assistant", "content": None}],
        "Invalid value for 'content': expected a string, got null.",
        "messages.[1].content",
    ),
]


@pytest.mark.parametrize(
    ("messages", "expected", "param"),
    [pytest.param(m, e, p, id=name) for name, m, e, p in INVALID_CHAT],
)
async def test_chat_rejects_invalid_transcripts(
    oai: FakeOpenAI,
    oclient: openai.AsyncOpenAI,
    messages: list[dict[str, Any]],
    expected: str,
    param: str | None,
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await oclient.chat.completions.create(model="m", messages=messages)
    body: Any = info.value.body
    assert expected in body["message"]
    assert body["type"] == "invalid_request_error"
    assert body["param"] == param
    assert info.value.param == param


# ================================================================== OpenAI Responses


async def test_responses_text_and_reasoning(oai: FakeOpenAI, oclient: openai.AsyncOpenAI) -> None:
    oai.enqueue(Reply.text("Hello.", thinking="Greet back."))
    response = await oclient.responses.create(
        model="m", input="Hi", include=["reasoning.encrypted_content"], store=False
    )
    assert response.output_text == "Hello."
    assert [item.type for item in response.output] == ["reasoning", "message"]
    reasoning: Any = response.output[0]
    assert reasoning.summary[0].text == "Greet back."
    assert reasoning.encrypted_content.startswith("fake:")
    assert response.usage is not None and response.usage.output_tokens_details.reasoning_tokens > 0
    assert response.status == "completed"


async def test_responses_max_tokens_is_incomplete(
    oai: FakeOpenAI, oclient: openai.AsyncOpenAI
) -> None:
    oai.enqueue(Reply.max_tokens("Cut"), Reply.refusal("No."))
    response = await oclient.responses.create(model="m", input="Hi")
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    refused = await oclient.responses.create(model="m", input="Hi")
    part: Any = refused.output[0].content[0]
    assert (part.type, part.refusal) == ("refusal", "No.")


async def test_responses_stream_events(oai: FakeOpenAI, oclient: openai.AsyncOpenAI) -> None:
    oai.enqueue(Reply.tool_call("read", {"path": "a.py"}, text="Reading."))
    stream = await oclient.responses.create(model="m", input="Hi", tools=RESP_TOOLS, stream=True)
    events = [event async for event in stream]
    assert _types(events) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done: Any = events[-1]
    call = done.response.output[1]
    assert (call.type, call.call_id, json.loads(call.arguments)) == (
        "function_call",
        "call_fake000001",
        {"path": "a.py"},
    )


async def test_responses_stream_helper(oai: FakeOpenAI, oclient: openai.AsyncOpenAI) -> None:
    oai.enqueue(Reply.text("All good.", thinking="Fine."))
    async with oclient.responses.stream(model="m", input="Hi") as stream:
        deltas = [e.delta async for e in stream if e.type == "response.output_text.delta"]
        final = await stream.get_final_response()
    assert "".join(deltas) == final.output_text == "All good."


async def test_responses_function_call_round_trip_and_previous_response(
    oai: FakeOpenAI, oclient: openai.AsyncOpenAI
) -> None:
    oai.enqueue(
        Reply.tool_call("read", {"path": "a.py"}, thinking="Need a.py"), Reply.text("Done.")
    )
    first = await oclient.responses.create(
        model="m",
        input="Hi",
        tools=RESP_TOOLS,
        include=["reasoning.encrypted_content"],
    )
    call: Any = first.output[-1]
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "print(1)"}
    # stateless: the whole history again, reasoning item included
    stateless = [{"role": "user", "content": "Hi"}, *[i.model_dump() for i in first.output], output]
    second = await oclient.responses.create(model="m", input=stateless, tools=RESP_TOOLS)
    assert second.output_text == "Done."
    assert second.usage is not None and second.usage.input_tokens_details.cached_tokens > 0
    # stateful: only the new item after previous_response_id
    third = await oclient.responses.create(
        model="m",
        previous_response_id=first.id,
        input=[output],
        tools=RESP_TOOLS,
    )
    assert third.output_text == "ok"


async def test_responses_validation(oai: FakeOpenAI, oclient: openai.AsyncOpenAI) -> None:
    orphan = [
        {"role": "user", "content": "Hi"},
        {"type": "function_call_output", "call_id": "call_404", "output": "x"},
    ]
    with pytest.raises(openai.BadRequestError) as info:
        await oclient.responses.create(model="m", input=orphan)
    assert "No tool call found for function call output with call_id call_404" in str(info.value)
    unanswered = [
        {"role": "user", "content": "Hi"},
        {"type": "function_call", "call_id": "call_1", "name": "read", "arguments": "{}"},
        {"role": "user", "content": "and?"},
    ]
    with pytest.raises(
        openai.BadRequestError, match="No tool output found for function call call_1"
    ):
        await oclient.responses.create(model="m", input=unanswered)
    with pytest.raises(openai.BadRequestError, match="Previous response with id 'resp_x'"):
        await oclient.responses.create(model="m", input="Hi", previous_response_id="resp_x")
    tampered = [
        {"role": "user", "content": "Hi"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "fake:AAAA.bad"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "more"},
    ]
    with pytest.raises(openai.BadRequestError, match="could not be verified"):
        await oclient.responses.create(model="m", input=tampered)
    assert [r.status for r in oai.requests] == [400, 400, 400, 400]


async def test_openai_context_window() -> None:
    async with (
        FakeOpenAI(context_window=50) as small,
        openai.AsyncOpenAI(base_url=small.url + "/v1", api_key="t", max_retries=0) as client,
    ):
        await client.chat.completions.create(model="m", messages=USER)
        long = [{"role": "user", "content": "x" * 400}]
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(model="m", messages=long)
        assert info.value.code == "context_length_exceeded"
        assert "maximum context length is 50 tokens" in info.value.message
        with pytest.raises(openai.BadRequestError, match="exceeds the context window"):
            await client.responses.create(model="m", input="x" * 400)


# ================================================================== OpenAI: faults


@pytest.mark.parametrize("path", ["chat", "responses"])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("reply", "error", "status"),
    [
        (Reply.rate_limited(1.5), openai.RateLimitError, 429),
        (Reply.overloaded(), openai.InternalServerError, 503),
        (Reply.server_error(), openai.InternalServerError, 500),
    ],
)
async def test_openai_http_errors(
    oai: FakeOpenAI,
    oclient: openai.AsyncOpenAI,
    path: str,
    stream: bool,
    reply: Reply,
    error: type[openai.APIStatusError],
    status: int,
) -> None:
    oai.enqueue(reply)
    with pytest.raises(error) as info:
        if path == "chat":
            await oclient.chat.completions.create(model="m", messages=USER, stream=stream)
        else:
            await oclient.responses.create(model="m", input="Hi", stream=stream)
    assert info.value.status_code == status
    body: Any = info.value.body
    assert set(body) >= {"message", "type", "param", "code"}
    if status == 429:
        assert info.value.response.headers["retry-after"] == "1.5"
        assert body["code"] == "rate_limit_exceeded"


@pytest.mark.parametrize("path", ["chat", "responses"])
@pytest.mark.parametrize("stream", [False, True])
async def test_openai_hang_and_reset(oai: FakeOpenAI, path: str, stream: bool) -> None:
    # Only the hang needs a short timeout: a fault call that timed out under load would leave
    # its reply to be served to whichever request the server reads next.
    async with openai.AsyncOpenAI(
        base_url=oai.url + "/v1", api_key="t", max_retries=0, timeout=10
    ) as patient:

        async def call(http_timeout: float | None = None) -> None:
            client = patient if http_timeout is None else patient.with_options(timeout=http_timeout)
            if path == "chat":
                result: Any = await client.chat.completions.create(
                    model="m",
                    messages=USER,
                    stream=stream,
                )
            else:
                result = await client.responses.create(model="m", input="Hi", stream=stream)
            if stream:
                async for _ in result:
                    pass

        oai.enqueue(Reply.hang())
        with pytest.raises(openai.APITimeoutError):
            await call(http_timeout=0.2)
        for fault in (Reply.reset(), Reply.reset(after_events=2), Reply.disconnect(2)):
            oai.enqueue(fault)
            with pytest.raises(openai.APIConnectionError) as caught:
                await call()
            assert not isinstance(caught.value, openai.APITimeoutError)
        await call()  # the server is still fine
    assert [r.status for r in oai.requests] == [None, None, 200, 200, 200]


async def test_openai_stream_errors(oai: FakeOpenAI, oclient: openai.AsyncOpenAI) -> None:
    oai.enqueue(Reply.stream_error("server_error", "Boom", after_events=2))
    stream = await oclient.chat.completions.create(model="m", messages=USER, stream=True)
    with pytest.raises(openai.APIError, match="Boom"):
        async for _ in stream:
            pass
    oai.enqueue(Reply.stream_error("server_error", "Boom", after_events=2))
    events = await oclient.responses.create(model="m", input="Hi", stream=True)
    seen: Any = [event async for event in events]
    assert _types(seen) == ["response.created", "response.in_progress", "error"]
    assert (seen[-1].code, seen[-1].message) == ("server_error", "Boom")
    oai.enqueue(Reply.malformed())
    with pytest.raises(json.JSONDecodeError):
        await oclient.chat.completions.create(model="m", messages=USER)


# ================================================================== plumbing


async def test_keep_alive_reuses_one_connection(
    ant: FakeAnthropic, aclient: anthropic.AsyncAnthropic
) -> None:
    ant.enqueue(Reply.rate_limited(), Reply.text("x"))
    with pytest.raises(anthropic.RateLimitError):
        await _create(aclient)
    for _ in range(5):
        await _create(aclient)
        stream = await _create(aclient, stream=True)
        async for _event in stream:
            pass
    assert len(ant.requests) == 11
    assert ant.connections == 1


async def test_raw_http_errors(ant: FakeAnthropic, oai: FakeOpenAI) -> None:
    async with httpx2.AsyncClient() as http:
        missing = await http.post(ant.url + "/v1/nope", json={})
        assert missing.status_code == 404
        assert missing.json()["error"]["type"] == "not_found_error"
        unauthenticated = await http.post(ant.url + "/v1/messages", json={})
        assert unauthenticated.status_code == 401
        headers = {"x-api-key": "t", "anthropic-version": "2023-06-01"}
        garbage = await http.post(ant.url + "/v1/messages", content=b"{", headers=headers)
        assert garbage.status_code == 400
        no_max = await http.post(
            ant.url + "/v1/messages", json={"model": "m", "messages": USER}, headers=headers
        )
        assert no_max.json()["error"]["message"] == "max_tokens: Field required"
        get = await http.get(
            oai.url + "/v1/chat/completions", headers={"authorization": "Bearer t"}
        )
        assert get.status_code == 405
        no_key = await http.post(oai.url + "/v1/responses", json={"model": "m", "input": "hi"})
        assert no_key.status_code == 401
        assert no_key.json()["error"]["code"] == "invalid_api_key"
    assert [r.status for r in oai.requests] == [405, 401]


async def test_large_body_and_concurrent_requests(
    ant: FakeAnthropic, aclient: anthropic.AsyncAnthropic
) -> None:
    big = [
        *USER,
        _assistant_calls("toolu_1"),
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "x" * 10_000_000}
            ],
        },
    ]
    usage = (await _create(aclient, big, tools=TOOLS)).usage
    assert usage.cache_creation_input_tokens > 2_500_000
    questions = [[{"role": "user", "content": f"question {i}"}] for i in range(20)]
    replies = await asyncio.gather(*(_create(aclient, q) for q in questions))
    assert len({r.id for r in replies}) == 20
    assert sorted(r.json["messages"][0]["content"] for r in ant.requests[1:]) == sorted(
        q[0]["content"] for q in questions
    )


@pytest.mark.parametrize(
    ("alias", "anthropic_reason", "chat_reason"),
    [
        ("length", "max_tokens", "length"),
        ("tool_calls", "tool_use", "tool_calls"),
        ("stop", "end_turn", "stop"),
        ("content_filter", "content_filter", "content_filter"),
    ],
)
async def test_stop_reason_vocabulary(
    ant: FakeAnthropic,
    aclient: anthropic.AsyncAnthropic,
    oai: FakeOpenAI,
    oclient: openai.AsyncOpenAI,
    alias: str,
    anthropic_reason: str,
    chat_reason: str,
) -> None:
    ant.enqueue(Reply.text("x", stop_reason=alias))
    oai.enqueue(Reply.text("x", stop_reason=alias))
    assert (await _create(aclient)).stop_reason == anthropic_reason
    completion = await oclient.chat.completions.create(model="m", messages=USER)
    assert completion.choices[0].finish_reason == chat_reason


def test_sync_clients_and_plain_with() -> None:
    with FakeAnthropic([Reply.text("sync")]) as ant, FakeOpenAI([Reply.text("sync")]) as oai:
        with anthropic.Anthropic(base_url=ant.url, api_key="t", max_retries=0) as client:
            reply = client.messages.create(model=MODEL, max_tokens=10, messages=USER)
            assert reply.content[0].text == "sync"
        with openai.OpenAI(base_url=oai.url + "/v1", api_key="t", max_retries=0) as oclient:
            chat = oclient.chat.completions.create(model="m", messages=USER)
            assert chat.choices[0].message.content == "sync"


async def test_close_during_a_hang_releases_everything() -> None:
    server = FakeAnthropic([Reply.hang()]).start()
    async with anthropic.AsyncAnthropic(
        base_url=server.url, api_key="t", max_retries=0, timeout=5
    ) as client:
        pending = asyncio.create_task(_create(client))
        for _ in range(1000):  # until the server holds the request
            if server.requests:
                break
            await asyncio.sleep(0.005)
        started = time.monotonic()
        server.close()
        assert time.monotonic() - started < 1
        with pytest.raises(anthropic.APIConnectionError):
            await pending
    assert _server_threads() == []
    server.close()  # idempotent


@pytest.mark.parametrize("stream", [False, True])
async def test_a_lone_surrogate_in_a_reply_goes_out_as_its_json_escape(
    stream: bool,
    ant: FakeAnthropic,
    aclient: anthropic.AsyncAnthropic,
    oai: FakeOpenAI,
    oclient: openai.AsyncOpenAI,
) -> None:
    """Found by a hostile run (AI, finding 3): a scripted reply holding a lone surrogate (a
    reply decoded from JSON can hold one) made the servers answer 500 "fake server bug"; the
    APIs send it as ``\\ud800`` in JSON, and the SDKs read it back as the surrogate."""
    text = "a \ud800 b"
    ant.enqueue(Reply.text(text))
    oai.enqueue(Reply.text(text), Reply.text(text))
    if stream:
        async with aclient.messages.stream(model=MODEL, messages=USER, max_tokens=64) as s:
            got = [(await s.get_final_message()).content[0].text]
        chunks = await oclient.chat.completions.create(model="m", messages=USER, stream=True)
        got.append("".join([c.choices[0].delta.content or "" async for c in chunks if c.choices]))
    else:
        got = [(await _create(aclient)).content[0].text]
        completion = await oclient.chat.completions.create(model="m", messages=USER)
        got.append(completion.choices[0].message.content)
    got.append((await oclient.responses.create(model="m", input="Hi")).output_text)
    assert got == [text] * 3


@pytest.mark.parametrize("stream", [False, True])
async def test_a_lone_surrogate_in_thinking_is_signed_and_sent(
    stream: bool, ant: FakeAnthropic, aclient: anthropic.AsyncAnthropic
) -> None:
    """Found by a hostile run (AJ, finding 5): the thinking signature and the prefix cache
    encoded their text strictly, and a lone surrogate in thinking was still a 500 "fake
    server bug"."""
    ant.enqueue(Reply.text("answer", thinking="think \ud800"))
    kw: Any = {"max_tokens": 2_000, "thinking": {"type": "enabled", "budget_tokens": 1_024}}
    if stream:
        async with aclient.messages.stream(model=MODEL, messages=USER, **kw) as s:
            message = await s.get_final_message()
    else:
        message = await _create(aclient, **kw)
    thinking = message.content[0]
    assert thinking.type == "thinking" and thinking.thinking == "think \ud800"
    assert thinking.signature  # (the SDK cannot send it back: it encodes JSON strictly)
