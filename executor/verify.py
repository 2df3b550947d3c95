"""``--verify``: a rank's run against the single-process reference.

The reference (:mod:`executor.reference`) computes in the run's precision, as the run does
(compute weights in bf16/fp16 from fp32 master weights, gradients accumulated in fp32, fp16's
loss scale). Flushed schedules: the first step's gradients (reduced over replicas, the loss
scale undone) and every micro-batch's loss. Stale-weight schedules (2BW) change what is
computed: batch b's gradient is taken at weight version max(b - 1, 0), so the first two
batches of a run are both taken at the weights it started from; those two (a run that used
fresh weights for batch 1 differs there) and the first batch's losses are compared, as a
flushed step's are (a resumed run from the weights it resumed at, which the reference
reaches by replaying the runs before). Past them the weights have had optimizer steps; Adam
turns the rounding of near-zero gradients (the attention key's bias has an exactly zero
one) into weight differences as large as the learning rate, which no reference reproduces,
so later batches are not compared (the executor's tests compare every step's losses). For
the same reason a run resumed after Adam steps is compared with a replay that matches it only
up to amplified rounding; its report says so.

An error is max |run - reference| over a tensor, divided by the largest |reference| value of
that tensor (an error relative to the tensor's scale). Pipeline and data parallelism compute
the same operations on the same numbers as the reference, so they agree to the last bit or to
the order of fp32 additions. Tensor parallelism splits matrix products: each rank rounds its
partial sum to the compute precision before the all-reduce adds them, so the result differs
from the unsplit product by about the unit roundoff u of that precision (bf16 2^-8, fp16
2^-11) per layer, accumulated through the model. The tolerance is 8u for bf16 and fp16, and
1e-5 for fp32; with t > 1 in bf16 or fp16 a gradient may also differ by ``ROUNDING_MARGIN``
times what the precision's rounding moves it: the reference gradient against the same
reference computed in fp32. (A fixed 8u does not hold: measured on a tiny GPT of hidden 32
at t = 2 in bf16, the largest error grows with depth, 5u at 4 layers, 8u at 8, 11u at 12,
13u at 24, while the fp32 run of the same plan agrees within 1e-6; the layer-norm gradients,
sums over every token, move 3-5% between bf16 and fp32 themselves.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch.distributed as dist
from torch import Tensor

from executor.interpreter import RankRunner
from executor.reference import local_view, reference_gradients, reference_weights
from planner.launch import ExecutorConfig
from planner.launch.report import Mismatch

__all__ = [
    "ROUNDING_MARGIN",
    "TOLERANCE",
    "gradients_checked",
    "on_rank_zero",
    "relative_error",
    "verify_rank",
]

TOLERANCE = {"fp32": 1e-5, "bf16": 8 * 2.0**-8, "fp16": 8 * 2.0**-11}
# Tensor parallelism in bf16 or fp16: a gradient may differ from the reference by a few
# times what the precision's rounding moves it (the reference against itself in fp32).
ROUNDING_MARGIN = 4.0
_FLOOR = 1e-12
T = TypeVar("T")


def relative_error(run: Tensor, reference: Tensor) -> float:
    """max |run - reference| over the tensor, divided by the largest |reference| value."""
    scale = max(float(reference.abs().max()), _FLOOR) if reference.numel() else 1.0
    return float((run.float() - reference).abs().max()) / scale if run.numel() else 0.0


def on_rank_zero(compute: Callable[[], T]) -> T:
    """The reference, computed once (by rank 0) and shared with every rank."""
    box = [compute() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]  # type: ignore[return-value]


def _rounding_tolerance(tolerance: float, rounded: Tensor, expected: Tensor) -> float:
    """A tensor's tolerance when rounding alone moves it: ``rounded`` is the reference
    computed with other rounding; at least the precision's ``tolerance``."""
    return max(tolerance, ROUNDING_MARGIN * relative_error(rounded, expected))


def gradients_checked(config: ExecutorConfig) -> int:
    """Optimizer steps per stage whose gradients --verify compares (a rank keeps that many):
    the first step; for a schedule that runs batches without a flush, the first two batches,
    both taken at the weights the run started from (PipeDream-2BW §3.1)."""
    return 2 if config.ir.num_batches > 1 else 1


_References = tuple[list[float], dict[str, Tensor], dict[str, Tensor] | None]


def _runs_before(segments: list[int], first_step: int) -> list[int]:
    """The runs (batches each) that ended before ``first_step``."""
    prior: list[int] = []
    while sum(prior) < first_step:
        prior.append(segments[len(prior)])
    return prior


def _references(
    config: ExecutorConfig, steps: Sequence[int], prior: Sequence[int]
) -> list[_References]:
    """For each of ``steps``: the reference's losses and gradients of that step's data, all
    taken at the weights after the ``prior`` runs; with tensor parallelism in bf16 or fp16
    also the gradients computed in fp32 from the same weights (how far the precision's
    rounding moves each one), else None."""
    weights = reference_weights(config, prior)
    in_fp32 = None
    if config.parallel.t > 1 and config.training.precision != "fp32":
        in_fp32 = config.model_copy(
            update={"training": config.training.model_copy(update={"precision": "fp32"})}
        )
    out: list[_References] = []
    for step in steps:
        losses, grads = reference_gradients(config, step, weights)
        exact = None if in_fp32 is None else reference_gradients(in_fp32, step, weights)[1]
        out.append((losses, grads, exact))
    return out


