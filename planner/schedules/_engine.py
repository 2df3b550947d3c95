"""Timing engine: start and end of every action of a schedule, given durations.

This is the one place that knows the execution semantics of the IR; the simulator (which
adds memory and metrics on top) and the validator (which uses it to find deadlocks) share it.

Semantics
---------
- Each device runs its compute actions (F, B, W, BW, OPTIMIZER_STEP) one at a time, in list
  order; an action starts when the device is free and its inputs have arrived.
- Inputs: F(s, m) needs F(s-1, m); B/BW(s, m) needs B/BW(s+1, m) (the last stage needs its own
  F, which computes the loss) and, if the activations were evicted, their LOAD; W(s, m) needs
  B(s, m). An input produced on another device arrives ``comm`` later.
- EVICT/LOAD on the evictor's list are asynchronous copies: issued when the device reaches them
  (after the previous compute action ends), run one at a time on the device's copy engine,
  overlap the next compute action, and the compute action after that one waits for them. A
  LOAD also waits for its EVICT. With ``overlap_transfers=False`` they run on the compute lane
  instead and block the device.
- SEND/RECV, WEIGHT_VERSION and the acceptor's EVICT/LOAD mirrors take no time: the engine
  models communication as latency on the edges above, and the executor uses the markers to
  post its sends and receives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import chain
from operator import itemgetter

import numpy as np

from planner.errors import InvalidScheduleError
from planner.schedules._ir import KIND_CODE, Action, ActionKind, Schedule

K = ActionKind

__all__ = [
    "COMPUTE",
    "MARKER",
    "TRANSFER",
    "CompiledSchedule",
    "Timing",
    "compile_schedule",
    "run_timing",
]

# Lanes of an action, as integer codes so the hot loop avoids enum comparisons.
COMPUTE, TRANSFER, MARKER = 0, 1, 2


@dataclass(frozen=True)
class CompiledSchedule:
    """Flat arrays over all actions (index = global action id, devices in order).

    Every action has at most two inputs: ``dep_a``/``dep_b`` hold the producer's id or -1, and
    ``cross_a``/``cross_b`` whether it lives on another device (so ``comm`` applies).
    ``dep_b`` is only ever a backward's LOAD: -1 everywhere in a schedule without transfers."""

    schedule: Schedule
    device_of: list[int]
    lane: list[int]  # COMPUTE / TRANSFER / MARKER
    dep_a: list[int]
    cross_a: list[bool]
    dep_b: list[int]
    cross_b: list[bool]
    offsets: list[int]  # first id of each device's list; offsets[-1] == number of actions

    # What only the memory curves and error messages read is derived when first asked for:
    # timing a schedule needs the lists above alone.

    @cached_property
    def action_of(self) -> list[Action]:
        return list(chain.from_iterable(self.schedule.actions))

    @cached_property
    def kinds(self) -> list[ActionKind]:
        return list(map(itemgetter(0), self.action_of))

    @cached_property
    def stages(self) -> list[int]:
        stages: list[int] = self.schedule.columns.stage.tolist()
        return stages

    @cached_property
    def owner_of_transfer(self) -> list[bool]:
        """Per action: an EVICT/LOAD on the evictor (False for the acceptor's mirror)."""
        owned: list[bool] = _owned_transfers(self.schedule)[1].tolist()
        return owned

    def inputs(self, i: int) -> list[int]:
        return [j for j in (self.dep_a[i], self.dep_b[i]) if j >= 0]

    @cached_property
    def has_transfers(self) -> bool:
        return TRANSFER in self.lane

    @cached_property
    def order(self) -> list[int]:
        """Every action id in an order the devices can run them: each device's list in its
        order, each action after its inputs. Which actions can run next never depends on
        durations, so this is computed once and every timing follows it. Raises
        InvalidScheduleError (rule 6) on a deadlock."""
        dep_a, dep_b, offsets = self.dep_a, self.dep_b, self.offsets
        done = [False] * len(dep_a)
        pointer = offsets[:-1].copy()
        # The device blocked on each action; a second one (never in the IR's dependency
        # shapes, where an action has one consumer on another device) goes to ``more``.
        waiting = [-1] * len(dep_a)
        more: dict[int, list[int]] = {}
        order: list[int] = []
        append = order.append
        work = list(range(len(offsets) - 1))
        while work:
            device = work.pop()
            i = pointer[device]
            stop = offsets[device + 1]
            while i < stop:
                j = dep_a[i]
                if j < 0 or done[j]:
                    j = dep_b[i]
                if j >= 0 and not done[j]:
                    if waiting[j] < 0:
                        waiting[j] = device
                    else:
                        more.setdefault(j, []).append(device)
                    break
                done[i] = True
                append(i)
                woken = waiting[i]
                if woken >= 0:
                    work.append(woken)
                    if more:
                        work.extend(more.pop(i, ()))
                i += 1
            pointer[device] = i
        if len(order) != len(dep_a):
            end = [0.0 if d else -1.0 for d in done]
            raise InvalidScheduleError(6, _deadlock_message(self, pointer, end))
        return order

    @cached_property
    def pass_codes(self) -> tuple[np.ndarray, np.ndarray]:
        """(code, stage) per action as arrays: code 0-3 for F, B, W, BW and 4 for every
        other kind, to look durations up in one indexing step."""
        columns = self.schedule.columns
        return _PASS_CODE[columns.kind], columns.stage

    @cached_property
    def device_spans(self) -> tuple[list[int], np.ndarray, np.ndarray]:
        """Per device, the id of its first action that is not a zero-time marker (-1 when
        it has none); and the ids of the compute actions with their devices: what a
        device's span and busy time are made of."""
        lane = np.asarray(self.lane, dtype=np.int8)
        device = self.schedule.columns.device
        work = np.flatnonzero(lane != MARKER)
        devices = len(self.offsets) - 1
        first = np.searchsorted(device[work], np.arange(devices))
        present = np.bincount(device[work], minlength=devices) > 0
        compute = np.flatnonzero(lane == COMPUTE)
        first_work = np.where(present, work[np.minimum(first, len(work) - 1)], -1)
        return first_work.tolist(), compute, device[compute]

    @cached_property
    def work_by_device(self) -> list[tuple[list[int], list[int]]]:
        """Per device: ids of its actions that are not zero-time markers, and of those on
        the compute lane (computed once: a compiled schedule is timed many times)."""
        out = []
        for device in range(len(self.offsets) - 1):
            ids = range(self.offsets[device], self.offsets[device + 1])
            work = [i for i in ids if self.lane[i] != MARKER]
            out.append((work, [i for i in work if self.lane[i] == COMPUTE]))
        return out


