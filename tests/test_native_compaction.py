"""Provider-native compaction as a summarizer (issue 13, item 2): Anthropic's ``compaction``
request parameter and OpenAI's ``responses.compact``, each through the real SDK against the
fake servers, spliced by `LlmCompaction` with all its guarantees.

Every turn of a session, the loop sends the view to the same fake server as its model call
(``messages.create`` / ``responses.create``), so the server validates what is spliced like
the real API does (the compaction block's signature, the item's encrypted content) and its
simulated prompt cache shows the spliced prefix staying byte-stable.
"""

from __future__ import annotations

import base64
import dataclasses
import gc
import json
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import anthropic
import anyio
import openai
import pytest

from agentctx import (
    AssistantMessage,
    Budget,
    Chain,
    ContextManager,
    DeterministicCompaction,
    Message,
    Usage,
    UserMessage,
)
from agentctx.adapters.anthropic import (
    from_anthropic,
    message_from_anthropic_response,
    to_anthropic,
)
from agentctx.adapters.openai_responses import (
    from_openai_responses,
    message_from_openai_response,
    to_openai_responses,
)
from agentctx.errors import SummarizerError
from agentctx.events import (
    BudgetExceeded,
    ContextCompacted,
    Event,
    HistoryResynced,
    SummaryRejected,
    SummaryStale,
)
from agentctx.messages import (
    OpaqueBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    text_of,
)
from agentctx.providers.anthropic_compaction import (
    COMPACTION_BETA,
    AnthropicCompactionSummarizer,
)
from agentctx.providers.openai_compaction import OpenAICompactionSummarizer
from agentctx.strategies.llm import LlmCompaction, LlmCompactionConfig
from agentctx.strategies.trail import is_paid_summary
from agentctx.summarizer import (
    SummaryRequest,
    SummaryResult,
    check_briefing,
    check_result,
    is_native_compaction,
)
from agentctx.testing import assert_view_ok
from agentctx.testing._openai_wire import responses_items, responses_segments
from agentctx.testing._validate import sign
from agentctx.testing._wire import anthropic_segments, estimate_tokens
from agentctx.testing.servers import FakeAnthropic, FakeOpenAI, FakeServer, Reply

from .corpus import corpus_file
from .sdk_summarizer import poll

Provider = Literal["anthropic", "openai"]
PROVIDERS: list[Provider] = ["anthropic", "openai"]
ANTHROPIC_MODEL = "claude-sonnet-4-5"
OPENAI_MODEL = "gpt-5.4"
SYSTEM = "You are a coding agent working in a repository."
TOOLS = [
    {
        "name": "bash",
        "description": "Run a shell command.",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
    }
]
LIMIT = 3_000
CEILING = 60.0  # seconds to wait for an answer that comes over a local socket


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """Unclosed clients or sockets warn when collected, and warnings are errors."""
    yield
    gc.collect()


# ---------------------------------------------------------------------------------------
# A session: the loop's model calls and the compaction requests go to one fake server


WORDS = ["alpha", "beta", "gamma", "delta", "parser", "cache", "config", "token", "budget"]


def prose(i: int, words: int = 50) -> str:
    return " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(words))


def turn(i: int) -> list[Message]:
    """A user message, a tool call and its result, then the assistant's answer."""
    call = ToolCall(f"toolu_{i:03d}", "bash", {"command": f"grep -n step{i} src/parser.py"})
    return [
        UserMessage.of(f"step {i}: {prose(i)}"),
        AssistantMessage((TextBlock(f"Looking at step {i}."), call), "tool_use"),
        ToolResultMessage.of(call.id, f"{i}: {prose(i + 1, 40)}", tool_name="bash"),
        AssistantMessage.of(f"Step {i} done: {prose(i + 2, 30)}"),
    ]


