"""A hardware profile resolved into what the kernel model prices with: its compute facts
(``HardwareProfile.compute``) and its free parameters (``HardwareProfile.parameter``)."""

from __future__ import annotations

from planner.costmodel.kernels import DeviceRates
from planner.costmodel.layer_ops import CollectiveCost
from planner.costmodel.parameters import (
    COLLECTIVE_EFFICIENCY,
    FLASH_EFFICIENCY,
    GEMM_EFFICIENCY,
    GEMM_PIPELINE_K,
    KERNEL_LAUNCH_US,
    MEMORY_EFFICIENCY,
)
from planner.profiles import HardwareProfile

__all__ = ["collective_cost", "device_rates"]


def device_rates(hw: HardwareProfile, precision: str) -> DeviceRates:
    """The kernel model's view of ``hw`` at ``precision`` (raises for a precision the device
    has no matrix units for)."""
    units = hw.compute
    return DeviceRates(
        peak_flops=hw.peak(precision),
        hbm_bytes_per_s=hw.memory_bandwidth_gbps * 1e9,
        element_bytes=4 if precision == "fp32" else 2,
        gemm_efficiency=hw.parameter(GEMM_EFFICIENCY.name),
        memory_efficiency=hw.parameter(MEMORY_EFFICIENCY.name),
        flash_efficiency=hw.parameter(FLASH_EFFICIENCY.name),
        launch_s=hw.parameter(KERNEL_LAUNCH_US.name) * 1e-6,
        sm_count=None if units is None else units.sm_count,
        l2_bytes_per_s=None
        if units is None or units.l2_bandwidth_gbps is None
        else units.l2_bandwidth_gbps * 1e9,
        tiles=() if units is None else units.gemm_tiles,
        pipeline_k=round(hw.parameter(GEMM_PIPELINE_K.name)),
    )


def collective_cost(hw: HardwareProfile) -> CollectiveCost:
    """Tensor-parallel rings run on the link inside a node."""
    return CollectiveCost(hw.intra_node, hw.parameter(COLLECTIVE_EFFICIENCY.name))
