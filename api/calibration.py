"""``stagewright calibrate``: fit a stored hardware profile to its stored measured runs and
store the result as the profile's next revision.

The fit uses the analytic cost model alone (no layer points): the parameters are the
model's, used wherever no measured point of a shape exists, and a run whose shape has a
point would tell the fit nothing about them. Runs can be narrowed (``models``,
``source``); those left out are then predicted before and after the fit, which shows how
the fit generalizes beyond the runs it saw. Withdrawn runs are never fitted nor held out;
the outcome names them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session

from api.store.measured_runs import runs_of, store_calibration, stored_gpus, withdrawn_ids
from api.store.models import utcnow
from api.store.profiles import hardware_profile, require_hardware
from planner.calibrate import CalibrationResult, Quantity, evaluate, fit
from planner.errors import StagewrightError
from planner.measurements import MeasuredRun
from planner.profiles import CalibrationRecord

__all__ = ["CalibrationOutcome", "calibrate"]


@dataclass(frozen=True)
class CalibrationOutcome:
    """A fit, the runs it used and held out, what was stored (None for a dry run), and the
    ids of the hardware's withdrawn runs (neither fitted nor held out)."""

    result: CalibrationResult
    base_revision: int
    used: list[tuple[int, MeasuredRun]]
    held_out: list[tuple[int, MeasuredRun]]
    held_out_quantities: list[Quantity]
    stored: CalibrationRecord | None
    withdrawn: list[int]


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
    new revision. StagewrightError, storing nothing, when no run is chosen or when the fit
    moves no parameter (every one asked for is uninformed: the revision would change
    nothing)."""
    row = require_hardware(session=session, name=hardware)
    profile = hardware_profile(row, session)
    base_revision = row.revision
    everything = runs_of(session=session, gpu=hardware)
    withdrawn = withdrawn_ids(session=session, gpu=hardware)
    chosen = [
        (i, run)
        for i, run in everything
        if (not models or run.model.name in models)
        and (source is None or source.lower() in run.source.lower())
    ]
    if not chosen:
        raise StagewrightError(
            _nothing_to_fit(session, hardware, everything, len(withdrawn), models, source)
        )
    used_ids = {i for i, _ in chosen}
    held_out = [(i, run) for i, run in everything if i not in used_ids]
    result = fit(
        profile, [run for _, run in chosen], [], parameters, exclude_outliers=exclude_outliers
    )
    held = evaluate([run for _, run in held_out], profile, result.hardware, [])
    stored = None
    if not dry_run and not result.moved:
        raise StagewrightError(_nothing_moved(result, hardware, base_revision, len(chosen)))
    if not dry_run:
        stored = store_calibration(
            session=session,
            result=result,
            run_ids=sorted(used_ids),
            base_revision=base_revision,
            fitted_at=utcnow(),
        )
    return CalibrationOutcome(result, base_revision, chosen, held_out, held, stored, withdrawn)


def _nothing_moved(result: CalibrationResult, hardware: str, base_revision: int, runs: int) -> str:
    """Why nothing is stored when the fit moved no parameter: a new revision would be the
    base revision again under another number, and the record would claim a calibration
    that changed nothing."""
    # Every parameter asked for that did not move is uninformed (a fitted one moves).
    asked = [p.parameter.name for p in result.parameters if p.status != "held"]
    which = f"{asked[0]} is" if len(asked) == 1 else f"{', '.join(asked)} are"
    return (
        f"nothing stored: the fit to {runs} measured run(s) of {hardware!r} moved no "
        f"parameter ({which} uninformed: no run's prediction depends on it), so a new "
        f"revision would equal revision {base_revision}. Fit parameters these runs inform "
        "(leave out --parameter to fit every one), or add runs that measure what the "
        "parameter sets; --dry-run shows the fit without storing anything"
    )


# How many stored values a message lists, and how much of each source it shows (a source
# is matched by any part of it, so the start of one is a value --source takes).
_LISTED = 12
_SOURCE_CHARS = 40


def _nothing_to_fit(
    session: Session,
    hardware: str,
    everything: list[tuple[int, MeasuredRun]],
    withdrawn: int,
    models: Sequence[str],
    source: str | None,
) -> str:
    """Why no run was chosen: none stored for ``hardware`` (add some; or all of them are
    withdrawn: adding one again restores it), or runs stored but the filters matched none
    of them, naming what is stored for the filter that failed."""
    if not everything:
        others = [gpu for gpu in stored_gpus(session=session) if gpu != hardware]
        stored = f" (runs are stored for {_listing(others)})" if others else ""
        if withdrawn:
            return (
                f"no measured runs of {hardware!r} in use: all {withdrawn} stored are "
                f"withdrawn (`stagewright measurements list --withdrawn --gpu {hardware}` "
                "lists them; adding one again with `stagewright measurements add FILE` "
                f"restores it){stored}"
            )
        return (
            f"no measured runs of {hardware!r} (0 stored); add some with `stagewright "
            f"measurements add FILE`{stored}"
        )
    matched = f"no measured runs of {hardware!r} match the filters ({len(everything)} stored)"
    stored_models = sorted({run.model.name for _, run in everything})
    if models and not set(models) & set(stored_models):
        return (
            f"{matched}: no run is of --model {_listing(models)}; the stored models are "
            f"{_listing(stored_models)}"
        )
    # Runs are stored and some are of the models asked for: the source left them all out.
    assert source is not None
    if not any(source.lower() in run.source.lower() for _, run in everything):
        sources = _sources([run.source for _, run in everything])
        return (
            f"{matched}: no run's source contains --source {source!r}; the stored sources "
            f"begin {_listing(sources, quoted=True)}"
        )
    sources = _sources([run.source for _, run in everything if run.model.name in models])
    return (
        f"{matched}: no run of --model {_listing(models)} has a source containing "
        f"{source!r}; their sources begin {_listing(sources, quoted=True)}"
    )


def _sources(sources: Sequence[str]) -> list[str]:
    """Each distinct start of the sources, quoted: whole when short, else cut, with '...'."""
    starts = (
        repr(s) if len(s) <= _SOURCE_CHARS else repr(s[:_SOURCE_CHARS].rstrip()) + "..."
        for s in sources
    )
    return list(dict.fromkeys(starts))


def _listing(values: Sequence[str], quoted: bool = False) -> str:
    shown = ", ".join(value if quoted else repr(value) for value in values[:_LISTED])
    more = len(values) - _LISTED
    return shown + (f" and {more} more" if more > 0 else "")
