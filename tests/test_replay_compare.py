"""`agentctx replay` with a real summarizer (over a fake OpenAI server), --compare, --json,
folders of transcripts, the summary cache, retention, and the report's tick arithmetic."""

from __future__ import annotations

import gc
import json
import re
import shutil
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import anthropic
import anyio
import openai
import pytest

from agentctx.budget import Budget
from agentctx.errors import ConfigError, SummarizerError
from agentctx.events import SummaryRejected
from agentctx.importers import load_transcript
from agentctx.messages import TextBlock, Usage, UserMessage
from agentctx.providers._client import summarizer_error
from agentctx.replay import ReplayClock, replay
from agentctx.replay.cached_summarizer import (
    GIVE_UP_AFTER,
    CachedSummarizer,
    SummarizerHealth,
    SummaryCache,
    default_cache_path,
    is_server_failure,
    refused,
    request_key,
)
from agentctx.replay.cli import main
from agentctx.replay.compare import StrategyRow
from agentctx.replay.data import DEMO_TRANSCRIPT
from agentctx.replay.engine import ReplayReport
from agentctx.replay.real_summarizer import SummarizerSpec
from agentctx.replay.render import _rejected
from agentctx.replay.retention import Fact, RetentionMeter, early_paths, visible_text
from agentctx.replay.svgplot import CHAR_WIDTH, LABEL_GAP, nice_step, nice_top, x_ticks
from agentctx.strategies import DeterministicCompaction
from agentctx.summarizer import REQUIRED_SECTIONS, SummaryRequest, SummaryResult
from agentctx.testing import synthetic_session
from agentctx.testing.servers import FakeAnthropic, FakeOpenAI, Reply

MODEL = "gpt-4.1-mini"  # priced, so the summarizer's cost is known, not estimated
MARK = "Keep the cache of src/session/cache_7.py warm (fake-server briefing)."
REQUEST = SummaryRequest(system="You summarize.", prompt="Summarize: hello.", max_tokens=300)


