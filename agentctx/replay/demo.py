"""``agentctx demo``: a small live agent loop, offline, with every event printed as it happens.

The model is scripted (in process, no SDK, no network): it lists the agentctx package, reads
its modules a few at a time with real tools (``list_dir``, ``read_file`` on the installed
package), and answers. The loop calls `ContextManager.prepare` before every model call, with
a small budget, so the deterministic tiers act and background briefings from
`OfflineSummarizer` are requested, come back while the loop goes on, and are spliced.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import anyio

from agentctx.events import (
    BudgetExceeded,
    CompactionWarning,
    ContextCompacted,
    Event,
    SummaryRejected,
    SummaryStale,
)
from agentctx.manager import ContextManager
from agentctx.messages import (
    AssistantMessage,
    Message,
    TextBlock,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from agentctx.recall import MemoryRecallStore
from agentctx.replay.offline_summarizer import OfflineSummarizer
from agentctx.replay.render import change
from agentctx.strategies import DeterministicCompaction
from agentctx.strategies.llm import LlmCompaction, LlmCompactionConfig
from agentctx.strategy import Chain
from agentctx.tokens import MessageCounter

if TYPE_CHECKING:
    from agentctx.budget import Budget

__all__ = ["PACKAGE", "list_dir", "read_file", "run_demo"]

PACKAGE = Path(__file__).resolve().parents[1]  # the agentctx package it reads
"""The directory the demo's tools may read: the agentctx package itself."""

READ_CHARS = 3_000
"""Cap on one ``read_file`` result, as agent harnesses cap tool output."""

MODEL_SECONDS = 0.1
"""How long a scripted model call takes."""

SUMMARIZER_SECONDS = 0.25
"""How long the offline summarizer takes (two to three model calls)."""

TASK = (
    "Survey the agentctx package: list its files, read the core modules, and write one line "
    "on what each does. Only read files inside the package; do not modify anything."
)

_BATCHES: tuple[tuple[str, ...], ...] = (
    ("budget.py", "events.py"),
    ("messages.py",),
    ("ledger.py", "view.py"),
    ("boundaries.py",),
    ("tokens/count.py", "tokens/estimate.py"),
    ("strategy.py",),
    ("recall/store.py", "recall/tool.py"),
    ("manager.py",),
    ("summarizer.py", "replay/offline_summarizer.py"),
    ("pricing.py",),
    ("errors.py", "replay/engine.py"),
    ("replay/chart.py",),
    ("replay/cli.py", "replay/demo.py"),
)
"""The files the scripted model reads, a batch a call (tests/test_cli.py checks they exist)."""


def _inside(path: str) -> Path:
    target = (PACKAGE / path).resolve()
    if target != PACKAGE and PACKAGE not in target.parents:
        raise ValueError(f"{path}: outside the agentctx package")
    return target


def list_dir(path: str = ".") -> str:
    """A real tool: the entries of a directory of the package, with sizes."""
    target = _inside(path)
    lines = []
    for entry in sorted(target.iterdir()):
        if entry.name.startswith("__pycache__"):
            continue
        size = "dir" if entry.is_dir() else f"{entry.stat().st_size} bytes"
        lines.append(f"{entry.name}  {size}")
    return "\n".join(lines)


def read_file(path: str) -> str:
    """A real tool: a file of the package, capped at `READ_CHARS` characters."""
    text = _inside(path).read_text(encoding="utf-8")
    if len(text) > READ_CHARS:
        text = text[:READ_CHARS] + f"\n[... {len(text) - READ_CHARS} more characters]"
    return text


def _first_line(text: str) -> str:
    for line in text.splitlines():
        line = line.strip().strip('"').strip()
        if line and not line.startswith(("#", "from ", "import ")):
            return line[:100]
    return "(empty)"


class _ScriptedModel:
    """Plays the agent: which tools to call next, from what the tools returned so far."""

    def __init__(self) -> None:
        self.step = 0
        self.notes: list[str] = []
        self.counter = MessageCounter(lazy=False)  # its "tokenizer", for the usage it reports

    def reply(self) -> AssistantMessage:
        step = self.step
        self.step += 1
        if step == 0:
            calls = [ToolCall("call-0", "list_dir", {"path": "."})]
            text = "I'll start by listing the package."
        elif step <= len(_BATCHES):
            batch = _BATCHES[step - 1]
            calls = [
                ToolCall(f"call-{step}-{k}", "read_file", {"path": name})
                for k, name in enumerate(batch)
            ]
            done = f" So far: {self.notes[-1]}" if self.notes else ""
            text = f"Next I will read {', '.join(batch)}.{done}"
        else:
            summary = "\n".join(f"- {n}" for n in self.notes)
            return AssistantMessage((TextBlock(f"Survey done.\n{summary}"),), stop_reason="stop")
        return AssistantMessage((TextBlock(text), *calls), stop_reason="tool_use")


