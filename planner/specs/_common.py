"""What every spec shares: the frozen, extra-forbidding base model and the enumerations
(precision, recompute mode, solver status, time provenance, schedule and runtime names)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    WithJsonSchema,
)

from planner.schedules import (
    SCHEDULE_NAMES,
    families,
    schedule_family,
)

__all__ = [
    "DEFAULT_MICRO_BATCH_SIZES",
    "SCHEDULES",
    "Precision",
    "Recompute",
    "RuntimeChoice",
    "ScheduleName",
    "SolverStatus",
    "Spec",
    "TimeSource",
    "default_schedules",
]

Precision = Literal["bf16", "fp16", "fp32"]
SolverStatus = Literal["optimal", "feasible", "timed out", "infeasible"]
Recompute = Literal["none", "selective", "full"]
TimeSource = Literal[
    "measured point", "scaled measurement", "calibrated model", "uncalibrated model"
]


def _registered(name: str) -> str:
    schedule_family(name)  # raises ScheduleConfigError (a ValueError) naming the known ones
    return name


ScheduleName = Annotated[
    str,
    AfterValidator(_registered),
    WithJsonSchema({"type": "string", "enum": list(SCHEDULE_NAMES)}),
]
"""A registered schedule's name (:mod:`planner.schedules`)."""
SCHEDULES: tuple[str, ...] = SCHEDULE_NAMES
DEFAULT_MICRO_BATCH_SIZES = (1, 2, 4, 8)  # searched when a request gives none
RuntimeChoice = Literal["any", "megatron", "torch", "stagewright"]


def default_schedules(*, allow_stale_weights: bool) -> list[str]:
    """The schedules a request that names none searches: every registered synchronous one,
    and the stale-weight ones when allowed."""
    return [
        family.name
        for family in families()
        if family.semantics == "synchronous" or allow_stale_weights
    ]


class Spec(BaseModel):
    """Frozen, and an unknown field is an error rather than a silently ignored setting."""

    model_config = ConfigDict(frozen=True, extra="forbid")
