"""Grid search: every candidate obeys the constraints, every rejection says why, ranking."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from planner.costmodel import PlanContext, price, stage_costs
from planner.costmodel.evaluate import estimate
from planner.costmodel.stages import num_stages, split_layers
from planner.plan import plan
from planner.profiles import default_store
from planner.schedules import generate
from planner.simulate import Durations, simulate
from planner.specs import CandidateConfig, Plan, PlanRequest

REPO = Path(__file__).resolve().parents[2]
ALL_SCHEDULES = ["gpipe", "1f1b", "interleaved", "bpipe", "v-min", "v-half", "v-zb", "2bw"]
V_SCHEDULES = ("v-min", "v-half", "v-zb", "1f1b-v")
INTERLEAVED = ("interleaved", "bpipe-interleaved")  # two looped stages per device by default


def request(
    *,
    gpu: str = "cpu",
    num_nodes: int = 1,
    gpus_per_node: int = 4,
    num_layers: int = 8,
    hidden_size: int = 256,
    heads: int = 8,
    seq_length: int = 128,
    vocab_size: int = 1024,
    batch: int = 16,
    precision: str = "fp32",
    schedules: list[str] | None = None,
    recompute: list[str] | None = None,
    sizes: list[int] | None = None,
    top_k: int = 1000,
) -> PlanRequest:
    data: dict[str, Any] = {
        "model": {
            "name": "tiny",
            "num_layers": num_layers,
            "hidden_size": hidden_size,
            "num_attention_heads": heads,
            "seq_length": seq_length,
            "vocab_size": vocab_size,
        },
        "cluster": {"gpu": gpu, "num_nodes": num_nodes, "gpus_per_node": gpus_per_node},
        "training": {
            "global_batch_size": batch,
            "precision": precision,
            "distributed_optimizer": False,
            "sequence_parallel": False,
        },
        "search": {
            "schedules": schedules or ["1f1b"],
            "allow_stale_weights": "2bw" in (schedules or []),
            "recompute": recompute or ["none"],
            "micro_batch_sizes": sizes,
            "top_k": top_k,
        },
    }
    return PlanRequest.model_validate(data)


def example(name: str, **search_changes: Any) -> PlanRequest:
    data = PlanRequest.model_validate_json((REPO / "examples" / name).read_text()).model_dump()
    data = copy.deepcopy(data)
    data["search"].update(search_changes)
    if "2bw" in data["search"]["schedules"]:
        data["search"]["allow_stale_weights"] = True
    return PlanRequest.model_validate(data)


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def expected_points(r: PlanRequest) -> set[tuple[int, int, int, int]]:
    """(t, p, d, mb) written from the constraints, independently of the search."""
    gpus = r.cluster.num_nodes * r.cluster.gpus_per_node
    sizes = r.search.micro_batch_sizes or [1, 2, 4, 8]
    out = set()
    for t in divisors(r.cluster.gpus_per_node):
        if r.model.num_attention_heads % t:
            continue
        for p in divisors(gpus // t):
            d = gpus // (t * p)
            for mb in sizes:
                if r.training.global_batch_size % (mb * d) == 0:
                    out.add((t, p, d, mb))
    return out


def stages_of(schedule: str, p: int) -> int:
    return 2 * p if schedule in (*V_SCHEDULES, *INTERLEAVED) else p


def assert_parallel_constraints(r: PlanRequest, c: CandidateConfig) -> None:
    gpus = r.cluster.num_nodes * r.cluster.gpus_per_node
    batch = r.training.global_batch_size
    assert r.model.num_attention_heads % c.t == 0
    assert r.cluster.gpus_per_node % c.t == 0
    assert c.t * c.p * c.d == gpus
    assert batch % (c.micro_batch_size * c.d) == 0
    assert c.num_microbatches == batch // (c.micro_batch_size * c.d)


def assert_schedule_constraints(r: PlanRequest, c: CandidateConfig) -> None:
    assert sum(c.layers_per_stage) == r.model.num_layers
    assert len(c.layers_per_stage) == stages_of(c.schedule, c.p)
    assert all(n >= 1 for n in c.layers_per_stage[1:-1])
    assert max(c.layers_per_stage) - min(c.layers_per_stage) <= 1
    if c.schedule in INTERLEAVED:
        assert c.num_microbatches % c.p == 0
    if c.schedule == "2bw":
        assert c.num_microbatches >= c.p
    if c.schedule in (*V_SCHEDULES, *INTERLEAVED, "bpipe"):
        assert c.p >= 2


SEARCHES: dict[str, dict[str, Any]] = {
    "1x4 all schedules": {"schedules": ALL_SCHEDULES, "recompute": ["none", "full"]},
    "1x8 all schedules": {
        "gpus_per_node": 8,
        "batch": 32,
        "schedules": ALL_SCHEDULES,
        "sizes": [1, 2, 4],
    },
    "2x4, 6 heads": {
        "num_nodes": 2,
        "hidden_size": 192,
        "heads": 6,
        "batch": 24,
        "schedules": ["1f1b", "interleaved", "bpipe", "v-half", "2bw"],
        "recompute": ["none", "selective", "full"],
    },
}


@pytest.fixture(scope="module", params=list(SEARCHES), ids=list(SEARCHES))
def searched(request: pytest.FixtureRequest) -> tuple[PlanRequest, Plan]:
    r = request_from(SEARCHES[request.param])
    return r, plan(r)


def request_from(changes: dict[str, Any]) -> PlanRequest:
    return request(**changes)


def test_every_candidate_meets_every_constraint(searched):
    r, result = searched
    assert result.candidates
    for candidate in result.candidates:
        assert_parallel_constraints(r, candidate.config)
        assert_schedule_constraints(r, candidate.config)


def test_every_rejected_point_meets_the_parallel_constraints(searched):
    r, result = searched
    for rejected in result.rejected:
        assert_parallel_constraints(r, rejected.config)
        assert rejected.reason


def test_the_grid_is_complete(searched):
    r, result = searched
    points = expected_points(r)
    configs = [c.config for c in result.candidates] + [x.config for x in result.rejected]
    seen = {(c.t, c.p, c.d, c.micro_batch_size) for c in configs}
    assert seen <= points
    per_point = len(r.search.schedules) * len(r.search.recompute)
    assert result.stats.evaluated == len(points) * per_point
    # top_k exceeds the feasible count here, so candidates + rejected list every point once.
    assert result.stats.feasible <= r.search.top_k
    listed = [(c.t, c.p, c.d, c.micro_batch_size, c.schedule, c.recompute) for c in configs]
    assert len(listed) == len(set(listed))
    assert set(listed) == {
        (*point, schedule, recompute)
        for point in points
        for schedule in r.search.schedules
        for recompute in r.search.recompute
    }


def test_stats_are_consistent(searched):
    _, result = searched
    stats = result.stats
    assert stats.evaluated == stats.feasible + len(result.rejected)
    assert stats.feasible >= len(result.candidates)
    assert stats.search_ms > 0


def test_candidates_are_ranked_by_predicted_time(searched):
    _, result = searched
    # Ties to the nanosecond are broken by semantics and memory (test_plan_flow).
    times = [round(c.predicted.iteration_time_s, 9) for c in result.candidates]
    assert times == sorted(times)
    assert result.best == result.candidates[0]
    for c in result.candidates:
        pr = c.predicted
        assert pr.samples_per_s == pytest.approx(
            result.request.training.global_batch_size / pr.iteration_time_s
        )
        assert pr.tokens_per_s == pytest.approx(pr.samples_per_s * result.request.model.seq_length)
        assert len(pr.memory_gib_per_device) == c.config.p
        assert pr.peak_memory_gib == max(pr.memory_gib_per_device)
        assert 0 < pr.mfu < 1
        assert 0 <= pr.bubble_fraction < 1


def test_no_tensor_degree_beyond_a_node_or_the_heads():
    # 6 heads on nodes of 4: t = 4 divides the node but not the heads; t = 8 spans nodes.
    r = request(num_nodes=2, hidden_size=192, heads=6, batch=24)
    result = plan(r)
    ts = {c.config.t for c in result.candidates} | {x.config.t for x in result.rejected}
    assert ts == {1, 2}


def test_a_tensor_degree_that_does_not_split_the_heads_is_named_in_the_notes():
    result = plan(request(num_nodes=2, hidden_size=192, heads=6, batch=24))
    assert result.notes == [
        "tensor-parallel degree 4 not searched: 4 does not divide the model's attention heads (6)"
    ]


def test_micro_batch_sizes_and_data_degrees_that_divide_no_batch_are_named_in_the_notes():
    # Global batch 13 on 4 GPUs: d in {1, 2, 4}; 13 is a multiple of mb x d only for
    # mb = 1, d = 1, so micro-batches 2 and 4 and d = 2 and 4 are never searched.
    result = plan(request(batch=13, sizes=[1, 2, 4], schedules=["1f1b", "gpipe"]))
    configs = [c.config for c in result.candidates] + [x.config for x in result.rejected]
    assert {(c.micro_batch_size, c.d) for c in configs} == {(1, 1)}
    assert len(result.notes) == 2
    mb_note, d_note = result.notes
    assert mb_note.startswith("micro-batch sizes 2, 4 not searched: the global batch 13 ")
    assert d_note.startswith("data-parallel degrees 2, 4 not searched")
    # A batch every listed size divides with every degree leaves nothing out.
    assert plan(request(batch=16, sizes=[1, 2, 4])).notes == []


def test_top_k_is_respected():
    r = request(schedules=ALL_SCHEDULES, top_k=3)
    result = plan(r)
    assert result.stats.feasible > 3
    assert len(result.candidates) == 3


def reasons_for(result: Plan, **match: Any) -> list[str]:
    return [
        x.reason
        for x in result.rejected
        if all(getattr(x.config, k) == v for k, v in match.items())
    ]


def test_interleaved_with_microbatches_not_a_multiple_of_p_is_rejected():
    # 24 samples, mb 4, d 1: m = 6 micro-batches on p = 4 devices.
    result = plan(request(batch=24, sizes=[4], schedules=["interleaved"]))
    reasons = reasons_for(result, p=4, d=1, num_microbatches=6)
    assert reasons and all("multiple of p = 4" in r for r in reasons)
    assert all(c.config.num_microbatches % c.config.p == 0 for c in result.candidates)


def test_2bw_with_fewer_microbatches_than_stages_is_rejected():
    # 8 samples, mb 4, d 1: m = 2 < p = 4.
    result = plan(request(batch=8, sizes=[4], schedules=["2bw"]))
    reasons = reasons_for(result, p=4, num_microbatches=2)
    assert reasons == ["2bw needs at least p = 4 micro-batches per batch, got 2"]


def test_a_v_schedule_with_an_empty_middle_stage_is_rejected():
    # 5 layers over 2 x 4 = 8 V stages: a middle stage would get none (1F1B's 4 stages fit).
    result = plan(request(num_layers=5, schedules=["1f1b", "v-half"]))
    reasons = reasons_for(result, p=4, schedule="v-half")
    assert reasons and all("cannot fill 8 stages" in r for r in reasons)
    assert any(c.config.p == 4 and c.config.schedule == "1f1b" for c in result.candidates)


@pytest.mark.parametrize("schedule", ["bpipe", "v-zb", "interleaved"])
def test_schedules_that_need_a_pipeline_reject_p_1(schedule):
    result = plan(request(schedules=[schedule]))
    reasons = reasons_for(result, p=1)
    assert reasons and all("at least 2 devices" in r for r in reasons)


def test_out_of_memory_is_rejected_with_its_numbers():
    r = example("gpt3-13b-8xa100.json", schedules=["1f1b"], recompute=["none"])
    usable = default_store().hardware("a100-sxm-80g").usable_memory_gib
    result = plan(r)
    oom = [x for x in result.rejected if "out of memory" in x.reason]
    assert oom
    for x in oom:
        assert x.predicted is not None
        assert x.predicted.peak_memory_gib > usable
        found = re.search(r"device (\d+) needs ([\d.]+) GiB > ([\d.]+) GiB usable", x.reason)
        assert found is not None, x.reason
        device, needs = int(found.group(1)), float(found.group(2))
        assert float(found.group(3)) == pytest.approx(usable)
        assert x.predicted.memory_gib_per_device[device] == pytest.approx(needs, abs=0.051)
        assert x.predicted.peak_memory_gib == pytest.approx(needs, abs=0.051)
    # The data-parallel-only layout keeps 13B x (2 + 4 + 12/8) bytes per GPU: ~91 GiB.
    assert any(x.config.p == 1 and x.config.t == 1 for x in oom)
    for c in result.candidates:
        assert c.predicted.peak_memory_gib <= usable


def test_nothing_fits_gives_no_best_and_rejects_everything():
    r = example("gpt3-13b-8xa100.json").model_dump()
    r["cluster"].update(num_nodes=1, gpus_per_node=1)
    result = plan(PlanRequest.model_validate(r))
    assert result.best is None
    assert result.candidates == []
    assert result.stats.feasible == 0
    assert len(result.rejected) == result.stats.evaluated > 0
    assert any("out of memory" in x.reason for x in result.rejected)


def test_bpipe_fits_the_96b_model_where_1f1b_does_not():
    """BPipe's headline case (§4): GPT-3 96B on 32 A100s, t = 4, p = 8, mb 2 with attention
    recomputation runs out of memory under 1F1B and fits with activation balancing."""
    r = example("gpt3-96b-32xa100.json")
    result = plan(r)
    assert result.best is not None
    target = {"t": 4, "p": 8, "d": 1, "micro_batch_size": 2, "recompute": "selective"}
    oom = reasons_for(result, schedule="1f1b", **target)
    assert len(oom) == 1 and oom[0].startswith("out of memory")
    assert reasons_for(result, schedule="bpipe", **target) == []

    narrow = plan(example("gpt3-96b-32xa100.json", micro_batch_sizes=[2], recompute=["selective"]))
    found = [
        c
        for c in narrow.candidates
        if c.config.schedule == "bpipe"
        and (c.config.t, c.config.p, c.config.d) == (4, 8, 1)
        and c.config.num_microbatches == 64
    ]
    assert len(found) == 1
    assert found[0].predicted.peak_memory_gib <= 78.5


# ----------------------------------------------------------------------------- price()


def _pricing_context() -> PlanContext:
    r = request(num_layers=16, batch=64)
    store = default_store()
    hw = store.hardware("cpu")
    return PlanContext(r, hw, list(store.layer_points(hw.name)))


def _full_makespan(ctx: PlanContext, config: CandidateConfig) -> float:
    costs = stage_costs(ctx, config)
    durations = Durations(
        forward=costs.forward,
        backward=costs.backward,
        weight=costs.weight,
        comm=costs.p2p_s,
        transfer=costs.transfer_s,
    )
    schedule = generate(config.schedule, config.p, config.num_microbatches)
    return simulate(schedule, durations).makespan


def _config(schedule: str, p: int, m: int) -> CandidateConfig:
    stages = stages_of(schedule, p)
    return CandidateConfig(
        t=1,
        p=p,
        d=1,
        micro_batch_size=1,
        num_microbatches=m,
        recompute="none",
        schedule=schedule,
        layers_per_stage=[16 // stages] * stages,
    )


@pytest.mark.parametrize(
    "schedule",
    ["gpipe", "1f1b", "interleaved", "bpipe", "v-half", "v-zb", "1f1b-v", "bpipe-interleaved"],
)
def test_price_simulates_short_runs_exactly(schedule):
    ctx = _pricing_context()
    config = _config(schedule, 4, 8)  # m = 2p: nothing extended
    priced = price(ctx, estimate(ctx, config))
    assert priced.makespan_s == pytest.approx(_full_makespan(ctx, config), rel=1e-9)


@pytest.mark.parametrize(
    "schedule, p, m",
    [
        ("gpipe", 4, 32),
        ("gpipe", 2, 40),
        ("1f1b", 4, 32),
        ("1f1b", 2, 40),
        ("interleaved", 4, 32),
        ("bpipe", 4, 32),
        ("v-min", 4, 32),
        ("v-half", 4, 32),
        ("v-half", 2, 40),
        ("v-zb", 4, 32),
        ("1f1b-v", 4, 32),
        ("1f1b-v", 3, 40),
        ("bpipe-interleaved", 4, 32),
    ],
)
def test_price_extends_the_steady_state_like_the_full_schedule(schedule, p, m):
    assert m > 3 * p + 2  # beyond the micro-batches price() simulates exactly
    ctx = _pricing_context()
    config = _config(schedule, p, m)
    priced = price(ctx, estimate(ctx, config))
    assert priced.makespan_s == pytest.approx(_full_makespan(ctx, config), rel=1e-6)


@pytest.mark.parametrize(
    "base, variant, example_file",
    [
        ("1f1b", "bpipe", "gpt3-96b-32xa100.json"),
        # No 96B configuration fits interleaved BPipe but not interleaved 1F1B.
        ("interleaved", "bpipe-interleaved", "gpt3-30b-seq4096-8xa100.json"),
    ],
)
def test_bpipe_beside_its_base_is_searched_only_where_the_base_runs_out_of_memory(
    base, variant, example_file
):
    """BPipe §4.2: activation balancing is evaluated only for configurations Megatron-LM's
    1F1B (or interleaved 1F1B, Appendix A) cannot run; where the base fits, BPipe's
    transfers would only cost time. "Fits" is the base's estimate with its even layer split
    and one recompute mode; a candidate's per-stage refinement may relabel its mode."""
    r = example(example_file, schedules=[base, variant], top_k=1000)
    result = plan(r)
    ctx = PlanContext.from_store(r, default_store())
    capacity = ctx.hardware.usable_memory_gib * 2**30

    def base_fits(c: CandidateConfig, recompute: str) -> bool:
        layers = split_layers(r.model.num_layers, num_stages(base, c.p))
        even = c.model_copy(
            update={
                "schedule": base,
                "layers_per_stage": layers,
                "recompute": recompute,
                "recompute_per_stage": None,
            }
        )
        return estimate(ctx, even, capacity).peak_memory <= capacity

    balanced = [c.config for c in result.candidates if c.config.schedule == variant]
    assert balanced, f"the example has configurations only {variant} fits"
    assert all(any(not base_fits(c, mode) for mode in r.search.recompute) for c in balanced)
    skipped = [x for x in result.rejected if "would only add transfers" in x.reason]
    assert skipped and all(x.config.schedule == variant for x in skipped)
    assert all(base_fits(x.config, x.config.recompute) for x in skipped)
    # Asked for on its own, BPipe is priced wherever it fits.
    alone = plan(example(example_file, schedules=[variant], top_k=1000))
    assert len(alone.candidates) > len(balanced)


