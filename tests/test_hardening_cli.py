"""The replay CLI, the importers and the replay engine against hostile input: each test is a
finding of a hostile run, kept as its reproduction."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentctx.budget import Budget
from agentctx.errors import ConfigError, TranscriptFormatError
from agentctx.importers import load_transcript
from agentctx.messages import (
    AssistantMessage,
    Message,
    TextBlock,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    fingerprint,
    sent_at,
)
from agentctx.replay import cli, engine
from agentctx.replay.cached_summarizer import SummaryCache
from agentctx.replay.cli import main
from agentctx.strategies import CondensePass, DeterministicCompaction, ToolOutputPipeline
from agentctx.strategy import Chain
from agentctx.tokens.count import MessageCounter

from .corpus import corpus_file

HUGE = 10**400


def _session(n: int, extra: dict[str, Any] | None = None) -> list[Message]:
    messages: list[Message] = [UserMessage.of("task")]
    i = 0
    while len(messages) < n:
        i += 1
        stamp = dict(extra or {})
        messages.append(AssistantMessage((ToolCall(f"c{i}", "bash", {"cmd": f"cat f{i}"}),)))
        output = (TextBlock(f"out {i} " * 400),)
        messages.append(ToolResultMessage(f"c{i}", output, "bash", False, stamp))
    messages.append(AssistantMessage.of("done"))
    return messages


CALLED = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
]
"""A session with one model call to replay."""


def _pi_file(folder: Path, lines: list[dict[str, Any]], name: str = "s.jsonl") -> Path:
    records: list[dict[str, Any]] = [{"type": "session", "version": 3, "id": "s"}]
    parent = None
    for k, message in enumerate(lines):
        records.append({"type": "message", "id": f"e{k}", "parentId": parent, "message": message})
        parent = f"e{k}"
    path = folder / name
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n", "utf-8")
    return path


# -- numbers past what a float holds ----------------------------------------------------------


def test_a_budget_past_sys_maxsize_is_a_config_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="context_window.*sys.maxsize"):
        Budget(context_window=HUGE)
    with pytest.raises(ConfigError, match="threshold_chars"):
        CondensePass(threshold_chars=HUGE)
    assert Budget(context_window=sys.maxsize).limit == sys.maxsize - 16_000
    assert main(["replay", "--context-window", str(HUGE)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("agentctx: ") and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    ("stamp", "seconds"),
    [
        (1_700_000_000_000, 1_700_000_000.0),
        (1.5e12, 1.5e9),
        (HUGE, None),
        (float("nan"), None),
        (math.inf, None),
        (-5, None),
        (True, None),
        ("1700000000000", None),
    ],
)
def test_sent_at_reads_only_a_time(stamp: object, seconds: float | None) -> None:
    assert sent_at(UserMessage((TextBlock("x"),), {"timestamp": stamp})) == seconds


@pytest.mark.parametrize("stamp", [HUGE, float("nan"), -1, 1e300])
async def test_a_timestamp_that_is_no_time_is_not_read_as_one(stamp: object) -> None:
    """An integer timestamp beyond a float's range made the pipeline's scan and the replay
    engine raise a bare OverflowError."""
    messages = _session(40, {"timestamp": stamp})
    strategy = Chain([ToolOutputPipeline(), DeterministicCompaction()])
    report = await engine.replay(
        messages, budget=Budget(context_window=12_000, reserve_output=1_000), strategy=strategy
    )
    assert report.compactions and not any(r.over_budget for r in report.rows)


# -- the replay engine: each request costs what it adds --------------------------------------


def test_a_replay_counts_each_message_once_not_once_per_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every request re-fingerprinted and re-counted the whole history: a 50k-message pi
    session took 8 minutes, a quarter of it per 10k messages more than the last."""
    seen: dict[str, int] = {"vector": 0, "count": 0, "refine": 0, "fingerprint": 0}

    def counting(name: str, f: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            seen[name] += len(args[1]) if name == "refine" and isinstance(args[1], list) else 1
            return f(*args, **kwargs)

        return wrapped

    for name in ("vector", "count", "refine"):
        monkeypatch.setattr(MessageCounter, name, counting(name, getattr(MessageCounter, name)))
    monkeypatch.setattr(engine, "fingerprint", counting("fingerprint", fingerprint))
    messages = _session(1_200)
    # A window nothing fills: the view is the whole history, as long as the request.
    anyio.run(lambda: engine.replay(messages, budget=Budget(context_window=10**7)))
    assert max(seen.values()) <= 4 * len(messages), seen


# -- the CLI ----------------------------------------------------------------------------------


def test_ctrl_c_is_a_line_and_exit_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(*args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_replay", interrupted)
    assert main(["replay"]) == 130
    assert capsys.readouterr().err == "agentctx: interrupted\n"


def test_an_output_the_terminal_cannot_encode_says_so(tmp_path: Path) -> None:
    """(Hostile run EA, 9) With stdout in ASCII, replaying a file named ``é.jsonl`` printed
    "'ascii' codec can't encode character": a line, but not that stdout's encoding is why."""
    _pi_file(tmp_path, CALLED, "é.jsonl")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentctx",
            "replay",
            str(tmp_path / "é.jsonl"),
            "--strategy",
            "none",
        ],
        capture_output=True,
        env={**os.environ, "PYTHONIOENCODING": "ascii"},
        timeout=120,
    )
    err = done.stderr.decode()
    assert done.returncode == 2 and err.count("\n") == 1, err
    assert "this terminal's encoding (ascii)" in err and "PYTHONIOENCODING=utf-8" in err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this system")
