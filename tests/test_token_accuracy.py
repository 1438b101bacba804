"""Token estimates against exact o200k on the real transcripts of tests/corpus, per source
format and content class, and on hostile input.

The bounds are the targets (benchmarks/token_accuracy.py prints the figures, calibrated ones
too): the estimator without a tokenizer is within 5 % (median |error|) on every format/class
cell of 20 texts or more (4.2 % on the worst today, OpenHands tool arguments and pi JSON), and
`default_estimator` (exact for short texts with the tokenizer extra) within 5 % as well.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections import defaultdict
from typing import Any

import pytest

from agentctx.importers import claude_code, load_transcript
from agentctx.messages import (
    AssistantMessage,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from agentctx.tokens import (
    EXACT_BELOW,
    ContentClass,
    Estimator,
    MessageCounter,
    TokenCounter,
    classify,
    default_estimator,
)

from .corpus import CORPUS

FORMATS = ("pi", "claude-code", "swe-agent", "openhands")
MIN_TEXTS = 20  # cells with fewer texts are too noisy to hold to a bound
CELL_BOUND = 0.05  # median |error| per format and class, estimator alone
FORMAT_BOUND = 0.05  # median |error| over all texts of a format, estimator alone
BIAS_BOUND = 0.04  # |sum of estimates / sum of exact - 1| per format, estimator alone
EXACT_CELL_BOUND = 0.05  # median |error| per format and class, default_estimator()


def exact_counter() -> TokenCounter:
    # The [dev] extra installs the tokenizer extra: a missing tokenizer is a failure here.
    from agentctx.tokens.exact import ExactCounter

    return ExactCounter("o200k_base")


def _sessions(fmt: str) -> list[list[Message]]:
    out = []
    for path in sorted(p for p in (CORPUS / fmt).iterdir() if p.suffix != ".md"):
        try:
            transcript = load_transcript(path)
        except Exception:  # a lone message, not a transcript
            continue
        if transcript.format != "claude-code":
            out.append(list(transcript.messages))
            continue
        for thread in ("main", "sidechains"):
            try:
                out.append(list(claude_code.load(path, thread=thread).messages))
            except Exception:  # no such thread in this file
                continue
    return out


def _texts(messages: list[Message]) -> list[tuple[str, ContentClass | None]]:
    out: list[tuple[str, ContentClass | None]] = []
    for m in messages:
        if not isinstance(m, (UserMessage, AssistantMessage, ToolResultMessage)):
            continue
        for b in m.content:
            if isinstance(b, TextBlock):
                out.append((b.text, None))
            elif isinstance(b, ThinkingBlock):
                out.append((b.thinking, None))
            elif isinstance(b, ToolCall):
                args: Any = dict(b.arguments)
                compact = json.dumps(args, separators=(",", ":"), ensure_ascii=False)
                out.append((compact, ContentClass.JSON))
    return out


Row = tuple[str, ContentClass, str, int]  # format, class, text, exact tokens


@pytest.fixture(scope="module")
def corpus_rows() -> list[Row]:
    exact = exact_counter()
    rows = []
    for fmt in FORMATS:
        for messages in _sessions(fmt):
            for text, kind in _texts(messages):
                if text.strip():
                    rows.append((fmt, kind or classify(text), text, exact.count(text)))
    assert {r[0] for r in rows} == set(FORMATS)
    return rows


def _errors(rows: list[Row], counter: Estimator) -> dict[tuple[str, str], list[float]]:
    cells: dict[tuple[str, str], list[float]] = defaultdict(list)
    for fmt, kind, text, truth in rows:
        error = (counter.count(text, kind) - truth) / truth
        cells[(fmt, kind.value)].append(error)
        cells[(fmt, "all")].append(error)
    return cells


def _median_abs(errors: list[float]) -> float:
    return statistics.median(abs(e) for e in errors)


def test_the_estimator_is_close_to_o200k_per_format_and_class(corpus_rows: list[Row]) -> None:
    cells = _errors(corpus_rows, Estimator())
    report = {k: round(_median_abs(v), 3) for k, v in sorted(cells.items())}
    for (fmt, kind), errors in cells.items():
        if kind == "all":
            assert _median_abs(errors) <= FORMAT_BOUND, (fmt, report)
        elif len(errors) >= MIN_TEXTS:
            assert _median_abs(errors) <= CELL_BOUND, (fmt, kind, report)


def test_the_estimator_has_no_bias_over_a_format(corpus_rows: list[Row]) -> None:
    """What calibration cannot fix within a session: the sum of a session's estimates."""
    estimator = Estimator()
    for fmt in FORMATS:
        rows = [r for r in corpus_rows if r[0] == fmt]
        estimated = sum(estimator.count(text, kind) for _, kind, text, _ in rows)
        exact = sum(r[3] for r in rows)
        assert abs(estimated / exact - 1) <= BIAS_BOUND, (fmt, estimated, exact)


def test_the_default_counter_is_exact_where_that_is_cheap(corpus_rows: list[Row]) -> None:
    counter = default_estimator()
    assert counter.exact_below == EXACT_BELOW  # the dev extra installs tiktoken
    cells = _errors(corpus_rows, counter)
    report = {k: round(_median_abs(v), 3) for k, v in sorted(cells.items())}
    for (fmt, kind), errors in cells.items():
        if len(errors) >= MIN_TEXTS:
            assert _median_abs(errors) <= EXACT_CELL_BOUND, (fmt, kind, report)
    short = [r for r in corpus_rows if len(r[2]) <= EXACT_BELOW]
    assert short and all(counter.count(text, kind) == n for _, kind, text, n in short)


