"""Views a provider would reject, one regression per rule, through the real SDKs.

Each test sends the raw history to the fake servers (the real APIs' rules) and gets the real
API's 400, then sends the view agentctx makes of it (in owned and projection mode, through
`agentctx.testing.drive`) and has it accepted by Anthropic Messages, OpenAI Chat Completions
and OpenAI Responses alike. The repairs are those documented in `agentctx.boundaries`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import anthropic
import openai
import pytest

from agentctx.adapters import (
    from_openai_chat,
    from_openai_responses,
    to_anthropic,
    to_openai_chat,
    to_openai_responses,
)
from agentctx.boundaries import EMPTY_TEXT, LEADING_TEXT
from agentctx.budget import Budget
from agentctx.events import Event, TranscriptRepaired
from agentctx.manager import ContextManager
from agentctx.messages import (
    AssistantMessage,
    Message,
    SummaryMessage,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    canonical_json,
)
from agentctx.strategies import ToolOutputPipeline
from agentctx.testing import check_view, drive
from agentctx.testing._validate import sign
from agentctx.testing.servers import FakeAnthropic, FakeOpenAI

from .helpers import returns_within

MODEL = "m"
TOOLS = [{"name": "read", "description": "Read a file.", "input_schema": {"type": "object"}}]
CHAT_TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]
RESPONSES_TOOLS = [{"type": "function", "name": "read", "parameters": {"type": "object"}}]
Mode = Literal["owned", "projection"]


@dataclass
class Providers:
    """The fake Anthropic and OpenAI APIs with a real SDK client for each."""

    anthropic: anthropic.AsyncAnthropic
    openai: openai.AsyncOpenAI

    async def problems(
        self, messages: Sequence[Message], apis: Sequence[str] = ("anthropic", "chat", "responses")
    ) -> dict[str, str | None]:
        """Each endpoint's answer to ``messages``: its 400 message, or None if accepted."""
        out: dict[str, str | None] = {}
        calls = {
            "anthropic": lambda: self.anthropic.messages.create(
                model=MODEL, max_tokens=64, tools=TOOLS, messages=to_anthropic(messages)
            ),
            "chat": lambda: self.openai.chat.completions.create(
                model=MODEL, tools=CHAT_TOOLS, messages=to_openai_chat(messages)
            ),
            "responses": lambda: self.openai.responses.create(
                model=MODEL, tools=RESPONSES_TOOLS, input=to_openai_responses(messages)
            ),
        }
        for name, call in calls.items():
            if name not in apis:
                continue
            try:
                await call()
                out[name] = None
            except (anthropic.BadRequestError, openai.BadRequestError) as e:
                out[name] = str(e)
        return out

    async def with_thinking(self, messages: Sequence[Message]) -> None:
        """Send ``messages`` to Anthropic with thinking on; a 400 raises."""
        await self.anthropic.messages.create(
            model=MODEL,
            max_tokens=2048,
            thinking={"type": "enabled", "budget_tokens": 1024},
            tools=TOOLS,  # type: ignore[arg-type]
            messages=to_anthropic(messages),  # type: ignore[arg-type]
        )


@pytest.fixture
async def providers() -> AsyncIterator[Providers]:
    async with FakeAnthropic() as ant, FakeOpenAI() as oai:
        async with (
            anthropic.AsyncAnthropic(base_url=ant.url, api_key="t", max_retries=0) as a,
            openai.AsyncOpenAI(base_url=oai.url + "/v1", api_key="t", max_retries=0) as o,
        ):
            yield Providers(a, o)
        assert ant.errors == [] and oai.errors == []


async def repaired(
    turns: Sequence[Sequence[Message]], mode: Mode
) -> tuple[list[Message], list[str], Sequence[Message]]:
    """Drive ``turns`` (each view checked by `check_view`); the last view, every repair
    reported, and the raw history."""
    events: list[Event] = []
    async with ContextManager(100_000) as ctx:
        ctx.subscribe(events.append)
        views = await drive(ctx, turns, mode=mode)
        again = await ctx.prepare(views[-1] if mode == "owned" else [m for t in turns for m in t])
        # byte-stable: the same history gives the same bytes, call after call
        assert [canonical_json(m) for m in again] == [canonical_json(m) for m in views[-1]]
        reported = [r for e in events if isinstance(e, TranscriptRepaired) for r in e.repairs]
        assert len(reported) == len(set(reported))  # each repair reported once
        return views[-1], reported, list(ctx.raw)


