"""stagewright's executor against torch.distributed.pipelining on the same model and ranks.

    .venv/bin/python benchmarks/executor_vs_torch.py              # about 3 minutes on 2 cores
    .venv/bin/python benchmarks/executor_vs_torch.py --pairs 5 --steps 6   # tighter timings

Compares stagewright's ``1f1b`` with torch's ``Schedule1F1B``, ``interleaved`` (2 stages per
rank) with ``ScheduleInterleaved1F1B`` and ``v-zb`` with ``ScheduleZBVZeroBubble``: one GPT
(hidden 256, 8 layers, 8 heads, seq 128, vocab 1024 by default), the same full weights
(``executor.model.init_full_weights``), the same layer split
(``planner.costmodel.evaluate.split_layers``), the same stage -> rank placement (V placement
for ZBV: rank r holds stages r and 2p-1-r), the same batches, micro-batch size 1, 8
micro-batches, gloo on loopback, one thread per rank, and the same plain SGD update after the
backward. The torch side runs ``benchmarks/_pipelining_worker.py`` on the very executor config
the stagewright side runs with ``executor.worker``; the first step's losses of both sides are
compared as a check that the two compute the same thing.

1. Timing, at 2 ranks only: this machine has 2 cores, and with more ranks than cores the ranks
   share cores, so wall time tracks total work rather than pipeline bubbles. Runs alternate
   stagewright / torch (A B A B ...), ``--pairs`` pairs per comparison; each run does one
   warm-up step (torch infers shapes there) and ``--steps`` timed steps. Per run: wall time per
   step (the slowest rank's, median over the timed steps), CPU seconds and busy seconds per rank
   per step (mean over ranks, median over steps). Reported: each run's wall time, and the median
   over pairs of the ratio stagewright / torch of wall time and of CPU seconds. Other processes
   on the machine inflate wall times, so CPU seconds are the steadier figure.
2. Saved-activation memory, at 4 ranks (deterministic, so one run per side): the peak bytes of
   saved activations per rank over the second step. stagewright reports its ledger; for torch
   the worker counts unique non-parameter storages saved for backward and still alive, with
   ``torch.autograd.graph.saved_tensors_hooks`` around ``schedule.step`` (the pack hook returns a
   holder of a detached alias; ``weakref.finalize`` on the holder sees autograd let go).
3. Backward split cost, in this process: one middle stage of a ZBV split at 2 ranks (2 layers by
   default), the time of a full backward against stagewright's B + W
   (``executor.split_backward``: B records the gradient at each node where a weight branch
   leaves the input path, W starts there) and torch's I + W
   (``stage_backward_input`` keeps the gradients at the nodes where the weight paths branch off,
   ``stage_backward_weight`` starts from there); then where stagewright is slower, and how much
   of the v-zb difference this split predicts.
4. stagewright against the planner (``benchmarks/_predicted_vs_measured.py``): saved
   activations per rank against the prediction with each recompute mode, and the step time of
   1f1b, 2bw and v-zb against the prediction after profiling the exact layer shape here.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._predicted_vs_measured import (  # noqa: E402
    cpu_candidate,
    memory_against_prediction,
    step_time_against_prediction,
)
from executor.launcher import torchrun_command  # noqa: E402
from executor.reporting import REPORT_FILE  # noqa: E402
from planner.costmodel.evaluate import split_layers  # noqa: E402
from planner.launch import RunReport, build_executor_config  # noqa: E402
from planner.placement import place  # noqa: E402

TORCH_WORKER = Path(__file__).resolve().parent / "_pipelining_worker.py"
TORCH_NAME = {
    "1f1b": "Schedule1F1B",
    "interleaved": "ScheduleInterleaved1F1B",
    "v-zb": "ScheduleZBVZeroBubble",
}
LR = 0.05


def make_config(
    schedule: str, p: int, m: int, model: dict[str, Any], *, mb: int = 1
) -> dict[str, Any]:
    """An executor config the way a plan builds it (as tests/executor/configs.py does)."""
    request, config = cpu_candidate(model, schedule, p, m, mb=mb)
    document = build_executor_config(request, config, place(1, p, 1, p))
    data = document.materialized().model_dump(mode="json")
    data["optimizer"]["lr"] = LR
    data["dropout"] = 0.0  # as the comparisons were first measured (both sides take dropout)
    return data


class RunFailed(RuntimeError):
    pass


def _torchrun(side: str, config: Path, nproc: int, steps: int, out: Path, *extra: str) -> None:
    """One torchrun of ``side`` ("stagewright" or "torch") writing its reports to ``out``."""
    target = ["-m", "executor.worker"] if side == "stagewright" else [str(TORCH_WORKER)]
    command = torchrun_command(
        nproc, *target, str(config), "--steps", str(steps), "--out", str(out), *extra
    )
    env = {
        **os.environ,
        "GLOO_SOCKET_IFNAME": "lo",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    try:
        done = subprocess.run(
            command,
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise RunFailed(f"{side} on {nproc} ranks timed out after {exc.timeout:g}s") from exc
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise RunFailed(f"{side} on {nproc} ranks exited {done.returncode}:\n{tail}")


def run_report(config: Path, nproc: int, steps: int, out: Path) -> RunReport:
    """stagewright's executor on ``config``; its run report."""
    _torchrun("stagewright", config, nproc, steps, out)
    return RunReport.model_validate_json((out / REPORT_FILE).read_text())


