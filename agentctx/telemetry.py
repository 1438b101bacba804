"""Tracing hooks: what a `ContextManager` tells a tracer, when it is given one.

```python
from agentctx.integrations.otel import OtelTracer  # extra "otel"; or your own `Tracer`

async with ContextManager(budget, strategy=strategy, tracer=OtelTracer()) as ctx:
    view = await ctx.prepare(history)
```

Without a tracer nothing here runs beyond a check or two per call. With one:

- each `ContextManager.prepare` call that took a decision, emitted an event, started a
  summarizer request or raised is handed to `Tracer.prepared` once it has ended, as a
  `PrepareCall` (times, sizes before and after, the events it emitted);
- each summarizer request attempt runs inside `Tracer.attempt`, which gets a
  `SummarizerAttempt` (the request; its result, usage and cost once back; any exception
  passes through it). The attempt runs in the background task the prepare call started, and
  names that call in `SummarizerAttempt.started_by`.

A tracer that raises never reaches the agent loop: its errors are logged.
"""

from __future__ import annotations

import contextlib
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from agentctx._log import log

if TYPE_CHECKING:
    from collections.abc import Iterator
    from contextlib import AbstractContextManager

    from agentctx.events import Event
    from agentctx.ledger import Decision
    from agentctx.manager import ContextManager
    from agentctx.pricing import Price
    from agentctx.strategy import CompactionContext
    from agentctx.summarizer import Summarizer, SummaryRequest, SummaryResult

__all__ = ["PrepareCall", "SummarizerAttempt", "Tracer"]


@runtime_checkable
class Tracer(Protocol):
    """What `ContextManager(..., tracer=...)` reports to (`agentctx.integrations.otel.OtelTracer`
    implements it with OpenTelemetry)."""

    def prepared(self, call: PrepareCall) -> None:
        """Record ``call``, which has ended. May set ``call.handle`` to something the
        summarizer attempts it started find in ``attempt.started_by.handle`` (a span's
        context, to link to)."""

    def attempt(self, attempt: SummarizerAttempt) -> AbstractContextManager[object]:
        """A context manager around one summarizer request attempt; ``attempt.result`` is
        set inside it when a reply came back, and a failure leaves it as an exception."""


@dataclass(slots=True, kw_only=True)
class PrepareCall:
    """One `ContextManager.prepare` call, as a tracer sees it. Times are epoch nanoseconds;
    the ``events`` are ``(time, event)`` pairs, in the order they were emitted.
    ``messages_after`` is ``None`` for a call that returned no view (``error`` says why: an
    exception, or the call's cancellation)."""

    session_id: str
    strategy: str
    start_ns: int
    end_ns: int = 0
    messages_before: int = 0
    messages_after: int | None = None
    tokens_before: int = 0
    tokens_after: int = 0
    budget_limit: int = 0
    decisions: int = 0
    requests_started: int = 0
    events: list[tuple[int, Event]] = field(default_factory=list)
    error: BaseException | None = None
    handle: object = None
    _taken: list[Decision] | None = None
    _started: bool = False

    def start(self, ctx: CompactionContext, tokens: int, limit: int) -> None:
        """The manager calls this before the strategy runs: what the call starts from."""
        self.messages_before = len(ctx.view)
        self.tokens_before = tokens
        self.budget_limit = limit
        self._taken = ctx.taken
        self._started = True

    @property
    def started(self) -> bool:
        """Whether the call got as far as its strategy (`start`): a call that failed before
        (a history it refused) has no messages, tokens or budget measured."""
        return self._started

    @property
    def eventful(self) -> bool:
        """Whether there is anything to record (otherwise the tracer is not called)."""
        return bool(
            self.decisions or self.events or self.requests_started or self.error is not None
        )


