"""Memory per device: parameters, gradients, optimizer states, activations, allowance.

Sources:
- Parameters per layer: attention 4h^2 + 4h, MLP 2hf + f + h, two layer norms 4h
  (Megatron-LM's GPT layer; 12h^2 + 13h for f = 4h, Narayanan et al. 2021 §5.1).
- Bytes per parameter with mixed precision and Adam: 2 (bf16/fp16 weight) + 4 (fp32 gradient
  buffer) + 12 (fp32 master weight, Adam m and v) = 18; the distributed optimizer (ZeRO-1)
  shards the 12 optimizer bytes over d data-parallel ranks (Megatron-LM,
  docs/source/api-guide/distrib_optimizer.md). fp32 training: 4 + 4 + 8. SGD with momentum
  keeps 8 optimizer bytes (master + momentum) instead of 12.
- Activations per layer per micro-batch (Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", Table 2), 16-bit activations:
  none: sbh (10 + 24/t + 5as/(ht)); with sequence parallelism sbh/t (34 + 5as/h);
  selective: sbh (10 + 24/t), with sequence parallelism 34 sbh/t; full: 2sbh (the layer
  input; with sequence parallelism Megatron keeps only the local sequence shard, 2sbh/t).
  Flash attention never stores the s x s scores, which removes the 5as/h term. Where
  Megatron cannot use its fused softmax kernel (``layer_ops.fused_softmax_available``), its
  fp32 fallback keeps the softmax output in fp32: 2 more bytes per score, 7as/h.
- Output layer and loss on the last stage: 4sbh/t (1 + V/h) bytes (Korthikanti et al. §4.3).
  Embedding on the first stage: its token ids (8sb) and its dropout mask (sbh, /t with
  sequence parallelism), which the per-layer counts leave out.
- 2BW keeps a second (stashed) copy of the 16-bit weights (Narayanan et al. 2021a, §3.1).
"""

from __future__ import annotations

from planner.costmodel.layer_ops import fused_softmax_available
from planner.schedules import schedule_family
from planner.specs import ModelSpec, Recompute, TrainingSpec

__all__ = [
    "GIB",
    "activation_bytes_per_layer",
    "bytes_per_parameter",
    "embedding_activation_bytes",
    "embedding_parameters",
    "layer_parameters",
    "output_activation_bytes",
    "recompute_working_bytes",
]

GIB = float(1 << 30)


def layer_parameters(model: ModelSpec) -> int:
    """Parameters of one transformer layer (before tensor parallelism)."""
    h, f = model.hidden_size, model.ffn
    return 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h


def embedding_parameters(model: ModelSpec) -> int:
    """Word embedding (V x h) plus learned positions (s x h): held by the first stage, and
    the word embedding again by the last stage for the tied output layer (plus its final
    layer norm, 2h)."""
    return model.vocab_size * model.hidden_size + model.seq_length * model.hidden_size


def bytes_per_parameter(training: TrainingSpec, data_parallel: int) -> tuple[float, float, float]:
    """(weights, gradients, optimizer states) bytes per parameter on one device."""
    if training.precision == "fp32":
        weight, grad = 4.0, 4.0
        optimizer = 8.0 if training.optimizer == "adam" else 4.0
    else:
        weight, grad = 2.0, 4.0
        optimizer = 12.0 if training.optimizer == "adam" else 8.0
    if training.distributed_optimizer:
        optimizer /= data_parallel
    return weight, grad, optimizer


def stored_bytes_per_parameter(
    training: TrainingSpec, data_parallel: int, schedule: str
) -> tuple[float, float, float]:
    """:func:`bytes_per_parameter` of a schedule: a family that keeps several versions of the
    weights (2BW's second one, PipeDream-2BW §3.1) stores each."""
    weight, grad, optimizer = bytes_per_parameter(training, data_parallel)
    return schedule_family(schedule).weight_versions * weight, grad, optimizer


def activation_bytes_per_layer(
    model: ModelSpec, training: TrainingSpec, micro_batch: int, t: int, recompute: Recompute
) -> float:
    """Saved activations of one layer for one micro-batch on one tensor-parallel rank."""
    s, b, h, a = model.seq_length, micro_batch, model.hidden_size, model.num_attention_heads
    sbh = s * b * h
    if training.flash_attention:
        scores = 0.0
    elif training.precision != "fp32" and not fused_softmax_available(model, training, b, t):
        scores = 7.0 * a * s / h
    else:
        scores = 5.0 * a * s / h
    # 16-bit activations; fp32 training doubles every stored tensor.
    scale = 2.0 if training.precision == "fp32" else 1.0
    sp = training.sequence_parallel and t > 1
    if recompute == "full":
        return scale * (2.0 * sbh / t if sp else 2.0 * sbh)
    if recompute == "selective":
        scores = 0.0
    if sp:
        return scale * sbh / t * (34.0 + scores)
    return scale * sbh * (10.0 + 24.0 / t + scores / t)


def recompute_working_bytes(
    model: ModelSpec, training: TrainingSpec, micro_batch: int, t: int, recompute: Recompute
) -> float:
    """Transient memory while a recomputed layer runs its backward: the activations of that one
    layer as if nothing were recomputed (full), or its attention scores (selective)."""
    if recompute == "none":
        return 0.0
    full_layer = activation_bytes_per_layer(model, training, micro_batch, t, "none")
    if recompute == "full":
        return full_layer
    return full_layer - activation_bytes_per_layer(model, training, micro_batch, t, "selective")


def embedding_activation_bytes(
    model: ModelSpec, training: TrainingSpec, micro_batch: int, t: int
) -> float:
    """Embedding activations on the first stage: the token ids it looks up (int64, 8sb) and
    the mask of the dropout after it (one byte per element, sbh; sbh/t with sequence
    parallelism, which drops out only the rank's shard). Korthikanti et al.'s per-layer count
    leaves them out; next to a fully recomputed layer (2sbh) they are not small."""
    sb = model.seq_length * micro_batch
    shard = t if training.sequence_parallel and t > 1 else 1
    return 8.0 * sb + sb * model.hidden_size / shard


def output_activation_bytes(
    model: ModelSpec, training: TrainingSpec, micro_batch: int, t: int
) -> float:
    """Output layer and cross-entropy activations on the last stage: 4sbh/t (1 + V/h)."""
    sbh = model.seq_length * micro_batch * model.hidden_size
    return 4.0 * sbh / t * (1.0 + model.vocab_size / model.hidden_size)
