"""``stagewright measurements add|list|show|withdraw`` and ``stagewright calibrate``: measured
runs in the store (the local SQLite file by default, or ``--database-url``) and fitting a hardware
profile to them. The database is migrated and the bundled profiles loaded first, as
``stagewright profiles load`` does. All of them use the SQL store: the ``service`` extra."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cli.extras import needs_extra
from planner.errors import StagewrightError

if TYPE_CHECKING:  # the CLI loads SQLAlchemy only for the commands that use the store
    from sqlalchemy.orm import Session

    from api.store.models import MeasuredRunRecord

__all__ = ["add_measurement_commands"]

_SQL_INT_MAX = 2**63 - 1
_DATABASE_HELP = "default: STAGEWRIGHT_DATABASE_URL, else sqlite:///stagewright.db"


def add_measurement_commands(commands: Any) -> None:
    measurements = commands.add_parser(
        "measurements",
        help="store and list measured runs (the data calibration fits to)",
        description="Measured runs: step times / MFU / peak memory of whole steps, or "
        "single-pass times, of a model, cluster and configuration.",
    )
    actions = measurements.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = actions.add_parser(
        "add",
        help="store the runs of CSV or JSON files (all of them or none)",
        description="Store every run of each FILE (.csv: one run per row, columns named by "
        "field path such as config.t or measured.step_time_s; otherwise JSON: a list of runs "
        'or {"runs": [...]}). The files are stored together or not at all: a file with any '
        "bad row stores nothing, nor do the files given with it, and the error names every "
        "bad file, row and column. Identical runs are stored once.",
    )
    add.add_argument(
        "files", metavar="FILE", nargs="+", type=Path, help="a .csv or JSON file of runs"
    )
    add.add_argument("--database-url", default=None, metavar="URL", help=_DATABASE_HELP)
    add.set_defaults(handler=_add)

    listing = actions.add_parser(
        "list",
        help="list stored runs",
        description="List the runs in use (with --withdrawn: the withdrawn ones), oldest first.",
    )
    listing.add_argument("--gpu", default=None, help="only this hardware profile's runs")
    listing.add_argument("--model", default=None, help="only runs of this model name")
    listing.add_argument("--source", default=None, help="only runs whose source contains this")
    listing.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    listing.add_argument("--offset", type=int, default=0, help="skip this many first")
    listing.add_argument(
        "--withdrawn",
        action="store_true",
        help="list the withdrawn runs (with when and why) instead of those in use",
    )
    form = listing.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="print the runs as JSON")
    form.add_argument("--csv", action="store_true", help="print the runs as CSV (re-addable)")
    listing.add_argument("--database-url", default=None, metavar="URL", help=_DATABASE_HELP)
    listing.set_defaults(handler=_list)

    show = actions.add_parser(
        "show",
        help="show one stored run, in use or withdrawn",
        description="Show the run with this id (from `measurements list` or a calibration's "
        "report), whether in use or withdrawn (then with when and why): its line of "
        "`measurements list` with the whole source, or with --json its entry of "
        "`measurements list --json`.",
    )
    show.add_argument("id", metavar="ID", type=int, help="the run's id")
    show.add_argument("--json", action="store_true", help="print the run as JSON")
    show.add_argument("--database-url", default=None, metavar="URL", help=_DATABASE_HELP)
    show.set_defaults(handler=_show)

    withdraw = actions.add_parser(
        "withdraw",
        help="withdraw a run: kept, but left out of lists and calibration",
        description="Withdraw the run with this id (from `measurements list`): it stays "
        "stored, since calibrations name the runs they used, but lists leave it out and "
        "calibrate no longer fits it. `measurements list --withdrawn` shows it with when and "
        "why. Withdrawing it again changes nothing. Adding the identical run again "
        "(`measurements add`) puts it back in use; loading the bundled profiles does not.",
    )
    withdraw.add_argument("id", metavar="ID", type=int, help="the run's id")
    withdraw.add_argument("--reason", default=None, metavar="TEXT", help="why (kept with the run)")
    withdraw.add_argument("--database-url", default=None, metavar="URL", help=_DATABASE_HELP)
    withdraw.set_defaults(handler=_withdraw)

    calibrate = commands.add_parser(
        "calibrate",
        help="fit a hardware profile's cost-model parameters to its measured runs",
        description="Fit the hardware profile's free parameters (planner/costmodel/"
        "parameters.py) to its stored measured runs by bounded least squares on "
        "ln(predicted / measured), and store the result as the profile's next revision with "
        "the fit's error and the runs used. Parameters no run informs are left as they are. "
        "Measurements the fitted model misses by more than 3 robust standard deviations of "
        "its errors are left out of the fit and listed (--keep-outliers fits them too). "
        "With --model or --source only matching runs are fitted and the rest are reported "
        "as held out (before and after).",
    )
    calibrate.add_argument("--hardware", required=True, help="the hardware profile to fit")
    calibrate.add_argument(
        "--parameter",
        action="append",
        default=None,
        metavar="NAME",
        help="fit only this parameter (repeatable; default: every registered one)",
    )
    calibrate.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME",
        help="fit only runs of this model (repeatable)",
    )
    calibrate.add_argument(
        "--source", default=None, help="fit only runs whose source contains this"
    )
    calibrate.add_argument(
        "--dry-run", action="store_true", help="print the fit without storing it"
    )
    calibrate.add_argument(
        "--keep-outliers",
        action="store_true",
        help="fit every measurement, those the model misses far more than the rest too",
    )
    calibrate.add_argument("--json", action="store_true", help="print the fit as JSON")
    calibrate.add_argument("--database-url", default=None, metavar="URL", help=_DATABASE_HELP)
    calibrate.set_defaults(handler=_calibrate)


@contextmanager
def _session(database_url: str | None) -> Iterator[tuple[Session, str]]:
    """A session on the prepared store (migrated, bundled profiles loaded) and its name."""
    with needs_extra("service", "the SQL store"):
        from api.core.config import Settings
        from api.core.db import Database, describe_url, reported_failures
        from api.service import prepare_database

    settings = Settings.from_env(database_url=database_url)
    prepare_database(settings)
    database = Database(settings.database_url)
    try:
        with reported_failures(database.url), database.session() as session:
            yield session, describe_url(database.url)
    finally:
        database.dispose()


def _add(args: argparse.Namespace) -> int:
    """Store the runs of every file in one transaction: all of them, or, if any file cannot
    be read or has a problem, none, the error naming every such file (and its rows and
    columns) and the files not stored with them."""
    with needs_extra("service", "the SQL store"):
        from api.store.measured_runs import RunsRefusedError, add_runs
    from planner.measurement_files import ParsedRun, parse_runs

    parsed: list[tuple[Path, list[ParsedRun]]] = []
    refused: dict[Path, StagewrightError] = {}
    for path in args.files:  # every file read before the store is opened
        try:
            parsed.append((path, parse_runs(_read(path), str(path))))
        except StagewrightError as exc:
            refused[path] = exc
    if refused:
        raise StagewrightError(_none_stored(args.files, refused))
    with _session(args.database_url) as (session, where):
        reports = []
        for path, runs in parsed:
            try:
                reports.append(add_runs(session=session, runs=runs, origin="cli", name=str(path)))
            except RunsRefusedError as exc:  # nothing of it written; the others are checked
                refused[path] = exc
        if refused:
            session.rollback()
            raise StagewrightError(_none_stored(args.files, refused))
        session.commit()  # all the files, one transaction
    for (path, _), report in zip(parsed, reports, strict=True):
        # A run the file gives twice has its id twice: its second copy was not in the
        # store before the file, it is the same run.
        repeated = len(report.ids) - len(set(report.ids))
        again = f", {repeated} repeated in the file (stored once)" if repeated else ""
        restored = (
            f", {report.restored} restored (withdrawn before, in use again)"
            if report.restored
            else ""
        )
        sys.stdout.write(
            f"{path}: {report.created} run(s) stored, {report.unchanged - repeated} already "
            f"stored{restored}{again} (in {where})\n"
        )
    return 0


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise StagewrightError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise StagewrightError(f"{path} is not UTF-8 text (byte {exc.start})") from None


def _none_stored(files: list[Path], refused: dict[Path, StagewrightError]) -> str:
    """Why nothing was stored: the problems of each refused file, and, when other files
    were given with them, that those were not stored either."""
    from planner.measurement_files import MeasurementFileError, list_problems

    if len(files) == 1:
        (problem,) = refused.values()
        return str(problem)  # '<file>: nothing stored, ...' or a problem of the whole file
    parts = [
        f"{path}: {list_problems(exc.problems)}"
        if isinstance(exc, MeasurementFileError) and exc.problems
        else str(exc)
        for path, exc in refused.items()
    ]
    others = list(dict.fromkeys(str(path) for path in files if path not in refused))
    either = (
        f"; {', '.join(others)} {'was' if len(others) == 1 else 'were'} not stored either"
        if others
        else ""
    )
    return (
        "no file was stored (the files of one `measurements add` are stored together or not "
        f"at all{either}): " + "; ".join(parts)
    )


def _list(args: argparse.Namespace) -> int:
    with needs_extra("service", "the SQL store"):
        from api.store.measured_runs import count_runs, list_runs, stored_gpus
    from planner.measurement_files import CSV_COLUMNS, run_to_csv_row
    from planner.measurements import MeasuredRun

    if args.limit < 1 or args.offset < 0:
        raise StagewrightError("--limit must be at least 1 and --offset at least 0")
    filters = {"gpu": args.gpu, "model": args.model, "source": args.source}
    state = {"withdrawn": args.withdrawn}
    # SQL takes 64-bit integers: a larger --limit or --offset means the same as this one.
    limit, offset = min(args.limit, _SQL_INT_MAX), min(args.offset, _SQL_INT_MAX)
    with _session(args.database_url) as (session, _):
        rows = list_runs(session=session, **filters, **state, limit=limit, offset=offset)
        total = count_runs(session=session, **filters, **state)
        # A --gpu naming hardware without runs (a typo, a profile name never measured) lists
        # nothing; say which hardware has runs (and where this one's went, if withdrawn).
        if total == 0 and args.gpu:
            gpus = stored_gpus(session=session, **state)
            if args.gpu not in gpus:
                withdrawn = not args.withdrawn and args.gpu in stored_gpus(
                    session=session, withdrawn=True
                )
                note = _no_runs_of(args.gpu, gpus, args.withdrawn, withdrawn)
                sys.stderr.write(f"stagewright measurements list: note: {note}\n")
    left_out = total - len(rows)
    if (args.json or args.csv) and left_out > 0 and rows:
        # The text listing says so in its first line; an export must not look complete.
        sys.stderr.write(
            f"stagewright measurements list: {len(rows)} of {total} run(s) written "
            f"(from {args.offset}); --limit {total}{' --offset 0' if args.offset else ''} "
            "writes them all\n"
        )
    if args.json:
        items = [_json_item(r) for r in rows]
        sys.stdout.write(json.dumps({"total": total, "runs": items}, indent=1) + "\n")
        return 0
    if args.csv:
        writer = csv.DictWriter(sys.stdout, CSV_COLUMNS, lineterminator="\n")
        writer.writeheader()
        for r in rows:
            writer.writerow(run_to_csv_row(MeasuredRun.model_validate(r.run)))
        return 0
    which = "withdrawn run(s)" if args.withdrawn else "run(s)"
    lines = [f"{total} {which}; showing {len(rows)} from {args.offset}"]
    for r in rows:
        lines += _lines(r, source_chars=60)
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def _no_runs_of(gpu: str, gpus: list[str], listing_withdrawn: bool, withdrawn: bool) -> str:
    """That no run (in use, or withdrawn when ``listing_withdrawn``) is of ``gpu``, which
    hardware (``gpus``) has such runs, or that none has, and, when ``withdrawn``, that
    ``gpu``'s runs are withdrawn."""
    run, runs = ("withdrawn run", "withdrawn runs") if listing_withdrawn else ("run", "runs")
    use = "" if listing_withdrawn else " in use"
    others = (
        f"the {runs}{use} are of {', '.join(repr(name) for name in gpus)}"
        if gpus
        else f"there are no {runs}{use} at all"
    )
    tail = f"; {gpu!r} has withdrawn runs, which --withdrawn lists" if withdrawn else ""
    return f"no {run}{use} is of --gpu {gpu!r}; {others}{tail}"


