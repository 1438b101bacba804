"""`ContextManager`: one session's history, decisions, events and background work.

```python
async with ContextManager(Budget(context_window=200_000)) as ctx:
    while True:
        view = await ctx.prepare(history)      # before each model call; never waits on I/O
        response = await client.messages.create(messages=to_provider(view), ...)
        ctx.observe(usage)                     # after it: calibrates the token accounting
        history.append(...)
```

``prepare`` works in both modes. **Projection mode**: keep your full history and pass all of
it every time; agentctx returns the compacted view for this call. **Owned mode**: keep what
``prepare`` returned, append to it, and pass that back. Either way it finds the new messages
by comparing the input with what it already knows, in O(new messages); if the input extends
neither (you rewound or edited history), it resynchronizes at the longest common prefix,
drops the decisions after it and emits `HistoryResynced`.
"""

from __future__ import annotations

import bisect
import contextvars
import json
import math
import reprlib
import sys
import threading
import time
import uuid
from collections import deque
from typing import TYPE_CHECKING, Any, Self

import anyio

from agentctx import telemetry
from agentctx._check import preview
from agentctx._follow import (
    common_prefix,
    extends_raw,
    extends_view,
    newest_reply,
    raw_from,
    read_once,
    shown_until,
    sliceable,
    view_below,
)
from agentctx._log import log, warm_logger
from agentctx._overflow import Overflow, floor_share, overflow_of
from agentctx._usage import ACCEPTED, states_counts_only, usage_of
from agentctx.boundaries import task_index
from agentctx.budget import Budget, BudgetExceededError
from agentctx.errors import ConfigError, StoreDataError, StoreError, UnsupportedMessageError
from agentctx.events import (
    BudgetExceeded,
    CompactionWarning,
    Event,
    EventHub,
    HistoryResynced,
    Subscriber,
    TranscriptRepaired,
    repaired_index,
)
from agentctx.ledger import Ledger, protected_positions, shown_positions
from agentctx.messages import (
    MOST_TOKENS,
    USAGE_RULE,
    AssistantMessage,
    ImageBlock,
    Message,
    SummaryMessage,
    Usage,
    UserMessage,
    bad_usage_field,
    check_history,
    sent_at,
)
from agentctx.recall.store import LedgerStore, RecallStore, SessionStateStore
from agentctx.recall.tool import recall_arguments, recall_page
from agentctx.recall.writer import RecallWriter
from agentctx.strategies.deterministic import DeterministicCompaction
from agentctx.strategy import (
    CompactionContext,
    Quiet,
    check_strategy,
    checked_result,
    end_session,
    state_to_hand_over,
    take_over,
)
from agentctx.tokens import MessageCounter
from agentctx.tokens.estimate import exact_encoder_needed, image_tokens, load_exact_encoder
from agentctx.view import ViewState

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator, Sequence
    from types import TracebackType

    from anyio.abc import TaskGroup, TaskStatus

    from agentctx.ledger import Decision
    from agentctx.strategy import CompactionStrategy

__all__ = ["ContextManager"]

# How much a message can cost beyond its quick count (characters / 3, JSON / 3.5), in quick
# counts: no token is shorter than one character (one UTF-8 byte beyond ASCII), so at most
# 3.5x in all, 2.5x beyond. A measured "densest" ratio is not a bound: 400 lines of "ok N"
# came to 1.77x.
_BEYOND_QUICK = 2.5

# The manager whose strategy the current task (or one it started) is running `compact` of.
_COMPACTING: contextvars.ContextVar[ContextManager] = contextvars.ContextVar("agentctx_compacting")
_CLOSE_SECONDS = 5.0  # the most a close waits for background work and async subscribers
_THRASH_CALLS = 3  # prefix rewrites within the last twice as many calls that earn a warning
_THRASH_WINDOW = (1 << 2 * _THRASH_CALLS) - 1  # those calls, one bit each, newest lowest
_CACHE_TTL_SECONDS = 300.0  # the providers' default prompt-cache lifetime
_REFUSED_MARGIN = 1.02  # on the share of a refusal's excess laid on the media a view keeps
_MOST_OVER_ESTIMATE = 4  # the most calibration scales an estimate by (`Calibration`)
_MAX_SHORT_FRACTION = 10  # a report raises its view's estimate by a tenth of it (or the limit)
_EARLIER_VIEWS = 8  # views changed by decisions or rewinds that an owned caller can go back to
_UNSENT_MARGIN = 0.1  # how much more messages no request has sent yet may cost than estimated


def _interrupted(error: BaseException, taken: Sequence[Decision]) -> CompactionWarning:
    """What a call cut short after its strategy took ``taken`` says of them: they stay (the
    strategy may have reported some, or spent a paid briefing on them), and the next view
    shows them, so the view changes where no event of that call explains it."""
    reasons = ", ".join(sorted({d.reason for d in taken}))
    return CompactionWarning(
        "interrupted",
        f"prepare() ended with {type(error).__name__} after the strategy took {len(taken)} "
        f"decision(s) ({reasons}); they stay in the ledger, and the next view shows them",
    )


_STATE_EVERY = 60.0  # seconds of session time between saves of its state, at least
_LATEST_TIME = 253_402_300_800  # epoch seconds of the year 10000: no call is later
_MOST_STATE_CHARS = 1 << 20  # a saved state is about a kilobyte: past this it is not one
_OPEN = object()  # `ContextManager._handover` until the close takes it


def _read_state(store: LedgerStore, session_id: str) -> dict[str, Any] | str | None:
    """The session's saved state (`SessionStateStore`) parsed, in the caller's thread (a
    worker's, never the loop's); why it cannot be taken; or ``None`` when none is saved.
    Never raises: a state that is down or unreadable leaves the ledger to be read."""
    if not isinstance(store, SessionStateStore):
        return None
    try:
        saved = store.load_state(session_id)
    except Exception as e:  # a store's own error type too
        try:
            detail = f": {preview(str(e))}"
        except Exception:  # an error whose text cannot be made
            detail = ""
        return f"the store did not give it: {type(e).__name__}{detail}"
    return None if saved is None else _parse_state(saved)


def _parse_state(saved: object) -> dict[str, Any] | str:
    """A saved state parsed, or why it is not one (never raises)."""
    if type(saved) is not str:  # a subclass's own methods may do anything
        return f"not a state: a {type(saved).__name__}"
    if len(saved) > _MOST_STATE_CHARS:
        return f"not a state: {len(saved)} characters"
    try:
        state = json.loads(saved)
    except (ValueError, RecursionError) as e:
        return f"not JSON: {type(e).__name__}"
    if (
        not isinstance(state, dict)
        or type(state.get("version")) is not int
        or state["version"] != 1
    ):
        return f"not a state of this version: {preview(saved)}"
    return state


def _refusal_part(value: object) -> tuple[float, float, int] | None:
    """The excess, media and raw history's length a saved refusal's part begins with (see
    `ContextManager.session_state`), or ``None`` when ``value`` holds no such thing."""
    if not isinstance(value, list) or len(value) < 3:
        return None
    excess, media, raw = value[:3]
    for tokens, least in ((excess, 0), (media, 1)):  # media: a share is laid per token of it
        if type(tokens) not in (int, float) or not least <= tokens <= MOST_TOKENS:
            return None  # (NaN fails the range)
    if type(raw) is not int or not 0 < raw < 1 << 40:
        return None
    return float(excess), float(media), raw


def _checked(clock: Callable[[], float]) -> Callable[[], float]:
    """``clock``, its readings checked: a time that is no finite number (a clock returning
    None, a string, NaN) fails at the read as `ConfigError`, not deep in a strategy's
    arithmetic."""

    def now() -> float:
        t = clock()
        if (type(t) is float and math.isfinite(t)) or (type(t) is int and abs(t) < 2**62):
            return t
        raise ConfigError(f"the clock returned {preview(t)}, not epoch seconds")

    return now


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    """The exceptions of ``group`` and of the groups inside it, in order."""
    for e in group.exceptions:
        if isinstance(e, BaseExceptionGroup):
            yield from _leaves(e)
        else:
            yield e


