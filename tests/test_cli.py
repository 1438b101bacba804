from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agentctx.cli import main


def test_replay_of_the_shipped_transcript(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay"]) == 0
    out = capsys.readouterr().out
    assert "claude-code" in out
    assert "tokens sent:" in out and "prefix-cache breaks" in out
    assert "over budget 0" in out


def test_replay_without_compaction_is_the_baseline(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--strategy", "none", "--context-window", "500000"]) == 0
    assert "compactions 0  prefix-cache breaks 0" in capsys.readouterr().out


def test_malformed_transcript_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "session", "id": "x"}\n{not json\n')
    run = subprocess.run(
        [sys.executable, "-m", "agentctx.cli", "replay", str(bad)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2
    assert "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{bad}:2" in lines[0]


def test_missing_file_is_a_clean_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "/nonexistent/session.jsonl"]) == 2
    assert "nonexistent" in capsys.readouterr().err
