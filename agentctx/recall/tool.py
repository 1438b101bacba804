"""The ``recall_context`` tool: a ready definition per provider and its handler.

```python
tools = [recall_tool("anthropic")]                      # or "openai-chat", "openai-responses"
...
if call.name == RECALL_TOOL_NAME:
    text = await ctx.handle_recall(call.arguments)      # pages of 8000 chars, or grep
```

Its results are exempt from every compaction pass, so what was recalled is not cleared again;
that is why every result is bounded: a page is at most `MAX_LIMIT` characters, and so is the
text of the lines a ``pattern`` search returns.

``pattern`` is literal text, matched case-insensitively within each line: no regular
expressions, so a model-written pattern can never backtrack catastrophically, and a search
costs time linear in the size of the content.
"""

from __future__ import annotations

import bisect
import copy
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from agentctx._check import preview
from agentctx.errors import ConfigError
from agentctx.messages import sendable_text

if TYPE_CHECKING:
    from collections.abc import Callable

    from agentctx.recall.store import RecallStore

__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "MAX_PATTERN_CHARS",
    "RECALL_TOOL_NAME",
    "recall_arguments",
    "recall_page",
    "recall_tool",
]

RECALL_TOOL_NAME = "recall_context"

DEFAULT_LIMIT = 8000
"""Characters of one page when the model names no ``limit``."""

MAX_LIMIT = 8000
"""The largest ``limit`` the model gets: larger values are capped (the header says so)."""

MAX_PATTERN_CHARS = 500
"""The longest ``pattern`` accepted."""

MAX_ID_CHARS = 100
"""Longer "ids" are not looked up (recall ids are 20 characters)."""

_LINE_CHARS = 400  # a matching line longer than this is shown around its first match
_MAX_COUNTED = 10_000  # matching lines counted before the header says "more than"
_PREVIEW_CHARS = 40  # of a bad argument, echoed back to the model
_Match: TypeAlias = tuple[int, int, str, int | None]  # line number, start offset, line, match

_DESCRIPTION = (
    "Read content that was cleared from the conversation to save space. Placeholders show "
    'recall_context(id="ctx-...") ids. Returns up to `limit` characters (at most '
    f"{MAX_LIMIT}) from `offset`; the header gives the next offset. With `pattern` (plain "
    "text, not a regular expression; case-insensitive), returns the lines containing it, "
    "with line numbers."
)
_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "description": "The ctx-... id from the placeholder."},
        "offset": {"type": "integer", "minimum": 0, "description": "First character."},
        "limit": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_LIMIT,
            "description": "Characters to return.",
        },
        "pattern": {
            "type": "string",
            "maxLength": MAX_PATTERN_CHARS,
            "description": "Literal text (case-insensitive) to find lines by.",
        },
    },
    "required": ["id"],
}


def recall_tool(
    provider: Literal["anthropic", "openai-chat", "openai-responses"],
) -> dict[str, Any]:
    """The tool definition in ``provider``'s request format (a new one each call: yours to
    adapt)."""
    schema = copy.deepcopy(_SCHEMA)
    if provider == "anthropic":
        return {"name": RECALL_TOOL_NAME, "description": _DESCRIPTION, "input_schema": schema}
    if provider == "openai-chat":
        function = {"name": RECALL_TOOL_NAME, "description": _DESCRIPTION, "parameters": schema}
        return {"type": "function", "function": function}
    if provider == "openai-responses":
        return {
            "type": "function",
            "name": RECALL_TOOL_NAME,
            "description": _DESCRIPTION,
            "parameters": schema,
        }
    raise ConfigError(f"unknown provider {provider!r}")


