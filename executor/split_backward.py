"""Backward split into B (input gradient) and W (weight gradients) without walking twice.

B runs ``autograd.grad`` from the stage output to its input with the graph kept, and on the
way records, at every node where a path to a weight leaves the input path, the gradient
flowing into that node. W then starts autograd at those nodes with the recorded gradients
and walks only the weight branches. (Qi et al.'s zero-bubble split; the graph analysis
follows the idea of torch.distributed.pipelining's stage_backward_input/weight.)
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.autograd.graph import GradientEdge, Node

__all__ = ["Pending", "backward_input", "backward_weight"]


def _node(t: Tensor) -> Node | None:
    """The autograd node of a tensor; for a leaf, its gradient accumulator."""
    if t.grad_fn is not None:
        return t.grad_fn
    if t.requires_grad:
        return t.view_as(t).grad_fn.next_functions[0][0]  # type: ignore[union-attr]
    return None


def _reverse_edges(root: Node) -> dict[Node, list[Node]]:
    """Each node -> the nodes that feed gradients into it (toward the output)."""
    edges: dict[Node, list[Node]] = defaultdict(list)
    seen = {root}
    queue = deque([root])
    while queue:
        node = queue.popleft()
        for child, _ in node.next_functions:
            if child is None:
                continue
            edges[child].append(node)
            if child not in seen:
                seen.add(child)
                queue.append(child)
    return edges


def _closure(
    start: Sequence[Node], reverse: dict[Node, list[Node]], stop: set[Node]
) -> tuple[set[Node], set[Node]]:
    """Nodes reachable from ``start`` toward the output, not entering ``stop``; and the
    nodes of ``stop`` met on the way."""
    seen = set(start)
    met: set[Node] = set()
    queue = deque(start)
    while queue:
        node = queue.popleft()
        for parent in reverse.get(node, []):
            if parent in seen:
                continue
            if parent in stop:
                met.add(parent)
                continue
            seen.add(parent)
            queue.append(parent)
    return seen, met


@dataclass
class Pending:
    """What B leaves for W: per branch node, the gradient that flowed into it."""

    output: Tensor
    upstream: Tensor
    params: list[Tensor]
    grads: dict[Node, list[Tensor | None]] = field(default_factory=dict)
    groups: list[tuple[list[Node], list[Tensor]]] = field(default_factory=list)
    fallback: bool = False


def backward_input(
    output: Tensor, upstream: Tensor, x: Tensor, params: list[Tensor]
) -> tuple[Tensor, Pending]:
    """dLoss/dx, keeping what W needs. ``x`` must be a leaf that requires grad."""
    pending = Pending(output, upstream, params)
    root = output.grad_fn
    x_node = _node(x)
    if root is None or x_node is None:
        (gx,) = torch.autograd.grad(output, x, upstream, retain_graph=True)
        pending.fallback = True
        return gx, pending
    reverse = _reverse_edges(root)
    input_path, _ = _closure([x_node], reverse, set())
    # Group the weights by the branch nodes their paths leave the input path at (weights
    # sharing a node share a group), so that W asks each group's nodes for its own weights
    # only: asking a node for every weight would walk down the input path again.
    groups: list[tuple[set[Node], list[Tensor]]] = []
    for p in params:
        node = _node(p)
        if node is None:
            continue
        _, met = _closure([node], reverse, input_path)
        joined = [g for g in groups if g[0] & met]
        nodes, members = set(met), [p]
        for g in joined:
            nodes |= g[0]
            members = g[1] + members
            groups.remove(g)
        groups.append((nodes, members))
    pending.groups = [(list(nodes), members) for nodes, members in groups]
    branches = set().union(*(nodes for nodes, _ in groups)) if groups else set()
    handles: list[Any] = []
    for node in branches:

        def record(grads: tuple[Tensor | None, ...], node: Node = node) -> None:
            pending.grads[node] = list(grads)

        handles.append(node.register_prehook(record))
    try:
        (gx,) = torch.autograd.grad(output, x, upstream, retain_graph=True)
    finally:
        for handle in handles:
            handle.remove()
    # A branch node with several outputs, or one B never reached, is left to the full walk.
    if any(
        len([g for g in grads if g is not None]) != 1 for grads in pending.grads.values()
    ) or len(pending.grads) != len(branches):
        pending.fallback = True
    return gx, pending


def backward_weight(pending: Pending) -> None:
    """Accumulate the weight gradients into ``.grad`` and free the graph."""
    params = [p for p in pending.params if p.requires_grad]
    if pending.fallback or not pending.grads:
        torch.autograd.backward(pending.output, pending.upstream, inputs=params)
        return
    for nodes, members in pending.groups:
        edges, grads = [], []
        for node in nodes:
            recorded = pending.grads[node]
            index = next(i for i, g in enumerate(recorded) if g is not None)
            edges.append(GradientEdge(node, index))
            grads.append(recorded[index])
        wanted = [p for p in members if p.requires_grad]
        if not edges or not wanted:
            continue
        found = torch.autograd.grad(
            edges, wanted, grad_outputs=grads, allow_unused=True, retain_graph=True
        )
        for p, g in zip(wanted, found, strict=True):
            if g is None:
                continue
            if p.grad is None:
                p.grad = g
            else:  # in place: the gradient may be a view of the stage's fp32 buffer
                p.grad.add_(g)
