"""The schedule registry: one entry per schedule family, the one place that knows a family.

Everything outside :mod:`planner.schedules` asks an entry (:class:`ScheduleFamily`) instead of
comparing a schedule's name: the cost model (stages per device, placement, in-flight counts,
weight copies, transfers), the search (which (p, m) a family can run), launch (which runtimes
can run it), the API and CLI (names, parameters) and the dashboard. A schedule name is data.

Adding a schedule is one module in this package: its generator plus a :func:`register` call
with its entry (``planner/schedules/__init__.py`` imports every module of the package, so
nothing else names it). Listings follow :attr:`ScheduleFamily.listing`, then the name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

from planner.errors import ScheduleConfigError
from planner.schedules._inflight import InflightProfile
from planner.schedules._ir import ActionKind, Schedule, looped_placement, v_placement

__all__ = [
    "BASELINE_SCHEDULE",
    "MEMORY_LIMIT",
    "NUM_BATCHES",
    "NUM_CHUNKS",
    "RUNTIMES",
    "Parameter",
    "PassTimes",
    "Runtime",
    "ScheduleFamily",
    "Semantics",
    "families",
    "register",
    "schedule_family",
    "schedule_names",
]

Runtime = Literal["stagewright", "torch", "megatron"]
RUNTIMES: tuple[Runtime, ...] = ("stagewright", "torch", "megatron")
"""stagewright's executor; torch.distributed.pipelining (its CSV runtime); Megatron-LM."""
Semantics = Literal["synchronous", "stale"]
BASELINE_SCHEDULE = "1f1b"
"""The reference every other schedule is compared with (``speedup_vs_1f1b``; memory limits
are fractions of its peak activation)."""


@dataclass(frozen=True)
class Parameter:
    """A generator parameter a family takes besides devices and micro-batches."""

    name: str
    description: str
    default: float | None  # None: the caller must give it
    minimum: float
    integer: bool = True

    def check(self, family: str, value: float) -> float:
        """``value`` if it suits this parameter, else a ScheduleConfigError saying why."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ScheduleConfigError(f"{family}: {self.name} must be a number, got {value!r}")
        if not math.isfinite(value):  # int() of infinity would raise OverflowError below
            raise ScheduleConfigError(f"{family}: {self.name} must be a finite number, got {value}")
        if self.integer and value != int(value):
            raise ScheduleConfigError(f"{family}: {self.name} must be a whole number, got {value}")
        if not value >= self.minimum:  # also refuses NaN
            raise ScheduleConfigError(
                f"{family}: {self.name} must be at least {self.minimum:g}, got {value}"
            )
        return int(value) if self.integer else float(value)


NUM_CHUNKS = Parameter("num_chunks", "Stages per device (v).", 2, 1)
NUM_BATCHES = Parameter("num_batches", "Batches run one after the other without a flush.", 2, 1)
MEMORY_LIMIT = Parameter(
    "memory_limit",
    "Activation memory limit per device, as a fraction of 1F1B's peak (1F1B's device 0).",
    None,
    0.0,
    integer=False,
)


@dataclass(frozen=True)
class PassTimes:
    """Pass times a family that searches by time (the adaptive ones) builds for: F, B and W
    of every stage (one number for all stages, or one per stage) and the time of one hop
    between devices. The default is the papers' unit cell: F = B = W = 1, no communication."""

    forward: float | tuple[float, ...] = 1.0
    backward: float | tuple[float, ...] = 1.0
    weight: float | tuple[float, ...] = 1.0
    comm: float = 0.0

    def per_stage(self, num_stages: int) -> tuple[list[float], list[float], list[float]]:
        """F, B and W of each stage; a list of the wrong length is an error."""
        out = []
        for label, value in (
            ("forward", self.forward),
            ("backward", self.backward),
            ("weight", self.weight),
        ):
            values = [float(value)] * num_stages if isinstance(value, int | float) else list(value)
            if len(values) != num_stages:
                raise ScheduleConfigError(
                    f"{label} times: got {len(values)} values for {num_stages} stages"
                )
            if any(not v >= 0 for v in values):
                raise ScheduleConfigError(f"{label} times must be >= 0, got {values}")
            out.append([float(v) for v in values])
        return out[0], out[1], out[2]


