"""`AnthropicSummarizer`: a `Summarizer` on the Anthropic Messages API.

```python
from agentctx.providers.anthropic_summarizer import AnthropicSummarizer
from agentctx.strategies.llm import LlmCompaction

summarizer = AnthropicSummarizer("claude-haiku-5-5")
strategy = Chain([LlmCompaction(summarizer), DeterministicCompaction()])
```

One non-streamed ``messages.create`` per request: the request's system prompt, its prompt as
the only user message, no tools, no prompt caching. The SDK's own retries are off
(``max_retries=0``, also on a client you pass in, through ``with_options``): `LlmCompaction`
decides about retries. SDK errors become `SummarizerError` in one place (`summarizer_error`);
cancellation is never caught.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentctx._usage import read_usage
from agentctx.errors import MissingExtraError
from agentctx.providers._client import (
    UNREADABLE,
    ClientOwner,
    read_reply,
    retryless,
    summarizer_error,
)
from agentctx.providers._request_options import check_request_options
from agentctx.summarizer import SummaryResult, normalize_stop_reason

try:
    import anthropic
    from anthropic import AsyncAnthropic
except ImportError as exc:
    raise MissingExtraError("anthropic", exc.name, needed_by=__name__) from exc

if TYPE_CHECKING:
    from collections.abc import Mapping

    from anthropic.types import Message as SDKMessage

    from agentctx.summarizer import SummaryRequest

__all__ = ["DEFAULT_MODEL", "AnthropicSummarizer"]

DEFAULT_MODEL = "claude-haiku-5-5"


class AnthropicSummarizer(ClientOwner):
    """Summarizes on an Anthropic model (default ``claude-haiku-5-5``).

    Args:
        model: the model to send requests to; also used for pricing.
        client: an `anthropic.AsyncAnthropic` to use (a copy with ``max_retries=0`` is made;
            the caller keeps ownership and closes it). Default: one made from ``api_key``,
            ``base_url`` and ``timeout``, closed by `aclose`.
        api_key: for the client made here (``None``: the SDK's environment default).
        base_url: for the client made here (``None``: the SDK's environment default).
        max_tokens: cap on the briefing's output tokens; ``None`` uses the request's
            ``max_tokens`` (`LlmCompactionConfig.max_summary_tokens`).
        timeout: the HTTP timeout in seconds (``None``: the SDK's default). `LlmCompaction`
            bounds every attempt with its own ``timeout`` too.
        request_options: more arguments for every request, e.g. ``{"output_config":
            {"effort": "low"}}``: on models that think by default (Haiku 5.5) thinking counts
            against the cap, and a briefing cut short is rejected.
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        client: AsyncAnthropic | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        max_tokens: int | None = None,
        timeout: float | None = None,
        request_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.max_tokens = max_tokens
        self._owned = client is None
        self.client = retryless(AsyncAnthropic, client, api_key, base_url, timeout)
        self.request_options = check_request_options(
            self.client.messages.create,
            request_options or {},
            frozenset({"model", "max_tokens", "system", "messages"}),
        )

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        """Send ``request`` once; raise `SummarizerError` when the API call fails."""
        try:
            message = await self.client.messages.create(
                model=self.model,
                max_tokens=self.max_tokens if self.max_tokens is not None else request.max_tokens,
                system=request.system,
                messages=[{"role": "user", "content": request.prompt}],
                **self.request_options,
            )
        except (anthropic.APIError, *UNREADABLE) as exc:
            raise summarizer_error(anthropic, exc) from exc
        return read_reply(anthropic, lambda: _to_result(message), lambda: message.usage)


def _to_result(message: SDKMessage) -> SummaryResult:
    text = "".join(block.text for block in message.content if block.type == "text")
    usage, known = read_usage(message.usage)  # as the other summarizers read it
    return SummaryResult(
        text=text,
        stop_reason=normalize_stop_reason(message.stop_reason),
        usage=usage,
        model=message.model,
        usage_known=known,
    )
