"""What the calibration's low collective efficiency stands in for (issue 12, BPipe Table 7).

    python benchmarks/residual_terms.py          # about 2 minutes on a quiet machine

Fitted to every public A100 run, ``collective_efficiency`` goes to about 0.3-0.4, where
NCCL's all-gather / reduce-scatter on an 8-GPU NVSwitch node reaches about 0.77 of NVLink's
300 GB/s (nccl-tests). This script asks the data why, on BPipe Table 7's 34 step runs:

1. Per row, the terms the candidate explanations would enlarge, from the cost model on the
   paper's cluster (``_bpipe_table7.paper_cluster``): the tensor-parallel collectives of a
   step (forward, recomputation, backward as Megatron runs them), the data-parallel gradient
   reduce-scatter + all-gather (not overlapped: Megatron of 2022 had no
   ``overlap_grad_reduce``), the optimizer step, the pipeline hops a step sends, and
   measured / predicted step time.
2. The time parameters fitted to the step runs, with and without the rows the declared
   model misses by more than ``SLOW`` (chosen by that rule, not by name), with
   ``collective_efficiency`` free: whether it is those rows that pull it down.
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _bpipe_table7 import GPU, paper_cluster  # noqa: E402
from paper_reproduction import public_runs  # noqa: E402

from planner.calibrate import fit  # noqa: E402
from planner.costmodel.evaluate import PlanContext, estimate, price  # noqa: E402
from planner.measurements import (  # noqa: E402
    MeasuredRun,
    candidate_config,
    measured_step_time_s,
    plan_request,
)
from planner.profiles import HardwareProfile, default_store  # noqa: E402

SLOW = 0.20  # measured step time more than 20% above the declared model's prediction
TIME_PARAMETERS = [
    "collective_efficiency",
    "gemm_efficiency",
    "gemm_pipeline_k",
    "kernel_launch_us",
    "memory_efficiency",
]


def breakdown(hw: HardwareProfile, run: MeasuredRun) -> dict[str, float]:
    """Seconds per step of the terms each candidate explanation would enlarge."""
    ctx = PlanContext(plan_request(run), hw, [])
    config = candidate_config(run)
    priced = price(ctx, estimate(ctx, config))
    costs = priced.estimate.costs
    m = config.num_microbatches
    measured = measured_step_time_s(run, hw.peak(run.training.precision))
    assert measured is not None
    return {
        "measured_s": measured,
        "predicted_s": priced.iteration_time_s,
        "tp_collectives_s": m * max(costs.tp_comm),
        "data_parallel_s": priced.data_parallel_s,
        "optimizer_s": priced.optimizer_s,
        "p2p_s": 2 * (m + config.p - 1) * costs.p2p_s,
        "peak_gib": priced.estimate.peak_memory / 2**30,
    }


def label(run: MeasuredRun) -> str:
    c = run.config
    return (
        f"{run.model.name} t{c.t} p{c.p} d{c.d} mb{c.micro_batch_size} {c.recompute} {c.schedule}"
    )


def fit_line(name: str, hw: HardwareProfile, runs: list[MeasuredRun]) -> str:
    result = fit(hw, runs, [], TIME_PARAMETERS, exclude_outliers=False)  # the sets are chosen
    values = ", ".join(
        f"{p.parameter.name} {p.value:.3g}" for p in result.parameters if p.status != "held"
    )
    return (
        f"| {name} | {len(runs)} | {result.rms_log_error_before:.3f} | "
        f"{result.rms_log_error:.3f} | {values} |"
    )


def main() -> None:
    hw = paper_cluster(default_store().hardware(GPU))
    steps = [
        r
        for r in public_runs()
        if r.measured.kind == "step" and r.model.name in ("gpt3-96b", "gpt3-134b")
    ]
    print(f"{len(steps)} step runs of BPipe Table 7, {GPU} on the paper's cluster\n")
    print(
        "| run | measured s | predicted s | ratio | TP collectives s | DP sync s "
        "| optimizer s | p2p s | peak GiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    slow, ratios = [], []
    for run in steps:
        b = breakdown(hw, run)
        ratio = b["measured_s"] / b["predicted_s"]
        ratios.append(ratio)
        if ratio > 1 + SLOW:
            slow.append(run)
        print(
            f"| {label(run)} | {b['measured_s']:.2f} | {b['predicted_s']:.2f} | {ratio:.3f} "
            f"| {b['tp_collectives_s']:.2f} | {b['data_parallel_s']:.2f} "
            f"| {b['optimizer_s']:.3f} | {b['p2p_s']:.3f} | {b['peak_gib']:.1f} |"
        )
    rest = [r for r in steps if r not in slow]
    fast_ratios = [x for x in ratios if x <= 1 + SLOW]
    print(
        f"\n{len(slow)} rows more than {SLOW:.0%} slower than predicted; the other "
        f"{len(rest)}: measured / predicted {min(fast_ratios):.3f}-{max(fast_ratios):.3f}, "
        f"geometric mean {math.exp(statistics.fmean(math.log(x) for x in fast_ratios)):.3f}\n"
    )
    print("| fitted on | runs | RMS ln error before | after | fitted values |")
    print("|---|---|---|---|---|")
    print(fit_line("all step runs", hw, steps))
    print(fit_line(f"without the {len(slow)} slow rows", hw, rest))


if __name__ == "__main__":
    from _no_options import parse_no_options

    parse_no_options(__doc__, "benchmarks/residual_terms.py")
    main()
