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

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import chain, repeat
from typing import NamedTuple

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


@dataclass(frozen=True, eq=False)
class CompiledSchedule:
    """Flat arrays over all actions (index = global action id, devices in order).

    Every action has at most two inputs: ``dep_a``/``dep_b`` hold the producer's id or -1, and
    ``cross_a``/``cross_b`` whether it lives on another device (so ``comm`` applies).
    ``dep_b`` is only ever a backward's LOAD: -1 everywhere in a schedule without transfers.

    What the timing derives from these once (the run order, each action's timing inputs) is
    kept on the object, so every timing after the first is one pass over the actions; equal
    therefore means the same object."""

    schedule: Schedule
    device_of: np.ndarray
    lane: np.ndarray  # COMPUTE / TRANSFER / MARKER
    dep_a: np.ndarray
    cross_a: np.ndarray
    dep_b: np.ndarray
    cross_b: np.ndarray
    offsets: np.ndarray  # first id of each device's list; offsets[-1] == number of actions

    # What only the memory curves and error messages read is derived when first asked for.

    @cached_property
    def action_of(self) -> list[Action]:
        return list(chain.from_iterable(self.schedule.actions))

    @cached_property
    def owner_of_transfer(self) -> np.ndarray:
        """Per action: an EVICT/LOAD on the evictor (False for the acceptor's mirror)."""
        return _owned_transfers(self.schedule)[1]

    def inputs(self, i: int) -> list[int]:
        return [int(j) for j in (self.dep_a[i], self.dep_b[i]) if j >= 0]

    @cached_property
    def has_transfers(self) -> bool:
        return bool((self.lane == TRANSFER).any())

    @cached_property
    def order(self) -> np.ndarray:
        """Every action id in an order the devices can run them: each device's list in its
        order, each action after its inputs. Which actions can run next never depends on
        durations, so this is computed once and every timing follows it. Raises
        InvalidScheduleError (rule 6) on a deadlock.

        Most generators' schedules run in the order :func:`_likely_order` guesses, which
        NumPy finds and checks at a fraction of the cost of following the devices' lists
        action by action; those are followed only when the guess is wrong."""
        guess = _likely_order(self)
        if _is_run_order(self, guess):
            return guess
        n = len(self.lane)
        index = np.arange(n, dtype=np.int64)
        # Only an input on another device, or later in the device's own list, can hold a
        # device up: one earlier in its list is done by the time the device gets here.
        # Every other entry reads the sentinel n, which is always done.
        block_a = np.where((self.dep_a >= 0) & (self.cross_a | (self.dep_a > index)), self.dep_a, n)
        block_b = np.where((self.dep_b >= 0) & (self.cross_b | (self.dep_b > index)), self.dep_b, n)
        blocker, second = block_a.tolist(), block_b.tolist() if (block_b < n).any() else None
        offsets = self.offsets.tolist()
        # Per action: True once done; before that None, or the device blocked on it (a
        # second one, never in the IR's dependency shapes, where an action has one consumer
        # on another device, goes to ``more``).
        state: list[bool | int | None] = [None] * n
        state.append(True)
        more: dict[int, list[int]] = {}
        pointer = offsets[:-1]
        order: list[int] = []
        append = order.append
        work = list(range(len(offsets) - 1))
        while work:
            device = work.pop()
            i = pointer[device]
            stop = offsets[device + 1]
            while i < stop:
                j = blocker[i]
                if state[j] is not True or (
                    second is not None and state[j := second[i]] is not True
                ):
                    if state[j] is None:
                        state[j] = device
                    else:
                        more.setdefault(j, []).append(device)
                    break
                woken = state[i]
                state[i] = True
                append(i)
                if woken is not None:
                    work.append(woken)
                    if more:
                        work.extend(more.pop(i, ()))
                i += 1
            pointer[device] = i
        if len(order) != n:
            end = [0.0 if s is True else -1.0 for s in state[:n]]
            raise InvalidScheduleError(6, _deadlock_message(self, pointer, end))
        return np.array(order, dtype=np.int64)

    @cached_property
    def pass_codes(self) -> tuple[np.ndarray, np.ndarray]:
        """(code, stage) per action as arrays: code 0-3 for F, B, W, BW and 4 for every
        other kind, to look durations up in one indexing step."""
        columns = self.schedule.columns
        return _PASS_CODE[columns.kind], columns.stage

    @cached_property
    def device_spans(self) -> tuple[list[int], list[tuple[int, int]], np.ndarray, np.ndarray]:
        """What a device's span and busy time are made of. Per device: the id of its first
        action that is not a zero-time marker (-1 when it has none), and the ids of its last
        compute action and its last transfer (either one twice when the device has only one
        of them, (-1, -1) with neither); and the ids of the compute actions with their
        devices.

        Under :func:`run_timing` an action on a device's compute lane ends no earlier than
        the one before it, a transfer no earlier than the transfer before it, and a marker
        when the compute lane is free: so the device's latest end is the later of those
        two last ones."""
        lane = self.lane
        device = self.device_of
        work = np.flatnonzero(lane != MARKER)
        devices = len(self.offsets) - 1
        first = np.searchsorted(device[work], np.arange(devices))
        present = np.bincount(device[work], minlength=devices) > 0
        compute = np.flatnonzero(lane == COMPUTE)
        first_work = np.where(present, work[np.minimum(first, len(work) - 1)], -1)
        last_compute = np.full(devices, -1, np.int64)
        np.maximum.at(last_compute, device[compute], compute)
        transfers = np.flatnonzero(lane == TRANSFER)
        last_transfer = np.full(devices, -1, np.int64)
        np.maximum.at(last_transfer, device[transfers], transfers)
        last = zip(
            np.where(last_compute >= 0, last_compute, last_transfer).tolist(),
            np.where(last_transfer >= 0, last_transfer, last_compute).tolist(),
            strict=True,
        )
        return first_work.tolist(), list(last), compute, device[compute]

    def steps(self, overlap_transfers: bool) -> _Steps:
        """What :func:`run_timing` reads for every action (see :class:`_Steps`), derived
        from the run order once per compiled schedule and transfer mode."""
        if not overlap_transfers and self.has_transfers:
            return self._serial_steps
        return self._overlapped_steps

    @cached_property
    def _overlapped_steps(self) -> _Steps:
        return _derive_steps(self, overlap_transfers=True)

    @cached_property
    def _serial_steps(self) -> _Steps:
        return _derive_steps(self, overlap_transfers=False)


