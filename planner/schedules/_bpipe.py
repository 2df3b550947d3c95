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
from itertools import compress
from operator import itemgetter

import numpy as np

from planner.schedules._basic import interleaved, one_f_one_b, require
from planner.schedules._engine import compile_schedule, run_timing
from planner.schedules._inflight import saved_peak
from planner.schedules._ir import KIND_CODE, Action, ActionKind, Schedule
from planner.schedules._registry import NUM_CHUNKS, Parameter, ScheduleFamily, register

__all__ = ["bpipe", "bpipe_mu_opt", "plan_transfers"]

F, B, W, BW = ActionKind.F, ActionKind.B, ActionKind.W, ActionKind.BW
EVICT, LOAD = ActionKind.EVICT, ActionKind.LOAD
_PASSES = frozenset({F, BW})  # what plan_transfers plans around


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
    plain_peak = saved_peak(compute)  # counts every forward, whatever its stage
    if plain_peak <= capacity:
        # Never over capacity without transfers: the loop below would plan none (a device
        # in the acceptor half, or a short run), so skip it.
        return [[] for _ in range(n)], plain_peak
    kinds = list(map(itemgetter(0), compute))
    key = list(zip(map(itemgetter(1), compute), map(itemgetter(2), compute), strict=True))
    is_f = [kind is F for kind in kinds]
    frees = [kind is BW or kind is W for kind in kinds]  # ends the activation
    needs_input = [kind is BW or kind is B for kind in kinds]  # wants its activations
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
    exceed mu_opt evict (for 1F1B: stages s <= floor((p - 4) / 2), §3.3)."""
    p = num_devices
    require(p >= 2, f"bpipe: needs at least 2 devices, got {p}")
    base = (
        one_f_one_b(p, num_microbatches)
        if num_chunks == 1
        else interleaved(p, num_microbatches, num_chunks)
    )
    capacity = bpipe_mu_opt(p, num_chunks)
    rows: list[list[Action]] = []
    pairs: list[list[int]] = []
    for r, row in enumerate(base.actions):
        where = list(compress(range(len(row)), map(_PASSES.__contains__, map(itemgetter(0), row))))
        transfers, _ = plan_transfers(list(map(row.__getitem__, where)), capacity)
        if not any(transfers):
            rows.append(list(row))
            continue
        acceptor = p - 1 - r
        assert acceptor > r, f"device {r} would evict but is not in the evictor half"
        pairs.append([r, acceptor])
        # The row with each compute action's transfers just before it.
        new_row: list[Action] = []
        last = 0
        for index, planned in enumerate(transfers):
            if planned:
                new_row += row[last : where[index]]
                last = where[index]
                new_row += [
                    Action(kind, stage, mb, base.chunk_of(stage), peer=acceptor)
                    for kind, (stage, mb) in planned
                ]
        new_row += row[last:]
        rows.append(new_row)
    evictor_only = Schedule(
        "bpipe", p, num_microbatches, base.stage_devices, tuple(tuple(r) for r in rows)
    )
    name = "bpipe" if num_chunks == 1 else "bpipe-interleaved"
    meta = {"mu_opt": capacity, "pairs": pairs, "num_chunks": num_chunks}
    with_mirrors = _add_acceptor_mirrors(evictor_only, rows)
    return Schedule(name, p, num_microbatches, base.stage_devices, with_mirrors, meta=meta)


def _add_acceptor_mirrors(
    evictor_only: Schedule, rows: list[list[Action]]
) -> tuple[tuple[Action, ...], ...]:
    """Put each transfer's mirror on the acceptor's list where the acceptor would be when the
    evictor issues it (timed with a typical F:B = 1:2), so that an executor posts the receive
    (or the send back) in time and a person reading the lists sees both ends."""
    compiled = compile_schedule(evictor_only)
    columns = evictor_only.columns
    durations = np.where(columns.kind == KIND_CODE[F], 1.0, 2.0).tolist()
    timing = run_timing(compiled, durations, transfer=0.5)
    mirrors: dict[int, list[tuple[float, Action]]] = {}
    moving = (columns.kind == KIND_CODE[EVICT]) | (columns.kind == KIND_CODE[LOAD])
    for i in np.flatnonzero(moving).tolist():  # evictors' transfers, in device and list order
        action, evictor = compiled.action_of[i], int(compiled.device_of[i])
        assert action.peer is not None
        mirror = Action(action.kind, action.stage, action.microbatch, action.chunk, evictor)
        mirrors.setdefault(action.peer, []).append((timing.start[i], mirror))
    out = []
    for device, row in enumerate(rows):
        pending = sorted(mirrors.get(device, []), key=lambda item: item[0])
        if not pending:
            out.append(tuple(row))
            continue
        # Each mirror goes before the first action that starts no earlier than it (the
        # first whose running maximum of start times reaches it), in time order.
        base = compiled.offsets[device]
        started = np.maximum.accumulate(np.asarray(timing.start[base : base + len(row)]))
        places = np.searchsorted(started, [time for time, _ in pending], side="left")
        merged: list[Action] = []
        last = 0
        for place, (_, mirror) in zip(places.tolist(), pending, strict=True):
            merged += row[last:place]
            merged.append(mirror)
            last = place
        merged += row[last:]
        out.append(tuple(merged))
    return tuple(out)


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
