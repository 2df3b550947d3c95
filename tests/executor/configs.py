"""Executor configs of a tiny GPT, built the way a plan builds them (planner.launch)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from planner.costmodel.evaluate import (
    PlanContext,
    estimate,
    num_stages,
    placement_for,
    price,
    split_layers,
)
from planner.launch import build_executor_config
from planner.launch.executor import prediction
from planner.placement import Placement
from planner.profiles import default_store
from planner.specs import CandidateConfig, PlanRequest, RecomputeSplit

TINY = {
    "name": "tiny",
    "num_layers": 8,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "seq_length": 32,
    "vocab_size": 128,
}


def make_config(
    schedule: str,
    t: int,
    p: int,
    d: int,
    m: int,
    *,
    mb: int = 1,
    precision: str = "fp32",
    recompute: str = "none",
    per_stage: list[RecomputeSplit] | None = None,
    layers: list[int] | None = None,
    sequence_parallel: bool = False,
    optimizer: str = "sgd",
    distributed_optimizer: bool = False,
    lr: float = 0.05,
    model: dict[str, Any] | None = None,
    placement: Placement | None = None,
) -> dict[str, Any]:
    """The executor config a plan would hand out for this candidate, with the prediction;
    placed as ``placement`` (as a cpsat plan places it) or by default."""
    request = PlanRequest.model_validate(
        {
            "model": model or TINY,
            "cluster": {"gpu": "cpu", "num_nodes": 1, "gpus_per_node": t * p * d},
            "training": {
                "global_batch_size": m * mb * d,
                "precision": precision,
                "optimizer": optimizer,
                "distributed_optimizer": distributed_optimizer,
                "sequence_parallel": sequence_parallel,
                "flash_attention": False,
            },
        }
    )
    split = layers or split_layers(request.model.num_layers, num_stages(schedule, p))
    assert split is not None
    config = CandidateConfig(
        t=t,
        p=p,
        d=d,
        micro_batch_size=mb,
        num_microbatches=m,
        recompute=recompute,
        schedule=schedule,
        layers_per_stage=split,
        recompute_per_stage=per_stage,
    )
    ctx = PlanContext.from_store(request, default_store())
    if placement is None:
        placement = placement_for(config, request.cluster.gpus_per_node)
    else:
        ctx = ctx.with_placements({(t, p, d, schedule): placement})
    document = build_executor_config(
        request, config, placement, prediction("cpu", price(ctx, estimate(ctx, config)))
    )
    data = document.model_dump(mode="json")
    data["optimizer"]["lr"] = lr
    return data


def write(folder: Path, name: str, data: dict[str, Any]) -> Path:
    path = folder / f"{name}.json"
    path.write_text(json.dumps(data))
    return path
