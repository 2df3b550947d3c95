"""Checkpoints with torch.distributed.checkpoint, and resuming from the newest complete one.

Every rank writes its stages' fp32 master weights and optimizer state (keys carry the rank's
coordinates, so no two ranks write the same key). A checkpoint is written into
``step_N.incomplete`` and renamed to ``step_N`` by rank 0 only after every rank has finished
writing: a job that dies while saving leaves no folder that looks complete, and the next start
removes the leftovers. The folder must be shared by all nodes (as DCP requires):
:func:`ranks_not_sharing` finds the ranks that do not see it before anything is written.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from executor.inputs import latest_step
from executor.interpreter import RankRunner

__all__ = [
    "latest_step",
    "load_checkpoint",
    "ranks_not_sharing",
    "remove_incomplete",
    "save_checkpoint",
]

_INCOMPLETE = ".incomplete"


def _state(runner: RankRunner) -> dict[str, torch.Tensor]:
    comm = runner.comm
    prefix = f"dp{comm.dp}.tp{comm.tp_rank}"
    state = {}
    for s, weights in runner.weights.items():
        for name, value in weights.state().items():
            state[f"{prefix}.stage{s}.{name}"] = value
    state[f"{prefix}.pp{comm.pp}.loss_scale"] = torch.tensor(runner.scaler.scale)
    return state


def save_checkpoint(runner: RankRunner, folder: Path, step: int) -> None:
    """Collective: every rank calls it after the same step."""
    staging = folder / f"step_{step}{_INCOMPLETE}"
    dcp_save(_state(runner), checkpoint_id=str(staging))
    dist.barrier()
    if dist.get_rank() == 0:
        staging.rename(folder / f"step_{step}")
    dist.barrier()


def ranks_not_sharing(folder: Path) -> list[int]:
    """Collective: the ranks that do not see a file rank 0 writes into ``folder``. On several
    nodes each with its own disk (or its own copy of the candidate's folder, which a relative
    folder is taken from), a rank's shards would land where rank 0, which marks a checkpoint
    complete, never looks, and a restart's nodes would disagree on the step to resume."""
    token = [uuid.uuid4().hex if dist.get_rank() == 0 else ""]
    dist.broadcast_object_list(token, src=0)
    probe = folder / f".stagewright-shared-{token[0]}"
    if dist.get_rank() == 0:
        probe.write_text("")
    dist.barrier()
    seen: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(seen, probe.exists())
    if dist.get_rank() == 0:  # every rank has looked: all_gather_object returned
        probe.unlink()
    return [rank for rank, found in enumerate(seen) if not found]


def remove_incomplete(folder: Path) -> None:
    """Delete checkpoints a failed job left half written (rank 0, before the run)."""
    if folder.is_dir():
        for child in folder.iterdir():
            if child.name.endswith(_INCOMPLETE):
                shutil.rmtree(child, ignore_errors=True)


def load_checkpoint(runner: RankRunner, folder: Path, step: int) -> None:
    state = {name: value.clone() for name, value in _state(runner).items()}
    dcp_load(state, checkpoint_id=str(folder / f"step_{step}"))
    comm = runner.comm
    prefix = f"dp{comm.dp}.tp{comm.tp_rank}"
    for s, weights in runner.weights.items():
        mine = f"{prefix}.stage{s}."
        weights.load_state(
            {k.removeprefix(mine): v for k, v in state.items() if k.startswith(mine)}
        )
    runner.scaler.scale = float(state[f"{prefix}.pp{comm.pp}.loss_scale"])
