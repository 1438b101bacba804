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
# classify looks at this many chars from each end. 2 KB classed 2 of tests/corpus's 260
# texts over 2 KB otherwise and took 1.4x as long on them; 1 KB, 6 (the class only picks
# the calibration slot: uncalibrated, every class counts alike).
_SAMPLE_EDGE = 1536

# Line kinds are found with a few passes over the sample with a newline put before it (no
# pattern crosses a newline) and identified by the offset of the newline that starts their
# line. Patterns for the start of a line begin with that newline rather than ^ (MULTILINE):
# Python's re jumps from one to the next instead of trying ^ at every character.
_SHELL_LINE_START = re.compile(
    r"\n(?:[-dlcbps][rwxsStT-]{9}[@+.]?[ \t]"  # ls -l
    r"|total \d+[ \t]*$"
    # A path (find, glob). Possessive: a segment giving back characters never lets a match
    # through (no segment takes a "/"), so the lines found are the same, and backtracking
    # through every split of a path cost a third of `classify` on a grep -n listing.
    r"|[ \t]*+(?:[\w.~@+-]*+/)++[\w.@+-]*+/?[ \t]*$"
    r"|[\w./-]+:\d+[:-])",  # grep -n
    re.MULTILINE,
)
# A run of spaces or a tab between non-spaces. Led by a literal, so `re` skips to each in C,
# and the non-space before it checked there too (after the literal: a pattern led by the
# lookbehind is tried at every character); a test of each match in Python, to skip
# indentation, cost half of `classify` on indented text.
_COLUMN_GAPS = (re.compile(r"  (?<=\S  ) *(?=\S)"), re.compile(r"\t(?<=\S\t)(?=\S)"))
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
    r"\n(?:(?:ok|not ok|PASS|FAIL)\b|={3,}|_{3,}"
    r"|[ \t\d\[\]:.-]*(?:info|warn|error|debug|verbose|silly|timing|notice)\b)",
    re.MULTILINE,
)
# Code lines: indented (not a list item) or led by a keyword, after any line number (cat -n,
# the Read tool), or ending in punctuation. Two passes: as one pattern, the line-end test
# would scan every line from its start.
_CODE_LINE_START = re.compile(
    r"\n(?:[ \t]*\d+(?:→|\t|: |\| ))?"
    r"(?:[ \t]+(?![-*•\s])"
    r"|(?:def |class |import |from \S+ import|function\b|const |let |var |return\b"
    r"|if\b[^\n]*[:{(]|for\b[^\n]*[:{(]|while\b|export |#include|#define|fn |pub |func "
    r"|package |public |private |static |async |await |@\w|[{}]|//|/\*|\*/|#!|elif |else\b"
    r"|try\b|except\b|switch\b|case\b))"
)
_CODE_LINE_ENDS = (";", "{", "}", "(", ")", ",", ":", "[", "]", "=>")  # before trailing blanks
_NONBLANK_LINE = re.compile(r"\n[ \t]*\S")
_SYMBOLS = b"{}();=<>[]"


def _sample(text: str) -> str:
    if len(text) <= 2 * _SAMPLE_EDGE:
        return text
    return text[:_SAMPLE_EDGE] + "\n" + text[-_SAMPLE_EDGE:]


def _lines_of(pattern: re.Pattern[str], lines: str) -> list[int]:
    """For each match, the line it is on (as the offset of the newline that starts it)."""
    # Most passes find nothing, and on short texts an iterator and a comprehension cost more
    # than the scan itself: one `search` (a C call) answers those first.
    if pattern.search(lines) is None:
        return []
    rfind = lines.rfind
    return [rfind("\n", 0, m.start()) for m in pattern.finditer(lines)]


def _line_starts(pattern: re.Pattern[str], lines: str) -> list[int]:
    """The lines where a pattern that begins with their newline matches."""
    if pattern.search(lines) is None:  # as in `_lines_of`
        return []
    return [m.start() for m in pattern.finditer(lines)]


