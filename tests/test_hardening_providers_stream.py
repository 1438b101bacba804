"""Hostile streams through the wrapped SDK clients: shapes the SDKs read without complaint but
the wrapper's rebuilding of the response did not take (a Chat delta's content a list then a
string, a null index, a Responses item starting with null content, an Anthropic event with a
null field or a delta before its block), and block indexes far past those seen. Each is
served by a raw socket server on 127.0.0.1 and read through the real SDK; each test is the
reproduction of a finding. Whatever the stream, the caller's iteration ends as the unwrapped
SDK's does, and the usage it reported is recorded."""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from agentctx import Budget, ContextManager, UnsupportedMessageError
from agentctx.adapters import assemble_anthropic_stream, assemble_openai_responses_stream
from agentctx.providers import anthropic as ant_provider
from agentctx.providers import openai as oai_provider

NOT_REBUILT = "stream not rebuilt"
HI = [{"role": "user", "content": "hi"}]


class SSEServer:
    """Answers every request on 127.0.0.1 with one server-sent-event body, then closes."""

    def __init__(self, body: bytes) -> None:
        self._body = body
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            with conn, conn.makefile("rb") as f:
                length = 0
                while (line := f.readline()) not in (b"\r\n", b""):
                    name, _, value = line.decode().partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                f.read(length)
                head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                conn.sendall(head + b"connection: close\r\n\r\n" + self._body)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sock.close()


def named_events(events: list[dict[str, Any]]) -> bytes:
    """Anthropic / Responses SSE: each event named by its ``type``."""
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()


def chat_chunks(chunks: list[dict[str, Any]]) -> bytes:
    lines = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)
    return lines.encode() + b"data: [DONE]\n\n"


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[SSEServer] = []

    def start(body: bytes) -> SSEServer:
        servers.append(SSEServer(body))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


# ------------------------------------------------------------------------ Chat Completions


def chunk(choices: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": choices,
        **fields,
    }


