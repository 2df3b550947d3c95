"""The kernel model (planner.costmodel.kernels) against hand computations: tile and wave
quantization on the SM count, the pipeline-fill saturation in k, the L2 feed of small tiles,
the HBM floor, memory-bound kernels, flash attention, the tensor-parallel ring."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from planner.costmodel.device import device_rates
from planner.costmodel.kernels import (
    DeviceRates,
    flash_attention_seconds,
    gemm_seconds,
    memory_seconds,
)
from planner.costmodel.layer_ops import CollectiveCost, ring_seconds
from planner.profiles import Link, default_store

PEAK = 312e12
HBM = 2039e9

# A100-like rates, one tile shape, no fill and no launch cost: each effect on its own.
PLAIN = DeviceRates(
    peak_flops=PEAK,
    hbm_bytes_per_s=HBM,
    element_bytes=2,
    gemm_efficiency=0.8,
    memory_efficiency=0.75,
    flash_efficiency=0.6,
    launch_s=0.0,
    sm_count=108,
    l2_bytes_per_s=None,
    tiles=((128, 128),),
    pipeline_k=0,
)
PER_SM = PEAK / 108


def tile_seconds(k: int, rates: DeviceRates = PLAIN, m: int = 128, n: int = 128) -> float:
    """One m x n tile over k (+ the pipeline fill) on one SM at the GEMM efficiency."""
    return 2 * m * n * (k + rates.pipeline_k) / (PER_SM * rates.gemm_efficiency)


def test_a_full_wave_costs_one_tile_time():
    # 12 x 9 = 108 tiles of 128 x 128: exactly one wave on 108 SMs.
    assert gemm_seconds(PLAIN, 12 * 128, 9 * 128, 4096) == pytest.approx(tile_seconds(4096))


def test_one_row_more_costs_a_second_wave():
    # 13 x 9 = 117 tiles: the last row of tiles is almost empty (tile quantization) and
    # needs a second wave of which only 9 of 108 SMs are busy (wave quantization).
    one = gemm_seconds(PLAIN, 12 * 128, 9 * 128, 4096)
    assert gemm_seconds(PLAIN, 12 * 128 + 1, 9 * 128, 4096) == pytest.approx(2 * one)


def test_batched_gemms_share_the_waves():
    # 27 small GEMMs of 2 x 2 tiles = 108 tiles: one wave (HBM made fast: these small
    # GEMMs are otherwise bound by their operands, see the HBM floor test).
    fast = replace(PLAIN, hbm_bytes_per_s=1e18)
    assert gemm_seconds(fast, 256, 256, 512, batch=27) == pytest.approx(tile_seconds(512))
    assert gemm_seconds(fast, 256, 256, 512, batch=28) == pytest.approx(2 * tile_seconds(512))
    operands = 27 * 2 * (256 * 512 * 2 + 256 * 256)
    assert gemm_seconds(PLAIN, 256, 256, 512, batch=27) == pytest.approx(operands / (HBM * 0.75))


def test_the_pipeline_fill_saturates_small_k():
    fill = replace(PLAIN, pipeline_k=192)
    got = gemm_seconds(fill, 12 * 128, 9 * 128, 64)
    assert got == pytest.approx(2 * 128 * 128 * (64 + 192) / (PER_SM * 0.8))
    # The same FLOPs at k = 64 cost 4x the per-FLOP time of a long k: (64 + 192) / 64.
    long_k = gemm_seconds(fill, 12 * 128, 9 * 128, 64 * 1000)
    assert got / 64 / (long_k / 64000) == pytest.approx((64 + 192) / 64 / ((64000 + 192) / 64000))


def test_a_small_tile_is_limited_by_its_share_of_l2():
    # A 64 x 64 tile needs (64 + 64) x 2 bytes per 2 x 64 x 64 FLOPs = 1/32 byte per FLOP;
    # at 80% of 2.89 TFLOP/s per SM that is 72.2 GB/s; give each SM 36.1 GB/s of L2.
    small = replace(PLAIN, tiles=((64, 64),))
    need = PER_SM * 0.8 / 32
    starved = replace(small, l2_bytes_per_s=108 * need / 2)
    fed = replace(small, l2_bytes_per_s=108 * need * 10)
    m, n, k = 64 * 12, 64 * 9, 4096
    assert gemm_seconds(fed, m, n, k) == pytest.approx(tile_seconds(k, small, 64, 64))
    assert gemm_seconds(starved, m, n, k) == pytest.approx(2 * tile_seconds(k, small, 64, 64))


def test_the_fastest_tile_shape_is_taken():
    both = replace(PLAIN, tiles=((256, 128), (128, 128)))
    # m = 384: 256-row tiles need 2 rows (a third of the second one empty), 128-row tiles 3.
    m, n, k = 384, 128 * 36, 2048
    big = math.ceil(384 / 256) * 36  # 72 tiles: one wave of 256 x 128 tiles
    small = 3 * 36  # 108 tiles: one wave of 128 x 128 tiles
    assert big <= 108 and small <= 108
    expected = min(tile_seconds(k, m=256), tile_seconds(k))
    assert gemm_seconds(both, m, n, k) == pytest.approx(expected)
    assert expected == pytest.approx(tile_seconds(k))  # the smaller tile wins here


def test_the_fastest_tiling_of_a_gemm_shape_is_found_once():
    from planner.costmodel.kernels import _fastest_tiling

    both = replace(PLAIN, tiles=((256, 128), (128, 128)), pipeline_k=7)
    m, n, k = 384, 128 * 36, 2048  # one wave either way, as above: the smaller tile wins
    first = _fastest_tiling(both, m, n, k, 1)
    assert first == pytest.approx(tile_seconds(k, both))
    before = _fastest_tiling.cache_info().hits
    assert _fastest_tiling(both, m, n, k, 1) == first
    assert _fastest_tiling.cache_info().hits == before + 1
    # Another shape of the same rates is its own entry. m = 640: 3 x 36 = 108 256-row tiles
    # (one wave) or 5 x 36 = 180 128-row tiles (two waves).
    assert _fastest_tiling(both, 640, n, k, 1) == pytest.approx(
        min(tile_seconds(k, both, m=256), 2 * tile_seconds(k, both))
    )


def test_a_gemm_is_never_faster_than_its_operands_from_hbm():
    # k = 8: 2 x (m k + k n) + 2 m n bytes dominate 2 m n k FLOPs.
    m = n = 8192
    k = 8
    floor = 2 * (m * k + k * n + m * n) / (HBM * 0.75)
    assert gemm_seconds(PLAIN, m, n, k) == pytest.approx(floor)
    # A weight gradient accumulated in fp32 reads and writes 4 + 4 bytes per output.
    fp32 = (2 * (m * k + k * n) + 8 * m * n) / (HBM * 0.75)
    assert gemm_seconds(PLAIN, m, n, k, output_bytes=8.0) == pytest.approx(fp32)


def test_without_device_facts_a_gemm_runs_at_the_gemm_efficiency():
    bare = replace(PLAIN, sm_count=None, tiles=())
    assert gemm_seconds(bare, 1000, 3000, 2000) == pytest.approx(
        2 * 1000 * 3000 * 2000 / (PEAK * 0.8)
    )


def test_every_kernel_pays_the_launch_overhead():
    slow = replace(PLAIN, launch_s=5e-6)
    assert gemm_seconds(slow, 1536, 1152, 4096) == pytest.approx(tile_seconds(4096) + 5e-6)
    assert memory_seconds(slow, 1e9, kernels=3) == pytest.approx(1e9 / (HBM * 0.75) + 15e-6)
    assert flash_attention_seconds(slow, 1e12) == pytest.approx(1e12 / (PEAK * 0.6) + 5e-6)
    assert memory_seconds(slow, 0) == 0.0
    assert gemm_seconds(slow, 0, 10, 10) == 0.0


def test_a_ring_moves_t_minus_1_over_t_of_the_tensor_in_t_minus_1_steps():
    cost = CollectiveCost(Link("nvlink3", 300, 3), 0.8)
    volume = 64e6
    expected = 7 * 3e-6 + 7 / 8 * volume / (300e9 * 0.8)
    assert ring_seconds(cost, volume, 8) == pytest.approx(expected)
    assert ring_seconds(cost, volume, 1) == 0.0


def test_device_rates_come_from_the_profile_facts_and_parameters():
    hw = default_store().hardware("a100-sxm-80g")
    tuned = hw.with_parameters({"gemm_efficiency": 0.7, "gemm_pipeline_k": 64})
    rates = device_rates(tuned, "bf16")
    assert rates.peak_flops == 312e12
    assert rates.sm_count == 108
    assert rates.l2_bytes_per_s == pytest.approx(7219e9)
    assert (256, 128) in rates.tiles
    assert rates.gemm_efficiency == 0.7
    assert rates.pipeline_k == 64
    assert device_rates(hw, "fp32").element_bytes == 4
    cpu = device_rates(default_store().hardware("cpu"), "fp32")
    assert cpu.sm_count is None and cpu.tiles == ()
