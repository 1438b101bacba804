"""Read agent transcripts from disk into neutral messages.

```python
from agentctx.importers import load_transcript

transcript = load_transcript("session.jsonl")  # the format is found from the content
print(transcript.format, len(transcript.messages), transcript.compactions)
```

`load_transcript` recognises pi sessions, Claude Code sessions, SWE-agent trajectories
(``.traj``), OpenHands event lists, evaluation outputs and V1 event logs, and a JSON list of
messages in agentctx's own form (`agentctx.messages.to_dict`). Anything else, and any line that
is not what its format needs, raises `TranscriptFormatError` with the file and line. To choose
the format yourself, or options such as Claude Code's ``thread`` or the ``instance`` of an
OpenHands evaluation output, call the format's module: `agentctx.importers.pi.load`,
`claude_code.load`, `swe_agent.load`, `openhands.load` / `openhands.load_instances`.

Every loader reads only regular files (a FIFO, a device or a directory is refused before it is
opened) of at most ``max_bytes`` (`MAX_TRANSCRIPT_BYTES`, 256 MiB, by default); JSON nested too
deeply for Python's parser and fields of the wrong type raise `TranscriptFormatError` too.
"""

from __future__ import annotations

import json
import os
from typing import Any

from agentctx._check import preview
from agentctx.errors import UnsupportedMessageError
from agentctx.importers import claude_code, openhands, pi, swe_agent
from agentctx.importers._common import (
    CLAUDE_CODE_TYPES,
    MAX_TRANSCRIPT_BYTES,
    PI_TYPES,
    TOO_DEEP,
    RecordedCompaction,
    Source,
    Transcript,
    each_line,
    is_openhands_event,
)
from agentctx.importers.provider_lists import provider_form, read_provider_list
from agentctx.messages import from_dict

__all__ = [
    "MAX_TRANSCRIPT_BYTES",
    "RecordedCompaction",
    "Transcript",
    "detect_format",
    "load_transcript",
]

_EXPECTED = (
    "a pi or Claude Code JSONL transcript, a SWE-agent trajectory, OpenHands events, "
    "or a JSON list of agentctx messages"
)


def load_transcript(
    path: str | os.PathLike[str], *, max_bytes: int = MAX_TRANSCRIPT_BYTES
) -> Transcript:
    """Read a transcript file of any supported format, detected from its content.

    Raises `TranscriptFormatError` (file and line) for anything it cannot read as a
    transcript: not a regular file, over ``max_bytes``, not UTF-8, bad or too deeply nested
    JSON, a field of the wrong type; an `OSError` when the file cannot be opened; `ConfigError`
    for a ``max_bytes`` that is no whole number of bytes.
    """
    fmt = detect_format(path, max_bytes=max_bytes)
    if fmt == "pi":
        return pi.load(path, max_bytes=max_bytes)
    if fmt == "claude-code":
        return claude_code.load(path, max_bytes=max_bytes)
    if fmt == "swe-agent":
        return swe_agent.load(path, max_bytes=max_bytes)
    if fmt == "openhands":
        return openhands.load(path, max_bytes=max_bytes)
    return _load_neutral(Source(os.fspath(path), max_bytes))


