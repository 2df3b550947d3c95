"""The GPT the executor trains, cut into pipeline stages, as Megatron-LM builds it.

Token and learned position embedding, pre-LN blocks (causal self-attention, GELU MLP) with
Megatron's bias-dropout-add, a final layer norm, the output layer and the cross-entropy in
fp32. Full weights come from one seed in fp32, independent of the split, so a pipelined,
tensor-parallel run and the single-process reference start from the same numbers; a stage
holds them in the compute precision (bf16/fp16 with fp32 master weights in the optimizer,
or fp32). Activations are (sequence, batch, hidden).

What each setting does here, so that the run saves what the planner prices (Korthikanti et
al. 2022, Table 2):
- recompute, per layer: ``none`` keeps everything; ``selective`` wraps the attention core
  (QK^T, softmax, dropout, attention over V) in ``torch.utils.checkpoint``, which keeps only
  its inputs Q, K, V; ``full`` checkpoints the whole layer, which keeps only its input.
- attention without flash attention is computed op by op, keeping the softmax output, the
  dropout mask and its output (the 5as^2b term; 7as^2b where Megatron-LM cannot use its
  fused softmax kernel and computes the softmax in fp32, ``softmax_in_fp32``, decided by the
  planner's own rule ``planner.costmodel.layer_ops.fused_softmax_available``); with flash
  attention it is
  ``scaled_dot_product_attention``, which keeps no s x s tensor (and, here, no attention
  dropout: the kernel would draw it from the process's random state, which a pipelined run
  does not share with the reference).
- tensor parallelism t: QKV and the first MLP linear column-parallel, the attention output and
  second MLP linear row-parallel, the word embedding, the output layer and the loss
  vocabulary-parallel (each rank holds V / t rows; the embedding looks up the tokens of its
  rows, zeroes the others and all-reduces, as Megatron-LM's VocabParallelEmbedding does);
  the position table and layer norms replicated. Sequence parallelism: see
  :mod:`executor.tensor_parallel`.
- dropout ``p``: after the embedding, on the attention probabilities, after each residual
  branch; masks from :mod:`executor.dropout`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from executor.dropout import DropoutKey, Site, dropout
from executor.tensor_parallel import (
    TensorParallel,
    copy_to,
    gathered_linear,
    reduce_from,
    reduce_scatter_to,
    scatter_to,
    vocab_parallel_cross_entropy,
)
from planner.costmodel.layer_ops import fused_softmax_available
from planner.launch import ExecutorConfig
from planner.specs import ModelSpec

__all__ = [
    "COMPUTE_DTYPE",
    "GPTShape",
    "ModelOptions",
    "Stage",
    "build_stage",
    "init_full_weights",
    "model_options",
]

RecomputeMode = Literal["none", "selective", "full"]
_EMBEDDING_LAYER = -1


@dataclass(frozen=True)
class GPTShape:
    vocab_size: int
    seq_length: int
    hidden_size: int
    num_heads: int
    ffn_hidden_size: int
    num_layers: int

    @classmethod
    def of(cls, model: ModelSpec) -> GPTShape:
        return cls(
            vocab_size=model.vocab_size,
            seq_length=model.seq_length,
            hidden_size=model.hidden_size,
            num_heads=model.num_attention_heads,
            ffn_hidden_size=model.ffn,
            num_layers=model.num_layers,
        )


@dataclass(frozen=True)
class ModelOptions:
    """How a stage computes (see the module docstring)."""

    dtype: torch.dtype = torch.float32
    dropout: float = 0.0
    flash_attention: bool = False
    softmax_in_fp32: bool = False  # Megatron-LM's fallback where its fused kernel cannot run


COMPUTE_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def model_options(config: ExecutorConfig) -> ModelOptions:
    """How the stages of ``config`` compute (the reference computes the same way)."""
    training = config.training
    fused = fused_softmax_available(
        config.model, training, config.micro_batch_size, config.parallel.t
    )
    return ModelOptions(
        dtype=COMPUTE_DTYPE[training.precision],
        dropout=config.dropout,
        flash_attention=training.flash_attention,
        softmax_in_fp32=training.precision != "fp32" and not fused,
    )


def init_full_weights(shape: GPTShape, seed: int = 1234) -> dict[str, Tensor]:
    """Every weight of the whole model, fp32, from one seed (GPT-2 style scaled normal)."""
    gen = torch.Generator().manual_seed(seed)
    h, f, v, s = shape.hidden_size, shape.ffn_hidden_size, shape.vocab_size, shape.seq_length
    std = 0.02
    out_std = std / math.sqrt(2 * shape.num_layers)

    def normal(*size: int, scale: float = std) -> Tensor:
        return torch.randn(*size, generator=gen) * scale

    weights = {"embed.tok": normal(v, h), "embed.pos": normal(s, h)}
    for i in range(shape.num_layers):
        p = f"layers.{i}."
        weights |= {
            p + "ln1.w": torch.ones(h),
            p + "ln1.b": torch.zeros(h),
            p + "qkv.w": normal(3 * h, h),
            p + "qkv.b": torch.zeros(3 * h),
            p + "proj.w": normal(h, h, scale=out_std),
            p + "proj.b": torch.zeros(h),
            p + "ln2.w": torch.ones(h),
            p + "ln2.b": torch.zeros(h),
            p + "fc1.w": normal(f, h),
            p + "fc1.b": torch.zeros(f),
            p + "fc2.w": normal(h, f, scale=out_std),
            p + "fc2.b": torch.zeros(h),
        }
    weights |= {"head.ln.w": torch.ones(h), "head.ln.b": torch.zeros(h), "head.out.w": normal(v, h)}
    return weights


class _Parallel(nn.Module):
    """Shared by blocks and stages: the column- and row-parallel linear and dropout placement."""

    def __init__(self, shape: GPTShape, tp: TensorParallel, options: ModelOptions) -> None:
        super().__init__()
        self.shape = shape
        self.tp = tp
        self.options = options
        self.sp = tp.sequence_parallel and tp.size > 1

    def column(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        if self.sp:
            return gathered_linear(x, weight, bias, self.tp)
        return F.linear(copy_to(x, self.tp), weight, bias)

    def row(self, x: Tensor, weight: Tensor) -> Tensor:
        out = F.linear(x, weight)
        return reduce_scatter_to(out, self.tp) if self.sp else reduce_from(out, self.tp)

    def hidden_dropout(self, x: Tensor, key: DropoutKey, layer: int, site: int) -> Tensor:
        """Dropout of a (sequence, batch, hidden) activation, whole or this rank's shard."""
        s_local, b, h = x.shape
        part: tuple[slice, ...] = ()
        if self.sp:
            part = (slice(self.tp.rank * s_local, (self.tp.rank + 1) * s_local),)
        full = (self.shape.seq_length, b, h)
        return dropout(x, self.options.dropout, key, layer, site, full, part)