@dataclass(frozen=True)
class Timing:
    """Start and end time of every action of a compiled schedule."""

    compiled: CompiledSchedule
    start: list[float]
    end: list[float]


def compile_schedule(schedule: Schedule) -> CompiledSchedule:
    """Resolve every action's inputs to action ids. Raises InvalidScheduleError (rule 5)
    when an input the semantics require is missing from the schedule.

    Works on the schedule's columns (:attr:`Schedule.columns`), one kind of action at a
    time: this runs once per simulation and dominates it for large pipelines."""
    c = schedule.columns
    num_stages = schedule.num_stages
    total = schedule.total_microbatches
    n = len(c.kind)
    code = KIND_CODE
    slots = c.stage * total + c.microbatch
    is_transfer, owner = _owned_transfers(schedule)
    lane_of_kind = np.array([_LANE[kind] for kind in ActionKind], dtype=np.int64)
    lane = lane_of_kind[c.kind]
    lane[is_transfer & ~owner] = MARKER
    size = num_stages * total
    index = np.arange(n, dtype=np.int64)

    def of(*kinds: ActionKind) -> np.ndarray:
        wanted = np.zeros(len(code), dtype=bool)  # a lookup: cheaper than np.isin
        wanted[[code[k] for k in kinds]] = True
        picked: np.ndarray = wanted[c.kind]
        return picked

    def table(mask: np.ndarray) -> np.ndarray:
        """slot -> id of the first action in ``mask`` (-1 if none)."""
        out = np.full(size + 1, -1, np.int64)  # the extra entry answers slot -1
        ids = index[mask][::-1]  # reversed: the first action of a slot is written last
        out[slots[ids]] = ids
        return out

    forward = of(K.F)
    backward = of(K.B, K.BW)
    fwd, bwd, inb = table(forward), table(backward), table(of(K.B))
    evict, load = table(of(K.EVICT) & owner), table(of(K.LOAD) & owner)
    dep_a = np.full(n, -1, np.int64)
    dep_b = np.full(n, -1, np.int64)

    def link(targets: np.ndarray, producer: np.ndarray, shift: int, what: str) -> None:
        """dep_a[i] = producer[slot(i) + shift] for every i in targets; all must exist."""
        ids = index[targets]
        found = producer[slots[ids] + shift]
        missing = np.flatnonzero(found < 0)
        if len(missing):
            action = _action_at(schedule, int(ids[missing[0]]))
            raise InvalidScheduleError(5, f"{action} needs {what}, which is not in the schedule")
        dep_a[ids] = found

    last_stage = num_stages - 1
    link(forward & (c.stage > 0), fwd, -total, "the previous stage's forward")
    link(backward & (c.stage == last_stage), fwd, 0, "its own forward (it computes the loss)")
    link(backward & (c.stage < last_stage), bwd, total, "the backward of the next stage")
    dep_b[backward] = load[slots[backward]]
    link(of(K.W), inb, 0, "its B")
    link(of(K.EVICT) & owner, fwd, 0, "its forward")
    link(of(K.LOAD) & owner, evict, 0, "an EVICT")
    device = c.device
    cross_a = (dep_a >= 0) & (device[np.maximum(dep_a, 0)] != device)
    cross_b = (dep_b >= 0) & (device[np.maximum(dep_b, 0)] != device)
    return CompiledSchedule(
        schedule,
        device.tolist(),
        lane.tolist(),
        dep_a.tolist(),
        cross_a.tolist(),
        dep_b.tolist(),
        cross_b.tolist(),
        c.offsets.tolist(),
    )


