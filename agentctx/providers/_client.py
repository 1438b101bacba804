"""The SDK client a summarizer sends through: SDK retries off, owned or borrowed, and its
errors mapped to `SummarizerError` (both SDKs share one exception hierarchy)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Self, TypeVar

from agentctx._usage import UNSTATED, usage_of
from agentctx.errors import ConfigError, SummarizerError
from agentctx.messages import Usage
from agentctx.providers._retry_after import retry_after_seconds
from agentctx.summarizer import SummaryResult, check_result, is_retryable_status

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType, TracebackType


__all__ = ["ClientOwner", "read_reply", "retryless", "summarizer_error"]

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
        try:
            return make(api_key=api_key, base_url=base_url, **options)  # type: ignore[call-arg]
        except Exception as e:  # its HTTP layer's error for a value it cannot use (a URL, ...)
            sdk = make.__module__.split(".")[0]
            if type(e).__module__.split(".")[0] == sdk:
                raise  # the SDK's own (a missing key), as it words it
            raise ConfigError(f"cannot make the {sdk} client: {type(e).__name__}: {e}") from e
    # A client from agentctx's wrap() sends through the session's compactor; a summarizer's
    # own requests must not, so it gets the SDK client underneath.
    inner = getattr(client, "client", None)
    if isinstance(inner, make):
        client = inner
    if not isinstance(client, make):
        # A blocking client's requests would run on the session's loop, stalling it, and
        # what they return cannot be awaited: every paid summary would be thrown away.
        raise ConfigError(
            f"the summarizer needs an {make.__module__.split('.')[0]}.{make.__name__} "
            f"(its requests are awaited on the session's loop), got {type(client).__name__}"
        )
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


UNREADABLE = (ValueError, RecursionError)
"""What the SDKs' parse of a 200 body can raise besides their own errors: invalid JSON (a
`json.JSONDecodeError`), an int past what Python reads (4300 digits), JSON nested too deep."""


def read_reply(
    sdk: ModuleType, read: Callable[[], SummaryResult], billed: Callable[[], object]
) -> SummaryResult:
    """``read()``, the result made from a reply the SDK parsed, checked (`check_result`); a
    reply of another shape (a field missing or of another type: a proxy's or a look-alike
    server's) is `SummarizerError`, retryable as an unreadable 200 is (`summarizer_error`),
    not a bare error from inside nor a result the strategy refuses as a bug. It carries what
    ``billed()`` reads of the reply's usage, as ``read`` would: the request was billed."""
    try:
        return check_result(read())
    except (TypeError, AttributeError, KeyError, IndexError, SummarizerError, *UNREADABLE) as exc:
        try:
            usage: object = billed()
        except Exception:  # a reply of any shape: its usage is as likely to be broken
            usage = None
        if usage is None:  # a 200 all the same: billed, for an amount no one told
            usage = UNSTATED
        raise SummarizerError(
            f"{sdk.__name__}: unreadable response ({type(exc).__name__}: {exc})",
            retryable=True,
            usage=usage,
        ) from exc


def summarizer_error(sdk: ModuleType, exc: BaseException) -> SummarizerError:
    """The one place an ``anthropic`` or ``openai`` SDK error (``sdk`` is the module) becomes
    `SummarizerError`.

    Rate limits (429, with ``Retry-After``), overload (Anthropic's 529, OpenAI's 503), 408/409
    and every 5xx, connection errors and timeouts are retryable; other HTTP errors (400, 401,
    403, 404, 413, ...) are not. A 200 response the SDK could not read (invalid JSON, an int
    past 4300 digits, JSON nested too deep, a byte that is not UTF-8) is retryable, a server
    fault like a 5xx, and billed (the usage its body states, else an unknown amount). A
    request the client could not encode (a header with a character past ASCII) was never
    sent: not billed, not retried.
    """
    name = sdk.__name__
    if isinstance(exc, sdk.APITimeoutError):
        return SummarizerError(f"{name}: request timed out: {exc}", retryable=True)
    if isinstance(exc, sdk.APIConnectionError):
        return SummarizerError(f"{name}: connection failed: {exc}", retryable=True)
    if isinstance(exc, sdk.APIStatusError):
        status = exc.status_code
        return SummarizerError(
            f"{name}: HTTP {status}: {exc.message}",
            retryable=is_retryable_status(status),
            status=status,
            retry_after=retry_after_seconds(exc.response.headers),
            code=_error_code(exc),
        )
    if isinstance(exc, UnicodeEncodeError):
        # Raised making the request (a header the client cannot encode): nothing was sent,
        # and every attempt would fail the same way.
        return SummarizerError(f"{name}: the request could not be sent: {exc}", retryable=False)
    if isinstance(exc, sdk.APIResponseValidationError | ValueError | RecursionError):
        # A 200 came, and was billed: for what its body states, or an amount no one told.
        usage = _usage_in_body(exc) or Usage()
        return SummarizerError(f"{name}: unreadable response: {exc}", retryable=True, usage=usage)
    return SummarizerError(f"{name}: {type(exc).__name__}: {exc}", retryable=False)


def _error_code(exc: BaseException) -> str | None:
    """The provider's name for an HTTP error: OpenAI's ``code`` (``insufficient_quota``),
    else the error object's ``type`` (Anthropic's ``rate_limit_error``)."""
    code = getattr(exc, "code", None)
    if isinstance(code, str):
        return code
    body = getattr(exc, "body", None)
    error = body.get("error", body) if isinstance(body, dict) else None
    kind = error.get("type") if isinstance(error, dict) else None
    return kind if isinstance(kind, str) else None


_MOST_BODY_BYTES = 1 << 24


def _usage_in_body(exc: BaseException) -> Usage | None:
    """What a 200 body that is not UTF-8 (a server that split a multibyte character) reports
    it was billed: the request was, and its usage is in the body the SDK could not decode,
    read again with the bad bytes replaced."""
    body = exc.object if isinstance(exc, UnicodeDecodeError) else None
    if not isinstance(body, bytes) or len(body) > _MOST_BODY_BYTES:
        return None
    try:
        data = json.loads(body.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return None
    return usage_of(data) if isinstance(data, dict) else None