@dataclass(slots=True, kw_only=True)
class SummarizerAttempt:
    """One attempt at a summarizer request. ``model`` is the model asked for (the
    summarizer's ``model`` attribute, when it has one); ``messages`` the view messages the
    briefing is to replace; ``result`` the reply, once back."""

    summarizer: Summarizer
    request: SummaryRequest
    attempt: int
    model: str | None
    price: Price | None
    started_by: PrepareCall | None
    start_ns: int
    result: SummaryResult | None = None

    @property
    def response_model(self) -> str | None:
        """The model that answered, as the provider named it (else the requested one)."""
        return (self.result.model if self.result is not None else None) or self.model

    @property
    def cost_usd(self) -> float | None:
        """What the reply cost, as `LlmCompaction.spend` counts it; ``None`` when unknown."""
        from agentctx.pricing import price_for

        if self.result is None or not self.result.usage_known:
            return None
        price = self.price if self.price is not None else price_for(self.response_model)
        return price.reply_cost(self.result.usage) if price is not None else None


# Set while a traced prepare() runs: background tasks started meanwhile (a summarizer
# request) copy it with the rest of the context, and so know their tracer and call.
_current: ContextVar[tuple[Tracer, PrepareCall] | None] = ContextVar("agentctx_trace", default=None)


@contextlib.contextmanager
def prepare_call(tracer: Tracer, manager: ContextManager) -> Iterator[PrepareCall]:
    """Around one traced `ContextManager.prepare` call (the manager uses this)."""
    from agentctx.budget import BudgetExceededError

    call = PrepareCall(
        session_id=manager.session_id,
        strategy=type(manager.strategy).__name__,
        start_ns=time.time_ns(),
    )
    unsubscribe = manager.subscribe(lambda e: call.events.append((time.time_ns(), e)))
    token = _current.set((tracer, call))
    try:
        yield call
    except BudgetExceededError as e:
        call.error = e
        call.messages_after = len(e.view)
        raise
    except BaseException as e:  # a cancellation too: the call returned no view
        call.error = e
        raise
    finally:
        _current.reset(token)
        unsubscribe()
        call.end_ns = time.time_ns()
        if call.started:  # else nothing was counted (the count itself may be what failed)
            call.tokens_after = manager.prompt_tokens
        if call._taken is not None:
            call.decisions, call._taken = len(call._taken), None
        if call.eventful:
            try:
                tracer.prepared(call)
            except Exception:
                log.exception("tracer failed to record a prepare call")


def request_started() -> None:
    """A summarizer request was started by the traced prepare call running now, if any."""
    current = _current.get()
    if current is not None:
        current[1].requests_started += 1


class _Untraced:
    __slots__ = ()

    def __enter__(self) -> _Untraced:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    @property
    def result(self) -> None:
        return None

    @result.setter
    def result(self, value: object) -> None:
        pass


_UNTRACED = _Untraced()


def attempt(
    summarizer: Summarizer, price: Price | None, request: SummaryRequest, number: int
) -> AbstractContextManager[Any]:
    """Around one summarizer request attempt (`Requester` uses this): set ``.result`` on what
    it yields once the reply is back. Does nothing unless a traced prepare started it."""
    current = _current.get()
    if current is None:
        return _UNTRACED
    tracer, call = current
    model = getattr(summarizer, "model", None)
    record = SummarizerAttempt(
        summarizer=summarizer,
        request=request,
        attempt=number,
        model=model if isinstance(model, str) else None,
        price=price,
        started_by=call,
        start_ns=time.time_ns(),
    )
    return _guarded(tracer, record)


@contextlib.contextmanager
def _guarded(tracer: Tracer, record: SummarizerAttempt) -> Iterator[SummarizerAttempt]:
    # The tracer's own failures are logged; the request's exceptions pass through as they are.
    try:
        inner = tracer.attempt(record)
        inner.__enter__()
    except Exception:
        log.exception("tracer failed to start a summarizer span")
        yield record
        return
    try:
        yield record
    except BaseException as e:
        try:
            inner.__exit__(type(e), e, e.__traceback__)
        except Exception as failed:
            if failed is not e:
                log.exception("tracer failed to end a summarizer span")
        raise
    else:
        try:
            inner.__exit__(None, None, None)
        except Exception:
            log.exception("tracer failed to end a summarizer span")
