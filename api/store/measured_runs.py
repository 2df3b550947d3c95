"""Measured runs and calibrations in SQL.

Adding runs is all or nothing: :func:`add_runs` checks every run (it is not dated after
today, its GPU has a profile, the cost model can price its configuration, no measured
number is 100 times above or below its prediction: a slip of unit) and writes them in the
caller's transaction only if all pass; an identical run already stored (same fingerprint)
is counted, not copied.
:func:`store_calibration` writes a fitted profile as the hardware's next revision.

A run is never deleted: :func:`withdraw_run` marks it withdrawn (when, why), and lists
(unless asked for withdrawn runs) and calibration leave it out. Calibration records name
the runs they used, so the rows stay; and the bundled runs are loaded at every start, so a
deleted bundled run would come back. Adding an identical run again restores it (a person
asked for it), except from the bundled loader, which keeps a withdrawn run withdrawn.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError
from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api.store.crud import rowcount
from api.store.models import Calibration, Hardware, MeasuredRunRecord, Measurement, utcnow
from api.store.profiles import WriteReport, hardware_profile, upsert_hardware
from planner.calibrate import CalibrationResult, implausible, predict_quantities
from planner.errors import StagewrightError
from planner.measurement_files import (
    MeasurementFileError,
    ParsedRun,
    describe_problems,
    parse_runs,
)
from planner.measurements import (
    MeasuredRun,
    PassMeasurement,
    StepMeasurement,
    fingerprint,
    measured_on_problem,
)
from planner.profiles import (
    BUNDLED_PROFILES,
    CalibrationRecord,
    HardwareProfile,
    JsonProfileStore,
    extra_profile_dirs,
)

__all__ = [
    "MAX_REASON_CHARS",
    "REASON_PATTERN",
    "AddReport",
    "RunOrigin",
    "RunsRefusedError",
    "UnknownRunError",
    "WithdrawReport",
    "add_runs",
    "count_runs",
    "get_run",
    "list_runs",
    "load_bundled_runs",
    "reason_problem",
    "record_plan_measurement",
    "run_columns",
    "run_from_plan_measurement",
    "runs_of",
    "store_calibration",
    "stored_gpus",
    "withdraw_run",
    "withdrawn_ids",
]

log = logging.getLogger("stagewright.measurements")

RunOrigin = Literal["bundled", "api", "cli", "plan", "executor"]


@dataclass
class AddReport:
    """What an add did: runs stored, runs already there (``unchanged``: those in use, and
    the withdrawn ones the bundled loader keeps withdrawn, also counted in
    ``kept_withdrawn``), withdrawn runs put back in use (``restored``); ids in the order
    given."""

    created: int = 0
    unchanged: int = 0
    restored: int = 0
    kept_withdrawn: int = 0
    ids: list[int] = field(default_factory=list)


class RunsRefusedError(MeasurementFileError):
    """:func:`add_runs` stored nothing: the message names the source and lists every
    problem; ``problems`` are those lines, each naming its run and field."""

    def __init__(self, name: str, problems: Sequence[str]) -> None:
        super().__init__(describe_problems(name, problems), problems)


def add_runs(
    *, session: Session, runs: Sequence[ParsedRun], origin: RunOrigin, name: str
) -> AddReport:
    """Check every run, then store the new ones (flushes; the caller commits, so a failure
    stores nothing). RunsRefusedError lists every run that cannot be stored, by row: one
    dated after today (:func:`~planner.measurements.measured_on_problem`), of a GPU without
    a profile, of a configuration the planner cannot price, or measuring a number 100
    times off its prediction."""
    profiles: dict[str, HardwareProfile | None] = {}
    problems: list[str] = []
    unknown: dict[str, list[ParsedRun]] = {}
    now = utcnow()
    for parsed in runs:
        dated = measured_on_problem(parsed.run, now)
        if dated is not None:
            problems.append(parsed.problem("measured_on", dated))
        gpu = parsed.run.cluster.gpu
        if gpu not in profiles:
            row = session.get(Hardware, gpu)
            profiles[gpu] = None if row is None else hardware_profile(row, session)
        profile = profiles[gpu]
        if profile is None:
            unknown.setdefault(gpu, []).append(parsed)
            continue
        try:
            predicted = predict_quantities(parsed.run, profile, [])
        except StagewrightError as exc:
            problems.append(f"{parsed.where}: the planner cannot price this configuration: {exc}")
            continue
        problems += [
            parsed.problem(field, message)
            for field, message in implausible(parsed.run, profile, predicted)
        ]
    problems += [_unknown_gpu(session, gpu, found) for gpu, found in unknown.items()]
    if problems:
        raise RunsRefusedError(name, problems)
    report = AddReport()
    for parsed in runs:
        key = fingerprint(parsed.run)
        found = _stored(session, key)
        if found is None:
            record = MeasuredRunRecord(
                **run_columns(parsed.run), fingerprint=key, origin=origin, created_at=now
            )
            try:
                with session.begin_nested():  # a savepoint: a lost race undoes this row only
                    session.add(record)
            except IntegrityError:
                found = _stored(session, key)  # stored by a concurrent writer meanwhile
                if found is None:  # the only unique constraint is the fingerprint
                    raise
            else:
                report.created += 1
                report.ids.append(record.id)
                continue
        run_id, withdrawn = found
        report.ids.append(run_id)
        if withdrawn and origin != "bundled" and _restore(session, run_id):
            report.restored += 1
            continue
        report.unchanged += 1
        if withdrawn and origin == "bundled":
            report.kept_withdrawn += 1
    return report


def _restore(session: Session, run_id: int) -> bool:
    """Put a withdrawn run back in use; whether it was withdrawn. (A conditional update: of
    two writers restoring it at once, one restores it and the other finds it in use.)"""
    stmt = (
        update(MeasuredRunRecord)
        .where(MeasuredRunRecord.id == run_id, MeasuredRunRecord.withdrawn_at.is_not(None))
        .values(withdrawn_at=None, withdrawn_reason=None)
        .execution_options(synchronize_session="fetch")
    )
    return rowcount(session.execute(stmt)) == 1


_LISTED_RUNS = 5  # runs of one unknown GPU named in its problem; the rest are counted


def _unknown_gpu(session: Session, gpu: str, runs: list[ParsedRun]) -> str:
    """One problem for every run of a GPU the store has no profile of: the first run, the
    known profiles, the others by where they are, and the profile folder that has it."""
    known = ", ".join(session.scalars(select(Hardware.name).order_by(Hardware.name)))
    message = (
        f"unknown GPU {gpu!r}; known hardware profiles: {known} (add one with `stagewright "
        "profiles load FOLDER` or POST /v1/hardware)"
    )
    more = runs[1:]
    if more:
        listed = ", ".join(r.where for r in more[:_LISTED_RUNS])
        rest = len(more) - _LISTED_RUNS
        message += f"; the same GPU in {len(more)} more run(s): {listed}" + (
            f" and {rest} more" if rest > 0 else ""
        )
    folder = _folder_with(gpu)
    if folder is not None:
        message += (
            f"; {gpu!r} is in {folder} (STAGEWRIGHT_PROFILES), which plans read but this store "
            f"does not: load it first with `stagewright profiles load {folder.parent}`"
        )
    return runs[0].problem("cluster.gpu", message)


def _folder_with(gpu: str) -> Path | None:
    """The hardware.json of a STAGEWRIGHT_PROFILES folder that defines ``gpu``, if any (a
    folder that does not load says nothing here: a plan reports it)."""
    for folder in extra_profile_dirs():
        try:
            names = JsonProfileStore.load(folder).hardware_names()
        except (StagewrightError, ValueError):
            continue
        if gpu in names:
            return folder / "hardware.json"
    return None


def _stored(session: Session, key: str) -> tuple[int, bool] | None:
    """The id of the stored run with this fingerprint and whether it is withdrawn, in the one
    query that finds it (the loader asks it of every bundled run at every start)."""
    stmt = select(MeasuredRunRecord.id, MeasuredRunRecord.withdrawn_at).where(
        MeasuredRunRecord.fingerprint == key
    )
    row = session.execute(stmt).first()
    return None if row is None else (row[0], row[1] is not None)


def run_columns(run: MeasuredRun) -> dict[str, Any]:
    """The columns of a ``measured_runs`` row (fingerprint, origin and date aside)."""
    measured = run.measured
    step = measured if isinstance(measured, StepMeasurement) else None
    passes = measured if isinstance(measured, PassMeasurement) else None
    c = run.config
    return {
        "gpu": run.cluster.gpu,
        "kind": measured.kind,
        "model_name": run.model.name,
        "num_gpus": run.cluster.num_gpus,
        "t": c.t,
        "p": c.p,
        "d": c.d,
        "micro_batch_size": c.micro_batch_size,
        "recompute": c.recompute,
        "schedule": c.schedule,
        "step_time_s": step.step_time_s if step else None,
        "mfu": step.mfu if step else None,
        "peak_memory_gib": step.peak_memory_gib if step else None,
        "pass_layers": passes.num_layers if passes else None,
        "forward_ms": passes.forward_ms if passes else None,
        "backward_ms": passes.backward_ms if passes else None,
        "weight_ms": passes.weight_ms if passes else None,
        "source": run.source,
        "measured_on": run.measured_on,
        "run": run.model_dump(mode="json"),
    }


def _filtered(
    stmt: Any, gpu: str | None, model: str | None, source: str | None, withdrawn: bool = False
) -> Any:
    withdrawn_at = MeasuredRunRecord.withdrawn_at
    stmt = stmt.where(withdrawn_at.is_not(None) if withdrawn else withdrawn_at.is_(None))
    if gpu is not None:
        stmt = stmt.where(MeasuredRunRecord.gpu == gpu)
    if model is not None:
        stmt = stmt.where(MeasuredRunRecord.model_name == model)
    if source is not None:
        # autoescape: '%' and '_' are the text asked for, not LIKE's wildcards (calibrate's
        # --source matches the same way, in Python).
        lowered = func.lower(MeasuredRunRecord.source)
        stmt = stmt.where(lowered.contains(source.lower(), autoescape=True))
    return stmt


def list_runs(
    *,
    session: Session,
    gpu: str | None = None,
    model: str | None = None,
    source: str | None = None,
    limit: int = 100,
    offset: int = 0,
    withdrawn: bool = False,
) -> list[MeasuredRunRecord]:
    """Stored runs in use (the withdrawn ones instead when ``withdrawn``), oldest first;
    ``source`` matches a part of the source, any case."""
    stmt = _filtered(select(MeasuredRunRecord), gpu, model, source, withdrawn)
    return list(session.scalars(stmt.order_by(MeasuredRunRecord.id).limit(limit).offset(offset)))


def count_runs(
    *,
    session: Session,
    gpu: str | None = None,
    model: str | None = None,
    source: str | None = None,
    withdrawn: bool = False,
) -> int:
    """How many runs :func:`list_runs` lists over all its pages."""
    stmt = select(func.count()).select_from(MeasuredRunRecord)
    return int(session.scalar(_filtered(stmt, gpu, model, source, withdrawn)) or 0)


def runs_of(*, session: Session, gpu: str) -> list[tuple[int, MeasuredRun]]:
    """Every run of ``gpu`` in use (withdrawn ones left out) with its id, oldest first: the
    runs calibration fits."""
    rows = session.scalars(
        _filtered(select(MeasuredRunRecord), gpu, None, None).order_by(MeasuredRunRecord.id)
    )
    return [(row.id, MeasuredRun.model_validate(row.run)) for row in rows]


def withdrawn_ids(*, session: Session, gpu: str) -> list[int]:
    """The ids of ``gpu``'s withdrawn runs, oldest first (what calibration leaves out)."""
    stmt = _filtered(select(MeasuredRunRecord.id), gpu, None, None, withdrawn=True)
    return list(session.scalars(stmt.order_by(MeasuredRunRecord.id)))


