"""Readable text renderings of a Plan for the terminal (rich tables)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from planner.specs import CandidateConfig, Plan, Predicted

__all__ = ["render_plan"]


def _config_text(c: CandidateConfig) -> tuple[str, ...]:
    """The t, p, d, mb, m, recompute, schedule columns of a configuration."""
    return (
        str(c.t),
        str(c.p),
        str(c.d),
        str(c.micro_batch_size),
        str(c.num_microbatches),
        c.recompute,
        c.schedule,
    )


def render_plan(console: Console, plan: Plan, show_rejected: bool = False) -> None:
    request = plan.request
    cluster = request.cluster
    console.print(
        f"[bold]{request.model.name}[/] on {cluster.num_nodes} x {cluster.gpus_per_node} "
        f"{cluster.gpu}, global batch {request.training.global_batch_size}: "
        f"{plan.stats.evaluated} configurations, {plan.stats.feasible} fit, "
        f"searched in {plan.stats.search_ms:.0f} ms"
    )
    if plan.best is None:
        console.print(
            "[red]No configuration fits in memory.[/] Run with --all to see why each "
            "was rejected; more GPUs, recomputation or a smaller micro-batch may help."
        )
    table = Table(title="ranked candidates (time from the simulated schedule)")
    for header in (
        "#",
        "t",
        "p",
        "d",
        "mb",
        "m",
        "recompute",
        "schedule",
        "step s",
        "samples/s",
        "MFU",
        "bubble",
        "peak GiB",
    ):
        table.add_column(
            header, justify="right" if header not in ("recompute", "schedule") else "left"
        )
    for rank, candidate in enumerate(plan.candidates, start=1):
        pr = candidate.predicted
        table.add_row(
            str(rank),
            *_config_text(candidate.config),
            f"{pr.iteration_time_s:.3f}",
            f"{pr.samples_per_s:.2f}",
            f"{pr.mfu:.1%}",
            f"{pr.bubble_fraction:.1%}",
            f"{pr.peak_memory_gib:.1f}",
        )
    console.print(table)
    if plan.best is not None:
        best = plan.best
        detail = Table(title="best candidate: per pipeline device")
        for header in (
            "device",
            "stages",
            "layers",
            "compute s",
            "comm s",
            "bubble s",
            "params",
            "grads",
            "optim",
            "activ.",
            "allow.",
            "in flight",
            "total GiB",
        ):
            detail.add_column(header, justify="right")
        for row, total in zip(best.breakdown, best.predicted.memory_gib_per_device, strict=True):
            detail.add_row(
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
                f"{row.in_flight_microbatches:.2g}",
                f"{total:.1f}",
            )
        console.print(detail)
        console.print(f"  times from: {trust_text(best.predicted)}")
        for note in best.notes:
            console.print(f"  note: {note}")
        if best.launch.megatron_args:
            console.print(f"  Megatron-LM: {best.launch.megatron_args}")
        console.print(f"  torchrun: {best.launch.torchrun[0]}")
    if plan.by_schedule:
        summary = Table(title="does a schedule pay off here? best of each (simulated)")
        for header in (
            "schedule",
            "fit",
            "best config (t/p/d/mb/recompute)",
            "step s",
            "vs best 1f1b",
        ):
            summary.add_column(header)
        for entry in plan.by_schedule:
            c = entry.best_config
            summary.add_row(
                entry.schedule,
                str(entry.feasible),
                f"{c.t}/{c.p}/{c.d}/{c.micro_batch_size}/{c.recompute}" if c else "-",
                f"{entry.best_iteration_time_s:.3f}" if entry.best_iteration_time_s else "-",
                f"{entry.speedup_vs_1f1b:.2f}x" if entry.speedup_vs_1f1b else "-",
            )
        console.print(summary)
    if show_rejected and plan.rejected:
        rejected = Table(title=f"rejected ({len(plan.rejected)})")
        for header in ("t", "p", "d", "mb", "m", "recompute", "schedule", "peak GiB", "reason"):
            rejected.add_column(header)
        for reject in plan.rejected:
            peak = f"{reject.predicted.peak_memory_gib:.1f}" if reject.predicted else "-"
            rejected.add_row(*_config_text(reject.config), peak, reject.reason)
        console.print(rejected)


def trust_text(predicted: Predicted) -> str:
    """Where a prediction's times come from and how far that source was off when fitted."""
    if predicted.calibration_error is None:
        return f"{predicted.time_source} (no fit error known)"
    return (
        f"{predicted.time_source} (fit error {predicted.calibration_error:.1%}: rms of "
        "ln(predicted / measured) over the runs it was calibrated on)"
    )
