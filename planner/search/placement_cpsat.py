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

The model has one Boolean per (block, node), which a large cluster makes too big to build
and solve in the planner's budget (a 1,024-GPU job: up to 1,024 blocks on 128 nodes). So
every tiling of the (replica, stage) grid into nodes is priced first (a handful, any size);
the cheapest starts CP-SAT on small clusters and is the answer on large ones.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ortools.sat.python import cp_model

from planner.errors import StagewrightError
from planner.placement import Placement, pair_order, place

__all__ = [
    "MAX_MODEL_CELLS",
    "PlacementResult",
    "PlacementWeights",
    "optimize_placement",
    "structured_layouts",
]


@dataclass(frozen=True)
class PlacementWeights:
    """Bytes per step that cross a node boundary if the two ends are on different nodes."""

    pipeline_hop: float
    bpipe_pair: float  # per evictor/acceptor pair (0 when the schedule moves nothing)
    data_ring: float  # per neighbouring pair of data-parallel replicas of one stage


@dataclass(frozen=True)
class PlacementResult:
    """``status``: "optimal" / "feasible" (CP-SAT's), or, when CP-SAT is not run or finds
    nothing in time, "too large" / "timed out" with the best structured layout (see
    :func:`structured_layouts`). ``cross_node_bytes`` is what the placement sends across
    nodes per step."""

    placement: Placement
    status: str
    cross_node_bytes: float


Block = tuple[int, int]  # (dp, pp): one tensor-parallel group
Edge = tuple[Block, Block, float]

# Above this many (block, node) pairs CP-SAT is not tried: building the model alone would
# take longer than the planner's budget (1,024 blocks on 128 nodes took 1.4 s to build).
MAX_MODEL_CELLS = 4096


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
    """Assign (dp, pp) blocks to nodes minimising cross-node bytes; see the module doc.
    CP-SAT starts from the best structured layout (the two default layouts included), which
    is also the answer when the model is too large or finds nothing in time, so the result
    is never worse than it."""
    if gpus_per_node % t:
        raise StagewrightError(
            f"t = {t} does not divide {gpus_per_node} GPUs per node: a tensor-parallel group "
            f"would span nodes"
        )
    world = t * p * d
    per_node = min(gpus_per_node, world) // t  # blocks per node
    nodes = max(1, world // gpus_per_node)
    blocks = [(dp, pp) for dp in range(d) for pp in range(p)]
    edges = _edges(p, d, weights)
    defaults = [_node_map(place(t, p, d, gpus_per_node, a)) for a in ("standard", "pair-adjacent")]
    start = min(structured_layouts(p, d, per_node) + defaults, key=lambda a: _crossing(a, edges))

    def result(assigned: dict[Block, int], status: str) -> PlacementResult:
        return PlacementResult(
            _layout(t, p, d, gpus_per_node, nodes, assigned), status, _crossing(assigned, edges)
        )

    if len(blocks) * nodes > MAX_MODEL_CELLS:
        return result(start, "too large")
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
    model.add(node[(0, 0)] == start[(0, 0)])  # symmetry: nodes are interchangeable
    scale = max((w for _, _, w in edges), default=1.0) or 1.0
    cost = []
    for a, b, w in edges:
        same = model.new_bool_var(f"same_{a}_{b}")
        model.add(node[a] == node[b]).only_enforce_if(same)
        cost.append(round(1000 * w / scale) * (1 - same))
    model.minimize(sum(cost))
    for b in blocks:
        model.add_hint(node[b], start[b])
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = os.cpu_count() or 1
    solver.parameters.random_seed = seed
    code = solver.solve(model)
    if code in (cp_model.INFEASIBLE, cp_model.MODEL_INVALID):  # pragma: no cover - a bug
        raise StagewrightError(f"placement: the model is {solver.status_name(code)}")
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return result(start, "timed out")
    solved = {b: solver.value(node[b]) for b in blocks}
    if _crossing(solved, edges) > _crossing(start, edges):  # pragma: no cover - rounding
        return result(start, "feasible")
    return result(solved, "optimal" if code == cp_model.OPTIMAL else "feasible")


def structured_layouts(p: int, d: int, per_node: int) -> list[dict[Block, int]]:
    """Block -> node for every tiling of the (replica, stage) grid into nodes of
    ``per_node`` blocks: a tile is ``a`` stages of ``b`` replicas (a x b = per_node, a
    dividing p, b dividing d), stages taken in pipeline order or in BPipe's pair order.
    Megatron's layout (a = 1: replicas of one stage together) and BPipe's pair-adjacent one
    (b = 1, pair order) are among them when the sizes divide. Cheap at any cluster size.
    Empty when no tiling fits; :func:`optimize_placement` prices the default layouts too."""
    layouts = []
    for order in (list(range(p)), pair_order(p)):
        for a in range(1, min(per_node, p) + 1):
            b = per_node // a
            if a * b != per_node or p % a or d % b:
                continue
            assigned: dict[Block, int] = {}
            node = 0
            for first_stage in range(0, p, a):
                for first_replica in range(0, d, b):
                    for pp in order[first_stage : first_stage + a]:
                        for dp in range(first_replica, first_replica + b):
                            assigned[(dp, pp)] = node
                    node += 1
            layouts.append(assigned)
    return layouts


def _node_map(placement: Placement) -> dict[Block, int]:
    """Block -> node of an existing placement."""
    out: dict[Block, int] = {}
    for rank, (dp, pp, _) in enumerate(placement.coords):
        out.setdefault((dp, pp), rank // placement.gpus_per_node)
    return out


def _edges(p: int, d: int, weights: PlacementWeights) -> list[Edge]:
    edges: list[Edge] = []
    for dp in range(d):
        for pp in range(p - 1):
            edges.append(((dp, pp), (dp, pp + 1), weights.pipeline_hop))
        if weights.bpipe_pair > 0:
            for pp in range(p // 2):
                edges.append(((dp, pp), (dp, p - 1 - pp), weights.bpipe_pair))
    for pp in range(p):
        for dp in range(d - 1):
            edges.append(((dp, pp), (dp + 1, pp), weights.data_ring))
    return edges


def _crossing(assigned: dict[Block, int], edges: list[Edge]) -> float:
    """Bytes per step between blocks on different nodes."""
    return sum(w for one, two, w in edges if assigned[one] != assigned[two])


def _layout(
    t: int, p: int, d: int, gpus_per_node: int, nodes: int, raw: dict[Block, int]
) -> Placement:
    """Ranks from a block -> node map: nodes numbered by the first block they hold (they are
    interchangeable), blocks inside a node by replica then pair order, tensor ranks
    fastest."""
    first_block: dict[int, Block] = {}
    for blk in sorted(raw):
        first_block.setdefault(raw[blk], blk)
    renumber = {n: i for i, n in enumerate(sorted(first_block, key=first_block.__getitem__))}
    order = {stage: i for i, stage in enumerate(pair_order(p))}
    members: list[list[Block]] = [[] for _ in range(nodes)]
    for blk, n in raw.items():
        members[renumber[n]].append(blk)
    coords: list[tuple[int, int, int]] = []
    for held in members:
        for dp, pp in sorted(held, key=lambda blk: (blk[0], order[blk[1]])):
            coords.extend((dp, pp, tp) for tp in range(t))
    return Placement(t, p, d, gpus_per_node, "optimized", tuple(coords))
