"""In-flight micro-batches per device, from each schedule's own order.

The memory of a candidate multiplies each stage's saved bytes per micro-batch by how many
micro-batches of that stage a device holds at its peak moments. Those counts come from the
schedule itself (:mod:`planner.schedules._inflight`), never from a constant per schedule,
and every candidate of one shape (schedule, p, m, and the chunks per device v of a family that
takes them; None is the family's default) shares them, so they are built once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from planner.schedules import NUM_CHUNKS, Schedule, generate, schedule_family
from planner.schedules._inflight import InflightProfile, inflight_profile, peak_from_profile

__all__ = [
    "Shape",
    "bound_shape",
    "chunk_parameters",
    "inflight_microbatches",
    "schedule_shape",
    "shape_of",
    "shape_profile",
    "stages_by_device",
]


def chunk_parameters(num_chunks: int | None) -> dict[str, Any]:
    """The generator parameters that give a schedule ``num_chunks`` stages a device (none
    for None: the family's default, or a family without the parameter); typed as
    ``generate``'s keywords are, which also take ``check`` and ``times``."""
    return {} if num_chunks is None else {NUM_CHUNKS.name: num_chunks}


def _stage_devices(schedule: str, p: int, num_chunks: int | None = None) -> tuple[int, ...]:
    """Stage -> device of a schedule, by its family's placement rule."""
    return schedule_family(schedule).stage_devices(p, chunk_parameters(num_chunks))


@dataclass(frozen=True)
class Shape:
    """What every candidate of one (schedule, p, simulated micro-batches, v) shares."""

    profile: InflightProfile
    in_flight: tuple[float, ...]  # peak saved micro-batches per device, per stage it holds


def shape_of(built: Schedule) -> Shape:
    """The in-flight profile of a built schedule."""
    by_device = [built.stages_of(d) for d in range(built.num_devices)]
    return _shape(inflight_profile(built), built.num_stages, by_device)


def _shape(profile: InflightProfile, num_stages: int, by_device: Sequence[Sequence[int]]) -> Shape:
    """The shape of a schedule with this in-flight profile, ``by_device`` its stages."""
    units = peak_from_profile(profile, [1.0] * num_stages)
    return Shape(profile, tuple(units[d] / len(stages) for d, stages in enumerate(by_device)))


def bound_shape(schedule: str, p: int, units: int) -> Shape:
    """A profile that holds ``units`` stage activations of any of a device's stages: what a
    schedule built for a memory limit of that many (the adaptive ones) can reach at most."""
    by_device = stages_by_device(schedule, p)
    return Shape(
        [[{s: units} for s in stages] for stages in by_device],
        tuple(units / len(stages) for stages in by_device),
    )


@lru_cache(maxsize=256)
def _built_shape(schedule: str, p: int, m: int, num_chunks: int | None = None) -> Shape:
    """The in-flight profile of the schedule built with ``m`` micro-batches; read off the
    family's own orders where it can (:attr:`ScheduleFamily.inflight`: the V shapes), which
    gives the same profile without making the schedule."""
    parameters = chunk_parameters(num_chunks)
    family = schedule_family(schedule)
    if family.inflight is None:
        return shape_of(generate(schedule, p, m, check=False, **parameters))
    by_device = stages_by_device(schedule, p, num_chunks)
    num_stages = sum(len(stages) for stages in by_device)
    return _shape(family.inflight(p, m, family.resolve(parameters)), num_stages, by_device)


def schedule_shape(schedule: str, p: int, m: int, num_chunks: int | None = None) -> Shape:
    """The in-flight profile of ``schedule`` on p devices with m micro-batches (and
    ``num_chunks`` stages a device, for a family that takes them), shared by every candidate
    of that shape: built with ``inflight_microbatches`` micro-batches, which gives the same
    profile, and for GPipe scaled from one micro-batch to m (every device holds all of them
    at its peak)."""
    cap = inflight_microbatches(schedule, p, m)
    if schedule_family(schedule).inflight_grows_with_microbatches and cap != m:
        return _scaled_shape(schedule, p, cap, m)
    return _built_shape(schedule, p, cap, num_chunks)


@lru_cache(maxsize=256)
def _scaled_shape(schedule: str, p: int, cap: int, m: int) -> Shape:
    built = _built_shape(schedule, p, cap)
    scale = m // cap
    return Shape(
        [
            [{s: c * scale for s, c in moment.items()} for moment in moments]
            for moments in built.profile
        ],
        tuple(c * scale for c in built.in_flight),
    )


def inflight_microbatches(schedule: str, p: int, m: int) -> int:
    """Micro-batches a schedule is built with to count the in-flight micro-batches of a run
    of m.

    Past its warm-up a schedule repeats one pattern, so its in-flight profile stops changing
    once m reaches a saturation point, which the family's registry entry gives
    (:attr:`ScheduleFamily.inflight_saturation`; the tests check each against building every
    micro-batch, up to p = 32, BPipe up to 64, interleaved's 2p for every v up to 8). GPipe
    runs every forward before any backward, so its peak grows with m: it is built with one
    micro-batch and scaled (``schedule_shape``)."""
    return schedule_family(schedule).inflight_microbatches(p, m)


@lru_cache(maxsize=1024)
def stages_by_device(
    schedule: str, p: int, num_chunks: int | None = None
) -> tuple[tuple[int, ...], ...]:
    """Stages of each device, from the placement rule alone (no schedule needed)."""
    by_device: list[list[int]] = [[] for _ in range(p)]
    for stage, device in enumerate(_stage_devices(schedule, p, num_chunks)):
        by_device[device].append(stage)
    return tuple(tuple(stages) for stages in by_device)


def shape_profile(schedule: str, p: int, m: int, num_chunks: int | None = None) -> InflightProfile:
    """In-flight profile (per device, Pareto peak moments) of ``schedule`` with m micro-batches."""
    return schedule_shape(schedule, p, m, num_chunks).profile
