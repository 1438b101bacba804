"""prepare() cost and memory as a session grows to 1k, 10k and 100k messages.

    python benchmarks/long_session.py [--quick] [--mode both] [--window 60000] [--seed 0]
                                      [--one-task]

Each built-in strategy runs one seeded session in each mode, owned (the caller keeps the view
and appends to it) and projection (the caller appends to its own raw history and passes it
whole), with a `MemoryRecallStore`, in a process of its own so its memory is its own:
``deterministic`` (`DeterministicCompaction`), ``pipeline+tiers``
(``Chain([ToolOutputPipeline(), DeterministicCompaction()])``) and ``llm`` (`LlmCompaction`
with a scripted summarizer that answers at once, the tiers as its fallback). The session is a
generated agent loop: one tool call a step, heavy-tailed output, a user prompt every 15 steps,
timestamps a few seconds apart (the session's own clock follows them). ``--one-task``: no user
prompt after the task, so the whole session is one running tool loop, as in an agent that
works on its own (SWE-agent, OpenHands).

At each checkpoint (1k, 10k, 100k raw messages; ``--quick`` stops at 10k) the table shows,
over the calls that brought the last 2,000 messages before it, one model call's worth at a
time (the stretch from the previous checkpoint up to those is fed in untimed batches of 1,000
messages, so 100k messages fit in a few minutes): prepare() p50 / p99 of calls that took no
decision and of calls that did, and how many did; ``mem/msg``: the growth of the process's
resident memory since the session started, per raw message (everything the session holds:
the raw history itself, the ledger, the view, the recall store, caches); ``raw/msg``: the raw
history's own text per message, for scale; ``store``: what the recall store holds. A decision's
cost should not grow with the history: only with what the decision touches. At the last
checkpoint only (a collection there would change when the next ones come): ``gc``, what one
full garbage collection takes with the session held, the pause Python takes on its own
whenever its heap has grown by a quarter, in whatever call is running then; ``objs/msg``, the
objects it walks per raw message (the history's own included: 3 a message here).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from agentctx.budget import Budget
from agentctx.manager import ContextManager
from agentctx.messages import (
    AssistantMessage,
    Message,
    SummaryMessage,
    TextBlock,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
    text_of,
)
from agentctx.recall import MemoryRecallStore
from agentctx.strategies import DeterministicCompaction, ToolOutputPipeline
from agentctx.strategies.llm import LlmCompaction
from agentctx.strategy import Chain
from agentctx.summarizer import REQUIRED_SECTIONS
from agentctx.testing import ScriptedSummarizer

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from agentctx.strategy import CompactionStrategy

BRIEFING = "\n".join(f"## {name}\nNothing yet." for name in REQUIRED_SECTIONS)
STRATEGIES: dict[str, Callable[[], CompactionStrategy]] = {
    "deterministic": DeterministicCompaction,
    "pipeline+tiers": lambda: Chain([ToolOutputPipeline(), DeterministicCompaction()]),
    "llm": lambda: LlmCompaction(ScriptedSummarizer([], default=BRIEFING)),
}
TIMED = 2_000  # messages before each checkpoint that are timed call by call
BULK = 1_000  # messages a batch feeds at once on the way to the next checkpoint
_WORDS = ("cache", "parser", "token", "budget", "stream", "index", "query", "client", "retry")


def turns(seed: int, clock: list[float], *, prompts: bool = True) -> Iterator[list[Message]]:
    """An endless agent loop; ``clock[0]`` follows its timestamps (seconds). Without
    ``prompts``, the steps that would end with a user prompt are left out."""
    rng = random.Random(seed)
    ts = 1_700_000_000_000
    yield [UserMessage.of("Task: make the session cache in src/cache/core.py twice as fast.")]
    n = 0
    while True:
        n += 1
        ts += rng.randint(2_000, 20_000)
        clock[0] = ts / 1000
        stamp = {"timestamp": ts}
        if n % 15 == 0:
            if not prompts:
                continue
            text = " ".join(rng.choice(_WORDS) for _ in range(12))
            yield [
                AssistantMessage.of(f"Done with that part: {text}."),
                UserMessage((TextBlock(f"Next: {text}"),), stamp),
            ]
            continue
        kind = rng.choice(("read", "read", "bash", "grep"))
        path = f"src/{rng.choice(_WORDS)}/file_{n}.py"
        lines = min(3_000, max(1, int(rng.paretovariate(1.3) * 6)))
        args: dict[str, object] = (
            {"path": path} if kind == "read" else {"command": f"{kind} -n {rng.choice(_WORDS)}"}
        )
        word = rng.choice(_WORDS)
        out = "\n".join(f"{path}:{i}: {word}_{i % 7} = compute({i}, {n})" for i in range(lines))
        yield [
            AssistantMessage((ToolCall(f"c{n}", kind, args),), "tool_use"),
            ToolResultMessage(f"c{n}", (TextBlock(out),), kind, False, stamp),
        ]


def chars(group: list[Message]) -> int:
    """The text of ``group``'s messages, in characters."""
    return sum(len(text_of(m.content)) for m in group if not isinstance(m, SummaryMessage))


