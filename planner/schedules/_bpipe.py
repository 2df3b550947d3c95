"""BPipe: activation balancing by evicting saved activations to a pair device
(Kim et al., ICML 2023, "BPipe: Memory-Balanced Pipeline Parallelism").

Stage s of a p-stage 1F1B pipeline holds up to p - s micro-batches while stage p - 1 - s holds
s + 1, so evictor s sends activations to acceptor p - 1 - s and loads them back before their
backward, keeping every stage at or below mu_opt = ceil((p + 2) / 2) (§3.3).

The transfer schedule follows the paper's Algorithm 1, read over the device's action order:
- warm-up: when the next forward would exceed mu_opt, evict the latest saved micro-batch,
  overlapped with the current forward (lines 9-13);
- a backward whose micro-batch was evicted gets its LOAD one step earlier, overlapped with the
  preceding forward in the steady phase (lines 14-18), or right before it in the cool-down,
  where the device waits for the gradient anyway;
- in the steady phase that load plus the forward would exceed mu_opt, so one more micro-batch
  is evicted, overlapped with the backward before (lines 19-23).
Which micro-batch is evicted is Belady's choice, the one whose backward comes furthest in the
future (§3.4); in 1F1B that is always the latest forward, C[i-3] of Algorithm 1, so this is
the paper's algorithm exactly, and the same rule yields the interleaved variant of Appendix A
(mu_opt = p * v + 1 in units of one chunk's micro-batch).
"""

from __future__ import annotations

import heapq
import math
from operator import itemgetter

import numpy as np

from planner._arrays import sorted_distinct
from planner.schedules._basic import (
    Insertion,
    insert_actions,
    interleaved_columns,
    one_f_one_b_columns,
    require,
)
from planner.schedules._engine import compile_schedule, run_timing
from planner.schedules._ir import KIND_CODE, Action, ActionKind, Columns, Schedule, looped_placement
from planner.schedules._registry import NUM_CHUNKS, Parameter, ScheduleFamily, register

__all__ = ["bpipe", "bpipe_mu_opt", "plan_transfers"]

F, B, W, BW = ActionKind.F, ActionKind.B, ActionKind.W, ActionKind.BW
EVICT, LOAD = ActionKind.EVICT, ActionKind.LOAD


def bpipe_mu_opt(num_devices: int, num_chunks: int = 1) -> int:
    """The balanced number of saved micro-batches per stage: ceil((p + 2) / 2) for 1F1B
    (§3.3), p * v + 1 chunk-micro-batches for interleaved 1F1B with v chunks (Appendix A)."""
    if num_chunks == 1:
        return math.ceil((num_devices + 2) / 2)
    return num_devices * num_chunks + 1


def plan_transfers(
    compute: list[Action], capacity: int
) -> tuple[list[list[tuple[ActionKind, tuple[int, int]]]], int]:
    """Transfers for one device: ``result[i]`` lists (EVICT|LOAD, (stage, microbatch)) issued
    just before ``compute[i]`` (overlapping it). Returns the transfers and the peak number of
    saved micro-batches the device then holds (loads and evictions in flight counted)."""
    n = len(compute)
    kinds = list(map(itemgetter(0), compute))
    is_f = [kind is F for kind in kinds]
    frees = [kind is BW or kind is W for kind in kinds]
    # Every forward counted, whatever its stage.
    plain_peak = int(_saved_peaks(np.array(is_f, bool), np.array(frees, bool), np.array([0, n]))[0])
    if plain_peak <= capacity:
        # Never over capacity without transfers: the loop below would plan none (a device
        # in the acceptor half, or a short run), so skip it.
        return [[] for _ in range(n)], plain_peak
    return _belady(
        is_f,
        frees,
        [kind is BW or kind is B for kind in kinds],
        list(zip(map(itemgetter(1), compute), map(itemgetter(2), compute), strict=True)),
        capacity,
    )


