"""The validator: one function that checks a schedule against the IR's rules.

It runs in tests, after every generator, when a schedule is loaded from JSON, and at executor
start-up. Each violation raises :class:`InvalidScheduleError` with the rule's number:

1. Structure: devices, stages, micro-batch numbers and chunks are in range and consistent.
2. Placement: compute actions sit on the device of their stage; SEND/RECV/EVICT/LOAD name a
   valid peer (the neighbour stage's device, or the BPipe pair).
3. Completeness: every (stage, micro-batch) has exactly one F and exactly one BW, or exactly
   one B and one W when the schedule splits the backward; a duplicate is a collision.
4. Order: on its device, a backward comes after its F, and a W after its B.
5. Inputs: every action's inputs (previous stage's F, next stage's backward) exist.
6. No deadlock: the devices' orders can all run to the end.
7. Transfers: an EVICT follows the F of what it moves and precedes its LOAD; a LOAD moves
   something evicted and precedes the backward that needs it; each has one mirror on the
   peer device.
8. Point-to-point: each SEND has exactly one matching RECV on the peer, and the RECV comes
   before the compute that consumes it.
9. Optimizer steps: each stage steps once per batch, after all backward work of that batch.
10. Weight versions (2BW): versions only move forward and are produced by a step first.
"""

from __future__ import annotations

from collections import Counter
from typing import NoReturn

import numpy as np

from planner.errors import InvalidScheduleError
from planner.schedules._engine import compile_schedule
from planner.schedules._ir import KIND_CODE, Action, ActionKind, Schedule
from planner.schedules._validate_fast import rules_hold

__all__ = ["validate"]

K = ActionKind


def _fail(rule: int, message: str) -> NoReturn:
    raise InvalidScheduleError(rule, message)


def validate(schedule: Schedule) -> Schedule:
    """Check every rule; return the schedule unchanged so calls can be chained.

    Rules 1-4 and 9 are first checked on the schedule's columns at once
    (:mod:`planner.schedules._validate_fast`); only when that finds a violation do the
    per-action checks below run, in rule order, to name the first one. Rules 7, 8 and 10
    look only at the actions they concern."""
    if not rules_hold(schedule):
        _check_structure(schedule)
        _check_placement(schedule)
        _check_completeness(schedule)
        _check_order(schedule)
        _check_transfers(schedule)
        _check_p2p(schedule)
        _check_steps(schedule)
    else:
        _check_transfers(schedule)
        _check_p2p(schedule)
    _check_versions(schedule)
    # Rules 5 and 6 come from the engine: whether the orders deadlock depends on the
    # orders only, which is what the engine's run order finds.
    compile_schedule(schedule).order  # noqa: B018 (computed for its check)
    return schedule


def _check_structure(s: Schedule) -> None:
    if s.num_devices < 1:
        _fail(1, f"a schedule needs at least one device, got {s.num_devices}")
    if len(s.actions) != s.num_devices:
        _fail(1, f"{len(s.actions)} action lists for {s.num_devices} devices")
    if s.num_microbatches < 1 or s.num_batches < 1:
        _fail(1, "num_microbatches and num_batches must be at least 1")
    if not s.stage_devices:
        _fail(1, "a schedule needs at least one stage")
    for stage, device in enumerate(s.stage_devices):
        if not 0 <= device < s.num_devices:
            _fail(1, f"stage {stage} is placed on device {device}, which does not exist")
    for device in range(s.num_devices):
        if not s.stages_of(device):
            _fail(1, f"device {device} holds no stage")
    total = s.total_microbatches
    for device, _, a in s.iter_actions():
        if not 0 <= a.stage < s.num_stages:
            _fail(
                1,
                f"{a} on device {device}: stage {a.stage} does not exist "
                f"(stages 0..{s.num_stages - 1})",
            )
        if not 0 <= a.microbatch < total:
            _fail(
                1,
                f"{a} on device {device}: micro-batch {a.microbatch} is out of range "
                f"0..{total - 1}",
            )
        if a.chunk != s.chunk_of(a.stage):
            _fail(
                1,
                f"{a} on device {device}: chunk {a.chunk}, but stage {a.stage} is chunk "
                f"{s.chunk_of(a.stage)} of device {s.stage_devices[a.stage]}",
            )


