"""1F1B-V (V-shape paper, Appendix H): the V placement without a B/W split, about 2/3 of
1F1B's activation memory, with fewer bubbles than 1F1B."""

from __future__ import annotations

import pytest

from planner.errors import ScheduleConfigError
from planner.schedules import ActionKind, generate, v_placement, validate
from planner.schedules._v1f1b import compact, loss_turn, v1f1b, v1f1b_block
from planner.schedules._vframe import REPEAT_INTERVAL, Slack, stable_peak
from planner.simulate import Durations, simulate
from tests.unit.helpers import assert_complete, assert_dependencies_hold

K = ActionKind
# The paper's unit: F = B = W per stage, so a fused backward takes two forwards; a 1F1B
# stage holds two V stages, so its passes take twice as long.
V_TIMES = Durations(1.0, 2.0)
ONE_F_ONE_B_TIMES = Durations(2.0, 4.0)


def _peak_ratio(d: int, m: int) -> tuple[float, list[float]]:
    baseline = max(simulate(generate("1f1b", d, m), ONE_F_ONE_B_TIMES).peak_activation)
    peaks = simulate(generate("1f1b-v", d, m), V_TIMES).peak_activation
    return max(peaks) / baseline, peaks


@pytest.mark.parametrize("d", [4, 5, 6, 8, 16])
def test_peak_is_about_two_thirds_of_1f1b_on_every_device(d):
    """Appendix H: "reduce the peak memory to asymptotically 2/3 of 1F1B"; the constant
    is at most two stage activations (1/d of 1F1B's peak), and memory is balanced."""
    ratio, peaks = _peak_ratio(d, 4 * d)
    assert 2 / 3 - 1e-9 <= ratio <= 2 / 3 + 1 / d + 1e-9
    assert max(peaks) - min(peaks) <= 1 / d + 1e-9


@pytest.mark.parametrize("d", [2, 3, 4, 7, 9, 16, 31, 64, 128])
def test_the_block_repeats_without_collision_and_tends_to_two_thirds(d):
    """Each device fills the six cells of a repeating interval exactly once (2 F of one
    cell, 2 BW of two); the repeated block's peak (in stage activations, 2d per 1F1B
    peak) is 2/3 of 1F1B's plus at most 1/d, so it tends to 2/3."""
    cells = v1f1b_block(d)
    for row in cells:
        f0, f1, b1, b0, w0, w1 = row
        assert (w0, w1) == (b0 + 1, b1 + 1)
        assert sorted(c % REPEAT_INTERVAL for c in row) == list(range(REPEAT_INTERVAL))
    ratio = stable_peak(cells, 10**6) / (2 * d)
    assert 2 / 3 - 1e-9 <= ratio <= 2 / 3 + 1 / d + 1e-9


@pytest.mark.parametrize("d", [2, 4, 6, 8])
def test_the_schedule_holds_no_more_than_its_repeated_block(d):
    """The warm-up and cool-down compaction moves a forward earlier only while the
    device stays below the schedule's peak."""
    m = 4 * d
    schedule = generate("1f1b-v", d, m)
    peaks = simulate(schedule, V_TIMES).peak_activation
    assert max(peaks) * 2 * d == pytest.approx(schedule.meta["stable_peak_stage_activations"])


@pytest.mark.parametrize("d", [2, 3, 4, 6, 8, 16])
def test_fewer_bubbles_than_1f1b(d):
    """Appendix H: "All these schedules have lower bubble rate than 1F1B"."""
    m = 4 * d
    ours = simulate(generate("1f1b-v", d, m), V_TIMES)
    baseline = simulate(generate("1f1b", d, m), ONE_F_ONE_B_TIMES)
    assert ours.makespan < baseline.makespan
    assert ours.bubble_fraction < baseline.bubble_fraction


@pytest.mark.parametrize("d, m", [(2, 1), (3, 5), (4, 16), (5, 7)])
def test_v_placement_fused_backward_and_a_valid_timeline(d, m):
    schedule = validate(v1f1b(d, m))
    assert schedule.stage_devices == v_placement(d)
    assert not schedule.split_backward
    assert schedule.count(K.B, K.W) == 0
    assert schedule.count(K.BW) == 2 * d * m
    assert_complete(schedule)
    for comm in (0.0, 0.3):
        times = Durations(1.0, 2.0, comm=comm)
        assert_dependencies_hold(simulate(schedule, times), comm=comm)


@pytest.mark.parametrize("d", [3, 4, 5, 6, 9])
def test_the_loss_turn_has_the_least_memory_then_the_fewest_bubbles(d):
    """The one free offset of the block: of the turns within a repeating interval, the
    chosen one holds the least memory and, among those, runs with the fewest bubbles."""
    m = 4 * d
    outcomes = {}
    for turn in range(1, REPEAT_INTERVAL + 1):
        try:
            result = simulate(v1f1b(d, m, turn), V_TIMES)
        except ScheduleConfigError:
            continue  # that turn collides
        outcomes[turn] = (round(max(result.peak_activation), 9), result.bubble_fraction)
    chosen = outcomes[loss_turn(d)]
    assert chosen == min(outcomes.values())


def test_bad_input_says_what_to_change():
    with pytest.raises(ScheduleConfigError, match="needs at least 2 devices"):
        generate("1f1b-v", 1, 4)
    with pytest.raises(ScheduleConfigError, match="at least 1"):
        generate("1f1b-v", 4, 0)
    with pytest.raises(ScheduleConfigError, match="1f1b-v has no parameter memory_limit"):
        generate("1f1b-v", 4, 8, memory_limit=0.7)


@pytest.mark.parametrize("d, m", [(6, 20), (16, 64)])
def test_the_compaction_is_the_same_whatever_stores_its_memory_check(d, m, monkeypatch):
    """Peaks of 256 stage activations or more (about 190 devices) keep the memory check in
    a list instead of bytes: both give the same orders."""
    cells = v1f1b_block(d)
    in_bytes = compact(cells, m)
    monkeypatch.setattr(Slack, "BYTES_BELOW", 0)
    assert compact(cells, m) == in_bytes
