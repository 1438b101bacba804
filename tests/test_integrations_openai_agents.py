"""agentctx inside the OpenAI Agents SDK: the ``call_model_input_filter`` through ``Runner.run``
with a fake ``Model`` (and the SDK's Responses model against agentctx's fake OpenAI server)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from typing import Any

import openai
import pytest
from agents import (
    Agent,
    ModelResponse,
    ModelSettings,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    SQLiteSession,
    Usage,
    function_tool,
)
from agents.items import TResponseInputItem, TResponseStreamEvent
from agents.models.interface import Model, ModelTracing
from agents.run_config import CallModelData, ModelInputData
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
)
from openai.types.responses.response_reasoning_item import Summary

from agentctx import (
    Budget,
    ConfigError,
    ContextCompacted,
    ContextManager,
    Event,
    HistoryResynced,
    Message,
)
from agentctx.adapters.openai_responses import from_openai_responses
from agentctx.integrations.openai_agents import AgentCtxInputFilter, recall_tool
from agentctx.recall import MemoryRecallStore
from agentctx.strategies.deterministic import COMPACTION_MARKER
from agentctx.testing import FakeOpenAI, Reply, check_view
from agentctx.testing._validate import validate_responses

TASK = "Read f1 to f9 one at a time, then say what they hold."
SYSTEM = "You are a careful code reader."


class Recording(ContextManager):
    """A manager that keeps every history it was given, the view it returned, and whether
    that call took a new decision."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[list[Message], list[Message], bool]] = []

    async def prepare(self, history: Sequence[Message], **kwargs: Any) -> list[Message]:
        version = self.ledger.version
        view = await super().prepare(history, **kwargs)
        self.calls.append((list(history), view, self.ledger.version != version))
        return view


