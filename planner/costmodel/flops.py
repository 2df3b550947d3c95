"""FLOP counts of a GPT decoder layer and of a whole training step.

Per layer, with b micro-batch size, s sequence, h hidden, f MLP size (Narayanan et al. 2021,
"Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", §5.1, with
f = 4h giving their 24bsh^2 + 4bs^2h):

- linear layers (QKV, projection, two MLP matmuls): 2bs(4h^2 + 2hf) forward;
- attention core (QK^T and attention x V): 4bs^2h forward.

For Llama-style layers the linear count generalises to 2bs(h(h + 2k) + h^2 + 3hf): with
grouped-query attention the K and V projections are h x k, k = g h / a (g key/value heads),
and SwiGLU's MLP has three h x f matrices (gate, up, down). The attention core stays 4bs^2h:
every one of the a query heads attends, sharing its key and value head with a / g - 1 others.

The backward for the input (B) repeats the linear FLOPs and doubles the attention core (both
operands of each attention matmul get gradients); the backward for the weights (W) repeats the
linear FLOPs only (the attention core has no weights). So F + B + W = 3 x F, Megatron's rule.
"""

from __future__ import annotations

from planner.specs import ModelSpec, Recompute

__all__ = [
    "attention_flops",
    "layer_pass_flops",
    "linear_flops",
    "logits_flops",
    "model_flops_per_step",
]


def linear_flops(model: ModelSpec, micro_batch: int) -> float:
    """Forward FLOPs of one layer's linear layers (QKV, projection, MLP; whole layer, before
    tensor parallelism): 2bs(h(h + 2k) + h^2 + 2hf), 3hf for a gated MLP."""
    b, s, h, f = micro_batch, model.seq_length, model.hidden_size, model.ffn
    attention = h * (h + 2 * model.kv_size) + h * h
    mlp = (3 if model.gated else 2) * h * f
    return 2.0 * b * s * (attention + mlp)


def attention_flops(model: ModelSpec, micro_batch: int) -> float:
    """Forward FLOPs of one layer's attention core: QK^T and softmax(.) x V."""
    b, s, h = micro_batch, model.seq_length, model.hidden_size
    return 4.0 * b * s * s * h


def layer_pass_flops(
    model: ModelSpec, micro_batch: int, recompute: Recompute, cp: int = 1
) -> tuple[float, float, float]:
    """(F, B, W) FLOPs of one layer for one micro-batch, recomputation included in B
    (Megatron recomputes before the backward: the whole forward for ``full``, the attention
    core for ``selective``, Korthikanti et al. 2022 §5); per rank of a context-parallel
    group of cp, which takes s / cp of the tokens and, with the causal load balance, 1 / cp
    of the attention."""
    lin = linear_flops(model, micro_batch) / cp
    att = attention_flops(model, micro_batch) / cp
    forward = lin + att
    backward_input = lin + 2 * att
    weight = lin
    if recompute == "full":
        backward_input += forward
    elif recompute == "selective":
        backward_input += att
    return forward, backward_input, weight


def logits_flops(model: ModelSpec, micro_batch: int) -> float:
    """Forward FLOPs of the output layer (hidden -> vocabulary logits)."""
    return 2.0 * micro_batch * model.seq_length * model.hidden_size * model.vocab_size


def model_flops_per_step(model: ModelSpec, global_batch: int) -> float:
    """Model FLOPs of one optimizer step without recomputation, the numerator of MFU:
    72 B s L h^2 (1 + s / 6h + V / 12hL) for f = 4h (Narayanan et al. 2021, eq. 3;
    Korthikanti et al. 2022 use the same count for MFU), generalised to any f through
    :func:`linear_flops`."""
    per_sample = model.num_layers * (linear_flops(model, 1) + attention_flops(model, 1))
    per_sample += logits_flops(model, 1)
    return 3.0 * global_batch * per_sample
