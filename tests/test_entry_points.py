"""Every SDK entry point that carries the history, through `wrap` on the real SDKs against the
fake servers, blocking and async: the request the server receives is the compacted view (and
valid), or the call is refused with `ConfigError`; usage is recorded (chat streams ask for it);
the tool runner compacts before every turn; ``observe()`` takes what the SDKs return; the
output reserve follows the request's ``max_tokens``."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import anthropic
import openai
import pydantic
import pytest
from anthropic import beta_async_tool, beta_tool

from agentctx import Budget, ConfigError, ContextManager, Usage
from agentctx.providers import anthropic as ant_provider
from agentctx.providers import openai as oai_provider
from agentctx.providers.anthropic_summarizer import AnthropicSummarizer
from agentctx.providers.middleware import as_middleware
from agentctx.testing.servers import FakeAnthropic, FakeOpenAI, RecordedRequest, Reply

MODEL = "claude-test"
TURNS = 12  # tool results of about 1,000 tokens each: well over the budget below
BUDGET = Budget(context_window=9_000, reserve_output=1_000)
ANSWER = '{"answer": "four"}'
TOOLS = [{"name": "read", "description": "Read a file.", "input_schema": {"type": "object"}}]
PATH_SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}},
    "required": ["path"],
    "additionalProperties": False,
}
# strict, as chat.completions.parse wants its tools
CHAT_TOOLS = [
    {"type": "function", "function": {"name": "read", "parameters": PATH_SCHEMA, "strict": True}}
]
RESP_TOOLS = [{"type": "function", "name": "read", "parameters": {"type": "object"}}]


class Answer(pydantic.BaseModel):
    answer: str


def body(i: int, lines: int = 60) -> str:
    return "\n".join(
        f"def f{i}_{n}(x):  # helper {n} of a{i}\n    return x + {n}" for n in range(lines)
    )


def anthropic_history(turns: int = TURNS) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [{"role": "user", "content": "Read a0.py to a11.py."}]
    for i in range(turns):
        call = {"type": "tool_use", "id": f"toolu_{i}", "name": "read", "input": {"path": f"a{i}"}}
        result = {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": body(i)}
        history += [{"role": "assistant", "content": [call]}, {"role": "user", "content": [result]}]
    return history


def chat_history(turns: int = TURNS) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You read files."},
        {"role": "user", "content": "Read a0.py to a11.py."},
    ]
    for i in range(turns):
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "read"}}
        call["function"]["arguments"] = json.dumps({"path": f"a{i}"})
        history.append({"role": "assistant", "content": None, "tool_calls": [call]})
        history.append({"role": "tool", "tool_call_id": f"call_{i}", "content": body(i)})
    return history


def responses_items(turns: int = TURNS) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [
        {"role": "developer", "content": "You read files."},
        {"role": "user", "content": "Read a0.py to a11.py."},
    ]
    for i in range(turns):
        arguments = json.dumps({"path": f"a{i}"})
        items.append(
            {"type": "function_call", "call_id": f"c{i}", "name": "read", "arguments": arguments}
        )
        items.append({"type": "function_call_output", "call_id": f"c{i}", "output": body(i)})
    return items


def size(value: object) -> int:
    return len(json.dumps(value))


def assert_compacted(
    request: RecordedRequest, key: str, full: list[dict[str, Any]], keep: int
) -> None:
    """The server accepted a view smaller than the full history that starts as it does."""
    assert request.status == 200, request.error
    sent = request.json[key]
    assert size(sent) < size(full) and len(sent) <= len(full)
    assert sent[:keep] == full[:keep]  # the task (and the system prompt) untouched


# ============================================================== Anthropic: covered, x2


ANTHROPIC_KINDS = ["create", "create_stream", "stream", "parse", "count_tokens"]
ANTHROPIC_CASES = [(r, k) for r in ("messages", "beta.messages") for k in ANTHROPIC_KINDS]


def _resource(client: Any, path: str) -> Any:
    return client.messages if path == "messages" else client.beta.messages


async def _call_async(resource: Any, kind: str, kw: dict[str, Any]) -> Any:
    if kind == "create":
        return await resource.create(**kw)
    if kind == "create_stream":
        stream = await resource.create(**kw, stream=True)
        return [event async for event in stream]
    if kind == "stream":
        async with resource.stream(**kw) as stream:
            return await stream.get_final_message()
    if kind == "parse":
        return await resource.parse(**kw, output_format=Answer)
    return await resource.count_tokens(model=MODEL, messages=kw["messages"], tools=TOOLS)


def _call_sync(resource: Any, kind: str, kw: dict[str, Any]) -> Any:
    if kind == "create":
        return resource.create(**kw)
    if kind == "create_stream":
        return list(resource.create(**kw, stream=True))
    if kind == "stream":
        with resource.stream(**kw) as stream:
            return stream.get_final_message()
    if kind == "parse":
        return resource.parse(**kw, output_format=Answer)
    return resource.count_tokens(model=MODEL, messages=kw["messages"], tools=TOOLS)


def _check_anthropic(
    srv: FakeAnthropic, ctx: ContextManager, kind: str, result: Any, full_count: int
) -> None:
    full = anthropic_history()
    request = srv.requests[-1]
    assert_compacted(request, "messages", full, keep=1)
    assert request.json["tools"] == TOOLS
    if kind == "count_tokens":
        # what the next call would send, not the full history; no usage to record
        assert request.path == "/v1/messages/count_tokens"
        assert 0 < result.input_tokens < full_count
        assert ctx.usage == Usage()
        return
    assert ctx.usage.output_tokens == request.usage.output_tokens > 0
    if kind == "parse":
        assert result.parsed_output == Answer(answer="four")


@pytest.mark.parametrize(("path", "kind"), ANTHROPIC_CASES)
async def test_anthropic_async_entry_point_is_compacted(path: str, kind: str) -> None:
    async with FakeAnthropic(default=Reply.text(ANSWER)) as srv:
        raw = anthropic.AsyncAnthropic(base_url=srv.url, api_key="test", max_retries=0)
        async with raw, ContextManager(BUDGET) as ctx:
            full_count = (
                await raw.messages.count_tokens(model=MODEL, messages=anthropic_history())
            ).input_tokens
            client = ant_provider.wrap(raw, ctx)
            kw = {
                "model": MODEL,
                "max_tokens": 256,
                "tools": TOOLS,
                "messages": anthropic_history(),
            }
            result = await _call_async(_resource(client, path), kind, kw)
            _check_anthropic(srv, ctx, kind, result, full_count)


@pytest.mark.parametrize(("path", "kind"), ANTHROPIC_CASES)
def test_anthropic_sync_entry_point_is_compacted(path: str, kind: str) -> None:
    with FakeAnthropic(default=Reply.text(ANSWER)) as srv:
        raw = anthropic.Anthropic(base_url=srv.url, api_key="test", max_retries=0)
        full_count = raw.messages.count_tokens(
            model=MODEL, messages=anthropic_history()
        ).input_tokens
        ctx = ContextManager(BUDGET)
        with ant_provider.wrap(raw, ctx) as client:
            kw = {
                "model": MODEL,
                "max_tokens": 256,
                "tools": TOOLS,
                "messages": anthropic_history(),
            }
            result = _call_sync(_resource(client, path), kind, kw)
            _check_anthropic(srv, ctx, kind, result, full_count)


# ------------------------------------------------------------------ the tool runner


def read_body(path: str) -> str:
    return body(int(path[1:]), lines=80)


@beta_tool
def read_file(path: str) -> str:
    """Read a source file.

    Args:
        path: the file to read.
    """
    return read_body(path)


@beta_async_tool(name="read_file")
async def read_file_async(path: str) -> str:
    """Read a source file.

    Args:
        path: the file to read.
    """
    return read_body(path)


RUNNER_CALLS = 4
RUNNER_BUDGET = Budget(context_window=2_000, reserve_output=500)  # about one result fits


def runner_script() -> list[Reply]:
    calls = [Reply.tool_call("read_file", {"path": f"a{i}"}) for i in range(RUNNER_CALLS)]
    return [*calls, Reply.text("Four helper modules.")]


def spy_prepare(ctx: ContextManager) -> list[int]:
    """The length of every history the session was asked to prepare, in order."""
    seen: list[int] = []
    prepare = ctx.prepare

    async def spy(history: Any, **kwargs: Any) -> Any:
        seen.append(len(history))
        return await prepare(history, **kwargs)

    ctx.prepare = spy  # type: ignore[method-assign]
    return seen


def check_runner(srv: FakeAnthropic, ctx: ContextManager, prepared: list[int], last: Any) -> None:
    requests = srv.requests
    assert len(requests) == RUNNER_CALLS + 1
    # Every turn went through the compactor with the whole history the runner holds ...
    assert prepared == [1 + 2 * i for i in range(RUNNER_CALLS + 1)]
    one = len(read_body("a0"))
    for i, request in enumerate(requests):
        assert request.status == 200, request.error  # ... and the server accepted each view
        assert "thread" not in request.json  # the history is sent, not held server-side
        sent = request.json["messages"]
        assert sent[0] == {"role": "user", "content": "Read a0 to a3."}
        assert len(sent) <= prepared[i]
        if i >= 2:  # the full history holds i results of `one` characters each
            assert size(sent) < i * one, i
    assert ctx.usage.output_tokens == sum(r.usage.output_tokens for r in requests if r.usage)
    assert "".join(b.text for b in last.content if b.type == "text") == "Four helper modules."


@pytest.mark.parametrize("stream", [False, True])
def test_sync_tool_runner_compacts_before_every_turn(stream: bool) -> None:
    with FakeAnthropic(runner_script()) as srv:
        raw = anthropic.Anthropic(base_url=srv.url, api_key="test", max_retries=0)
        ctx = ContextManager(RUNNER_BUDGET)
        prepared = spy_prepare(ctx)
        with ant_provider.wrap(raw, ctx) as client:
            runner = client.beta.messages.tool_runner(
                model=MODEL,
                max_tokens=256,
                tools=[read_file],
                messages=[{"role": "user", "content": "Read a0 to a3."}],
                stream=stream,
            )
            last = None
            for item in runner:
                last = item.get_final_message() if stream else item
        check_runner(srv, ctx, prepared, last)


@pytest.mark.parametrize("stream", [False, True])
async def test_async_tool_runner_compacts_before_every_turn(stream: bool) -> None:
    async with FakeAnthropic(runner_script()) as srv:
        raw = anthropic.AsyncAnthropic(base_url=srv.url, api_key="test", max_retries=0)
        async with raw, ContextManager(RUNNER_BUDGET) as ctx:
            prepared = spy_prepare(ctx)
            client = ant_provider.wrap(raw, ctx)
            runner = client.beta.messages.tool_runner(
                model=MODEL,
                max_tokens=256,
                tools=[read_file_async],
                messages=[{"role": "user", "content": "Read a0 to a3."}],
                stream=stream,
            )
            last = None
            async for item in runner:
                last = await item.get_final_message() if stream else item
            check_runner(srv, ctx, prepared, last)


# ---------------------------------------------------------------- Anthropic: refused


def anthropic_refusals(client: Any) -> Iterator[tuple[str, Callable[[], Any]]]:
    kw = {"model": MODEL, "max_tokens": 64, "messages": anthropic_history(1)}
    yield "messages.batches.create", lambda: client.messages.batches.create(requests=[])
    yield "beta.messages.batches.create", lambda: client.beta.messages.batches.create(requests=[])
    # Found by the hostile run: these went to the batches endpoint as they were.
    batches = client.messages.batches
    yield (
        "messages.batches.with_raw_response.create",
        lambda: batches.with_raw_response.create(requests=[]),
    )
    yield (
        "messages.batches.with_streaming_response.create",
        lambda: batches.with_streaming_response.create(requests=[]),
    )
    yield (
        "beta.messages.batches.with_raw_response.create",
        lambda: client.beta.messages.batches.with_raw_response.create(requests=[]),
    )
    yield "beta.messages.thread", lambda: client.beta.messages.thread(model=MODEL, max_tokens=64)
    yield (
        "messages.with_raw_response.create",
        lambda: client.messages.with_raw_response.create(**kw),
    )
    yield (
        "messages.with_streaming_response.create",
        lambda: client.messages.with_streaming_response.create(**kw),
    )
    yield (
        "beta.messages.with_raw_response.parse",
        lambda: client.beta.messages.with_raw_response.parse(**kw),
    )
    yield (
        "with_raw_response.messages.create",
        lambda: client.with_raw_response.messages.create(**kw),
    )
    yield (
        "beta.with_streaming_response.messages.create",
        lambda: client.beta.with_streaming_response.messages.create(**kw),
    )


def check_refusals(srv: Any, refusals: Iterator[tuple[str, Callable[[], Any]]]) -> None:
    for what, call in refusals:
        with pytest.raises(ConfigError) as caught:
            call()
        message = str(caught.value)
        assert message.startswith(f"{what} is not covered"), message
        assert "Covered: " in message and "wrapped.client" in message
    assert srv.requests == []  # nothing went out


def test_anthropic_refuses_what_it_cannot_compact_sync_and_async() -> None:
    with FakeAnthropic() as srv:
        for raw in (
            anthropic.Anthropic(base_url=srv.url, api_key="test", max_retries=0),
            anthropic.AsyncAnthropic(base_url=srv.url, api_key="test", max_retries=0),
        ):
            client: Any = ant_provider.wrap(raw, ContextManager(BUDGET))
            check_refusals(srv, anthropic_refusals(client))
            # what carries no history passes through
            assert client.messages.batches.list == raw.messages.batches.list
            assert client.models is raw.models and client.beta.files is raw.beta.files
            if isinstance(client, ant_provider.WrappedAnthropic):
                client.close()


async def test_anthropic_with_options_stays_wrapped() -> None:
    async with FakeAnthropic() as srv:
        raw = anthropic.AsyncAnthropic(base_url=srv.url, api_key="test", max_retries=0)
        async with raw, ContextManager(BUDGET) as ctx:
            client = ant_provider.wrap(raw, ctx).with_options(timeout=30)
            assert isinstance(client, ant_provider.WrappedAsyncAnthropic)
            await client.messages.create(
                model=MODEL, max_tokens=64, tools=TOOLS, messages=anthropic_history()
            )
            assert_compacted(srv.requests[-1], "messages", anthropic_history(), keep=1)
            assert ctx.usage.output_tokens > 0


def test_sync_with_options_shares_the_loop() -> None:
    def loops() -> int:
        return sum(t.name == "agentctx" for t in threading.enumerate())

    with FakeAnthropic() as srv:
        raw = anthropic.Anthropic(base_url=srv.url, api_key="test", max_retries=0)
        ctx = ContextManager(BUDGET)
        kw: dict[str, Any] = {"model": MODEL, "max_tokens": 64, "tools": TOOLS}
        with ant_provider.wrap(raw, ctx) as client:
            copy = client.copy(timeout=30)
            assert isinstance(copy, ant_provider.WrappedAnthropic) and loops() == 1
            copy.messages.create(**kw, messages=anthropic_history())
            assert_compacted(srv.requests[-1], "messages", anthropic_history(), keep=1)
            client.messages.create(**kw, messages=anthropic_history())
        assert loops() == 0  # closed once, by the wrapper that started it
        assert [r.status for r in srv.requests] == [200, 200]


# ================================================================= OpenAI: covered, x2


OPENAI_CASES = [
    ("chat", "create"),
    ("chat", "create_stream"),
    ("chat", "parse"),
    ("chat", "stream"),
    ("responses", "create"),
    ("responses", "create_stream"),
    ("responses", "parse"),
    ("responses", "stream"),
    ("responses", "input_tokens.count"),
]


def _openai_kwargs(api: str) -> dict[str, Any]:
    if api == "chat":
        return {"model": "gpt-test", "tools": CHAT_TOOLS, "messages": chat_history()}
    return {"model": "gpt-test", "tools": RESP_TOOLS, "input": responses_items()}


async def _openai_async(client: Any, api: str, kind: str, kw: dict[str, Any]) -> Any:
    if api == "chat":
        chat = client.chat.completions
        if kind == "create":
            return await chat.create(**kw)
        if kind == "create_stream":  # no stream_options.include_usage: the wrapper asks
            stream = await chat.create(
                **kw, stream=True, stream_options={"include_obfuscation": False}
            )
            return [chunk async for chunk in stream]
        if kind == "parse":
            return await chat.parse(**kw, response_format=Answer)
        async with chat.stream(**kw) as stream:
            return await stream.get_final_completion()
    responses = client.responses
    if kind == "create":
        return await responses.create(**kw)
    if kind == "create_stream":
        return [event async for event in await responses.create(**kw, stream=True)]
    if kind == "parse":
        return await responses.parse(**kw, text_format=Answer)
    if kind == "stream":
        async with responses.stream(**kw) as stream:
            return await stream.get_final_response()
    return await responses.input_tokens.count(**kw)


def _openai_sync(client: Any, api: str, kind: str, kw: dict[str, Any]) -> Any:
    if api == "chat":
        chat = client.chat.completions
        if kind == "create":
            return chat.create(**kw)
        if kind == "create_stream":
            return list(
                chat.create(**kw, stream=True, stream_options={"include_obfuscation": False})
            )
        if kind == "parse":
            return chat.parse(**kw, response_format=Answer)
        with chat.stream(**kw) as stream:
            return stream.get_final_completion()
    responses = client.responses
    if kind == "create":
        return responses.create(**kw)
    if kind == "create_stream":
        return list(responses.create(**kw, stream=True))
    if kind == "parse":
        return responses.parse(**kw, text_format=Answer)
    if kind == "stream":
        with responses.stream(**kw) as stream:
            return stream.get_final_response()
    return responses.input_tokens.count(**kw)


def _check_openai(srv: FakeOpenAI, ctx: ContextManager, api: str, kind: str, result: Any) -> None:
    request = srv.requests[-1]
    if api == "chat":
        assert_compacted(request, "messages", chat_history(), keep=2)
        assert request.json["tools"] == CHAT_TOOLS
        if kind in ("create_stream", "stream"):
            # asked for by the wrapper, merged into the caller's options
            expected = {"include_usage": True}
            if kind == "create_stream":
                expected["include_obfuscation"] = False
            assert request.json["stream_options"] == expected
        if kind == "parse":
            assert result.choices[0].message.parsed == Answer(answer="four")
    else:
        assert_compacted(request, "input", responses_items(), keep=2)
        assert request.json["tools"] == RESP_TOOLS
        if kind == "parse":
            assert result.output_parsed == Answer(answer="four")
    if kind == "input_tokens.count":
        assert request.path == "/v1/responses/input_tokens"
        assert 0 < result.input_tokens < size(responses_items()) // 4
        assert ctx.usage == Usage()
        return
    assert ctx.usage.output_tokens == request.usage.output_tokens > 0


@pytest.mark.parametrize(("api", "kind"), OPENAI_CASES)
async def test_openai_async_entry_point_is_compacted(api: str, kind: str) -> None:
    async with FakeOpenAI(default=Reply.text(ANSWER)) as srv:
        raw = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="test", max_retries=0)
        async with raw, ContextManager(BUDGET) as ctx:
            client = oai_provider.wrap(raw, ctx)
            result = await _openai_async(client, api, kind, _openai_kwargs(api))
            _check_openai(srv, ctx, api, kind, result)


@pytest.mark.parametrize(("api", "kind"), OPENAI_CASES)
def test_openai_sync_entry_point_is_compacted(api: str, kind: str) -> None:
    with FakeOpenAI(default=Reply.text(ANSWER)) as srv:
        raw = openai.OpenAI(base_url=srv.url + "/v1", api_key="test", max_retries=0)
        ctx = ContextManager(BUDGET)
        with oai_provider.wrap(raw, ctx) as client:
            result = _openai_sync(client, api, kind, _openai_kwargs(api))
            _check_openai(srv, ctx, api, kind, result)


def openai_refusals(client: Any) -> Iterator[tuple[str, Callable[[], Any]]]:
    chat = {"model": "gpt-test", "messages": chat_history(1)}
    items = {"model": "gpt-test", "input": responses_items(1)}
    completions, responses = client.chat.completions, client.responses
    yield (
        "chat.completions.with_raw_response.create",
        lambda: completions.with_raw_response.create(**chat),
    )
    yield (
        "chat.with_streaming_response.completions.create",
        lambda: client.chat.with_streaming_response.completions.create(**chat),
    )
    yield "responses.with_raw_response.create", lambda: responses.with_raw_response.create(**items)
    yield (
        "responses.input_tokens.with_raw_response.count",
        lambda: responses.input_tokens.with_raw_response.count(**items),
    )
    yield "responses.compact", lambda: responses.compact(**items)
    yield "responses.connect", lambda: responses.connect()
    yield "beta.chat.completions.parse", lambda: client.beta.chat.completions.parse(**chat)
    yield "beta.responses.create", lambda: client.beta.responses.create(**items)
    yield (
        "with_raw_response.chat.completions.create",
        lambda: client.with_raw_response.chat.completions.create(**chat),
    )
    # Found by a hostile run (CB 3): other resources of the SDK send a history too, and went
    # out uncompacted.
    yield "decisions.create", lambda: client.decisions.create(**items, questions=[])
    yield (
        "decisions.with_raw_response.create",
        lambda: client.decisions.with_raw_response.create(**items, questions=[]),
    )
    yield "conversations.create", lambda: client.conversations.create(items=items["input"])
    yield (
        "conversations.items.create",
        lambda: client.conversations.items.create("conv_1", items=items["input"]),
    )
    yield "beta.threads.create", lambda: client.beta.threads.create(messages=[])


def test_openai_refuses_what_it_cannot_compact_sync_and_async() -> None:
    with FakeOpenAI() as srv:
        for raw in (
            openai.OpenAI(base_url=srv.url + "/v1", api_key="test", max_retries=0),
            openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="test", max_retries=0),
        ):
            client: Any = oai_provider.wrap(raw, ContextManager(BUDGET))
            check_refusals(srv, openai_refusals(client))
            # what carries no history passes through
            assert client.models is raw.models and client.embeddings is raw.embeddings
            assert client.chat.completions.list == raw.chat.completions.list
            assert client.responses.retrieve == raw.responses.retrieve
            assert client.beta.assistants is raw.beta.assistants
            assert client.conversations.retrieve == raw.conversations.retrieve
            assert client.conversations.items.list == raw.conversations.items.list
            if isinstance(client, oai_provider.WrappedOpenAI):
                client.close()


# ================================================================ observe(SDK objects)


def _expected(reply: Reply) -> Usage:
    assert reply.input_tokens is not None and reply.output_tokens is not None
    assert reply.cache_read is not None and reply.cache_write is not None
    return Usage(reply.input_tokens, reply.output_tokens, reply.cache_read, reply.cache_write)


BILLED = Reply.text("ok", input_tokens=30, output_tokens=5, cache_read=100, cache_write=20)


def test_observe_takes_anthropic_sdk_objects() -> None:
    with (
        FakeAnthropic(default=BILLED) as srv,
        anthropic.Anthropic(base_url=srv.url, api_key="test", max_retries=0) as raw,
    ):
        kw: dict[str, Any] = {
            "model": MODEL,
            "max_tokens": 64,
            "messages": anthropic_history(0),
        }
        message = raw.messages.create(**kw)
        beta = raw.beta.messages.create(**kw)
        with raw.messages.stream(**kw) as stream:
            final = stream.get_final_message()
        expected = _expected(BILLED)
        for response in (message, message.usage, beta, beta.usage, final, final.usage):
            ctx = ContextManager(BUDGET)
            ctx.observe(response)
            assert ctx.usage == expected, type(response).__name__


def test_observe_takes_openai_sdk_objects() -> None:
    with (
        FakeOpenAI(default=BILLED) as srv,
        openai.OpenAI(base_url=srv.url + "/v1", api_key="test", max_retries=0) as raw,
    ):
        chat = raw.chat.completions.create(model="gpt-test", messages=chat_history(0))
        response = raw.responses.create(model="gpt-test", input=responses_items(0))
        options = {"include_usage": True}
        with raw.chat.completions.stream(
            model="gpt-test", messages=chat_history(0), stream_options=options
        ) as stream:
            chat_final = stream.get_final_completion()
        with raw.responses.stream(model="gpt-test", input=responses_items(0)) as rstream:
            response_final = rstream.get_final_response()
        # OpenAI counts cache reads and writes inside the prompt, and reports both
        expected = _expected(BILLED)
        for obj in (chat, chat.usage, response, response.usage, chat_final, response_final):
            ctx = ContextManager(BUDGET)
            ctx.observe(obj)
            assert ctx.usage == expected, type(obj).__name__


@pytest.mark.parametrize("obj", [object(), SimpleNamespace(usage=None), {"id": "x"}])
def test_observe_refuses_what_carries_no_usage(obj: object) -> None:
    with pytest.raises(ConfigError) as caught:
        ContextManager(BUDGET).observe(obj)
    message = str(caught.value)
    assert "anthropic Message" in message and "ChatCompletion" in message, message
    assert type(obj).__name__ in message


# =============================================================== the reserve follows


def reserve_cases() -> list[tuple[str, str, int]]:
    return [
        ("anthropic", "max_tokens", 1_000),
        ("openai-chat", "max_completion_tokens", 1_000),
        ("openai-chat", "max_tokens", 1_000),
        ("openai-responses", "max_output_tokens", 1_000),
    ]


async def _send_once(provider: str, budget: Budget, key: str, value: int) -> RecordedRequest:
    """One wrapped call over a history of about 11k tokens; the request the server got."""
    if provider == "anthropic":
        async with FakeAnthropic() as srv, ContextManager(budget) as ctx:
            raw = anthropic.AsyncAnthropic(base_url=srv.url, api_key="test", max_retries=0)
            async with raw:
                client = ant_provider.wrap(raw, ctx)
                await client.messages.create(
                    model=MODEL, tools=TOOLS, messages=anthropic_history(), **{key: value}
                )
            assert ctx.budget is budget  # the session's budget is untouched
            return srv.requests[-1]
    async with FakeOpenAI() as osrv, ContextManager(budget) as ctx:
        oraw = openai.AsyncOpenAI(base_url=osrv.url + "/v1", api_key="test", max_retries=0)
        async with oraw:
            oclient = oai_provider.wrap(oraw, ctx)
            if provider == "openai-chat":
                await oclient.chat.completions.create(
                    model="m", messages=chat_history(), **{key: value}
                )
            else:
                await oclient.responses.create(model="m", input=responses_items(), **{key: value})
        return osrv.requests[-1]


def _key_of(provider: str) -> str:
    return "input" if provider == "openai-responses" else "messages"


@pytest.mark.parametrize(("provider", "key", "value"), reserve_cases())
async def test_default_reserve_follows_the_requests_max_tokens(
    provider: str, key: str, value: int
) -> None:
    full = {"anthropic": anthropic_history, "openai-chat": chat_history}.get(
        provider, responses_items
    )()
    # The default reserve (16,000) leaves 4,000 tokens of a 20,000 window; the request asks
    # for 1,000, so the 11k-token history fits as it is.
    sent = await _send_once(provider, Budget(context_window=20_000), key, value)
    assert sent.status == 200 and sent.json[_key_of(provider)] == full
    # Set explicitly, the reserve stays whatever the request asks for: compacted.
    explicit = Budget(context_window=20_000, reserve_output=16_000)
    sent = await _send_once(provider, explicit, key, value)
    assert sent.status == 200 and size(sent.json[_key_of(provider)]) < size(full)


async def test_max_tokens_over_the_window_names_the_values() -> None:
    async with FakeAnthropic() as srv, ContextManager(Budget(context_window=20_000)) as ctx:
        raw = anthropic.AsyncAnthropic(base_url=srv.url, api_key="test", max_retries=0)
        async with raw:
            client = ant_provider.wrap(raw, ctx)
            with pytest.raises(ConfigError, match=r"max_tokens=20000 .*context_window=20000"):
                await client.messages.create(
                    model=MODEL, max_tokens=20_000, tools=TOOLS, messages=anthropic_history(1)
                )
        assert srv.requests == []


async def test_middleware_reserve_follows_max_tokens() -> None:
    async with FakeAnthropic() as srv, ContextManager(Budget(context_window=20_000)) as ctx:
        raw = anthropic.AsyncAnthropic(base_url=srv.url, api_key="test", max_retries=0)
        async with raw:
            middleware = as_middleware(ctx, "anthropic")

            async def call(request: dict[str, Any]) -> Any:
                return await raw.messages.create(**request)

            full = anthropic_history()
            request = {"model": MODEL, "tools": TOOLS, "messages": full}
            await middleware({**request, "max_tokens": 1_000}, call)
            assert srv.requests[-1].json["messages"] == full  # 19,000 tokens of room
            await middleware({**request, "max_tokens": 16_000}, call)
            assert size(srv.requests[-1].json["messages"]) < size(full)  # 4,000 of room


def test_for_output_keeps_an_explicit_reserve() -> None:
    default = Budget(context_window=200_000)
    assert default.for_output(4_096).limit == 200_000 - 4_096
    assert default.for_output(4_096).for_output(64_000).limit == 200_000 - 64_000
    explicit = Budget(context_window=200_000, reserve_output=16_000)
    assert explicit.for_output(4_096) is explicit
    assert default == explicit  # the default is still 16,000 when compared
    with pytest.raises(ConfigError, match="max_tokens must be a whole number"):
        default.for_output(True)


def test_a_summarizer_given_a_wrapped_client_sends_past_the_session() -> None:
    # Its own requests must not go through the compactor of the session it summarizes.
    raw = anthropic.AsyncAnthropic(api_key="test")
    summarizer = AnthropicSummarizer(client=ant_provider.wrap(raw, ContextManager(BUDGET)))  # type: ignore[arg-type]
    assert isinstance(summarizer.client, anthropic.AsyncAnthropic)


async def test_histories_may_hold_the_sdk_objects_as_returned() -> None:
    """``content=resp.content``, a ``ChatCompletionMessage``, ``items += resp.output``: taken as
    the dicts the SDK would send, compacted, accepted."""
    script = [*[Reply.tool_call("read", {"path": f"a{i}"}) for i in range(TURNS)], Reply.text("ok")]
    async with (
        FakeAnthropic(script) as srv,
        FakeOpenAI(script) as chat_srv,
        FakeOpenAI(script) as resp_srv,
    ):
        raw = anthropic.AsyncAnthropic(base_url=srv.url, api_key="test", max_retries=0)
        async with raw, ContextManager(BUDGET) as ctx:
            client = ant_provider.wrap(raw, ctx)
            history: list[Any] = [{"role": "user", "content": "Read them all."}]
            while True:
                reply = await client.messages.create(
                    model=MODEL, max_tokens=64, tools=TOOLS, messages=history
                )
                history.append({"role": "assistant", "content": reply.content})
                uses = [b for b in reply.content if b.type == "tool_use"]
                if not uses:
                    break
                results = [
                    {"type": "tool_result", "tool_use_id": u.id, "content": body(0)} for u in uses
                ]
                history.append({"role": "user", "content": results})
        oraw = openai.AsyncOpenAI(base_url=chat_srv.url + "/v1", api_key="test", max_retries=0)
        async with oraw, ContextManager(BUDGET) as ctx:
            oclient = oai_provider.wrap(oraw, ctx)
            messages: list[Any] = [{"role": "user", "content": "Read them all."}]
            while True:
                completion = await oclient.chat.completions.create(
                    model="m", tools=CHAT_TOOLS, messages=messages
                )
                message = completion.choices[0].message
                messages.append(message)
                for call in message.tool_calls or []:
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": body(0)})
                if not message.tool_calls:
                    break
        rraw = openai.AsyncOpenAI(base_url=resp_srv.url + "/v1", api_key="test", max_retries=0)
        async with rraw, ContextManager(BUDGET) as ctx:
            rclient = oai_provider.wrap(rraw, ctx)
            items: list[Any] = [{"role": "user", "content": "Read them all."}]
            while True:
                response = await rclient.responses.create(
                    model="m", tools=RESP_TOOLS, input=items, store=False
                )
                items += response.output
                calls = [item for item in response.output if item.type == "function_call"]
                for item in calls:
                    items.append(
                        {"type": "function_call_output", "call_id": item.call_id, "output": body(0)}
                    )
                if not calls:
                    break
    for server, key, full in (
        (srv, "messages", history),
        (chat_srv, "messages", messages),
        (resp_srv, "input", items),
    ):
        requests = server.requests
        assert len(requests) == TURNS + 1
        assert all(r.status == 200 for r in requests), [r.error for r in requests]
        assert len(requests[-1].json[key]) < len(full) - 1  # compacted, not only sent


# ------------------------------------------------------------------ counts take no decision


async def test_a_count_before_the_first_request_leaves_a_history_that_fits_whole() -> None:
    """A count asks for no output. It was made against the default 16k reserve: on a history
    that fits the window beside the 256 tokens the requests ask for, the count alone compacted
    it, for good, and every request after it sent the compacted view (found by a hostile
    run)."""
    budget = Budget(context_window=20_000)  # the default reserve leaves 4k for the prompt
    history = anthropic_history()
    kw: dict[str, Any] = {"model": MODEL, "messages": history, "tools": TOOLS}
    async with FakeAnthropic(default=Reply.text(ANSWER)) as srv:
        raw = anthropic.AsyncAnthropic(base_url=srv.url, api_key="test", max_retries=0)
        async with raw, ContextManager(budget) as ctx:
            client = ant_provider.wrap(raw, ctx)
            counted = await client.messages.count_tokens(**kw)
            await client.messages.create(**kw, max_tokens=256)
    assert counted.input_tokens > 4_000
    assert srv.requests[-1].json["messages"] == history
    assert len(ctx.ledger) == 0


async def test_a_count_is_made_with_the_output_limit_of_the_last_request() -> None:
    budget = Budget(context_window=20_000)
    items = responses_items()
    kw: dict[str, Any] = {"model": "gpt-test", "input": items, "tools": RESP_TOOLS}
    async with FakeOpenAI(default=Reply.text(ANSWER)) as srv:
        raw = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="test", max_retries=0)
        async with raw, ContextManager(budget) as ctx:
            responses = oai_provider.wrap(raw, ctx).responses
            await responses.create(**kw, max_output_tokens=256)
            await responses.input_tokens.count(**kw)
            await responses.create(**kw, max_output_tokens=256)
            assert [r.json["input"] for r in srv.requests] == [items] * 3
            assert len(ctx.ledger) == 0
            # A request asking for most of the window compacts.
            await responses.create(**kw, max_output_tokens=16_000)
            assert len(ctx.ledger) > 0