def recall_page(
    store: RecallStore | None,
    session_id: str,
    id: str,
    offset: int = 0,
    limit: int = DEFAULT_LIMIT,
    pattern: str | None = None,
    max_matches: int = 200,
) -> str:
    """The text the tool returns to the model: a page, matching lines, or a clear miss.

    A page is ``limit`` characters from ``offset``. With ``pattern`` (literal text, matched
    case-insensitively within each line) it is the matching lines that start at ``offset``
    or after, numbered from 1: at most ``max_matches`` of them and ``limit`` characters in
    all, a long line shown around its match; where more match, the header says the offset
    to search on from. The result never holds a lone surrogate (each becomes U+FFFD, so offsets stay
    right). Only a failing store raises (`StoreError`); ``limit`` is not capped here, the
    model's arguments are (`recall_arguments`).
    """
    problem = _id_problem(id)
    if problem is not None:
        return problem
    content = store.get(session_id, id) if store is not None else None
    if content is None:
        return f'[recall_context] id "{id}" was not found in this session.'
    limit = max(1, limit)
    if pattern:
        problem = _pattern_problem(pattern)
        if problem is not None:
            return problem
        # A store may keep the last fold (the recall writer's, per session): searching one
        # entry again (a model narrowing its pattern) does not fold up to 16 M characters again.
        fold = getattr(store, "casefold", None) or str.casefold
        found = _grep(id, content, pattern, limit, max(1, max_matches), fold, max(0, offset))
        return sendable_text(found)
    total = len(content)
    offset = max(0, offset)
    if offset >= total and offset > 0:
        # A bound, not the model's number, past _PAST_ANY_TEXT: not echoed as if it were.
        said = f"offset {offset}" if offset < _PAST_ANY_TEXT else "the offset"
        return f"[recall_context {id}: {said} is past the end ({total} chars)]"
    end = min(total, offset + limit)
    nxt = f"; next offset={end}" if end < total else "; end"
    return sendable_text(
        f"[recall_context {id}: chars {offset}-{end} of {total}{nxt}]\n"
    ) + sendable_text(content[offset:end])


def recall_arguments(
    arguments: object, *, most: int = MAX_LIMIT
) -> tuple[str, int, int, str | None] | str:
    """``(id, offset, limit, pattern)`` from a model's tool-call arguments, or the text to
    answer the model with when they are unusable (never an exception: models get it wrong).

    Integers may come as plain ASCII digit strings or whole floats; ``limit`` above ``most``
    (`MAX_LIMIT`: what one tool result should hold) is capped to it; unknown keys are
    ignored. A bad value is echoed back only as a short prefix.
    """
    if not isinstance(arguments, Mapping):
        return "[recall_context] arguments must be an object with an `id`."
    rid = arguments.get("id")
    if not isinstance(rid, str) or not rid:
        return '[recall_context] `id` is required: the "ctx-..." id shown in the placeholder.'
    problem = _id_problem(rid)
    if problem is not None:
        return problem
    offset = _whole(arguments.get("offset"), 0)
    if offset is None or offset < 0:
        return (
            "[recall_context] `offset` must be a whole number >= 0, "
            f"got {preview(arguments.get('offset'))}."
        )
    limit = _whole(arguments.get("limit"), DEFAULT_LIMIT)
    if limit is None or limit < 1:
        bounds = f"from 1 to {most}" if most < _PAST_ANY_TEXT else ">= 1"
        return (
            f"[recall_context] `limit` must be a whole number {bounds}, "
            f"got {preview(arguments.get('limit'))}."
        )
    pattern = arguments.get("pattern")
    if pattern is not None and not isinstance(pattern, str):
        return f"[recall_context] `pattern` must be a text to search for, got {preview(pattern)}."
    if pattern:
        problem = _pattern_problem(pattern)
        if problem is not None:
            return problem
    return rid, offset, min(limit, most), pattern or None


# ---------------------------------------------------------------------------------------


# Bounds a whole number at what no text reaches: one of 5000 digits (an int from a parser
# other than json's) is answered as past the end, not formatted, which would raise.
_PAST_ANY_TEXT = 10**18


def _whole(value: object, default: int) -> int | None:
    """``value`` as a whole number (``default`` when absent), or ``None`` when it is not one."""
    if value is None:
        return default
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return max(-_PAST_ANY_TEXT, min(value, _PAST_ANY_TEXT))
    if isinstance(value, float):
        return _whole(int(value), default) if value.is_integer() else None
    if isinstance(value, str):
        digits = value.strip()
        # Only plain ASCII digits: int() also takes "²"-like digits, "1_000" and "+5", and a
        # 5000-digit string costs a ValueError (the int conversion limit) or worse.
        if digits.isascii() and digits.isdigit() and len(digits) <= _MOST_DIGITS:
            significant = digits.lstrip("0")
            # Longer, it is past any text, as the int would be (so capped, not refused),
            # without converting it.
            return int(significant or "0") if len(significant) <= 18 else _PAST_ANY_TEXT
    return None


# What Python's int() reads from a string by default: past it, no number was meant.
_MOST_DIGITS = 4300


def _id_problem(rid: str) -> str | None:
    if len(rid) > MAX_ID_CHARS or sendable_text(rid) is not rid:  # a lone surrogate
        return (
            f"[recall_context] id {preview(rid)} is not a recall id: use the "
            '"ctx-..." id shown in the placeholder.'
        )
    return None


