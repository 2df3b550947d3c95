"""Per-rank entry point under torchrun: ``python -m executor.worker CONFIG.json [options]``.

Initialises the process group (nccl when a GPU is present, gloo otherwise) with a bounded
timeout, runs the steps, checkpoints with torch.distributed.checkpoint every N steps and
resumes from the newest checkpoint, and writes this rank's report as JSON. A peer that dies
or hangs surfaces as a timeout or a connection error here: the rank prints one clear line
and exits non-zero, so torchrun stops the job.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from executor.checkpoint import latest_step, load_checkpoint, save_checkpoint
from executor.runtime import Runtime, load_config
from planner.schedules import ActionKind

__all__ = ["main"]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m executor.worker")
    parser.add_argument(
        "config",
        type=Path,
        nargs="+",
        help="executor configs, run one after the other (same world size)",
    )
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--verify", action="store_true")
    parser.add_argument("--out", type=Path, required=True, help="folder for rank reports")
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="seconds before a silent peer counts as dead"
    )
    parser.add_argument("--checkpoint-dir", type=Path, default=None)
    parser.add_argument("--checkpoint-every", type=int, default=0)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument(
        "--dump-weights",
        action="store_true",
        help="also save this rank's final weights (for tests)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    configs = []
    for path in args.config:
        try:
            data = json.loads(path.read_text())
            if args.lr is not None:
                data["lr"] = args.lr
            configs.append((path, load_config(data)))
        except (OSError, ValueError) as exc:
            sys.stderr.write(f"rank {rank}: cannot use {path}: {exc}\n")
            return 2
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
    world = dist.get_world_size()
    for path, config in configs:
        if rank == 0:
            for note in config.notes:
                sys.stderr.write(f"warning: {path.name}: {note}\n")
        needed = config.t * config.p * config.d
        if needed != world:
            sys.stderr.write(
                f"rank {rank}: {path} needs t x p x d = {needed} ranks, but {world} were "
                f"started; use --nproc {needed}\n"
            )
            return 2
        try:
            report = _run(config, rank, args)
        except Exception as exc:  # noqa: BLE001 - one clear line for the operator, then stop
            sys.stderr.write(
                f"rank {rank}: stopped: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:300] if str(exc) else ''} "
                f"(a peer died, hung past --timeout {args.timeout:g}s, or the step failed)\n"
            )
            sys.stderr.flush()
            os._exit(1)  # do not wait for peers that may be gone
        out = args.out / path.stem if len(configs) > 1 else args.out
        out.mkdir(parents=True, exist_ok=True)
        weights = report.pop("weights", None)
        (out / f"rank{rank}.json").write_text(json.dumps(report))
        if weights is not None:
            torch.save(weights, out / f"rank{rank}.weights.pt")
    dist.destroy_process_group()
    return 0


def _run(config: Any, rank: int, args: argparse.Namespace) -> dict[str, Any]:
    runtime = Runtime(config, rank, timeout_s=args.timeout)
    if config.schedule.count(ActionKind.EVICT):
        runtime.exchange_sizes()
    start = 0
    if args.checkpoint_dir is not None:
        found = latest_step(args.checkpoint_dir)
        if found is not None:
            load_checkpoint(runtime, args.checkpoint_dir, found)
            start = found + 1
    runtime.keep_grads = args.verify
    steps = []
    # "rank:step": for the failure tests, this rank dies (FAIL) or hangs (HANG) there.
    fail_at = os.environ.get("STAGEWRIGHT_FAIL_AT")
    hang_at = os.environ.get("STAGEWRIGHT_HANG_AT")
    for step in range(start, args.steps):
        if fail_at and fail_at == f"{rank}:{step}":
            sys.stderr.write(f"rank {rank}: simulated failure at step {step}\n")
            sys.stderr.flush()
            os._exit(17)
        if hang_at and hang_at == f"{rank}:{step}":
            sys.stderr.write(f"rank {rank}: simulated hang at step {step}\n")
            sys.stderr.flush()
            time.sleep(3600)
        report = runtime.run_step(step)
        if step == start:
            runtime.first_losses = report.losses
        steps.append(report.__dict__)
        if (
            args.checkpoint_dir is not None
            and args.checkpoint_every
            and ((step + 1) % args.checkpoint_every == 0)
        ):
            save_checkpoint(runtime, args.checkpoint_dir, step)
    result: dict[str, Any] = {
        "rank": rank,
        "coords": {"dp": runtime.dp, "pp": runtime.pp, "tp": runtime.tp_rank},
        "stages": list(runtime.my_stages),
        "first_step": start,
        "steps": steps,
        "time": time.time(),
    }
    if args.verify:
        result["verify"] = _verify(runtime, args)
    if args.dump_weights:
        result["weights"] = {
            f"stage{s}.{name}": value.detach().clone()
            for s, versions in runtime.versions.items()
            for name, value in versions[max(versions)].items()
        }
    return result


def _verify(runtime: Runtime, args: argparse.Namespace) -> dict[str, Any]:
    from executor.reference import local_view, reference_2bw_weights, reference_step

    config = runtime.config
    out: dict[str, Any] = {"max_grad_error": 0.0, "max_loss_error": 0.0, "checked": []}
    # Weight versions stepped by the schedule (2BW): each update uses a stale gradient, so
    # the check is the 1-stale rule, not a single-process step.
    stepped_versions = any(
        action.kind is ActionKind.OPTIMIZER_STEP and action.version is not None
        for _, _, action in config.schedule.iter_actions()
    )
    if stepped_versions:
        full = reference_2bw_weights(config, args.steps)
        for s in runtime.my_stages:
            newest = runtime.versions[s][max(runtime.versions[s])]
            expected = local_view(config, full, s, runtime.tp)
            for name, value in newest.items():
                err = float((value.detach() - expected[name]).abs().max())
                out["max_grad_error"] = max(out["max_grad_error"], err)
                out["checked"].append(name)
        out["what"] = "weights after the run vs W(t+1) = W(t) - lr grad(W(t-1))"
        return out
    losses, grads = reference_step(config, 0)
    for s in runtime.my_stages:
        expected = local_view(config, grads, s, runtime.tp)
        for name, grad in runtime.verify_grads.get(s, {}).items():
            err = float((grad - expected[name]).abs().max())
            out["max_grad_error"] = max(out["max_grad_error"], err)
            out["checked"].append(f"stage{s}.{name}")
    mine = runtime.first_losses
    m = config.num_microbatches
    ref = losses[runtime.dp * m : (runtime.dp + 1) * m]
    if mine:
        out["max_loss_error"] = max(abs(a - b) for a, b in zip(mine, ref, strict=True))
    out["what"] = "first step's gradients and losses vs the single-process reference"
    return out


if __name__ == "__main__":
    sys.exit(main())
