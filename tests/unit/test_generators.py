"""Property tests over every generator: valid, complete, and runnable as simulated."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.errors import ScheduleConfigError
from planner.schedules import SCHEDULE_NAMES, generate, schedule_family, validate
from planner.simulate import Durations, simulate
from tests.unit.helpers import assert_complete, assert_dependencies_hold, generate_any

PROPERTY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _searchable(name: str, devices: int) -> int:
    """Families that search by pass times build hundreds of candidates per schedule: keep
    their property runs to pipelines of at most 8 devices (the adaptive tests go further)."""
    return min(devices, 8) if schedule_family(name).uses_pass_times else devices


def _microbatches(name: str, devices: int, draw_factor: int) -> int:
    """A micro-batch count the schedule accepts, from a small multiplier."""
    family = schedule_family(name)
    if family.microbatches_multiple_of_devices:
        return devices * draw_factor
    if family.microbatches_at_least_devices:
        return devices + draw_factor - 1
    return draw_factor * 2 - 1 if draw_factor > 1 else 1


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
@PROPERTY
@given(
    devices=st.integers(2, 32),
    factor=st.integers(1, 4),
    forward=st.floats(0.1, 3.0),
    backward=st.floats(0.1, 3.0),
    weight=st.floats(0.0, 3.0),
    comm=st.sampled_from([0.0, 0.05, 0.5]),
)
def test_every_schedule_is_valid_complete_and_respects_dependencies(
    name, devices, factor, forward, backward, weight, comm
):
    devices = _searchable(name, devices)
    microbatches = _microbatches(name, devices, factor)
    schedule = generate_any(name, devices, microbatches)  # validates
    validate(schedule)
    assert_complete(schedule)
    result = simulate(
        schedule, Durations(forward, backward, weight, comm=comm, transfer=forward / 2)
    )
    assert_dependencies_hold(result, comm)
    # Nothing is lost or invented: every device is busy exactly its share of the work.
    per_device_work = [
        sum(forward + (backward + weight) for a in acts if a.kind.value == "F")
        for acts in schedule.actions
    ]
    for stats, work in zip(result.devices, per_device_work, strict=True):
        assert stats.busy == pytest.approx(work)
    assert result.makespan >= max(per_device_work) - 1e-9


@pytest.mark.parametrize(
    "name, devices, microbatches, message",
    [
        ("interleaved", 4, 6, "must be a multiple of the number of devices"),
        ("2bw", 4, 3, "at least as many micro-batches per batch as devices"),
        ("v-half", 1, 4, "at least 2 devices"),
        ("1f1b", 0, 4, "at least 1"),
        ("gpipe", 4, 0, "at least 1"),
        ("bpipe", 1, 4, "at least 2 devices"),
        ("zb-h9", 4, 4, "unknown schedule"),
    ],
)
def test_invalid_combinations_say_what_to_change(name, devices, microbatches, message):
    with pytest.raises(ScheduleConfigError, match=message):
        generate(name, devices, microbatches)


def test_interleaved_rejects_a_single_chunk():
    with pytest.raises(ScheduleConfigError, match="at least 2 chunks"):
        generate("interleaved", 4, 8, num_chunks=1)


def test_schedules_with_fewer_microbatches_than_devices_still_run():
    for name in ("gpipe", "1f1b", "bpipe", "v-min", "v-half", "v-zb"):
        schedule = generate(name, 8, 3)
        assert_complete(schedule)


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
@PROPERTY
@given(
    devices=st.integers(2, 16),
    factor=st.integers(1, 4),
    backward=st.floats(0.2, 3.0),
    weight=st.floats(0.0, 2.0),
    transfer=st.floats(0.05, 4.0),
    sizes_seed=st.integers(0, 2**16),
)
def test_in_flight_counts_from_the_order_equal_the_simulated_peaks(
    name, devices, factor, backward, weight, transfer, sizes_seed
):
    """The search counts saved activations from each device's order alone; that must give
    the simulator's peaks for any durations and any per-stage sizes."""
    import random

    from planner.schedules._inflight import peak_by_order

    devices = _searchable(name, devices)
    schedule = generate_any(name, devices, _microbatches(name, devices, factor))
    rng = random.Random(sizes_seed)
    sizes = [rng.uniform(0.1, 2.0) for _ in range(schedule.num_stages)]
    simulated = simulate(
        schedule, Durations(1.0, backward, weight, comm=0.1, transfer=transfer), activation=sizes
    ).peak_activation
    assert peak_by_order(schedule, sizes) == pytest.approx(simulated, abs=1e-6)
