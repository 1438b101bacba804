from __future__ import annotations

import pytest

from agentctx import ConfigError
from agentctx.budget import Budget, fraction_from_percent


def test_limits() -> None:
    b = Budget(context_window=200_000, reserve_output=20_000, trigger_ratio=0.8, target_ratio=0.5)
    assert b.limit == 180_000
    assert b.trigger_tokens == 144_000
    assert b.target_tokens == 90_000
    assert Budget(context_window=200_000, hard_budget=50_000).limit == 50_000
    assert b.usage_fraction(90_000) == 0.5


@pytest.mark.parametrize(
    "kwargs",
    [
        {"context_window": 0},
        {"context_window": 100, "reserve_output": 100},
        {"context_window": 1000, "trigger_ratio": 75},
        {"context_window": 1000, "target_ratio": float("nan")},
        {"context_window": 1000, "trigger_ratio": 0.5, "target_ratio": 0.6},
        {"context_window": 1000, "hard_budget": 0},
    ],
)
def test_bad_settings_are_config_errors(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        Budget(**kwargs)  # type: ignore[arg-type]


def test_percent_adapter() -> None:
    assert fraction_from_percent(90) == 0.9
    with pytest.raises(ConfigError):
        fraction_from_percent(-1)


def test_a_lowered_budget_keeps_its_trigger_and_target() -> None:
    for budget in (
        Budget(context_window=200_000),
        Budget(context_window=60_000, reserve_output=8_000, trigger_ratio=0.8, target_ratio=0.33),
        Budget(context_window=1_000_000, hard_budget=50_000),
    ):
        assert budget.lowered(0) is budget
        for by in (1, 37, 1_000):
            lower = budget.lowered(by)
            assert lower.limit == budget.limit - by
            assert lower.trigger_tokens == budget.trigger_tokens
            assert lower.target_tokens == budget.target_tokens
    # lowered below the trigger: the trigger is the limit, the target stays where it was
    small = Budget(context_window=10_000, reserve_output=2_000).lowered(3_000)
    assert small.limit == small.trigger_tokens == 5_000 and small.target_tokens == 800
