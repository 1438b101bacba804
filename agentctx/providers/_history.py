"""The history of one wrapped client's requests in neutral form, converted once.

A loop sends its whole history on every call; converting it whole each time costs more than
compacting it (about 8 ms a call at a thousand messages). `ConvertedHistory` keeps what the
last request converted to and converts only what the next one added, or what follows the
first item it changed.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from agentctx._snapshots import UNCOPIED, snapshot, unchanged_prefix
from agentctx.adapters import from_anthropic, from_openai_chat, from_openai_responses
from agentctx.adapters.openai_responses import is_assistant_side, known_calls
from agentctx.messages import AssistantMessage, Message

__all__ = ["ConvertedHistory", "plain", "sdk_dict"]


# How deep in a history item SDK objects are looked for: they sit a few levels down at most (a
# tool result's blocks), and a caller's deeply nested data is left to the adapter as it is.
_MAX_DEPTH = 64


def plain(item: Any) -> Any:
    """A history item with the SDK objects in it, wherever they sit (``resp.content`` appended
    as it came, a ``ChatCompletionMessage``, Responses output items, ``msg.tool_calls`` in a
    dict, SDK blocks in a tool result), as the dicts the SDK would send (`sdk_dict`); the item
    itself, and each part of it, when they hold none."""
    return _plain(item, _MAX_DEPTH, {})


# ``done``: each container walked so far, by id, and what it became. A part reached twice (a
# block shared, or one inside itself) is walked once: a structure that refers to itself
# twice a level would otherwise cost two to the power of its depth. One inside itself is
# left as it is, for the SDK to refuse as it would.
_Done = dict[int, Any]


def _plain(value: Any, depth: int, done: _Done) -> Any:
    if isinstance(value, str | int | float | None):  # most of a history: nothing to look up
        return value
    if isinstance(value, Mapping | list | tuple):
        if not depth:
            return value
        key = id(value)
        if key in done:
            return done[key]
        done[key] = value  # until walked: what a part inside itself finds
        if isinstance(value, Mapping):
            converted = _plain_mapping(value, depth - 1, done)
        else:
            converted = _plain_sequence(value, depth - 1, done)
        done[key] = converted
        return converted
    data = sdk_dict(value)
    return value if data is None else data


def _plain_mapping(value: Mapping[Any, Any], depth: int, done: _Done) -> Any:
    out: dict[Any, Any] | None = None  # copied on the first part converted
    for key, part in value.items():
        converted = _plain(part, depth, done)
        if converted is not part:
            out = dict(value) if out is None else out
            out[key] = converted
    return value if out is None else out


def _plain_sequence(value: list[Any] | tuple[Any, ...], depth: int, done: _Done) -> Any:
    out: list[Any] | None = None  # copied on the first part converted
    for i, part in enumerate(value):
        converted = _plain(part, depth, done)
        if converted is not part:
            out = list(value) if out is None else out
            out[i] = converted
    return value if out is None else out


def sdk_dict(item: object) -> dict[str, Any] | None:
    """The dict an SDK would send for one of its models (``None`` for anything else).

    Dumped as the SDKs' own request serialisation does: JSON mode, API names, fields unset
    left out, and without the fields the model names in ``__api_exclude__`` (what a
    ``parse`` call added, such as ``parsed_arguments``, which the API rejects as unknown)."""
    dump = getattr(item, "model_dump", None)
    if not callable(dump) or not callable(getattr(item, "to_dict", None)):
        return None
    data = dump(
        mode="json",
        by_alias=True,
        exclude_unset=True,
        exclude=getattr(item, "__api_exclude__", None),
    )
    return data if isinstance(data, dict) else None


class ConvertedHistory:
    """The neutral messages of one provider's request histories, each request's converted
    from the last one's: what it added, or everything after the first item it changed.

    An item is compared with ``==`` against a copy taken when it was converted
    (`agentctx._snapshots`), so one the caller changed in place (a ``cache_control`` moved, a
    result edited) is converted again, and everything after it, while one rebuilt equal (a
    history loaded again) is not. Messages are made from the copies, so a later change to
    the caller's objects never reaches them. The messages of items kept are the same objects
    as before, which is also what the manager compares fastest.
    """

    def __init__(self, provider: str) -> None:
        self._provider = provider
        self._copies: list[object] = []  # each converted item as it was when converted
        self._ends: list[int] = []  # how many messages items[: i + 1] converted to
        self._messages: list[Message] = []
        self._names: dict[str, str] = {}  # tool names of the calls in _messages, by id
        self._lent = 0  # calls still reading ``_ends`` through `items_of`

    def convert(self, items: list[Any]) -> list[Message]:
        """The neutral messages of ``items`` (the request's history, system messages split
        off), a list of the caller's own; raises `UnsupportedMessageError` as the adapter
        does, changing nothing."""
        copies = self._copies
        same = unchanged_prefix(items, copies)
        if self._provider == "openai-responses" and same < max(len(items), len(copies)):
            # Assistant-side items make one message with their neighbours: a run that the
            # change (or a new item) may join is converted again whole.
            while same and is_assistant_side(plain(copies[same - 1])):
                same -= 1
        kept = self._ends[same - 1] if same else 0
        if same < len(copies):
            self._names = _tool_names(self._messages[:kept], self._provider)
        # Converted from the copies: a message holds what it was made from (a call's
        # arguments), which the caller may change in place later.
        fresh = [snapshot(item) for item in items[same:]]
        sources = [i if c is UNCOPIED else c for i, c in zip(items[same:], fresh, strict=True)]
        try:
            messages, ends = self._read([plain(c) for c in sources], same, kept)
        except BaseException:
            self._names = _tool_names(
                self._messages, self._provider
            )  # as the last request left them
            raise
        del copies[same:], self._messages[kept:]
        if self._lent and same < len(self._ends):
            # A call that overlaps this one (its strategy awaiting) still reads the old
            # ends: they are left to it, not cut under it.
            self._ends = self._ends[:same]
        else:
            del self._ends[same:]
        copies += fresh
        self._ends += ends
        self._messages += messages
        return list(self._messages)  # calls of a session overlap: each keeps its own

    @contextmanager
    def items_of(self) -> Iterator[Callable[[int], int]]:
        """Within the block: the index in the items of the last `convert` of the item each
        of its messages (by index) was made from; a message made from several items (a
        Responses assistant turn) is named by the first of them.

        ```python
        messages = history.convert(items)
        with history.items_of() as item_of:
            ...  # item_of(i): the index in ``items`` of the item messages[i] came from
        ```

        Free until a message is named (a bisection then): a call that overlaps (another
        ``convert`` before the block ends) leaves the ends read here as they are."""
        ends, length = self._ends, len(self._ends)
        self._lent += 1
        try:
            yield lambda message: bisect_right(ends, message, 0, length)
        finally:
            self._lent -= 1

    def _read(self, items: list[Any], start: int, kept: int) -> tuple[list[Message], list[int]]:
        """The messages of ``items`` (from index ``start`` of the history, after ``kept``
        messages) and the running count of messages after each item; the tool names of
        their calls are added to those known."""
        names = self._names
        messages: list[Message] = []
        ends: list[int] = []
        previous = self._messages[kept - 1] if kept else None
        i = 0
        while i < len(items):
            at, group = start + i, 1
            if self._provider == "anthropic":
                part = from_anthropic(items[i : i + 1], start=at, names=names, previous=previous)
            elif self._provider == "openai-chat":
                part = from_openai_chat(items[i : i + 1], start=at, names=names)
            else:
                if is_assistant_side(items[i]):
                    while i + group < len(items) and is_assistant_side(items[i + group]):
                        group += 1
                part = from_openai_responses(items[i : i + group], start=at, names=names)
            messages += part
            previous = part[-1] if part else previous
            ends += [kept + len(messages)] * group
            i += group
        return messages, ends


def _tool_names(messages: Sequence[Message], provider: str) -> dict[str, str]:
    if provider == "openai-responses":
        return known_calls(messages)
    return {c.id: c.name for m in messages if isinstance(m, AssistantMessage) for c in m.tool_calls}
