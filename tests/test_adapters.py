"""Provider adapters: exact round trips over the recorded API traffic, edge cases, properties."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentctx.adapters import (
    assemble_anthropic_stream,
    assemble_openai_chat_stream,
    assemble_openai_responses_stream,
    from_anthropic,
    from_openai_chat,
    from_openai_responses,
    message_from_anthropic_response,
    message_from_openai_chat_response,
    message_from_openai_response,
    split_openai_chat_system,
    split_openai_responses_system,
    to_anthropic,
    to_openai_chat,
    to_openai_responses,
)
from agentctx.boundaries import EMPTY_TEXT, Repair, repair
from agentctx.budget import Budget
from agentctx.errors import UnsupportedMessageError
from agentctx.manager import ContextManager
from agentctx.messages import (
    AssistantMessage,
    ImageBlock,
    Message,
    OpaqueBlock,
    RedactedThinkingBlock,
    SummaryMessage,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
    canonical_json,
    from_dict,
    to_dict,
)
from agentctx.testing._validate import validate_chat, validate_responses

from .corpus import corpus_file, corpus_files

# ---------------------------------------------------------------------------------------
# The recorded traffic, read into one shape


@dataclass
class Exchange:
    """One recorded API call: what was sent, and what came back (whole or streamed)."""

    api: str  # "anthropic", "chat", "responses" or "compact"
    request: dict[str, Any] | None = None
    response: dict[str, Any] | None = None
    stream: list[dict[str, Any]] | None = None
    where: str = ""
    next_request: dict[str, Any] | None = field(default=None, repr=False)


def sse_data(text: str) -> list[dict[str, Any]]:
    """The JSON ``data:`` payloads of an SSE body (``event:`` lines and ``[DONE]`` skipped)."""
    return [
        json.loads(line[5:])
        for line in text.splitlines()
        if line.startswith("data:") and line[5:].strip() != "[DONE]"
    ]


def _api(uri: str) -> str:
    if uri.endswith("/responses/compact"):
        return "compact"
    if "/responses" in uri:
        return "responses"
    return "chat" if "/chat/completions" in uri else "anthropic"


def exchanges(path: Path) -> list[Exchange]:
    name = path.name
    anthropic = path.parent.name == "anthropic-api"
    found: list[Exchange] = []
    if name.endswith(".yaml"):
        for it in yaml.safe_load(path.read_text())["interactions"]:
            resp = it["response"]
            body = resp.get("parsed_body")
            stream = None if body is not None else sse_data(resp["body"]["string"])
            found.append(
                Exchange(_api(it["request"]["uri"]), it["request"]["parsed_body"], body, stream)
            )
    elif name.startswith("sdk-runtools"):
        for it in json.loads(path.read_text()):
            body = it["response"]["body"]
            stream = sse_data(body) if isinstance(body, str) else None
            found.append(
                Exchange("anthropic", it["request"]["body"], None if stream else body, stream)
            )
    elif name.endswith(".sse.txt"):
        found.append(Exchange("anthropic", stream=sse_data(path.read_text())))
    elif name.endswith(".chunks.txt"):
        events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if anthropic:
            found.append(Exchange("anthropic", stream=events))
        else:  # several Responses streams back to back
            starts = [i for i, e in enumerate(events) if e["type"] == "response.created"]
            for a, b in zip(starts, [*starts[1:], len(events)], strict=True):
                found.append(Exchange("responses", stream=events[a:b]))
    elif name.startswith("openhands-litellm"):
        log = json.loads(path.read_text())
        found.append(Exchange("chat", {"messages": log["messages"]}, log["response"]))
    elif name.endswith(".json"):
        found.append(
            Exchange(
                "anthropic" if anthropic else "responses", response=json.loads(path.read_text())
            )
        )
    else:
        raise AssertionError(f"corpus file {name} has no reader here")
    for n, ex in enumerate(found):
        ex.where = f"{name}#{n}"
        ex.next_request = found[n + 1].request if n + 1 < len(found) else None
    return found


API_FILES = corpus_files("anthropic-api") + corpus_files("openai-api")


def test_the_corpus_is_there() -> None:
    corpus_file("anthropic-api", "FORMAT.md")
    assert len(corpus_files("anthropic-api")) >= 10 and len(corpus_files("openai-api")) >= 8


# ---------------------------------------------------------------------------------------
# Corpus round trips


def _known_never_opaque(history: list[Message], modeled: set[str]) -> None:
    """Known block kinds must be modeled, not carried opaque (that would hide them)."""
    for m in history:
        for b in getattr(m, "content", ()):
            if isinstance(b, OpaqueBlock):
                assert b.payload.get("type") not in modeled, b.payload


def _request_round_trip(ex: Exchange) -> list[Message]:
    assert ex.request is not None
    if ex.api == "anthropic":
        params = ex.request["messages"]
        history = from_anthropic(params)
        assert to_anthropic(history) == params
        assert from_anthropic(to_anthropic(history)) == history
        modeled = {"text", "image", "thinking", "redacted_thinking", "tool_use", "tool_result"}
    elif ex.api == "chat":
        params = ex.request["messages"]
        system, rest = split_openai_chat_system(params)
        history = from_openai_chat(rest)
        assert system + to_openai_chat(history) == params
        assert to_openai_chat(from_openai_chat(params)) == params  # unsplit, too
        assert from_openai_chat(to_openai_chat(history)) == history
        modeled = {"text", "image_url"}
    else:
        params = ex.request["input"]
        system, rest = split_openai_responses_system(params)
        history = from_openai_responses(rest)
        assert system + to_openai_responses(history) == params
        assert from_openai_responses(to_openai_responses(history)) == history
        modeled = {"input_text", "output_text", "function_call", "function_call_output"}
        modeled |= {"reasoning", "message"}
    _known_never_opaque(history, modeled)
    for m in history:  # the extras stay JSON, so the canonical form and stores still work
        assert from_dict(json.loads(canonical_json(m))) == m
    return history


def _response_message(ex: Exchange) -> tuple[AssistantMessage, dict[str, Any]]:
    """The response (assembled when streamed) and its neutral message."""
    if ex.api == "anthropic":
        resp = ex.response if ex.stream is None else assemble_anthropic_stream(ex.stream)
        return message_from_anthropic_response(resp), resp
    if ex.api == "chat":
        resp = ex.response if ex.stream is None else assemble_openai_chat_stream(ex.stream)
        return message_from_openai_chat_response(resp), resp
    resp = ex.response if ex.stream is None else assemble_openai_responses_stream(ex.stream)
    assert resp is not None
    return message_from_openai_response(resp), resp


def _rendered(ex: Exchange, m: Message) -> list[dict[str, Any]]:
    if ex.api == "anthropic":
        return to_anthropic([m])
    if ex.api == "chat":
        return to_openai_chat([m])
    return to_openai_responses([m])


@pytest.mark.parametrize("path", API_FILES, ids=lambda p: p.name)
def test_every_recorded_request_round_trips_exactly(path: Path) -> None:
    requests = [ex for ex in exchanges(path) if ex.request is not None]
    for ex in requests:
        _request_round_trip(ex)
    if path.name.startswith(("pydai", "sdk-runtools", "openhands")):
        assert requests, "this file records requests"


@pytest.mark.parametrize("path", API_FILES, ids=lambda p: p.name)
def test_every_recorded_response_maps_to_the_same_blocks(path: Path) -> None:
    replies = [ex for ex in exchanges(path) if ex.response is not None or ex.stream is not None]
    assert replies, "every file records responses or streams"
    echoes = 0
    for ex in replies:
        m, resp = _response_message(ex)
        assert m.model == resp.get("model")
        if ex.api == "anthropic":
            (sent,) = to_anthropic([m])
            assert sent["content"] == resp["content"], ex.where
            usage = resp["usage"]
            assert m.usage == Usage(
                usage["input_tokens"],
                usage["output_tokens"],
                usage.get("cache_read_input_tokens") or 0,
                usage.get("cache_creation_input_tokens") or 0,
                (usage.get("cache_creation") or {}).get("ephemeral_1h_input_tokens") or 0,
            )
        elif ex.api == "chat":
            (sent,) = to_openai_chat([m])
            reply = resp["choices"][0]["message"]
            assert sent.get("content") == reply.get("content"), ex.where
            assert sent.get("tool_calls") == reply.get("tool_calls"), ex.where
        else:  # Responses items are the same shape in output and input
            assert to_openai_responses([m]) == resp["output"], ex.where
        # The reply as the client sent it back next turn, where the recording has that turn.
        if ex.next_request and ex.request and ex.api in ("anthropic", "chat"):
            echoed = ex.next_request["messages"][len(ex.request["messages"])]
            assert [echoed] == _rendered(ex, m), ex.where
            echoes += 1
    if path.name.startswith(("pydai-anthropic", "sdk-runtools", "pydai-chat")):
        assert echoes == len(replies) - 1


def test_anthropic_streams_agree_with_the_sdk_accumulator() -> None:
    from anthropic.lib.streaming._messages import accumulate_event

    def no_nulls(o: Any) -> Any:
        if isinstance(o, dict):
            return {k: no_nulls(v) for k, v in o.items() if v is not None}
        return [no_nulls(v) for v in o] if isinstance(o, list) else o

    streams = [ex.stream for p in corpus_files("anthropic-api") for ex in exchanges(p) if ex.stream]
    assert len(streams) == 5
    for events in streams:
        snapshot: Any = None
        buffers: dict[int, bytes] = {}
        for event in events:
            if event["type"] != "ping":
                snapshot = accumulate_event(
                    event=event, current_snapshot=snapshot, json_bufs=buffers
                )
        ours = no_nulls(assemble_anthropic_stream(events))
        ours.pop("context_management", None)  # the SDK's accumulator drops it
        assert ours == snapshot.to_dict(mode="json", exclude_none=True)


def test_anthropic_stream_details() -> None:
    path = corpus_file("anthropic-api", "vercel-anthropic-code-execution-prompt-cache.1.chunks.txt")
    (ex,) = exchanges(path)
    m, resp = _response_message(ex)
    assert m.usage == Usage(6, 198, 6289, 3337)  # message_delta's cumulative counts win
    assert resp["container"]["id"].startswith("container_")
    kinds = [b.payload["type"] if isinstance(b, OpaqueBlock) else b.type for b in m.content]
    assert kinds == [
        "server_tool_use",
        "bash_code_execution_tool_result",
        "server_tool_use",
        "bash_code_execution_tool_result",
        "text",
    ]
    assert m.content[0].payload["input"] == {  # type: ignore[union-attr]
        "command": 'for n in $(seq 1 12); do echo "$n: $((n*n))"; done'
    }
    path = corpus_file("anthropic-api", "vercel-anthropic-clear-thinking.1.chunks.txt")
    (ex,) = exchanges(path)
    m, resp = _response_message(ex)
    thinking = m.content[0]
    assert isinstance(thinking, ThinkingBlock) and thinking.signature
    assert thinking.signature.startswith("EvQBCkYICxgCKkAxhD4N")
    assert resp["context_management"] == {"applied_edits": []}
    assert m.extra["anthropic"]["response"]["context_management"] == {"applied_edits": []}


def test_chat_streams_agree_with_the_sdk_accumulator() -> None:
    from openai.lib.streaming.chat._completions import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk

    path = corpus_file("openai-api", "pydai-chat-stream-tool-call.yaml")
    for ex in exchanges(path):
        assert ex.stream is not None
        state = ChatCompletionStreamState()
        for chunk in ex.stream:
            state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
        sdk = state.get_final_completion().to_dict(mode="json", exclude_none=True)
        ours = assemble_openai_chat_stream(ex.stream)
        for call in sdk["choices"][0]["message"].get("tool_calls", []):
            del call["index"]  # a stream artifact the SDK keeps
        sdk_message = sdk["choices"][0]["message"]
        ours_message = {k: v for k, v in ours["choices"][0]["message"].items() if v is not None}
        assert ours_message == sdk_message
        assert ours["usage"] == sdk["usage"]
        assert ours["choices"][0]["finish_reason"] == sdk["choices"][0]["finish_reason"]


def test_responses_streams_rebuild_the_output_from_events() -> None:
    path = corpus_file("openai-api", "vercel-responses-reasoning-encrypted-content.1.chunks.txt")
    streams = exchanges(path)
    reasons = [_response_message(ex)[0].stop_reason for ex in streams]
    assert reasons == ["tool_use", "tool_use", "tool_use", "stop"]
    for ex in streams:
        assert ex.stream is not None
        final = ex.stream[-1]["response"]
        assert assemble_openai_responses_stream(ex.stream) == final
        # Without the final output, and without the output_item.done events, the deltas
        # alone give the same text, arguments and reasoning summaries.
        cut = [e for e in ex.stream if e["type"] != "response.output_item.done"]
        cut[-1] = {**cut[-1], "response": {**final, "output": []}}
        rebuilt = assemble_openai_responses_stream(cut)["output"]
        assert len(rebuilt) == len(final["output"])
        for got, want in zip(rebuilt, final["output"], strict=True):
            for key in ("type", "id", "call_id", "arguments", "summary", "content"):
                assert got.get(key) == want.get(key), key
    m = _response_message(streams[0])[0]
    assert [type(b) for b in m.content] == [ThinkingBlock, ToolCall]
    assert m.usage == Usage(134, 28, 0)


def test_responses_usage_takes_cached_tokens_out() -> None:
    path = corpus_file("openai-api", "pydai-responses-thinking-with-tool-calls.yaml")
    m, _ = _response_message(exchanges(path)[1])
    assert m.usage == Usage(2087 - 2048, 124, 2048, 0)
    assert m.usage.prompt_tokens == 2087


def test_responses_compaction_items_ride_opaque() -> None:
    path = corpus_file("openai-api", "pydai-responses-compact.yaml")
    compact, after = exchanges(path)[2:]
    assert compact.api == "compact" and compact.response is not None
    output = compact.response["output"]
    history = from_openai_responses(output)
    assert to_openai_responses(history) == output
    assert isinstance(history[-1], AssistantMessage)
    assert history[-1].content == (OpaqueBlock("openai_responses", output[-1]),)
    assert after.request is not None
    assert [type(m) for m in _request_round_trip(after)] == [AssistantMessage, UserMessage]


# ---------------------------------------------------------------------------------------
# Anthropic edge cases


def test_anthropic_parallel_results_split_and_rejoin() -> None:
    path = corpus_file("anthropic-api", "pydai-anthropic_multiple_parallel_tool_calls.yaml")
    history = _request_round_trip(exchanges(path)[1])
    results = [m for m in history if isinstance(m, ToolResultMessage)]
    assert [r.tool_name for r in results] == ["retrieve_entity_info"] * 4
    assert [r.content for r in results][3] == (
        TextBlock("daisy is bob's daughter and charlie's younger sister"),
    )
    assert len(to_anthropic(history)) == 3


def test_anthropic_mixed_user_message_round_trips() -> None:
    params = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "t1", "name": "read", "input": {"p": 1}},
                {"type": "tool_use", "id": "t2", "name": "ls", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "before"},
                {"type": "tool_result", "tool_use_id": "t1", "content": "one", "is_error": True},
                {"type": "tool_result", "tool_use_id": "t2", "is_error": False},
                {"type": "text", "text": "after", "cache_control": {"type": "ephemeral"}},
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t3"}]},
        {"role": "user", "content": [{"type": "text", "text": "lone list"}]},
    ]
    history = from_anthropic(params)
    assert [type(m).__name__ for m in history] == [
        "UserMessage",
        "AssistantMessage",
        "ToolResultMessage",
        "ToolResultMessage",
        "UserMessage",
        "ToolResultMessage",
        "UserMessage",
    ]
    one, two = history[2], history[3]
    assert isinstance(one, ToolResultMessage) and one.is_error and one.tool_name == "read"
    assert isinstance(two, ToolResultMessage) and two.content == () and not two.is_error
    assert history[4].content[1].extra == {"cache_control": {"type": "ephemeral"}}  # type: ignore[union-attr]
    # The API refuses text before a call's results (found by a hostile run, BG 1: read as
    # written, the results followed a user message and were left out as answering no call,
    # and the model was told its tools never ran): they go back first.
    mixed = params[2]["content"]
    assert to_anthropic(history) == [
        *params[:2],
        {"role": "user", "content": [*mixed[1:3], mixed[0], mixed[3]]},
        *params[3:],
    ]
    assert from_anthropic(to_anthropic(history)) == history
    assert repair(history)[2] == [Repair("orphan_result", 5, "t3", origin=5)]


def test_anthropic_blocks_it_does_not_model_ride_opaque() -> None:
    doc = {"type": "document", "source": {"type": "text", "data": "x", "media_type": "text/plain"}}
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "aGk="},
    }
    url = {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}
    odd = {"type": "image", "source": {"type": "file", "file_id": "f1"}}
    cited = {
        "type": "text",
        "text": "t",
        "citations": [{"type": "char_location", "cited_text": "t"}],
    }
    params = [
        {"role": "user", "content": [doc, image, url, odd, cited]},
        {
            "role": "assistant",
            "content": [
                {"type": "redacted_thinking", "data": "ENC"},
                {"type": "thinking", "thinking": "hm", "signature": "SIG"},
                {"type": "compaction", "content": "summary"},
                {"type": "server_tool_use", "id": "srv_1", "name": "web_search", "input": {}},
                {"type": "web_search_tool_result", "tool_use_id": "srv_1", "content": []},
                {"type": "text", "text": "ok", "citations": None},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t9",
                    "content": [{"type": "text", "text": "shot"}, image, doc],
                    "cache_control": {"type": "ephemeral", "ttl": "1h"},
                }
            ],
        },
    ]
    history = from_anthropic(params)
    user, assistant, result = history
    assert user.content[1] == ImageBlock("image/png", "aGk=")  # type: ignore[union-attr]
    assert user.content[2] == ImageBlock("", "https://x/y.png", "url")  # type: ignore[union-attr]
    assert user.content[3] == OpaqueBlock("anthropic", odd)  # type: ignore[union-attr]
    assert user.content[4].extra["citations"] == cited["citations"]  # type: ignore[union-attr]
    assert isinstance(assistant, AssistantMessage)
    assert assistant.content[:2] == (RedactedThinkingBlock("ENC"), ThinkingBlock("hm", "SIG"))
    assert [type(b) for b in assistant.content[2:5]] == [OpaqueBlock] * 3
    assert isinstance(result, ToolResultMessage) and result.tool_name is None
    assert result.extra["anthropic"]["block"] == {
        "cache_control": {"type": "ephemeral", "ttl": "1h"}
    }
    assert to_anthropic(history) == params


def test_anthropic_stop_reasons() -> None:
    def reason(raw: str | None) -> str | None:
        resp = {"content": [], "stop_reason": raw, "usage": {"input_tokens": 1}}
        return message_from_anthropic_response(resp).stop_reason

    assert [reason(r) for r in ("end_turn", "tool_use", "max_tokens")] == [
        "stop",
        "tool_use",
        "length",
    ]
    assert reason("model_context_window_exceeded") == "length"
    for kept in ("refusal", "pause_turn", "stop_sequence", "brand_new_reason"):
        assert reason(kept) == kept
    assert reason(None) is None


def _start(i: int, **block: Any) -> dict[str, Any]:
    return {"type": "content_block_start", "index": i, "content_block": block}


def _delta(i: int, kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": i, "delta": {"type": kind, **fields}}


def _stop(i: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": i}


def test_anthropic_stream_deltas_it_has_no_recording_of() -> None:
    events: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {"id": "m", "content": [], "usage": {"input_tokens": 5}},
        },
        _start(0, type="text", text=""),
        _delta(0, "text_delta", text="a"),
        _delta(0, "citations_delta", citation={"cited_text": "c"}),
        _stop(0),
        _start(1, type="compaction", content=None),
        _delta(1, "compaction_delta", content="sum"),
        _delta(1, "compaction_delta", content="mary", encrypted_content="E"),
        _stop(1),
        _start(2, type="tool_use", id="t", name="n", input={}),
        _delta(2, "input_json_delta", partial_json='{"a": '),
        _stop(2),
        {
            "type": "message_delta",
            "delta": {"stop_reason": "max_tokens"},
            "usage": {"output_tokens": 9},
        },
        {"type": "message_stop"},
    ]
    resp = assemble_anthropic_stream(events)
    assert resp["content"] == [
        {"type": "text", "text": "a", "citations": [{"cited_text": "c"}]},
        {"type": "compaction", "content": "summary", "encrypted_content": "E"},
        {"type": "tool_use", "id": "t", "name": "n", "input": {}},  # cut off: input stays {}
    ]
    m = message_from_anthropic_response(resp)
    assert m.stop_reason == "length" and m.usage == Usage(5, 9)
    with pytest.raises(UnsupportedMessageError, match="before message_start"):
        assemble_anthropic_stream(events[1:])
    with pytest.raises(UnsupportedMessageError, match="overloaded"):
        assemble_anthropic_stream([*events[:2], {"type": "error", "error": {"type": "overloaded"}}])


_START = {"type": "message_start", "message": {"id": "m", "role": "assistant", "content": []}}
_ITEM = {"type": "function_call", "id": "fc", "call_id": "c", "name": "f", "arguments": ""}
_ADDED = "response.output_item.added"


@pytest.mark.parametrize(
    ("assemble", "events"),
    [
        (
            assemble_anthropic_stream,
            [_START, {"type": "content_block_start", "index": 0, "content_block": "tool_use"}],
        ),
        (
            assemble_openai_responses_stream,
            [{"type": _ADDED, "output_index": 0, "item": "function_call"}],
        ),
        (
            assemble_openai_responses_stream,
            [
                {"type": _ADDED, "output_index": 0, "item": _ITEM},
                {"type": _ADDED, "output_index": "1", "item": _ITEM},
            ],
        ),
        (
            assemble_openai_responses_stream,
            [
                {"type": _ADDED, "output_index": None, "item": _ITEM},
                {"type": _ADDED, "output_index": 0, "item": _ITEM},
            ],
        ),
    ],
    ids=["block no object", "item no object", "index a string", "index null"],
)
def test_a_malformed_stream_event_is_an_unsupported_message(
    assemble: Callable[[list[dict[str, Any]]], Any], events: list[dict[str, Any]]
) -> None:
    """(Hostile run EA, 5) A part that is no object, or output indexes of no one type, raised
    a bare ValueError or TypeError where the docs promise `UnsupportedMessageError`."""
    with pytest.raises(UnsupportedMessageError, match="malformed"):
        assemble(events)


def test_anthropic_rejects_what_it_cannot_carry() -> None:
    with pytest.raises(UnsupportedMessageError) as err:
        from_anthropic([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}])
    assert err.value.index == 1 and "system" in err.value.kind
    with pytest.raises(UnsupportedMessageError) as err:
        from_anthropic([{"role": "user", "content": 3}])
    assert err.value.index == 0
    foreign = UserMessage((OpaqueBlock("openai_chat", {"type": "input_audio"}),))
    with pytest.raises(UnsupportedMessageError) as err:
        to_anthropic([UserMessage.of("a"), foreign])
    assert err.value.index == 1 and "openai_chat" in err.value.kind


def test_anthropic_summary_goes_as_a_user_message() -> None:
    sent = to_anthropic([SummaryMessage("what happened"), UserMessage.of("go on")])
    assert sent == [
        {"role": "user", "content": "what happened"},
        {"role": "user", "content": "go on"},
    ]


# ---------------------------------------------------------------------------------------
# OpenAI Chat edge cases


def test_chat_arguments_go_back_byte_for_byte_until_edited() -> None:
    raw = ['{"b": 1,  "a":"\\u00e9"}', '{"cut": "off', "[1, 2]", '{"x":1}']
    params = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": a}}
                for i, a in enumerate(raw)
            ],
        }
    ]
    (m,) = from_openai_chat(params)
    assert isinstance(m, AssistantMessage)
    calls = m.tool_calls
    assert [c.arguments for c in calls] == [{"b": 1, "a": "é"}, {}, {}, {"x": 1}]
    assert [c.extra.get("arguments") for c in calls] == [raw[0], raw[1], raw[2], None]
    assert to_openai_chat([m]) == params
    # Compaction rewrote the arguments (same extra): the stale string must not go out.
    edited = ToolCall("c0", "f", {"b": 1, "a": "[truncated]"}, calls[0].extra)
    sent = to_openai_chat([AssistantMessage((edited,))])
    assert sent[0]["tool_calls"][0]["function"]["arguments"] == '{"b":1,"a":"[truncated]"}'


def test_chat_message_forms_names_refusals_and_system_roles() -> None:
    params: list[dict[str, Any]] = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}], "name": "ann"},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk="}},
                {"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}},
                {"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}},
            ],
        },
        {"role": "assistant", "content": None, "refusal": "I can't.", "reasoning_content": "no"},
        {"role": "system", "content": "mid-history instruction"},
        {
            "role": "assistant",
            "content": [],
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"id": "c2", "type": "custom", "custom": {"name": "g", "input": "free text"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "r1"},
        {
            "role": "tool",
            "tool_call_id": "c2",
            "content": [{"type": "text", "text": "r2"}],
            "name": "g",
        },
        {"role": "assistant", "content": "done", "tool_calls": None},
    ]
    system, rest = split_openai_chat_system(params)
    assert system == params[:1]
    history = from_openai_chat(rest)
    assert to_openai_chat(history) == rest
    assert history[0].extra["openai_chat"] == {"content": "list", "fields": {"name": "ann"}}
    user2 = history[1]
    assert isinstance(user2, UserMessage)
    assert user2.content[0] == ImageBlock("image/png", "aGk=")
    assert user2.content[1] == ImageBlock(
        "", "https://x/y.png", "url", {"image_url": {"detail": "low"}}
    )
    assert isinstance(user2.content[2], OpaqueBlock)
    refusing = history[2]
    assert isinstance(refusing, AssistantMessage)
    assert refusing.content == (ThinkingBlock("no"), TextBlock("I can't.", {"refusal": True}))
    assert history[3].extra["openai_chat"]["role"] == "system"
    calls = history[4]
    assert isinstance(calls, AssistantMessage)
    assert calls.content[1] == ToolCall("c2", "g", {"input": "free text"}, {"type": "custom"})
    r1, r2 = history[5], history[6]
    assert isinstance(r1, ToolResultMessage) and r1.tool_name == "f"
    assert isinstance(r2, ToolResultMessage) and r2.tool_name == "g"


def test_chat_usage_and_finish_reasons() -> None:
    def message(reason: str, usage: dict[str, Any]) -> AssistantMessage:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": "x"},
            "finish_reason": reason,
        }
        return message_from_openai_chat_response({"choices": [choice], "usage": usage})

    m = message(
        "stop",
        {
            "prompt_tokens": 100,
            "completion_tokens": 5,
            "prompt_tokens_details": {"cached_tokens": 60},
        },
    )
    assert m.usage == Usage(40, 5, 60, 0) and m.stop_reason == "stop"
    litellm = {
        "prompt_tokens": 100,
        "completion_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": None},
        "cache_read_input_tokens": 30,
        "cache_creation_input_tokens": 20,
    }
    assert message("length", litellm).usage == Usage(50, 5, 30, 20)
    reasons = {
        r: message(r, {}).stop_reason for r in ("tool_calls", "length", "content_filter", "odd")
    }
    assert reasons == {
        "tool_calls": "tool_use",
        "length": "length",
        "content_filter": "refusal",
        "odd": "odd",
    }
    with pytest.raises(UnsupportedMessageError):
        message_from_openai_chat_response({"choices": []})


def test_chat_stream_with_parallel_calls_and_several_pieces() -> None:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": "x",
            "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    chunks = [
        chunk({"role": "assistant", "content": "Let "}),
        chunk({"content": "me."}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "a",
                        "type": "function",
                        "function": {"name": "f", "arguments": ""},
                    }
                ]
            }
        ),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "b",
                        "type": "function",
                        "function": {"name": "g", "arguments": "{}"},
                    }
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"q":'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}),
        chunk({}, "tool_calls"),
        {"id": "x", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3}},
    ]
    m = message_from_openai_chat_response(assemble_openai_chat_stream(chunks))
    assert m.content == (TextBlock("Let me."), ToolCall("a", "f", {"q": 1}), ToolCall("b", "g", {}))
    assert m.stop_reason == "tool_use" and m.usage == Usage(9, 3)


def test_chat_rejects_what_it_cannot_carry() -> None:
    with pytest.raises(UnsupportedMessageError) as err:
        from_openai_chat(
            [{"role": "user", "content": "a"}, {"role": "function", "name": "f", "content": "x"}]
        )
    assert err.value.index == 1 and "function" in err.value.kind
    with pytest.raises(UnsupportedMessageError) as err:
        from_openai_chat([{"role": "tool", "content": "x"}])
    assert err.value.index == 0
    with pytest.raises(UnsupportedMessageError) as err:
        to_openai_chat([UserMessage.of("a"), AssistantMessage((ThinkingBlock("t", "sig"),))])
    assert err.value.index == 1
    with pytest.raises(UnsupportedMessageError):
        to_openai_chat([AssistantMessage((RedactedThinkingBlock("x"),))])


# ---------------------------------------------------------------------------------------
# OpenAI Responses edge cases


def test_responses_function_calls_link_by_call_id_and_reasoning_goes_back_whole() -> None:
    path = corpus_file("openai-api", "pydai-responses-thinking-with-tool-calls.yaml")
    ex = exchanges(path)[1]
    assert ex.request is not None
    items = ex.request["input"]
    history = _request_round_trip(ex)
    user, assistant, result = history
    assert isinstance(assistant, AssistantMessage)
    thinking, call = assistant.content
    assert (
        isinstance(thinking, ThinkingBlock) and thinking.signature == items[1]["encrypted_content"]
    )
    assert thinking.thinking.startswith("**Creating a structured poem**")
    assert thinking.extra["id"] == items[1]["id"]
    assert isinstance(call, ToolCall) and call.id == items[2]["call_id"] != items[2]["id"]
    assert call.extra["id"] == items[2]["id"]
    assert isinstance(result, ToolResultMessage) and result.tool_call_id == call.id
    assert result.tool_name == "update_plan"
    # Reasoning rewritten by compaction: a fresh single summary, the same encrypted content.
    edited = ThinkingBlock("short", thinking.signature, thinking.extra)
    item, _ = to_openai_responses([AssistantMessage((edited, call))])
    assert item["summary"] == [{"type": "summary_text", "text": "short"}]
    assert item["encrypted_content"] == thinking.signature and item["id"] == items[1]["id"]


def test_responses_items_of_every_shape() -> None:
    items: list[dict[str, Any]] = [
        {"role": "system", "content": "sys"},
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "look"},
                {
                    "type": "input_image",
                    "image_url": "data:image/jpeg;base64,/9j/",
                    "detail": "auto",
                },
                {"type": "input_file", "file_id": "file_1"},
            ],
        },
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "ENC"},
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [
                {"type": "output_text", "text": "a", "annotations": []},
                {"type": "refusal", "refusal": "no"},
            ],
        },
        {"role": "assistant", "content": "plain"},
        {"type": "message", "role": "assistant", "content": []},
        {"type": "web_search_call", "id": "ws_1", "status": "completed"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{ }"},
        {
            "type": "function_call_output",
            "call_id": "c1",
            "output": [{"type": "input_text", "text": "r"}],
        },
        {"type": "item_reference", "id": "msg_0"},
        {"role": "developer", "content": "late"},
    ]
    system, rest = split_openai_responses_system(items)
    assert system == items[:1]
    history = from_openai_responses(rest)
    assert to_openai_responses(history) == rest
    user, assistant, result, reference, late = history
    assert isinstance(user, UserMessage) and user.content[1] == ImageBlock(
        "image/jpeg", "/9j/", extra={"detail": "auto"}
    )
    assert isinstance(assistant, AssistantMessage)
    redacted, text, refusal, plain, empty, search, call = assistant.content
    assert redacted == RedactedThinkingBlock("ENC", {"id": "rs_1"})
    assert text.extra["item"]["id"] == "msg_1" and refusal.extra["item"] == "continue"  # type: ignore[union-attr]
    assert refusal.extra["refusal"] is True  # type: ignore[union-attr]
    assert plain == TextBlock("plain")
    assert isinstance(empty, OpaqueBlock) and isinstance(search, OpaqueBlock)
    assert (
        isinstance(call, ToolCall) and call.arguments == {} and call.extra == {"arguments": "{ }"}
    )
    assert isinstance(result, ToolResultMessage) and result.tool_name == "f"
    assert isinstance(reference, AssistantMessage)  # unknown items ride in an assistant run
    assert late.extra["openai_responses"]["role"] == "developer"
    assert from_openai_responses("hi") == [UserMessage.of("hi")]
    with pytest.raises(UnsupportedMessageError) as err:
        from_openai_responses(
            [{"role": "user", "content": "a"}, {"role": "critic", "content": "b"}]
        )
    assert err.value.index == 1


def test_responses_stop_reasons() -> None:
    def reason(**resp: Any) -> str | None:
        return message_from_openai_response({"output": [], **resp}).stop_reason

    assert reason(status="completed") == "stop"
    assert (
        reason(status="incomplete", incomplete_details={"reason": "max_output_tokens"}) == "length"
    )
    assert reason(status="incomplete", incomplete_details={"reason": "content_filter"}) == "refusal"
    assert reason(status="failed") == "failed"
    refusal = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "refusal", "refusal": "no"}],
    }
    assert (
        message_from_openai_response({"output": [refusal], "status": "completed"}).stop_reason
        == "refusal"
    )


def test_responses_stream_cut_off_before_completion() -> None:
    def event(kind: str, at: int, **fields: Any) -> dict[str, Any]:
        return {"type": f"response.{kind}", "output_index": at, **fields}

    message = {"type": "message", "role": "assistant", "content": []}
    call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": ""}
    events = [
        {
            "type": "response.created",
            "response": {"id": "r", "status": "in_progress", "output": []},
        },
        event("output_item.added", 0, item=message),
        event("content_part.added", 0, content_index=0, part={"type": "output_text", "text": ""}),
        event("output_text.delta", 0, content_index=0, delta="Hel"),
        event("output_text.delta", 0, content_index=0, delta="lo"),
        event("output_item.added", 1, item=call),
        event("function_call_arguments.delta", 1, delta='{"a":1}'),
    ]
    resp = assemble_openai_responses_stream(events)
    assert resp["output"][0]["content"] == [{"type": "output_text", "text": "Hello"}]
    m = message_from_openai_response(resp)
    assert m.stop_reason == "in_progress"
    assert [b.text if isinstance(b, TextBlock) else b for b in m.content][0] == "Hello"
    assert m.tool_calls == (ToolCall("c", "f", {"a": 1}),)
    assert events[1]["item"]["content"] == []  # the caller's events are left alone
    with pytest.raises(UnsupportedMessageError):
        assemble_openai_responses_stream([*events, {"type": "error", "message": "boom"}])


def test_malformed_stream_events_name_the_stream() -> None:
    start = {"type": "message_start", "message": {"content": []}}
    bad_delta = {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "x"}}
    with pytest.raises(UnsupportedMessageError, match="malformed Anthropic stream"):
        assemble_anthropic_stream([start, bad_delta])
    with pytest.raises(UnsupportedMessageError, match="malformed Chat Completions stream"):
        assemble_openai_chat_stream([{"choices": [{"delta": {"tool_calls": [{"function": 3}]}}]}])
    with pytest.raises(UnsupportedMessageError, match="malformed Responses stream"):
        assemble_openai_responses_stream(
            [{"type": "response.output_item.added", "output_index": 0}]
        )


# ---------------------------------------------------------------------------------------
# Properties: from_x(to_x(h)) == h for generated neutral histories


_words = st.text(alphabet=st.sampled_from('ab \n{}"é字\\'), max_size=12)
_args = st.dictionaries(
    st.sampled_from(["path", "n", "flag", "items", "nested"]),
    st.one_of(
        _words,
        st.integers(-5, 10**12),
        st.booleans(),
        st.none(),
        st.lists(st.integers(0, 3), max_size=2),
        st.fixed_dictionaries({"k": _words}),
    ),
    max_size=3,
)
_b64 = st.sampled_from(["aGk=", "iVBORw0KGgo=", ""])


@dataclass(frozen=True)
class Format:
    name: str
    to: Callable[[list[Message]], list[dict[str, Any]]]
    back: Callable[[list[dict[str, Any]]], list[Message]]
    user: Callable[[st.DrawFn], tuple[Any, ...]]
    assistant: Callable[[st.DrawFn, list[ToolCall]], tuple[Any, ...]]
    result: Callable[[st.DrawFn], tuple[Any, ...]]
    is_error: bool = False


def _text(draw: st.DrawFn) -> TextBlock:
    return TextBlock(draw(_words))


def _image(draw: st.DrawFn) -> ImageBlock:
    if draw(st.booleans()):
        return ImageBlock(draw(st.sampled_from(["image/png", "image/jpeg"])), draw(_b64))
    return ImageBlock("", "https://example.com/" + draw(_words).replace("\\", ""), "url")


def _some(draw: st.DrawFn, *makers: Callable[[st.DrawFn], Any], most: int = 3) -> list[Any]:
    picks = draw(st.lists(st.sampled_from(makers), max_size=most))
    return [make(draw) for make in picks]


def _cached(draw: st.DrawFn) -> TextBlock:
    return TextBlock(draw(_words), {"cache_control": {"type": "ephemeral"}})


def _document(draw: st.DrawFn) -> OpaqueBlock:
    return OpaqueBlock("anthropic", {"type": "document", "title": draw(_words)})


def _signed(draw: st.DrawFn) -> ThinkingBlock:
    return ThinkingBlock(draw(_words), draw(_b64))


def _redacted(draw: st.DrawFn) -> RedactedThinkingBlock:
    return RedactedThinkingBlock(draw(_b64))


def _server_tool(draw: st.DrawFn) -> OpaqueBlock:
    payload = {"type": "server_tool_use", "id": "srv_" + draw(_words), "name": "x", "input": {}}
    return OpaqueBlock("anthropic", payload)


def _audio(draw: st.DrawFn) -> OpaqueBlock:
    part = {"type": "input_audio", "input_audio": {"data": draw(_b64), "format": "wav"}}
    return OpaqueBlock("openai_chat", part)


def _file(draw: st.DrawFn) -> OpaqueBlock:
    return OpaqueBlock("openai_responses", {"type": "input_file", "file_id": draw(_words)})


def _summary(draw: st.DrawFn) -> ThinkingBlock:
    # A reasoning item with an empty summary reads back as redacted: give it text.
    return ThinkingBlock(draw(_words.filter(bool)), draw(st.none() | _b64))


def _refusal(draw: st.DrawFn) -> TextBlock:
    return TextBlock(draw(_words), {"refusal": True})


def _search(draw: st.DrawFn) -> OpaqueBlock:
    item = {"type": "web_search_call", "id": "ws_" + draw(_words), "status": "completed"}
    return OpaqueBlock("openai_responses", item)


def _anthropic_assistant(draw: st.DrawFn, calls: list[ToolCall]) -> tuple[Any, ...]:
    blocks = _some(draw, _signed, _redacted, _text, _server_tool) + calls
    return tuple(draw(st.permutations(blocks)))


def _chat_assistant(draw: st.DrawFn, calls: list[ToolCall]) -> tuple[Any, ...]:
    # The order Chat Completions can express: reasoning, text, refusal, calls.
    blocks: list[Any] = [ThinkingBlock(draw(_words))] if draw(st.booleans()) else []
    blocks += _some(draw, _text)
    if draw(st.booleans()):
        blocks.append(_refusal(draw))
    return (*blocks, *calls)


def _responses_assistant(draw: st.DrawFn, calls: list[ToolCall]) -> tuple[Any, ...]:
    blocks = _some(draw, _summary, _redacted, _text, _refusal, _search) + calls
    blocks = draw(st.permutations(blocks))
    # An empty run of items would vanish, and reasoning needs an item the model made after
    # it (the API refuses it without one; `to_openai_responses` leaves it out).
    if not blocks or isinstance(blocks[-1], ThinkingBlock | RedactedThinkingBlock):
        blocks.append(_text(draw))
    return tuple(blocks)


def _results(*makers: Callable[[st.DrawFn], Any]) -> Callable[[st.DrawFn], tuple[Any, ...]]:
    return lambda draw: tuple(_some(draw, *makers))


FORMATS = [
    Format(
        "anthropic",
        to_anthropic,
        from_anthropic,
        _results(_text, _text, _cached, _image, _document),
        _anthropic_assistant,
        _results(_text, _image),
        is_error=True,
    ),
    Format(
        "openai_chat",
        to_openai_chat,
        from_openai_chat,
        _results(_text, _image, _audio),
        _chat_assistant,
        _results(_text),
    ),
    Format(
        "openai_responses",
        to_openai_responses,
        from_openai_responses,
        _results(_text, _image, _file),
        _responses_assistant,
        _results(_text, _image),
    ),
]


@st.composite
def histories(draw: st.DrawFn, fmt: Format) -> list[Message]:
    """User turns, assistant turns with parallel calls, results in call order."""
    history: list[Message] = [UserMessage(fmt.user(draw))]
    for turn in range(draw(st.integers(0, 5))):
        width = draw(st.integers(0, 3))
        names = draw(
            st.lists(st.sampled_from(["read", "bash", "edit"]), min_size=width, max_size=width)
        )
        calls = [ToolCall(f"call_{turn}_{k}", name, draw(_args)) for k, name in enumerate(names)]
        history.append(AssistantMessage(fmt.assistant(draw, calls)))
        for c in calls:
            content = fmt.result(draw)
            # A failed tool's blank output is no request Anthropic takes (it is repaired).
            blank = all(isinstance(b, TextBlock) and not b.text.strip() for b in content)
            error = fmt.is_error and not blank and draw(st.booleans())
            history.append(ToolResultMessage(c.id, content, c.name, error))
        if not calls or draw(st.booleans()):  # never two assistant messages in a row
            history.append(UserMessage(fmt.user(draw)))
    return history


_property = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_neutral_histories_round_trip(fmt: Format) -> None:
    @_property
    @given(histories(fmt))
    def check(history: list[Message]) -> None:
        sent = fmt.to(history)
        json.dumps(sent)  # what goes out is plain JSON
        assert fmt.back(sent) == history
        assert fmt.to(fmt.back(sent)) == sent
        assert [to_dict(m) for m in fmt.back(sent)] == [to_dict(m) for m in history]

    check()


_KEYS = (
    "role content type text tool_use_id tool_call_id is_error id name input source media_type "
    "data url signature thinking tool_calls function arguments call_id output summary "
    "encrypted_content refusal image_url reasoning_content cache_control detail"
)
_VALUES = (
    "user assistant tool system text image tool_use tool_result thinking base64 url function "
    "function_call function_call_output reasoning message input_text output_text input_image "
    "summary_text refusal image_url image/png data:image/png;base64,aGk= {} [] x"
)
_keys = st.sampled_from(_KEYS.split())
_values = st.sampled_from([*_VALUES.split(), ""])
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 2) | _values,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_keys, inner, max_size=4),
    max_leaves=20,
)
_block = st.builds(
    lambda t, more: {**more, "type": t}, _values, st.dictionaries(_keys, _json, max_size=4)
)
_message = st.builds(
    lambda role, content, more: {**more, "role": role, "content": content},
    st.sampled_from(["user", "assistant", "tool", "developer"]),
    st.none() | _values | st.lists(_block, max_size=4),
    st.dictionaries(_keys, _json, max_size=3),
)


@pytest.mark.parametrize(
    ("to", "back", "items"),
    [
        (to_anthropic, from_anthropic, _message),
        (to_openai_chat, from_openai_chat, _message),
        (to_openai_responses, from_openai_responses, _message | _block),
    ],
    ids=["anthropic", "openai_chat", "openai_responses"],
)
def test_whatever_is_accepted_goes_back_exactly(
    to: Callable[[list[Message]], list[dict[str, Any]]],
    back: Callable[[list[dict[str, Any]]], list[Message]],
    items: st.SearchStrategy[dict[str, Any]],
) -> None:
    """Odd shapes either raise UnsupportedMessageError or round trip exactly, never half; a
    shape the API refuses that the adapter repairs goes back repaired, and that round trips."""

    @_property
    @given(st.lists(items, max_size=5))
    def check(params: list[dict[str, Any]]) -> None:
        try:
            history = back(params)
        except UnsupportedMessageError:
            return
        sent = to(history)
        if _repaired_by_the_adapters(params):
            assert to(back(sent)) == sent
            return
        assert sent == params
        assert back(to(history)) == history

    check()


def _repaired_by_the_adapters(params: list[dict[str, Any]]) -> bool:
    """Whether ``params`` holds a shape the API refuses and an adapter repairs: an empty
    ``tool_calls`` array (Chat), a failed tool's result with no output or results after
    other blocks, a request ending in thinking (Anthropic), reasoning with no item the model
    made after it (Responses)."""
    last = params[-1] if params else {}
    ending = last.get("content")
    if (
        last.get("role") == "assistant"
        and isinstance(ending, list)
        and ending
        and isinstance(ending[-1], dict)
        and ending[-1].get("type") in ("thinking", "redacted_thinking")
    ):
        return True
    for k, message in enumerate(params):
        if message.get("tool_calls") == []:
            return True
        if message.get("type") == "reasoning":
            after = params[k + 1] if k + 1 < len(params) else {}
            kind = after.get("type", "message")
            if kind in ("function_call_output", "custom_tool_call_output") or (
                kind == "message" and after.get("role") != "assistant"
            ):
                return True
        content = message.get("content")
        blocks = content if isinstance(content, list) else []
        results = [
            isinstance(b, dict)
            and b.get("type") == "tool_result"
            and isinstance(b.get("tool_use_id"), str)
            for b in blocks
        ]
        if message.get("role") == "user" and results != sorted(results, reverse=True):
            return True
        for block in blocks:
            failed = isinstance(block, dict) and block.get("is_error") is True
            if (
                failed
                and block.get("type") == "tool_result"
                and _blank_output(block.get("content"))
            ):
                return True
    return False


def _blank_output(content: object) -> bool:
    if content is None or isinstance(content, str):
        return not (content or "").strip()
    if isinstance(content, list):
        return all(
            isinstance(b, dict) and b.get("type") == "text" and not str(b.get("text", "")).strip()
            for b in content
        )
    return False


def test_adapters_import_without_the_vendor_sdks() -> None:
    code = (
        "import sys; sys.modules['anthropic'] = None; sys.modules['openai'] = None\n"
        "import agentctx.adapters.anthropic, agentctx.adapters.openai_chat\n"
        "import agentctx.adapters.openai_responses, agentctx.adapters\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_responses_custom_tool_calls_pair_with_their_outputs_as_function_calls_do() -> None:
    """Found by a hostile run with the OpenAI Agents SDK, which sends a turn's function call
    outputs first and its custom tool outputs after them: a custom output rode opaque in an
    assistant message of its own, which compaction kept while dropping its call's."""
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "patch it"},
        {"type": "function_call", "call_id": "fc1", "name": "read", "arguments": '{"p": 1}'},
        {
            "type": "custom_tool_call",
            "id": "ctc_1",
            "call_id": "ct1",
            "name": "apply_patch",
            "input": "*** Begin Patch\n+x\n",
        },
        {"type": "function_call_output", "call_id": "fc1", "output": "contents"},
        {"type": "custom_tool_call_output", "call_id": "ct1", "output": "patched"},
        {"role": "assistant", "content": "done"},
    ]
    history = from_openai_responses(items)
    assert to_openai_responses(history) == items
    _, calls, read, patched, _ = history
    assert isinstance(calls, AssistantMessage)
    assert [(c.id, c.name) for c in calls.tool_calls] == [("fc1", "read"), ("ct1", "apply_patch")]
    assert calls.tool_calls[1].arguments == {"input": "*** Begin Patch\n+x\n"}
    assert isinstance(read, ToolResultMessage) and isinstance(patched, ToolResultMessage)
    assert (patched.tool_call_id, patched.tool_name) == ("ct1", "apply_patch")
    # What compaction makes of them goes back in the same item types.
    cleared = ToolCall("ct1", "apply_patch", {"input": "[cleared]"}, calls.tool_calls[1].extra)
    (item,) = to_openai_responses([AssistantMessage((cleared,))])
    assert item == {**items[2], "input": "[cleared]"}
    short = ToolResultMessage("ct1", (TextBlock("[cleared]"),), "apply_patch", extra=patched.extra)
    assert to_openai_responses([short]) == [{**items[4], "output": "[cleared]"}]