@dataclass
class Session:
    provider: Provider
    server: FakeServer
    client: Any
    llm: LlmCompaction
    summarizer: AnthropicCompactionSummarizer | OpenAICompactionSummarizer
    manager: ContextManager
    events: list[Event] = field(default_factory=list)
    history: list[Message] = field(default_factory=list)
    views: list[list[Message]] = field(default_factory=list)
    sent: list[list[Any]] = field(default_factory=list)  # what each model call sent

    async def turn(self, messages: list[Message]) -> list[Message]:
        """One turn: prepare the view, send it as the loop's model call, keep the view."""
        view = await self.manager.prepare([*self.history, *messages])
        assert_view_ok(view, self.manager.raw)
        if self.provider == "anthropic":
            rendered: list[Any] = to_anthropic(view)
            message = await self.client.messages.create(
                model=ANTHROPIC_MODEL,
                max_tokens=100,
                system=SYSTEM,
                tools=TOOLS,
                messages=rendered,
            )
            usage = message_from_anthropic_response(message.to_dict()).usage
        else:
            rendered = to_openai_responses(view)
            response = await self.client.responses.create(
                model=OPENAI_MODEL, instructions=SYSTEM, input=rendered, store=False
            )
            usage = message_from_openai_response(response.to_dict()).usage
        assert usage is not None
        self.manager.observe(usage)
        self.sent.append(rendered)
        self.history = view
        self.views.append(view)
        await anyio.sleep(0.01)  # the rest of the loop's turn
        return view

    async def answered(self) -> None:
        """Until the request in flight, if any, has its answer."""
        assert await poll(lambda: self.llm.phase != "in_flight", CEILING, 0.01)

    def of(self, kind: type[Any]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]

    def spliced(self) -> list[ContextCompacted]:
        return [e for e in self.of(ContextCompacted) if e.method == "summarized"]


def compaction_blocks(view: list[Message]) -> list[dict[str, Any]]:
    return [
        dict(b.payload)
        for m in view
        if is_native_compaction(m)
        for b in m.content  # type: ignore[union-attr]
        if isinstance(b, OpaqueBlock)
    ]


def summary_of(block: dict[str, Any]) -> str:
    """The summary a fake server put in a compaction block or item."""
    if "content" in block:  # Anthropic: readable
        return str(block["content"])
    payload = block["encrypted_content"].removeprefix("fake:").rpartition(".")[0]
    return base64.b64decode(payload).decode()


def is_compaction_request(body: dict[str, Any]) -> bool:
    """Anthropic's carries ``compaction``; OpenAI's (``/v1/responses/compact``) takes no
    ``store``, which the loop's own calls always send."""
    return "compaction" in body or ("input" in body and "store" not in body)


def answering(summaries: list[str], gate: threading.Event | None = None) -> Any:
    """The fake server's answer: the next summary to a compaction request (the last one
    again when they run out; an empty one is a failed compaction), "ok" to the loop's model
    calls. With ``gate``, a compaction answer waits until it is set (in the server thread,
    which has nothing else to do meanwhile)."""
    queue = list(summaries)

    def answer(body: dict[str, Any]) -> Reply:
        if not is_compaction_request(body):
            return Reply.text("ok")
        if gate is not None:
            gate.wait(CEILING)
        summary = queue.pop(0) if len(queue) > 1 else queue[0]
        return Reply.text(summary) if summary else Reply.empty()

    return answer


def first_compaction(first: Reply, then: Any) -> Any:
    """``first`` to the first compaction request, then as ``then`` answers."""
    used = threading.Event()

    def answer(body: dict[str, Any]) -> Reply:
        if is_compaction_request(body) and not used.is_set():
            used.set()
            return first
        reply: Reply = then(body)
        return reply

    return answer


@asynccontextmanager
async def session(provider: Provider, answer: Any, **config: Any) -> AsyncIterator[Session]:
    budget = Budget(context_window=LIMIT + 1_000, reserve_output=1_000)
    settings = {"timeout": CEILING, "trigger_ratio": 0.6, **config}
    if provider == "anthropic":
        async with (
            FakeAnthropic(default=answer) as server,
            anthropic.AsyncAnthropic(base_url=server.url, api_key="test", max_retries=0) as client,
        ):
            summarizer: Any = AnthropicCompactionSummarizer(
                ANTHROPIC_MODEL, client=client, system=SYSTEM, tools=TOOLS
            )
            llm = LlmCompaction(summarizer, LlmCompactionConfig(**settings))
            async with ContextManager(
                budget, strategy=Chain([llm, DeterministicCompaction()])
            ) as m:
                s = Session(provider, server, client, llm, summarizer, m)
                m.subscribe(s.events.append)
                yield s
            assert not server.errors
        return
    async with (
        FakeOpenAI(default=answer) as oserver,
        openai.AsyncOpenAI(base_url=oserver.url + "/v1", api_key="test", max_retries=0) as oclient,
    ):
        summarizer = OpenAICompactionSummarizer(OPENAI_MODEL, client=oclient, instructions=SYSTEM)
        llm = LlmCompaction(summarizer, LlmCompactionConfig(**settings))
        async with ContextManager(budget, strategy=Chain([llm, DeterministicCompaction()])) as m:
            s = Session(provider, oserver, oclient, llm, summarizer, m)
            m.subscribe(s.events.append)
            yield s
        assert not oserver.errors


