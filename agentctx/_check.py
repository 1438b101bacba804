"""Checks of configuration values, with errors that name what they got.

```python
def __post_init__(self) -> None:
    whole(self, "keep_recent")                      # an int >= 0, not a bool
    number(self, "expire_seconds")                  # a finite int or float >= 0
    fraction(self, "usage_fraction")                # a finite number in (0, 1]
```

Every error is a `ConfigError` that names the class, the field and the value it got, and says
when that value was the field's default (so ``ContextManager(10_000)`` tells you the reserve it
rejected is the default 16,000, not something you passed).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any

from agentctx.errors import ConfigError

__all__ = ["fraction", "got", "number", "preview", "whole"]

_PREVIEW_CHARS = 40
_MAX = sys.maxsize


def preview(value: object, width: int = _PREVIEW_CHARS) -> str:
    """A short, safe rendering of ``value`` for an error message.

    Never the whole of a huge string, never ``repr`` of a container (a deeply nested one
    raises `RecursionError`), never ``str`` of a huge int (it raises past 4300 digits).
    """
    if isinstance(value, str):
        more = f"... ({len(value)} chars)" if len(value) > width else ""
        return repr(value[:width]) + more
    if value is None or isinstance(value, bool | float):
        return repr(value)
    if isinstance(value, int):
        return str(value) if -(10**18) < value < 10**18 else "a very large int"
    return f"a {type(value).__name__}"


def got(obj: object, *names: str) -> str:
    """``name=value`` for each of ``names`` of ``obj``, marking a dataclass's defaults."""
    fields = dataclasses.fields(obj) if dataclasses.is_dataclass(obj) else ()
    defaults = {f.name: f.default for f in fields if f.default is not dataclasses.MISSING}
    parts = []
    for name in names:
        value = getattr(obj, name)
        default = defaults.get(name, dataclasses.MISSING)
        mark = " (the default)" if type(value) is type(default) and value == default else ""
        parts.append(f"{name}={preview(value)}{mark}")
    return ", ".join(parts)


def _fail(obj: object, name: str, what: str) -> ConfigError:
    return ConfigError(f"{type(obj).__name__}.{name} must be {what}; got {got(obj, name)}")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _finite(value: int | float) -> bool:
    """``math.isfinite``, which raises `OverflowError` on an int past a float's range."""
    return isinstance(value, int) or math.isfinite(value)


def whole(obj: object, name: str, *, minimum: int = 0, optional: bool = False) -> None:
    """``obj.name`` is an ``int`` (not a bool) from ``minimum`` to ``sys.maxsize`` (or
    ``None`` if ``optional``): a larger one means nothing more, and overflows a float."""
    value: Any = getattr(obj, name)
    if value is None and optional:
        return
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= _MAX:
        none = " or None" if optional else ""
        raise _fail(obj, name, f"a whole number from {minimum} to sys.maxsize{none}")


def number(
    obj: object,
    name: str,
    *,
    minimum: float = 0.0,
    maximum: float | None = None,
    optional: bool = False,
) -> None:
    """``obj.name`` is a finite int or float from ``minimum`` to ``maximum`` (or ``None`` if
    ``optional``)."""
    value: Any = getattr(obj, name)
    if value is None and optional:
        return
    if (
        not _is_number(value)
        or not _finite(value)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        none = " or None" if optional else ""
        most = f" and <= {maximum:g}" if maximum is not None else ""
        raise _fail(obj, name, f"a finite number >= {minimum:g}{most}{none}")


def fraction(obj: object, name: str, *, optional: bool = False) -> None:
    """``obj.name`` is a finite number in (0, 1] (or ``None`` if ``optional``)."""
    value: Any = getattr(obj, name)
    if value is None and optional:
        return
    if not _is_number(value) or not _finite(value) or not 0 < value <= 1:
        none = " or None" if optional else ""
        hint = " (a fraction, not a percentage)" if _is_number(value) and value > 1 else ""
        raise _fail(obj, name, f"a 0-1 fraction above 0{none}{hint}")
