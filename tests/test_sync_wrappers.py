"""`wrap` on the blocking ``anthropic.Anthropic`` and ``openai.OpenAI`` clients, through the
real SDKs against the fake servers: the same behaviour as the async wrappers, with the
manager (and its background summaries) on a loop thread the wrapper owns."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import anthropic
import openai
import pytest

from agentctx import Budget, ContextManager, MemoryRecallStore
from agentctx.adapters import from_anthropic
from agentctx.providers import anthropic as ant_provider
from agentctx.providers import openai as oai_provider
from agentctx.strategies.deterministic import DeterministicCompaction
from agentctx.strategies.llm import LlmCompaction, LlmCompactionConfig
from agentctx.strategy import Chain
from agentctx.testing import assert_view_ok
from agentctx.testing.scripted import Outcome, ScriptedSummarizer
from agentctx.testing.servers import FakeAnthropic, FakeOpenAI
from tests.test_llm_compaction import briefing
from tests.test_wrappers import (
    CHAT_TOOLS,
    MODEL,
    RESP_TOOLS,
    SYSTEM,
    TASK,
    TOOLS,
    assert_all_ok,
    assert_prefix_stable,
    compactions,
    file_body,
    script,
)


def small_manager(**kwargs: Any) -> ContextManager:
    return ContextManager(
        Budget(context_window=9_000, reserve_output=1_000), recall=MemoryRecallStore(), **kwargs
    )


def loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "agentctx"]


def anthropic_sync_loop(
    client: Any, turns: int, stream: bool = False, gap: float = 0.0
) -> list[dict[str, Any]]:
    """The caller's blocking tool loop; ``gap`` seconds pass after each model call."""
    params: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 512,
        "system": SYSTEM,
        "tools": TOOLS,
    }
    history: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    for _ in range(turns + 1):
        if stream:
            with client.messages.stream(messages=history, **params) as s:
                message = s.get_final_message()
        else:
            message = client.messages.create(messages=history, **params)
        content = [b.to_dict() for b in message.content]
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
        time.sleep(gap)
    return history


@pytest.mark.parametrize("stream", [False, True])
def test_sync_anthropic_compacts_records_usage_and_closes(stream: bool) -> None:
    manager = small_manager()
    seen = compactions(manager)
    with FakeAnthropic(script(10)) as srv:
        raw = anthropic.Anthropic(base_url=srv.url, api_key="test", max_retries=0)
        with ant_provider.wrap(raw, manager) as client:
            assert isinstance(client, ant_provider.WrappedAnthropic)
            assert len(loop_threads()) == 1
            history = anthropic_sync_loop(client, 10, stream=stream)
            assert client.api_key == "test"  # the rest is the client's
    assert loop_threads() == []
    assert raw.is_closed()
    assert_all_ok(srv.requests)
    assert all(r.stream == stream for r in srv.requests)
    assert len(srv.requests) == 11
    assert seen, "the small budget should have compacted"
    assert_prefix_stable(srv.requests, "messages", breaks=len(seen))
    assert manager.usage.output_tokens == sum(
        r.usage.output_tokens for r in srv.requests if r.usage
    )
    assert len(json.dumps(srv.requests[-1].json["messages"])) < len(json.dumps(history[:-1]))


def test_sync_anthropic_create_stream_records_usage() -> None:
    manager = ContextManager(200_000)
    with FakeAnthropic(script(0)) as srv:
        raw = anthropic.Anthropic(base_url=srv.url, api_key="test", max_retries=0)
        with ant_provider.wrap(raw, manager) as client:
            events = list(
                client.messages.create(
                    model=MODEL,
                    max_tokens=64,
                    messages=[{"role": "user", "content": "hi"}],
                    stream=True,
                )
            )
    assert events[-1].type == "message_stop"
    assert manager.usage.output_tokens == srv.requests[0].usage.output_tokens > 0  # type: ignore[union-attr]