def compaction_requests(s: Session) -> list[Any]:
    if s.provider == "anthropic":
        return [r for r in s.server.requests if "compaction" in (r.json or {})]
    return [r for r in s.server.requests if r.path == "/v1/responses/compact"]


# ---------------------------------------------------------------------------------------
# Splicing, and the spliced prefix staying byte-stable


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_native_briefing_is_spliced_and_its_prefix_stays_byte_stable(
    provider: Provider,
) -> None:
    async with session(provider, answering(["FIRST summary", "LATER summary"])) as s:
        i = 0
        while not s.spliced():
            await s.turn(turn(i))
            await s.answered()
            i += 1
            assert i < 60, [type(e).__name__ for e in s.events]
        first = len(s.views) - 1
        for j in range(i, i + 8):  # every answer back before the next turn: deterministic
            await s.turn(turn(j))
            await s.answered()
    # The request: the conversation itself, through the SDK, as the provider documents it.
    request = compaction_requests(s)[0]
    assert request.status == 200
    if provider == "anthropic":
        assert COMPACTION_BETA in request.headers["anthropic-beta"]
        assert request.json["compaction"] == {"type": "summarize"}
        assert request.json["system"] == SYSTEM and request.json["tools"] == TOOLS
        assert request.json["messages"][0]["content"].startswith("step 0:")
    else:
        assert request.path == "/v1/responses/compact"
        assert request.json["instructions"] == SYSTEM
        assert request.json["input"][0]["content"].startswith("step 0:")
    # The splice: the provider's block, untouched, after the head; billed and priced.
    event = s.spliced()[0]
    assert event.summary is not None and event.summary.messages_summarized > 0
    assert event.summary.usage.output_tokens > 0 and event.summary.cost_usd is not None
    view = s.views[first]
    blocks = compaction_blocks(view)
    assert [summary_of(b) for b in blocks] == ["FIRST summary"]
    assert view[0] == s.manager.raw[0]  # the head, verbatim
    assert not [e for e in s.events if isinstance(e, SummaryRejected)]
    # Every later model call was accepted (signature / encrypted content checked) and sent
    # the spliced prefix byte for byte, until the next briefing replaced it.
    cut = next(k for k, m in enumerate(view) if is_native_compaction(m)) + 1
    end = next(
        (k for k in range(first + 1, len(s.views)) if s.views[k][:cut] != view[:cut]),
        len(s.views),
    )
    assert end - first >= 4
    render = to_anthropic if provider == "anthropic" else to_openai_responses
    k = len(render(view[:cut]))
    prefix = json.dumps(s.sent[first][:k])
    assert all(json.dumps(sent[:k]) == prefix for sent in s.sent[first:end])
    calls = [r for r in s.server.requests if not is_compaction_request(r.json)]
    assert len(calls) == len(s.sent) and all(r.status == 200 for r in calls)
    # From the second call on, the provider's cache reads at least that prefix.
    for r in calls[first + 1 : end]:
        if provider == "anthropic":
            segments = anthropic_segments(r.json)
        else:
            segments = responses_segments(r.json, responses_items(r.json))
        assert r.usage is not None
        assert r.usage.cache_read >= sum(map(estimate_tokens, segments[: 1 + k]))
    # The deterministic tiers never dropped or condensed a native briefing.
    assert all(compaction_blocks(v) for v in s.views[first:])


# ---------------------------------------------------------------------------------------
# A stale briefing: billed, reported, never spliced


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_briefing_of_a_history_edited_meanwhile_is_stale_billed_and_not_spliced(
    provider: Provider,
) -> None:
    gate = threading.Event()
    async with session(provider, answering(["FIRST", "LATER"], gate)) as s:
        i = 0
        while s.llm.phase == "idle":
            await s.turn(turn(i))
            i += 1
        assert s.llm.phase == "in_flight"  # the answer waits for the gate
        # Edit a message inside the span, same shape, before the answer arrives.
        job = s.llm._requests.inflight
        assert job is not None and job.start <= 4 < job.cut
        old = s.history[4]
        assert isinstance(old, UserMessage)
        text = text_of(old.content)
        edited = dataclasses.replace(old, content=(TextBlock(text[:-5] + "zzzzz"),))
        # The loop prepares its next call (the fake server answers nothing meanwhile).
        s.history = await s.manager.prepare([*s.history[:4], edited, *s.history[5:], *turn(i)])
        assert s.llm.phase == "in_flight"
        gate.set()
        await s.answered()
        for j in range(i + 1, i + 25):
            await s.turn(turn(j))
            await s.answered()
    assert s.of(HistoryResynced)
    stale = [e for e in s.of(SummaryStale) if e.reason != "unused"]
    # (later ones may be superseded: OpenAI's compactions keep every user message, so on
    # this small budget they end up saving too little to splice)
    assert stale[0].reason == "history_changed"
    assert {e.reason for e in stale[1:]} <= ({"superseded"} if provider == "openai" else set())
    assert stale[0].summary is not None and stale[0].summary.usage.output_tokens > 0
    assert stale[0].summary.cost_usd is not None and stale[0].summary.messages_summarized == 0
    assert not any("FIRST" in map(summary_of, compaction_blocks(v)) for v in s.views)
    spend = s.llm.spend
    assert spend.requests == len(compaction_requests(s)) >= 2


