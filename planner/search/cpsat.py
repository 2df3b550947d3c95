"""CP-SAT refinement: layers per stage and recompute per stage for one coarse candidate.

The grid splits layers as evenly as it can and recomputes every layer alike. Real pipelines
are not alike: under 1F1B stage 0 holds p micro-batches while the last holds one, and the
first and last stages also run the embedding and the output layer. For one coarse candidate
(t, p, d, micro-batch size, schedule) this model chooses, per stage, how many layers it runs
and how many of them use each allowed recompute mode (Megatron's --recompute-num-layers
generalised per stage), such that every device fits in memory under its own in-flight
counts (the Pareto moments of the schedule's order, :mod:`planner.schedules._inflight`),
minimising the pipeline's time proxy (m - 1) x slowest device + sum over devices (1F1B's
makespan with unequal stages), stage times including the output layer and p2p.

Units are integers: microseconds and KiB, rounded from the cost model's per-layer values, so
a solution's claims are re-checked with the ordinary cost model (:func:`check`), which
shares nothing with the solver. The uniform grid split is given as a hint, so the solver
starts from it and never returns something worse by its own objective.

The builder is composed of one method per constraint or objective term; the solver always
runs with a time limit, a worker count and a seed. INFEASIBLE is a result, not an exception.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from planner.costmodel.evaluate import (
    PlanContext,
    counted_shape,
    device_memory,
    memory_allowance,
    stage_costs,
    stages_by_device,
)
from planner.costmodel.memory import (
    activation_bytes_per_layer,
    layer_parameters_per_rank,
    recompute_working_bytes,
    stored_bytes_per_parameter,
)
from planner.specs import CandidateConfig, Recompute, RecomputeSplit, SolverStatus

__all__ = ["RefineOptions", "Refinement", "check", "refine"]

_US = 1e6  # seconds -> integer microseconds
_KIB = 1024.0  # bytes -> integer KiB
_STATUS: dict[cp_model.CpSolverStatus, SolverStatus] = {
    cp_model.OPTIMAL: "optimal",
    cp_model.FEASIBLE: "feasible",
    cp_model.INFEASIBLE: "infeasible",
    cp_model.UNKNOWN: "timed out",
}


@dataclass(frozen=True)
class RefineOptions:
    """Solver settings: a time limit per model, workers (0 = all cores), a fixed seed."""

    time_limit_s: float = 2.0
    workers: int = 0
    seed: int = 0


@dataclass(frozen=True)
class Refinement:
    """What the solver found for one coarse candidate.

    ``status`` is optimal / feasible (a solution, optimality not proven) / timed out (the
    time limit hit: the best solution found, if any, is still returned) / infeasible.
    ``claimed_*`` are the solver's own numbers for its solution (device step-time proxy per
    micro-batch in seconds, memory per device in bytes), which :func:`check` re-prices."""

    status: SolverStatus
    config: CandidateConfig | None
    objective_s: float | None
    bound_s: float | None
    wall_s: float
    claimed_device_time_s: list[float] = field(default_factory=list)
    claimed_memory_bytes: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class _Data:
    """The coarse candidate's numbers, integer-scaled for the model."""

    stages: int
    devices: int
    microbatches: int
    num_layers: int
    modes: tuple[Recompute, ...]
    stage_devices: tuple[tuple[int, ...], ...]  # stages of each device
    layer_time: dict[Recompute, int]  # F + B + W of one layer, us
    layer_act: dict[Recompute, int]  # saved bytes of one layer, KiB
    layer_static: int  # weights + gradients + optimizer of one layer, KiB
    working: dict[Recompute, int]  # transient KiB of a recomputed layer in its backward
    extra_time: list[int]  # per stage: embedding/output work and p2p, us
    extra_act: list[int]  # per stage: output-layer activations, KiB
    extra_static: list[int]  # per stage: embedding parameters etc., KiB
    moments: list[list[dict[int, int]]]  # per device: peak candidates {stage: count}
    capacity: int  # KiB available to tensors (workspace and fragmentation taken off)
    workspace_bytes: float  # the profile's memory allowance (memory_allowance)
    fragmentation: float


