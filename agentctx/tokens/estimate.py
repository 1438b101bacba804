"""`Estimator`: o200k-like token counts without a tokenizer, with bounded work per text.

```python
Estimator().count("def f(x):\n    return x")     # ~9; never 0 for a non-empty text
Estimator().features(text)                          # units per slot (class slots, non-ASCII)
```

It counts the text's o200k pre-tokens without running the pre-tokenizer and prices each
from small tables (common short words cost one token, long and random-looking ones more), in
a fixed number of passes in C, no Python loop per character: about as fast as encoding with
tiktoken on texts of a few dozen characters, faster from a few hundred on. Texts over 16 KB
are sampled in windows (scanned whole up to 64 KB when the windows disagree, or are not made
like the whole text), so the work per text is bounded. Non-ASCII text is priced per
character, by script. `default_estimator` counts short texts exactly when tiktoken is there.
"""

from __future__ import annotations

import base64
import binascii
import importlib.util
import json
import json.encoder
import math
import re
import threading
from dataclasses import dataclass, field
from functools import partial
from operator import eq
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from agentctx.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from agentctx.messages import (
        ImageBlock,
    )

from agentctx.tokens.classify import CLASS_ORDER, ContentClass, classify
from agentctx.tokens.vocabulary import SLASH_WORDS

