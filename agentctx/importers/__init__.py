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
"""

from __future__ import annotations

import json
import os
from typing import Any

from agentctx.errors import UnsupportedMessageError
from agentctx.importers import claude_code, openhands, pi, swe_agent
from agentctx.importers._common import RecordedCompaction, Source, Transcript
from agentctx.messages import from_dict

__all__ = ["RecordedCompaction", "Transcript", "detect_format", "load_transcript"]

_PI_TYPES = frozenset(
    {
        "session",
        "message",
        "model_change",
        "thinking_level_change",
        "compaction",
        "branch_summary",
        "custom",
        "custom_message",
        "label",
        "session_info",
    }
)
_CLAUDE_CODE_TYPES = frozenset(
    {
        "user",
        "assistant",
        "system",
        "progress",
        "summary",
        "file-history-snapshot",
        "queue-operation",
    }
)
_EXPECTED = (
    "a pi or Claude Code JSONL transcript, a SWE-agent trajectory, OpenHands events, "
    "or a JSON list of agentctx messages"
)


def load_transcript(path: str | os.PathLike[str]) -> Transcript:
    """Read a transcript file of any supported format, detected from its content."""
    fmt = detect_format(path)
    if fmt == "pi":
        return pi.load(path)
    if fmt == "claude-code":
        return claude_code.load(path)
    if fmt == "swe-agent":
        return swe_agent.load(path)
    if fmt == "openhands":
        return openhands.load(path)
    return _load_neutral(Source(os.fspath(path)))


def detect_format(path: str | os.PathLike[str]) -> str:
    """``"pi"``, ``"claude-code"``, ``"swe-agent"``, ``"openhands"`` or ``"neutral"``.

    Raises `TranscriptFormatError` when the content is none of them.
    """
    src = Source(os.fspath(path))
    text = _text(src)
    for number, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except json.JSONDecodeError:
            return _whole_file_format(src, text)
        if isinstance(record, list):
            return _whole_file_format(src, text)
        if not isinstance(record, dict):
            raise src.error(number, f"{_EXPECTED}, not a JSON {type(record).__name__}")
        kind = record.get("type")
        if kind in _PI_TYPES:
            return "pi"
        if kind in _CLAUDE_CODE_TYPES or "sessionId" in record or "parentUuid" in record:
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
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise src.error(e.lineno, f"{_EXPECTED} ({e.msg})") from None
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
    if isinstance(record.get("kind"), str) and "source" in record:  # a V1 SDK event
        return "openhands"
    if _is_openhands_event(record) and ("source" in record or "cause" in record):
        return "openhands"  # a V0 event on a line of its own
    return None


def _is_openhands_event(item: object) -> bool:
    return isinstance(item, dict) and ("action" in item or "observation" in item)


def _load_neutral(src: Source) -> Transcript:
    value: list[dict[str, Any]] = json.loads(_text(src))
    messages = []
    for i, item in enumerate(value):
        try:
            messages.append(from_dict(item))
        except (UnsupportedMessageError, TypeError, ValueError) as e:
            raise src.error(0, f"message {i} in agentctx's form ({e})") from None
    return Transcript(src.path, "neutral", tuple(messages))
