"""Executor runs for the tests: torchrun with gloo on loopback, few small ranks, one thread
each; and the test-side fault injection (a ``sitecustomize`` on the ranks' PYTHONPATH), so
that the product code carries no hooks for it."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the executor tests need torch (make test installs it)")
# The references these tests compute in-process run on one thread, as each rank does: with a
# second thread spinning for a core that other processes hold, one reference step took minutes.
torch.set_num_threads(1)

from executor.launcher import torchrun_command  # noqa: E402
from executor.reporting import REPORT_FILE  # noqa: E402
from planner.launch import RunReport  # noqa: E402

VENV_BIN = str(Path(sys.executable).parent)


def torchrun(
    paths: list[Path],
    nproc: int,
    out: Path,
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """``executor.worker`` on the configs, one after the other, under one torchrun."""
    command = torchrun_command(
        nproc, "-m", "executor.worker", *map(str, paths), "--out", str(out), *args
    )
    environment = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", **(env or {})}
    return subprocess.run(
        command, capture_output=True, text=True, env=environment, timeout=timeout, check=False
    )


@contextmanager
def one_multinode_job_at_a_time() -> Iterator[None]:
    """Lines for several nodes use torchrun's default rendezvous port (29500) unless
    MASTER_PORT names another: on one machine, two such jobs (two test runs at once) would
    meet on it."""
    with open(Path(tempfile.gettempdir()) / "stagewright-multinode-test.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def report(folder: Path) -> RunReport:
    return RunReport.model_validate_json((folder / REPORT_FILE).read_text())


# A rank process imports this at start-up (it is on PYTHONPATH): on the rank named by
# STAGEWRIGHT_TEST_CORRUPT, every stage's gradients are scaled by 1.5 before they are used,
# which verification must catch and attribute to that rank.
_SITECUSTOMIZE = textwrap.dedent(
    """
    import os

    if os.environ.get("RANK") == os.environ.get("STAGEWRIGHT_TEST_CORRUPT"):
        import executor.weights as _weights

        _reduce = _weights.StageWeights.reduce_gradients

        def _corrupt(self, loss_scale):
            self.grad.mul_(1.5)
            return _reduce(self, loss_scale)

        _weights.StageWeights.reduce_gradients = _corrupt
    """
)


# A rank process imports this at start-up (it is on PYTHONPATH): with STAGEWRIGHT_TEST_BLOCK
# naming a folder, every rank, once it has joined the process group and would start its
# steps, ignores SIGTERM (as a rank does whose Python handler waits for the C++ collective it
# is in to return), writes its pid to rank<RANK>.pid there and blocks for good.
_BLOCKING_SITECUSTOMIZE = textwrap.dedent(
    """
    import os

    _folder = os.environ.get("STAGEWRIGHT_TEST_BLOCK")
    if _folder and "RANK" in os.environ:
        import signal
        import time

        import executor.interpreter as _interpreter

        def _block(self, *args, **kwargs):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            path = os.path.join(_folder, f"rank{os.environ['RANK']}.pid")
            with open(path + ".part", "w") as out:
                out.write(str(os.getpid()))
            os.replace(path + ".part", path)
            while True:
                time.sleep(3600)

        _interpreter.RankRunner.run = _block
    """
)


def _injecting_env(tmp_path: Path, sitecustomize: str) -> dict[str, str]:
    """Environment that puts ``sitecustomize`` on the ranks' PYTHONPATH."""
    folder = tmp_path / "inject"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(sitecustomize)
    path = os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {"PYTHONPATH": path}


@pytest.fixture
def corrupting_env(tmp_path: Path) -> dict[str, str]:
    """Environment that makes the rank named by STAGEWRIGHT_TEST_CORRUPT corrupt its
    gradients."""
    return _injecting_env(tmp_path, _SITECUSTOMIZE)


@pytest.fixture
def blocking_env(tmp_path: Path) -> dict[str, str]:
    """Environment that makes every rank block before its first step, having written its
    pid to ``rank<RANK>.pid`` in the folder that ``STAGEWRIGHT_TEST_BLOCK`` names."""
    pids = tmp_path / "pids"
    pids.mkdir()
    return {
        **_injecting_env(tmp_path, _BLOCKING_SITECUSTOMIZE),
        "STAGEWRIGHT_TEST_BLOCK": str(pids),
    }
