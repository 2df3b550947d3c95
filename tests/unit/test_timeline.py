"""A candidate's timeline (``stagewright plan --timeline``, the dashboard's Gantt chart) draws
the schedule the plan priced and the executor runs, next to the plan's own step time."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cli.main import main
from planner.launch.config import ScheduleReference
from planner.plan import plan
from planner.search.timeline import candidate_timeline
from planner.specs import PlanRequest

TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny-cpu.json"


def _request(schedule: str) -> dict[str, object]:
    data = json.loads(TINY.read_text())
    data["search"] = {
        "schedules": [schedule],
        "allow_stale_weights": schedule == "2bw",
        "micro_batch_sizes": [1],
        "top_k": 5,
    }
    data["cluster"].update(gpus_per_node=4)
    data["model"]["num_layers"] = 16
    return data


@pytest.mark.parametrize("schedule", ["v-adaptive", "zb-adaptive", "1f1b"])
def test_the_timeline_draws_what_the_executor_runs(schedule):
    request = PlanRequest.model_validate(_request(schedule))
    result = plan(request)
    chosen = next(c for c in result.candidates if c.config.p > 1)
    timeline = candidate_timeline(request, chosen.config)

    # The executor rebuilds the schedule from the plan's reference (an adaptive family's
    # choice included, without searching again): the same passes in the same order.
    reference = ScheduleReference.model_validate(chosen.launch.executor_config["schedule"])
    built = reference.build()
    for device, drawn in zip(timeline["devices"], built.actions, strict=True):
        expected = [[a.kind.value, a.stage, a.microbatch] for a in drawn if a.kind.is_compute]
        actions = sorted(device["actions"], key=lambda a: (a[3], a[4]))
        assert [a[:3] for a in actions] == expected
    assert timeline["step_time_s"] == pytest.approx(chosen.predicted.iteration_time_s)
    for device, total in zip(
        timeline["devices"], chosen.predicted.memory_gib_per_device, strict=True
    ):
        assert device["memory"]["total"] == pytest.approx(total, abs=0.01)


def test_the_cli_draws_an_adaptive_schedule_and_states_the_plans_step(
    capsys, monkeypatch, tmp_path
):
    monkeypatch.setenv("COLUMNS", "120")
    path = tmp_path / "request.json"
    path.write_text(json.dumps(_request("v-adaptive")))
    assert main(["plan", str(path), "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["best"]
    assert main(["plan", str(path), "--timeline"]) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^dev (\d+) +\|([^|]+)\|$", out, flags=re.M)
    assert [int(d) for d, _ in rows] == list(range(best["config"]["p"]))
    step = re.search(r"the plan's step time ([0-9.]+) s", out)
    assert step is not None
    assert float(step.group(1)) == pytest.approx(best["predicted"]["iteration_time_s"], rel=1e-3)
