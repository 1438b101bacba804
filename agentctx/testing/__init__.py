"""Test helpers users need too: the invariant checker and the `drive` harness.

```python
from agentctx.testing import check_view, drive

views = await drive(manager, turns, mode="owned")   # feeds each view back as the caller would
```
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from agentctx._synthetic import synthetic_session
from agentctx.boundaries import (
    EMPTY_TEXT,
    in_flight_start,
    latest_user_index,
    newest_complete_turn,
    repaired_message,
    task_index,
    validate,
)
from agentctx.messages import (
    THINKING_DROPPED,
    AssistantMessage,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    canonical_json,
)
from agentctx.testing.scripted import Outcome, ScriptedSummarizer
from agentctx.testing.servers import (
    Billing,
    FakeAnthropic,
    FakeOpenAI,
    FakeToolCall,
    RecordedRequest,
    Reply,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from agentctx.manager import ContextManager
    from agentctx.messages import Message

__all__ = [
    "Billing",
    "FakeAnthropic",
    "FakeOpenAI",
    "FakeToolCall",
    "Outcome",
    "RecordedRequest",
    "Reply",
    "ScriptedSummarizer",
    "assert_view_ok",
    "check_view",
    "drive",
    "synthetic_session",
]


def _reasoning(messages: Iterable[Message]) -> list[ThinkingBlock | RedactedThinkingBlock]:
    return [
        blk
        for m in messages
        if isinstance(m, AssistantMessage)
        for blk in m.content
        if isinstance(blk, ThinkingBlock | RedactedThinkingBlock)
    ]


class _Blocks:
    """Reasoning blocks, found by their text: ``in`` in O(1) for the few with the same
    text, where a list's ``in`` made a check of a long session with reasoning quadratic."""

    def __init__(self, blocks: Iterable[ThinkingBlock | RedactedThinkingBlock]) -> None:
        self._by_text: dict[str, list[ThinkingBlock | RedactedThinkingBlock]] = {}
        for blk in blocks:
            self._by_text.setdefault(_text_of(blk), []).append(blk)

    def __contains__(self, blk: ThinkingBlock | RedactedThinkingBlock) -> bool:
        return blk in self._by_text.get(_text_of(blk), ())


def _text_of(blk: ThinkingBlock | RedactedThinkingBlock) -> str:
    return blk.thinking if isinstance(blk, ThinkingBlock) else blk.data


def _spoken(m: Message) -> str:
    """``m`` as a view shows it whatever became of its reasoning, as canonical JSON: without
    reasoning blocks, the note that they were left out, and blank text or the `EMPTY_TEXT`
    `repair` puts in its place (left out beside no reasoning, filled in beside some)."""
    if isinstance(m, AssistantMessage):
        kept = tuple(
            b
            for b in m.content
            if not isinstance(b, ThinkingBlock | RedactedThinkingBlock)
            and not (isinstance(b, TextBlock) and (b.text.isspace() or b.text in ("", EMPTY_TEXT)))
        )
        extra = {k: v for k, v in m.extra.items() if k != THINKING_DROPPED}
        m = AssistantMessage(kept, m.stop_reason, m.usage, m.model, extra)
    return canonical_json(m)


def check_view(view: Sequence[Message], raw: Sequence[Message]) -> list[str]:
    """Every way ``view`` breaks an invariant (docs/invariants.md) given its ``raw`` history.

    Provider validity for Anthropic and OpenAI (`agentctx.boundaries.validate`: tool calls
    answered exactly once and right away, unique tool-call ids, no empty or whitespace-only
    text, a user message first); the task, the latest user message, and the question and the
    answer of the newest complete turn present (as `repair` sends them: a blank one holds
    `agentctx.boundaries.EMPTY_TEXT`; the turn's results, arguments and user-run shell
    output may be cut down and its reasoning dropped whole); every reasoning block in
    the view byte-identical to one in ``raw``; every reasoning block of the raw in-flight tool
    loop present in the view.
    """
    problems = [f"anthropic: {p}" for p in validate(view, "anthropic")]
    problems += [f"openai: {p}" for p in validate(view, "openai")]
    for name, index in (("task", task_index(raw)), ("latest user message", latest_user_index(raw))):
        if index is not None and repaired_message(raw[index]) not in view:
            problems.append(f"{name} (raw message {index}) is missing from the view")
    complete = newest_complete_turn(raw)
    if complete is not None:
        # Its results and arguments may be cut down and its reasoning dropped whole (it is
        # complete); its question and its answer stay.
        kept = {_spoken(m) for m in view}
        for name, index in (("question", complete[0]), ("answer", complete[1] - 1)):
            original = repaired_message(raw[index])
            if original is None or original.extra.get("source") == "bash_execution":
                continue  # user-run shell output is cut down like a tool result
            if _spoken(original) not in kept:
                problems.append(
                    f"the newest complete turn's {name} (raw message {index}) is missing from "
                    "the view"
                )
    raw_reasoning = _Blocks(_reasoning(raw))
    for blk in _reasoning(view):
        if blk not in raw_reasoning:
            problems.append(f"reasoning block not byte-identical to any raw one: {blk!r:.80}")
    view_reasoning = _Blocks(_reasoning(view))
    for blk in _reasoning(raw[in_flight_start(raw) :]):
        if blk not in view_reasoning:
            problems.append(f"in-flight reasoning block was dropped: {blk!r:.80}")
    return problems


def assert_view_ok(view: Sequence[Message], raw: Sequence[Message]) -> None:
    """Raise `AssertionError` listing every problem `check_view` finds."""
    problems = check_view(view, raw)
    if problems:
        raise AssertionError("invalid view:\n  " + "\n  ".join(problems))


async def drive(
    manager: ContextManager,
    turns: Iterable[Sequence[Message]],
    *,
    mode: Literal["owned", "projection"] = "owned",
    check: bool = True,
) -> list[list[Message]]:
    """Append each turn, call ``prepare``, and feed the result back as that mode's caller does.

    ``owned``: the caller keeps the returned view and appends the next turn to it.
    ``projection``: the caller keeps its full history and passes all of it every time.
    Each view is checked with `assert_view_ok` against the manager's raw history unless
    ``check`` is false. Returns every view.
    """
    history: list[Message] = []
    views: list[list[Message]] = []
    for turn in turns:
        history = [*history, *turn]
        view = await manager.prepare(history)
        if check:
            assert_view_ok(view, manager.raw)
        views.append(view)
        if mode == "owned":
            history = list(view)
    return views
