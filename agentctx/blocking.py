"""`BlockingContextManager`: `prepare` / `observe` on neutral messages from blocking code.

```python
from agentctx import Budget, ContextManager
from agentctx.blocking import BlockingContextManager

with BlockingContextManager(ContextManager(Budget(context_window=200_000))) as ctx:
    ctx.subscribe(print)  # called on the manager's loop thread
    while not done:
        view = ctx.prepare(history)  # blocks; background summaries run between calls
        response = call_model(view)  # your blocking SDK call
        ctx.observe(response)
        history.append(...)
```

The manager runs on an event loop in a daemon thread that the `BlockingContextManager` owns
(`LoopThread`, the same one the blocking SDK wrappers use), so its background work (summaries
on a cheap model) keeps running while your thread sleeps or waits on the model.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
import threading
import weakref
from concurrent.futures import CancelledError, Future
from contextlib import AbstractContextManager, suppress
from functools import partial
from typing import TYPE_CHECKING, Any, Self, TypeVar, overload

import anyio
from anyio.from_thread import BlockingPortal

from agentctx.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence
    from types import TracebackType

    from agentctx.events import Subscriber
    from agentctx.manager import ContextManager
    from agentctx.messages import Message

__all__ = ["BlockingContextManager", "LoopThread"]


class _Raised:
    """What a function run on the loop raised (an `Exception`; cancellation and other base
    exceptions go through as they are), told apart from the portal's own errors."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


async def _boxed(func: Callable[..., Any], *args: Any) -> Any:
    try:
        result = func(*args)
        return await result if inspect.isawaitable(result) else result
    except Exception as e:
        return _Raised(e)


def _serve(started: Future[BlockingPortal]) -> None:
    """A `LoopThread`'s thread: an event loop serving a portal until it is stopped."""

    async def serve() -> None:
        async with BlockingPortal() as portal:
            started.set_result(portal)
            await portal.sleep_until_stopped()

    try:
        anyio.run(serve)
    except BaseException as e:  # the thread ends either way; a caller waiting is told
        if not started.done():
            started.set_exception(e)


_STOPPING_SECONDS = 1.0  # how long a loop thread stopping under an interrupt may take to end


def _close(
    session: AbstractContextManager[object],
    portal: BlockingPortal,
    thread: threading.Thread,
    pid: int,
) -> None:
    """Exit a `LoopThread`'s manager, stop its portal and join its thread."""
    if os.getpid() != pid:
        return  # a forked child: the loop thread is the parent's
    if threading.get_ident() == thread.ident:
        # Collected on the loop thread itself (a callback dropped the last reference): it
        # cannot join itself, so another thread closes it once this callback returns.
        args = (session, portal, thread, pid)
        threading.Thread(target=_close, args=args, name="agentctx-close").start()
        return
    if thread.is_alive():  # else the loop stopped (SystemExit raised on it): nothing to exit
        try:
            session.__exit__(None, None, None)
        except (RuntimeError, CancelledError, asyncio.CancelledError):
            # The loop thread stopping meanwhile (an interrupt raised on it) ends the call
            # so: nothing was left to exit. The same errors from a loop still running are
            # the manager's own (a strategy's close, say).
            thread.join(_STOPPING_SECONDS)
            if thread.is_alive():
                raise
        finally:
            with suppress(RuntimeError):  # stopped meanwhile
                portal.call(portal.stop)
    thread.join()


T = TypeVar("T")


