"""Checkpoints with torch.distributed.checkpoint: every rank's weights (each weight version for
2BW) and optimizer state, one folder per step, and resume from the newest complete one."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed.checkpoint as dcp

if TYPE_CHECKING:
    from executor.runtime import Runtime

__all__ = ["latest_step", "load_checkpoint", "save_checkpoint"]

_STEP = re.compile(r"^step_(\d+)$")


def _state(runtime: Runtime) -> dict[str, torch.Tensor]:
    """Flat name -> tensor; names carry the rank's coordinates so that no two ranks write the
    same key (stages differ across pipeline ranks, slices across tensor ranks)."""
    prefix = f"dp{runtime.dp}.tp{runtime.tp_rank}"
    state: dict[str, torch.Tensor] = {}
    for s, versions in runtime.versions.items():
        for version, params in versions.items():
            for name, value in params.items():
                state[f"{prefix}.stage{s}.v{version}.{name}"] = value.detach()
        for name, value in runtime.optim_state[s].items():
            if isinstance(value, torch.Tensor):
                state[f"{prefix}.stage{s}.optim.{name}"] = value
            else:
                state[f"{prefix}.stage{s}.optim.{name}"] = torch.tensor(value)
    return state


def save_checkpoint(runtime: Runtime, folder: Path, step: int) -> None:
    """Collective: every rank calls it after the same step."""
    dcp.save(_state(runtime), checkpoint_id=str(folder / f"step_{step}"))


def latest_step(folder: Path) -> int | None:
    """The newest step whose checkpoint finished (DCP writes .metadata last)."""
    if not folder.is_dir():
        return None
    steps = [
        int(match.group(1))
        for child in folder.iterdir()
        if (match := _STEP.match(child.name)) and (child / ".metadata").exists()
    ]
    return max(steps, default=None)


def load_checkpoint(runtime: Runtime, folder: Path, step: int) -> None:
    state = {name: value.clone() for name, value in _state(runtime).items()}
    dcp.load(state, checkpoint_id=str(folder / f"step_{step}"))
    prefix = f"dp{runtime.dp}.tp{runtime.tp_rank}"
    with torch.no_grad():
        for s, versions in runtime.versions.items():
            for version, params in versions.items():
                for name, value in params.items():
                    value.copy_(state[f"{prefix}.stage{s}.v{version}.{name}"])
