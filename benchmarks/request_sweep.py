"""A randomized sweep of plan requests: does the planner answer every valid one?

    python benchmarks/request_sweep.py [--seed S] [--requests N]

Each request is one of ``examples/*.json`` (those under 16,384 GPUs) with its search and
training mutated at random: the schedules (any subset), recompute modes, runtime, micro-batch
sizes, top_k, grid or CP-SAT, context-parallel degrees, sequence parallelism, flash
attention, the distributed optimizer, precision, global batch, nodes, GPUs per node, layers,
sequence length and query groups. A mutation the request model refuses is skipped (that is
validation working). Every schedule the planner builds, for memory counting or for timing,
is checked against the IR's rules, the launch files of the ranked candidates are built
as ``--emit`` builds them, and the best candidate's timeline as ``--timeline`` and the
dashboard's Gantt chart build it.

A refusal with a message (a :class:`planner.errors.StagewrightError` other than an invalid
schedule) is a clean answer and is counted; any other exception, or a schedule that breaks
an IR rule, is a crash and is printed with its request. Exits 1 when any request crashed.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pydantic import ValidationError  # noqa: E402

import planner.costmodel.evaluate as evaluate  # noqa: E402
import planner.costmodel.shapes as shapes  # noqa: E402
from planner.errors import InvalidScheduleError, StagewrightError  # noqa: E402
from planner.launch.files import launch_files  # noqa: E402
from planner.plan import plan  # noqa: E402
from planner.schedules import SCHEDULE_NAMES, schedule_family  # noqa: E402
from planner.schedules._validate import validate  # noqa: E402
from planner.search.timeline import candidate_timeline  # noqa: E402
from planner.specs import PlanRequest  # noqa: E402


def _validate_every_schedule() -> None:
    """Build every schedule the search prices with ``check=True`` (the search builds them
    unchecked, for speed) and validate the ones it compiles for timing."""
    compile_schedule, generate = evaluate.compile_schedule, shapes.generate
    evaluate.compile_schedule = lambda schedule: compile_schedule(validate(schedule))  # type: ignore[assignment]
    shapes.generate = lambda *a, **k: generate(*a, **{**k, "check": True})  # type: ignore[assignment]


def mutated(rng: random.Random, example: dict[str, Any]) -> dict[str, Any]:
    """A random variation of an example request (it may not validate)."""
    data: dict[str, Any] = json.loads(json.dumps(example))
    search = data.setdefault("search", {})
    stale = rng.random() < 0.3
    names = [n for n in SCHEDULE_NAMES if stale or schedule_family(n).semantics == "synchronous"]
    search.update(
        allow_stale_weights=stale,
        schedules=rng.sample(names, rng.randint(1, len(names))),
        recompute=rng.sample(["none", "selective", "full"], rng.randint(1, 3)),
        runtime=rng.choice(["any", "any", "stagewright", "megatron", "torch"]),
        micro_batch_sizes=rng.choice([None, [1], [1, 2], [2, 4, 8], [3], [16]]),
        top_k=rng.choice([1, 5, 30]),
        method="cpsat" if rng.random() < 0.15 else "grid",
    )
    if search["method"] == "cpsat":  # the grid has no time budget (and refuses one)
        search["time_limit_s"] = 2.0
    if rng.random() < 0.3:
        search["context_parallel"] = rng.choice([[1], [1, 2], [2, 4]])
    training = data["training"]
    for flag in ("sequence_parallel", "flash_attention", "distributed_optimizer"):
        if rng.random() < 0.3:
            training[flag] = not training.get(flag, False)
    if rng.random() < 0.3:
        training["global_batch_size"] = rng.choice([8, 12, 96, 100, 1000, 4096])
    if rng.random() < 0.2:
        training["precision"] = rng.choice(["fp16", "bf16", "fp32"])
    cluster = data["cluster"]
    if rng.random() < 0.3:
        cluster["num_nodes"] = rng.choice([1, 2, 3, 5, 12])
    if rng.random() < 0.3:
        cluster["gpus_per_node"] = rng.choice([1, 2, 4, 16])
    model = data["model"]
    if rng.random() < 0.4:
        model["num_layers"] = rng.choice([3, 7, 13, 30, 47, 95])
    if rng.random() < 0.2:
        model["seq_length"] = rng.choice([512, 4096, 32768])
    if rng.random() < 0.2 and model.get("num_query_groups") is None:
        model["num_query_groups"] = rng.choice([1, 2, 8])
    return data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    _validate_every_schedule()
    rng = random.Random(args.seed)
    examples = [
        json.loads(path.read_text())
        for path in sorted((ROOT / "examples").glob("*.json"))
        if "16384" not in path.name
    ]
    answered = refused = invalid = 0
    crashes = []
    started = time.perf_counter()
    for _ in range(args.requests):
        data = mutated(rng, rng.choice(examples))
        try:
            request = PlanRequest.model_validate(data)
        except ValidationError:
            invalid += 1
            continue
        try:
            result = plan(request)
        except InvalidScheduleError:
            crashes.append((data, traceback.format_exc(limit=8)))
            continue
        except StagewrightError:
            refused += 1
            continue
        except Exception:  # noqa: BLE001 - a crash is what this sweep looks for
            crashes.append((data, traceback.format_exc(limit=8)))
            continue
        # The request was answered: anything that fails from here on, refusals included,
        # is a bug in stagewright (the plan's own candidates must launch and draw).
        try:
            launch_files(result)
            if result.best is not None:
                candidate_timeline(request, result.best.config)
            answered += 1
        except Exception:  # noqa: BLE001
            crashes.append((data, traceback.format_exc(limit=8)))
    for data, trace in crashes:
        print(f"CRASH on {json.dumps(data)}\n{trace}")
    print(
        f"seed {args.seed}: {args.requests} requests in {time.perf_counter() - started:.0f} s: "
        f"{answered} answered, {refused} refused with a message, {invalid} invalid "
        f"(skipped), {len(crashes)} crashed"
    )
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
