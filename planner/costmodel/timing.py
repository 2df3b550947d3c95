"""Time of one transformer layer's F, B and W, and of the communication around them.

Layer times come from the profile store when a measured point is near: same device, shape,
tensor-parallel degree and switches; the same sequence length and micro-batch size, or a
neighbour within a factor of two in FLOPs, scaled by the FLOP ratio (linear interpolation
when two points bracket the micro-batch size). A point measured without recomputation also
serves the other modes, adding the recomputed FLOPs at the point's own rate. Otherwise an
analytic roofline: FLOPs / (peak x efficiency), plus the tensor-parallel collectives.

The efficiency is the hardware profile's ``roofline_efficiency`` parameter (declared, with
its default of 0.606 and where that comes from, in :mod:`planner.costmodel.parameters`);
a calibrated profile carries its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.costmodel.flops import layer_pass_flops
from planner.costmodel.parameters import ROOFLINE_EFFICIENCY
from planner.profiles import HardwareProfile, LayerPoint, Link
from planner.specs import ModelSpec, Recompute, TrainingSpec

__all__ = [
    "LayerTimes",
    "layer_times",
    "p2p_bytes",
    "tensor_parallel_seconds",
]

_NEAR = 2.0  # a point is "near" when the FLOP ratio is within this factor


@dataclass(frozen=True)
class LayerTimes:
    """Seconds of one layer for one micro-batch on one tensor-parallel rank. ``backward`` is
    B (input gradient, recomputation included); ``weight`` is W."""

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

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.weight


def _element_bytes(training: TrainingSpec) -> int:
    return 4 if training.precision == "fp32" else 2


def tensor_parallel_seconds(
    model: ModelSpec, training: TrainingSpec, micro_batch: int, t: int, link: Link
) -> float:
    """Collectives of one layer's forward (the B pass repeats them): two all-reduces without
    sequence parallelism, two all-gathers and two reduce-scatters with it; either way four
    ring steps each moving (t - 1) / t of an s x b x h activation (Korthikanti et al. 2022,
    §4.2.2)."""
    if t == 1:
        return 0.0
    volume = model.seq_length * micro_batch * model.hidden_size * _element_bytes(training)
    return 4 * (link.latency_us * 1e-6 + (t - 1) / t * volume / (link.bandwidth_gbps * 1e9))


def p2p_bytes(model: ModelSpec, training: TrainingSpec, micro_batch: int, t: int) -> float:
    """Bytes one micro-batch sends between adjacent stages: an s x b x h activation, of which
    each tensor rank sends 1/t with sequence parallelism (Megatron's scatter/gather)."""
    volume = model.seq_length * micro_batch * model.hidden_size * _element_bytes(training)
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


def _point_times(
    point: LayerPoint, model: ModelSpec, recompute: Recompute
) -> tuple[float, float, float, float]:
    """(F, B, W seconds, forward FLOP rate) of a point, B/W split by FLOPs when fused, and
    recomputation re-priced for ``recompute`` at the point's own rate."""
    shape = model.model_copy(update={"seq_length": point.seq_length})
    f_flops, b_flops, w_flops = layer_pass_flops(
        shape,
        point.micro_batch_size,
        point.recompute,  # type: ignore[arg-type]
    )
    forward = point.forward_ms / 1e3
    if point.weight_ms is None:
        fused = point.backward_ms / 1e3
        backward = fused * b_flops / (b_flops + w_flops)
        weight = fused - backward
    else:
        backward, weight = point.backward_ms / 1e3, point.weight_ms / 1e3
    rate = f_flops / forward  # FLOP/s this point achieved
    if recompute != point.recompute:
        _, wanted_b, _ = layer_pass_flops(shape, point.micro_batch_size, recompute)
        backward += (wanted_b - b_flops) / rate
    return forward, backward, weight, rate


def layer_times(
    points: list[LayerPoint],
    hw: HardwareProfile,
    model: ModelSpec,
    training: TrainingSpec,
    micro_batch: int,
    t: int,
    recompute: Recompute,
) -> LayerTimes:
    """F, B, W of one layer (see the module docstring for how points are used)."""
    target = layer_pass_flops(model, micro_batch, recompute)
    usable = [p for p in points if _matches(p, model, training, t, hw)]
    exact_mode = [p for p in usable if p.recompute == recompute]
    pool = exact_mode or [p for p in usable if p.recompute == "none"]
    best: tuple[float, LayerTimes] | None = None
    for point in pool:
        forward, backward, weight, _ = _point_times(point, model, recompute)
        shape = model.model_copy(update={"seq_length": point.seq_length})
        have = layer_pass_flops(shape, point.micro_batch_size, recompute)
        ratio = target[0] / have[0]
        if not 1 / _NEAR <= ratio <= _NEAR:
            continue
        exact = (
            abs(ratio - 1) <= 1e-9
            and point.seq_length == model.seq_length
            and point.micro_batch_size == micro_batch
            and point.recompute == recompute
        )
        scaled = LayerTimes(
            forward * target[0] / have[0],
            backward * target[1] / have[1],
            weight * target[2] / have[2],
            f"profile ({point.source})"
            if abs(ratio - 1) <= 1e-9
            else f"profile ({point.source}), scaled by FLOPs x{ratio:.2f}",
            point.activation_bytes if exact else None,
            point.first_stage_extra_bytes if exact else None,
            point.last_stage_extra_bytes if exact else None,
        )
        # Prefer points of the same sequence length: the attention share of the time
        # changes with it, which the FLOP ratio only approximates.
        distance = abs(ratio - 1) + (0.0 if point.seq_length == model.seq_length else 1.0)
        if best is None or distance < best[0]:
            best = (distance, scaled)
    if best is not None and best[0] == 0.0:
        return best[1]  # a point of exactly this shape: used as measured
    bracket = _interpolate(pool, model, recompute, micro_batch)
    if bracket is not None:
        return bracket
    if best is not None:
        return best[1]
    return roofline_layer_times(hw, model, training, micro_batch, t, recompute)


def _interpolate(
    pool: list[LayerPoint], model: ModelSpec, recompute: Recompute, micro_batch: int
) -> LayerTimes | None:
    """Linear interpolation in micro-batch size between the two nearest points (same
    sequence length) that bracket it."""
    same_seq = [p for p in pool if p.seq_length == model.seq_length]
    below = [p for p in same_seq if p.micro_batch_size < micro_batch]
    above = [p for p in same_seq if p.micro_batch_size > micro_batch]
    if not below or not above:
        return None
    lo = max(below, key=lambda p: p.micro_batch_size)
    hi = min(above, key=lambda p: p.micro_batch_size)
    weight_hi = (micro_batch - lo.micro_batch_size) / (hi.micro_batch_size - lo.micro_batch_size)
    a = _point_times(lo, model, recompute)
    b = _point_times(hi, model, recompute)
    mixed = [x + (y - x) * weight_hi for x, y in zip(a[:3], b[:3], strict=True)]
    return LayerTimes(
        mixed[0],
        mixed[1],
        mixed[2],
        f"profile, interpolated between mb={lo.micro_batch_size} and mb={hi.micro_batch_size}",
    )


def roofline_layer_times(
    hw: HardwareProfile,
    model: ModelSpec,
    training: TrainingSpec,
    micro_batch: int,
    t: int,
    recompute: Recompute,
) -> LayerTimes:
    """FLOPs / (peak x the profile's roofline efficiency) per pass, plus tensor-parallel
    collectives in F and B (and again in B for a fully recomputed forward)."""
    efficiency = hw.parameter(ROOFLINE_EFFICIENCY.name)
    rate = hw.peak(training.precision) * efficiency
    f_flops, b_flops, w_flops = layer_pass_flops(model, micro_batch, recompute)
    comm = tensor_parallel_seconds(model, training, micro_batch, t, hw.intra_node)
    recompute_comm = comm if recompute == "full" else 0.0
    return LayerTimes(
        f_flops / t / rate + comm,
        b_flops / t / rate + comm + recompute_comm,
        w_flops / t / rate,
        f"roofline ({efficiency:.1%} of {hw.name} peak)",
    )