def _belady(
    is_f: list[bool],
    frees: list[bool],
    needs_input: list[bool],
    key: list[tuple[int, int]],
    capacity: int,
) -> tuple[list[list[tuple[ActionKind, tuple[int, int]]]], int]:
    """:func:`plan_transfers` for the compute list given by kind (forward; ends the
    activation: W or BW; wants its activations: B or BW) and (stage, micro-batch) ``key``."""
    n = len(key)
    backward_at = {key[i]: i for i in range(n) if needs_input[i]}
    transfers: list[list[tuple[ActionKind, tuple[int, int]]]] = [[] for _ in range(n)]
    held: set[tuple[int, int]] = set()
    evicted: set[tuple[int, int]] = set()
    # Where the LOAD for the backward at j goes: j - 1 if a forward precedes it (steady
    # phase), else j itself (cool-down: the device is waiting anyway). Inverted: the
    # micro-batches of the backwards whose load position is i (issued if evicted then).
    loads_for: dict[int, list[tuple[int, int]]] = {}
    for j in range(n):
        if needs_input[j]:
            loads_for.setdefault(j - 1 if j > 0 and is_f[j - 1] else j, []).append(key[j])
    # Belady's victim is the held micro-batch whose backward comes last: a heap of the held
    # ones by that position, entries of micro-batches no longer held dropped when they surface.
    furthest_first: list[tuple[int, tuple[int, int]]] = []
    peak = 0
    loads: list[tuple[int, int]] | tuple[()] = loads_for.get(0, ())  # those at i
    for i in range(n):
        for item in loads:
            if item in evicted:
                evicted.discard(item)
                held.add(item)
                heapq.heappush(furthest_first, (-backward_at[item], item))
                transfers[i].append((LOAD, item))
        here = key[i]
        if is_f[i]:
            held.add(here)
            heapq.heappush(furthest_first, (-backward_at.get(here, n), here))
        if len(held) > peak:
            peak = len(held)
        if frees[i]:
            held.discard(here)
        if i + 1 >= n:
            break
        # Loads that would be issued at i + 1 if nothing else changes.
        loads = loads_for.get(i + 1, ())
        upcoming = [item for item in loads if item in evicted] if loads else []
        demand = len(held) + is_f[i + 1] + len(upcoming)
        if demand <= capacity:
            continue
        busy = {here, key[i + 1], *upcoming}
        while demand > capacity:
            victim = _furthest(furthest_first, held, busy)
            if victim is None:
                break
            held.discard(victim)
            evicted.add(victim)
            transfers[i].append((EVICT, victim))
            demand -= 1
    return transfers, peak


def _furthest(
    heap: list[tuple[int, tuple[int, int]]], held: set[tuple[int, int]], busy: set[tuple[int, int]]
) -> tuple[int, int] | None:
    """Pop the held, not busy micro-batch whose backward comes last (None if there is none);
    busy ones stay in the heap."""
    kept = []
    victim = None
    while heap:
        entry = heapq.heappop(heap)
        if entry[1] not in held:
            continue  # evicted or freed since it was pushed
        if entry[1] in busy:
            kept.append(entry)
            continue
        victim = entry[1]
        break
    for entry in kept:
        heapq.heappush(heap, entry)
    return victim