Builder = Callable[[int, int, Mapping[str, float], PassTimes], Schedule]


@dataclass(frozen=True, kw_only=True)
class ScheduleFamily:
    """Everything stagewright knows about one schedule family.

    ``build(devices, microbatches, parameters)`` returns the schedule (unvalidated) with the
    family's ``parameters`` resolved (defaults filled, see :meth:`resolve`).
    """

    name: str
    title: str
    citation: str
    build: Builder
    parameters: tuple[Parameter, ...] = ()
    placement: Literal["looped", "v"] = "looped"
    """Stage -> device: ``looped`` puts stage s on device s % p (one stage per device, or
    ``num_chunks`` when the family has that parameter); ``v`` puts two stages per device in a
    V (device i holds stages i and 2p - 1 - i)."""
    split_backward: bool = False
    """Backward split into B (input gradient) and W (weight gradient); the executor runs them
    as separate actions."""
    transfers: bool = False
    """BPipe's EVICT/LOAD between pair devices: the executor moves saved activations, the
    cost model prices the pair link and places pairs adjacently (BPipe §3.5)."""
    weight_versions: int = 1
    """Weight copies a device keeps (2 for PipeDream-2BW)."""
    semantics: Semantics = "synchronous"
    """``synchronous``: the same gradients as a single process; ``stale``: an update uses
    gradients of older weights (PipeDream-2BW's 1-stale rule)."""
    runtimes: frozenset[Runtime] = frozenset({"stagewright"})
    """Which runtimes can run the schedule as planned."""
    min_devices: int = 1
    microbatches_multiple_of_devices: bool = False
    microbatches_at_least_devices: bool = False
    flush_per_batch: bool = True
    """False when batches follow one another without a flush (2BW): its steady state is per
    batch, not per micro-batch."""
    idle_vs_1f1b: float = 1.0
    """Idle time relative to 1F1B's (p - 1) stage times, used only to rank candidates before
    the exact simulation."""
    inflight_saturation: Callable[[int], int] | None = None
    """Micro-batches after which the in-flight profile stops changing, as a function of p
    (tests check each against building every micro-batch); None: build all of them."""
    inflight: Callable[[int, int, Mapping[str, float]], InflightProfile] | None = None
    """``inflight(devices, microbatches, parameters)``: the in-flight profile of what
    ``build`` makes (:func:`~planner.schedules._inflight.inflight_profile`), for a family
    that reads it off its own orders faster than the schedule is made; None: counted from
    the built schedule."""
    inflight_grows_with_microbatches: bool = False
    """Peak saved micro-batches proportional to m (GPipe): count with one and scale."""
    memory_rule: str = ""
    """The family's activation memory, in words (for people; the numbers come from the
    schedule's own order)."""
    memory_fallback_for: str | None = None
    """The family this one saves memory for: it is searched only where that family runs out
    of memory with the same (t, p, d, micro-batch, recompute). Where the base fits, the
    variant's transfers only cost time (BPipe §4.2 evaluates activation balancing only for
    the configurations Megatron-LM's 1F1B cannot run)."""
    single_device_as: str | None = None
    """The family that runs the same passes on one pipeline device (p = 1) in the same time
    with no more memory (and the same semantics or better): there is no pipeline to schedule,
    so where that family is searched too this one is not searched at p = 1, rather than
    ranked as a second row of the same configuration."""
    generation_growth_devices: int | None = None
    """When set, the generator's time per action grows with the devices beyond about this
    many (the V warm-up fill is searched device by device): a service bounds a request's
    work up front with it (:func:`planner.schedules.generation_work`). None: linear."""
    uses_pass_times: bool = False
    """The generator searches for the fastest schedule under the pass times it is given
    (:class:`PassTimes`), so the same (p, m, parameters) can give different orders."""
    rebuild: Callable[[Mapping[str, Any], int, int], Schedule] | None = None
    """For a family that searches: ``rebuild(choice, p, m)`` builds the choice its search
    made (``schedule.meta["choice"]``: the limit and the block, or the pass times) for p
    devices and m micro-batches without searching again."""
    smallest_memory_limit: Callable[[int, int], float] | None = None
    """For a family with a memory limit: the smallest one any of its schedules on (p, m)
    meets; a smaller limit is refused with this number."""
    search_work: Callable[[int, int], int] | None = None
    """For a family that searches: the work of the search on (p, m) besides building the
    result, in actions built (what a service bounds a request by)."""
    largest_memory_limit: Callable[[int, int], float] | None = None
    """For a family with a memory limit: the limit beyond which its schedules on (p, m)
    no longer change (more memory buys nothing)."""
    idle_at_limit: Callable[[float], float] | None = None
    """For a family with a memory limit: :attr:`idle_vs_1f1b` as a function of the limit
    (ranking only; the simulator prices the real schedule)."""
    listing: int = 100
    """Where the family appears in listings (the CLI's choices, ``GET /v1/schedules``, the
    dashboard, a plan's default search): by this number, then by name. The eight names of
    the service contract come first, in its order (10 to 80)."""

    # ------------------------------------------------------------------ questions
    @cached_property
    def parameter_names(self) -> tuple[str, ...]:
        # Cached (entries are frozen): every candidate of a search asks :meth:`has_parameter`.
        return tuple(p.name for p in self.parameters)

    def has_parameter(self, name: str) -> bool:
        return name in self.parameter_names

    def transfer_problem(self, given: Sequence[str]) -> str | None:
        """Why transfer settings (``given``, as the caller names them) do not apply to this
        family, or None: only a family that moves activations between devices has EVICT and
        LOAD to time or to block on (the command line and /v1/simulate say it alike)."""
        if not given or self.transfers:
            return None
        moving = ", ".join(f.name for f in families() if f.transfers)
        one = len(given) == 1
        return (
            f"{' and '.join(given)} {'does' if one else 'do'} not apply to {self.name}: only "
            f"schedules that move activations between devices have EVICT/LOAD transfers "
            f"({moving}); leave {'it' if one else 'them'} out"
        )

    def blocking_problem(self, blocking: str | None, time: str, transfer: float) -> str | None:
        """Why blocking transfers (``blocking``: the caller's name of the setting that makes
        them block, None when it is not set) with a ``transfer`` time of 0 (the setting the
        caller names ``time``) are refused, or None: a transfer blocks its device for the
        time it takes, so with no time it blocks nothing and the setting would change
        nothing. Only for a family with transfers (:meth:`transfer_problem` refuses both
        settings elsewhere); the command line and /v1/simulate say it alike."""
        if blocking is None or transfer != 0 or not self.transfers:
            return None
        return (
            f"{blocking} needs {time} above 0: it makes {self.name}'s EVICT/LOAD transfers "
            f"block the device for the time they take, and at {time} 0 (the default) they "
            f"take none, so it would change nothing; give {time} (the time of one EVICT or "
            f"LOAD) too, or leave {blocking} out"
        )

    def resolve(self, given: Mapping[str, float]) -> dict[str, float]:
        """The family's parameters with defaults filled. A parameter the family does not
        take, or a missing required one, is an error naming what it takes."""
        known = {p.name: p for p in self.parameters}
        unknown = sorted(set(given) - set(known))
        if unknown:
            takes = ", ".join(known) if known else "none"
            raise ScheduleConfigError(
                f"{self.name} has no parameter {', '.join(unknown)}; its parameters: {takes}"
            )
        values: dict[str, float] = {}
        for name, parameter in known.items():
            if name in given:
                values[name] = parameter.check(self.name, given[name])
            elif parameter.default is None:
                raise ScheduleConfigError(
                    f"{self.name} needs {name}: {parameter.description[0].lower()}"
                    f"{parameter.description[1:]}"
                )
            else:
                values[name] = parameter.default
        return values

    def stages_per_device(self, parameters: Mapping[str, float] | None = None) -> int:
        if self.placement == "v":
            return 2
        if self.has_parameter(NUM_CHUNKS.name):
            return int(self.resolve(parameters or {})[NUM_CHUNKS.name])
        return 1

    def num_stages(self, num_devices: int, parameters: Mapping[str, float] | None = None) -> int:
        return num_devices * self.stages_per_device(parameters)

    def stage_devices(
        self, num_devices: int, parameters: Mapping[str, float] | None = None
    ) -> tuple[int, ...]:
        """Stage -> device, by the family's placement rule (no schedule needed)."""
        if self.placement == "v":
            return v_placement(num_devices)
        return looped_placement(num_devices, self.stages_per_device(parameters))

    def problem(self, num_devices: int, num_microbatches: int) -> str | None:
        """Why the family cannot run p devices with m micro-batches, or None."""
        p, m = num_devices, num_microbatches
        if p < self.min_devices:
            return f"{self.name} needs a pipeline of at least {self.min_devices} devices (p = {p})"
        if self.microbatches_multiple_of_devices and m % p:
            return f"{self.name} needs the micro-batches ({m}) to be a multiple of p = {p}"
        if self.microbatches_at_least_devices and m < p:
            return f"{self.name} needs at least p = {p} micro-batches per batch, got {m}"
        return None

    def actions_problem(self, schedule: Schedule) -> str | None:
        """Why ``schedule``'s actions cannot be this family's, or None: its stages placed
        otherwise than the family places them, a split backward (B and W) where the family
        has none or the reverse, EVICT/LOAD in a family without transfers, weight versions
        or batches without a flush in a family that keeps one copy and flushes each batch.
        A document that names one family over another's actions would be run, priced and
        reported as the named one."""
        p, stages = schedule.num_devices, schedule.num_stages
        named = f"schedule.name is {self.name!r}, but its actions"
        expected: tuple[int, ...] | None = None
        if stages % p == 0:
            chunks = {NUM_CHUNKS.name: float(stages // p)}
            try:
                expected = self.stage_devices(p, chunks if self.has_parameter("num_chunks") else {})
            except ScheduleConfigError:  # a number of chunks the family does not take
                expected = None
        if expected != schedule.stage_devices:
            wanted = expected or self.stage_devices(p)
            return (
                f"{named} place {stages} stages on {p} devices as "
                f"{list(schedule.stage_devices)}, where {self.name} places "
                f"{len(wanted)} as {list(wanted)}; name the schedule that built the actions"
            )
        if schedule.split_backward != self.split_backward:
            has = "split" if schedule.split_backward else "do not split"
            return (
                f"{named} {has} the backward into B and W, which {self.name} "
                f"{'does' if self.split_backward else 'does not'}; name the schedule that "
                "built the actions"
            )
        if not self.transfers and schedule.count(ActionKind.EVICT, ActionKind.LOAD):
            return (
                f"{named} move activations (EVICT/LOAD), which {self.name} does not; name the "
                "schedule that built the actions"
            )
        versioned = any(a.version is not None for _, _, a in schedule.iter_actions())
        if self.weight_versions == 1 and versioned:
            return (
                f"{named} use weight versions, but {self.name} keeps one copy of the weights; "
                "name the schedule that built the actions"
            )
        if self.flush_per_batch and schedule.num_batches != 1:
            return (
                f"{named} run {schedule.num_batches} batches without a flush, but "
                f"{self.name} flushes after each; name the schedule that built the actions"
            )
        return self.problem(p, schedule.num_microbatches)

    def idle_estimate(
        self, memory_limit: float | None = None, num_chunks: int | None = None
    ) -> float:
        """Idle time relative to 1F1B's, for ranking candidates before simulating them. For
        a family with ``num_chunks``, :attr:`idle_vs_1f1b` is the idle at the parameter's
        default, and v chunks a device scale it by default / v: the bubble of interleaved
        1F1B is (p - 1) / v stage times of 1F1B's (p - 1) (Narayanan et al. 2021, §2.2)."""
        if self.idle_at_limit is not None and memory_limit is not None:
            return self.idle_at_limit(memory_limit)
        default = self.chunks_default
        if num_chunks is None or default is None or num_chunks == default:
            return self.idle_vs_1f1b
        return self.idle_vs_1f1b * default / num_chunks

    @cached_property
    def chunks_default(self) -> int | None:
        """The default of the family's ``num_chunks`` (stages per device), or None when it
        takes no such parameter."""
        for parameter in self.parameters:
            if parameter.name == NUM_CHUNKS.name:
                assert parameter.default is not None
                return int(parameter.default)
        return None

    def default_chunks(self, num_chunks: int | None) -> bool:
        """Whether ``num_chunks`` is what the family uses when none is given (None, or its
        default): such a count is left out of JSON and of labels."""
        return num_chunks is None or num_chunks == self.chunks_default

    def inflight_microbatches(self, num_devices: int, num_microbatches: int) -> int:
        """Micro-batches to build the schedule with to count the in-flight micro-batches of
        a run of m (see :attr:`inflight_saturation`)."""
        if self.inflight_grows_with_microbatches:
            return 1
        if self.inflight_saturation is None:
            return num_microbatches
        return min(num_microbatches, self.inflight_saturation(num_devices))

    def describe(self) -> dict[str, object]:
        """The entry as JSON-able data (the API's and the dashboard's view)."""
        return {
            "name": self.name,
            "title": self.title,
            "citation": self.citation,
            "parameters": [
                {
                    "name": p.name,
                    "description": p.description,
                    "default": p.default,
                    "minimum": p.minimum,
                    "integer": p.integer,
                }
                for p in self.parameters
            ],
            "placement": self.placement,
            "stages_per_device": self.stages_per_device(),
            "split_backward": self.split_backward,
            "transfers": self.transfers,
            "weight_versions": self.weight_versions,
            "semantics": self.semantics,
            "runtimes": [r for r in RUNTIMES if r in self.runtimes],
            "min_devices": self.min_devices,
            "memory_rule": self.memory_rule,
            "memory_fallback_for": self.memory_fallback_for,
            "single_device_as": self.single_device_as,
            "uses_pass_times": self.uses_pass_times,
        }


_FAMILIES: dict[str, ScheduleFamily] = {}


def register(family: ScheduleFamily) -> ScheduleFamily:
    """Add ``family`` to the registry (once per name)."""
    if family.name in _FAMILIES:
        raise ValueError(f"schedule family {family.name!r} is registered twice")
    _FAMILIES[family.name] = family
    return family


def schedule_family(name: str) -> ScheduleFamily:
    """The entry of ``name``; an unknown name is an error listing the known ones."""
    found = _FAMILIES.get(name)
    if found is None:
        raise ScheduleConfigError(
            f"unknown schedule {name!r}; choose one of {', '.join(map(repr, schedule_names()))}"
        )
    return found


def families() -> tuple[ScheduleFamily, ...]:
    """Every registered family, in listing order."""
    return tuple(sorted(_FAMILIES.values(), key=lambda f: (f.listing, f.name)))


def schedule_names() -> tuple[str, ...]:
    """Every registered name, in listing order."""
    return tuple(f.name for f in families())