class ContextManager:
    """Keeps one agent session inside its budget.

    Args:
        budget: the token budget; a bare int is a context window with default ratios.
        strategy: what compacts; default `DeterministicCompaction()`.
        counter: token accounting; default `MessageCounter()` (content-aware estimator).
        recall: where cleared content is kept so `recall` can return it.
        session_id: scopes recall ids and names the saved ledger (a non-empty string); a
            random one by default.
        ledger: decisions to resume from (e.g. ``Ledger.from_json(saved)``), under the
            ``session_id`` that took them (their recall ids belong to it). Without it, a
            ``recall`` store that keeps ledgers (`LedgerStore`) resumes the session's saved
            one, read in a worker thread when the manager is entered (or on its first
            `prepare`), within the recall writer's deadline; a saved ledger that cannot be
            read, or a store that is down, is reported once (`CompactionWarning`
            ``ledger_unreadable`` or ``ledger_unavailable``, on the first `prepare`) and the
            decisions start over — pass ``ledger=Ledger()`` to start over explicitly. Either
            way the first `prepare` drops the decisions that do not fit its history: an
            anchor that no longer matches, a span over what that history protects (its
            latest user message, its newest complete turn).
        state: with ``ledger``, what the session's last worker's `session_state` returned:
            this one then counts with its calibration and knows when it last called the
            model (a `SessionStateStore` does this by itself). One that cannot be taken is
            said on the first `prepare` (`CompactionWarning` ``state_unreadable``).
        on_over_budget: ``"raise"`` (default) raises `BudgetExceededError` carrying the best
            view; ``"send"`` returns that view anyway. Both emit `BudgetExceeded`.
        clock: wall-clock seconds (``time.time``; replays and tests pass their own). Message
            ages come from it and from ``extra["timestamp"]`` (epoch milliseconds).
        tracer: where to report deciding `prepare` calls and summarizer requests (see
            `agentctx.telemetry`; OpenTelemetry: `agentctx.integrations.otel.OtelTracer`).
    """

    # Declared, so that reading them stays on CPython's fast path however many there are;
    # ``__dict__`` and ``__weakref__`` keep what a plain class allows (patching a method on
    # an instance, a weak reference).
    __slots__ = (
        "__dict__",
        "__weakref__",
        "_adopted",
        "_taking_over",
        "_state_noted",
        "_background_done",
        "_rewrites",
        "_thrash_told",
        "_clock",
        "_closed",
        "_closing",
        "_closed_under_call",
        "_counter",
        "_hub",
        "_last_call",
        "_handover",
        "_on_over_budget",
        "_preparing",
        "_quiet",
        "_rendered_version",
        "_repairs_seen",
        "_report",
        "_report_arrived",
        "_reported",
        "_refused_kept",
        "_refused_media",
        "_reported_view",
        "_resumed",
        "_to_load",
        "_sent",
        "_unsent",
        "_settling",
        "_startup_events",
        "_state",
        "_task_group",
        "_tasks",
        "_tracer",
        "_turns",
        "_writer",
        "budget",
        "recall_store",
        "session_id",
        "strategy",
        "usage",
    )

    def __init__(
        self,
        budget: Budget | int,
        *,
        strategy: CompactionStrategy | None = None,
        counter: MessageCounter | None = None,
        recall: RecallStore | None = None,
        session_id: str | None = None,
        ledger: Ledger | None = None,
        state: str | None = None,
        on_over_budget: str = "raise",
        clock: Callable[[], float] = time.time,
        tracer: telemetry.Tracer | None = None,
    ) -> None:
        if on_over_budget not in ("raise", "send"):
            raise ConfigError(f"on_over_budget is 'raise' or 'send', got {on_over_budget!r}")
        self.budget = budget if isinstance(budget, Budget) else Budget(context_window=budget)
        self.strategy: CompactionStrategy = (
            DeterministicCompaction() if strategy is None else check_strategy(strategy)
        )
        if counter is not None and not isinstance(counter, MessageCounter):
            raise ConfigError(f"counter is a MessageCounter or None, got {preview(counter)}")
        if ledger is not None and not isinstance(ledger, Ledger):
            raise ConfigError(
                f"ledger is a Ledger (Ledger.from_json(text) reads a saved one) or None, got "
                f"{preview(ledger)}"
            )
        if not callable(clock):
            raise ConfigError(f"clock is a function returning epoch seconds, got {preview(clock)}")
        if state is not None and (not isinstance(state, str) or ledger is None):
            raise ConfigError(
                "state is what session_state() returned (a str), passed with the ledger it "
                f"goes with; got {preview(state)}" + ("" if ledger is not None else " alone")
            )
        self._counter = counter or MessageCounter()
        if recall is not None and not isinstance(recall, RecallStore):
            raise ConfigError(
                "recall is a RecallStore (MemoryRecallStore(), SQLiteRecallStore(path), "
                f"RedisRecallStore(url)) or None, got {preview(recall)}"
            )
        if tracer is not None and not isinstance(tracer, telemetry.Tracer):
            raise ConfigError(f"tracer is a Tracer (OtelTracer()) or None, got {preview(tracer)}")
        self.recall_store = recall
        if session_id is not None and (type(session_id) is not str or not session_id):
            # An empty one replaced by a random one would resume nothing, silently.
            raise ConfigError(f"session_id is a non-empty string or None, got {session_id!r}")
        self.session_id = uuid.uuid4().hex if session_id is None else session_id
        self.usage = Usage()
        self._on_over_budget = on_over_budget
        self._clock = _checked(clock)
        self._tracer = tracer
        self._resumed = False
        self._startup_events: list[Event] = []
        self._rewrites = 0  # of the last calls, those that rewrote the cached prefix (bits)
        self._thrash_told = False
        self._implausible_reported = False  # a report no request of this view could make
        self._close_error: BaseException | None = None  # what the strategy's close() raised
        # A saved ledger is read off the event loop, when the manager is entered or on the
        # first call, whichever comes first: a store that does not answer must not stall it.
        self._to_load = recall if ledger is None and isinstance(recall, LedgerStore) else None
        self._adopted = ledger is not None  # checked against the first history (`_prepare`)
        self._taking_over = self._adopted  # a session another worker ran (`_prepare`)
        self._state_noted = -math.inf  # when the state was last marked to be saved
        self._state = ViewState(self._counter, ledger)
        self._hub = EventHub()
        # Strategies put into the writer; it writes to the store off the event loop.
        self._writer = None if recall is None else self._new_writer(recall, self._state.ledger)
        self._tasks: TaskGroup | None = None
        self._task_group: TaskGroup | None = None  # while entered (`async with`)
        self._thread: int | None = None  # the thread whose event loop entered it
        self._repairs_seen = -1
        self._sent = 0
        # Quick counts of messages in the view no full count has checked since the view was
        # last refined whole: what its estimate can fall short by grows with them.
        self._unrefined = 0
        # The view the last usage report was on, as (ledger version, view epoch), the raw
        # length then, and how far its estimate fell short of the provider's count (an
        # overestimate is not carried: it only makes compaction come a little early, and
        # calibration corrects it).
        self._reported_view = ((-1, -1), 0, 0)
        # A refusal over four times the estimate, of a view holding media compaction may
        # leave out: their part of what no fit explained, those media, and the raw history's
        # length and rewinds then, the history it applies to and those grown from it (see
        # `_calibrate`).
        self._refused_media: tuple[float, float, int, int] | None = None
        self._unsent = (0, 0)  # `_sent`, and the count of what follows it, as this call has them
        # Such a refusal's part laid on the media of the user messages no compaction leaves
        # out (`_media_holders`): that part, those media, the raw history's length and
        # rewinds then, and the raw indices of those messages.
        self._refused_kept: tuple[float, float, int, int, tuple[int, ...]] | None = None
        self._report: int | None = None  # prompt tokens of a usage report not applied yet
        self._limit_sent = self.budget.limit  # the hard limit of the last `prepare`
        self._settling = threading.Lock()
        self._report_arrived: anyio.Event | None = None
        self._last_call: float | None = None
        # What the strategy hands the next worker, as it was at close (`session_state`).
        self._handover: object = _OPEN
        self._reported: set[tuple[str, int, str | None]] = set()
        self._rendered_version = self._state.ledger.version
        self._closing = False
        self._closed_under_call = False  # a call outlived the close's wait for it
        self._slow_close_said = False
        self._closed = False
        self._background_done: anyio.Event | None = None
        # Whether a `prepare` call is running, and the calls waiting for it to end.
        self._preparing = False
        self._turns: list[anyio.Event] = []
        # The `Quiet` the strategy last returned, with what it holds for (`_still_quiet`).
        self._quiet: tuple[Quiet, CompactionStrategy, Budget, Ledger, int, int] | None = None
        # The last histories given as views (owned mode) that their calls changed (a decision,
        # a repair), each with the raw length it stood for and how many of its messages the
        # call appended: a retry passes one again, or goes back to it (`_follows_retried`).
        self._retriable: deque[tuple[list[Message], int, int]] = deque(maxlen=_EARLIER_VIEWS)
        # Views decisions or rewinds changed, as calls found them, with their origins and the
        # raw length they stood for: a view an owned caller may go back to (`_resync`).
        self._earlier: deque[tuple[list[Message], list[int], int]] = deque(maxlen=_EARLIER_VIEWS)
        self._kept_view = True  # whether this call kept its view in `_earlier` (or no call runs)
        # How many of the last input's messages stand one for one for the last raw ones
        # (what the call appended): the rest stands for the raw history before them whole.
        self._fresh = 0
        if state is not None and (warning := self._take_over(_parse_state(state))) is not None:
            self._startup_events.append(warning)

    def _new_writer(self, store: RecallStore, ledger: Ledger) -> RecallWriter:
        return RecallWriter(
            store,
            self.session_id,
            emit=self._hub.emit,
            ledger=ledger,
            saved=self._resumed,
            state=self.session_state,
        )

    def session_state(self) -> str:
        """What a worker resuming the session needs besides its decisions to count and time
        as this one does: the calibration, when the model was last called, a refusal of the
        prompt no usage report has answered yet, and what its strategy hands over (a briefing
        that waits to be spliced: the next worker splices it instead of paying for another)
        (JSON). A `SessionStateStore` keeps it by itself; resuming by hand, save it with
        ``ctx.ledger.to_json()`` before the manager closes and pass both back:
        ``ContextManager(..., ledger=Ledger.from_json(saved), state=saved_state)``."""
        state: dict[str, Any] = {
            "version": 1,
            "last_call": self._last_call,
            "calibration": self._counter.calibration_state(),
        }
        media, kept = self._refused_media, self._refused_kept
        if media is not None or kept is not None:
            # A refusal no usage report has answered yet: the next worker's retry counts it.
            state["refused"] = {
                "media": None if media is None else media[:3],
                "kept": None if kept is None else (*kept[:3], kept[4]),
            }
        # (Checked, never raising: the recall writer asks, off any call of the caller's.)
        handover = state_to_hand_over(self.strategy) if self._handover is _OPEN else self._handover
        if handover is not None:
            state["strategy"] = handover
        return json.dumps(state, separators=(",", ":"))

    def _take_over(self, state: dict[str, Any] | str) -> CompactionWarning | None:
        """Start from the state the last worker saved (`session_state`, parsed by
        `_read_state`, or why it cannot be); the warning to emit when it is not taken."""
        self._taking_over = True
        if isinstance(state, str):
            return self._state_not_taken(state)
        last: Any = state.get("last_call")
        if type(last) in (int, float) and 0 <= last < _LATEST_TIME:
            self._last_call = float(last)
        handed = state.get("strategy")
        if handed is not None:
            take_over(self.strategy, handed)  # (never raises: its error costs it alone)
        refused = state.get("refused")
        if isinstance(refused, dict):
            self._take_refusal(refused)
        calibration = state.get("calibration")
        counter = self._counter
        # A counter of one's own that is calibrated already keeps its calibration.
        if calibration is None or counter.observations or counter.restore_calibration(calibration):
            return None
        return self._state_not_taken(
            "its calibration does not fit this worker's counter, or the reports saved with it"
        )

    def _take_refusal(self, refused: dict[str, Any]) -> None:
        """Count a refusal the last worker observed and no usage report answered (the
        ``refused`` of `session_state`) on the history it refused and those grown from it, as
        that worker would have. What is no such refusal is left out."""
        media, kept = refused.get("media"), refused.get("kept")
        if (part := _refusal_part(media)) is not None:
            self._refused_media = (*part, 0)
        if (part := _refusal_part(kept)) is not None and isinstance(kept, list) and len(kept) > 3:
            holders = kept[3]
            if (
                isinstance(holders, list)
                and 0 < len(holders) <= 3
                and all(type(i) is int and 0 <= i < part[2] for i in holders)
            ):
                self._refused_kept = (*part, 0, tuple(holders))

    def _state_not_taken(self, why: str) -> CompactionWarning:
        log.warning("saved session state not taken", why=why)
        return CompactionWarning(
            "state_unreadable",
            f"the session's saved state (calibration, last call) was not taken ({why}); this "
            "worker counts uncalibrated until its first usage report",
        )

    async def _resume(self) -> None:
        """Read the session's saved ledger (`_load_ledger`), then its saved state
        (`_read_state`), each in a worker thread within the recall writer's deadline, and
        start from them. A state that is slow or down costs the state, never the ledger."""
        store = self._to_load
        assert store is not None and self._writer is not None
        deadline = self._writer.deadline
        loaded: tuple[Ledger | None, tuple[str, Exception] | None] = (None, None)
        with anyio.move_on_after(deadline) as waited:
            loaded = await anyio.to_thread.run_sync(
                self._load_ledger, store, abandon_on_cancel=True
            )
        # Only now: a call cancelled from outside while the store was read (it raised above)
        # leaves the ledger to be read by the next one, not lost.
        self._to_load = None
        ledger, problem = loaded
        if waited.cancelled_caught:
            problem = ("ledger_unavailable", StoreError(f"no answer within {deadline:g} s"))
        if problem is not None:
            self._startup_events.append(self._start_over(*problem))
        else:
            state: dict[str, Any] | str | None = f"no answer within {deadline:g} s"
            with anyio.move_on_after(deadline):
                state = await anyio.to_thread.run_sync(
                    _read_state, store, self.session_id, abandon_on_cancel=True
                )
            if state is not None and (warning := self._take_over(state)) is not None:
                self._startup_events.append(warning)
        if ledger is not None:  # nothing has happened yet: the session starts from it
            self._resumed = self._adopted = self._taking_over = True
            self._state = ViewState(self._counter, ledger)
            self._writer = self._new_writer(store, ledger)

    def _load_ledger(
        self, store: LedgerStore
    ) -> tuple[Ledger | None, tuple[str, Exception] | None]:
        """The session's saved ledger, or ``None`` to start over, and why it starts over. A
        store that is down, or a ledger that cannot be read, does not stop the session: its
        decisions start over (the history is the caller's, so nothing the model needs is
        lost; the next save replaces the old ledger), and a warning says so on the first
        `prepare`. (No side effect here: a thread abandoned on a cancel may still finish.)"""
        try:
            saved = store.load_ledger(self.session_id)
        except Exception as e:  # a store's own error type too, as the recall writer maps them
            # There, but not readable (a store of another author may only chain the cause).
            garbled = isinstance(e, StoreDataError) or isinstance(e.__cause__, UnicodeDecodeError)
            return None, ("ledger_unreadable" if garbled else "ledger_unavailable", e)
        if saved is None:
            return None, None
        try:
            return Ledger.from_json(saved), None
        except StoreError as e:
            return None, ("ledger_unreadable", e)

    def _start_over(self, code: str, error: Exception) -> CompactionWarning:
        """Log that the session's decisions start over; the warning that says so."""
        log.warning("saved ledger not loaded; starting over", code=code, error=str(error))
        return CompactionWarning(code, f"{error}; decisions start over")

    # -- lifecycle ----------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._closed or self._closing:
            raise ConfigError("this ContextManager is closed: make a new one for a new session")
        if self._task_group is not None:
            raise ConfigError("this ContextManager is entered already: enter it once")
        if self._to_load is not None:
            await self._resume()
        if exact_encoder_needed(self._counter.counter):
            # About half a second, once per process, in a worker thread: the loop goes on,
            # and the session counts exactly from its first call, however busy the machine.
            await anyio.to_thread.run_sync(load_exact_encoder)
        await warm_logger()  # structlog, if logging is configured: not mid-session
        group = self._task_group = anyio.create_task_group()
        self._thread = threading.get_ident()
        outer = await group.__aenter__()
        try:
            await outer.start(self._own_background_work)
        except BaseException:
            self._task_group = self._thread = None
            await group.__aexit__(None, None, None)
            raise
        return self

    async def _own_background_work(
        self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        # Background work lives in a task group of its own, so that cancelling it (aclose)
        # never cancels the caller's code inside ``async with``. A child task that ends
        # cancelled without the manager cancelling it (someone cancelled its task) makes
        # anyio cancel the whole group; only the manager's own close may end background
        # work, so a new group takes over.
        done = self._background_done = anyio.Event()
        try:
            while not self._closing:
                try:
                    async with anyio.create_task_group() as tasks:
                        self._tasks = tasks
                        tasks.start_soon(self._settle_reports)
                        self._hub.bind(tasks)
                        if not done.is_set() and task_status is not anyio.TASK_STATUS_IGNORED:
                            task_status.started()
                            task_status = anyio.TASK_STATUS_IGNORED
                        await anyio.sleep_forever()
                except Exception as error:
                    # A task a strategy started (`CompactionContext.tasks`) failed: it is
                    # said, and a new group takes over; the caller's code is not its to end.
                    self._background_failed(error)
        finally:
            self._tasks = None
            self._report_arrived = None
            self._hub.bind(None)
            done.set()
            if self._closed and not self._hub.closed:
                # The close did not wait for this work (it ran late, or the close came from
                # inside it: an async subscriber, a strategy's task): what it left is
                # reported now, and the event streams end.
                await self._report_on_close()
                self._hub.close()

    def _background_failed(self, error: Exception) -> None:
        failures = list(_leaves(error)) if isinstance(error, BaseExceptionGroup) else [error]
        for failure in failures:
            log.error("background work failed", exc_info=failure)
            try:
                detail = f"{type(failure).__name__}: {preview(str(failure))}"
            except Exception:  # an error whose text cannot be made
                detail = type(failure).__name__
            self._hub.emit(
                CompactionWarning(
                    "background_failed",
                    f"a task started in the session's background work failed ({detail}); "
                    "the session goes on, and later background work runs in a new task group",
                )
            )

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        await self._shutdown()
        assert self._task_group is not None  # entered: `__aenter__` refuses a second entry
        try:
            exited = await self._task_group.__aexit__(exc_type, exc, tb)
        except BaseExceptionGroup as group:
            # The caller's own exception leaves ``async with`` as itself, not wrapped in a
            # group by the task groups that own the background work (one inside another);
            # so do an interrupt and an exit.
            leaves = list(_leaves(group))
            if exc is not None and all(e is exc for e in leaves):
                return False
            for e in leaves:
                if isinstance(e, KeyboardInterrupt | SystemExit):
                    raise e from None
            raise
        if exc is None:
            self._raise_close_error()
        return exited

    async def _shutdown(self) -> None:
        """End background work, then report what it left (a billed briefing never spliced),
        then close the event streams: every billed request is reported exactly once, however
        a completing request and the close interleave."""
        if self._closed:
            await self._wait_for_background()  # closed from inside that work
            return
        self._closing = True  # a call made from now on is refused
        if self._preparing and _COMPACTING.get(None) is not self:
            # Another task's call is running (its strategy awaiting): it ends first, with the
            # background work it may hand a task, so what it decides is saved and reported.
            with anyio.move_on_after(_CLOSE_SECONDS, shield=True) as wait:
                await self._wait_for_turn()
            if wait.cancelled_caught:
                self._closed_under_call = True
                self._hub.emit(
                    CompactionWarning(
                        "slow_close",
                        f"a prepare() call of another task ran {_CLOSE_SECONDS:g} s past the "
                        "close (its strategy awaiting): the session closes without it, and "
                        "the call raises ConfigError when it ends, its decisions unsaved",
                    )
                )
        if self._tasks is not None:
            self._tasks.cancel_scope.cancel()
        # Shielded and bounded: a caller being cancelled still gets the report, and work that
        # ignores cancellation holds up neither the report nor the store's last writes. An
        # async subscriber or a strategy's task closing the session is part of that work,
        # and would wait for itself: it goes on, cancelled at its next await, and the close
        # completes as the background work it belongs to ends.
        done = self._background_done
        await self._wait_for_background()
        await self._report_on_close()
        self._closed = True
        self._thread = None  # closed: no loop's any more (a call says that, not "thread")
        if done is None or done.is_set():
            self._hub.close()
        # else that work, once it ends, reports what it left and closes the hub

    async def _wait_for_background(self) -> None:
        """Wait, bounded, for the background work the close cancelled to end, and say once if
        it ignores the cancellation. Not from inside that work (it would wait for itself); a
        close from outside after one from inside still waits."""
        done = self._background_done
        # (Tasks a strategy starts while it compacts carry the mark of that call.)
        if done is None or self._hub.runs_callback() or _COMPACTING.get(None) is self:
            return
        with anyio.move_on_after(_CLOSE_SECONDS, shield=True):
            await done.wait()
        if not done.is_set() and not self._slow_close_said:
            self._slow_close_said = True
            self._hub.emit(
                CompactionWarning(
                    "slow_close",
                    f"background work ignored cancellation for {_CLOSE_SECONDS:g} s (a "
                    "summarizer call blocking in a worker thread, which nothing can cancel): "
                    "the session reports and writes what it holds now and closes when that "
                    "work ends. Give the summarizer's client a timeout.",
                )
            )

    async def _report_on_close(self) -> None:
        with anyio.move_on_after(_CLOSE_SECONDS, shield=True):
            self._hub.collect_async()
            try:
                # Before its close reports what it leaves, what a store saves for the next
                # worker is handed over (and said to be).
                writer = self._writer
                handing = writer is not None and writer.keeps_state
                self._handover = state_to_hand_over(self.strategy) if handing else None
                end_session(self.strategy, self._hub.emit)
            except BaseException as error:  # an interrupt too: it leaves once the rest is done
                # The session closes all the same (store writes, event streams, background
                # work); the error is raised once it has, unless another is on its way out.
                # Said once: after a slow close, close() is called again for what came late.
                if self._close_error is None:
                    self._close_error = error
                    warning = f"the strategy's close() raised {error!r}"
                    self._hub.emit(CompactionWarning("strategy_close", warning))
            if self._writer is not None:
                await self._writer.aclose()  # what is still unwritten, within its deadline
            await self._hub.drain()

    async def aclose(self) -> None:
        """End background work, report what it left, end event iterators (``async with``
        does this).

        Inside ``async with`` only the manager's own work is cancelled, never the caller's.
        A strategy's ``close`` that raises has its error raised here once the session is
        closed all the same (`CompactionWarning` ``strategy_close`` says it too). From a
        thread other than the one whose event loop entered it: `ConfigError`."""
        self._on_its_thread("aclose()")
        await self._shutdown()
        self._raise_close_error()

    def _raise_close_error(self) -> None:
        error, self._close_error = self._close_error, None
        if error is not None:
            raise error

    # -- events -------------------------------------------------------------------------

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call ``callback`` with every event; returns an unsubscribe function."""
        return self._hub.subscribe(callback)

    def events(self) -> AsyncIterator[Event]:
        """Async iterator over the events emitted from this call on."""
        return self._hub.stream()

    def emit(self, event: Event) -> None:
        """Send ``event`` to the subscribers (strategies use this through their context)."""
        self._hub.emit(event)

    # -- the hot path -------------------------------------------------------------------

    @property
    def ledger(self) -> Ledger:
        """The session's decisions."""
        return self._state.ledger

    @property
    def raw(self) -> list[Message]:
        """The complete raw history as agentctx recorded it: a copy, O(history) a read. The
        session goes on from what ``prepare`` is given, never from this list."""
        return list(self._state.raw)

    @property
    def prompt_tokens(self) -> int:
        """Estimated prompt size of the current view, system prompt and tools included."""
        self._settle()
        return self._counter.overhead + self._view_tokens()

    @property
    def counter(self) -> MessageCounter:
        """The session's token counter, calibrated on every usage report `observe` got."""
        self._settle()
        return self._counter

    def _view_tokens(self) -> int:
        """The view's estimate, raised by what the last report showed it to be short of while
        that view is still the one sent (no decision or rewind since): the provider's count
        of the sent prefix is exact, only what came after it is estimated."""
        state = self._state
        view, _, short = self._reported_view
        if short and view == (state.ledger.version, state.repairs_version):
            return state.tokens + short
        tokens = state.tokens
        if self._refused_media is not None and (share := self._media_share()):
            tokens += math.ceil(share * min(self._media_left(), self._refused_media[1]))
        if self._refused_kept is not None:
            tokens += self._kept_excess()
        return tokens

    def _kept_excess(self) -> int:
        """What `_view_tokens` lays on the media of the user messages compaction keeps (the
        task, the latest user message, the newest complete turn's question), of a refusal's
        excess no fit explained (all of it, or their part of a floor: `_calibrate`): they
        cost it in every view that still shows them, on the history refused or one grown
        from it, until a usage report is taken (compacting the rest until it fits, or saying
        at once that it cannot). As the provider counted: no margin. O(log view)."""
        refused = self._refused_kept
        if refused is None:
            return 0
        excess, media, raw, cuts, holders = refused
        state = self._state
        if len(state.raw) < raw or len(state.cuts) != cuts:  # cut back or edited since
            return 0
        return math.ceil(excess * min(self._media_in(holders), media) / media)

    def _media_share(self) -> float:
        """What `_view_tokens` lays on each token of media the view may leave out, of a
        refusal's excess no fit explained: until a call compacts for it (the retry, on the
        history refused or grown from it), else nothing. With a margin (2 %): the share is
        an estimate's."""
        refused = self._refused_media
        if refused is None:
            return 0.0
        excess, media, raw, cuts = refused
        state = self._state
        if len(state.raw) < raw or len(state.cuts) != cuts:  # cut back or edited since
            return 0.0
        return excess * _REFUSED_MARGIN / media

    def _media_left(self) -> float:
        """Uncalibrated tokens of the media in the view that compaction may leave out: all
        but those of the user messages it keeps (`_media_holders`; images of tool results give
        way, even the newest turn's). Found without a scan: a read costs O(log view)."""
        media = self._state.vector()[-1] - self._media_in(self._media_holders())
        return max(0.0, media)

    def _media_holders(self) -> tuple[int, ...]:
        """Raw indices of the user messages whose media no compaction leaves out: the task,
        the latest user message and the newest complete turn's question."""
        state = self._state
        turn = state.complete_turn()
        ends = (task_index(state.raw), state.latest_user(), None if turn is None else turn[0])
        return tuple(dict.fromkeys(i for i in ends if i is not None))

    def _media_in(self, holders: Sequence[int]) -> float:
        """Uncalibrated media tokens of the user messages at raw indices ``holders`` that the
        view shows. O(holders log view)."""
        state = self._state
        view, origins = state.view, state.origins
        vector = self._counter.vector
        media = 0.0
        for i in holders:
            j = bisect.bisect_left(origins, i)
            if j < len(view) and origins[j] == i and isinstance(view[j], UserMessage):
                media += vector(view[j])[-1]
        return media

    def _images(self, holders: Sequence[int]) -> list[tuple[float, bool]]:
        """The estimate of each image the view shows, and whether compaction keeps it (in a
        user message at a raw index of ``holders``). O(view): read on a refusal only."""
        state = self._state
        kept = set(holders)
        images: list[tuple[float, bool]] = []
        for m, i in zip(state.view, state.origins, strict=True):
            if not isinstance(m, SummaryMessage):
                keeps = i in kept and isinstance(m, UserMessage)
                images += ((image_tokens(b), keeps) for b in m.content if type(b) is ImageBlock)
        return images

    def _rendered_tokens(self) -> int:
        """`_view_tokens` of the view as it renders after the decisions taken so far."""
        self._current_view()
        return self._view_tokens()

    def _deciding_budget(self, budget: Budget, tokens: int) -> Budget:
        """The budget strategies decide against: near the limit, lowered by how far the
        estimate of the messages new since the last call may fall short. A calibrated
        estimate of one new message can still be a few percent low (4 % on a 10k-token
        result measured in o200k), enough to cross the hard limit unseen when the prompt
        rides just under it. The call's own check is against ``budget`` itself. Nothing on a
        first call, which renders as a resumed worker did."""
        sent, counted = self._unsent  # as the call's count left it (`_count_new_near_budget`)
        counter = self._counter
        # The margin is at most this many times their count (their base estimate at most
        # `base_spread` times it): far from the limit, nothing more to count.
        most = (1 + _UNSENT_MARGIN) * counter.base_spread - 1
        if sent == self._sent and tokens + counted * most + 1 <= budget.limit:
            return budget
        limit = budget.limit
        state = self._state
        if not 0 < self._sent < len(state.raw):
            return budget
        unsent = state.view[bisect.bisect_left(state.origins, self._sent) :]
        counted = counter.count_many(unsent)
        # A calibration that prices a class of text below its base estimate can price a new
        # message of it further below what it costs (a write's long arguments, 18 % short on
        # a pi session): the margin is taken on the base estimate where that is higher, and
        # the difference added (media as calibrated: their base estimate is a floor's guess).
        # At most the limit's worth of them can be sent: a result far over it is cut down
        # before it goes out, and a margin sized on it would leave no budget to decide on.
        base = counter.count_unshrunk(unsent)
        highest = min(max(counted, base), limit)
        margin = math.ceil(highest * _UNSENT_MARGIN) + min(max(0, base - counted), limit)
        return budget.lowered(margin) if tokens + margin > budget.limit else budget

    async def prepare(
        self, history: Sequence[Message], *, max_tokens: int | None = None
    ) -> list[Message]:
        """The view to send for ``history``: compacted, provider-valid, within the budget.

        Never mutates ``history`` and never awaits network I/O. Raises
        `UnsupportedMessageError` for an item that is not a neutral message or a history
        that holds nothing to send once repaired (only tool results answering no call), and
        `BudgetExceededError` (with the best view attached) when the budget cannot be met
        without dropping the task (unless ``on_over_budget="send"``). ``max_tokens`` is the
        output the request asks for: the budget's default reserve follows it for this call
        (`Budget.for_output`; `wrap` and the middleware pass it).

        ``history`` is either the raw history (projection mode) or the view the last call
        returned, both with new messages appended; a history cut back and extended (a rewind)
        or with a message edited is followed, dropping the decisions taken after the change.
        To keep each call O(what is new and what is shown), a raw history is compared with
        the previous one only where the view depends on it: the messages the view shows (as
        they are or repaired), those repair left out (a result answering no call) and the
        last one. Editing a message that a decision already replaced (a cleared result, a
        condensed output, a summarized stretch), or putting there what is no message,
        changes nothing sent until a change the view does depend on (a rewind, an edit of a
        shown message) has the history compared in full; to make it count at once, cut the
        history back to it for one call, then extend it again. A call retried with the
        history it was given (its request failed), alone or with new messages after it, is
        read as the history it stood for, not as a rewind, even where a decision changed
        it: it gets the same view. So is
        an owned history that goes back to a view or an input of one of the last few calls
        that decided or rewound (8); one from before a rewind (a redo) is read against what
        the session still holds, so the placeholders it shows for messages the rewind cut are
        taken for the messages. A history that follows several of these as far (an edit right
        after a summary that several views show with the same text) is read against the view
        the caller holds now.

        Calls of one session take turns: one made while another is running (its strategy
        awaiting inside `compact`) waits for it, then renders its own history. One made from
        inside the session's own strategy (its `compact`, or a task it started) would wait
        for itself: `ConfigError`. So is a call from a thread other than the one whose event
        loop entered the manager (``async with``): use `BlockingContextManager` from threads.
        """
        if self._thread is not None and threading.get_ident() != self._thread:
            self._on_its_thread("prepare()")  # checked inline first: the hot path
        if self._preparing:
            if _COMPACTING.get(None) is self:
                raise ConfigError(
                    "prepare() was called from inside this session's own strategy (its "
                    "compact, or a task it started): it would wait for the call running it, "
                    "a deadlock"
                )
            await self._wait_for_turn()
        self._preparing = True
        try:
            if self._tracer is None:
                return await self._prepare(history, max_tokens, None)
            with telemetry.prepare_call(self._tracer, self) as call:
                view = await self._prepare(history, max_tokens, call)
                call.messages_after = len(view)
                return view
        finally:
            self._preparing = False
            if self._turns:
                turns, self._turns = self._turns, []
                for turn in turns:
                    turn.set()

    def _on_its_thread(self, call: str) -> None:
        """Raise `ConfigError` when called from a thread other than the one whose event loop
        entered the manager: its background work, its turns and its state belong to that
        loop, and another thread's call would race them."""
        if self._thread is not None and threading.get_ident() != self._thread:
            raise ConfigError(
                f"{call} was called from a thread other than the one whose event loop entered "
                "this ContextManager (async with): call it on that loop, or use "
                "BlockingContextManager from threads"
            )

    async def _wait_for_turn(self) -> None:
        """Wait until no other `prepare` call runs. A strategy that awaits inside `compact`
        lets another call of the session start; taking turns, each renders the history it
        was given, not one that the other appended to. (A flag and events, not an
        `anyio.Lock`: the uncontended case costs an attribute read, the lock microseconds.)"""
        while self._preparing:
            turn = anyio.Event()
            self._turns.append(turn)
            await turn.wait()

    async def _prepare(
        self,
        history: Sequence[Message],
        max_tokens: int | None,
        call: telemetry.PrepareCall | None,
    ) -> list[Message]:
        budget = self.budget if max_tokens is None else self.budget.for_output(max_tokens)
        self._limit_sent = budget.limit
        if self._closed or self._closing:
            raise ConfigError("this ContextManager is closed")
        if type(history) is not list and not sliceable(history):
            history = read_once(history)
        if self._to_load is not None:
            await self._resume()
        if self._startup_events:
            for event in self._startup_events:
                self._hub.emit(event)
            self._startup_events.clear()
        self._settle()
        state = self._state
        if self._adopted:
            # Decisions made elsewhere must fit the history they are applied to, anchor by
            # anchor, before it renders under them (the raw history is still empty).
            check_history(history)
            stale = state.ledger.drop_stale(history)
            misfit = state.ledger.misfit(history)
            unreadable = misfit is not None
            if unreadable:
                # A decision no strategy could have taken here (forged reasoning, blocks no
                # result holds): the ledger was edited or corrupted, and is read as one
                # that cannot be read.
                error = StoreError(f"the ledger holds {misfit}")
                self._hub.emit(self._start_over("ledger_unreadable", error))
                stale = state.ledger.drop_from(0)
        # What the view is rendered under: a view-mode call that changes it (a decision taken
        # or dropped, a repair) returns other than it was given, and may be retried.
        marks = (state.ledger.version, state.repairs_version)
        as_view = self._sync(history)
        self._kept_view = False
        tokens = self._count_new_near_budget(budget)
        if self._taking_over:
            self._taking_over = False
            # A worker's first call on a session another one ran: the prompt of the newest
            # reply, every message before it, was sent (the last worker's own ``sent`` when
            # it was given this history). Read as unsent, what that worker held back to keep
            # the cache warm would be taken at once, rewriting the cached prefix.
            reply = newest_reply(state.raw)
            self._sent = 0 if reply is None else reply
            replied = None if reply is None else sent_at(state.raw[reply])
            if replied is not None and replied > self._clock():
                replied = None  # stamped ahead of this clock (skew): no time to go by
            if replied is not None and (self._last_call is None or replied > self._last_call):
                # Unsaved (a ledger handed over by hand), or saved before the last calls (a
                # worker killed between saves): the newest reply's own time says how long
                # the prompt cache has been idle, where the messages carry one.
                self._last_call = replied
        if self._adopted:
            self._adopted = False
            # They must also leave in view what every view shows: a history cut back after a
            # span's end keeps its anchors, while its latest user message or newest complete
            # turn may now sit inside the span. On the history they were made on (or one
            # that only grew) neither drops anything, and this worker renders exactly the
            # view the last one did.
            hiding = state.ledger.drop_protected(state.raw, shown_positions(state.raw))
            if stale or hiding:
                if not unreadable:
                    # Decisions that do not fit the history they resume on (cut back, edited,
                    # converted otherwise by another version): read as a rewind.
                    dropped = [*stale, *hiding]
                    at = min(d.at.index for d in dropped)
                    self._hub.emit(HistoryResynced(at, len(dropped)))
                state.rebuild()
                # What the dropped decisions hid is in view again, on quick counts: counted
                # in full, as the view was above, so the strategies decide on the view sent.
                self._counter.refine(self._current_view()[0])
                self._unrefined = 0
                tokens = self.prompt_tokens
        now = self._clock()
        idle = None if self._last_call is None else now - self._last_call
        deciding = self._deciding_budget(budget, tokens)
        taken: Sequence[Decision] = ()
        ran = (
            call is not None or self._quiet is None or not self._still_quiet(deciding, tokens, idle)
        )
        if ran:
            ctx = CompactionContext(
                session_id=self.session_id,
                raw=state.raw,
                budget=deciding,
                counter=self._counter,
                ledger=state.ledger,
                recall=self._writer,
                clock=self._clock,
                idle_seconds=idle,
                emit=self._hub.emit,
                tasks=self._tasks,
                sent=self._sent,
                _view=self._current_view,
                _view_tokens=self._rendered_tokens,
                _complete_turn=state.complete_turn,
                _latest_user=state.latest_user,
                _cuts=state.cuts,
                _session=self,
                _media_share=self._media_share(),
            )
            if call is not None:
                call.start(ctx, tokens, budget.limit)
            # Run to a fixed point, so calling prepare() again on the same history takes
            # nothing new (a strategy's decisions can make room for another's, or for its own
            # next step).
            strategy = self.strategy
            self._quiet = None  # until this run says otherwise (one that raises says nothing)
            compacting = _COMPACTING.set(self)  # a nested prepare() would wait for itself
            try:
                for _ in range(4):
                    n = len(ctx.taken)
                    quiet = checked_result(strategy, await strategy.compact(ctx))
                    if len(ctx.taken) == n:
                        break
                    # What the decisions put in the view (a cut result, a marker) was counted
                    # at a few characters a token: in full before the view is measured again,
                    # so none rides under the limit on a first estimate (dense output, cut
                    # to 20k characters, costs up to twice that).
                    self._counter.refine(self._current_view()[0])
                    self._unrefined = 0
            except BaseException as e:
                if ctx.taken:
                    self._hub.emit(_interrupted(e, ctx.taken))
                raise
            finally:
                ctx._ended = True
                _COMPACTING.reset(compacting)
                # A strategy that raised, or was cancelled while it awaited, after taking a
                # decision leaves it in the ledger (saved with the next): the view renders it
                # now, as a resumed worker would, not on some later render.
                self._current_view()
                self._remember_input(history, as_view, marks)  # cancelled too: it was synced
            if self._closed_under_call:
                raise ConfigError("this ContextManager closed while this call ran")
            taken = ctx.taken
            if ctx._media_share:
                # The refusal's excess served the call that compacted for it (the retry, its
                # history perhaps grown by a note): a later one is judged by its own sending.
                self._refused_media = None
            if isinstance(quiet, Quiet) and not taken:
                ledger = state.ledger
                self._quiet = (quiet, strategy, deciding, ledger, ledger.version, len(state.cuts))
        self._current_view()
        if not ran:  # else noted as the strategy loop ended
            self._remember_input(history, as_view, marks)
        self._last_call = now  # before the state a decision saves is made of it
        self._persist(taken)
        if state.repairs_version != self._repairs_seen:
            self._report_repairs()
        self._watch_thrash(taken, idle)
        sent, self._sent = self._sent, len(state.raw)
        view = list(state.view)
        if not view and state.raw:
            raise UnsupportedMessageError(
                None,
                "history: once repaired it holds nothing to send (only tool results answering "
                "no call, blank summaries); a provider takes no empty request",
            )
        if ran:  # else nothing since the count above changed the view or its estimates
            tokens = self._counter.overhead + self._view_tokens()
        # Only what this call added can still be on a quick count: the rest was counted in
        # full by an earlier call, or as the strategies decided (the whole view, on each call
        # over the limit, made a session that stays over it quadratic).
        if tokens > budget.limit and self._counter.refine(
            view[bisect.bisect_left(state.origins, sent) :]
        ):
            tokens = self.prompt_tokens
        if tokens > budget.limit:
            fraction = budget.usage_fraction(tokens)
            self._hub.emit(BudgetExceeded(tokens, budget.limit, fraction))
            if self._on_over_budget == "raise":
                raise BudgetExceededError(
                    tokens, budget.limit, view, self._protected(view), markers=self._markers(view)
                )
        return view

    def _still_quiet(self, budget: Budget, tokens: int, idle: float | None) -> bool:
        """Whether the `Quiet` the strategy returned on the last call it ran holds for this
        one (see `Quiet`): then it would take nothing, and is not called."""
        kept = self._quiet
        if kept is None or idle is None:
            return False
        quiet, strategy, seen, ledger, version, cuts = kept
        state = self._state
        return (
            tokens <= quiet.tokens
            and (quiet.idle_seconds is None or idle <= quiet.idle_seconds)
            and state.ledger is ledger
            and ledger.version == version
            and len(state.cuts) == cuts
            and strategy is self.strategy
            and (budget is seen or budget == seen)
        )

    def _remember_input(
        self, history: Sequence[Message], as_view: bool, marks: tuple[int, int]
    ) -> None:
        """End of a call: a view-mode input the call changed may be retried
        (`_follows_retried`); a call that changed the view otherwise replaces it."""
        self._kept_view = True
        state = self._state
        if (state.ledger.version, state.repairs_version) != marks:
            if as_view:
                self._retriable.append((list(history), len(state.raw), self._fresh))
            else:
                self._retriable.clear()

    def _watch_thrash(self, taken: Sequence[Decision], idle: float | None) -> None:
        """Warn when compaction rewrote the cached prefix on several of the last calls (three
        of six; a call that only cut what was not sent yet rewrote nothing), once until six
        calls in a row rewrite nothing: each rewrite re-bills the whole prompt, which costs
        more than compacting less often and deeper."""
        cold = idle is not None and idle > _CACHE_TTL_SECONDS  # nothing cached to lose
        sent = self._sent
        rewrote = bool(taken) and not cold and any(d.at.index < sent for d in taken)
        window = self._rewrites = ((self._rewrites << 1) | rewrote) & _THRASH_WINDOW
        if not rewrote:
            if not window:
                self._thrash_told = False
            return
        if window.bit_count() >= _THRASH_CALLS and not self._thrash_told:
            self._thrash_told = True
            self._hub.emit(
                CompactionWarning(
                    "thrash",
                    f"compaction rewrote the cached prompt on {window.bit_count()} of the last "
                    f"{2 * _THRASH_CALLS} calls (now {self.prompt_tokens} of "
                    f"{self.budget.limit} tokens): each rewrite re-bills the prompt. Lower the "
                    f"budget's target_ratio (now {self.budget.target_ratio}) so each "
                    "compaction frees more, or, with ToolOutputPipeline, raise clear_at_least",
                )
            )

    def _markers(self, view: Sequence[Message]) -> int:
        """Tokens of the markers and briefings in ``view``."""
        count = self._counter.count
        return sum(count(m) for m in view if isinstance(m, SummaryMessage))

    def _protected(self, view: Sequence[Message]) -> int:
        """Tokens of what no compaction may touch in ``view``, request overhead included."""
        count = self._counter.count
        kept = sum(count(view[j]) for j in protected_positions(view))
        return self._counter.overhead + kept + self._kept_excess()

    def _count_new_near_budget(self, budget: Budget) -> int:
        """Count the messages new since the last call in full when their quick estimate could
        be what keeps the prompt under the budget; return the prompt's estimate.

        A new message is first counted at a few characters (UTF-8 bytes beyond ASCII) a
        token; dense output costs more than that, up to one token a character, so a large
        new result could pass the budget unseen by every strategy. The full count runs only
        when that bound would cross the budget: calls far from it stay O(1). Messages left
        on quick counts on earlier calls, far from the budget then, are counted in full, the
        whole view with them, once the prompt comes as near as they could fall short by: a
        view returned just under the limit on quick counts could be over it in full, and a
        worker resuming the session, which counts in full, would decide again.
        """
        view, origins = self._current_view()
        counter = self._counter
        tokens = counter.overhead + self._view_tokens()  # settled by the caller
        k = bisect.bisect_left(origins, self._sent)
        quick = counter.count_many(view[k:]) if k < len(view) else 0
        self._unsent = (self._sent, quick)  # the unsent messages' count, for the margin
        # What this call's new messages and those left on quick counts before could add
        # (a calibration that weighs some class over prose widens it).
        beyond = (1 + _BEYOND_QUICK) * counter.quick_spread - 1
        if tokens + (quick + self._unrefined) * beyond <= budget.limit:
            self._unrefined += quick
            return tokens
        refined = counter.refine(view) if self._unrefined else counter.refine(view[k:])
        self._unrefined = 0
        if not refined:
            return tokens
        self._unsent = (self._sent, counter.count_many(view[k:]))
        return self.prompt_tokens

    def _persist(self, taken: Sequence[Decision]) -> None:
        """Hand the decisions just taken to the recall writer: it keeps the entries they name
        (only those), pins them and saves the ledger, off the event loop (`RecallWriter`)."""
        writer = self._writer
        if writer is not None:
            writer.record(self._state.ledger, taken, self._state.raw)
            now = self._last_call
            if now is not None and not now - _STATE_EVERY < self._state_noted <= now:
                # The state is saved with each decision and at close; and at least this often
                # besides, so a worker killed after a long quiet stretch leaves its last call.
                writer.note_state()
                self._state_noted = now
            writer.settle(self._tasks)

    async def recall(
        self, id: str, offset: int = 0, limit: int = 8000, pattern: str | None = None
    ) -> str:
        """What the ``recall_context`` tool returns for these arguments (see `recall_page`);
        ``limit`` is not capped as the tool's is. Values the tool would not take (a model's,
        passed on) get its explanation, as in `handle_recall`, not an error.

        The store is read off the event loop, under a deadline; a store that is down gets
        the model an explanation, not an error."""
        arguments = {"id": id, "offset": offset, "limit": limit, "pattern": pattern}
        return await self._page(recall_arguments(arguments, most=sys.maxsize))

    async def handle_recall(self, arguments: object) -> str:
        """The ``recall_context`` tool's result for the model's raw ``arguments`` (a mapping,
        as parsed from the tool call); unusable arguments get an explanation, not an error."""
        return await self._page(recall_arguments(arguments))

    async def _page(self, parsed: tuple[str, int, int, str | None] | str) -> str:
        self._on_its_thread("recall()")
        if isinstance(parsed, str):
            return parsed
        if self._writer is None:
            return recall_page(None, self.session_id, *parsed)
        return await self._writer.page(*parsed)

    def _current_view(self) -> tuple[Sequence[Message], Sequence[int]]:
        state = self._state
        if state.ledger.version != self._rendered_version:
            if not self._kept_view and state.view:
                # The view as the call found it, before its decisions change it: an owned
                # caller may go back to it (`_resync`). Once a call, on calls that decide.
                self._kept_view = True
                kept = (list(state.view), list(state.origins), len(state.raw))
                self._earlier.append(kept)
            state.refresh()
            self._rendered_version = state.ledger.version
        return state.view, state.origins

    def _sync(self, history: Sequence[Message]) -> bool:
        """Bring the raw history up to ``history``; whether it was read as a view."""
        state = self._state
        # When the input extends both the view and the raw history (the view can be a prefix
        # of the raw history, e.g. when repair left out a trailing orphan result), the longer
        # of the two is what the caller holds.
        checks = [(state.raw, extends_raw), (state.view, extends_view)]
        if len(state.raw) < len(state.view):
            checks.reverse()
        elif not state.view and state.raw:
            # An empty view of a history was refused (nothing to send), never returned: no
            # caller holds it to go on from.
            del checks[1]
        for seq, extends in checks:
            if extends(history, state):
                new = history[len(seq) :]
                break
        else:
            return self._resync(history)
        if seq is state.view and new:
            end = shown_until(state)
            if end < len(state.raw):
                # New messages follow a raw tail the view left out (results answering no
                # call, a blank summary): a projection caller edited it and went on, an owned
                # caller never held it. Either way it is not the caller's history any more;
                # as no view showed it, its going is no rewind the caller made.
                self._rebase(end, new, len(history) - len(new), unseen=True)
                return True
        self._extend(new, len(history) - len(new))
        return seq is state.view

    def _extend(self, new: Sequence[Message], offset: int) -> None:
        """Append ``new`` (at ``offset`` of the input) to the raw history."""
        self._fresh = len(new)
        state = self._state
        check_history(new, offset)
        state.append(new)
        self._rendered_version = state.ledger.version

    def _resync(self, history: Sequence[Message]) -> bool:
        state = self._state
        in_view = common_prefix(history, state.view)
        in_raw = common_prefix(history, state.raw)
        best, earlier = max(in_view, in_raw), None
        # A view a decision changed since: the caller went back (of two that follow it as
        # far, the later).
        for kept in reversed(self._earlier):
            k = common_prefix(history, kept[0])
            if k > best:
                best, earlier = k, kept
        if self._follows_retried(history, best):
            return True
        # The history is read as the raw one (projection) unless it follows the view further
        # (owned): where the view leaves raw messages out (results answering no call), a
        # raw history edited there matches both as far, and read as the view it would keep
        # the raw messages it replaces beside the new ones.
        if earlier is not None:
            view, origins, end = earlier
            if best < len(view):
                self._rebase(raw_from(view, origins, state.raw, best), history[best:], best)
            else:
                self._continue(end, history, best)
            return True
        if in_raw >= in_view:
            cut, new = in_raw, history[in_raw:]
        else:
            cut, new = raw_from(state.view, state.origins, state.raw, in_view), history[in_view:]
        self._rebase(cut, new, len(history) - len(new))
        return in_raw < in_view

    def _continue(self, end: int, history: Sequence[Message], n: int) -> None:
        """Follow ``history``, whose first ``n`` messages stand for ``raw[:end]``: what comes
        after them is appended, from where it leaves what the raw history holds there."""
        raw = self._state.raw
        since = history[n:]
        k = common_prefix(since, raw[end:]) if len(raw) > end else 0
        if end + k == len(raw):
            self._extend(since[k:], n + k)
        else:
            self._rebase(end + k, since[k:], n + k)

    def _follows_retried(self, history: Sequence[Message], other: int) -> bool:
        """Follow ``history`` if it follows a view-mode input one of the last calls changed:
        a call retried (its request failed) with the history it was given, perhaps with more
        after it, or one that goes back to the view that call was given (it leaves the input
        among the messages the call appended). That input stands for the raw history up to
        where it ended then; read as the view it no longer is, its originals would give way
        to the placeholders they were replaced by. Only where no other reading (``other``
        messages of the current view, the raw history or a kept view, or another input)
        follows it further; of two inputs that follow it as far, the later. An older input
        must follow it strictly further than the others: as far, the view the caller holds
        (edited, say) is the likelier reading."""
        best, k = None, other
        for n, kept in enumerate(reversed(self._retriable)):
            before, _, fresh = kept
            common = common_prefix(history, before)
            if common >= len(before) - fresh and (common > k or (common == k and n == 0)):
                best, k = kept, common
        if best is None:
            return False
        before, end, fresh = best
        n = len(before)
        if k < n:
            # It leaves that input among the messages the call appended: a rewind there
            # (the caller went back to the view it held before that call).
            self._rebase(end - (n - k), history[k:], k)
            self._fresh = len(history) - (n - fresh)
            return True
        self._continue(end, history, n)
        self._fresh = fresh + len(history) - n
        return True

    def _rebase(
        self, cut: int, new: Sequence[Message], offset: int, *, unseen: bool = False
    ) -> None:
        """Cut the raw history back to ``cut``, append ``new`` (at ``offset`` of the input).
        ``unseen``: what is cut is only what the view left out, said (`HistoryResynced`)
        only where decisions go with it."""
        self._fresh = len(new)
        state = self._state
        check_history(new, offset)
        if any(cut < end for _, end, _ in self._retriable):
            self._retriable = deque(
                (kept for kept in self._retriable if kept[1] <= cut), maxlen=_EARLIER_VIEWS
            )
        # The views kept, and the view now, each as far as it stands for what stays: going
        # back to one of them still reads against it.
        views = [*self._earlier, (list(state.view), list(state.origins), len(state.raw))]
        kept = [view_below(v, o, state.raw, end, cut) for v, o, end in views]
        self._earlier = deque((v for v in kept if v[0]), maxlen=_EARLIER_VIEWS)
        dropped = state.truncate(cut)
        state.append(new)
        # Decisions before the cut were taken on a longer history; what it protects now (the
        # latest user message, the newest complete turn) may sit under one of them. (Finding
        # those can read back through a long tool loop: not when there is no decision.)
        if len(state.ledger) and (
            unprotected := state.ledger.drop_protected(state.raw, state.shown_positions())
        ):
            dropped += len(unprotected)
            state.rebuild()
        self._rendered_version = state.ledger.version
        self._reported = {r for r in self._reported if r[1] < cut}
        self._sent = min(self._sent, cut)
        if dropped or not unseen:
            self._hub.emit(HistoryResynced(cut, dropped))

    def _report_repairs(self) -> None:
        state = self._state
        self._repairs_seen = state.repairs_version
        fresh = []
        for r in state.repairs:
            key = (r.kind, r.origin, r.tool_call_id if r.new_id is None else r.new_id)
            if key not in self._reported:
                self._reported.add(key)
                call = f":{r.tool_call_id}" if r.tool_call_id else ""
                at = repaired_index(r.origin)
                fresh.append(f"{r.kind}@{at}{call}" + (f"->{r.new_id}" if r.new_id else ""))
        if fresh:
            self._hub.emit(TranscriptRepaired(tuple(fresh)))

    # -- after the model call -----------------------------------------------------------

    def observe(self, response: Usage | AssistantMessage | Any, *, calibrate: bool = True) -> None:
        """Record what the provider reported for the last view sent.

        Accepts a `Usage`, an `AssistantMessage` carrying one, or what the SDK returned:
        ``ctx.observe(resp)`` / ``ctx.observe(resp.usage)`` for an anthropic ``Message``, an
        openai ``ChatCompletion`` or ``Response`` (or a stream's final message), read by
        their fields (`usage_of`). Calibrates the token estimate from it: inside
        ``async with`` in the background, once the caller's code yields (while the agent runs
        its tools), since it estimates in full what the request sent that was new; without,
        at once. Counts read through the manager (`prompt_tokens`, `counter`, `prepare`)
        always see it applied, whenever it ran.

        Report what the provider counted. A count made from this manager's own estimate
        (``ctx.prompt_tokens``, ``ctx.counter``) tells the calibration nothing, and fed back
        call after call the calibration chases itself, far from any real tokenizer (to its
        bound of 4x in one of the project's benchmark loops, down to half in another).
        Without usage from the provider, do not call ``observe``, or report a count of
        your own tokenizer. A count over the context window and over 4x the view's estimate
        is no request's of this view (a proxy's session total): it is left out, and said
        once (`CompactionWarning` ``implausible_usage``). Report every prompt token: with
        Anthropic, ``input_tokens`` and the cache reads and writes (``observe(response)``
        reads them all); ``input_tokens`` alone calibrates the counts down.

        Also accepts the SDK's error when the provider refused the last view as longer than
        its context window (``except anthropic.BadRequestError as e: ctx.observe(e)``): the
        counts calibrate at once on the size its message gives (or, where it gives none, as
        OpenAI's Responses API words it, on one token over that call's limit; a count over
        four times the estimate and over the window, such as a document by URL brings, is
        not fitted, but the refused view counts it), nothing is billed, and the next
        `prepare` of the same history compacts to fit. Said each time
        (`CompactionWarning` ``prompt_refused``, which also says when the provider's window is
        below the budget's). `wrap` and `as_middleware` do this themselves and send the
        request once more. Any other error is refused with `ConfigError`.

        ``calibrate=False`` records a request that did not send the last view (a side question,
        a call continuing a server-side chain): its usage adds to `usage`, the session's
        spend, and nothing else; its refusal changes nothing (the wrappers pass it for calls
        they send as they are).
        """
        self._on_its_thread("observe()")
        if isinstance(response, BaseException):
            overflow = overflow_of(response)
            if overflow is None:
                raise ConfigError(
                    f"observe() takes a provider's error only when it refuses the prompt as "
                    f"longer than its context window; got {preview(response)}"
                )
            if calibrate:  # a refused request that sent no view of this session: nothing
                self._observe_overflow(overflow)
            return
        usage = usage_of(response)
        if usage is None:
            raise ConfigError(f"observe() takes {ACCEPTED}; got {type(response).__name__}")
        if not isinstance(response, Usage) and not states_counts_only(response):
            # Read as 0, the report would be dropped, or calibrate on the counts around it.
            raise ConfigError(
                f"observe() got usage holding a count that is no token count: "
                f"{reprlib.repr(response)}; {USAGE_RULE}"
            )
        if (name := bad_usage_field(usage)) is not None:
            count = reprlib.repr(getattr(usage, name))
            raise ConfigError(f"observe() got usage.{name}={count}: {USAGE_RULE}")
        if not calibrate:
            self.usage = self.usage + usage
            return
        now = self._clock()  # first: a clock that fails leaves the call undone
        self.usage = self.usage + usage
        self._last_call = now
        if usage.prompt_tokens > 0 and self._state.view:
            self._settle()  # an earlier report first
            self._report = usage.prompt_tokens
            if self._report_arrived is None:
                self._settle()
            else:
                self._report_arrived.set()

    def _observe_overflow(self, overflow: Overflow) -> None:
        """Calibrate on a refused prompt's size: what the provider counted, or, when it does
        not say, the least the prompt can have held (one token over the call's limit). The
        refused view then counts at least that much, whatever the fit makes of one report
        among many, so the next `prepare` of it compacts. A refused request bills nothing
        and leaves the cache as it was."""
        if not self._state.view:
            return
        limit = self._limit_sent
        counted = overflow.prompt_tokens
        self._settle()  # an earlier report first
        with self._settling:
            taken = self._calibrate(limit + 1 if counted is None else counted, refused=True)
        size = "" if counted is None else f" of {counted} tokens"
        said = f"the provider refused a prompt{size} as longer than its context window"
        window = overflow.window
        if window is not None:
            said += f" (it takes {window} prompt tokens"
            said += ")" if overflow.output is None else f" with {overflow.output} of output)"
        if not taken:
            said += (
                "; its count, over four times the estimate, was not used to calibrate the "
                "counts (something in the view costs the provider far more than estimated, "
                "such as a document by URL or many small images), but the refused view "
                "counts it, so the next prepare compacts it"
            )
        elif counted is None:
            said += f"; the counts are calibrated on {limit + 1} tokens, the least it held"
        else:
            said += "; the counts are calibrated on its count"
        if window is not None and window < limit:
            said += f"; that is below the prompt budget of that call ({limit}): " + (
                "set Budget.context_window to the model's, or hard_budget"
                if overflow.output is None
                else "keep Budget.reserve_output at least the output requests ask for (or at "
                "its default, which follows their max_tokens) and context_window at the model's"
            )
        self._hub.emit(CompactionWarning("prompt_refused", said))

    def _settle(self) -> None:
        """Calibrate on the last usage report, if it is not yet: in the background once the
        caller's code yields (an agent runs its tools), else at the next read of the counts
        or `prepare`, whichever comes first; the view it was on is the current one until
        then, so when it runs changes nothing."""
        if self._report is None:
            return
        # The blocking API runs the manager on a thread of its own: a read of its counts from
        # the caller's thread waits here for the background work to finish, never sees half.
        with self._settling:
            tokens = self._report
            if tokens is None:
                return
            try:
                self._calibrate(tokens)
            finally:
                self._report = None

    def _calibrate(self, tokens: int, *, refused: bool = False) -> bool:
        """Calibrate the counts on ``tokens``, the provider's count of the current view;
        whether the report was taken. ``refused``: the provider refused that view as too
        long, and it must count all of ``tokens`` while it is the view."""
        state = self._state
        counter = self._counter
        view, origins = self._current_view()
        epoch = (state.ledger.version, state.repairs_version)
        # Calibration needs full estimates of what was sent; those made before are kept,
        # so only what is new since the last report (or every message, after a decision
        # or a rewind put other messages in the view) is estimated in full here.
        reported, raw_len, _ = self._reported_view
        first = bisect.bisect_left(origins, raw_len) if reported == epoch else 0
        counter.refine(view[first:])
        self._unrefined = 0  # the whole view is counted in full now
        estimate = counter.overhead + state.tokens
        if tokens > self.budget.context_window and tokens > _MOST_OVER_ESTIMATE * estimate:
            if refused:
                # A refusal counts this very view: something in it costs the provider far
                # more than any calibration makes of its estimate (a document by URL, many
                # small images). Fitted, it would price every later message off; the view
                # counts it all the same, so the next prepare compacts it. Where the view
                # holds media compaction may leave out, what is not explained is laid on
                # them: in the call that compacts for the refusal, a view compacted further
                # still counts it for those it keeps, so that call goes on until enough of
                # them are gone (each decision would end the excess at once).
                excess = tokens - estimate
                self._reported_view = (epoch, len(state.raw), excess)
                media = self._media_left()
                history = (len(state.raw), len(state.cuts))
                # The user messages compaction keeps carry their part (of a floor billed on
                # every image, `floor_share`): laid all on the rest, leaving those out would
                # clear it, and the retry go out over the budget (or be refused again) on
                # what they still hold. Their counts then say at once whether the budget can
                # be met with them.
                holders = self._media_holders()
                kept = self._media_in(holders)
                images = self._images(holders) if media > 0 and kept > 0 else []
                if images and math.isclose(sum(e for e, _ in images), media + kept):
                    part = floor_share(excess, images)
                else:
                    # Media other than images among them (a document by URL, its cost
                    # unknown to any estimate): laid on what compaction may leave out.
                    part = 0.0 if media > 0 else excess
                self._refused_media = (excess - part, media, *history) if media > 0 else None
                self._refused_kept = (part, kept, *history, holders) if kept > 0 else None
                return False
            # More than the model could read, and more than any calibration makes of this
            # view: another request's count (a proxy summing a session, a wrong object).
            # Taken, the fitted overhead alone would put every later view over the limit.
            if not self._implausible_reported:
                self._implausible_reported = True
                self._hub.emit(
                    CompactionWarning(
                        "implausible_usage",
                        f"a usage report of {tokens} prompt tokens for a view estimated at "
                        f"{estimate}, over the context window ({self.budget.context_window}), "
                        "was not used to calibrate the counts. Pass observe() the usage of the "
                        "request prepare() returned; to keep prompts below the model's window, "
                        "set Budget.hard_budget, not a smaller context_window",
                    )
                )
            return False
        # A report the fit explains: the counts say what costs what.
        self._refused_media = self._refused_kept = None
        # A first report that is a refusal far over the estimate, taken mostly for overhead
        # (one report cannot tell it from a denser tokenizer), would leave no room for any
        # message, and the retry would raise `BudgetExceededError` where compacting more
        # fits: its fit gives the overhead at most half the refused call's limit. The next
        # report's fit is free again, and with views of two sizes tells them apart; after
        # reports, the fit already knows the overhead.
        first = refused and not counter.observations
        most = self._limit_sent / 2 if first else None
        if not counter.observe(view, tokens, vector=state.vector(), most_overhead=most):
            return False  # a count no request reports (past a billion tokens)
        short = tokens - counter.overhead - state.tokens
        # Capped: a report far above the estimate is another request's (a host that adds
        # its own context), not this view's size, and never more than a tenth of the limit.
        # A refusal is this view's size, and the view must count it to be compacted.
        cap = tokens if refused else min(tokens, self.budget.limit) // _MAX_SHORT_FRACTION
        short = max(0, min(short, cap))
        self._reported_view = (epoch, len(state.raw), short)
        return True

    async def _settle_reports(self) -> None:
        while True:
            arrived = self._report_arrived = anyio.Event()
            await arrived.wait()
            try:
                self._settle()
            except Exception:  # a report is dropped, not the manager's background work
                log.exception("usage report not applied")
