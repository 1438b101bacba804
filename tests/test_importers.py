"""Transcript importers: the real corpus, the pi tree format, malformed files, the demo data."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import TYPE_CHECKING, Any

import pytest

from agentctx.errors import TranscriptFormatError
from agentctx.importers import (
    RecordedCompaction,
    Transcript,
    claude_code,
    detect_format,
    load_transcript,
    pi,
)
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
from agentctx.replay.data import DEMO_TRANSCRIPT

from .corpus import corpus_file, corpus_files

if TYPE_CHECKING:
    from pathlib import Path

TRANSCRIPTS = [
    p for kind in ("pi", "claude-code") for p in corpus_files(kind) if p.suffix == ".jsonl"
]


def _stats(messages: tuple[Message, ...]) -> dict[str, int]:
    """The per-file counts of tests/corpus/README.md, computed from neutral messages."""
    replies = [m for m in messages if isinstance(m, AssistantMessage)]
    widths = [len(m.tool_calls) for m in replies if len(m.tool_calls) > 1]
    thinking = [b for m in replies for b in m.content if isinstance(b, ThinkingBlock)]
    # Tool output as the model reads it. The table counts the output of pi's user-run `!cmd`
    # too, without the "$ cmd" line the importer puts in front of it.
    outputs = [
        sum(len(b.text) for b in m.content if isinstance(b, TextBlock))
        for m in messages
        if isinstance(m, ToolResultMessage)
    ]
    outputs += [
        len(text_of(m.content)) - len(f"$ {m.extra['command']}\n")
        for m in messages
        if isinstance(m, UserMessage) and m.extra.get("source") == "bash_execution"
    ]
    return {
        "assistant": len(replies),
        "calls": sum(len(m.tool_calls) for m in replies),
        "results": sum(isinstance(m, ToolResultMessage) for m in messages),
        "parallel": len(widths),
        "width": max(widths, default=0),
        "thinking": len(thinking),
        "signed": sum(b.signature is not None for b in thinking),
        "largest": max(outputs, default=0),
        "over_10k": sum(n > 10_000 for n in outputs),
        "total": sum(outputs),
    }


def _unanswered(messages: tuple[Message, ...]) -> list[tuple[AssistantMessage, list[str]]]:
    """Each assistant message whose results do not follow it at once, in call order."""
    bad = []
    for i, m in enumerate(messages):
        if isinstance(m, AssistantMessage) and m.tool_calls:
            got = []
            for after in messages[i + 1 :]:
                if not isinstance(after, ToolResultMessage):
                    break
                got.append(after.tool_call_id)
            if got != [c.id for c in m.tool_calls]:
                bad.append((m, got))
    return bad


def _first_text(message: UserMessage) -> str:
    block = message.content[0]
    assert isinstance(block, TextBlock)
    return block.text


def _raw_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


# --- the whole corpus ---------------------------------------------------------------------


@pytest.mark.parametrize("path", TRANSCRIPTS, ids=lambda p: p.name)
def test_every_corpus_transcript_imports(path: Path) -> None:
    transcript = load_transcript(path)
    assert transcript.format == ("pi" if path.parent.name == "pi" else "claude-code")
    assert transcript.path == str(path)
    assert transcript.messages
    for m in transcript.messages:
        assert isinstance(m.extra["timestamp"], int)
        # Everything imported survives agentctx's canonical serialization unchanged.
        assert from_dict(to_dict(m)) == m


# (assistant, calls, results, parallel, width, thinking, signed, largest, over_10k, total)
CLAUDE_CODE_TABLE = {
    "ccviewer-5c0375b4.jsonl": (20, 21, 21, 2, 3, 0, 0, 10041, 1, 22650),
    "ccviewer-fe5e1c67.jsonl": (170, 167, 167, 3, 3, 0, 0, 26746, 2, 121525),
    "spotter-4d5611e5-agent-a2898e3.jsonl": (12, 33, 33, 5, 9, 0, 0, 30796, 7, 156815),
    "spotter-4d5611e5-agent-acompact-e1f845.jsonl": (1, 0, 0, 0, 0, 0, 0, 0, 0, 0),
    "spotter-short.jsonl": (1, 2, 2, 1, 2, 1, 1, 225, 0, 450),
    "spotter-subagent.jsonl": (12, 16, 16, 3, 4, 4, 4, 9961, 0, 31402),
    "spotter-tool_heavy.jsonl": (4, 6, 6, 2, 2, 1, 1, 3061, 0, 7533),
}


@pytest.mark.parametrize("name", sorted(CLAUDE_CODE_TABLE))
def test_claude_code_counts_match_the_corpus_table(name: str) -> None:
    path = corpus_file("claude-code", name)
    # The table counts every record of the file; older Claude Code versions write subagent
    # conversations into the main file, so the file is its main thread plus its sidechains.
    main = claude_code.load(path)
    sidechains = claude_code.load(path, thread="sidechains")
    parts = [main.messages]
    if sidechains.messages != main.messages:
        parts.append(sidechains.messages)
    counts = _stats(tuple(m for part in parts for m in part))
    assert tuple(counts.values()) == CLAUDE_CODE_TABLE[name]
    for part in parts:
        assert _unanswered(part) == []


def test_claude_code_main_thread_leaves_inline_subagents_out() -> None:
    path = corpus_file("claude-code", "ccviewer-fe5e1c67.jsonl")
    main = load_transcript(path)
    assert _stats(main.messages)["calls"] == 11  # 156 more calls belong to 5 Task subagents
    sidechains = claude_code.load(path, thread="sidechains")
    prompts = [m for m in sidechains.messages if isinstance(m, UserMessage)]
    assert len(prompts) == 5
    assert _first_text(prompts[0]).startswith("Create React components for the TODO app")


def test_subagent_file_imports_whole_and_has_no_main_thread() -> None:
    path = corpus_file("claude-code", "spotter-4d5611e5-agent-a2898e3.jsonl")
    assert load_transcript(path).messages == claude_code.load(path, thread="sidechains").messages
    assert claude_code.load(path, thread="main").messages == ()


# (assistant, calls, results, parallel, width, thinking, signed, largest, over_10k, total)
PI_TABLE = {
    "before-compaction.jsonl": (484, 454, 448, 9, 4, 49, 47, 51266, 13, 915920),
    "large-session.jsonl": (453, 391, 373, 4, 16, 1, 1, 43245, 3, 257860),
}


@pytest.mark.parametrize(
    ("name", "prompts", "orphans", "answered_width"),
    [("before-compaction.jsonl", 55, 6, 4), ("large-session.jsonl", 88, 18, 4)],
)
def test_pi_counts_match_the_corpus_table(
    name: str, prompts: int, orphans: int, answered_width: int
) -> None:
    transcript = load_transcript(corpus_file("pi", name))
    assert tuple(_stats(transcript.messages).values()) == PI_TABLE[name]
    users = [m for m in transcript.messages if isinstance(m, UserMessage)]
    assert sum("source" not in m.extra for m in users) == prompts
    # Orphan calls stay as they are: all in aborted or failed turns but one (entry 627).
    unanswered = _unanswered(transcript.messages)
    assert sum(len(m.tool_calls) for m, _ in unanswered) == orphans
    assert all(got == [] for _, got in unanswered)
    orphaned = {id(m) for m, _ in unanswered}
    answered = [
        m for m in transcript.messages if isinstance(m, AssistantMessage) and id(m) not in orphaned
    ]
    assert max(len(m.tool_calls) for m in answered) == answered_width


def test_pi_message_fields() -> None:
    path = corpus_file("pi", "before-compaction.jsonl")
    transcript = load_transcript(path)
    raw = [e["message"] for e in _raw_lines(path) if e["type"] == "message"]
    assert len(raw) == len(transcript.messages)
    for source, m in zip(raw, transcript.messages, strict=True):
        assert m.extra["timestamp"] == source["timestamp"]
    first = next(
        (s, m)
        for s, m in zip(raw, transcript.messages, strict=True)
        if isinstance(m, AssistantMessage)
    )
    source, reply = first
    assert isinstance(reply, AssistantMessage)
    u = source["usage"]
    assert reply.usage == Usage(u["input"], u["output"], u["cacheRead"], u["cacheWrite"])
    assert reply.model == "claude-opus-4-5"
    assert reply.extra["provider"] == "anthropic"
    replies = [m for m in transcript.messages if isinstance(m, AssistantMessage)]
    reasons = {r: sum(m.stop_reason == r for m in replies) for r in ("tool_use", "stop")}
    assert reasons == {"tool_use": 434, "stop": 31}
    assert sum(m.stop_reason == "aborted" for m in replies) == 18
    assert sum(m.stop_reason == "error" for m in replies) == 1
    results = [m for m in transcript.messages if isinstance(m, ToolResultMessage)]
    assert all(r.tool_name for r in results)
    assert sum(r.is_error for r in results) == 12


def test_pi_partial_tool_calls_keep_their_arguments() -> None:
    path = corpus_file("pi", "before-compaction.jsonl")
    calls = [
        b
        for m in load_transcript(path).messages
        if isinstance(m, AssistantMessage)
        for b in m.content
        if isinstance(b, ToolCall) and "partial_json" in b.extra
    ]
    assert len(calls) == 3
    assert calls[1].arguments == {"path": "/Users/badlogic"}
    assert calls[1].extra["partial_json"] == '{"path": "/Users/badlogic'


def test_pi_bash_execution_becomes_user_text() -> None:
    transcript = load_transcript(corpus_file("pi", "before-compaction.jsonl"))
    runs = [m for m in transcript.messages if m.extra.get("source") == "bash_execution"]
    assert [m.extra["command"] for m in runs] == ["ls", "ls", "find ."]
    find = runs[2]
    assert isinstance(find, UserMessage)
    assert _first_text(find).startswith("$ find .\n./")
    assert find.extra["exit_code"] == 0
    assert find.extra["truncated"] is True


def test_pi_compactions_are_recorded_not_applied() -> None:
    transcript = load_transcript(corpus_file("pi", "before-compaction.jsonl"))
    assert len(transcript.messages) == 990  # every message entry, before and after the cuts
    first, second = transcript.compactions
    assert (first.tokens_before, second.tokens_before) == (175004, 185014)
    assert first.summary.startswith("# Context Checkpoint")
    assert second.summary.startswith("# Context Checkpoint")
    assert (len(first.summary), len(second.summary)) == (4291, 3649)
    assert (first.extra["first_kept_entry"], second.extra["first_kept_entry"]) == (293, 551)
    assert first.first_kept_index is not None and second.first_kept_index is not None
    kept = transcript.messages[first.first_kept_index]
    assert isinstance(kept, UserMessage)
    assert _first_text(kept) == "i reviwed what we have, it's good. continue"
    kept = transcript.messages[second.first_kept_index]
    assert isinstance(kept, UserMessage) and _first_text(kept) == "can leave it"
    # Entry 627, right before the second compaction: the bash call that never got a result.
    before = transcript.messages[second.index - 1]
    assert isinstance(before, AssistantMessage) and before.stop_reason == "tool_use"
    assert [c.name for c in before.tool_calls] == ["bash"]
    assert load_transcript(corpus_file("pi", "large-session.jsonl")).compactions == ()


# --- signatures ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [p for p in TRANSCRIPTS if p.name in ("before-compaction.jsonl", "large-session.jsonl")]
    + [p for p in TRANSCRIPTS if p.parent.name == "claude-code"],
    ids=lambda p: p.name,
)
def test_thinking_signatures_are_kept_byte_for_byte(path: Path) -> None:
    records = _raw_lines(path)
    # The default import of a Claude Code file is its main thread, or all of a subagent file.
    subagent_file = all(r.get("isSidechain") for r in records if r.get("type") == "assistant")
    raw: list[str] = []
    for record in records:
        message = record.get("message")
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        if record.get("type") == "assistant" and bool(record.get("isSidechain")) != subagent_file:
            continue
        for block in message.get("content", []):
            if block.get("type") == "thinking":
                raw.append(block.get("thinkingSignature", block.get("signature")))
    got = [
        b.signature
        for m in load_transcript(path).messages
        if isinstance(m, AssistantMessage)
        for b in m.content
        if isinstance(b, ThinkingBlock)
    ]
    # pi writes "" when there was no signature; that is "no signature", not one to replay.
    assert got == [s or None for s in raw]


def test_pi_single_message_object() -> None:
    path = corpus_file("pi", "assistant-message-with-thinking-code.json")
    source = json.loads(path.read_text("utf-8"))
    message = pi.message_from_pi(source)
    assert isinstance(message, AssistantMessage)
    thinking = message.content[0]
    assert isinstance(thinking, ThinkingBlock)
    assert thinking.signature == source["content"][0]["thinkingSignature"]
    assert thinking.thinking == source["content"][0]["thinking"]
    assert message.stop_reason == "stop"
    assert message.usage == Usage(8, 1211, 89775, 611)
    # It is one message, not a transcript: load_transcript says so.
    with pytest.raises(TranscriptFormatError, match="single JSON object") as info:
        load_transcript(path)
    assert info.value.line == 0


# --- Claude Code specifics -----------------------------------------------------------------


def test_claude_code_streamed_results_follow_their_response_in_call_order() -> None:
    path = corpus_file("claude-code", "spotter-4d5611e5-agent-a2898e3.jsonl")
    messages = load_transcript(path).messages
    assert isinstance(messages[0], UserMessage)
    reply = messages[1]
    assert isinstance(reply, AssistantMessage)
    assert len(reply.tool_calls) == 9
    results = messages[2:11]
    assert [r.tool_call_id for r in results if isinstance(r, ToolResultMessage)] == [
        c.id for c in reply.tool_calls
    ]
    assert all(isinstance(r, ToolResultMessage) and r.tool_name == "Read" for r in results)
    ids = [m.extra["message_id"] for m in messages if isinstance(m, AssistantMessage)]
    assert len(ids) == len(set(ids)) == 12


def test_claude_code_usage_is_counted_once_from_the_last_record() -> None:
    path = corpus_file("claude-code", "spotter-4d5611e5-agent-a2898e3.jsonl")
    last: dict[str, dict[str, Any]] = {}
    for record in _raw_lines(path):
        if record["type"] == "assistant":
            last[record["message"]["id"]] = record["message"]
    for m in load_transcript(path).messages:
        if isinstance(m, AssistantMessage):
            u = last[m.extra["message_id"]]["usage"]
            assert m.usage == Usage(
                u["input_tokens"],
                u["output_tokens"],
                u["cache_read_input_tokens"],
                u["cache_creation_input_tokens"],
            )
            assert m.model == "claude-sonnet-4-5-20250929"


def test_a_claude_code_record_written_twice_is_read_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a hostile run (P, finding 3): a record written twice (one uuid) was read
    twice: the response held its tool call twice, which the view showed as a call made twice
    (the copy renamed, its result a stub saying none was recorded)."""
    source = corpus_file("claude-code", "spotter-tool_heavy.jsonl")
    lines = source.read_text(encoding="utf-8").splitlines()
    k = next(i for i, line in enumerate(lines) if '"tool_use"' in line and '"assistant"' in line)
    path = tmp_path / "twice.jsonl"
    path.write_text("\n".join([*lines[: k + 1], lines[k], *lines[k + 1 :]]) + "\n")
    once, twice = load_transcript(source), load_transcript(path)
    assert twice.messages == once.messages
    assert twice.extra == {"records_repeated": 1} and once.extra == {}
    from agentctx.replay.cli import main

    assert main(["replay", str(path), "--strategy", "none"]) == 0
    assert "1 records written twice read once" in capsys.readouterr().out


