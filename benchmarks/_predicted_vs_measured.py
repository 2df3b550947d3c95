"""The executor against the planner's own prediction (sections of executor_vs_torch.py).

1. Saved-activation memory per rank, per recompute mode: 1F1B at 4 ranks in bf16 with
   recompute none, selective and full (and a CP-SAT-style per-stage mix), the run report's
   measured peak of every rank against the prediction the config carries (planned on the
   bundled ``cpu`` profile, as a plan hands it out).
2. Step time, at 2 ranks: ``stagewright profile`` of the exact layer shape on this machine
   first (one layer's F, B, W), then the planner prices the candidate with that profile and
   the run's measured step time (the report's median after the first step; for 2BW, which
   runs its batches without a flush, the time between a rank's optimizer steps) is set
   against the prediction. On a shared machine the wall clock of both the profile and the
   run stretch with the load, so each figure is also given against the prediction
   *calibrated to the run's own pass times*: the planner's step time scaled by measured busy
   seconds / predicted busy seconds of the busiest rank. That ratio isolates what the
   schedule model adds (fill, drain, bubbles): a 2BW run that drained every two batches would
   measure 15-44% above its steady-state price there.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from executor.profiler import profile_layer
from planner.costmodel.evaluate import (
    PlanContext,
    estimate,
    num_stages,
    placement_for,
    price,
    split_layers,
)
from planner.launch import RunReport, build_executor_config
from planner.launch.executor import prediction
from planner.profiles import BUNDLED_PROFILES, JsonProfileStore, default_store, save_point
from planner.specs import CandidateConfig, ModelSpec, PlanRequest, RecomputeSplit

Launch = Callable[[Path, int, int, Path], RunReport]
"""Runs an executor config: (config file, ranks, steps, output folder) -> its run report."""

__all__ = ["cpu_candidate", "memory_against_prediction", "step_time_against_prediction"]


def cpu_candidate(
    model: dict[str, Any],
    schedule: str,
    p: int,
    m: int,
    *,
    mb: int = 1,
    precision: str = "fp32",
    recompute: str = "none",
    per_stage: list[RecomputeSplit] | None = None,
) -> tuple[PlanRequest, CandidateConfig]:
    """A plan request for ``model`` on ``p`` ranks of the ``cpu`` profile (SGD, no
    distributed optimizer, no sequence parallelism, no flash attention) and its one
    pipeline-only candidate: ``m`` micro-batches of ``mb``, layers split as a plan does."""
    request = PlanRequest.model_validate(
        {
            "model": model,
            "cluster": {"gpu": "cpu", "num_nodes": 1, "gpus_per_node": p},
            "training": {
                "global_batch_size": m * mb,
                "precision": precision,
                "optimizer": "sgd",
                "distributed_optimizer": False,
                "sequence_parallel": False,
                "flash_attention": False,
            },
        }
    )
    layers = split_layers(model["num_layers"], num_stages(schedule, p))
    if layers is None:
        raise SystemExit(f"{model['num_layers']} layers cannot be split for {schedule} at p={p}")
    config = CandidateConfig(
        t=1,
        p=p,
        d=1,
        micro_batch_size=mb,
        num_microbatches=m,
        recompute=recompute,
        schedule=schedule,
        layers_per_stage=layers,
        recompute_per_stage=per_stage,
    )
    return request, config


def priced_config(
    model: dict[str, Any],
    schedule: str,
    p: int,
    m: int,
    *,
    precision: str = "fp32",
    recompute: str = "none",
    per_stage: list[RecomputeSplit] | None = None,
    store: JsonProfileStore | None = None,
) -> tuple[dict[str, Any], dict[str, float]]:
    """The executor config a plan hands out (with the prediction, on ``store``), and the
    planner's step time and the busiest device's compute seconds per step."""
    request, config = cpu_candidate(
        model, schedule, p, m, precision=precision, recompute=recompute, per_stage=per_stage
    )
    ctx = PlanContext.from_store(request, store or default_store())
    priced = price(ctx, estimate(ctx, config))
    document = build_executor_config(
        request, config, placement_for(config, p), prediction("cpu", priced)
    )
    est = priced.estimate
    figures = {"step": priced.iteration_time_s, "busy": est.busy_s + est.optimizer_s}
    return document.materialized().model_dump(mode="json"), figures


def memory_against_prediction(
    model: dict[str, Any], m: int, work: Path, launch: Launch, notes: list[str]
) -> list[str]:
    """Peak saved activations per rank against the prediction, per recompute mode."""
    lines = [
        "| 1f1b, 4 ranks, bf16 | rank | measured peak saved act. (MiB) | predicted (MiB) | "
        "measured / predicted |",
        "|---|---|---|---|---|",
    ]
    layers = split_layers(model["num_layers"], 4) or []
    # The kind of per-stage choice CP-SAT makes: the stage holding the most micro-batches
    # recomputes fully, the next selectively, the rest keeps everything.
    mixed = [
        RecomputeSplit(full=layers[0]),
        RecomputeSplit(selective=layers[1]),
        *(RecomputeSplit(none=n) for n in layers[2:]),
    ]
    cases: dict[str, dict[str, Any]] = {
        "none": {"recompute": "none"},
        "selective": {"recompute": "selective"},
        "full": {"recompute": "full"},
        "per stage full/selective/none/none": {"per_stage": mixed},
    }
    worst = 0.0
    for name, how in cases.items():
        data, _ = priced_config(model, "1f1b", 4, m, precision="bf16", **how)
        path = work / f"memory-{len(lines)}.json"
        path.write_text(json.dumps(data))
        report = launch(path, 4, 2, work / f"memory-out-{len(lines)}")
        for rank in sorted(report.ranks, key=lambda r: r.pp):
            predicted = rank.predicted_saved_activation_bytes or 0.0
            measured = rank.peak_saved_activation_bytes
            ratio = measured / predicted if predicted else float("nan")
            worst = max(worst, abs(ratio - 1))
            lines.append(
                f"| {name} | {rank.pp} | {measured / 2**20:.3f} | {predicted / 2**20:.3f} | "
                f"{ratio:.4f} |"
            )
    notes.append(f"memory against prediction: largest |measured / predicted - 1| = {worst:.4f}")
    return lines


def step_time_against_prediction(
    model: dict[str, Any], m: int, steps: int, runs: int, work: Path, launch: Launch
) -> list[str]:
    """Measured step time against the planner's, after profiling the exact shape here."""
    spec = ModelSpec.model_validate(model)
    profiles = work / "profiles"
    save_point(profile_layer(spec, 1, precision="fp32", recompute="none"), profiles)
    store = JsonProfileStore.load(BUNDLED_PROFILES, profiles)
    lines = [
        f"| 2 ranks, fp32, {m} micro-batches | predicted step (s) | measured step (s), per run | "
        "measured / predicted | measured busy / predicted busy | measured / calibrated |",
        "|---|---|---|---|---|---|",
    ]
    for schedule in ("1f1b", "2bw", "v-zb"):
        data, figures = priced_config(model, schedule, 2, m, store=store)
        path = work / f"step-{schedule}.json"
        path.write_text(json.dumps(data))
        measured, busy = [], []
        for run in range(runs):
            report = launch(path, 2, steps + 1, work / f"step-{schedule}-{run}")
            assert report.measured.step_time_s is not None
            measured.append(report.measured.step_time_s)
            busy.append(
                max(statistics.median(s.busy_s for s in rank.steps[1:]) for rank in report.ranks)
            )
        step, scale = statistics.median(measured), statistics.median(busy) / figures["busy"]
        per_run = ", ".join(f"{x:.3f}" for x in measured)
        lines.append(
            f"| {schedule} | {figures['step']:.3f} | {per_run} | {step / figures['step']:.3f} | "
            f"{scale:.3f} | {step / (figures['step'] * scale):.3f} |"
        )
    return lines
