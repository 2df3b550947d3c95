"""v-adaptive: the V-shape paper's adaptive scheduler (Qi et al., "Pipeline Parallelism with
Controllable Memory", 2024, Appendix A), for any activation memory limit.

The limit is a fraction of 1F1B's peak activation (1F1B's device 0 holds p micro-batches of
its stage, one micro-batch of the whole model). Each of the 2d V stages holds 1/2d of the
model, so a limit X allows floor(2dX) stage activations on every device.

Search space (Appendix A, Eq. 3, with the ranges and the ceiling of 1F1B's memory of the
authors' implementation, ``v_schedule.py`` in sail-sg/zero-bubble-pipeline-parallelism):
uniform offsets split at
row K, delta^0 = delta_{<K}^0 on the first K rows and delta_{>=K}^0 <= delta_{<K}^0 below,
both in 1..5, delta^1 = 1 throughout; the first device's permutation, i.e. the three turns
delta(F_d^0, F_d^1), delta(F_1^1, B_1^1), delta(B_d^1, B_d^0), each in 1..5; W passes
greedily after their B. Every block is repeated, checked for collisions, squeezed and
reordered (§2, Appendix C, :mod:`planner.schedules._vframe`), and the schedule with the
fewest bubbles under the real F/B/W and communication times whose peak is within the limit
on every device wins.

Evaluating every block in full takes about 0.1 s each at 32 devices x 128 micro-batches,
and hundreds fit a typical limit. So the search narrows in two steps, both checked against
the exhaustive search in the tests:
1. memory levels: blocks are grouped by their exact peak; the fewest bubbles come with the
   most memory (Appendix B, Figure 9; Appendix E.2's bound 6n + 6d - 3k - 1 falls with the
   peak k), so only the ``SCREEN_LEVELS`` highest levels within the limit are considered
   (more on small pipelines, until ``MIN_SCREENED`` blocks);
2. screening: each of those is built and timed with ``SCREEN_MICROBATCHES`` micro-batches
   (warm-up and cool-down, where blocks of one level differ, are all there), and the
   ``FINALISTS`` fastest are built and timed with all m micro-batches.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import product
from typing import Any

import numpy as np

from planner.errors import ScheduleConfigError
from planner.schedules._basic import require
from planner.schedules._ir import Schedule
from planner.schedules._registry import MEMORY_LIMIT, PassTimes, ScheduleFamily, register
from planner.schedules._vcolumns import to_schedule
from planner.schedules._vframe import (
    REPEAT_INTERVAL,
    VBlock,
    build_orders,
    build_orders_stack,
    finish_times,
    order_peaks,
    repeated_ids,
    time_orders,
)

__all__ = [
    "AdaptiveChoice",
    "largest_v_limit",
    "smallest_v_limit",
    "v_adaptive",
    "v_adaptive_choice",
]

SCREEN_LEVELS = 2
SCREEN_MICROBATCHES = 16
MIN_SCREENED = 64
MAX_SCREENED = 256  # distinct repeated orders at most (short runs make many blocks alike)
FINALISTS = 3
_OFFSETS = range(1, REPEAT_INTERVAL)  # 1..5 cells


MAX_SPLIT_ROWS = 32  # distinct split rows K searched (all of them up to 34 devices)


@dataclass(frozen=True)
class _Space:
    """Every collision-free block of the search space on d devices, with its cells."""

    blocks: list[VBlock]
    cells: np.ndarray  # (blocks, devices, 6): cell of each pass code of micro-batch 0


def _split_rows(num_devices: int) -> list[int]:
    """The split rows K of mixed blocks: every one from 1 to d - 2, or on large pipelines
    ``MAX_SPLIT_ROWS`` spread evenly (neighbouring K differ by a fraction of one stage
    activation in peak memory, far finer than a limit needs)."""
    rows = range(1, num_devices - 1)
    if len(rows) <= MAX_SPLIT_ROWS:
        return list(rows)
    step = (len(rows) - 1) / (MAX_SPLIT_ROWS - 1)
    return sorted({rows[round(i * step)] for i in range(MAX_SPLIT_ROWS)})


@lru_cache(maxsize=32)
def _space(num_devices: int) -> _Space:
    d = num_devices
    downs: list[tuple[int, ...]] = [(hi,) * (d - 1) for hi in _OFFSETS]
    for hi in _OFFSETS:
        for lo in range(1, hi):
            # K = d - 1 puts hi on every row: the uniform block above.
            downs += [(hi,) * k + (lo,) * (d - 1 - k) for k in _split_rows(d)]
    down = np.array(downs, dtype=np.int64).reshape(len(downs), d - 1)
    f0 = np.concatenate([np.zeros((len(downs), 1), np.int64), np.cumsum(down, axis=1)], 1)
    back = np.arange(d - 1, -1, -1, dtype=np.int64)  # hops up from device i to 0 (delta^1 = 1)
    # With turns (tf, tl, tb) and s1 = tf, s2 = tf + tl, s3 = s2 + tb, a block's cells are
    # F0 = f0, F1 = up + s1, B1 = f0 + c + s2, B0 = up + c + s3, where up = f0[-1] + back
    # and c = up[0]. So two passes of a device collide (mod T) exactly when the device's
    # f0 - up is one of a few residues fixed by the turns, or (F0 with B1, F1 with B0) on
    # every device at once: each down vector's residues of f0 - up, as a bit mask, say
    # which turns it allows without building the (turns, downs, devices) cells.
    up = f0[:, -1:] + back
    c = up[:, 0]
    present = np.bitwise_or.reduce(np.left_shift(1, (f0 - up) % REPEAT_INTERVAL), axis=1)
    turns = np.array(list(product(_OFFSETS, repeat=3)), dtype=np.int64)
    s1 = turns[:, :1]
    s2 = s1 + turns[:, 1:2]
    s3 = s2 + turns[:, 2:]

    def absent(residue: np.ndarray) -> np.ndarray:  # (turns, downs): not among f0 - up's
        free: np.ndarray = (np.right_shift(present, residue % REPEAT_INTERVAL) & 1) == 0
        return free

    ok = (
        absent(s1)  # F0 and F1
        & ((c + s2) % REPEAT_INTERVAL != 0)  # F0 and B1
        & absent(c + s3)  # F0 and B0
        & absent(s1 - c - s2)  # F1 and B1
        & ((s1 - c - s3) % REPEAT_INTERVAL != 0)  # F1 and B0
        & absent(s3 - s2)  # B1 and B0
    )
    turn, row = np.nonzero(ok)  # by turn triple (in product order), then down vector
    f0, up, c = f0[row], up[row], c[row, None]
    f1 = up + s1[turn]
    b1 = f0 + c + s2[turn]
    b0 = up + c + s3[turn]
    used = np.zeros(f0.shape, np.int64)
    for x in (f0, f1, b1, b0):
        used |= np.left_shift(1, x % REPEAT_INTERVAL)
    w1 = _first_free_after(b1, used)  # B1 always comes before B0 on a device
    w0 = _first_free_after(b0, used | np.left_shift(1, w1 % REPEAT_INTERVAL))
    triples = [tuple(t) for t in turns.tolist()]
    ups = (1,) * (d - 1)
    blocks = [
        VBlock(downs[i], ups, *triples[t]) for t, i in zip(turn.tolist(), row.tolist(), strict=True)
    ]
    return _Space(blocks, np.stack([f0, f1, b1, b0, w0, w1], axis=2))


def _first_free_after(cell: np.ndarray, used: np.ndarray) -> np.ndarray:
    """The first cell after ``cell`` whose residue is not set in the bit mask ``used``."""
    out = cell + REPEAT_INTERVAL  # placeholder: a block always has a free residue
    for offset in reversed(_OFFSETS):  # the smallest free offset is written last
        candidate = cell + offset
        free = (np.right_shift(used, candidate % REPEAT_INTERVAL) & 1) == 0
        out = np.where(free, candidate, out)
    return out


@lru_cache(maxsize=64)
def _peaks(num_devices: int, num_microbatches: int) -> np.ndarray:
    """Each block's peak: the most (chunk, micro-batch) activations a device holds at once
    in the repeated block (lifespans from F to W overlapping, at most m per chunk), the
    exact form of Eq. 1; squeezing keeps it and the reordering never raises it."""
    covering = _covering(num_devices)
    # A plan asks for many m on one d: from the most any chunk needs up, every m gives the
    # same peaks, worked out once per d.
    if num_microbatches >= covering.max(initial=0):
        return _unbounded_peaks(num_devices)
    m = num_microbatches
    return _block_peaks(np.minimum(covering[..., 0], m), np.minimum(covering[..., 1], m))


@lru_cache(maxsize=8)
def _unbounded_peaks(num_devices: int) -> np.ndarray:
    """:func:`_peaks` with micro-batches enough for every lifespan."""
    covering = _covering(num_devices)
    return _block_peaks(covering[..., 0], covering[..., 1])


def _block_peaks(chunk0: np.ndarray, chunk1: np.ndarray) -> np.ndarray:
    """Per block, the most a device holds in any cell, from what each of its two chunks
    holds per (cell residue, block, device). Added as two arrays: NumPy's sum over a last
    axis of length 2 is ten times slower."""
    both = chunk0 + chunk1  # int16: at most a few hundred
    return both.max(axis=(0, 2), initial=0).astype(np.int64)  # type: ignore[no-any-return]


@lru_cache(maxsize=8)
def _covering(num_devices: int) -> np.ndarray:
    """Per cell residue t, block, device and chunk: how many lifespans of the chunk (F to W)
    a cell t mod T of the stable phase lies in, with as many micro-batches as they need
    (their number, ceil over the span, is a few per device: small integers)."""
    cells = _space(num_devices).cells
    first = cells[:, :, 0:2]  # F0 F1
    length = cells[:, :, 4:6] - first + 1  # to W0 W1
    whole = (length // REPEAT_INTERVAL).astype(np.int16)
    part = (length % REPEAT_INTERVAL).astype(np.int16)
    # Residue by residue in 16 bits ((t - first) mod T as a running sum, no division):
    # the array is (T, blocks, devices, 2), 1.5 million cells at 64 devices.
    residue = ((-first) % REPEAT_INTERVAL).astype(np.int16)
    out = np.empty((REPEAT_INTERVAL, *first.shape), np.int16)
    for t in range(REPEAT_INTERVAL):
        out[t] = whole + (residue < part)
        residue += 1
        residue[residue == REPEAT_INTERVAL] = 0
    return out


def _units(limit: float, num_devices: int) -> int:
    """Stage activations a device may hold under ``limit`` (fraction of 1F1B's peak)."""
    return math.floor(limit * 2 * num_devices + 1e-9)


def _shortlist(peaks: np.ndarray, within: np.ndarray) -> list[int]:
    """The blocks to screen, highest level first: the ``SCREEN_LEVELS`` highest memory
    levels within the limit, and more levels down until at least ``MIN_SCREENED`` blocks
    (small pipelines have few blocks a level, and every one of them is then screened); the
    search stops after ``MAX_SCREENED`` distinct ones."""
    levels = sorted(set(peaks[within].tolist()), reverse=True)
    counts = np.bincount(peaks[within])
    taken, floor = 0, levels[0]
    for index, level in enumerate(levels):
        if index >= SCREEN_LEVELS and taken >= MIN_SCREENED:
            break
        taken += int(counts[level])
        floor = level
    chosen = [int(i) for i in within if peaks[i] >= floor]
    return sorted(chosen, key=lambda i: (-int(peaks[i]), i))


def smallest_v_limit(num_devices: int, num_microbatches: int) -> float:
    """The smallest memory limit any block of the search space meets."""
    return float(_peaks(num_devices, num_microbatches).min()) / (2 * num_devices)


def largest_v_limit(num_devices: int, num_microbatches: int) -> float:
    """The limit beyond which the search looks at no more blocks: 1F1B's memory, where it
    stops, or less when every block needs less."""
    peaks = _peaks(num_devices, num_microbatches)
    return float(min(peaks.max(), 2 * num_devices)) / (2 * num_devices)


def _pass_durations(times: PassTimes, num_devices: int) -> list[float]:
    """Per device, the time of each pass code (device i runs stages i and 2d - 1 - i)."""
    d = num_devices
    forward, backward, weight = times.per_stage(2 * d)
    out = []
    for i in range(d):
        up = 2 * d - 1 - i
        out += [forward[i], forward[up], backward[up], backward[i], weight[i], weight[up]]
    return out


@dataclass(frozen=True)
class AdaptiveChoice:
    """The block the search chose, its orders, and what it measured."""

    block: VBlock
    orders: Sequence[Sequence[int]]
    peak_units: int  # stage activations on the fullest device
    makespan: float  # under the pass times searched with
    candidates: int  # blocks within the limit
    evaluated: int  # blocks built and timed


def v_adaptive_choice(
    num_devices: int, num_microbatches: int, memory_limit: float, times: PassTimes
) -> AdaptiveChoice:
    """Appendix A's search (see the module docstring). Raises ScheduleConfigError naming
    the smallest feasible limit when no block fits ``memory_limit``."""
    d, m = num_devices, num_microbatches
    peaks = _peaks(d, m)
    # The authors' search stops at 1F1B's memory (2d stage activations): V-ZB's zero
    # bubble is reached there, and a larger limit searches the same blocks.
    allowed = min(_units(memory_limit, d), 2 * d)
    within = np.flatnonzero(peaks <= allowed)
    if len(within) == 0:
        smallest = smallest_v_limit(d, m)
        raise ScheduleConfigError(
            f"v-adaptive: no V schedule on {d} devices with {m} micro-batches keeps its "
            f"activations within {memory_limit:g} of 1F1B's peak; the smallest feasible "
            f"memory_limit is {smallest:.4g} ({int(peaks.min())} of {2 * d} stage activations)"
        )
    return _choose(d, m, allowed, times)


@lru_cache(maxsize=128)
def _choose(
    num_devices: int, num_microbatches: int, allowed: int, times: PassTimes
) -> AdaptiveChoice:
    """The search for ``allowed`` stage activations (limits that allow as many share it)."""
    d, m = num_devices, num_microbatches
    screened = _screened(d, m, allowed)
    durations = _pass_durations(times, d)
    screen_m = min(m, SCREEN_MICROBATCHES)
    # All screened blocks timed at once (their orders have one shape).
    stack = np.stack([built for _, _, built in screened])
    finish = finish_times(stack, screen_m, durations, times.comm).max(axis=1).tolist()
    # Fewest bubbles first; then the least memory; then the search order (stable).
    scored = sorted(
        (makespan, peak, index) for makespan, (index, peak, _) in zip(finish, screened, strict=True)
    )
    if screen_m < m:
        finals = []
        for _, peak, index in scored[:FINALISTS]:
            orders = _block_orders(d, index, m).tolist()
            _, end = time_orders(orders, m, durations, times.comm)
            finals.append((max(end), peak, index, orders))
        makespan, _, index, orders = min(finals, key=lambda s: s[:3])
    else:
        makespan, _, index = scored[0]
        orders = next(built for i, _, built in screened if i == index).tolist()
    peak = max(order_peaks(orders))
    assert peak <= allowed, (peak, allowed)  # reordering never raises the peak
    evaluated = len(screened) + (min(FINALISTS, len(scored)) if screen_m < m else 0)
    within = int(np.count_nonzero(_peaks(d, m) <= allowed))
    return AdaptiveChoice(_space(d).blocks[index], orders, peak, makespan, within, evaluated)


@lru_cache(maxsize=16)
def _screened(
    num_devices: int, num_microbatches: int, allowed: int
) -> tuple[tuple[int, int, np.ndarray], ...]:
    """The blocks the search times for ``allowed`` stage activations, as (index in the
    space, peak, orders built with ``SCREEN_MICROBATCHES`` micro-batches or m if fewer),
    in shortlist order, one per distinct repeated order (blocks whose repeated orders are
    the same build the same schedule). Nothing here depends on pass times, so every
    candidate of a plan with this (d, m, allowed) shares it: building the orders is most of
    a search's time, timing them little."""
    d, m = num_devices, num_microbatches
    space, peaks = _space(d), _peaks(d, m)
    shortlist = _shortlist(peaks, np.flatnonzero(peaks <= allowed))
    screen_m = min(m, SCREEN_MICROBATCHES)
    chosen = []
    seen: set[bytes] = set()
    for index, repeated in zip(
        shortlist, repeated_ids(space.cells[shortlist], screen_m), strict=True
    ):
        key = repeated.tobytes()
        if key in seen:
            continue
        seen.add(key)
        if len(seen) > MAX_SCREENED:
            break
        chosen.append(index)
    # Searches of one (d, m) under different limits screen many of the same blocks: each is
    # built once, the new ones of a search together (their warm-ups as one stack).
    # The service plans on several threads: this search reads the shared dict once per
    # block into its own, so another search clearing or filling it cannot take one away.
    built = _screen_orders(d, screen_m)
    orders_of: dict[int, np.ndarray] = {}
    for index in chosen:
        found = built.get(index)
        if found is not None:
            orders_of[index] = found
    new = [index for index in chosen if index not in orders_of]
    if len(built) + len(new) > _SCREEN_ORDERS_KEPT:
        # A long-lived service plans many limits on one (d, m): keep the memory bounded
        # (orders of up to 16 micro-batches on 32 devices are 24 KiB each).
        built.clear()
    for index, orders in zip(new, build_orders_stack(space.cells[new], screen_m), strict=True):
        orders.flags.writeable = False
        built[index] = orders_of[index] = orders
    return tuple((index, int(peaks[index]), orders_of[index]) for index in chosen)


_SCREEN_ORDERS_KEPT = 1024  # built screened blocks kept per (d, m)


@lru_cache(maxsize=8)
def _screen_orders(num_devices: int, num_microbatches: int) -> dict[int, np.ndarray]:
    """The screened blocks' orders built so far for (d, m), by index in the space: read-only
    arrays, as :func:`_block_orders` keeps them. Filled in by :func:`_screened`."""
    return {}


@lru_cache(maxsize=512)
def _block_orders(num_devices: int, index: int, num_microbatches: int) -> np.ndarray:
    """Block ``index``'s finished orders (repeated, warm-up and cool-down reordered) for m
    micro-batches, one row a device; shared by every search that finishes the block (the
    screened ones, at fewer micro-batches, are in :func:`_screen_orders`). Kept as a
    read-only array: a list of Python ints would take about ten times the
    memory in a long-lived service."""
    cells = _space(num_devices).cells[index].tolist()
    orders = np.asarray(build_orders(cells, num_microbatches), dtype=np.int64)
    orders.flags.writeable = False
    return orders


def v_adaptive(
    num_devices: int, num_microbatches: int, memory_limit: float, times: PassTimes
) -> Schedule:
    """The v-adaptive schedule for d devices, m micro-batches and ``memory_limit`` (a
    fraction of 1F1B's peak activation), searched under ``times``."""
    d, m = num_devices, num_microbatches
    require(d >= 2, f"v-adaptive: needs at least 2 devices (2 stages each), got {d}")
    require(m >= 1, f"v-adaptive: the number of micro-batches must be at least 1, got {m}")
    choice = v_adaptive_choice(d, m, memory_limit, times)
    block = choice.block
    block_spec = {
        "down": list(block.down),
        "up": list(block.up),
        "turn_forward": block.turn_forward,
        "turn_loss": block.turn_loss,
        "turn_backward": block.turn_backward,
    }
    meta = {
        "memory_limit": memory_limit,
        "peak_stage_activations": choice.peak_units,
        "peak_activation_fraction": choice.peak_units / (2 * d),
        "choice": {"memory_limit": memory_limit, "block": block_spec},
        "searched": {"within_limit": choice.candidates, "evaluated": choice.evaluated},
        "repeat_interval": REPEAT_INTERVAL,
    }
    return to_schedule("v-adaptive", choice.orders, m, meta)


def _build(p: int, m: int, params: Mapping[str, float], times: PassTimes) -> Schedule:
    return v_adaptive(p, m, float(params[MEMORY_LIMIT.name]), times)


def _rebuild(choice: Mapping[str, Any], num_devices: int, num_microbatches: int) -> Schedule:
    """The block a search chose (``choice``), repeated for ``num_microbatches``."""
    spec = choice["block"]
    block = VBlock(
        tuple(spec["down"]),
        tuple(spec["up"]),
        spec["turn_forward"],
        spec["turn_loss"],
        spec["turn_backward"],
    )
    cells = block.cells()
    assert cells is not None, "a chosen block never collides"
    require(
        len(block.down) == num_devices - 1,
        f"v-adaptive: the chosen block is for {len(block.down) + 1} devices, not {num_devices}",
    )
    orders = build_orders(cells, num_microbatches)
    peak = max(order_peaks(orders))
    meta = {
        "memory_limit": choice["memory_limit"],
        "peak_stage_activations": peak,
        "peak_activation_fraction": peak / (2 * num_devices),
        "choice": dict(choice),
        "repeat_interval": REPEAT_INTERVAL,
    }
    return to_schedule("v-adaptive", orders, num_microbatches, meta)


def _search_work(num_devices: int, num_microbatches: int) -> int:
    """Actions the search builds: its shortlist (two memory levels of at most about 60
    blocks each on any pipeline) with ``SCREEN_MICROBATCHES``, and the finalists with all
    micro-batches, each built twice (squeeze and reorder) and timed."""
    d, m = num_devices, num_microbatches
    per_microbatch = 3 * 6 * d
    screened = 120 * min(m, SCREEN_MICROBATCHES) * per_microbatch
    return screened + FINALISTS * m * per_microbatch


def _idle_at_limit(limit: float) -> float:
    """Ranking estimate of the idle time relative to 1F1B's: through Table 1's V-Min (1/3 of
    1F1B's memory, 4/6 of its bubble), V-Half (1/2, 3/6) and V-ZB (1, about 0, counted as
    one stage time in six), linear in between."""
    points = ((1 / 3, 4 / 6), (1 / 2, 3 / 6), (1.0, 1 / 6))
    if limit <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if limit <= x1:
            return y0 + (y1 - y0) * (limit - x0) / (x1 - x0)
    return points[-1][1]


register(
    ScheduleFamily(
        name="v-adaptive",
        listing=90,
        title="V-shape adaptive (any memory limit)",
        citation='Qi et al., "Pipeline Parallelism with Controllable Memory", 2024, Appendix A',
        build=_build,
        parameters=(MEMORY_LIMIT,),
        placement="v",
        split_backward=True,
        runtimes=frozenset({"stagewright", "torch"}),
        min_devices=2,
        idle_vs_1f1b=1 / 6,  # at its limit it searches the fewest bubbles; V-ZB's at 1
        memory_rule="at most the memory limit (a fraction of 1F1B's peak) on every device",
        uses_pass_times=True,
        rebuild=_rebuild,
        smallest_memory_limit=smallest_v_limit,
        search_work=_search_work,
        largest_memory_limit=largest_v_limit,
        idle_at_limit=_idle_at_limit,
    )
)
