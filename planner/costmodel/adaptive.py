"""Schedules built for a memory limit (v-adaptive, zb-adaptive) in the planner.

The planner knows each candidate's memory exactly, so it can ask for "the fastest schedule
that fits in what is left": for every (t, p, d, mb, recompute), the activation
memory each device can still hold after its weights, gradients, optimizer states, the
working set of a recomputed layer and the allowance, in units of its largest stage's
activations per micro-batch, sets the limit; the schedule is searched under the
candidate's own pass times when it is simulated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

from planner.costmodel.shapes import Shape, bound_shape, stages_by_device
from planner.schedules import MEMORY_LIMIT, PassTimes, Schedule, generate, schedule_family
from planner.specs import CandidateConfig

__all__ = [
    "bounded_shape",
    "built_for_a_limit",
    "limit_units",
    "memory_limit_for",
    "searched_schedule",
]


def built_for_a_limit(schedule: str) -> bool:
    """Whether ``schedule`` is built for a memory limit (its family takes one)."""
    return schedule_family(schedule).has_parameter(MEMORY_LIMIT.name)


def limit_units(schedule: str, p: int, memory_limit: float) -> int:
    """Stage activations per device a limit allows (1F1B's peak is one micro-batch of the
    whole model: as many stage activations as the schedule has stages)."""
    stages = schedule_family(schedule).num_stages(p)
    return math.floor(memory_limit * stages + 1e-9)


def memory_limit_for(
    config: CandidateConfig,
    parameters: Sequence[float],
    activation_bytes: Sequence[float],
    working_bytes: Sequence[float],
    *,
    capacity: float,
    workspace: float,
    fragmentation: float,
    bytes_per_parameter: float,
) -> float:
    """The largest limit whose schedule fits every device of ``config``: per device, what
    ``capacity`` leaves for saved activations (a device needs its tensors x (1 +
    fragmentation) + workspace) in units of its largest stage activation, the fewest over
    the devices, as a fraction of 1F1B's peak (0 when nothing is left)."""
    per_param = bytes_per_parameter
    by_device = stages_by_device(config.schedule, config.p, config.num_chunks)
    budget = (capacity - workspace) / (1 + fragmentation)
    units = math.inf
    for stages in by_device:
        static = sum(parameters[s] for s in stages) * per_param
        working = max(working_bytes[s] for s in stages)
        largest = max(activation_bytes[s] for s in stages)
        left = budget - static - working
        units = min(units, max(0.0, left) / largest if largest > 0 else math.inf)
    stages_total = schedule_family(config.schedule).num_stages(config.p)
    if math.isinf(units):
        return 2.0  # nothing is saved: any limit fits; ZB-2P's, beyond V-ZB's
    return math.floor(units + 1e-9) / stages_total


def bounded_shape(config: CandidateConfig) -> Shape:
    """What the estimate counts for a schedule built for ``config.memory_limit``: the limit
    itself on every device (the schedule never exceeds it)."""
    assert config.memory_limit is not None
    units = limit_units(config.schedule, config.p, config.memory_limit)
    return bound_shape(config.schedule, config.p, units)


@lru_cache(maxsize=256)
def _searched(
    schedule: str,
    p: int,
    m: int,
    memory_limit: float,
    times: PassTimes,
) -> Schedule:
    return generate(schedule, p, m, check=False, memory_limit=memory_limit, times=times)


def searched_schedule(
    config: CandidateConfig,
    forward: Sequence[float],
    backward: Sequence[float],
    weight: Sequence[float],
    comm: float,
    num_microbatches: int,
) -> Schedule:
    """The schedule of ``config``'s family searched under its pass times for
    ``num_microbatches`` micro-batches (cached: candidates are priced more than once)."""
    assert config.memory_limit is not None
    times = PassTimes(tuple(forward), tuple(backward), tuple(weight), comm)
    return _searched(config.schedule, config.p, num_microbatches, config.memory_limit, times)