def reported_tokens(view: list[Message]) -> int:
    """The usage a provider reports for ``view``: its text and arguments at 2.5 characters a
    token (o200k makes 2.55 of this workload's messages), plus a 3k-token system prompt.
    Counted apart from the session, as a provider counts: a report made from the session's
    own estimate (``ctx.prompt_tokens``) has the calibration chase itself (down to half the
    real size by 3k messages); and it puts no memo on the messages, which would change the
    memory figures."""
    size = 0
    for m in view:
        if isinstance(m, SummaryMessage):
            size += len(m.text)
            continue
        size += len(text_of(m.content))
        if isinstance(m, AssistantMessage):
            size += sum(len(json.dumps(dict(c.arguments))) for c in m.tool_calls)
    return 3_000 + size * 2 // 5


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def run(
    name: str, mode: str, checkpoints: list[int], window: int, seed: int, prompts: bool = True
) -> list[dict[str, Any]]:
    clock = [0.0]
    store = MemoryRecallStore()
    rows: list[dict[str, Any]] = []
    rss0 = rss_bytes()
    tracked0 = len(gc.get_objects())
    raw_chars = 0
    async with ContextManager(
        Budget(context_window=window, reserve_output=8_000),
        strategy=STRATEGIES[name](),
        recall=store,
        session_id="long-session",  # recall ids name it: a random one varies the decisions
        clock=lambda: clock[0],
        on_over_budget="send",
    ) as ctx:
        view: list[Message] = []
        history: list[Message] = []  # projection mode: the caller's raw history, appended to
        source = turns(seed, clock, prompts=prompts)

        async def call(new: list[Message]) -> list[Message]:
            if mode == "owned":
                return await ctx.prepare([*view, *new])
            history.extend(new)
            return await ctx.prepare(history)

        for checkpoint in checkpoints:
            # Up to TIMED messages before the checkpoint, fed in untimed batches.
            batch: list[Message] = []
            while len(ctx.raw) + len(batch) < checkpoint - TIMED:
                group = next(source)
                raw_chars += chars(group)
                batch += group
                if len(batch) >= BULK:
                    view = await call(batch)
                    batch = []
            if batch:
                view = await call(batch)
            idle: list[float] = []
            decided: list[float] = []
            observed: list[float] = []
            background: list[float] = []
            while len(ctx.raw) < checkpoint:  # then one model call at a time, timed
                group = next(source)
                raw_chars += chars(group)
                version = ctx.ledger.version
                t0 = time.thread_time()
                view = await call(group)
                elapsed = time.thread_time() - t0
                (idle if ctx.ledger.version == version else decided).append(elapsed)
                await anyio.lowlevel.checkpoint()  # the model call: background work runs here
                usage = Usage(reported_tokens(view), 200)
                t0 = time.thread_time()
                ctx.observe(usage)
                observed.append(time.thread_time() - t0)
                t0 = time.thread_time()
                await anyio.lowlevel.checkpoint()  # the tools run: what observe left runs here
                background.append(time.thread_time() - t0)
            n = len(ctx.raw)
            collection: float | None = None
            tracked: float | None = None
            if checkpoint == checkpoints[-1]:
                tracked = (len(gc.get_objects()) - tracked0) / n
                t0 = time.thread_time()
                gc.collect()
                collection = time.thread_time() - t0
            rows.append(
                {
                    "strategy": name,
                    "mode": mode,
                    "messages": n,
                    "observe": pct(observed, 0.5),
                    "background": pct(background, 0.5),
                    "idle": [pct(idle, 0.5), pct(idle, 0.99)],
                    "decided": [pct(decided, 0.5), pct(decided, 0.99)],
                    "decisions": len(decided),
                    "mem_per_msg": (rss_bytes() - rss0) / n,
                    "raw_per_msg": raw_chars / n,
                    "store": store.bytes_held,
                    "gc": collection,
                    "tracked": tracked,
                }
            )
    return rows


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.2f}"


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'strategy':<15} {'mode':<10} {'messages':>8}  {'idle p50':>8} {'idle p99':>8}  "
        f"{'decide p50':>10} {'decide p99':>10} {'decisions':>9} {'observe':>8} {'+bg':>6}  "
        f"{'mem/msg':>8} {'raw/msg':>8} {'store':>8} {'gc':>7} {'objs/msg':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['strategy']:<15} {r['mode']:<10} {r['messages']:>8}  {_ms(r['idle'][0]):>8} "
            f"{_ms(r['idle'][1]):>8}  {_ms(r['decided'][0]):>10} {_ms(r['decided'][1]):>10} "
            f"{r['decisions']:>9} {_ms(r['observe']):>8} {_ms(r['background']):>6}  "
            f"{r['mem_per_msg'] / 1024:>6.1f}KB "
            f"{r['raw_per_msg'] / 1024:>6.1f}KB {r['store'] / 2**20:>6.1f}MB "
            f"{_ms(r['gc']):>7} {'-' if r['tracked'] is None else format(r['tracked'], '.1f'):>8}"
        )
    lines.append(
        "(milliseconds of the calling thread's CPU time; p50/p99 over the calls that brought "
        "the last 2k messages; observe: p50 of the call, +bg: of the calibration it leaves to the "
        "background, which runs while the tools do; gc: one full garbage collection, in ms, at "
        "the last checkpoint)"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1k and 10k messages only")
    parser.add_argument("--window", type=int, default=60_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--mode",
        choices=("both", "owned", "projection"),
        default="both",
        help="owned: the caller sends back the view; projection: its own raw history",
    )
    parser.add_argument(
        "--one-task",
        action="store_true",
        help="no user prompt after the task: the session is one running tool loop",
    )
    parser.add_argument("--one", choices=sorted(STRATEGIES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    checkpoints = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000]
    modes = ("owned", "projection") if args.mode == "both" else (args.mode,)
    if args.one:
        rows = anyio.run(
            run, args.one, args.mode, checkpoints, args.window, args.seed, not args.one_task
        )
        print(json.dumps(rows))
        return
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for name, mode in ((n, m) for n in STRATEGIES for m in modes):
        command = [sys.executable, __file__, "--one", name, "--mode", mode]
        command += ["--window", str(args.window), "--seed", str(args.seed)]
        command += ["--quick"] if args.quick else []
        command += ["--one-task"] if args.one_task else []
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"{name}: {done.stderr.strip()}")
        rows += json.loads(done.stdout.strip().splitlines()[-1])
    print(table(rows))
    workload = ", one task then tools only" if args.one_task else ""
    print(f"window {args.window}, seed {args.seed}{workload}, {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
