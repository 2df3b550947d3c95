"""PipeDream-2BW: 1F1B without a flush between batches and two weight versions (Narayanan
et al., "Memory-Efficient Pipeline-Parallel DNN Training", ICML 2021)."""

from __future__ import annotations

from planner.schedules._basic import check_counts, one_f_one_b_order, optimizer_step, require
from planner.schedules._ir import Action, ActionKind, Schedule
from planner.schedules._registry import NUM_BATCHES, ScheduleFamily, register

__all__ = ["pipedream_2bw", "weight_version_2bw"]


def weight_version_2bw(microbatch: int, num_microbatches: int) -> int:
    """Weight version used by a micro-batch under 2BW (PipeDream-2BW §3.1): with k the
    1-indexed micro-batch and m micro-batches per batch, max(floor((k - 1) / m) - 1, 0)."""
    k = microbatch + 1
    return max((k - 1) // num_microbatches - 1, 0)


def _forward_at(k: int, warmup: int) -> int:
    """Index of micro-batch k's forward in a 1F1B order with ``warmup`` warm-up forwards."""
    return k if k < warmup else 2 * k - warmup


def _backward_at(k: int, warmup: int, total: int) -> int:
    """Index of micro-batch k's backward in that order of ``total`` micro-batches."""
    return warmup + 2 * k + 1 if k < total - warmup else total + k


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
        order = one_f_one_b_order(s, p, range(total))
        warmup = min(p - s - 1, total)
        # (index in ``order`` to insert before, rank, marker): batch b's step right after
        # the backward of its last micro-batch; the switch to version b - 1 (the formula's
        # value changes only at a batch's first micro-batch, from batch 2 on) right before
        # batch b's first forward. When both fall in one gap, the step stays with the
        # backward before it and the switch with the forward after it.
        markers = [
            (
                _backward_at(b * m + m - 1, warmup, total) + 1,
                0,
                optimizer_step(s, b * m + m - 1, version=b + 1),
            )
            for b in range(num_batches)
        ]
        markers += [
            (
                _forward_at(b * m, warmup),
                1,
                Action(ActionKind.WEIGHT_VERSION, s, b * m, version=b - 1),
            )
            for b in range(2, num_batches)
        ]
        markers.sort(key=lambda marker: marker[:2])
        row: list[Action] = []
        last = 0
        for at, _, marker in markers:
            row += order[last:at]
            row.append(marker)
            last = at
        row += order[last:]
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
