"""`Estimator`: o200k-like token counts without a tokenizer, with bounded work per text.

```python
Estimator().count("def f(x):\n    return x")     # ~9; never 0 for a non-empty text
Estimator().features(text)                          # units per slot (class slots, non-ASCII)
```

It splits a bounded sample of the text with an ASCII copy of the o200k pre-tokenizer and
prices each piece from a small table (common short words cost one token, rare long ones,
escapes and punctuation runs more); non-ASCII characters are priced separately.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from agentctx.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from agentctx.messages import (
        ImageBlock,
    )

from agentctx.tokens.classify import CLASS_ORDER, ContentClass, classify

__all__ = ["Estimator", "FeatureCounter", "TokenCounter", "UNKNOWN_IMAGE_TOKENS", "image_tokens"]


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
_ESTIMATOR_SLOTS = (*(c.value for c in CLASS_ORDER), "non_ascii")


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
        out[CLASS_ORDER.index(kind or classify(text))] = units
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
