"""The planner turns spare memory into a schedule: v-adaptive and zb-adaptive candidates are
built for exactly what their devices have left for activations."""

from __future__ import annotations

import pytest

from planner.costmodel import PlanContext, stage_costs
from planner.costmodel.adaptive import limit_units
from planner.costmodel.evaluate import device_memory
from planner.costmodel.memory import GIB
from planner.costmodel.shapes import bound_shape
from planner.launch import materialize_launch
from planner.plan import plan
from planner.profiles import default_store
from planner.schedules import Schedule, schedule_family, validate
from planner.schedules._inflight import peak_by_order
from tests.unit.test_search import example, request

ADAPTIVE = ("v-adaptive", "zb-adaptive")


@pytest.fixture(scope="module")
def planned():
    r = request(
        gpus_per_node=8,
        batch=32,
        num_layers=16,
        hidden_size=512,
        seq_length=512,
        schedules=["1f1b", "v-half", "v-zb", *ADAPTIVE],
        recompute=["none", "selective"],
        sizes=[1, 2],
        top_k=1000,
    )
    return r, plan(r)


def test_each_adaptive_candidate_is_built_for_all_the_memory_left(planned):
    r, result = planned
    ctx = PlanContext.from_store(r, default_store())
    capacity = ctx.hardware.usable_memory_gib * GIB
    adaptive = [c for c in result.candidates if c.config.schedule in ADAPTIVE]
    assert adaptive
    for candidate in adaptive:
        config = candidate.config
        family = schedule_family(config.schedule)
        assert config.memory_limit is not None
        assert candidate.predicted.peak_memory_gib * GIB <= capacity
        largest = family.largest_memory_limit(config.p, config.num_microbatches)
        if config.memory_limit < largest:
            # One more stage activation on every device would not fit somewhere.
            units = limit_units(config.schedule, config.p, config.memory_limit) + 1
            costs = stage_costs(ctx, config)
            more, _ = device_memory(
                ctx, config, costs, shape=bound_shape(config.schedule, config.p, units)
            )
            assert max(m.total for m in more) > capacity
        assert any(f"memory limit of {config.memory_limit:.3g}" in n for n in candidate.notes)


def test_the_stored_choice_rebuilds_the_schedule_the_candidate_was_priced_with(planned):
    r, result = planned
    for candidate in result.candidates:
        if candidate.config.schedule not in ADAPTIVE:
            continue
        config = candidate.config
        reference = candidate.launch.executor_config["schedule"]
        assert reference["parameters"]["memory_limit"] == config.memory_limit
        assert "choice" in reference
        launch = materialize_launch(r, candidate)
        schedule = validate(Schedule.from_dict(launch.executor_config["schedule"]))
        assert schedule.name == config.schedule
        assert schedule.num_microbatches == config.num_microbatches
        units = limit_units(config.schedule, config.p, config.memory_limit)
        stages = schedule.num_stages
        assert max(peak_by_order(schedule, [1.0] * stages)) <= units + 1e-9


def test_the_96b_plan_shows_the_limit_and_the_gain_over_the_best_fixed_schedule():
    """Issue 13: a plan for GPT-3 96B on 32 A100-80G shows, per adaptive candidate, the
    limit chosen and what it gained over the best fixed schedule of its layout."""
    result = plan(
        example(
            "gpt3-96b-32xa100.json",
            schedules=["1f1b", "bpipe", "v-half", "v-zb", *ADAPTIVE],
            recompute=["selective"],
            micro_batch_sizes=[1],
        )
    )
    rows = {row.schedule: row for row in result.by_schedule}
    fixed = min(rows[n].best_iteration_time_s for n in ("1f1b", "v-half", "v-zb"))
    assert rows["v-adaptive"].best_iteration_time_s <= fixed * (1 + 1e-9)
    notes = [n for c in result.candidates for n in c.notes if "best fixed schedule" in n]
    assert notes and all("throughput" in n for n in notes)
