"""`OfflineSummarizer`: an extractive `Summarizer` that needs no model and no network.

```python
from agentctx import Chain, DeterministicCompaction, LlmCompaction
from agentctx.replay.offline_summarizer import OfflineSummarizer

strategy = Chain([LlmCompaction(OfflineSummarizer(delay=0.5)), DeterministicCompaction()])
```

It builds a briefing with every required section (`agentctx.summarizer.REQUIRED_SECTIONS`)
from the request's transcript text alone: the goal is the first lines of the earliest user
message in the span (or the previous briefing's goal), files touched are the paths found in
tool calls and text, constraints, decisions and open items are the lines that look like one
(or "None recorded."). An update request keeps what the previous briefing listed.

It answers after ``delay`` seconds of ``sleep`` (``anyio.sleep`` by default; a replay passes
its own clock's sleep so the delay is the session's time, not the wall clock's). Usage is a
token per four characters in and out; the model is ``offline-extractive``, which has no
price, so its cost is unknown (``None``), never 0. `agentctx replay` and `agentctx demo` use
it; it is a stand-in that shows the mechanics, not a replacement for a model's briefing.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import TYPE_CHECKING

import anyio

from agentctx.messages import Usage
from agentctx.summarizer import REQUIRED_SECTIONS, SummaryRequest, SummaryResult

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable

__all__ = ["OFFLINE_MODEL", "OfflineSummarizer", "extract_briefing"]

OFFLINE_MODEL = "offline-extractive"
"""The model name `OfflineSummarizer` reports."""

_NONE = "None recorded."
_MAX_ITEMS = 8
_MAX_FILES = 40
_LINE_CHARS = 200

_PATH = re.compile(r"(?<![\w./@+-])(?:~|\.{1,2})?/?(?:[\w.@+-]+/)+[\w.@+-]+\.[A-Za-z0-9]{1,6}\b")
_BARE_FILE = re.compile(
    r"(?<![\w./-])[\w-]+\.(?:py|ex|exs|js|ts|tsx|rs|go|md|toml|json|ya?ml|rb|java|c|h|cpp|sh)\b"
)
_CONSTRAINT = re.compile(
    r"\b(?:must|never|do not|don't|should not|shouldn't|cannot|can't|only|without|"
    r"required?|requirement|avoid|at most|at least|no more than)\b",
    re.IGNORECASE,
)
_DECISION = re.compile(
    r"\b(?:i'll|i will|let me|let's|decided|decide|going to|instead|will use|chose|choose|"
    r"plan is|approach|switch(?:ed)? to|use\b)",
    re.IGNORECASE,
)
_OPEN = re.compile(
    r"\b(?:todo|fixme|next|remaining|still|not yet|unresolved|open question|need to|"
    r"needs to|failed|fails|failing|error)\b",
    re.IGNORECASE,
)
_SPEAKER = re.compile(r"^(User|Assistant|Summary): ?(.*)$")
_SECTION = re.compile(r"^ {0,3}#{1,6}[ \t]+(.+)$")  # as `summarizer._HEADING` reads one


def _clip(line: str, limit: int = _LINE_CHARS) -> str:
    line = " ".join(line.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _unique(items: Iterable[str], limit: int) -> list[str]:
    seen: dict[str, None] = {}
    for item in items:
        if item and item not in seen:
            seen[item] = None
            if len(seen) >= limit:
                break
    return list(seen)


def _paths(found: Iterable[str]) -> list[str]:
    """Paths in order of appearance, without a bare name that a full path already names."""
    paths = _unique((p.rstrip(".,:;") for p in found), 10 * _MAX_FILES)
    full = [p for p in paths if "/" in p]
    return [p for p in paths if "/" in p or not any(f.endswith("/" + p) for f in full)]


def _previous_sections(briefing: str | None) -> dict[str, list[str]]:
    """The bullet items of each section of a previous briefing (``"- "`` lines)."""
    sections: dict[str, list[str]] = {}
    if not briefing:
        return sections
    current: list[str] | None = None
    for line in briefing.splitlines():
        heading = _SECTION.match(line)
        if heading:
            current = sections.setdefault(heading.group(1).rstrip(" \t#").strip().lower(), [])
        elif current is not None and line.startswith("- ") and line[2:].strip() != _NONE:
            current.append(line[2:].strip())
    return sections


def extract_briefing(transcript: str, previous_briefing: str | None = None) -> str:
    """A briefing with every section of `REQUIRED_SECTIONS`, extracted from ``transcript``
    (the plain text `agentctx.summarizer.serialize_transcript` makes) and merged with the
    items of ``previous_briefing``."""
    user: list[str] = []
    said: list[str] = []  # user and assistant prose, one line each
    calls: list[str] = []
    errors: list[str] = []
    paths: list[str] = []
    speaker = ""
    for raw in transcript.splitlines():
        line = raw.strip()
        if not line:
            continue
        paths += _PATH.findall(line) + _BARE_FILE.findall(line)
        m = _SPEAKER.match(line)
        if m:
            speaker, line = m.group(1), m.group(2).strip()
        elif line.startswith("[tool call]"):
            speaker = "call"
            calls.append(line.removeprefix("[tool call]").strip().split("(", 1)[0])
            continue
        elif line.startswith("[tool error"):
            speaker = "error"
            errors.append(_clip(line, 160))
            continue
        elif line.startswith("[tool result") or line.startswith("[..."):
            speaker = "result"
            continue
        if speaker == "User" and line:
            user.append(line)
        if speaker in ("User", "Assistant") and line and not line.startswith("["):
            said.append(line)

    previous = _previous_sections(previous_briefing)

    def merged(name: str, fresh: Iterable[str], limit: int = _MAX_ITEMS) -> list[str]:
        return _unique([*previous.get(name, []), *fresh], limit)

    goal = [_clip(x) for x in user[:3]] or previous.get("goal", [])[:3]
    if not goal:
        goal = ["Continue the task stated in the first user message, kept verbatim above."]
    last = next((x for x in reversed(said) if not x.startswith("User")), None)
    if last is not None:
        goal = [*goal[:3], f"Where it stands: {_clip(last)}"]
    tools = Counter(calls)
    tool_line = ", ".join(f"{n} x{c}" for n, c in sorted(tools.items()))
    sections = {
        "Goal": goal,
        "Constraints": merged("constraints", (_clip(x) for x in said if _CONSTRAINT.search(x))),
        "Decisions": merged(
            "decisions",
            (_clip(x) for x in said if _DECISION.search(x) and not _CONSTRAINT.search(x)),
        ),
        "Files touched": merged(
            "files touched",
            [*_paths(paths), *([f"tool calls: {tool_line}"] if calls else [])],
            _MAX_FILES,
        ),
        "Open items": merged(
            "open items",
            [
                *(_clip(x) for x in said[-20:] if _OPEN.search(x)),
                *errors[-3:],
            ],
        ),
    }
    out: list[str] = []
    for title in REQUIRED_SECTIONS:
        items = sections.get(title) or [_NONE]
        out.append(f"## {title}")
        out += [f"- {item}" for item in items]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


class OfflineSummarizer:
    """An extractive `Summarizer` (see the module docs): no model, no network.

    Args:
        delay: seconds before it answers, in the time of ``sleep``.
        sleep: the async sleep used for the delay (default ``anyio.sleep``).
    """

    model = OFFLINE_MODEL

    def __init__(
        self, delay: float = 0.0, *, sleep: Callable[[float], Awaitable[None]] | None = None
    ) -> None:
        self.delay = delay
        self._sleep = sleep or anyio.sleep
        self.requests: list[SummaryRequest] = []

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        """Answer ``request`` with an extractive briefing after ``delay``."""
        self.requests.append(request)
        await self._sleep(self.delay)
        text = extract_briefing(request.transcript, request.previous_briefing)
        usage = Usage(
            input_tokens=(len(request.system) + len(request.prompt)) // 4,
            output_tokens=len(text) // 4,
        )
        return SummaryResult(text=text, stop_reason="stop", usage=usage, model=OFFLINE_MODEL)
