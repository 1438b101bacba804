"""How close and how fast are token estimates next to exact o200k? Prints tables.

    python benchmarks/token_accuracy.py [--repeat 5] [--no-speed]

Texts: everything `MessageCounter` counts as text (user and assistant text, thinking, tool-call
argument JSON, tool results, summaries) in every transcript of ``tests/corpus`` that
`agentctx.importers.load_transcript` reads (pi, Claude Code with its subagent threads,
SWE-agent, OpenHands; the recorded API traffic in the other folders is not a transcript).
Each text is classified with `agentctx.tokens.classify` (tool-call arguments are JSON) and
scored as ``(estimate - exact) / exact`` against ``ExactCounter("o200k_base")``, per source
format and content class, for:

- ``Estimator``: ``Estimator().count``, uncalibrated, no tokenizer (pure Python);
- ``auto``: `agentctx.tokens.default_estimator()`, what `MessageCounter()` counts with: the
  same estimator, with texts of up to `EXACT_BELOW` characters (where tiktoken costs about
  what the estimate does) counted exactly when tiktoken is installed;
- ``... cal``: the same after calibration: per session, a `MessageCounter` wrapping it
  observes three "reported usages" (the exact size of the prompts sent before the assistant
  turns nearest to 1/3, 2/3 and the end of the session, plus a system-prompt-and-tools
  overhead of 3000) and counts the text with ``count_text``; sessions with fewer than three
  turns stay uncalibrated.

Each cell is the median and 90th percentile of ``|error|`` and the median signed error (bias).
The target is a median ``|error|`` of at most 5 % per format and class, uncalibrated and
calibrated. Throughput (MB/s of UTF-8) per text size is measured on slices of the same texts:
``Estimator().count`` (which classifies the text, as callers do), the estimator given the class,
``auto``, and ``tiktoken``'s o200k ``encode``, interleaved in the same run (best of
``--repeat``); machines are noisy, so compare the columns, not runs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentctx.importers import claude_code, load_transcript
from agentctx.messages import (
    AssistantMessage,
    Message,
    SummaryMessage,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from agentctx.tokens import ContentClass, Estimator, MessageCounter, classify
from agentctx.tokens.exact import ExactCounter

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from agentctx.tokens import TokenCounter

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "corpus"
FAKE_OVERHEAD = 3000
TARGET = 0.05
SIZES = (64, 512, 2048, 8192, 65536, 1 << 20)


# -- reading sessions ------------------------------------------------------------------------


def sessions(corpus: Path = CORPUS) -> Iterator[tuple[str, str, list[Message]]]:
    """(format, session name, messages) for every transcript in the corpus folders.

    Claude Code files give their main thread and, separately, their subagent threads.
    """
    for folder in sorted(p for p in corpus.iterdir() if p.is_dir()):
        for path in sorted(folder.iterdir()):
            if path.suffix == ".md" or not path.is_file():
                continue
            try:
                transcript = load_transcript(path)
            except Exception:  # not a transcript (recorded API traffic, a lone message)
                continue
            if transcript.format != "claude-code":
                yield transcript.format, path.name, list(transcript.messages)
                continue
            for thread in ("main", "sidechains"):
                try:
                    messages = list(claude_code.load(path, thread=thread).messages)
                except Exception:  # a file with no such thread
                    continue
                if messages:
                    yield transcript.format, f"{path.name}:{thread}", messages


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


def texts(messages: Sequence[Message]) -> Iterator[tuple[str, ContentClass | None]]:
    """Every text a `MessageCounter` estimates, with its class when it is known (JSON)."""
    for m in messages:
        if isinstance(m, SummaryMessage):
            yield m.text, None
            continue
        if not isinstance(m, (UserMessage, AssistantMessage, ToolResultMessage)):
            continue
        for b in m.content:
            if isinstance(b, TextBlock):
                yield b.text, None
            elif isinstance(b, ThinkingBlock):
                yield b.thinking, None
            elif isinstance(b, ToolCall):
                yield _compact(dict(b.arguments)), ContentClass.JSON


# -- accuracy --------------------------------------------------------------------------------


def calibrate(
    messages: Sequence[Message], exact: MessageCounter, counter: TokenCounter | None = None
) -> MessageCounter | None:
    """A counter (wrapping ``counter``, an `Estimator` by default) that observed three
    simulated usages of this session, or None if the session is too short."""
    turns = [i for i, m in enumerate(messages) if isinstance(m, AssistantMessage) and i > 0]
    if len(turns) < 3:
        return None
    points = sorted({turns[round(f * (len(turns) - 1))] for f in (1 / 3, 2 / 3, 1.0)})
    if len(points) < 3:
        points = turns[-3:]
    calibrated = MessageCounter(counter or Estimator(), lazy=False)
    for end in points:
        sent = messages[:end]
        calibrated.observe(sent, exact.count_many(sent) + FAKE_OVERHEAD)
    return calibrated


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _auto_counter() -> TokenCounter | None:
    try:
        from agentctx.tokens import default_estimator
    except ImportError:  # an agentctx without it
        return None
    counter: TokenCounter = default_estimator()
    return counter


Errors = dict[tuple[str, ContentClass], dict[str, list[float]]]


def accuracy(
    exact: ExactCounter, counters: dict[str, TokenCounter]
) -> tuple[Errors, list[tuple[str, str, int, int]], int, int]:
    """Signed relative errors per (format, class) and column (each counter as it is and
    calibrated per session); whole-prompt rows after calibrating the first; totals."""
    exact_messages = MessageCounter(exact, lazy=False)
    columns = [c for name in counters for c in (name, f"{name} cal")]
    errors: Errors = defaultdict(lambda: {c: [] for c in columns})
    prompts = []
    n_texts = n_chars = 0
    for fmt, name, messages in sessions():
        calibrated = {n: calibrate(messages, exact_messages, c) for n, c in counters.items()}
        first = next(iter(calibrated.values()))
        if first is not None:
            truth = exact_messages.count_many(messages) + FAKE_OVERHEAD
            prompts.append((fmt, name, truth, first.estimate_prompt(messages)))
        for text, kind in texts(messages):
            if not text.strip():
                continue
            truth = exact.count(text)
            cls = kind or classify(text)
            n_texts += 1
            n_chars += len(text)
            cell = errors[(fmt, cls)]
            for column, counter in counters.items():
                plain = _count(counter, text, cls)
                cal = calibrated[column]
                value = cal.count_text(text, cls) if cal is not None else plain
                cell[column].append((plain - truth) / truth)
                cell[f"{column} cal"].append((value - truth) / truth)
    return errors, prompts, n_texts, n_chars


def _count(counter: TokenCounter, text: str, kind: ContentClass) -> int:
    if isinstance(counter, Estimator):
        return counter.count(text, kind)
    return counter.count(text)


def _cell(values: list[float]) -> str:
    if not values:
        return f"{'-':>7} {'-':>6} {'-':>7}"
    absolute = [abs(v) for v in values]
    return (
        f"{statistics.median(absolute) * 100:6.1f}% {pct(absolute, 0.9) * 100:5.1f}%"
        f" {statistics.median(values) * 100:+6.1f}%"
    )


def print_accuracy(errors: Errors, methods: Sequence[str]) -> list[str]:
    """The accuracy table; returns the (format, class, method) cells that miss the target."""
    header = f"{'format':<12} {'class':<6} {'n':>5}"
    print(header + "".join(f"  {m:^22}" for m in methods))
    print(f"{'':<12} {'':<6} {'':>5}" + f"  {'median':>7} {'p90':>6} {'bias':>7}" * len(methods))
    missed = []
    formats = sorted({f for f, _ in errors})
    for fmt in formats:
        for cls in ContentClass:
            row = errors.get((fmt, cls))
            if not row or not row["Estimator"]:
                continue
            cells = "".join(f"  {_cell(row[m])}" for m in methods)
            flags = [m for m in methods if row[m] and statistics.median(map(abs, row[m])) > TARGET]
            missed += [f"{fmt}/{cls.value}/{m}" for m in flags]
            note = f"  > 5 %: {', '.join(flags)}" if flags else ""
            print(f"{fmt:<12} {cls.value:<6} {len(row['Estimator']):>5}{cells}{note}")
        everything: dict[str, list[float]] = {m: [] for m in methods}
        for (f, _), row in errors.items():
            if f == fmt:
                for m in methods:
                    everything[m] += row[m]
        cells = "".join(f"  {_cell(everything[m])}" for m in methods)
        print(f"{fmt:<12} {'all':<6} {len(everything['Estimator']):>5}{cells}")
    return missed


# -- speed -----------------------------------------------------------------------------------


def _tiktoken_encode() -> Callable[[str], list[int]] | None:
    """tiktoken's fastest o200k call (``encode_ordinary``, no wrapper: ``encode`` first checks
    for special tokens), with the vocabulary `ExactCounter` seeds."""
    try:
        import tiktoken

        from agentctx.tokens.exact import _seed
    except ImportError:
        return None
    directory = _seed("o200k_base")
    if directory is None:
        return None
    previous = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(directory)
    try:
        encoding = tiktoken.get_encoding("o200k_base")
    finally:
        if previous is None:
            del os.environ["TIKTOKEN_CACHE_DIR"]
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = previous

    encode: Callable[[str], list[int]] = encoding.encode_ordinary
    return encode


def speed(blob: str, repeat: int, sizes: Sequence[int] = SIZES) -> None:
    """MB/s per text size for the estimator (classifying, and given the class) and tiktoken."""
    estimator = Estimator()
    candidates: dict[str, Callable[[str], object]] = {"Estimator": estimator.count}
    candidates["given class"] = lambda s: estimator.count(s, ContentClass.PROSE)
    auto = _auto_counter()
    if auto is not None:
        candidates["auto"] = auto.count
    encode = _tiktoken_encode()
    if encode is not None:
        candidates["tiktoken"] = encode
    rng = random.Random(0)
    budget = 4 << 20  # characters timed per size and candidate per round
    print(f"{'size':>8} {'texts':>6}" + "".join(f"  {c:>12}" for c in candidates) + "   (MB/s)")
    for size in sizes:
        if size > len(blob):
            continue
        n = max(3, min(4000, budget // size))
        pieces = []
        for _ in range(n):
            i = rng.randrange(0, len(blob) - size + 1)
            pieces.append(blob[i : i + size])
        nbytes = sum(len(p.encode("utf-8", "surrogatepass")) for p in pieces)
        best = dict.fromkeys(candidates, float("inf"))
        for _ in range(repeat):  # interleaved, so load on the machine hits every candidate
            for name, fn in candidates.items():
                t0 = time.perf_counter()
                for p in pieces:
                    fn(p)
                best[name] = min(best[name], time.perf_counter() - t0)
        cells = "".join(f"  {nbytes / best[c] / 1e6:12.1f}" for c in candidates)
        label = f"{size // 1024} KB" if size >= 1024 else f"{size} B"
        if size >= 1 << 20:
            label = f"{size >> 20} MB"
        print(f"{label:>8} {n:>6}{cells}")


# -- main ------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="timing rounds per size")
    parser.add_argument("--no-speed", action="store_true", help="accuracy only")
    args = parser.parse_args(argv)

    exact = ExactCounter("o200k_base")
    counters: dict[str, TokenCounter] = {"Estimator": Estimator()}
    auto = _auto_counter()
    if auto is not None:
        counters["auto"] = auto
    errors, prompts, n_texts, n_chars = accuracy(exact, counters)
    methods = [c for name in counters for c in (name, f"{name} cal")]

    print("Token estimates vs exact o200k_base, per text: (estimate - exact) / exact")
    print(f"{n_texts} texts, {n_chars / 1e6:.2f} M chars, transcripts in tests/corpus")
    print()
    missed = print_accuracy(errors, methods)
    print()
    print(f"Whole prompts, Estimator cal (3 observations, overhead {FAKE_OVERHEAD}):")
    by_format: dict[str, list[float]] = defaultdict(list)
    for fmt, _, truth, estimate in prompts:
        by_format[fmt].append((estimate - truth) / truth)
    for fmt, errs in sorted(by_format.items()):
        print(f"  {fmt:<12} {len(errs):>3} sessions  {_cell(errs)}  (median, p90, bias)")
    print()
    if missed:
        print(f"Target (median |error| <= 5 %) missed: {', '.join(missed)}")
    else:
        print("Target (median |error| <= 5 %) met for every format, class and method.")
    if not args.no_speed:
        print()
        blob = "\n".join(
            t for _, _, messages in sessions() for t, _ in texts(messages) if t.strip()
        )
        speed(blob, args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
