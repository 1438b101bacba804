"""agentctx's cost/retention curve next to every peer's point, on the pi sessions.

    .venv-bench/bin/python benchmarks/frontier.py [--cells NAME@B,...] [--strategies NAME,...]
                                                  [--ratios X,...] [--quick] [--markdown]

(``.venv-bench`` holds the peers' packages, see ``scripts/bench``; with ``.venv/bin/python``
the peers that are not importable are left out and named.)

For each cell (a pi session at a budget B of o200k tokens: ``pi/large-session`` and
``pi/before-compaction`` at 100k and 50k) every agentctx strategy (``DeterministicCompaction``,
the default; ``ToolOutputPipeline`` then the tiers; the ``llm`` strategy of ``agentctx replay``
with the offline extractive summarizer, built as benchmarks/peers.py builds them) runs at each
landing depth ``Budget.target_ratio`` in ``--ratios`` (default 0.05 to 0.6; the library's
default ratio is always run for the default strategy). Each run is replayed and judged exactly
as benchmarks/peers.py judges (`_yardstick.run_agentctx`, `_yardstick.Judge`: exact o200k
tokens, breaks against the strategy-independent minimum, cold rewrites after idle gaps, the
prefix-cache cost at Anthropic prices, requests over B, invalid requests, task lost), with one
difference: agentctx gets a `MemoryRecallStore`, so what it clears stays one
``recall_context`` call away, and every request it sends carries the recall tool's definition
(its tokens counted in each request's size and cost). Per point:

* *cost x none*: the prefix-cache cost against sending the raw history (``none``);
* *breaks (+cold)*: cache breaks while the cache was warm, and rewrites after it expired;
* *paths visible*: the early file paths (`_yardstick.early_paths`) in the final request, as
  peers.py counts them;
* *visible or recall*: those, plus the paths a recall id shown in the final view (its
  `visible_text`) answers with a matching line (`agentctx.replay.retention.recallable`, the
  check of benchmarks/retention.py);
* *planted worst / mean*: benchmarks/retention.py's planted facts (paths, error lines,
  decisions, constraints) on its synthetic workload, the share visible or recallable at the
  worst check and on average over the checks after each compaction. That workload is
  synthetic, not a pi session, so it does not fit the cells: it runs as cells of its own
  (``synthetic seed 0``, 200 calls, at each B of the cells), driven as retention.py drives it
  (owned mode, a `MemoryRecallStore`, the session's clock, a check after every request that
  took a decision), counting with the exact o200k tokenizer, the same strategy and ratio; its
  figures are shown next to the pi point of the same strategy, ratio and B.

The peers (pydantic-ai-harness, LangChain, and ``none``) run once per cell, as peers.py runs
them; they have no recall, so for them *visible or recall* is *visible*.

Then two verdicts:

* *domination*: for each peer point, the cheapest agentctx point of the same cell (any
  strategy, any ratio) that costs no more, keeps at least as many early paths visible or
  recallable, and is sound: no request over B, the task never lost, no invalid request; or
  ``undominated``;
* *defaults* (the default strategy at the default ``Budget.target_ratio``), per cell, against
  the targets: cost <= the cheapest peer with no request over B; breaks <= ceil(1.1 x the
  minimum); 0 requests over B; 0 task lost; >= 90 % early paths visible or recallable;
  >= 95 % planted facts visible or recallable at the worst check (at the cell's B).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import math
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _yardstick as y
import peers as pr
import retention as rt

from agentctx.budget import Budget
from agentctx.events import BudgetExceeded, ContextCompacted
from agentctx.manager import ContextManager
from agentctx.recall import MemoryRecallStore
from agentctx.replay import ReplayClock
from agentctx.replay.jobs import DEFAULT_SUMMARIZER_DELAY, build_strategy
from agentctx.replay.retention import RECALL_ID, recallable, visible_text

if TYPE_CHECKING:
    from collections.abc import Sequence

    from agentctx.messages import Message

RATIOS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6)
QUICK_CELL = "pi/large-session@50k"
QUICK_RATIOS = (0.1, 0.3, 0.5)
PLANTED_SEED = 0
PLANTED_CALLS = 200
PATHS_TARGET = 0.90
PLANTED_TARGET = 0.95
BREAKS_SLACK = 1.1
EPS = 1e-9  # USD: costs this close are equal

AGENTCTX = {
    "agentctx.deterministic": "deterministic",
    "agentctx.pipeline+tiers": "pipeline",
    "agentctx.llm(offline)": "llm",
}
"""agentctx's strategies by name, and their `agentctx.replay.jobs.build_strategy` kind."""
DEFAULT_STRATEGY = "agentctx.deterministic"
DEFAULT_RATIO = next(f.default for f in dataclasses.fields(Budget) if f.name == "target_ratio")
TRIGGER_RATIO = next(f.default for f in dataclasses.fields(Budget) if f.name == "trigger_ratio")


