"""Give the model the ``recall_context`` tool, so it can read back what compaction cut.

    AGENTCTX_OFFLINE=1 python examples/recall_tool.py   # against agentctx's fake server
    ANTHROPIC_API_KEY=... python examples/recall_tool.py # against the real API

When a tool output is truncated, the original is kept in the recall store and the placeholder
in the view names it: ``[... 401 lines (16040 chars) truncated; recall_context id=ctx-... ...]``.
The loop adds ``recall_tool("anthropic")`` to its tools and answers a ``recall_context`` call
with ``await ctx.handle_recall(call.arguments)``: a page of the original text (or, with
``pattern``, its matching lines), at most 8000 characters whatever the model asked for.
Recalled text is truncated again only as the last thing left to cut (see docs/recall.md).
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

import anthropic

from agentctx import (
    RECALL_TOOL_NAME,
    Budget,
    ContextCompacted,
    ContextManager,
    Event,
    MemoryRecallStore,
    Message,
    ToolResultMessage,
    UserMessage,
    recall_tool,
)
from agentctx.adapters import message_from_anthropic_response, to_anthropic

if TYPE_CHECKING:
    from agentctx.testing import Reply

MODEL = os.environ.get("AGENTCTX_MODEL", "claude-sonnet-5-5")
OFFLINE = os.environ.get("AGENTCTX_OFFLINE") == "1"
TESTS = 600  # lines of test output
FAILING = 120  # the line that reports the failure: in the part the truncation cuts
TOOLS = [
    {
        "name": "run_tests",
        "description": "Run the project's test suite and return its output.",
        "input_schema": {"type": "object", "properties": {}},
    },
    recall_tool("anthropic"),  # the recall_context tool, in Anthropic's format
]
SYSTEM = "You are a developer. Use the tools; recall_context reads back cleared output."
TASK = "Run the tests and tell me which one fails, with its error."


def run_tests() -> str:
    """The tool: a long test log, too large for this session's budget."""
    lines = [f"tests/test_mod{n // 25:02}.py::test_f{n % 25:02} PASSED" for n in range(TESTS)]
    lines[FAILING] = lines[FAILING].replace("PASSED", "FAILED - AssertionError: assert 40 == 41")
    lines.append(f"========== 1 failed, {TESTS - 1} passed in 9.41s ==========")
    return "\n".join(lines)


def on_event(event: Event) -> None:
    if isinstance(event, ContextCompacted):
        saved = event.tokens_before - event.tokens_after
        print(
            f"compacted ({event.method}): {event.tokens_before} -> {event.tokens_after} tokens,"
            f" saved {saved}; {event.messages_before} -> {event.messages_after} messages"
        )
        for action in event.actions[:3]:
            print(f"  - {action}")


# -- offline only: a stand-in for the model ----------------------------------------------

PAGE = 600  # characters the fake model asks for per recall
PLACEHOLDER = re.compile(r"\[\.\.\. \d+ lines \(\d+ chars\) truncated; recall_context id=(ctx-\w+)")
NEXT_PAGE = re.compile(r"^\[recall_context (ctx-\w+): chars \d+-\d+ of \d+; next offset=(\d+)\]")


def fake_model(body: Any) -> Reply:
    """Answers a request as the model would, from the newest tool result it was sent.

    A truncated result: read the cut part back, from where the placeholder stands (the text
    before it is the original's head). A page without the failure: read the next page. The
    failure in sight: report it. The fake server calls this for every request, in its thread.
    """
    from agentctx.testing import Reply

    block = body["messages"][-1]["content"][-1]
    content = block.get("content", "")
    text = content if isinstance(content, str) else "".join(b.get("text", "") for b in content)
    failed = [line for line in text.split("\n") if " FAILED " in line]
    if failed:
        return Reply.text(f"This test fails: {failed[0]}")
    if m := PLACEHOLDER.search(text):
        args = {"id": m[1], "offset": m.start(), "limit": PAGE}
        return Reply.tool_call(RECALL_TOOL_NAME, args)
    if m := NEXT_PAGE.search(text):
        return Reply.tool_call(RECALL_TOOL_NAME, {"id": m[1], "offset": int(m[2]), "limit": PAGE})
    return Reply.text("No test fails.")


# ----------------------------------------------------------------------------------------


async def main() -> None:
    async with AsyncExitStack() as stack:
        if OFFLINE:
            from agentctx.testing import FakeAnthropic, Reply

            # The first answer is scripted; after it the fake model reads what it is sent.
            server = await stack.enter_async_context(
                FakeAnthropic([Reply.tool_call("run_tests", {})], default=fake_model)
            )
            client = anthropic.AsyncAnthropic(base_url=server.url, api_key="test", max_retries=0)
        else:
            client = anthropic.AsyncAnthropic()
        await stack.enter_async_context(client)

        # A small budget so that the test log is truncated; use your model's real window. The
        # recall store keeps what is cut; its ids are scoped by the session id.
        ctx = ContextManager(
            Budget(context_window=6_000, reserve_output=1_000),
            recall=MemoryRecallStore(),
            session_id="recall-example",
        )
        await stack.enter_async_context(ctx)
        ctx.subscribe(on_event)

        history: list[Message] = [UserMessage.of(TASK)]
        for _ in range(8):
            view = await ctx.prepare(history)  # the compacted view of the whole history
            resp = await client.messages.create(
                model=MODEL,
                max_tokens=1024,
                system=SYSTEM,
                tools=TOOLS,  # type: ignore[arg-type]
                messages=to_anthropic(view),  # type: ignore[arg-type]
            )
            reply = message_from_anthropic_response(resp.to_dict())
            ctx.observe(reply)
            history.append(reply)
            if not reply.tool_calls:
                text = "".join(b.text for b in resp.content if b.type == "text")
                print(f"final answer: {text}")
                break
            for call in reply.tool_calls:
                if call.name == RECALL_TOOL_NAME:
                    result = await ctx.handle_recall(call.arguments)  # a page, or a clear miss
                    shown = ", ".join(f"{k}={v}" for k, v in call.arguments.items())
                    print(f"{RECALL_TOOL_NAME}({shown}) returned:\n{result}")
                else:
                    result = run_tests()
                history.append(ToolResultMessage.of(call.id, result, tool_name=call.name))


if __name__ == "__main__":
    if not OFFLINE and "ANTHROPIC_API_KEY" not in os.environ:
        sys.exit("set ANTHROPIC_API_KEY, or AGENTCTX_OFFLINE=1 to run against a fake server")
    asyncio.run(main())