def _in_event_loop() -> bool:
    """Whether this thread is running an event loop (asyncio, or trio if it is loaded)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        return True
    trio = sys.modules.get("trio")
    in_trio_run = getattr(getattr(trio, "lowlevel", None), "in_trio_run", None)
    return bool(in_trio_run is not None and in_trio_run())


class BlockingContextManager:
    """A `ContextManager` for blocking code: ``prepare``, ``observe`` and ``handle_recall``
    block until the manager has done them, on an event loop in a thread this object owns.

    ```python
    with BlockingContextManager(ContextManager(200_000, strategy=strategy)) as ctx:
        view = ctx.prepare(history, max_tokens=4096)
        ctx.observe(response)
    ```

    It enters ``manager`` (which must not be entered already) on construction. Background
    work keeps running on the loop thread between your calls, so a summary requested by one
    `prepare` is written while your thread sleeps or waits on the model, and spliced by a
    later one. Use it in a ``with`` block or call `close`: one never closed is closed when
    collected, but not while a subscriber holds it (a callback that refers to it, or a bound
    method of an object that owns it, keeps it reachable from its own loop thread), and then
    only at interpreter exit.

    Errors come out as themselves in your thread (`BudgetExceededError`,
    `UnsupportedMessageError`, `ConfigError`). Calling it from a thread that runs an event loop
    (async code, or a subscriber callback) raises `ConfigError`: blocking that loop would stall
    it, or deadlock if the manager's work needs it; in async code use the `ContextManager`
    itself. Use it from one thread at a time, as you would the manager.

    Args:
        manager: the session; read its state (``usage``, ``ledger``, ``raw``) as
            ``ctx.manager`` between calls.
    """

    def __init__(self, manager: ContextManager) -> None:
        self._refuse_in_event_loop("BlockingContextManager()")
        self.manager = manager
        self._loop = LoopThread(manager)
        self._closed = False
        self._entered = False

    def _refuse_in_event_loop(self, what: str) -> None:
        if _in_event_loop():
            raise ConfigError(
                f"{what} was called from a thread running an event loop (async code, or a "
                "subscriber callback on the manager's loop thread): it would block that loop, "
                "stalling it or deadlocking; in async code use `async with ContextManager(...)` "
                "and `await ctx.prepare(...)`"
            )

    def _call(self, what: str, func: Callable[[], Any]) -> Any:
        self._refuse_in_event_loop(what)
        if self._closed:
            raise ConfigError(f"{what}: this BlockingContextManager is closed")
        return self._loop.call(func)

    def prepare(
        self, history: Sequence[Message], *, max_tokens: int | None = None
    ) -> list[Message]:
        """The view to send for ``history``, as `ContextManager.prepare` makes it (same
        arguments, same errors, raised here); blocks until it is ready, which never waits on
        network I/O."""
        view: list[Message] = self._call(
            "prepare()", partial(self.manager.prepare, history, max_tokens=max_tokens)
        )
        return view

    def observe(self, response: Any, *, calibrate: bool = True) -> None:
        """Record the usage of the response to the last view sent (`ContextManager.observe`:
        a `Usage`, an `AssistantMessage` carrying one, or the SDK's response)."""
        self._call("observe()", partial(self.manager.observe, response, calibrate=calibrate))

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call ``callback`` with every event from now on, including those the manager
        reports at close; returns a function that unsubscribes it.

        Callbacks run on the manager's loop thread, not yours: keep them quick and
        thread-safe (appending to a list is; calling this object back is refused), or pass a
        coroutine function, which runs as a task on that loop.
        """
        unsubscribe: Callable[[], None] = self._call(
            "subscribe()", partial(self.manager.subscribe, callback)
        )

        def off() -> None:
            # From a callback (on the loop thread) or after close nothing can race it.
            if self._closed or threading.get_ident() == self._loop.thread_id:
                unsubscribe()
            else:
                self._call("unsubscribe()", unsubscribe)

        return off

    def recall(
        self, id: str, offset: int = 0, limit: int = 8000, pattern: str | None = None
    ) -> str:
        """What the ``recall_context`` tool returns for these arguments
        (`ContextManager.recall`)."""
        text: str = self._call("recall()", partial(self.manager.recall, id, offset, limit, pattern))
        return text

    def handle_recall(self, arguments: object) -> str:
        """The ``recall_context`` tool's result for the model's raw ``arguments``
        (`ContextManager.handle_recall`): unusable arguments get an explanation, not an error."""
        text: str = self._call("handle_recall()", partial(self.manager.handle_recall, arguments))
        return text

    def close(self) -> None:
        """End the session: the manager closes (cancelling its background work and reporting
        what it left, such as a billed briefing never spliced, as `SummaryStale` ``unused``,
        to the subscribers before this returns), then the loop thread ends. A second call
        does nothing."""
        self._refuse_in_event_loop("close()")
        if self._closed:
            return
        self._closed = True
        self._loop.close()

    def __enter__(self) -> Self:
        # Leaving an inner ``with`` would close the session under the outer one.
        if self._closed:
            raise ConfigError("this BlockingContextManager is closed: make a new one")
        if self._entered:
            raise ConfigError("this BlockingContextManager is entered already: enter it once")
        self._entered = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class LoopThread:
    """Enters ``manager`` on an event loop in a daemon thread (named ``agentctx``); `call`
    runs work there. `BlockingContextManager` and the blocking SDK wrappers
    (``wrap(Anthropic(), ctx)``) run their manager on one.

    The manager's background work (summaries) runs on that loop between the caller's model
    calls, and everything that touches the session (``prepare``, ``observe``) is run there
    too, so the caller's thread never races it. `close` exits the manager (cancelling its
    background work, reporting what it left), stops the loop and joins the thread.
    ``thread_id`` is that thread's ``threading.get_ident()``.

    One that is never closed is closed when it is collected, or when the interpreter exits
    (an uncaught exception, a forgotten ``close``), so the process does not hang at exit. It
    belongs to the process that made it: after ``fork`` the child has no loop thread, and
    its calls raise `ConfigError`.
    """

    def __init__(self, manager: ContextManager) -> None:
        self._closed = False
        self._pid = os.getpid()
        started: Future[BlockingPortal] = Future()
        thread = threading.Thread(target=_serve, args=(started,), name="agentctx", daemon=True)
        try:
            thread.start()
            self._portal = portal = started.result()
        except BaseException:
            if thread.ident is not None:
                # An interrupt (Ctrl-C) while the thread started: it may serve already, and
                # nothing else would ever stop it.
                with suppress(Exception):
                    serving = started.result(_STOPPING_SECONDS)
                    serving.call(serving.stop, True)
                thread.join(_STOPPING_SECONDS)
            raise
        session = portal.wrap_async_context_manager(manager)
        try:
            session.__enter__()
            self.thread_id: int = portal.call(threading.get_ident)
        except BaseException:
            with suppress(RuntimeError):
                portal.call(portal.stop, True)
            thread.join()
            raise
        # Closed explicitly, when collected, or by an exit hook while the thread still runs
        # (anyio's own portal context manager, left to module teardown, waited for a loop
        # thread that no longer ran: the process hung at exit).
        self._close_stack = weakref.finalize(self, _close, session, portal, thread, self._pid)

    @overload
    def call(self, func: Callable[..., Awaitable[T]], *args: Any) -> T: ...

    @overload
    def call(self, func: Callable[..., T], *args: Any) -> T: ...

    def call(self, func: Callable[..., Any], *args: Any) -> Any:
        """``func(*args)`` on the manager's loop (awaited if it is a coroutine function);
        what it raises is raised here, as itself. Raises `ConfigError` once closed, and on
        the loop thread itself (a subscriber callback), where waiting would deadlock."""
        if self._closed:
            raise ConfigError("the manager's loop thread is closed (its client was closed)")
        if threading.get_ident() == self.thread_id:
            raise ConfigError(
                "a blocking call was made on the manager's own loop thread (from a subscriber "
                "callback): it would wait for that thread, a deadlock; make the call after "
                "the one that emitted the event returns"
            )
        if os.getpid() != self._pid:
            raise ConfigError(
                f"this manager's loop thread runs in the process that made it ({self._pid}), "
                "not in this forked one: make a new manager here"
            )
        try:
            done = self._portal.call(_boxed, func, *args)
        except RuntimeError as e:  # the portal's own: what ``func`` raises comes boxed
            raise ConfigError(
                "the manager's loop thread has stopped (something raised SystemExit or "
                "KeyboardInterrupt on it, in a subscriber callback or a strategy)"
            ) from e
        if isinstance(done, _Raised):
            raise done.error
        return done

    def close(self) -> None:
        """Exit the manager, stop the loop and join its thread; a second call does nothing."""
        self._closed = True
        self._close_stack()
