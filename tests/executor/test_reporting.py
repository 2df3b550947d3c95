"""The run report as printed: each rank's row is timed as the headline is."""

from __future__ import annotations

from typing import Any

from executor.reporting import describe
from planner.launch import RunReport


def _step(step: int, wall: float, busy: float, sent: int) -> dict[str, Any]:
    return {
        "step": step,
        "wall_s": wall,
        "busy_s": busy,
        "cpu_s": busy,
        "peak_saved_activation_bytes": 100,
        "bytes_sent": {"1": sent},
        "losses": [],
    }


def test_each_ranks_row_is_the_median_of_the_steps_the_headline_times():
    """A 2BW run of 4 steps: the headline said 'measured 1.8001 s' (the median of steps 1-3
    of the slowest rank) while every rank's row showed its last step, 1.06-1.32 s, the
    drain of a continuous run with half the bytes sent: no row agreed with the headline."""
    walls = [[2.7, 1.9, 1.8, 1.3], [2.6, 1.7, 1.6, 1.1]]
    ranks = [
        {
            "rank": r,
            "dp": 0,
            "pp": r,
            "tp": 0,
            "stages": [r],
            "steps": [
                _step(i, wall, wall - 0.2, 1000 if i < 3 else 500) for i, wall in enumerate(w)
            ],
            "peak_saved_activation_bytes": 100,
            "predicted_saved_activation_bytes": None,
        }
        for r, w in enumerate(walls)
    ]
    report = RunReport.model_validate(
        {
            "config": {
                "schedule": "2bw",
                "t": 1,
                "p": 2,
                "d": 1,
                "micro_batch_size": 1,
                "num_microbatches": 2,
                "precision": "fp32",
                "sequence_parallel": False,
                "recompute_per_stage": [{"none": 1}, {"none": 1}],
                "world_size": 2,
            },
            "continuous": True,
            "first_step": 0,
            "num_steps": 4,
            "predicted": None,
            "measured": {"step_time_s": 1.8, "per_step_s": [2.7, 1.9, 1.8, 1.3]},
            "step_time_error": None,
            "ranks": ranks,
        }
    )
    lines = describe(report).splitlines()
    assert lines[1] == "step time: measured 1.8000 s"
    assert (
        lines[2] == "per rank, the median of steps 1-3 (the steps the measured time is taken over):"
    )
    rows = {int(line.split()[0]): line.split() for line in lines[4:6]}
    # rank, dp, pp, tp, stages, step s, busy s, bubble s, saved, '/', predicted, sent
    assert rows[0][5:8] == ["1.8000", "1.6000", "0.2000"]
    assert rows[1][5:8] == ["1.6000", "1.4000", "0.2000"]
    assert rows[0][-1] == rows[1][-1] == "1000"
