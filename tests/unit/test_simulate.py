"""The simulator's contract: inputs it refuses, and what it reports."""

from __future__ import annotations

import pytest

from planner.errors import SimulationError
from planner.schedules import generate
from planner.simulate import Durations, simulate


@pytest.mark.parametrize(
    "durations, message",
    [
        (Durations([1.0, 1.0], 1.0), "got 2 values for 4 stages"),
        (Durations(-1.0, 1.0), "finite and >= 0"),
        (Durations(1.0, float("nan")), "finite and >= 0"),
        (Durations(1.0, 1.0, comm=-0.1), "comm time"),
        (Durations(1.0, 1.0, transfer=float("inf")), "transfer time"),
    ],
)
def test_bad_durations_are_refused_with_the_reason(durations, message):
    with pytest.raises(SimulationError, match=message):
        simulate(generate("1f1b", 4, 4), durations)


def test_activation_sizes_must_match_stages():
    with pytest.raises(SimulationError, match="activation sizes"):
        simulate(generate("1f1b", 4, 4), Durations(1.0, 1.0), activation=[1.0])


def test_custom_activation_sizes_scale_the_curve():
    # Stage 0 saves 10 units per micro-batch and holds 4 of them under 1F1B.
    result = simulate(generate("1f1b", 4, 8), Durations(1.0, 2.0), activation=[10.0, 1.0, 1.0, 1.0])
    assert result.peak_activation == pytest.approx([40.0, 3.0, 2.0, 1.0])


def test_contract_json_has_exactly_the_documented_keys():
    result = simulate(generate("v-zb", 4, 8), Durations(1.0, 1.0, 1.0))
    data = result.to_contract()
    assert set(data) == {"makespan", "bubble_fraction", "peak_activation_fraction", "devices"}
    assert len(data["devices"]) == 4
    assert set(data["devices"][0]) == {"start", "end", "busy"}
    busiest = max(d["busy"] for d in data["devices"])
    assert data["bubble_fraction"] == pytest.approx(1 - busiest / data["makespan"])


def test_optimizer_step_time_is_charged_once_per_stage():
    base = simulate(generate("1f1b", 2, 2), Durations(1.0, 2.0)).makespan
    with_step = simulate(generate("1f1b", 2, 2), Durations(1.0, 2.0, optimizer=0.5)).makespan
    assert with_step == pytest.approx(base + 0.5)


def test_device_span_ignores_bookkeeping_markers():
    # BPipe acceptors carry zero-time mirrors; the device starts at its first real work.
    result = simulate(generate("bpipe", 4, 8), Durations(1.0, 2.0, transfer=0.5))
    assert [d.start for d in result.devices] == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("name", ["bpipe", "v-zb", "2bw"])
def test_a_compiled_schedule_times_the_same_and_timing_only_skips_memory(name):
    from planner.schedules._engine import compile_schedule

    schedule = generate(name, 4, 8)
    durations = Durations(1.0, 1.5, 0.5, comm=0.1, transfer=0.3)
    full = simulate(schedule, durations)
    quick = simulate(compile_schedule(schedule), durations, track_memory=False)
    assert quick.schedule is schedule
    assert (quick.start, quick.end, quick.makespan) == (full.start, full.end, full.makespan)
    assert quick.devices == full.devices
    assert quick.memory == [] and quick.peak_activation == []
    assert full.peak_activation and max(full.peak_activation) > 0
