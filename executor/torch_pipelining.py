"""A plan's schedule on torch.distributed.pipelining, the pipeline runtime torch ships.

    torchrun --standalone --nproc-per-node=P -m executor.torch_pipelining \\
        executor-config.json torch-pipelining.csv [--steps N] [--verify]

A plan names torch.distributed.pipelining among the runtimes of a candidate it can run as
planned, and emits the candidate's schedule as ``torch-pipelining.csv``, the compute-only CSV
torch's ``_PipelineScheduleRuntime`` loads (one row per pipeline rank). This runs that CSV:
torch's runtime drives the stages of stagewright's executor model (``executor.model``, the
candidate's layers per stage, weights, batches and dropout masks from
``executor-config.json``) through the actions the CSV lists, with the config's optimizer after
each step. With ``--verify`` the first step's losses and gradients are compared with the
single-process reference (:mod:`executor.reference`), as ``executor.worker --verify`` does for
stagewright's own runtime: the CSV then provably computes what one process computes.
``benchmarks/executor_vs_torch.py`` builds torch's own schedules (``Schedule1F1B``, ...) with
:func:`build` too, to compare them with stagewright's runtime.

It runs on the CPU over gloo, also on a machine with GPUs: it checks that torch's runtime
runs the schedule as planned (a few steps of the executor's model), it is not a training
runtime; ``executor.worker`` is, and picks nccl and the GPUs by itself.

What torch's runtime and this runner take, each refused with the reason otherwise: one
pipeline (t = d = 1: the CSV is one pipeline's schedule; tensor and data parallelism around it
are the user's device mesh, see the candidate's placement note), fp32 (torch accumulates
gradients in the parameters' dtype, where stagewright's executor and its reference accumulate
16-bit runs' gradients in fp32), and stages whose placement the CSV's rows express (one
stage per rank, loop or V: where the plan emits a CSV at all).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

from executor.data import MicroBatch, global_batch
from executor.dropout import DropoutKey
from executor.inputs import BadInput, read_config
from executor.model import GPTShape, Stage, build_stage, init_full_weights, model_options
from executor.optimizer import make_optimizer
from executor.reference import local_view, reference_gradients
from executor.tensor_parallel import TensorParallel
from executor.verify import TOLERANCE, on_rank_zero, relative_error
from planner.launch import ExecutorConfig
from planner.launch.torch_csv import torch_runner_problem

__all__ = ["Body", "build", "check_config", "main", "run_step"]

EXIT_BAD_INPUT, EXIT_MISMATCH = 2, 3

Wrap = Callable[[str, Callable[..., Any]], Callable[..., Any]]


class Body(nn.Module):
    """One of the executor's stages as torch's ``PipelineStage`` calls it: with the
    activation only. ``key`` is the dropout key of the micro-batch being run forward, set
    before each forward (recomputation re-runs it with the key it was given)."""

    def __init__(self, stage: Stage) -> None:
        super().__init__()
        self.stage = stage
        self.key = DropoutKey(0, 0, 0)

    def forward(self, x: Tensor) -> Tensor:
        return self.stage.activations(x, self.key)


def check_config(config: ExecutorConfig, world: int) -> None:
    """BadInput, saying what to change, for a config this runner cannot run as torch would."""
    par = config.parallel
    problem = torch_runner_problem(par.t, par.d, par.cp, config.training.precision)
    if problem is not None:
        raise BadInput(problem)
    if config.ir.num_devices != world:
        raise BadInput(
            f"the schedule has {config.ir.num_devices} pipeline ranks, torchrun started "
            f"{world}: give --nproc-per-node={config.ir.num_devices}"
        )


def build(
    config: ExecutorConfig, rank: int, schedule: Path | type, wrap: Wrap | None = None
) -> tuple[Any, list[Body], Callable[[int], None]]:
    """torch's schedule for ``rank``: ``_PipelineScheduleRuntime`` with the actions of the
    CSV file ``schedule``, or one of torch's own schedule classes (the benchmark's
    comparison). Returns it, the rank's stage modules, and a function that names the step
    about to run (the dropout masks and batches depend on it). ``wrap(kind, fn)`` wraps the
    stages' compute calls (the benchmark times them)."""
    schedule_ir = config.ir
    n = schedule_ir.num_stages
    shape = GPTShape.of(config.model)
    full = init_full_weights(shape, config.seed)
    options = model_options(config)
    device = torch.device("cpu")
    current = {"step": 0}
    bodies: list[Body] = []
    stages = []
    for s in schedule_ir.stages_of(rank):
        spec = config.stages[s]
        body = Body(
            build_stage(
                shape,
                full,
                spec.first_layer,
                spec.end_layer,
                embed=s == 0,
                head=s == n - 1,
                options=options,
                recompute=spec.layer_modes(),
            )
        )
        bodies.append(body)
        pipe = PipelineStage(body, s, n, device)
        forward = pipe.forward_one_chunk

        def keyed(
            fwd_chunk_id: int, *args: Any, _body: Body = body, _fwd: Any = forward, **kw: Any
        ) -> Any:
            # The micro-batch's own masks, as the executor and the reference draw them.
            _body.key = MicroBatch(config, 0, current["step"], fwd_chunk_id).key
            return _fwd(fwd_chunk_id, *args, **kw)

        pipe.forward_one_chunk = keyed  # type: ignore[method-assign]
        if wrap is not None:
            pipe.forward_one_chunk = wrap("F", pipe.forward_one_chunk)  # type: ignore[method-assign]
            pipe.backward_one_chunk = wrap("B", pipe.backward_one_chunk)  # type: ignore[method-assign]
            pipe.backward_weight_one_chunk = wrap(  # type: ignore[method-assign]
                "W", pipe.backward_weight_one_chunk
            )
            pipe.scale_grads = wrap("scale", pipe.scale_grads)  # type: ignore[method-assign]
        stages.append(pipe)
    vocab = config.model.vocab_size

    def loss_fn(logits: Tensor, target: Tensor) -> Tensor:
        # The micro-batch's mean cross-entropy, as the executor's last stage returns it
        # (logits (sequence, batch, vocabulary), targets (batch, sequence)); scale_grads
        # divides the gradients by m, as the executor's loss / m does.
        return F.cross_entropy(logits.float().reshape(-1, vocab), target.t().reshape(-1))

    m = config.num_microbatches
    loss = loss_fn if wrap is None else wrap("loss", loss_fn)
    sched: Any
    if isinstance(schedule, Path):
        # Private in torch 2.13, and the only runtime that takes an action list.
        from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

        sched = _PipelineScheduleRuntime(  # type: ignore[no-untyped-call]
            stages, m, loss_fn=loss, scale_grads=True
        )
        sched._load_csv(str(schedule), format="compute_only")
    else:
        kind = schedule
        sched = kind(
            stages[0] if kind is Schedule1F1B else stages, m, loss_fn=loss, scale_grads=True
        )

    def at_step(step: int) -> None:
        current["step"] = step

    return sched, bodies, at_step


