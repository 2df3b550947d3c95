"""How ``stagewright calibrate`` shows a fit: a text report and the JSON of ``--json``."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from planner.calibrate import Quantity, quantity_kind, rms_log_error
from planner.measurements import MeasuredRun

if TYPE_CHECKING:  # the outcome comes from the SQL store's use case (the service extra)
    from api.calibration import CalibrationOutcome

__all__ = ["calibration_json", "calibration_text"]

_WORST = 5


def _groups(
    quantities: Sequence[Quantity], runs: Sequence[tuple[int, MeasuredRun]]
) -> list[tuple[str, list[Quantity]]]:
    """Quantities by model and by (kind, quantity) -- where a fit is good and where not."""
    by: dict[str, list[Quantity]] = defaultdict(list)
    for q in quantities:
        run = runs[q.run][1]
        by[f"model {run.model.name}"].append(q)
        by[f"{run.measured.kind} {quantity_kind(q.name)}"].append(q)
    return sorted(by.items())


def _bias(quantities: Sequence[Quantity]) -> float:
    return sum(q.log_error_after for q in quantities) / len(quantities)


def calibration_text(outcome: CalibrationOutcome, where: str) -> str:
    result = outcome.result
    name = result.hardware.name
    stored = outcome.stored
    kept = [q for q in result.quantities if not q.excluded]
    excluded = [q for q in result.quantities if q.excluded]
    lines = [
        f"{name}: fitted to {len(outcome.used)} measured run(s) ({len(result.quantities)} "
        f"measured quantities, {len(excluded)} left out as outliers) in {result.iterations} "
        "iteration(s); "
        + (
            f"stored as revision {stored.revision} (was {outcome.base_revision}) in {where}"
            if stored is not None
            else f"dry run: nothing stored (profile stays at revision {outcome.base_revision})"
        ),
        "",
        f"{'parameter':<28}{'unit':<34}{'start':>7}{'fitted':>9}{'std err':>9}  status",
    ]
    for p in result.parameters:
        error = "" if p.std_error is None else f"{p.std_error:.3g}"
        why = {
            "uninformed": "uninformed: no run depends on it; kept",
            "held": "held: not asked to fit",
            "at bound": f"at bound [{p.parameter.lower:g}, {p.parameter.upper:g}]",
            "fitted": "fitted",
        }[p.status]
        lines.append(
            f"{p.parameter.name:<28}{p.parameter.unit:<34}{p.start:>7.4g}{p.value:>9.4g}"
            f"{error:>9}  {why}"
        )
    lines += [
        "",
        "fit error, RMS of ln(predicted / measured): "
        f"{result.rms_log_error_before:.3f} before -> {result.rms_log_error:.3f} after",
        f"  {'group':<30}{'n':>4}{'before':>9}{'after':>9}{'bias after':>12}",
    ]
    lines += _group_lines(kept, outcome.used)
    if outcome.held_out:
        held = outcome.held_out_quantities
        lines += [
            "",
            f"held out (not fitted): {len(outcome.held_out)} run(s), {len(held)} quantities: "
            f"{rms_log_error(held, after=False):.3f} before -> {rms_log_error(held):.3f} after",
        ]
        lines += _group_lines(held, outcome.held_out)
    if outcome.withdrawn:
        lines += [
            "",
            f"withdrawn (not fitted): {len(outcome.withdrawn)} run(s) "
            f"({_ids(outcome.withdrawn)}); `stagewright measurements list --withdrawn "
            f"--gpu {name}` says when and why",
        ]
    if excluded:
        lines += [
            "",
            "left out as outliers (missed by more than 3 robust standard deviations of the "
            "fit's errors; --keep-outliers fits them too):",
        ]
        lines += [_error_line(q, outcome.used) for q in excluded]
    worst = sorted(kept, key=lambda q: -abs(q.log_error_after))[:_WORST]
    lines += ["", "largest errors after the fit:"]
    lines += [_error_line(q, outcome.used) for q in worst]
    lines += [f"warning: {w}" for w in result.warnings]
    return "\n".join(lines)


_LISTED_IDS = 12


def _ids(ids: Sequence[int]) -> str:
    shown = ", ".join(str(i) for i in ids[:_LISTED_IDS])
    more = len(ids) - _LISTED_IDS
    return "id " + shown + (f" and {more} more" if more > 0 else "")


def _group_lines(
    quantities: Sequence[Quantity], runs: Sequence[tuple[int, MeasuredRun]]
) -> list[str]:
    """One line per group (model, kind of quantity): size, RMS ln error before and after,
    bias after."""
    return [
        f"  {label:<30}{len(group):>4}{rms_log_error(group, after=False):>9.3f}"
        f"{rms_log_error(group):>9.3f}{_bias(group):>+12.3f}"
        for label, group in _groups(quantities, runs)
    ]


def _error_line(q: Quantity, runs: Sequence[tuple[int, MeasuredRun]]) -> str:
    run_id, run = runs[q.run]
    c = run.config
    return (
        f"  run {run_id} {q.name}: measured {q.measured:.4g}, predicted "
        f"{q.predicted_after:.4g} ({q.predicted_after / q.measured - 1:+.1%}); "
        f"{run.model.name} t{c.t} p{c.p} d{c.d} mb{c.micro_batch_size} {c.recompute} "
        f"{c.schedule}"
    )


def _quantity(q: Quantity, runs: Sequence[tuple[int, MeasuredRun]]) -> dict[str, Any]:
    return {
        "run_id": runs[q.run][0],
        "quantity": q.name,
        "measured": q.measured,
        "predicted_before": q.predicted_before,
        "predicted_after": q.predicted_after,
        "log_error_before": q.log_error_before,
        "log_error_after": q.log_error_after,
        "excluded": q.excluded,
    }


def calibration_json(outcome: CalibrationOutcome) -> dict[str, Any]:
    result = outcome.result
    return {
        "hardware": result.hardware.name,
        "base_revision": outcome.base_revision,
        "stored": None if outcome.stored is None else outcome.stored.model_dump(mode="json"),
        "iterations": result.iterations,
        "rms_log_error_before": result.rms_log_error_before,
        "rms_log_error": result.rms_log_error,
        "parameters": [
            {
                "name": p.parameter.name,
                "unit": p.parameter.unit,
                "lower": p.parameter.lower,
                "upper": p.parameter.upper,
                "start": p.start,
                "value": p.value,
                "std_error": p.std_error,
                "status": p.status,
            }
            for p in result.parameters
        ],
        "runs_used": [i for i, _ in outcome.used],
        "quantities": [_quantity(q, outcome.used) for q in result.quantities],
        "held_out": {
            "runs": [i for i, _ in outcome.held_out],
            "rms_log_error_before": rms_log_error(outcome.held_out_quantities, after=False),
            "rms_log_error": rms_log_error(outcome.held_out_quantities),
            "quantities": [_quantity(q, outcome.held_out) for q in outcome.held_out_quantities],
        },
        "withdrawn": outcome.withdrawn,
        "warnings": result.warnings,
    }
