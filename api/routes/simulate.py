"""/v1/simulate: `stagewright simulate` over HTTP."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends

from api.deps import WRITE, JsonBodyRoute, StateDep, strict_body
from api.routes._docs import problems_of
from api.schemas import MemorySweepRequest, MemorySweepResult, SimulateRequest, SimulateResult
from api.services import simulate
from api.state import offload

__all__ = ["router"]

router = APIRouter(prefix="/v1/simulate", tags=["simulate"], route_class=JsonBodyRoute)


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
    responses=problems_of(400, 401, 403, 408, 413, 415, 422, 503),
)
async def simulate_schedule(
    body: Annotated[SimulateRequest, Body(openapi_examples=EXAMPLES)], state: StateDep
) -> SimulateResult:
    """Times are per stage (per chunk for V schedules, which hold two stages a device);
    schedules without a B/W split run B + W as one backward. The answer is the JSON of
    ``stagewright simulate --json``. A request whose schedule would take more work to
    build and simulate than this server allows is refused (413) before any is done."""
    return await offload(state, simulate.simulate_schedule, state, body)


@router.post(
    "/memory-sweep",
    response_model=MemorySweepResult,
    dependencies=[*WRITE, Depends(strict_body(MemorySweepRequest))],
    summary="Bubble rate against memory limit of the adaptive schedules",
    responses=problems_of(400, 401, 403, 408, 413, 415, 422, 503),
)
async def sweep_memory(body: MemorySweepRequest, state: StateDep) -> MemorySweepResult:
    """v-adaptive and zb-adaptive searched and simulated at memory limits from the least
    either reaches to 2 (ZB-2P), with 1F1B's bubble rate as the reference: the V-shape
    paper's Figures 9 and 10 for this pipeline. Times are one V stage's; the one-stage
    schedules (zb-adaptive, 1F1B) run two V stages' times per stage. The dashboard's
    "Memory limits" page draws it."""
    return await offload(state, simulate.sweep_memory, body)
