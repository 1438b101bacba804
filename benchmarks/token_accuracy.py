"""How close are token estimates to o200k on real transcripts? Prints one table.

    python benchmarks/token_accuracy.py

Texts: every tool result, tool-call argument JSON and assistant text in the pi and Claude
Code sessions of the corpus in ``tests/corpus``. Each is classified with
`agentctx.tokens.classify` and scored as ``|estimate - exact| / exact`` against
`ExactCounter("o200k_base")`, per content class, for:

- chars/4, the usual rule of thumb;
- chars / the class's measured o200k ratio (papers.md section 6);
- `Estimator()`, uncalibrated;
- the same after calibration: per session, a `MessageCounter` observes three "reported
  usages", the exact size of the prompts sent before the assistant turns nearest to 1/3,
  2/3 and the end of the session, plus a fake system-prompt-and-tools overhead of 3000.

The target is a median |error| of at most 5 % per class after calibration.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentctx.messages import (
    AssistantMessage,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from agentctx.tokens import ContentClass, Estimator, MessageCounter, classify
from agentctx.tokens.exact import ExactCounter

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "corpus"
FAKE_OVERHEAD = 3000
TARGET = 0.05
MIN_N = 30
# o200k chars/token per class, papers.md section 6.1 (first corpus draw).
PAPER_RATIO = {
    ContentClass.CODE: 3.91,
    ContentClass.JSON: 3.68,
    ContentClass.PROSE: 4.23,
    ContentClass.SHELL: 2.63,
    ContentClass.LOG: 3.99,
}


# -- reading sessions ------------------------------------------------------------------------


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content or [] if isinstance(b, dict)]


def _read_pi(path: Path) -> list[Message]:
    """Minimal pi reader, used only when `agentctx.importers` is not available."""
    out: list[Message] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        msg = entry.get("message") if entry.get("type") == "message" else None
        if not isinstance(msg, dict):
            continue
        blocks = _blocks(msg.get("content"))
        texts = tuple(TextBlock(b["text"]) for b in blocks if b.get("type") == "text")
        if msg.get("role") == "user":
            out.append(UserMessage(texts))
        elif msg.get("role") == "toolResult":
            out.append(ToolResultMessage(msg.get("toolCallId", ""), texts, msg.get("toolName")))
        elif msg.get("role") == "assistant":
            content: list[Any] = []
            for b in blocks:
                if b.get("type") == "text":
                    content.append(TextBlock(b["text"]))
                elif b.get("type") == "thinking":
                    content.append(ThinkingBlock(b.get("thinking", "")))
                elif b.get("type") == "toolCall":
                    content.append(ToolCall(b["id"], b["name"], b.get("arguments") or {}))
            out.append(AssistantMessage(tuple(content)))
    return out


def _read_claude_code(path: Path) -> list[Message]:
    """Minimal Claude Code reader (split assistant records merged by message id)."""
    out: list[Message] = []
    last_id = None
    for line in path.read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        msg = rec.get("message")
        if rec.get("type") not in ("user", "assistant") or not isinstance(msg, dict):
            continue
        blocks = _blocks(msg.get("content"))
        if rec["type"] == "assistant":
            content: list[Any] = []
            for b in blocks:
                if b.get("type") == "text":
                    content.append(TextBlock(b["text"]))
                elif b.get("type") == "thinking":
                    content.append(ThinkingBlock(b.get("thinking", "")))
                elif b.get("type") == "tool_use":
                    content.append(ToolCall(b["id"], b["name"], b.get("input") or {}))
            if out and last_id == msg.get("id") and isinstance(out[-1], AssistantMessage):
                out[-1] = AssistantMessage(out[-1].content + tuple(content))
            else:
                out.append(AssistantMessage(tuple(content)))
            last_id = msg.get("id")
            continue
        last_id = None
        for b in blocks:
            if b.get("type") == "tool_result":
                text = "\n".join(x.get("text", "") for x in _blocks(b.get("content")))
                out.append(ToolResultMessage(b.get("tool_use_id", ""), (TextBlock(text),)))
            elif b.get("type") == "text":
                out.append(UserMessage((TextBlock(b["text"]),)))
    return out


def sessions() -> Iterator[tuple[str, list[Message]]]:
    """(name, messages) per session: pi files, and Claude Code main threads and subagents."""
    files = [("pi", p) for p in sorted((CORPUS / "pi").glob("*.jsonl"))]
    files += [("claude-code", p) for p in sorted((CORPUS / "claude-code").glob("*.jsonl"))]
    try:
        from agentctx.importers import claude_code, pi
    except ImportError:
        for kind, path in files:
            reader = _read_pi if kind == "pi" else _read_claude_code
            yield path.name, reader(path)
        return
    for kind, path in files:
        if kind == "pi":
            yield path.name, list(pi.load(path).messages)
            continue
        for thread in ("main", "sidechains"):
            try:
                messages = list(claude_code.load(path, thread=thread).messages)
            except Exception:  # a file with no such thread
                continue
            if messages:
                yield f"{path.name}:{thread}", messages


def texts(messages: Sequence[Message]) -> Iterator[tuple[str, ContentClass | None]]:
    """Tool results, tool-call arguments (known to be JSON) and assistant text."""
    for m in messages:
        if isinstance(m, ToolResultMessage):
            yield from ((b.text, None) for b in m.content if isinstance(b, TextBlock))
        elif isinstance(m, AssistantMessage):
            for b in m.content:
                if isinstance(b, TextBlock):
                    yield b.text, None
                elif isinstance(b, ToolCall):
                    args = json.dumps(dict(b.arguments), separators=(",", ":"), ensure_ascii=False)
                    yield args, ContentClass.JSON


# -- scoring ---------------------------------------------------------------------------------


def calibrate(messages: Sequence[Message], exact: MessageCounter) -> MessageCounter | None:
    """A counter that observed three simulated usages of this session, or None if too short."""
    turns = [i for i, m in enumerate(messages) if isinstance(m, AssistantMessage) and i > 0]
    if len(turns) < 3:
        return None
    points = sorted({turns[round(f * (len(turns) - 1))] for f in (1 / 3, 2 / 3, 1.0)})
    if len(points) < 3:
        points = turns[-3:]
    counter = MessageCounter(Estimator(), lazy=False)
    for end in points:
        sent = messages[:end]
        counter.observe(sent, exact.count_many(sent) + FAKE_OVERHEAD)
    return counter


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> int:
    exact_counter = ExactCounter("o200k_base")
    exact_messages = MessageCounter(exact_counter, lazy=False)
    estimator = Estimator()
    methods = ("chars/4", "class ratio", "Estimator", "calibrated")
    errors: dict[ContentClass, dict[str, list[float]]] = {
        c: {m: [] for m in methods} for c in ContentClass
    }
    prompt_rows = []
    n_texts = n_chars = 0
    est_seconds = 0.0
    for name, messages in sessions():
        calibrated = calibrate(messages, exact_messages)
        if calibrated is not None:
            truth = exact_messages.count_many(messages) + FAKE_OVERHEAD
            prompt_rows.append(
                (
                    name,
                    len(messages),
                    truth,
                    calibrated.overhead,
                    calibrated.estimate_prompt(messages),
                )
            )
        for text, kind in texts(messages):
            if not text.strip():
                continue
            exact = exact_counter.count(text)
            cls = kind or classify(text)
            t0 = time.perf_counter()
            uncal = estimator.count(text, cls)
            est_seconds += time.perf_counter() - t0
            cal = calibrated.count_text(text, cls) if calibrated is not None else uncal
            n_texts += 1
            n_chars += len(text)
            for method, value in zip(
                methods, (len(text) / 4, len(text) / PAPER_RATIO[cls], uncal, cal), strict=True
            ):
                errors[cls][method].append(abs(value - exact) / exact)

    print("Token estimates vs exact o200k_base (tiktoken), per text: |estimate - exact| / exact")
    kinds = "tool results, tool-call arguments, assistant text"
    print(f"{n_texts} texts ({kinds}), {n_chars / 1e6:.2f} M chars")
    print(f"from the pi and Claude Code sessions in {CORPUS}")
    print()
    header = f"{'class':<6} {'n':>5}" + "".join(f"  {m:>15}" for m in methods) + "   target ≤5%"
    print(header)
    print(f"{'':<6} {'':>5}" + "  {:>7} {:>7}".format("median", "p90") * len(methods))
    missed = []
    everything: dict[str, list[float]] = {m: [] for m in methods}
    for cls in ContentClass:
        row = errors[cls]
        if not row["chars/4"]:
            continue
        cells = "".join(
            f"  {statistics.median(row[m]) * 100:6.1f}% {pct(row[m], 0.9) * 100:6.1f}%"
            for m in methods
        )
        med = statistics.median(row["calibrated"])
        verdict = "met" if med <= TARGET else f"MISSED ({med * 100:.1f}%)"
        if len(row["calibrated"]) < MIN_N:
            verdict += f" (n < {MIN_N}: too few texts to judge)"
        if med > TARGET:
            missed.append(cls.value)
        print(f"{cls.value:<6} {len(row['chars/4']):>5}{cells}   {verdict}")
        for m in methods:
            everything[m] += row[m]
    cells = "".join(
        f"  {statistics.median(everything[m]) * 100:6.1f}% {pct(everything[m], 0.9) * 100:6.1f}%"
        for m in methods
    )
    print(f"{'all':<6} {len(everything['chars/4']):>5}{cells}")
    print()
    print(
        f"Estimator speed: {n_chars / est_seconds / 1e6:.1f} M chars/s "
        f"({est_seconds * 1000:.0f} ms for all texts, uncached)"
    )
    print()
    print(f"Whole prompts after calibration (3 observations, true overhead {FAKE_OVERHEAD}):")
    print(f"{'session':<48} {'msgs':>5} {'exact':>8} {'overhead':>8} {'estimate':>9} {'error':>7}")
    for name, n, truth, overhead, estimate in prompt_rows:
        err = (estimate - truth) / truth * 100
        print(f"{name:<48} {n:>5} {truth:>8} {overhead:>8} {estimate:>9} {err:>6.1f}%")
    print()
    if missed:
        print(f"Target missed for: {', '.join(missed)} (see the calibrated median above).")
    else:
        print("Target met for every class.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
