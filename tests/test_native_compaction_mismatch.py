"""A native compaction summarizer under a loop on another API (hostile run CX, finding 3).

`OpenAICompactionSummarizer` under a Chat Completions loop was accepted, and the session ran
until its first splice; then every call raised (the Responses item cannot go in a Chat
message): the loop died mid-session, after paying for the compaction. The same held for
Anthropic's under an OpenAI loop and OpenAI's under an Anthropic one. `wrap` and
`as_middleware` now refuse the session with `ConfigError` when they are made, and a Chat
Completions call on an OpenAI client (which carries both of OpenAI's APIs) is refused before
anything is compacted or sent; through the real SDKs against the fake servers.
"""

from __future__ import annotations

import gc
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import anyio
import openai
import pytest

from agentctx import Budget, Chain, ContextManager, DeterministicCompaction
from agentctx.errors import ConfigError
from agentctx.events import ContextCompacted, Event
from agentctx.providers import anthropic as ant_provider
from agentctx.providers import openai as oai_provider
from agentctx.providers.anthropic_compaction import AnthropicCompactionSummarizer
from agentctx.providers.middleware import as_middleware
from agentctx.providers.openai_compaction import OpenAICompactionSummarizer
from agentctx.strategies.llm import LlmCompaction, LlmCompactionConfig
from agentctx.strategy import CompactionStrategy
from agentctx.summarizer import Summarizer
from agentctx.testing.scripted import ScriptedSummarizer
from agentctx.testing.servers import FakeAnthropic, FakeOpenAI, Reply

from .sdk_summarizer import poll
from .test_llm_compaction import briefing

ANTHROPIC_MODEL = "claude-sonnet-4-5"
OPENAI_MODEL = "gpt-5.4"
NOWHERE = "http://127.0.0.1:9"  # never reached: nothing is sent in these tests but where said


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """Unclosed clients or sockets warn when collected, and warnings are errors."""
    yield
    gc.collect()


def native(
    api: str, url: str = NOWHERE
) -> AnthropicCompactionSummarizer | OpenAICompactionSummarizer:
    if api == "anthropic":
        return AnthropicCompactionSummarizer(ANTHROPIC_MODEL, api_key="k", base_url=url)
    return OpenAICompactionSummarizer(OPENAI_MODEL, api_key="k", base_url=url + "/v1")


# Where the summarizer sits in the session's strategy.
SHAPES: dict[str, Callable[[Summarizer], CompactionStrategy]] = {
    "chain": lambda s: Chain([LlmCompaction(s), DeterministicCompaction()]),
    "alone": lambda s: LlmCompaction(s),
    "nested chain": lambda s: Chain([Chain([LlmCompaction(s)]), DeterministicCompaction()]),
    "fallback": lambda s: LlmCompaction(
        ScriptedSummarizer([briefing()]),
        fallback=Chain([LlmCompaction(s), DeterministicCompaction()]),
    ),
}


def session(strategy: CompactionStrategy) -> ContextManager:
    return ContextManager(Budget(context_window=4_000, reserve_output=500), strategy=strategy)


def loop_threads() -> int:
    return sum(t.name == "agentctx" for t in threading.enumerate())


# The SDK client of each wrapped loop, and the native summarizer of the other API.
CLIENTS: dict[str, tuple[Callable[[], Any], str]] = {
    "AsyncAnthropic": (lambda: anthropic.AsyncAnthropic(base_url=NOWHERE, api_key="k"), "openai"),
    "Anthropic": (lambda: anthropic.Anthropic(base_url=NOWHERE, api_key="k"), "openai"),
    "AsyncOpenAI": (lambda: openai.AsyncOpenAI(base_url=NOWHERE, api_key="k"), "anthropic"),
    "OpenAI": (lambda: openai.OpenAI(base_url=NOWHERE, api_key="k"), "anthropic"),
}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("kind", list(CLIENTS))
async def test_a_native_summarizer_for_another_api_is_refused_when_wrapped(
    kind: str, shape: str
) -> None:
    make_client, other = CLIENTS[kind]
    summarizer = native(other)
    client = make_client()
    threads = loop_threads()
    wrap: Any = ant_provider.wrap if "Anthropic" in kind else oai_provider.wrap
    try:
        async with session(SHAPES[shape](summarizer)) as manager:
            with pytest.raises(ConfigError, match=type(summarizer).__name__):
                wrap(client, manager)
    finally:
        await summarizer.aclose()
        await client.close() if kind.startswith("Async") else client.close()
    assert loop_threads() == threads  # a blocking client's loop was not started


