"""Launch artefacts of a candidate: what `stagewright run` takes, torchrun command lines, the
equivalent Megatron-LM arguments, and the schedule in torch.distributed.pipelining's CSV.
"""

from __future__ import annotations

from typing import Any

from planner.placement import Placement
from planner.schedules import ActionKind, Schedule, schedule_family
from planner.specs import CandidateConfig, PlanRequest

__all__ = ["executor_config", "megatron_args", "torch_pipelining_csv", "torchrun_commands"]

EXECUTOR_CONFIG_FORMAT = "stagewright.executor-config/1"


def executor_config(
    request: PlanRequest, config: CandidateConfig, schedule: Schedule, placement: Placement
) -> dict[str, Any]:
    """The executor's input: model, parallel layout, stage -> layers, rank map and the exact
    schedule JSON (the same IR the simulator priced)."""
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
        "placement": {
            "assignment": placement.assignment,
            "gpus_per_node": placement.gpus_per_node,
            "ranks": [
                {"rank": rank, "dp": dp, "pp": pp, "tp": tp}
                for rank, (dp, pp, tp) in enumerate(placement.coords)
            ],
        },
        "schedule": schedule.to_dict(),
    }


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
