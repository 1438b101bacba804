"""SWE-agent and OpenHands importers: the real corpus, synthetic edge cases, malformed files,
and format detection across every corpus folder."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from agentctx.boundaries import repair, validate
from agentctx.budget import Budget
from agentctx.errors import TranscriptFormatError
from agentctx.importers import Transcript, detect_format, load_transcript, openhands, swe_agent
from agentctx.importers._common import Source, iso_to_ms
from agentctx.importers.swe_agent import JsonDocument
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
    from_dict,
    text_of,
    to_dict,
)
from agentctx.recall import MemoryRecallStore
from agentctx.testing import assert_view_ok

from .corpus import corpus_file, corpus_files

if TYPE_CHECKING:
    from pathlib import Path

SWE_AGENT = corpus_files("swe-agent")
OPENHANDS = corpus_files("openhands")


def _stats(messages: tuple[Message, ...], more_outputs: list[UserMessage]) -> tuple[int, ...]:
    """The per-file counts of tests/corpus/README.md, computed from neutral messages.

    (assistant, calls, results, parallel, width, thought, largest, over_10k, total). Width is
    the largest number of calls in one response; thought counts responses with text and calls.
    ``more_outputs`` are messages the table counts as tool results though they are not.
    """
    replies = [m for m in messages if isinstance(m, AssistantMessage)]
    results: list[ToolResultMessage | UserMessage] = [
        m for m in messages if isinstance(m, ToolResultMessage)
    ]
    results += more_outputs
    outputs = [len(text_of(m.content)) for m in results]
    return (
        len(replies),
        sum(len(m.tool_calls) for m in replies),
        len(results),
        sum(len(m.tool_calls) > 1 for m in replies),
        max((len(m.tool_calls) for m in replies), default=0),
        sum(
            bool(m.tool_calls) and any(isinstance(b, TextBlock) for b in m.content) for m in replies
        ),
        max(outputs, default=0),
        sum(n > 10_000 for n in outputs),
        sum(outputs),
    )


def _unanswered(messages: tuple[Message, ...]) -> list[ToolCall]:
    """Every call no result answers anywhere in the history."""
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolResultMessage)}
    return [
        c
        for m in messages
        if isinstance(m, AssistantMessage)
        for c in m.tool_calls
        if c.id not in answered
    ]


def _orphans(messages: tuple[Message, ...]) -> list[str]:
    """The ids of results that answer no call of the history."""
    calls = {c.id for m in messages if isinstance(m, AssistantMessage) for c in m.tool_calls}
    return [
        m.tool_call_id
        for m in messages
        if isinstance(m, ToolResultMessage) and m.tool_call_id not in calls
    ]


def _round_trips(transcript: Transcript) -> None:
    for m in (*transcript.messages, *transcript.demonstrations):
        assert from_dict(to_dict(m)) == m


def _write(tmp_path: Path, text: str, name: str) -> Path:
    path = tmp_path / name
    path.write_text(text, "utf-8")
    return path


def _jsonl(records: list[Any]) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records)


def _traj_text(history: list[Any], **top: Any) -> str:
    """A trajectory with one history item per line: item k is on line 3 + k."""
    head = "".join(f"  {json.dumps(k)}: {json.dumps(v)},\n" for k, v in top.items())
    items = ",\n".join(f"    {json.dumps(item)}" for item in history)
    return '{\n  "history": [\n' + items + "\n  ],\n" + head + '  "info": {}\n}\n'


def _array_text(events: list[Any]) -> str:
    """A JSON array with one event per line: event k is on line 2 + k."""
    return "[\n" + ",\n".join(f"  {json.dumps(e)}" for e in events) + "\n]\n"


# --- the whole corpus ---------------------------------------------------------------------


@pytest.mark.parametrize("path", SWE_AGENT + OPENHANDS, ids=lambda p: p.name)
def test_every_corpus_file_imports(path: Path) -> None:
    transcript = load_transcript(path)
    assert transcript.format == path.parent.name
    assert transcript.path == str(path)
    assert transcript.messages
    _round_trips(transcript)
    # The library's documented repair turns each into a history the providers accept.
    repaired, _, _ = repair(transcript.messages)
    assert validate(repaired, "openai") == []


def _expected_format(path: Path) -> str | None:
    if path.name == "assistant-message-with-thinking-code.json":
        return None  # one pi message, not a transcript
    return path.parent.name


@pytest.mark.parametrize(
    "path",
    [p for kind in ("pi", "claude-code", "swe-agent", "openhands") for p in corpus_files(kind)],
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_detection_picks_each_folders_format(path: Path) -> None:
    expected = _expected_format(path)
    if expected is None:
        with pytest.raises(TranscriptFormatError, match="single JSON object"):
            detect_format(path)
    else:
        assert detect_format(path) == expected
        assert load_transcript(path).format == expected


@pytest.mark.parametrize(
    "path",
    corpus_files("anthropic-api") + corpus_files("openai-api"),
    ids=lambda p: p.name,
)
def test_api_recordings_are_still_refused(path: Path) -> None:
    with pytest.raises(TranscriptFormatError, match="SWE-agent trajectory, OpenHands events"):
        load_transcript(path)


# The V1 file is an excerpt that starts with an assistant action: no view of it can be valid
# for Anthropic, whatever the manager does.
REPLAYED = [
    (path, i)
    for path in SWE_AGENT + OPENHANDS
    if path.name != "v1-sdk-goal-events.jsonl"
    for i in range(len(openhands.load_instances(path)) if path in OPENHANDS else 1)
]


@pytest.mark.parametrize(
    ("path", "instance"), REPLAYED, ids=lambda v: v.name if hasattr(v, "name") else str(v)
)
@pytest.mark.parametrize("mode", ["owned", "projection"])
async def test_imported_sessions_keep_every_invariant(path: Path, instance: int, mode: str) -> None:
    """The replay of tests/test_corpus_invariants.py, on the SWE-agent and OpenHands corpus."""
    if path in OPENHANDS:
        messages = list(openhands.load(path, instance=instance).messages)
    else:
        messages = list(swe_agent.load(path).messages)
    budget = Budget(context_window=40_000, reserve_output=8_000)
    async with ContextManager(
        budget, recall=MemoryRecallStore(), on_over_budget="send", session_id=path.name
    ) as ctx:
        caller: list[Message] = []
        taken = 0
        for i, m in enumerate(messages):
            if not (isinstance(m, AssistantMessage) and i > 0):
                continue
            new = messages[taken:i]
            taken = i
            caller = [*caller, *new] if mode == "owned" else messages[:i]
            view = await ctx.prepare(caller)
            assert_view_ok(view, ctx.raw)
            assert ctx.prompt_tokens <= budget.limit
            if mode == "owned":
                caller = view
        assert list(ctx.raw) == messages[:taken]


def test_the_corpus_is_there() -> None:
    assert len(SWE_AGENT) == 6 and len(OPENHANDS) == 6


_TASK = {"id": 0, "source": "user", "action": "message", "args": {"content": "task"}}
_RUN = {"id": 1, "source": "agent", "action": "run", "args": {"command": "ls"}}
_OUT = {"id": 2, "source": "agent", "observation": "run", "cause": 1, "content": "a b"}


@pytest.mark.parametrize(
    ("text", "fmt", "kinds"),
    [
        ('{"history": [{"role": "user", "content": "x"}]}\n', "swe-agent", "U"),
        (_jsonl([_TASK, _RUN, _OUT]), "openhands", "UAT"),
        (
            json.dumps({"instance_id": "i", "history": [_TASK, _RUN, _OUT]}, indent=2),
            "openhands",
            "UAT",
        ),
        (
            _jsonl(
                [
                    {
                        "instruction": "task",
                        "history": [
                            [{"action": "message", "content": "task"}, {"observation": "null"}],
                            [
                                {"action": "run", "command": "ls", "thought": "look"},
                                {"observation": "run", "content": "a b"},
                            ],
                        ],
                    }
                ]
            ),
            "openhands",
            "UAT",
        ),
        (_array_text([_TASK, _RUN, _OUT]), "openhands", "UAT"),
        (json.dumps([to_dict(UserMessage.of("x"))]), "neutral", "U"),
    ],
    ids=["traj-one-line", "v0-jsonl", "eval-pretty", "eval-pairs", "v0-array", "neutral"],
)
def test_detection_of_other_layouts(tmp_path: Path, text: str, fmt: str, kinds: str) -> None:
    path = _write(tmp_path, text, "t.json")
    assert detect_format(path) == fmt
    transcript = load_transcript(path)
    assert "".join(type(m).__name__[0] for m in transcript.messages) == kinds


REPLAY_SNAPSHOTS = "demo-marshmallow-1867-function_calling_replace_from_source.traj"
# (assistant, calls, results, parallel, width, thought, largest, over_10k, total)
SWE_AGENT_TABLE = {
    "demo-function_calling_simple.traj": (5, 5, 5, 0, 1, 5, 609, 0, 1647),
    "demo-marshmallow-1867-function_calling.traj": (11, 11, 11, 0, 1, 11, 9063, 0, 19851),
    REPLAY_SNAPSHOTS: (13, 13, 13, 0, 1, 13, 6277, 0, 20492),
    "gpt4-pydicom__pydicom-1458.traj": (12, 12, 12, 0, 1, 12, 5158, 0, 26174),
    "gpt4-swe-agent__test-repo-i1.traj": (5, 5, 5, 0, 1, 5, 3716, 0, 4927),
    "gpt4-sweagenttestrepo-1c2844.traj": (4, 4, 4, 0, 1, 4, 515, 0, 1152),
}
SWE_AGENT_OLD = {"gpt4-pydicom__pydicom-1458.traj", "gpt4-swe-agent__test-repo-i1.traj"}


@pytest.mark.parametrize("name", sorted(SWE_AGENT_TABLE))
def test_swe_agent_counts_match_the_corpus_table(name: str) -> None:
    transcript = load_transcript(corpus_file("swe-agent", name))
    messages = transcript.messages
    prompts = [m for m in messages if isinstance(m, UserMessage)]
    assert len(prompts) == 1  # the task; demonstrations are kept apart
    # The table pairs 0.x observations with actions by counting user messages, so it counts
    # the task statement as one; the output of the final `submit` never reached the model.
    more = prompts if name in SWE_AGENT_OLD else []
    assert _stats(messages, more) == SWE_AGENT_TABLE[name]
    unanswered = _unanswered(messages)
    if name in SWE_AGENT_OLD:
        assert [(c.name, dict(c.arguments)) for c in unanswered] == [
            ("bash", {"command": "submit\n"})
        ]
        last = messages[-1]
        assert isinstance(last, AssistantMessage) and last.tool_calls == tuple(unanswered)
    else:
        assert unanswered == []
    assert _orphans(messages) == []


# (calls, results, parallel, width, thought, largest, over_10k, total)
OPENHANDS_TABLE = {
    # The table reads widths from tool_call_metadata, which this 2024 layout lacks (it says 0).
    "v0-legacy-resolver-output.jsonl": (26, 24, 0, 1, 26, 3338, 0, 44440),
    "v0-multi_swe_bench-output.jsonl": (105, 105, 0, 1, 105, 20740, 5, 150906),
    "v0-trajs-basic.json": (2, 1, 0, 1, 2, 3558, 0, 3558),
    "v0-trajs-basic_gui_mode.json": (4, 4, 0, 1, 4, 4017, 0, 6274),
    "v0-trajs-wrong_initial_state.json": (4, 3, 0, 1, 4, 127, 0, 249),
    "v1-sdk-goal-events.jsonl": (2, 3, 0, 1, 2, 1047, 0, 1975),
}


@pytest.mark.parametrize("name", sorted(OPENHANDS_TABLE))
def test_openhands_counts_match_the_corpus_table(name: str) -> None:
    transcripts = openhands.load_instances(corpus_file("openhands", name))
    messages = tuple(m for t in transcripts for m in t.messages)
    # The table counts `error` observations as results; OpenHands raised them before the
    # model's call became an action, so no call is recorded and they reach it as user text.
    errors = [
        m for m in messages if isinstance(m, UserMessage) and m.extra.get("source") == "error"
    ]
    assert _stats(messages, errors)[1:] == OPENHANDS_TABLE[name]


def test_openhands_unanswered_calls_are_the_finish_actions() -> None:
    for name, finishes in [
        ("v0-trajs-basic.json", 1),
        ("v0-trajs-wrong_initial_state.json", 1),
        ("v0-trajs-basic_gui_mode.json", 0),
        ("v0-multi_swe_bench-output.jsonl", 2),
        ("v0-legacy-resolver-output.jsonl", 2),
    ]:
        transcripts = openhands.load_instances(corpus_file("openhands", name))
        unanswered = [c for t in transcripts for c in _unanswered(t.messages)]
        assert [c.name for c in unanswered] == ["finish"] * finishes, name
        for t in transcripts:
            # Each stays where the agent stopped, the last message, unrepaired.
            if _unanswered(t.messages):
                last = t.messages[-1]
                assert isinstance(last, AssistantMessage)
                assert last.tool_calls == tuple(_unanswered(t.messages))


# --- SWE-agent ------------------------------------------------------------------------------


def test_swe_agent_function_calling_history() -> None:
    path = corpus_file("swe-agent", "gpt4-sweagenttestrepo-1c2844.traj")
    raw = json.loads(path.read_text("utf-8"))
    transcript = load_transcript(path)
    assert transcript.system == raw["history"][0]["content"]
    assert transcript.demonstrations == ()
    assert transcript.extra["model"] == "gpt-4o"
    assert transcript.extra["exit_status"] == "submitted"
    assert transcript.extra["model_stats"]["tokens_sent"] == 7141
    reply = transcript.messages[1]
    assert isinstance(reply, AssistantMessage)
    assert reply.content == (
        TextBlock(raw["history"][2]["thought"]),
        ToolCall("call_fJuazlMUN5fQDQ73G6XSpYpx", "find_file", {"file_name": "missing_colon.py"}),
    )
    assert reply.stop_reason == "tool_use" and reply.model == "gpt-4o" and reply.usage is None
    names = [
        c.name for m in transcript.messages if isinstance(m, AssistantMessage) for c in m.tool_calls
    ]
    assert names == ["find_file", "open", "edit", "bash"]
    results = [m for m in transcript.messages if isinstance(m, ToolResultMessage)]
    assert [r.tool_name for r in results] == names
    assert results[0].content == (TextBlock(raw["history"][3]["content"]),)


def test_swe_agent_replayed_ids_are_made_unique() -> None:
    path = corpus_file("swe-agent", "demo-marshmallow-1867-function_calling.traj")
    transcript = load_transcript(path)
    calls = [
        c for m in transcript.messages if isinstance(m, AssistantMessage) for c in m.tool_calls
    ]
    ids = [c.id for c in calls]
    assert len(set(ids)) == len(ids) == 11
    renamed = [(c.id, c.extra["original_id"]) for c in calls if "original_id" in c.extra]
    assert renamed == [
        ("call_5iDdbOYybq7L19vqXmR0DPaU#2", "call_5iDdbOYybq7L19vqXmR0DPaU"),
        ("call_ahToD2vM0aQWJPkRmy5cumru#2", "call_ahToD2vM0aQWJPkRmy5cumru"),
        ("call_q3VsBszvsntfyPkxeHq4i5N1#2", "call_q3VsBszvsntfyPkxeHq4i5N1"),
        ("call_5iDdbOYybq7L19vqXmR0DPaU#3", "call_5iDdbOYybq7L19vqXmR0DPaU"),
        ("call_5iDdbOYybq7L19vqXmR0DPaU#4", "call_5iDdbOYybq7L19vqXmR0DPaU"),
    ]
    # Each result follows the call it answers, as the agent paired them.
    for i, m in enumerate(transcript.messages):
        if isinstance(m, AssistantMessage):
            after = transcript.messages[i + 1]
            assert isinstance(after, ToolResultMessage)
            assert after.tool_call_id == m.tool_calls[0].id
    assert validate(transcript.messages, "anthropic") == []


def test_swe_agent_history_holds_outputs_the_agent_later_masked() -> None:
    raw = json.loads(corpus_file("swe-agent", REPLAY_SNAPSHOTS).read_text("utf-8"))
    transcript = load_transcript(corpus_file("swe-agent", REPLAY_SNAPSHOTS))
    assert transcript.extra["model"] == "replay"
    (processor,) = transcript.extra["history_processors"]
    assert (processor["type"], processor["n"]) == ("last_n_observations", 5)
    # The last step's prompt snapshot is the whole history with old outputs masked.
    snapshot = raw["trajectory"][-1]["messages"]
    assert [m["role"] for m in snapshot[1:]] == [m.role for m in transcript.messages]
    masked = []
    for seen, m in zip(snapshot[1:], transcript.messages, strict=True):
        assert not isinstance(m, SummaryMessage)
        if seen["content"] != text_of(m.content):
            assert isinstance(m, ToolResultMessage)
            assert seen["content"].startswith("Old environment output: (")
            masked.append(m.tool_call_id)
    assert len(masked) == 8


def test_swe_agent_thought_action_history() -> None:
    path = corpus_file("swe-agent", "gpt4-swe-agent__test-repo-i1.traj")
    raw = json.loads(path.read_text("utf-8"))["history"]
    transcript = load_transcript(path)
    assert transcript.system == raw[0]["content"]
    (demo,) = transcript.demonstrations
    assert isinstance(demo, UserMessage) and len(text_of(demo.content)) == 30977
    assert "is_demo" not in json.dumps([to_dict(m) for m in transcript.messages])
    reply = transcript.messages[1]
    assert isinstance(reply, AssistantMessage)
    assert reply.content == (
        TextBlock(raw[3]["thought"]),
        ToolCall("swe-1", "bash", {"command": 'find_file "missing_colon.py"\n'}),
    )
    assert reply.extra["content"] == raw[3]["content"]  # as the model wrote it
    result = transcript.messages[2]
    assert result == ToolResultMessage("swe-1", (TextBlock(raw[4]["content"]),), "bash")
    ids = [
        c.id for m in transcript.messages if isinstance(m, AssistantMessage) for c in m.tool_calls
    ]
    assert ids == ["swe-1", "swe-2", "swe-3", "swe-4", "swe-5"]
    assert transcript.extra == {
        "exit_status": "submitted",
        "model_stats": {
            "total_cost": 0.53839,
            "instance_cost": 0.53839,
            "tokens_sent": 52861,
            "tokens_received": 326,
            "api_calls": 5,
        },
    }


def test_swe_agent_demonstrations_blocks_and_arguments(tmp_path: Path) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{oops"}}
    history = [
        {"role": "system", "content": "You are SWE-agent."},
        {"role": "user", "content": "demo task", "is_demo": True},
        {"role": "assistant", "content": "", "tool_calls": [call], "is_demo": True},
        {"role": "tool", "content": "demo output", "tool_call_ids": ["c1"], "is_demo": True},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}},
                {"type": "input_audio", "input_audio": {}},
            ],
        },
        {"role": "assistant", "content": "again", "tool_calls": [call]},
        {"role": "tool", "content": "", "tool_call_id": "c1"},
        {
            "role": "assistant",
            "thought": "I think",
            "action": "   ",
            "thinking_blocks": [{"type": "thinking", "thinking": "hm", "signature": "sig"}],
        },
        {"role": "user", "content": "not an output: the action was empty"},
    ]
    replay_config = json.dumps({"agent": {"model": {"name": "claude"}}})
    path = _write(tmp_path, _traj_text(history, replay_config=replay_config), "t.traj")
    transcript = load_transcript(path)
    assert transcript.format == "swe-agent"
    assert transcript.system == "You are SWE-agent."
    demo_call = ToolCall("c1", "bash", {}, {"raw_arguments": "{oops"})
    assert transcript.demonstrations == (
        UserMessage((TextBlock("demo task"),)),
        AssistantMessage((demo_call,), "tool_use", None, "claude"),
        ToolResultMessage("c1", (TextBlock("demo output"),), "bash"),
    )
    user, reply, result, thought, last = transcript.messages
    assert isinstance(user, UserMessage)
    assert user.content[:2] == (TextBlock("look"), ImageBlock("image/png", "iVBOR"))
    assert isinstance(user.content[2], OpaqueBlock)
    # Demonstrations and the conversation go to the model together: their ids never clash.
    assert isinstance(reply, AssistantMessage)
    assert reply.tool_calls == (
        ToolCall("c1#2", "bash", {}, {"raw_arguments": "{oops", "original_id": "c1"}),
    )
    assert result == ToolResultMessage("c1#2", (), "bash", False, {"original_id": "c1"})
    assert thought == AssistantMessage(
        (ThinkingBlock("hm", "sig"), TextBlock("I think")), "stop", None, "claude"
    )
    assert last == UserMessage((TextBlock("not an output: the action was empty"),))


def test_json_document_names_the_line_of_nested_parts(tmp_path: Path) -> None:
    value = {
        'a [tricky] "key"': "{[ not a container ]}",
        "history": [
            {"role": "user", "content": "x\n]}"},
            {"role": "assistant", "tool_calls": [{"type": "function", "id": "call_x"}]},
        ],
    }
    text = json.dumps(value, indent=2)
    src = Source(str(_write(tmp_path, text, "d.json")))
    doc = JsonDocument.read(src, "a document")
    lines = text.split("\n")
    id_line = next(i for i, line in enumerate(lines, 1) if '"id": "call_x"' in line)
    assert doc.line("history", 1, "tool_calls", 0, "id") == id_line
    assert doc.line("history", 1, "tool_calls", 0) == id_line - 2
    assert doc.line("history", 0) == 4
    assert doc.line("history", 7) == 3  # no such item: the list itself
    assert doc.line() == 1


# --- OpenHands ------------------------------------------------------------------------------


def test_openhands_v0_trajectory_fields() -> None:
    path = corpus_file("openhands", "v0-trajs-basic.json")
    events = json.loads(path.read_text("utf-8"))
    transcript = load_transcript(path)
    prompt, reply, result, finish = transcript.messages
    assert prompt == UserMessage(
        (TextBlock(events[0]["args"]["content"]),), {"timestamp": iso_to_ms(events[0]["timestamp"])}
    )
    assert isinstance(reply, AssistantMessage)
    assert reply.usage == Usage(4, 1135, 0, 3482)  # LiteLLM's prompt_tokens hold the cache
    assert reply.model == "claude-3-5-sonnet-20241022"
    assert reply.extra["response_id"] == "chatcmpl-6814daca-5c62-431d-8c88-9dafead244f1"
    (call,) = reply.tool_calls
    # The arguments the model sent, not OpenHands' translation of them.
    assert call.name == "str_replace_editor"
    assert call.arguments["command"] == "create" and "file_text" in call.arguments
    assert isinstance(result, ToolResultMessage)
    assert result.tool_call_id == call.id and result.tool_name == "str_replace_editor"
    assert text_of(result.content) == events[2]["content"]
    assert result.extra == {"observation": "edit", "timestamp": iso_to_ms(events[2]["timestamp"])}
    assert isinstance(finish, AssistantMessage)
    assert finish.usage == Usage(6, 177, 3482, 1158)
    assert finish.tool_calls == (ToolCall("toolu_01BUKu3B7nY574atNECkBiFk", "finish", {}),)
    assert text_of(finish.content) == events[3]["args"]["thought"]
    assert transcript.system is None


def test_openhands_evaluation_output_instances() -> None:
    path = corpus_file("openhands", "v0-multi_swe_bench-output.jsonl")
    every = openhands.load_instances(path)
    assert [t.extra["instance_id"] for t in every] == [
        "ponylang__ponyc-4595",
        "ponylang__ponyc-4593",
        "ponylang__ponyc-4588",
    ]
    assert [t.extra["instance"] for t in every] == [0, 1, 2]
    assert load_transcript(path) == every[0] == openhands.load(path, instance=0)
    assert openhands.load(path, instance=2) == every[2]
    with pytest.raises(TranscriptFormatError, match="instance 3") as info:
        openhands.load(path, instance=3)
    assert info.value.line == 0
    first = every[0]
    assert first.system is not None and first.system.startswith("You are OpenHands agent")
    tools = [t["function"]["name"] for t in first.extra["tools"]]
    assert tools == ["execute_bash", "think", "finish", "str_replace_editor"]
    task, recall, reply = first.messages[:3]
    assert isinstance(task, UserMessage) and "source" not in task.extra
    assert isinstance(recall, UserMessage) and recall.extra["source"] == "recall"
    assert recall.extra["recall"]["recall_type"] == "workspace_context"
    assert isinstance(reply, AssistantMessage)
    assert reply.usage == Usage(5920, 128, 0, 0)
    assert reply.model == "meta-llama/llama-4-maverick"
    # Emulated function calling: the provider said "stop", the response still called a tool.
    assert reply.stop_reason == "tool_use"
    assert reply.tool_calls == (
        ToolCall("toolu_01", "execute_bash", {"command": "ls -l /workspace/ponylang__ponyc__0.1"}),
    )
    result = first.messages[3]
    assert isinstance(result, ToolResultMessage) and result.extra["exit_code"] == 0
    errors = [m for t in every for m in t.messages if m.extra.get("source") == "error"]
    assert len(errors) == 2 and all(isinstance(m, UserMessage) for m in errors)
    assert all(
        text_of(m.content).startswith("Parameter 'command' is expected")
        for m in errors
        if isinstance(m, UserMessage)
    )


def test_openhands_legacy_resolver_output_pairs_by_position() -> None:
    path = corpus_file("openhands", "v0-legacy-resolver-output.jsonl")
    first, second = openhands.load_instances(path)
    kinds = [type(m).__name__ for m in first.messages]
    assert kinds == ["UserMessage"] + ["AssistantMessage", "ToolResultMessage"] * 3 + [
        "AssistantMessage"
    ]
    reply = first.messages[1]
    assert isinstance(reply, AssistantMessage)
    assert reply.tool_calls == (ToolCall("oh-1", "run", {"command": "touch LICENSE"}),)
    assert first.messages[2] == ToolResultMessage(
        "oh-1",
        (TextBlock("\r\nroot@bcd3959393a1:/workspace # "),),
        "run",
        False,
        {"observation": "run", "exit_code": 0},
    )
    assert [c.name for c in _unanswered(second.messages)] == ["finish"]
    assert second.extra == {"instance": 1}


def test_openhands_v1_events() -> None:
    path = corpus_file("openhands", "v1-sdk-goal-events.jsonl")
    records = [json.loads(line) for line in path.read_text("utf-8").splitlines()]
    transcript = load_transcript(path)
    kinds = [type(m).__name__ for m in transcript.messages]
    assert kinds == [
        "AssistantMessage",
        "ToolResultMessage",
        "ToolResultMessage",
        "AssistantMessage",
        "ToolResultMessage",
    ]
    reply = transcript.messages[0]
    assert isinstance(reply, AssistantMessage)
    action = records[3]
    assert reply.content[0] == ThinkingBlock(action["reasoning_content"])
    assert reply.content[1] == TextBlock(action["thought"][0]["text"])
    assert reply.tool_calls == (
        ToolCall(action["tool_call_id"], "terminal", json.loads(action["tool_call"]["arguments"])),
    )
    assert reply.extra["response_id"] == action["llm_response_id"]
    # The excerpt lacks the action of one observation: it is kept, not dropped.
    assert _orphans(transcript.messages) == ["chatcmpl-tool-9051d3d10f914188"]
    errors = [m.is_error for m in transcript.messages if isinstance(m, ToolResultMessage)]
    assert errors == [True, True, False]
    stats = transcript.extra["stats"]["usage_to_metrics"]["default"]["accumulated_token_usage"]
    assert stats["prompt_tokens"] == 107458


def _action(id_: int, kind: str, response: str, call_id: str, **args: Any) -> dict[str, Any]:
    arguments = json.dumps({k: v for k, v in args.items() if k != "thought"})
    model_response = {
        "id": response,
        "model": "m",
        "choices": [
            {
                "finish_reason": "tool_calls",
                "message": {
                    "content": args.get("thought", ""),
                    "tool_calls": [
                        {
                            "id": call_id,
                            "function": {"name": "execute_bash", "arguments": arguments},
                        }
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2},
    }
    return {
        "id": id_,
        "timestamp": "2025-01-27T22:45:13.764487",
        "source": "agent",
        "action": kind,
        "args": {**args, "blocking": False},
        "tool_call_metadata": {
            "function_name": "execute_bash",
            "tool_call_id": call_id,
            "model_response": model_response,
            "total_calls_in_response": 2,
        },
    }


def _observation(id_: int, cause: int, content: str, **fields: Any) -> dict[str, Any]:
    return {
        "id": id_,
        "source": "agent",
        "observation": "run",
        "cause": cause,
        "content": content,
        **fields,
    }


def test_openhands_v0_parallel_calls_and_other_events(tmp_path: Path) -> None:
    events = [
        {"id": 0, "source": "agent", "action": "system", "args": {"content": "sys", "tools": []}},
        {
            "id": 1,
            "source": "user",
            "action": "message",
            "args": {
                "content": "go",
                "image_urls": ["data:image/png;base64,AAAA", "https://x/y.png"],
            },
        },
        {"id": 2, "source": "environment", "observation": "agent_state_changed", "content": ""},
        _action(3, "run", "resp-1", "t1", command="ls", thought="Two at once."),
        _observation(4, 3, "a b", extras={"metadata": {"exit_code": 0}}),
        _action(5, "run", "resp-1", "t2", command="pwd", thought="Two at once."),
        {"id": 6, "source": "agent", "observation": "error", "cause": 5, "content": "boom"},
        {"id": 7, "source": "user", "action": "run", "args": {"command": "make"}},
        {"id": 8, "source": "user", "observation": "run", "cause": 7, "content": "built"},
        {"id": 9, "source": "agent", "action": "run", "args": {"command": "x", "hidden": True}},
        {
            "id": 10,
            "source": "agent",
            "observation": "run",
            "cause": 9,
            "content": "",
            "extras": {"hidden": True},
        },
        {
            "id": 11,
            "source": "agent",
            "action": "condensation",
            "args": {"forgotten_events_start_id": 3, "forgotten_events_end_id": 6, "summary": "S"},
        },
        {"id": 12, "source": "agent", "action": "message", "args": {"content": "Done."}},
        {
            "id": 13,
            "source": "agent",
            "action": "finish",
            "args": {"outputs": {}, "thought": "bye"},
        },
    ]
    path = _write(tmp_path, _array_text(events), "events.json")
    transcript = load_transcript(path)
    assert transcript.format == "openhands"
    assert transcript.system == "sys" and transcript.extra == {"tools": []}
    prompt, reply, first, second, command, output, done, finish = transcript.messages
    assert isinstance(prompt, UserMessage)
    assert prompt.content == (
        TextBlock("go"),
        ImageBlock("image/png", "AAAA"),
        ImageBlock("", "https://x/y.png", "url"),
    )
    # One response, two actions: one message, then the results in call order.
    assert isinstance(reply, AssistantMessage)
    assert reply.content == (
        TextBlock("Two at once."),
        ToolCall("t1", "execute_bash", {"command": "ls"}),
        ToolCall("t2", "execute_bash", {"command": "pwd"}),
    )
    assert reply.usage == Usage(10, 2, 0, 0) and reply.stop_reason == "tool_use"
    assert isinstance(first, ToolResultMessage) and first.extra["exit_code"] == 0
    assert (first.tool_call_id, first.is_error) == ("t1", False)
    assert isinstance(second, ToolResultMessage)
    assert (second.tool_call_id, second.is_error, text_of(second.content)) == ("t2", True, "boom")
    assert command == UserMessage(
        (TextBlock("User executed the command:\nmake"),), {"source": "user_command"}
    )
    assert output == UserMessage((TextBlock("built"),), {"source": "run"})
    assert done == AssistantMessage((TextBlock("Done."),), "stop")
    assert isinstance(finish, AssistantMessage)
    assert finish.content == (TextBlock("bye"), ToolCall("oh-13", "finish", {"outputs": {}}))
    (compaction,) = transcript.compactions
    assert compaction.index == 6 and compaction.summary == "S"
    assert compaction.extra["forgotten_events_start_id"] == 3


def test_openhands_v1_message_kinds(tmp_path: Path) -> None:
    def event(kind: str, **fields: Any) -> dict[str, Any]:
        return {
            "id": f"e{len(records)}",
            "timestamp": "2026-01-01T00:00:00",
            "source": "agent",
            "kind": kind,
            **fields,
        }

    def call(call_id: str, response: str, **fields: Any) -> dict[str, Any]:
        tool_call = {"id": call_id, "name": "terminal", "arguments": '{"command": "ls"}'}
        return event(
            "ActionEvent",
            tool_name="terminal",
            tool_call_id=call_id,
            tool_call=tool_call,
            llm_response_id=response,
            **fields,
        )

    records: list[dict[str, Any]] = []
    text = {"type": "text", "text": "You help.", "cache_prompt": False}
    records.append(event("SystemPromptEvent", system_prompt=text, tools=[{"name": "terminal"}]))
    records.append(
        event(
            "MessageEvent",
            source="user",
            llm_message={"role": "user", "content": [{"type": "text", "text": "hi"}]},
            extended_content=[{"type": "text", "text": "<skill/>"}],
        )
    )
    thinking = [
        {"type": "thinking", "thinking": "hmm", "signature": "sig"},
        {"type": "redacted_thinking", "data": "enc"},
    ]
    records.append(
        call(
            "c1",
            "r1",
            thought=[{"type": "text", "text": "Both."}],
            thinking_blocks=thinking,
            reasoning_content="hmm",
        )
    )
    records.append(call("c2", "r1", thought=[]))
    records.append(
        event(
            "ObservationEvent",
            source="environment",
            tool_name="terminal",
            tool_call_id="c2",
            action_id="e3",
            observation={
                "content": [{"type": "text", "text": "two"}],
                "is_error": False,
                "exit_code": 0,
            },
        )
    )
    records.append(event("AgentErrorEvent", tool_name="terminal", tool_call_id="c1", error="bad"))
    records.append(
        event("Condensation", forgotten_event_ids=["e1"], summary="gist", llm_response_id="r9")
    )
    records.append(event("CondensationSummaryEvent", summary="gist"))
    records.append(
        event(
            "UserRejectObservation",
            tool_name="terminal",
            tool_call_id="c9",
            action_id="x",
            rejection_reason="no",
        )
    )
    records.append(
        event(
            "MessageEvent",
            llm_message={"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
        )
    )
    records.append(event("PauseEvent"))
    path = _write(tmp_path, _jsonl(records), "v1.jsonl")
    transcript = load_transcript(path)
    assert transcript.system == "You help."
    assert transcript.extra == {"tools": [{"name": "terminal"}]}
    user, reply, first, second, summary, rejected, answer = transcript.messages
    stamp = {"timestamp": iso_to_ms("2026-01-01T00:00:00")}
    assert user == UserMessage((TextBlock("hi"), TextBlock("<skill/>")), stamp)
    assert isinstance(reply, AssistantMessage)
    assert reply.content == (
        ThinkingBlock("hmm", "sig"),
        RedactedThinkingBlock("enc"),
        TextBlock("Both."),
        ToolCall("c1", "terminal", {"command": "ls"}),
        ToolCall("c2", "terminal", {"command": "ls"}),
    )
    assert reply.extra == {"response_id": "r1", **stamp}
    assert first == ToolResultMessage("c1", (TextBlock("bad"),), "terminal", True, stamp)
    assert second == ToolResultMessage(
        "c2", (TextBlock("two"),), "terminal", False, {"exit_code": 0, **stamp}
    )
    assert summary == SummaryMessage("gist", stamp)
    assert rejected == ToolResultMessage(
        "c9", (TextBlock("Action rejected: no"),), "terminal", True, stamp
    )
    assert answer == AssistantMessage((TextBlock("ok"),), "stop", None, None, stamp)
    (compaction,) = transcript.compactions
    assert compaction.index == 4 and compaction.summary == "gist"
    assert compaction.extra == {"forgotten_event_ids": ["e1"], "summary_offset": None}


# --- malformed files -------------------------------------------------------------------------

_SYSTEM = {"role": "system", "content": "s"}
_USER = {"role": "user", "content": "u"}


@pytest.mark.parametrize(
    ("text", "line", "expected"),
    [
        ("", 0, "empty"),
        ('{\n  "history": [\n    {"role": "user", "content": "u"}\n', 4, "SWE-agent"),
        ('[{"role": "user"}]', 1, "not a JSON list"),
        ('{\n  "trajectory": [],\n  "history": {}\n}\n', 3, "'history' is dict"),
        ('{\n  "trajectory": []\n}\n', 0, "'history' is NoneType"),
        (_traj_text([_SYSTEM, _USER, {"role": "robot", "content": "x"}]), 5, "role"),
        (_traj_text([_SYSTEM, _USER, "oops"]), 5, "an object"),
        (_traj_text([_SYSTEM, {"role": "user", "content": 3}]), 4, "'content'"),
        (
            _traj_text(
                [
                    _SYSTEM,
                    _USER,
                    {"role": "assistant", "content": "", "tool_calls": [{"function": {}}]},
                ]
            ),
            5,
            "'id'",
        ),
        (
            _traj_text(
                [_SYSTEM, _USER, {"role": "assistant", "content": "", "tool_calls": [{"id": "c"}]}]
            ),
            5,
            "'function'",
        ),
        (_traj_text([_SYSTEM, _USER, {"role": "tool", "content": "x"}]), 5, "tool_call_ids"),
    ],
)
def test_malformed_trajectories_name_the_line(
    tmp_path: Path, text: str, line: int, expected: str
) -> None:
    path = _write(tmp_path, text, "bad.traj")
    with pytest.raises(TranscriptFormatError) as info:
        swe_agent.load(path)
    assert (info.value.path, info.value.line) == (str(path), line)
    assert expected in info.value.expected


def test_malformed_event_list_found_by_detection(tmp_path: Path) -> None:
    path = _write(tmp_path, _array_text([_TASK, _RUN, ["not", "an", "event"]]), "bad.json")
    with pytest.raises(TranscriptFormatError, match="objects, not list") as info:
        load_transcript(path)
    assert info.value.line == 4


def test_malformed_trajectory_found_by_detection(tmp_path: Path) -> None:
    history = [_SYSTEM, _USER, {"role": "assistant", "tool_calls": [{"id": 1}], "content": ""}]
    path = _write(tmp_path, _traj_text(history, trajectory=[]), "bad.traj")
    with pytest.raises(TranscriptFormatError, match="'id' as a string") as info:
        load_transcript(path)
    assert info.value.line == 5


_OH_USER = {"id": 0, "source": "user", "action": "message", "args": {"content": "hi"}}
_V1_STATE = {"id": "s", "source": "environment", "kind": "ConversationStateUpdateEvent", "key": "k"}


@pytest.mark.parametrize(
    ("name", "text", "line", "expected"),
    [
        ("e.json", "", 0, "empty"),
        ("e.json", _array_text([_OH_USER, 3]), 3, "objects"),
        ("e.json", _array_text([_OH_USER, {"id": 1, "source": "agent"}]), 3, "'action'"),
        (
            "e.json",
            _array_text([_OH_USER, {"id": 1, "action": "message", "args": {}}]),
            3,
            "'content'",
        ),
        ("e.json", _array_text([_OH_USER, {"id": 1, "action": "run", "args": 3}]), 3, "'args'"),
        ("e.json", _array_text([_OH_USER, {"observation": "run", "content": 3}]), 3, "'content'"),
        ("e.json", "[\n" + json.dumps(_OH_USER) + ",\n  {oops\n]", 3, "OpenHands"),
        ("e.json", '"text"', 1, "not a JSON str"),
        ("v1.jsonl", _jsonl([_V1_STATE, {**_V1_STATE, "kind": "ActionEvent"}]), 2, "'tool_call'"),
        (
            "v1.jsonl",
            _jsonl([_V1_STATE, {**_V1_STATE, "kind": "ActionEvent", "tool_call": {"name": "t"}}]),
            2,
            "'id'",
        ),
        ("v1.jsonl", _jsonl([_V1_STATE, _V1_STATE, "{oops"]), 3, "JSON"),
        (
            "v1.jsonl",
            _jsonl([_V1_STATE, {**_V1_STATE, "kind": "ObservationEvent"}]),
            2,
            "tool_call_id",
        ),
        (
            "out.jsonl",
            _jsonl(
                [{"instance_id": "a", "history": [_OH_USER]}, {"instance_id": "b", "history": 3}]
            ),
            2,
            "'history'",
        ),
        (
            "out.jsonl",
            _jsonl([{"instance_id": "a", "history": [_OH_USER]}, {"history": [_OH_USER, None]}]),
            2,
            "objects",
        ),
    ],
)
def test_malformed_openhands_files_name_the_line(
    tmp_path: Path, name: str, text: str, line: int, expected: str
) -> None:
    path = _write(tmp_path, text, name)
    with pytest.raises(TranscriptFormatError) as info:
        openhands.load_instances(path)
    assert (info.value.path, info.value.line) == (str(path), line)
    assert expected in info.value.expected


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("swe-agent", "gpt4-swe-agent__test-repo-i1.traj"),
        ("swe-agent", "demo-function_calling_simple.traj"),
        ("openhands", "v0-trajs-basic.json"),
        ("openhands", "v1-sdk-goal-events.jsonl"),
        ("openhands", "v0-legacy-resolver-output.jsonl"),
    ],
)
def test_truncated_files_load_or_fail_with_a_format_error(
    tmp_path: Path, kind: str, name: str
) -> None:
    data = corpus_file(kind, name).read_bytes()
    path = tmp_path / name
    for cut in range(1, len(data), max(1, len(data) // 40)):
        path.write_bytes(data[:cut])
        try:
            transcript = load_transcript(path)
        except TranscriptFormatError as e:
            assert e.line == 0 or 1 <= e.line <= data[:cut].count(b"\n") + 1
        else:
            assert transcript.format == kind


def test_explicit_loaders_report_empty_files(tmp_path: Path) -> None:
    path = _write(tmp_path, "\n", "empty.json")
    for load in (swe_agent.load, openhands.load):
        with pytest.raises(TranscriptFormatError) as info:
            load(path)
        assert info.value.line == 0


def test_transcript_defaults_for_the_older_formats() -> None:
    transcript = Transcript("p", "pi", ())
    assert transcript.system is None
    assert transcript.demonstrations == ()
    assert transcript.extra == {}


def _cc(
    kind: str, uuid: str, parent: str | None, content: Any, mid: str = "", **more: Any
) -> dict[str, Any]:
    record = {"type": kind, "uuid": uuid, "parentUuid": parent, "sessionId": "s", **more}
    if kind == "user":
        record["message"] = {"role": "user", "content": content}
    elif kind == "assistant":
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        record["message"] = {"id": mid or f"m-{uuid}", "role": "assistant", "content": blocks}
    return record


def test_claude_code_a_rewound_branch_is_left_out(tmp_path: Path) -> None:
    """Found by a hostile run (AD, finding 1): a rewind (Esc Esc, /rewind) keeps the turns it
    abandons in the file, and the importer read them as if the model had seen them. The
    conversation is the chain of parents ending at the last message; the results of parallel
    calls (each naming its call's record) and a compaction's new chain stay in it."""
    use = [{"type": "tool_use", "id": f"t{k}", "name": "Read", "input": {}} for k in (1, 2)]
    done = [{"type": "tool_result", "tool_use_id": f"t{k}", "content": "ok"} for k in (1, 2)]
    records = [
        _cc("user", "u1", None, "What is in this repo?"),
        _cc("assistant", "a1", "u1", [use[0]]),
        _cc("assistant", "a1b", "a1", [use[1]], mid="m-a1"),  # the same response's second call
        _cc("user", "r1", "a1", [done[0]]),  # each result names its call's record
        _cc("user", "r2", "a1b", [done[1]]),
        _cc("assistant", "a2", "r2", "A Python package."),
        _cc("user", "u2", "a2", "ABANDONED: rewrite it in Rust"),
        _cc("assistant", "a3", "u2", "ABANDONED: rewriting"),
        _cc("system", "b1", None, None, subtype="compact_boundary", logicalParentUuid="a3"),
        _cc("user", "u3", "a2", "Run the tests."),  # the rewind: back to a2
        _cc("assistant", "a4", "u3", "All tests pass."),
        _cc("system", "b2", None, None, subtype="compact_boundary", logicalParentUuid="a4"),
        _cc("user", "s2", "b2", "the summary", isCompactSummary=True),
        _cc("user", "u4", "s2", "Thanks."),
        _cc("assistant", "a5", "u4", "You are welcome."),
    ]
    path = tmp_path / "rewound.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), "utf-8")
    transcript = load_transcript(path)
    texts = [
        text_of(m.content) if not isinstance(m, SummaryMessage) else m.text
        for m in transcript.messages
    ]
    assert not [t for t in texts if "ABANDONED" in t]
    assert texts[0] == "What is in this repo?" and "Run the tests." in texts
    assert [m.tool_call_id for m in transcript.messages if isinstance(m, ToolResultMessage)] == [
        "t1",
        "t2",
    ]
    assert transcript.extra["entries_off_branch"] == 3  # the two turns and their compaction
    assert (
        len(transcript.compactions) == 1
    )  # the abandoned branch's boundary is no record of this one


def _cc_file(tmp_path: Path, records: list[dict[str, Any]]) -> Transcript:
    path = tmp_path / "session.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), "utf-8")
    return load_transcript(path)


def test_claude_code_a_rewind_to_the_first_prompt_leaves_the_first_tree(tmp_path: Path) -> None:
    """Found by a hostile run (AE, finding 1): going back to the very first prompt and typing
    another makes a second prompt with no parent; the first tree never reached the chain, so
    it was kept, and its abandoned prompt was read as the task."""
    transcript = _cc_file(
        tmp_path,
        [
            _cc("user", "u0", None, "ABANDONED: delete the whole test suite"),
            _cc("assistant", "a0", "u0", "ABANDONED: deleting"),
            _cc("user", "u1", None, "Add a test for the parser"),
            _cc("assistant", "a1", "u1", "Added."),
        ],
    )
    assert [text_of(m.content) for m in transcript.messages] == [
        "Add a test for the parser",
        "Added.",
    ]
    assert transcript.extra["entries_off_branch"] == 2


def test_claude_code_a_meta_record_beside_a_result_is_kept(tmp_path: Path) -> None:
    """Found by a hostile run (AE, finding 8): a record Claude Code wrote itself (``isMeta``:
    a hook's output) between a call and its result hangs off the chain beside the result, and
    was dropped as if a rewind started there; no rewind starts at a record nobody typed."""
    call = [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "pytest"}}]
    records = [
        _cc("user", "u1", None, "Run the tests"),
        _cc("assistant", "a1", "u1", call),
        _cc("user", "m1", "a1", "<system-reminder>run with -x</system-reminder>", isMeta=True),
        _cc(
            "user",
            "r1",
            "a1",
            [{"type": "tool_result", "tool_use_id": "t1", "content": "1 failed"}],
        ),
        _cc("assistant", "a2", "r1", "One test fails."),
    ]
    transcript = _cc_file(tmp_path, records)
    assert "entries_off_branch" not in transcript.extra
    assert any(
        "run with -x" in text_of(m.content)
        for m in transcript.messages
        if isinstance(m, UserMessage)
    )


def test_importer_options_of_the_wrong_value_or_type_are_config_errors() -> None:
    """Found by a hostile run (CS 6): ``claude_code.load(path, thread="Main")`` read anything
    not "main" as "sidechains" and returned no message, and ``openhands.load(path,
    instance="1")`` raised a bare TypeError. Now both are a ConfigError naming what is
    accepted, before the file is read."""
    from agentctx.errors import ConfigError
    from agentctx.importers import claude_code

    cc = corpus_file("claude-code", "ccviewer-5c0375b4.jsonl")
    assert claude_code.load(cc, thread="main").messages
    for thread in ("Main", "", None, 1):
        with pytest.raises(ConfigError, match="'auto', 'main', 'sidechains'"):
            claude_code.load(cc, thread=thread)  # type: ignore[arg-type]
    oh = corpus_files("openhands")[0]
    for instance in ("1", 1.0, True, None):
        with pytest.raises(ConfigError, match="instance must be an int"):
            openhands.load(oh, instance=instance)  # type: ignore[arg-type]


def test_swe_agent_keeps_list_content_a_thought_or_an_image_would_drop(tmp_path: Path) -> None:
    """Found by a hostile run (CS 7): an assistant message whose ``content`` is a list lost
    its text when a ``thought`` was present, and an ``image_url`` block of list content was
    dropped, without a word. Now the content as written is kept in ``extra["content"]``, as
    it is for string content."""
    written = [{"type": "text", "text": "I will look. SECRET_PLAN"}]
    image = [
        {"type": "text", "text": "see chart"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
    ]
    history = [
        {"role": "system", "content": "sys", "agent": "main", "message_type": "system_prompt"},
        {"role": "user", "content": "task", "agent": "main", "message_type": "observation"},
        {"role": "assistant", "thought": "I will look.", "content": written, "agent": "main"},
        {"role": "user", "content": "go on", "agent": "main"},
        {"role": "assistant", "content": image, "agent": "main"},
        {"role": "user", "content": "and?", "agent": "main"},
        {"role": "assistant", "content": [{"type": "text", "text": "done"}], "agent": "main"},
    ]
    path = tmp_path / "t.traj"
    path.write_text(json.dumps({"history": history}))
    thought, chart, plain = [m for m in load_transcript(path).messages if m.role == "assistant"]
    assert text_of(thought.content) == "I will look."
    assert thought.extra["content"] == written
    assert text_of(chart.content) == "see chart" and chart.extra["content"] == image
    assert "content" not in plain.extra  # nothing left out: nothing kept twice


def test_an_openai_chat_tool_message_of_text_parts_is_read(tmp_path: Path) -> None:
    """Found by a hostile run (CS 8): a valid OpenAI Chat list whose ``tool`` message content
    is an array of text parts (the API allows it) was refused, with an error pointing at
    message 0. Now it is read as OpenAI Chat, the parts' text the result; a list with no
    other mark of OpenAI's is still read as agentctx's own."""
    messages = [
        {"role": "user", "content": "KEEP_u"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "KEEP_r"}]},
        {"role": "assistant", "content": "KEEP_a2"},
    ]
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(messages))
    transcript = load_transcript(path)
    assert transcript.format == "openai-chat"
    result = transcript.messages[2]
    assert isinstance(result, ToolResultMessage) and text_of(result.content) == "KEEP_r"
    own = [
        {"role": "user", "content": [{"type": "text", "text": "u"}]},
        {
            "role": "assistant",
            "content": [{"type": "tool_call", "id": "c", "name": "f", "arguments": {}}],
        },
        {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "r"}]},
    ]
    path.write_text(json.dumps(own))
    assert load_transcript(path).format != "openai-chat"
