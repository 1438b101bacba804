"""How ``agentctx replay`` shows a `ReplayReport`: plain text, or with rich on a terminal
(a table, the totals in a panel, and a progress bar for replays that take a while).

```python
print_plain(report, sys.stdout)

console = rich.console.Console()
with LazyProgress(console, "replaying session.jsonl") as progress:
    report = await replay(messages, budget=budget, progress=progress)
print_rich(report, console)
```

rich is the optional ``cli`` extra (``pip install 'py-agentctx[cli]'``): only `print_rich`
and a progress bar that shows import it, so the plain report never does.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, TextIO

from agentctx.pricing import price_for
from agentctx.replay._safe_text import printable
from agentctx.replay.cached_summarizer import never_sent, refused
from agentctx.replay.engine import SONNET_MODEL

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from types import TracebackType

    from rich.console import Console
    from rich.progress import Progress, TaskID

    from agentctx.events import SummaryStats
    from agentctx.replay.engine import ReplayReport

__all__ = [
    "BRIEFING_LINES",
    "COLUMNS",
    "PROGRESS_AFTER",
    "LazyProgress",
    "briefings",
    "print_plain",
    "print_rich",
    "rows",
    "summarizer_spend",
    "totals",
]

PROGRESS_AFTER = 1.0
"""Seconds a replay runs before its progress bar shows: quicker replays print no bar."""

ESTIMATE_MODEL = "claude-haiku-5-5"  # the default summarizer model (AnthropicSummarizer)
"""What the offline summarizer's requests are priced at, as an estimate."""

_FLAGS = r"^((BREAK|OVER) )+"


def _shorten(items: Sequence[str], width: int = 110) -> str:
    """``items`` joined, cut to about ``width`` characters with a count of the rest."""
    out = ""
    for k, item in enumerate(items):
        piece = item if not out else f"; {item}"
        rest = len(items) - k
        if out and len(out) + len(piece) > width:
            return f"{out}; (+{rest} more)"
        out += piece
    return out if len(out) <= width + 20 else out[: width + 19] + "…"


def _tally(actions: Sequence[str]) -> str:
    """What was done, by kind: the first word of each action (``truncated x7``)."""
    kinds = Counter(a.split(" ", 1)[0] for a in actions)
    return ", ".join(f"{k} x{n}" for k, n in kinds.most_common()) or "nothing"


def summarizer_spend(summaries: Sequence[SummaryStats]) -> tuple[float | None, bool]:
    """What the summarizer's requests cost, and whether that is an estimate: a model with no
    price is estimated at the default summarizer's (`ESTIMATE_MODEL`) prices. ``(None,
    False)`` when there were no requests."""
    if not summaries:
        return None, False
    costs = [s.cost_usd for s in summaries]
    if all(c is not None for c in costs):
        return sum(c or 0.0 for c in costs), False
    estimate = price_for(ESTIMATE_MODEL)
    if estimate is None:  # pragma: no cover - the default model is always priced
        return None, True
    return sum(estimate.cost(s.usage) for s in summaries), True


def _summarizer_line(summaries: Sequence[SummaryStats], session_cost: float) -> str:
    """The summarizer's requests, tokens and cost, and its share of all that was spent
    (the target is at most 5 %), to follow ``summarizer: ``; an unpriced model is estimated at
    the default one's prices."""
    if not summaries:
        return "no requests"
    usage_in = sum(s.usage.input_tokens for s in summaries)
    usage_out = sum(s.usage.output_tokens for s in summaries)
    models = sorted({s.model or "unknown model" for s in summaries})
    line = (
        f"{len(summaries)} request{'s' if len(summaries) != 1 else ''} "
        f"({', '.join(models)}), {usage_in} input + {usage_out} output tokens, "
    )
    spent, estimated = summarizer_spend(summaries)
    if not estimated:
        line += f"cost ${spent or 0.0:.4f}"
    else:
        line += "cost unknown (no price for the model)"
        if spent is not None:
            line += f"; at {ESTIMATE_MODEL} prices ${spent:.4f}"
    if spent is not None and spent + session_cost > 0:
        share = spent / (spent + session_cost)
        line += f", {share:.1%} of all spent (target <= 5 %)"
    return line