def read(call_id: str, path: str = "a.py") -> ToolCall:
    return ToolCall(call_id, "read", {"path": path})


def calls(*call_ids: str, text: str | None = None) -> AssistantMessage:
    blocks: list[Any] = [TextBlock(text)] if text is not None else []
    blocks += [read(c, f"{c}-{k}.py") for k, c in enumerate(call_ids)]
    return AssistantMessage(tuple(blocks), "tool_use")


def ids(view: Sequence[Message]) -> list[tuple[str, str]]:
    """(kind, id) of every call and result, in order."""
    out = []
    for m in view:
        if isinstance(m, AssistantMessage):
            out += [("call", c.id) for c in m.tool_calls]
        elif isinstance(m, ToolResultMessage):
            out.append(("result", m.tool_call_id))
    return out


MODES: list[Mode] = ["owned", "projection"]


@pytest.mark.parametrize("mode", MODES)
async def test_whitespace_only_user_message(providers: Providers, mode: Mode) -> None:
    history: list[Message] = [UserMessage.of("\n")]
    answers = await providers.problems(history)
    assert "text content blocks must contain non-whitespace text" in str(answers["anthropic"])
    view, reported, _ = await repaired([history], mode)
    assert view == [UserMessage.of(EMPTY_TEXT)]
    assert reported == ["empty_message@0"]
    assert await providers.problems(view) == dict.fromkeys(answers)
    # later on, as the latest user message, it stays a user turn
    turns = [[UserMessage.of("task")], [AssistantMessage.of("Done."), UserMessage.of("\n")]]
    view, reported, _ = await repaired(turns, mode)
    assert view[-1] == UserMessage.of(EMPTY_TEXT) and reported == ["empty_message@2"]
    assert await providers.problems(view) == dict.fromkeys(answers)


@pytest.mark.parametrize("mode", MODES)
async def test_whitespace_text_before_a_tool_call(providers: Providers, mode: Mode) -> None:
    history: list[Message] = [
        UserMessage.of("Read a.py"),
        calls("toolu_1", text="\n\n"),
        ToolResultMessage.of("toolu_1", "print(1)"),
    ]
    answers = await providers.problems(history)
    assert "text content blocks must contain non-whitespace text" in str(answers["anthropic"])
    view, reported, raw = await repaired([history], mode)
    assert view[1] == calls("toolu_1") and view[::2] == history[::2]
    assert raw == history  # the raw history is untouched
    assert reported == ["empty_text@1"]
    assert await providers.problems(view) == dict.fromkeys(answers)


@pytest.mark.parametrize("mode", MODES)
async def test_call_0_on_every_turn(providers: Providers, mode: Mode) -> None:
    """Some OpenAI-compatible servers number calls per response: ``call_0`` every time."""
    turns: list[list[Message]] = [[UserMessage.of("Read three files")]]
    turns += [[calls("call_0"), ToolResultMessage.of("call_0", f"file {n}")] for n in range(3)]
    history = [m for t in turns for m in t]
    answers = await providers.problems(history)
    assert "tool_use ids must be unique" in str(answers["anthropic"])
    assert "Duplicate value for 'tool_call_id' of 'call_0'" in str(answers["chat"])
    assert "Duplicate function_call_output for call_id 'call_0'" in str(answers["responses"])
    view, reported, raw = await repaired(turns, mode)
    assert ids(view) == [
        ("call", "call_0"),
        ("result", "call_0"),
        ("call", "call_0-2"),
        ("result", "call_0-2"),
        ("call", "call_0-3"),
        ("result", "call_0-3"),
    ]
    # each result still answers its own call
    assert [m.content for m in view if isinstance(m, ToolResultMessage)] == [
        m.content for m in history if isinstance(m, ToolResultMessage)
    ]
    assert reported == [
        "duplicate_call_id@3:call_0->call_0-2",
        "duplicate_call_id@5:call_0->call_0-3",
    ]
    assert ids(raw) == [(k, "call_0") for k in ("call", "result") * 3]  # raw untouched
    assert await providers.problems(view) == dict.fromkeys(answers)


