"""Saved activations per device from the action order alone.

A device runs its actions one after another, so the level of its saved activations while
action k runs is everything allocated by actions before k and by k itself (a forward
allocates at its start) minus everything freed by actions that ended before k (a W or fused
BW frees at its end). That makes a device's peak a property of its order, the same for any
durations: no simulation is needed, which is what lets the search count in-flight
micro-batches for thousands of candidates. BPipe transfers are counted the way the engine
runs them: an EVICT frees the evictor's copy after the compute action it overlaps, a LOAD
allocates when issued; the acceptor's mirror allocates (EVICT) or frees (LOAD) where the
mirror sits in its list. Tests check these peaks against the simulator's.

:func:`inflight_profile` keeps, per device, the per-stage micro-batch counts at every moment
that could be the peak (only the Pareto-maximal ones), so that the peak for any per-stage
activation sizes is a small maximum of dot products.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.schedules._ir import ActionKind, Schedule

__all__ = ["InflightProfile", "inflight_profile", "peak_by_order", "peak_from_profile"]

K = ActionKind

InflightProfile = list[list[dict[int, int]]]
"""Per device: candidate peak moments, each {stage: saved micro-batches of that stage}."""


def inflight_profile(schedule: Schedule) -> InflightProfile:
    """Per device, the Pareto-maximal per-stage counts of saved micro-batches."""
    stage_devices = schedule.stage_devices
    profile: InflightProfile = []
    for device, row in enumerate(schedule.actions):
        counter = _DeviceCounter()
        for action in row:
            kind, stage = action.kind, action.stage
            if kind.is_compute:
                counter.compute_starts()
                if kind is K.F:
                    counter.add(stage)
                counter.observe()
                if kind is K.W or kind is K.BW:
                    counter.free_when_done(stage)
            elif kind.is_transfer:
                # Issued once the previous compute action has ended: its frees are done.
                counter.apply_pending()
                owner = stage_devices[stage] == device
                if kind is K.EVICT and owner:
                    counter.deferred.append([2, stage])
                elif kind is K.EVICT or owner:  # the acceptor receives / the evictor loads
                    counter.add(stage)
                    counter.observe()
                else:  # the acceptor hands a LOAD back
                    counter.free_when_done(stage)
        profile.append([dict(v) for v in _pareto(counter.seen)])
    return profile


class _DeviceCounter:
    """Saved micro-batches per stage on one device while walking its list."""

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.pending: dict[int, int] = {}  # frees that land when the running action ends
        self.deferred: list[list[int]] = []  # [compute actions still to pass, stage]: EVICTs
        self.seen: set[tuple[tuple[int, int], ...]] = set()

    def add(self, stage: int) -> None:
        self.counts[stage] = self.counts.get(stage, 0) + 1

    def free_when_done(self, stage: int) -> None:
        self.pending[stage] = self.pending.get(stage, 0) + 1

    def observe(self) -> None:
        self.seen.add(tuple(sorted((s, c) for s, c in self.counts.items() if c)))

    def apply_pending(self) -> None:
        for stage, n in self.pending.items():
            self.counts[stage] = self.counts.get(stage, 0) - n
        self.pending.clear()

    def compute_starts(self) -> None:
        """The previous action has ended, and EVICTs issued two compute actions ago too."""
        self.apply_pending()
        keep = []
        for entry in self.deferred:
            entry[0] -= 1
            if entry[0] <= 0:
                self.counts[entry[1]] = self.counts.get(entry[1], 0) - 1
            else:
                keep.append(entry)
        self.deferred = keep


def _pareto(points: set[tuple[tuple[int, int], ...]]) -> list[tuple[tuple[int, int], ...]]:
    """Drop count vectors that another vector dominates (>= on every stage)."""
    as_dicts = [(p, dict(p)) for p in points]
    keep = []
    for p, d in as_dicts:
        dominated = any(
            q is not p and all(e.get(s, 0) >= c for s, c in d.items()) and e != d
            for q, e in as_dicts
        )
        if not dominated:
            keep.append(p)
    return sorted(keep)


def peak_from_profile(profile: InflightProfile, sizes: Sequence[float]) -> list[float]:
    """Peak saved activations per device for per-stage micro-batch ``sizes``."""
    return [
        round(
            max((sum(sizes[s] * c for s, c in moment.items()) for moment in moments), default=0.0),
            9,
        )
        for moments in profile
    ]


def peak_by_order(schedule: Schedule, sizes: Sequence[float] | None = None) -> list[float]:
    """Peak saved activations per device; ``sizes[s]`` is one micro-batch of stage s
    (default ``1 / num_stages``, i.e. micro-batches of the whole model)."""
    n = schedule.num_stages
    return peak_from_profile(inflight_profile(schedule), [1.0 / n] * n if sizes is None else sizes)
