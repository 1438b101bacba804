"""Retention of early facts after every compaction, on a planted workload and the pi sessions.

    python benchmarks/retention.py [--seeds 0 1 2] [--windows 100000 50000 25000]
                                   [--calls 200] [--no-pi] [--explain]

The target: of facts planted in early turns (paths, error codes, decisions, constraints),
>= 95 % are present in the view or recallable in one call after every compaction; the task
prompt and the latest user message 100 %.

Workloads:

- ``synthetic seed N``: `agentctx.testing.synthetic_session` (heavy-tailed tool output,
  parallel calls, signed thinking, aborted turns; a user prompt every 10 calls) with facts in
  the first third of the calls, each carrying a unique id so presence is a substring check:
  *path*: the ``path`` argument of every read / write call (``src/<word>/file_<n>_<k>.py``);
  *error*: a line ``error E47nn: ...`` put in the middle of every tool output of 40 lines or
  more, where head/tail truncation cuts; *decision*: ``Decision Dnnn: we use ...`` added to the
  text of every third assistant step; *constraint*: ``Constraint Cnn: never touch ...`` added
  to every user prompt. A fact is the whole planted line (or the path), not just its id.
- ``pi/<session>``: the real pi sessions in ``tests/corpus/pi``. Nothing can be planted,
  so the facts are the file paths touched in the first third of the assistant steps (``*path*``
  arguments and path-like tokens of shell commands, as benchmarks/cache_breaks.py counts them).

Each workload is driven call by call through `ContextManager` in owned mode (the view it
returned plus the messages new since, as an agent loop that keeps the view does), with a
`MemoryRecallStore`, ``on_over_budget="send"`` and the session's own clock (timestamps of the
messages), for ``tiers only`` (`DeterministicCompaction`) and ``pipeline+tiers``
(``Chain([ToolOutputPipeline(), DeterministicCompaction()])``), at each hard budget in
``--windows``. After every call that took a decision (the ledger changed or a
`ContextCompacted` event came), every fact already in the raw history is checked:

- *in view*: a substring of the view's visible text (text blocks, tool-call names and
  arguments as JSON and as plain strings, summary text; thinking is not counted);
- *recall only*: not in the view, but a recall id (``ctx-`` + 16 hex) that the view shows
  answers ``ctx.recall(id, pattern=fact)`` with at least one matching line, so the
  model gets it back in one ``recall_context`` call;
- *lost*: neither.

Printed per workload, strategy and budget:

- ``checks``: calls that took a decision, each followed by a check; ``over``: calls whose
  prompt was still over the hard budget (`BudgetExceeded`);
- ``retained worst / mean``: the share of the facts emitted so far that are in the view or
  recallable, at the worst check and averaged over the checks (target >= 95 % at every check,
  so the worst is the figure to hold against it);
- ``in view / recall only / lost``: the split over all (check, fact) pairs;
- one line per fact kind: retained over all its (check, fact) pairs, its worst check, and
  the share found in the view;
- ``task`` / ``latest user``: the share of checks where the first user message and the newest
  user message are in the view verbatim (target 100 %); ``[s]``: wall time of the row.

Then a verdict: which rows miss which target, which rows stayed within it but lost facts,
and which kinds were lost (distinct facts). ``--explain`` also lists the facts lost at each
check, first time only, grouped by what stands in the view for the raw message that held
them: the visible span that hides it and the older span it hides there (with how many of
that one's recall ids the view still shows), or the per-message decisions at it.
"""

from __future__ import annotations

import argparse
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from agentctx.budget import Budget
from agentctx.events import BudgetExceeded, ContextCompacted, Event
from agentctx.importers import load_transcript
from agentctx.ledger import ReplaceSpan
from agentctx.manager import ContextManager
from agentctx.messages import (
    AssistantMessage,
    Message,
    SummaryMessage,
    TextBlock,
    ThinkingBlock,
    ToolResultMessage,
    UserMessage,
    text_of,
)
from agentctx.recall import MemoryRecallStore
from agentctx.replay.retention import recallable, visible_text
from agentctx.strategies import DeterministicCompaction, ToolOutputPipeline
from agentctx.strategy import Chain
from agentctx.testing import synthetic_session

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from agentctx.strategy import CompactionStrategy

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "corpus"
PI_SESSIONS = ("large-session.jsonl", "before-compaction.jsonl")
KINDS = ("path", "error", "decision", "constraint")
TARGET = 0.95
RECALL_ID = re.compile(r"ctx-[0-9a-f]{16}")
PATH = re.compile(r"(?:[\w.-]+/)+[\w.-]+\.\w{1,5}")

_CHOICES = (
    "LALR parser",
    "write-through cache",
    "exponential backoff",
    "SQLite store",
    "streaming decoder",
    "copy-on-write buffer",
    "single retry budget",
    "content-addressed index",
)
_TOPICS = ("config", "session", "token", "query", "stream", "module", "client", "branch")


