"""1F1B-V: the V-shape placement without a B/W split (Qi et al., "Pipeline Parallelism with
Controllable Memory", 2024, Appendix H, Figures 16(a) and 17(a)).

The paper's framework (§2) applied to 1F1B's building block. Device i holds stage i (chunk 0)
and stage 2d - 1 - i (chunk 1), as in V-Min / V-Half / V-ZB, but a stage's backward is one
pass (input and weight gradients together) of two cells, a forward one: each device runs
2 F + 2 BW = 6 cells per micro-batch, so the block repeats every T = 6 cells.

1. *Building block.* Forwards go down chunk 0 and back up chunk 1 one cell apart, the
   backwards down chunk 1 and up chunk 0 two cells apart. That tight block collides with
   itself once repeated (two passes of a device in one cell mod 6), so each pass, in
   dependency order, takes the earliest cell its input allows that is free mod 6 on its
   device: the smallest collision-free offsets, as §3.1 prescribes. The forwards stay one
   cell apart; the backwards two, with three more after every third device. A device's two
   lifespans then add up to about 8d cells; one micro-batch starts every 6, so a device holds
   about 8d/6 stage activations, 4d/3 of 1F1B's 2d: the paper's "asymptotically 2/3 of 1F1B"
   (for small d a few 1/d more), the same on every device.
2. *Repeat* the block every 6 cells for m micro-batches, dropping nothing.
3. *Compact* (the warm-up and cool-down reordering of Appendix C, for passes that take two
   cells): scanning the cells left to right, every pass moves to the earliest vacant cell
   (two adjacent ones for a backward) after its inputs are done and after the same pass of
   the previous micro-batch, a forward only as far back as the device stays below the
   schedule's peak of saved activations; the stable phase has no vacant cells, so only the
   warm-up and cool-down change. Each device then runs its passes in cell order.

Passes use :mod:`planner.schedules._vframe`'s codes and ids (``F0 F1 B1 B0 W0 W1``, id
``(i * m + k) * 6 + code``): a BW is its B cell and the W cell right after it, which the
compaction keeps together (a W's earliest cell is right after its B, which moved to two vacant
cells), so each pair becomes one BW action.
"""

from __future__ import annotations

from bisect import bisect_left, insort

import numpy as np

from planner.errors import ScheduleConfigError
from planner.schedules._basic import require
from planner.schedules._ir import Schedule
from planner.schedules._registry import ScheduleFamily, register
from planner.schedules._vcolumns import to_schedule
from planner.schedules._vframe import (
    B0,
    B1,
    F0,
    F1,
    PASSES,
    REPEAT_INTERVAL,
    W0,
    W1,
    Slack,
    stable_peak,
)

__all__ = ["v1f1b", "v1f1b_block"]

NAME = "1f1b-v"
_BACKWARD_CELLS = 2  # a BW is a B cell and a W cell, one unit each as in the framework
_W_OF_B = {B0: W0, B1: W1}


def loss_turn(num_devices: int) -> int:
    """Cells from the last stage's forward to its backward in the block: 1, or 4 when 3
    divides d (module docstring, step 1)."""
    return 4 if num_devices % 3 == 0 else 1


