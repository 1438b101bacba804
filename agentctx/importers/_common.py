"""What every importer shares: the `Transcript` result, bounded file reading, JSON parsing that
names the line of any problem, and strict field access."""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, AnyStr, TypeVar

from agentctx._check import preview
from agentctx.errors import ConfigError, TranscriptFormatError

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

    from agentctx.messages import JSONMap, Message

__all__ = [
    "MAX_TRANSCRIPT_BYTES",
    "Line",
    "RecordedCompaction",
    "Source",
    "Transcript",
    "as_int",
    "freeze",
    "iso_to_ms",
    "nesting_line",
]

MAX_TRANSCRIPT_BYTES = 256 * 1024 * 1024
"""The largest transcript file the importers read (256 MiB); a larger one raises
`TranscriptFormatError` before it is read. Every loader takes ``max_bytes=`` to change it."""

MAX_RECORDS = 1_000_000
"""The most records a transcript may hold (a JSONL file's lines, or the events of the
histories in them; a JSON file's, `records_in`): a file of tiny records (``{}`` lines) takes
some 70 times its size in memory, where real sessions take about 10."""

TOO_DEEP = "JSON nested less deeply (this is too deep for Python's JSON parser)"

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


# The record types that tell the JSONL formats apart (`detect_format`), and that a loader of
# one refuses in a file of the other: two sessions in one file, one of them read as nothing.
PI_TYPES = frozenset(
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
CLAUDE_CODE_TYPES = frozenset(
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


@dataclass(frozen=True, slots=True)
class Transcript:
    """A transcript file read into neutral messages.

    ``messages`` is the full raw history in conversation order; compactions the agent did are
    listed in ``compactions`` and not applied. ``format`` is ``"pi"``, ``"claude-code"``,
    ``"swe-agent"``, ``"openhands"``, ``"neutral"`` (a JSON list of agentctx's messages),
    ``"anthropic"`` or ``"openai-chat"`` (a JSON list of a request's messages as the provider
    takes them).

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
    """A transcript file being parsed: reads it and builds errors that name file and line.

    Only regular files are read (a FIFO would block forever, ``/dev/zero`` never ends) and at
    most ``max_bytes`` of them; anything else raises `TranscriptFormatError` before reading.
    A missing or unreadable file raises the `OSError` that says so.
    """

    def __init__(self, path: str, max_bytes: int = MAX_TRANSCRIPT_BYTES) -> None:
        if type(max_bytes) is not int or not 0 <= max_bytes < sys.maxsize:
            raise ConfigError(
                f"max_bytes must be a whole number of bytes, got {preview(max_bytes)}"
            )
        if "\0" in path:  # which the system refuses with a ValueError, not an OSError
            raise FileNotFoundError(errno.ENOENT, "no such file: the path holds a NUL", path)
        self.path = path
        self.max_bytes = max_bytes

    def error(self, line: int, expected: str) -> TranscriptFormatError:
        return TranscriptFormatError(self.path, line, expected)

    def read_bytes(self) -> bytes:
        self._check(os.stat(self.path))  # follows symlinks: a link to /dev/zero is a device
        # Non-blocking, so that a file swapped for a FIFO after the check cannot hang the
        # open; fstat then checks what was actually opened.
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
        fd = os.open(self.path, flags)
        with os.fdopen(fd, "rb") as f:
            self._check(os.fstat(fd))
            data = f.read(self.max_bytes + 1)
        if len(data) > self.max_bytes:
            raise self._too_big(len(data))
        return data

    def _check(self, info: os.stat_result) -> None:
        if not stat.S_ISREG(info.st_mode):
            raise self.error(0, f"a regular file, not {_file_kind(info.st_mode)}")
        if info.st_size > self.max_bytes:
            raise self._too_big(info.st_size)

    def _too_big(self, size: int) -> TranscriptFormatError:
        return self.error(
            0,
            f"a file of at most {self.max_bytes} bytes (max_bytes), not one of "
            f"{'over ' if size == self.max_bytes + 1 else ''}{size} bytes",
        )

    def loads(self, text: str | bytes, line: int, expected: str) -> Any:
        """``text`` parsed as JSON; bad JSON, too deep nesting or a number Python will not
        convert raises `TranscriptFormatError` at ``line`` (0: the line is found in ``text``)."""
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise self.error(line or e.lineno, f"{expected} ({e.msg})") from None
        except RecursionError:
            where = line or nesting_line(text if isinstance(text, str) else "")
            raise self.error(where, TOO_DEEP) from None
        except ValueError as e:  # an integer of more than 4300 digits
            raise self.error(line, f"{expected} ({e})") from None

    def read_jsonl(self) -> list[Line]:
        """Every non-blank line as a JSON object; raises on bad JSON, an empty file or one of
        more than `MAX_RECORDS` records."""
        lines: list[Line] = []
        held = 0  # records: the lines, and the lists of records a line holds (a history)
        for number, raw in enumerate(each_line(self.read_bytes()), start=1):
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise self.error(number, "UTF-8 text") from None
            value = self.loads(text, number, "one JSON object per line")
            if not isinstance(value, dict):
                raise self.error(number, f"a JSON object, not {type(value).__name__}")
            lines.append(Line(number, value))
            held += max(1, records_in(value))
            if held > MAX_RECORDS:
                raise self.error(number, f"a transcript of at most {MAX_RECORDS} records")
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


def each_line(data: AnyStr) -> Iterator[AnyStr]:
    """The lines of ``data``, split at ``\\n``, one at a time (a list of them all would take
    more memory than the file for a file of short lines)."""
    newline = "\n" if isinstance(data, str) else b"\n"
    start = 0
    while (end := data.find(newline, start)) >= 0:
        yield data[start:end]
        start = end + 1
    yield data[start:]


def _file_kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "a special file")


# A string runs to its closing quote, or to the end of the text when it has none: matched
# again from every quote inside it, an unterminated one cost time quadratic in its length.
_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\(?:.|\Z)[^"\\]*)*(?:"|\Z)|[\[\]{}]', re.DOTALL)


def nesting_line(text: str) -> int:
    """The 1-based line of ``text`` where its JSON nesting is deepest (1 when unknown)."""
    depth = deepest = 0
    at = 0
    for token in _JSON_TOKEN.finditer(text):
        mark = token.group()
        if mark in ("[", "{"):
            depth += 1
            if depth > deepest:
                deepest, at = depth, token.start()
        elif mark in ("]", "}"):
            depth -= 1
    return text.count("\n", 0, at) + 1


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
    """A token count from JSON; absent or malformed counts are 0 (aborted turns report none).

    Malformed: not a number, a bool, negative, infinite or NaN.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    if isinstance(value, float) and not math.isfinite(value):
        return 0
    return max(0, int(value))


def records_in(value: object) -> int:
    """The records a JSON value holds: a list's elements (those of a list in it instead of
    it: a history of pairs), or, for an object, those of its longest such list (a
    trajectory beside the history it mirrors is not more records)."""
    if isinstance(value, dict):
        return max((records_in(v) for v in value.values() if isinstance(v, list)), default=0)
    if not isinstance(value, list):
        return 0
    return sum(len(x) if isinstance(x, list) else 1 for x in value)


def is_openhands_event(data: Mapping[str, Any]) -> bool:
    """Whether a JSON object on a line of its own is an OpenHands event: a V1 SDK event
    (``kind`` and ``source``) or a V0 one (``action`` or ``observation``, with ``source`` or
    ``cause``)."""
    if isinstance(data.get("kind"), str) and "source" in data:
        return True
    return ("action" in data or "observation" in data) and ("source" in data or "cause" in data)


def refuse_other_format(src: Source, lines: list[Line], own: str) -> None:
    """Raise `TranscriptFormatError` at the first record of another JSONL format: pi entries
    in a Claude Code file, or the reverse, or OpenHands events in either (one loader would
    skip them as records of types it does not read, a conversation read as nothing)."""
    other = CLAUDE_CODE_TYPES - PI_TYPES if own == "pi" else PI_TYPES - CLAUDE_CODE_TYPES
    for line in lines:
        data = line.data
        kind = data.get("type")  # one that is no string is the reader's to report
        if (isinstance(kind, str) and kind in other) or (own == "pi" and "parentUuid" in data):
            theirs = "a Claude Code record" if own == "pi" else "a pi entry"
        elif kind is None and is_openhands_event(data):
            theirs = "an OpenHands event"
        else:
            continue
        raise src.error(line.number, f"a {own} record, not {theirs} (two formats in one file)")
