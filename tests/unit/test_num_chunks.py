"""Interleaved schedules' chunks per device (v) as a searched choice: ``search.num_chunks``,
the candidate's ``num_chunks``, and everything that builds or counts the candidate's schedule
with it (stage count, pipeline time, in-flight memory, launch artefacts, measured runs)."""

from __future__ import annotations

import dataclasses
import json
import tracemalloc

import pytest
from pydantic import ValidationError

from planner.costmodel.evaluate import (
    PlanContext,
    estimate,
    price,
    schedule_shape,
    split_layers,
)
from planner.launch import materialize_launch
from planner.measurements import MeasuredRun, candidate_config, fingerprint, plan_request
from planner.plan import plan
from planner.profiles import default_store
from planner.schedules import ActionKind, generate
from planner.search.cost import search_cost
from planner.search.grid import enumerate_space
from planner.search.timeline import candidate_timeline
from planner.specs import CandidateConfig, PlanRequest, SearchSpec

_MODEL = {
    "name": "tiny-gpt",
    "num_layers": 16,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "seq_length": 32,
    "vocab_size": 128,
}


def _request(**search: object) -> PlanRequest:
    return PlanRequest.model_validate(
        {
            "model": _MODEL,
            "cluster": {"gpu": "cpu", "num_nodes": 1, "gpus_per_node": 4},
            "training": {
                "global_batch_size": 32,
                "precision": "fp32",
                "distributed_optimizer": False,
                "sequence_parallel": False,
            },
            "search": {"recompute": ["none"], "micro_batch_sizes": [1], **search},
        }
    )


