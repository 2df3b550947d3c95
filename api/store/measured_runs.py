"""Measured runs and calibrations in SQL.

Adding runs is all or nothing: :func:`add_runs` checks every run (its GPU has a profile, the
cost model can price its configuration, no measured number is 100 times above or below its
prediction: a slip of unit) and writes them in the caller's transaction only
if all pass; an identical run already stored (same fingerprint) is counted, not copied.
:func:`store_calibration` writes a fitted profile as the hardware's next revision.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

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
from planner.measurements import MeasuredRun, PassMeasurement, StepMeasurement, fingerprint
from planner.profiles import (
    BUNDLED_PROFILES,
    CalibrationRecord,
    HardwareProfile,
    JsonProfileStore,
    extra_profile_dirs,
)

__all__ = [
    "AddReport",
    "RunOrigin",
    "add_runs",
    "count_runs",
    "list_runs",
    "load_bundled_runs",
    "record_plan_measurement",
    "run_columns",
    "run_from_plan_measurement",
    "runs_of",
    "store_calibration",
    "stored_gpus",
]

log = logging.getLogger("stagewright.measurements")

RunOrigin = Literal["bundled", "api", "cli", "plan", "executor"]


@dataclass
class AddReport:
    """What an add did: runs stored, runs already there; ids in the order given."""

    created: int = 0
    unchanged: int = 0
    ids: list[int] = field(default_factory=list)


def add_runs(
    *, session: Session, runs: Sequence[ParsedRun], origin: RunOrigin, name: str
) -> AddReport:
    """Check every run, then store the new ones (flushes; the caller commits, so a failure
    stores nothing). MeasurementFileError lists every run that cannot be stored, by row."""
    profiles: dict[str, HardwareProfile | None] = {}
    problems: list[str] = []
    unknown: dict[str, list[ParsedRun]] = {}
    for parsed in runs:
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
        raise MeasurementFileError(describe_problems(name, problems))
    report = AddReport()
    now = utcnow()
    for parsed in runs:
        key = fingerprint(parsed.run)
        found = _stored_id(session, key)
        if found is None:
            record = MeasuredRunRecord(
                **run_columns(parsed.run), fingerprint=key, origin=origin, created_at=now
            )
            try:
                with session.begin_nested():  # a savepoint: a lost race undoes this row only
                    session.add(record)
            except IntegrityError:
                found = _stored_id(session, key)  # stored by a concurrent writer meanwhile
                if found is None:  # the only unique constraint is the fingerprint
                    raise
            else:
                report.created += 1
                report.ids.append(record.id)
                continue
        report.unchanged += 1
        report.ids.append(found)
    return report


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


def _stored_id(session: Session, key: str) -> int | None:
    return session.scalar(select(MeasuredRunRecord.id).where(MeasuredRunRecord.fingerprint == key))


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


def _filtered(stmt: Any, gpu: str | None, model: str | None, source: str | None) -> Any:
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
) -> list[MeasuredRunRecord]:
    """Stored runs, oldest first; ``source`` matches a part of the source, any case."""
    stmt = _filtered(select(MeasuredRunRecord), gpu, model, source)
    return list(session.scalars(stmt.order_by(MeasuredRunRecord.id).limit(limit).offset(offset)))


def count_runs(
    *, session: Session, gpu: str | None = None, model: str | None = None, source: str | None = None
) -> int:
    stmt = _filtered(select(func.count()).select_from(MeasuredRunRecord), gpu, model, source)
    return int(session.scalar(stmt) or 0)


def runs_of(*, session: Session, gpu: str) -> list[tuple[int, MeasuredRun]]:
    """Every stored run of ``gpu`` with its id, oldest first."""
    rows = session.scalars(
        select(MeasuredRunRecord).where(MeasuredRunRecord.gpu == gpu).order_by(MeasuredRunRecord.id)
    )
    return [(row.id, MeasuredRun.model_validate(row.run)) for row in rows]


def stored_gpus(*, session: Session) -> list[str]:
    """The hardware profiles that have stored runs, by name."""
    stmt = select(MeasuredRunRecord.gpu).distinct().order_by(MeasuredRunRecord.gpu)
    return list(session.scalars(stmt))


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
    """Store the measured run a plan measurement stands for, linked to it, and commit; its
    id. A plan whose configuration cannot be stored as a run (logged) leaves the measurement
    alone and gives None."""
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
    except ValueError as exc:  # MeasurementFileError and pydantic's errors are ValueErrors
        session.rollback()
        log.warning("measurement %s not stored as a measured run: %s", measurement.id, exc)
        return None
    row = session.get(MeasuredRunRecord, report.ids[0])
    assert row is not None
    if report.created:
        row.measurement_id = measurement.id
    session.commit()
    return row.id


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
    the store has (flushes; idempotent: identical runs are counted, not copied)."""
    report = AddReport()
    known = set(session.scalars(select(Hardware.name)))
    for path in sorted((folder / "measurements").glob("*.json")):
        parsed = parse_runs(path.read_text(encoding="utf-8"), path.name)
        ours = [p for p in parsed if p.run.cluster.gpu in known]
        if ours:
            added = add_runs(session=session, runs=ours, origin="bundled", name=path.name)
            report.created += added.created
            report.unchanged += added.unchanged
            report.ids += added.ids
    return report
