"""The session's raw history and its cached view, kept in step at O(new messages) per call.

The view of the settled prefix of the raw history never changes until a decision is taken or
the history is rewound, so it is rendered once and reused; only the unsettled tail (a tool
batch still waiting for results, whose stubs `repair` adds) is rendered again on each call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentctx.ledger import Ledger, Rendered, render
from agentctx.messages import AssistantMessage, Message, ToolResultMessage

if TYPE_CHECKING:
    from collections.abc import Sequence

    from agentctx.boundaries import Repair
    from agentctx.tokens import MessageCounter

__all__ = ["ViewState"]


def _settle_point(raw: Sequence[Message]) -> int:
    """Index before which appending can no longer change the rendering."""
    i = len(raw)
    answered: set[str] = set()
    while i > 0 and isinstance(raw[i - 1], ToolResultMessage):
        i -= 1
        answered.add(raw[i].tool_call_id)  # type: ignore[union-attr]
    if i > 0:
        last = raw[i - 1]
        if isinstance(last, AssistantMessage) and any(
            c.id not in answered for c in last.tool_calls
        ):
            return i - 1
    return len(raw)


class ViewState:
    """Raw history, ledger and the rendered view of one session."""

    __slots__ = (
        "_counter",
        "_counter_generation",
        "_prefix_len",
        "_prefix_origin_len",
        "_prefix_tokens",
        "_settled_raw",
        "ledger",
        "origins",
        "raw",
        "repairs",
        "repairs_version",
        "view",
    )

    def __init__(self, counter: MessageCounter, ledger: Ledger | None = None) -> None:
        self.raw: list[Message] = []
        self.ledger = ledger if ledger is not None else Ledger()
        self.view: list[Message] = []
        self.origins: list[int] = []
        self.repairs: list[Repair] = []
        self.repairs_version = 0
        self._counter = counter
        self._counter_generation = counter.generation
        self._settled_raw = 0  # raw[:_settled_raw] renders to view[:_prefix_len] for good
        self._prefix_len = 0
        self._prefix_origin_len = 0
        self._prefix_tokens = 0

    # -- changes ------------------------------------------------------------------------

    def append(self, messages: Sequence[Message]) -> None:
        """Append new raw messages and bring the view up to date."""
        if not messages:
            return
        self.raw.extend(messages)
        self._render_tail()

    def truncate(self, index: int) -> int:
        """Cut the raw history back to ``index``; drop decisions after it; return how many."""
        del self.raw[index:]
        dropped = len(self.ledger.drop_from(index))
        self.rebuild()
        return dropped

    def rebuild(self) -> None:
        """Render everything again (after new decisions)."""
        self._settled_raw = 0
        self._prefix_len = 0
        self._prefix_tokens = 0
        self.view, self.origins, self.repairs = [], [], []
        self.repairs_version += 1
        self._render_tail()

    def _render_tail(self) -> None:
        start = self._settled_raw
        span = self.ledger.span_covering(start)
        if span is not None and span.at.index < start:
            start = span.at.index
            self.rebuild()
            return
        tail: Rendered = render(self.raw, self.ledger, start)
        keep = self._prefix_len
        self.view[keep:] = tail.messages
        self.origins[keep:] = tail.origins
        if tail.repairs or (self.repairs and self.repairs[-1].index >= keep):
            prefix_repairs = [r for r in self.repairs if r.index < keep]
            self.repairs = prefix_repairs + [
                type(r)(r.kind, r.index + keep, r.tool_call_id) for r in tail.repairs
            ]
            self.repairs_version += 1
        settle = _settle_point(self.raw)
        span = self.ledger.span_covering(settle)
        if span is not None:
            settle = span.at.index
        if settle > self._settled_raw:
            count = self._counter.count
            new_len = keep
            while new_len < len(self.view) and self.origins[new_len] < settle:
                self._prefix_tokens += count(self.view[new_len])
                new_len += 1
            self._prefix_len = new_len
            self._settled_raw = settle

    # -- reading ------------------------------------------------------------------------

    @property
    def tokens(self) -> int:
        """Estimated tokens of the view's messages (no system prompt or tools)."""
        counter = self._counter
        if counter.generation != self._counter_generation:
            self._counter_generation = counter.generation
            self._prefix_tokens = counter.count_many(self.view[: self._prefix_len])
        tail = self.view[self._prefix_len :]
        return self._prefix_tokens + (counter.count_many(tail) if tail else 0)