def bpipe(num_devices: int, num_microbatches: int, num_chunks: int = 1) -> Schedule:
    """1F1B (or interleaved 1F1B with ``num_chunks`` > 1) plus BPipe's transfer schedule.

    Device r and device p - 1 - r form an evictor/acceptor pair; only devices that would
    exceed mu_opt evict (for 1F1B: stages s <= floor((p - 4) / 2), §3.3).

    Built on the schedules' columns: the transfers and the acceptors' mirrors are inserted
    into the base schedule's arrays, and the actions are made from the result."""
    p, v = num_devices, num_chunks
    require(p >= 2, f"bpipe: needs at least 2 devices, got {p}")
    base = (
        one_f_one_b_columns(p, num_microbatches)
        if v == 1
        else interleaved_columns(p, num_microbatches, v)
    )
    stage_devices = looped_placement(p, v)
    capacity = bpipe_mu_opt(p, v)
    planned, pairs = _plan_evictions(base, capacity)
    name = "bpipe" if v == 1 else "bpipe-interleaved"
    meta = {"mu_opt": capacity, "pairs": pairs, "num_chunks": v}
    if planned is None:
        return Schedule.from_columns(name, p, num_microbatches, stage_devices, base, meta=meta)
    evictor_only = insert_actions(base, planned)
    mirrors = _acceptor_mirrors(
        Schedule.from_columns("bpipe", p, num_microbatches, stage_devices, evictor_only)
    )
    with_mirrors = insert_actions(evictor_only, mirrors)
    return Schedule.from_columns(name, p, num_microbatches, stage_devices, with_mirrors, meta=meta)


def _plan_evictions(base: Columns, capacity: int) -> tuple[Insertion | None, list[list[int]]]:
    """The transfers of every device of ``base`` that would exceed ``capacity`` (Algorithm 1
    by :func:`plan_transfers` on its forwards and fused backwards), as an insertion (None if
    there are none), and the [evictor, acceptor] pairs."""
    p = len(base.offsets) - 1
    code_f, code_bw = KIND_CODE[F], KIND_CODE[BW]
    passes = np.flatnonzero((base.kind == code_f) | (base.kind == code_bw))
    is_f = base.kind[passes] == code_f
    device = base.device[passes]
    bounds = np.searchsorted(device, np.arange(p + 1))
    chunk_of_stage = np.zeros(int(base.stage.max(initial=0)) + 1, np.int64)
    chunk_of_stage[base.stage] = base.chunk
    # Per transfer: evictor, position in its list, kind, stage, micro-batch.
    entries: list[tuple[int, int, int, int, int]] = []
    pairs: list[list[int]] = []
    for r in np.flatnonzero(_saved_peaks(is_f, ~is_f, bounds) > capacity).tolist():
        lo, hi = int(bounds[r]), int(bounds[r + 1])
        forward = is_f[lo:hi].tolist()
        backward = [not f for f in forward]  # fused backwards: end and want the activation
        ids = passes[lo:hi]
        key = list(zip(base.stage[ids].tolist(), base.microbatch[ids].tolist(), strict=True))
        transfers, _ = _belady(forward, backward, backward, key, capacity)
        if not any(transfers):
            continue
        acceptor = p - 1 - r
        assert acceptor > r, f"device {r} would evict but is not in the evictor half"
        pairs.append([r, acceptor])
        entries += [
            (r, at, KIND_CODE[what], stage, microbatch)
            for at, planned in zip((ids - base.offsets[r]).tolist(), transfers, strict=True)
            for what, (stage, microbatch) in planned
        ]
    if not pairs:
        return None, pairs
    evictor, position, kinds, stages, microbatches = np.array(entries, np.int64).T
    fields = {
        "kind": kinds,
        "stage": stages,
        "microbatch": microbatches,
        "chunk": chunk_of_stage[stages],
        "peer": p - 1 - evictor,
        "version": np.full(len(kinds), -1, np.int64),
    }
    return Insertion(evictor, position, fields), pairs


