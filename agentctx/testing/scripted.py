"""`ScriptedSummarizer`: a `Summarizer` that plays back scripted outcomes and records requests.

```python
from agentctx.testing.scripted import Outcome, ScriptedSummarizer

summarizer = ScriptedSummarizer(
    [
        Outcome.fail(status=429, retry_after=2.0),         # retryable, with Retry-After
        Outcome.reply(BRIEFING, delay=0.05),               # answers after 50 ms
        Outcome.reply("## Goal\\nhalf", stop_reason="length"),
        Outcome.hang(),                                    # never answers (until cancelled)
    ],
    default=BRIEFING,                                      # once the script runs out
)
...
assert [r.attempt for r in summarizer.requests] == [1, 2, 1, 1]
```

Each call to `summarize` takes the next outcome (``default`` when the script is used up; with
no default that is a non-retryable `SummarizerError`). A plain string is a reply with that text.
Replies without explicit usage are billed like a provider would roughly bill them: a token per
four characters of prompt in, of text out.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import anyio

from agentctx.errors import SummarizerError
from agentctx.messages import Usage
from agentctx.summarizer import SummaryRequest, SummaryResult, is_retryable_status

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable

    from agentctx.summarizer import StopReason

__all__ = ["Outcome", "ScriptedSummarizer"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """One scripted answer: a reply, or an error, after an optional delay (or never).

    Build them with `reply`, `fail` and `hang`.
    """

    text: str = ""
    stop_reason: StopReason = "stop"
    usage: Usage | None = None
    model: str | None = None
    error: SummarizerError | None = None
    delay: float | Literal["hang"] | None = None

    @classmethod
    def reply(
        cls,
        text: str,
        *,
        stop_reason: StopReason = "stop",
        usage: Usage | None = None,
        model: str | None = None,
        delay: float | None = None,
    ) -> Outcome:
        """Answer ``text`` with ``stop_reason`` after ``delay`` seconds."""
        return cls(text=text, stop_reason=stop_reason, usage=usage, model=model, delay=delay)

    @classmethod
    def fail(
        cls,
        *,
        status: int | None = 500,
        retryable: bool | None = None,
        retry_after: float | None = None,
        message: str = "",
        delay: float | None = None,
        usage: Usage | None = None,
    ) -> Outcome:
        """Raise `SummarizerError` after ``delay``; ``retryable`` defaults from ``status``;
        ``usage``: what the reply that could not be used was billed."""
        if retryable is None:
            retryable = is_retryable_status(status)
        error = SummarizerError(
            message or f"scripted failure (HTTP {status})",
            retryable=retryable,
            status=status,
            retry_after=retry_after,
            usage=usage,
        )
        return cls(error=error, delay=delay)

    @classmethod
    def hang(cls) -> Outcome:
        """Never answer: the request waits until it is cancelled or times out."""
        return cls(delay="hang")


class ScriptedSummarizer:
    """A `Summarizer` for tests and demos that follows a script.

    Args:
        script: outcomes (or reply texts) handed out in order, one per call.
        default: the outcome (or reply text) once the script is used up.
        model: reported as the result's model when the outcome names none (``None``: no
            model, so cost is unknown unless a price is configured).
        sleep: the async sleep used for delays (default ``anyio.sleep``).

    Attributes:
        requests: every request received, in order (retries included).
        completed: calls that returned a result.
        failed: calls that raised `SummarizerError`.
        cancelled: calls cancelled while waiting (manager closed, timeout).
        in_flight: calls running right now.
    """

    def __init__(
        self,
        script: Iterable[Outcome | str] = (),
        *,
        default: Outcome | str | None = None,
        model: str | None = "scripted-summarizer",
        sleep: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        self._script: deque[Outcome] = deque(_outcome(o) for o in script)
        self.default = _outcome(default) if default is not None else None
        self.model = model
        self._sleep = sleep or anyio.sleep
        self.requests: list[SummaryRequest] = []
        self.completed = 0
        self.failed = 0
        self.cancelled = 0
        self.in_flight = 0

    def push(self, *outcomes: Outcome | str) -> None:
        """Append outcomes to the script."""
        self._script.extend(_outcome(o) for o in outcomes)

    @property
    def pending(self) -> int:
        """Scripted outcomes not used yet."""
        return len(self._script)

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        """Record ``request`` and play the next outcome."""
        self.requests.append(request)
        outcome = self._script.popleft() if self._script else self.default
        if outcome is None:
            self.failed += 1
            raise SummarizerError("the script is used up", retryable=False)
        self.in_flight += 1
        try:
            if outcome.delay == "hang":
                await anyio.sleep_forever()
            elif outcome.delay is not None:
                await self._sleep(outcome.delay)
        except anyio.get_cancelled_exc_class():
            self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1
        error = outcome.error
        if error is not None:
            self.failed += 1
            # A fresh instance per call: a default failure is raised many times.
            raise SummarizerError(
                str(error),
                retryable=error.retryable,
                status=error.status,
                retry_after=error.retry_after,
                usage=error.usage,
            )
        self.completed += 1
        usage = outcome.usage
        if usage is None:
            usage = Usage(
                input_tokens=(len(request.system) + len(request.prompt)) // 4 + 1,
                output_tokens=len(outcome.text) // 4 + 1,
            )
        return SummaryResult(
            text=outcome.text,
            stop_reason=outcome.stop_reason,
            usage=usage,
            model=outcome.model or self.model,
        )


def _outcome(value: Outcome | str) -> Outcome:
    return Outcome.reply(value) if isinstance(value, str) else value
