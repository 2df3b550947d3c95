"""A candidate's rank placement and the runtimes that can number their ranks that way.

Independent expectations:
- Megatron-LM's rank equation (``generate_masked_orthogonal_rank_groups`` in
  megatron/core/parallel_state.py): global rank = tp + dp x t + pp x t x d in its default
  order ``tp-dp-pp``; ``--use-tp-pp-dp-mapping`` swaps data and pipeline: tp + pp x t +
  dp x t x p. torchrun gives node n the ranks n x per_node ... (n + 1) x per_node - 1.
- Node contents below are worked out by hand from those rules.
"""

from __future__ import annotations

from typing import Any

import pytest

from planner.assemble import candidate
from planner.costmodel.evaluate import PlanContext, estimate, price, split_layers
from planner.costmodel.memory import GIB
from planner.launch import ExecutorConfig
from planner.launch.artefacts import candidate_launch, megatron_of
from planner.launch.rank_order import order_coords, realizing_order
from planner.launch.runtimes import runtime_limits
from planner.placement import Placement, place
from planner.plan import plan
from planner.profiles import default_store
from planner.search.placement_cpsat import PlacementResult, PlacementWeights, optimize_placement
from planner.specs import CandidateConfig, PlanRequest

FLAG = "--use-tp-pp-dp-mapping"


def _request(nodes: int, per_node: int, runtime: str = "any", method: str = "grid") -> PlanRequest:
    """A small GPT with long sequences on H100s: its activations are large next to its
    weights, so a pipeline hop across nodes costs more than a data-parallel ring."""
    data: dict[str, Any] = {
        "model": {
            "name": "long-thin",
            "num_layers": 8,
            "hidden_size": 512,
            "num_attention_heads": 8,
            "seq_length": 8192,
            "vocab_size": 1024,
        },
        "cluster": {"gpu": "h100-sxm-80g", "num_nodes": nodes, "gpus_per_node": per_node},
        "training": {"global_batch_size": 64, "precision": "bf16"},
        "search": {
            "schedules": ["1f1b"],
            "recompute": ["none"],
            "micro_batch_sizes": [1, 2],
            "method": method,
            "runtime": runtime,
            "top_k": 5,
        },
    }
    return PlanRequest.model_validate(data)


def _config(t: int, p: int, d: int) -> CandidateConfig:
    return CandidateConfig(
        t=t,
        p=p,
        d=d,
        micro_batch_size=1,
        num_microbatches=64 // d,
        recompute="none",
        schedule="1f1b",
        layers_per_stage=split_layers(8, p),
    )


def _listed(t: int, p: int, d: int, per_node: int, blocks: list[tuple[int, int]]) -> Placement:
    """An optimized placement from its (dp, pp) blocks in rank order, tensor ranks fastest."""
    coords = tuple((dp, pp, tp) for dp, pp in blocks for tp in range(t))
    return Placement(t, p, d, per_node, "optimized", coords)


# t=1 p=4 d=2 on two nodes of 4 GPUs.
# Megatron-LM's default order: node 0 holds stages 0 and 1 of both replicas.
# Its tp-pp-dp order: node 0 holds replica 0's whole pipeline, node 1 replica 1's.
# CP-SAT lays a node's blocks out in BPipe's pair order (0, 3, 1, 2): the same nodes as
# tp-pp-dp, other GPUs inside them.
PIPELINES_PER_NODE = _listed(
    1, 4, 2, 4, [(0, 0), (0, 3), (0, 1), (0, 2), (1, 0), (1, 3), (1, 1), (1, 2)]
)
# Node 0: replica 0's stages 0, 1 and replica 1's stages 2, 3; node 1 the rest. Neither
# order puts these together.
CROSSED = _listed(1, 4, 2, 4, [(0, 0), (0, 1), (1, 2), (1, 3), (0, 2), (0, 3), (1, 0), (1, 1)])
# t=1 p=4 d=4 on four nodes of 4: node 0 replica 0, node 1 stages 0-1 of replicas 1 and 2,
# node 2 their stages 2-3, node 3 replica 3. The default order gives node k stage k of every
# replica, tp-pp-dp gives node k replica k: neither is this.
MIXED_BLOCKS = [(0, pp) for pp in range(4)]
MIXED_BLOCKS += [(1, 0), (1, 1), (2, 0), (2, 1), (1, 2), (1, 3), (2, 2), (2, 3)]
MIXED_BLOCKS += [(3, pp) for pp in range(4)]
MIXED = _listed(1, 4, 4, 4, MIXED_BLOCKS)


