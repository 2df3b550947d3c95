"""Rank placement: Megatron's standard order and BPipe's pair-adjacent one (§3.5)."""

from __future__ import annotations

import pytest

from planner.errors import StagewrightError
from planner.placement import Placement, pair_order, place


def test_bpipe_figure_6():
    """t = 2, p = 4, d = 2 on two nodes of 8: node 0 holds data replica 0 with stages in the
    order 0, 3, 1, 2 (each pair (0, 3) and (1, 2) adjacent); node 1 the same for replica 1."""
    placement = place(2, 4, 2, 8, "pair-adjacent")
    # (TP, DP, PP) as the figure labels them.
    node_0 = [
        (0, 0, 0),
        (1, 0, 0),
        (0, 0, 3),
        (1, 0, 3),
        (0, 0, 1),
        (1, 0, 1),
        (0, 0, 2),
        (1, 0, 2),
    ]
    node_1 = [(tp, 1, pp) for tp, _, pp in node_0]
    as_figure = [(tp, dp, pp) for dp, pp, tp in placement.coords]  # coords are (dp, pp, tp)
    assert as_figure[:8] == node_0
    assert as_figure[8:] == node_1
    assert [placement.node_of(r) for r in range(16)] == [0] * 8 + [1] * 8
    assert placement.grid()[0].startswith("node 0: TP0/DP0/PP0 TP1/DP0/PP0 TP0/DP0/PP3")


def test_bpipe_figure_5_pairs_share_a_node_only_when_pair_adjacent():
    p = 16
    adjacent = place(1, p, 1, 8, "pair-adjacent")
    standard = place(1, p, 1, 8, "standard")
    for s in range(p // 2):
        assert adjacent.same_node(s, p - 1 - s), f"pair ({s}, {p - 1 - s}) split"
        assert not standard.same_node(s, p - 1 - s), f"pair ({s}, {p - 1 - s}) together"


@pytest.mark.parametrize(
    "p, expected",
    [
        (1, [0]),
        (2, [0, 1]),
        (4, [0, 3, 1, 2]),
        (5, [0, 4, 1, 3, 2]),
        (8, [0, 7, 1, 6, 2, 5, 3, 4]),
    ],
)
def test_pair_order(p, expected):
    assert pair_order(p) == expected


@pytest.mark.parametrize("p", [2, 3, 8, 13])
def test_pair_order_is_a_permutation_with_pairs_adjacent(p):
    order = pair_order(p)
    assert sorted(order) == list(range(p))
    for i in range(0, p - 1, 2):
        assert order[i] + order[i + 1] == p - 1


@pytest.mark.parametrize("t, p, d", [(1, 4, 2), (2, 4, 2), (4, 2, 2), (2, 8, 1)])
def test_standard_order_is_megatrons(t, p, d):
    """Tensor fastest, then data, then pipeline: rank = tp + t (dp + d pp)."""
    placement = place(t, p, d, 8, "standard")
    for rank, (dp, pp, tp) in enumerate(placement.coords):
        assert rank == tp + t * (dp + d * pp)
        assert placement.rank_of(dp, pp, tp) == rank


@pytest.mark.parametrize("assignment", ["standard", "pair-adjacent"])
@pytest.mark.parametrize(
    "t, p, d, per_node",
    [(1, 8, 4, 8), (2, 4, 4, 8), (4, 8, 1, 8), (8, 2, 2, 8), (2, 3, 2, 4), (4, 12, 1, 8)],
)
def test_every_rank_once_and_tensor_groups_within_nodes(assignment, t, p, d, per_node):
    placement = place(t, p, d, per_node, assignment)
    world = t * p * d
    assert placement.world_size == world
    assert len(placement.coords) == world
    assert set(placement.coords) == {
        (dp, pp, tp) for dp in range(d) for pp in range(p) for tp in range(t)
    }
    assert placement.tensor_groups_within_nodes
    for dp in range(d):
        for pp in range(p):
            nodes = {placement.node_of(placement.rank_of(dp, pp, tp)) for tp in range(t)}
            assert len(nodes) == 1


@pytest.mark.parametrize("assignment", ["standard", "pair-adjacent"])
@pytest.mark.parametrize("t, p, d", [(1, 4, 2), (2, 3, 4), (4, 8, 4), (8, 16, 8), (8, 7, 1)])
def test_the_formulas_number_every_tensor_group_rising_with_tp(assignment, t, p, d):
    """What an executor config placed by a rule is not checked for again: torch numbers a
    group's members by global rank, so each tensor group's ranks rise with tp."""
    placement = place(t, p, d, 8, assignment)
    for dp in range(d):
        for pp in range(p):
            ranks = [placement.rank_of(dp, pp, tp) for tp in range(t)]
            assert ranks == sorted(ranks)
            assert [placement.coords[rank] for rank in ranks] == [(dp, pp, tp) for tp in range(t)]


def test_tensor_groups_across_nodes_are_reported():
    # t = 4 on nodes of 2 GPUs cannot stay inside a node.
    assert not place(4, 1, 1, 2, "standard").tensor_groups_within_nodes


def test_data_groups_within_nodes():
    # Standard order, d next to t: t x d = 8 fits one node for each stage.
    assert place(2, 2, 4, 8, "standard").data_groups_within_nodes
    # Pair-adjacent puts data parallelism outermost: replicas on different nodes.
    assert not place(2, 4, 2, 8, "pair-adjacent").data_groups_within_nodes


def test_partial_nodes_are_refused():
    with pytest.raises(StagewrightError, match="whole nodes of 8"):
        place(3, 4, 1, 8)


@pytest.mark.parametrize("assignment", ["standard", "pair-adjacent"])
def test_the_formulas_answer_as_the_listed_ranks_do(assignment):
    """The standard and pair-adjacent placements answer from their formulas what the cost
    model asks (ranks, a stage's node, groups inside nodes): the same answers as the same
    ranks listed as an optimized placement, for every rank of many shapes and node sizes."""
    shapes = [
        (t, p, d, per_node)
        for t in (1, 2, 3, 4, 8)
        for p in (1, 2, 3, 5, 8, 16)
        for d in (1, 2, 3, 4, 8)
        for per_node in (1, 2, 4, 6, 8, 16)
        if not (t * p * d) % per_node or t * p * d <= per_node
    ]
    for t, p, d, per_node in shapes:
        formula = place(t, p, d, per_node, assignment)
        listed = Placement(t, p, d, per_node, "optimized", formula.coords)
        assert sorted(formula.coords) == sorted(
            (dp, pp, tp) for dp in range(d) for pp in range(p) for tp in range(t)
        )
        for name in ("tensor_groups_within_nodes", "data_groups_within_nodes"):
            assert getattr(formula, name) == getattr(listed, name), (name, t, p, d, per_node)
        for rank, (dp, pp, tp) in enumerate(formula.coords):
            assert formula.rank_of(dp, pp, tp) == listed.rank_of(dp, pp, tp) == rank
            other = (pp + 1) % p
            assert formula.same_node(pp, other, dp, tp) == listed.same_node(pp, other, dp, tp)


def test_only_an_optimized_placement_lists_its_ranks():
    with pytest.raises(StagewrightError, match="lists its ranks"):
        Placement(1, 2, 1, 8, "standard", ((0, 0, 0), (0, 1, 0)))
    with pytest.raises(StagewrightError, match="lists its ranks"):
        Placement(1, 2, 1, 8, "optimized")
