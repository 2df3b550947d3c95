"""V orders into the schedule IR: each device's pass ids (see :mod:`._vframe`) become the
schedule's columns at once (a V schedule is large), and its actions are made from them; or
straight into what the memory model reads of that schedule (:func:`order_profile`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from planner.schedules._inflight import InflightProfile, profile_of_moments
from planner.schedules._ir import (
    KIND_CODE,
    ActionKind,
    Columns,
    Schedule,
    v_placement,
)
from planner.schedules._vframe import CHUNK, F1, PASSES, W0

__all__ = ["order_profile", "to_schedule"]


def to_schedule(
    name: str,
    orders: Sequence[Sequence[int]] | np.ndarray,
    num_microbatches: int,
    meta: dict[str, object],
    split_backward: bool = True,
) -> Schedule:
    """The IR of V orders: each device's passes, then its two optimizer steps. Without
    ``split_backward`` a B and the W right after it are one BW (1F1B-V). The schedule's
    columns are computed from the pass ids at once (a V schedule is large) and the actions
    made from them."""
    d, m = len(orders), num_microbatches
    columns = _columns_of(orders, m, split_backward)
    return Schedule.from_columns(
        name, d, m, v_placement(d), columns, split_backward=split_backward, meta=meta
    )


_STEP_CODE = KIND_CODE[ActionKind.OPTIMIZER_STEP]
_F, _B, _BW, _W = (KIND_CODE[k] for k in (ActionKind.F, ActionKind.B, ActionKind.BW, ActionKind.W))
_PASS_CODE = {  # kind code of each pass code, with the backward split (W apart) or fused
    True: np.array([_F, _F, _B, _B, _W, _W]),
    False: np.array([_F, _F, _BW, _BW]),
}


def _columns_of(
    orders: Sequence[Sequence[int]] | np.ndarray, m: int, split_backward: bool
) -> Columns:
    """:class:`Columns` of the schedule :func:`to_schedule` makes, from the pass ids."""
    d = len(orders)
    passes = [np.asarray(order, dtype=np.int64) for order in orders]
    if not split_backward:  # a W is part of the BW its B stands for
        passes = [row[row % PASSES < W0] for row in passes]
    sizes = [len(row) + 2 for row in passes]
    ids = np.full(sum(sizes), -1, np.int64)
    offsets = np.zeros(d + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    for i, row in enumerate(passes):
        ids[offsets[i] : offsets[i + 1] - 2] = row
    device = np.repeat(np.arange(d, dtype=np.int64), sizes)
    is_step = ids < 0
    # The two steps of a device: chunk 0, then chunk 1.
    step_chunk = np.zeros(len(ids), np.int64)
    step_chunk[offsets[1:] - 1] = 1
    code = np.where(is_step, -1, ids % PASSES)
    chunk = np.where(is_step, step_chunk, np.array(CHUNK)[np.maximum(code, 0)])
    stage = np.where(chunk == 0, device, 2 * d - 1 - device)
    pass_code = _PASS_CODE[split_backward]
    return Columns(
        device=device,
        kind=np.where(is_step, _STEP_CODE, pass_code[np.maximum(code, 0)]),
        stage=stage,
        microbatch=np.where(is_step, m - 1, (ids // PASSES) % m),
        chunk=chunk,
        peer=np.full(len(ids), -1, np.int64),
        version=np.full(len(ids), -1, np.int64),
        offsets=offsets,
    )


_IN_CHUNK_1 = np.array(CHUNK) == 1  # by pass code


def order_profile(orders: Sequence[Sequence[int]] | np.ndarray) -> InflightProfile:
    """The in-flight profile (:func:`~planner.schedules._inflight.inflight_profile`) of the
    schedule :func:`to_schedule` makes of V orders with the backward split, read off the pass
    ids without making it: the memory model of a V shape needs no more.

    It counts as ``inflight_profile`` does. Device i saves micro-batches of two stages, i
    (chunk 0) and 2d - 1 - i (chunk 1), in that order of its slots; a forward adds one to
    its chunk where it is, a W frees one at the next compute action (every pass is one, and
    the optimizer steps after a device's passes come after its last forward, where no
    moment is read), and the counts are read after each forward."""
    ids = np.asarray(orders, dtype=np.int64)
    d = len(ids)
    code = ids % PASSES
    forward = code <= F1
    weight = code >= W0
    device, position = np.nonzero(forward)
    counts = np.empty((len(device), 2), np.int64)
    for slot, mine in enumerate((~_IN_CHUNK_1[code], _IN_CHUNK_1[code])):
        freed = weight & mine
        level = np.cumsum(forward & mine, axis=1) - (np.cumsum(freed, axis=1) - freed)
        counts[:, slot] = level[device, position]
    return profile_of_moments(device, counts, [(i, 2 * d - 1 - i) for i in range(d)])
