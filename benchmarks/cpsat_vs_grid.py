"""CP-SAT refinement against the uniform grid, side by side.

    python benchmarks/cpsat_vs_grid.py

For each example (GPT-3 13B on 8, 96B on 32, 134B on 48 A100s, and a long-sequence GPT-3
30B at 4,096 tokens on 8 A100s) it plans the same request with ``method: grid`` and with
``method: cpsat`` and prints the best predicted throughput of each, their ratio, the cpsat
wall time, and what the refinement changed. Then every refinement the cpsat plans made
whose uniform version the grid rejected as out of memory.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.plan import plan  # noqa: E402
from planner.specs import Plan, PlanRequest  # noqa: E402

EXAMPLES = [
    "gpt3-13b-8xa100.json",
    "gpt3-96b-32xa100.json",
    "gpt3-134b-48xa100.json",
    "gpt3-30b-seq4096-8xa100.json",
]


def _request(name: str, method: str) -> PlanRequest:
    data = json.loads((ROOT / "examples" / name).read_text())
    data["search"]["method"] = method
    return PlanRequest.model_validate(data)


def _config(result: Plan) -> str:
    if result.best is None:
        return "nothing fits"
    c = result.best.config
    return f"t{c.t} p{c.p} d{c.d} mb{c.micro_batch_size} {c.recompute} {c.schedule}"


def main() -> None:
    print(
        "| example | grid best | grid samples/s | cpsat best | cpsat samples/s | ratio "
        "| cpsat wall s |"
    )
    print("|---|---|---|---|---|---|---|")
    rescued = []
    for name in EXAMPLES:
        grid = plan(_request(name, "grid"))
        started = time.perf_counter()
        cpsat = plan(_request(name, "cpsat"))
        wall = time.perf_counter() - started
        g = grid.best.predicted.samples_per_s if grid.best else 0.0
        c = cpsat.best.predicted.samples_per_s if cpsat.best else 0.0
        ratio = f"{c / g:.3f}" if g else "grid: none fits"
        print(
            f"| {name} | {_config(grid)} | {g:.3f} | {_config(cpsat)} | {c:.3f} | {ratio} "
            f"| {wall:.1f} |"
        )
        for candidate in cpsat.candidates:
            info = candidate.refinement
            if info is not None and info.uniform_iteration_time_s is None:
                rescued.append((name, candidate))
        if cpsat.best and cpsat.best.refinement:
            for change in cpsat.best.refinement.changes:
                print(f"|   best: {change} | | | | | | |")
    print("\nRefinements that make a grid-rejected (out of memory) configuration fit:\n")
    print("| example | config | uniform peak GiB | refined peak GiB | refined samples/s |")
    print("|---|---|---|---|---|")
    for name, candidate in rescued:
        c = candidate.config
        info = candidate.refinement
        assert info is not None
        print(
            f"| {name} | t{c.t} p{c.p} d{c.d} mb{c.micro_batch_size} {c.schedule} | "
            f"{info.uniform_peak_memory_gib:.1f} | {candidate.predicted.peak_memory_gib:.1f} | "
            f"{candidate.predicted.samples_per_s:.3f} |"
        )


if __name__ == "__main__":
    from _no_options import parse_no_options

    parse_no_options(__doc__, "benchmarks/cpsat_vs_grid.py")
    main()
