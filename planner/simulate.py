"""The pipeline simulator: prices a schedule exactly.

Given per-stage F, B and W durations, a point-to-point latency and a BPipe transfer time, it
times every action of a schedule (the engine's semantics, see
:mod:`planner.schedules._engine`), and follows each device's saved activations through time.

Memory model (what a "saved activation" is): a forward of stage s allocates
``activation[s]`` at its start; a fused BW frees it at its end, a split backward frees it at
the end of W (B keeps what W needs). BPipe's EVICT and LOAD move it between evictor and
acceptor as the executor does (:mod:`executor.transfers`): the receiving side allocates when
it issues its side of the copy (once the compute action before it has ended), and the sending
side keeps its copy until its fence, the start of the second compute action after an EVICT
and of the next one after the acceptor's LOAD, so copies in flight count on both sides. That
makes every device's peak a property of its action order, as the planner counts it
(:mod:`planner.schedules._inflight`). By default ``activation[s] = 1 / num_stages``, which
makes the numbers "micro-batches of the whole model": 1F1B's stage 0 peaks at 1.0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from planner.errors import SimulationError
from planner.schedules import Action, ActionKind, Schedule
from planner.schedules._engine import (
    COMPUTE,
    CompiledSchedule,
    compile_schedule,
    run_timing,
)

__all__ = ["Durations", "SimulationResult", "simulate"]

K = ActionKind


@dataclass(frozen=True)
class Durations:
    """Time of each pass, per stage (a scalar applies to every stage), in any one unit.

    ``backward`` and ``weight`` are B (input gradient) and W (weight gradient); a schedule
    without the split runs BW = backward + weight. ``comm`` is added to every input that
    crosses devices; ``transfer`` is one BPipe EVICT or LOAD; ``overlap_transfers=False``
    makes transfers block the device instead of running beside compute; ``optimizer`` is one
    OPTIMIZER_STEP."""

    forward: float | Sequence[float]
    backward: float | Sequence[float]
    weight: float | Sequence[float] = 0.0
    comm: float = 0.0
    transfer: float = 0.0
    overlap_transfers: bool = True
    optimizer: float = 0.0

    def per_stage(self, num_stages: int) -> tuple[list[float], list[float], list[float]]:
        out = []
        for label, value in (
            ("forward", self.forward),
            ("backward", self.backward),
            ("weight", self.weight),
        ):
            values = (
                [float(value)] * num_stages
                if isinstance(value, (int, float))
                else [float(v) for v in value]
            )
            if len(values) != num_stages:
                raise SimulationError(
                    f"{label} durations: got {len(values)} values for {num_stages} stages; give "
                    f"one number for all stages or exactly one per stage"
                )
            for v in values:
                if not math.isfinite(v) or v < 0:
                    raise SimulationError(f"{label} durations must be finite and >= 0, got {v}")
            out.append(values)
        for label, value in (
            ("comm", self.comm),
            ("transfer", self.transfer),
            ("optimizer", self.optimizer),
        ):
            if not math.isfinite(value) or value < 0:
                raise SimulationError(f"{label} time must be finite and >= 0, got {value}")
        return out[0], out[1], out[2]


@dataclass(frozen=True)
class DeviceStats:
    """``start`` of the device's first action, ``end`` of its last, ``busy`` compute time."""

    start: float
    end: float
    busy: float


@dataclass(frozen=True)
class SimulationResult:
    """Everything the simulator learned about one schedule under one set of durations.

    ``start``/``end`` are indexed like :meth:`Schedule.iter_actions` (devices in order, each
    list in order). ``memory[d]`` is device d's saved-activation curve as (time, level after
    the change) steps; ``peak_activation[d]`` its maximum."""

    schedule: Schedule
    start: list[float]
    end: list[float]
    makespan: float
    devices: list[DeviceStats]
    memory: list[list[tuple[float, float]]]
    peak_activation: list[float]

    @property
    def bubble_fraction(self) -> float:
        """1 - busiest device's compute time / makespan (the contract's definition)."""
        if self.makespan <= 0:
            return 0.0
        return 1.0 - max(d.busy for d in self.devices) / self.makespan

    def timeline(self) -> list[tuple[int, Action, float, float]]:
        """(device, action, start, end) for every action, in schedule order."""
        return [
            (device, action, self.start[i], self.end[i])
            for i, (device, _, action) in enumerate(self.schedule.iter_actions())
        ]

    def to_contract(self) -> dict[str, object]:
        """The JSON of ``stagewright simulate --json``."""
        return {
            "makespan": self.makespan,
            "bubble_fraction": self.bubble_fraction,
            "peak_activation_fraction": self.peak_activation,
            "devices": [{"start": d.start, "end": d.end, "busy": d.busy} for d in self.devices],
        }