def _saved_peaks(is_f: np.ndarray, frees: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Per device, the peak of its saved micro-batches over its compute actions (devices in
    order, device d's from ``bounds[d]`` to ``bounds[d + 1]``; ``is_f``: a forward,
    ``frees``: a W or fused backward, which ends an activation): the running sum of +1 at
    a forward and -1 at the action after a free, at its highest (at least 0)."""
    starts = bounds[:-1]
    first = np.zeros(len(is_f) + 1, bool)
    first[starts] = True
    freed = np.concatenate(([False], frees[:-1])) & ~first[:-1]  # the action before ended one
    level = np.cumsum(is_f.astype(np.int64) - freed)
    before = np.concatenate(([0], level))[starts]  # the sum before each device's first
    peaks = np.zeros(len(starts), np.int64)
    present = bounds[1:] > starts
    if present.any():
        highest = np.maximum.reduceat(level, starts[present])
        peaks[present] = np.maximum(highest - before[present], 0)
    return peaks


def _acceptor_mirrors(evictor_only: Schedule) -> Insertion:
    """Each transfer's mirror on the acceptor's list where the acceptor would be when the
    evictor issues it (timed with a typical F:B = 1:2), so that an executor posts the receive
    (or the send back) in time and a person reading the lists sees both ends: before the
    first action that starts no earlier than it (the first whose running maximum of start
    times reaches it), mirrors at one place in time order."""
    compiled = compile_schedule(evictor_only)
    columns = evictor_only.columns
    durations = np.where(columns.kind == KIND_CODE[F], 1.0, 2.0).tolist()
    start = np.array(run_timing(compiled, durations, transfer=0.5).start)
    moving = np.flatnonzero(
        (columns.kind == KIND_CODE[EVICT]) | (columns.kind == KIND_CODE[LOAD])
    )  # evictors' transfers, in device and list order
    acceptor, time = columns.peer[moving], start[moving]
    by_time = np.lexsort((time, acceptor))  # stable: ties keep the list order
    moving, acceptor, time = moving[by_time], acceptor[by_time], time[by_time]
    position = np.empty(len(moving), np.int64)
    bounds = np.searchsorted(acceptor, np.arange(len(columns.offsets)))
    for device in sorted_distinct(acceptor).tolist():
        lo, hi = int(bounds[device]), int(bounds[device + 1])
        begin, end = int(columns.offsets[device]), int(columns.offsets[device + 1])
        started = np.maximum.accumulate(start[begin:end])
        position[lo:hi] = np.searchsorted(started, time[lo:hi], side="left")
    fields = {
        "kind": columns.kind[moving],
        "stage": columns.stage[moving],
        "microbatch": columns.microbatch[moving],
        "chunk": columns.chunk[moving],
        "peer": columns.device[moving],
        "version": columns.version[moving],
    }
    return Insertion(acceptor, position, fields)


register(
    ScheduleFamily(
        name="bpipe",
        listing=40,
        title="BPipe",
        citation="Kim et al., BPipe: Memory-Balanced Pipeline Parallelism for Training Large "
        "Language Models, ICML 2023",
        build=lambda p, m, _, __: bpipe(p, m),
        transfers=True,
        min_devices=2,
        inflight_saturation=lambda p: (3 * p + 1) // 2,
        memory_rule="1F1B with evictions to the pair device: at most ceil((p + 2) / 2) "
        "micro-batches per stage (§3.3)",
        memory_fallback_for="1f1b",
    )
)

# Interleaved BPipe (Appendix A): interleaved 1F1B's looped placement with v chunks, balanced
# to p * v + 1 chunk-micro-batches. One chunk is plain BPipe, listed on its own.
_CHUNKS = Parameter(NUM_CHUNKS.name, "Stages per device (v); one is plain bpipe.", 2, 2)
register(
    ScheduleFamily(
        name="bpipe-interleaved",
        title="Interleaved BPipe",
        citation="Kim et al., BPipe: Memory-Balanced Pipeline Parallelism for Training Large "
        "Language Models, ICML 2023, Appendix A",
        build=lambda p, m, params, _: bpipe(p, m, int(params[_CHUNKS.name])),
        parameters=(_CHUNKS,),
        transfers=True,
        min_devices=2,
        microbatches_multiple_of_devices=True,
        idle_vs_1f1b=0.5,  # interleaved 1F1B's 1/v with v = 2; its transfers hide behind compute
        memory_rule="interleaved 1F1B with evictions to the pair device: at most p v + 1 "
        "chunk-micro-batches per device (Appendix A)",
        memory_fallback_for="interleaved",
    )
)