def test_exact_counts_go_to_the_class_slot_and_survive_scaling() -> None:
    counter = Estimator(exact_below=100)
    text = '{"command":"ls -la /workspace/ponylang__ponyc__0.1"}'
    exact = exact_counter().count(text)
    features = counter.features(text, ContentClass.JSON)
    assert features[counter.slots.index("json")] == exact
    assert sum(features) == exact
    doubled = counter.scaled([2.0] * len(counter.slots))
    assert doubled.exact_below == 100
    assert doubled.count(text, ContentClass.JSON) == 2 * exact
    long = "word " * 100
    assert counter.count(long) == Estimator().count(long)  # over the threshold: estimated


def test_the_default_counter_loads_no_tokenizer_until_it_counts() -> None:
    code = (
        "import sys; from agentctx.tokens import MessageCounter; c = MessageCounter(); "
        "a = 'tiktoken' in sys.modules; "
        "from agentctx.messages import UserMessage; c.count_full(UserMessage.of('hi')); "
        "print(a, 'tiktoken' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]
    assert MessageCounter().counter == default_estimator()


# -- hostile input ----------------------------------------------------------------------------

HOSTILE = {
    "lone surrogates": "\udc80\udcff\ud800 tail \udfff" * 50,
    "undecodable bytes": bytes(range(256)).decode("utf-8", "surrogateescape") * 20,
    "NUL bytes": "\x00" * 5000,
    "control characters": "".join(map(chr, range(32))) * 100,
    "only spaces": " " * 10_000,
    "only newlines": "\n" * 10_000,
    "only tabs": "\t" * 3000,
    "one long word": "a" * 100_000,
    "one long number": "7" * 50_000,
    "punctuation": "!@#$%^&*()_+-=[]{}|;':\",./<>?`~" * 500,
    "backslashes": "\\" * 4000 + "\\n\\t\\r" * 1000,
    "apostrophes": "'" * 3000 + "don't it's we'll '" * 200,
    "random base62": "toolu_01NG5xcSvVWynFdbWxaW2SPc" * 300,
    "emoji": "🚀🎉👍🏽‍🔥" * 500,
    "CJK": "上下文窗口管理让长时间运行的智能体保持在限制之内" * 100,
    "combining marks": "e\u0301a\u0308o\u0302" * 1000,
    "right to left": "שלום עולם مرحبا بالعالم " * 200,
    "box drawing": "│   ├── src\n└──────────────┘\n" * 300,
    "markers of the estimator": "\x80\x81\x83\xf8\xf9\xfa" * 1000,
    "listed path segments": "/src" * 20_000,
    "distinct path segments": "".join(
        "/" + "".join(chr(97 + i // 26**k % 26) for k in range(4)) for i in range(20_000)
    ),
    "path segments and surrogates": "/caf\udc80/src/\ud83dx/Users" * 2000,
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_input_gives_sane_counts(name: str) -> None:
    text = HOSTILE[name]
    estimator = Estimator()
    count = estimator.count(text)
    assert count == estimator.count(text)  # deterministic
    assert 1 <= count <= 2 * len(text) + 10
    features = estimator.features(text)
    assert all(f >= 0 for f in features) and sum(features) > 0
    for piece in (text[:1], text[:7], text[-5:]):
        assert estimator.count(piece) >= 1
    exact = exact_counter().count(text)
    assert exact / 4 <= count <= 4 * exact, (count, exact)


def test_empty_and_blank_texts() -> None:
    estimator = Estimator()
    assert estimator.count("") == 0
    assert estimator.features("") == (0.0,) * len(estimator.slots)
    assert default_estimator().count("") == 0
    for text in (" ", "\n", "\t", "\r\n", "\x0b", "\u3000"):
        assert estimator.count(text) >= 1


def test_huge_texts_are_sampled_and_scale_with_length() -> None:
    block = HOSTILE["box drawing"] + json.dumps({"path": "src/app.py", "n": list(range(50))})
    huge = block * (10_000_000 // len(block) + 1)
    estimator = Estimator()
    count = estimator.count(huge)
    assert count == pytest.approx(len(huge) / len(block) * estimator.count(block), rel=0.1)
    assert estimator.count(huge + huge) == pytest.approx(2 * count, rel=0.02)


def test_exact_below_rejects_negative() -> None:
    from agentctx.errors import ConfigError

    with pytest.raises(ConfigError):
        Estimator(exact_below=-1)


def test_the_estimators_memos_stay_bounded() -> None:
    """Prices of shapes and of path segments are memoized per process; text after text of
    segments never seen fills them only to their bound, and counts stay what they were."""
    from agentctx.tokens import estimate

    letters = "abcdefghijklmnopqrstuvwxyz"

    def word(i: int) -> str:
        return "".join(letters[i // 26**k % 26] for k in range(5))

    texts = [
        "".join(f"/{word(i)}" for i in range(start, start + 10_000))
        for start in range(0, estimate._MEMO_MAX + 20_000, 10_000)
    ]
    estimator = Estimator()
    first = [estimator.count(t) for t in texts]
    assert len(estimate._SEGMENT_COSTS) <= estimate._MEMO_MAX
    assert len(estimate._PIECES) <= estimate._MEMO_MAX
    assert [estimator.count(t) for t in texts] == first
