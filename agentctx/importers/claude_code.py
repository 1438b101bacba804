"""Import a Claude Code session transcript (JSONL) into neutral messages.

```python
from agentctx.importers.claude_code import load

transcript = load("~/.claude/projects/-home-me-proj/5c0375b4-57a5-4f26-b12d-d022ee4e51b7.jsonl")
```

Claude Code writes one ``assistant`` record per content block; records sharing a
``message.id`` are joined back into the one API response they came from, and tool results
that were streamed in between them follow that response, in call order. Records that never
reach the model (progress, file-history snapshots, titles, queue operations, most system
records) are skipped. A ``compact_boundary`` becomes a `RecordedCompaction`, and the summary
record after it a `SummaryMessage`. A record written twice (one ``uuid``, a message with the
same id, role and content) is read once; ``Transcript.extra["records_repeated"]`` counts the
copies left out; two records with one ``uuid`` and different messages are a format error.
Turns a rewind (Esc Esc, ``/rewind``) abandoned stay in the file: the conversation is the
chain of ``parentUuid`` that ends at the last message, and a branch off it that starts with a
typed prompt is left out (``Transcript.extra["entries_off_branch"]`` counts its records; the
results of parallel calls, which name their call's record, are no such branch).

A subagent's records (``isSidechain``) are a different conversation. ``thread="auto"`` reads
the main conversation, or the subagent's when the file holds nothing else (a subagent file);
``thread="sidechains"`` reads only the subagent conversations of a main file, one after
another.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

from agentctx.errors import ConfigError
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
    JSONMap,
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
    text_of,
)

__all__ = ["Thread", "load"]

Thread = Literal["auto", "main", "sidechains"]

_STOP_REASONS = {"end_turn": "stop", "tool_use": "tool_use", "max_tokens": "length"}
_CONVERSATION = frozenset({"user", "assistant"})


def load(
    path: str | os.PathLike[str],
    *,
    thread: Thread = "auto",
    max_bytes: int = MAX_TRANSCRIPT_BYTES,
) -> Transcript:
    """Read a Claude Code JSONL file; raises `TranscriptFormatError` naming the bad line.

    Files over ``max_bytes`` and anything but a regular file are refused before reading.
    ``thread`` is ``"auto"``, ``"main"`` or ``"sidechains"`` (anything else: `ConfigError`).
    """
    if not isinstance(thread, str) or thread not in get_args(Thread):
        # Read as "sidechains" before: a misspelt "Main" loaded no message at all.
        raise ConfigError(
            f"thread must be one of {', '.join(map(repr, get_args(Thread)))}, not {thread!r}"
        )
    src = Source(os.fspath(path), max_bytes)
    lines = src.read_jsonl()
    refuse_other_format(src, lines, "Claude Code")
    if thread == "auto":
        main = any(
            _type(line) in _CONVERSATION and line.data.get("isSidechain") is not True
            for line in lines
        )
        thread = "main" if main else "sidechains"
    off_branch = 0
    if thread == "main":
        selected = [line for line in lines if line.data.get("isSidechain") is not True]
        selected, off_branch = _active_branch(selected)
    else:
        selected = _by_conversation([line for line in lines if line.data.get("isSidechain")])
    reader = _Reader(src)
    seen: dict[str, Any] = {}
    repeated = 0
    for line in selected:
        uuid = line.data.get("uuid")
        if isinstance(uuid, str):
            if uuid in seen:  # a record written twice: its blocks would be read twice
                if _said(line.data.get("message")) != seen[uuid]:
                    # Two records, one name: which one the conversation goes through is not
                    # known, and reading either drops the other's model call in silence.
                    raise src.error(line.number, f"a record with a uuid of its own ({uuid!r})")
                repeated += 1
                continue
            seen[uuid] = _said(line.data.get("message"))
        reader.record(line)
    reader.flush()
    counts = {"records_repeated": repeated, "entries_off_branch": off_branch}
    extra = freeze({key: n for key, n in counts.items() if n})
    messages, compactions = tuple(reader.messages), tuple(reader.compactions)
    return Transcript(src.path, "claude-code", messages, compactions, extra=extra)


def _said(message: object) -> object:
    """What a record's message says (its id, role and content): a copy written again may
    differ in the rest (usage)."""
    if not isinstance(message, dict):
        return message
    return (message.get("id"), message.get("role"), message.get("content"))


def _type(line: Line) -> str | None:
    kind = line.data.get("type")
    return kind if isinstance(kind, str) else None


def _parent(line: Line) -> str | None:
    """The record ``line`` follows: its ``parentUuid``, or across a compaction (whose boundary
    starts a new chain) its ``logicalParentUuid``."""
    parent = line.data.get("parentUuid")
    if not isinstance(parent, str):
        parent = line.data.get("logicalParentUuid")
    return parent if isinstance(parent, str) else None


def _active_branch(lines: list[Line]) -> tuple[list[Line], int]:
    """``lines`` without the records of branches left behind, and how many those were.

    A rewind (Esc Esc, ``/rewind``) keeps the abandoned turns in the file: the prompt typed
    instead names an earlier record as its parent (none, when it went back to the first
    prompt). The conversation is the chain of parents that ends at the last message. Off it
    hang the results of parallel tool calls (each names its call's record) and the turns a
    rewind left: a branch that starts with a typed prompt, or a tree of its own that does
    when the conversation starts at a prompt with no parent too. Only those are left out; a
    record whose parents never reach the chain otherwise (one naming a record this file does
    not hold) is kept, as read."""
    by_uuid: dict[str, Line] = {}
    for line in lines:
        uuid = line.data.get("uuid")
        if isinstance(uuid, str):
            by_uuid.setdefault(uuid, line)
    last = next(
        (line for line in reversed(lines) if _type(line) in _CONVERSATION and _uuid(line)), None
    )
    if last is None:
        return lines, 0
    chain: set[str] = set()
    node: Line | None = last
    top = last
    while node is not None and (uuid := _uuid(node)) is not None and uuid not in chain:
        chain.add(uuid)
        top = node
        parent = _parent(node)
        node = by_uuid.get(parent) if parent is not None else None
    # A conversation that starts at a prompt with no parent, beside another such prompt: the
    # user went back to the first prompt and typed another, and the first tree was left.
    fresh_start = _parent(top) is None and _typed_prompt(top)
    reaches: dict[str, bool] = {}  # off the chain: whether it is on a branch left behind

    def left_behind(line: Line) -> bool:
        path: dict[str, Line] = {}  # the records walked up through, in order
        node: Line | None = line
        found = False
        while node is not None and (uuid := _uuid(node)) is not None:
            if uuid in chain:
                found = bool(path) and _typed_prompt(next(reversed(path.values())))
                break
            if uuid in reaches or uuid in path:
                found = reaches.get(uuid, False)
                break
            path[uuid] = node
            parent = _parent(node)
            if parent is None:  # the top of a tree the chain is not in
                found = fresh_start and _typed_prompt(node)
                break
            node = by_uuid.get(parent)
        reaches.update(dict.fromkeys(path, found))
        return found

    kept = [line for line in lines if not left_behind(line)]
    return kept, len(lines) - len(kept)


def _typed_prompt(line: Line) -> bool:
    """Whether ``line`` is a prompt the user typed: a user record holding no tool result, and
    none Claude Code wrote itself (``isMeta``: hook output, reminders)."""
    message = line.data.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    return (
        _type(line) == "user"
        and line.data.get("isMeta") is not True
        and not (
            isinstance(content, list)
            and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)
        )
    )


def _uuid(line: Line) -> str | None:
    uuid = line.data.get("uuid")
    return uuid if isinstance(uuid, str) else None


def _by_conversation(lines: list[Line]) -> list[Line]:
    """Each subagent conversation contiguous, in order of first appearance.

    Parallel subagents of older versions write into the main file at the same time, so their
    records interleave; each conversation is one ``parentUuid`` tree.
    """
    root_of: dict[str, int] = {}
    keyed: list[tuple[int, int, Line]] = []
    for i, line in enumerate(lines):
        parent = line.data.get("parentUuid")
        root = root_of.get(parent, i) if isinstance(parent, str) else i
        uuid = line.data.get("uuid")
        if isinstance(uuid, str):
            root_of[uuid] = root
        keyed.append((root, i, line))
    keyed.sort(key=lambda item: (item[0], item[1]))
    return [line for _, _, line in keyed]


@dataclass(slots=True)
class _Response:
    """One API response being rebuilt from the records that share its ``message.id``."""

    id: str
    blocks: list[AssistantContent]
    extra: dict[str, Any]
    last: dict[str, Any] = field(default_factory=dict)
    model: str | None = None

    def build(self) -> AssistantMessage:
        # Input and cache counts repeat on every split record; output_tokens and stop_reason
        # are only final on the last one (earlier ones carry streaming placeholders).
        usage = self.last.get("usage")
        reason = self.last.get("stop_reason")
        return AssistantMessage(
            tuple(self.blocks),
            _STOP_REASONS.get(reason, reason) if isinstance(reason, str) else None,
            Usage(
                as_int(usage.get("input_tokens")),
                as_int(usage.get("output_tokens")),
                as_int(usage.get("cache_read_input_tokens")),
                as_int(usage.get("cache_creation_input_tokens")),
            )
            if isinstance(usage, dict)
            else None,
            self.model,
            freeze(self.extra),
        )


class _Reader:
    """Turns the selected records, in file order, into messages and recorded compactions."""

    def __init__(self, src: Source) -> None:
        self.src = src
        self.messages: list[Message] = []
        self.compactions: list[RecordedCompaction] = []
        self.response: _Response | None = None
        self.held: list[ToolResultMessage] = []  # results that arrived mid-response
        self.tool_names: dict[str, str] = {}

    def record(self, line: Line) -> None:
        kind = line.data.get("type")
        if kind is not None and not isinstance(kind, str):
            found = type(kind).__name__
            raise self.src.error(line.number, f"a record with 'type' as a string (found {found})")
        if kind == "assistant":
            self.assistant(line)
        elif kind == "user":
            self.user(line)
        elif kind == "system" and line.data.get("subtype") == "compact_boundary":
            self.flush()
            meta = line.data.get("compactMetadata")
            meta = meta if isinstance(meta, dict) else {}
            tokens = meta.get("preTokens")
            trigger = meta.get("trigger")
            here = len(self.messages)
            self.compactions.append(
                RecordedCompaction(
                    index=here,
                    summary="",  # filled in by the isCompactSummary record that follows
                    tokens_before=as_int(tokens) if isinstance(tokens, int | float) else None,
                    first_kept_index=here,  # Claude Code keeps nothing from before the cut
                    extra=freeze({"trigger": trigger} if isinstance(trigger, str) else {}),
                )
            )

    def flush(self) -> None:
        """Emit the response being rebuilt, then the results held back for it in call order."""
        if self.response is None:
            return
        message = self.response.build()
        self.messages.append(message)
        order = {call.id: i for i, call in enumerate(message.tool_calls)}
        self.held.sort(key=lambda result: order.get(result.tool_call_id, len(order)))
        self.messages.extend(self.held)
        self.held.clear()
        self.response = None

    def assistant(self, line: Line) -> None:
        need, number = self.src.need, line.number
        msg = need(line.data, "message", dict, number, "an assistant record")
        message_id = need(msg, "id", str, number, "an assistant message")
        content = need(msg, "content", list, number, "an assistant message")
        if self.response is None or self.response.id != message_id:
            self.flush()
            extra: dict[str, Any] = {"message_id": message_id}
            ms = iso_to_ms(line.data.get("timestamp"))
            if ms is not None:
                extra["timestamp"] = ms
            self.response = _Response(message_id, [], extra)
        response = self.response
        for block in content:
            response.blocks.append(self.assistant_block(self._block(block, number), number))
        response.last = msg
        if response.model is None and isinstance(msg.get("model"), str):
            response.model = msg["model"]

    def assistant_block(self, block: dict[str, Any], number: int) -> AssistantContent:
        need = self.src.need
        kind = block.get("type")
        if kind == "text":
            return TextBlock(need(block, "text", str, number, "a text block"), _rest(block, "text"))
        if kind == "thinking":
            signature = block.get("signature")
            return ThinkingBlock(
                need(block, "thinking", str, number, "a thinking block"),
                signature if isinstance(signature, str) and signature else None,
                _rest(block, "thinking", "signature"),
            )
        if kind == "redacted_thinking":
            data = need(block, "data", str, number, "a redacted_thinking block")
            return RedactedThinkingBlock(data, _rest(block, "data"))
        if kind == "tool_use":
            call_id = need(block, "id", str, number, "a tool_use block")
            name = need(block, "name", str, number, "a tool_use block")
            self.tool_names[call_id] = name
            arguments = need(block, "input", dict, number, "a tool_use block")
            return ToolCall(call_id, name, arguments, _rest(block, "id", "name", "input"))
        return OpaqueBlock("anthropic", block)

    def user(self, line: Line) -> None:
        data, number = line.data, line.number
        msg = self.src.need(data, "message", dict, number, "a user record")
        content = msg.get("content")
        extra: dict[str, Any] = {}
        ms = iso_to_ms(data.get("timestamp"))
        if ms is not None:
            extra["timestamp"] = ms
        if data.get("isCompactSummary") is True:
            self.flush()
            self.summary(content, number, extra)
            return
        if data.get("isMeta") is True:
            extra["meta"] = True  # injected by Claude Code, but the model did read it
        if isinstance(content, str):
            self.flush()
            self.messages.append(UserMessage((TextBlock(content),), freeze(extra)))
            return
        if not isinstance(content, list):
            raise self.src.error(number, "a user message with 'content' as a string or a list")
        results: list[ToolResultMessage] = []
        others: list[UserContent] = []
        for raw in content:
            block = self._block(raw, number)
            if block.get("type") == "tool_result":
                results.append(self.tool_result(block, number, ms))
            else:
                others.append(self.user_block(block))
        (self.held if self.response is not None else self.messages).extend(results)
        if others:
            self.flush()
            self.messages.append(UserMessage(tuple(others), freeze(extra)))

    def summary(self, content: object, number: int, extra: dict[str, Any]) -> None:
        if isinstance(content, str):
            text = content
        elif isinstance(content, list):
            text = text_of(self.user_block(self._block(b, number)) for b in content)
        else:
            raise self.src.error(number, "a compact summary with 'content' as text")
        here = len(self.messages)
        last = self.compactions[-1] if self.compactions else None
        if last is not None and last.index == here and not last.summary:
            self.compactions[-1] = replace(last, summary=text)
        else:  # a summary without its boundary record: the agent compacted all the same
            self.compactions.append(RecordedCompaction(here, text, None, here))
        self.messages.append(SummaryMessage(text, freeze(extra)))

    def tool_result(self, block: dict[str, Any], number: int, ms: int | None) -> ToolResultMessage:
        call_id = self.src.need(block, "tool_use_id", str, number, "a tool_result block")
        content = block.get("content")
        blocks: tuple[UserContent, ...]
        if content is None:
            blocks = ()
        elif isinstance(content, str):
            blocks = (TextBlock(content),)
        elif isinstance(content, list):
            blocks = tuple(self.user_block(self._block(b, number)) for b in content)
        else:
            raise self.src.error(number, "a tool_result with 'content' as a string or a list")
        return ToolResultMessage(
            call_id,
            blocks,
            self.tool_names.get(call_id),
            block.get("is_error") is True,
            freeze({"timestamp": ms} if ms is not None else {}),
        )

    def user_block(self, block: dict[str, Any]) -> UserContent:
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            return TextBlock(block["text"], _rest(block, "text"))
        source = block.get("source")
        if kind == "image" and isinstance(source, dict):
            media_type = source.get("media_type")
            media_type = media_type if isinstance(media_type, str) else ""
            if source.get("type") == "base64" and isinstance(source.get("data"), str):
                return ImageBlock(media_type, source["data"], "base64", _rest(block, "source"))
            if source.get("type") == "url" and isinstance(source.get("url"), str):
                return ImageBlock(media_type, source["url"], "url", _rest(block, "source"))
        return OpaqueBlock("anthropic", block)

    def _block(self, block: object, number: int) -> dict[str, Any]:
        if not isinstance(block, dict):
            raise self.src.error(number, "content blocks that are JSON objects")
        return block


def _rest(block: dict[str, Any], *known: str) -> JSONMap:
    """The block's Anthropic fields agentctx does not model (cache_control, citations, ...)."""
    return freeze({k: v for k, v in block.items() if k != "type" and k not in known})
