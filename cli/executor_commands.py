"""``stagewright run`` and ``stagewright profile``: the executor's commands.

Kept apart from the planner's commands so that torch is imported only when one of them runs
(the ``executor`` extra), and the SQL store only for ``--record`` and ``--database-url`` (the
``service`` extra).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from cli.extras import needs_extra, require_installed
from planner.errors import StagewrightError, validation_problems
from planner.json_input import loads
from planner.profiles import BUNDLED_PROFILES
from planner.specs import ModelSpec

__all__ = ["add_executor_commands"]


def add_executor_commands(commands: Any) -> None:
    run = commands.add_parser(
        "run",
        help="run a plan's executor config under torchrun on this machine",
        description=(
            "Launch CONFIG.json (a candidate's executor config, as stagewright plan --emit "
            "writes it) with one process per rank (gloo on CPU, nccl on GPUs) and print the "
            "measured step time and each rank's saved activations next to the planner's "
            "prediction."
        ),
    )
    run.add_argument(
        "config",
        metavar="CONFIG.json",
        type=Path,
        help="a candidate's executor-config.json (not the plan request)",
    )
    run.add_argument(
        "--nproc",
        type=int,
        default=None,
        help="ranks to start (must equal t x p x d of the config)",
    )
    run.add_argument("--steps", type=int, default=3, help="optimizer steps (default 3)")
    run.add_argument(
        "--verify",
        action="store_true",
        help="compare with a single-process reference computing in the run's precision "
        "(same model, seed and batches, no parallelism); exit 1 on any mismatch, naming "
        "rank, stage and tensor",
    )
    run.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for run-report.json (default: a new temporary folder)",
    )
    run.add_argument("--json", action="store_true", help="print the per-rank report as JSON")
    run.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds a rank waits for a silent peer before stopping (default 60)",
    )
    run.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=None,
        help="save and resume torch.distributed.checkpoint checkpoints here",
    )
    run.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        help="steps between checkpoints (with --checkpoint-dir; default 1)",
    )
    run.add_argument("--lr", type=float, default=None, help="learning rate (default 1e-3)")
    run.add_argument(
        "--database-url", default=None, metavar="URL", help="the store --record writes to"
    )
    _add_record_option(run, "the run's step time (at least 2 steps)")
    run.set_defaults(handler=_run)

    profile = commands.add_parser(
        "profile",
        help="measure a layer's F, B, W times and saved bytes on this device and store them",
        description=(
            "Time one transformer layer of the model in MODEL.json (a plan request or its "
            "'model' object) at the given micro-batch size and tensor-parallel degree, count "
            "its saved activations, and add the point to the profiles the planner reads."
        ),
    )
    profile.add_argument(
        "model", metavar="MODEL.json", type=Path, help="a plan request or its 'model' object"
    )
    profile.add_argument(
        "--micro-batch-size",
        type=int,
        default=1,
        help="samples in the micro-batch the layer is timed on (default 1)",
    )
    profile.add_argument(
        "--t",
        type=int,
        default=1,
        help="tensor-parallel degree: time one rank's 1/t shard of the layer, without the "
        "tensor-parallel communication (default 1)",
    )
    profile.add_argument(
        "--gpu",
        default="cpu",
        help="hardware profile name (default cpu); the layer is timed on this machine's CPU, "
        "so only the cpu profile is accepted",
    )
    profile.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="timed repetitions, after 2 warm-up ones; each time stored is their median "
        "(default 5)",
    )
    profile.add_argument(
        "--precision", choices=["fp32", "bf16", "fp16"], default="fp32", help="default fp32"
    )
    profile.add_argument(
        "--recompute", choices=["none", "selective", "full"], default="none", help="default none"
    )
    profile.add_argument(
        "--out",
        type=Path,
        default=None,
        help="profile folder to write (default: the first folder of STAGEWRIGHT_PROFILES)",
    )
    profile.add_argument(
        "--database-url", default=None, help="store the point in the service's SQL store instead"
    )
    profile.add_argument("--json", action="store_true", help="print the point as JSON")
    _add_record_option(profile, "the layer's F, B and W times, as a pass of one layer")
    profile.set_defaults(handler=_profile)


def _add_record_option(parser: Any, what: str) -> None:
    parser.add_argument(
        "--record",
        action="store_true",
        help=f"also store {what} as a measured run, for stagewright calibrate (in "
        "--database-url, else STAGEWRIGHT_DATABASE_URL, else sqlite:///stagewright.db)",
    )


def _run(args: argparse.Namespace) -> int:
    # Options that only act with another: given without it, they would be ignored (the run's
    # own options are checked by executor.launcher.run, as the worker checks them).
    if args.database_url is not None and not args.record:
        raise StagewrightError(
            "--database-url is the store --record writes to, and nothing is recorded without "
            "--record; add --record or leave --database-url out"
        )
    # The launcher itself is torch-free: torch runs in the ranks it starts.
    require_installed("executor", "the executor", "torch")
    from executor.launcher import RunInterrupted, run
    from executor.reporting import REPORT_FILE, describe

    if args.record:  # say so before the run rather than after it
        require_installed("service", "--record (the SQL store)", "sqlalchemy")
    if args.record and args.steps < 2:
        raise StagewrightError(
            "--record needs at least 2 steps (--steps 2): the first includes start-up, so a "
            "run of one step has no step time to record"
        )
    if args.record:
        _require_a_core_per_rank(args.config)
    try:
        outcome = run(
            args.config,
            nproc=args.nproc,
            steps=args.steps,
            verify=args.verify,
            timeout_s=args.timeout,
            checkpoint_dir=args.checkpoint_dir,
            checkpoint_every=(
                1
                if args.checkpoint_every is None and args.checkpoint_dir is not None
                else args.checkpoint_every
            ),
            lr=args.lr,
            out_dir=args.out,
        )
    except RunInterrupted as exc:  # one line, no traceback; the shell's status for the signal
        sys.stderr.write(f"stagewright run: {exc}\n")
        return 128 + exc.signum
    recorded = _record_run(args, outcome) if args.record and outcome.verified else None
    if args.record and not outcome.verified:
        sys.stderr.write("stagewright run: not recorded: the run failed verification\n")
    report = (outcome.out_dir / REPORT_FILE).resolve()
    if args.json:  # stdout is the report itself; where the file is goes to stderr
        sys.stdout.write(outcome.report.model_dump_json(indent=2) + "\n")
        sys.stderr.write(f"stagewright run: report: {report}\n")
    else:
        sys.stdout.write(describe(outcome.report) + "\n")
        sys.stdout.write(f"report: {report}\n")
        if recorded is not None:
            sys.stdout.write(f"recorded in {recorded}\n")
    if not outcome.verified:
        sys.stderr.write("stagewright run: verification failed (see the mismatches above)\n")
        return 1
    return 0


def _require_a_core_per_rank(config_path: Path) -> None:
    """On CPU, refuse to record a run whose ranks outnumber the CPUs this process may use:
    the ``cpu`` profile prices a device as one core (each rank runs one thread, and
    ``stagewright profile`` times one thread), so the step time of ranks taking turns on
    shared cores measures their contention, and calibrate would fit it as the device's
    speed. On GPUs each rank has its own device."""
    import torch

    from executor.inputs import read_config

    if torch.cuda.is_available():
        return
    ranks = read_config(config_path).world_size
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if cores is not None and ranks > cores:
        raise StagewrightError(
            f"--record on CPU needs a core per rank: this run's {ranks} ranks would share "
            f"{cores} CPU(s), so its step time would measure their turns, which calibrate "
            f"would fit as the cpu device's speed; record a plan for at most {cores} "
            "device(s), or run without --record"
        )


def _record_run(args: argparse.Namespace, outcome: Any) -> str:
    """Store the run as a measured run on the hardware it ran on: 'cpu' without CUDA, else
    the hardware its plan was made for."""
    import datetime as dt

    import torch

    with needs_extra("service", "--record (the SQL store)"):
        from api.store.profiles_io import store_measured_run
    from executor.inputs import read_config
    from planner.measurements import run_from_report

    config = read_config(args.config)
    if torch.cuda.is_available():
        if config.predicted is None:
            raise StagewrightError(
                "--record on GPUs needs the hardware profile the run was planned for; this "
                "config has no prediction (use a candidate's config from stagewright plan)"
            )
        hardware = config.predicted.hardware
    else:
        hardware = "cpu"
    run = run_from_report(outcome.report, config, hardware, dt.date.today())
    return store_measured_run(args.database_url, run)


def _require_known_gpu(args: argparse.Namespace) -> None:
    """Checked before measuring: a point filed under a GPU that no hardware profile names is
    read by no plan (a store refused it only once the layer had been timed), and a recorded
    run needs that profile in its store too."""
    from planner.profiles import JsonProfileStore, UnknownHardwareError, extra_profile_dirs

    if args.database_url or args.record:
        with needs_extra("service", "the SQL store"):
            from api.store.profiles_io import stored_profiles

        with stored_profiles(args.database_url) as store:
            store.hardware(args.gpu)  # names the store's hardware and how to add one
    if args.database_url:
        return
    folders = [BUNDLED_PROFILES, *extra_profile_dirs(), *([args.out] if args.out else [])]
    try:
        JsonProfileStore.load(*folders).hardware(args.gpu)
    except UnknownHardwareError as exc:
        raise StagewrightError(
            f"--gpu: {exc}; a point filed under another name is read by no plan: name one "
            "of them, or add the hardware to hardware.json in the profile folder"
        ) from None


def _profile(args: argparse.Namespace) -> int:
    with needs_extra("executor", "profiling"):
        from executor.profiler import device_problem, profile_layer
    if args.database_url or args.record:  # say so before measuring rather than after
        require_installed("service", "the SQL store", "sqlalchemy")
    from planner.profiles import extra_profile_dirs, point_to_dict, save_point

    try:
        data = loads(args.model.read_text(encoding="utf-8"))
    except OSError as exc:
        raise StagewrightError(f"cannot read {args.model}: {exc.strerror}") from None
    except StagewrightError as exc:  # a key given twice, or nested too deep
        raise StagewrightError(f"{args.model}: {exc}") from None
    except ValueError as exc:  # JSON, or not UTF-8
        raise StagewrightError(f"{args.model} is not UTF-8 JSON: {exc}") from None
    spec = data.get("model", data) if isinstance(data, dict) else None
    try:
        model = ModelSpec.model_validate(spec)
    except ValidationError as exc:
        # Which field and why: "Input should be greater than or equal to 1" alone did not
        # say that num_layers was 0.
        raise StagewrightError(
            f"{args.model} needs a model with num_layers, hidden_size, num_attention_heads, "
            f"seq_length and vocab_size: {validation_problems(exc, 'model')}"
        ) from None
    if args.micro_batch_size < 1 or args.t < 1 or args.repeats < 1:
        raise StagewrightError("--micro-batch-size, --t and --repeats must be at least 1")
    if model.num_attention_heads % args.t or model.ffn % args.t:
        raise StagewrightError(f"--t {args.t} must divide the heads and the MLP size")
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        # Found before measuring: save_point's mkdir failed after the timing, a traceback.
        raise StagewrightError(
            f"--out {args.out}: that is a file, not a folder; name the profile folder to write"
        )
    _require_known_gpu(args)
    problem = device_problem(args.gpu)  # before the timing: it would be filed, then misused
    if problem is not None:
        raise StagewrightError(problem)
    point = profile_layer(
        model,
        args.micro_batch_size,
        args.t,
        gpu=args.gpu,
        repeats=args.repeats,
        precision=args.precision,
        recompute=args.recompute,
    )
    if args.database_url:
        with needs_extra("service", "profile --database-url"):
            from api.store.profiles_io import store_layer_point  # the service's SQL store

        where = store_layer_point(args.database_url, point)
    else:
        folder = args.out or next(iter(extra_profile_dirs()), None)
        if folder is None:
            raise StagewrightError(
                "say where to store the point: --out FOLDER, --database-url URL, or set "
                "STAGEWRIGHT_PROFILES to a folder the planner should read"
            )
        try:
            where = str(save_point(point, folder))
        except OSError as exc:
            raise StagewrightError(
                f"cannot write the point into {folder} ({exc.strerror}); choose a folder you "
                "can write with --out"
            ) from None
    if args.record:
        import datetime as dt

        with needs_extra("service", "--record (the SQL store)"):
            from api.store.profiles_io import store_measured_run
        from planner.measurements import run_from_layer_point

        measured = run_from_layer_point(point, model, dt.date.today())
        where += f"; recorded in {store_measured_run(args.database_url, measured)}"
    if args.json:
        sys.stdout.write(
            json.dumps({"stored_in": where, "point": point_to_dict(point)}, indent=2) + "\n"
        )
    else:
        sys.stdout.write(
            f"layer h={point.hidden_size} heads={point.num_attention_heads} "
            f"s={point.seq_length} mb={point.micro_batch_size} t={point.t} on {point.gpu}: "
            f"F {point.forward_ms:.3f} ms, B {point.backward_ms:.3f} ms, "
            f"W {point.weight_ms:.3f} ms, saved {point.activation_bytes:.0f} B "
            f"(+{point.first_stage_extra_bytes:.0f} B embedding, "
            f"+{point.last_stage_extra_bytes:.0f} B head); stored in {where}\n"
        )
    return 0