# ---------------------------------------------------------------------------------------
# Rejected: a provider error, an empty compaction


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_provider_error_is_rejected_and_the_tiers_hold_the_budget(
    provider: Provider,
) -> None:
    error = Reply.error(400, message="The compaction could not be produced.")
    async with session(provider, first_compaction(error, answering(["LATER"]))) as s:
        for i in range(30):
            await s.turn(turn(i))
            await s.answered()
            if s.of(SummaryRejected):
                break
        for j in range(i + 1, i + 4):
            await s.turn(turn(j))
    rejected = s.of(SummaryRejected)[0]
    assert rejected.reason == "failed" and "could not be produced" in rejected.detail
    assert "HTTP 400" in rejected.detail and rejected.attempts == 1
    assert rejected.summary is None  # an error is not billed
    assert not s.of(BudgetExceeded)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_an_empty_compaction_is_rejected_with_its_cost(provider: Provider) -> None:
    async with session(provider, answering([""])) as s:
        for i in range(30):
            await s.turn(turn(i))
            await s.answered()
            if s.of(SummaryRejected):
                break
    rejected = s.of(SummaryRejected)[0]
    assert rejected.reason == "empty" and rejected.attempts == 1
    assert rejected.summary is not None and rejected.summary.usage.prompt_tokens > 0
    assert rejected.summary.cost_usd is not None and rejected.summary.cost_usd > 0
    assert not s.spliced() and not any(compaction_blocks(v) for v in s.views)
    assert s.llm.spend.requests >= 1


# ---------------------------------------------------------------------------------------
# The pieces


def test_native_results_are_checked_at_the_edge() -> None:
    block = OpaqueBlock("anthropic", {"type": "compaction", "content": "s", "signature": "x"})
    native = AssistantMessage((block,))
    ok = SummaryResult(text="", stop_reason="stop", messages=(native,))
    assert check_result(ok) is ok and check_briefing(ok, ("Goal",)) is None
    assert check_briefing(dataclasses.replace(ok, stop_reason="length"), ()) is not None
    call = AssistantMessage((block, ToolCall("c", "bash", {})))
    for bad in ([native], (ToolResultMessage.of("c", "r"),), (call,), ("text",)):
        with pytest.raises(SummarizerError, match="the summarizer returned"):
            check_result(SummaryResult(text="", stop_reason="stop", messages=bad))  # type: ignore[arg-type]
    assert is_native_compaction(native) and is_paid_summary(native)
    assert not is_native_compaction(AssistantMessage.of("compaction"))


async def test_a_request_without_a_conversation_fails_cleanly() -> None:
    request = SummaryRequest(system="s", prompt="p", max_tokens=300)
    ant = AnthropicCompactionSummarizer(ANTHROPIC_MODEL, api_key="k", base_url="http://h:1")
    oai = OpenAICompactionSummarizer(OPENAI_MODEL, api_key="k", base_url="http://h:1/v1")
    for summarizer in (ant, oai):
        with pytest.raises(SummarizerError, match="nothing to compact"):
            await summarizer.summarize(request)
        await summarizer.aclose()


def test_the_adapters_carry_recorded_compaction_blocks_and_items_untouched() -> None:
    anthropic_reply = json.loads(
        corpus_file("anthropic-api", "vercel-anthropic-compaction.1.json").read_text()
    )
    message = message_from_anthropic_response(anthropic_reply)
    assert is_native_compaction(message)
    assert to_anthropic([message])[0]["content"] == anthropic_reply["content"]
    params = [{"role": "user", "content": "go on"}, *to_anthropic([message])]
    assert to_anthropic(from_anthropic(params)) == params
    openai_reply = json.loads(
        corpus_file("openai-api", "vercel-responses-compaction.1.json").read_text()
    )
    message = message_from_openai_response(openai_reply)
    assert is_native_compaction(message)
    assert to_openai_responses([message]) == openai_reply["output"]
    assert (
        to_openai_responses(from_openai_responses(openai_reply["output"])) == openai_reply["output"]
    )