def detect_format(path: str | os.PathLike[str], *, max_bytes: int = MAX_TRANSCRIPT_BYTES) -> str:
    """``"pi"``, ``"claude-code"``, ``"swe-agent"``, ``"openhands"`` or ``"neutral"`` (a JSON
    list of messages, in agentctx's form or a provider's: `load_transcript` tells which).

    Raises `TranscriptFormatError` when the content is none of them.
    """
    src = Source(os.fspath(path), max_bytes)
    text = _text(src)
    for number, raw in enumerate(each_line(text), start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except json.JSONDecodeError:
            return _whole_file_format(src, text)
        except RecursionError:
            raise src.error(number, TOO_DEEP) from None
        except ValueError as e:  # an integer of more than 4300 digits
            raise src.error(number, f"{_EXPECTED} ({e})") from None
        if isinstance(record, list):
            return _whole_file_format(src, text)
        if not isinstance(record, dict):
            raise src.error(number, f"{_EXPECTED}, not a JSON {type(record).__name__}")
        kind = record.get("type")
        if kind is not None and not isinstance(kind, str):
            raise src.error(number, f"a record with 'type' as a string (found {_kind(kind)})")
        if kind in PI_TYPES:
            return "pi"
        if kind in CLAUDE_CODE_TYPES or "sessionId" in record or "parentUuid" in record:
            return "claude-code"
        fmt = _object_format(record)
        if fmt is not None:
            return fmt
        # An unknown record type: a newer format revision may start with one, so look further.
    raise src.error(0, f"{_EXPECTED} (no record of a known type)")


def _text(src: Source) -> str:
    data = src.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise src.error(data.count(b"\n", 0, e.start) + 1, "UTF-8 text") from None
    if not text.strip():
        raise src.error(0, f"{_EXPECTED} (the file is empty)")
    return text


def _whole_file_format(src: Source, text: str) -> str:
    value = src.loads(text, 0, _EXPECTED)
    fmt = _object_format(value) if isinstance(value, dict) else None
    if fmt is not None:
        return fmt
    if not isinstance(value, list):
        found = "object" if isinstance(value, dict) else type(value).__name__
        raise src.error(0, f"{_EXPECTED}; found a single JSON {found}")
    if value and _is_openhands_event(value[0]):
        return "openhands"  # its loader names the line of any bad event after the first
    for i, item in enumerate(value):
        if not (isinstance(item, dict) and "role" in item):
            raise src.error(0, f"{_EXPECTED}; item {i} of the list is not an object with a role")
    return "neutral"


def _object_format(record: dict[str, Any]) -> str | None:
    """The format of a JSON object that is not a pi or Claude Code record, if it has one."""
    history = record.get("history")
    if isinstance(history, list):
        first = history[0] if history else None
        if "trajectory" in record or (isinstance(first, dict) and "role" in first):
            return "swe-agent"
        # Evaluation output: one task instance, its events in `history` (early: as pairs).
        if isinstance(first, list) or _is_openhands_event(first) or "instance_id" in record:
            return "openhands"
        return None
    return "openhands" if is_openhands_event(record) else None


def _is_openhands_event(item: object) -> bool:
    return isinstance(item, dict) and ("action" in item or "observation" in item)


def _load_neutral(src: Source) -> Transcript:
    doc = swe_agent.JsonDocument.parse(src, _text(src), _EXPECTED)
    value = doc.value
    if not isinstance(value, list):
        raise src.error(1, f"{_EXPECTED}, not a JSON {_kind(value)}")
    messages = []
    for i, item in enumerate(value):
        problem = _neutral_problem(item)
        if problem is None:
            try:
                messages.append(from_dict(item))
                continue
            except (UnsupportedMessageError, TypeError, ValueError) as e:
                problem = f"({e})"
        else:
            problem = f"with {problem}"
        # Not agentctx's own form: a request's messages as a provider takes them, if what
        # only a provider's form holds says so, and no message holds what only agentctx's
        # form does (else the error is the neutral form's: one message of the wrong shape
        # read the whole list as another form, its timestamps and usage dropped).
        form = None if any(map(_neutral_only, value)) else provider_form(value)
        if form is not None:
            return read_provider_list(doc, value, form)
        raise doc.error((i,), f"message {i} in agentctx's form {problem}")
    return Transcript(src.path, "neutral", tuple(messages))


_USAGE_KEYS = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "cache_write_1h_tokens",
)
_OPTIONAL_TEXT = {
    "message": ("stop_reason", "model", "tool_name", "tool_call_id", "text"),
    "block": ("signature", "source", "media_type", "data", "text", "thinking", "id", "name"),
}


def _neutral_only(item: object) -> bool:
    """Whether ``item`` holds what only a message in agentctx's form does (`to_dict`): an
    ``extra``, or the ``summary`` role. (A ``tool_name`` is no such mark: Chat clients of
    compatible servers write one.)"""
    return isinstance(item, dict) and ("extra" in item or item.get("role") == "summary")


def _neutral_problem(item: object) -> str | None:
    """What a known field of a message in agentctx's form holds that it must not, or None.

    `from_dict` checks what each role needs; these are the fields it takes as they come, which
    would otherwise carry a wrong type (usage ``"12"``) into token counts and prices.
    """
    if not isinstance(item, dict):
        return f"an object (found {_kind(item)})"
    for key in _OPTIONAL_TEXT["message"]:
        if item.get(key) is not None and not isinstance(item[key], str):
            return f"{key!r} as a string (found {_kind(item[key])})"
    if item.get("is_error") is not None and not isinstance(item["is_error"], bool):
        return f"'is_error' as true or false (found {_kind(item['is_error'])})"
    if item.get("extra") is not None and not isinstance(item["extra"], dict):
        return f"'extra' as an object (found {_kind(item['extra'])})"
    usage = item.get("usage")
    if usage is not None:
        if not isinstance(usage, dict):
            return f"'usage' as an object (found {_kind(usage)})"
        for key, count in usage.items():
            if key not in _USAGE_KEYS:
                return f"'usage' keys among {', '.join(_USAGE_KEYS)} (found {preview(key)})"
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                return f"'usage.{key}' as a whole number >= 0 (found {preview(count)})"
    content = item.get("content")
    for n, block in enumerate(content if isinstance(content, list) else ()):
        if not isinstance(block, dict):
            return f"content block {n} as an object (found {_kind(block)})"
        for key in _OPTIONAL_TEXT["block"]:
            if block.get(key) is not None and not isinstance(block[key], str):
                return f"content block {n} with {key!r} as a string (found {_kind(block[key])})"
        for key in ("extra", "arguments", "payload"):
            if block.get(key) is not None and not isinstance(block[key], dict):
                return f"content block {n} with {key!r} as an object (found {_kind(block[key])})"
    return None


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__
