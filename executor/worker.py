"""Per-rank entry point under torchrun: ``python -m executor.worker CONFIG.json [options]``.

This is what the torchrun line of a plan runs. Everything a person can get wrong is checked
before any process group exists, each with one line on stderr and exit status 2: a config that
cannot be read or is not an executor config, one made for another number of ranks, an output
folder that cannot be written. Then the rank joins the process group (nccl when a GPU is
present, gloo otherwise) with a bounded timeout, resumes from the newest complete checkpoint
if asked, runs the steps, optionally verifies against the single-process reference, and rank
0 writes ``run-report.json`` (:mod:`planner.launch.report`) and prints it as a table.

A peer that dies or hangs surfaces here as an error or a timeout: the rank prints one line
(``rank N: stopped: ...``) and exits with status 1, so torchrun stops the job; no report is
written, and a checkpoint being written stays marked incomplete. Exit status 3 means the run
finished but ``--verify`` found a mismatch (the report names rank, stage and tensor). A rank
also ends when the torchrun agent that started it ends, killed or not, and at once and
without a word on SIGINT or SIGTERM (Ctrl-C, torchrun stopping it): whoever stopped the run
says so (:mod:`executor.lifeline`).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

from executor.lifeline import end_quietly_on_stop_signals, end_with_parent

if __name__ == "__main__":
    # First, before torch's import (seconds): from here on this rank ends when the torchrun
    # agent that started it does, also when the agent is killed with SIGKILL.
    end_with_parent()
    end_quietly_on_stop_signals()

import torch
import torch.distributed as dist

# Before any process group exists, on purpose: this module's collectives take
# ``group=group.WORLD`` as a default argument, evaluated when it is imported. Imported later (the
# first torch.optim optimizer imports torch._dynamo, which imports it), every one of those
# functions holds the default group for the life of the process, so destroy_process_group could
# not free it; imported now, the defaults are None (the default group, looked up at call time).
import torch.distributed.nn  # noqa: F401, E402

from executor.comm import Comm
from executor.inputs import (
    BadInput,
    check_run_options,
    check_steps_left,
    check_writable,
    read_config,
)
from executor.interpreter import RankRunner
from executor.reporting import build_report, describe, write_report
from executor.verify import gradients_checked, verify_rank
from planner.errors import StagewrightError
from planner.launch import ExecutorConfig
from planner.schedules import ActionKind, Schedule, generate

__all__ = ["DEFAULT_OUT", "main"]

DEFAULT_OUT = Path("stagewright-run")
EXIT_BAD_INPUT, EXIT_FAILED, EXIT_MISMATCH = 2, 1, 3
_BAD_INPUT_GRACE_S = 2.0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m executor.worker",
        description="Run an executor config (one process per rank, started by torchrun).",
    )
    parser.add_argument(
        "config", type=Path, nargs="+", help="executor configs, run one after the other"
    )
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps (default 3)")
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"folder for run-report.json (default ./{DEFAULT_OUT}; the emitted "
        "run-node scripts run from the candidate's folder); with several configs, a "
        "subfolder per config, named after its file (and its folder, where file names repeat)",
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="compare with a single-process reference computing in the run's precision; "
        "exit 3 on a mismatch",
    )
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="seconds before a silent peer counts as dead"
    )
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=None,
        help="folder every node shares for checkpoints, resumed from when it holds one; "
        "with several configs, a subfolder per config, named as under --out",
    )
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        help="steps between checkpoints, with --checkpoint-dir (default 0: only after the last)",
    )
    parser.add_argument("--lr", type=float, default=None, help="override the learning rate")
    parser.add_argument(
        "--dump-weights", action="store_true", help="also save each rank's final weights"
    )
    return parser.parse_args(argv)


def run_names(paths: list[Path]) -> list[str]:
    """A distinct folder name per config of a run of several: its file name without the
    suffix, unless two share one (every emitted candidate's config is
    ``executor-config.json``), then its folder's name before it, and its position in the
    command line where even that repeats. Reports and checkpoints of different configs must
    never share a folder: the later would overwrite (or resume from) the earlier."""
    names = [path.stem for path in paths]
    if len(set(names)) < len(names):
        names = [f"{path.resolve().parent.name}-{path.stem}" for path in paths]
    if len(set(names)) < len(names):
        names = [f"{index}-{name}" for index, name in enumerate(names, start=1)]
    return names


def _check_inputs(
    args: argparse.Namespace, world: int
) -> list[tuple[ExecutorConfig, Path, Path | None]]:
    """Each config with the folders its report and its checkpoints go to
    (:func:`run_folders`)."""
    check_run_options(
        steps=args.steps,
        timeout_s=args.timeout,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
        lr=args.lr,
    )
    if args.checkpoint_every is None:
        args.checkpoint_every = 0
    configs = [(path, read_config(path, args.lr)) for path in args.config]
    for path, config in configs:
        if config.world_size != world:
            raise BadInput(
                f"{path} runs t x p x d = {config.parallel.t} x {config.parallel.p} x "
                f"{config.parallel.d} = {config.world_size} ranks, but torchrun started {world}; "
                f"start {config.world_size} (--nproc-per-node x --nnodes)"
            )
    folders = run_folders([path for path, _ in configs], args.out, args.checkpoint_dir)
    for out, checkpoints in folders:
        for folder in (out, checkpoints):
            if folder is not None:
                check_writable(folder)
        if checkpoints is not None:
            check_steps_left(checkpoints, args.steps)
    return [(config, *where) for (_, config), where in zip(configs, folders, strict=True)]


def run_folders(
    paths: list[Path], out: Path, checkpoint_dir: Path | None
) -> list[tuple[Path, Path | None]]:
    """The report folder and the checkpoint folder (None: no checkpoints) of each config:
    ``out`` and ``checkpoint_dir`` themselves for one config, a subfolder of each named by
    :func:`run_names` for several."""
    if len(paths) == 1:
        return [(out, checkpoint_dir)]
    return [
        (out / name, None if checkpoint_dir is None else checkpoint_dir / name)
        for name in run_names(paths)
    ]


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    try:
        configs = _check_inputs(args, world)
    except BadInput as exc:
        _say_bad_input(local_rank, exc)
        return EXIT_BAD_INPUT
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    try:
        dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
    except Exception as exc:  # noqa: BLE001 - one clear line for the operator, then stop
        # torchrun started every node's ranks, but some never joined: they stopped before
        # (bad input on their node, said in that node's output) or were not started.
        _stopped(
            rank,
            f"not every rank joined within --timeout {args.timeout:g}s ({_first_line(exc)}); "
            f"a rank stopped before joining: see every node's output",
        )
    passed = True
    for config, out, checkpoints in configs:
        try:
            passed &= _run(config, rank, args, out, checkpoints)
        except BadInput as exc:  # found once the ranks could compare what they see
            _say_bad_input(local_rank, exc)
            os._exit(EXIT_BAD_INPUT)
        except Exception as exc:  # noqa: BLE001 - one clear line for the operator, then stop
            _stopped(
                rank,
                f"{_first_line(exc)} (a peer died, hung past --timeout {args.timeout:g}s, or "
                "the step failed)",
            )
    _leave_together(rank, world, args.timeout)
    return 0 if passed else EXIT_MISMATCH


def _say_bad_input(local_rank: int, exc: BadInput) -> None:
    """Say it once per node: on several nodes each has its own copy of the folder and its
    own log, and a problem only node 1's copy has would otherwise go unsaid."""
    if local_rank == 0:
        sys.stderr.write(f"executor.worker: error: {exc}\n")
        sys.stderr.flush()
    else:
        # torchrun stops a node's other ranks as soon as one of them ends: give the one that
        # says why the moment it needs to say it.
        time.sleep(_BAD_INPUT_GRACE_S)