def launch(side: str, config: Path, nproc: int, steps: int, out: Path, *extra: str) -> list[dict]:
    """One run of ``side``; per rank, its steps' figures (the same keys on both sides)."""
    if side == "torch":
        _torchrun(side, config, nproc, steps, out, *extra)
        return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]
    report = run_report(config, nproc, steps, out)
    return [
        {
            "rank": r.rank,
            "steps": [
                {
                    "wall_s": s.wall_s,
                    "cpu_s": s.cpu_s,
                    "busy_s": s.busy_s,
                    "losses": s.losses,
                    "peak_activation_bytes": s.peak_saved_activation_bytes,
                }
                for s in r.steps
            ],
        }
        for r in report.ranks
    ]


def summarise(reports: list[dict]) -> dict[str, float]:
    """The warm-up step is skipped. Per timed step: wall = the slowest rank's, CPU and busy =
    the mean over ranks; a run's figure is the median over its timed steps."""
    steps = list(zip(*(r["steps"][1:] for r in reports), strict=True))
    return {
        "wall": statistics.median(max(s["wall_s"] for s in ranks) for ranks in steps),
        "cpu": statistics.median(statistics.fmean(s["cpu_s"] for s in ranks) for ranks in steps),
        "busy": statistics.median(statistics.fmean(s["busy_s"] for s in ranks) for ranks in steps),
    }


def check_losses(what: str, sw: list[dict], th: list[dict], notes: list[str]) -> None:
    """Both sides' losses of every step (one per micro-batch, on the last stage's rank): the
    first step checks the forward, later ones the gradients and the SGD update too."""
    a = [x for r in sw for s in r["steps"] for x in s["losses"]]
    b = [x for r in th for s in r["steps"] for x in s["losses"]]
    steps = len(sw[0]["steps"])
    if a and len(a) == len(b):
        diff = max(abs(x - y) for x, y in zip(a, b, strict=True))
        notes.append(
            f"{what}: the losses of all {steps} steps x {len(a) // steps} micro-batches agree "
            f"to {diff:.1e} (first step's mean {statistics.fmean(a[: len(a) // steps]):.4f})"
        )
    else:
        notes.append(f"{what}: could not compare losses ({len(a)} vs {len(b)} values)")


