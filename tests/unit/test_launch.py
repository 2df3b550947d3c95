"""Launch artefacts of planned candidates: the typed executor config, torchrun lines,
Megatron-LM arguments (checked against Megatron-LM's own parser), torch CSV, runtimes, and the
files ``--emit`` writes."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import tarfile
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from cli.main import main
from executor.inputs import BadInput, read_config
from planner.launch import (
    EXECUTOR_CONFIG_FORMAT,
    MEGATRON_FLAGS,
    SCHEDULE_REFERENCE_FORMAT,
    ExecutorConfig,
    StageSpec,
    materialize_launch,
    stage_recompute,
)
from planner.launch.files import launch_archive, launch_files
from planner.launch.megatron import MEGATRON_COMMIT, megatron_launch
from planner.launch.schema import SCHEMAS, schema_text
from planner.placement import place
from planner.plan import plan
from planner.schedules import ActionKind, Schedule, families, generate, schedule_family
from planner.specs import Candidate, CandidateConfig, Plan, PlanRequest, RecomputeSplit

REPO = Path(__file__).resolve().parents[2]
ALL_SCHEDULES = ("gpipe", "1f1b", "interleaved", "bpipe", "v-min", "v-half", "v-zb", "2bw")
CELL = re.compile(r"(\d+)([FBIW])(\d+)")


def request(
    *,
    num_layers: int = 8,
    num_nodes: int = 1,
    gpus_per_node: int = 4,
    hidden_size: int = 256,
    heads: int = 8,
    batch: int = 16,
    schedules: tuple[str, ...] = ALL_SCHEDULES,
    recompute: tuple[str, ...] = ("none", "selective", "full"),
    sizes: tuple[int, ...] = (1, 2),
    precision: str = "fp32",
    sequence_parallel: bool = False,
    flash_attention: bool = False,
    runtime: str = "any",
) -> PlanRequest:
    data: dict[str, Any] = {
        "model": {
            "name": "tiny",
            "num_layers": num_layers,
            "hidden_size": hidden_size,
            "num_attention_heads": heads,
            "seq_length": 64,
            "vocab_size": 512,
        },
        "cluster": {"gpu": "cpu", "num_nodes": num_nodes, "gpus_per_node": gpus_per_node},
        "training": {
            "global_batch_size": batch,
            "precision": precision,
            "distributed_optimizer": False,
            "sequence_parallel": sequence_parallel,
            "flash_attention": flash_attention,
        },
        "search": {
            "schedules": list(schedules),
            "allow_stale_weights": "2bw" in schedules,
            "recompute": list(recompute),
            "micro_batch_sizes": list(sizes),
            "top_k": 1000,
            "runtime": runtime,
        },
    }
    return PlanRequest.model_validate(data)


@cache
def tiny_plan(schedules: tuple[str, ...] = ALL_SCHEDULES) -> Plan:
    return plan(request(schedules=schedules))


@cache
def launched(schedules: tuple[str, ...] = ALL_SCHEDULES) -> list[Candidate]:
    """A tiny plan's candidates with their launch artefacts materialized (as `--emit`,
    `stagewright run` and the service's launch routes give them)."""
    planned = tiny_plan(schedules)
    return [
        c.model_copy(update={"launch": materialize_launch(planned.request, c)})
        for c in planned.candidates
    ]


def candidates(**match: Any) -> list[Candidate]:
    schedule = match.get("schedule")
    # BPipe is searched beside 1F1B only where 1F1B runs out of memory, which the tiny
    # model never does: ask for it on its own.
    alone = schedule is not None and schedule_family(schedule).memory_fallback_for is not None
    source = launched((schedule,)) if alone else launched()
    found = [c for c in source if all(getattr(c.config, k) == v for k, v in match.items())]
    assert found, f"no candidate with {match}"
    return found


SAMPLE = [candidates(schedule=name, p=p)[0] for name in ALL_SCHEDULES for p in (4, 2)]
IDS = [f"{c.config.schedule}-t{c.config.t}p{c.config.p}d{c.config.d}" for c in SAMPLE]


