"""Per-model list prices in USD per million tokens; unknown prices are ``None``, never 0.

```python
price = price_for("claude-sonnet-5-5")           # or your own: Price(2.0, 10.0, 0.1, 2.5)
price.cost(Usage(input_tokens=1000, output_tokens=200))  # -> USD float
price_for("my-model", {**DEFAULT_PRICES, "my-model": Price(1.0, 2.0, 0.1, 1.25)})
```

A `Price` has the five rates a provider bills (input, output, cache read, cache write with
the short 5-minute TTL, cache write with the 1-hour TTL) and an optional `LongContext` tier:
a request whose prompt (uncached input + cache reads + cache writes, `Usage.prompt_tokens`)
is *above* the tier's threshold pays the tier's prices on every token, output included.
Anthropic's Claude Haiku 5.5 (above 100,000 prompt tokens) and OpenAI's GPT-5.4 and later
(above 272,000 input tokens, cached ones included) bill that way.

`price_for` matches a model id against a table's keys, longest key first. A key matches the
id itself and its snapshot names: a date (``claude-haiku-4-5-20251001``,
``gpt-4o-2024-08-06``), ``-latest``, or a suffix after ``@``, ``:`` or ``[``
(``claude-haiku-4-5@20251001``, ``claude-sonnet-5-5[1m]``), but not another model of the
family: ``claude-opus-4`` does not price ``claude-opus-4-5``, ``gpt-5.4`` does not price
``gpt-5.4-pro``, so a model the table does not list is ``None`` rather than a neighbour's
price. A key ending in ``*`` is a plain prefix (``{"claude-*": ...}`` prices every Claude).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentctx._check import number, preview
from agentctx.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from agentctx.messages import Usage

__all__ = ["DEFAULT_PRICES", "LongContext", "Price", "price_for"]


_MOST_USD = 1e9  # per million tokens: far past any price, and a cost stays a finite float


@dataclass(frozen=True, slots=True)
class LongContext:
    """A price tier for long prompts: a request whose prompt has more than ``threshold``
    tokens (uncached input + cache reads + cache writes) pays ``price`` on all its tokens."""

    threshold: int
    price: Price

    def __post_init__(self) -> None:
        number(self, "threshold")
        if not isinstance(self.price, Price):
            raise ConfigError(f"LongContext.price is a Price; got {preview(self.price)}")


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens.

    Args:
        input: uncached input.
        output: output (reasoning / thinking tokens included).
        cache_read: cache hits.
        cache_write: cache writes with the short TTL (Anthropic's 5 minutes, the default).
        cache_write_1h: cache writes with Anthropic's 1-hour TTL; ``None``: as
            ``cache_write``. Used for `Usage.cache_write_1h_tokens` only, so writes whose
            TTL the usage does not say are priced at the 5-minute rate.
        long_context: the tier for prompts above a threshold, or ``None``.
    """

    input: float
    output: float
    cache_read: float
    cache_write: float
    cache_write_1h: float | None = None
    long_context: LongContext | None = None

    def __post_init__(self) -> None:
        for name in ("input", "output", "cache_read", "cache_write"):
            number(self, name, maximum=_MOST_USD)
        number(self, "cache_write_1h", maximum=_MOST_USD, optional=True)
        if self.long_context is not None and not isinstance(self.long_context, LongContext):
            raise ConfigError(
                f"Price.long_context is a LongContext or None; got {preview(self.long_context)}"
            )

    def for_prompt(self, prompt_tokens: int) -> Price:
        """The prices a request with ``prompt_tokens`` prompt tokens pays."""
        tier = self.long_context
        if tier is not None and prompt_tokens > tier.threshold:
            return tier.price.for_prompt(prompt_tokens)
        return self

    def cost(self, usage: Usage) -> float:
        """The USD cost of one response's ``usage`` at these prices.

        The long-context tier is chosen from ``usage.prompt_tokens``: price each response on
        its own, not a sum of several (a sum can cross a threshold no request crossed).
        """
        p = self.for_prompt(usage.prompt_tokens)
        written_1h = max(0, min(usage.cache_write_1h_tokens, usage.cache_write_tokens))
        rate_1h = p.cache_write if p.cache_write_1h is None else p.cache_write_1h
        return (
            usage.input_tokens * p.input
            + usage.output_tokens * p.output
            + usage.cache_read_tokens * p.cache_read
            + (usage.cache_write_tokens - written_1h) * p.cache_write
            + written_1h * rate_1h
        ) / 1_000_000

    def reply_cost(self, usage: Usage) -> float | None:
        """`cost` of a billed reply; ``None`` when it reports no tokens at all: a server that
        leaves usage out billed the reply all the same, so its cost is unknown, not zero."""
        return self.cost(usage) if usage.prompt_tokens or usage.output_tokens else None


