"""``stagewright regress BASELINE.json [--tolerance PCT] [--update]``."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from cli.extras import needs_extra
from cli.regress import Outcome, check_baseline, load_baseline, update_baseline
from cli.tables import Cell, Column, print_fitted
from planner.errors import StagewrightError
from planner.profiles import ProfileStore

__all__ = ["add_regress_command"]


def add_regress_command(commands: Any) -> None:
    regress = commands.add_parser(
        "regress",
        help="CI cost-regression check: re-plan the baseline's scenarios",
        description=(
            "Re-plan every scenario recorded in BASELINE.json and exit 1 when predicted "
            "throughput drops beyond the tolerance, the same best configuration's predicted "
            "peak memory rises beyond it, a scenario becomes infeasible, or the best "
            "configuration changes (unless the scenario allows it). --update rewrites the "
            "baseline with today's answers."
        ),
    )
    regress.add_argument(
        "baseline", metavar="BASELINE.json", type=Path, help="the recorded scenarios and answers"
    )
    regress.add_argument(
        "--tolerance",
        type=float,
        default=None,
        metavar="PCT",
        help="allowed throughput drop and peak-memory rise in percent, for every scenario "
        "(default: the baseline's own, else 1)",
    )
    regress.add_argument(
        "--update", action="store_true", help="rewrite the baseline with today's answers"
    )
    regress.add_argument("--json", action="store_true", help="print the comparison as JSON")
    regress.add_argument(
        "--database-url",
        default=None,
        metavar="URL",
        help="plan with the profiles of this store (e.g. after `stagewright calibrate`) "
        "instead of the bundled ones; record and check a baseline with the same profiles",
    )
    regress.set_defaults(handler=_regress)


def _regress(args: argparse.Namespace) -> int:
    if args.tolerance is not None and not 0 <= args.tolerance < 100:
        raise StagewrightError("--tolerance is a percentage between 0 and 100")
    if args.update and (args.tolerance is not None or args.json):
        ignored, hint = (
            ("--tolerance", " (a baseline keeps its own in tolerance_pct)")
            if args.tolerance is not None
            else ("--json", "")
        )
        raise StagewrightError(
            f"--update rewrites the baseline and compares nothing, so {ignored} would be "
            f"ignored; leave out {ignored}{hint}"
        )
    data = load_baseline(args.baseline, updating=args.update)
    if args.database_url is None:
        return _compare_or_update(args, data, None)
    with needs_extra("service", "regress --database-url"):
        from api.store.profiles_io import stored_profiles

    with stored_profiles(args.database_url) as store:
        return _compare_or_update(args, data, store)


def _compare_or_update(
    args: argparse.Namespace, data: dict[str, Any], store: ProfileStore | None
) -> int:
    if args.update:
        updated = update_baseline(data, store)
        _replace(args.baseline, json.dumps(updated, indent=2) + "\n")
        sys.stdout.write(f"updated {args.baseline}: {len(updated['scenarios'])} scenarios\n")
        unfit = [s["name"] for s in updated["scenarios"] if "expected" not in s]
        if unfit:  # recorded without an answer, so every check will fail on them
            sys.stderr.write(
                f"stagewright regress: nothing fits in {', '.join(map(repr, unfit))}, so no "
                "answer is recorded and the check fails until it fits again; change or "
                "remove the scenario (stagewright plan --all says why each candidate was "
                "rejected)\n"
            )
        return 0
    outcomes = check_baseline(data, args.tolerance, store)
    failed = [o for o in outcomes if o.failed]
    if args.json:
        sys.stdout.write(
            json.dumps(
                {"failed": len(failed), "scenarios": [o.__dict__ for o in outcomes]}, indent=2
            )
            + "\n"
        )
        return 1 if failed else 0
    title = f"cost regression check: {args.baseline.name} (baseline -> now)"
    _print_table(Console(), title, outcomes)
    unrecorded = sum(o.status == "new" for o in outcomes)
    # Nothing fits and nothing was recorded: no regression, and --update cannot record one.
    never_fit = sum(o.status == "infeasible" and o.baseline_samples_per_s is None for o in outcomes)
    regressed = len(failed) - unrecorded - never_fit
    parts = []
    if regressed:
        parts.append(f"{regressed} of {len(outcomes)} scenarios regressed")
    if unrecorded:
        parts.append(f"{unrecorded} of {len(outcomes)} without a recorded answer (--update)")
    if never_fit:
        parts.append(f"{never_fit} of {len(outcomes)} fit nothing and have no recorded answer")
    verdict = "; ".join(parts) or f"all {len(outcomes)} scenarios within tolerance"
    sys.stdout.write(verdict + "\n")
    return 1 if failed else 0


# The table's columns (samples/s, peak GiB and a changed configuration as baseline -> now;
# throughput as the change in percent), and those left out (first to last) when the whole
# values do not fit the terminal: the change that samples/s shows, then the note (printed
# under the table where it says more than the numbers), then the configuration.
_COLUMNS = (
    Column("scenario", "left", wraps=True),
    Column("status", "left"),
    Column("samples/s"),
    Column("throughput"),
    Column("peak GiB"),
    Column("best config (t/p/d/mb/recompute/schedule)", "left"),
    Column("note", "left", wraps=True),
)
_DROP_ORDER = ("throughput", "note", "best config (t/p/d/mb/recompute/schedule)")


def _print_table(console: Console, title: str, outcomes: list[Outcome]) -> None:
    """Every outcome as a row of whole values within the console's width (the terminal's,
    COLUMNS when not a terminal): columns that do not fit are left out, as in plan's
    tables, and said. A note left out is printed under the table for every scenario that
    failed, improved or changed its configuration, so a failure's reason (and an allowed
    change) is never lost."""
    rows: list[list[Cell]] = []
    for o in outcomes:
        configs = (
            _config_text(o.baseline_config)
            if o.config == o.baseline_config
            else f"{_config_text(o.baseline_config)} -> {_config_text(o.config)}"
        )
        rows.append(
            [
                Text(o.name),  # Text: a name or note is shown as written, never as markup
                Text(o.status, style="red" if o.failed else "green"),
                f"{_number(o.baseline_samples_per_s, 3)} -> {_number(o.samples_per_s, 3)}",
                f"{o.change_pct:+.2f}%" if o.change_pct is not None else "-",
                f"{_number(o.baseline_peak_gib, 2)} -> {_number(o.peak_gib, 2)}",
                configs,
                Text(o.message),
            ]
        )
    dropped = print_fitted(console, title, _COLUMNS, rows, _DROP_ORDER)
    if "note" in dropped:
        for o in outcomes:
            if o.status != "ok" or o.config != o.baseline_config:
                console.print(
                    f"  {o.name}: {o.message}", highlight=False, markup=False, soft_wrap=True
                )


def _number(value: float | None, decimals: int) -> str:
    return "-" if value is None else f"{value:.{decimals}f}"


def _config_text(c: dict[str, Any] | None) -> str:
    """A recorded configuration as t/p/d/mb/recompute/schedule, then cp and chunks per
    device where the record has them; "-" for none."""
    if not c:
        return "-"
    return (
        "/".join(str(c[k]) for k in ("t", "p", "d", "micro_batch_size", "recompute", "schedule"))
        + (f" cp {c['cp']}" if c.get("cp", 1) > 1 else "")
        + (f" v {c['num_chunks']}" if "num_chunks" in c else "")
    )


def _replace(path: Path, text: str) -> None:
    """Write ``text`` over ``path`` whole or not at all: a write that fails (a read-only
    file or folder, a full disk) leaves the old baseline as it was."""
    path = path.resolve()  # a link to the baseline keeps pointing at it
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(text, encoding="utf-8")
        if path.exists():
            shutil.copymode(path, temporary)
        temporary.replace(path)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise StagewrightError(
            f"cannot rewrite {path} ({exc.strerror}); nothing was changed: make the file and "
            "its folder writable"
        ) from None
