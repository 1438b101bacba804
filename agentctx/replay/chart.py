"""Charts of a replay: prompt tokens per request with and without compaction.

```python
report = await replay(messages, budget=budget, strategy=strategy)
write_chart(report, "replay.html")   # self-contained HTML with inline SVG (no JS, no network)
write_chart(report, "replay.png")    # needs the chart extra (matplotlib)
```

Both show the two series, the hard budget as a dashed line, and a marker on every request
where a compaction happened (a briefing spliced, or the deterministic tiers / pipeline acted)
and where the prefix cache broke.
"""

from __future__ import annotations

import html
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentctx.errors import AgentCtxError, MissingExtraError

if TYPE_CHECKING:
    from agentctx.replay.engine import ReplayReport, RequestRow

__all__ = ["ChartError", "render_html", "write_chart"]


class ChartError(AgentCtxError, ValueError):
    """The chart cannot be written: unknown format, or matplotlib missing for a PNG."""


_W, _H = 900, 420
_L, _R, _T, _B = 70, 20, 40, 60  # margins
_WITHOUT = "#9aa0a6"
_WITH = "#1a73e8"
_BUDGET = "#d93025"
_SPLICE = "#188038"
_COMPACT = "#f29900"


def _kind(row: RequestRow) -> str | None:
    if row.summarized:
        return "summarized"
    if row.actions:
        return "compacted"
    return None


def render_html(report: ReplayReport, title: str = "agentctx replay") -> str:
    """The chart as a standalone HTML page with one inline SVG."""
    rows = report.rows
    n = max(len(rows), 1)
    top = max([report.budget_tokens, *(r.tokens_without for r in rows), 1])
    top = int(top * 1.08)
    pw, ph = _W - _L - _R, _H - _T - _B

    def x(i: int) -> float:
        return _L + (pw * i / (n - 1) if n > 1 else pw / 2)

    def y(v: float) -> float:
        return _T + ph - ph * v / top

    def line(values: list[int]) -> str:
        return " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values))

    parts: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
        f'viewBox="0 0 {_W} {_H}" font-family="sans-serif" font-size="12">',
        f'<rect x="0" y="0" width="{_W}" height="{_H}" fill="white"/>',
        f'<text x="{_W / 2}" y="22" text-anchor="middle" font-size="15">'
        f"{html.escape(title)}</text>",
    ]
    for k in range(6):  # y grid and labels
        v = top * k / 5
        parts.append(
            f'<line x1="{_L}" x2="{_W - _R}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#eee"/>'
            f'<text x="{_L - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{int(v):,}</text>'
        )
    step = max(1, n // 20)
    for i, r in enumerate(rows):  # x labels
        if i % step == 0 or i == n - 1:
            parts.append(
                f'<text x="{x(i):.1f}" y="{_T + ph + 18}" text-anchor="middle">{r.number}</text>'
            )
    parts.append(
        f'<text x="{_L + pw / 2}" y="{_H - 22}" text-anchor="middle">request</text>'
        f'<text x="16" y="{_T + ph / 2}" text-anchor="middle" '
        f'transform="rotate(-90 16 {_T + ph / 2})">prompt tokens</text>'
    )
    by = y(report.budget_tokens)
    parts.append(
        f'<line id="budget" x1="{_L}" x2="{_W - _R}" y1="{by:.1f}" y2="{by:.1f}" '
        f'stroke="{_BUDGET}" stroke-dasharray="6 4"><title>budget {report.budget_tokens:,} '
        "tokens</title></line>"
    )
    parts.append(
        f'<polyline id="without" fill="none" stroke="{_WITHOUT}" stroke-width="2" '
        f'points="{line([r.tokens_without for r in rows])}"><title>without compaction</title>'
        "</polyline>"
    )
    parts.append(
        f'<polyline id="with" fill="none" stroke="{_WITH}" stroke-width="2.5" '
        f'points="{line([r.tokens_with for r in rows])}"><title>with compaction</title>'
        "</polyline>"
    )
    for i, r in enumerate(rows):
        what = "; ".join((*r.actions, *r.notes))
        tip = html.escape(
            f"request {r.number}: {r.tokens_with:,} tokens with, {r.tokens_without:,} without"
            + (" — cache break" if r.cache_break else "")
            + (f" — {what}" if what else "")
        )
        kind = _kind(r)
        parts.append(
            f'<circle class="point" cx="{x(i):.1f}" cy="{y(r.tokens_with):.1f}" r="3" '
            f'fill="{_WITH}"><title>{tip}</title></circle>'
        )
        if kind is not None:
            color = _SPLICE if kind == "summarized" else _COMPACT
            parts.append(
                f'<path class="marker {kind}" d="M{x(i):.1f},{y(r.tokens_with) - 14:.1f} '
                f'l-6,-10 h12 z" fill="{color}"><title>{tip}</title></path>'
            )
        if r.cache_break:
            parts.append(
                f'<line class="marker cache-break" x1="{x(i):.1f}" x2="{x(i):.1f}" y1="{_T}" '
                f'y2="{_T + ph}" stroke="{_BUDGET}" stroke-opacity="0.35">'
                f"<title>{tip}</title></line>"
            )
    legend = [
        (_WITHOUT, "line", "without compaction"),
        (_WITH, "line", "with compaction"),
        (_BUDGET, "dash", f"budget ({report.budget_tokens:,})"),
        (_SPLICE, "tri", "briefing spliced"),
        (_COMPACT, "tri", "other compaction"),
        (_BUDGET, "vline", "cache break"),
    ]
    lx = _L + 10
    ly = _H - 8
    for color, shape, label in legend:
        if shape == "tri":
            parts.append(f'<path d="M{lx + 8},{ly} l-6,-10 h12 z" fill="{color}"/>')
        elif shape == "vline":
            parts.append(
                f'<line x1="{lx + 8}" x2="{lx + 8}" y1="{ly - 11}" y2="{ly + 1}" '
                f'stroke="{color}" stroke-opacity="0.5" stroke-width="2"/>'
            )
        else:
            dash = ' stroke-dasharray="6 4"' if shape == "dash" else ""
            parts.append(
                f'<line x1="{lx}" x2="{lx + 18}" y1="{ly - 4}" y2="{ly - 4}" stroke="{color}" '
                f'stroke-width="2"{dash}/>'
            )
        parts.append(f'<text x="{lx + 22}" y="{ly}">{html.escape(label)}</text>')
        lx += 26 + 7 * len(label)
    parts.append("</svg>")
    svg = "\n".join(parts)
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n</head>\n<body>\n{svg}\n</body>\n</html>\n"
    )


