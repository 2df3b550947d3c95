"""The ``stagewright`` command line.

Subcommands are thin: they parse arguments, call the planner, and print. Every error a
person can cause is reported as one line on stderr (exit status 2), never a traceback; output
piped into a reader that closes early ends the command quietly (exit status 141).
``plan``, ``simulate`` and ``regress`` need the planner only; the service (``api``) and the
executor (torch) are imported by the commands that use them (see ``cli.extras``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from pydantic import ValidationError
from rich.console import Console

from cli.executor_commands import add_executor_commands
from cli.extras import STORE_HINT, needs_extra
from cli.measurement_commands import add_measurement_commands
from cli.regress_command import add_regress_command
from cli.render import render_plan
from cli.render_timeline import counted, format_candidate_timeline
from planner.assemble import no_fit_summary
from planner.errors import StagewrightError, validation_problems
from planner.json_input import loads
from planner.launch.files import launch_files
from planner.plan import plan
from planner.profiles import UnknownHardwareError
from planner.schedules import (
    SCHEDULE_NAMES,
    PassTimes,
    format_timeline,
    generate,
    schedule_actions,
    schedule_family,
)
from planner.search.timeline import candidate_timeline
from planner.simulate import Durations, SimulationResult, simulate
from planner.specs import Plan, PlanRequest

__all__ = ["main"]

# ``stagewright simulate`` flags that set a schedule family's generator parameter.
_TIMELINE_WIDTH = 100  # columns of simulate's text timeline unless --width says otherwise

# What simulating one action holds at its peak (the IR's action, the engine's start and end
# times, the contract's JSON): 490-680 bytes measured over 1f1b, v-zb, bpipe, interleaved
# and 2bw at 3.4-8.5 million actions (peak resident size / actions), rounded up.
_BYTES_PER_ACTION = 700

_PARAMETER_FLAGS = {
    "chunks": "num_chunks",
    "batches": "num_batches",
    "memory_limit": "memory_limit",
}


def _times(text: str) -> float | list[float]:
    """A duration: one number for every stage, or a comma-separated list, one per stage."""
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number or a comma-separated list of numbers (e.g. 1.0 or 1,1,1.2,1)"
        ) from None
    return values[0] if len(values) == 1 else values


def _taking(parameter: str) -> str:
    """The schedules whose generator takes ``parameter``, from the registry."""
    return ", ".join(n for n in SCHEDULE_NAMES if schedule_family(n).has_parameter(parameter))


class _Parser(argparse.ArgumentParser):
    """Bad command-line arguments get one line, as every other bad input does: argparse's
    usage block above the error buried it (``--help`` still prints the usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        """As argparse's, but an argument no command knows is reported by the command it was
        given to (argparse leaves it to the top parser, whose help says nothing of it)."""
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            owner = getattr(parsed, "_parser", self)
            owner.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed


def _own_parsers(parser: argparse.ArgumentParser) -> None:
    """Let every (sub)command's namespace name its parser (the deepest one wins)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.set_defaults(_parser=sub)
                _own_parsers(sub)


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="stagewright",
        description="Plan, simulate and run pipeline-parallel training of large language models.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sim = commands.add_parser(
        "simulate",
        help="simulate one pipeline schedule and show its timeline",
        description=(
            "Generate a schedule and price it with the simulator. Times are per stage (per "
            "chunk for V schedules, which hold two stages a device); schedules without a B/W "
            "split run B+W as one backward."
        ),
    )
    sim.add_argument(
        "--schedule",
        required=True,
        choices=SCHEDULE_NAMES,
        metavar="NAME",
        help=f"the schedule to generate: {', '.join(SCHEDULE_NAMES)}",
    )
    sim.add_argument("--devices", required=True, type=int, help="pipeline devices (p or d)")
    sim.add_argument(
        "--microbatches",
        required=True,
        type=int,
        help="micro-batches per batch (per batch for 2bw)",
    )
    sim.add_argument("--f", required=True, type=_times, metavar="TF", help="forward time")
    sim.add_argument(
        "--b",
        required=True,
        type=_times,
        metavar="TB",
        help="backward-for-input time (the whole backward if --w is 0)",
    )
    sim.add_argument(
        "--w", type=_times, default=None, metavar="TW", help="backward-for-weights time (default 0)"
    )
    sim.add_argument(
        "--comm",
        type=float,
        default=0.0,
        metavar="C",
        help="point-to-point time added to every edge between two devices",
    )
    sim.add_argument(
        "--transfer", type=float, default=None, help="time of one BPipe EVICT or LOAD (default 0)"
    )
    sim.add_argument(
        "--no-overlap",
        action="store_true",
        help="BPipe transfers block the device instead of overlapping compute (needs "
        "--transfer above 0)",
    )
    sim.add_argument(
        "--chunks",
        type=int,
        default=None,
        help="stages per device, for the schedules that take num_chunks "
        f"({_taking('num_chunks')}; default 2)",
    )
    sim.add_argument(
        "--batches",
        type=int,
        default=None,
        help="batches run without a flush, for the schedules that take num_batches "
        f"({_taking('num_batches')}; default 2)",
    )
    sim.add_argument(
        "--memory-limit",
        type=float,
        default=None,
        metavar="X",
        help="activation memory limit as a fraction of 1F1B's peak, for schedules that take "
        "one (v-adaptive, zb-adaptive; zb-adaptive at 1 is ZB-1P, at 2 ZB-2P)",
    )
    sim.add_argument(
        "--plot",
        metavar="FILE",
        default=None,
        help="also write FILE (.svg or .png): bubble rate against memory limit of v-adaptive "
        "and zb-adaptive, with 1F1B as the reference, for these devices, micro-batches and "
        "times (taken as one V stage's; the one-stage schedules run two V stages' times)",
    )
    sim.add_argument(
        "--width",
        type=int,
        default=None,
        help=f"columns of the text timeline (default {_TIMELINE_WIDTH}; not with --json)",
    )
    sim.add_argument("--json", action="store_true", help="print the contract's JSON")
    sim.set_defaults(handler=_simulate)

    planner = commands.add_parser(
        "plan",
        help="search parallel configurations for a model, a cluster and a batch",
        description="Read a PlanRequest (JSON) and print the ranked, launchable plan.",
    )
    planner.add_argument("request", metavar="REQUEST.json", help="the plan request")
    planner.add_argument("--json", action="store_true", help="print the Plan as JSON")
    planner.add_argument(
        "--all",
        action="store_true",
        help="also list rejected candidates with their memory and reason",
    )
    planner.add_argument(
        "--timeline",
        action="store_true",
        help="also draw the best candidate's simulated schedule (each device over the step) "
        "with a legend",
    )
    planner.add_argument(
        "--database-url",
        default=None,
        metavar="URL",
        help="plan with the profiles of this store (e.g. after `stagewright calibrate`) "
        "instead of the bundled ones",
    )
    planner.add_argument(
        "--emit",
        metavar="DIR",
        type=Path,
        default=None,
        help="write each ranked candidate's launch artefacts into DIR (a new or empty folder): "
        "executor config, a torchrun script per node, Megatron-LM arguments, torch CSV",
    )
    planner.set_defaults(handler=_plan)

    serve = commands.add_parser(
        "serve",
        help="run the REST service (migrates the database and loads the bundled profiles)",
        description=(
            "Upgrade the database schema, load the bundled profiles (idempotent), then serve "
            "the REST API (OpenAPI at /docs). Settings come from STAGEWRIGHT_* variables; the "
            "options below override them."
        ),
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    serve.add_argument(
        "--database-url",
        default=None,
        metavar="URL",
        help="sqlite:///file.db or postgresql+psycopg://user:pw@host/db "
        "(default: STAGEWRIGHT_DATABASE_URL, else sqlite:///stagewright.db)",
    )
    serve.add_argument("--workers", type=int, default=1, help="server processes (default 1)")
    serve.set_defaults(handler=_serve)

    profiles = commands.add_parser(
        "profiles",
        help="manage the profiles in the database",
        description="Manage the hardware and layer profiles kept in the database.",
    )
    profile_commands = profiles.add_subparsers(dest="action", required=True, metavar="ACTION")
    load = profile_commands.add_parser(
        "load",
        help="load the bundled profiles/, and your profile folders, into the database",
        description=(
            "Upgrade the schema and load the bundled hardware, link and layer profiles; then "
            "each FOLDER given (hardware.json and layers/*.json, as `stagewright profile "
            "--out` writes them) as your own profiles, as POST /v1/hardware and POST "
            "/v1/profiles store them. Loading twice changes nothing; your profiles are kept "
            "by later loads of the bundled ones."
        ),
    )
    load.add_argument(
        "folders",
        nargs="*",
        type=Path,
        metavar="FOLDER",
        help="a profile folder to load as your own (a hardware.json, a layers/ folder, or both)",
    )
    load.add_argument(
        "--database-url",
        default=None,
        metavar="URL",
        help="default: STAGEWRIGHT_DATABASE_URL, else sqlite:///stagewright.db",
    )
    load.set_defaults(handler=_profiles_load)
    add_executor_commands(commands)
    add_measurement_commands(commands)
    add_regress_command(commands)
    _own_parsers(parser)
    return parser


def _simulate(args: argparse.Namespace) -> int:
    if args.devices < 1 or args.microbatches < 1:
        raise StagewrightError("--devices and --microbatches must be at least 1")
    if args.width is not None and args.json:
        raise StagewrightError(
            "--width sets the text timeline's columns, which --json does not print; leave "
            "one of them out"
        )
    if args.width is None:
        args.width = _TIMELINE_WIDTH
    if args.width < 10:
        raise StagewrightError("--width must be at least 10 columns")
    given = {
        parameter: getattr(args, flag)
        for flag, parameter in _PARAMETER_FLAGS.items()
        if getattr(args, flag) is not None
    }
    family = schedule_family(args.schedule)
    for flag, parameter in _PARAMETER_FLAGS.items():
        if parameter in given and not family.has_parameter(parameter):
            takes = [_flag(f) for f, p in _PARAMETER_FLAGS.items() if family.has_parameter(p)]
            raise StagewrightError(
                f"{_flag(flag)} does not apply to {args.schedule}"
                + (f" (it takes {', '.join(takes)})" if takes else " (it takes no parameter)")
                + "; leave it out"
            )
    # --transfer 0 is the default and changes nothing; any other value would be ignored.
    moving = {"transfer": bool(args.transfer), "no_overlap": args.no_overlap}
    problem = family.transfer_problem([_flag(flag) for flag, given in moving.items() if given])
    if problem is None:  # a transfer of no time blocks nothing: --no-overlap needs one
        blocking = _flag("no_overlap") if args.no_overlap else None
        problem = family.blocking_problem(blocking, _flag("transfer"), args.transfer or 0.0)
    if problem is not None:
        raise StagewrightError(problem)
    no_w = args.w is None
    if no_w:
        args.w = 0.0
    if args.plot is not None:
        _check_plot(args)
    for flag, parameter in _PARAMETER_FLAGS.items():
        needed = [p for p in family.parameters if p.name == parameter and p.default is None]
        if needed and parameter not in given:
            raise StagewrightError(
                f"{args.schedule} needs {_flag(flag)}: {needed[0].description[0].lower()}"
                f"{needed[0].description[1:]}"
            )
    _check_memory(args, given)
    times = PassTimes(
        forward=_stage_times(args.f),
        backward=_stage_times(args.b),
        weight=_stage_times(args.w),
        comm=args.comm,
    )
    schedule = generate(
        args.schedule, args.devices, args.microbatches, check=False, times=times, **given
    )
    durations = Durations(
        forward=args.f,
        backward=args.b,
        weight=args.w,
        comm=args.comm,
        transfer=args.transfer or 0.0,
        overlap_transfers=not args.no_overlap,
    )
    result = simulate(schedule, durations)
    if family.split_backward and no_w:  # said once the input is known to be good
        sys.stderr.write(
            f"stagewright simulate: note: --w not given: {args.schedule} splits the backward "
            "and its W passes (weight gradients) take 0 here; give --w TW to time them\n"
        )
    if args.plot is not None:
        _plot(args, times)
    if args.json:
        sys.stdout.write(json.dumps(result.to_contract(), indent=2) + "\n")
    else:
        sys.stdout.write(_describe(result, args.width) + "\n")
    return 0


def _check_memory(args: argparse.Namespace, given: dict[str, float]) -> None:
    """Refuse a schedule this machine cannot hold before building it: a mistyped
    --microbatches 100000000 grew for minutes, to the kernel's out-of-memory kill."""
    actions = schedule_actions(args.schedule, args.devices, args.microbatches, **given)
    needed = actions * _BYTES_PER_ACTION
    available = _available_memory()
    if available is not None and needed > available:
        schedule = (
            f"{args.schedule} on {counted(args.devices, 'device')} with "
            f"{counted(args.microbatches, 'micro-batch')}"
        )
        raise StagewrightError(
            f"{schedule} is about {actions:,} actions: simulating it needs about "
            f"{needed / 2**30:.1f} GiB, more than the {available / 2**30:.1f} GiB this machine "
            "has available; lower --microbatches or --devices"
        )


def _available_memory() -> int | None:
    """Bytes the kernel says a new allocation can take without swapping (MemAvailable),
    or None where /proc/meminfo does not say (not Linux)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _check_plot(args: argparse.Namespace) -> None:
    """Refuse a --plot the sweep cannot draw, before anything is simulated."""
    if args.devices < 2:
        raise StagewrightError("--plot needs at least 2 devices (a V pipeline)")
    v_stages = 2 * args.devices
    for flag, value in (("--f", args.f), ("--b", args.b), ("--w", args.w)):
        if not isinstance(value, float | int) and len(value) != v_stages:
            # The sweep's schedules are V-shaped whatever --schedule is: a list must hold
            # their stages' times, which a one-stage-a-device schedule cannot take as well.
            raise StagewrightError(
                f"--plot sweeps V schedules, 2 stages a device: {flag} needs one time or "
                f"{v_stages} (one per V stage), got {len(value)}; give one number, or plot "
                "with a V schedule as --schedule"
            )


def _plot(args: argparse.Namespace, times: PassTimes) -> None:
    from cli.plots import write_sweep  # NumPy drawing loads only for a figure
    from planner.memory_sweep import memory_sweep

    write_sweep(memory_sweep(args.devices, args.microbatches, times), args.plot)
    sys.stderr.write(f"wrote {args.plot}\n")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _stage_times(value: float | list[float]) -> float | tuple[float, ...]:
    return value if isinstance(value, float | int) else tuple(value)


def _describe(result: SimulationResult, width: int) -> str:
    schedule = result.schedule
    lines = [
        f"schedule {schedule.name}: {counted(schedule.num_devices, 'device')}, "
        f"{counted(schedule.num_stages, 'stage')}, "
        f"{counted(schedule.total_microbatches, 'micro-batch')}"
        + (f" in {schedule.num_batches} batches" if schedule.num_batches > 1 else ""),
        f"makespan {result.makespan:.6g}   bubble fraction {result.bubble_fraction:.4f}",
        "",
        "device   start        end       busy   peak activations (x one micro-batch of the model)",
    ]
    for device, (stats, peak) in enumerate(
        zip(result.devices, result.peak_activation, strict=True)
    ):
        lines.append(
            f"{device:>6} {stats.start:>8.4g} {stats.end:>10.4g} {stats.busy:>10.4g}   {peak:.4f}"
        )
    lines += ["", format_timeline(schedule, result.start, result.end, result.makespan, width)]
    return "\n".join(lines)


def _read_request(path: str) -> PlanRequest:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise StagewrightError(f"cannot read {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise StagewrightError(
            f"{path} is not UTF-8 text (byte {exc.start}); save the request as UTF-8 JSON"
        ) from exc
    try:
        data = loads(text)
    except json.JSONDecodeError as exc:
        raise StagewrightError(
            f"{path} is not a valid plan request: it is not valid JSON (line {exc.lineno}, "
            f"column {exc.colno}: {exc.msg})"
        ) from None
    except StagewrightError as exc:  # a key given twice, or nested too deep
        raise StagewrightError(f"{path} is not a valid plan request: {exc}") from None
    try:
        return PlanRequest.model_validate(data)
    except ValidationError as exc:
        raise StagewrightError(
            f"{path} is not a valid plan request: {validation_problems(exc)}"
        ) from None


def _plan(args: argparse.Namespace) -> int:
    if args.timeline and args.json:
        raise StagewrightError(
            "--timeline draws the schedule in the terminal; leave out --json (GET "
            "/v1/plans/{id}/timeline gives it as JSON)"
        )
    request = _read_request(args.request)
    if args.emit is not None:
        _check_emit_folder(args.emit)
    timeline: dict[str, Any] | None = None
    if args.database_url is None:
        try:
            result = plan(request)
        except UnknownHardwareError as error:
            raise StagewrightError(f"{error}{STORE_HINT}") from None
        if args.timeline and result.best is not None:
            timeline = candidate_timeline(request, result.best.config)
    else:
        with needs_extra("service", "plan --database-url"):
            from api.store.profiles_io import stored_profiles

        with stored_profiles(args.database_url) as store:
            result = plan(request, store)
            if args.timeline and result.best is not None:
                timeline = candidate_timeline(request, result.best.config, store)
    if args.emit is not None:
        written = _emit(result, args.emit)
        sys.stderr.write(f"stagewright plan: wrote {written} files into {args.emit}\n")
    if args.json:
        data = result.model_dump(mode="json")
        if not args.all:
            data["rejected"] = []
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        if result.best is None:
            # stdout stays the plan alone (``best`` null, status 0: the plan was made); why
            # nothing fits goes where a person or a CI log sees it.
            more = "" if args.all else " (--all puts every rejection in the JSON)"
            sys.stderr.write(
                f"stagewright plan: {no_fit_summary(request, result.rejected)}{more}\n"
            )
        return 0
    console = Console()  # the terminal's width (COLUMNS when not a terminal)
    render_plan(console, result, show_rejected=args.all)
    if timeline is not None:
        drawing = format_candidate_timeline(timeline, console.width - 10)
        console.print(drawing, markup=False, highlight=False, overflow="ignore", crop=False)
    elif args.timeline:
        console.print("no candidate fits, so there is no schedule to draw")
    return 0 if result.best is not None else 1


def _check_emit_folder(folder: Path) -> None:
    """--emit writes into a new or empty folder, so that nothing there is overwritten."""
    if folder.exists() and not folder.is_dir():
        raise StagewrightError(
            f"--emit {folder}: that is a file, not a folder; name a new folder for the launch files"
        )
    if folder.exists() and any(folder.iterdir()):
        raise StagewrightError(
            f"--emit {folder}: the folder exists and is not empty; choose a new folder "
            f"(nothing is overwritten)"
        )
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StagewrightError(f"--emit {folder}: cannot create it ({exc.strerror})") from exc


def _emit(result: Plan, folder: Path) -> int:
    files = launch_files(result)
    try:
        for item in files:
            path = folder / item.path
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(item.content, encoding="utf-8")
            if item.executable:
                path.chmod(0o755)
    except OSError as exc:
        raise StagewrightError(f"--emit {folder}: cannot write ({exc.strerror})") from exc
    return len(files)


def _serve(args: argparse.Namespace) -> int:
    with needs_extra("service", "the service"):
        from api.service import serve  # the web stack loads only for the service

    return serve(
        host=args.host, port=args.port, database_url=args.database_url, workers=args.workers
    )


def _profiles_load(args: argparse.Namespace) -> int:
    with needs_extra("service", "the SQL store"):
        from api.service import load_profiles

    for folder in args.folders:  # checked before the store is touched
        if not folder.is_dir():
            raise StagewrightError(f"there is no folder {folder}; name a profile folder")
        if not (folder / "hardware.json").is_file() and not (folder / "layers").is_dir():
            raise StagewrightError(
                f"{folder} holds neither a hardware.json nor a layers/ folder: name a profile "
                "folder (as `stagewright profile --out` writes one)"
            )
    report, own = load_profiles(database_url=args.database_url, folders=args.folders)
    sys.stdout.write(
        f"profiles: {report.created} created, {report.updated} updated, "
        f"{report.unchanged} unchanged; measured runs: {report.runs_created} added, "
        f"{report.runs_unchanged} already stored"
        + (
            f" ({report.runs_withdrawn} of them withdrawn, kept out)"
            if report.runs_withdrawn
            else ""
        )
        + "\n"
    )
    if own is not None:
        sys.stdout.write(
            f"your profiles ({', '.join(map(str, args.folders))}): {own.created} created, "
            f"{own.updated} updated, {own.unchanged} unchanged\n"
        )
        for name, revision in own.uncalibrated:
            # The folder's entry replaces the profile as written; say what that drops.
            sys.stderr.write(
                f"warning: {name}: your folder's profile replaced revision {revision}, which "
                "was calibrated; plans now use the folder's parameters, not the fitted ones "
                f"(the fit is kept in the store's calibrations). Run `stagewright calibrate "
                f"--hardware {name}` to fit the new profile, or copy the fitted values into "
                "the folder's hardware.json 'parameters'\n"
            )
    return 0


# The exit status of a command whose reader closed the pipe early (`... | head -1`): the
# shell's for a process ended by SIGPIPE (128 + 13).
BROKEN_PIPE_STATUS = 141


def main(argv: Sequence[str] | None = None) -> int:
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)  # --help writes to stdout too
        _warn_of_unknown_variables(args.command)
        try:
            code: int = args.handler(args)
        except StagewrightError as exc:
            sys.stderr.write(f"stagewright {args.command}: error: {exc}\n")
            return 2
        sys.stdout.flush()  # a closed pipe shows here rather than at the interpreter's exit
    except BrokenPipeError:
        _discard_stdout()
        return BROKEN_PIPE_STATUS
    return code


def _warn_of_unknown_variables(command: str) -> None:
    """Say which ``STAGEWRIGHT_*`` variables name no setting. Every command reads some (the
    store's URL, the profile folders the planner reads, the service's limits), and a misspelt
    one would leave its setting at the default without a word."""
    from api.core.config import Settings  # pydantic only: installed with the planner too

    for line in Settings.unknown_variables():
        sys.stderr.write(f"stagewright {command}: warning: {line}\n")


def _discard_stdout() -> None:
    """Point standard output at the null device: the reader has gone, and the interpreter's
    last flush of what is still buffered would otherwise fail again and print a traceback."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a test's capture)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