def test_megatron_orders_follow_its_rank_equation():
    t, p, d = 2, 3, 2
    default = order_coords("tp-dp-pp", t, p, d)
    swapped = order_coords("tp-pp-dp", t, p, d)
    for dp in range(d):
        for pp in range(p):
            for tp in range(t):
                assert default[tp + dp * t + pp * t * d] == (dp, pp, tp)
                assert swapped[tp + pp * t + dp * t * p] == (dp, pp, tp)
    assert default[5] == (0, 1, 1)  # 5 = 1 + 0 x 2 + 1 x 4
    assert swapped[5] == (0, 2, 1)  # 5 = 1 + 2 x 2 + 0 x 6
    # The planner's standard placement is Megatron-LM's default order.
    assert place(t, p, d, 4, "standard").coords == default


def test_a_placement_is_realized_by_the_order_that_fills_the_same_nodes():
    assert realizing_order(place(1, 4, 2, 4, "standard")) == "tp-dp-pp"
    assert realizing_order(PIPELINES_PER_NODE) == "tp-pp-dp"
    assert realizing_order(CROSSED) is None
    assert realizing_order(MIXED) is None
    # Listed in exactly Megatron-LM's default order: the default, without a flag.
    default = Placement(1, 4, 2, 4, "optimized", place(1, 4, 2, 4).coords)
    assert realizing_order(default) == "tp-dp-pp"
    # Nodes are interchangeable: replica 1 on node 0 is still tp-pp-dp.
    swapped = _listed(1, 4, 2, 4, [(1, pp) for pp in range(4)] + [(0, pp) for pp in range(4)])
    assert realizing_order(swapped) == "tp-pp-dp"
    # On one node every order puts every rank together.
    one_node = _listed(1, 2, 2, 8, [(1, 1), (0, 0), (0, 1), (1, 0)])
    assert realizing_order(one_node) == "tp-dp-pp"


def test_cpsat_places_a_hop_heavy_pipeline_in_the_order_megatron_calls_tp_pp_dp():
    """Hops weigh 100 times the rings: the only layout without a hop across nodes puts each
    replica's pipeline on its own node, laid out in pair order inside it."""
    result = optimize_placement(1, 4, 2, 4, PlacementWeights(100.0, 0.0, 1.0))
    assert result.placement == PIPELINES_PER_NODE
    assert realizing_order(result.placement) == "tp-pp-dp"


def test_runtime_limits_name_the_runtimes_that_cannot_number_their_ranks_so():
    request = _request(2, 4)
    config = _config(1, 4, 2)
    assert runtime_limits(request, config) == {}
    assert runtime_limits(request, config, place(1, 4, 2, 4, "standard")) == {}
    assert runtime_limits(request, config, PIPELINES_PER_NODE) == {}
    limits = runtime_limits(request, config, CROSSED)
    assert set(limits) == {"megatron", "torch"}
    megatron = limits["megatron"]
    assert megatron.startswith("Megatron-LM numbers ranks in its own order (tensor fastest")
    assert "the optimized placement (CP-SAT's) this candidate was priced under" in megatron
    assert "plan with search.runtime megatron" in megatron
    assert "launch it with stagewright's executor" in megatron
    assert "device mesh" in limits["torch"] and "search.runtime torch" in limits["torch"]


