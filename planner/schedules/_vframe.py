"""The V-shape paper's framework on integers: building block, repeat, squeeze, reorder, time.

Qi et al., "Pipeline Parallelism with Controllable Memory" (2024), §2 and Appendices A and C.
The fixed V schedules (V-Min, V-Half, V-ZB) and the adaptive search both go through here; a
search builds hundreds of candidate schedules, so everything works on small integers and
plain lists, and :class:`~planner.schedules.Action` objects are made only for the result.

Passes. Device i (0-indexed) holds stage i (chunk 0, on the way down) and stage 2d - 1 - i
(chunk 1, on the way back). Its six passes per micro-batch have codes
``F0 F1 B1 B0 W0 W1`` = 0..5 (F1 is the forward of chunk 1, B1 its input-gradient backward,
and so on). Pass j of micro-batch k on device i has the id ``(i * m + k) * 6 + j``.

Dependencies (the V): F0(i) needs F0(i-1); F1(i) needs F1(i+1), and F1(d-1) needs F0(d-1)
on the same device; B1(0) needs F1(0) (the last stage computes the loss), B1(i) needs
B1(i-1); B0(i) needs B0(i+1), and B0(d-1) needs B1(d-1); W needs its own B.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise
from typing import NamedTuple

import numpy as np

from planner.errors import ScheduleConfigError

__all__ = [
    "PASSES",
    "REPEAT_INTERVAL",
    "BuildStages",
    "Slack",
    "VBlock",
    "build_orders",
    "build_orders_stack",
    "build_stages",
    "dependencies",
    "finish_times",
    "order_peaks",
    "repeated_ids",
    "require_block",
    "stable_peak",
    "time_orders",
]

REPEAT_INTERVAL = 6  # cells per micro-batch per device: 2 F + 2 B + 2 W, one unit each
PASSES = 6
F0, F1, B1, B0, W0, W1 = range(PASSES)
CHUNK = (0, 1, 1, 0, 0, 1)  # chunk of each pass code


@dataclass(frozen=True)
class VBlock:
    """A V building block in Appendix A's terms, as offsets between adjacent passes.

    ``down[i]`` is the offset from device i to device i + 1 of the forward of chunk 0 and of
    the backward of chunk 1 (delta F_i^0 = delta B_i^1); ``up[i]`` the offset from device
    i + 1 to device i of the forward of chunk 1 and of the backward of chunk 0 (delta
    F_{i+1}^1 = delta B_{i+1}^0): §3.1's pairing, which balances memory across devices.
    The turns are delta(F_d^0, F_d^1), delta(F_1^1, B_1^1) and delta(B_d^1, B_d^0). W passes
    take the first free cells (mod the repeating interval) after their B, earliest B first
    (Appendix F)."""

    down: tuple[int, ...]
    up: tuple[int, ...]
    turn_forward: int
    turn_loss: int
    turn_backward: int

    @property
    def num_devices(self) -> int:
        return len(self.down) + 1

    def cells(self) -> list[list[int]] | None:
        """Per device, the cell of each pass code of micro-batch 0; None when the block
        collides with itself once repeated (two passes of a device in the same cell mod T)."""
        d = self.num_devices
        f0, f1, b1, b0 = [0] * d, [0] * d, [0] * d, [0] * d
        for i in range(d - 1):
            f0[i + 1] = f0[i] + self.down[i]
        f1[d - 1] = f0[d - 1] + self.turn_forward
        for i in range(d - 2, -1, -1):
            f1[i] = f1[i + 1] + self.up[i]
        b1[0] = f1[0] + self.turn_loss
        for i in range(d - 1):
            b1[i + 1] = b1[i] + self.down[i]
        b0[d - 1] = b1[d - 1] + self.turn_backward
        for i in range(d - 2, -1, -1):
            b0[i] = b0[i + 1] + self.up[i]
        out = []
        for i in range(d):
            row = [f0[i], f1[i], b1[i], b0[i], 0, 0]
            used = {c % REPEAT_INTERVAL for c in row[:4]}
            if len(used) < 4:
                return None
            for w, b in sorted(((W0, b0[i]), (W1, b1[i])), key=lambda wb: wb[1]):
                cell = b + 1
                while cell % REPEAT_INTERVAL in used:
                    cell += 1
                row[w] = cell
                used.add(cell % REPEAT_INTERVAL)
            out.append(row)
        return out


def stable_peak(cells: list[list[int]], num_microbatches: int) -> int:
    """The largest number of (chunk, micro-batch) activations a device holds at once in the
    repeated block: the most lifespans (F start to W end) that overlap, at most m per
    chunk (Eq. 1 of §2.2 counted exactly rather than bounded)."""
    worst = 0
    for row in cells:
        spans = [(row[F0], row[W0]), (row[F1], row[W1])]
        for t in range(REPEAT_INTERVAL):
            level = 0
            for first, last in spans:
                # k with first + T k <= t' <= last + T k for some t' = t (mod T) in the stable
                # phase: the number of residues hit, ceil over the span.
                length = last - first + 1
                full, rest = divmod(length, REPEAT_INTERVAL)
                extra = 1 if (t - first) % REPEAT_INTERVAL < rest else 0
                level += min(num_microbatches, full + extra)
            worst = max(worst, level)
    return worst


@lru_cache(maxsize=64)
def dependencies(num_devices: int, num_microbatches: int) -> tuple[list[int], list[bool]]:
    """Per pass id: the id of the pass it waits for (-1: none) and whether that pass runs
    on another device (communication time applies)."""
    d, m = num_devices, num_microbatches
    dep = [-1] * (d * m * PASSES)
    cross = [False] * len(dep)
    row = m * PASSES
    for i in range(d):
        for k in range(m):
            g = (i * m + k) * PASSES
            if i > 0:
                dep[g + F0] = g + F0 - row
                cross[g + F0] = True
                dep[g + B1] = g + B1 - row
                cross[g + B1] = True
            else:
                dep[g + B1] = g + F1
            if i < d - 1:
                dep[g + F1] = g + F1 + row
                cross[g + F1] = True
                dep[g + B0] = g + B0 + row
                cross[g + B0] = True
            else:
                dep[g + F1] = g + F0
                dep[g + B0] = g + B1
            dep[g + W0] = g + B0
            dep[g + W1] = g + B1
    return dep, cross


def repeated_ids(cells: Sequence[Sequence[int]] | np.ndarray, num_microbatches: int) -> np.ndarray:
    """Step 2: each device's passes of m micro-batches, micro-batch k's block T k cells
    later, in cell order (cells of a device are distinct mod T, so the order is total), as
    a (devices, 6 m) array of pass ids; for a stack of blocks of one size, (blocks,
    devices, 6) -> (blocks, devices, 6 m). Passes in one cell (a block that collides)
    come by pass code, then micro-batch."""
    rows = np.asarray(cells, dtype=np.int64)
    d, m = rows.shape[-2], num_microbatches
    # Laid out (device, code, micro-batch), so a stable sort breaks ties by code, then k.
    k = np.arange(m, dtype=np.int64)
    at = (rows[..., None] + REPEAT_INTERVAL * k).reshape(*rows.shape[:-1], PASSES * m)
    first = (np.arange(d, dtype=np.int64)[:, None, None] * m + k) * PASSES  # (d, 1, m): F0s
    ids = (first + np.arange(PASSES, dtype=np.int64)[:, None]).reshape(d, PASSES * m)
    order = np.argsort(at, axis=-1, kind="stable")
    return np.take_along_axis(np.broadcast_to(ids, at.shape), order, axis=-1)


def time_orders(
    orders: Sequence[Sequence[int]],
    num_microbatches: int,
    duration: Sequence[float] | None = None,
    comm: float = 0.0,
) -> tuple[list[float], list[float]]:
    """Start of every pass id (-1 for ids not in ``orders``) when each device runs its order
    as early as its inputs allow, and each device's finishing time. ``duration[i * 6 + j]``
    is pass code j's time on device i (default 1: the squeeze of step 3, in cells).
    Raises ScheduleConfigError if the orders deadlock (a bug in a generator)."""
    d = len(orders)
    m = num_microbatches
    dep, cross = dependencies(d, m)
    n = len(dep)
    end = [-1.0] * n
    start = [-1.0] * n
    waiting = [-1] * n  # the device blocked on this pass, if any
    position = [0] * d
    free = [0.0] * d
    unit = duration is None
    work = list(range(d))
    while work:
        device = work.pop()
        order = orders[device]
        i, t, stop = position[device], free[device], len(order)
        base = device * PASSES
        while i < stop:
            g = order[i]
            j = dep[g]
            if j >= 0:
                ready = end[j]
                if ready < 0:
                    waiting[j] = device
                    break
                if cross[g]:
                    ready += comm
                if ready > t:
                    t = ready
            start[g] = t
            t += 1.0 if unit else duration[base + g % PASSES]  # type: ignore[index]
            end[g] = t
            woken = waiting[g]
            if woken >= 0:
                work.append(woken)
            i += 1
        position[device], free[device] = i, t
    if any(p < len(o) for p, o in zip(position, orders, strict=True)):
        raise ScheduleConfigError("V-shape: the device orders deadlock")  # a generator bug
    return start, free


def finish_times(
    orders: np.ndarray, num_microbatches: int, duration: Sequence[float], comm: float = 0.0
) -> np.ndarray:
    """Each device's finishing time from :func:`time_orders` (the same floats) for a stack of
    schedules' orders of one shape, (schedules, devices, 6 m) -> (schedules, devices).

    Each round runs the next pass of every device of every schedule whose input has ended,
    so a stack costs about as many rounds as one schedule has passes a device: this pays
    for many schedules at once, :func:`time_orders` for a few. Raises ScheduleConfigError
    if the orders deadlock."""
    count, d, width = orders.shape
    dep, cross = dependencies(d, num_microbatches)
    n = len(dep)
    # Schedule s's passes are ids s (n + 1) + 0..n, its id n (the input of passes with
    # none) ended at 0.
    inputs = np.asarray(dep, dtype=np.int64)
    inputs[inputs < 0] = n
    hop = np.where(cross, comm, 0.0)  # added to the end of a pass's input
    took = np.asarray(duration, dtype=np.float64).reshape(d, PASSES)
    rows = orders.reshape(count * d, width)
    offset = np.repeat(np.arange(count, dtype=np.int64) * (n + 1), d)
    device = np.tile(np.arange(d), count)
    end = np.full(count * (n + 1), -1.0)
    end[n :: n + 1] = 0.0
    position = np.zeros(count * d, np.int64)
    free = np.zeros(count * d)
    live = np.arange(count * d)  # rows with passes left
    while live.size:
        g = rows[live, position[live]]
        ready = end[offset[live] + inputs[g]]
        run = ready >= 0
        if not run.any():
            raise ScheduleConfigError("V-shape: the device orders deadlock")  # a generator bug
        live, g = live[run], g[run]
        t = np.maximum(free[live], ready[run] + hop[g])  # as early as its input allows
        t += took[device[live], g % PASSES]
        end[offset[live] + g] = t
        free[live] = t
        position[live] += 1
        live = np.flatnonzero(position < width)
    return free.reshape(count, d)


def squeeze(orders: Sequence[Sequence[int]], num_microbatches: int) -> list[int]:
    """Step 3: the cell of every pass id (-1 for ids not in ``orders``) when each device
    runs its order as early as its inputs allow, one cell a pass: :func:`time_orders` with
    unit times, in integers (a generator squeezes twice)."""
    d = len(orders)
    dep, _ = dependencies(d, num_microbatches)
    n = len(dep)
    start = [-1] * n
    waiting = [-1] * n
    position = [0] * d
    free = [0] * d
    work = list(range(d))
    while work:
        device = work.pop()
        order = orders[device]
        i, t, stop = position[device], free[device], len(order)
        while i < stop:
            g = order[i]
            j = dep[g]
            if j >= 0:
                ready = start[j]
                if ready < 0:
                    waiting[j] = device
                    break
                if ready >= t:
                    t = ready + 1
            start[g] = t
            t += 1
            woken = waiting[g]
            if woken >= 0:
                work.append(woken)
            i += 1
        position[device], free[device] = i, t
    if any(p < len(o) for p, o in zip(position, orders, strict=True)):
        raise ScheduleConfigError("V-shape: the device orders deadlock")  # a generator bug
    return start


def order_peaks(orders: Sequence[Sequence[int]] | np.ndarray) -> list[int]:
    """Per device, the most activations saved at once by its order (orders of one length,
    as every V order is: 6 m passes): a forward allocates at its start, a W frees at its
    end (so a pass sees everything started before and itself)."""
    ids = np.asarray(orders, dtype=np.int64)
    code = ids % PASSES
    forward = code <= F1
    weight = (code >= W0).astype(np.int64)
    level = np.cumsum(forward, axis=1) - (np.cumsum(weight, axis=1) - weight)
    return np.where(forward, level, 0).max(axis=1, initial=0).tolist()  # type: ignore[no-any-return]


class Slack:
    """Per cell of one device, how many more saved activations it may hold before reaching
    its peak: the memory check of the warm-up fill (:func:`_fill_warmup`) and of 1F1B-V's
    compaction. Stored as bytes when the peak allows (below 256), so that a range changes
    and the last full cell is found in C; the slack never leaves 0..peak (a forward moves
    back only over cells with slack, and a backward frees what it held)."""

    BYTES_BELOW = 256  # peaks below this are stored as bytes
    _LESS = bytes((value - 1) % 256 for value in range(256))
    _MORE = bytes((value + 1) % 256 for value in range(256))

    def __init__(self, slack: list[int], peak: int) -> None:
        self.cells: bytearray | list[int] = bytearray(slack) if peak < self.BYTES_BELOW else slack

    def last_full(self, first: int, stop: int) -> int:
        """The last cell in [first, stop) without slack, or -1."""
        cells = self.cells
        if isinstance(cells, bytearray):
            return cells.rfind(0, first, stop)
        for cell in range(stop - 1, first - 1, -1):
            if cells[cell] == 0:
                return cell
        return -1

    def change(self, first: int, stop: int, more: bool) -> None:
        """One more (``more``) or one less unit of slack on the cells [first, stop)."""
        cells = self.cells
        if isinstance(cells, bytearray):
            cells[first:stop] = cells[first:stop].translate(self._MORE if more else self._LESS)
        else:
            step = 1 if more else -1
            cells[first:stop] = [value + step for value in cells[first:stop]]


def build_orders(
    cells: list[list[int]], num_microbatches: int, reorder: bool = True
) -> list[list[int]]:
    """Steps 2-4 of §2 for a collision-free block: repeat, squeeze (implicit: the orders are
    what squeezing keeps) and reorder the warm-up and cool-down (Appendix C)."""
    if not reorder:
        return repeated_ids(cells, num_microbatches).tolist()  # type: ignore[no-any-return]
    return build_stages(cells, num_microbatches).orders.tolist()  # type: ignore[no-any-return]


class BuildStages(NamedTuple):
    """What :func:`build_orders` makes on its way to the orders, for a caller that reasons
    about how they came about (:mod:`planner.schedules._vperiod`). Every array but
    ``squeezed`` is (devices, 6 m), a row a device."""

    repeated: np.ndarray
    """Step 2's orders (:func:`repeated_ids`)."""
    filled: np.ndarray
    """The orders after the warm-up fill (:func:`_fill_warmup`)."""
    dropped: np.ndarray
    """Per pass of ``filled``: a W the cool-down drops (:func:`_cooldown_dropped`)."""
    squeezed: np.ndarray
    """The cool-down's squeeze of the kept passes: the cell of every pass id, -1 for the
    dropped ones."""
    orders: np.ndarray
    """The result: the dropped Ws placed (:func:`_place_dropped`)."""