@pytest.mark.parametrize("pi_first", [True, False])
def test_a_file_holding_two_formats_is_a_format_error(tmp_path: Path, pi_first: bool) -> None:
    """Found by a hostile run (P, finding 7): a pi session with a Claude Code session after
    it (or the reverse) loaded as the first, the records of the other skipped in silence as
    types it does not read."""
    pi_lines = corpus_file("pi", "large-session.jsonl").read_text().splitlines()[:150]
    cc_lines = corpus_file("claude-code", "spotter-tool_heavy.jsonl").read_text().splitlines()
    first, second = (pi_lines, cc_lines) if pi_first else (cc_lines, pi_lines)
    path = tmp_path / "two.jsonl"
    path.write_text("\n".join([*first, *second]) + "\n")
    with pytest.raises(TranscriptFormatError, match="two formats in one file") as info:
        load_transcript(path)
    assert info.value.line > len(first)  # at a record of the second


@pytest.mark.parametrize(("name", "first"), [("claude-code", "spotter-short.jsonl"), ("pi", "")])
def test_openhands_events_after_a_session_are_a_format_error(
    tmp_path: Path, name: str, first: str
) -> None:
    """Found by a hostile run (CC 2): OpenHands events after a Claude Code or pi session were
    skipped as records of no type it reads; the file loaded as the first session, exit 0, the
    OpenHands conversation gone without a word."""
    head = (
        corpus_file(name, first).read_text().splitlines()
        if first
        else corpus_file("pi", "large-session.jsonl").read_text().splitlines()[:3]
    )
    events = corpus_file("openhands", "v1-sdk-goal-events.jsonl").read_text().splitlines()
    path = tmp_path / "two.jsonl"
    path.write_text("\n".join([*head, *events]) + "\n")
    with pytest.raises(TranscriptFormatError, match="not an OpenHands event") as info:
        load_transcript(path)
    assert info.value.line == len(head) + 1


