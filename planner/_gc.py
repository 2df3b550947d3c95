"""Pause Python's cyclic garbage collector while a search runs.

A search builds hundreds of schedules: millions of small objects (actions, tuples, dicts)
that reference counting frees on its own; none form cycles. The cyclic collector still
walks them, and every full collection also walks the per-process schedule caches. Measured
on the 1,024-GPU benchmark request (``benchmarks/planner_speed.py``), that was about a
quarter of a cold search (2.36 s with the collector on, 1.73 s with it off).

The pause is counted, not toggled: the service runs plans on several threads at once, and
the collector is process-wide, so it comes back on when the last search that paused it ends
(and stays off if something else had turned it off before).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["collector_paused"]

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextmanager
def collector_paused() -> Iterator[None]:
    """Run the body with the cyclic collector off; restore it when the last such body ends."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
