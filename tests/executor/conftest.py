"""Launch executor runs for the tests: one torchrun per world size runs many configs."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the executor tests need torch (make test installs it)")

from executor.launcher import torchrun_command  # noqa: E402


def torchrun(
    paths: list[Path],
    nproc: int,
    out: Path,
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    command = torchrun_command(
        nproc, "-m", "executor.worker", *map(str, paths), "--out", str(out), *args
    )
    environment = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", **(env or {})}
    return subprocess.run(
        command, capture_output=True, text=True, env=environment, timeout=timeout, check=False
    )


def reports(out: Path, name: str | None, nproc: int) -> list[dict[str, Any]]:
    folder = out / name if name else out
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(nproc)]
