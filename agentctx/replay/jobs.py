"""Run the replays of one `agentctx replay` command: every transcript through every strategy.

```python
settings = ReplaySettings(context_window=53_000, reserve=16_000)
outcomes = run_replays([load_transcript(p) for p in paths], ["deterministic", "llm"], settings)
for o in outcomes:
    print(o.transcript.path, o.strategy, o.report.cost_with)
```

Each replay runs in session time on its own `ReplayClock`, with a `RetentionMeter` on the
transcript's early file paths. The ``llm`` strategy's summarizer is the offline extractive one
(``summarizer_delay`` seconds of session time per briefing) unless ``settings.summarizer``
names a real model: then it is a `CachedSummarizer` over that model, sharing one
`SummaryCache`, and up to ``settings.concurrency`` replays run at once, each in a thread with
its own event loop (a replay waits for its own summarizer, in wall time, while the others go
on; the cap bounds the requests in flight, one per replay). Offline replays are CPU work
only and run one after the other in the calling thread.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import anyio

from agentctx.budget import Budget
from agentctx.messages import AssistantMessage, Message, UserMessage
from agentctx.replay.cached_summarizer import CachedSummarizer, SummarizerHealth, SummaryCache
from agentctx.replay.engine import ReplayClock, ReplayReport, replay
from agentctx.replay.offline_summarizer import OFFLINE_MODEL, OfflineSummarizer
from agentctx.replay.retention import early_paths
from agentctx.strategies import DeterministicCompaction, ToolOutputPipeline
from agentctx.strategies.llm import LlmCompaction
from agentctx.strategy import Chain

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from agentctx.importers import Transcript
    from agentctx.replay.real_summarizer import SummarizerSpec
    from agentctx.strategy import CompactionContext, CompactionStrategy
    from agentctx.summarizer import Summarizer

__all__ = [
    "DEFAULT_SUMMARIZER_DELAY",
    "DEFAULT_SUMMARIZER_TIMEOUT",
    "STRATEGIES",
    "Outcome",
    "ReplaySettings",
    "build_strategy",
    "run_replays",
]

DEFAULT_SUMMARIZER_DELAY = 8.0
"""Seconds of session time the offline summarizer takes (a cheap model's latency)."""

DEFAULT_SUMMARIZER_TIMEOUT = 60.0
"""Wall seconds a real summarizer's request may take: a briefing of a cheap model takes a
few, and a server that never answers costs a few of these
(`agentctx.replay.cached_summarizer.GIVE_UP_AFTER`), not the SDK's minutes per attempt."""

STRATEGIES: dict[str, str] = {
    "llm": "background briefings from a summarizer, then the deterministic tiers",
    "pipeline": "ToolOutputPipeline then the tiers",
    "deterministic": "the tiers only",
    "none": "no compaction",
}
"""The strategies `agentctx replay` knows, with a few words on each."""


class _NoCompaction:
    async def compact(self, ctx: CompactionContext) -> None:
        return None


def build_strategy(
    name: str, clock: ReplayClock, *, summarizer: Summarizer | None = None, delay: float = 0.0
) -> CompactionStrategy:
    """The strategy ``name`` (a key of `STRATEGIES`) for one replay on ``clock``; ``llm``
    uses ``summarizer``, or the offline one taking ``delay`` seconds of session time."""
    if name == "llm":
        tiers = DeterministicCompaction()
        used = summarizer if summarizer is not None else OfflineSummarizer(delay, sleep=clock.sleep)
        llm = LlmCompaction(used, fallback=tiers, clock=clock, sleep=clock.sleep)
        return Chain([llm, tiers])
    if name == "pipeline":
        return Chain([ToolOutputPipeline(), DeterministicCompaction()])
    if name == "deterministic":
        return DeterministicCompaction()
    if name == "none":
        return _NoCompaction()
    raise ValueError(f"unknown strategy {name!r}; known: {', '.join(STRATEGIES)}")


@dataclass(frozen=True, slots=True)
class ReplaySettings:
    """What every replay of a command shares."""

    context_window: int
    reserve: int
    target_ratio: float | None = None
    """`Budget.target_ratio`; ``None``: the library's default."""
    summarizer_delay: float = DEFAULT_SUMMARIZER_DELAY
    summarizer: SummarizerSpec | None = None
    """A real model for ``llm``; ``None``: the offline extractive summarizer."""
    cache: SummaryCache | None = None
    """The summary cache of a real summarizer (default: in memory only)."""
    concurrency: int = 4
    """At most this many replays (and so summarizer requests) at once, with a real model."""
    summarizer_timeout: float | None = DEFAULT_SUMMARIZER_TIMEOUT
    """Wall seconds a real summarizer's request may take (``None``: the SDK's own bound)."""
    health: SummarizerHealth = field(default_factory=SummarizerHealth)
    """Shared by the replays: a real summarizer that failed several requests in a row
    (timeouts or server errors) is asked no more (`SummarizerHealth`)."""

    @property
    def budget(self) -> Budget:
        """The hard budget of every replay."""
        budget = Budget(context_window=self.context_window, reserve_output=self.reserve)
        if self.target_ratio is None:
            return budget
        return replace(budget, target_ratio=self.target_ratio)

    @property
    def summarizer_model(self) -> str:
        """The model ``llm`` summarizes on: the real one's name, or the offline one's."""
        return self.summarizer.model if self.summarizer is not None else OFFLINE_MODEL

    def summarizer_label(self) -> str:
        """The summarizer in a few words, for headers: ``offline-extractive, 8 s`` or the
        ``--summarizer`` value with ``real latency``."""
        if self.summarizer is None:
            return f"{OFFLINE_MODEL}, {self.summarizer_delay:g} s"
        return f"{self.summarizer}, real latency"


@dataclass(frozen=True, slots=True)
class Outcome:
    """One replay: a transcript through a strategy."""

    transcript: Transcript
    strategy: str
    report: ReplayReport


@dataclass(slots=True)
class _Tally:
    """Requests replayed over all replays, for one progress bar (updated from threads)."""

    progress: Callable[[int, int], None] | None
    totals: list[int]
    done: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def callback(self, job: int) -> Callable[[int, int], None]:
        def report(done: int, total: int) -> None:
            with self.lock:
                self.done[job] = done
                if self.progress is not None:
                    self.progress(sum(self.done), sum(self.totals))

        return report


def sent_ahead(transcript: Transcript) -> tuple[Message, ...]:
    """What every request of ``transcript`` sent ahead of its messages: the system prompt (as
    a message, for counting) and the demonstrations."""
    system = (UserMessage.of(transcript.system),) if transcript.system else ()
    return (*system, *transcript.demonstrations)


def _requests(transcript: Transcript) -> int:
    return sum(isinstance(m, AssistantMessage) for m in transcript.messages[1:])


async def _run_one(
    transcript: Transcript,
    strategy: str,
    settings: ReplaySettings,
    progress: Callable[[int, int], None],
) -> ReplayReport:
    clock = ReplayClock()
    real: CachedSummarizer | None = None
    if strategy == "llm" and settings.summarizer is not None:
        cache = settings.cache if settings.cache is not None else SummaryCache(None)
        real = CachedSummarizer(
            settings.summarizer.build(),
            cache,
            clock=clock,
            timeout=settings.summarizer_timeout,
            health=settings.health,
        )
    try:
        return await replay(
            transcript.messages,
            budget=settings.budget,
            strategy=build_strategy(
                strategy, clock, summarizer=real, delay=settings.summarizer_delay
            ),
            clock=clock,
            progress=progress,
            facts=early_paths(transcript.messages),
            prefix=sent_ahead(transcript),
        )
    finally:
        if real is not None:
            await real.aclose()


def run_replays(
    transcripts: Sequence[Transcript],
    strategies: Sequence[str],
    settings: ReplaySettings,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> list[Outcome]:
    """Replay every transcript through every strategy; the outcomes come back in that order
    (transcript by transcript). ``progress`` gets ``(done, total)`` requests over all
    replays, possibly from worker threads. An error in any replay is raised here."""
    jobs = [(t, s) for t in transcripts for s in strategies]
    tally = _Tally(progress, [_requests(t) for t, _ in jobs], [0] * len(jobs))
    reports: list[ReplayReport | None] = [None] * len(jobs)

    def run(k: int) -> None:
        transcript, strategy = jobs[k]
        reports[k] = anyio.run(_run_one, transcript, strategy, settings, tally.callback(k))

    threads = min(settings.concurrency, len(jobs)) if settings.summarizer is not None else 1
    if threads <= 1:
        for k in range(len(jobs)):
            run(k)
    else:
        _in_threads(run, len(jobs), threads)
    return [Outcome(t, s, r) for (t, s), r in zip(jobs, reports, strict=True) if r is not None]


def _in_threads(run: Callable[[int], None], count: int, threads: int) -> None:
    """``run(k)`` for k < ``count`` on ``threads`` daemon threads; the first error is raised.

    Daemon threads, not an executor: on Ctrl-C the command exits at once instead of waiting
    for requests in flight (the replies already stored stay in the cache file)."""
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for k in range(count):
        todo.put(k)
    finished: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()

    def worker() -> None:
        while True:
            try:
                k = todo.get_nowait()
            except queue.Empty:
                return
            try:
                run(k)
            except BaseException as exc:
                finished.put(exc)
                return
            finished.put(None)

    for n in range(threads):
        threading.Thread(target=worker, name=f"agentctx-replay-{n}", daemon=True).start()
    for _ in range(count):
        # A timeout, so that Ctrl-C reaches the main thread while it waits.
        while True:
            try:
                error = finished.get(timeout=0.5)
                break
            except queue.Empty:
                continue
        if error is not None:
            raise error
