"""/v1/simulate: `stagewright simulate` over HTTP."""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated

from fastapi import APIRouter, Body, Depends

from api.deps import WRITE, SettingsDep, strict_body
from api.limits import check_simulate_request
from api.routes._docs import problems
from api.schemas import SimulateRequest, SimulateResult
from planner.schedules import Schedule, generate, schedule_family
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


# Request fields that are generator parameters of the families that take them.
_PARAMETER_FIELDS = ("num_chunks", "num_batches")


@lru_cache(maxsize=32)
def _schedule(
    name: str, devices: int, microbatches: int, parameters: tuple[tuple[str, float], ...]
) -> Schedule:
    """Generated schedules are immutable; the same shape is asked for again and again."""
    return generate(name, devices, microbatches, check=False, **dict(parameters))


def _parameters(body: SimulateRequest) -> tuple[tuple[str, float], ...]:
    """The generator parameters the request sets: those it gives (a family that does not
    take one refuses it) and the defaults of the schema's fields the family takes."""
    family = schedule_family(body.schedule)
    return tuple(
        (name, getattr(body, name))
        for name in _PARAMETER_FIELDS
        if name in body.model_fields_set or family.has_parameter(name)
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
    schedule = _schedule(body.schedule, body.num_devices, body.num_microbatches, _parameters(body))
    durations = Durations(
        forward=_times(body.forward),
        backward=_times(body.backward),
        weight=_times(body.weight),
        comm=body.comm,
        transfer=body.transfer,
        overlap_transfers=body.overlap_transfers,
    )
    return SimulateResult.model_validate(simulate(schedule, durations).to_contract())
