"""agentctx in OpenTelemetry traces: a span per deciding `prepare` call and per summarizer request.

```python
from agentctx import Budget, ContextManager
from agentctx.integrations.otel import OtelTracer

async with ContextManager(Budget(context_window=200_000), tracer=OtelTracer()) as ctx:
    view = await ctx.prepare(history)  # inside your own span, if you have one
```

`OtelTracer` (extra ``otel``) sends spans to the global tracer provider, or to the one you pass
(``OtelTracer(provider)``). Without a tracer, or without the extra, agentctx makes no spans
and imports no OpenTelemetry.

- ``agentctx.prepare``: one span per `ContextManager.prepare` call that took a decision,
  emitted an event, started a summarizer request or raised (a call that does nothing makes
  none), in the caller's current span. It is recorded when the call ends, with the call's
  start and end times. Attributes: ``agentctx.strategy``, ``agentctx.budget.limit``,
  ``agentctx.messages.before`` / ``.after``, ``agentctx.tokens.before`` / ``.after`` (the
  view's prompt estimate before and after the call's decisions; the budget, messages and
  tokens are left out of a call that failed before its strategy ran), ``agentctx.decisions``,
  ``agentctx.summary.requests_started`` and ``gen_ai.conversation.id`` (the session id).
  Each event emitted during the call is a span event named by its JSON ``type``
  (``contextCompacted``, ``budgetExceeded``, ``compactionWarning``...) with the fields of
  its ``to_json()`` as attributes, nested ones joined by dots (``summary.costUsd``) and
  ``null`` ones left out. A call that raised (`BudgetExceededError`) or was cancelled has
  status ``ERROR`` and ``error.type`` (for a cancellation, its exception's class, such as
  ``asyncio.exceptions.CancelledError``: the call returned no view, and has no
  ``agentctx.messages.after``).
- ``chat {model}``: one span per summarizer request attempt (retries are attempts), of kind
  ``CLIENT``, following the OpenTelemetry GenAI semantic conventions:
  ``gen_ai.operation.name`` (``chat``), ``gen_ai.provider.name`` (``anthropic`` or
  ``openai`` for agentctx's own summarizers), ``gen_ai.request.model``,
  ``gen_ai.request.max_tokens``, ``gen_ai.response.model``,
  ``gen_ai.response.finish_reasons``, ``gen_ai.usage.input_tokens`` (cached tokens
  included), ``gen_ai.usage.output_tokens``, ``gen_ai.usage.cache_read.input_tokens``,
  ``gen_ai.usage.cache_creation.input_tokens``; plus ``agentctx.cost_usd`` (left out when
  the price is unknown), ``agentctx.summary.messages`` and ``agentctx.summary.attempt``. A
  failed attempt (error, timeout, malformed reply) has status ``ERROR`` and ``error.type``
  (the exception's class), and ``http.response.status_code`` when there was one. The
  request runs in the background: its span is a child of the span that was current when
  ``prepare`` started it, and links to that call's ``agentctx.prepare`` span.

Every attribute is one OpenTelemetry exports: text (a tool's name in an action, a server's
model name, an error's message) at most 4,096 characters and valid UTF-8, an integer past
64 bits as text, a NaN or infinite number left out, a list at most 128 items.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentctx import __version__
from agentctx.errors import MissingExtraError, SummarizerError
from agentctx.messages import sendable_text

try:
    from opentelemetry import trace
    from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode
except ImportError as exc:
    raise MissingExtraError("otel", exc.name, needed_by=__name__) from exc

if TYPE_CHECKING:
    from collections.abc import Iterator

    from opentelemetry.util.types import AttributeValue

    from agentctx.telemetry import PrepareCall, SummarizerAttempt

__all__ = ["PREPARE_SPAN", "OtelTracer"]

PREPARE_SPAN = "agentctx.prepare"
"""The name of the span of a `prepare` call."""


class OtelTracer:
    """An `agentctx.telemetry.Tracer` that makes OpenTelemetry spans (see the module docs).

    Pass it as ``ContextManager(..., tracer=OtelTracer())``; one can serve many sessions.

    Args:
        tracer_provider: where the spans go; default: the global tracer provider
            (``opentelemetry.trace.set_tracer_provider``).
    """

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self._tracer = trace.get_tracer("agentctx", __version__, tracer_provider)

    def prepared(self, call: PrepareCall) -> None:
        """Record the span of a `prepare` call that has ended."""
        attributes: dict[str, AttributeValue] = {
            "gen_ai.conversation.id": call.session_id,
            "agentctx.strategy": call.strategy,
            "agentctx.decisions": call.decisions,
            "agentctx.summary.requests_started": call.requests_started,
        }
        if call.started:  # else the call failed before anything was measured (not zeros)
            attributes["agentctx.budget.limit"] = call.budget_limit
            attributes["agentctx.messages.before"] = call.messages_before
            attributes["agentctx.tokens.before"] = call.tokens_before
            attributes["agentctx.tokens.after"] = call.tokens_after
        if call.messages_after is not None:
            attributes["agentctx.messages.after"] = call.messages_after
        span = self._tracer.start_span(
            PREPARE_SPAN,
            kind=SpanKind.INTERNAL,
            attributes=_bounded(attributes),
            start_time=call.start_ns,
        )
        for at, event in call.events:
            data = event.to_json()
            name = _as_text(data.pop("type"))
            span.add_event(_text(name), attributes=_bounded(_flatten(data)), timestamp=at)
        if call.error is not None:
            _failed(span, call.error)
        span.end(end_time=call.end_ns)
        call.handle = span.get_span_context()

    @contextlib.contextmanager
    def attempt(self, attempt: SummarizerAttempt) -> Iterator[None]:
        """The span of one summarizer request attempt, current while it runs."""
        request = attempt.request
        attributes: dict[str, AttributeValue] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.max_tokens": request.max_tokens,
            "agentctx.summary.messages": request.messages,
            "agentctx.summary.attempt": attempt.attempt,
        }
        if attempt.model is not None:
            attributes["gen_ai.request.model"] = attempt.model
        if (provider := _provider(attempt)) is not None:
            attributes["gen_ai.provider.name"] = provider
        links = []
        call = attempt.started_by
        if call is not None:
            attributes["gen_ai.conversation.id"] = call.session_id
            if isinstance(call.handle, SpanContext):
                links.append(Link(call.handle))
        name = _text(f"chat {attempt.model}" if attempt.model else "chat")
        span = self._tracer.start_span(
            name, kind=SpanKind.CLIENT, attributes=_bounded(attributes), links=links
        )
        # Current while the request runs, so an instrumented HTTP client nests under it.
        with trace.use_span(
            span, end_on_exit=True, record_exception=False, set_status_on_exception=False
        ):
            try:
                yield
            except BaseException as e:
                _failed(span, e)
                raise
            result = attempt.result
            if result is None:
                return
            usage = result.usage
            attributes = {
                "gen_ai.response.finish_reasons": (result.stop_reason,),
                "gen_ai.usage.input_tokens": usage.prompt_tokens,
                "gen_ai.usage.output_tokens": usage.output_tokens,
                "gen_ai.usage.cache_read.input_tokens": usage.cache_read_tokens,
                "gen_ai.usage.cache_creation.input_tokens": usage.cache_write_tokens,
            }
            if (model := attempt.response_model) is not None:
                attributes["gen_ai.response.model"] = model
            if (cost := attempt.cost_usd) is not None:
                attributes["agentctx.cost_usd"] = cost
            span.set_attributes(_bounded(attributes))


def _provider(attempt: SummarizerAttempt) -> str | None:
    """``gen_ai.provider.name`` for agentctx's own summarizers (by the module they live in)."""
    module = type(attempt.summarizer).__module__
    for provider in ("anthropic", "openai"):
        if module.startswith(f"agentctx.providers.{provider}"):
            return provider
    return None


