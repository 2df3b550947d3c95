"""What issue 3 promises every plan carries: bundled hardware for the GPU names requests use,
a per-device breakdown that adds up, and data-parallel sync priced by the ring formula."""

from __future__ import annotations

import pytest

from planner.costmodel import PlanContext, estimate, price, stage_costs
from planner.costmodel.memory import layer_parameters
from planner.plan import plan
from planner.profiles import default_store
from planner.specs import CandidateConfig, PlanRequest
from tests.unit.test_search import example, request

REQUIRED_GPUS = {"a100-sxm-80g", "a100-40g", "h100-sxm-80g", "h200", "v100-16g", "v100-32g", "cpu"}


def test_the_bundled_hardware_has_every_gpu_name_requests_use():
    store = default_store()
    assert REQUIRED_GPUS <= set(store.hardware_names())
    for name in REQUIRED_GPUS:
        hw = store.hardware(name)
        assert hw.peak_flops and all(v > 0 for v in hw.peak_flops.values())
        assert {"bf16", "fp16"} & set(hw.peak_flops) or name == "cpu"
        assert 0 < hw.usable_memory_gib <= hw.memory_gib
        for link in (hw.intra_node, hw.inter_node):
            assert link.bandwidth_gbps > 0 and link.latency_us >= 0
        assert hw.source  # every calibrated number names where it comes from


def test_every_candidate_breaks_down_per_device_and_the_parts_add_up():
    result = plan(example("gpt3-96b-32xa100.json"))
    assert result.candidates
    for candidate in result.candidates:
        config, rows = candidate.config, candidate.breakdown
        assert [row.device for row in rows] == list(range(config.p))
        assert sum(row.layers for row in rows) == 80
        assert sorted(s for row in rows for s in row.stages) == list(
            range(len(config.layers_per_stage))
        )
        for row, total in zip(rows, candidate.predicted.memory_gib_per_device, strict=True):
            parts = (
                row.parameters_gib
                + row.gradients_gib
                + row.optimizer_gib
                + row.activations_gib
                + row.allowance_gib
            )
            assert parts == pytest.approx(total, abs=1e-3)  # the total is rounded to MiB
            assert row.compute_s > 0 and row.communication_s >= 0 and row.bubble_s >= 0
            assert row.in_flight_microbatches >= 1


@pytest.mark.parametrize("distributed_optimizer", [False, True])
def test_data_parallel_sync_is_a_ring_over_the_gradients(distributed_optimizer):
    r = request(gpus_per_node=4, batch=8)
    r = r.model_copy(
        update={
            "training": r.training.model_copy(
                update={"distributed_optimizer": distributed_optimizer}
            )
        }
    )
    store = default_store()
    hw = store.hardware("cpu")
    ctx = PlanContext(r, hw, list(store.layer_points(hw.name)))
    config = CandidateConfig(
        t=1,
        p=2,
        d=2,
        micro_batch_size=1,
        num_microbatches=4,
        recompute="none",
        schedule="1f1b",
        layers_per_stage=[4, 4],
    )
    params = max(stage_costs(ctx, config).parameters)
    assert params >= 4 * layer_parameters(r.model)
    # fp32: 4-byte gradients and weights. Ring all-reduce: 2 (d - 1) / d of the gradients;
    # distributed optimizer: reduce-scatter the gradients, all-gather the weights, (d - 1) / d
    # each. One node, so the intra-node link; 2 (d - 1) latency steps.
    volume = 0.5 * params * (4 + 4) if distributed_optimizer else 2 * 0.5 * params * 4
    link = hw.intra_node
    expected = 2 * link.latency_us * 1e-6 + volume / (link.bandwidth_gbps * 1e9)
    assert price(ctx, estimate(ctx, config)).data_parallel_s == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("distributed_optimizer", [False, True])
def test_a_static_memory_rejection_offers_only_remedies_not_already_used(distributed_optimizer):
    """GPT-3 13B's weights and optimizer states alone overflow one A100: the reason offers
    the distributed optimizer only to a request that does not already use it."""
    data = example("gpt3-13b-8xa100.json", schedules=["1f1b"], recompute=["full"]).model_dump()
    data["cluster"].update(num_nodes=1, gpus_per_node=1)
    data["training"]["distributed_optimizer"] = distributed_optimizer
    result = plan(PlanRequest.model_validate(data))
    reasons = [r.reason for r in result.rejected if "before any activation" in r.reason]
    assert reasons and result.best is None
    for reason in reasons:
        assert "more pipeline or tensor parallelism" in reason and "would shard it" in reason
        assert ("distributed optimizer" in reason) is not distributed_optimizer, reason