def stored_gpus(*, session: Session, withdrawn: bool = False) -> list[str]:
    """The hardware profiles that have runs in use (``withdrawn``: withdrawn runs), by
    name."""
    stmt = _filtered(select(MeasuredRunRecord.gpu), None, None, None, withdrawn)
    return list(session.scalars(stmt.distinct().order_by(MeasuredRunRecord.gpu)))


class UnknownRunError(StagewrightError):
    """No measured run has this id."""


@dataclass(frozen=True)
class WithdrawReport:
    """A withdrawn run, and whether it already was (then its first withdrawal stands)."""

    run: MeasuredRunRecord
    already: bool


# A withdrawal's reason: some text (not only spaces), no NUL (PostgreSQL text holds none).
# The rule of every caller: DELETE /v1/measurements/{id} states it as its query's limits.
MAX_REASON_CHARS = 500
REASON_PATTERN = r"^[^\x00]*[^\s\x00][^\x00]*$"

# Ids are 32-bit on PostgreSQL (INTEGER): a larger one names no run, and asking the
# database for it would be an error of the database instead of "no such run".
_MAX_ID = 2**31 - 1


def reason_problem(reason: str | None) -> str | None:
    """What is wrong with a withdrawal's reason (the rule the REST query states), if
    anything; None (no reason) is allowed."""
    if reason is None:
        return None
    if len(reason) > MAX_REASON_CHARS:
        return f"is {len(reason)} characters long; keep it to {MAX_REASON_CHARS}"
    if not re.fullmatch(REASON_PATTERN, reason):
        if "\x00" in reason:
            return "holds a NUL character, which the store cannot keep"
        return "is empty; say why the run is withdrawn, or leave the reason out"
    return None


