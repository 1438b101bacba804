"""The `CompactionStrategy` extension point and the context every strategy works with.

A strategy looks at the current view and the token accounting and *adds decisions* to the
ledger; it never edits messages. The manager renders the view again after it returns.

```python
class DropOldImages:
    async def compact(self, ctx: CompactionContext) -> None:
        if ctx.prompt_tokens <= ctx.budget.limit:
            return
        ...
        ctx.take(ReplaceResult(anchor(ctx.raw, i), (TextBlock("[image removed]"),), "images"))
```

`compact` runs on the hot path: return quickly when there is nothing to do, and never await
network I/O (start background work in ``ctx.tasks`` instead).
"""

from __future__ import annotations

import inspect
import json
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from agentctx._check import number, preview, whole
from agentctx._log import log
from agentctx.boundaries import has_thinking, latest_user_index, loop_start_after, task_index
from agentctx.errors import ConfigError
from agentctx.ledger import DropThinking, ReplaceSpan, check_anchors

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from anyio.abc import TaskGroup

    from agentctx.budget import Budget
    from agentctx.events import Event
    from agentctx.ledger import Decision, Ledger
    from agentctx.messages import Message
    from agentctx.recall.store import RecallStore
    from agentctx.tokens import MessageCounter

__all__ = ["Chain", "CompactionContext", "CompactionStrategy", "Quiet"]