def _show(args: argparse.Namespace) -> int:
    with needs_extra("service", "the SQL store"):
        from api.store.measured_runs import get_run

    with _session(args.database_url) as (session, where):
        r = get_run(session=session, run_id=args.id)
        if r is None:
            raise StagewrightError(f"no measured run has id {args.id} in {where}; {_IDS_HINT}")
        if args.json:
            sys.stdout.write(json.dumps(_json_item(r), indent=1) + "\n")
        else:
            sys.stdout.write("\n".join(_lines(r, source_chars=None)) + "\n")
    return 0


# Where a person finds the id of a run (said when an id names none).
_IDS_HINT = (
    "`stagewright measurements list` shows the ids of the runs in use (--withdrawn: of the "
    "withdrawn ones)"
)


def _json_item(r: MeasuredRunRecord) -> dict[str, Any]:
    """A run as `list --json` writes it: its id and origin, the run, its withdrawal."""
    return {
        "id": r.id,
        "origin": r.origin,
        **r.run,
        "withdrawn_at": None if r.withdrawn_at is None else r.withdrawn_at.isoformat(),
        "withdrawn_reason": r.withdrawn_reason,
    }


def _lines(r: MeasuredRunRecord, source_chars: int | None) -> list[str]:
    """A run's line of the text listing (its source cut to ``source_chars``), and a second
    saying when and why it was withdrawn, if it was."""
    what = (
        f"step {r.step_time_s:.4g} s"
        if r.step_time_s is not None
        else f"MFU {r.mfu:.2%}"
        if r.mfu is not None
        else "peak memory"
        if r.kind == "step"
        else f"pass of {r.pass_layers} layer(s): F {_ms(r.forward_ms)} "
        f"B {_ms(r.backward_ms)} W {_ms(r.weight_ms)} ms"
    )
    lines = [
        f"{r.id:>5} {r.gpu:<14} {r.model_name:<12} t{r.t} p{r.p} d{r.d} mb{r.micro_batch_size} "
        f"{r.recompute:<9} {r.schedule:<8} {what}  [{r.source[:source_chars]}]"
    ]
    if r.withdrawn_at is not None:
        lines.append(f"{'':>6}{_withdrawn(r.withdrawn_at, r.withdrawn_reason)}")
    return lines


