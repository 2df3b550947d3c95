"""Launch artefacts of planned candidates: executor config, torchrun, Megatron-LM, torch CSV."""

from __future__ import annotations

import re
from collections import Counter
from functools import cache
from typing import Any

import pytest

from planner.launch import (
    SCHEDULE_REFERENCE_FORMAT,
    executor_config,
    materialize_executor_config,
    materialize_launch,
)
from planner.placement import place
from planner.schedules import ActionKind, Schedule, generate, schedule_family, validate
from planner.search import plan
from planner.specs import Candidate, Plan, PlanRequest

ALL_SCHEDULES = ("gpipe", "1f1b", "interleaved", "bpipe", "v-min", "v-half", "v-zb", "2bw")
MEGATRON_SCHEDULES = ("1f1b", "interleaved")
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
            "precision": "fp32",
            "distributed_optimizer": False,
            "sequence_parallel": False,
        },
        "search": {
            "schedules": list(schedules),
            "recompute": list(recompute),
            "micro_batch_sizes": list(sizes),
            "top_k": 1000,
        },
    }
    return PlanRequest.model_validate(data)


@cache
def tiny_plan(schedules: tuple[str, ...] = ALL_SCHEDULES) -> Plan:
    return plan(request(schedules=schedules))


@cache
def launched(schedules: tuple[str, ...] = ALL_SCHEDULES) -> list[Candidate]:
    """A tiny plan's candidates with their launch artefacts materialized (as `--emit`,
    `stagewright run` and the service's launch route give them)."""
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
    assert "ranks" not in compact["placement"] and stored.launch.torch_pipelining_csv is None
    assignment = compact["placement"]["assignment"]
    direct = executor_config(
        tiny_plan().request,
        config,
        generate(config.schedule, config.p, config.num_microbatches),
        place(config.t, config.p, config.d, 4, assignment),
    )
    assert materialize_executor_config(compact) == direct
    assert materialize_executor_config(direct) == direct  # a full config is kept as it is


def one_per_schedule() -> list[Candidate]:
    """For each schedule, the fastest candidate with p = 4 and one with p = 2."""
    out = []
    for name in ALL_SCHEDULES:
        for p in (4, 2):
            out.append(candidates(schedule=name, p=p)[0])
    return out


def ids(cands: list[Candidate]) -> list[str]:
    return [
        f"{c.config.schedule}-t{c.config.t}p{c.config.p}d{c.config.d}-{c.config.recompute}"
        for c in cands
    ]


SAMPLE = one_per_schedule()


@pytest.mark.parametrize("candidate", SAMPLE, ids=ids(SAMPLE))
def test_executor_schedule_round_trips_and_validates(candidate):
    cfg = candidate.launch.executor_config
    config = candidate.config
    schedule = Schedule.from_dict(cfg["schedule"])
    validate(schedule)
    assert schedule.to_dict() == cfg["schedule"]
    assert schedule.name == config.schedule
    assert schedule.num_devices == config.p
    assert schedule.num_microbatches == config.num_microbatches
    assert schedule.num_stages == len(config.layers_per_stage)
    assert cfg["parallel"] == {"t": config.t, "p": config.p, "d": config.d}
    assert cfg["micro_batch_size"] == config.micro_batch_size
    assert cfg["num_microbatches"] == config.num_microbatches
    assert cfg["recompute"] == config.recompute


@pytest.mark.parametrize("candidate", SAMPLE, ids=ids(SAMPLE))
def test_stage_layers_cover_the_model_contiguously(candidate):
    bounds = candidate.launch.executor_config["stage_layers"]
    config = candidate.config
    assert len(bounds) == len(config.layers_per_stage)
    assert bounds[0][0] == 0
    assert bounds[-1][1] == tiny_plan().request.model.num_layers
    for (_, end), (next_start, _) in zip(bounds, bounds[1:], strict=False):
        assert end == next_start
    assert [end - start for start, end in bounds] == config.layers_per_stage


@pytest.mark.parametrize("candidate", SAMPLE, ids=ids(SAMPLE))
def test_placement_covers_every_rank_once(candidate):
    placement = candidate.launch.executor_config["placement"]
    config = candidate.config
    world = config.t * config.p * config.d
    ranks = placement["ranks"]
    assert sorted(r["rank"] for r in ranks) == list(range(world))
    coords = {(r["dp"], r["pp"], r["tp"]) for r in ranks}
    assert coords == {
        (dp, pp, tp) for dp in range(config.d) for pp in range(config.p) for tp in range(config.t)
    }
    expected = "pair-adjacent" if config.schedule == "bpipe" else "standard"
    assert placement["assignment"] == expected


@pytest.mark.parametrize("num_nodes, per_node", [(1, 4), (2, 2), (4, 2)])
def test_torchrun_has_one_command_per_node(num_nodes, per_node):
    batch = 8 * num_nodes * per_node
    result = plan(request(num_nodes=num_nodes, gpus_per_node=per_node, batch=batch, heads=4))
    assert result.candidates
    for candidate in result.candidates:
        commands = candidate.launch.torchrun
        assert len(commands) == num_nodes
        for node, command in enumerate(commands):
            assert command.startswith("torchrun ")
            assert f"--nnodes={num_nodes}" in command
            assert f"--node-rank={node}" in command
            assert f"--nproc-per-node={per_node}" in command


def flags_of(args: str) -> dict[str, str | None]:
    tokens = args.split()
    flags: dict[str, str | None] = {}
    for i, token in enumerate(tokens):
        if token.startswith("--"):
            value = tokens[i + 1] if i + 1 < len(tokens) else None
            flags[token] = None if value is None or value.startswith("--") else value
    return flags