# ---------------------------------------------------------------------- executor config
@pytest.mark.parametrize("stored", tiny_plan().candidates[:40], ids=lambda c: c.config.schedule)
def test_a_plan_stores_schedules_by_generator_parameters(stored):
    """A stored candidate's size does not grow with devices x micro-batches: the schedule
    is its generator's parameters, the placement its rule, no CSV; materializing gives
    exactly what building the schedule and placement directly gives."""
    config = stored.config
    compact = stored.launch.executor_config
    assert compact["schedule"] == {
        "format": SCHEDULE_REFERENCE_FORMAT,
        "name": config.schedule,
        "num_devices": config.p,
        "num_microbatches": config.num_microbatches,
        "parameters": schedule_family(config.schedule).resolve({}),
    }
    assert "ranks" not in compact["placement"] or compact["placement"]["ranks"] is None
    assert stored.launch.torch_pipelining_csv is None
    full = materialize_launch(tiny_plan().request, stored)
    document = ExecutorConfig.model_validate(full.executor_config)
    assert not document.compact
    assert document.ir == generate(config.schedule, config.p, config.num_microbatches)
    assignment = compact["placement"]["assignment"]
    assert document.coords == place(config.t, config.p, config.d, 4, assignment).coords
    assert ExecutorConfig.model_validate(full.executor_config).materialized() == document


@pytest.mark.parametrize("candidate", SAMPLE, ids=IDS)
def test_executor_config_is_the_typed_document_of_the_candidate(candidate):
    config = candidate.config
    document = ExecutorConfig.model_validate(candidate.launch.executor_config)  # validates all
    assert document.format == EXECUTOR_CONFIG_FORMAT
    schedule = document.ir
    assert schedule.name == config.schedule and schedule.num_devices == config.p
    assert schedule.num_microbatches == config.num_microbatches
    assert (document.parallel.t, document.parallel.p, document.parallel.d) == (
        config.t,
        config.p,
        config.d,
    )
    assert [s.num_layers for s in document.stages] == config.layers_per_stage
    assert [s.recompute for s in document.stages] == stage_recompute(config)
    assert [s.recompute.total for s in document.stages] == config.layers_per_stage
    starts = [s.first_layer for s in document.stages]
    assert starts == [sum(config.layers_per_stage[:i]) for i in range(len(starts))]
    coords = {document.coords_of(r) for r in range(document.world_size)}
    assert len(coords) == config.t * config.p * config.d
    expected = "pair-adjacent" if schedule_family(config.schedule).transfers else "standard"
    assert document.placement.assignment == expected
    # The prediction travels with the config: stagewright run compares with it.
    predicted = document.predicted
    assert predicted is not None and predicted.hardware == "cpu"
    assert predicted.iteration_time_s == candidate.predicted.iteration_time_s
    assert predicted.memory_gib_per_device == pytest.approx(
        candidate.predicted.memory_gib_per_device, abs=1e-3
    )
    assert len(predicted.saved_activation_bytes) == config.p
    assert all(b > 0 for b in predicted.saved_activation_bytes)


def test_per_stage_recompute_puts_full_layers_first():
    config = CandidateConfig(
        t=1,
        p=2,
        d=1,
        micro_batch_size=1,
        num_microbatches=2,
        recompute="full",
        schedule="1f1b",
        layers_per_stage=[3, 2],
        recompute_per_stage=[
            RecomputeSplit(none=1, selective=1, full=1),
            RecomputeSplit(none=2),
        ],
    )
    first, second = stage_recompute(config)
    stage = StageSpec(first_layer=0, recompute=first)
    assert stage.layer_modes() == ["full", "selective", "none"]
    assert StageSpec(first_layer=3, recompute=second).layer_modes() == ["none", "none"]


def _document(**changes: Any) -> dict[str, Any]:
    data = json.loads(json.dumps(candidates(schedule="1f1b", p=2)[0].launch.executor_config))
    for path, value in changes.items():
        target = data
        *parents, last = path.split("__")
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        target[last] = value
    return data


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"format": "stagewright.executor-config/1"}, "plan again with this version"),
        ({"stages__1__first_layer": 5}, "should start at"),
        ({"parallel__p": 4}, "parallel.p is 4"),
        ({"num_microbatches": 3}, "micro-batches per batch"),
        ({"training__global_batch_size": 5}, "global_batch_size is 5"),
        ({"schedule__actions": [["0F0"], []]}, "schedule:"),
        (
            {"placement__ranks": None, "placement__gpus_per_node": 3},
            "placement: 4 ranks do not fill whole nodes of 3 GPUs",
        ),
    ],
)
def test_a_bad_executor_config_says_what_to_change(changes, message):
    with pytest.raises(ValidationError, match=re.escape(message)):
        ExecutorConfig.model_validate(_document(**changes))


