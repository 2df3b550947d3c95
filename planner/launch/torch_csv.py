"""The schedule in torch.distributed.pipelining's compute-only CSV."""

from __future__ import annotations

from planner.schedules import ActionKind, Schedule

__all__ = ["torch_pipelining_csv"]

_CSV_KIND = {ActionKind.F: "F", ActionKind.B: "I", ActionKind.W: "W", ActionKind.BW: "B"}


def torch_pipelining_csv(schedule: Schedule) -> str | None:
    """The CSV that torch.distributed.pipelining's ``_PipelineScheduleRuntime`` loads (one row
    per rank; ``0F3``, ``7B2``, ``5I0`` for input-grad, ``5W0``). None when the runtime cannot
    express the schedule: transfers (BPipe's EVICT/LOAD), weight versions and several batches
    without a flush (2BW) are outside it, as are placements other than one stage per rank,
    loop (interleaved) or V (two stages per rank)."""
    moves_data = schedule.count(ActionKind.EVICT, ActionKind.LOAD, ActionKind.WEIGHT_VERSION)
    if moves_data or schedule.num_batches > 1:
        return None
    rows = []
    for acts in schedule.actions:
        cells = [f"{a.stage}{_CSV_KIND[a.kind]}{a.microbatch}" for a in acts if a.kind in _CSV_KIND]
        rows.append(",".join(cells))
    return "\n".join(rows) + "\n"
