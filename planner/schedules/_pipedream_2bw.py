"""PipeDream-2BW: 1F1B without a flush between batches and two weight versions (Narayanan
et al., "Memory-Efficient Pipeline-Parallel DNN Training", ICML 2021)."""

from __future__ import annotations

import numpy as np

from planner.schedules._basic import (
    Insertion,
    check_counts,
    insert_actions,
    one_f_one_b_orders,
    one_f_one_b_positions,
    require,
)
from planner.schedules._ir import KIND_CODE, ActionKind, Schedule
from planner.schedules._registry import NUM_BATCHES, ScheduleFamily, register

__all__ = ["pipedream_2bw", "weight_version_2bw"]

K = ActionKind


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
    uses the version its forward used. At most two versions are alive per stage.

    Built on columns: the steps and switches are inserted into every stage's 1F1B order."""
    p, m = num_devices, num_microbatches
    check_counts("2bw", p, m)
    require(num_batches >= 1, f"2bw: the number of batches must be at least 1, got {num_batches}")
    require(
        m >= p,
        f"2bw: needs at least as many micro-batches per batch as devices (m >= p), got "
        f"m={m} for p={p}; use m >= {p}",
    )
    total = m * num_batches
    order = one_f_one_b_orders(p, total)
    return Schedule.from_columns(
        "2bw",
        p,
        m,
        tuple(range(p)),
        insert_actions(order, _markers(p, m, num_batches)),
        num_batches=num_batches,
        meta={"weight_versions": "max(floor((k-1)/m) - 1, 0) for 1-indexed micro-batch k"},
    )


def _markers(p: int, m: int, num_batches: int) -> Insertion:
    """Each stage's optimizer steps and weight-version switches, placed in its 1F1B order
    (of m * num_batches micro-batches): batch b's step, making version b + 1, right after
    the backward of its last micro-batch; the switch to version b - 1 (the formula's value
    changes only at a batch's first micro-batch, from batch 2 on) right before batch b's
    first forward. When both fall in one gap, the step stays with the backward before it
    and the switch with the forward after it."""
    total = m * num_batches
    stage = np.arange(p, dtype=np.int64)[:, None]
    warmup = np.minimum(p - 1 - stage, total)
    batch = np.arange(num_batches, dtype=np.int64)[None, :]
    last = batch * m + m - 1  # each batch's last micro-batch
    after = one_f_one_b_positions(warmup, last, total)[1] + 1  # right after its backward
    switch = np.arange(2, num_batches, dtype=np.int64)[None, :] * m  # first micro-batches
    before = one_f_one_b_positions(warmup, switch, total)[0]  # their forwards
    shape = (p, num_batches + max(num_batches - 2, 0))
    position = np.concatenate((after, before), axis=1)
    rank = np.concatenate((np.zeros_like(after), np.ones_like(before)), axis=1)
    microbatch = np.broadcast_to(np.concatenate((last, switch), axis=1), shape)
    kind = np.where(rank == 0, KIND_CODE[K.OPTIMIZER_STEP], KIND_CODE[K.WEIGHT_VERSION])
    version = np.broadcast_to(np.concatenate((batch + 1, switch // m - 1), axis=1), shape)
    device = np.broadcast_to(stage, shape)
    # Per stage, in list order (position, then the step before the switch).
    order = np.lexsort((rank.reshape(-1), position.reshape(-1), device.reshape(-1)))
    count = shape[0] * shape[1]
    fields = {
        "kind": kind.reshape(-1)[order],
        "stage": device.reshape(-1)[order],
        "microbatch": microbatch.reshape(-1)[order],
        "chunk": np.zeros(count, np.int64),
        "peer": np.full(count, -1, np.int64),
        "version": version.reshape(-1)[order],
    }
    return Insertion(device.reshape(-1)[order], position.reshape(-1)[order], fields)


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
        single_device_as="1f1b",
    )
)
