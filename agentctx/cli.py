"""The ``agentctx`` command.

```
agentctx replay [TRANSCRIPT] [--context-window N] [--reserve N] [--strategy deterministic]
```

With no transcript, ``replay`` uses the real session that ships with agentctx, offline.
Errors in the input are one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

import anyio

from agentctx.budget import Budget
from agentctx.data import DEMO_TRANSCRIPT
from agentctx.errors import AgentCtxError
from agentctx.importers import load_transcript
from agentctx.replay import ReplayReport, replay
from agentctx.strategies import DeterministicCompaction

if TYPE_CHECKING:
    from collections.abc import Sequence

    from agentctx.strategy import CompactionContext, CompactionStrategy

__all__ = ["main"]


class _NoCompaction:
    async def compact(self, ctx: CompactionContext) -> None:
        return None


_STRATEGIES: dict[str, type[CompactionStrategy]] = {
    "deterministic": DeterministicCompaction,
    "none": _NoCompaction,
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agentctx", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("replay", help="replay a recorded session through a strategy")
    r.add_argument("transcript", nargs="?", default=str(DEMO_TRANSCRIPT))
    r.add_argument("--context-window", type=int, default=50_000, help="tokens (default 50000)")
    r.add_argument("--reserve", type=int, default=8_000, help="tokens kept for output")
    r.add_argument("--strategy", choices=sorted(_STRATEGIES), default="deterministic")
    return p


def _print_report(report: ReplayReport, out: object) -> None:
    write = out.write  # type: ignore[attr-defined]
    header = (
        f"{'req':>4} {'msgs':>9} {'without':>9} {'with':>9} {'cache rd':>9} {'cache wr':>9}  what"
    )
    write(header + "\n")
    for r in report.rows:
        what = "; ".join(r.actions)
        flags = ("BREAK " if r.cache_break else "") + ("OVER " if r.over_budget else "")
        msgs = f"{r.raw_messages}->{r.view_messages}"
        write(
            f"{r.number:>4} {msgs:>9} {r.tokens_without:>9} {r.tokens_with:>9} "
            f"{r.cache_read:>9} {r.cache_write:>9}  {flags}{what}\n"
        )
    saved = 1 - report.tokens_with / report.tokens_without if report.tokens_without else 0.0
    ratio = report.cost_with / report.cost_without if report.cost_without else 1.0
    write(
        f"\nrequests {len(report.rows)}  budget {report.budget_tokens} tokens  "
        f"over budget {report.over_budget}\n"
        f"tokens sent: {report.tokens_with} with compaction, {report.tokens_without} without "
        f"({saved:.0%} fewer)\n"
        f"simulated input cost: ${report.cost_with:.4f} with, ${report.cost_without:.4f} without "
        f"(x{ratio:.2f})\n"
        f"compactions {report.compactions}  prefix-cache breaks {report.cache_breaks}\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        transcript = load_transcript(args.transcript)
        budget = Budget(context_window=args.context_window, reserve_output=args.reserve)
        strategy = _STRATEGIES[args.strategy]()
        report = anyio.run(lambda: replay(transcript.messages, budget=budget, strategy=strategy))
    except (AgentCtxError, OSError) as exc:
        print(f"agentctx: {exc}", file=sys.stderr)
        return 2
    print(f"{transcript.path} ({transcript.format}, {len(transcript.messages)} messages)")
    _print_report(report, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
