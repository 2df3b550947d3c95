"""Generators of the classic schedules: GPipe, 1F1B and Megatron's interleaved 1F1B.

Every generator returns compute actions only (plus OPTIMIZER_STEP and, for 2BW,
WEIGHT_VERSION); communication is implied by the stage order and made explicit by
:func:`planner.schedules.with_communication` when an executor wants it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from planner.errors import ScheduleConfigError
from planner.schedules._ir import (
    KIND_CODE,
    ActionKind,
    Columns,
    Schedule,
    looped_placement,
)
from planner.schedules._registry import NUM_CHUNKS, ScheduleFamily, register

__all__ = [
    "Insertion",
    "check_counts",
    "gpipe",
    "insert_actions",
    "interleaved",
    "interleaved_columns",
    "one_f_one_b",
    "one_f_one_b_columns",
    "one_f_one_b_orders",
    "one_f_one_b_positions",
    "require",
]

F, BW = ActionKind.F, ActionKind.BW


def require(condition: bool, message: str) -> None:
    """Raise ScheduleConfigError(message) unless ``condition``: generator input checks."""
    if not condition:
        raise ScheduleConfigError(message)


def check_counts(name: str, num_devices: int, num_microbatches: int) -> None:
    require(
        num_devices >= 1, f"{name}: the number of devices must be at least 1, got {num_devices}"
    )
    require(
        num_microbatches >= 1,
        f"{name}: the number of micro-batches must be at least 1, got {num_microbatches}",
    )


def gpipe(num_devices: int, num_microbatches: int) -> Schedule:
    """GPipe: all forwards, then all backwards, then the optimizer step (one stage a device):
    the looped schedule whose warm-up runs every forward."""
    p, m = num_devices, num_microbatches
    check_counts("gpipe", p, m)
    return Schedule.from_columns("gpipe", p, m, tuple(range(p)), _looped_columns(p, m, 1, [m] * p))


def one_f_one_b(num_devices: int, num_microbatches: int) -> Schedule:
    """1F1B with a flush (PipeDream-Flush / Megatron's default): stage s runs
    min(p - s - 1, m) warm-up forwards, then alternates forward and backward.

    Stage s holds at most min(p - s, m) micro-batches (BPipe paper, Eq. 2)."""
    return Schedule.from_columns(
        "1f1b",
        num_devices,
        num_microbatches,
        tuple(range(num_devices)),
        one_f_one_b_columns(num_devices, num_microbatches),
    )


def interleaved(num_devices: int, num_microbatches: int, num_chunks: int = 2) -> Schedule:
    """Megatron-LM's interleaved 1F1B: each device holds ``num_chunks`` (v) stages, stage
    ``c * p + r`` on device r. Micro-batches run in groups of p through one chunk after the
    other; device r warms up with ``(p - r - 1) * 2 + (v - 1) * p`` forwards (Narayanan et al.
    2021, as in Megatron-LM's ``forward_backward_pipelining_with_interleaving``)."""
    p, m, v = num_devices, num_microbatches, num_chunks
    return Schedule.from_columns(
        "interleaved",
        p,
        m,
        looped_placement(p, v),
        interleaved_columns(p, m, v),
        meta={"num_chunks": v},
    )


def interleaved_columns(num_devices: int, num_microbatches: int, num_chunks: int) -> Columns:
    """The columns of :func:`interleaved` (its checks included)."""
    p, m, v = num_devices, num_microbatches, num_chunks
    check_counts("interleaved", p, m)
    require(v >= 2, f"interleaved: needs at least 2 chunks per device, got {v}; use 1f1b for 1")
    require(
        m % p == 0,
        f"interleaved: the number of micro-batches ({m}) must be a multiple of the number of "
        f"devices ({p}); try {((m + p - 1) // p) * p}",
    )
    return _looped_columns(p, m, v, [min((p - r - 1) * 2 + (v - 1) * p, m * v) for r in range(p)])


def one_f_one_b_columns(num_devices: int, num_microbatches: int) -> Columns:
    """The columns of :func:`one_f_one_b` (its checks included): on every device its
    1F1B order (:func:`one_f_one_b_orders`), then the optimizer step."""
    check_counts("1f1b", num_devices, num_microbatches)
    return _looped_columns(
        num_devices, num_microbatches, 1, _one_f_one_b_warmups(num_devices, num_microbatches)
    )


def one_f_one_b_orders(num_devices: int, microbatches: int) -> Columns:
    """The 1F1B order of every stage, one stage a device, as columns (no step): stage s
    runs min(p - s - 1, m) warm-up forwards, then alternates forward and backward, then
    runs the remaining backwards."""
    warmups = _one_f_one_b_warmups(num_devices, microbatches)
    return _looped_columns(num_devices, microbatches, 1, warmups, steps=0)


def _one_f_one_b_warmups(p: int, m: int) -> list[int]:
    return [min(p - r - 1, m) for r in range(p)]


def one_f_one_b_positions(
    warmup: np.ndarray, k: np.ndarray, total: int
) -> tuple[np.ndarray, np.ndarray]:
    """Where the k-th forward and the k-th backward sit in a list of ``total`` of each that
    runs ``warmup`` forwards, then forward warmup + i and backward i alternately, then the
    remaining backwards (1F1B's order; GPipe's when every forward is in the warm-up)."""
    at_f = np.where(k < warmup, k, 2 * k - warmup)
    at_b = np.where(k < total - warmup, warmup + 2 * k + 1, total + k)
    return at_f, at_b


def _looped_columns(p: int, m: int, v: int, warmups: list[int], steps: int = 1) -> Columns:
    """1F1B over ``v`` chunks per device placed in a loop (stage ``c * p + r`` on device r),
    device r warming up with ``warmups[r]`` forwards, as columns: micro-batches run in
    groups of p through one chunk after the other (all of them through the one chunk when
    v is 1), backwards through the chunks in reverse; then a step per chunk (none with
    ``steps`` 0)."""
    total = m * v  # forwards (and backwards) per device
    group = p * v
    k = np.arange(total, dtype=np.int64)  # the k-th forward or backward of a device
    chunk_f = (k % group) // p
    chunk_b = v - 1 - chunk_f
    microbatch = (k // group) * p + k % p
    code_f, code_b, code_step = KIND_CODE[F], KIND_CODE[BW], KIND_CODE[ActionKind.OPTIMIZER_STEP]
    size = 2 * total + v * steps  # per device: every forward and backward, a step per chunk
    kind = np.empty((p, size), np.int64)
    chunk = np.empty((p, size), np.int64)
    mb = np.empty((p, size), np.int64)
    at_f, at_b = one_f_one_b_positions(np.asarray(warmups, dtype=np.int64)[:, None], k, total)
    row = np.arange(p)[:, None]
    kind[row, at_f], chunk[row, at_f], mb[row, at_f] = code_f, chunk_f, microbatch
    kind[row, at_b], chunk[row, at_b], mb[row, at_b] = code_b, chunk_b, microbatch
    if steps:
        kind[:, 2 * total :] = code_step
        chunk[:, 2 * total :] = np.arange(v)
        mb[:, 2 * total :] = m - 1
    device = np.repeat(np.arange(p, dtype=np.int64), size)
    return Columns(
        device=device,
        kind=kind.reshape(-1),
        stage=chunk.reshape(-1) * p + device,
        microbatch=mb.reshape(-1),
        chunk=chunk.reshape(-1),
        peer=np.full(p * size, -1, np.int64),
        version=np.full(p * size, -1, np.int64),
        offsets=np.arange(p + 1, dtype=np.int64) * size,
    )


class Insertion(NamedTuple):
    """Actions to insert into a schedule's columns (:func:`insert_actions`), ordered by
    device and position: each goes before the action at ``position`` in the list of
    ``device`` (the list's length: at its end), those at one place in the order given;
    ``fields`` holds their kind, stage, microbatch, chunk, peer and version columns."""

    device: np.ndarray
    position: np.ndarray
    fields: dict[str, np.ndarray]


def insert_actions(columns: Columns, insertion: Insertion) -> Columns:
    """``columns`` with the actions of ``insertion`` inserted: what a generator that adds
    actions to a base order does instead of rebuilding its lists. Every action moves up by
    the number inserted before it, in one pass."""
    device, position, fields = insertion
    at = columns.offsets[device] + position  # the action each goes before, in all lists
    assert (np.diff(device) >= 0).all() and (np.diff(at) >= 0).all(), "not in list order"
    size, count = len(columns.kind), len(at)
    kept_to = np.arange(size, dtype=np.int64) + np.searchsorted(at, np.arange(size), "right")
    inserted_to = at + np.arange(count, dtype=np.int64)

    def merged(old: np.ndarray, new: np.ndarray) -> np.ndarray:
        out = np.empty(size + count, np.int64)
        out[kept_to] = old
        out[inserted_to] = new
        return out

    offsets = columns.offsets.copy()
    offsets[1:] += np.cumsum(np.bincount(device, minlength=len(offsets) - 1))
    return Columns(
        device=merged(columns.device, device),
        kind=merged(columns.kind, fields["kind"]),
        stage=merged(columns.stage, fields["stage"]),
        microbatch=merged(columns.microbatch, fields["microbatch"]),
        chunk=merged(columns.chunk, fields["chunk"]),
        peer=merged(columns.peer, fields["peer"]),
        version=merged(columns.version, fields["version"]),
        offsets=offsets,
    )


register(
    ScheduleFamily(
        name="gpipe",
        listing=10,
        title="GPipe",
        citation="Huang et al., GPipe, NeurIPS 2019",
        build=lambda p, m, _, __: gpipe(p, m),
        runtimes=frozenset({"stagewright", "torch"}),
        inflight_grows_with_microbatches=True,
        memory_rule="every device holds all m micro-batches of its stage at its peak",
        single_device_as="1f1b",
    )
)
register(
    ScheduleFamily(
        name="1f1b",
        listing=20,
        title="1F1B (PipeDream-Flush)",
        citation="Narayanan et al., PipeDream-2BW/Flush, ICML 2021; Megatron-LM's default",
        build=lambda p, m, _, __: one_f_one_b(p, m),
        runtimes=frozenset({"stagewright", "torch", "megatron"}),
        # Device s warms up with min(p - s, m) forwards.
        inflight_saturation=lambda p: p,
        memory_rule="stage s holds min(p - s, m) micro-batches (BPipe Eq. 2)",
    )
)
register(
    ScheduleFamily(
        name="interleaved",
        listing=30,
        title="Interleaved 1F1B",
        citation="Narayanan et al., Efficient Large-Scale Language Model Training on GPU "
        "Clusters Using Megatron-LM, SC 2021",
        build=lambda p, m, params, _: interleaved(p, m, int(params[NUM_CHUNKS.name])),
        parameters=(NUM_CHUNKS,),
        runtimes=frozenset({"stagewright", "torch", "megatron"}),
        min_devices=2,
        microbatches_multiple_of_devices=True,
        idle_vs_1f1b=0.5,  # 1/v with the default v = 2 (Narayanan et al. 2021)
        inflight_saturation=lambda p: 2 * p,
        memory_rule="device r holds about (1 + (p - 1) / (p v)) of 1F1B's device r",
    )
)
