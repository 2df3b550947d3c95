"""A rank's communication: its process groups and the pipeline's point-to-point traffic.

Groups: the tensor-parallel group of this rank's (dp, pp) and the data-parallel group of its
(pp, tp), built in the same order on every rank (``new_group`` is collective). torch numbers
a group's members by global rank: a tensor group's ranks rise with tp (the config's
validation asks it), a data group's need not rise with dp (``dp_ranks`` is in the group's
order). Point-to-point transfers are asynchronous ``isend``/``irecv`` with one tag per (kind,
stage, micro-batch), so messages between the same two ranks can never be confused; bytes
sent are counted per peer.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from executor.tensor_parallel import TensorParallel
from planner.launch import ExecutorConfig
from planner.schedules import ActionKind

__all__ = ["Comm"]

_TAG = {
    ActionKind.SEND_F: 0,
    ActionKind.RECV_F: 0,
    ActionKind.SEND_B: 1,
    ActionKind.RECV_B: 1,
    ActionKind.EVICT: 2,
    ActionKind.LOAD: 3,
}


class Comm:
    """Process groups and tagged point-to-point transfers of one rank."""

    def __init__(self, config: ExecutorConfig, rank: int, timeout_s: float) -> None:
        self.config = config
        self.rank = rank
        self.dp, self.pp, self.tp_rank = config.coords_of(rank)
        self.num_stages = config.ir.num_stages
        timeout = timedelta(seconds=timeout_s)
        t, p, d = config.parallel.t, config.parallel.p, config.parallel.d
        tp_group = None
        self.dp_group: Any = None
        self.dp_ranks = [rank]
        for dp in range(d):
            for pp in range(p):
                ranks = [config.rank_of(dp, pp, tp) for tp in range(t)]
                group = dist.new_group(ranks, timeout=timeout) if t > 1 else None
                if rank in ranks:
                    tp_group = group
        for pp in range(p):
            for tp in range(t):
                ranks = [config.rank_of(dp, pp, tp) for dp in range(d)]
                group = dist.new_group(ranks, timeout=timeout) if d > 1 else None
                if rank in ranks:
                    # In the group's own order: torch numbers a group's members by global
                    # rank, which an optimized placement need not give in dp order, and the
                    # distributed optimizer's shard i is the one its collectives give
                    # member i.
                    self.dp_group, self.dp_ranks = group, sorted(ranks)
        self.tp = TensorParallel(t, self.tp_rank, tp_group, config.training.sequence_parallel)
        self.bytes_sent: dict[int, int] = defaultdict(int)

    def peer_rank(self, device: int) -> int:
        """The rank holding pipeline device ``device`` in this rank's replica and tensor slot."""
        return self.config.rank_of(self.dp, device, self.tp_rank)

    def tag(self, kind: ActionKind, stage: int, microbatch: int) -> int:
        return (microbatch * self.num_stages + stage) * 4 + _TAG[kind]

    def isend(self, tensor: Tensor, device: int, tag: int) -> Any:
        tensor = tensor.contiguous()
        dst = self.peer_rank(device)
        self.bytes_sent[dst] += tensor.numel() * tensor.element_size()
        return dist.isend(tensor, dst, tag=tag)

    def irecv(self, buffer: Tensor, device: int, tag: int) -> Any:
        return dist.irecv(buffer, self.peer_rank(device), tag=tag)

    def all_gather_object(self, value: object) -> list[Any]:
        out: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(out, value)
        return out

    @staticmethod
    def device() -> torch.device:
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")
