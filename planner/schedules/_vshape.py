"""V-shape schedules: V-Min, V-Half and V-ZB (Qi et al., "Pipeline Parallelism with
Controllable Memory", 2024).

The model is cut into 2d stages; device i holds stage i (chunk 0, on the way down) and stage
2d - 1 - i (chunk 1, on the way back), so the device with the longest-lived first stage also
holds the shortest-lived last one. Backward is split into B (input gradient) and W (weight
gradient). A schedule is built in the paper's four steps (§2):

1. *building block*: the cells (unit time slots) of one micro-batch's passes, from uniform
   offsets delta^0 between adjacent passes of the first half of the Fs and of the second half
   of the Bs, delta^1 for the other halves (§3.1: delta_F^0 = delta_B^1 = delta^0,
   delta_F^1 = delta_B^0 = delta^1, which balances memory across devices), and small offsets at
   the turns. V-Min and V-Half take the turns from Appendix F (Tables 8 and 9) for every d;
   the paper does not tabulate V-ZB's, so we take the smallest collision-free ones, as §3.1
   prescribes for same-device offsets. W passes fill the free cells after their B (App. F).
2. *repeat* the block every T = 6 cells (each device does 2 F, 2 B and 2 W per micro-batch)
   and check that no two passes of a device share a cell (a collision);
3. *squeeze*: keep each device's order, drop the idle cells (re-time with unit durations);
4. *reorder* the warm-up and cool-down greedily (Appendix C).

Table 9's columns name the two backward chains the other way round from Appendix A's
notation; we follow §3.1, whose assignment is the one that balances memory (with the table's
literal reading V-Half would hold 4/6 of 1F1B's memory on device 1 and 2/6 on device d).
"""

from __future__ import annotations

from bisect import bisect_right, insort
from collections.abc import Callable
from dataclasses import dataclass
from itertools import product

from planner.errors import ScheduleConfigError
from planner.schedules._basic import require
from planner.schedules._ir import Action, ActionKind, Schedule, v_placement
from planner.schedules._registry import ScheduleFamily, register

__all__ = ["VSHAPE_NAMES", "BlockOffsets", "block_offsets", "building_block", "vshape"]

F, B, W = ActionKind.F, ActionKind.B, ActionKind.W
REPEAT_INTERVAL = 6  # cells per micro-batch per device: 2 F + 2 B + 2 W, each one unit
VSHAPE_NAMES = ("v-min", "v-half", "v-zb")
_DELTAS = {"v-min": (1, 1), "v-half": (2, 1), "v-zb": (4, 2)}

Cell = tuple[int, int, ActionKind]  # (device, chunk, pass)


@dataclass(frozen=True)
class BlockOffsets:
    """Offsets of a V-shape building block, in cells (Appendix A's notation, 1-indexed d)."""

    delta0: int  # F_i^0 -> F_{i+1}^0 and B_i^1 -> B_{i+1}^1
    delta1: int  # F_i^1 -> F_{i-1}^1 and B_i^0 -> B_{i-1}^0
    turn_forward: int  # delta(F_d^0, F_d^1)
    turn_loss: int  # delta(F_1^1, B_1^1)
    turn_backward: int  # delta(B_d^1, B_d^0)
    source: str


def block_offsets(name: str, num_devices: int) -> BlockOffsets:
    """The building block's offsets for ``name`` on d devices (Appendix F, Tables 8 and 9)."""
    d = num_devices
    delta0, delta1 = _DELTAS[name]
    if name == "v-min":
        return BlockOffsets(delta0, delta1, 1, 3 if d % 3 == 0 else 1, 1, "Table 8")
    if name == "v-half":
        return BlockOffsets(delta0, delta1, 2, 4 if d % 2 == 0 else 1, 1, "Table 9")
    for forward, loss, backward in sorted(
        product(range(1, REPEAT_INTERVAL), repeat=3), key=lambda t: (sum(t), t)
    ):
        offsets = BlockOffsets(
            delta0, delta1, forward, loss, backward, "smallest collision-free turns"
        )
        if not _collisions(building_block(offsets, d), d):
            return offsets
    raise ScheduleConfigError(f"{name}: no collision-free building block for {d} devices")


