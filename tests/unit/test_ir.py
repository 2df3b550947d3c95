"""The schedule IR: action strings, JSON round trips, and the validator's rules."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest

from planner.errors import InvalidScheduleError
from planner.schedules import (
    SCHEDULE_NAMES,
    Action,
    ActionKind,
    Schedule,
    generate,
    validate,
    with_communication,
)
from planner.schedules._ir import actions_from_columns
from tests.unit.helpers import generate_any

K = ActionKind


@pytest.mark.parametrize(
    "text, action",
    [
        ("0F3", Action(K.F, 0, 3)),
        ("12BW0", Action(K.BW, 12, 0)),
        ("5B2", Action(K.B, 5, 2)),
        ("5W2", Action(K.W, 5, 2)),
        ("0EVICT1@3", Action(K.EVICT, 0, 1, peer=3)),
        ("2VERSION8v1", Action(K.WEIGHT_VERSION, 2, 8, version=1)),
        ("1SEND_F4@2", Action(K.SEND_F, 1, 4, peer=2)),
    ],
)
def test_action_strings_round_trip(text, action):
    assert str(action) == text
    assert Action.parse(text) == action


@pytest.mark.parametrize("text", ["", "F3", "0X3", "0F", "0F3@", "a0F3"])
def test_unreadable_action_names_the_expected_form(text):
    with pytest.raises(InvalidScheduleError, match="expected <stage><kind><microbatch>"):
        Action.parse(text)


def test_actions_are_immutable_and_hashable():
    action = Action(K.F, 0, 0)
    with pytest.raises(AttributeError):
        action.stage = 1  # type: ignore[misc]
    assert len({action, Action(K.F, 0, 0)}) == 1


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_json_round_trip_is_exact(name):
    schedule = generate_any(name, 4, 8)
    again = Schedule.from_json(schedule.to_json())
    assert again.actions == schedule.actions
    assert again.stage_devices == schedule.stage_devices
    assert again.to_dict() == schedule.to_dict()
    validate(again)


def test_json_keeps_chunks_of_v_shape():
    schedule = generate("v-half", 4, 4)
    again = Schedule.from_json(schedule.to_json())
    assert {a.chunk for acts in again.actions for a in acts} == {0, 1}


@pytest.mark.parametrize(
    "text, message",
    [
        ("[]", "must be an object"),
        ("{", "not valid JSON"),
        ('{"format": "other"}', "unknown schedule format"),
        ('{"format": "stagewright.schedule/1"}', "missing or has a bad field"),
    ],
)
def test_bad_json_is_rejected_with_a_reason(text, message):
    with pytest.raises(InvalidScheduleError, match=message):
        Schedule.from_json(text)


def _two_stage(rows: list[list[str]], **changes) -> Schedule:
    base = Schedule(
        "hand",
        2,
        2,
        (0, 1),
        tuple(tuple(Action.parse(t) for t in row) for row in rows),
    )
    return replace(base, **changes)


GOOD = [
    ["0F0", "0F1", "0BW0", "0BW1", "0STEP1"],
    ["1F0", "1BW0", "1F1", "1BW1", "1STEP1"],
]


def test_hand_written_schedule_is_valid():
    validate(_two_stage(GOOD))


@pytest.mark.parametrize(
    "rows, rule, message",
    [
        # A B before its F.
        ([["0F0", "0BW1", "0F1", "0BW0", "0STEP1"], GOOD[1]], 4, "before its forward"),
        # A stage/device mismatch.
        ([["0F0", "0F1", "0BW0", "0BW1", "0STEP1", "1F0"], GOOD[1]], 2, "stage/device mismatch"),
        # A collision: the same pass twice.
        ([["0F0", "0F0", "0F1", "0BW0", "0BW1", "0STEP1"], GOOD[1]], 3, "collision"),
        # A missing backward.
        ([["0F0", "0F1", "0BW0", "0STEP1"], GOOD[1]], 3, "has no BW"),
        # A micro-batch that does not exist.
        ([["0F0", "0F1", "0F2", "0BW0", "0BW1", "0STEP1"], GOOD[1]], 1, "out of range"),
        # Orders that wait on each other.
        ([GOOD[0], ["1BW0", "1F0", "1F1", "1BW1", "1STEP1"]], 4, "before its forward"),
        (
            [["0F0", "0BW0", "0F1", "0BW1", "0STEP1"], ["1F1", "1BW1", "1F0", "1BW0", "1STEP1"]],
            6,
            "deadlock",
        ),
        # An optimizer step before the backward passes.
        ([["0F0", "0F1", "0BW0", "0STEP1", "0BW1"], GOOD[1]], 9, "before all 2 backward"),
        # A LOAD of something never evicted.
        (
            [
                ["0F0", "0F1", "0BW0", "0LOAD1@1", "0BW1", "0STEP1"],
                ["1F0", "1BW0", "0LOAD1@0", "1F1", "1BW1", "1STEP1"],
            ],
            7,
            "never evicted",
        ),
        # An EVICT with no LOAD before the backward.
        (
            [
                ["0F0", "0F1", "0EVICT1@1", "0BW0", "0BW1", "0STEP1"],
                ["1F0", "0EVICT1@0", "1BW0", "1F1", "1BW1", "1STEP1"],
            ],
            7,
            "a LOAD must come first",
        ),
        # A transfer without its mirror on the peer.
        (
            [["0F0", "0F1", "0EVICT1@1", "0BW0", "0LOAD1@1", "0BW1", "0STEP1"], GOOD[1]],
            7,
            "exactly one mirror",
        ),
        # A weight version nobody produced.
        (
            [["0F0", "0VERSION1v1", "0F1", "0BW0", "0BW1", "0STEP1"], GOOD[1]],
            10,
            "has not been produced",
        ),
        # A SEND without its RECV.
        ([["0F0", "0SEND_F0@1", "0F1", "0BW0", "0BW1", "0STEP1"], GOOD[1]], 8, "unmatched"),
    ],
)
def test_validator_rejects_impossible_schedules(rows, rule, message):
    with pytest.raises(InvalidScheduleError, match=message) as info:
        validate(_two_stage(rows))
    assert info.value.rule == rule


def test_w_before_b_is_rejected():
    rows = [
        ["0F0", "0F1", "0W0", "0B0", "0B1", "0W1", "0STEP1"],
        ["1F0", "1B0", "1W0", "1F1", "1B1", "1W1", "1STEP1"],
    ]
    with pytest.raises(InvalidScheduleError, match="before its B") as info:
        validate(_two_stage(rows, split_backward=True))
    assert info.value.rule == 4


def test_wrong_chunk_is_rejected():
    schedule = generate("interleaved", 2, 2)
    row = list(schedule.actions[0])
    row[0] = row[0]._replace(chunk=1)
    bad = replace(schedule, actions=(tuple(row), schedule.actions[1]))
    with pytest.raises(InvalidScheduleError, match="chunk") as info:
        validate(bad)
    assert info.value.rule == 1


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_explicit_communication_pairs_every_send_with_a_receive(name):
    schedule = with_communication(generate_any(name, 4, 8))
    validate(schedule)
    sends = schedule.count(K.SEND_F, K.SEND_B)
    assert sends == schedule.count(K.RECV_F, K.RECV_B)
    # Each cross-device edge of each micro-batch is sent once in each direction.
    cross = sum(
        1
        for s in range(schedule.num_stages - 1)
        if schedule.stage_devices[s] != schedule.stage_devices[s + 1]
    )
    assert sends == 2 * cross * schedule.total_microbatches


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_actions_made_from_columns_are_the_schedules_actions(name):
    """Generators that compute a schedule as arrays make its actions from the columns;
    the columns of any schedule (peers, weight versions and SEND/RECV included) give its
    actions back."""
    for schedule in (generate_any(name, 4, 8), with_communication(generate_any(name, 4, 8))):
        assert actions_from_columns(schedule.columns) == schedule.actions


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_a_schedule_kept_as_columns_is_the_same_schedule_and_makes_its_actions_when_read(name):
    """What a cache keeps of a schedule (its columns alone) equals the schedule, as data and
    as the JSON the executor runs; no action is made until one is read."""
    for schedule in (generate_any(name, 4, 8), with_communication(generate_any(name, 4, 8))):
        kept = schedule.columns_only()
        assert "actions" not in vars(kept)
        assert kept.total_microbatches == schedule.total_microbatches
        assert kept.to_dict() == schedule.to_dict()  # reads the actions: made now
        assert "actions" in vars(kept)
        assert kept == schedule
        assert pickle.loads(pickle.dumps(schedule.columns_only())) == schedule


def test_a_schedule_without_actions_or_columns_has_no_actions_to_make():
    """Only a schedule made from columns makes its actions on read: any other attribute
    that is missing is still an AttributeError."""
    kept = generate_any("1f1b", 2, 2).columns_only()
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        kept.nonsense  # noqa: B018
