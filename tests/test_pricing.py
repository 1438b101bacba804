"""`agentctx.pricing`: the default price table, long-prompt tiers, the 1-hour cache-write rate,
model-id matching and user tables; and the `Usage` 1-hour split those prices read."""

from __future__ import annotations

import math
from typing import Any

import pytest

from agentctx.adapters.anthropic import assemble_anthropic_stream, message_from_anthropic_response
from agentctx.errors import ConfigError
from agentctx.messages import AssistantMessage, Usage, fingerprint, from_dict, to_dict
from agentctx.pricing import DEFAULT_PRICES, LongContext, Price, price_for
from agentctx.providers.anthropic_summarizer import DEFAULT_MODEL

M = 1_000_000


def rates(price: Price | None) -> tuple[float, float, float, float, float | None]:
    assert price is not None
    return (price.input, price.output, price.cache_read, price.cache_write, price.cache_write_1h)


# ---------------------------------------------------------------------------------------
# The default table: one model of each family

# (input, output, cache read, cache write 5 m, cache write 1 h), USD per Mtok.
FAMILIES = {
    "claude-fable-5-1": (10.0, 50.0, 0.25, 12.5, 20.0),
    "claude-fable-5": (10.0, 50.0, 1.0, 12.5, 20.0),
    "claude-opus-5-5": (4.0, 20.0, 0.2, 5.0, 8.0),
    "claude-opus-5": (5.0, 25.0, 0.5, 6.25, 10.0),
    "claude-opus-4-8": (5.0, 25.0, 0.5, 6.25, 10.0),
    "claude-opus-4-5": (5.0, 25.0, 0.5, 6.25, 10.0),
    "claude-opus-4-1": (15.0, 75.0, 1.5, 18.75, 30.0),
    "claude-sonnet-5-5": (2.0, 10.0, 0.1, 2.5, 4.0),
    "claude-sonnet-5": (2.0, 10.0, 0.2, 2.5, 4.0),
    "claude-sonnet-4-6": (3.0, 15.0, 0.3, 3.75, 6.0),
    "claude-haiku-5-5": (0.1, 0.5, 0.01, 0.125, 0.2),
    "claude-haiku-4-5": (1.0, 5.0, 0.1, 1.25, 2.0),
    "claude-3-5-haiku": (0.8, 4.0, 0.08, 1.0, 1.6),
    "gpt-6.2-sol": (2.0, 10.0, 0.1, 2.5, None),
    "gpt-6-sol": (2.0, 10.0, 0.2, 2.5, None),
    "gpt-6-luna": (0.1, 0.5, 0.01, 0.125, None),
    "gpt-5.6-luna": (0.2, 1.2, 0.02, 0.25, None),
    "gpt-5.4-mini": (0.75, 4.5, 0.075, 0.75, None),
    "gpt-4.1-mini": (0.4, 1.6, 0.1, 0.4, None),
    "gpt-4o": (2.5, 10.0, 1.25, 2.5, None),
}


@pytest.mark.parametrize(("model", "expected"), FAMILIES.items(), ids=list(FAMILIES))
def test_each_family_has_its_list_price(model: str, expected: tuple[float, ...]) -> None:
    assert rates(price_for(model)) == pytest.approx(expected)


def test_a_million_tokens_of_each_kind_cost_the_rates() -> None:
    price = price_for("claude-opus-5")
    assert price is not None
    assert price.cost(Usage(input_tokens=M)) == pytest.approx(5.0)
    assert price.cost(Usage(output_tokens=M)) == pytest.approx(25.0)
    assert price.cost(Usage(cache_read_tokens=M)) == pytest.approx(0.5)
    assert price.cost(Usage(cache_write_tokens=M)) == pytest.approx(6.25)
    assert price.cost(Usage(100, 20, 1_000, 300)) == pytest.approx(
        (100 * 5 + 20 * 25 + 1_000 * 0.5 + 300 * 6.25) / M
    )


def test_every_default_price_is_well_formed() -> None:
    for model, price in DEFAULT_PRICES.items():
        tiers = [price]
        while (tier := tiers[-1].long_context) is not None:
            assert tier.threshold > 0, model
            assert tier.price.input >= tiers[-1].input, model
            assert tier.price.output >= tiers[-1].output, model
            tiers.append(tier.price)
        for p in tiers:
            assert 0 < p.cache_read <= p.input <= p.cache_write, model
            assert p.cache_write_1h is None or p.cache_write_1h >= p.cache_write, model
            assert p.output > p.input, model
        assert price_for(model) is price, model


# ---------------------------------------------------------------------------------------
# Matching model ids


