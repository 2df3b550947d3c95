"""Peaks from an in-flight profile: each device's largest moment, rounded to 9 decimals, and
the shortcut that skips ``round`` where it cannot change the value."""

from __future__ import annotations

import math
import random

import pytest

from planner.schedules._inflight import ROUNDING_IS_EXACT_FROM, peak_from_profile


def test_rounding_to_9_decimals_returns_every_double_from_the_threshold_on():
    """From 2**24 on, doubles are more than 2 x 5e-10 apart, so round(x, 9) is x."""
    rng = random.Random(12)
    values = [ROUNDING_IS_EXACT_FROM, math.nextafter(ROUNDING_IS_EXACT_FROM, math.inf)]
    for exponent in range(math.frexp(ROUNDING_IS_EXACT_FROM)[1] - 1, 70):
        low = 2.0**exponent
        values += [low, math.nextafter(2 * low, 0.0)]
        values += [rng.uniform(low, 2 * low) for _ in range(2000)]
    assert [x for x in values if round(x, 9) != x] == []


def test_below_the_threshold_rounding_does_change_some_doubles():
    """The shortcut is not vacuous: between 2**21 and 2**22 (neighbours 4.7e-10 apart) the
    double nearest a 9-decimal rounding is often another one."""
    rng = random.Random(3)
    changed = [x for x in (rng.uniform(2.0**21, 2.0**22) for _ in range(1000)) if round(x, 9) != x]
    assert len(changed) > 100


def test_peaks_are_the_largest_moment_of_each_device_rounded():
    """Counted by hand: thirds leave float dust that the rounding removes, and sizes in
    bytes keep their quarter bytes."""
    third = 1 / 3
    profile = [[{0: 2, 1: 1}, {0: 1, 1: 3}], [{1: 2}], []]
    assert peak_from_profile(profile, [third, third]) == [1.333333333, 0.666666667, 0.0]
    big = 3e9 + 0.25
    assert peak_from_profile(profile, [big, 1e9]) == [2 * big + 1e9, 2e9, 0.0]


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e6, 2.0**24, 1e9])
def test_peaks_equal_rounding_every_moment_total(scale):
    """Random profiles and sizes around the threshold: the same floats as round(peak, 9)
    of the totals summed in the moment's order."""
    rng = random.Random(int(scale * 1000) % 997)
    for _ in range(200):
        stages = rng.randint(1, 6)
        sizes = [rng.uniform(0.0, 3.0) * scale for _ in range(stages)]
        profile = [
            [
                {s: rng.randint(1, 9) for s in sorted(rng.sample(range(stages), held))}
                for held in [rng.randint(1, stages) for _ in range(rng.randint(0, 4))]
            ]
            for _ in range(rng.randint(1, 5))
        ]
        expected = []
        for moments in profile:
            totals = [0.0]
            for moment in moments:
                total = 0.0
                for stage, count in moment.items():
                    total += sizes[stage] * count
                totals.append(total)
            expected.append(round(max(totals), 9))
        assert peak_from_profile(profile, sizes) == expected
