"""BPipe: Algorithm 1's transfer schedule, its memory bound and its optimality."""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest

from planner.errors import ScheduleConfigError
from planner.schedules import (
    Action,
    ActionKind,
    Schedule,
    bpipe_mu_opt,
    generate,
    plan_transfers,
    validate,
)
from planner.schedules._basic import interleaved, one_f_one_b
from planner.schedules._bpipe import bpipe
from planner.schedules._engine import compile_schedule, run_timing
from planner.schedules._ir import _columns
from planner.simulate import Durations, simulate

K = ActionKind


def _device_actions(schedule, device):
    return [a for a in schedule.actions[device] if schedule.stage_devices[a.stage] == device]


def test_mu_opt_is_ceil_p_plus_2_over_2():
    assert [bpipe_mu_opt(p) for p in (2, 3, 4, 5, 8, 16)] == [2, 3, 3, 4, 5, 9]
    # Appendix A: p * v + 1 for interleaved 1F1B (p = 4, v = 2 gives 9).
    assert bpipe_mu_opt(4, 2) == 9


def test_figure_4_walk_through_p4_m8():
    """§3.2: stage 0 evicts micro-batch 1 during the warm-up, then 3 and 5 in the steady
    phase, loads each back just before its backward, and holds at most 3 = mu_opt."""
    schedule = generate("bpipe", 4, 8)
    row = _device_actions(schedule, 0)
    evicts = [a.microbatch for a in row if a.kind is K.EVICT]
    assert evicts == [1, 3, 5]
    # An EVICT overlaps the compute action that follows it: warm-up evictions overlap a
    # forward that comes before the first backward.
    first_backward = next(i for i, a in enumerate(row) if a.kind is K.BW)
    warmup_evicts = [
        a.microbatch
        for i, a in enumerate(row[:first_backward])
        if a.kind is K.EVICT and row[i + 1].kind is K.F
    ]
    assert warmup_evicts == [1]
    # Micro-batch 1 is evicted while micro-batch 2's forward runs (Algorithm 1, line 11).
    i = next(i for i, a in enumerate(row) if a.kind is K.EVICT)
    assert str(row[i + 1]) == "0F2"
    # Every LOAD sits just before its backward, with at most one forward in between.
    for i, a in enumerate(row):
        if a.kind is K.LOAD:
            following = [b for b in row[i + 1 :] if b.kind in (K.F, K.BW)]
            position = next(j for j, b in enumerate(following) if b.kind is K.BW)
            assert following[position].microbatch == a.microbatch
            assert position <= 1
    # All transfers go to the pair acceptor p - 1 - s = 3.
    assert {a.peer for a in row if a.kind.is_transfer} == {3}
    result = simulate(schedule, Durations(1.0, 2.0, transfer=0.5))
    assert result.peak_activation[0] * 4 == pytest.approx(3)
    # Without BPipe, stage 0 holds 4.
    plain = simulate(generate("1f1b", 4, 8), Durations(1.0, 2.0))
    assert plain.peak_activation[0] * 4 == pytest.approx(4)


@pytest.mark.parametrize("p", [2, 3, 4, 5, 6, 8, 12, 16, 32])
@pytest.mark.parametrize("m", [1, 3, 8, 33])
def test_every_stage_stays_at_or_below_mu_opt(p, m):
    mu_opt = bpipe_mu_opt(p)
    for transfer in (0.1, 0.9, 2.5):
        result = simulate(generate("bpipe", p, m), Durations(1.0, 2.0, transfer=transfer))
        for s, peak in enumerate(result.peak_activation):
            assert peak * p <= mu_opt + 1e-6, f"stage {s} holds {peak * p} > {mu_opt}"


