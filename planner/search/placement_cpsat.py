"""Placement as an optimization: which node runs each (data replica, pipeline stage) group.

A *block* is one tensor-parallel group: the t GPUs of one (dp, pp) coordinate. Blocks are
never split across nodes (t divides the GPUs per node, so tensor parallelism, the most
talkative, always stays on NVLink). CP-SAT assigns blocks to nodes, ``gpus_per_node / t``
per node, minimising the bytes that cross nodes in one step:

- pipeline hops (stage s -> s + 1 of one replica): 2 m activations of one micro-batch;
- BPipe evictor/acceptor pairs: every EVICT and LOAD of the pair (the schedule counts them);
- data-parallel rings (replica r -> r + 1 of one stage): the gradient reduce-scatter and
  weight all-gather, once per step.

Within a node, blocks are laid out in pipeline order, pairs next to each other (BPipe's
pair-adjacent order), tensor ranks fastest. With BPipe's weights this reproduces the
paper's Figures 5 and 6 (tests).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from ortools.sat.python import cp_model

from planner.errors import StagewrightError
from planner.placement import Placement, pair_order

__all__ = ["PlacementResult", "PlacementWeights", "optimize_placement"]


@dataclass(frozen=True)
class PlacementWeights:
    """Bytes per step that cross a node boundary if the two ends are on different nodes."""

    pipeline_hop: float
    bpipe_pair: float  # per evictor/acceptor pair (0 when the schedule moves nothing)
    data_ring: float  # per neighbouring pair of data-parallel replicas of one stage


@dataclass(frozen=True)
class PlacementResult:
    """``placement`` is None when the solver found no assignment in its time limit (status
    "timed out"): large clusters (hundreds of nodes) can need longer than the budget allows,
    and the caller then keeps its default layout."""

    placement: Placement | None
    status: str
    cross_node_bytes: float


def optimize_placement(
    t: int,
    p: int,
    d: int,
    gpus_per_node: int,
    weights: PlacementWeights,
    *,
    time_limit_s: float = 1.0,
    seed: int = 0,
) -> PlacementResult:
    """Assign (dp, pp) blocks to nodes minimising cross-node bytes; see the module doc."""
    if gpus_per_node % t:
        raise StagewrightError(
            f"t = {t} does not divide {gpus_per_node} GPUs per node: a tensor-parallel group "
            f"would span nodes"
        )
    world = t * p * d
    per_node = min(gpus_per_node, world) // t  # blocks per node
    nodes = max(1, world // gpus_per_node)
    blocks = [(dp, pp) for dp in range(d) for pp in range(p)]
    model = cp_model.CpModel()
    node = {b: model.new_int_var(0, nodes - 1, f"node_{b[0]}_{b[1]}") for b in blocks}
    # Capacity: exactly per_node blocks on each node.
    for n in range(nodes):
        here = []
        for b in blocks:
            flag = model.new_bool_var(f"on_{b[0]}_{b[1]}_{n}")
            model.add(node[b] == n).only_enforce_if(flag)
            model.add(node[b] != n).only_enforce_if(flag.Not())
            here.append(flag)
        model.add(sum(here) == per_node)
    model.add(node[(0, 0)] == 0)  # symmetry: replica 0's first stage opens node 0
    edges: list[tuple[tuple[int, int], tuple[int, int], float]] = []
    for dp in range(d):
        for pp in range(p - 1):
            edges.append(((dp, pp), (dp, pp + 1), weights.pipeline_hop))
        if weights.bpipe_pair > 0:
            for pp in range(p // 2):
                edges.append(((dp, pp), (dp, p - 1 - pp), weights.bpipe_pair))
    for pp in range(p):
        for dp in range(d - 1):
            edges.append(((dp, pp), (dp + 1, pp), weights.data_ring))
    scale = max((w for _, _, w in edges), default=1.0) or 1.0
    cost = []
    for a, b, w in edges:
        same = model.new_bool_var(f"same_{a}_{b}")
        model.add(node[a] == node[b]).only_enforce_if(same)
        cost.append(round(1000 * w / scale) * (1 - same))
    model.minimize(sum(cost))
    # Start from the standard order (replicas after one another) so any answer beats it.
    for index, b in enumerate(sorted(blocks, key=lambda b: (b[0], b[1]))):
        model.add_hint(node[b], min(nodes - 1, index // per_node))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = os.cpu_count() or 1
    solver.parameters.random_seed = seed
    code = solver.solve(model)
    if code in (cp_model.INFEASIBLE, cp_model.MODEL_INVALID):  # pragma: no cover - a bug
        raise StagewrightError(f"placement: the model is {solver.status_name(code)}")
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return PlacementResult(None, "timed out", math.nan)
    status = "optimal" if code == cp_model.OPTIMAL else "feasible"
    raw = {b: solver.value(node[b]) for b in blocks}
    # Nodes are interchangeable: number them by the first block they hold, for reading.
    first_block = {n: min(blk for blk in blocks if raw[blk] == n) for n in set(raw.values())}
    renumber = {n: i for i, n in enumerate(sorted(first_block, key=first_block.__getitem__))}
    assigned = {blk: renumber[n] for blk, n in raw.items()}
    order = {stage: i for i, stage in enumerate(pair_order(p))}
    coords: list[tuple[int, int, int]] = []
    for n in range(nodes):
        members = sorted(
            (blk for blk in blocks if assigned[blk] == n),
            key=lambda blk: (blk[0], order[blk[1]]),
        )
        for dp, pp in members:
            coords.extend((dp, pp, tp) for tp in range(t))
    crossing = sum(w for one, two, w in edges if assigned[one] != assigned[two])
    placement = Placement(t, p, d, gpus_per_node, "optimized", tuple(coords))
    return PlacementResult(placement, status, crossing)