def _withdrawn(when: datetime, reason: str | None) -> str:
    return f"withdrawn {when:%Y-%m-%d %H:%M:%S} UTC: " + (
        "no reason given" if reason is None else reason
    )


def _withdraw(args: argparse.Namespace) -> int:
    with needs_extra("service", "the SQL store"):
        from api.store.measured_runs import UnknownRunError, reason_problem, withdraw_run

    problem = reason_problem(args.reason)
    if problem is not None:  # before the store is opened (and migrated)
        raise StagewrightError(f"--reason {problem}")
    with _session(args.database_url) as (session, where):
        try:
            report = withdraw_run(session=session, run_id=args.id, reason=args.reason)
        except UnknownRunError:
            raise StagewrightError(
                f"no measured run has id {args.id} in {where}; {_IDS_HINT}"
            ) from None
        session.commit()
        r = report.run
        assert r.withdrawn_at is not None
        what = (
            f"{r.model_name} on {r.gpu} t{r.t} p{r.p} d{r.d} mb{r.micro_batch_size} "
            f"{r.recompute} {r.schedule} [{r.source[:60]}]"
        )
        withdrawn = _withdrawn(r.withdrawn_at, r.withdrawn_reason)
        if report.already:
            sys.stdout.write(
                f"measured run {r.id} ({what}) was already {withdrawn}; nothing changed "
                f"(in {where})\n"
            )
        else:
            sys.stdout.write(
                f"measured run {r.id} ({what}) {withdrawn}; calibrate leaves it out, "
                "`stagewright measurements list --withdrawn` shows it and adding the same run "
                f"again restores it (in {where})\n"
            )
    return 0


def _ms(value: float | None) -> str:
    """A pass time as measured, to four significant figures (the stored value is exact)."""
    return "-" if value is None else f"{value:.4g}"


def _calibrate(args: argparse.Namespace) -> int:
    with needs_extra("service", "the SQL store"):
        from api.calibration import calibrate
    from cli.calibration_report import calibration_json, calibration_text

    with _session(args.database_url) as (session, where):
        outcome = calibrate(
            session=session,
            hardware=args.hardware,
            parameters=args.parameter,
            models=args.model,
            source=args.source,
            dry_run=args.dry_run,
            exclude_outliers=not args.keep_outliers,
        )
    if args.json:
        sys.stdout.write(json.dumps(calibration_json(outcome), indent=1) + "\n")
    else:
        sys.stdout.write(calibration_text(outcome, where) + "\n")
    return 0