def _owned_transfers(schedule: Schedule) -> tuple[np.ndarray, np.ndarray]:
    """Per action: whether it is an EVICT or LOAD, and whether it is one on the evictor
    (the device of its stage) rather than the acceptor's mirror."""
    c = schedule.columns
    is_transfer = (c.kind == KIND_CODE[K.EVICT]) | (c.kind == KIND_CODE[K.LOAD])
    if not len(c.kind):
        return is_transfer, is_transfer
    stage_devices = np.array(schedule.stage_devices, dtype=np.int64)
    return is_transfer, is_transfer & (stage_devices[c.stage] == c.device)


def _action_at(schedule: Schedule, index: int) -> Action:
    offsets = schedule.columns.offsets
    device = int(np.searchsorted(offsets, index, side="right") - 1)
    return schedule.actions[device][index - int(offsets[device])]


_PASS_CODE = np.array(
    [{ActionKind.F: 0, ActionKind.B: 1, ActionKind.W: 2, ActionKind.BW: 3}.get(k, 4) for k in K],
    dtype=np.int64,
)
"""KIND_CODE -> the pass code of :attr:`CompiledSchedule.pass_codes`."""

_LANE = {
    ActionKind.F: COMPUTE,
    ActionKind.B: COMPUTE,
    ActionKind.W: COMPUTE,
    ActionKind.BW: COMPUTE,
    ActionKind.OPTIMIZER_STEP: COMPUTE,
    ActionKind.EVICT: TRANSFER,
    ActionKind.LOAD: TRANSFER,
    ActionKind.SEND_F: MARKER,
    ActionKind.RECV_F: MARKER,
    ActionKind.SEND_B: MARKER,
    ActionKind.RECV_B: MARKER,
    ActionKind.WEIGHT_VERSION: MARKER,
}


