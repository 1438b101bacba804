"""The manager's async side on an event loop of its own, for the blocking SDK clients: the
loop thread is the core's (`agentctx.blocking.LoopThread`, which `BlockingContextManager`
uses too)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Self

from agentctx.blocking import LoopThread

if TYPE_CHECKING:
    from types import TracebackType

    from agentctx.manager import ContextManager

__all__ = ["BlockingClient", "LoopThread"]


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
