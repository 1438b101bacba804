"""benchmarks/retention.py still runs, plants what it says, and its checks can tell the three
outcomes apart (on a short session and a small budget, so it takes well under a second)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest

from agentctx.strategies import DeterministicCompaction

if TYPE_CHECKING:
    from collections.abc import Iterator

RETENTION = Path(__file__).resolve().parents[1] / "benchmarks" / "retention.py"


@pytest.fixture(scope="module")
def retention() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("_retention_benchmark", RETENTION)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def test_every_kind_is_planted_where_the_fact_says(retention: ModuleType) -> None:
    workload = retention.planted_session(0, 60)
    raw = [m for group in workload.groups for m in group]
    kinds = {f.kind for f in workload.facts}
    assert kinds == set(retention.KINDS)
    for fact in workload.facts:
        assert fact.index < len(raw) // 2  # early: the first third of the calls
        assert fact.text in retention.visible_text([raw[fact.index]])
    assert len({f.text for f in workload.facts}) == len(workload.facts)


async def test_a_tight_budget_is_checked_after_each_compaction(retention: ModuleType) -> None:
    workload = retention.planted_session(0, 60)
    row = await retention.run(workload, "tiers only", DeterministicCompaction, 6_000, explain=True)
    assert row.checks >= 3
    assert row.task_ok == row.latest_ok == row.checks  # docs/invariants.md: the task survives
    assert len(row.per_check) == row.checks
    # Both ways of keeping a fact are seen, so neither check is silently always false.
    assert row.split["view"] > 0 and row.split["recall"] > 0
    assert sum(row.split.values()) == sum(sum(c.values()) for c in row.kinds.values())
    assert len(row.explained) <= sum(row.lost_kinds.values())


async def test_a_marker_absorbed_by_a_condensed_turn_stays_recallable(
    retention: ModuleType,
) -> None:
    """The row that lost 61 % of its facts before condensed lines passed on the recall ids
    of the markers they absorbed (seed 0, 25k, tiers only): nothing is lost now."""
    workload = retention.planted_session(0, 200)
    row = await retention.run(
        workload, "tiers only", DeterministicCompaction, 25_000, explain=False
    )
    assert row.checks >= 5
    assert sum(row.lost_kinds.values()) == 0, row.lost_kinds
