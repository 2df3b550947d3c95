"""How big a schedule is, and how much work building it is, known before it is built.

A service must refuse a request whose work is beyond its limits before doing any of it, and
a timeline must know whether a schedule is small enough to draw action by action. Both ask
here instead of generating the schedule to find out.

Sizes come from building a small instance of the schedule once (actions per device per
micro-batch, communication and BPipe transfers included), so they follow the generators
without a table to keep in step. Generation work is the action count, times
``1 + (p / g)^2`` for a family whose generator's time per action grows with the devices
(``ScheduleFamily.generation_growth_devices`` = g; the V-shape family, whose warm-up fill is
searched device by device: 2.7 us per action up to 32 devices, then 4.6, 10, 31 and 102 us
at 64, 128, 256 and 512 on one core, bounded from above by 2, 5, 17 and 65 times at g = 64),
so that a request is never admitted on an underestimate.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

from planner.schedules._registry import MEMORY_LIMIT, schedule_family

__all__ = ["generation_work", "schedule_actions"]

_SAMPLE_DEVICES = 4
_SAMPLE_MICROBATCHES = 8


@lru_cache(maxsize=64)
def _actions_per_cell(name: str, parameters: tuple[tuple[str, float], ...]) -> tuple[float, int]:
    """Actions per device per micro-batch of a small instance of ``name``, and how many
    batches the schedule runs (2BW runs ``num_batches``, the others one)."""
    from planner.schedules import generate  # the package imports this module

    given: dict[str, Any] = dict(parameters)
    built = generate(name, _SAMPLE_DEVICES, _SAMPLE_MICROBATCHES, check=False, **given)
    cells = _SAMPLE_DEVICES * _SAMPLE_MICROBATCHES * built.num_batches
    return sum(len(actions) for actions in built.actions) / cells, built.num_batches


def _key(name: str, parameters: dict[str, float]) -> tuple[tuple[str, float], ...]:
    family = schedule_family(name)
    if family.has_parameter(MEMORY_LIMIT.name):
        # Any limit builds the same actions per cell (six passes a micro-batch and device,
        # or three): the small instance takes one every block meets.
        assert family.largest_memory_limit is not None
        parameters = dict(parameters)
        parameters[MEMORY_LIMIT.name] = family.largest_memory_limit(
            _SAMPLE_DEVICES, _SAMPLE_MICROBATCHES
        )
    return tuple(sorted(family.resolve(parameters).items()))


def schedule_actions(
    name: str, num_devices: int, num_microbatches: int, **parameters: float
) -> int:
    """About how many actions ``generate(name, num_devices, num_microbatches,
    **parameters)`` builds (exact for schedules whose actions grow with devices x
    micro-batches; BPipe's transfers are counted at the small instance's rate). Raises
    ScheduleConfigError for an unknown name or parameter."""
    per_cell, batches = _actions_per_cell(name, _key(name, parameters))
    return math.ceil(per_cell * num_devices * num_microbatches * batches)


def generation_work(name: str, num_devices: int, num_microbatches: int, **parameters: float) -> int:
    """An upper bound of the work of building that schedule, in actions of a generator
    whose time per action does not grow with the devices (see the module docstring)."""
    actions = schedule_actions(name, num_devices, num_microbatches, **parameters)
    family = schedule_family(name)
    growth = family.generation_growth_devices
    if growth:
        actions = math.ceil(actions * (1 + (num_devices / growth) ** 2))
    if family.search_work is not None:
        actions += family.search_work(num_devices, num_microbatches)
    return actions
