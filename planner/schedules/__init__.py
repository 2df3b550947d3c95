"""Schedule IR, generators for every schedule, the registry, the validator and IR passes.

Public entry points: :func:`generate` builds any registered schedule by name and validates
it; :func:`schedule_family` answers every question about a family (see
:mod:`planner.schedules._registry`). Outside this package a schedule name is data.
"""

from __future__ import annotations

import importlib
import pkgutil

from planner._gc import collector_paused
from planner.schedules._bpipe import bpipe_mu_opt, plan_transfers
from planner.schedules._comm import with_communication
from planner.schedules._format import format_grid, format_timeline
from planner.schedules._ir import (
    SCHEDULE_FORMAT,
    Action,
    ActionKind,
    Schedule,
    looped_placement,
    v_placement,
)
from planner.schedules._pipedream_2bw import weight_version_2bw
from planner.schedules._registry import (
    BASELINE_SCHEDULE,
    MEMORY_LIMIT,
    NUM_BATCHES,
    NUM_CHUNKS,
    RUNTIMES,
    Parameter,
    PassTimes,
    Runtime,
    ScheduleFamily,
    Semantics,
    families,
    schedule_family,
    schedule_names,
)
from planner.schedules._validate import validate
from planner.schedules._vshape import block_offsets, building_block
from planner.schedules._work import generation_work, schedule_actions

__all__ = [
    "BASELINE_SCHEDULE",
    "MEMORY_LIMIT",
    "NUM_BATCHES",
    "NUM_CHUNKS",
    "RUNTIMES",
    "SCHEDULE_FORMAT",
    "SCHEDULE_NAMES",
    "Action",
    "ActionKind",
    "Parameter",
    "PassTimes",
    "Runtime",
    "Schedule",
    "ScheduleFamily",
    "Semantics",
    "block_offsets",
    "bpipe_mu_opt",
    "building_block",
    "families",
    "format_grid",
    "format_timeline",
    "generate",
    "generation_work",
    "looped_placement",
    "plan_transfers",
    "schedule_actions",
    "schedule_family",
    "schedule_names",
    "v_placement",
    "validate",
    "weight_version_2bw",
    "with_communication",
]

# Generator modules register their families on import: import every module of the package,
# so that a new schedule is one new module (listing order: ScheduleFamily.listing).
for _module in pkgutil.iter_modules(__path__):
    if _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")

SCHEDULE_NAMES = schedule_names()
"""Every registered schedule, in listing order."""


def generate(
    name: str,
    num_devices: int,
    num_microbatches: int,
    *,
    check: bool = True,
    times: PassTimes | None = None,
    **parameters: float,
) -> Schedule:
    """Build the registered schedule ``name`` for ``num_devices`` devices and
    ``num_microbatches`` micro-batches (per batch, for 2bw).

    ``parameters`` are the family's own (``num_chunks`` for interleaved schedules,
    ``num_batches`` for 2bw, ...; :attr:`ScheduleFamily.parameters`); one the family does not
    take is an error, a missing one takes its default. Raises :class:`ScheduleConfigError`
    with what to change for an invalid combination. With ``check`` the result is validated
    (always true for our generators; the tests rely on it, production callers may skip the
    cost). ``times`` are the pass times a family that searches by time (the adaptive ones)
    builds for; the others do not depend on them.
    """
    family = schedule_family(name)
    resolved = family.resolve(parameters)
    # A generator makes 10^5 acyclic objects (actions, keys, lists) for a large pipeline:
    # the cyclic collector would walk every live object several times and find nothing.
    with collector_paused():
        schedule = family.build(num_devices, num_microbatches, resolved, times or PassTimes())
    return validate(schedule) if check else schedule
