"""A LangChain v1 agent (``create_agent``) whose model calls agentctx compacts, with
`AgentCtxMiddleware`.

    AGENTCTX_OFFLINE=1 python examples/langchain_agent.py  # LangChain's fake chat model
    OPENAI_API_KEY=... python examples/langchain_agent.py  # a real model (needs langchain-openai)

``trigger`` and ``keep`` read as in LangChain's ``SummarizationMiddleware``. The middleware
hands each model call the compacted view of the agent's messages; the graph state keeps them
all, so the next ``ainvoke`` (or a checkpointer) continues from the whole history.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from agentctx import ContextCompacted, Event
from agentctx.integrations.langchain import AgentCtxMiddleware, context_manager

MODEL = os.environ.get("AGENTCTX_MODEL", "openai:gpt-5.4-mini")
OFFLINE = os.environ.get("AGENTCTX_OFFLINE") == "1"
FILES = 8
SYSTEM = "You are a code reviewer. Read the files you are asked about with read_file."
TASK = f"Read mod0.py to mod{FILES - 1}.py one at a time, then summarize them in one sentence."


@tool
def read_file(path: str) -> str:
    """Read a source file of the project (a large, made-up one, so the context fills up)."""
    return "\n".join(f"def {path[:-3]}_f{n}(x):\n    return x * {n}  # step {n}" for n in range(80))


class ScriptedModel(GenericFakeChatModel):
    """LangChain's fake chat model, scripted, taking tools (``create_agent`` binds them) and
    printing how many messages each call gets."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        results = sum(isinstance(m, ToolMessage) for m in messages)
        print(f"model call: {len(messages)} messages, {results} tool results")
        return super()._generate(messages, *args, **kwargs)


def offline_model() -> ScriptedModel:
    calls = [
        AIMessage(
            "", tool_calls=[{"name": "read_file", "args": {"path": f"mod{n}.py"}, "id": f"c{n}"}]
        )
        for n in range(FILES)
    ]
    return ScriptedModel(
        messages=iter([*calls, AIMessage("Eight small arithmetic helper modules.")])
    )


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
    if OFFLINE:
        model: Any = offline_model()
    else:
        from langchain.chat_models import init_chat_model

        model = init_chat_model(MODEL)
    # A small budget so that this short session compacts; use your model's real window.
    async with context_manager(trigger=("tokens", 7_000), keep=("messages", 6)) as ctx:
        ctx.subscribe(on_event)
        agent = create_agent(
            model, [read_file], system_prompt=SYSTEM, middleware=[AgentCtxMiddleware(ctx)]
        )
        state = await agent.ainvoke({"messages": [HumanMessage(TASK)]})
    messages = state["messages"]
    results = [m for m in messages if isinstance(m, ToolMessage)]
    whole = all(
        m.content == read_file.invoke({"path": f"mod{n}.py"}) for n, m in enumerate(results)
    )
    print(f"state: {len(messages)} messages, {len(results)} tool results, whole: {whole}")
    print(f"final answer: {messages[-1].content}")


if __name__ == "__main__":
    if not OFFLINE and "OPENAI_API_KEY" not in os.environ:
        sys.exit("set OPENAI_API_KEY, or AGENTCTX_OFFLINE=1 to run with LangChain's fake model")
    asyncio.run(main())