def test_opus_4_5_and_later_are_not_priced_as_opus_4() -> None:
    old = rates(price_for("claude-opus-4-20250514"))
    assert old[:2] == (15.0, 75.0)
    assert rates(price_for("claude-opus-4-0"))[:2] == (15.0, 75.0)
    assert rates(price_for("claude-opus-4-1-20250805"))[:2] == (15.0, 75.0)
    for model in ("claude-opus-4-5", "claude-opus-4-5-20251101", "claude-opus-4-6"):
        assert rates(price_for(model))[:2] == (5.0, 25.0), model
    for model in ("claude-opus-4-7", "claude-opus-4-8", "claude-opus-5"):
        assert rates(price_for(model))[:2] == (5.0, 25.0), model
    assert rates(price_for("claude-opus-5-5"))[:2] == (4.0, 20.0)


@pytest.mark.parametrize(
    ("model", "same_as"),
    [
        ("claude-haiku-4-5-20251001", "claude-haiku-4-5"),
        ("claude-haiku-4-5@20251001", "claude-haiku-4-5"),  # Vertex
        ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5"),
        ("claude-sonnet-5-5[1m]", "claude-sonnet-5-5"),  # Claude Code's 1M-context name
        ("claude-3-5-haiku-latest", "claude-3-5-haiku"),
        ("claude-3-5-haiku-20241022", "claude-3-5-haiku"),
        ("gpt-4o-2024-08-06", "gpt-4o"),
        ("gpt-4o-mini-2024-07-18", "gpt-4o-mini"),
        ("gpt-5.4-mini-2026-03-17", "gpt-5.4-mini"),
    ],
)
def test_dated_and_suffixed_ids_match_their_model(model: str, same_as: str) -> None:
    assert price_for(model) is DEFAULT_PRICES[same_as]


def test_a_snapshot_priced_apart_from_its_model_is_not_given_the_models_price() -> None:
    """Found by a hostile run (CX 7): gpt-4o-2024-05-13 kept GPT-4o's launch price ($5 /
    $15, no cached-input discount) and was priced as gpt-4o by the snapshot-date rule: 1M
    input and 1M output tokens came to $12.50 instead of $20."""
    price = price_for("gpt-4o-2024-05-13")
    assert price is not None and price is not DEFAULT_PRICES["gpt-4o"]
    assert rates(price)[:3] == (5.0, 15.0, 5.0)
    assert price.cost(Usage(input_tokens=1_000_000, output_tokens=1_000_000)) == 20.0


@pytest.mark.parametrize(
    "model",
    [
        None,
        "",
        "mystery-model",
        "claude-opus-4-9",  # a future minor version is not Opus 4's price
        "claude-sonnet-5-6",
        "gpt-5.4-pro",  # another model of the family, not GPT-5.4's price
        "gpt-5",
        "gpt-5.6-sol",  # left out on purpose: its price after 2026-11-21 is unknown
        "claude-haiku-4-50",
        "anthropic/claude-haiku-5-5",
    ],
)
def test_unknown_models_have_no_price(model: str | None) -> None:
    assert price_for(model) is None


def test_a_user_table_overrides_and_extends_the_defaults() -> None:
    mine = Price(1.0, 2.0, 0.1, 1.25)
    cheaper = Price(0.5, 2.5, 0.05, 0.625)
    table = {**DEFAULT_PRICES, "my-model": mine, "claude-haiku-4-5": cheaper}
    assert price_for("my-model", table) is mine
    assert price_for("my-model-2026-01-31", table) is mine
    assert price_for("claude-haiku-4-5-20251001", table) is cheaper
    assert price_for("claude-opus-5", table) is DEFAULT_PRICES["claude-opus-5"]
    # Only what the table holds: the defaults are not consulted behind its back.
    assert price_for("claude-opus-5", {"my-model": mine}) is None
    assert price_for("my-model", {}) is None


def test_a_star_key_is_a_plain_prefix_and_exact_keys_win() -> None:
    anything = Price(9.0, 9.0, 0.9, 9.0)
    exact = Price(1.0, 5.0, 0.1, 1.25)
    table = {"claude-*": anything, "claude-haiku-4-5": exact}
    assert price_for("claude-haiku-4-5-20251001", table) is exact
    assert price_for("claude-opus-9", table) is anything
    assert price_for("gpt-6-sol", table) is None


# ---------------------------------------------------------------------------------------
# Long-prompt tiers