def get_run(*, session: Session, run_id: int) -> MeasuredRunRecord | None:
    """The run with this id, in use or withdrawn; None when there is none."""
    if not 1 <= run_id <= _MAX_ID:
        return None
    return session.get(MeasuredRunRecord, run_id)


def withdraw_run(*, session: Session, run_id: int, reason: str | None) -> WithdrawReport:
    """Withdraw run ``run_id`` now, with ``reason`` (flushes; the caller commits).
    Idempotent: a run already withdrawn keeps when and why it was first withdrawn (a
    second reason does not rewrite the record) and the report says ``already``.
    UnknownRunError when no run has this id; StagewrightError for a reason
    :func:`reason_problem` refuses."""
    problem = reason_problem(reason)
    if problem is not None:
        raise StagewrightError(f"the reason {problem}")
    if 1 <= run_id <= _MAX_ID:
        stmt = (
            update(MeasuredRunRecord)
            .where(MeasuredRunRecord.id == run_id, MeasuredRunRecord.withdrawn_at.is_(None))
            .values(withdrawn_at=utcnow(), withdrawn_reason=reason)
            .execution_options(synchronize_session="fetch")
        )
        # A conditional update: of two withdrawals at once, one withdraws and the other
        # finds it withdrawn, with the first's time and reason.
        changed = rowcount(session.execute(stmt)) == 1
        row = session.get(MeasuredRunRecord, run_id, populate_existing=True)
        if row is not None:
            return WithdrawReport(row, already=not changed)
    raise UnknownRunError(f"no measured run has id {run_id}")


