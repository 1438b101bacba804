"""End to end with a real (tiny) model: SmolLM2-135M behind llama.cpp's OpenAI-compatible
server on 127.0.0.1, reached through the real `openai` SDK by `OpenAIChatSummarizer`.

The model is too small to write a useful briefing, so this checks the machinery, not the
prose: a real request made in the background without holding up `prepare`, its validation,
the splice, and the usage reported with an unknown (None) cost.

Nothing here depends on how fast the machine is: sampling is greedy (the same briefing on
every run), the loop waits for the briefing instead of racing it, and every time limit only
guards against a hang.
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
import pytest

from agentctx import (
    Budget,
    Chain,
    ContextCompacted,
    ContextManager,
    DeterministicCompaction,
    Event,
    LlmCompaction,
    LlmCompactionConfig,
    RetryPolicy,
    SummaryRejected,
    SummaryStale,
)
from agentctx.importers import load_transcript
from agentctx.messages import AssistantMessage, Message
from agentctx.providers.openai_summarizer import OpenAIChatSummarizer
from agentctx.strategies.llm import is_briefing
from agentctx.strategies.llm_config import briefing_text
from agentctx.summarizer import SummaryRequest, SummaryResult
from agentctx.testing import assert_view_ok

from .corpus import corpus_file

SERVER = Path(__file__).with_name("local_llm_server.py")

HANG = 600.0
"""Seconds after which a step counts as hung. The request takes under a second on an idle
machine and up to about a minute on a loaded 2-core one; the limit is only there so a stuck
server fails the test instead of blocking the run."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def llm_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("llm") / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(SERVER), str(port)], stdout=out, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + HANG
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-2_000:]
                raise RuntimeError(f"local model server did not start:\n{tail}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def turns(messages: list[Message]) -> list[list[Message]]:
    """Groups appended between model calls: everything up to each assistant message."""
    cuts = [i for i, m in enumerate(messages) if isinstance(m, AssistantMessage) and i > 0]
    out, start = [], 0
    for cut in cuts:
        out.append(messages[start:cut])
        start = cut
    return [g for g in out if g]


class Replies:
    """Passes requests to ``inner`` and counts the answers (or errors) in."""

    def __init__(self, inner: OpenAIChatSummarizer) -> None:
        self.inner = inner
        self.model = inner.model
        self.replies = 0
        self._replied = anyio.Event()

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        try:
            return await self.inner.summarize(request)
        finally:
            self.replies += 1
            self._replied.set()
            self._replied = anyio.Event()

    async def wait_for(self, replies: int) -> None:
        """Until ``replies`` answers are in."""
        while self.replies < replies:
            await self._replied.wait()


def spliced(events: list[Event]) -> list[ContextCompacted]:
    return [e for e in events if isinstance(e, ContextCompacted) and e.method == "summarized"]


async def test_a_real_model_briefing_is_spliced_in_the_background(llm_url: str) -> None:
    messages = list(load_transcript(corpus_file("pi", "large-session.jsonl")).messages)
    summarizer = OpenAIChatSummarizer(
        "smollm2",
        base_url=llm_url + "/v1",
        api_key="unused",
        # Greedy decoding: the server sends the same briefing on every run, so whether it
        # is accepted cannot depend on luck (the seed matters only if the temperature is
        # ever raised). Greedy decoding of a model this small can fall into a repetition
        # loop until the cap: a mild frequency penalty breaks loops within a line, and
        # ending the one-line answer at its first newline cuts off loops across lines.
        # Over 57 spans of this session all 57 answers ended on "stop", within 12-47 tokens.
        request_options={
            "temperature": 0,
            "seed": 1234,
            "frequency_penalty": 0.3,
            "stop": ["\n"],
        },
    )
    config = LlmCompactionConfig(
        # A 135M model cannot follow the section format, so no section is required.
        required_sections=(),
        # A question gets a one-sentence answer, where "summarize" gets the input parroted
        # back until the cap.
        instruction="What is the assistant working on? Answer in one short sentence.",
        # Ten times the longest answer seen, and with the prompt (at most about 900
        # tokens over this session's spans at these caps, system prompt included) inside
        # the server's 2048-token context.
        max_summary_tokens=512,
        transcript_block_chars=300,
        transcript_total_chars=2_000,
        timeout=HANG,
        deadline=HANG,
        # Nothing on a local server is worth a retry, and one attempt means one reply to
        # wait for.
        retry=RetryPolicy(max_attempts=1),
    )
    replies = Replies(summarizer)
    llm = LlmCompaction(replies, config)
    events: list[Event] = []
    armed = 0
    async with ContextManager(
        Budget(context_window=14_000, reserve_output=2_000),
        strategy=Chain([llm, DeterministicCompaction()]),
        on_over_budget="send",
    ) as ctx:
        ctx.subscribe(events.append)
        history: list[Message] = []
        for group in turns(messages):
            history = await ctx.prepare([*history, *group])
            assert_view_ok(history, ctx.raw)
            if spliced(events):
                break
            # Seen in flight after prepare() returned: prepare never waits on the request.
            in_flight = llm.phase == "in_flight"
            if in_flight:
                armed += 1
                # Hold the loop until the reply: a briefing arriving while the loop goes on
                # would splice or not depending on how fast the machine is.
                with anyio.fail_after(HANG + 60):
                    await replies.wait_for(armed)
                failed = [
                    e
                    for e in events
                    if isinstance(e, SummaryRejected)
                    or (isinstance(e, SummaryStale) and e.reason != "updated")
                ]
                assert not failed, failed
                assert llm.phase == "ready"
        view = history
    await summarizer.aclose()
    done = spliced(events)
    # (An update of the ready briefing may be asked for before the splice.)
    assert armed >= 1 and len(done) == 1, [type(e).__name__ for e in events]
    briefings = [m for m in view if is_briefing(m)]
    assert len(briefings) == 1 and briefing_text(briefings[0])
    stats = done[0].summary
    assert stats is not None and stats.usage.input_tokens > 0 and stats.usage.output_tokens > 0
    assert stats.cost_usd is None  # no price for a local model: unknown, never 0
