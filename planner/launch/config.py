"""The executor config: everything a rank needs to run one candidate, as one typed document.

The planner writes it (:func:`planner.launch.build_executor_config`), the executor reads it
(``executor.inputs.read_config``: :func:`planner.json_input.loads`, then
``ExecutorConfig.model_validate``), and nothing else parses it. It carries the exact
schedule IR the simulator priced, the layers and recompute mode of every stage, the rank
placement, the training settings, and what the planner predicted (so that ``stagewright run``
puts measured next to predicted without pricing the plan again).

Two forms of one document. In a plan the schedule is named by its generator's parameters (a
schedule reference) and the placement by its rule (with its blocks when optimized), so that a
plan's size does not grow with devices x micro-batches; :meth:`ExecutorConfig.materialized`
adds the actions and every rank, generating the schedule with the very generator the planner
priced (``stagewright plan --emit``, the service's launch routes and the executor use that).

The format is versioned (``format``); its JSON Schema is published in
``docs/executor-config.schema.json`` (``python -m planner.launch.schema`` writes it, and a
test checks that the file is current). Every rule is checked when the document is read, with
a message that says what to change, before any process group is created.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

from planner.errors import StagewrightError
from planner.placement import Assignment, Placement, place
from planner.schedules import (
    PassTimes,
    Schedule,
    schedule_family,
    validate,
)
from planner.specs import (
    CandidateConfig,
    ModelSpec,
    Recompute,
    RecomputeSplit,
    TrainingSpec,
    numbers_not_booleans,
)

__all__ = [
    "EXECUTOR_CONFIG_FORMAT",
    "ExecutorConfig",
    "OptimizerSettings",
    "Parallel",
    "PlacementSpec",
    "Prediction",
    "RankCoords",
    "SCHEDULE_REFERENCE_FORMAT",
    "ScheduleReference",
    "StageSpec",
    "TRUSTED_SCHEDULE",
    "is_plan_request",
    "placement_reference",
    "run_a_request",
    "schedule_reference",
]

EXECUTOR_CONFIG_FORMAT = "stagewright.executor-config/2"
SCHEDULE_REFERENCE_FORMAT = "stagewright.schedule-ref/1"

# A plan request's top-level keys (all required).
_PLAN_REQUEST_KEYS = frozenset({"model", "cluster", "training"})


def run_a_request(request: str = "REQUEST.json") -> str:
    """What to do with a plan request given where an executor config belongs."""
    return (
        f"plan it with stagewright plan {request} --emit DIR, then run a candidate's config, "
        "e.g. stagewright run DIR/candidate-1/executor-config.json (or "
        "DIR/candidate-1/run-node0.sh)"
    )


def is_plan_request(data: Any) -> bool:
    """Whether a document is a plan request rather than an executor config: it has no format
    and has a request's top-level keys (``model``, ``cluster``, ``training``; an executor
    config has no ``cluster``), as every document that validates as a request does."""
    return isinstance(data, dict) and "format" not in data and _PLAN_REQUEST_KEYS <= data.keys()


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class Parallel(_Spec):
    """Parallel degrees; the job has t x cp x p x d ranks."""

    _numbers_not_booleans = numbers_not_booleans("t", "p", "d", "cp")

    t: int = Field(ge=1, description="Tensor-parallel degree.")
    p: int = Field(ge=1, description="Pipeline-parallel degree (devices in a pipeline).")
    d: int = Field(ge=1, description="Data-parallel degree.")
    cp: int = Field(
        default=1,
        ge=1,
        description="Context-parallel degree (Megatron-LM's; stagewright's executor runs only "
        "cp = 1). A tensor group and its cp - 1 context peers are t x cp consecutive ranks, "
        "numbered together by the placement's tp.",
    )

    @property
    def group(self) -> int:
        """Ranks of one tensor-and-context group: t x cp."""
        return self.t * self.cp


class StageSpec(_Spec):
    """One pipeline stage: a contiguous run of layers and how many use each recompute mode.
    The first and the last stage may hold none (only the embedding, only the output layer)."""

    _numbers_not_booleans = numbers_not_booleans("first_layer")

    first_layer: int = Field(ge=0, description="Index of the stage's first transformer layer.")
    recompute: RecomputeSplit = Field(
        description="Layers of the stage per recompute mode. In layer order the fully "
        "recomputed layers come first, then the selective ones, then those that keep "
        "everything (Megatron-LM's 'block' method recomputes the first layers of a stage)."
    )

    @property
    def num_layers(self) -> int:
        return self.recompute.total

    @property
    def end_layer(self) -> int:
        return self.first_layer + self.num_layers

    def layer_modes(self) -> list[Recompute]:
        """The recompute mode of each layer, in layer order."""
        split = self.recompute
        full: list[Recompute] = ["full"]
        selective: list[Recompute] = ["selective"]
        none: list[Recompute] = ["none"]
        return full * split.full + selective * split.selective + none * split.none


class RankCoords(_Spec):
    """Where a global rank sits in the (data, pipeline, tensor) grid."""

    _numbers_not_booleans = numbers_not_booleans("rank", "dp", "pp", "tp")

    rank: int = Field(ge=0)
    dp: int = Field(ge=0)
    pp: int = Field(ge=0)
    tp: int = Field(ge=0)


class PlacementSpec(_Spec):
    """Rank -> coordinates, as the planner placed them (see :mod:`planner.placement`): every
    rank, or (in a plan) the rule that gives them."""

    _numbers_not_booleans = numbers_not_booleans("gpus_per_node", "blocks")

    gpus_per_node: int = Field(ge=1)
    assignment: Assignment = Field(
        description="How the ranks are laid out: standard (Megatron-LM's order), pair-adjacent "
        "(BPipe's) or optimized (the blocks below)."
    )
    ranks: list[RankCoords] | None = Field(
        default=None, description="One entry per global rank; absent: from the rule."
    )
    blocks: list[tuple[int, int]] | None = Field(
        default=None,
        description="Optimized placements in a plan: the (dp, pp) block of each group of t "
        "consecutive ranks (tensor ranks fastest inside a block).",
    )


class ScheduleReference(_Spec):
    """A schedule by its generator's parameters (``planner.schedules.generate`` rebuilds it
    exactly)."""

    _numbers_not_booleans = numbers_not_booleans("num_devices", "num_microbatches", "parameters")

    format: Literal["stagewright.schedule-ref/1"]
    name: str
    num_devices: int = Field(ge=1)
    num_microbatches: int = Field(ge=1)
    parameters: dict[str, float] = Field(default_factory=dict)
    choice: dict[str, Any] | None = Field(
        default=None,
        description="For a family whose generator searches (the adaptive ones): the choice "
        "its search made, which rebuilding repeats without searching again.",
    )

    def build(self) -> Schedule:
        family = schedule_family(self.name)
        if family.rebuild is not None and self.choice is not None:
            return family.rebuild(self.choice, self.num_devices, self.num_microbatches)
        resolved = family.resolve(self.parameters)
        return family.build(self.num_devices, self.num_microbatches, resolved, PassTimes())


class OptimizerSettings(_Spec):
    """Hyper-parameters of the update (the optimizer itself is ``training.optimizer``)."""

    _numbers_not_booleans = numbers_not_booleans(
        "lr",
        "adam_beta1",
        "adam_beta2",
        "adam_eps",
        "sgd_momentum",
        "initial_loss_scale",
        "loss_scale_window",
        "min_loss_scale",
    )

    lr: float = Field(default=1e-3, gt=0, description="Learning rate.")
    adam_beta1: float = Field(default=0.9, ge=0, lt=1)
    adam_beta2: float = Field(default=0.999, ge=0, lt=1)
    adam_eps: float = Field(default=1e-8, gt=0)
    sgd_momentum: float = Field(default=0.9, ge=0, lt=1)
    initial_loss_scale: float = Field(
        default=2.0**16, gt=0, description="fp16 only: the dynamic loss scale to start from."
    )
    loss_scale_window: int = Field(
        default=1000,
        ge=1,
        description="fp16 only: steps without overflow before the loss scale doubles.",
    )
    min_loss_scale: float = Field(default=1.0, gt=0, description="fp16 only: the floor.")


class Prediction(_Spec):
    """What the planner predicted for this candidate, on the hardware it planned for."""

    _numbers_not_booleans = numbers_not_booleans(
        "iteration_time_s",
        "saved_activation_bytes",
        "recompute_working_bytes",
        "memory_gib_per_device",
    )

    hardware: str = Field(description="The hardware profile the prediction is for.")
    iteration_time_s: float = Field(
        ge=0, description="One optimizer step (for 2BW: one batch in the steady state)."
    )
    saved_activation_bytes: list[float] = Field(
        description="Per pipeline device: peak bytes of saved activations (recompute applied)."
    )
    recompute_working_bytes: list[float] = Field(
        description="Per pipeline device: transient bytes while a recomputed layer runs its "
        "backward (not saved activations; the planner adds them to the device's peak)."
    )
    memory_gib_per_device: list[float] = Field(description="Per pipeline device: total peak.")


class ExecutorConfig(_Spec):
    """One candidate, ready to run: ``stagewright run CONFIG.json`` or the plan's torchrun
    line. Read with ``ExecutorConfig.model_validate`` of ``planner.json_input.loads`` (a key
    given twice is refused); invalid documents raise a ``ValidationError`` whose messages
    say what to change."""

    _numbers_not_booleans = numbers_not_booleans(
        "micro_batch_size", "num_microbatches", "dropout", "seed"
    )

    format: Literal["stagewright.executor-config/2"] = Field(
        description="Version of this document; a stagewright that cannot read it says so."
    )
    model: ModelSpec
    training: TrainingSpec
    parallel: Parallel
    micro_batch_size: int = Field(ge=1)
    num_microbatches: int = Field(ge=1, description="Micro-batches per pipeline per batch.")
    stages: list[StageSpec] = Field(min_length=1, description="Every stage, in stage order.")
    placement: PlacementSpec
    schedule: dict[str, Any] = Field(
        description="The schedule IR exactly as the simulator priced it "
        "(``planner.schedules.Schedule.to_dict``), or in a plan its generator's parameters "
        "(format stagewright.schedule-ref/1: name, num_devices, num_microbatches, parameters)."
    )
    optimizer: OptimizerSettings = Field(default_factory=OptimizerSettings)
    dropout: float = Field(
        default=0.1,
        ge=0,
        lt=1,
        description="Dropout after the embedding, on the attention probabilities and after "
        "each residual branch (Megatron-LM's hidden and attention dropout; Korthikanti et "
        "al. count its masks in the activation memory).",
    )
    seed: int = Field(default=1234, ge=0, description="Seed of the weights, data and dropout.")
    predicted: Prediction | None = Field(
        default=None, description="The planner's prediction (absent in hand-made configs)."
    )

    @property
    def world_size(self) -> int:
        return self.parallel.group * self.parallel.p * self.parallel.d

    @property
    def compact(self) -> bool:
        """True in a plan's form (schedule by reference or placement by rule)."""
        return self.placement.ranks is None or _is_reference(self.schedule)

    @cached_property
    def ir(self) -> Schedule:
        """The schedule (generated from its reference in a plan's form)."""
        if _is_reference(self.schedule):
            return ScheduleReference.model_validate(self.schedule).build()
        return Schedule.from_dict(self.schedule)

    @cached_property
    def coords(self) -> tuple[tuple[int, int, int], ...]:
        """(dp, pp, tp) of every global rank, in rank order."""
        spec, (g, p, d) = self.placement, (self.parallel.group, self.parallel.p, self.parallel.d)
        if spec.ranks is not None:
            return tuple((r.dp, r.pp, r.tp) for r in spec.ranks)
        if spec.blocks is not None:
            return tuple((dp, pp, tp) for dp, pp in spec.blocks for tp in range(g))
        return place(g, p, d, spec.gpus_per_node, spec.assignment).coords

    @cached_property
    def planned_placement(self) -> Placement:
        """The placement as the planner's :class:`~planner.placement.Placement`: its rule
        when the ranks follow it, else every rank listed (as an optimized one)."""
        spec, (g, p, d) = self.placement, (self.parallel.group, self.parallel.p, self.parallel.d)
        if spec.assignment != "optimized":
            ruled = place(g, p, d, spec.gpus_per_node, spec.assignment)
            if ruled.coords == self.coords:
                return ruled
        return Placement(g, p, d, spec.gpus_per_node, "optimized", self.coords)

    def rank_of(self, dp: int, pp: int, tp: int) -> int:
        """The global rank at (dp, pp, tp)."""
        return self._ranks[(dp, pp, tp)]

    def coords_of(self, rank: int) -> tuple[int, int, int]:
        """(dp, pp, tp) of a global rank."""
        return self.coords[rank]

    @cached_property
    def _ranks(self) -> dict[tuple[int, int, int], int]:
        return {coords: rank for rank, coords in enumerate(self.coords)}

    def materialized(self) -> ExecutorConfig:
        """The same document with the schedule's actions and every rank written out."""
        if not self.compact:
            return self
        ranks = [
            RankCoords(rank=rank, dp=dp, pp=pp, tp=tp)
            for rank, (dp, pp, tp) in enumerate(self.coords)
        ]
        placement = self.placement.model_copy(update={"ranks": ranks, "blocks": None})
        return self.model_copy(update={"schedule": self.ir.to_dict(), "placement": placement})

    @model_validator(mode="before")
    @classmethod
    def _known_format(cls, data: Any) -> Any:
        if is_plan_request(data):
            raise ValueError(f"this is a plan request, not an executor config: {run_a_request()}")
        if isinstance(data, dict) and data.get("format") != EXECUTOR_CONFIG_FORMAT:
            found = data.get("format")
            if found is None:
                raise ValueError(
                    f"it has no format; an executor config has format "
                    f"{EXECUTOR_CONFIG_FORMAT!r} (a candidate's executor-config.json, as "
                    "stagewright plan REQUEST.json --emit DIR writes it)"
                )
            raise ValueError(
                f"format is {found!r}, but this stagewright reads {EXECUTOR_CONFIG_FORMAT!r}; "
                "plan again with this version (stagewright plan REQUEST.json --emit DIR) to "
                "get a config it can run"
            )
        return data

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> ExecutorConfig:
        # The planner writes schedules its own generators built (validated by the tests) and
        # says so; every other reader parses and validates the IR here.
        trusted = bool(info.context and info.context.get(TRUSTED_SCHEDULE))
        for problem in _problems(self, trusted):
            raise ValueError(problem)
        return self