def test_claude_code_meta_text_is_kept_and_marked() -> None:
    messages = load_transcript(corpus_file("claude-code", "ccviewer-5c0375b4.jsonl")).messages
    assert isinstance(messages[0], UserMessage) and "meta" not in messages[0].extra
    assert isinstance(messages[1], UserMessage) and messages[1].extra["meta"] is True
    last = messages[-1]
    assert isinstance(last, AssistantMessage) and last.stop_reason is None


def _cc(kind: str, uuid: str, parent: str | None, **fields: Any) -> dict[str, Any]:
    record = {"type": kind, "uuid": uuid, "parentUuid": parent, "sessionId": "s"}
    record["timestamp"] = "2026-02-12T16:02:51.467Z"
    record.update(fields)
    return record


def _assistant(
    uuid: str, parent: str, mid: str, block: dict[str, Any], **msg: Any
) -> dict[str, Any]:
    message = {"id": mid, "role": "assistant", "model": "m", "content": [block], **msg}
    return _cc("assistant", uuid, parent, message=message)


def _write(tmp_path: Path, records: list[Any], name: str = "t.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records), "utf-8")
    return path


def test_claude_code_blocks_stop_reasons_and_compaction(tmp_path: Path) -> None:
    image = {"type": "base64", "media_type": "image/png", "data": "iVBOR"}
    records = [
        _cc("user", "u1", None, message={"role": "user", "content": "hi"}),
        _assistant("a1", "u1", "msg_1", {"type": "redacted_thinking", "data": "EncRypt"}),
        _assistant(
            "a2",
            "a1",
            "msg_1",
            {"type": "tool_use", "id": "t1", "name": "Read", "input": {"p": 1}},
            stop_reason="tool_use",
            usage={"input_tokens": 5, "output_tokens": 9, "cache_read_input_tokens": 2},
        ),
        _cc(
            "user",
            "u2",
            "a2",
            message={
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [
                            {"type": "text", "text": "x"},
                            {"type": "image", "source": image},
                        ],
                        "is_error": True,
                    },
                    {"type": "document", "source": {}},
                ],
            },
        ),
        _assistant("a3", "u2", "msg_2", {"type": "server_tool_use", "id": "s"}, stop_reason="x"),
        _cc("progress", "p1", "a3", data={"type": "hook_progress"}),
        _assistant("a4", "a3", "msg_3", {"type": "text", "text": "t"}, stop_reason="max_tokens"),
        _cc(
            "system",
            "b1",
            None,
            subtype="compact_boundary",
            content="Conversation compacted",
            compactMetadata={"trigger": "auto", "preTokens": 170251},
        ),
        _cc(
            "user",
            "c1",
            "b1",
            isCompactSummary=True,
            message={"role": "user", "content": "This session is being continued..."},
        ),
        _assistant("a5", "c1", "msg_4", {"type": "text", "text": "ok"}, stop_reason="end_turn"),
        {"type": "summary", "summary": "title", "leafUuid": "a5"},
    ]
    transcript = load_transcript(_write(tmp_path, records))
    assert transcript.format == "claude-code"
    m = transcript.messages
    assert [type(x).__name__ for x in m] == [
        "UserMessage",
        "AssistantMessage",
        "ToolResultMessage",
        "UserMessage",
        "AssistantMessage",
        "AssistantMessage",
        "SummaryMessage",
        "AssistantMessage",
    ]
    first = m[1]
    assert isinstance(first, AssistantMessage)
    assert first.content[0] == RedactedThinkingBlock("EncRypt")
    assert first.stop_reason == "tool_use"
    assert first.usage == Usage(5, 9, 2, 0)
    assert first.extra["timestamp"] == 1770912171467
    result = m[2]
    assert isinstance(result, ToolResultMessage)
    assert result.is_error and result.tool_name == "Read"
    assert result.content == (TextBlock("x"), ImageBlock("image/png", "iVBOR"))
    user = m[3]
    assert isinstance(user, UserMessage) and isinstance(user.content[0], OpaqueBlock)
    stops = [x.stop_reason for x in m if isinstance(x, AssistantMessage)]
    assert stops == ["tool_use", "x", "length", "stop"]
    server = m[4]
    assert isinstance(server, AssistantMessage)
    assert server.content[0] == OpaqueBlock("anthropic", {"type": "server_tool_use", "id": "s"})
    (compaction,) = transcript.compactions
    assert compaction == RecordedCompaction(
        6, "This session is being continued...", 170251, 6, {"trigger": "auto"}
    )
    assert m[6] == SummaryMessage(
        "This session is being continued...", {"timestamp": 1770912171467}
    )