@pytest.mark.parametrize(
    "built_by, named, message",
    [
        # The QA case: run and reported as 1f1b, then --record died on layers_per_stage.
        ("interleaved", "1f1b", "place 4 stages on 2 devices as [0, 1, 0, 1], where 1f1b places 2"),
        ("1f1b", "v-zb", "place 2 stages on 2 devices as [0, 1], where v-zb places 4"),
        ("v-zb", "1f1b-v", "split the backward into B and W, which 1f1b-v does not"),
        ("1f1b", "zb-adaptive", "do not split the backward into B and W, which zb-adaptive does"),
        ("v-zb", "no-such-schedule", "unknown schedule 'no-such-schedule'"),
    ],
)
def test_a_schedule_name_that_did_not_build_its_actions_is_refused(built_by, named, message):
    """The name is data the run is priced, reported and recorded by: an executor config
    whose schedule.name is another family than the one its actions are (stages placed
    otherwise, a split backward or not) is refused, saying what differs. Each family's own
    actions pass."""
    data = json.loads(json.dumps(candidates(schedule=built_by, p=2)[0].launch.executor_config))
    assert "actions" in data["schedule"]
    assert ExecutorConfig.model_validate(data).ir.name == built_by
    data["schedule"]["name"] = named
    with pytest.raises(ValidationError, match=re.escape(message)):
        ExecutorConfig.model_validate(data)


def test_only_the_end_stages_of_an_executor_config_may_hold_no_layer():
    """The first stage may hold only the embedding and the last only the output layer (the
    V-shape paper's layout); a middle stage without a layer is refused, naming it."""
    data = json.loads(json.dumps(candidates(schedule="1f1b", p=4)[0].launch.executor_config))
    assert [s["recompute"]["none"] for s in data["stages"]] == [2, 2, 2, 2]

    def with_layers(counts: list[int]) -> dict[str, Any]:
        changed = json.loads(json.dumps(data))
        first = 0
        for stage, n in zip(changed["stages"], counts, strict=True):
            stage["first_layer"], stage["recompute"] = first, {"none": n}
            first += n
        return changed

    assert ExecutorConfig.model_validate(with_layers([0, 4, 4, 0])).stages[0].num_layers == 0
    with pytest.raises(ValidationError, match=re.escape("stage 2 holds no layer")):
        ExecutorConfig.model_validate(with_layers([3, 3, 0, 2]))


def test_an_executor_config_saved_with_a_byte_order_mark_reads(tmp_path):
    """A config re-saved by a Windows editor (a byte-order mark first) was "not a valid
    executor config (config: Invalid JSON: expected value at line 1 column 1)"."""
    path = tmp_path / "executor-config.json"
    path.write_text(json.dumps(_document()), encoding="utf-8-sig")
    assert read_config(path) == ExecutorConfig.model_validate(_document())


def test_a_plan_request_given_as_an_executor_config_says_to_plan_it():
    """`stagewright run examples/tiny-cpu.json` (a request, not a config) said "format is
    None ... plan again with this version", which reads like a version mismatch."""
    path = REPO / "examples" / "tiny-cpu.json"
    with pytest.raises(BadInput) as info:
        read_config(path)
    message = str(info.value)
    assert message.startswith(f"{path} is a plan request, not an executor config: ")
    assert f"stagewright plan {path} --emit DIR" in message
    assert "DIR/candidate-1/executor-config.json" in message and "run-node0.sh" in message
    assert "format is None" not in message and "plan again" not in message
    request = json.loads(path.read_text())
    with pytest.raises(ValidationError, match="this is a plan request, not an executor config"):
        ExecutorConfig.model_validate(request)
    del request["cluster"]  # no longer a request: the missing format is named as such
    with pytest.raises(ValidationError, match="it has no format; an executor config has"):
        ExecutorConfig.model_validate(request)


def test_what_the_executor_cannot_run_is_refused_at_planning_time():
    """fp16 with 2BW (its loss scaler needs a flush to skip a step everywhere) and a
    vocabulary t does not divide: no runtime can run them as planned, and the plan says why."""
    fp16 = plan(request(schedules=("2bw",), precision="fp16", recompute=("none",)))
    assert not fp16.candidates
    assert fp16.rejected and all("use bf16" in r.reason for r in fp16.rejected)
    odd = request(schedules=("bpipe",), recompute=("none",)).model_dump()
    odd["model"]["vocab_size"] = 511
    refused = plan(PlanRequest.model_validate(odd))
    limited = [r.reason for r in refused.rejected if r.config.t > 1 and r.config.p > 1]
    assert limited and all("does not divide the vocabulary of 511" in r for r in limited)


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_the_published_json_schemas_are_current(name):
    published = (REPO / "docs" / name).read_text(encoding="utf-8")
    assert published == schema_text(name), (
        f"docs/{name} is stale: run python -m planner.launch.schema docs"
    )


