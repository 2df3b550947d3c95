"""Shared by the unit tests: independent checks of schedules (they do not use the
validator), and small model and training specs built from a test module's defaults."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from types import ModuleType

from planner.schedules import ActionKind, Schedule
from planner.simulate import SimulationResult
from planner.specs import ModelSpec, TrainingSpec

K = ActionKind


def model_spec(defaults: dict[str, object], **changes: object) -> ModelSpec:
    """A model spec: a test module's ``defaults`` with ``changes`` applied."""
    return ModelSpec.model_validate({**defaults, **changes})


def training(**changes: object) -> TrainingSpec:
    """A training spec of global batch 32 with ``changes`` applied."""
    return TrainingSpec.model_validate({"global_batch_size": 32, **changes})


def assert_complete(schedule: Schedule) -> None:
    """Every stage has exactly one F and one B and W (split) or one BW per micro-batch."""
    counts = Counter(
        (a.kind, a.stage, a.microbatch)
        for acts in schedule.actions
        for a in acts
        if a.kind in (K.F, K.B, K.W, K.BW)
    )
    backward = (K.B, K.W) if schedule.split_backward else (K.BW,)
    expected = {
        (kind, stage, mb): 1
        for stage in range(schedule.num_stages)
        for mb in range(schedule.total_microbatches)
        for kind in (K.F, *backward)
    }
    assert dict(counts) == expected


def assert_dependencies_hold(result: SimulationResult, comm: float = 0.0) -> None:
    """In the simulated timeline: each pass starts after its inputs end (plus comm across
    devices), and a device never runs two compute actions at once."""
    schedule = result.schedule
    last = schedule.num_stages - 1
    ends: dict[tuple[K, int, int], tuple[float, int]] = {}
    rows = result.timeline()
    for device, action, _, end in rows:
        ends[(action.kind, action.stage, action.microbatch)] = (end, device)
    eps = 1e-9
    for device, action, start, _ in rows:
        s, k = action.stage, action.microbatch
        needs = []
        if action.kind is K.F and s > 0:
            needs.append((K.F, s - 1, k))
        elif action.kind in (K.B, K.BW):
            if s == last:
                needs.append((K.F, s, k))
            else:
                needs.append((K.B if schedule.split_backward else K.BW, s + 1, k))
            needs.append((K.F, s, k))
        elif action.kind is K.W:
            needs.append((K.B, s, k))
        for key in needs:
            end, producer_device = ends[key]
            latency = comm if producer_device != device else 0.0
            assert start + eps >= end + latency, f"{action} starts before {key} is available"
    by_device: dict[int, list[tuple[float, float]]] = {}
    for device, action, start, end in rows:
        if action.kind.is_compute:
            by_device.setdefault(device, []).append((start, end))
    for spans in by_device.values():
        spans.sort()
        for (_, e1), (s2, _) in zip(spans, spans[1:], strict=False):
            assert s2 + eps >= e1, "a device runs two compute actions at once"


def generate_any(
    name: str, num_devices: int, num_microbatches: int, **parameters: float
) -> Schedule:
    """``generate`` for tests that run every registered schedule: a family that needs a
    memory limit gets the largest one that still changes its schedule (always feasible)."""
    from planner.schedules import MEMORY_LIMIT, generate, schedule_family

    family = schedule_family(name)
    if family.has_parameter(MEMORY_LIMIT.name) and MEMORY_LIMIT.name not in parameters:
        assert family.largest_memory_limit is not None
        parameters[MEMORY_LIMIT.name] = family.largest_memory_limit(num_devices, num_microbatches)
    return generate(name, num_devices, num_microbatches, **parameters)


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module (the benchmarks are scripts, not a package);
    registered in ``sys.modules``, which its dataclasses need while they are defined."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def signal_until_gone(
    process: subprocess.Popen[str], sent: signal.Signals, within: float, *, whole_group: bool = True
) -> tuple[str, float]:
    """Send ``sent`` to ``process``'s process group (``process`` leads one of its own), or
    to ``process`` alone, and wait up to ``within`` s for every process of the group to end.
    Returns the process's stderr and the seconds from the signal until the group was gone;
    fails if something of it is still running then (and kills the group, so that nothing
    outlives the test)."""
    try:
        sent_at = time.monotonic()
        if whole_group:
            os.killpg(process.pid, sent)
        else:
            os.kill(process.pid, sent)
        _, err = process.communicate(timeout=within)
        while running_in_group(process.pid) and time.monotonic() - sent_at < within:
            time.sleep(0.05)
        ended = time.monotonic() - sent_at
        assert not running_in_group(process.pid), "a process of the group outlived it"
    finally:
        kill_group(process)
    return err, ended


def kill_group(process: subprocess.Popen[str]) -> None:
    """SIGKILL what still runs of ``process``'s process group, and reap ``process``."""
    if running_in_group(process.pid):
        os.killpg(process.pid, signal.SIGKILL)
    process.communicate()


def running_in_group(group: int) -> list[int]:
    """The processes of process group ``group`` that are still running (not zombies), read
    from Linux's /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found