_Error = tuple[int, str, str, float, int | None]  # stage, tensor, kind, error, weight version


@dataclass
class _Comparison:
    """What one rank compared: each error, the tolerances that differ from the precision's,
    and what was compared (in words)."""

    errors: list[_Error] = field(default_factory=list)
    tolerances: dict[tuple[int, str], float] = field(default_factory=dict)
    compared: str = ""


def _compare_gradients(
    runner: RankRunner, first_step: int, segments: list[int] | None, tolerance: float
) -> _Comparison:
    """Flushed (``segments`` None): the first step's gradients and losses. Stale weights
    (2BW; ``segments``: the batches of each run since step 0): the first two batches of this
    invocation's first run, both taken at the weights it started from (version
    max(b - 1, 0) of batch b), where a run that used fresh weights for batch 1 shows, and
    the first batch's losses. The reference reaches those weights by replaying the runs
    before ``first_step``."""
    config, tp = runner.config, runner.comm.tp
    if segments is None:
        prior, batches = [1] * first_step, 1
        compared = f"gradients and losses of step {first_step}"
    else:
        prior = _runs_before(segments, first_step)
        batches = min(gradients_checked(config), segments[len(prior)])
        start = "the initial weights" if first_step == 0 else f"the weights of step {first_step}"
        compared = (
            f"gradients of the first {'two batches' if batches == 2 else 'batch'}, taken at "
            f"{start} as PipeDream-2BW's rule W(t+1) = W(t) - lr * grad(W(t-1)) takes them, "
            "and the first batch's losses"
        )
    if first_step > 0 and config.training.optimizer == "adam":
        compared += (
            f" (resumed after {first_step} Adam steps, which the reference replays only up to "
            "rounding: where a gradient is near zero Adam turns rounding into weight "
            "differences as large as the learning rate, so a mismatch here may be rounding; "
            "a run verified from step 0 is not affected)"
        )
    steps = [first_step + b for b in range(batches)]
    references = on_rank_zero(lambda: _references(config, steps, prior))
    if references[0][2] is not None:
        compared += (
            f", each gradient within at least {ROUNDING_MARGIN:g}x what "
            f"{config.training.precision} rounding moves it (tensor parallelism)"
        )
    out = _Comparison(compared=compared)
    version = None if segments is None else 0  # the version the gradients were taken at
    for s in runner.weights:
        kept = runner.kept_grads.get(s, [])
        for batch, (grads, (_, expected_all, exact_all)) in enumerate(
            zip(kept, references, strict=False)
        ):
            expected = local_view(config, expected_all, s, tp)
            unrounded = local_view(config, exact_all, s, tp) if exact_all is not None else None
            for name, grad in grads.items():
                label = name if segments is None else f"{name} (batch {first_step + batch})"
                error = relative_error(grad, expected[name])
                out.errors.append((s, label, "gradient", error, version))
                if unrounded is not None:
                    out.tolerances[(s, label)] = _rounding_tolerance(
                        tolerance, unrounded[name], expected[name]
                    )
    if runner.last_stage in runner.weights:
        m, dp = config.num_microbatches, runner.comm.dp
        reference_losses = references[0][0][dp * m : (dp + 1) * m]
        for k, (mine, ref) in enumerate(zip(runner.first_losses, reference_losses, strict=True)):
            error = abs(mine - ref) / max(abs(ref), _FLOOR)
            out.errors.append((runner.last_stage, f"loss of micro-batch {k}", "loss", error, None))
    return out


def verify_rank(runner: RankRunner, first_step: int, segments: list[int] | None) -> dict[str, Any]:
    """This rank's comparison: tensors checked, largest error, mismatches (as dicts of
    :class:`planner.launch.report.Mismatch`). ``segments``: the batches of each run of a
    stale-weight schedule, None for a flushed one."""
    tolerance = TOLERANCE[runner.config.training.precision]
    comparison = _compare_gradients(runner, first_step, segments, tolerance)
    errors, tolerances, rank = comparison.errors, comparison.tolerances, runner.comm.rank
    allowed = [tolerances.get((s, name), tolerance) for s, name, *_ in errors]
    mismatches = [
        Mismatch(
            rank=rank,
            stage=s,
            tensor=name,
            kind=kind,
            weight_version=version,
            error=error,
            tolerance=limit,
        ).model_dump()
        for (s, name, kind, error, version), limit in zip(errors, allowed, strict=True)
        if not error <= limit  # NaN is a mismatch too
    ]
    shares = [e[3] / limit for e, limit in zip(errors, allowed, strict=True)]
    return {
        "checked": len(errors),
        "max_error": max((e[3] for e in errors), default=0.0),
        # NaN compares false: a NaN error makes the share infinite (it is a mismatch too).
        "largest_share": max((x if x == x else float("inf") for x in shares), default=0.0),
        "mismatches": mismatches,
        "compared": comparison.compared,
        "tolerance": tolerance,
    }