class ToolLoopModel(Model):
    """Reads ``files`` files, reasoning (encrypted) before each call, then answers; keeps
    every input it was given."""

    def __init__(self, files: int) -> None:
        self.files = files
        self.read = 0  # counted here: compaction may drop earlier calls from the input
        self.seen: list[list[TResponseInputItem]] = []

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: Any,
        output_schema: Any,
        handoffs: Any,
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        assert isinstance(input, list) and system_instructions == SYSTEM
        self.seen.append(list(input))
        size = len(json.dumps(input)) // 4
        usage = Usage(requests=1, input_tokens=size, output_tokens=20, total_tokens=size + 20)
        if self.read < self.files:
            self.read += 1
            n = self.read
            output: list[Any] = [
                ResponseReasoningItem(
                    id=f"rs_{n}",
                    type="reasoning",
                    summary=[Summary(text=f"next is f{n}", type="summary_text")],
                    encrypted_content=f"enc-{n}",
                ),
                ResponseFunctionToolCall(
                    type="function_call",
                    id=f"fc_{n}",
                    call_id=f"call_{n}",
                    name="read_file",
                    arguments=json.dumps({"path": f"f{n}"}),
                    status="completed",
                ),
            ]
        else:
            text = ResponseOutputText(type="output_text", text="They all compute.", annotations=[])
            output = [
                ResponseOutputMessage(
                    id=f"msg_{len(self.seen)}",
                    type="message",
                    role="assistant",
                    status="completed",
                    content=[text],
                )
            ]
        return ModelResponse(output=output, usage=usage, response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError


@function_tool
def read_file(path: str) -> str:
    """Read a file of the project."""
    return "\n".join(f"{path} line {k}: " + "value = compute(x) * 2  # " * 2 for k in range(250))


def output(path: str) -> str:
    return "\n".join(f"{path} line {k}: " + "value = compute(x) * 2  # " * 2 for k in range(250))


async def run_loop(
    files: int = 9, window: int = 11_000
) -> tuple[Recording, ToolLoopModel, list[TResponseInputItem], list[Event]]:
    model = ToolLoopModel(files)
    events: list[Event] = []
    agent = Agent(name="reader", instructions=SYSTEM, model=model, tools=[read_file])
    async with Recording(Budget(context_window=window, reserve_output=1_000)) as ctx:
        ctx.subscribe(events.append)
        compaction = AgentCtxInputFilter(ctx)
        config = RunConfig(call_model_input_filter=compaction, tracing_disabled=True)
        result = await Runner.run(
            agent, TASK, run_config=config, hooks=compaction.hooks, max_turns=files + 1
        )
    return ctx, model, result.to_input_list(), events


def pairing_problems(items: list[TResponseInputItem]) -> list[str]:
    calls = [i["call_id"] for i in items if i.get("type") == "function_call"]  # type: ignore[typeddict-item]
    outputs = [i["call_id"] for i in items if i.get("type") == "function_call_output"]  # type: ignore[typeddict-item]
    problems = [f"orphan output {c}" for c in outputs if c not in calls]
    return problems + [f"unanswered call {c}" for c in calls if c not in outputs]


async def test_tool_loop_over_budget_sends_valid_compacted_views() -> None:
    ctx, model, items, events = await run_loop()
    assert any(isinstance(e, ContextCompacted) for e in events)
    assert not any(isinstance(e, HistoryResynced) for e in events)
    assert len(ctx.calls) == len(model.seen) == 10
    for raw, view, _ in ctx.calls:
        assert check_view(view, raw) == []
    for sent in model.seen:
        # What the Responses API would be sent: valid, reasoning items included.
        assert validate_responses({"model": "m", "input": sent}, sent) is None
    last = json.dumps(model.seen[-1])
    assert "truncated" in last or COMPACTION_MARKER in last
    assert len(last) < 0.75 * len(json.dumps(items[:-1]))
    # The run's own items are whole.
    results = [i["output"] for i in items if i.get("type") == "function_call_output"]  # type: ignore[typeddict-item]
    assert results == [output(f"f{n}") for n in range(1, 10)]
    assert ctx.usage.prompt_tokens > 0  # the hooks observed every response


async def test_no_orphaned_tool_pairs_after_compaction() -> None:
    _, model, _, events = await run_loop(files=12, window=9_000)
    assert sum(isinstance(e, ContextCompacted) for e in events) >= 2
    for sent in model.seen:
        assert pairing_problems(sent) == []


async def test_task_prompt_survives_compaction() -> None:
    _, model, _, events = await run_loop(files=12, window=9_000)
    assert any(isinstance(e, ContextCompacted) for e in events)
    for sent in model.seen:
        assert sent[0] == {"content": TASK, "role": "user"}


async def test_prefix_is_byte_stable_when_nothing_new_is_decided() -> None:
    ctx, model, _, _ = await run_loop()
    decided = [d for _, _, d in ctx.calls]
    assert any(decided) and not all(decided[1:])
    stable = 0
    for k in range(1, len(model.seen)):
        if not decided[k]:
            before = [json.dumps(i, sort_keys=True) for i in model.seen[k - 1]]
            now = [json.dumps(i, sort_keys=True) for i in model.seen[k]]
            assert now[: len(before)] == before, f"call {k} rewrote the prefix"
            stable += 1
    assert stable >= 2


async def test_reasoning_goes_back_as_it_came() -> None:
    _, model, items, _ = await run_loop()
    originals = [i for i in items if i.get("type") == "reasoning"]
    for sent in model.seen:
        for item in sent:
            if item.get("type") == "reasoning":
                assert item in originals


async def test_unchanged_input_passes_through_equal() -> None:
    """Nothing to compact: the filter returns what it was given, developer item first."""
    items: list[Any] = [
        {"role": "developer", "content": "Answer briefly."},
        {"role": "user", "content": TASK},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "enc"},
        {"type": "function_call", "call_id": "c1", "name": "read_file", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ]
    async with ContextManager(100_000) as ctx:
        compaction = AgentCtxInputFilter(ctx)
        agent = Agent(name="a", instructions=SYSTEM)
        data = CallModelData(ModelInputData(input=list(items), instructions=SYSTEM), agent, None)
        out = await compaction(data)
    assert out.input == items and out.instructions == SYSTEM
    assert len(ctx.raw) == len(from_openai_responses(items[1:]))


class RecallingModel(Model):
    """Calls ``recall_context`` once with ``arguments`` (a JSON text), then answers."""

    def __init__(self, arguments: str) -> None:
        self.arguments = arguments
        self.calls = 0

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.calls += 1
        usage = Usage(requests=1, input_tokens=10, output_tokens=5, total_tokens=15)
        if self.calls == 1:
            call = ResponseFunctionToolCall(
                type="function_call",
                id="fc_1",
                call_id="call_1",
                name="recall_context",
                arguments=self.arguments,
                status="completed",
            )
            return ModelResponse(output=[call], usage=usage, response_id=None)
        text = ResponseOutputText(type="output_text", text="done", annotations=[])
        message = ResponseOutputMessage(
            id="msg_1", type="message", role="assistant", status="completed", content=[text]
        )
        return ModelResponse(output=[message], usage=usage, response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError


@pytest.mark.parametrize("arguments", ['{"limit": 1000000000, "note": 1}', '{"offset": "x"}', "{"])
async def test_recall_tool_gives_the_agent_bounded_answers(arguments: str) -> None:
    """Found by a hostile run (CD 1): no integration had the ``recall_context`` tool, and the
    natural one to bind, ``ctx.recall``, returns a whole 244k-character entry to a model's
    ``limit: 10**9``. `recall_tool` answers as ``handle_recall`` does, whatever the model
    wrote (text that is no JSON too)."""
    store = MemoryRecallStore()
    async with ContextManager(100_000, recall=store) as ctx:
        rid = store.put(ctx.session_id, "x" * 50_000)
        written = (
            arguments if arguments == "{" else json.dumps({"id": rid, **json.loads(arguments)})
        )
        agent = Agent(name="r", model=RecallingModel(written), tools=[recall_tool(ctx)])
        compaction = AgentCtxInputFilter(ctx)
        config = RunConfig(call_model_input_filter=compaction, tracing_disabled=True)
        result = await Runner.run(agent, TASK, run_config=config, max_turns=3)
    (answer,) = [
        i["output"]  # type: ignore[typeddict-item]
        for i in result.to_input_list()
        if i.get("type") == "function_call_output"
    ]
    assert isinstance(answer, str) and answer.startswith("[recall_context") and len(answer) < 8_200


async def test_a_session_continues_across_runs() -> None:
    model = ToolLoopModel(4)
    events: list[Event] = []
    session = SQLiteSession("conversation-1")  # in memory
    agent = Agent(name="reader", instructions=SYSTEM, model=model, tools=[read_file])
    async with Recording(Budget(context_window=11_000, reserve_output=1_000)) as ctx:
        ctx.subscribe(events.append)
        compaction = AgentCtxInputFilter(ctx)
        config = RunConfig(call_model_input_filter=compaction, tracing_disabled=True)
        await Runner.run(agent, TASK, session=session, run_config=config, hooks=compaction.hooks)
        model.files = 8
        await Runner.run(
            agent, "Four more.", session=session, run_config=config, hooks=compaction.hooks
        )
    assert not any(isinstance(e, HistoryResynced) for e in events)
    assert any(isinstance(e, ContextCompacted) for e in events)
    for raw, view, _ in ctx.calls:
        assert check_view(view, raw) == []
    users = [i.get("content") for i in model.seen[-1] if i.get("role") == "user"]
    assert users[0] == TASK and "Four more." in users
    session.close()


async def test_responses_model_against_the_fake_api() -> None:
    """The SDK's own Responses model over HTTP, to a server that validates like the API."""
    script = [Reply.tool_call("read_file", {"path": f"f{n}"}) for n in range(1, 9)]
    events: list[Event] = []
    async with FakeOpenAI([*script, Reply.text("They all compute.")]) as server:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="test", max_retries=0)
        try:
            model = OpenAIResponsesModel(model="gpt-6-luna", openai_client=client)
            agent = Agent(name="reader", instructions=SYSTEM, model=model, tools=[read_file])
            async with ContextManager(Budget(context_window=14_000, reserve_output=2_000)) as ctx:
                ctx.subscribe(events.append)
                compaction = AgentCtxInputFilter(ctx)
                config = RunConfig(call_model_input_filter=compaction, tracing_disabled=True)
                result = await Runner.run(agent, TASK, run_config=config, hooks=compaction.hooks)
        finally:
            await client.close()
    assert result.final_output == "They all compute."
    assert all(r.status == 200 for r in server.requests), [r.error for r in server.requests]
    assert any(isinstance(e, ContextCompacted) for e in events)
    assert all(r.json["input"][0]["content"] == TASK for r in server.requests)
    assert sum(r.usage is not None and r.usage.cache_read > 0 for r in server.requests) >= 5
    assert ctx.usage.cache_read_tokens > 0


def test_missing_framework_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['agents'] = None\n"
        "from agentctx.errors import MissingExtraError\n"
        "try:\n"
        "    import agentctx.integrations.openai_agents\n"
        "except MissingExtraError as exc:\n"
        "    print(exc.extra, exc.module, sep='|')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "openai-agents|agents"


async def test_a_batch_mixing_function_and_custom_tool_calls_stays_paired() -> None:
    """Found by a hostile run: the SDK sends a turn's function call outputs, then its custom
    tool outputs; compaction dropped a custom call and kept its output, which the API
    refuses ("No tool call found for custom tool call output")."""

    def step(i: int) -> list[Any]:
        return [
            {"role": "user", "content": f"step {i}: " + "word " * 30},
            {
                "type": "function_call",
                "call_id": f"fc{i}",
                "name": "read",
                "arguments": json.dumps({"path": f"f{i}.py"}),
            },
            {
                "type": "custom_tool_call",
                "call_id": f"ct{i}",
                "name": "apply_patch",
                "input": "*** Begin Patch\n" + "+x\n" * 50,
            },
            {"type": "function_call_output", "call_id": f"fc{i}", "output": "contents\n" * 200},
            {"type": "custom_tool_call_output", "call_id": f"ct{i}", "output": "patched\n" * 100},
            {"role": "assistant", "content": f"done {i}"},
        ]

    events: list[Event] = []
    async with ContextManager(Budget(context_window=6_000, reserve_output=1_000)) as ctx:
        ctx.subscribe(events.append)
        compaction = AgentCtxInputFilter(ctx)
        items: list[Any] = []
        for i in range(8):
            items += step(i)
            data = CallModelData(
                ModelInputData(input=list(items), instructions="x"), Agent(name="a"), None
            )
            sent = (await compaction(data)).input
            assert validate_responses({"model": "m", "input": sent}, sent) is None, i
            assert sent[0] == items[0]
    assert any(isinstance(e, ContextCompacted) for e in events)


# -- a prompt the provider refuses as too long ---------------------------------------------


def _refused_items() -> list[TResponseInputItem]:
    """A run's input that agentctx's first estimate fits and the fake API refuses: its
    server counts these words at about 1.6x the uncalibrated estimate."""
    from .test_prompt_refused import responses_history

    return [*responses_history(13), {"role": "user", "content": "Sum them up."}]  # type: ignore[list-item]


def _refusing_budget() -> Budget:
    from .test_prompt_refused import WINDOW

    return Budget(context_window=WINDOW, reserve_output=500)


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_a_refused_prompt_is_compacted_and_sent_again_by_the_wrapped_model(
    streamed: bool,
) -> None:
    """The SDK's own retries send the same filtered input again, which is refused again: the
    wrapped model has the manager observe the refusal and sends the input prepared again."""
    from .test_prompt_refused import WINDOW

    async with (
        FakeOpenAI(context_window=WINDOW, default=Reply.text("done")) as server,
        openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="test", max_retries=0) as client,
        ContextManager(_refusing_budget()) as ctx,
    ):
        compaction = AgentCtxInputFilter(ctx)
        model = compaction.wrap(OpenAIResponsesModel(model="gpt-6-luna", openai_client=client))
        agent = Agent(name="reader", instructions=SYSTEM, model=model)
        config = RunConfig(call_model_input_filter=compaction, tracing_disabled=True)
        if streamed:
            stream = Runner.run_streamed(
                agent, _refused_items(), run_config=config, hooks=compaction.hooks
            )
            async for _ in stream.stream_events():
                pass
            output = stream.final_output
        else:
            result = await Runner.run(
                agent, _refused_items(), run_config=config, hooks=compaction.hooks
            )
            output = result.final_output
    assert output == "done"
    assert [r.status for r in server.requests] == [400, 200]
    refused, sent = server.requests
    assert len(sent.json["input"]) < len(refused.json["input"])
    assert sent.json["input"][0]["content"] == "Read document 0."  # the task stays


