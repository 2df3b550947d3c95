"""Pause Python's cyclic garbage collector while a search runs.

A search builds hundreds of schedules: millions of small objects (actions, tuples, dicts)
that reference counting frees on its own; none form cycles. The cyclic collector still
walks them, and every full collection also walks the per-process schedule caches. Measured
on the 1,024-GPU benchmark request (``benchmarks/planner_speed.py``), that was about a
quarter of a cold search (2.36 s with the collector on, 1.73 s with it off).

The pause is counted, not toggled: the service runs plans on several threads at once, and
the collector is process-wide, so it comes back on when the last search that paused it ends
(and stays off if something else had turned it off before). Under a steady stream of
overlapping searches that moment might never come, and cyclic garbage made meanwhile (by
the web server, say) would pile up: so a search that ends while others still run collects
explicitly once the collector has been off for ``MAX_PAUSE_S`` (a full collection after a
1,024-GPU search takes about 60 ms).

What a search leaves behind (its plan, the per-process caches of built shapes and compiled
schedules) is long-lived, and all of it is young to the collector: turned back on, it would
walk those tens of thousands of objects in its first generation at the next allocation
(about 12 ms after the 1,024-GPU search), and again in the second, finding nothing to free.
So the last search to end moves them straight into the oldest generation
(:func:`_promote_survivors`); a full collection still walks them, as it walks everything.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["collector_paused"]

MAX_PAUSE_S = 30.0

_lock = threading.Lock()
_depth = 0
_was_enabled = False
_collected_at = 0.0  # monotonic time of the pause's start or its last explicit collection


@contextmanager
def collector_paused() -> Iterator[None]:
    """Run the body with the cyclic collector off; restore it when the last such body ends."""
    global _depth, _was_enabled, _collected_at
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            _collected_at = time.monotonic()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        collect = False
        with _lock:
            _depth -= 1
            if _depth == 0:
                if _was_enabled:
                    _promote_survivors()
                    gc.enable()
            elif _was_enabled and time.monotonic() - _collected_at > MAX_PAUSE_S:
                collect = True
                _collected_at = time.monotonic()
        if collect:  # outside the lock: finalizers it runs may start a search themselves
            gc.collect()


def _promote_survivors() -> None:
    """Move every object the collector tracks into its oldest generation (freezing and
    unfreezing them does that without walking them) and reset the count of allocations
    that triggers a young collection. Not while something else keeps objects frozen
    (``gc.freeze``: the service freezes what it loaded at start-up, api/app.py), since
    unfreezing would undo that; the collector then walks the survivors as before."""
    if gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()
