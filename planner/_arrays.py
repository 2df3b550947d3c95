"""NumPy helpers the search's hot paths share."""

from __future__ import annotations

import numpy as np

__all__ = ["sorted_distinct"]


def sorted_distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values of a 1-D array in increasing order: ``np.unique(values)``.

    Written out because ``np.unique`` imports ``numpy.ma`` on its first call (to check for a
    masked array), about a fiftieth of a second that every fresh ``stagewright plan`` would
    pay inside its search."""
    ordered = np.sort(values)
    if len(ordered) < 2:
        return ordered
    keep = np.empty(len(ordered), bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]
