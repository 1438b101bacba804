"""Two revisions' `prepare()` side by side in one process: the same pi cells, call by call.

```sh
.venv-bench/bin/python benchmarks/ab.py --base f70a7bb [--cells ...] [--strategy pipeline]
```

The machine's speed moves by up to 2x between runs, so two runs of `peers.py` cannot tell a
10 % change from noise. Here the base revision's `agentctx` (taken from git, imported as
``agentctx_base``) and the working tree's run in one process on the same requests, as
`peers.py` replays them: each request's new messages converted right before the call, the
exact o200k size of what was sent reported back through ``observe`` (counting it leaves the
caches as `peers.py`'s judge does between requests), one checkpoint of the loop for the
background calibration. Their `prepare()` calls alternate, the order flipping each request,
so a change of the machine's state hits both alike.

Printed per cell: both p50s over the calls that decided nothing in either, their ratio, the
median of the per-call ratios (new / base; below 1 is faster), and whether the two sent the
same view on every call (else the first call where they differ). The same revision against
itself gives 1.00 within about 0.02, and the same views.

``--decisions N`` compares the calls that decide instead: `long_session.py`'s generated session
to N raw messages, owned mode, each call reporting the usage `long_session.reported_tokens`
gives (a recall store, the 60k window), with the calling thread's CPU time as there. Printed:
each side's decisions and their p50 / p90 / max, the ratio of the p50s, and the first call
where the two sent different views (none: the change left every decision as it was).
"""

from __future__ import annotations

import argparse
import io
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _yardstick as y  # noqa: E402
import peers  # noqa: E402

DEFAULT_CELLS = (
    "pi/large-session@100k,pi/before-compaction@50k,pi/large-session@50k,pi/before-compaction@100k"
)
_NAME = re.compile(r"\bagentctx\b")