def run_step(sched: Any, config: ExecutorConfig, rank: int, step: int) -> list[Tensor]:
    """One step of torch's schedule on the config's batch of ``step``; the per-micro-batch
    losses on the rank holding the last stage (empty elsewhere)."""
    stage_ids = config.ir.stages_of(rank)
    inputs, targets = global_batch(config, step)
    args = (inputs,) if 0 in stage_ids else ()
    losses: list[Tensor] = []
    kwargs: dict[str, Any] = {"return_outputs": False}
    if config.ir.num_stages - 1 in stage_ids:
        kwargs |= {"target": targets, "losses": losses}
    sched.step(*args, **kwargs)
    return losses


def _verify(
    config: ExecutorConfig, rank: int, bodies: Sequence[Body], losses: Sequence[Tensor]
) -> tuple[int, float]:
    """(tensors compared, largest error relative to each tensor's scale) of this rank's
    first-step gradients and losses against the single-process reference."""
    # Rank 0 alone draws the initial weights and runs the reference; the others receive it.
    ref_losses, ref_grads = on_rank_zero(
        lambda: reference_gradients(
            config, 0, init_full_weights(GPTShape.of(config.model), config.seed)
        )
    )
    worst, compared = 0.0, 0
    one = TensorParallel(1, 0, None, False)
    for s, body in zip(config.ir.stages_of(rank), bodies, strict=True):
        expected = local_view(config, ref_grads, s, one)
        for name, param in body.stage.named_parameters():
            want = expected[name]
            got = torch.zeros_like(want) if param.grad is None else param.grad
            worst = max(worst, relative_error(got, want))
            compared += 1
    if losses:
        got = torch.tensor([float(x.detach()) for x in losses])
        worst = max(worst, relative_error(got, torch.tensor(ref_losses)))
        compared += 1
    return compared, worst


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m executor.torch_pipelining",
        description="Run a plan's torch-pipelining.csv on torch.distributed.pipelining's "
        "runtime with stagewright's model, under torchrun.",
    )
    parser.add_argument("config", type=Path, help="the candidate's executor-config.json")
    parser.add_argument("csv", type=Path, help="the candidate's torch-pipelining.csv")
    parser.add_argument("--steps", type=int, default=2, help="training steps (default 2)")
    parser.add_argument(
        "--verify",
        action="store_true",
        help="compare the first step's losses and gradients with the single-process reference",
    )
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(1)
    try:
        config = read_config(args.config)
        check_config(config, world)
        if not args.csv.is_file():
            raise BadInput(f"cannot read {args.csv}: no such file")
    except BadInput as exc:
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:
            sys.stderr.write(f"executor.torch_pipelining: error: {exc}\n")
        return EXIT_BAD_INPUT
    dist.init_process_group("gloo")
    sched, bodies, at_step = build(config, rank, args.csv)
    params = [p for body in bodies for p in body.parameters()]
    optimizer = make_optimizer(config, params)
    verdict = torch.tensor([0, 0.0], dtype=torch.float64)
    for step in range(args.steps):
        at_step(step)
        losses = run_step(sched, config, rank, step)
        if step == 0 and args.verify:
            compared, worst = _verify(config, rank, bodies, losses)
            verdict = torch.tensor([compared, worst], dtype=torch.float64)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if losses:
            mean = sum(float(x.detach()) for x in losses) / len(losses)
            _say(f"step {step}: mean loss {mean:.6f} over {len(losses)} micro-batches")
    passed = True
    if args.verify:
        counts = verdict[:1].clone()
        largest = verdict[1:].clone()
        dist.all_reduce(counts, op=dist.ReduceOp.SUM)
        dist.all_reduce(largest, op=dist.ReduceOp.MAX)
        tolerance = TOLERANCE[config.training.precision]
        error = float(largest)
        passed = error <= tolerance
        if rank == 0:
            _say(
                f"verify {'passed' if passed else 'FAILED'}: {int(counts)} tensors against the "
                f"single-process reference, largest error {error:.2e} "
                f"({error / tolerance:.0%} of the tolerance {tolerance:g})"
            )
    dist.barrier()
    dist.destroy_process_group()
    return 0 if passed else EXIT_MISMATCH


if __name__ == "__main__":
    sys.exit(main())