def _check_placement(s: Schedule) -> None:
    for device, _, a in s.iter_actions():
        owner = s.stage_devices[a.stage]
        if a.kind.is_transfer:
            if a.peer is None or not 0 <= a.peer < s.num_devices or a.peer == device:
                _fail(2, f"{a} on device {device} needs a peer device other than itself")
            if device != owner and a.peer != owner:
                _fail(
                    2,
                    f"{a} on device {device}: stage {a.stage} lives on device {owner}, "
                    f"so this must be on device {owner} or be its mirror with peer {owner}",
                )
        elif a.kind.is_p2p:
            if device != owner:
                _fail(2, f"{a} is on device {device} but stage {a.stage} is on device {owner}")
            neighbour = a.stage + (
                1
                if a.kind is K.SEND_F
                else -1
                if a.kind is K.SEND_B
                else -1
                if a.kind is K.RECV_F
                else 1
            )
            if not 0 <= neighbour < s.num_stages or a.peer != s.stage_devices[neighbour]:
                _fail(
                    2, f"{a} on device {device}: its peer must be the device of stage {neighbour}"
                )
        elif device != owner:
            _fail(
                2,
                f"{a} is on device {device} but stage {a.stage} is on device {owner} "
                f"(a stage/device mismatch)",
            )


def _check_completeness(s: Schedule) -> None:
    counts: Counter[tuple[ActionKind, int, int]] = Counter()
    for _, _, a in s.iter_actions():
        if a.kind in (K.F, K.B, K.W, K.BW):
            counts[(a.kind, a.stage, a.microbatch)] += 1
    for (kind, stage, mb), n in counts.items():
        if n > 1:
            _fail(3, f"collision: {stage}{kind.value}{mb} appears {n} times")
    wanted = (K.B, K.W) if s.split_backward else (K.BW,)
    unwanted = (K.BW,) if s.split_backward else (K.B, K.W)
    for stage in range(s.num_stages):
        for mb in range(s.total_microbatches):
            for kind in (K.F, *wanted):
                if counts[(kind, stage, mb)] != 1:
                    _fail(
                        3,
                        f"stage {stage} micro-batch {mb} has no {kind.value}"
                        + (
                            " (the schedule splits the backward into B and W)"
                            if s.split_backward and kind is not K.F
                            else ""
                        ),
                    )
            for kind in unwanted:
                if counts[(kind, stage, mb)]:
                    _fail(
                        3,
                        f"{stage}{kind.value}{mb}: this schedule "
                        + (
                            "splits the backward into B and W"
                            if s.split_backward
                            else "fuses the backward into BW"
                        ),
                    )


def _check_order(s: Schedule) -> None:
    for device, acts in enumerate(s.actions):
        seen: set[tuple[ActionKind, int, int]] = set()
        for a in acts:
            key = (a.stage, a.microbatch)
            if a.kind in (K.B, K.BW) and (K.F, *key) not in seen:
                _fail(
                    4, f"{a} on device {device} comes before its forward {a.stage}F{a.microbatch}"
                )
            if a.kind is K.W and (K.B, *key) not in seen:
                _fail(4, f"{a} on device {device} comes before its B {a.stage}B{a.microbatch}")
            seen.add((a.kind, *key))


def _check_transfers(s: Schedule) -> None:
    columns = s.columns
    moving = (columns.kind == KIND_CODE[K.EVICT]) | (columns.kind == KIND_CODE[K.LOAD])
    if not moving.any():
        return
    mirrors: Counter[tuple[ActionKind, int, int, int]] = Counter()
    owned: list[tuple[int, Action]] = []
    slots = columns.stage * s.total_microbatches + columns.microbatch  # (stage, micro-batch)
    for device, acts in enumerate(s.actions):
        # Only what this device moves can break the rule: follow those micro-batches' actions.
        first, last = columns.offsets[device], columns.offsets[device + 1]
        here = np.flatnonzero(moving[first:last])
        if not len(here):
            continue
        slot = slots[first:last]
        state: dict[tuple[int, int], str] = {}
        for i in np.flatnonzero(np.isin(slot, slot[here])).tolist():
            a = acts[i]
            key = (a.stage, a.microbatch)
            if a.kind.is_transfer and s.stage_devices[a.stage] != device:
                mirrors[(a.kind, a.stage, a.microbatch, device)] += 1
                continue
            if a.kind is K.F:
                state[key] = "saved"
            elif a.kind is K.EVICT:
                owned.append((device, a))
                if state.get(key) != "saved":
                    _fail(
                        7,
                        f"{a} on device {device}: nothing to evict (its forward has not run, "
                        f"or it was already evicted or consumed)",
                    )
                state[key] = "evicted"
            elif a.kind is K.LOAD:
                owned.append((device, a))
                if state.get(key) != "evicted":
                    _fail(7, f"{a} on device {device}: LOAD of something never evicted")
                state[key] = "saved"
            elif a.kind in (K.B, K.BW) and state.get(key) == "evicted":
                _fail(
                    7,
                    f"{a} on device {device} runs while its activations are evicted; "
                    f"a LOAD must come first",
                )
            elif a.kind in (K.W, K.BW):
                state[key] = "consumed"
        left = [k for k, v in state.items() if v == "evicted"]
        if left:
            _fail(
                7, f"device {device} never loads back stage {left[0][0]} micro-batch {left[0][1]}"
            )
    for device, a in owned:
        assert a.peer is not None
        n = mirrors.pop((a.kind, a.stage, a.microbatch, a.peer), 0)
        if n != 1:
            _fail(
                7, f"{a} on device {device} needs exactly one mirror on device {a.peer}, found {n}"
            )
    if mirrors:
        kind, stage, mb, device = next(iter(mirrors))
        _fail(
            7,
            f"{stage}{kind.value}{mb} on device {device} mirrors a transfer that its "
            f"owner never issues",
        )


