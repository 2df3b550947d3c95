"""The training data a rank reads: deterministic token batches, so every rank and the
single-process reference agree on every sample without a data loader."""

from __future__ import annotations

from functools import lru_cache

import torch
from torch import Tensor

from executor.dropout import DropoutKey
from planner.launch import ExecutorConfig

__all__ = ["MicroBatch", "global_batch", "microbatch"]


@lru_cache(maxsize=4)
def _tokens(seed: int, step: int, rows: int, seq: int, vocab: int) -> Tensor:
    gen = torch.Generator().manual_seed(seed * 7919 + step)
    return torch.randint(0, vocab, (rows, seq + 1), generator=gen)


def global_batch(config: ExecutorConfig, step: int) -> tuple[Tensor, Tensor]:
    """Inputs and targets (batch, sequence) of every replica's micro-batches of one step."""
    rows = config.parallel.d * config.num_microbatches * config.micro_batch_size
    model = config.model
    tokens = _tokens(config.seed, step, rows, model.seq_length, model.vocab_size)
    return tokens[:, :-1], tokens[:, 1:]


class MicroBatch:
    """Micro-batch ``index`` of replica ``dp`` in a run starting at ``first_step``: a run that
    covers several batches without a flush numbers micro-batches across them (batch b holds
    b*m .. b*m + m - 1), and batch b is step ``first_step + b``."""

    def __init__(self, config: ExecutorConfig, dp: int, first_step: int, index: int) -> None:
        m, size = config.num_microbatches, config.micro_batch_size
        batch, local = divmod(index, m)
        self.step = first_step + batch
        start = (dp * m + local) * size
        self.rows = slice(start, start + size)
        self.config = config

    @property
    def key(self) -> DropoutKey:
        return DropoutKey(self.config.seed, self.step, self.rows.start)

    def inputs(self) -> Tensor:
        # A copy with its own storage, as a data loader gives (the embedding saves it).
        return global_batch(self.config, self.step)[0][self.rows].clone()

    def targets(self) -> Tensor:
        return global_batch(self.config, self.step)[1][self.rows].clone()


def microbatch(config: ExecutorConfig, dp: int, first_step: int, index: int) -> MicroBatch:
    return MicroBatch(config, dp, first_step, index)