def simulate(
    schedule: Schedule | CompiledSchedule,
    durations: Durations,
    activation: Sequence[float] | None = None,
    *,
    track_memory: bool = True,
) -> SimulationResult:
    """Time ``schedule`` under ``durations`` and track saved activations.

    ``schedule`` may come already compiled (:func:`compile_schedule`), for callers that time
    one schedule under many durations. ``activation[s]`` is the saved-activation size of one
    micro-batch on stage s in any unit (default ``1 / num_stages``: fractions of the whole
    model's). ``track_memory=False`` skips the memory curves (``memory`` and
    ``peak_activation`` are then empty) for callers that want the timing only. Raises
    SimulationError for bad durations and InvalidScheduleError if the schedule cannot run
    (missing inputs, deadlock)."""
    compiled = schedule if isinstance(schedule, CompiledSchedule) else compile_schedule(schedule)
    num_stages = compiled.schedule.num_stages
    fwd, bwd, wgt = durations.per_stage(num_stages)
    sizes = (
        [1.0 / num_stages] * num_stages if activation is None else [float(a) for a in activation]
    )
    if len(sizes) != num_stages:
        raise SimulationError(f"activation sizes: got {len(sizes)} values for {num_stages} stages")
    # Rows in the order of CompiledSchedule.pass_codes: F, B, W, BW, anything else.
    table = np.array(
        [
            fwd,
            bwd,
            wgt,
            [b + w for b, w in zip(bwd, wgt, strict=True)],
            [durations.optimizer] * num_stages,
        ],
        dtype=np.float64,
    )
    codes, stages = compiled.pass_codes
    duration_array = table[codes, stages]
    duration = duration_array.tolist()
    timing = run_timing(
        compiled,
        duration,
        comm=durations.comm,
        transfer=durations.transfer,
        overlap_transfers=durations.overlap_transfers,
    )
    start, end = timing.start, timing.end
    devices = _device_stats(compiled, start, end, duration_array)
    makespan = max((d.end for d in devices), default=0.0)
    memory = _memory_curves(compiled, start, end, sizes) if track_memory else []
    peaks = [max((level for _, level in curve), default=0.0) for curve in memory]
    return SimulationResult(compiled.schedule, start, end, makespan, devices, memory, peaks)


def _device_stats(
    compiled: CompiledSchedule, start: list[float], end: list[float], duration: np.ndarray
) -> list[DeviceStats]:
    """Span and busy time per device. Zero-time markers (SEND/RECV, version switches, the
    acceptor's mirrors) are bookkeeping, not work, and do not open or close a device's span.
    Busy time is the sum of the device's compute durations.

    The span ends at the later end of the device's last compute action and last transfer
    (:attr:`CompiledSchedule.device_spans` says why that is the latest end of its list);
    durations are >= 0 here, as that needs."""
    first, last, compute, compute_device = compiled.device_spans
    devices = len(first)
    busy = np.bincount(compute_device, weights=duration[compute], minlength=devices).tolist()
    return [
        DeviceStats(start[i], max(end[last[d][0]], end[last[d][1]]), busy[d])
        if i >= 0
        else DeviceStats(0.0, 0.0, 0.0)
        for d, i in enumerate(first)
    ]


