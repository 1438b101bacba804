"""End to end with a real (tiny) model: SmolLM2-135M behind llama.cpp's OpenAI-compatible
server on 127.0.0.1, reached through the real `openai` SDK by `OpenAIChatSummarizer`.

The model mostly parrots its input, so this checks the machinery, not the prose: a real
multi-second request made in the background while the loop goes on, its validation, the
splice, and the usage reported with an unknown (None) cost.
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
)
from agentctx.importers import load_transcript
from agentctx.messages import AssistantMessage, Message
from agentctx.providers.openai_summarizer import OpenAIChatSummarizer
from agentctx.testing import assert_view_ok

from .corpus import corpus_file

SERVER = Path(__file__).with_name("local_llm_server.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def llm_url() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
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


def turns(messages: list[Message]) -> list[list[Message]]:
    """Groups appended between model calls: everything up to each assistant message."""
    cuts = [i for i, m in enumerate(messages) if isinstance(m, AssistantMessage) and i > 0]
    out, start = [], 0
    for cut in cuts:
        out.append(messages[start:cut])
        start = cut
    return [g for g in out if g]


async def test_a_real_model_briefing_is_spliced_in_the_background(llm_url: str) -> None:
    messages = list(load_transcript(corpus_file("pi", "large-session.jsonl")).messages)
    summarizer = OpenAIChatSummarizer("smollm2", base_url=llm_url + "/v1", api_key="unused")
    config = LlmCompactionConfig(
        required_sections=(),  # a 135M model cannot follow the section format
        max_summary_tokens=400,
        instruction="Summarize the conversation above in three short sentences.",
        transcript_block_chars=300,
        transcript_total_chars=2_500,  # the model's context is 2048 tokens
        timeout=60.0,
        deadline=120.0,
    )
    strategy = Chain([LlmCompaction(summarizer, config), DeterministicCompaction()])
    events: list[Event] = []
    longest = 0.0
    async with ContextManager(
        Budget(context_window=14_000, reserve_output=2_000),
        strategy=strategy,
        on_over_budget="send",
    ) as ctx:
        ctx.subscribe(events.append)
        history: list[Message] = []
        started = time.monotonic()
        for group in turns(messages):
            if time.monotonic() - started > 120:
                break
            history = [*history, *group]
            t = time.perf_counter()
            view = await ctx.prepare(history)
            longest = max(longest, time.perf_counter() - t)
            assert_view_ok(view, ctx.raw)
            history = view
            await anyio.sleep(0.3)  # the loop's own model call
            if any(isinstance(e, ContextCompacted) and e.method == "summarized" for e in events):
                break
    await summarizer.aclose()
    spliced = [e for e in events if isinstance(e, ContextCompacted) and e.method == "summarized"]
    assert spliced, sorted({type(e).__name__ for e in events})
    stats = spliced[0].summary
    assert stats is not None and stats.usage.input_tokens > 0 and stats.usage.output_tokens > 0
    assert stats.cost_usd is None  # no price for a local model: unknown, never 0
    assert longest < 1.0  # the multi-second request never stalled prepare()
