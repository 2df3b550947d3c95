"""Megatron-LM arguments for a candidate, or the reason Megatron-LM cannot run it as planned.

Every flag used here is checked against the parser of Megatron-LM's
``megatron/training/arguments.py`` (``add_megatron_arguments``; most model and parallelism
flags come from its ``TransformerConfig`` dataclass through ``ArgumentGroupFactory``):
``MEGATRON_FLAGS`` lists them with the commit they were checked at, and a test keeps every
emitted flag inside that list.

What Megatron-LM can express (``pretrain_gpt.py``):
- the layer split: an even split needs nothing; a lighter first and/or last stage
  ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``; any other
  split, and uneven virtual stages, ``--pipeline-model-parallel-layout`` ("E" embedding,
  "t" a layer, "L" the loss, stages split by "|");
- recomputation: one granularity for the whole model. Selective (``core_attn``, Korthikanti et
  al.'s attention core) on every layer; or full, on every layer (``uniform``, 1 layer per unit)
  or on the first N layers of every stage (``block``). A per-stage choice outside these (CP-SAT
  may pick one) is not expressible, and the candidate's ``runtimes`` then omit megatron;
- attention: ``--attention-backend flash`` with flash attention, else ``unfused`` (the kernels
  whose saved scores Korthikanti et al. count);
- the architecture: grouped-query attention ``--group-query-attention --num-query-groups g``
  (Megatron ignores the group count without the switch), ``--swiglu``, ``--normalization
  RMSNorm``, ``--position-embedding-type rope``, ``--untie-embeddings-and-output-weights``,
  ``--disable-bias-linear``; GPT's defaults need none of them;
- context parallelism: ``--context-parallel-size`` (it runs through flash/fused attention;
  the planner searches cp > 1 only with flash attention);
- the rank placement: Megatron-LM numbers ranks tensor fastest, then data, then pipeline, or
  pipeline before data with ``--use-tp-pp-dp-mapping``; a placement neither order realizes
  (:mod:`planner.launch.rank_order`) is not expressible;
- vocabulary: ``--vocab-size`` with ``--make-vocab-size-divisible-by`` chosen so that Megatron's
  padding (to a multiple of that times t) keeps the planned size; ``NullTokenizer`` with
  ``--mock-data`` (the launch script's defaults) runs without data files, to be replaced by
  the real tokenizer and ``--data-path``.
Tensor or context parallelism needs ``CUDA_DEVICE_MAX_CONNECTIONS=1`` in the environment, with or
without sequence parallelism: ``validate_args`` asserts it on every GPU before Blackwell (the
launch script sets it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from planner.launch.rank_order import (
    MEGATRON_ORDER_FLAG,
    RankOrder,
    order_note,
    order_problem,
    realizing_order,
)
from planner.placement import Placement
from planner.specs import CandidateConfig, PlanRequest

__all__ = [
    "MEGATRON_COMMIT",
    "MEGATRON_FLAGS",
    "MegatronLaunch",
    "megatron_launch",
    "recompute_problem",
]

MEGATRON_COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
"""The NVIDIA/Megatron-LM commit whose argument parser ``MEGATRON_FLAGS`` was checked against."""

MEGATRON_FLAGS = frozenset(
    {
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
        "--merge-file",
        "--max-position-embeddings",
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
        "--use-tp-pp-dp-mapping",
        "--vocab-file",
        "--vocab-size",
    }
)
"""Every Megatron-LM flag stagewright emits (here and in the Megatron launch script)."""


@dataclass(frozen=True)
class MegatronLaunch:
    """Arguments of ``pretrain_gpt.py`` for a candidate, or why there are none."""

    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    reason: str | None = None  # set when Megatron-LM cannot run the candidate as planned
    notes: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        return " ".join(self.args)


def megatron_launch(
    request: PlanRequest,
    config: CandidateConfig,
    *,
    has_schedule: bool,
    placement: Placement | None = None,
) -> MegatronLaunch:
    """The Megatron-LM arguments of ``config`` placed as ``placement`` (None: Megatron-LM's
    default order); ``has_schedule`` says whether Megatron-LM has the candidate's schedule
    (the schedule registry knows)."""
    if not has_schedule:
        return MegatronLaunch(reason=f"Megatron-LM has no {config.schedule} schedule")
    recompute = _recompute_args(config)
    if isinstance(recompute, str):
        return MegatronLaunch(reason=recompute)
    m, tr = request.model, request.training
    vocab_args, notes = _vocab_args(m.vocab_size, config.t)
    order: RankOrder | None = "tp-dp-pp"
    if placement is not None:
        order = realizing_order(placement)
        if order is None:
            return MegatronLaunch(reason=order_problem("megatron", placement))
        notes += [n for n in [order_note("megatron", placement)] if n is not None]
    args = [
        f"--num-layers {m.num_layers}",
        f"--hidden-size {m.hidden_size}",
        f"--num-attention-heads {m.num_attention_heads}",
        f"--ffn-hidden-size {m.ffn}",
        *_architecture_args(request),
        f"--seq-length {m.seq_length}",
        f"--max-position-embeddings {m.seq_length}",
        *vocab_args,
        f"--tensor-model-parallel-size {config.t}",
        f"--pipeline-model-parallel-size {config.p}",
        *([f"--context-parallel-size {config.cp}"] if config.cp > 1 else []),
        *([MEGATRON_ORDER_FLAG] if order == "tp-pp-dp" else []),
        *_layout_args(config),
        f"--micro-batch-size {config.micro_batch_size}",
        f"--global-batch-size {tr.global_batch_size}",
        f"--optimizer {tr.optimizer}",
        f"--attention-backend {'flash' if tr.flash_attention else 'unfused'}",
    ]
    if tr.precision != "fp32":
        args.append(f"--{tr.precision}")
    if tr.precision == "fp16":
        # The plan counts fp32 gradients (4 bytes a parameter), as stagewright's executor
        # accumulates them; Megatron-LM keeps them in fp32 by itself only for bf16.
        args.append("--accumulate-allreduce-grads-in-fp32")
    env = {}
    if tr.sequence_parallel and config.t > 1:
        args.append("--sequence-parallel")
    if config.t > 1 or config.cp > 1:
        # One hardware queue keeps the tensor/context-parallel communication kernels in the
        # order they were issued, which their overlap with compute relies on; Megatron-LM
        # refuses to start without it before Blackwell (arguments.py, validate_args).
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    if tr.distributed_optimizer:
        args.append("--use-distributed-optimizer")
    args += recompute
    return MegatronLaunch(args=tuple(args), env=env, notes=tuple(notes))


def _architecture_args(request: PlanRequest) -> list[str]:
    """The switches of a Llama-style model (none for GPT's defaults)."""
    m = request.model
    args = []
    if m.query_groups != m.num_attention_heads:
        args += ["--group-query-attention", f"--num-query-groups {m.query_groups}"]
    if m.activation == "swiglu":
        args.append("--swiglu")
    if m.normalization == "rmsnorm":
        args.append("--normalization RMSNorm")
    if m.position_embedding == "rope":
        args.append("--position-embedding-type rope")
    if m.untie_embeddings_and_output_weights:
        args.append("--untie-embeddings-and-output-weights")
    if not m.add_bias_linear:
        args.append("--disable-bias-linear")
    return args


def _vocab_args(vocab: int, t: int) -> tuple[list[str], list[str]]:
    """``--vocab-size`` and a ``--make-vocab-size-divisible-by`` that keeps it unpadded."""
    if vocab % t == 0:
        divisor = math.gcd(vocab // t, 128)
        return [f"--vocab-size {vocab}", f"--make-vocab-size-divisible-by {divisor}"], []
    padded = -(-vocab // t) * t
    return (
        [f"--vocab-size {vocab}", "--make-vocab-size-divisible-by 1"],
        [f"Megatron-LM pads the vocabulary of {vocab} to {padded}, a multiple of t = {t}"],
    )


def _layout_args(config: CandidateConfig) -> list[str]:
    layers = config.layers_per_stage
    chunks = len(layers) // config.p
    if len(set(layers)) == 1:
        return [f"--num-layers-per-virtual-pipeline-stage {layers[0]}"] if chunks > 1 else []
    # Megatron-LM wants at least one layer in a first or last stage it is given a count for;
    # a stage of only the embedding or the loss takes the layout (``E|...|L``).
    if chunks == 1 and len(set(layers[1:-1])) <= 1 and min(layers[0], layers[-1]) > 0:
        return [
            f"--decoder-first-pipeline-num-layers {layers[0]}",
            f"--decoder-last-pipeline-num-layers {layers[-1]}",
        ]
    # Stages in layout order are Megatron's (virtual stage v of rank r is entry v * p + r),
    # which is the planner's stage numbering.
    stages = ["t" * n for n in layers]
    stages[0] = "E" + stages[0]
    stages[-1] += "L"
    return [f"--pipeline-model-parallel-layout {'|'.join(stages)}"]


def recompute_problem(config: CandidateConfig) -> str | None:
    """Why Megatron-LM cannot recompute as ``config`` plans, or None."""
    found = _recompute_args(config)
    return found if isinstance(found, str) else None


def _recompute_args(config: CandidateConfig) -> list[str] | str:
    """Megatron-LM's recompute flags for the candidate's per-stage modes, or why it has none."""
    per_stage = config.stage_modes()
    used = {mode for modes in per_stage for mode, n in modes.items() if n}
    if used <= {"none"}:
        return []
    if used == {"selective"}:
        return ["--recompute-granularity selective", "--recompute-modules core_attn"]
    if "selective" in used:
        return (
            "selective recompute on some layers and another mode on others: Megatron-LM "
            "applies one recompute granularity to the whole model"
        )
    fulls = [modes.get("full", 0) for modes in per_stage]
    layers = config.layers_per_stage
    if fulls == layers:
        return [
            "--recompute-granularity full",
            "--recompute-method uniform",
            "--recompute-num-layers 1",
        ]
    block = max(fulls)
    if all(f == min(block, n) for f, n in zip(fulls, layers, strict=True)):
        return [
            "--recompute-granularity full",
            "--recompute-method block",
            f"--recompute-num-layers {block}",
        ]
    return (
        f"full recompute of {fulls} layers per stage: Megatron-LM's block method recomputes "
        f"the first N layers of every stage, the same N everywhere"
    )