@pytest.mark.parametrize("mode", MODES)
async def test_duplicate_ids_within_a_batch(providers: Providers, mode: Mode) -> None:
    history: list[Message] = [
        UserMessage.of("Read two files"),
        calls("call_0", "call_0"),
        ToolResultMessage.of("call_0", "first"),
        ToolResultMessage.of("call_0", "second"),
    ]
    answers = await providers.problems(history)
    assert "tool_use ids must be unique" in str(answers["anthropic"])
    assert "Duplicate value for 'tool_call_id' of 'call_0'" in str(answers["chat"])
    assert "Duplicate function_call_output for call_id 'call_0'" in str(answers["responses"])
    view, reported, _ = await repaired([history], mode)
    renamed = view[1]
    assert isinstance(renamed, AssistantMessage)
    assert [(c.id, c.arguments["path"]) for c in renamed.tool_calls] == [
        ("call_0", "call_0-0.py"),
        ("call_0-2", "call_0-1.py"),
    ]
    # the k-th result carrying an id answers the k-th call carrying it
    assert view[2:] == [
        ToolResultMessage.of("call_0", "first"),
        ToolResultMessage.of("call_0-2", "second"),
    ]
    assert reported == ["duplicate_call_id@1:call_0->call_0-2"]
    assert await providers.problems(view) == dict.fromkeys(answers)


@pytest.mark.parametrize("mode", MODES)
async def test_history_starting_with_an_assistant_message(providers: Providers, mode: Mode) -> None:
    history: list[Message] = [
        AssistantMessage.of("Hello! What shall we work on?"),
        UserMessage.of("Fix the failing test."),
    ]
    answers = await providers.problems(history)
    assert answers["anthropic"] is not None
    assert 'first message must use the "user" role' in answers["anthropic"]
    view, reported, _ = await repaired([history], mode)
    assert view == [SummaryMessage(LEADING_TEXT), *history]
    assert reported == ["leading_assistant@0"]
    assert await providers.problems(view) == dict.fromkeys(answers)
    # appending keeps the placeholder and every byte before the new messages
    more = [calls("toolu_1"), ToolResultMessage.of("toolu_1", "ok")]
    longer, _, _ = await repaired([history, more], mode)
    assert longer[: len(view)] == view and check_view(longer, [*history, *more]) == []


@pytest.mark.parametrize("mode", MODES)
async def test_every_rule_at_once_keeps_prefix_bytes(providers: Providers, mode: Mode) -> None:
    """All the hostile shapes in one session, fed turn by turn: each view is accepted and
    extends the previous one byte for byte (no decision is taken at this budget)."""
    turns: list[list[Message]] = [
        [AssistantMessage.of("Hi."), UserMessage.of(" ")],
        [calls("call_0", "call_0", text=" "), *(ToolResultMessage.of("call_0", "x"),) * 2],
        [AssistantMessage.of("\n"), UserMessage.of("go on")],
        [calls("call_0"), ToolResultMessage.of("call_0", "y")],
    ]
    previous: list[str] = []
    async with ContextManager(100_000) as ctx:
        history: list[Message] = []
        for turn in turns:
            history = [*history, *turn]
            view = await ctx.prepare(history)
            assert check_view(view, ctx.raw) == []
            assert await providers.problems(view) == dict.fromkeys(
                ("anthropic", "chat", "responses")
            )
            current = [canonical_json(m) for m in view]
            assert current[: len(previous)] == previous
            previous = current
            if mode == "owned":
                history = list(view)


# -- reasoning, and ids from elsewhere (an audit of the real APIs' rules) ----------------------


def thought(text: str) -> ThinkingBlock:
    return ThinkingBlock(text, sign(text))


def reasoning_item(item_id: str, secret: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "summary": [], "encrypted_content": secret}


def answer_item(item_id: str, text: str) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": []}
    return {"type": "message", "id": item_id, "role": "assistant", "content": [part]}


@pytest.mark.parametrize("mode", MODES)
async def test_blank_text_beside_reasoning_is_filled_in_place(
    providers: Providers, mode: Mode
) -> None:
    """Adaptive thinking separates thinking blocks with an empty text block. Anthropic
    rejects the empty block, and rejects the latest assistant message's thinking blocks
    moved ("cannot be modified"): leaving the blank out moved them."""
    step = AssistantMessage(
        (thought("plan A"), TextBlock(""), thought("plan B"), TextBlock("Look."), read("toolu_1")),
        "tool_use",
    )
    history: list[Message] = [
        UserMessage.of("Fix a.py"),
        step,
        ToolResultMessage.of("toolu_1", "x"),
    ]
    assert (await providers.problems(history, ["anthropic"]))["anthropic"] is not None
    view, reported, _ = await repaired([history], mode)
    assert [type(b) for b in view[1].content] == [type(b) for b in step.content]  # type: ignore[union-attr]
    assert view[1].content[1] == TextBlock(EMPTY_TEXT) and reported == ["empty_text@1"]  # type: ignore[union-attr]
    await providers.with_thinking(view)


