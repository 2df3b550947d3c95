"""REST shapes of measured runs and calibrations. A run is ``planner.measurements.MeasuredRun``
as it is (the same JSON the CLI reads); what is defined here is the envelope around it."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from planner.measurements import MeasuredRun

__all__ = [
    "MAX_RUNS_PER_REQUEST",
    "MeasuredRunList",
    "MeasuredRunPublic",
    "MeasuredRunsIn",
    "MeasuredRunsWriteResult",
]

MAX_RUNS_PER_REQUEST = 1000


class _ApiModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class MeasuredRunsIn(_ApiModel):
    """Measured runs to store (POST /v1/measurements): all of them or, if one is wrong,
    none."""

    runs: list[MeasuredRun] = Field(
        min_length=1,
        max_length=MAX_RUNS_PER_REQUEST,
        fail_fast=True,
        description=f"The runs (at most {MAX_RUNS_PER_REQUEST}; send more in several requests).",
    )


class MeasuredRunsWriteResult(_ApiModel):
    created: int = Field(description="Runs stored now.")
    unchanged: int = Field(description="Runs identical to one already stored (kept once).")
    restored: int = Field(
        default=0,
        description="Runs identical to a withdrawn one, which is back in use (in lists and "
        "calibration) now.",
    )
    ids: list[int] = Field(description="The stored id of every run, in the order sent.")


class MeasuredRunPublic(MeasuredRun):
    """A stored run."""

    id: int
    origin: str = Field(
        description="Who stored it: 'bundled' (profiles/measurements), 'api', 'cli', 'plan' "
        "(a plan measurement), 'executor'."
    )
    measurement_id: int | None = Field(
        default=None, description="The plan measurement it came from, if any."
    )
    created_at: datetime
    withdrawn_at: datetime | None = Field(
        default=None,
        description="When the run was withdrawn (DELETE /v1/measurements/{id}): left out of "
        "lists and calibration, kept for the calibrations that used it. Null: in use.",
    )
    withdrawn_reason: str | None = Field(
        default=None, description="Why it was withdrawn, as given (null: none given)."
    )


class MeasuredRunList(_ApiModel):
    items: list[MeasuredRunPublic]
    total: int = Field(description="Runs matching the filters, all pages.")
    limit: int
    offset: int