# ---------------------------------------------------------------------------------------
# The fake servers' compaction endpoints, validated like the real APIs


async def test_the_fake_anthropic_compaction_is_validated_like_the_api() -> None:
    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    async with (
        FakeAnthropic(default=Reply.text("A summary.")) as server,
        anthropic.AsyncAnthropic(base_url=server.url, api_key="test", max_retries=0) as client,
    ):
        base: dict[str, Any] = {"model": "m", "max_tokens": 100, "messages": messages}
        bad: list[tuple[dict[str, Any], list[str], str]] = [
            ({"compaction": {"type": "summarize"}}, [], "Extra inputs are not permitted"),
            ({"compaction": {"type": "auto"}}, [COMPACTION_BETA], "Input should be 'summarize'"),
            (
                {
                    "compaction": {"type": "summarize"},
                    "context_management": {"edits": []},
                },
                [COMPACTION_BETA],
                "cannot be combined with `context_management`",
            ),
            (
                {"compaction": {"type": "summarize"}, "stop_sequences": ["END"]},
                [COMPACTION_BETA],
                "stop_sequences",
            ),
        ]
        for extra, betas, wording in bad:
            with pytest.raises(anthropic.BadRequestError, match=wording):
                await client.beta.messages.create(**base, **extra, betas=betas)
        compacted = await client.beta.messages.create(
            **base, compaction={"type": "summarize"}, betas=[COMPACTION_BETA]
        )
        assert compacted.stop_reason == "compaction"
        block = compacted.content[0].to_dict()
        assert block["type"] == "compaction" and block["content"] == "A summary."
        assert compacted.usage.iterations and compacted.usage.iterations[0].type == "compaction"
        # Sent back untouched it is accepted, also first (it stands for what came before).
        later = [{"role": "assistant", "content": [block]}, {"role": "user", "content": "next"}]
        await client.messages.create(model="m", max_tokens=10, messages=later)
        tampered = {**block, "content": "Another summary."}
        with pytest.raises(anthropic.BadRequestError, match="Invalid `signature`"):
            await client.messages.create(
                model="m",
                max_tokens=10,
                messages=[{"role": "assistant", "content": [tampered]}, later[1]],
            )
        # A failed compaction (no content) is answered, and is a no-op when sent back.
        server.enqueue(Reply.empty())
        failed = await client.beta.messages.create(
            **base, compaction={"type": "summarize"}, betas=[COMPACTION_BETA]
        )
        assert failed.content[0].to_dict() == {"type": "compaction", "content": None}


async def test_the_fake_openai_compact_endpoint_is_validated_like_the_api() -> None:
    history = [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ]
    async with (
        FakeOpenAI(default=Reply.text("A summary.")) as server,
        openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="test", max_retries=0) as client,
    ):
        with pytest.raises(openai.BadRequestError, match="Unknown parameter: 'store'"):
            await client.responses.compact(model="m", input=history, extra_body={"store": False})
        with pytest.raises(openai.BadRequestError, match="input"):
            await client.responses.compact(model="m")
        compacted = await client.responses.compact(model="m", input=history)  # type: ignore[arg-type]
        assert compacted.object == "response.compaction"
        # (the SDK types the user messages as output messages: read them, do not dump them)
        assert [i.type for i in compacted.output] == ["message", "message", "compaction"]
        texts = [i.content[0].text for i in compacted.output[:2]]  # type: ignore[union-attr]
        assert texts == ["What is 2+2?", "And 3+3?"]
        assert compacted.usage.input_tokens > 0
        # As pydantic-ai's recording does: the compaction item, then the next message.
        item = compacted.output[-1].to_dict()
        await client.responses.create(
            model="m",
            input=[item, {"role": "user", "content": "And 5+5?"}],  # type: ignore[list-item]
        )
        tampered = {**item, "encrypted_content": item["encrypted_content"][:-3] + "AAA"}
        with pytest.raises(openai.BadRequestError, match="could not be verified"):
            await client.responses.create(model="m", input=[tampered])  # type: ignore[list-item]