# -- points and the verdicts -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Planted:
    """retention.py's figures for one strategy and ratio at one B."""

    checks: int
    over: int
    worst: float | None  # None: nothing compacted, nothing to check
    mean: float | None
    in_view: int = 0
    recall: int = 0
    lost: int = 0


@dataclass(frozen=True, slots=True)
class Point:
    """One strategy at one landing depth on one cell (a peer: ``ratio`` None)."""

    cell: str
    strategy: str
    ratio: float | None
    cost: float
    x_none: float
    breaks: int
    cold: int
    over: int
    task_lost: int
    invalid: int
    paths: int
    visible: int
    retained: int
    """Early paths visible or one recall away (a peer: = visible)."""
    planted: Planted | None = None
    default: bool = False

    @property
    def peer(self) -> bool:
        return self.ratio is None

    @property
    def holds(self) -> bool:
        """No request over B and the task never lost."""
        return self.over == 0 and self.task_lost == 0

    @property
    def sound(self) -> bool:
        """Holds the budget and never sent a request the provider would refuse."""
        return self.holds and self.invalid == 0

    @property
    def label(self) -> str:
        if self.ratio is None:
            return self.strategy
        return f"{self.strategy} @{self.ratio:g}" + (" (default)" if self.default else "")


def point(
    cell: str,
    r: y.Result,
    none: y.Result,
    ratio: float | None,
    retained: int | None = None,
    planted: Planted | None = None,
    *,
    default: bool = False,
) -> Point:
    return Point(
        cell=cell,
        strategy=r.name,
        ratio=ratio,
        cost=r.cost,
        x_none=r.cost / none.cost if none.cost else math.nan,
        breaks=r.breaks,
        cold=r.cold,
        over=r.over,
        task_lost=r.task_lost,
        invalid=r.invalid,
        paths=r.paths,
        visible=r.paths_kept,
        retained=r.paths_kept if retained is None else retained,
        planted=planted,
        default=default,
    )


def dominator(peer: Point, points: Sequence[Point]) -> Point | None:
    """The cheapest agentctx point of ``peer``'s cell that costs no more than ``peer``, keeps
    at least as many early paths visible or recallable, and is sound (nothing over B, the
    task never lost, nothing invalid); ties go to more paths, then fewer breaks. None: the
    peer is undominated."""
    found = [
        p
        for p in points
        if not p.peer
        and p.cell == peer.cell
        and p.sound
        and p.cost <= peer.cost + EPS
        and p.retained >= peer.retained
    ]
    if not found:
        return None
    return min(found, key=lambda p: (p.cost, -p.retained, p.breaks, p.strategy, p.ratio or 0.0))


@dataclass(frozen=True, slots=True)
class Check:
    """One target of the defaults: what was measured, against what, and whether it is met
    (None: no target, or nothing to hold it against)."""

    name: str
    value: str
    ok: bool | None

    @property
    def mark(self) -> str:
        return "-" if self.ok is None else "ok" if self.ok else "NOT MET"

    def cell(self) -> str:
        return f"{self.value} {self.mark}" if self.ok is not None else self.value


def _pct(n: int | float, d: int | float = 1) -> str:
    return f"{100 * n / d:.0f}%" if d else "-"


def breaks_allowed(minimum: int | None) -> int | None:
    """ceil(1.1 x the minimum), None when the minimum is not defined."""
    return None if minimum is None else math.ceil(round(BREAKS_SLACK * minimum, 9))


