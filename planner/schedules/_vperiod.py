"""Long runs of a fixed V schedule from one short build.

Past its warm-up and until its cool-down a V order repeats one period: six passes a device,
one micro-batch. So the orders for m micro-batches are those for a smaller m0 with m - m0
periods inserted, which costs a few array operations where a build squeezes and scans every
pass (:func:`~planner.schedules._vframe.build_orders`).

Labels. On device i, pass code j of micro-batch k is the label (k, j); L + 1 is (k + 1, j).
Inserting r periods at position q of a device's order A (of 6 m0 passes) gives

    A[:q] + (A[q-6:q] + 1) + (A[q-6:q] + 2) + ... + (A[q-6:q] + r) + (A[q:] + r)

and ``Pre`` is the set of labels at positions before q (q per device).

**Claim.** build(m0 + r) = insert_r(build(m0), q) for every r >= 0 when the build at m0 and
q pass the checks of :func:`insertion_cut`. The build is repeat, fill the warm-up, then the
cool-down (:func:`~planner.schedules._vframe.build_stages`: R, F, then C from the kept
orders K); each step is argued to commute with the insertion:

1. *Repeat.* R sorts the passes by cell c_j + 6 k. If R[q-6:q] fill six consecutive cells
   [s - 6, s) (a period), the passes of m0 + 1 micro-batches before s are the same, the next
   six cells hold R[q-6:q] + 1 and the cells after them R[q:] + 1. Checked: the window's
   cells are consecutive.
2. *Squeeze* (used by 3 and 4). A squeezed cell is t(x) = max(t(x's predecessor on its
   device) + 1, t(x's input) + 1, 0): it depends only on the passes before x on its device
   and on its inputs, transitively. (a) So if Pre is closed under inputs (checked), its
   cells are the same in any orders that begin with Pre. (b) Let B = insert_1(A, q) and give
   its labels the cells t_A(L) on Pre and t_A(L - 1) + 6 after (B's passes from q on are A's
   from q - 6 on, one micro-batch later). These satisfy B's recursion wherever A's cells
   satisfy A's, but for two kinds of edge, both checked: B[q] follows A[q-1] where A[q-6]
   followed A[q-7], so t(A[q-1]) = t(A[q-7]) + 6; and a pass from q on whose input (k + 1, j)
   is in Pre, where A's pass had (k, j), needs t(k + 1, j) = t(k, j) + 6, checked for every
   Pre label of each (device, code) from the lowest micro-batch such an input has there.
   The recursion has one solution (finite cells: B has no cycle), so these are B's cells.
   B passes the same checks at the same q (same Pre and cells there; its passes from q - 6
   on are of the same or later micro-batches), so r insertions follow by induction.
3. *Warm-up fill.* The scan visits only cells before each device's first B, and moves there
   the first forward of a chunk after the cell. If the last forward of each chunk in Pre (in
   the window A[q-6:q]) stays after the device's first B in the build at m0, it never moved,
   so every forward the scan looks at is in Pre, as are its input and the cells it jumps
   (a device's later passes are in later cells): by 2(a) the fill makes the same moves for
   every r and leaves the passes from q on as repeated. Its memory bound, the repeated
   order's peak, is the same: a period holds two forwards and two Ws, so inserting one
   repeats the levels of the window. Checked: Pre closed under inputs, the first B before
   q - 6, and F equal to R from q - 6 on (so the window is R's).
4. *Cool-down.* It drops the Ws after each device's last F: with the last F at or after q
   (checked), the inserted Ws are kept and the dropped ones are A's shifted. It squeezes
   the rest (2(b) on K). It places each dropped W in the first idle cell after its B: with
   those Bs at or after q (checked), every cell involved is shifted by 6 r and every index
   into the idle cells by a constant per device, so the placement is the same, shifted.

Equal orders make the same schedule, columns and JSON: the generator reads nothing else
(:func:`~planner.schedules._vcolumns.to_schedule`).

What is argued and what is tested. The four steps are argued above; every property they
rest on is checked at run time on the build at m0 (:func:`insertion_cut`), and when one
fails no period is inserted (the caller builds in full). So is that every code's passes run
in micro-batch order (then Pre holds micro-batches 0..a-1 of each code, the window the last
of them, and the inserted orders every label once). The claim also rests on the fill's
contract that its cut-short scan equals the whole one (``tests/unit/test_vshape.py``). The
counts m0 from which the checks pass are empirical, per family
(:func:`planner.schedules._vshape.periodic_from`: the smallest for every p from 2 to 40, 48
and 64), and the tests compare the inserted orders with full builds for every m from m0 to
3 p + 4.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.schedules._vframe import (
    B0,
    B1,
    F1,
    PASSES,
    REPEAT_INTERVAL,
    W0,
    BuildStages,
    build_stages,
    dependencies,
)

__all__ = ["PeriodicOrders", "insertion_cut", "periodic_orders"]


@dataclass(frozen=True)
class PeriodicOrders:
    """A V build at ``microbatches`` (m0) micro-batches and the positions (``cut``, one per
    device) where inserting periods gives the build at any m >= m0 (module docstring)."""

    labels: np.ndarray
    """(devices, 6 m0): each device's order, as 6 k + j (micro-batch k, pass code j)."""
    microbatches: int
    cut: np.ndarray

    def orders(self, num_microbatches: int) -> np.ndarray:
        """The orders for m >= m0 micro-batches, as pass ids (devices, 6 m)."""
        m, r = num_microbatches, num_microbatches - self.microbatches
        if r < 0:
            raise ValueError(f"orders for {m} micro-batches from a build at {self.microbatches}")
        d = len(self.cut)
        position = np.arange(PASSES * m)
        q = self.cut[:, None]
        inserted = (position >= q) & (position < q + PASSES * r)
        after = position >= q + PASSES * r
        # Inserted period s (1..r) repeats the window A[q-6:q] s micro-batches later; the
        # passes after the periods are A's from q on, r micro-batches later.
        window = q - PASSES + (position - q) % PASSES
        source = np.where(inserted, window, np.where(after, position - PASSES * r, position))
        later = np.where(inserted, (position - q) // PASSES + 1, np.where(after, r, 0))
        labels = np.take_along_axis(self.labels, source, axis=1) + PASSES * later
        return labels + (np.arange(d, dtype=np.int64) * m * PASSES)[:, None]  # type: ignore[no-any-return]


def periodic_orders(cells: list[list[int]], num_microbatches: int) -> PeriodicOrders | None:
    """Build the block's orders at m0 = ``num_microbatches`` and find where periods can be
    inserted (:func:`insertion_cut`); None when the build at m0 does not show it."""
    m0 = num_microbatches
    stages = build_stages(cells, m0)
    cut = insertion_cut(cells, m0, stages)
    if cut is None:
        return None
    d = len(cells)
    labels = stages.orders - (np.arange(d, dtype=np.int64) * m0 * PASSES)[:, None]
    labels.flags.writeable = False  # shared by every caller of a cached instance
    cut.flags.writeable = False
    return PeriodicOrders(labels, m0, cut)


def insertion_cut(
    cells: list[list[int]], num_microbatches: int, stages: BuildStages
) -> np.ndarray | None:
    """Per device, a position q where periods can be inserted into the orders built at m0
    (``stages``), by every check of the module docstring's argument; None if there is none.
    Takes the latest positions each device allows, then lowers them until Pre is closed
    under inputs."""
    m, filled = num_microbatches, stages.filled
    position = np.empty(filled.size, np.int64)  # of every pass id in its device's order
    position[filled] = np.broadcast_to(np.arange(filled.shape[1]), filled.shape)
    inputs = np.asarray(dependencies(len(filled), m)[0], dtype=np.int64)
    allowed = _device_cuts(cells, m, stages, position)
    cut = _largest_closed_cut(allowed, filled, m, position, inputs)
    if cut is None or not _inputs_periodic(stages, m, cut, position, inputs):
        return None
    return cut


def _device_cuts(
    cells: list[list[int]], m: int, stages: BuildStages, position: np.ndarray
) -> np.ndarray:
    """(devices, 6 m + 1): whether each position q of a device passes the checks that
    involve that device alone (steps 1, 3 and 4 and 2(b)'s t(A[q-1]) = t(A[q-7]) + 6).
    ``position``: of every pass id in the filled orders."""
    repeated, filled = stages.repeated, stages.filled
    d, width = filled.shape
    q = np.arange(width + 1)
    allowed = np.zeros((d, width + 1), bool)
    # Step 1: the window R[q-6:q] fills six consecutive cells of the repeated block.
    rows = np.asarray(cells, dtype=np.int64)
    at = np.take_along_axis(rows, repeated % PASSES, axis=1)
    at += REPEAT_INTERVAL * (repeated // PASSES % m)
    allowed[:, PASSES:] = at[:, PASSES - 1 :] - at[:, : width - PASSES + 1] == PASSES - 1
    # Step 3: the fill leaves the window and what follows as repeated ...
    same = filled == repeated
    agrees_from = np.ones((d, width + 1), bool)  # [i, s]: F[i, s:] == R[i, s:]
    agrees_from[:, :width] = np.logical_and.accumulate(same[:, ::-1], axis=1)[:, ::-1]
    allowed[:, PASSES:] &= agrees_from[:, : width - PASSES + 1]
    # ... and the window's forwards after the first B (never moved).
    code = filled % PASSES
    first_b = ((code == B1) | (code == B0)).argmax(axis=1)
    allowed &= q - PASSES > first_b[:, None]
    # Step 4: the last F at or after q, and the B of every dropped W.
    last_f = width - 1 - (code[:, ::-1] <= F1).argmax(axis=1)
    latest = last_f.copy()
    device, column = np.nonzero(stages.dropped)
    w = filled[device, column]
    its_b = w - w % PASSES + np.where(w % PASSES == W0, B0, B1)
    np.minimum.at(latest, device, position[its_b])
    allowed &= q <= latest[:, None]
    # Step 2(b) on the kept orders, which are the filled ones before the last F.
    t = stages.squeezed[filled]
    allowed[:, : PASSES + 1] = False
    allowed[:, PASSES + 1 :] &= t[:, PASSES:] - t[:, :-PASSES] == REPEAT_INTERVAL
    return allowed


def _largest_closed_cut(
    allowed: np.ndarray, filled: np.ndarray, m: int, position: np.ndarray, inputs: np.ndarray
) -> np.ndarray | None:
    """Per device, the largest allowed position such that the passes before these positions
    are closed under inputs (step 2(a)); None if there is none. Lowering a device's position
    can only exclude passes other devices' passes need, so the positions only fall, until no
    pass before them waits for one after. ``inputs``: of every pass id (-1: none)."""
    d, width = filled.shape
    needs = inputs[filled]
    has_input = needs >= 0
    source = np.maximum(needs, 0)
    input_position = position[source]
    input_device = source // (m * PASSES)
    columns = np.arange(width + 1)
    cut = np.full(d, width)
    while True:
        # The largest allowed position at or below the current one ...
        below = allowed & (columns <= cut[:, None])
        if not below.any(axis=1).all():
            return None
        lowered = width - below[:, ::-1].argmax(axis=1)
        # ... and below the first pass whose input is past its device's position.
        waits = has_input & (input_position >= lowered[input_device])
        waits &= columns[:-1] < lowered[:, None]
        lowered = np.where(waits.any(axis=1), np.minimum(lowered, waits.argmax(axis=1)), lowered)
        if (lowered == cut).all():
            return cut
        cut = lowered


def _inputs_periodic(
    stages: BuildStages, m: int, cut: np.ndarray, position: np.ndarray, inputs: np.ndarray
) -> bool:
    """Step 2(b)'s cells of Pre, and that every code's passes run in micro-batch order (so
    Pre holds micro-batches 0..a-1 of each code and the window the last of them: the
    inserted orders hold every label once)."""
    filled = stages.filled
    d, width = filled.shape
    at = position.reshape(d, m, PASSES)  # [i, k, j]: where label (k, j) runs on device i
    if (np.diff(at, axis=1) <= 0).any():
        return False
    held = (at < cut[:, None, None]).sum(axis=1)  # a: micro-batches of each code in Pre
    # The lowest micro-batch of an input of a pass at or after q - 6, per (device, code).
    needed = inputs[filled[np.arange(width) >= cut[:, None] - PASSES]]
    needed = needed[needed >= 0]
    lowest = np.full((d, PASSES), m)
    np.minimum.at(lowest, (needed // (m * PASSES), needed % PASSES), needed // PASSES % m)
    # Pre's cells of those labels step by 6 from there on.
    cell = stages.squeezed[: d * m * PASSES].reshape(d, m, PASSES)
    step = cell[:, 1:] - cell[:, :-1]  # [i, k, j]: t(k + 1) - t(k)
    micro = np.arange(m - 1)[None, :, None]
    checked = (micro >= lowest[:, None, :]) & (micro + 1 < held[:, None, :])
    return bool((step[checked] == REPEAT_INTERVAL).all())
