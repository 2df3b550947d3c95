"""1F1B, GPipe, interleaved and 2BW against the papers' closed forms."""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np
import pytest

from planner.schedules import Action, ActionKind, Schedule, generate, weight_version_2bw
from planner.schedules._basic import (
    Insertion,
    insert_actions,
    one_f_one_b_columns,
)
from planner.schedules._ir import _columns
from planner.simulate import Durations, simulate

K = ActionKind


@pytest.mark.parametrize("p", [2, 3, 4, 8, 16])
@pytest.mark.parametrize("m", [1, 2, 5, 8, 32])
def test_1f1b_stage_s_holds_at_most_min_p_minus_s_m(p, m):
    result = simulate(generate("1f1b", p, m), Durations(1.0, 1.3, 0.7))
    for s, peak in enumerate(result.peak_activation):
        # Peaks are in whole-model micro-batches; one stage's micro-batch is 1/p of that.
        assert peak * p == pytest.approx(min(p - s, m))


@pytest.mark.parametrize("p", [2, 4, 7, 16])
@pytest.mark.parametrize("m", [1, 4, 8, 64])
def test_1f1b_bubble_fraction_is_p_minus_1_over_m_plus_p_minus_1(p, m):
    # Equal F and B+W times (B = 0.6, W = 0.4, F = 1).
    result = simulate(generate("1f1b", p, m), Durations(1.0, 0.6, 0.4))
    assert result.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))


def test_hand_computed_two_stage_timeline_with_comm():
    # F = 1, BW = 2, comm = 0.5 on the single edge; worked out by hand:
    # dev0: F0 [0,1] F1 [1,2] BW0 [5,7] BW1 [8,10]; dev1: F0 [1.5,2.5] BW0 [2.5,4.5]
    # F1 [4.5,5.5] BW1 [5.5,7.5].
    result = simulate(generate("1f1b", 2, 2), Durations(1.0, 2.0, 0.0, comm=0.5))
    spans = {
        (device, str(action)): (start, end)
        for device, action, start, end in result.timeline()
        if action.kind.is_compute and action.kind is not K.OPTIMIZER_STEP
    }
    assert spans == {
        (0, "0F0"): (0, 1),
        (0, "0F1"): (1, 2),
        (0, "0BW0"): (5, 7),
        (0, "0BW1"): (8, 10),
        (1, "1F0"): (1.5, 2.5),
        (1, "1BW0"): (2.5, 4.5),
        (1, "1F1"): (4.5, 5.5),
        (1, "1BW1"): (5.5, 7.5),
    }
    assert result.makespan == 10
    assert result.bubble_fraction == pytest.approx(1 - 6 / 10)
    # Saved activations of stage 0: +F0 at 0, +F1 at 1, -BW0 at 7, -BW1 at 10 (1/2 each).
    assert result.memory[0] == [(0, 0.5), (1, 1.0), (7, 0.5), (10, 0.0)]


def test_per_stage_durations_change_the_bottleneck():
    slow_last = simulate(generate("1f1b", 4, 16), Durations([1, 1, 1, 2], [2, 2, 2, 4]))
    even = simulate(generate("1f1b", 4, 16), Durations(1.0, 2.0))
    # The slowest stage sets the pace: 16 micro-batches x (2 + 4) plus the fill.
    assert slow_last.makespan > even.makespan
    assert slow_last.makespan >= 16 * 6


def test_gpipe_holds_every_microbatch():
    result = simulate(generate("gpipe", 4, 6), Durations(1.0, 2.0))
    assert [peak * 4 for peak in result.peak_activation] == pytest.approx([6] * 4)


def test_interleaved_cuts_the_bubble_by_the_number_of_chunks():
    p, m, v = 4, 16, 2
    plain = simulate(generate("1f1b", p, m), Durations(1.0, 2.0))
    # Each chunk does half the work of a 1F1B stage.
    inter = simulate(generate("interleaved", p, m, num_chunks=v), Durations(0.5, 1.0))
    idle_plain = plain.makespan - max(d.busy for d in plain.devices)
    idle_inter = inter.makespan - max(d.busy for d in inter.devices)
    # Megatron: the bubble shrinks by a factor of v (Narayanan et al. 2021, §2.2).
    assert idle_inter == pytest.approx(idle_plain / v)


