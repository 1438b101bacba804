"""An OpenAI Responses tool loop with `wrap`: the input items stay in the SDK's own dicts.

    AGENTCTX_OFFLINE=1 python examples/openai_responses_loop.py  # against agentctx's fake server
    OPENAI_API_KEY=... python examples/openai_responses_loop.py  # against the real API

``wrap(client, ctx)`` compacts the ``input`` of every ``responses.create`` call (leading
developer/system items are sent untouched) and records its usage. The loop keeps the whole
history client-side (``store=False``), so each request carries all of it, compacted.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from contextlib import AsyncExitStack
from typing import Any

import openai

from agentctx import Budget, ContextCompacted, ContextManager, Event, MemoryRecallStore
from agentctx.providers.openai import wrap

MODEL = os.environ.get("AGENTCTX_MODEL", "gpt-6-luna")
OFFLINE = os.environ.get("AGENTCTX_OFFLINE") == "1"
FILES = 8
TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a source file of the project.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
            "additionalProperties": False,
        },
        "strict": True,
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
            from agentctx.testing import FakeOpenAI, Reply

            script = [Reply.tool_call("read_file", {"path": f"mod{i}.py"}) for i in range(FILES)]
            server = await stack.enter_async_context(
                FakeOpenAI([*script, Reply.text("Eight small arithmetic helper modules.")])
            )
            raw = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="test", max_retries=0)
        else:
            raw = openai.AsyncOpenAI()

        # A small budget so that this short session compacts; use your model's real window.
        ctx = ContextManager(
            Budget(context_window=8_000, reserve_output=1_000), recall=MemoryRecallStore()
        )
        stack.push_async_callback(ctx.aclose)
        ctx.subscribe(on_event)
        client = await stack.enter_async_context(wrap(raw, ctx))

        items: list[dict[str, Any]] = [
            {"role": "developer", "content": SYSTEM},
            {"role": "user", "content": TASK},
        ]
        for _ in range(FILES + 4):
            resp = await client.responses.create(  # full history in, compacted view sent
                model=MODEL, tools=TOOLS, input=items, store=False
            )
            items += [item.to_dict() for item in resp.output]
            calls = [item for item in resp.output if item.type == "function_call"]
            if not calls:
                print(f"final answer: {resp.output_text}")
                break
            for call in calls:
                path = json.loads(call.arguments)["path"]
                items.append(
                    {
                        "type": "function_call_output",
                        "call_id": call.call_id,
                        "output": read_file(path),
                    }
                )
        u = ctx.usage
        print(
            f"usage: {u.prompt_tokens} prompt tokens ({u.cache_read_tokens} cache reads),"
            f" {u.output_tokens} output tokens"
        )


if __name__ == "__main__":
    if not OFFLINE and "OPENAI_API_KEY" not in os.environ:
        sys.exit("set OPENAI_API_KEY, or AGENTCTX_OFFLINE=1 to run against a fake server")
    asyncio.run(main())
