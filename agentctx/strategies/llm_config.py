"""Settings of `LlmCompaction` (`LlmCompactionConfig`, `RetryPolicy`) and how its briefings
are recognized in a view (`SUMMARY_MARKER`, `is_briefing`).

```python
from agentctx.strategies.llm import LlmCompaction, LlmCompactionConfig, RetryPolicy

config = LlmCompactionConfig(trigger_ratio=0.7, retry=RetryPolicy(max_attempts=5), timeout=60)
strategy = LlmCompaction(summarizer, config)

# a small local model (llama.cpp, Ollama, vLLM) with a 2,048-token window
config = LlmCompactionConfig.small_model(context_window=2048)
```
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentctx._check import fraction, got, number, whole
from agentctx._log import log
from agentctx.errors import ConfigError
from agentctx.messages import SummaryMessage
from agentctx.summarizer import (
    DEFAULT_INSTRUCTION,
    DEFAULT_SYSTEM_PROMPT,
    DEFAULT_UPDATE_INSTRUCTION,
    REQUIRED_SECTIONS,
    TRANSCRIPT_BLOCK_CHARS,
    TRANSCRIPT_TOTAL_CHARS,
)

if TYPE_CHECKING:
    from agentctx.messages import Message
    from agentctx.pricing import Price

__all__ = [
    "DEFAULT_RETAIN_TAIL_TOKENS",
    "MIN_SUMMARIZER_WINDOW",
    "MIN_SUMMARY_TOKENS",
    "SMALL_MODEL_INSTRUCTION",
    "SMALL_MODEL_SYSTEM_PROMPT",
    "SMALL_MODEL_UPDATE_INSTRUCTION",
    "SUMMARY_MARKER",
    "LlmCompactionConfig",
    "RetryPolicy",
    "briefing_text",
    "is_briefing",
]

SUMMARY_MARKER = "[Context compacted: a briefing on the earlier conversation, which it replaces]"
"""Constant first line of every spliced briefing, so splices are recognizable."""

DEFAULT_RETAIN_TAIL_TOKENS = 20_000
"""Ceiling of the default retained tail; the default is ``min(this, limit // 4)``."""

MIN_SUMMARY_TOKENS = 256
"""Floor of ``max_summary_tokens``: below it no model fits the five sections."""

MIN_SUMMARIZER_WINDOW = 4 * MIN_SUMMARY_TOKENS
"""Smallest ``summarizer_context_window``: a quarter of it goes to the answer."""

SMALL_MODEL_SYSTEM_PROMPT = (
    "You summarize a conversation between a user and an AI assistant, so that the work can "
    "continue from your summary."
)
"""System prompt of `LlmCompactionConfig.small_model`."""

SMALL_MODEL_INSTRUCTION = (
    "In two or three short sentences: what does the user want, and what has the assistant "
    "done so far?"
)
"""Instruction of `LlmCompactionConfig.small_model`: a short question a small model answers
and then stops. Asked for five markdown sections, or for a summary, a small model (SmolLM2
for one) copies the transcript or repeats itself until the output cap, and a briefing cut
short is rejected."""

SMALL_MODEL_UPDATE_INSTRUCTION = (
    "Above are an earlier summary and the conversation that followed it. In two or three "
    "short sentences: what does the user want, and what has the assistant done so far?"
)
"""Update instruction of `LlmCompactionConfig.small_model`."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """Retries of one summarization: exponential backoff with jitter, clamped ``Retry-After``.

    Attempts are numbered from 1; after failed attempt ``n`` the wait is
    ``min(max_delay, base_delay * 2 ** (n - 1))``, shortened by up to ``jitter`` (a 0-1
    fraction) at random, or the provider's ``Retry-After`` clamped to ``max_retry_after``.
    Only retryable errors (`SummarizerError.retryable`, timeouts) are retried.
    """

    max_attempts: int = 3
    base_delay: float = 1.0
    max_delay: float = 30.0
    jitter: float = 0.5
    max_retry_after: float = 60.0

    def __post_init__(self) -> None:
        whole(self, "max_attempts", minimum=1)
        for name in ("base_delay", "max_delay", "max_retry_after", "jitter"):
            number(self, name)
        if self.jitter > 1:
            raise ConfigError(f"RetryPolicy.jitter is a 0-1 fraction, got {got(self, 'jitter')}")

    def delay(self, attempt: int, retry_after: float | None, rand: float) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based); ``rand`` is in [0, 1)."""
        if retry_after is not None and math.isfinite(retry_after):
            return min(max(0.0, retry_after), self.max_retry_after)
        # The exponent capped: past it the doubling is past any max_delay (and past 1024,
        # a float's range).
        backoff = min(self.max_delay, self.base_delay * 2.0 ** min(max(0, attempt - 1), 64))
        return backoff * (1.0 - self.jitter * rand)


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmCompactionConfig:
    """Settings of `LlmCompaction`.

    Attributes:
        trigger_ratio: 0-1 fraction of the limit where a background summary starts;
            ``None`` uses the budget's ``trigger_ratio``.
        retain_tail_tokens: tokens of recent messages kept verbatim after the briefing;
            ``None`` derives ``min(DEFAULT_RETAIN_TAIL_TOKENS, limit // 4)`` on every call (a
            fixed 20k would silently disable the strategy on small windows). An explicit
            value is used as given; a one-time `CompactionWarning` says when it leaves
            nothing to summarize.
        keep_first: view messages always sent verbatim at the start (at least through the
            task, the first user message).
        max_summary_tokens: cap on the briefing (floor 256); a briefing that hits it stops on
            ``length`` and is rejected.
        timeout: seconds one attempt may take.
        deadline: seconds all attempts and the waits between them may take together.
        retry: the retry policy.
        price: USD prices of the summarizer model; ``None`` looks the model up in
            `agentctx.pricing` (unknown models cost ``None``, never 0).
        system_prompt, instruction, update_instruction: the request's texts; the update
            instruction is used when a previous briefing is sent along.
        required_sections: markdown headings a briefing must have (empty: no check).
        warn_after_fallbacks: consecutive over-limit calls without a splice (after a request
            was made) before a ``losing_race`` warning; it re-arms after a splice.
        update_ratio: 0-1 fraction of the limit the view must grow by, after a briefing that
            waits to be spliced was asked for, before a request brings it up to date (its
            text and what followed its span go out as an update, so the briefing spliced
            covers everything but about the retained tail); ``None`` never updates a waiting
            briefing, which then covers the history up to when it was asked for.
        cold_cache_seconds: after this long without a model call the provider's prefix cache
            has expired, so a ready briefing is spliced above the trigger already (a rewrite
            is free then); ``None`` splices only over the limit.
        protect_paid_work: over the limit with no briefing to splice, first run the fallback
            tiers on what follows the span in flight (just under the limit) and on what
            follows an earlier briefing, so neither is lost; ``False`` leaves every fallback
            to the strategies chained after this one.
        transcript_block_chars, transcript_total_chars: transcript caps.
        summarizer_context_window: the context window of the *summarizer's* model, in
            tokens (``None``: unknown, the caps above apply as given). With it every request
            is sized to fit, output included: ``max_summary_tokens`` is capped at a quarter
            of the window and the transcript gets what the rest leaves after the prompts,
            estimated with agentctx's token estimator and a margin for smaller vocabularies
            (`agentctx.strategies.llm_sizing`). Set it for a local or self-hosted model; see
            `small_model`. At least `MIN_SUMMARIZER_WINDOW`.

    Whatever the window, a request the server refuses as too large (HTTP 400 about the
    context, or 413) is sent again with half the transcript, and every later request keeps
    the smaller size; a `CompactionWarning` (``summarizer_window``) says so once.
    """

    trigger_ratio: float | None = None
    retain_tail_tokens: int | None = None
    keep_first: int = 1
    max_summary_tokens: int = 2_000
    timeout: float = 120.0
    deadline: float = 300.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    price: Price | None = None
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    instruction: str = DEFAULT_INSTRUCTION
    update_instruction: str = DEFAULT_UPDATE_INSTRUCTION
    required_sections: tuple[str, ...] = REQUIRED_SECTIONS
    warn_after_fallbacks: int = 5
    update_ratio: float | None = 0.1
    cold_cache_seconds: float | None = 300.0
    protect_paid_work: bool = True
    transcript_block_chars: int = TRANSCRIPT_BLOCK_CHARS
    transcript_total_chars: int = TRANSCRIPT_TOTAL_CHARS
    summarizer_context_window: int | None = None

    @classmethod
    def small_model(cls, context_window: int, **settings: Any) -> LlmCompactionConfig:
        """Settings for a small local or self-hosted summarizer model (llama.cpp, Ollama,
        vLLM, ...) whose context window is ``context_window`` tokens.

        ```python
        summarizer = OpenAIChatSummarizer("smollm2", base_url="http://127.0.0.1:8080/v1")
        config = LlmCompactionConfig.small_model(context_window=2048)
        strategy = Chain([LlmCompaction(summarizer, config), DeterministicCompaction()])
        ```

        What it sets: ``summarizer_context_window`` (every request sized to fit it), a
        short system prompt and instruction a small model can follow and stop after
        (`SMALL_MODEL_INSTRUCTION`: a few sentences, no sections), no required sections,
        ``max_summary_tokens=512`` (a quarter of the window at most), and a per-attempt
        ``timeout`` of 300 s with a ``deadline`` of 600 s (a CPU reads a full window
        slowly). Any other setting, or an override of these, goes in ``settings``.
        """
        preset: dict[str, Any] = {
            "summarizer_context_window": context_window,
            "system_prompt": SMALL_MODEL_SYSTEM_PROMPT,
            "instruction": SMALL_MODEL_INSTRUCTION,
            "update_instruction": SMALL_MODEL_UPDATE_INSTRUCTION,
            "required_sections": (),
            "max_summary_tokens": 512,
            "timeout": 300.0,
            "deadline": 600.0,
        }
        return cls(**{**preset, **settings})

    def __post_init__(self) -> None:
        fraction(self, "trigger_ratio", optional=True)
        fraction(self, "update_ratio", optional=True)
        whole(self, "retain_tail_tokens", optional=True)
        whole(self, "keep_first")
        whole(self, "warn_after_fallbacks", minimum=1)
        for name in ("timeout", "deadline"):
            number(self, name)
            if not getattr(self, name) > 0:
                raise ConfigError(f"LlmCompactionConfig.{name} must be positive seconds; got 0")
        whole(self, "transcript_block_chars", minimum=1)
        whole(self, "transcript_total_chars", minimum=1)
        whole(self, "max_summary_tokens")
        number(self, "cold_cache_seconds", optional=True)
        self._check_kinds()
        window = self.summarizer_context_window
        if window is not None and (
            not isinstance(window, int)
            or isinstance(window, bool)
            or window < MIN_SUMMARIZER_WINDOW
        ):
            raise ConfigError(
                "LlmCompactionConfig.summarizer_context_window is the summarizer model's window "
                f"in tokens, at least {MIN_SUMMARIZER_WINDOW}; got {window!r}"
            )
        if self.max_summary_tokens < MIN_SUMMARY_TOKENS:
            log.warning(
                "max_summary_tokens below the floor; using the floor",
                requested=self.max_summary_tokens,
                floor=MIN_SUMMARY_TOKENS,
            )
            object.__setattr__(self, "max_summary_tokens", MIN_SUMMARY_TOKENS)

    def _check_kinds(self) -> None:
        """The settings read only when a summary is asked for or answered: wrong there, they
        would fail after a request was paid for."""
        from agentctx.pricing import Price

        def fail(name: str, what: str) -> ConfigError:
            return ConfigError(f"LlmCompactionConfig.{name} must be {what}; got {got(self, name)}")

        if not isinstance(self.retry, RetryPolicy):
            raise fail("retry", "a RetryPolicy")
        if self.price is not None and not isinstance(self.price, Price):
            raise fail("price", "an agentctx.pricing.Price or None")
        if not isinstance(self.system_prompt, str):
            raise fail("system_prompt", "a str")
        for name in ("instruction", "update_instruction"):
            text = getattr(self, name)
            if not isinstance(text, str) or not text.strip():
                raise fail(name, "a str that asks for the briefing (not blank)")
        sections = self.required_sections
        if not isinstance(sections, tuple | list) or not all(
            isinstance(h, str) and h.strip() for h in sections
        ):
            raise fail("required_sections", "a tuple of headings (non-blank strs), () for none")
        if type(self.protect_paid_work) is not bool:
            raise fail("protect_paid_work", "True or False")
        object.__setattr__(self, "required_sections", tuple(sections))


def is_briefing(message: Message) -> bool:
    """Whether ``message`` is a briefing `LlmCompaction` spliced."""
    return isinstance(message, SummaryMessage) and message.text.startswith(SUMMARY_MARKER)


def briefing_text(message: Message) -> str | None:
    """The briefing ``message`` carries, without the marker; ``None`` if it is not one."""
    if isinstance(message, SummaryMessage) and message.text.startswith(SUMMARY_MARKER):
        return message.text.removeprefix(SUMMARY_MARKER).strip()
    return None
