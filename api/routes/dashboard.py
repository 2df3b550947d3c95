"""The dashboard: the page at / (served with its assets by this app, no CDN) and the
timeline of a plan's candidate that its Gantt chart draws."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from starlette.responses import FileResponse

from api.deps import SessionDep, StateDep
from api.problems import ApiProblem
from api.routes._docs import problems
from api.routes.plans import PlanId, _load
from api.store.profiles import SqlProfileStore
from planner.search.timeline import candidate_timeline
from planner.specs import CandidateConfig, PlanRequest

__all__ = ["STATIC", "router"]

STATIC = Path(__file__).resolve().parent.parent / "static"
router = APIRouter()


@router.get("/", include_in_schema=False)
def index() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html")


@router.get(
    "/v1/plans/{plan_id}/timeline",
    tags=["plans"],
    summary="The simulated timeline of one of a plan's ranked candidates",
    responses=problems(404, 409, 422, 503),
)
async def timeline(
    plan_id: PlanId,
    session: SessionDep,
    state: StateDep,
    candidate: Annotated[int, Query(ge=0, le=999, description="Rank in the plan (0 = best).")] = 0,
) -> dict[str, Any]:
    """Every compute action and BPipe transfer of the candidate's whole schedule per device
    ([kind, stage, micro-batch, start s, end s]), timed with its own stage durations."""
    record = _load(session, plan_id)
    result = record.result or {}
    candidates = result.get("candidates") or []
    if record.status != "done":
        raise ApiProblem(
            409, "plan-not-done", f"plan {plan_id} is {record.status}; poll it until it is done"
        )
    if candidate >= len(candidates):
        raise ApiProblem(
            404,
            "candidate-not-found",
            f"plan {plan_id} has {len(candidates)} ranked candidates; ask for "
            f"0..{max(0, len(candidates) - 1)}",
        )
    request = PlanRequest.model_validate(result["request"])
    config = CandidateConfig.model_validate(candidates[candidate]["config"])
    store = SqlProfileStore(state.database.sessions)
    return await run_in_threadpool(candidate_timeline, request, config, store)
