"""Bubble rate against activation memory limit: v-adaptive, zb-adaptive and 1F1B.

The V-shape paper's Figures 9 and 10 (Appendix B): for one pipeline (devices, micro-batches,
pass times) the bubble rate each adaptive scheduler reaches at each memory limit, with 1F1B,
which has no limit to set, as the reference. Times are those of one V stage (half of a
device's layers, as ``stagewright simulate`` takes them for V schedules); zb-adaptive and
1F1B run one stage a device, so each of their stages takes two V stages' times.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import ScheduleConfigError
from planner.schedules import PassTimes, generate
from planner.schedules._vadaptive import smallest_v_limit
from planner.schedules._zbadaptive import smallest_zb_limit
from planner.simulate import Durations, simulate

__all__ = ["MemorySweep", "SweepPoint", "default_limits", "memory_sweep"]


@dataclass(frozen=True)
class SweepPoint:
    """One memory limit: each scheduler's bubble rate and the peak it reached (None where
    it has no schedule within the limit)."""

    memory_limit: float
    v_adaptive_bubble: float | None
    v_adaptive_peak: float | None
    zb_adaptive_bubble: float | None
    zb_adaptive_peak: float | None


@dataclass(frozen=True)
class MemorySweep:
    num_devices: int
    num_microbatches: int
    points: list[SweepPoint]
    one_f_one_b_bubble: float  # the reference: 1F1B's peak is 1.0 by definition

    def to_dict(self) -> dict[str, object]:
        return {
            "num_devices": self.num_devices,
            "num_microbatches": self.num_microbatches,
            "one_f_one_b_bubble": self.one_f_one_b_bubble,
            "points": [vars(p) for p in self.points],
        }


def default_limits(num_devices: int, num_microbatches: int) -> list[float]:
    """From the least either scheduler reaches to twice 1F1B's memory (ZB-2P), in steps of
    1/12, plus both smallest limits themselves."""
    smallest = min(smallest_v_limit(num_devices, num_microbatches), smallest_zb_limit(num_devices))
    grid = {round(k / 12, 6) for k in range(1, 25) if k / 12 >= smallest}
    grid |= {smallest_v_limit(num_devices, num_microbatches), smallest_zb_limit(num_devices)}
    return sorted(grid)


def _one_stage_times(times: PassTimes, num_devices: int) -> PassTimes:
    """Times of a one-stage-a-device pipeline holding the same layers: stage i runs V
    stages 2i and 2i + 1."""
    forward, backward, weight = times.per_stage(2 * num_devices)

    def pair(values: list[float]) -> tuple[float, ...]:
        return tuple(values[2 * i] + values[2 * i + 1] for i in range(num_devices))

    return PassTimes(pair(forward), pair(backward), pair(weight), times.comm)


def _run(name: str, d: int, m: int, limit: float, times: PassTimes) -> tuple[float, float] | None:
    try:
        schedule = generate(name, d, m, memory_limit=limit, times=times, check=False)
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
    """Bubble rates of v-adaptive and zb-adaptive at each limit (default
    :func:`default_limits`), searched and simulated under ``times`` (per V stage)."""
    d, m = num_devices, num_microbatches
    one_stage = _one_stage_times(times, d)
    points = []
    for limit in limits or default_limits(d, m):
        v = _run("v-adaptive", d, m, limit, times)
        zb = _run("zb-adaptive", d, m, limit, one_stage)
        points.append(
            SweepPoint(
                limit,
                v[0] if v else None,
                v[1] if v else None,
                zb[0] if zb else None,
                zb[1] if zb else None,
            )
        )
    reference = simulate(
        generate("1f1b", d, m, check=False),
        Durations(one_stage.forward, one_stage.backward, one_stage.weight, comm=times.comm),
    )
    return MemorySweep(d, m, points, reference.bubble_fraction)
