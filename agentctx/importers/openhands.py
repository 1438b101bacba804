"""Import an OpenHands conversation (V0 events, V0 evaluation output, V1 SDK events).

```python
from agentctx.importers import openhands

transcript = openhands.load("trajectory.json")            # a V0 event list
third = openhands.load("output.jsonl", instance=2)        # one instance of an evaluation run
every = openhands.load_instances("output.jsonl")          # all of them, in file order
```

Three layouts are read, told apart by content:

- a JSON array of V0 events (or V0 events one per line);
- V0 evaluation or resolver output: JSONL, one task instance per line with its events in
  ``history``. ``instance`` picks the line (0-based; the first by default). The 2024 resolver
  output has no event ids, sources or tool metadata: an observation answers the action right
  before it, an agent's message is told from the user's by coming after the first action;
- V1 (software-agent-sdk) events, one JSON object per line, told apart by ``kind``.

What becomes what:

- Agent actions that call a tool (``run``, ``read``, ``edit``, ``think``, ``finish``, ...; V1
  ``ActionEvent``) become `ToolCall`s. The actions of one model response (same
  ``model_response.id`` / ``llm_response_id``) form one `AssistantMessage`: text from their
  ``thought``, usage and model from the recorded response. Ids are the provider's
  ``tool_call_id``, or ``oh-<event id>`` (``oh-<position>`` in resolver output) when there is
  none; a repeated id gets a ``#2`` suffix. Arguments are the ones the model sent when the
  response is recorded, else the action's own fields.
- Observations of a call (linked by ``tool_call_metadata``, ``cause``, V1 ``tool_call_id``, or
  position) become `ToolResultMessage`s of their ``content``, right after their response in call
  order; ``error`` observations and V1 errors and rejections have ``is_error``.
- User messages become `UserMessage`s and agent messages text-only replies. An observation
  that answers no call (an ``error`` OpenHands raised before a call became an action, the
  output of a command the user ran) becomes a UserMessage with ``extra["source"]`` set to its
  type; ``recall`` observations (workspace context, microagent knowledge) likewise, with the
  recalled fields in ``extra["recall"]``.
- The ``system`` action (V1 ``SystemPromptEvent``) fills ``Transcript.system``, and its tool
  schemas ``Transcript.extra["tools"]``. Condensations become `RecordedCompaction`s (what they
  forgot rides in ``extra``), condensation summaries `SummaryMessage`s.
- State changes, ``null`` observations, ``recall`` actions and hidden runtime commands never
  reach the model and are skipped.

Nothing is repaired: a ``finish`` call has no observation and stays unanswered, and an
observation whose action is not in the file (an excerpt) is kept as it is. Timestamps are local
times without a zone, read as UTC into ``extra["timestamp"]`` (epoch milliseconds).
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from agentctx.errors import ConfigError
from agentctx.importers._common import (
    MAX_TRANSCRIPT_BYTES,
    RecordedCompaction,
    Source,
    Transcript,
    as_int,
    each_line,
    freeze,
    iso_to_ms,
)
from agentctx.importers.swe_agent import (
    CallIds,
    JsonDocument,
    image_block,
    openai_block,
    parse_arguments,
    thinking_blocks,
)
from agentctx.messages import (
    AssistantContent,
    AssistantMessage,
    Message,
    OpaqueBlock,
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

if TYPE_CHECKING:
    from collections.abc import Callable

    from agentctx.errors import TranscriptFormatError

__all__ = ["load", "load_instances"]

T = TypeVar("T")

_EXPECTED = "OpenHands events (a JSON array, JSONL, or evaluation output with a 'history' list)"
_STOP_REASONS = {"stop": "stop", "tool_calls": "tool_use", "length": "length"}
# Actions that are bookkeeping, never a model's tool call.
_NOT_CALLS = frozenset(
    {"recall", "change_agent_state", "null", "condensation_request", "pause", "resume"}
)
_SKIPPED_OBSERVATIONS = frozenset({"null", "agent_state_changed"})
# V0 action fields that are OpenHands' own, not arguments the model chose.
_NOT_ARGUMENTS = frozenset(
    {
        "action",
        "action_risk",
        "args",
        "blocking",
        "cause",
        "confirmation_state",
        "cwd",
        "hidden",
        "id",
        "impl_source",
        "include_extra",
        "is_confirmed",
        "is_input",
        "is_static",
        "keep_prompt",
        "kernel_init_code",
        "llm_metrics",
        "message",
        "security_risk",
        "source",
        "thought",
        "timeout",
        "timestamp",
        "tool_call_metadata",
        "translated_ipython_code",
    }
)
_V1_RESULTS = frozenset({"ObservationEvent", "UserRejectObservation", "AgentErrorEvent"})


def load(
    path: str | os.PathLike[str], *, instance: int = 0, max_bytes: int = MAX_TRANSCRIPT_BYTES
) -> Transcript:
    """Read one conversation; raises `TranscriptFormatError` naming the line of the bad part.

    ``instance`` is the 0-based line of an evaluation output; other layouts hold one
    conversation, instance 0. Files over ``max_bytes`` and anything but a regular file are
    refused before reading. An ``instance`` that is no ``int`` is a `ConfigError`.
    """
    if type(instance) is not int:  # a bool is an int, and no line number
        raise ConfigError(f"instance must be an int (a 0-based line), not {instance!r}")
    src = Source(os.fspath(path), max_bytes)
    runs = _runs(src)
    if not 0 <= instance < len(runs):
        raise src.error(0, f"an OpenHands file with an instance {instance} (it has {len(runs)})")
    return runs[instance].read(src)


def load_instances(
    path: str | os.PathLike[str], *, max_bytes: int = MAX_TRANSCRIPT_BYTES
) -> tuple[Transcript, ...]:
    """Every conversation of the file, in order: one per line of an evaluation output."""
    src = Source(os.fspath(path), max_bytes)
    return tuple(run.read(src) for run in _runs(src))


@dataclass(frozen=True, slots=True)
class _Event:
    """One event and the means to name its line (found only when an error needs it)."""

    data: dict[str, Any]
    line: Callable[[], int]


@dataclass(slots=True)
class _Run:
    """The events of one conversation and what the file says about it."""

    events: list[_Event]
    extra: dict[str, Any] = field(default_factory=dict)

    def read(self, src: Source) -> Transcript:
        # The 2024 resolver layout has no sources, ids or tool metadata on any event.
        legacy = not any("source" in e.data or "kind" in e.data for e in self.events)
        reader = _Reader(src, legacy)
        for position, event in enumerate(self.events):
            reader.event(event, position)
        reader.flush()
        extra = dict(self.extra)
        if reader.tools is not None:
            extra["tools"] = reader.tools
        if reader.stats is not None:
            extra["stats"] = reader.stats
        return Transcript(
            src.path,
            "openhands",
            tuple(reader.messages),
            tuple(reader.compactions),
            system="\n\n".join(reader.system) if reader.system else None,
            extra=freeze(extra),
        )


def _runs(src: Source) -> list[_Run]:
    text = JsonDocument.decode(src, _EXPECTED)
    if _is_jsonl(text):
        return _jsonl_runs(src)
    doc = JsonDocument.parse(src, text, _EXPECTED)
    value = doc.value
    if isinstance(value, list):
        return [_Run(_events(src, value, lambda k: lambda: doc.line(k)))]
    if isinstance(value, dict) and "history" in value:  # one evaluation output, pretty-printed
        return [_instance(src, value, 0, lambda: doc.line("history"))]
    if isinstance(value, dict):
        return [_Run([_Event(value, lambda: doc.line())])]
    raise src.error(1, f"{_EXPECTED}, not a JSON {type(value).__name__}")


def _is_jsonl(text: str) -> bool:
    """Whether the first line is a whole JSON value and more lines follow it."""
    lines = list(itertools.islice((line for line in each_line(text) if line.strip()), 2))
    if len(lines) < 2:
        return False
    try:
        json.loads(lines[0])
    except (ValueError, RecursionError):  # the whole-file parse says what is wrong
        return False
    return True


def _jsonl_runs(src: Source) -> list[_Run]:
    lines = src.read_jsonl()
    if "history" not in lines[0].data:  # V0 or V1 events, one per line
        return [_Run([_Event(line.data, _at(line.number)) for line in lines])]
    return [_instance(src, line.data, k, _at(line.number)) for k, line in enumerate(lines)]


def _instance(src: Source, data: dict[str, Any], k: int, line: Callable[[], int]) -> _Run:
    """The run of one evaluation output: its events are all reported at ``line``."""
    history = data.get("history")
    if not isinstance(history, list):
        raise src.error(line(), "an evaluation output with 'history' as a list")
    extra: dict[str, Any] = {"instance": k}
    if isinstance(data.get("instance_id"), str):
        extra["instance_id"] = data["instance_id"]
    # Early outputs keep the history as [action, observation] pairs.
    flat = [e for item in history for e in (item if isinstance(item, list) else [item])]
    return _Run(_events(src, flat, lambda _k: line), extra)


def _events(
    src: Source, items: list[Any], where: Callable[[int], Callable[[], int]]
) -> list[_Event]:
    events = []
    for k, item in enumerate(items):
        if not isinstance(item, dict):
            found = "null" if item is None else type(item).__name__
            raise src.error(where(k)(), f"OpenHands events that are objects, not {found}")
        events.append(_Event(item, where(k)))
    return events


def _at(number: int) -> Callable[[], int]:
    return lambda: number


@dataclass(slots=True)
class _Response:
    """One model response being rebuilt from the actions it produced."""

    key: object
    blocks: list[AssistantContent] = field(default_factory=list)
    calls: set[str] = field(default_factory=set)
    stop_reason: str | None = None
    usage: Usage | None = None
    model: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def add_text(self, text: object) -> None:
        # Some versions copy the response's text onto every action it produced.
        if isinstance(text, str) and text.strip() and TextBlock(text) not in self.blocks:
            self.blocks.append(TextBlock(text))

    def build(self) -> AssistantMessage:
        reason = "tool_use" if self.calls else self.stop_reason
        return AssistantMessage(
            tuple(self.blocks), reason, self.usage, self.model, freeze(self.extra)
        )


class _Reader:
    """Turns the events of one conversation, in order, into messages and compactions."""

    def __init__(self, src: Source, legacy: bool) -> None:
        self.src = src
        self.legacy = legacy
        self.messages: list[Message] = []
        self.compactions: list[RecordedCompaction] = []
        self.system: list[str] = []
        self.tools: Any = None
        self.stats: Any = None
        self.response: _Response | None = None
        self.held: list[ToolResultMessage] = []  # results of the response being rebuilt
        self.ids = CallIds()
        self.names: dict[str, str] = {}  # call id -> tool name
        self.by_event: dict[object, str] = {}  # action event id -> its call id
        self.last_call: str | None = None  # the call an unlinked observation may answer
        self.acted = False  # an agent action was seen (tells legacy messages apart)

    # --- shared -------------------------------------------------------------------------

    def flush(self) -> None:
        """Emit the response being rebuilt, then its results in call order."""
        if self.response is None:
            return
        message = self.response.build()
        self.messages.append(message)
        order = {call.id: i for i, call in enumerate(message.tool_calls)}
        self.held.sort(key=lambda result: order.get(result.tool_call_id, len(order)))
        self.messages.extend(self.held)
        self.held.clear()
        self.response = None

    def emit(self, message: Message) -> None:
        self.flush()
        self.last_call = None
        self.messages.append(message)

    def open(self, key: object) -> _Response:
        if self.response is None or self.response.key != key:
            self.flush()
            self.response = _Response(key)
        return self.response

    def add_call(
        self,
        response: _Response,
        original: str,
        name: str,
        arguments: dict[str, Any],
        extra: dict[str, Any],
        event_id: object,
    ) -> None:
        call_id, id_extra = self.ids.call(original)
        response.blocks.append(ToolCall(call_id, name, arguments, freeze({**extra, **id_extra})))
        response.calls.add(call_id)
        self.names[call_id] = name
        if isinstance(event_id, int | str):
            self.by_event[event_id] = call_id
        self.last_call = call_id
        self.acted = True

    def result(
        self,
        call_id: str,
        blocks: tuple[UserContent, ...],
        is_error: bool,
        extra: dict[str, Any],
        name: object = None,
    ) -> None:
        if self.last_call == call_id:
            self.last_call = None
        tool_name = self.names.get(call_id, name if isinstance(name, str) else None)
        message = ToolResultMessage(call_id, blocks, tool_name, is_error, freeze(extra))
        if self.response is not None and call_id in self.response.calls:
            self.held.append(message)
        else:
            self.flush()
            self.messages.append(message)

    def compaction(self, summary: object, extra: dict[str, Any]) -> None:
        self.flush()
        text = summary if isinstance(summary, str) else ""
        self.compactions.append(RecordedCompaction(len(self.messages), text, extra=freeze(extra)))

    def need(self, event: _Event, obj: dict[str, Any], key: str, kind: type[T], where: str) -> T:
        value = obj.get(key)
        if isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool):
            return value
        return self.src.need(obj, key, kind, event.line(), where)

    def error(self, event: _Event, expected: str) -> TranscriptFormatError:
        return self.src.error(event.line(), expected)

    def event(self, event: _Event, position: int) -> None:
        if "kind" in event.data:
            self.v1(event)
        elif "action" in event.data:
            self.action(event, position)
        elif "observation" in event.data:
            self.observation(event)
        else:
            raise self.error(event, "an OpenHands event with 'action', 'observation' or 'kind'")

    # --- V0 -----------------------------------------------------------------------------

    def action(self, event: _Event, position: int) -> None:
        data = event.data
        kind = self.need(event, data, "action", str, "an action event")
        args = data.get("args")
        if args is None and self.legacy:
            args = data  # the 2024 layout keeps the arguments on the event itself
        if not isinstance(args, dict):
            raise self.error(event, "an action event with 'args' as an object")
        source = data.get("source")
        tcm = data.get("tool_call_metadata")
        tcm = tcm if isinstance(tcm, dict) else None
        stamp = _stamp({}, data)
        if kind in _NOT_CALLS or (tcm is None and _hidden(data, args)):
            return
        if kind == "system":
            self.flush()
            if isinstance(args.get("content"), str):
                self.system.append(args["content"])
            if args.get("tools") is not None:
                self.tools = args["tools"]
            return
        if kind == "condensation":
            forgotten = {k: v for k, v in args.items() if k.startswith("forgotten")}
            self.compaction(
                args.get("summary"), {**forgotten, "summary_offset": args.get("summary_offset")}
            )
            return
        if kind == "message" and tcm is None:
            if source is None:  # legacy: the task comes first, the agent speaks after acting
                source = "agent" if self.acted else "user"
            self.message(event, args, source, stamp)
            return
        if source in ("user", "environment") and tcm is None:
            command = args.get("command")
            if source == "user" and kind == "run" and isinstance(command, str):
                text = f"User executed the command:\n{command}"
                extra = {"source": "user_command", **stamp}
                self.emit(UserMessage((TextBlock(text),), freeze(extra)))
            return
        self.call(event, kind, args, tcm, position, stamp)

    def message(
        self, event: _Event, args: dict[str, Any], source: object, stamp: dict[str, Any]
    ) -> None:
        content = args.get("content")
        if not isinstance(content, str):
            raise self.error(event, "a message action with 'content' as a string")
        blocks: list[UserContent] = [TextBlock(content)] if content else []
        urls = args.get("image_urls", args.get("images_urls"))
        if isinstance(urls, list):
            blocks += [image_block(url) for url in urls if isinstance(url, str) and url]
        if source == "agent":
            text = tuple(b for b in blocks if isinstance(b, TextBlock))
            self.emit(AssistantMessage(text, "stop", None, None, freeze(stamp)))
        else:
            self.emit(UserMessage(tuple(blocks), freeze(stamp)))

    def call(
        self,
        event: _Event,
        kind: str,
        args: dict[str, Any],
        tcm: dict[str, Any] | None,
        position: int,
        stamp: dict[str, Any],
    ) -> None:
        data = event.data
        event_id = data.get("id")
        response_data = tcm.get("model_response") if tcm is not None else None
        response_data = response_data if isinstance(response_data, dict) else {}
        response_id = response_data.get("id")
        # Actions without a recorded response are each their own model turn.
        response = self.open(response_id if isinstance(response_id, str) else object())
        message = _first_message(response_data)
        if not response.blocks and not response.calls:
            response.extra.update(stamp)
            if isinstance(response_id, str):
                response.extra["response_id"] = response_id
            response.usage = _usage(response_data.get("usage"))
            model = response_data.get("model")
            response.model = model if isinstance(model, str) else None
            reason = _first_choice(response_data).get("finish_reason")
            if isinstance(reason, str):
                response.stop_reason = _STOP_REASONS.get(reason, reason)
        thought = args.get("thought")
        response.add_text(thought if isinstance(thought, str) else message.get("content"))
        original: object = tcm.get("tool_call_id") if tcm is not None else None
        if not isinstance(original, str):
            own = event_id if event_id is not None else position
            original = f"oh-{own}"
        name = tcm.get("function_name") if tcm is not None else None
        name = name if isinstance(name, str) else kind
        sent = _sent_call(message, original)
        if sent is not None:
            function = sent.get("function")
            raw = function.get("arguments") if isinstance(function, dict) else None
            arguments, extra = parse_arguments(raw)
        else:
            arguments = {k: v for k, v in args.items() if k not in _NOT_ARGUMENTS}
            extra = {}
        self.add_call(response, original, name, arguments, extra, event_id)

    def observation(self, event: _Event) -> None:
        data = event.data
        kind = self.need(event, data, "observation", str, "an observation event")
        extras = data.get("extras")
        extras = extras if isinstance(extras, dict) else {}
        tcm = data.get("tool_call_metadata")
        tcm = tcm if isinstance(tcm, dict) else None
        if kind in _SKIPPED_OBSERVATIONS or (tcm is None and _hidden(data, extras)):
            return
        content = data.get("content", "")
        if not isinstance(content, str):
            raise self.error(event, "an observation with 'content' as a string")
        blocks: tuple[UserContent, ...] = (TextBlock(content),) if content else ()
        stamp = _stamp({}, data)
        if kind == "recall":
            if content:
                extra = {"source": "recall", "recall": extras, **stamp}
                self.emit(UserMessage(blocks, freeze(extra)))
            return
        if kind == "condense":
            self.emit(SummaryMessage(content, freeze({"source": "condense", **stamp})))
            return
        call_id = self.link(data, tcm)
        if call_id is None:
            self.emit(UserMessage(blocks, freeze({"source": kind, **stamp})))
            return
        extra = {"observation": kind, **stamp}
        metadata = extras.get("metadata")
        code = metadata.get("exit_code") if isinstance(metadata, dict) else None
        code = code if code is not None else extras.get("exit_code", data.get("exit_code"))
        if isinstance(code, int) and not isinstance(code, bool):
            extra["exit_code"] = code
        self.result(call_id, blocks, kind == "error", extra)

    def link(self, data: dict[str, Any], tcm: dict[str, Any] | None) -> str | None:
        """The id of the call an observation answers, or None when it answers none."""
        original = tcm.get("tool_call_id") if tcm is not None else None
        if isinstance(original, str):
            return self.ids.result(original)
        cause = data.get("cause")
        if cause is not None:
            return self.by_event.get(cause) if isinstance(cause, int | str) else None
        if self.legacy and self.last_call is not None:
            return self.last_call
        return None

    # --- V1 -----------------------------------------------------------------------------

    def v1(self, event: _Event) -> None:
        data = event.data
        kind = self.need(event, data, "kind", str, "a V1 event")
        stamp = _stamp({}, data)
        if kind == "ActionEvent":
            self.v1_action(event, stamp)
        elif kind in _V1_RESULTS:
            self.v1_result(event, kind, stamp)
        elif kind == "MessageEvent":
            self.v1_message(event, stamp)
        elif kind == "SystemPromptEvent":
            self.flush()
            parts = [data.get("system_prompt"), data.get("dynamic_context")]
            text = text_of(_v1_blocks([p for p in parts if isinstance(p, dict)]))
            if text:
                self.system.append(text)
            if data.get("tools") is not None:
                self.tools = data["tools"]
        elif kind == "Condensation":
            forgotten = data.get("forgotten_event_ids")
            self.compaction(
                data.get("summary"),
                {"forgotten_event_ids": forgotten, "summary_offset": data.get("summary_offset")},
            )
        elif kind == "CondensationSummaryEvent":
            summary = self.need(event, data, "summary", str, "a CondensationSummaryEvent")
            self.emit(SummaryMessage(summary, freeze(stamp)))
        elif kind == "ConversationStateUpdateEvent" and data.get("key") == "stats":
            self.stats = data.get("value")
        # Other kinds (state updates, pauses, token streams, ...) never reach the model.

    def v1_action(self, event: _Event, stamp: dict[str, Any]) -> None:
        data = event.data
        call = self.need(event, data, "tool_call", dict, "an ActionEvent")
        original = self.need(event, call, "id", str, "an ActionEvent's tool_call")
        name = self.need(event, call, "name", str, "an ActionEvent's tool_call")
        response_id = data.get("llm_response_id")
        response = self.open(response_id if isinstance(response_id, str) else object())
        if not response.blocks and not response.calls:
            response.extra.update(stamp)
            if isinstance(response_id, str):
                response.extra["response_id"] = response_id
        if not response.calls:  # reasoning comes once per response, before its calls
            response.blocks.extend(_v1_reasoning(data))
        thought = data.get("thought")
        if isinstance(thought, list):
            for block in _v1_blocks(thought):
                if isinstance(block, TextBlock):
                    response.add_text(block.text)
        arguments, extra = parse_arguments(call.get("arguments"))
        self.add_call(response, original, name, arguments, extra, data.get("id"))

    def v1_result(self, event: _Event, kind: str, stamp: dict[str, Any]) -> None:
        data = event.data
        original = self.need(event, data, "tool_call_id", str, f"an {kind}")
        is_error = kind != "ObservationEvent"
        if kind == "AgentErrorEvent":
            blocks: tuple[UserContent, ...] = (TextBlock(str(data.get("error", ""))),)
        elif kind == "UserRejectObservation":
            reason = data.get("rejection_reason", "User rejected the action")
            blocks = (TextBlock(f"Action rejected: {reason}"),)
        else:
            observation = self.need(event, data, "observation", dict, "an ObservationEvent")
            content = observation.get("content")
            if isinstance(content, str):
                content = [{"type": "text", "text": content}]
            if not isinstance(content, list):
                raise self.error(event, "an observation with 'content' as a list of blocks")
            extended = data.get("extended_content")
            more = extended if isinstance(extended, list) else []
            blocks = _v1_blocks([*content, *more])
            is_error = observation.get("is_error") is True
            code = observation.get("exit_code")
            if isinstance(code, int) and not isinstance(code, bool):
                stamp = {"exit_code": code, **stamp}
        self.result(self.ids.result(original), blocks, is_error, stamp, data.get("tool_name"))

    def v1_message(self, event: _Event, stamp: dict[str, Any]) -> None:
        data = event.data
        message = self.need(event, data, "llm_message", dict, "a MessageEvent")
        role = message.get("role")
        content = message.get("content", [])
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        if not isinstance(content, list):
            raise self.error(event, "a MessageEvent with 'content' as a list of blocks")
        extended = data.get("extended_content")
        blocks = _v1_blocks([*content, *(extended if isinstance(extended, list) else [])])
        if role == "assistant":
            reply: list[AssistantContent] = list(_v1_reasoning(message))
            reply += [b for b in blocks if isinstance(b, TextBlock) and b.text.strip()]
            self.emit(AssistantMessage(tuple(reply), "stop", None, None, freeze(stamp)))
        elif role == "system":
            self.system.append(text_of(blocks))
        else:
            self.emit(UserMessage(blocks, freeze(stamp)))


def _hidden(data: dict[str, Any], fields: dict[str, Any]) -> bool:
    return data.get("hidden") is True or fields.get("hidden") is True


def _stamp(extra: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    ms = iso_to_ms(data.get("timestamp"))
    if ms is not None:
        extra["timestamp"] = ms
    return extra


def _first_choice(response: dict[str, Any]) -> dict[str, Any]:
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return {}


def _first_message(response: dict[str, Any]) -> dict[str, Any]:
    message = _first_choice(response).get("message")
    return message if isinstance(message, dict) else {}


def _sent_call(message: dict[str, Any], call_id: str) -> dict[str, Any] | None:
    """The tool call with ``call_id`` as the model sent it in its recorded response."""
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        if isinstance(call, dict) and call.get("id") == call_id:
            return call
    return None


def _usage(usage: object) -> Usage | None:
    """LiteLLM usage, made Anthropic-style: ``input_tokens`` excludes cache reads and writes."""
    if not isinstance(usage, dict):
        return None
    prompt = as_int(usage.get("prompt_tokens"))
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    read_raw = usage.get("cache_read_input_tokens")
    read = as_int(read_raw if read_raw is not None else cached)
    write = as_int(usage.get("cache_creation_input_tokens"))
    uncached = prompt - read - write
    # LiteLLM counts cache reads and writes into prompt_tokens; should a version not have,
    # the prompt count is the uncached part.
    return Usage(
        uncached if uncached >= 0 else prompt, as_int(usage.get("completion_tokens")), read, write
    )


def _v1_blocks(content: list[Any]) -> tuple[UserContent, ...]:
    """V1 content (``text`` / ``image`` blocks, Chat Completions blocks) as neutral blocks."""
    blocks: list[UserContent] = []
    for block in content:
        if not isinstance(block, dict):
            blocks.append(OpaqueBlock("openhands", {"value": block}))
        elif block.get("type") == "image" and isinstance(block.get("image_urls"), list):
            blocks += [image_block(u) for u in block["image_urls"] if isinstance(u, str)]
        elif block.get("type") == "text" and isinstance(block.get("text"), str):
            # cache_prompt is OpenHands' own caching flag, not content.
            if block["text"]:
                blocks.append(TextBlock(block["text"]))
        else:
            converted = openai_block(block)
            blocks.append(
                OpaqueBlock("openhands", block) if isinstance(converted, OpaqueBlock) else converted
            )
    return tuple(blocks)


def _v1_reasoning(data: dict[str, Any]) -> list[AssistantContent]:
    """Thinking the provider returned: Anthropic blocks, else reasoning text; OpenAI items."""
    blocks = thinking_blocks(data.get("thinking_blocks"))
    reasoning = data.get("reasoning_content")
    if not blocks and isinstance(reasoning, str) and reasoning.strip():
        blocks.append(ThinkingBlock(reasoning))
    item = data.get("responses_reasoning_item")
    if isinstance(item, dict):
        blocks.append(OpaqueBlock("openai", item))
    return blocks
