"""The ``recall_context`` tool: a ready definition per provider and its handler.

```python
tools = [recall_tool("anthropic")]                      # or "openai-chat", "openai-responses"
...
if call.name == RECALL_TOOL_NAME:
    text = ctx.handle_recall(call.arguments)            # pages of 8000 chars, or grep
```

Its results are exempt from every compaction pass, so what was recalled is not cleared again.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from agentctx.errors import ConfigError

if TYPE_CHECKING:
    from agentctx.recall.store import RecallStore

__all__ = ["RECALL_TOOL_NAME", "recall_arguments", "recall_page", "recall_tool"]

RECALL_TOOL_NAME = "recall_context"
_DESCRIPTION = (
    "Read content that was cleared from the conversation to save space. Placeholders show "
    'recall_context(id="ctx-...") ids. Returns up to `limit` characters from `offset`; '
    "with `pattern` (a regular expression), returns the matching lines with line numbers."
)
_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "description": "The ctx-... id from the placeholder."},
        "offset": {"type": "integer", "minimum": 0, "description": "First character."},
        "limit": {"type": "integer", "minimum": 1, "description": "Characters to return."},
        "pattern": {"type": "string", "description": "Regular expression to grep lines."},
    },
    "required": ["id"],
}


def recall_tool(
    provider: Literal["anthropic", "openai-chat", "openai-responses"],
) -> dict[str, Any]:
    """The tool definition in ``provider``'s request format."""
    if provider == "anthropic":
        return {"name": RECALL_TOOL_NAME, "description": _DESCRIPTION, "input_schema": _SCHEMA}
    if provider == "openai-chat":
        function = {"name": RECALL_TOOL_NAME, "description": _DESCRIPTION, "parameters": _SCHEMA}
        return {"type": "function", "function": function}
    if provider == "openai-responses":
        return {
            "type": "function",
            "name": RECALL_TOOL_NAME,
            "description": _DESCRIPTION,
            "parameters": _SCHEMA,
        }
    raise ConfigError(f"unknown provider {provider!r}")


def recall_page(
    store: RecallStore | None,
    session_id: str,
    id: str,
    offset: int = 0,
    limit: int = 8000,
    pattern: str | None = None,
    max_matches: int = 200,
) -> str:
    """The text the tool returns to the model: a page, grep results, or a clear miss."""
    content = store.get(session_id, id) if store is not None else None
    if content is None:
        return f'[recall_context] id "{id}" was not found in this session.'
    total = len(content)
    if pattern is not None:
        try:
            rx = re.compile(pattern)
        except re.error as exc:
            return f"[recall_context] invalid pattern {pattern!r}: {exc}"
        hits = [
            f"{n}: {line}" for n, line in enumerate(content.split("\n"), start=1) if rx.search(line)
        ]
        shown = hits[:max_matches]
        more = f"; {len(hits) - len(shown)} more not shown" if len(hits) > len(shown) else ""
        head = f"[recall_context {id}: {len(hits)} lines match {pattern!r}{more}]"
        return head + "\n" + "\n".join(shown)
    offset = max(0, offset)
    limit = max(1, limit)
    end = min(total, offset + limit)
    nxt = f"; next offset={end}" if end < total else "; end"
    return f"[recall_context {id}: chars {offset}-{end} of {total}{nxt}]\n{content[offset:end]}"


def recall_arguments(arguments: object) -> tuple[str, int, int, str | None] | str:
    """``(id, offset, limit, pattern)`` from a model's tool-call arguments, or the text to
    answer the model with when they are unusable (never an exception: models get it wrong).

    Integers may come as digit strings; unknown keys are ignored.
    """
    if not isinstance(arguments, Mapping):
        return "[recall_context] arguments must be an object with an `id`."
    rid = arguments.get("id")
    if not isinstance(rid, str) or not rid:
        return '[recall_context] `id` is required: the "ctx-..." id shown in the placeholder.'
    numbers = []
    for key, default in (("offset", 0), ("limit", 8000)):
        value = arguments.get(key, default)
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if value is None:
            value = default
        if not isinstance(value, int) or isinstance(value, bool):
            return f"[recall_context] `{key}` must be a whole number, got {value!r}."
        numbers.append(value)
    pattern = arguments.get("pattern")
    if pattern is not None and not isinstance(pattern, str):
        return f"[recall_context] `pattern` must be a regular expression string, got {pattern!r}."
    return rid, numbers[0], numbers[1], pattern or None
