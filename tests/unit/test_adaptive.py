"""v-adaptive and zb-adaptive against the V-shape paper's statements (Appendices A and B,
Figures 9 and 10) and the zero bubble paper's ZB-1P / ZB-2P."""

from __future__ import annotations

from itertools import product

import numpy as np
import pytest

from planner.costmodel.evaluate import (
    EXACT_MEMORY_RUNS,
    device_memory,
    estimate,
    price,
    timing_microbatches,
)
from planner.costmodel.shapes import shape_of
from planner.errors import ScheduleConfigError
from planner.launch import ExecutorConfig, materialize_launch
from planner.plan import plan
from planner.schedules import PassTimes, _vadaptive, generate
from planner.schedules._inflight import inflight_profile
from planner.schedules._vadaptive import (
    _pass_durations,
    _peaks,
    _space,
    _split_rows,
    _units,
    smallest_v_limit,
    v_adaptive_choice,
)
from planner.schedules._vframe import (
    VBlock,
    build_orders,
    finish_times,
    order_peaks,
    repeated_ids,
    time_orders,
)
from planner.simulate import Durations, simulate
from planner.specs import PlanRequest
from tests.unit.test_costmodel import context

# Table 5 (Appendix D.2): F, B and W of one V stage, in ms.
TABLE_5 = {
    "9.6B mb4": (12.96, 13.22, 9.76),
    "21B mb2": (9.30, 9.47, 7.19),
    "38.5B mb1": (6.72, 6.89, 5.06),
}
SWEEP = [0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.8, 0.9, 1.0, 1.1, 1.5, 2.0]


def _v(d: int, m: int, limit: float, times: tuple[float, float, float]):
    schedule = generate("v-adaptive", d, m, memory_limit=limit, times=PassTimes(*times))
    return simulate(schedule, Durations(*times))


def _zb(d: int, m: int, limit: float, times: tuple[float, float, float]):
    """zb-adaptive has one stage a device: twice a V stage's layers, twice its times."""
    doubled = tuple(2 * t for t in times)
    schedule = generate("zb-adaptive", d, m, memory_limit=limit, times=PassTimes(*doubled))
    return simulate(schedule, Durations(*doubled))


def _sweep(d: int, m: int, times: tuple[float, float, float]) -> list[tuple[float, float]]:
    return [
        (limit, _v(d, m, limit, times).bubble_fraction)
        for limit in SWEEP
        if limit >= smallest_v_limit(d, m)
    ]


@pytest.mark.parametrize("times", list(TABLE_5.values()), ids=list(TABLE_5))
def test_the_bubble_never_rises_as_the_limit_grows_and_drops_just_above_one_half(times):
    """Appendix B / Figure 9: the bubble rate falls as the limit rises, with a sudden drop
    just above about 1/2 of 1F1B's memory, where V-Min's repeating bubble disappears."""
    d, m = 8, 32
    sweep = _sweep(d, m, times)
    bubbles = [b for _, b in sweep]
    assert all(b2 <= b1 + 1e-12 for b1, b2 in zip(bubbles, bubbles[1:], strict=False))
    drops = [(b1 - b2, hi) for (_, b1), (hi, b2) in zip(sweep, sweep[1:], strict=False)]
    biggest, at = max(drops)
    assert 0.5 < at <= 0.7
    assert biggest > 0.5 * (bubbles[0] - bubbles[-1])  # one drop is most of the whole fall


def test_below_the_drop_the_bubble_repeats_every_micro_batch_and_above_it_does_not():
    """Figure 5(a): with the least memory the idle time grows with the micro-batches (a
    bubble every repeating interval); above about 1/2 it stays the same."""
    d, times = 8, TABLE_5["9.6B mb4"]

    def idle(limit: float, m: int) -> float:
        result = _v(d, m, limit, times)
        return result.makespan - max(x.busy for x in result.devices)

    assert idle(0.5, 64) - idle(0.5, 32) > 8 * times[0]
    assert idle(0.7, 64) == pytest.approx(idle(0.7, 32), rel=1e-9)


