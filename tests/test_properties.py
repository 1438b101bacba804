"""Property-based checks of the invariants (docs/invariants.md) over generated histories,
driven as real callers do."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentctx.budget import Budget
from agentctx.events import BudgetExceeded, Event
from agentctx.ledger import Ledger, render
from agentctx.manager import ContextManager
from agentctx.messages import (
    AssistantMessage,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    canonical_json,
)
from agentctx.recall import MemoryRecallStore
from agentctx.testing import assert_view_ok

_texts = st.text(alphabet=st.sampled_from("abc xyz\n{}:;/.\"'#é字"), min_size=0, max_size=40)


@st.composite
def output(draw: st.DrawFn) -> str:
    unit = draw(_texts) or "x"
    lines = draw(st.integers(1, 400))
    return "\n".join(f"{unit} {i}" for i in range(lines))


@st.composite
def sessions(draw: st.DrawFn) -> list[list[Message]]:
    """Groups appended between model calls: tool steps (parallel, aborted, with thinking),
    final answers, new user prompts, and now and then an orphan result."""
    groups: list[list[Message]] = [[UserMessage.of("task: " + draw(_texts))]]
    for n in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["tool", "tool", "tool", "answer", "aborted", "orphan"]))
        thinking = draw(st.booleans())
        blocks: list[Any] = [ThinkingBlock(f"think {n}", f"sig{n}")] if thinking else []
        if kind == "answer":
            blocks.append(TextBlock(f"answer {n}"))
            groups.append([AssistantMessage(tuple(blocks), "stop"), UserMessage.of(f"next {n}")])
            continue
        width = draw(st.integers(1, 4))
        calls = [
            ToolCall(
                f"c{n}_{k}",
                draw(st.sampled_from(["read", "bash", "write"])),
                {"path": f"p{n}_{k}", "content": draw(output()) if draw(st.booleans()) else "x"},
            )
            for k in range(width)
        ]
        blocks.extend(calls)
        step: list[Message] = [AssistantMessage(tuple(blocks), "tool_use")]
        if kind == "aborted":
            answered = calls[: draw(st.integers(0, width - 1))]
            step += [ToolResultMessage.of(c.id, draw(output())) for c in answered]
            step.append(UserMessage.of("interrupted"))
        else:
            step += [
                ToolResultMessage.of(c.id, draw(output()), is_error=draw(st.booleans()))
                for c in calls
            ]
            if kind == "orphan":
                step.append(ToolResultMessage.of(f"ghost{n}", "orphan"))
        groups.append(step)
    return groups


def fingerprints(view: list[Message]) -> list[str]:
    return [canonical_json(m) for m in view]


_settings = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_settings
@given(groups=sessions(), window=st.integers(2_000, 40_000), owned=st.booleans())
async def test_every_view_keeps_the_invariants(
    groups: list[list[Message]], window: int, owned: bool
) -> None:
    budget = Budget(context_window=window, reserve_output=500)
    events: list[Event] = []
    async with ContextManager(
        budget, recall=MemoryRecallStore(), on_over_budget="send", session_id="p"
    ) as ctx:
        ctx.subscribe(events.append)
        history: list[Message] = []
        previous: list[str] = []
        for group in groups:
            history = [*history, *group]
            snapshot = fingerprints(history)
            version = ctx.ledger.version
            seen = len(events)
            view = await ctx.prepare(history)
            # input never mutated; every view provider-valid, task and latest user kept,
            # signed thinking untouched (assert_view_ok)
            assert fingerprints(history) == snapshot
            assert_view_ok(view, ctx.raw)
            current = fingerprints(view)
            # re-running prepare on settled history is a byte-identical no-op
            again = await ctx.prepare(view if owned else history)
            assert fingerprints(again) == current
            # appending leaves the prefix byte-identical unless a decision was taken; the
            # last message of the previous view may have been a stub for a pending batch
            if ctx.ledger.version == version:
                assert current[: len(previous)] == previous
            # rendering is deterministic, also from a ledger restored from JSON
            restored = render(ctx.raw, Ledger.from_json(ctx.ledger.to_json()))
            assert fingerprints(restored.messages) == current
            # over budget only with the task and newest turn alone too big, and then said so
            if ctx.prompt_tokens > budget.limit:
                assert any(isinstance(e, BudgetExceeded) for e in events[seen:])
            previous = current
            if owned:
                history = list(view)