def timing(
    configs: dict[str, Path], pairs: int, steps: int, work: Path, notes: list[str]
) -> tuple[list[str], dict[str, dict[str, float]]]:
    lines = [
        "| comparison (2 ranks) | stagewright (A) wall/step (s), per run | torch (B) wall/step "
        "(s), per run | median wall ratio A/B | median CPU/rank/step ratio A/B | "
        "CPU/rank/step (s) A / B | busy/rank/step (s) A / B |",
        "|---|---|---|---|---|---|---|",
    ]
    results: dict[str, dict[str, float]] = {}
    for name, config in configs.items():
        runs: dict[str, list[dict[str, float]]] = {"stagewright": [], "torch": []}
        first: dict[str, list[dict]] = {}
        try:
            for i in range(pairs):
                for side in ("stagewright", "torch"):
                    reports = launch(side, config, 2, steps + 1, work / f"time-{name}-{side}-{i}")
                    runs[side].append(summarise(reports))
                    first.setdefault(side, reports)
        except RunFailed as exc:
            notes.append(f"timing {name}: {exc}")
            lines.append(f"| {name} vs {TORCH_NAME[name]} | failed (see notes) | | | | | |")
            continue
        check_losses(f"{name} at 2 ranks", first["stagewright"], first["torch"], notes)
        sw, th = runs["stagewright"], runs["torch"]

        def med(key: str, runs: list[dict[str, float]]) -> float:
            return statistics.median(r[key] for r in runs)

        result = {
            "wall": statistics.median(a["wall"] / b["wall"] for a, b in zip(sw, th, strict=True)),
            "cpu": statistics.median(a["cpu"] / b["cpu"] for a, b in zip(sw, th, strict=True)),
            "cpu_sw": med("cpu", sw),
            "cpu_torch": med("cpu", th),
        }
        results[name] = result
        walls_sw = ", ".join(f"{r['wall']:.3f}" for r in sw)
        walls_th = ", ".join(f"{r['wall']:.3f}" for r in th)
        lines.append(
            f"| {name} vs {TORCH_NAME[name]} | {walls_sw} | {walls_th} | {result['wall']:.2f} | "
            f"{result['cpu']:.2f} | {med('cpu', sw):.3f} / {med('cpu', th):.3f} | "
            f"{med('busy', sw):.3f} / {med('busy', th):.3f} |"
        )
    return lines, results


def memory(configs: dict[str, Path], work: Path, notes: list[str]) -> list[str]:
    lines = [
        "| schedule (4 ranks) | rank | stagewright peak saved act. (MiB) | torch (MiB) | "
        "stagewright / torch | torch - stagewright (KiB) |",
        "|---|---|---|---|---|---|",
    ]
    for name, config in configs.items():
        try:
            sw = launch("stagewright", config, 4, 2, work / f"mem-{name}-sw")
            th = launch("torch", config, 4, 2, work / f"mem-{name}-torch", "--count-memory")
        except RunFailed as exc:
            notes.append(f"memory {name}: {exc}")
            lines.append(f"| {name} vs {TORCH_NAME[name]} | failed (see notes) | | | | |")
            continue
        check_losses(f"{name} at 4 ranks", sw, th, notes)
        for rank in range(4):
            a = sw[rank]["steps"][-1]["peak_activation_bytes"]
            b = th[rank]["steps"][-1]["peak_activation_bytes"]
            held = th[rank]["steps"][-1]["start_activation_bytes"]
            if held:
                notes.append(
                    f"memory {name} rank {rank}: torch already held {held} saved bytes when "
                    "the measured step began"
                )
            ratio = f"{a / b:.4f}" if b else "n/a"
            lines.append(
                f"| {name} vs {TORCH_NAME[name]} | {rank} | {a / 2**20:.3f} | {b / 2**20:.3f} | "
                f"{ratio} | {(b - a) / 2**10:+.1f} |"
            )
    return lines


