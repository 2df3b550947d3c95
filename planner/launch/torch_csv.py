"""The schedule in torch.distributed.pipelining's compute-only CSV."""

from __future__ import annotations

from planner.schedules import ActionKind, Schedule

__all__ = ["torch_pipelining_csv", "torch_runner_problem"]

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


def torch_runner_problem(t: int, d: int, cp: int, precision: str) -> str | None:
    """Why ``python -m executor.torch_pipelining`` cannot run a candidate's CSV on the
    executor's model and compare it with the single-process reference, or None. The emitted
    README offers the command only where this is None; the runner refuses the rest with it."""
    if t != 1 or d != 1 or cp != 1:
        return (
            f"the config has t = {t}, d = {d}, cp = {cp}: this runner runs one pipeline "
            "(t = d = cp = 1); with tensor or data parallelism, torch runs the CSV on the "
            "pipeline dimension of a device mesh you build (the candidate's placement note)"
        )
    if precision != "fp32":
        return (
            f"precision {precision}: torch.distributed.pipelining accumulates gradients in the "
            "parameters' dtype and stagewright's reference in fp32, so only an fp32 config is "
            "compared exactly; plan with precision fp32, or run this config with python -m "
            "executor.worker"
        )
    return None
