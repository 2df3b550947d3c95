"""Shapes only the REST API needs. Plans reuse the planner's specs (PlanRequest, Plan,
Candidate, ...) as they are; what is defined here is what the planner has no model for:
problem details, job status around a Plan, hardware and profile uploads, simulate, and
measurements. Every model rejects unknown fields and non-finite numbers."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from planner.errors import NO_NUL_PATTERN, NO_NUL_RULE
from planner.hardware_spec import (
    HARDWARE_NAME_PATTERN,
    HARDWARE_NAME_RULE,
    HardwareIn,
    HardwareName,
    LinkSpec,
    Note,
)
from planner.profiles import CalibrationRecord, LayerPoint
from planner.schedules import schedule_family
from planner.specs import CandidateConfig, Plan, PlanStats, Precision, Predicted, Recompute
from planner.specs import ScheduleName as ScheduleName

__all__ = [
    "HARDWARE_NAME_PATTERN",
    "HARDWARE_NAME_RULE",
    "DeviceTiming",
    "HardwareIn",
    "HardwarePublic",
    "Health",
    "LayerPointIn",
    "LayerPointPublic",
    "LinkIn",
    "LinkPublic",
    "LinkSpec",
    "MeasurementIn",
    "MeasurementPublic",
    "NO_NUL_PATTERN",
    "PlanList",
    "PlanPublic",
    "PlanStatus",
    "PlanSummary",
    "Problem",
    "ProblemItem",
    "ProfilesIn",
    "ProfilesPublic",
    "ProfilesWriteResult",
    "SimulateRequest",
    "SimulateResult",
]

PlanStatus = Literal["queued", "running", "done", "failed"]
Origin = Literal["bundled", "api"]
_MAX_SECONDS = 1e9
Seconds = Annotated[float, Field(ge=0, le=_MAX_SECONDS)]
_MAX_DEPTH = 32


class _ApiModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class ProblemItem(_ApiModel):
    """One invalid part of a request."""

    loc: list[str | int] = Field(description="Where: 'body', then field names and indexes.")
    msg: str = Field(description="What is wrong and what to change.")
    type: str = Field(description="Machine-readable kind, e.g. 'missing' or 'limit'.")


class Problem(_ApiModel):
    """An RFC 9457 problem detail (media type application/problem+json)."""

    type: str = Field(description="URI naming the kind of problem (urn:stagewright:problem:...).")
    title: str = Field(description="Short summary of the kind of problem.")
    status: int = Field(description="The HTTP status code.")
    detail: str = Field(description="What went wrong in this request and what to change.")
    instance: str | None = Field(default=None, description="The path or resource concerned.")
    errors: list[ProblemItem] | None = Field(
        default=None,
        description="The invalid fields (validation problems only): the first 20 of them.",
    )
    errors_not_listed: int | None = Field(
        default=None,
        description="How many invalid fields beyond those in errors (absent when it lists "
        "them all).",
    )
    error_id: str | None = Field(
        default=None, description="Internal errors: the id the server log files it under."
    )


class HardwarePublic(HardwareIn):
    """A stored hardware profile."""

    revision: int = Field(description="Goes up on every change to the profile or its points.")
    origin: Origin = Field(description="'bundled' (from profiles/) or 'api' (posted).")
    updated_at: datetime
    calibration: CalibrationRecord | None = Field(
        default=None,
        description="How the parameters were fitted to measured runs (stagewright calibrate), "
        "or null when they were not.",
    )


class LayerPointIn(_ApiModel):
    """One measured transformer layer (per micro-batch, on one tensor-parallel rank)."""

    gpu: HardwareName
    precision: Precision = Field(default="bf16", description="Precision of the run.")
    hidden_size: int = Field(ge=1, le=1_048_576, description="h.")
    num_attention_heads: int = Field(ge=1, le=65_536, description="a.")
    ffn_hidden_size: int | None = Field(
        default=None, ge=1, le=4_194_304, description="MLP inner size; null means 4 x h."
    )
    seq_length: int = Field(ge=1, le=4_194_304, description="s.")
    micro_batch_size: int = Field(ge=1, le=65_536, description="Samples per micro-batch.")
    t: int = Field(default=1, ge=1, le=1024, description="Tensor-parallel degree of the run.")
    recompute: Recompute = Field(default="none", description="Recomputation mode of the run.")
    sequence_parallel: bool = Field(default=False, description="Sequence parallelism on.")
    flash_attention: bool = Field(default=False, description="Flash attention on.")
    forward_ms: float = Field(gt=0, le=1e7, description="Forward time (ms).")
    backward_ms: float = Field(
        gt=0, le=1e7, description="Backward-for-input time (ms), or the fused backward."
    )
    weight_ms: float | None = Field(
        default=None,
        ge=0,
        le=1e7,
        description="Backward-for-weights time (ms); null when backward_ms is the fused B + W.",
    )
    activation_bytes: float | None = Field(
        default=None, ge=0, le=1e15, description="Saved-activation bytes of the layer."
    )
    includes_tp_comm: bool = Field(
        default=True, description="The times include the tensor-parallel collectives."
    )
    source: Note = Field(default="", description="Where the point comes from.")

    @model_validator(mode="after")
    def _a_shape_a_model_can_have(self) -> LayerPointIn:
        # The checks of a plan request's model and of its tensor-parallel split: a point
        # no model can have would only raise the hardware's revision (dropping its plans).
        problem = self.to_point().shape_problem()
        if problem is not None:
            raise ValueError(problem)
        return self

    def to_point(self) -> LayerPoint:
        return LayerPoint(
            gpu=self.gpu,
            precision=self.precision,
            hidden_size=self.hidden_size,
            num_attention_heads=self.num_attention_heads,
            ffn_hidden_size=self.ffn_hidden_size or 4 * self.hidden_size,
            seq_length=self.seq_length,
            micro_batch_size=self.micro_batch_size,
            t=self.t,
            recompute=self.recompute,
            sequence_parallel=self.sequence_parallel,
            flash_attention=self.flash_attention,
            forward_ms=self.forward_ms,
            backward_ms=self.backward_ms,
            weight_ms=self.weight_ms,
            activation_bytes=self.activation_bytes,
            includes_tp_comm=self.includes_tp_comm,
            source=self.source,
        )


class LayerPointPublic(LayerPointIn):
    """A stored layer point."""

    id: int
    origin: Origin
    updated_at: datetime


class LinkIn(LinkSpec):
    """A measured link of a hardware profile (its intra-node or inter-node link)."""

    gpu: HardwareName
    scope: Literal["intra_node", "inter_node"] = Field(description="Which link it is.")
    source: Note = Field(default="", description="Where the numbers come from.")


class LinkPublic(LinkIn):
    origin: Origin
    updated_at: datetime


class ProfilesIn(_ApiModel):
    """Layer points and link measurements to store (POST /v1/profiles). A point whose shape
    (gpu, precision, sizes, t, recompute, switches) is already stored replaces it."""

    layers: list[LayerPointIn] = Field(
        default_factory=list,
        fail_fast=True,
        description="Layer points, each shape at most once.",
    )
    links: list[LinkIn] = Field(
        default_factory=list,
        max_length=256,
        description="Links, each (gpu, scope) at most once.",
    )

    @model_validator(mode="after")
    def _not_empty(self) -> ProfilesIn:
        if not self.layers and not self.links:
            raise ValueError("nothing to store: give at least one entry in 'layers' or 'links'")
        return self

    # One entry per stored row: a second of the same key would replace the first within
    # the request, its values lost without a word.
    @field_validator("layers")
    @classmethod
    def _shapes_once(cls, layers: list[LayerPointIn]) -> list[LayerPointIn]:
        _once(
            "layers",
            [point.to_point().row_key() for point in layers],
            "shape (gpu, precision, sizes, t, recompute and switches; ffn_hidden_size null "
            "is 4 x hidden_size)",
        )
        return layers

    @field_validator("links")
    @classmethod
    def _links_once(cls, links: list[LinkIn]) -> list[LinkIn]:
        _once("links", [(link.gpu, link.scope) for link in links], "gpu and scope")
        return links


def _once(field: str, keys: list[Any], what: str) -> None:
    first: dict[Any, int] = {}
    for index, key in enumerate(keys):
        if key in first:
            raise ValueError(
                f"{field}[{index}] has the same {what} as {field}[{first[key]}]; send each "
                f"{'shape' if field == 'layers' else 'link'} once, with the values to store"
            )
        first[key] = index


class ProfilesWriteResult(_ApiModel):
    created: int = Field(description="Entries that were new.")
    updated: int = Field(description="Entries that replaced different values.")
    unchanged: int = Field(description="Entries identical to what was stored.")
    revisions: dict[str, int] = Field(description="Hardware revision after the write, per GPU.")


class ProfilesPublic(_ApiModel):
    layers: list[LayerPointPublic] = Field(description="Layer points (one page of them).")
    links: list[LinkPublic] = Field(description="Links of the hardware listed.")
    total_layers: int = Field(description="Layer points matching the filter, all pages.")
    limit: int
    offset: int


class PlanPublic(Plan):
    """A stored plan: the planner's Plan plus where its search stands. Until ``status`` is
    'done', ``best`` is null and the lists are empty; a 'failed' plan carries ``error``."""

    stats: PlanStats | None = Field(  # type: ignore[assignment]
        default=None, description="Search statistics; null until the search is done."
    )
    status: PlanStatus = Field(description="queued, running, done or failed.")
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    hardware_revision: int = Field(
        description="Revision of the hardware profile planned on; the plan is priced, and "
        "its timeline drawn, with that revision's profiles."
    )
    created_by: str | None = Field(
        default=None, description="Name of the token that created the plan (null: no token)."
    )
    warnings: list[str] = Field(
        description="Settings of the request the server changed; for a done plan without "
        "candidates, why and what may make the request fit."
    )
    error: Problem | None = Field(description="Why the search failed (status 'failed').")


class PlanSummary(_ApiModel):
    """One row of GET /v1/plans."""

    id: str
    status: PlanStatus
    model_name: str
    gpu: str
    num_gpus: int
    method: str
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    created_by: str | None = Field(default=None, description="Token that created the plan.")
    best_config: CandidateConfig | None = Field(description="The best candidate's config.")
    best_predicted: Predicted | None = Field(description="What is predicted for it.")
    error: Problem | None


class PlanList(_ApiModel):
    items: list[PlanSummary]
    total: int = Field(description="Plans matching the filters, all pages.")
    limit: int
    offset: int


class MeasurementIn(_ApiModel):
    """What the executor measured when it ran one candidate of a plan."""

    candidate: int = Field(
        default=0, ge=0, le=999, description="Index of the candidate that ran (0 = best)."
    )
    step_time_s: float = Field(gt=0, le=1e7, description="Measured time of one optimizer step.")
    peak_activation_bytes: list[Annotated[int, Field(ge=0, le=2**53)]] = Field(
        default_factory=list,
        max_length=65_536,
        fail_fast=True,
        description="Peak saved-activation bytes per rank, in rank order: one per rank of "
        "the plan, or none.",
    )
    data: dict[str, Any] = Field(
        default_factory=dict,
        description="Anything else, as JSON (losses, versions, host): finite numbers only, "
        f"no NUL character in a key or a string, nested at most {_MAX_DEPTH} deep.",
    )

    @field_validator("data")
    @classmethod
    def _plain_json(cls, value: dict[str, Any]) -> dict[str, Any]:
        problem = _json_problem(value, "data", 0)
        if problem:
            raise ValueError(problem)
        return value


def _json_problem(value: Any, where: str, depth: int) -> str | None:
    """What makes ``value`` something not every backend stores alike (NaN or Infinity,
    which JSON has no spelling for; nesting beyond ``_MAX_DEPTH``; a NUL character in a
    key or a string, which PostgreSQL cannot hold), or None."""
    if depth > _MAX_DEPTH:
        return f"{where} is nested more than {_MAX_DEPTH} deep; flatten it"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where} is {value}; JSON numbers must be finite (use null for 'no value')"
    if isinstance(value, str) and "\x00" in value:
        return f"{where}: {NO_NUL_RULE}"
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        if isinstance(key, str) and "\x00" in key:
            return f"{where} has a key {key!r}: {NO_NUL_RULE}"
        problem = _json_problem(item, f"{where}[{key!r}]", depth + 1)
        if problem:
            return problem
    return None


class MeasurementPublic(MeasurementIn):
    id: int
    plan_id: str
    predicted_iteration_time_s: float | None = Field(
        description="The plan's predicted step time for this candidate."
    )
    step_time_error: float | None = Field(
        description="measured / predicted - 1 (0.1 = 10% slower than predicted)."
    )
    created_at: datetime
    measured_run_id: int | None = Field(
        default=None,
        description="The measured run it is stored as for calibration (GET "
        "/v1/measurements/{id}), or the identical one stored before; null when it is not "
        "one (see not_calibrated_because).",
    )
    not_calibrated_because: str | None = Field(
        default=None,
        description="Why it is not stored as a measured run, so calibration does not learn "
        "from it (most often a step time 100 times off the prediction: a unit slip, such as "
        "ms for s); null when it is one. Both are null for a measurement stored before "
        "stagewright recorded either.",
    )


_MAX_STAGES = 4096


def _stage_times(value: Any) -> Any:
    """One message for a bad time: the union's two branches would each report their own
    ("should be >= 0"; "should be a valid array") for one mistake. A list too long is left
    to the schema's own limit, unread (a 1 MB list of times took 0.1 s to walk here)."""
    if isinstance(value, list) and len(value) > _MAX_STAGES:
        return value
    values = value if isinstance(value, list) else [value]
    for index, item in enumerate(values):
        if isinstance(item, bool):
            entry = f" (entry {index})" if isinstance(value, list) else ""
            raise ValueError(f"a number is needed, not {str(item).lower()}{entry}")
        if not isinstance(item, int | float):
            continue  # not a number: the schema's own message names what is expected
        if not 0 <= item <= _MAX_SECONDS:
            raise ValueError(
                f"times are seconds from 0 to 1e9, one for every stage or a list with one "
                f"per stage; got {item}"
            )
    return value