def default_checks(default: Point, peers: Sequence[Point], minimum: int | None) -> list[Check]:
    """The default point against the targets (see the module doc)."""
    holding = [p for p in peers if p.peer and p.cell == default.cell and p.over == 0]
    checks = []
    if holding:
        cheapest = min(holding, key=lambda p: (p.cost, p.strategy))
        lost = f", task lost {cheapest.task_lost}" if cheapest.task_lost else ""
        checks.append(
            Check(
                "cost",
                f"{default.x_none:.3f} vs {cheapest.x_none:.3f} ({cheapest.strategy}{lost})",
                default.cost <= cheapest.cost + EPS,
            )
        )
    else:
        checks.append(Check("cost", f"{default.x_none:.3f} (no peer holds B)", None))
    allowed = breaks_allowed(minimum)
    checks.append(
        Check(
            "breaks",
            f"{default.breaks} (+{default.cold}) vs {'n/a' if allowed is None else allowed}",
            None if allowed is None else default.breaks <= allowed,
        )
    )
    checks.append(Check("over B", str(default.over), default.over == 0))
    checks.append(Check("task lost", str(default.task_lost), default.task_lost == 0))
    checks.append(Check("paths visible", f"{_pct(default.visible, default.paths)}", None))
    checks.append(
        Check(
            "paths visible or recall",
            _pct(default.retained, default.paths),
            default.retained >= PATHS_TARGET * default.paths if default.paths else None,
        )
    )
    planted = default.planted
    if planted is None or planted.worst is None:
        what = "not run" if planted is None else "n/a (no compaction)"
        checks.append(Check("planted facts", what, None))
    else:
        checks.append(Check("planted facts", _pct(planted.worst), planted.worst >= PLANTED_TARGET))
    return checks


# -- running ---------------------------------------------------------------------------------------


async def run_agentctx_point(
    canon: y.Canon, session: pr.Session, b: int, name: str, ratio: float
) -> tuple[y.Result, int]:
    """One agentctx strategy at one ratio on one cell, judged as peers.py judges, with a
    `MemoryRecallStore`: the result and the early paths visible or one recall away."""
    kind = AGENTCTX[name]
    judge = y.Judge(
        canon,
        name,
        b,
        task=session.task,
        tools=session.tools,
        overhead=y.recall_tool_tokens(canon),
    )
    retained = [0]

    async def after(ctx: ContextManager, view: list[Message]) -> None:
        final = canon.serialized(judge.last)
        ids = list(dict.fromkeys(RECALL_ID.findall(visible_text(view))))
        kept = 0
        for path in session.paths:
            kept += path in final or await recallable(ctx, ids, path)
        retained[0] = kept

    def make(clock: ReplayClock) -> Any:
        return build_strategy(kind, clock, delay=DEFAULT_SUMMARIZER_DELAY)

    gc.collect()
    done = await y.run_agentctx(
        session.messages,
        judge,
        make,
        b,
        target_ratio=ratio,
        recall=MemoryRecallStore(),
        after=after,
    )
    if kind == "llm":
        judge.result.notes.append(f"{done.splices} briefings spliced")
    return judge.finish(session.paths), retained[0]


async def run_planted(
    canon: y.Canon, workload: rt.Workload, name: str, b: int, ratio: float
) -> Planted:
    """benchmarks/retention.py's run of ``workload`` (owned mode, a `MemoryRecallStore`, a
    check after every request that took a decision, by `retention.check`), for one agentctx
    strategy at one ratio and hard budget ``b``, on a `ReplayClock` (so the ``llm`` strategy's
    offline summarizer takes session time), counting as the pi cells do."""
    row = rt.Row(workload.name, name, b, len(workload.facts))
    row.kinds = {k: Counter() for k in rt.KINDS}
    row.kind_worst = dict.fromkeys(rt.KINDS, 1.0)
    first = next((s for g in workload.groups if (s := rt._stamp(g)) is not None), 0.0)
    clock = ReplayClock(first)
    events: list[Any] = []
    async with ContextManager(
        y.agentctx_budget(b, ratio),
        strategy=build_strategy(AGENTCTX[name], clock, delay=DEFAULT_SUMMARIZER_DELAY),
        counter=y.agentctx_counter(),
        recall=MemoryRecallStore(),
        session_id="retention",
        on_over_budget="send",
        clock=clock,
    ) as ctx:
        ctx.subscribe(events.append)
        view: list[Message] = []
        for group in workload.groups:
            stamp = rt._stamp(group)
            await clock.advance(max(clock(), stamp) if stamp is not None else clock() + 30.0)
            version, seen = ctx.ledger.version, len(events)
            view = await ctx.prepare([*view, *group])
            fresh = events[seen:]
            row.over += any(isinstance(e, BudgetExceeded) for e in fresh)
            if ctx.ledger.version == version and not any(
                isinstance(e, ContextCompacted) for e in fresh
            ):
                continue
            await rt.check(ctx, view, workload, row, set(), explain=False)
        await clock.advance(clock())
    shares = row.per_check
    return Planted(
        checks=row.checks,
        over=row.over,
        worst=min(shares) if shares else None,
        mean=sum(shares) / len(shares) if shares else None,
        in_view=row.split["view"],
        recall=row.split["recall"],
        lost=row.split["lost"],
    )


