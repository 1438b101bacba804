"""``agentctx replay --compare``: one row per strategy, per transcript and in total, as a table
or as one JSON document.

```python
outcomes = run_replays(transcripts, ["deterministic", "pipeline", "llm"], settings)
table = Comparison.of(outcomes)
print_comparison(table, sys.stdout)                 # or print_comparison_rich(table, console)
json.dump(table.as_json(settings_dict), sys.stdout)
```

A row: prompt tokens sent (and the change against sending everything), the simulated input
cost, prefix-cache breaks, requests over the budget, compactions and briefings spliced, the
summarizer's requests, cost and share of all that was spent (an unpriced model is estimated,
marked ``~``), and retention (`agentctx.replay.retention`: the early file paths visible or one
recall away, at the worst check and on average). The totals row of a strategy sums its rows
over the transcripts (retention: the worst check of all and the mean over all checks).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from agentctx.replay._safe_text import printable
from agentctx.replay.cached_summarizer import never_sent
from agentctx.replay.render import summarizer_spend
from agentctx.replay.retention import Retention, combine

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rich.console import Console

    from agentctx.importers import Transcript
    from agentctx.replay.engine import ReplayReport
    from agentctx.replay.jobs import Outcome

__all__ = [
    "COMPARE_COLUMNS",
    "Comparison",
    "FileRows",
    "StrategyRow",
    "transcript_name",
    "print_comparison",
    "print_comparison_rich",
]


@dataclass(frozen=True, slots=True)
class StrategyRow:
    """A strategy's figures over one transcript (or summed over several)."""

    strategy: str
    requests: int
    tokens_with: int
    tokens_without: int
    cost_with: float
    cost_without: float
    cache_read: int
    cache_write: int
    cache_breaks: int
    cold_rewrites: int
    over_budget: int
    compactions: int
    splices: int
    summaries: int = 0
    summary_input: int = 0
    summary_output: int = 0
    summary_cost: float | None = None
    summary_estimated: bool = False
    summary_rejected: int = 0
    summary_not_sent: int = 0
    """Of the rejected, the requests refused unsent once the summarizer was given up."""
    rejected_detail: str | None = None
    """The first rejection's reason and detail, to show what went wrong."""
    retention: Retention | None = None
    briefings: tuple[tuple[int, str], ...] = ()
    """``(request, text)`` of each briefing spliced (one transcript's rows only)."""
    repaired: int = 0
    """Requests whose view was repaired (`TranscriptRepaired`): what they send differs
    from the history with or without compaction."""

    @classmethod
    def of(cls, strategy: str, report: ReplayReport) -> StrategyRow:
        """The row of one replay."""
        spent, estimated = summarizer_spend(report.summaries)
        rejected = report.rejections
        return cls(
            strategy=strategy,
            requests=len(report.rows),
            tokens_with=report.tokens_with,
            tokens_without=report.tokens_without,
            cost_with=report.cost_with,
            cost_without=report.cost_without,
            cache_read=sum(r.cache_read for r in report.rows),
            cache_write=sum(r.cache_write for r in report.rows),
            cache_breaks=report.cache_breaks,
            cold_rewrites=report.cold_rewrites,
            over_budget=report.over_budget,
            compactions=report.compactions,
            splices=report.splices,
            summaries=len(report.summaries),
            summary_input=sum(s.usage.input_tokens for s in report.summaries),
            summary_output=sum(s.usage.output_tokens for s in report.summaries),
            summary_cost=spent,
            summary_estimated=estimated,
            summary_rejected=len(rejected),
            summary_not_sent=sum(map(never_sent, rejected)),
            rejected_detail=f"{rejected[0].reason}: {rejected[0].detail}" if rejected else None,
            retention=report.retention,
            briefings=tuple((r.number, t) for r in report.rows for t in r.briefings),
            repaired=sum(r.repaired for r in report.rows),
        )

    @property
    def change(self) -> float:
        """Tokens sent against sending everything, as a fraction (-0.76: 76 % fewer)."""
        return self.tokens_with / self.tokens_without - 1 if self.tokens_without else 0.0

    @property
    def summary_share(self) -> float | None:
        """The summarizer's share of all that was spent (main model input + summarizer)."""
        if self.summary_cost is None or self.summary_cost + self.cost_with <= 0:
            return None
        return self.summary_cost / (self.summary_cost + self.cost_with)

    def __add__(self, other: StrategyRow) -> StrategyRow:
        costs = [self.summary_cost, other.summary_cost]
        known = [c for c in costs if c is not None]
        parts = [r for r in (self.retention, other.retention) if r is not None]
        return replace(
            self,
            requests=self.requests + other.requests,
            tokens_with=self.tokens_with + other.tokens_with,
            tokens_without=self.tokens_without + other.tokens_without,
            cost_with=self.cost_with + other.cost_with,
            cost_without=self.cost_without + other.cost_without,
            cache_read=self.cache_read + other.cache_read,
            cache_write=self.cache_write + other.cache_write,
            cache_breaks=self.cache_breaks + other.cache_breaks,
            cold_rewrites=self.cold_rewrites + other.cold_rewrites,
            over_budget=self.over_budget + other.over_budget,
            compactions=self.compactions + other.compactions,
            splices=self.splices + other.splices,
            summaries=self.summaries + other.summaries,
            summary_input=self.summary_input + other.summary_input,
            summary_output=self.summary_output + other.summary_output,
            summary_cost=sum(known) if known else None,
            summary_estimated=self.summary_estimated or other.summary_estimated,
            summary_rejected=self.summary_rejected + other.summary_rejected,
            summary_not_sent=self.summary_not_sent + other.summary_not_sent,
            rejected_detail=self.rejected_detail or other.rejected_detail,
            retention=combine(parts) if parts else None,
            briefings=(),
            repaired=self.repaired + other.repaired,
        )

    def as_json(self) -> dict[str, Any]:
        """The row as a JSON-ready dict."""
        return {
            "strategy": self.strategy,
            "requests": self.requests,
            "tokens_sent": self.tokens_with,
            "tokens_without": self.tokens_without,
            "change": round(self.change, 6),
            "cost": round(self.cost_with, 6),
            "cost_without": round(self.cost_without, 6),
            "cache_read": self.cache_read,
            "cache_write": self.cache_write,
            "cache_breaks": self.cache_breaks,
            "cold_rewrites": self.cold_rewrites,
            "over_budget": self.over_budget,
            "compactions": self.compactions,
            "splices": self.splices,
            "summarizer": {
                "requests": self.summaries,
                "input_tokens": self.summary_input,
                "output_tokens": self.summary_output,
                "cost": None if self.summary_cost is None else round(self.summary_cost, 6),
                "estimated": self.summary_estimated,
                "share": None if self.summary_share is None else round(self.summary_share, 6),
                "rejected": self.summary_rejected,
                "not_sent": self.summary_not_sent,
                "first_rejection": self.rejected_detail,
            },
            "retention": self.retention.as_dict() if self.retention is not None else None,
            "briefings": [{"request": n, "text": t} for n, t in self.briefings],
            "repaired_requests": self.repaired,
        }