async def test_a_reasoning_answer_with_blank_text_keeps_its_message(providers: Providers) -> None:
    """Responses: a reasoning item needs the item after it; Chat: an answer needs content.
    Leaving a blank answer out left the reasoning alone (and Chat's content null)."""
    items = [
        {"role": "user", "content": "Prove it"},
        reasoning_item("rs_1", "E" * 40),
        answer_item("msg_1", ""),
        {"role": "user", "content": "continue"},
    ]
    chat = [
        {"role": "user", "content": "Prove it"},
        {"role": "assistant", "content": "", "reasoning_content": "Step by step."},
        {"role": "user", "content": "continue"},
    ]
    for history, api in [
        (from_openai_responses(items), "responses"),
        (from_openai_chat(chat), "chat"),
    ]:
        async with ContextManager(100_000) as ctx:
            view = await ctx.prepare(history)
        assert check_view(view, history) == []
        assert await providers.problems(view, [api]) == {api: None}
        if api == "responses":
            kinds = [i.get("type", "message") for i in to_openai_responses(view)]
            assert kinds[1:3] == ["reasoning", "message"]


@pytest.mark.parametrize("mode", MODES)
async def test_a_steering_message_keeps_the_tool_loop_running(
    providers: Providers, mode: Mode
) -> None:
    """A user message right after tool results goes out in the results' turn: the loop is
    still running, and with thinking on Anthropic wants its thinking ("a final `assistant`
    message must start with a thinking block"). The pipeline dropped it as an old step's."""
    now = 1_700_000_000.0
    old = {"timestamp": int(now * 1000) - 3_600_000}
    history: list[Message] = [
        UserMessage((TextBlock("Fix a.py"),), old),
        AssistantMessage((thought("Read it first."), read("toolu_1")), "tool_use", extra=old),
        ToolResultMessage("toolu_1", (TextBlock("x = 1"),), "read", False, old),
        UserMessage.of("Also check the README."),
    ]
    async with ContextManager(100_000, strategy=ToolOutputPipeline(), clock=lambda: now) as ctx:
        view = (await drive(ctx, [history], mode=mode))[-1]
    assert check_view(view, history) == [] and view[1] == history[1]
    await providers.with_thinking(view)


async def test_items_of_a_step_whose_reasoning_was_left_out_go_without_ids() -> None:
    """Responses (store=true): "Item 'fc_...' of type 'function_call' was provided without
    its required 'reasoning' item": an id names the reasoning item it followed."""
    t0 = 1_700_000_000_000
    items = [
        {"role": "user", "content": "Fix the test"},
        reasoning_item("rs_1", "E" * 8000),
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "read",
            "arguments": '{"path": "t.py"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "1 failed"},
        reasoning_item("rs_2", "F" * 8000),
        answer_item("msg_2", "Fixed."),
        {"role": "user", "content": "Now the changelog"},
    ]
    history = [_stamped(m, t0 + k * 1000) for k, m in enumerate(from_openai_responses(items))]
    async with ContextManager(
        Budget(context_window=20_000, reserve_output=2_000),
        strategy=ToolOutputPipeline(),
        clock=lambda: t0 / 1000 + 7_200,
    ) as ctx:
        sent = to_openai_responses(await ctx.prepare(history))
    assert not any(i.get("type") == "reasoning" for i in sent)  # the old steps' reasoning left
    assert [i.get("id") for i in sent if i.get("id")] == []


def _stamped(m: Message, ms: int) -> Message:
    extra = {**m.extra, "timestamp": ms}
    if isinstance(m, AssistantMessage):
        return AssistantMessage(m.content, m.stop_reason, m.usage, m.model, extra)
    if isinstance(m, ToolResultMessage):
        return ToolResultMessage(m.tool_call_id, m.content, m.tool_name, m.is_error, extra)
    assert isinstance(m, UserMessage)
    return UserMessage(m.content, extra)


