"""A GPT reference model, cut into pipeline stages, with Megatron-style tensor parallelism.

The model (token + learned position embedding, pre-LN blocks of causal self-attention and a
GELU MLP, final layer norm, output head, cross-entropy) is built from a ModelSpec. Its full
weights come from one seed, independent of how the model is split, so a pipelined,
tensor-parallel run and the single-process reference start from the same numbers.

Tensor parallelism (Narayanan et al. 2021 / Megatron-LM): QKV and the first MLP matmul are
column-parallel (each rank holds heads / t heads and ffn / t columns), the attention output
projection and the second MLP matmul are row-parallel and end in an all-reduce; the
conjugate "copy" operation all-reduces the input gradient in the backward. Embedding, layer
norms and the head are replicated inside a tensor-parallel group (their gradients are then
identical on every rank). The output head is not tied to the embedding, so the first and
last stages need no shared-weight synchronisation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["GPTShape", "Stage", "TensorParallel", "build_stage", "init_full_weights"]


@dataclass(frozen=True)
class GPTShape:
    vocab_size: int
    seq_length: int
    hidden_size: int
    num_heads: int
    ffn_hidden_size: int
    num_layers: int

    @classmethod
    def from_model_spec(cls, spec: dict[str, Any]) -> GPTShape:
        hidden = int(spec["hidden_size"])
        return cls(
            vocab_size=int(spec["vocab_size"]),
            seq_length=int(spec["seq_length"]),
            hidden_size=hidden,
            num_heads=int(spec["num_attention_heads"]),
            ffn_hidden_size=int(spec.get("ffn_hidden_size") or 4 * hidden),
            num_layers=int(spec["num_layers"]),
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


@dataclass(frozen=True)
class TensorParallel:
    """This rank's place in its tensor-parallel group (size 1: no tensor parallelism)."""

    size: int = 1
    rank: int = 0
    group: Any = None


class _CopyToTensorParallel(torch.autograd.Function):
    """Identity forward; all-reduce of the gradient backward (Megatron's f)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTensorParallel(torch.autograd.Function):
    """All-reduce forward; identity backward (Megatron's g)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


class Block(nn.Module):
    """One pre-LN transformer block holding this tensor rank's share of the weights."""

    def __init__(self, shape: GPTShape, full: dict[str, Tensor], index: int, tp: TensorParallel):
        super().__init__()
        h, heads = shape.hidden_size, shape.num_heads
        if heads % tp.size or shape.ffn_hidden_size % tp.size:
            raise ValueError(
                f"t = {tp.size} must divide the {heads} heads and the MLP size "
                f"{shape.ffn_hidden_size}"
            )
        self.tp = tp
        self.local_heads = heads // tp.size
        self.head_dim = h // heads
        p = f"layers.{index}."
        local = self.local_heads * self.head_dim
        rows = slice(tp.rank * local, (tp.rank + 1) * local)
        qkv_w = full[p + "qkv.w"].view(3, h, h)[:, rows, :].reshape(3 * local, h)
        qkv_b = full[p + "qkv.b"].view(3, h)[:, rows].reshape(3 * local)
        f_local = shape.ffn_hidden_size // tp.size
        cols = slice(tp.rank * f_local, (tp.rank + 1) * f_local)
        self.ln1 = nn.LayerNorm(h)
        self.ln2 = nn.LayerNorm(h)
        with torch.no_grad():
            self.ln1.weight.copy_(full[p + "ln1.w"])
            self.ln1.bias.copy_(full[p + "ln1.b"])
            self.ln2.weight.copy_(full[p + "ln2.w"])
            self.ln2.bias.copy_(full[p + "ln2.b"])
        self.qkv_w = nn.Parameter(qkv_w.clone())
        self.qkv_b = nn.Parameter(qkv_b.clone())
        self.proj_w = nn.Parameter(full[p + "proj.w"][:, rows].clone())
        self.proj_b = nn.Parameter(full[p + "proj.b"].clone())
        self.fc1_w = nn.Parameter(full[p + "fc1.w"][cols, :].clone())
        self.fc1_b = nn.Parameter(full[p + "fc1.b"][cols].clone())
        self.fc2_w = nn.Parameter(full[p + "fc2.w"][:, cols].clone())
        self.fc2_b = nn.Parameter(full[p + "fc2.b"].clone())

    def _enter(self, x: Tensor) -> Tensor:
        if self.tp.size > 1 and self.tp.group is not None:
            out: Tensor = _CopyToTensorParallel.apply(x, self.tp.group)  # type: ignore[no-untyped-call]
            return out
        return x

    def _leave(self, x: Tensor) -> Tensor:
        """Without a group (profiling one rank's shard on its own) the collective is
        skipped: the shapes and the compute are this rank's, the communication is not."""
        if self.tp.size > 1 and self.tp.group is not None:
            out: Tensor = _ReduceFromTensorParallel.apply(x, self.tp.group)  # type: ignore[no-untyped-call]
            return out
        return x

    def forward(self, x: Tensor) -> Tensor:
        b, s, _ = x.shape
        h = self._enter(self.ln1(x))
        qkv = F.linear(h, self.qkv_w, self.qkv_b).view(b, s, 3, self.local_heads, self.head_dim)
        q, k, v = qkv.unbind(dim=2)
        attn = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        attn = attn.transpose(1, 2).reshape(b, s, self.local_heads * self.head_dim)
        x = x + self._leave(F.linear(attn, self.proj_w)) + self.proj_b
        h = self._enter(self.ln2(x))
        h = F.gelu(F.linear(h, self.fc1_w, self.fc1_b))
        return x + self._leave(F.linear(h, self.fc2_w)) + self.fc2_b


class Stage(nn.Module):
    """Layers [first, last) of the model; the first stage embeds tokens, the last one ends
    in the head and returns the mean cross-entropy of its micro-batch."""

    def __init__(
        self,
        shape: GPTShape,
        full: dict[str, Tensor],
        layers: Sequence[int],
        *,
        embed: bool,
        head: bool,
        tp: TensorParallel,
    ) -> None:
        super().__init__()
        self.shape = shape
        self.has_embedding = embed
        self.has_head = head
        self.blocks = nn.ModuleList(Block(shape, full, i, tp) for i in layers)
        if embed:
            self.tok = nn.Parameter(full["embed.tok"].clone())
            self.pos = nn.Parameter(full["embed.pos"].clone())
        if head:
            self.ln_f = nn.LayerNorm(shape.hidden_size)
            with torch.no_grad():
                self.ln_f.weight.copy_(full["head.ln.w"])
                self.ln_f.bias.copy_(full["head.ln.b"])
            self.out_w = nn.Parameter(full["head.out.w"].clone())

    def forward(self, x: Tensor, targets: Tensor | None = None) -> Tensor:
        if self.has_embedding:
            x = F.embedding(x, self.tok) + self.pos[: x.shape[1]]
        for block in self.blocks:
            x = block(x)
        if not self.has_head:
            return x
        logits = F.linear(self.ln_f(x), self.out_w)
        if targets is None:
            raise ValueError("the last stage needs targets to compute the loss")
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def build_stage(
    shape: GPTShape,
    full: dict[str, Tensor],
    first_layer: int,
    end_layer: int,
    *,
    embed: bool,
    head: bool,
    tp: TensorParallel | None = None,
) -> Stage:
    """The stage holding layers [first_layer, end_layer)."""
    return Stage(
        shape,
        full,
        range(first_layer, end_layer),
        embed=embed,
        head=head,
        tp=tp or TensorParallel(),
    )
