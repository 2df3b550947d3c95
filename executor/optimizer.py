"""The optimizer and Megatron-LM's dynamic loss scaler, shared by the stages
(:mod:`executor.weights`) and the single-process reference (:mod:`executor.reference`), so
that both update weights the same way."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from planner.launch import ExecutorConfig

__all__ = ["LossScaler", "make_optimizer", "optimizer_slots"]


class LossScaler:
    """Megatron-LM's dynamic loss scale (fp16 only; a constant 1 otherwise)."""

    def __init__(self, config: ExecutorConfig) -> None:
        settings = config.optimizer
        self.enabled = config.training.precision == "fp16"
        self.scale = settings.initial_loss_scale if self.enabled else 1.0
        self.window = settings.loss_scale_window
        self.minimum = settings.min_loss_scale
        self._clean = 0

    def update(self, overflow: bool) -> None:
        if not self.enabled:
            return
        if overflow:
            self.scale = max(self.scale / 2, self.minimum)
            self._clean = 0
            return
        self._clean += 1
        if self._clean % self.window == 0:
            self.scale *= 2


def optimizer_slots(config: ExecutorConfig, param: Tensor) -> dict[str, Tensor]:
    """The per-parameter state torch.optim keeps for the config's optimizer."""
    if config.training.optimizer == "adam":
        return {
            "step": torch.tensor(0.0),
            "exp_avg": torch.zeros_like(param),
            "exp_avg_sq": torch.zeros_like(param),
        }
    return {"momentum_buffer": torch.zeros_like(param)}


def make_optimizer(
    config: ExecutorConfig, param: nn.Parameter | Sequence[nn.Parameter]
) -> torch.optim.Optimizer:
    """The config's optimizer (torch.optim) over one flat parameter, or over a module's
    parameters (both element-wise updates: the same numbers either way)."""
    params = [param] if isinstance(param, nn.Parameter) else list(param)
    settings = config.optimizer
    if config.training.optimizer == "adam":
        return torch.optim.Adam(
            params,
            lr=settings.lr,
            betas=(settings.adam_beta1, settings.adam_beta2),
            eps=settings.adam_eps,
            foreach=False,
        )
    return torch.optim.SGD(params, lr=settings.lr, momentum=settings.sgd_momentum, foreach=False)
