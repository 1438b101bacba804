"""An OpenAI Agents SDK agent whose model input agentctx compacts, with `AgentCtxInputFilter`.

    AGENTCTX_OFFLINE=1 python examples/openai_agents_agent.py  # a scripted fake Model
    OPENAI_API_KEY=... python examples/openai_agents_agent.py  # the real API (AGENTCTX_MODEL)

The filter (``RunConfig.call_model_input_filter``) hands each model call the compacted view
of the run's input; the run's items (``result.to_input_list()``, a ``Session``) stay whole.
Its ``hooks`` give each response's usage to the manager; ``wrap`` has a prompt the API still
refuses as too long compacted and sent once more.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from agents import (
    Agent,
    ModelResponse,
    MultiProvider,
    RunConfig,
    Runner,
    Usage,
    function_tool,
)
from agents.models.interface import Model
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from agentctx import Budget, ContextCompacted, ContextManager, Event
from agentctx.integrations.openai_agents import AgentCtxInputFilter

MODEL = os.environ.get("AGENTCTX_MODEL", "gpt-5.4-mini")
OFFLINE = os.environ.get("AGENTCTX_OFFLINE") == "1"
FILES = 8
SYSTEM = "You are a code reviewer. Read the files you are asked about with read_file."
TASK = f"Read mod0.py to mod{FILES - 1}.py one at a time, then summarize them in one sentence."


def source(path: str) -> str:
    """A large, made-up source file, so the context fills up quickly."""
    return "\n".join(f"def {path[:-3]}_f{n}(x):\n    return x * {n}  # step {n}" for n in range(80))


@function_tool
def read_file(path: str) -> str:
    """Read a source file of the project."""
    return source(path)


class ScriptedModel(Model):
    """A fake ``Model``: reads each file in turn, then answers; prints what each call gets."""

    def __init__(self) -> None:
        self.calls = 0

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        results = sum(item.get("type") == "function_call_output" for item in input)
        print(f"model call: {len(input)} input items, {results} tool outputs")
        usage = Usage(requests=1)  # no made-up token counts: nothing to calibrate from
        self.calls += 1
        if self.calls <= FILES:
            path = f"mod{self.calls - 1}.py"
            call = ResponseFunctionToolCall(
                type="function_call",
                call_id=f"call_{self.calls}",
                name="read_file",
                arguments=json.dumps({"path": path}),
            )
            return ModelResponse(output=[call], usage=usage, response_id=None)
        text = ResponseOutputText(
            type="output_text", text="Eight small arithmetic helper modules.", annotations=[]
        )
        message = ResponseOutputMessage(
            id="msg_1", type="message", role="assistant", status="completed", content=[text]
        )
        return ModelResponse(output=[message], usage=usage, response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


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
    agent = Agent(
        name="reviewer",
        instructions=SYSTEM,
        model=ScriptedModel() if OFFLINE else MODEL,
        tools=[read_file],
    )
    # A small budget so that this short session compacts; use your model's real window.
    async with ContextManager(Budget(context_window=8_000, reserve_output=1_000)) as ctx:
        ctx.subscribe(on_event)
        compaction = AgentCtxInputFilter(ctx)
        config = RunConfig(
            call_model_input_filter=compaction,
            # A prompt the API still refuses as too long is compacted and sent once more.
            model_provider=compaction.wrap(MultiProvider()),
            tracing_disabled=OFFLINE,
        )
        result = await Runner.run(
            agent, TASK, run_config=config, hooks=compaction.hooks, max_turns=FILES + 4
        )
    items = result.to_input_list()
    outputs = [i for i in items if i.get("type") == "function_call_output"]
    whole = all(o["output"] == source(f"mod{n}.py") for n, o in enumerate(outputs))  # type: ignore[typeddict-item]
    print(f"run items: {len(items)}, {len(outputs)} tool outputs, whole: {whole}")
    print(f"final answer: {result.final_output}")


if __name__ == "__main__":
    if not OFFLINE and "OPENAI_API_KEY" not in os.environ:
        sys.exit("set OPENAI_API_KEY, or AGENTCTX_OFFLINE=1 to run with a scripted fake model")
    asyncio.run(main())