def transcript_name(transcript: Transcript) -> str:
    """A transcript's name for headings: its file's name, and for a task of an evaluation
    output its id too (``<file>#<id>``, whatever characters the id holds)."""
    name = transcript.extra.get("name")
    return name if isinstance(name, str) else Path(transcript.path).name


@dataclass(frozen=True, slots=True)
class FileRows:
    """One transcript's rows, one per strategy, in the order asked for."""

    path: str
    name: str  # for headings: `transcript_name`
    format: str
    messages: int
    rows: tuple[StrategyRow, ...]
    timestamps_out_of_order: int = 0
    """Request times read as the next one's (`ReplayReport.timestamps_out_of_order`): the
    transcript's own, the same through every strategy."""

    def as_json(self) -> dict[str, Any]:
        """The transcript and its rows as a JSON-ready dict."""
        first = self.rows[0] if self.rows else None
        return {
            "path": self.path,
            "format": self.format,
            "messages": self.messages,
            "requests": first.requests if first else 0,
            "tokens_without": first.tokens_without if first else 0,
            "cost_without": round(first.cost_without, 6) if first else 0.0,
            # For a script, as the stderr line and the header say it: the replay's clock was
            # repaired, so its session times (and the briefings they time) are a reading.
            "timestamps_out_of_order": self.timestamps_out_of_order,
            "strategies": [r.as_json() for r in self.rows],
        }


@dataclass(frozen=True, slots=True)
class Comparison:
    """Every transcript's rows and, per strategy, the totals over them."""

    files: tuple[FileRows, ...]
    totals: tuple[StrategyRow, ...] = field(default=())

    @classmethod
    def of(cls, outcomes: Sequence[Outcome]) -> Comparison:
        """The comparison of `agentctx.replay.jobs.run_replays`'s outcomes."""
        files: dict[str, list[Outcome]] = {}
        for o in outcomes:
            files.setdefault(o.transcript.path, []).append(o)
        rows = tuple(
            FileRows(
                path=path,
                name=transcript_name(group[0].transcript),
                format=group[0].transcript.format,
                messages=len(group[0].transcript.messages),
                rows=tuple(StrategyRow.of(o.strategy, o.report) for o in group),
                timestamps_out_of_order=group[0].report.timestamps_out_of_order,
            )
            for path, group in files.items()
        )
        totals: dict[str, StrategyRow] = {}
        for f in rows:
            for r in f.rows:
                totals[r.strategy] = totals[r.strategy] + r if r.strategy in totals else r
        return cls(rows, tuple(totals.values()))

    def as_json(self, settings: dict[str, Any]) -> dict[str, Any]:
        """One JSON document: ``settings`` (as given), ``files`` (each with its rows) and
        ``totals`` (one row per strategy)."""
        return {
            "settings": settings,
            "files": [f.as_json() for f in self.files],
            "totals": [r.as_json() for r in self.totals],
        }