def build_stages(cells: list[list[int]], num_microbatches: int) -> BuildStages:
    """:func:`build_orders` with reordering, keeping what each step made."""
    m = num_microbatches
    repeated = repeated_ids(cells, m)
    filled = _fill_warmup(repeated, m, cells)
    dropped, squeezed = _cooldown_squeeze(filled, m)
    return BuildStages(
        repeated, filled, dropped, squeezed, _place_dropped(filled, dropped, squeezed)
    )


def build_orders_stack(cells: np.ndarray, num_microbatches: int) -> np.ndarray:
    """:func:`build_orders` of a stack of collision-free blocks of one size, (blocks,
    devices, 6) -> (blocks, devices, 6 m): the same orders. The warm-ups of the blocks
    whose whole orders are filled (short runs: :func:`_fill_warmup`) are filled together,
    one scan of the stack (:func:`_fill_stack`), the others one block at a time; the
    cool-downs of all of them together (:func:`_reorder_cooldown_stack`)."""
    m = num_microbatches
    count, d = cells.shape[0], cells.shape[1]
    if count == 0:
        return np.zeros((0, d, PASSES * m), np.int64)
    ids = repeated_ids(cells, m)
    whole = _fills_whole(cells, m)
    filled = ids.copy()
    if whole.any():
        filled[whole] = _fill_stack(ids[whole], m)
    for index in np.flatnonzero(~whole).tolist():
        filled[index] = _fill_warmup(ids[index], m, cells[index].tolist())
    return _reorder_cooldown_stack(filled, m)


