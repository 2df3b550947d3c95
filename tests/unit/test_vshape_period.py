"""Long runs of V-Min, V-Half and V-ZB are made from one build by inserting periods
(:mod:`planner.schedules._vperiod`): the orders must be exactly those of the full build, from
each family's threshold (``periodic_from``) on, as the in-flight caps are checked in
test_inflight_caps.py."""

from __future__ import annotations

import numpy as np
import pytest

from planner.schedules import generate
from planner.schedules._vcolumns import to_schedule
from planner.schedules._vframe import build_orders, build_stages
from planner.schedules._vperiod import insertion_cut, periodic_orders
from planner.schedules._vshape import (
    VSHAPE_NAMES,
    _periodic,
    block_offsets,
    periodic_from,
    require_block,
)

DEVICES = (2, 3, 4, 5, 8, 13, 16, 32)


def _cells(name: str, p: int) -> list[list[int]]:
    return require_block(block_offsets(name, p).block(p), name)


@pytest.mark.parametrize("name, p", [(n, p) for n in VSHAPE_NAMES for p in DEVICES])
def test_inserted_periods_give_the_full_build(name, p):
    periodic = _periodic(name, p)
    assert periodic is not None, "the build at the threshold shows no period to insert"
    cells = _cells(name, p)
    for m in range(periodic_from(name, p), 3 * p + 5):
        assert periodic.orders(m).tolist() == build_orders(cells, m), m


@pytest.mark.parametrize("name, p", [(n, p) for n in VSHAPE_NAMES for p in (48, 64)])
def test_inserted_periods_on_large_pipelines(name, p):
    periodic = _periodic(name, p)
    assert periodic is not None
    cells = _cells(name, p)
    start = periodic_from(name, p)
    for m in (start, start + 1, start + 7):
        assert periodic.orders(m).tolist() == build_orders(cells, m), m


@pytest.mark.parametrize("name, p", [(n, p) for n in VSHAPE_NAMES for p in DEVICES])
def test_the_threshold_is_the_first_build_that_shows_the_period(name, p):
    """One micro-batch fewer and the run check finds no cut: the warm-up is not done, or
    the cool-down has begun, where a period would go."""
    assert periodic_orders(_cells(name, p), periodic_from(name, p) - 1) is None


def test_the_run_check_refuses_orders_whose_cells_do_not_repeat():
    """The check reads the cool-down's squeeze: where one device's cells stop stepping by
    one period (here each kept pass of the last device after its first period one cell
    later than the one before), there is no cut."""
    name, p = "v-zb", 8
    m = periodic_from(name, p)
    cells = _cells(name, p)
    stages = build_stages(cells, m)
    assert insertion_cut(cells, m, stages) is not None
    squeezed = stages.squeezed.copy()
    last = stages.filled[-1]
    later = last[6:]
    later = later[squeezed[later] >= 0]
    squeezed[later] += np.arange(1, len(later) + 1)
    assert insertion_cut(cells, m, stages._replace(squeezed=squeezed)) is None


@pytest.mark.parametrize("name", VSHAPE_NAMES)
def test_a_long_run_is_the_same_schedule(name):
    """The generator takes the inserted orders past the threshold: the same schedule, to
    the byte, as one made from the full build."""
    p, m = 8, 3 * 8 + 2
    assert m > periodic_from(name, p)
    built = generate(name, p, m)
    full = to_schedule(name, build_orders(_cells(name, p), m), m, dict(built.meta))
    assert built.to_json() == full.to_json()


def test_orders_before_the_threshold_are_refused():
    periodic = _periodic("v-half", 4)
    assert periodic is not None
    with pytest.raises(ValueError):
        periodic.orders(periodic.microbatches - 1)
    assert not periodic.labels.flags.writeable  # a cached build is shared
    assert np.array_equal(
        periodic.orders(periodic.microbatches),
        build_stages(_cells("v-half", 4), periodic.microbatches).orders,
    )