@dataclass(slots=True, kw_only=True)
class CompactionContext:
    """What a strategy sees and may do during one `ContextManager.prepare` call.

    Attributes:
        session_id: the session's id (recall ids are scoped by it).
        raw: the complete raw history; decisions anchor to its positions.
        budget: the session's budget.
        counter: counts message tokens (memoized, calibrated from reported usage).
        ledger: the session's decisions; add to it with `take`.
        recall: where cleared content is kept, if anywhere.
        clock: seconds, monotonic or wall, consistent within a session.
        idle_seconds: time since the previous model call; ``None`` on the first.
        emit: sends an event to the session's subscribers.
        tasks: the manager's task group, for background work; ``None`` outside ``async with``.
        sent: how many raw messages an earlier request already sent; decisions about the
            messages after them cost no prefix-cache write.
        give_way_above: for tiers run to land another strategy's rewrite at the target: the
            prompt size above which they may also cut what they otherwise keep (recent steps,
            their output floor); ``None``: the budget's trigger.
        followed: whether strategies run after this one in this call (`Chain` sets it): a
            strategy that leaves to them what it cannot do does it itself when none follow.
        hard_limit: the call's hard budget, where ``budget`` was lowered to land another
            strategy's rewrite (a `ToolOutputPipeline` runs its fallback at the trigger);
            ``None``: ``budget.limit``. What the tiers keep whole only while the prompt can
            meet the budget otherwise (the page just recalled) is measured against it.
    """

    session_id: str
    raw: Sequence[Message]
    budget: Budget
    counter: MessageCounter
    ledger: Ledger
    recall: RecallStore | None
    clock: Callable[[], float]
    idle_seconds: float | None
    emit: Callable[[Event], None]
    tasks: TaskGroup | None
    sent: int
    _view: Callable[[], tuple[Sequence[Message], Sequence[int]]]
    _view_tokens: Callable[[], int]
    _complete_turn: Callable[[], tuple[int, int] | None]
    _cuts: Sequence[int]
    taken: list[Decision] = field(default_factory=list)
    give_way_above: int | None = None
    followed: bool = False
    hard_limit: int | None = None
    _latest_user: Callable[[], int | None] | None = None  # None: read from `raw`
    _session: object = None  # one object for every call of one ContextManager (an identity)
    # Tokens a provider's refusal far over the estimate laid on each token of media the view
    # holds (`ContextManager._view_tokens`): what leaving an image out frees beyond its
    # estimate, until a usage report.
    _media_share: float = 0.0
    # The strategy running these tiers takes a decision that rewrites what was sent before
    # once they are done (`LlmCompaction` splicing a briefing): this call rewrites it anyway.
    _rewriting: bool = False
    _ended: bool = False  # the call ended: a strategy that kept this context takes nothing

    @property
    def view(self) -> Sequence[Message]:
        """The view as it would be sent now (rendered again after each `take`)."""
        return self._view()[0]

    @property
    def origins(self) -> Sequence[int]:
        """For each view message, the raw index it stands for."""
        return self._view()[1]

    @property
    def prompt_tokens(self) -> int:
        """Estimated prompt size of the current view, system prompt and tools included."""
        return self.counter.overhead + self._view_tokens()

    @property
    def rewinds(self) -> int:
        """How many times this session's raw history was cut back (a rewind, or an edit of a
        message the view depends on); keep it to ask `rewound_to` later."""
        return len(self._cuts)

    def rewound_to(self, rewinds: int) -> int | None:
        """The lowest raw index the history was cut back to since `rewinds` was ``rewinds``,
        or ``None`` if it was not: ``raw[:i]`` is still made of the same message objects for
        any ``i`` up to it. O(cuts since), where a copy of the prefix to compare would cost
        O(history) when taken."""
        since = self._cuts[rewinds:]
        return min(since) if since else None

    @property
    def breaking_cache(self) -> bool:
        """Whether this call rewrites what was sent before: a decision taken in it already
        does, or the strategy running these tiers will."""
        if self._rewriting:
            return True
        return bool(self.taken) and any(d.at.index < self.sent for d in self.taken)

    @property
    def protected_turn(self) -> tuple[int, int] | None:
        """View positions ``[start, end)`` of the raw history's newest complete turn, which
        no span may cover (its results and arguments may be cut down); ``None`` if none.

        Read from the raw history: in the view, a turn condensed to one line ends in an
        answer too and would pass for the newest complete one."""
        complete = self._complete_turn()
        if complete is None:
            return None
        origins = self.origins  # non-decreasing
        return bisect_left(origins, complete[0]), bisect_left(origins, complete[1])

    def undecided(self, j: int) -> Message | None:
        """The raw message ``view[j]`` shows with no decision applied, else ``None`` (replaced,
        hidden in a span, or a stub result `repair` added). Read from the ledger, not from
        identity: a message repair rewrote (a renamed duplicate call id, blank text left
        out) is still undecided. Anchor a decision on ``raw[origins[j]]``."""
        from agentctx.strategies.undecided import undecided

        return undecided(self.ledger, self.raw, self.view, self.origins, j)

    def take(self, decision: Decision) -> None:
        """Add ``decision`` to the ledger; raises `ConfigError` for one that does not fit the
        message it is anchored to or holds what no view could send (see
        `agentctx.ledger.check_fits`), for a span over what every view shows
        (`agentctx.ledger.shown_positions`: the task, the latest user message, the newest
        complete turn's question and answer, the running tool loop's signed reasoning) and for
        a thinking drop in the running tool loop, and for a decision taken after the call
        ended (a context kept by the strategy, or its background task): the view sent would
        not show it, and a resumed worker would."""
        if self._ended:
            raise ConfigError(
                f"{type(decision).__name__} taken after its prepare() call ended: decisions are "
                "taken inside compact() (keep what a background task finds, and take it on a "
                "later call's context)"
            )
        check_anchors(decision, self.raw)
        at = decision.at.index
        if decision in self.ledger.decisions_at(at) or self.ledger.span_covering(at) == decision:
            return  # in force already: taken again, it would change nothing but the ledger
        if isinstance(decision, ReplaceSpan | DropThinking):
            problem = self._hides(decision)
            if problem:
                raise ConfigError(f"{type(decision).__name__} at {decision.at.index} {problem}")
        self.ledger.add(decision, self.raw)
        self.taken.append(decision)

    def in_flight_start(self) -> int:
        """View position where the running tool loop starts (`boundaries.in_flight_start`),
        read from the raw history as `take` reads it (a result the view leaves out still
        comes before user text that steers the loop): its signed reasoning is sent back,
        and `take` refuses a `DropThinking` from there on."""
        return bisect_left(self.origins, loop_start_after(self.raw, self._latest()))

    def _latest(self) -> int | None:
        return latest_user_index(self.raw) if self._latest_user is None else self._latest_user()

    def _hides(self, decision: ReplaceSpan | DropThinking) -> str | None:
        """What ``decision`` would hide that every view keeps, else ``None``. O(the span) once
        the manager's turn tracking is current: the latest user message and the newest
        complete turn are kept up to date as messages arrive, where a scan for them would
        read a long running tool loop whole."""
        raw = self.raw
        start = decision.at.index
        latest = self._latest()
        loop = loop_start_after(raw, latest)
        if isinstance(decision, DropThinking):
            if start >= loop:
                return f"is in the running tool loop (from {loop}), whose reasoning is sent back"
            return None
        end = decision.end
        kept = [(task_index(raw), "the task"), (latest, "the latest user message")]
        complete = self._complete_turn()
        if complete is not None:
            # Its question and answer: steps a span took while the turn ran stay taken once
            # it completes (`shown_positions`). User-run shell output is cut down as a tool
            # result is, one message for one.
            question, answer = complete[0], complete[1] - 1
            cut_down = (
                end == start + 1
                and raw[start].extra.get("source") == "bash_execution"
                and len(decision.replacement) == 1
                and type(decision.replacement[0]) is type(raw[start])
            )
            if not cut_down:
                kept.append((question, "the newest complete turn's question"))
            kept.append((answer, "the newest complete turn's answer"))
        kept += [
            (i, "signed reasoning of the running loop")
            for i in range(max(start, loop), end)
            if has_thinking(raw[i])
        ]
        for i, what in kept:
            if i is not None and start <= i < end:
                return f"would hide raw message {i} ({what}), which every view keeps"
        return None