async def test_an_unreadable_compaction_is_billed_what_its_iterations_report() -> None:
    """Found by a hostile run (AJ, finding 2): a compaction reply that could not be read
    was billed what its top-level usage says, while Anthropic may report a compaction's own
    cost only in ``usage.iterations``, which a readable reply sums: here 0 against 5,400."""
    conversation = (UserMessage.of("task: fix the parser"), UserMessage.of("go on"))
    request = SummaryRequest(
        system="s", prompt="p", max_tokens=300, conversation=conversation, messages=1
    )
    body = {
        "id": "m", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
        "content": None, "stop_reason": "compaction", "stop_sequence": None,
        "usage": {
            "input_tokens": 0,
            "output_tokens": 0,
            "iterations": [{"type": "compaction", "input_tokens": 5000, "output_tokens": 400}],
        },
    }  # fmt: skip
    async with FakeAnthropic([Reply.malformed(json.dumps(body).encode())]) as server:
        summarizer = AnthropicCompactionSummarizer(
            "claude-sonnet-4-5", api_key="k", base_url=server.url
        )
        try:
            with pytest.raises(SummarizerError, match="unreadable") as info:
                await summarizer.summarize(request)
        finally:
            await summarizer.aclose()
    assert info.value.usage == Usage(5000, 400)


@pytest.mark.parametrize(
    "ending", ["done\n", "done  \n\n", "\n"], ids=["newline", "blanks", "blank"]
)
async def test_a_span_ending_on_the_assistants_text_is_compacted_as_the_api_takes_it(
    ending: str,
) -> None:
    """Found by a hostile run (AN, finding 2): the conversation a compaction covers ends on
    the assistant's turn, and an answer ending in a newline went as it was: the API refuses
    a final assistant message with trailing whitespace (400), so every native request of
    such a loop failed. Its trailing whitespace is left out of the request."""
    conversation = (UserMessage.of("task: fix the parser"), AssistantMessage.of(ending))
    request = SummaryRequest(
        system="s", prompt="p", max_tokens=300, conversation=conversation, messages=2
    )
    async with FakeAnthropic(default=Reply.text("A summary.")) as server:
        summarizer = AnthropicCompactionSummarizer(
            "claude-sonnet-4-5", api_key="k", base_url=server.url
        )
        try:
            result = await summarizer.summarize(request)
        finally:
            await summarizer.aclose()
    assert result.messages and server.requests[0].status == 200
    sent = json.loads(server.requests[0].body)["messages"]
    assert (
        sent[-1]["role"] == "user"
        if not ending.strip()
        else sent[-1]["content"][-1]["text"] == "done"
    )


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
async def test_a_native_request_refused_as_too_large_is_not_sent_again_unchanged(
    provider: str,
) -> None:
    """Found by a hostile run (AN, finding 3): a native compaction refused as too large was
    sent again "with half the transcript", which a native request does not carry: the same
    request four times, and later ones refused before sending ("down to 368 characters").
    It fails once; the next request is its own."""
    too_long = (
        Reply.error(400, "prompt is too long: 4842 tokens > 2000 maximum")
        if provider == "anthropic"
        else Reply.error(400, "Your input exceeds the context window of this model.")
    )
    summarizer_fails_once: Any
    server: FakeServer = (
        FakeAnthropic([too_long]) if provider == "anthropic" else FakeOpenAI([too_long])
    )
    async with server:
        if provider == "anthropic":
            summarizer_fails_once = AnthropicCompactionSummarizer(
                "claude-sonnet-4-5", api_key="k", base_url=server.url
            )
        else:
            summarizer_fails_once = OpenAICompactionSummarizer(
                "gpt-5.4", api_key="k", base_url=server.url + "/v1"
            )
        llm = LlmCompaction(summarizer_fails_once, LlmCompactionConfig(trigger_ratio=0.3))
        events: list[Event] = []
        try:
            async with ContextManager(
                Budget(context_window=4_000, reserve_output=500),
                strategy=Chain([llm, DeterministicCompaction()]),
                on_over_budget="send",
            ) as ctx:
                ctx.subscribe(events.append)
                history: list[Message] = [UserMessage.of("task: fix the parser")]
                for i in range(40):
                    history += [
                        UserMessage.of(f"step {i}: " + "words " * 40),
                        AssistantMessage.of("ok"),
                    ]
                    history = await ctx.prepare(history)
                    await anyio.sleep(0.01)
        finally:
            await summarizer_fails_once.aclose()
    first, then = server.requests[0], server.requests[1]
    assert first.status == 400 and then.body != first.body  # not sent again as it was
    rejected = [e for e in events if isinstance(e, SummaryRejected)]
    assert rejected and rejected[0].attempts == 1
    assert not [e for e in rejected if e.detail.startswith("not sent")]  # later ones were sent


