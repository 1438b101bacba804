"""Errors raised by agentctx. Every one of them derives from `AgentCtxError`.

```
AgentCtxError
├── ConfigError                 a setting that cannot work (your code, fix it)
├── UnsupportedMessageError     a message, block or field agentctx cannot carry (index, kind)
├── TranscriptFormatError       a transcript file that is not what its format says (file, line)
├── BudgetExceededError         the budget cannot be met without dropping the task (in budget)
├── StoreError                  a store could not read or write
│   └── StoreDataError          it answered, with what cannot be read (trying again will not do)
├── MissingExtraError           an optional dependency is not installed (names the extra)
└── SummarizerError             a summarizer request failed (retryable?, HTTP status, Retry-After)
```

Cancellation is never wrapped: an outside ``CancelledError`` always propagates as is.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AgentCtxError",
    "ConfigError",
    "MissingExtraError",
    "StoreDataError",
    "StoreError",
    "SummarizerError",
    "TranscriptFormatError",
    "UnsupportedMessageError",
]


class AgentCtxError(Exception):
    """Root of every error agentctx raises. Errors pickle and copy with their attributes (one
    raised in a worker process reaches the parent as itself)."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt without the constructor: most subclasses take other arguments than the
        # message `args` holds, and `Exception`'s own reduce calls them with that alone.
        state = dict(self.__dict__)
        if isinstance(self, ImportError):  # fields of its own, not in __dict__
            state.update(msg=self.msg, name=self.name, path=self.path)
        return _restored, (type(self), self.args, state)


def _restored(cls: type[AgentCtxError], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    error = cls.__new__(cls, *args)
    error.args = args
    for name, value in state.items():
        setattr(error, name, value)
    return error


class ConfigError(AgentCtxError, ValueError):
    """A configuration value that cannot work."""


class UnsupportedMessageError(AgentCtxError, TypeError):
    """A history item agentctx cannot represent.

    Attributes:
        index: position of the offending message in the history, when known.
        kind: what was found (type name, role, block type).
    """

    def __init__(self, index: int | None, kind: str) -> None:
        self.index = index
        self.kind = kind
        where = f"message {index}: " if index is not None else ""
        super().__init__(f"{where}unsupported {kind}")


class TranscriptFormatError(AgentCtxError, ValueError):
    """A transcript file that does not parse as its format.

    Attributes:
        path: the file.
        line: 1-based line number (0 when the problem is the whole file).
        expected: what the parser expected to find there.
    """

    def __init__(self, path: str, line: int, expected: str) -> None:
        self.path = path
        self.line = line
        self.expected = expected
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: expected {expected}")


class StoreError(AgentCtxError):
    """A store failed to read or write."""


class StoreDataError(StoreError):
    """A store answered, but what it holds cannot be read (bytes that are no UTF-8 text, a
    Redis key of another type): unlike a store that is down, trying again will not help."""


class SummarizerError(AgentCtxError):
    """A summarizer request failed. Summarizers raise it; `LlmCompaction` decides on retries.

    Attributes:
        retryable: whether the same request may succeed later (429, 529/overloaded, 5xx,
            connection errors, timeouts). Only retryable errors are retried.
        status: the HTTP status, when there was one (an int from 100 to 999; anything else a
            summarizer passes is ``None``).
        retry_after: seconds the provider asked to wait (``Retry-After``), when it did; the
            caller clamps it.
        usage: what the provider billed, when a reply came and could not be used (a 200 of
            another shape): a `Usage`, or the reply's usage as ``usage_of`` reads it (an SDK
            usage object, a mapping), so the spend still counts it.
        code: the provider's own name for the error, when it sent one (OpenAI's ``code``,
            ``insufficient_quota``; Anthropic's error ``type``, ``rate_limit_error``).
    """

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        status: int | None = None,
        retry_after: float | None = None,
        usage: object = None,
        code: str | None = None,
    ) -> None:
        self.retryable = retryable
        self.code = code if isinstance(code, str) else None
        # A status is what a provider's server sent, read by a summarizer of one's own: a
        # value no server sends (10**5000 cannot even be formatted) says nothing.
        valid = type(status) is int and 100 <= status <= 999
        self.status = status if valid else None
        self.retry_after = retry_after
        self.usage = usage
        super().__init__(message)


class MissingExtraError(AgentCtxError, ImportError):
    """An optional dependency is not installed, or too old for the feature; the message names
    the extra that brings it.

    Attributes:
        extra: the extra to install (``pip install 'py-agentctx[EXTRA]'``).
        module: the module that could not be imported.
    """

    def __init__(
        self, extra: str, module: str | None, *, needed_by: str, why: str | None = None
    ) -> None:
        self.extra = extra
        super().__init__(
            f"{needed_by} needs the {extra!r} extra: pip install 'py-agentctx[{extra}]' "
            f"({why or f'no module named {module!r}'})",
            name=module,
        )
        self.module = module
