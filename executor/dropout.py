"""Dropout whose masks are a function of (seed, step, sample, layer, site) only.

The executor's dropout draws each mask for the whole tensor the unsplit model would have (all
heads, the whole sequence) from a generator seeded by where it is used, and takes the slice
this rank holds. So a pipelined, tensor- and sequence-parallel run draws the same masks as the
single-process reference, and a recomputed layer (``torch.utils.checkpoint``) draws the same
masks again, whatever the global random state.

A mask is kept as a bool tensor (1 byte per element), as Megatron-LM keeps it and as
Korthikanti et al. count it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["DropoutKey", "Site", "dropout"]

_MASK64 = (1 << 64) - 1


class Site:
    """Where a dropout sits in the model."""

    EMBEDDING = 0
    ATTENTION = 1
    ATTENTION_OUTPUT = 2
    MLP_OUTPUT = 3


class DropoutKey(NamedTuple):
    """Identifies one micro-batch's forward: its masks depend on nothing else."""

    seed: int
    step: int
    first_row: int  # the micro-batch's first sample in the step's global batch

    def generator(self, layer: int, site: int) -> torch.Generator:
        value = 0x9E3779B97F4A7C15
        for part in (self.seed, self.step, self.first_row, layer + 1, site):
            value = ((value ^ (part & _MASK64)) * 0xBF58476D1CE4E5B9) & _MASK64
            value ^= value >> 31
        return torch.Generator().manual_seed(value & ((1 << 63) - 1))


def dropout(
    x: Tensor,
    p: float,
    key: DropoutKey,
    layer: int,
    site: int,
    full_shape: tuple[int, ...],
    part: tuple[slice, ...],
) -> Tensor:
    """``x`` with dropout ``p``: the mask for ``full_shape`` (the unsplit tensor), sliced by
    ``part`` to the piece ``x`` is."""
    if p == 0.0:
        return x
    whole = torch.rand(full_shape, generator=key.generator(layer, site)) >= p
    # A copy of the slice: a view would keep the whole mask alive for backward.
    mask = whole[part].clone() if part else whole
    return x * mask.to(x.device) * (1.0 / (1.0 - p))