async def test_a_blank_last_turn_leaves_the_one_before_it_closed_too() -> None:
    """Found by a hostile run (AO): dropping a blank last turn left the assistant turn before
    it last, with its trailing whitespace (400); a conversation left with nothing went out
    as ``messages: []``. The turn before is closed as well, and nothing left to compact is
    refused before a request is made."""
    conversation = (UserMessage.of("task"), AssistantMessage.of("done\n"), AssistantMessage.of(" "))
    blank = (AssistantMessage.of("  \n"),)
    async with FakeAnthropic(default=Reply.text("A summary.")) as server:
        summarizer = AnthropicCompactionSummarizer(
            "claude-sonnet-4-5", api_key="k", base_url=server.url
        )
        try:
            result = await summarizer.summarize(
                SummaryRequest(system="s", prompt="p", max_tokens=300, conversation=conversation)
            )
            with pytest.raises(SummarizerError, match="nothing to compact") as info:
                await summarizer.summarize(
                    SummaryRequest(system="s", prompt="p", max_tokens=300, conversation=blank)
                )
        finally:
            await summarizer.aclose()
    assert result.messages and len(server.requests) == 1 and not info.value.retryable
    sent = json.loads(server.requests[0].body)["messages"]
    assert sent[-1] == {"role": "assistant", "content": [{"type": "text", "text": "done"}]}


# ---------------------------------------------------------------------------------------
# Thinking blocks: a compaction request runs with thinking disabled


def thought(text: str) -> ThinkingBlock:
    return ThinkingBlock(text, sign(text))


THINKING_ENDINGS: dict[str, tuple[Message, ...]] = {
    "answer": (
        UserMessage.of("task: fix the parser"),
        AssistantMessage((thought("let me think"), TextBlock("done")), "end_turn"),
    ),
    "tool results": (
        UserMessage.of("task: fix the parser"),
        AssistantMessage(
            (thought("need grep"), ToolCall("toolu_1", "bash", {"command": "ls"})), "tool_use"
        ),
        ToolResultMessage.of("toolu_1", "a.py b.py", tool_name="bash"),
    ),
    "blank answer": (  # the blank text is left out: the turn before it is then the last
        UserMessage.of("task: fix the parser"),
        AssistantMessage.of("on it"),
        AssistantMessage((thought("hmm"), TextBlock(" \n")), "end_turn"),
    ),
    "redacted answer": (
        UserMessage.of("task: fix the parser"),
        AssistantMessage((RedactedThinkingBlock("ZW5jcnlwdGVk"), TextBlock("done")), "end_turn"),
    ),
    "user message": (  # a turn of thinking alone, left out whole, inside the conversation
        UserMessage.of("task: fix the parser"),
        AssistantMessage((thought("only thinking"),), "max_tokens"),
        UserMessage.of("go on"),
    ),
    "thinking alone": (
        UserMessage.of("task: fix the parser"),
        AssistantMessage((TextBlock("done"),), "end_turn"),
        AssistantMessage((thought("only thinking"),), "max_tokens"),
    ),
    # Found by the re-run (DA 1): an answer cut off after a later thinking block lost its
    # text from the request (the adapter leaves out such a final turn whole), and so from
    # the history once the block replaced the span.
    "cut-off answer": (
        UserMessage.of("task: which port?"),
        AssistantMessage((thought("look"), TextBlock("port 8443"), thought("and")), "max_tokens"),
    ),
}


@pytest.mark.parametrize("ending", list(THINKING_ENDINGS))
async def test_a_compaction_request_sends_no_thinking_blocks(ending: str) -> None:
    """Found by a hostile run (CX, finding 1): the conversation's thinking blocks were sent
    in the compaction request, which has thinking disabled, and the API refuses a final
    assistant turn holding thinking ("When thinking is disabled, an `assistant` message in
    the final position cannot contain `thinking`"; "The final block in an assistant message
    cannot be `thinking`"). They are left out whole, and a turn left empty with them."""
    conversation = THINKING_ENDINGS[ending]
    request = SummaryRequest(
        system="s", prompt="p", max_tokens=300, conversation=conversation, messages=1
    )
    async with FakeAnthropic(default=Reply.text("A summary.")) as server:
        summarizer = AnthropicCompactionSummarizer(
            ANTHROPIC_MODEL, api_key="k", base_url=server.url
        )
        try:
            result = await summarizer.summarize(request)
        finally:
            await summarizer.aclose()
    assert result.messages
    sent = server.requests[0]
    assert sent.status == 200 and "thinking" not in sent.json
    messages = sent.json["messages"]
    assert not [b for b in _blocks(messages) if b["type"] in ("thinking", "redacted_thinking")]
    assert all(m["content"] for m in messages)  # no turn left empty
    # Everything else went as it was (but a blank text closing the conversation).
    # (Rendered with a message after it, the conversation's last turn is no final one to
    # leave out.)
    as_it_was = to_anthropic([*conversation, UserMessage.of("(end)")])[:-1]
    assert _substance(_blocks(messages)) == _substance(_blocks(as_it_was))
    last = messages[-1]
    if last["role"] == "assistant":
        assert last["content"][-1]["type"] == "text"
        assert last["content"][-1]["text"] == last["content"][-1]["text"].rstrip()


