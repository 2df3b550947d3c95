"""The schedule IR: per device, an ordered list of typed actions.

One IR serves the simulator (which prices it) and the executor (which runs it), so what the
planner predicts is what the executor does. A schedule is plain, immutable data; its JSON form
is what the executor loads.

Terms
-----
- *stage*: one contiguous slice of the model's layers, numbered 0..num_stages-1 in forward
  order. A device may hold several stages (interleaved 1F1B, V-shape).
- *chunk*: the index of a stage among the stages of its device, in stage order (V-shape:
  chunk 0 is the stage on the way down, chunk 1 the stage on the way back).
- *micro-batch*: numbered 0..num_batches*num_microbatches-1; only 2BW runs more than one
  batch in one schedule (it has no flush between batches).

Action strings
--------------
``str(action)`` is ``{stage}{kind}{microbatch}``, as in torch.distributed.pipelining
(``0F3`` is stage 0, forward, micro-batch 3), with ``@{peer}`` for actions that talk to
another device and ``v{version}`` for weight-version switches: ``0EVICT1@3``, ``2VERSION8v1``.
:meth:`Action.parse` reads them back.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property, partial
from itertools import chain, pairwise, repeat
from operator import itemgetter
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from planner._gc import collector_paused
from planner.errors import InvalidScheduleError

__all__ = [
    "KIND_CODE",
    "SCHEDULE_FORMAT",
    "Action",
    "ActionKind",
    "Columns",
    "Schedule",
    "actions_from_columns",
]

SCHEDULE_FORMAT = "stagewright.schedule/1"


class ActionKind(StrEnum):
    """What an action does. Compute kinds occupy the device; the others move data."""

    F = "F"
    """Forward pass of one stage for one micro-batch; saves that micro-batch's activations."""
    B = "B"
    """Backward for the input only (zero-bubble split); W must follow for the weights."""
    W = "W"
    """Backward for the weights; frees the activations that B kept."""
    BW = "BW"
    """Fused backward (input and weights); frees the micro-batch's activations."""
    SEND_F = "SEND_F"
    """Send a forward output to the device of the next stage (explicit-communication form)."""
    RECV_F = "RECV_F"
    """Receive a forward input from the device of the previous stage."""
    SEND_B = "SEND_B"
    """Send an input gradient to the device of the previous stage."""
    RECV_B = "RECV_B"
    """Receive an output gradient from the device of the next stage."""
    EVICT = "EVICT"
    """BPipe: move a micro-batch's saved activations of ``stage`` to the pair device (``peer``).

    On the evictor's list it is issued when the device reaches it and overlaps the next
    compute action; the compute action after that one waits for it. The acceptor's list
    carries a mirror with ``peer`` set to the evictor (where it posts the receive)."""
    LOAD = "LOAD"
    """BPipe: bring evicted activations back from the pair device before their backward."""
    OPTIMIZER_STEP = "STEP"
    """Apply the accumulated gradients of ``stage``; ``microbatch`` is the last one they cover."""
    WEIGHT_VERSION = "VERSION"
    """2BW: forwards of ``stage`` from ``microbatch`` on use weight version ``version``."""

    @property
    def is_compute(self) -> bool:
        return self in _COMPUTE_KINDS

    @property
    def is_backward(self) -> bool:
        return self in (ActionKind.B, ActionKind.BW)

    @property
    def is_transfer(self) -> bool:
        return self in (ActionKind.EVICT, ActionKind.LOAD)

    @property
    def is_p2p(self) -> bool:
        return self in _P2P_KINDS


_COMPUTE_KINDS = frozenset(
    {ActionKind.F, ActionKind.B, ActionKind.W, ActionKind.BW, ActionKind.OPTIMIZER_STEP}
)
_P2P_KINDS = frozenset({ActionKind.SEND_F, ActionKind.RECV_F, ActionKind.SEND_B, ActionKind.RECV_B})
# Longest kinds first so that "BW" is not read as "B" followed by garbage.
_KIND_ALTERNATION = "|".join(sorted((k.value for k in ActionKind), key=len, reverse=True))
_ACTION_RE = re.compile(rf"^(\d+)({_KIND_ALTERNATION})(\d+)(?:@(\d+))?(?:v(\d+))?$")


