"""Subscribing to agentctx's events, in an OpenAI Chat Completions tool loop.

    AGENTCTX_OFFLINE=1 python examples/compaction_events.py  # against agentctx's fake servers
    OPENAI_API_KEY=... python examples/compaction_events.py  # against the real API

Two ways to listen, both used here:

- ``ctx.subscribe(callback)``: the callback is called inline for every event (keep it quick;
  an ``async def`` callback runs as a task of the manager instead).
- ``async for event in ctx.events()``: an iterator, read here by a task of its own; it ends
  when the manager closes.

Compaction runs ``LlmCompaction`` (summaries on a cheap model, in the background) before
``DeterministicCompaction``, so the events carry what each compaction saved and what its
summarizer request cost, including requests whose briefing could not be used.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections import Counter
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

import openai

from agentctx import (
    Budget,
    BudgetExceeded,
    Chain,
    CompactionWarning,
    ContextCompacted,
    ContextManager,
    DeterministicCompaction,
    Event,
    LlmCompaction,
    LlmCompactionConfig,
    MemoryRecallStore,
    SummaryRejected,
    SummaryStale,
)
from agentctx.providers.openai import wrap
from agentctx.providers.openai_summarizer import OpenAIChatSummarizer

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

MODEL = os.environ.get("AGENTCTX_MODEL", "gpt-6-luna")
SUMMARY_MODEL = os.environ.get("AGENTCTX_SUMMARY_MODEL", "gpt-4.1-mini")
OFFLINE = os.environ.get("AGENTCTX_OFFLINE") == "1"
FILES = 14
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a source file of the project.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]
SYSTEM = "You are a code reviewer. Read the files you are asked about with read_file."
TASK = f"Read mod0.py to mod{FILES - 1}.py one at a time, then summarize them in one sentence."


def read_file(path: str) -> str:
    """The tool: a large, made-up source file, so the context fills up quickly."""
    return "\n".join(f"def {path[:-3]}_f{n}(x):\n    return x * {n}  # step {n}" for n in range(80))


def usd(cost: float | None) -> str:
    return "unknown" if cost is None else f"${cost:.6f}"


def summary_cost(event: Event) -> float | None:
    """What the summarizer request behind ``event`` cost: 0 when no request was made."""
    summary = getattr(event, "summary", None)
    return 0.0 if summary is None else summary.cost_usd


def on_event(event: Event) -> None:
    """The callback: called inline, as each event happens."""
    if isinstance(event, ContextCompacted):
        print(
            f"[callback] compacted ({event.method}): saved"
            f" {event.tokens_before - event.tokens_after} tokens"
            f" ({event.tokens_before} -> {event.tokens_after}),"
            f" cost {usd(summary_cost(event))}"
        )
        for action in event.actions[:2]:
            print(f"  - {action}")
    elif isinstance(event, SummaryRejected):
        print(
            f"[callback] summary rejected ({event.reason}): {event.detail};"
            f" cost {usd(summary_cost(event))}"
        )
    elif isinstance(event, SummaryStale):
        print(f"[callback] summary stale ({event.reason}); cost {usd(summary_cost(event))}")
    elif isinstance(event, CompactionWarning):
        print(f"[callback] warning ({event.code}): {event.message}")
    elif isinstance(event, BudgetExceeded):
        print(f"[callback] over budget: {event.tokens} > {event.budget} tokens")
    else:  # TranscriptRepaired, HistoryResynced
        print(f"[callback] {event.to_json()}")


async def tally(events: AsyncIterator[Event]) -> str:
    """The iterator: reads every event until the manager closes, and sums them up."""
    kinds: Counter[str] = Counter()
    saved = 0
    cost: float | None = 0.0
    async for event in events:
        kinds[type(event).__name__] += 1
        if isinstance(event, ContextCompacted):
            saved += event.tokens_before - event.tokens_after
        c = summary_cost(event)  # billed requests count, used or not
        cost = None if cost is None or c is None else cost + c
    seen = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
    return f"[iterator] {seen}; saved {saved} tokens in total, summaries cost {usd(cost)}"


def briefing() -> str:
    """What the fake cheap model answers: a briefing with every required section."""
    return (
        f"## Goal\n{TASK}\n"
        "## Constraints\nRead one file at a time.\n"
        "## Decisions\nNone.\n"
        "## Files touched\nmod0.py and the next files in order, read with read_file; each "
        "defines 80 functions modN_fK(x) returning x * K.\n"
        "## Open items\nRead the remaining files, then summarize them in one sentence."
    )


async def main() -> None:
    async with AsyncExitStack() as stack:
        if OFFLINE:
            from agentctx.testing import FakeOpenAI, Reply

            # The loop's model reads every file, then answers; each call takes a moment. The
            # cheap model's first answer lacks the briefing's headings (so it is rejected),
            # its later ones are good briefings.
            script = [
                Reply.tool_call("read_file", {"path": f"mod{i}.py"}, delay=0.05)
                for i in range(FILES)
            ]
            final = Reply.text("Fourteen small arithmetic helper modules.", delay=0.05)
            server = await stack.enter_async_context(FakeOpenAI([*script, final]))
            cheap = await stack.enter_async_context(
                FakeOpenAI(
                    [Reply.text("The agent read some files.")],
                    default=Reply.text(briefing()),
                    caching=False,
                )
            )
            raw = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="test", max_retries=0)
            summary_client = await stack.enter_async_context(
                openai.AsyncOpenAI(base_url=cheap.url + "/v1", api_key="test")
            )
        else:
            raw = summary_client = openai.AsyncOpenAI()  # one client, two models

        llm = LlmCompaction(
            OpenAIChatSummarizer(SUMMARY_MODEL, client=summary_client),
            LlmCompactionConfig(timeout=30.0),
        )
        # A small budget so that this short session compacts; use your model's real window.
        ctx = ContextManager(
            Budget(context_window=9_000, reserve_output=1_000),
            strategy=Chain([llm, DeterministicCompaction()]),
            recall=MemoryRecallStore(),
        )
        ctx.subscribe(on_event)
        # The iterator's task is started before the manager's `async with`, so it ends after
        # it: closing the manager ends the iterator, which sees every event from its creation.
        tasks = await stack.enter_async_context(asyncio.TaskGroup())
        reader = tasks.create_task(tally(ctx.events()))
        async with ctx:
            client = await stack.enter_async_context(wrap(raw, ctx))
            history: list[dict[str, Any]] = [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": TASK},
            ]
            for _ in range(FILES + 4):
                resp = await client.chat.completions.create(  # full history in, view sent
                    model=MODEL, tools=TOOLS, messages=history
                )
                message = resp.choices[0].message
                history.append(message.to_dict())
                if not message.tool_calls:
                    print(f"final answer: {message.content}")
                    break
                for call in message.tool_calls:
                    path = json.loads(call.function.arguments)["path"]
                    history.append(
                        {"role": "tool", "tool_call_id": call.id, "content": read_file(path)}
                    )
        print(await reader)
        spend = llm.spend
        print(
            f"summarizer ({SUMMARY_MODEL}): {spend.requests} requests billed,"
            f" cost {usd(spend.cost_usd)}; {llm.phase} at the end"
        )


if __name__ == "__main__":
    if not OFFLINE and "OPENAI_API_KEY" not in os.environ:
        sys.exit("set OPENAI_API_KEY, or AGENTCTX_OFFLINE=1 to run against a fake server")
    asyncio.run(main())