def test_a_folder_names_every_entry_it_skips(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _pi_file(tmp_path, CALLED, "a.jsonl")
    os.mkfifo(tmp_path / "pipe.jsonl")
    (tmp_path / "gone.jsonl").symlink_to(tmp_path / "missing")
    assert main(["replay", str(tmp_path), "--strategy", "none"]) == 0
    err = capsys.readouterr().err
    assert "skipped" in err and "pipe.jsonl" in err and "gone.jsonl" in err


def test_a_named_file_that_is_no_transcript_is_an_error_beside_a_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a hostile run (P, finding 10): named beside a folder, a file that is no
    transcript was skipped like a folder's entry, and the command exited 0."""
    (tmp_path / "sessions").mkdir()
    _pi_file(tmp_path / "sessions", [{"role": "user", "content": "hi"}], "a.jsonl")
    (tmp_path / "mine.jsonl").write_text("not a transcript\n")
    args = ["replay", str(tmp_path / "sessions"), str(tmp_path / "mine.jsonl")]
    assert main([*args, "--strategy", "none"]) == 2
    assert "mine.jsonl:1: expected" in capsys.readouterr().err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this system")
def test_a_summary_cache_that_is_no_file_is_refused_not_waited_on(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "cache.jsonl")
    with pytest.raises(ConfigError, match="must be a file"):
        SummaryCache(tmp_path / "cache.jsonl")


def test_a_summary_cache_line_nested_too_deep_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "cache.jsonl"
    path.write_text("[" * 100_000 + "]" * 100_000 + "\n", "utf-8")
    assert len(SummaryCache(path)) == 0


async def test_a_cached_reply_keeps_what_it_was_priced_on_and_its_native_messages(
    tmp_path: Path,
) -> None:
    """Found by a hostile run: the cache file kept text, stop reason, model and usage only,
    so an unpriced reply came back priced (``usage_known`` True) and a provider-native one
    without the messages it splices. A native summarizer's requests are keyed by their
    conversation too: the same prompt over another conversation is another request."""
    from agentctx.messages import AssistantMessage, OpaqueBlock
    from agentctx.messages import UserMessage as User
    from agentctx.replay.cached_summarizer import CachedSummarizer
    from agentctx.summarizer import SummaryRequest, SummaryResult

    native = (
        AssistantMessage((OpaqueBlock("anthropic", {"type": "compaction", "content": "x"}),)),
    )

    class Native:
        model = "claude-haiku-4-5"
        sends_conversation = True
        calls = 0

        async def summarize(self, request: SummaryRequest) -> SummaryResult:
            self.calls += 1
            return SummaryResult(text="x", stop_reason="stop", messages=native, usage_known=False)

    path = tmp_path / "cache.jsonl"
    first = SummaryRequest(system="s", prompt="p", max_tokens=300, conversation=(User.of("a"),))
    live = await CachedSummarizer(Native(), SummaryCache(path)).summarize(first)
    summarizer = Native()
    read = await CachedSummarizer(summarizer, SummaryCache(path)).summarize(first)
    assert summarizer.calls == 0  # from the file
    assert read == live and read.messages == native and read.usage_known is False
    other = SummaryRequest(system="s", prompt="p", max_tokens=300, conversation=(User.of("b"),))
    await CachedSummarizer(summarizer, SummaryCache(path)).summarize(other)
    assert summarizer.calls == 1


# -- the importers ----------------------------------------------------------------------------


@pytest.mark.parametrize(("written", "error"), [(True, True), (False, False), ("false", False)])
def test_pi_is_error_is_read_as_pi_writes_it(tmp_path: Path, written: object, error: bool) -> None:
    call = {"type": "toolCall", "id": "c", "name": "bash", "arguments": {}}
    path = _pi_file(
        tmp_path,
        [
            {"role": "user", "content": "task"},
            {"role": "assistant", "content": [call]},
            {"role": "toolResult", "toolCallId": "c", "content": "out", "isError": written},
        ],
    )
    result = load_transcript(path).messages[2]
    assert isinstance(result, ToolResultMessage) and result.is_error is error


@pytest.mark.parametrize("max_bytes", [HUGE, -1, 1.5, True, "10", None])
def test_max_bytes_must_be_a_whole_number_of_bytes(tmp_path: Path, max_bytes: Any) -> None:
    path = _pi_file(tmp_path, [{"role": "user", "content": "hi"}])
    with pytest.raises(ConfigError, match="max_bytes"):
        load_transcript(path, max_bytes=max_bytes)


def test_a_path_with_a_nul_is_no_such_file() -> None:
    with pytest.raises(FileNotFoundError, match="NUL"):
        load_transcript("a\0b.jsonl")


@pytest.mark.parametrize("name", ["run\udcff.jsonl", "cost$\\frac{$.jsonl", "a$x$b.jsonl"])
def test_a_png_chart_titled_with_any_file_name_is_written(tmp_path: Path, name: str) -> None:
    """Found by a hostile run (P, finding 1): the chart's title is the transcript's file
    name, handed to matplotlib as it is: a name that is not UTF-8 raised a TypeError
    traceback, and one with ``$...$`` in it was read as a formula (or failed to parse)."""
    source = Path(__file__).parent / "corpus" / "claude-code" / "spotter-tool_heavy.jsonl"
    path = tmp_path / name
    path.write_bytes(source.read_bytes())
    chart = tmp_path / "c.png"
    assert main(["replay", str(path), "--strategy", "none", "--chart", str(chart)]) == 0
    assert chart.read_bytes().startswith(b"\x89PNG")


def test_the_progress_bar_shows_a_file_name_as_text() -> None:
    """Found by a hostile run (P, finding 5): the progress bar wrote the file name raw (an
    escape sequence reached the terminal) and read it as rich markup (``[blink]``,
    ``[link=...]`` took effect)."""
    import io

    from rich.console import Console

    from agentctx.replay.render import LazyProgress

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200, color_system="truecolor")
    name = "x\x1b[31mRED[blink]B[/blink][link=https://evil.example]L[/link].jsonl"
    with LazyProgress(console, cli.printable(f"replaying {name}"), after=0.0) as progress:
        progress(1, 2)
    shown = out.getvalue()
    assert "\\x1b[31mRED[blink]B[/blink][link=https://evil.example]L[/link]" in shown
    assert "\x1b]8;" not in shown and "\x1b[5m" not in shown  # no link, no blinking


