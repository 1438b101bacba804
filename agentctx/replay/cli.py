"""The ``agentctx`` command: ``agentctx replay`` and ``agentctx demo``.

```
agentctx replay [PATH ...] [--context-window TOKENS] [--reserve TOKENS]
                [--strategy llm|pipeline|deterministic|none | --compare NAME,NAME,...]
                [--summarizer-delay SECONDS | --summarizer PROVIDER:MODEL[@URL]]
                [--summarizer-timeout SECONDS] [--summary-cache PATH] [--concurrency N]
                [--json] [--report PATH] [--chart PATH]
agentctx demo [--context-window TOKENS] [--reserve TOKENS]
agentctx --version
```

With no transcript, ``replay`` uses the real session that ships with agentctx, offline, through
background summaries from an offline extractive summarizer and the deterministic tiers.
``--summarizer`` sends the summaries to a real model instead, in session time, with every
reply kept in a summary cache (`agentctx.replay.cached_summarizer`) so a rerun costs nothing.
One transcript through one strategy prints a row per request; ``--compare``, several
transcripts or a folder print a row per strategy (`agentctx.replay.compare`), ``--json`` one
JSON document, and ``--report`` writes an HTML page (`agentctx.replay.report`).
``demo`` runs a small live agent loop (scripted model, real file tools) and prints each event.
On a terminal with rich installed (the ``cli`` extra) the report is a table with a progress
bar for long replays; otherwise it is plain text. Errors in the input are one line on stderr
and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import math
import os
import sys
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NoReturn, TextIO, cast

import anyio

from agentctx import __version__
from agentctx.budget import DEFAULT_RESERVE_OUTPUT, Budget
from agentctx.errors import AgentCtxError, ConfigError, MissingExtraError, TranscriptFormatError
from agentctx.importers import load_transcript, openhands
from agentctx.replay._safe_text import printable
from agentctx.replay.cached_summarizer import (
    GIVE_UP_AFTER,
    SummarizerHealth,
    SummaryCache,
    default_cache_path,
)
from agentctx.replay.compare import (
    Comparison,
    print_comparison,
    print_comparison_rich,
    transcript_name,
)
from agentctx.replay.data import DEMO_TRANSCRIPT
from agentctx.replay.engine import SONNET_MODEL, replay_problem
from agentctx.replay.jobs import (
    DEFAULT_SUMMARIZER_DELAY,
    DEFAULT_SUMMARIZER_TIMEOUT,
    STRATEGIES,
    Outcome,
    ReplaySettings,
    run_replays,
)
from agentctx.replay.real_summarizer import SummarizerSpec
from agentctx.replay.render import LazyProgress, print_plain, print_rich

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rich.console import Console

    from agentctx.importers import Transcript

__all__ = ["main"]

# The library's default output reserve (Budget.reserve_output), and windows that leave the
# shipped session a 37k budget (where its briefing is needed) and the demo a 14k one.
DEFAULT_RESERVE = DEFAULT_RESERVE_OUTPUT
DEFAULT_CONTEXT_WINDOW = 37_000 + DEFAULT_RESERVE
DEMO_CONTEXT_WINDOW = 14_000 + DEFAULT_RESERVE
"""Small enough that the shipped session (71k tokens raw) needs a briefing and the tiers."""

DEFAULT_CONCURRENCY = 4
"""Replays run at once with a real summarizer (each has at most one request in flight)."""

TRANSCRIPT_SUFFIXES = (".jsonl", ".json", ".traj")
"""The files of a folder given as PATH that are replayed."""

_DEFAULT_TARGET_RATIO = Budget.__dataclass_fields__["target_ratio"].default


def _ratio(text: str) -> float:
    value = float(text)
    if not 0 < value <= 0.75:
        raise argparse.ArgumentTypeError(f"a fraction in (0, 0.75] (the trigger), got {text}")
    return value


_STRATEGY_HELP = (
    "how to compact: llm: background briefings from a summarizer (the offline extractive "
    "one unless --summarizer), then the deterministic tiers; pipeline: ToolOutputPipeline "
    "then the tiers; deterministic: the tiers only; none: no compaction (default: "
    "%(default)s)"
)

# Wrapped by hand: the epilog's examples need RawDescriptionHelpFormatter, which keeps the
# description's lines as they are too.
_DESCRIPTION = """\
Measure how agentctx keeps an LLM agent inside its context window.