def test_haiku_5_5_switches_tier_above_100k_prompt_tokens() -> None:
    price = price_for("claude-haiku-5-5")
    assert price is not None and price.long_context is not None
    assert price.long_context.threshold == 100_000
    # The prompt counts uncached input, cache reads and cache writes alike.
    at = Usage(
        input_tokens=10_000,
        output_tokens=1_000,
        cache_read_tokens=60_000,
        cache_write_tokens=30_000,
    )
    assert at.prompt_tokens == 100_000
    assert price.for_prompt(100_000) is price
    assert price.cost(at) == pytest.approx(
        (10_000 * 0.1 + 1_000 * 0.5 + 60_000 * 0.01 + 30_000 * 0.125) / M
    )
    above = Usage(10_001, 1_000, 60_000, 30_000)
    assert above.prompt_tokens == 100_001
    assert rates(price.for_prompt(100_001)) == pytest.approx((0.5, 2.5, 0.05, 0.625, 1.0))
    # Every token of the request pays the long rate, output included.
    assert price.cost(above) == pytest.approx(
        (10_001 * 0.5 + 1_000 * 2.5 + 60_000 * 0.05 + 30_000 * 0.625) / M
    )


@pytest.mark.parametrize("model", ["gpt-6.2-sol", "gpt-6-luna", "gpt-6-astra", "gpt-5.4"])
def test_openai_long_context_above_272k_input_tokens(model: str) -> None:
    price = price_for(model)
    assert price is not None
    short = Usage(input_tokens=72_000, output_tokens=1_000, cache_read_tokens=200_000)
    long = Usage(input_tokens=72_001, output_tokens=1_000, cache_read_tokens=200_000)
    assert (short.prompt_tokens, long.prompt_tokens) == (272_000, 272_001)
    assert price.for_prompt(272_000) is price
    doubled = price.for_prompt(272_001)
    assert doubled.input == pytest.approx(2 * price.input)
    assert doubled.cache_read == pytest.approx(2 * price.cache_read)
    assert doubled.cache_write == pytest.approx(2 * price.cache_write)
    assert doubled.output == pytest.approx(1.5 * price.output)
    assert price.cost(long) > 1.4 * price.cost(short)


def test_models_without_a_tier_pay_the_same_at_any_length() -> None:
    for model in ("claude-sonnet-5-5", "claude-opus-5-5", "claude-sonnet-4-6", "gpt-4o"):
        price = price_for(model)
        assert price is not None and price.for_prompt(900_000) is price, model


def test_sonnet_4_5_keeps_its_200k_surcharge() -> None:
    price = price_for("claude-sonnet-4-5-20250929")
    assert price is not None
    assert rates(price.for_prompt(200_000)) == (3.0, 15.0, 0.3, 3.75, 6.0)
    assert rates(price.for_prompt(200_001)) == pytest.approx((6.0, 22.5, 0.6, 7.5, 12.0))


def test_tiers_nest() -> None:
    top = Price(4.0, 8.0, 0.4, 5.0)
    mid = Price(2.0, 4.0, 0.2, 2.5, long_context=LongContext(500, top))
    price = Price(1.0, 2.0, 0.1, 1.25, long_context=LongContext(100, mid))
    assert [price.for_prompt(n) for n in (100, 101, 500, 501)] == [price, mid, mid, top]


# ---------------------------------------------------------------------------------------
# 1-hour cache writes


def test_one_hour_writes_pay_the_one_hour_rate_when_the_split_is_known() -> None:
    price = price_for("claude-haiku-4-5")
    assert price is not None
    split = Usage(cache_write_tokens=1_000, cache_write_1h_tokens=400)
    assert price.cost(split) == pytest.approx((600 * 1.25 + 400 * 2.0) / M)
    # Writes whose TTL the usage does not say are 5-minute writes.
    assert price.cost(Usage(cache_write_tokens=1_000)) == pytest.approx(1_000 * 1.25 / M)
    # All of it written for an hour.
    all_1h = Usage(cache_write_tokens=1_000, cache_write_1h_tokens=1_000)
    assert price.cost(all_1h) == pytest.approx(1_000 * 2.0 / M)
    # A split larger than the writes is capped at the writes.
    bad = Usage(cache_write_tokens=100, cache_write_1h_tokens=1_000)
    assert price.cost(bad) == pytest.approx(100 * 2.0 / M)


def test_a_price_without_a_one_hour_rate_uses_the_five_minute_rate() -> None:
    price = Price(3.0, 15.0, 0.3, 3.75)
    split = Usage(cache_write_tokens=1_000, cache_write_1h_tokens=400)
    assert price.cost(split) == pytest.approx(1_000 * 3.75 / M)


def test_one_hour_writes_in_the_long_tier_pay_the_tiers_one_hour_rate() -> None:
    price = price_for("claude-haiku-5-5")
    assert price is not None
    usage = Usage(200_000, 0, 0, 10_000, 10_000)
    assert price.cost(usage) == pytest.approx((200_000 * 0.5 + 10_000 * 1.0) / M)


# ---------------------------------------------------------------------------------------
# The Usage split: arithmetic, JSON, and the Anthropic adapter that fills it


