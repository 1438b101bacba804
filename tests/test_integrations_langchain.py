"""agentctx inside LangChain v1: the middleware through ``create_agent`` with LangChain's own fake
chat model, the ``trigger`` / ``keep`` vocabulary, and the lossless conversion."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    convert_to_openai_messages,
    messages_from_dict,
    messages_to_dict,
)
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from agentctx import (
    AssistantMessage,
    Budget,
    ConfigError,
    ContextCompacted,
    ContextManager,
    DeterministicCompaction,
    Event,
    HistoryResynced,
    ImageBlock,
    Message,
    SummaryMessage,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    UnsupportedMessageError,
    UserMessage,
)
from agentctx.boundaries import repair
from agentctx.integrations.langchain import (
    KEY,
    AgentCtxMiddleware,
    context_manager,
    from_langchain,
    to_langchain,
)
from agentctx.messages import from_dict, to_dict
from agentctx.recall import MemoryRecallStore
from agentctx.strategies.deterministic import COMPACTION_MARKER
from agentctx.testing import check_view
from agentctx.testing._validate import validate_chat

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


class ToolFakeModel(GenericFakeChatModel):
    """LangChain's generic fake chat model, able to take tools (``create_agent`` binds them)
    and keeping the messages of every call."""

    seen: list[list[BaseMessage]] = []

    def bind_tools(self, tools: Any, **kwargs: Any) -> ToolFakeModel:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        self.seen.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


@tool
def read_file(path: str) -> str:
    """Read a file of the project."""
    return "\n".join(f"{path} line {k}: " + "value = compute(x) * 2  # " * 2 for k in range(250))


def script(files: int, first: int = 1, thinking: bool = False) -> Iterator[AIMessage]:
    """The model's turns: a signed thought, a line and a call per file, then the answer."""
    for n in range(first, first + files):
        content: Any = f"Reading f{n}."
        if thinking:
            content = [
                {"type": "thinking", "thinking": f"next is f{n}", "signature": f"sig-{n}"},
                {"type": "text", "text": f"Reading f{n}."},
            ]
        call = {"name": "read_file", "args": {"path": f"f{n}"}, "id": f"call_{n}"}
        yield AIMessage(content=content, tool_calls=[call])
    yield AIMessage(content="They all compute values.")


def payload(messages: list[BaseMessage]) -> list[str]:
    """The messages as the model call serializes them, one JSON text each."""
    return [json.dumps(d, sort_keys=True) for d in messages_to_dict(messages)]


def pairing_problems(messages: list[BaseMessage]) -> list[str]:
    problems = []
    open_calls: set[str] = set()
    for k, m in enumerate(messages):
        if isinstance(m, ToolMessage):
            if m.tool_call_id not in open_calls:
                problems.append(f"message {k}: orphan ToolMessage {m.tool_call_id}")
            open_calls.discard(m.tool_call_id)
            continue
        if open_calls:
            problems.append(f"message {k}: calls {open_calls} never answered")
        open_calls = (
            {c["id"] for c in m.tool_calls if c["id"]} if isinstance(m, AIMessage) else set()
        )
    if open_calls:
        problems.append(f"calls {open_calls} never answered")
    return problems


async def run_agent(
    files: int = 9, *, thinking: bool = False, window: int = 11_000
) -> tuple[Recording, list[list[BaseMessage]], list[BaseMessage], list[Event]]:
    model = ToolFakeModel(messages=script(files, thinking=thinking), seen=[])
    events: list[Event] = []
    async with Recording(Budget(context_window=window, reserve_output=1_000)) as ctx:
        ctx.subscribe(events.append)
        agent = create_agent(
            model, [read_file], system_prompt=SYSTEM, middleware=[AgentCtxMiddleware(ctx)]
        )
        state = await agent.ainvoke({"messages": [HumanMessage(TASK)]})
    return ctx, model.seen, state["messages"], events