def test_claude_code_parallel_subagents_are_read_one_after_another(tmp_path: Path) -> None:
    def side(kind: str, uuid: str, parent: str | None, text: str) -> dict[str, Any]:
        if kind == "user":
            return _cc("user", uuid, parent, isSidechain=True, message={"content": text})
        block = {"type": "text", "text": text}
        return {**_assistant(uuid, parent or "", f"msg_{uuid}", block), "isSidechain": True}

    records = [
        _cc("user", "m1", None, message={"role": "user", "content": "main"}),
        side("user", "a1", None, "task A"),
        side("user", "b1", None, "task B"),
        side("assistant", "a2", "a1", "done A"),
        side("assistant", "b2", "b1", "done B"),
    ]
    path = _write(tmp_path, records)
    texts = [
        b.text
        for m in claude_code.load(path, thread="sidechains").messages
        if not isinstance(m, SummaryMessage | ToolResultMessage)
        for b in m.content
        if isinstance(b, TextBlock)
    ]
    assert texts == ["task A", "done A", "task B", "done B"]
    assert len(load_transcript(path).messages) == 1


# --- pi tree format --------------------------------------------------------------------------


def _pi_entry(
    id_: str, parent: str | None, message: dict[str, Any] | None = None, **kw: Any
) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": id_, "parentId": parent, "timestamp": "2025-12-03T14:00:00Z"}
    if message is not None:
        entry.update(type="message", message={"timestamp": 1000 + len(id_), **message})
    entry.update(kw)
    return entry


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def test_pi_tree_format_follows_the_active_branch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    call = {"type": "toolCall", "id": "c1", "name": "read", "arguments": {"path": "a"}}
    records = [
        {"type": "session", "version": 3, "id": "uuid", "timestamp": "2025-12-03T14:00:00Z"},
        _pi_entry("u1", None, _user("task")),
        _pi_entry("a1", "u1", {"role": "assistant", "content": [], "stopReason": "stop"}),
        _pi_entry("u2a", "a1", _user("abandoned branch")),
        _pi_entry("a2a", "u2a", {"role": "assistant", "content": [], "stopReason": "length"}),
        _pi_entry("bs", "a1", type="branch_summary", fromId="a2a", summary="tried A"),
        _pi_entry("u2b", "bs", _user("second try")),
        _pi_entry("mc", "u2b", type="model_change", provider="p", modelId="m"),
        _pi_entry("a2b", "mc", {"role": "assistant", "content": [call], "stopReason": "toolUse"}),
        _pi_entry(
            "r1",
            "a2b",
            {"role": "toolResult", "toolCallId": "c1", "toolName": "read", "content": []},
        ),
        _pi_entry(
            "cp", "r1", type="compaction", summary="S", firstKeptEntryId="u2b", tokensBefore=9
        ),
        _pi_entry("cm", "cp", type="custom_message", customType="ext", content="injected"),
        _pi_entry("u3", "cm", _user("go on")),
        _pi_entry("lb", "u3", type="label", targetId="u1", label="start"),
    ]
    transcript = load_transcript(_write(tmp_path, records))
    assert transcript.format == "pi"
    kinds = [(type(m).__name__, m.extra.get("source")) for m in transcript.messages]
    assert kinds == [
        ("UserMessage", None),
        ("AssistantMessage", None),
        ("SummaryMessage", "branch_summary"),
        ("UserMessage", None),
        ("AssistantMessage", None),
        ("ToolResultMessage", None),
        ("UserMessage", "custom"),
        ("UserMessage", None),
    ]
    assert "abandoned branch" not in json.dumps([to_dict(m) for m in transcript.messages])
    assert transcript.compactions == (
        RecordedCompaction(6, "S", 9, 3, {"first_kept_entry": "u2b"}),
    )
    reply = transcript.messages[4]
    assert isinstance(reply, AssistantMessage) and reply.stop_reason == "tool_use"
    assert reply.tool_calls == (ToolCall("c1", "read", {"path": "a"}),)
    assert transcript.messages[0].extra == {"timestamp": 1002}
    assert transcript.extra == {"entries_off_branch": 2}  # the abandoned branch's two
    from agentctx.replay.cli import main

    assert main(["replay", transcript.path, "--strategy", "none"]) == 0
    assert "8 messages, 2 entries of other branches left out" in capsys.readouterr().out