@pytest.mark.parametrize(
    ("flag", "path", "says"),
    [
        ("--report", "{tmp}/missing/r.html", "there is no folder"),
        ("--report", "", "the path is empty"),
        ("--report", "{tmp}", "a folder, not a file"),
        ("--chart", "{tmp}/c.svgz", "a chart is .html or .png"),
    ],
)
def test_an_output_path_that_cannot_be_written_is_refused_before_the_replay(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    flag: str,
    path: str,
    says: str,
) -> None:
    """Found by a hostile run (P, finding 11): output paths were tried after every replay had
    run (minutes on a long session), and an empty one was ignored in silence."""

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("replayed before the output path was checked")

    monkeypatch.setattr(cli, "run_replays", never)
    assert main(["replay", "--strategy", "none", flag, path.format(tmp=tmp_path)]) == 2
    assert says in capsys.readouterr().err


def test_an_output_that_fails_to_be_written_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    """An error writing an output names it (a full disk's error names no file)."""
    if not Path("/dev/full").exists():
        pytest.fail("this test needs /dev/full (Linux)")
    assert main(["replay", "--strategy", "none", "--report", "/dev/full"]) == 2
    assert "--report /dev/full: No space left on device" in capsys.readouterr().err


def test_a_comparison_shows_a_file_name_as_text(tmp_path: Path) -> None:
    """Found by a hostile run (Q, finding 5): with --compare on a terminal, the table of each
    transcript was titled with its file name read as rich markup (a link, blinking text)."""
    import io

    from rich.console import Console

    source = Path(__file__).parent / "corpus" / "claude-code" / "spotter-tool_heavy.jsonl"
    path = tmp_path / "x[blink]B[link=https:evil.example]L.jsonl"
    path.write_bytes(source.read_bytes())
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=300, color_system="truecolor")
    assert main(["replay", str(path), "--compare", "none,deterministic"], console=console) == 0
    shown = out.getvalue()
    assert "x[blink]B[link=https:evil.example]L.jsonl" in shown
    assert "\x1b]8;" not in shown and "\x1b[5m" not in shown


