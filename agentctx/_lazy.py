"""Module attributes imported on first use (PEP 562), for what only some sessions need.

```python
_LAZY = {"SQLiteRecallStore": "agentctx.recall.sqlite"}
__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())
```
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping


def lazy_attributes(
    module: str, sources: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """A module's ``__getattr__`` and ``__dir__``: each name in ``sources`` (name → the module
    that defines it) is imported on first access, then kept in ``namespace``."""

    def __getattr__(name: str) -> object:
        source = sources.get(name)
        if source is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *sources})

    return __getattr__, __dir__