def _claude(
    input: float,
    write_5m: float,
    write_1h: float,
    read: float,
    output: float,
    long_context: LongContext | None = None,
) -> Price:
    """A Claude price in the column order of Anthropic's pricing table."""
    return Price(input, output, read, write_5m, write_1h, long_context)


_OPENAI_LONG_CONTEXT = 272_000


def _openai(input: float, cached: float, write: float, output: float, *, long: bool) -> Price:
    """An OpenAI price in the column order of OpenAI's pricing page. ``long``: above 272K
    input tokens the whole request pays twice the input and cache rates, 1.5x the output."""
    tier = None
    if long:
        doubled = Price(2 * input, 1.5 * output, 2 * cached, 2 * write)
        tier = LongContext(_OPENAI_LONG_CONTEXT, doubled)
    return Price(input, output, cached, write, None, tier)


# Anthropic: https://platform.claude.com/docs/en/about-claude/pricing ("Model pricing" and
# "Long context pricing") and the model pages https://platform.claude.com/docs/en/models/...
# read 2026-11-30. Standard (global) Claude API rates: no Batch discount, no fast mode, no
# inference_geo / regional-endpoint surcharge.
_OPUS_4_5 = _claude(5.0, 6.25, 10.0, 0.5, 25.0)  # Opus 4.5 to 5
_OPUS_4 = _claude(15.0, 18.75, 30.0, 1.5, 75.0)  # Opus 4 and 4.1 (and 3)
_SONNET_4 = _claude(3.0, 3.75, 6.0, 0.3, 15.0)
# Sonnet 4 / 4.5 with the 1M-context window: prompts above 200K pay $6 / $22.50 and the
# same multiples for the cache. Sonnet 4.6 and later have no surcharge.
_SONNET_4_LONG = _claude(
    3.0, 3.75, 6.0, 0.3, 15.0, LongContext(200_000, _claude(6.0, 7.5, 12.0, 0.6, 22.5))
)
_FABLE_5 = _claude(10.0, 12.5, 20.0, 1.0, 50.0)
_FABLE_5_1 = _claude(10.0, 12.5, 20.0, 0.25, 50.0)  # cache hits 0.025x input

# OpenAI: https://developers.openai.com/api/docs/pricing and the model pages
# https://developers.openai.com/api/docs/models/<id>, read 2026-11-30. Standard processing
# (not Batch / Flex / Fast / Priority, no data-residency surcharge). Cache writes are the
# default 30-minute retention; GPT-5.4 / 5.5 list no cache-write rate (priced as input).

