"""Time of one transformer layer's F, B and W, and of the communication around them.

Layer times come from the profile store when a measured point is near: same device, shape,
tensor-parallel degree and switches; the same sequence length and micro-batch size, or a
neighbour within a factor of two in FLOPs. A neighbour is scaled by the shape-aware model's
own ratio (model time of the wanted shape / model time of the point's shape, per pass), so
what the model knows about quantization and memory-bound work carries over, and the point
acts as a local calibration; two points that bracket the micro-batch size are interpolated
linearly. A point measured without recomputation also serves the other modes, through the
same ratio. Otherwise the shape-aware model itself (:mod:`planner.costmodel.layer_ops`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from planner.costmodel.device import collective_cost, device_rates
from planner.costmodel.flops import layer_pass_flops
from planner.costmodel.kernels import DeviceRates
from planner.costmodel.layer_ops import (
    CollectiveCost,
    Op,
    embedding_ops,
    layer_ops,
    output_ops,
    phase_seconds,
)
from planner.profiles import HardwareProfile, LayerPoint, Link
from planner.specs import ModelSpec, Recompute, TimeSource, TrainingSpec

__all__ = [
    "EndStageTimes",
    "LayerTimes",
    "MEASURED_ORIGINS",
    "TimeOrigin",
    "end_stage_times",
    "layer_collective_seconds",
    "layer_times",
    "modelled_layer_times",
    "time_provenance",
    "p2p_bytes",
]

_NEAR = 2.0  # a point is "near" when the FLOP ratio is within this factor

TimeOrigin = Literal["measured", "scaled measurement", "model"]
# The origins that rest on a measurement (a point of the shape, or a neighbour's scaled).
MEASURED_ORIGINS: frozenset[TimeOrigin] = frozenset({"measured", "scaled measurement"})


@dataclass(frozen=True)
class LayerTimes:
    """Seconds of one layer for one micro-batch on one tensor-parallel rank. ``backward`` is
    B (input gradient, recomputation included); ``weight`` is W. ``origin``: a measured
    point of exactly this shape, a measured point scaled or interpolated by the model, or
    the model alone; ``source`` says which point and how."""

    forward: float
    backward: float
    weight: float
    source: str
    # Measured bytes, when a profile point of exactly this shape has them: saved
    # activations of the layer, and what the embedding (first stage) and the head and loss
    # (last stage) save on top. None: the cost model uses Korthikanti et al.'s formulas.
    activation_bytes: float | None = None
    first_stage_extra_bytes: float | None = None
    last_stage_extra_bytes: float | None = None
    origin: TimeOrigin = "model"

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.weight


def _element_bytes(training: TrainingSpec) -> int:
    return 4 if training.precision == "fp32" else 2


def p2p_bytes(
    model: ModelSpec, training: TrainingSpec, micro_batch: int, t: int, cp: int = 1
) -> float:
    """Bytes one micro-batch sends between adjacent stages: an s x b x h activation, of which
    each tensor rank sends 1/t with sequence parallelism (Megatron's scatter/gather), and
    each context-parallel rank its s / cp tokens."""
    volume = model.seq_length // cp * micro_batch * model.hidden_size * _element_bytes(training)
    return volume / t if training.sequence_parallel and t > 1 else volume


def _compatible_precision(point: LayerPoint, training: TrainingSpec, hw: HardwareProfile) -> bool:
    if point.precision == training.precision:
        return True
    sixteen = {"bf16", "fp16"}
    return (
        point.precision in sixteen
        and training.precision in sixteen
        and hw.peak_flops.get("bf16") == hw.peak_flops.get("fp16")
    )


def _matches(
    point: LayerPoint, model: ModelSpec, training: TrainingSpec, t: int, hw: HardwareProfile
) -> bool:
    return (
        point.hidden_size == model.hidden_size
        and point.num_attention_heads == model.num_attention_heads
        and point.ffn_hidden_size == model.ffn
        and point.t == t
        and (t == 1 or point.sequence_parallel == training.sequence_parallel)
        and point.flash_attention == training.flash_attention
        and _compatible_precision(point, training, hw)
    )


def _measured_times(
    point: LayerPoint, at_point: tuple[float, float, float]
) -> tuple[float, float, float]:
    """(F, B, W) seconds of a point; a fused backward is split into B and W in the
    proportion the model gives for the point's own shape."""
    forward = point.forward_ms / 1e3
    if point.weight_ms is not None:
        return forward, point.backward_ms / 1e3, point.weight_ms / 1e3
    fused = point.backward_ms / 1e3
    model_b, model_w = at_point[1], at_point[2]
    backward = fused * model_b / (model_b + model_w) if model_b + model_w > 0 else fused
    return forward, backward, fused - backward


def _scaled_to(
    point: LayerPoint,
    hw: HardwareProfile,
    model: ModelSpec,
    training: TrainingSpec,
    t: int,
    target: tuple[float, float, float],
) -> tuple[float, float, float]:
    """A point's (F, B, W) carried to the wanted shape by the model's ratio, pass by pass."""
    shape = model.model_copy(update={"seq_length": point.seq_length})
    at_point = _model_seconds(
        hw,
        shape,
        training,
        point.micro_batch_size,
        t,
        point.recompute,  # type: ignore[arg-type]
    )
    measured = _measured_times(point, at_point)
    return tuple(  # type: ignore[return-value]
        x * want / have if have > 0 else x
        for x, want, have in zip(measured, target, at_point, strict=True)
    )


def layer_times(
    points: list[LayerPoint],
    hw: HardwareProfile,
    model: ModelSpec,
    training: TrainingSpec,
    micro_batch: int,
    t: int,
    recompute: Recompute,
    cp: int = 1,
    ring: Link | None = None,
) -> LayerTimes:
    """F, B, W of one layer (see the module docstring for how points are used); with context
    parallelism (cp > 1, ``ring`` its link) a measured point, taken without it, is carried to
    the rank's share by the model's ratio."""
    flops = layer_pass_flops(model, micro_batch, recompute, cp)[0]
    usable = [p for p in points if _matches(p, model, training, t, hw)]
    exact_mode = [p for p in usable if p.recompute == recompute]
    pool = exact_mode or [p for p in usable if p.recompute == "none"]
    near: list[tuple[float, LayerPoint]] = []
    for point in pool:
        shape = model.model_copy(update={"seq_length": point.seq_length})
        ratio = flops / layer_pass_flops(shape, point.micro_batch_size, recompute)[0]
        if not 1 / _NEAR <= ratio <= _NEAR:
            continue
        if (
            point.seq_length == model.seq_length
            and point.micro_batch_size == micro_batch
            and point.recompute == recompute
            and cp == 1
        ):
            return LayerTimes(  # a point of exactly this shape: used as measured
                *_measured_times(
                    point, _model_seconds(hw, model, training, micro_batch, t, recompute)
                ),
                f"profile ({point.source})",
                point.activation_bytes,
                point.first_stage_extra_bytes,
                point.last_stage_extra_bytes,
                origin="measured",
            )
        # Prefer points of the same sequence length, then the nearest in FLOPs.
        distance = abs(ratio - 1) + (0.0 if point.seq_length == model.seq_length else 1.0)
        near.append((distance, point))
    if not near:
        return modelled_layer_times(hw, model, training, micro_batch, t, recompute, cp, ring)
    target = _model_seconds(hw, model, training, micro_batch, t, recompute, cp, ring)
    same_seq = [p for _, p in near if p.seq_length == model.seq_length]
    below = [p for p in same_seq if p.micro_batch_size < micro_batch]
    above = [p for p in same_seq if p.micro_batch_size > micro_batch]
    if below and above:
        lo = max(below, key=lambda p: p.micro_batch_size)
        hi = min(above, key=lambda p: p.micro_batch_size)
        share = (micro_batch - lo.micro_batch_size) / (hi.micro_batch_size - lo.micro_batch_size)
        a = _scaled_to(lo, hw, model, training, t, target)
        b = _scaled_to(hi, hw, model, training, t, target)
        forward, backward, weight = (x + (y - x) * share for x, y in zip(a, b, strict=True))
        return LayerTimes(
            forward,
            backward,
            weight,
            f"profile, interpolated between mb={lo.micro_batch_size} and "
            f"mb={hi.micro_batch_size} (each scaled by the model)",
            origin="scaled measurement",
        )
    point = min(near, key=lambda item: item[0])[1]
    times = _scaled_to(point, hw, model, training, t, target)
    return LayerTimes(
        *times,
        f"profile ({point.source}), scaled by the model x{sum(times) / _point_total(point):.2f}",
        origin="scaled measurement",
    )


def _point_total(point: LayerPoint) -> float:
    return (point.forward_ms + point.backward_ms + (point.weight_ms or 0.0)) / 1e3


def _model_seconds(
    hw: HardwareProfile,
    model: ModelSpec,
    training: TrainingSpec,
    micro_batch: int,
    t: int,
    recompute: Recompute,
    cp: int = 1,
    ring: Link | None = None,
) -> tuple[float, float, float]:
    """(F, B, W) seconds of one layer by the shape-aware model."""
    rates = device_rates(hw, training.precision)
    ops = _layer_ops(
        rates, collective_cost(hw), model, training, micro_batch, t, recompute, cp, ring
    )
    return phase_seconds(ops)


@lru_cache(maxsize=4096)
def _layer_ops(
    rates: DeviceRates,
    collectives: CollectiveCost,
    model: ModelSpec,
    training: TrainingSpec,
    micro_batch: int,
    t: int,
    recompute: Recompute,
    cp: int,
    ring: Link | None,
) -> tuple[Op, ...]:
    """:func:`layer_ops`, memoized (the kernels are immutable): a layer's F, B, W and the
    collectives inside them are read from the same kernels, for every candidate of a search."""
    return layer_ops(rates, model, training, micro_batch, t, recompute, collectives, cp, ring)


def modelled_layer_times(
    hw: HardwareProfile,
    model: ModelSpec,
    training: TrainingSpec,
    micro_batch: int,
    t: int,
    recompute: Recompute,
    cp: int = 1,
    ring: Link | None = None,
) -> LayerTimes:
    """The shape-aware model's F, B, W of one layer (no measured point involved)."""
    forward, backward, weight = _model_seconds(
        hw, model, training, micro_batch, t, recompute, cp, ring
    )
    return LayerTimes(forward, backward, weight, f"shape-aware model ({hw.name})")


@dataclass(frozen=True)
class EndStageTimes:
    """(F, B, W) seconds the first stage adds for the embedding and the last stage for the
    final layer norm, the output layer and the loss, per micro-batch."""

    first: tuple[float, float, float]
    last: tuple[float, float, float]


def end_stage_times(
    hw: HardwareProfile,
    model: ModelSpec,
    training: TrainingSpec,
    micro_batch: int,
    t: int,
    cp: int = 1,
) -> EndStageTimes:
    """The shape-aware model's embedding and output-layer work (measured layer points do not
    include it: they time one transformer layer)."""
    rates = device_rates(hw, training.precision)
    collectives = collective_cost(hw)
    return EndStageTimes(
        phase_seconds(embedding_ops(rates, model, training, micro_batch, t, collectives, cp)),
        phase_seconds(output_ops(rates, model, training, micro_batch, t, collectives, cp)),
    )


def layer_collective_seconds(
    hw: HardwareProfile,
    model: ModelSpec,
    training: TrainingSpec,
    micro_batch: int,
    t: int,
    recompute: Recompute,
    cp: int = 1,
    ring: Link | None = None,
) -> float:
    """Tensor-parallel collectives inside one layer's F + B (recomputation included), and
    the context-parallel ring's exposed transfers."""
    rates = device_rates(hw, training.precision)
    ops = _layer_ops(
        rates, collective_cost(hw), model, training, micro_batch, t, recompute, cp, ring
    )
    return sum(op.seconds for op in ops if op.kind == "collective")


def time_provenance(layer: LayerTimes, hw: HardwareProfile) -> tuple[TimeSource, float | None]:
    """Where ``layer``'s times come from, and the fit error of that source on the runs the
    profile was calibrated with (None when unknown: no calibration, or a measured point)."""
    fitted = None if hw.calibration is None else hw.calibration.rms_log_error
    if layer.origin == "measured":
        return "measured point", None
    if layer.origin == "scaled measurement":
        return "scaled measurement", fitted
    if fitted is not None:
        return "calibrated model", fitted
    return "uncalibrated model", None
