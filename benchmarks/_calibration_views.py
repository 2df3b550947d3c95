"""The planner judged on BPipe Table 7 under several profiles: as shipped, calibrated on all
public runs, and calibrated on one model's runs then checked on the other's (how the fit
generalizes). Used by ``paper_reproduction.py``.

A *view* is a hardware profile plus the measured layer points predictions may use. In a
held-out view the points of the held-out model (BPipe Table 3's 134B or 96B point) are left
out too, so nothing measured on the checked model enters its predictions.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _bpipe_table7 import (  # noqa: E402
    RECOMPUTE_ORDER,
    Checker,
    Row,
    key_of,
    key_of_config,
    request_for,
    spearman,
)

from planner.calibrate import fit  # noqa: E402
from planner.costmodel.allowance import AllowanceFit, fit_allowance  # noqa: E402
from planner.costmodel.memory import GIB  # noqa: E402
from planner.costmodel.parameters import ALLOCATOR_FRAGMENTATION, WORKSPACE_GIB  # noqa: E402
from planner.measurements import MeasuredRun  # noqa: E402
from planner.plan import plan  # noqa: E402
from planner.profiles import HardwareProfile, JsonProfileStore, LayerPoint  # noqa: E402
from planner.search.ties import within_error  # noqa: E402
from planner.specs import Candidate  # noqa: E402

CALIBRATED_AT = "2026-11-26T00:00:00Z"  # the record's date: not read by any prediction
PAPER_SEARCH_TOP_K = 60  # ranked candidates to look through for the paper's search space


@dataclass
class View:
    """A profile and the layer points its predictions may use."""

    label: str
    hardware: HardwareProfile
    points: list[LayerPoint]
    fitted_on: str  # what the time parameters were fitted on ('' for as shipped)
    allowance: AllowanceFit | None = None


@dataclass
class Scores:
    """How a view does on one group of rows."""

    rows: int
    spearman: float
    mean_abs_mfu_error: float
    labels_agreed: int
    labels_total: int
    # Does the planner's best match the paper's best row, and what it picked (None: rows of
    # two models, where "the best configuration" is not one question).
    best_any: tuple[bool, str] | None
    best_1f1b: tuple[bool, str] | None


def model_of_run(run: MeasuredRun) -> str:
    return run.model.name


def calibrated_view(
    label: str,
    base: HardwareProfile,
    runs: Sequence[MeasuredRun],
    points: list[LayerPoint],
    checker_rows: Sequence[Row],
    exclude_outliers: bool = True,
) -> View:
    """Fit the time parameters to ``runs`` (the model alone: no layer point hides a run
    from the fit), leaving out outliers as ``stagewright calibrate`` does unless not
    ``exclude_outliers``, and the memory allowance to the labels of ``checker_rows``."""
    result = fit(base, runs, [], exclude_outliers=exclude_outliers)
    # With the record ``stagewright calibrate`` stores, so plans carry the fit's error.
    hardware = result.hardware.with_parameters({}, result.record(CALIBRATED_AT))
    allowance = fit_allowance_on(hardware, points, checker_rows)
    hardware = hardware.with_parameters(
        {
            WORKSPACE_GIB.name: allowance.workspace_gib,
            ALLOCATOR_FRAGMENTATION.name: allowance.fragmentation,
        }
    )
    models = sorted({model_of_run(r) for r in runs})
    left_out = sum(q.excluded for q in result.quantities)
    named = ", ".join(models) if len(models) <= 2 else f"{len(models)} models"
    fitted_on = (
        f"{len(runs)} runs of {named}"
        + (f", {left_out} outlier(s) left out" if exclude_outliers else ", every quantity")
        + f", fit error {result.rms_log_error:.3f}"
    )
    return View(label, hardware, points, fitted_on, allowance)


def fit_allowance_on(
    hardware: HardwareProfile, points: list[LayerPoint], rows: Sequence[Row]
) -> AllowanceFit:
    labels = Checker(hardware, points).labels(rows)
    return fit_allowance(
        labels,
        hardware.usable_memory_gib * GIB,
        workspace_gib=(WORKSPACE_GIB.lower, WORKSPACE_GIB.upper),
        fragmentation=(ALLOCATOR_FRAGMENTATION.lower, ALLOCATOR_FRAGMENTATION.upper),
    )


def score(
    view: View, rows: Sequence[Row], best: bool = True
) -> tuple[Scores, list[dict[str, Any]]]:
    """Spearman and mean |MFU error| over ``rows``, the memory labels they imply, and (with
    ``best``, for the rows of one model) whether the planner's best, with BPipe and without,
    is the paper's best row."""
    checker = Checker(view.hardware, view.points)
    results = [checker.check(row) for row in rows]
    predicted = [r["predicted_mfu"] for r in results]
    measured = [row["mfu"] for row in rows]
    labels = checker.labels(rows)
    capacity = view.hardware.usable_memory_gib * GIB
    workspace = view.hardware.parameter(WORKSPACE_GIB.name) * GIB
    fragmentation = view.hardware.parameter(ALLOCATOR_FRAGMENTATION.name)
    agreed = sum(
        (x.tensor_bytes * (1 + fragmentation) + workspace <= capacity) == x.fits for x in labels
    )
    best_any = best_match(view, rows, ["1f1b", "bpipe"]) if best else None
    best_1f1b = (
        best_match(view, [r for r in rows if r["schedule"] == "1f1b"], ["1f1b"]) if best else None
    )
    return (
        Scores(
            rows=len(rows),
            spearman=spearman(predicted, measured),
            mean_abs_mfu_error=statistics.fmean(
                abs(p - m) for p, m in zip(predicted, measured, strict=True)
            ),
            labels_agreed=agreed,
            labels_total=len(labels),
            best_any=best_any,
            best_1f1b=best_1f1b,
        ),
        results,
    )