def test_chat_custom_tool_calls_pair_with_their_tool_messages() -> None:
    """Found by the hostile run: an assistant's ``{"type": "custom"}`` call rode opaque, so
    its tool message answered no call and was left out of every view (the output lost, and
    a call the API refuses without its tool message)."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "list the files"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "custom", "custom": {"name": "shell", "input": "ls"}},
                {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.py b.py"},
        {"role": "tool", "tool_call_id": "c2", "content": "ok"},
    ]
    history = from_openai_chat(messages)
    assert to_openai_chat(history) == messages
    calls = history[1]
    assert isinstance(calls, AssistantMessage)
    assert [(c.id, c.name, dict(c.arguments)) for c in calls.tool_calls][0] == (
        "c1",
        "shell",
        {"input": "ls"},
    )
    repaired, _, repairs = repair(history)
    assert repaired == history and not repairs  # nothing left out
    assert validate_chat({"model": "m", "messages": messages}) is None
    assert validate_chat({"model": "m", "messages": messages[:2]}) is not None
    # What compaction makes of the call goes back as a custom call.
    cleared = ToolCall("c1", "shell", {"input": "[cleared]"}, calls.tool_calls[0].extra)
    (sent,) = to_openai_chat([AssistantMessage((cleared,))])
    assert sent["tool_calls"] == [
        {**messages[1]["tool_calls"][0], "custom": {"name": "shell", "input": "[cleared]"}}
    ]


def _anthropic_request(result: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """The messages and the body of a request whose one call (id ``t1``) has ``result``."""
    call = {"type": "tool_use", "id": "t1", "name": "sh", "input": {}}
    params = [
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [result]},
    ]
    tools = [{"name": "sh", "input_schema": {"type": "object"}}]
    return params, {"model": "m", "max_tokens": 10, "tools": tools, "messages": params}


@pytest.mark.parametrize(
    "content",
    [{"content": ""}, {}, {"content": []}, {"content": [{"type": "text", "text": " "}]}]
    + [{"content": [{"type": "text", "text": ""}, {"type": "text", "text": "\n"}]}],
    ids=["empty string", "absent", "empty list", "blank block", "two blank blocks"],
)
async def test_a_failed_tool_without_output_goes_back_saying_so(content: dict[str, Any]) -> None:
    """Found by hostile testing (run AC, finding 1): a tool that failed without output (a
    killed command) went to Anthropic as a tool_result with is_error and blank content, which
    the API refuses ("content cannot be empty if `is_error` is true"): every later request of
    the session failed. A view's repair now has it say so (`empty_error`, reported), and so
    does the adapter given it unrepaired; the fake server refuses the original."""
    from agentctx.boundaries import FAILED_WITHOUT_OUTPUT
    from agentctx.events import TranscriptRepaired
    from agentctx.testing._validate import validate_anthropic

    failed = {"type": "tool_result", "tool_use_id": "t1", "is_error": True, **content}
    params, body = _anthropic_request(failed)
    refused = validate_anthropic(body)
    assert refused is not None
    if failed.get("content") in ("", None, []):  # else blank blocks are refused first
        assert refused.message.endswith("content cannot be empty if `is_error` is true")
    events: list[object] = []
    async with ContextManager(Budget(context_window=50_000)) as ctx:
        ctx.subscribe(events.append)
        view = await ctx.prepare(from_anthropic(params))
    repaired = [e.repairs for e in events if isinstance(e, TranscriptRepaired)]
    assert repaired == [("empty_error@2:t1",)]
    for sent in (to_anthropic(view), to_anthropic(from_anthropic(params))):
        said = sent[2]["content"][0]
        assert said["is_error"] is True
        text = said["content"] if isinstance(said["content"], str) else said["content"][0]["text"]
        assert text == FAILED_WITHOUT_OUTPUT  # in the form the caller used, where it can be
        assert validate_anthropic({**body, "messages": sent}) is None
    # Blank output of a tool that did not fail is the API's to take, and goes as it was.
    ok = {**failed, "is_error": False, "content": ""}
    assert to_anthropic(from_anthropic([*params[:2], {"role": "user", "content": [ok]}]))[2] == {
        "role": "user",
        "content": [ok],
    }


def test_an_empty_tool_calls_array_is_left_out_and_refused_by_the_fake_server() -> None:
    """Found by hostile testing (run AC, finding 3): an assistant message with
    ``"tool_calls": []`` (vLLM, Azure and older openai-node helpers return one) went back as
    it was, and OpenAI refuses it ("empty array. Expected an array with minimum length 1"),
    even after a repair filled the message's blank content. A null one goes back as it was."""
    history = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "Hi!", "tool_calls": []},
        {"role": "user", "content": "list the files"},
        {"role": "assistant", "content": "", "tool_calls": []},
        {"role": "user", "content": "and now?"},
        {"role": "assistant", "content": "Done.", "tool_calls": None},
        {"role": "user", "content": "thanks"},
    ]
    refused = validate_chat({"model": "gpt-4o", "messages": history})
    assert refused is not None and refused.code == "empty_array"
    sent = to_openai_chat(repair(from_openai_chat(history))[0])
    assert sent[1] == {"role": "assistant", "content": "Hi!"}
    assert sent[3] == {"role": "assistant", "content": EMPTY_TEXT}
    assert sent[5] == history[5]
    assert validate_chat({"model": "gpt-4o", "messages": sent}) is None


