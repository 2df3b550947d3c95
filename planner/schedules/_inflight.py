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

from planner.schedules._ir import Action, ActionKind, Schedule

__all__ = ["InflightProfile", "inflight_profile", "peak_by_order", "peak_from_profile"]

K = ActionKind

_TRANSFERS = frozenset({K.EVICT, K.LOAD})
_COMPUTE = frozenset(k for k in K if k.is_compute)
_TRACKED = _TRANSFERS | {K.F}

InflightProfile = list[list[dict[int, int]]]
"""Per device: candidate peak moments, each {stage: saved micro-batches of that stage}."""


def inflight_profile(schedule: Schedule) -> InflightProfile:
    """Per device, the Pareto-maximal per-stage counts of saved micro-batches."""
    stage_devices = schedule.stage_devices
    profile: InflightProfile = []
    for device, row in enumerate(schedule.actions):
        stages = sorted({a.stage for a in row if a.kind in _TRACKED})
        if len(stages) == 1 and not any(a.kind in _TRANSFERS for a in row):
            profile.append([{stages[0]: saved_peak(row)}])
            continue
        seen = _moments(row, stages, stage_devices, device)
        profile.append([{stages[i]: c for i, c in enumerate(v) if c} for v in _pareto(seen)])
    return profile


def saved_peak(row: Sequence[Action]) -> int:
    """Peak saved micro-batches of an action list without transfers, every forward counted
    alike (one stage's, or all stages' as one): forwards minus finished frees."""
    level = peak = 0
    pending = 0
    for action in row:
        kind = action.kind
        if kind in _COMPUTE:
            level -= pending
            pending = 0
            if kind is K.F:
                level += 1
                peak = max(peak, level)
            elif kind is K.W or kind is K.BW:
                pending = 1
    return peak


def _moments(
    row: Sequence[Action], stages: list[int], stage_devices: Sequence[int], device: int
) -> set[tuple[int, ...]]:
    """Walk one device's list and collect its saved micro-batches per stage (numbered by
    position in ``stages``) while each action runs. Only moments after a count went up (a
    forward, a received or loaded transfer) are kept: one reached by frees alone is
    dominated by the moment before it.

    Frees of a W or fused BW apply when the next action starts (the W has ended); an
    evictor's EVICT frees its copy once the compute action it overlaps has ended (two
    compute actions later), an acceptor's LOAD once its send is waited for (before the next
    compute action, so a transfer issued in between still finds it held); a transfer is
    issued after the previous compute action ended."""
    slot = {stage: i for i, stage in enumerate(stages)}
    counts = [0] * len(stages)
    pending: list[int] = []  # slots freed when the running compute action ends
    deferred: list[list[int]] = []  # [compute actions still to start, slot]: copies sent
    seen: set[tuple[int, ...]] = set()
    for action in row:
        kind = action.kind
        if kind in _COMPUTE:
            for index in pending:
                counts[index] -= 1
            pending.clear()
            if deferred:
                keep = []
                for entry in deferred:
                    entry[0] -= 1
                    if entry[0] <= 0:
                        counts[entry[1]] -= 1
                    else:
                        keep.append(entry)
                deferred = keep
            if kind is K.F:
                counts[slot[action.stage]] += 1
                seen.add(tuple(counts))
            if kind is K.W or kind is K.BW:
                pending.append(slot[action.stage])
        elif kind in _TRANSFERS:
            # Issued once the previous compute action has ended: its frees are done.
            for index in pending:
                counts[index] -= 1
            pending.clear()
            owner = stage_devices[action.stage] == device
            if kind is K.EVICT and owner:
                deferred.append([2, slot[action.stage]])
            elif kind is K.EVICT or owner:  # the acceptor receives / the evictor loads
                counts[slot[action.stage]] += 1
                seen.add(tuple(counts))
            else:  # the acceptor hands a LOAD back: its copy goes when the send has
                deferred.append([1, slot[action.stage]])  # (before the next compute action)
    return seen


def _pareto(points: set[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The count vectors no other vector dominates (>= on every stage)."""
    ordered = sorted(points, reverse=True)
    if ordered and len(ordered[0]) == 2:
        # Two stages: sorted by the first count descending, keep rising second counts.
        front: list[tuple[int, ...]] = []
        best_second = -1
        for point in ordered:
            if point[1] > best_second:
                front.append(point)
                best_second = point[1]
        return front
    return [
        p
        for p in ordered
        if not any(q != p and all(a >= b for a, b in zip(q, p, strict=True)) for q in ordered)
    ]


def peak_from_profile(profile: InflightProfile, sizes: Sequence[float]) -> list[float]:
    """Peak saved activations per device for per-stage micro-batch ``sizes``."""
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
        peaks.append(round(best, 9))
    return peaks


def peak_by_order(schedule: Schedule, sizes: Sequence[float] | None = None) -> list[float]:
    """Peak saved activations per device; ``sizes[s]`` is one micro-batch of stage s
    (default ``1 / num_stages``, i.e. micro-batches of the whole model)."""
    n = schedule.num_stages
    return peak_from_profile(inflight_profile(schedule), [1.0 / n] * n if sizes is None else sizes)