@pytest.mark.parametrize("flag", ["--report", "--chart"])
def test_an_output_path_that_is_a_transcript_replayed_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    """Found by a hostile run (AD, finding 4): ``--report session.jsonl`` (tab completion's
    slip) wrote the report over the session replayed, often its only copy, and exited 0. A
    link to it is the same file."""
    session = _pi_file(tmp_path, [{"role": "user", "content": "task"}], name="s.html")
    before = session.read_bytes()
    link = tmp_path / "link.html"
    link.symlink_to(session)
    for output in (session, link):
        assert main(["replay", str(session), "--strategy", "none", flag, str(output)]) == 2
        assert "a transcript replayed, not overwritten" in capsys.readouterr().err
    assert session.read_bytes() == before


def test_an_empty_transcript_path_is_refused_not_read_as_the_current_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a hostile run (AD, finding 8): ``agentctx replay "$SESSION"`` with the variable
    unset replayed every transcript in the working folder (``Path("")`` is ``.``), exit 0."""
    _pi_file(tmp_path, [{"role": "user", "content": "task"}])
    monkeypatch.chdir(tmp_path)
    for empty in ("", "  "):
        assert main(["replay", empty, "--strategy", "none"]) == 2
        assert "a transcript path is empty" in capsys.readouterr().err


def test_a_file_named_twice_is_replayed_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a hostile run (AD, finding 7): ``replay f f`` (overlapping globs, a folder
    and a file in it) showed one file's section with its strategies twice and totals of
    twice its requests."""
    steps: list[dict[str, Any]] = [{"role": "user", "content": "task"}]
    for k in range(3):
        call = {"type": "toolCall", "id": f"c{k}", "name": "bash", "arguments": {"k": k}}
        steps += [
            {"role": "assistant", "content": [call]},
            {"role": "toolResult", "toolCallId": f"c{k}", "content": f"out {k}"},
        ]
    session = _pi_file(tmp_path, steps)
    argv = ["replay", "--strategy", "none", "--json"]
    assert main([*argv, str(session)]) == 0
    once = json.loads(capsys.readouterr().out)
    assert main([*argv, str(session), str(tmp_path), f"{tmp_path}/../{tmp_path.name}/s.jsonl"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == once
    assert captured.err.count("is named more than once") == 2
    loop = tmp_path / "loop.jsonl"
    loop.symlink_to(tmp_path / "back.jsonl")
    (tmp_path / "back.jsonl").symlink_to(loop)
    assert main([*argv, str(loop)]) == 2  # a line, not the traceback of the check for twins
    assert "loop.jsonl" in capsys.readouterr().err


def test_what_every_request_sent_ahead_is_counted_in_each_and_in_the_budget() -> None:
    """Found by a hostile run (AD, finding 3): a SWE-agent trajectory's system prompt and
    demonstrations (8k tokens sent ahead of every request) were never counted: request 1 read
    1,077 tokens, and every size, cost and over-budget figure was short by that much."""
    from agentctx.replay.jobs import sent_ahead

    traj = load_transcript(
        Path(__file__).parent / "corpus/swe-agent/gpt4-pydicom__pydicom-1458.traj"
    )
    prefix = sent_ahead(traj)
    assert traj.system and prefix[0].content[0].text == traj.system  # type: ignore[union-attr]
    assert prefix[1:] == traj.demonstrations and traj.demonstrations
    fixed = MessageCounter(lazy=False).count_many(prefix)
    assert fixed > 5_000

    def run(prefix: tuple[Message, ...], window: int) -> engine.ReplayReport:
        budget = Budget(context_window=window, reserve_output=2_000)
        return anyio.run(lambda: engine.replay(traj.messages, budget=budget, prefix=prefix))

    roomy = 400_000
    bare, ahead = run((), roomy), run(prefix, roomy)
    for a, b in zip(bare.rows, ahead.rows, strict=True):
        assert b.tokens_without == a.tokens_without + fixed
        assert b.tokens_with == a.tokens_with + fixed
    assert ahead.cost_without > bare.cost_without
    # A window the messages alone fit in, the prefix with them not: the view gives way.
    window = bare.rows[-1].tokens_without + 2_000 + fixed // 2
    tight_bare, tight = run((), window), run(prefix, window)
    assert tight_bare.compactions == 0 < tight.compactions
    assert not any(r.over_budget for r in tight.rows)
    assert max(r.tokens_with for r in tight.rows) <= tight.budget_tokens


def test_an_openhands_evaluation_output_replays_every_task(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Found by a hostile run (AD, finding 2): only the first task of an evaluation output
    (one per line) was replayed, and nothing said so: 47 of its 216 messages."""
    path = Path(__file__).parent / "corpus/openhands/v0-multi_swe_bench-output.jsonl"
    assert main(["replay", str(path), "--strategy", "none", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {row["path"]: row["messages"] for row in doc["files"]}
    assert rows == {
        f"{path}#ponylang__ponyc-4595": 47,
        f"{path}#ponylang__ponyc-4593": 68,
        f"{path}#ponylang__ponyc-4588": 101,
    }


def test_an_evaluation_output_running_a_task_twice_replays_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a hostile run (AE, finding 5): tasks were named by their instance id alone, so
    two runs of one task (outputs concatenated) were shown as one file with every strategy
    twice. Where ids repeat, tasks are named by their line."""
    lines = (
        (Path(__file__).parent / "corpus/openhands/v0-multi_swe_bench-output.jsonl")
        .read_text("utf-8")
        .splitlines()
    )
    path = tmp_path / "output.jsonl"
    path.write_text("\n".join([lines[0], lines[1], lines[0]]) + "\n", "utf-8")
    assert main(["replay", str(path), "--strategy", "none", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(row["path"], row["messages"]) for row in doc["files"]] == [
        (f"{path}#1", 47),
        (f"{path}#2", 68),
        (f"{path}#3", 47),
    ]


def test_a_line_break_in_a_file_or_tool_name_cannot_forge_a_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a hostile run (AD, finding 6): names kept their line breaks, so a file named
    ``x\\nrequests 1 budget 999999 ...`` printed a line of totals of its own, and a tool named
    ``Read\\n 9 99->99 ... FORGED ROW`` a row of the table (plain output, as piped)."""
    forged = "   9   99->99      0      0      0      0  FORGED ROW"
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": [
                {"type": "toolCall", "id": "t1", "name": "Read\n" + forged, "arguments": {}}
            ],
        },
        {"role": "toolResult", "toolCallId": "t1", "content": "z" * 400_000},
        {"role": "assistant", "content": [{"type": "text", "text": "done"}]},
        {"role": "user", "content": "and?"},
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
    ]
    path = _pi_file(tmp_path, messages, name="x\nrequests 1  budget 999999 (forged).jsonl")
    for other in (["--strategy", "deterministic"], ["--compare", "none,deterministic"]):
        assert main(["replay", str(path), *other]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert not [line for line in lines if "FORGED" in line and "\\x0a" not in line]
        assert not [line for line in lines if line.startswith("requests 1  budget 999999")]
        assert any("x\\x0arequests 1  budget 999999 (forged).jsonl" in line for line in lines)


def test_a_transcript_of_more_records_than_the_bound_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a hostile run (AD, finding 5): a file of tiny records (``{}`` lines) took some
    70 times its size in memory (30 MB: 2.1 GB; at the 256 MiB cap, about 17 GB): the kernel
    killed the process, with no error. Past `MAX_RECORDS` it is refused, as the cap on bytes
    is, at the record past it (lines are read one at a time, not split into a list first)."""
    from agentctx.importers import _common

    assert _common.MAX_RECORDS == 1_000_000
    monkeypatch.setattr(_common, "MAX_RECORDS", 1_000)
    first = {"type": "user", "uuid": "u0", "parentUuid": None, "sessionId": "s"}
    first["message"] = {"role": "user", "content": "hi"}
    path = tmp_path / "tiny.jsonl"
    path.write_text(json.dumps(first) + "\n" + "{}\n\n" * 1_500, "utf-8")
    assert main(["replay", str(path), "--strategy", "none"]) == 2
    assert f"{path}:2000: expected a transcript of at most 1000 records" in capsys.readouterr().err
    path.write_text(json.dumps(first) + "\n" + "{}\n" * 999, "utf-8")  # at the bound: read
    assert len(load_transcript(path).messages) == 1


def test_the_summary_cache_and_a_transcript_are_never_written_over(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a hostile run (AE, finding 3): ``--summary-cache`` naming the transcript had
    summaries appended to the session, and ``--report`` naming the summary cache wrote a page
    over the paid summaries. Both are refused before the replay."""
    session = _pi_file(tmp_path, [{"role": "user", "content": "task"}])
    cache = tmp_path / "summaries.jsonl"
    cache.write_text("", "utf-8")
    before = session.read_bytes()
    cases = [
        (["--summary-cache", str(session)], "--summary-cache"),
        (["--summary-cache", str(cache), "--report", str(cache)], "the summary cache"),
    ]
    for args, says in cases:
        assert main(["replay", str(session), "--strategy", "none", *args]) == 2
        assert says in capsys.readouterr().err
    assert session.read_bytes() == before and cache.read_text("utf-8") == ""


def test_a_line_break_in_an_output_path_cannot_forge_a_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a hostile run (AE, finding 7): the closing ``report: PATH`` line printed a
    path's line break as it was: a forged line after the totals."""
    session = _pi_file(tmp_path, CALLED)
    report = tmp_path / "r\ntokens sent: 1 with compaction (forged).html"
    for extra in ([], ["--json"]):
        assert (
            main(["replay", str(session), "--strategy", "none", "--report", str(report), *extra])
            == 0
        )
        captured = capsys.readouterr()
        lines = (captured.out + captured.err).splitlines()
        assert not [line for line in lines if line.startswith("tokens sent: 1 with compaction")]
        assert any("r\\x0atokens sent: 1 with compaction (forged).html" in line for line in lines)


def test_tasks_whose_ids_hold_slashes_keep_their_whole_names_in_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a hostile run (BO 5): a task of an evaluation output was named after the
    last "/" of ``<file>#<instance id>``, so ids holding one were cut, and two tasks could
    share a heading and a table row."""
    source = Path(__file__).parent / "corpus" / "openhands" / "v0-multi_swe_bench-output.jsonl"
    records = [json.loads(line) for line in source.read_text().splitlines()[:2]]
    path = tmp_path / "eval.jsonl"
    ids = ["org/repo-1<b>", "org/other/x"]
    path.write_text(
        "".join(
            json.dumps({**r, "instance_id": i}) + "\n" for r, i in zip(records, ids, strict=True)
        )
    )
    report = tmp_path / "report.html"
    assert (
        main(["replay", str(path), "--compare", "deterministic,none", "--report", str(report)]) == 0
    )
    out = capsys.readouterr().out
    html = report.read_text()
    assert "<h2>eval.jsonl#org/repo-1&lt;b&gt;</h2>" in html
    assert "<h2>eval.jsonl#org/other/x</h2>" in html
    assert "eval.jsonl#org/other/x" in out


# -- found by a hostile run (CC) --------------------------------------------------------------


ORPHAN_FIRST = [
    {
        "type": "user",
        "uuid": "a",
        "parentUuid": None,
        "message": {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "stale"}],
        },
    },
    {
        "type": "assistant",
        "uuid": "b",
        "parentUuid": "a",
        "message": {"id": "m1", "role": "assistant", "content": [{"type": "text", "text": "hi"}]},
    },
]


@pytest.mark.parametrize(
    ("records", "said"),
    [
        (ORPHAN_FIRST, "once repaired it holds nothing"),
        ([{"type": "file-history-snapshot", "messageId": "x", "snapshot": {}}], "model call"),
        ([], "model call"),
    ],
)
def test_a_transcript_with_nothing_to_replay_is_named_and_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], records: list[Any], said: str
) -> None:
    """(CC 3, 10) An excerpt whose first request holds only a result answering no call loaded,
    then ended the whole replay of its folder inside it, naming no file (exit 2, the other
    transcripts' results lost); a file with no model call replayed to an all-zero report,
    exit 0. Each is refused as it loads: named, skipped in a folder."""
    folder = tmp_path / "f"
    folder.mkdir()
    _pi_file(folder, CALLED, "a.jsonl")
    bad = folder / ("b.json" if not records else "b.jsonl")
    bad.write_text(json.dumps(records) if not records else "\n".join(map(json.dumps, records)))
    assert main(["replay", str(folder), "--strategy", "none", "--json"]) == 0
    out = capsys.readouterr()
    assert f"skipped {bad.name}: expected" in out.err and said in out.err
    assert [Path(f["path"]).name for f in json.loads(out.out)["files"]] == ["a.jsonl"]
    assert main(["replay", str(bad), "--strategy", "none"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and bad.name in err and said in err


@pytest.mark.parametrize("shape", ["list", "history", "nested", "jsonl"])
def test_a_json_transcript_is_held_to_the_record_cap_as_jsonl_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shape: str
) -> None:
    """(CC 4) The cap on records held for JSONL only: a 90 MB list of 3M tiny messages took
    1.7 GB and 16 s to load and 2.8 GB to replay. (CF 4) A history nested one list deeper
    (OpenHands' pairs, or one list in a list), or in a line of JSONL, got past it."""
    from agentctx.importers import _common, swe_agent

    monkeypatch.setattr(swe_agent, "MAX_RECORDS", 10)
    monkeypatch.setattr(_common, "MAX_RECORDS", 10)
    records = [{"role": "user" if k % 2 == 0 else "assistant", "content": "x"} for k in range(11)]
    path = tmp_path / ("t.jsonl" if shape == "jsonl" else "t.json")
    document = {
        "list": records,
        "history": {"history": records},
        "nested": {"instance_id": "i", "history": [records]},
        "jsonl": {"instance_id": "i", "history": records},
    }[shape]
    path.write_text(json.dumps(document))
    with pytest.raises(TranscriptFormatError, match="at most 10 records"):
        load_transcript(path)
    path.write_text(json.dumps(records[:10]))
    assert len(load_transcript(path).messages) == 10


def test_a_closed_stdout_is_one_line_and_a_reader_gone_is_no_input_error() -> None:
    """(CC 8) Started with stdout closed, the command printed an AttributeError traceback
    (exit 1); a reader that went away (``| true``) was reported as bad input (exit 2)."""
    command = [sys.executable, "-m", "agentctx", "replay", "--strategy", "none", "--json"]
    # (a shell closes it: ``>&-``)
    closed = subprocess.run(
        ["sh", "-c", 'exec "$0" "$@" >&-', *command[:-1]],
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    assert closed.returncode == 2 and closed.stderr.count("\n") == 1
    assert "standard output" in closed.stderr and "Traceback" not in closed.stderr
    reader, writer = os.pipe()
    os.close(reader)
    gone = subprocess.run(command, stdout=writer, stderr=subprocess.PIPE, text=True, check=False)
    os.close(writer)
    assert gone.returncode == 1 and gone.stderr == ""


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this system")
def test_a_pipe_as_the_report_is_refused_before_the_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """(CC 9) A FIFO as ``--report`` hung the command after the replay, waiting for a reader."""
    os.mkfifo(tmp_path / "r.html")
    assert main(["replay", "--strategy", "none", "--report", str(tmp_path / "r.html")]) == 2
    assert "a pipe that no one reads" in capsys.readouterr().err


def test_a_device_and_a_read_pipe_are_outputs_a_pipe_no_one_reads_is_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """(CF 7) Refusing every output that is no regular file refused ``--report /dev/null``
    and process substitution; only a pipe no one reads (which hung the command) is refused."""
    assert main(["replay", "--strategy", "none", "--report", os.devnull]) == 0
    if hasattr(os, "mkfifo"):
        # (CH 1) A reader waiting on the pipe got an empty file, then the command hung:
        # the check opened it for writing and closed it at once.
        fifo = tmp_path / "r.html"
        os.mkfifo(fifo)
        got: list[bytes] = []
        reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
        reader.start()
        time.sleep(0.2)  # the reader waits in its open
        assert main(["replay", "--strategy", "none", "--report", str(fifo)]) == 0
        reader.join(timeout=30)
        assert not reader.is_alive() and got and got[0].startswith(b"<!DOCTYPE html>")
    capsys.readouterr()


def test_a_closed_stderr_never_puts_a_line_into_the_json_on_stdout(tmp_path: Path) -> None:
    """(CF) With stderr closed, a "skipped" line went to stdout, into the JSON document."""
    folder = tmp_path / "f"
    folder.mkdir()
    _pi_file(folder, CALLED, "a.jsonl")
    (folder / "b.jsonl").write_text("not json\n")
    done = subprocess.run(
        ["sh", "-c", 'exec "$0" "$@" 2>&-', sys.executable, "-m", "agentctx", "replay"]
        + [str(folder), "--strategy", "none", "--json"],
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    assert done.returncode == 0
    assert [Path(f["path"]).name for f in json.loads(done.stdout)["files"]] == ["a.jsonl"]


def test_a_task_with_nothing_to_replay_is_skipped_alone_in_an_evaluation_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """(CF 3) A failed task (no history) in an OpenHands evaluation output refused the whole
    file: its good tasks were gone too, with a line naming only the failed one."""
    line = corpus_file("openhands", "v0-multi_swe_bench-output.jsonl").read_text().splitlines()[0]
    good = json.loads(line)
    failed = {**good, "instance_id": "failed-task", "history": []}
    other = {**good, "instance_id": "other-task"}
    path = tmp_path / "eval.jsonl"
    path.write_text("\n".join(json.dumps(t) for t in (good, failed, other)) + "\n")
    assert main(["replay", str(path), "--strategy", "none", "--json"]) == 0
    out = capsys.readouterr()
    assert "skipped eval.jsonl#failed-task" in out.err
    names = [f["path"].rpartition("#")[2] for f in json.loads(out.out)["files"]]
    assert names == [good["instance_id"], "other-task"]


@pytest.mark.parametrize("shape", ["pairs", "two tasks", "one task", "traj"])
def test_a_transcript_at_the_record_cap_loads_whatever_its_shape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shape: str
) -> None:
    """(CH 6) The cap counted more than the records: a pair on top of its two events, a JSONL
    line on top of its history, a trajectory beside the history it mirrors."""
    from agentctx.importers import _common, swe_agent

    monkeypatch.setattr(swe_agent, "MAX_RECORDS", 10)
    monkeypatch.setattr(_common, "MAX_RECORDS", 10)
    events = [{"role": "user" if k % 2 == 0 else "assistant", "content": "x"} for k in range(10)]
    lines = {
        "pairs": [{"instance_id": "i", "history": [events[k : k + 2] for k in range(0, 8, 2)]}],
        "two tasks": [{"instance_id": f"t{n}", "history": events[:5]} for n in (1, 2)],
        "one task": [{"instance_id": "i", "history": events}],
        "traj": [{"history": events, "trajectory": events}],
    }[shape]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(map(json.dumps, lines)) + "\n")
    assert _common.records_in(lines[0]) <= 10
    try:
        load_transcript(path)
    except TranscriptFormatError as e:
        assert "records" not in str(e), e  # refused, if at all, for what it holds, not its size


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this system")
def test_a_pipe_whose_reader_went_away_during_the_replay_is_an_error_not_a_hang(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """(CJ 1) A reader there at the check and gone by the write left the report's open
    waiting for another, forever."""
    fifo = tmp_path / "r.html"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    real = cli._load

    def load_then_leave(paths: Any) -> Any:
        os.close(reader)  # the reader leaves while the replay runs
        return real(paths)

    monkeypatch.setattr(cli, "_load", load_then_leave)
    assert main(["replay", "--strategy", "none", "--report", str(fifo)]) == 2
    assert "reader went away" in capsys.readouterr().err


def test_the_standard_output_is_no_report_while_json_is_written_there(tmp_path: Path) -> None:
    """(CJ 7) ``--report /dev/stdout --json``: the HTML and the JSON shared the output."""
    out = tmp_path / "out.txt"
    with out.open("w") as stdout:
        done = subprocess.run(
            [sys.executable, "-m", "agentctx", "replay", "--strategy", "none", "--json"]
            + ["--report", "/dev/stdout"],
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
    assert done.returncode == 2 and "the standard output" in done.stderr
    # (CK 5) Without --json the table goes there: the HTML over it, or it over the HTML.
    with out.open("w") as stdout:
        plain = subprocess.run(
            [sys.executable, "-m", "agentctx", "replay", "--strategy", "none"]
            + ["--report", str(out)],
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
    assert plain.returncode == 2 and "which the table writes" in plain.stderr
    # (CK 11) Both to /dev/null: nothing to mix.
    nowhere = subprocess.run(
        [sys.executable, "-m", "agentctx", "replay", "--strategy", "none", "--json"]
        + ["--report", os.devnull],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    assert nowhere.returncode == 0, nowhere.stderr
