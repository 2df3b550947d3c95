"""Inputs a person gives the executor, checked before any process starts or joins a group:
each problem is one message that says what to change."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

from pydantic import ValidationError

from planner.errors import StagewrightError
from planner.json_input import loads
from planner.launch import ExecutorConfig
from planner.launch.config import is_plan_request, run_a_request
from planner.launch.runtimes import executor_problem

__all__ = [
    "BadInput",
    "check_run_options",
    "check_steps_left",
    "check_writable",
    "latest_step",
    "read_config",
]

_STEP = re.compile(r"^step_(\d+)$")


class BadInput(StagewrightError):
    """Something the person launching can fix; the message says what."""


def read_config(path: Path, lr: float | None = None) -> ExecutorConfig:
    """The executor config at ``path`` (with the learning rate overridden when ``lr`` is
    given)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise BadInput(f"cannot read {path}: {reason}") from exc
    try:
        data = loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(
            f"{path} is not a valid executor config: it is not valid JSON (line {exc.lineno}, "
            f"column {exc.colno}: {exc.msg}); use a candidate's executor config from "
            "stagewright plan --emit DIR"
        ) from None
    except StagewrightError as exc:  # a key given twice, or nested too deep
        raise BadInput(f"{path} is not a valid executor config: {exc}") from None
    try:
        config = ExecutorConfig.model_validate(data)
    except ValidationError as exc:
        if is_plan_request(data):
            raise BadInput(
                f"{path} is a plan request, not an executor config: {run_a_request(str(path))}"
            ) from None
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "config"
        raise BadInput(
            f"{path} is not a valid executor config ({where}: {first['msg']}); use a "
            f"candidate's executor config from stagewright plan --emit DIR"
        ) from None
    parallel = config.parallel
    problem = executor_problem(
        config.model, config.training, parallel.t, config.ir.name, parallel.cp
    )
    if problem is not None:
        raise BadInput(f"{path}: this executor cannot run it: {problem}")
    if lr is not None:
        if not lr > 0:
            raise BadInput(f"the learning rate must be positive, got {lr}")
        optimizer = config.optimizer.model_copy(update={"lr": lr})
        config = config.model_copy(update={"optimizer": optimizer})
    return config


def check_run_options(
    *,
    steps: int,
    timeout_s: float,
    checkpoint_dir: Path | None,
    checkpoint_every: int | None,
    lr: float | None,
) -> None:
    """The options of a run, as ``stagewright run`` and the worker (the emitted scripts'
    torchrun line) both take them, checked before any rank starts or joins a group: a
    timeout of 0 or less made every rank time out at once (and blame its peers), NaN was a
    traceback, and ``--checkpoint-every`` (None: not given) without ``--checkpoint-dir`` was
    ignored without a word. The learning rate's sign is checked by :func:`read_config`."""
    if steps < 1:
        raise BadInput("--steps must be at least 1")
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise BadInput(f"--timeout must be a positive number of seconds, got {timeout_s}")
    if checkpoint_every is not None and checkpoint_dir is None:
        raise BadInput(
            "--checkpoint-every applies only with --checkpoint-dir DIR (where the checkpoints "
            "go); add it or leave --checkpoint-every out"
        )
    if checkpoint_every is not None and checkpoint_every < 0:
        raise BadInput(
            f"--checkpoint-every must be 0 (never) or a number of steps, got {checkpoint_every}"
        )
    if lr is not None and not math.isfinite(lr):
        raise BadInput(f"--lr must be a finite number, got {lr}")


def check_writable(folder: Path) -> None:
    """Create ``folder`` if needed and prove a file can be written in it."""
    probe = folder / f".stagewright-write-test-{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise BadInput(
            f"cannot write to {folder} ({exc.strerror or exc}); choose a folder you can write"
        ) from exc


def latest_step(folder: Path) -> int | None:
    """The newest step with a complete checkpoint in ``folder`` (a ``step_N`` folder; one
    still being written is ``step_N.incomplete``). Torch-free, so that ``stagewright run``
    can ask before it starts any rank."""
    if not folder.is_dir():
        return None
    steps = [
        int(match.group(1)) for child in folder.iterdir() if (match := _STEP.match(child.name))
    ]
    return max(steps, default=None)


def check_steps_left(folder: Path, steps: int) -> None:
    """Refuse a run that would resume from ``folder`` with no step left to take: the ranks
    would load the checkpoint, run nothing and have no step time to report."""
    found = latest_step(folder)
    if found is not None and found + 1 >= steps:
        raise BadInput(
            f"nothing to do: the checkpoint in {folder} is already at step {found + 1} (asked "
            f"for --steps {steps}); give more --steps or another --checkpoint-dir"
        )