@dataclass(frozen=True, slots=True)
class Fact:
    kind: str
    text: str
    index: int  # raw index of the message that first holds it


@dataclass(slots=True)
class Workload:
    name: str
    groups: list[list[Message]]
    facts: list[Fact]


@dataclass(slots=True)
class Row:
    workload: str
    strategy: str
    window: int
    facts: int
    checks: int = 0
    over: int = 0
    per_check: list[float] = field(default_factory=list)
    split: Counter[str] = field(default_factory=Counter)  # view / recall / lost
    kinds: dict[str, Counter[str]] = field(default_factory=dict)
    kind_worst: dict[str, float] = field(default_factory=dict)
    task_ok: int = 0
    latest_ok: int = 0
    lost_kinds: Counter[str] = field(default_factory=Counter)  # distinct facts ever lost
    explained: list[str] = field(default_factory=list)
    seconds: float = 0.0


# -- workloads ----------------------------------------------------------------------------


def planted_session(seed: int, calls: int) -> Workload:
    """The synthetic session with facts planted in its first third (see the module doc)."""
    groups = synthetic_session(seed, calls, mean_output_lines=35, prompt_every=10)
    rng = random.Random(f"plant-{seed}")
    facts: list[Fact] = []
    out: list[list[Message]] = [groups[0]]
    index = len(groups[0])
    early = max(1, calls // 3)
    errors = decisions = constraints = 0
    for n, group in enumerate(groups[1:], start=1):
        if n >= early:
            out.append(group)
            index += len(group)
            continue
        new: list[Message] = []
        for m in group:
            at = index + len(new)
            if isinstance(m, AssistantMessage) and m.tool_calls:
                for call in m.tool_calls:
                    path = call.arguments.get("path")
                    if call.name in ("read", "write") and isinstance(path, str):
                        facts.append(Fact("path", path, at))
                if n % 3 == 0:
                    decisions += 1
                    text = (
                        f"Decision D{decisions:03d}: we use the {rng.choice(_CHOICES)} "
                        f"for the {rng.choice(_TOPICS)} layer."
                    )
                    facts.append(Fact("decision", text, at))
                    k = sum(isinstance(blk, ThinkingBlock) for blk in m.content)
                    m = replace(m, content=(*m.content[:k], TextBlock(text), *m.content[k:]))
            elif isinstance(m, ToolResultMessage):
                body = text_of(m.content)
                lines = body.split("\n")
                if len(lines) >= 40 and len(m.content) == 1:
                    errors += 1
                    text = (
                        f"error E{4700 + errors}: {rng.choice(_TOPICS)} handler rejected "
                        f"the {rng.choice(_TOPICS)} token (exit {rng.randint(2, 127)})"
                    )
                    facts.append(Fact("error", text, at))
                    mid = len(lines) // 2
                    body = "\n".join([*lines[:mid], text, *lines[mid:]])
                    m = replace(m, content=(TextBlock(body),))
            elif isinstance(m, UserMessage) and text_of(m.content).startswith("Next:"):
                constraints += 1
                text = (
                    f"Constraint C{constraints:02d}: never touch vendor/{rng.choice(_TOPICS)}/ "
                    f"without asking first."
                )
                facts.append(Fact("constraint", text, at))
                m = replace(m, content=(TextBlock(f"{text_of(m.content)}\n{text}"),))
            new.append(m)
        out.append(new)
        index += len(new)
    return Workload(f"synthetic seed {seed}", out, facts)


def early_paths(messages: Sequence[Message]) -> list[Fact]:
    """Paths touched in the first third of the assistant steps: values of ``*path*``
    arguments and path-like tokens of shell commands (benchmarks/cache_breaks.py's rule)."""
    steps = [i for i, m in enumerate(messages) if isinstance(m, AssistantMessage)]
    found: dict[str, int] = {}
    for i in steps[: len(steps) // 3]:
        m = messages[i]
        assert isinstance(m, AssistantMessage)
        for call in m.tool_calls:
            for key, value in call.arguments.items():
                if not isinstance(value, str):
                    continue
                if "path" in key.lower():
                    found.setdefault(value, i)
                elif key in ("command", "cmd"):
                    for p in PATH.findall(value.split("\n", 1)[0]):
                        found.setdefault(p, i)
    return [Fact("path", p, i) for p, i in found.items()]


def pi_session(name: str) -> Workload:
    """A pi session split at its assistant messages: each group is what one call adds."""
    messages = list(load_transcript(CORPUS / "pi" / name).messages)
    cuts = [i for i, m in enumerate(messages) if isinstance(m, AssistantMessage) and i > 0]
    groups = [messages[a:z] for a, z in zip([0, *cuts[:-1]], cuts, strict=True)]
    return Workload(f"pi/{name}", groups, early_paths(messages))


# -- what the model can see ---------------------------------------------------------------


def what_stands_in(ctx: ContextManager, index: int, shown: set[str]) -> str:
    """What replaced raw message ``index`` in the view: the visible span hiding it and the
    span it directly hides there (with whether that one's recall ids are still shown), or
    the per-message decisions at it."""
    span = ctx.ledger.span_covering(index)
    if span is None:
        decisions = ctx.ledger.decisions_at(index)
        if decisions:
            return "per-message: " + ", ".join(f"{type(d).__name__}:{d.reason}" for d in decisions)
        return "no decision at its message"
    out = f"span {span.reason} [{span.at.index}, {span.end}) shows {_head(span)[:90]!r}"
    inner = [
        d
        for d in ctx.ledger.decisions
        if isinstance(d, ReplaceSpan) and d != span and d.at.index <= index < d.end
    ]
    if inner:
        child = max(inner, key=lambda d: d.end - d.at.index)
        rids = list(dict.fromkeys(RECALL_ID.findall(_head(child))))
        hidden = [r for r in rids if r not in shown]
        out += (
            f"; it hides {child.reason} [{child.at.index}, {child.end}) whose "
            f"{len(rids)} recall id(s) are {len(hidden)} not shown"
        )
    return out


def _head(span: ReplaceSpan) -> str:
    """The first line of each replacement message of ``span``."""
    return " | ".join(
        (m.text if isinstance(m, SummaryMessage) else text_of(m.content)).split("\n", 1)[0]
        for m in span.replacement
    )


# -- driving ------------------------------------------------------------------------------


def strategies() -> dict[str, Callable[[], CompactionStrategy]]:
    return {
        "tiers only": DeterministicCompaction,
        "pipeline+tiers": lambda: Chain([ToolOutputPipeline(), DeterministicCompaction()]),
    }


def _stamp(group: Sequence[Message]) -> float | None:
    stamps = [m.extra.get("timestamp") for m in group]
    found = [s for s in stamps if isinstance(s, int | float)]
    return max(found) / 1000 if found else None


async def run(
    workload: Workload,
    label: str,
    make: Callable[[], CompactionStrategy],
    window: int,
    *,
    explain: bool,
) -> Row:
    budget = Budget(context_window=window + 16_000, reserve_output=16_000)
    row = Row(workload.name, label, window, len(workload.facts))
    row.kinds = {k: Counter() for k in KINDS}
    row.kind_worst = dict.fromkeys(KINDS, 1.0)
    lost_ever: set[str] = set()
    events: list[Event] = []
    first = next((s for g in workload.groups if (s := _stamp(g)) is not None), 0.0)
    now = [first]
    t0 = time.perf_counter()
    async with ContextManager(
        budget,
        strategy=make(),
        recall=MemoryRecallStore(),
        session_id="retention",
        on_over_budget="send",
        clock=lambda: now[0],
    ) as ctx:
        ctx.subscribe(events.append)
        view: list[Message] = []
        for group in workload.groups:
            stamp = _stamp(group)
            now[0] = max(now[0], stamp) if stamp is not None else now[0] + 30.0
            version, seen = ctx.ledger.version, len(events)
            view = await ctx.prepare([*view, *group])
            fresh = events[seen:]
            row.over += any(isinstance(e, BudgetExceeded) for e in fresh)
            if ctx.ledger.version == version and not any(
                isinstance(e, ContextCompacted) for e in fresh
            ):
                continue
            await check(ctx, view, workload, row, lost_ever, explain=explain)
    row.seconds = time.perf_counter() - t0
    return row


async def check(
    ctx: ContextManager,
    view: list[Message],
    workload: Workload,
    row: Row,
    lost_ever: set[str],
    *,
    explain: bool,
) -> None:
    row.checks += 1
    raw = ctx.raw
    text = visible_text(view)
    ids = list(dict.fromkeys(RECALL_ID.findall(text)))
    users = [m for m in raw if isinstance(m, UserMessage)]
    row.task_ok += bool(users) and users[0] in view
    row.latest_ok += bool(users) and users[-1] in view
    emitted = [f for f in workload.facts if f.index < len(raw)]
    by_kind: Counter[str] = Counter()
    kept_by_kind: Counter[str] = Counter()
    newly_lost: dict[str, list[Fact]] = {}
    kept = 0
    for fact in emitted:
        if fact.text in text:
            where = "view"
        elif await recallable(ctx, ids, fact.text):
            where = "recall"
        else:
            where = "lost"
            if fact.text not in lost_ever:
                lost_ever.add(fact.text)
                row.lost_kinds[fact.kind] += 1
                if explain:
                    cause = what_stands_in(ctx, fact.index, set(ids))
                    newly_lost.setdefault(cause, []).append(fact)
        row.split[where] += 1
        row.kinds[fact.kind][where] += 1
        by_kind[fact.kind] += 1
        kept_by_kind[fact.kind] += where != "lost"
        kept += where != "lost"
    for cause, facts in newly_lost.items():
        kinds = Counter(f.kind for f in facts)
        row.explained.append(
            f"    check {row.checks:>2} lost {', '.join(f'{n} {k}' for k, n in kinds.items())} "
            f"(e.g. {facts[0].text[:40]!r}, raw {facts[0].index}): {cause}"
        )
    row.per_check.append(kept / len(emitted) if emitted else 1.0)
    for kind, n in by_kind.items():
        row.kind_worst[kind] = min(row.kind_worst[kind], kept_by_kind[kind] / n)


# -- report -------------------------------------------------------------------------------


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def print_row(row: Row) -> None:
    head = f"{row.workload:<30} {row.window // 1000:>4}k {row.strategy:<15}"
    if not row.checks:
        print(f"{head} no compaction taken ({row.facts} facts); nothing to check")
        return
    total = sum(row.split.values()) or 1
    worst = min(row.per_check)
    mean = sum(row.per_check) / len(row.per_check)
    print(
        f"{head} checks {row.checks:>3} (over {row.over})  facts {row.facts:>3}  retained worst "
        f"{_pct(worst)} mean {_pct(mean)} (target >= {TARGET:.0%} at every check)  "
        f"in view {_pct(row.split['view'] / total)} / recall only "
        f"{_pct(row.split['recall'] / total)} / lost {_pct(row.split['lost'] / total)}"
    )
    kinds = []
    for kind in KINDS:
        c = row.kinds[kind]
        n = sum(c.values())
        if n:
            kinds.append(
                f"{kind} {_pct((n - c['lost']) / n)} (worst {_pct(row.kind_worst[kind])}, "
                f"in view {_pct(c['view'] / n)})"
            )
    print(
        f"    {'; '.join(kinds)}  |  task {_pct(row.task_ok / row.checks)}, latest user "
        f"{_pct(row.latest_ok / row.checks)} (target 100%)  [{row.seconds:.1f}s]"
    )
    for line in row.explained:
        print(line)


def verdict(rows: Sequence[Row]) -> None:
    print()
    misses = []
    for row in rows:
        if not row.checks:
            continue
        what = []
        worst = min(row.per_check)
        if worst < TARGET:
            lost = ", ".join(f"{n} {k}" for k, n in row.lost_kinds.most_common())
            what.append(f"worst retention {_pct(worst)} < {TARGET:.0%} (facts lost: {lost})")
        elif row.lost_kinds:
            lost = ", ".join(f"{n} {k}" for k, n in row.lost_kinds.most_common())
            what.append(f"within target but lost {lost} at some check")
        if row.task_ok < row.checks:
            what.append(f"task missing at {row.checks - row.task_ok} checks")
        if row.latest_ok < row.checks:
            what.append(f"latest user message missing at {row.checks - row.latest_ok} checks")
        if what:
            misses.append(
                f"  {row.workload} {row.window // 1000}k {row.strategy}: " + "; ".join(what)
            )
    hits = sum(
        1
        for r in rows
        if r.checks
        and min(r.per_check) >= TARGET
        and r.task_ok == r.latest_ok == r.checks
        and not r.lost_kinds
    )
    checked = sum(1 for r in rows if r.checks)
    print(f"rows meeting every target with nothing lost: {hits} of {checked} that compacted")
    if misses:
        print("rows that miss a target or lost a fact:")
        for line in misses:
            print(line)
    total: Counter[str] = Counter()
    for r in rows:
        total.update(r.lost_kinds)
    print(
        "kinds lost (distinct facts, summed over rows): "
        + (", ".join(f"{k} {n}" for k, n in total.most_common()) if total else "none")
    )


async def main(args: argparse.Namespace) -> None:
    workloads = [planted_session(seed, args.calls) for seed in args.seeds]
    if not args.no_pi:
        workloads += [pi_session(name) for name in PI_SESSIONS]
    rows: list[Row] = []
    for workload in workloads:
        kinds = Counter(f.kind for f in workload.facts)
        print(
            f"{workload.name}: {len(workload.groups)} calls, facts "
            + ", ".join(f"{kinds[k]} {k}" for k in KINDS if kinds[k])
        )
    for workload in workloads:
        for window in args.windows:
            for label, make in strategies().items():
                row = await run(workload, label, make, window, explain=args.explain)
                print_row(row)
                rows.append(row)
    verdict(rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--windows", type=int, nargs="+", default=[100_000, 50_000, 25_000])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--no-pi", action="store_true", help="only the synthetic workload")
    parser.add_argument("--explain", action="store_true", help="list each lost fact once")
    anyio.run(main, parser.parse_args())
