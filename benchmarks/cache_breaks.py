"""Prefix-cache breaks, cost and early-path retention on the pi sessions and the seeded workload.

    python benchmarks/cache_breaks.py [--explain]

For each session and budget (100k and 50k tokens) and each strategy, replays the session
request by request (`agentctx.replay`) and prints: prefix-cache breaks next to the
theoretical minimum ceil((S0 + G - B) / (B - R)), simulated input cost against no compaction
(ideal Anthropic-style prefix cache), requests over budget, and the share of file paths
touched in the first third of the session that are still visible in the final request.
``--explain`` also lists every break and cold rewrite: the prompt it would have sent, what it
sent, why (over the budget, cold cache, or a batch that paid for itself) and what was done.

The minimum: S0 is the first request, S0 + G the raw size of the last one, B the hard budget,
and R the smallest context a compaction leaves: the smallest prompt sent right after a cache
break, but never more than the budget's target. Every compaction makes at most B - R of room
before the prompt reaches B again, hence the bound. R is capped at the target because a
strategy that stops short of the target at every break would otherwise lower its own bar
(compacting from 100k to 95k each time makes the "minimum" 20x larger); taking the smallest
R seen rather than a typical one means a single deep compaction sets the bar for all of them,
so landing at a consistent depth matters as much as going deep.
"""

from __future__ import annotations

import math
import re
import sys
from collections import Counter
from pathlib import Path

import anyio

from agentctx.budget import Budget
from agentctx.importers import load_transcript
from agentctx.messages import AssistantMessage, Message, canonical_json
from agentctx.replay import ReplayReport, replay
from agentctx.strategies import DeterministicCompaction, ToolOutputPipeline
from agentctx.strategy import Chain
from agentctx.testing import synthetic_session

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "corpus"
PATH = re.compile(r"(?:[\w.-]+/)+[\w.-]+\.\w{1,5}")


def early_paths(messages: list[Message]) -> set[str]:
    """Paths touched in the first third of the assistant turns: values of ``*path*`` arguments
    and path-like tokens of shell commands (as the peers' measurements count them)."""
    turns = [m for m in messages if isinstance(m, AssistantMessage)]
    found: set[str] = set()
    for m in turns[: len(turns) // 3]:
        for call in m.tool_calls:
            for key, value in call.arguments.items():
                if not isinstance(value, str):
                    continue
                if "path" in key.lower():
                    found.add(value)
                elif key in ("command", "cmd"):
                    found.update(PATH.findall(value.split("\n", 1)[0]))
    return found


def strategies() -> dict[str, object]:
    return {
        "pipeline+tiers": Chain([ToolOutputPipeline(), DeterministicCompaction()]),
        "tiers only": DeterministicCompaction(),
    }


def explain(report: ReplayReport, limit: int) -> None:
    """One line per break or cold rewrite: the prompt the request would have sent without a
    new decision (the previous one plus what the raw history grew by), what it sent, why."""
    previous = None
    for row in report.rows:
        if previous is not None and (row.cache_break or row.cold_rewrite):
            would = previous.tokens_with + row.tokens_without - previous.tokens_without
            why = (
                "cold cache"
                if row.cold_rewrite
                else "over the budget"
                if would > limit
                else "batch paid for itself"
            )
            done = ", ".join(f"{n} {k}" for k, n in _kinds(row.actions).most_common())
            print(
                f"    request {row.number:>3}: ~{would:>6} -> {row.tokens_with:>6} tokens "
                f"({'break' if row.cache_break else 'cold'}: {why}); {done}"
            )
        previous = row


_KINDS = (
    (re.compile(r"(mc|l0|l2|budget-forced): "), None),
    (re.compile(r"condensed (\d+) old turns"), "turns condensed to a line"),
    (re.compile(r"dropped (\d+) messages"), "messages dropped behind a marker"),
    (re.compile(r"condensed .* output"), "results condensed (L1)"),
    (re.compile(r"cleared arguments"), "arguments cleared"),
    (re.compile(r"truncated arguments"), "arguments truncated"),
    (re.compile(r"truncated .* result"), "results truncated"),
    (re.compile(r"dropped thinking"), "thinking dropped"),
)


def _kinds(actions: tuple[str, ...]) -> Counter[str]:
    """What a request's decisions did, by kind, counting turns and messages where given."""
    kinds: Counter[str] = Counter()
    for action in actions:
        for pattern, label in _KINDS:
            m = pattern.match(action)
            if m:
                if label is None:
                    kinds[f"results expired ({m.group(1)})"] += 1
                else:
                    kinds[label] += int(m.group(1)) if m.groups() else 1
                break
        else:
            kinds[action.split(" ", 1)[0]] += 1
    return kinds


async def cell(name: str, messages: list[Message], window: int, *, verbose: bool) -> None:
    budget = Budget(context_window=window + 16_000, reserve_output=16_000)
    paths = early_paths(messages)
    for label, strategy in strategies().items():
        report = await replay(messages, budget=budget, strategy=strategy)  # type: ignore[arg-type]
        rows = report.rows
        s0 = rows[0].tokens_without
        growth = rows[-1].tokens_without - s0
        after = [r.tokens_with for r in rows if r.cache_break]
        smallest = min([budget.target_tokens, *after])
        b = budget.limit
        minimum = max(0, math.ceil((s0 + growth - b) / max(1, b - smallest)))
        final = "\n".join(canonical_json(m) for m in report.final_view)
        kept = sum(p in final for p in paths) / len(paths) if paths else 1.0
        ratio = report.cost_with / report.cost_without
        print(
            f"{name:<26} {window // 1000:>4}k {label:<15} breaks {report.cache_breaks:>3} "
            f"(min {minimum:>2}, +{report.cold_rewrites} cold)  cost x{ratio:.2f}  "
            f"over budget {report.over_budget:>2}  "
            f"early paths {kept:.0%} of {len(paths)}"
        )
        if verbose:
            explain(report, b)


async def main() -> None:
    verbose = "--explain" in sys.argv[1:]
    sessions: list[tuple[str, list[Message]]] = []
    for name in ("large-session.jsonl", "before-compaction.jsonl"):
        sessions.append((f"pi/{name}", list(load_transcript(CORPUS / "pi" / name).messages)))
    synthetic = [m for g in synthetic_session(0, 200, mean_output_lines=35) for m in g]
    sessions.append(("synthetic seed 0 (200 calls)", synthetic))
    for name, messages in sessions:
        for window in (100_000, 50_000):
            await cell(name, messages, window, verbose=verbose)


if __name__ == "__main__":
    anyio.run(main)