def test_a_tool_result_of_one_blank_block_goes_back_as_a_string_the_api_takes() -> None:
    """Found by hostile testing: the round trip changed such a result without saying so. It
    is a documented repair: the API refuses the list form (a whitespace-only text block) and
    takes the string."""
    from agentctx.testing._validate import validate_anthropic

    blank = {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": " "}]}
    params, body = _anthropic_request(blank)
    assert validate_anthropic(body) is not None  # refused as it is
    sent = to_anthropic(from_anthropic(params))
    assert sent[2]["content"][0]["content"] == " "
    assert validate_anthropic({**body, "messages": sent}) is None


def test_a_blank_answer_after_reasoning_is_filled_keeping_its_item() -> None:
    """Found by a hostile run (AC, finding 5): the ``(empty)`` fill of a blank text block
    beside reasoning made a bare block, so a Responses message item after a reasoning item
    went back as an easy message, its id and status lost (the item the reasoning item needs
    after it, by id)."""
    items = [
        {"role": "user", "content": "task"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "abc"},
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "", "annotations": []}],
        },
        {"role": "user", "content": "next"},
    ]
    view, _, repairs = repair(from_openai_responses(items))
    assert [r.kind for r in repairs] == ["empty_text"]
    sent = to_openai_responses(view)
    assert sent[:2] == items[:2] and sent[3] == items[3]
    filled = items[2]["content"][0]  # type: ignore[index]
    assert sent[2] == {**items[2], "content": [{**filled, "text": EMPTY_TEXT}]}


