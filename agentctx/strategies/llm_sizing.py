"""Sizing a summary request to the summarizer's own context window, and recognizing the answer
of a server that found one too large anyway.

```python
fit = fit_request(job.messages, job.previous, config, window=2048, max_chars=ceiling)
if isinstance(fit, str):          # the fixed parts alone do not fit: give up, say why
    ...
request = SummaryRequest(system=..., prompt=fit.prompt, max_tokens=fit.max_tokens, ...)
if too_large(error):              # the server disagreed with the estimate
    ceiling = len(request.transcript) // 2    # later requests carry at most half of it
```

The request must fit ``window`` tokens as the *summarizer's* tokenizer counts them, output
included: ``input * TOKENIZER_SLACK + TEMPLATE_TOKENS + max_tokens <= window``, with the input
counted by agentctx's own `Estimator` (o200k-like). ``TOKENIZER_SLACK`` covers the smaller
vocabularies of local models (SmolLM2 counts about 1.3 tokens per estimated one on agent
transcripts, 32k-vocabulary models up to 1.5). The answer gets a quarter of the window, at
most ``max_summary_tokens``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentctx.summarizer import build_prompt, serialize_transcript
from agentctx.tokens import Estimator

if TYPE_CHECKING:
    from collections.abc import Sequence

    from agentctx.errors import SummarizerError
    from agentctx.messages import Message
    from agentctx.strategies.llm_config import LlmCompactionConfig

__all__ = [
    "BLOCKS_PER_TRANSCRIPT",
    "MIN_TRANSCRIPT_CHARS",
    "MIN_TRANSCRIPT_TOKENS",
    "TEMPLATE_TOKENS",
    "TOKENIZER_SLACK",
    "Fit",
    "fit_request",
    "too_large",
]

TOKENIZER_SLACK = 1.5
"""How many of the summarizer's tokens one estimated token may be (small vocabularies)."""

TEMPLATE_TOKENS = 48
"""Tokens the chat template adds around the system prompt and the user message."""

MIN_TRANSCRIPT_TOKENS = 64
"""Below this many tokens of transcript a request is not worth sending."""

MIN_TRANSCRIPT_CHARS = 200
"""Below this many characters of transcript a request is not worth sending."""

BLOCKS_PER_TRANSCRIPT = 8
"""A sized transcript clips each block to this fraction of it (or the configured block cap,
if smaller), so a window's worth holds several messages rather than one tool output (which a
small model then copies out instead of summarizing)."""
_ESTIMATOR = Estimator()

# What servers answer (HTTP 400, 413) when a request does not fit: llama.cpp "request (3031
# tokens) exceeds the available context size (2048 tokens)", OpenAI "This model's maximum
# context length is ...", Anthropic "prompt is too long: ... > ... maximum", Responses "Your
# input exceeds the context window of this model", vLLM like OpenAI, 413 "Request exceeds
# the maximum allowed number of bytes".
_TOO_LARGE = re.compile(
    r"context[ _](?:length|size|window)|too long|exceed|maximum context", re.IGNORECASE
)


@dataclass(frozen=True, slots=True)
class Fit:
    """A request sized to fit: its transcript, prompt and output cap."""

    transcript: str
    prompt: str
    max_tokens: int


def output_tokens(config: LlmCompactionConfig, window: int | None) -> int:
    """The briefing's output cap: ``max_summary_tokens``, at most a quarter of ``window``."""
    cap = config.max_summary_tokens
    return cap if window is None else max(1, min(cap, window // 4))


def fit_request(
    messages: Sequence[Message],
    previous: str | None,
    config: LlmCompactionConfig,
    *,
    window: int | None,
    max_chars: int | None = None,
) -> Fit | str:
    """The transcript, prompt and output cap of a request for ``messages``.

    Without ``window`` the configured caps apply. With it, the transcript gets what the
    window leaves after the output, the template, the system prompt, the instruction and
    ``previous`` (each counted with slack); the newest messages are kept. ``max_chars`` caps
    the transcript further (what a server refused before). Returns why not, as text, when
    the transcript would be too short to be worth sending.
    """
    cfg = config
    block, total = cfg.transcript_block_chars, cfg.transcript_total_chars
    if max_chars is not None:
        if max_chars < MIN_TRANSCRIPT_CHARS:
            return (
                f"the summarizer refused requests down to {2 * max_chars} characters of "
                "transcript as too large"
            )
        total = min(total, max_chars)
    max_tokens = output_tokens(cfg, window)

    def prompt_of(transcript: str) -> str:
        return build_prompt(
            transcript,
            previous,
            instruction=cfg.instruction,
            update_instruction=cfg.update_instruction,
        )

    if window is None:
        transcript = serialize_transcript(messages, block_chars=block, total_chars=total)
        return Fit(transcript, prompt_of(transcript), max_tokens)
    room = (window - max_tokens - TEMPLATE_TOKENS) / TOKENIZER_SLACK
    fixed = _ESTIMATOR.count(cfg.system_prompt) + _ESTIMATOR.count(prompt_of(""))
    budget = int(room - fixed)
    if budget < MIN_TRANSCRIPT_TOKENS:
        return (
            f"the summarizer's window of {window} tokens leaves no room for a transcript: the "
            f"answer takes {max_tokens}, the system prompt, instruction and previous briefing "
            f"about {int(fixed * TOKENIZER_SLACK)}"
        )
    # Characters per token vary with the content: start from a generous guess, then shrink
    # by the measured ratio until the estimate fits (a few rounds; each is bounded work).
    total = min(total, budget * 4)
    for _ in range(6):
        block_chars = min(block, max(MIN_TRANSCRIPT_CHARS, total // BLOCKS_PER_TRANSCRIPT))
        transcript = serialize_transcript(messages, block_chars=block_chars, total_chars=total)
        tokens = _ESTIMATOR.count(transcript)
        if tokens <= budget or total <= MIN_TRANSCRIPT_CHARS:
            break
        total = max(MIN_TRANSCRIPT_CHARS, int(total * budget / tokens * 0.95))
    return Fit(transcript, prompt_of(transcript), max_tokens)


def too_large(error: SummarizerError) -> bool:
    """Whether ``error`` is a server saying the request does not fit: HTTP 413, or HTTP 400
    whose message speaks of the context or of a prompt too long (not of other limits, such
    as an output cap the model does not support, which a shorter transcript would not fix)."""
    if error.status == 413:
        return True
    return error.status == 400 and _TOO_LARGE.search(str(error)) is not None
