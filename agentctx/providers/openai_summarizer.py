"""Summarizers on OpenAI APIs: `OpenAIChatSummarizer` (Chat Completions, so any
OpenAI-compatible server: vLLM, llama.cpp, Ollama, ... through ``base_url``) and
`OpenAIResponsesSummarizer` (the Responses API).

```python
from agentctx.providers.openai_summarizer import OpenAIChatSummarizer

local = OpenAIChatSummarizer("qwen2.5-7b-instruct", base_url="http://127.0.0.1:8000/v1")
config = LlmCompactionConfig.small_model(context_window=32_768)   # the model's window
```

A local server needs no key: with a ``base_url`` that is not OpenAI's and no ``api_key``
(nor ``OPENAI_API_KEY``), the client is made with the placeholder `LOCAL_API_KEY`.

One non-streamed request per summary: the request's system prompt, its prompt as the only
user message, no tools, nothing stored. The SDK's own retries are off (``max_retries=0``,
also on a client you pass in, through ``with_options``): `LlmCompaction` decides about
retries. SDK errors become `SummarizerError` in one place (`summarizer_error`); cancellation is
never caught. Usage is reported Anthropic-style: OpenAI counts cached tokens inside the
prompt, so ``input_tokens`` is the prompt minus the cached tokens, which are
``cache_read_tokens``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

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
    import openai
    from openai import AsyncOpenAI
except ImportError as exc:
    raise MissingExtraError("openai", exc.name, needed_by=__name__) from exc

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from openai.types.chat import ChatCompletion
    from openai.types.responses import Response

    from agentctx.summarizer import StopReason, SummaryRequest

__all__ = ["LOCAL_API_KEY", "OpenAIChatSummarizer", "OpenAIResponsesSummarizer"]

LOCAL_API_KEY = "agentctx-local-no-key"
"""The key sent to a server other than OpenAI's when none was given: the SDK refuses to make
a client without one, and local servers (llama.cpp, Ollama, vLLM) accept any."""


def local_api_key(api_key: str | None, base_url: str | None) -> str | None:
    """``api_key``, or `LOCAL_API_KEY` when there is none (argument or ``OPENAI_API_KEY``) and
    ``base_url`` points somewhere other than OpenAI; never for OpenAI's own endpoint, where
    the SDK's "Missing credentials" is the right answer."""
    if api_key is not None or base_url is None or os.environ.get("OPENAI_API_KEY"):
        return api_key
    host = (urlsplit(base_url).hostname or "").lower()
    if host == "openai.com" or host.endswith(".openai.com"):
        return api_key
    return LOCAL_API_KEY