def _likely_order(compiled: CompiledSchedule) -> np.ndarray:
    """A guess at a run order: the actions by how many compute actions come before them on
    their device (a pipeline's devices advance about in step), at equal counts forwards down
    the stages and backwards up (the waves they run in), and in list order on a device (an
    action that is not a compute action goes with the compute action after it)."""
    n = len(compiled.lane)
    index = np.arange(n, dtype=np.int64)
    device = compiled.device_of
    is_compute = compiled.lane == COMPUTE
    computes_before = np.cumsum(is_compute) - is_compute
    first = compiled.offsets[:-1][device]
    counted = computes_before - computes_before[np.minimum(first, n - 1)] if n else first
    # The compute action at or after each action on its device (itself when none).
    following = np.minimum.accumulate(np.where(is_compute, index, n)[::-1])[::-1]
    stop = compiled.offsets[1:][device]
    led_by = np.where(following < stop, following, index)
    columns = compiled.schedule.columns
    stage = columns.stage[led_by]
    wave = np.where(columns.kind[led_by] == KIND_CODE[K.F], stage, -stage)
    guess: np.ndarray = np.lexsort((index, wave, counted))
    return guess


def _is_run_order(compiled: CompiledSchedule, order: np.ndarray) -> bool:
    """Whether ``order`` has each device's list in its order and each action after its
    inputs: then the devices can run in it, and every timing in it is the same."""
    position = np.empty(len(order), np.int64)
    position[order] = np.arange(len(order))
    device = compiled.device_of
    same = device[1:] == device[:-1]
    if not (position[1:][same] > position[:-1][same]).all():
        return False
    for dep in (compiled.dep_a, compiled.dep_b):
        has = np.flatnonzero(dep >= 0)
        if not (position[dep[has]] < position[has]).all():
            return False
    return True