async def test_a_wrapped_provider_s_models_send_a_refused_prompt_again() -> None:
    from agents import OpenAIProvider

    from .test_prompt_refused import WINDOW

    async with (
        FakeOpenAI(context_window=WINDOW, default=Reply.text("done")) as server,
        openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="test", max_retries=0) as client,
        ContextManager(_refusing_budget()) as ctx,
    ):
        compaction = AgentCtxInputFilter(ctx)
        provider = compaction.wrap(OpenAIProvider(openai_client=client, use_responses=True))
        config = RunConfig(
            call_model_input_filter=compaction, model_provider=provider, tracing_disabled=True
        )
        agent = Agent(name="reader", instructions=SYSTEM, model="gpt-6-luna")
        result = await Runner.run(agent, _refused_items(), run_config=config)
    assert result.final_output == "done"
    assert [r.status for r in server.requests] == [400, 200]


async def test_without_the_wrap_a_refused_prompt_fails_the_run_and_other_errors_pass() -> None:
    """What the wrap is for, and what it leaves alone: a refusal fails an unwrapped run, and
    an error that is no refusal of the prompt (a refused key) is raised as it came, once."""
    from .test_prompt_refused import WINDOW

    async with (
        FakeOpenAI(context_window=WINDOW, default=Reply.text("done")) as server,
        openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="test", max_retries=0) as client,
        ContextManager(_refusing_budget()) as ctx,
    ):
        compaction = AgentCtxInputFilter(ctx)
        config = RunConfig(call_model_input_filter=compaction, tracing_disabled=True)
        bare = Agent(name="r", model=OpenAIResponsesModel(model="m", openai_client=client))
        with pytest.raises(openai.BadRequestError, match="exceeds the context window"):
            await Runner.run(bare, _refused_items(), run_config=config)
        assert [r.status for r in server.requests] == [400]
    async with (
        ContextManager(_refusing_budget()) as ctx,
        openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="x", max_retries=0) as dead,
    ):
        compaction = AgentCtxInputFilter(ctx)
        config = RunConfig(call_model_input_filter=compaction, tracing_disabled=True)
        model = compaction.wrap(OpenAIResponsesModel(model="m", openai_client=dead))
        with pytest.raises(openai.APIConnectionError):
            await Runner.run(Agent(name="r", model=model), "hi", run_config=config)
    with pytest.raises(ConfigError, match="Model or ModelProvider"):
        compaction.wrap("gpt-6-luna")  # type: ignore[call-overload]


