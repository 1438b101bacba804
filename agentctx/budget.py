"""How many tokens a session may send, and where compaction starts and aims.

```python
Budget(context_window=200_000)                      # 200k window, 16k kept for output
                                                    # (or the request's max_tokens, see for_output)
Budget(context_window=128_000, reserve_output=8_000, trigger_ratio=0.8, target_ratio=0.5)
```

All ratios are 0-1 fractions of `limit`, the hard budget: the prompt (system prompt, tools and
messages) never goes over it when it can be met without dropping the task.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentctx._check import fraction, got, preview, whole
from agentctx.errors import AgentCtxError, ConfigError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from agentctx.messages import Message

__all__ = ["DEFAULT_RESERVE_OUTPUT", "Budget", "BudgetExceededError", "fraction_from_percent"]


DEFAULT_RESERVE_OUTPUT = 16_000  # tokens kept for the response when nothing says otherwise


class _DefaultReserve(int):
    """The default ``reserve_output``: an int that remembers it was not given, so that the
    request's own ``max_tokens`` can take its place (`Budget.for_output`)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    """Token budget of one session.

    Attributes:
        context_window: the model's context window in tokens.
        reserve_output: tokens kept free for the response. Left at its default (16,000), it
            follows the ``max_tokens`` of each request `wrap` and the middleware see (see
            `for_output`); set it to keep it whatever the requests ask for.
        trigger_ratio: usage fraction of `limit` where background work (summaries) starts.
        target_ratio: usage fraction of `limit` that lossy compaction brings the prompt down to,
            so the next compaction, and the next prefix-cache break, is many turns away. The
            default, 0.1, is where agentctx costs less than its peers on the replayed real
            sessions while every early fact stays visible or one recall away
            (benchmarks/frontier.py); raise it to keep more of the session in view after
            each compaction, at the price of more of them.
        hard_budget: an explicit hard limit below ``context_window - reserve_output``.
    """

    context_window: int
    reserve_output: int = _DefaultReserve(DEFAULT_RESERVE_OUTPUT)
    trigger_ratio: float = 0.75
    target_ratio: float = 0.1
    hard_budget: int | None = None
    limit: int = dataclasses.field(init=False, repr=False, compare=False)
    """The hard budget in tokens: ``context_window - reserve_output``, or ``hard_budget``
    when that is lower."""

    def __post_init__(self) -> None:
        # Every error names the values it got and marks defaults: ``ContextManager(10_000)``
        # fails on the default reserve, which the caller never wrote down.
        whole(self, "context_window", minimum=1)
        whole(self, "reserve_output")
        if self.reserve_output >= self.context_window:
            raise ConfigError(
                "Budget.reserve_output must be smaller than context_window (what is left is "
                f"the prompt's budget); got {got(self, 'reserve_output', 'context_window')}"
            )
        fraction(self, "trigger_ratio")
        fraction(self, "target_ratio")
        if self.target_ratio > self.trigger_ratio:
            raise ConfigError(
                "Budget.target_ratio must not be above trigger_ratio; got "
                + got(self, "target_ratio", "trigger_ratio")
            )
        whole(self, "hard_budget", minimum=1, optional=True)
        cap = self.context_window - self.reserve_output
        # Read several times on every call: kept, not computed each time.
        limit = cap if self.hard_budget is None else min(cap, self.hard_budget)
        object.__setattr__(self, "limit", limit)

    def for_output(self, max_tokens: int) -> Budget:
        """This budget for one request that asks for up to ``max_tokens`` of output.

        ``reserve_output`` becomes ``max_tokens`` (the prompt may take the rest of the window,
        and no more: the API refuses a prompt plus ``max_tokens`` over the window), unless it
        was set explicitly, which keeps it. `wrap` and the middleware call this with the
        request's ``max_tokens`` / ``max_completion_tokens`` / ``max_output_tokens``.
        """
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
            raise ConfigError(f"max_tokens must be a whole number >= 0, got {preview(max_tokens)}")
        if not isinstance(self.reserve_output, _DefaultReserve):
            return self
        if max_tokens >= self.context_window:
            raise ConfigError(
                f"max_tokens={max_tokens} leaves no room for the prompt in the window "
                f"(Budget.context_window={self.context_window}); lower max_tokens, or set "
                "Budget.reserve_output to keep a reserve of your own"
            )
        if max_tokens == self.reserve_output:
            return self
        return dataclasses.replace(self, reserve_output=_DefaultReserve(max_tokens))

    def lowered(self, tokens: int) -> Budget:
        """This budget with its hard limit ``tokens`` lower, its trigger and target where
        they were (as far as the lower limit leaves room for them)."""
        if tokens <= 0:
            return self
        limit = max(1, self.limit - tokens)
        # Half a token up, so int(limit * ratio) gives back the same whole number of tokens.
        trigger = min(1.0, (self.trigger_tokens + 0.5) / limit)
        target = min(trigger, (self.target_tokens + 0.5) / limit)
        return dataclasses.replace(
            self, hard_budget=limit, trigger_ratio=trigger, target_ratio=target
        )

    @property
    def trigger_tokens(self) -> int:
        """Prompt size where background work starts."""
        return int(self.limit * self.trigger_ratio)

    @property
    def target_tokens(self) -> int:
        """Prompt size lossy compaction aims at."""
        return int(self.limit * self.target_ratio)

    def usage_fraction(self, tokens: int) -> float:
        """``tokens`` as a 0-1 (or above, when over) fraction of `limit`."""
        return tokens / self.limit


def fraction_from_percent(percent: float) -> float:
    """Convert a host's 0-100 usage percentage to agentctx's 0-1 fraction."""
    if not isinstance(percent, int | float) or isinstance(percent, bool):
        raise ConfigError(f"usage percentage must be a number, got {preview(percent)}")
    if not math.isfinite(percent) or percent < 0:
        raise ConfigError(f"usage percentage must be a finite number >= 0, got {percent!r}")
    return percent / 100.0


class BudgetExceededError(AgentCtxError):
    """The view is still over the hard budget after every allowed compaction.

    agentctx never drops the task, the latest user message or the newest complete turn
    to fit. The best view it could make is attached, so a caller may still send it.

    Attributes:
        tokens: estimated tokens of ``view``.
        budget: the hard budget in tokens.
        view: the most compact provider-valid view that keeps the task.
        protected: estimated tokens of what may never be compacted: the task, the latest
            user message, the newest complete turn and signed reasoning of the running tool
            loop (with the system prompt and tools); ``None`` when not measured.
        markers: estimated tokens of the markers and briefings in ``view`` that stand for
            what compaction dropped or summarized (a marker keeps its list of files and
            commands whole, up to about 1,400 tokens); ``None`` when not measured.
    """

    def __init__(
        self,
        tokens: int,
        budget: int,
        view: Sequence[Message],
        protected: int | None = None,
        *,
        markers: int | None = None,
    ) -> None:
        self.tokens = tokens
        self.budget = budget
        self.view = list(view)
        self.protected = protected
        self.markers = markers
        if protected is None or protected > budget:
            why = "the task, the latest user message and the newest turn alone do not fit"
            if protected is not None:
                why = why.replace("do not fit", f"take {protected}")
        else:
            why = f"the task, the latest user message and the newest turn take {protected}"
            if markers:
                why += (
                    f"; the markers and briefings standing for what was dropped or summarized "
                    f"take {markers} (each keeps its list of files and commands whole)"
                )
            if tokens > protected + (markers or 0):
                why += (
                    "; the rest is what the strategy does not cut (a custom strategy, or one "
                    "that only clears tool output) or cannot (signed reasoning of the running "
                    "tool loop and the results it needs, images)"
                )
        super().__init__(
            f"history needs {tokens} tokens after compaction, budget is {budget}; {why}"
        )
