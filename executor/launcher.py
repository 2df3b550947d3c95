"""``stagewright run``: launch an executor config under torchrun on this machine and report.

Runs ``python -m torch.distributed.run --nproc-per-node N -m executor.worker CONFIG`` on
loopback, collects every rank's report, and puts each rank's measured saved-activation peak
next to the planner's prediction for the same configuration (the cost model with the
profiles the planner reads, times the schedule's in-flight counts).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.costmodel.evaluate import PlanContext, device_memory, stage_costs
from planner.errors import StagewrightError
from planner.profiles import ProfileStore, default_store
from planner.specs import CandidateConfig, PlanRequest

__all__ = ["ExecutorError", "RunResult", "predicted_activation_bytes", "run"]


class ExecutorError(StagewrightError):
    """The distributed run failed; the message carries the ranks' own one-line reasons."""


@dataclass
class RunResult:
    world_size: int
    ranks: list[dict[str, Any]]
    predicted_activation_bytes: list[float]  # per pipeline device
    stdout: str = ""
    stderr: str = ""
    coords: list[tuple[int, int, int]] = field(default_factory=list)

    def summary(self) -> list[dict[str, Any]]:
        """One row per rank: measured figures of the last step next to the prediction."""
        rows = []
        for report in self.ranks:
            last = report["steps"][-1] if report["steps"] else {}
            pp = report["coords"]["pp"]
            row = {
                "rank": report["rank"],
                "dp": report["coords"]["dp"],
                "pp": pp,
                "tp": report["coords"]["tp"],
                "stages": report["stages"],
                "step_s": last.get("wall_s"),
                "busy_s": last.get("busy_s"),
                "bubble_s": None if not last else last["wall_s"] - last["busy_s"],
                "cpu_s": last.get("cpu_s"),
                "peak_activation_bytes": last.get("peak_activation_bytes"),
                "predicted_activation_bytes": self.predicted_activation_bytes[pp],
                "bytes_sent": last.get("bytes_sent", {}),
                "losses": last.get("losses", []),
            }
            if "verify" in report:
                row["verify"] = {k: v for k, v in report["verify"].items() if k != "checked"}
            rows.append(row)
        return rows


def _request_and_config(data: dict[str, Any]) -> tuple[PlanRequest, CandidateConfig]:
    parallel = data["parallel"]
    world = parallel["t"] * parallel["p"] * parallel["d"]
    m, mb = data["num_microbatches"], data["micro_batch_size"]
    training = dict(data["training"])
    training["global_batch_size"] = m * mb * parallel["d"]
    request = PlanRequest.model_validate(
        {
            "model": data["model"],
            "cluster": {"gpu": data.get("gpu", "cpu"), "num_nodes": 1, "gpus_per_node": world},
            "training": training,
        }
    )
    config = CandidateConfig(
        t=parallel["t"],
        p=parallel["p"],
        d=parallel["d"],
        micro_batch_size=mb,
        num_microbatches=m,
        recompute=data.get("recompute", "none"),
        schedule=data["schedule"]["name"],
        memory_limit=data["schedule"].get("meta", {}).get("memory_limit"),
        layers_per_stage=[b - a for a, b in data["stage_layers"]],
    )
    return request, config


def predicted_activation_bytes(
    data: dict[str, Any], store: ProfileStore | None = None
) -> list[float]:
    """The planner's saved-activation peak per pipeline device for an executor config."""
    request, config = _request_and_config(data)
    ctx = PlanContext.from_store(request, store or default_store())
    costs = stage_costs(ctx, config)
    memory, _ = device_memory(ctx, config, costs)
    return [m.activations for m in memory]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def torchrun_command(nproc: int, *target: str) -> list[str]:
    """``python -m torch.distributed.run`` for ``nproc`` local ranks on a free loopback port,
    followed by ``target`` (``-m module`` or a script, and its arguments)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        "--master-addr=127.0.0.1",
        f"--master-port={_free_port()}",
        *target,
    ]


_RANK_ERROR = re.compile(r"^rank \d+: .*$", re.MULTILINE)


def run(
    config_path: Path,
    *,
    nproc: int | None = None,
    steps: int = 1,
    verify: bool = False,
    timeout_s: float = 60.0,
    checkpoint_dir: Path | None = None,
    checkpoint_every: int = 0,
    lr: float | None = None,
    env: dict[str, str] | None = None,
    out_dir: Path | None = None,
    store: ProfileStore | None = None,
) -> RunResult:
    """Launch the config on this machine (one process per rank) and collect the reports."""
    try:
        data = json.loads(config_path.read_text())
        parallel = data["parallel"]
        world = int(parallel["t"]) * int(parallel["p"]) * int(parallel["d"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StagewrightError(f"{config_path} is not an executor config: {exc}") from exc
    if nproc is not None and nproc != world:
        raise StagewrightError(
            f"{config_path} runs t x p x d = {world} ranks; --nproc {nproc} does not match "
            f"(leave --nproc out or pass {world})"
        )
    if steps < 1:
        raise StagewrightError("--steps must be at least 1")
    out = out_dir or Path(tempfile.mkdtemp(prefix="stagewright-run-"))
    command = torchrun_command(
        world,
        "-m",
        "executor.worker",
        str(config_path),
        "--steps",
        str(steps),
        "--out",
        str(out),
        "--timeout",
        str(timeout_s),
    )
    if verify:
        command.append("--verify")
    if lr is not None:
        command += ["--lr", str(lr)]
    if checkpoint_dir is not None:
        command += [
            "--checkpoint-dir",
            str(checkpoint_dir),
            "--checkpoint-every",
            str(checkpoint_every),
        ]
    environment = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", **(env or {})}
    # A bounded wait: a job whose ranks all hang is stopped by the worker timeouts first.
    limit = 120 + timeout_s * 3 + steps * 60
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, env=environment, timeout=limit, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise ExecutorError(f"the run did not finish within {limit:.0f} s and was stopped") from exc
    if done.returncode != 0:
        reasons = _RANK_ERROR.findall(done.stderr) or done.stderr.strip().splitlines()[-3:]
        raise ExecutorError(f"the run failed (exit {done.returncode}): " + " | ".join(reasons[:4]))
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning: ")]
    for line in warnings:
        sys.stderr.write(line + "\n")
    prediction = predicted_activation_bytes(data, store)
    return RunResult(world, ranks, prediction, done.stdout, done.stderr)
