"""Token accounting: a content-aware estimator and a calibrating, memoizing message counter.

```python
from agentctx.tokens import MessageCounter

counter = MessageCounter()                      # wraps Estimator(); no third-party imports
before = counter.estimate_prompt(view)          # before the first request: pure estimate
response = call_model(view)
counter.observe(view, response.usage.prompt_tokens)   # fit overhead + per-class multipliers
history = [*view, response_message, *tool_results]
size = counter.context_tokens(history)          # reported size + estimate of what came after
```

`Estimator` does not tokenize. It splits a bounded sample of the text with an ASCII copy of
the o200k pre-tokenizer and prices each piece from a small table (common short words cost one
token, rare long ones, escapes and punctuation runs more); non-ASCII characters are priced
separately. Uncalibrated it is within ~4 % (median) of o200k per text; `MessageCounter.observe`
then fits the provider's real tokenizer and the hidden system-prompt-plus-tools overhead.
For exact OpenAI counts use `agentctx.tokenizers.ExactCounter`.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections import Counter, deque
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from agentctx.errors import ConfigError
from agentctx.messages import (
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
    UserMessage,
    fingerprint,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

__all__ = [
    "ContentClass",
    "Estimator",
    "FeatureCounter",
    "MessageCounter",
    "TokenCounter",
    "classify",
    "image_tokens",
]


@runtime_checkable
class TokenCounter(Protocol):
    """Anything that counts the tokens of a text: `Estimator`, `ExactCounter`, your own."""

    def count(self, text: str) -> int:
        """Tokens of ``text``; 0 only for the empty string."""
        ...


@runtime_checkable
class FeatureCounter(TokenCounter, Protocol):
    """A counter whose estimate is ``sum(w * f for w, f in zip(weights, features(text)))``.

    `MessageCounter` calibrates such a counter per slot instead of with one global factor.
    """

    @property
    def slots(self) -> tuple[str, ...]:
        """Names of the feature slots."""
        ...

    @property
    def weights(self) -> tuple[float, ...]:
        """Tokens per feature unit, one per slot."""
        ...

    def features(self, text: str, kind: ContentClass | None = None) -> tuple[float, ...]:
        """Feature units of ``text`` per slot; ``kind`` skips classification."""
        ...


# ---------------------------------------------------------------------------------------
# Content classes


class ContentClass(StrEnum):
    """What a text mostly is; selects the calibration slot its tokens are attributed to."""

    CODE = "code"
    JSON = "json"
    SHELL = "shell"
    PROSE = "prose"
    LOG = "log"


_CLASSES = tuple(ContentClass)
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


# ---------------------------------------------------------------------------------------
# Estimator

# o200k's pre-tokenizer (tiktoken_ext/openai_public.py) with \p{Lu}/\p{Ll} narrowed to ASCII;
# on the corpus transcripts it splits ASCII text exactly like the real one.
_PRETOKEN = re.compile(
    r"(?:_|[^\r\n\w])?(?:[A-Z]*[a-z]+|[A-Z]+[a-z]*|[^\W\d_a-zA-Z]+)(?:'(?:s|t|re|ve|m|ll|d))?"
    r"|\d{1,3}| ?(?:_|[^\s\w])+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Mean o200k tokens of one pre-token, fitted on a corpus of local files (Python stdlib,
# JS/C sources, JSON pretty/minified/as tool arguments, docs and licences, ls/find/ps/dpkg
# output, dpkg/apt/npm/pytest logs), not on the transcripts the benchmark scores.
# Letter runs: key = `_word_shape` (prefix: n none, s whitespace, d one of ._([{<,
# b backslash, o other; case: l lower, x lower without vowels, C capitalized, M two capitals
# then lower, U upper); value = cost for 1..12 letters, then the extra cost per letter.
# Vowel-less and mixed-case runs are mostly random ids and hashes, which split finely.
_WORD_COST: dict[str, tuple[tuple[float, ...], float]] = {
    "nl": ((1.0, 1.0, 1.03, 1.03, 1.03, 1.11, 1.14, 1.24, 1.45, 1.45, 1.64, 2.2), 0.1),
    "nC": ((1.0, 1.14, 1.14, 1.14, 1.14, 1.14, 1.14, 1.14, 1.14, 1.49, 1.49, 1.49), 0.35),
    "nU": ((1.0, 1.03, 1.49, 1.55, 2.19, 2.19, 2.46, 3.08, 3.08, 3.58, 3.66, 4.55), 0.18),
    "nM": ((1.0, 1.0, 2.0, 2.42, 2.93, 3.29, 3.81, 4.33, 4.33, 4.35, 4.89, 5.03), 0.26),
    "nx": ((1.0, 1.0, 1.22, 1.22, 1.22, 1.68, 1.81, 2.1, 2.1, 5.55, 5.55, 5.55), 0.3),
    "sl": ((1.0, 1.0, 1.01, 1.01, 1.03, 1.07, 1.09, 1.14, 1.15, 1.21, 1.22, 1.34), 0.1),
    "sC": ((1.0, 1.0, 1.01, 1.02, 1.14, 1.14, 1.18, 1.28, 1.37, 1.6, 1.6, 1.6), 0.1),
    "sU": ((1.0, 1.01, 1.09, 1.21, 1.6, 1.6, 1.6, 1.73, 1.86, 1.87, 2.85, 2.85), 0.1),
    "sM": ((1.0, 1.0, 1.65, 1.68, 2.01, 2.42, 2.42, 2.42, 2.42, 2.42, 2.42, 2.42), 0.7),
    "sx": ((1.0, 1.0, 1.18, 1.59, 1.59, 1.96, 2.01, 2.19, 2.19, 2.19, 2.19, 2.19), 0.3),
    "dl": ((1.01, 1.04, 1.14, 1.14, 1.14, 1.23, 1.35, 1.48, 1.65, 2.07, 2.25, 2.32), 0.21),
    "dC": ((1.03, 1.78, 1.78, 1.78, 1.78, 1.78, 1.85, 1.85, 2.04, 2.04, 2.63, 2.64), 0.1),
    "dU": ((1.0, 1.25, 1.48, 1.55, 1.55, 1.63, 1.68, 1.91, 2.28, 2.7, 2.7, 3.17), 0.3),
    "dM": ((1.0, 1.0, 2.52, 3.49, 3.49, 3.49, 3.49, 3.49, 3.49, 3.49, 3.49, 3.49), 0.3),
    "dx": ((1.0, 1.0, 1.38, 1.38, 2.34, 2.63, 2.87, 2.87, 2.87, 2.87, 2.87, 2.87), 0.3),
    "bl": ((1.0, 1.36, 1.85, 2.02, 2.02, 2.16, 2.16, 2.17, 2.71, 2.71, 2.9, 2.96), 0.3),
    "ol": ((1.1, 1.54, 1.6, 1.6, 1.6, 1.69, 1.79, 2.0, 2.17, 2.34, 2.72, 2.73), 0.32),
    "oC": ((1.33, 1.93, 1.93, 1.93, 1.93, 1.93, 2.14, 2.26, 2.67, 2.81, 2.81, 2.81), 0.29),
    "oU": ((1.0, 1.85, 1.94, 2.58, 2.74, 2.74, 2.76, 2.97, 3.25, 3.84, 3.86, 3.86), 0.3),
    "oM": ((1.0, 1.0, 2.5, 3.02, 3.79, 3.95, 3.96, 4.99, 5.02, 5.56, 5.85, 5.85), 0.21),
    "ox": ((1.0, 1.0, 1.74, 2.56, 2.56, 2.86, 2.96, 2.96, 2.96, 2.96, 2.96, 2.96), 0.3),
}
# Punctuation runs by length 1..10 (then +0.5 per char), without / with trailing newlines.
_PUNCT_COST = (1.0, 1.01, 1.08, 1.53, 1.84, 2.69, 3.46, 3.79, 4.19, 4.94)
_PUNCT_NL_COST = (1.0, 1.01, 1.17, 1.52, 2.12, 2.42, 2.9, 3.15, 3.55, 3.74)

# Texts up to _SCAN_LIMIT chars are scanned whole; longer ones through _WINDOWS evenly spaced
# windows, extrapolated by length, so one 10 MB tool output costs the same as an 8 KB one
# (8 KB: the same accuracy on the corpus as 16 KB, benchmarks/token_accuracy.py).
_SCAN_LIMIT = 8192
_WINDOWS = 8
_WINDOW = _SCAN_LIMIT // _WINDOWS

# Exact o200k costs of the pieces of common `ls -l` modes ("drwxr-xr-x" is drwxr|-xr|-x),
# which the tables price far too low; mode strings fill a third of a listing.
_KNOWN_PIECES = {
    "drwxr": 3.0,
    "-xr": 2.0,
    "-rw": 2.0,
    "-rwxr": 3.0,
    "drwx": 2.0,
    "-rwx": 2.0,
    "drwxrwxr": 5.0,
    "lrwxrwxrwx": 6.0,
    "drwxrwxrwx": 6.0,
    "drwxrwxrwt": 6.0,
    "-rwxrwxrwx": 6.0,
    "srwxrwxrwx": 6.0,
    "crw": 2.0,
    "brw": 2.0,
}
_COST_MEMO: dict[str, float] = dict(_KNOWN_PIECES)
_COST_MEMO_MAX = 1 << 16  # pieces repeat heavily (" the", "\n", "();"); bounded anyway


_VOWELS = frozenset("aeiouy")


def _word_shape(p: str) -> tuple[str, int]:
    """(prefix kind + case, letters) of a letter pre-token, the key of `_WORD_COST`."""
    first = p[0]
    if first.isalpha():
        prefix, word = "n", p
    else:
        # A space or tab before a word usually merges into it; "." "_" "(" do so often in
        # code; a backslash (JSON escape) or other punctuation mostly becomes its own token.
        prefix = (
            "s" if first.isspace() else "b" if first == "\\" else "d" if first in "._([{<" else "o"
        )
        word = p[1:]
    word = word.split("'", 1)[0] or word
    if len(word) > 1 and word.isupper():
        case = "U"
    elif word[0].isupper():
        case = "M" if word[1:2].isupper() else "C"
    else:
        case = "x" if len(word) > 2 and not _VOWELS.intersection(word) else "l"
    return prefix + case, len(word)


def _piece_cost(p: str) -> float:
    """Estimated o200k tokens of one ASCII pre-token."""
    last = p[-1]
    if last.isalpha():  # a letter run, maybe with a prefix char and a contraction
        key, n = _word_shape(p)
        costs, per_letter = _WORD_COST.get(key) or _WORD_COST["o" + key[1]]
        return costs[n - 1] if n <= 12 else costs[11] + per_letter * (n - 12)
    if last.isdigit() or p.isspace():
        return 1.0  # digit groups are at most 3 long; whitespace runs are single tokens
    body = p[1:] if p[0] == " " else p
    core = body.rstrip("\r\n") or body
    n = len(core)
    if core.count(core[0]) == n:
        return 1.0 + max(0, n - 8) / 32  # "-----", "=====": rulers are single tokens
    costs = _PUNCT_NL_COST if n < len(body) else _PUNCT_COST
    return costs[n - 1] if n <= 10 else costs[9] + 0.5 * (n - 10)


def _scan(text: str) -> tuple[float, int]:
    """(ASCII token units, non-ASCII chars) of ``text``."""
    units = 0.0
    non_ascii = 0
    get = _COST_MEMO.get
    for p in _PRETOKEN.findall(text):
        cost = get(p)
        if cost is None:
            if p.isascii():
                cost = _piece_cost(p)
                if len(_COST_MEMO) < _COST_MEMO_MAX:
                    _COST_MEMO[p] = cost
            else:
                ascii_part = p.encode("ascii", "ignore")  # also drops lone surrogates
                non_ascii += len(p) - len(ascii_part)
                cost = 1.0 if ascii_part.strip() else 0.0
        units += cost
    return units, non_ascii


def _scan_bounded(text: str) -> tuple[float, float]:
    n = len(text)
    if n <= _SCAN_LIMIT:
        return _scan(text)
    units = 0.0
    non_ascii = 0
    step = (n - _WINDOW) / (_WINDOWS - 1)
    for i in range(_WINDOWS):
        start = int(i * step)
        u, na = _scan(text[start : start + _WINDOW])
        units += u
        non_ascii += na
    scale = n / (_WINDOWS * _WINDOW)
    return units * scale, non_ascii * scale


# Tokens per unit for each slot. Class slots: fitted on the same local corpus as the tables
# (class-specific bias of the piece costs). Non-ASCII: ~1 token per character (CJK is about
# 1, accents inside Latin words less, emoji more).
_DEFAULT_WEIGHTS = (0.985, 0.963, 1.007, 0.97, 0.991, 1.0)
_ESTIMATOR_SLOTS = (*(c.value for c in _CLASSES), "non_ascii")


@dataclass(frozen=True, slots=True)
class Estimator:
    """Estimates o200k-like token counts with no tokenizer and bounded work per text.

    ``Estimator().count(text)`` is deterministic and never 0 for a non-empty text.
    ``features(text)`` gives the per-slot units (one slot per `ContentClass`, then
    non-ASCII characters) and ``weights`` the tokens per unit; ``scaled(multipliers)`` is how
    calibration adjusts them.
    """

    weights: tuple[float, ...] = _DEFAULT_WEIGHTS

    def __post_init__(self) -> None:
        if len(self.weights) != len(_ESTIMATOR_SLOTS) or min(self.weights) <= 0:
            raise ConfigError(f"Estimator needs {len(_ESTIMATOR_SLOTS)} positive weights")

    @property
    def slots(self) -> tuple[str, ...]:
        """``("code", "json", "shell", "prose", "log", "non_ascii")``."""
        return _ESTIMATOR_SLOTS

    def features(self, text: str, kind: ContentClass | None = None) -> tuple[float, ...]:
        """Units per slot: the text's class slot holds its ASCII units, the last non-ASCII."""
        if not text:
            return (0.0,) * len(_ESTIMATOR_SLOTS)
        units, non_ascii = _scan_bounded(text)
        out = [0.0] * len(_ESTIMATOR_SLOTS)
        out[_CLASSES.index(kind or classify(text))] = units
        out[-1] = non_ascii
        return tuple(out)

    def count(self, text: str, kind: ContentClass | None = None) -> int:
        """Estimated tokens of ``text`` (``kind`` skips classification)."""
        if not text:
            return 0
        total = sum(w * f for w, f in zip(self.weights, self.features(text, kind), strict=True))
        return max(1, round(total))

    def scaled(self, multipliers: Sequence[float]) -> Estimator:
        """A copy with each slot's weight multiplied by the matching multiplier."""
        return Estimator(tuple(w * m for w, m in zip(self.weights, multipliers, strict=True)))


