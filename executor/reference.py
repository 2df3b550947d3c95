"""The single-process reference a pipelined run is verified against.

The same model, seed, batches and dropout masks, in the run's precision (bf16 and fp16
compute with gradients accumulated in fp32 over the micro-batches, and fp16's loss scale, as
the run does), on one process without any parallelism: per micro-batch losses and the
gradient of every weight of the whole model for one step (the mean loss over every replica's
micro-batches), and the weights a run's updates produce (with stale weights for a schedule
that updates that way). Mapping the reference's full tensors
onto a rank's stage uses the model's own slicing: a stage built from the gradients (or
weights) instead of the initial weights holds exactly the slices that rank's parameters hold.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import Tensor

from executor.data import MicroBatch
from executor.model import (
    COMPUTE_DTYPE,
    GPTShape,
    Stage,
    build_stage,
    init_full_weights,
    model_options,
)
from executor.optimizer import LossScaler, make_optimizer
from executor.tensor_parallel import TensorParallel
from planner.launch import ExecutorConfig

__all__ = ["local_view", "reference_gradients", "reference_run", "reference_weights"]

_FIELDS = {
    "qkv_w": "qkv.w",
    "qkv_b": "qkv.b",
    "proj_w": "proj.w",
    "proj_b": "proj.b",
    "fc1_w": "fc1.w",
    "fc1_b": "fc1.b",
    "fc2_w": "fc2.w",
    "fc2_b": "fc2.b",
    "ln1_w": "ln1.w",
    "ln1_b": "ln1.b",
    "ln2_w": "ln2.w",
    "ln2_b": "ln2.b",
}


def _full_model(config: ExecutorConfig, weights: dict[str, Tensor]) -> Stage:
    shape = GPTShape.of(config.model)
    options = model_options(config)  # the run's, so that both compute alike
    return build_stage(shape, weights, 0, shape.num_layers, embed=True, head=True, options=options)


def _weight_key(config: ExecutorConfig) -> dict[str, str]:
    """Reference module parameter name -> full weight key (whole model, t = 1)."""
    out = {
        "tok": "embed.tok",
        "pos": "embed.pos",
        "ln_f_w": "head.ln.w",
        "ln_f_b": "head.ln.b",
        "out_w": "head.out.w",
    }
    for i in range(config.model.num_layers):
        for local, key in _FIELDS.items():
            out[f"blocks.{i}.{local}"] = f"layers.{i}.{key}"
    return out


def _gradients(
    config: ExecutorConfig, weights: dict[str, Tensor], step: int
) -> tuple[list[float], dict[str, Tensor]]:
    """Per-micro-batch losses (replica-major) and full gradients of the step's mean loss."""
    model = _full_model(config, weights)
    m, d = config.num_microbatches, config.parallel.d
    scale = LossScaler(config).scale
    params = dict(model.named_parameters())
    total = {n: torch.zeros(p.shape) for n, p in params.items()}
    losses = []
    for dp, k in itertools.product(range(d), range(m)):  # replica-major
        batch = MicroBatch(config, dp, step, k)
        loss = model(batch.inputs(), batch.key, batch.targets())
        losses.append(float(loss.detach()))
        (loss * (scale / m)).backward()
        for n, p in params.items():  # accumulate in fp32, as the run does
            if p.grad is not None:
                total[n] += p.grad.float()
                p.grad = None
    names = _weight_key(config)
    return losses, {names[n]: g / (d * scale) for n, g in total.items()}


def reference_gradients(
    config: ExecutorConfig, step: int, weights: dict[str, Tensor]
) -> tuple[list[float], dict[str, Tensor]]:
    """Losses and full-model gradients of one flushed step from ``weights``."""
    return _gradients(config, weights, step)


def reference_weights(config: ExecutorConfig, segments: Sequence[int]) -> dict[str, Tensor]:
    """Weights after the given runs (see :func:`reference_run`)."""
    return reference_run(config, segments)[0]


def reference_run(
    config: ExecutorConfig, segments: Sequence[int]
) -> tuple[dict[str, Tensor], list[list[float]]]:
    """Weights after the given runs, from the initial weights, and every step's per
    micro-batch losses (replica-major). Within a run of n batches
    without a flush (a weight-versioned schedule, PipeDream-2BW §3.1), batch b's gradient is
    taken at version max(b - 1, 0) and applied to the newest weights,
    W(t+1) = W(t) - lr * grad(W(t-1)); each run starts from the previous run's newest weights
    (a flush between runs). ``segments`` lists the batches of each run, in order: runs of one
    batch are ordinary flushed steps, W(t+1) = W(t) - lr * grad(W(t)). The update is the
    run's optimizer (torch.optim) over the whole model. (fp16 steps the loss scaler skipped
    are not replayed.)"""
    dtype = COMPUTE_DTYPE[config.training.precision]
    # The master weights start from the compute-precision weights, as Megatron-LM's do.
    initial = init_full_weights(GPTShape.of(config.model), config.seed)
    current = {name: value.to(dtype).float() for name, value in initial.items()}
    names = list(current)
    flat = torch.nn.Parameter(torch.cat([current[n].reshape(-1) for n in names]))
    optimizer = make_optimizer(config, flat)
    step = 0
    losses: list[list[float]] = []
    for batches in segments:
        versions = [dict(current)]
        for b in range(batches):
            step_losses, grads = _gradients(config, versions[max(b - 1, 0)], step + b)
            losses.append(step_losses)
            flat.grad = torch.cat([grads[n].reshape(-1) for n in names])
            optimizer.step()
            # The run's forwards use the new master weights in its compute precision.
            compute = flat.detach().to(dtype).float().clone()
            versions.append(_unflatten(compute, current))
        current = versions[-1]
        step += batches
    # Each weight in a storage of its own: as views of one flat buffer, every one of them
    # would carry the whole buffer when pickled (rank 0 broadcasts these to every rank for
    # --verify: about 100 copies of the model, gigabytes for an 8-layer toy model).
    return {name: value.clone() for name, value in current.items()}, losses


def _unflatten(flat: Tensor, like: dict[str, Tensor]) -> dict[str, Tensor]:
    out = {}
    offset = 0
    for name, tensor in like.items():
        out[name] = flat[offset : offset + tensor.numel()].view_as(tensor)
        offset += tensor.numel()
    return out


def local_view(
    config: ExecutorConfig, full: dict[str, Tensor], stage: int, tp: TensorParallel
) -> dict[str, Tensor]:
    """``full`` (gradients or weights of the whole model) as the given stage on the given
    tensor rank holds them, by parameter name, in fp32."""
    spec = config.stages[stage]
    complete = dict(init_full_weights(GPTShape.of(config.model), config.seed))
    complete.update(full)
    module = build_stage(
        GPTShape.of(config.model),
        complete,
        spec.first_layer,
        spec.end_layer,
        embed=stage == 0,
        head=stage == len(config.stages) - 1,
        tp=TensorParallel(tp.size, tp.rank, None, tp.sequence_parallel),
    )
    return {name: p.detach() for name, p in module.named_parameters()}
