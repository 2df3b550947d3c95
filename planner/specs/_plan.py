"""What the planner answers: a :class:`Plan` of ranked candidates (each a configuration,
its prediction, per-device breakdown, notes and launch artefacts) and rejected ones."""

from __future__ import annotations

from typing import Any

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from planner.errors import ScheduleConfigError
from planner.schedules import (
    MEMORY_LIMIT,
    NUM_CHUNKS,
    Runtime,
    Semantics,
    schedule_family,
)
from planner.specs._common import (
    Recompute,
    ScheduleName,
    SolverStatus,
    Spec,
    TimeSource,
    numbers_not_booleans,
)
from planner.specs._request import PlanRequest

__all__ = [
    "Candidate",
    "CandidateConfig",
    "LandscapePoint",
    "Launch",
    "Plan",
    "PlanStats",
    "Predicted",
    "RecomputeSplit",
    "RefinementInfo",
    "Rejected",
    "ScheduleSummary",
    "StageBreakdown",
]


class RecomputeSplit(Spec):
    """Layers of one stage per recompute mode."""

    _numbers_not_booleans = numbers_not_booleans("none", "selective", "full")

    none: int = Field(default=0, ge=0, description="Layers that keep all activations.")
    selective: int = Field(default=0, ge=0, description="Layers recomputing attention only.")
    full: int = Field(default=0, ge=0, description="Layers recomputed whole.")

    @property
    def total(self) -> int:
        return self.none + self.selective + self.full

    def as_dict(self) -> dict[Recompute, int]:
        counts: dict[Recompute, int] = {
            "none": self.none,
            "selective": self.selective,
            "full": self.full,
        }
        return {mode: n for mode, n in counts.items() if n}