def change(with_: int, without: int) -> str:
    """How many fewer (or more) tokens compaction sent: ``51% fewer``, ``0% fewer``,
    ``3% more``; never ``-0%``."""
    delta = with_ / without - 1 if without else 0.0
    return f"{abs(delta):.0%} {'more' if delta > 0 else 'fewer'}"


COLUMNS = ("req", "msgs", "without", "with", "cache rd", "cache wr", "what")
"""The report's columns: tokens without and with compaction, cache reads and writes."""


def rows(report: ReplayReport) -> list[tuple[str, ...]]:
    """One row of cells per request, in `COLUMNS` order."""
    rows = []
    for r in report.rows:
        flags = ("BREAK " if r.cache_break else "") + ("OVER " if r.over_budget else "")
        what = flags + _shorten([*r.actions, *r.notes])
        msgs = f"{r.raw_messages}->{r.view_messages}"
        numbers = (r.number, msgs, r.tokens_without, r.tokens_with, r.cache_read, r.cache_write)
        rows.append((*map(str, numbers), what))
    return rows


def totals(report: ReplayReport) -> list[tuple[str, str]]:
    """The session's totals as ``(label, value)``; a plain line is ``label + value``, so a
    label ends with its separator (the plain report's wording predates the rich one)."""
    read = sum(r.cache_read for r in report.rows)
    written = sum(r.cache_write for r in report.rows)
    read0 = sum(r.cache_read_without for r in report.rows)
    written0 = sum(r.cache_write_without for r in report.rows)
    ratio = report.cost_with / report.cost_without if report.cost_without else 1.0
    actions = [a for r in report.rows for a in r.actions]
    summarized = sum(r.summarized for r in report.rows)
    splices = f" ({report.splices} briefing{'s' if report.splices != 1 else ''} spliced"
    splices += f" over {summarized} messages)" if report.splices else ")"
    change_text = change(report.tokens_with, report.tokens_without)
    return [
        (
            "requests ",
            f"{len(report.rows)}  budget {report.budget_tokens} tokens  "
            f"over budget {report.over_budget}",
        ),
        (
            "tokens sent: ",
            f"{report.tokens_with} with compaction, {report.tokens_without} without "
            f"({change_text})",
        ),
        ("cache reads/writes: ", f"{read}/{written} tokens with, {read0}/{written0} without"),
        (
            f"simulated input cost at {SONNET_MODEL} prices: ",
            f"${report.cost_with:.4f} with, ${report.cost_without:.4f} without (x{ratio:.2f})",
        ),
        (
            "compactions ",
            f"{report.compactions}{splices}  prefix-cache breaks {report.cache_breaks}",
        ),
        ("cleared or summarized: ", _tally(actions)),
        ("summarizer: ", _summarizer_line(report.summaries, report.cost_with) + _rejected(report)),
    ]


def _rejected(report: ReplayReport) -> str:
    """The requests that produced no briefing, as --compare and --json count them: without
    it, a summarizer that failed every attempt read as one never asked."""
    rejected = report.rejections
    if not rejected:
        return ""
    # An attempt refused once the summarizer was given up was never sent: it is the last of
    # its request's (the refusal is not retried), which was never sent if it was the first.
    unsent = [e for e in rejected if never_sent(e)]
    attempts = sum(e.attempts - refused(e.detail) for e in rejected)
    first = printable(f"{rejected[0].reason}: {rejected[0].detail}", one_line=True)
    return (
        f"; {len(rejected)} request{'s' if len(rejected) != 1 else ''} rejected after "
        f"{attempts} attempt{'s' if attempts != 1 else ''}"
        + (f" ({len(unsent)} never sent: the summarizer was given up)" if unsent else "")
        + f", first: {first}"
    )