class Action(NamedTuple):
    """One step of one device: ``kind`` applied to (``stage``, ``microbatch``).

    ``chunk`` is the stage's index among its device's stages. ``peer`` names the other device
    of a SEND/RECV/EVICT/LOAD; ``version`` the weight version of a WEIGHT_VERSION switch.

    A named tuple (immutable, hashable) rather than a frozen dataclass: generators create
    hundreds of thousands per search, and a tuple is created about 2.5x faster.
    """

    kind: ActionKind
    stage: int
    microbatch: int
    chunk: int = 0
    peer: int | None = None
    version: int | None = None

    def __str__(self) -> str:
        text = f"{self.stage}{self.kind.value}{self.microbatch}"
        if self.peer is not None:
            text += f"@{self.peer}"
        if self.version is not None:
            text += f"v{self.version}"
        return text

    @classmethod
    def parse(cls, text: str, chunk: int = 0) -> Action:
        """Read an action string (see the module docstring); ``chunk`` is not in the string."""
        match = _ACTION_RE.match(text.strip())
        if match is None:
            raise InvalidScheduleError(
                1,
                f"cannot read action {text!r}: expected <stage><kind><microbatch>[@peer][vN] "
                f"with kind one of {', '.join(k.value for k in ActionKind)}, e.g. '0F3'",
            )
        stage, kind, microbatch, peer, version = match.groups()
        return cls(
            kind=ActionKind(kind),
            stage=int(stage),
            microbatch=int(microbatch),
            chunk=chunk,
            peer=None if peer is None else int(peer),
            version=None if version is None else int(version),
        )


