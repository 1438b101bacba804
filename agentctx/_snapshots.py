"""Copies of a caller's history items, to see which it changed in place since: what lets a
wrapper or an integration convert only what is new without missing an edit.

A history item (an SDK dict, a framework message) is mutable, so being the same object as on
the last call says nothing about its content; a deep copy taken when it was converted does.
Items are compared with ``==``: in C for dicts and lists, with the copy sharing every string
and number of the item, so an unchanged item costs a walk of its containers. A change ``==``
does not see (a ``1`` made ``True``, keys put in another order) is not seen here either.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = ["UNCOPIED", "Converted", "snapshot", "unchanged_prefix"]

T = TypeVar("T")


class _Unequal:
    """Stands for an item that could not be copied: equal to nothing, so it always counts
    as changed."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = None  # type: ignore[assignment]


UNCOPIED: object = _Unequal()
"""What `snapshot` gives for an item that cannot be copied."""


def snapshot(item: object) -> object:
    """A deep copy of ``item`` to compare it with later, or `UNCOPIED` (equal to nothing)."""
    try:
        return copy.deepcopy(item)
    except Exception:  # an object that refuses copying: it counts as changed on every call
        return UNCOPIED


def unchanged_prefix(items: Sequence[object], copies: Sequence[object]) -> int:
    """How many leading ``items`` still equal the copies taken of them; an item whose
    comparison raises (an array's ambiguous truth value) counts as changed. Lists are
    compared in one go."""
    n = min(len(items), len(copies))
    try:
        if items[:n] == copies[:n]:
            return n
    except Exception:  # found item by item below
        pass
    for i in range(n):
        try:
            if items[i] != copies[i]:
                return i
        except Exception:
            return i
    return n


class Converted(Generic[T]):
    """Items converted one by one, each kept while it still equals the copy taken when it was
    converted: `update` converts what is new, and what follows the first item changed."""

    def __init__(self) -> None:
        self._copies: list[object] = []
        self._converted: list[T] = []

    def update(self, items: Sequence[object], convert: Callable[[int, object], T]) -> list[T]:
        """What ``convert(index, item)`` gives for each of ``items`` (a list of its own)."""
        same = unchanged_prefix(items, self._copies)
        del self._copies[same:], self._converted[same:]
        for i in range(same, len(items)):
            copied = snapshot(items[i])
            # Made from the copy: the caller's later edits in place never reach it.
            converted = convert(i, items[i] if copied is UNCOPIED else copied)
            self._copies.append(copied)
            self._converted.append(converted)
        return list(self._converted)