def store_calibration(
    *,
    session: Session,
    result: CalibrationResult,
    run_ids: Sequence[int],
    base_revision: int,
    fitted_at: datetime,
) -> CalibrationRecord:
    """Store ``result``'s fitted profile as the hardware's next revision, with its
    calibration record and a history entry, and commit. StagewrightError when the profile
    changed since the fit read it (``base_revision``): fit again."""
    name = result.hardware.name
    row = session.get(Hardware, name, with_for_update=True)
    if row is None or row.revision != base_revision:
        raise StagewrightError(
            f"hardware profile {name!r} changed while it was being fitted (revision "
            f"{base_revision} -> {None if row is None else row.revision}); run calibrate again"
        )
    before = dict(row.parameters or {})
    record = result.record(fitted_at.isoformat(), run_ids, revision=base_revision + 1)
    profile = result.hardware.with_parameters({}, record)
    report = WriteReport()
    upsert_hardware(session=session, profile=profile, origin=_origin(row.origin), report=report)
    # The record (its date at least) is new, so the write raised the revision once.
    assert row.revision == base_revision + 1, (row.revision, base_revision)
    session.add(
        Calibration(
            gpu=name,
            revision=row.revision,
            base_revision=base_revision,
            parameters_before=before,
            parameters_after=dict(profile.parameters),
            record=record.model_dump(mode="json"),
            created_at=fitted_at,
        )
    )
    session.commit()
    return record