def _pattern_problem(pattern: str) -> str | None:
    if len(pattern) > MAX_PATTERN_CHARS:
        return (
            f"[recall_context] `pattern` is {len(pattern)} characters; at most "
            f"{MAX_PATTERN_CHARS} are searched for. Use a shorter, distinctive part of a line."
        )
    if "\n" in pattern or "\r" in pattern:
        return "[recall_context] `pattern` is matched within one line: it cannot hold a line break."
    if sendable_text(pattern) is not pattern:
        return (
            f"[recall_context] `pattern` {preview(pattern)} holds invalid characters "
            "(unpaired UTF-16 surrogates)."
        )
    return None


def _grep(
    rid: str,
    content: str,
    pattern: str,
    limit: int,
    max_matches: int,
    fold: Callable[[str], str],
    offset: int,
) -> str:
    needle = pattern.casefold()
    folded = fold(content)
    # casefold keeps the length of almost every text; when it does not (ß, ligatures), the
    # match positions of the folded text are not positions in ``content``: go line by line.
    if len(folded) == len(content):
        lines = _matches(content, folded, needle, offset)
    else:
        lines = _matches_by_line(content, needle, offset)
    shown: list[str] = []
    used = 0
    count = 0
    hidden_at: int | None = None
    for number, start, line, at in lines:
        count += 1
        if hidden_at is None:
            entry = f"{number}: {_excerpt(line, start, at)}"
            if len(shown) < max_matches and used + len(entry) + 1 <= limit:
                shown.append(entry)
                used += len(entry) + 1
            elif not shown:  # one long entry: cut it rather than show nothing
                shown.append(entry[: max(1, limit - 1)])
                used = limit
            else:
                hidden_at = start
        if count >= _MAX_COUNTED:
            break
    quoted = repr(pattern[:_PREVIEW_CHARS]) + ("..." if len(pattern) > _PREVIEW_CHARS else "")
    capped = "+" if count >= _MAX_COUNTED else ""
    more = ""
    if hidden_at is not None:
        more = (
            f"; {count - len(shown)}{capped} more not shown: use a more specific pattern, "
            f"or search on from offset={hidden_at}"
        )
    where = f" from offset {offset}" if offset else ""
    head = (
        f"[recall_context {rid}: {count}{capped} lines{where} match {quoted} (literal, any "
        f"case){more}]"
    )
    return head + "\n" + "\n".join(shown)


def _matches(content: str, folded: str, needle: str, offset: int) -> Iterator[_Match]:
    """``(line number, line start, line, match position in line)`` per matching line that
    starts at ``offset`` or after, found by ``str.find`` on the folded text: no Python work
    per non-matching line."""
    pos = offset
    if offset and content[offset - 1 : offset] != "\n":  # inside a line: from the next one
        pos = content.find("\n", offset) + 1 or len(content)
    number = 1
    counted_to = 0
    while True:
        i = folded.find(needle, pos)
        if i < 0:
            return
        start = content.rfind("\n", 0, i) + 1
        end = content.find("\n", i)
        end = len(content) if end < 0 else end
        number += content.count("\n", counted_to, start)
        counted_to = start
        yield number, start, content[start:end], i - start
        pos = end + 1


def _matches_by_line(content: str, needle: str, offset: int) -> Iterator[_Match]:
    start = 0
    for number, line in enumerate(content.split("\n"), start=1):
        i = line.casefold().find(needle) if start >= offset else -1
        if i >= 0:
            # Only a long line is shown around its match.
            yield number, start, line, _unfolded(line, i) if len(line) > _LINE_CHARS else None
        start += len(line) + 1


def _unfolded(line: str, i: int) -> int:
    """The position in ``line`` of the character whose casefold holds position ``i`` of
    ``line.casefold()``."""

    def folded_length(k: int) -> int:
        return len(line[:k].casefold())

    return bisect.bisect_right(range(len(line) + 1), i, key=folded_length) - 1


def _excerpt(line: str, start: int, at: int | None) -> str:
    """``line``, or the part of it around the match when it is long, with where it is."""
    if len(line) <= _LINE_CHARS:
        return line
    begin = max(0, (at or 0) - _LINE_CHARS // 2)
    piece = line[begin : begin + _LINE_CHARS]
    before = "..." if begin else ""
    after = "..." if begin + _LINE_CHARS < len(line) else ""
    where = f" [a line of {len(line)} chars; this part starts at offset={start + begin}]"
    return before + piece + after + where
