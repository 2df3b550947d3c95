"""The orders in which each runtime numbers its ranks, and whether one of them realizes the
placement a candidate was priced under.

torchrun numbers ranks node by node (global rank = node rank x processes per node + local
rank), so the order in which a runtime gives ranks their (data, pipeline, tensor)
coordinates decides which coordinates share a node. That is all of a placement the cost
model prices (pipeline hops, BPipe pairs, tensor and data groups: inside a node or across
nodes), so a runtime realizes a placement when one of its orders puts the same coordinates
on every node (which node is which does not matter: nodes are interchangeable).

- stagewright's executor reads every rank's coordinates from its config (``placement``):
  it realizes any placement.
- Megatron-LM (``RankGenerator`` in ``megatron/core/parallel_state.py``, the order passed by
  ``megatron/training/initialize.py``, at :data:`planner.launch.megatron.MEGATRON_COMMIT`)
  numbers ranks ``tp-cp-ep-dp-pp`` (tensor fastest, then context, data, pipeline), or
  ``tp-cp-ep-pp-dp`` with ``--use-tp-pp-dp-mapping``; no argument takes any other map.
- torch.distributed.pipelining gets the schedule by pipeline rank (the plan's CSV, row i for
  a pipeline's rank i) and the ranks from the script's device mesh: ``init_device_mesh``
  numbers them row-major (the last dimension fastest), and a mesh's process groups number
  their members by increasing global rank (``new_group`` and ``split_group`` sort them).
  Dimensions (pp, dp, tp) give Megatron-LM's default order, (dp, pp, tp) its other one.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from planner.placement import Coords, Placement
from planner.schedules import Runtime

__all__ = [
    "MEGATRON_ORDER_FLAG",
    "RankOrder",
    "order_coords",
    "order_note",
    "order_problem",
    "realizing_order",
]

RankOrder = Literal["tp-dp-pp", "tp-pp-dp"]
"""Megatron-LM's two orders (context ranks, when cp > 1, right after the tensor ranks)."""

_ORDERS: tuple[RankOrder, ...] = ("tp-dp-pp", "tp-pp-dp")  # the default first

MEGATRON_ORDER_FLAG = "--use-tp-pp-dp-mapping"
"""Megatron-LM's switch from its default order to tp-pp-dp."""

_TORCH_MESH: dict[RankOrder, str] = {"tp-dp-pp": "(pp, dp, tp)", "tp-pp-dp": "(dp, pp, tp)"}


def order_coords(order: RankOrder, g: int, p: int, d: int) -> tuple[Coords, ...]:
    """(dp, pp, tp) of every rank, in rank order, when ranks are numbered in ``order``
    (``g`` ranks per tensor-and-context group)."""
    if order == "tp-dp-pp":
        return tuple((dp, pp, tp) for pp in range(p) for dp in range(d) for tp in range(g))
    return tuple((dp, pp, tp) for dp in range(d) for pp in range(p) for tp in range(g))


def _nodes(coords: tuple[Coords, ...], gpus_per_node: int) -> frozenset[frozenset[Coords]]:
    """The coordinates each node holds (nodes hold consecutive ranks)."""
    size = min(gpus_per_node, len(coords))
    return frozenset(frozenset(coords[i : i + size]) for i in range(0, len(coords), size))


@lru_cache(maxsize=256)
def realizing_order(placement: Placement) -> RankOrder | None:
    """The first of Megatron-LM's orders (its default first) that puts the same coordinates
    on every node as ``placement``, or None when neither does."""
    if placement.assignment == "standard":
        return "tp-dp-pp"  # Megatron-LM's default order, by definition (planner.placement)
    nodes = _nodes(placement.coords, placement.gpus_per_node)
    for order in _ORDERS:
        coords = order_coords(order, placement.t, placement.p, placement.d)
        if _nodes(coords, placement.gpus_per_node) == nodes:
            return order
    return None


def order_problem(runtime: Runtime, placement: Placement) -> str | None:
    """Why ``runtime`` cannot number its ranks as ``placement`` places them, or None."""
    if runtime == "stagewright" or realizing_order(placement) is not None:
        return None
    what = (
        "BPipe's pair-adjacent placement"
        if placement.assignment == "pair-adjacent"
        else "the optimized placement (CP-SAT's)"
    )
    if runtime == "megatron":
        return (
            "Megatron-LM numbers ranks in its own order (tensor fastest, then data, then "
            f"pipeline; pipeline before data with {MEGATRON_ORDER_FLAG}), and neither puts "
            f"on each node the GPUs that {what} this candidate was priced under does: plan "
            "with search.runtime megatron (or search.method grid), or launch it with "
            "stagewright's executor"
        )
    return (
        "torch.distributed.pipelining takes its ranks from a device mesh "
        "(init_device_mesh numbers them last dimension fastest), and neither a (pp, dp, tp) "
        f"nor a (dp, pp, tp) mesh puts on each node the GPUs that {what} this candidate was "
        "priced under does: plan with search.runtime torch (or search.method grid), or "
        "launch it with stagewright's executor"
    )


def order_note(runtime: Runtime, placement: Placement) -> str | None:
    """How ``runtime`` numbers its ranks as ``placement`` places them, when that takes more
    than its usual order (None when the usual order does, or when no order does)."""
    if runtime == "stagewright" or realizing_order(placement) != "tp-pp-dp":
        return None
    if runtime == "megatron":
        return (
            f"Megatron-LM runs with {MEGATRON_ORDER_FLAG} (ranks numbered pipeline before "
            "data): that order puts on each node the GPUs of the placement this candidate "
            "was priced under"
        )
    return (
        f"torch.distributed.pipelining: build the device mesh with dimensions "
        f"{_TORCH_MESH['tp-pp-dp']} (init_device_mesh numbers them last dimension fastest), "
        f"not the usual {_TORCH_MESH['tp-dp-pp']}: that order puts on each node the GPUs of "
        "the placement this candidate was priced under"
    )
