"""The ``agentctx`` command: ``agentctx replay`` and ``agentctx demo``.

```
agentctx replay [TRANSCRIPT] [--context-window TOKENS] [--reserve TOKENS]
                [--strategy llm|pipeline|deterministic|none] [--summarizer-delay SECONDS]
                [--chart PATH]
agentctx demo [--context-window TOKENS] [--reserve TOKENS]
agentctx --version
```

With no transcript, ``replay`` uses the real session that ships with agentctx, offline, through
background summaries from an offline extractive summarizer and the deterministic tiers.
``demo`` runs a small live agent loop (scripted model, real file tools) and prints each event.
On a terminal with rich installed (the ``cli`` extra) the report is a table with a progress
bar for long replays; otherwise it is plain text. Errors in the input are one line on stderr
and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TextIO, cast

import anyio

from agentctx import __version__
from agentctx.budget import Budget
from agentctx.errors import AgentCtxError
from agentctx.importers import load_transcript
from agentctx.replay.data import DEMO_TRANSCRIPT
from agentctx.replay.engine import SONNET_MODEL, ReplayClock, ReplayReport, replay
from agentctx.replay.offline_summarizer import OFFLINE_MODEL, OfflineSummarizer
from agentctx.replay.render import LazyProgress, print_plain, print_rich
from agentctx.strategies import DeterministicCompaction, ToolOutputPipeline
from agentctx.strategies.llm import LlmCompaction
from agentctx.strategy import Chain

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from rich.console import Console

    from agentctx.strategy import CompactionContext, CompactionStrategy

__all__ = ["main"]

DEFAULT_CONTEXT_WINDOW = 45_000
"""Small enough that the shipped session (71k tokens raw) needs a briefing and the tiers."""

DEFAULT_SUMMARIZER_DELAY = 8.0
"""Seconds of session time the offline summarizer takes (a cheap model's latency)."""


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
    "how to compact: llm: background briefings from an offline extractive summarizer, then "
    "the deterministic tiers; pipeline: ToolOutputPipeline then the tiers; deterministic: the "
    "tiers only; none: no compaction (default: %(default)s)"
)

# Wrapped by hand: the epilog's examples need RawDescriptionHelpFormatter, which keeps the
# description's lines as they are too.
_DESCRIPTION = """\
Measure how agentctx keeps an LLM agent inside its context window.

'agentctx replay' replays a real agent session, request by request, through a
compaction strategy against a simulated prompt cache, and reports the prompt
tokens sent with and without compaction, cache reads and writes, the simulated
input cost, the compactions and prefix-cache breaks, and what was cleared or
summarized. 'agentctx demo' runs a small scripted agent loop live and prints
each event as it happens. Both run offline: no API key, no network."""

_EPILOG = """\
examples:
  agentctx replay                       the session that ships with agentctx
  agentctx replay session.jsonl --strategy deterministic --context-window 100000
  agentctx replay --chart replay.html   also write a chart of tokens per request
  agentctx demo"""

_REPLAY_DESCRIPTION = (
    "Replay a recorded agent session through a compaction strategy, against a simulated "
    "prompt cache, and report per request and in total: prompt tokens with and without "
    "compaction, cache reads and writes, the simulated input cost at "
    f"{SONNET_MODEL} prices, compactions, cache breaks, and what was cleared or summarized."
)

