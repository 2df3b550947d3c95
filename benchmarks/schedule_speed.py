"""How fast every registered schedule is generated and validated, and one v-adaptive search.

    python benchmarks/schedule_speed.py [--repeats N]

Issue 13's targets: generating and validating any registered schedule at 64 devices x 512
micro-batches under 0.5 s, and one v-adaptive search at 32 x 128 under 2 s (p50). For the
families that search (v-adaptive, zb-adaptive) the generation timed at 64 x 512 is their
rebuild of a chosen schedule (what the planner and a plan's launch artefacts do after the
search; the block or the limit is fixed); the search itself is timed separately, cold (its
per-pipeline caches cleared before each run), with Table 5's pass times (9.6B, micro-batch
4) and limits 0.5, 0.6, 0.8 and 1.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.schedules import (  # noqa: E402
    MEMORY_LIMIT,
    SCHEDULE_NAMES,
    PassTimes,
    _vadaptive,  # noqa: E402
    generate,
    schedule_family,
    validate,
)

TABLE_5 = PassTimes(12.96, 13.22, 9.76)
DEVICES, MICROBATCHES = 64, 512


def _p50(runs: list[float]) -> str:
    return f"{statistics.median(runs):.3f} ({min(runs):.3f}-{max(runs):.3f})"


def generation(repeats: int) -> str:
    lines = [
        "| schedule | actions | generate p50 (min-max) s | validate p50 s | together p50 s |",
        "|---|---|---|---|---|",
    ]
    for name in SCHEDULE_NAMES:
        family = schedule_family(name)
        build = lambda name=name: generate(name, DEVICES, MICROBATCHES, check=False)  # noqa: E731
        if family.rebuild is not None:
            chosen = generate(
                name, DEVICES, 32, check=False, times=TABLE_5, **{MEMORY_LIMIT.name: 1.0}
            )
            choice = chosen.meta["choice"]
            build = lambda f=family, c=choice: f.rebuild(c, DEVICES, MICROBATCHES)  # type: ignore[misc]  # noqa: E731
        gen, val, both = [], [], []
        for _ in range(repeats):
            started = time.perf_counter()
            schedule = build()
            built = time.perf_counter()
            validate(schedule)
            done = time.perf_counter()
            gen.append(built - started)
            val.append(done - built)
            both.append(done - started)
        actions = sum(len(row) for row in schedule.actions)
        lines.append(f"| {name} | {actions} | {_p50(gen)} | {_p50(val)} | {_p50(both)} |")
    return "\n".join(lines)


def search(repeats: int) -> str:
    lines = [
        "| memory limit | search p50 (min-max) s | blocks within | built |",
        "|---|---|---|---|",
    ]
    for limit in (0.5, 0.6, 0.8, 1.0):
        runs = []
        for _ in range(repeats):
            _vadaptive._space.cache_clear()
            _vadaptive._peaks.cache_clear()
            started = time.perf_counter()
            choice = _vadaptive.v_adaptive_choice(32, 128, limit, TABLE_5)
            runs.append(time.perf_counter() - started)
        lines.append(f"| {limit} | {_p50(runs)} | {choice.candidates} | {choice.evaluated} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"Generation and validation at {DEVICES} devices x {MICROBATCHES} micro-batches:\n")
    print(generation(args.repeats))
    print("\nOne v-adaptive search at 32 devices x 128 micro-batches (cold):\n")
    print(search(args.repeats))


if __name__ == "__main__":
    main()
