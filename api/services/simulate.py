"""`stagewright simulate` over HTTP: generate one schedule and price it, within limits."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

from api.limits import check_simulate_request
from api.schemas import (
    MemorySweepRequest,
    MemorySweepResult,
    SimulateRequest,
    SimulateResult,
)
from planner.memory_sweep import memory_sweep
from planner.schedules import PassTimes, Schedule, generate, schedule_family
from planner.simulate import Durations, simulate

if TYPE_CHECKING:
    from api.state import AppState

__all__ = ["simulate_schedule", "sweep_memory"]


@lru_cache(maxsize=32)
def _schedule(
    name: str,
    devices: int,
    microbatches: int,
    parameters: tuple[tuple[str, float], ...],
    times: PassTimes | None,
) -> Schedule:
    """Generated schedules are immutable; the same shape is asked for again and again
    (the limits keep each one small, so 32 of them are a few megabytes at most)."""
    given: dict[str, Any] = dict(parameters)
    return generate(name, devices, microbatches, check=False, times=times, **given)


def _parameters(body: SimulateRequest) -> tuple[tuple[str, float], ...]:
    """The generator parameters the request gives, in a fixed order (a cache key); the
    generator fills the others with the family's defaults and refuses one the family
    does not take."""
    return tuple(sorted(body.generator_parameters().items()))


def _times(value: float | list[float]) -> float | tuple[float, ...]:
    return value if isinstance(value, float | int) else tuple(value)


def simulate_schedule(state: AppState, body: SimulateRequest) -> SimulateResult:
    """The contract JSON of ``stagewright simulate --json``, after the request's work (the
    schedule built and simulated) is checked against the server's limits."""
    check_simulate_request(body, state.settings)
    # A family that searches (the adaptive ones) searches under the request's own times.
    times = (
        PassTimes(_times(body.forward), _times(body.backward), _times(body.weight), body.comm)
        if schedule_family(body.schedule).uses_pass_times
        else None
    )
    schedule = _schedule(
        body.schedule, body.num_devices, body.num_microbatches, _parameters(body), times
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


def sweep_memory(body: MemorySweepRequest) -> MemorySweepResult:
    """Bubble rate of each schedule built for a memory limit at each limit, the baseline's
    as reference (the request's size is bounded by its schema: at most 16 devices, 64
    micro-batches and 512 cells, a few seconds of searches)."""
    times = PassTimes(_times(body.forward), _times(body.backward), _times(body.weight), body.comm)
    sweep = memory_sweep(body.num_devices, body.num_microbatches, times)
    return MemorySweepResult.model_validate(sweep.to_dict())