# Published list prices (USD / Mtok). Matched as described in the module docstring.
DEFAULT_PRICES: Mapping[str, Price] = {
    # --- Anthropic, current ---
    # Fable 5.2 is left out: only resellers quoted its rates when this table was made.
    "claude-fable-5-1": _FABLE_5_1,
    "claude-mythos-5-1": _FABLE_5_1,
    "claude-opus-5-5": _claude(4.0, 5.0, 8.0, 0.2, 20.0),  # cache hits 0.05x input
    "claude-sonnet-5-5": _claude(2.0, 2.5, 4.0, 0.1, 10.0),  # cache hits $0.10 since 2026-10-07
    # Haiku 5.5: prompts up to 100,000 tokens (input + cache reads + cache writes) pay the
    # first row, longer prompts the second on every token of the request.
    "claude-haiku-5-5": _claude(
        0.1, 0.125, 0.2, 0.01, 0.5, LongContext(100_000, _claude(0.5, 0.625, 1.0, 0.05, 2.5))
    ),
    # --- Anthropic, legacy and older ---
    "claude-fable-5": _FABLE_5,
    "claude-mythos-5": _FABLE_5,
    "claude-opus-5": _OPUS_4_5,
    "claude-sonnet-5": _claude(2.0, 2.5, 4.0, 0.2, 10.0),
    "claude-opus-4-8": _OPUS_4_5,
    "claude-opus-4-7": _OPUS_4_5,
    "claude-opus-4-6": _OPUS_4_5,
    "claude-opus-4-5": _OPUS_4_5,
    "claude-opus-4-1": _OPUS_4,
    "claude-opus-4-0": _OPUS_4,
    "claude-opus-4": _OPUS_4,  # claude-opus-4-20250514
    "claude-3-opus": _OPUS_4,
    "claude-sonnet-4-6": _SONNET_4,
    "claude-sonnet-4-5": _SONNET_4_LONG,
    "claude-sonnet-4-0": _SONNET_4_LONG,
    "claude-sonnet-4": _SONNET_4_LONG,  # claude-sonnet-4-20250514
    "claude-3-7-sonnet": _SONNET_4,
    "claude-haiku-4-5": _claude(1.0, 1.25, 2.0, 0.1, 5.0),
    "claude-3-5-haiku": _claude(0.8, 1.0, 1.6, 0.08, 4.0),
    "claude-3-haiku": _claude(0.25, 0.3, 0.5, 0.03, 1.25),
    # --- OpenAI, current (GPT-6: cache writes 1.25x input, cached input 0.1x or less) ---
    # GPT-6.2 Astra is left out: its cache-write rate was not published.
    "gpt-6.2-sol": _openai(2.0, 0.1, 2.5, 10.0, long=True),
    "gpt-6.1-sol": _openai(2.0, 0.1, 2.5, 10.0, long=True),
    "gpt-6-astra": _openai(10.0, 1.0, 12.5, 50.0, long=True),
    "gpt-6-sol": _openai(2.0, 0.2, 2.5, 10.0, long=True),
    "gpt-6-luna": _openai(0.1, 0.01, 0.125, 0.5, long=True),
    # GPT-5.6 Sol is left out: its $4 / $20 promotion was only promised through
    # 2026-11-21, and the rate after it was not published when this table was made.
    "gpt-5.6-terra": _openai(2.0, 0.2, 2.5, 12.0, long=True),
    "gpt-5.6-luna": _openai(0.2, 0.02, 0.25, 1.2, long=True),
    "gpt-5.5": _openai(5.0, 0.5, 5.0, 30.0, long=True),
    "gpt-5.4": _openai(2.5, 0.25, 2.5, 15.0, long=True),
    "gpt-5.4-mini": _openai(0.75, 0.075, 0.75, 4.5, long=False),
    "gpt-5.4-nano": _openai(0.2, 0.02, 0.2, 1.25, long=False),
    # --- OpenAI, older ---
    "gpt-4.1-mini": _openai(0.4, 0.1, 0.4, 1.6, long=False),
    "gpt-4.1": _openai(2.0, 0.5, 2.0, 8.0, long=False),
    "gpt-4o-mini": _openai(0.15, 0.075, 0.15, 0.6, long=False),
    "gpt-4o": _openai(2.5, 1.25, 2.5, 10.0, long=False),
    # The first GPT-4o snapshot kept its launch price, with no cached-input discount: the
    # snapshot-date rule would read it as gpt-4o.
    "gpt-4o-2024-05-13": _openai(5.0, 5.0, 5.0, 15.0, long=False),
}

# What may follow a key in a model id that still names the same model: a snapshot date
# (20251001, 2024-08-06), "-latest", and anything after "@" (Vertex), ":" or "[" (a
# Claude Code context suffix like [1m]).
_SNAPSHOT = re.compile(r"(?:-\d{4}-?\d{2}-?\d{2}|-latest)?(?:[@:\[].*)?", re.DOTALL)


def _matches(model: str, key: str) -> bool:
    if key.endswith("*"):
        return model.startswith(key[:-1])
    return model.startswith(key) and _SNAPSHOT.fullmatch(model, len(key)) is not None


def price_for(model: str | None, table: Mapping[str, Price] = DEFAULT_PRICES) -> Price | None:
    """The price of ``model`` in ``table``, or ``None`` when the table does not know it.

    Keys are tried longest first (a ``*`` key after an exact key of the same length); see
    the module docstring for what a key matches.
    """
    if not model:
        return None
    for key in sorted(table, key=lambda k: (len(k.rstrip("*")), not k.endswith("*")), reverse=True):
        if _matches(model, key):
            return table[key]
    return None