def import_revision(rev: str, into: Path) -> None:
    """Make ``agentctx`` as of git revision ``rev`` importable as ``agentctx_base``."""
    tar = subprocess.run(
        ["git", "-C", str(HERE.parent), "archive", rev, "agentctx"],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        if hasattr(tarfile, "data_filter"):  # Python 3.11.4 and later
            archive.extractall(into, filter="data")
        else:  # the repository's own archive: nothing in it points outside ``into``
            archive.extractall(into)
    package = into / "agentctx_base"
    (into / "agentctx").rename(package)
    for source in package.rglob("*.py"):
        source.write_text(_NAME.sub("agentctx_base", source.read_text("utf-8")), "utf-8")
    sys.path.insert(0, str(into))


class Side:
    """One revision's manager on one cell."""

    def __init__(
        self, package: str, kind: str, first: float, budget: int, *, recall: bool = False
    ) -> None:
        from importlib import import_module

        def module(name: str) -> Any:
            return import_module(f"{package}.{name}")

        self.messages = module("messages")
        self.clock = module("replay").ReplayClock(first)
        jobs = module("replay.jobs")
        strategy = jobs.build_strategy(kind, self.clock, delay=jobs.DEFAULT_SUMMARIZER_DELAY)
        window = budget + y.RESERVE
        self.manager = module("manager").ContextManager(
            module("budget").Budget(context_window=window, reserve_output=y.RESERVE),
            strategy=strategy,
            counter=module("tokens").MessageCounter(),
            recall=module("recall").MemoryRecallStore() if recall else None,
            session_id="bench",
            on_over_budget="send",
            clock=self.clock,
        )
        self.history: list[Any] = []
        self.view: list[Any] = []
        self.times: list[float] = []


async def cell(name: str, budget: int, kind: str) -> tuple[float, float, float, int, int | None]:
    """(new p50, base p50, median per-call ratio, calls compared, the first call whose views
    differ or ``None``); milliseconds."""
    from agentctx.messages import from_dict, to_dict

    session = peers.load_sessions()[name]
    dicts = [to_dict(m) for m in session.messages]
    times = y.request_times(session.messages)
    first = next((t for t in times if t is not None), 0.0)
    canon = y.Canon()
    sides = [Side(p, kind, first, budget) for p in ("agentctx", "agentctx_base")]
    for side in sides:
        await side.manager.__aenter__()
    ratios: list[float] = []
    differ: int | None = None
    try:
        for k, i in enumerate(y.calls(session.messages)):
            at = times[k]
            decided = False
            elapsed = []
            order = sides if k % 2 == 0 else sides[::-1]
            for side in order:
                await side.clock.advance(at if at is not None else side.clock() + 30.0)
                side.history += [side.messages.from_dict(d) for d in dicts[len(side.history) : i]]
                version = side.manager.ledger.version
                started = time.perf_counter()
                side.view = await side.manager.prepare(side.history)
                elapsed.append((side, time.perf_counter() - started))
                decided = decided or side.manager.ledger.version != version
            views = {}
            for side in order:  # the background calibrations run in this order too
                views[side] = [side.messages.to_dict(m) for m in side.view]
                sent = [canon.neutral(from_dict(d)) for d in views[side]]
                tokens = sum(canon.tokens_of(m) for m in y.merge(sent))
                side.manager.observe(side.messages.Usage(input_tokens=tokens))
            if differ is None and views[sides[0]] != views[sides[1]]:
                differ = k
            await anyio.lowlevel.checkpoint()
            if not decided:
                for side, seconds in elapsed:
                    side.times.append(seconds * 1000)
                ratios.append(sides[0].times[-1] / sides[1].times[-1])
    finally:
        for side in sides[::-1]:
            await side.manager.__aexit__(None, None, None)
    new, base = (statistics.median(side.times) for side in sides)
    return new, base, statistics.median(ratios), len(ratios), differ


async def decisions(upto: int, kind: str) -> tuple[list[Side], int | None]:
    """`long_session.py`'s session to ``upto`` raw messages through both revisions, call by
    call; the two sides (their ``times``: the calls that decided) and the first call whose
    views differ."""
    import long_session

    from agentctx.messages import from_dict, to_dict

    clock = [0.0]
    turns = long_session.turns(0, clock)
    budget = 60_000 - 8_000  # long_session's default window less its reserve: the same limit
    sides = [Side(p, kind, 0.0, budget, recall=True) for p in ("agentctx", "agentctx_base")]
    differ: int | None = None
    for side in sides:
        await side.manager.__aenter__()
    try:
        k = 0
        while len(sides[0].manager.raw) < upto:
            k += 1
            group = [to_dict(m) for m in next(turns)]
            for side in sides if k % 2 else sides[::-1]:
                await side.clock.advance(max(side.clock(), clock[0]))
                new = [side.messages.from_dict(d) for d in group]
                version = side.manager.ledger.version
                started = time.thread_time()
                side.view = await side.manager.prepare([*side.view, *new])
                if side.manager.ledger.version != version:
                    side.times.append((time.thread_time() - started) * 1000)
            sent = [[side.messages.to_dict(m) for m in side.view] for side in sides]
            if differ is None and sent[0] != sent[1]:
                differ = k
            for side, view in zip(sides, sent, strict=True):
                tokens = long_session.reported_tokens([from_dict(d) for d in view])
                side.manager.observe(side.messages.Usage(input_tokens=tokens, output_tokens=200))
            await anyio.lowlevel.checkpoint()
    finally:
        for side in sides[::-1]:
            await side.manager.__aexit__(None, None, None)
    return sides, differ


def _decisions_report(base: str, kind: str, upto: int) -> None:
    sides, differ = anyio.run(decisions, upto, kind)
    print(f"working tree against {base}, {kind}, long_session's session to {upto} messages")
    print(f"{'side':<14} {'decisions':>9} {'p50':>7} {'p90':>7} {'max':>7}")
    p50s = []
    for label, side in zip(("working tree", base), sides, strict=True):
        times = sorted(side.times)
        p50s.append(statistics.median(times))
        p90 = times[min(len(times) - 1, int(0.9 * len(times)))]
        print(f"{label:<14} {len(times):>9} {p50s[-1]:7.2f} {p90:7.2f} {times[-1]:7.2f}")
    where = "every view the same" if differ is None else f"views differ from call {differ} on"
    print(f"(ms of the calling thread's CPU time; p50 ratio {p50s[0] / p50s[1]:.3f}; {where})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="git revision to compare against")
    parser.add_argument("--cells", default=DEFAULT_CELLS, help="comma-separated NAME@BUDGET")
    parser.add_argument(
        "--strategy", default="deterministic", choices=("deterministic", "pipeline", "llm")
    )
    parser.add_argument(
        "--decisions",
        type=int,
        metavar="N",
        help="compare the calls that decide, on long_session.py's session to N messages",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        import_revision(args.base, Path(tmp))
        if args.decisions is not None:
            _decisions_report(args.base, args.strategy, args.decisions)
            return 0
        print(f"working tree against {args.base}, {args.strategy}")
        print(
            f"{'cell':<28} {'new p50':>9} {'base p50':>9} {'ratio':>6} {'per call':>9} {'calls':>6}"
            f" {'views':>10}"
        )
        for text in args.cells.split(","):
            name, budget = peers.parse_cell(text)
            new, base, per_call, n, differ = anyio.run(cell, name, budget, args.strategy)
            views = "same" if differ is None else f"differ@{differ}"
            print(
                f"{text:<28} {new:9.3f} {base:9.3f} {new / base:6.3f} {per_call:9.3f} {n:6d}"
                f" {views:>10}"
            )
    print(
        "(ms; p50 over the calls that decided nothing in either; ratio: new / base; views: the"
        " same on every call, or the first call where they differ)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
