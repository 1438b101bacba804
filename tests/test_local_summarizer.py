"""A local or self-hosted summarizer that works the first time (issue 13, item 1).

The end-to-end test runs SmolLM2-135M behind llama.cpp's OpenAI-compatible server
(tests/local_llm_server.py) with its real 2,048-token window, reached through the real
`openai` SDK with no API key, and configured with nothing but
``LlmCompactionConfig.small_model(context_window=2048)``: no hand-tuned caps. Sampling is
deterministic (temperature 0, a fixed seed). It waits on the strategy's state and on events
with a generous ceiling, never on wall time, so a loaded machine only makes it slower.

The other tests need no model: the placeholder key, the sizing arithmetic, which server
answers count as "too large", and the halving after one, against the fake OpenAI server.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.lowlevel
import openai
import pytest

from agentctx import (
    AssistantMessage,
    Budget,
    Chain,
    ContextManager,
    DeterministicCompaction,
    Message,
    TextBlock,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from agentctx.errors import ConfigError, SummarizerError
from agentctx.events import (
    CompactionWarning,
    ContextCompacted,
    Event,
    SummaryRejected,
    SummaryStale,
)
from agentctx.importers import load_transcript
from agentctx.providers.openai_summarizer import (
    LOCAL_API_KEY,
    OpenAIChatSummarizer,
    OpenAIResponsesSummarizer,
)
from agentctx.strategies.llm import LlmCompaction, LlmCompactionConfig
from agentctx.strategies.llm_config import MIN_SUMMARIZER_WINDOW, SMALL_MODEL_INSTRUCTION
from agentctx.strategies.llm_sizing import (
    TEMPLATE_TOKENS,
    TOKENIZER_SLACK,
    fit_request,
    too_large,
)
from agentctx.summarizer import Summarizer, SummaryRequest, SummaryResult
from agentctx.testing import assert_view_ok
from agentctx.testing.servers import FakeOpenAI, Reply
from agentctx.tokens import Estimator

from .corpus import corpus_file

SERVER = Path(__file__).with_name("local_llm_server.py")
WINDOW = 2048  # SmolLM2's n_ctx in tests/local_llm_server.py
CEILING = 1800.0  # seconds: a 2-core machine under load reads ~20 prompt tokens a second


# ---------------------------------------------------------------------------------------
# The real model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def llm_url() -> Iterator[str]:
    """llama.cpp serving SmolLM2 on 127.0.0.1, as tests/test_real_model.py starts it."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("local model server did not start")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


class Recording:
    """Passes requests on to ``inner`` and keeps each request and result."""

    def __init__(self, inner: OpenAIChatSummarizer) -> None:
        self.inner = inner
        self.model = inner.model
        self.requests: list[SummaryRequest] = []
        self.results: list[SummaryResult] = []

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.requests.append(request)
        result = await self.inner.summarize(request)
        self.results.append(result)
        return result


def turns(messages: list[Message]) -> list[list[Message]]:
    """Groups appended between model calls: everything up to each assistant message."""
    cuts = [i for i, m in enumerate(messages) if isinstance(m, AssistantMessage) and i > 0]
    out, start = [], 0
    for cut in cuts:
        out.append(messages[start:cut])
        start = cut
    return [g for g in out if g]


async def wait_for(done: object, what: str) -> None:
    """Until ``done()`` holds, checked twice a second; fails after `CEILING` seconds."""
    with anyio.move_on_after(CEILING):
        while not done():  # type: ignore[operator]  # noqa: ASYNC110 - state, no event
            await anyio.sleep(0.5)
        return
    pytest.fail(f"still waiting after {CEILING:g} s for {what}")


