"""V-shape schedules against "Pipeline Parallelism with Controllable Memory"."""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.costmodel.shapes import _built_shape, shape_of
from planner.schedules import ActionKind, block_offsets, building_block, generate, schedule_family
from planner.schedules._inflight import InflightProfile, inflight_profile
from planner.schedules._vshape import VSHAPE_NAMES
from planner.simulate import Durations, simulate

K = ActionKind
EQUAL = Durations(1.0, 1.0, 1.0)

# Appendix F, Tables 8 and 9: (delta(F_d^0, F_d^1), delta(F_1^1, B_1^1), delta(B_d^1, B_d^0)).
TABLE_8_V_MIN = {0: (1, 3, 1), 1: (1, 1, 1), 2: (1, 1, 1)}  # by d mod 3
TABLE_9_V_HALF = {0: (2, 4, 1), 1: (2, 1, 1)}  # by d mod 2


@pytest.mark.parametrize("d", range(2, 33))
def test_offsets_are_appendix_f_tables(d):
    v_min = block_offsets("v-min", d)
    assert (v_min.delta0, v_min.delta1) == (1, 1)
    assert (v_min.turn_forward, v_min.turn_loss, v_min.turn_backward) == TABLE_8_V_MIN[d % 3]
    v_half = block_offsets("v-half", d)
    assert (v_half.delta0, v_half.delta1) == (2, 1)
    assert (v_half.turn_forward, v_half.turn_loss, v_half.turn_backward) == TABLE_9_V_HALF[d % 2]
    v_zb = block_offsets("v-zb", d)
    assert (v_zb.delta0, v_zb.delta1) == (4, 2)
    # §3.1: offsets between passes on the same device stay below the repeating interval.
    assert max(v_zb.turn_forward, v_zb.turn_loss, v_zb.turn_backward) < 6


@pytest.mark.parametrize("name", ["v-min", "v-half", "v-zb"])
@pytest.mark.parametrize("d", range(2, 33))
def test_building_blocks_repeat_without_collision(name, d):
    cells = building_block(block_offsets(name, d), d)
    for device in range(d):
        residues = [t % 6 for (dev, _, _), t in cells.items() if dev == device]
        assert sorted(residues) == list(range(6)), f"device {device} collides"


def _eq1_bound(name: str, d: int) -> float:
    """Equation 1: peak of device i <= sum over its stages of ceil(lifespan / T) * m,
    in units of the whole model's micro-batch (m = 1 / 2d)."""
    cells = building_block(block_offsets(name, d), d)
    return max(
        sum(math.ceil((cells[(i, c, K.W)] + 1 - cells[(i, c, K.F)]) / 6) for c in (0, 1))
        for i in range(d)
    ) / (2 * d)


@pytest.mark.parametrize("name, target", [("v-min", 1 / 3), ("v-half", 1 / 2), ("v-zb", 1.0)])
@pytest.mark.parametrize("d", [4, 5, 6, 8, 12, 16, 24, 32])
def test_peak_activation_is_the_papers_fraction_of_1f1b(name, target, d):
    m = 4 * d
    one_f_one_b = max(simulate(generate("1f1b", d, m), EQUAL).peak_activation)
    assert one_f_one_b == pytest.approx(1.0)
    result = simulate(generate(name, d, m), EQUAL)
    peak = max(result.peak_activation)
    # Eq. 1 holds, and Eq. 2's constant term fades with d: within 2/d of the target.
    assert peak <= _eq1_bound(name, d) + 1e-9
    assert target - 1e-9 <= peak / one_f_one_b <= target + 2 / d
    # Memory is balanced across devices (that is the point of the V placement).
    assert max(result.peak_activation) - min(result.peak_activation) <= 1 / d + 1e-9


@pytest.mark.parametrize("d", [4, 8, 16])
def test_v_zb_bubble_is_near_zero_and_does_not_grow(d):
    idle = []
    for m in (4 * d, 8 * d, 16 * d):
        result = simulate(generate("v-zb", d, m), EQUAL)
        idle.append(result.makespan - max(x.busy for x in result.devices))
        assert result.bubble_fraction < 0.05
    assert idle[0] == pytest.approx(idle[1]) == pytest.approx(idle[2])
    plain = simulate(generate("1f1b", d, 16 * d), EQUAL)
    assert result.bubble_fraction < plain.bubble_fraction / 4