@pytest.mark.parametrize("times", list(TABLE_5.values()), ids=list(TABLE_5))
@pytest.mark.parametrize("d", [8, 16])
def test_no_worse_than_v_half_and_v_zb_at_their_memory(times, d):
    """Appendix A's search covers V-Half's and V-ZB's memory: at V-Half's peak it is no
    worse than V-Half, and at 1F1B's (V-ZB's) no worse than V-ZB."""
    m = 4 * d
    for name in ("v-half", "v-zb"):
        fixed = simulate(generate(name, d, m), Durations(*times))
        limit = max(fixed.peak_activation)
        adaptive = _v(d, m, limit, times)
        assert max(adaptive.peak_activation) <= limit + 1e-9
        assert adaptive.bubble_fraction <= fixed.bubble_fraction + 1e-9, name


@pytest.mark.parametrize("times", list(TABLE_5.values()), ids=list(TABLE_5))
def test_v_adaptive_has_fewer_bubbles_than_zb_adaptive_at_equal_memory(times):
    """Figure 10: the V scheduler below the zero bubble scheduler at every memory limit
    both reach, with 1F1B as the reference above both."""
    d, m = 8, 32
    reference = simulate(generate("1f1b", d, m), Durations(*(2 * t for t in times)))
    for limit in (0.75, 1.0, 1.5, 2.0):
        v = _v(d, m, limit, times)
        zb = _zb(d, m, limit, times)
        assert max(zb.peak_activation) <= limit + 1e-9
        assert v.bubble_fraction < zb.bubble_fraction, limit
    assert _zb(d, m, 1.0, times).bubble_fraction < reference.bubble_fraction


def test_zb_1p_and_2p_keep_their_memory_and_2p_has_fewer_bubbles():
    """Qi et al. 2023: ZB-1P holds 1F1B's activation memory, ZB-2P twice it, with fewer
    bubbles; both far below 1F1B's."""
    d, m, times = 8, 32, (2 * 12.96, 2 * 13.22, 2 * 9.76)
    one = simulate(
        generate("zb-adaptive", d, m, memory_limit=1, times=PassTimes(*times)), Durations(*times)
    )
    two = simulate(
        generate("zb-adaptive", d, m, memory_limit=2, times=PassTimes(*times)), Durations(*times)
    )
    plain = simulate(generate("1f1b", d, m), Durations(*times))
    assert max(one.peak_activation) <= 1.0 + 1e-9 < max(two.peak_activation) <= 2.0 + 1e-9
    assert two.bubble_fraction < one.bubble_fraction < plain.bubble_fraction / 1.5


@pytest.mark.parametrize("d", [2, 3, 4, 5])
def test_each_blocks_peak_is_the_peak_of_its_repeated_orders(d):
    """The peaks the search screens by (worked out per cell residue from the lifespans,
    bounded by m) are what a device of the repeated block holds at most, counted off its
    orders: for every block of the space and every m from 1 (where m bounds every
    lifespan's count) to past where it bounds none."""
    space = _space(d)
    for m in range(1, 3 * d + 3):
        counted = [
            max(order_peaks(repeated_ids(space.cells[i : i + 1], m)[0]))
            for i in range(len(space.blocks))
        ]
        assert _peaks(d, m).tolist() == counted, m


@pytest.mark.parametrize(
    "d, m, times",
    [
        (4, 16, (12.96, 13.22, 9.76)),
        (6, 24, (1.0, 1.0, 1.0)),
        (8, 32, (1.0, 1.5, 0.5)),
        (8, 32, (1.0, 1.0, 0.2)),
    ],
)
def test_the_narrowed_search_finds_what_the_exhaustive_search_finds(d, m, times):
    """The search builds in full only the fastest few of its two highest memory levels
    (module docstring); building and timing every block within the limit gives the same
    step time."""
    pass_times = PassTimes(*times)
    durations = _pass_durations(pass_times, d)
    space, peaks = _space(d), _peaks(d, m)
    for limit in (0.45, 0.55, 0.7, 0.9, 1.0):
        if limit < smallest_v_limit(d, m):
            continue
        best = min(
            max(time_orders(build_orders(space.cells[i].tolist(), m), m, durations)[1])
            for i in np.flatnonzero(peaks <= _units(limit, d))
        )
        chosen = v_adaptive_choice(d, m, limit, pass_times)
        assert chosen.makespan == pytest.approx(best, rel=1e-12), limit