def test_a_streamed_custom_tool_call_is_assembled_with_its_name_and_input() -> None:
    """Found by a hostile run (AC, finding 6): the stream assembler joined only ``function``
    deltas, so a custom tool's call came out with an empty ``function`` and no ``custom``:
    its name and input lost, and sent back it was refused ("Missing required parameter")."""
    from agentctx.adapters import assemble_openai_chat_stream, message_from_openai_chat_response

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": "c", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    pieces = [
        {"index": 0, "id": "call_1", "type": "custom", "custom": {"name": "apply_patch"}},
        {"index": 0, "custom": {"input": "*** Begin Patch\n"}},
        {"index": 0, "custom": {"input": "*** End Patch"}},
        {"index": 1, "id": "call_2", "type": "function", "function": {"name": "ls"}},
        {"index": 1, "function": {"arguments": '{"path": '}},
        {"index": 1, "function": {"arguments": '"."}'}},
    ]
    stream = [chunk({"role": "assistant"})] + [chunk({"tool_calls": [p]}) for p in pieces]
    response = assemble_openai_chat_stream([*stream, chunk({}, "tool_calls")])
    patch = {"name": "apply_patch", "input": "*** Begin Patch\n*** End Patch"}
    ls = {"name": "ls", "arguments": '{"path": "."}'}
    assert response["choices"][0]["message"]["tool_calls"] == [
        {"id": "call_1", "type": "custom", "custom": patch},
        {"id": "call_2", "type": "function", "function": ls},
    ]
    (sent,) = to_openai_chat([message_from_openai_chat_response(response)])
    assert [c.get("custom") or c.get("function") for c in sent["tool_calls"]] == [patch, ls]
    results = [{"role": "tool", "tool_call_id": f"call_{k}", "content": "ok"} for k in (1, 2)]
    body = {"model": "m", "messages": [{"role": "user", "content": "go"}, sent, *results]}
    assert validate_chat(body) is None