@dataclass(frozen=True)
class Schedule:
    """A complete pipeline schedule: which device does what, in which order.

    The contract: ``actions[d]`` is device ``d``'s list, executed in order; stage ``s`` lives
    on device ``stage_devices[s]``; every micro-batch passes F through all stages in order and
    then its backward in reverse order. Timing is not part of the schedule: the simulator
    derives it from durations, the executor from running it. Use
    :func:`planner.schedules.validate` to check the rules; generators always return valid
    schedules.
    """

    name: str
    num_devices: int
    num_microbatches: int
    stage_devices: tuple[int, ...]
    actions: tuple[tuple[Action, ...], ...]
    split_backward: bool = False
    num_batches: int = 1
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def num_stages(self) -> int:
        return len(self.stage_devices)

    @property
    def total_microbatches(self) -> int:
        return self.num_microbatches * self.num_batches

    def stages_of(self, device: int) -> tuple[int, ...]:
        """The stages held by ``device``, in stage order (index = chunk)."""
        return tuple(s for s, d in enumerate(self.stage_devices) if d == device)

    @cached_property
    def _chunk_of_stage(self) -> dict[int, int]:
        return _chunks(self.stage_devices)

    @classmethod
    def from_columns(
        cls,
        name: str,
        num_devices: int,
        num_microbatches: int,
        stage_devices: tuple[int, ...],
        columns: Columns,
        *,
        split_backward: bool = False,
        num_batches: int = 1,
        meta: Mapping[str, Any] | None = None,
    ) -> Schedule:
        """The schedule a generator computed as arrays: ``columns`` serve as its
        :attr:`columns` as they are, and its :attr:`actions` are made from them
        (:func:`actions_from_columns`) when first read.

        A search builds and prices many schedules without reading an action of them (the
        timing engine and the memory counts read the columns): making 10^5 action objects
        each, and having the collector walk them while the schedule is cached, took about
        0.05 s of the cold 1,024-GPU example's 0.7 s search."""
        schedule = cls.__new__(cls)
        schedule.__dict__.update(
            name=name,
            num_devices=num_devices,
            num_microbatches=num_microbatches,
            stage_devices=stage_devices,
            split_backward=split_backward,
            num_batches=num_batches,
            meta={} if meta is None else meta,
            columns=columns,  # what the cached property would compute
        )
        return schedule

    if not TYPE_CHECKING:  # type checkers see ``actions`` as the field it is

        def __getattr__(self, name: str) -> Any:
            # Only reached when ``name`` is not in the instance: the actions of a schedule
            # made by :meth:`from_columns`, made on first read (two threads reading at once
            # both make the same actions; either is kept).
            if name == "actions" and "columns" in self.__dict__:
                actions = actions_from_columns(self.__dict__["columns"])
                self.__dict__["actions"] = actions
                return actions
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def columns_only(self) -> Schedule:
        """The same schedule holding its :attr:`columns` alone (equal to this one): what a
        cache keeps, its actions made again only if read (:meth:`from_columns`)."""
        return Schedule.from_columns(
            self.name,
            self.num_devices,
            self.num_microbatches,
            self.stage_devices,
            self.columns,
            split_backward=self.split_backward,
            num_batches=self.num_batches,
            meta=self.meta,
        )

    @cached_property
    def columns(self) -> Columns:
        """Every action as NumPy columns, devices in order (what whole-schedule checks and
        the timing engine's compilation work on)."""
        return _columns(self)

    def chunk_of(self, stage: int) -> int:
        """The chunk (index among its device's stages) of ``stage``."""
        return self._chunk_of_stage[stage]

    def iter_actions(self) -> Iterator[tuple[int, int, Action]]:
        """Yield (device, position in its list, action) for every action."""
        for device, device_actions in enumerate(self.actions):
            for position, action in enumerate(device_actions):
                yield device, position, action

    def count(self, *kinds: ActionKind) -> int:
        wanted = set(kinds)
        return sum(1 for acts in self.actions for a in acts if a.kind in wanted)

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """The JSON form the executor runs. Action lists are action strings."""
        return {
            "format": SCHEDULE_FORMAT,
            "name": self.name,
            "num_devices": self.num_devices,
            "num_stages": self.num_stages,
            "num_microbatches": self.num_microbatches,
            "num_batches": self.num_batches,
            "split_backward": self.split_backward,
            "stage_devices": list(self.stage_devices),
            "meta": _jsonable(self.meta),
            "actions": [[str(a) for a in acts] for acts in self.actions],
        }

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Schedule:
        """Read the JSON form back. Structure errors raise InvalidScheduleError (rule 1);
        call :func:`planner.schedules.validate` for the semantic rules."""
        if data.get("format") != SCHEDULE_FORMAT:
            raise InvalidScheduleError(
                1, f"unknown schedule format {data.get('format')!r}; expected {SCHEDULE_FORMAT!r}"
            )
        try:
            stage_devices = tuple(int(d) for d in data["stage_devices"])
            num_devices = int(data["num_devices"])
            rows: Sequence[Sequence[str]] = data["actions"]
            name = str(data["name"])
            num_microbatches = int(data["num_microbatches"])
            num_batches = int(data.get("num_batches", 1))
            split_backward = bool(data.get("split_backward", False))
            meta = dict(data.get("meta", {}))
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidScheduleError(
                1, f"schedule JSON is missing or has a bad field: {exc}"
            ) from exc
        if len(rows) != num_devices:
            raise InvalidScheduleError(
                1, f"'actions' has {len(rows)} device lists but num_devices is {num_devices}"
            )
        chunk_of_stage = _chunks(stage_devices)
        actions = []
        for row in rows:
            parsed = []
            for text in row:
                action = Action.parse(text)
                chunk = chunk_of_stage.get(action.stage, 0)
                parsed.append(
                    Action(
                        action.kind,
                        action.stage,
                        action.microbatch,
                        chunk,
                        action.peer,
                        action.version,
                    )
                )
            actions.append(tuple(parsed))
        return cls(
            name=name,
            num_devices=num_devices,
            num_microbatches=num_microbatches,
            stage_devices=stage_devices,
            actions=tuple(actions),
            split_backward=split_backward,
            num_batches=num_batches,
            meta=meta,
        )

    @classmethod
    def from_json(cls, text: str) -> Schedule:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidScheduleError(1, f"schedule is not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise InvalidScheduleError(1, "schedule JSON must be an object")
        return cls.from_dict(data)


KIND_CODE = {kind: code for code, kind in enumerate(ActionKind)}
"""Integer code of each kind in :class:`Columns` (the enum's order)."""


@dataclass(frozen=True)
class Columns:
    """A schedule's actions as arrays, one entry per action, devices in order and each
    device's list in order; ``offsets[d]`` is where device d's actions start. ``peer`` and
    ``version`` are -1 where the action has none."""

    device: np.ndarray
    kind: np.ndarray
    stage: np.ndarray
    microbatch: np.ndarray
    chunk: np.ndarray
    peer: np.ndarray
    version: np.ndarray
    offsets: np.ndarray


_MISSING: dict[int | None, int] = {None: -1}


def _columns(schedule: Schedule) -> Columns:
    # One field of every action at a time, read by itemgetter in C (an action is a tuple).
    flat = list(chain.from_iterable(schedule.actions))
    n = len(flat)
    sizes = [len(row) for row in schedule.actions]
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])

    def column(index: int) -> np.ndarray:
        return np.fromiter(map(itemgetter(index), flat), np.int64, n)

    def optional(index: int) -> np.ndarray:
        """-1 where the field is None."""
        values = list(map(itemgetter(index), flat))
        if values.count(None) == n:
            return np.full(n, -1, np.int64)
        return np.fromiter(map(_MISSING.get, values, values), np.int64, n)  # None -> -1

    return Columns(
        device=np.repeat(np.arange(len(sizes), dtype=np.int64), sizes),
        kind=np.fromiter(map(KIND_CODE.__getitem__, map(itemgetter(0), flat)), np.int64, n),
        stage=column(1),
        microbatch=column(2),
        chunk=column(3),
        peer=optional(4),
        version=optional(5),
        offsets=offsets,
    )


