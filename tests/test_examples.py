"""Every example in examples/ runs green offline, against the fake servers, and shows what it
is about."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from agentctx.recall import recall_id
from agentctx.strategies.deterministic import truncate_text

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
KEYS = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL", "OPENAI_BASE_URL")
ALL = [
    "anthropic_loop.py",
    "anthropic_wrap.py",
    "openai_responses_loop.py",
    "summarize_cheap_model.py",
    "compaction_events.py",
    "recall_tool.py",
    "anthropic_tool_runner.py",
    "pydantic_ai_agent.py",
    "langchain_agent.py",
    "openai_agents_agent.py",
]

COMPACTED = re.compile(
    r"^compacted \((\w+)\): (\d+) -> (\d+) tokens, saved (\d+); \d+ -> \d+ messages$"
)
USD = r"\$(\d+\.\d{6})"


def run_offline(name: str) -> list[str]:
    """Run an example offline (warnings are errors); its stdout lines. Nothing on stderr."""
    env = {**os.environ, "AGENTCTX_OFFLINE": "1", "PYTHONWARNINGS": "error"}
    for key in KEYS:
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
    return done.stdout.splitlines()


def load(name: str) -> ModuleType:
    """Import an example as a module (its ``main`` does not run)."""
    spec = importlib.util.spec_from_file_location(f"example_{name[:-3]}", EXAMPLES / name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "name",
    [
        "anthropic_loop.py",
        "anthropic_wrap.py",
        "openai_responses_loop.py",
        "anthropic_tool_runner.py",
    ],
)
def test_loop_example_runs_offline(name: str) -> None:
    lines = run_offline(name)
    compactions = [m for m in map(COMPACTED.match, lines) if m]
    assert compactions, lines
    for m in compactions:
        before, after, saved = map(int, m.groups()[1:])
        assert before > after and saved == before - after
    assert "final answer: Eight small arithmetic helper modules." in lines
    assert lines[-1].startswith("usage: ") and "cache reads" in lines[-1]


def test_anthropic_tool_runner_compacts_inside_the_runners_loop() -> None:
    lines = run_offline("anthropic_tool_runner.py")
    turns = [line for line in lines if line.startswith("turn ")]
    # the SDK's runner ran every tool the model asked for, one turn each ...
    assert turns == [f"turn {i + 1}: read_file(mod{i}.py)" for i in range(8)]
    # ... and a request inside its loop was compacted before the answer
    compacted = next(i for i, line in enumerate(lines) if COMPACTED.match(line))
    assert (
        lines.index(turns[0])
        < compacted
        < lines.index("final answer: Eight small arithmetic helper modules.")
    )


@pytest.mark.parametrize(
    "name", ["pydantic_ai_agent.py", "langchain_agent.py", "openai_agents_agent.py"]
)
def test_framework_example_runs_offline(name: str) -> None:
    lines = run_offline(name)
    compactions = [m for m in map(COMPACTED.match, lines) if m]
    assert compactions, lines
    for m in compactions:
        before, after, saved = map(int, m.groups()[1:])
        assert before > after and saved == before - after
    # Each model call prints what it got: after a compaction, fewer tool results than were
    # made so far (the k-th call follows k - 1 of them).
    calls = [
        int(m[1])
        for m in map(
            re.compile(r"^(?:request \d+|model call): \d+ \w+(?: items)?, (\d+) tool").match, lines
        )
        if m
    ]
    assert len(calls) == 9, lines
    assert any(seen < k for k, seen in enumerate(calls)), calls
    # ... while the framework's own history keeps every result whole.
    kept = re.compile(r"^(?:history|state|run items): .*\b8 tool \w+, whole: True$")
    assert any(map(kept.match, lines)), lines
    assert lines[-1] == "final answer: Eight small arithmetic helper modules."


def test_summarize_cheap_model() -> None:
    lines = run_offline("summarize_cheap_model.py")
    text = "\n".join(lines)
    unused = re.findall(rf"^briefing not used \((\w+) (\w+)\): cost {USD}$", text, re.MULTILINE)
    # Only a briefing replaced by its update while it waited, or one still waiting when the
    # session ended, goes unused, and it is reported.
    assert all(kind == "SummaryStale" and why in ("updated", "unused") for kind, why, _ in unused)
    assert [why for _, why, _ in unused].count("unused") <= 1, text
    assert len(unused) == text.count("briefing not used")
    summarizer_line = re.compile(
        rf"^  summarizer claude-haiku-5-5: (\d+) messages summarized, (\d+) input"
        rf" \+ (\d+) output tokens, cost {USD}$"
    )
    spliced = 0
    event_cost = 0.0
    for i, line in enumerate(lines):
        m = COMPACTED.match(line)
        if not m:
            continue
        method, before, after, saved = m[1], int(m[2]), int(m[3]), int(m[4])
        assert before > after and saved == before - after
        if method != "summarized":
            continue
        # The briefing replaced part of the history, and the event says what it cost.
        spliced += 1
        assert lines[i + 1].startswith("  - spliced a briefing over "), lines[i + 1]
        stats = next(s for s in map(summarizer_line.match, lines[i + 1 :]) if s)
        messages, prompt, output, cost = int(stats[1]), int(stats[2]), int(stats[3]), stats[4]
        assert messages >= 4 and prompt > 0 and output > 0 and float(cost) > 0
        event_cost += float(cost)
    assert spliced >= 1, text
    assert "final answer: Fourteen small arithmetic helper modules." in lines
    total = re.search(
        rf"^summarizer total \(claude-haiku-5-5\): (\d+) requests, (\d+) input \+ (\d+) output"
        rf" tokens, cost {USD}; (idle|in_flight|ready) at the end$",
        text,
        re.MULTILINE,
    )
    assert total, text
    # Every billed request is in the session's spend and in exactly one event.
    assert int(total[1]) == spliced + len(unused)
    assert float(total[4]) == pytest.approx(
        event_cost + sum(float(c) for *_, c in unused), abs=2e-6
    )
    assert lines[-1].startswith("loop total (claude-sonnet-5-5): ")


def test_compaction_events() -> None:
    lines = run_offline("compaction_events.py")
    text = "\n".join(lines)
    compacted = re.compile(
        rf"^\[callback\] compacted \((\w+)\): saved (\d+) tokens \((\d+) -> (\d+)\), cost {USD}$"
    )
    rejected = re.compile(r"^\[callback\] summary rejected \((\w+)\): (.*); cost " + USD + "$")
    stale = re.compile(r"^\[callback\] summary stale \((\w+)\); cost " + USD + "$")
    saved_total, cost_total, methods, reasons, stale_reasons = 0, 0.0, [], [], []
    for line in lines:
        if m := compacted.match(line):
            saved, before, after = int(m[2]), int(m[3]), int(m[4])
            assert saved == before - after > 0
            # A spliced briefing costs what its request did; a deterministic pass costs 0.
            assert (float(m[5]) > 0) == (m[1] == "summarized"), line
            methods.append(m[1])
            saved_total += saved
            cost_total += float(m[5])
        elif m := rejected.match(line):
            reasons.append(m[1])
            cost_total += float(m[3])  # a rejected briefing was billed all the same
        elif m := stale.match(line):
            stale_reasons.append(m[1])
            cost_total += float(m[2])
    # The scripted cheap model answers once without the briefing's headings, then properly.
    assert reasons == ["malformed"], text
    assert "missing sections: Goal, Constraints, Decisions, Files touched, Open items" in text
    assert "summarized" in methods, text
    assert "final answer: Fourteen small arithmetic helper modules." in lines
    # The iterator saw the same events as the callback, and sums them to the same totals.
    tally = re.search(
        rf"^\[iterator\] (.*); saved (\d+) tokens in total, summaries cost {USD}$",
        text,
        re.MULTILINE,
    )
    assert tally, text
    # Only briefings replaced by their update while they waited, and at most the one still
    # waiting when the session ended, go unused (and are reported).
    assert set(stale_reasons) <= {"updated", "unused"}, text
    assert stale_reasons.count("unused") <= 1, text
    expected = f"{len(methods)} ContextCompacted, 1 SummaryRejected"
    assert tally[1] == expected + (f", {len(stale_reasons)} SummaryStale" if stale_reasons else "")
    assert int(tally[2]) == saved_total
    assert float(tally[3]) == pytest.approx(cost_total, abs=1e-5)
    spend = re.search(
        rf"^summarizer \(gpt-4.1-mini\): (\d+) requests billed, cost {USD};", text, re.MULTILINE
    )
    assert spend, text
    # every billed request is in exactly one event
    assert int(spend[1]) == len(reasons) + methods.count("summarized") + len(stale_reasons)
    assert float(spend[2]) == pytest.approx(float(tally[3]), abs=1e-5)


def test_recall_tool() -> None:
    lines = run_offline("recall_tool.py")
    text = "\n".join(lines)
    example = load("recall_tool.py")
    original: str = example.run_tests()
    failing = original.split("\n")[example.FAILING]
    # The log was truncated in the view the model saw: the failing line was not in it.
    assert f"\n  - truncated run_tests result {len(original)}->" in text, text
    shown = truncate_text(original, 200, 20_000)
    assert failing not in shown
    rid = recall_id("recall-example", original)
    header = re.compile(
        r"^\[recall_context (ctx-[0-9a-f]{16}): chars (\d+)-(\d+) of (\d+); "
        r"(?:next offset=(\d+)|end)\]\n",
        re.MULTILINE,
    )
    pages = list(header.finditer(text))
    assert len(pages) >= 1, text
    recalled = ""
    for n, m in enumerate(pages):
        start, end, total = int(m[2]), int(m[3]), int(m[4])
        assert m[1] == rid and total == len(original)
        page = text[m.end() : m.end() + end - start]
        # The page is the original output's bytes, exactly.
        assert page == original[start:end]
        assert text[m.end() + end - start] == "\n"
        if n == 0:  # the model read from where the placeholder stood: the cut part
            assert start == shown.index("[... ") and original[:start] == shown[:start]
        else:  # ... and paged on
            assert start == int(pages[n - 1][5])
        call = f"recall_context(id={rid}, offset={start}, limit={end - start}) returned:"
        assert text[: m.start()].endswith(call + "\n")
        recalled += page
    assert failing in recalled
    assert lines[-1] == f"final answer: This test fails: {failing}"


@pytest.mark.parametrize("name", ALL)
def test_examples_refuse_to_run_online_without_a_key(name: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("AGENTCTX_OFFLINE", *KEYS)}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "AGENTCTX_OFFLINE=1" in done.stderr