def _first_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0][:300] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"


def _stopped(rank: int, why: str) -> NoReturn:
    """Say why this rank stops, in one line, and end it with EXIT_FAILED without waiting for
    peers that may be gone."""
    sys.stderr.write(f"rank {rank}: stopped: {why}\n")
    sys.stderr.flush()
    os._exit(EXIT_FAILED)


def _leave_together(rank: int, world: int, timeout_s: float) -> None:
    """Tear the process groups down once every rank is done with them, and return once every
    rank has torn its own down, so that no process ends while a peer still uses a connection
    to it.

    A rank that closed its connections while a peer was still inside the last collective
    made that peer's gloo thread abort: so all ranks pass a final barrier, then each says it
    has left the barrier through the rendezvous store (torchrun's, not a gloo connection) and
    waits until every rank has.

    destroy_process_group only forgets the groups; a gloo group's C++ side (its worker
    threads, its transport's event loop and its connections) goes when the last Python
    reference to it does. The data-parallel groups are held by this run's objects, in
    reference cycles, and the default group was held by torch.distributed.nn's default
    arguments (see the import at the top), so both used to be torn down inside the
    interpreter's finalization, their threads running until then, at a different moment on
    each rank; the rare abort at exit ("terminate called without an active exception", exit
    -6, about 1 run in 78) came in that stretch. So the cycles are collected right after
    destroy_process_group, which joins every gloo thread here, while the interpreter is whole;
    then the ranks meet once more in the store, and the worker ends with os._exit, without
    the interpreter's teardown (a group still referenced from somewhere we do not control has
    its threads ended with the process)."""
    dist.barrier()
    store = dist.distributed_c10d._get_default_store()
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    _meet(store, f"stagewright/{attempt}/left", rank, world, timeout_s)
    dist.destroy_process_group()
    gc.collect()
    _meet(store, f"stagewright/{attempt}/gone", rank, world, timeout_s)


