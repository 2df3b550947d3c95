"""Measured runs: what a training run (or one pass of it) measured, as the planner would
have been asked to predict it.

A :class:`MeasuredRun` names the model, the cluster, the training switches and the
configuration that ran (the same pieces as a plan request and a candidate), and what was
measured, one of two kinds:

- ``step``: whole optimizer steps -- the step time and/or the MFU (Megatron's formula, so a
  paper's MFU converts to a step time with the profile's peak), and optionally the peak
  memory of each pipeline device;
- ``pass``: single passes of one micro-batch over ``num_layers`` transformer layers on one
  tensor-parallel rank -- forward, backward (input gradient, recomputation included) and
  weight-gradient milliseconds, as the BPipe paper's Tables 3-4 and the V-shape paper's
  Table 5 report them. Without ``weight_ms`` the backward is the fused B + W.

The same JSON is accepted by ``stagewright measurements add`` (also as CSV, see
:mod:`planner.measurement_files`), ``POST /v1/measurements`` and the store, and
``planner.calibrate`` predicts each measured quantity with the ordinary cost model.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from planner.costmodel.evaluate import num_stages, split_layers
from planner.costmodel.flops import model_flops_per_step
from planner.errors import NO_NUL_PATTERN, StagewrightError, validation_problems
from planner.launch.config import ExecutorConfig
from planner.launch.report import RunReport
from planner.profiles import LayerPoint
from planner.schedules import BASELINE_SCHEDULE, MEMORY_LIMIT, NUM_CHUNKS, schedule_family
from planner.specs import (
    CandidateConfig,
    ClusterSpec,
    ModelSpec,
    PlanRequest,
    Recompute,
    RecomputeSplit,
    ScheduleName,
    SearchSpec,
    TrainingSpec,
    numbers_not_booleans,
)

__all__ = [
    "MEASURED_ON_LEEWAY",
    "MeasuredRun",
    "PassMeasurement",
    "RunConfig",
    "StepMeasurement",
    "candidate_config",
    "fingerprint",
    "measured_on_problem",
    "measured_step_time_s",
    "plan_request",
    "run_from_layer_point",
    "run_from_report",
]

_MAX_TIME_S = 1e7
_MAX_MS = 1e9


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class RunConfig(_Spec):
    """The configuration that ran: a plan candidate's ``config`` without the micro-batch
    count (it follows from the batch: global batch / (micro-batch size x d))."""

    _numbers_not_booleans = numbers_not_booleans(
        "t", "p", "d", "micro_batch_size", "layers_per_stage", "memory_limit", "num_chunks"
    )

    t: int = Field(ge=1, description="Tensor-parallel degree.")
    p: int = Field(ge=1, description="Pipeline-parallel degree (devices in a pipeline).")
    d: int = Field(ge=1, description="Data-parallel degree.")
    micro_batch_size: int = Field(ge=1, description="Samples per micro-batch.")
    recompute: Recompute = Field(description="Activation recomputation mode.")
    schedule: ScheduleName = Field(description="Pipeline schedule that ran.")
    layers_per_stage: list[int] | None = Field(
        default=None,
        fail_fast=True,
        description="Transformer layers per stage; null means the planner's even split.",
    )
    recompute_per_stage: list[RecomputeSplit] | None = Field(
        default=None,
        fail_fast=True,
        description="Per stage, layers per recompute mode (a CP-SAT plan); null: all "
        "``recompute``.",
    )
    memory_limit: float | None = Field(
        default=None,
        gt=0,
        description="For a schedule built for a memory limit (v-adaptive, zb-adaptive): the "
        "limit, as a fraction of 1F1B's peak, as in a plan candidate's config.",
    )
    num_chunks: int | None = Field(
        default=None,
        ge=1,
        description="For a schedule whose devices hold num_chunks stages each (interleaved, "
        "bpipe-interleaved): that count, as in a plan candidate's config; null means the "
        "family's default (2).",
    )

    # Written without a return annotation: pydantic would take one as the serialized
    # schema and lose the fields' own.
    @model_serializer(mode="wrap")
    def _omit_default_chunks(self, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]
        """The JSON without num_chunks where it is null or the family's default: a run
        stored before the field keeps its fingerprint, and one run is stored once."""
        out = handler(self)
        if schedule_family(self.schedule).default_chunks(self.num_chunks):
            out.pop("num_chunks", None)
        return out


class StepMeasurement(_Spec):
    """Whole optimizer steps."""

    _numbers_not_booleans = numbers_not_booleans("step_time_s", "mfu", "peak_memory_gib")

    kind: Literal["step"] = "step"
    step_time_s: float | None = Field(
        default=None, gt=0, le=_MAX_TIME_S, description="Seconds per optimizer step."
    )
    mfu: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Model FLOPs utilization as a fraction (0.38 for 38%), Megatron's formula "
        "(Narayanan et al. 2021, eq. 3). Used when step_time_s is not given.",
    )
    peak_memory_gib: list[Annotated[float, Field(gt=0, le=1e5)]] | None = Field(
        default=None,
        fail_fast=True,
        description="Peak memory of each pipeline device (p entries, GiB), where known.",
    )

    @field_validator("mfu", mode="wrap")
    @classmethod
    def _mfu_as_a_fraction(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """An MFU of 38 is 38%: say so, rather than only that it must be at most 1."""
        try:
            return handler(value)
        except ValidationError:
            number = _number(value)
            if number is None or number <= 1 or number > 100:
                raise
            raise ValueError(
                f"{number:g} is more than 1: the MFU is a fraction of the peak; give "
                f"{number / 100:g} for {number:g}%"
            ) from None

    @model_validator(mode="after")
    def _something_measured(self) -> StepMeasurement:
        if self.step_time_s is None and self.mfu is None and self.peak_memory_gib is None:
            raise ValueError(
                "a step measurement needs step_time_s, mfu or peak_memory_gib; give at least one"
            )
        return self


class PassMeasurement(_Spec):
    """Single passes of one micro-batch over ``num_layers`` layers (one tensor rank)."""

    _numbers_not_booleans = numbers_not_booleans(
        "num_layers", "forward_ms", "backward_ms", "weight_ms"
    )

    kind: Literal["pass"] = "pass"
    num_layers: int = Field(default=1, ge=1, description="Transformer layers the pass covers.")
    forward_ms: float | None = Field(default=None, gt=0, le=_MAX_MS, description="Forward.")
    backward_ms: float | None = Field(
        default=None,
        gt=0,
        le=_MAX_MS,
        description="Backward for the input gradient, recomputation included; the fused "
        "B + W when weight_ms is not given.",
    )
    weight_ms: float | None = Field(
        default=None, gt=0, le=_MAX_MS, description="Backward for the weight gradient (W)."
    )

    @model_validator(mode="after")
    def _something_measured(self) -> PassMeasurement:
        if self.forward_ms is None and self.backward_ms is None and self.weight_ms is None:
            raise ValueError("a pass measurement needs forward_ms, backward_ms or weight_ms")
        if self.weight_ms is not None and self.backward_ms is None:
            raise ValueError(
                "weight_ms without backward_ms: give the input-gradient backward too (or "
                "only backward_ms for a fused B + W)"
            )
        return self


def _number(value: Any) -> float | None:
    """``value`` as a finite number (a float or its text, as a CSV cell gives it), else None."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