# ---------------------------------------------------------------------- torchrun
def test_one_node_runs_standalone_without_an_address():
    for candidate in tiny_plan().candidates[:5]:
        assert candidate.launch.torchrun == [
            "torchrun --standalone --nproc-per-node=4 -m executor.worker executor-config.json"
        ]


@pytest.mark.parametrize("num_nodes, per_node", [(2, 2), (4, 2)])
def test_several_nodes_get_one_line_each_with_the_master_address(num_nodes, per_node):
    batch = 8 * num_nodes * per_node
    result = plan(request(num_nodes=num_nodes, gpus_per_node=per_node, batch=batch, heads=4))
    assert result.candidates
    for candidate in result.candidates:
        assert candidate.launch.torchrun == [
            f"torchrun --nnodes={num_nodes} --node-rank={node} --nproc-per-node={per_node} "
            "--master-addr=$MASTER_ADDR --master-port=${MASTER_PORT:-29500} "
            "--rdzv-conf=timeout=${RDZV_TIMEOUT:-900} -m executor.worker executor-config.json"
            for node in range(num_nodes)
        ]


# ---------------------------------------------------------------------- Megatron-LM
# The flags stagewright emits, each checked against the parser Megatron-LM builds in
# megatron/training/arguments.py (add_megatron_arguments, including the TransformerConfig
# fields it exposes through ArgumentGroupFactory) at commit MEGATRON_COMMIT.
MEGATRON_FLAGS_USED = {
    "--accumulate-allreduce-grads-in-fp32",
    "--attention-backend",
    "--bf16",
    "--context-parallel-size",
    "--data-path",
    "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers",
    "--disable-bias-linear",
    "--ffn-hidden-size",
    "--fp16",
    "--global-batch-size",
    "--group-query-attention",
    "--hidden-size",
    "--lr",
    "--make-vocab-size-divisible-by",
    "--max-position-embeddings",
    "--merge-file",
    "--micro-batch-size",
    "--mock-data",
    "--normalization",
    "--num-attention-heads",
    "--num-layers",
    "--num-layers-per-virtual-pipeline-stage",
    "--num-query-groups",
    "--optimizer",
    "--pipeline-model-parallel-layout",
    "--pipeline-model-parallel-size",
    "--position-embedding-type",
    "--recompute-granularity",
    "--recompute-method",
    "--recompute-modules",
    "--recompute-num-layers",
    "--seq-length",
    "--sequence-parallel",
    "--swiglu",
    "--tensor-model-parallel-size",
    "--tokenizer-type",
    "--train-iters",
    "--untie-embeddings-and-output-weights",
    "--use-distributed-optimizer",
    # DistributedInitConfig.use_tp_pp_dp_mapping (megatron/training/config/common_config.py),
    # a store_true flag through ArgumentGroupFactory; initialize.py passes it as the order.
    "--use-tp-pp-dp-mapping",
    "--vocab-file",
    "--vocab-size",
}


def test_the_list_of_megatron_flags_is_the_checked_one():
    assert MEGATRON_COMMIT == "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
    assert set(MEGATRON_FLAGS) == MEGATRON_FLAGS_USED
    # Flags current Megatron-LM no longer has (a no-op or removed) stay out.
    assert "--use-flash-attn" not in MEGATRON_FLAGS
    assert "--recompute-activations" not in MEGATRON_FLAGS


def flags_of(args: str) -> dict[str, str | None]:
    tokens = args.split()
    flags: dict[str, str | None] = {}
    for i, token in enumerate(tokens):
        if token.startswith("--"):
            value = tokens[i + 1] if i + 1 < len(tokens) else None
            flags[token] = None if value is None or value.startswith("--") else value
    return flags


MEGATRON_PLANS = [
    request(schedules=("1f1b", "interleaved")),
    request(schedules=("1f1b",), precision="bf16", sequence_parallel=True, flash_attention=True),
    request(schedules=("1f1b", "interleaved"), num_layers=10, precision="fp16"),
    request(
        schedules=("1f1b",),
        num_layers=14,
        gpus_per_node=6,
        hidden_size=192,
        heads=6,
        batch=12,
        sizes=(1,),
    ),
]