def _config(v: int, *, p: int = 4, m: int = 32, schedule: str = "interleaved") -> CandidateConfig:
    stages = p * v
    return CandidateConfig(
        t=1,
        p=p,
        d=4 // p,
        micro_batch_size=1,
        num_microbatches=m,
        recompute="none",
        schedule=schedule,
        layers_per_stage=[_MODEL["num_layers"] // stages] * stages,
        num_chunks=v,
    )


# ------------------------------------------------------------------ pipeline time


@pytest.mark.parametrize("m", [16, 32])  # 32: past the 16 simulated, extended linearly
def test_the_bubble_shrinks_as_one_over_v(m):
    """Narayanan et al. 2021, §2.2: with v chunks a device the bubble of interleaved 1F1B is
    (p - 1) / v of a device's time per micro-batch, (p - 1) / (v m) of the ideal time.

    Equal layer times, no hop time: every chunk of v is 1/v of a device's work per
    micro-batch, W = F + B = 1 + 2 = 3 s. With p = 4:
    ideal = 3 m; v = 2: 3 m + 3 x 3 / 2 = 3 m + 4.5; v = 4: 3 m + 3 x 3 / 4 = 3 m + 2.25.
    (m = 16: 52.5 and 50.25 s; m = 32: 100.5 and 98.25 s.)"""
    ctx = PlanContext.from_store(_request(schedules=["interleaved"]), default_store())
    p, forward, backward = 4, 1.0, 2.0
    pipeline = {}
    for v in (2, 4):
        est = estimate(ctx, _config(v, m=m))
        stages = p * v
        costs = dataclasses.replace(
            est.costs,
            forward=(forward / v,) * stages,
            backward=(backward / v,) * stages,
            weight=(0.0,) * stages,
            p2p_s=0.0,
            work=((forward + backward) / v,) * stages,
        )
        equal = dataclasses.replace(est, costs=costs, busy_s=m * (forward + backward))
        pipeline[v] = price(ctx, equal).makespan_s
    ideal = m * (forward + backward)
    assert pipeline[2] == pytest.approx(ideal + (p - 1) * 3 / 2)
    assert pipeline[4] == pytest.approx(ideal + (p - 1) * 3 / 4)
    # The bubble as a fraction of the ideal time: (p - 1) / (v m).
    for v in (2, 4):
        assert (pipeline[v] - ideal) / ideal == pytest.approx((p - 1) / (v * m))


# ------------------------------------------------------------------ memory


def _device_peak_chunks(v: int, p: int, m: int, device: int) -> int:
    """Peak saved micro-batch-chunks of ``device``, walked from the schedule's own order
    (a forward saves one, its backward frees it), independently of the planner's counts."""
    schedule = generate("interleaved", p, m, num_chunks=v)
    held = peak = 0
    for action in schedule.actions[device]:
        if action.kind is ActionKind.F:
            held += 1
        elif action.kind.is_backward:
            held -= 1
        peak = max(peak, held)
    return peak


@pytest.mark.parametrize("p", [2, 4])
def test_the_first_device_holds_more_chunks_as_v_grows(p):
    m = 4 * p
    peaks = {}
    for v in (2, 3, 4, 8):
        walked = _device_peak_chunks(v, p, m, 0)
        shape = schedule_shape("interleaved", p, m, v)
        # The planner counts per stage of the device; its v stages together hold the walk's.
        assert shape.in_flight[0] * v == pytest.approx(walked)
        # ... and that is Megatron-LM's warm-up plus the one forward of the steady state.
        assert walked == min((p - 1) * 2 + (v - 1) * p + 1, m * v)
        peaks[v] = walked
    assert peaks[2] < peaks[3] < peaks[4] < peaks[8]


def test_a_candidates_memory_is_counted_with_its_chunks():
    """Device 0's saved activations: its in-flight chunk-micro-batches times a chunk's bytes,
    so with a layer a stage (16 layers, p = 4, v = 4) more chunks in flight than at v = 2
    but each half as large."""
    ctx = PlanContext.from_store(_request(schedules=["interleaved"]), default_store())
    two, four = estimate(ctx, _config(2)), estimate(ctx, _config(4))
    assert len(two.config.layers_per_stage) == 8 and len(four.config.layers_per_stage) == 16
    assert four.memory[0].in_flight * 4 == _device_peak_chunks(4, 4, 32, 0)
    assert two.memory[0].in_flight * 2 == _device_peak_chunks(2, 4, 32, 0)


# ------------------------------------------------------------------ the grid


def test_the_grid_searches_every_v_asked_for_and_refuses_empty_middle_stages():
    request = _request(schedules=["interleaved"], num_chunks=[2, 4, 8])
    ctx = PlanContext.from_store(request, default_store())
    space = enumerate_space(ctx, float("inf"))
    found = {(e.config.p, e.config.num_chunks) for e in space.feasible}
    # 16 layers: p = 2 and 4 give 4 to 16 stages for v = 2 and 4; v = 8 on p = 2 is 16
    # stages of one layer; v = 8 on p = 4 is 32 stages, 16 of them empty.
    assert found == {(2, 2), (2, 4), (2, 8), (4, 2), (4, 4)}
    for est in space.feasible:
        c = est.config
        assert len(c.layers_per_stage) == c.p * c.num_chunks
        assert sum(c.layers_per_stage) == 16
    refused = [r for r in space.rejected if (r.config.p, r.config.num_chunks) == (4, 8)]
    assert refused and all(
        r.reason.startswith(
            "16 layers cannot fill the 32 stages of interleaved with 8 chunks per device "
            "(p x v = 4 x 8)"
        )
        and "use fewer chunks per device" in r.reason
        for r in refused
    )


def test_a_plan_ranks_v4_candidates_and_shows_them():
    result = plan(_request(schedules=["interleaved"], num_chunks=[2, 4], top_k=20))
    chunks = {c.config.num_chunks for c in result.candidates}
    assert chunks == {2, 4}
    four = next(c for c in result.candidates if c.config.num_chunks == 4)
    assert four.model_dump()["config"]["num_chunks"] == 4
    assert (
        "num_chunks"
        not in next(c for c in result.candidates if c.config.num_chunks == 2).model_dump(
            mode="json"
        )["config"]
    )
    # The executor config names the schedule by its generator's parameters.
    schedule = four.launch.executor_config["schedule"]
    assert schedule["parameters"] == {"num_chunks": 4}
    # Megatron-LM: --num-layers-per-virtual-pipeline-stage is layers / (p v), from which it
    # derives v = (layers / p) / that (megatron/training/arguments.py, validate_args).
    per_stage = 16 // (four.config.p * 4)
    assert f"--num-layers-per-virtual-pipeline-stage {per_stage} " in four.launch.megatron_args
    # The request echoes the counts it searched; a round trip keeps them.
    again = PlanRequest.model_validate_json(result.request.model_dump_json())
    assert again.search.num_chunks == [2, 4]


def test_search_cost_counts_every_v():
    one = search_cost(_request(schedules=["interleaved"]))
    two = search_cost(_request(schedules=["interleaved"], num_chunks=[2, 4]))
    assert two.configurations == 2 * one.configurations
    assert two.work > one.work


def test_a_chunk_count_no_layer_split_can_fill_costs_nothing_to_refuse():
    """A v whose p x v stages outnumber the layers (plus the two end stages, which may hold
    only the embedding or the output layer) is refused without building its split: one
    request naming num_chunks [10**6] would otherwise list millions of stages per grid point
    (the service's cost check runs it before any limit) and exhaust memory."""
    tracemalloc.start()
    try:
        assert split_layers(16, 10**7) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20, peak
    assert split_layers(16, 18) == [0] + [1] * 16 + [0]  # the most stages 16 layers fill
    assert split_layers(16, 19) is None
    cost = search_cost(_request(schedules=["interleaved"], num_chunks=[2, 10**9]))
    assert cost.priceable == search_cost(_request(schedules=["interleaved"])).priceable


def test_the_timeline_draws_the_candidates_chunks():
    request = _request(schedules=["interleaved"], num_chunks=[4])
    config = _config(4)
    drawn = candidate_timeline(request, config)
    assert [d["stages"] for d in drawn["devices"]] == [[r, r + 4, r + 8, r + 12] for r in range(4)]
    stages_seen = {a[1] for d in drawn["devices"] for a in d["actions"]}
    assert stages_seen == set(range(16))


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    "search, message",
    [
        ({"schedules": ["interleaved"], "num_chunks": [1, 2]}, "at least 2 chunks per device"),
        ({"schedules": ["interleaved"], "num_chunks": [4, 4]}, "lists a chunk count twice"),
        ({"schedules": ["interleaved"], "num_chunks": []}, "at least 1 item"),
        (
            {"schedules": ["1f1b", "v-half"], "num_chunks": [4]},
            "applies only to schedules with several stages per device (interleaved, "
            "bpipe-interleaved)",
        ),
    ],
)
def test_bad_chunk_requests_say_what_to_change(search, message):
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SearchSpec.model_validate(search)