def test_sync_openai_chat_and_responses() -> None:
    manager = small_manager()
    with FakeOpenAI([*script(6), *script(6)]) as srv:
        raw = openai.OpenAI(base_url=srv.url + "/v1", api_key="test", max_retries=0)
        with oai_provider.wrap(raw, manager) as client:
            assert isinstance(client, oai_provider.WrappedOpenAI)
            history: list[dict[str, Any]] = [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": TASK},
            ]
            for _ in range(7):
                chunks = list(
                    client.chat.completions.create(
                        model="gpt-test",
                        tools=CHAT_TOOLS,
                        messages=history,
                        stream=True,
                        stream_options={"include_usage": True},
                    )
                )
                calls = [
                    d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []
                ]
                if not calls:
                    break
                call = {
                    "id": calls[0].id,
                    "type": "function",
                    "function": {
                        "name": "read",
                        "arguments": "".join(d.function.arguments or "" for d in calls),
                    },
                }
                path = json.loads(call["function"]["arguments"])["path"]
                history += [
                    {"role": "assistant", "content": None, "tool_calls": [call]},
                    {
                        "role": "tool",
                        "tool_call_id": call["id"],
                        "content": file_body(int(path[1])),
                    },
                ]
            items: list[Any] = [{"role": "user", "content": TASK}]
            for _ in range(7):
                resp = client.responses.create(model="gpt-test", tools=RESP_TOOLS, input=items)
                output = [o.to_dict() for o in resp.output]
                items += output
                fcalls = [o for o in output if o["type"] == "function_call"]
                if not fcalls:
                    break
                path = json.loads(fcalls[0]["arguments"])["path"]
                items.append(
                    {
                        "type": "function_call_output",
                        "call_id": fcalls[0]["call_id"],
                        "output": file_body(int(path[1])),
                    }
                )
    assert loop_threads() == []
    assert_all_ok(srv.requests)
    chat = [r for r in srv.requests if r.path.endswith("/chat/completions")]
    responses = [r for r in srv.requests if r.path.endswith("/responses")]
    assert len(chat) == len(responses) == 7
    assert all(r.json["messages"][0] == {"role": "system", "content": SYSTEM} for r in chat)
    assert manager.usage.output_tokens == sum(
        r.usage.output_tokens for r in srv.requests if r.usage
    )


def test_sync_wrapper_splices_a_background_summary() -> None:
    """The summarizer runs on the wrapper's loop between the caller's blocking calls."""
    summarizer = ScriptedSummarizer(default=Outcome.reply(briefing(), delay=0.05))
    strategy = Chain(
        [
            LlmCompaction(summarizer, LlmCompactionConfig(trigger_ratio=0.3)),
            DeterministicCompaction(),
        ]
    )
    manager = small_manager(strategy=strategy)
    seen = compactions(manager)
    with FakeAnthropic(script(14)) as srv:
        raw = anthropic.Anthropic(base_url=srv.url, api_key="test", max_retries=0)
        with ant_provider.wrap(raw, manager) as client:
            # the model-call gap is when the summary is written, on the wrapper's loop
            anthropic_sync_loop(client, 14, gap=0.02)
    assert_all_ok(srv.requests)
    assert summarizer.requests, "a summary was requested on the wrapper's loop"
    assert any(e.method == "summarized" for e in seen), [e.method for e in seen]
    for request in srv.requests:
        assert_view_ok(from_anthropic(request.json["messages"]), manager.raw)


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_closed_mid_call_from_another_thread_raises_the_sdk_error(stream: bool) -> None:
    """(Hostile run EB, 2) Every error of a blocking call went to the manager's loop to ask
    whether to send the request again: with the client closed from another thread meanwhile,
    the SDK's own connection error came out as ``ConfigError`` ("the manager's loop thread
    is closed"). Only a refusal of the prompt as too long goes to the loop now."""
    from agentctx.testing import Reply

    history = [{"role": "user", "content": "task"}]
    with FakeAnthropic([Reply.text("answer", delay=0.5)]) as srv:
        client = anthropic.Anthropic(base_url=srv.url, api_key="t", max_retries=0)
        wrapped = ant_provider.wrap(client, ContextManager(Budget(context_window=30_000)))
        raised: list[BaseException] = []

        def call() -> None:
            try:
                reply = wrapped.messages.create(
                    model="m", max_tokens=100, messages=history, stream=stream
                )
                if stream:
                    list(reply)
            except BaseException as e:
                raised.append(e)

        caller = threading.Thread(target=call)
        caller.start()
        time.sleep(0.2)
        wrapped.close()
        caller.join(10)
    assert not caller.is_alive()
    assert [type(e) for e in raised] == [anthropic.APIConnectionError], raised
