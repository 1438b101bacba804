"""The same Anthropic tool loop with `wrap`: the history stays in the SDK's own dicts.

    AGENTCTX_OFFLINE=1 python examples/anthropic_wrap.py   # against agentctx's fake server
    ANTHROPIC_API_KEY=... python examples/anthropic_wrap.py # against the real API

``wrap(client, ctx)`` compacts the ``messages`` of every ``messages.create`` call and records
its usage; the loop itself is an ordinary SDK loop.
"""

from __future__ import annotations

import asyncio
import os
import sys
from contextlib import AsyncExitStack
from typing import Any

import anthropic

from agentctx import Budget, ContextCompacted, ContextManager, Event, MemoryRecallStore
from agentctx.providers.anthropic import wrap

MODEL = os.environ.get("AGENTCTX_MODEL", "claude-sonnet-5-5")
OFFLINE = os.environ.get("AGENTCTX_OFFLINE") == "1"
FILES = 8
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


def on_event(event: Event) -> None:
    if isinstance(event, ContextCompacted):
        saved = event.tokens_before - event.tokens_after
        print(
            f"compacted ({event.method}): {event.tokens_before} -> {event.tokens_after} tokens,"
            f" saved {saved}; {event.messages_before} -> {event.messages_after} messages"
        )
        for action in event.actions[:3]:
            print(f"  - {action}")


async def main() -> None:
    async with AsyncExitStack() as stack:
        if OFFLINE:
            from agentctx.testing import FakeAnthropic, Reply

            script = [Reply.tool_call("read_file", {"path": f"mod{i}.py"}) for i in range(FILES)]
            server = await stack.enter_async_context(
                FakeAnthropic([*script, Reply.text("Eight small arithmetic helper modules.")])
            )
            raw = anthropic.AsyncAnthropic(base_url=server.url, api_key="test", max_retries=0)
        else:
            raw = anthropic.AsyncAnthropic()

        # A small budget so that this short session compacts; use your model's real window.
        ctx = ContextManager(
            Budget(context_window=9_000, reserve_output=1_000), recall=MemoryRecallStore()
        )
        stack.push_async_callback(ctx.aclose)
        ctx.subscribe(on_event)
        client = await stack.enter_async_context(wrap(raw, ctx))

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
        u = ctx.usage
        print(
            f"usage: {u.prompt_tokens} prompt tokens ({u.cache_read_tokens} cache reads),"
            f" {u.output_tokens} output tokens"
        )


if __name__ == "__main__":
    if not OFFLINE and "ANTHROPIC_API_KEY" not in os.environ:
        sys.exit("set ANTHROPIC_API_KEY, or AGENTCTX_OFFLINE=1 to run against a fake server")
    asyncio.run(main())