@pytest.mark.parametrize(
    ("api", "other"),
    [
        ("anthropic", "openai"),
        ("openai-chat", "openai"),
        ("openai-chat", "anthropic"),
        ("openai-responses", "anthropic"),
    ],
)
async def test_a_native_summarizer_for_another_api_is_refused_by_the_middleware(
    api: Any, other: str
) -> None:
    summarizer = native(other)
    try:
        async with session(SHAPES["chain"](summarizer)) as manager:
            with pytest.raises(ConfigError, match="cannot carry"):
                as_middleware(manager, api)
    finally:
        await summarizer.aclose()


async def test_a_chat_loop_refuses_the_responses_compaction_before_sending() -> None:
    """The hostile run's case: the OpenAI client is accepted (its Responses calls can carry
    the item), and its first Chat Completions call is refused, before any request: no
    compaction paid for, no model call sent."""
    history = [{"role": "user", "content": "task: fix the parser " + "words " * 60}]
    async with (
        FakeOpenAI(default=Reply.text("ok")) as server,
        openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0) as oc,
    ):
        summarizer = OpenAICompactionSummarizer(OPENAI_MODEL, client=oc)
        async with session(SHAPES["chain"](summarizer)) as manager:
            client = oai_provider.wrap(oc, manager)
            chat = client.chat.completions
            with pytest.raises(ConfigError, match="OpenAI Chat Completions requests cannot"):
                await chat.create(model=OPENAI_MODEL, messages=history)
            with pytest.raises(ConfigError, match="OpenAICompactionSummarizer"):
                await chat.parse(model=OPENAI_MODEL, messages=history)
            with pytest.raises(ConfigError, match="OpenAICompactionSummarizer"):
                async with chat.stream(model=OPENAI_MODEL, messages=history):
                    pass
            assert server.requests == []
            # The same client's Responses calls go on.
            await client.responses.create(model=OPENAI_MODEL, input=history, store=False)
            assert [(r.path, r.status) for r in server.requests] == [("/v1/responses", 200)]
            assert manager.raw  # the session took the call


def test_a_blocking_chat_loop_refuses_the_responses_compaction_before_sending() -> None:
    history = [{"role": "user", "content": "task: fix the parser"}]
    summarizer = native("openai")
    try:
        with FakeOpenAI(default=Reply.text("ok")) as server:
            raw = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
            with oai_provider.wrap(raw, session(SHAPES["chain"](summarizer))) as client:
                with pytest.raises(ConfigError, match="OpenAI Chat Completions requests cannot"):
                    client.chat.completions.create(model=OPENAI_MODEL, messages=history)
                assert server.requests == []
                client.responses.create(model=OPENAI_MODEL, input=history, store=False)
    finally:
        anyio.run(summarizer.aclose)
    assert [(r.path, r.status) for r in server.requests] == [("/v1/responses", 200)]


