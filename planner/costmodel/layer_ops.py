"""One transformer layer of Megatron-LM's GPT, operation by operation, on one tensor rank.

Each operation is priced by :mod:`planner.costmodel.kernels` from its own shape after the
tensor split, so micro-batch size, tensor-parallel degree, sequence length and flash
attention change the time the way they change the kernels. Notation: b micro-batch, s
sequence, h hidden, a heads, f MLP size, t tensor-parallel degree, T = s b tokens; with
sequence parallelism (SP) the layer norms, dropouts and residual adds run on T / t tokens.

Forward (F), in Megatron's order:
  layer norm; [SP: all-gather]; QKV GEMM (T x 3h/t x h); QKV bias add; attention core:
  scores (b a/t GEMMs of s x s x h/a), scale-mask-softmax and dropout (memory-bound on
  b a/t s^2 elements), context (b a/t GEMMs of s x h/a x s) and its copy back to the
  sequence-first layout -- or one flash-attention kernel;
  projection GEMM (T x h x h/t); reduce-scatter [all-reduce without SP]; bias-dropout-add;
  layer norm; [SP: all-gather]; FC1 GEMM (T x f/t x h); bias-GeLU; FC2 GEMM (T x h x f/t);
  reduce-scatter [all-reduce]; bias-dropout-add.
Input gradient (B): the data gradient of every GEMM (m x k x n of its forward), the
  backward of every memory-bound op, the attention core's four GEMMs (or the flash
  backward), the bias gradients, and the transposes of the forward's collectives: the
  all-gathers before the row-parallel data gradients (FC2, projection) block, as in the
  forward.
Weight gradient (W): every GEMM's weight gradient (n x k x T, accumulated into the fp32
  gradient buffer: Megatron's gradient-accumulation fusion). It is all a zero-bubble
  schedule defers: the bias gradients are taken with the input gradient (the zero-bubble
  fork of Megatron-LM, ``LinearWithGradAccumulationAndAsyncCommunication.backward``).
Overlapped collectives (Megatron-LM v3 ``LinearWithGradAccumulationAndAsyncCommunication``
  .backward, the column-parallel QKV, FC1 and output layers): the reduce-scatter of the input
  gradient (all-reduce without SP) is issued asynchronously and runs under the layer's
  weight-gradient GEMM; with SP the layer-norm output is all-gathered again for that GEMM,
  asynchronously under the data-gradient GEMM. Only what outlasts the GEMM it runs under
  is counted (``... (exposed)`` ops, zero at the papers' shapes): the reduce-scatter in W,
  where the weight-gradient GEMM is, the re-gather in B. (A schedule that defers W, as
  zero-bubble ones do, leaves the reduce-scatter to run under whatever compute follows B;
  it is counted the same way.)
Llama-style layers (:class:`planner.specs.ModelSpec`): with grouped-query attention the QKV
  GEMM is T x (h + 2k)/t x h, k = g h / a the key width (a smaller K/V part), the attention
  core unchanged (every query head attends, its K/V head shared); SwiGLU's gate and up
  projections run as one FC1 GEMM of T x 2f/t x h (Megatron's fused ``linear_fc1``), its
  SwiGLU reads 2f and writes f per token, and FC2 is unchanged; RMSNorm moves the same bytes
  as LayerNorm (memory-bound either way); rotary embeddings rotate Q and K (one pass over
  them each way) and drop the position-table add of the embedding; without linear biases the
  bias gradients go.
Context parallelism (cp): each rank holds s / cp tokens (two chunks of s / 2cp, so the causal
  mask leaves every rank the same work) and every token-wise op runs on them; attention runs
  as a ring: cp - 1 times, each rank passes its K/V chunk (2 s/cp b k/t elements) to the next
  and attends to the one received, the backward passes K/V and their gradients (twice the
  bytes). Assumed overlapped as Transformer Engine does it, each transfer with the attention
  of the chunk in hand: a step costs max(transfer, that attention), so only the excess is
  priced ("ring attention exposed").
Recomputation re-runs, in B, exactly what its mode drops: the attention core for
  ``selective`` (Korthikanti et al. 2022 §5), the whole forward with its collectives for
  ``full``.
The forward's tensor-parallel collectives and their transposes in B block the compute
  stream (Megatron's default); the backward's asynchronous ones are described above. A ring
  of t ranks moves (t - 1) / t of the tensor in t - 1 steps.

The first stage adds the embedding (vocabulary-parallel lookup, its reduce, position add,
dropout; the weight gradient scattered into the table), the last stage the final layer
norm, the vocabulary-parallel output GEMM and the fp32 cross-entropy (Megatron's
``vocab_parallel_cross_entropy``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from planner.costmodel.kernels import (
    DeviceRates,
    flash_attention_seconds,
    gemm_seconds,
    memory_seconds,
)
from planner.profiles import Link
from planner.specs import ModelSpec, Recompute, TrainingSpec

__all__ = [
    "CollectiveCost",
    "Op",
    "Phase",
    "embedding_ops",
    "fused_softmax_available",
    "fused_softmax_problem",
    "layer_ops",
    "output_ops",
    "phase_seconds",
    "ring_seconds",
]

Phase = Literal["F", "B", "W"]
_MASK_BYTES = 1  # a dropout mask element (torch.bool)
_LOSS_FORWARD_BYTES = 38  # per logit: cast to fp32, max, subtract, exp, sum, softmax kept
_LOSS_BACKWARD_BYTES = 22  # per logit: softmax - one-hot, times the loss gradient, cast back


@dataclass(frozen=True)
class Op:
    """One kernel (or collective) of a pass: its name, pass, kind and seconds."""

    name: str
    phase: Phase
    kind: Literal["gemm", "memory", "flash", "collective"]
    seconds: float


@dataclass(frozen=True)
class CollectiveCost:
    """How tensor-parallel collectives are priced: the link inside the node and the share of
    its bandwidth a ring reaches."""

    link: Link
    efficiency: float


def ring_seconds(cost: CollectiveCost, num_bytes: float, ranks: int) -> float:
    """One all-gather or reduce-scatter of a ``num_bytes`` tensor over ``ranks`` in a ring:
    ranks - 1 steps, each moving 1 / ranks of it (an all-reduce is two of these)."""
    if ranks <= 1 or num_bytes <= 0:
        return 0.0
    steps = ranks - 1
    bandwidth = cost.link.bandwidth_gbps * 1e9 * cost.efficiency
    return steps * cost.link.latency_us * 1e-6 + steps / ranks * num_bytes / bandwidth


@dataclass(frozen=True)
class _Shape:
    """The sizes every op of a layer needs, after the tensor (and context) split."""

    tokens: int  # T = s b / cp
    norm_tokens: int  # tokens a layer norm / dropout sees (T / t with SP)
    seq: int  # queries on this rank: s / cp
    kv_seq: int  # keys each query attends over: s
    hidden: int
    heads: int  # heads on this rank (a / t)
    head_dim: int
    qkv: int  # (h + 2k) / t
    kv: int  # k / t
    ffn: int  # f / t
    fc1: int  # FC1 outputs on this rank: f / t, 2f / t gated
    gated: bool
    rope: bool
    bias: bool
    batch: int
    t: int
    cp: int
    eb: int  # bytes per activation element
    sequence_parallel: bool
    flash: bool
    fused_softmax: bool


def _shape(
    model: ModelSpec, training: TrainingSpec, micro_batch: int, t: int, cp: int = 1
) -> _Shape:
    seq = model.seq_length // cp
    tokens = seq * micro_batch
    sp = training.sequence_parallel and t > 1
    ffn = model.ffn // t
    return _Shape(
        tokens=tokens,
        norm_tokens=tokens // t if sp else tokens,
        seq=seq,
        kv_seq=model.seq_length,
        hidden=model.hidden_size,
        heads=model.num_attention_heads // t,
        head_dim=model.hidden_size // model.num_attention_heads,
        qkv=(model.hidden_size + 2 * model.kv_size) // t,
        kv=model.kv_size // t,
        ffn=ffn,
        fc1=2 * ffn if model.gated else ffn,
        gated=model.gated,
        rope=model.position_embedding == "rope",
        bias=model.add_bias_linear,
        batch=micro_batch,
        t=t,
        cp=cp,
        eb=4 if training.precision == "fp32" else 2,
        sequence_parallel=sp,
        flash=training.flash_attention,
        fused_softmax=fused_softmax_available(model, training, micro_batch, t),
    )


def _ring(s: _Shape, cost: CollectiveCost, phase: Phase, name: str, rings: int = 1) -> list[Op]:
    """A tensor-parallel collective over an s b h tensor: ``rings`` ring passes (an
    all-gather or reduce-scatter is one, an all-reduce two); nothing when t = 1."""
    seconds = ring_seconds(cost, s.tokens * s.hidden * s.eb, s.t)
    return [Op(name, phase, "collective", rings * seconds)] if seconds > 0 else []


def _gather(s: _Shape, cost: CollectiveCost, phase: Phase) -> list[Op]:
    """Before a column-parallel GEMM: an all-gather with SP (identity without)."""
    return _ring(s, cost, phase, "all-gather") if s.sequence_parallel else []


def _reduce(s: _Shape, cost: CollectiveCost, phase: Phase) -> list[Op]:
    """After a row-parallel GEMM (or, in B, a column-parallel one): a reduce-scatter with
    SP, an all-reduce without."""
    if s.sequence_parallel:
        return _ring(s, cost, phase, "reduce-scatter")
    return _ring(s, cost, phase, "all-reduce", rings=2)


def fused_softmax_available(
    model: ModelSpec, training: TrainingSpec, micro_batch: int, t: int
) -> bool:
    """Whether Megatron-LM runs its fused causal scale-mask-softmax kernel
    (``FusedScaleMaskSoftmax.is_kernel_available``): see :func:`fused_softmax_problem`.
    Otherwise Megatron falls back to PyTorch ops in fp32 (``forward_torch_softmax``)."""
    return fused_softmax_problem(model, training, micro_batch, t) is None


def fused_softmax_problem(
    model: ModelSpec, training: TrainingSpec, micro_batch: int, t: int
) -> str | None:
    """Why Megatron-LM's fused causal softmax cannot run, or None: it takes 16-bit input,
    16 < s <= 4096 with s a multiple of 4, and b x a/t attention batches a multiple of the
    kernel's batches per block (4 for s > 128; ``get_batch_per_block`` in
    scaled_upper_triang_masked_softmax.h)."""
    s = model.seq_length
    batches = micro_batch * (model.num_attention_heads // t)
    if training.precision == "fp32":
        return "fp32 training (the kernel takes 16-bit input)"
    if not 16 < s <= 4096 or s % 4:
        return f"sequence length {s} (the kernel takes 16 < s <= 4096, a multiple of 4)"
    power = 1 << (s - 1).bit_length()
    warp = min(power, 32)
    per_block = (128 // warp) * (2 if power <= 128 else 1)
    needed = math.lcm(4, per_block)
    if batches % needed:
        return f"{batches} attention batches per rank (b x heads / t), not a multiple of {needed}"
    return None


# Bytes per attention-score element of the softmax. Fused (16-bit): the causal kernel reads
# the lower triangle and writes every element (forward 0.5 x 2 + 2; backward reads gradient
# and output in the triangle, writes all: 2 + 2). Unfused, Megatron's fallback with
# softmax_in_fp32 (query-key layer scaling is on by default): cast to fp32 (2 + 4), scale
# (4 + 4), masked_fill_ (4 + 4), softmax (4 + 4), cast back (4 + 2) = 36 over 5 kernels; its
# backward runs the same chain in reverse: 6 + 12 + 8 + 8 + 6 = 40. In fp32 training there
# are no casts: 24 and 28 over 3 kernels.
_FUSED_SOFTMAX_BYTES = (3, 4)
_UNFUSED_SOFTMAX_BYTES = {2: (36, 40, 5), 4: (24, 28, 3)}


def _softmax_op(rates: DeviceRates, s: _Shape, phase: Phase, backward: bool) -> Op:
    scores = s.batch * s.heads * s.seq * s.kv_seq
    suffix = " backward" if backward else ""
    if s.fused_softmax:
        per = _FUSED_SOFTMAX_BYTES[1 if backward else 0]
        return Op(f"softmax{suffix}", phase, "memory", memory_seconds(rates, per * scores))
    forward_bytes, backward_bytes, kernels = _UNFUSED_SOFTMAX_BYTES[s.eb]
    per = backward_bytes if backward else forward_bytes
    return Op(
        f"softmax{suffix} (unfused fp32 fallback)",
        phase,
        "memory",
        memory_seconds(rates, per * scores, kernels),
    )


def _ring_exposed(s: _Shape, ring: Link | None, attention: float, volume: float) -> float:
    """Seconds of a context-parallel ring pass not hidden behind the attention: cp - 1 steps,
    each sending ``volume`` bytes of K/V (and, in the backward, their gradients) while the
    chunk in hand is attended (``attention`` / cp of the pass's attention seconds)."""
    if s.cp <= 1 or ring is None:
        return 0.0
    step = ring.seconds(volume)  # a point-to-point send, priced as the pipeline's hops
    return (s.cp - 1) * max(0.0, step - attention / s.cp)


def _attention_core_forward(
    rates: DeviceRates, s: _Shape, phase: Phase, ring: Link | None = None
) -> list[Op]:
    """Scores, softmax, dropout, context (or the flash kernel), in ``phase``; with context
    parallelism, the ring's exposed K/V transfers."""
    scores = s.batch * s.heads * s.seq * s.kv_seq
    if s.flash:
        flops = 0.5 * 4.0 * scores * s.head_dim  # causal: half of the blocks are skipped
        seconds = flash_attention_seconds(rates, flops)
        ops = [Op("flash attention", phase, "flash", seconds)]
        exposed = _ring_exposed(s, ring, seconds, 2.0 * s.tokens * s.kv * s.eb)
        if exposed > 0:
            ops.append(Op("ring attention K/V exposed", phase, "collective", exposed))
        return ops
    bh = s.batch * s.heads
    return [
        Op(
            "attention scores",
            phase,
            "gemm",
            gemm_seconds(rates, s.seq, s.kv_seq, s.head_dim, bh),
        ),
        _softmax_op(rates, s, phase, backward=False),
        Op(
            "attention dropout",
            phase,
            "memory",
            memory_seconds(rates, (2 * s.eb + _MASK_BYTES) * scores),
        ),
        Op(
            "attention context",
            phase,
            "gemm",
            gemm_seconds(rates, s.seq, s.head_dim, s.kv_seq, bh),
        ),
        # The context comes out [b a/t, s, d] and the projection takes [s, b, h/t]: Megatron's
        # core attention copies it (``permute(2, 0, 1, 3).contiguous()``). Its gradient needs
        # no copy: the batched GEMMs of B read it through strides.
        Op(
            "context layout copy",
            phase,
            "memory",
            memory_seconds(rates, 2 * s.eb * s.tokens * s.heads * s.head_dim),
        ),
    ]


def _activation(rates: DeviceRates, s: _Shape, phase: Phase, backward: bool) -> Op:
    """GeLU reads and writes f per token (its backward also reads the gradient); SwiGLU
    reads gate and up (2f) and writes f (its backward reads 2f and the gradient, writes 2f)."""
    T, eb = s.tokens, s.eb
    if s.gated:
        per_token = 5 if backward else 3
        return Op(
            "SwiGLU backward" if backward else "SwiGLU",
            phase,
            "memory",
            memory_seconds(rates, per_token * eb * T * s.ffn),
        )
    per_token = 3 if backward else 2
    name = "GeLU backward" if backward else "bias-GeLU"
    return Op(name, phase, "memory", memory_seconds(rates, per_token * eb * T * s.ffn))


def _rotary(rates: DeviceRates, s: _Shape, phase: Phase, backward: bool) -> list[Op]:
    """Rotary embeddings: one pass reading and writing Q and K (their gradients in B)."""
    if not s.rope:
        return []
    seconds = memory_seconds(rates, 2 * s.eb * s.tokens * (s.qkv - s.kv))
    return [Op("rotary embedding" + (" backward" if backward else ""), phase, "memory", seconds)]


def _forward(
    rates: DeviceRates,
    s: _Shape,
    cost: CollectiveCost,
    phase: Phase,
    ring: Link | None = None,
) -> list[Op]:
    T, h, eb, norm = s.tokens, s.hidden, s.eb, s.norm_tokens
    layer_norm = memory_seconds(rates, 2 * eb * norm * h)
    bias_dropout_add = memory_seconds(rates, (3 * eb + _MASK_BYTES) * norm * h)
    ops = [Op("layer norm 1", phase, "memory", layer_norm)]
    ops += _gather(s, cost, phase)
    ops.append(Op("QKV GEMM", phase, "gemm", gemm_seconds(rates, T, s.qkv, h)))
    if s.bias:
        # The QKV layer does not skip its bias add (the others hand theirs to the fused
        # bias-GeLU and bias-dropout-add), and Megatron adds it after the GEMM, as its own
        # kernel: ``output = output + bias``.
        ops.append(Op("QKV bias add", phase, "memory", memory_seconds(rates, 2 * eb * T * s.qkv)))
    ops += _rotary(rates, s, phase, backward=False)
    ops += _attention_core_forward(rates, s, phase, ring)
    ops.append(Op("projection GEMM", phase, "gemm", gemm_seconds(rates, T, h, h // s.t)))
    ops += _reduce(s, cost, phase)
    ops.append(Op("bias-dropout-add 1", phase, "memory", bias_dropout_add))
    ops.append(Op("layer norm 2", phase, "memory", layer_norm))
    ops += _gather(s, cost, phase)
    ops.append(Op("FC1 GEMM", phase, "gemm", gemm_seconds(rates, T, s.fc1, h)))
    ops.append(_activation(rates, s, phase, backward=False))
    ops.append(Op("FC2 GEMM", phase, "gemm", gemm_seconds(rates, T, h, s.ffn)))
    ops += _reduce(s, cost, phase)
    ops.append(Op("bias-dropout-add 2", phase, "memory", bias_dropout_add))
    return ops


def _attention_core_backward(rates: DeviceRates, s: _Shape, ring: Link | None = None) -> list[Op]:
    scores = s.batch * s.heads * s.seq * s.kv_seq
    if s.flash:
        # Recomputes the scores, then dV, dP, dQ, dK: five GEMM-sized passes (FlashAttention-2).
        flops = 0.5 * 10.0 * scores * s.head_dim
        seconds = flash_attention_seconds(rates, flops)
        ops = [Op("flash attention backward", "B", "flash", seconds)]
        # K/V and their gradients travel the ring: twice the forward's bytes.
        exposed = _ring_exposed(s, ring, seconds, 4.0 * s.tokens * s.kv * s.eb)
        if exposed > 0:
            ops.append(Op("ring attention K/V backward exposed", "B", "collective", exposed))
        return ops
    bh, eb = s.batch * s.heads, s.eb
    return [
        Op(
            "context grad (probs)",
            "B",
            "gemm",
            gemm_seconds(rates, s.seq, s.kv_seq, s.head_dim, bh),
        ),
        Op("context grad (V)", "B", "gemm", gemm_seconds(rates, s.kv_seq, s.head_dim, s.seq, bh)),
        Op(
            "attention dropout backward",
            "B",
            "memory",
            memory_seconds(rates, (2 * eb + _MASK_BYTES) * scores),
        ),
        _softmax_op(rates, s, "B", backward=True),
        Op("scores grad (Q)", "B", "gemm", gemm_seconds(rates, s.seq, s.head_dim, s.kv_seq, bh)),
        Op("scores grad (K)", "B", "gemm", gemm_seconds(rates, s.kv_seq, s.head_dim, s.seq, bh)),
    ]


def _exposed(collective: list[Op], under: Op, phase: Phase) -> list[Op]:
    """A collective issued asynchronously under ``under`` (a GEMM on the compute stream):
    only the part that outlasts the GEMM delays the pass (see the module docstring)."""
    return [
        Op(f"{op.name} (exposed)", phase, "collective", max(0.0, op.seconds - under.seconds))
        for op in collective
    ]


def _regather(s: _Shape, cost: CollectiveCost, data_grad: Op) -> list[Op]:
    """With SP: the layer-norm output all-gathered again for a column-parallel weight
    gradient, under that layer's data-gradient GEMM."""
    return _exposed(_gather(s, cost, "B"), data_grad, "B") if s.sequence_parallel else []


def _input_gradient(
    rates: DeviceRates, s: _Shape, cost: CollectiveCost, ring: Link | None = None
) -> list[Op]:
    T, h, eb, norm = s.tokens, s.hidden, s.eb, s.norm_tokens
    # Dropout backward, then the residual branch's gradient added to the main one.
    residual = memory_seconds(rates, (2 * eb + _MASK_BYTES) * norm * h + 3 * eb * norm * h, 2)
    layer_norm = memory_seconds(rates, 3 * eb * norm * h)
    # The transposes of the forward's collectives: the gradient of a reduce-scatter is an
    # all-gather (blocking); the column-parallel side's reduce-scatter (all-reduce without
    # SP) runs under the weight-gradient GEMM and is counted in W.
    ops = [Op("bias-dropout-add 2 backward", "B", "memory", residual)]
    ops += _gather(s, cost, "B")
    ops.append(Op("FC2 data grad", "B", "gemm", gemm_seconds(rates, T, s.ffn, h)))
    ops.append(_activation(rates, s, "B", backward=True))
    fc1 = Op("FC1 data grad", "B", "gemm", gemm_seconds(rates, T, h, s.fc1))
    ops += [fc1, *_regather(s, cost, fc1)]
    ops.append(Op("layer norm 2 backward", "B", "memory", layer_norm))
    ops.append(Op("bias-dropout-add 1 backward", "B", "memory", residual))
    ops += _gather(s, cost, "B")
    ops.append(Op("projection data grad", "B", "gemm", gemm_seconds(rates, T, h // s.t, h)))
    ops += _attention_core_backward(rates, s, ring)
    ops += _rotary(rates, s, "B", backward=True)
    qkv = Op("QKV data grad", "B", "gemm", gemm_seconds(rates, T, h, s.qkv))
    ops += [qkv, *_regather(s, cost, qkv)]
    ops.append(Op("layer norm 1 backward", "B", "memory", layer_norm))
    if s.bias:
        # Each bias gradient is a sum of its output gradient over the tokens, taken with the
        # input gradient (``grad_output.sum(dim=0)`` in Megatron's linear backward, autograd's
        # reduction for the fused bias-GeLU and bias-dropout-add); zero-bubble schedules
        # defer only the weight GEMMs to W.
        bias_bytes = eb * (T * s.qkv + norm * h + T * s.fc1 + norm * h)
        ops.append(Op("bias grads", "B", "memory", memory_seconds(rates, bias_bytes, 4)))
    return ops


def _weight_gradient(rates: DeviceRates, s: _Shape, cost: CollectiveCost) -> list[Op]:
    T, h = s.tokens, s.hidden
    fp32 = 8.0  # read and write the fp32 gradient buffer
    qkv_grad = Op(
        "QKV weight grad", "W", "gemm", gemm_seconds(rates, s.qkv, h, T, output_bytes=fp32)
    )
    fc1_grad = Op(
        "FC1 weight grad", "W", "gemm", gemm_seconds(rates, s.fc1, h, T, output_bytes=fp32)
    )
    return [
        qkv_grad,
        *_exposed(_reduce(s, cost, "W"), qkv_grad, "W"),
        Op(
            "projection weight grad",
            "W",
            "gemm",
            gemm_seconds(rates, h, h // s.t, T, output_bytes=fp32),
        ),
        fc1_grad,
        *_exposed(_reduce(s, cost, "W"), fc1_grad, "W"),
        Op("FC2 weight grad", "W", "gemm", gemm_seconds(rates, h, s.ffn, T, output_bytes=fp32)),
    ]


def layer_ops(
    rates: DeviceRates,
    model: ModelSpec,
    training: TrainingSpec,
    micro_batch: int,
    t: int,
    recompute: Recompute,
    collectives: CollectiveCost,
    cp: int = 1,
    ring: Link | None = None,
) -> tuple[Op, ...]:
    """Every kernel of one layer's F, B (recomputation included) and W, in order, on one rank
    of a tensor (t) and context (cp) parallel group; ``ring`` is the link of the
    context-parallel K/V ring (inside a node when t x cp fits one)."""
    s = _shape(model, training, micro_batch, t, cp)
    ops = _forward(rates, s, collectives, "F", ring)
    if recompute == "full":
        ops += [Op(f"recompute {op.name}", "B", op.kind, op.seconds) for op in ops]
    elif recompute == "selective":
        ops += [
            Op(f"recompute {op.name}", "B", op.kind, op.seconds)
            for op in _attention_core_forward(rates, s, "B", ring)
        ]
    ops += _input_gradient(rates, s, collectives, ring)
    ops += _weight_gradient(rates, s, collectives)
    return tuple(ops)


def embedding_ops(
    rates: DeviceRates,
    model: ModelSpec,
    training: TrainingSpec,
    micro_batch: int,
    t: int,
    collectives: CollectiveCost,
    cp: int = 1,
) -> tuple[Op, ...]:
    """The first stage's extra work: the vocabulary-parallel word embedding (each rank
    looks up its slice, then a reduce over t), the learned position embedding's add (none
    with rotary embeddings) and dropout; in W, the lookup's gradient scattered into the
    rank's slice of the table, accumulated in fp32."""
    s = _shape(model, training, micro_batch, t, cp)
    T, h, eb = s.tokens, s.hidden, s.eb
    reduce = _reduce(s, collectives, "F")
    gather = _gather(s, collectives, "B")
    table = model.vocab_rows(t) * h
    position = (
        Op(
            "position add + dropout",
            "F",
            "memory",
            memory_seconds(rates, (3 * eb + (2 * eb + _MASK_BYTES)) * s.norm_tokens * h, 2),
        )
        if not s.rope
        else Op(
            "embedding dropout",
            "F",
            "memory",
            memory_seconds(rates, (2 * eb + _MASK_BYTES) * s.norm_tokens * h),
        )
    )
    return (
        Op("embedding lookup", "F", "memory", memory_seconds(rates, 2 * eb * T * h)),
        *reduce,
        position,
        Op(
            "embedding dropout backward",
            "B",
            "memory",
            memory_seconds(rates, (2 * eb + _MASK_BYTES) * s.norm_tokens * h),
        ),
        *gather,
        Op(
            "embedding weight grad",
            "W",
            "memory",
            memory_seconds(rates, 2 * eb * T * h + 8 * table, 2),
        ),
    )


def output_ops(
    rates: DeviceRates,
    model: ModelSpec,
    training: TrainingSpec,
    micro_batch: int,
    t: int,
    collectives: CollectiveCost,
    cp: int = 1,
) -> tuple[Op, ...]:
    """The last stage's extra work: final layer norm, [SP: all-gather], the logits GEMM
    (T x V/t x h, tied to the embedding or its own matrix: the same work), the fp32
    cross-entropy over the rank's vocabulary slice, and their gradients (the output layer is
    column-parallel: its input gradient's reduce-scatter runs under its weight-gradient GEMM,
    as in a layer)."""
    s = _shape(model, training, micro_batch, t, cp)
    T, h, eb = s.tokens, s.hidden, s.eb
    vocab = model.vocab_rows(t)
    logits = T * vocab
    gather = _gather(s, collectives, "F")
    data_grad = Op("logits data grad", "B", "gemm", gemm_seconds(rates, T, h, vocab))
    weight_grad = Op(
        "logits weight grad", "W", "gemm", gemm_seconds(rates, vocab, h, T, output_bytes=8.0)
    )
    return (
        Op("final layer norm", "F", "memory", memory_seconds(rates, 2 * eb * s.norm_tokens * h)),
        *gather,
        Op("logits GEMM", "F", "gemm", gemm_seconds(rates, T, vocab, h)),
        Op("cross-entropy", "F", "memory", memory_seconds(rates, _LOSS_FORWARD_BYTES * logits, 6)),
        Op(
            "cross-entropy backward",
            "B",
            "memory",
            memory_seconds(rates, _LOSS_BACKWARD_BYTES * logits, 3),
        ),
        data_grad,
        *_regather(s, collectives, data_grad),
        Op(
            "final layer norm backward",
            "B",
            "memory",
            memory_seconds(rates, 3 * eb * s.norm_tokens * h),
        ),
        weight_grad,
        *_exposed(_reduce(s, collectives, "W"), weight_grad, "W"),
    )


def phase_seconds(ops: tuple[Op, ...]) -> tuple[float, float, float]:
    """(F, B, W) seconds of a list of ops."""
    totals = {"F": 0.0, "B": 0.0, "W": 0.0}
    for op in ops:
        totals[op.phase] += op.seconds
    return totals["F"], totals["B"], totals["W"]
