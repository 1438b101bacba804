"""`AnthropicCompactionSummarizer`: Anthropic's own compaction as a `Summarizer`.

```python
from agentctx.providers.anthropic_compaction import AnthropicCompactionSummarizer

native = AnthropicCompactionSummarizer("claude-sonnet-4-5", client=client, system=SYSTEM,
                                       tools=TOOLS)        # the loop's own system and tools
strategy = Chain([LlmCompaction(native), DeterministicCompaction()])
```

Each request is a Messages API compaction request (``client.beta.messages.create`` with
``compaction={"type": "summarize"}`` and the ``compact-2026-09-04`` beta): the conversation
through the end of the span (`SummaryRequest.conversation`, rendered by
`agentctx.adapters.anthropic.to_anthropic`), summarized by the model itself. The answer is one
signed ``compaction`` block; `LlmCompaction` splices an assistant message holding it, as an
``OpaqueBlock("anthropic", block)``, in place of the span, byte for byte, with every guarantee
of a text briefing (background, stale detection, billing, events). The API reads a
conversation from its latest compaction block on, so the block covers the head too (the
head stays in the view, and the block is sent after it).

Send your loop's own ``system`` and ``tools``: the request then starts with the prefix your
loop's requests cached, and the tool calls in the conversation need their tools (without
``tools`` the summarizer declares a minimal schema for each tool the conversation calls).

The request runs with thinking disabled, so the conversation's ``thinking`` and
``redacted_thinking`` blocks are left out of it, each whole (the API then refuses a final
assistant turn holding one; a summary needs what was said and done, not the reasoning
behind each step), with any assistant turn that held nothing else. For a loop with thinking
on, the request's messages therefore differ from those the loop cached after the first
assistant turn holding thinking; its ``system`` and ``tools`` still match.

The block is readable and signed, but only Anthropic accepts it back: the history is tied to
the provider from then on. ``required_sections`` do not apply.

SDK retries are off, errors become `SummarizerError` (`summarizer_error`), cancellation
propagates; a compaction block without content (the compaction failed) is an ``empty``
briefing, rejected with its cost.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from agentctx._usage import Unpriced, read_usage
from agentctx.adapters.anthropic import PROVIDER, to_anthropic
from agentctx.boundaries import has_thinking
from agentctx.errors import MissingExtraError, SummarizerError
from agentctx.messages import (
    AssistantMessage,
    OpaqueBlock,
    RedactedThinkingBlock,
    ThinkingBlock,
    ToolCall,
    Usage,
)
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
    from collections.abc import Iterable, Mapping, Sequence

    from anthropic.types.beta import BetaMessage, BetaUsage

    from agentctx.messages import Message
    from agentctx.summarizer import StopReason, SummaryRequest

__all__ = ["COMPACTION_BETA", "AnthropicCompactionSummarizer"]

COMPACTION_BETA = "compact-2026-09-04"
"""The ``anthropic-beta`` the ``compaction`` request parameter needs."""

_RESERVED = frozenset({"model", "max_tokens", "messages", "compaction", "system", "tools"})


class AnthropicCompactionSummarizer(ClientOwner):
    """Compacts with the Messages API's own compaction (see the module docs).

    Args:
        model: the model that compacts (your loop's, so it reads its cached prefix); also
            used for pricing.
        client: an `anthropic.AsyncAnthropic` to use (a copy with ``max_retries=0`` is made;
            the caller keeps ownership and closes it). Default: one made from ``api_key``,
            ``base_url`` and ``timeout``, closed by `aclose`.
        api_key: for the client made here (``None``: the SDK's environment default).
        base_url: for the client made here (``None``: the SDK's environment default).
        timeout: the HTTP timeout in seconds (``None``: the SDK's default).
        system: the system prompt to send (your loop's); ``None`` sends none.
        tools: the tool definitions to send (your loop's); ``None`` declares a minimal schema
            for each tool the conversation calls, which the API requires.
        instructions: replaces the server's summarization prompt (``None``: the server's).
        max_tokens: cap on the compaction's output tokens; ``None`` uses the request's
            (`LlmCompactionConfig.max_summary_tokens`).
        request_options: more arguments for every request (``betas`` are added to the
            compaction beta); the ones set here cannot be.
    """

    native_provider: ClassVar[str] = PROVIDER
    """What it splices is an ``OpaqueBlock`` of this provider, which only Anthropic's Messages
    API takes back: `wrap` and `as_middleware` refuse a session compacting with it under a
    loop on another API (`ConfigError`)."""

    sends_conversation = True
    """It sends `SummaryRequest.conversation`, not the transcript: a request refused as too
    large is not sent again with less transcript (it would be the same request)."""

    def __init__(
        self,
        model: str,
        *,
        client: AsyncAnthropic | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float | None = None,
        system: str | Sequence[Mapping[str, Any]] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        instructions: str | None = None,
        max_tokens: int | None = None,
        request_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.system = system
        self.tools = None if tools is None else [dict(t) for t in tools]
        self.instructions = instructions
        self.max_tokens = max_tokens
        self._owned = client is None
        self.client = retryless(AsyncAnthropic, client, api_key, base_url, timeout)
        self.request_options = check_request_options(
            self.client.beta.messages.create, request_options or {}, _RESERVED
        )

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        """Compact ``request.conversation`` once; raise `SummarizerError` when the call fails."""
        if not request.conversation:
            raise SummarizerError(
                "nothing to compact: the request has no conversation", retryable=False
            )
        messages = _closed_turn(to_anthropic(_without_thinking(request.conversation)))
        if not messages:
            raise SummarizerError(
                "nothing to compact: the conversation holds only blank text or thinking",
                retryable=False,
            )
        options = dict(self.request_options)
        betas = [*options.pop("betas", ()), COMPACTION_BETA]
        compaction: dict[str, Any] = {"type": "summarize"}
        if self.instructions is not None:
            compaction["instructions"] = self.instructions
        if self.system is not None:
            options["system"] = self.system
        tools = self.tools if self.tools is not None else _tool_stubs(request.conversation)
        if tools:
            options["tools"] = tools
        try:
            message = await self.client.beta.messages.create(
                model=self.model,
                max_tokens=self.max_tokens if self.max_tokens is not None else request.max_tokens,
                messages=messages,
                compaction=compaction,
                betas=list(dict.fromkeys(betas)),
                **options,
            )
        except (anthropic.APIError, *UNREADABLE) as exc:
            raise summarizer_error(anthropic, exc) from exc
        return read_reply(anthropic, lambda: _to_result(message), lambda: _billed(message.usage))


def _tool_stubs(conversation: Iterable[Message]) -> list[dict[str, Any]]:
    """A minimal definition for each tool the conversation calls (the API wants one)."""
    names: dict[str, None] = {}
    for m in conversation:
        if isinstance(m, AssistantMessage):
            names.update((b.name, None) for b in m.content if isinstance(b, ToolCall))
    return [{"name": n, "input_schema": {"type": "object"}} for n in names]


def _without_thinking(conversation: Sequence[Message]) -> list[Message]:
    """``conversation`` without its thinking and redacted thinking blocks, each left out
    whole (never edited), and without an assistant message that held nothing else.

    The compaction request runs with thinking disabled, and the API then refuses a final
    assistant turn holding thinking ("When thinking is disabled, an `assistant` message in
    the final position cannot contain `thinking`", or one ending on it). Leaving them all
    out, not only the last turn's, keeps every request valid wherever the span ends (a
    user message, tool results, an answer) and loses nothing the summary needs: what was
    said and done. Left out before the messages are rendered: `to_anthropic` leaves out a
    final assistant turn ending on thinking whole (a cut-off response the loop asks again
    for), which here would lose its text from the span the block replaces. (A message left
    out leaves two turns of one role side by side, which the API merges into one.)"""
    kept: list[Message] = []
    for m in conversation:
        if isinstance(m, AssistantMessage) and has_thinking(m):
            blocks = tuple(b for b in m.content if not isinstance(b, _THINKING))
            if blocks:
                kept.append(AssistantMessage(blocks, m.stop_reason, m.usage, m.model, m.extra))
        else:
            kept.append(m)
    return kept


_THINKING = (ThinkingBlock, RedactedThinkingBlock)


def _closed_turn(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` as the API takes them when they end on the assistant's turn (the span
    the compaction covers ends there): its last text without trailing whitespace, which the
    API refuses in a final assistant message ("final assistant content cannot end with
    trailing whitespace"); a text left empty is left out, and a turn left empty too (the one
    before it is then the last)."""
    while messages and messages[-1].get("role") == "assistant":
        last = messages[-1]
        content = last["content"]
        content = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
        while (
            content
            and content[-1].get("type") == "text"
            and content[-1]["text"] != (kept := content[-1]["text"].rstrip())
        ):
            if kept:
                content[-1] = {**content[-1], "text": kept}
            else:
                content.pop()
        if content:
            return [*messages[:-1], {**last, "content": content}]
        messages = messages[:-1]  # nothing but whitespace: the turn says nothing
    return messages


def _usage(u: BetaUsage) -> tuple[Usage, bool]:
    """The usage of every sampling iteration (each is billed; a compaction's own may be
    reported only there), and whether each stated only token counts (`read_usage`)."""
    parts: list[Any] = list(u.iterations or ()) or [u]
    total, known = Usage(), True
    for p in parts:
        usage, stated = read_usage(p)
        total += usage
        known = known and stated
    return total, known


def _billed(u: BetaUsage) -> object:
    """What a reply that could not be used was billed (`SummarizerError.usage`)."""
    usage, known = _usage(u)
    return usage if known else Unpriced(usage)


def _to_result(message: BetaMessage) -> SummaryResult:
    blocks = [b for b in message.content if b.type == "compaction" and b.content]
    stop: StopReason = (
        "stop"
        if message.stop_reason == "compaction"
        else normalize_stop_reason(message.stop_reason)
    )
    spliced: tuple[Message, ...] = ()
    if blocks:
        # The blocks as the server sent them (fields it left out stay out): round-tripped
        # untouched, signature included.
        content = tuple(OpaqueBlock(PROVIDER, b.to_dict(mode="json")) for b in blocks)
        spliced = (AssistantMessage(content),)
    usage, known = _usage(message.usage)
    return SummaryResult(
        text="\n\n".join(b.content or "" for b in blocks),
        stop_reason=stop,
        usage=usage,
        model=message.model,
        messages=spliced,
        usage_known=known,
    )