@pytest.mark.parametrize("candidate", SAMPLE, ids=ids(SAMPLE))
def test_megatron_args_only_for_megatron_schedules(candidate):
    args = candidate.launch.megatron_args
    config = candidate.config
    if config.schedule not in MEGATRON_SCHEDULES:
        assert args is None
        return
    assert isinstance(args, str)
    flags = flags_of(args)
    r = tiny_plan().request
    assert flags["--tensor-model-parallel-size"] == str(config.t)
    assert flags["--pipeline-model-parallel-size"] == str(config.p)
    assert flags["--micro-batch-size"] == str(config.micro_batch_size)
    assert flags["--global-batch-size"] == str(r.training.global_batch_size)
    assert flags["--num-layers"] == str(r.model.num_layers)
    assert "--bf16" not in flags and "--fp16" not in flags  # fp32 training


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("schedule", MEGATRON_SCHEDULES)
def test_megatron_recompute_flags_match(schedule, recompute):
    candidate = candidates(schedule=schedule, recompute=recompute, p=4)[0]
    args = candidate.launch.megatron_args
    assert args is not None
    flags = flags_of(args)
    if recompute == "none":
        assert not any(flag.startswith("--recompute") for flag in flags)
    elif recompute == "selective":
        assert "--recompute-activations" in flags
        assert "--recompute-granularity" not in flags
    else:
        assert flags["--recompute-granularity"] == "full"
        assert flags["--recompute-method"] == "uniform"
        assert "--recompute-activations" not in flags


def megatron_stage_layers(args: str, p: int) -> list[int] | None:
    """Layers per (virtual) stage that Megatron-LM builds from these arguments, or None when
    Megatron would refuse them (layers that do not divide)."""
    flags = flags_of(args)
    layers = int(flags["--num-layers"] or 0)
    per_chunk = flags.get("--num-layers-per-virtual-pipeline-stage")
    if per_chunk is not None:
        k = int(per_chunk)
        return [k] * (layers // k) if layers % (p * k) == 0 else None
    first = flags.get("--decoder-first-pipeline-num-layers")
    last = flags.get("--decoder-last-pipeline-num-layers")
    if first is None and last is None:
        return [layers // p] * p if layers % p == 0 else None
    head, tail = int(first or 0), int(last or 0)
    middle, rest = p - 2, layers - head - tail
    if middle == 0:
        return [head, tail] if rest == 0 else None
    return [head] + [rest // middle] * middle + [tail] if rest % middle == 0 else None


@pytest.mark.parametrize(
    "schedule, num_layers, gpus, expected_split, expressible",
    [
        ("1f1b", 8, 4, [2, 2, 2, 2], True),
        ("1f1b", 10, 4, [2, 3, 3, 2], True),
        ("interleaved", 8, 4, [1] * 8, True),
        ("interleaved", 16, 4, [2] * 8, True),
        # Megatron only lets the first and last stage differ, and needs equal virtual stages.
        ("1f1b", 14, 6, [2, 2, 3, 3, 2, 2], False),
        ("interleaved", 10, 4, [1, 1, 1, 2, 2, 1, 1, 1], False),
    ],
)
def test_megatron_args_build_the_candidates_layer_split(
    schedule, num_layers, gpus, expected_split, expressible
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
    assert len(found) == 1
    candidate = found[0]
    assert candidate.config.layers_per_stage == expected_split
    if not expressible:
        assert candidate.launch.megatron_args is None
        return
    assert candidate.launch.megatron_args is not None
    rebuilt = megatron_stage_layers(candidate.launch.megatron_args, gpus)
    assert rebuilt == candidate.config.layers_per_stage


def _rows(csv: str) -> list[list[str]]:
    assert csv.endswith("\n")
    return [line.split(",") if line else [] for line in csv[:-1].split("\n")]


def has_evictions(candidate: Candidate) -> bool:
    schedule = Schedule.from_dict(candidate.launch.executor_config["schedule"])
    return schedule.count(ActionKind.EVICT) > 0


@pytest.mark.parametrize("candidate", SAMPLE, ids=ids(SAMPLE))
def test_torch_pipelining_csv(candidate):
    csv = candidate.launch.torch_pipelining_csv
    config = candidate.config
    if config.schedule == "2bw" or (config.schedule == "bpipe" and has_evictions(candidate)):
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
            assert schedule.stage_devices[stage] == device  # the row is the rank holding it
            kinds[(kind, stage, mb)] += 1
    stages, m = len(config.layers_per_stage), config.num_microbatches
    every = {(s, k) for s in range(stages) for k in range(m)}
    backward = ("I", "W") if schedule.split_backward else ("B",)
    for kind in ("F", *backward):
        assert {(s, k) for (kk, s, k) in kinds if kk == kind} == every
    assert set(kinds.values()) == {1}


def test_bpipe_with_evictions_has_no_csv_and_without_has_one():
    evicting = candidates(schedule="bpipe", p=4)
    assert all(has_evictions(c) for c in evicting)
    assert all(c.launch.torch_pipelining_csv is None for c in evicting)
    # p = 2: every stage holds at most 2 <= mu_opt micro-batches, nothing is evicted.
    plain = candidates(schedule="bpipe", p=2)
    assert not any(has_evictions(c) for c in plain)
    assert all(c.launch.torch_pipelining_csv is not None for c in plain)


def test_2bw_has_no_csv():
    assert all(c.launch.torch_pipelining_csv is None for c in candidates(schedule="2bw"))
