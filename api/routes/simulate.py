"""/v1/simulate: `stagewright simulate` over HTTP."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends

from api.deps import WRITE, StateDep, strict_body
from api.routes._docs import problems_of
from api.schemas import SimulateRequest, SimulateResult
from api.services import simulate
from api.state import offload

__all__ = ["router"]

router = APIRouter(prefix="/v1/simulate", tags=["simulate"])


EXAMPLES = {
    "v-half": {
        "summary": "V-Half on 4 devices, 8 micro-batches",
        "value": {
            "schedule": "v-half",
            "num_devices": 4,
            "num_microbatches": 8,
            "forward": 1.0,
            "backward": 1.0,
            "weight": 1.0,
        },
    },
    "bpipe": {
        "summary": "BPipe on 8 devices with transfers",
        "value": {
            "schedule": "bpipe",
            "num_devices": 8,
            "num_microbatches": 16,
            "forward": 1.0,
            "backward": 2.0,
            "transfer": 0.5,
        },
    },
}


@router.post(
    "",
    response_model=SimulateResult,
    dependencies=[*WRITE, Depends(strict_body(SimulateRequest))],
    summary="Simulate one pipeline schedule",
    responses=problems_of(400, 401, 403, 408, 413, 422, 503),
)
async def simulate_schedule(
    body: Annotated[SimulateRequest, Body(openapi_examples=EXAMPLES)], state: StateDep
) -> SimulateResult:
    """Times are per stage (per chunk for V schedules, which hold two stages a device);
    schedules without a B/W split run B + W as one backward. The answer is the JSON of
    ``stagewright simulate --json``. A request whose schedule would take more work to
    build and simulate than this server allows is refused (413) before any is done."""
    return await offload(state, simulate.simulate_schedule, state, body)