def _meet(
    store: dist.distributed_c10d.Store, prefix: str, rank: int, world: int, timeout_s: float
) -> None:
    """Say ``prefix`` in the store and wait until every rank has."""
    keys = [f"{prefix}/{r}" for r in range(world)]
    store.set(keys[rank], "1")
    store.wait(keys, timedelta(seconds=timeout_s))


def schedule_for_batches(config: ExecutorConfig, batches: int) -> Schedule:
    """The config's schedule over ``batches`` batches without a flush, from the planner's own
    generator; refused when that generator does not reproduce the config's schedule."""
    ir = config.ir
    if batches == ir.num_batches:
        return ir
    try:
        same = generate(ir.name, ir.num_devices, ir.num_microbatches, num_batches=ir.num_batches)
        longer = generate(ir.name, ir.num_devices, ir.num_microbatches, num_batches=batches)
    except StagewrightError as exc:
        raise StagewrightError(f"cannot extend schedule {ir.name!r} across steps: {exc}") from exc
    if same.actions != ir.actions:
        raise StagewrightError(
            f"the config's {ir.name} schedule is not the one stagewright's generator builds, so "
            f"it cannot be run across {batches} steps; plan again"
        )
    return longer


def _segments(config: ExecutorConfig, start: int, steps: int, every: int) -> list[int]:
    """Steps per pass: one per step for flushed schedules; for schedules that run batches
    without a flush, the steps between checkpoints (a checkpoint needs a flush)."""
    remaining = steps - start
    if config.ir.num_batches == 1:
        return [1] * remaining
    size = every if every else remaining
    return [min(size, remaining - i) for i in range(0, remaining, size)]


