"""Small SVG plotting helpers for the replay report: round ticks, labels that never overlap,
frames, lines and areas, as strings (no dependencies, no JavaScript).

```python
frame = Frame(left=48, top=10, width=560, height=200, x0=1, x1=n, y0=0, y1=top)
parts = [y_axis(frame, y_ticks, size=12, fmt=short_number),
         x_axis(frame, x_ticks(n, frame.width, size=12), size=12),
         polyline(frame, list(enumerate(values, start=1)), color="#1a73e8", cls="series with")]
```

Ticks are multiples of a 1-2-5 step (`nice_step`). Labels are spaced from their estimated
width (`text_width`: `CHAR_WIDTH` of the font size per character, generous for sans-serif
digits), so that at any number of requests neighbouring labels keep `LABEL_GAP` apart: long
replays get fewer labels, never crowded ones.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentctx.replay._safe_text import printable

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = [
    "CHAR_WIDTH",
    "LABEL_GAP",
    "Frame",
    "IdMaker",
    "area",
    "esc",
    "money",
    "nice_step",
    "nice_top",
    "polyline",
    "short_number",
    "text_width",
    "x_axis",
    "x_ticks",
    "y_axis",
]

CHAR_WIDTH = 0.62
"""Width of one character of a label, as a share of the font size (an upper bound for the
digits of common sans-serif fonts, so label boxes estimated with it are never too small)."""

LABEL_GAP = 10.0
"""Least space between two neighbouring tick labels, in SVG units."""


def esc(text: str) -> str:
    """``text`` escaped for SVG/HTML text and attribute values, what would act rather than
    show written as its Python escape (`printable`)."""
    return html.escape(printable(text), quote=True)


def text_width(text: str, size: float) -> float:
    """The estimated width of ``text`` at font ``size``."""
    return len(text) * size * CHAR_WIDTH


def nice_step(raw: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten that is at least ``raw`` (> 0)."""
    if raw <= 0 or not math.isfinite(raw):
        return 1.0
    power = 10.0 ** math.floor(math.log10(raw))
    for m in (1.0, 2.0, 5.0, 10.0):
        if m * power >= raw * (1 - 1e-9):
            return m * power
    return 10.0 * power  # pragma: no cover - the loop always returns


def nice_top(value: float, count: int) -> tuple[float, float]:
    """``(top, step)``: a round axis top >= ``value`` reached in at most ``count`` steps of
    a 1-2-5 size (``value`` 0 gives a top of 1)."""
    if value <= 0:
        return 1.0, 1.0
    step = nice_step(value / max(1, count))
    return math.ceil(value / step - 1e-9) * step, step


def short_number(v: float) -> str:
    """``0``, ``500``, ``20k``, ``1.5M``: a tick label for a token count."""
    if v >= 1_000_000:
        return f"{v / 1_000_000:g}M"
    if v >= 1_000:
        return f"{v / 1_000:g}k"
    return f"{v:g}"


def money(step: float) -> Callable[[float], str]:
    """A tick formatter for dollars with as many decimals as ``step`` needs (``$0.50``)."""
    decimals = 0 if step >= 1 else max(2, -math.floor(math.log10(step) + 1e-9))
    return lambda v: f"${v:.{decimals}f}"


def x_ticks(n: int, width: float, size: float) -> list[int]:
    """Request numbers to label on an axis of ``width`` for requests 1..``n``: multiples of
    a 1-2-5 step, spaced so that neighbouring labels keep `LABEL_GAP` apart."""
    if n <= 1:
        return [1] if n == 1 else []
    label = text_width(str(n), size) + LABEL_GAP
    step = int(nice_step(max(1.0, (n - 1) * label / max(width, 1.0))))
    if step == 1:
        return list(range(1, n + 1))
    return list(range(step, n + 1, step))


@dataclass(frozen=True, slots=True)
class Frame:
    """A plot area: its box in the SVG and the data ranges it shows."""

    left: float
    top: float
    width: float
    height: float
    x0: float
    x1: float
    y0: float
    y1: float

    @property
    def right(self) -> float:
        return self.left + self.width

    @property
    def bottom(self) -> float:
        return self.top + self.height

    def x(self, v: float) -> float:
        """The SVG x of data ``v`` (the middle when the range is one point)."""
        if self.x1 <= self.x0:
            return self.left + self.width / 2
        return self.left + self.width * (v - self.x0) / (self.x1 - self.x0)

    def y(self, v: float) -> float:
        """The SVG y of data ``v``."""
        span = self.y1 - self.y0 or 1.0
        return self.bottom - self.height * (v - self.y0) / span


