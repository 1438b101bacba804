"""A prompt the provider refuses as longer than its context window, inside the frameworks:
pydantic-ai's capability and LangChain's middleware observe the refusal, compact to the
provider's count and send the request once more, as the wrapped clients do
(tests/test_prompt_refused.py).

Each framework's model speaks to a fake server over a real socket through the real SDK: the
server counts a character a quarter token, well over agentctx's uncalibrated estimate of long
English words, so a history the session takes for one that fits is refused, as a real
tokenizer denser than the estimate would refuse it."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from langchain.agents import create_agent
from langchain_core.exceptions import ContextOverflowError
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    ToolMessage,
    convert_to_openai_messages,
)
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic_ai import Agent
from pydantic_ai.exceptions import ModelContextWindowExceededError, ModelHTTPError
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.models.fallback import FallbackModel
from pydantic_ai.providers.anthropic import AnthropicProvider

from agentctx import Budget, ContextCompacted, ContextManager
from agentctx._overflow import Overflow, overflow_of
from agentctx.integrations.langchain import AgentCtxMiddleware
from agentctx.integrations.pydantic_ai import AgentCtxCapability
from agentctx.testing.servers import FakeAnthropic, FakeOpenAI, Reply

from .test_prompt_refused import TURNS, WINDOW, WORDS, refusals, watch

# -- the frameworks' own errors ------------------------------------------------------------


def test_the_frameworks_errors_for_a_prompt_too_long_are_refusals_whatever_their_status() -> None:
    assert overflow_of(ContextOverflowError("input too long")) == Overflow(None, None)
    assert overflow_of(ModelContextWindowExceededError("m", "over the window")) == Overflow(
        None, None
    )

    class Wrapped(anthropic.BadRequestError, ContextOverflowError):
        """As langchain-anthropic raises it: the SDK's error, and LangChain's."""

    response = httpx2.Response(400, request=httpx2.Request("POST", "http://127.0.0.1/"))
    text = "prompt is too long: 3520 tokens > 3000 maximum"
    error = Wrapped(text, response=response, body=None)
    assert overflow_of(error) == Overflow(3_520, 3_000)
    # pydantic-ai's HTTP error carries the API's body in its message.
    body = {"type": "error", "error": {"type": "invalid_request_error", "message": text}}
    assert overflow_of(ModelHTTPError(400, "m", body)) == Overflow(3_520, 3_000)
    assert overflow_of(ModelHTTPError(500, "m", body)) is None


# -- pydantic-ai ------------------------------------------------------------------------------


def read(path: str) -> str:
    """Read a document."""
    return WORDS


def pydantic_ai_history(turns: int) -> list[ModelMessage]:
    history: list[ModelMessage] = []
    for n in range(turns):
        history += [
            ModelRequest(parts=[UserPromptPart(f"Read document {n}.")]),
            ModelResponse(parts=[ToolCallPart("read", {"path": f"d{n}"}, tool_call_id=f"t{n}")]),
            ModelRequest(parts=[ToolReturnPart("read", WORDS, tool_call_id=f"t{n}")]),
            ModelResponse(parts=[TextPart("Read it.")]),
        ]
    return history


async def run_pydantic_ai(
    server: FakeAnthropic, ctx: ContextManager, *, stream: bool = False
) -> str:
    client = anthropic.AsyncAnthropic(base_url=server.url, api_key="test", max_retries=0)
    try:
        model = AnthropicModel(
            "claude-haiku-4-5", provider=AnthropicProvider(anthropic_client=client)
        )
        agent = Agent(model, tools=[read])
        task = "Summarize the documents."
        history = pydantic_ai_history(TURNS)
        capabilities = [AgentCtxCapability(ctx)]
        if stream:
            async with agent.run_stream(
                task, message_history=history, capabilities=capabilities
            ) as streamed:
                return await streamed.get_output()
        result = await agent.run(task, message_history=history, capabilities=capabilities)
    finally:
        await client.close()
    return result.output


@pytest.mark.parametrize("stream", [False, True], ids=["run", "run_stream"])
async def test_pydantic_ai_compacts_a_refused_request_and_attempts_it_once_more(
    stream: bool,
) -> None:
    async with (
        FakeAnthropic(context_window=WINDOW, default=Reply.text("done")) as server,
        ContextManager(Budget(context_window=WINDOW, reserve_output=500)) as ctx,
    ):
        events = watch(ctx)
        assert await run_pydantic_ai(server, ctx, stream=stream) == "done"
    assert [r.status for r in server.requests] == [400, 200]
    first, second = server.requests
    assert "prompt is too long" in (first.error or "")
    assert len(second.body) < len(first.body) // 2
    (warning,) = refusals(events)
    assert "calibrated on its count" in warning.message
    assert any(isinstance(e, ContextCompacted) for e in events)
    assert ctx.usage.prompt_tokens == second.usage.prompt_tokens  # the refusal billed 0
    task = second.json["messages"][-1]["content"]
    assert "Summarize the documents." in json.dumps(task)


async def test_pydantic_ai_raises_the_refusal_when_the_model_takes_less_than_the_budget() -> None:
    """The budget says 30k, the model takes 3k: calibrating cannot bring the view under a
    limit the model does not have, so the refusal is raised after one attempt."""
    async with (
        FakeAnthropic(context_window=WINDOW, default=Reply.text("done")) as server,
        ContextManager(Budget(context_window=30_000, reserve_output=500)) as ctx,
    ):
        events = watch(ctx)
        with pytest.raises(ModelHTTPError, match="prompt is too long"):
            await run_pydantic_ai(server, ctx)
    assert [r.status for r in server.requests] == [400]
    (warning,) = refusals(events)
    assert "set Budget.context_window" in warning.message


async def test_pydantic_ai_attempts_a_refused_request_once_more_at_most() -> None:
    """A model that takes 100 tokens: the retry, compacted as far as the budget asks, is
    refused too, and that refusal is raised, not retried again."""
    async with (
        FakeAnthropic(context_window=100, default=Reply.text("done")) as server,
        ContextManager(Budget(context_window=WINDOW, reserve_output=500)) as ctx,
    ):
        with pytest.raises(ModelHTTPError, match="prompt is too long"):
            await run_pydantic_ai(server, ctx)
    assert [r.status for r in server.requests] == [400, 400]


async def test_pydantic_ai_s_fallback_model_refused_by_every_model_is_compacted_once() -> None:
    """Found by a hostile run (DM 3): with a `FallbackModel`, every model refusing the prompt
    comes as one `FallbackExceptionGroup`, which was no refusal to agentctx: the request
    failed with nothing compacted. The group is read as one refusal (its largest count)."""
    async with (
        FakeAnthropic(context_window=WINDOW, default=Reply.text("done")) as first,
        FakeAnthropic(context_window=WINDOW, default=Reply.text("done")) as second,
        ContextManager(Budget(context_window=WINDOW, reserve_output=500)) as ctx,
    ):
        events = watch(ctx)
        clients = [
            anthropic.AsyncAnthropic(base_url=s.url, api_key="test", max_retries=0)
            for s in (first, second)
        ]
        try:
            models = [
                AnthropicModel("claude-haiku-4-5", provider=AnthropicProvider(anthropic_client=c))
                for c in clients
            ]
            agent = Agent(FallbackModel(*models), tools=[read])
            result = await agent.run(
                "Summarize the documents.",
                message_history=pydantic_ai_history(TURNS),
                capabilities=[AgentCtxCapability(ctx)],
            )
        finally:
            for c in clients:
                await c.close()
    assert result.output == "done"
    assert [r.status for r in first.requests] == [400, 200]
    assert [r.status for r in second.requests] == [400]
    assert len(refusals(events)) == 1


async def test_pydantic_ai_raises_other_errors_as_they_came() -> None:
    async with (
        FakeAnthropic(
            [Reply.error(400, message="messages: text content blocks must be non-empty")]
        ) as server,
        ContextManager(Budget(context_window=WINDOW, reserve_output=500)) as ctx,
    ):
        with pytest.raises(ModelHTTPError, match="non-empty"):
            await run_pydantic_ai(server, ctx)
    assert [r.status for r in server.requests] == [400]


# -- LangChain ------------------------------------------------------------------------------


class OpenAIChat(BaseChatModel):
    """A LangChain chat model on the real OpenAI SDK (as langchain-openai is), kept small:
    its messages as Chat Completions messages, the reply's text and usage back. ``wrap``:
    raise a refusal as langchain-openai does, as the SDK's error that is also LangChain's
    ``ContextOverflowError``."""

    client: Any
    wrap: bool = False

    @property
    def _llm_type(self) -> str:
        return "test-openai-chat"

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        raise NotImplementedError("this test model is async only")

    async def _agenerate(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> ChatResult:
        try:
            response = await self.client.chat.completions.create(
                model="m", messages=convert_to_openai_messages(messages)
            )
        except openai.BadRequestError as error:
            if not self.wrap:
                raise
            raise _LangChainOverflow(
                error.message, response=error.response, body=error.body
            ) from error
        usage = response.usage
        message = AIMessage(
            content=response.choices[0].message.content or "",
            usage_metadata={
                "input_tokens": usage.prompt_tokens,
                "output_tokens": usage.completion_tokens,
                "total_tokens": usage.total_tokens,
            },
        )
        return ChatResult(generations=[ChatGeneration(message=message)])


class _LangChainOverflow(openai.BadRequestError, ContextOverflowError):
    """What langchain-openai raises for a prompt over the window."""


def langchain_history(turns: int) -> list[BaseMessage]:
    history: list[BaseMessage] = []
    for n in range(turns):
        call = {"name": "read", "args": {"path": f"d{n}"}, "id": f"c{n}"}
        history += [
            HumanMessage(f"Read document {n}."),
            AIMessage(content="", tool_calls=[call]),
            ToolMessage(WORDS, tool_call_id=f"c{n}"),
            AIMessage(content="Read it."),
        ]
    return [*history, HumanMessage("Summarize the documents.")]


async def run_langchain(
    server: FakeOpenAI, ctx: ContextManager, *, wrap: bool = False
) -> list[BaseMessage]:
    async with openai.AsyncOpenAI(
        base_url=f"{server.url}/v1", api_key="test", max_retries=0
    ) as client:
        agent = create_agent(
            OpenAIChat(client=client, wrap=wrap), [], middleware=[AgentCtxMiddleware(ctx)]
        )
        state = await agent.ainvoke({"messages": langchain_history(TURNS)})
    return list(state["messages"])


@pytest.mark.parametrize("wrap", [False, True], ids=["sdk-error", "langchain-error"])
async def test_langchain_compacts_a_refused_request_and_sends_it_once_more(wrap: bool) -> None:
    async with (
        FakeOpenAI(context_window=WINDOW, default=Reply.text("done")) as server,
        ContextManager(Budget(context_window=WINDOW, reserve_output=500)) as ctx,
    ):
        events = watch(ctx)
        messages = await run_langchain(server, ctx, wrap=wrap)
    assert messages[-1].content == "done"
    assert [r.status for r in server.requests] == [400, 200]
    first, second = server.requests
    assert len(second.body) < len(first.body) // 2
    assert second.json["messages"][-1]["content"] == "Summarize the documents."
    (warning,) = refusals(events)
    assert "calibrated on its count" in warning.message
    assert any(isinstance(e, ContextCompacted) for e in events)
    # The agent's state keeps the whole history: only the request was compacted.
    assert len(messages) == 4 * TURNS + 2


async def test_langchain_raises_the_refusal_when_the_model_takes_less_than_the_budget() -> None:
    async with (
        FakeOpenAI(context_window=WINDOW, default=Reply.text("done")) as server,
        ContextManager(Budget(context_window=30_000, reserve_output=500)) as ctx,
    ):
        with pytest.raises(openai.BadRequestError, match="maximum context length"):
            await run_langchain(server, ctx)
    assert [r.status for r in server.requests] == [400]


async def test_langchain_sends_a_refused_request_once_more_at_most() -> None:
    async with (
        FakeOpenAI(context_window=100, default=Reply.text("done")) as server,
        ContextManager(Budget(context_window=WINDOW, reserve_output=500)) as ctx,
    ):
        with pytest.raises(openai.BadRequestError, match="maximum context length"):
            await run_langchain(server, ctx)
    assert [r.status for r in server.requests] == [400, 400]