'agentctx replay' replays a real agent session, request by request, through a
compaction strategy against a simulated prompt cache, and reports the prompt
tokens sent with and without compaction, cache reads and writes, the simulated
input cost, the compactions and prefix-cache breaks, and what was cleared or
summarized. 'agentctx demo' runs a small scripted agent loop live and prints
each event as it happens. Both run offline: no API key, no network."""

_EPILOG = """\
examples:
  agentctx replay                       the session that ships with agentctx
  agentctx replay session.jsonl --strategy deterministic --context-window 100000
  agentctx replay --compare deterministic,pipeline,llm --report replay.html
  agentctx replay sessions/ --compare deterministic,llm --json > replay.json
  agentctx replay --summarizer anthropic:claude-haiku-4-5   real briefings, cached
  agentctx demo"""

_REPLAY_DESCRIPTION = (
    "Replay a recorded agent session through a compaction strategy, against a simulated "
    "prompt cache, and report per request and in total: prompt tokens with and without "
    "compaction, cache reads and writes, the simulated input cost at "
    f"{SONNET_MODEL} prices, compactions, cache breaks, and what was cleared or summarized."
)

_TRANSCRIPT_HELP = (
    "the sessions to replay: Claude Code or pi JSONL transcripts, SWE-agent trajectories, "
    "OpenHands events, or JSON lists of agentctx messages, or folders of them (their "
    f"{', '.join(TRANSCRIPT_SUFFIXES)} files) (default: the session that ships with "
    f"agentctx, {str(DEMO_TRANSCRIPT).replace('%', '%%')})"
)

_SUMMARIZER_HELP = (
    "send the llm strategy's summaries to a real model: anthropic:MODEL (key from "
    "ANTHROPIC_API_KEY), openai:MODEL (OPENAI_API_KEY) or openai-compatible:MODEL@URL (a "
    "Chat Completions server such as vLLM or Ollama at URL, e.g. http://127.0.0.1:8000/v1; "
    "OPENAI_API_KEY if set). Its measured latency becomes session time, and every reply is "
    "kept in --summary-cache, so a rerun sends nothing (default: the offline extractive "
    "summarizer, no key, no network)"
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, exit status 2, like every other input error (argparse adds the usage).
        self.exit(2, f"{self.prog}: {message}\n")


def _count(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of tokens: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be finite seconds >= 0: {text!r}")
    return value


def _timeout(text: str) -> float:
    value = _seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds: {text!r}")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def _strategy_list(text: str) -> list[str]:
    names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in STRATEGIES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown strategy {', '.join(map(repr, unknown)) or repr(text)}; choose from "
            f"{', '.join(STRATEGIES)}, separated by commas"
        )
    return names


def _summarizer(text: str) -> SummarizerSpec:
    try:
        return SummarizerSpec.parse(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parser() -> argparse.ArgumentParser:
    """The command's argument parser."""
    raw = argparse.RawDescriptionHelpFormatter
    p = _Parser(prog="agentctx", description=_DESCRIPTION, epilog=_EPILOG, formatter_class=raw)
    p.add_argument("--version", action="version", version=f"agentctx {__version__}")
    sub = p.add_subparsers(
        dest="command",
        required=True,
        parser_class=_Parser,
        metavar="COMMAND",
        help="replay or demo; 'agentctx COMMAND --help' shows its options",
    )
    r = sub.add_parser(
        "replay",
        help="replay a recorded session through a strategy and report tokens, cache and cost",
        description=_REPLAY_DESCRIPTION,
    )
    r.add_argument("transcript", nargs="*", metavar="PATH", help=_TRANSCRIPT_HELP)
    r.add_argument(
        "--context-window",
        type=_count,
        default=DEFAULT_CONTEXT_WINDOW,
        metavar="TOKENS",
        help="the model's context window, in tokens; the budget is this minus --reserve "
        "(default: %(default)s)",
    )
    r.add_argument(
        "--reserve",
        type=_count,
        default=DEFAULT_RESERVE,
        metavar="TOKENS",
        help="tokens of the window kept for the output (default: %(default)s)",
    )
    r.add_argument(
        "--target-ratio",
        type=_ratio,
        default=_DEFAULT_TARGET_RATIO,
        metavar="FRACTION",
        help="how deep a compaction brings the prompt, as a fraction of the budget "
        "(Budget.target_ratio; default: %(default)s)",
    )
    how = r.add_mutually_exclusive_group()
    how.add_argument("--strategy", choices=list(STRATEGIES), default="llm", help=_STRATEGY_HELP)
    how.add_argument(
        "--compare",
        type=_strategy_list,
        metavar="NAME,NAME,...",
        help="replay through each of these strategies and print one row per strategy: "
        "tokens sent, cost, cache breaks, requests over budget, summarizer share, retention "
        f"of early file paths (any of {', '.join(STRATEGIES)}; default: --strategy only)",
    )
    r.add_argument(
        "--summarizer-delay",
        type=_seconds,
        default=DEFAULT_SUMMARIZER_DELAY,
        metavar="SECONDS",
        help="seconds of session time the offline summarizer takes per briefing, for "
        "the llm strategy only (default: %(default)s)",
    )
    r.add_argument(
        "--summarizer", type=_summarizer, metavar="PROVIDER:MODEL", help=_SUMMARIZER_HELP
    )
    r.add_argument(
        "--summarizer-timeout",
        type=_timeout,
        default=DEFAULT_SUMMARIZER_TIMEOUT,
        metavar="SECONDS",
        help="wall seconds a --summarizer request may take before it counts as failed; "
        f"after {GIVE_UP_AFTER} failed requests in a row (timeouts or server errors) the "
        "summarizer is asked no more and the deterministic tiers compact alone (default: "
        "%(default)s)",
    )
    r.add_argument(
        "--summary-cache",
        metavar="PATH",
        help="the JSON-lines file that keeps a real summarizer's replies, by model and "
        "request (default: $XDG_CACHE_HOME/agentctx/summaries.jsonl, that is "
        "~/.cache/agentctx/summaries.jsonl)",
    )
    r.add_argument(
        "--concurrency",
        type=_positive,
        default=DEFAULT_CONCURRENCY,
        metavar="N",
        help="with --summarizer, replays (and so summarizer requests) run at once "
        "(default: %(default)s)",
    )
    r.add_argument(
        "--json",
        action="store_true",
        default=None,  # no "(default: False)" to show: off unless given
        help="print one JSON document instead of tables: the settings, a row per transcript "
        "and strategy, and the totals per strategy",
    )
    r.add_argument(
        "--report",
        metavar="PATH",
        help="also write an HTML report to PATH: one self-contained page with the totals, "
        "the settings and charts per strategy (default: no report)",
    )
    r.add_argument(
        "--chart",
        metavar="PATH",
        help="also write a chart of tokens per request to PATH: .html writes the --report "
        "page, .png one figure of a single replay (needs the 'chart' extra; default: no "
        "chart)",
    )
    d = sub.add_parser(
        "demo",
        help="run a small live agent loop and print each event as it happens",
        description="Run a small agent loop live, offline (a scripted model, real file "
        "tools reading the agentctx package), and print each event as it happens.",
    )
    d.add_argument(
        "--context-window",
        type=_count,
        default=DEMO_CONTEXT_WINDOW,
        metavar="TOKENS",
        help="the model's context window, in tokens (default: %(default)s)",
    )
    d.add_argument(
        "--reserve",
        type=_count,
        default=DEFAULT_RESERVE,
        metavar="TOKENS",
        help="tokens of the window kept for the output (default: %(default)s)",
    )
    return p


