"""Bubble rate against activation memory limit of the schedules built for a limit.

The V-shape paper's Figures 9 and 10 (Appendix B): for one pipeline (devices, micro-batches,
pass times) the bubble rate each family built for a memory limit (v-adaptive, zb-adaptive)
reaches at each limit, with the baseline (1F1B), which has no limit to set, as the
reference. Times are those of one V stage (half of a device's layers, as ``stagewright
simulate`` takes them for V schedules); a family with one stage a device runs two V stages'
times per stage.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import ScheduleConfigError
from planner.schedules import (
    BASELINE_SCHEDULE,
    MEMORY_LIMIT,
    PassTimes,
    ScheduleFamily,
    families,
    generate,
    schedule_family,
)
from planner.simulate import Durations, simulate

__all__ = ["MemorySweep", "SweepPoint", "default_limits", "limit_families", "memory_sweep"]


@dataclass(frozen=True)
class SweepPoint:
    """One memory limit: per family built for a limit, the bubble rate its schedule reaches
    and the peak it holds (None where it has no schedule within the limit)."""

    memory_limit: float
    bubble: dict[str, float | None]
    peak: dict[str, float | None]


@dataclass(frozen=True)
class MemorySweep:
    num_devices: int
    num_microbatches: int
    schedules: list[str]  # the families built for a limit, in registry order
    points: list[SweepPoint]
    reference: str  # 1F1B: no limit to set; its peak is 1 by definition
    reference_bubble: float

    def to_dict(self) -> dict[str, object]:
        return {
            "num_devices": self.num_devices,
            "num_microbatches": self.num_microbatches,
            "schedules": self.schedules,
            "reference": self.reference,
            "reference_bubble": self.reference_bubble,
            "points": [vars(p) for p in self.points],
        }


def limit_families() -> list[ScheduleFamily]:
    """The registered families built for a memory limit."""
    return [f for f in families() if f.has_parameter(MEMORY_LIMIT.name)]


def default_limits(num_devices: int, num_microbatches: int) -> list[float]:
    """From the least any of them reaches to twice 1F1B's memory (ZB-2P), in steps of
    1/12, plus each family's smallest limit itself."""
    smallest = [
        f.smallest_memory_limit(num_devices, num_microbatches)
        for f in limit_families()
        if f.smallest_memory_limit is not None
    ]
    low = min(smallest, default=1 / 12)
    grid = {round(k / 12, 6) for k in range(1, 25) if k / 12 >= low}
    return sorted(grid | set(smallest))


def _times_for(family: ScheduleFamily, times: PassTimes, num_devices: int) -> PassTimes:
    """Times of ``family``'s stages holding the same layers as the V stages ``times`` are
    given for: a family with one stage a device runs V stages 2i and 2i + 1 as stage i."""
    if family.stages_per_device() == 2:
        return times
    forward, backward, weight = times.per_stage(2 * num_devices)

    def pair(values: list[float]) -> tuple[float, ...]:
        return tuple(values[2 * i] + values[2 * i + 1] for i in range(num_devices))

    return PassTimes(pair(forward), pair(backward), pair(weight), times.comm)


def _run(
    name: str, d: int, m: int, limit: float | None, times: PassTimes
) -> tuple[float, float] | None:
    given = {} if limit is None else {MEMORY_LIMIT.name: limit}
    try:
        schedule = generate(name, d, m, check=False, times=times, **given)
    except ScheduleConfigError:
        return None  # no schedule of this family within the limit
    result = simulate(
        schedule, Durations(times.forward, times.backward, times.weight, comm=times.comm)
    )
    return result.bubble_fraction, max(result.peak_activation)


def memory_sweep(
    num_devices: int,
    num_microbatches: int,
    times: PassTimes,
    limits: list[float] | None = None,
) -> MemorySweep:
    """Bubble rates of every family built for a memory limit at each limit (default
    :func:`default_limits`), searched and simulated under ``times`` (per V stage)."""
    d, m = num_devices, num_microbatches
    # Times of the wrong length are refused here: below, a generator's refusal means "no
    # schedule within this limit".
    times.per_stage(2 * d)
    chosen = limit_families()
    points = []
    for limit in limits or default_limits(d, m):
        runs = {f.name: _run(f.name, d, m, limit, _times_for(f, times, d)) for f in chosen}
        points.append(
            SweepPoint(
                limit,
                {name: run[0] if run else None for name, run in runs.items()},
                {name: run[1] if run else None for name, run in runs.items()},
            )
        )
    reference = schedule_family(BASELINE_SCHEDULE)
    baseline = _run(reference.name, d, m, None, _times_for(reference, times, d))
    assert baseline is not None
    return MemorySweep(d, m, [f.name for f in chosen], points, reference.name, baseline[0])