class CandidateConfig(Spec):
    """One point of the search space, as Megatron would be launched with it."""

    t: int = Field(description="Tensor-parallel degree.", ge=1)
    p: int = Field(description="Pipeline-parallel degree (devices in a pipeline).", ge=1)
    d: int = Field(description="Data-parallel degree.", ge=1)
    cp: int = Field(
        default=1,
        ge=1,
        description="Context-parallel degree: each sample's sequence is split over cp ranks "
        "(ring attention); world size = t x cp x p x d.",
    )
    micro_batch_size: int = Field(description="Samples per micro-batch.", ge=1)
    num_microbatches: int = Field(description="Micro-batches per pipeline per step.", ge=1)
    recompute: Recompute = Field(description="Activation recomputation mode.")
    schedule: ScheduleName = Field(description="Pipeline schedule.")
    layers_per_stage: list[int] = Field(
        description="Transformer layers of each pipeline stage, in stage order (2p stages for "
        "V schedules, p x chunks for interleaved)."
    )
    recompute_per_stage: list[RecomputeSplit] | None = Field(
        default=None,
        description="Per stage, how many of its layers use each recompute mode (what CP-SAT "
        "refinement chooses); null means every layer uses ``recompute``, which otherwise "
        "names the heaviest mode used.",
    )
    memory_limit: float | None = Field(
        default=None,
        gt=0,
        description="For a schedule built for a memory limit (v-adaptive, zb-adaptive): the "
        "activation memory each device could still hold, as a fraction of 1F1B's peak, that "
        "the schedule was built for; null for the others (and for a point rejected before "
        "its limit was known).",
    )

    num_chunks: int | None = Field(
        default=None,
        ge=1,
        description="For a schedule whose devices hold num_chunks stages each (interleaved, "
        "bpipe-interleaved): that count, v; the pipeline has p x v stages. Filled with the "
        "family's default (2) when absent, which is how a config written before this field "
        "reads, and left out of the JSON when it is that default; null for the other "
        "schedules.",
    )

    @model_validator(mode="before")
    @classmethod
    def _default_chunks(cls, data: Any) -> Any:
        """An absent num_chunks of a family that takes one is its default: a candidate always
        says how many stages its devices hold, and old plans load as they were planned."""
        if not isinstance(data, dict) or data.get("num_chunks") is not None:
            return data
        name = data.get("schedule")
        if not isinstance(name, str):
            return data
        try:
            default = schedule_family(name).chunks_default
        except ScheduleConfigError:  # the schedule field's own check says what to change
            return data
        return data if default is None else {**data, "num_chunks": default}

    @model_validator(mode="after")
    def _limit_where_the_schedule_takes_one(self) -> CandidateConfig:
        takes = schedule_family(self.schedule).has_parameter(MEMORY_LIMIT.name)
        if not takes and self.memory_limit is not None:
            raise ValueError(f"{self.schedule} takes no memory limit; leave memory_limit out")
        return self

    @model_validator(mode="after")
    def _chunks_where_the_schedule_takes_them(self) -> CandidateConfig:
        family = schedule_family(self.schedule)
        if self.num_chunks is None:
            return self
        if family.chunks_default is None:
            held = family.stages_per_device()
            raise ValueError(
                f"{self.schedule} takes no num_chunks (its placement gives each device "
                f"{held} stage{'s' if held > 1 else ''}); leave num_chunks out"
            )
        if self.num_chunks < 2:
            raise ValueError(
                f"{self.schedule} needs at least 2 chunks per device, got num_chunks "
                f"{self.num_chunks}; one chunk a device is the same schedule without "
                "interleaving"
            )
        family.resolve({NUM_CHUNKS.name: self.num_chunks})  # the family's own minimum
        return self

    @model_validator(mode="after")
    def _one_layer_count_per_stage(self) -> CandidateConfig:
        chunks = {} if self.num_chunks is None else {NUM_CHUNKS.name: self.num_chunks}
        stages = schedule_family(self.schedule).num_stages(self.p, chunks)
        # Empty: a rejected point that no split fits (the plan lists it with its reason).
        if self.layers_per_stage and len(self.layers_per_stage) != stages:
            shape = f"p = {self.p}" + (f", v = {self.num_chunks}" if chunks else "")
            raise ValueError(
                f"layers_per_stage has {len(self.layers_per_stage)} entries, but {self.schedule} "
                f"with {shape} has {stages} stages; give one per stage"
            )
        return self

    # Written without a return annotation: pydantic would take one as the serialized
    # schema and lose the fields' own.
    @model_serializer(mode="wrap")
    def _omit_default_chunks(self, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]
        """The JSON without num_chunks where it is the family's default (or null): plans
        and measurements written before the field stay byte-identical and read the same."""
        out = handler(self)
        if schedule_family(self.schedule).default_chunks(self.num_chunks):
            out.pop("num_chunks", None)
        return out

    @property
    def schedule_parameters(self) -> dict[str, float]:
        """The generator parameters of the candidate's schedule that the candidate sets
        (``planner.schedules.generate(schedule, p, m, **these)``): its chunks per device
        and the memory limit an adaptive schedule was built for."""
        given: dict[str, float] = {}
        if self.num_chunks is not None:
            given[NUM_CHUNKS.name] = self.num_chunks
        if self.memory_limit is not None:
            given[MEMORY_LIMIT.name] = self.memory_limit
        return given

    @property
    def label(self) -> str:
        """The configuration in one line (``t4 p8 d1 mb2 selective bpipe``): how plan notes
        and the landscape name it."""
        cp = f" cp{self.cp}" if self.cp > 1 else ""
        return (
            f"t{self.t}{cp} p{self.p} d{self.d} mb{self.micro_batch_size} "
            f"{self.recompute} {self.schedule_label}"
        )

    @property
    def schedule_label(self) -> str:
        """The schedule's name, with its chunks per device where they are not the family's
        default (``interleaved v=4``): how plan notes and tables name it."""
        if schedule_family(self.schedule).default_chunks(self.num_chunks):
            return self.schedule
        return f"{self.schedule} v={self.num_chunks}"

    @model_validator(mode="after")
    def _split_matches_layers(self) -> CandidateConfig:
        split = self.recompute_per_stage
        if split is None:
            return self
        if len(split) != len(self.layers_per_stage):
            raise ValueError(
                f"recompute_per_stage has {len(split)} entries for "
                f"{len(self.layers_per_stage)} stages; give one per stage"
            )
        for stage, (entry, layers) in enumerate(zip(split, self.layers_per_stage, strict=True)):
            if entry.total != layers:
                raise ValueError(
                    f"stage {stage}: recompute_per_stage counts {entry.total} layers but the "
                    f"stage has {layers}"
                )
        return self

    @property
    def weight_replicas(self) -> int:
        """Ranks holding the same weights, whose gradients are reduced together and over
        which the distributed optimizer shards: d x cp (Megatron-LM's data-parallel group
        with context parallelism)."""
        return self.d * self.cp

    @property
    def world_size(self) -> int:
        """Ranks of the candidate: t x cp x p x d."""
        return self.t * self.cp * self.p * self.d

    def stage_modes(self) -> list[dict[Recompute, int]]:
        """Per stage: layers per recompute mode (all ``recompute`` when no split is given),
        modes without layers left out, as :meth:`RecomputeSplit.as_dict` leaves them: a stage
        of only the embedding or the output layer has none."""
        if self.recompute_per_stage is None:
            return [{self.recompute: n} if n else {} for n in self.layers_per_stage]
        return [entry.as_dict() for entry in self.recompute_per_stage]