class _OpenAISummarizer(ClientOwner):
    """Client handling shared by both summarizers."""

    def __init__(
        self,
        model: str,
        *,
        client: AsyncOpenAI | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        max_tokens: int | None = None,
        timeout: float | None = None,
        request_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.max_tokens = max_tokens
        self._owned = client is None
        if client is None:
            api_key = local_api_key(api_key, base_url)
        self.client = retryless(AsyncOpenAI, client, api_key, base_url, timeout)
        method, reserved = self._endpoint()
        self.request_options = check_request_options(method, request_options or {}, reserved)

    def _endpoint(self) -> tuple[Callable[..., Any], frozenset[str]]:
        """The SDK method requests go to, and the arguments the summarizer sets itself."""
        raise NotImplementedError

    def _limit(self, request: SummaryRequest) -> int:
        return self.max_tokens if self.max_tokens is not None else request.max_tokens


class OpenAIChatSummarizer(_OpenAISummarizer):
    """Summarizes through Chat Completions, on OpenAI or any compatible server.

    Args:
        model: the model to send requests to; also used for pricing.
        client: an `openai.AsyncOpenAI` to use (a copy with ``max_retries=0`` is made; the
            caller keeps ownership and closes it). Default: one made from ``api_key``,
            ``base_url`` and ``timeout``, closed by `aclose`.
        api_key: for the client made here (``None``: the SDK's environment default,
            ``OPENAI_API_KEY``; with neither, and a ``base_url`` that is not OpenAI's, the
            placeholder `LOCAL_API_KEY`: local servers need no key).
        base_url: for the client made here (``None``: the SDK's environment default). Point
            it at any OpenAI-compatible server (``.../v1``); set
            `LlmCompactionConfig.summarizer_context_window` to its model's window (or use
            `LlmCompactionConfig.small_model`), so requests fit it.
        max_tokens: cap on the briefing's output tokens; ``None`` uses the request's.
        timeout: the HTTP timeout in seconds (``None``: the SDK's default).
        request_options: more arguments for every request, e.g. ``{"reasoning_effort":
            "low"}`` for a reasoning model (whose reasoning counts against the cap).
        token_limit_param: the request field carrying the cap: ``max_completion_tokens``
            (OpenAI's current name, required by its reasoning models) or ``max_tokens``
            (older OpenAI-compatible servers).
    """

    def __init__(
        self,
        model: str,
        *,
        client: AsyncOpenAI | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        max_tokens: int | None = None,
        timeout: float | None = None,
        request_options: Mapping[str, Any] | None = None,
        token_limit_param: Literal["max_completion_tokens", "max_tokens"] = (
            "max_completion_tokens"
        ),
    ) -> None:
        super().__init__(
            model,
            client=client,
            api_key=api_key,
            base_url=base_url,
            max_tokens=max_tokens,
            timeout=timeout,
            request_options=request_options,
        )
        self.token_limit_param = token_limit_param

    def _endpoint(self) -> tuple[Callable[..., Any], frozenset[str]]:
        reserved = frozenset({"model", "messages", "max_tokens", "max_completion_tokens"})
        return self.client.chat.completions.create, reserved

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        """Send ``request`` once; raise `SummarizerError` when the API call fails."""
        options = {**self.request_options, self.token_limit_param: self._limit(request)}
        try:
            completion = await self.client.chat.completions.create(
                model=self.model,
                messages=[
                    {"role": "system", "content": request.system},
                    {"role": "user", "content": request.prompt},
                ],
                **options,
            )
        except (openai.APIError, *UNREADABLE) as exc:
            raise summarizer_error(openai, exc) from exc
        return read_reply(openai, lambda: _chat_result(completion), lambda: completion.usage)


class OpenAIResponsesSummarizer(_OpenAISummarizer):
    """Summarizes through the OpenAI Responses API (``store=False``: nothing is kept).

    Arguments as for `OpenAIChatSummarizer`, without ``token_limit_param`` (the cap is sent
    as ``max_output_tokens``; a reasoning model's reasoning counts against it, so pass e.g.
    ``request_options={"reasoning": {"effort": "low"}}``).
    """

    def _endpoint(self) -> tuple[Callable[..., Any], frozenset[str]]:
        reserved = frozenset({"model", "instructions", "input", "max_output_tokens", "store"})
        return self.client.responses.create, reserved

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        """Send ``request`` once; raise `SummarizerError` when the API call fails."""
        try:
            response = await self.client.responses.create(
                model=self.model,
                instructions=request.system,
                input=request.prompt,
                max_output_tokens=self._limit(request),
                store=False,
                **self.request_options,
            )
        except (openai.APIError, *UNREADABLE) as exc:
            raise summarizer_error(openai, exc) from exc
        return read_reply(openai, lambda: _responses_result(response), lambda: response.usage)


def _chat_result(completion: ChatCompletion) -> SummaryResult:
    usage, known = read_usage(completion.usage)
    if not isinstance(completion.choices, list):
        raise TypeError(f"choices is {type(completion.choices).__name__}, not a list")
    if not completion.choices:
        model = completion.model
        return SummaryResult(
            text="", stop_reason="error", usage=usage, model=model, usage_known=known
        )
    choice = completion.choices[0]
    message = choice.message
    stop: StopReason = normalize_stop_reason(choice.finish_reason)
    if message.refusal:
        stop = "refusal"
    return SummaryResult(
        text=message.content or message.refusal or "",
        stop_reason=stop,
        usage=usage,
        model=completion.model,
        usage_known=known,
    )


def _responses_result(response: Response) -> SummaryResult:
    usage, known = read_usage(response.usage)
    texts: list[str] = []
    refused: list[str] = []
    for item in response.output:
        if item.type != "message":
            continue
        for part in item.content:
            if part.type == "output_text":
                texts.append(part.text)
            elif part.type == "refusal":
                refused.append(part.refusal)
    stop: StopReason
    if refused:
        stop = "refusal"
    elif response.status == "incomplete":
        details_ = response.incomplete_details
        reason = details_.reason if details_ is not None else None
        stop = normalize_stop_reason(reason or "incomplete")
    else:
        stop = normalize_stop_reason(response.status)
    return SummaryResult(
        text="".join(texts) or "".join(refused),
        stop_reason=stop,
        usage=usage,
        model=response.model,
        usage_known=known,
    )