Measured = Annotated[StepMeasurement | PassMeasurement, Field(discriminator="kind")]

_DATES = TypeAdapter(dt.date)


def _unreadable(value: Any) -> str:
    """Why ``value`` is not a date, as ' (reason)' where the parser says something of the
    text itself ('month value is outside expected range of 1-12'), else ''; a number or a
    time of day is read as a date and time, whose complaint says nothing of a date."""
    try:
        _DATES.validate_python(value)
    except ValidationError as exc:
        err = exc.errors()[0]
        reason = (err.get("ctx") or {}).get("error")
        if err["type"] == "date_from_datetime_parsing" and reason:
            return f" ({reason})"
    return ""


class MeasuredRun(_Spec):
    """One measured run: what ran, what was measured, and where the numbers come from."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    config: RunConfig
    measured: Measured = Field(description="What was measured: kind 'step' or 'pass'.")
    source: str = Field(
        min_length=1,
        max_length=2000,
        pattern=NO_NUL_PATTERN,
        description="Where the numbers come from (paper and table, or who ran it where).",
    )
    measured_on: dt.date | None = Field(
        default=None,
        description="When it was measured, as YYYY-MM-DD. Storing refuses a date after today "
        "(UTC's date, or the day after it, for time zones ahead of UTC).",
    )

    @field_validator("measured_on", mode="wrap")
    @classmethod
    def _a_date_as_written(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """A date that cannot be read says how to write one, not only what broke (pydantic's
        'invalid character in year')."""
        try:
            return handler(value)
        except ValidationError:
            pass
        if isinstance(value, str):
            # Strict validation of JSON (the service's request bodies) hands this validator
            # the text as a Python str, which strict mode refuses as not a date: read it as
            # strict JSON text is read (YYYY-MM-DD).
            try:
                return _DATES.validate_strings(value, strict=True)
            except ValidationError:
                pass
        raise ValueError(
            f"{value!r} is not a date{_unreadable(value)}; write it as YYYY-MM-DD, e.g. 2026-01-05"
        )

    @model_validator(mode="after")
    def _configuration_fits(self) -> MeasuredRun:
        c, gpus = self.config, self.cluster.num_gpus
        if c.t * c.p * c.d != gpus:
            raise ValueError(
                f"config t*p*d = {c.t}*{c.p}*{c.d} = {c.t * c.p * c.d} but the cluster has "
                f"{gpus} GPUs ({self.cluster.num_nodes} nodes x {self.cluster.gpus_per_node}); "
                "they must be equal"
            )
        if self.model.num_attention_heads % c.t:
            raise ValueError(
                f"config t = {c.t} does not divide the model's {self.model.num_attention_heads} "
                "attention heads"
            )
        batch = self.training.global_batch_size
        if batch % (c.micro_batch_size * c.d):
            raise ValueError(
                f"global_batch_size {batch} is not a multiple of micro_batch_size x d = "
                f"{c.micro_batch_size * c.d}"
            )
        stages = num_stages(c.schedule, c.p, c.num_chunks)
        layers = c.layers_per_stage
        if layers is None and split_layers(self.model.num_layers, stages) is None:
            # Only the two end stages may hold no layer: past layers + 2 stages no split can
            # (a given layers_per_stage could not either).
            raise ValueError(
                f"{self.model.num_layers} layers cannot fill the {stages} stages of "
                f"{c.schedule} with p = {c.p}: only the end stages may hold no layer; check p "
                + ("and num_chunks" if c.num_chunks is not None else "and the schedule")
            )
        if layers is not None and (len(layers) != stages or sum(layers) != self.model.num_layers):
            raise ValueError(
                f"config.layers_per_stage {layers} must have {stages} entries ({c.schedule}, "
                f"p = {c.p}) adding up to the model's {self.model.num_layers} layers"
            )
        if c.memory_limit is None and schedule_family(c.schedule).has_parameter(MEMORY_LIMIT.name):
            raise ValueError(
                f"{c.schedule} is built for a memory limit: give config.memory_limit (as in "
                "the plan candidate that ran)"
            )
        try:
            candidate_config(self)  # the candidate's own rules (recompute split, limit, ...)
        except ValidationError as exc:
            raise ValueError(validation_problems(exc, "config")) from None
        memory = getattr(self.measured, "peak_memory_gib", None)
        if memory is not None and len(memory) != c.p:
            raise ValueError(
                f"measured.peak_memory_gib has {len(memory)} entries; give one per pipeline "
                f"device (p = {c.p})"
            )
        if isinstance(self.measured, PassMeasurement) and self.measured.num_layers > max(
            self.model.num_layers, 1
        ):
            raise ValueError(
                f"measured.num_layers {self.measured.num_layers} is more than the model's "
                f"{self.model.num_layers} layers"
            )
        return self


# How far past UTC's date a run's measured_on may be: in the time zones ahead of UTC (as far
# as UTC+14), for part of each day, today's date is UTC's tomorrow.
MEASURED_ON_LEEWAY = dt.timedelta(days=1)


def measured_on_problem(run: MeasuredRun, now: dt.datetime) -> str | None:
    """Why ``run`` cannot be stored at ``now`` (timezone-aware) for its ``measured_on``, or
    None: a measurement cannot postdate the day it is stored. The latest date taken is UTC's
    date at ``now`` plus :data:`MEASURED_ON_LEEWAY` (today somewhere east of UTC); no date
    (None) is no problem."""
    if run.measured_on is None:
        return None
    today = now.astimezone(dt.UTC).date()
    latest = today + MEASURED_ON_LEEWAY
    if run.measured_on <= latest:
        return None
    return (
        f"{run.measured_on.isoformat()} is after today: a measurement cannot postdate the day "
        f"it is stored (the latest date taken is {latest.isoformat()}, UTC's today "
        f"{today.isoformat()} and a day for time zones ahead of UTC); give the date it was "
        "measured, as YYYY-MM-DD"
    )


def candidate_config(run: MeasuredRun) -> CandidateConfig:
    """The plan candidate that ``run`` ran (the even layer split when none was given)."""
    c = run.config
    stages = num_stages(c.schedule, c.p, c.num_chunks)
    layers = c.layers_per_stage or split_layers(run.model.num_layers, stages)
    assert layers is not None  # MeasuredRun checks the split exists
    return CandidateConfig(
        t=c.t,
        p=c.p,
        d=c.d,
        micro_batch_size=c.micro_batch_size,
        num_microbatches=run.training.global_batch_size // (c.micro_batch_size * c.d),
        recompute=c.recompute,
        schedule=c.schedule,
        layers_per_stage=list(layers),
        recompute_per_stage=c.recompute_per_stage,
        memory_limit=c.memory_limit,
        num_chunks=c.num_chunks,
    )


def plan_request(run: MeasuredRun) -> PlanRequest:
    """The plan request whose candidate ``run`` is (searching only that configuration)."""
    c = run.config
    chunks = {} if c.num_chunks is None else {"num_chunks": [c.num_chunks]}
    return PlanRequest(
        model=run.model,
        cluster=run.cluster,
        training=run.training,
        search=SearchSpec(
            **chunks,
            schedules=[c.schedule],
            recompute=[c.recompute],
            micro_batch_sizes=[c.micro_batch_size],
            # A measured run of a stale-weight schedule describes what ran; nothing to opt into.
            allow_stale_weights=schedule_family(c.schedule).semantics != "synchronous",
        ),
    )


def measured_step_time_s(run: MeasuredRun, peak_flops: float) -> float | None:
    """The measured step time: ``step_time_s``, else the MFU converted with Megatron's
    model FLOPs per step and ``peak_flops`` per device; None for pass measurements and
    memory-only steps."""
    measured = run.measured
    if not isinstance(measured, StepMeasurement):
        return None
    if measured.step_time_s is not None:
        return measured.step_time_s
    if measured.mfu is None:
        return None
    flops = model_flops_per_step(run.model, run.training.global_batch_size)
    seconds = flops / (measured.mfu * peak_flops * run.cluster.num_gpus)
    assert math.isfinite(seconds)
    return seconds


def fingerprint(run: MeasuredRun) -> str:
    """A stable hash of the run's canonical JSON: the store keeps one copy of identical runs."""
    canonical = json.dumps(run.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def run_from_layer_point(
    point: LayerPoint, model: ModelSpec, measured_on: dt.date | None = None
) -> MeasuredRun:
    """A profiled layer (``stagewright profile``) as a pass measurement of one layer of
    ``model`` (at the point's sequence length), on the point's ``t`` devices of one node.
    Pipeline and data parallelism do not enter a pass, so the run says p = d = 1."""
    return MeasuredRun(
        model=model.model_copy(update={"seq_length": point.seq_length}),
        cluster=ClusterSpec(gpu=point.gpu, num_nodes=1, gpus_per_node=point.t),
        training=TrainingSpec(
            global_batch_size=point.micro_batch_size,
            precision=point.precision,
            sequence_parallel=point.sequence_parallel,
            flash_attention=point.flash_attention,
        ),
        config=RunConfig(
            t=point.t,
            p=1,
            d=1,
            micro_batch_size=point.micro_batch_size,
            recompute=point.recompute,
            schedule=BASELINE_SCHEDULE,
        ),
        measured=PassMeasurement(
            num_layers=1,
            forward_ms=point.forward_ms,
            backward_ms=point.backward_ms,
            weight_ms=point.weight_ms,
        ),
        source=point.source or f"stagewright profile on {point.gpu}",
        measured_on=measured_on,
    )


def run_from_report(
    report: RunReport,
    config: ExecutorConfig,
    hardware: str,
    measured_on: dt.date | None = None,
) -> MeasuredRun:
    """What ``stagewright run`` measured (its run report, of the executor ``config`` that
    ran) as a step measurement on ``hardware``, all ranks on one node: the report's step
    time (the median over the steps after the first, of the slowest rank). StagewrightError
    when the run had no step past the first."""
    step_time = report.measured.step_time_s
    if step_time is None:
        raise StagewrightError(
            "a run of one step has no step time to record (the first step includes "
            "start-up): run at least 2 steps"
        )
    summary = report.config
    splits = summary.recompute_per_stage
    heaviest = max(
        (mode for split in splits for mode in split.as_dict()),
        key=("none", "selective", "full").index,
        default="none",
    )
    limit = config.schedule.get("parameters", {}).get(MEMORY_LIMIT.name)
    chunks = config.schedule.get("parameters", {}).get(NUM_CHUNKS.name)
    batch = summary.micro_batch_size * summary.num_microbatches * summary.d
    return MeasuredRun(
        model=config.model,
        cluster=ClusterSpec(gpu=hardware, num_nodes=1, gpus_per_node=summary.world_size),
        training=config.training.model_copy(update={"global_batch_size": batch}),
        config=RunConfig(
            t=summary.t,
            p=summary.p,
            d=summary.d,
            micro_batch_size=summary.micro_batch_size,
            recompute=heaviest,
            schedule=summary.schedule,
            layers_per_stage=[split.total for split in splits],
            recompute_per_stage=list(splits),
            memory_limit=limit,
            num_chunks=None if chunks is None else int(chunks),
        ),
        measured=StepMeasurement(step_time_s=step_time),
        source=f"stagewright run on {hardware}: {summary.world_size} ranks, "
        f"{report.num_steps} steps from step {report.first_step}",
        measured_on=measured_on,
    )
