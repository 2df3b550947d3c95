"""Tensor and sequence parallelism: the collectives around Megatron-LM's parallel layers.

Narayanan et al. 2021 (tensor parallelism) and Korthikanti et al. 2022 (sequence
parallelism). Activations are laid out (sequence, batch, hidden) as in Megatron-LM, so a
sequence shard is a contiguous slice of dimension 0.

- Without sequence parallelism: ``copy_to`` (identity forward, all-reduce backward: Megatron's
  f) before a column-parallel linear, ``reduce_from`` (all-reduce forward: g) after a
  row-parallel one.
- With sequence parallelism the layer norms and dropouts run on this rank's 1/t of the
  sequence: :func:`gathered_linear` all-gathers the shard before a column-parallel linear and
  saves only the shard for backward (it gathers again there, so the layer keeps 2sbh/t
  instead of 2sbh: the point of Korthikanti et al. §4.2.2); ``reduce_scatter_to`` ends a
  row-parallel linear (reduce-scatter forward, all-gather backward); ``scatter_to`` takes
  this rank's shard of a replicated tensor (the embedding output) and ``gather_from`` undoes it.
- :func:`vocab_parallel_cross_entropy`: the loss over a vocabulary split across the group
  (Megatron-LM's ``_VocabParallelCrossEntropy``): it keeps the softmax of the local 1/t of
  the vocabulary in fp32, the 4sbV/t bytes Korthikanti et al. count for the loss.

torch 2.13's gloo backend has all-gather and reduce-scatter (``all_gather_single``,
``reduce_scatter_single``), so nothing is emulated on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "TensorParallel",
    "copy_to",
    "gathered_linear",
    "reduce_from",
    "reduce_scatter_to",
    "scatter_to",
    "vocab_parallel_cross_entropy",
]


@dataclass(frozen=True)
class TensorParallel:
    """This rank's place in its tensor-parallel group. ``group`` None with ``size`` > 1 is a
    shard measured on its own (profiling): the compute is this rank's, the collectives are
    skipped."""

    size: int = 1
    rank: int = 0
    group: Any = None
    sequence_parallel: bool = False

    @property
    def communicates(self) -> bool:
        return self.size > 1 and self.group is not None


def _gather(x: Tensor, tp: TensorParallel) -> Tensor:
    out = torch.empty((tp.size * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_single(out, x.contiguous(), group=tp.group)
    return out


def _reduce_scatter(x: Tensor, tp: TensorParallel) -> Tensor:
    out = torch.empty((x.shape[0] // tp.size, *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.reduce_scatter_single(out, x.contiguous(), group=tp.group)
    return out


def _shard(x: Tensor, tp: TensorParallel) -> Tensor:
    return x.chunk(tp.size, dim=0)[tp.rank].contiguous()


class _CopyTo(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, tp: TensorParallel) -> Tensor:
        ctx.tp = tp
        return x

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.tp.group)
        return grad, None


class _ReduceFrom(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, tp: TensorParallel) -> Tensor:
        x = x.clone()
        dist.all_reduce(x, group=tp.group)
        return x

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


class _ReduceScatterTo(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, tp: TensorParallel) -> Tensor:
        ctx.tp = tp
        return _reduce_scatter(x, tp)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return _gather(grad, ctx.tp), None


class _ScatterTo(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, tp: TensorParallel) -> Tensor:
        ctx.tp = tp
        return _shard(x, tp)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return _gather(grad, ctx.tp), None


class _GatheredLinear(torch.autograd.Function):
    """all-gather(x) @ w.T + b, saving the shard x (not the gathered input)."""

    @staticmethod
    def forward(
        ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None, tp: TensorParallel
    ) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.tp = tp
        ctx.has_bias = bias is not None
        return F.linear(_gather(x, tp), weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, Tensor | None, None]:
        x, weight = ctx.saved_tensors
        total = _gather(x, ctx.tp)
        grad_input = _reduce_scatter(grad.matmul(weight), ctx.tp)
        flat_grad = grad.reshape(-1, grad.shape[-1])
        grad_weight = flat_grad.t().matmul(total.reshape(-1, total.shape[-1]))
        grad_bias = flat_grad.sum(dim=0) if ctx.has_bias else None
        return grad_input, grad_weight, grad_bias, None


def _all_reduce(x: Tensor, tp: TensorParallel, op: Any = dist.ReduceOp.SUM) -> None:
    """All-reduce ``x`` in place over the group; nothing for a shard measured on its own."""
    if tp.communicates:
        dist.all_reduce(x, op=op, group=tp.group)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: Tensor, target: Tensor, tp: TensorParallel) -> Tensor:
        local = logits.shape[-1]
        low = tp.rank * local
        peak = logits.max(dim=-1).values
        _all_reduce(peak, tp, dist.ReduceOp.MAX)
        shifted = logits - peak.unsqueeze(-1)
        outside = (target < low) | (target >= low + local)
        index = (target - low).masked_fill(outside, 0)
        picked = shifted.gather(-1, index.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        _all_reduce(picked, tp)
        exp = shifted.exp()
        total = exp.sum(dim=-1)
        _all_reduce(total, tp)
        softmax = exp.div_(total.unsqueeze(-1))
        ctx.save_for_backward(softmax, outside, index)
        return total.log() - picked

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        softmax, outside, index = ctx.saved_tensors
        grad_logits = softmax.clone()
        hit = (~outside).to(grad_logits.dtype)
        grad_logits.scatter_add_(-1, index.unsqueeze(-1), -hit.unsqueeze(-1))
        return grad_logits * grad.unsqueeze(-1), None, None


def copy_to(x: Tensor, tp: TensorParallel) -> Tensor:
    """Megatron's f: identity forward, all-reduce of the gradient backward."""
    if not tp.communicates:
        return x
    out: Tensor = _CopyTo.apply(x, tp)  # type: ignore[no-untyped-call]
    return out


