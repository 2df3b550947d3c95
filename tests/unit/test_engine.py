"""The timing engine against a direct transcription of its semantics.

:func:`reference_timing` follows each device's list with its compute-lane free time, its
copy engine and its pending copy fences, and waits for inputs as the module docstring of
:mod:`planner.schedules._engine` states them; :func:`run_timing` reads precomputed inputs
per action in a fixed run order instead (see ``_Steps``). The two must give the same floats,
not merely close ones: the planner's output is compared byte for byte.
"""

from __future__ import annotations

import random

import pytest

from planner.errors import InvalidScheduleError
from planner.schedules import (
    SCHEDULE_NAMES,
    Action,
    ActionKind,
    Schedule,
    schedule_family,
    with_communication,
)
from planner.schedules._bpipe import bpipe
from planner.schedules._engine import (
    COMPUTE,
    TRANSFER,
    CompiledSchedule,
    _deadlock_message,
    _is_run_order,
    _likely_order,
    compile_schedule,
    run_timing,
)
from planner.simulate import Durations, simulate
from tests.unit.helpers import generate_any

K = ActionKind


def reference_timing(
    compiled: CompiledSchedule,
    duration: list[float],
    comm: float,
    transfer: float,
    overlap_transfers: bool,
) -> tuple[list[float], list[float]]:
    """(start, end) of every action, each device's list followed in order: an action waits
    until its inputs have ended (plus ``comm`` from another device) and its device is free;
    an overlapped transfer also waits for the copy engine, and the second compute action
    after it waits for it. Raises InvalidScheduleError (rule 6) when no device can go on."""
    n = len(compiled.lane)
    lane = compiled.lane.tolist()
    dep_a, cross_a = compiled.dep_a.tolist(), compiled.cross_a.tolist()
    dep_b, cross_b = compiled.dep_b.tolist(), compiled.cross_b.tolist()
    offsets = compiled.offsets.tolist()
    num_devices = len(offsets) - 1
    start = [0.0] * n
    end = [-1.0] * n  # -1: not yet timed
    pointer = offsets[:-1].copy()
    free = [0.0] * num_devices
    copy_free = [0.0] * num_devices
    fences: list[list[list[float]]] = [[] for _ in range(num_devices)]  # [computes to pass, end]
    progress = True
    while progress:
        progress = False
        for device in range(num_devices):
            i = pointer[device]
            while i < offsets[device + 1]:
                ready = 0.0
                blocked = False
                for j, cross in ((dep_a[i], cross_a[i]), (dep_b[i], cross_b[i])):
                    if j >= 0:
                        if end[j] < 0:
                            blocked = True
                            break
                        ready = max(ready, end[j] + comm if cross else end[j])
                if blocked:
                    break
                if lane[i] == COMPUTE:
                    s = max(free[device], ready)
                    keep = []
                    for fence in fences[device]:
                        fence[0] -= 1
                        if fence[0] <= 0:
                            s = max(s, fence[1])
                        else:
                            keep.append(fence)
                    fences[device] = keep
                    e = s + duration[i]
                    free[device] = e
                elif lane[i] == TRANSFER and overlap_transfers:
                    s = max(free[device], ready, copy_free[device])
                    e = s + transfer
                    copy_free[device] = e
                    fences[device].append([2.0, e])
                elif lane[i] == TRANSFER:
                    s = max(free[device], ready)
                    e = s + transfer
                    free[device] = e
                else:
                    s = e = free[device]
                start[i], end[i] = s, e
                i += 1
                progress = True
            pointer[device] = i
    if min(end, default=0.0) < 0:
        raise InvalidScheduleError(6, _deadlock_message(compiled, pointer, end))
    return start, end


def _cases() -> list[tuple[str, int, int]]:
    """Every family on a few shapes it accepts (small and uneven ones included)."""
    out = []
    for name in SCHEDULE_NAMES:
        family = schedule_family(name)
        for p, factor in ((2, 1), (3, 2), (4, 3), (5, 2), (8, 2)):
            if family.uses_pass_times and p > 5:
                continue
            if family.microbatches_multiple_of_devices:
                m = p * factor
            elif family.microbatches_at_least_devices:
                m = p + factor
            else:
                m = 2 * factor + 1
            if p >= family.min_devices and family.problem(p, m) is None:
                out.append((name, p, m))
    return out


def _random_durations(compiled: CompiledSchedule, rng: random.Random) -> list[float]:
    """Per-action durations with zeros and repeated values among them (ties are where a
    different order of maxima could show)."""
    choices = [0.0, 0.1, 0.3, 1.0, 1 / 3, 2.5]
    return [rng.choice(choices) if rng.random() < 0.5 else rng.random() for _ in compiled.lane]


def _assert_engine_is_reference(schedule: Schedule, seed: int) -> None:
    rng = random.Random(seed)
    compiled = compile_schedule(schedule)
    for comm, transfer in ((0.0, 0.0), (0.25, 0.5), (1 / 3, 0.1), (0.0, 3.0)):
        duration = _random_durations(compiled, rng)
        for overlap in (True, False):
            timing = run_timing(
                compiled, duration, comm=comm, transfer=transfer, overlap_transfers=overlap
            )
            expected = reference_timing(compiled, duration, comm, transfer, overlap)
            assert (timing.start, timing.end) == expected


