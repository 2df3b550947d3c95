"""The NumPy helpers of the search's hot paths."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from planner._arrays import sorted_distinct

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("size", [0, 1, 2, 7, 100, 1000])
def test_sorted_distinct_is_numpys_unique(size):
    rng = np.random.default_rng(size)
    for values in (rng.integers(-5, 6, size), rng.integers(0, 10**12, size), np.zeros(size, int)):
        got = sorted_distinct(values)
        assert got.dtype == values.dtype
        assert got.tolist() == np.unique(values).tolist()


def test_a_plan_does_not_import_numpy_ma():
    """``np.unique`` imports ``numpy.ma`` on its first call, a fiftieth of a second of every
    fresh ``stagewright plan``: a plan over every schedule family it builds avoids it."""
    script = (
        "import json, sys\n"
        "from planner.plan import plan\n"
        "from planner.specs import PlanRequest\n"
        "request = json.load(open('examples/gpt3-96b-32xa100.json'))\n"
        "del request['search']['schedules']\n"
        "plan(PlanRequest.model_validate(request))\n"
        "print('numpy.ma' in sys.modules)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert run.stdout.strip() == "False"