def _run(
    config: ExecutorConfig,
    rank: int,
    args: argparse.Namespace,
    out: Path,
    checkpoints: Path | None,
) -> bool:
    comm = Comm(config, rank, args.timeout)
    runner = RankRunner(config, comm, keep_grads=gradients_checked(config) if args.verify else 0)
    if config.ir.count(ActionKind.EVICT):
        runner.measure_stage_bytes()
    start = 0
    folder = checkpoints
    if folder is not None:
        # Imported only when asked: torch.distributed.checkpoint takes 0.6 s to import, in
        # every rank.
        from executor.checkpoint import (
            latest_step,
            load_checkpoint,
            ranks_not_sharing,
            remove_incomplete,
            save_checkpoint,
        )

        missing = ranks_not_sharing(folder)
        if missing:
            raise BadInput(
                f"--checkpoint-dir {folder} is not one folder every node shares: ranks "
                f"{', '.join(map(str, missing))} do not see what rank 0 writes there; name a "
                "folder on a file system every node mounts (a relative one is taken from each "
                "node's copy of the candidate's folder)"
            )
        if rank == 0:
            remove_incomplete(folder)
        dist.barrier()
        # Again, now that every rank sees the same folder: with no step left the run would
        # take none, and its report would have no step time.
        check_steps_left(folder, args.steps)
        found = latest_step(folder)
        if found is not None:
            load_checkpoint(runner, folder, found)
            start = found + 1
    continuous = config.ir.num_batches > 1
    segments = _segments(config, start, args.steps, args.checkpoint_every)
    measures = []
    step = start
    for batches in segments:
        schedule = config.ir if not continuous else schedule_for_batches(config, batches)
        done = runner.run(schedule, step)
        if not runner.first_losses and done:
            runner.first_losses = done[0].losses
        measures += done
        step += batches
        for weights in runner.weights.values():
            weights.restart_versions()
        due = args.checkpoint_every and (step - start) % args.checkpoint_every == 0
        if folder is not None and (due or step == args.steps):
            save_checkpoint(runner, folder, step - 1)
    verify = None
    if args.verify:
        # The reference replays the whole run from the initial weights, so a resumed run's
        # earlier steps are included (segments as the checkpoints cut them).
        history = _segments(config, 0, args.steps, args.checkpoint_every)
        verify = verify_rank(runner, start, history if continuous else None)
    mine: dict[str, Any] = {
        "rank": rank,
        "dp": comm.dp,
        "pp": comm.pp,
        "tp": comm.tp_rank,
        "stages": list(runner.my_stages),
        "steps": [m.model_dump() for m in measures],
        "verify": verify,
    }
    everyone = comm.all_gather_object(mine)
    if args.dump_weights:
        final = {
            f"stage{s}.{name}": value.detach().float().clone()
            for s, w in runner.weights.items()
            for name, value in w.newest().items()
        }
        torch.save(final, out / f"rank{rank}.weights.pt")
    report = build_report(
        config, everyone, first_step=start, continuous=continuous, notes=_notes(config)
    )
    if rank == 0:
        written = write_report(report, out)
        # Where it went: the emitted run-node scripts run from the candidate's folder, so
        # the default ./stagewright-run is beside the config, not where the script was started.
        sys.stdout.write(describe(report) + f"\nreport: {written.resolve()}\n")
        sys.stdout.flush()
    return report.verification is None or report.verification.passed


def _notes(config: ExecutorConfig) -> list[str]:
    notes = []
    if config.training.flash_attention and config.dropout > 0:
        notes.append(
            "flash attention runs without attention dropout here (its kernel would draw the "
            "masks from the process's random state, which the reference does not share)"
        )
    return notes


if __name__ == "__main__":
    status = main()
    # Everything is written and every rank has left its groups: end without the interpreter's
    # teardown. With torch and torch._dynamo loaded it took 0.4-0.8 s of CPU per rank (2 s of
    # wall time for 4 ranks on 2 cores) to free memory the OS frees anyway, and a gloo group
    # still referenced from somewhere would be torn down in it (see _leave_together).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
