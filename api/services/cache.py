"""A bounded, thread-safe, least-recently-used cache of what a done plan answers.

A done plan never changes again (only deleting it does), so what is derived from it (its
encoded JSON, a candidate's timeline) can be kept per process. Entries are keyed by
(plan id, detail) — which rendering, which candidate — so that deleting a plan forgets all
of them at once. ``capacity`` is in the units of ``weight`` (bytes of JSON, actions of a
timeline); an entry heavier than the whole capacity is not kept.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["PerPlanCache"]

D = TypeVar("D")
V = TypeVar("V")


class PerPlanCache(Generic[D, V]):
    """Values by (plan id, detail), least recently used first out, at most ``capacity``
    units of ``weight`` in all."""

    def __init__(self, capacity: int, weight: Callable[[V], int]) -> None:
        self.capacity = capacity
        self._weight = weight
        self._items: OrderedDict[tuple[str, D], tuple[V, int]] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def get(self, plan_id: str, detail: D) -> V | None:
        key = (plan_id, detail)
        with self._lock:
            found = self._items.get(key)
            if found is None:
                return None
            self._items.move_to_end(key)
            return found[0]

    def put(self, plan_id: str, detail: D, value: V) -> None:
        """Keep ``value``; the first value stored for a key stays (a done plan's answer
        does not change, so a second computation of it is the same)."""
        size = self._weight(value)
        if size > self.capacity:
            return
        key = (plan_id, detail)
        with self._lock:
            if key in self._items:
                return
            self._items[key] = (value, size)
            self._size += size
            while self._size > self.capacity:
                _, (_, dropped) = self._items.popitem(last=False)
                self._size -= dropped

    def forget(self, plan_id: str) -> None:
        """Drop every entry of plan ``plan_id`` (it was deleted)."""
        with self._lock:
            for key in [k for k in self._items if k[0] == plan_id]:
                self._size -= self._items.pop(key)[1]

    def __len__(self) -> int:
        return len(self._items)
