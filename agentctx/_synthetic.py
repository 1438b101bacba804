"""A seeded synthetic agent session: heavy-tailed tool output, parallel calls, signed thinking,
aborted turns. Used by the tests and benchmarks; exposed as `agentctx.testing.synthetic_session`.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from agentctx.messages import (
    AssistantMessage,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)

if TYPE_CHECKING:
    from agentctx.messages import Message

__all__ = ["synthetic_session"]

_WORDS = (
    "the",
    "parser",
    "config",
    "cache",
    "session",
    "handler",
    "token",
    "budget",
    "retry",
    "stream",
    "buffer",
    "index",
    "query",
    "result",
    "module",
    "client",
    "server",
    "request",
    "response",
    "error",
    "value",
    "update",
    "commit",
    "branch",
    "test",
)


def _code(rng: random.Random, lines: int, path: str) -> str:
    out = [f"# {path}", "import os", "from typing import Any", ""]
    for i in range(lines):
        w = rng.choice(_WORDS)
        if i % 12 == 0:
            out.append(f"def {w}_{i}(value: Any) -> Any:")
        else:
            out.append(f"    {w}_{i % 7} = compute({w!r}, value, {i})  # {rng.choice(_WORDS)}")
    return "\n".join(out)


def _listing(rng: random.Random, lines: int) -> str:
    return "\n".join(
        f"-rw-r--r--  1 dev dev {rng.randint(10, 99999):>7} Nov {rng.randint(1, 30):>2} "
        f"10:{i % 60:02d} "
        f"src/{rng.choice(_WORDS)}/{rng.choice(_WORDS)}_{i}.py"
        for i in range(lines)
    )


def _log(rng: random.Random, lines: int) -> str:
    status = ("PASSED", "PASSED", "PASSED", "FAILED", "ERROR")
    return "\n".join(
        f"tests/test_{rng.choice(_WORDS)}.py::test_{rng.choice(_WORDS)}_{i} {rng.choice(status)}"
        for i in range(lines)
    )


def _prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words)).capitalize() + "."


def synthetic_session(
    seed: int = 0, calls: int = 200, *, mean_output_lines: int = 60, prompt_every: int = 15
) -> list[list[Message]]:
    """Groups of messages appended between model calls, for ``calls`` model calls.

    Group 0 is the task; each later group is what the loop appends after one model call: the
    assistant response and its tool results, or a final answer and the next user prompt.
    Paths the agent touches are ``src/<word>/file_<n>.py``, so tests can check they survive.
    """
    rng = random.Random(seed)
    groups: list[list[Message]] = [
        [UserMessage.of("Task: refactor the session cache in src/cache/file_0.py; keep the API.")]
    ]
    ts = 1_700_000_000_000
    for n in range(1, calls):
        ts += rng.randint(2_000, 40_000)
        if n % prompt_every == 0:
            groups.append(
                [
                    AssistantMessage.of(_prose(rng, 40)),
                    UserMessage((TextBlock(f"Next: {_prose(rng, 12)}"),), {"timestamp": ts}),
                ]
            )
            continue
        width = 1 if rng.random() < 0.8 else rng.randint(2, 4)
        calls_: list[ToolCall] = []
        results: list[Message] = []
        for k in range(width):
            cid = f"call_{n}_{k}"
            kind = rng.choice(("read", "read", "bash", "grep", "write"))
            lines = max(1, int(rng.paretovariate(1.3) * mean_output_lines / 3))
            path = f"src/{rng.choice(_WORDS)}/file_{n}_{k}.py"
            if kind == "read":
                args: dict[str, object] = {"path": path}
                out = _code(rng, lines, path)
            elif kind == "bash":
                args = {"command": rng.choice(("ls -la src", "pytest -q", "git status"))}
                out = _listing(rng, lines) if "ls" in args["command"] else _log(rng, lines)  # type: ignore[operator]
            elif kind == "grep":
                args = {"pattern": rng.choice(_WORDS), "path": "src"}
                out = _listing(rng, max(1, lines // 2))
            else:
                args = {"path": path, "content": _code(rng, lines, path)}
                out = f"Wrote {lines} lines to {path}"
            calls_.append(ToolCall(cid, kind, args))
            results.append(
                ToolResultMessage(
                    cid, (TextBlock(out),), kind, rng.random() < 0.05, {"timestamp": ts}
                )
            )
        blocks: list[object] = []
        if rng.random() < 0.3:
            blocks.append(ThinkingBlock(_prose(rng, 30), f"sig-{seed}-{n}"))
        if rng.random() < 0.5:
            blocks.append(TextBlock(_prose(rng, 15)))
        blocks.extend(calls_)
        aborted = rng.random() < 0.02
        assistant = AssistantMessage(tuple(blocks), "aborted" if aborted else "tool_use")  # type: ignore[arg-type]
        if aborted:
            groups.append([assistant, UserMessage.of("Stop, try something else.")])
        else:
            groups.append([assistant, *results])
    return groups
