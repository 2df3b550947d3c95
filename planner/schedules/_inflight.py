"""Saved activations per device from the action order alone.

A device runs its actions one after another, so the level of its saved activations while
action k runs is everything allocated by actions before k and by k itself (a forward
allocates at its start) minus everything freed by actions that ended before k (a W or fused
BW frees at its end). That makes a device's peak a property of its order, the same for any
durations: no simulation is needed, which is what lets the search count in-flight
micro-batches for thousands of candidates. BPipe transfers are counted the way the engine
runs them: an EVICT frees the evictor's copy after the compute action it overlaps, a LOAD
allocates when issued; the acceptor's mirror allocates where its EVICT sits in its list and
frees before the compute action after its LOAD, once the send back has gone (as
:mod:`executor.transfers` does). Tests check these peaks against the simulator's.

:func:`inflight_profile` keeps, per device, the per-stage micro-batch counts at every moment
that could be the peak (only the Pareto-maximal ones), so that the peak for any per-stage
activation sizes is a small maximum of dot products.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from operator import ge

import numpy as np

from planner._arrays import sorted_distinct
from planner.schedules._ir import KIND_CODE, ActionKind, Schedule

__all__ = [
    "InflightProfile",
    "inflight_profile",
    "peak_by_order",
    "peak_from_profile",
    "profile_of_moments",
]

K = ActionKind

InflightProfile = list[list[dict[int, int]]]
"""Per device: candidate peak moments, each {stage: saved micro-batches of that stage}."""


_F, _W, _BW = KIND_CODE[K.F], KIND_CODE[K.W], KIND_CODE[K.BW]
_EVICT, _LOAD = KIND_CODE[K.EVICT], KIND_CODE[K.LOAD]
_IS_COMPUTE = np.array([kind.is_compute for kind in K])  # by kind code


def inflight_profile(schedule: Schedule) -> InflightProfile:
    """Per device, the Pareto-maximal per-stage counts of saved micro-batches of a valid
    schedule: each device's moments in decreasing order (of the counts as tuples by stage),
    a moment's stages in increasing order, stages it holds none of left out. Read off the
    schedule's columns, every device at once (a schedule made from columns makes no
    action for it).

    A device's saved micro-batches per stage while an action runs are a running sum of
    events, each placed at the action where it takes effect:

    - a forward, an acceptor's EVICT mirror (it receives) and an evictor's LOAD (it gets
      its copy back) add one where they are;
    - a W or fused BW frees at the next compute action or transfer (it has ended then: a
      transfer is issued after the previous compute action ended);
    - an evictor's EVICT frees at the second compute action after it (once the compute
      action it overlaps has ended), an acceptor's LOAD mirror at the next one (its send
      back is waited for before that).

    Frees that take effect at an action apply before what it adds, and the counts are read
    after it, so an inclusive running sum per device gives every moment. Only moments after
    a count went up are candidates: one reached by frees alone is dominated by the moment
    before it."""
    c = schedule.columns
    p, n, num_stages = schedule.num_devices, len(c.kind), schedule.num_stages
    kind, device, stage = c.kind, c.device, c.stage
    is_transfer = (kind == _EVICT) | (kind == _LOAD)
    tracked = (kind == _F) | is_transfer
    if not tracked.any():
        return [[] for _ in range(p)]
    # Slots: the stages each device tracks, in stage order.
    held = sorted_distinct(device[tracked] * num_stages + stage[tracked])
    held_device = held // num_stages
    first_slot = np.searchsorted(held_device, np.arange(p))
    width = int(np.bincount(held_device, minlength=p).max())

    def slot(at: np.ndarray) -> np.ndarray:
        """Slot (index among its device's stages) of the stage of the actions ``at``."""
        here = device[at]
        index: np.ndarray = np.searchsorted(held, here * num_stages + stage[at]) - first_slot[here]
        return index

    owner = np.asarray(schedule.stage_devices, dtype=np.int64)[stage] == device
    rises = np.flatnonzero(
        (kind == _F) | (is_transfer & (owner == (kind == _LOAD)))  # F, acceptor EVICT, LOAD
    )
    is_compute = _IS_COMPUTE[kind]
    computes = np.flatnonzero(is_compute)
    frees = []  # (action ids, where each frees)
    for at, ahead, after in (
        (np.flatnonzero((kind == _W) | (kind == _BW)), np.flatnonzero(is_compute | is_transfer), 0),
        (np.flatnonzero((kind == _EVICT) & owner), computes, 1),
        (np.flatnonzero((kind == _LOAD) & ~owner), computes, 0),
    ):
        found = np.searchsorted(ahead, at, side="right") + after
        inside = found < len(ahead)
        at, where = at[inside], ahead[found[inside]]
        same = device[where] == device[at]  # a free past the device's last action never happens
        frees.append((at[same], where[same]))
    size = n * width
    events = np.bincount(rises * width + slot(rises), minlength=size)
    for at, where in frees:
        events -= np.bincount(where * width + slot(at), minlength=size)
    level = np.cumsum(events.reshape(n, width), axis=0)
    # Every device's sum starts from zero: less what the devices before it left.
    start = c.offsets[:-1]
    before = np.zeros((p, width), dtype=level.dtype)
    before[start > 0] = level[start[start > 0] - 1]
    level -= np.repeat(before, np.diff(c.offsets), axis=0)
    stages = (held % num_stages).tolist()
    slots = [*first_slot.tolist(), len(stages)]
    slot_stages = [stages[begin:end] for begin, end in pairwise(slots)]
    return profile_of_moments(device[rises], level[rises], slot_stages)


def profile_of_moments(
    device: np.ndarray, counts: np.ndarray, slot_stages: Sequence[Sequence[int]]
) -> InflightProfile:
    """The :data:`InflightProfile` of a schedule's candidate peak moments: at moment k,
    device ``device[k]`` holds ``counts[k, i]`` saved micro-batches of the stage of its slot
    i, ``slot_stages[d]`` listing device d's stages in increasing order (a device with fewer
    slots than ``counts`` has columns has zero counts in the others). Keeps each device's
    distinct Pareto-maximal moments, in decreasing order, each without the stages it holds
    none of."""
    p = len(slot_stages)
    profile: InflightProfile = [[] for _ in range(p)]
    if not len(device):
        return profile
    moments = _distinct_rows(device, counts)
    if counts.shape[1] <= 2:
        front = moments[_pareto_2d(moments)].tolist()
    else:
        bounds = np.searchsorted(moments[:, 0], np.arange(p + 1)).tolist()
        front = []
        for d in range(p):
            front += _pareto(moments[bounds[d] : bounds[d + 1]][::-1].tolist())
    for d, *row in front:
        stages = slot_stages[d]
        profile[d].append({stages[i]: count for i, count in enumerate(row) if count})
    return profile


def _distinct_rows(device: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The distinct rows (device, counts...) in increasing order: each row read as one
    number in a mixed radix (what ``np.unique(..., axis=0)`` gives, several times faster)."""
    low = int(counts.min())
    radix = int(counts.max()) - low + 1
    if (int(device.max()) + 1) * radix ** counts.shape[1] >= 2**62:
        return np.unique(np.column_stack([device, counts]), axis=0)
    key = device.copy()
    for column in counts.T:
        key = key * radix + (column - low)
    key = sorted_distinct(key)
    rows = np.empty((len(key), counts.shape[1] + 1), dtype=np.int64)
    for i in range(counts.shape[1], 0, -1):
        key, rows[:, i] = np.divmod(key, radix)
    rows[:, 1:] += low
    rows[:, 0] = key
    return rows


def _pareto_2d(moments: np.ndarray) -> np.ndarray:
    """Indices of the rows of ``moments`` (device, first count[, second count]), distinct and
    in increasing order, that no other row of their device dominates: devices in order, each
    device's rows in decreasing order (as :func:`_pareto` lists them)."""
    order = np.lexsort((-np.arange(len(moments)), moments[:, 0]))  # devices up, rows down
    rows = moments[order]
    second = rows[:, 2] if rows.shape[1] > 2 else np.zeros(len(rows), dtype=rows.dtype)
    # In decreasing order a row is kept when its second count beats every earlier one of
    # its device: a running maximum made to restart per device by a per-device offset.
    span = int(second.max() - second.min()) + 1
    key = (second - second.min()) + rows[:, 0] * span
    best = np.maximum.accumulate(key)
    kept = np.ones(len(rows), dtype=bool)
    kept[1:] = key[1:] > best[:-1]
    return order[kept]


def _pareto(ordered: list[list[int]]) -> list[list[int]]:
    """The rows of ``ordered`` (distinct, in decreasing order, each a device and its counts)
    that no other row dominates (>= on every count). Only an earlier row can dominate a
    later one, and whatever dominates a dropped row dominates the rows that one does: so
    each row is compared with the rows kept so far only."""
    front: list[list[int]] = []
    for row in ordered:
        if not any(all(map(ge, kept, row)) for kept in front):
            front.append(row)
    return front


# From 2**24 on, neighbouring doubles are at least 2**-29 (1.9e-9) apart, so the decimal
# with 9 places nearest a double (within 5e-10 of it) is nearer to it than to any other
# double: round(x, 9) returns x itself. Peaks in bytes are far above it, and each round()
# of one costs half a microsecond (it formats the decimal), on every device of every
# candidate of a search.
ROUNDING_IS_EXACT_FROM = 2.0**24


def peak_from_profile(profile: InflightProfile, sizes: Sequence[float]) -> list[float]:
    """Peak saved activations per device for per-stage micro-batch ``sizes``, each rounded
    to 9 decimals (``round(peak, 9)``: sizes like 1/3 leave float dust that would make
    equal peaks differ)."""
    # Plain loops: the search calls this for every candidate, and they beat generators here.
    peaks = []
    for moments in profile:
        best = 0.0
        for moment in moments:
            total = 0.0
            for stage, count in moment.items():
                total += sizes[stage] * count
            if total > best:
                best = total
        # round() only where it can change the peak (see ROUNDING_IS_EXACT_FROM).
        peaks.append(best if best >= ROUNDING_IS_EXACT_FROM else round(best, 9))
    return peaks


def peak_by_order(schedule: Schedule, sizes: Sequence[float] | None = None) -> list[float]:
    """Peak saved activations per device; ``sizes[s]`` is one micro-batch of stage s
    (default ``1 / num_stages``, i.e. micro-batches of the whole model)."""
    n = schedule.num_stages
    return peak_from_profile(inflight_profile(schedule), [1.0 / n] * n if sizes is None else sizes)
