"""The ``agentctx`` command.

```
agentctx replay [TRANSCRIPT] [--context-window N] [--reserve N]
                [--strategy llm|pipeline|deterministic|none] [--summarizer-delay S] [--chart PATH]
agentctx demo [--context-window N] [--reserve N]
```

With no transcript, ``replay`` uses the real session that ships with agentctx, offline, through
background summaries from an offline extractive summarizer and the deterministic tiers.
``demo`` runs a small live agent loop (scripted model, real file tools) and prints each event.
Errors in the input are one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TextIO

import anyio

from agentctx.budget import Budget
from agentctx.errors import AgentCtxError
from agentctx.importers import load_transcript
from agentctx.pricing import price_for
from agentctx.replay.data import DEMO_TRANSCRIPT
from agentctx.replay.engine import ReplayClock, ReplayReport, replay
from agentctx.replay.offline_summarizer import OFFLINE_MODEL, OfflineSummarizer
from agentctx.strategies import DeterministicCompaction, ToolOutputPipeline
from agentctx.strategies.llm import LlmCompaction
from agentctx.strategy import Chain

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from agentctx.events import SummaryStats
    from agentctx.strategy import CompactionContext, CompactionStrategy

__all__ = ["main"]

DEFAULT_CONTEXT_WINDOW = 45_000
"""Small enough that the shipped session (71k tokens raw) needs a briefing and the tiers."""

DEFAULT_SUMMARIZER_DELAY = 8.0
"""Seconds of session time the offline summarizer takes (a cheap model's latency)."""

ESTIMATE_MODEL = "claude-haiku-5-5"  # the default summarizer model (AnthropicSummarizer)
"""What the offline summarizer's requests are priced at, as an estimate."""


class _NoCompaction:
    async def compact(self, ctx: CompactionContext) -> None:
        return None


def _llm(clock: ReplayClock, delay: float) -> CompactionStrategy:
    tiers = DeterministicCompaction()
    summarizer = OfflineSummarizer(delay, sleep=clock.sleep)
    llm = LlmCompaction(summarizer, fallback=tiers, clock=clock, sleep=clock.sleep)
    return Chain([llm, tiers])


_STRATEGIES: dict[str, Callable[[ReplayClock, float], CompactionStrategy]] = {
    "llm": _llm,
    "pipeline": lambda clock, delay: Chain([ToolOutputPipeline(), DeterministicCompaction()]),
    "deterministic": lambda clock, delay: DeterministicCompaction(),
    "none": lambda clock, delay: _NoCompaction(),
}

_STRATEGY_HELP = (
    "llm: background briefings from an offline extractive summarizer, then the deterministic "
    "tiers (default); pipeline: ToolOutputPipeline then the tiers; deterministic: the tiers "
    "only; none: no compaction"
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, exit status 2, like every other input error (argparse adds the usage).
        self.exit(2, f"{self.prog}: {message}\n")


def _count(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of tokens: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be finite seconds >= 0: {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="agentctx", description=(__doc__ or "").split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    r = sub.add_parser("replay", help="replay a recorded session through a strategy")
    r.add_argument("transcript", nargs="?", default=str(DEMO_TRANSCRIPT))
    r.add_argument(
        "--context-window",
        type=_count,
        default=DEFAULT_CONTEXT_WINDOW,
        help=f"tokens (default {DEFAULT_CONTEXT_WINDOW})",
    )
    r.add_argument(
        "--reserve", type=_count, default=8_000, help="tokens kept for output (default 8000)"
    )
    r.add_argument("--strategy", choices=list(_STRATEGIES), default="llm", help=_STRATEGY_HELP)
    r.add_argument(
        "--summarizer-delay",
        type=_seconds,
        default=DEFAULT_SUMMARIZER_DELAY,
        metavar="S",
        help="seconds of session time the offline summarizer takes (llm only; "
        f"default {DEFAULT_SUMMARIZER_DELAY:g})",
    )
    r.add_argument("--chart", metavar="PATH", help="also write a chart: .html or .png")
    d = sub.add_parser("demo", help="a small live agent loop; prints each event as it happens")
    d.add_argument("--context-window", type=_count, default=16_000, help="tokens (default 16000)")
    d.add_argument(
        "--reserve", type=_count, default=2_000, help="tokens kept for output (default 2000)"
    )
    return p


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


def _summarizer_line(summaries: Sequence[SummaryStats], session_cost: float) -> str:
    """The summarizer's requests, tokens and cost, and its share of all that was spent
    (DESIGN §7: at most 5 %); an unpriced model is estimated at the default one's prices."""
    if not summaries:
        return "summarizer: no requests"
    usage_in = sum(s.usage.input_tokens for s in summaries)
    usage_out = sum(s.usage.output_tokens for s in summaries)
    costs = [s.cost_usd for s in summaries]
    models = sorted({s.model or "unknown model" for s in summaries})
    line = (
        f"summarizer: {len(summaries)} request{'s' if len(summaries) != 1 else ''} "
        f"({', '.join(models)}), {usage_in} input + {usage_out} output tokens, "
    )
    spent: float | None = None
    if all(c is not None for c in costs):
        spent = sum(c or 0.0 for c in costs)
        line += f"cost ${spent:.4f}"
    else:
        line += "cost unknown (no price for the model)"
        estimate = price_for(ESTIMATE_MODEL)
        if estimate is not None:
            spent = sum(estimate.cost(s.usage) for s in summaries)
            line += f"; at {ESTIMATE_MODEL} prices ${spent:.4f}"
    if spent is not None and spent + session_cost > 0:
        share = spent / (spent + session_cost)
        line += f", {share:.1%} of all spent (target <= 5 %)"
    return line


def _print_report(report: ReplayReport, out: TextIO) -> None:
    write = out.write
    header = (
        f"{'req':>4} {'msgs':>9} {'without':>9} {'with':>9} {'cache rd':>9} {'cache wr':>9}  what"
    )
    write(header + "\n")
    for r in report.rows:
        flags = ("BREAK " if r.cache_break else "") + ("OVER " if r.over_budget else "")
        what = _shorten([*r.actions, *r.notes])
        msgs = f"{r.raw_messages}->{r.view_messages}"
        write(
            f"{r.number:>4} {msgs:>9} {r.tokens_without:>9} {r.tokens_with:>9} "
            f"{r.cache_read:>9} {r.cache_write:>9}  {flags}{what}\n"
        )
    saved = 1 - report.tokens_with / report.tokens_without if report.tokens_without else 0.0
    ratio = report.cost_with / report.cost_without if report.cost_without else 1.0
    read = sum(r.cache_read for r in report.rows)
    written = sum(r.cache_write for r in report.rows)
    read0 = sum(r.cache_read_without for r in report.rows)
    written0 = sum(r.cache_write_without for r in report.rows)
    actions = [a for r in report.rows for a in r.actions]
    summarized = sum(r.summarized for r in report.rows)
    splices = f" ({report.splices} briefing{'s' if report.splices != 1 else ''} spliced"
    splices += f" over {summarized} messages)" if report.splices else ")"
    write(
        f"\nrequests {len(report.rows)}  budget {report.budget_tokens} tokens  "
        f"over budget {report.over_budget}\n"
        f"tokens sent: {report.tokens_with} with compaction, {report.tokens_without} without "
        f"({saved:.0%} fewer)\n"
        f"cache reads/writes: {read}/{written} tokens with, {read0}/{written0} without\n"
        f"simulated input cost: ${report.cost_with:.4f} with, ${report.cost_without:.4f} without "
        f"(x{ratio:.2f})\n"
        f"compactions {report.compactions}{splices}  prefix-cache breaks {report.cache_breaks}\n"
        f"cleared or summarized: {_tally(actions)}\n"
        f"{_summarizer_line(report.summaries, report.cost_with)}\n"
    )


def _replay(args: argparse.Namespace) -> int:
    transcript = load_transcript(args.transcript)
    budget = Budget(context_window=args.context_window, reserve_output=args.reserve)
    clock = ReplayClock()
    strategy = _STRATEGIES[args.strategy](clock, args.summarizer_delay)
    report = anyio.run(
        lambda: replay(transcript.messages, budget=budget, strategy=strategy, clock=clock)
    )
    if args.chart:
        from agentctx.replay.chart import write_chart

        write_chart(report, args.chart, f"agentctx replay: {Path(transcript.path).name}")
    strategy_line = args.strategy
    if args.strategy == "llm":
        strategy_line += f" (summarizer {OFFLINE_MODEL}, {args.summarizer_delay:g} s)"
    print(
        f"{transcript.path} ({transcript.format}, {len(transcript.messages)} messages)  "
        f"strategy {strategy_line}"
    )
    _print_report(report, sys.stdout)
    if args.chart:
        print(f"chart: {args.chart}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            from agentctx.replay.demo import run_demo

            budget = Budget(context_window=args.context_window, reserve_output=args.reserve)
            return anyio.run(lambda: run_demo(budget, sys.stdout))
        return _replay(args)
    except (AgentCtxError, OSError, ValueError) as exc:
        print(f"agentctx: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