def test_a_search_does_not_depend_on_the_searches_before_it():
    """The blocks a search builds are shared between searches (only their timing depends
    on the pass times): a search after others under other times chooses what it chooses in
    a fresh process."""
    d, m, limit = 6, 24, 0.6
    first, second = PassTimes(1.0, 1.5, 0.5, 0.05), PassTimes(1.0, 1.0, 0.2, 0.3)
    _caches_cleared()
    fresh = v_adaptive_choice(d, m, limit, second)
    _caches_cleared()
    v_adaptive_choice(d, m, limit, first)
    after = v_adaptive_choice(d, m, limit, second)
    assert (after.block, after.makespan, after.peak_units) == (
        fresh.block,
        fresh.makespan,
        fresh.peak_units,
    )
    assert [list(o) for o in after.orders] == [list(o) for o in fresh.orders]


@pytest.mark.parametrize("d", [2, 3, 4, 5, 6, 7, 11, 36])
def test_the_search_space_is_every_block_that_does_not_collide(d):
    """_space tells the collision-free blocks from the residues of their down vectors (and
    works out only their cells): against VBlock.cells, block by block, it holds every block
    of Appendix A's space (down vectors x turn triples, in search order) that does not
    collide once repeated, and nothing else, with those cells (every d mod 6, and split
    rows thinned out past 34 devices)."""
    offsets = range(1, 6)
    downs = [(hi,) * (d - 1) for hi in offsets] + [
        (hi,) * k + (lo,) * (d - 1 - k)
        for hi in offsets
        for lo in range(1, hi)
        for k in _split_rows(d)
    ]
    searched = [
        VBlock(down, (1,) * (d - 1), *turns)
        for turns in product(offsets, repeat=3)
        for down in downs
    ]
    expected = [(block, block.cells()) for block in searched if block.cells() is not None]
    space = _space(d)
    assert space.blocks == [block for block, _ in expected]
    assert space.cells.tolist() == [cells for _, cells in expected]


@pytest.mark.parametrize("d, m", [(2, 1), (3, 5), (6, 16), (9, 7)])
def test_timing_a_stack_of_orders_gives_each_ones_finishing_times(d, m):
    """The screening times its blocks as one stack (finish_times): every device finishes
    when time_orders, timing each block alone, says, to the last bit, with zero pass times
    and communication too; orders that deadlock raise as there."""
    rng = np.random.default_rng(d * 100 + m)
    cells = _space(d).cells
    picked = rng.choice(len(cells), size=min(len(cells), 40), replace=False)
    orders = [build_orders(cells[i].tolist(), m) for i in picked]
    for comm in (0.0, 0.3):
        durations = rng.choice([0.0, 0.5, 1.0, 1.3, 2.0], size=6 * d).tolist()
        stacked = finish_times(np.asarray(orders), m, durations, comm)
        for one, timed in zip(orders, stacked, strict=True):
            assert timed.tolist() == time_orders(one, m, durations, comm)[1]
    stuck = np.asarray([[row[::-1] for row in orders[0]]])
    with pytest.raises(ScheduleConfigError, match="deadlock"):
        finish_times(stuck, m, [1.0] * 6 * d)