async def test_tool_loop_over_budget_sends_valid_compacted_views() -> None:
    ctx, seen, messages, events = await run_agent()
    assert any(isinstance(e, ContextCompacted) for e in events)
    assert not any(isinstance(e, HistoryResynced) for e in events)
    assert len(ctx.calls) == len(seen) == 10
    for raw, view, _ in ctx.calls:
        assert check_view(view, raw) == []
    for sent in seen:
        # What an OpenAI chat model would be sent is a transcript the API accepts.
        body = {"model": "m", "messages": convert_to_openai_messages(sent)}
        assert validate_chat(body) is None, validate_chat(body)
    last = seen[-1]
    # Truncated tool output, or a stretch dropped behind agentctx's marker.
    assert any("truncated" in str(m.content) or COMPACTION_MARKER in str(m.content) for m in last)
    assert sum(map(len, payload(last[1:]))) < 0.75 * sum(map(len, payload(messages[:-1])))
    # The graph state is never rewritten: every tool result whole.
    results = [m for m in messages if isinstance(m, ToolMessage)]
    assert [m.content for m in results] == [
        read_file.invoke({"path": f"f{n}"}) for n in range(1, 10)
    ]


async def test_no_orphaned_tool_pairs_after_compaction() -> None:
    """SummarizationMiddleware's known failure: a ToolMessage whose AIMessage call was
    summarized away (or a call whose result was). Never here, in any request."""
    ctx, seen, _, events = await run_agent(files=12, window=9_000)
    assert sum(isinstance(e, ContextCompacted) for e in events) >= 2
    for sent in seen:
        assert pairing_problems(sent[1:]) == []


async def test_task_prompt_survives_compaction() -> None:
    _, seen, messages, events = await run_agent(files=12, window=9_000)
    assert any(isinstance(e, ContextCompacted) for e in events)
    task = messages[0]
    for sent in seen:
        assert isinstance(sent[0], SystemMessage) and sent[0].content == SYSTEM
        assert sent[1] is task or sent[1] == task


async def test_prefix_is_byte_stable_when_nothing_new_is_decided() -> None:
    """No re-clearing every turn: a call that decides nothing sends the previous request's
    messages, byte for byte, before its new ones."""
    ctx, seen, _, _ = await run_agent()
    decided = [d for _, _, d in ctx.calls]
    assert any(decided) and not all(decided[1:])
    stable = 0
    for k in range(1, len(seen)):
        if not decided[k]:
            before, now = payload(seen[k - 1]), payload(seen[k])
            assert now[: len(before)] == before, f"call {k} rewrote the prefix"
            stable += 1
    assert stable >= 2


async def test_signed_thinking_goes_back_as_it_came() -> None:
    ctx, seen, messages, _ = await run_agent(thinking=True)
    for raw, view, _ in ctx.calls:
        assert check_view(view, raw) == []
    originals = {id(m): m for m in messages}
    for sent in seen:
        for m in sent:
            if isinstance(m, AIMessage) and isinstance(m.content, list):
                thoughts = [b for b in m.content if isinstance(b, dict) and b["type"] == "thinking"]
                for b in thoughts:
                    assert b["signature"] == "sig-" + b["thinking"].removeprefix("next is f")
                if thoughts:
                    assert id(m) in originals  # an untouched message is the state's object


async def test_a_thread_continues_across_invocations() -> None:
    model = ToolFakeModel(messages=iter([*script(4), *script(4, first=5)]), seen=[])
    events: list[Event] = []
    config: Any = {"configurable": {"thread_id": "t1"}}
    async with Recording(Budget(context_window=11_000, reserve_output=1_000)) as ctx:
        ctx.subscribe(events.append)
        agent = create_agent(
            model,
            [read_file],
            system_prompt=SYSTEM,
            middleware=[AgentCtxMiddleware(ctx)],
            checkpointer=InMemorySaver(),
        )
        await agent.ainvoke({"messages": [HumanMessage(TASK)]}, config)
        state = await agent.ainvoke({"messages": [HumanMessage("Four more.")]}, config)
    assert not any(isinstance(e, HistoryResynced) for e in events)
    assert any(isinstance(e, ContextCompacted) for e in events)
    for raw, view, _ in ctx.calls:
        assert check_view(view, raw) == []
    assert len(state["messages"]) == 2 * (1 + 4 * 2 + 1)
    humans = [m.content for m in model.seen[-1] if isinstance(m, HumanMessage)]
    assert humans[0] == TASK and "Four more." in humans