StageTimes = Annotated[
    Seconds | Annotated[list[Seconds], Field(min_length=1, max_length=_MAX_STAGES)],
    BeforeValidator(_stage_times),
    Field(description="One time for every stage, or a list with one per stage."),
]


class SimulateRequest(_ApiModel):
    """``stagewright simulate`` over HTTP: generate a schedule and price it."""

    schedule: ScheduleName = Field(description="Pipeline schedule.")
    num_devices: int = Field(ge=1, le=1024, description="Pipeline devices.")
    num_microbatches: int = Field(
        ge=1, le=65_536, description="Micro-batches per batch (per batch for 2bw)."
    )
    forward: StageTimes = Field(description="Forward time.")
    backward: StageTimes = Field(description="Backward-for-input time (or the whole backward).")
    weight: StageTimes = Field(default=0.0, description="Backward-for-weights time.")
    comm: Seconds = Field(default=0.0, description="Time added to every edge between devices.")
    transfer: Seconds = Field(default=0.0, description="Time of one BPipe EVICT or LOAD.")
    overlap_transfers: bool = Field(
        default=True,
        description="BPipe transfers overlap compute (false: they block, which needs a "
        "transfer above 0).",
    )
    # The schedule's generator parameters: null (the default) is the schedule's own default
    # and is accepted by every schedule, since generated clients send every field; a value
    # is refused by a schedule that does not take the parameter (GET /v1/schedules lists
    # each schedule's parameters and their defaults).
    num_chunks: int | None = Field(
        default=None,
        ge=1,
        le=16,
        description="Chunks per device, for schedules that take it (interleaved ones); null: "
        "the schedule's default (2).",
    )
    num_batches: int | None = Field(
        default=None,
        ge=1,
        le=16,
        description="Batches run without a flush, for schedules that take it (2bw); null: the "
        "schedule's default (2).",
    )
    memory_limit: float | None = Field(
        default=None,
        gt=0,
        le=64,
        description="Activation memory limit as a fraction of 1F1B's peak, for schedules that "
        "take one (v-adaptive, zb-adaptive: ZB-1P at 1, ZB-2P at 2), which need it.",
    )

    def generator_parameters(self) -> dict[str, float]:
        """The generator parameters the request gives (not null); the schedule fills the
        rest with its defaults and refuses one it does not take."""
        values = {
            "num_chunks": self.num_chunks,
            "num_batches": self.num_batches,
            "memory_limit": self.memory_limit,
        }
        return {name: value for name, value in values.items() if value is not None}

    @model_validator(mode="after")
    def _transfers_only_where_activations_move(self) -> SimulateRequest:
        # Values other than the defaults: a client that sends every field, as generated
        # clients do, sends transfer 0 and overlap_transfers true for any schedule.
        given = [
            name
            for name, changed in (
                ("transfer", self.transfer != 0.0),
                ("overlap_transfers", not self.overlap_transfers),
            )
            if changed
        ]
        family = schedule_family(self.schedule)
        problem = family.transfer_problem(given)
        if problem is None:  # a transfer of no time blocks nothing
            blocking = None if self.overlap_transfers else "overlap_transfers false"
            problem = family.blocking_problem(blocking, "transfer", self.transfer)
        if problem is not None:
            raise ValueError(problem)
        return self


