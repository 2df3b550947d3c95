"""The stages of one candidate: the request's shared context (profiles and caches), how
layers split over stages, and each stage's per-micro-batch durations, saved-activation bytes
and parameters (:func:`stage_costs`), from the layer model (:mod:`planner.costmodel.timing`)
and Korthikanti et al.'s memory formulas (:mod:`planner.costmodel.memory`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import TypeVar

from planner.costmodel.memory import (
    activation_bytes_per_layer,
    embedding_activation_bytes,
    embedding_parameters,
    layer_parameters_per_rank,
    output_activation_bytes,
    output_parameters,
    recompute_working_bytes,
)
from planner.costmodel.shapes import chunk_parameters
from planner.costmodel.timing import (
    EndStageTimes,
    LayerTimes,
    end_stage_times,
    layer_collective_seconds,
    layer_times,
    p2p_bytes,
)
from planner.placement import Assignment, Placement, context_groups_within_nodes, pair_order, place
from planner.profiles import HardwareProfile, LayerPoint, Link, ProfileStore
from planner.schedules import schedule_family
from planner.specs import CandidateConfig, PlanRequest, Recompute

__all__ = [
    "PlacementKey",
    "PlanContext",
    "StageCosts",
    "num_stages",
    "placement_for",
    "placement_key",
    "split_layers",
    "stage_costs",
]

K = TypeVar("K")
V = TypeVar("V")

# (t, p, d, schedule): what a placement depends on. Not the chunks per device: a looped
# placement's hops are device r to r + 1 and p - 1 to 0 for every v >= 2, and BPipe's pairs
# are devices, so one placement serves every v of a (t, p, d, schedule).
PlacementKey = tuple[int, int, int, str]
# (micro-batch size, t, cp, recompute, layers per stage, recompute split per stage or None):
# what a candidate's per-stage times and sizes depend on (see ``_stage_rows``).
_StagesKey = tuple[
    int, int, int, str, tuple[int, ...], tuple[tuple[tuple[str, int], ...], ...] | None
]


def num_stages(schedule: str, p: int, num_chunks: int | None = None) -> int:
    """Pipeline stages of ``schedule`` on p devices (its registry entry's placement), with
    ``num_chunks`` stages a device for a family that takes that parameter (None: its
    default)."""
    return schedule_family(schedule).num_stages(p, chunk_parameters(num_chunks))


def placement_key(config: CandidateConfig) -> PlacementKey:
    """What an optimized placement of ``config`` is kept under (see :func:`placement_for`)."""
    return (config.t, config.p, config.d, config.schedule)


def split_layers(num_layers: int, stages: int) -> list[int] | None:
    """Spread layers over stages as evenly as possible; when they do not divide, the first
    and last stages get fewer (they also run the embedding and the output layer, as the
    V-shape paper arranges, §4.1). None when a middle stage would get no layer."""
    counts = _split_layers(num_layers, stages)
    return None if counts is None else list(counts)


@lru_cache(maxsize=1024)
def _split_layers(num_layers: int, stages: int) -> tuple[int, ...] | None:
    if stages > num_layers + 2:
        # Some middle stage would get no layer: said before building a split of that many
        # stages (a request's chunks per device can make it millions).
        return None
    base, extra = divmod(num_layers, stages)
    if extra == 0:
        return (base,) * stages
    # ``stages - extra`` stages get ``base``: the first and last first, then from the ends in
    # (the same 0, n-1, 1, n-2, ... order that pairs BPipe's stages).
    light = stages - extra
    counts = [base + 1] * stages
    for stage in pair_order(stages)[:light]:
        counts[stage] = base
    if base == 0 and any(c == 0 for c in counts[1:-1]):
        return None
    return tuple(counts)


@dataclass(frozen=True)
class PlanContext:
    """Everything one request's pricing shares, with caches of what repeats.

    Frozen: a context never changes what it prices. ``placements`` holds the optimized
    placements (CP-SAT plans) by (t, p, d, schedule); :meth:`with_placements` returns a new
    context with more of them. The caches below are memos of pure functions of the request
    and hardware (layer times, end stages, collectives), independent of placement, so
    contexts derived from one another share them."""

    request: PlanRequest
    hardware: HardwareProfile
    points: list[LayerPoint]
    placements: Mapping[PlacementKey, Placement] = field(default_factory=dict)
    _layers: dict[tuple[int, int, str, int], LayerTimes] = field(default_factory=dict)
    _ends: dict[tuple[int, int, int], EndStageTimes] = field(default_factory=dict)
    _collectives: dict[tuple[int, int, str, int], float] = field(default_factory=dict)
    _stages: dict[_StagesKey, _StageRows] = field(default_factory=dict)

    @classmethod
    def from_store(cls, request: PlanRequest, store: ProfileStore) -> PlanContext:
        """The context of ``request`` with the hardware and layer points ``store`` holds."""
        hardware = store.hardware(request.cluster.gpu)
        return cls(request, hardware, list(store.layer_points(hardware.name)))

    def with_placements(self, placements: Mapping[PlacementKey, Placement]) -> PlanContext:
        """This context with ``placements`` added (replacing those of the same key)."""
        return replace(self, placements={**self.placements, **placements})

    def ring_link(self, t: int, cp: int) -> Link | None:
        """The link of the context-parallel K/V ring: inside a node when the placement keeps
        each t x cp group on one (Megatron's rank order, tensor then context fastest), else
        the network; None without context parallelism."""
        if cp == 1:
            return None
        inside = context_groups_within_nodes(t, cp, self.request.cluster.gpus_per_node)
        return _link(self.hardware, inside)

    def layer(self, micro_batch: int, t: int, recompute: Recompute, cp: int = 1) -> LayerTimes:
        """One layer's F, B, W on one tensor (and context) rank (measured point or model)."""
        r = self.request
        return _cached(
            self._layers,
            (micro_batch, t, recompute, cp),
            lambda: layer_times(
                self.points,
                self.hardware,
                r.model,
                r.training,
                micro_batch,
                t,
                recompute,
                cp,
                self.ring_link(t, cp),
            ),
        )

    def end_stages(self, micro_batch: int, t: int, cp: int = 1) -> EndStageTimes:
        """Embedding and output-layer times of this request's model."""
        r = self.request
        return _cached(
            self._ends,
            (micro_batch, t, cp),
            lambda: end_stage_times(self.hardware, r.model, r.training, micro_batch, t, cp),
        )

    def layer_collectives(
        self, micro_batch: int, t: int, recompute: Recompute, cp: int = 1
    ) -> float:
        """Tensor-parallel collectives inside one layer's F + B (and the context-parallel
        ring's exposed transfers)."""
        r = self.request
        return _cached(
            self._collectives,
            (micro_batch, t, recompute, cp),
            lambda: layer_collective_seconds(
                self.hardware,
                r.model,
                r.training,
                micro_batch,
                t,
                recompute,
                cp,
                self.ring_link(t, cp),
            ),
        )


def _cached(cache: dict[K, V], key: K, compute: Callable[[], V]) -> V:
    found = cache.get(key)
    if found is None:
        found = cache[key] = compute()
    return found


@dataclass(frozen=True)
class StageCosts:
    """Per stage, per micro-batch, on one tensor-parallel rank. The per-stage values are
    tuples: candidates with the same stages share them."""

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    weight: tuple[float, ...]
    activation_bytes: tuple[float, ...]
    parameters: tuple[float, ...]
    tp_comm: tuple[float, ...]  # tensor-parallel collectives inside forward + backward
    p2p_s: float  # one activation/gradient hop between stages (slowest link in the pipeline)
    transfer_s: float  # one BPipe EVICT or LOAD of one stage's micro-batch
    working_bytes: tuple[float, ...]  # per stage: transient bytes of a recomputed layer in B
    layer: LayerTimes
    placement: Placement  # the placement the hops and the BPipe pair link were priced with
    work: tuple[float, ...]  # per stage: forward + backward + weight, added in that order


def placement_for(
    config: CandidateConfig,
    gpus_per_node: int,
    overrides: Mapping[PlacementKey, Placement] | None = None,
) -> Placement:
    """An optimized placement when one was computed for this (t, p, d, schedule) (CP-SAT
    plans), else BPipe's pair-adjacent assignment (§3.5) for BPipe and Megatron's for the
    rest. With context parallelism each t x cp group is placed as one tensor group would be
    (Megatron's order: tensor ranks, then context ranks, fastest), so it stays inside a node
    whenever t x cp divides the GPUs per node."""
    if overrides and config.cp == 1:
        found = overrides.get(placement_key(config))
        if found is not None:
            return found
    transfers = schedule_family(config.schedule).transfers
    assignment: Assignment = "pair-adjacent" if transfers else "standard"
    return place(config.t * config.cp, config.p, config.d, gpus_per_node, assignment)


def _link(hw: HardwareProfile, same_node: bool) -> Link:
    return hw.intra_node if same_node else hw.inter_node


@dataclass(frozen=True)
class _StageRows:
    """What :class:`StageCosts` holds that does not depend on the placement: per stage, F,
    B, W, saved bytes, parameters, TP collectives and recompute working set (the end
    stages' included), and the layer probed for the candidate's recompute mode. Schedules
    with the same number of stages share them at every search point."""

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    weight: tuple[float, ...]
    activation: tuple[float, ...]
    parameters: tuple[float, ...]
    tp_comm: tuple[float, ...]
    working: tuple[float, ...]
    layer: LayerTimes
    work: tuple[float, ...]  # F + B + W of each stage, which every estimate and lower bound reads


def stage_costs(ctx: PlanContext, config: CandidateConfig) -> StageCosts:
    """Durations and sizes of every stage of ``config`` (layers from
    ``config.layers_per_stage``, each with its recompute mode; the first stage adds the
    embedding, the last the output layer and loss)."""
    r = ctx.request
    mb, t, cp = config.micro_batch_size, config.t, config.cp
    split = config.recompute_per_stage
    key = (
        mb,
        t,
        cp,
        config.recompute,
        tuple(config.layers_per_stage),
        None if split is None else tuple(tuple(m.items()) for m in config.stage_modes()),
    )
    rows = ctx._stages.get(key)
    if rows is None:
        rows = ctx._stages[key] = _stage_rows(ctx, config)
    activation = rows.activation
    count = len(activation)
    placement = placement_for(config, r.cluster.gpus_per_node, ctx.placements)
    devices = config.p
    hop_bytes = p2p_bytes(r.model, r.training, mb, t, cp)
    crosses = _crosses_nodes(placement, config.schedule, config.num_chunks)
    hw = ctx.hardware
    worst = 0.0 if count == 1 else _link(hw, not crosses).seconds(hop_bytes)
    transfer = 0.0
    if schedule_family(config.schedule).transfers and devices >= 2:
        pair_link = _link(hw, placement.same_node(0, devices - 1))
        transfer = pair_link.seconds(max(activation[: max(1, devices // 2)]))
    # The rows are shared by every candidate of the same stages, as they are: immutable.
    return StageCosts(
        rows.forward,
        rows.backward,
        rows.weight,
        activation,
        rows.parameters,
        rows.tp_comm,
        worst,
        transfer,
        rows.working,
        rows.layer,
        placement,
        rows.work,
    )


def _stage_rows(ctx: PlanContext, config: CandidateConfig) -> _StageRows:
    """The placement-independent part of :func:`stage_costs` for ``config``."""
    r = ctx.request
    model, training = r.model, r.training
    mb, t, cp = config.micro_batch_size, config.t, config.cp
    modes = config.stage_modes()
    count = len(modes)
    per_layer_params = layer_parameters_per_rank(model, t)
    # Per layer of each mode: (F, B, W, saved bytes, TP collectives, recompute working set).
    per_mode: dict[Recompute, tuple[float, float, float, float, float, float]] = {}
    for stage_modes in modes:
        for mode in stage_modes:
            if mode not in per_mode:
                layer = ctx.layer(mb, t, mode, cp)
                measured = layer.activation_bytes
                per_mode[mode] = (
                    layer.forward,
                    layer.backward,
                    layer.weight,
                    measured
                    if measured is not None and cp == 1
                    else activation_bytes_per_layer(model, training, mb, t, mode, cp),
                    ctx.layer_collectives(mb, t, mode, cp),
                    recompute_working_bytes(model, training, mb, t, mode, cp),
                )
    forward, backward, weight, activation, params, tp_comm, working = [], [], [], [], [], [], []
    # Stages mostly repeat a few compositions (n layers of one mode): price each once.
    seen: dict[tuple[tuple[Recompute, int], ...], tuple[float, ...]] = {}
    for stage_modes in modes:
        composition = tuple(stage_modes.items())
        row = seen.get(composition)
        if row is None:
            f = b = w = act = comm = work = 0.0
            for mode, n in composition:
                lf, lb, lw, lact, lcomm, lwork = per_mode[mode]
                f += n * lf
                b += n * lb
                w += n * lw
                act += n * lact
                comm += n * lcomm
                work = max(work, lwork)
            row = seen[composition] = (f, b, w, act, comm, work)
        f, b, w, act, comm, work = row
        forward.append(f)
        backward.append(b)
        weight.append(w)
        activation.append(act)
        params.append(sum(stage_modes.values()) * per_layer_params)
        tp_comm.append(comm)
        working.append(work)
    # The embedding on the first stage; the final layer norm, output layer and loss on the
    # last (a one-stage pipeline has both).
    ends = ctx.end_stages(mb, t, cp)
    for stage, (f, b, w) in ((0, ends.first), (count - 1, ends.last)):
        forward[stage] += f
        backward[stage] += b
        weight[stage] += w
    probe = ctx.layer(mb, t, config.recompute, cp)
    activation[-1] += (
        probe.last_stage_extra_bytes
        if probe.last_stage_extra_bytes is not None and cp == 1
        else output_activation_bytes(model, training, mb, t, cp)
    )
    activation[0] += (
        probe.first_stage_extra_bytes
        if probe.first_stage_extra_bytes is not None and cp == 1
        else embedding_activation_bytes(model, training, mb, t, cp)
    )
    # On each tensor-parallel rank: its share of what Megatron-LM splits, the rest whole.
    params[0] += embedding_parameters(model, t)
    # The output layer: its own matrix, or a copy of the tied word embedding unless the last
    # stage is also the first; plus the final norm.
    params[-1] += output_parameters(model, count, t)
    stage_work = [f + b + w for f, b, w in zip(forward, backward, weight, strict=True)]
    return _StageRows(
        tuple(forward),
        tuple(backward),
        tuple(weight),
        tuple(activation),
        tuple(params),
        tuple(tp_comm),
        tuple(working),
        probe,
        tuple(stage_work),
    )


@lru_cache(maxsize=1024)
def _crosses_nodes(placement: Placement, schedule: str, num_chunks: int | None) -> bool:
    """Whether any hop between consecutive stages of the pipeline crosses a node boundary
    (the simulator takes one p2p time, so the slowest hop sets it)."""
    stage_device = schedule_family(schedule).stage_devices(
        placement.p, chunk_parameters(num_chunks)
    )
    return any(
        not placement.same_node(a, b)
        for a, b in zip(stage_device, stage_device[1:], strict=False)
        if a != b
    )