@pytest.mark.parametrize("mode", MODES)
async def test_a_call_id_from_another_provider_is_renamed(providers: Providers, mode: Mode) -> None:
    """Anthropic: "tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'" (pi writes
    Responses ids as ``call_1|fc_2``)."""
    history: list[Message] = [
        UserMessage.of("Read a.py"),
        calls("call_1|fc_2", "call 3"),
        ToolResultMessage.of("call_1|fc_2", "print(1)"),
        ToolResultMessage.of("call 3", "print(3)"),
    ]
    assert "should match pattern" in str((await providers.problems(history))["anthropic"])
    view, reported, _ = await repaired([history], mode)
    assert ids(view) == [
        ("call", "call_1_fc_2"),
        ("call", "call_3"),
        ("result", "call_1_fc_2"),
        ("result", "call_3"),
    ]
    assert sorted(r.split(":")[0] for r in reported) == ["invalid_call_id@1"] * 2
    assert await providers.problems(view) == {"anthropic": None, "chat": None, "responses": None}


def test_check_view_reads_a_long_session_with_reasoning_in_linear_time() -> None:
    """Found by hostile testing: every reasoning block was looked for in a list of all the
    raw ones, so checking a 27k-message view with reasoning took 17 s; and a forged block is
    still found."""
    raw: list[Message] = [UserMessage.of("the task")]
    for k in range(15_000):
        thought = ThinkingBlock(f"thought {k}", f"sig{k}")
        raw += [
            AssistantMessage((thought, ToolCall(f"c{k}", "bash", {}))),
            ToolResultMessage.of(f"c{k}", "ok"),
        ]
    with returns_within(5):
        assert check_view(raw, raw) == []
    forged = AssistantMessage((ThinkingBlock("thought 1", "forged"), TextBlock("x")))
    (problem,) = check_view([*raw[:-2], forged], raw[:-2])
    assert "not byte-identical" in problem