async def test_a_strategy_replaced_after_wrap_is_checked_on_the_next_call() -> None:
    history = [{"role": "user", "content": "task: fix the parser"}]
    summarizer = native("openai")
    try:
        async with (
            FakeAnthropic(default=Reply.text("ok")) as server,
            anthropic.AsyncAnthropic(base_url=server.url, api_key="k", max_retries=0) as ac,
            session(DeterministicCompaction()) as manager,
        ):
            client = ant_provider.wrap(ac, manager)
            await client.messages.create(model=ANTHROPIC_MODEL, max_tokens=50, messages=history)
            manager.strategy = SHAPES["chain"](summarizer)
            with pytest.raises(ConfigError, match="Anthropic Messages requests cannot"):
                await client.messages.create(model=ANTHROPIC_MODEL, max_tokens=50, messages=history)
            assert len(server.requests) == 1
    finally:
        await summarizer.aclose()


# ---------------------------------------------------------------------------------------
# On its own API, a native summarizer compacts a wrapped loop as before


def answering(body: dict[str, Any]) -> Reply:
    """A compaction to a compaction request (Anthropic's carries ``compaction``; OpenAI's
    takes no ``store``, which the loop's calls send), else a long answer."""
    if "compaction" in body or ("input" in body and "store" not in body):
        return Reply.text("SUMMARY of the work")
    return Reply.text("ok " * 30)


def summarized(events: list[Event]) -> bool:
    return any(isinstance(e, ContextCompacted) and e.method == "summarized" for e in events)


class Loop:
    """A wrapped loop on ``api``'s SDK (Anthropic's Messages or OpenAI's Responses) against
    ``server``; `call` sends the history and appends the answer."""

    def __init__(self, api: str, server: Any, manager: ContextManager) -> None:
        self.api = api
        self.sdk: Any = (
            anthropic.AsyncAnthropic(base_url=server.url, api_key="k", max_retries=0)
            if api == "anthropic"
            else openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
        )
        self.client: Any = (ant_provider if api == "anthropic" else oai_provider).wrap(
            self.sdk, manager
        )
        self.history: list[dict[str, Any]] = [{"role": "user", "content": "task: fix it"}]

    async def call(self, text: str) -> None:
        self.history.append({"role": "user", "content": text})
        if self.api == "anthropic":
            message = await self.client.messages.create(
                model=ANTHROPIC_MODEL, max_tokens=100, messages=self.history
            )
            answer = message.content[0].text
        else:
            response = await self.client.responses.create(
                model=OPENAI_MODEL, input=self.history, store=False
            )
            answer = response.output_text
        self.history.append({"role": "assistant", "content": answer})


@pytest.mark.parametrize("api", ["anthropic", "openai"])
async def test_a_native_summarizer_compacts_a_wrapped_loop_on_its_own_api(api: str) -> None:
    server: Any = (
        FakeAnthropic(default=answering) if api == "anthropic" else FakeOpenAI(default=answering)
    )
    events: list[Event] = []
    async with server:
        summarizer = native(api, server.url)
        llm = LlmCompaction(summarizer, LlmCompactionConfig(trigger_ratio=0.5, timeout=30))
        try:
            async with session(Chain([llm, DeterministicCompaction()])) as manager:
                manager.subscribe(events.append)
                loop = Loop(api, server, manager)
                async with loop.sdk:
                    for i in range(60):
                        await loop.call(f"step {i}: " + "words " * 60)
                        if summarized(events):
                            break
                        # the compaction's answer, if one was asked, before the next call
                        assert await poll(lambda: llm.phase != "in_flight", 30.0, 0.01)
                    for i in range(3):  # the item goes back on every later call
                        await loop.call(f"more {i}")
        finally:
            await summarizer.aclose()
    assert summarized(events)
    assert all(r.status == 200 for r in server.requests)
    last = server.requests[-1].json
    sent = last["messages"] if api == "anthropic" else last["input"]
    assert '"type": "compaction"' in json.dumps(sent)


