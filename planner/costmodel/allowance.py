"""The memory allowance, fitted to out-of-memory labels instead of chosen.

A device needs ``tensors x (1 + fragmentation) + workspace`` bytes (see
:func:`planner.costmodel.evaluate.memory_allowance`): ``tensors`` is what the memory model
counts (weights, gradients, optimizer states, activations), the allowance is what it does
not: the caching allocator's fragmentation, cuBLAS/NCCL workspaces, transient buffers. A
measured run that fitted says ``need <= capacity``; a configuration that ran out of memory
says ``need > capacity``. Each label is a linear inequality in (workspace, fragmentation),
so the labels bound a region of the plane; :func:`fit_allowance` takes the point that agrees
with the most labels and, among those, lies farthest from the nearest label's boundary,
measured in GiB of counted tensors (how far the memory model could be off before that label
flips) -- the maximum-margin choice, as a support-vector classifier makes it.

This is a classification fit of two parameters on labels (which the least-squares time fit
of :mod:`planner.calibrate` cannot use: a label has no magnitude). The BPipe paper's Table 7
gives such labels (each row ran with its recompute; every lighter recompute, and 1F1B for
the BPipe rows, ran out of memory); ``benchmarks/paper_reproduction.py --fit-allowance``
fits them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from planner.costmodel.memory import GIB

__all__ = ["AllowanceFit", "MemoryLabel", "fit_allowance"]


@dataclass(frozen=True)
class MemoryLabel:
    """A configuration's counted tensor bytes (worst device, no allowance) and whether it
    ran (``fits``) or ran out of memory."""

    tensor_bytes: float
    fits: bool
    label: str = ""


@dataclass(frozen=True)
class AllowanceFit:
    """The fitted allowance, how many labels agree with it, and the margin: the GiB of
    counted tensors by which the nearest label would have to change to flip."""

    workspace_gib: float
    fragmentation: float
    agreed: int
    total: int
    margin_gib: float
    disagreeing: tuple[MemoryLabel, ...]

    def predicts_fit(self, tensor_bytes: float, capacity_bytes: float) -> bool:
        need = tensor_bytes * (1 + self.fragmentation) + self.workspace_gib * GIB
        return need <= capacity_bytes


def fit_allowance(
    labels: Sequence[MemoryLabel],
    capacity_bytes: float,
    *,
    workspace_gib: tuple[float, float] = (0.0, 16.0),
    fragmentation: tuple[float, float] = (0.0, 0.5),
    fragmentation_step: float = 0.001,
) -> AllowanceFit:
    """The (workspace, fragmentation) within the bounds that agrees with the most labels,
    then with the largest margin, then with the least fragmentation (see the module
    docstring). ValueError when there are no labels or the bounds are empty."""
    if not labels:
        raise ValueError("fit_allowance needs at least one label")
    (w_lo, w_hi), (f_lo, f_hi) = workspace_gib, fragmentation
    if not (w_lo <= w_hi and f_lo <= f_hi and fragmentation_step > 0):
        raise ValueError("fit_allowance: each lower bound must not exceed its upper bound")
    tensors = np.array([x.tensor_bytes / GIB for x in labels])
    fits = np.array([x.fits for x in labels])
    capacity = capacity_bytes / GIB
    best: tuple[int, float, float, float] | None = None  # agreed, margin, -f, w
    steps = int(round((f_hi - f_lo) / fragmentation_step))
    for f in np.linspace(f_lo, f_hi, steps + 1):
        # Label i agrees at workspace w iff (fits and w <= c_i) or (not fits and w > c_i).
        c = capacity - tensors * (1 + f)
        edges = np.unique(np.clip(c, w_lo, w_hi))
        candidates = np.concatenate(([w_lo, w_hi], edges, (edges[:-1] + edges[1:]) / 2))
        agree = np.where(fits[None, :], candidates[:, None] <= c, candidates[:, None] > c)
        counts = agree.sum(axis=1)
        top = counts.max()
        for w0 in candidates[counts == top]:
            w, margin = _widest(w0, c, w_lo, w_hi)
            # Margins equal to a nanobyte are ties (then the least fragmentation wins).
            key = (int(top), round(float(margin / (1 + f)), 9), -float(f), w)
            if best is None or key[:3] > best[:3]:
                best = key
    assert best is not None
    agreed, margin, neg_f, w = best
    f = -neg_f + 0.0
    fitted = AllowanceFit(w, f, agreed, len(labels), margin, ())
    wrong = tuple(
        x for x in labels if fitted.predicts_fit(x.tensor_bytes, capacity_bytes) != x.fits
    )
    return AllowanceFit(w, f, agreed, len(labels), margin, wrong)


def _widest(w0: float, c: np.ndarray, lo: float, hi: float) -> tuple[float, float]:
    """Within the stretch of workspace values between the label boundaries around ``w0``
    (the same labels agree all along it), the point farthest from both ends, clipped to
    the bounds, and its distance to the nearer boundary."""
    below = c[c < w0]
    above = c[c >= w0]
    left = float(below.max()) if below.size else -np.inf
    right = float(above.min()) if above.size else np.inf
    if np.isinf(left) and np.isinf(right):
        return lo, np.inf
    if np.isinf(left):
        w = lo if right >= lo else right
    elif np.isinf(right):
        w = hi if left <= hi else left
    else:
        w = min(max((left + right) / 2, lo), hi)
    return w, float(min(w - left, right - w))