def _failed(span: trace.Span, error: BaseException) -> None:
    kind = type(error)
    name = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    attributes: dict[str, object] = {"error.type": name}
    if isinstance(error, SummarizerError) and error.status is not None:
        attributes["http.response.status_code"] = error.status
    span.set_attributes(_bounded(attributes))
    span.set_status(Status(StatusCode.ERROR, _text(f"{kind.__name__}: {error}")))


# What one attribute may hold: the text of model- and server-written fields (a tool's name,
# a response's model, an error's message) is bounded, and made valid UTF-8, which an OTLP
# exporter needs (a lone surrogate fails the whole batch).
_MOST_CHARS = 4096
_MOST_ITEMS = 128
_INT64 = range(-(2**63), 2**63)


def _text(value: str) -> str:
    value = sendable_text(value)
    return value if len(value) <= _MOST_CHARS else value[: _MOST_CHARS - 1] + "…"


def _bounded(attributes: Mapping[str, object]) -> dict[str, AttributeValue]:
    """``attributes`` as OpenTelemetry exports them: text bounded and valid, integers within
    64 bits (else as text), no NaN or infinity, at most `_MOST_ITEMS` items a list."""
    out: dict[str, AttributeValue] = {}
    for name, value in attributes.items():
        key = _text(_as_text(name))  # a custom event's keys are anyone's text too
        if isinstance(value, str):
            out[key] = _text(value)
        elif isinstance(value, bool):
            out[key] = value
        elif isinstance(value, int):
            out[key] = value if value in _INT64 else _text(_integer(value))
        elif isinstance(value, float):
            if math.isfinite(value):
                out[key] = value
        elif isinstance(value, tuple) and all(isinstance(v, str) for v in value):
            out[key] = tuple(_text(v) for v in value[:_MOST_ITEMS])
        elif value is not None:
            out[key] = _text(_as_text(value))
    return out


def _as_text(value: object) -> str:
    try:
        return str(value)
    except ValueError:  # it holds an integer too long to format
        return f"<{type(value).__name__}>"


def _integer(value: int) -> str:
    """An integer past 64 bits as text (one past about 4,300 digits is not formatted)."""
    return str(value) if value.bit_length() < 14_000 else f"<{value.bit_length()}-bit integer>"


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """An event's JSON fields as span attributes: nested objects joined by dots, ``null``
    left out, lists of strings as they are (anything else as its string)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = prefix + _as_text(key)
        if value is None:
            continue
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{name}."))
        elif isinstance(value, str | bool | int | float):
            out[name] = value
        elif isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
            out[name] = tuple(value)
        else:
            out[name] = _as_text(value)
    return out