def computer_call(n: int) -> dict[str, Any]:
    """A Responses ``computer_call`` item (a screenshot), call id ``c{n}``."""
    return {
        "type": "computer_call",
        "id": f"cu_{n}",
        "call_id": f"c{n}",
        "action": {"type": "screenshot"},
        "pending_safety_checks": [],
        "status": "completed",
    }


async def test_a_built_in_tools_output_is_never_sent_without_its_call() -> None:
    """Found by a hostile run (AC, finding 2): in a step calling a function and the computer
    tool at once, the computer output follows the function output, so it opens the next
    message with the step's answer; compaction kept that message and dropped the step, and
    the output went without its call (the API pairs every ``*_call_output`` by call_id)."""
    log = "\\n".join(f"line {i}: " + "x" * 80 for i in range(300))
    screenshot = {"type": "computer_screenshot", "image_url": "data:image/png;base64,iVBORw0KGgo="}

    def step(n: int) -> list[dict[str, Any]]:
        return [
            {"type": "function_call", "call_id": f"f{n}", "name": "read_log", "arguments": "{}"},
            computer_call(n),
            {"type": "function_call_output", "call_id": f"f{n}", "output": log},
            {"type": "computer_call_output", "call_id": f"c{n}", "output": screenshot},
            {"role": "assistant", "content": f"checked step {n}"},
            {"role": "user", "content": f"continue with step {n + 1}"},
        ]

    items: list[dict[str, Any]] = [{"role": "user", "content": "Check the dashboard and logs."}]
    for n in range(4):
        items += step(n)
    assert to_openai_responses(from_openai_responses(items)) == items
    async with ContextManager(Budget(context_window=12_000, reserve_output=1_000)) as ctx:
        view = await ctx.prepare(from_openai_responses(items))
    sent = to_openai_responses(view)
    calls = {i["call_id"] for i in sent if i.get("type") == "computer_call"}
    outputs = [i["call_id"] for i in sent if i.get("type") == "computer_call_output"]
    assert outputs and set(outputs) <= calls
    assert len(sent) < len(items)  # compaction dropped steps, the calls with them
    assert validate_responses({"model": "m", "input": sent}, sent) is None
    orphan = [items[0], step(0)[3]]
    refused = validate_responses({"model": "m", "input": orphan}, orphan)
    assert refused is not None and "No tool call found for computer call output" in refused.message


