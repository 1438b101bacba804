"""Per-model prices in USD per million tokens; unknown prices are ``None``, never 0.

```python
price = price_for("claude-sonnet-4-5")          # or your own: Price(3.0, 15.0, 0.3, 3.75)
price.cost(Usage(input_tokens=1000, output_tokens=200))  # -> USD float
```
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

    from agentctx.messages import Usage

__all__ = ["DEFAULT_PRICES", "Price", "price_for"]


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens: input, output, cache read, cache write (5-minute TTL)."""

    input: float
    output: float
    cache_read: float
    cache_write: float

    def cost(self, usage: Usage) -> float:
        """The USD cost of ``usage`` at these prices."""
        return (
            usage.input_tokens * self.input
            + usage.output_tokens * self.output
            + usage.cache_read_tokens * self.cache_read
            + usage.cache_write_tokens * self.cache_write
        ) / 1_000_000


# Published list prices (USD / Mtok). Matched by prefix, longest first.
DEFAULT_PRICES: Mapping[str, Price] = {
    "claude-opus-4": Price(15.0, 75.0, 1.5, 18.75),
    "claude-sonnet-4": Price(3.0, 15.0, 0.3, 3.75),
    "claude-haiku-4": Price(1.0, 5.0, 0.1, 1.25),
    "claude-3-5-haiku": Price(0.8, 4.0, 0.08, 1.0),
    "gpt-4.1-mini": Price(0.4, 1.6, 0.1, 0.4),
    "gpt-4.1": Price(2.0, 8.0, 0.5, 2.0),
    "gpt-4o-mini": Price(0.15, 0.6, 0.075, 0.15),
    "gpt-4o": Price(2.5, 10.0, 1.25, 2.5),
}


def price_for(model: str | None, table: Mapping[str, Price] = DEFAULT_PRICES) -> Price | None:
    """The price of ``model`` from ``table`` (prefix match), or ``None`` when unknown."""
    if not model:
        return None
    for prefix in sorted(table, key=len, reverse=True):
        if model.startswith(prefix):
            return table[prefix]
    return None