def test_every_emitted_megatron_flag_exists_in_megatron():
    seen: set[str] = set()
    for result in map(plan, MEGATRON_PLANS):
        for candidate in result.candidates:
            if candidate.launch.megatron_args is not None:
                seen |= set(flags_of(candidate.launch.megatron_args))
        for item in launch_files(result):
            if item.path.endswith("megatron-node0.sh"):  # the Megatron arguments it adds
                lines = [
                    x.rpartition("pretrain_gpt.py")[2]
                    for x in item.content.splitlines()
                    if "_ARGS" in x
                ]
                seen |= set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", "\n".join(lines)))
    assert seen <= MEGATRON_FLAGS_USED, seen - MEGATRON_FLAGS_USED
    assert {"--attention-backend", "--vocab-size", "--sequence-parallel"} <= seen


def test_megatron_args_carry_precision_attention_vocabulary_and_parallelism():
    result = plan(MEGATRON_PLANS[1])
    candidate = next(c for c in result.candidates if c.config.t == 2)
    flags = flags_of(candidate.launch.megatron_args or "")
    assert flags["--attention-backend"] == "flash"
    assert "--bf16" in flags and "--sequence-parallel" in flags
    # Megatron pads the vocabulary to a multiple of (divisible-by x t): 512 stays 512.
    divisor, t = int(flags["--make-vocab-size-divisible-by"] or 0), candidate.config.t
    assert flags["--vocab-size"] == "512" and 512 % (divisor * t) == 0
    index = result.candidates.index(candidate) + 1
    script = {f.path: f for f in launch_files(result)}[f"candidate-{index}/megatron-node0.sh"]
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in script.content
    plain = plan(MEGATRON_PLANS[0]).candidates[0]
    assert flags_of(plain.launch.megatron_args or "")["--attention-backend"] == "unfused"


def test_megatron_keeps_gradients_in_fp32_as_the_plan_counts_them():
    """The plan counts 4 bytes of gradient a parameter in every precision (the executor
    accumulates in fp32); Megatron-LM does so by itself for bf16 (arguments.py turns on
    accumulate_allreduce_grads_in_fp32) but keeps fp16 gradients in fp16 unless told."""
    for precision in ("fp16", "bf16"):
        result = plan(request(schedules=("1f1b",), precision=precision))
        candidate = result.candidates[0]
        flags = flags_of(candidate.launch.megatron_args or "")
        assert f"--{precision}" in flags
        assert ("--accumulate-allreduce-grads-in-fp32" in flags) == (precision == "fp16")
        grads = candidate.breakdown[0].gradients_gib * 2**30
        parameters = candidate.breakdown[0].parameters_gib * 2**30 / 2  # 2-byte weights
        assert grads == pytest.approx(4 * parameters, rel=1e-6)


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved"])
def test_megatron_recompute_flags(schedule):
    for recompute, expected in [
        ("none", {}),
        ("selective", {"--recompute-granularity": "selective", "--recompute-modules": "core_attn"}),
        (
            "full",
            {
                "--recompute-granularity": "full",
                "--recompute-method": "uniform",
                "--recompute-num-layers": "1",
            },
        ),
    ]:
        candidate = candidates(schedule=schedule, recompute=recompute, p=4)[0]
        flags = flags_of(candidate.launch.megatron_args or "")
        assert {k: v for k, v in flags.items() if k.startswith("--recompute")} == expected


def _config(layers: list[int], splits: list[RecomputeSplit]) -> CandidateConfig:
    return CandidateConfig(
        t=1,
        p=len(layers),
        d=1,
        micro_batch_size=1,
        num_microbatches=4,
        recompute="full",
        schedule="1f1b",
        layers_per_stage=layers,
        recompute_per_stage=splits,
    )


def test_per_stage_recompute_maps_to_megatrons_block_method_or_is_refused():
    r = request(schedules=("1f1b",))
    block = _config([4, 4], [RecomputeSplit(full=2, none=2), RecomputeSplit(full=2, none=2)])
    flags = flags_of(megatron_launch(r, block, has_schedule=True).text)
    assert flags["--recompute-method"] == "block" and flags["--recompute-num-layers"] == "2"
    uneven = _config([4, 4], [RecomputeSplit(full=3, none=1), RecomputeSplit(full=1, none=3)])
    assert "same N everywhere" in (megatron_launch(r, uneven, has_schedule=True).reason or "")
    mixed = _config([4, 4], [RecomputeSplit(selective=4), RecomputeSplit(full=4)])
    assert "one recompute granularity" in (
        megatron_launch(r, mixed, has_schedule=True).reason or ""
    )