@runtime_checkable
class CompactionStrategy(Protocol):
    """Decides what to compact. One required method."""

    async def compact(self, ctx: CompactionContext) -> Quiet | None:
        """Add decisions to ``ctx`` (or none); must not await network I/O. Having taken
        none, it may return a `Quiet`: the later calls it would take none on either, which
        the manager then does not make."""
        ...


@dataclass(frozen=True, slots=True)
class Quiet:
    """What `compact` may return when it took nothing: a promise to take nothing on a later
    call either, as long as the prompt is at most ``tokens`` (as ``ctx.prompt_tokens``
    counts it) and the call comes at most ``idle_seconds`` after the one before (``None``:
    whatever the gap). The manager holds it only while nothing else a strategy could read
    changed: the history only grew, no decision was taken and none dropped, the budget is
    the same, and the strategy is the same object. On the calls it holds for, the manager
    does not call ``compact`` at all, which is most of what a call that decides nothing costs
    beyond taking in the new messages.

    Return one only for what ``compact`` decides on from those alone (the prompt's size,
    the budget, the idle gap). A strategy whose next call depends on more (background work
    that may finish, its own count of calls, the content of new messages) returns ``None``,
    and is called every time.
    """

    tokens: int
    idle_seconds: float | None = None

    def __post_init__(self) -> None:
        whole(self, "tokens")
        number(self, "idle_seconds", optional=True)


@dataclass(frozen=True, slots=True)
class Chain:
    """Runs strategies in order, cheapest first; each sees the decisions of those before it."""

    strategies: tuple[CompactionStrategy, ...]

    def __init__(self, strategies: Sequence[CompactionStrategy]) -> None:
        if not isinstance(strategies, Iterable) or isinstance(strategies, str):
            raise ConfigError(f"Chain takes a list of strategies, got {preview(strategies)}")
        object.__setattr__(self, "strategies", tuple(map(check_strategy, strategies)))

    async def compact(self, ctx: CompactionContext) -> Quiet | None:
        """Run each strategy in turn; quiet where every one of them is."""
        together: Quiet | None = None
        quiet = True
        followed, last = ctx.followed, len(self.strategies) - 1
        try:
            for k, strategy in enumerate(self.strategies):
                ctx.followed = followed or k < last
                said = checked_result(strategy, await strategy.compact(ctx))
                if not quiet:
                    continue
                if not isinstance(said, Quiet):
                    quiet = False
                elif together is None:
                    together = said
                elif said is not together:
                    together = _tighter(together, said)
        finally:
            ctx.followed = followed
        return together if quiet else None

    def close(self, emit: Callable[[Event], None]) -> None:
        """Tell each strategy that has a ``close`` that the session ended; the first error
        one raises is raised after every one was told (the others' noted on it)."""
        errors: list[BaseException] = []
        for strategy in self.strategies:
            try:
                end_session(strategy, emit)
            except BaseException as error:  # an interrupt too, once every one was told
                errors.append(error)
        if errors:
            for other in errors[1:]:
                errors[0].add_note(f"another strategy's close() raised too: {other!r}")
            raise errors[0]

    def hand_over(self) -> object:
        """What each strategy hands the session's next worker (`hand_over`), in order, each
        checked on its own (one left out leaves the others); ``None`` when none hands
        anything."""
        return self.hand_over_within(_MOST_HANDOVER_CHARS)

    def hand_over_within(self, room: int) -> object:
        """`hand_over`, the strategies' together in ``room`` characters of JSON: the first in
        the chain first (one that does not fit what is left is left out, logged)."""
        states = []
        room -= 2 + 5 * len(self.strategies)  # the list around them: brackets, commas, nulls
        for strategy in self.strategies:
            state, size = _handed(strategy, room)
            states.append(state)
            room -= size
        return states if any(state is not None for state in states) else None

    def take_over(self, state: object) -> None:
        """Give each strategy what its counterpart in the last worker's chain handed over
        (one that raises leaves the others theirs); a chain of another length takes none."""
        if not isinstance(state, list) or len(state) != len(self.strategies):
            log.warning("a hand-over of another chain is not taken", handed=preview(state))
            return
        for strategy, own in zip(self.strategies, state, strict=True):
            if own is not None:
                take_over(strategy, own)


