"""Build the executor config of a candidate (:class:`planner.launch.config.ExecutorConfig`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from planner.costmodel.evaluate import Priced, stages_by_device
from planner.costmodel.memory import GIB
from planner.launch.config import (
    EXECUTOR_CONFIG_FORMAT,
    TRUSTED_SCHEDULE,
    ExecutorConfig,
    Prediction,
    placement_reference,
    schedule_reference,
)
from planner.placement import Placement
from planner.specs import CandidateConfig, PlanRequest, RecomputeSplit

__all__ = ["build_executor_config", "prediction", "stage_recompute"]


def stage_recompute(config: CandidateConfig) -> list[RecomputeSplit]:
    """Per stage, its layers per recompute mode."""
    if config.recompute_per_stage is not None:
        return list(config.recompute_per_stage)
    return [RecomputeSplit(**{config.recompute: n}) for n in config.layers_per_stage]


def build_executor_config(
    request: PlanRequest,
    config: CandidateConfig,
    placement: Placement,
    predicted: Prediction | None = None,
    choice: Mapping[str, Any] | None = None,
) -> ExecutorConfig:
    """The executor's input for ``config`` in a plan's form: the model and training settings
    of ``request``, the stages with their layers and recompute modes, the schedule by its
    generator's parameters and ``placement`` by its rule (:meth:`ExecutorConfig.materialized`
    writes out the actions and ranks). ``choice`` is what an adaptive family's search chose
    (the schedule's ``meta``), kept so that rebuilding it does not search again."""
    stages = []
    first = 0
    for split in stage_recompute(config):
        stages.append({"first_layer": first, "recompute": split})
        first += split.total
    data = {
        "format": EXECUTOR_CONFIG_FORMAT,
        "model": request.model,
        "training": request.training,
        "parallel": {"t": config.t, "p": config.p, "d": config.d, "cp": config.cp},
        "micro_batch_size": config.micro_batch_size,
        "num_microbatches": config.num_microbatches,
        "stages": stages,
        "placement": placement_reference(placement),
        "schedule": schedule_reference(config, choice),
        "predicted": predicted,
    }
    return ExecutorConfig.model_validate(data, context={TRUSTED_SCHEDULE: True})


def prediction(hardware: str, priced: Priced) -> Prediction:
    """What the planner predicts for a priced candidate, as the executor config carries it:
    the step time, and per pipeline device the saved activations (the in-flight peak) apart
    from the transient working set of a recomputed layer's backward."""
    est = priced.estimate
    config = est.config
    working = [
        max(est.costs.working_bytes[s] for s in stages)
        for stages in stages_by_device(config.schedule, config.p, config.num_chunks)
    ]
    return Prediction(
        hardware=hardware,
        iteration_time_s=priced.iteration_time_s,
        saved_activation_bytes=[
            m.activations - (w if est.activations_counted else 0.0)
            for m, w in zip(est.memory, working, strict=True)
        ],
        recompute_working_bytes=working,
        memory_gib_per_device=[m.total / GIB for m in est.memory],
    )
