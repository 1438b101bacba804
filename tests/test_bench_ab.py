"""benchmarks/ab.py keeps working: a git revision's agentctx imported beside the working tree's,
both replaying a cell call by call.

Run as a script in this interpreter on the small Claude Code cell, against HEAD (a fresh clone
has it): it must compare every call that decided nothing, and time both sides. How the two
compare is the benchmark's output, not asserted here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_ab_script_replays_a_cell_with_two_revisions_side_by_side(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "ab.py"),
            "--base",
            "HEAD",
            "--cells",
            "cc/spotter-4d5611e5-agent-a2898e3@50k",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,  # run from anywhere: the script finds its repository
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "working tree against HEAD, deterministic"
    cell, new, base, ratio, per_call, calls, views = lines[2].split()
    assert cell == "cc/spotter-4d5611e5-agent-a2898e3@50k"
    assert float(new) > 0 and float(base) > 0 and float(ratio) > 0 and float(per_call) > 0
    assert 0 < int(calls) <= 12  # the cell's 12 requests, less those that decided
    assert views == "same" or views.startswith("differ@")
    unchanged = subprocess.run(
        ["git", "-C", str(ROOT), "diff", "--quiet", "HEAD", "--", "agentctx"]
    )
    if unchanged.returncode == 0:  # always so in CI, on a clean checkout
        assert views == "same"


def test_the_decisions_of_two_revisions_are_timed_on_the_long_session(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "ab.py"), "--base", "HEAD"]
        + ["--decisions", "1200"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert (
        lines[0]
        == "working tree against HEAD, deterministic, long_session's session to 1200 messages"
    )
    rows = [line.split() for line in lines[2:4]]
    assert [r[0] for r in rows] == ["working", "HEAD"]
    assert all(int(r[-4]) > 0 and all(float(x) > 0 for x in r[-3:]) for r in rows)
    assert lines[4].startswith("(ms of the calling thread's CPU time; p50 ratio ")
    unchanged = subprocess.run(
        ["git", "-C", str(ROOT), "diff", "--quiet", "HEAD", "--", "agentctx"]
    )
    if unchanged.returncode == 0:  # always so in CI, on a clean checkout
        # The same code on both sides: the same decisions, the same views on every call.
        assert rows[0][-4] == rows[1][-4]
        assert lines[4].endswith("; every view the same)")


def test_the_base_revision_is_imported_apart_from_the_working_tree(tmp_path: Path) -> None:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "import ab, pathlib; ab.import_revision('HEAD', pathlib.Path(sys.argv[2]));"
        "import agentctx, agentctx_base, agentctx_base.manager as m;"
        "assert agentctx_base.__file__.startswith(sys.argv[2]), agentctx_base.__file__;"
        "assert m.ContextManager is not agentctx.ContextManager;"
        "print(agentctx_base.ContextManager.__module__, agentctx_base.LlmCompaction.__module__)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(ROOT / "benchmarks"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # the lazily imported names too: the module paths their loader names were rewritten
    assert done.stdout.split() == ["agentctx_base.manager", "agentctx_base.strategies.llm"]