def _blocks(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [b for m in messages if isinstance(m["content"], list) for b in m["content"]]


def _substance(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The blocks but thinking and blank text."""
    thinking = ("thinking", "redacted_thinking")
    return [b for b in blocks if b["type"] not in thinking and b.get("text", "-").strip()]


async def test_a_thinking_loop_is_compacted_without_its_thinking() -> None:
    """The same through `LlmCompaction`: each step of the loop's turns carries a signed
    thinking block (interleaved thinking), and no compaction request sends one."""

    def thinking_turn(i: int) -> list[Message]:
        """The answer to the last question, a question, and three steps: each model call
        of the loop ends on a tool's result, as a loop sends it."""
        out: list[Message] = []
        if i:
            answer = (thought(f"end {i - 1}"), TextBlock(f"a{i - 1}: {prose(i + 1, 20)}"))
            out.append(AssistantMessage(answer, "end_turn"))
        out.append(UserMessage.of(f"q{i}: {prose(i, 20)}"))
        for k in range(3):
            call = ToolCall(f"toolu_{i}_{k}", "bash", {"command": f"cat f{i}{k}"})
            out += [
                AssistantMessage((thought(f"step {i}.{k}"), call), "tool_use"),
                ToolResultMessage.of(call.id, prose(i + k, 40), tool_name="bash"),
            ]
        return out

    async with session("anthropic", answering(["FIRST", "LATER"])) as s:
        i = 0
        while len(s.spliced()) < 2:
            await s.turn(thinking_turn(i))
            await s.answered()
            i += 1
            assert i < 60, [type(e).__name__ for e in s.events]
    requests = compaction_requests(s)
    assert len(requests) >= 2 and all(r.status == 200 for r in requests)
    for r in requests:
        contents = [m["content"] for m in r.json["messages"] if isinstance(m["content"], list)]
        types = {b["type"] for content in contents for b in content}
        assert "tool_use" in types and not types & {"thinking", "redacted_thinking"}
    assert not s.of(SummaryRejected)


# ---------------------------------------------------------------------------------------
# An OpenAI compaction item without encrypted content: a failed compaction


def compacted_without_content(encrypted: str | None) -> bytes:
    """A ``/v1/responses/compact`` answer whose compaction item carries ``encrypted``."""
    return json.dumps(
        {
            "id": "resp_1", "object": "response.compaction", "created_at": 0,
            "output": [
                {
                    "id": "msg_1", "type": "message", "status": "completed", "role": "user",
                    "content": [{"type": "input_text", "text": "task"}],
                },
                {"id": "cmp_1", "type": "compaction", "encrypted_content": encrypted},
            ],
            "usage": {
                "input_tokens": 900, "output_tokens": 40, "total_tokens": 940,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
        }
    ).encode()  # fmt: skip


@pytest.mark.parametrize("encrypted", ["", None], ids=["blank", "null"])
async def test_an_openai_compaction_item_without_content_is_rejected_with_its_cost(
    encrypted: str | None,
) -> None:
    """Found by a hostile run (CX, finding 2): a compaction item whose ``encrypted_content``
    is "" or null was spliced as a briefing and sent back on every later request (an item no
    server can read). It is a failed compaction, as Anthropic's block without content: an
    ``empty`` briefing, rejected with what it was billed."""

    def answer(body: dict[str, Any]) -> Reply:
        if is_compaction_request(body):
            return Reply.malformed(compacted_without_content(encrypted))
        return Reply.text("ok")

    async with session("openai", answer) as s:
        i = 0
        while not s.of(SummaryRejected):
            await s.turn(turn(i))
            await s.answered()
            i += 1
            assert i < 30, [type(e).__name__ for e in s.events]
        for j in range(i, i + 3):
            await s.turn(turn(j))
            await s.answered()
    rejected = s.of(SummaryRejected)[0]
    assert rejected.reason == "empty" and rejected.attempts == 1
    assert rejected.summary is not None and rejected.summary.usage == Usage(900, 40)
    assert rejected.summary.cost_usd is not None and rejected.summary.cost_usd > 0
    assert not s.spliced() and s.llm.spend.requests >= 1
    calls = [r for r in s.server.requests if r.path == "/v1/responses"]
    assert calls and all(r.status == 200 for r in calls)
    sent = [item for r in calls for item in r.json["input"]]
    assert not [item for item in sent if item.get("type") == "compaction"]