def _priced(request: PlanRequest, config: CandidateConfig, placement: Placement | None):
    """``config`` priced as a cpsat plan prices it: under a context holding ``placement``
    for its (t, p, d, schedule)."""
    ctx = PlanContext.from_store(request, default_store())
    if placement is not None:
        ctx = ctx.with_placements({(config.t, config.p, config.d, config.schedule): placement})
    return ctx, price(ctx, estimate(ctx, config))


def test_an_optimized_candidate_no_order_realizes_runs_only_on_stagewright():
    request = _request(4, 4)
    ctx, priced = _priced(request, _config(1, 4, 4), MIXED)
    assert priced.estimate.costs.placement == MIXED
    launch = candidate_launch(ctx, priced)
    assert launch.runtimes == ["stagewright"]
    assert "Megatron-LM numbers ranks in its own order" in launch.limits["megatron"]
    assert launch.launch.megatron_args is None
    # The executor config carries the placement, and the executor's rank -> (dp, pp, tp)
    # (ExecutorConfig.coords_of / rank_of, what executor.comm builds its groups from) is
    # the planner's, in the plan's form and written out.
    document = launch.launch.executor_config
    assert document["placement"]["assignment"] == "optimized"
    assert [tuple(b) for b in document["placement"]["blocks"]] == MIXED_BLOCKS
    compact = ExecutorConfig.model_validate(document)
    materialized = compact.materialized()
    for config in (compact, materialized):
        assert [config.coords_of(r) for r in range(16)] == list(MIXED.coords)
        assert all(config.rank_of(*MIXED.coords[r]) == r for r in range(16))
        assert config.planned_placement == MIXED
    ranks = [(r.dp, r.pp, r.tp) for r in materialized.placement.ranks or []]
    assert ranks[4:8] == [(1, 0, 0), (1, 1, 0), (2, 0, 0), (2, 1, 0)]  # node 1, by hand


def test_a_standard_candidate_runs_everywhere_in_megatron_default_order():
    request = _request(2, 4)
    ctx, priced = _priced(request, _config(1, 4, 2), None)
    launch = candidate_launch(ctx, priced)
    assert launch.runtimes == ["stagewright", "torch", "megatron"]
    assert launch.limits == {}
    assert launch.launch.megatron_args is not None
    assert FLAG not in launch.launch.megatron_args
    config = ExecutorConfig.model_validate(launch.launch.executor_config)
    assert config.planned_placement == place(1, 4, 2, 4, "standard")


def test_a_candidate_placed_pipeline_per_node_asks_megatron_and_torch_for_that_order():
    request = _request(2, 4)
    ctx, priced = _priced(request, _config(1, 4, 2), PIPELINES_PER_NODE)
    entry = candidate(ctx, priced)
    assert entry.runtimes == ["stagewright", "torch", "megatron"]
    assert entry.launch.megatron_args is not None
    assert FLAG in entry.launch.megatron_args.split()
    assert any(FLAG in note for note in entry.notes)
    assert any("dimensions (dp, pp, tp)" in note for note in entry.notes)
    # The launch files rebuild the Megatron-LM arguments from the candidate: same flag.
    assert FLAG in megatron_of(request, entry).args


def test_launchable_keeps_a_placement_the_requested_runtime_realizes():
    from planner.search.refinement import launchable

    config = _config(1, 4, 4)
    for runtime in ("any", "stagewright"):
        assert launchable(_request(4, 4, runtime), config, MIXED) == (MIXED, False)
    for runtime in ("megatron", "torch"):
        offered, refused = launchable(_request(4, 4, runtime), config, MIXED)
        assert offered is not None and offered.coords == order_coords("tp-pp-dp", 1, 4, 4)
        assert refused


