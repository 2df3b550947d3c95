"""Schedule IR, generators for every schedule, the validator and IR passes.

Public entry point: :func:`generate` builds any schedule by name and validates it.
"""

from __future__ import annotations

from planner.errors import ScheduleConfigError
from planner.schedules._basic import gpipe, interleaved, one_f_one_b, pipedream_2bw
from planner.schedules._basic import weight_version_2bw as weight_version_2bw
from planner.schedules._bpipe import bpipe, bpipe_mu_opt, plan_transfers
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
from planner.schedules._validate import validate
from planner.schedules._vshape import VSHAPE_NAMES, block_offsets, building_block, vshape

__all__ = [
    "SCHEDULE_FORMAT",
    "SCHEDULE_NAMES",
    "Action",
    "ActionKind",
    "Schedule",
    "block_offsets",
    "bpipe_mu_opt",
    "building_block",
    "format_grid",
    "format_timeline",
    "generate",
    "looped_placement",
    "plan_transfers",
    "v_placement",
    "validate",
    "weight_version_2bw",
    "with_communication",
]

SCHEDULE_NAMES = ("gpipe", "1f1b", "interleaved", "bpipe", "v-min", "v-half", "v-zb", "2bw")


def generate(
    name: str,
    num_devices: int,
    num_microbatches: int,
    *,
    num_chunks: int = 2,
    num_batches: int = 2,
    check: bool = True,
) -> Schedule:
    """Build the schedule ``name`` for ``num_devices`` devices and ``num_microbatches``
    micro-batches (per batch, for 2bw).

    ``num_chunks`` is v for ``interleaved`` (and BPipe's interleaved variant, named
    ``bpipe-interleaved``); ``num_batches`` is how many batches a ``2bw`` schedule runs
    without a flush. Raises :class:`ScheduleConfigError` with what to change for an invalid
    combination. With ``check`` the result is validated (always true for our generators; the
    tests rely on it, production callers may skip the cost).
    """
    if name == "gpipe":
        schedule = gpipe(num_devices, num_microbatches)
    elif name == "1f1b":
        schedule = one_f_one_b(num_devices, num_microbatches)
    elif name == "interleaved":
        schedule = interleaved(num_devices, num_microbatches, num_chunks)
    elif name == "bpipe":
        schedule = bpipe(num_devices, num_microbatches)
    elif name == "bpipe-interleaved":
        schedule = bpipe(num_devices, num_microbatches, num_chunks)
    elif name in VSHAPE_NAMES:
        schedule = vshape(name, num_devices, num_microbatches)
    elif name == "2bw":
        schedule = pipedream_2bw(num_devices, num_microbatches, num_batches)
    else:
        raise ScheduleConfigError(
            f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULE_NAMES)}"
        )
    return validate(schedule) if check else schedule
