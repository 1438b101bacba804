"""What a text mostly is: code, JSON, shell output, prose or log (`classify`)."""

from __future__ import annotations

import json
import re
from collections import Counter
from enum import StrEnum

__all__ = ["ContentClass", "classify"]


class ContentClass(StrEnum):
    """What a text mostly is; selects the calibration slot its tokens are attributed to."""

    CODE = "code"
    JSON = "json"
    SHELL = "shell"
    PROSE = "prose"
    LOG = "log"


CLASS_ORDER = tuple(ContentClass)  # slot order of the estimator's class slots
_SAMPLE_EDGE = 2048  # classify looks at this many chars from each end

# Line kinds are found with a few passes over the whole sample (MULTILINE; no pattern
# crosses a newline) and identified by the offset of the newline before the match.
_SHELL_LINE_START = re.compile(
    r"^(?:[-dlcbps][rwxsStT-]{9}[@+.]?[ \t]"  # ls -l
    r"|total \d+[ \t]*$"
    r"|[ \t]*(?:[\w.~@+-]*/)+[\w.@+-]*/?[ \t]*$"  # a path (find, glob)
    r"|[\w./-]+:\d+[:-])",  # grep -n
    re.MULTILINE,
)
_COLUMN_GAPS = (re.compile(r"  +(?=\S)"), re.compile(r"\t(?=\S)"))  # after a non-space
_TABLE_ROW = re.compile(r"\S(?: {2,}|\t)\S.*?\S(?: {2,}|\t)\S")  # 3+ columns
# Python's re only skips ahead fast for patterns that start with a literal, so these are
# separate passes, each led by one.
_LOG_ANYWHERE = (
    re.compile(r"-\d\d-\d\d[T ]\d\d:\d\d"),  # ISO date and time
    re.compile(r":\d\d:\d\d"),  # hh:mm:ss
    re.compile(r"\[\s*\d+%\]"),  # pytest progress
    re.compile(
        r"(?:DEBUG|INFO|NOTICE|WARN(?:ING)?|ERROR|CRITICAL|FATAL|TRACE|PASSED|FAILED|SKIPPED"
        r"|XFAIL|XPASS)\b"
    ),
)
_LOG_LINE_START = re.compile(
    r"^(?:(?:ok|not ok|PASS|FAIL)\b|={3,}|_{3,}"
    r"|[ \t\d\[\]:.-]*(?:info|warn|error|debug|verbose|silly|timing|notice)\b)",
    re.MULTILINE,
)
_CODE_LINES = re.compile(
    r"^(?:[ \t]*\d+(?:→|\t|: |\| ))?"  # cat -n / Read-tool line numbers
    r"(?:[ \t]+(?![-*•\s])"  # indented, but not a list item
    r"|(?:def |class |import |from \S+ import|function\b|const |let |var |return\b"
    r"|if\b[^\n]*[:{(]|for\b[^\n]*[:{(]|while\b|export |#include|#define|fn |pub |func "
    r"|package |public |private |static |async |await |@\w|[{}]|//|/\*|\*/|#!|elif |else\b"
    r"|try\b|except\b|switch\b|case\b)"
    r"|[^\n]*(?:[;{}(),:\[\]]|=>)[ \t]*$)",
    re.MULTILINE,
)
_NONBLANK_LINE = re.compile(r"^[ \t]*\S", re.MULTILINE)


def _sample(text: str) -> str:
    if len(text) <= 2 * _SAMPLE_EDGE:
        return text
    return text[:_SAMPLE_EDGE] + "\n" + text[-_SAMPLE_EDGE:]


def _lines_of(pattern: re.Pattern[str], sample: str) -> list[int]:
    """For each match, the line it is on (as the offset of the preceding newline)."""
    rfind = sample.rfind
    return [rfind("\n", 0, m.start()) for m in pattern.finditer(sample)]


def _table_rows(sample: str) -> set[int]:
    """Lines of three or more columns (separated by runs of spaces or a tab)."""
    gaps: Counter[int] = Counter()
    for pattern in _COLUMN_GAPS:
        for m in pattern.finditer(sample):
            i = m.start()
            if i and not sample[i - 1].isspace():  # spaces after a newline are indentation
                gaps[sample.rfind("\n", 0, i)] += 1
    rows = set()
    for line, k in gaps.items():
        end = sample.find("\n", line + 1)
        if k >= 2 and _TABLE_ROW.search(sample, line + 1, end if end >= 0 else len(sample)):
            rows.add(line)
    return rows


def _looks_like_json(sample: str, whole: str) -> bool:
    head = sample.lstrip()[:1]
    if head not in ("{", "["):
        return False
    if len(whole) <= 65536:
        try:
            # Cheap at this size, and exact: compact tool arguments have too few quotes per
            # char (an escaped file body) for the density test below.
            return isinstance(json.loads(whole), (dict, list))
        except (ValueError, RecursionError):
            pass
    n = len(sample)
    return sample.count('"') * 50 >= n and (sample.count('":') + sample.count('" :')) * 200 >= n


def classify(text: str) -> ContentClass:
    """The content class of ``text``, from its first and last 2 KB (cost bounded by size).

    json: an object or array that parses (texts up to 64 KB) or, beyond that, whose sample is
    dense in quotes and ``":``. shell: most lines are ``ls -l`` rows, paths, ``grep -n`` hits
    or column tables. log: timestamps, levels, test outcomes. code: indentation, keywords and
    line-final punctuation plus symbol density. Anything else is prose.
    """
    sample = _sample(text)
    if _looks_like_json(sample, text):
        return ContentClass.JSON
    n = len(_NONBLANK_LINE.findall(sample))
    if not n:
        return ContentClass.PROSE
    shell = len(_table_rows(sample).union(_lines_of(_SHELL_LINE_START, sample)))
    log_lines = set(_lines_of(_LOG_LINE_START, sample))
    for pattern in _LOG_ANYWHERE:
        log_lines.update(_lines_of(pattern, sample))
    log = len(log_lines)
    code = len(_CODE_LINES.findall(sample))
    symbols = sum(sample.count(c) for c in "{}();=<>[]") / len(sample)
    # Each class has its own threshold (share of lines); the one furthest above it wins.
    scores: list[tuple[float, ContentClass]] = []
    if shell >= 0.5 * n:
        scores.append((shell / (0.5 * n), ContentClass.SHELL))
    if log >= 0.3 * n:
        scores.append((log / (0.3 * n), ContentClass.LOG))
    if code >= 0.5 * n and symbols >= 0.02:
        scores.append((code / (0.5 * n), ContentClass.CODE))
    return max(scores)[1] if scores else ContentClass.PROSE