def test_a_memory_saving_variant_falls_back_only_to_a_base_that_is_searched():
    from planner.search.grid import _fallback_base

    assert _fallback_base("bpipe", ["1f1b", "bpipe"]) == "1f1b"
    assert _fallback_base("bpipe-interleaved", ["interleaved", "bpipe-interleaved"]) == (
        "interleaved"
    )
    assert _fallback_base("bpipe", ["bpipe", "interleaved"]) is None  # priced as asked
    assert _fallback_base("1f1b", ["1f1b", "bpipe"]) is None  # no variant


def test_the_pricing_work_of_a_shape_is_building_and_simulating_its_timing_runs():
    from planner.schedules import generation_work, schedule_actions
    from planner.search.cost import _pricing_work

    def work(schedule: str, m: int, **parameters: float) -> int:
        built = generation_work(schedule, 4, m, **parameters)
        return built + schedule_actions(schedule, 4, m, **parameters)

    # 40 micro-batches on 4 devices: 3p + 2 = 14 simulated, and 10 for the slope.
    assert _pricing_work("1f1b", 4, 40) == work("1f1b", 14) + work("1f1b", 10)
    assert _pricing_work("1f1b", 4, 9) == work("1f1b", 9) + work("1f1b", 5)
    # 2BW: two and three batches of the simulated micro-batches.
    assert _pricing_work("2bw", 4, 40) == work("2bw", 14, num_batches=2) + work(
        "2bw", 14, num_batches=3
    )


