"""`OpenAICompactionSummarizer`: OpenAI's ``responses.compact`` as a `Summarizer`.

```python
from agentctx.providers.openai_compaction import OpenAICompactionSummarizer

native = OpenAICompactionSummarizer("gpt-5.4", client=client, instructions=INSTRUCTIONS)
strategy = Chain([LlmCompaction(native), DeterministicCompaction()])
```

Each request is one ``POST /v1/responses/compact`` with the conversation through the end of
the span (`SummaryRequest.conversation`, rendered by
`agentctx.adapters.openai_responses.to_openai_responses`) as ``input``. The answer lists the
input's user messages, then one ``compaction`` item whose ``encrypted_content`` only OpenAI
can read. `LlmCompaction` splices, in place of the span, the span's own user messages (as they
were: the copies in the answer are the same text) followed by an assistant message holding
the compaction item, as an ``OpaqueBlock("openai_responses", item)``, untouched; with every
guarantee of a text briefing (background, stale detection, billing, events).

Use it with a loop on the Responses API (`to_openai_responses` sends the item back as it
came). The item is opaque and provider-locked: nothing can be read from it, and only OpenAI
accepts it back. ``required_sections`` do not apply.

SDK retries are off, errors become `SummarizerError` (`summarizer_error`), cancellation
propagates; an answer without a compaction item, or whose item has no ``encrypted_content``
(empty or null: a failed compaction), is an ``empty`` briefing, rejected with its cost.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from agentctx._usage import read_usage
from agentctx.adapters.openai_responses import PROVIDER, to_openai_responses
from agentctx.errors import MissingExtraError, SummarizerError
from agentctx.messages import AssistantMessage, OpaqueBlock, UserMessage
from agentctx.providers._client import (
    UNREADABLE,
    ClientOwner,
    read_reply,
    retryless,
    summarizer_error,
)
from agentctx.providers._request_options import check_request_options
from agentctx.summarizer import SummaryResult

try:
    import openai
    from openai import AsyncOpenAI
except ImportError as exc:
    raise MissingExtraError("openai", exc.name, needed_by=__name__) from exc

if TYPE_CHECKING:
    from collections.abc import Mapping

    from openai.types.responses import CompactedResponse

    from agentctx.messages import Message
    from agentctx.summarizer import SummaryRequest

__all__ = ["OpenAICompactionSummarizer"]

_RESERVED = frozenset({"model", "input", "instructions", "previous_response_id"})


class OpenAICompactionSummarizer(ClientOwner):
    """Compacts with the Responses API's ``responses.compact`` (see the module docs).

    Args:
        model: the model that compacts (your loop's); also used for pricing.
        client: an `openai.AsyncOpenAI` to use (a copy with ``max_retries=0`` is made; the
            caller keeps ownership and closes it). Default: one made from ``api_key``,
            ``base_url`` and ``timeout``, closed by `aclose`.
        api_key: for the client made here (``None``: the SDK's environment default).
        base_url: for the client made here (``None``: the SDK's environment default).
        timeout: the HTTP timeout in seconds (``None``: the SDK's default).
        instructions: the system (developer) message of the compaction request: your
            loop's ``instructions``, so the request reads the prefix it cached.
        request_options: more arguments for every request (``prompt_cache_key``,
            ``service_tier``, ...); the ones set here cannot be.
    """

    native_provider: ClassVar[str] = PROVIDER
    """What it splices is an ``OpaqueBlock`` of this provider, which only OpenAI's Responses
    API takes back: `wrap` and `as_middleware` refuse a session compacting with it under a
    loop on another API, Chat Completions included (`ConfigError`)."""

    sends_conversation = True
    """It sends `SummaryRequest.conversation`, not the transcript: a request refused as too
    large is not sent again with less transcript (it would be the same request)."""

    def __init__(
        self,
        model: str,
        *,
        client: AsyncOpenAI | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float | None = None,
        instructions: str | None = None,
        request_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.instructions = instructions
        self._owned = client is None
        self.client = retryless(AsyncOpenAI, client, api_key, base_url, timeout)
        self.request_options = check_request_options(
            self.client.responses.compact, request_options or {}, _RESERVED
        )

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        """Compact ``request.conversation`` once; raise `SummarizerError` when the call fails."""
        if not request.conversation:
            raise SummarizerError(
                "nothing to compact: the request has no conversation", retryable=False
            )
        options = dict(self.request_options)
        if self.instructions is not None:
            options["instructions"] = self.instructions
        try:
            compacted = await self.client.responses.compact(
                model=self.model,
                input=to_openai_responses(request.conversation),
                **options,
            )
        except (openai.APIError, *UNREADABLE) as exc:
            raise summarizer_error(openai, exc) from exc
        span = request.conversation[len(request.conversation) - request.messages :]
        return read_reply(
            openai, lambda: _to_result(compacted, span, self.model), lambda: compacted.usage
        )


def _to_result(
    compacted: CompactedResponse, span: tuple[Message, ...], model: str
) -> SummaryResult:
    usage, known = read_usage(compacted.usage)
    # The items as the server sent them: the encrypted content goes back byte for byte. One
    # without it ("" or null) is a failed compaction, as Anthropic's block without content:
    # no server can read it back, so it is left out (none left: an ``empty`` briefing).
    items = [
        i.to_dict(mode="json")
        for i in compacted.output
        if i.type == "compaction" and isinstance(i.encrypted_content, str) and i.encrypted_content
    ]
    spliced: tuple[Message, ...] = ()
    if items:
        # The answer repeats every user message of the input before the item; those of the
        # span are kept as they were (the head's stay where they are, before the span).
        users = tuple(m for m in span if isinstance(m, UserMessage))
        spliced = (*users, AssistantMessage(tuple(OpaqueBlock(PROVIDER, i) for i in items)))
    return SummaryResult(
        text="", stop_reason="stop", usage=usage, model=model, messages=spliced, usage_known=known
    )