class Block(_Parallel):
    """One pre-LN transformer layer holding this tensor rank's share of the weights."""

    def __init__(
        self,
        shape: GPTShape,
        full: dict[str, Tensor],
        index: int,
        tp: TensorParallel,
        options: ModelOptions,
        recompute: RecomputeMode,
    ) -> None:
        super().__init__(shape, tp, options)
        h, heads = shape.hidden_size, shape.num_heads
        if heads % tp.size or shape.ffn_hidden_size % tp.size:
            raise ValueError(
                f"t = {tp.size} must divide the {heads} heads and the MLP size "
                f"{shape.ffn_hidden_size}"
            )
        self.index = index
        self.recompute = recompute
        self.local_heads = heads // tp.size
        self.head_dim = h // heads
        p = f"layers.{index}."
        local = self.local_heads * self.head_dim
        rows = slice(tp.rank * local, (tp.rank + 1) * local)
        f_local = shape.ffn_hidden_size // tp.size
        cols = slice(tp.rank * f_local, (tp.rank + 1) * f_local)
        self.ln1_w = nn.Parameter(full[p + "ln1.w"].clone())
        self.ln1_b = nn.Parameter(full[p + "ln1.b"].clone())
        self.ln2_w = nn.Parameter(full[p + "ln2.w"].clone())
        self.ln2_b = nn.Parameter(full[p + "ln2.b"].clone())
        qkv_w = full[p + "qkv.w"].view(3, h, h)[:, rows, :].reshape(3 * local, h)
        self.qkv_w = nn.Parameter(qkv_w.clone())
        self.qkv_b = nn.Parameter(full[p + "qkv.b"].view(3, h)[:, rows].reshape(3 * local).clone())
        self.proj_w = nn.Parameter(full[p + "proj.w"][:, rows].clone())
        self.proj_b = nn.Parameter(full[p + "proj.b"].clone())
        self.fc1_w = nn.Parameter(full[p + "fc1.w"][cols, :].clone())
        self.fc1_b = nn.Parameter(full[p + "fc1.b"][cols].clone())
        self.fc2_w = nn.Parameter(full[p + "fc2.w"][:, cols].clone())
        self.fc2_b = nn.Parameter(full[p + "fc2.b"].clone())
        s = shape.seq_length
        # Additive causal mask: an addition saves nothing for backward (a masked_fill would
        # keep the mask).
        self.register_buffer("causal", torch.full((s, s), float("-inf")).triu(1), persistent=False)

    def forward(self, x: Tensor, key: DropoutKey) -> Tensor:
        # The weights as this call sees them (under torch.func.functional_call, a weight
        # version's tensors), passed on explicitly: a recomputation in the backward must use
        # these, whatever the module holds by then.
        w: dict[str, Tensor] = dict(self.named_parameters())
        if self.recompute == "full":
            out: Tensor = checkpoint(self._layer, x, key, w, use_reentrant=False)
            return out
        return self._layer(x, key, w)

    def _layer(self, x: Tensor, key: DropoutKey, w: dict[str, Tensor]) -> Tensor:
        h = self.shape.hidden_size
        normed = F.layer_norm(x, (h,), w["ln1_w"], w["ln1_b"])
        qkv = self.column(normed, w["qkv_w"], w["qkv_b"])
        out = self.row(self._attention(qkv, key), w["proj_w"]) + w["proj_b"]
        x = x + self.hidden_dropout(out, key, self.index, Site.ATTENTION_OUTPUT)
        normed = F.layer_norm(x, (h,), w["ln2_w"], w["ln2_b"])
        hidden = F.gelu(self.column(normed, w["fc1_w"], w["fc1_b"]))
        out = self.row(hidden, w["fc2_w"]) + w["fc2_b"]
        return x + self.hidden_dropout(out, key, self.index, Site.MLP_OUTPUT)

    def _attention(self, qkv: Tensor, key: DropoutKey) -> Tensor:
        s, b, _ = qkv.shape
        # (3, batch, heads, sequence, head_dim): Q, K and V are views of one storage.
        qkv = qkv.view(s, b, 3, self.local_heads, self.head_dim).permute(2, 1, 3, 0, 4)
        q, k, v = qkv.contiguous().unbind(0)
        if self.options.flash_attention:
            context = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif self.recompute == "selective":
            context = checkpoint(self._core, q, k, v, key, use_reentrant=False)
        else:
            context = self._core(q, k, v, key)
        return context.permute(2, 0, 1, 3).reshape(s, b, self.local_heads * self.head_dim)

    def _core(self, q: Tensor, k: Tensor, v: Tensor, key: DropoutKey) -> Tensor:
        """Attention scores, softmax, dropout and the weighted sum of V (the part selective
        recomputation recomputes)."""
        s = q.shape[2]
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(self.head_dim))
        causal = self.get_buffer("causal")
        masked = scores + causal[:s, :s].to(scores.dtype)
        if self.options.softmax_in_fp32:  # keeps the fp32 softmax output: 7as^2b, not 5
            probs = torch.softmax(masked.float(), dim=-1).to(scores.dtype)
        else:
            probs = torch.softmax(masked, dim=-1)
        b = q.shape[0]
        heads = slice(self.tp.rank * self.local_heads, (self.tp.rank + 1) * self.local_heads)
        full = (b, self.shape.num_heads, s, s)
        part = (slice(None), heads) if self.tp.size > 1 else ()
        probs = dropout(probs, self.options.dropout, key, self.index, Site.ATTENTION, full, part)
        return torch.matmul(probs, v)