@pytest.mark.parametrize("name, p, m", _cases())
def test_the_engine_times_every_family_like_the_reference(name, p, m):
    schedule = generate_any(name, p, m)
    _assert_engine_is_reference(schedule, seed=p * 100 + m)
    _assert_engine_is_reference(with_communication(schedule), seed=p * 100 + m + 1)


@pytest.mark.parametrize("p, m, chunks", [(4, 8, 1), (6, 12, 1), (9, 20, 1), (4, 8, 2), (6, 6, 2)])
def test_the_engine_times_bpipe_like_the_reference(p, m, chunks):
    """BPipe has transfers: copy-engine order, fences and LOAD inputs all matter."""
    _assert_engine_is_reference(bpipe(p, m, chunks), seed=p + m + chunks)


def _hand_made(rows: list[list[str]], m: int) -> Schedule:
    """Two stages on devices 0 and 1."""
    return Schedule(
        "hand",
        len(rows),
        m,
        (0, 1),
        tuple(tuple(Action.parse(text) for text in row) for row in rows),
    )


def test_transfers_bunched_between_compute_actions_and_after_the_last_one():
    """Several transfers between two compute actions (the compute action two after them
    waits for the last), a transfer after the first compute action, LOADs right before
    their backward, and a device whose list ends with a transfer."""
    device_0 = ["0F0", "0EVICT0@1", "0F1", "0EVICT1@1", "0F2", "0F3", "0EVICT2@1", "0EVICT3@1"]
    device_0 += ["0LOAD0@1", "0LOAD1@1", "0BW0", "0BW1", "0LOAD2@1", "0BW2", "0LOAD3@1"]
    device_0 += ["0BW3", "0EVICT3@1"]
    device_1 = ["1F0", "1F1", "1BW0", "1F2", "1BW1", "1F3", "1BW2", "1BW3"]
    schedule = _hand_made([device_0, device_1], 4)
    _assert_engine_is_reference(schedule, seed=7)


def test_a_deadlock_is_reported_like_the_reference():
    """Device 0 waits for device 1's backward, which waits for device 0's forward."""
    compiled = compile_schedule(_hand_made([["0BW0", "0F0"], ["1F0", "1BW0"]], 1))
    with pytest.raises(InvalidScheduleError) as ours:
        run_timing(compiled, [1.0] * 4)
    with pytest.raises(InvalidScheduleError) as theirs:
        reference_timing(compiled, [1.0] * 4, 0.0, 0.0, True)
    assert str(ours.value) == str(theirs.value)
    assert "device 0 is stuck at 0BW0 waiting for 1BW0 on device 1" in str(ours.value)


def test_an_input_later_in_the_own_list_is_a_deadlock():
    compiled = compile_schedule(_hand_made([["0F0", "0BW0"], ["1BW0", "1F0"]], 1))
    with pytest.raises(InvalidScheduleError, match="device 1 is stuck at 1BW0 waiting for 1F0"):
        run_timing(compiled, [1.0] * 4)


@pytest.mark.parametrize("name, p, m, guessed", [("bpipe", 6, 12, True), ("v-min", 8, 26, False)])
def test_the_run_order_keeps_each_list_in_order_and_inputs_first(name, p, m, guessed):
    """Whether the cheap guess is taken (bpipe) or the lists are followed (v-min's devices
    do not advance in step), the order is one the devices can run in."""
    compiled = compile_schedule(generate_any(name, p, m))
    assert _is_run_order(compiled, _likely_order(compiled)) is guessed
    assert _is_run_order(compiled, compiled.order)
    assert not _is_run_order(compiled, compiled.order[::-1])
    order = compiled.order.tolist()
    assert sorted(order) == list(range(len(compiled.lane)))
    position = {i: k for k, i in enumerate(order)}
    for i in range(len(order)):
        assert all(position[j] < position[i] for j in compiled.inputs(i))
        if i + 1 < len(order) and compiled.device_of[i] == compiled.device_of[i + 1]:
            assert position[i] < position[i + 1]


@pytest.mark.parametrize("name", ["bpipe", "2bw", "v-zb", "interleaved"])
def test_a_device_span_ends_at_the_latest_end_in_its_list(name):
    """simulate reads a device's span end off its last compute action and last transfer;
    that is the latest end over the device's whole list."""
    schedule = with_communication(generate_any(name, 4, 8))
    for overlap in (True, False):
        durations = Durations(1.0, 1.5, 0.5, comm=0.1, transfer=2.5, overlap_transfers=overlap)
        result = simulate(schedule, durations, track_memory=False)
        offsets = schedule.columns.offsets.tolist()
        for device, stats in enumerate(result.devices):
            assert stats.end == max(result.end[offsets[device] : offsets[device + 1]])
