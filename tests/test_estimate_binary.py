"""The estimator on tool output no agent means to read but gets: binary files cat'ed as
Latin-1, control characters, private-use (icon font) characters; and on ordinary text with
the same characters, which must not move."""

from __future__ import annotations

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