def _data(
    ctx: PlanContext, coarse: CandidateConfig, modes: tuple[Recompute, ...], capacity: float
) -> _Data:
    r = ctx.request
    probe = coarse.model_copy(update={"recompute": modes[0], "recompute_per_stage": None})
    layer_time = {}
    layer_act = {}
    working = {}
    for mode in modes:
        costs = stage_costs(ctx, probe.model_copy(update={"recompute": mode}))
        layer = costs.layer
        layer_time[mode] = round(layer.total * _US)
        layer_act[mode] = round(
            activation_bytes_per_layer(
                r.model, r.training, coarse.micro_batch_size, coarse.t, mode, coarse.cp
            )
            / _KIB
        )
        working[mode] = round(
            recompute_working_bytes(
                r.model, r.training, coarse.micro_batch_size, coarse.t, mode, coarse.cp
            )
            / _KIB
        )
    # Per-stage extras: what a stage costs beyond its layers (output layer, embeddings).
    empty = probe.model_copy(update={"layers_per_stage": [0] * len(coarse.layers_per_stage)})
    base = stage_costs(ctx, empty)
    extra_time = [
        round((f + b + w) * _US) + round(2 * base.p2p_s * _US)
        for f, b, w in zip(base.forward, base.backward, base.weight, strict=True)
    ]
    extra_act = [round(a / _KIB) for a in base.activation_bytes]
    weight_b, grad_b, opt_b = stored_bytes_per_parameter(
        r.training, coarse.weight_replicas, coarse.schedule
    )
    per_param = weight_b + grad_b + opt_b
    layer_static = round(layer_parameters_per_rank(r.model, coarse.t) * per_param / _KIB)
    extra_static = [round(p * per_param / _KIB) for p in base.parameters]
    workspace, fragmentation = memory_allowance(ctx.hardware)
    effective = (capacity - workspace) / (1 + fragmentation)
    # A schedule built for a memory limit is held to the limit, as its estimate is.
    profile = counted_shape(coarse).profile
    return _Data(
        stages=len(coarse.layers_per_stage),
        devices=coarse.p,
        microbatches=coarse.num_microbatches,
        num_layers=r.model.num_layers,
        modes=modes,
        stage_devices=stages_by_device(coarse.schedule, coarse.p, coarse.num_chunks),
        layer_time=layer_time,
        layer_act=layer_act,
        layer_static=layer_static,
        working=working,
        extra_time=extra_time,
        extra_act=extra_act,
        extra_static=extra_static,
        moments=profile,
        capacity=math.floor(effective / _KIB),
        workspace_bytes=workspace,
        fragmentation=fragmentation,
    )


class _Builder:
    """The CP-SAT model, one method per constraint or objective term."""

    def __init__(self, data: _Data) -> None:
        self.data = data
        self.model = cp_model.CpModel()
        L = data.num_layers
        self.y = [
            {mode: self.model.new_int_var(0, L, f"y_s{s}_{mode}") for mode in data.modes}
            for s in range(data.stages)
        ]
        self.x = [self.model.new_int_var(0, L, f"x_s{s}") for s in range(data.stages)]

    def layer_counts(self) -> None:
        """Each stage's layers split over modes; all layers placed; every stage but the first
        and the last holds at least one layer (those two may hold only the embedding or only
        the output layer, as the V-shape paper lays out its models, §4.1: a middle stage
        without a layer would only pass its input on)."""
        d = self.data
        for s in range(d.stages):
            self.model.add(self.x[s] == sum(self.y[s].values()))
            if 0 < s < d.stages - 1:
                self.model.add(self.x[s] >= 1)
        self.model.add(sum(self.x) == d.num_layers)

    def memory(self) -> None:
        """Every device fits at each of its peak moments (its own in-flight counts)."""
        d = self.data
        act = [
            sum(d.layer_act[mode] * self.y[s][mode] for mode in d.modes) + d.extra_act[s]
            for s in range(d.stages)
        ]
        for device, stages in enumerate(d.stage_devices):
            static = sum(d.layer_static * self.x[s] + d.extra_static[s] for s in stages)
            working = self._working(device, stages)
            for moment in d.moments[device]:
                saved = sum(count * act[s] for s, count in moment.items())
                self.model.add(static + saved + working <= d.capacity)

    def _working(self, device: int, stages: tuple[int, ...]) -> cp_model.IntVar:
        """Transient memory of the heaviest recompute mode the device uses."""
        d = self.data
        top = max(d.working.values())
        w = self.model.new_int_var(0, top, f"working_d{device}")
        for s in stages:
            for mode in d.modes:
                if d.working[mode] == 0:
                    continue
                used = self.model.new_bool_var(f"uses_s{s}_{mode}")
                self.model.add(self.y[s][mode] <= d.num_layers * used)
                self.model.add(w >= d.working[mode] * used)
        return w

    def objective(self) -> None:
        """(m - 1) x slowest device + sum of device times (1F1B's makespan, unequal stages)."""
        d = self.data
        horizon = d.num_layers * max(d.layer_time.values()) + sum(d.extra_time) + 1
        self.device_time = []
        for device, stages in enumerate(d.stage_devices):
            t = self.model.new_int_var(0, horizon, f"time_d{device}")
            self.model.add(
                t
                == sum(
                    sum(d.layer_time[mode] * self.y[s][mode] for mode in d.modes) + d.extra_time[s]
                    for s in stages
                )
            )
            self.device_time.append(t)
        self.slowest = self.model.new_int_var(0, horizon, "slowest")
        self.model.add_max_equality(self.slowest, self.device_time)
        self.model.minimize((d.microbatches - 1) * self.slowest + sum(self.device_time))

    def hint(self, layers: list[int], mode: Recompute) -> None:
        """Start from the grid's answer: the even split, every layer in one mode."""
        for s, n in enumerate(layers):
            for m, var in self.y[s].items():
                self.model.add_hint(var, n if m == mode else 0)


