"""The single-process reference a pipelined run is verified against.

Same model, same seed, same batch, fp32, no parallelism: the loss of the whole global batch
(mean over every replica's micro-batches of each micro-batch's mean cross-entropy) and the
gradient of every weight. Mapping the reference's full gradients onto a rank's stage uses the
model's own slicing: a stage built from the gradients instead of the weights holds exactly
the slices that rank's parameters hold.
"""

from __future__ import annotations

import torch
from torch import Tensor

from executor.model import TensorParallel, build_stage, init_full_weights
from executor.runtime import ExecConfig, batch_for, microbatch_rows

__all__ = ["local_view", "reference_2bw_weights", "reference_step"]


def _full_model(config: ExecConfig, weights: dict[str, Tensor]) -> torch.nn.Module:
    shape = config.shape
    return build_stage(shape, weights, 0, shape.num_layers, embed=True, head=True)


def _names(config: ExecConfig) -> dict[str, str]:
    """Reference module parameter name -> full weight key (whole model, t = 1)."""
    out = {
        "tok": "embed.tok",
        "pos": "embed.pos",
        "ln_f.weight": "head.ln.w",
        "ln_f.bias": "head.ln.b",
        "out_w": "head.out.w",
    }
    fields = {
        "qkv_w": "qkv.w",
        "qkv_b": "qkv.b",
        "proj_w": "proj.w",
        "proj_b": "proj.b",
        "fc1_w": "fc1.w",
        "fc1_b": "fc1.b",
        "fc2_w": "fc2.w",
        "fc2_b": "fc2.b",
        "ln1.weight": "ln1.w",
        "ln1.bias": "ln1.b",
        "ln2.weight": "ln2.w",
        "ln2.bias": "ln2.b",
    }
    for i in range(config.shape.num_layers):
        for local, key in fields.items():
            out[f"blocks.{i}.{local}"] = f"layers.{i}.{key}"
    return out


def _grads(
    config: ExecConfig, weights: dict[str, Tensor], batches: list[int], step: int
) -> tuple[list[float], dict[str, Tensor]]:
    """Per-micro-batch losses and full gradients of the mean loss over the given batches
    (batch indices within the step's schedule, all replicas)."""
    model = _full_model(config, weights)
    inputs, targets = batch_for(config, step)
    m = config.num_microbatches
    count = config.d * m * len(batches)
    losses = []
    for batch in batches:
        for dp in range(config.d):
            for k in range(m):
                rows = microbatch_rows(config, dp, batch * m + k)
                loss = model(inputs[rows], targets[rows])
                losses.append(float(loss.detach()))
                (loss / count).backward()
    names = _names(config)
    grads = {
        names[n]: (p.grad if p.grad is not None else torch.zeros_like(p)).detach()
        for n, p in model.named_parameters()
    }
    return losses, grads


def reference_step(config: ExecConfig, step: int = 0) -> tuple[list[float], dict[str, Tensor]]:
    """Losses (replica-major) and full-model gradients of one flushed step."""
    weights = init_full_weights(config.shape, config.seed)
    return _grads(config, weights, [0], step)


def reference_2bw_weights(config: ExecConfig, steps: int) -> dict[str, Tensor]:
    """Weights after ``steps`` runs of a 2BW schedule: within a run, batch b's gradient is
    taken at version max(b - 1, 0) and applied to the newest weights,
    W(t+1) = W(t) - lr grad(W(t-1)) (PipeDream-2BW §3.1), with the runtime's optimizer rule;
    each run starts from the previous run's newest weights."""
    current = init_full_weights(config.shape, config.seed)
    state: dict[str, dict[str, Tensor | int]] = {}
    for step in range(steps):
        versions = [current]
        for batch in range(config.schedule.num_batches):
            _, grads = _grads(config, versions[max(batch - 1, 0)], [batch], step)
            newest = versions[-1]
            versions.append({k: newest[k] - _update(config, state, k, grads[k]) for k in newest})
        current = versions[-1]
    return current


def _update(
    config: ExecConfig, state: dict[str, dict[str, Tensor | int]], key: str, grad: Tensor
) -> Tensor:
    if config.optimizer != "adam":
        return config.lr * grad
    entry = state.setdefault(
        key, {"m": torch.zeros_like(grad), "v": torch.zeros_like(grad), "t": 0}
    )
    b1, b2, eps = 0.9, 0.999, 1e-8
    entry["t"] = int(entry["t"]) + 1
    m = entry["m"] = b1 * entry["m"] + (1 - b1) * grad  # type: ignore[operator]
    v = entry["v"] = b2 * entry["v"] + (1 - b2) * grad * grad  # type: ignore[operator]
    t = int(entry["t"])
    return config.lr * (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + eps)  # type: ignore[no-any-return]


def local_view(
    config: ExecConfig, full: dict[str, Tensor], stage: int, tp: TensorParallel
) -> dict[str, Tensor]:
    """``full`` (gradients or weights of the whole model) as the given stage on the given
    tensor rank holds them, by parameter name."""
    first, end = config.stage_layers[stage]
    last = config.schedule.num_stages - 1
    complete = dict(init_full_weights(config.shape, config.seed))
    complete.update(full)
    module = build_stage(
        config.shape,
        complete,
        first,
        end,
        embed=stage == 0,
        head=stage == last,
        tp=TensorParallel(tp.size, tp.rank, None),
    )
    return {name: p.detach() for name, p in module.named_parameters()}