async def test_a_built_in_tools_call_is_never_sent_without_its_output() -> None:
    """Found by a hostile run (CB 1): the other way round. With signed reasoning in each
    step (kept whole while its loop runs), compaction dropped the message holding a computer
    output, placed after a function output, and kept its call: the API refuses a computer
    call without its output. Through the real SDK, to a server that refuses it as the API
    does (it checked outputs against calls only)."""
    import openai

    from agentctx.providers.openai import wrap
    from agentctx.testing._validate import sign
    from agentctx.testing.servers import FakeOpenAI, Reply

    def step(t: int) -> list[dict[str, Any]]:
        encrypted = f"fake:r{t}." + sign(f"r{t}")
        shot = {"type": "computer_screenshot", "image_url": "data:image/png;base64," + "A" * 3000}
        return [
            {"type": "reasoning", "id": f"rs_{t}", "summary": [], "encrypted_content": encrypted},
            {"type": "function_call", "call_id": f"f{t}", "name": "read", "arguments": "{}"},
            computer_call(t),
            {"type": "function_call_output", "call_id": f"f{t}", "output": "x" * 12_000},
            {"type": "computer_call_output", "call_id": f"c{t}", "output": shot},
        ]

    history = [{"role": "user", "content": "task"}, *step(0), *step(1), *step(2)]
    unanswered = [{"role": "user", "content": "task"}, *step(0)[:3], step(0)[3]]
    refused = validate_responses({"model": "m", "input": unanswered}, unanswered)
    assert refused is not None and "No tool output found for computer call c0" in refused.message
    async with FakeOpenAI([Reply.text("ok")]) as server:
        async with (
            ContextManager(Budget(context_window=8_000, reserve_output=1_000)) as ctx,
            openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0) as raw,
        ):
            client = wrap(raw, ctx)
            await client.responses.create(model="m", input=history, store=False)  # type: ignore[arg-type]
        (request,) = server.requests
    assert request.status == 200
    sent = request.json["input"]
    assert len(sent) < len(history)  # compaction dropped what it could
    calls = {i["call_id"] for i in sent if i.get("type") == "computer_call"}
    outputs = {i["call_id"] for i in sent if i.get("type") == "computer_call_output"}
    assert calls == outputs


