"""Import a SWE-agent trajectory (``.traj``) into neutral messages.

```python
from agentctx.importers.swe_agent import load

transcript = load("trajectories/me/run/django__django-11099.traj")
print(transcript.system, len(transcript.demonstrations), len(transcript.messages))
```

The ``history`` list is read: the conversation as the agent kept it, outputs in full. The
per-step ``trajectory`` (and its prompt snapshots) repeats it and is not read. Both generations
are read:

- function calling (1.x): assistant ``tool_calls`` answered by ``role: "tool"`` messages that
  name them in ``tool_call_ids``;
- thought/action (0.x): the model wrote its command in text, SWE-agent split the response into
  ``thought`` and ``action``, and the next ``user`` message is the command's output. The action
  becomes a ``bash`` `ToolCall` ``{"command": action}`` with id ``swe-<n>`` (the n-th assistant
  message; ``swe-demo-<n>`` in demonstrations), the output its `ToolResultMessage`, and the
  response as the model wrote it rides in the message's ``extra["content"]``. So does an
  assistant ``content`` list whose text a ``thought`` stands in for, or that holds blocks an
  assistant message has none for (``image_url``).

System messages go to ``Transcript.system`` and ``is_demo`` messages to
``Transcript.demonstrations``. Replayed runs reuse tool call ids; a repeated id gets a ``#2``,
``#3``, ... suffix (the file's id in ``extra["original_id"]``) so that every call has its own.
There is no per-message usage: the run totals (``info.model_stats``), ``info.exit_status``, the
model name and the run's ``history_processors`` go to ``Transcript.extra``. The messages hold
every output in full, also where a processor such as ``last_n_observations`` later showed the
model ``Old environment output: (N lines omitted)`` instead. A last action whose output the
model never saw (the 0.x ``submit``) stays an unanswered call; repairing views happens
elsewhere.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from agentctx.importers._common import (
    MAX_RECORDS,
    MAX_TRANSCRIPT_BYTES,
    Source,
    Transcript,
    freeze,
    records_in,
)
from agentctx.messages import (
    AssistantContent,
    AssistantMessage,
    ImageBlock,
    Message,
    OpaqueBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    UserContent,
    UserMessage,
    text_of,
)

if TYPE_CHECKING:
    from agentctx.errors import TranscriptFormatError
    from agentctx.messages import JSONMap

__all__ = ["load"]

T = TypeVar("T")
JsonPath: TypeAlias = tuple[str | int, ...]

_EXPECTED = "a SWE-agent trajectory (one JSON object with a 'history' list)"


def load(path: str | os.PathLike[str], *, max_bytes: int = MAX_TRANSCRIPT_BYTES) -> Transcript:
    """Read a ``.traj`` file; raises `TranscriptFormatError` naming the line of the bad part.

    Files over ``max_bytes`` and anything but a regular file are refused before reading.
    """
    src = Source(os.fspath(path), max_bytes)
    doc = JsonDocument.read(src, _EXPECTED)
    data = doc.value
    if not isinstance(data, dict):
        raise src.error(1, f"{_EXPECTED}, not a JSON {type(data).__name__}")
    history = data.get("history")
    if not isinstance(history, list):
        line = doc.line("history") if "history" in data else 0
        raise src.error(line, f"{_EXPECTED}; 'history' is {type(history).__name__}")
    agent = _agent_config(data.get("replay_config"))
    model_config = agent.get("model")
    name = model_config.get("name") if isinstance(model_config, dict) else None
    model = name if isinstance(name, str) else None
    reader = _Reader(doc, model)
    for k, item in enumerate(history):
        reader.item(k, item)
    info = data.get("info")
    extra: dict[str, Any] = {}
    if isinstance(info, dict):
        extra.update({key: info[key] for key in ("exit_status", "model_stats") if key in info})
    if model is not None:
        extra["model"] = model
    if agent.get("history_processors"):
        # What SWE-agent itself did to the history before each call (``last_n_observations``
        # masks older outputs); ``messages`` are the outputs as they were first seen.
        extra["history_processors"] = agent["history_processors"]
    return Transcript(
        src.path,
        "swe-agent",
        tuple(reader.main.messages),
        system="\n\n".join(reader.system) if reader.system else None,
        demonstrations=tuple(reader.demos.messages),
        extra=freeze(extra),
    )


def _agent_config(config: object) -> dict[str, Any]:
    """The ``agent`` part of the run config, or ``{}``."""
    if isinstance(config, str):  # older runs store the replay config as JSON text
        try:
            config = json.loads(config)
        except (ValueError, RecursionError):  # bad or too deeply nested JSON text
            return {}
    agent = config.get("agent") if isinstance(config, dict) else None
    return agent if isinstance(agent, dict) else {}


@dataclass(slots=True)
class _Stream:
    """The conversation or the demonstrations: their messages are separate, their ids are not."""

    prefix: str
    messages: list[Message] = field(default_factory=list)
    steps: int = 0
    open_call: ToolCall | None = None  # a 0.x action waiting for the next user message
    names: dict[str, str] = field(default_factory=dict)  # call id -> tool name


class _Reader:
    """Turns the ``history`` items, in order, into messages of the two streams."""

    def __init__(self, doc: JsonDocument, model: str | None) -> None:
        self.doc = doc
        self.model = model
        self.ids = CallIds()
        self.system: list[str] = []
        self.main = _Stream("swe-")
        self.demos = _Stream("swe-demo-")

    def item(self, k: int, msg: object) -> None:
        at: JsonPath = ("history", k)
        if not isinstance(msg, dict):
            raise self.doc.error(at, f"a history message that is an object, not {_kind(msg)}")
        role = msg.get("role")
        if role == "system":
            self.system.append(text_of(self.content(msg, at)))
            return
        stream = self.demos if msg.get("is_demo") is True else self.main
        open_call, stream.open_call = stream.open_call, None
        if role == "user":
            blocks = self.content(msg, at)
            if open_call is None:
                stream.messages.append(UserMessage(blocks))
            else:
                result = ToolResultMessage(open_call.id, blocks, open_call.name)
                stream.messages.append(result)
        elif role == "assistant":
            stream.messages.append(self.assistant(msg, at, stream))
        elif role == "tool":
            self.tool(msg, at, stream)
        else:
            found = role if isinstance(role, str) else _kind(role)
            raise self.doc.error(
                at, f"a history message with role system, user, assistant or tool, not {found!r}"
            )

    def assistant(self, msg: dict[str, Any], at: JsonPath, stream: _Stream) -> AssistantMessage:
        stream.steps += 1
        raw = msg.get("content")
        thought = msg.get("thought")
        parts = (
            self.content(msg, at) if not isinstance(thought, str) or isinstance(raw, list) else ()
        )
        written = text_of(parts)
        text = thought if isinstance(thought, str) else written
        # 1.x keeps Anthropic thinking (with its signature) next to the response.
        blocks = thinking_blocks(msg.get("thinking_blocks"))
        if text.strip():
            blocks.append(TextBlock(text))
        extra: dict[str, Any] = {}
        raw_calls = msg.get("tool_calls")
        if isinstance(raw_calls, list) and raw_calls:
            for j, raw_call in enumerate(raw_calls):
                blocks.append(self.call(raw_call, (*at, "tool_calls", j), stream))
        elif raw_calls is not None and not isinstance(raw_calls, list):
            raise self.doc.error(at, "an assistant message with 'tool_calls' as a list")
        else:
            action = msg.get("action")
            if isinstance(action, str) and action.strip():
                call_id, call_extra = self.ids.call(f"{stream.prefix}{stream.steps}")
                call = ToolCall(call_id, "bash", {"command": action}, call_extra)
                stream.names[call_id] = call.name
                stream.open_call = call
                blocks.append(call)
        if isinstance(raw, str) and raw != text:
            extra["content"] = raw  # 0.x: the response as written, command block included
        elif isinstance(raw, list) and (
            written != text or any(not isinstance(b, TextBlock) for b in parts)
        ):
            # As written too: text the thought stands in for, or images an assistant message
            # has no block for, would otherwise be gone without a word.
            extra["content"] = raw
        has_calls = any(isinstance(b, ToolCall) for b in blocks)
        return AssistantMessage(
            tuple(blocks), "tool_use" if has_calls else "stop", None, self.model, freeze(extra)
        )

    def call(self, raw: object, at: JsonPath, stream: _Stream) -> ToolCall:
        if not isinstance(raw, dict):
            raise self.doc.error(at, f"a tool call that is an object, not {_kind(raw)}")
        original = self.need(raw, "id", str, at, "a tool call")
        function = self.need(raw, "function", dict, at, "a tool call")
        name = self.need(function, "name", str, (*at, "function"), "a tool call function")
        arguments, extra = parse_arguments(function.get("arguments"))
        call_id, id_extra = self.ids.call(original)
        stream.names[call_id] = name
        return ToolCall(call_id, name, arguments, freeze({**extra, **id_extra}))

    def tool(self, msg: dict[str, Any], at: JsonPath, stream: _Stream) -> None:
        ids = msg.get("tool_call_ids")
        if ids is None and isinstance(msg.get("tool_call_id"), str):
            ids = [msg["tool_call_id"]]
        if not (isinstance(ids, list) and ids and all(isinstance(i, str) for i in ids)):
            raise self.doc.error(at, "a tool message with 'tool_call_ids' as a list of strings")
        blocks = self.content(msg, at)
        # SWE-agent answers one call per message; should a message name several, each call
        # gets the whole observation, as the model saw it next to each of them.
        for original in ids:
            call_id = self.ids.result(original)
            extra = {"original_id": original} if call_id != original else {}
            stream.messages.append(
                ToolResultMessage(call_id, blocks, stream.names.get(call_id), False, freeze(extra))
            )

    def content(self, msg: dict[str, Any], at: JsonPath) -> tuple[UserContent, ...]:
        content = msg.get("content")
        if isinstance(content, str):
            return (TextBlock(content),) if content else ()
        if content is None and msg.get("role") == "assistant":
            return ()  # a response that was only a tool call
        if not isinstance(content, list):
            raise self.doc.error(at, "a history message with 'content' as a string or a list")
        blocks: list[UserContent] = []
        for j, block in enumerate(content):
            if not isinstance(block, dict):
                raise self.doc.error((*at, "content", j), "content blocks that are objects")
            blocks.append(openai_block(block))
        return tuple(blocks)

    def need(self, obj: dict[str, Any], key: str, kind: type[T], at: JsonPath, where: str) -> T:
        value = obj.get(key)
        if isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool):
            return value
        # Source.need words the error; the line is only worth finding when there is one.
        return self.doc.src.need(obj, key, kind, self.doc.line(*at), where)


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


# ---------------------------------------------------------------------------------------
# Shared with the OpenHands importer


def thinking_blocks(value: object) -> list[AssistantContent]:
    """Anthropic ``thinking`` / ``redacted_thinking`` blocks as LiteLLM passes them on."""
    blocks: list[AssistantContent] = []
    for block in value if isinstance(value, list) else []:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "redacted_thinking" and isinstance(block.get("data"), str):
            blocks.append(RedactedThinkingBlock(block["data"]))
        elif isinstance(block.get("thinking"), str):
            signature = block.get("signature")
            signed = signature if isinstance(signature, str) and signature else None
            blocks.append(ThinkingBlock(block["thinking"], signed))
    return blocks


def parse_arguments(value: object) -> tuple[dict[str, Any], dict[str, Any]]:
    """Tool call arguments as an object, and the extra fields to keep when they were not one.

    Models do write malformed argument JSON; the call is kept with ``{}`` and the text rides
    in ``extra["raw_arguments"]`` rather than failing the whole transcript.
    """
    if isinstance(value, dict):
        return value, {}
    if value is None or value == "":
        return {}, {}
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):  # bad or too deeply nested JSON text
            parsed = None
        if isinstance(parsed, dict):
            return parsed, {}
    return {}, {"raw_arguments": value}


_DATA_URL = re.compile(r"data:([^;,]*);base64,(.*)", re.DOTALL)


def image_block(url: str, extra: JSONMap | None = None) -> ImageBlock:
    """An `ImageBlock` from an image URL; ``data:`` URLs become base64 data."""
    rest = extra if extra is not None else freeze({})
    match = _DATA_URL.fullmatch(url)
    if match is not None:
        return ImageBlock(match.group(1), match.group(2), "base64", rest)
    return ImageBlock("", url, "url", rest)


def openai_block(block: dict[str, Any]) -> UserContent:
    """A Chat Completions content block (``text`` or ``image_url``) as a neutral block."""
    kind = block.get("type")
    if kind == "text" and isinstance(block.get("text"), str):
        return TextBlock(block["text"])
    image = block.get("image_url")
    if kind == "image_url" and isinstance(image, dict) and isinstance(image.get("url"), str):
        rest = {k: v for k, v in image.items() if k != "url"}
        return image_block(image["url"], freeze(rest))
    return OpaqueBlock("openai", block)


class CallIds:
    """Unique tool call ids for one transcript.

    The first call with an id keeps it; a later call with the same id is renamed ``id#2``,
    ``id#3``, ... and results that name the id answer the latest call that had it, which is how
    the agent itself paired them.
    """

    def __init__(self) -> None:
        self.used: set[str] = set()
        self.latest: dict[str, str] = {}
        # The last number each id was renamed with: every one below it is taken, so the
        # search goes on from there (from 1 each time, a file of one id cost k^2 steps).
        self.renamed: dict[str, int] = {}

    def call(self, original: str) -> tuple[str, dict[str, Any]]:
        """The id to give a call the file names ``original``, and the extra fields to add."""
        n = self.renamed.get(original, 1)
        unique = original if n == 1 else f"{original}#{n}"
        while unique in self.used:
            n += 1
            unique = f"{original}#{n}"
        self.used.add(unique)
        self.renamed[original] = n
        self.latest[original] = unique
        return unique, ({"original_id": original} if unique != original else {})

    def result(self, original: str) -> str:
        """The id of the call a result naming ``original`` answers."""
        return self.latest.get(original, original)


_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class JsonDocument:
    """A whole-file JSON value that can name the line where any part of it starts.

    Lines are found only when an error needs one: the file is scanned again from the start,
    which costs nothing on files that parse.
    """

    def __init__(self, src: Source, text: str, value: Any) -> None:
        self.src = src
        self.text = text
        self.value = value

    @classmethod
    def read(cls, src: Source, expected: str) -> JsonDocument:
        """Read and parse ``src``; bad UTF-8 or JSON raises with its line."""
        return cls.parse(src, cls.decode(src, expected), expected)

    @classmethod
    def parse(cls, src: Source, text: str, expected: str) -> JsonDocument:
        """Parse the text of ``src``; bad or too deeply nested JSON, or a list of records (the
        value, or a list in it) longer than `MAX_RECORDS`, raises with its line."""
        value = src.loads(text, 0, expected)
        if records_in(value) > MAX_RECORDS:
            # As a JSONL file's lines are: the replay of each takes time and memory.
            raise src.error(0, f"a transcript of at most {MAX_RECORDS} records")
        return cls(src, text, value)

    @staticmethod
    def decode(src: Source, expected: str) -> str:
        """The text of ``src``; bad UTF-8 or an empty file raises."""
        data = src.read_bytes()
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise src.error(data.count(b"\n", 0, e.start) + 1, "UTF-8 text") from None
        if not text.strip():
            raise src.error(0, f"{expected} (the file is empty)")
        return text

    def line(self, *path: str | int) -> int:
        """The 1-based line where the value at ``path`` (keys and list indexes) starts."""
        text = self.text
        i = _skip(text, 0)
        for step in path:
            found = _child(text, i, step)
            if found is None:
                break
            i = found
        return text.count("\n", 0, i) + 1

    def error(self, at: JsonPath, expected: str) -> TranscriptFormatError:
        """A `TranscriptFormatError` at the line where the value at ``at`` starts."""
        return self.src.error(self.line(*at), expected)


def _child(text: str, i: int, step: str | int) -> int | None:
    """Where the member ``step`` of the array or object starting at ``text[i]`` starts."""
    opening = text[i]
    if (opening == "[") != isinstance(step, int) or opening not in "[{":
        return None
    closing = "]" if opening == "[" else "}"
    i = _skip(text, i + 1)
    index = 0
    while text[i] != closing:
        if opening == "{":
            key, i = _DECODER.raw_decode(text, i)
            i = _skip(text, _skip(text, i) + 1)  # past the colon
            if key == step:
                return i
        elif index == step:
            return i
        _, i = _DECODER.raw_decode(text, i)
        i = _skip(text, i)
        if text[i] == ",":
            i = _skip(text, i + 1)
        index += 1
    return None


def _skip(text: str, i: int) -> int:
    """The position of the first non-whitespace character at or after ``i``."""
    match = _WS.match(text, i)
    return match.end() if match is not None else i