_TRANSCRIPT_HELP = (
    "the session to replay: a Claude Code or pi JSONL transcript, a SWE-agent trajectory, "
    "OpenHands events, or a JSON list of agentctx messages (default: the session that ships "
    "with agentctx, %(default)s)"
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
    """The command's argument parser."""
    raw = argparse.RawDescriptionHelpFormatter
    p = _Parser(prog="agentctx", description=_DESCRIPTION, epilog=_EPILOG, formatter_class=raw)
    p.add_argument("--version", action="version", version=f"agentctx {__version__}")
    sub = p.add_subparsers(
        dest="command",
        required=True,
        parser_class=_Parser,
        metavar="COMMAND",
        help="replay or demo; 'agentctx COMMAND --help' shows its options",
    )
    r = sub.add_parser(
        "replay",
        help="replay a recorded session through a strategy and report tokens, cache and cost",
        description=_REPLAY_DESCRIPTION,
    )
    r.add_argument(
        "transcript",
        nargs="?",
        default=str(DEMO_TRANSCRIPT),
        metavar="TRANSCRIPT",
        help=_TRANSCRIPT_HELP,
    )
    r.add_argument(
        "--context-window",
        type=_count,
        default=DEFAULT_CONTEXT_WINDOW,
        metavar="TOKENS",
        help="the model's context window, in tokens; the budget is this minus --reserve "
        "(default: %(default)s)",
    )
    r.add_argument(
        "--reserve",
        type=_count,
        default=8_000,
        metavar="TOKENS",
        help="tokens of the window kept for the output (default: %(default)s)",
    )
    r.add_argument("--strategy", choices=list(_STRATEGIES), default="llm", help=_STRATEGY_HELP)
    r.add_argument(
        "--summarizer-delay",
        type=_seconds,
        default=DEFAULT_SUMMARIZER_DELAY,
        metavar="SECONDS",
        help="seconds of session time the offline summarizer takes per briefing, for "
        "--strategy llm only (default: %(default)s)",
    )
    r.add_argument(
        "--chart",
        metavar="PATH",
        help="also write a chart of tokens per request to PATH, .html or .png "
        "(.png needs the 'chart' extra; default: no chart)",
    )
    d = sub.add_parser(
        "demo",
        help="run a small live agent loop and print each event as it happens",
        description="Run a small agent loop live, offline (a scripted model, real file "
        "tools reading the agentctx package), and print each event as it happens.",
    )
    d.add_argument(
        "--context-window",
        type=_count,
        default=16_000,
        metavar="TOKENS",
        help="the model's context window, in tokens (default: %(default)s)",
    )
    d.add_argument(
        "--reserve",
        type=_count,
        default=2_000,
        metavar="TOKENS",
        help="tokens of the window kept for the output (default: %(default)s)",
    )
    return p


def _replay(args: argparse.Namespace, console: Console | None) -> int:
    transcript = load_transcript(args.transcript)
    budget = Budget(context_window=args.context_window, reserve_output=args.reserve)
    clock = ReplayClock()
    strategy = _STRATEGIES[args.strategy](clock, args.summarizer_delay)

    def run(progress: Callable[[int, int], None] | None) -> ReplayReport:
        return anyio.run(
            lambda: replay(
                transcript.messages,
                budget=budget,
                strategy=strategy,
                clock=clock,
                progress=progress,
            )
        )

    if console is None:
        report = run(None)
    else:
        with LazyProgress(console, f"replaying {Path(transcript.path).name}") as progress:
            report = run(progress)
    if args.chart:
        from agentctx.replay.chart import write_chart

        write_chart(report, args.chart, f"agentctx replay: {Path(transcript.path).name}")
    strategy_line = args.strategy
    if args.strategy == "llm":
        strategy_line += f" (summarizer {OFFLINE_MODEL}, {args.summarizer_delay:g} s)"
    header = (
        f"{transcript.path} ({transcript.format}, {len(transcript.messages)} messages)  "
        f"strategy {strategy_line}"
    )
    if console is None:
        print(header)
        print_plain(report, sys.stdout)
    else:
        console.print(header, markup=False, highlight=False)
        print_rich(report, console)
    if args.chart:
        if console is None:
            print(f"chart: {args.chart}")
        else:
            console.print(f"chart: {args.chart}", markup=False, highlight=False)
    return 0


def _terminal_console() -> Console | None:
    """A rich console on stdout if stdout is a terminal and rich is installed, else None."""
    if not sys.stdout.isatty():
        return None
    try:
        from rich.console import Console
    except ImportError:
        return None
    return Console()


def main(argv: Sequence[str] | None = None, *, console: Console | None = None) -> int:
    """Run the command line on ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    The replay report goes to ``console`` (a ``rich.console.Console``) if given; otherwise to
    a rich console when stdout is a terminal and rich is installed, else to stdout as plain
    text with no escape codes. ``demo`` writes plain text to ``console.file`` or stdout.
    """
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            from agentctx.replay.demo import run_demo

            budget = Budget(context_window=args.context_window, reserve_output=args.reserve)
            out = sys.stdout if console is None else cast("TextIO", console.file)
            return anyio.run(lambda: run_demo(budget, out))
        return _replay(args, console if console is not None else _terminal_console())
    except (AgentCtxError, OSError, ValueError, RecursionError, MemoryError) as exc:
        # One line whatever the error holds (a path or a parser message with a newline in
        # it, or no message at all, like MemoryError's): never a traceback.
        text = " ".join(str(exc).split()) or type(exc).__name__
        print(f"agentctx: {text}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