def _paths(given: Sequence[str]) -> list[tuple[Path, bool]]:
    """The transcript files: each PATH, or the `TRANSCRIPT_SUFFIXES` files of a folder; with
    whether it was found in a folder. A file named twice (a folder and a file in it,
    overlapping globs) is replayed once."""
    out: list[tuple[Path, bool]] = []
    for text in given or [str(DEMO_TRANSCRIPT)]:
        if not text.strip():  # an unset variable: ``Path("")`` would be the current folder
            raise ConfigError("a transcript path is empty")
        path = Path(text)
        if path.is_dir():
            # Every entry so named: one that is no file (a pipe, a dangling link, a folder) is
            # skipped by `_load` with a line that says so.
            found = sorted(p for p in path.iterdir() if p.suffix.lower() in TRANSCRIPT_SUFFIXES)
            if not found:
                raise ConfigError(f"{path}: no {', '.join(TRANSCRIPT_SUFFIXES)} files to replay")
            out += [(p, True) for p in found]
        else:
            out.append((path, False))
    seen: set[str] = set()
    once = []
    for path, in_folder in out:
        key = os.path.realpath(path)  # never raises: a link loop is `_load`'s to report
        if key in seen:
            print(
                f"agentctx: {printable(str(path), one_line=True)} is named more than once",
                file=sys.stderr,
            )
        else:
            seen.add(key)
            once.append((path, in_folder))
    return once


