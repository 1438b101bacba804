from __future__ import annotations

import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import anyio
import pytest

from agentctx.budget import Budget
from agentctx.importers import load_transcript
from agentctx.replay import ReplayClock, replay
from agentctx.replay.cli import main
from agentctx.replay.data import DEMO_TRANSCRIPT
from agentctx.replay.offline_summarizer import OFFLINE_MODEL, OfflineSummarizer, extract_briefing
from agentctx.strategies import DeterministicCompaction
from agentctx.strategies.llm import LlmCompaction
from agentctx.strategy import Chain
from agentctx.summarizer import (
    REQUIRED_SECTIONS,
    SummaryRequest,
    check_briefing,
    missing_sections,
    serialize_transcript,
)


def test_replay_of_the_shipped_transcript(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay"]) == 0
    out = capsys.readouterr().out
    assert "claude-code" in out and "strategy llm" in out
    assert "tokens sent:" in out and "prefix-cache breaks" in out
    assert "over budget 0" in out
    # The default shows the whole thing: a briefing spliced, its request and cost reported.
    assert "spliced a briefing over" in out
    assert "1 briefing spliced over" in out
    assert "summarizer: 1 request (offline-extractive)" in out
    assert "cost unknown" in out and "at claude-haiku-5-5 prices $" in out
    share = re.search(r"prices \$([\d.]+), ([\d.]+)% of all spent \(target <= 5 %\)", out)
    spent = re.search(r"simulated input cost: \$([\d.]+) with", out)
    assert share and spent, out
    expected = float(share[1]) / (float(share[1]) + float(spent[1]))
    assert float(share[2]) == pytest.approx(100 * expected, abs=0.06)
    assert float(share[2]) <= 5.0  # DESIGN §7: summarizer spend at most 5 % of the total
    assert "cache reads/writes:" in out and "cleared or summarized: truncated x7" in out


def test_default_replay_is_deterministic(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay"]) == 0
    first = capsys.readouterr().out
    assert main(["replay"]) == 0
    assert capsys.readouterr().out == first


@pytest.mark.parametrize("strategy", ["deterministic", "pipeline", "llm", "none"])
def test_every_builtin_strategy_replays(strategy: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--strategy", strategy]) == 0
    out = capsys.readouterr().out
    assert f"strategy {strategy}" in out and "requests 12" in out
    if strategy != "llm":
        assert "summarizer: no requests" in out


def test_replay_without_compaction_is_the_baseline(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--strategy", "none", "--context-window", "500000"]) == 0
    assert "compactions 0 (0 briefings spliced)  prefix-cache breaks 0" in capsys.readouterr().out


def test_slow_summarizer_falls_back_to_the_tiers(capsys: pytest.CaptureFixture[str]) -> None:
    # Slower than the whole session: the briefing is never back in time.
    assert main(["replay", "--summarizer-delay", "100000"]) == 0
    out = capsys.readouterr().out
    assert "0 briefings spliced" in out and "summarizer: no requests" in out


def test_offline_briefings_pass_check_briefing() -> None:
    messages = load_transcript(DEMO_TRANSCRIPT).messages
    for span in (messages[1:20], messages[:46], messages[30:40]):
        text = serialize_transcript(span)
        summarizer = OfflineSummarizer()
        request = SummaryRequest(system="s", prompt=text, max_tokens=2000, transcript=text)
        result = anyio.run(summarizer.summarize, request)
        assert check_briefing(result) is None, result.text
        assert result.model == OFFLINE_MODEL and result.stop_reason == "stop"
        assert result.usage.input_tokens == (1 + len(text)) // 4
        assert result.usage.output_tokens == len(result.text) // 4
    briefing = extract_briefing(serialize_transcript(messages[:20]))
    assert "## Files touched" in briefing and ".ex" in briefing  # the Elixir files it read
    assert briefing.index("## Goal") < briefing.index("## Open items")


def test_offline_briefing_of_nothing_and_update_keeps_items() -> None:
    empty = extract_briefing("")
    assert missing_sections(empty) == [] and "None recorded." in empty
    first = extract_briefing("User: fix src/app.py\nAssistant: I'll use pytest, never mock.")
    update = extract_briefing("Assistant: edited lib/b.rs", previous_briefing=first)
    assert "src/app.py" in update and "lib/b.rs" in update
    assert "fix src/app.py" in update  # the goal carries over
    assert missing_sections(update, REQUIRED_SECTIONS) == []


async def test_replay_clock_lets_background_briefings_splice() -> None:
    messages = load_transcript(DEMO_TRANSCRIPT).messages
    clock = ReplayClock()
    tiers = DeterministicCompaction()
    summarizer = OfflineSummarizer(5.0, sleep=clock.sleep)
    strategy = Chain([LlmCompaction(summarizer, fallback=tiers, clock=clock), tiers])
    budget = Budget(context_window=45_000, reserve_output=8_000)
    report = await replay(messages, budget=budget, strategy=strategy, clock=clock)
    assert report.splices == 1 and len(summarizer.requests) == 1
    assert [s.model for s in report.summaries] == [OFFLINE_MODEL]
    row = next(r for r in report.rows if r.summarized)
    assert any(a.startswith("spliced a briefing") for a in row.actions)


def test_html_chart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    chart = tmp_path / "replay.html"
    assert main(["replay", "--chart", str(chart)]) == 0
    assert f"chart: {chart}" in capsys.readouterr().out
    text = chart.read_text()
    assert (
        text.startswith("<!DOCTYPE html>")
        and "<script" not in text
        and "http://" not in (text.replace("http://www.w3.org/2000/svg", ""))
    )
    svg = text[text.index("<svg") : text.index("</svg>") + len("</svg>")]
    root = ET.fromstring(svg)  # well-formed XML
    ns = "{http://www.w3.org/2000/svg}"
    ids = {e.get("id") for e in root.iter()}
    assert {"with", "without", "budget"} <= ids
    lines = {e.get("id"): e for e in root.iter(f"{ns}polyline")}
    assert len(lines["with"].get("points", "").split()) == 12
    assert len(lines["without"].get("points", "").split()) == 12
    classes = [e.get("class", "") for e in root.iter()]
    assert any("summarized" in c for c in classes)
    assert any("cache-break" in c for c in classes)


def test_png_chart(tmp_path: Path) -> None:
    assert main(["replay", "--chart", str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c.png").read_bytes().startswith(b"\x89PNG")


def test_png_chart_without_matplotlib_is_a_one_line_error(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['matplotlib'] = None; "
        "from agentctx.replay.cli import main; "
        f"raise SystemExit(main(['replay', '--chart', {str(tmp_path / 'c.png')!r}]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "agentctx: a .png chart needs the 'chart' extra: pip install 'py-agentctx[chart]' "
        "(no module named 'matplotlib')"
    ]
    assert not (tmp_path / "c.png").exists()


def test_unknown_chart_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--chart", str(tmp_path / "c.svgz")]) == 2
    assert "a chart is .html or .png" in capsys.readouterr().err


def test_demo_prints_events_as_they_happen(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "event: ContextCompacted" in out and "saved" in out
    assert "model calls; prompt tokens sent" in out and "summarizer requests" in out


def test_malformed_transcript_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "session", "id": "x"}\n{not json\n')
    run = subprocess.run(
        [sys.executable, "-m", "agentctx", "replay", str(bad)],
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


@pytest.mark.parametrize(
    "args",
    [
        ["replay", "--context-window", "lots"],
        ["replay", "--context-window", "-5"],
        ["replay", "--reserve", "60000"],  # larger than the window
        ["replay", "--summarizer-delay", "nan"],
        ["replay", "--strategy", "magic"],
        ["demo", "--context-window", "1000", "--reserve", "2000"],
    ],
)
def test_bad_numbers_are_one_line_and_exit_2(args: list[str]) -> None:
    run = subprocess.run([sys.executable, "-m", "agentctx", *args], capture_output=True, text=True)
    assert run.returncode == 2, run.stdout
    assert "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
