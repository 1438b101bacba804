"""Small builders shared by the tests."""

from __future__ import annotations

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
