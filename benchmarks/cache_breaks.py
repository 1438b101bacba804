"""Prefix-cache breaks, cost and early-path retention on the pi sessions and the seeded workload.

    python benchmarks/cache_breaks.py [--explain]

For each session and budget (100k and 50k tokens) and each of agentctx's deterministic
strategies, replays the session request by request through `ContextManager` and judges what
was sent with the yardstick `benchmarks/peers.py` judges agentctx's peers with
(`_yardstick`): tokens are exact o200k when the ``tokenizer`` extra is installed (agentctx
counts with its default `MessageCounter`, as peers.py runs it: its estimator, texts of up to
256 characters exact with the extra, and hears the exact size of each request it sent
through ``observe``; without the extra the yardstick itself is agentctx's estimator, and the
header says so); the budget's hard limit is exactly B. Printed per cell: prefix-cache breaks next
to the theoretical minimum, the cold rewrites, simulated input cost against no compaction
(Anthropic prefix cache at Sonnet prices, the cache expiring only where the transcript shows
an idle gap of more than 5 minutes), requests over budget, and how many of the file paths
seen in the first third of the session (tool arguments and tool output) are still in the
final request. ``--explain`` also lists every break and cold rewrite: the prompt the request
would have sent without a new decision (the previous one plus what the raw history grew by),
what it sent, why (over the budget, cold cache, or a batch that paid for itself) and what was
done.

A *break* rewrites what the previous request sent while the cache was warm; the same after
an idle gap over 5 minutes is a *cold* rewrite (the cache had expired: nothing to lose).

The minimum is the same for every strategy (`_yardstick.minimum`): ceil((S0 + G - B) / (B -
R)), S0 the first request, S0 + G the raw size of the last one, B the hard budget, and R = S0
+ the mean tokens of the tail holding the last 10 tool results with their calls, over the
requests whose raw size is above B: the least any compaction that keeps the task and a
working set of 10 results can leave, so each compaction makes at most B - R of room.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _yardstick as y

from agentctx.events import ContextCompacted
from agentctx.importers import load_transcript
from agentctx.strategies import DeterministicCompaction, ToolOutputPipeline
from agentctx.strategy import Chain
from agentctx.testing import synthetic_session

if TYPE_CHECKING:
    from agentctx.messages import Message

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "corpus"


def strategies() -> dict[str, Any]:
    """Builders on the replay's clock, by label."""
    return {
        "pipeline+tiers": lambda clock: Chain([ToolOutputPipeline(), DeterministicCompaction()]),
        "tiers only": lambda clock: DeterministicCompaction(),
    }


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


def explain(result: y.Result, raw: list[int], events: list[list[Any]], limit: int) -> None:
    """One line per break or cold rewrite (see the module docs)."""
    for n in sorted(result.break_at + result.cold_at):
        k = n - 1
        if k == 0:
            continue
        would = result.sizes[k - 1] + raw[k] - raw[k - 1]
        cold = n in result.cold_at
        why = (
            "cold cache"
            if cold
            else "over the budget"
            if would > limit
            else "batch paid for itself"
        )
        actions = tuple(a for e in events[k] if isinstance(e, ContextCompacted) for a in e.actions)
        done = ", ".join(f"{c} {kind}" for kind, c in _kinds(actions).most_common())
        print(
            f"    request {n:>3}: ~{would:>6} -> {result.sizes[k]:>6} tokens "
            f"({'cold' if cold else 'break'}: {why}); {done}"
        )


async def cell(
    canon: y.Canon, name: str, messages: list[Message], b: int, *, verbose: bool
) -> None:
    times = y.request_times(messages)
    converted = [canon.neutral(m) for m in messages]
    raw_requests = [y.merge(converted[:i]) for i in y.calls(messages)]
    task, tools = y.first_user_text(messages), y.tool_names(messages)
    paths = y.early_paths(messages)
    none = y.Judge(canon, "none", b, task=task, tools=tools)
    for request, at in zip(raw_requests, times, strict=True):
        none.add(request, at, merged=True)
    baseline = none.finish(paths)
    bound = y.minimum(canon, raw_requests, b)
    floor = "n/a" if bound.value is None else str(bound.value)
    r_text = "-" if bound.r is None else f"{bound.r:,}"
    print(f"{name:<28} {b // 1000:>4}k S0 {bound.s0:,}, G {bound.g:,}, R {r_text}: min {floor}")
    for label, make in strategies().items():
        judge = y.Judge(canon, label, b, task=task, tools=tools)
        run = await y.run_agentctx(messages, judge, make, b)
        r = judge.finish(paths)
        kept = r.paths_kept / r.paths if r.paths else 1.0
        print(
            f"{name:<28} {b // 1000:>4}k {label:<15} breaks {r.breaks:>3} "
            f"(min {floor:>2}, +{r.cold} cold)  cost x{r.cost / baseline.cost:.2f}  "
            f"over budget {r.over:>2} (peak {r.peak:,})  invalid {r.invalid}  "
            f"task lost {r.task_lost}  "
            f"early paths {kept:.0%} of {r.paths}",
            flush=True,
        )
        if verbose:
            explain(r, baseline.sizes, run.events, b)


def sessions() -> list[tuple[str, list[Message]]]:
    found: list[tuple[str, list[Message]]] = []
    for name in ("large-session", "before-compaction"):
        raw = load_transcript(CORPUS / "pi" / f"{name}.jsonl").messages
        found.append((f"pi/{name}", y.clean_history(raw)))
    synthetic = [m for g in synthetic_session(0, 200, mean_output_lines=35) for m in g]
    found.append(("synthetic seed 0 (200 calls)", y.clean_history(synthetic)))
    return found


async def main() -> None:
    verbose = "--explain" in sys.argv[1:]
    canon = y.Canon()
    print(f"tokens: o200k_base, {'exact' if canon.exact else 'estimated (no tokenizer extra)'}")
    for name, messages in sessions():
        for b in (100_000, 50_000):
            await cell(canon, name, messages, b, verbose=verbose)


if __name__ == "__main__":
    anyio.run(main)
