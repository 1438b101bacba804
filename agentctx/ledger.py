"""The ledger of compaction decisions, and `render`, the pure function that applies them.

Strategies never edit bytes: they add decisions, anchored to a raw message by its position
and fingerprint. ``render(raw, ledger)`` turns the raw history into the view the model sees,
deterministically, so the same raw history and ledger always give identical bytes, and a new
decision changes the view only from its own position on.

A decision is never revisited: the replacement bytes are fixed when the decision is taken
(that is what keeps the provider's prefix cache warm). When the raw history is rewound or
edited, the decisions anchored at or after the change are dropped as stale.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeAlias

from agentctx import boundaries
from agentctx._check import preview
from agentctx.boundaries import Repair, repair
from agentctx.errors import ConfigError, StoreError, UnsupportedMessageError
from agentctx.messages import (
    THINKING_DROPPED,
    AssistantContent,
    AssistantMessage,
    ImageBlock,
    JSONMap,
    Message,
    OpaqueBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultContent,
    ToolResultMessage,
    block_from_dict,
    block_to_dict,
    check_history,
    fingerprint,
    from_dict,
    json_problem,
    to_dict,
)

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Sequence
    from collections.abc import Set as AbstractSet

__all__ = [
    "Anchor",
    "Decision",
    "DropThinking",
    "Keep",
    "Ledger",
    "Rendered",
    "ReplaceArguments",
    "ReplaceResult",
    "ReplaceSpan",
    "anchor",
    "check_fits",
    "decision_json",
    "protected_positions",
    "render",
    "render_message",
    "shown_positions",
]


@dataclass(frozen=True, slots=True)
class Anchor:
    """A raw message named by position and content: both must still match to apply."""

    index: int
    fingerprint: str


def anchor(raw: Sequence[Message], index: int) -> Anchor:
    """The anchor of ``raw[index]``."""
    return Anchor(index, fingerprint(raw[index]))


@dataclass(frozen=True, slots=True)
class ReplaceResult:
    """Send the tool result at ``at`` with ``content`` instead of its own."""

    at: Anchor
    content: tuple[ToolResultContent, ...]
    reason: str
    recall_id: str | None = None


@dataclass(frozen=True, slots=True)
class ReplaceArguments:
    """Send the arguments of call ``call_id`` of the assistant message at ``at`` instead."""

    at: Anchor
    call_id: str
    arguments: JSONMap
    reason: str
    recall_id: str | None = None


@dataclass(frozen=True, slots=True)
class DropThinking:
    """Leave out every thinking block of the (completed) assistant message at ``at``."""

    at: Anchor
    reason: str


@dataclass(frozen=True, slots=True)
class Keep:
    """Keep the message at ``at`` as it is; strategies that see this never revisit it."""

    at: Anchor
    reason: str


@dataclass(frozen=True, slots=True)
class ReplaceSpan:
    """Send ``replacement`` in place of raw messages ``[at.index, end)``.

    ``at`` and ``last`` anchor its first and last messages (``raw[end - 1]``): a history cut
    back into the span, or either end edited, drops it; an edit strictly inside it is not
    seen (what a span hides is not compared, in a running session or a resumed one).
    A span may contain older spans whole (it then hides them) but never overlap one partly.
    """

    at: Anchor
    end: int
    last: Anchor
    replacement: tuple[Message, ...]
    reason: str


Decision: TypeAlias = ReplaceResult | ReplaceArguments | DropThinking | Keep | ReplaceSpan
_DECISIONS = (ReplaceResult, ReplaceArguments, DropThinking, Keep, ReplaceSpan)
_PerMessage: TypeAlias = ReplaceResult | ReplaceArguments | DropThinking | Keep


def _end_of(decision: Decision) -> int:
    return decision.end if isinstance(decision, ReplaceSpan) else decision.at.index + 1


class Ledger:
    """Decisions for one session, in the order they were taken.

    ``version`` changes whenever a decision is added or dropped, so callers can cache
    renders by it.
    """

    __slots__ = (
        "_applied",
        "_decisions",
        "_end",
        "_per_message",
        "_span_starts",
        "_spans",
        "version",
    )

    def __init__(self, decisions: Iterable[Decision] = ()) -> None:
        # What `render` made of each message with decisions, by raw index: (the raw message,
        # its decisions, the result). Rendering again gives the same object, so the token
        # estimate kept on it stays (a new object is estimated again, in full to be sent).
        self._applied: dict[int, tuple[Message, tuple[_PerMessage, ...], Message]] = {}
        self._decisions: list[Decision] = []
        self._per_message: dict[int, list[_PerMessage]] = {}
        self._spans: dict[int, ReplaceSpan] = {}  # start -> outermost span starting there
        self._span_starts: tuple[int, list[int]] = (-1, [])  # (version, sorted starts)
        self._end = 0
        self.version = 0
        for d in decisions:
            self.add(d)

    def __len__(self) -> int:
        return len(self._decisions)

    @property
    def decisions(self) -> tuple[Decision, ...]:
        """All decisions, oldest first."""
        return tuple(self._decisions)

    @property
    def renderings(self) -> int:
        """How many rendered messages the ledger keeps (see `render`)."""
        return len(self._applied)

    def added_since(self, count: int) -> Sequence[Decision]:
        """The decisions after the first ``count``, oldest first."""
        return self._decisions[count:]

    def decisions_at(self, index: int) -> tuple[_PerMessage, ...]:
        """The per-message decisions anchored at raw ``index``."""
        return tuple(self._per_message.get(index, ()))

    def span_covering(self, index: int) -> ReplaceSpan | None:
        """The visible span that hides raw ``index``, if any."""
        starts = self._sorted_starts()
        k = bisect.bisect_right(starts, index) - 1
        if k >= 0 and index < (span := self._spans[starts[k]]).end:
            return span
        return None

    def hides_any(self, start: int, end: int) -> bool:
        """Whether a visible span hides any of raw ``[start, end)``."""
        starts = self._sorted_starts()
        # Visible spans never overlap: the last one to start before ``end`` ends last.
        k = bisect.bisect_left(starts, end) - 1
        return k >= 0 and self._spans[starts[k]].end > start

    def _sorted_starts(self) -> list[int]:
        version, starts = self._span_starts
        if version != self.version:
            starts = sorted(self._spans)
            self._span_starts = (self.version, starts)
        return starts

    @property
    def end(self) -> int:
        """One past the last raw index a decision touches (0 with none): messages from
        there on render as they are."""
        return self._end

    @property
    def spans(self) -> tuple[ReplaceSpan, ...]:
        """The visible (outermost) spans, by position."""
        return tuple(self._spans[k] for k in sorted(self._spans))

    def add(self, decision: Decision, raw: Sequence[Message] | None = None) -> None:
        """Record ``decision``.

        Raises `ConfigError` for a span that partly overlaps another and, when ``raw`` (the
        history the decision was taken on) is given, for a decision that does not fit the
        message it is anchored to (`check_fits`): one `render` would silently skip.
        """
        if raw is not None:
            check_fits(decision, raw)
        if isinstance(decision, ReplaceSpan):
            a, b = decision.at.index, decision.end
            if b <= a:
                raise ConfigError(f"empty span [{a}, {b})")
            inner = []
            for start, span in self._spans.items():
                if a <= start and span.end <= b:
                    inner.append(start)
                elif start < b and a < span.end:
                    raise ConfigError(
                        f"span [{a}, {b}) partly overlaps [{start}, {span.end}) of an earlier one"
                    )
            for start in inner:
                del self._spans[start]
            self._spans[a] = decision
        else:
            self._per_message.setdefault(decision.at.index, []).append(decision)
        self._decisions.append(decision)
        self._end = max(self._end, _end_of(decision))
        self.version += 1

    def preview(self, decision: _PerMessage, raw: Sequence[Message]) -> Message:
        """What ``raw[decision.at.index]`` shows once ``decision`` is added (before `repair`),
        for a decision not taken yet: rendered now and kept, so that `render` shows this same
        object if it is taken, and a token estimate made of it here is not made again."""
        i = decision.at.index
        return _applied(self, i, raw[i], [*self._per_message.get(i, ()), decision])

    def drop_from(self, index: int) -> list[Decision]:
        """Drop decisions that touch raw messages at or after ``index``; return them."""
        return self._rebuild(lambda d: _end_of(d) > index)

    def drop_stale(self, raw: Sequence[Message]) -> list[Decision]:
        """Drop decisions whose anchors no longer match ``raw``; return them."""

        def stale(d: Decision) -> bool:
            anchors = (d.at, d.last) if isinstance(d, ReplaceSpan) else (d.at,)
            return any(
                a.index >= len(raw) or fingerprint(raw[a.index]) != a.fingerprint for a in anchors
            )

        return self._rebuild(stale)

    def drop_protected(
        self, raw: Sequence[Message], protected: Collection[int] | None = None
    ) -> list[Decision]:
        """Drop decisions that hide what ``raw`` protects now; return them.

        The task, the latest user message and the newest complete turn are never summarized
        or dropped, nor the signed reasoning of the in-flight tool loop, and their thinking is
        never left out. A decision
        taken on a longer history can cover them once the history is rewound (the latest
        user message of the shorter history sat in an old, condensed stretch), so decisions
        kept across a resync are checked again here. Replaced tool results and arguments
        stay: truncating output is allowed anywhere. ``protected``: the raw indexes to keep
        (`protected_positions` of ``raw`` by default; `shown_positions` keeps only what every
        view must show).
        """
        if protected is None:
            protected = protected_positions(raw)
        if not protected:
            return []

        ordered = sorted(protected)  # a span hides one if one lies in it: two bisections

        def hides(d: Decision) -> bool:
            if isinstance(d, ReplaceSpan):
                return bisect.bisect_left(ordered, d.at.index) < bisect.bisect_left(ordered, d.end)
            return isinstance(d, DropThinking) and d.at.index in protected

        return self._rebuild(hides)

    def misfit(self, raw: Sequence[Message]) -> str | None:
        """Why the first decision that could not have been taken on ``raw`` could not
        (`check_fits`: what `CompactionContext.take` refuses), else ``None``. A ledger read
        from a store or handed over is checked with it before its first use."""
        for decision in self._decisions:
            try:
                check_fits(decision, raw)
            except ConfigError as e:
                return str(e)
        return None

    def _rebuild(self, drop: Any) -> list[Decision]:
        dropped = [d for d in self._decisions if drop(d)]
        if dropped:
            kept = [d for d in self._decisions if not drop(d)]
            version, applied = self.version, self._applied
            self.__init__(kept)  # type: ignore[misc]
            self.version = version + 1
            # Still checked on use: a rewind may have put another message at an index.
            self._applied = {i: a for i, a in applied.items() if i in self._per_message}
        return dropped

    # -- serialization ------------------------------------------------------------------

    def to_json(self) -> str:
        """The decisions as JSON text (the form stores keep)."""
        return "[" + ", ".join(map(decision_json, self._decisions)) + "]"

    @classmethod
    def from_json(cls, text: str) -> Ledger:
        """Rebuild a ledger from `to_json` output.

        Raises `StoreError` when ``text`` is not a ledger (truncated or edited JSON, a
        decision of an unknown kind, a span that partly overlaps another).
        """
        try:
            items = json.loads(text)
            if not isinstance(items, list):
                raise TypeError(f"a list of decisions, got {type(items).__name__}")
            return cls(_decision_from_dict(d) for d in items)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError) as e:
            raise StoreError(f"the saved ledger is unreadable: {type(e).__name__}: {e}") from e


def decision_json(decision: Decision) -> str:
    """One decision as its element of `Ledger.to_json` (whose items ``", "`` joins)."""
    return json.dumps(_decision_to_dict(decision), ensure_ascii=False)


def protected_positions(raw: Sequence[Message]) -> set[int]:
    """Raw indexes the invariants protect: the task, the latest user message, the newest
    complete turn, and the signed reasoning of the in-flight tool loop (the rest of a long
    loop may be dropped, as the tiers do)."""
    return _kept(raw, whole_turn=True)


_UNKNOWN: Any = object()


def shown_positions(
    raw: Sequence[Message],
    latest: int | None = _UNKNOWN,
    complete: tuple[int, int] | None = _UNKNOWN,
) -> set[int]:
    """Raw indexes every view of ``raw`` shows (docs/invariants.md): the task, the latest user
    message, the question and the answer of the newest complete turn, and the messages of
    the in-flight tool loop that carry signed reasoning. Narrower than `protected_positions`:
    a turn's steps dropped while it ran stay dropped once it completes. ``latest`` and
    ``complete``: the latest user message's index and the newest complete turn, when known
    (`agentctx.boundaries.CompleteTurns`), else searched for from the end."""
    return _kept(raw, whole_turn=False, latest=latest, complete=complete)


def _kept(
    raw: Sequence[Message],
    *,
    whole_turn: bool,
    latest: int | None = _UNKNOWN,
    complete: tuple[int, int] | None = _UNKNOWN,
) -> set[int]:
    out: set[int] = set()
    task = boundaries.task_index(raw)
    if task is not None:
        out.add(task)
    if latest is _UNKNOWN:
        latest = boundaries.latest_user_index(raw)
    if latest is not None:
        out.add(latest)
        loop = boundaries.loop_start_after(raw, latest)
        out.update(i for i in range(loop, len(raw)) if boundaries.has_thinking(raw[i]))
    if complete is _UNKNOWN:
        complete = boundaries.newest_complete_turn(raw)
    if complete is not None:
        out.update(range(*complete) if whole_turn else (complete[0], complete[1] - 1))
    return out


def check_anchors(decision: Decision, raw: Sequence[Message]) -> None:
    """Raise `ConfigError` unless ``decision`` is a decision whose anchors name messages of
    ``raw`` (index and fingerprint), as a saved ledger can hold them."""
    if not isinstance(decision, _DECISIONS):
        raise ConfigError(
            f"a decision is one of {', '.join(t.__name__ for t in _DECISIONS)}; got "
            f"{preview(decision)}"
        )
    anchors = (decision.at, decision.last) if isinstance(decision, ReplaceSpan) else (decision.at,)
    if isinstance(decision, ReplaceSpan) and not _is_index(decision.end):
        raise ConfigError(f"ReplaceSpan.end is a message index; got {preview(decision.end)}")
    for a in anchors:
        if not isinstance(a, Anchor):
            raise ConfigError(
                f"{type(decision).__name__} is anchored by {preview(a)}, not an Anchor (use "
                "ledger.anchor(raw, index))"
            )
        if not _is_index(a.index) or type(a.fingerprint) is not str:
            raise ConfigError(
                f"{type(decision).__name__} has an anchor of index {preview(a.index)} and "
                f"fingerprint {preview(a.fingerprint)}: an index >= 0 and a string (use "
                "ledger.anchor(raw, index))"
            )
        if a.index >= len(raw) or fingerprint(raw[a.index]) != a.fingerprint:
            raise ConfigError(
                f"{type(decision).__name__} is anchored at message {a.index}, which is not "
                "the message it names (use ledger.anchor(raw, index))"
            )
    if isinstance(decision, ReplaceSpan) and decision.last.index != decision.end - 1:
        raise ConfigError(
            f"ReplaceSpan [{decision.at.index}, {decision.end}) must anchor its last message "
            f"{decision.end - 1}, not {decision.last.index}"
        )


def _is_index(value: object) -> bool:
    return type(value) is int and value >= 0


def check_fits(decision: Decision, raw: Sequence[Message]) -> None:
    """Raise `ConfigError` unless ``decision`` can apply to the message(s) it is anchored to.

    A `ReplaceResult` needs a tool result, `ReplaceArguments` an assistant message with that
    call, `DropThinking` an assistant message; every anchor must name a message of ``raw``
    with that fingerprint, and a span must end within ``raw``.
    """
    check_anchors(decision, raw)
    target = raw[decision.at.index]
    kind = type(target).__name__
    if isinstance(decision, ReplaceResult) and not isinstance(target, ToolResultMessage):
        raise ConfigError(
            f"ReplaceResult is anchored at message {decision.at.index}, a {kind}: it replaces "
            "tool results only (use ReplaceSpan for other messages)"
        )
    if isinstance(decision, ReplaceArguments) and not (
        isinstance(target, AssistantMessage)
        and any(c.id == decision.call_id for c in target.tool_calls)
    ):
        raise ConfigError(
            f"ReplaceArguments names call {decision.call_id!r}, which the {kind} at message "
            f"{decision.at.index} does not make"
        )
    if isinstance(decision, DropThinking) and not isinstance(target, AssistantMessage):
        raise ConfigError(
            f"DropThinking is anchored at message {decision.at.index}, a {kind}: only "
            "assistant messages carry thinking"
        )
    if isinstance(decision, DropThinking) and any(
        isinstance(b, OpaqueBlock) for b in getattr(target, "content", ())
    ):
        # A Responses web_search_call or item_reference needs its id, which names the
        # reasoning item it followed: sent without it, the request is refused.
        raise ConfigError(
            f"DropThinking is anchored at message {decision.at.index}, which holds provider "
            "items (OpaqueBlock) whose ids name its reasoning: that reasoning stays"
        )
    problem = _contents_problem(decision, raw)
    if problem:
        raise ConfigError(f"{type(decision).__name__} {problem}")


def _contents_problem(decision: Decision, raw: Sequence[Message]) -> str | None:
    """What in ``decision`` no view could send (what the caller's own history is refused
    for), else ``None``: the rendering would fail or the provider refuse it on every later
    call, the decision being kept."""
    if type(decision.reason) is not str:
        return f"reason must be a string, not {type(decision.reason).__name__}"
    if isinstance(decision, ReplaceResult | ReplaceArguments) and not (
        decision.recall_id is None or type(decision.recall_id) is str
    ):
        return f"recall_id must be a string or None, not {type(decision.recall_id).__name__}"
    if isinstance(decision, ReplaceResult):
        content = decision.content
        if type(content) is not tuple or not all(isinstance(b, _RESULT_BLOCKS) for b in content):
            return "content must be a tuple of TextBlock, ImageBlock or OpaqueBlock"
    elif isinstance(decision, ReplaceArguments):
        if not isinstance(decision.arguments, Mapping):
            return f"arguments must be a mapping, not {type(decision.arguments).__name__}"
        # A strategy's own arguments are sent as they are: none the SDKs refuse to encode.
        return json_problem(decision.arguments, "holds arguments", finite=True)
    elif isinstance(decision, ReplaceSpan):
        if type(decision.replacement) is not tuple:
            return "replacement must be a tuple of messages"
        try:
            check_history(decision.replacement)
        except UnsupportedMessageError as e:
            return f"replacement: {e}"
        forged = _foreign_reasoning(decision, raw)
        if forged is not None:
            return f"replacement carries reasoning the span's messages do not: {forged!r:.80}"
    return None


def _foreign_reasoning(span: ReplaceSpan, raw: Sequence[Message]) -> object:
    """A reasoning block of ``span``'s replacement that no message it replaces carries (a
    provider checks signed reasoning byte for byte), else ``None``."""
    blocks = [
        b
        for m in span.replacement
        if isinstance(m, AssistantMessage)
        for b in m.content
        if isinstance(b, ThinkingBlock | RedactedThinkingBlock)
    ]
    if not blocks:
        return None
    own = [
        b
        for m in raw[span.at.index : span.end]
        if isinstance(m, AssistantMessage)
        for b in m.content
        if isinstance(b, ThinkingBlock | RedactedThinkingBlock)
    ]
    return next((b for b in blocks if b not in own), None)


_RESULT_BLOCKS = (TextBlock, ImageBlock, OpaqueBlock)


def _anchor_dict(a: Anchor) -> list[Any]:
    return [a.index, a.fingerprint]


def _decision_to_dict(d: Decision) -> dict[str, Any]:
    match d:
        case ReplaceResult(content=content, recall_id=recall_id):
            body: dict[str, Any] = {"content": [block_to_dict(b) for b in content]}
            body["recall_id"] = recall_id
        case ReplaceArguments(call_id=call_id, arguments=arguments, recall_id=recall_id):
            body = {"call_id": call_id, "arguments": dict(arguments), "recall_id": recall_id}
        case DropThinking() | Keep():
            body = {}
        case ReplaceSpan(end=end, last=last, replacement=replacement):
            body = {"end": end, "last": _anchor_dict(last)}
            body["replacement"] = [to_dict(m) for m in replacement]
    return {"kind": type(d).__name__, "at": _anchor_dict(d.at), "reason": d.reason, **body}


def _anchor_from(value: object) -> Anchor:
    """An anchor as `_anchor_dict` writes it; `ValueError` for anything else (an edited or
    corrupted row: a float, negative or boolean index would reach the view's indexing)."""
    if not isinstance(value, list) or len(value) != 2:
        raise ValueError(f"an anchor is [index, fingerprint], got {value!r:.80}")
    index, fp = value
    if type(index) is not int or index < 0 or type(fp) is not str:
        raise ValueError(f"an anchor is [index >= 0, fingerprint], got {value!r:.80}")
    return Anchor(index, fp)


def _text_field(d: Mapping[str, Any], key: str, *, optional: bool = False) -> Any:
    value = d.get(key) if optional else d[key]
    if not (type(value) is str or (optional and value is None)):
        raise ValueError(f"{key} must be a string, got {type(value).__name__}")
    return value


def _decision_from_dict(d: Mapping[str, Any]) -> Decision:
    at = _anchor_from(d["at"])
    kind, reason = d["kind"], _text_field(d, "reason")
    if kind == "ReplaceResult":
        content = tuple(block_from_dict(b) for b in d["content"])
        rid = _text_field(d, "recall_id", optional=True)
        return ReplaceResult(at, content, reason, rid)  # type: ignore[arg-type]
    if kind == "ReplaceArguments":
        # A plain dict, as the strategies make them: what renders goes to JSON writers.
        args = dict(d["arguments"])
        call_id, rid = _text_field(d, "call_id"), _text_field(d, "recall_id", optional=True)
        return ReplaceArguments(at, call_id, args, reason, rid)
    if kind == "DropThinking":
        return DropThinking(at, reason)
    if kind == "Keep":
        return Keep(at, reason)
    if kind == "ReplaceSpan":
        replacement = tuple(from_dict(m) for m in d["replacement"])
        end, last = d["end"], _anchor_from(d["last"])
        if type(end) is not int or not at.index < end == last.index + 1:
            raise ValueError(f"a span [{at.index}, {end!r:.20}) must end after its last message")
        return ReplaceSpan(at, end, last, replacement, reason)
    raise ConfigError(f"unknown decision kind {kind!r}")


# ---------------------------------------------------------------------------------------
# Rendering


def _apply(message: Message, decisions: Sequence[_PerMessage]) -> Message:
    for d in decisions:
        if isinstance(d, ReplaceResult) and isinstance(message, ToolResultMessage):
            m = message
            message = ToolResultMessage(m.tool_call_id, d.content, m.tool_name, m.is_error, m.extra)
        elif isinstance(d, ReplaceArguments | DropThinking) and isinstance(
            message, AssistantMessage
        ):
            blocks: list[AssistantContent] = []
            for b in message.content:
                if isinstance(d, DropThinking) and isinstance(
                    b, ThinkingBlock | RedactedThinkingBlock
                ):
                    continue
                if (
                    isinstance(d, ReplaceArguments)
                    and isinstance(b, ToolCall)
                    and b.id == d.call_id
                ):
                    b = ToolCall(b.id, b.name, d.arguments, b.extra)
                blocks.append(b)
            m2 = message
            extra = m2.extra
            if len(blocks) < len(m2.content) and isinstance(d, DropThinking):
                extra = MappingProxyType({**extra, THINKING_DROPPED: True})
            message = AssistantMessage(tuple(blocks), m2.stop_reason, m2.usage, m2.model, extra)
    return message


def _applied(ledger: Ledger, i: int, message: Message, decisions: list[_PerMessage]) -> Message:
    """`_apply`, the same object as the last render's for the same message and decisions."""
    key = tuple(decisions)
    known = ledger._applied.get(i)
    if known is not None and known[0] is message and known[1] == key:
        return known[2]
    shown = _apply(message, key)
    ledger._applied[i] = (message, key, shown)
    return shown


def render_message(raw: Sequence[Message], ledger: Ledger, index: int) -> Message:
    """What `render` makes of ``raw[index]`` alone, before `repair`: its per-message
    decisions applied (the same object as the last render's). For a message no span hides."""
    decisions = ledger._per_message.get(index)
    return _applied(ledger, index, raw[index], decisions) if decisions else raw[index]


@dataclass(frozen=True, slots=True)
class Rendered:
    """A rendered view: the messages, the raw index each came from, and the repairs made."""

    messages: list[Message]
    origins: list[int]
    repairs: list[Repair]


def render(
    raw: Sequence[Message],
    ledger: Ledger,
    start: int = 0,
    continues: AbstractSet[str] | None = None,
) -> Rendered:
    """The view of ``raw[start:]`` under ``ledger``: decisions applied, then `repair`.

    Pure and deterministic. ``start`` must not fall inside a span; rendering a suffix gives
    the same messages as the matching suffix of a full render when ``start`` is a safe cut
    and ``continues`` holds the tool-call ids the view uses before it (see `repair`).
    """
    out: list[Message] = []
    origins: list[int] = []
    spans = ledger._spans
    per_message = ledger._per_message
    shown: list[int] = []  # indexes rendered through `_applied`
    i, n = start, len(raw)
    while i < n:
        span = spans.get(i)
        if span is not None:
            out.extend(span.replacement)
            origins.extend([i] * len(span.replacement))
            i = span.end
            continue
        decisions = per_message.get(i)
        if decisions:
            out.append(_applied(ledger, i, raw[i], decisions))
            shown.append(i)
        else:
            out.append(raw[i])
        origins.append(i)
        i += 1
    applied = ledger._applied
    if not start and len(applied) > 2 * len(shown) + 64:
        # What spans now hide is rendered again only if a rewind drops them: keeping it
        # would hold a message and its estimate per hidden decision for the whole session.
        ledger._applied = {k: applied[k] for k in shown}
    # Most renders need no repair: the check costs a fraction of what repairing does.
    opens_fine = continues is not None or not out or not isinstance(out[0], AssistantMessage)
    if opens_fine and boundaries.needs_no_repair(out, continues or frozenset()):
        return Rendered(out, origins, [])
    messages, origins, repairs = repair(out, origins, continues=continues)
    return Rendered(messages, origins, repairs)