def test_a_cpsat_plan_for_megatron_uses_an_order_megatron_has(monkeypatch):
    """CP-SAT's layout (MIXED) prices as fast as tp-pp-dp here (the cost model sees replica
    0's hops and whether data rings stay in a node) and faster than the default; a request
    for any runtime keeps it (stagewright's executor runs it), one for Megatron-LM gets
    tp-pp-dp instead, with a note."""
    import planner.search.refinement as refinement

    def mixed(t, p, d, gpus_per_node, weights, **options):
        assert (t, p, d, gpus_per_node) == (1, 4, 4, 4)
        return PlacementResult(MIXED, "optimal", 0.0)

    monkeypatch.setattr(refinement, "optimize_placement", mixed)
    config = _config(1, 4, 4)
    default = _priced(_request(4, 4), config, None)[1].iteration_time_s
    assert _priced(_request(4, 4), config, MIXED)[1].iteration_time_s < default  # the premise
    key = (1, 4, 4, "1f1b")
    chosen = {}
    for runtime in ("any", "megatron"):
        ctx = PlanContext.from_store(_request(4, 4, runtime, method="cpsat"), default_store())
        grid = estimate(ctx, config)
        capacity = ctx.hardware.usable_memory_gib * GIB
        assert grid.peak_memory <= capacity
        found = refinement.refine_plan(ctx, [grid], [], capacity)
        chosen[runtime] = (found.placements[key], found.notes)
    assert chosen["any"][0] == MIXED
    placed, notes = chosen["megatron"]
    assert placed.coords == order_coords("tp-pp-dp", 1, 4, 4)
    assert realizing_order(placed) == "tp-pp-dp"
    assert [n for n in notes if "placement of" in n] == [
        "cpsat: placement of t=1 p=4 d=4 mb=1 1f1b: CP-SAT's layout puts GPUs on nodes as no "
        "rank order of Megatron-LM (search.runtime megatron) does; Megatron-LM's other order "
        "(pipeline before data) is used"
    ]


@pytest.mark.parametrize("runtime", ["any", "megatron"])
def test_every_cpsat_candidate_megatron_runs_is_placed_in_an_order_it_has(runtime):
    result = plan(_request(2, 4, runtime, method="cpsat"))
    optimized = 0
    for entry in result.candidates:
        config = ExecutorConfig.model_validate(entry.launch.executor_config)
        order = realizing_order(config.planned_placement)
        assert ("megatron" in entry.runtimes) == (order is not None)
        args = (entry.launch.megatron_args or "").split()
        assert (FLAG in args) == (order == "tp-pp-dp")
        optimized += config.placement.assignment == "optimized"
    # Here CP-SAT puts t=2 p=2 d=2 one replica per node (blocks (0,0), (0,1) on node 0),
    # which prices faster than the default and Megatron-LM runs with the flag.
    assert optimized >= 1


def test_an_executor_config_refuses_tensor_ranks_that_fall_with_tp():
    """torch numbers a group's members by global rank and tensor parallelism gathers shards
    in that order, so a tensor group's ranks must rise with tp; a data group's need not
    (the executor shards the distributed optimizer in the group's order)."""
    from pydantic import ValidationError

    ctx, priced = _priced(_request(2, 4), _config(2, 2, 2), None)
    document = candidate_launch(ctx, priced).launch.executor_config

    def listed(coords: list[tuple[int, int, int]]) -> dict[str, Any]:
        ranks = [{"rank": r, "dp": a, "pp": b, "tp": c} for r, (a, b, c) in enumerate(coords)]
        placement = {"assignment": "optimized", "gpus_per_node": 4, "ranks": ranks}
        return {**document, "placement": placement}

    # Replica 1 first: stage 0's data ranks are 6 (dp 0) and 0 (dp 1), falling with dp.
    data_falls = [(1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]
    data_falls += [(0, 1, 0), (0, 1, 1), (0, 0, 0), (0, 0, 1)]
    assert ExecutorConfig.model_validate(listed(data_falls)).rank_of(0, 0, 0) == 6
    tensor_falls = [(0, 0, 1), (0, 0, 0)] + data_falls[2:6] + [(1, 0, 0), (1, 0, 1)]
    assert sorted(tensor_falls) == sorted(data_falls)
    with pytest.raises(ValidationError, match=r"\(dp, pp\) = \(0, 0\) must rise with tp"):
        ExecutorConfig.model_validate(listed(tensor_falls))
