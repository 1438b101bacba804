"""The manager's async side on an event loop of its own, for the blocking SDK clients."""

from __future__ import annotations

from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, Self, TypeVar, overload

from anyio.from_thread import start_blocking_portal

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from types import TracebackType

    from agentctx.manager import ContextManager

__all__ = ["BlockingClient", "LoopThread"]

T = TypeVar("T")


class LoopThread:
    """Enters ``manager`` on an event loop in a daemon thread; `call` runs work there.

    The manager's background work (summaries) runs on that loop between the caller's model
    calls, and everything that touches the session (``prepare``, ``observe``) is run there
    too, so the caller's thread never races it. `close` exits the manager (cancelling its
    background work) and stops the loop.
    """

    def __init__(self, manager: ContextManager) -> None:
        self._stack = ExitStack()
        self._portal = self._stack.enter_context(start_blocking_portal(name="agentctx"))
        try:
            self._stack.enter_context(self._portal.wrap_async_context_manager(manager))
        except BaseException:
            self._stack.close()
            raise

    @overload
    def call(self, func: Callable[..., Awaitable[T]], *args: Any) -> T: ...

    @overload
    def call(self, func: Callable[..., T], *args: Any) -> T: ...

    def call(self, func: Callable[..., Any], *args: Any) -> Any:
        """``func(*args)`` on the manager's loop (awaited if it is a coroutine function)."""
        return self._portal.call(func, *args)

    def close(self) -> None:
        self._stack.close()


class BlockingClient:
    """What the blocking client wrappers share: the wrapped ``client``, the loop thread the
    manager runs on, attribute pass-through, and closing both (``with`` or `close`).

    A wrapper made with the ``loop`` of another (``with_options``) shares it and leaves it
    open when closed: the one that started it closes it.
    """

    def __init__(
        self, client: Any, manager: ContextManager, loop: LoopThread | None = None
    ) -> None:
        self.client = client
        self.manager = manager
        self._owns_loop = loop is None
        self._loop = LoopThread(manager) if loop is None else loop

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def close(self) -> None:
        """Close the manager (cancelling background summaries) and the client."""
        try:
            if self._owns_loop:
                self._loop.close()
        finally:
            self.client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