def v1f1b_block(num_devices: int, turn: int | None = None) -> list[list[int]]:
    """Per device, the cell of each pass code (``F0 F1 B1 B0 W0 W1``) of micro-batch 0, each
    W one cell after its B: every pass at the earliest cell its input allows that no pass
    of its device holds mod T, the loss's backward ``turn`` cells after its forward at the
    earliest (default :func:`loss_turn`; step 1 of the module docstring)."""
    d = num_devices
    turn = loss_turn(d) if turn is None else turn
    taken: list[set[int]] = [set() for _ in range(d)]

    def place(device: int, earliest: int, width: int) -> int:
        for cell in range(earliest, earliest + REPEAT_INTERVAL):
            if all((cell + k) % REPEAT_INTERVAL not in taken[device] for k in range(width)):
                taken[device].update((cell + k) % REPEAT_INTERVAL for k in range(width))
                return cell
        raise ScheduleConfigError(
            f"{NAME}: no collision-free building block for {d} devices with a loss turn of "
            f"{turn} cells"
        )

    f0, f1, b1, b0 = [0] * d, [0] * d, [0] * d, [0] * d
    for i in range(d):  # chunk 0 forward, down
        f0[i] = place(i, f0[i - 1] + 1 if i else 0, 1)
    for i in reversed(range(d)):  # chunk 1 forward, back up; it turns on device d - 1
        f1[i] = place(i, (f1[i + 1] if i < d - 1 else f0[i]) + 1, 1)
    for i in range(d):  # chunk 1 backward from the loss on device 0, down
        b1[i] = place(i, b1[i - 1] + _BACKWARD_CELLS if i else f1[0] + turn, _BACKWARD_CELLS)
    for i in reversed(range(d)):  # chunk 0 backward, back up; it turns on device d - 1
        earlier = b0[i + 1] if i < d - 1 else b1[i]
        b0[i] = place(i, earlier + _BACKWARD_CELLS, _BACKWARD_CELLS)
    rows = []
    for i in range(d):
        row = [0] * PASSES
        row[F0], row[F1], row[B1], row[B0] = f0[i], f1[i], b1[i], b0[i]
        row[W1], row[W0] = b1[i] + 1, b0[i] + 1
        rows.append(row)
    return rows


def _inputs(g: np.ndarray, d: int, m: int) -> np.ndarray:
    """Per pass id in ``g``, the pass whose end it waits for (-1: none); a backward waits
    for the whole BW before it, i.e. its W cell."""
    j = g % PASSES
    row = m * PASSES
    base = g - j  # the id of pass code 0 of the same micro-batch and device
    top, bottom = g < row, g >= (d - 1) * row  # device 0, device d - 1
    out = base + W1 - B1 + B0  # a W waits for its B (W0 after B0, W1 after B1)
    out = np.where(j == W1, base + B1, out)
    out = np.where(j == F0, np.where(top, -1, g - row), out)
    out = np.where(j == F1, np.where(bottom, base + F0, g + row), out)
    out = np.where(j == B1, np.where(top, base + F1, g - row - B1 + W1), out)
    return np.where(j == B0, np.where(bottom, base + W1, g + row - B0 + W0), out)