def _write_png(report: ReplayReport, path: Path, title: str) -> None:
    try:
        # Imported by name: matplotlib is optional and has no stubs here.
        matplotlib: Any = importlib.import_module("matplotlib")
        matplotlib.use("Agg")
        plt: Any = importlib.import_module("matplotlib.pyplot")
    except ImportError as exc:
        raise MissingExtraError("chart", exc.name, needed_by="a .png chart") from exc
    rows = report.rows
    xs = [r.number for r in rows]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    ax.plot(xs, [r.tokens_without for r in rows], color=_WITHOUT, label="without compaction")
    ax.plot(xs, [r.tokens_with for r in rows], color=_WITH, marker=".", label="with compaction")
    ax.axhline(report.budget_tokens, color=_BUDGET, linestyle="--", label="budget")
    for kind, color, label in (
        ("summarized", _SPLICE, "briefing spliced"),
        ("compacted", _COMPACT, "other compaction"),
    ):
        hit = [r for r in rows if _kind(r) == kind]
        if hit:
            ax.scatter(
                [r.number for r in hit],
                [r.tokens_with for r in hit],
                marker="v",
                s=80,
                color=color,
                zorder=3,
                label=label,
            )
    for i, r in enumerate(r for r in rows if r.cache_break):
        ax.axvline(r.number, color=_BUDGET, alpha=0.3, label="cache break" if i == 0 else None)
    ax.set_xlabel("request")
    ax.set_ylabel("prompt tokens")
    ax.set_title(title)
    ax.legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_chart(report: ReplayReport, path: str | Path, title: str = "agentctx replay") -> None:
    """Write the chart to ``path``: ``.html`` (inline SVG) or ``.png`` (needs matplotlib)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in (".html", ".htm"):
        path.write_text(render_html(report, title), encoding="utf-8")
    elif suffix == ".png":
        _write_png(report, path, title)
    else:
        raise ChartError(f"{path}: a chart is .html or .png, not {suffix or 'no extension'!r}")