@pytest.mark.parametrize("p", [4, 5, 6, 8, 9, 16])
def test_only_stages_up_to_floor_p_minus_4_over_2_evict(p):
    """§3.3: activation balancing acts for p >= 4 and evictors s <= floor((p - 4) / 2)."""
    schedule = generate("bpipe", p, 3 * p)
    evictors = sorted(
        {
            d
            for d, _, a in schedule.iter_actions()
            if a.kind is K.EVICT and schedule.stage_devices[a.stage] == d
        }
    )
    assert evictors == list(range((p - 4) // 2 + 1))
    assert generate("bpipe", 3, 9).count(K.EVICT) == 0


def _brute_force_min_evictions(order: tuple[tuple[str, int], ...], capacity: int) -> int:
    """The fewest evictions that keep a device at or below ``capacity`` saved micro-batches,
    found by exhaustive search over every choice of what to evict and when (an oracle that
    shares nothing with Algorithm 1 but its timing rules: a transfer overlaps one compute
    step; a load is issued at the step before its backward, or at the backward itself when
    no forward precedes it; a step's memory is what it starts with plus its forward plus any
    load)."""
    n = len(order)
    backward_at = {mb: i for i, (kind, mb) in enumerate(order) if kind == "B"}

    def load_step(mb: int) -> int:
        i = backward_at[mb]
        return i - 1 if i > 0 and order[i - 1][0] == "F" else i

    @cache
    def best(i: int, held: frozenset[int], evicted: frozenset[int]) -> float:
        if i == n:
            return 0 if not evicted else math.inf
        loads = {mb for mb in evicted if load_step(mb) == i}
        kind, mb = order[i]
        in_step = len(held) + (kind == "F") + len(loads)
        if in_step > capacity:
            return math.inf
        after = set(held) | loads
        if kind == "F":
            after.add(mb)
        if kind == "B":
            after.discard(mb)
        remaining_evicted = evicted - loads
        # Choose any subset of what is held (and not needed now or next) to evict now.
        busy = {mb}
        if i + 1 < n:
            busy.add(order[i + 1][1])
        candidates = sorted(after - busy)
        result = math.inf
        for mask in range(1 << len(candidates)):
            chosen = {c for k, c in enumerate(candidates) if mask >> k & 1}
            cost = len(chosen) + best(
                i + 1, frozenset(after - chosen), frozenset(remaining_evicted | chosen)
            )
            result = min(result, cost)
        return result

    return int(best(0, frozenset(), frozenset()))


@pytest.mark.parametrize("p, m", [(4, 4), (4, 8), (5, 7), (6, 6), (6, 9), (8, 8), (8, 11)])
def test_evictions_are_the_minimum_possible(p, m):
    """§3.4: Belady's choice makes the number of transfers minimal. Check it against an
    exhaustive search on every evictor of small pipelines."""
    base = generate("1f1b", p, m)
    capacity = bpipe_mu_opt(p)
    for device in range(p):
        compute = [a for a in base.actions[device] if a.kind in (K.F, K.BW)]
        transfers, peak = plan_transfers(compute, capacity)
        ours = sum(1 for step in transfers for kind, _ in step if kind is K.EVICT)
        order = tuple(("F" if a.kind is K.F else "B", a.microbatch) for a in compute)
        assert ours == _brute_force_min_evictions(order, capacity)
        assert peak <= capacity


def test_transfers_hide_behind_compute_when_fast_enough():
    """Appendix B: a transfer shorter than a forward costs no time; a slower one, or one that
    cannot overlap, stretches the iteration."""
    plain = simulate(generate("1f1b", 8, 16), Durations(1.0, 2.0)).makespan
    schedule = generate("bpipe", 8, 16)
    hidden = simulate(schedule, Durations(1.0, 2.0, transfer=0.9)).makespan
    slow = simulate(schedule, Durations(1.0, 2.0, transfer=3.0)).makespan
    blocking = simulate(
        schedule, Durations(1.0, 2.0, transfer=0.9, overlap_transfers=False)
    ).makespan
    assert hidden == pytest.approx(plain)
    assert slow > plain
    assert blocking > plain


def test_acceptor_holds_the_evicted_activations():
    p, m = 8, 16
    result = simulate(generate("bpipe", p, m), Durations(1.0, 2.0, transfer=0.5))
    plain = simulate(generate("1f1b", p, m), Durations(1.0, 2.0))
    counts = [round(x * p, 6) for x in result.peak_activation]
    before = [round(x * p, 6) for x in plain.peak_activation]
    assert before == [8, 7, 6, 5, 4, 3, 2, 1]
    mu_opt = bpipe_mu_opt(p)
    assert max(counts) == mu_opt
    # Acceptors 5..7 of evictors 2..0 rise above their 1F1B level.
    for evictor in range((p - 4) // 2 + 1):
        acceptor = p - 1 - evictor
        assert counts[acceptor] > before[acceptor]


def test_interleaved_variant_of_appendix_a():
    """Appendix A: 4 devices, 2 chunks, 8 micro-batches: mu_opt = 9, stage 0 evicts two."""
    schedule = validate(bpipe(4, 8, num_chunks=2))
    row = _device_actions(schedule, 0)
    assert schedule.meta["mu_opt"] == 9
    first_backward = next(i for i, a in enumerate(row) if a.kind is K.BW)
    warmup = [
        a
        for i, a in enumerate(row[:first_backward])
        if a.kind is K.EVICT and row[i + 1].kind is K.F
    ]
    assert len(warmup) == 2
    result = simulate(schedule, Durations(0.5, 1.0, transfer=0.2))
    # Peaks in chunk-micro-batches: each chunk is 1/8 of the model here.
    assert max(result.peak_activation) * 8 <= 9 + 1e-9


def test_interleaved_bpipe_is_a_registered_schedule():
    """Appendix A's variant as the registry builds it: interleaved 1F1B's placement and
    order plus the transfers, every device within p v + 1 chunk-micro-batches; one chunk is
    plain BPipe, which has its own name."""
    schedule = generate("bpipe-interleaved", 4, 8)
    assert schedule.actions == bpipe(4, 8, num_chunks=2).actions
    base = generate("interleaved", 4, 8)
    assert schedule.stage_devices == base.stage_devices
    compute = [[a for a in row if a.kind.is_compute] for row in schedule.actions]
    assert compute == [list(row) for row in base.actions]
    peaks = simulate(schedule, Durations(0.5, 1.0, transfer=0.2)).peak_activation
    assert max(peaks) * 8 <= 9 + 1e-9
    assert generate("bpipe-interleaved", 4, 12, num_chunks=3).num_stages == 12
    with pytest.raises(ScheduleConfigError, match="num_chunks must be at least 2"):
        generate("bpipe-interleaved", 4, 8, num_chunks=1)
    with pytest.raises(ScheduleConfigError, match="multiple of the number of devices"):
        generate("bpipe-interleaved", 4, 6)


def _reference_bpipe(p: int, m: int, v: int = 1) -> Schedule:
    """BPipe built the direct way, from action lists: each device's list with the transfers
    :func:`plan_transfers` plans for it inserted before their compute actions, then each
    transfer's mirror inserted in the acceptor's list before the first action whose running
    maximum of start times (F = 1, BW = 2, transfer 0.5) reaches the transfer's start, in
    time order. :func:`bpipe` builds the same schedule on arrays."""
    base = one_f_one_b(p, m) if v == 1 else interleaved(p, m, v)
    capacity = bpipe_mu_opt(p, v)
    rows, pairs = [], []
    for r, row in enumerate(base.actions):
        where = [i for i, a in enumerate(row) if a.kind in (K.F, K.BW)]
        transfers, _ = plan_transfers([row[i] for i in where], capacity)
        new_row = list(row)
        for i, planned in reversed(list(zip(where, transfers, strict=True))):
            new_row[i:i] = [
                Action(kind, s, mb, base.chunk_of(s), peer=p - 1 - r) for kind, (s, mb) in planned
            ]
        if any(transfers):
            pairs.append([r, p - 1 - r])
        rows.append(new_row)
    evictor_only = Schedule("bpipe", p, m, base.stage_devices, tuple(map(tuple, rows)))
    compiled = compile_schedule(evictor_only)
    durations = [1.0 if a.kind is K.F else 2.0 for a in compiled.action_of]
    start = run_timing(compiled, durations, transfer=0.5).start
    mirrors: dict[int, list[tuple[float, Action]]] = {}
    for i, (device, _, a) in enumerate(evictor_only.iter_actions()):
        if a.kind.is_transfer:
            mirror = Action(a.kind, a.stage, a.microbatch, a.chunk, device)
            mirrors.setdefault(a.peer, []).append((start[i], mirror))
    offset = 0
    for device, row in enumerate(rows):
        started = np.maximum.accumulate(start[offset : offset + len(row)]).tolist()
        offset += len(row)
        placed = []
        for time, mirror in sorted(mirrors.get(device, []), key=lambda item: item[0]):
            place = next((k for k, t in enumerate(started) if t >= time), len(row))
            placed.append((place, mirror))
        for place, mirror in reversed(placed):
            row.insert(place, mirror)
    name = "bpipe" if v == 1 else "bpipe-interleaved"
    meta = {"mu_opt": capacity, "pairs": pairs, "num_chunks": v}
    return Schedule(name, p, m, base.stage_devices, tuple(map(tuple, rows)), meta=meta)


@pytest.mark.parametrize(
    "p, m, v",
    [(p, m, 1) for p in (2, 3, 4, 5, 6, 7, 8, 9, 12, 16) for m in (1, 2, 3, 5, 8, 13, 3 * p + 2)]
    + [(p, p * k, v) for p in (2, 3, 4, 5, 8) for k in (1, 2, 3) for v in (2, 3)],
)
def test_bpipe_is_its_reference_built_from_action_lists(p, m, v):
    ours, reference = bpipe(p, m, v), _reference_bpipe(p, m, v)
    assert ours == reference
    # The columns it was built on are the columns of its actions.
    read_back = _columns(reference)
    for field in ("device", "kind", "stage", "microbatch", "chunk", "peer", "version", "offsets"):
        assert np.array_equal(getattr(ours.columns, field), getattr(read_back, field)), field
