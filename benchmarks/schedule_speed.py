"""How fast every registered schedule is generated and validated, and one v-adaptive search.

    python benchmarks/schedule_speed.py [--repeats N] [--schedule NAME ...]

Issue 13's targets: generating and validating any registered schedule at 64 devices x 512
micro-batches under 0.5 s, and one v-adaptive search at 32 x 128 under 2 s (p50). For the
families that search (v-adaptive, zb-adaptive) the generation timed at 64 x 512 is their
rebuild of a chosen schedule (what the planner and a plan's launch artefacts do after the
search; the block or the limit is fixed). Every generation is cold: the V modules' caches
(the short builds long V runs insert periods into, the pass dependencies) are emptied before
each. The search is timed separately, cold too (its per-pipeline caches cleared before each
run), with Table 5's pass times (9.6B, micro-batch 4) and limits 0.5, 0.6, 0.8 and 1.

Each time is shown as wall clock and, beside it, this process's CPU time
(``time.process_time``): on a shared machine the wall clock also counts time other processes
took from it, the CPU time does not. ``--schedule`` times only the schedules named (the search
only when v-adaptive is one of them), to iterate on one family at a time.
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
    _vframe,  # noqa: E402
    _vshape,  # noqa: E402
    generate,
    schedule_family,
    validate,
)

TABLE_5 = PassTimes(12.96, 13.22, 9.76)
DEVICES, MICROBATCHES = 64, 512
SEARCHED = "v-adaptive"  # the family whose search is timed on its own


def _p50(runs: list[float]) -> str:
    return f"{statistics.median(runs):.3f} ({min(runs):.3f}-{max(runs):.3f})"


def _clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def generation(repeats: int, names: tuple[str, ...]) -> str:
    lines = [
        "| schedule | actions | generate p50 (min-max) s | validate p50 s | together p50 s "
        "| together CPU p50 s |",
        "|---|---|---|---|---|---|",
    ]
    for name in names:
        family = schedule_family(name)
        build = lambda name=name: generate(name, DEVICES, MICROBATCHES, check=False)  # noqa: E731
        if family.rebuild is not None:
            chosen = generate(
                name, DEVICES, 32, check=False, times=TABLE_5, **{MEMORY_LIMIT.name: 1.0}
            )
            choice = chosen.meta["choice"]
            build = lambda f=family, c=choice: f.rebuild(c, DEVICES, MICROBATCHES)  # type: ignore[misc]  # noqa: E731
        gen, val, both, cpu = [], [], [], []
        for _ in range(repeats):
            _empty_v_caches()
            started, started_cpu = _clocks()
            schedule = build()
            built = time.perf_counter()
            validate(schedule)
            done, done_cpu = _clocks()
            gen.append(built - started)
            val.append(done - built)
            both.append(done - started)
            cpu.append(done_cpu - started_cpu)
        actions = sum(len(row) for row in schedule.actions)
        lines.append(
            f"| {name} | {actions} | {_p50(gen)} | {_p50(val)} | {_p50(both)} | {_p50(cpu)} |"
        )
    return "\n".join(lines)


def _empty_v_caches() -> None:
    """Cold: every cache of the V modules is emptied, whichever they hold now (the search's
    blocks, their peaks and orders, the blocks screened so far, its choice per allowed stage
    activations; the fixed V schedules' short builds; the pass dependencies)."""
    for module in (_vadaptive, _vframe, _vshape):
        for value in vars(module).values():
            if callable(getattr(value, "cache_clear", None)):
                value.cache_clear()


def search(repeats: int) -> str:
    lines = [
        "| memory limit | search p50 (min-max) s | search CPU p50 s | blocks within | built |",
        "|---|---|---|---|---|",
    ]
    for limit in (0.5, 0.6, 0.8, 1.0):
        runs, cpu = [], []
        for _ in range(repeats):
            _empty_v_caches()
            started, started_cpu = _clocks()
            choice = _vadaptive.v_adaptive_choice(32, 128, limit, TABLE_5)
            done, done_cpu = _clocks()
            runs.append(done - started)
            cpu.append(done_cpu - started_cpu)
        lines.append(
            f"| {limit} | {_p50(runs)} | {_p50(cpu)} | {choice.candidates} | {choice.evaluated} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--schedule",
        action="append",
        choices=SCHEDULE_NAMES,
        help="time only this schedule (repeatable; default: every registered one)",
    )
    args = parser.parse_args()
    names = tuple(args.schedule or SCHEDULE_NAMES)
    print(f"Generation and validation at {DEVICES} devices x {MICROBATCHES} micro-batches:\n")
    print(generation(args.repeats, names))
    if SEARCHED in names:
        print(f"\nOne {SEARCHED} search at 32 devices x 128 micro-batches (cold):\n")
        print(search(args.repeats))


if __name__ == "__main__":
    main()
