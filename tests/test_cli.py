from __future__ import annotations

import argparse
import io
import json
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest
from rich.console import Console

import agentctx
from agentctx import AssistantMessage, ToolCall, UserMessage
from agentctx.budget import Budget
from agentctx.importers import load_transcript
from agentctx.pricing import price_for
from agentctx.replay import SONNET_PRICE, ReplayClock, render, replay
from agentctx.replay.cli import _parser, main
from agentctx.replay.data import DEMO_TRANSCRIPT
from agentctx.replay.engine import SONNET_MODEL
from agentctx.replay.offline_summarizer import OFFLINE_MODEL, OfflineSummarizer, extract_briefing
from agentctx.replay.retention import early_paths
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

if TYPE_CHECKING:
    from collections.abc import Iterator

CORPUS = Path(__file__).parent / "corpus"
PI_SESSION = CORPUS / "pi" / "large-session.jsonl"  # long enough for briefings to splice


def test_replay_of_the_shipped_transcript(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay"]) == 0
    out = capsys.readouterr().out
    assert "claude-code" in out and "strategy llm" in out
    assert "tokens sent:" in out and "prefix-cache breaks" in out
    assert "over budget 0" in out
    # A short subagent whose one 48k-token tool result crosses the budget at once: the
    # tiers meet it in that call, before a briefing could be asked for, and land deep
    # enough (Budget.target_ratio) that the session ends without crossing it again.
    assert "cleared or summarized: truncated x" in out and "summarizer: no requests" in out
    assert "\x1b[" not in out  # not a terminal: plain text, no escape codes
    header = f"{'req':>4} {'msgs':>9} {'without':>9} {'with':>9} {'cache rd':>9} {'cache wr':>9}"
    assert out.splitlines()[1] == header + "  what"


def test_replay_of_a_long_session_splices_briefings(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(PI_SESSION), "--context-window", "66000"]) == 0
    out = capsys.readouterr().out
    assert "pi" in out and "strategy llm" in out and "over budget 0" in out
    assert "spliced a briefing over" in out
    assert re.search(r"briefings? spliced over", out)
    assert re.search(r"summarizer: \d+ requests? \(offline-extractive\)", out)
    assert "cost unknown" in out and "at claude-haiku-5-5 prices $" in out
    share = re.search(r"prices \$([\d.]+), ([\d.]+)% of all spent \(target <= 5 %\)", out)
    spent = re.search(r"simulated input cost at claude-sonnet-4-6 prices: \$([\d.]+) with", out)
    assert share and spent, out
    expected = float(share[1]) / (float(share[1]) + float(spent[1]))
    assert float(share[2]) == pytest.approx(100 * expected, abs=0.06)
    assert float(share[2]) <= 5.0  # the target: summarizer spend at most 5 % of the total


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


def test_compactions_count_the_requests_that_compacted(capsys: pytest.CaptureFixture[str]) -> None:
    """One request compacts the shipped session under every strategy, and each says so once:
    the pipeline, whose cut and tiers reported apart, said two (found by a hostile run)."""
    assert main(["replay", "--compare", "deterministic,pipeline,llm"]) == 0
    rows = re.findall(
        r"^  (deterministic|pipeline|llm) .* (\d+) \(0 spliced\)", capsys.readouterr().out, re.M
    )
    assert rows == [("deterministic", "1"), ("pipeline", "1"), ("llm", "1")]


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


def test_offline_briefing_reads_paths_in_linear_time() -> None:
    """Found by a hostile run (AK, finding 6): a path could start after every ``+`` or ``@``
    of a line, each start read to the end of it: a briefing of a 479 KB transcript took
    2.4 s of the replay's loop. Paths after ``+`` or ``@`` are still found whole."""
    started = time.thread_time()
    briefing = extract_briefing("\n".join(["Assistant: " + "+a/" * 600] * 400))
    assert time.thread_time() - started < 1.0  # 0.4 s of one such line before; ms now
    assert missing_sections(briefing) == []
    found = extract_briefing("Assistant: see +a/b/c.py and @scope/pkg/index.js, ~/x/y.md")
    assert all(p in found for p in ("a/b/c.py", "@scope/pkg/index.js", "~/x/y.md"))
    # (AL, finding 3) A previous briefing's heading ending in a long run of blanks.
    previous = "## Goal" + " " * 40_000 + "of the session\n- fix the parser\n"
    started = time.thread_time()
    assert missing_sections(extract_briefing("Assistant: on it", previous_briefing=previous)) == []
    assert time.thread_time() - started < 1.0  # 3.8 s before