def _load(paths: Sequence[tuple[Path, bool]]) -> list[Transcript]:
    """Load every transcript, each task of an OpenHands evaluation output as one
    (``<path>#<instance id>``); in a folder, a file that is no transcript is skipped with a
    line on stderr (a named file that is none is an error, whatever else is named)."""
    out: list[Transcript] = []
    for path, in_folder in paths:
        try:
            transcript = load_transcript(path)
            if transcript.format == "openhands" and "instance" in transcript.extra:
                tasks = openhands.load_instances(path)
                loaded = _named_tasks(tasks) if len(tasks) > 1 else tasks
            else:
                loaded = [transcript]
            for each in loaded:
                # Refused here, named: inside the replay it would end every other one. A
                # task of an evaluation output (a failed one has no history) is skipped alone.
                problem = replay_problem(each.messages)
                if problem is None:
                    out.append(each)
                    continue
                refused = TranscriptFormatError(transcript_name(each), 0, problem)
                if len(loaded) == 1:
                    raise refused
                _say_skipped(refused)
        except (AgentCtxError, OSError, ValueError) as exc:
            if not in_folder:
                raise
            _say_skipped(exc)
    if not out:
        raise ConfigError("no transcript to replay")
    return out


def _say_skipped(error: Exception) -> None:
    print(printable(f"agentctx: skipped {' '.join(str(error).split())}"), file=sys.stderr)


def _named_tasks(tasks: Sequence[Transcript]) -> list[Transcript]:
    """Each task of an evaluation output named ``<path>#<instance id>``, or by its line where
    the ids are missing or repeat (two runs of a task in one file stay two)."""
    ids = [t.extra.get("instance_id") for t in tasks]
    named = all(isinstance(i, str) and i for i in ids) and len(set(ids)) == len(ids)
    out = []
    for k, t in enumerate(tasks):
        label = f"#{ids[k] if named else k + 1}"
        name = MappingProxyType({**t.extra, "name": Path(t.path).name + label})
        out.append(dataclasses.replace(t, path=t.path + label, extra=name))
    return out


def _settings_json(args: argparse.Namespace, settings: ReplaySettings) -> dict[str, Any]:
    cache = settings.cache
    return {
        "agentctx": __version__,
        "context_window": settings.context_window,
        "reserve": settings.reserve,
        "budget": settings.budget.limit,
        "target_ratio": settings.budget.target_ratio,
        "strategies": list(args.compare or [args.strategy]),
        "summarizer": str(settings.summarizer)
        if settings.summarizer
        else settings.summarizer_model,
        "summarizer_delay": None if settings.summarizer else settings.summarizer_delay,
        "summary_cache": str(cache.path) if cache is not None and cache.path else None,
        "priced_at": SONNET_MODEL,
        "cache_ttl_seconds": 300,
        "retention": "early file paths in view or one recall away, worst check / mean",
    }