def _key(c: CandidateConfig) -> tuple[object, ...]:
    return (c.t, c.p, c.d, c.micro_batch_size, c.recompute)


def test_bpipe_transfer_notes_follow_appendix_b():
    from planner.assemble import _transfer_note

    assert "hidden behind compute" in _transfer_note(0.010, 0.020, 0.040)
    # 25 ms > F = 20 ms, but 2 x 25 <= F + B = 60 ms: the relaxed bound of Eqs. 10-12.
    relaxed = _transfer_note(0.025, 0.020, 0.040)
    assert "(F + B) / 2 = 30.00 ms" in relaxed and "Eqs. 10-12" in relaxed
    assert "stretches the step" in _transfer_note(0.035, 0.020, 0.040)


def test_bpipe_on_a_pipeline_too_short_to_evict_says_it_moves_nothing():
    # Only stages s <= (p - 4) / 2 evict (BPipe's pairing): none on 2 devices, one on 4.
    for p, evicts in ((2, False), (4, True)):
        r = request(gpus_per_node=p, num_layers=8, schedules=["bpipe"], sizes=[1])
        chosen = next(c for c in plan(r).candidates if c.config.p == p)
        moves = [n for n in chosen.notes if n.startswith("BPipe transfer")]
        still = [n for n in chosen.notes if "moves no activations" in n]
        assert (len(moves), len(still)) == ((1, 0) if evicts else (0, 1))