# ---------------------------------------------------------------------------------------
# Images

# Anthropic: tokens = width * height / 750 after downscaling to a long edge of at most 1568 px
# and at most ~1.15 megapixels, so no image costs more than ~1600 tokens. Images whose size
# cannot be read (URLs, unknown formats, truncated data) are charged that maximum.
_MAX_EDGE = 1568
_MAX_PIXELS = 1_150_000
_PIXELS_PER_TOKEN = 750
UNKNOWN_IMAGE_TOKENS = 1600
_HEADER_B64_CHARS = 65536  # JPEG size markers can sit after EXIF; PNG/GIF/WebP need 40 bytes


def _image_size(data: bytes) -> tuple[int, int] | None:
    def be16(i: int) -> int:
        return int.from_bytes(data[i : i + 2], "big")

    def le(i: int, n: int) -> int:
        return int.from_bytes(data[i : i + n], "little")

    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return le(6, 2), le(8, 2)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP" and len(data) >= 30:
        chunk = data[12:16]
        if chunk == b"VP8 ":
            return le(26, 2) & 0x3FFF, le(28, 2) & 0x3FFF
        if chunk == b"VP8L":
            bits = le(21, 4)
            return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
        if chunk == b"VP8X":
            return 1 + le(24, 3), 1 + le(27, 3)
        return None
    if data[:2] == b"\xff\xd8":
        i = 2
        while i + 9 < len(data):
            if data[i] != 0xFF:
                return None
            marker = data[i + 1]
            if marker == 0xFF:  # fill byte
                i += 1
                continue
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                return be16(i + 7), be16(i + 5)  # start of frame: height, then width
            i += 2 + be16(i + 2)
    return None