class IdMaker:
    """Unique ids for one page: the first ``take("with")`` is ``with``, then ``with-2``..."""

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}

    def take(self, name: str) -> str:
        n = self._seen.get(name, 0) + 1
        self._seen[name] = n
        return name if n == 1 else f"{name}-{n}"


def _f(v: float) -> str:
    return f"{v:.1f}"


def x_axis(
    frame: Frame, values: Sequence[int], size: float, fmt: Callable[[float], str] = str
) -> str:
    """Tick marks and labels under ``frame`` at the x ``values``."""
    out = [f'<g class="axis x" font-size="{size:g}">']
    y = frame.bottom
    for v in values:
        x = _f(frame.x(v))
        out.append(
            f'<line x1="{x}" x2="{x}" y1="{_f(y)}" y2="{_f(y + 4)}" stroke="#80868b"/>'
            f'<text class="tick x" x="{x}" y="{_f(y + 5 + size)}" font-size="{size:g}" '
            f'text-anchor="middle">{esc(fmt(v))}</text>'
        )
    out.append("</g>")
    return "".join(out)


def y_axis(frame: Frame, values: Sequence[float], size: float, fmt: Callable[[float], str]) -> str:
    """Grid lines across ``frame`` and labels left of it at the y ``values``."""
    out = [f'<g class="axis y" font-size="{size:g}">']
    for v in values:
        y = _f(frame.y(v))
        out.append(
            f'<line x1="{_f(frame.left)}" x2="{_f(frame.right)}" y1="{y}" y2="{y}" '
            f'stroke="#e8eaed"/>'
            f'<text class="tick y" x="{_f(frame.left - 6)}" y="{_f(frame.y(v) + size * 0.35)}" '
            f'font-size="{size:g}" text-anchor="end">{esc(fmt(v))}</text>'
        )
    out.append(
        f'<line x1="{_f(frame.left)}" x2="{_f(frame.right)}" y1="{_f(frame.bottom)}" '
        f'y2="{_f(frame.bottom)}" stroke="#80868b"/></g>'
    )
    return "".join(out)


def _points(frame: Frame, points: Sequence[tuple[float, float]]) -> str:
    return " ".join(f"{_f(frame.x(x))},{_f(frame.y(y))}" for x, y in points)


def polyline(
    frame: Frame,
    points: Sequence[tuple[float, float]],
    *,
    color: str,
    cls: str,
    width: float = 2.0,
    dash: str | None = None,
    title: str | None = None,
    id: str | None = None,
    clip: str | None = None,
) -> str:
    """A line through ``points`` (data coordinates) with a hover ``title``."""
    attrs = f' id="{id}"' if id else ""
    attrs += f' stroke-dasharray="{dash}"' if dash else ""
    attrs += f' clip-path="url(#{clip})"' if clip else ""
    inner = f"<title>{esc(title)}</title>" if title else ""
    return (
        f'<polyline class="{cls}"{attrs} fill="none" stroke="{color}" stroke-width="{width:g}" '
        f'stroke-linejoin="round" points="{_points(frame, points)}">{inner}</polyline>'
    )


def area(
    frame: Frame,
    upper: Sequence[tuple[float, float]],
    lower: Sequence[tuple[float, float]] | None = None,
    *,
    color: str,
    cls: str,
    opacity: float = 1.0,
    title: str | None = None,
) -> str:
    """The area between ``upper`` and ``lower`` (default: the frame's floor, ``y0``)."""
    if not upper:
        return ""
    base = lower if lower is not None else [(x, frame.y0) for x, _ in upper]
    points = _points(frame, [*upper, *reversed(base)])
    inner = f"<title>{esc(title)}</title>" if title else ""
    return (
        f'<polygon class="{cls}" fill="{color}" fill-opacity="{opacity:g}" stroke="none" '
        f'points="{points}">{inner}</polygon>'
    )