def test_pi_tree_entries_with_one_id_are_a_format_error(tmp_path: Path) -> None:
    """Found by a hostile run (P, finding 4): an early entry written again at the end (same
    id) made the last line a leaf whose parent chain held 2 of 148 messages; the rest were
    left out in silence."""
    records = [
        {"type": "session", "version": 3, "id": "uuid", "timestamp": "2025-12-03T14:00:00Z"},
        _pi_entry("u1", None, _user("task")),
        _pi_entry("a1", "u1", {"role": "assistant", "content": [], "stopReason": "stop"}),
        _pi_entry("u2", "a1", _user("go on")),
    ]
    records.append(records[2])
    with pytest.raises(TranscriptFormatError, match=r":5: expected an entry id of its own"):
        load_transcript(_write(tmp_path, records))


def test_pi_images_string_content_and_failed_bash(tmp_path: Path) -> None:
    records = [
        {"type": "session", "id": "x", "timestamp": "2025-12-03T14:00:00Z", "cwd": "/"},
        {
            "type": "message",
            "timestamp": "2025-12-03T14:00:01Z",
            "message": {
                "role": "user",
                "content": [{"type": "image", "data": "AAAA", "mimeType": "image/png"}],
            },
        },
        {
            "type": "message",
            "timestamp": "2025-12-03T14:00:02Z",
            "message": {"role": "bashExecution", "command": "false", "output": "", "exitCode": 1},
        },
        {
            "type": "message",
            "timestamp": "2025-12-03T14:00:03Z",
            "message": {"role": "bashExecution", "command": "ls", "excludeFromContext": True},
        },
    ]
    messages = load_transcript(_write(tmp_path, records)).messages
    assert messages[0] == UserMessage(
        (ImageBlock("image/png", "AAAA"),), {"timestamp": 1764770401000}
    )
    assert messages[1] == UserMessage(
        (TextBlock("$ false\n\n[exit code 1]"),),
        {
            "source": "bash_execution",
            "command": "false",
            "exit_code": 1,
            "timestamp": 1764770402000,
        },
    )
    assert len(messages) == 2  # `!!` output never reaches the model