class DeviceTiming(_ApiModel):
    start: float = Field(description="Start of the device's first action.")
    end: float = Field(description="End of its last action.")
    busy: float = Field(description="Its compute time.")


class SimulateResult(_ApiModel):
    """The contract JSON of ``stagewright simulate --json``."""

    makespan: float
    bubble_fraction: float = Field(description="1 - busiest device's busy time / makespan.")
    peak_activation_fraction: list[float] = Field(
        description="Per device, peak saved activations in micro-batches of the whole model."
    )
    devices: list[DeviceTiming]


class Health(_ApiModel):
    """The readiness probe's answer. A caller without the read scope, where reads need one
    (a load balancer's probe has no token), gets only ``status``; the rest is null."""

    status: Literal["ok"]
    database: str | None = Field(description="Backend in use: sqlite or postgresql.")
    version: str | None = Field(description="stagewright version.")
    jobs_queued: int | None
    jobs_running: int | None


class ScheduleParameterPublic(_ApiModel):
    """A generator parameter of a schedule family."""

    name: str
    description: str
    default: float | None = Field(description="null: the caller must give it.")
    minimum: float
    integer: bool


class ScheduleFamilyPublic(_ApiModel):
    """A registered schedule family: what it needs and who can run it."""

    name: str = Field(description="The name requests use.")
    title: str
    citation: str
    parameters: list[ScheduleParameterPublic]
    placement: Literal["looped", "v"] = Field(description="Stage -> device rule.")
    stages_per_device: int
    split_backward: bool = Field(description="Backward split into B and W.")
    transfers: bool = Field(description="BPipe evict/load between pair devices.")
    weight_versions: int
    semantics: Literal["synchronous", "stale"]
    runtimes: list[str] = Field(description="Runtimes that can run it as planned.")
    min_devices: int
    memory_rule: str
    memory_fallback_for: str | None = Field(
        default=None,
        description="The family this one saves memory for: the search considers it only "
        "where that family runs out of memory with the same configuration.",
    )
    single_device_as: str | None = Field(
        default=None,
        description="The family that runs the same passes on one pipeline device in the same "
        "time with no more memory: the search does not consider this one at p = 1 where that "
        "family is searched too.",
    )
    uses_pass_times: bool = Field(
        description="The generator searches for the fastest order under the pass times given."
    )