async def test_usage_metadata_is_observed() -> None:
    reply = AIMessage(
        "done",
        usage_metadata={
            "input_tokens": 1_000,
            "output_tokens": 5,
            "total_tokens": 1_005,
            "input_token_details": {"cache_read": 600, "cache_creation": 100},
        },
    )
    model = ToolFakeModel(messages=iter([reply]), seen=[])
    async with ContextManager(100_000) as ctx:
        agent = create_agent(model, [], middleware=[AgentCtxMiddleware(ctx)])
        await agent.ainvoke({"messages": [HumanMessage(TASK)]})
    assert (ctx.usage.input_tokens, ctx.usage.cache_read_tokens) == (300, 600)
    assert (ctx.usage.cache_write_tokens, ctx.usage.output_tokens) == (100, 5)


async def test_sync_invoke_says_to_use_ainvoke() -> None:
    model = ToolFakeModel(messages=script(1), seen=[])
    async with ContextManager(100_000) as ctx:
        agent = create_agent(model, [read_file], middleware=[AgentCtxMiddleware(ctx)])
        with pytest.raises(NotImplementedError, match="ainvoke"):
            agent.invoke({"messages": [HumanMessage(TASK)]})


@pytest.mark.parametrize("arguments", [{"limit": 10**9, "note": 1}, {"offset": "x"}])
async def test_the_middleware_gives_the_agent_a_bounded_recall_tool(
    arguments: dict[str, Any],
) -> None:
    """Found by a hostile run (CD 1): no integration had the ``recall_context`` tool; the
    natural one to bind, ``ctx.recall`` through ``StructuredTool``, returned a whole
    244k-character entry to ``limit: 10**9`` and a bare TypeError to an extra key. With a
    recall store the middleware registers the tool, answered as ``handle_recall`` answers."""
    store = MemoryRecallStore()
    async with ContextManager(100_000, recall=store) as ctx:
        rid = store.put(ctx.session_id, "x" * 50_000)
        call = {"name": "recall_context", "args": {"id": rid, **arguments}, "id": "c1"}
        turns = iter([AIMessage(content="", tool_calls=[call]), AIMessage(content="done")])
        model = ToolFakeModel(messages=turns, seen=[])
        middleware = AgentCtxMiddleware(ctx, observe=False)
        assert [t.name for t in middleware.tools] == ["recall_context"]
        agent = create_agent(model, [read_file], middleware=[middleware])
        state = await agent.ainvoke({"messages": [HumanMessage(TASK)]})
    (answer,) = [m.content for m in state["messages"] if isinstance(m, ToolMessage)]
    assert isinstance(answer, str) and answer.startswith("[recall_context") and len(answer) < 8_200
    async with ContextManager(100_000) as bare:
        assert AgentCtxMiddleware(bare).tools == []  # no store: no tool to answer with


# ---------------------------------------------------------------------------------------
# trigger / keep


def test_trigger_tokens_is_the_hard_budget() -> None:
    ctx = context_manager(trigger=("tokens", 50_000))
    assert ctx.budget.limit == 50_000 and ctx.budget.target_tokens == 25_000
    assert isinstance(ctx.strategy, DeterministicCompaction)


def test_keep_messages_is_the_retained_tail() -> None:
    ctx = context_manager(trigger=("tokens", 50_000), keep=("messages", 7))
    assert ctx.strategy == DeterministicCompaction(keep_recent_steps=4)


def test_keep_tokens_is_the_target() -> None:
    ctx = context_manager(trigger=("tokens", 50_000), keep=("tokens", 10_000))
    assert ctx.budget.target_tokens == 10_000


