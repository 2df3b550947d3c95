"""Which runtimes can run a candidate as planned, and why the others cannot.

A runtime runs a candidate "as planned" when it executes the planned schedule, layer split and
recompute choices, not an approximation of them. The schedule registry says which runtimes
have a schedule at all (:attr:`planner.schedules.ScheduleFamily.runtimes`); beyond that:
- Megatron-LM expresses recomputation only as one granularity for the whole model
  (:mod:`planner.launch.megatron`);
- stagewright's executor splits the output layer over the vocabulary and, with sequence
  parallelism, the sequence over the tensor-parallel ranks, so both must divide by t;
- torch.distributed.pipelining runs any schedule it has on the stage modules it is given.
Context parallelism (cp > 1) only Megatron-LM runs, and only with flash attention: neither
stagewright's executor nor torch.distributed.pipelining's stages split a sequence over ranks.
Megatron-LM's flash attention (``--attention-backend flash``: Transformer Engine's
FlashAttention) takes only bf16 or fp16 inputs and head dimensions up to 256 that are
multiples of 8 (Transformer Engine's ``get_attention_backend`` filters; with the backend
asked for by name there is no fallback), where the other runtimes' scaled dot-product
attention takes any.
Megatron-LM and torch.distributed.pipelining number ranks in fixed orders, which realize only
some placements (:mod:`planner.launch.rank_order`); stagewright's executor takes every rank's
coordinates from its config.
"""

from __future__ import annotations

from planner.costmodel.stages import placement_for
from planner.launch.megatron import recompute_problem
from planner.launch.rank_order import order_problem
from planner.placement import Placement
from planner.schedules import RUNTIMES, Runtime, schedule_family
from planner.specs import CandidateConfig, ModelSpec, PlanRequest, TrainingSpec

__all__ = ["RUNTIME_TITLES", "executor_problem", "runtime_limits", "runtimes_of"]

RUNTIME_TITLES: dict[Runtime, str] = {
    "stagewright": "stagewright's executor",
    "torch": "torch.distributed.pipelining",
    "megatron": "Megatron-LM",
}


def runtime_limits(
    request: PlanRequest, config: CandidateConfig, placement: Placement | None = None
) -> dict[Runtime, str]:
    """For each runtime that cannot run ``config`` as planned, placed as ``placement`` (the
    placement it was priced under; None: its default one), the reason (empty when all can)."""
    family = schedule_family(config.schedule)
    limits: dict[Runtime, str] = {
        runtime: f"{RUNTIME_TITLES[runtime]} has no {family.title} schedule"
        for runtime in RUNTIMES
        if runtime not in family.runtimes
    }
    if config.cp > 1:
        limits.setdefault(
            "torch",
            f"{RUNTIME_TITLES['torch']} does not run context parallelism (cp = {config.cp})",
        )
    if "megatron" not in limits:
        problem = recompute_problem(config)
        if problem is None and config.cp > 1 and not request.training.flash_attention:
            problem = (
                "Megatron-LM runs context parallelism only with flash (or fused) attention; "
                "set training.flash_attention"
            )
        if problem is None and request.training.flash_attention:
            problem = _megatron_flash_problem(request.model, request.training)
        if problem is not None:
            limits["megatron"] = problem
    if "stagewright" not in limits:
        problem = executor_problem(
            request.model, request.training, config.t, config.schedule, config.cp
        )
        if problem is not None:
            limits["stagewright"] = problem
    if placement is None:
        placement = placement_for(config, request.cluster.gpus_per_node)
    for runtime in RUNTIMES:
        if runtime not in limits:
            problem = order_problem(runtime, placement)
            if problem is not None:
                limits[runtime] = problem
    return limits


def _megatron_flash_problem(model: ModelSpec, training: TrainingSpec) -> str | None:
    """Why Megatron-LM's flash attention cannot take this model's attention (see the module
    docstring), or None."""
    if training.precision == "fp32":
        return (
            "Megatron-LM's flash attention (Transformer Engine's FlashAttention) takes only "
            "bf16 or fp16; train in bf16, or set training.flash_attention to false"
        )
    head = model.hidden_size // model.num_attention_heads
    if head > 256 or head % 8:
        return (
            "Megatron-LM's flash attention (Transformer Engine's FlashAttention) takes head "
            f"dimensions up to 256 that are multiples of 8; this model's is {head} "
            "(hidden_size / num_attention_heads): set training.flash_attention to false"
        )
    return None


def runtimes_of(limits: dict[Runtime, str]) -> list[Runtime]:
    """The runtimes not limited, in the registry's order."""
    return [runtime for runtime in RUNTIMES if runtime not in limits]


def executor_problem(
    model: ModelSpec, training: TrainingSpec, t: int, schedule: str, cp: int = 1
) -> str | None:
    """Why stagewright's executor cannot run this, or None: what the plan says and what the
    executor refuses with."""
    if cp > 1:
        # Each rank would need its own share of the sequence and a ring for the attention.
        return (
            f"it does not split a sequence over ranks (context parallelism, cp = {cp}); run "
            f"the candidate's megatron-node*.sh, or plan with search.context_parallel [1]"
        )
    llama = _llama_features(model)
    if llama:
        return (
            f"it builds Megatron-LM's GPT layer (multi-head attention, GeLU MLP, LayerNorm, "
            f"learned positions, tied output layer, biases), not {', '.join(llama)}"
        )
    if training.precision == "fp16" and not schedule_family(schedule).flush_per_batch:
        return (
            "fp16 needs every stage to agree on skipping a step when the loss scale "
            "overflows, which takes a flush, and this schedule runs batches without one: use "
            "bf16"
        )
    if model.vocab_size % t:
        return (
            f"its output layer is split over the vocabulary, and t = {t} does not divide the "
            f"vocabulary of {model.vocab_size}"
        )
    if training.sequence_parallel and t > 1 and model.seq_length % t:
        return (
            f"sequence parallelism splits the {model.seq_length} tokens over t = {t} ranks, "
            f"which does not divide them"
        )
    return None


def _llama_features(model: ModelSpec) -> list[str]:
    """The model's departures from GPT, as a person would name them."""
    found = []
    if model.query_groups != model.num_attention_heads:
        found.append(f"grouped-query attention ({model.query_groups} key/value heads)")
    if model.activation != "gelu":
        found.append(model.activation)
    if model.normalization != "layernorm":
        found.append(model.normalization)
    if model.position_embedding != "learned":
        found.append(f"{model.position_embedding} positions")
    if model.untie_embeddings_and_output_weights:
        found.append("an untied output layer")
    if not model.add_bias_linear:
        found.append("linear layers without biases")
    return found