def _origin(value: str) -> Literal["bundled", "api"]:
    return "api" if value == "api" else "bundled"


def run_from_plan_measurement(
    *,
    request: dict[str, Any],
    config: dict[str, Any],
    step_time_s: float,
    plan_id: str,
    candidate: int,
    measured_on: date,
) -> MeasuredRun:
    """The measured run a plan measurement stands for: the plan's request and the
    candidate's configuration, timed at ``step_time_s``."""
    run_config = {k: v for k, v in config.items() if k != "num_microbatches"}
    return MeasuredRun.model_validate(
        {
            "model": request["model"],
            "cluster": request["cluster"],
            "training": request["training"],
            "config": {k: v for k, v in run_config.items() if k in _RUN_CONFIG_FIELDS},
            "measured": {"kind": "step", "step_time_s": step_time_s},
            "source": f"executor run of plan {plan_id}, candidate {candidate}",
            "measured_on": measured_on.isoformat(),
        }
    )


def record_plan_measurement(
    *, session: Session, measurement: Measurement, request: dict[str, Any], config: dict[str, Any]
) -> int | None:
    """Store the measured run a plan measurement (a stored row) stands for, link the two
    (``measurement.measured_run_id``; the run's ``measurement_id`` when it is new), and
    commit; the run's id. A run the store refuses (a number 100 times off its prediction,
    hardware it has no profile of) leaves the measurement stored with the refusal in
    ``measurement.not_calibrated_because`` (and logged), and gives None."""
    try:
        run = run_from_plan_measurement(
            request=request,
            config=config,
            step_time_s=measurement.step_time_s,
            plan_id=measurement.plan_id,
            candidate=measurement.candidate,
            measured_on=measurement.created_at.date(),
        )
        report = add_runs(
            session=session,
            runs=[ParsedRun(f"measurement {measurement.id}", run)],
            origin="plan",
            name=f"plan {measurement.plan_id}",
        )
    except RunsRefusedError as exc:
        refusal = "; ".join(exc.problems)
    except ValidationError as exc:  # a plan whose request no longer reads as a run
        said = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        refusal = f"measurement {measurement.id}: the plan does not read as a measured run: {said}"
    except ValueError as exc:  # StagewrightError: anything else the run cannot be stored for
        refusal = f"measurement {measurement.id}: {exc}"
    else:
        row = session.get(MeasuredRunRecord, report.ids[0])
        assert row is not None
        if report.created:
            row.measurement_id = measurement.id
        measurement.measured_run_id = row.id
        session.commit()
        return row.id
    session.rollback()  # the run's writes, if any; the measurement was committed before
    log.warning("measurement %s not stored as a measured run: %s", measurement.id, refusal)
    measurement.not_calibrated_because = refusal
    session.commit()
    return None


_RUN_CONFIG_FIELDS = {
    "t",
    "p",
    "d",
    "micro_batch_size",
    "recompute",
    "schedule",
    "layers_per_stage",
    "recompute_per_stage",
    "memory_limit",
    "num_chunks",
}


def load_bundled_runs(*, session: Session, folder: Path = BUNDLED_PROFILES) -> AddReport:
    """Store the bundled measurement sets (``profiles/measurements/*.json``) of the hardware
    the store has (flushes; idempotent: identical runs are counted, not copied, and a
    withdrawn one stays withdrawn)."""
    report = AddReport()
    known = set(session.scalars(select(Hardware.name)))
    for path in sorted((folder / "measurements").glob("*.json")):
        parsed = parse_runs(path.read_text(encoding="utf-8"), path.name)
        ours = [p for p in parsed if p.run.cluster.gpu in known]
        if ours:
            added = add_runs(session=session, runs=ours, origin="bundled", name=path.name)
            report.created += added.created
            report.unchanged += added.unchanged
            report.kept_withdrawn += added.kept_withdrawn
            report.ids += added.ids
    return report