def test_the_default_is_two_and_left_out_of_the_json():
    spec = SearchSpec(schedules=["interleaved"])
    assert spec.num_chunks == [2] and "num_chunks" not in spec.model_dump()
    # Given explicitly, even the default needs a family that takes it: nothing is ignored.
    with pytest.raises(ValidationError, match="applies only"):
        SearchSpec(schedules=["1f1b"], num_chunks=[2])
    assert "num_chunks" not in SearchSpec(schedules=["1f1b"]).model_dump()
    # Omitted schedules search every family, interleaved among them.
    assert SearchSpec.model_validate({"num_chunks": [3, 2]}).num_chunks == [2, 3]


def test_a_candidate_carries_chunks_only_where_its_family_takes_them():
    with pytest.raises(ValidationError, match="1f1b takes no num_chunks"):
        _config(2, schedule="1f1b")
    with pytest.raises(ValidationError, match="needs at least 2 chunks per device"):
        _config(1)
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        CandidateConfig.model_validate({**_config(2).model_dump(), "num_chunks": 0})
    # Written before the field (no num_chunks): v = 2, and written back the same.
    old = _config(2).model_dump(mode="json")
    assert "num_chunks" not in old
    loaded = CandidateConfig.model_validate(old)
    assert loaded.num_chunks == 2 and loaded.model_dump(mode="json") == old
    assert json.loads(_config(4).model_dump_json())["num_chunks"] == 4
    assert _config(4).schedule_label == "interleaved v=4"
    assert _config(2).schedule_label == "interleaved"
    # One layer count per stage: p x v of them (an empty list is a rejected point's).
    wrong = {**_config(4).model_dump(), "layers_per_stage": [8, 8]}
    with pytest.raises(ValidationError, match="layers_per_stage has 2 entries, but interleaved "
                       r"with p = 4, v = 4 has 16 stages; give one per stage"):  # fmt: skip
        CandidateConfig.model_validate(wrong)
    with pytest.raises(ValidationError, match="without interleaving"):
        CandidateConfig.model_validate(
            {**_config(2).model_dump(), "schedule": "bpipe-interleaved", "num_chunks": 1}
        )


