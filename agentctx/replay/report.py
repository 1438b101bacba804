"""The replay report: one self-contained HTML page (inline SVG and CSS, no scripts, nothing
fetched) with the totals and the settings at the top and chart panels per transcript.

```python
outcomes = run_replays(transcripts, ["deterministic", "llm"], settings)
write_report("replay.html", sections_of(outcomes), title="agentctx replay",
             settings=[("context window", "53,000 tokens"), ...])
```

At the top: a card per strategy (tokens saved, cost, cache breaks, requests over budget,
compactions, summarizer share, retention, summed over the transcripts), the comparison
table (`agentctx.replay.compare`, per transcript and in total) and the settings. Then per
transcript a grid of panels (`agentctx.replay.report_charts`): one per strategy, the raw
history against the budget, and the input cost over the session. The grid has two columns
on a desktop and one under 700 px, where the narrow drawing of each chart replaces the wide
one, so the page reads at 1400 px and on a phone alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from agentctx import __version__
from agentctx.replay.compare import COMPARE_COLUMNS, StrategyRow, cells, transcript_name
from agentctx.replay.report_charts import (
    cost_panel,
    history_panel,
    strategy_color,
    strategy_panel,
)
from agentctx.replay.svgplot import IdMaker, esc

if TYPE_CHECKING:
    from collections.abc import Sequence

    from agentctx.replay.engine import ReplayReport
    from agentctx.replay.jobs import Outcome

__all__ = ["Section", "render_report", "sections_of", "write_report"]


@dataclass(frozen=True, slots=True)
class Section:
    """One transcript on the page: its name, a line about it, and its replays by strategy."""

    name: str
    detail: str
    runs: tuple[tuple[str, ReplayReport], ...]


def sections_of(outcomes: Sequence[Outcome]) -> list[Section]:
    """The page's sections for `agentctx.replay.jobs.run_replays`'s outcomes."""
    groups: dict[str, list[Outcome]] = {}
    for o in outcomes:
        groups.setdefault(o.transcript.path, []).append(o)
    out = []
    for path, group in groups.items():
        t = group[0].transcript
        requests = len(group[0].report.rows)
        out.append(
            Section(
                name=transcript_name(t),
                detail=f"{t.format}, {len(t.messages)} messages, {requests} requests ({path})",
                runs=tuple((o.strategy, o.report) for o in group),
            )
        )
    return out


def _section(section: Section, ids: IdMaker) -> str:
    runs = section.runs
    colors = {s: strategy_color(s, k) for k, (s, _) in enumerate(runs)}
    panels = [strategy_panel(s, r, colors[s], ids) for s, r in runs]
    panels += [history_panel(runs, colors, ids), cost_panel(runs, colors, ids)]
    return (
        f'<section class="file"><h2>{esc(section.name)}</h2><p class="lede">'
        f'{esc(section.detail)}</p><div class="grid">{"".join(panels)}</div></section>'
    )


def _totals(sections: Sequence[Section]) -> list[StrategyRow]:
    totals: dict[str, StrategyRow] = {}
    for section in sections:
        for s, r in section.runs:
            row = StrategyRow.of(s, r)
            totals[s] = totals[s] + row if s in totals else row
    return list(totals.values())


def _approx(n: float) -> str:
    """``11.1M``, ``322k``, ``950``: three significant digits at most."""
    for size, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.3g}"


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _card(row: StrategyRow, color: str) -> str:
    change = row.change
    big = "no change" if round(change, 2) == 0 else f"{abs(change):.0%} "
    big += "" if round(change, 2) == 0 else ("more tokens" if change > 0 else "fewer tokens")
    lines = [
        f"{_approx(row.tokens_with)} tokens sent of {_approx(row.tokens_without)}",
        f"${row.cost_with:.2f} input cost, ${row.cost_without:.2f} without",
        f"{_n(row.cache_breaks, 'cache break')} · {row.over_budget} over budget",
        f"{_n(row.compactions, 'compaction')} · {_n(row.splices, 'briefing')} spliced",
    ]
    if row.summaries:
        cost = "?" if row.summary_cost is None else f"${row.summary_cost:.4f}"
        share = f"{row.summary_share:.1%}" if row.summary_share is not None else "?"
        approx = "~" if row.summary_estimated else ""
        lines.append(
            f"summarizer {approx}{cost}, {share} of the spend ({_n(row.summaries, 'request')})"
        )
    if row.retention is not None and row.retention.checks and row.retention.worst is not None:
        mean = row.retention.mean or 0.0
        lines.append(f"retention {row.retention.worst:.0%} at worst, {mean:.0%} on average")
    body = "".join(f"<li>{esc(line)}</li>" for line in lines)
    return (
        f'<div class="card" style="--c:{color}"><div class="name">{esc(row.strategy)}</div>'
        f'<div class="big">{esc(big)}</div><ul>{body}</ul></div>'
    )


def _table(sections: Sequence[Section], totals: Sequence[StrategyRow]) -> str:
    head = "".join(f"<th>{esc(c)}</th>" for c in COMPARE_COLUMNS)
    body: list[str] = []

    def group(title: str, rows: Sequence[StrategyRow], baseline: StrategyRow | None) -> None:
        body.append(
            f'<tr class="group"><th colspan="{len(COMPARE_COLUMNS)}">{esc(title)}</th></tr>'
        )
        if baseline is not None:
            base = [
                "without compaction",
                f"{baseline.tokens_without:,}",
                "",
                f"${baseline.cost_without:.4f}",
            ]
            base += [""] * (len(COMPARE_COLUMNS) - len(base))
            body.append(
                '<tr class="baseline">' + "".join(f"<td>{esc(c)}</td>" for c in base) + "</tr>"
            )
        for row in rows:
            body.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells(row)) + "</tr>")

    for section in sections:
        rows = [StrategyRow.of(s, r) for s, r in section.runs]
        group(section.name, rows, rows[0] if rows else None)
    if len(sections) > 1:
        group(f"total over {len(sections)} transcripts", totals, totals[0] if totals else None)
    return (
        f'<div class="table-wrap"><table><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


_CSS = """
:root{--fg:#202124;--muted:#5f6368;--line:#dadce0;--card:#f8f9fa}
*{box-sizing:border-box}
body{margin:0;font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;
color:var(--fg);background:#fff}
main{max-width:1400px;margin:0 auto;padding:24px}
h1{font-size:26px;margin:0 0 4px}
h2{font-size:20px;margin:32px 0 2px}
.lede{color:var(--muted);margin:0 0 14px;overflow-wrap:anywhere}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(240px,1fr));gap:12px}
.card{background:var(--card);border:1px solid var(--line);border-top:4px solid var(--c);
border-radius:10px;padding:10px 14px}
.card .name{font-weight:600;color:var(--c)}
.card .big{font-size:24px;font-weight:650;margin:2px 0 4px}
.card ul{margin:0;padding:0;list-style:none;color:var(--muted);font-size:14px}
dl.settings{display:grid;grid-template-columns:max-content 1fr;gap:2px 18px;margin:0;
font-size:14px}
dl.settings dt{color:var(--muted)}
dl.settings dd{margin:0;overflow-wrap:anywhere}
.table-wrap{overflow-x:auto;margin-top:8px}
table{border-collapse:collapse;font-size:14px;font-variant-numeric:tabular-nums;
white-space:nowrap}
th,td{padding:5px 10px;border-bottom:1px solid var(--line);text-align:right}
th:first-child,td:first-child{text-align:left}
thead th{color:var(--muted);font-weight:600}
tr.group th{text-align:left;padding-top:14px;border-bottom:2px solid var(--line)}
tr.baseline td{color:var(--muted)}
.grid{display:grid;grid-template-columns:repeat(2,minmax(0,1fr));gap:20px}
.panel{margin:0;border:1px solid var(--line);border-radius:10px;padding:12px;min-width:0}
figcaption{font-weight:600;margin-bottom:6px}
figcaption small{display:block;font-weight:400;color:var(--muted);font-size:13px}
svg{display:block;width:100%;height:auto}
svg.narrow{display:none}
.legend{display:flex;flex-wrap:wrap;gap:2px 14px;font-size:13px;color:var(--muted);
margin-top:6px}
.legend span{white-space:nowrap}
.sw{display:inline-block;vertical-align:middle;margin-right:5px}
.sw.line{width:18px;border-top:3px solid var(--c)}
.sw.dash{width:18px;border-top:2px dashed var(--c)}
.sw.vline{width:2px;height:12px;background:var(--c);opacity:.6}
.sw.box{width:12px;height:10px;background:var(--c)}
.sw.ring{width:10px;height:10px;border:2px solid var(--c);border-radius:50%}
.sw.tri{width:0;height:0;border-left:5px solid transparent;border-right:5px solid transparent;
border-top:9px solid var(--c)}
details.briefings{margin-top:8px;font-size:14px}
details.briefings summary{cursor:pointer;color:var(--muted)}
details.briefings h4{margin:10px 0 4px;font-size:13px;color:var(--muted)}
details.briefings pre{white-space:pre-wrap;overflow-wrap:anywhere;background:var(--card);
border:1px solid var(--line);border-radius:6px;padding:8px;margin:0;font-size:12.5px;
max-height:420px;overflow-y:auto}
footer{color:var(--muted);font-size:13px;margin:32px 0 8px}
@media (max-width:700px){
main{padding:12px}
h1{font-size:22px}
.grid{grid-template-columns:1fr}
svg.wide{display:none}
svg.narrow{display:block}
.hint{display:none}
dl.settings{grid-template-columns:1fr}
dl.settings dd{margin-bottom:6px}
}
"""


def render_report(
    sections: Sequence[Section],
    *,
    title: str = "agentctx replay",
    settings: Sequence[tuple[str, str]] = (),
) -> str:
    """The page for ``sections`` (`sections_of`), with ``settings`` listed at the top as
    ``(label, value)`` pairs."""
    ids = IdMaker()
    totals = _totals(sections)
    colors = {}
    for k, row in enumerate(totals):
        colors[row.strategy] = strategy_color(row.strategy, k)
    requests = sum(len(s.runs[0][1].rows) for s in sections if s.runs)
    files = sections[0].name if len(sections) == 1 else f"{len(sections)} transcripts"
    strategies = ", ".join(r.strategy for r in totals)
    budget = sections[0].runs[0][1].budget_tokens if sections and sections[0].runs else 0
    lede = (
        f"{requests:,} requests of {files} replayed through {strategies} at a "
        f"{budget:,}-token budget, against a simulated prompt cache."
    )
    cards = "".join(_card(row, colors[row.strategy]) for row in totals)
    dl = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in settings)
    body = [
        f'<header><h1>{esc(title)}</h1><p class="lede">{esc(lede)}</p></header>',
        f'<section class="totals"><div class="cards">{cards}</div>',
        _table(sections, totals),
        "</section>",
        f'<section class="settings-box"><h2>Settings</h2><dl class="settings">{dl}</dl></section>',
        *(_section(s, ids) for s in sections if s.runs),
        f"<footer>agentctx {esc(__version__)}: one self-contained page, inline SVG and CSS, "
        "no scripts, nothing fetched.</footer>",
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{esc(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n<main>\n"
        + "\n".join(body)
        + "\n</main>\n</body>\n</html>\n"
    )


def write_report(
    path: str | Path,
    sections: Sequence[Section],
    *,
    title: str = "agentctx replay",
    settings: Sequence[tuple[str, str]] = (),
) -> None:
    """Write `render_report`'s page to ``path`` (UTF-8)."""
    Path(path).write_text(render_report(sections, title=title, settings=settings), "utf-8")