class _Steps(NamedTuple):
    """The timing of a compiled schedule as one pass in run order (:attr:`CompiledSchedule.order`)
    over the actions that are not markers: action ``ids[k]`` starts at the latest of
    ``end[prev[k]]``, ``end[cross[k]] + comm`` and, when ``extra[k]`` is not None, ``end[j]``
    for each j >= 0 of it and ``end[~j] + comm`` for each j < 0 of it. ``end`` has two more
    entries than there are actions: ``ZERO`` (0.0, where a device starts) and ``NEVER``
    (-inf, for no input). Markers start and end at ``end`` of their ``marker_prev``.
    ``transfers`` are the ids of EVICT/LOAD on the evictor, which last ``transfer``.

    Why these inputs are enough (each is the engine's semantics, see the module docstring):

    - ``prev`` is the device's latest earlier action on its compute lane (the compute
      actions, and the transfers when they do not overlap): when the lane is free.
    - An input on the same device comes earlier in the list (or the device deadlocks). If
      it is on the compute lane it ends no later than ``prev``, since every action on the
      lane starts after the one before it ends (durations are >= 0); the same holds on the
      copy engine for a transfer's earlier transfer. So only inputs on other devices
      (``cross``) and a backward's LOAD, produced on the copy engine, are read.
    - An overlapped transfer also waits for the copy engine: the device's latest earlier
      transfer. A compute action waits for the transfers issued between the two compute
      actions before it (its fence); those run one at a time, so the last of them ends
      last, and it alone is read.

    The maximum of the same values is the same number in any order, so the times equal
    those of following each device's list with its free times and pending fences."""

    ids: list[int]
    prev: list[int]
    cross: list[int]
    extra: list[list[int] | None] | None  # None: no action has more inputs
    marker_ids: list[int]
    marker_prev: list[int]
    transfers: list[int]


