"""PipeDream-2BW: 1F1B without a flush between batches and two weight versions (Narayanan
et al., "Memory-Efficient Pipeline-Parallel DNN Training", ICML 2021)."""

from __future__ import annotations

from planner.schedules._basic import check_counts, one_f_one_b_order, optimizer_step, require
from planner.schedules._ir import Action, ActionKind, Schedule
from planner.schedules._registry import NUM_BATCHES, ScheduleFamily, register

__all__ = ["pipedream_2bw", "weight_version_2bw"]

F, BW = ActionKind.F, ActionKind.BW


def weight_version_2bw(microbatch: int, num_microbatches: int) -> int:
    """Weight version used by a micro-batch under 2BW (PipeDream-2BW §3.1): with k the
    1-indexed micro-batch and m micro-batches per batch, max(floor((k - 1) / m) - 1, 0)."""
    k = microbatch + 1
    return max((k - 1) // num_microbatches - 1, 0)


def pipedream_2bw(num_devices: int, num_microbatches: int, num_batches: int = 2) -> Schedule:
    """PipeDream-2BW: 1F1B over ``num_batches`` batches of m micro-batches with no flush in
    between. After the backward of a batch's last micro-batch a stage steps its optimizer,
    producing weight version b + 1 from batch b's coalesced gradient; forwards switch to a new
    version (WEIGHT_VERSION) when the paper's formula says so, and each micro-batch's backward
    uses the version its forward used. At most two versions are alive per stage."""
    p, m = num_devices, num_microbatches
    check_counts("2bw", p, m)
    require(num_batches >= 1, f"2bw: the number of batches must be at least 1, got {num_batches}")
    require(
        m >= p,
        f"2bw: needs at least as many micro-batches per batch as devices (m >= p), got "
        f"m={m} for p={p}; use m >= {p}",
    )
    total = m * num_batches
    rows = []
    for s in range(p):
        row: list[Action] = []
        version = 0
        for action in one_f_one_b_order(s, p, range(total)):
            if action.kind is F:
                wanted = weight_version_2bw(action.microbatch, m)
                if wanted != version:
                    row.append(
                        Action(ActionKind.WEIGHT_VERSION, s, action.microbatch, version=wanted)
                    )
                    version = wanted
            row.append(action)
            if action.kind is BW and action.microbatch % m == m - 1:
                batch = action.microbatch // m
                row.append(optimizer_step(s, action.microbatch, version=batch + 1))
        rows.append(tuple(row))
    return Schedule(
        "2bw",
        p,
        m,
        tuple(range(p)),
        tuple(rows),
        num_batches=num_batches,
        meta={"weight_versions": "max(floor((k-1)/m) - 1, 0) for 1-indexed micro-batch k"},
    )


register(
    ScheduleFamily(
        name="2bw",
        listing=80,
        title="PipeDream-2BW",
        citation="Narayanan et al., Memory-Efficient Pipeline-Parallel DNN Training, ICML 2021",
        build=lambda p, m, params, _: pipedream_2bw(p, m, int(params[NUM_BATCHES.name])),
        parameters=(NUM_BATCHES,),
        weight_versions=2,
        semantics="stale",
        microbatches_at_least_devices=True,
        flush_per_batch=False,
        idle_vs_1f1b=0.0,  # one fill amortized over the run (PipeDream-2BW §3.1)
        inflight_saturation=lambda p: p,
        memory_rule="1F1B's in-flight counts plus a second copy of the weights",
    )
)