class Stage(_Parallel):
    """Layers [first, end) of the model; the first stage embeds tokens (batch, sequence), the
    last one ends in the output layer and returns its micro-batch's mean cross-entropy."""

    def __init__(
        self,
        shape: GPTShape,
        full: dict[str, Tensor],
        layers: Sequence[int],
        recompute: Sequence[RecomputeMode],
        *,
        embed: bool,
        head: bool,
        tp: TensorParallel,
        options: ModelOptions,
    ) -> None:
        super().__init__(shape, tp, options)
        self.has_embedding = embed
        self.has_head = head
        self.blocks = nn.ModuleList(
            Block(shape, full, i, tp, options, mode)
            for i, mode in zip(layers, recompute, strict=True)
        )
        if (embed or head) and shape.vocab_size % tp.size:
            raise ValueError(f"t = {tp.size} must divide the vocabulary {shape.vocab_size}")
        local = shape.vocab_size // tp.size  # rows of the vocabulary on this rank
        self.vocab_start = tp.rank * local
        if embed:
            rows = full["embed.tok"][self.vocab_start : self.vocab_start + local]
            self.tok = nn.Parameter(rows.clone())
            self.pos = nn.Parameter(full["embed.pos"].clone())
        if head:
            self.ln_f_w = nn.Parameter(full["head.ln.w"].clone())
            self.ln_f_b = nn.Parameter(full["head.ln.b"].clone())
            self.out_w = nn.Parameter(
                full["head.out.w"][self.vocab_start : self.vocab_start + local].clone()
            )
        self.to(options.dtype)

    def _words(self, tokens: Tensor) -> Tensor:
        """The word embedding of ``tokens``: with t > 1 each rank looks up the tokens of its
        rows, zeroes the rest and the ranks sum them (exact: one term is not zero), keeping
        for the backward the shifted ids and which tokens fell outside (Megatron-LM's
        VocabParallelEmbedding)."""
        if self.tp.size == 1:
            return F.embedding(tokens, self.tok)
        rows = self.tok.shape[0]
        outside = (tokens < self.vocab_start) | (tokens >= self.vocab_start + rows)
        ids = (tokens - self.vocab_start).masked_fill(outside, 0)
        words = F.embedding(ids, self.tok).masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from(words, self.tp)

    def partial_gradient_names(self) -> list[str]:
        """Parameters applied to this rank's sequence shard only (sequence parallelism): their
        gradients are partial sums, to be all-reduced over the tensor-parallel group."""
        if not self.sp:
            return []
        return [
            name
            for name, _ in self.named_parameters()
            if name.split(".")[-1].startswith(("ln1_", "ln2_", "ln_f_"))
            or name.endswith(("proj_b", "fc2_b"))
        ]

    def forward(self, x: Tensor, key: DropoutKey, targets: Tensor | None = None) -> Tensor:
        out = self.activations(x, key)
        if not self.has_head:
            return out
        if targets is None:
            raise ValueError("the last stage needs targets to compute the loss")
        return vocab_parallel_cross_entropy(out.float(), targets.t(), self.tp).mean()

    def activations(self, x: Tensor, key: DropoutKey) -> Tensor:
        """Everything but the loss: the embedding (first stage), the layers and, on the last
        stage, the output layer's logits (sequence, batch, vocabulary / t)."""
        if self.has_embedding:
            tokens = x.t()  # (sequence, batch)
            x = self._words(tokens) + self.pos[: tokens.shape[0]].unsqueeze(1)
            if self.sp:
                x = scatter_to(x, self.tp)
            x = self.hidden_dropout(x, key, _EMBEDDING_LAYER, Site.EMBEDDING)
        for block in self.blocks:
            x = block(x, key)
        if not self.has_head:
            return x
        normed = F.layer_norm(x, (self.shape.hidden_size,), self.ln_f_w, self.ln_f_b)
        return self.column(normed, self.out_w, None)


def build_stage(
    shape: GPTShape,
    full: dict[str, Tensor],
    first_layer: int,
    end_layer: int,
    *,
    embed: bool,
    head: bool,
    tp: TensorParallel | None = None,
    options: ModelOptions | None = None,
    recompute: Sequence[RecomputeMode] | None = None,
) -> Stage:
    """The stage holding layers [first_layer, end_layer); ``recompute`` per layer (default
    none)."""
    layers = range(first_layer, end_layer)
    return Stage(
        shape,
        full,
        layers,
        recompute if recompute is not None else ["none"] * len(layers),
        embed=embed,
        head=head,
        tp=tp or TensorParallel(),
        options=options or ModelOptions(),
    )