class Predicted(Spec):
    """What the cost model predicts for a candidate."""

    iteration_time_s: float = Field(description="Time of one optimizer step.")
    samples_per_s: float = Field(description="Global batch / iteration time.")
    tokens_per_s: float = Field(description="samples_per_s x seq_length.")
    mfu: float = Field(description="Model FLOPs utilization (0..1), Megatron's formula.")
    bubble_fraction: float = Field(description="Pipeline bubble (simulator's definition).")
    memory_gib_per_device: list[float] = Field(description="Peak memory per pipeline device.")
    peak_memory_gib: float = Field(description="Largest of memory_gib_per_device.")
    time_source: TimeSource = Field(
        description="Where the layer times come from: a measured point of exactly this shape, "
        "a measured point carried to it by the model's ratio, or the shape-aware model with "
        "calibrated or uncalibrated parameters."
    )
    calibration_error: float | None = Field(
        description="How far that source was off on the measured runs its parameters were "
        "fitted to: the root mean square of ln(predicted / measured), 0.10 meaning about 10%. "
        "Null when unknown: an uncalibrated model, or a measured point (whose own error is "
        "the measurement's)."
    )


class StageBreakdown(Spec):
    """Why a candidate costs what it costs, per pipeline device."""

    device: int
    stages: list[int]
    layers: int
    compute_s: float = Field(
        description="F + B + W time of one step on this device, its tensor-parallel "
        "collectives included."
    )
    communication_s: float = Field(
        description="Of which communication, per step: the tensor-parallel time inside "
        "compute_s, and the pipeline p2p sends that bubble_s waits for."
    )
    bubble_s: float = Field(
        description="Idle time in the simulated pipeline. compute_s + bubble_s is the "
        "pipeline's span; the step time adds data-parallel sync and the optimizer step."
    )
    parameters_gib: float
    gradients_gib: float
    optimizer_gib: float
    activations_gib: float
    allowance_gib: float
    in_flight_microbatches: float = Field(
        description="Peak saved micro-batches of this device's stages (from the simulator)."
    )


class Launch(Spec):
    """How to launch a candidate."""

    executor_config: dict[str, Any] = Field(
        description="`stagewright run` CONFIG.json. In a plan its schedule is named by its "
        "generator's parameters and its placement by its rule (the plan's size does not grow "
        "with devices x micro-batches); `stagewright run`, `stagewright plan --emit` and the "
        "service's launch route add the actions and ranks (planner.launch.materialize_launch)."
    )
    torchrun: list[str] = Field(description="One torchrun command per node.")
    megatron_args: str | None = Field(
        description="Equivalent Megatron-LM arguments, or null where Megatron has no such schedule."
    )
    torch_pipelining_csv: str | None = Field(
        description="The schedule in torch.distributed.pipelining's compute-only CSV, or null "
        "where that runtime cannot express it. Null in a plan (it grows with devices x "
        "micro-batches): the materialized launch artefacts carry it."
    )