def _plain_line(cells: Sequence[str]) -> str:
    *numbers, what = cells
    widths = (4, 9, 9, 9, 9, 9)
    cells = " ".join(f"{n:>{w}}" for n, w in zip(numbers, widths, strict=True))
    return f"{cells}  {printable(what, one_line=True)}"


BRIEFING_LINES = 12
"""Lines of each spliced briefing the terminal report shows (``--report`` has all of them)."""


def briefings(report: ReplayReport, limit: int = BRIEFING_LINES) -> list[tuple[str, str]]:
    """Each briefing spliced, as ``(title, text)`` with the text cut to ``limit`` lines."""
    out = []
    for r in report.rows:
        for text in r.briefings:
            lines = text.splitlines()
            shown = "\n".join(lines[:limit])
            if len(lines) > limit:
                shown += f"\n(+{len(lines) - limit} more lines: --report or --json has them all)"
            out.append((f"briefing spliced at request {r.number}", shown))
    return out


def print_plain(report: ReplayReport, out: TextIO) -> None:
    """Write the report's table, totals and spliced briefings to ``out`` as plain text."""
    lines = [_plain_line(COLUMNS), *map(_plain_line, rows(report)), ""]
    lines += [label + printable(value, one_line=True) for label, value in totals(report)]
    for title, text in briefings(report):
        lines += ["", f"{title}:", *(f"  {line}".rstrip() for line in text.splitlines())]
    out.write(printable("\n".join(lines)) + "\n")


def print_rich(report: ReplayReport, console: Console) -> None:
    """Print the report's table and totals (in a panel) on a rich ``console``."""
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    table = Table(show_edge=False, pad_edge=False)
    for name in COLUMNS[:-1]:
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column(COLUMNS[-1])
    for cells in rows(report):
        what = Text(printable(cells[-1], one_line=True))
        what.highlight_regex(_FLAGS, "bold red")
        table.add_row(*map(Text, cells[:-1]), what)
    console.print(table)
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    for label, value in totals(report):
        # The plain report's labels end with their separator.
        grid.add_row(Text(label.rstrip(": ")), Text(printable(value, one_line=True)))
    console.print(Panel(grid, title="totals", title_align="left", expand=False))
    for title, text in briefings(report):
        console.print(Panel(Text(printable(text)), title=title, title_align="left", expand=False))


class LazyProgress:
    """A `replay` progress callback that shows a transient progress bar on a rich
    ``console`` once the replay has run ``after`` seconds (default `PROGRESS_AFTER`), and
    removes it at the end. Use it as a context manager around the replay.

    ``status``, if given, is called on every update for a few words shown after the bar
    (``summaries: 3 sent, 5 cached``).
    """

    def __init__(
        self,
        console: Console,
        description: str,
        *,
        after: float | None = None,
        status: Callable[[], str] | None = None,
    ):
        self._console = console
        self._description = description
        self._status = status
        self._after = PROGRESS_AFTER if after is None else after
        self._start = time.monotonic()
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> LazyProgress:
        self._start = time.monotonic()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._bar is not None:
            self._bar.stop()

    def __call__(self, done: int, total: int) -> None:
        """Record that ``done`` of ``total`` requests are replayed."""
        if self._bar is None:
            if time.monotonic() - self._start < self._after:
                return
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(
                TextColumn("{task.description}", markup=False),  # a file name: no markup
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("requests"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[status]}", markup=False),
                console=self._console,
                transient=True,
            )
            self._task = self._bar.add_task(
                self._description, total=total, completed=done, status=""
            )
            self._bar.start()
        assert self._task is not None
        status = self._status() if self._status is not None else ""
        self._bar.update(self._task, completed=done, total=total, status=status)