async def test_a_wrapped_model_is_the_model_for_everything_else() -> None:
    """Found by hostile testing (DZ 1, DZ 3): the SDK asks a model for retry advice and cleans
    it up at a run's end, and the base class answered both for the wrapped model; a copy of it
    recursed. Its own answers now, its attributes read through, and a copy works."""
    import copy

    seen: list[object] = []

    class Own(OpenAIResponsesModel):
        def get_retry_advice(self, request: Any) -> Any:
            seen.append(("advice", request))
            return "advice"

        async def _cleanup_on_run_end(self, owner: object) -> None:
            seen.append(("cleanup", owner))

    async with (
        openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="x", max_retries=0) as dead,
        ContextManager(_refusing_budget()) as ctx,
    ):
        model = AgentCtxInputFilter(ctx).wrap(Own(model="gpt-6-luna", openai_client=dead))
        assert model.get_retry_advice("r") == "advice"  # type: ignore[arg-type]
        await model._cleanup_on_run_end("run")
        assert seen == [("advice", "r"), ("cleanup", "run")]
        assert model.model == "gpt-6-luna"  # type: ignore[attr-defined]
        assert copy.copy(model).model == "gpt-6-luna"  # type: ignore[attr-defined]
        with pytest.raises(AttributeError):
            _ = model.no_such_attribute  # type: ignore[attr-defined]


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_the_sdk_s_own_retry_after_the_resend_sends_the_compacted_input(
    streamed: bool,
) -> None:
    """Found by hostile testing (DZ 2): the compacted resend met a 500, the SDK's retry
    policy asked again with the refused input, and it went out again, refused: the run failed.
    Its retries now send what was sent in its place. The SDK's retry advice is the model's
    own (DZ 1: `provider_suggested` gave up at the first 500 through the wrap)."""
    from agents import ModelRetrySettings, retry_policies

    from .test_prompt_refused import WINDOW

    policy = retry_policies.any(
        retry_policies.http_status([500]), retry_policies.provider_suggested()
    )
    settings = ModelSettings(retry=ModelRetrySettings(max_retries=3, policy=policy))
    async with (
        FakeOpenAI(context_window=WINDOW, default=Reply.text("done")) as server,
        openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="test", max_retries=0) as client,
        ContextManager(_refusing_budget()) as ctx,
    ):
        server.enqueue(Reply.server_error(500))  # after the refusal: the resend meets it
        compaction = AgentCtxInputFilter(ctx)
        model = compaction.wrap(OpenAIResponsesModel(model="gpt-6-luna", openai_client=client))
        agent = Agent(name="reader", model=model, model_settings=settings)
        config = RunConfig(call_model_input_filter=compaction, tracing_disabled=True)
        if streamed:
            stream = Runner.run_streamed(agent, _refused_items(), run_config=config)
            async for _ in stream.stream_events():
                pass
            output = stream.final_output
        else:
            output = (await Runner.run(agent, _refused_items(), run_config=config)).final_output
    assert output == "done"
    sizes = [(r.status, len(r.json["input"])) for r in server.requests]
    assert [status for status, _ in sizes] == [400, 500, 200]
    assert sizes[1][1] == sizes[2][1] < sizes[0][1]