def test_fractions_read_the_models_profile() -> None:
    model = GenericFakeChatModel(messages=iter([]), profile={"max_input_tokens": 200_000})
    ctx = context_manager(trigger=("fraction", 0.8), keep=("fraction", 0.3), model=model)
    assert ctx.budget.context_window == 200_000
    assert ctx.budget.limit == 160_000 and ctx.budget.target_tokens == 60_000


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"trigger": ("messages", 50)}, "tokens"),
        ({"trigger": ("fraction", 0.8)}, "max_input_tokens"),
        ({"trigger": ("tokens", 0)}, "tokens"),
        ({"trigger": ("tokens", 100), "keep": ("messages", -1)}, "whole n"),
        # Tuples of the wrong length raised IndexError (found by a hostile run).
        ({"trigger": ("tokens", 100), "keep": ("messages",)}, "tuple"),
        ({"trigger": ("tokens", 100), "keep": ()}, "tuple"),
        (
            {
                "trigger": ("tokens", 100),
                "keep": ("messages", 3),
                "strategy": DeterministicCompaction(),
            },
            "one or the other",
        ),
    ],
)
def test_what_has_no_agentctx_equivalent_is_refused(kwargs: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        context_manager(**kwargs)


# ---------------------------------------------------------------------------------------
# Conversion


def varied_messages() -> list[BaseMessage]:
    return [
        SystemMessage("Be brief.", id="s0"),
        HumanMessage("Fix the bug", id="h1"),
        AIMessage(
            content=[
                {"type": "thinking", "thinking": "look first", "signature": "sig-1"},
                {"type": "text", "text": "Reading."},
                {"type": "tool_use", "id": "c1", "name": "read", "input": {"path": "a.py"}},
            ],
            tool_calls=[
                {"name": "read", "args": {"path": "a.py"}, "id": "c1", "type": "tool_call"}
            ],
            usage_metadata={"input_tokens": 10, "output_tokens": 2, "total_tokens": 12},
            response_metadata={"model_name": "claude", "stop_reason": "tool_use"},
            id="a2",
        ),
        ToolMessage("print(1)", tool_call_id="c1", name="read", id="t3", artifact={"raw": 1}),
        AIMessage(
            content="",
            tool_calls=[
                {"name": "grep", "args": {"q": "x"}, "id": "c2", "type": "tool_call"},
                {"name": "run", "args": {"cmd": "pytest"}, "id": "c3", "type": "tool_call"},
            ],
            id="a4",
        ),
        ToolMessage("no match", tool_call_id="c2", status="error", id="t5"),
        ToolMessage(
            [
                {"type": "text", "text": "2 failed"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}},
            ],
            tool_call_id="c3",
            id="t6",
        ),
        AIMessage(
            content=[
                {"type": "reasoning", "reasoning": "summary of thought", "id": "rs_1"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Done.", "annotations": []},
                {"type": "web_search_call", "id": "ws_1"},
            ],
            id="a7",
        ),
        HumanMessage(
            content=[
                {"type": "text", "text": "And this?"},
                {"type": "image", "url": "https://x/y.png"},
                {"type": "file", "file_id": "f1"},
            ],
            id="h8",
        ),
        SystemMessage("Remaining: 3 calls", id="s9"),
        AIMessage("", id="a10"),
    ]


def test_round_trip_is_the_messages_themselves() -> None:
    messages = varied_messages()
    back = to_langchain(from_langchain(messages), messages)
    assert back == messages
    assert all(a is b for a, b in zip(back, messages, strict=True))


def test_round_trip_survives_json_on_both_sides() -> None:
    messages = messages_from_dict(messages_to_dict(varied_messages()))
    neutral = [from_dict(to_dict(m)) for m in from_langchain(messages)]
    back = to_langchain(neutral, messages)
    assert all(a is b for a, b in zip(back, messages, strict=True))


def test_neutral_form() -> None:
    neutral = from_langchain(varied_messages())
    assert [type(m).__name__ for m in neutral] == [
        "UserMessage",  # the leading SystemMessage rides in front, untouched
        "AssistantMessage",
        "ToolResultMessage",
        "AssistantMessage",
        "ToolResultMessage",
        "ToolResultMessage",
        "AssistantMessage",
        "UserMessage",
        "UserMessage",  # a later SystemMessage
        "AssistantMessage",
    ]
    first = neutral[1]
    assert isinstance(first, AssistantMessage)
    # The tool_use block repeats the call: the call is modeled once.
    assert [type(b).__name__ for b in first.content] == ["ThinkingBlock", "TextBlock", "ToolCall"]
    thinking = first.content[0]
    assert isinstance(thinking, ThinkingBlock)
    assert (thinking.thinking, thinking.signature) == ("look first", "sig-1")
    assert neutral[4].is_error and neutral[4].extra[KEY] == [5]  # type: ignore[union-attr]
    assert [b.type for b in neutral[5].content] == ["text", "image"]  # type: ignore[union-attr]
    reasoning = neutral[6]
    assert isinstance(reasoning, AssistantMessage)
    assert [b.type for b in reasoning.content] == [
        "thinking",
        "redacted_thinking",
        "text",
        "opaque",
    ]
    assert neutral[8].extra["role"] == "system"
    assert neutral[9].content == ()  # type: ignore[union-attr]


def _swap(neutral: list[Message], index: int, new: Message) -> list[Message]:
    return [new if m.extra.get(KEY) == [index] else m for m in neutral]


def test_a_truncated_result_changes_only_its_content() -> None:
    messages = varied_messages()
    neutral = from_langchain(messages)
    old = neutral[2]
    assert isinstance(old, ToolResultMessage)
    back = to_langchain(
        _swap(neutral, 3, dataclasses.replace(old, content=(TextBlock("[cut]"),))), messages
    )
    result = back[3]
    assert isinstance(result, ToolMessage) and result is not messages[3]
    assert (result.content, result.tool_call_id, result.id, result.artifact) == (
        "[cut]",
        "c1",
        "t3",
        {"raw": 1},
    )
    assert all(a is b for k, (a, b) in enumerate(zip(back, messages, strict=True)) if k != 3)


def test_dropped_thinking_and_rewritten_arguments() -> None:
    messages = varied_messages()
    neutral = from_langchain(messages)
    old = neutral[1]
    assert isinstance(old, AssistantMessage)
    call = old.content[2]
    assert isinstance(call, ToolCall)
    blocks = (old.content[1], dataclasses.replace(call, arguments={"path": "[cut]"}))
    back = to_langchain(_swap(neutral, 2, dataclasses.replace(old, content=blocks)), messages)
    ai = back[2]
    source = messages[2]
    assert isinstance(ai, AIMessage) and isinstance(source, AIMessage)
    assert ai.content == [
        {"type": "text", "text": "Reading."},
        {"type": "tool_use", "id": "c1", "name": "read", "input": {"path": "[cut]"}},
    ]
    assert ai.tool_calls == [
        {"name": "read", "args": {"path": "[cut]"}, "id": "c1", "type": "tool_call"}
    ]
    assert (ai.id, ai.usage_metadata, ai.response_metadata) == (
        source.id,
        source.usage_metadata,
        source.response_metadata,
    )


def test_what_agentctx_makes_maps_to_langchain_messages() -> None:
    messages = varied_messages()
    neutral = from_langchain(messages)
    condensed = AssistantMessage((TextBlock("read a.py; ran grep and pytest"),), "stop")
    stub = ToolResultMessage.of("c9", "[no result]", tool_name="run", is_error=True)
    call = AssistantMessage.of(tool_calls=[ToolCall("c9", "run", {"cmd": "ls"})])
    empty = neutral[-1]
    assert isinstance(empty, AssistantMessage)
    filled = dataclasses.replace(empty, content=(TextBlock("(empty)"),))
    view = [neutral[0], SummaryMessage("[summary]"), condensed, call, stub, *neutral[7:9], filled]
    back = to_langchain(view, messages)
    assert back[0] is messages[0] and back[1] is messages[1]
    assert back[2] == HumanMessage("[summary]")
    assert back[3] == AIMessage("read a.py; ran grep and pytest")
    assert isinstance(back[4], AIMessage) and back[4].tool_calls[0]["id"] == "c9"
    assert back[5] == ToolMessage("[no result]", tool_call_id="c9", name="run", status="error")
    assert back[6] is messages[8] and back[7] is messages[9]
    assert isinstance(back[8], AIMessage) and back[8].content == "(empty)" and back[8].id == "a10"


def test_unknown_message_type_is_refused_with_its_index() -> None:
    from langchain_core.messages import ChatMessage

    with pytest.raises(UnsupportedMessageError, match="message 1"):
        from_langchain([HumanMessage("hi"), ChatMessage(content="x", role="critic")])


def test_keys_are_plain_json() -> None:
    for m in from_langchain(varied_messages()):
        assert to_dict(from_dict(to_dict(m))) == to_dict(m)
        assert isinstance(m, UserMessage | AssistantMessage | ToolResultMessage)


# ---------------------------------------------------------------------------------------
# Packaging


def test_missing_framework_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['langchain'] = None\n"
        "from agentctx.errors import MissingExtraError\n"
        "try:\n"
        "    import agentctx.integrations.langchain\n"
        "except MissingExtraError as exc:\n"
        "    print(exc.extra, exc.module, sep='|')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "langchain|langchain"


async def test_duplicate_call_ids_renamed_by_repair_stay_paired() -> None:
    """A model that reuses a call id: the view renames the second call (its tool_use block
    too) and its result, and the renames reach the LangChain messages."""

    def call(path: str) -> AIMessage:
        return AIMessage(
            content=[{"type": "tool_use", "id": "c1", "name": "read", "input": {"path": path}}],
            tool_calls=[{"name": "read", "args": {"path": path}, "id": "c1", "type": "tool_call"}],
        )

    messages: list[BaseMessage] = [
        HumanMessage(TASK),
        call("a"),
        ToolMessage("a", tool_call_id="c1"),
        call("b"),
        ToolMessage("b", tool_call_id="c1", artifact={"n": 2}),
    ]
    async with ContextManager(100_000) as ctx:
        view = await ctx.prepare(from_langchain(messages))
    back = to_langchain(view, messages)
    assert pairing_problems(back) == []
    assert all(a is b for a, b in zip(back[:3], messages[:3], strict=True))
    second, result = back[3], back[4]
    assert isinstance(second, AIMessage) and isinstance(result, ToolMessage)
    assert second.tool_calls[0]["id"] == result.tool_call_id == "c1-2"
    assert second.content == [
        {"type": "tool_use", "id": "c1-2", "name": "read", "input": {"path": "b"}}
    ]
    assert (result.content, result.artifact) == ("b", {"n": 2})


async def test_a_message_changed_in_place_is_converted_again_and_compacted() -> None:
    """Found by hostile testing: the middleware reused a message's conversion while it was the
    same object, so a tool result grown in place went out whole, far over the budget, while
    the manager counted its old size."""
    from agentctx.integrations.langchain import _back, _Converter, _History

    output = ToolMessage("small", tool_call_id="c1", name="read")
    call = {"name": "read", "args": {"p": "f"}, "id": "c1", "type": "tool_call"}
    history = [
        HumanMessage(TASK),
        AIMessage("", tool_calls=[call]),
        output,
        AIMessage("ok"),
        HumanMessage("go on"),
    ]
    converter = _Converter()
    async with ContextManager(Budget(context_window=4_000, reserve_output=0)) as ctx:
        for grow in (False, True):
            if grow:
                output.content = "x" * 400_000
            neutral = converter.neutral(list(history))
            assert neutral == from_langchain(history)
            sent = _back(await ctx.prepare(neutral), _History(history, neutral))
        assert sum(len(str(m.content)) for m in sent) < 16_000
        assert ctx.prompt_tokens <= ctx.budget.limit


def test_usage_metadata_is_read_as_openai_usage_is() -> None:
    """Found by a hostile run (Z, finding 1): the middleware read ``usage_metadata`` its own
    way: cache reads past the input were taken, and a negative count reached `observe`,
    whose `ConfigError` failed the agent's model call."""
    from langchain_core.messages import AIMessage

    from agentctx import ContextManager, Usage
    from agentctx.integrations.langchain import _usage

    meta: Any = {
        "input_tokens": 100,
        "output_tokens": -5,
        "total_tokens": 95,
        "input_token_details": {"cache_read": 900},
    }
    usage = _usage(AIMessage(content="ok", usage_metadata=meta))
    assert usage == Usage(0, 0, 100, 0)
    ContextManager(20_000).observe(usage)


def _png_b64() -> str:
    from .helpers import png

    return png(300, 200)


@pytest.mark.parametrize(
    "item",
    [
        {"type": "image", "base64": "{d}", "mime_type": "image/png"},
        {"type": "image", "source_type": "base64", "data": "{d}", "mime_type": "image/png"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "{d}"}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,{d}"}},
    ],
    ids=["standard", "older standard", "anthropic", "openai"],
)
def test_an_image_in_any_form_langchain_takes_is_an_image(item: dict[str, Any]) -> None:
    """The older standard form and Anthropic's own were kept as opaque items, counted as their
    base64 text: one screenshot a tool returned had the next model call fail over budget
    (found by a hostile run)."""
    data = _png_b64()
    filled = json.loads(json.dumps(item).replace("{d}", data))
    messages: list[BaseMessage] = [
        HumanMessage(TASK),
        HumanMessage([{"type": "text", "text": "see"}, filled]),
    ]
    neutral = from_langchain(messages)
    (image,) = [b for b in neutral[1].content if not isinstance(b, TextBlock)]
    assert isinstance(image, ImageBlock) and (image.media_type, image.data) == ("image/png", data)
    assert to_langchain(neutral, messages) == messages


def test_a_v1_tool_call_item_repeating_a_call_rides_with_it() -> None:
    """With ``output_version="v1"`` each call is also a ``tool_call`` content item: it was an
    opaque copy, its arguments counted twice and never cut, its id not renamed with the call
    (found by a hostile run)."""

    def call(path: str) -> AIMessage:
        c = {
            "name": "write",
            "args": {"path": path, "text": "x" * 5000},
            "id": "c1",
            "type": "tool_call",
        }
        return AIMessage(content=[c], tool_calls=[c])

    messages: list[BaseMessage] = [
        HumanMessage(TASK),
        call("a"),
        ToolMessage("ok", tool_call_id="c1"),
        call("b"),
        ToolMessage("ok", tool_call_id="c1"),
    ]
    neutral = from_langchain(messages)
    assert [type(b) for b in neutral[1].content] == [ToolCall]  # not twice
    repaired, _, _ = repair(neutral)
    back = to_langchain(repaired, messages)
    second = back[3]
    assert isinstance(second, AIMessage)
    assert second.tool_calls[0]["id"] == second.content[0]["id"] == back[4].tool_call_id == "c1-2"  # type: ignore[index]


async def test_a_call_the_model_wrote_bad_arguments_for_stays_paired_with_its_error() -> None:
    """``create_agent`` answers a call whose arguments do not parse (``invalid_tool_calls``)
    with an error ``ToolMessage``. The call was not read: the error was dropped as an orphan
    result, the message got "(empty)", and the provider, which sends such calls, refused the
    call without its answer (found by a hostile run)."""
    bad = AIMessage(
        "",
        invalid_tool_calls=[
            {
                "name": "read",
                "args": '{"path": "a.py"',
                "id": "call_1",
                "error": "bad json",
                "type": "invalid_tool_call",
            }
        ],
    )
    error = ToolMessage("could not be executed: bad json", tool_call_id="call_1", status="error")
    messages: list[BaseMessage] = [HumanMessage(TASK), bad, error, HumanMessage("try again")]
    events: list[Event] = []
    async with ContextManager(100_000) as ctx:
        ctx.subscribe(events.append)
        view = await ctx.prepare(from_langchain(messages))
    assert events == []  # nothing repaired
    assert to_langchain(view, messages) == messages
    (call,) = [b for b in view[1].content if isinstance(b, ToolCall)]
    assert (call.id, call.name, call.extra["arguments"]) == ("call_1", "read", '{"path": "a.py"')


def test_a_v1_invalid_tool_call_item_rides_with_its_call() -> None:
    """v1 content also repeats a call whose arguments do not parse (``invalid_tool_call``):
    it was an opaque copy, counted twice, its id not renamed with the call (a hostile run)."""

    def bad(path: str) -> AIMessage:
        c = {"name": "read", "args": '{"path": "' + path, "id": "c1", "error": "bad json"}
        return AIMessage(content=[c | {"type": "invalid_tool_call"}], invalid_tool_calls=[c])

    def error() -> ToolMessage:
        return ToolMessage("bad json", tool_call_id="c1", status="error")

    messages: list[BaseMessage] = [HumanMessage(TASK), bad("a"), error(), bad("b"), error()]
    neutral = from_langchain(messages)
    assert [type(b) for b in neutral[1].content] == [ToolCall]
    repaired, _, _ = repair(neutral)
    back = to_langchain(repaired, messages)
    second = back[3]
    assert isinstance(second, AIMessage) and isinstance(back[4], ToolMessage)
    assert second.invalid_tool_calls[0]["id"] == second.content[0]["id"] == "c1-2"  # type: ignore[index]
    assert back[4].tool_call_id == "c1-2"
    assert second.content[0]["args"] == '{"path": "b'  # type: ignore[index]


def test_a_valid_and_an_invalid_call_sharing_an_id_keep_their_own_items() -> None:
    """Renamed apart by the repair, each v1 content item says what its own call says (the
    valid call's item took the invalid one's new id and written arguments; a hostile run)."""
    good = {"name": "read", "args": {"path": "a"}, "id": "c1", "type": "tool_call"}
    bad = {"name": "read", "args": '{"path": "', "id": "c1", "error": "bad"}
    bad_item = bad | {"type": "invalid_tool_call"}
    ai = AIMessage(content=[dict(good), bad_item], tool_calls=[good], invalid_tool_calls=[bad])
    messages: list[BaseMessage] = [HumanMessage(TASK), ai, ToolMessage("x", tool_call_id="c1")]
    repaired, _, _ = repair(from_langchain(messages))
    back = to_langchain(repaired, messages)[1]
    assert isinstance(back, AIMessage)
    assert [(i["id"], i["args"]) for i in back.content] == [  # type: ignore[index]
        (back.tool_calls[0]["id"], back.tool_calls[0]["args"]),
        (back.invalid_tool_calls[0]["id"], back.invalid_tool_calls[0]["args"]),
    ]


def test_a_providers_compaction_block_is_taken_for_one() -> None:
    """Found by a hostile run (BR 2): an Anthropic ``compaction`` block in an `AIMessage`
    was not taken for a provider's own compaction through this integration, so the tiers
    could drop it (they did, from the sixth request of a live agent on)."""
    from agentctx.summarizer import is_native_compaction

    block = {"type": "compaction", "content": "Earlier: the user prefers tabs."}
    history = from_langchain(
        [HumanMessage("task"), AIMessage(content=[block, {"type": "text", "text": "ok"}])]
    )
    assert is_native_compaction(history[1])
    assert not is_native_compaction(from_langchain([AIMessage("compaction")])[0])


async def test_a_batch_repeating_a_call_id_gets_each_calls_own_id_in_its_content() -> None:
    """Found by a hostile run (BR 1): in a parallel batch that repeats one id, the second
    call is renamed (``c1-2``), and the rename was applied to every content item with the
    source id: both ``tool_use`` items said ``c1-2``, which Anthropic refuses ("tool_use ids
    must be unique"), the first call's answer left without its call."""
    ai = AIMessage(
        content=[
            {"type": "tool_use", "id": "c1", "name": "read", "input": {"path": "a"}},
            {"type": "tool_use", "id": "c1", "name": "read", "input": {"path": "b"}},
        ],
        tool_calls=[
            {"name": "read", "args": {"path": "a"}, "id": "c1", "type": "tool_call"},
            {"name": "read", "args": {"path": "b"}, "id": "c1", "type": "tool_call"},
        ],
    )
    messages = [
        HumanMessage("Read a and b."),
        ai,
        ToolMessage("A", tool_call_id="c1"),
        ToolMessage("B", tool_call_id="c1"),
        AIMessage("done"),
    ]
    async with ContextManager(100_000) as ctx:
        view = await ctx.prepare(from_langchain(messages))
    back = to_langchain(view, messages)
    sent = back[1]
    assert isinstance(sent, AIMessage) and isinstance(sent.content, list)
    assert [item["id"] for item in sent.content] == ["c1", "c1-2"]  # type: ignore[index]
    assert [call["id"] for call in sent.tool_calls] == ["c1", "c1-2"]
    assert [item["input"] for item in sent.content] == [{"path": "a"}, {"path": "b"}]  # type: ignore[index]
    assert [m.tool_call_id for m in back if isinstance(m, ToolMessage)] == ["c1", "c1-2"]