async def test_a_small_local_model_splices_with_only_its_window_configured(
    llm_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    # As the README says: a model name and the server; no key, no caps.
    sdk = OpenAIChatSummarizer(
        "smollm2", base_url=llm_url + "/v1", request_options={"temperature": 0, "seed": 42}
    )
    summarizer = Recording(sdk)
    assert isinstance(summarizer, Summarizer)
    llm = LlmCompaction(summarizer, LlmCompactionConfig.small_model(context_window=WINDOW))
    events: list[Event] = []
    messages = list(load_transcript(corpus_file("pi", "large-session.jsonl")).messages)
    groups = iter(turns(messages))
    async with (
        sdk,
        ContextManager(
            Budget(context_window=14_000, reserve_output=2_000),
            strategy=Chain([llm, DeterministicCompaction()]),
            on_over_budget="send",
        ) as ctx,
    ):
        ctx.subscribe(events.append)
        history: list[Message] = []

        async def turn() -> None:
            nonlocal history
            group = next(groups, None)
            if group is None:
                pytest.fail(f"the session ended first: {[type(e).__name__ for e in events]}")
            view = await ctx.prepare([*history, *group])
            assert_view_ok(view, ctx.raw)
            history = view

        def spliced() -> bool:
            return any(isinstance(e, ContextCompacted) and e.method == "summarized" for e in events)

        while not spliced():
            while llm.phase == "idle" and not spliced():  # up to the trigger: a request
                await turn()
            await wait_for(lambda: llm.phase != "in_flight", "the briefing")
            if llm.phase == "ready":
                while not spliced():  # on to the limit, where it is spliced
                    await turn()
            # Otherwise rejected: on some spans a model this small runs out of output before
            # it stops; the next request goes out once the view has grown a little.
            assert len(summarizer.results) <= 3, [type(e).__name__ for e in events]

    # The model's answer, for the record (pytest -s shows it).
    result = summarizer.results[0]
    print(f"\nSmolLM2 ({result.stop_reason}, {result.usage}):\n{result.text}")

    rejected = [e for e in events if isinstance(e, SummaryRejected)]
    assert all(e.reason == "stop_reason" and "'length'" in e.detail for e in rejected)
    # Only a briefing its update replaced while it waited, or one that came back after the
    # splice, goes unspliced.
    assert all(e.reason in ("updated", "unused") for e in events if isinstance(e, SummaryStale))
    assert not [e for e in events if isinstance(e, CompactionWarning)]
    assert summarizer.results
    for request, answer in zip(summarizer.requests, summarizer.results, strict=False):
        assert request.max_tokens == WINDOW // 4
        assert request.attempt == 1  # it worked the first time
        # The request fit the window by the model's own count, its whole answer included.
        assert answer.usage.prompt_tokens + request.max_tokens <= WINDOW
        assert answer.text.strip()
    stats = next(
        e.summary for e in events if isinstance(e, ContextCompacted) and e.method == "summarized"
    )
    assert stats is not None and stats.cost_usd is None
    answer = next(a for a in summarizer.results if a.usage == stats.usage)
    assert answer.stop_reason == "stop"  # the briefing spliced ended as it should


# ---------------------------------------------------------------------------------------
# No key needed for a local server


def test_a_local_server_needs_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    for make in (OpenAIChatSummarizer, OpenAIResponsesSummarizer):
        local = make("llama3", base_url="http://127.0.0.1:8080/v1")
        assert local.client.api_key == LOCAL_API_KEY
        given = make("llama3", base_url="http://127.0.0.1:8080/v1", api_key="sk-mine")
        assert given.client.api_key == "sk-mine"
    # Never for OpenAI itself: there a missing key is the SDK's error, as it should be.
    with pytest.raises(openai.OpenAIError, match="api_key"):
        OpenAIChatSummarizer("gpt-5-mini")
    with pytest.raises(openai.OpenAIError, match="api_key"):
        OpenAIChatSummarizer("gpt-5-mini", base_url="https://api.openai.com/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    assert OpenAIChatSummarizer("llama3", base_url="http://h:1/v1").client.api_key == "sk-env"


async def test_the_placeholder_key_reaches_a_server_that_wants_a_bearer() -> None:
    async with FakeOpenAI([Reply.text("A short summary.")]) as server:
        summarizer = OpenAIChatSummarizer("local", base_url=server.url + "/v1")
        result = await summarizer.summarize(SummaryRequest(system="s", prompt="p", max_tokens=300))
        await summarizer.aclose()
    assert result.text == "A short summary."
    assert server.requests[0].headers["authorization"] == f"Bearer {LOCAL_API_KEY}"


# ---------------------------------------------------------------------------------------
# Sizing


def session(n: int, words: int = 80) -> list[Message]:
    out: list[Message] = []
    for i in range(n):
        out.append(UserMessage.of(f"step {i}: " + " ".join(f"word{i}x{k}" for k in range(words))))
        out.append(AssistantMessage.of(f"done {i}: " + "ok " * words))
    return out


@pytest.mark.parametrize("window", [MIN_SUMMARIZER_WINDOW, 2048, 8192, 32_768])
@pytest.mark.parametrize("previous", [None, "An earlier summary. " * 60])
def test_a_sized_request_fits_the_window_with_its_answer(window: int, previous: str | None) -> None:
    config = LlmCompactionConfig.small_model(context_window=window)
    fit = fit_request(session(400), previous, config, window=window)
    assert not isinstance(fit, str)
    estimate = Estimator()
    prompt = estimate.count(config.system_prompt) + estimate.count(fit.prompt)
    assert prompt * TOKENIZER_SLACK + TEMPLATE_TOKENS + fit.max_tokens <= window
    assert fit.max_tokens == min(512, window // 4)
    assert fit.transcript  # the newest messages, not nothing
    assert "done 399" in fit.transcript
    assert fit.prompt.endswith(config.update_instruction if previous else SMALL_MODEL_INSTRUCTION)


def test_without_a_window_the_caps_apply_as_given() -> None:
    config = LlmCompactionConfig()
    fit = fit_request(session(400), None, config, window=None)
    assert not isinstance(fit, str) and fit.max_tokens == 2000
    assert len(fit.transcript) > 50_000  # the default 480k-character cap does not bind here
    capped = fit_request(session(400), None, config, window=None, max_chars=5_000)
    assert not isinstance(capped, str) and len(capped.transcript) <= 5_000


def test_a_request_that_cannot_fit_says_why() -> None:
    config = LlmCompactionConfig.small_model(context_window=1024, instruction="Summarize. " * 300)
    why = fit_request(session(3), None, config, window=1024)
    assert isinstance(why, str) and "1024" in why
    ok = fit_request(session(3), None, LlmCompactionConfig(), window=None, max_chars=99)
    assert isinstance(ok, str) and "198 characters" in ok


def test_the_window_setting_is_checked() -> None:
    for bad in (0, 100, MIN_SUMMARIZER_WINDOW - 1, True, 2048.0):
        with pytest.raises(ConfigError, match="summarizer_context_window"):
            LlmCompactionConfig(summarizer_context_window=bad)  # type: ignore[arg-type]
    preset = LlmCompactionConfig.small_model(context_window=4096, timeout=30.0)
    assert preset.summarizer_context_window == 4096 and preset.timeout == 30.0
    assert preset.required_sections == () and preset.instruction == SMALL_MODEL_INSTRUCTION


@pytest.mark.parametrize(
    ("status", "message", "expected"),
    [
        # llama.cpp (the real server's answer, see the end-to-end test's server)
        (400, "request (3031 tokens) exceeds the available context size (2048 tokens)", True),
        # OpenAI Chat Completions, vLLM
        (400, "This model's maximum context length is 8192 tokens. However, your ...", True),
        # OpenAI Responses
        (400, "Your input exceeds the context window of this model.", True),
        # Anthropic
        (400, "prompt is too long: 210000 tokens > 200000 maximum", True),
        (413, "Request exceeds the maximum allowed number of bytes.", True),
        # not about the size of the prompt
        (400, "max_tokens is too large: 100000. This model supports at most 4096", False),
        (400, "model: Field required", False),
        (429, "Number of request tokens has exceeded your per-minute rate limit", False),
        (None, "connection failed: exceeds", False),
    ],
)
def test_which_answers_mean_too_large(status: int | None, message: str, expected: bool) -> None:
    error = SummarizerError(f"openai: HTTP {status}: {message}", retryable=False, status=status)
    assert too_large(error) is expected


async def test_a_request_refused_as_too_large_is_halved_and_warned_about_once() -> None:
    """The user's report: defaults, a server with a small window. Before: the same 400 on
    every trigger. Now: the next request carries half the transcript, then fits."""

    def answer(body: dict[str, object]) -> Reply:
        return Reply.text("A short summary.")

    events: list[Event] = []
    async with FakeOpenAI(default=answer, context_window=3_000) as server:
        sdk = OpenAIChatSummarizer("local", base_url=server.url + "/v1")
        recording = Recording(sdk)
        config = LlmCompactionConfig(required_sections=(), timeout=10.0)
        llm = LlmCompaction(recording, config)
        async with ContextManager(
            Budget(context_window=13_000, reserve_output=1_000),
            strategy=Chain([llm, DeterministicCompaction()]),
        ) as ctx:
            ctx.subscribe(events.append)
            history: list[Message] = []
            for messages in [session(200)[k : k + 2] for k in range(0, 400, 2)]:
                history = [*(await ctx.prepare([*history, *messages]))]
                await wait_for(lambda: llm.phase != "in_flight", "an answer")
                if any(
                    isinstance(e, ContextCompacted) and e.method == "summarized" for e in events
                ):
                    break
        await sdk.aclose()
    statuses = [r.status for r in server.requests]
    refused = statuses.index(200)
    assert refused >= 1 and set(statuses[:refused]) == {400}, statuses
    assert "maximum context length" in str(server.requests[0].error)
    sizes = [len(r.transcript) for r in recording.requests[: refused + 1]]
    assert all(b <= a // 2 for a, b in zip(sizes, sizes[1:], strict=False)), sizes
    assert all(r.attempt == k + 1 for k, r in enumerate(recording.requests[: refused + 1]))
    later = recording.requests[refused + 1 :]
    assert all(len(r.transcript) <= sizes[-2] // 2 for r in later)  # the smaller size stays
    warnings = [e for e in events if isinstance(e, CompactionWarning)]
    assert [w.code for w in warnings] == ["summarizer_window"]
    assert "summarizer_context_window" in warnings[0].message
    assert not [e for e in events if isinstance(e, SummaryRejected)]
    assert any(isinstance(e, ContextCompacted) and e.method == "summarized" for e in events)


async def test_a_request_refused_as_too_large_is_not_sent_again_unchanged() -> None:
    """Found by a hostile run: the transcript keeps its newest message whole, so once that
    alone was over the halved cap, each refusal "halved" the cap to the same value and the
    request just refused was sent again at once, three times a summary, on every summary."""

    def refuse(body: dict[str, object]) -> Reply:
        return Reply.error(413, "Request exceeds the maximum allowed number of bytes")

    async with FakeOpenAI(default=refuse) as server:
        sdk = OpenAIChatSummarizer("local", base_url=server.url + "/v1")
        recording = Recording(sdk)
        llm = LlmCompaction(recording, LlmCompactionConfig(required_sections=(), timeout=10.0))
        async with ContextManager(
            Budget(context_window=13_000, reserve_output=1_000),
            strategy=Chain([llm, DeterministicCompaction()]),
        ) as ctx:
            history: list[Message] = []
            for k in range(120):
                big = "\n".join(f"line {i} of output {k}" for i in range(120))
                turn = [
                    AssistantMessage(
                        (ToolCall(f"c{k}", "read", {"path": f"f{k}.py"}),), "tool_use"
                    ),
                    ToolResultMessage(f"c{k}", (TextBlock(big),), "read", False),
                ]
                history = [*(await ctx.prepare([*(history or [UserMessage.of("task")]), *turn]))]
                await wait_for(lambda: llm.phase != "in_flight", "an answer")
        await sdk.aclose()
    requests = recording.requests
    assert requests and all(r.status == 413 for r in server.requests)
    for earlier, later in zip(requests, requests[1:], strict=False):
        if later.attempt > 1:  # sent again within one summary: only ever smaller
            assert len(later.transcript) < len(earlier.transcript)
    assert len(requests) <= 12  # the cap halves with each refusal, then no request is sent


async def test_a_too_large_refusal_marked_retryable_is_not_sent_again_unchanged() -> None:
    """Found by a hostile run of the fix above: a summarizer of one's own may call a 413
    retryable; a request that would be no smaller then went the usual retry way and was
    sent again as it was, cap or no cap."""

    class TooLarge:
        model = "m"

        def __init__(self) -> None:
            self.sizes: list[int] = []

        async def summarize(self, request: SummaryRequest) -> SummaryResult:
            self.sizes.append(len(request.transcript))
            raise SummarizerError("HTTP 413: request too large", retryable=True, status=413)

    async def no_wait(seconds: float) -> None:
        await anyio.lowlevel.checkpoint()

    summarizer = TooLarge()
    llm = LlmCompaction(summarizer, LlmCompactionConfig(timeout=5), sleep=no_wait)
    async with ContextManager(
        Budget(context_window=60_000, reserve_output=1_000),
        strategy=Chain([llm, DeterministicCompaction()]),
    ) as ctx:
        history: list[Message] = [UserMessage.of("task")]
        for i in range(12):
            answer = AssistantMessage.of(f"answer {i} " + "word " * 6000)
            history = [*(await ctx.prepare([*history, UserMessage.of(f"q{i}"), answer]))]
            await anyio.sleep(0.05)
            if len(summarizer.sizes) >= 4:
                break
        await anyio.sleep(0.1)
    sizes = summarizer.sizes
    assert len(sizes) >= 3 and all(b < a for a, b in zip(sizes, sizes[1:], strict=False)), sizes