def _check_p2p(s: Schedule) -> None:
    p2p = [KIND_CODE[k] for k in (K.SEND_F, K.RECV_F, K.SEND_B, K.RECV_B)]
    if not np.isin(s.columns.kind, p2p).any():
        return
    sends: Counter[tuple[ActionKind, int, int]] = Counter()
    recvs: Counter[tuple[ActionKind, int, int]] = Counter()
    expected = _expected_recvs(s)
    for device, acts in enumerate(s.actions):
        received: set[tuple[ActionKind, int, int]] = set()
        for a in acts:
            if a.kind is K.SEND_F:
                sends[(K.RECV_F, a.stage + 1, a.microbatch)] += 1
            elif a.kind is K.SEND_B:
                sends[(K.RECV_B, a.stage - 1, a.microbatch)] += 1
            elif a.kind in (K.RECV_F, K.RECV_B):
                recvs[(a.kind, a.stage, a.microbatch)] += 1
                received.add((a.kind, a.stage, a.microbatch))
            elif (
                a.kind is K.F
                and (K.RECV_F, a.stage, a.microbatch) in expected
                and (K.RECV_F, a.stage, a.microbatch) not in received
            ):
                _fail(8, f"{a} on device {device} runs before {a.stage}RECV_F{a.microbatch}")
    if sends != recvs:
        missing = (sends - recvs) or (recvs - sends)
        kind, stage, mb = next(iter(missing))
        _fail(
            8,
            f"unmatched point-to-point action around {stage}{kind.value}{mb}: every SEND "
            f"needs exactly one RECV on the peer",
        )


def _expected_recvs(s: Schedule) -> frozenset[tuple[ActionKind, int, int]]:
    return frozenset(
        (a.kind, a.stage, a.microbatch) for acts in s.actions for a in acts if a.kind is K.RECV_F
    )


def _check_steps(s: Schedule) -> None:
    m = s.num_microbatches
    for device, acts in enumerate(s.actions):
        done: Counter[tuple[int, int]] = Counter()  # (stage, batch) -> finished backwards
        steps: Counter[int] = Counter()
        for a in acts:
            if a.kind in (K.W, K.BW):
                done[(a.stage, a.microbatch // m)] += 1
            elif a.kind is K.OPTIMIZER_STEP:
                batch = a.microbatch // m
                if done[(a.stage, batch)] != m:
                    _fail(
                        9,
                        f"{a} on device {device} steps before all {m} backward passes of "
                        f"batch {batch} on stage {a.stage} are done",
                    )
                steps[a.stage] += 1
        for stage in s.stages_of(device):
            if steps[stage] != s.num_batches:
                _fail(
                    9,
                    f"stage {stage} steps its optimizer {steps[stage]} times; expected once "
                    f"per batch ({s.num_batches})",
                )


def _check_versions(s: Schedule) -> None:
    if not (s.columns.kind == KIND_CODE[K.WEIGHT_VERSION]).any():
        return  # steps that name a version only produce it; nothing can go backwards
    for device, acts in enumerate(s.actions):
        produced = dict.fromkeys(s.stages_of(device), 0)
        current = dict(produced)
        for a in acts:
            if a.kind is K.OPTIMIZER_STEP and a.version is not None:
                produced[a.stage] = a.version
            elif a.kind is K.WEIGHT_VERSION:
                if a.version is None or a.version < current[a.stage]:
                    _fail(10, f"{a} on device {device}: weight versions only move forward")
                elif a.version > produced[a.stage]:
                    _fail(
                        10,
                        f"{a} on device {device}: version {a.version} has not been produced "
                        f"by an optimizer step yet",
                    )
                current[a.stage] = a.version
