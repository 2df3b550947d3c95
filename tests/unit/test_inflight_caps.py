"""The search counts in-flight micro-batches on a schedule built with ``inflight_microbatches``
micro-batches: that must give the profile of the schedule built with all of them."""

from __future__ import annotations

import pytest

from planner.costmodel.shapes import (
    _built_shape,
    inflight_microbatches,
    schedule_shape,
    shape_profile,
)
from planner.schedules import families, generate, schedule_family
from planner.schedules._inflight import InflightProfile, inflight_profile

DEVICES = (2, 3, 4, 5, 8, 13, 16, 32)


def _normal(profile: InflightProfile) -> list[list[tuple[tuple[int, int], ...]]]:
    return [sorted(tuple(sorted(moment.items())) for moment in moments) for moments in profile]


def _whole(schedule: str, p: int, m: int) -> InflightProfile:
    built = generate(schedule, p, m, check=False)
    return inflight_profile(built)


def _counts_beyond_the_cap(schedule: str, p: int) -> list[int]:
    """Micro-batch counts past the cap (where the capped profile stands in for the whole),
    near it and well beyond it; only counts the schedule accepts."""
    cap = inflight_microbatches(schedule, p, 10**6)
    counts = {cap + 1, cap + 2, cap + p // 2 + 1, 2 * cap + 1, 3 * p + 1}
    if schedule_family(schedule).microbatches_multiple_of_devices:
        counts = {-(-c // p) * p for c in counts}
    return sorted(c for c in counts if c > cap)


@pytest.mark.parametrize(
    "schedule, p",
    [(f.name, p) for f in families() if f.inflight_saturation is not None for p in DEVICES]
    + [("bpipe", 48), ("bpipe", 64)],
)
def test_the_profile_stops_changing_at_the_cap(schedule, p):
    for m in _counts_beyond_the_cap(schedule, p):
        assert inflight_microbatches(schedule, p, m) < m
        assert _normal(shape_profile(schedule, p, m)) == _normal(_whole(schedule, p, m)), m
        # ... and the same peak micro-batches per device that the memory breakdown reports.
        assert schedule_shape(schedule, p, m).in_flight == _built_shape(schedule, p, m).in_flight


@pytest.mark.parametrize("p", DEVICES)
def test_gpipe_holds_every_micro_batch_on_every_device(p):
    for m in (1, 2, p, 3 * p + 1):
        expected = [[{device: m}] for device in range(p)]  # one stage per device, all m saved
        assert shape_profile("gpipe", p, m) == expected
        assert schedule_shape("gpipe", p, m).in_flight == (m,) * p
        assert _whole("gpipe", p, m) == expected


@pytest.mark.parametrize("v", [3, 4, 8])
@pytest.mark.parametrize("p", (2, 3, 4, 5, 8, 16))
def test_interleaveds_cap_holds_for_every_chunk_count(p, v):
    """Interleaved's cap (2p) is given per p: its warm-up of 2(p - 1) + (v - 1)p forwards
    spans fewer than two groups of p micro-batches (p v chunk-forwards each) for every v, so
    the profile also stops changing at 2p with more chunks than the default two."""
    for m in _counts_beyond_the_cap("interleaved", p):
        whole = inflight_profile(generate("interleaved", p, m, check=False, num_chunks=v))
        assert _normal(shape_profile("interleaved", p, m, v)) == _normal(whole), m
        capped = schedule_shape("interleaved", p, m, v).in_flight
        assert capped == _built_shape("interleaved", p, m, v).in_flight