def test_v_min_repeating_bubble_when_w_is_short():
    """§3.3 / Figure 5: with W much shorter than F and B, V-Min idles once per repeating
    interval, so its idle time grows with the number of micro-batches; V-Half's does not."""
    d = 8
    short_w = Durations(1.0, 1.0, 0.2)

    def idle(name, m):
        result = simulate(generate(name, d, m), short_w)
        return result.makespan - max(x.busy for x in result.devices)

    v_min = [idle("v-min", m) for m in (16, 32, 64)]
    assert v_min[1] - v_min[0] > 8 and v_min[2] - v_min[1] > 16
    # Linear in m: the same bubble every repeat.
    assert (v_min[2] - v_min[1]) == pytest.approx(2 * (v_min[1] - v_min[0]))
    v_half = [idle("v-half", m) for m in (16, 32, 64)]
    assert v_half[0] == pytest.approx(v_half[2])
    # With equal F/B/W V-Min has no repeating bubble.
    equal = [simulate(generate("v-min", d, m), EQUAL) for m in (16, 64)]
    assert (equal[0].makespan - 16 * 6) == pytest.approx(equal[1].makespan - 64 * 6)


def test_v_half_bubble_is_about_half_of_1f1b_and_v_min_two_thirds():
    """Table 1: bubbles of 6d (1F1B), 4d (V-Min), 3d (V-Half) and ~0 (V-ZB) cells, with
    F = B = W = 1 per stage of V (a 1F1B stage is twice as long)."""
    d, m = 16, 64
    one_f_one_b = simulate(generate("1f1b", d, m), Durations(2.0, 2.0, 2.0))
    idle_1f1b = one_f_one_b.makespan - max(x.busy for x in one_f_one_b.devices)
    assert idle_1f1b == pytest.approx(6 * (d - 1))
    ratios = {}
    for name in ("v-min", "v-half"):
        result = simulate(generate(name, d, m), EQUAL)
        ratios[name] = (result.makespan - max(x.busy for x in result.devices)) / idle_1f1b
    assert ratios["v-min"] == pytest.approx(2 / 3, abs=0.1)
    assert ratios["v-half"] == pytest.approx(1 / 2, abs=0.1)


def test_v_shape_placement_and_split_backward():
    schedule = generate("v-half", 4, 8)
    assert schedule.stage_devices == (0, 1, 2, 3, 3, 2, 1, 0)
    assert schedule.split_backward
    assert schedule.count(K.BW) == 0
    assert schedule.count(K.W) == schedule.count(K.B) == 8 * 8


def test_reordering_never_raises_the_peak():
    """Appendix C reorders warm-up and cool-down for throughput at the same peak memory."""
    d, m = 8, 32
    from planner.schedules._vshape import vshape

    for name in ("v-min", "v-half", "v-zb"):
        reordered = simulate(vshape(name, d, m), EQUAL)
        squeezed_only = simulate(vshape(name, d, m, reorder=False), EQUAL)
        assert max(reordered.peak_activation) <= max(squeezed_only.peak_activation) + 1e-9
        assert reordered.makespan <= squeezed_only.makespan + 1e-9


