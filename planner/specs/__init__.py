"""Specs: the JSON a person sends (PlanRequest) and what the planner answers (Plan).

One set of pydantic v2 models serves the CLI, the REST API and the store; nothing else defines
these shapes. Models are frozen and reject unknown fields, so a typo is an error, not a
silently ignored setting. Messages say what to change.

The models live in private modules by concern, all exported from here: the shared base and
enumerations (``_common``), the transformer (``_model``), the rest of the request
(``_request``) and the answer (``_plan``).
"""

from __future__ import annotations

from planner.specs._common import (
    DEFAULT_MICRO_BATCH_SIZES,
    SCHEDULES,
    STORED,
    Precision,
    Recompute,
    RuntimeChoice,
    ScheduleName,
    SolverStatus,
    TimeSource,
    default_schedules,
    number_fields,
    numbers_not_booleans,
)
from planner.specs._model import ModelSpec
from planner.specs._plan import (
    Candidate,
    CandidateConfig,
    LandscapePoint,
    Launch,
    Plan,
    PlanStats,
    Predicted,
    RecomputeSplit,
    RefinementInfo,
    Rejected,
    ScheduleSummary,
    StageBreakdown,
)
from planner.specs._request import (
    DEFAULT_NUM_CHUNKS,
    ClusterSpec,
    PlanRequest,
    SearchSpec,
    TrainingSpec,
)

__all__ = [
    "DEFAULT_MICRO_BATCH_SIZES",
    "DEFAULT_NUM_CHUNKS",
    "SCHEDULES",
    "STORED",
    "Candidate",
    "CandidateConfig",
    "ClusterSpec",
    "LandscapePoint",
    "Launch",
    "ModelSpec",
    "Plan",
    "PlanRequest",
    "PlanStats",
    "Predicted",
    "Precision",
    "Recompute",
    "RecomputeSplit",
    "RefinementInfo",
    "RuntimeChoice",
    "Rejected",
    "ScheduleName",
    "ScheduleSummary",
    "SearchSpec",
    "SolverStatus",
    "StageBreakdown",
    "TimeSource",
    "TrainingSpec",
    "default_schedules",
    "number_fields",
    "numbers_not_booleans",
]
