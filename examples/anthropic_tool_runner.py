"""The Anthropic SDK's own tool runner with `wrap`: every turn of its loop is compacted.

    AGENTCTX_OFFLINE=1 python examples/anthropic_tool_runner.py   # against agentctx's fake server
    ANTHROPIC_API_KEY=... python examples/anthropic_tool_runner.py # against the real API

``client.beta.messages.tool_runner(...)`` calls the model, runs the ``@beta_tool`` functions it
asks for and calls it again with their results, until it answers. On a wrapped client each of
those requests goes through agentctx: the history the runner holds is compacted before every
turn (and sent in full each time rather than kept in a server-side thread, which nothing
could compact), and the usage of every turn is recorded.
"""

from __future__ import annotations

import os
import sys
from contextlib import ExitStack

import anthropic
from anthropic import beta_tool

from agentctx import Budget, ContextCompacted, ContextManager, Event, MemoryRecallStore
from agentctx.providers.anthropic import wrap

MODEL = os.environ.get("AGENTCTX_MODEL", "claude-sonnet-5-5")
OFFLINE = os.environ.get("AGENTCTX_OFFLINE") == "1"
FILES = 8
SYSTEM = "You are a code reviewer. Read the files you are asked about with read_file."
TASK = f"Read mod0.py to mod{FILES - 1}.py one at a time, then summarize them in one sentence."


@beta_tool
def read_file(path: str) -> str:
    """Read a source file of the project.

    Args:
        path: the file to read, e.g. mod0.py.
    """
    # A large, made-up source file, so the context fills up quickly.
    return "\n".join(f"def {path[:-3]}_f{n}(x):\n    return x * {n}  # step {n}" for n in range(80))


def on_event(event: Event) -> None:
    if isinstance(event, ContextCompacted):
        saved = event.tokens_before - event.tokens_after
        print(
            f"compacted ({event.method}): {event.tokens_before} -> {event.tokens_after} tokens,"
            f" saved {saved}; {event.messages_before} -> {event.messages_after} messages"
        )


def main() -> None:
    with ExitStack() as stack:
        if OFFLINE:
            from agentctx.testing import FakeAnthropic, Reply

            script = [Reply.tool_call("read_file", {"path": f"mod{i}.py"}) for i in range(FILES)]
            server = stack.enter_context(
                FakeAnthropic([*script, Reply.text("Eight small arithmetic helper modules.")])
            )
            raw = anthropic.Anthropic(base_url=server.url, api_key="test", max_retries=0)
        else:
            raw = anthropic.Anthropic()

        # A small budget so that this short session compacts; use your model's real window.
        ctx = ContextManager(
            Budget(context_window=9_000, reserve_output=1_000), recall=MemoryRecallStore()
        )
        ctx.subscribe(on_event)
        # The blocking wrapper runs the session on a loop of its own until the block ends.
        client = stack.enter_context(wrap(raw, ctx))

        runner = client.beta.messages.tool_runner(
            model=MODEL,
            max_tokens=1024,
            system=SYSTEM,
            tools=[read_file],
            messages=[{"role": "user", "content": TASK}],
        )
        for turn, message in enumerate(runner, 1):  # one model call per turn, tools run between
            calls = [
                f"{b.name}({b.input['path']})" for b in message.content if b.type == "tool_use"
            ]
            if calls:
                print(f"turn {turn}: {', '.join(calls)}")
            else:
                text = "".join(b.text for b in message.content if b.type == "text")
                print(f"final answer: {text}")
        u = ctx.usage
        print(
            f"usage: {u.prompt_tokens} prompt tokens ({u.cache_read_tokens} cache reads),"
            f" {u.output_tokens} output tokens"
        )


if __name__ == "__main__":
    if not OFFLINE and "ANTHROPIC_API_KEY" not in os.environ:
        sys.exit("set ANTHROPIC_API_KEY, or AGENTCTX_OFFLINE=1 to run against a fake server")
    main()
