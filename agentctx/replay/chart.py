"""Charts of a replay: prompt tokens per request with and without compaction.

```python
report = await replay(messages, budget=budget, strategy=strategy)
write_chart(report, "replay.html")   # the report page (agentctx.replay.report): inline SVG
write_chart(report, "replay.png")    # one matplotlib figure; needs the chart extra
```

The ``.html`` chart is the report page of `agentctx.replay.report` for this one replay (what
``agentctx replay --report`` writes). The ``.png`` shows the two series, the hard budget as a
dashed line, and a marker on every request where a compaction happened (a briefing spliced,
or the deterministic tiers / pipeline acted) and where the prefix cache broke.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentctx.errors import AgentCtxError, MissingExtraError
from agentctx.replay._safe_text import printable
from agentctx.replay.report import Section, render_report

if TYPE_CHECKING:
    from agentctx.replay.engine import ReplayReport, RequestRow

__all__ = ["ChartError", "render_html", "write_chart"]


class ChartError(AgentCtxError, ValueError):
    """The chart cannot be written: unknown format, or matplotlib missing for a PNG."""


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


def render_html(
    report: ReplayReport, title: str = "agentctx replay", *, strategy: str = "with compaction"
) -> str:
    """The replay report page (`agentctx.replay.report`) for one replay."""
    detail = f"{len(report.rows)} requests"
    section = Section(name=title, detail=detail, runs=((strategy, report),))
    return render_report([section], title=title)


def _write_png(report: ReplayReport, path: Path, title: str) -> None:
    try:
        # Imported by name: matplotlib is optional and has no stubs here.
        matplotlib: Any = importlib.import_module("matplotlib")
        matplotlib.use("Agg")
        plt: Any = importlib.import_module("matplotlib.pyplot")
    except ImportError as exc:
        raise MissingExtraError("chart", exc.name, needed_by="a .png chart") from exc
    fig, ax = plt.subplots(figsize=(10, 4.5))
    try:
        _draw(report, ax, title)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)


def _draw(report: ReplayReport, ax: Any, title: str) -> None:
    rows = report.rows
    xs = [r.number for r in rows]
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
    ax.set_title(printable(title), parse_math=False)  # a file name's `$...$` is no formula
    ax.legend(loc="upper left", fontsize="small")


def write_chart(
    report: ReplayReport,
    path: str | Path,
    title: str = "agentctx replay",
    *,
    strategy: str = "with compaction",
) -> None:
    """Write the chart to ``path``: ``.html`` (the report page) or ``.png`` (needs
    matplotlib); ``strategy`` names the replay's strategy on the page."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in (".html", ".htm"):
        path.write_text(render_html(report, title, strategy=strategy), encoding="utf-8")
    elif suffix == ".png":
        _write_png(report, path, title)
    else:
        raise ChartError(f"{path}: a chart is .html or .png, not {suffix or 'no extension'!r}")
