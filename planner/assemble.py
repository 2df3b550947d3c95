"""Assemble a plan's entries: a priced candidate becomes a :class:`Candidate` (prediction,
per-device breakdown, notes, launch artefacts), an estimate over memory a :class:`Rejected`
with its reason, and the feasible ones the per-schedule summaries and the landscape.

Nothing here searches or ranks: :mod:`planner.plan` decides which candidates are priced and
in what order; this module only turns them into the plan's JSON shapes.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.costmodel.evaluate import Estimate, PlanContext, Priced
from planner.costmodel.layer_ops import fused_softmax_problem
from planner.costmodel.memory import GIB
from planner.costmodel.timing import time_provenance
from planner.launch.artefacts import candidate_launch
from planner.schedules import BASELINE_SCHEDULE, schedule_family
from planner.specs import (
    Candidate,
    CandidateConfig,
    LandscapePoint,
    PlanRequest,
    Predicted,
    RefinementInfo,
    Rejected,
    ScheduleSummary,
    StageBreakdown,
)

__all__ = [
    "candidate",
    "landscape",
    "memory_rejection",
    "no_fit_hint",
    "no_fit_summary",
    "schedule_summaries",
]


def candidate(
    ctx: PlanContext,
    priced: Priced,
    refinement: RefinementInfo | None = None,
    note: str | None = None,
) -> Candidate:
    """The plan's entry for a priced candidate: its prediction, launch artefacts and who can
    run them, per-device breakdown, notes (``note`` among them, before the launch's) and the
    CP-SAT ``refinement`` that produced it, if any. ``ctx`` must hold the placements the
    candidate was priced with."""
    config = priced.estimate.config
    launch = candidate_launch(ctx, priced)
    return Candidate(
        config=config,
        predicted=_predicted(
            ctx, priced.estimate, priced.iteration_time_s, priced.mfu, priced.bubble_fraction
        ),
        launch=launch.launch,
        runtimes=launch.runtimes,
        runtime_limits=dict(launch.limits),
        semantics=schedule_family(config.schedule).semantics,
        breakdown=_breakdown(priced),
        notes=_notes(ctx, priced) + ([note] if note else []) + launch.notes,
        refinement=refinement,
    )


def memory_rejection(ctx: PlanContext, est: Estimate) -> Rejected:
    """The plan's entry for a candidate over the device's memory: why, in numbers of its
    worst device, and what the fast estimate predicts for it (MFU 0: not simulated)."""
    hardware = ctx.hardware
    return Rejected(
        config=est.config,
        reason=_memory_reason(ctx.request, est, hardware.name, hardware.usable_memory_gib),
        predicted=_predicted(
            ctx, est, est.iteration_time_s, 0.0, max(0.0, 1 - est.busy_s / est.iteration_time_s)
        ),
    )


def _predicted(
    ctx: PlanContext,
    est: Estimate,
    iteration_time_s: float,
    mfu: float,
    bubble_fraction: float,
) -> Predicted:
    """Throughput from ``iteration_time_s``, memory from ``est``, provenance of the times."""
    request = ctx.request
    samples = request.training.global_batch_size / iteration_time_s
    memory = [round(total / GIB, 3) for total in est.device_totals]
    source, error = time_provenance(est.costs.layer, ctx.hardware)
    return Predicted(
        iteration_time_s=iteration_time_s,
        samples_per_s=samples,
        tokens_per_s=samples * request.model.seq_length,
        mfu=mfu,
        bubble_fraction=bubble_fraction,
        memory_gib_per_device=memory,
        peak_memory_gib=max(memory),
        time_source=source,
        calibration_error=error,
    )


def _memory_reason(request: PlanRequest, est: Estimate, gpu: str, usable_gib: float) -> str:
    totals = est.device_totals
    worst = totals.index(est.peak_memory)  # the first device of the largest total
    parts = est.memory[worst]
    static = (
        f"parameters {parts.parameters / GIB:.1f}, gradients {parts.gradients / GIB:.1f}, "
        f"optimizer {parts.optimizer / GIB:.1f}"
    )
    if not est.activations_counted:
        # Only the remedies the request does not already use.
        shard = "more pipeline or tensor parallelism"
        if not request.training.distributed_optimizer:
            shard += ", or the distributed optimizer,"
        return (
            f"out of memory before any activation: device {worst} needs "
            f"{parts.total / GIB:.1f} GiB > {usable_gib:.1f} GiB usable on {gpu} ({static}, "
            f"allowance {parts.allowance / GIB:.1f}); {shard} would shard it"
        )
    return (
        f"out of memory: device {worst} needs {parts.total / GIB:.1f} GiB > "
        f"{usable_gib:.1f} GiB usable on {gpu} ({static}, activations "
        f"{parts.activations / GIB:.1f} for {parts.in_flight:.4g} micro-batches in flight, "
        f"allowance {parts.allowance / GIB:.1f})"
    )


def no_fit_summary(request: PlanRequest, rejected: Sequence[Rejected]) -> str:
    """Why a plan has no candidate, from its rejections: over memory (with what may make
    the request fit, :func:`no_fit_hint`), or refused before memory was counted (runtime,
    pipeline length, ...: memory savings would not help, so none are offered), or nothing
    to search at all (the plan's notes say what was left out)."""
    over = sum(1 for r in rejected if r.predicted is not None)
    if not rejected:
        return (
            "No configuration to search: the request's space is empty (the plan's notes "
            "say what was left out and why)."
        )
    if over == 0:
        examples = list(dict.fromkeys(r.reason for r in rejected))[:3]
        return (
            f"No configuration can run: all {len(rejected):,} were refused before their "
            f"memory was counted, so saving memory would not help; for example: "
            + "; ".join(examples)
            + "."
        )
    others = len(rejected) - over
    rest = f", {others:,} refused for other reasons" if others else ""
    hint = no_fit_hint(request, rejected)
    return f"No configuration fits in memory ({over:,} over it{rest}). {hint}"


def no_fit_hint(request: PlanRequest, rejected: Sequence[Rejected] = ()) -> str:
    """What may make a request fit when no configuration does, leaving out what the request
    already does and, given its ``rejected`` configurations, what none of those over memory
    could use (sequence parallelism splits over t, the distributed optimizer shards over
    d x cp: on one GPU neither changes anything): the CLI prints it under an empty plan and
    the service puts it in a done plan's ``warnings``."""
    search, training = request.search, request.training
    over = [r.config for r in rejected if r.predicted is not None]
    tensor_split = not over or any(c.t > 1 for c in over)
    sharded = not over or any(c.d * c.cp > 1 for c in over)
    ideas = ["more GPUs (cluster.num_nodes)"]
    if "full" not in search.recompute:
        ideas.append('full recomputation (add "full" to search.recompute)')
    if search.micro_batch_sizes is not None and 1 not in search.micro_batch_sizes:
        ideas.append("micro-batch size 1 (search.micro_batch_sizes)")
    if not training.distributed_optimizer and sharded:
        ideas.append("the distributed optimizer (training.distributed_optimizer)")
    if not training.sequence_parallel and tensor_split:
        ideas.append("sequence parallelism (training.sequence_parallel)")
    if not training.flash_attention:
        ideas.append("flash attention (training.flash_attention)")
    if len(ideas) == 1:
        return f"The request already uses every memory saving searched; {ideas[0]} may help."
    return f"These may help: {', '.join(ideas[:-1])} or {ideas[-1]}."


def schedule_summaries(
    request: PlanRequest,
    feasible: list[Estimate],
    best_of: dict[str, Priced],
    refined: list[Priced],
) -> list[ScheduleSummary]:
    """The best configuration of each requested schedule: its exactly simulated best
    (:func:`planner.plan`'s search for it), or a CP-SAT refinement of it when faster."""
    best = dict(best_of)
    for pr in refined:
        name = pr.estimate.config.schedule
        if name not in best or pr.iteration_time_s < best[name].iteration_time_s:
            best[name] = pr
    counts: dict[str, int] = {}
    for est in feasible:
        counts[est.config.schedule] = counts.get(est.config.schedule, 0) + 1
    baseline = best.get(BASELINE_SCHEDULE)
    out = []
    for name in request.search.schedules:
        found = best.get(name)
        speedup = None
        if found is not None and baseline is not None:
            speedup = baseline.iteration_time_s / found.iteration_time_s
        out.append(
            ScheduleSummary(
                schedule=name,
                semantics=schedule_family(name).semantics,
                feasible=counts.get(name, 0),
                best_config=found.estimate.config if found else None,
                best_iteration_time_s=found.iteration_time_s if found else None,
                speedup_vs_1f1b=speedup,
            )
        )
    return out


def landscape(request: PlanRequest, feasible: list[Estimate]) -> list[LandscapePoint]:
    """Every feasible candidate as a point of throughput (from its fast estimate) against
    peak memory, for the dashboard's scatter."""
    return [
        LandscapePoint(
            label=e.config.label,
            samples_per_s=request.training.global_batch_size / e.iteration_time_s,
            peak_memory_gib=e.peak_memory / GIB,
        )
        for e in feasible
    ]


def _breakdown(priced: Priced) -> list[StageBreakdown]:
    est = priced.estimate
    config = est.config
    costs = est.costs
    sim = priced.simulation
    scale = config.num_microbatches / (priced.simulated_microbatches * sim.schedule.num_batches)
    out = []
    for device in range(config.p):
        stages = list(sim.schedule.stages_of(device))
        compute = sum(costs.forward[s] + costs.backward[s] + costs.weight[s] for s in stages)
        tp = sum(costs.tp_comm[s] for s in stages)
        m = config.num_microbatches
        mem = est.memory[device]
        out.append(
            StageBreakdown(
                device=device,
                stages=stages,
                layers=sum(config.layers_per_stage[s] for s in stages),
                compute_s=m * compute,
                communication_s=m * (tp + 2 * costs.p2p_s),
                bubble_s=max(0.0, priced.makespan_s - sim.devices[device].busy * scale),
                parameters_gib=mem.parameters / GIB,
                gradients_gib=mem.gradients / GIB,
                optimizer_gib=mem.optimizer / GIB,
                activations_gib=mem.activations / GIB,
                allowance_gib=mem.allowance / GIB,
                in_flight_microbatches=mem.in_flight,
            )
        )
    return out


def _transfer_note(transfer: float, forward: float, backward: float) -> str:
    """BPipe Appendix B: an evict (or load) must finish within one forward to hide (Eqs. 7-9);
    with the paper's pairing of an evict and a load over a backward and a forward, within
    (F + B) / 2 (Eqs. 10-12). The simulator overlaps each transfer with one compute action,
    so it prices the strict condition."""
    head = (
        f"BPipe transfer {transfer * 1e3:.2f} ms per micro-batch vs forward {forward * 1e3:.2f} ms"
    )
    if transfer <= forward:
        return f"{head}: hidden behind compute (BPipe Appendix B, Eqs. 7-9)"
    if 2 * transfer <= forward + backward:
        return (
            f"{head}: longer than the forward but within (F + B) / 2 = "
            f"{(forward + backward) / 2 * 1e3:.2f} ms, BPipe's relaxed bound (Appendix B, "
            "Eqs. 10-12), which pairs an evict and a load over a backward and a forward; priced "
            "here as stretching the step"
        )
    return f"{head}: longer than (F + B) / 2 as well, so it stretches the step (Appendix B)"


def _softmax_fallback_note(ctx: PlanContext, config: CandidateConfig) -> str | None:
    """Megatron's fused softmax needs b x a/t attention batches in multiples of 4 (and
    16 < s <= 4096, 16-bit); elsewhere its fp32 fallback makes five passes over the scores
    each way: why BPipe Table 7's 1F1B rows with selective recompute ran at 36-40% MFU."""
    r = ctx.request
    if r.training.flash_attention:
        return None
    problem = fused_softmax_problem(r.model, r.training, config.micro_batch_size, config.t)
    if problem is None:
        return None
    remedy = "flash attention avoids it"
    if "attention batches" in problem:
        remedy = (
            "a micro-batch or tensor-parallel degree that makes b x heads / t a multiple of "
            "it, or flash attention, avoids it"
        )
    return (
        f"Megatron's fused softmax cannot run here ({problem}): its fp32 fallback is "
        f"priced; {remedy}"
    )


def _notes(ctx: PlanContext, priced: Priced) -> list[str]:
    est = priced.estimate
    config = est.config
    costs = est.costs
    notes = [f"layer times: {costs.layer.source}"]
    fallback = _softmax_fallback_note(ctx, config)
    if fallback:
        notes.append(fallback)
    family = schedule_family(config.schedule)
    if family.semantics != "synchronous":
        notes.append(
            f"{family.title} updates weights with gradients of older weights "
            f"({family.citation}): it changes the training, not only its speed; allowed "
            f"by search.allow_stale_weights"
        )
    if family.transfers:
        built = priced.simulation.schedule
        if any(a.kind.is_transfer for row in built.actions for a in row):
            notes.append(_transfer_note(costs.transfer_s, costs.forward[0], costs.backward[0]))
        else:
            notes.append(
                f"{family.title} moves no activations here (no stage evicts on a "
                f"{config.p}-device pipeline): it runs as its base schedule"
            )
    if priced.data_parallel_s > 0:
        notes.append(f"data-parallel gradient sync {priced.data_parallel_s * 1e3:.1f} ms per step")
    if priced.simulated_microbatches < config.num_microbatches:
        notes.append(
            f"simulated {priced.simulated_microbatches} of {config.num_microbatches} "
            f"micro-batches exactly; the steady state is extended linearly"
        )
    return notes