def _settings_lines(doc: dict[str, Any], outcomes: Sequence[Outcome]) -> list[tuple[str, str]]:
    """The settings for the report page, as ``(label, value)``."""
    files = list(dict.fromkeys(o.transcript.path for o in outcomes))
    shown = ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")
    summarizer = doc["summarizer"]
    if doc["summarizer_delay"] is not None:
        summarizer += f", {doc['summarizer_delay']:g} s of session time per briefing"
    else:
        summarizer += ", its measured latency as session time"
    lines = [
        ("transcripts", shown),
        (
            "context window",
            f"{doc['context_window']:,} tokens, {doc['reserve']:,} reserved "
            f"for output: budget {doc['budget']:,}",
        ),
        ("strategies", ", ".join(doc["strategies"])),
        ("summarizer (llm)", summarizer),
    ]
    if doc["summary_cache"]:
        lines.append(("summary cache", doc["summary_cache"]))
    lines += [
        ("prices", f"input at {SONNET_MODEL} list prices; an ideal prefix cache, 5 min TTL"),
        ("retention", "early file paths in view or one recall away: worst check, mean"),
        ("agentctx", doc["agentctx"]),
    ]
    return lines


def _progress_console(args: argparse.Namespace, console: Console | None) -> Console | None:
    """Where the progress bar goes: the report's console, or stderr's with --json (stdout
    is the document); ``None``: no bar (not a terminal, or rich missing)."""
    if not args.json:
        return console
    if not sys.stderr.isatty():
        return None
    try:
        from rich.console import Console
    except ImportError:
        return None
    return Console(file=sys.stderr)


def _replay(args: argparse.Namespace, console: Console | None) -> int:
    paths = _paths(args.transcript)
    held = _check_outputs(args, [p for p, _ in paths])
    try:
        return _replay_checked(args, console, paths)
    finally:
        for fd in held:
            os.close(fd)


def _replay_checked(
    args: argparse.Namespace, console: Console | None, paths: Sequence[tuple[Path, bool]]
) -> int:
    transcripts = _load(paths)
    strategies: list[str] = args.compare or [args.strategy]
    spec: SummarizerSpec | None = args.summarizer
    cache: SummaryCache | None = None
    if spec is not None and "llm" in strategies:
        spec.check()
        cache = SummaryCache(args.summary_cache or default_cache_path())
    elif spec is not None:
        print("agentctx: --summarizer is for the llm strategy, not replayed here", file=sys.stderr)
    settings = ReplaySettings(
        context_window=args.context_window,
        reserve=args.reserve,
        target_ratio=args.target_ratio,
        summarizer_delay=args.summarizer_delay,
        summarizer=spec if cache is not None else None,
        cache=cache,
        concurrency=args.concurrency,
        summarizer_timeout=args.summarizer_timeout,
    )

    def status() -> str:
        return f"summaries: {cache.sent} sent, {cache.hits} cached" if cache is not None else ""

    bar = _progress_console(args, console)
    name = (
        transcript_name(transcripts[0])
        if len(transcripts) == 1
        else f"{len(transcripts)} transcripts"
    )
    if bar is None:
        outcomes = run_replays(transcripts, strategies, settings)
    else:
        with LazyProgress(
            bar,
            f"replaying {printable(name, one_line=True)}",
            status=status if cache is not None else None,
        ) as progress:
            outcomes = run_replays(transcripts, strategies, settings, progress=progress)
    _say_clock_repairs(outcomes)
    doc = _settings_json(args, settings)
    if cache is not None:  # a real summarizer: whether it was given up, for a script too
        health = settings.health
        doc["summarizer_health"] = {
            "given_up": health.given_up,
            "attempts_not_sent": health.not_sent,
            "last_failure": health.last_failure,
        }
    written = _write_files(args, outcomes, doc)
    lines = [f"{label}: {path}" for label, path in written]
    if cache is not None and settings.health.given_up:
        lines.append(_gave_up(settings.health, args.summarizer_timeout))
    if cache is not None and cache.write_error is not None:
        # Said once, on stderr too: the replies were kept for this replay, not for a rerun.
        print(
            printable(
                f"agentctx: --summary-cache {cache.path}: could not be written "
                f"({cache.write_error}); this run's replies are not kept for the next",
                one_line=True,
            ),
            file=sys.stderr,
        )
        lines.append(
            f"summary cache: {cache.path} not written ({cache.sent} sent, {cache.hits} cached)"
        )
    elif cache is not None:
        lines.append(f"summary cache: {cache.path} ({cache.sent} sent, {cache.hits} cached)")
    if args.json:
        comparison = Comparison.of(outcomes)
        json.dump(comparison.as_json(doc), sys.stdout, indent=2)
        sys.stdout.write("\n")
        # stdout is the document: what else there is to say goes to stderr.
        for line in lines:
            print(printable(line, one_line=True), file=sys.stderr)
        return 0
    if len(outcomes) == 1:
        _print_one(outcomes[0], settings, console)
    elif console is None:
        print_comparison(Comparison.of(outcomes), sys.stdout)
    else:
        print_comparison_rich(Comparison.of(outcomes), console)
    for line in (printable(line, one_line=True) for line in lines):
        if console is None:
            print(line)
        else:
            console.print(line, markup=False, highlight=False)
    return 0


