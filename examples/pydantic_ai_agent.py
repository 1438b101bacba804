"""A pydantic-ai agent whose model requests agentctx compacts, with `AgentCtxCapability`.

    AGENTCTX_OFFLINE=1 python examples/pydantic_ai_agent.py  # pydantic-ai's FunctionModel
    OPENAI_API_KEY=... python examples/pydantic_ai_agent.py  # a real model (AGENTCTX_MODEL)

The capability hands each request the compacted view of the run's history; the run's own
history (``result.all_messages()``) stays whole, so it is what the next run continues from.
"""

from __future__ import annotations

import asyncio
import os
import sys

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agentctx import Budget, ContextCompacted, ContextManager, Event
from agentctx.integrations.pydantic_ai import AgentCtxCapability

MODEL = os.environ.get("AGENTCTX_MODEL", "openai:gpt-5.4-mini")
OFFLINE = os.environ.get("AGENTCTX_OFFLINE") == "1"
FILES = 8
SYSTEM = "You are a code reviewer. Read the files you are asked about with read_file."
TASK = f"Read mod0.py to mod{FILES - 1}.py one at a time, then summarize them in one sentence."


def read_file(path: str) -> str:
    """Read a source file of the project (a large, made-up one, so the context fills up)."""
    return "\n".join(f"def {path[:-3]}_f{n}(x):\n    return x * {n}  # step {n}" for n in range(80))


def offline_model() -> FunctionModel:
    """pydantic-ai's test model, scripted: read each file in turn, then answer. It prints how
    many messages each request it gets holds."""
    calls = 0

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        nonlocal calls
        returns = sum(p.part_kind == "tool-return" for m in messages for p in m.parts)
        print(f"request {calls + 1}: {len(messages)} messages, {returns} tool returns")
        if calls < FILES:
            calls += 1
            return ModelResponse([ToolCallPart("read_file", {"path": f"mod{calls - 1}.py"})])
        return ModelResponse([TextPart("Eight small arithmetic helper modules.")])

    return FunctionModel(respond)


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
    agent = Agent(offline_model() if OFFLINE else MODEL, system_prompt=SYSTEM, tools=[read_file])
    # A small budget so that this short session compacts; use your model's real window.
    async with ContextManager(Budget(context_window=8_000, reserve_output=1_000)) as ctx:
        ctx.subscribe(on_event)
        # The test model's usage numbers are made up: only a real model's calibrate agentctx.
        compaction = AgentCtxCapability(ctx, observe=not OFFLINE)
        result = await agent.run(TASK, capabilities=[compaction])
    history = result.all_messages()
    returns = [p for m in history for p in m.parts if p.part_kind == "tool-return"]
    whole = all(p.content == read_file(f"mod{n}.py") for n, p in enumerate(returns))
    print(f"history: {len(history)} messages, {len(returns)} tool returns, whole: {whole}")
    print(f"final answer: {result.output}")


if __name__ == "__main__":
    if not OFFLINE and "OPENAI_API_KEY" not in os.environ:
        sys.exit("set OPENAI_API_KEY, or AGENTCTX_OFFLINE=1 to run with pydantic-ai's test model")
    asyncio.run(main())