def test_early_paths_of_a_long_command_are_read_in_linear_time() -> None:
    """Found by a hostile run (AL, finding 2): the replay's early paths were read from a
    command's first line with a regex that read a long run of ``a/a/...`` again from each
    start: 9 s for one 40 KB command."""
    call = ToolCall("c1", "bash", {"command": "ls " + "a/" * 20_000 + " && cat src/app.py"})
    later = [AssistantMessage.of("step"), AssistantMessage.of("done")]  # a first third of 3
    history = [UserMessage.of("the task"), AssistantMessage((call,)), *later]
    started = time.thread_time()
    found = [f.text for f in early_paths(history)]
    assert time.thread_time() - started < 1.0
    assert found == ["src/app.py"]


async def test_replay_clock_lets_background_briefings_splice() -> None:
    messages = load_transcript(PI_SESSION).messages
    clock = ReplayClock()
    tiers = DeterministicCompaction()
    summarizer = OfflineSummarizer(5.0, sleep=clock.sleep)
    strategy = Chain([LlmCompaction(summarizer, fallback=tiers, clock=clock), tiers])
    budget = Budget(context_window=66_000)
    report = await replay(messages, budget=budget, strategy=strategy, clock=clock)
    assert report.splices >= 1 and len(summarizer.requests) >= report.splices
    assert {s.model for s in report.summaries} == {OFFLINE_MODEL}
    row = next(r for r in report.rows if r.summarized)
    assert any(a.startswith("spliced a briefing") for a in row.actions)


def test_html_chart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    chart = tmp_path / "replay.html"
    assert (
        main(["replay", str(PI_SESSION), "--context-window", "66000", "--chart", str(chart)]) == 0
    )
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
    messages = load_transcript(PI_SESSION).messages
    requests = sum(1 for i, m in enumerate(messages) if m.role == "assistant" and i)
    assert len(lines["with"].get("points", "").split()) == requests
    assert len(lines["without"].get("points", "").split()) == requests
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
    assert "-0%" not in out and "Error" not in out


def test_the_demo_reads_files_that_exist() -> None:
    """Its scripted model names the files it reads: a file moved away made a read error of
    each, and the session too small to compact once the usage it reported was honest."""
    from agentctx.replay import demo

    names = [name for batch in demo._BATCHES for name in batch]
    assert len(names) > 15 and all((demo.PACKAGE / name).is_file() for name in names)


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


# -- the command line's surface: help, version, honest totals, rich output ----------------


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"agentctx {agentctx.__version__}\n"


def test_version_from_python_m_agentctx() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "agentctx", "--version"], capture_output=True, text=True
    )
    assert run.returncode == 0 and run.stdout.strip() == f"agentctx {agentctx.__version__}"


def _actions(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.Action]]:
    for action in parser._actions:
        yield parser.prog, action
        if isinstance(action, argparse._SubParsersAction):
            for command in action._choices_actions:
                yield parser.prog, command
            for sub in action.choices.values():
                yield from _actions(sub)


def test_every_argument_of_every_command_has_help() -> None:
    seen = set()
    for prog, action in _actions(_parser()):
        seen.add(prog)
        where = f"{prog} {action.dest}"
        assert action.help and action.help.strip() and action.help != argparse.SUPPRESS, where
        if action.default not in (None, argparse.SUPPRESS) and action.dest != "help":
            assert "%(default)s" in action.help, where
        if action.metavar in ("TOKENS", "SECONDS"):
            assert action.metavar.lower() in action.help, where  # the unit
    assert seen == {"agentctx", "agentctx replay", "agentctx demo"}