COMPARE_COLUMNS = (
    "strategy",
    "tokens sent",
    "change",
    "input cost",
    "cache breaks",
    "over budget",
    "compactions",
    "summarizer (share)",
    "retention worst/mean",
)
"""The comparison table's columns."""


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _change(row: StrategyRow) -> str:
    change = row.change
    if round(change, 2) == 0:
        return "0%"
    return f"{abs(change):.0%} {'more' if change > 0 else 'fewer'}"


def cells(row: StrategyRow) -> tuple[str, ...]:
    """One row's cells, in `COMPARE_COLUMNS` order."""
    summarizer = "-"
    if row.summaries:
        cost = "?" if row.summary_cost is None else f"${row.summary_cost:.4f}"
        summarizer = f"{'~' if row.summary_estimated else ''}{cost} ({_pct(row.summary_share)})"
    retention = "-"
    if row.retention is not None and row.retention.checks:
        retention = f"{_pct(row.retention.worst)} / {_pct(row.retention.mean)}"
    return (
        row.strategy,
        f"{row.tokens_with:,}",
        _change(row),
        f"${row.cost_with:.4f}",
        str(row.cache_breaks),
        str(row.over_budget),
        f"{row.compactions} ({row.splices} spliced)",
        summarizer,
        retention,
    )


def _baseline(rows: Sequence[StrategyRow]) -> str:
    first = rows[0]
    return (
        f"{first.requests} requests; without compaction {first.tokens_without:,} tokens, "
        f"${first.cost_without:.4f}"
    )


def _notes(rows: Sequence[StrategyRow]) -> list[str]:
    """What the table cannot say: summarizer requests that were rejected."""
    return [
        f"  {r.strategy}: {r.summary_rejected} summarizer request"
        f"{'s' if r.summary_rejected != 1 else ''} rejected, first: {r.rejected_detail}"
        for r in rows
        if r.summary_rejected
    ]


_LEGEND = (
    "change: tokens sent against sending everything; input cost at the simulated cache; "
    "summarizer: its cost (~ estimated) and share of all spent; retention: early file paths "
    "visible or one recall away, at the worst check / on average"
)


def _sections(table: Comparison) -> list[tuple[str, tuple[StrategyRow, ...]]]:
    sections = [
        (f"{printable(f.path, one_line=True)} ({f.format}, {_baseline(f.rows)})", f.rows)
        for f in table.files
        if f.rows
    ]
    if len(table.files) > 1 and table.totals:
        sections.append((f"total over {len(table.files)} transcripts", table.totals))
    return sections


def print_comparison(table: Comparison, out: TextIO) -> None:
    """Write the comparison as plain text: a block per transcript, then the totals."""
    lines: list[str] = []
    for title, rows in _sections(table):
        grid = [COMPARE_COLUMNS, *map(cells, rows)]
        widths = [max(len(r[k]) for r in grid) for k in range(len(COMPARE_COLUMNS))]
        lines.append(title)
        for r in grid:
            first = f"  {r[0]:<{widths[0]}}"
            rest = (f"{c:>{w}}" for c, w in zip(r[1:], widths[1:], strict=True))
            lines.append("  ".join([first, *rest]).rstrip())
        lines += [*_notes(rows), ""]
    lines.append(_LEGEND)
    out.write(printable("\n".join(lines)) + "\n")


def print_comparison_rich(table: Comparison, console: Console) -> None:
    """Print the comparison on a rich ``console``: a table per transcript, then the totals."""
    from rich.table import Table
    from rich.text import Text

    for title, rows in _sections(table):
        t = Table(
            title=Text(printable(title)), title_justify="left", show_edge=False, pad_edge=False
        )
        for k, name in enumerate(COMPARE_COLUMNS):
            t.add_column(name, justify="left" if k == 0 else "right", no_wrap=k < 7)
        for row in rows:
            t.add_row(*(Text(printable(c)) for c in cells(row)))
        console.print(t)
        for note in _notes(rows):
            console.print(printable(note), markup=False, highlight=False, style="yellow")
        console.print()
    console.print(_LEGEND, markup=False, highlight=False, style="dim")