@pytest.mark.parametrize("name", ["v-min", "v-half", "v-zb"])
@pytest.mark.parametrize("d, m", [(2, 1), (3, 5), (4, 8), (7, 3), (8, 20)])
def test_the_generators_squeeze_times_like_the_engine(name, d, m):
    """The squeeze (step 3) and the adaptive search's timing have their own loop for speed;
    it must give the engine's times, for unit durations and for real ones with
    communication, on the repeated block and on the reordered schedule."""
    from planner.schedules._engine import compile_schedule, run_timing
    from planner.schedules._vframe import squeeze, time_orders
    from planner.schedules._vshape import vshape

    code = {(K.F, 0): 0, (K.F, 1): 1, (K.B, 1): 2, (K.B, 0): 3, (K.W, 0): 4, (K.W, 1): 5}
    pass_time = [1.0, 1.3, 0.9, 1.1, 0.4, 0.7]  # per pass code, on every device
    for schedule in (vshape(name, d, m, reorder=False), vshape(name, d, m)):
        rows = [[a for a in row if a.kind is not K.OPTIMIZER_STEP] for row in schedule.actions]
        orders = [
            [(dev * m + a.microbatch) * 6 + code[(a.kind, a.chunk)] for a in row]
            for dev, row in enumerate(rows)
        ]
        compiled = compile_schedule(schedule)
        for durations, comm in ((None, 0.0), (pass_time * d, 0.25)):
            per_action = [
                0.0
                if a.kind is K.OPTIMIZER_STEP
                else 1.0
                if durations is None
                else pass_time[code[(a.kind, a.chunk)]]
                for a in compiled.action_of
            ]
            engine = run_timing(compiled, per_action, comm=comm).start
            ours, _ = time_orders(orders, m, durations, comm)
            if durations is None:  # the generators' integer squeeze is the same
                assert squeeze(orders, m) == [int(x) for x in ours]
            for dev in range(d):
                for k, g in enumerate(orders[dev]):
                    assert ours[g] == pytest.approx(engine[compiled.offsets[dev] + k])


@pytest.mark.parametrize("name, d, m", [("v-zb", 4, 8), ("v-min", 7, 3), ("v-half", 5, 12)])
def test_the_columns_a_v_generator_fills_are_its_actions(name, d, m):
    """V generators fill the schedule's columns from their pass ids; reading them from the
    actions gives the same arrays."""
    from planner.schedules._ir import _columns

    schedule = generate(name, d, m)
    filled, read = schedule.columns, _columns(schedule)
    for field in ("device", "kind", "stage", "microbatch", "chunk", "peer", "version", "offsets"):
        assert (getattr(filled, field) == getattr(read, field)).all(), field