async def test_a_local_shell_output_typed_by_the_sdk_keeps_its_call() -> None:
    """The SDK types ``local_shell_call_output`` with an ``id`` and no ``call_id`` (the API
    documents ``id`` as the call's). The call was paired by ``call_id`` alone, read as
    unanswered and left out of every request, its output sent answering nothing, with no
    event (found by a hostile run)."""
    from agentctx.providers.middleware import as_middleware

    call = {
        "type": "local_shell_call",
        "id": "lsh_1",
        "call_id": "call_1",
        "action": {"type": "exec", "command": ["ls"], "env": {}},
        "status": "completed",
    }
    output = {"type": "local_shell_call_output", "id": "call_1", "output": "a.py\nb.py"}
    history = [{"role": "user", "content": "list the files"}, call, output]
    assert to_openai_responses(from_openai_responses(history)) == history
    sent: dict[str, Any] = {}

    async def call_next(request: dict[str, Any]) -> dict[str, Any]:
        sent.update(request)
        return {"usage": {"input_tokens": 10, "output_tokens": 1}}

    async with ContextManager(Budget(context_window=100_000, reserve_output=1_000)) as ctx:
        await as_middleware(ctx, "openai-responses")({"model": "m", "input": history}, call_next)
    assert sent["input"] == history
    assert validate_responses({"model": "m", "input": history}, history) is None
    # The validator pairs them the same way: either alone is refused, as the API does.
    for alone in ([history[0], call], [history[0], output]):
        assert validate_responses({"model": "m", "input": alone}, alone) is not None
    # An output before its call answers nothing (found by a hostile run): both are left out,
    # where the call was kept, its output counted as answering it, and the input refused.
    backwards = [history[0], output, call]
    sent_back = to_openai_responses(from_openai_responses(backwards))
    assert sent_back == [history[0]]


@pytest.mark.parametrize(
    "output",
    [
        {"type": "function_call_output", "call_id": "call_1", "output": "18C, sunny"},
        {"type": "computer_call_output", "call_id": "call_cu1", "output": {"type": "x"}},
    ],
)
def test_an_output_whose_call_is_an_item_reference_is_refused(output: dict[str, Any]) -> None:
    """The call is stored server-side: which one the output answers is not known, so it could
    not be kept with its call. It was left out, as an orphan result or with no word at all,
    and the request went without it (found by a hostile run)."""
    items = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "item_reference", "id": "fc_abc123"},
        output,
    ]
    with pytest.raises(UnsupportedMessageError, match="item_reference") as refused:
        from_openai_responses(items)
    assert refused.value.index == 2


def test_an_item_reference_beside_calls_in_the_input_converts() -> None:
    items = [
        {"role": "user", "content": "Read a.py"},
        {"type": "item_reference", "id": "rs_1"},  # a stored reasoning item
        {"type": "function_call", "call_id": "call_1", "name": "read", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "print(1)"},
    ]
    assert to_openai_responses(from_openai_responses(items)) == items


async def test_an_earlier_spoken_answer_goes_back_by_its_audio_id_unrepaired() -> None:
    """OpenAI's audio guide sends an earlier spoken answer back as ``{"role": "assistant",
    "audio": {"id": ...}}``. With no content blocks, the empty-message repair filled in
    "(empty)" beside it: the model was told its answer said "(empty)" (a hostile run)."""
    history = [
        {"role": "user", "content": "Is a golden retriever a good family dog?"},
        {"role": "assistant", "audio": {"id": "audio_abc123"}},
        {"role": "user", "content": "Why do you say they are loyal?"},
    ]
    messages = from_openai_chat(history)
    assert to_openai_chat(messages) == history
    async with ContextManager(Budget(context_window=50_000)) as ctx:
        sent = to_openai_chat(await ctx.prepare(messages))
    assert sent == history
    assert validate_chat({"model": "gpt-audio", "messages": sent}) is None
    assert validate_chat({"model": "gpt-audio", "messages": [history[0], {"role": "assistant"}]})


def _shell_loop(steps: int) -> list[dict[str, Any]]:
    listing = "\n".join(f"drwxr-xr-x  file_{n}.txt " + "x" * 60 for n in range(250))
    items: list[dict[str, Any]] = [{"role": "user", "content": "Clean up the repo"}]
    for i in range(steps):
        items.append(
            {
                "type": "shell_call",
                "id": f"sh_{i}",
                "call_id": f"call_{i}",
                "action": {"commands": ["ls -la"]},
                "status": "completed",
            }
        )
        outcome = {"type": "exit", "exit_code": 0}
        output = [{"stdout": listing, "stderr": "", "outcome": outcome}]
        items.append({"type": "shell_call_output", "call_id": f"call_{i}", "output": output})
    return items


async def test_a_loop_of_built_in_client_tools_compacts_as_a_loop_of_function_calls() -> None:
    """A built-in tool's call and output (``shell_call``, ``computer_call``, ...) are provider
    items: every run of them was one assistant message with no call, the newest turn's
    answer, which no compaction touches. A long loop of them could never be compacted
    (`BudgetExceededError` at 84k against 56k; found by a hostile run). Each call with its
    output is now a step of its own (`TOOL_STEP`)."""
    from agentctx.messages import TOOL_STEP
    from agentctx.recall import MemoryRecallStore

    items = _shell_loop(12)
    history = from_openai_responses(items)
    assert to_openai_responses(history) == items
    assert len(history) == 13 and all(m.extra.get(TOOL_STEP) for m in history[1:])
    budget = Budget(context_window=60_000, reserve_output=4_000)
    async with ContextManager(budget, recall=MemoryRecallStore()) as ctx:
        sent = to_openai_responses(await ctx.prepare(history))
        assert ctx.prompt_tokens <= budget.limit
    assert sent[0] == items[0] and sent[-3:] == items[-3:]  # the task, the newest step
    assert validate_responses({"model": "gpt-5", "input": sent}, sent) is None
    # An answer after them is the turn's answer, as ever.
    answer = {"role": "assistant", "content": "Done."}
    assert not from_openai_responses([*items, answer])[-1].extra.get(TOOL_STEP)


