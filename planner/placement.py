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
Coords = tuple[int, int, int]  # (dp, pp, tp)


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
    """rank -> (dp, pp, tp) for a (t, p, d) job on nodes of ``gpus_per_node`` GPUs.

    The standard and pair-adjacent assignments are formulas (:meth:`rank_of`): what the
    cost model asks of them (which node a stage is on, whether groups stay inside nodes) is
    worked out from those, and their :attr:`coords` are listed only when read (launch
    artefacts). An optimized assignment lists every rank's coordinates (``listed``)."""

    t: int
    p: int
    d: int
    gpus_per_node: int
    assignment: Assignment
    listed: tuple[Coords, ...] | None = None
    """The optimized assignment's (dp, pp, tp) by global rank; None for the two formulas."""

    def __post_init__(self) -> None:
        if (self.listed is None) != (self.assignment != "optimized"):
            raise StagewrightError("an optimized placement lists its ranks; the others do not")

    def __hash__(self) -> int:
        return self._hash

    @cached_property
    def _hash(self) -> int:
        # The cost model caches by placement: hash once, not on every lookup.
        return hash((self.t, self.p, self.d, self.gpus_per_node, self.assignment, self.listed))

    @cached_property
    def coords(self) -> tuple[Coords, ...]:
        """(dp, pp, tp) of every global rank, in rank order."""
        if self.listed is not None:
            return self.listed
        t, d = range(self.t), range(self.d)
        if self.assignment == "standard":
            return tuple((dp, pp, tp) for pp in range(self.p) for dp in d for tp in t)
        return tuple((dp, pp, tp) for dp in d for pp in pair_order(self.p) for tp in t)

    @property
    def world_size(self) -> int:
        return self.t * self.p * self.d

    def rank_of(self, dp: int, pp: int, tp: int) -> int:
        """The global rank at (dp, pp, tp): tensor ranks fastest in both formulas, then data
        replicas and pipeline stages (standard) or stages in pair order and replicas
        (pair-adjacent)."""
        if self.listed is not None:
            return self._rank[(dp, pp, tp)]
        if self.assignment == "standard":
            return (pp * self.d + dp) * self.t + tp
        return (dp * self.p + self._pair_position[pp]) * self.t + tp

    @cached_property
    def _rank(self) -> dict[Coords, int]:
        return {c: r for r, c in enumerate(self.coords)}

    @cached_property
    def _pair_position(self) -> list[int]:
        """Per stage, its place in :func:`pair_order`."""
        position = [0] * self.p
        for i, stage in enumerate(pair_order(self.p)):
            position[stage] = i
        return position

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def same_node(self, pp_a: int, pp_b: int, dp: int = 0, tp: int = 0) -> bool:
        """Whether two pipeline stages of one pipeline (and tensor rank) share a node."""
        return self.node_of(self.rank_of(dp, pp_a, tp)) == self.node_of(self.rank_of(dp, pp_b, tp))

    @cached_property
    def tensor_groups_within_nodes(self) -> bool:
        t, p, d = self.t, self.p, self.d
        if self.listed is None:  # a group's ranks rise with tp: its ends say (see _one_node)
            return all(
                self._one_node((dp, pp, 0), (dp, pp, t - 1)) for dp in range(d) for pp in range(p)
            )
        return all(
            self._one_node(*[(dp, pp, tp) for tp in range(t)]) for dp in range(d) for pp in range(p)
        )

    @cached_property
    def data_groups_within_nodes(self) -> bool:
        t, p, d = self.t, self.p, self.d
        if self.listed is None:  # a group's ranks rise with dp: its ends say (see _one_node)
            return all(
                self._one_node((0, pp, tp), (d - 1, pp, tp)) for pp in range(p) for tp in range(t)
            )
        return all(
            self._one_node(*[(dp, pp, tp) for dp in range(d)]) for pp in range(p) for tp in range(t)
        )

    def _one_node(self, *group: Coords) -> bool:
        """Whether the ranks at these coordinates share a node. A node holds consecutive
        ranks: of ranks that rise along a group, the first and last are on one node only if
        every rank between them is."""
        return len({self.node_of(self.rank_of(*at)) for at in group}) == 1

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
    if assignment not in ("standard", "pair-adjacent"):  # pragma: no cover - Literal guards it
        raise StagewrightError(f"unknown assignment {assignment!r}")
    return Placement(t, p, d, gpus_per_node, assignment)