class MemorySweepRequest(_ApiModel):
    """A pipeline to sweep memory limits on (``stagewright simulate --plot``'s figure)."""

    num_devices: int = Field(ge=2, le=16, description="Pipeline devices (at most 16 here).")
    num_microbatches: int = Field(ge=1, le=64, description="Micro-batches (at most 64).")
    forward: StageTimes = Field(description="Forward time of one V stage (2 per device).")
    backward: StageTimes = Field(description="Backward-for-input time of one V stage.")
    weight: StageTimes = Field(default=0.0, description="Backward-for-weights time.")
    comm: Seconds = Field(default=0.0, description="Time added to every edge between devices.")

    @model_validator(mode="after")
    def _times_per_v_stage(self) -> MemorySweepRequest:
        # The swept schedules are V-shaped: a list holds their stages' times, which the
        # schedule builder would refuse as "got 4 values for 8 stages" without saying why 8.
        v_stages = 2 * self.num_devices
        for name in ("forward", "backward", "weight"):
            value = getattr(self, name)
            if isinstance(value, list) and len(value) != v_stages:
                raise ValueError(
                    f"{name} needs one time or {v_stages} (one per V stage, 2 a device), "
                    f"got {len(value)}; give one number, or one time per V stage"
                )
        return self

    @model_validator(mode="after")
    def _bounded(self) -> MemorySweepRequest:
        # About 25 searches of both schedulers: a few seconds at 512 cells on one core.
        if self.num_devices * self.num_microbatches > 512:
            raise ValueError(
                f"num_devices x num_microbatches = {self.num_devices * self.num_microbatches} "
                "is above 512 for a memory sweep; sweep fewer micro-batches (the CLI's "
                "--plot has no limit)"
            )
        return self


class MemorySweepPoint(_ApiModel):
    memory_limit: float = Field(description="Fraction of 1F1B's peak activation.")
    bubble: dict[str, float | None] = Field(
        description="Per schedule built for a limit, its bubble rate (null: none within it)."
    )
    peak: dict[str, float | None] = Field(description="Per schedule, the peak it holds.")


class MemorySweepResult(_ApiModel):
    """Bubble rate against memory limit (V-shape paper, Figures 9 and 10)."""

    num_devices: int
    num_microbatches: int
    schedules: list[str] = Field(description="The schedules built for a limit, swept.")
    reference: str = Field(description="The schedule with no limit to set (1F1B).")
    reference_bubble: float = Field(description="Its bubble rate (its peak is 1).")
    points: list[MemorySweepPoint]