def building_block(offsets: BlockOffsets, num_devices: int) -> dict[Cell, int]:
    """Cell of every pass of one micro-batch (devices 0-indexed here)."""
    d = num_devices
    cells: dict[Cell, int] = {}
    t = 0
    for i in range(d):
        cells[(i, 0, F)] = t
        t += offsets.delta0 if i < d - 1 else offsets.turn_forward
    for i in reversed(range(d)):
        cells[(i, 1, F)] = t
        t += offsets.delta1 if i > 0 else offsets.turn_loss
    for i in range(d):
        cells[(i, 1, B)] = t
        t += offsets.delta0 if i < d - 1 else offsets.turn_backward
    for i in reversed(range(d)):
        cells[(i, 0, B)] = t
        if i > 0:
            t += offsets.delta1
    # W passes fill the first free cells (mod T) after their B, earliest B first.
    for i in range(d):
        used = {cells[(i, c, p)] % REPEAT_INTERVAL for c in (0, 1) for p in (F, B)}
        for chunk in sorted((0, 1), key=lambda c: cells[(i, c, B)]):
            t = cells[(i, chunk, B)] + 1
            while t % REPEAT_INTERVAL in used:
                t += 1
            cells[(i, chunk, W)] = t
            used.add(t % REPEAT_INTERVAL)
    return cells


def _collisions(cells: dict[Cell, int], num_devices: int) -> list[str]:
    """Passes of one device that would share a cell once the block repeats every T cells."""
    found = []
    for i in range(num_devices):
        seen: dict[int, Cell] = {}
        for (device, chunk, kind), t in cells.items():
            if device != i:
                continue
            residue = t % REPEAT_INTERVAL
            if residue in seen:
                other = seen[residue]
                found.append(
                    f"device {i}: {kind.value} of chunk {chunk} and "
                    f"{other[2].value} of chunk {other[1]}"
                )
            seen[residue] = (device, chunk, kind)
    return found


def _stage(device: int, chunk: int, d: int) -> int:
    return device if chunk == 0 else 2 * d - 1 - device


def vshape(name: str, num_devices: int, num_microbatches: int, reorder: bool = True) -> Schedule:
    """Build V-Min, V-Half or V-ZB for d devices and m micro-batches (see module docstring).
    ``reorder=False`` stops after squeezing (step 3), to see what Appendix C's reordering buys."""
    d, m = num_devices, num_microbatches
    require(name in _DELTAS, f"unknown V-shape schedule {name!r}; choose from {VSHAPE_NAMES}")
    require(d >= 2, f"{name}: needs at least 2 devices (2 stages each), got {d}")
    require(m >= 1, f"{name}: the number of micro-batches must be at least 1, got {m}")
    offsets = block_offsets(name, d)
    cells = building_block(offsets, d)
    clashes = _collisions(cells, d)
    if clashes:
        raise ScheduleConfigError(f"{name}: building block collides when repeated: {clashes[0]}")
    # Repeat: micro-batch k's block starts k * T cells later; order each device by cell.
    placed: list[list[tuple[int, Action]]] = [[] for _ in range(d)]
    for k in range(m):
        for (device, chunk, kind), t in cells.items():
            action = Action(kind, _stage(device, chunk, d), k, chunk)
            placed[device].append((t + k * REPEAT_INTERVAL, action))
    # Cells of one device are distinct (no collision), so tuples sort by cell alone.
    orders = [[a for _, a in sorted(row)] for row in placed]
    stage_devices = v_placement(d)
    if reorder:
        orders = _squeeze_and_reorder(orders, 2 * d, m)
    rows = tuple(
        tuple(row)
        + tuple(Action(ActionKind.OPTIMIZER_STEP, _stage(i, c, d), m - 1, c) for c in (0, 1))
        for i, row in enumerate(orders)
    )
    lifespan = max(cells[(i, c, W)] - cells[(i, c, F)] + 1 for i in range(d) for c in (0, 1))
    meta = {
        "offsets": {
            "delta0": offsets.delta0,
            "delta1": offsets.delta1,
            "turn_forward": offsets.turn_forward,
            "turn_loss": offsets.turn_loss,
            "turn_backward": offsets.turn_backward,
            "source": offsets.source,
        },
        "repeat_interval": REPEAT_INTERVAL,
        "max_stage_lifespan_cells": lifespan,
    }
    return Schedule(name, d, m, stage_devices, rows, split_backward=True, meta=meta)