def reduce_from(x: Tensor, tp: TensorParallel) -> Tensor:
    """Megatron's g: all-reduce forward, identity backward."""
    if not tp.communicates:
        return x
    out: Tensor = _ReduceFrom.apply(x, tp)  # type: ignore[no-untyped-call]
    return out


def reduce_scatter_to(x: Tensor, tp: TensorParallel) -> Tensor:
    """End of a row-parallel linear with sequence parallelism: sum over the group, keep this
    rank's sequence shard."""
    if not tp.communicates:
        return _shard(x, tp) if tp.size > 1 else x
    out: Tensor = _ReduceScatterTo.apply(x, tp)  # type: ignore[no-untyped-call]
    return out


def scatter_to(x: Tensor, tp: TensorParallel) -> Tensor:
    """This rank's sequence shard of a tensor every rank holds whole."""
    if tp.size == 1:
        return x
    if not tp.communicates:
        return _shard(x, tp)
    out: Tensor = _ScatterTo.apply(x, tp)  # type: ignore[no-untyped-call]
    return out


def gathered_linear(x: Tensor, weight: Tensor, bias: Tensor | None, tp: TensorParallel) -> Tensor:
    """A column-parallel linear on a sequence-parallel input."""
    if not tp.communicates:
        full = torch.cat([x] * tp.size, dim=0) if tp.size > 1 else x
        return F.linear(full, weight, bias)
    out: Tensor = _GatheredLinear.apply(x, weight, bias, tp)  # type: ignore[no-untyped-call]
    return out


def vocab_parallel_cross_entropy(logits: Tensor, target: Tensor, tp: TensorParallel) -> Tensor:
    """Per-token cross-entropy of fp32 ``logits`` holding this rank's slice of the vocabulary
    (the whole vocabulary when the group has one rank). A shard measured on its own (t > 1
    without a group: profiling) runs the rank's own computation with the collectives
    skipped, so it keeps what a rank of the group keeps; its targets still index the whole
    vocabulary, which its slice alone cannot take."""
    if tp.size == 1:
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="none"
        ).view(target.shape)
    out: Tensor = _VocabParallelCrossEntropy.apply(logits, target, tp)  # type: ignore[no-untyped-call]
    return out
