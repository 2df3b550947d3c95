"""Launch artefacts of a candidate: what `stagewright run` takes, torchrun command lines, the
equivalent Megatron-LM arguments, and the schedule in torch.distributed.pipelining's CSV.

A plan stores every candidate compactly: its executor config names the schedule by its
generator's parameters (name, devices, micro-batches, chunks, batches) and the placement by
its rule (or, for an optimized one, its blocks in rank order), so a plan's size does not grow
with devices x micro-batches or with the cluster. :func:`materialize_launch` turns that into
the artefacts a run needs (the full action lists, every rank, the CSV), generating the
schedule with the same generator the planner priced, so the executor still runs exactly the
IR that was simulated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from planner.placement import Placement, place
from planner.schedules import MEMORY_LIMIT, ActionKind, Schedule, generate, schedule_family
from planner.specs import Candidate, CandidateConfig, Launch, PlanRequest

__all__ = [
    "SCHEDULE_REFERENCE_FORMAT",
    "compact_executor_config",
    "executor_config",
    "materialize_executor_config",
    "materialize_launch",
    "megatron_args",
    "placement_reference",
    "schedule_reference",
    "torch_pipelining_csv",
    "torchrun_commands",
]

EXECUTOR_CONFIG_FORMAT = "stagewright.executor-config/1"
SCHEDULE_REFERENCE_FORMAT = "stagewright.schedule-ref/1"


def executor_config(
    request: PlanRequest, config: CandidateConfig, schedule: Schedule, placement: Placement
) -> dict[str, Any]:
    """The executor's input: model, parallel layout, stage -> layers, rank map and the exact
    schedule JSON (the same IR the simulator priced)."""
    full = _config_fields(request, config)
    full["placement"] = _placement_json(placement)
    full["schedule"] = schedule.to_dict()
    return full


def _config_fields(request: PlanRequest, config: CandidateConfig) -> dict[str, Any]:
    bounds = []
    first = 0
    for count in config.layers_per_stage:
        bounds.append([first, first + count])
        first += count
    return {
        "format": EXECUTOR_CONFIG_FORMAT,
        "model": request.model.model_dump(),
        "training": request.training.model_dump(),
        "parallel": {"t": config.t, "p": config.p, "d": config.d},
        "micro_batch_size": config.micro_batch_size,
        "num_microbatches": config.num_microbatches,
        "recompute": config.recompute,
        "stage_layers": bounds,
    }


def _placement_json(placement: Placement) -> dict[str, Any]:
    return {
        "assignment": placement.assignment,
        "gpus_per_node": placement.gpus_per_node,
        "ranks": [
            {"rank": rank, "dp": dp, "pp": pp, "tp": tp}
            for rank, (dp, pp, tp) in enumerate(placement.coords)
        ],
    }


def schedule_reference(
    config: CandidateConfig, choice: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The generator parameters of a candidate's schedule (its family's, as the planner
    built it): what a plan stores instead of its actions; ``generate`` rebuilds them
    exactly. A family that searches (the adaptive ones) also stores the ``choice`` its
    search made, which its ``rebuild`` repeats without searching again."""
    given = {} if config.memory_limit is None else {MEMORY_LIMIT.name: config.memory_limit}
    reference: dict[str, Any] = {
        "format": SCHEDULE_REFERENCE_FORMAT,
        "name": config.schedule,
        "num_devices": config.p,
        "num_microbatches": config.num_microbatches,
        "parameters": schedule_family(config.schedule).resolve(given),
    }
    if choice is not None:
        reference["choice"] = dict(choice)
    return reference


def placement_reference(placement: Placement) -> dict[str, Any]:
    """A placement by its rule; an optimized one also by its (dp, pp) blocks in rank order
    (tensor ranks fastest inside a block): t times fewer entries than its ranks."""
    reference: dict[str, Any] = {
        "assignment": placement.assignment,
        "gpus_per_node": placement.gpus_per_node,
    }
    if placement.assignment == "optimized":
        reference["blocks"] = [[dp, pp] for dp, pp, tp in placement.coords if tp == 0]
    return reference


