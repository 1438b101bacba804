"""Every example in examples/ runs green offline, against the fake servers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

COMPACTED = re.compile(
    r"^compacted \(\w+\): (\d+) -> (\d+) tokens, saved (\d+); \d+ -> \d+ messages$"
)


@pytest.mark.parametrize(
    "name", ["anthropic_loop.py", "anthropic_wrap.py", "openai_responses_loop.py"]
)
def test_example_runs_offline(name: str) -> None:
    env = {**os.environ, "AGENTCTX_OFFLINE": "1", "PYTHONWARNINGS": "error"}
    for key in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL", "OPENAI_BASE_URL"):
        env.pop(key, None)
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    compactions = [m for m in map(COMPACTED.match, lines) if m]
    assert compactions, done.stdout
    for m in compactions:
        before, after, saved = map(int, m.groups())
        assert before > after and saved == before - after
    assert "final answer: Eight small arithmetic helper modules." in lines
    assert lines[-1].startswith("usage: ") and "cache reads" in lines[-1]


def test_examples_refuse_to_run_online_without_a_key() -> None:
    env = {
        k: v for k, v in os.environ.items() if k not in ("AGENTCTX_OFFLINE", "ANTHROPIC_API_KEY")
    }
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "anthropic_wrap.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "AGENTCTX_OFFLINE=1" in done.stderr