# --- malformed files -----------------------------------------------------------------------

_PI_HEAD = {"type": "session", "id": "x", "timestamp": "2025-12-03T14:00:00Z"}
_PI_USER = {"type": "message", "message": {"role": "user", "content": "hi", "timestamp": 1}}
_CC_USER = _cc("user", "u1", None, message={"role": "user", "content": "hi"})


@pytest.mark.parametrize(
    ("content", "line", "expected"),
    [
        (b"", 0, "empty"),
        (b"\n  \n", 0, "empty"),
        (b"hello world\n", 1, "JSON"),
        (b"[1, 2]\n", 0, "not an object with a role"),
        (b'{"type": "weird"}\n', 0, "no record of a known type"),
        (b'{"type": "session"}\n\xff\xfe\n', 2, "UTF-8"),
        ([_PI_HEAD, _PI_USER, "{not json"], 3, "JSON"),
        ([_PI_HEAD, _PI_USER, [1]], 3, "a JSON object"),
        ([_PI_HEAD, {"type": "message"}], 2, "'message'"),
        ([_PI_HEAD, {"type": "message", "message": {"role": "robot"}}], 2, "role"),
        ([_PI_HEAD, {"type": "message", "message": {"role": "user", "content": 3}}], 2, "content"),
        (
            [
                _PI_HEAD,
                _PI_USER,
                {
                    "type": "message",
                    "message": {
                        "role": "assistant",
                        "content": [{"type": "toolCall", "name": "x", "arguments": {}}],
                    },
                },
            ],
            3,
            "'id'",
        ),
        ([_PI_HEAD, {"type": "message", "message": {"role": "toolResult"}}], 2, "toolCallId"),
        ([_PI_HEAD, {"type": "compaction", "tokensBefore": 3}], 2, "summary"),
        (
            [{**_PI_HEAD, "version": 3}, {**_PI_USER, "id": "a", "parentId": "nope"}],
            2,
            "parentId",
        ),
        ([{**_PI_HEAD, "version": 3}, _PI_USER], 2, "'id'"),
        ([_CC_USER, {"type": "assistant", "message": {"content": []}}], 2, "'id'"),
        ([_CC_USER, {"type": "user", "uuid": "x"}], 2, "'message'"),
        (
            [
                _CC_USER,
                _cc("user", "u2", "u1", message={"content": [{"type": "tool_result"}]}),
            ],
            2,
            "tool_use_id",
        ),
        (
            [
                _CC_USER,
                _assistant("a", "u1", "m", {"type": "tool_use", "id": "t", "name": "R"}),
            ],
            2,
            "'input'",
        ),
        ([_CC_USER, _cc("user", "u2", "u1", message={"content": ["str"]})], 2, "objects"),
    ],
)
def test_malformed_files_name_the_line(
    tmp_path: Path, content: bytes | list[Any], line: int, expected: str
) -> None:
    path = tmp_path / "bad.jsonl"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        text = (r if isinstance(r, str) else json.dumps(r) for r in content)
        path.write_text("\n".join(text) + "\n", "utf-8")
    with pytest.raises(TranscriptFormatError) as info:
        load_transcript(path)
    assert info.value.path == str(path)
    assert info.value.line == line
    assert expected in info.value.expected