def test_the_shared_screened_blocks_stay_bounded_and_searches_unchanged(monkeypatch):
    """Searches of one (d, m) under many limits share their built blocks up to a bound: past
    it the shared store starts again, and a search then chooses what it chooses fresh."""
    d, m, times = 6, 24, PassTimes(1.0, 1.5, 0.5, 0.05)
    limits = (0.5, 0.6, 0.75, 0.9)
    _caches_cleared()
    fresh = [v_adaptive_choice(d, m, limit, times) for limit in limits]
    _caches_cleared()
    monkeypatch.setattr(_vadaptive, "_SCREEN_ORDERS_KEPT", 40)
    bounded = []
    for limit in limits:
        _vadaptive._choose.cache_clear()
        _vadaptive._screened.cache_clear()
        choice = v_adaptive_choice(d, m, limit, times)
        bounded.append(choice)
        # At most the bound, or this search's own blocks when it alone screens more.
        kept = len(_vadaptive._screen_orders(d, min(m, _vadaptive.SCREEN_MICROBATCHES)))
        assert 0 < kept <= max(40, choice.evaluated)
    for one, other in zip(fresh, bounded, strict=True):
        assert (one.block, one.makespan, one.peak_units) == (
            other.block,
            other.makespan,
            other.peak_units,
        )
    _caches_cleared()


def _caches_cleared() -> None:
    for cached in (
        _vadaptive._choose,
        _vadaptive._screened,
        _vadaptive._screen_orders,
        _vadaptive._block_orders,
    ):
        cached.cache_clear()


def test_the_limit_holds_on_every_device_for_any_times():
    rng = np.random.default_rng(7)
    d, m = 6, 20
    for _ in range(6):
        f = rng.uniform(0.5, 2.0, 2 * d).round(3)
        times = PassTimes(tuple(f), tuple(f * rng.uniform(0.8, 1.3)), tuple(f * 0.7), 0.1)
        limit = float(rng.uniform(0.45, 1.2))
        schedule = generate("v-adaptive", d, m, memory_limit=limit, times=times)
        result = simulate(schedule, Durations(times.forward, times.backward, times.weight))
        assert max(result.peak_activation) <= limit + 1e-9


def test_zb_adaptive_is_a_valid_schedule_when_stages_take_unequal_times():
    """A fast stage after a slow one fits more warm-up forwards before the first backward
    reaches it than its predecessor does; if it runs them, it runs forwards whose input does
    not exist yet (the authors' warm-up rule lets a stage keep that many when they are all m
    of them). Every stage must run no more warm-up forwards than the stage before it:
    ``generate`` validates the result against the IR's rules, and the limit still holds.
    The first case is the smallest the rule broke on; the random ones are what the planner
    passes (heavier middle stages, lighter end stages, uneven B and W, a hop)."""
    cases = [(3, 5, (2.0, 1.0, 2.0), (2.0, 1.0, 2.0), (2.0, 1.0, 2.0), 0.0, 2.0)]
    rng = np.random.default_rng(11)
    for _ in range(40):
        p = int(rng.integers(2, 9))
        m = int(rng.integers(2, 3 * p + 1))
        f = tuple(rng.choice([0.5, 1.0, 2.0, 3.0], p).tolist())
        b = tuple((np.array(f) * rng.uniform(0.8, 1.3, p)).round(3).tolist())
        w = tuple((np.array(f) * rng.uniform(0.4, 1.0, p)).round(3).tolist())
        cases.append((p, m, f, b, w, float(rng.choice([0.0, 0.1])), float(rng.uniform(0.3, 2.5))))
    built = 0
    for p, m, f, b, w, comm, limit in cases:
        times = PassTimes(f, b, w, comm)
        try:
            schedule = generate("zb-adaptive", p, m, memory_limit=limit, times=times)
        except ScheduleConfigError as error:  # a limit below one forward, or none fits
            assert "memory_limit" in str(error)
            continue
        built += 1
        result = simulate(schedule, Durations(f, b, w, comm=comm))
        assert max(result.peak_activation) <= limit + 1e-9
    assert built >= 30


def test_a_limit_no_schedule_reaches_names_the_smallest():
    smallest = smallest_v_limit(8, 32)
    with pytest.raises(
        ScheduleConfigError, match=f"smallest feasible memory_limit is {smallest:.4g}"
    ):
        generate("v-adaptive", 8, 32, memory_limit=smallest - 0.01)
    generate("v-adaptive", 8, 32, memory_limit=smallest)  # exactly it is fine
    with pytest.raises(ScheduleConfigError, match="smallest feasible memory_limit is 0.125"):
        generate("zb-adaptive", 8, 32, memory_limit=0.1)
    with pytest.raises(ScheduleConfigError, match="v-half has no parameter memory_limit"):
        generate("v-half", 8, 32, memory_limit=0.5)
    with pytest.raises(ScheduleConfigError, match="v-adaptive needs memory_limit"):
        generate("v-adaptive", 8, 32)


