"""benchmarks/wrapper.py keeps working: each path's incremental conversion sends what
converting the whole history sends, call by call, on a small Claude Code session. How fast
each side is, is the benchmark's output, not asserted here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_wrapper_benchmark_times_both_sides_and_they_send_the_same() -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "wrapper.py"),
            "--session",
            "cc/spotter-4d5611e5-agent-a2898e3",
            "--past",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()[2:]]
    assert [row[0] for row in rows] == ["anthropic", "openai-chat", "pydantic-ai", "langchain"]
    for name, a, _, b, c, _, d, ratio, same in rows:
        assert min(float(a), float(b), float(c), float(d), float(ratio)) > 0, name
        assert same == "yes", name
