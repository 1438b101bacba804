"""The charts of the replay report (`agentctx.replay.report`): SVG panels as HTML strings.

```python
ids = IdMaker()
html = strategy_panel("llm", report, strategy_color("llm"), ids)
html += history_panel(runs, colors, ids) + cost_panel(runs, colors, ids)
```

A strategy's panel shows the prompt tokens it sent per request against the budget, on a
scale of its own (what would have been sent without compaction is drawn faint and clipped, so
it never squashes the line that matters), the compactions (a triangle: green for a briefing
spliced, amber for the other tiers; hovering shows what was cleared), the prefix-cache breaks
and the requests over budget, and under it the cache reads and writes per request. The
history panel shows the raw history against the budget, the cost panel the input cost
accumulated over the session, one line per strategy.

Every chart is drawn twice, wide (desktops) and narrow (phones); the page's CSS shows one.
Ticks are round and thinned so that labels never overlap (`agentctx.replay.svgplot`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentctx.replay.svgplot import (
    Frame,
    IdMaker,
    area,
    esc,
    money,
    nice_top,
    polyline,
    short_number,
    text_width,
    x_axis,
    x_ticks,
    y_axis,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from agentctx.replay.engine import ReplayReport, RequestRow

__all__ = ["cost_panel", "history_panel", "strategy_color", "strategy_panel"]

WITHOUT = "#9aa0a6"
BUDGET = "#d93025"
SPLICE = "#188038"
COMPACT = "#e8a100"
READ = "#8ab4f8"
WRITE = "#f28b82"
_COLORS = {"llm": "#1a73e8", "pipeline": "#9334e6", "deterministic": "#e37400", "none": "#5f6368"}
_MORE_COLORS = ("#12b5cb", "#e52592", "#188038", "#795548")


def strategy_color(name: str, index: int = 0) -> str:
    """The colour a strategy is drawn in, the same on every panel."""
    return _COLORS.get(name, _MORE_COLORS[index % len(_MORE_COLORS)])


@dataclass(frozen=True, slots=True)
class _Size:
    cls: str
    width: float
    main: float  # height of the tokens plot
    cache: float  # height of the cache plot
    font: float
    hover: bool  # hover bands per request (no use on a phone)


_WIDE = _Size("wide", 640, 220, 64, 12, True)
_NARROW = _Size("narrow", 360, 180, 54, 11, False)


def _shorten(items: Sequence[str], limit: int = 8) -> str:
    shown = "; ".join(items[:limit])
    return shown + (f"; (+{len(items) - limit} more)" if len(items) > limit else "")


def _row_tip(r: RequestRow) -> str:
    tip = (
        f"request {r.number}: {r.tokens_with:,} tokens sent ({r.tokens_without:,} without), "
        f"cache read {r.cache_read:,} / write {r.cache_write:,}, ${r.cost_with:.4f}"
    )
    if r.cache_break:
        tip += "; prefix cache broken"
    if r.over_budget:
        tip += "; over budget"
    what = [*r.actions, *r.notes]
    return tip + (f"; {_shorten(what)}" if what else "")


def _y_ticks(top: float, step: float) -> list[float]:
    count = round(top / step)
    return [k * step for k in range(count + 1)]


def _margins(n: int, labels: Sequence[str], size: _Size) -> tuple[float, float]:
    left = max(text_width(s, size.font) for s in labels) + 12 if labels else 12
    right = max(12.0, text_width(str(max(n, 1)), size.font) / 2 + 6)
    return left, right


def _svg_open(size: _Size, height: float, label: str) -> str:
    return (
        f'<svg class="{size.cls}" xmlns="http://www.w3.org/2000/svg" '
        f'viewBox="0 0 {size.width:g} {height:.0f}" width="100%" role="img" '
        f'aria-label="{esc(label)}" font-family="system-ui, sans-serif" fill="#5f6368">'
    )


def _strategy_svg(
    strategy: str, report: ReplayReport, color: str, size: _Size, ids: IdMaker
) -> str:
    """Prompt tokens per request with compaction against the budget, and cache traffic."""
    rows = report.rows
    n = len(rows)
    budget = report.budget_tokens
    f = size.font
    count = max(2, min(5, int(size.main // (f * 2.4))))
    top, step = nice_top(max([budget, *(r.tokens_with for r in rows)]) * 1.03, count)
    ctop, cstep = nice_top(max([1, *(r.cache_read + r.cache_write for r in rows)]), 2)
    yfmt = short_number
    labels = [yfmt(v) for v in (*_y_ticks(top, step), *_y_ticks(ctop, cstep))]
    left, right = _margins(n, labels, size)
    width = size.width - left - right
    t = 8.0
    main = Frame(left, t, width, size.main, 1, max(n, 1), 0, top)
    gap = f * 2.8  # room for the cache plot's caption between the two plots
    cache = Frame(left, main.bottom + gap, width, size.cache, 1, max(n, 1), 0, ctop)
    height = cache.bottom + f + 12
    clip = ids.take("clip")
    out = [
        _svg_open(size, height, f"{strategy}: prompt tokens per request"),
        f'<defs><clipPath id="{clip}"><rect x="{left:.1f}" y="{t - 1:.1f}" '
        f'width="{width:.1f}" height="{size.main + 2:.1f}"/></clipPath></defs>',
        y_axis(main, _y_ticks(top, step), f, yfmt),
        y_axis(cache, _y_ticks(ctop, cstep), f, yfmt),
        f'<text class="caption" x="{left:.1f}" y="{cache.top - 6:.1f}" font-size="{f - 1:g}">'
        "cache reads and writes per request</text>",
    ]
    half = width / max(n - 1, 1) / 2
    if size.hover:
        out.append('<g class="hover">')
        for r in rows:
            x = main.x(r.number)
            out.append(
                f'<rect x="{x - half:.1f}" y="{t:.1f}" width="{2 * half:.2f}" '
                f'height="{cache.bottom - t:.1f}" fill="transparent">'
                f"<title>{esc(_row_tip(r))}</title></rect>"
            )
        out.append("</g>")
    for r in rows:
        if r.cache_break:
            x = main.x(r.number)
            out.append(
                f'<line class="marker cache-break" x1="{x:.1f}" x2="{x:.1f}" y1="{t:.1f}" '
                f'y2="{cache.bottom:.1f}" stroke="{BUDGET}" stroke-opacity="0.45" '
                f'stroke-width="1.5"><title>{esc(_row_tip(r))}</title></line>'
            )
    reads = [(r.number, r.cache_read) for r in rows]
    both = [(r.number, r.cache_read + r.cache_write) for r in rows]
    out.append(area(cache, reads, color=READ, cls="series cache-read", title="cache reads"))
    out.append(area(cache, both, reads, color=WRITE, cls="series cache-write", title="writes"))
    by = main.y(budget)
    out.append(
        f'<line id="{ids.take("budget")}" class="budget" x1="{left:.1f}" '
        f'x2="{main.right:.1f}" y1="{by:.1f}" y2="{by:.1f}" stroke="{BUDGET}" '
        f'stroke-width="1.5" stroke-dasharray="6 4"><title>budget {budget:,} tokens</title>'
        "</line>"
    )
    out.append(
        polyline(
            main,
            [(r.number, r.tokens_without) for r in rows],
            color=WITHOUT,
            cls="series without",
            width=1.5,
            dash="4 3",
            title="without compaction",
            id=ids.take("without"),
            clip=clip,
        )
    )
    out.append(
        polyline(
            main,
            [(r.number, r.tokens_with) for r in rows],
            color=color,
            cls="series with",
            width=2.2,
            title=f"{strategy}: tokens sent",
            id=ids.take("with"),
        )
    )
    for r in rows:
        x, y = main.x(r.number), main.y(r.tokens_with)
        if r.over_budget:
            # A tick on the plot's floor, not a ring on the line: with no compaction every
            # request may be over, and rings would bury the line.
            out.append(
                f'<rect class="marker over" x="{x - max(half, 1.0):.1f}" '
                f'y="{main.bottom - 5:.1f}" width="{2 * max(half, 1.0):.2f}" height="5" '
                f'fill="{BUDGET}"><title>{esc(_row_tip(r))}</title></rect>'
            )
        if r.actions:
            kind, fill = ("summarized", SPLICE) if r.summarized else ("compacted", COMPACT)
            out.append(
                f'<path class="marker {kind}" d="M{x:.1f},{y - 3:.1f} l-6,-11 h12 z" '
                f'fill="{fill}" stroke="white" stroke-width="0.8">'
                f"<title>{esc(_row_tip(r))}</title></path>"
            )
    out.append(x_axis(cache, x_ticks(n, width, f), f))
    out.append("</svg>")
    return "".join(out)


@dataclass(frozen=True, slots=True)
class _Series:
    cls: str
    title: str
    color: str
    values: Sequence[float]
    dash: str | None = None


def _lines_svg(
    label: str,
    series: Sequence[_Series],
    size: _Size,
    ids: IdMaker,
    *,
    fmt: Callable[[float], Callable[[float], str]],
    budget: int | None = None,
    fill: bool = False,
) -> str:
    """Lines per request on one scale that fits them all (and the ``budget``, if given);
    ``fill`` shades the area under the first."""
    n = max((len(s.values) for s in series), default=0)
    f = size.font
    count = max(2, min(5, int(size.main // (f * 2.4))))
    highest = max([budget or 0, *(v for s in series for v in s.values)])
    top, step = nice_top(highest * 1.03, count)
    yfmt = fmt(step)
    ticks = _y_ticks(top, step)
    left, right = _margins(n, [yfmt(v) for v in ticks], size)
    width = size.width - left - right
    frame = Frame(left, 8.0, width, size.main, 1, max(n, 1), 0, top)
    out = [_svg_open(size, frame.bottom + f + 12, label), y_axis(frame, ticks, f, yfmt)]
    for k, s in enumerate(series):
        points = list(enumerate(s.values, start=1))
        if fill and k == 0:
            out.append(area(frame, points, color=s.color, cls="area", opacity=0.18))
        dash = s.dash
        if dash is None and any(_coincide(s.values, e.values, top) for e in series[:k]):
            # Two strategies that did (nearly) the same: dashed over the earlier one, so
            # both colours show instead of one hiding the other.
            dash = "6 6"
        out.append(
            polyline(frame, points, color=s.color, cls=s.cls, width=2.4, dash=dash, title=s.title)
        )
    if budget is not None:
        by = frame.y(budget)
        out.append(
            f'<line id="{ids.take("budget")}" class="budget" x1="{left:.1f}" '
            f'x2="{frame.right:.1f}" y1="{by:.1f}" y2="{by:.1f}" stroke="{BUDGET}" '
            f'stroke-width="1.5" stroke-dasharray="6 4"><title>budget {budget:,} tokens</title>'
            "</line>"
        )
    out.append(x_axis(frame, x_ticks(n, width, f), f))
    out.append("</svg>")
    return "".join(out)


def _coincide(a: Sequence[float], b: Sequence[float], scale: float) -> bool:
    """Whether two lines would be drawn on top of each other: within 1 % of the axis at 90 %
    of the points."""
    if len(a) != len(b) or not a:
        return False
    close = sum(abs(x - y) <= 0.01 * scale for x, y in zip(a, b, strict=True))
    return close >= 0.9 * len(a)


def _swatch(kind: str, color: str) -> str:
    return f'<i class="sw {kind}" style="--c:{color}"></i>'


def _legend(items: Sequence[tuple[str, str, str]]) -> str:
    inner = "".join(f"<span>{_swatch(k, c)}{esc(label)}</span>" for k, c, label in items)
    return f'<div class="legend">{inner}</div>'


def _both(draw: Callable[[_Size], str]) -> str:
    return draw(_WIDE) + draw(_NARROW)


def _panel(
    caption: str, note: str, charts: str, legend: str, *, hint: bool = False, more: str = ""
) -> str:
    # Hovering is for a pointer: the hint is hidden on a phone (see the page's CSS).
    extra = ' <span class="hint">Hover a request or a marker for what was sent and cleared.</span>'
    return (
        f'<figure class="panel"><figcaption>{esc(caption)} <small>{esc(note)}'
        f"{extra if hint else ''}</small></figcaption>{charts}{legend}{more}</figure>"
    )


def _briefings(report: ReplayReport) -> str:
    """The briefings spliced, folded (an HTML ``details``, no script needed to open it)."""
    spliced = [(r.number, t) for r in report.rows for t in r.briefings]
    if not spliced:
        return ""
    n = len(spliced)
    inner = "".join(
        f"<h4>spliced at request {number}</h4><pre>{esc(text)}</pre>" for number, text in spliced
    )
    return (
        f'<details class="briefings"><summary>{n} briefing{"s" if n != 1 else ""} spliced: '
        f"what the summarizer wrote</summary>{inner}</details>"
    )


def strategy_panel(strategy: str, report: ReplayReport, color: str, ids: IdMaker) -> str:
    """The panel of one replay: tokens sent per request against the budget, cache traffic."""
    rows = report.rows
    charts = _both(lambda size: _strategy_svg(strategy, report, color, size, ids))
    peak = max((r.tokens_without for r in rows), default=0)
    shown = max([report.budget_tokens, *(r.tokens_with for r in rows)]) * 1.03
    without = "without compaction"
    if peak > shown:
        without += f" (up to {short_number(float(f'{peak:.2g}'))}, off the top)"
    items = [
        ("line", color, "tokens sent"),
        ("dash", WITHOUT, without),
        ("dash", BUDGET, f"budget {report.budget_tokens:,}"),
    ]
    # Only the markers that occur: a legend of things that are not there is noise.
    if any(r.actions and r.summarized for r in rows):
        items.append(("tri", SPLICE, "briefing spliced"))
    if any(r.actions and not r.summarized for r in rows):
        items.append(("tri", COMPACT, "other compaction"))
    if any(r.cache_break for r in rows):
        items.append(("vline", BUDGET, "cache break"))
    if any(r.over_budget for r in rows):
        items.append(("box", BUDGET, "over budget (on the floor)"))
    items += [("box", READ, "cache read"), ("box", WRITE, "cache write")]
    note = f"{len(rows)} requests."
    caption = f"{strategy}: prompt tokens per request"
    return _panel(caption, note, charts, _legend(items), hint=True, more=_briefings(report))


def history_panel(
    runs: Sequence[tuple[str, ReplayReport]], colors: dict[str, str], ids: IdMaker
) -> str:
    """The raw history (what every request would have sent) against the budget, with what
    each strategy sent."""
    first = runs[0][1]
    raw = _Series(
        "series without", "without compaction", WITHOUT, [r.tokens_without for r in first.rows]
    )
    sent = [
        _Series(f"series with {s}", f"{s}: tokens sent", colors[s], [x.tokens_with for x in r.rows])
        for s, r in runs
    ]
    charts = _both(
        lambda size: _lines_svg(
            "prompt tokens without compaction",
            [raw, *sent],
            size,
            ids,
            fmt=lambda step: short_number,
            budget=first.budget_tokens,
            fill=True,
        )
    )
    legend = [("box", WITHOUT, "without compaction"), *(("line", colors[s], s) for s, _ in runs)]
    legend.append(("dash", BUDGET, "budget"))
    note = "Prompt tokens per request if nothing were compacted."
    return _panel("The raw history against the budget", note, charts, _legend(legend))


def cost_panel(
    runs: Sequence[tuple[str, ReplayReport]], colors: dict[str, str], ids: IdMaker
) -> str:
    """The simulated input cost accumulated request by request, per strategy and without."""
    first = runs[0][1]
    costs = [
        _Series(
            "series cost without",
            "without compaction",
            WITHOUT,
            _cumulative([x.cost_without for x in first.rows]),
            dash="5 4",
        )
    ]
    costs += [
        _Series(f"series cost {s}", s, colors[s], _cumulative([x.cost_with for x in r.rows]))
        for s, r in runs
    ]
    charts = _both(lambda size: _lines_svg("cumulative input cost", costs, size, ids, fmt=money))
    legend = [("dash", WITHOUT, "without compaction"), *(("line", colors[s], s) for s, _ in runs)]
    note = "Cumulative, in USD, at the simulated prefix cache."
    return _panel("Input cost over the session", note, charts, _legend(legend))


def _cumulative(values: Sequence[float]) -> list[float]:
    out: list[float] = []
    total = 0.0
    for v in values:
        total += v
        out.append(total)
    return out