# --------------------------------------------------------------------------- squeeze/reorder
@dataclass
class _Squeezed:
    """Unit-time cells of a set of device orders: ``times[d][k]`` is the cell of
    ``orders[d][k]``; ``start[kind][stage * m + microbatch]`` the cell of that pass (-1 if
    it is not in the orders), for kind 0 = F, 1 = B, 2 = W."""

    times: list[list[int]]
    start: list[list[int]]


_KIND_CODE = {F: 0, B: 1, W: 2}


def _unit_times(orders: list[list[Action]], num_stages: int, m: int) -> _Squeezed:
    """Squeeze: the cell of every pass when each device runs its order as early as its
    inputs allow, every pass one unit long.

    This is the timing engine's semantics (:mod:`planner.schedules._engine`) with unit
    durations and no communication time, specialised to F/B/W passes: a generator runs it
    twice per schedule, on every shape the planner counts, and skipping the general
    compilation makes it several times faster (a test checks it against the engine). Each
    pass has at most one consumer on another device, so one waiting device per pass."""
    last = num_stages - 1
    size = num_stages * m
    start = [[-1] * size for _ in range(3)]
    end_f, end_b = [-1] * size, [-1] * size
    wait_f, wait_b = [-1] * size, [-1] * size
    times = [[0] * len(order) for order in orders]
    position = [0] * len(orders)
    free = [0] * len(orders)
    work = list(range(len(orders)))
    while work:
        device = work.pop()
        order, row = orders[device], times[device]
        i, t, n = position[device], free[device], len(order)
        while i < n:
            action = order[i]
            kind, stage = action.kind, action.stage
            slot = stage * m + action.microbatch
            if kind is F:
                if stage > 0:
                    ready = end_f[slot - m]
                    if ready < 0:
                        wait_f[slot - m] = device
                        break
                    t = max(t, ready)
            elif kind is B:
                if stage == last:
                    ready = end_f[slot]
                    waits = wait_f
                    needed = slot
                else:
                    needed = slot + m
                    ready = end_b[needed]
                    waits = wait_b
                if ready < 0:
                    waits[needed] = device
                    break
                t = max(t, ready)
            else:  # W follows its own B on this device
                t = max(t, end_b[slot])
            row[i] = t
            start[_KIND_CODE[kind]][slot] = t
            t += 1
            if kind is F:
                end_f[slot] = t
                woken = wait_f[slot]
            elif kind is B:
                end_b[slot] = t
                woken = wait_b[slot]
            else:
                woken = -1
            if woken >= 0:
                work.append(woken)
            i += 1
        position[device], free[device] = i, t
    if any(i < len(order) for i, order in zip(position, orders, strict=True)):
        raise ScheduleConfigError("V-shape squeeze: the device orders deadlock")  # a bug
    return _Squeezed(times, start)


def _squeeze_and_reorder(orders: list[list[Action]], num_stages: int, m: int) -> list[list[Action]]:
    squeezed = _unit_times(orders, num_stages, m)
    orders = _fill_warmup(orders, squeezed, m)
    return _reorder_cooldown(orders, num_stages, m)