def _run_tool(call: ToolCall) -> ToolResultMessage:
    path = str(call.arguments.get("path", "."))
    try:
        out = list_dir(path) if call.name == "list_dir" else read_file(path)
        error = False
    except (OSError, ValueError) as exc:
        out, error = f"error: {exc}", True
    return ToolResultMessage(call.id, (TextBlock(out),), tool_name=call.name, is_error=error)


def _describe(event: Event) -> str:
    if isinstance(event, ContextCompacted):
        saved = event.tokens_before - event.tokens_after
        actions = "; ".join(event.actions[:3])
        if len(event.actions) > 3:
            actions += f"; (+{len(event.actions) - 3} more)"
        line = (
            f"ContextCompacted  {event.method}: {event.tokens_before} -> {event.tokens_after} "
            f"tokens (saved {saved}), {event.messages_before} -> {event.messages_after} "
            f"messages: {actions}"
        )
        if event.summary is not None:
            line += (
                f" [briefing over {event.summary.messages_summarized} messages, "
                f"{event.summary.usage.input_tokens}+{event.summary.usage.output_tokens} tokens]"
            )
        return line
    if isinstance(event, SummaryRejected):
        return f"SummaryRejected  {event.reason}: {event.detail}"
    if isinstance(event, SummaryStale):
        return f"SummaryStale  {event.reason}"
    if isinstance(event, BudgetExceeded):
        return f"BudgetExceeded  {event.tokens} of {event.budget} tokens"
    if isinstance(event, CompactionWarning):
        return f"CompactionWarning  {event.code}: {event.message}"
    return f"{type(event).__name__}  {event.to_json()}"


async def run_demo(budget: Budget, out: TextIO) -> int:
    """Run the loop under ``budget``, writing each step and event to ``out``; returns 0."""
    events: list[Event] = []

    def show(event: Event) -> None:
        events.append(event)
        out.write(f"    event: {_describe(event)}\n")

    tiers = DeterministicCompaction()
    summarizer = OfflineSummarizer(SUMMARIZER_SECONDS)
    llm = LlmCompaction(summarizer, LlmCompactionConfig(timeout=10.0), fallback=tiers)
    model = _ScriptedModel()
    history: list[Message] = [UserMessage((TextBlock(TASK),))]
    sent = raw_total = compactions = 0  # compactions: model calls that compacted
    out.write(
        f"agentctx demo: budget {budget.limit} tokens (window {budget.context_window}, "
        f"reserve {budget.reserve_output}); tools read {PACKAGE}\n"
    )
    async with ContextManager(
        budget,
        strategy=Chain([llm, tiers]),
        recall=MemoryRecallStore(),
        session_id="demo",
        on_over_budget="send",
    ) as ctx:
        ctx.subscribe(show)
        while True:
            seen = len(events)
            view = await ctx.prepare(history)
            compactions += any(isinstance(e, ContextCompacted) for e in events[seen:])
            prompt = ctx.prompt_tokens
            raw = ctx.counter.overhead + ctx.counter.count_many(history)
            sent += prompt
            raw_total += raw
            await anyio.sleep(MODEL_SECONDS)  # the model call
            reply = model.reply()
            # A real model reports what its tokenizer counted (``ctx.observe(response)``); this
            # one counts with a counter of its own. Reporting ``ctx.prompt_tokens`` back would
            # have the calibration chase its own estimate.
            reported = model.counter.count_many(view)
            ctx.observe(Usage(input_tokens=reported, output_tokens=len(str(reply.content)) // 4))
            history.append(reply)
            calls = reply.tool_calls
            what = ", ".join(f"{c.name}({c.arguments.get('path')})" for c in calls) or "answers"
            out.write(
                f"call {model.step:>2}: sent {len(view):>2} messages, {prompt:>5} tokens "
                f"(history {len(history) - 1:>2} messages, {raw:>5} tokens) -> {what}\n"
            )
            if not calls:
                break
            for call in calls:
                result = _run_tool(call)
                history.append(result)
                if call.name == "read_file" and not result.is_error:
                    text = result.content[0]
                    if isinstance(text, TextBlock):
                        model.notes.append(f"{call.arguments['path']}: {_first_line(text.text)}")
        spend = llm.spend
    spliced = sum(isinstance(e, ContextCompacted) and e.method == "summarized" for e in events)
    out.write(
        f"\n{model.step} model calls; prompt tokens sent {sent} with compaction, "
        f"{raw_total} without ({change(sent, raw_total)})\n"
        f"compactions {compactions} ({spliced} briefing{'' if spliced == 1 else 's'} spliced);"
        " summarizer requests "
        f"{spend.requests}, {spend.usage.input_tokens} input + {spend.usage.output_tokens} "
        "output tokens, cost unknown (offline-extractive has no price)\n"
    )
    return 0
