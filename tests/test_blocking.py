"""`BlockingContextManager` from a synchronous harness (plain ``def`` tests, no event loop in
the test's thread): background summaries run on the loop thread it owns while the caller
sleeps, errors come out as themselves, close reports what the session left and ends the
thread, and a caller on an event loop is refused."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import os
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest

import agentctx
from agentctx import (
    BlockingContextManager,
    Budget,
    BudgetExceededError,
    Chain,
    ConfigError,
    ContextCompacted,
    ContextManager,
    DeterministicCompaction,
    Event,
    LlmCompaction,
    LlmCompactionConfig,
    MemoryRecallStore,
    Message,
    MessageCounter,
    SummaryStale,
    UnsupportedMessageError,
    Usage,
    UserMessage,
)
from agentctx.messages import AssistantMessage, SummaryMessage
from agentctx.strategies.llm_config import SUMMARY_MARKER
from agentctx.testing import assert_view_ok
from agentctx.testing.scripted import Outcome, ScriptedSummarizer

GAP = 0.02  # the caller's model call, between two prepare() calls
REPLY_DELAY = 0.05  # the summarizer's: longer than one gap, so it spans a model call
BRIEFING = (
    "## Goal\nShip the parser.\n## Constraints\nKeep the API.\n## Decisions\nUse LALR.\n"
    "## Files touched\nsrc/parser.py\n## Open items\nWrite tests."
)
WORDS = ["alpha", "beta", "gamma", "delta", "parser", "cache", "config", "token", "budget"]


def turn(i: int) -> list[Message]:
    prose = " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(60))
    return [
        UserMessage.of(f"user message {i}: {prose}"),
        AssistantMessage.of(f"assistant reply {i}: {prose}"),
    ]


def has_briefing(view: list[Message]) -> bool:
    return any(isinstance(m, SummaryMessage) and m.text.startswith(SUMMARY_MARKER) for m in view)


def loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "agentctx"]


class Harness:
    """A blocking replay loop in projection mode: one turn, one prepare, one observe."""

    def __init__(self, ctx: BlockingContextManager) -> None:
        self.ctx = ctx
        self.history: list[Message] = []
        self.views: list[list[Message]] = []
        self.requests_before: list[int] = []  # summaries requested before each prepare
        self.events: list[Event] = []
        self.counter = MessageCounter()  # the caller's own: the manager's is the loop's
        ctx.subscribe(self.events.append)

    def turn(self, i: int, summarizer: ScriptedSummarizer) -> list[Message]:
        self.history += turn(i)
        self.requests_before.append(len(summarizer.requests))
        view = self.ctx.prepare(self.history, max_tokens=1_000)
        assert_view_ok(view, self.history)
        self.ctx.observe(Usage(input_tokens=self.counter.count_many(view)))
        self.views.append(view)
        time.sleep(GAP)  # the model call: the loop thread works meanwhile
        return view

    def of(self, kind: type[Any]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


def test_a_blocking_harness_gets_background_briefings_spliced_and_closes_clean() -> None:
    threads_before = set(threading.enumerate())
    summarizer = ScriptedSummarizer(default=Outcome.reply(BRIEFING, delay=REPLY_DELAY))
    llm = LlmCompaction(summarizer, LlmCompactionConfig(trigger_ratio=0.3))
    manager = ContextManager(
        Budget(context_window=3_000, reserve_output=1_000),
        strategy=Chain([llm, DeterministicCompaction()]),
    )
    with BlockingContextManager(manager) as ctx:
        assert len(loop_threads()) == 1
        harness = Harness(ctx)
        i = 0
        # 1. Past the trigger a summary is requested; it is written on the loop thread
        # while this thread only sleeps (no prepare runs meanwhile).
        while not summarizer.requests:
            harness.turn(i, summarizer)
            i += 1
            assert i < 40, "the trigger should have started a summary"
        deadline = time.monotonic() + 5
        while llm.phase != "ready":
            assert time.monotonic() < deadline, llm.phase
            time.sleep(0.005)
        assert not harness.of(SummaryStale)
        # 2. A later prepare splices it, once the history is over the limit.
        while not any(e.method == "summarized" for e in harness.of(ContextCompacted)):
            harness.turn(i, summarizer)
            i += 1
            assert i < 80, "the briefing should have been spliced"
        spliced_at = next(n for n, v in enumerate(harness.views) if has_briefing(v))
        asked_at = next(n for n, k in enumerate(harness.requests_before) if k) - 1
        assert asked_at < spliced_at, "requested by one prepare, spliced by a later one"
        assert has_briefing(harness.views[-1])
        # 3. The next briefing is billed and ready, never spliced, when the session ends.
        while llm.phase != "ready" or len(summarizer.requests) < 2:
            harness.turn(i, summarizer)
            i += 1
            assert i < 140, "a second summary should have been requested and written"
        # A prepare that lands between the briefing's arrival and this thread's look at the
        # phase may bring it up to date (update_ratio): the one it replaced is reported, billed.
        updated = harness.of(SummaryStale)
        assert all(s.reason == "updated" and s.summary is not None for s in updated), updated
    # Close reported the waiting one, once, cost included, before it returned; the thread
    # is gone.
    unused = harness.of(SummaryStale)[len(updated) :]
    assert [s.reason for s in unused] == ["unused"] and unused[0].summary is not None
    spliced = [e for e in harness.of(ContextCompacted) if e.method == "summarized"]
    assert llm.spend.requests == len(summarizer.requests) == len(spliced) + 1 + len(updated)
    ctx.close()  # a second close reports nothing twice
    assert len(harness.of(SummaryStale)) == len(updated) + 1
    assert loop_threads() == []
    deadline = time.monotonic() + 5  # anyio's idle worker threads end once told, not joined
    while set(threading.enumerate()) != threads_before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert set(threading.enumerate()) == threads_before
    assert manager.usage.input_tokens == sum(
        harness.counter.count_many(view) for view in harness.views
    )
    with pytest.raises(ConfigError, match="closed"):
        ctx.prepare(harness.history)


def test_errors_come_out_as_themselves_and_the_session_goes_on() -> None:
    tiny = ContextManager(Budget(context_window=1_200, reserve_output=200))
    task = UserMessage.of("the task " + "word " * 3_000)  # over the budget, and protected
    with BlockingContextManager(tiny) as ctx:
        with pytest.raises(BudgetExceededError) as exceeded:
            ctx.prepare([task])
        assert type(exceeded.value) is BudgetExceededError
        assert exceeded.value.view == [task]  # the best view rides along, as with await
    with BlockingContextManager(ContextManager(200_000)) as ctx:
        history: list[Any] = [UserMessage.of("hi")]
        with pytest.raises(UnsupportedMessageError):
            ctx.prepare([*history, {"role": "user", "content": "a provider dict"}])
        with pytest.raises(ConfigError, match="max_tokens"):
            ctx.prepare(history, max_tokens=-1)
        with pytest.raises(ConfigError, match="observe"):
            ctx.observe(object())
        assert ctx.prepare(history, max_tokens=4_096) == history  # still usable
    assert loop_threads() == []


def test_prepare_takes_what_the_async_prepare_takes() -> None:
    blocking = inspect.signature(BlockingContextManager.prepare)
    async_ = inspect.signature(ContextManager.prepare)
    assert blocking.parameters == async_.parameters
    assert blocking.return_annotation == async_.return_annotation
    assert agentctx.BlockingContextManager is BlockingContextManager


def test_recall_and_events_from_blocking_code() -> None:
    store = MemoryRecallStore()
    manager = ContextManager(200_000, recall=store)
    rid = store.put(manager.session_id, "alpha\nbeta\ngamma")
    seen: list[Event] = []
    with BlockingContextManager(manager) as ctx:
        assert "beta" in ctx.handle_recall({"id": rid})
        assert "gamma" in ctx.recall(rid, pattern="gamma")
        assert "arguments must be an object" in ctx.handle_recall("not a mapping")
        unsubscribe = ctx.subscribe(seen.append)
        ctx.prepare([UserMessage.of("one")])
        ctx.prepare([UserMessage.of("two")])  # edited history: HistoryResynced
        unsubscribe()
        ctx.prepare([UserMessage.of("three")])
    assert [type(e).__name__ for e in seen] == ["HistoryResynced"]


def test_entering_twice_or_after_close_is_a_config_error() -> None:
    """Found by a hostile run (BT, finding 4): a second ``with`` was taken, and leaving it
    closed the session under the first, as the async manager refuses to."""
    ctx = BlockingContextManager(ContextManager(200_000))
    with ctx:
        with pytest.raises(agentctx.ConfigError, match="entered already"), ctx:
            pass
        assert ctx.prepare([UserMessage.of("still open")])
    with pytest.raises(agentctx.ConfigError, match="closed"), ctx:
        pass


def test_a_caller_on_an_event_loop_is_refused() -> None:
    async def inside_a_loop(ctx: BlockingContextManager) -> None:
        with pytest.raises(ConfigError, match="event loop"):
            ctx.prepare([UserMessage.of("hi")])
        with pytest.raises(ConfigError, match="event loop"):
            BlockingContextManager(ContextManager(200_000))

    refused: list[ConfigError] = []
    with BlockingContextManager(ContextManager(200_000)) as ctx:
        asyncio.run(inside_a_loop(ctx))

        def call_back(event: Event) -> None:
            # on the manager's loop thread: calling back in would block that very loop
            try:
                ctx.prepare([UserMessage.of("again")])
            except ConfigError as e:
                refused.append(e)

        ctx.subscribe(call_back)
        ctx.prepare([UserMessage.of("first")])
        ctx.prepare([UserMessage.of("edited")])  # emits HistoryResynced
        assert ctx.prepare([UserMessage.of("edited"), UserMessage.of("more")])
    assert len(refused) == 1 and "event loop" in str(refused[0])
    assert loop_threads() == []


# -- found by hostile testing: what outlives a forgotten close, a fork, a stopped loop ------


def _child(code: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter; a hang fails the test at ``timeout``."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize("ending", ["returns", "raises", "wrapped client"])
def test_a_manager_never_closed_does_not_hang_the_interpreter_at_exit(ending: str) -> None:
    """The loop thread's portal was left to module teardown, which waited for a loop thread
    that no longer ran: a harness that forgot ``close`` (or crashed) never exited."""
    body = {
        "returns": "ctx = BlockingContextManager(ContextManager(200_000))\n"
        "ctx.prepare([UserMessage.of('hi')])\n",
        "raises": "ctx = BlockingContextManager(ContextManager(200_000))\n"
        "ctx.prepare([UserMessage.of('hi')])\nraise RuntimeError('the harness crashed')\n",
        "wrapped client": "import openai\nfrom agentctx.providers.openai import wrap\n"
        "client = wrap(openai.OpenAI(base_url='http://127.0.0.1:9/v1', api_key='x'), "
        "ContextManager(200_000))\n",
    }[ending]
    code = "from agentctx import BlockingContextManager, ContextManager, UserMessage\n" + body
    done = _child(code)  # raises TimeoutExpired on a hang
    assert done.returncode == (1 if ending == "raises" else 0), done.stderr
    assert "Exception ignored" not in done.stderr


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX")
def test_after_fork_the_child_gets_a_typed_error_and_closes_at_once() -> None:
    """In a forked child the loop thread does not exist: ``prepare`` and ``close`` waited
    for it forever."""
    done = _child(
        """
        import os, signal
        from agentctx import BlockingContextManager, ConfigError, ContextManager, UserMessage
        ctx = BlockingContextManager(ContextManager(200_000))
        ctx.prepare([UserMessage.of("hi")])
        pid = os.fork()
        if pid == 0:
            signal.alarm(10)
            try:
                ctx.prepare([UserMessage.of("hi"), UserMessage.of("again")])
            except ConfigError as e:
                print("child:", "forked" in str(e), flush=True)
            ctx.close()
            os._exit(0)
        os.waitpid(pid, 0)
        print("parent:", len(ctx.prepare([UserMessage.of("hi"), UserMessage.of("again")])))
        ctx.close()
        """
    )
    assert done.stdout.split() == ["child:", "True", "parent:", "2"], done.stderr


@pytest.mark.parametrize("where", ["sync subscriber", "async subscriber"])
def test_a_loop_stopped_by_system_exit_gives_config_errors_and_closes(where: str) -> None:
    """A subscriber raising SystemExit stops the loop thread; later calls raised anyio's bare
    ``RuntimeError('This portal is not running')``, ``close`` too."""

    def sync_exit(event: Event) -> None:
        raise SystemExit(3)

    async def async_exit(event: Event) -> None:
        raise SystemExit(3)

    ctx = BlockingContextManager(
        ContextManager(Budget(context_window=30_000), on_over_budget="send")
    )
    ctx.subscribe(sync_exit if where == "sync subscriber" else async_exit)
    history: list[Message] = [UserMessage.of("the task")]
    # Until an event is emitted (a compaction): a sync subscriber's SystemExit comes out of
    # that call; an async one's stops the loop between calls.
    with contextlib.suppress(SystemExit, ConfigError):
        for k in range(40):
            history += [UserMessage.of(f"{k} " + "x" * 4_000)]
            ctx.prepare(history)
            time.sleep(0.01)
    deadline = time.monotonic() + 5
    while any(t.name == "agentctx" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(ConfigError, match="loop thread has stopped"):
        ctx.prepare(history)
    ctx.close()


def test_a_manager_dropped_on_its_own_loop_thread_ends_that_thread() -> None:
    """The last reference dropped by an async subscriber, on the loop thread: closing there
    tried to join that thread itself (``cannot join current thread``), and it ran on."""
    import anyio

    held: list[Any] = [BlockingContextManager(ContextManager(200_000))]

    async def drop(event: Event) -> None:
        await anyio.sleep(0.05)
        held.clear()

    held[0].subscribe(drop)
    held[0].prepare([UserMessage.of("a")])
    held[0].prepare([UserMessage.of("b")])  # not the history before: an event
    deadline = time.monotonic() + 5
    while (held or any(t.name == "agentctx" for t in threading.enumerate())) and (
        time.monotonic() < deadline
    ):
        gc.collect()
        time.sleep(0.01)
    assert not held and not any(t.name == "agentctx" for t in threading.enumerate())


def test_close_after_an_interrupt_on_the_loop_thread_raises_nothing() -> None:
    """Found by a hostile run (AA, finding 2): after a subscriber raised `KeyboardInterrupt`
    on the loop thread, `close` raced the thread's stopping and raised a bare `RuntimeError`
    ("This portal is not running") or `CancelledError`. In a process of its own: the
    interrupt stops that process's loop thread."""
    code = """
from agentctx import AssistantMessage, Budget, ContextManager, ToolResultMessage, UserMessage
from agentctx.blocking import BlockingContextManager
from agentctx.messages import ToolCall

history = [UserMessage.of("the task")]
for i in range(5):
    call = ToolCall(f"c{i}", "bash", {"command": "ls"})
    history += [AssistantMessage.of("x", tool_calls=[call])]
    history += [ToolResultMessage.of(f"c{i}", "out " * 3000, tool_name="bash")]
ctx = BlockingContextManager(ContextManager(Budget(context_window=3000, reserve_output=1000)))
fired = []
def interrupt(event):
    if not fired:
        fired.append(event)
        raise KeyboardInterrupt
ctx.subscribe(interrupt)
try:
    ctx.prepare(history)
except BaseException as e:
    print("prepare:", type(e).__name__)
ctx.close()
print("closed")
"""
    for _ in range(3):  # a race: each run may take either path
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        assert done.stdout.split() == ["prepare:", "KeyboardInterrupt", "closed"], done.stderr


def test_an_interrupt_while_the_loop_thread_starts_leaves_no_thread_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by a hostile run (BN 1): a Ctrl-C while `BlockingContextManager()` waited for
    its loop thread to start left that thread serving for the rest of the process, with
    nothing referring to it."""
    import agentctx.blocking as blocking

    class Interrupted(blocking.Future):  # type: ignore[type-arg]
        waits = 0

        def result(self, timeout: float | None = None) -> Any:
            type(self).waits += 1
            if type(self).waits == 1:
                raise KeyboardInterrupt
            return super().result(timeout)

    def loop_threads() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name == "agentctx"}

    before = loop_threads()
    monkeypatch.setattr(blocking, "Future", Interrupted)
    with pytest.raises(KeyboardInterrupt):
        BlockingContextManager(ContextManager(Budget(context_window=12_000, reserve_output=1_000)))
    assert Interrupted.waits == 2
    assert loop_threads() - before == set()
