"""A raw Anthropic tool loop with agentctx: ``prepare`` before each call, ``observe`` after.

    AGENTCTX_OFFLINE=1 python examples/anthropic_loop.py   # against agentctx's fake server
    ANTHROPIC_API_KEY=... python examples/anthropic_loop.py # against the real API

The history is kept as agentctx messages (projection mode: all of it, every call); agentctx
returns the view to send, and prints what each compaction saved.
"""

from __future__ import annotations

import asyncio
import os
import sys
from contextlib import AsyncExitStack

import anthropic

from agentctx import (
    Budget,
    ContextCompacted,
    ContextManager,
    Event,
    MemoryRecallStore,
    Message,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from agentctx.adapters import message_from_anthropic_response, to_anthropic

MODEL = os.environ.get("AGENTCTX_MODEL", "claude-sonnet-5-5")
OFFLINE = os.environ.get("AGENTCTX_OFFLINE") == "1"
FILES = 8
TOOLS = [
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
            client = anthropic.AsyncAnthropic(base_url=server.url, api_key="test", max_retries=0)
        else:
            client = anthropic.AsyncAnthropic()
        await stack.enter_async_context(client)

        # A small budget so that this short session compacts; use your model's real window.
        ctx = ContextManager(
            Budget(context_window=9_000, reserve_output=1_000), recall=MemoryRecallStore()
        )
        stack.push_async_callback(ctx.aclose)
        ctx.subscribe(on_event)

        history: list[Message] = [UserMessage.of(TASK)]
        for _ in range(FILES + 4):
            view = await ctx.prepare(history)  # the compacted view of the whole history
            resp = await client.messages.create(
                model=MODEL,
                max_tokens=1024,
                system=SYSTEM,
                tools=TOOLS,  # type: ignore[arg-type]
                messages=to_anthropic(view),  # type: ignore[arg-type]
            )
            reply = message_from_anthropic_response(resp.to_dict())
            ctx.observe(reply)  # calibrates the token accounting
            history.append(reply)
            calls = [b for b in reply.content if isinstance(b, ToolCall)]
            if not calls:
                text = "".join(b.text for b in resp.content if b.type == "text")
                print(f"final answer: {text}")
                break
            for call in calls:
                result = read_file(str(call.arguments["path"]))
                history.append(ToolResultMessage.of(call.id, result, tool_name=call.name))
        u = ctx.usage
        print(
            f"usage: {u.prompt_tokens} prompt tokens ({u.cache_read_tokens} cache reads),"
            f" {u.output_tokens} output tokens"
        )


if __name__ == "__main__":
    if not OFFLINE and "ANTHROPIC_API_KEY" not in os.environ:
        sys.exit("set ANTHROPIC_API_KEY, or AGENTCTX_OFFLINE=1 to run against a fake server")
    asyncio.run(main())