def _derive_steps(compiled: CompiledSchedule, *, overlap_transfers: bool) -> _Steps:
    """:class:`_Steps` of ``compiled`` for one transfer mode, computed with NumPy."""
    n = len(compiled.lane)
    zero, never = n, n + 1
    index = np.arange(n, dtype=np.int64)
    lane = compiled.lane
    device = compiled.device_of
    is_transfer = lane == TRANSFER
    on_lane = lane == COMPUTE
    if not overlap_transfers:
        on_lane = on_lane | is_transfer
    device_start = compiled.offsets[:-1][device]

    def latest_before(mask: np.ndarray) -> np.ndarray:
        """Per action, the id of the device's latest earlier action in ``mask`` (or -1)."""
        latest = np.maximum.accumulate(np.where(mask, index, -1))
        before = np.concatenate(([-1], latest[:-1])) if n else latest
        return np.where(before >= device_start, before, -1)

    prev = latest_before(on_lane)
    cross = np.where(compiled.cross_a, compiled.dep_a, never)
    order = compiled.order
    ids = order[lane[order] != MARKER]
    markers = np.flatnonzero(lane == MARKER)
    prev_or_zero = np.where(prev >= 0, prev, zero)
    extra: list[list[int] | None] | None = None
    if compiled.has_transfers:
        # (action, extra input) pairs; an input on another device is encoded ~j.
        pairs: list[tuple[np.ndarray, np.ndarray]] = []
        # Inputs on the same device that the compute lane (or the copy engine) does not
        # already cover: a backward's LOAD.
        for dep, crossing in (
            (compiled.dep_a, compiled.cross_a),
            (compiled.dep_b, compiled.cross_b),
        ):
            real = np.maximum(dep, 0)
            covered = on_lane[real] | (is_transfer & is_transfer[real] & overlap_transfers)
            local = np.flatnonzero((dep >= 0) & ~crossing & ~covered)
            pairs.append((local, dep[local]))
        # A LOAD on another device (not in the IR's shapes, where the backward's device
        # loads), read with ``comm``.
        crossing = np.flatnonzero(compiled.cross_b)
        pairs.append((crossing, ~compiled.dep_b[crossing]))
        if overlap_transfers:
            last_transfer = latest_before(is_transfer)
            waits = np.flatnonzero(is_transfer & (last_transfer >= 0))
            pairs.append((waits, last_transfer[waits]))
            # The fence: the last transfer issued between the two compute actions before.
            before = np.maximum(prev, 0)
            fence = np.where(prev >= 0, last_transfer[before], -1)
            fenced = np.flatnonzero((lane == COMPUTE) & (fence >= 0) & (fence > prev[before]))
            pairs.append((fenced, fence[fenced]))
        extra = _by_step(ids, pairs)
    return _Steps(
        ids.tolist(),
        prev_or_zero[ids].tolist(),
        cross[ids].tolist(),
        extra,
        markers.tolist(),
        prev_or_zero[markers].tolist(),
        np.flatnonzero(is_transfer).tolist(),
    )


def _by_step(ids: np.ndarray, pairs: list[tuple[np.ndarray, np.ndarray]]) -> list[list[int] | None]:
    """Per step (an action of ``ids``, in their order), the extra inputs the (actions,
    inputs) ``pairs`` give it, or None: only the actions that have some are visited."""
    more: dict[int, list[int]] = {}
    for actions, inputs in pairs:
        for i, j in zip(actions.tolist(), inputs.tolist(), strict=True):
            more.setdefault(i, []).append(j)
    extra: list[list[int] | None] = [None] * len(ids)
    if more:
        step = np.zeros(int(ids.max()) + 1, np.int64)
        step[ids] = np.arange(len(ids))
        for k, refs in zip(step[list(more)].tolist(), more.values(), strict=True):
            extra[k] = refs
    return extra


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
    return CompiledSchedule(schedule, device, lane, dep_a, cross_a, dep_b, cross_b, c.offsets)


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
    others); ``comm`` is added to every input that crosses devices; ``transfer`` is the time
    of one EVICT or LOAD. Durations, ``comm`` and ``transfer`` are finite and >= 0.

    Raises InvalidScheduleError (rule 6) naming the blocked actions when the devices' orders
    wait on each other in a cycle (a deadlock)."""
    n = len(compiled.lane)
    if len(duration) != n:
        raise ValueError(f"{len(duration)} durations for {n} actions")
    steps = compiled.steps(overlap_transfers)
    if steps.transfers:
        duration = list(duration)
        for i in steps.transfers:
            duration[i] = transfer
    start = [0.0] * n
    end = [0.0] * n
    end += (0.0, -math.inf)  # the entries ZERO and NEVER of _Steps
    # Transfer-free schedules have no extra inputs: a None per action, which costs a test.
    extra = repeat(None, len(steps.ids)) if steps.extra is None else steps.extra
    for i, p, x, more in zip(steps.ids, steps.prev, steps.cross, extra, strict=True):
        s = end[p]
        t = end[x] + comm
        if t > s:
            s = t
        if more is not None:
            for j in more:
                t = end[j] if j >= 0 else end[~j] + comm
                if t > s:
                    s = t
        start[i] = s
        end[i] = s + duration[i]
    for i, p in zip(steps.marker_ids, steps.marker_prev, strict=True):
        start[i] = end[i] = end[p]
    del end[n:]
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