TRUSTED_SCHEDULE = "schedule_from_generator"
"""Validation context key: the schedule comes straight from a generator (skip re-checking)."""


def _problems(config: ExecutorConfig, trusted: bool) -> list[str]:
    """Every rule the document breaks (the first one is reported), each saying what to
    change."""
    t, p, d = config.parallel.t, config.parallel.p, config.parallel.d
    model, training = config.model, config.training
    out: list[str] = []
    if trusted:
        devices, microbatches, stages = _schedule_shape(config.schedule)
    else:
        try:
            schedule = validate(config.ir)
            # The name is data the run is priced, extended and reported by: it must be the
            # family whose generator could have built these actions.
            mismatch = schedule_family(schedule.name).actions_problem(schedule)
        except StagewrightError as exc:
            return [f"schedule: {exc}"]
        if mismatch is not None:
            return [mismatch]
        devices, microbatches = schedule.num_devices, schedule.num_microbatches
        stages = schedule.num_stages
    if devices != p:
        out.append(f"schedule runs {devices} devices but parallel.p is {p}")
    if microbatches != config.num_microbatches:
        out.append(
            f"schedule has {microbatches} micro-batches per batch but "
            f"num_microbatches is {config.num_microbatches}"
        )
    if len(config.stages) != stages:
        out.append(f"{len(config.stages)} stages listed for the schedule's {stages}")
    layer = 0
    for index, stage in enumerate(config.stages):
        if stage.num_layers == 0 and 0 < index < len(config.stages) - 1:
            out.append(
                f"stage {index} holds no layer: only the first stage (the embedding) and the "
                f"last (the output layer) may have none; move a layer into it"
            )
        if stage.first_layer != layer:
            out.append(
                f"stage {index} starts at layer {stage.first_layer}; stages must cover the "
                f"layers in order, so it should start at {layer}"
            )
        layer = stage.end_layer
    if layer != model.num_layers:
        out.append(f"the stages hold {layer} layers but the model has {model.num_layers}")
    out += _placement_problems(config)
    if model.num_attention_heads % t or model.ffn % t:
        out.append(
            f"t = {t} must divide the {model.num_attention_heads} attention heads and the "
            f"MLP size {model.ffn}"
        )
    batch = config.micro_batch_size * config.num_microbatches * d
    if batch != training.global_batch_size:
        out.append(
            f"micro_batch_size x num_microbatches x d = {batch}, but training.global_batch_size "
            f"is {training.global_batch_size}"
        )
    predicted = config.predicted
    if predicted is not None and not (
        len(predicted.saved_activation_bytes)
        == len(predicted.recompute_working_bytes)
        == len(predicted.memory_gib_per_device)
        == p
    ):
        out.append(f"predicted lists must have one entry per pipeline device ({p})")
    return out