def _tighter(a: Quiet, b: Quiet) -> Quiet:
    """What holds where both ``a`` and ``b`` do."""
    idle = a.idle_seconds if b.idle_seconds is None else b.idle_seconds
    if a.idle_seconds is not None and b.idle_seconds is not None:
        idle = min(a.idle_seconds, b.idle_seconds)
    return Quiet(min(a.tokens, b.tokens), idle)


def checked_result(strategy: object, said: object) -> Quiet | None:
    """What ``strategy.compact`` returned, if it is what the protocol allows (`Quiet` or
    ``None``); else `ConfigError` (a coroutine, from an ``await`` left out, is closed)."""
    if said is None or isinstance(said, Quiet):
        return said
    if inspect.iscoroutine(said):
        said.close()
        raise ConfigError(
            f"{type(strategy).__name__}.compact returned a coroutine: an await is missing"
        )
    raise ConfigError(
        f"{type(strategy).__name__}.compact returned {preview(said)}: it returns a Quiet or None"
    )


def check_strategy(strategy: object) -> CompactionStrategy:
    """``strategy`` if it has an async ``compact`` method, else `ConfigError`."""
    if isinstance(strategy, type):  # its compact would take the context for ``self``
        raise ConfigError(
            f"a strategy is an instance, not a class: {strategy.__name__}() rather than "
            f"{strategy.__name__}"
        )
    compact = getattr(strategy, "compact", None)
    if not callable(compact) or not inspect.iscoroutinefunction(compact):
        raise ConfigError(
            f"a strategy needs an `async def compact(self, ctx)` method; got {strategy!r:.80}"
        )
    return strategy  # type: ignore[return-value]


_MOST_HANDOVER_CHARS = 1 << 19  # of JSON: a saved state is read whole by the next worker


def state_to_hand_over(strategy: CompactionStrategy) -> object:
    """``strategy.hand_over()`` if it has one: the optional hook a strategy with paid work
    outstanding (a briefing not yet spliced) uses to hand it to the session's next worker
    (JSON-able data, kept in `ContextManager.session_state`; ``None``: nothing). That
    worker's strategy gets it in its ``take_over(state)``. What it gives that is no JSON,
    over half a megabyte of it, or a hook that raises, is left out, and logged: never
    raises."""
    return _handed(strategy, _MOST_HANDOVER_CHARS)[0]


def _handed(strategy: CompactionStrategy, room: int) -> tuple[object, int]:
    """What ``strategy`` hands over if it fits ``room`` characters of JSON, and their count
    (``(None, 0)``: nothing, or left out and logged)."""
    hook = getattr(strategy, "hand_over", None)
    if not callable(hook):
        return None, 0
    name = type(strategy).__name__
    try:
        # A Chain's own hand-over is held to the room as a whole, its strategies in order.
        whole = isinstance(strategy, Chain) and type(strategy).hand_over is Chain.hand_over
        state = strategy.hand_over_within(room) if whole else hook()  # type: ignore[attr-defined]
        if state is None:
            return None, 0
        text = json.dumps(state, separators=(",", ":"), allow_nan=False)
        if json.loads(text) != state:  # what JSON would change (keys, tuples) is no JSON
            raise ValueError("it does not come back from JSON as it went")
        size = len(text)
    except Exception as e:  # a strategy's own hook, or what it gave: no JSON
        log.warning("a strategy's hand-over is left out", strategy=name, error=repr(e))
        return None, 0
    if size > room:
        log.warning("a strategy's hand-over is left out: too large", strategy=name, chars=size)
        return None, 0
    return state, size


def take_over(strategy: CompactionStrategy, state: object) -> None:
    """``strategy.take_over(state)`` if it has one (see `state_to_hand_over`); one that
    raises is logged, never raised."""
    hook = getattr(strategy, "take_over", None)
    if callable(hook):
        try:
            hook(state)
        except Exception as e:  # a strategy's own hook: the rest of the state is taken
            name = type(strategy).__name__
            log.warning("a strategy did not take its hand-over", strategy=name, error=repr(e))


def end_session(strategy: CompactionStrategy, emit: Callable[[Event], None]) -> None:
    """Call ``strategy.close(emit)`` if it has one: the optional hook a strategy with work
    outstanding (a billed briefing not yet spliced) uses to report it when the session ends."""
    close = getattr(strategy, "close", None)
    if callable(close):
        close(emit)
