"""The SDK client a summarizer sends through: SDK retries off, owned or borrowed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Self, TypeVar

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["ClientOwner", "retryless"]

C = TypeVar("C")


def retryless(
    make: type[C],
    client: C | None,
    api_key: str | None,
    base_url: str | None,
    timeout: float | None,
) -> C:
    """``client`` with SDK retries off (a copy: the caller's own is untouched), or a new one
    made from ``api_key``, ``base_url`` and ``timeout``. agentctx's guards do the retrying."""
    options: dict[str, Any] = {"max_retries": 0}
    if timeout is not None:
        options["timeout"] = timeout
    if client is None:
        return make(api_key=api_key, base_url=base_url, **options)  # type: ignore[call-arg]
    made: C = client.with_options(**options)  # type: ignore[attr-defined]
    return made


class ClientOwner:
    """Closes ``self.client`` on `aclose` (and ``async with``) only if it was made here."""

    client: Any
    _owned: bool

    async def aclose(self) -> None:
        """Close the client if this summarizer made it (a client passed in is the caller's)."""
        if self._owned:
            await self.client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
