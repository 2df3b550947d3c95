"""The run report: what one execution of an executor config measured, as one typed document.

Rank 0 of ``python -m executor.worker`` writes it (``run-report.json`` in ``--out``) once
every rank has finished, so its presence means the run completed; ``stagewright run`` prints
it. The format is versioned (``format``) and its JSON Schema is published in
``docs/run-report.schema.json``: tools (the measured-runs store, dashboards) may rely on it.

Step times. A flushed schedule (every step drains the pipeline) reports each step's wall time
per rank. A schedule that runs its batches without a flush (2BW) has no step boundary in
time: a rank's step time is then the time between its optimizer steps of consecutive batches,
which in the steady state is the pipeline's time per batch. ``measured.step_time_s`` is the
median over the steps after the first (which includes start-up and, for 2BW, the pipeline
fill) of the slowest rank's time, and sits next to the planner's prediction.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from planner.launch.config import Prediction
from planner.specs import Precision, RecomputeSplit

__all__ = [
    "RUN_REPORT_FORMAT",
    "MeasuredStep",
    "Mismatch",
    "RankReport",
    "RunReport",
    "RunSummary",
    "StepMeasure",
    "Verification",
]

RUN_REPORT_FORMAT = "stagewright.run-report/1"


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class StepMeasure(_Spec):
    """One step on one rank."""

    step: int
    wall_s: float = Field(description="The step's time on this rank (see the module notes).")
    busy_s: float = Field(description="Time in compute actions (F, B, W, BW, optimizer step).")
    cpu_s: float = Field(description="CPU seconds this rank's process used in the step.")
    peak_saved_activation_bytes: int = Field(
        description="Peak bytes of saved activations alive at once (unique storages autograd "
        "saved for backward, evicted ones excluded, held ones for a BPipe pair included)."
    )
    bytes_sent: dict[str, int] = Field(description="Bytes sent to each peer rank.")
    losses: list[float] = Field(description="Loss of each micro-batch this rank ended.")
    loss_scale: float | None = Field(default=None, description="fp16: the loss scale used.")


class RankReport(_Spec):
    rank: int
    dp: int
    pp: int
    tp: int
    stages: list[int]
    steps: list[StepMeasure]
    peak_saved_activation_bytes: int = Field(description="Largest over the steps.")
    predicted_saved_activation_bytes: float | None = Field(
        description="The planner's prediction for this rank's pipeline device."
    )


class Mismatch(_Spec):
    """A tensor that differs from the reference beyond the tolerance."""

    rank: int
    stage: int
    tensor: str = Field(description="Parameter name, or 'loss of micro-batch k'.")
    kind: Literal["gradient", "weight", "loss"]
    weight_version: int | None = Field(
        default=None, description="2BW: the weight version compared (the newest)."
    )
    error: float = Field(description="max |run - reference| / max(|reference|, floor).")
    tolerance: float


class Verification(_Spec):
    """The run against a single-process reference of the same model, seed, batches and
    precision (see ``executor.verify``)."""

    passed: bool
    compared: str = Field(description="What was compared.")
    precision: Precision
    tolerance: float = Field(description="Largest relative error accepted for this precision.")
    checked: int = Field(description="Tensors compared, over all ranks.")
    max_error: float
    largest_share: float | None = Field(
        default=None,
        description="The largest error as a share of its own tensor's tolerance (at most 1 "
        "when passed; with tensor parallelism in bf16 or fp16 each gradient's tolerance is "
        "raised to what the precision's rounding moves it, so this, not max_error against "
        "tolerance, says how close the run came).",
    )
    mismatches: list[Mismatch]


class RunSummary(_Spec):
    """The configuration that ran."""

    schedule: str
    t: int
    p: int
    d: int
    micro_batch_size: int
    num_microbatches: int
    precision: Precision
    sequence_parallel: bool
    recompute_per_stage: list[RecomputeSplit] = Field(
        description="Layers of each stage per recompute mode."
    )
    world_size: int


class MeasuredStep(_Spec):
    step_time_s: float | None = Field(
        description="Median over the steps after the first of the slowest rank's step time "
        "(null with a single step)."
    )
    per_step_s: list[float] = Field(description="Each step: the slowest rank's time.")


class RunReport(_Spec):
    format: Literal["stagewright.run-report/1"] = "stagewright.run-report/1"
    config: RunSummary
    continuous: bool = Field(
        description="True when batches followed one another without a flush (2BW)."
    )
    first_step: int = Field(description="Step the run started at (after a resumed checkpoint).")
    num_steps: int = Field(description="Steps this run executed.")
    predicted: Prediction | None
    measured: MeasuredStep
    step_time_error: float | None = Field(
        description="measured step time / predicted - 1 (meaningful when the prediction is "
        "for the hardware that ran)."
    )
    ranks: list[RankReport]
    verification: Verification | None = None
    notes: list[str] = Field(default_factory=list)