_SHOT = {"type": "computer_screenshot", "image_url": "data:image/png;base64,iVBORw0KGgo="}


@pytest.mark.parametrize(
    "items",
    [
        [
            {"type": "item_reference", "id": "resp_item_1"},
            {"type": "function_call", "call_id": "call_B", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_B", "output": "ok"},
            {"type": "computer_call_output", "call_id": "call_A", "output": _SHOT},
        ],
        [
            {"type": "item_reference", "id": "resp_item_1"},
            {"type": "computer_call", "call_id": "call_A", "action": {"type": "screenshot"}},
            {"type": "computer_call_output", "call_id": "call_A", "output": _SHOT},
            {"type": "function_call_output", "call_id": "call_B", "output": "ok"},
        ],
    ],
    ids=["another output between", "a built-in step between"],
)
def test_an_output_a_reference_may_stand_for_is_refused_past_other_items(
    items: list[dict[str, Any]],
) -> None:
    """The refusal looked only at the run of items the output ended: another call's output or
    a built-in step between the reference and it, and the output was left out, unsaid or as
    an orphan (found by a hostile run)."""
    with pytest.raises(UnsupportedMessageError, match="item_reference") as refused:
        from_openai_responses([{"role": "user", "content": "go"}, *items])
    assert refused.value.index == 4


def test_a_built_in_calls_id_is_no_tool_name_and_answers_no_function_output() -> None:
    """Built-in calls were kept beside the calls' tool names: an output answering no function
    call but sharing a built-in call's id took its item type as tool name, and passed for
    answered after a reference (a hostile run)."""
    items = [
        {"role": "user", "content": "go"},
        {"type": "shell_call", "call_id": "call_1", "action": {"commands": ["ls"]}},
        {"type": "shell_call_output", "call_id": "call_1", "output": []},
        {"type": "function_call_output", "call_id": "call_1", "output": "x"},
    ]
    result = from_openai_responses(items)[-1]
    assert isinstance(result, ToolResultMessage) and result.tool_name is None
    with pytest.raises(UnsupportedMessageError, match="item_reference"):
        from_openai_responses([items[0], {"type": "item_reference", "id": "r"}, *items[1:]])


@pytest.mark.parametrize(
    ("convert", "call", "answer"),
    [
        (
            from_anthropic,
            {"type": "tool_use", "id": "toolu_n", "name": "f", "input": "not-an-object"},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_n"}]},
        ),
        (
            from_anthropic,
            {"type": "tool_use", "id": 7, "name": "f", "input": {}},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "7"}]},
        ),
        (
            from_openai_chat,
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}},
            {"role": "tool", "tool_call_id": "c1", "content": "out"},
        ),
        (
            from_openai_chat,
            {"id": "c1", "type": "custom", "custom": {"name": "f", "input": None}},
            {"role": "tool", "tool_call_id": "c1", "content": "out"},
        ),
    ],
)
def test_a_call_the_api_refuses_is_refused_not_its_result_dropped(
    convert: Callable[[list[dict[str, Any]]], Any], call: dict[str, Any], answer: dict[str, Any]
) -> None:
    """Found by a hostile run (CB 2): a call whose input was not an object (or whose
    arguments were not a string) rode as an opaque block, so its result answered no call: it
    was dropped as an `orphan_result` (the tool's real output, under a false label), and the
    request kept the call, which the API refuses either way. It is refused, at its index."""
    if convert is from_anthropic:
        reply: dict[str, Any] = {"role": "assistant", "content": [call]}
    else:
        reply = {"role": "assistant", "content": None, "tool_calls": [call]}
    with pytest.raises(UnsupportedMessageError, match="tool") as refused:
        convert([{"role": "user", "content": "go"}, reply, answer])
    assert refused.value.index == 1


async def test_a_chat_call_with_no_type_keeps_its_result_and_goes_back_typed() -> None:
    """Found by a hostile run (CX 1): some compatible servers (Azure AI Inference) return a
    function call without ``"type"``. It rode opaque, so its tool message answered no call:
    the repair dropped the tool's output as an orphan and the request kept the call, which
    every server that checks calls are answered refuses. It is now a function call, sent back
    with the type the API requires."""
    history = [
        {"role": "user", "content": "list files"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_1", "function": {"name": "ls", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "a.py"},
        {"role": "user", "content": "thanks, now what?"},
    ]
    events: list[object] = []
    async with ContextManager(Budget(context_window=100_000)) as ctx:
        ctx.subscribe(events.append)
        sent = to_openai_chat(await ctx.prepare(from_openai_chat(history)))
    assert events == []  # nothing repaired: the result answers its call
    assert sent[1]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    ]
    assert sent[2] == history[2] and len(sent) == 4
    assert validate_chat({"model": "m", "messages": sent}) is None
    assert validate_chat({"model": "m", "messages": history}) is not None  # the type is required


def test_a_chat_call_whose_type_is_null_is_a_function_call() -> None:
    """Found by the re-run (CZ 2): the SDK types a call a server sent without ``type`` with
    the field unset, and ``message.model_dump()`` (how a loop keeps a reply) writes null:
    refused as a call "of type None" where a missing type was read."""
    call = {"id": "c1", "function": {"arguments": "{}", "name": "f"}, "type": None}
    history = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
    ]
    sent = to_openai_chat(from_openai_chat(history))
    assert sent[1]["tool_calls"] == [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    ]
    assert sent[2] == history[2]


def test_a_chat_call_of_an_unknown_type_is_refused_not_its_result_dropped() -> None:
    """A call of a type the API does not take (only function and custom) rode opaque too, its
    tool message dropped as an orphan: refused at its index, as a malformed call is."""
    call = {"id": "c1", "type": "plugin", "plugin": {"name": "f"}}
    with pytest.raises(UnsupportedMessageError, match="'plugin'") as refused:
        from_openai_chat(
            [
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "out"},
            ]
        )
    assert refused.value.index == 1


async def test_the_stub_for_an_unanswered_custom_call_answers_as_a_custom_output() -> None:
    """Found by a hostile run (CX): the stub result of an interrupted Responses custom tool
    call went back as a ``function_call_output``, an output of another kind than its call."""
    items = [
        {"role": "user", "content": "patch the file"},
        {
            "type": "custom_tool_call",
            "id": "ctc_1",
            "call_id": "call_1",
            "name": "apply_patch",
            "input": "*** Begin Patch",
        },
        {"type": "function_call", "call_id": "call_2", "name": "ls", "arguments": "{}"},
        {"role": "user", "content": "what happened?"},
    ]
    async with ContextManager(Budget(context_window=100_000)) as ctx:
        sent = to_openai_responses(await ctx.prepare(from_openai_responses(items)))
    outputs = {i["call_id"]: i["type"] for i in sent if i.get("type", "").endswith("_output")}
    assert outputs == {"call_1": "custom_tool_call_output", "call_2": "function_call_output"}
    assert validate_responses({"model": "m", "input": sent}, sent) is None


@pytest.mark.parametrize("call_id", [[], {}, 1, None])
def test_an_output_item_whose_call_id_is_no_string_rides_as_it_came(call_id: object) -> None:
    """Found by the round-trip property above: a Responses output item with a call id that
    is a list (no string, so not hashable) was read, then failed to render with a bare
    `TypeError`. Only string ids pair a call with its output."""
    for kind in ("function_call_output", "local_shell_call_output", "computer_call_output"):
        items = [{"type": kind, "call_id": call_id}, {"type": "computer_call", "call_id": call_id}]
        assert to_openai_responses(from_openai_responses(items)) == items


@pytest.mark.parametrize("value", [b"bytes", math.nan, math.inf], ids=["bytes", "nan", "inf"])
@pytest.mark.parametrize("render", [to_anthropic, to_openai_chat, to_openai_responses])
def test_arguments_json_cannot_hold_are_refused_by_every_adapter(
    render: Callable[[list[Message]], Any], value: object
) -> None:
    """(Hostile run EA, 6) Arguments holding bytes made the OpenAI adapters raise a bare
    TypeError; NaN went into an Anthropic request as ``NaN``, and the SDK failed to send it
    (ValueError). Each adapter now refuses them, naming the message."""
    call = ToolCall("a", "f", {"x": value})
    history = [
        UserMessage.of("t"),
        AssistantMessage.of(tool_calls=[call]),
        ToolResultMessage.of("a", "r"),
    ]
    with pytest.raises(UnsupportedMessageError) as err:
        render(history)
    assert err.value.index == 1


def test_a_tool_use_input_json_cannot_hold_is_refused_when_read() -> None:
    with pytest.raises(UnsupportedMessageError) as err:
        from_anthropic(
            [
                {"role": "user", "content": "t"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {"x": b"1"}}],
                },
            ]
        )
    assert err.value.index == 1


def test_a_model_s_nan_in_chat_arguments_goes_back_as_written() -> None:
    """Python parses ``NaN`` in a model's arguments, which JSON does not hold: the call goes
    back as the model wrote it, not refused, as any arguments kept as written."""
    written = '{"x":NaN}'
    call = {"id": "a", "type": "function", "function": {"name": "f", "arguments": written}}
    params = [
        {"role": "user", "content": "t"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "a", "content": "r"},
    ]
    assert to_openai_chat(from_openai_chat(params))[1]["tool_calls"][0]["function"] == {
        "name": "f",
        "arguments": written,
    }
