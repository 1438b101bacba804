"""agentctx inside pydantic-ai: the capability, driven by pydantic-ai's own FunctionModel (and its
Anthropic model against agentctx's fake Anthropic server), and the lossless conversion."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import warnings
from collections.abc import Sequence
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

import anthropic
import pytest
from pydantic_ai import Agent, PydanticAIDeprecationWarning
from pydantic_ai.messages import (
    AudioUrl,
    BinaryContent,
    CompactionPart,
    DocumentUrl,
    FilePart,
    ImageUrl,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    NativeToolCallPart,
    NativeToolReturnPart,
    RetryFeedbackPart,
    RetryInfo,
    RetryPromptPart,
    StructuredContent,
    SystemPromptPart,
    TextContent,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
    VideoUrl,
)
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.providers.anthropic import AnthropicProvider
from pydantic_ai.usage import RequestUsage

from agentctx import (
    AssistantMessage,
    Budget,
    ContextCompacted,
    ContextManager,
    Event,
    HistoryResynced,
    Message,
    SummaryMessage,
    TextBlock,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from agentctx.errors import UnsupportedMessageError
from agentctx.integrations.pydantic_ai import (
    KEY,
    AgentCtxCapability,
    from_pydantic_ai,
    to_pydantic_ai,
)
from agentctx.messages import OpaqueBlock, from_dict, to_dict
from agentctx.recall import MemoryRecallStore
from agentctx.testing import FakeAnthropic, Reply, check_view

T = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
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


def read_file(path: str) -> str:
    """Read a file of the project."""
    return "\n".join(f"{path} line {k}: " + "value = compute(x) * 2  # " * 2 for k in range(250))


def tool_loop(files: int, seen: list[list[ModelMessage]], first: int = 1) -> FunctionModel:
    """A model that reads files ``first`` to ``files`` (thinking, signed, before each call),
    then answers."""
    read = [first - 1]  # counted here: compaction may drop earlier calls from the messages

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(list(messages))
        calls = read[0]
        # Made-up but plausible usage: about what the request holds.
        size = len(ModelMessagesTypeAdapter.dump_json(messages)) // 4
        usage = RequestUsage(input_tokens=size, output_tokens=20)
        if calls < files:
            n = read[0] = calls + 1
            return ModelResponse(
                [
                    ThinkingPart(f"next is f{n}", signature=f"sig-{n}", provider_name="anthropic"),
                    TextPart(f"Reading f{n}."),
                    ToolCallPart("read_file", {"path": f"f{n}"}, f"call_{n}"),
                ],
                usage=usage,
            )
        return ModelResponse([TextPart("They all compute values.")], usage=usage)

    return FunctionModel(model)


def dumped(messages: list[ModelMessage]) -> list[bytes]:
    return [ModelMessagesTypeAdapter.dump_json([m]) for m in messages]


def pairing_problems(messages: list[ModelMessage]) -> list[str]:
    """pydantic-ai's own transcript rule: every call answered in the next request, every
    return answering a call of the response before it."""
    problems = []
    for k, m in enumerate(messages):
        if isinstance(m, ModelResponse):
            calls = {p.tool_call_id for p in m.parts if isinstance(p, ToolCallPart)}
            nxt = messages[k + 1] if k + 1 < len(messages) else None
            answered = {
                p.tool_call_id
                for p in (nxt.parts if isinstance(nxt, ModelRequest) else [])
                if isinstance(p, ToolReturnPart)
            }
            if calls != answered:
                problems.append(f"response {k}: calls {calls} answered by {answered}")
        elif k > 0:
            before = messages[k - 1]
            calls = {p.tool_call_id for p in before.parts if isinstance(p, ToolCallPart)}
            for p in m.parts:
                if isinstance(p, ToolReturnPart) and p.tool_call_id not in calls:
                    problems.append(f"request {k}: orphan return {p.tool_call_id}")
    return problems


async def run_loop(
    files: int = 9, window: int = 12_000
) -> tuple[Recording, list[list[ModelMessage]], list[ModelMessage], list[Event]]:
    seen: list[list[ModelMessage]] = []
    events: list[Event] = []
    agent = Agent(tool_loop(files, seen), system_prompt=SYSTEM, tools=[read_file])
    async with Recording(Budget(context_window=window, reserve_output=1_000)) as ctx:
        ctx.subscribe(events.append)
        result = await agent.run(TASK, capabilities=[AgentCtxCapability(ctx)])
    return ctx, seen, result.all_messages(), events


# ---------------------------------------------------------------------------------------
# The capability in a real agent run


async def test_tool_loop_over_budget_sends_valid_compacted_views() -> None:
    ctx, seen, history, events = await run_loop()
    assert any(isinstance(e, ContextCompacted) for e in events)
    assert not any(isinstance(e, HistoryResynced) for e in events)
    assert ctx.calls and len(ctx.calls) == len(seen)
    for raw, view, _ in ctx.calls:
        assert check_view(view, raw) == []
    # The model function received the compacted history: smaller than the run's own.
    full = sum(map(len, dumped(history[:-1])))
    last = sum(map(len, dumped(seen[-1])))
    assert last < full * 0.75
    truncated = [
        p
        for m in seen[-1]
        for p in m.parts
        if isinstance(p, ToolReturnPart) and "truncated" in str(p.content)
    ]
    assert truncated
    # The run's history is whole: every tool return as the tool gave it.
    returns = [p for m in history for p in m.parts if isinstance(p, ToolReturnPart)]
    assert len(returns) == 9 and all(
        p.content == read_file("f" + p.tool_call_id[5:]) for p in returns
    )
    assert ctx.usage.prompt_tokens > 0  # the responses' usage was observed


async def test_no_orphaned_tool_pairs_in_any_request() -> None:
    _, seen, _, _ = await run_loop()
    for messages in seen:
        assert pairing_problems(messages) == []


async def test_task_prompt_survives_compaction() -> None:
    _, seen, _, events = await run_loop()
    assert sum(isinstance(e, ContextCompacted) for e in events) >= 2
    for messages in seen:
        first = messages[0]
        assert isinstance(first, ModelRequest)
        assert first.parts[:2] == [
            SystemPromptPart(SYSTEM, timestamp=first.parts[0].timestamp),  # type: ignore[union-attr]
            UserPromptPart(TASK, timestamp=first.parts[1].timestamp),  # type: ignore[union-attr]
        ]


async def test_prefix_is_byte_stable_when_nothing_new_is_decided() -> None:
    ctx, seen, _, _ = await run_loop()
    decided = [d for _, _, d in ctx.calls]
    assert any(decided) and not all(decided[1:])
    stable = 0
    for k in range(1, len(seen)):
        if not decided[k]:
            before, now = dumped(seen[k - 1]), dumped(seen[k])
            assert now[: len(before)] == before, f"call {k} rewrote the prefix"
            stable += 1
    assert stable >= 2


async def test_signed_thinking_goes_back_byte_for_byte() -> None:
    _, seen, history, _ = await run_loop()
    originals = {p.signature: p for m in history for p in m.parts if isinstance(p, ThinkingPart)}
    for messages in seen:
        for m in messages:
            for p in m.parts:
                if isinstance(p, ThinkingPart):
                    assert p is originals[p.signature]


async def test_a_second_run_continues_the_session() -> None:
    seen: list[list[ModelMessage]] = []
    events: list[Event] = []
    agent = Agent(tool_loop(4, seen), system_prompt=SYSTEM, tools=[read_file])
    async with Recording(Budget(context_window=12_000, reserve_output=1_000)) as ctx:
        ctx.subscribe(events.append)
        first = await agent.run(TASK, capabilities=[AgentCtxCapability(ctx)])
        agent2 = Agent(tool_loop(8, seen, first=5), system_prompt=SYSTEM, tools=[read_file])
        second = await agent2.run(
            "Now read four more.",
            message_history=first.all_messages(),
            capabilities=[AgentCtxCapability(ctx)],
        )
    assert not any(isinstance(e, HistoryResynced) for e in events)
    assert any(isinstance(e, ContextCompacted) for e in events)
    for raw, view, _ in ctx.calls:
        assert check_view(view, raw) == []
    assert len(second.all_messages()) > len(first.all_messages())
    prompts = [p.content for m in seen[-1] for p in m.parts if isinstance(p, UserPromptPart)]
    assert prompts[0] == TASK and "Now read four more." in prompts


async def test_anthropic_model_against_the_fake_api() -> None:
    """pydantic-ai's real Anthropic mapping, sent over HTTP to a server that validates like the
    API (tool pairing, signed thinking) and simulates its prefix cache."""
    script = [
        Reply.tool_call("read_file", {"path": f"f{n}"}, thinking=f"next is f{n}")
        for n in range(1, 9)
    ]
    events: list[Event] = []
    async with FakeAnthropic([*script, Reply.text("They all compute values.")]) as server:
        client = anthropic.AsyncAnthropic(base_url=server.url, api_key="test", max_retries=0)
        try:
            model = AnthropicModel(
                "claude-haiku-4-5", provider=AnthropicProvider(anthropic_client=client)
            )
            agent = Agent(model, system_prompt=SYSTEM, tools=[read_file])
            async with ContextManager(Budget(context_window=16_000, reserve_output=2_000)) as ctx:
                ctx.subscribe(events.append)
                result = await agent.run(TASK, capabilities=[AgentCtxCapability(ctx)])
        finally:
            await client.close()
    assert result.output == "They all compute values."
    assert all(r.status == 200 for r in server.requests), [r.error for r in server.requests]
    assert any(isinstance(e, ContextCompacted) for e in events)
    bodies = [r.json["messages"] for r in server.requests]
    assert all(b[0]["content"][0]["text"] == TASK for b in bodies)
    # Requests between compactions extend the previous one, so the cache keeps hitting.
    assert sum(r.usage is not None and r.usage.cache_read > 0 for r in server.requests) >= 5


@pytest.mark.parametrize(
    ("arguments", "answer"),
    [
        ('{"id": "%s", "limit": 1000000000}', "chars 0-8000 of 50000"),
        ('{"id": "%s", "limit": 100, "note": 1}', "chars 0-100 of 50000"),
        ('{"id": "%s", "offset": "x"}', "`offset` must be a whole number"),
        ("[1, 2]", "must be an object"),
        ("null", "must be an object"),
        ('"%s"', "must be an object"),
    ],
)
async def test_the_capability_gives_the_agent_a_bounded_recall_tool(
    arguments: str, answer: str
) -> None:
    """Found by a hostile run (CD 1): no integration had the ``recall_context`` tool, and the
    natural one to bind, ``ctx.recall``, returns a whole 244k-character entry to a model's
    ``limit: 10**9`` (and a bare TypeError to an extra key). With a recall store the
    capability gives the agent the tool, answered by ``handle_recall``, whatever the model
    wrote, as often as it writes it: JSON that is no object ended the run (CE 1), and typed
    arguments refused the same mistake made twice with pydantic-ai's retry limit (CF 6)."""
    store = MemoryRecallStore()
    tools: list[list[str]] = []
    budget = Budget(context_window=12_000, reserve_output=1_000)
    async with ContextManager(budget, recall=store) as ctx:
        rid = store.put(ctx.session_id, "x" * 50_000)

        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            tools.append([t.name for t in info.function_tools])
            if len(messages) < 6:  # the same call three times
                written = arguments.replace("%s", rid)
                return ModelResponse([ToolCallPart("recall_context", written, f"c{len(tools)}")])
            return ModelResponse([TextPart("done")])

        result = await Agent(FunctionModel(model)).run(
            "go", capabilities=[AgentCtxCapability(ctx, observe=False)]
        )
    assert result.output == "done"
    replies = [
        p
        for m in result.all_messages()
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    ]
    assert len(replies) == 3
    for reply in replies:
        assert isinstance(reply.content, str) and reply.content.startswith("[recall_context")
        assert answer in reply.content and len(reply.content) < 8_200
    assert tools[0] == ["recall_context"]

    def plain(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        tools.append([t.name for t in info.function_tools])
        return ModelResponse([TextPart("ok")])

    async with ContextManager(budget) as bare:
        none = await Agent(FunctionModel(plain)).run("go", capabilities=[AgentCtxCapability(bare)])
    assert none.output == "ok" and tools[-1] == []  # no store: no tool to answer with


# ---------------------------------------------------------------------------------------
# Conversion


def varied_history() -> list[ModelMessage]:
    """Every kind of part, in the shapes pydantic-ai records them."""
    with warnings.catch_warnings():
        # The deprecated retry part still turns up in stored histories.
        warnings.simplefilter("ignore", PydanticAIDeprecationWarning)
        legacy_retry = RetryPromptPart("try again", tool_name="grep", tool_call_id="c5")
    png = BinaryContent(b"\x89PNG\r\n\x1a\n", media_type="image/png")
    return [
        ModelRequest(
            [
                SystemPromptPart("Be brief.", timestamp=T),
                UserPromptPart("Fix the bug", timestamp=T),
            ],
            timestamp=T,
            run_id="r1",
        ),
        ModelResponse(
            [
                ThinkingPart("let me look", signature="sig-1", provider_name="anthropic"),
                TextPart("Reading."),
                ToolCallPart("read", {"path": "a.py"}, "c1"),
                ToolCallPart("grep", '{"q": "x",  "n": 2}', "c2"),
            ],
            usage=RequestUsage(input_tokens=100, output_tokens=20, cache_read_tokens=60),
            model_name="claude",
            timestamp=T,
            provider_name="anthropic",
            finish_reason="tool_call",
        ),
        ModelRequest(
            [
                ToolReturnPart("read", "print(1)", "c1", timestamp=T),
                ToolReturnPart("grep", {"matches": [1, 2]}, "c2", timestamp=T, metadata={"k": 1}),
            ],
            timestamp=T,
        ),
        ModelResponse(
            [
                ThinkingPart("", id="redacted", signature="opaque-data", provider_name="anthropic"),
                ToolCallPart("read", "not json", "c3"),
                NativeToolCallPart("web_search", {"q": "x"}, "n1", provider_name="anthropic"),
                NativeToolReturnPart("web_search", {"r": 1}, "n1", provider_name="anthropic"),
                ToolCallPart("grep", {"q": "y"}, "c5"),
            ],
            timestamp=T,
        ),
        ModelRequest(
            [
                ToolReturnPart("read", "bad args", "c3", outcome="retried", timestamp=T),
                legacy_retry,
                ToolReturnPart("web", ["see", png], "c9", timestamp=T, outcome="failed"),
            ],
            timestamp=T,
        ),
        ModelResponse([TextPart("A picture?", id="msg_1", provider_name="openai")], timestamp=T),
        ModelRequest(
            [
                UserPromptPart(
                    ["Look:", ImageUrl("https://x/y.png"), png, DocumentUrl("https://x/d.pdf")],
                    timestamp=T,
                ),
                SystemPromptPart("3 requests left", scope="request", timestamp=T),
            ],
            timestamp=T,
        ),
        ModelResponse([CompactionPart("earlier: fixed a.py", provider_name="openai")], timestamp=T),
        ModelRequest(
            [RetryFeedbackPart("Answer in JSON", retry=RetryInfo("model_retry"), timestamp=T)],
            timestamp=T,
        ),
        ModelResponse([FilePart(png, provider_name="google")], timestamp=T),
        ModelRequest([SystemPromptPart("Only records here.", timestamp=T)], timestamp=T),
        ModelResponse([], timestamp=T),
        ModelRequest([UserPromptPart("", timestamp=T)], timestamp=T),
    ]


def test_round_trip_is_the_history_itself() -> None:
    history = varied_history()
    neutral = from_pydantic_ai(history)
    back = to_pydantic_ai(neutral, history)
    assert back == history
    assert all(a is b for a, b in zip(back, history, strict=True))


def test_round_trip_survives_json_on_both_sides() -> None:
    # As stored: the history through pydantic-ai's own JSON, the neutral messages through
    # agentctx's (the keys that map a view back are plain JSON).
    history = ModelMessagesTypeAdapter.validate_json(
        ModelMessagesTypeAdapter.dump_json(varied_history())
    )
    neutral = [from_dict(to_dict(m)) for m in from_pydantic_ai(history)]
    back = to_pydantic_ai(neutral, history)
    assert all(a is b for a, b in zip(back, history, strict=True))


def test_neutral_form_models_what_agentctx_compacts() -> None:
    history = varied_history()
    neutral = from_pydantic_ai(history)
    kinds = [type(m).__name__ for m in neutral]
    assert kinds == [
        "UserMessage",  # the task (the system prompt rides with it)
        "AssistantMessage",
        "ToolResultMessage",
        "ToolResultMessage",
        "AssistantMessage",
        "ToolResultMessage",
        "ToolResultMessage",
        "ToolResultMessage",
        "AssistantMessage",
        "UserMessage",
        "AssistantMessage",
        "UserMessage",  # retry feedback
        "AssistantMessage",
        "UserMessage",  # a request of records only: an opaque stand-in
        "AssistantMessage",
        "UserMessage",
    ]
    first = neutral[1]
    assert isinstance(first, AssistantMessage)
    assert [type(b).__name__ for b in first.content] == [
        "ThinkingBlock",
        "TextBlock",
        "ToolCall",
        "ToolCall",
    ]
    assert first.content[0].signature == "sig-1"  # type: ignore[union-attr]
    assert first.tool_calls[1].arguments == {"q": "x", "n": 2}
    redacted = neutral[4]
    assert isinstance(redacted, AssistantMessage)
    assert type(redacted.content[0]).__name__ == "RedactedThinkingBlock"
    assert [type(b).__name__ for b in redacted.content[2:4]] == ["OpaqueBlock", "OpaqueBlock"]
    retried = neutral[5]
    assert isinstance(retried, ToolResultMessage) and retried.is_error
    assert neutral[7].content[1].type == "image"  # type: ignore[union-attr]
    # Every message names its source, and the timestamp age-based strategies read.
    assert neutral[2].extra[KEY] == [2, 0] and neutral[2].extra["timestamp"] == int(
        T.timestamp() * 1000
    )


def _replace_at(neutral: list[Message], key: list[int], new: Message) -> list[Message]:
    return [new if m.extra.get(KEY) == key else m for m in neutral]


def test_a_changed_message_changes_only_what_changed() -> None:
    history = varied_history()
    neutral = from_pydantic_ai(history)
    # A truncated tool return.
    old = next(m for m in neutral if m.extra.get(KEY) == [2, 1])
    assert isinstance(old, ToolResultMessage)
    short = dataclasses.replace(old, content=(TextBlock("[truncated]"),))
    back = to_pydantic_ai(_replace_at(neutral, [2, 1], short), history)
    request = back[2]
    assert isinstance(request, ModelRequest) and request is not history[2]
    assert request.parts[0] is history[2].parts[0]
    part = request.parts[1]
    assert isinstance(part, ToolReturnPart) and part.content == "[truncated]"
    assert (part.tool_call_id, part.metadata, part.timestamp) == ("c2", {"k": 1}, T)
    assert all(a is b for k, (a, b) in enumerate(zip(back, history, strict=True)) if k != 2)


def test_dropped_thinking_and_rewritten_arguments() -> None:
    history = varied_history()
    neutral = from_pydantic_ai(history)
    old = neutral[1]
    assert isinstance(old, AssistantMessage)
    call = old.content[3]
    assert isinstance(call, ToolCall)
    blocks = (old.content[1], old.content[2], dataclasses.replace(call, arguments={"q": "[cut]"}))
    back = to_pydantic_ai(
        _replace_at(neutral, [1], dataclasses.replace(old, content=blocks)), history
    )
    response = back[1]
    source = history[1]
    assert isinstance(response, ModelResponse) and isinstance(source, ModelResponse)
    assert response.parts[0] is source.parts[1] and response.parts[1] is source.parts[2]
    assert isinstance(response.parts[2], ToolCallPart)
    assert response.parts[2].args == '{"q":"[cut]"}'  # a string stays a string
    assert (response.usage, response.model_name, response.timestamp) == (
        source.usage,
        source.model_name,
        source.timestamp,
    )


def test_summary_and_condensed_turn_fit_pydantic_ais_shape() -> None:
    history = varied_history()
    neutral = from_pydantic_ai(history)
    summary = SummaryMessage("[summary of messages 1-9]")
    condensed = AssistantMessage((TextBlock("read a.py, grep"),), "stop")
    view = [neutral[0], summary, condensed, *neutral[-3:]]
    back = to_pydantic_ai(view, history)
    assert [type(m) for m in back] == [ModelRequest, ModelResponse, ModelRequest] + [
        ModelResponse,
        ModelRequest,
    ]
    first = back[0]
    assert isinstance(first, ModelRequest)
    # The system prompt stays first; the summary joins the task's request.
    assert first.parts[:2] == list(history[0].parts)
    assert first.parts[2] == UserPromptPart("[summary of messages 1-9]", timestamp=T)
    assert back[1].parts == [TextPart("read a.py, grep")]
    assert back[2] is history[-3] and back[3] is history[-2] and back[4] is history[-1]


def test_repairs_become_parts() -> None:
    """What `repair` makes for a provider (a stub result, text for an empty message) maps back
    to the parts pydantic-ai would send."""
    history = varied_history()
    neutral = from_pydantic_ai(history)
    stub = ToolResultMessage.of("c1", "[no result]", tool_name="read", is_error=True)
    empty = neutral[-1]
    assert isinstance(empty, UserMessage)
    filled = dataclasses.replace(empty, content=(TextBlock("(empty)"),))
    back = to_pydantic_ai([*neutral[:2], stub, *neutral[3:-1], filled], history)
    request = back[2]
    assert isinstance(request, ModelRequest)
    assert isinstance(request.parts[0], ToolReturnPart) and request.parts[0].outcome == "failed"
    assert request.parts[1] is history[2].parts[1]
    last = back[-1]
    assert isinstance(last, ModelRequest) and last.parts[0].content == "(empty)"  # type: ignore[union-attr]


def test_unknown_message_type_is_refused_with_its_index() -> None:
    from agentctx import UnsupportedMessageError

    with pytest.raises(UnsupportedMessageError, match="message 1"):
        from_pydantic_ai([varied_history()[0], {"kind": "request"}])  # type: ignore[list-item]


def test_keys_are_plain_json() -> None:
    for m in from_pydantic_ai(varied_history()):
        assert isinstance(m.extra, MappingProxyType)
        assert to_dict(from_dict(to_dict(m))) == to_dict(m)


# ---------------------------------------------------------------------------------------
# Packaging


def test_missing_framework_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['pydantic_ai'] = None\n"
        "from agentctx.errors import MissingExtraError\n"
        "try:\n"
        "    import agentctx.integrations.pydantic_ai\n"
        "except MissingExtraError as exc:\n"
        "    print(exc.extra, exc.module, sep='|')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "pydantic-ai|pydantic_ai"


def test_import_agentctx_imports_no_framework() -> None:
    code = (
        "import sys, agentctx, agentctx.integrations; "
        "bad = [m for m in ('pydantic_ai', 'langchain', 'langchain_core', 'langgraph', 'agents')"
        " if m in sys.modules]; print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


async def test_duplicate_call_ids_renamed_by_repair_stay_paired() -> None:
    """A model that reuses a call id: the view renames the second call and its return, and
    both renames reach pydantic-ai's parts."""
    files = [ToolReturnPart("read", "a", "call_1", timestamp=T)]
    history: list[ModelMessage] = [
        ModelRequest([UserPromptPart(TASK, timestamp=T)]),
        ModelResponse([ToolCallPart("read", {"path": "a"}, "call_1")], timestamp=T),
        ModelRequest(files),
        ModelResponse([ToolCallPart("read", {"path": "b"}, "call_1")], timestamp=T),
        ModelRequest([ToolReturnPart("read", "b", "call_1", timestamp=T, metadata={"m": 2})]),
    ]
    async with ContextManager(100_000) as ctx:
        view = await ctx.prepare(from_pydantic_ai(history))
    back = to_pydantic_ai(view, history)
    assert pairing_problems(back) == []
    assert back[:3] == history[:3] and back[1] is history[1]
    call = back[3].parts[0]
    result = back[4].parts[0]
    assert isinstance(call, ToolCallPart) and isinstance(result, ToolReturnPart)
    assert call.tool_call_id == result.tool_call_id == "call_1-2"
    assert (call.args, result.content, result.metadata) == ({"path": "b"}, "b", {"m": 2})


def test_run_sync_with_a_manager_not_entered() -> None:
    """``run_sync`` runs its own event loop: a manager used without ``async with`` works
    there (deterministic strategies; background summaries need the manager entered)."""
    seen: list[list[ModelMessage]] = []
    events: list[Event] = []
    ctx = Recording(Budget(context_window=12_000, reserve_output=1_000))
    ctx.subscribe(events.append)
    agent = Agent(tool_loop(6, seen), system_prompt=SYSTEM, tools=[read_file])
    try:
        result = agent.run_sync(TASK, capabilities=[AgentCtxCapability(ctx)])
    finally:
        # run_sync leaves the event loop it made open as the thread's current one; closed
        # here, or its sockets are reported unclosed in whichever test runs when it is freed.
        import asyncio

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            asyncio.get_event_loop().close()
        asyncio.set_event_loop(None)
    assert result.output == "They all compute values."
    assert any(isinstance(e, ContextCompacted) for e in events)
    for raw, view, _ in ctx.calls:
        assert check_view(view, raw) == []


async def test_a_part_changed_in_place_is_converted_again_and_compacted() -> None:
    """Found by hostile testing: the capability reused a message's conversion while it and
    its parts were the same objects, so a tool return grown in place went out whole, far over
    the budget, while the manager counted its old size."""
    from agentctx.integrations.pydantic_ai import _back, _Converter, _History

    at = datetime(2025, 1, 1, tzinfo=UTC)
    output = ToolReturnPart("read", "small", tool_call_id="c1", timestamp=at)
    history: list[ModelMessage] = [
        ModelRequest([UserPromptPart("the task", timestamp=at)]),
        ModelResponse([ToolCallPart("read", {"p": "f"}, tool_call_id="c1")], timestamp=at),
        ModelRequest([output]),
        ModelResponse([TextPart("ok")], timestamp=at),
        ModelRequest([UserPromptPart("go on", timestamp=at)]),
    ]
    converter = _Converter()
    async with ContextManager(Budget(context_window=4_000, reserve_output=0)) as ctx:
        for grow in (False, True):
            if grow:
                output.content = "x" * 400_000
            neutral = converter.neutral(list(history))
            assert neutral == from_pydantic_ai(history)
            sent = _back(await ctx.prepare(neutral), _History(history, neutral))
        chars = sum(len(str(p.content)) for m in sent for p in m.parts if hasattr(p, "content"))
        assert chars < 16_000
        assert ctx.prompt_tokens <= ctx.budget.limit


def test_request_usage_is_read_as_openai_usage_is() -> None:
    """Found by a hostile run (Z, finding 1): cache counts past the input were taken as
    they were (the same rule as `usage_of` now applies)."""
    from pydantic_ai.usage import RequestUsage

    from agentctx import Usage
    from agentctx.integrations.pydantic_ai import _usage

    usage = _usage(RequestUsage(input_tokens=100, output_tokens=5, cache_read_tokens=900))
    assert usage == Usage(0, 5, 100, 0)


PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d4944415478da63f8cfc0f01f0005000201e2213bc80000000049454e44ae426082"
)
FILES = {
    "pdf": BinaryContent(b"%PDF-1.4 contract", media_type="application/pdf"),
    "document-url": DocumentUrl("https://example.com/spec.pdf"),
    "audio-url": AudioUrl("https://example.com/call.mp3"),
    "video-url": VideoUrl("https://example.com/demo.mp4"),
    "image-url": ImageUrl("https://example.com/chart.png", vendor_metadata={"detail": "high"}),
    "png": BinaryContent(PNG, media_type="image/png", vendor_metadata={"detail": "low"}),
    # (AN, finding 4) A signed or CDN URL whose media type pydantic-ai cannot infer (its
    # ``media_type`` raises): a bare `ValueError` failed the whole run once agentctx was added.
    "untyped-image-url": ImageUrl("https://cdn.example.com/render?id=42&sig=abc"),
}


@pytest.mark.parametrize("name", list(FILES))
async def test_files_beside_a_cut_tool_return_and_a_repaired_task_are_kept(name: str) -> None:
    """Found by a hostile run (AH, finding 1): a prompt or tool return agentctx changed was
    rebuilt from its neutral blocks, and every document, audio, video or file URL in it was
    left out unsaid (the task's attached PDF, after an empty-text repair; each file beside a
    truncated tool output), and images lost their ``vendor_metadata``."""
    item = FILES[name]
    output = "\n".join(f"row {i} " + "z" * 70 for i in range(500))
    history: list[ModelMessage] = [
        ModelRequest([UserPromptPart(["Summarize the attached file.", "", item], timestamp=T)]),
        ModelResponse([ToolCallPart("fetch", {"n": 1}, "c0")], timestamp=T),
        ModelRequest([ToolReturnPart("fetch", [output, item], "c0", timestamp=T)]),
        ModelResponse([TextPart("ok")], timestamp=T),
    ]
    budget = Budget(context_window=6_000, reserve_output=1_000)
    async with ContextManager(budget, on_over_budget="send") as ctx:
        view = await ctx.prepare(from_pydantic_ai(history))
    sent = to_pydantic_ai(view, history)
    task, tool_return = sent[0].parts[0], sent[2].parts[0]
    assert isinstance(task, UserPromptPart) and isinstance(tool_return, ToolReturnPart)
    assert task.content == ["Summarize the attached file.", item]  # the empty text repaired
    cut = tool_return.content
    assert isinstance(cut, list) and len(cut[0]) < len(output) and cut[1:] == [item]
    assert cut[1].vendor_metadata == item.vendor_metadata  # type: ignore[union-attr]


def test_an_opaque_block_pydantic_ai_cannot_send_is_refused_not_dropped() -> None:
    history: list[ModelMessage] = [ModelRequest([UserPromptPart(["a", "b"], timestamp=T)])]
    (task,) = from_pydantic_ai(history)
    foreign = dataclasses.replace(
        task, content=(TextBlock("a"), OpaqueBlock("anthropic", {"type": "document"}))
    )
    with pytest.raises(UnsupportedMessageError, match="no part for it"):
        to_pydantic_ai([foreign], history)


@pytest.mark.parametrize(
    "item",
    [
        TextContent("order 42 shipped", metadata={"order_id": 42}),
        StructuredContent({"cart": [1, 2]}, description="cart"),
    ],
    ids=["text-content", "structured-content"],
)
async def test_a_changed_prompt_keeps_its_text_items_as_they_were(item: TextContent) -> None:
    """Found by a hostile run (AJ, finding 4): a prompt agentctx changed (here an empty text
    repaired) went back as one string: a `TextContent` lost its ``metadata`` and a
    `StructuredContent` the ``value`` pydantic-ai sends to models that take structured
    input."""
    history: list[ModelMessage] = [
        ModelRequest([UserPromptPart(["Summarize.", "", item], timestamp=T)]),
        ModelResponse([TextPart("ok")], timestamp=T),
    ]
    async with ContextManager(Budget(context_window=100_000)) as ctx:
        view = await ctx.prepare(from_pydantic_ai(history))
    task = to_pydantic_ai(view, history)[0].parts[0]
    assert isinstance(task, UserPromptPart) and task.content == ["Summarize.", item]


async def test_equal_items_of_a_changed_prompt_come_back_each_as_itself() -> None:
    """Found by a hostile run (AM, finding 1): an item was taken back as the first source
    item equal to it, so a second `TextContent` of the same text came back as the first
    (with its metadata), a plain string as a later `TextContent`, and a second image of the
    same URL with the first one's ``vendor_metadata``: the provider got another request."""
    items = [
        "same",
        TextContent("same", metadata={"n": 1}),
        TextContent("same", metadata={"n": 2}),
        ImageUrl("https://example.com/a.png", vendor_metadata={"detail": "low"}),
        ImageUrl("https://example.com/a.png", vendor_metadata={"detail": "high"}),
    ]
    history: list[ModelMessage] = [
        ModelRequest([UserPromptPart(["Task:", "", *items], timestamp=T)]),
        ModelResponse([TextPart("ok")], timestamp=T),
    ]
    async with ContextManager(Budget(context_window=100_000)) as ctx:
        view = await ctx.prepare(from_pydantic_ai(history))
    task = to_pydantic_ai(view, history)[0].parts[0]
    assert isinstance(task, UserPromptPart) and isinstance(task.content, list)
    assert [repr(i) for i in task.content] == [repr(i) for i in ["Task:", *items]]


def test_a_response_whose_reasoning_was_dropped_goes_back_without_item_ids() -> None:
    """With its reasoning left out, a response's text and calls went back with the item ids
    that name that reasoning, which the Responses API refuses (found by a hostile run)."""
    from agentctx.ledger import DropThinking, Ledger, anchor, render

    messages: list[ModelMessage] = [
        ModelRequest([UserPromptPart("the task")]),
        ModelResponse(
            [
                ThinkingPart("plan", id="rs_1", signature="enc", provider_name="openai"),
                TextPart("reading", id="msg_1"),
                ToolCallPart("read", {"path": "a"}, "call_1", id="fc_1"),
            ]
        ),
        ModelRequest([ToolReturnPart("read", "text of a", "call_1")]),
        ModelResponse([TextPart("done", id="msg_2")]),
        ModelRequest([UserPromptPart("next")]),
    ]
    raw = from_pydantic_ai(messages)
    ledger = Ledger()
    ledger.add(DropThinking(anchor(raw, 1), "old"), raw)
    view = render(raw, ledger).messages
    back = to_pydantic_ai(view, messages)
    response = back[1]
    assert isinstance(response, ModelResponse)
    assert [type(p) for p in response.parts] == [TextPart, ToolCallPart]
    assert [getattr(p, "id", None) for p in response.parts] == [None, None]
    assert back[3] is messages[3]  # a response that kept its reasoning is as it was


def test_a_pdf_a_prompt_carries_is_counted_by_its_pages() -> None:
    """A PDF as ``BinaryContent`` was counted as its base64 text: a 600 KB one made the run
    fail over budget before any request (found by a hostile run)."""
    from agentctx.tokens import MessageCounter
    from agentctx.tokens.media import PDF_PAGE_TOKENS

    pages = b"".join(b"<< /Type /Page >>\n" for _ in range(2))
    pdf = b"%PDF-1.7\n" + pages + bytes(range(256)) * 800
    prompt = UserPromptPart(["summarize", BinaryContent(pdf, media_type="application/pdf")])
    (message,) = from_pydantic_ai([ModelRequest([prompt])])
    counted = MessageCounter(lazy=False).count(message)
    assert 2 * PDF_PAGE_TOKENS <= counted < 2 * PDF_PAGE_TOKENS + 200


def test_a_computer_call_whose_reasoning_was_dropped_loses_its_stored_item_id_too() -> None:
    """A computer call keeps the item it came as in ``provider_details``, which pydantic-ai's
    Responses model sends as it is: its id still named the reasoning left out (a hostile
    run)."""
    from pydantic_ai.computer_use import ComputerCallPart

    from agentctx.ledger import DropThinking, Ledger, anchor, render

    item = {"type": "computer_call", "id": "cu_1", "call_id": "call_1", "status": "completed"}
    call = ComputerCallPart(
        "computer",
        {"actions": [{"type": "screenshot"}]},
        tool_call_id="call_1",
        id="cu_1",
        provider_name="openai",
        provider_details={"computer_call": item},
    )
    messages: list[ModelMessage] = [
        ModelRequest([UserPromptPart("open the page")]),
        ModelResponse([ThinkingPart("plan", id="rs_1", signature="enc"), call]),
        ModelRequest([ToolReturnPart("computer", "done", "call_1")]),
        ModelResponse([TextPart("opened")]),
        ModelRequest([UserPromptPart("next")]),
    ]
    raw = from_pydantic_ai(messages)
    ledger = Ledger()
    ledger.add(DropThinking(anchor(raw, 1), "old"), raw)
    (back,) = to_pydantic_ai(render(raw, ledger).messages, messages)[1].parts  # type: ignore[union-attr]
    assert back.id is None and back.provider_details == {  # type: ignore[union-attr]
        "computer_call": {"type": "computer_call", "call_id": "call_1", "status": "completed"}
    }


async def test_a_providers_compaction_part_is_never_dropped_by_the_tiers() -> None:
    """Found by a hostile run (BR 2): a `CompactionPart` (a provider's own compaction, a
    briefing someone paid for) was not taken for one through this integration, and the
    tiers dropped it behind their marker from the sixth request on."""

    def read_file(path: str) -> str:
        """Read a file."""
        return "\n".join(f"{path} line {k}: value = compute(x) * 2 # pad" for k in range(200))

    seen: list[list[ModelMessage]] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(list(messages))
        n = len(seen)
        parts: list[Any] = (
            [CompactionPart("enc: earlier work", provider_name="openai")] if n == 1 else []
        )
        parts.append(TextPart(f"reading f{n}"))
        if n <= 10:
            parts.append(ToolCallPart("read_file", {"path": f"f{n}"}, f"c{n}"))
        return ModelResponse(parts, usage=RequestUsage(input_tokens=10, output_tokens=5))

    events: list[Event] = []
    agent = Agent(FunctionModel(model), tools=[read_file])
    async with ContextManager(Budget(context_window=9_000, reserve_output=500)) as ctx:
        ctx.subscribe(events.append)
        await agent.run("Research f1..f10.", capabilities=[AgentCtxCapability(ctx, observe=False)])
    assert any(isinstance(e, ContextCompacted) for e in events)
    for sent in seen[1:]:
        assert any(
            isinstance(p, CompactionPart)
            for m in sent
            if isinstance(m, ModelResponse)
            for p in m.parts
        )


def test_a_pydantic_ai_without_prepare_model_request_is_refused_not_silently_ignored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by a docs check (DD, finding 2): on pydantic-ai-slim before 2.64 (2.62 is what
    pydantic-ai-harness pins) no hook the capability defines is called: it was accepted and
    every request went out whole, with no event and no error. It is refused when made."""
    from pydantic_ai.capabilities import AbstractCapability

    from agentctx.errors import MissingExtraError

    monkeypatch.delattr(AbstractCapability, "prepare_model_request")
    with pytest.raises(MissingExtraError, match=r"no prepare_model_request hook; it came in 2\.64"):
        AgentCtxCapability(ContextManager(Budget(context_window=80_000)))