class RefinementInfo(Spec):
    """What CP-SAT changed versus the uniform grid answer of the same (t, p, d, mb,
    schedule), and why it is an improvement."""

    status: SolverStatus = Field(
        description="Solver status: optimal, feasible (not proven optimal), timed out (best "
        "found within the limit), infeasible."
    )
    solve_s: float
    uniform_layers_per_stage: list[int]
    uniform_recompute: Recompute
    uniform_iteration_time_s: float | None = Field(
        description="The uniform grid configuration's simulated step time; null when it does "
        "not fit in memory."
    )
    uniform_peak_memory_gib: float
    speedup_vs_uniform: float | None = Field(
        description="uniform step time / refined step time; null when the uniform one does not "
        "fit (the refinement is what makes it fit)."
    )
    changes: list[str] = Field(description="Readable list of what changed.")


class Candidate(Spec):
    config: CandidateConfig
    predicted: Predicted
    launch: Launch
    runtimes: list[Runtime] = Field(
        default_factory=list,
        description="Runtimes that can run this candidate as planned (schedule, layer split, "
        "recompute choices and rank placement).",
    )
    runtime_limits: dict[str, str] = Field(
        default_factory=dict,
        description="For each runtime that cannot run it as planned, the reason.",
    )
    semantics: Semantics = Field(
        default="synchronous",
        description="synchronous: trains exactly like one process; stale: updates weights "
        "with gradients of older weights (PipeDream-2BW), which changes the training.",
    )
    breakdown: list[StageBreakdown] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    refinement: RefinementInfo | None = Field(
        default=None, description="Present when CP-SAT refined this candidate (method cpsat)."
    )


class Rejected(Spec):
    config: CandidateConfig
    reason: str
    predicted: Predicted | None = None


class PlanStats(Spec):
    evaluated: int = Field(description="Configurations considered (constraints included).")
    feasible: int = Field(description="Configurations that fit in memory.")
    search_ms: float = Field(description="Wall time of the search.")


class ScheduleSummary(Spec):
    """The best a schedule can do for this request, so a person can see whether a
    memory-saving schedule pays off here instead of assuming it does."""

    schedule: ScheduleName
    feasible: int = Field(description="Configurations of this schedule that fit.")
    semantics: Semantics = Field(
        default="synchronous", description="The schedule's training semantics."
    )
    best_config: CandidateConfig | None
    best_iteration_time_s: float | None = Field(description="Simulated, or null if none fit.")
    speedup_vs_1f1b: float | None = Field(
        description="Best 1F1B step time / this schedule's best (> 1 is faster); null when "
        "either has no feasible configuration or 1F1B was not searched."
    )


class LandscapePoint(Spec):
    """One configuration that fits, as the fast estimate prices it (for charts)."""

    label: str
    samples_per_s: float
    peak_memory_gib: float


class Plan(Spec):
    id: str
    request: PlanRequest
    best: Candidate | None
    candidates: list[Candidate]
    rejected: list[Rejected]
    stats: PlanStats
    by_schedule: list[ScheduleSummary] = Field(default_factory=list)
    landscape: list[LandscapePoint] = Field(
        default_factory=list,
        description="Every configuration that fits, with its estimated throughput and peak "
        "memory (the ranked candidates are simulated; these are not).",
    )
    notes: list[str] = Field(
        default_factory=list,
        description="What of the requested space was not searched, and why: points that "
        "have no configuration to list as rejected (a tensor-parallel degree the model "
        "does not split over, micro-batch sizes or data-parallel degrees whose product "
        "divides no global batch). And when the first candidate and the best one whose "
        "layer times come from the other kind of source (measured points, the model alone) "
        "would swap places priced alike by the model: their order then rests on the "
        "model's disagreement with the measurements.",
    )