def compact(cells: list[list[int]], num_microbatches: int) -> list[list[int]]:
    """Steps 2 and 3 of the module docstring: each device's pass ids in cell order."""
    d, m, T = len(cells), num_microbatches, REPEAT_INTERVAL
    per_device = m * PASSES
    block = np.asarray(cells, dtype=np.int64)  # (d, PASSES)
    grid = block[:, None, :] + T * np.arange(m, dtype=np.int64)[None, :, None]
    at = grid.reshape(-1).tolist()  # cell of every pass id
    # Per device: the vacant cells inside its span (sorted), and the saved activations
    # during each cell (a forward's from its cell through its W's cell).
    vacant: list[list[int]] = []
    level: list[np.ndarray] = []
    for i in range(d):
        mine = grid[i]
        low, high = int(mine.min()), int(mine.max())
        free = np.ones(high + 2, dtype=bool)
        free[mine.reshape(-1)] = False
        free[:low] = False
        vacant.append(np.flatnonzero(free[:high]).tolist())
        delta = np.zeros(high + 2, dtype=np.int64)
        for f, w in ((F0, W0), (F1, W1)):
            np.add.at(delta, mine[:, f], 1)
            np.add.at(delta, mine[:, w] + 1, -1)
        level.append(np.cumsum(delta))
    peak = max(int(alive.max()) for alive in level)
    slack = [Slack((peak - alive).tolist(), peak) for alive in level]
    # F and B passes (a W moves with its B) by cell, devices in order within a cell, with
    # what the scan needs of each: its device, its input, the same pass of the previous
    # micro-batch (-1 for micro-batch 0), whether it is a forward, and its W.
    ids = np.arange(d * per_device, dtype=np.int64)
    movable = ids[ids % PASSES < W0]
    visit = movable[np.lexsort((movable // per_device, grid.reshape(-1)[movable]))]
    code = visit % PASSES
    scan = zip(
        visit.tolist(),
        (visit // per_device).tolist(),
        _inputs(visit, d, m).tolist(),
        np.where((visit // PASSES) % m > 0, visit - PASSES, -1).tolist(),
        (code <= F1).tolist(),
        (visit - code + np.where(code == B0, W0, W1)).tolist(),
        strict=True,
    )
    for g, device, before, previous, forward, w in scan:
        holes = vacant[device]
        t = at[g]
        if not holes or holes[0] >= t:
            continue  # nothing earlier to move into
        # After the same pass of the previous micro-batch and after its input is done.
        earliest = at[previous] + 1 if previous >= 0 else 0
        if holes[-1] < earliest:
            continue
        if before >= 0 and at[before] + 1 > earliest:
            earliest = at[before] + 1
        room = slack[device]
        if forward:
            # A forward goes back only while the device stays below the peak: not past
            # the last full cell before it.
            full = room.last_full(earliest, t)
            if full >= 0:
                earliest = full + 1
        index = bisect_left(holes, earliest)
        target = -1
        while index < len(holes) and holes[index] < t:
            cell = holes[index]
            if forward or (index + 1 < len(holes) and holes[index + 1] == cell + 1):
                target = cell
                break
            index += 1
        if target < 0:
            continue
        if forward:
            del holes[index]
            insort(holes, t)
            at[g] = target
            room.change(target, t, more=False)  # alive from the new cell on
            continue
        old_w = at[w]  # its W, right after it
        del holes[index : index + 2]
        insort(holes, t)
        insort(holes, old_w)
        at[g], at[w] = target, target + 1
        room.change(target + 2, old_w + 1, more=True)  # freed after the W's new cell
    by_cell = np.asarray(at, dtype=np.int64).reshape(d, per_device)
    return [
        (np.argsort(row, kind="stable") + i * per_device).tolist() for i, row in enumerate(by_cell)
    ]


def v1f1b(num_devices: int, num_microbatches: int, turn: int | None = None) -> Schedule:
    """1F1B-V for d devices (2d stages) and m micro-batches (``turn``: see
    :func:`v1f1b_block`)."""
    d, m = num_devices, num_microbatches
    require(d >= 2, f"{NAME}: needs at least 2 devices (2 stages each), got {d}")
    require(m >= 1, f"{NAME}: the number of micro-batches must be at least 1, got {m}")
    cells = v1f1b_block(d, turn)
    orders = compact(cells, m)
    # The compaction keeps a BW's two cells together (module docstring): each W right
    # after its B, so that the two make one BW action.
    for order in orders:
        ids = np.asarray(order, dtype=np.int64)
        code = ids % PASSES
        w = np.flatnonzero(code >= W0)
        b = ids[w] - code[w] + np.where(code[w] == W0, B0, B1)
        assert (w > 0).all() and (ids[w - 1] == b).all()
    meta = {
        "block_cells": cells,
        "repeat_interval": REPEAT_INTERVAL,
        "stable_peak_stage_activations": stable_peak(cells, m),
    }
    return to_schedule(NAME, orders, m, meta, split_backward=False)


register(
    ScheduleFamily(
        name=NAME,
        title="1F1B-V",
        citation='Qi et al., "Pipeline Parallelism with Controllable Memory", 2024, Appendix H',
        build=lambda p, m, _, __: v1f1b(p, m),
        placement="v",
        min_devices=2,
        idle_vs_1f1b=1.0,
        inflight_saturation=lambda p: 2 * p,
        memory_rule="about 2/3 of 1F1B's peak on every device, without a B/W split (Appendix H)",
    )
)
