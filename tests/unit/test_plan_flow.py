"""One way through the planner (issue 14): every candidate of a plan is estimated once (per
placement), pricing reuses that estimate, and the contexts the steps share are frozen."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

import planner.costmodel.evaluate as evaluate
import planner.plan as planning
import planner.search.grid as grid
import planner.search.refinement as refinement
from planner.costmodel import PlanContext
from planner.errors import InvalidScheduleError, StagewrightError
from planner.profiles import default_store
from tests.unit.test_search import example

# Every module that calls ``estimate`` while a plan is made.
_CALLERS = (evaluate, grid, refinement, planning)


def _count_estimates(monkeypatch) -> Counter[tuple[str, object]]:
    """Counts calls to ``estimate`` by (candidate, placement it was estimated under)."""
    calls: Counter[tuple[str, object]] = Counter()
    real = evaluate.estimate

    def counted(ctx, config, capacity=float("inf")):
        est = real(ctx, config, capacity)
        calls[(config.model_dump_json(), est.costs.placement)] += 1
        return est

    for module in _CALLERS:
        monkeypatch.setattr(module, "estimate", counted)
    return calls


def test_a_grid_plan_estimates_each_candidate_exactly_once(monkeypatch):
    """1F1B and BPipe: BPipe's fallback check needs 1F1B's estimate at the same point, and
    the top candidates are simulated; neither may estimate a candidate again."""
    calls = _count_estimates(monkeypatch)
    result = planning.plan(example("gpt3-96b-32xa100.json"))
    assert result.best is not None
    repeated = {key: n for key, n in calls.items() if n > 1}
    assert repeated == {}
    # What was estimated is exactly what the plan reports with numbers: the feasible
    # candidates and those rejected for memory (a rejection for another reason has none).
    over_memory = [r for r in result.rejected if r.predicted is not None]
    assert len(calls) == result.stats.feasible + len(over_memory)
    reported = {c.config.model_dump_json() for c in result.candidates}
    assert reported <= {config for config, _ in calls}


def test_a_cpsat_plan_estimates_each_candidate_once_per_placement(monkeypatch):
    """The refinement moves some (t, p, d, schedule) to an optimized placement: their
    candidates are estimated again under it, once, and never under the same one twice."""
    calls = _count_estimates(monkeypatch)
    request = example("gpt3-96b-32xa100.json")
    request = request.model_copy(
        update={"search": request.search.model_copy(update={"method": "cpsat", "top_k": 3})}
    )
    result = planning.plan(request)
    assert result.best is not None
    assert {key: n for key, n in calls.items() if n > 1} == {}
    placements_per_config = Counter(config for config, _ in calls)
    assert max(placements_per_config.values()) <= 2  # the default, and at most one optimized


def test_price_reuses_the_estimate_it_is_given(monkeypatch):
    calls = _count_estimates(monkeypatch)
    request = example("gpt3-96b-32xa100.json")
    ctx = PlanContext.from_store(request, default_store())
    config = planning.plan(request).best.config  # type: ignore[union-attr]
    calls.clear()
    est = evaluate.estimate(ctx, config)
    priced = evaluate.price(ctx, est)
    assert priced.estimate is est
    assert sum(calls.values()) == 1


def test_the_plan_context_is_frozen_and_derived_contexts_leave_it_unchanged():
    request = example("gpt3-96b-32xa100.json")
    ctx = PlanContext.from_store(request, default_store())
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.placements = {}  # type: ignore[misc]
    from planner.placement import place

    key = (2, 8, 2, "1f1b")
    placed = ctx.with_placements({key: place(2, 8, 2, 8, "pair-adjacent")})
    assert ctx.placements == {}
    assert placed.placements[key] == place(2, 8, 2, 8, "pair-adjacent")
    assert placed.request is ctx.request and placed.hardware is ctx.hardware


def test_an_invalid_generated_schedule_is_a_bug_not_a_refusal(monkeypatch):
    """Every schedule a plan prices comes from the registry's generators, so one that breaks
    an IR rule is stagewright's bug: ``plan`` raises it as a plain error (the service then
    answers 500 and logs it) instead of a StagewrightError, which the CLI and the service
    present as the request's fault. (Before, zb-adaptive's warm-up on stages of unequal time
    produced such a schedule, and the service refused the request with its rule.)"""

    def broken(schedule):
        raise InvalidScheduleError(5, "1F3 needs the previous stage's forward")

    monkeypatch.setattr(evaluate, "compile_schedule", broken)
    request = example("gpt3-13b-8xa100.json", schedules=["zb-adaptive"], top_k=1)
    with pytest.raises(RuntimeError, match="bug in stagewright") as raised:
        planning.plan(request)
    assert not isinstance(raised.value, StagewrightError)
    assert "rule 5: 1F3 needs" in str(raised.value)


def test_at_the_same_step_time_synchronous_and_then_less_memory_rank_first():
    """On one GPU every schedule runs the same passes in the same time (up to rounding in
    the last digits); at each time the synchronous ones rank by their memory, and 2BW, which
    changes training for nothing, last. (With 1F1B searched too, it alone is ranked there:
    the next test.)"""
    from tests.unit.test_search import request

    result = planning.plan(
        request(gpus_per_node=1, schedules=["gpipe", "2bw", "zb-adaptive"], sizes=[1, 2])
    )
    by_time: dict[float, list[tuple[str, bool, float]]] = {}
    for c in result.candidates:
        key = round(c.predicted.iteration_time_s, 9)
        by_time.setdefault(key, []).append(
            (c.config.schedule, c.semantics == "stale", c.predicted.peak_memory_gib)
        )
    assert any(len(group) == 3 for group in by_time.values())
    for group in by_time.values():
        assert [(stale, peak) for _, stale, peak in group] == sorted(
            (stale, peak) for _, stale, peak in group
        )
        if len(group) == 3:
            assert group[-1][0] == "2bw"


@pytest.mark.parametrize("example", ["llama3-8b-8xh100.json", "tiny-cpu.json"])
def test_on_one_pipeline_device_1f1b_alone_is_ranked_and_the_rest_say_why(example):
    """p = 1 has no pipeline: GPipe, 2BW and zb-adaptive run the same passes as 1F1B. Checked
    here by pricing each directly (not through the search): the same step time to the
    nanosecond, and no less memory than 1F1B's (one micro-batch in flight). So with 1F1B
    searched, each p = 1 configuration is ranked once, as 1F1B, and the others are rejected
    with the reason."""
    from planner.costmodel import PlanContext, estimate, price
    from planner.profiles import default_store
    from tests.unit.test_search import example as load

    searched = ["1f1b", "gpipe", "2bw", "zb-adaptive"]
    r = load(example, schedules=searched, top_k=1000)
    result = planning.plan(r)
    ctx = PlanContext.from_store(r, default_store())
    single = [c for c in result.candidates if c.config.p == 1]
    assert single and {c.config.schedule for c in single} == {"1f1b"}
    for candidate in single:
        base = candidate.config
        base_time = price(ctx, estimate(ctx, base)).iteration_time_s
        assert candidate.predicted.iteration_time_s == pytest.approx(base_time, rel=1e-12)
        for other in searched[1:]:
            config = base.model_copy(update={"schedule": other})
            if other == "zb-adaptive":  # with the limit the search would build it for
                config, problem = grid._with_memory_limit(ctx, config)
                assert problem is None
            est = estimate(ctx, config)
            assert price(ctx, est).iteration_time_s == pytest.approx(base_time, abs=1e-9)
            assert est.peak_memory >= estimate(ctx, base).peak_memory
            rejected = [
                x.reason
                for x in result.rejected
                if x.config.p == 1
                and x.config.schedule == other
                and (x.config.t, x.config.d, x.config.micro_batch_size, x.config.recompute)
                == (base.t, base.d, base.micro_batch_size, base.recompute)
            ]
            assert rejected == [
                f"p = 1 runs no pipeline: {other} runs the same passes as 1f1b in the same "
                "time with no less memory, and 1f1b is searched, so "
                f"{other} is searched at p >= 2 only"
            ]