def test_a_candidate_says_when_megatrons_fused_softmax_cannot_run():
    from planner.assemble import _softmax_fallback_note
    from planner.costmodel import PlanContext

    r = example("gpt3-96b-32xa100.json")  # 104 heads
    ctx = PlanContext.from_store(r, default_store())

    def config(t: int, mb: int) -> CandidateConfig:
        p = 32 // t
        return CandidateConfig(
            t=t,
            p=p,
            d=1,
            micro_batch_size=mb,
            num_microbatches=128 // mb,
            recompute="selective",
            schedule="1f1b",
            layers_per_stage=[80 // p] * p,
        )

    note = _softmax_fallback_note(ctx, config(8, 1))  # 13 attention batches per rank
    assert note is not None and "13 attention batches" in note
    assert _softmax_fallback_note(ctx, config(8, 4)) is None  # 52
    assert _softmax_fallback_note(ctx, config(4, 2)) is None  # 52
    # The note names the cause: a sequence the kernel does not take is not a batch count.
    short = r.model_copy(update={"model": r.model.model_copy(update={"seq_length": 16})})
    note = _softmax_fallback_note(PlanContext.from_store(short, default_store()), config(8, 4))
    assert note is not None and "sequence length 16" in note
    assert "attention batches" not in note and "multiple of it" not in note


def _with_sequence_parallel(r: PlanRequest, **changes: Any) -> PlanRequest:
    """``r`` with sequence parallelism on, flash attention and the request's ``changes``
    (``seq_length`` to the model, ``context_parallel`` to the search)."""
    data = r.model_dump()
    data["training"].update(sequence_parallel=True, flash_attention=True)
    if "seq_length" in changes:
        data["model"]["seq_length"] = changes["seq_length"]
    if "context_parallel" in changes:
        data["search"]["context_parallel"] = changes["context_parallel"]
    return PlanRequest.model_validate(data)


def test_sequence_parallelism_searches_no_t_that_does_not_split_the_sequence():
    # Megatron-LM scatters the [s, b, h] activations over the tensor-parallel ranks with
    # sequence parallelism and asserts s % t == 0 (tensor_parallel/mappings.py,
    # _split_along_first_dim): 126 tokens split over 1, 2, 3 and 6, not over 4 or 12.
    r = _with_sequence_parallel(
        request(gpus_per_node=12, hidden_size=192, heads=12, batch=24), seq_length=126
    )
    result = plan(r)
    configs = [c.config for c in result.candidates] + [x.config for x in result.rejected]
    assert {c.t for c in configs} == {1, 2, 3, 6}
    assert [n for n in result.notes if n.startswith("tensor-parallel")] == [
        f"tensor-parallel degree {t} not searched: {t} does not divide the model's sequence "
        f"length (126), which training.sequence_parallel splits over the tensor-parallel "
        f"ranks (false searches it)"
        for t in (4, 12)
    ]
    # Without sequence parallelism the sequence is not split: every t is searched.
    data = r.model_dump()
    data["training"]["sequence_parallel"] = False
    unsplit = plan(PlanRequest.model_validate(data))
    configs = [c.config for c in unsplit.candidates] + [x.config for x in unsplit.rejected]
    assert {c.t for c in configs} == {1, 2, 3, 4, 6, 12}


def test_sequence_parallelism_searches_no_cp_that_leaves_t_a_share_it_cannot_split():
    # 1,028 tokens: 2 x cp divides them for cp = 2 (514 a rank), and t = 4 divides 1,028 but
    # not 514, so (t 4, cp 2) would fail Megatron-LM's scatter; (t 2, cp 2) and (t 4, cp 1)
    # run. Named in the notes when the request names cp; left out by the default cp search.
    named = _with_sequence_parallel(
        request(gpus_per_node=8, batch=16), seq_length=1028, context_parallel=[1, 2]
    )
    result = plan(named)
    configs = [c.config for c in result.candidates] + [x.config for x in result.rejected]
    pairs = {(c.t, c.cp) for c in configs}
    assert pairs == {(1, 1), (1, 2), (2, 1), (2, 2), (4, 1)}
    assert (
        "context-parallel degree 2 not searched with tensor-parallel degree 4: sequence "
        "parallelism splits each rank's 514 tokens (seq_length / cp) over t = 4, which does "
        "not divide them (training.sequence_parallel false searches it)"
    ) in result.notes
    default = plan(_with_sequence_parallel(request(gpus_per_node=8, batch=16), seq_length=1028))
    configs = [c.config for c in default.candidates] + [x.config for x in default.rejected]
    assert {(c.t, c.cp) for c in configs} == {(1, 1), (1, 2), (2, 1), (2, 2), (4, 1)}
    assert not [n for n in default.notes if n.startswith("context-parallel")]


@pytest.mark.parametrize(
    "schedule, chunks, layers",
    [("1f1b", None, [2, 2, 2, 2]), ("interleaved", 2, [1] * 8), ("v-zb", None, [1] * 8)],
)
def test_a_points_configs_equal_validating_each_mode(schedule, chunks, layers):
    """The grid validates one config per point and schedule and copies it for the other
    recompute modes: each copy is the config validating it would give, with its own mode."""
    from planner.search.grid import SearchPoint, _configs

    point = SearchPoint(t=1, p=4, d=1, mb=2)
    modes = ["full", "none", "selective"]
    made = _configs(point, 8, modes, schedule, layers, chunks)
    assert [config.recompute for config in made] == modes
    assert made == [
        CandidateConfig(
            t=1,
            p=4,
            d=1,
            micro_batch_size=2,
            num_microbatches=8,
            recompute=mode,
            schedule=schedule,
            layers_per_stage=layers,
            num_chunks=chunks,
        )
        for mode in modes
    ]
    assert [config.model_dump() for config in made] == [
        CandidateConfig.model_validate(config.model_dump()).model_dump() for config in made
    ]
