"""A stage's weights: compute weights per version, fp32 master weights and gradients, the
optimizer step on them (the optimizer and loss scaler themselves: :mod:`executor.optimizer`).

Mixed precision as Megatron-LM does it: the forward and backward use weights in the compute
precision (bf16 or fp16); gradients accumulate in an fp32 buffer; the optimizer (``torch.optim``
Adam or SGD with momentum) updates an fp32 master copy, and the compute weights are copied
from it. In fp32 the compute weights are views of the master buffer (one copy, as the planner
prices it). fp16 adds Megatron's dynamic loss scaler: the loss is multiplied by the scale,
gradients are divided by it before the update, and a step whose gradients overflowed is
skipped on every stage with the scale halved (it doubles after ``loss_scale_window`` clean
steps).

Data parallelism: at the optimizer step the fp32 gradients are averaged over the replicas.
With the distributed optimizer (ZeRO-1, Megatron's distributed optimizer) each replica
reduce-scatters them, updates only its 1/d shard of the master weights (the optimizer's state
exists for that shard only) and all-gathers the updated shard. With sequence parallelism the
gradients of weights applied to a sequence shard (layer norms, the biases after the
reduce-scatter) are partial and are all-reduced over the tensor-parallel group first.

Weight versions (PipeDream-2BW §3.1): a stage keeps the compute weights of each version a
micro-batch in flight still uses. A forward runs on the version its ``VERSION`` switch named;
its backward uses the same tensors (its autograd graph holds them). An optimizer step turns
the batch's gradient, taken at the version that batch used, into an update of the newest
master weights, W(t+1) = W(t) - lr * grad(W(t-1)), and makes new compute tensors of the result:
a version is never modified in place while a micro-batch may still use it. (In fp32 a stage
with versions therefore keeps the master copy besides its two versions.)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.func import functional_call

from executor.model import Stage
from executor.optimizer import make_optimizer, optimizer_slots
from planner.launch import ExecutorConfig

__all__ = ["StageWeights"]


class StageWeights:
    """One stage's compute weights (per version), fp32 master weights and optimizer."""

    def __init__(
        self,
        module: Stage,
        config: ExecutorConfig,
        *,
        dp_group: Any,
        dp_ranks: list[int],
        rank: int,
        tp_group: Any,
        versioned: bool,
    ) -> None:
        self.module = module
        self.config = config
        self.dp_group, self.tp_group = dp_group, tp_group
        self.d = config.parallel.d
        named = dict(module.named_parameters())
        self.names = list(named)
        self.shapes = {name: p.shape for name, p in named.items()}
        sizes = [p.numel() for p in named.values()]
        bounds = [0]
        for size in sizes:
            bounds.append(bounds[-1] + size)
        self.slices = {
            name: slice(a, b) for name, a, b in zip(self.names, bounds, bounds[1:], strict=False)
        }
        self.master = torch.cat([p.detach().float().reshape(-1) for p in named.values()])
        self.grad = torch.zeros_like(self.master)
        self.shares_master = not versioned and next(iter(named.values())).dtype == torch.float32
        if self.shares_master:  # fp32 without versions: the module's weights ARE the master
            for name in self.names:
                _set_parameter(module, name, self._master_view(name))
        self.compute_dtype = next(iter(module.parameters())).dtype
        self.partial = [self.slices[n] for n in module.partial_gradient_names()]
        n = self.master.numel()
        sharded = config.training.distributed_optimizer and self.d > 1
        self.per_shard = -(-n // self.d) if sharded else n
        index = dp_ranks.index(rank) if sharded else 0
        self.shard = slice(min(n, index * self.per_shard), min(n, (index + 1) * self.per_shard))
        self.sharded = sharded
        self.shard_param = nn.Parameter(self.master[self.shard])  # shares the master's storage
        self.optimizer = make_optimizer(config, self.shard_param)
        self._own: dict[str, Tensor] = dict(module.named_parameters())
        self.versions: dict[int, dict[str, Tensor]] = {0: self._own}
        self.current = 0
        # fp32 weights accumulate their gradients straight into the fp32 buffer: each one's
        # ``.grad`` is a view of it, which autograd adds to in place (as torch's own
        # pipelining accumulates into ``.grad``); no copy per micro-batch. Lower precisions
        # accumulate in fp32 as Megatron's main_grad does, so their gradients are added.
        self._grad_ptrs: dict[str, int] = {}
        self._attach_gradient_buffer(self._own)
        # Only fp16 with its loss scaler acts on overflow; elsewhere nothing reads the check.
        self.check_finite = config.training.precision == "fp16"

    # ------------------------------------------------------------------ forward / backward
    def forward(self, *args: Any) -> Tensor:
        """The stage's forward on the current version's weights."""
        weights = self.versions[self.current]
        if weights is self._own:
            out: Tensor = self.module(*args)  # the module's own weights: no swap needed
            return out
        result: Tensor = functional_call(self.module, weights, args)
        return result

    def in_use(self) -> dict[str, Tensor]:
        """The weights a forward starting now uses (its backward must use the same)."""
        return self.versions[self.current]

    def collect_gradients(self, tensors: dict[str, Tensor]) -> None:
        """Move the gradients a backward left in ``tensors``' ``.grad`` into the fp32 buffer
        (those that are views of it already hold their share)."""
        for name, tensor in tensors.items():
            grad = tensor.grad
            if grad is not None and grad.data_ptr() != self._grad_ptrs.get(name):
                self.grad[self.slices[name]] += grad.reshape(-1)
                tensor.grad = None

    def _attach_gradient_buffer(self, tensors: dict[str, Tensor]) -> None:
        """Make fp32 ``tensors``' ``.grad`` views of the gradient buffer."""
        for name, tensor in tensors.items():
            if tensor.dtype == torch.float32:
                view = self.grad[self.slices[name]].view(self.shapes[name])
                tensor.grad = view
                self._grad_ptrs[name] = view.data_ptr()

    # ------------------------------------------------------------------ optimizer step
    def reduce_gradients(self, loss_scale: float) -> bool:
        """Average the accumulated gradients over tensor-parallel partial sums and data
        replicas, undo the loss scale; False when fp16 gradients overflowed (checked with
        fp16 only: no other precision acts on it)."""
        grad = self.grad
        if self.tp_group is not None:
            for part in self.partial:
                piece = grad[part].contiguous()
                dist.all_reduce(piece, group=self.tp_group)
                grad[part] = piece
        if self.d > 1:
            if self.sharded:
                padded = torch.zeros(self.per_shard * self.d)
                padded[: grad.numel()] = grad
                mine = torch.empty(self.per_shard)
                dist.reduce_scatter_single(mine, padded, group=self.dp_group)
                grad.zero_()
                grad[self.shard] = mine[: self.shard.stop - self.shard.start]
            else:
                dist.all_reduce(grad, group=self.dp_group)
            grad /= self.d
        if loss_scale != 1.0:
            grad /= loss_scale
        return not self.check_finite or bool(torch.isfinite(grad[self.shard]).all())

    def gradients_by_name(self) -> dict[str, Tensor]:
        """The reduced gradients by parameter name (with the distributed optimizer each
        replica holds only its shard, so the shards are gathered first: a collective)."""
        grad = self._gather_shards(self.grad) if self.sharded else self.grad
        return {n: grad[s].view(self.shapes[n]).clone() for n, s in self.slices.items()}

    def all_tensors(self) -> list[Tensor]:
        """Every weight tensor of every version (not activations, for the ledger)."""
        return [t for version in self.versions.values() for t in version.values()]

    def apply(self, *, skip: bool = False, new_version: int | None = None) -> None:
        """Update the master weights from the reduced gradients (unless ``skip``), share the
        updated shard with the other replicas, and refresh the compute weights: in place, or
        as the new weight version ``new_version``."""
        if not skip:
            self.shard_param.grad = self.grad[self.shard]
            self.optimizer.step()
            self.shard_param.grad = None
        self.grad.zero_()
        if self.sharded:
            with torch.no_grad():
                self.master.copy_(self._gather_shards(self.master))
        if new_version is not None:
            self._new_version(new_version)
        elif not self.shares_master:
            with torch.no_grad():
                for name, tensor in self.versions[0].items():
                    tensor.copy_(self._master_view(name))

    def _gather_shards(self, flat: Tensor) -> Tensor:
        """``flat`` with every replica's shard filled in from that replica."""
        local = torch.zeros(self.per_shard)
        local[: self.shard.stop - self.shard.start] = flat[self.shard]
        gathered = torch.empty(self.per_shard * self.d)
        dist.all_gather_single(gathered, local, group=self.dp_group)
        return gathered[: flat.numel()]

    def _new_version(self, version: int) -> None:
        fresh = {
            name: self._master_view(name).to(self.compute_dtype, copy=True).requires_grad_(True)
            for name in self.names
        }
        self.versions[version] = fresh
        self._attach_gradient_buffer(fresh)
        # A batch runs on the version before its own (batch b uses max(b - 1, 0)): once
        # version v exists, nothing older than v - 1 is used again.
        for old in [v for v in self.versions if v < version - 1]:
            del self.versions[old]

    def restart_versions(self) -> None:
        """After a flush (a segment of a versioned run ended): the newest weights become
        version 0."""
        newest = self.versions[max(self.versions)]
        self.versions = {0: newest}
        self.current = 0

    def newest(self) -> dict[str, Tensor]:
        return {n: t.detach() for n, t in self.versions[max(self.versions)].items()}

    def _master_view(self, name: str) -> Tensor:
        return self.master[self.slices[name]].view(self.shapes[name])

    # ------------------------------------------------------------------ checkpoints
    def state(self) -> dict[str, Tensor]:
        """Master weights and optimizer state, with the optimizer's slots present (zeros)
        before its first step, so that a checkpoint can be loaded into a fresh stage."""
        out = {"master": self.master}
        current = self.optimizer.state.get(self.shard_param, {})
        for key, empty in optimizer_slots(self.config, self.shard_param).items():
            value = current.get(key, empty)
            out[f"optim.{key}"] = value if isinstance(value, Tensor) else torch.tensor(value)
        return out

    def load_state(self, state: dict[str, Tensor]) -> None:
        with torch.no_grad():
            self.master.copy_(state["master"])
        slots = {k.removeprefix("optim."): v for k, v in state.items() if k.startswith("optim.")}
        if any(bool(v.any()) for v in slots.values()):
            self.optimizer.state[self.shard_param] = slots
        self.apply(skip=True)
        if self.versions.keys() != {0}:
            self.restart_versions()


def _set_parameter(module: nn.Module, name: str, value: Tensor) -> None:
    owner_path, _, attr = name.rpartition(".")
    owner = module.get_submodule(owner_path) if owner_path else module
    setattr(owner, attr, nn.Parameter(value))