def _gave_up(health: SummarizerHealth, timeout: float) -> str:
    """The line saying that the summarizer was asked no more: after how many failures, of
    what kind (timeouts of ``timeout`` wall seconds, or the last failure's reason), and how
    many requests the deterministic tiers made up for."""
    if health.only_timeouts:
        why = f"{health.give_up_after} timeouts in a row of {timeout:g} s"
    else:
        why = f"{health.give_up_after} failed requests in a row (last: {health.last_failure})"
    return (
        f"summarizer: gave up after {why}; {health.not_sent} attempts not sent, the "
        "deterministic tiers compacted instead"
    )


def _say_clock_repairs(outcomes: Sequence[Outcome]) -> None:
    """One line on stderr per transcript whose request times were read as out of order
    (`agentctx.replay.engine.request_times`): the results depend on that reading."""
    said: set[str] = set()
    for outcome in outcomes:
        late = outcome.report.timestamps_out_of_order
        if late and outcome.transcript.path not in said:
            said.add(outcome.transcript.path)
            print(
                printable(
                    f"agentctx: {transcript_name(outcome.transcript)}: {_late(late)}", one_line=True
                ),
                file=sys.stderr,
            )


def _late(count: int) -> str:
    what = "request time" if count == 1 else "request times"
    return f"{count} {what} later than the ones after read as the next one's"


def _check_outputs(args: argparse.Namespace, inputs: Sequence[Path]) -> list[int]:
    """Refuse an output path that cannot be written before the replay runs (minutes on a
    long session), not after it, and one that is a transcript replayed (often the only copy
    of a session) or the summary cache (paid summaries). Returns the descriptors of the
    named pipes it opened to find their readers: close them once the outputs are written."""
    if args.summary_cache is not None and not args.summary_cache.strip():
        # Not the default cache: an unset variable would send paid replies somewhere unasked.
        raise ConfigError("--summary-cache: the path is empty")
    cache = Path(args.summary_cache) if args.summary_cache else default_cache_path()
    if args.summary_cache and any(_same_file(cache, given) for given in inputs):
        raise ConfigError(f"--summary-cache {args.summary_cache}: a transcript replayed")
    if args.summarizer is not None and "llm" in (args.compare or [args.strategy]):
        _check_cache(cache)
    held: list[int] = []
    try:
        for flag, value in (("--report", args.report), ("--chart", args.chart)):
            if value is not None:
                _check_output(flag, value, inputs, cache, held, bool(args.json))
        if args.chart is not None and Path(args.chart).suffix.lower() == ".png":
            _check_png(args.chart, len(inputs) * len(args.compare or [args.strategy]))
    except BaseException:
        for fd in held:
            os.close(fd)
        raise
    return held


