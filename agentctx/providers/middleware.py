"""Model-call middleware: ``(request, call_next) -> response`` for loops and frameworks.

```python
middleware = as_middleware(ctx, "anthropic")          # or "openai-chat", "openai-responses"

async def call_model(request: dict) -> Any:           # your own call, e.g. the SDK
    return await client.messages.create(**request)

response = await middleware({"model": ..., "max_tokens": ..., "messages": history}, call_model)
```

The request is the SDK call's keyword arguments. Its ``messages`` (or ``input``) are compacted
exactly as `wrap` does (projection mode, byte-stable when nothing new was decided; leading
system/developer messages untouched); every other key passes through; the response's usage
(an SDK object or a plain dict) is recorded with ``manager.observe``. Streams are not observed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from agentctx.adapters import (
    from_anthropic,
    from_openai_chat,
    from_openai_responses,
    message_from_anthropic_response,
    message_from_openai_chat_response,
    message_from_openai_response,
    split_openai_chat_system,
    split_openai_responses_system,
    to_anthropic,
    to_openai_chat,
    to_openai_responses,
)
from agentctx.errors import ConfigError
from agentctx.providers._stream import event_dict

if TYPE_CHECKING:
    from agentctx.manager import ContextManager

__all__ = ["Middleware", "as_middleware"]

Provider = Literal["anthropic", "openai-chat", "openai-responses"]
CallNext = Callable[[dict[str, Any]], Awaitable[Any]]
Middleware = Callable[[Mapping[str, Any], CallNext], Awaitable[Any]]


def as_middleware(manager: ContextManager, provider: Provider) -> Middleware:
    """The middleware form of `wrap` for ``provider``'s request format."""
    if provider not in ("anthropic", "openai-chat", "openai-responses"):
        raise ConfigError(f"unknown provider {provider!r}")
    key = "input" if provider == "openai-responses" else "messages"

    async def middleware(request: Mapping[str, Any], call_next: CallNext) -> Any:
        outgoing = dict(request)
        history = request.get(key)
        if isinstance(history, list) and not request.get("previous_response_id"):
            outgoing[key] = await _compact(manager, provider, history)
        response = await call_next(outgoing)
        if not request.get("stream"):
            data = response if isinstance(response, Mapping) else event_dict(response)
            usage = _read(provider, data).usage if data else None
            if usage is not None:
                manager.observe(usage)
        return response

    return middleware


async def _compact(manager: ContextManager, provider: Provider, history: list[Any]) -> list[Any]:
    if provider == "anthropic":
        return to_anthropic(await manager.prepare(from_anthropic(history)))
    if provider == "openai-chat":
        system, rest = split_openai_chat_system(history)
        view = to_openai_chat(await manager.prepare(from_openai_chat(rest)))
        return [*system, *view]
    system, rest = split_openai_responses_system(history)
    view = to_openai_responses(await manager.prepare(from_openai_responses(rest)))
    return [*system, *view]


def _read(provider: Provider, data: Mapping[str, Any]) -> Any:
    if provider == "anthropic":
        return message_from_anthropic_response(data)
    if provider == "openai-chat":
        return message_from_openai_chat_response(data)
    return message_from_openai_response(data)