CHAT_USAGE = chunk([], usage={"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11})
REASONING_PART = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hmm"}]}
CHAT_STREAMS = {
    # A typed reasoning part, then text (Mistral magistral, GPT-OSS on Databricks).
    "content a list then a string": [
        chunk([{"index": 0, "delta": {"role": "assistant", "content": [REASONING_PART]}}]),
        chunk([{"index": 0, "delta": {"content": "answer"}, "finish_reason": "stop"}]),
        CHAT_USAGE,
    ],
    "a null choice index": [
        chunk([{"index": None, "delta": {"content": "a"}}]),
        chunk([{"index": 0, "delta": {"content": "b"}, "finish_reason": "stop"}]),
        CHAT_USAGE,
    ],
}


@pytest.mark.parametrize("shape", CHAT_STREAMS)
async def test_a_chat_stream_the_sdk_reads_is_read_to_its_end_and_its_usage_recorded(
    shape: str, serve: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by a hostile run (CT 3): a Chat stream whose delta content was a list then a
    string made the caller's own ``async for`` raise UnsupportedMessageError after every chunk
    was delivered (and printed pydantic serializer warnings the SDK does not); one with a
    null choice index raised a bare TypeError; the usage was lost. Now the stream ends as the
    SDK's does, its reported usage is recorded, and the response not rebuilt is logged once."""
    server = serve(chat_chunks(CHAT_STREAMS[shape]))
    raw = openai.AsyncOpenAI(base_url=server.url, api_key="k", max_retries=0)
    async with ContextManager(Budget(context_window=200_000)) as ctx:
        async with oai_provider.wrap(raw, ctx) as client:
            with caplog.at_level(logging.WARNING, logger="agentctx"):
                for _ in range(2):
                    stream = await client.chat.completions.create(
                        model="m", messages=HI, stream=True
                    )
                    assert len([c async for c in stream]) == 3
        assert ctx.usage.input_tokens == 18
    assert caplog.text.count(NOT_REBUILT) == 1


def test_a_blocking_chat_stream_the_sdk_reads_is_read_to_its_end(
    serve: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by a hostile run (CT 3): the blocking client's stream raised the same way after
    its last chunk. Now it ends as the SDK's does and its usage is recorded."""
    server = serve(chat_chunks(CHAT_STREAMS["content a list then a string"]))
    manager = ContextManager(Budget(context_window=200_000))
    raw = openai.OpenAI(base_url=server.url, api_key="k", max_retries=0)
    with oai_provider.wrap(raw, manager) as client, caplog.at_level(logging.WARNING):
        stream = client.chat.completions.create(model="m", messages=HI, stream=True)
        assert len(list(stream)) == 3
    assert manager.usage.input_tokens == 9
    assert NOT_REBUILT in caplog.text


# ------------------------------------------------------------------------------- Responses

RESPONSE = {"id": "resp_1", "object": "response", "created_at": 1, "model": "m", "output": []}
RESP_USAGE = {
    "input_tokens": 9,
    "output_tokens": 2,
    "total_tokens": 11,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens_details": {"reasoning_tokens": 0},
}


def responses_stream(middle: list[dict[str, Any]], done: list[Any]) -> bytes:
    created = {**RESPONSE, "status": "in_progress"}
    completed = {**RESPONSE, "status": "completed", "output": done, "usage": RESP_USAGE}
    events = [
        {"type": "response.created", "response": created},
        *middle,
        {"type": "response.completed", "response": completed},
    ]
    return named_events([{**e, "sequence_number": n} for n, e in enumerate(events)])


async def read_responses(body: bytes, serve: Any) -> tuple[int, ContextManager]:
    """How many events a wrapped ``responses.create(stream=True)`` of ``body`` gave, and its
    (closed) session."""
    server = serve(body)
    raw = openai.AsyncOpenAI(base_url=server.url, api_key="k", max_retries=0)
    ctx = ContextManager(Budget(context_window=200_000))
    async with ctx, oai_provider.wrap(raw, ctx) as client:
        stream = await client.responses.create(model="m", input=HI, stream=True)
        events = [e async for e in stream]
    return len(events), ctx


async def test_a_reasoning_item_that_starts_with_null_content_is_read(serve: Any) -> None:
    """Found by a hostile run (CT 3): a reasoning item added with ``"content": null`` then
    given ``response.reasoning_text.delta`` made the caller's ``async for`` raise after the
    last event. Now the stream ends as the SDK's does and its usage is recorded."""
    item = {"type": "reasoning", "id": "rs_1", "summary": [], "content": None}
    done = {**item, "content": [{"type": "reasoning_text", "text": "think"}]}
    at = {"output_index": 0, "item_id": "rs_1"}
    body = responses_stream(
        [
            {"type": "response.output_item.added", "output_index": 0, "item": item},
            {"type": "response.reasoning_text.delta", **at, "content_index": 0, "delta": "t"},
            {"type": "response.output_item.done", "output_index": 0, "item": done},
        ],
        [done],
    )
    count, ctx = await read_responses(body, serve)
    assert count == 5
    assert ctx.usage.input_tokens == 9


# ------------------------------------------------------------------------------- Anthropic


def anthropic_stream(*middle: dict[str, Any], **start: Any) -> bytes:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 7, "output_tokens": 1},
        **start,
    }
    return named_events(
        [{"type": "message_start", "message": message}, *middle, {"type": "message_stop"}]
    )


TEXT_START = {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}
TEXT_DELTA = {
    "type": "content_block_delta",
    "index": 0,
    "delta": {"type": "text_delta", "text": "hi"},
}
BLOCK_STOP = {"type": "content_block_stop", "index": 0}
ENDED = {"stop_reason": "end_turn", "stop_sequence": None}
MESSAGE_DELTA = {"type": "message_delta", "delta": ENDED, "usage": {"output_tokens": 3}}
ANTHROPIC_STREAMS = {
    "a null message_delta.delta": anthropic_stream(
        TEXT_START,
        TEXT_DELTA,
        BLOCK_STOP,
        {"type": "message_delta", "delta": None, "usage": {"output_tokens": 3}},
    ),
    "a null message_start.content": anthropic_stream(
        TEXT_START, TEXT_DELTA, BLOCK_STOP, MESSAGE_DELTA, content=None
    ),
    "a delta before its block's start": anthropic_stream(TEXT_DELTA, MESSAGE_DELTA),
}


async def read_anthropic(body: bytes, serve: Any) -> tuple[int, ContextManager]:
    """How many events a wrapped ``messages.create(stream=True)`` of ``body`` gave, and its
    (closed) session."""
    server = serve(body)
    raw = anthropic.AsyncAnthropic(base_url=server.url, api_key="k", max_retries=0)
    ctx = ContextManager(Budget(context_window=200_000))
    async with ctx, ant_provider.wrap(raw, ctx) as client:
        stream = await client.messages.create(model="m", max_tokens=10, messages=HI, stream=True)
        events = [e async for e in stream]
    return len(events), ctx


@pytest.mark.parametrize("shape", ANTHROPIC_STREAMS)
async def test_an_anthropic_stream_the_sdk_reads_is_read_to_its_end(shape: str, serve: Any) -> None:
    """Found by a hostile run (CT 3): a Messages stream with a null ``message_delta.delta``,
    a null ``message_start.content`` or a delta before its block's start made the caller's
    ``async for`` raise UnsupportedMessageError after the last event, and the usage was lost.
    Now the stream ends as the SDK's does and its usage is recorded."""
    body = ANTHROPIC_STREAMS[shape]
    count, ctx = await read_anthropic(body, serve)
    assert count == body.count(b"event: ")
    assert ctx.usage.input_tokens == 7
    assert ctx.usage.output_tokens == 3


# ------------------------------------------------------------------- indexes far past the seen

FAR = 10**6  # far enough to tell; a misbehaving server's 10**9 took all the memory


def test_a_block_index_far_past_those_seen_is_no_reconstruction() -> None:
    """Found by a hostile run (CT 2): rebuilding a stream filled the blocks up to an event's
    index, so an index of 10**9 from a misbehaving server or proxy took all the memory (10**7:
    700 MB more). Now an index more than a few past those seen is UnsupportedMessageError,
    before anything is allocated for it."""
    start = {"type": "message_start", "message": {"content": [], "usage": {}}}
    block = {"type": "content_block_start", "index": FAR, "content_block": {"type": "text"}}
    with pytest.raises(UnsupportedMessageError, match="far past"):
        assemble_anthropic_stream([start, block])
    item = {"type": "message", "id": "m1", "content": []}
    for event in (
        {"type": "response.output_text.delta", "content_index": FAR, "delta": "hi"},
        {"type": "response.reasoning_summary_text.delta", "summary_index": FAR, "delta": "x"},
        {"type": "response.content_part.added", "content_index": FAR, "part": {}},
    ):
        added = {"type": "response.output_item.added", "output_index": 0, "item": item}
        with pytest.raises(UnsupportedMessageError, match="far past"):
            assemble_openai_responses_stream([added, {**event, "output_index": 0}])


async def test_a_stream_with_an_index_far_past_those_seen_records_its_usage_only(
    serve: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by a hostile run (CT 2): a stream whose block or part index was far past those
    seen made the wrapper allocate up to it once the stream ended. Now that stream's
    reconstruction gives up (logged once), the caller's iteration ends as the SDK's does and
    the usage it reported is recorded."""
    far_block = {"type": "content_block_start", "index": FAR, "content_block": {"type": "text"}}
    item = {"type": "message", "id": "msg_1", "role": "assistant", "content": []}
    far_text = {
        "type": "response.output_text.delta",
        "output_index": 0,
        "item_id": "msg_1",
        "content_index": FAR,
        "delta": "hi",
        "logprobs": [],
    }
    added = {"type": "response.output_item.added", "output_index": 0, "item": item}
    with caplog.at_level(logging.WARNING, logger="agentctx"):
        count, ctx = await read_anthropic(anthropic_stream(far_block, MESSAGE_DELTA), serve)
        assert (count, ctx.usage.input_tokens, ctx.usage.output_tokens) == (4, 7, 3)
        count, ctx = await read_responses(responses_stream([added, far_text], []), serve)
        assert (count, ctx.usage.input_tokens) == (4, 9)
    assert caplog.text.count(NOT_REBUILT) == 2  # once for each client
