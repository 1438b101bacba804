"""What a compacted part leaves in the view: markers, one-line turns, and their artifact trail.

A dropped span becomes the constant `COMPACTION_MARKER` followed by the files and commands the
span touched; a condensed turn becomes one line (`condensed_line`). Both name the recall id
under which the original messages are kept (`span_text`, which refers to the ids of earlier
markers it absorbs), and pass on the trails of earlier markers and condensed lines, so the trail
survives compaction after compaction.
"""

from __future__ import annotations

import functools
import re
import sys
from types import MappingProxyType
from typing import TYPE_CHECKING

from agentctx.ledger import ReplaceArguments, ReplaceResult
from agentctx.messages import (
    AssistantMessage,
    ImageBlock,
    Message,
    SummaryMessage,
    TextBlock,
    ToolCall,
    ToolResultMessage,
    sendable_text,
    text_of,
)
from agentctx.recall.store import escape_literal, recall_reference
from agentctx.summarizer import is_native_compaction, serialize_transcript

if TYPE_CHECKING:
    from collections.abc import Sequence

    from agentctx.ledger import Ledger
    from agentctx.recall.store import RecallStore

__all__ = [
    "COMPACTION_MARKER",
    "ID_STAND_IN",
    "condensed_line",
    "describe_call",
    "describe_images",
    "is_marker",
    "is_paid_summary",
    "marker_with_trail",
    "put_entry",
    "span_text",
    "truncate_text",
]

COMPACTION_MARKER = "[Context compacted: earlier messages were removed to fit the context window]"
_ID_KEYS = ("path", "file_path", "file", "filename", "command", "cmd", "pattern", "query", "url")


def truncate_text(text: str, max_lines: int, max_chars: int, note: str = "") -> str:
    """Head and tail of ``text`` within ``max_lines`` lines and ``max_chars`` characters.

    What is kept is the text's start and its end; the one marker line between them says how
    many of the text's lines and characters it stands for (whole lines with a line break
    each; a cut inside lines, the characters left out), and counts in both limits, so
    applying the function to its own output returns it unchanged (when ``max_chars`` has
    room for the marker: 80 characters and the note). ``note`` (e.g. a recall
    hint) is added to the marker. Whole lines are cut while that is enough; when the lines
    kept are still too long, a cut inside them. `truncate_parts` says where it cuts.
    """
    parts = truncate_parts(text, max_lines, max_chars, note)
    if parts is None:
        return text
    head, marker, tail = parts
    return text[:head] + marker + text[tail:]


