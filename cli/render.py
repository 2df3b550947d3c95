"""Readable text renderings of a Plan for the terminal (rich tables)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.console import Console

from cli.render_timeline import reason_summary
from cli.tables import Column, print_fitted
from planner.assemble import no_fit_summary
from planner.specs import DEFAULT_NUM_CHUNKS, CandidateConfig, Plan, Predicted, Rejected

__all__ = ["BY_SCHEDULE_COLUMNS", "DEVICE_COLUMNS", "RANKED_COLUMNS", "render_plan"]

# The tables' columns and what each means (docs/request-reference.md lists them).
RANKED_COLUMNS = (
    ("#", "Rank: 1 is the fastest configuration that fits (by simulated step time)."),
    ("t", "Tensor-parallel degree: GPUs that split every layer's matrices."),
    ("p", "Pipeline-parallel degree: devices the layers are split over, in stages."),
    ("d", "Data-parallel degree: copies of the pipeline, each on its share of the batch."),
    ("mb", "Micro-batch size: samples per forward/backward pass."),
    ("m", "Micro-batches per pipeline per step: global batch / (mb x d)."),
    ("recompute", "Activation recomputation: none, selective (attention) or full (layers)."),
    (
        "schedule",
        "Pipeline schedule (`GET /v1/schedules` lists them); `v=N` after an interleaved one "
        "is its chunks per device, named when not the default 2 or when the request "
        "searched other counts (search.num_chunks).",
    ),
    ("step s", "Predicted time of one optimizer step, in seconds."),
    ("samples/s", "Global batch / step time."),
    ("MFU", "Model FLOPs utilization: the model's FLOPs per second / the GPUs' peak."),
    ("bubble", "Share of the step the busiest pipeline device is idle."),
    ("peak GiB", "Memory of the fullest pipeline device at its peak, in GiB."),
)
DEVICE_COLUMNS = (
    ("device", "Pipeline device (rank in the pipeline)."),
    ("stages", "Stages the device holds (two for V schedules, more for interleaved)."),
    ("layers", "Transformer layers on the device."),
    (
        "compute s",
        "Forward + backward time of the device over one step (its tensor-parallel "
        "collectives included).",
    ),
    (
        "comm s",
        "Of which communication: the tensor-parallel collectives inside compute s, "
        "plus the pipeline sends the device's bubble waits for.",
    ),
    (
        "bubble s",
        "Time the device waits in the simulated step. compute s + bubble s is the "
        "pipeline's span; the step time adds data-parallel sync and the optimizer step.",
    ),
    ("params", "Weights, GiB."),
    ("grads", "Gradients, GiB."),
    ("optim", "Optimizer states (sharded over d with the distributed optimizer), GiB."),
    ("activ.", "Saved activations at the peak plus working buffers, GiB."),
    ("allow.", "Allowance: workspace and allocator fragmentation, GiB."),
    ("in flight", "Micro-batches whose activations the device holds at its peak."),
    ("total GiB", "Everything above: the device's predicted peak memory."),
)
BY_SCHEDULE_COLUMNS = (
    ("schedule", "A schedule the request searched."),
    ("fit", "Configurations of that schedule that fit in memory."),
    ("best config (t/p/d/mb/recompute)", "Its fastest configuration."),
    ("step s", "That configuration's predicted step time."),
    ("vs best 1f1b", "Speed-up over the fastest configuration of the baseline schedule."),
)


def _schedule_text(c: CandidateConfig, chunks: bool) -> str:
    """The schedule's name, with its chunks per device (``interleaved v=4``) where they are
    not the default or, with ``chunks`` (the request searched other counts), wherever the
    schedule has them."""
    if chunks and c.num_chunks is not None:
        return f"{c.schedule} v={c.num_chunks}"
    return c.schedule_label


def _config_text(c: CandidateConfig, cp: bool = False, chunks: bool = False) -> tuple[str, ...]:
    """The t, p, d, mb, m, recompute, schedule columns of a configuration (and cp after t
    when the table shows context parallelism; the schedule with its chunks per device, see
    :func:`_schedule_text`)."""
    return (
        str(c.t),
        *((str(c.cp),) if cp else ()),
        str(c.p),
        str(c.d),
        str(c.micro_batch_size),
        str(c.num_microbatches),
        c.recompute,
        _schedule_text(c, chunks),
    )


def render_plan(console: Console, plan: Plan, show_rejected: bool = False) -> None:
    request = plan.request
    # Chunks per device are named wherever the request searched other counts than the default.
    show_chunks = tuple(request.search.num_chunks) != DEFAULT_NUM_CHUNKS
    cluster = request.cluster
    console.print(
        f"[bold]{request.model.name}[/] on {cluster.num_nodes} x {cluster.gpus_per_node} "
        f"{cluster.gpu}, global batch {request.training.global_batch_size}: "
        f"{plan.stats.evaluated} configurations, {plan.stats.feasible} fit, "
        f"searched in {plan.stats.search_ms:.0f} ms"
    )
    for note in plan.notes:
        console.print(f"  note: {note}", highlight=False)
    if plan.best is None:
        console.print(
            no_fit_summary(request, plan.rejected)
            + (
                " Run with --all to see why each was rejected."
                if plan.rejected and not show_rejected
                else ""
            ),
            style="red",
            highlight=False,
        )
        # No ranked row and no schedule with a best: the tables would only be empty frames.
        if show_rejected:
            _print_rejected(console, plan.rejected, show_chunks)
        return
    # The context-parallel degree gets a column only when some candidate uses it.
    show_cp = any(c.config.cp > 1 for c in plan.candidates)
    ranked_headers = [header for header, _ in RANKED_COLUMNS]
    if show_cp:
        ranked_headers.insert(ranked_headers.index("t") + 1, "cp")
    ranked_rows = []
    for rank, candidate in enumerate(plan.candidates, start=1):
        pr = candidate.predicted
        config_cells = list(_config_text(candidate.config, show_cp, show_chunks))
        if candidate.semantics == "stale":  # changes training: said where it is ranked
            config_cells[-1] += " (stale)"
        ranked_rows.append(
            [
                str(rank),
                *config_cells,
                f"{pr.iteration_time_s:.3f}",
                f"{pr.samples_per_s:.2f}",
                f"{pr.mfu:.1%}",
                f"{pr.bubble_fraction:.1%}",
                f"{pr.peak_memory_gib:.1f}",
            ]
        )
    print_fitted(
        console,
        "ranked candidates (time from the simulated schedule)",
        [Column(h, "left" if h in _TEXT_COLUMNS else "right") for h in ranked_headers],
        ranked_rows,
        _RANKED_DROP_ORDER,
    )
    if plan.best is not None:
        best = plan.best
        device_rows = [
            [
                str(row.device),
                ",".join(map(str, row.stages)),
                str(row.layers),
                f"{row.compute_s:.3f}",
                f"{row.communication_s:.3f}",
                f"{row.bubble_s:.3f}",
                f"{row.parameters_gib:.1f}",
                f"{row.gradients_gib:.1f}",
                f"{row.optimizer_gib:.1f}",
                f"{row.activations_gib:.1f}",
                f"{row.allowance_gib:.1f}",
                f"{row.in_flight_microbatches:.4g}",
                f"{total:.1f}",
            ]
            for row, total in zip(best.breakdown, best.predicted.memory_gib_per_device, strict=True)
        ]
        print_fitted(
            console,
            "best candidate: per pipeline device",
            [Column(header) for header, _ in DEVICE_COLUMNS],
            device_rows,
            _DEVICE_DROP_ORDER,
        )
        span = max(row.compute_s + row.bubble_s for row in best.breakdown)
        console.print(
            f"  compute s + bubble s = the pipeline's span, {span:.3f} s; the step time "
            f"{best.predicted.iteration_time_s:.3f} s adds data-parallel sync and the optimizer "
            f"step ({best.predicted.iteration_time_s - span:.3f} s); comm s is part of them",
            highlight=False,
        )
        console.print(f"  times from: {trust_text(best.predicted)}")
        for note in best.notes:
            console.print(f"  note: {note}")
        if best.launch.megatron_args:
            console.print(f"  Megatron-LM: {best.launch.megatron_args}", soft_wrap=True)
        # Whole lines (the terminal wraps them) so that a copied command stays one command.
        if "stagewright" in best.runtimes:
            console.print(f"  torchrun: {best.launch.torchrun[0]}", soft_wrap=True, highlight=False)
        else:  # the line would start stagewright's executor, which would refuse it
            reason = best.runtime_limits.get("stagewright", "")
            console.print(
                f"  torchrun: none: stagewright's executor cannot run it as planned ({reason})",
                highlight=False,
            )
    if plan.by_schedule:
        summary_headers = []
        for header, _ in BY_SCHEDULE_COLUMNS:
            if show_cp and header.startswith("best config"):
                header += ", cp"
            summary_headers.append(header)
        summary_rows = []
        for entry in plan.by_schedule:
            c = entry.best_config
            summary_rows.append(
                [
                    entry.schedule,
                    str(entry.feasible),
                    (
                        f"{c.t}/{c.p}/{c.d}/{c.micro_batch_size}/{c.recompute}"
                        + (f", cp {c.cp}" if c.cp > 1 else "")
                        + (f", v {c.num_chunks}" if show_chunks and c.num_chunks else "")
                    )
                    if c
                    else "-",
                    f"{entry.best_iteration_time_s:.3f}" if entry.best_iteration_time_s else "-",
                    f"{entry.speedup_vs_1f1b:.2f}x" if entry.speedup_vs_1f1b else "-",
                ]
            )
        print_fitted(
            console,
            "does a schedule pay off here? best of each (simulated)",
            [Column(h, "left") for h in summary_headers],
            summary_rows,
            ("vs best 1f1b", "fit"),
        )
    if show_rejected:
        _print_rejected(console, plan.rejected, show_chunks)


def _print_rejected(console: Console, rejected: Sequence[Rejected], chunks: bool = False) -> None:
    """The rejections counted by reason, then every one (nothing when there are none)."""
    if not rejected:
        return
    print_fitted(
        console,
        f"rejected ({len(rejected):,}) by reason",
        [Column("configurations"), Column("reason (numbers as n)", "left", wraps=True)],
        [[f"{count:,}", kind] for kind, count in reason_summary([r.reason for r in rejected])],
    )
    rejected_cp = any(r.config.cp > 1 for r in rejected)
    headers = ["t", *(("cp",) if rejected_cp else ()), "p", "d", "mb", "m"]
    headers += ["recompute", "schedule", "peak GiB", "reason"]
    rows = []
    for reject in rejected:
        peak = f"{reject.predicted.peak_memory_gib:.1f}" if reject.predicted else "-"
        rows.append([*_config_text(reject.config, rejected_cp, chunks), peak, reject.reason])
    print_fitted(
        console,
        f"every rejected configuration ({len(rejected):,})",
        [Column(h, "left", wraps=h == "reason") for h in headers],
        rows,
        ("m", "peak GiB"),
    )


# Columns left out, first to last, when a table's whole values do not fit the terminal:
# what can be derived from the rest (samples/s, m) and detail before the answer.
_RANKED_DROP_ORDER = ("samples/s", "m", "bubble", "peak GiB", "MFU", "mb")
_DEVICE_DROP_ORDER = (
    "grads",
    "allow.",
    "in flight",
    "params",
    "optim",
    "comm s",
    "layers",
    "activ.",
    "bubble s",
)
_TEXT_COLUMNS = ("recompute", "schedule")


def trust_text(predicted: Predicted) -> str:
    """Where a prediction's times come from and how far that source was off when fitted."""
    error = predicted.calibration_error
    if error is None:
        return f"{predicted.time_source} (no fit error known)"
    over = "over the runs it was calibrated on"
    if error < _LN_AS_PERCENT:
        return (
            f"{predicted.time_source} (fit error {error:.1%}: rms of ln(predicted / measured) "
            f"{over})"
        )
    # ln 0.54 is a factor of 1.72 (+72% or -42%): as a percentage it would read 54%.
    return (
        f"{predicted.time_source} (fit error: a factor of {math.exp(error):.2f} (rms of "
        f"ln(predicted / measured) {error:.3f}) {over})"
    )


# Below this an error in ln is its relative error to within 5% of itself (e^x - 1 ~ x).
_LN_AS_PERCENT = 0.1
