"""Executor configs of a tiny GPT, built the way a plan builds them (planner.launch)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from planner.costmodel.evaluate import num_stages, split_layers
from planner.launch import executor_config
from planner.placement import place
from planner.schedules import generate
from planner.specs import CandidateConfig, PlanRequest

TINY = {
    "name": "tiny",
    "num_layers": 8,
    "hidden_size": 32,
    "num_attention_heads": 4,
    "seq_length": 16,
    "vocab_size": 64,
}


def make_config(
    schedule: str,
    t: int,
    p: int,
    d: int,
    m: int,
    *,
    mb: int = 1,
    optimizer: str = "sgd",
    distributed_optimizer: bool = False,
    lr: float = 0.05,
) -> dict[str, Any]:
    world = t * p * d
    request = PlanRequest.model_validate(
        {
            "model": TINY,
            "cluster": {"gpu": "cpu", "num_nodes": 1, "gpus_per_node": world},
            "training": {
                "global_batch_size": m * mb * d,
                "precision": "fp32",
                "optimizer": optimizer,
                "distributed_optimizer": distributed_optimizer,
                "sequence_parallel": False,
                "flash_attention": False,
            },
        }
    )
    layers = split_layers(TINY["num_layers"], num_stages(schedule, p))
    assert layers is not None
    config = CandidateConfig(
        t=t,
        p=p,
        d=d,
        micro_batch_size=mb,
        num_microbatches=m,
        recompute="none",
        schedule=schedule,
        layers_per_stage=layers,
    )
    data = executor_config(request, config, generate(schedule, p, m), place(t, p, d, world))
    data["lr"] = lr
    return data


def write(folder: Path, name: str, data: dict[str, Any]) -> Path:
    path = folder / f"{name}.json"
    path.write_text(json.dumps(data))
    return path