_KINDS = tuple(ActionKind)  # kind of each code of Columns.kind
_new_action = partial(tuple.__new__, Action)  # Action(*fields) without a Python-level call


def actions_from_columns(columns: Columns) -> tuple[tuple[Action, ...], ...]:
    """The per-device action lists ``columns`` describe (what :attr:`Schedule.actions`
    holds): generators that compute their schedule as arrays make the actions here, in
    one pass that creates nothing but the actions."""
    fields: list[Iterable[Any]] = [
        map(_KINDS.__getitem__, columns.kind.tolist()),
        columns.stage.tolist(),
        columns.microbatch.tolist(),
        columns.chunk.tolist(),
    ]
    for optional in (columns.peer, columns.version):
        fields.append(
            repeat(None)
            if not (optional >= 0).any()
            else [None if x < 0 else x for x in optional.tolist()]
        )
    # The collector would walk every live object several times while 10^5 actions are
    # made and find nothing (actions hold no cycles): about a quarter of the time.
    with collector_paused():
        flat = list(map(_new_action, zip(*fields, strict=False)))  # the None columns repeat
    bounds = columns.offsets.tolist()
    return tuple(tuple(flat[a:b]) for a, b in pairwise(bounds))


def looped_placement(num_devices: int, num_chunks: int = 1) -> tuple[int, ...]:
    """Stage -> device when chunks loop over the devices (1F1B, GPipe, interleaved):
    stage s runs on device ``s % num_devices``."""
    return tuple(s % num_devices for s in range(num_devices * num_chunks))


def v_placement(num_devices: int) -> tuple[int, ...]:
    """Stage -> device of the V-shape schedules: the first half of the stages goes down the
    devices, the second half comes back up, so device i holds stages i and 2d - 1 - i."""
    d = num_devices
    return tuple(s if s < d else 2 * d - 1 - s for s in range(2 * d))


def _chunks(stage_devices: Sequence[int]) -> dict[int, int]:
    """stage -> chunk (index of the stage among its device's stages)."""
    seen: dict[int, int] = {}
    chunk_of: dict[int, int] = {}
    for stage, device in enumerate(stage_devices):
        chunk_of[stage] = seen.get(device, 0)
        seen[device] = chunk_of[stage] + 1
    return chunk_of


def _jsonable(value: Any) -> Any:
    """Meta values may hold tuples; JSON wants lists."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value
