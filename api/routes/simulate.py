"""/v1/simulate: `stagewright simulate` over HTTP."""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated

from fastapi import APIRouter, Body, Depends

from api.deps import WRITE, SettingsDep, strict_body
from api.limits import check_simulate_request
from api.routes._docs import problems
from api.schemas import SimulateRequest, SimulateResult
from planner.schedules import Schedule, generate
from planner.simulate import Durations, simulate

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


@lru_cache(maxsize=32)
def _schedule(name: str, devices: int, microbatches: int, chunks: int, batches: int) -> Schedule:
    """Generated schedules are immutable; the same shape is asked for again and again."""
    return generate(
        name, devices, microbatches, num_chunks=chunks, num_batches=batches, check=False
    )


def _times(value: float | list[float]) -> float | tuple[float, ...]:
    return value if isinstance(value, float | int) else tuple(value)


@router.post(
    "",
    response_model=SimulateResult,
    dependencies=[*WRITE, Depends(strict_body(SimulateRequest))],
    summary="Simulate one pipeline schedule",
    responses=problems(400, 401, 413, 422),
)
def simulate_schedule(
    body: Annotated[SimulateRequest, Body(openapi_examples=EXAMPLES)], settings: SettingsDep
) -> SimulateResult:
    """Times are per stage (per chunk for V schedules, which hold two stages a device);
    schedules without a B/W split run B + W as one backward. The answer is the JSON of
    ``stagewright simulate --json``."""
    check_simulate_request(body, settings)
    schedule = _schedule(
        body.schedule, body.num_devices, body.num_microbatches, body.num_chunks, body.num_batches
    )
    durations = Durations(
        forward=_times(body.forward),
        backward=_times(body.backward),
        weight=_times(body.weight),
        comm=body.comm,
        transfer=body.transfer,
        overlap_transfers=body.overlap_transfers,
    )
    return SimulateResult.model_validate(simulate(schedule, durations).to_contract())