def test_2bw_weight_versions_follow_the_paper_formula():
    # k is 1-indexed in the paper: max(floor((k-1)/m) - 1, 0).
    m = 4
    assert [weight_version_2bw(k - 1, m) for k in range(1, 17)] == ([0] * 8 + [1] * 4 + [2] * 4)


@pytest.mark.parametrize("p, m, batches", [(4, 4, 4), (4, 6, 3), (8, 8, 3), (3, 5, 5)])
def test_2bw_keeps_at_most_two_weight_versions_and_never_flushes(p, m, batches):
    schedule = generate("2bw", p, m, num_batches=batches)
    result = simulate(schedule, Durations(1.0, 2.0))
    for device, row in enumerate(schedule.actions):
        version = 0
        forward_version: dict[int, int] = {}
        for action in row:
            if action.kind is K.WEIGHT_VERSION:
                version = action.version
            elif action.kind is K.F:
                forward_version[action.microbatch] = version
                assert version == weight_version_2bw(action.microbatch, m)
        # Walk the timeline: versions alive = newest produced + those in flight.
        newest = 0
        in_flight: dict[int, int] = {}
        most = 0
        for _, action, _, _ in sorted(
            (r for r in result.timeline() if r[0] == device), key=lambda r: (r[2], r[3])
        ):
            if action.kind is K.F:
                in_flight[action.microbatch] = forward_version[action.microbatch]
            elif action.kind is K.BW:
                in_flight.pop(action.microbatch)
            elif action.kind is K.OPTIMIZER_STEP:
                newest = action.version
            most = max(most, len(set(in_flight.values()) | {newest}))
        assert most <= 2
    # No flush: stage 0 starts batch b+1 before it finishes batch b's backward passes.
    rows = [r for r in result.timeline() if r[0] == 0]
    for b in range(batches - 1):
        last_bw_of_b = max(e for _, a, _, e in rows if a.kind is K.BW and a.microbatch // m == b)
        first_f_next = min(s for _, a, s, _ in rows if a.kind is K.F and a.microbatch // m == b + 1)
        assert first_f_next < last_bw_of_b
    # ...so it beats the same batches run as separate flushed 1F1B iterations.
    flushed = simulate(generate("1f1b", p, m), Durations(1.0, 2.0)).makespan * batches
    assert result.makespan < flushed


def test_2bw_memory_is_1f1b_memory_for_activations():
    # Activations: in-flight micro-batches are at most p - s per stage, as 1F1B's.
    p = 4
    result = simulate(generate("2bw", p, 8, num_batches=3), Durations(1.0, 2.0))
    assert [Fraction(peak).limit_denominator(64) * p for peak in result.peak_activation] == [
        4,
        3,
        2,
        1,
    ]


def optimizer_step(stage: int, microbatch: int, version: int | None = None) -> Action:
    return Action(ActionKind.OPTIMIZER_STEP, stage, microbatch, version=version)


def one_f_one_b_order(stage: int, num_stages: int, microbatches: range) -> list[Action]:
    """1F1B order of one stage by the letter: min(p - s - 1, m) warm-up forwards, steady
    F/B pairs, cool-down backwards (the oracle of the generators' columns)."""
    mbs = list(microbatches)
    warmup = min(num_stages - stage - 1, len(mbs))
    forwards = [Action(ActionKind.F, stage, k) for k in mbs]
    backwards = [Action(ActionKind.BW, stage, k) for k in mbs]
    order = forwards[:warmup]
    for forward, backward in zip(forwards[warmup:], backwards, strict=False):
        order += [forward, backward]
    return order + backwards[len(mbs) - warmup :]


@pytest.mark.parametrize("p", [1, 2, 3, 4, 7, 8])
@pytest.mark.parametrize("m", [1, 2, 5, 8, 13])
def test_1f1b_is_each_stages_1f1b_order_then_the_step(p, m):
    """1f1b (and BPipe, built on its columns) against each stage's order by the letter."""
    listed = [(*one_f_one_b_order(s, p, range(m)), optimizer_step(s, m - 1)) for s in range(p)]
    assert generate("1f1b", p, m).actions == tuple(listed)
    built = Schedule("1f1b", p, m, tuple(range(p)), tuple(listed)).columns
    for field in ("device", "kind", "stage", "microbatch", "chunk", "peer", "version", "offsets"):
        assert np.array_equal(getattr(one_f_one_b_columns(p, m), field), getattr(built, field))


@pytest.mark.parametrize("p", [1, 2, 3, 8])
@pytest.mark.parametrize("m", [1, 2, 5, 13])
def test_gpipe_is_every_forward_then_every_backward_then_the_step(p, m):
    """GPipe, made by the looped builder with every forward in the warm-up, by the letter."""
    listed = tuple(
        (
            *(Action(ActionKind.F, s, k) for k in range(m)),
            *(Action(ActionKind.BW, s, k) for k in range(m)),
            optimizer_step(s, m - 1),
        )
        for s in range(p)
    )
    assert generate("gpipe", p, m).actions == listed


@pytest.mark.parametrize("seed", range(20))
def test_insert_actions_puts_each_action_before_its_position(seed):
    """insert_actions against inserting into the action lists one by one."""
    rng = random.Random(seed)
    base = generate("1f1b", rng.randint(1, 5), rng.randint(1, 6))
    rows = [list(row) for row in base.actions]
    new = sorted(
        (d, rng.randint(0, len(rows[d])), k)
        for k, d in enumerate(rng.choices(range(len(rows)), k=rng.randint(0, 12)))
    )
    inserted = [Action(ActionKind.EVICT, d, k, 0, peer=k % 3) for d, _, k in new]
    for (d, at, _), action in reversed(list(zip(new, inserted, strict=True))):
        rows[d].insert(at, action)
    expected = _columns(Schedule("x", len(rows), 1, base.stage_devices, tuple(map(tuple, rows))))
    as_columns = _columns(Schedule("x", 1, 1, (0,), (tuple(inserted),)))
    fields = {f: getattr(as_columns, f) for f in ("kind", "stage", "microbatch", "chunk", "peer")}
    fields["version"] = as_columns.version
    device = np.array([d for d, _, _ in new], np.int64)
    position = np.array([at for _, at, _ in new], np.int64)
    ours = insert_actions(base.columns, Insertion(device, position, fields))
    for field in ("device", "kind", "stage", "microbatch", "chunk", "peer", "version", "offsets"):
        assert np.array_equal(getattr(ours, field), getattr(expected, field)), field


def _reference_2bw(p: int, m: int, batches: int) -> Schedule:
    """PipeDream-2BW built by walking each stage's 1F1B order over every batch: the switch
    to version b - 1 right before the forward of batch b's first micro-batch (from batch 2
    on), batch b's step (making version b + 1) right after the backward of its last one.
    pipedream_2bw places the same actions by their positions, on columns."""
    rows = []
    for s in range(p):
        row = []
        for a in one_f_one_b_order(s, p, range(m * batches)):
            batch = a.microbatch // m
            if a.kind is ActionKind.F and a.microbatch % m == 0 and batch >= 2:
                row.append(Action(ActionKind.WEIGHT_VERSION, s, a.microbatch, version=batch - 1))
            row.append(a)
            if a.kind is ActionKind.BW and a.microbatch % m == m - 1:
                row.append(optimizer_step(s, a.microbatch, version=batch + 1))
        rows.append(tuple(row))
    meta = {"weight_versions": "max(floor((k-1)/m) - 1, 0) for 1-indexed micro-batch k"}
    return Schedule("2bw", p, m, tuple(range(p)), tuple(rows), num_batches=batches, meta=meta)


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("extra", [0, 1, 3])
@pytest.mark.parametrize("batches", [1, 2, 3, 5])
def test_2bw_is_its_reference_built_from_action_lists(p, extra, batches):
    m = p + extra
    ours = generate("2bw", p, m, num_batches=batches)
    assert ours == _reference_2bw(p, m, batches)
    read_back = _columns(ours)
    for field in ("device", "kind", "stage", "microbatch", "chunk", "peer", "version", "offsets"):
        assert np.array_equal(getattr(ours.columns, field), getattr(read_back, field)), field
