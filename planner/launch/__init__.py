"""Launch artefacts of a candidate and the documents shared with the executor.

- :class:`ExecutorConfig` (``config``): what a rank runs; :func:`build_executor_config` writes it.
- :class:`RunReport` (``report``): what a run measured; the executor writes it.
- torchrun lines and per-node scripts (``torchrun``), Megatron-LM arguments (``megatron``),
  torch.distributed.pipelining's CSV (``torch_csv``).
"""

from __future__ import annotations

from planner.launch.artefacts import materialize_launch
from planner.launch.config import (
    EXECUTOR_CONFIG_FORMAT,
    SCHEDULE_REFERENCE_FORMAT,
    ExecutorConfig,
    OptimizerSettings,
    Prediction,
    StageSpec,
)
from planner.launch.executor import build_executor_config, stage_recompute
from planner.launch.megatron import MEGATRON_FLAGS, MegatronLaunch, megatron_launch
from planner.launch.report import RUN_REPORT_FORMAT, RunReport
from planner.launch.torch_csv import torch_pipelining_csv
from planner.launch.torchrun import EXECUTOR_CONFIG_FILE, launch_script, torchrun_commands

__all__ = [
    "EXECUTOR_CONFIG_FILE",
    "EXECUTOR_CONFIG_FORMAT",
    "MEGATRON_FLAGS",
    "RUN_REPORT_FORMAT",
    "SCHEDULE_REFERENCE_FORMAT",
    "ExecutorConfig",
    "MegatronLaunch",
    "OptimizerSettings",
    "Prediction",
    "RunReport",
    "StageSpec",
    "build_executor_config",
    "launch_script",
    "materialize_launch",
    "megatron_launch",
    "stage_recompute",
    "torch_pipelining_csv",
    "torchrun_commands",
]
