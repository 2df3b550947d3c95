"""Where V-ZB's CPU goes: stagewright's executor and torch's ScheduleZBVZeroBubble under cProfile.

    .venv/bin/python benchmarks/profile_vzb.py            # about 2 minutes on 2 cores

Runs the executor benchmark's model (``benchmarks/executor_vs_torch.py``: hidden 256, 8 layers,
seq 128, 8 micro-batches, fp32, 2 ranks, one thread each) once per side with every rank under
``cProfile`` timed in CPU seconds (``time.process_time``: other processes on a shared machine
do not count), and prints per rank the CPU seconds of each part of a step, side by side:
forward, input gradient (B / I), weight gradient (W), the optimizer step, and what
stagewright does that torch does not (the saved-activation ledger's hooks, which every run
uses to measure its peak and BPipe to move activations). Over all steps, the warm-up included;
cProfile's own cost inflates Python-heavy parts on both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.executor_vs_torch import TORCH_WORKER, make_config  # noqa: E402
from executor.launcher import torchrun_command  # noqa: E402

# A rank's process runs the worker under cProfile with a CPU clock, then dumps its stats.
# stagewright's worker ends each rank with os._exit (no interpreter teardown), which skips
# the wrapper's `finally`: os._exit is wrapped to dump the stats first.
_WRAPPER = """
import cProfile, os, runpy, sys, time
prefix, rest = sys.argv[1], sys.argv[2:]
profile = cProfile.Profile(time.process_time)
path = f"{prefix}.rank{os.environ.get('RANK', '0')}.prof"
hard_exit = os._exit
def dump_then_exit(status):
    profile.disable()
    profile.dump_stats(path)
    hard_exit(status)
os._exit = dump_then_exit
if rest[0] == "-m":
    sys.argv = [rest[1], *rest[2:]]
    target = lambda: runpy.run_module(rest[1], run_name="__main__")
else:
    sys.argv = rest
    target = lambda: runpy.run_path(rest[0], run_name="__main__")
profile.enable()
try:
    target()
except SystemExit:
    pass
finally:
    profile.disable()
    profile.dump_stats(path)
"""

Where = tuple[str, str]  # (file name ending, function name)

# (part, stagewright's functions, torch's): the sum of their cumulative CPU seconds.
PARTS: list[tuple[str, list[Where], list[Where]]] = [
    ("forward", [("interpreter.py", "_forward")], [("stage.py", "forward_one_chunk")]),
    (
        "B: input gradient",
        [("interpreter.py", "_backward_input")],
        [("stage.py", "backward_one_chunk")],
    ),
    (
        "W: weight gradients",
        [("interpreter.py", "_backward_weight")],
        [("stage.py", "backward_weight_one_chunk")],
    ),
    ("optimizer step", [("interpreter.py", "_optimizer_step")], [("sgd.py", "step")]),
    (
        "in B: graph walk and prehooks",
        [
            ("split_backward.py", "_reverse_edges"),
            ("split_backward.py", "_closure"),
            ("split_backward.py", "record"),
        ],
        [
            ("_backward.py", "construct_reverse_graph"),
            ("_backward.py", "get_param_groups"),
            ("_backward.py", "hook"),
        ],
    ),
    ("saved-activation ledger hooks", [("ledger.py", "pack"), ("ledger.py", "unpack")], []),
    (
        "the whole step",
        [("interpreter.py", "run")],
        [("schedules.py", "step"), ("sgd.py", "step")],
    ),
]


def _cumulative(stats: pstats.Stats, functions: list[Where]) -> float:
    total = 0.0
    table = stats.stats  # type: ignore[attr-defined]
    for ending, wanted in functions:
        total += max(
            (
                cumulative
                for (path, _, name), (_, _, _, cumulative, _) in table.items()
                if path.endswith(ending) and name == wanted
            ),
            default=0.0,
        )
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args(argv)
    model = {
        "name": "bench-gpt",
        "num_layers": 8,
        "hidden_size": 256,
        "num_attention_heads": 8,
        "seq_length": 128,
        "vocab_size": 1024,
    }
    env = {
        **os.environ,
        "GLOO_SOCKET_IFNAME": "lo",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    with tempfile.TemporaryDirectory(prefix="profile-vzb-") as tmp:
        work = Path(tmp)
        config = work / "v-zb.json"
        config.write_text(json.dumps(make_config("v-zb", 2, 8, model)))
        wrapper = work / "wrapper.py"
        wrapper.write_text(_WRAPPER)
        for side, target in (
            ("sw", ["-m", "executor.worker"]),
            ("torch", [str(TORCH_WORKER)]),
        ):
            command = torchrun_command(
                2,
                str(wrapper),
                str(work / side),
                *target,
                str(config),
                "--steps",
                str(args.steps),
                "--out",
                str(work / f"{side}-out"),
            )
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                print(done.stderr[-2000:])
                return 1
        print(f"CPU seconds over {args.steps} steps (cProfile, process_time), v-zb at 2 ranks\n")
        print("| part | " + " | ".join(f"rank {r}: stagewright / torch" for r in (0, 1)) + " |")
        print("|---|---|---|")
        stats = {
            (side, r): pstats.Stats(str(work / f"{side}.rank{r}.prof"))
            for side in ("sw", "torch")
            for r in (0, 1)
        }
        for label, mine, theirs in PARTS:
            cells = []
            for r in (0, 1):
                a = _cumulative(stats["sw", r], mine)
                b = _cumulative(stats["torch", r], theirs)
                cells.append(f"{a:.3f} / {b:.3f}" if theirs else f"{a:.3f} / -")
            print(f"| {label} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
