"""Bubble fraction and peak activation of every schedule, and the simulator's speed.

    python benchmarks/schedules.py            # the README's table (about a minute)

F/B/W times are the V-shape paper's Table 5 (Qi et al. 2024, Appendix D.2: single-pass
times of the 9.6B model at micro-batch size 4: F 12.96 ms, B 13.22 ms, W 9.76 ms). They are
times of one V-shape stage (half of a device's layers), so schedules with one stage per
device get twice that per stage, interleaved (2 chunks) the same as V. Schedules without a
B/W split run B+W as one backward. Micro-batches: 4 x devices (a multiple of d, as
interleaved needs). Peak activation is in micro-batches of the whole model (1F1B = 1.0).
The families built for a memory limit (v-adaptive, zb-adaptive) are built at
``ADAPTIVE_LIMIT`` of 1F1B's peak for these times; their generation, a search, is timed by
``benchmarks/schedule_speed.py`` rather than in the speed table here.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.costmodel.adaptive import built_for_a_limit  # noqa: E402
from planner.schedules import (  # noqa: E402
    MEMORY_LIMIT,
    SCHEDULE_NAMES,
    PassTimes,
    Schedule,
    generate,
    schedule_family,
)
from planner.simulate import Durations, simulate  # noqa: E402

F_MS, B_MS, W_MS = 12.96, 13.22, 9.76  # Table 5, 9.6B, micro-batch 4
ADAPTIVE_LIMIT = 0.5  # of 1F1B's peak: V-Half's memory, for the families built for a limit


def build(name: str, devices: int, microbatches: int) -> Schedule:
    """``name`` with its defaults; a family built for a memory limit at ``ADAPTIVE_LIMIT``,
    searched under Table 5's times."""
    if not built_for_a_limit(name):
        return generate(name, devices, microbatches, check=False)
    return generate(
        name,
        devices,
        microbatches,
        check=False,
        times=PassTimes(F_MS, B_MS, W_MS),
        **{MEMORY_LIMIT.name: ADAPTIVE_LIMIT},
    )


def label(name: str) -> str:
    return f"{name} (limit {ADAPTIVE_LIMIT})" if built_for_a_limit(name) else name


def durations_for(name: str) -> Durations:
    """Table 5's times are per V stage (half a device's layers): a family with one stage a
    device runs twice that per stage."""
    scale = 1.0 if schedule_family(name).stages_per_device() > 1 else 2.0
    return Durations(F_MS * scale, B_MS * scale, W_MS * scale)


def table() -> str:
    lines = [
        "| schedule | "
        + " | ".join(f"d={d} bubble | d={d} peak act." for d in (4, 8, 16, 32))
        + " |",
        "|---|" + "---|---|" * 4,
    ]
    for name in SCHEDULE_NAMES:
        cells = []
        for d in (4, 8, 16, 32):
            result = simulate(build(name, d, 4 * d), durations_for(name))
            cells += [f"{result.bubble_fraction:.3f}", f"{max(result.peak_activation):.3f}"]
        lines.append(f"| {label(name)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def speed(devices: int = 64, microbatches: int = 512, repeats: int = 3) -> str:
    lines = [
        f"| schedule | actions | generate (s) | simulate p50 of {repeats} (s) |",
        "|---|---|---|---|",
    ]
    for name in SCHEDULE_NAMES:
        if built_for_a_limit(name):
            continue  # a search per limit: benchmarks/schedule_speed.py times it
        started = time.perf_counter()
        schedule = generate(name, devices, microbatches, check=False)
        generated = time.perf_counter() - started
        runs = []
        for _ in range(repeats):
            started = time.perf_counter()
            simulate(schedule, durations_for(name))
            runs.append(time.perf_counter() - started)
        actions = sum(len(row) for row in schedule.actions)
        lines.append(f"| {name} | {actions} | {generated:.2f} | {statistics.median(runs):.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    from _no_options import parse_no_options

    parse_no_options(__doc__, "benchmarks/schedules.py")
    print("Bubble fraction and peak activation (Table 5 times, m = 4d):\n")
    print(table())
    print("\nSimulator speed, 64 devices x 512 micro-batches:\n")
    print(speed())
