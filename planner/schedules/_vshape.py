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

Steps 2-4 live in :mod:`planner.schedules._vframe`, shared with the adaptive search.

Table 9's columns name the two backward chains the other way round from Appendix A's
notation; we follow §3.1, whose assignment is the one that balances memory (with the table's
literal reading V-Half would hold 4/6 of 1F1B's memory on device 1 and 2/6 on device d).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from itertools import product

import numpy as np

from planner.errors import ScheduleConfigError
from planner.schedules._basic import require
from planner.schedules._inflight import InflightProfile
from planner.schedules._ir import ActionKind, Schedule
from planner.schedules._registry import ScheduleFamily, register
from planner.schedules._vcolumns import order_profile, to_schedule
from planner.schedules._vframe import (
    CHUNK,
    PASSES,
    REPEAT_INTERVAL,
    VBlock,
    build_orders,
    build_stages,
    require_block,
)
from planner.schedules._vperiod import PeriodicOrders, periodic_orders

__all__ = [
    "VSHAPE_NAMES",
    "BlockOffsets",
    "block_offsets",
    "building_block",
    "periodic_from",
    "vshape",
    "vshape_profile",
]

VSHAPE_NAMES = ("v-min", "v-half", "v-zb")
_DELTAS = {"v-min": (1, 1), "v-half": (2, 1), "v-zb": (4, 2)}
_KINDS = (ActionKind.F, ActionKind.F, ActionKind.B, ActionKind.B, ActionKind.W, ActionKind.W)

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

    def block(self, num_devices: int) -> VBlock:
        steps = num_devices - 1
        return VBlock(
            (self.delta0,) * steps,
            (self.delta1,) * steps,
            self.turn_forward,
            self.turn_loss,
            self.turn_backward,
        )


@lru_cache(maxsize=256)
def block_offsets(name: str, num_devices: int) -> BlockOffsets:
    """The building block's offsets for ``name`` on d devices (Appendix F, Tables 8 and 9).
    Cached: V-ZB's are searched for (30 to 300 us), and every build of a V schedule, of
    its in-flight profile or of its periodic base asks for them."""
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
        if offsets.block(d).cells() is not None:
            return offsets
    raise ScheduleConfigError(f"{name}: no collision-free building block for {d} devices")


def building_block(offsets: BlockOffsets, num_devices: int) -> dict[Cell, int]:
    """Cell of every pass of one micro-batch (devices 0-indexed here); a colliding block
    is an error."""
    cells = require_block(offsets.block(num_devices), "building block")
    return {(i, CHUNK[j], _KINDS[j]): row[j] for i, row in enumerate(cells) for j in range(PASSES)}


def vshape(name: str, num_devices: int, num_microbatches: int, reorder: bool = True) -> Schedule:
    """Build V-Min, V-Half or V-ZB for d devices and m micro-batches (see module docstring).
    ``reorder=False`` stops after squeezing (step 3), to see what Appendix C's reordering buys."""
    d, m = num_devices, num_microbatches
    _require_counts(name, d, m)
    offsets = block_offsets(name, d)
    cells = require_block(offsets.block(d), name)
    orders = _orders(name, cells, m, reorder)
    lifespan = max(row[w] - row[f] + 1 for row in cells for f, w in ((0, 4), (1, 5)))
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
    return to_schedule(name, orders, m, meta)


def vshape_profile(name: str, num_devices: int, num_microbatches: int) -> InflightProfile:
    """The in-flight profile of ``vshape(name, d, m)``, read off its orders without making
    the schedule (:func:`~planner.schedules._vcolumns.order_profile`): what the memory model
    counts from, for a fraction of the cost."""
    d, m = num_devices, num_microbatches
    _require_counts(name, d, m)
    cells = require_block(block_offsets(name, d).block(d), name)
    return order_profile(_orders(name, cells, m, reorder=True))


def _require_counts(name: str, d: int, m: int) -> None:
    require(name in _DELTAS, f"unknown V-shape schedule {name!r}; choose from {VSHAPE_NAMES}")
    require(d >= 2, f"{name}: needs at least 2 devices (2 stages each), got {d}")
    require(m >= 1, f"{name}: the number of micro-batches must be at least 1, got {m}")


def _orders(
    name: str, cells: list[list[int]], m: int, reorder: bool
) -> list[list[int]] | np.ndarray:
    """Each device's pass ids in :func:`vshape`'s schedule of ``name`` for m micro-batches,
    from its building block's ``cells``: longer runs by inserting periods into one shorter
    build (:mod:`._vperiod`), the others built in full."""
    if not reorder:
        return build_orders(cells, m, reorder=False)
    d = len(cells)
    periodic = _periodic(name, d) if m >= periodic_from(name, d) else None
    return build_stages(cells, m).orders if periodic is None else periodic.orders(m)


# Micro-batches from which a build shows where its orders repeat (its warm-up is done and
# its cool-down not begun), so that longer runs insert periods into it (:mod:`._vperiod`).
# Like ``inflight_saturation``, established by building: the smallest count at which
# ``periodic_orders`` finds a cut, for every p from 2 to 40, 48 and 64 (the tests check the
# inserted orders against full builds). A run check makes every insertion safe; these only
# decide which build is tried, and where it fails the runs are built in full.
_PERIODIC_FROM: dict[str, Callable[[int], int]] = {
    "v-min": lambda p: max(4, -(-(2 * p + 4) // 3)),
    "v-half": lambda p: p + 2 - p % 2,
    "v-zb": lambda p: 2 * p,
}


def periodic_from(name: str, num_devices: int) -> int:
    """The micro-batches of the build that longer runs of ``name`` on p devices are made from
    by inserting periods (see ``_PERIODIC_FROM``)."""
    return _PERIODIC_FROM[name](num_devices)


@lru_cache(maxsize=32)
def _periodic(name: str, num_devices: int) -> PeriodicOrders | None:
    """The build at ``periodic_from`` micro-batches with where to insert periods into it,
    shared by every longer run of (name, p); None if the build does not show it (then
    every run is built in full)."""
    d = num_devices
    cells = require_block(block_offsets(name, d).block(d), name)
    return periodic_orders(cells, periodic_from(name, d))


def _register(
    name: str,
    title: str,
    idle: float,
    saturation: Callable[[int], int],
    memory: str,
    listing: int,
) -> None:
    register(
        ScheduleFamily(
            name=name,
            listing=listing,
            title=title,
            citation='Qi et al., "Pipeline Parallelism with Controllable Memory", 2024',
            build=lambda p, m, _, __: vshape(name, p, m),
            inflight=lambda p, m, _: vshape_profile(name, p, m),
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
# here as one stage time in six). In-flight profiles stop changing after 2p // 3 + 1
# micro-batches (V-Min), p + 1 (V-Half) or 2p (V-ZB), found by building each with more:
# V-Min's holds for every p from 2 to 33 and at 40, 48 and 64 (p + 1 before, loose by a
# third); at p = 2-10, 12, 13, 16, 20, 24 and 32 V-Min's and V-Half's are the least that
# hold and V-ZB's one above it (tests/unit/test_inflight_caps.py checks each cap).
_register(
    "v-min", "V-Min", 4 / 6, lambda p: 2 * p // 3 + 1, "about 1/3 of 1F1B's peak (Table 1)", 50
)
_register("v-half", "V-Half", 3 / 6, lambda p: p + 1, "about 1/2 of 1F1B's peak (Table 1)", 60)
_register("v-zb", "V-ZB", 1 / 6, lambda p: 2 * p, "1F1B's peak, about zero bubble (Table 1)", 70)
