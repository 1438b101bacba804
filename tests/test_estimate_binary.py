"""The estimator on tool output no agent means to read but gets: binary files cat'ed as
Latin-1, control characters, private-use (icon font) characters; and on ordinary text with
the same characters, which must not move."""

from __future__ import annotations

import base64
import itertools
import json
import random

import pytest

from agentctx.messages import (
    AssistantMessage,
    Message,
    TextBlock,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from agentctx.tokens import Estimator
from agentctx.tokens.exact import ExactCounter

o200k = ExactCounter("o200k_base")
rng = random.Random(0)

ADVERSARIAL = {
    "bytes as latin-1": rng.randbytes(40_000).decode("latin-1"),
    "ascii controls": "".join(chr(rng.choice([*range(9), *range(14, 32)])) for _ in range(4_000)),
    "c1 controls": "".join(chr(rng.randrange(0x80, 0xA0)) for _ in range(4_000)),
    "latin-1 signs and letters": "".join(chr(rng.randrange(0xA0, 0x100)) for _ in range(4_000)),
    "private use": "".join(chr(rng.randrange(0xE000, 0xF900)) for _ in range(4_000)),
    "supplementary private use": "".join(
        chr(rng.randrange(0xF0000, 0xFFFFE)) for _ in range(2_000)
    ),
    "ansi colours": "".join(
        f"\x1b[32mPASSED\x1b[0m tests/test_m{i}.py::test_{i} \x1b[1m[{i}%]\x1b[0m\n"
        for i in range(200)
    ),
}


@pytest.mark.parametrize("kind", ADVERSARIAL)
def test_binary_output_is_estimated_near_o200k(kind: str) -> None:
    """Found by a hostile run (DF, finding 2): 40 KB of bytes decoded as Latin-1 (a `cat` of
    a binary file) was estimated at 0.55 of its o200k count, control characters at 0.33 and
    private-use characters at 0.34, so a request went out over the window with no event. Every
    2-byte character was priced as a letter merged into a word (0.39 tokens), where C1
    controls cost two tokens, Latin-1 signs and lone Latin-1 letters one; an ASCII control in
    a punctuation run was priced as punctuation that merges; a private-use character as CJK
    (0.75), where it costs a token a UTF-8 byte."""
    text = ADVERSARIAL[kind]
    ratio = Estimator().count(text) / o200k.count(text)
    assert 0.85 <= ratio <= 1.15, ratio


ORDINARY = {
    "french": "Le système économique français a été créé après la guerre. Les élèves "
    "étudient à l'école où ils apprennent l'histoire et la géographie. ",
    "german": "Die Übersetzung der Bücher für die Schüler wurde überprüft. Größere "
    "Änderungen sind nötig, weil die Qualität schlecht ist. ",
    "spanish": "El niño comió una manzana por la mañana. La compañía está en España. ",
    "russian": "Это тестовый текст на русском языке для проверки оценки токенов. ",
    "cjk": "这是一个测试文本，用于检查中文字符的估计。日本語のテキストもここにあります。",
    "code": 'def parse(path: str) -> dict:\n    """Read a config."""\n    return {}\n',
    "json": '{"name":"agentctx","version":"1.0","tags":["a","b"],"ok":true}',
}
# Estimator().count of each ORDINARY text repeated 20 times, before the fix: unchanged.
ORDINARY_BEFORE = {
    "french": 797,
    "german": 698,
    "spanish": 440,
    "russian": 441,
    "cjk": 568,
    "code": 400,
    "json": 446,
}


@pytest.mark.parametrize("kind", ORDINARY)
def test_ordinary_text_is_estimated_as_before(kind: str) -> None:
    """The same fix leaves accented letters inside words, Cyrillic, CJK, code and JSON
    where they were."""
    assert Estimator().count(ORDINARY[kind] * 20) == ORDINARY_BEFORE[kind]


async def test_a_binary_tool_result_does_not_go_out_over_the_window_unsaid() -> None:
    """Found by a hostile run (DF, finding 2): one tool result of 40 KB of bytes decoded as
    Latin-1 was counted 23,161 tokens, under a limit of 30,000, and sent as it was: 42,257 by
    o200k, with no event. Now the view sent is within the limit by o200k, or an event says
    it is not."""
    from agentctx import Budget, ContextManager
    from agentctx.events import BudgetExceeded

    def exact(view: list[Message]) -> int:
        n = 0
        for m in view:
            n += 4
            for b in getattr(m, "content", ()):
                if isinstance(b, TextBlock):
                    n += o200k.count(b.text)
                elif isinstance(b, ToolCall):
                    n += o200k.count(json.dumps(dict(b.arguments), separators=(",", ":")))
        return n

    blob = ADVERSARIAL["bytes as latin-1"]
    history: list[Message] = [
        UserMessage.of("What is in firmware.bin?"),
        AssistantMessage((ToolCall("c1", "bash", {"command": "cat firmware.bin"}),)),
        ToolResultMessage.of("c1", blob, tool_name="bash"),
    ]
    budget = Budget(context_window=46_000, reserve_output=16_000)
    assert budget.limit == 30_000
    events: list[object] = []
    async with ContextManager(budget, on_over_budget="send") as ctx:
        ctx.subscribe(events.append)
        view = await ctx.prepare(history)
    said = any(isinstance(e, BudgetExceeded) for e in events)
    assert exact(view) <= budget.limit or said, (exact(view), ctx.prompt_tokens)


# -- dense content the sampling windows do not land on ----------------------------------------

PROSE = "the result of running the test suite shows that every module was imported and checked "


def _dense(kind: str, n: int, rng: random.Random) -> str:
    if kind == "base64":
        return base64.b64encode(rng.randbytes(n)).decode()[:n]
    if kind == "hex":
        return rng.randbytes(n).hex()[:n]
    if kind == "latin-1":
        return rng.randbytes(n).decode("latin-1")
    if kind == "mixed-case words":
        letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
        words = ("".join(rng.choices(letters, k=rng.randint(3, 7))) for _ in range(n))
        return " ".join(words)[:n]
    if kind == "cjk":
        return "".join(chr(rng.randrange(0x4E00, 0x9FA0)) for _ in range(n))
    if kind == "minified json":
        return json.dumps({f"k{i}": rng.randrange(10**9) for i in range(n)}, separators=(",", ":"))[
            :n
        ]
    assert kind == "table"
    rows = "".join(
        "|" + "|".join(f"{rng.randrange(100_000):>5}" for _ in range(8)) + "|\n"
        for _ in range(n // 49 + 1)
    )
    return rows[:n]


def _between_windows(n: int, kind: str, fill: float, window: int = 512, windows: int = 16) -> str:
    """Prose of ``n`` characters with ``kind`` filling ``fill`` of every gap between the 16
    windows a text of that length would be sampled through (the estimator's own layout)."""
    rng = random.Random(n)
    chars = list((PROSE * (n // len(PROSE) + 1))[:n])
    step = (n - window) / (windows - 1)
    starts = [int(i * step) for i in range(windows)]
    for a, b in itertools.pairwise(starts):
        gap = b - (a + window)
        dense = _dense(kind, int(gap * fill), rng)
        chars[a + window : a + window + len(dense)] = dense
    return "".join(chars)


@pytest.mark.parametrize(
    "kind", ["base64", "hex", "latin-1", "cjk", "minified json", "table", "mixed-case words"]
)
@pytest.mark.parametrize("n", [12_000, 16_384, 24_000, 60_000])
@pytest.mark.parametrize("fill", [1.0, 0.3])
def test_dense_content_between_the_windows_is_scanned(kind: str, n: int, fill: float) -> None:
    """Found by a hostile run (DX, finding 1): sampled from 8 KB in 16 windows of 512
    characters, a 9-16 KB result with base64, hex, CJK, binary, a table or minified JSON only
    between the windows was estimated 12-85 % under its o200k count, and a view went out over
    the budget with no event (16 KB of 1 KB windows missed it at 27 % on 32 KB). Texts up to
    16 KB are scanned whole; longer ones whole when the windows are not made like the text
    (random mixed-case words between prose words are caught by their capitals)."""
    from agentctx.tokens import estimate

    text = _between_windows(n, kind, fill)
    units, other = estimate._scan(text)
    assert Estimator().count(text) == max(1, round(units + other))


async def test_dense_content_between_the_windows_does_not_go_out_over_the_budget_unsaid() -> None:
    """DX, finding 1, as the session met it: a prompt near the limit, then a 16 KB result with
    base64 between the windows. Sampled, it went out at 41,435 tokens over a 40,000 limit with
    no event; now the view is within the limit by o200k, or an event says it is not."""
    from agentctx import Budget, ContextManager, Usage
    from agentctx.events import BudgetExceeded
    from agentctx.tokens import MessageCounter

    exact = MessageCounter(o200k, lazy=False)
    budget = Budget(context_window=56_000, reserve_output=16_000)
    assert budget.limit == 40_000
    history: list[Message] = [UserMessage.of("Read the files and explain them.")]
    events: list[object] = []
    async with ContextManager(budget, on_over_budget="send") as ctx:
        ctx.subscribe(events.append)
        view: list[Message] = []
        for i in range(40):
            history += [
                AssistantMessage((ToolCall(f"c{i}", "read", {"path": f"f{i}.txt"}),)),
                ToolResultMessage.of(f"c{i}", (PROSE * 60)[: 4_000 + 37 * i], tool_name="read"),
            ]
            view = await ctx.prepare(history)
            ctx.observe(Usage(input_tokens=exact.count_many(view) + 1_500))
            if exact.count_many(view) + 1_500 > budget.limit - 6_000:
                break
        history += [
            AssistantMessage((ToolCall("big", "read", {"path": "blob.txt"}),)),
            ToolResultMessage.of("big", _between_windows(16_000, "base64", 1.0), tool_name="read"),
        ]
        events.clear()
        view = await ctx.prepare(history)
    said = any(isinstance(e, BudgetExceeded) for e in events)
    assert exact.count_many(view) + 1_500 <= budget.limit or said