def compact_executor_config(
    request: PlanRequest,
    config: CandidateConfig,
    placement: Placement,
    choice: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The executor config a plan stores: everything but the schedule's actions and the
    placement's ranks, which :func:`materialize_executor_config` adds back."""
    full = _config_fields(request, config)
    full["placement"] = placement_reference(placement)
    full["schedule"] = schedule_reference(config, choice)
    return full


def _rebuilt_placement(data: dict[str, Any]) -> Placement:
    parallel, reference = data["parallel"], data["placement"]
    t, p, d = int(parallel["t"]), int(parallel["p"]), int(parallel["d"])
    per_node = int(reference["gpus_per_node"])
    if reference["assignment"] != "optimized":
        return place(t, p, d, per_node, reference["assignment"])
    coords = tuple((dp, pp, tp) for dp, pp in reference["blocks"] for tp in range(t))
    return Placement(t, p, d, per_node, "optimized", coords)


def _rebuilt_schedule(reference: dict[str, Any]) -> Schedule:
    family = schedule_family(str(reference["name"]))
    if family.rebuild is not None and "choice" in reference:
        return family.rebuild(
            reference["choice"],
            int(reference["num_devices"]),
            int(reference["num_microbatches"]),
        )
    return generate(
        str(reference["name"]),
        int(reference["num_devices"]),
        int(reference["num_microbatches"]),
        check=False,
        **dict(reference.get("parameters", {})),
    )


def materialize_executor_config(data: dict[str, Any]) -> dict[str, Any]:
    """The executor config with the schedule's actions and every rank: as stored (a plan
    from before compact storage, or one already materialized) or rebuilt from the
    generator parameters and the placement rule."""
    out = dict(data)
    if "actions" not in out.get("schedule", {}):
        out["schedule"] = _rebuilt_schedule(out["schedule"]).to_dict()
    if "ranks" not in out.get("placement", {}):
        placement = _rebuilt_placement(out)
        out["placement"] = _placement_json(placement)
    return out


def materialize_launch(request: PlanRequest, candidate: Candidate) -> Launch:
    """A candidate's complete launch artefacts (what ``--emit`` writes and the service's
    launch route answers): the materialized executor config and the schedule's CSV."""
    config = materialize_executor_config(candidate.launch.executor_config)
    schedule = Schedule.from_dict(config["schedule"])
    return candidate.launch.model_copy(
        update={"executor_config": config, "torch_pipelining_csv": torch_pipelining_csv(schedule)}
    )


def torchrun_commands(request: PlanRequest, config: CandidateConfig) -> list[str]:
    """One torchrun line per node, running the executor's per-rank entry point on the
    candidate's executor config; MASTER_ADDR is the first node's address (set it)."""
    world = config.t * config.p * config.d
    per_node = min(request.cluster.gpus_per_node, world)
    nodes = max(1, world // per_node)
    return [
        f"torchrun --nnodes={nodes} --node-rank={node} --nproc-per-node={per_node} "
        f"--master-addr=$MASTER_ADDR --master-port=29500 "
        f"-m executor.worker config.json"
        for node in range(nodes)
    ]


def megatron_args(request: PlanRequest, config: CandidateConfig) -> str | None:
    """Megatron-LM (core, pretrain_gpt.py) arguments for schedules whose registry entry says
    Megatron runs them (1F1B, interleaved 1F1B); None for the others and for layer splits
    Megatron cannot build. Several stages a device map to virtual pipeline stages; a lighter
    first/last stage maps to --decoder-first/last-pipeline-num-layers; uneven middle stages
    or uneven virtual stages have no Megatron flag."""
    family = schedule_family(config.schedule)
    if "megatron" not in family.runtimes:
        return None
    m, tr = request.model, request.training
    args = [
        f"--num-layers {m.num_layers}",
        f"--hidden-size {m.hidden_size}",
        f"--num-attention-heads {m.num_attention_heads}",
        f"--ffn-hidden-size {m.ffn}",
        f"--seq-length {m.seq_length}",
        f"--max-position-embeddings {m.seq_length}",
        f"--tensor-model-parallel-size {config.t}",
        f"--pipeline-model-parallel-size {config.p}",
        f"--micro-batch-size {config.micro_batch_size}",
        f"--global-batch-size {tr.global_batch_size}",
    ]
    if tr.precision == "bf16":
        args.append("--bf16")
    elif tr.precision == "fp16":
        args.append("--fp16")
    if tr.sequence_parallel and config.t > 1:
        args.append("--sequence-parallel")
    if tr.distributed_optimizer:
        args.append("--use-distributed-optimizer")
    if tr.flash_attention:
        args.append("--use-flash-attn")
    layers = config.layers_per_stage
    if family.stages_per_device() > 1:
        if len(set(layers)) > 1:
            return None  # Megatron's virtual stages all hold the same number of layers
        args.append(f"--num-layers-per-virtual-pipeline-stage {layers[0]}")
    elif len(set(layers)) > 1 and config.p > 1:
        if len(set(layers[1:-1])) > 1:
            return None  # Megatron only lets the first and last stage differ
        args.append(f"--decoder-first-pipeline-num-layers {layers[0]}")
        args.append(f"--decoder-last-pipeline-num-layers {layers[-1]}")
    if config.recompute == "selective":
        args.append("--recompute-activations")
    elif config.recompute == "full":
        args.append(
            "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
        )
    return " ".join(args)


_CSV_KIND = {ActionKind.F: "F", ActionKind.B: "I", ActionKind.W: "W", ActionKind.BW: "B"}


def torch_pipelining_csv(schedule: Schedule) -> str | None:
    """The compute-only CSV that torch.distributed.pipelining's ``_PipelineScheduleRuntime``
    loads (one row per rank; ``0F3``, ``7B2``, ``5I0`` for input-grad, ``5W0``). None when the
    runtime cannot express the schedule: transfers (BPipe), weight versions and several
    batches (2BW) are outside it, as are placements other than one stage per rank, loop
    (interleaved) or V (two stages per rank)."""
    moves_data = schedule.count(ActionKind.EVICT, ActionKind.LOAD, ActionKind.WEIGHT_VERSION)
    if moves_data or schedule.num_batches > 1:
        return None
    rows = []
    for acts in schedule.actions:
        cells = [f"{a.stage}{_CSV_KIND[a.kind]}{a.microbatch}" for a in acts if a.kind in _CSV_KIND]
        rows.append(",".join(cells))
    return "\n".join(rows) + "\n"
