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
                    gc.enable()
            elif _was_enabled and time.monotonic() - _collected_at > MAX_PAUSE_S:
                collect = True
                _collected_at = time.monotonic()
        if collect:  # outside the lock: finalizers it runs may start a search themselves
            gc.collect()