__all__ = [
    "EXACT_BELOW",
    "UNKNOWN_IMAGE_TOKENS",
    "Estimator",
    "FeatureCounter",
    "TokenCounter",
    "default_estimator",
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
# Estimator
#
# o200k splits a text into pre-tokens (tiktoken_ext/openai_public.py) and byte-pair-encodes
# each one on its own, so a text's tokens are the sum over its pre-tokens. The estimator counts
# and prices those pre-tokens without running the pre-tokenizer, in a fixed number of passes
# that run in C (`bytes.translate` through 256-byte tables, `bytes.split`, `map` over a dict,
# and shifts and masks of the text read as one big integer), never a Python loop per
# character: letter runs are priced by shape (case, vowels, length, what precedes them),
# punctuation runs by content and length, and digits, spaces and line breaks follow the
# pre-tokenizer's rules. The tables and rates are mean o200k costs of each kind of pre-token,
# measured on local source files, documentation, JSON, shell output and logs and on the
# transcripts in tests/corpus (benchmarks/token_accuracy.py scores the result per source).


def _byte_table(kind: Callable[[int], int]) -> bytes:
    return bytes(kind(c) for c in range(256))


def _char_class(c: int) -> str:
    """a letter, 0 digit, space, t tab, n line break, p punctuation or control, x other."""
    if 65 <= c <= 90 or 97 <= c <= 122:
        return "a"
    if 48 <= c <= 57:
        return "0"
    if c in (32, 11, 12):
        return " "
    if c == 9:
        return "t"
    if c in (10, 13):
        return "n"
    if c < 128:
        return "p"
    return "x"  # the first byte of a non-ASCII character, and the marks below


# `_scan` reads non-ASCII text as one byte per character (the first of its UTF-8 bytes), so
# it never holds UTF-8 continuation bytes and uses them as marks in its copy: _GAP where it cut
# out a JSON escape (priced on its own), _BREAK in punctuation runs for a line break.
_CONTINUATION = bytes(range(0x80, 0xC0))
_GAP = b"\x80"
_BREAK = 0x83
_BREAKS_AFTER = re.compile(rb"([^\x83]*)(\x83*)")
# o200k's longest whitespace tokens: runs longer than these take one more token each.
_TABS = b"\t" * 16
_SPACES = b" " * 128
_BREAK_BYTE = bytes([_BREAK])
_SYMBOL_LEAD = 0xE2  # U+2000-U+2FFF: arrows, box drawing, dashes, bullets: punctuation
# Horizontal box-drawing lines (─ ━ ═) become one byte each that UTF-8 never uses: o200k has
# tokens for long runs of them, while other symbols cost about a token each (├── is ├, ──).
_RULERS = ((b"\xe2\x94\x80", b"\xf8"), (b"\xe2\x94\x81", b"\xf9"), (b"\xe2\x95\x90", b"\xfa"))
_RULER_BYTES = frozenset(b"\xf8\xf9\xfa")
# o200k has no token for a space and a box-drawing character but " │": after a space the
# character's first bytes join the space and the rest is a token of its own (" ├── x" is
# " \xe2\x94", "\x9c", "──", " x"), so each costs one token more than on its own.
_SPACED_BOXES = (b" \xe2\x94", b" \xe2\x95")
_SPACED_SIDE = b" \xe2\x94\x82"  # " │"
_SPACED_BOX = 1.0

# Letter runs as shapes: a lowercase vowel, b lowercase consonant, E uppercase vowel,
# A uppercase consonant, S a space or tab before the run, Q a double quote next to it (JSON
# keys and strings are mostly common words); everything else separates them. `_scan` puts a
# gap before each S (an S before no letter is a piece of its own, priced 0).
_VOWELS = frozenset(b"aeiouyAEIOUY")
_SHAPE = _byte_table(
    lambda c: (
        (ord("a") if c in _VOWELS else ord("b"))
        if 97 <= c <= 122
        else (ord("E") if c in _VOWELS else ord("A"))
        if 65 <= c <= 90
        else ord("S")
        if c in (32, 9, 11, 12)
        else ord("Q")
        if c == 34
        else 32
    )
)
_SHAPE_BYTES = frozenset(b"abAESQ")
_ROW = {ord("S"): "s", ord("Q"): "q"}
_SEGMENT = re.compile(rb"[AE]*[ab]+|[AE]+")  # o200k splits camelCase runs here
# Punctuation runs, with line breaks as _BREAK: o200k ends a punctuation pre-token with the
# line breaks right after it (");\n"); a run of line breaks alone is one pre-token.
_PUNCT = _byte_table(
    lambda c: (
        c
        if _char_class(c) == "p" or c == _SYMBOL_LEAD or c in _RULER_BYTES
        else _BREAK
        if c in (10, 13)
        else 32
    )
)

# Pre-tokens that hinge on a character and its neighbours are counted in eight lanes at once:
# three tables give each character one bit per lane, for what the character must be (_NOW),
# what must follow it (_NEXT) and what may precede it (_AFTER). Lanes:
#   0-2 a single punctuation character (0 other, 1 one of _DOT_PREFIXES, 2 a slash) before a
#       letter run and after neither punctuation nor a space: o200k merges it into the run
#       (not an ASCII control character: o200k has no merges for those);
#   3   an apostrophe between a letter and s t m d r v l: o200k keeps "don't", "it's" whole;
#   4   the end of a run of 2+ spaces or tabs, not at a line break: one pre-token;
#   5   a space or tab before a digit, 6 a tab before punctuation: these do not merge;
#   7   the first digit of a run.
_DOT_PREFIXES = frozenset(b"._(#,&")  # merge into the letter run after them for free
_CONTRACTED_BY = frozenset(b"stmdrvlSTMDRVL")
_CONTROLS = bytes([*range(9), *range(14, 32), 127])  # not \t \n \v \f \r, spaces to o200k
# In punctuation runs each costs a token, but NUL, which o200k merges in pairs (priced as a
# repeated run).
_LONE_CONTROLS = _CONTROLS[1:]
_LONE_CONTROLS_AS_SPACES = bytes(32 if c in _LONE_CONTROLS else c for c in range(256))


def _lanes(c: int, *, now: bool = False, after: bool = False) -> int:
    kind = _char_class(c)
    letter, punct, digit = kind == "a", kind == "p", kind == "0"
    hspace = kind in " t"
    if now:
        lanes = (
            punct and c not in _DOT_PREFIXES and c != 47 and c not in _CONTROLS,
            c in _DOT_PREFIXES,
            c == 47,
            c == 39,
            hspace,
            hspace,
            kind == "t",
            digit,
        )
    elif after:  # what the next character must be
        ordinary = not (hspace or kind == "n")
        lanes = (letter, letter, letter, c in _CONTRACTED_BY, ordinary, digit, punct, False)
    else:
        free = not (punct or kind == " ")
        lanes = (free, free, free, letter, hspace, True, True, not digit)
    return sum(1 << i for i, on in enumerate(lanes) if on)


_NOW = _byte_table(lambda c: _lanes(c, now=True))
_NEXT = _byte_table(lambda c: _lanes(c, after=True))
_AFTER = _byte_table(_lanes)
_DIGITS = _byte_table(lambda c: 1 if 48 <= c <= 57 else 0)
_FOUR_DIGITS = b"\1" * 4
_AT_START = 0b11101111  # what may begin a text: all but lane 4, which needs a space before


# Non-ASCII characters by UTF-8 length: 2 (Latin, Greek, Cyrillic, Hebrew, Arabic), 3 (CJK,
# kana, Hangul, Indic; not the symbols, priced as punctuation), 4 (emoji); "u" for the 2-byte
# scripts o200k has no merges for, led by 0xDC-0xDF (U+0700-07FF: Syriac, Arabic Supplement,
# Thaana, NKo), about two tokens a character. The 2-byte rate is that of letters merged into
# words, so the Latin-1 half that is no letter and the Latin-1 letters have classes of their
# own: "c" led by 0xC2 (U+0080-00BF: C1 controls, two tokens each, and signs such as © ° «,
# one), "l" led by 0xC3 (U+00C0-00FF: à-ÿ, one token outside a word); bytes decoded as
# Latin-1 are mostly these. Private-use characters (icon fonts) have no merges, a token a
# UTF-8 byte: "p" led by 0xEE holds only them (U+E000-EFFF), "f" led by 0xEF (the rest,
# U+F000-F8FF, and fullwidth ，, U+FFFD) and "q" led by 0xF3-0xF4 (U+F0000-10FFFF, and tags)
# are told apart by the second byte. "i" led by 0xE0 (U+0800-0FFF: the Indic scripts, Thai,
# Lao, Tibetan) and "j" led by 0xE1 (U+1000-1FFF: Georgian, Ethiopic, Cherokee, Mongolian...)
# hold scripts o200k merges well and scripts it spells out byte by byte, told apart by the
# bytes of their UTF-16 code units (`_by_block`); "h" led by 0xD7 is Hebrew's letters, which
# merge less than the other 2-byte scripts'.
_UNMERGED_2, _SIGN_2, _LATIN1_2, _PRIVATE_3, _SOME_PRIVATE_3, _SOME_PRIVATE_4 = b"uclpfq"
_E0_3, _E1_3, _HEBREW_2 = b"ijh"


def _script_class(lead: int) -> int:
    if 0xDC <= lead < 0xE0:
        return _UNMERGED_2
    if lead == 0xD7:
        return _HEBREW_2
    if lead == 0xC2:
        return _SIGN_2
    if lead == 0xC3:
        return _LATIN1_2
    if 0xC0 <= lead < 0xE0:
        return ord("2")
    if lead == 0xEE:
        return _PRIVATE_3
    if lead == 0xEF:
        return _SOME_PRIVATE_3
    if lead in (0xF3, 0xF4):
        return _SOME_PRIVATE_4
    if lead == 0xE0:
        return _E0_3
    if lead == 0xE1:
        return _E1_3
    return ord("3") if 0xE0 <= lead < 0xF0 else ord("4")


_SCRIPT = _byte_table(_script_class)
_NOT_SCRIPT = bytes([*range(0x80), _SYMBOL_LEAD, *_RULER_BYTES])


def _rows(table: str) -> dict[str, tuple[float, ...]]:
    return {
        k: tuple(map(float, v)) for k, *v in (line.split() for line in table.splitlines() if line)
    }


# Mean tokens of a letter run by shape, for 1..16 letters (then +0.3 a letter). Key: what
# precedes it (s a space or tab, n nothing, as after a line break, digits, other punctuation
# or inside a camelCase run) + case (l lower, C capitalized, U upper, M two or more capitals
# then lower) + x when it has no vowel (ids, hashes, abbreviations).
_WORD_COST = _rows(
    """
sl  1.000 1.001 1.005 1.020 1.028 1.041 1.050 1.127 1.142 1.235 1.238 1.238 1.342 1.479 1.566 2.037
slx 1.000 1.001 1.269 1.286 1.286 1.372 1.372 1.372 1.372 1.372 1.372 1.372 1.372 1.479 1.566 2.037
sC  1.000 1.010 1.023 1.023 1.036 1.057 1.078 1.221 1.275 1.472 1.472 1.472 1.608 1.608 1.620 1.707
sCx 1.000 1.010 1.287 1.287 1.381 1.381 1.381 1.381 1.381 1.472 1.472 1.472 1.608 1.608 1.620 1.707
sU  1.000 1.010 1.196 1.196 1.503 1.605 1.605 1.968 2.368 2.368 2.368 2.572 2.572 2.572 2.572 2.572
sUx 1.000 1.010 1.371 1.374 1.620 1.620 1.620 1.968 2.368 2.368 2.368 2.572 2.572 2.572 2.572 2.572
sM  1.000 1.100 1.351 1.397 1.397 1.580 2.259 2.608 2.608 2.608 2.608 2.608 2.640 2.821 2.869 2.914
sMx 1.000 1.100 1.385 1.614 1.614 1.614 2.259 2.608 2.608 2.608 2.608 2.608 2.640 2.821 2.869 2.914
nl  1.000 1.010 1.113 1.113 1.221 1.221 1.380 1.472 1.664 1.664 1.664 3.692 3.692 3.692 3.692 4.402
nlx 1.000 1.010 1.365 1.842 2.406 2.406 2.406 2.406 2.619 3.932 3.932 3.932 3.932 3.932 3.932 4.361
nC  1.000 1.102 1.102 1.102 1.102 1.102 1.102 1.102 1.114 1.342 1.342 1.342 1.342 1.367 1.815 2.390
nCx 1.000 1.102 1.624 2.257 2.399 2.399 2.399 2.399 2.399 2.399 2.399 2.399 2.399 2.399 2.399 2.399
nU  1.000 1.076 1.572 1.946 2.158 2.238 2.238 2.841 3.509 3.935 4.150 4.150 4.715 5.088 5.420 6.797
nUx 1.000 1.076 1.836 2.067 2.725 2.845 2.845 2.859 3.684 4.081 4.150 4.150 4.715 5.088 5.420 6.716
nM  1.000 1.100 2.014 2.346 2.748 3.398 3.845 4.388 4.540 5.221 5.221 5.363 6.279 6.670 6.935 8.844
nMx 1.000 1.100 2.056 2.475 3.131 3.645 4.220 4.633 4.813 5.280 5.280 5.363 6.279 6.670 6.995 8.844
ql  1.000 1.000 1.011 1.014 1.082 1.082 1.082 1.180 1.272 1.272 1.399 1.819 1.819 2.604 3.589 4.342
qlx 1.000 1.010 1.116 1.137 1.157 2.400 2.406 2.406 2.619 3.932 3.932 3.932 3.932 3.932 3.932 4.361
qC  1.000 1.014 1.028 1.083 1.083 1.083 1.104 1.207 1.216 1.475 1.475 1.475 1.520 1.520 1.882 2.390
qCx 1.000 1.102 1.492 2.073 2.399 2.399 2.399 2.399 2.399 2.399 2.399 2.399 2.399 2.399 2.399 2.399
qU  1.000 1.014 1.383 1.553 1.782 1.782 1.934 2.570 3.139 3.714 3.883 4.175 4.723 5.072 5.420 6.628
qUx 1.000 1.076 1.720 2.012 2.718 2.845 2.845 2.859 3.684 4.081 4.150 4.150 4.715 5.088 5.420 6.716
qM  1.000 1.100 2.014 2.313 2.714 3.137 3.780 4.011 4.011 4.891 5.081 5.363 6.279 6.414 6.935 8.743
qMx 1.000 1.100 2.056 2.483 3.127 3.645 4.220 4.633 4.813 5.280 5.280 5.363 6.279 6.670 6.995 8.844
"""
)
# Mean tokens of the punctuation runs that cost more or less than others of their length.
_RUN_COST: dict[bytes, float] = {
    b'","': 1,
    b'":"': 1,
    b'":"/': 2,
    b'":{"': 1,
    b"&&": 1,
    b"((": 1,
    b"():": 1,
    b"()`": 1,
    b'(\\"': 1.01,
    b"./.": 2,
    b'=\\"': 1,
    b'\\",': 1.01,
    b'\\":': 1,
    b"``": 1,
}
# Other punctuation runs of 1..12 characters (then +0.5 a character).
_RUN_LENGTH_COST = (1, 1.022, 1.265, 1.776, 2.084, 2.994, 3.292, 3.39, 4.232, 4.517, 4.657, 5.271)
# What a single punctuation character before a letter run adds to the run's own price (lanes
# 0-2): most merge for free, a slash before 5+ letters less so; an apostrophe inside a word
# (lane 3) undoes most of what its parts cost; line breaks merged into punctuation add little.
_QUOTED = -0.694
_DOTTED = -1.08
_SLASHED = -0.814
_SLASHED_LONG = 0.269
# A slash and the whole letter run after it are one pre-token, so a path segment's price is
# vocabulary: one token if o200k has it with its slash (`SLASH_WORDS`), else at least two,
# 1.736 + 0.134 a letter: a least-squares fit over the 21,733 distinct unlisted segments of
# the paths on a Linux machine (not fitted on tests/corpus; the letters' length predicts these
# better than their shape does). Lane 2's prices above are the mean over both kinds; these
# correct each whole run it found.
_PATH_SEGMENT = re.compile(
    # lane 2's slash (the search starts at a slash, then looks at what precedes it: 15x faster
    # than the other way round) and a whole run of letters
    rb"/(?<![\x21-\x2f\x3a-\x40\x5b-\x60\x7b-\x7e \x0b\x0c]/)"
    rb"([A-Z]*[a-z]+|[A-Z]+)(?![A-Za-z\xc0-\xff])"
)
_UNLISTED = (1.736, 0.134)
_CONTRACTED = -1.27
_LINE_END = 0.014
_ESCAPE = 0.982
_SCRIPT_RATES = (0.39, 0.748, 1.5)  # per non-ASCII character of 2, 3, 4 UTF-8 bytes
_HEBREW = 0.5  # per Hebrew letter (U+05C0-05FF): fewer merges than the other 2-byte scripts
_UNMERGED = 2.0  # per character of a 2-byte script o200k has no merges for (see _SCRIPT)
# Characters of U+0800-1FFF (see _SCRIPT) by what o200k makes of them: about a token every two
# (letters of the Indic scripts, Thai and Georgian, measured on translated UI text and prose:
# 0.37-0.42), two or three (one a UTF-8 byte, with no merges). The rest cost about the 3-byte
# rate: Gurmukhi, Gujarati, Oriya, Sinhala, Khmer, Myanmar (but for Shan's letters),
# Vietnamese's letters, and Devanagari's and Bengali's digits and Vedic marks.
_MERGED_3, _SPELLED_2, _SPELLED_3 = 0.5, 2.0, 3.0


# A character's block is the high byte of its UTF-16 code unit, and where a block of 256 holds
# two scripts, its low byte tells them apart: each set of characters is a bit mask (one bit a
# character, from `int.from_bytes` of a translation), and a count its bits, all in C.
_HIGH = {
    h: _byte_table(partial(eq, h)) for h in (0x08, 0x09, 0x0B, 0x0C, 0x0D, 0x0E, 0x10, 0x13, 0x18)
}
_HIGHS_SPELLED_2 = _byte_table(lambda c: c in (0x0F, 0x12, 0x1F))  # Tibetan; Ethiopic; Greek Ext.
_HIGHS_SPELLED_3 = _byte_table(lambda c: c in (0x11, 0x14, 0x15, 0x16))  # Jamo; Syllabics
_LOW_HALF, _HIGH_HALF = _byte_table(lambda c: c < 0x80), _byte_table(lambda c: c >= 0x80)
_LOWS = {
    "digits 6": _byte_table(lambda c: 0x66 <= c < 0x70),
    "digits E": _byte_table(lambda c: 0xE6 <= c < 0xF0),
    "digits 6 and E": _byte_table(lambda c: 0x66 <= c < 0x70 or 0xE6 <= c < 0xF0),
    "Thai digits": _byte_table(lambda c: 0x50 <= c < 0x5A),
    "Vedic stress": _byte_table(lambda c: 0x51 <= c < 0x55),
    "Georgian": _byte_table(lambda c: c >= 0xC0),  # U+10C0-10FF
    "Myanmar Extended": _byte_table(lambda c: 0x80 <= c < 0xA0),  # U+1080-109F (Shan)
    "Cherokee": _byte_table(lambda c: c >= 0xA0),  # U+13A0-13FF
    "Mongolian": _byte_table(lambda c: c < 0xB0),  # U+1800-18AF
}


def _by_block(text: str) -> float:
    """What the characters of U+0800-1FFF in ``text`` cost beyond the 3-byte rate."""
    units = text.encode("utf-16-be", "surrogatepass")
    highs, lows = units[0::2], units[1::2]

    def mask(table: bytes, of: bytes) -> int:
        return _from_bytes(of.translate(table), "little")

    blocks: dict[int, int] = {}

    def count(high: int, low: bytes | None = None) -> int:
        bits = blocks.get(high)
        if bits is None:
            bits = blocks[high] = mask(_HIGH[high], highs)
        return (bits if low is None or not bits else bits & mask(low, lows)).bit_count()

    # The digits of Tamil, Telugu, Kannada, Malayalam and Thai have no merges: two tokens
    # each; Devanagari's and Bengali's one, about the 3-byte rate.
    digits = (
        count(0x0B, _LOWS["digits E"])
        + count(0x0C, _LOWS["digits 6 and E"])
        + count(0x0D, _LOWS["digits 6"])
        + count(0x0E, _LOWS["Thai digits"])
    )
    merged = (
        count(0x09)  # Devanagari, Bengali
        - count(0x09, _LOWS["digits 6 and E"])
        - count(0x09, _LOWS["Vedic stress"])
        + count(0x0B, _HIGH_HALF)  # Tamil
        + count(0x0C)  # Telugu, Kannada
        + count(0x0D, _LOW_HALF)  # Malayalam
        + count(0x0E, _LOW_HALF)  # Thai
        - digits
        + count(0x10, _LOWS["Georgian"])
    )
    cherokee = count(0x13, _LOWS["Cherokee"])
    spelled_2 = (
        mask(_HIGHS_SPELLED_2, highs).bit_count()
        + count(0x13)  # Ethiopic, but for Cherokee
        - cherokee
        + count(0x0E, _HIGH_HALF)  # Lao
        + count(0x10, _LOWS["Myanmar Extended"])
        + digits
    )
    spelled_3 = (
        mask(_HIGHS_SPELLED_3, highs).bit_count()
        + cherokee
        + count(0x08, _LOW_HALF)  # Samaritan, Mandaic
        + count(0x18, _LOWS["Mongolian"])
    )
    r3 = _SCRIPT_RATES[1]
    return (_MERGED_3 - r3) * merged + (_SPELLED_2 - r3) * spelled_2 + (_SPELLED_3 - r3) * spelled_3


_LATIN1_SIGN = 1.0  # U+00A0-00BF (see _SCRIPT)
_C1_EXTRA = 0.9  # U+0080-009F cost this more than a sign
_C1 = re.compile(rb"\xc2[\x80-\x9f]")
# A Latin-1 letter merges into the word around it ("système" is 2 tokens): one with no ASCII
# letter after it, nor a letter or space (" à" is a token) before it or the Latin-1 letter
# before it ("créé"), costs a token of its own.
_LATIN1_ALONE = re.compile(rb"\xc3(?![A-Za-z])(?<![A-Za-z ]\xc3)(?<![A-Za-z ]\xc3\xc3)")
_LATIN1_ALONE_EXTRA = 1.0 - _SCRIPT_RATES[0]
_PRIVATE_USE = 0.97  # per UTF-8 byte
_PRIVATE_USE_EF = re.compile(rb"\xef[\x80-\xa3]")  # U+F000-F8FF: one literal, a fast search
_PRIVATE_USE_4 = re.compile(rb"\xf4|\xf3[\xb0-\xbf]")  # U+F0000-10FFFF
_PRIVATE_EXTRA_3 = 3 * _PRIVATE_USE - _SCRIPT_RATES[1]
_PRIVATE_EXTRA_4 = 4 * _PRIVATE_USE - _SCRIPT_RATES[2]
_CONTROL = 1.0  # an ASCII control character (not a space) in a punctuation run: no merges

# Per segment of a run of 2..6+ camelCase segments whose mean length is under 3, under 4.5,
# or more letters.
_CAMEL = (
    (0.08, -0.01, -0.09),
    (0.13, 0.03, -0.08),
    (0.16, 0.13, -0.05),
    (0.18, 0.17, 0.03),
    (0.19, 0.19, 0.16),
)
# Tokens per extra character of a run of one repeated punctuation character: rulers (---,
# ===, ###) have long tokens, brackets and quotes short ones, control characters none.
_REPEATED = tuple(
    1 / 32
    if chr(c) in "!#%*+-./:;=_~"
    else 1 / 8
    if chr(c) in "<>?@^"
    else 1 / 4
    if chr(c) in "\"$'(),\\|"
    else 1 / 2
    if chr(c) in "\0&[]`{}"
    else 1.0
    for c in range(256)
)
# ls -l modes split where the shapes do not ("drwxr-xr-x" is dr wx r -x r -x, 6 tokens;
# "-rw-r--r--" is -r w -r -- r --, 6): what a "rwx" and a "rw-" group add to their price, from
# the modes' o200k costs (the r-x and r-- groups come out about right). The groups hardly occur
# in anything else.
_MODE_RWX = 1.2
_MODE_RW = 0.58
_SYMBOL = 1.0  # an arrow, bullet, box side or other symbol of U+2000-U+2FFF
_NON_ASCII_PUNCT = bytes([_SYMBOL_LEAD, *_RULER_BYTES])
_ONE_RULER = tuple(bytes(c if c == r else 32 for c in range(256)) for r in _RULER_BYTES)

_MEMO_MAX = 1 << 16  # distinct shapes and runs are few; bounded all the same
_PIECES: dict[bytes, float] = {}  # price per piece (shape or run), filled on first sight
_price = _PIECES.__getitem__


def _word_cost(shape: bytes) -> float:
    core = shape.strip(b"SQ")  # a closing quote says nothing: '"ls"' is Q, bb, Q
    if not core:
        return 0.0
    start = shape.find(core)
    prefix = _ROW.get(shape[start - 1], "n") if start else "n"
    shape = core
    cost = 0.0
    segments = _SEGMENT.findall(shape)
    for segment in segments:
        n = len(segment)
        upper = n - segment.count(b"a") - segment.count(b"b")
        case = "l" if not upper else "U" if upper == n else "C" if upper == 1 else "M"
        if n > 2 and b"a" not in segment and b"E" not in segment:
            case += "x"
        costs = _WORD_COST[prefix + case]
        cost += costs[n - 1] if n <= 16 else costs[15] + 0.3 * (n - 16)
        prefix = "n"
    if len(segments) > 1:
        # camelCase words of whole words cost a little less a segment than the table says,
        # random ids (many short segments, "xcSvVWynFdb") more
        k = len(segments)
        mean = len(shape) / k
        cost += k * _CAMEL[min(k, 6) - 2][0 if mean < 3 else 1 if mean < 4.5 else 2]
    return cost


def _punct_cost(run: bytes) -> float:
    known = _RUN_COST.get(run)
    if known is not None:
        return known
    if not run.isascii():
        # Symbols cost about a token each, a run of one ruler a token per 14 or so, the ASCII
        # punctuation among them as a run of its own.
        rest = run.translate(None, _NON_ASCII_PUNCT)
        cost = (_punct_cost(rest) if rest else 0.0) + _SYMBOL * run.count(_SYMBOL_LEAD)
        for only in _ONE_RULER:
            for segment in run.translate(only).split():
                cost += 1.0 + (len(segment) - 1) / 14
        return cost
    n = len(run)
    if run.count(run[:1]) == n:  # one character repeated: "-----" is a token, "\0\0" two
        return 1.0 + (n - 1) * _REPEATED[run[0]]
    controls = n - len(run.translate(None, _LONE_CONTROLS))
    if controls:  # binary output, ANSI colours: "\x1b[31m" is \x1b [ 31 m
        between = run.translate(_LONE_CONTROLS_AS_SPACES).split()
        return _CONTROL * controls + sum([_punct_cost(part) for part in between])
    return _RUN_LENGTH_COST[n - 1] if n <= 12 else _RUN_LENGTH_COST[11] + 0.5 * (n - 12)


def _segment_cost(word: bytes) -> float:
    """What pricing ``/word`` by the vocabulary changes in lane 2's price of it."""
    letters = _word_cost(word.translate(_SHAPE))
    lane = letters + _punct_cost(b"/") + _SLASHED + (_SLASHED_LONG if len(word) >= 5 else 0.0)
    base, rate = _UNLISTED
    exact = 1.0 if word in SLASH_WORDS else max(2.0, base + rate * len(word))
    return exact - lane


_SEGMENT_COSTS: dict[bytes, float] = {}  # bounded by _MEMO_MAX as _PIECES is
_segment_price = _SEGMENT_COSTS.__getitem__


def _segments_cost(words: list[bytes]) -> float:
    try:
        return sum(map(_segment_price, words))
    except KeyError:
        return _price_new(_SEGMENT_COSTS, words, _segment_cost)


def _run_cost(run: bytes) -> float:
    if _BREAK_BYTE not in run:
        return _punct_cost(run)
    # Breaks before any punctuation are a pre-token, encoded 16 breaks a token; those after
    # punctuation join its pre-token, a token per 11 or so.
    cost = 0.0
    for i, (punct, breaks) in enumerate(_BREAKS_AFTER.findall(run)):
        if punct:
            cost += _punct_cost(punct) + _LINE_END + round(len(breaks) / 11)
        elif i == 0:
            cost += (len(breaks) + 15) // 16
    return cost


def _piece_cost(piece: bytes) -> float:
    return _word_cost(piece) if piece[0] in _SHAPE_BYTES else _run_cost(piece)


def _price_new(
    memo: dict[bytes, float], pieces: list[bytes], cost_of: Callable[[bytes], float]
) -> float:
    """The sum of ``pieces``' prices when ``memo`` lacks some: only those are priced in
    Python (and kept, up to `_MEMO_MAX` entries); the sum stays one pass in C, in the same
    order (the same float) as the memo's fast path."""
    new = {piece: cost_of(piece) for piece in set(pieces).difference(memo)}
    if len(memo) + len(new) <= _MEMO_MAX:
        memo.update(new)
        return sum(map(memo.__getitem__, pieces))
    get = memo.get
    return sum([new[piece] if (cost := get(piece)) is None else cost for piece in pieces])


_from_bytes = int.from_bytes


def _ones(n: int) -> tuple[int, int, int, int]:
    """Masks of lanes 0, 0-2, 4-7 (read from bit 4 on) and 7 for n characters."""
    ones = _from_bytes(b"\1" * n, "little")
    return ones, ones * 7, ones * 15, ones << 7


_SMALL = 512
_ONES = [_ones(n) for n in range(_SMALL)]


def _scan(text: str) -> tuple[float, float]:
    """(ASCII token units, non-ASCII units) of ``text``."""
    units = 0.0
    if text.isascii():
        b = text.encode("ascii")
        size = len(b)
        other = 0.0
    else:
        raw = text.encode("utf-8", "surrogatepass")
        size = len(raw)
        if raw.find(b"\xe2\x94") >= 0 or raw.find(b"\xe2\x95") >= 0:
            spaced = raw.count(_SPACED_BOXES[0]) + raw.count(_SPACED_BOXES[1])
            units += _SPACED_BOX * (spaced - raw.count(_SPACED_SIDE))
            for ruler, mark in _RULERS:
                raw = raw.replace(ruler, mark)
        b = raw.translate(None, _CONTINUATION)
        scripts = b.translate(_SCRIPT, _NOT_SCRIPT)
        r2, r3, r4 = _SCRIPT_RATES
        other = r2 * scripts.count(b"2") + r3 * scripts.count(b"3") + r4 * scripts.count(b"4")
        if _LATIN1_2 in scripts:
            alone = len(_LATIN1_ALONE.findall(b))
            other += r2 * scripts.count(_LATIN1_2) + _LATIN1_ALONE_EXTRA * alone
        if _UNMERGED_2 in scripts:
            other += _UNMERGED * scripts.count(_UNMERGED_2)
        if _HEBREW_2 in scripts:
            other += _HEBREW * scripts.count(_HEBREW_2)
        if _E0_3 in scripts or _E1_3 in scripts:
            other += r3 * (scripts.count(_E0_3) + scripts.count(_E1_3)) + _by_block(text)
        if _SIGN_2 in scripts:
            other += _LATIN1_SIGN * scripts.count(_SIGN_2) + _C1_EXTRA * len(_C1.findall(raw))
        if _PRIVATE_3 in scripts:
            other += (r3 + _PRIVATE_EXTRA_3) * scripts.count(_PRIVATE_3)
        if _SOME_PRIVATE_3 in scripts:
            private = len(_PRIVATE_USE_EF.findall(raw))
            other += r3 * scripts.count(_SOME_PRIVATE_3) + _PRIVATE_EXTRA_3 * private
        if _SOME_PRIVATE_4 in scripts:
            private = len(_PRIVATE_USE_4.findall(raw))
            other += r4 * scripts.count(_SOME_PRIVATE_4) + _PRIVATE_EXTRA_4 * private
    # Presence is tested on the str (`in` on bytes tries the needle as an int first, a raised
    # and cleared TypeError): the bytes hold the same ASCII. Each escape replaced shortens the
    # text by one.
    if "\\" in text:
        n = len(b)
        b = b.replace(b"\\n", _GAP).replace(b"\\t", _GAP).replace(b"\\r", _GAP)
        units += _ESCAPE * (n - len(b))
    if len(b) > 128:
        units += b.count(_SPACES) + b.count(_TABS)
    if "rw" in text:  # ls -l modes (see _MODE_RWX)
        units += _MODE_RWX * b.count(b"rwx") + _MODE_RW * b.count(b"rw-")
    # Letter runs (as shapes) and punctuation runs, priced in one pass; a KeyError means a
    # piece not seen before (`map(dict.__getitem__, ...)` stays in C, a dict subclass with
    # __missing__ would not be as fast).
    shapes = b.translate(_SHAPE).replace(b"S", b" S")
    pieces = b" ".join((shapes, b.translate(_PUNCT))).split()
    try:
        units += sum(map(_price, pieces))
    except KeyError:
        units += _price_new(_PIECES, pieces, _piece_cost)
    # The lanes (see _NOW), character i at bits 8i..8i+7 of each integer; `nxt` holds the next
    # character's bits at each character, `prev` the previous one's. Lane 7 needs no next
    # character, so it holds at the last one too.
    n = len(b)
    ones, ones7, ones15, ones128 = _ONES[n] if n < _SMALL else _ones(n)
    now = _from_bytes(b.translate(_NOW), "little")
    nxt = (_from_bytes(b.translate(_NEXT), "little") >> 8) | ones128
    prev = (_from_bytes(b.translate(_AFTER), "little") << 8) | _AT_START
    hits = now & nxt & prev
    if hits & ones7:
        slash = (hits >> 2) & ones
        units += _QUOTED * (hits & ones).bit_count() + _DOTTED * ((hits >> 1) & ones).bit_count()
        if slash:
            long_slash = slash & (nxt >> 8) & (nxt >> 16) & (nxt >> 24) & (nxt >> 32)
            units += _SLASHED * slash.bit_count() + _SLASHED_LONG * long_slash.bit_count()
            units += _segments_cost(_PATH_SEGMENT.findall(b))
    if "'" in text:
        units += _CONTRACTED * ((hits >> 3) & ones).bit_count()
    units += ((hits >> 4) & ones15).bit_count()  # lanes 4-7: a pre-token each
    # Digits go in groups of up to three, so a run of n is ceil(n / 3) pre-tokens: lane 7
    # counted each run once; add its 4th and 7th digit and a third of each from the 10th on.
    # (Cheap tests first, a run at all then one of four: these few integer operations cost
    # more than they save.)
    if hits & ones128 and b.translate(_DIGITS).find(_FOUR_DIGITS) >= 0:
        digit = (now >> 7) & ones
        d3 = digit & (digit << 8) & (digit << 16)
        d4 = d3 & (digit << 24)
        d7 = d4 & (d4 << 24)
        units += ((d4 & ~(digit << 32)) | (d7 & ~(digit << 56))).bit_count()
        units += (d7 & (d3 << 56)).bit_count() / 3
    # No o200k token is shorter than a UTF-8 byte (what the quick first counts rely on): a
    # text whose pieces are each priced high (``dM7`` repeated) is held to that.
    if units + other > size:
        units = size - other
    return units, other


# Texts up to _SCAN_LIMIT chars are scanned whole; longer ones through _WINDOWS evenly spaced
# windows of _WINDOW chars, extrapolated by length, so a 10 MB tool output costs what an 8 KB
# one does (a new result near the budget is counted in full on the call it arrives: 0.4 ms,
# where 16 windows of 1 KB took 0.7; the check below reads a text of up to 64 KB once more,
# in C, at about 1.7 us a KB). Windows can miss what lies between them: a text of up to
# _WHOLE_UNEVEN chars is scanned whole instead when they disagree by more than _UNEVEN (a dense
# stretch under one of them) or when, together, they are not made like the whole text
# (`_unlike`): dense content (base64, hex, CJK, emoji, binary, tables, minified JSON, random
# mixed-case words) placed only between them. Sampled from 8 KB with no such check, a 9-16 KB
# result built that way went out 12-85 % over its estimate, over the budget, with no event
# (hostile run DX). Random lowercase words between words still pass it (about 2x prose's
# tokens a character). On the corpus's 23 texts over 16 KB the windows agree within 1.1-2.0x,
# their estimate moves by 1.5 points against the whole scan's (median; at most 2.7), and none
# is scanned whole.
_SCAN_LIMIT = 16384
_WINDOWS = 16
_WINDOW = 512
_UNEVEN = 2.0
_WHOLE_UNEVEN = 65536
_UNLIKE = 1.5  # how many times the windows' share of a kind of character may be off
_UNLIKE_SHARE = 0.01  # ... give or take this share of the text
_NOT_DIGITS = bytes(c for c in range(256) if not 0x30 <= c <= 0x39)
_NOT_UPPER = bytes(c for c in range(256) if not 0x41 <= c <= 0x5A)


def _shares(text: str) -> tuple[float, float, float, float]:
    """Shares of ``text``'s UTF-8 bytes that are spaces, digits, capitals and beyond ASCII:
    what sets an o200k text's tokens per character apart (dense text has few spaces, many
    digits, capitals mixed in, or many bytes a character), in C at about a nanosecond and a
    half a character."""
    raw = text.encode("utf-8", "surrogatepass")
    n = len(raw) or 1
    return (
        raw.count(b" ") / n,
        len(raw.translate(None, _NOT_DIGITS)) / n,
        len(raw.translate(None, _NOT_UPPER)) / n,
        (n - len(text)) / n,
    )


def _unlike(text: str, windows: str) -> bool:
    """Whether the windows (joined) are not made like the whole text: a kind of character
    (`_shares`) that one of them has over `_UNLIKE` times the other's share, plus
    `_UNLIKE_SHARE`."""
    return any(
        a > _UNLIKE * b + _UNLIKE_SHARE or b > _UNLIKE * a + _UNLIKE_SHARE
        for a, b in zip(_shares(text), _shares(windows), strict=True)
    )


def _scan_windows(text: str) -> tuple[float, float]:
    n = len(text)
    step = (n - _WINDOW) / (_WINDOWS - 1)
    pieces = [text[int(i * step) : int(i * step) + _WINDOW] for i in range(_WINDOWS)]
    parts = [_scan(piece) for piece in pieces]
    if n <= _WHOLE_UNEVEN:
        sizes = [units + other for units, other in parts]
        if max(sizes) > _UNEVEN * min(sizes) or _unlike(text, "".join(pieces)):
            return _scan(text)
    scale = n / (_WINDOWS * _WINDOW)
    return sum(u for u, _ in parts) * scale, sum(o for _, o in parts) * scale


# Tokens per unit for each slot: the units already are o200k tokens (one class slot per
# `ContentClass`, then non-ASCII text), so every default weight is 1.
_DEFAULT_WEIGHTS = (1.0,) * (len(CLASS_ORDER) + 1)
_ESTIMATOR_SLOTS = (*(c.value for c in CLASS_ORDER), "non_ascii")
_CLASS_INDEX = {c: i for i, c in enumerate(CLASS_ORDER)}

EXACT_BELOW = 256
"""Texts up to this many characters cost about as much to encode with tiktoken as to estimate
(a few microseconds), and are where an estimate is furthest off in relative terms: what
`default_estimator` counts exactly when tiktoken is installed."""

_encode: Callable[[str], list[int]] | None = None
_encode_loaded = False
_encode_lock = threading.Lock()


def _exact_encode() -> Callable[[str], list[int]] | None:
    """tiktoken's o200k ``encode``, loaded on first use; None without tiktoken (the pure
    Python encoder the ``tokenizer`` extra also ships costs far more than an estimate)."""
    if not _encode_loaded:
        load_exact_encoder()
    return _encode


def load_exact_encoder() -> None:
    """Load tiktoken's o200k encoder for the exact counts of short texts (about half a
    second, once per process; callers at the same time wait for the one load).
    `ContextManager` runs this in a worker thread when entered, so the event loop never
    waits for it and every count a session makes is the same whenever the load finished."""
    global _encode, _encode_loaded
    with _encode_lock:
        if _encode_loaded:
            return
        try:
            from agentctx.tokens.exact import _encoder

            backend, encode = _encoder("o200k_base")
            _encode = encode if backend == "tiktoken" else None
        except ImportError:  # MissingExtraError: neither tokenizer package is installed
            _encode = None
        finally:
            _encode_loaded = True


def exact_encoder_needed(counter: object) -> bool:
    """Whether ``counter`` counts short texts exactly with an encoder not loaded yet."""
    return (
        isinstance(counter, Estimator)
        and counter.exact_below > 0
        and not _encode_loaded
        and _tiktoken_installed()
    )


def _tiktoken_installed() -> bool:
    """Whether tiktoken can be imported (checked without importing it)."""
    return importlib.util.find_spec("tiktoken") is not None


@dataclass(frozen=True, slots=True)
class Estimator:
    """Estimates o200k-like token counts with bounded work per text.

    ``Estimator().count(text)`` needs no tokenizer, is deterministic and never 0 for a
    non-empty text. ``features(text)`` gives the per-slot units (one slot per `ContentClass`,
    then non-ASCII text) and ``weights`` the tokens per unit; ``scaled(multipliers)`` is how
    calibration adjusts them. While every class slot has the same weight (the default),
    ``count`` does not classify the text.

    With ``exact_below=n``, texts of at most ``n`` characters are counted with tiktoken's
    o200k encoder instead, when tiktoken is installed (the ``tokenizer`` extra; it is loaded
    on the first such text, which takes about half a second); without it they are estimated
    as any other. `default_estimator` sets it to `EXACT_BELOW` when tiktoken is there.
    """

    weights: tuple[float, ...] = _DEFAULT_WEIGHTS
    exact_below: int = 0
    _uniform: bool = field(init=False, repr=False, compare=False)
    _unscaled: bool = field(init=False, repr=False, compare=False)  # class weights all 1

    def __post_init__(self) -> None:
        if len(self.weights) != len(_ESTIMATOR_SLOTS) or min(self.weights) <= 0:
            raise ConfigError(f"Estimator needs {len(_ESTIMATOR_SLOTS)} positive weights")
        if self.exact_below < 0:
            raise ConfigError(f"Estimator needs exact_below >= 0, got {self.exact_below}")
        classes = self.weights[:-1]
        object.__setattr__(self, "_uniform", max(classes) == min(classes))
        object.__setattr__(self, "_unscaled", max(classes) == min(classes) == 1.0)

    @property
    def slots(self) -> tuple[str, ...]:
        """``("code", "json", "shell", "prose", "log", "non_ascii")``."""
        return _ESTIMATOR_SLOTS

    def _units(self, text: str) -> tuple[float, float]:
        n = len(text)
        if n <= self.exact_below:
            encode = _encode if _encode_loaded else _exact_encode()
            if encode is not None:
                return float(len(encode(text))), 0.0
        return _scan(text) if n <= _SCAN_LIMIT else _scan_windows(text)

    def features(self, text: str, kind: ContentClass | None = None) -> tuple[float, ...]:
        """Units per slot: the text's class slot holds its ASCII units, the last non-ASCII."""
        if not text:
            return (0.0,) * len(_ESTIMATOR_SLOTS)
        units, other = self._units(text)
        out = [0.0] * len(_ESTIMATOR_SLOTS)
        out[_CLASS_INDEX[kind or classify(text)]] = units
        out[-1] = other
        return tuple(out)

    def count(self, text: str, kind: ContentClass | None = None) -> int:
        """Estimated tokens of ``text`` (``kind`` skips classification)."""
        n = len(text)
        if not n:
            return 0
        if n <= self.exact_below:
            if self._unscaled:
                # The exact count as it is: on texts this short the weighing costs a tenth of
                # tiktoken's own time.
                encode = _encode if _encode_loaded else _exact_encode()
                if encode is not None:
                    return len(encode(text))
            units, other = self._units(text)
        else:  # `_units` inlined: on short texts the call is a tenth of the estimate
            units, other = _scan(text) if n <= _SCAN_LIMIT else _scan_windows(text)
        weights = self.weights
        if kind is not None:
            rate = weights[_CLASS_INDEX[kind]]
        elif self._uniform:
            rate = weights[0]
        else:
            rate = weights[_CLASS_INDEX[classify(text)]]
        tokens = round(rate * units + weights[-1] * other)
        return tokens if tokens > 0 else 1

    def scaled(self, multipliers: Sequence[float]) -> Estimator:
        """A copy with each slot's weight multiplied by the matching multiplier."""
        weights = tuple(w * m for w, m in zip(self.weights, multipliers, strict=True))
        return Estimator(weights, self.exact_below)


def default_estimator() -> Estimator:
    """What `MessageCounter()` counts with: ``Estimator(exact_below=EXACT_BELOW)`` when
    tiktoken is installed, else ``Estimator()``."""
    return Estimator(exact_below=EXACT_BELOW if _tiktoken_installed() else 0)


# ---------------------------------------------------------------------------------------
# Images

# Anthropic: tokens = width * height / 750 after downscaling to a long edge of at most 1568 px
# and at most ~1.15 megapixels, so no image costs more than ~1600 tokens. Images whose size
# cannot be read (URLs, unknown formats, truncated data) are charged that maximum.
_MAX_EDGE = 1568
_MAX_PIXELS = 1_150_000
_PIXELS_PER_TOKEN = 750
UNKNOWN_IMAGE_TOKENS = 1600
URL_SAFE_TO_STANDARD = str.maketrans("-_", "+/")
"""For `str.translate`: URL-safe base64 (pydantic-ai's) as standard base64."""
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
    head = block.data[:_HEADER_B64_CHARS].translate(URL_SAFE_TO_STANDARD)  # URL-safe too
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
# JSON


def _compact_encoder() -> Callable[[Any], str]:
    """Compact JSON (no spaces, UTF-8 kept, ``str`` of what JSON cannot hold).

    The C encoder is made once: ``JSONEncoder.encode`` makes one per call (with a set of the
    containers it is in, against cycles), most of the cost of a tool call's small arguments.
    Arguments parsed from JSON hold no cycle; a mapping that does raises `RecursionError`.
    """
    make = getattr(json.encoder, "c_make_encoder", None)  # not in the module's stubs
    if make is None:  # a Python without the C accelerator: the encoder's own path
        return json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=str).encode
    encode = make(None, str, json.encoder.encode_basestring, None, ":", ",", False, False, True)
    return lambda value: "".join(encode(value, 0))


compact_json = _compact_encoder()
"""Compact JSON of a value (no spaces, UTF-8 kept, ``str`` of what JSON cannot hold): the text
that tool call arguments and provider items are counted as."""
