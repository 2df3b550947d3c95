"""The grid: enumerate a request's search space and prune it.

Constraints (BPipe §4.2, generalised): heads % t == 0 and key/value heads % t == 0; with
sequence parallelism, t divides each rank's s / cp tokens (Megatron-LM scatters them over the
tensor-parallel ranks and asserts it); t divides the GPUs per node; t x cp x p x d == number of
GPUs (cp the context-parallel degree, see
:func:`context_degrees`); global batch % (mb x d) == 0; layers spread over the schedule's
stages with no empty middle stage (interleaved schedules: p x v stages for every v of
``search.num_chunks``); interleaved needs m % p == 0 and p >= 2; 2BW needs m >= p;
BPipe and V-shape need p >= 2; the runtime the request asks for must run the candidate as
planned; BPipe is searched only where its base schedule, searched too, runs out of memory.
Every point that breaks one is listed as rejected with the reason, as is every candidate
over the device's memory (with its predicted numbers), except those with no configuration
to list (t that does not split the model, mb x d that does not divide the global batch),
which :func:`unsearched` describes for the plan's notes.

:func:`enumerate_space` estimates every remaining candidate once (fast pricing: exact memory,
approximate time) and returns them sorted by estimated step time; what to simulate and how
to rank is :mod:`planner.plan`'s business.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from planner.assemble import memory_rejection
from planner.costmodel.adaptive import built_for_a_limit
from planner.costmodel.evaluate import (
    Estimate,
    PlanContext,
    adaptive_limit,
    estimate,
    num_stages,
    split_layers,
    stage_costs,
)
from planner.launch.runtimes import runtime_limits
from planner.placement import Placement
from planner.schedules import RUNTIMES, schedule_family
from planner.specs import (
    DEFAULT_MICRO_BATCH_SIZES,
    CandidateConfig,
    PlanRequest,
    Recompute,
    Rejected,
)

__all__ = [
    "DEFAULT_MICRO_BATCH_SIZES",
    "SearchPoint",
    "SearchSpace",
    "context_degrees",
    "enumerate_space",
    "runtime_problem",
    "schedule_chunks",
    "schedule_problem",
    "search_points",
    "unsearched",
]


@dataclass(frozen=True)
class SearchPoint:
    """(t, p, d, micro-batch size, cp) of the search space."""

    t: int
    p: int
    d: int
    mb: int
    cp: int = 1


def _divisors(n: int) -> list[int]:
    """Divisors of n in increasing order, in O(sqrt n) steps (n may be a cluster's GPUs)."""
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return small + [n // k for k in reversed(small) if k * k != n]


def context_degrees(request: PlanRequest, t: int) -> list[int]:
    """Context-parallel degrees searched with tensor-parallel degree t: the request's
    ``search.context_parallel``, or by default 1 and, with flash attention (Megatron-LM runs
    context parallelism only through it), every cp > 1 that keeps the t x cp group inside a
    node and splits the sequence into 2 x cp equal chunks."""
    wanted = request.search.context_parallel
    if wanted is not None:
        return wanted
    if not request.training.flash_attention:
        return [1]
    seq = request.model.seq_length
    # Whether sequence parallelism can split each rank's s / cp tokens over t is checked
    # where these are used (:func:`_splits`), for a requested list and this one alike.
    return [
        cp for cp in _divisors(request.cluster.gpus_per_node // t) if cp == 1 or seq % (2 * cp) == 0
    ]


def _sequence_split_problem(request: PlanRequest, t: int, cp: int) -> str | None:
    """Why sequence parallelism cannot split each context-parallel rank's s / cp tokens over t
    ranks (Megatron-LM's scatter asserts they divide, tensor_parallel/mappings.py), or None.
    With cp = 1, :func:`_tensor_split_problem` already says it for the whole t."""
    if not (request.training.sequence_parallel and t > 1):
        return None
    tokens = request.model.seq_length // cp
    if tokens % t == 0:
        return None
    return (
        f"sequence parallelism splits each rank's {tokens} tokens (seq_length / cp) over t = "
        f"{t}, which does not divide them (training.sequence_parallel false searches it)"
    )


def _splits(request: PlanRequest) -> Iterator[tuple[int, int, int, int]]:
    """(t, cp, p, d) whose product is the cluster's GPUs, t dividing the GPUs per node and
    splitting the model's layers."""
    cluster = request.cluster
    gpus = cluster.num_gpus
    for t in _divisors(cluster.gpus_per_node):
        if t > gpus or gpus % t or _tensor_split_problem(request, t) is not None:
            continue
        for cp in context_degrees(request, t):
            if gpus % (t * cp) or _sequence_split_problem(request, t, cp) is not None:
                continue
            for p in _divisors(gpus // (t * cp)):
                yield t, cp, p, gpus // (t * cp * p)


def search_points(request: PlanRequest) -> Iterator[tuple[SearchPoint, int]]:
    """(t, p, d, mb, cp) that meet the parallelism and batch constraints, with m."""
    sizes = request.search.micro_batch_sizes or list(DEFAULT_MICRO_BATCH_SIZES)
    batch = request.training.global_batch_size
    for t, cp, p, d in _splits(request):
        for mb in sizes:
            if batch % (mb * d) == 0:
                yield SearchPoint(t, p, d, mb, cp), batch // (mb * d)


def _tensor_split_problem(request: PlanRequest, t: int) -> str | None:
    """Why the model's layers cannot be split over t tensor-parallel GPUs, or None:
    Megatron's column-parallel layers split the heads, the key/value heads and the MLP, and
    with sequence parallelism the layer norms and dropouts split the sequence."""
    uneven = request.model.tensor_split_problems(
        t, split_sequence=request.training.sequence_parallel
    )
    parts = [
        f"{_SPLIT_LABELS[name]} ({size})"
        + (
            ", which training.sequence_parallel splits over the tensor-parallel ranks (false "
            "searches it)"
            if name == "seq_length"
            else ""
        )
        for name, size in uneven.items()
    ]
    return None if not parts else " or ".join(parts)


# What :meth:`ModelSpec.tensor_split_problems` names, as the search's notes say it.
_SPLIT_LABELS = {
    "num_attention_heads": "attention heads",
    "num_query_groups": "key/value heads",
    "ffn_hidden_size": "FFN width",
    "seq_length": "sequence length",
}


def _listing(values: list[int]) -> str:
    return ", ".join(map(str, values))


def _not_searched(what: str, values: list[int], why: str) -> str:
    """'<what>[s] <values> not searched<why>'."""
    return f"{what}{'s' if len(values) > 1 else ''} {_listing(values)} not searched{why}"


def unsearched(request: PlanRequest) -> list[str]:
    """What of the request's space no candidate covers, one line a cause: tensor-parallel
    degrees the model cannot be split over, context-parallel degrees (those the request
    names) that divide no split of the cluster, and the micro-batch sizes (those the request
    names) and data-parallel degrees that no partner makes a divisor of the global batch.
    These points have no configuration to list as rejected (no whole m), so the plan says
    so here rather than leaving them out without a word."""
    cluster, batch = request.cluster, request.training.global_batch_size
    gpus = cluster.num_gpus
    notes = []
    tensor = [t for t in _divisors(cluster.gpus_per_node) if t <= gpus and gpus % t == 0]
    for t in tensor:
        problem = _tensor_split_problem(request, t)
        if problem is not None:
            notes.append(
                f"tensor-parallel degree {t} not searched: {t} does not divide the model's "
                f"{problem}"
            )
    splits = list(_splits(request))
    wanted_cp = request.search.context_parallel or []
    for t in tensor:
        if _tensor_split_problem(request, t) is not None:
            continue
        for cp in wanted_cp:
            problem = _sequence_split_problem(request, t, cp)
            if problem is not None and gpus % (t * cp) == 0:
                notes.append(
                    f"context-parallel degree {cp} not searched with tensor-parallel degree "
                    f"{t}: {problem}"
                )
    unused_cp = sorted(set(wanted_cp) - {cp for _, cp, _, _ in splits})
    if unused_cp:
        notes.append(
            _not_searched(
                "context-parallel degree",
                unused_cp,
                f": t x cp divides the cluster's {gpus} GPUs for no tensor-parallel degree "
                "searched",
            )
        )
    sizes = request.search.micro_batch_sizes or list(DEFAULT_MICRO_BATCH_SIZES)
    degrees = sorted({d for _, _, _, d in splits})
    if not degrees:
        return notes  # no split of the cluster at all: the lines above say why
    fits = {(mb, d) for mb in sizes for d in degrees if batch % (mb * d) == 0}
    if request.search.micro_batch_sizes is not None:
        unused = [mb for mb in sizes if all((mb, d) not in fits for d in degrees)]
        if unused:
            notes.append(
                _not_searched(
                    "micro-batch size",
                    unused,
                    f": the global batch {batch} is not a multiple of mb x d for any "
                    f"data-parallel degree d this cluster allows ({_listing(degrees)})",
                )
            )
    idle = [d for d in degrees if all((mb, d) not in fits for mb in sizes)]
    if idle:
        notes.append(
            _not_searched(
                "data-parallel degree",
                idle,
                f" (nor the t x p splits that need them): the global batch {batch} is not a "
                f"multiple of mb x d for any micro-batch size searched ({_listing(sizes)})",
            )
        )
    return notes


def schedule_chunks(request: PlanRequest, schedule: str) -> list[int | None]:
    """The chunks per device searched for ``schedule``: every v of ``search.num_chunks`` for
    a family whose devices hold num_chunks stages, else [None] (its placement fixes them)."""
    if schedule_family(schedule).chunks_default is None:
        return [None]
    return list(request.search.num_chunks)


def schedule_problem(
    schedule: str, point: SearchPoint, m: int, layers: int, num_chunks: int | None = None
) -> str | None:
    """Why ``schedule`` (with ``num_chunks`` stages a device, for a family that takes them)
    cannot run at this point (a readable reason), or None."""
    p = point.p
    family = schedule_family(schedule)
    problem = family.problem(p, m)
    if problem is not None:
        return problem
    stages = num_stages(schedule, p, num_chunks)
    if split_layers(layers, stages) is None:
        if num_chunks is None or num_chunks == family.chunks_default:
            return (
                f"{layers} layers cannot fill {stages} stages of {schedule}: every stage but "
                f"the first and the last needs at least one layer (those two may hold only "
                f"the embedding or only the output layer); use fewer pipeline devices"
            )
        return (
            f"{layers} layers cannot fill the {stages} stages of {schedule} with "
            f"{num_chunks} chunks per device (p x v = {p} x {num_chunks}): every stage but "
            f"the first and the last needs at least one layer (those two may hold only the "
            f"embedding or only the output layer); use fewer chunks per device or fewer "
            f"pipeline devices"
        )
    return None


def single_device_problem(schedule: str, searched: Sequence[str]) -> str | None:
    """Why ``schedule`` is not searched on one pipeline device: the family its registry entry
    names as running the same passes there (:attr:`ScheduleFamily.single_device_as`) is
    searched too, and would be as fast with no more memory."""
    same = schedule_family(schedule).single_device_as
    if same is None or same not in searched:
        return None
    return (
        f"p = 1 runs no pipeline: {schedule} runs the same passes as {same} in the same time "
        f"with no less memory, and {same} is searched, so {schedule} is searched at p >= 2 only"
    )


def runtime_problem(
    request: PlanRequest, config: CandidateConfig, runtime: str, placement: Placement | None = None
) -> str | None:
    """Why the request's search.runtime cannot run ``config`` as planned, placed as
    ``placement`` (None: its default placement); with ``any``, why no runtime can.
    (torch.distributed.pipelining runs every schedule it has as planned in Megatron-LM's
    order, the default placement of every schedule without transfers, so the runtimes of
    such a candidate are only looked at when one was asked for.)"""
    if runtime == "any":
        family = schedule_family(config.schedule)
        default = placement is None and not family.transfers
        if default and config.cp == 1 and "torch" in family.runtimes:
            return None
        limits = runtime_limits(request, config, placement)
        if len(limits) < len(RUNTIMES):
            return None
        return "no runtime can run it as planned: " + "; ".join(limits.values())
    reason = runtime_limits(request, config, placement).get(runtime)  # type: ignore[call-overload]
    return None if reason is None else f"search.runtime is {runtime}, which cannot run it: {reason}"


def _configs(
    point: SearchPoint,
    m: int,
    modes: Sequence[Recompute],
    schedule: str,
    layers: list[int],
    num_chunks: int | None = None,
) -> list[CandidateConfig]:
    """The candidate of ``schedule`` at this point under each recompute mode of ``modes``
    (a request's, validated): the first one validated, the others copies of it with their
    own mode. No rule of a config reads the mode, and a copy costs a third of validating
    (every candidate of a search is made here)."""
    first = CandidateConfig(
        num_chunks=num_chunks,
        t=point.t,
        p=point.p,
        d=point.d,
        cp=point.cp,
        micro_batch_size=point.mb,
        num_microbatches=m,
        recompute=modes[0],
        schedule=schedule,
        layers_per_stage=layers,
    )
    return [first] + [first.model_copy(update={"recompute": mode}) for mode in modes[1:]]


def _with_memory_limit(
    ctx: PlanContext, config: CandidateConfig
) -> tuple[CandidateConfig, str | None]:
    """``config`` with the memory limit its schedule is built for: all that its devices can
    still hold for activations, or the largest limit that changes the schedule if that is
    less. A limit below what the family can reach is a rejection that says so."""
    limit = adaptive_limit(ctx, config, stage_costs(ctx, config))
    family = schedule_family(config.schedule)
    assert family.smallest_memory_limit is not None and family.largest_memory_limit is not None
    smallest = family.smallest_memory_limit(config.p, config.num_microbatches)
    # Beyond the largest useful limit the schedule is the same: record that one.
    limit = min(limit, family.largest_memory_limit(config.p, config.num_microbatches))
    if limit < smallest:
        return config, (
            f"{config.schedule}: the memory left for activations allows {limit:.3g} of "
            f"1F1B's peak, below the smallest limit it can reach ({smallest:.3g})"
        )
    return config.model_copy(update={"memory_limit": limit}), None


@dataclass(frozen=True)
class SearchSpace:
    """The grid's verdict on every candidate of a request's space."""

    feasible: list[Estimate]  # fit the device; sorted by estimated step time
    over_memory: list[Estimate]  # estimated, but over the device's memory
    rejected: list[Rejected]  # in enumeration order, whatever the reason
    evaluated: int  # candidates looked at (feasible or rejected)


def enumerate_space(ctx: PlanContext, capacity: float) -> SearchSpace:
    """Every candidate of ``ctx.request``'s space: refused with a reason, over ``capacity``
    (bytes per device), or feasible; each candidate estimated once under ``ctx``."""
    request = ctx.request
    rejected: list[Rejected] = []
    feasible: list[Estimate] = []
    over_memory: list[Estimate] = []
    evaluated = 0
    layers_total = request.model.num_layers
    wanted = request.search.runtime
    # What each schedule's family says, asked once per search rather than per candidate;
    # a family whose devices hold num_chunks stages once per v searched.
    schedules = [
        (name, chunks, _fallback_base(name, request.search.schedules), built_for_a_limit(name))
        for name in request.search.schedules
        for chunks in schedule_chunks(request, name)
    ]
    for point, m in search_points(request):
        # (schedule, v, recompute) at this point: a base schedule estimated for the fallback
        # check of its memory-saving variant is the same candidate the loop reaches.
        estimated: dict[tuple[str, int | None, str], Estimate] = {}
        for schedule, chunks, base, takes_limit in schedules:
            problem = schedule_problem(schedule, point, m, layers_total, chunks)
            if problem is None and point.p == 1:
                problem = single_device_problem(schedule, request.search.schedules)
            layers = split_layers(layers_total, num_stages(schedule, point.p, chunks)) or []
            for config in _configs(point, m, request.search.recompute, schedule, layers, chunks):
                recompute = config.recompute
                evaluated += 1
                refused = problem
                if refused is None:
                    refused = runtime_problem(request, config, wanted)
                if refused is None and base is not None:
                    refused = _fallback_problem(ctx, config, base, capacity, estimated)
                if refused is None and takes_limit:
                    config, refused = _with_memory_limit(ctx, config)
                if refused is not None:
                    rejected.append(Rejected(config=config, reason=refused))
                    continue
                est = estimated.get((schedule, chunks, recompute))
                if est is None or est.config != config:
                    est = estimated[(schedule, chunks, recompute)] = estimate(ctx, config, capacity)
                if est.peak_memory > capacity:
                    over_memory.append(est)
                    rejected.append(memory_rejection(ctx, est))
                    continue
                feasible.append(est)
    feasible.sort(key=lambda e: e.iteration_time_s)
    return SearchSpace(feasible, over_memory, rejected, evaluated)


def _fallback_base(schedule: str, searched: Sequence[str]) -> str | None:
    """The base schedule whose out-of-memory configurations alone ``schedule`` (a
    memory-saving variant such as BPipe) is searched at, when ``searched`` has it too; None
    when ``schedule`` is no such variant or its base is not searched (it is then priced as
    asked, everywhere)."""
    base = schedule_family(schedule).memory_fallback_for
    return base if base in searched else None


def _fallback_problem(
    ctx: PlanContext,
    config: CandidateConfig,
    base: str,
    capacity: float,
    estimated: dict[tuple[str, int | None, str], Estimate],
) -> str | None:
    """Why a memory-saving variant (BPipe) is not searched here: its base schedule, searched
    too, fits the same configuration (the same chunks per device, for interleaved BPipe), so
    the variant's transfers would only cost time. ``estimated`` holds this point's estimates
    by (schedule, v, recompute); the base's is added."""
    key = (base, config.num_chunks, config.recompute)
    found = estimated.get(key)
    if found is None:
        stages = num_stages(base, config.p, config.num_chunks)
        layers = split_layers(sum(config.layers_per_stage), stages) or []
        base_config = config.model_copy(update={"schedule": base, "layers_per_stage": layers})
        found = estimated[key] = estimate(ctx, base_config, capacity)
    if found.peak_memory > capacity:
        return None
    return (
        f"{base} fits this configuration, so {config.schedule} would only add transfers: "
        f"it balances memory only where {base} runs out of it (BPipe §4.2)"
    )