def backward_split(
    model: dict[str, Any], layers: int, repeats: int
) -> tuple[list[str], dict[str, float]]:
    """Time full backward, stagewright's B + W and torch's I + W on one middle stage."""
    import torch
    from torch.distributed.pipelining import _backward as pipe_backward

    from executor.dropout import DropoutKey
    from executor.model import GPTShape, build_stage, init_full_weights
    from executor.split_backward import backward_input, backward_weight

    torch.set_num_threads(1)
    shape = GPTShape(
        vocab_size=model["vocab_size"],
        seq_length=model["seq_length"],
        hidden_size=model["hidden_size"],
        num_heads=model["num_attention_heads"],
        ffn_hidden_size=4 * model["hidden_size"],
        num_layers=model["num_layers"],
    )
    stage = build_stage(shape, init_full_weights(shape), 1, 1 + layers, embed=False, head=False)
    params = list(stage.parameters())
    gen = torch.Generator().manual_seed(0)
    x0 = torch.randn(shape.seq_length, 1, shape.hidden_size, generator=gen)
    g = torch.randn(shape.seq_length, 1, shape.hidden_size, generator=gen)
    key = DropoutKey(0, 0, 0)

    def forward() -> tuple[torch.Tensor, torch.Tensor]:
        x = x0.clone().requires_grad_(True)
        return x, stage(x, key)

    def full() -> list[float]:
        x, out = forward()
        began = time.perf_counter()
        torch.autograd.backward(out, g)
        return [time.perf_counter() - began]

    def stagewright() -> list[float]:
        x, out = forward()
        began = time.perf_counter()
        _, pending = backward_input(out, g, x, params)
        mid = time.perf_counter()
        backward_weight(pending)
        return [mid - began, time.perf_counter() - mid]

    def torch_split() -> list[float]:
        x, out = forward()
        began = time.perf_counter()
        _, groups = pipe_backward.stage_backward_input([out], [g], [x], iter(params))
        mid = time.perf_counter()
        pipe_backward.stage_backward_weight(iter(params), groups)
        return [mid - began, time.perf_counter() - mid]

    def fwd() -> list[float]:
        began = time.perf_counter()
        with torch.enable_grad():
            forward()
        return [time.perf_counter() - began]

    cases = {"forward": fwd, "full": full, "stagewright": stagewright, "torch": torch_split}
    samples: dict[str, list[list[float]]] = {k: [] for k in cases}
    for _ in range(2):  # warm-up
        for fn in cases.values():
            fn()
            stage.zero_grad(set_to_none=True)
    for _ in range(repeats):  # interleaved, so drift hits every case alike
        for key, fn in cases.items():
            samples[key].append(fn())
            stage.zero_grad(set_to_none=True)

    def med(key: str, i: int) -> float:
        return statistics.median(s[i] for s in samples[key]) * 1e3

    base = med("full", 0)
    split = {
        "full": base,
        "sw_b": med("stagewright", 0),
        "sw_w": med("stagewright", 1),
        "t_i": med("torch", 0),
        "t_w": med("torch", 1),
    }
    sw_total, t_total = split["sw_b"] + split["sw_w"], split["t_i"] + split["t_w"]
    lines = [
        f"| one {layers}-layer middle stage, 1 thread, median of {repeats} | input grad (ms) | "
        "weight grad (ms) | total (ms) | total / full backward |",
        "|---|---|---|---|---|",
        f"| forward | | | {med('forward', 0):.2f} | {med('forward', 0) / base:.2f} |",
        f"| full backward (one BW) | | | {base:.2f} | 1.00 |",
        f"| stagewright B + W | {split['sw_b']:.2f} | {split['sw_w']:.2f} | {sw_total:.2f} | "
        f"{sw_total / base:.2f} |",
        f"| torch I + W | {split['t_i']:.2f} | {split['t_w']:.2f} | {t_total:.2f} | "
        f"{t_total / base:.2f} |",
    ]
    return lines, split


