"""Memory per device: parameters, gradients, optimizer states, activations, allowance.

Sources:
- Parameters per layer (Megatron-LM's GPT layer, Narayanan et al. 2021 §5.1, generalised):
  attention h^2 (Q) + 2 h k (K and V, k = g h / a the key width of grouped-query attention
  with g key/value heads) + h^2 (projection), biases h + 2k + h; MLP 2hf (GeLU) or 3hf
  (SwiGLU: gate, up and down), biases f + h or 2f + h; two norms, 4h for LayerNorm (scale
  and shift), 2h for RMSNorm (scale). GPT (g = a, f = 4h, biases, LayerNorm): 12h^2 + 13h.
- Parameters per tensor-parallel rank (Megatron-LM's layers): the column-parallel weights
  and biases (QKV, fc1), the row-parallel weights (projection, fc2) and the vocabulary (word
  embedding, output layer) are split over t; the norms, the row-parallel biases (added after
  the all-reduce), the learned position table (a plain ``torch.nn.Embedding``) and the final
  norm are replicated, whole on every rank. The vocabulary is padded to a multiple of t
  (the emitted ``--make-vocab-size-divisible-by`` pads no further), ceil(V / t) rows a rank.
- Bytes per parameter with mixed precision and Adam: 2 (bf16/fp16 weight) + 4 (fp32 gradient
  buffer) + 12 (fp32 master weight, Adam m and v) = 18; the distributed optimizer (ZeRO-1)
  shards the 12 optimizer bytes over d data-parallel ranks (Megatron-LM,
  docs/source/api-guide/distrib_optimizer.md; with context parallelism over the d x cp ranks
  that hold the same weights). fp32 training: 4 + 4 + 8. SGD with momentum keeps 8 optimizer
  bytes (master + momentum) instead of 12.
- Activations per layer per micro-batch: Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", §4.1 and Table 2, re-derived term by term for
  grouped-query attention and gated MLPs in :func:`activation_bytes_per_layer`; for GPT
  (16-bit) they are Table 2's sbh (10 + 24/t + 5as/(ht)), sbh/t (34 + 5as/h) with sequence
  parallelism; selective drops the 5as/h scores; full keeps 2sbh (2sbh/t with sequence
  parallelism, Megatron keeping only the local sequence shard). Flash attention never
  stores the s x s scores. Where Megatron cannot use its fused softmax kernel
  (``layer_ops.fused_softmax_available``), its fp32 fallback keeps the softmax output in
  fp32: 2 more bytes per score, 7as/h. Context parallelism splits s over cp ranks: every
  term is per token, so each divides by cp.
- Output layer and loss on the last stage: Korthikanti et al.'s 4sbh/t (1 + V/h) (§4.3, with
  sequence parallelism and 16-bit activations), generalized term by term to replicated
  inputs without sequence parallelism, fp32 training and the target ids in
  :func:`output_activation_bytes`.
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
    "final_norm_parameters",
    "layer_parameters",
    "layer_parameters_per_rank",
    "model_parameters",
    "output_activation_bytes",
    "output_parameters",
    "recompute_working_bytes",
]

GIB = float(1 << 30)


def layer_parameters(model: ModelSpec) -> int:
    """Parameters of one transformer layer (before tensor parallelism): see the module
    docstring for the terms."""
    h, f, k = model.hidden_size, model.ffn, model.kv_size
    attention = 2 * h * h + 2 * h * k
    mlp = (3 if model.gated else 2) * h * f
    norms = (4 if model.normalization == "layernorm" else 2) * h
    biases = 0
    if model.add_bias_linear:
        biases = (h + 2 * k + h) + ((2 if model.gated else 1) * f + h)
    return attention + mlp + norms + biases


def _replicated_layer_parameters(model: ModelSpec) -> int:
    """The parameters of one layer every tensor-parallel rank holds whole: the two norms and
    the biases of the row-parallel linears (projection and fc2), h each."""
    h = model.hidden_size
    norms = (4 if model.normalization == "layernorm" else 2) * h
    return norms + (2 * h if model.add_bias_linear else 0)


def layer_parameters_per_rank(model: ModelSpec, t: int) -> float:
    """Parameters of one layer on one of t tensor-parallel ranks: the split ones / t plus the
    replicated ones (see the module docstring)."""
    replicated = _replicated_layer_parameters(model)
    return (layer_parameters(model) - replicated) / t + replicated


def embedding_parameters(model: ModelSpec, t: int = 1) -> int:
    """The first stage's embedding on one of t tensor-parallel ranks: its rows of the word
    table (all V x h with t = 1) plus, with learned positions, the whole position table
    (s x h); rotary embeddings have none."""
    positions = model.seq_length * model.hidden_size if model.position_embedding == "learned" else 0
    return model.vocab_rows(t) * model.hidden_size + positions


def final_norm_parameters(model: ModelSpec) -> int:
    """The final norm before the output layer: 2h for LayerNorm, h for RMSNorm."""
    return (2 if model.normalization == "layernorm" else 1) * model.hidden_size


def output_parameters(model: ModelSpec, num_stages: int, t: int = 1) -> int:
    """What the last stage holds for the output layer on one of t tensor-parallel ranks: its
    own matrix's rows (V x h with t = 1) when untied; when tied, a copy of the word
    embedding's unless the last stage is also the first (one stage), as Megatron-LM keeps
    one and all-reduces their gradients; plus the whole final norm."""
    own = model.untie_embeddings_and_output_weights or num_stages > 1
    rows = model.vocab_rows(t) if own else 0
    return rows * model.hidden_size + final_norm_parameters(model)


def model_parameters(model: ModelSpec) -> int:
    """The model's distinct parameters (a tied output layer counted once): the number a
    model card gives, e.g. 8.03B for Llama 3 8B."""
    return (
        model.num_layers * layer_parameters(model)
        + embedding_parameters(model)
        + output_parameters(model, 1)
    )


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
    model: ModelSpec,
    training: TrainingSpec,
    micro_batch: int,
    t: int,
    recompute: Recompute,
    cp: int = 1,
) -> float:
    """Saved activations of one layer for one micro-batch on one tensor-parallel (and
    context-parallel) rank.

    Korthikanti et al. (§4.1) count, in bytes of 16-bit activations, with k = g h / a the
    width of the keys and of the values (k = h without grouped-query attention) and f the
    MLP width:

    - attention block: QKV input 2sbh; Q and K for Q K^T, 2sbh + 2sbk; softmax output
      2as^2b and its dropout mask as^2b; dropout output 2as^2b and V, 2sbk, for the product
      with V; projection input 2sbh; output dropout mask sbh. Total 7sbh + 4sbk + 5as^2b
      (Korthikanti's 11sbh + 5as^2b when k = h). Rotary embeddings add nothing: their
      backward needs only the cos/sin tables, and the Q, K kept are the rotated ones.
    - MLP, GeLU: fc1 input 2sbh, GeLU input 2sbf, fc2 input 2sbf, dropout mask sbh: 3sbh +
      4sbf (19sbh when f = 4h). SwiGLU: fc1 input 2sbh; fc1's output, gate and up (2f wide),
      which the SwiGLU backward reads, 4sbf; fc2 input 2sbf; dropout mask sbh: 3sbh + 6sbf.
    - two norms: each keeps its input, 4sbh (LayerNorm and RMSNorm alike).

    With tensor parallelism the norms' inputs, the QKV and fc1 inputs and the two dropout
    masks (10sbh) are replicated and the rest divides by t; with sequence parallelism
    everything divides by t. Per sbh, with r = k / h and q = f / h:
    10 + (4 + 4r + (4 or 6) q + 5as/h) / t, or (14 + 4r + (4 or 6) q + 5as/h) / t with
    sequence parallelism; GPT's r = 1, q = 4 give Table 2's 10 + 24/t and 34/t exactly.
    Selective recomputation drops the 5as/h; full keeps the layer input, 2sbh (/t with
    sequence parallelism). Context parallelism keeps s / cp tokens per rank (flash attention
    only, so no scores term). fp32 training stores every tensor in 4 bytes, twice the count
    above, except the three dropout masks (2sbh + as^2b), which stay one byte each."""
    s, b, h, a = model.seq_length // cp, micro_batch, model.hidden_size, model.num_attention_heads
    sbh = s * b * h
    if training.flash_attention:
        scores = 0.0
    elif training.precision != "fp32" and not fused_softmax_available(model, training, b, t):
        scores = 7.0 * a * s / h
    else:
        scores = 5.0 * a * s / h
    # 16-bit activations; fp32 training doubles every stored tensor but the dropout masks,
    # which are one byte per element in any precision.
    scale = 2.0 if training.precision == "fp32" else 1.0
    sp = training.sequence_parallel and t > 1
    if recompute == "full":
        return scale * (2.0 * sbh / t if sp else 2.0 * sbh)
    if recompute == "selective":
        scores = 0.0
    # The masks: attention output's and MLP output's (sbh each, replicated under tensor
    # parallelism without sequence parallelism) and, where the scores are kept, the
    # softmax's (as^2b, split by t).
    softmax_mask = a * s / h if scores else 0.0
    split = 4.0 + 4.0 * model.kv_size / h + (6.0 if model.gated else 4.0) * model.ffn / h
    if sp:
        stored, masks = sbh / t * (10.0 + split + scores), sbh / t * (2.0 + softmax_mask)
    else:
        stored, masks = sbh * (10.0 + split / t + scores / t), sbh * (2.0 + softmax_mask / t)
    return scale * stored - (scale - 1.0) * masks


def recompute_working_bytes(
    model: ModelSpec,
    training: TrainingSpec,
    micro_batch: int,
    t: int,
    recompute: Recompute,
    cp: int = 1,
) -> float:
    """Transient memory while a recomputed layer runs its backward, beyond what the layer keeps
    (its :func:`activation_bytes_per_layer`): what the recomputation adds back, the layer's
    activations as if nothing were recomputed less those it kept. Full: all but the layer's
    input, which Megatron's CheckpointFunction re-runs the layer on as a detached view (no
    copy) of the input it saved, so the first norm's input is the checkpoint already counted;
    selective: the attention scores."""
    if recompute == "none":
        return 0.0
    full_layer = activation_bytes_per_layer(model, training, micro_batch, t, "none", cp)
    return full_layer - activation_bytes_per_layer(model, training, micro_batch, t, recompute, cp)


def embedding_activation_bytes(
    model: ModelSpec, training: TrainingSpec, micro_batch: int, t: int, cp: int = 1
) -> float:
    """Embedding activations on the first stage: the token ids it looks up (int64, 8sb); with
    t > 1 which of them fall outside this rank's rows of the vocabulary (one byte each, sb:
    Megatron-LM's VocabParallelEmbedding zeroes their rows in the backward too); and the mask
    of the dropout after it (one byte per element, sbh; sbh/t with sequence parallelism,
    which drops out only the rank's shard). Korthikanti et al.'s per-layer count leaves them
    out; next to a fully recomputed layer (2sbh) they are not small. s / cp tokens per rank
    with context parallelism."""
    sb = model.seq_length // cp * micro_batch
    shard = t if training.sequence_parallel and t > 1 else 1
    ids = 8.0 * sb + (sb if t > 1 else 0.0)
    return ids + sb * model.hidden_size / shard


def output_activation_bytes(
    model: ModelSpec, training: TrainingSpec, micro_batch: int, t: int, cp: int = 1
) -> float:
    """Final norm, output layer and cross-entropy activations on the last stage, for one
    micro-batch on one rank (s / cp tokens per rank under context parallelism; tied or untied
    alike).

    Korthikanti et al. (§4.3) count 4sbh/t (1 + V/h) in 16-bit activations with sequence
    parallelism: the final norm's input and the output layer's input, 2sbh/t each, and the
    cross-entropy's fp32 logits, 4sbV/t. The same tensors in general:

    - the norm's and the output layer's inputs, sbh each in the activation width (2 bytes, 4
      in fp32): replicated under tensor parallelism, a 1/t shard with sequence parallelism
      (the output layer gathers the sequence again in its backward, as Megatron-LM's does);
    - the softmax over this rank's slice of the vocabulary, fp32 whatever the precision (the
      logits are cast up first): 4sbV/t (V padded to a multiple of t);
    - the target ids, int64 (8sb), and with t > 1 which of them fall outside this rank's
      slice of the vocabulary (1 byte each), as the embedding keeps its token ids.

    The norm's per-token statistics are left out, as the per-layer count leaves out its
    norms'."""
    sb = model.seq_length // cp * micro_batch
    width = 4.0 if training.precision == "fp32" else 2.0
    shard = t if training.sequence_parallel and t > 1 else 1
    ids = 8.0 * sb + (sb if t > 1 else 0.0)
    logits = 4.0 * sb * model.vocab_rows(t)
    return 2.0 * width * sb * model.hidden_size / shard + logits + ids
