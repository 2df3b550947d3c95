"""How fast the planner answers: the 1,024-GPU request.

    python benchmarks/planner_speed.py [--repeats N] [--every-schedule] [REQUEST.json]

Default request: examples/gpt3-175b-1024xa100.json (GPT-3 175B on 128 nodes x 8 A100,
global batch 1536, the eight schedules it names, recompute none/selective/full,
micro-batch sizes 1, 2, 4, 8). ``--every-schedule`` drops the request's ``schedules``, so
the search covers what a request without them does: every synchronous schedule of the
registry, 2BW where the request allows stale weights, and the two built for a memory limit.
Three figures:

- cold: a fresh Python process per run (imports excluded), so every schedule shape is built
  and counted from scratch, as for one `stagewright plan` call;
- warm: repeated requests in one process, as the service answers them: the schedules and
  in-flight counts of each (schedule, p, micro-batches) shape are cached per process;
- CLI: ``stagewright plan REQUEST.json`` end to end in a new process (interpreter start,
  imports, search and the printed table), what a person at a terminal waits for.

Reports the p50 (and min/max) of each, in wall-clock seconds and, for the search itself, in
CPU seconds of the planning process (``time.process_time``): on a machine shared with other
work the wall clock counts the time other processes held the cores, the CPU time much less so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.plan import plan  # noqa: E402
from planner.specs import PlanRequest  # noqa: E402

DEFAULT_REQUEST = ROOT / "examples" / "gpt3-175b-1024xa100.json"
_CHILD = """
import json, sys, time
sys.path.insert(0, {root!r})
from planner.plan import plan
from planner.specs import PlanRequest
request = PlanRequest.model_validate_json(open({path!r}).read())
started, cpu = time.perf_counter(), time.process_time()
result = plan(request)
print(json.dumps({{"seconds": time.perf_counter() - started, "cpu": time.process_time() - cpu,
                  "evaluated": result.stats.evaluated, "feasible": result.stats.feasible}}))
"""


def cold_runs(path: Path, repeats: int) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of the search in a fresh process, ``repeats`` times."""
    seconds, cpu = [], []
    for _ in range(repeats):
        code = _CHILD.format(root=str(ROOT), path=str(path))
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        )
        measured = json.loads(out.stdout)
        seconds.append(measured["seconds"])
        cpu.append(measured["cpu"])
    return seconds, cpu


def cli_runs(path: Path, repeats: int) -> list[float]:
    code = "import sys; from cli.main import main; sys.exit(main())"
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-c", code, "plan", str(path)],
            capture_output=True,
            check=True,
            cwd=ROOT,
        )
        seconds.append(time.perf_counter() - started)
    return seconds


def warm_runs(request: PlanRequest, repeats: int) -> tuple[list[float], list[float], int, int]:
    """Wall and CPU seconds of repeated searches in this process (caches filled first)."""
    result = plan(request)  # fills the per-process caches
    seconds, cpu = [], []
    for _ in range(repeats):
        started, cpu_started = time.perf_counter(), time.process_time()
        result = plan(request)
        seconds.append(time.perf_counter() - started)
        cpu.append(time.process_time() - cpu_started)
    return seconds, cpu, result.stats.evaluated, result.stats.feasible


def _row(label: str, runs: list[float]) -> str:
    return (
        f"| {label} | {len(runs)} | {statistics.median(runs):.2f} | {min(runs):.2f} | "
        f"{max(runs):.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("request", nargs="?", type=Path, default=DEFAULT_REQUEST)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--every-schedule",
        action="store_true",
        help="search every default schedule (the request's schedules list dropped)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        path = args.request
        if args.every_schedule:
            body = json.loads(path.read_text())
            body.get("search", {}).pop("schedules", None)
            path = Path(scratch) / "every-schedule.json"
            path.write_text(json.dumps(body))
        request = PlanRequest.model_validate_json(path.read_text())
        cold, cold_cpu = cold_runs(path, args.repeats)
        warm, warm_cpu, evaluated, feasible = warm_runs(request, args.repeats)
        cli = cli_runs(path, args.repeats)
    gpus = request.cluster.num_gpus
    schedules = len(request.search.schedules)
    print(
        f"{request.model.name} on {gpus} x {request.cluster.gpu}, {schedules} schedules: "
        f"{evaluated} candidates evaluated, {feasible} fit\n"
    )
    print("| run | n | p50 (s) | min (s) | max (s) |")
    print("|---|---|---|---|---|")
    print(_row("cold (new process)", cold))
    print(_row("cold, CPU seconds", cold_cpu))
    print(_row("warm (same process)", warm))
    print(_row("warm, CPU seconds", warm_cpu))
    print(_row("CLI end to end (new process, imports included)", cli))


if __name__ == "__main__":
    main()