def _check_output(
    flag: str, value: str, inputs: Sequence[Path], cache: Path, held: list[int], json_out: bool
) -> None:
    path = Path(value)
    if not value.strip():
        raise ConfigError(f"{flag}: the path is empty")
    if flag == "--chart" and path.suffix.lower() not in (".html", ".htm", ".png"):
        raise ConfigError(
            f"{value}: a chart is .html or .png, not {path.suffix or 'no extension'!r}"
        )
    if path.is_dir():
        raise ConfigError(f"{flag} {value}: a folder, not a file")
    if _same_file_as_stdout(path) and not _same_file(path, Path(os.devnull)):
        what = "--json" if json_out else "the table"
        raise ConfigError(f"{flag} {value}: the standard output, which {what} writes")
    if path.is_fifo():
        fd = _reader_held(path)
        if fd is None:
            # Its open would hold the command until a reader came, after the replay.
            raise ConfigError(f"{flag} {value}: a pipe that no one reads")
        held.append(fd)
    # A link is written through: a dangling one creates its target, in the target's folder.
    folder = Path(os.path.realpath(path)).parent if path.is_symlink() else path.parent
    if not folder.is_dir():
        raise ConfigError(f"{flag} {value}: there is no folder {folder}")
    if not os.access(path if path.exists() else folder, os.W_OK):
        raise ConfigError(f"{flag} {value}: not writable")
    if path.exists() and any(_same_file(path, given) for given in inputs):
        raise ConfigError(f"{flag} {value}: a transcript replayed, not overwritten")
    # Whether or not either exists yet: the cache is made during the replay, then written over.
    if _same_file(path, cache) or _resolved(path) == _resolved(cache):
        raise ConfigError(f"{flag} {value}: the summary cache, not overwritten")