def briefing() -> str:
    bodies = {"Goal": MARK, "Files touched": "src/session/cache_7.py"}
    return "\n".join(f"## {name}\n{bodies.get(name, 'None.')}" for name in REQUIRED_SECTIONS)


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """Unclosed clients or sockets warn when collected, and warnings are errors."""
    yield
    gc.collect()


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    """A fake OpenAI-compatible server answering every request with a valid briefing after
    a real 0.2 s, with no API key in the environment (a local server needs none)."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with FakeOpenAI(default=Reply.text(briefing(), delay=0.2)) as s:
        yield s


# Long enough for briefings to be asked for and spliced (the shipped session crosses its
# budget once, in one step the tiers meet before a briefing could be ready).
LONG = [
    str(Path(__file__).parent / "corpus" / "pi" / "large-session.jsonl"),
    "--context-window",
    "66000",
]


def _run_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main(["replay", *args, "--json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)  # one JSON document, nothing else on stdout
    assert isinstance(doc, dict)
    return doc


def _row(doc: dict[str, object], strategy: str, file: int = 0) -> dict[str, object]:
    files = doc["files"]
    assert isinstance(files, list)
    rows = files[file]["strategies"]
    return next(r for r in rows if r["strategy"] == strategy)


# ---------------------------------------------------------------------------------------
# A real summarizer, over a fake OpenAI-compatible server


def test_real_summarizer_splices_its_briefing_and_a_rerun_sends_nothing(
    server: FakeOpenAI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "summaries.jsonl"
    spec = f"openai-compatible:{MODEL}@{server.url}/v1"
    args = [*LONG, "--summarizer", spec, "--summary-cache", str(cache)]
    first = _run_json(args, capsys)
    sent = len(server.requests)
    assert sent >= 1
    llm = _run_json(args, capsys)
    assert len(server.requests) == sent  # the rerun is answered from the cache: 0 requests
    assert llm == first  # and replays the same session, to the byte
    row = _row(llm, "llm")
    assert row["splices"] >= 1
    summarizer = row["summarizer"]
    assert isinstance(summarizer, dict)
    assert summarizer["requests"] == sent
    assert summarizer["estimated"] is False and summarizer["cost"] > 0  # priced, not estimated
    assert 0 < summarizer["share"] < 0.05
    assert any(MARK in b["text"] for b in row["briefings"])  # the model's briefing, spliced
    settings = llm["settings"]
    assert isinstance(settings, dict)
    assert settings["summarizer"] == spec and settings["summary_cache"] == str(cache)
    lines = cache.read_text().splitlines()
    assert len(lines) == sent
    entry = json.loads(lines[0])
    assert entry["model"] == MODEL and entry["latency"] >= 0.2
    assert entry["result"]["usage"]["output_tokens"] > 0
    # The request sent is the one LlmCompaction built, with the output cap as max_tokens.
    body = server.requests[0].json
    assert body["model"] == MODEL and "max_tokens" in body
    assert body["messages"][0]["role"] == "system"


def test_real_summarizer_report_shows_the_briefing_and_its_cost(
    server: FakeOpenAI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = f"openai-compatible:{MODEL}@{server.url}/v1"
    cache = tmp_path / "c.jsonl"
    report = tmp_path / "r.html"
    args = ["replay", *LONG, "--summarizer", spec, "--summary-cache", str(cache)]
    assert main([*args, "--report", str(report)]) == 0
    out = capsys.readouterr().out
    assert f"strategy llm (summarizer {spec}, real latency)" in out
    assert re.search(r"\d+ briefings? spliced over", out)
    assert f"({MODEL}), " in out and "cost $" in out and "cost unknown" not in out
    assert "briefing spliced at request" in out and MARK in out
    assert f"summary cache: {cache} (" in out and "0 cached)" in out
    page = report.read_text()
    assert MARK in page and "what the summarizer wrote" in page
    assert "summarizer $" in page  # the card: its cost, not an estimate
    assert main(args) == 0
    assert "(0 sent, " in capsys.readouterr().out


def test_compare_with_a_real_summarizer_runs_replays_at_once(
    server: FakeOpenAI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = f"openai-compatible:{MODEL}@{server.url}/v1"
    folder = tmp_path / "sessions"
    folder.mkdir()
    for name in ("a.jsonl", "b.jsonl"):
        shutil.copy(LONG[0], folder / name)
    args = [str(folder), *LONG[1:], "--compare", "deterministic,llm", "--summarizer", spec]
    args += ["--summary-cache", str(tmp_path / "c.jsonl"), "--concurrency", "3"]
    doc = _run_json(args, capsys)
    # Two identical transcripts: the second one's requests are the first one's, so at most
    # the requests of one file reach the server (threads may race to the same request).
    splices = _row(doc, "llm", 0)["splices"]
    assert isinstance(splices, int) and splices >= 1
    assert _row(doc, "llm", 1)["splices"] == splices
    assert _row(doc, "llm", 0)["tokens_sent"] == _row(doc, "llm", 1)["tokens_sent"]
    totals = doc["totals"]
    assert isinstance(totals, list)
    assert [t["strategy"] for t in totals] == ["deterministic", "llm"]
    llm = next(t for t in totals if t["strategy"] == "llm")
    assert llm["splices"] == 2 * splices and llm["briefings"] == []


def test_summarizer_spec_forms_and_errors() -> None:
    spec = SummarizerSpec.parse("openai-compatible:qwen@q4@http://127.0.0.1:8000/v1")
    assert (spec.model, spec.base_url) == ("qwen@q4", "http://127.0.0.1:8000/v1")
    assert str(spec) == "openai-compatible:qwen@q4@http://127.0.0.1:8000/v1"
    assert SummarizerSpec.parse("anthropic:claude-haiku-4-5").key_variable == "ANTHROPIC_API_KEY"
    for bad in ("haiku", "mistral:large", "openai:", "openai-compatible:qwen"):
        with pytest.raises(ConfigError, match="not a summarizer"):
            SummarizerSpec.parse(bad)
    with pytest.raises(ConfigError, match="set OPENAI_API_KEY"):
        SummarizerSpec.parse("openai:gpt-4.1-mini").check(environ={})
    SummarizerSpec.parse("openai-compatible:m@http://h/v1").check(environ={})  # needs no key


def test_missing_key_and_bad_spec_are_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    assert main(["replay", "--summarizer", "anthropic:claude-haiku-4-5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "set ANTHROPIC_API_KEY" in err
    with pytest.raises(SystemExit) as done:
        main(["replay", "--summarizer", "nope"])
    assert done.value.code == 2 and "not a summarizer" in capsys.readouterr().err


@pytest.mark.parametrize("url", ["http://[::1", "http://[zz]/v1", "http://h:x/v1", "http://:80/v1"])
def test_a_summarizer_url_that_is_none_is_one_line_and_exit_2(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a hostile run (CC 1): a malformed URL gave 80 lines of the SDK's traceback
    (``httpx2.InvalidURL``) and exit 1, after the transcripts were loaded. The summarizer made
    by hand with such a URL raised the SDK's error too: a `ConfigError` now."""
    with pytest.raises(SystemExit) as done:
        main(["replay", "--summarizer", f"openai-compatible:m@{url}"])
    err = capsys.readouterr().err
    assert done.value.code == 2 and "not a summarizer" in err and "Traceback" not in err
    from agentctx.providers.openai_summarizer import OpenAIChatSummarizer

    if url != "http://:80/v1":  # (a URL the SDK takes, and fails to connect to)
        with pytest.raises(ConfigError, match="cannot make the openai client"):
            OpenAIChatSummarizer("m", base_url=url, api_key="k")


# ---------------------------------------------------------------------------------------
# The cache and the latency mapping


class _Slow:
    """A summarizer that takes ``seconds`` of real time."""

    model = "slow-model"

    def __init__(self, seconds: float, *, fail: bool = False) -> None:
        self.seconds = seconds
        self.fail = fail
        self.calls = 0

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.calls += 1
        await anyio.sleep(self.seconds)
        if self.fail:
            raise SummarizerError("boom", retryable=True)
        usage = Usage(input_tokens=10, output_tokens=5)
        return SummaryResult(text=briefing(), stop_reason="stop", usage=usage, model="slow")