def _fill_warmup(orders: list[list[Action]], squeezed: _Squeezed, m: int) -> list[list[Action]]:
    """Appendix C, warm-up: scan cells left to right; a vacant cell before the device's first
    B is filled with the first later forward of that device whose inputs are ready by then,
    leaving every other pass where it is. A forward moved earlier keeps its activations alive
    longer, so a move is taken only if the device's saved-activation count stays within the
    peak the squeezed schedule already has: the warm-up reorder buys throughput, never memory
    (the paper's premise: "the peak of memory happens in the stable phase")."""
    times = squeezed.times
    f_at, w_at = list(squeezed.start[0]), squeezed.start[2]
    cell_of: list[dict[int, Action]] = []
    alive: list[list[int]] = []  # saved activations during each cell, per device
    first_b: list[int] = []
    for order, device_times in zip(orders, times, strict=True):
        cell_of.append(dict(zip(device_times, order, strict=True)))
        horizon = device_times[-1] + 1
        level = [0] * (horizon + 1)
        first = horizon
        for action, t in zip(order, device_times, strict=True):
            if action.kind is F:
                level[t] += 1
                level[w_at[action.stage * m + action.microbatch] + 1] -= 1
            elif action.kind is B and t < first:
                first = t
        running = 0
        for t in range(horizon + 1):
            running += level[t]
            level[t] = running
        alive.append(level)
        first_b.append(first)
    peak = [max(level) for level in alive]
    f_cells = [
        [t for t, a in zip(device_times, order, strict=True) if a.kind is F]
        for order, device_times in zip(orders, times, strict=True)
    ]
    for t in range(max(first_b)):
        for device, cells in enumerate(cell_of):
            if t >= first_b[device] or t in cells:
                continue
            level = alive[device]
            full = peak[device]
            forward_cells = f_cells[device]
            index = bisect_right(forward_cells, t)
            # Candidates in cell order. The level over [t, later) only grows with ``later``:
            # once a move would exceed the peak, every later candidate would too. A stage's
            # forwards run in micro-batch order on every device, so once one forward of a
            # stage is not ready, no later one of that stage is: when both of the device's
            # stages are stuck, nothing later can move here.
            scanned = t
            stuck: set[int] = set()
            while index < len(forward_cells) and len(stuck) < 2:
                later = forward_cells[index]
                while scanned < later and level[scanned] < full:
                    scanned += 1
                if scanned < later:
                    break
                action = cells[later]
                if action.stage in stuck:
                    index += 1
                    continue
                slot = action.stage * m + action.microbatch
                if action.stage == 0 or f_at[slot - m] + 1 <= t:
                    for c in range(t, later):
                        level[c] += 1
                    del cells[later]
                    cells[t] = action
                    del forward_cells[index]
                    insort(forward_cells, t)
                    f_at[slot] = t
                    break
                stuck.add(action.stage)
                index += 1
    return [[cells[t] for t in sorted(cells)] for cells in cell_of]


def _reorder_cooldown(orders: list[list[Action]], num_stages: int, m: int) -> list[list[Action]]:
    """Appendix C, cool-down: drop the W passes after each device's last F, squeeze, put the
    dropped Ws into the idle cells that remain (each after its B), the rest at the end."""
    kept: list[list[Action]] = []
    dropped: list[list[Action]] = []
    for order in orders:
        last_f = max(k for k, a in enumerate(order) if a.kind is F)
        kept.append(order[: last_f + 1] + [a for a in order[last_f + 1 :] if a.kind is not W])
        dropped.append([a for a in order[last_f + 1 :] if a.kind is W])
    squeezed = _unit_times(kept, num_stages, m)
    b_at = squeezed.start[1]
    result = []
    for order, device_times, ws in zip(kept, squeezed.times, dropped, strict=True):
        cells = dict(zip(device_times, order, strict=True))
        waiting = sorted(ws, key=lambda a: b_at[a.stage * m + a.microbatch])
        horizon = max(cells) if cells else 0
        for t in range(horizon):
            if t in cells or not waiting:
                continue
            if b_at[waiting[0].stage * m + waiting[0].microbatch] + 1 <= t:
                cells[t] = waiting.pop(0)
        result.append([cells[t] for t in sorted(cells)] + waiting)
    return result


def _register(
    name: str, title: str, idle: float, saturation: Callable[[int], int], memory: str
) -> None:
    register(
        ScheduleFamily(
            name=name,
            title=title,
            citation='Qi et al., "Pipeline Parallelism with Controllable Memory", 2024',
            build=lambda p, m, _: vshape(name, p, m),
            placement="v",
            split_backward=True,
            runtimes=frozenset({"stagewright", "torch"}),
            min_devices=2,
            idle_vs_1f1b=idle,
            inflight_saturation=saturation,
            memory_rule=memory,
            # Measured on one core: 2.7 us per action up to 32 devices, then 4.6, 10, 31 and
            # 102 us at 64, 128, 256 and 512 (planner.schedules._work bounds it).
            generation_growth_devices=64,
        )
    )


# Idle time relative to 1F1B's: Table 1 (V-Min 4d/6d, V-Half 3d/6d, V-ZB about 0, counted
# here as one stage time in six). In-flight profiles fill after p + 1 micro-batches (V-Min,
# V-Half) or 2p (V-ZB).
_register("v-min", "V-Min", 4 / 6, lambda p: p + 1, "about 1/3 of 1F1B's peak (Table 1)")
_register("v-half", "V-Half", 3 / 6, lambda p: p + 1, "about 1/2 of 1F1B's peak (Table 1)")
_register("v-zb", "V-ZB", 1 / 6, lambda p: 2 * p, "1F1B's peak, about zero bubble (Table 1)")
