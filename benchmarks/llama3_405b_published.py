"""What the planner predicts for Llama 3 405B's published configuration, and what it picks.

    python benchmarks/llama3_405b_published.py

The request is ``examples/llama3-405b-16384xh100.json`` (16,384 H100, global batch 2,048 x
8,192 tokens, Megatron-LM-style 1F1B and interleaved). The Llama 3 paper (Table 4) trained
it at TP 8, CP 1, PP 16, DP 128, reporting 41% BF16 MFU. This takes that configuration from
the planner's grid (interleaved, micro-batch 1, no recomputation, layers spread by the
grid's rule), prices it with the bundled, uncalibrated H100 profile, simulated like any
ranked candidate, and prints its step time, MFU and per-GPU memory against the usable
memory; then the plan's own best. The times are the model's, not measured: the H100 profile
has no calibration data.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.costmodel.evaluate import PlanContext, price  # noqa: E402
from planner.costmodel.memory import GIB  # noqa: E402
from planner.plan import plan  # noqa: E402
from planner.profiles import default_store  # noqa: E402
from planner.search.grid import enumerate_space  # noqa: E402
from planner.specs import PlanRequest  # noqa: E402

REQUEST = ROOT / "examples" / "llama3-405b-16384xh100.json"
# Llama 3 paper, Table 4: (t, cp, p, d), micro-batch size, schedule, recomputation
PUBLISHED = ((8, 1, 16, 128), 1, "interleaved", "none")


def main() -> None:
    request = PlanRequest.model_validate_json(REQUEST.read_text())
    ctx = PlanContext.from_store(request, default_store())
    space = enumerate_space(ctx, ctx.hardware.usable_memory_gib * GIB)
    (found,) = [
        est
        for est in space.feasible + space.over_memory
        if (
            (est.config.t, est.config.cp, est.config.p, est.config.d),
            est.config.micro_batch_size,
            est.config.schedule,
            est.config.recompute,
        )
        == PUBLISHED
    ]
    priced = price(ctx, found)
    c = found.config
    usable = ctx.hardware.usable_memory_gib
    peak = found.peak_memory / GIB
    print(
        f"published (t {c.t}, cp {c.cp}, p {c.p}, d {c.d}, {c.schedule}, micro-batch "
        f"{c.micro_batch_size}, no recomputation): {priced.iteration_time_s:.2f} s a step, "
        f"{priced.mfu:.1%} MFU, peak {peak:.1f} GiB per GPU against {usable:.1f} usable"
        + (" (does not fit)" if peak > usable else "")
    )
    best = plan(request).best
    assert best is not None
    c = best.config
    print(
        f"planned best: t {c.t}, cp {c.cp}, p {c.p}, d {c.d}, {c.schedule}, micro-batch "
        f"{c.micro_batch_size}, recompute {c.recompute}: "
        f"{best.predicted.iteration_time_s:.2f} s a step, {best.predicted.mfu:.1%} MFU, "
        f"peak {best.predicted.peak_memory_gib:.1f} GiB"
    )


if __name__ == "__main__":
    from _no_options import parse_no_options

    parse_no_options(__doc__, "benchmarks/llama3_405b_published.py")
    main()
