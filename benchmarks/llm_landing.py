"""Does a briefing pay for itself? The LLM strategy next to the deterministic tiers, per cell.

    python benchmarks/llm_landing.py [--rows] [--target-ratio R] [--no-updates]

Replays the pi sessions (`tests/corpus/pi/large-session.jsonl`, `before-compaction.jsonl`) at
budgets of 100k and 50k tokens (`agentctx.replay`, an ideal prefix cache priced at Claude
Sonnet list prices) with (a) `DeterministicCompaction()` and (b)
``Chain([LlmCompaction(OfflineSummarizer), DeterministicCompaction()])``, the offline
summarizer answering after the CLI's default delay of session time. Per cell and strategy it
prints the prefix-cache breaks, the input cost against sending everything (x none), the
summarizer's spend (its tokens, priced at Claude Haiku 4.5 list prices since the offline model
has none), the requests over budget, and the landing depth: the prompt size in thousands of
tokens right after each break or cold rewrite (a splice marked ``*``).

Each cell ends with the condition the LLM strategy must meet:
``cost(llm) <= cost(deterministic) + summarizer spend``, in USD. ``--rows`` also lists every
request that compacted, with its actions. ``--target-ratio`` sets `Budget.target_ratio` (default:
the library's), ``--no-updates`` runs the LLM strategy with ``update_ratio=None`` (a waiting
briefing is never brought up to date).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from agentctx.budget import Budget
from agentctx.importers import load_transcript
from agentctx.pricing import price_for
from agentctx.replay import ReplayReport, replay
from agentctx.replay.engine import ReplayClock
from agentctx.replay.jobs import DEFAULT_SUMMARIZER_DELAY
from agentctx.replay.offline_summarizer import OfflineSummarizer
from agentctx.strategies import DeterministicCompaction
from agentctx.strategies.llm import LlmCompaction, LlmCompactionConfig
from agentctx.strategy import Chain

if TYPE_CHECKING:
    from agentctx.messages import Message

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "corpus"
SUMMARIZER_PRICE_MODEL = "claude-haiku-4-5"


def landings(report: ReplayReport) -> str:
    """The prompt size after each break or cold rewrite, in k tokens; ``*`` marks a splice."""
    out = []
    for row in report.rows:
        if row.cache_break or row.cold_rewrite:
            mark = "*" if row.summarized else ""
            cold = "c" if row.cold_rewrite else ""
            out.append(f"{row.tokens_with / 1000:.1f}{mark}{cold}")
    return " ".join(out) or "-"


def describe(label: str, report: ReplayReport, extra: str = "") -> None:
    ratio = report.cost_with / report.cost_without
    print(
        f"    {label:<14} breaks {report.cache_breaks:>3} (+{report.cold_rewrites} cold)  "
        f"cost x{ratio:.3f} (${report.cost_with:.3f})  over budget {report.over_budget:>2}"
        f"{extra}"
    )
    print(f"    {'':<14} landings (k): {landings(report)}")


def rows(report: ReplayReport) -> None:
    for row in report.rows:
        if row.cache_break or row.cold_rewrite or row.summarized:
            print(
                f"      request {row.number:>3}: raw {row.tokens_without:>6} -> "
                f"{row.tokens_with:>6}{' break' if row.cache_break else ''}"
                f"{' cold' if row.cold_rewrite else ''}"
            )
            for action in row.actions:
                print(f"        {action[:140]}")
            for note in row.notes:
                print(f"        ({note})")


async def cell(
    name: str,
    messages: list[Message],
    window: int,
    *,
    verbose: bool,
    target_ratio: float | None = None,
    updates: bool = True,
) -> bool:
    budget = Budget(context_window=window + 16_000, reserve_output=16_000)
    if target_ratio is not None:
        budget = Budget(
            context_window=window + 16_000,
            reserve_output=16_000,
            trigger_ratio=max(budget.trigger_ratio, target_ratio),
            target_ratio=target_ratio,
        )
    print(f"{name} at {window // 1000}k (target {budget.target_tokens}, limit {budget.limit})")
    det = await replay(messages, budget=budget, strategy=DeterministicCompaction())
    describe("deterministic", det)
    if verbose:
        rows(det)
    clock = ReplayClock()
    tiers = DeterministicCompaction()
    summarizer = OfflineSummarizer(DEFAULT_SUMMARIZER_DELAY, sleep=clock.sleep)
    config = LlmCompactionConfig() if updates else LlmCompactionConfig(update_ratio=None)
    llm = LlmCompaction(summarizer, config, fallback=tiers, clock=clock, sleep=clock.sleep)
    report = await replay(messages, budget=budget, strategy=Chain([llm, tiers]), clock=clock)
    spend = llm.spend
    price = price_for(SUMMARIZER_PRICE_MODEL)
    assert price is not None
    usd = price.cost(spend.usage)
    describe(
        "llm",
        report,
        f"  splices {report.splices}  summarizer {spend.requests} requests "
        f"{spend.usage.input_tokens}+{spend.usage.output_tokens} tokens = ${usd:.4f}",
    )
    if verbose:
        rows(report)
    allowed = det.cost_with + usd
    ok = report.cost_with <= allowed
    print(
        f"    condition: llm ${report.cost_with:.4f} <= deterministic ${det.cost_with:.4f} "
        f"+ summarizer ${usd:.4f} = ${allowed:.4f}: {'met' if ok else 'NOT met'}"
    )
    return ok


async def main() -> None:
    args = sys.argv[1:]
    verbose = "--rows" in args
    updates = "--no-updates" not in args
    target_ratio = (
        float(args[args.index("--target-ratio") + 1]) if "--target-ratio" in args else None
    )
    met = 0
    cells = 0
    for file in ("large-session.jsonl", "before-compaction.jsonl"):
        messages = list(load_transcript(CORPUS / "pi" / file).messages)
        for window in (100_000, 50_000):
            met += await cell(
                f"pi/{file}",
                messages,
                window,
                verbose=verbose,
                target_ratio=target_ratio,
                updates=updates,
            )
            cells += 1
    print(f"condition met in {met} of {cells} cells")


if __name__ == "__main__":
    anyio.run(main)