async def run_peers(
    canon: y.Canon,
    session: pr.Session,
    b: int,
    runners: dict[str, pr.Runner],
    names: Sequence[str],
) -> list[y.Result]:
    """The peers (and ``none``) on one cell, each once, as peers.py runs them."""
    results = []
    for name in names:
        judge = y.Judge(canon, name, b, task=session.task, tools=session.tools)
        gc.collect()
        await runners[name](session, judge, b)
        results.append(judge.finish(session.paths))
    return results


# -- output ----------------------------------------------------------------------------------------


class Out:
    """Plain text (aligned columns) or markdown (headings, pipe tables)."""

    def __init__(self, markdown: bool) -> None:
        self.markdown = markdown

    def heading(self, text: str, level: int = 3) -> None:
        if self.markdown:
            print(f"{'#' * level} {text}\n", flush=True)
        else:
            print(f"== {text} ==\n", flush=True)

    def para(self, text: str) -> None:
        print(f"{text}\n", flush=True)

    def table(self, head: Sequence[str], rows: Sequence[Sequence[str]], right: int = 1) -> None:
        """Columns from ``right`` on are right-aligned (numbers)."""
        if self.markdown:
            rule = ["---" if i < right else "---:" for i in range(len(head))]
            lines = [head, rule, *rows]
            print("\n".join("| " + " | ".join(r) + " |" for r in lines), end="\n\n", flush=True)
            return
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        for r in [head, *rows]:
            cells = [
                c.ljust(w) if i < right else c.rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            ]
            print("  ".join(cells).rstrip())
        print(flush=True)


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


def _planted(p: Planted | None) -> str:
    if p is None:
        return "-"
    if p.worst is None or p.mean is None:
        return "no compaction"
    return f"{_pct(p.worst)} / {_pct(p.mean)}"


def _frac(n: int, d: int) -> str:
    return f"{n}/{d} ({_pct(n, d)})" if d else "-"


POINT_HEAD = (
    "strategy",
    "target_ratio",
    "cost $",
    "x none",
    "breaks (+cold)",
    "over B",
    "task lost",
    "invalid",
    "paths visible",
    "visible or recall",
    "planted worst / mean",
)


def point_row(p: Point) -> list[str]:
    name = p.strategy + (" (default)" if p.default else "")
    return [
        name,
        _ratio(p.ratio),
        f"{p.cost:.2f}",
        f"{p.x_none:.2f}",
        f"{p.breaks} (+{p.cold})",
        str(p.over),
        str(p.task_lost),
        str(p.invalid),
        _frac(p.visible, p.paths),
        _frac(p.retained, p.paths),
        _planted(p.planted),
    ]


def _budget(b: int) -> str:
    return pr._fmt_budget(b)


# -- the run ---------------------------------------------------------------------------------------


def parse_ratios(text: str) -> list[float]:
    ratios = []
    for part in text.split(","):
        if not part.strip():
            continue
        x = float(part)
        if not 0 < x <= TRIGGER_RATIO:
            raise SystemExit(
                f"a target_ratio must be in (0, {TRIGGER_RATIO:g}] (Budget.trigger_ratio): {x:g}"
            )
        ratios.append(x)
    return sorted(set(ratios))