@pytest.mark.parametrize("command", [[], ["replay"], ["demo"]])
def test_help_shows_defaults_and_units(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main([*command, "--help"])
    assert done.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # unwrapped
    assert "%(" not in out and "None" not in out
    if command == ["replay"]:
        assert "in tokens; the budget is this minus --reserve (default: 53000)" in out
        assert "(default: 16000)" in out and "(default: llm)" in out  # the library's reserve
        assert "seconds of session time" in out and "(default: 8.0)" in out
        shipped = f"(default: the session that ships with agentctx, {DEMO_TRANSCRIPT})"
        assert shipped.replace(" ", "") in out.replace(" ", "")  # long paths wrap anywhere
        assert "at claude-sonnet-4-6 prices" in out
    if command == ["demo"]:
        assert "(default: 30000)" in out and "(default: 16000)" in out


def test_description_is_prose(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "``" not in out and "The agentctx command" not in out
    text = " ".join(out.split())
    for words in (
        "replays a real agent session",
        "through a compaction strategy against a simulated prompt cache",
        "cache reads and writes",
        "input cost",
        "prefix-cache breaks",
        "what was cleared or summarized",
        "'agentctx demo' runs a small scripted agent loop live and prints each event",
    ):
        assert words in text, words
    examples = out[out.index("examples:") :].splitlines()
    assert examples[1].split()[:2] == ["agentctx", "replay"]
    assert any(line.split()[:2] == ["agentctx", "demo"] for line in examples)


def test_change_is_never_minus_zero() -> None:
    assert render.change(49, 100) == "51% fewer"
    assert render.change(100, 100) == "0% fewer"
    assert render.change(1001, 1000) == "0% more"
    assert render.change(103, 100) == "3% more"
    assert render.change(0, 0) == "0% fewer"


@pytest.mark.parametrize(
    ("transcript", "change"),
    [
        (None, "0% fewer"),
        # Its accounting once sent a few tokens more with no compaction, which printed
        # "-0% fewer"; both sides are now one vector sum, the same without compaction.
        (CORPUS / "claude-code" / "ccviewer-5c0375b4.jsonl", "0% fewer"),
    ],
)
def test_no_compaction_prints_no_minus_zero(
    transcript: Path | None, change: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = [] if transcript is None else [str(transcript)]
    assert main(["replay", *path, "--strategy", "none"]) == 0
    out = capsys.readouterr().out
    assert "-0%" not in out
    sent = re.search(r"tokens sent: (\d+) with compaction, (\d+) without \((.+)\)", out)
    assert sent and sent[3] == change, out


def test_totals_name_the_priced_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay"]) == 0
    assert f"simulated input cost at {SONNET_MODEL} prices: $" in capsys.readouterr().out
    assert price_for(SONNET_MODEL) == SONNET_PRICE  # the name is the prices'


def _terminal(width: int = 160) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=width, color_system="standard"), out


def test_rich_report_on_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    console, out = _terminal()
    assert main(["replay"], console=console) == 0
    assert capsys.readouterr().out == ""  # all of it went to the console
    text = out.getvalue()
    assert "\x1b[" in text  # styled
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    header = next(line for line in plain.splitlines() if "cache rd" in line)
    assert [c.strip() for c in header.split("┃")] == [
        "req", "msgs", "without", "with", "cache rd", "cache wr", "what",
    ]  # fmt: skip
    assert "strategy llm" in plain and "totals" in plain
    for label in (
        "tokens sent",
        f"simulated input cost at {SONNET_MODEL} prices",
        "cache reads/writes",
        "cleared or summarized",
        "summarizer",
    ):
        assert re.search(rf"│ {re.escape(label)} +\S", plain), label
    assert "with compaction" in plain and "(68% fewer)" in plain
    assert "replaying" not in plain  # a quick replay shows no progress bar


def test_rich_progress_bar_shows_only_for_slow_replays(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(render, "PROGRESS_AFTER", 0.0)
    console, out = _terminal()
    assert main(["replay"], console=console) == 0
    assert f"replaying {DEMO_TRANSCRIPT.name}" in out.getvalue() and "12/12" in out.getvalue()
    monkeypatch.setattr(render, "PROGRESS_AFTER", 1e9)
    console, out = _terminal()
    assert main(["replay"], console=console) == 0
    assert "replaying" not in out.getvalue()


def test_plain_report_without_rich(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['rich'] = None; "
        "import agentctx.replay.cli as cli; "
        "assert not any(m.startswith('rich') for m in sys.modules if sys.modules[m]); "
        "raise SystemExit(cli.main(['replay']))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "tokens sent:" in run.stdout and "\x1b[" not in run.stdout


def test_progress_is_called_once_per_request() -> None:
    messages = load_transcript(DEMO_TRANSCRIPT).messages
    calls: list[tuple[int, int]] = []

    async def run() -> int:
        report = await replay(
            messages,
            budget=Budget(context_window=53_000),
            strategy=DeterministicCompaction(),
            progress=lambda done, total: calls.append((done, total)),
        )
        return len(report.rows)

    requests = anyio.run(run)
    assert requests == 12
    assert calls == [(done, 12) for done in range(1, 13)]


def test_chart_html_is_the_report_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    chart, report = tmp_path / "chart.html", tmp_path / "report.html"
    assert main(["replay", "--chart", str(chart), "--report", str(report)]) == 0
    out = capsys.readouterr().out
    assert f"chart: {chart}" in out and f"report: {report}" in out
    page = report.read_text()
    assert chart.read_text() == page
    assert '<meta name="viewport"' in page and "@media (max-width:700px)" in page
    assert page.count('<svg class="wide"') == page.count('<svg class="narrow"') == 3


def test_rich_comparison_on_a_terminal() -> None:
    console, out = _terminal()
    assert main(["replay", "--compare", "deterministic,llm"], console=console) == 0
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    header = next(line for line in plain.splitlines() if "tokens sent" in line)
    assert [c.strip() for c in header.split("┃")][:3] == ["strategy", "tokens sent", "change"]
    assert re.search(r"^llm +│ +206,734 │ 68% fewer", plain, flags=re.M), plain


# What a transcript may hold that would act on a terminal instead of showing: a screen clear,
# a hidden hyperlink (OSC 8), a C1 control sequence introducer, a bidirectional override, a
# NUL, and a lone surrogate that no encoding writes.
HOSTILE = "Read\x1b[2J\x1b]8;;http://evil\x1b\\X\x1b]8;;\x1b\\\x9b31m\u202eX\x00\ud800"
_ACTING = re.compile("\x1b\\[2J|\x1b\\]8;;|[\x00\x9b\u202e\ud800]")


def _hostile_transcript(folder: Path, name: str = "t.json") -> Path:
    messages: list[dict[str, object]] = [
        {"role": "user", "content": [{"type": "text", "text": f"task {HOSTILE}"}]}
    ]
    for i in range(6):
        call = {"type": "tool_call", "id": f"c{i}", "name": HOSTILE, "arguments": {"p": f"{i}"}}
        messages.append({"role": "assistant", "content": [call], "stop_reason": "tool_use"})
        output = {"type": "text", "text": f"line {i} " * 6000}
        result = {"role": "tool", "tool_call_id": f"c{i}", "tool_name": HOSTILE}
        messages.append({**result, "content": [output]})
    messages.append({"role": "assistant", "content": [{"type": "text", "text": "done"}]})
    path = folder / name
    path.write_text(json.dumps(messages), "utf-8")
    return path


@pytest.mark.parametrize(
    "strategies", [["--strategy", "deterministic"], ["--compare", "deterministic,none"]]
)
def test_transcript_content_never_acts_on_the_terminal_or_breaks_the_report(
    strategies: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _hostile_transcript(tmp_path, f"a{HOSTILE[4:9]}b.json")
    args = ["replay", str(path), *strategies, "--context-window", "30000"]
    assert main([*args, "--report", str(tmp_path / "r.html")]) == 0
    plain = capsys.readouterr()
    assert "\\x1b[2J" in plain.out and not _ACTING.search(plain.out + plain.err)
    page = (tmp_path / "r.html").read_text("utf-8")
    assert "\\x1b[2J" in page and not _ACTING.search(page)
    console, out = _terminal()
    assert main(args, console=console) == 0
    assert "\\x1b[2J" in out.getvalue() and not _ACTING.search(out.getvalue())


def test_request_times_read_a_lone_clock_jump_as_an_outlier() -> None:
    """Found by a hostile run (CS 3): one stamp far ahead (2099) held the forward-only replay
    clock there for the rest of the session. Now the stamps that keep their order are
    believed, and one later than the next believed one (past `TIME_JITTER`) is read as it,
    counted; seconds of jitter and an early stamp are left as they were."""
    from agentctx.replay.engine import TIME_JITTER, request_times

    future = 4_070_908_800.0
    assert request_times([100.0, 200.0, future, 300.0, 400.0]) == ([100, 200, 300, 300, 400], 1)
    assert request_times([100.0, 200.0, 300.0, 5.0]) == ([100, 200, 300, 5], 0)
    assert request_times([None, 100.0, future, None, 200.0]) == ([None, 100, 200, None, 200], 1)
    jitter = [100.0, 100.0 + TIME_JITTER, 100.0, 200.0]
    assert request_times(jitter) == (jitter, 0)
    assert request_times([]) == ([], 0)


def _skewed_session(tmp_path: Path) -> Path:
    """`PI_SESSION` with its third assistant record stamped 2099: one request time that the
    replay reads as the next one's."""
    records = [json.loads(line) for line in PI_SESSION.read_text().splitlines() if line.strip()]
    assistants = [
        r for r in records if r.get("type") == "message" and r["message"].get("role") == "assistant"
    ]
    assistants[2]["message"]["timestamp"] = 4_070_908_800_000
    assistants[2]["timestamp"] = "2099-01-01T00:00:00Z"
    skewed = tmp_path / "skewed.jsonl"
    skewed.write_text("\n".join(map(json.dumps, records)) + "\n")
    return skewed


def test_a_future_timestamp_does_not_stop_session_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a hostile run (CS 3): one assistant record stamped 2099 pinned the replay
    clock, so no session time passed for the rest of the replay: 0 briefings instead of 3,
    cost x0.43 instead of x0.28, no warning. Now the stamp is read as the next one's, the
    replay is the one of the unskewed session, and it says so once on stderr and in its
    header."""
    skewed = _skewed_session(tmp_path)
    assert main(["replay", str(PI_SESSION), "--context-window", "66000"]) == 0
    plain = capsys.readouterr()
    assert main(["replay", str(skewed), "--context-window", "66000"]) == 0
    read = capsys.readouterr()
    totals = [
        line for line in plain.out.splitlines() if line.startswith(("simulated", "compactions"))
    ]
    assert totals == [
        line for line in read.out.splitlines() if line.startswith(("simulated", "compactions"))
    ]
    assert "3 briefings spliced" in totals[1]
    note = "1 request time later than the ones after read as the next one's"
    assert read.err.count(note) == 1 and note in read.out.splitlines()[0]
    assert note not in plain.out + plain.err


def test_json_says_how_many_request_times_were_read_out_of_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a hostile run (CV 1): the count of request times read as the next one's was
    on stderr and in the table's header, but not in --json, so a script could not tell that
    the replay clock was repaired. Now each transcript of the document has
    ``timestamps_out_of_order`` (0 when every time kept its order), whatever the strategies."""
    skewed = _skewed_session(tmp_path)
    args = ["--context-window", "66000", "--compare", "deterministic,llm", "--json"]
    assert main(["replay", str(skewed), str(PI_SESSION), *args]) == 0
    read = capsys.readouterr()
    files = {Path(f["path"]).name: f for f in json.loads(read.out)["files"]}
    assert files["skewed.jsonl"]["timestamps_out_of_order"] == 1
    assert files[PI_SESSION.name]["timestamps_out_of_order"] == 0
    # The stderr line still comes, once per transcript (not once per strategy).
    assert read.err.count("1 request time later than the ones after") == 1


def test_outputs_that_cannot_be_written_are_refused_before_the_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a hostile run (CS 11): a --report that is a dangling link (to a folder that
    does not exist), a .png chart without matplotlib and a .png chart with --compare were
    refused only after the whole replay. Now each is one line and exit status 2 before any
    replay runs."""
    import agentctx.replay.cli as cli

    def no_replay(*args: object, **kwargs: object) -> None:
        raise AssertionError("the replay ran")

    monkeypatch.setattr(cli, "run_replays", no_replay)
    dangling = tmp_path / "dangling.html"
    dangling.symlink_to(tmp_path / "no" / "such" / "r.html")
    png = str(tmp_path / "c.png")
    for args, said in [
        (["--report", str(dangling)], "there is no folder"),
        (["--compare", "deterministic,llm", "--chart", png], "a .png chart shows one replay"),
        ([str(DEMO_TRANSCRIPT), str(PI_SESSION), "--chart", png], "shows one replay"),
    ]:
        assert main(["replay", *args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err, err
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["replay", "--chart", png]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs the 'chart' extra" in err
    ok = tmp_path / "ok.html"
    (tmp_path / "target.html").symlink_to(ok)  # a link to a file yet to be made is fine
    monkeypatch.undo()
    assert (
        main(["replay", "--strategy", "deterministic", "--report", str(tmp_path / "target.html")])
        == 0
    )
    assert ok.read_text().startswith("<!")
