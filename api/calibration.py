"""``stagewright calibrate``: fit a stored hardware profile to its stored measured runs and
store the result as the profile's next revision.

The fit uses the analytic cost model alone (no layer points): the parameters are the
model's, used wherever no measured point of a shape exists, and a run whose shape has a
point would tell the fit nothing about them. Runs can be narrowed (``models``,
``source``); those left out are then predicted before and after the fit, which shows how
the fit generalizes beyond the runs it saw.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session

from api.store.measured_runs import runs_of, store_calibration
from api.store.models import utcnow
from api.store.profiles import hardware_profile, require_hardware
from planner.calibrate import CalibrationResult, Quantity, evaluate, fit
from planner.errors import StagewrightError
from planner.measurements import MeasuredRun
from planner.profiles import CalibrationRecord

__all__ = ["CalibrationOutcome", "calibrate"]


@dataclass(frozen=True)
class CalibrationOutcome:
    """A fit, the runs it used and left out, and what was stored (None for a dry run)."""

    result: CalibrationResult
    base_revision: int
    used: list[tuple[int, MeasuredRun]]
    held_out: list[tuple[int, MeasuredRun]]
    held_out_quantities: list[Quantity]
    stored: CalibrationRecord | None


def calibrate(
    *,
    session: Session,
    hardware: str,
    parameters: Sequence[str] | None = None,
    models: Sequence[str] = (),
    source: str | None = None,
    dry_run: bool = False,
    exclude_outliers: bool = True,
) -> CalibrationOutcome:
    """Fit ``hardware``'s ``parameters`` (all registered ones by default) to its stored runs
    (only those of ``models`` and whose source contains ``source``, when given), leaving
    out measurements it misses far more than the rest unless not ``exclude_outliers``
    (:func:`planner.calibrate.fit`), and unless ``dry_run`` store the fitted profile as a
    new revision."""
    row = require_hardware(session=session, name=hardware)
    profile = hardware_profile(row, session)
    base_revision = row.revision
    everything = runs_of(session=session, gpu=hardware)
    chosen = [
        (i, run)
        for i, run in everything
        if (not models or run.model.name in models)
        and (source is None or source.lower() in run.source.lower())
    ]
    if not chosen:
        narrowed = " matching the filters" if models or source else ""
        raise StagewrightError(
            f"no measured runs of {hardware!r}{narrowed} ({len(everything)} stored); add "
            "some with `stagewright measurements add FILE`"
        )
    used_ids = {i for i, _ in chosen}
    held_out = [(i, run) for i, run in everything if i not in used_ids]
    result = fit(
        profile, [run for _, run in chosen], [], parameters, exclude_outliers=exclude_outliers
    )
    held = evaluate([run for _, run in held_out], profile, result.hardware, [])
    stored = None
    if not dry_run:
        stored = store_calibration(
            session=session,
            result=result,
            run_ids=sorted(used_ids),
            base_revision=base_revision,
            fitted_at=utcnow(),
        )
    return CalibrationOutcome(result, base_revision, chosen, held_out, held, stored)
