"""What every importer shares: the `Transcript` result, JSONL reading and strict field access."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

from agentctx.errors import TranscriptFormatError

if TYPE_CHECKING:
    from agentctx.messages import JSONMap, Message

__all__ = ["Line", "RecordedCompaction", "Source", "Transcript", "as_int", "freeze", "iso_to_ms"]

_EMPTY: JSONMap = MappingProxyType({})
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RecordedCompaction:
    """A compaction the source agent itself did, as its transcript records it.

    ``index`` is where it happened: ``messages[:index]`` is the history the agent had when it
    compacted. ``first_kept_index`` is the first message the agent kept verbatim after its
    summary (``messages[first_kept_index:index]`` survived the cut; equal to ``index`` when
    nothing did; ``None`` when the transcript does not say). ``tokens_before`` is the context
    size the agent reported, when it did. ``extra`` holds format details (trigger, entry ids).
    """

    index: int
    summary: str
    tokens_before: int | None = None
    first_kept_index: int | None = None
    extra: JSONMap = field(default_factory=lambda: _EMPTY)


@dataclass(frozen=True, slots=True)
class Transcript:
    """A transcript file read into neutral messages.

    ``messages`` is the full raw history in conversation order; compactions the agent did are
    listed in ``compactions`` and not applied. ``format`` is ``"pi"``, ``"claude-code"``,
    ``"swe-agent"``, ``"openhands"`` or ``"neutral"``.

    Formats that record what the agent sent ahead of the conversation fill in ``system`` (the
    system prompt) and ``demonstrations`` (example exchanges placed before ``messages`` on every
    request, SWE-agent's ``is_demo`` messages); neither is part of ``messages``. ``extra`` holds
    file-level details (run statistics, instance id, tool schemas).
    """

    path: str
    format: str
    messages: tuple[Message, ...]
    compactions: tuple[RecordedCompaction, ...] = ()
    system: str | None = None
    demonstrations: tuple[Message, ...] = ()
    extra: JSONMap = field(default_factory=lambda: _EMPTY)


@dataclass(frozen=True, slots=True)
class Line:
    """One JSON object of a JSONL file and its 1-based line number."""

    number: int
    data: dict[str, Any]


class Source:
    """A transcript file being parsed: reads it and builds errors that name file and line."""

    def __init__(self, path: str) -> None:
        self.path = path

    def error(self, line: int, expected: str) -> TranscriptFormatError:
        return TranscriptFormatError(self.path, line, expected)

    def read_bytes(self) -> bytes:
        with open(self.path, "rb") as f:
            return f.read()

    def read_jsonl(self) -> list[Line]:
        """Every non-blank line as a JSON object; raises on bad JSON or an empty file."""
        lines: list[Line] = []
        for number, raw in enumerate(self.read_bytes().split(b"\n"), start=1):
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            if not raw.strip():
                continue
            try:
                value = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                raise self.error(number, "UTF-8 text") from None
            except json.JSONDecodeError as e:
                raise self.error(number, f"one JSON object per line ({e.msg})") from None
            if not isinstance(value, dict):
                raise self.error(number, f"a JSON object, not {type(value).__name__}")
            lines.append(Line(number, value))
        if not lines:
            raise self.error(0, "at least one record (the file is empty)")
        return lines

    def need(self, obj: dict[str, Any], key: str, kind: type[T], line: int, where: str) -> T:
        """``obj[key]``, which must be a ``kind``; otherwise a `TranscriptFormatError`."""
        value = obj.get(key)
        # bool is an int in Python, but never a valid count or id in these formats.
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            found = "missing" if value is None else type(value).__name__
            raise self.error(line, f"{where} with {key!r} as {_kind_name(kind)} ({found})")
        return value


def _kind_name(kind: type) -> str:
    return {str: "a string", dict: "an object", list: "a list", int: "an integer"}.get(
        kind, kind.__name__
    )


def freeze(extra: dict[str, Any]) -> JSONMap:
    """An ``extra`` mapping that cannot be changed behind the frozen message's back."""
    return MappingProxyType(extra) if extra else _EMPTY


def iso_to_ms(value: object) -> int | None:
    """Epoch milliseconds of an ISO-8601 timestamp such as ``2026-02-12T16:02:51.467Z``."""
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    if moment.tzinfo is None:  # these formats write UTC; never read a bare time as local
        moment = moment.replace(tzinfo=UTC)
    # Integer arithmetic on timedeltas: float seconds * 1000 can land one millisecond off.
    return (moment - _EPOCH) // _MS


def as_int(value: object) -> int:
    """A token count from JSON; absent or malformed counts are 0 (aborted turns report none)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    return int(value)