def best_match(view: View, rows: Sequence[Row], schedules: list[str]) -> tuple[bool, str]:
    """The planner's fastest configuration within the paper's search space (layers divide
    evenly over the stages, BPipe §4.2) against the paper's fastest row."""
    paper = max(rows, key=lambda r: r["mfu"])
    store = JsonProfileStore()
    store.add_hardware(view.hardware)
    store.add_points(view.points)
    request = request_for(paper, schedules)
    request = request.model_copy(
        update={"search": request.search.model_copy(update={"top_k": PAPER_SEARCH_TOP_K})}
    )
    layers = paper["num_layers"]
    space = [
        c
        for c in plan(request, store).candidates
        if layers % c.config.p == 0 and c.config.recompute in RECOMPUTE_ORDER
    ]
    if not space:
        return False, "none in the paper's space"
    picked = key_of_config(space[0].config)
    t, p, d, mbs, recompute, schedule = picked
    text = f"t{t} p{p} d{d} mb{mbs} {recompute} {schedule}"
    if picked != key_of(paper):
        text += "; " + _paper_best_text(space, key_of(paper))
    return picked == key_of(paper), text


def _paper_best_text(space: Sequence[Candidate], paper_key: tuple[Any, ...]) -> str:
    """Where the paper's best row stands behind a wrong pick: its rank among the planner's
    candidates of the paper's space, how much slower it is predicted, and whether that is
    within the prediction error of the pick (``planner.search.ties``, the plan's own note)."""
    rank, found = next(
        ((i, c) for i, c in enumerate(space, start=1) if key_of_config(c.config) == paper_key),
        (None, None),
    )
    if found is None:
        return f"the paper's best is not among the first {PAPER_SEARCH_TOP_K}"
    first = space[0].predicted
    gap = found.predicted.iteration_time_s / first.iteration_time_s - 1
    if first.calibration_error is None and found.predicted.calibration_error is None:
        inside = "no fit error known"
    else:
        inside = ("within" if within_error(first, found.predicted) else "beyond") + " the fit error"
    return f"the paper's best is #{rank}, {gap:+.1%}, {inside}"
