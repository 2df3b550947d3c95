"""``benchmarks/schedules.py`` (the README's "Schedules at a glance", run by ``make bench``)
builds every registered family: a family whose parameters it cannot supply would stop
``make bench`` at its first step, as v-adaptive's memory limit once did."""

from __future__ import annotations

import pytest

from planner.schedules import SCHEDULE_NAMES
from planner.simulate import simulate
from tests.unit.helpers import load_benchmark

bench = load_benchmark("schedules")


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_the_benchmark_builds_and_simulates_every_family(name):
    result = simulate(bench.build(name, 4, 16), bench.durations_for(name))
    assert 0.0 <= result.bubble_fraction < 1.0
    if bench.built_for_a_limit(name):
        # Peak activation in micro-batches of the whole model: 1F1B's is 1.0.
        assert max(result.peak_activation) <= bench.ADAPTIVE_LIMIT + 1e-9
        assert bench.label(name) == f"{name} (limit {bench.ADAPTIVE_LIMIT})"
    else:
        assert bench.label(name) == name