def refine(
    ctx: PlanContext,
    coarse: CandidateConfig,
    modes: tuple[Recompute, ...],
    capacity: float,
    options: RefineOptions | None = None,
) -> Refinement:
    """Solve the refinement for ``coarse`` (its layers and recompute are the hint)."""
    options = options or RefineOptions()
    data = _data(ctx, coarse, modes, capacity)
    builder = _Builder(data)
    builder.layer_counts()
    builder.memory()
    builder.objective()
    hint_mode = coarse.recompute if coarse.recompute in modes else modes[-1]
    builder.hint(coarse.layers_per_stage, hint_mode)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = options.time_limit_s
    solver.parameters.num_workers = options.workers or os.cpu_count() or 1
    solver.parameters.random_seed = options.seed
    started = time.perf_counter()
    code = solver.solve(builder.model)
    wall = time.perf_counter() - started
    if code == cp_model.MODEL_INVALID:  # pragma: no cover - a bug in the builder
        raise AssertionError(f"CP-SAT rejected the model: {builder.model.validate()}")
    status = _STATUS.get(code, "timed out")
    if code == cp_model.FEASIBLE and wall >= options.time_limit_s * 0.95:
        status = "timed out"
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return Refinement(status, None, None, None, wall)
    splits = [
        RecomputeSplit(**{mode: solver.value(builder.y[s][mode]) for mode in modes})
        for s in range(data.stages)
    ]
    layers = [split.total for split in splits]
    used = {mode for split in splits for mode, n in split.as_dict().items() if n}
    heaviest = next(m for m in ("full", "selective", "none") if m in used or m == "none")
    config = coarse.model_copy(
        update={"layers_per_stage": layers, "recompute": heaviest, "recompute_per_stage": splits}
    )
    config = CandidateConfig.model_validate(config.model_dump())
    claimed_time = [solver.value(t) / _US for t in builder.device_time]
    claimed_memory = _claimed_memory(data, splits)
    return Refinement(
        status,
        config,
        solver.objective_value / _US,
        solver.best_objective_bound / _US,
        wall,
        claimed_time,
        claimed_memory,
    )


def _claimed_memory(data: _Data, splits: list[RecomputeSplit]) -> list[float]:
    """The solver's own memory arithmetic for a solution, in bytes (peak over moments)."""
    act = [
        sum(data.layer_act[m] * n for m, n in split.as_dict().items()) + data.extra_act[s]
        for s, split in enumerate(splits)
    ]
    out = []
    for device, stages in enumerate(data.stage_devices):
        static = sum(data.layer_static * splits[s].total + data.extra_static[s] for s in stages)
        working = max(
            (data.working[m] for s in stages for m, n in splits[s].as_dict().items() if n),
            default=0,
        )
        saved = max(sum(c * act[s] for s, c in moment.items()) for moment in data.moments[device])
        tensors = (static + saved + working) * _KIB
        out.append(tensors * (1 + data.fragmentation) + data.workspace_bytes)
    return out


def check(ctx: PlanContext, refinement: Refinement) -> tuple[list[float], list[float]]:
    """Re-price a refinement with the ordinary cost model: (memory bytes per device, device
    time per micro-batch in seconds incl. extras and p2p), to compare with its claims."""
    assert refinement.config is not None
    config = refinement.config
    costs = stage_costs(ctx, config)
    memory, _ = device_memory(ctx, config, costs)
    times = []
    for stages in stages_by_device(config.schedule, config.p, config.num_chunks):
        times.append(
            sum(
                costs.forward[s] + costs.backward[s] + costs.weight[s] + 2 * costs.p2p_s
                for s in stages
            )
        )
    return [m.total for m in memory], times