async def test_real_latency_becomes_session_time_and_a_hit_replays_it() -> None:
    clock = ReplayClock(100.0)
    cache = SummaryCache(None)
    inner = _Slow(0.2)
    summarizer = CachedSummarizer(inner, cache, clock=clock)
    done: list[float] = []

    async def ask() -> None:
        await summarizer.summarize(REQUEST)
        done.append(clock())

    async with anyio.create_task_group() as tg:
        tg.start_soon(ask)
        started = time.monotonic()
        await clock.advance(100.1)  # waits for the real request: the clock is held meanwhile
        assert time.monotonic() - started >= 0.2 and not done  # 0.2 s of session time not up
        await clock.advance(100.3)
        assert done == [100.3]
        tg.start_soon(ask)  # the same request again: a hit, with the recorded latency
        await clock.advance(100.4)
        assert done == [100.3]
        await clock.advance(100.6)
    assert done == [100.3, 100.6] and inner.calls == 1
    assert (cache.hits, cache.sent) == (1, 1)


async def test_failures_are_not_cached() -> None:
    cache = SummaryCache(None)
    summarizer = CachedSummarizer(_Slow(0.0, fail=True), cache)
    for _ in range(2):
        with pytest.raises(SummarizerError, match="boom"):
            await summarizer.summarize(REQUEST)
    assert len(cache) == 0 and cache.sent == 0  # no server answered: nothing sent or kept