def select(names: Sequence[str], wanted: str | None) -> list[str]:
    if not wanted:
        return list(names)
    keys = [w.strip() for w in wanted.split(",") if w.strip()]
    unknown = [k for k in keys if not any(n.startswith(k) for n in names)]
    if unknown:
        raise SystemExit(f"no strategy starts with {', '.join(unknown)}; known: {', '.join(names)}")
    return [n for n in names if n == "none" or any(n.startswith(k) for k in keys)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument(
        "--cells",
        help="comma-separated NAME@BUDGET cells (default: pi/large-session and "
        "pi/before-compaction at 100k and 50k)",
    )
    parser.add_argument(
        "--strategies",
        help="comma-separated name prefixes, e.g. agentctx,pai.Sliding (none always runs; "
        f"agentctx's: {', '.join(AGENTCTX)})",
    )
    parser.add_argument(
        "--ratios",
        help=f"Budget.target_ratio values to sweep (default {','.join(f'{x:g}' for x in RATIOS)})",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"one cell ({QUICK_CELL}) and three ratios ({','.join(map(str, QUICK_RATIOS))})",
    )
    parser.add_argument("--markdown", action="store_true", help="headings and pipe tables")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    out = Out(args.markdown)

    if args.ratios:
        ratios = parse_ratios(args.ratios)
    else:
        ratios = list(QUICK_RATIOS if args.quick else RATIOS)
    if args.cells:
        cells = [pr.parse_cell(c.strip()) for c in args.cells.split(",") if c.strip()]
    elif args.quick:
        cells = [pr.parse_cell(QUICK_CELL)]
    else:
        cells = [(f"pi/{n}", b) for n in pr.PI for b in (100_000, 50_000)]

    canon = y.Canon()
    runners, missing = pr.strategies([])
    peer_names = [n for n in runners if not n.startswith("agentctx")]
    chosen = select([*peer_names, *AGENTCTX], args.strategies)
    peers = [n for n in chosen if n in peer_names]
    ours = [n for n in chosen if n in AGENTCTX]
    sessions = pr.load_sessions()
    for name, _ in cells:
        if name not in sessions:
            raise SystemExit(f"unknown session {name}; known: {', '.join(sessions)}")

    def depths(name: str) -> list[float]:
        if name == DEFAULT_STRATEGY and DEFAULT_RATIO not in ratios:
            return sorted([*ratios, DEFAULT_RATIO])
        return ratios

    out.heading("Frontier: agentctx's cost/retention curve next to every peer's point", 2)
    out.para(
        f"Tokens: o200k_base, {'exact' if canon.exact else 'ESTIMATED (no tokenizer extra)'}; "
        f"{pr._versions()}. Defaults: Budget.target_ratio = {DEFAULT_RATIO:g}, strategy "
        f"DeterministicCompaction (agentctx.deterministic). agentctx runs with a "
        f"MemoryRecallStore; each run judged as benchmarks/peers.py judges. Ratios swept: "
        f"{', '.join(f'{x:g}' for x in ratios)}."
    )
    for note in missing:
        out.para(f"Not run: {note}")

    # Planted facts: retention.py's synthetic workload, its own cells at each B.
    planted: dict[tuple[str, float, int], Planted] = {}
    budgets = sorted({b for _, b in cells}, reverse=True)
    if ours:
        workload = rt.planted_session(PLANTED_SEED, PLANTED_CALLS)
        kinds = Counter(f.kind for f in workload.facts)
        t0 = time.perf_counter()
        rows = []
        for b in budgets:
            for name in ours:
                for x in depths(name):
                    p = anyio.run(run_planted, canon, workload, name, b, x)
                    planted[(name, x, b)] = p
                    total = p.in_view + p.recall + p.lost
                    rows.append(
                        [
                            f"{workload.name} @{_budget(b)}",
                            name + (" (default)" if _is_default(name, x) else ""),
                            f"{x:g}",
                            str(p.checks),
                            str(p.over),
                            "-" if p.worst is None else _pct(p.worst),
                            "-" if p.mean is None else _pct(p.mean),
                            f"{_pct(p.in_view, total)} / {_pct(p.recall, total)} / "
                            f"{_pct(p.lost, total)}",
                        ]
                    )
        out.heading(f"Planted facts: {workload.name}, {PLANTED_CALLS} calls (own cells)")
        out.para(
            "benchmarks/retention.py's planted workload is synthetic, not a pi session, so it "
            "does not fit the pi cells: it runs here as cells of its own at each B of the pi "
            "cells, and its worst / mean share is shown next to the pi point with the same "
            "strategy, target_ratio and B. Facts: "
            + ", ".join(f"{kinds[k]} {k}" for k in rt.KINDS if kinds[k])
            + f". Target: >= {PLANTED_TARGET:.0%} visible or recallable at every check."
        )
        out.table(
            (
                "cell",
                "strategy",
                "target_ratio",
                "checks",
                "over B",
                "worst",
                "mean",
                "in view / recall only / lost",
            ),
            rows,
            right=2,
        )
        out.para(f"(planted cells: {time.perf_counter() - t0:.1f} s)")

    points: list[Point] = []
    minima: dict[str, int | None] = {}
    for name, b in cells:
        session = sessions[name]
        cell = f"{name}@{_budget(b)}"
        t0 = time.perf_counter()
        pr.check_adapters(canon, session, {n: runners[n] for n in peers})
        bound = y.minimum(canon, pr.raw_requests(canon, session), b)
        minima[cell] = bound.value
        results = anyio.run(run_peers, canon, session, b, runners, peers)
        peers_s = time.perf_counter() - t0
        none = next(r for r in results if r.name == "none")
        cell_points = [point(cell, r, none, None) for r in results]
        for strategy in ours:
            for x in depths(strategy):
                r, kept = anyio.run(run_agentctx_point, canon, session, b, strategy, x)
                cell_points.append(
                    point(
                        cell,
                        r,
                        none,
                        x,
                        kept,
                        planted.get((strategy, x, b)),
                        default=_is_default(strategy, x),
                    )
                )
        points.extend(cell_points)
        allowed = breaks_allowed(bound.value)
        out.heading(
            f"{name}, B = {_budget(b)} ({len(session.calls)} requests, "
            f"{len(session.paths)} early paths)"
        )
        out.para(
            bound.line()
            + f"; ceil(1.1 x minimum) = {'n/a' if allowed is None else allowed}. Planted: "
            f"synthetic seed {PLANTED_SEED} at B = {_budget(b)} (own cell, above)."
        )
        ordered = [p for p in cell_points if not p.peer] + [p for p in cell_points if p.peer]
        out.table(POINT_HEAD, [point_row(p) for p in ordered], right=2)
        notes = [f"{r.name}: {'; '.join(r.notes)}" for r in results if r.notes]
        if notes:
            out.para("Notes: " + " | ".join(notes))
        spent = time.perf_counter() - t0
        out.para(
            f"(cell: {spent:.1f} s; peers once, {peers_s:.1f} s; agentctx "
            f"{sum(len(depths(n)) for n in ours)} runs, {spent - peers_s:.1f} s)"
        )

    # Domination.
    out.heading("Domination: the cheapest agentctx point at least as good as each peer")
    out.para(
        "An agentctx point dominates a peer's when it costs no more, keeps at least as many "
        "early paths visible or recallable (a peer's: visible), and is sound: 0 requests over "
        "B, the task never lost, 0 invalid requests. The cheapest such point is named."
    )
    rows = []
    for p in points:
        if not p.peer:
            continue
        d = dominator(p, points)
        flags = [f"over B {p.over}"] if p.over else []
        flags += [f"task lost {p.task_lost}"] if p.task_lost else []
        flags += [f"invalid {p.invalid}"] if p.invalid else []
        rows.append(
            [
                p.cell,
                p.strategy,
                f"{p.x_none:.2f}",
                _frac(p.retained, p.paths),
                ", ".join(flags) or "holds",
                "undominated" if d is None else d.label,
                "-" if d is None else f"{d.x_none:.2f}",
                "-" if d is None else f"{d.breaks} (+{d.cold})",
                "-" if d is None else _frac(d.retained, d.paths),
            ]
        )
    out.table(
        (
            "cell",
            "peer",
            "x none",
            "paths visible",
            "budget",
            "dominated by",
            "its x none",
            "its breaks",
            "its paths visible or recall",
        ),
        rows,
        right=2,
    )

    # Defaults.
    defaults = [p for p in points if p.default]
    if defaults:
        out.heading(
            f"Defaults: DeterministicCompaction at target_ratio {DEFAULT_RATIO:g}, against the "
            "targets"
        )
        out.para(
            "Targets: cost <= the cheapest peer with 0 requests over B (named; x none); breaks "
            "(warm) <= ceil(1.1 x minimum); 0 over B; 0 task lost; >= "
            f"{PATHS_TARGET:.0%} early paths visible or recallable; >= {PLANTED_TARGET:.0%} "
            f"planted facts visible or recallable at the worst check (synthetic seed "
            f"{PLANTED_SEED} at the cell's B)."
        )
        rows = []
        met = total = 0
        for d in defaults:
            checks = default_checks(d, points, minima[d.cell])
            met += sum(c.ok is True for c in checks)
            total += sum(c.ok is not None for c in checks)
            rows.append([d.cell, *(c.cell() for c in checks)])
        out.table(
            (
                "cell",
                "cost x none vs cheapest holding peer",
                "breaks (+cold) vs allowed",
                "over B",
                "task lost",
                "paths visible",
                "paths visible or recall",
                "planted facts (worst)",
            ),
            rows,
            right=1,
        )
        out.para(f"Defaults meet {met} of {total} targets.")
    else:
        out.para(f"Defaults: not run ({DEFAULT_STRATEGY} not among the strategies).")
    out.para(f"Wall time: {time.perf_counter() - started:.1f} s")
    return 0


def _is_default(name: str, ratio: float) -> bool:
    return name == DEFAULT_STRATEGY and ratio == DEFAULT_RATIO


if __name__ == "__main__":
    sys.exit(main())