def run_timing(
    compiled: CompiledSchedule,
    duration: Sequence[float],
    *,
    comm: float = 0.0,
    transfer: float = 0.0,
    overlap_transfers: bool = True,
) -> Timing:
    """Time every action. ``duration[i]`` is compute action i's duration (ignored for the
    others); ``comm`` is added to
    every input that crosses devices; ``transfer`` is the time of one EVICT or LOAD.

    Raises InvalidScheduleError (rule 6) naming the blocked actions when the devices' orders
    wait on each other in a cycle (a deadlock)."""
    n = len(compiled.lane)
    if len(duration) != n:
        raise ValueError(f"{len(duration)} durations for {n} actions")
    if not compiled.has_transfers:
        return _time_in_order(compiled, duration, comm)
    lane = compiled.lane
    dep_a, cross_a = compiled.dep_a, compiled.cross_a
    dep_b, cross_b = compiled.dep_b, compiled.cross_b
    offsets = compiled.offsets
    num_devices = len(offsets) - 1
    dur = duration
    if len(dur) != n:
        raise ValueError(f"{len(dur)} durations for {n} actions")
    start = [0.0] * n
    end = [-1.0] * n  # -1: not yet timed
    pointer = offsets[:-1].copy()
    free = [0.0] * num_devices  # compute lane free at
    copy_free = [0.0] * num_devices
    # Pending copy fences per device: [compute actions still to pass, copy end time].
    fences: list[list[list[float]]] = [[] for _ in range(num_devices)]
    waiters: dict[int, list[int]] = {}
    work = list(range(num_devices))
    timed = 0
    while work:
        device = work.pop()
        i = pointer[device]
        stop = offsets[device + 1]
        while i < stop:
            ready = 0.0
            j = dep_a[i]
            if j >= 0:
                t = end[j]
                if t < 0:
                    waiters.setdefault(j, []).append(device)
                    break
                ready = t + comm if cross_a[i] else t
            j = dep_b[i]
            if j >= 0:
                t = end[j]
                if t < 0:
                    waiters.setdefault(j, []).append(device)
                    break
                if cross_b[i]:
                    t += comm
                if t > ready:
                    ready = t
            kind = lane[i]
            if kind == COMPUTE:
                s = free[device]
                if ready > s:
                    s = ready
                pending = fences[device]
                if pending:
                    keep = []
                    for fence in pending:
                        fence[0] -= 1
                        if fence[0] <= 0:
                            if fence[1] > s:
                                s = fence[1]
                        else:
                            keep.append(fence)
                    fences[device] = keep
                e = s + dur[i]
                free[device] = e
            elif kind == TRANSFER:
                if overlap_transfers:
                    s = max(free[device], ready, copy_free[device])
                    e = s + transfer
                    copy_free[device] = e
                    # Overlaps the next compute action; the one after it waits.
                    fences[device].append([2.0, e])
                else:
                    s = max(free[device], ready)
                    e = s + transfer
                    free[device] = e
            else:
                s = e = free[device]
            start[i] = s
            end[i] = e
            timed += 1
            woken = waiters.pop(i, None)
            if woken:
                work.extend(woken)
            i += 1
        pointer[device] = i
    if timed != n:
        raise InvalidScheduleError(6, _deadlock_message(compiled, pointer, end))
    return Timing(compiled, start, end)


def _time_in_order(compiled: CompiledSchedule, duration: Sequence[float], comm: float) -> Timing:
    """:func:`run_timing` for schedules without transfers: one pass over the precomputed
    order (each action starts when its device is free and its inputs have arrived; markers
    take no time and do not wait for data).

    Only the input ``dep_a`` is read: ``dep_b`` is the LOAD a backward waits for, and
    without transfers there is none (this loop runs once per action of every simulation,
    so the check it saves counts)."""
    n = len(compiled.lane)
    lane, device_of = compiled.lane, compiled.device_of
    dep_a, cross_a = compiled.dep_a, compiled.cross_a
    start = [0.0] * n
    end = [0.0] * n
    free = [0.0] * (len(compiled.offsets) - 1)
    for i in compiled.order:
        device = device_of[i]
        s = free[device]
        if lane[i] == COMPUTE:
            j = dep_a[i]
            if j >= 0:
                t = end[j] + comm if cross_a[i] else end[j]
                if t > s:
                    s = t
            e = s + duration[i]
            free[device] = e
            start[i] = s
            end[i] = e
        else:
            start[i] = s
            end[i] = s
    return Timing(compiled, start, end)


def _deadlock_message(compiled: CompiledSchedule, pointer: list[int], end: list[float]) -> str:
    lines = []
    for device in range(len(compiled.offsets) - 1):
        i = pointer[device]
        if i >= compiled.offsets[device + 1]:
            continue
        waiting = [
            f"{compiled.action_of[j]} on device {compiled.device_of[j]}"
            for j in compiled.inputs(i)
            if end[j] < 0
        ]
        lines.append(
            f"device {device} is stuck at {compiled.action_of[i]} waiting for "
            + (", ".join(waiting) or "nothing")
        )
    return "deadlock: the devices' action orders wait on each other: " + "; ".join(lines[:6])
