"""Prefix-cache breaks, cost and early-path retention on the pi sessions and the seeded workload.

    python benchmarks/cache_breaks.py

For each session and budget (100k and 50k tokens) and each strategy, replays the session
request by request (`agentctx.replay`) and prints: prefix-cache breaks next to the
theoretical minimum ceil((S0 + G - B) / (B - R)) (S0 first request, G growth, B budget, R the
smallest context a compaction left), simulated input cost against no compaction (ideal
Anthropic-style prefix cache), requests over budget, and the share of file paths touched in
the first third of the session that are still visible in the final request.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import anyio

from agentctx.budget import Budget
from agentctx.importers import load_transcript
from agentctx.messages import AssistantMessage, Message, canonical_json
from agentctx.replay import replay
from agentctx.strategies import DeterministicCompaction, ToolOutputPipeline
from agentctx.strategy import Chain
from agentctx.testing import synthetic_session

CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "corpus"
PATH = re.compile(r"(?:[\w.-]+/)+[\w.-]+\.\w{1,5}")


def early_paths(messages: list[Message]) -> set[str]:
    """Paths touched in the first third of the assistant turns: values of ``*path*`` arguments
    and path-like tokens of shell commands (as reference/peer-baselines.md counts them)."""
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


async def cell(name: str, messages: list[Message], window: int) -> None:
    budget = Budget(context_window=window + 16_000, reserve_output=16_000)
    paths = early_paths(messages)
    for label, strategy in strategies().items():
        report = await replay(messages, budget=budget, strategy=strategy)  # type: ignore[arg-type]
        rows = report.rows
        s0 = rows[0].tokens_without
        growth = rows[-1].tokens_without - s0
        after = [r.tokens_with for r in rows if r.cache_break] or [budget.target_tokens]
        smallest = min(after)
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


async def main() -> None:
    sessions: list[tuple[str, list[Message]]] = []
    for name in ("large-session.jsonl", "before-compaction.jsonl"):
        sessions.append((f"pi/{name}", list(load_transcript(CORPUS / "pi" / name).messages)))
    synthetic = [m for g in synthetic_session(0, 200, mean_output_lines=35) for m in g]
    sessions.append(("synthetic seed 0 (200 calls)", synthetic))
    for name, messages in sessions:
        for window in (100_000, 50_000):
            await cell(name, messages, window)


if __name__ == "__main__":
    anyio.run(main)
