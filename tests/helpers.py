"""Small builders shared by the tests."""

from __future__ import annotations

import base64
import json
import signal
import struct
import zlib
from collections.abc import Iterator
from contextlib import contextmanager

from agentctx.messages import (
    AssistantMessage,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)


def user(text: str) -> UserMessage:
    return UserMessage.of(text)


def call(cid: str, name: str = "read", **args: object) -> ToolCall:
    return ToolCall(cid, name, args or {"path": f"src/{cid}.py"})


def assistant(*calls: ToolCall, text: str = "", thinking: str | None = None) -> AssistantMessage:
    blocks: list[object] = []
    if thinking is not None:
        blocks.append(ThinkingBlock(thinking, "sig-" + thinking))
    if text:
        blocks.append(TextBlock(text))
    blocks.extend(calls)
    return AssistantMessage(tuple(blocks), "tool_use" if calls else "stop")  # type: ignore[arg-type]


def result(
    cid: str, text: str = "ok", name: str = "read", error: bool = False
) -> ToolResultMessage:
    return ToolResultMessage(cid, (TextBlock(text),), name, error)


def tool_turn(n: int, lines: int = 50, width: int = 1) -> list[Message]:
    """One model call's worth: an assistant message with ``width`` calls and their results."""
    calls = [call(f"c{n}_{k}") for k in range(width)]
    body = "\n".join(f"line {i} of output {n}" for i in range(lines))
    return [assistant(*calls), *(result(c.id, body) for c in calls)]


def png(width: int, height: int) -> str:
    """Base64 of a PNG's signature and header chunk (and some padding): enough for its size
    to be read."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    data = (
        b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + chunk + struct.pack(">I", zlib.crc32(chunk))
    )
    return base64.b64encode(data + b"\x00" * 64).decode()


@contextmanager
def returns_within(seconds: float) -> Iterator[None]:
    """Fail, rather than hang the suite, when the block loops without awaiting: the alarm
    raises in the main thread, which runs the event loop."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"the block did not end within {seconds} s")

    if not hasattr(signal, "setitimer"):  # no alarms on this platform: unguarded
        yield
        return
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def cut_off_write(lines: int) -> tuple[str, list[Message]]:
    """A write_file call cut off at the output limit: arguments that are no JSON object, which
    the OpenAI adapters keep as written and send back byte for byte."""
    from agentctx.adapters.openai_chat import from_openai_chat

    body = "\n".join(
        f"def handler_{i}(request):\n    return run(request, {i})" for i in range(lines)
    )
    raw = json.dumps({"path": "src/handlers.py", "content": body})[:-5]
    write = {"id": "call_1", "type": "function", "function": {"name": "write", "arguments": raw}}
    history = from_openai_chat(
        [
            {"role": "user", "content": "write the handlers"},
            {"role": "assistant", "content": None, "tool_calls": [write]},
            {"role": "tool", "tool_call_id": "call_1", "content": "error: invalid arguments"},
            {"role": "user", "content": "try again"},
        ]
    )
    return raw, history