def explain(
    timings: dict[str, dict[str, float]], split: dict[str, float], p: int, m: int
) -> list[str]:
    """Where stagewright is slower, and how much of it the B/W split accounts for."""
    out = []
    for name, r in timings.items():
        # CPU seconds are the steadier figure on a shared 2-core machine; wall drifts more.
        if r["cpu"] > 1.05 or r["wall"] > 1.10:
            verdict = "slower than"
        elif r["cpu"] < 0.95 and r["wall"] < 0.95:
            verdict = "faster than"
        else:
            verdict = "on par with (within run-to-run noise)"
        out.append(
            f"- {name}: stagewright is {verdict} {TORCH_NAME[name]} at 2 ranks (median "
            f"ratios: wall {r['wall']:.2f}, CPU per rank {r['cpu']:.2f})."
        )
    base = split["full"]
    sw_total, t_total = split["sw_b"] + split["sw_w"], split["t_i"] + split["t_w"]
    extra = sw_total - t_total
    pairs = (2 * p - 1) * m  # stage 0 has no input gradient on either side: W is all of it
    predicted = extra * pairs / p
    out.append(
        "- v-zb backward split, on one stage: stagewright's B records the gradient at each "
        "node where a weight branch leaves the input path and its W starts there "
        f"(executor/split_backward.py): W {split['sw_w'] / base:.2f}x a full backward, "
        f"B + W {sw_total / base:.2f}x; torch's ZBV does the same with "
        f"stage_backward_input/weight: W {split['t_w'] / base:.2f}x, I + W "
        f"{t_total / base:.2f}x."
    )
    if "v-zb" in timings:
        zb = timings["v-zb"]
        diff = (zb["cpu_sw"] - zb["cpu_torch"]) * 1e3
        line = (
            f"- v-zb end to end: {extra:.1f} ms more per split (stage, micro-batch) x {pairs} "
            f"such pairs / {p} ranks predicts +{predicted:.0f} ms CPU per rank per step; "
            f"measured stagewright - torch: {diff:+.0f} ms"
        )
        if "1f1b" in timings:
            one = timings["1f1b"]
            base_diff = (one["cpu_sw"] - one["cpu_torch"]) * 1e3
            line += f" (1f1b, which has no split: {base_diff:+.0f} ms)"
        out.append(line + ".")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3, help="A/B run pairs per comparison")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per run (+1 warm-up)")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-prediction", action="store_true")
    parser.add_argument(
        "--prediction-runs", type=int, default=3, help="runs per schedule against the prediction"
    )
    args = parser.parse_args(argv)
    model = {
        "name": "bench-gpt",
        "num_layers": args.layers,
        "hidden_size": args.hidden,
        "num_attention_heads": args.heads,
        "seq_length": args.seq,
        "vocab_size": args.vocab,
    }
    m = args.microbatches
    print(
        f"model: hidden {args.hidden}, {args.layers} layers, {args.heads} heads, seq {args.seq}, "
        f"vocab {args.vocab}; micro-batch size 1, {m} micro-batches; gloo on loopback, 1 thread "
        f"per rank; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start"
    )
    started = time.perf_counter()
    notes: list[str] = []
    timings: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="sw-vs-torch-") as tmp:
        work = Path(tmp)

        def write(schedule: str, p: int) -> Path:
            data = make_config(schedule, p, m, model)
            path = work / f"{schedule}-p{p}.json"
            path.write_text(json.dumps(data))
            layers = [sum(s["recompute"].values()) for s in data["stages"]]
            print(f"  {schedule} at {p} ranks: stage layers {layers}")
            return path

        if not args.skip_timing:
            two = {name: write(name, 2) for name in TORCH_NAME}
            print(
                f"\n## Timing at 2 ranks ({args.pairs} alternating pairs A B A B, 1 warm-up + "
                f"{args.steps} timed steps per run; per run the median over its timed steps)\n"
            )
            lines, timings = timing(two, args.pairs, args.steps, work, notes)
            print("\n".join(lines))
            print(
                "\nbusy = time inside compute actions; neither side counts waiting for a receive "
                "(stagewright waits before it starts the clock, torch's schedule before it calls "
                "the stage)."
            )
        if not args.skip_memory:
            four = {name: write(name, 4) for name in TORCH_NAME}
            print("\n## Peak saved-activation memory per rank at 4 ranks (second step)\n")
            print("\n".join(memory(four, work, notes)))
            print(
                "\nA few KiB of difference: torch's micro-batches are views of the whole batch's "
                "token and target tensors, whose single storage (m x (seq + 1) int64) counts "
                "whole; stagewright copies each micro-batch's rows."
            )
        if not args.skip_prediction:
            print(
                "\n## Saved activations per rank against the planner's prediction, per recompute "
                "mode (planned on the bundled cpu profile; second step)\n"
            )
            print("\n".join(memory_against_prediction(model, m, work, run_report, notes)))
            print(
                "\n## Step time against the planner's prediction (after `stagewright profile` of "
                f"the exact layer shape; {args.prediction_runs} runs of 1 + {args.steps} steps)\n"
            )
            print(
                "\n".join(
                    step_time_against_prediction(
                        model, m, args.steps, args.prediction_runs, work, run_report
                    )
                )
            )
            print(
                "\ncalibrated = the planner's step time x (measured busy / predicted busy): the "
                "prediction on the run's own pass times, which on a shared machine stretch with "
                "the load; what remains is the schedule model (fill, drain, bubbles)."
            )
    zbv_layers = split_layers(args.layers, 4)
    stage_layers = zbv_layers[1] if zbv_layers else 1
    print("\n## Backward split cost on one stage (single process)\n")
    try:
        lines, split = backward_split(model, stage_layers, repeats=15)
    except (ImportError, AttributeError, RuntimeError) as exc:
        notes.append(f"backward split measurement failed: {type(exc).__name__}: {exc}")
    else:
        print("\n".join(lines))
        print("\n## Where stagewright is slower, and why\n")
        print("\n".join(explain(timings, split, 2, m)))
    load = os.getloadavg()[0]
    notes.append(
        f"load average {load:.2f} at the end: other processes sharing the 2 cores inflate wall "
        "times; CPU seconds per rank are the steadier figure"
    )
    print("\nNotes:")
    for note in notes:
        print(f"- {note}")
    print(f"\n(total {time.perf_counter() - started:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