def truncate_parts(
    text: str, max_lines: int, max_chars: int, note: str = ""
) -> tuple[int, str, int] | None:
    """Where `truncate_text` cuts ``text``: ``(head, marker, tail)``, its output being
    ``text[:head] + marker + text[tail:]``; ``None`` when it leaves ``text`` as it is. For a
    text made of several blocks, which part of each is kept (`agentctx.strategies`' cut of a
    tool result whose text blocks stand around an image)."""
    suffix = f"; {note}" if note else ""
    n = len(text)
    lines = text.count("\n") + 1
    by_lines = lines > max_lines >= 3
    if not by_lines and n <= max_chars:
        return None
    # The head may end at (and the tail start after) these line breaks; found from both ends
    # rather than split: outputs run to thousands of lines, of which few are kept.
    head_end, tail_start = n, -1
    if max_lines >= 3:
        keep = max_lines - 1
        head_end, tail_start = -1, n
        for _ in range((keep + 1) // 2):
            head_end = text.find("\n", head_end + 1)
            if head_end < 0:
                head_end = n
                break
        for _ in range(keep // 2):
            tail_start = text.rfind("\n", 0, tail_start)
            if tail_start < 0:
                break
    if by_lines:
        # The cut lines and their line breaks lie between the two.
        cut_lines, cut_chars = lines - max_lines + 1, tail_start - head_end
        marker = f"[... {cut_lines} lines ({cut_chars} chars) truncated{suffix} ...]"
        # As slices take them: ``text[:n + 1]`` is the whole text, ``text[-1:]`` its last
        # character.
        head, tail = min(head_end + 1, n), tail_start if tail_start >= 0 else n + tail_start
        if head + len(marker) + n - tail <= max_chars:
            return head, marker, tail
    # A cut inside lines, of the text itself: head and tail lines no more than above, and the
    # marker's numbers those of the text (a cut of the line cut's output would count its
    # marker and hide the first cut's size).
    room = max(0, max_chars - 80 - len(suffix))  # the longest marker below is under 80
    head_room, tail_room = head_end, n - tail_start - 1
    head = min(head_room, (room + 1) // 2)
    tail = min(tail_room, room - head)
    head = min(head_room, room - tail)
    cut = n - head - tail
    breaks = text.count("\n", head, n - tail)
    spans = f" in {breaks + 1} lines" if breaks else ""
    marker = f"\n[... {cut} chars{spans} truncated{suffix} ...]\n"
    return head, marker, n - tail


def describe_call(call: ToolCall, width: int = 200) -> str:
    """``name(key=value)`` with the argument that identifies what the call touched."""
    args = call.arguments
    name = sendable_text(call.name)
    for key in _ID_KEYS:
        value = args.get(key)
        if isinstance(value, str) and value:
            return f"{name}({key}={_clip(value, width)})"
    for key, value in args.items():
        if isinstance(value, str) and value:
            return f"{name}({sendable_text(key)}={_clip(value, width)})"
    return f"{name}()"


def describe_images(images: Sequence[ImageBlock]) -> str:
    """What a marker says of ``images`` it stands for: ``image (image/png, 41 KB)``, ``3
    images (image/png, image/jpeg, 120 KB)``; ``by URL`` for images sent as one. No recall id:
    recall holds text."""
    kinds = [_clip(b.media_type, 40) or "unknown type" for b in images]
    inline = [b for b in images if b.source == "base64"]
    about = list(dict.fromkeys(kinds))
    if inline:
        # Base64 holds 3 bytes in 4 characters.
        about.append(f"{max(1, round(sum(len(b.data) for b in inline) * 3 / 4 / 1024))} KB")
    if len(inline) < len(images):
        about.append("by URL")
    what = "image" if len(images) == 1 else f"{len(images)} images"
    return f"{what} ({', '.join(about)})"


def _clip(text: str, width: int) -> str:
    """``text`` on one line, at most ``width`` characters, as a request can carry it: this
    is text agentctx writes, from arguments a model's JSON may give half a surrogate pair."""
    text = sendable_text(" ".join(text.split()))
    return text if len(text) <= width else text[: width - 1] + "…"


_TRAIL_HEADER = "Files and commands touched in that part:"
_TRAIL_LIMIT = 4000


_MARKER_KEY = "agentctx_marker"
_MARKED = MappingProxyType({_MARKER_KEY: True})
"""The ``extra`` of the markers `marker_with_trail` makes: a summary of the caller's whose
text starts like one is the caller's (a barrier, stored in full), not a marker whose content
is recallable under the ids it names."""


def is_marker(m: Message) -> bool:
    """Whether ``m`` is a marker this strategy made (`marker_with_trail`)."""
    return (
        isinstance(m, SummaryMessage)
        and m.extra.get(_MARKER_KEY) is True
        and m.text.startswith(COMPACTION_MARKER)
    )


def is_paid_summary(m: Message) -> bool:
    """A summary that is not this strategy's own marker (a briefing someone paid for), or a
    provider's native compaction (`is_native_compaction`)."""
    return (isinstance(m, SummaryMessage) and not is_marker(m)) or is_native_compaction(m)


def marker_with_trail(dropped: Sequence[Message], rid: str | None = None) -> SummaryMessage:
    """The constant marker, then what the dropped span touched, so the artifact trail stays.

    Its bytes are fixed when the decision is taken, like every replacement; an earlier marker
    or condensed turn inside the span passes its own trail on. ``rid`` is the recall id of the
    dropped text, which refers to the ids of the earlier markers inside the span (`span_text`),
    so every dropped part stays one recall call away and the marker names one id however
    often its stretch was dropped before. Without ``rid`` the earlier markers' ids are passed
    on.
    """
    ids = _passed_on(dropped, rid)
    head = COMPACTION_MARKER
    if ids:
        head += " (" + ", ".join(f"recall_context id={i}" for i in dict.fromkeys(ids)) + ")"
    lines = [f"- {item}" for item in _fit_trail(_trail_items(dropped))]
    if not lines:
        return SummaryMessage(head, _MARKED)
    return SummaryMessage("\n".join([head, _TRAIL_HEADER, *lines]), _MARKED)


def _passed_on(part: Sequence[Message], rid: str | None) -> list[str]:
    """The recall ids a replacement of ``part`` names: its own, else those of the markers it
    absorbs (nothing else would lead to them)."""
    if rid is not None:
        return [rid]
    return [i for m in part if is_marker(m) for i in _marker_ids(m)]


def _marker_ids(marker: Message) -> list[str]:
    assert isinstance(marker, SummaryMessage)
    return _RECALL_ID.findall(marker.text.split("\n", 1)[0])


def span_text(
    view: Sequence[Message],
    origins: Sequence[int],
    raw: Sequence[Message],
    start: int,
    end: int,
    ledger: Ledger | None = None,
) -> str:
    """What a recall of the condensed or dropped view part ``[start, end)`` returns: the raw
    messages it stands for, in full, as plain text, so one call finds any of them.

    What the part holds that is already recallable under its own id is not stored again: an
    earlier marker stands as a `recall_reference` to each of its ids (the replacement names
    only the new one); a condensed line, a tool result or arguments cleared with a recall id
    (found in the message or, with ``ledger``, in its decisions) are stored as the view shows them
    followed by a `recall_reference` to each id, which the recall tool expands into the
    original. So every raw message is stored about once, however often its stretch is
    compacted again.
    """
    pieces: list[str] = []
    run: list[Message] = []  # raw messages to serialize in full
    stored_to = 0  # the raw messages before it are in ``run`` already

    def flush() -> None:
        if run:
            pieces.append(_serialize(run))
            run.clear()

    for j in range(start, end):
        m = view[j]
        if is_marker(m):
            flush()
            pieces += [recall_reference(rid) for rid in _marker_ids(m)]
            continue
        i = origins[j]
        if i < stored_to:
            # Origins need not rise: repair puts a missing result's stub after its batch, at
            # its call's origin, and results in call order. What it stands for is stored.
            continue
        stored = _stored_as(m, raw[i] if i < len(raw) else None, ledger, i)
        if stored is None:
            k = j + 1
            while k < len(origins) and origins[k] <= i:
                k += 1
            stop = origins[k] if k < len(origins) else len(raw)
            run += raw[i:stop]
            stored_to = stop
            continue
        flush()
        pieces.append(stored)
    flush()
    return "\n".join(p for p in pieces if p)


def _serialize(messages: Sequence[Message]) -> str:
    """The messages as a span's entry holds them: in full, escaped (`escape_literal`)."""
    text = serialize_transcript(
        messages, block_chars=sys.maxsize, argument_chars=sys.maxsize, total_chars=sys.maxsize
    )
    return escape_literal(text)


def put_entry(recall: RecallStore, session_id: str, text: str) -> str:
    """Store ``text``, already in the form an entry holds (a `span_text`, or any text escaped
    with `escape_literal`), and return its recall id: the manager's writer is asked not to
    escape it again (`RecallWriter.put_references`), so its references expand."""
    put = getattr(recall, "put_references", recall.put)
    rid: str = put(session_id, text)
    return rid


def _stored_as(m: Message, original: Message | None, ledger: Ledger | None, i: int) -> str | None:
    """The text that stands for view message ``m`` (from raw ``original``) in a span's recall
    entry when its original is recallable already, else ``None`` (store the raw messages)."""
    if m is original:
        return None
    # A span's replacement stands for the whole span: the decisions at its first message
    # are hidden under it (its own recall ids are in its text).
    decided = (
        ledger.decisions_at(i) if ledger is not None and ledger.span_covering(i) is None else ()
    )
    if isinstance(m, ToolResultMessage) and isinstance(original, ToolResultMessage):
        for d in decided:
            if isinstance(d, ReplaceResult) and d.recall_id is not None:
                # The entry holds the result's whole text: the same line the raw one makes.
                label = "tool error" if original.is_error else "tool result"
                name = original.tool_name or "tool"
                line = f"[{label}: {escape_literal(name)}] "
                text = line + recall_reference(d.recall_id)
                if all(isinstance(b, TextBlock) for b in original.content):
                    return text
                # What else it held (an image) is named in its place, as in a result stored
                # raw (`serialize_transcript`), the text where its first block was.
                first = next((b for b in original.content if isinstance(b, TextBlock)), None)
                lines = [
                    text if b is first else line + f"[{b.type} omitted]"
                    for b in original.content
                    if b is first or not isinstance(b, TextBlock)
                ]
                return "\n".join(lines if first is not None else [text, *lines])
    if ledger is not None and not decided and ledger.span_covering(i) is None:
        return None  # only repair changed it (a renamed call id): the raw message is stored
    # The ids agentctx's own placeholders name, not any id-like text in what it quotes.
    text = m.text if isinstance(m, SummaryMessage) else text_of(m.content)
    ids = _MENTIONED_ID.findall(text)
    ids += [
        d.recall_id for d in decided if isinstance(d, ReplaceArguments) and d.recall_id is not None
    ]
    if not ids or (isinstance(original, ToolResultMessage) and not decided):
        return None
    refs = [recall_reference(rid) for rid in dict.fromkeys(ids)]
    return "\n".join([_serialize([m]), *refs])


_CONDENSED = "[Earlier turn, condensed]"
_RECALL_ID = re.compile(r"ctx-[0-9a-f]{16}")
# How placeholders name an id: ``recall_context id=…``, ``recall_context(id="…")``.
_MENTIONED_ID = re.compile(r'recall_context[ (]id="?(ctx-[0-9a-f]{16})')
ID_STAND_IN = "ctx-" + "0" * 16  # as long as a real recall id, for sizing a replacement
_RECALL_NOTE = re.compile(
    r"\(recall_context id=ctx-[0-9a-f]{16}(?:, recall_context id=ctx-[0-9a-f]{16})*\) ?"
)
_FAILED_SUFFIX = re.compile(r" (\d+) call\(s\) failed\.$")
_PATH_KEYS = frozenset({"path", "file_path", "file", "filename"})
_ITEM = re.compile(r"([\w.-]+(?:\+[\w.-]+)*)\((\w+)=(.*)\)", re.S)
_ITEM_SEPARATOR = re.compile(r", (?=[\w.-]+(?:\+[\w.-]+)*\()")
# A path is what `(?:[\w.-]+/)+[\w.-]+\.\w{1,5}` matches; that pattern backtracks from every
# start of a long run of path characters with no extension ("a/a/a/..."), so `paths_in`
# reads each run once instead, to the same matches.
_PATH_RUN = re.compile(r"[\w./-]+")
_EXTENSION = re.compile(r"\w{1,5}")
_MORE = re.compile(r"\.\.\. and \d+ more|\+\d+ more")


def _call_items(call: ToolCall) -> list[str]:
    """``name(key=value)`` of a call, and ``name(path=p)`` for each file its command names
    beyond where that description is clipped."""
    described = describe_call(call, width=200)
    items = [described]
    for key, value in call.arguments.items():
        if key in ("command", "cmd") and isinstance(value, str):
            first = value.split("\n", 1)[0]
            items += [
                sendable_text(f"{call.name}(path={p})")
                for p in dict.fromkeys(paths_in(first))
                if p not in described
            ]
    return items


def _split_condensed(text: str) -> tuple[str, list[str], int]:
    """Text, trail items and failed-call count of a tier-2 one-liner (``("", [], 0)`` if
    ``text`` is not one), so condensing or dropping it again keeps all three."""
    if not text.startswith(_CONDENSED):
        return "", [], 0
    body = text.removeprefix(_CONDENSED).strip()
    note = _RECALL_NOTE.match(body)
    if note:
        body = body[note.end() :]
    failed = _FAILED_SUFFIX.search(body)
    errors = int(failed.group(1)) if failed else 0
    if failed:
        body = body[: failed.start()]
    body, _, listed = body.partition(" Tools: ") if " Tools: " in body else (body, "", "")
    if body.startswith("Tools: "):
        body, listed = "", body.removeprefix("Tools: ")
    items = [
        item
        for item in _ITEM_SEPARATOR.split(listed.removesuffix("."))
        if item and not _MORE.fullmatch(item)
    ]
    return body.strip(), items, errors


def _condensed_tools(text: str) -> list[str]:
    """The trail items of a tier-2 one-liner."""
    return _split_condensed(text)[1]


def _trail_items(messages: Sequence[Message]) -> list[str]:
    """What ``messages`` touched, oldest first, including trails that compaction left."""
    items: list[str] = []
    for m in messages:
        if is_marker(m):
            assert isinstance(m, SummaryMessage)
            for line in m.text.split("\n")[2:]:
                item = line.removeprefix("- ")
                if not _MORE.match(item):
                    items.append(item)
        elif isinstance(m, AssistantMessage):
            for call in m.tool_calls:
                items += _call_items(call)
            items += _condensed_tools(text_of(m.content))
    return items


# The same items come back in every span that grows over them: parsed once each.
@functools.lru_cache(maxsize=8192)
def _path_argument(item: str) -> tuple[tuple[str, ...], str | None]:
    """The tools of ``tool(path=...)`` and its path; ``((), None)`` for any other item."""
    m = _ITEM.fullmatch(item)
    if m and m.group(2) in _PATH_KEYS:
        return tuple(m.group(1).split("+")), m.group(3)
    return (), None


@functools.lru_cache(maxsize=8192)
def _paths_named(item: str) -> tuple[str, ...]:
    return tuple(paths_in(item))


def paths_in(text: str) -> list[str]:
    """The file paths ``text`` names (``dir/name.ext``, at least one directory, an extension
    of 1-5 word characters), in order, in O(len(text))."""
    found: list[str] = []
    for run in _PATH_RUN.findall(text):
        if "/" in run:
            _paths_in_run(run, found)
    return found


def _paths_in_run(run: str, found: list[str]) -> None:
    n, p = len(run), 0
    while p < n:
        if run[p] == "/":
            p += 1
            continue
        # The path from ``p`` ends in the last segment of its chain (segments between single
        # slashes) with an extension; a chain without one names no path from anywhere in it.
        segments = []
        s = p
        while (j := run.find("/", s)) != -1 and j + 1 < n and run[j + 1] != "/":
            s = j + 1
            k = run.find("/", s)
            segments.append((s, n if k == -1 else k))
        end = -1
        for a, b in reversed(segments):
            d = run.rfind(".", a + 1, b)
            while d != -1 and (ext := _EXTENSION.match(run, d + 1, b)) is None:
                d = run.rfind(".", a + 1, d)
            if d != -1 and ext is not None:
                end = ext.end()
                break
        if end == -1:
            p = n if j == -1 else j + 1
        else:
            found.append(run[p:end])
            p = end


def _fit_trail(items: Sequence[str], limit: int = _TRAIL_LIMIT) -> list[str]:
    """Distinct trail items within about ``limit`` characters (see `_fit_trail_of`)."""
    return list(_fit_trail_of(tuple(items), limit))


# A decision call sizes the same turns and spans again (candidates, the manager's fixed-point
# pass), and the next one sizes the same old turns: their trails are worth keeping.
@functools.lru_cache(maxsize=1024)
def _fit_trail_of(items: tuple[str, ...], limit: int) -> tuple[str, ...]:
    """Distinct trail items within about ``limit`` characters.

    Files come first, one line each with the tools that touched them merged
    (``read+edit(path=...)``), since they are the artifact trail; then commands and the
    rest, oldest first, in what the files leave of ``limit`` (at least a quarter of it). A
    file that only commands name is listed when one of those commands is not shown. What
    does not fit is counted.
    """
    files: dict[str, list[str]] = {}  # path -> tools that named it as a path argument
    named: dict[str, list[str]] = {}  # path -> items (commands, ...) whose text names it
    others: list[str] = []
    for item in dict.fromkeys(items):
        tools, path = _path_argument(item)
        if path is not None:
            names = files.setdefault(path, [])
            names += [n for n in tools if n not in names]
            continue
        others.append(item)
        for path in _paths_named(item):
            files.setdefault(path, [])
            named.setdefault(path, []).append(item)
    room = max(limit // 4, limit - sum(len(p) + 12 for p, n in files.items() if n))
    shown: list[str] = []
    for item in others:
        if len(item) + 3 > room:
            break
        shown.append(item)
        room -= len(item) + 3
    visible = set(shown)
    lines: list[str] = []
    size = 0
    omitted = len(others) - len(shown)
    for path, names in files.items():
        hidden = [i for i in named.get(path, ()) if i not in visible]
        if not names and not hidden:
            continue  # only commands that are shown name it
        names = names + [
            n for n in dict.fromkeys(i.split("(", 1)[0] for i in hidden) if n not in names
        ]
        line = f"{'+'.join(names)}(path={path})"
        if size + len(line) > limit:
            omitted += 1
            continue
        lines.append(line)
        size += len(line) + 3
    lines += shown
    if omitted:
        lines.append(f"... and {omitted} more")
    return tuple(lines)


def condensed_line(part: Sequence[Message], rid: str | None = None) -> str:
    """The one line a condensed turn becomes: its text, the tools and files it touched, how
    many calls failed, and the recall ids of what it stands for."""
    texts: list[str] = []
    errors = 0
    for m in part:
        if isinstance(m, AssistantMessage):
            t = text_of(m.content).strip()
            earlier, _, failed = _split_condensed(t)
            if t.startswith(_CONDENSED):
                t, errors = earlier, errors + failed  # condensed again: keep its trail
            if t:
                texts.append(t)
        elif isinstance(m, ToolResultMessage) and m.is_error:
            errors += 1
    items = _trail_items(part)
    line = _CONDENSED
    ids = _passed_on(part, rid)
    if ids:
        line += " (" + ", ".join(f"recall_context id={i}" for i in dict.fromkeys(ids)) + ")"
    if texts:
        line += " " + _clip(" ".join(texts), 200)
    if items:
        line += f" Tools: {', '.join(_fit_trail(items))}."
    if errors:
        line += f" {errors} call(s) failed."
    return line