def _memory_curves(
    compiled: CompiledSchedule, start: list[float], end: list[float], sizes: list[float]
) -> list[list[tuple[float, float]]]:
    """Each device's saved-activation level over time, as (time, level) after each change.
    At equal times changes apply in the order the device reaches them in its list (a W's free
    before the next action's allocation; a transfer issued after a W but before the next
    compute action's fence), which is what makes the peak the order's own.

    Vectorised with NumPy: one event array for all devices, sorted by (device, time,
    position in the list), and a cumulative sum restarted at each device."""
    columns = compiled.schedule.columns
    kinds = _EVENT_CODE[columns.kind]
    stage = columns.stage
    device = columns.device
    t_start = np.asarray(start, dtype=np.float64)
    t_end = np.asarray(end, dtype=np.float64)
    size = np.asarray(sizes, dtype=np.float64)[stage]
    owned = np.asarray(compiled.owner_of_transfer, dtype=bool)
    evict = kinds == _EVICT
    load = kinds == _LOAD
    alloc = np.flatnonzero(kinds == _ALLOC)
    free = np.flatnonzero(kinds == _FREE)
    # (action, time, position: 2 i at action i, 2 i + 1 just after it, signed size)
    parts = [
        (alloc, t_start[alloc], 2 * alloc, size[alloc]),
        (free, t_end[free], 2 * free + 1, -size[free]),
    ]
    if evict.any() or load.any():
        clock = _ComputeClock(compiled, t_start, t_end)
        # Allocated when issued: the evictor's LOAD (its receive buffer), the acceptor's EVICT.
        taken = np.flatnonzero((owned & load) | (~owned & evict))
        parts.append((taken, clock.issued(taken), 2 * taken, size[taken]))
        # The evictor's copy is dropped at the start of the second compute action after its
        # EVICT (the fence); the acceptor's once the LOAD's send has gone, before its next one.
        for mask, nth in ((owned & evict, 2), (~owned & load, 1)):
            ids = np.flatnonzero(mask)
            at, position = clock.compute_start(ids, nth)
            parts.append((ids, at, 2 * position - 1, -size[ids]))
    ev_device = device[np.concatenate([p[0] for p in parts])]
    ev_time = np.concatenate([p[1] for p in parts])
    ev_order = np.concatenate([p[2] for p in parts])
    ev_delta = np.concatenate([p[3] for p in parts])
    order = np.lexsort((ev_order, ev_time, ev_device))
    ev_device, ev_time, ev_delta = ev_device[order], ev_time[order], ev_delta[order]
    num_devices = len(compiled.offsets) - 1
    bounds = np.searchsorted(ev_device, np.arange(num_devices + 1))
    running = np.cumsum(ev_delta)
    curves = []
    for d in range(num_devices):
        lo, hi = int(bounds[d]), int(bounds[d + 1])
        base = running[lo - 1] if lo > 0 else 0.0
        # Sizes are fractions like 1/3: snap float dust so that equal peaks compare equal.
        levels = np.round(running[lo:hi] - base, 9)
        curves.append(list(zip(ev_time[lo:hi].tolist(), levels.tolist(), strict=True)))
    return curves


class _ComputeClock:
    """When a device's transfers take and give back memory, as the executor does it
    (:mod:`executor.transfers`): a transfer is issued when the compute action before it has
    ended, and a copy is released when a later compute action starts (its fence)."""

    def __init__(self, compiled: CompiledSchedule, start: np.ndarray, end: np.ndarray) -> None:
        is_compute = np.asarray(compiled.lane, dtype=np.int8) == COMPUTE
        self._ids = np.flatnonzero(is_compute)  # compute actions, device by device, in order
        counted = np.concatenate(([0], np.cumsum(is_compute)))
        self._before = counted[:-1]  # compute actions before each action (all devices)
        offsets = np.asarray(compiled.offsets, dtype=np.int64)
        device = np.asarray(compiled.device_of, dtype=np.int64)
        self._first = counted[offsets[:-1]][device]  # the device's first compute action
        self._stop = counted[offsets[1:]][device]  # one past the device's last
        self._start, self._end = start, end
        # A device with nothing after the transfer releases it when its last action ends.
        last = np.zeros(len(offsets) - 1)
        np.maximum.at(last, device, end)
        self._last = last[device]
        self._past_end = offsets[1:][device]

    def issued(self, ids: np.ndarray) -> np.ndarray:
        """The end of the compute action before each of ``ids`` on its device (0 if none)."""
        prev = self._before[ids] - 1
        has = prev >= self._first[ids]
        return np.where(has, self._end[self._ids[np.where(has, prev, 0)]], 0.0)

    def compute_start(self, ids: np.ndarray, nth: int) -> tuple[np.ndarray, np.ndarray]:
        """The start of the ``nth`` compute action after each of ``ids`` on its device, and
        that action's index (the device's last moment and one past the list if none)."""
        target = self._before[ids] + nth - 1
        has = target < self._stop[ids]
        index = self._ids[np.where(has, target, 0)] if len(self._ids) else target
        return (
            np.where(has, self._start[index], self._last[ids]),
            np.where(has, index, self._past_end[ids]),
        )


_ALLOC, _FREE, _EVICT, _LOAD, _OTHER = 1, 2, 3, 4, 0
_EVENT_CODE = np.array(
    [
        {K.F: _ALLOC, K.W: _FREE, K.BW: _FREE, K.EVICT: _EVICT, K.LOAD: _LOAD}.get(k, _OTHER)
        for k in K
    ],
    dtype=np.int8,
)
"""KIND_CODE (the enum's order) -> the memory event of an action of that kind."""
