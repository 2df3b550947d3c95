"""A bounded, thread-safe, least-recently-used cache of what a done plan answers.

A done plan never changes again (only deleting it does), so what is derived from it (its
encoded JSON, a candidate's timeline) can be kept per process. Entries are keyed by
(plan id, detail) — which rendering, which candidate — so that deleting a plan forgets all
of them at once. ``capacity`` is in the units of ``weight`` (bytes of JSON, actions of a
timeline); an entry heavier than the whole capacity is not kept.

A value computed from a plan read before the plan was deleted must not be stored after
the deletion was applied here. Every forget moves the cache's ``generation`` on; a caller
notes it before reading the plan and passes it to :meth:`PerPlanCache.put`, which keeps
nothing if anything was forgotten since (a rare, harmless miss).
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
        self._generation = 0

    @property
    def generation(self) -> int:
        """Moves on with every :meth:`forget` and :meth:`clear`."""
        return self._generation

    def get(self, plan_id: str, detail: D) -> V | None:
        key = (plan_id, detail)
        with self._lock:
            found = self._items.get(key)
            if found is None:
                return None
            self._items.move_to_end(key)
            return found[0]

    def put(self, plan_id: str, detail: D, value: V, *, since: int) -> None:
        """Keep ``value``, computed from a plan read when the cache's generation was
        ``since``; nothing is kept if a plan was forgotten since then (it may have been
        this one). The first value stored for a key stays (a done plan's answer does not
        change, so a second computation of it is the same)."""
        size = self._weight(value)
        if size > self.capacity:
            return
        key = (plan_id, detail)
        with self._lock:
            if since != self._generation or key in self._items:
                return
            self._items[key] = (value, size)
            self._size += size
            while self._size > self.capacity:
                _, (_, dropped) = self._items.popitem(last=False)
                self._size -= dropped

    def forget(self, plan_id: str) -> None:
        """Drop every entry of plan ``plan_id`` (it was deleted)."""
        with self._lock:
            self._generation += 1
            for key in [k for k in self._items if k[0] == plan_id]:
                self._size -= self._items.pop(key)[1]

    def clear(self) -> None:
        """Drop every entry (plans may have been deleted unseen)."""
        with self._lock:
            self._generation += 1
            self._items.clear()
            self._size = 0

    def __len__(self) -> int:
        return len(self._items)