def _code_line_ends(lines: str) -> list[int]:
    """The lines that end in punctuation code lines end with (past spaces and tabs). A loop
    over the lines: a pattern for the line end would be tried at every character."""
    found = []
    start = 0  # the offset of the newline that starts the line
    for line in lines[1:].split("\n"):
        if line.rstrip(" \t").endswith(_CODE_LINE_ENDS):
            found.append(start)
        start += len(line) + 1
    return found


def _table_rows(lines: str) -> set[int]:
    """Lines of three or more columns (separated by runs of spaces or a tab)."""
    if "  " not in lines and "\t" not in lines:
        return set()  # no gap at all (prose, one-line texts): no pattern pass
    rfind = lines.rfind
    gaps = Counter([rfind("\n", 0, m.start()) for p in _COLUMN_GAPS for m in p.finditer(lines)])
    rows = set()
    for line, k in gaps.items():
        end = lines.find("\n", line + 1)
        if k >= 2 and _TABLE_ROW.search(lines, line + 1, end if end >= 0 else len(lines)):
            rows.add(line)
    return rows


# The first character after a JSON text's opening bracket (past whitespace): anything else
# fails `json.loads` at once. Markers and condensed lines start with "[" and a word, and the
# exception costs more than the rest of the test on them.
_JSON_OPENING = re.compile(r"[ \t\n\r]*([\[{])[ \t\n\r]*(.)", re.DOTALL)
_JSON_NEXT = {"[": frozenset('{["]-0123456789tfnNI'), "{": frozenset('"}')}


def _looks_like_json(sample: str, whole: str) -> bool:
    head = sample.lstrip()[:1]
    if head not in ("{", "["):
        return False
    opening = _JSON_OPENING.match(whole)
    may_parse = opening is None or opening[2] in _JSON_NEXT[opening[1]]
    if may_parse and len(whole) <= 65536:
        try:
            # Cheap at this size, and exact: compact tool arguments have too few quotes per
            # char (an escaped file body) for the density test below.
            return isinstance(json.loads(whole), (dict, list))
        except (ValueError, RecursionError):
            pass
    n = len(sample)
    return sample.count('"') * 50 >= n and (sample.count('":') + sample.count('" :')) * 200 >= n


def classify(text: str) -> ContentClass:
    """The content class of ``text``, from its first and last 1.5 KB (cost bounded by size).

    json: an object or array that parses (texts up to 64 KB) or, beyond that, whose sample is
    dense in quotes and ``":``. shell: most lines are ``ls -l`` rows, paths, ``grep -n`` hits
    or column tables. log: timestamps, levels, test outcomes. code: indentation, keywords and
    line-final punctuation plus symbol density. Anything else is prose.
    """
    sample = _sample(text)
    if _looks_like_json(sample, text):
        return ContentClass.JSON
    lines = "\n" + sample
    n = len(_NONBLANK_LINE.findall(lines))
    if not n:
        return ContentClass.PROSE
    shell = len(_table_rows(lines).union(_line_starts(_SHELL_LINE_START, lines)))
    log_lines = set(_line_starts(_LOG_LINE_START, lines))
    for pattern in _LOG_ANYWHERE:
        log_lines.update(_lines_of(pattern, lines))
    log = len(log_lines)
    # Each class has its own threshold (share of lines); the one furthest above it wins.
    scores: list[tuple[float, ContentClass]] = []
    if shell >= 0.5 * n:
        scores.append((shell / (0.5 * n), ContentClass.SHELL))
    if log >= 0.3 * n:
        scores.append((log / (0.3 * n), ContentClass.LOG))
    encoded = sample.encode("utf-8", "surrogatepass")
    symbols = (len(encoded) - len(encoded.translate(None, _SYMBOLS))) / len(sample)
    if symbols >= 0.02:
        code = len(set(_line_starts(_CODE_LINE_START, lines)).union(_code_line_ends(lines)))
        if code >= 0.5 * n:
            scores.append((code / (0.5 * n), ContentClass.CODE))
    return max(scores)[1] if scores else ContentClass.PROSE
