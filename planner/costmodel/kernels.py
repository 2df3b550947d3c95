"""Time of one kernel on one device: the building block of the shape-aware layer model.

Four kinds of kernel, each priced from the device's facts (its hardware profile's
``compute`` block: SM count, L2 bandwidth, GEMM tile shapes, all from datasheets) and a few
named efficiencies (free parameters a calibration may fit, :mod:`planner.costmodel.parameters`):

- **GEMM** (m x n x k, optionally batched): the output is cut into tiles (the shapes
  CUTLASS/cuBLAS use); tiles run in waves of one tile per SM, so a last wave that is only
  partly full costs a whole wave (wave quantization), and a tile that is partly outside the
  matrix costs a whole tile (tile quantization). A tile streams k in steps, after filling a
  pipeline of ``pipeline_k`` before the first multiply-accumulate: time per tile is
  (k + pipeline_k) x 2 x tile_m x tile_n / (per-SM peak x efficiency), which is the
  saturation curve of small k. A tile whose operands need more bytes per second than the
  SM's share of L2 bandwidth runs at that share instead (small tiles). The fastest tile
  shape is taken (cuBLAS's heuristics aim at the same). No GEMM runs faster than its
  operands can be read and its result written from HBM.
- **Memory-bound** element-wise kernels (layer norm, bias, GeLU, dropout, residual adds,
  softmax, the loss): bytes moved / (HBM bandwidth x achieved fraction).
- **Flash attention**: its FLOPs at the flash kernel's efficiency (causal attention skips
  the masked half of the blocks).
- Every kernel pays a launch overhead.

Without a ``compute`` block (the CPU profile) GEMMs are priced at the GEMM efficiency alone,
without quantization.

References: NVIDIA, "Matrix Multiplication Background User's Guide" (tile and wave
quantization); NVIDIA A100 Tensor Core GPU Architecture whitepaper (108 SMs, L2 read
bandwidth 5120 bytes/clock); CUTLASS's default A100 tile shapes (128x256, 256x128, 128x128,
64 x 128 ...).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

__all__ = [
    "DeviceRates",
    "gemm_seconds",
    "memory_seconds",
    "flash_attention_seconds",
]


@dataclass(frozen=True)
class DeviceRates:
    """Everything the kernel model needs about one device at one precision, resolved once
    (from the hardware profile and its parameters) per request.

    ``sm_count`` None: no tile/wave model (GEMMs at ``gemm_efficiency`` of peak)."""

    peak_flops: float  # dense matrix FLOP/s at the compute precision
    hbm_bytes_per_s: float  # datasheet memory bandwidth
    element_bytes: int  # bytes of one activation element (2 for bf16/fp16)
    gemm_efficiency: float  # share of peak a saturated tile's main loop sustains
    memory_efficiency: float  # share of HBM bandwidth element-wise kernels reach
    flash_efficiency: float  # share of peak the flash-attention kernel reaches
    launch_s: float  # fixed cost of one kernel
    sm_count: int | None = None
    l2_bytes_per_s: float | None = None
    tiles: tuple[tuple[int, int], ...] = ()
    pipeline_k: int = 0

    @property
    def achieved_hbm(self) -> float:
        return self.hbm_bytes_per_s * self.memory_efficiency


def gemm_seconds(
    rates: DeviceRates,
    m: int,
    n: int,
    k: int,
    batch: int = 1,
    output_bytes: float | None = None,
) -> float:
    """One (batched) GEMM C[m, n] = A[m, k] B[k, n], ``batch`` times in one kernel.
    ``output_bytes`` per element of C read and written (default: written once at the
    element size; a weight gradient accumulated into an fp32 buffer reads and writes 4 + 4)."""
    if m <= 0 or n <= 0 or k <= 0 or batch <= 0:
        return 0.0
    flops = 2.0 * m * n * k * batch
    out_bytes = rates.element_bytes if output_bytes is None else output_bytes
    traffic = batch * (rates.element_bytes * (m * k + k * n) + out_bytes * m * n)
    floor = traffic / rates.achieved_hbm
    if rates.sm_count is None or not rates.tiles:
        compute = flops / (rates.peak_flops * rates.gemm_efficiency)
        return max(compute, floor) + rates.launch_s
    return max(_fastest_tiling(rates, m, n, k, batch), floor) + rates.launch_s


@lru_cache(maxsize=4096)
def _fastest_tiling(rates: DeviceRates, m: int, n: int, k: int, batch: int) -> float:
    """Seconds of the GEMM with its fastest tile shape. Memoized: a search prices each layer
    shape's kernels once, but many of its GEMMs recur across shapes (a recomputed forward's,
    the same micro-batch's under another recompute mode): about 190 distinct among 940 in
    the 1,024-GPU example."""
    return min(_tiled_seconds(rates, m, n, k, batch, tile) for tile in rates.tiles)


def _tiled_seconds(
    rates: DeviceRates, m: int, n: int, k: int, batch: int, tile: tuple[int, int]
) -> float:
    """Waves of tiles x time of one tile (see the module docstring)."""
    assert rates.sm_count is not None
    tile_m, tile_n = tile
    tiles = batch * math.ceil(m / tile_m) * math.ceil(n / tile_n)
    waves = math.ceil(tiles / rates.sm_count)
    per_sm = rates.peak_flops / rates.sm_count
    efficiency = rates.gemm_efficiency
    if rates.l2_bytes_per_s is not None:
        # Operand bytes per FLOP of a tile: each k step loads tile_m + tile_n elements for
        # 2 x tile_m x tile_n FLOPs.
        need = per_sm * efficiency * rates.element_bytes * (tile_m + tile_n) / (2 * tile_m * tile_n)
        share = rates.l2_bytes_per_s / rates.sm_count
        efficiency *= min(1.0, share / need)
    per_tile = 2.0 * tile_m * tile_n * (k + rates.pipeline_k) / (per_sm * efficiency)
    return waves * per_tile


def memory_seconds(rates: DeviceRates, num_bytes: float, kernels: int = 1) -> float:
    """``kernels`` element-wise kernels that move ``num_bytes`` in all."""
    if num_bytes <= 0:
        return 0.0
    return num_bytes / rates.achieved_hbm + kernels * rates.launch_s


def flash_attention_seconds(rates: DeviceRates, flops: float) -> float:
    """One flash-attention kernel doing ``flops`` (already halved for a causal mask)."""
    if flops <= 0:
        return 0.0
    return flops / (rates.peak_flops * rates.flash_efficiency) + rates.launch_s