def megatron_layers(args: str, p: int) -> list[int]:
    """Layers per (virtual) stage Megatron-LM builds from the arguments."""
    flags = flags_of(args)
    layers = int(flags["--num-layers"] or 0)
    layout = flags.get("--pipeline-model-parallel-layout")
    if layout is not None:
        stages = layout.split("|")
        # The embedding opens the first stage and the loss closes the last, nowhere else.
        assert stages[0].startswith("E") and stages[-1].endswith("L"), layout
        assert "E" not in "".join(stages)[1:] and "L" not in "".join(stages)[:-1], layout
        return [stage.count("t") for stage in stages]
    per_chunk = flags.get("--num-layers-per-virtual-pipeline-stage")
    if per_chunk is not None:
        return [int(per_chunk)] * (layers // int(per_chunk))
    first = flags.get("--decoder-first-pipeline-num-layers")
    last = flags.get("--decoder-last-pipeline-num-layers")
    if first is None:
        return [layers // p] * p
    head, tail = int(first), int(last or 0)
    middle = p - 2
    return [head] + [(layers - head - tail) // middle] * middle + [tail]


@pytest.mark.parametrize(
    "schedule, num_layers, gpus, expected_split",
    [
        ("1f1b", 8, 4, [2, 2, 2, 2]),
        ("1f1b", 10, 4, [2, 3, 3, 2]),
        ("interleaved", 16, 4, [2] * 8),
        ("1f1b", 14, 6, [2, 2, 3, 3, 2, 2]),  # uneven middle: the layout says it
        ("interleaved", 10, 4, [1, 1, 1, 2, 2, 1, 1, 1]),  # uneven virtual stages
        # More stages than layers: the end stages hold only the embedding and the output
        # layer (the V-shape paper's layout, §4.1), which Megatron-LM takes as a layout.
        ("1f1b", 2, 4, [0, 1, 1, 0]),
        ("1f1b", 3, 4, [0, 1, 1, 1]),
        ("interleaved", 6, 4, [0, 1, 1, 1, 1, 1, 1, 0]),
        ("interleaved", 7, 4, [0, 1, 1, 1, 1, 1, 1, 1]),  # not a palindrome: the order shows
    ],
)
def test_megatron_args_rebuild_the_candidates_layer_split(
    schedule, num_layers, gpus, expected_split
):
    r = request(
        num_layers=num_layers,
        gpus_per_node=gpus,
        hidden_size=192,
        heads=6,
        batch=2 * gpus,
        schedules=(schedule,),
        recompute=("none",),
        sizes=(1,),
    )
    found = [c for c in plan(r).candidates if (c.config.t, c.config.p) == (1, gpus)]
    assert len(found) == 1 and found[0].config.layers_per_stage == expected_split
    assert "megatron" in found[0].runtimes
    assert megatron_layers(found[0].launch.megatron_args or "", gpus) == expected_split


def test_a_middle_stage_without_layers_is_refused_at_planning_time():
    """5 layers over v-half's 8 stages on 4 devices would leave a middle stage empty; 6
    leave only the end stages without a layer, which is planned."""
    result = plan(request(num_layers=5, schedules=("v-half",), recompute=("none",)))
    reasons = [r.reason for r in result.rejected if r.config.p == 4]
    assert reasons and all("every stage but the first and the last needs" in r for r in reasons)
    assert all(min(c.config.layers_per_stage[1:-1], default=1) >= 1 for c in result.candidates)
    six = plan(request(num_layers=6, schedules=("v-half",), recompute=("none",)))
    assert [c.config.layers_per_stage for c in six.candidates if c.config.p == 4][0] == [
        0, 1, 1, 1, 1, 1, 1, 0
    ]  # fmt: skip


# ---------------------------------------------------------------------- runtimes
def test_every_candidate_lists_who_can_run_it_and_why_not():
    for candidate in tiny_plan().candidates:
        family = schedule_family(candidate.config.schedule)
        assert set(candidate.runtimes) <= set(family.runtimes)
        assert set(candidate.runtimes) | set(candidate.runtime_limits) == {
            "stagewright",
            "torch",
            "megatron",
        }
        assert (candidate.launch.megatron_args is None) == ("megatron" not in candidate.runtimes)


@pytest.mark.parametrize("runtime", ["megatron", "torch"])
def test_search_runtime_returns_only_what_that_runtime_runs(runtime):
    result = plan(request(runtime=runtime))
    assert result.candidates
    assert all(runtime in c.runtimes for c in result.candidates)
    reasons = [r.reason for r in result.rejected if r.reason.startswith("search.runtime")]
    assert reasons and all(f"search.runtime is {runtime}" in r for r in reasons)
    assert {c.config.schedule for c in result.candidates} <= {
        f.name for f in map(schedule_family, ALL_SCHEDULES) if runtime in f.runtimes
    }


def test_stale_weights_need_the_request_to_allow_them_and_are_labelled():
    data = request().model_dump()
    data["search"]["allow_stale_weights"] = False
    with pytest.raises(ValidationError, match="allow_stale_weights"):
        PlanRequest.model_validate(data)
    del data["search"]["schedules"]
    synchronous = PlanRequest.model_validate(data).search.schedules
    assert synchronous == [f.name for f in families() if f.semantics == "synchronous"]
    assert "2bw" not in synchronous and {"1f1b", "v-zb", "bpipe"} <= set(synchronous)
    stale = [c for c in tiny_plan().candidates if c.config.schedule == "2bw"]
    assert stale and all(c.semantics == "stale" for c in stale)
    assert all(any("changes the training" in n for n in c.notes) for c in stale)
    assert all(c.semantics == "synchronous" for c in candidates(schedule="1f1b"))


# ---------------------------------------------------------------------- torch CSV
def _rows(csv: str) -> list[list[str]]:
    assert csv.endswith("\n")
    return [line.split(",") if line else [] for line in csv[:-1].split("\n")]


@pytest.mark.parametrize("candidate", SAMPLE, ids=IDS)
def test_torch_pipelining_csv(candidate):
    csv = candidate.launch.torch_pipelining_csv
    config = candidate.config
    if "torch" not in candidate.runtimes:
        assert csv is None
        return
    assert csv is not None
    schedule = Schedule.from_dict(candidate.launch.executor_config["schedule"])
    rows = _rows(csv)
    assert len(rows) == config.p
    kinds: Counter[tuple[str, int, int]] = Counter()
    for device, row in enumerate(rows):
        for cell in row:
            found = CELL.fullmatch(cell)
            assert found is not None, cell
            stage, kind, mb = int(found.group(1)), found.group(2), int(found.group(3))
            assert schedule.stage_devices[stage] == device
            kinds[(kind, stage, mb)] += 1
    every = {(s, k) for s in range(schedule.num_stages) for k in range(config.num_microbatches)}
    backward = ("I", "W") if schedule.split_backward else ("B",)
    for kind in ("F", *backward):
        assert {(s, k) for (kk, s, k) in kinds if kk == kind} == every
    assert set(kinds.values()) == {1}
    assert schedule.count(ActionKind.EVICT) == 0


# ---------------------------------------------------------------------- files
def test_launch_files_hold_each_candidates_artefacts():
    result = plan(request(schedules=("1f1b", "v-zb"), recompute=("none",), sizes=(1,)))
    files = {f.path: f for f in launch_files(result)}
    assert json.loads(files["plan.json"].content)["id"] == result.id
    for index, candidate in enumerate(result.candidates, start=1):
        folder = f"candidate-{index}"
        config = json.loads(files[f"{folder}/executor-config.json"].content)
        assert config == materialize_launch(result.request, candidate).executor_config
        assert "stagewright" in candidate.runtimes
        script = files[f"{folder}/run-node0.sh"]
        assert script.executable and candidate.launch.torchrun[0] + ' "$@"' in script.content
        assert (f"{folder}/megatron-args.txt" in files) == ("megatron" in candidate.runtimes)
        assert (f"{folder}/torch-pipelining.csv" in files) == ("torch" in candidate.runtimes)
        assert f"candidate-{index}" in files["README.md"].content
    assert "cp=" not in files["README.md"].content  # no context parallelism, no cp to show
    with tarfile.open(fileobj=io.BytesIO(launch_archive(result, "plan")), mode="r:gz") as tar:
        names = {m.name: m for m in tar.getmembers()}
        assert set(names) == {f"plan/{p}" for p in files}
        assert names["plan/candidate-1/run-node0.sh"].mode == 0o755


def test_a_launch_script_run_without_torchrun_on_path_says_what_to_do(tmp_path, capsys):
    """bash alone would say "torchrun: command not found": the script names the cause."""
    request_file = tmp_path / "request.json"
    request_file.write_text(request(schedules=("1f1b",), recompute=("none",)).model_dump_json())
    out = tmp_path / "launch"
    assert main(["plan", str(request_file), "--emit", str(out)]) == 0
    capsys.readouterr()
    bare = tmp_path / "bin"  # bash and what the script calls before torchrun, nothing else
    bare.mkdir()
    for tool in ("bash", "dirname"):
        found = shutil.which(tool)
        assert found is not None
        (bare / tool).symlink_to(found)
    ran = subprocess.run(
        [str(bare / "bash"), str(out / "candidate-1" / "run-node0.sh")],
        env={"PATH": str(bare)},
        capture_output=True,
        text=True,
    )
    assert ran.returncode == 127
    assert "run-node0.sh: torchrun is not on PATH; activate the Python environment" in ran.stderr
    assert "command not found" not in ran.stderr


def test_plan_emit_writes_the_files_and_refuses_a_folder_in_use(tmp_path, capsys):
    request_file = tmp_path / "request.json"
    request_file.write_text(request(schedules=("1f1b",), recompute=("none",)).model_dump_json())
    out = tmp_path / "launch"
    assert main(["plan", str(request_file), "--json", "--emit", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (out / "candidate-1" / "executor-config.json").exists()
    assert json.loads((out / "plan.json").read_text())["id"] == printed["id"]
    assert main(["plan", str(request_file), "--emit", str(out)]) == 2
    assert "not empty; choose a new folder" in capsys.readouterr().err
    assert main(["plan", str(request_file), "--emit", str(request_file)]) == 2
    assert "that is a file, not a folder; name a new folder" in capsys.readouterr().err
    assert request_file.read_text()  # untouched


def test_a_context_parallel_candidate_gets_a_config_of_every_rank_that_the_executor_refuses(
    tmp_path,
):
    """t = 2, cp = 2, p = 5, d = 2 on 5 nodes of 8: t x p x d = 20 ranks do not fill whole
    nodes, t x cp x p x d = 40 do. The plan used to fail building this candidate's executor
    config (it counted t x p x d ranks); the config now holds all 40, each tensor group with
    its context peers (t x cp consecutive ranks, Megatron-LM's order), and stagewright's
    executor refuses it saying what runs it instead."""
    # bf16: Megatron-LM's flash attention, which context parallelism runs through, has no
    # fp32 kernel.
    data = request(flash_attention=True, sequence_parallel=True, precision="bf16").model_dump()
    data["model"].update(num_layers=10, seq_length=128)
    data["cluster"].update(num_nodes=5, gpus_per_node=8)
    data["training"]["global_batch_size"] = 8
    data["search"].update(
        schedules=["1f1b"],
        recompute=["none"],
        micro_batch_sizes=[1],
        context_parallel=[2],
    )
    planned = plan(PlanRequest.model_validate(data))
    (found,) = [c for c in planned.candidates if (c.config.t, c.config.cp, c.config.p) == (2, 2, 5)]
    assert found.config.d == 2 and "stagewright" not in found.runtimes
    document = ExecutorConfig.model_validate(found.launch.executor_config)
    assert document.parallel.cp == 2 and document.world_size == 40
    coords = [document.coords_of(rank) for rank in range(40)]
    assert coords[:5] == [(0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 0, 3), (1, 0, 0)]
    assert sorted(coords) == [(a, b, c) for a in range(2) for b in range(5) for c in range(4)]
    path = tmp_path / "executor-config.json"
    path.write_text(json.dumps(found.launch.executor_config))
    with pytest.raises(BadInput, match=re.escape("context parallelism, cp = 2); run the")):
        read_config(path)
    # --emit writes no torchrun script that would only fail; its README line gives the reason.
    index = planned.candidates.index(found) + 1
    files = {f.path: f for f in launch_files(planned)}
    assert f"candidate-{index}/executor-config.json" in files
    assert not any(p.startswith(f"candidate-{index}/run-node") for p in files)
    assert f"candidate-{index}/megatron-node0.sh" in files
    readme = files["README.md"].content
    assert f"cannot run it: {found.runtime_limits['stagewright']}" in readme
    # The README counts every GPU the candidate uses: t x cp x p x d, cp included.
    assert f"- candidate-{index}: 1f1b, t=2 cp=2 p=5 d=2, micro-batch" in readme
