"""Generators of the classic schedules: GPipe, 1F1B, Megatron's interleaved 1F1B, and
PipeDream-2BW (1F1B without flush, two weight versions).

Every generator returns compute actions only (plus OPTIMIZER_STEP and, for 2BW,
WEIGHT_VERSION); communication is implied by the stage order and made explicit by
:func:`planner.schedules.with_communication` when an executor wants it.
"""

from __future__ import annotations

from collections.abc import Iterable

from planner.errors import ScheduleConfigError
from planner.schedules._ir import Action, ActionKind, Schedule, looped_placement

__all__ = ["gpipe", "interleaved", "one_f_one_b", "pipedream_2bw", "require"]

F, BW = ActionKind.F, ActionKind.BW


def require(condition: bool, message: str) -> None:
    """Raise ScheduleConfigError(message) unless ``condition``: generator input checks."""
    if not condition:
        raise ScheduleConfigError(message)


def _check_counts(name: str, num_devices: int, num_microbatches: int) -> None:
    require(
        num_devices >= 1, f"{name}: the number of devices must be at least 1, got {num_devices}"
    )
    require(
        num_microbatches >= 1,
        f"{name}: the number of micro-batches must be at least 1, got {num_microbatches}",
    )


def _step(stage: int, microbatch: int, chunk: int = 0, version: int | None = None) -> Action:
    return Action(ActionKind.OPTIMIZER_STEP, stage, microbatch, chunk, version=version)


def gpipe(num_devices: int, num_microbatches: int) -> Schedule:
    """GPipe: all forwards, then all backwards, then the optimizer step (one stage a device)."""
    _check_counts("gpipe", num_devices, num_microbatches)
    m = num_microbatches
    rows = []
    for s in range(num_devices):
        row = [Action(F, s, k) for k in range(m)]
        row += [Action(BW, s, k) for k in range(m)]
        row.append(_step(s, m - 1))
        rows.append(tuple(row))
    return Schedule("gpipe", num_devices, m, tuple(range(num_devices)), tuple(rows))


def _one_f_one_b_order(stage: int, num_stages: int, microbatches: Iterable[int]) -> list[Action]:
    """1F1B order of one stage: warm-up forwards, steady F/B pairs, cool-down backwards."""
    mbs = list(microbatches)
    warmup = min(num_stages - stage - 1, len(mbs))
    order = [Action(F, stage, k) for k in mbs[:warmup]]
    for i in range(len(mbs) - warmup):
        order.append(Action(F, stage, mbs[warmup + i]))
        order.append(Action(BW, stage, mbs[i]))
    order += [Action(BW, stage, k) for k in mbs[len(mbs) - warmup :]]
    return order


def one_f_one_b(num_devices: int, num_microbatches: int) -> Schedule:
    """1F1B with a flush (PipeDream-Flush / Megatron's default): stage s runs
    min(p - s - 1, m) warm-up forwards, then alternates forward and backward.

    Stage s holds at most min(p - s, m) micro-batches (BPipe paper, Eq. 2)."""
    _check_counts("1f1b", num_devices, num_microbatches)
    m = num_microbatches
    rows = []
    for s in range(num_devices):
        row = _one_f_one_b_order(s, num_devices, range(m))
        row.append(_step(s, m - 1))
        rows.append(tuple(row))
    return Schedule("1f1b", num_devices, m, tuple(range(num_devices)), tuple(rows))


def interleaved(num_devices: int, num_microbatches: int, num_chunks: int = 2) -> Schedule:
    """Megatron-LM's interleaved 1F1B: each device holds ``num_chunks`` (v) stages, stage
    ``c * p + r`` on device r. Micro-batches run in groups of p through one chunk after the
    other; device r warms up with ``(p - r - 1) * 2 + (v - 1) * p`` forwards (Narayanan et al.
    2021, as in Megatron-LM's ``forward_backward_pipelining_with_interleaving``)."""
    p, m, v = num_devices, num_microbatches, num_chunks
    _check_counts("interleaved", p, m)
    require(v >= 2, f"interleaved: needs at least 2 chunks per device, got {v}; use 1f1b for 1")
    require(
        m % p == 0,
        f"interleaved: the number of micro-batches ({m}) must be a multiple of the number of "
        f"devices ({p}); try {((m + p - 1) // p) * p}",
    )
    total = m * v
    group = p * v

    def virtual(k: int, forward: bool) -> tuple[int, int]:
        """(stage, micro-batch) of the k-th forward or backward of device r (stage w/o r)."""
        in_group = k % group
        chunk = in_group // p
        if not forward:
            chunk = v - 1 - chunk
        microbatch = (k // group) * p + k % p
        return chunk, microbatch

    rows = []
    for r in range(p):
        warmup = min((p - r - 1) * 2 + (v - 1) * p, total)
        row: list[Action] = []

        def fwd(k: int, r: int = r, row: list[Action] = row) -> None:
            chunk, mb = virtual(k, True)
            row.append(Action(F, chunk * p + r, mb, chunk))

        def bwd(k: int, r: int = r, row: list[Action] = row) -> None:
            chunk, mb = virtual(k, False)
            row.append(Action(BW, chunk * p + r, mb, chunk))

        for k in range(warmup):
            fwd(k)
        for i in range(total - warmup):
            fwd(warmup + i)
            bwd(i)
        for k in range(total - warmup, total):
            bwd(k)
        row += [_step(c * p + r, m - 1, c) for c in range(v)]
        rows.append(tuple(row))
    return Schedule(
        "interleaved", p, m, looped_placement(p, v), tuple(rows), meta={"num_chunks": v}
    )


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
    _check_counts("2bw", p, m)
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
        for action in _one_f_one_b_order(s, p, range(total)):
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
                row.append(_step(s, action.microbatch, version=batch + 1))
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