@pytest.mark.parametrize("d, m", [(6, 96), (8, 128), (16, 256)])
def test_the_warm_up_fill_before_a_cut_is_the_fill_of_the_whole_orders(d, m, monkeypatch):
    """The warm-up fill squeezes and scans only the passes before a cut past the warm-up
    (the rest of each order is left as it is), widening the cut when the scan could reach
    past it: for the fixed V blocks and a sample of v-adaptive's search space it gives
    what filling the whole orders gives, and both the cut and its widening are taken."""
    from planner.schedules import _vframe
    from planner.schedules._vadaptive import _space

    space = _space(d)
    blocks = [space.cells[i].tolist() for i in range(0, len(space.blocks), len(space.blocks) // 60)]
    blocks += [block_offsets(name, d).block(d).cells() for name in VSHAPE_NAMES]
    fill = _vframe._fill_before
    cuts: list[int] = []
    widened: list[int] = []

    def spy(orders, ids, m, block, cut):
        filled = fill(orders, ids, m, block, cut)
        if cut is not None:
            (cuts if isinstance(filled, np.ndarray) else widened).append(cut)
        return filled

    monkeypatch.setattr(_vframe, "_fill_before", spy)
    for cells in blocks:
        orders = _vframe.repeated_ids(cells, m).tolist()
        whole = fill(orders, np.asarray(orders), m, cells, None)
        assert (_vframe._fill_warmup(np.asarray(orders), m, cells) == whole).all()
    assert len(cuts) > len(blocks) / 2
    assert widened


@pytest.mark.parametrize("d, m", [(4, 3), (8, 40), (16, 128)])
def test_the_warm_up_fill_is_the_same_whatever_stores_its_memory_check(d, m, monkeypatch):
    """Peaks of 256 stage activations or more (about 128 devices) keep the warm-up fill's
    memory check in lists instead of bytes: both give the same orders."""
    from planner.schedules import _vframe
    from planner.schedules._vadaptive import _space

    space = _space(d).cells
    blocks = [block.tolist() for block in space[:: max(1, len(space) // 30)]]
    blocks += [block_offsets(name, d).block(d).cells() for name in VSHAPE_NAMES]
    repeated = [_vframe.repeated_ids(cells, m) for cells in blocks]
    in_bytes = [
        _vframe._fill_warmup(ids, m, cells) for ids, cells in zip(repeated, blocks, strict=True)
    ]
    monkeypatch.setattr(_vframe.Slack, "BYTES_BELOW", 0)
    for ids, cells, filled in zip(repeated, blocks, in_bytes, strict=True):
        assert (_vframe._fill_warmup(ids, m, cells) == filled).all()


def _cooldown_by_the_letter(orders: list[list[int]], m: int) -> list[list[int]]:
    """Appendix C's cool-down, one device and one cell at a time: drop each device's Ws after
    its last F, squeeze, then walk the cells in order and put the waiting W whose B ended
    earliest into each idle cell after that B; the Ws left over go at the end, earliest B
    first. The oracle of the vectorized :func:`_vframe._reorder_cooldown`."""
    from planner.schedules import _vframe

    passes, w0, f1 = _vframe.PASSES, _vframe.W0, _vframe.F1
    b_of_w = {_vframe.W0: _vframe.B0, _vframe.W1: _vframe.B1}
    kept, dropped = [], []
    for order in orders:
        last_f = max(k for k, g in enumerate(order) if g % passes <= f1)
        tail = order[last_f + 1 :]
        kept.append(order[: last_f + 1] + [g for g in tail if g % passes < w0])
        dropped.append([g for g in tail if g % passes >= w0])
    start = _vframe.squeeze(kept, m)
    result = []
    for order, ws in zip(kept, dropped, strict=True):
        cells = {start[g]: g for g in order}
        b_cell = {g: start[g - g % passes + b_of_w[g % passes]] for g in ws}
        waiting = sorted(ws, key=b_cell.__getitem__)
        for t in range(max(cells)):
            if waiting and t not in cells and b_cell[waiting[0]] < t:
                cells[t] = waiting.pop(0)
        result.append([cells[t] for t in sorted(cells)] + waiting)
    return result


@pytest.mark.parametrize("d, m", [(2, 1), (3, 2), (4, 5), (6, 12), (8, 33)])
def test_the_cool_down_places_each_w_where_appendix_c_does(d, m):
    """The vectorized cool-down reorder gives the cell-by-cell procedure's orders, on v-adaptive's
    blocks as repeated and as warm-up filled, and on the fixed V blocks."""
    from planner.schedules import _vframe
    from planner.schedules._vadaptive import _space

    space = _space(d)
    step = max(1, len(space.blocks) // 40)
    blocks = [space.cells[i].tolist() for i in range(0, len(space.blocks), step)]
    blocks += [block_offsets(name, d).block(d).cells() for name in VSHAPE_NAMES]
    for cells in blocks:
        repeated = _vframe.repeated_ids(cells, m)
        for orders in (repeated, _vframe._fill_warmup(repeated, m, cells)):
            expected = _cooldown_by_the_letter(orders.tolist(), m)
            assert _vframe._reorder_cooldown(orders, m) == expected


@pytest.mark.parametrize("d, m", [(2, 1), (3, 4), (8, 5), (16, 16)])
def test_squeezing_a_stack_gives_each_blocks_squeeze(d, m):
    """_squeeze_stack (every row of a stack of blocks one pass a round) against squeeze,
    block by block: on whole repeated orders and on the passes the cool-down keeps (each
    row's first ones, as many as it keeps); it raises on orders that deadlock, as squeeze
    does."""
    from planner.errors import ScheduleConfigError
    from planner.schedules import _vframe
    from planner.schedules._vadaptive import _space

    space = _space(d).cells
    picked = space[:: max(1, len(space) // 40)]
    n = d * m * 6
    ids = np.stack([_vframe.repeated_ids(block, m) for block in picked])
    rows = (ids + np.arange(len(picked))[:, None, None] * n).reshape(-1, 6 * m)
    dep = _vframe._stack_dependencies(len(picked), d, m)
    stacked = _vframe._squeeze_stack(rows, dep).reshape(len(picked), n)
    for orders, cells in zip(ids, stacked, strict=True):
        assert cells.tolist() == _vframe.squeeze(orders.tolist(), m)
    dropped = _vframe._cooldown_dropped(rows)
    kept = np.take_along_axis(rows, np.argsort(dropped, axis=1, kind="stable"), axis=1)
    lengths = 6 * m - dropped.sum(axis=1)
    stacked = _vframe._squeeze_stack(kept, dep, lengths).reshape(len(picked), n)
    for block, cells in enumerate(stacked):
        mine = slice(block * d, (block + 1) * d)
        orders = [
            row[:k] for row, k in zip(kept[mine] - block * n, lengths[mine].tolist(), strict=True)
        ]
        assert cells.tolist() == _vframe.squeeze([row.tolist() for row in orders], m)
    rows[:d] = rows[:d, ::-1]  # the first block's devices run their passes backwards
    with pytest.raises(ScheduleConfigError, match="deadlock"):
        _vframe._squeeze_stack(rows, dep)


@pytest.mark.parametrize("d", [2, 3, 5, 8, 16])
@pytest.mark.parametrize("m", [1, 2, 5, 16])
def test_the_stacked_cool_down_is_the_one_block_cool_down(d, m):
    """_reorder_cooldown_stack (every block's kept passes squeezed as one stack, the dropped
    Ws placed for every row at once) against _reorder_cooldown, block by block, its oracle:
    on v-adaptive's blocks and the fixed V blocks, as repeated and as warm-up filled."""
    from planner.schedules import _vframe
    from planner.schedules._vadaptive import _space

    space = _space(d).cells
    fixed = [block_offsets(name, d).block(d).cells() for name in VSHAPE_NAMES]
    picked = np.concatenate([space[:: max(1, len(space) // 60)], np.asarray(fixed)])
    repeated = np.stack([_vframe.repeated_ids(block, m) for block in picked])
    filled = np.stack(
        [
            _vframe._fill_warmup(ids, m, block.tolist())
            for ids, block in zip(repeated, picked, strict=True)
        ]
    )
    for stack in (repeated, filled):
        stacked = _vframe._reorder_cooldown_stack(stack, m)
        assert stacked.shape == stack.shape
        for orders, reordered in zip(stack, stacked, strict=True):
            assert reordered.tolist() == _vframe._reorder_cooldown(orders, m)


@pytest.mark.parametrize("d", [2, 3, 5, 8, 16])
@pytest.mark.parametrize("m", [1, 2, 5, 16])
def test_stacked_build_matches_one_block_at_a_time(d, m):
    """build_orders_stack (repeated, warm-ups filled and cool-downs reordered as one stack)
    against build_orders, block by block, its oracle."""
    from planner.schedules import _vframe
    from planner.schedules._vadaptive import _space

    cells = _space(d).cells
    picked = cells[:: max(1, len(cells) // 60)]
    repeated = _vframe.repeated_ids(picked, m)
    assert repeated.tolist() == [_vframe.repeated_ids(block, m).tolist() for block in picked]
    stacked = _vframe.build_orders_stack(picked, m)
    assert stacked.shape == (len(picked), d, 6 * m)
    for block, orders in zip(picked, stacked, strict=True):
        assert orders.tolist() == _vframe.build_orders(block.tolist(), m)
    assert _vframe.build_orders_stack(cells[:0], m).shape == (0, d, 6 * m)


def _in_order(profile: InflightProfile) -> list[list[list[tuple[int, int]]]]:
    """A profile with its moments and each moment's stages in order (peaks add in it)."""
    return [[list(moment.items()) for moment in moments] for moments in profile]


@pytest.mark.parametrize("name", VSHAPE_NAMES)
def test_the_memory_model_reads_the_profile_off_the_orders(name):
    """A V shape's memory is counted from its orders (``ScheduleFamily.inflight``), not from
    the schedule they make: the same profile, moments and stages in the same order, and the
    same shape, below, at and past the cap and the periodic build, for p up to 33 and more."""
    family = schedule_family(name)
    assert family.inflight is not None
    for d in [*range(2, 34), 40, 64]:
        counts = {1, 2, d // 2 + 1, d + 1, 2 * d, 2 * d + 3}
        if d <= 16:
            counts |= {3, d, d + 2, 2 * d - 1, 3 * d + 2}
        for m in sorted(counts):
            built = generate(name, d, m, check=False)
            expected = inflight_profile(built)
            assert _in_order(family.inflight(d, m, {})) == _in_order(expected), (d, m)
            assert _built_shape(name, d, m) == shape_of(built), (d, m)