def image_tokens(block: ImageBlock) -> int:
    """Estimated tokens of an image: Anthropic's ``w*h/750`` rule, 1600 when the size is unknown.

    The size is read from the PNG, GIF, WebP or JPEG header at the start of base64 ``data``.
    """
    if block.source != "base64":
        return UNKNOWN_IMAGE_TOKENS
    head = block.data[:_HEADER_B64_CHARS]
    try:
        size = _image_size(base64.b64decode(head[: len(head) // 4 * 4]))
    except (binascii.Error, ValueError):
        size = None
    if not size or min(size) <= 0:
        return UNKNOWN_IMAGE_TOKENS
    w, h = size
    scale = min(1.0, _MAX_EDGE / max(w, h), math.sqrt(_MAX_PIXELS / (w * h)))
    return max(1, math.ceil((w * scale) * (h * scale) / _PIXELS_PER_TOKEN))


# ---------------------------------------------------------------------------------------
# Message counter with calibration


class _Entry:
    """Memo entry: the uncalibrated per-slot vector and the count at one generation.

    ``exact`` is false while ``base`` is the quick first estimate (see `MessageCounter.refine`).
    """

    __slots__ = ("base", "count", "exact", "generation")

    def __init__(
        self, base: tuple[float, ...], count: int, generation: int, exact: bool = True
    ) -> None:
        self.base = base
        self.count = count
        self.generation = generation
        self.exact = exact


def _compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting for the small normal equations."""
    n = len(b)
    m = [[*row, rhs] for row, rhs in zip(a, b, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        if m[col][col] == 0.0:
            continue
        for r in range(n):
            if r != col and m[r][col] != 0.0:
                f = m[r][col] / m[col][col]
                for j in range(col, n + 1):
                    m[r][j] -= f * m[col][j]
    return [m[i][n] / m[i][i] if m[i][i] else 0.0 for i in range(n)]


def _quick_len(text: str) -> int:
    """Characters of ASCII text (``isascii`` is O(1) in CPython), UTF-8 bytes of the rest."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


class MessageCounter:
    """Counts message tokens (memoized by `fingerprint`) and calibrates from reported usage.

    ```python
    counter = MessageCounter()              # or MessageCounter(ExactCounter())
    counter.count(message)                  # memo hit: a dict lookup
    counter.observe(sent, usage.prompt_tokens)
    counter.estimate_prompt(view)           # overhead + calibrated message tokens
    ```

    A message costs ``message_overhead`` tokens plus its blocks: text and thinking text, each
    tool call's name, id and compact JSON arguments, tool result ids and text, `image_tokens`
    per image, compact JSON of opaque blocks, ``len(data) // 6`` for redacted thinking
    (encrypted base64; thinking signatures are not counted). The text goes to the wrapped
    counter's slots (per content class for an `Estimator`, one slot otherwise), framing and
    ids to a ``fixed`` slot, images to an ``image`` slot.

    `observe` fits the hidden ``overhead`` (system prompt and tool schemas) and one multiplier
    per slot, made of a scale shared by all text and framing slots (another tokenizer) and a
    small per-slot deviation, to the last ``max_observations`` reports: least squares on
    relative error, older reports weighted ``decay ** age``, a ridge prior of strength
    ``prior`` on the deviations and ``prior / 10`` on the shared scale and the overhead.
    ``generation`` increments on every accepted report, so callers can cache totals and
    recompute when it changes. Memo entries beyond ``max_entries`` are evicted oldest first.
    Not thread-safe; use one counter per session.
    """

    def __init__(
        self,
        counter: TokenCounter | None = None,
        *,
        message_overhead: int = 4,
        max_entries: int = 100_000,
        max_observations: int = 16,
        decay: float = 0.9,
        prior: float = 1e-3,
        lazy: bool = True,
    ) -> None:
        if max_entries < 1 or max_observations < 1 or not 0 < decay <= 1 or prior <= 0:
            raise ConfigError(
                "MessageCounter needs max_entries >= 1, max_observations >= 1, "
                "0 < decay <= 1 and prior > 0"
            )
        self._counter: TokenCounter = counter if counter is not None else Estimator()
        self._features = self._counter if isinstance(self._counter, FeatureCounter) else None
        text_slots = self._features.slots if self._features is not None else ("text",)
        self._slots = (*text_slots, "fixed", "image")
        self._fixed = len(text_slots)
        self._message_overhead = message_overhead
        self._max_entries = max_entries
        self._decay = decay
        self._prior = prior
        self._memo: dict[str, _Entry] = {}
        self._mult = [1.0] * len(self._slots)
        self._overhead = 0.0
        self._generation = 0
        self._observations: deque[tuple[tuple[float, ...], int]] = deque(maxlen=max_observations)
        self._anchor: tuple[tuple[str, ...], int] | None = None
        self._lazy = lazy
        self.refined: list[tuple[str, tuple[float, ...]]] = []

    # -- reading ---------------------------------------------------------------------------

    @property
    def counter(self) -> TokenCounter:
        """The wrapped text counter."""
        return self._counter

    @property
    def slots(self) -> tuple[str, ...]:
        """Calibration slot names: the text counter's, then ``fixed`` and ``image``."""
        return self._slots

    @property
    def multipliers(self) -> tuple[float, ...]:
        """Calibrated multiplier per slot (all 1.0 before the first observation)."""
        return tuple(self._mult)

    @property
    def overhead(self) -> int:
        """Fitted tokens the provider adds to every request (system prompt, tools); >= 0."""
        return max(0, round(self._overhead))

    @property
    def generation(self) -> int:
        """Increments whenever calibration changes the numbers."""
        return self._generation

    @property
    def observations(self) -> int:
        """How many observations the current fit uses."""
        return len(self._observations)

    # -- counting --------------------------------------------------------------------------

    def count(self, message: Message) -> int:
        """Calibrated tokens of one message."""
        entry = self._memo.get(fingerprint(message))
        if entry is not None and entry.generation == self._generation:
            return entry.count
        return self._refresh(message, entry).count

    def count_many(self, messages: Iterable[Message]) -> int:
        """Calibrated tokens of several messages (no request overhead)."""
        count = self.count
        return sum(count(m) for m in messages)

    def count_text(self, text: str, kind: ContentClass | None = None) -> int:
        """Calibrated tokens of a bare text, with no message framing."""
        vec = [0.0] * len(self._slots)
        self._add_text(vec, text, kind)
        total = round(sum(m * x for m, x in zip(self._mult, vec, strict=True)))
        return max(1, total) if text else 0

    def estimate_prompt(self, messages: Sequence[Message]) -> int:
        """Predicted prompt tokens of a request sending ``messages``: overhead + messages."""
        return self.overhead + self.count_many(messages)

    def context_tokens(
        self,
        messages: Sequence[Message],
        last_sent_len: int | None = None,
        last_prompt_tokens: int | None = None,
    ) -> int:
        """Prompt size of ``messages``, anchored on the last reported usage when possible.

        With both arguments: ``last_prompt_tokens + count_many(messages[last_sent_len:])``.
        Without them: the same with the last `observe` call as the anchor, if its messages
        are still the unchanged prefix of ``messages``; otherwise `estimate_prompt`.
        """
        if (last_sent_len is None) != (last_prompt_tokens is None):
            raise ConfigError("pass both last_sent_len and last_prompt_tokens, or neither")
        if last_sent_len is not None and last_prompt_tokens is not None:
            return last_prompt_tokens + self.count_many(messages[last_sent_len:])
        if self._anchor is not None:
            fps, reported = self._anchor
            n = len(fps)
            if len(messages) >= n and all(
                fingerprint(messages[i]) == fps[i] for i in range(n - 1, -1, -1)
            ):
                return reported + self.count_many(messages[n:])
        return self.estimate_prompt(messages)

    # -- calibration -----------------------------------------------------------------------

    def observe(self, messages: Sequence[Message], prompt_tokens: int) -> None:
        """Record that sending exactly ``messages`` cost ``prompt_tokens``, and refit.

        ``prompt_tokens`` is the provider's full prompt count for that request (uncached +
        cache reads + cache writes, i.e. `Usage.prompt_tokens`). Non-positive counts, as
        aborted turns report, are ignored.
        """
        if prompt_tokens <= 0:
            return
        x = [0.0] * len(self._slots)
        fps = []
        for message in messages:
            fps.append(fingerprint(message))
            entry = self._memo.get(fps[-1]) or self._refresh(message, None)
            if not entry.exact:
                self._make_exact(fps[-1], message, entry)
            for i, v in enumerate(entry.base):
                x[i] += v
        self._observations.append((tuple(x), prompt_tokens))
        self._anchor = (tuple(fps), prompt_tokens)
        self._fit()
        self._generation += 1

    def _fit(self) -> None:
        # Multiplier of slot i = 1 + g + d_i: g is shared by every text-and-framing slot (a
        # different tokenizer, e.g. Claude's against o200k, scales them all alike), d_i is
        # the slot's own deviation; the image slot has only d. The overhead is c * scale.
        # One row per observation in relative terms (residual / reported), so big and small
        # prompts weigh alike, older rows decayed. Ridge priors keep 1-3 observations sane:
        # d is held close to 0 (unused slots stay at 1), g and c loosely, so one observation
        # is split between scale and overhead and growth between observations fixes the rest.
        obs = list(self._observations)
        scale = sum(y for _, y in obs) / len(obs)
        k = len(self._slots)
        image = k - 1
        rows: list[tuple[list[float], float, float]] = []
        for age, (x, y) in enumerate(reversed(obs)):
            shared = sum(x) - x[image]
            coeffs = [v / y for v in x] + [shared / y, scale / y]
            rows.append((coeffs, (y - sum(x)) / y, self._decay**age))
        priors = [self._prior] * k + [self._prior / 10, self._prior / 10]
        for free_overhead in (True, False):
            n = k + 2 if free_overhead else k + 1
            a = [[0.0] * n for _ in range(n)]
            b = [0.0] * n
            for coeffs, residual, weight in rows:
                for i in range(n):
                    wc = weight * coeffs[i]
                    b[i] += wc * residual
                    for j in range(n):
                        a[i][j] += wc * coeffs[j]
            for i in range(n):
                a[i][i] += priors[i]
            theta = _solve(a, b)
            if not free_overhead or theta[k + 1] >= 0:
                break
        g = theta[k]
        self._mult = [
            min(4.0, max(0.25, 1.0 + d + (g if i != image else 0.0)))
            for i, d in enumerate(theta[:k])
        ]
        # The overhead is part of every report, so no report can be smaller than it; this keeps
        # inconsistent reports (a host that compacted on its own) from running away with it.
        overhead = theta[k + 1] * scale if free_overhead else 0.0
        self._overhead = min(max(0.0, overhead), float(min(y for _, y in obs)))

    # -- internals -------------------------------------------------------------------------

    def _refresh(self, message: Message, entry: _Entry | None) -> _Entry:
        if entry is None:
            memo = self._memo
            if len(memo) >= self._max_entries:
                del memo[next(iter(memo))]  # FIFO: oldest first, O(1)
            if self._lazy:
                entry = _Entry(self._quick_base(message), 0, -1, exact=False)
            else:
                entry = _Entry(self._base(message), 0, -1)
            memo[fingerprint(message)] = entry
        entry.count = round(sum(m * x for m, x in zip(self._mult, entry.base, strict=True)))
        entry.generation = self._generation
        return entry

    def refine(self, messages: Iterable[Message]) -> int:
        """Replace quick first estimates of ``messages`` with full ones; returns how many.

        With ``lazy=True`` (the default) a message seen for the first time gets a quick
        estimate (characters over a conservative ratio), so `ContextManager.prepare` stays
        cheap on the hot path; the full content-aware estimate follows when it matters: in
        `observe` (after the model call, for what was sent) and before a strategy decides.
        """
        changed = 0
        for message in messages:
            fp = fingerprint(message)
            entry = self._memo.get(fp)
            if entry is not None and not entry.exact:
                self._make_exact(fp, message, entry)
                changed += 1
        if changed:
            self._generation += 1
        return changed

    def count_full(self, message: Message) -> int:
        """Calibrated tokens of one message from the full estimate (refined if quick)."""
        self.count(message)  # creates the memo entry a first-seen message needs to be refined
        self.refine((message,))
        return self.count(message)

    def _make_exact(self, fp: str, message: Message, entry: _Entry) -> None:
        base = self._base(message)
        self.refined.append((fp, tuple(b - a for a, b in zip(entry.base, base, strict=True))))
        entry.base, entry.exact = base, True

    def vector(self, message: Message) -> tuple[float, ...]:
        """The uncalibrated per-slot vector of a message (memoized, quick first if lazy).

        Sum vectors and pass the sum to `total` to count many messages in O(slots) after a
        calibration change; `refined` lists ``(fingerprint, delta)`` of every vector that
        `refine` or `observe` replaced, so a cached sum can be kept up to date.
        """
        entry = self._memo.get(fingerprint(message))
        if entry is None:
            entry = self._refresh(message, None)
        return entry.base

    def total(self, vector: Sequence[float]) -> int:
        """Calibrated tokens of a summed per-slot vector (see `vector`)."""
        return round(sum(m * x for m, x in zip(self._mult, vector, strict=True)))

    def _quick_base(self, message: Message) -> tuple[float, ...]:
        """A cheap, deliberately high first estimate: characters / 3 (JSON arguments / 3.5),
        counting UTF-8 bytes for text that is not ASCII (CJK runs about a token a character)."""
        vec = [0.0] * len(self._slots)
        prose = _CLASSES.index(ContentClass.PROSE) if self._features is not None else 0
        json_slot = _CLASSES.index(ContentClass.JSON) if self._features is not None else 0
        fixed = float(self._message_overhead)
        if isinstance(message, SummaryMessage):
            vec[prose] += _quick_len(message.text) / 3.0
            blocks: tuple[Any, ...] = ()
        else:
            blocks = message.content
            if isinstance(message, ToolResultMessage):
                fixed += len(message.tool_call_id) / 2
        for block in blocks:
            if isinstance(block, TextBlock):
                vec[prose] += _quick_len(block.text) / 3.0
            elif isinstance(block, ThinkingBlock):
                vec[prose] += _quick_len(block.thinking) / 3.0
            elif isinstance(block, ToolCall):
                fixed += (len(block.name) + len(block.id)) / 2
                vec[json_slot] += _quick_len(_compact_json(dict(block.arguments))) / 3.5
            elif isinstance(block, ImageBlock):
                vec[self._fixed + 1] += image_tokens(block)
            elif isinstance(block, OpaqueBlock):
                vec[json_slot] += _quick_len(_compact_json(dict(block.payload))) / 3.5
            elif isinstance(block, RedactedThinkingBlock):
                fixed += len(block.data) // 6
        vec[self._fixed] += fixed
        return tuple(vec)

    def _add_text(self, vec: list[float], text: str, kind: ContentClass | None = None) -> None:
        if not text:
            return
        features = self._features
        if features is None:
            vec[0] += self._counter.count(text)
            return
        f = features.features(text, kind)
        for i, (w, units) in enumerate(zip(features.weights, f, strict=True)):
            vec[i] += w * units

    def _identifier_tokens(self, text: str) -> float:
        """Tokens of a tool name or call id, which need no content classification."""
        features = self._features
        if features is None:
            return self._counter.count(text)
        f = features.features(text, ContentClass.PROSE)
        return sum(w * units for w, units in zip(features.weights, f, strict=True))

    def _base(self, message: Message) -> tuple[float, ...]:
        vec = [0.0] * len(self._slots)
        fixed = float(self._message_overhead)
        count = self._identifier_tokens
        if isinstance(message, SummaryMessage):
            self._add_text(vec, message.text)
            blocks: tuple[Any, ...] = ()
        elif isinstance(message, ToolResultMessage):
            fixed += count(message.tool_call_id)
            blocks = message.content
        elif isinstance(message, (UserMessage, AssistantMessage)):
            blocks = message.content
        else:  # pragma: no cover - the Message union is closed
            blocks = ()
        for block in blocks:
            if isinstance(block, TextBlock):
                self._add_text(vec, block.text)
            elif isinstance(block, ThinkingBlock):
                self._add_text(vec, block.thinking)
            elif isinstance(block, ToolCall):
                fixed += count(block.name) + count(block.id)
                self._add_text(vec, _compact_json(dict(block.arguments)), ContentClass.JSON)
            elif isinstance(block, ImageBlock):
                vec[self._fixed + 1] += image_tokens(block)
            elif isinstance(block, OpaqueBlock):
                self._add_text(vec, _compact_json(dict(block.payload)), ContentClass.JSON)
            elif isinstance(block, RedactedThinkingBlock):
                fixed += len(block.data) // 6
        vec[self._fixed] += fixed
        return tuple(vec)