def _check_cache(cache: Path) -> None:
    """Refuse a summary cache that could not be written, before any reply is paid for."""
    if cache.is_symlink() and not cache.exists():
        raise ConfigError(f"--summary-cache {cache}: a link to nothing")
    if cache.is_dir():
        raise ConfigError(f"--summary-cache {cache}: a folder, not a file")
    if cache.exists():
        if not cache.is_file():  # a pipe would block the open for good
            raise ConfigError(f"--summary-cache {cache}: not a regular file")
        if not os.access(cache, os.W_OK):
            raise ConfigError(f"--summary-cache {cache}: not writable")
        return
    # Its folders are made on the first reply: the nearest one that exists must allow it.
    folder = cache.parent
    while not folder.exists() and not folder.is_symlink() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise ConfigError(f"--summary-cache {cache}: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"--summary-cache {cache}: {folder} is not writable")


def _check_png(value: str, replays: int) -> None:
    """Refuse a .png chart that could not be drawn, before the replay rather than after."""
    if replays > 1:
        raise ConfigError(f"{value}: a .png chart shows one replay; use --report")
    try:
        importlib.import_module("matplotlib")
    except ImportError as exc:
        raise MissingExtraError("chart", exc.name, needed_by="a .png chart") from exc


def _same_file_as_stdout(path: Path) -> bool:
    try:
        here, out = path.stat(), os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no such file yet, or no stdout to be
        return False
    return (here.st_dev, here.st_ino) == (out.st_dev, out.st_ino)


def _reader_held(fifo: Path) -> int | None:
    """A descriptor writing to ``fifo`` when a process has it open for reading (a process
    substitution's has), else ``None``. Kept open until the output is written: closed at
    once, it would end the reader's file before a byte came."""
    try:
        return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # ENXIO: no reader
        return None


def _resolved(path: Path) -> str:
    return os.path.normcase(os.path.realpath(os.path.abspath(path)))


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.samefile(b)
    except OSError:  # one is gone or cannot be read: not a file written over
        return False


def _write_files(
    args: argparse.Namespace, outcomes: Sequence[Outcome], doc: dict[str, Any]
) -> list[tuple[str, str]]:
    """Write --report and --chart; returns ``(what, path)`` of each file written."""
    from agentctx.replay.report import sections_of, write_report

    first = outcomes[0]
    title = f"agentctx replay: {transcript_name(first.transcript)}"
    if len({o.transcript.path for o in outcomes}) > 1:
        title = f"agentctx replay: {len({o.transcript.path for o in outcomes})} transcripts"
    written = []
    pages = [
        (label, p) for label, p in (("report", args.report), ("chart", args.chart)) if p is not None
    ]
    for label, path in pages:
        if Path(path).is_fifo():
            # Read at the check, and left since: the open would wait for a reader forever.
            probe = _reader_held(Path(path))
            if probe is None:
                raise ConfigError(f"--{label} {path}: the pipe's reader went away")
            os.close(probe)  # (the one held since the check keeps the reader's file open)
        try:
            if label == "chart" and Path(path).suffix.lower() not in (".html", ".htm"):
                from agentctx.replay.chart import ChartError, write_chart

                if len(outcomes) > 1:
                    raise ChartError(f"{path}: a .png chart shows one replay; use --report")
                write_chart(first.report, path, title, strategy=first.strategy)
            else:
                settings = _settings_lines(doc, outcomes)
                write_report(path, sections_of(outcomes), title=title, settings=settings)
        except OSError as exc:  # say which output failed (a full disk names no file)
            raise ConfigError(f"--{label} {path}: {exc.strerror or exc}") from exc
        written.append((label, path))
    return written


# What an importer left out of a transcript, as it counts it in ``Transcript.extra``.
_LEFT_OUT = (
    ("entries_off_branch", "entries of other branches left out"),
    ("records_repeated", "records written twice read once"),
)


def _print_one(outcome: Outcome, settings: ReplaySettings, console: Console | None) -> None:
    """One transcript through one strategy: the header, a row per request, the totals."""
    transcript, report = outcome.transcript, outcome.report
    strategy_line = outcome.strategy
    if outcome.strategy == "llm":
        strategy_line += f" (summarizer {settings.summarizer_label()})"
    notes = "".join(f", {n} {what}" for key, what in _LEFT_OUT if (n := transcript.extra.get(key)))
    demos = len(transcript.demonstrations)
    ahead = ["a system prompt"] if transcript.system else []
    if demos:
        ahead.append(f"{demos} demonstration message" + ("s" if demos > 1 else ""))
    if ahead:
        notes += f", {' and '.join(ahead)} sent ahead of each request"
    if report.timestamps_out_of_order:
        notes += f", {_late(report.timestamps_out_of_order)}"
    header = printable(
        f"{printable(transcript.path, one_line=True)} ({transcript.format}, "
        f"{len(transcript.messages)} messages{notes})  strategy {strategy_line}"
    )
    if console is None:
        print(header)
        print_plain(report, sys.stdout)
    else:
        console.print(header, markup=False, highlight=False)
        print_rich(report, console)


def _terminal_console() -> Console | None:
    """A rich console on stdout if stdout is a terminal and rich is installed, else None."""
    if sys.stdout is None or not sys.stdout.isatty():
        return None
    try:
        from rich.console import Console
    except ImportError:
        return None
    return Console()


def main(argv: Sequence[str] | None = None, *, console: Console | None = None) -> int:
    """Run the command line on ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    The replay report goes to ``console`` (a ``rich.console.Console``) if given; otherwise to
    a rich console when stdout is a terminal and rich is installed, else to stdout as plain
    text with no escape codes. ``demo`` writes plain text to ``console.file`` or stdout.
    """
    args = _parser().parse_args(argv)
    if sys.stderr is None:  # started with it closed (``2>&-``): print() would use stdout
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - the process's
    if sys.stdout is None and console is None:  # started with it closed (``>&-``)
        print("agentctx: no standard output to write to (it is closed)", file=sys.stderr)
        return 2
    try:
        if args.command == "demo":
            from agentctx.replay.demo import run_demo

            budget = Budget(context_window=args.context_window, reserve_output=args.reserve)
            out = sys.stdout if console is None else cast("TextIO", console.file)
            return anyio.run(lambda: run_demo(budget, out))
        return _replay(args, console if console is not None else _terminal_console())
    except BrokenPipeError:
        # The reader went away (``| head``): nothing is wrong with the input. What is still
        # buffered for it goes nowhere, not into an error at exit.
        with contextlib.suppress(OSError, AttributeError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (AgentCtxError, OSError, ValueError, RecursionError, MemoryError) as exc:
        # One line whatever the error holds (a path or a parser message with a newline in
        # it, or no message at all, like MemoryError's): never a traceback.
        text = " ".join(str(exc).split()) or type(exc).__name__
        if isinstance(exc, UnicodeEncodeError):  # what the report holds, not the input
            encoding = getattr(sys.stdout, "encoding", None) or "?"
            text = (
                f"the output cannot be written in this terminal's encoding ({encoding}): "
                f"{text}; set PYTHONIOENCODING=utf-8, or write the report to a file (--report)"
            )
        print(printable(f"agentctx: {text}"), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Ctrl-C: a line, and the exit status a shell gives a command stopped by SIGINT.
        print("agentctx: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