OTHER_FORMATS = [p for kind in ("anthropic-api", "openai-api") for p in corpus_files(kind)]


@pytest.mark.parametrize("path", OTHER_FORMATS, ids=lambda p: p.name)
def test_other_formats_are_refused_clearly(path: Path) -> None:
    with pytest.raises(TranscriptFormatError, match="pi or Claude Code"):
        load_transcript(path)


@pytest.mark.parametrize("name", ["ccviewer-5c0375b4.jsonl", "spotter-short.jsonl"])
def test_truncated_files_load_or_fail_with_a_format_error(tmp_path: Path, name: str) -> None:
    data = corpus_file("claude-code", name).read_bytes()
    path = tmp_path / name
    for cut in range(1, len(data), max(1, len(data) // 40)):
        path.write_bytes(data[:cut])
        try:
            transcript = load_transcript(path)
        except TranscriptFormatError as e:
            assert e.line == 0 or 1 <= e.line <= data[:cut].count(b"\n") + 1
        else:
            assert transcript.format == "claude-code"


def test_explicit_loaders_report_empty_files(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("", "utf-8")
    for load in (pi.load, claude_code.load):
        with pytest.raises(TranscriptFormatError) as info:
            load(path)
        assert info.value.line == 0


# --- neutral JSON and the result types --------------------------------------------------------


def test_neutral_json_list_round_trips(tmp_path: Path) -> None:
    history: list[Message] = [
        UserMessage.of("fix it"),
        AssistantMessage.of(tool_calls=[ToolCall("c1", "read", {"path": "x"})]),
        ToolResultMessage.of("c1", "contents", tool_name="read"),
        SummaryMessage("earlier work"),
    ]
    path = tmp_path / "history.json"
    path.write_text(json.dumps([to_dict(m) for m in history], indent=2), "utf-8")
    assert detect_format(path) == "neutral"
    transcript = load_transcript(path)
    assert transcript == Transcript(str(path), "neutral", tuple(history))
    path.write_text(json.dumps([{"role": "robot", "content": []}]), "utf-8")
    with pytest.raises(TranscriptFormatError, match="message 0"):
        load_transcript(path)


def test_a_json_list_of_a_providers_messages_is_read(tmp_path: Path) -> None:
    """Found by a hostile run (P, finding 9): the replay is meant to take "a JSON list of
    Anthropic/OpenAI messages", and only agentctx's own form was read."""
    anthropic = [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "weather", "input": {"c": "P"}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "Sunny"}],
        },
        {"role": "assistant", "content": "It is sunny."},
    ]
    chat = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"c":"P"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "Sunny"},
        {"role": "assistant", "content": "It is sunny."},
    ]
    shapes = []
    for name, value in (("anthropic", anthropic), ("openai-chat", chat)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(value))
        transcript = load_transcript(path)
        assert transcript.format == name
        shapes.append([(type(m).__name__, text_of(m.content)) for m in transcript.messages])
        call = transcript.messages[1]
        assert isinstance(call, AssistantMessage)
        assert call.tool_calls[0].arguments == {"c": "P"}
    assert shapes[0] == shapes[1]
    assert load_transcript(tmp_path / "openai-chat.json").system == "You are helpful."
    from agentctx.replay.cli import main

    assert main(["replay", str(tmp_path / "openai-chat.json"), "--strategy", "none"]) == 0


def test_a_providers_list_is_read_by_what_its_messages_say(tmp_path: Path) -> None:
    """Found by a hostile run (Q, finding 4): the first fix took whichever adapter did not
    raise, and each carries the other's fields through: an OpenAI list whose only call had
    no result yet was read as Anthropic's (the call an unknown field), an OpenAI image part
    as an opaque Anthropic block, a list of both forms as OpenAI's; a system message of
    text parts was refused as "unsupported role"."""

    def load(value: list[dict[str, Any]]) -> Any:
        path = tmp_path / "m.json"
        path.write_text(json.dumps(value))
        return load_transcript(path)

    call = {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}
    pending = load(
        [
            {"role": "user", "content": "fix the bug"},
            {"role": "assistant", "content": "Let me read it.", "tool_calls": [call]},
        ]
    )
    assert pending.format == "openai-chat"
    assert pending.messages[-1].tool_calls == (ToolCall("c1", "read", {}),)
    image = load(
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                ],
            }
        ]
    )
    assert image.format == "openai-chat"
    assert isinstance(image.messages[0].content[1], ImageBlock)
    parts = load(
        [
            {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": "hi"},
        ]
    )
    assert parts.system == "Be brief." and parts.messages[0].extra == {}
    with pytest.raises(TranscriptFormatError, match="not Anthropic's and OpenAI's"):
        load(
            [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "r", "input": {}}],
                },
                {"role": "tool", "tool_call_id": "t1", "content": "R"},
            ]
        )
    with pytest.raises(
        TranscriptFormatError, match=r":1: expected OpenAI Chat Completions messages"
    ):
        load([{"role": "function", "content": "old"}])