async def test_old_reasoning_beside_provider_items_stays_so_their_ids_can_go_back() -> None:
    """Found by hostile testing: the pipeline dropped the reasoning of old Responses steps
    holding a web search call and an item reference, and the adapter then sent those items
    without the ids the API requires (an id names the reasoning item it followed). Such a
    step keeps its reasoning: the pipeline proposes no drop, and `take` refuses one."""
    from types import MappingProxyType

    from agentctx import Chain, DeterministicCompaction, MemoryRecallStore
    from agentctx.adapters import from_openai_responses, to_openai_responses
    from agentctx.errors import ConfigError
    from agentctx.ledger import DropThinking, Ledger, anchor
    from agentctx.testing._validate import validate_responses

    now = 1_700_000_000.0
    items: list[dict[str, Any]] = [{"role": "user", "content": "task"}]
    for i in range(6):
        items += [
            {"type": "reasoning", "id": f"rs_{i}", "encrypted_content": "enc",
             "summary": [{"type": "summary_text", "text": "think " * 400}]},
            {"type": "web_search_call", "id": f"ws_{i}", "status": "completed",
             "action": {"type": "search", "query": "q"}},
            {"type": "item_reference", "id": f"ref_{i}"},
            {"type": "message", "id": f"msg_{i}", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": f"answer {i}", "annotations": []}]},
            {"role": "user", "content": f"question {i + 1}"},
        ]  # fmt: skip
    history: list[Message] = []
    for k, m in enumerate(from_openai_responses(items)):
        stamped = MappingProxyType({**m.extra, "timestamp": int((now - 10_000 + k) * 1000)})
        if isinstance(m, AssistantMessage):
            history.append(AssistantMessage(m.content, m.stop_reason, m.usage, m.model, stamped))
        else:
            assert isinstance(m, UserMessage)
            history.append(UserMessage(m.content, stamped))
    async with ContextManager(
        Budget(context_window=14_000, reserve_output=1_000),
        strategy=Chain([ToolOutputPipeline(), DeterministicCompaction()]),
        recall=MemoryRecallStore(),
        clock=lambda: now,
        on_over_budget="send",
    ) as ctx:
        view = await ctx.prepare(history)
    sent = to_openai_responses(view)
    assert validate_responses({"model": "m", "input": sent}, sent) is None
    kept = [it.get("id") for it in sent if it.get("type") in ("web_search_call", "item_reference")]
    assert kept and all(isinstance(i, str) for i in kept)
    with pytest.raises(ConfigError, match="provider items"):
        Ledger().add(DropThinking(anchor(history, 1), "custom"), history)


async def _thinking_problem(providers: Providers, messages: list[Any], *, on: bool) -> str | None:
    """Anthropic's 400 for raw request ``messages`` with thinking on or off (None: taken)."""
    extra: dict[str, Any] = {"thinking": {"type": "enabled", "budget_tokens": 1024}} if on else {}
    try:
        await providers.anthropic.messages.create(
            model=MODEL, max_tokens=2048, tools=TOOLS, messages=messages, **extra
        )
    except anthropic.BadRequestError as e:
        return str(e)
    return None


@pytest.mark.parametrize("mode", MODES)
async def test_a_tool_loop_that_thinks_on_its_first_step_only_is_sent_whole(
    providers: Providers, mode: Mode
) -> None:
    """Found by a hostile run (CX 5): without interleaved thinking Claude thinks on the
    first step of a tool loop only, and the API reads the loop as one assistant turn that
    must start with thinking. The fake server wanted the newest step to start with thinking:
    it refused that ordinary loop, and took one that turned thinking on mid-turn."""
    history: list[Message] = [
        UserMessage.of("Fix a.py"),
        AssistantMessage((thought("Read it, then b.py."), read("toolu_1")), "tool_use"),
        ToolResultMessage.of("toolu_1", "x = 1"),
        AssistantMessage((read("toolu_2", "b.py"),), "tool_use"),
        ToolResultMessage.of("toolu_2", "y = 2"),
    ]
    assert await _thinking_problem(providers, to_anthropic(history), on=True) is None
    view, reported, _ = await repaired([history], mode)
    assert view == history and reported == []
    await providers.with_thinking(view)
    switched = [history[0], calls("toolu_1"), history[2], history[1], history[4]]
    switched[3] = AssistantMessage((thought("Now think."), read("toolu_2")), "tool_use")
    problem = await _thinking_problem(providers, to_anthropic(switched), on=True)
    assert problem is not None and "must start with a thinking block" in problem


@pytest.mark.parametrize("thinking", [True, False], ids=["thinking on", "thinking off"])
async def test_a_response_cut_off_after_its_thinking_is_left_out(
    providers: Providers, thinking: bool
) -> None:
    """Found by a hostile run (CX 6): a history ending on an assistant message of thinking
    only (a response cut off after it) went out as it was; the API refuses a final block
    that is thinking, and, thinking off, any thinking in the final assistant message. The
    Anthropic adapter leaves it out, as the Responses one leaves out a trailing reasoning
    item: the request asks for the answer again."""
    cut = AssistantMessage((thought("Planning the report."),))
    history: list[Message] = [UserMessage.of("Write the report."), cut]
    block = cut.content[0]
    assert isinstance(block, ThinkingBlock)
    blocks = [{"type": "thinking", "thinking": block.thinking, "signature": block.signature}]
    as_given = [
        {"role": "user", "content": "Write the report."},
        {"role": "assistant", "content": blocks},
    ]
    problem = await _thinking_problem(providers, as_given, on=thinking)
    assert problem is not None and "cannot be `thinking`" in problem
    async with ContextManager(100_000) as ctx:
        view = await ctx.prepare(history)
    assert view == history  # the session's view keeps it: the adapter leaves it out
    assert to_anthropic(view) == [{"role": "user", "content": "Write the report."}]
    assert await _thinking_problem(providers, to_anthropic(view), on=thinking) is None
    prefill = [
        as_given[0],
        {"role": "assistant", "content": [*blocks, {"type": "text", "text": "I"}]},
    ]
    problem = await _thinking_problem(providers, prefill, on=False)
    assert "When thinking is disabled" in str(problem)  # none in the final assistant message


async def test_a_response_cut_off_after_a_later_thinking_block_is_left_out_whole(
    providers: Providers,
) -> None:
    """Found by the re-run (CZ 1): interleaved thinking cut off after a later block
    (``[thinking, text, thinking]``) still ended the request on thinking, and leaving out a
    thinking-only message could leave the assistant message before it (one turn to the API)
    ending the request on text with trailing whitespace, which a final assistant message
    cannot end with. The assistant messages at the end are left out whole."""
    question = UserMessage.of("Find the bug.")
    for tail in (
        [AssistantMessage((thought("a"), TextBlock("Checking."), thought("b")))],
        [
            AssistantMessage((thought("a"), TextBlock("Checking the logs:\n\n")), "max_tokens"),
            AssistantMessage((thought("b"),)),
        ],
    ):
        history: list[Message] = [question, *tail]
        async with ContextManager(100_000) as ctx:
            view = await ctx.prepare(history)
        assert to_anthropic(view) == [{"role": "user", "content": "Find the bug."}]
        for on in (True, False):
            assert await _thinking_problem(providers, to_anthropic(view), on=on) is None
    answered = [question, AssistantMessage((thought("a"), TextBlock("Done.")))]
    assert len(to_anthropic(answered)) == 2  # a prefill that ends on text is the caller's
