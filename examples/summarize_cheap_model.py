"""Summarize old history on a cheap model while the loop runs on a strong one.

    AGENTCTX_OFFLINE=1 python examples/summarize_cheap_model.py   # against agentctx's fake servers
    ANTHROPIC_API_KEY=... python examples/summarize_cheap_model.py # against the real API

The loop talks to a Sonnet-class model. ``LlmCompaction`` sends the old part of the history to
a Haiku-class model (`AnthropicSummarizer`) in the background, once the prompt passes the
budget's trigger, and splices the briefing in when the prompt reaches the limit; until then,
and whenever no usable briefing is ready, ``DeterministicCompaction`` chained after it keeps
the loop inside the budget, so the loop never waits for the summarizer.
"""

from __future__ import annotations

import asyncio
import os
import sys
from contextlib import AsyncExitStack
from typing import Any

import anthropic

from agentctx import (
    Budget,
    Chain,
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
from agentctx.pricing import price_for
from agentctx.providers.anthropic import wrap
from agentctx.providers.anthropic_summarizer import AnthropicSummarizer

MODEL = os.environ.get("AGENTCTX_MODEL", "claude-sonnet-5-5")
SUMMARY_MODEL = os.environ.get("AGENTCTX_SUMMARY_MODEL", "claude-haiku-5-5")
OFFLINE = os.environ.get("AGENTCTX_OFFLINE") == "1"
FILES = 14
TOOLS: list[Any] = [
    {
        "name": "read_file",
        "description": "Read a source file of the project.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
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


def on_event(event: Event) -> None:
    if isinstance(event, ContextCompacted):
        saved = event.tokens_before - event.tokens_after
        print(
            f"compacted ({event.method}): {event.tokens_before} -> {event.tokens_after} tokens,"
            f" saved {saved}; {event.messages_before} -> {event.messages_after} messages"
        )
        for action in event.actions[:3]:
            print(f"  - {action}")
        if event.summary is not None:  # a summarizer request was made for this compaction
            s = event.summary
            print(
                f"  summarizer {s.model}: {s.messages_summarized} messages summarized,"
                f" {s.usage.prompt_tokens} input + {s.usage.output_tokens} output tokens,"
                f" cost {usd(s.cost_usd)}"
            )
    elif isinstance(event, SummaryRejected | SummaryStale):  # paid for, never spliced
        cost = usd(event.summary.cost_usd) if event.summary else "nothing billed"
        print(f"briefing not used ({type(event).__name__} {event.reason}): cost {cost}")


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
            from agentctx.testing import FakeAnthropic, Reply

            # The strong model: read every file, then answer. Each call takes a moment, as a
            # real one does; the cheap model answers at once (and bills no prompt caching).
            script = [
                Reply.tool_call("read_file", {"path": f"mod{i}.py"}, delay=0.05)
                for i in range(FILES)
            ]
            final = Reply.text("Fourteen small arithmetic helper modules.", delay=0.05)
            server = await stack.enter_async_context(FakeAnthropic([*script, final]))
            cheap = await stack.enter_async_context(
                FakeAnthropic(default=Reply.text(briefing()), caching=False)
            )
            raw = anthropic.AsyncAnthropic(base_url=server.url, api_key="test", max_retries=0)
            summary_client = await stack.enter_async_context(
                anthropic.AsyncAnthropic(base_url=cheap.url, api_key="test")
            )
        else:
            raw = summary_client = anthropic.AsyncAnthropic()  # one client, two models

        # The summarizer gets its own model; a copy of the client with SDK retries off is made
        # (LlmCompaction does the retrying), and the client stays ours to close. Low effort:
        # Haiku 5.5 thinks by default, and thinking counts against the briefing's token cap.
        summarizer = AnthropicSummarizer(
            SUMMARY_MODEL,
            client=summary_client,
            request_options={"output_config": {"effort": "low"}},
        )
        llm = LlmCompaction(
            summarizer,
            LlmCompactionConfig(timeout=30.0),
        )
        strategy = Chain([llm, DeterministicCompaction()])
        # A small budget so that this short session compacts; use your model's real window.
        ctx = ContextManager(
            Budget(context_window=9_000, reserve_output=1_000),
            strategy=strategy,
            recall=MemoryRecallStore(),
        )
        client = await stack.enter_async_context(wrap(raw, ctx))  # closes `raw` at the end
        # `async with` (here: the exit stack) gives the manager the task group that runs the
        # summarizer in the background. Entered last, it exits first: a summary still running
        # is cancelled before the clients close.
        await stack.enter_async_context(ctx)
        ctx.subscribe(on_event)

        history: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
        for _ in range(FILES + 4):
            resp = await client.messages.create(  # full history in, compacted view sent
                model=MODEL, max_tokens=1024, system=SYSTEM, tools=TOOLS, messages=history
            )
            history.append({"role": "assistant", "content": [b.to_dict() for b in resp.content]})
            uses = [b for b in resp.content if b.type == "tool_use"]
            if not uses:
                text = "".join(b.text for b in resp.content if b.type == "text")
                print(f"final answer: {text}")
                break
            history.append(
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": u.id,
                            "content": read_file(str(u.input["path"])),
                        }
                        for u in uses
                    ],
                }
            )
        # Closing the manager reports a briefing that was paid for but never needed.
        await ctx.aclose()
        spend = llm.spend  # every billed summarizer response this session, used or not
        print(
            f"summarizer total ({SUMMARY_MODEL}): {spend.requests} requests,"
            f" {spend.usage.prompt_tokens} input + {spend.usage.output_tokens} output tokens,"
            f" cost {usd(spend.cost_usd)}; {llm.phase} at the end"
        )
        u = ctx.usage
        price = price_for(MODEL)  # None when agentctx.pricing does not know the model
        cost = usd(price.cost(u)) if price else f"unknown (no price for {MODEL})"
        print(
            f"loop total ({MODEL}): {u.prompt_tokens} prompt tokens"
            f" ({u.cache_read_tokens} cache reads), {u.output_tokens} output tokens, cost {cost}"
        )


if __name__ == "__main__":
    if not OFFLINE and "ANTHROPIC_API_KEY" not in os.environ:
        sys.exit("set ANTHROPIC_API_KEY, or AGENTCTX_OFFLINE=1 to run against a fake server")
    asyncio.run(main())