@pytest.mark.parametrize(
    "broken",
    [
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": 5}]},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "a"}],
            "usage": {"input_tokens": "1"},
        },
        {"role": "summary", "text": 7},
    ],
    ids=["signature", "usage", "summary"],
)
def test_a_broken_list_in_agentctxs_form_gets_its_own_error(
    tmp_path: Path, broken: dict[str, Any]
) -> None:
    """Found by a hostile run (S, finding 1): a list in agentctx's form with one field wrong
    was read as Anthropic's when it held a thinking block (a signature of 5 became none) or
    blamed a healthy message (a summary, "unsupported role"): thinking blocks are agentctx's
    form too, and a summary message is only agentctx's."""
    history = [to_dict(UserMessage.of("task")), to_dict(SummaryMessage("earlier")), broken]
    path = tmp_path / "n.json"
    path.write_text(json.dumps(history))
    with pytest.raises(TranscriptFormatError, match=r"message 2 in agentctx's form"):
        load_transcript(path)


@pytest.mark.parametrize(
    "bad", [{"role": ["user"], "content": "hi"}, {"role": "user", "content": [{"type": {}}]}]
)
def test_a_role_or_type_that_is_no_string_is_a_format_error(
    tmp_path: Path, bad: dict[str, Any]
) -> None:
    """Found by a hostile run (S, finding 2): a list or object as a role or a block type
    raised TypeError (unhashable) while the list's form was told."""
    path = tmp_path / "n.json"
    path.write_text(json.dumps([bad]))
    with pytest.raises(TranscriptFormatError, match=":1: expected"):
        load_transcript(path)


def test_results_are_frozen() -> None:
    transcript = Transcript("p", "pi", ())
    with pytest.raises(dataclasses.FrozenInstanceError):
        transcript.path = "q"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        RecordedCompaction(0, "s").index = 1  # type: ignore[misc]


# --- packaged demo ---------------------------------------------------------------------------


def test_packaged_demo_transcript_loads() -> None:
    assert DEMO_TRANSCRIPT.is_file()
    readme = (DEMO_TRANSCRIPT.parent / "README.md").read_text("utf-8")
    digest = hashlib.sha256(DEMO_TRANSCRIPT.read_bytes()).hexdigest()
    assert digest in readme and DEMO_TRANSCRIPT.name in readme
    transcript = load_transcript(DEMO_TRANSCRIPT)
    assert transcript.format == "claude-code"
    stats = _stats(transcript.messages)
    assert stats["assistant"] == 12 and stats["calls"] == stats["results"] == 33
    assert stats["over_10k"] == 7
    assert _unanswered(transcript.messages) == []


def test_one_message_of_another_shape_does_not_read_a_neutral_list_as_a_providers(
    tmp_path: Path,
) -> None:
    """Found by a hostile run (CC 5): in a list in agentctx's form, one message whose content
    was a plain string read the whole list as Anthropic's: every other message's timestamp,
    usage and model went into opaque fields, unused, and the replay changed without a word."""
    items: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "task"}], "extra": {"timestamp": 1}},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "a1"}],
            "usage": {"input_tokens": 5000, "output_tokens": 7},
            "extra": {"timestamp": 2},
        },
        {"role": "user", "content": "plain string"},
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(items))
    with pytest.raises(TranscriptFormatError, match="message 2 in agentctx's form"):
        load_transcript(path)
    # The same shape with nothing only agentctx's form holds is a provider's list, as before.
    path.write_text(json.dumps([{k: v for k, v in m.items() if k != "extra"} for m in items]))
    assert load_transcript(path).format == "anthropic"


ONE = [{"type": "text", "text": "first answer"}]
TWO = [{"type": "text", "text": "another answer"}]


def test_two_claude_code_records_with_one_uuid_and_different_messages_are_an_error(
    tmp_path: Path,
) -> None:
    """Found by a hostile run (CC 7): the second, a whole model call with another answer, was
    taken for a record written twice and dropped; only a count in the header hinted at it."""
    records = [
        _cc("user", "a", None, message={"role": "user", "content": "task"}),
        _cc("assistant", "b", "a", message={"id": "m1", "role": "assistant", "content": ONE}),
        _cc("user", "c", "b", message={"role": "user", "content": "second question"}),
        _cc("assistant", "b", "c", message={"id": "m2", "role": "assistant", "content": TWO}),
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(map(json.dumps, records)))
    with pytest.raises(TranscriptFormatError, match="a uuid of its own") as info:
        load_transcript(path)
    assert info.value.line == 4


def test_a_chat_list_whose_tool_messages_carry_a_tool_name_is_a_chat_list(tmp_path: Path) -> None:
    """(CF 5) ``tool_name`` was read as a mark of agentctx's own form: a Chat list written by
    a client of a compatible server (Ollama-style ``tool_name`` on tool messages) was refused."""
    items = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "list the files"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "tool_name": "ls", "content": "a.py"},
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(items))
    assert load_transcript(path).format == "openai-chat"


def test_a_claude_code_record_written_again_with_other_usage_is_one_record(tmp_path: Path) -> None:
    """(CF) A copy whose message differs only in its usage was refused whole."""
    message = {"id": "m1", "role": "assistant", "content": ONE, "usage": {"input_tokens": 1}}
    again = {**message, "usage": {"input_tokens": 2}}
    records = [
        _cc("user", "a", None, message={"role": "user", "content": "task"}),
        _cc("assistant", "b", "a", message=message),
        _cc("assistant", "b", "a", message=again),
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(map(json.dumps, records)))
    assert load_transcript(path).extra["records_repeated"] == 1