def _likely_cut(cells: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Per block of a (blocks, devices, 6) stack: the cut :func:`_fill_warmup` tries first
    (twice as far as the last device's first B, where the scan usually stops) and the span
    of the repeated orders (their last cell + 1, past which no cut keeps anything out)."""
    first_b = cells[:, :, [B1, B0]].min(axis=2).max(axis=1)
    span = cells.max(axis=(1, 2)) + REPEAT_INTERVAL * m
    return 2 * first_b + 2 * REPEAT_INTERVAL, span


def _fills_whole(cells: np.ndarray, m: int) -> np.ndarray:
    """Per block of a (blocks, devices, 6) stack: whether :func:`_fill_warmup` fills its
    whole orders at once (the cut it would take keeps most passes)."""
    likely, span = _likely_cut(cells, m)
    return 2 * likely > span


def _fill_warmup(ids: np.ndarray, m: int, block: list[list[int]]) -> np.ndarray:
    """Appendix C, warm-up: scan the squeezed cells left to right; a vacant cell before the
    device's first B is filled with the first later forward of that device whose input is
    ready by then, leaving every other pass where it is. A move is taken only if the
    device's saved activations stay within the peak the squeezed schedule already has: the
    warm-up reorder buys throughput, never memory (the paper: "the peak of memory happens
    in the stable phase").

    ``ids`` repeat ``block`` (:func:`repeated_ids`). Only the warm-up is scanned, so only the
    passes before a cut well past every device's first B are squeezed and scanned, the rest
    of each order staying as it is: the passes before a cell of the repeated block are
    closed under inputs (an input is in an earlier cell), so their squeezed cells are those
    of the whole; :func:`_fill_before` checks that the scan cannot reach past the cut, and
    the whole orders are filled when it could. Returns the filled orders, a row a device."""
    orders = ids.tolist()  # (devices, 6 m): every device runs 6 m passes
    # Squeezing moves passes earlier only: every device's first B is squeezed into a cell
    # no later than in the repeated block. A cut twice as far usually holds what the scan
    # reaches, and :func:`_cut` one that always does; on short runs, where the cut would
    # keep most passes, the whole orders are filled.
    likely, span = (int(v[0]) for v in _likely_cut(np.asarray(block)[None], m))
    cut: int | None = likely
    if 2 * likely > span:  # as :func:`_fills_whole` says
        cut = None
    else:
        bound = _cut(ids, m, block)
        if bound is not None and 2 * bound <= span:
            cut = bound
    while True:
        filled = _fill_before(orders, ids, m, block, cut)
        if isinstance(filled, np.ndarray):
            return filled
        cut = filled  # one that holds every forward the scan can reach (None: no cut)


def _cut(ids: np.ndarray, m: int, block: list[list[int]]) -> int | None:
    """A cell of the repeated block before which :func:`_fill_warmup` finds every forward
    its scan can reach (None: the whole orders).

    Squeezing moves passes earlier only, so a device's first B is squeezed into a cell no
    later than its cell in the repeated block, and the scan's horizon (the last first B)
    is no later than theirs; the passes before it in the order fill all but at most
    (that cell - their number) of the cells before it, which bounds the holes the scan can
    fill. A pass at position q of its order is squeezed into cell q or later: so the cut
    must hold, per device and chunk, one more forward past the horizon's position than
    that bound (:func:`_fill_before` checks it on the squeezed cells)."""
    rows = np.asarray(block, dtype=np.int64)
    first_b = rows[:, [B1, B0]].min(axis=1)
    horizon = int(first_b.max())
    cut = 0
    for i, row in enumerate(ids):
        repeated = rows[i, row % PASSES] + REPEAT_INTERVAL * ((row // PASSES) % m)
        holes = int(first_b[i]) - int(np.searchsorted(repeated, first_b[i]))
        for chunk in (F0, F1):
            holding = _cut_holding(row, horizon, holes, chunk, block[i], m)
            if holding is None:
                return None
            cut = max(cut, holding)
    return cut


def _cut_holding(
    row: np.ndarray, horizon: int, count: int, chunk: int, cells: list[int], m: int
) -> int | None:
    """A cut of the repeated block that holds ``count`` + 1 forwards of ``chunk`` of a
    device's order ``row`` past position ``horizon`` (the cell after the last one's);
    None when the order has no more than ``count`` of them there. ``cells``: the device's
    cells in the block."""
    beyond = np.flatnonzero(row[horizon + 1 :] % PASSES == chunk)
    if len(beyond) <= count:
        return None
    g = int(row[horizon + 1 + beyond[count]])
    return cells[chunk] + REPEAT_INTERVAL * ((g // PASSES) % m) + 1


def _fill_before(
    orders: list[list[int]],
    ids: np.ndarray,
    m: int,
    block: list[list[int]],
    cut: int | None,
) -> np.ndarray | int | None:
    """:func:`_fill_warmup` on the passes before cell ``cut`` of the repeated block (all of
    them for None); when the scan could reach a forward past it, the cut that holds every
    one it can reach instead (None: no cut)."""
    d = len(orders)
    code = ids % PASSES
    # The peak of a squeezed order is its order's (levels rise only at forwards, and a
    # forward's cell sees the forwards and Ws before it in the order): :func:`order_peaks`.
    peak = order_peaks(ids)
    kept = np.full(d, ids.shape[1], np.int64)
    if cut is not None:
        rows = np.asarray(block, dtype=np.int64)
        repeated = np.take_along_axis(rows, code, axis=1) + REPEAT_INTERVAL * ((ids // PASSES) % m)
        kept = (repeated < cut).sum(axis=1)  # orders run in repeated cells
        if 2 * kept.sum() > ids.size:
            # Most of the orders (short runs): squeeze them all, with nothing to check.
            cut, kept = None, np.full(d, ids.shape[1], np.int64)
    prefix = [order[:k] for order, k in zip(orders, kept.tolist(), strict=True)]
    at = squeeze(prefix, m)  # cell of every pass (moved forwards are updated); -1 past the cut
    dep, _ = dependencies(d, m)
    cell = np.asarray(at, dtype=np.int64)
    squeezed = cell[ids]  # increasing along each kept prefix: squeezed orders run in order
    inside = np.arange(ids.shape[1])[None, :] < kept[:, None]
    last = squeezed[np.arange(d), np.maximum(kept - 1, 0)]
    horizons = np.where(kept > 0, last + 1, 0)
    # Per device and cell, the saved activations: a forward's from its cell through its
    # W's (past the cut: beyond every cell kept here).
    forward = (code <= F1) & inside
    delta = np.zeros((d, int(horizons.max(initial=0)) + 2), np.int64)
    f_row, f_col = np.nonzero(forward)
    delta[f_row, squeezed[f_row, f_col]] += 1  # a device's cells are distinct
    f_code = code[f_row, f_col]
    weight = ids[f_row, f_col] - f_code + np.where(f_code == F0, W0, W1)
    freed = cell[weight]
    delta[f_row[freed >= 0], freed[freed >= 0] + 1] -= 1
    levels = np.cumsum(delta, axis=1)
    # Per device and cell (kept ones and a few past them), what it may save more: a
    # squeezed order's levels are its order's, so they stay within its peak.
    slack = (np.asarray(peak)[:, None] - levels).tolist()
    rooms = [Slack(row, top) for row, top in zip(slack, peak, strict=True)]
    backward = ((code == B1) | (code == B0)) & inside
    if cut is not None and not backward.any(axis=1).all():
        return None  # a first B past the cut
    first_bs = np.where(backward, squeezed, horizons[:, None]).min(axis=1)
    # Per device and chunk, its forwards' cells (in order, so increasing) and pass ids.
    chunks: list[list[tuple[list[int], list[int]]]] = [[] for _ in range(d)]
    for chunk in (F0, F1):
        mine = (code == chunk) & inside
        bounds = np.concatenate([[0], np.cumsum(mine.sum(axis=1))]).tolist()
        chunk_cells, chunk_ids = squeezed[mine].tolist(), ids[mine].tolist()
        for device, (begin, end) in enumerate(pairwise(bounds)):
            chunks[device].append((chunk_cells[begin:end], chunk_ids[begin:end]))
    # The vacant cells before each device's first B, by cell: the scan visits only those
    # (cells left by a forward that moves earlier join when they are before the first B).
    horizon = int(first_bs.max(initial=0))
    occupied = np.zeros((d, horizon), bool)
    early = inside & (squeezed < horizon)
    occupied[np.nonzero(early)[0], squeezed[early]] = True
    hole = ~occupied & (np.arange(horizon) < first_bs[:, None])
    holes = hole.sum(axis=1).tolist()  # per device: vacant cells before its first B
    hole_cells, hole_devices = np.nonzero(hole.T)  # by cell, then device
    bounds = np.searchsorted(hole_cells, np.arange(horizon + 1)).tolist()
    listed = hole_devices.tolist()
    vacant = [listed[begin:end] for begin, end in pairwise(bounds)]
    first_b = first_bs.tolist()
    if cut is not None:
        # A forward past the scan's horizon moves only into one of these holes, taking the
        # earliest of its chunk past the horizon each time (and leaving no hole before the
        # first B): with more of them kept than holes, every one the scan can take is kept.
        needed = cut
        for device, row in enumerate(ids):
            for chunk, (chunk_cells, _) in zip((F0, F1), chunks[device], strict=True):
                if len(chunk_cells) - bisect_right(chunk_cells, horizon) > holes[device]:
                    continue
                # Passes at positions past the horizon are squeezed past it (one cell a
                # pass): the cut must hold holes + 1 forwards of the chunk there.
                holding = _cut_holding(row, horizon, holes[device], chunk, block[device], m)
                if holding is None:
                    return None
                needed = max(needed, holding)
        if needed > cut:
            return needed
    for t in range(horizon):
        devices = vacant[t]
        if len(devices) > 1:
            devices.sort()
        for device in devices:
            # A chunk's forwards run in micro-batch order: only its first forward after t
            # can be ready. The earliest ready one (in cell order) moves here, if the
            # device's level stays below its peak over the cells it jumps.
            (cells0, ids0), (cells1, ids1) = chunks[device]
            best = -1
            index = bisect_right(cells0, t)
            if index < len(cells0):
                producer = dep[ids0[index]]
                if producer < 0 or at[producer] < t:
                    best, moved, g = cells0[index], cells0, ids0[index]
            later = bisect_right(cells1, t)
            if later < len(cells1) and (best < 0 or cells1[later] < best):
                producer = dep[ids1[later]]
                if producer < 0 or at[producer] < t:
                    best, moved, index, g = cells1[later], cells1, later, ids1[later]
            if best < 0:
                continue
            room = rooms[device]
            if room.last_full(t, best) >= 0:  # a cell it jumps (t to best) is at the peak
                continue
            room.change(t, best, more=False)
            # Its chunk's forwards stay sorted: none is in the cells from t to best.
            moved[index] = t
            at[g] = t
            if best < first_b[device]:
                vacant[best].append(device)
    # Each kept prefix in its new cell order (cells of a device stay distinct), the passes
    # past the cut after it as they were.
    width = ids.shape[1]
    final = np.where(inside, np.asarray(at, dtype=np.int64)[ids], horizons.max() + np.arange(width))
    return np.take_along_axis(ids, np.argsort(final, axis=1), axis=1)


def _fill_stack(ids: np.ndarray, m: int) -> np.ndarray:
    """:func:`_fill_before` without a cut for a stack of repeated orders of one shape,
    (blocks, devices, 6 m) -> the filled orders, the same.

    The scan runs over cells for the whole stack at once: at a cell, what a device does
    depends only on its own state and on the cells of passes before it, and a pass moved
    into the cell is not before it, so the devices vacant at the cell (of every block) take
    their moves together, in any order, as the one-device-at-a-time scan does."""
    count, d, width = ids.shape
    n = d * m * PASSES
    rows = (ids + np.arange(count, dtype=np.int64)[:, None, None] * n).reshape(count * d, width)
    code = rows % PASSES
    peak = np.asarray(order_peaks(rows), dtype=np.int64)
    dep = _stack_dependencies(count, d, m)
    at = _squeeze_stack(rows, dep)
    squeezed = at[rows]  # increasing along each row: squeezed orders run in order
    horizons = squeezed[:, -1] + 1
    r = len(rows)
    # Per row and cell, the saved activations: a forward's from its cell through its W's.
    forward = code <= F1
    delta = np.zeros((r, int(horizons.max()) + 2), np.int64)
    f_row, f_col = np.nonzero(forward)
    delta[f_row, squeezed[f_row, f_col]] += 1
    f_code = code[f_row, f_col]
    delta[f_row, at[rows[f_row, f_col] - f_code + np.where(f_code == F0, W0, W1)] + 1] -= 1
    level = np.cumsum(delta, axis=1)
    backward = (code == B1) | (code == B0)
    first_b = np.where(backward, squeezed, horizons[:, None]).min(axis=1)
    # Per row and chunk, its m forwards: their cells (increasing) and pass ids.
    chunk_cells, chunk_ids = [], []
    for chunk in (F0, F1):
        mine = code == chunk
        chunk_cells.append(squeezed[mine].reshape(r, m))
        chunk_ids.append(rows[mine].reshape(r, m))
    horizon = int(first_b.max())
    occupied = np.zeros((r, horizon + 1), bool)
    early = squeezed < horizon
    occupied[np.nonzero(early)[0], squeezed[early]] = True
    vacant = ~occupied & (np.arange(horizon + 1) < first_b[:, None])
    columns = np.arange(level.shape[1])
    for t in range(horizon):
        live = np.flatnonzero(vacant[:, t])
        if not live.size:
            continue
        # Each chunk's first forward after t; it can move if its input is in a cell before t.
        options = []
        for cells_, ids_ in zip(chunk_cells, chunk_ids, strict=True):
            # A row's cells increase: argmax finds the first after t, or 0 if none is.
            index = (np.take(cells_, live, axis=0) > t).argmax(axis=1)
            cell = cells_[live, index]
            producer = dep[ids_[live, index]]
            ready = (cell > t) & ((producer < 0) | (at[np.maximum(producer, 0)] < t))
            options.append((ready, cell, index))
        (ready0, cell0, _), (ready1, cell1, _) = options
        take1 = ready1 & (~ready0 | (cell1 < cell0))
        take0 = ready0 & ~take1
        # Only the rows with a ready forward (about half) look at their levels.
        some = np.flatnonzero(take0 | take1)
        if not some.size:
            continue
        take0, take1, near = take0[some], take1[some], live[some]
        best = np.where(take1, cell1[some], cell0[some])
        # Taken if the row's level stays below its peak over the cells it jumps (t to best):
        # its first cell from t at the peak (argmax: 0 when there is none) is not before best.
        reach = int(best.max())
        window = level[near, t:reach]
        full = window >= peak[near, None]
        first = full.argmax(axis=1)
        move = ~full[np.arange(len(near)), first] | (first >= best - t)
        if not move.any():
            continue
        row, cell = near[move], best[move]
        level[row, t:reach] = window[move] + (columns[: reach - t] < (cell - t)[:, None])
        for taken, (_, _, index), cells_, ids_ in zip(
            (take0 & move, take1 & move), options, chunk_cells, chunk_ids, strict=True
        ):
            moved, col = near[taken], index[some[taken]]
            at[ids_[moved, col]] = t
            cells_[moved, col] = t  # its chunk's forwards stay sorted
        back = cell < first_b[row]
        vacant[row[back], cell[back]] = True
    final = at[rows]
    done = np.take_along_axis(rows, np.argsort(final, axis=1), axis=1).reshape(count, d, width)
    return done - np.arange(count, dtype=np.int64)[:, None, None] * n  # type: ignore[no-any-return]


def _squeeze_stack(
    rows: np.ndarray, dep: np.ndarray, lengths: np.ndarray | None = None
) -> np.ndarray:
    """:func:`squeeze` of orders of one length (rows), or of the first ``lengths[r]`` passes
    of row r, with the input of every pass id given (``dep``, -1: none), each round running
    the next pass of every row whose input has started (:func:`finish_times` with unit
    times, in integers). Returns the cell of every pass id (-1 for ids not run)."""
    r, width = rows.shape
    none = len(dep)  # the input of passes with none, ended at cell 0 (so they run at once)
    end = np.full(none + 1, -1, np.int64)  # the cell after each pass id, once it has run
    end[none] = 0
    # A round costs a few array operations: read each row's next pass and its input
    # through one flat index (the cursor) into the rows and into their inputs.
    passes = rows.ravel()
    needs = np.where(dep < 0, none, dep)[passes]
    cursor = np.arange(r, dtype=np.int64) * width
    stop = cursor + (width if lengths is None else lengths)
    free = np.zeros(r, np.int64)  # each row's first free cell
    live = np.flatnonzero(cursor < stop)  # rows with passes left
    while live.size:
        at = cursor[live]
        ready = end[needs[at]]
        run = ready >= 0
        if not run.any():
            raise ScheduleConfigError("V-shape: the device orders deadlock")  # a generator bug
        live, at = live[run], at[run]
        t = np.maximum(free[live], ready[run]) + 1
        end[passes[at]] = t
        free[live] = t
        cursor[live] = at + 1
        live = np.flatnonzero(cursor < stop)
    return np.maximum(end[:-1] - 1, -1)


def _stack_dependencies(count: int, d: int, m: int) -> np.ndarray:
    """:func:`dependencies` of ``count`` blocks of d devices and m micro-batches as one
    array, block b's pass ids (and their inputs) offset by b n: the ``dep`` of
    :func:`_squeeze_stack` for a stack of blocks."""
    single = np.asarray(dependencies(d, m)[0], dtype=np.int64)
    n = len(single)
    offset = np.arange(count, dtype=np.int64)[:, None] * n
    return np.where(single >= 0, single + offset, -1).ravel()


def _reorder_cooldown(ids: np.ndarray, m: int) -> list[list[int]]:
    """Appendix C, cool-down: drop the W passes after each device's last F, squeeze, put the
    dropped Ws into the idle cells that remain (each after its B), the rest at the end.

    ``ids``: the orders, one row a device (every device runs 6 m passes). The oracle of
    :func:`_reorder_cooldown_stack`, which does the same for a stack of blocks."""
    dropped, cell = _cooldown_squeeze(ids, m)
    return _place_dropped(ids, dropped, cell).tolist()  # type: ignore[no-any-return]


def _cooldown_squeeze(ids: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """The first two steps of :func:`_reorder_cooldown`: which passes of ``ids`` it drops
    (:func:`_cooldown_dropped`) and the cell of every pass id once the others are squeezed
    (-1 for the dropped Ws)."""
    dropped = _cooldown_dropped(ids)
    kept_ids = ids[~dropped].tolist()  # by device, in order
    bounds = np.concatenate([[0], np.cumsum(ids.shape[1] - dropped.sum(axis=1))]).tolist()
    start = squeeze([kept_ids[begin:end] for begin, end in pairwise(bounds)], m)
    return dropped, np.asarray(start, dtype=np.int64)


def _reorder_cooldown_stack(ids: np.ndarray, m: int) -> np.ndarray:
    """:func:`_reorder_cooldown` of a stack of orders of one shape, (blocks, devices, 6 m)
    -> the reordered orders, the same: the kept passes of every block are squeezed in one
    :func:`_squeeze_stack` (block b's pass ids offset by b n, so that the blocks are one
    pipeline of independent rows) and the dropped Ws placed for every row at once."""
    count, d, width = ids.shape
    n = d * m * PASSES
    shift = np.arange(count, dtype=np.int64)[:, None, None] * n
    rows = (ids + shift).reshape(count * d, width)
    dropped = _cooldown_dropped(rows)
    # Each row's kept passes first, in order (a stable sort on the dropped flag), the
    # dropped ones after them, past the row's length, where the squeeze does not look.
    kept = np.take_along_axis(rows, np.argsort(dropped, axis=1, kind="stable"), axis=1)
    cell = _squeeze_stack(kept, _stack_dependencies(count, d, m), width - dropped.sum(axis=1))
    done = _place_dropped(rows, dropped, cell).reshape(count, d, width)
    return done - shift  # type: ignore[no-any-return]


def _cooldown_dropped(ids: np.ndarray) -> np.ndarray:
    """Per pass of each row of ``ids`` (a device's order): whether the cool-down drops it,
    i.e. it is a W after the row's last F."""
    width = ids.shape[1]
    code = ids % PASSES
    last_f = width - 1 - np.argmax(code[:, ::-1] <= F1, axis=1)
    return (np.arange(width) > last_f[:, None]) & (code >= W0)  # type: ignore[no-any-return]


def _place_dropped(ids: np.ndarray, dropped: np.ndarray, cell: np.ndarray) -> np.ndarray:
    """The cool-down's orders, one row of ``ids`` a device (pass ids distinct across rows):
    the squeezed kept passes in their cells (``cell``: of every pass id, -1 for the
    ``dropped`` ones), each dropped W in the first idle cell after its B and after the W
    before it, earliest B first, those left over at the end."""
    d, width = ids.shape
    at = cell[ids]  # a squeezed order runs in order: increasing along each kept row
    horizon = at.max(axis=1)  # each device's last kept pass
    # The idle cells before each device's last kept pass, numbered across devices (device
    # i's cells from i * span), in order.
    span = int(horizon.max()) + 1
    idle = np.ones((d, span), bool)
    rows, cols = np.nonzero(~dropped)
    idle[rows, at[rows, cols]] = False
    idle &= np.arange(span) < horizon[:, None]
    idle_cells = np.flatnonzero(idle)
    # Each W after its B (the W's id minus the code offset gives its B's id), earliest B
    # first, each in the first idle cell after its B and after the W before it: the k-th W
    # of a device takes idle cell max over j <= k of (first idle cell after W j's B + k - j).
    device, column = np.nonzero(dropped)
    w = ids[device, column]
    w_code = w % PASSES
    after = cell[w - w_code + np.where(w_code == W0, B0, B1)] + 1
    by_b = np.lexsort((after, device))
    device, column, after = device[by_b], column[by_b], after[by_b]
    rank = np.arange(len(device))
    first_idle = np.searchsorted(idle_cells, device * span + after)
    # first_idle - rank lies in [-len(rank), len(idle_cells)]: an offset per device wider
    # than that keeps the running maximum within each device.
    offset = device * (len(idle_cells) + len(rank) + 1)
    taken = np.maximum.accumulate(first_idle - rank + offset) - offset + rank
    placed = taken < np.searchsorted(idle_cells, (device + 1) * span)  # a prefix of them
    key = at.copy()  # each pass's cell: the order sorts by it
    key[device, column] = span + rank  # not placed: after the last pass, earliest B first
    key[device[placed], column[placed]] = idle_cells[taken[placed]] - device[placed] * span
    return np.take_along_axis(ids, np.argsort(key, axis=1), axis=1)


def block_problem(block: VBlock) -> str | None:
    """Why ``block`` cannot be used, or None."""
    if any(o < 1 for o in (*block.down, *block.up)):
        return "offsets between devices must be at least 1 cell"
    if min(block.turn_forward, block.turn_loss, block.turn_backward) < 1:
        return "turn offsets must be at least 1 cell"
    return None


def require_block(block: VBlock, name: str) -> list[list[int]]:
    problem = block_problem(block)
    cells = None if problem else block.cells()
    if cells is None:
        raise ScheduleConfigError(
            f"{name}: {problem or 'the building block collides with itself when repeated'}"
        )
    return cells
