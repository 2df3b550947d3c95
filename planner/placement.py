"""Placement: which GPU runs which (data, pipeline, tensor) coordinate.

Two assignments:

- ``standard`` (Megatron-LM's default order, tensor fastest, then data, then pipeline): a
  tensor-parallel group is t consecutive GPUs, so it stays inside a node whenever t divides
  the GPUs per node.
- ``pair-adjacent`` (BPipe §3.5, Figures 5 and 6): tensor fastest, then pipeline stages in
  pair order 0, p-1, 1, p-2, ..., then data; each evictor/acceptor pair sits on neighbouring
  GPUs, so on one node whenever a node holds at least 2 t GPUs, and the activation transfers
  use NVLink instead of the network. Data parallelism goes outermost, since it communicates
  once per step while pairs communicate every micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Literal

from planner.errors import StagewrightError

__all__ = ["Assignment", "Placement", "context_groups_within_nodes", "pair_order", "place"]

Assignment = Literal["standard", "pair-adjacent", "optimized"]


def pair_order(p: int) -> list[int]:
    """Pipeline stages in BPipe's pair-adjacent order: 0, p-1, 1, p-2, ..."""
    order: list[int] = []
    low, high = 0, p - 1
    while low <= high:
        order.append(low)
        if high != low:
            order.append(high)
        low, high = low + 1, high - 1
    return order


@dataclass(frozen=True)
class Placement:
    """rank -> (dp, pp, tp) for a (t, p, d) job on nodes of ``gpus_per_node`` GPUs."""

    t: int
    p: int
    d: int
    gpus_per_node: int
    assignment: Assignment
    coords: tuple[tuple[int, int, int], ...]  # indexed by global rank: (dp, pp, tp)

    def __hash__(self) -> int:
        return self._hash

    @cached_property
    def _hash(self) -> int:
        # The cost model caches by placement; hashing every coordinate of a 1,024-rank job
        # on each lookup cost more than the lookup saved.
        return hash((self.t, self.p, self.d, self.gpus_per_node, self.assignment, self.coords))

    @property
    def world_size(self) -> int:
        return self.t * self.p * self.d

    def rank_of(self, dp: int, pp: int, tp: int) -> int:
        return self._rank[(dp, pp, tp)]

    @cached_property
    def _rank(self) -> dict[tuple[int, int, int], int]:
        return {c: r for r, c in enumerate(self.coords)}

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def same_node(self, pp_a: int, pp_b: int, dp: int = 0, tp: int = 0) -> bool:
        """Whether two pipeline stages of one pipeline (and tensor rank) share a node."""
        rank = self._rank
        return self.node_of(rank[(dp, pp_a, tp)]) == self.node_of(rank[(dp, pp_b, tp)])

    @cached_property
    def tensor_groups_within_nodes(self) -> bool:
        rank = self._rank
        return all(
            len({self.node_of(rank[(dp, pp, tp)]) for tp in range(self.t)}) == 1
            for dp in range(self.d)
            for pp in range(self.p)
        )

    @cached_property
    def data_groups_within_nodes(self) -> bool:
        rank = self._rank
        return all(
            len({self.node_of(rank[(dp, pp, tp)]) for dp in range(self.d)}) == 1
            for pp in range(self.p)
            for tp in range(self.t)
        )

    def grid(self) -> list[str]:
        """One line per node: 'TP/DP/PP' of each GPU, as in the BPipe paper's Figure 6."""
        lines = []
        for node in range(self.world_size // self.gpus_per_node):
            cells = []
            for rank in range(node * self.gpus_per_node, (node + 1) * self.gpus_per_node):
                dp, pp, tp = self.coords[rank]
                cells.append(f"TP{tp}/DP{dp}/PP{pp}")
            lines.append(f"node {node}: " + " ".join(cells))
        return lines


def context_groups_within_nodes(t: int, cp: int, gpus_per_node: int) -> bool:
    """Whether every context-parallel group stays inside a node. Megatron-LM orders ranks
    tensor, context, data, pipeline (fastest first), so a tensor group and its cp - 1
    context peers are t x cp consecutive ranks: one node holds them when t x cp divides the
    GPUs per node (the planner places a cp > 1 candidate as ``place(t x cp, p, d)``)."""
    return gpus_per_node % (t * cp) == 0


@lru_cache(maxsize=512)
def place(
    t: int, p: int, d: int, gpus_per_node: int, assignment: Assignment = "standard"
) -> Placement:
    """Assign every rank a (dp, pp, tp) coordinate; see the module docstring."""
    world = t * p * d
    if world % gpus_per_node and world > gpus_per_node:
        raise StagewrightError(
            f"{world} ranks do not fill whole nodes of {gpus_per_node} GPUs; use a multiple of "
            f"{gpus_per_node} or one partial node"
        )
    coords: list[tuple[int, int, int]] = []
    if assignment == "standard":
        for pp in range(p):
            for dp in range(d):
                for tp in range(t):
                    coords.append((dp, pp, tp))
    elif assignment == "pair-adjacent":
        order = pair_order(p)
        for dp in range(d):
            for pp in order:
                for tp in range(t):
                    coords.append((dp, pp, tp))
    else:  # pragma: no cover - Literal guards it
        raise StagewrightError(f"unknown assignment {assignment!r}")
    return Placement(t, p, d, gpus_per_node, assignment, tuple(coords))
