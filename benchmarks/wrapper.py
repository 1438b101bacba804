"""What a wrapped client and the framework integrations add to each call: converting the
history. Prints milliseconds per call, incremental next to converting whole, in one run.

    python benchmarks/wrapper.py [--session pi/before-compaction]

The session (960-odd messages, from ``tests/corpus``) is replayed request by request, as a
loop holding its history in the SDK's or the framework's own format sends it:

- ``anthropic`` / ``openai-chat``: the request history as SDK dicts, through the wrapper's
  `Compactor` (what ``wrap`` and ``as_middleware`` do: convert, ``prepare``, render the view),
  against converting the whole history on every call and rendering the view the same way (a
  second manager, so each side's ``prepare`` sees its own session);
- ``pydantic-ai`` / ``langchain``: the integrations' converters on the framework's messages,
  against converting the whole history with ``from_pydantic_ai`` / ``from_langchain``.

Each side's p50 is over every call and over the calls past ``--past`` messages (700); the
two sides alternate call by call, so the machine's state hits both alike. ``same``: whether
the two sent the same messages (the integrations: made the same neutral messages) on every
call.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers

from agentctx import Budget, ContextManager
from agentctx.adapters import (
    from_anthropic,
    from_openai_chat,
    to_anthropic,
    to_openai_chat,
)
from agentctx.messages import (
    AssistantMessage,
    Message,
    ThinkingBlock,
    ToolResultMessage,
    UserMessage,
    text_of,
)
from agentctx.providers._convert import Compactor

if TYPE_CHECKING:
    from collections.abc import Callable


def requests(messages: list[Any]) -> list[int]:
    """History lengths at which a request is made: after each user-side message run."""
    ends = [
        i + 1
        for i, m in enumerate(messages[:-1])
        if _user_side(m) and not _user_side(messages[i + 1])
    ]
    return [*ends, len(messages)]


def _user_side(m: Any) -> bool:
    if isinstance(m, dict):
        return m.get("role") in ("user", "tool")
    return type(m).__name__ in ("ModelRequest", "HumanMessage", "ToolMessage")


def unsigned(history: list[Message]) -> list[Message]:
    """The session without signed reasoning (OpenAI Chat carries none)."""
    return [
        AssistantMessage(
            tuple(b for b in m.content if not (isinstance(b, ThinkingBlock) and b.signature)),
            m.stop_reason,
        )
        if isinstance(m, AssistantMessage)
        else m
        for m in history
    ]


Times = dict[str, list[tuple[int, float]]]


async def sdk(provider: str, history: list[Message]) -> tuple[Times, bool]:
    to_sdk = {"anthropic": to_anthropic, "openai-chat": to_openai_chat}[provider]
    from_sdk = {"anthropic": from_anthropic, "openai-chat": from_openai_chat}[provider]
    dicts = to_sdk(history)
    times: Times = {"incremental": [], "whole": []}
    same = True
    budget = Budget(context_window=100_000)
    async with (
        ContextManager(budget, on_over_budget="send") as a,
        ContextManager(budget, on_over_budget="send") as b,
    ):
        compactor = Compactor(a, provider)
        for k, n in enumerate(requests(dicts)):
            request = {"model": "m", "max_tokens": 1000, "messages": dicts[:n]}
            sent: dict[str, Any] = {}
            for side in ("incremental", "whole") if k % 2 else ("whole", "incremental"):
                started = time.perf_counter()
                if side == "incremental":
                    sent[side] = (await compactor.request(request))["messages"]
                else:
                    view = await b.prepare(from_sdk(list(dicts[:n])), max_tokens=1000)
                    sent[side] = to_sdk(view)
                times[side].append((n, time.perf_counter() - started))
            same = same and sent["incremental"] == sent["whole"]
    return times, same


def framework(name: str, history: list[Message]) -> tuple[Times, bool]:
    if name == "pydantic-ai":
        from agentctx.integrations.pydantic_ai import _Converter, from_pydantic_ai

        messages, whole = pydantic_ai_messages(history), from_pydantic_ai
    else:
        from agentctx.integrations.langchain import _Converter, from_langchain

        messages, whole = langchain_messages(history), from_langchain
    converter = _Converter()
    sides: dict[str, Callable[[list[Any]], object]] = {
        "incremental": converter.neutral,
        "whole": whole,
    }
    times: Times = {"incremental": [], "whole": []}
    same = True
    for k, n in enumerate(requests(messages)):
        made: dict[str, object] = {}
        for side in ("incremental", "whole") if k % 2 else ("whole", "incremental"):
            started = time.perf_counter()
            made[side] = sides[side](messages[:n])
            times[side].append((n, time.perf_counter() - started))
        same = same and made["incremental"] == made["whole"]
    return times, same


def pydantic_ai_messages(history: list[Message]) -> list[Any]:
    from pydantic_ai.messages import (
        ModelRequest,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )

    at = datetime(2025, 1, 1, tzinfo=UTC)
    out: list[Any] = []
    for m in history:
        if isinstance(m, UserMessage):
            out.append(ModelRequest([UserPromptPart(text_of(m.content) or "-", timestamp=at)]))
        elif isinstance(m, AssistantMessage):
            calls = [
                ToolCallPart(c.name, dict(c.arguments), tool_call_id=c.id) for c in m.tool_calls
            ]
            out.append(ModelResponse([TextPart(text_of(m.content) or "-"), *calls], timestamp=at))
        elif isinstance(m, ToolResultMessage):
            part = ToolReturnPart(
                m.tool_name or "tool", text_of(m.content), tool_call_id=m.tool_call_id, timestamp=at
            )
            out.append(ModelRequest([part]))
    return out


def langchain_messages(history: list[Message]) -> list[Any]:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    out: list[Any] = []
    for m in history:
        if isinstance(m, UserMessage):
            out.append(HumanMessage(text_of(m.content) or "-"))
        elif isinstance(m, AssistantMessage):
            calls = [
                {"name": c.name, "args": dict(c.arguments), "id": c.id, "type": "tool_call"}
                for c in m.tool_calls
            ]
            out.append(AIMessage(text_of(m.content), tool_calls=calls))
        elif isinstance(m, ToolResultMessage):
            out.append(ToolMessage(text_of(m.content), tool_call_id=m.tool_call_id))
    return out


def p50(values: list[tuple[int, float]], past: int = 0) -> float:
    return statistics.median([t for n, t in values if n > past] or [0.0]) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--session", default="pi/before-compaction")
    parser.add_argument("--past", type=int, default=700)
    args = parser.parse_args(argv)
    history = peers.load_sessions()[args.session].messages
    past = args.past
    print(f"{args.session}: {len(history)} messages; ms per call, p50 (all calls / past {past})")
    print(f"{'path':<14} {'incremental':>20} {'whole':>20} {'ratio':>7} {'same':>5}")
    rows: list[tuple[str, tuple[Times, bool]]] = [
        ("anthropic", anyio.run(sdk, "anthropic", history)),
        ("openai-chat", anyio.run(sdk, "openai-chat", unsigned(history))),
    ]
    for name in ("pydantic-ai", "langchain"):
        try:
            rows.append((name, framework(name, history)))
        except ImportError as e:
            print(f"{name}: not installed ({e.name})")
    for name, (times, same) in rows:
        inc, whole = times["incremental"], times["whole"]
        print(
            f"{name:<14} {p50(inc):>9.2f} / {p50(inc, past):>7.2f}"
            f" {p50(whole):>9.2f} / {p50(whole, past):>7.2f}"
            f" {p50(inc, past) / p50(whole, past):>7.2f} {'yes' if same else 'NO':>5}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
