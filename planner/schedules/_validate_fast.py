"""Rules 1-4 and 9 of the validator on a schedule's columns, all actions at once.

:func:`rules_hold` answers only whether they hold: when one does not, the validator's
per-action checks run to name the first violation with its message. Generators' schedules
always pass, so this is what a validation of a large schedule costs (the tests check that
both ways agree on every kind of violation).
"""

from __future__ import annotations

import numpy as np

from planner.schedules._ir import KIND_CODE, ActionKind, Schedule

__all__ = ["rules_hold"]

K = ActionKind
F, B, W, BW = (KIND_CODE[k] for k in (K.F, K.B, K.W, K.BW))
EVICT, LOAD, STEP = KIND_CODE[K.EVICT], KIND_CODE[K.LOAD], KIND_CODE[K.OPTIMIZER_STEP]
# Neighbour stage of each point-to-point kind's peer.
P2P_OFFSET = {KIND_CODE[K.SEND_F]: 1, KIND_CODE[K.RECV_F]: -1, KIND_CODE[K.SEND_B]: -1}
P2P_OFFSET[KIND_CODE[K.RECV_B]] = 1


def rules_hold(s: Schedule) -> bool:
    """Whether structure (1), placement (2), completeness (3), order (4) and optimizer
    steps (9) hold."""
    if not _structure_holds(s):
        return False
    c = s.columns
    num_stages, total = s.num_stages, s.total_microbatches
    if len(c.kind) == 0:
        return num_stages == 0
    if c.stage.min() < 0 or c.stage.max() >= num_stages:
        return False
    if c.microbatch.min() < 0 or c.microbatch.max() >= total:
        return False
    chunk_of = np.array([s.chunk_of(stage) for stage in range(num_stages)], dtype=np.int64)
    if (chunk_of[c.stage] != c.chunk).any():
        return False
    return _placement_holds(s) and _passes_hold(s)


def _structure_holds(s: Schedule) -> bool:
    if s.num_devices < 1 or len(s.actions) != s.num_devices:
        return False
    if s.num_microbatches < 1 or s.num_batches < 1 or not s.stage_devices:
        return False
    if any(not 0 <= d < s.num_devices for d in s.stage_devices):
        return False
    return set(s.stage_devices) == set(range(s.num_devices))


def _placement_holds(s: Schedule) -> bool:
    c = s.columns
    stage_devices = np.array(s.stage_devices, dtype=np.int64)
    owner = stage_devices[c.stage]
    transfer = (c.kind == EVICT) | (c.kind == LOAD)
    p2p = np.isin(c.kind, list(P2P_OFFSET))
    plain = ~(transfer | p2p)
    if (c.device[plain] != owner[plain]).any():
        return False
    if transfer.any():
        peer, device, own = c.peer[transfer], c.device[transfer], owner[transfer]
        if ((peer < 0) | (peer >= s.num_devices) | (peer == device)).any():
            return False
        if ((device != own) & (peer != own)).any():
            return False
    if p2p.any():
        if (c.device[p2p] != owner[p2p]).any():
            return False
        offset = np.vectorize(P2P_OFFSET.__getitem__, otypes=[np.int64])(c.kind[p2p])
        neighbour = c.stage[p2p] + offset
        if ((neighbour < 0) | (neighbour >= s.num_stages)).any():
            return False
        if (c.peer[p2p] != stage_devices[neighbour]).any():
            return False
    return True


def _passes_hold(s: Schedule) -> bool:
    """Rules 3, 4 and 9, given 1 and 2."""
    c = s.columns
    total = s.total_microbatches
    size = s.num_stages * total
    slot = c.stage * total + c.microbatch
    index = np.arange(len(c.kind), dtype=np.int64)
    position = {}
    for kind in (F, B, W, BW):
        mask = c.kind == kind
        counts = np.bincount(slot[mask], minlength=size)
        wanted = kind == F or (kind in (B, W)) == s.split_backward
        if (counts != (1 if wanted else 0)).any():
            return False
        where = np.full(size, -1, np.int64)
        where[slot[mask]] = index[mask]
        position[kind] = where
    # Rule 4: on its device (all of a stage's passes are, by rule 2), a backward after its
    # forward and a W after its B.
    first = B if s.split_backward else BW
    if (position[first] <= position[F]).any():
        return False
    if s.split_backward and (position[W] <= position[B]).any():
        return False
    return _steps_hold(s, position[W if s.split_backward else BW])


def _steps_hold(s: Schedule, backward_at: np.ndarray) -> bool:
    """Rule 9: each stage steps once per batch, after every backward of that batch."""
    c = s.columns
    m, batches, stages = s.num_microbatches, s.num_batches, s.num_stages
    step = np.flatnonzero(c.kind == STEP)
    if (np.bincount(c.stage[step], minlength=stages) != batches).any():
        return False
    # The last backward (W or BW) of each (stage, batch).
    per_pass = backward_at.reshape(stages, s.total_microbatches)
    last = per_pass.reshape(stages, batches, m).max(axis=2).reshape(-1)
    key = c.stage[step] * batches + c.microbatch[step] // m
    if (last[key] >= step).any():
        return False
    # Each batch stepped once per stage (counted above): no batch twice, none missing.
    seen = np.bincount(key, minlength=stages * batches)
    return bool((seen == 1).all())