async def test_cache_file_survives_a_cut_line_and_keys_differ_by_model(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "summaries.jsonl"
    summarizer = CachedSummarizer(_Slow(0.0), SummaryCache(path))
    result = await summarizer.summarize(REQUEST)
    with path.open("a") as f:
        f.write('{"key": "abc", "result": {"text": "cut sh')  # a run killed mid-write
    again = SummaryCache(path)
    assert len(again) == 1
    hit = again.get(summarizer.key(REQUEST))
    assert hit is not None and hit.result == result
    assert request_key("a", REQUEST, 300) != request_key("b", REQUEST, 300)
    assert request_key("a", REQUEST, 300) != request_key("a", REQUEST, 301)


def test_default_cache_path_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_path() == tmp_path / "agentctx" / "summaries.jsonl"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_path() == Path.home() / ".cache" / "agentctx" / "summaries.jsonl"


# ---------------------------------------------------------------------------------------
# --compare, folders, --json


def test_compare_prints_a_row_per_strategy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--compare", "deterministic,pipeline,llm"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith(f"{DEMO_TRANSCRIPT} (claude-code, 12 requests; without")
    head = lines[1].split()
    assert head[:3] == ["strategy", "tokens", "sent"] and "retention" in head
    rows = {line.split()[0]: line for line in lines[2:5]}
    assert list(rows) == ["deterministic", "pipeline", "llm"]
    # The shipped session crosses its budget once, in one step the tiers meet at once.
    assert "(0 spliced)" in rows["llm"]
    assert "100.0% / 100.0%" in rows["deterministic"]


def test_compare_json_over_a_folder_sums_the_totals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("one.jsonl", "two.jsonl"):
        shutil.copy(DEMO_TRANSCRIPT, tmp_path / name)
    (tmp_path / "notes.json").write_text('{"not": "a transcript"}')
    (tmp_path / "README.md").write_text("skipped: not a transcript suffix")
    assert main(["replay", str(tmp_path), "--compare", "none,deterministic", "--json"]) == 0
    captured = capsys.readouterr()
    assert "skipped" in captured.err and "notes.json" in captured.err
    doc = json.loads(captured.out)
    assert [Path(f["path"]).name for f in doc["files"]] == ["one.jsonl", "two.jsonl"]
    assert doc["settings"]["strategies"] == ["none", "deterministic"]
    assert doc["settings"]["budget"] == 37_000
    one = _row(doc, "deterministic", 0)
    total = next(t for t in doc["totals"] if t["strategy"] == "deterministic")
    assert total["tokens_sent"] == 2 * one["tokens_sent"]
    assert total["requests"] == 24 and total["cache_breaks"] == 2 * one["cache_breaks"]
    assert total["retention"]["checks"] == 2 * one["retention"]["checks"]
    none = _row(doc, "none", 0)
    # No compaction: the view is the history (repaired as sent: a few tokens off at most).
    assert none["tokens_sent"] == pytest.approx(none["tokens_without"], rel=1e-3)
    assert none["retention"]["checks"] == 0 and none["retention"]["worst"] is None
    assert none["over_budget"] > 0 and abs(none["change"]) < 1e-3


def test_several_files_print_per_file_blocks_and_totals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    for p in paths:
        shutil.copy(DEMO_TRANSCRIPT, p)
    assert main(["replay", *map(str, paths), "--strategy", "deterministic"]) == 0
    out = capsys.readouterr().out
    assert out.count("deterministic ") >= 3 and "total over 2 transcripts" in out


def test_unknown_compare_strategy_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["replay", "--compare", "deterministic,magic"])
    assert done.value.code == 2
    assert "unknown strategy 'magic'" in capsys.readouterr().err
    # Found by a hostile run (BO 4): a name was printed as it came, terminal escapes too
    # (a clipboard write, a screen clear).
    with pytest.raises(SystemExit):
        main(["replay", "--compare", "bogus\x1b]52;c;SGk=\x07\x1b[2J"])
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "'bogus\\x1b]52;c;SGk=\\x07" in err


def test_png_chart_of_several_replays_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["replay", "--compare", "none,deterministic", "--chart", str(tmp_path / "c.png")]
    assert main(args) == 2
    assert "use --report" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------
# Retention and ticks


def test_retention_counts_view_and_loss() -> None:
    messages = load_transcript(DEMO_TRANSCRIPT).messages
    facts = early_paths(messages)
    assert facts and all(f.kind == "path" and f.text for f in facts)
    view = [UserMessage(content=(TextBlock("look at src/a.py"),))]
    assert "src/a.py" in visible_text(view)
    meter = RetentionMeter([Fact("path", "src/a.py", 0), Fact("path", "src/gone.py", 0)])

    async def run() -> float:
        report = await replay(
            messages,
            budget=Budget(context_window=45_000, reserve_output=8_000),
            strategy=DeterministicCompaction(),
            facts=facts,
        )
        assert report.retention is not None and report.retention.checks >= 1
        assert report.retention.worst == 1.0 and report.retention.facts == len(facts)

        class _Ctx:
            _writer = None

        return await meter.check(_Ctx(), view, 1)  # type: ignore[arg-type]

    assert anyio.run(run) == 0.5
    assert meter.result().lost == 1 and meter.result().in_view == 1


def test_retention_reads_each_recall_entry_once() -> None:
    """Found by a hostile run (P, finding 6): each check read every recall id in the view
    whole for every fact not in view, so a long session's replay grew as the cube of its
    length (19k messages: 405 s, against 2.8 s without the check). An entry never changes:
    it is read once, with each fact it holds searched for once."""
    from agentctx.manager import ContextManager

    messages = [m for g in synthetic_session(seed=1, calls=400, mean_output_lines=6) for m in g]
    facts = early_paths(messages)
    reads: list[tuple[str, str | None]] = []
    recall = ContextManager.recall

    async def counted(self: Any, id: str, *args: Any, **kwargs: Any) -> str:
        reads.append((id, kwargs.get("pattern")))
        return await recall(self, id, *args, **kwargs)

    async def run() -> Any:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(ContextManager, "recall", counted)
            return await replay(
                messages,
                budget=Budget(context_window=20_000, reserve_output=2_000),
                strategy=DeterministicCompaction(),
                facts=facts,
            )

    report = anyio.run(run)
    assert report.retention is not None and report.retention.checks >= 5
    assert report.retention.recall > 0  # facts were found one recall away
    whole = [rid for rid, pattern in reads if pattern is None]
    assert len(whole) == len(set(whole))  # each entry read whole once
    assert len(reads) == len(set(reads))  # and each fact searched for once
    # Only in the entry that holds it itself (hostile run W, finding 4): a stretch dropped
    # again refers to the drop before it, so every later entry holds every earlier fact, and
    # searching each one made a long replay quadratic.
    searched = Counter(pattern for _, pattern in reads if pattern is not None)
    assert sum(searched.values()) <= len(facts) + len(whole), searched.most_common(3)


def test_a_repaired_view_is_said_to_be_repaired(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a hostile run (P, finding 8): a view the manager repaired (a result that
    answers no call left out) showed in no replay output, and with no compaction at all the
    tokens it left out read as savings."""
    history = [
        {"role": "user", "content": [{"type": "text", "text": "task: list the files"}]},
        {"role": "tool", "tool_call_id": "stale_1", "content": [{"type": "text", "text": "x"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
        {"role": "user", "content": [{"type": "text", "text": "thanks"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "bye"}]},
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(history))
    assert main(["replay", str(path), "--strategy", "none", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["totals"][0]["repaired_requests"] == 1
    assert main(["replay", str(path), "--strategy", "none"]) == 0
    assert "repaired: orphan_result x1" in capsys.readouterr().out


@pytest.mark.parametrize("raw", [0.03, 0.7, 1, 3, 4.9, 7, 12, 99, 101, 2600])
def test_nice_steps_are_1_2_5(raw: float) -> None:
    step = nice_step(raw)
    assert step >= raw
    mantissa = step / 10 ** int(f"{step:e}".split("e")[1])
    assert round(mantissa, 6) in (1.0, 2.0, 5.0)
    top, step2 = nice_top(raw * 5, 5)
    assert top >= raw * 5 and top / step2 <= 5 + 1e-9


@pytest.mark.parametrize("width", [300.0, 576.0])
def test_x_tick_labels_never_touch(width: float) -> None:
    for n in [*range(1, 60), 99, 100, 101, 453, 484, 500, 999, 5000]:
        ticks = x_ticks(n, width, 11)
        assert ticks and ticks[-1] <= n and ticks[0] >= 1
        label = len(str(n)) * 11 * CHAR_WIDTH
        spacing = width / max(n - 1, 1)
        for a, b in zip(ticks, ticks[1:], strict=False):
            assert (b - a) * spacing >= label + LABEL_GAP - 1e-6, (n, ticks)


def test_a_summarizer_url_is_read_whatever_its_scheme_case_and_shown_without_its_password() -> None:
    """(CF) ``HTTP://`` was no URL to the spec, and a password in it reached ``--json``."""
    spec = SummarizerSpec.parse("openai-compatible:m@HTTP://me:secret@h:8000/v1")
    assert spec.base_url == "HTTP://me:secret@h:8000/v1"
    assert str(spec) == "openai-compatible:m@HTTP://***@h:8000/v1"
    # (CK 4) What the URL parser reads as a host and port can be a user and a password.
    spec = SummarizerSpec.parse("openai-compatible:m@http://bob:80/s3cret@example.invalid/v1")
    assert "s3cret" not in str(spec)
    spec = SummarizerSpec.parse("openai-compatible:m@http://h:8000/v1?api_key=sk-1")
    assert "sk-1" not in str(spec)


@pytest.mark.parametrize(
    "spec",
    [
        "openai-compatible:m@http://bob:hunter2@[::1/v1",
        "openai-compatible: @http://bob:hunter2@host/v1",
        "openai-compatible:m@http://bob:hun@ter2@host:123456/v1",
    ],
)
def test_a_summarizer_spec_that_is_none_never_shows_its_password(spec: str) -> None:
    """(CH 5) The error line quoted the spec whole, password and all."""
    with pytest.raises(ConfigError, match="not a summarizer") as refused:
        SummarizerSpec.parse(spec)
    assert "hunter2" not in str(refused.value) and "hun@ter2" not in str(refused.value)
    assert "ter2" not in str(refused.value)


@pytest.mark.parametrize(
    "spec",
    [
        "openai-compatible:m@http://bob:qz/xw@example.com/v1",
        "openai-compatible:m@http://bob:qz?xw@h:1/v1",
        "openai-compatible:m@http://bo[b:qzxw@host/v1",
    ],
)
def test_no_password_form_reaches_the_error_line(spec: str) -> None:
    """(CJ 6) A password holding "/", "?" or a user name holding "[" got past the mask, and
    the URL parser's own message quoted the password's start."""
    with pytest.raises(ConfigError, match="not a summarizer") as refused:
        SummarizerSpec.parse(spec)
    shown = str(refused.value)
    assert "qz" not in shown and "xw" not in shown, shown


# ---------------------------------------------------------------------------------------
# The summary cache's path, checked before the replay


def test_a_summary_cache_that_cannot_be_made_is_refused_before_the_replay(
    server: FakeOpenAI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a hostile run (CS 1): a --summary-cache under a regular file was only found
    out at its first write, after the server had answered: each paid reply was thrown away
    as "failed: FileExistsError" and the command still exited 0. Now it is one line on
    stderr and exit status 2 before any request is sent."""
    (tmp_path / "afile").write_text("x")
    spec = f"openai-compatible:{MODEL}@{server.url}/v1"
    args = ["replay", *LONG, "--summarizer", spec]
    for cache in (tmp_path / "afile" / "summaries.jsonl", tmp_path / "afile" / "d" / "s.jsonl"):
        assert main([*args, "--summary-cache", str(cache)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--summary-cache" in err and "not a folder" in err
    assert server.requests == []


def test_a_summary_cache_write_that_fails_mid_run_keeps_the_paid_reply(
    server: FakeOpenAI,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by a hostile run (CS 1): when the cache could not be written, each reply the
    server had answered (and billed) was rejected, left out of the summarizer's requests and
    cost, and fewer briefings were spliced. Now the reply is used and counted, and the
    command says once that the cache could not be written."""
    import agentctx.replay.cli as cli

    # As if the folder went away after the check (the check itself is the test above's).
    monkeypatch.setattr(cli, "_check_cache", lambda cache: None)
    (tmp_path / "afile").write_text("x")
    cache = tmp_path / "afile" / "summaries.jsonl"
    spec = f"openai-compatible:{MODEL}@{server.url}/v1"
    args = ["replay", *LONG, "--summarizer", spec, "--summary-cache", str(cache), "--json"]
    assert main(args) == 0
    captured = capsys.readouterr()
    row = _row(json.loads(captured.out), "llm")
    assert len(server.requests) >= 1
    assert row["summarizer"]["requests"] == len(server.requests)
    assert row["splices"] >= 1
    assert captured.err.count("could not be written") == 1
    assert f"summary cache: {cache} not written" in captured.err


async def test_summary_cache_keeps_a_reply_it_cannot_write(tmp_path: Path) -> None:
    """Found by a hostile run (CS 1): `SummaryCache.put` raised when its file could not be
    written, and the paid reply was lost. Now the reply is kept in memory and counted, and
    the reason is in ``write_error``."""
    (tmp_path / "afile").write_text("x")
    cache = SummaryCache(tmp_path / "afile" / "c.jsonl")

    class Once:
        model = MODEL

        async def summarize(self, request: SummaryRequest) -> SummaryResult:
            return SummaryResult(text=briefing(), stop_reason="stop", usage=Usage(10, 5))

    result = await CachedSummarizer(Once(), cache).summarize(REQUEST)
    assert result.text == briefing()
    assert cache.sent == 1 and len(cache) == 1
    assert cache.write_error is not None


@pytest.mark.parametrize("flag", ["--report", "--chart"])
def test_an_output_named_as_the_summary_cache_is_refused_before_it_exists(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a hostile run (CS 2): --report (or an .html --chart) naming the same
    not-yet-existing file as --summary-cache wrote the page over the cache made during the
    replay: the check ran only when the file existed. Now the resolved paths are compared,
    the default cache's too, and it is one line and exit status 2."""
    cache = tmp_path / "c.html"  # a cache may have any name
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    for page in (cache, link / "c.html"):
        assert main(["replay", "--summary-cache", str(cache), flag, str(page)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "the summary cache, not overwritten" in err
    assert not cache.exists()
    if flag == "--report":  # (the default cache's name is no chart's)
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
        default_cache_path().parent.mkdir(parents=True)
        assert main(["replay", flag, str(default_cache_path())]) == 2
        assert "the summary cache, not overwritten" in capsys.readouterr().err
        assert not default_cache_path().exists()


def test_an_empty_summary_cache_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """Found by a hostile run (CS 12): ``--summary-cache ''`` silently meant the default
    cache. Now it is refused, as an empty --report is: one line, exit status 2."""
    assert main(["replay", "--summary-cache", "", "--strategy", "deterministic"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--summary-cache: the path is empty" in err


@pytest.fixture
def silent_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The URL of a server on 127.0.0.1 that accepts every connection and never answers."""
    import socket
    import threading

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(50)
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(listener.accept()[0])
            except OSError:  # closed: the test is over
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    finally:
        listener.close()
        thread.join(5)
        for conn in accepted:
            conn.close()


def test_a_summarizer_that_never_answers_times_out_and_is_given_up(
    silent_server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a hostile run (CS 4): a summarizer server that accepted connections and
    never answered hung the command (nothing printed for 290 s): the CLI set no timeout of
    its own, and LlmCompaction's deadline runs on the replay clock, held while a real
    request runs. Now each request has --summarizer-timeout wall seconds, and after a few
    timeouts in a row the summarizer is asked no more: the tiers compact, and the output
    says so."""
    spec = f"openai-compatible:{MODEL}@{silent_server}"
    args = ["replay", *LONG, "--summarizer", spec, "--summary-cache", str(tmp_path / "c.jsonl")]
    started = time.monotonic()
    assert main([*args, "--summarizer-timeout", "0.3"]) == 0
    assert time.monotonic() - started < 60
    out = capsys.readouterr().out
    assert "summarizer: gave up after 3 timeouts in a row of 0.3 s;" in out
    assert "attempts not sent, the deterministic tiers compacted instead" in out
    with pytest.raises(SystemExit) as exited:
        main([*args, "--summarizer-timeout", "0"])
    assert exited.value.code == 2
    assert "must be more than 0 seconds" in capsys.readouterr().err


def _replay_asking(tmp_path: Path, default: Reply, *flags: str, first: Sequence[Reply] = ()) -> int:
    """`agentctx replay` of the long session (exit 0) with a real summarizer on a fake OpenAI
    server answering ``first``, then ``default``; how many requests reached the server."""
    with FakeOpenAI(replies=first, default=default) as server:
        spec = f"openai-compatible:{MODEL}@{server.url}/v1"
        cache = ["--summary-cache", str(tmp_path / "c.jsonl")]
        assert main(["replay", *LONG, "--summarizer", spec, *cache, *flags]) == 0
        return len(server.requests)


def test_a_summarizer_that_keeps_failing_is_given_up(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a hostile run (CV 2): only timeouts counted towards giving up, so a server
    answering every request with HTTP 500 was asked again for every briefing of the whole
    replay (each three times). Now server failures count as timeouts do: after three failed
    requests in a row the summarizer is asked no more, the tiers compact, and the output
    says so once."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    sent = _replay_asking(tmp_path, Reply.error(500))
    out = capsys.readouterr().out
    assert sent == 3
    gave_up = [line for line in out.splitlines() if line.startswith("summarizer: gave up")]
    assert len(gave_up) == 1, out
    assert gave_up[0].startswith("summarizer: gave up after 3 failed requests in a row (last: ")
    assert "HTTP 500" in gave_up[0]
    assert gave_up[0].endswith("attempts not sent, the deterministic tiers compacted instead")
    not_sent = re.search(r"; (\d+) attempts not sent", gave_up[0])
    assert not_sent is not None and int(not_sent[1]) >= 1
    compactions = next(x for x in out.splitlines() if x.startswith("compactions "))
    assert not compactions.startswith("compactions 0 ")


QUOTA = "You exceeded your current quota, please check your plan and billing details."


@pytest.mark.parametrize(
    "refusal",
    [
        Reply.error(401),
        Reply.error(403),
        Reply.error(429, "insufficient_quota", QUOTA, extra={"code": "insufficient_quota"}),
    ],
    ids=["401", "403", "429 quota"],
)
def test_a_summarizer_refusing_every_request_for_its_key_or_quota_is_given_up(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    refusal: Reply,
) -> None:
    """Found by the re-run (CZ 4, 5): a 4xx reset the run of failures, so a key refused
    (401, 403) or a quota spent (429) was asked again for every briefing of the replay. They
    now count: no later request fares better. The JSON says it was given up, and which
    rejected requests were never sent, and the text counts no attempt for those."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    status = refusal.status
    sent = _replay_asking(tmp_path, refusal, "--json")
    doc = json.loads(capsys.readouterr().out)
    health = doc["settings"]["summarizer_health"]
    assert health["given_up"] is True and f"HTTP {status}" in health["last_failure"]
    row = doc["files"][0]["strategies"][0]["summarizer"]
    # Attempts refused unsent (a retry of a request sent before is one), and the requests
    # of which none was sent.
    assert health["attempts_not_sent"] >= row["not_sent"] >= 1
    assert row["rejected"] - row["not_sent"] <= 3 and sent <= 3 * GIVE_UP_AFTER


def test_a_burst_of_rate_limits_does_not_give_the_summarizer_up(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the re-run (DA 3): counting every 429 gave a summarizer up after one burst
    of rate limits (its Retry-After waits pass on the replay's clock, so the attempts come
    back to back), and the llm row then measured the deterministic tiers. A rate limit says
    the server works; only a spent quota counts."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    burst = [Reply.rate_limited(1.0)] * 3
    sent = _replay_asking(tmp_path, Reply.text(briefing()), "--json", first=burst)
    doc = json.loads(capsys.readouterr().out)
    assert doc["settings"]["summarizer_health"]["given_up"] is False
    row = doc["files"][0]["strategies"][0]["summarizer"]
    assert row["requests"] >= 1 and row["not_sent"] == 0 and sent > 3


def test_a_request_sent_before_the_summarizer_was_given_up_counts_its_sent_attempts() -> None:
    """Found by the re-run (DA 2): a request whose first attempt was sent (the failure that
    gave the summarizer up) and whose retry was refused unsent counted as never sent, all its
    attempts with it: "rejected after 0 attempts (1 never sent)", a sent request hidden."""
    given_up = "attempt 2: not sent: the summarizer failed 3 requests in a row"
    events = (
        SummaryRejected("failed", given_up, 2),  # attempt 1 sent (a 503), attempt 2 refused
        SummaryRejected("failed", "attempt 1: not sent: the summarizer failed 3 requests", 1),
    )
    report = ReplayReport((), 0, 0.0, 0.0, 0, 0, 0, (), events=events)
    assert _rejected(report).startswith(
        "; 2 requests rejected after 1 attempt (1 never sent: the summarizer was given up)"
    )
    assert StrategyRow.of("llm", report).summary_not_sent == 1


@pytest.mark.parametrize(
    "message",
    [
        "Requests to the ChatCompletions_Create Operation have exceeded call rate limit. Please "
        "go here: https://aka.ms/oai/quotaincrease if you would like to further increase the "
        "default rate limit.",
        "Resource has been exhausted (e.g. check quota).",
    ],
    ids=["azure", "gemini"],
)
def test_a_rate_limit_that_speaks_of_quotas_does_not_give_the_summarizer_up(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    message: str,
) -> None:
    """Found by the re-run (DB 3): a 429 counted as a spent quota whenever its text held
    "quota", and Azure's and Gemini's rate-limit texts do: one burst gave the summarizer up.
    Only OpenAI's ``insufficient_quota`` code counts now."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    burst = [Reply.error(429, "rate_limit_error", message)] * 3
    sent = _replay_asking(tmp_path, Reply.text(briefing()), "--json", first=burst)
    doc = json.loads(capsys.readouterr().out)
    assert doc["settings"]["summarizer_health"]["given_up"] is False and sent > 3


def test_attempts_given_up_are_counted_apart_from_requests_never_sent() -> None:
    """Found by the re-run (DB 4, 5): the settings' ``not_sent`` counted every attempt
    refused, the refused retry of a request sent before the summarizer was given up too,
    under the same name as the rows' count of requests never sent; it is now
    ``attempts_not_sent``. And a server's own error text holding the refusal's words passed
    for a refusal."""
    health = SummarizerHealth(give_up_after=1)
    assert health.admit()
    health.failed("HTTP 500")
    assert not health.admit() and not health.admit()
    assert health.not_sent == 2
    assert refused("attempt 2: not sent: the summarizer failed 3 requests in a row")
    assert refused("not sent: the summarizer timed out 3 times in a row")
    assert not refused("attempt 3: openai: HTTP 500: not sent: the summarizer proxy was busy")


def test_the_summary_cache_counts_the_requests_that_failed_as_sent(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the re-run (DB 6): "summary cache: ... (0 sent, 0 cached)" after three
    requests reached a server answering 500: only stored replies were counted."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    sent = _replay_asking(tmp_path, Reply.error(500))
    out = capsys.readouterr().out
    assert f"({sent} sent, 0 cached)" in out and sent == 3


async def test_failures_in_a_row_give_up_and_a_reply_starts_the_count_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`SummarizerHealth` over a real SDK summarizer and a fake server: server errors (5xx,
    an unreadable 200) and timeouts count together; a reply, or an error about the request
    itself (a 400: the server works), ends the run; the third failure in a row gives up, and
    the next request is refused without being sent."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    script = [
        Reply.error(500),
        Reply.reset(),  # the connection cut: no reply
        Reply.text(briefing()),  # a reply: the two failures before it no longer count
        Reply.malformed(),  # a 200 that cannot be read
        Reply.error(400),  # the server read the request and refused it: it works
        Reply.error(503),
        Reply.hang(),  # no reply within the timeout
        Reply.error(502),
    ]
    health = SummarizerHealth()
    with FakeOpenAI(replies=script) as flaky:
        inner = SummarizerSpec.parse(f"openai-compatible:{MODEL}@{flaky.url}/v1").build()
        summarizer = CachedSummarizer(inner, SummaryCache(None), timeout=0.5, health=health)
        outcomes: list[str] = []
        try:
            for k in range(len(script) + 1):
                request = replace(REQUEST, prompt=f"Summarize: {k}.")
                try:
                    await summarizer.summarize(request)
                    outcomes.append("ok")
                except SummarizerError as exc:
                    outcomes.append(str(exc))
                assert health.given_up == (k >= len(script) - 1), (k, outcomes)
        finally:
            await summarizer.aclose()
        sent = len(flaky.requests)
    assert sent == len(script)  # the last request was not sent
    assert outcomes[2] == "ok"
    assert outcomes[-1] == "not sent: the summarizer failed 3 requests in a row"
    assert health.failures_in_a_row == 3 and health.timeouts_in_a_row == 1
    assert health.not_sent == 1
    assert health.last_failure is not None and "HTTP 502" in health.last_failure


def test_a_single_replays_totals_count_the_failed_summarizer_requests(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a hostile run (CS 13): against a dead summarizer, a single replay's totals
    said "summarizer: no requests" though every request failed after three attempts. Now the
    line counts the requests rejected and their attempts, with the first reason, as
    --compare and --json do. The re-run (CZ 5) found the requests refused unsent, once the
    summarizer was given up, counted as attempts: no more."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    sent = _replay_asking(tmp_path, Reply.error(500))
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("summarizer: "))
    found = re.search(
        r"no requests; (\d+) requests rejected after (\d+) attempts \((\d+) never sent: the "
        r"summarizer was given up\), first: ",
        line,
    )
    assert found is not None, line
    # The first request failed its three attempts, and the summarizer was given up
    # (test_a_summarizer_that_keeps_failing_is_given_up): each request since was rejected
    # unsent.
    not_sent = re.search(r"; (\d+) attempts not sent", out)
    assert not_sent is not None, out
    assert int(found[1]) == 1 + int(not_sent[1]) == 1 + int(found[3])
    assert int(found[2]) == sent == 3


def test_the_summary_cache_counts_no_request_that_never_reached_a_server(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the re-run (DC 3): counted as each attempt began, a request the client could
    not encode (a key with a character past ASCII) was "sent" though none left the machine."""
    monkeypatch.setenv("OPENAI_API_KEY", "t\u00e9st")
    reached = _replay_asking(tmp_path, Reply.text(briefing()))
    out = capsys.readouterr().out
    assert reached == 0 and "(0 sent, 0 cached)" in out, out


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
async def test_a_summarizer_error_carries_the_providers_name_for_it(provider: str) -> None:
    """What tells a spent quota from a rate limit (both 429): the provider's own code, read
    from the error body through the real SDKs (OpenAI's ``code``, Anthropic's error type)."""
    if provider == "openai":
        spent = Reply.error(429, "insufficient_quota", QUOTA, extra={"code": "insufficient_quota"})
        with FakeOpenAI(default=spent) as server:
            client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
            async with client:
                with pytest.raises(openai.APIStatusError) as raised:
                    await client.chat.completions.create(
                        model="m", messages=[{"role": "user", "content": "x"}]
                    )
        assert summarizer_error(openai, raised.value).code == "insufficient_quota"
        return
    with FakeAnthropic(default=Reply.error(429)) as server:
        async with anthropic.AsyncAnthropic(base_url=server.url, api_key="k", max_retries=0) as c:
            with pytest.raises(anthropic.APIStatusError) as got:
                await c.messages.create(
                    model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}]
                )
    error = summarizer_error(anthropic, got.value)
    assert error.code == "rate_limit_error" and not is_server_failure(error)
