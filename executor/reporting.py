"""The run report (:class:`planner.launch.report.RunReport`): assembled by rank 0 from every
rank's measurements, written atomically, and printed as a table."""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any

from planner.launch import ExecutorConfig, RunReport
from planner.launch.report import (
    MeasuredStep,
    Mismatch,
    RankReport,
    RunSummary,
    StepMeasure,
    Verification,
)

__all__ = ["REPORT_FILE", "build_report", "describe", "write_report"]

REPORT_FILE = "run-report.json"


def build_report(
    config: ExecutorConfig,
    ranks: list[dict[str, Any]],
    *,
    first_step: int,
    continuous: bool,
    notes: list[str],
) -> RunReport:
    """The report of a run from each rank's ``{rank, dp, pp, tp, stages, steps, verify}``."""
    predicted = config.predicted
    rank_reports = []
    for entry in sorted(ranks, key=lambda r: r["rank"]):
        steps = [StepMeasure.model_validate(s) for s in entry["steps"]]
        rank_reports.append(
            RankReport(
                rank=entry["rank"],
                dp=entry["dp"],
                pp=entry["pp"],
                tp=entry["tp"],
                stages=entry["stages"],
                steps=steps,
                peak_saved_activation_bytes=max(
                    (s.peak_saved_activation_bytes for s in steps), default=0
                ),
                predicted_saved_activation_bytes=(
                    predicted.saved_activation_bytes[entry["pp"]] if predicted else None
                ),
            )
        )
    count = len(rank_reports[0].steps) if rank_reports else 0
    per_step = [max(r.steps[i].wall_s for r in rank_reports) for i in range(count)]
    notes = list(notes)
    if count > 1:
        step_time: float | None = statistics.median(per_step[1:])
    elif count == 1:
        step_time = per_step[0]
        notes.append("one step only: its time includes start-up; run more steps to time it")
    else:
        step_time = None
    error = None
    if predicted is not None and step_time is not None and predicted.iteration_time_s > 0:
        error = step_time / predicted.iteration_time_s - 1
    training = config.training
    return RunReport(
        config=RunSummary(
            schedule=config.ir.name,
            t=config.parallel.t,
            p=config.parallel.p,
            d=config.parallel.d,
            micro_batch_size=config.micro_batch_size,
            num_microbatches=config.num_microbatches,
            precision=training.precision,
            sequence_parallel=training.sequence_parallel and config.parallel.t > 1,
            recompute_per_stage=[stage.recompute for stage in config.stages],
            world_size=config.world_size,
        ),
        continuous=continuous,
        first_step=first_step,
        num_steps=count,
        predicted=predicted,
        measured=MeasuredStep(step_time_s=step_time, per_step_s=per_step),
        step_time_error=error,
        ranks=rank_reports,
        verification=_verification(config, ranks),
        notes=notes,
    )


def _verification(config: ExecutorConfig, ranks: list[dict[str, Any]]) -> Verification | None:
    checks = [r["verify"] for r in ranks if r.get("verify") is not None]
    if not checks:
        return None
    mismatches = [Mismatch.model_validate(m) for c in checks for m in c["mismatches"]]
    return Verification(
        passed=not mismatches,
        compared=checks[0]["compared"],
        precision=config.training.precision,
        tolerance=checks[0]["tolerance"],
        checked=sum(c["checked"] for c in checks),
        max_error=max(c["max_error"] for c in checks),
        largest_share=max(c["largest_share"] for c in checks),
        mismatches=mismatches,
    )


def write_report(report: RunReport, folder: Path) -> Path:
    """Write ``run-report.json`` atomically: a reader never sees half a report."""
    path = folder / REPORT_FILE
    partial = folder / f".{REPORT_FILE}.partial"
    partial.write_text(json.dumps(report.model_dump(mode="json"), indent=1))
    os.replace(partial, path)
    return path


def describe(report: RunReport) -> str:
    """The report as a few readable lines and a per-rank table."""
    c = report.config
    modes = ",".join(
        "+".join(f"{n} {mode}" for mode, n in stage.as_dict().items())
        for stage in c.recompute_per_stage
    )
    lines = [
        f"{c.schedule}: t={c.t} p={c.p} d={c.d}, {c.num_microbatches} micro-batches of "
        f"{c.micro_batch_size}, {c.precision}, recompute per stage [{modes}]"
        + (", sequence parallel" if c.sequence_parallel else "")
        + f"; {c.world_size} ranks, steps {report.first_step}-"
        f"{report.first_step + report.num_steps - 1}"
        + (" (batches without a flush)" if report.continuous else ""),
    ]
    measured = report.measured.step_time_s
    predicted = report.predicted
    step = "step time: measured " + (f"{measured:.4f} s" if measured is not None else "-")
    if predicted is not None:
        step += f" | predicted {predicted.iteration_time_s:.4f} s on {predicted.hardware}"
        if report.step_time_error is not None:
            step += f" ({report.step_time_error:+.1%})"
    lines.append(step)
    # Each rank's row over the steps the measured time is taken over (all but the first,
    # which includes start-up), as medians: the last step alone is a 2BW run's drain.
    timed = slice(1, None) if report.num_steps > 1 else slice(None)
    first = report.first_step + (1 if report.num_steps > 1 else 0)
    last_step = report.first_step + report.num_steps - 1
    span = f"step {first}" if first == last_step else f"steps {first}-{last_step}"
    lines.append(f"per rank, the median of {span} (the steps the measured time is taken over):")
    lines.append(
        "rank  dp pp tp  stages   step s   busy s  bubble s   saved activations B "
        "(measured / predicted)   sent B"
    )
    for r in report.ranks:
        steps = r.steps[timed]
        wall = statistics.median(s.wall_s for s in steps)
        busy = statistics.median(s.busy_s for s in steps)
        sent = statistics.median(sum(s.bytes_sent.values()) for s in steps)
        predicted_bytes = (
            f"{r.predicted_saved_activation_bytes:.0f}"
            if r.predicted_saved_activation_bytes is not None
            else "-"
        )
        lines.append(
            f"{r.rank:>4} {r.dp:>3} {r.pp:>2} {r.tp:>2}  {','.join(map(str, r.stages)):<7}"
            f"{wall:>8.4f} {busy:>8.4f} {wall - busy:>9.4f}   "
            f"{r.peak_saved_activation_bytes:>12} / {predicted_bytes:<12}"
            f"{sent:>12.0f}"
        )
    for note in report.notes:
        lines.append(f"note: {note}")
    check = report.verification
    if check is not None:
        head = (
            f"verify: {'passed' if check.passed else 'FAILED'} ({check.compared}; "
            f"{check.checked} tensors vs a single-process reference in {check.precision}; "
            f"largest error {check.max_error:.2e}, tolerance {check.tolerance:.2e}"
            + (
                f"; the closest to its tensor's tolerance is {check.largest_share:.0%} of it)"
                if check.largest_share is not None
                else ")"
            )
        )
        lines.append(head)
        for m in check.mismatches[:20]:
            version = (
                f" (weight version {m.weight_version})" if m.weight_version is not None else ""
            )
            lines.append(
                f"  mismatch: rank {m.rank} stage {m.stage} {m.kind} {m.tensor}{version}: "
                f"error {m.error:.3e} > {m.tolerance:.2e}"
            )
        if len(check.mismatches) > 20:
            lines.append(f"  ... and {len(check.mismatches) - 20} more (see the report JSON)")
    return "\n".join(lines)