def _is_reference(schedule: dict[str, Any]) -> bool:
    return schedule.get("format") == SCHEDULE_REFERENCE_FORMAT


def _schedule_shape(schedule: dict[str, Any]) -> tuple[int, int, int]:
    """(devices, micro-batches per batch, stages) of a schedule the planner built, without
    building it again."""
    if not _is_reference(schedule):
        return (
            int(schedule["num_devices"]),
            int(schedule["num_microbatches"]),
            int(schedule["num_stages"]),
        )
    reference = ScheduleReference.model_validate(schedule)
    family = schedule_family(reference.name)
    stages = family.num_stages(reference.num_devices, reference.parameters)
    return reference.num_devices, reference.num_microbatches, stages


def _placement_problems(config: ExecutorConfig) -> list[str]:
    g, p, d = config.parallel.group, config.parallel.p, config.parallel.d
    spec = config.placement
    if spec.ranks is not None and [r.rank for r in spec.ranks] != list(range(g * p * d)):
        return [f"placement.ranks must list ranks 0..{g * p * d - 1} in order"]
    if spec.ranks is None and spec.assignment == "optimized" and spec.blocks is None:
        return ["an optimized placement needs its ranks or its blocks"]
    if spec.ranks is None and spec.blocks is None:
        return _rule_problems(g, p, d, spec.gpus_per_node, spec.assignment)
    try:
        coords = sorted(config.coords)
    except StagewrightError as exc:
        return [f"placement: {exc}"]
    expected = [(a, b, c) for a in range(d) for b in range(p) for c in range(g)]
    if coords != expected:
        cp = f" cp={config.parallel.cp}" if config.parallel.cp > 1 else ""
        return [
            f"the placement must hold each (dp, pp, tp) of t={config.parallel.t}{cp} p={p} "
            f"d={d} once"
        ]
    falling = [(dp, pp) for dp, pp, tp in config.coords if tp and _falls(config, dp, pp, tp)]
    if falling:
        dp, pp = falling[0]
        return [
            f"the tensor-parallel ranks of (dp, pp) = ({dp}, {pp}) must rise with tp: torch "
            "numbers a group's members by global rank, and tensor parallelism gathers its "
            "shards in that order"
        ]
    return []


