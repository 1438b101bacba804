"""Time `ContextManager.prepare()` on a seeded ~200-call / ~150k-token workload.

    python benchmarks/hot_path.py [--seed 0] [--window 60000] [--repeat 3]

Prints p50/p99 of prepare() on calls that took no new decision and on calls that did, and the
ratio to ``json.dumps`` of the same history measured in the same run (machines are noisy;
ratios are what to compare). Owned mode, as an agent loop that keeps the returned view.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import anyio
import anyio.lowlevel

from agentctx.budget import Budget
from agentctx.manager import ContextManager
from agentctx.messages import Message, Usage, to_dict
from agentctx.recall import MemoryRecallStore
from agentctx.testing import synthetic_session
from agentctx.tokens import MessageCounter


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def run(
    seed: int, window: int
) -> tuple[list[float], list[float], list[float], list[float], list[float], int]:
    groups = synthetic_session(seed, 200, mean_output_lines=35)
    idle: list[float] = []
    decided: list[float] = []
    ratios: list[float] = []
    observed: list[float] = []
    background: list[float] = []
    async with ContextManager(
        Budget(context_window=window, reserve_output=8_000),
        recall=MemoryRecallStore(),
        session_id="hot-path",  # recall ids name it: a random one varies the decisions run to run
        on_over_budget="send",
    ) as ctx:
        history: list[Message] = []
        dicts: list[object] = []
        provider = MessageCounter(lazy=False)
        for group in groups:
            history = [*history, *group]
            dicts.extend(to_dict(m) for m in group)
            version = ctx.ledger.version
            t0 = time.perf_counter()
            view = await ctx.prepare(history)
            elapsed = time.perf_counter() - t0
            t1 = time.perf_counter()
            json.dumps(dicts)
            dumps = time.perf_counter() - t1
            if ctx.ledger.version == version:
                idle.append(elapsed)
                ratios.append(elapsed / dumps)
            else:
                decided.append(elapsed)
            # The provider's reported usage after the call: what a counter of its own (not the
            # session's, which a report calibrates) makes of the view, plus a 3k-token system
            # prompt. Fed its own calibrated count, the calibration would chase it up to its
            # bounds (1.6x by call 52), and every later call would decide on an inflated size.
            usage = Usage(input_tokens=provider.count_many(view) + 3_000)
            t2 = time.perf_counter()
            ctx.observe(usage)
            observed.append(time.perf_counter() - t2)
            t3 = time.perf_counter()
            await anyio.lowlevel.checkpoint()  # the tools run: what observe left runs here
            background.append(time.perf_counter() - t3)
            history = view
        # Sized by a fresh counter: the session's own is calibrated on this run's feedback.
        total = MessageCounter(lazy=False).count_many(ctx.raw)
    return idle, decided, ratios, observed, background, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--window", type=int, default=60_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    idle: list[float] = []
    decided: list[float] = []
    ratios: list[float] = []
    observed: list[float] = []
    background: list[float] = []
    total = 0
    for r in range(args.repeat):
        i, d, q, o, g, total = anyio.run(run, args.seed, args.window)
        if r:  # the first run warms caches and the interpreter
            idle += i
            decided += d
            ratios += q
            observed += o
            background += g
    ms = 1000.0
    print(f"workload: 200 model calls, {total} tokens of raw history (seed {args.seed})")
    print(
        f"budget: {args.window} window; {len(idle)} no-decision calls, "
        f"{len(decided)} decision calls"
    )
    print(
        f"no-decision prepare: p50 {pct(idle, 0.5) * ms:.3f} ms (target <= 0.1)  "
        f"p99 {pct(idle, 0.99) * ms:.3f} ms (target <= 1)"
    )
    print(
        f"ratio to json.dumps of the same history: median {statistics.median(ratios):.4f}  "
        f"p99 {pct(ratios, 0.99):.4f} (target <= 0.05)"
    )
    print(
        f"observe() after each call: p50 {pct(observed, 0.5) * ms:.3f} ms  "
        f"p99 {pct(observed, 0.99) * ms:.3f} ms; the calibration it leaves to the background "
        f"(a full estimate of what was sent new): p50 {pct(background, 0.5) * ms:.3f} ms  "
        f"p99 {pct(background, 0.99) * ms:.3f} ms"
    )
    if decided:
        print(
            f"decision prepare: p50 {pct(decided, 0.5) * ms:.2f} ms  "
            f"p99 {pct(decided, 0.99) * ms:.2f} ms (target <= 10)  max {max(decided) * ms:.2f} ms"
        )


if __name__ == "__main__":
    main()