def test_a_family_without_chunks_has_none():
    config = CandidateConfig(
        t=1,
        p=4,
        d=1,
        micro_batch_size=1,
        num_microbatches=8,
        recompute="none",
        schedule="1f1b",
        layers_per_stage=[4] * 4,
    )
    assert config.num_chunks is None and "num_chunks" not in config.model_dump()


# ------------------------------------------------------------------ launch and measurements


def test_the_launch_builds_the_candidates_chunks():
    request = _request(schedules=["interleaved"], num_chunks=[4])
    result = plan(request)
    four = next(c for c in result.candidates if c.config.p == 4)
    ir = materialize_launch(request, four).executor_config["schedule"]
    assert ir["num_stages"] == 16 and ir["stage_devices"] == [s % 4 for s in range(16)]


def _run(**config: object) -> MeasuredRun:
    return MeasuredRun.model_validate(
        {
            "model": _MODEL,
            "cluster": {"gpu": "cpu", "num_nodes": 1, "gpus_per_node": 4},
            "training": {"global_batch_size": 32, "precision": "fp32"},
            "config": {
                "t": 1,
                "p": 4,
                "d": 1,
                "micro_batch_size": 1,
                "recompute": "none",
                "schedule": "interleaved",
                **config,
            },
            "measured": {"kind": "step", "step_time_s": 1.0},
            "source": "test",
            "measured_on": "2025-01-01",
        }
    )


def test_a_measured_run_rebuilds_its_chunks():
    run = _run(num_chunks=4)
    config = candidate_config(run)
    assert config.num_chunks == 4 and config.layers_per_stage == [1] * 16
    assert plan_request(run).search.num_chunks == [4]
    # Stored before the field, or with the default written out: one run, one fingerprint.
    assert fingerprint(_run()) == fingerprint(_run(num_chunks=2))
    assert candidate_config(_run()).num_chunks == 2
    with pytest.raises(ValidationError, match="1f1b takes no num_chunks"):
        _run(schedule="1f1b", num_chunks=4)
    with pytest.raises(ValidationError, match="layers_per_stage"):
        _run(num_chunks=4, layers_per_stage=[2] * 8)
    # More stages than layers + 2: no split exists, so asking for one would not help.
    with pytest.raises(ValidationError, match="16 layers cannot fill the 72 stages of "
                       "interleaved with p = 4: only the end stages may hold no layer; check p "
                       "and num_chunks"):  # fmt: skip
        _run(num_chunks=18)


def test_cpsat_refines_a_split_over_the_candidates_chunks():
    """CP-SAT chooses the layers of every one of the p x v stages, each device's v stages
    summed on it, and keeps the candidate's v; its solution passes the solver-free check."""
    from planner.search.cpsat import RefineOptions, check, refine

    request = _request(schedules=["interleaved"], num_chunks=[4])
    ctx = PlanContext.from_store(request, default_store())
    coarse = _config(4)
    outcome = refine(ctx, coarse, ("none", "full"), 1e12, RefineOptions(time_limit_s=2.0))
    assert outcome.config is not None and outcome.config.num_chunks == 4
    assert len(outcome.config.layers_per_stage) == 16
    assert sum(outcome.config.layers_per_stage) == 16
    memory, _ = check(ctx, outcome)
    assert len(memory) == 4