def _rule_problems(g: int, p: int, d: int, gpus_per_node: int, assignment: Assignment) -> list[str]:
    """Why ranks placed by a rule (standard or pair-adjacent) cannot hold this job: only
    when they do not fill whole nodes. The rules are :mod:`planner.placement`'s formulas,
    which hold every (dp, pp, tp) once and number a tensor group's ranks rising with tp
    (``tests/unit/test_placement.py`` checks both): listing every rank to check that again
    took most of the assembly of a 16,384-GPU plan (10 candidates of 16,384 ranks)."""
    try:
        place(g, p, d, gpus_per_node, assignment)
    except StagewrightError as exc:
        return [f"placement: {exc}"]
    return []


def _falls(config: ExecutorConfig, dp: int, pp: int, tp: int) -> bool:
    """Whether the rank at (dp, pp, tp) is below the one at (dp, pp, tp - 1)."""
    return config.rank_of(dp, pp, tp) < config.rank_of(dp, pp, tp - 1)


def placement_reference(placement: Placement) -> dict[str, Any]:
    """A placement by its rule; an optimized one also by its (dp, pp) blocks in rank order:
    t times fewer entries than its ranks."""
    reference: dict[str, Any] = {
        "assignment": placement.assignment,
        "gpus_per_node": placement.gpus_per_node,
    }
    if placement.assignment == "optimized":
        reference["blocks"] = [[dp, pp] for dp, pp, tp in placement.coords if tp == 0]
    return reference


def schedule_reference(
    config: CandidateConfig, choice: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The generator parameters of a candidate's schedule as the planner built it (its chunks
    per device, the memory limit an adaptive schedule was built for, defaults for the rest):
    what a plan stores instead of its actions. A family that searches (the adaptive ones)
    also stores the ``choice`` its search made."""
    given = config.schedule_parameters
    reference: dict[str, Any] = {
        "format": SCHEDULE_REFERENCE_FORMAT,
        "name": config.schedule,
        "num_devices": config.p,
        "num_microbatches": config.num_microbatches,
        "parameters": schedule_family(config.schedule).resolve(given),
    }
    if choice is not None:
        reference["choice"] = dict(choice)
    return reference