def test_usage_split_adds_and_round_trips() -> None:
    a = Usage(10, 5, 100, 20, 8)
    b = Usage(1, 1, 1, 4, 2)
    assert a + b == Usage(11, 6, 101, 24, 10)
    assert (a + b).prompt_tokens == 11 + 101 + 24  # the split is inside the writes
    message = AssistantMessage.of("ok", usage=a)
    d = to_dict(message)
    assert d["usage"]["cache_write_1h_tokens"] == 8
    assert from_dict(d) == message


def test_usage_without_one_hour_writes_serializes_as_before() -> None:
    message = AssistantMessage.of("ok", usage=Usage(10, 5, 100, 20))
    d = to_dict(message)
    assert d["usage"] == {
        "input_tokens": 10,
        "output_tokens": 5,
        "cache_read_tokens": 100,
        "cache_write_tokens": 20,
    }
    assert from_dict(d) == message
    # So the fingerprint of every message recorded before the field existed is unchanged.
    assert fingerprint(from_dict(d)) == fingerprint(message)


def _response(usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-haiku-5-5",
        "content": [{"type": "text", "text": "ok"}],
        "stop_reason": "end_turn",
        "usage": usage,
    }


def test_the_anthropic_adapter_reads_the_one_hour_split() -> None:
    usage = {
        "input_tokens": 3,
        "output_tokens": 7,
        "cache_read_input_tokens": 500,
        "cache_creation_input_tokens": 1_300,
        "cache_creation": {"ephemeral_5m_input_tokens": 300, "ephemeral_1h_input_tokens": 1_000},
    }
    m = message_from_anthropic_response(_response(usage))
    assert m.usage == Usage(3, 7, 500, 1_300, 1_000)
    price = price_for(m.model)
    assert price is not None
    assert price.cost(m.usage) == pytest.approx(
        (3 * 0.1 + 7 * 0.5 + 500 * 0.01 + 300 * 0.125 + 1_000 * 0.2) / M
    )


def test_the_anthropic_adapter_without_a_split() -> None:
    usage = {"input_tokens": 3, "output_tokens": 7, "cache_creation_input_tokens": 40}
    assert message_from_anthropic_response(_response(usage)).usage == Usage(3, 7, 0, 40)
    odd = {**usage, "cache_creation": {"ephemeral_1h_input_tokens": 90}}  # more than written
    assert message_from_anthropic_response(_response(odd)).usage == Usage(3, 7, 0, 40, 40)
    junk = {**usage, "cache_creation": "n/a"}
    assert message_from_anthropic_response(_response(junk)).usage == Usage(3, 7, 0, 40)


def test_a_streamed_response_keeps_the_split() -> None:
    start = _response(
        {
            "input_tokens": 3,
            "output_tokens": 1,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 50,
            "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 50},
        }
    )
    start["content"] = []
    events = [
        {"type": "message_start", "message": start},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok"}},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 9},
        },
        {"type": "message_stop"},
    ]
    m = message_from_anthropic_response(assemble_anthropic_stream(events))
    assert m.usage == Usage(3, 9, 0, 50, 50)


# ---------------------------------------------------------------------------------------
# The summarizer's default model


def test_the_default_summarizer_model_is_priced_and_not_deprecated() -> None:
    assert DEFAULT_MODEL == "claude-haiku-5-5"
    assert price_for(DEFAULT_MODEL) is not None
    data = pytest.importorskip("anthropic._data")  # the SDK's own deprecation list
    assert DEFAULT_MODEL not in data.DEPRECATED_MODELS


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0, "3"])
def test_a_price_that_is_no_price_is_refused_when_made(bad: object) -> None:
    """Found by a hostile run (BO 3): a NaN or infinite price was taken, and every cost the
    spend, the events and the spans reported was NaN (infinity times no cache tokens)."""
    with pytest.raises(ConfigError, match="finite number"):
        Price(bad, 1.0, 1.0, 1.0)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="cache_write_1h"):
        Price(1.0, 1.0, 1.0, 1.0, cache_write_1h=bad)  # type: ignore[arg-type]


def test_a_price_tier_that_is_no_tier_or_a_price_past_any_is_refused_when_made() -> None:
    """Found by a hostile run (BQ 4): a `long_context` that was no `LongContext`, a tier
    with no price or a NaN threshold, and prices of 10**400 or 1e308 were taken, and costing
    raised or came out infinite."""
    with pytest.raises(ConfigError, match="long_context"):
        Price(1.0, 1.0, 1.0, 1.0, None, "x")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="LongContext.price"):
        LongContext(5, None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="threshold"):
        LongContext(math.nan, Price(1.0, 1.0, 1.0, 1.0))  # type: ignore[arg-type]
    for huge in (10**400, 1e308):
        with pytest.raises(ConfigError, match="<= 1e"):
            Price(huge, 1.0, 1.0, 1.0)