def test_the_smallest_limit_is_about_a_third_of_1f1b():
    """V-Min's memory (Table 1): the least the V family reaches, about M/3 plus a constant."""
    for d in (8, 16, 32):
        assert 1 / 3 <= smallest_v_limit(d, 4 * d) <= 1 / 3 + 2.5 / d


def test_a_searched_schedules_memory_is_that_of_the_schedule_that_runs():
    """The planner simulates 3p + 2 micro-batches for the step time and counted the memory of
    a schedule searched for a memory limit from those too. Under a generous limit a device
    keeps more micro-batches the more there are: zb-adaptive with p = 2, 12 micro-batches and
    limit 6 (12 stage activations) keeps all 12 on device 0 (the executor measured 2,174,976
    bytes there against 1,443,840 predicted from the 8 simulated). The memory is now counted
    from the schedule the launch builds, for every candidate past the simulated count."""
    request = _tiny_adaptive_request(global_batch_size=12)
    ctx = context(request)
    found = [c for c in plan(request).candidates if c.config.num_microbatches > 3 * c.config.p + 2]
    assert found, "no candidate runs more micro-batches than are simulated"
    for candidate in found:
        launched = materialize_launch(request, candidate).executor_config
        ir = ExecutorConfig.model_validate(launched).ir
        est = price(ctx, estimate(ctx, candidate.config)).estimate
        runs, _ = device_memory(ctx, candidate.config, est.costs, shape=shape_of(ir))
        assert [m.activations for m in est.memory] == [m.activations for m in runs]
        assert candidate.predicted.memory_gib_per_device == pytest.approx(
            [m.total / 2**30 for m in runs], abs=1e-3
        )
        if (candidate.config.t, candidate.config.p, candidate.config.micro_batch_size) == (2, 2, 1):
            assert inflight_profile(ir)[0] == [{0: 12}]  # every micro-batch at once


def _tiny_adaptive_request(global_batch_size: int) -> PlanRequest:
    return PlanRequest.model_validate(
        {
            "model": {"name": "tiny", "num_layers": 6, "hidden_size": 64,
                      "num_attention_heads": 4, "seq_length": 32, "vocab_size": 128},
            "cluster": {"gpu": "cpu", "num_nodes": 1, "gpus_per_node": 4},
            "training": {"global_batch_size": global_batch_size, "precision": "bf16",
                         "optimizer": "sgd", "distributed_optimizer": True,
                         "sequence_parallel": False},
            "search": {"schedules": ["zb-adaptive"], "recompute": ["none"],
                       "runtime": "stagewright", "top_k": 20},
        }
    )  # fmt: skip


def test_past_the_exact_count_a_searched_schedules_memory_is_its_limit():
    """With more than EXACT_MEMORY_RUNS x the simulated micro-batches, building the schedule
    that runs would cost more than its search (seconds at p = 64 and m = 16,384): the
    memory stays the estimate's, the limit on every device, never below what runs."""
    request = _tiny_adaptive_request(global_batch_size=48)
    ctx = context(request)
    found = [
        c
        for c in plan(request).candidates
        if c.config.num_microbatches
        > EXACT_MEMORY_RUNS
        * timing_microbatches(c.config.schedule, c.config.p, c.config.num_microbatches)
    ]
    assert found, "no candidate runs more than the exact count"
    for candidate in found:
        est = estimate(ctx, candidate.config)
        priced = price(ctx, est).estimate
        assert [m.activations for m in priced.memory] == [m.activations for m in est.memory]
        ir = ExecutorConfig.model_validate(
            materialize_launch(request, candidate).executor_config
        ).ir
        runs, _ = device_memory(ctx, candidate.config, est.costs, shape=shape_of(ir))
        assert all(
            bound.activations >= real.activations
            for bound, real in zip(priced.memory, runs, strict=True)
        )
