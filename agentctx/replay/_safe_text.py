"""Transcript text made safe to show: on a terminal, in a page, in any encoding.

A replayed transcript is someone else's data: a tool name, a file path or a briefing that
quotes the user can hold an escape sequence (``ESC [2J`` clears the screen, ``ESC ]8;;`` hides
a link behind text), a bidirectional override that makes text read other than it is, or a
lone surrogate that no encoding writes.
"""

from __future__ import annotations

import re

__all__ = ["printable"]

# C0 controls but tab and newline, DEL and C1, the bidirectional overrides and isolates,
# lone surrogates.
_ACTING = "\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_UNSAFE = re.compile(f"[{_ACTING}]")
_UNSAFE_IN_A_LINE = re.compile(f"[\t\n{_ACTING}]")


def _escaped(m: re.Match[str]) -> str:
    return f"\\u{ord(m.group()):04x}" if m.group() > "\xff" else f"\\x{ord(m.group()):02x}"


def printable(text: str, *, one_line: bool = False) -> str:
    """``text`` with every character that would act rather than show (see the module doc)
    written as its Python escape (``\\x1b``, ``\\u202e``, ``\\ud800``). ``one_line``: tabs and
    line breaks too, for a name or a table cell (a file or tool name holding a line break
    would print a line of its own: a forged row)."""
    return (_UNSAFE_IN_A_LINE if one_line else _UNSAFE).sub(_escaped, text)
