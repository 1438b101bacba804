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