@pytest.mark.parametrize("shape", list(SHAPES))
async def test_the_openai_agents_filter_refuses_anthropics_native_compaction(shape: str) -> None:
    """Found by the re-run (DA 4): the OpenAI Agents integration (a Responses loop) took a
    session compacting with Anthropic's native compaction, and every call after its first
    splice raised. Refused when the filter is made, and on the first call after the
    strategy is replaced by one that splices it."""
    from agentctx.integrations.openai_agents import AgentCtxInputFilter

    summarizer, responses = native("anthropic"), native("openai")
    try:
        with pytest.raises(ConfigError, match="native compaction"):
            AgentCtxInputFilter(session(SHAPES[shape](summarizer)))
        manager = session(DeterministicCompaction())
        accepted = AgentCtxInputFilter(manager)  # nothing native: taken
        AgentCtxInputFilter(session(SHAPES[shape](responses)), api="responses")
        manager.strategy = SHAPES[shape](summarizer)
        with pytest.raises(ConfigError, match="native compaction"):
            await accepted(_Call())  # type: ignore[arg-type]  # refused before its input
    finally:
        await summarizer.aclose()
        await responses.aclose()


class _Call:
    """A model call's data read no further than its agent (a model named by a string)."""

    agent = None


class _Labelled(DeterministicCompaction):
    """A strategy whose unknown attributes read as labels (a proxy, a config object)."""

    def __getattr__(self, name: str) -> str:
        return f"<{name}>"


def test_a_strategy_whose_attributes_read_as_text_is_no_native_one() -> None:
    """Found by the re-run (DA 6): any string ``native_provider`` was taken for a provider, so
    a strategy answering every unknown attribute with a label was refused by every API."""
    manager = session(_Labelled())
    for api in ("anthropic", "openai-chat", "openai-responses"):
        as_middleware(manager, api)  # type: ignore[arg-type]


async def test_the_openai_agents_filter_takes_openais_native_compaction_only_when_told() -> None:
    """Found by the re-runs (DB 1, DC 1, 2): the filter took every model for a Responses one,
    so an `OpenAIChatCompletionsModel` agent (or a RunConfig's model or model provider) took
    OpenAI's native compaction, and after its first paid splice the SDK refused every call
    ("Compaction items are not supported for chat completions"). Reading the agent's model
    instead refused valid setups and missed a RunConfig's, which a filter cannot see. The run's
    API is now said (``api="responses"``); not said, OpenAI's native compaction is refused
    when the filter is made, before anything is compacted, with what to pass."""
    from agents import Agent, OpenAIResponsesModel
    from agents.run_config import CallModelData, ModelInputData

    from agentctx.integrations.openai_agents import AgentCtxInputFilter

    summarizer = native("openai")
    client = openai.AsyncOpenAI(base_url=NOWHERE, api_key="k")
    try:
        async with session(SHAPES["chain"](summarizer)) as manager:
            with pytest.raises(ConfigError, match="api='responses'"):
                AgentCtxInputFilter(manager)
            with pytest.raises(ConfigError, match="Chat Completions"):
                AgentCtxInputFilter(manager, api="chat")
            with pytest.raises(ConfigError, match="'completions'"):
                AgentCtxInputFilter(manager, api="completions")  # type: ignore[arg-type]
            accept = AgentCtxInputFilter(manager, api="responses")
            data = ModelInputData(input=[{"role": "user", "content": "go"}], instructions=None)
            agent = Agent(name="a", model=OpenAIResponsesModel("gpt-5", client))
            sent = await accept(CallModelData(model_data=data, agent=agent, context=None))
            assert sent.input == [{"role": "user", "content": "go"}]
    finally:
        await summarizer.aclose()
        await client.close()


class _ListedProvider(DeterministicCompaction):
    native_provider = ["anthropic"]  # no provider name: a list


def test_an_unhashable_native_provider_is_no_native_one() -> None:
    """Found by the re-run (DB 2): a ``native_provider`` that cannot be hashed made `wrap`
    and `as_middleware` raise a bare `TypeError` where they took the setup before."""
    manager = session(_ListedProvider())
    for api in ("anthropic", "openai-chat", "openai-responses"):
        as_middleware(manager, api)  # type: ignore[arg-type]
