"""Import a pi coding-agent session (JSONL) into neutral messages.

```python
from agentctx.importers.pi import load

transcript = load("~/.pi/agent/sessions/--home-me-proj--/2025-12-09T00-53-29_ffae836b.jsonl")
```

Both layouts pi has written are read: the early linear one (no ``id``/``parentId``; every entry
is part of the conversation) and the tree one (session ``version`` 2+, each entry names its
parent). In a tree, the active branch is the parent chain from the last entry back to the root,
which is what pi itself resumes; ``Transcript.extra["entries_off_branch"]`` counts the entries
of other branches, left out. Two entries with one id are a `TranscriptFormatError`.
``compaction`` entries become `RecordedCompaction` and are not applied: the messages are the
full raw history. Orphan tool calls (aborted turns) are kept as they are; repairing a view for
a provider happens elsewhere.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from agentctx.importers._common import (
    MAX_TRANSCRIPT_BYTES,
    Line,
    RecordedCompaction,
    Source,
    Transcript,
    as_int,
    freeze,
    iso_to_ms,
    refuse_other_format,
)
from agentctx.messages import (
    AssistantContent,
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
    UserContent,
    UserMessage,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["load", "message_from_pi"]

_STOP_REASONS = {
    "stop": "stop",
    "toolUse": "tool_use",
    "length": "length",
    "aborted": "aborted",
    "error": "error",
}


def load(path: str | os.PathLike[str], *, max_bytes: int = MAX_TRANSCRIPT_BYTES) -> Transcript:
    """Read a pi session file; raises `TranscriptFormatError` naming the bad line.

    Files over ``max_bytes`` and anything but a regular file are refused before reading.
    """
    src = Source(os.fspath(path), max_bytes)
    lines = src.read_jsonl()
    refuse_other_format(src, lines, "pi")
    header = lines[0].data if lines[0].data.get("type") == "session" else None
    entries = lines[1:] if header is not None else lines
    reader = _Reader(src)
    extra: dict[str, Any] = {}
    if _is_tree(header, entries):
        branch = _active_branch(src, entries)
        for line in branch:
            reader.entry(line, str(line.data["id"]))
        if len(branch) < len(entries):
            extra["entries_off_branch"] = len(entries) - len(branch)
    else:
        # Early files point at entries by their 0-based line index, header included.
        offset = 1 if header is not None else 0
        for index, line in enumerate(entries, start=offset):
            reader.entry(line, index)
    messages, compactions = tuple(reader.messages), tuple(reader.compactions)
    return Transcript(src.path, "pi", messages, compactions, extra=freeze(extra))


def message_from_pi(message: Mapping[str, Any], *, path: str = "<message>") -> Message | None:
    """Convert one pi ``AgentMessage`` object (as pi keeps it in memory) to a neutral message.

    Returns ``None`` for messages pi keeps out of the model's context (``!!`` commands);
    raises `TranscriptFormatError` (line 0 of ``path``) when a field the role needs is missing.
    """
    return _Reader(Source(path)).message(dict(message), 0, None)


def _is_tree(header: dict[str, Any] | None, entries: list[Line]) -> bool:
    version = header.get("version") if header is not None else None
    if isinstance(version, int) and version >= 2:
        return True
    return bool(entries) and "parentId" in entries[0].data


def _active_branch(src: Source, entries: list[Line]) -> list[Line]:
    if not entries:
        return []
    by_id: dict[str, Line] = {}
    for line in entries:
        key = src.need(line.data, "id", str, line.number, "a tree entry")
        if key in by_id:  # which of the two a child names is anybody's guess
            earlier = by_id[key].number
            raise src.error(line.number, f"an entry id of its own (line {earlier} has {key!r})")
        by_id[key] = line
    chain: list[Line] = []
    seen: set[str] = set()
    current: Line | None = entries[-1]
    while current is not None:
        chain.append(current)
        seen.add(current.data["id"])
        parent = current.data.get("parentId")
        if parent is None:
            break
        if not isinstance(parent, str) or parent not in by_id or parent in seen:
            raise src.error(current.number, "a parentId naming an earlier entry of the file")
        current = by_id[parent]
    chain.reverse()
    return chain


class _Reader:
    """Turns the entries of one branch, in order, into messages and recorded compactions."""

    def __init__(self, src: Source) -> None:
        self.src = src
        self.messages: list[Message] = []
        self.compactions: list[RecordedCompaction] = []
        # Entry key (line index or entry id) -> index of the next message when it was reached,
        # so a compaction's "first kept entry" can be named as a message index.
        self.positions: dict[int | str, int] = {}

    def entry(self, line: Line, key: int | str) -> None:
        self.positions[key] = len(self.messages)
        data, number = line.data, line.number
        kind = data.get("type")
        if kind is not None and not isinstance(kind, str):
            found = type(kind).__name__
            raise self.src.error(number, f"an entry with 'type' as a string (found {found})")
        entry_ms = iso_to_ms(data.get("timestamp"))
        if kind == "message":
            message = self.message(
                self.src.need(data, "message", dict, number, "a message entry"), number, entry_ms
            )
            if message is not None:
                self.messages.append(message)
        elif kind == "compaction":
            self.compaction(data, number)
        elif kind == "branch_summary":
            summary = self.src.need(data, "summary", str, number, "a branch_summary entry")
            extra = _stamp({"source": "branch_summary", "from_id": data.get("fromId")}, entry_ms)
            self.messages.append(SummaryMessage(summary, freeze(extra)))
        elif kind == "custom_message":
            blocks = self.user_content(data, number, "a custom_message entry")
            extra = _stamp({"source": "custom", "custom_type": data.get("customType")}, entry_ms)
            self.messages.append(UserMessage(blocks, freeze(extra)))
        # session headers, model_change, thinking_level_change, custom, label, session_info and
        # entry types newer than this importer never reach the model.

    def compaction(self, data: dict[str, Any], number: int) -> None:
        summary = self.src.need(data, "summary", str, number, "a compaction entry")
        kept: object = data.get("firstKeptEntryId", data.get("firstKeptEntryIndex"))
        extra: dict[str, Any] = {}
        first_kept: int | None = None
        if isinstance(kept, int | str) and not isinstance(kept, bool):
            extra["first_kept_entry"] = kept
            first_kept = self.positions.get(kept)
        tokens = data.get("tokensBefore")
        self.compactions.append(
            RecordedCompaction(
                index=len(self.messages),
                summary=summary,
                tokens_before=as_int(tokens) if isinstance(tokens, int | float) else None,
                first_kept_index=first_kept,
                extra=freeze(extra),
            )
        )

    def message(self, msg: dict[str, Any], number: int, entry_ms: int | None) -> Message | None:
        role = msg.get("role")
        ms = msg.get("timestamp")
        stamp = ms if isinstance(ms, int) and not isinstance(ms, bool) else entry_ms
        if role == "user":
            return UserMessage(self.user_content(msg, number, "a user message"), _ts(stamp))
        if role == "assistant":
            return self.assistant(msg, number, stamp)
        if role == "toolResult":
            call_id = self.src.need(msg, "toolCallId", str, number, "a toolResult message")
            name = msg.get("toolName")
            return ToolResultMessage(
                call_id,
                self.user_content(msg, number, "a toolResult message"),
                name if isinstance(name, str) else None,
                msg.get("isError") is True,  # as written by pi: a bool; "false" is no error
                _ts(stamp),
            )
        if role == "bashExecution":
            return self.bash(msg, number, stamp)
        if role in ("custom", "hookMessage"):
            extra = _stamp({"source": "custom", "custom_type": msg.get("customType")}, stamp)
            return UserMessage(self.user_content(msg, number, "a custom message"), freeze(extra))
        if role in ("branchSummary", "compactionSummary"):
            summary = self.src.need(msg, "summary", str, number, f"a {role} message")
            return SummaryMessage(summary, freeze(_stamp({"source": role}, stamp)))
        raise self.src.error(
            number,
            "a message role pi writes (user, assistant, toolResult, bashExecution, custom, "
            f"branchSummary, compactionSummary), not {role!r}",
        )

    def user_content(self, obj: dict[str, Any], number: int, where: str) -> tuple[UserContent, ...]:
        content = obj.get("content")
        if isinstance(content, str):
            return (TextBlock(content),)
        if not isinstance(content, list):
            raise self.src.error(number, f"{where} with 'content' as a string or a list")
        blocks: list[UserContent] = []
        for block in content:
            block = self._block(block, number, where)
            kind = block.get("type")
            if kind == "text":
                blocks.append(TextBlock(self.src.need(block, "text", str, number, "a text block")))
            elif kind == "image":
                blocks.append(
                    ImageBlock(
                        self.src.need(block, "mimeType", str, number, "an image block"),
                        self.src.need(block, "data", str, number, "an image block"),
                    )
                )
            else:
                blocks.append(OpaqueBlock("pi", block))
        return tuple(blocks)

    def assistant(self, msg: dict[str, Any], number: int, stamp: int | None) -> AssistantMessage:
        content = self.src.need(msg, "content", list, number, "an assistant message")
        blocks: list[AssistantContent] = []
        for raw in content:
            block = self._block(raw, number, "an assistant message")
            blocks.append(self.assistant_block(block, number))
        reason = msg.get("stopReason")
        usage = msg.get("usage")
        model = msg.get("model")
        extra = _stamp({}, stamp)
        for key, name in (
            ("provider", "provider"),
            ("api", "api"),
            ("errorMessage", "error_message"),
        ):
            if isinstance(msg.get(key), str):
                extra[name] = msg[key]
        return AssistantMessage(
            tuple(blocks),
            _STOP_REASONS.get(reason, reason) if isinstance(reason, str) else None,
            Usage(
                as_int(usage.get("input")),
                as_int(usage.get("output")),
                as_int(usage.get("cacheRead")),
                as_int(usage.get("cacheWrite")),
            )
            if isinstance(usage, dict)
            else None,
            model if isinstance(model, str) else None,
            freeze(extra),
        )

    def assistant_block(self, block: dict[str, Any], number: int) -> AssistantContent:
        kind = block.get("type")
        need = self.src.need
        if kind == "text":
            extra = _keep(block, ("textSignature", "text_signature"))
            return TextBlock(need(block, "text", str, number, "a text block"), extra)
        if kind == "thinking":
            signature = block.get("thinkingSignature")
            if block.get("redacted") is True and isinstance(signature, str):
                return RedactedThinkingBlock(signature)
            return ThinkingBlock(
                need(block, "thinking", str, number, "a thinking block"),
                # pi writes "" when the provider sent no signature; there is nothing to replay.
                signature if isinstance(signature, str) and signature else None,
            )
        if kind == "toolCall":
            return ToolCall(
                need(block, "id", str, number, "a toolCall block"),
                need(block, "name", str, number, "a toolCall block"),
                # Interrupted calls keep what pi parsed so far; partialJson rides along.
                need(block, "arguments", dict, number, "a toolCall block"),
                _keep(
                    block,
                    ("partialJson", "partial_json"),
                    ("thoughtSignature", "thought_signature"),
                ),
            )
        return OpaqueBlock("pi", block)

    def bash(self, msg: dict[str, Any], number: int, stamp: int | None) -> UserMessage | None:
        if msg.get("excludeFromContext") is True:
            return None  # a `!!` command: pi shows it but never sends it to the model
        command = self.src.need(msg, "command", str, number, "a bashExecution message")
        output = msg.get("output")
        output = output if isinstance(output, str) else ""
        code = msg.get("exitCode")
        code = code if isinstance(code, int) and not isinstance(code, bool) else None
        text = f"$ {command}\n{output}"
        extra: dict[str, Any] = {"source": "bash_execution", "command": command, "exit_code": code}
        if msg.get("cancelled") is True:
            text += "\n(command cancelled)"
            extra["cancelled"] = True
        elif code not in (None, 0):
            text += f"\n[exit code {code}]"
        if msg.get("truncated") is True:
            extra["truncated"] = True
            if isinstance(msg.get("fullOutputPath"), str):
                extra["full_output_path"] = msg["fullOutputPath"]
        return UserMessage((TextBlock(text),), freeze(_stamp(extra, stamp)))

    def _block(self, block: object, number: int, where: str) -> dict[str, Any]:
        if not isinstance(block, dict):
            raise self.src.error(number, f"{where} whose content blocks are objects")
        return block


def _stamp(extra: dict[str, Any], ms: int | None) -> dict[str, Any]:
    if ms is not None:
        extra["timestamp"] = ms
    return extra


def _ts(ms: int | None) -> Mapping[str, Any]:
    return freeze(_stamp({}, ms))


def _keep(block: dict[str, Any], *renames: tuple[str, str]) -> Mapping[str, Any]:
    """The pi-only fields of a block worth carrying, under their neutral names."""
    return freeze({new: block[old] for old, new in renames if block.get(old) is not None})
