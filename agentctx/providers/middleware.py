"""Model-call middleware: ``(request, call_next) -> response`` for loops and frameworks.

```python
middleware = as_middleware(ctx, "anthropic")          # or "openai-chat", "openai-responses"

async def call_model(request: dict) -> Any:           # your own call, e.g. the SDK
    return await client.messages.create(**request)

response = await middleware({"model": ..., "max_tokens": ..., "messages": history}, call_model)
```

The request is the SDK call's keyword arguments. Its ``messages`` (or ``input``) are compacted
exactly as `wrap` does (projection mode, byte-stable when nothing new was decided; leading
system/developer messages untouched); every other key passes through; its ``max_tokens``
(``max_completion_tokens``, ``max_output_tokens``) is the call's output reserve unless
``Budget.reserve_output`` was set; the response's usage (an SDK object or a plain dict) is
recorded with ``manager.observe``. A prompt the provider refuses as longer than its context
window (``call_next`` raises the SDK's error saying so) is observed and compacted to fit, and
``call_next`` is called once more with it. A request sent as it is (a Responses call continuing
server-side state, a string input) counts no view of the session: its usage is spent, not
calibrated on (``observe(..., calibrate=False)``). Streams are not observed:
``ctx.observe(final)`` with the stream's final message records them, with
``calibrate=False`` for a request sent as it is. ``cache_breakpoints=True`` places
Anthropic ``cache_control`` breakpoints as `wrap` does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from agentctx.errors import UnsupportedMessageError
from agentctx.providers._convert import Provider, attempt
from agentctx.providers._native import NativeChecked, check_native

if TYPE_CHECKING:
    from agentctx.manager import ContextManager

__all__ = ["Middleware", "Provider", "as_middleware"]

CallNext = Callable[[dict[str, Any]], Awaitable[Any]]
Middleware = Callable[[Mapping[str, Any], CallNext], Awaitable[Any]]


def as_middleware(
    manager: ContextManager, provider: Provider, *, cache_breakpoints: bool = False
) -> Middleware:
    """The middleware form of `wrap` for ``provider``'s request format (a ``manager`` that
    compacts with another API's native compaction is refused with `ConfigError`, as by
    `wrap`)."""
    compactor = NativeChecked(manager, provider, cache_breakpoints=cache_breakpoints)
    check_native(manager, (provider,))  # (after the compactor, which refuses an unknown one)

    async def middleware(request: Mapping[str, Any], call_next: CallNext) -> Any:
        if not isinstance(request, Mapping):
            raise UnsupportedMessageError(
                None, f"request of type {type(request).__name__} (the SDK call's keyword arguments)"
            )
        response, outgoing = await attempt(compactor, request, call_next)
        if not request.get("stream"):
            compactor.record(response, calibrate=outgoing.view is not None)
        return response

    return middleware
