"""A rank that dies or hangs stops the job with a clear error within its timeout, leaves no
report and no checkpoint that looks complete, and a restart resumes from the newest complete
checkpoint and ends where an uninterrupted run ends. The faults are real: the test kills or
stops a rank's process (found by a marker in its environment), nothing in the product code
simulates them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
import torch

from executor.checkpoint import latest_step, remove_incomplete
from executor.launcher import ExecutorError, run, torchrun_command
from executor.reporting import REPORT_FILE
from tests.executor.configs import make_config, write
from tests.executor.conftest import report, torchrun

PROC = Path("/proc")


def _rank_pid(marker: str, rank: int) -> int | None:
    """The process of ``rank`` among the processes started with ``marker`` in their
    environment."""
    wanted = {f"STAGEWRIGHT_TEST_MARK={marker}".encode(), f"RANK={rank}".encode()}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = set((entry / "environ").read_bytes().split(b"\0"))
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if wanted <= environ and b"executor.worker" in command:
            return int(entry.name)
    return None


def _wait_for(condition, limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, "the run never got there"
        time.sleep(0.05)


def _run_in_background(**kwargs) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def target() -> None:
        started = time.perf_counter()
        try:
            outcome["result"] = run(**kwargs)
        except ExecutorError as exc:
            outcome["error"] = exc
        outcome["elapsed"] = time.perf_counter() - started

    thread = threading.Thread(target=target)
    thread.start()
    return thread, outcome


def test_a_rank_that_dies_stops_the_job_and_a_restart_resumes(tmp_path):
    config = write(tmp_path, "job", make_config("1f1b", 1, 2, 1, 4))
    checkpoints = tmp_path / "ckpt"
    marker = uuid.uuid4().hex
    thread, outcome = _run_in_background(
        config_path=config,
        steps=500,
        timeout_s=15,
        checkpoint_dir=checkpoints,
        checkpoint_every=1,
        env={"STAGEWRIGHT_TEST_MARK": marker},
        out_dir=tmp_path / "first",
    )
    _wait_for(lambda: (checkpoints / "step_1").exists())
    pid = _rank_pid(marker, 1)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    thread.join(timeout=200)
    assert "error" in outcome, "the job did not fail"
    assert outcome["elapsed"] < 120
    assert "rank" in str(outcome["error"]) and "exit" in str(outcome["error"])
    assert not (tmp_path / "first" / REPORT_FILE).exists()  # no report of a failed run
    # Every checkpoint that looks complete is complete (DCP's metadata written last).
    complete = [p for p in checkpoints.iterdir() if not p.name.endswith(".incomplete")]
    assert complete and all((p / ".metadata").exists() for p in complete)
    newest = latest_step(checkpoints)
    assert newest is not None and newest >= 1

    # The restart picks up after the newest checkpoint and ends with the weights of a run
    # that never failed.
    steps = newest + 3
    resumed = torchrun(
        [config],
        2,
        tmp_path / "resumed",
        "--steps",
        str(steps),
        "--dump-weights",
        "--checkpoint-dir",
        str(checkpoints),
        "--checkpoint-every",
        "1",
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert report(tmp_path / "resumed").first_step == newest + 1
    straight = torchrun([config], 2, tmp_path / "straight", "--steps", str(steps), "--dump-weights")
    assert straight.returncode == 0, straight.stderr[-2000:]
    for rank in range(2):
        expected = torch.load(tmp_path / "straight" / f"rank{rank}.weights.pt")
        got = torch.load(tmp_path / "resumed" / f"rank{rank}.weights.pt")
        for name, value in expected.items():
            torch.testing.assert_close(got[name], value)


def test_a_rank_that_hangs_makes_the_others_stop_within_the_timeout(tmp_path):
    config = write(tmp_path, "job", make_config("1f1b", 1, 2, 1, 4))
    marker = uuid.uuid4().hex
    thread, outcome = _run_in_background(
        config_path=config,
        steps=5000,
        timeout_s=8,
        env={"STAGEWRIGHT_TEST_MARK": marker},
        out_dir=tmp_path / "out",
    )
    _wait_for(lambda: _rank_pid(marker, 1) is not None)
    time.sleep(3)  # let it start stepping
    pid = _rank_pid(marker, 1)
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    stopped = time.perf_counter()
    # Its peer gives up after the 8 s timeout and ends; then the hung process is put down
    # (torchrun would wait 30 s for it to honour SIGTERM, which a stopped process cannot).
    # Wait for the peer to end rather than a fixed time: on a loaded machine (load average 8
    # on 2 cores) it took over 18 s, and killing the hung rank first made torchrun end the
    # peer before it could say why it stopped.
    deadline = time.monotonic() + 8 + 40
    while _rank_pid(marker, 0) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    thread.join(timeout=200)
    assert "error" in outcome, "the job did not stop"
    assert time.perf_counter() - stopped < 60
    assert "rank 0: stopped" in str(outcome["error"])


def _is_rank(pid: int) -> bool:
    """Whether ``pid`` is a running executor rank (a zombie's command line is empty: it holds
    no port, memory or device any more)."""
    try:
        return b"executor.worker" in (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return False


@pytest.mark.skipif(not PROC.is_dir(), reason="finds the ranks through /proc (Linux)")
def test_the_ranks_end_when_torchrun_is_killed(tmp_path, blocking_env):
    """torchrun killed with SIGKILL cannot stop its ranks (each runs in a session of its own):
    they end by themselves within seconds, also when they ignore SIGTERM and block."""
    config = write(tmp_path, "job", make_config("1f1b", 1, 2, 1, 4))
    pids = Path(blocking_env["STAGEWRIGHT_TEST_BLOCK"])
    command = torchrun_command(2, "-m", "executor.worker", str(config), "--out", str(tmp_path))
    log = tmp_path / "torchrun.log"
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", **blocking_env}
    with log.open("w") as out:
        agent = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    ranks: list[int] = []
    try:
        _wait_for(lambda: len(list(pids.glob("*.pid"))) == 2 or agent.poll() is not None)
        assert agent.poll() is None, log.read_text()[-3000:]
        ranks = [int(path.read_text()) for path in pids.glob("*.pid")]
        assert all(map(_is_rank, ranks))
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait(timeout=10)
        killed = time.monotonic()
        while any(map(_is_rank, ranks)) and time.monotonic() - killed < 5:
            time.sleep(0.05)
        assert not any(map(_is_rank, ranks)), "ranks outlived the torchrun that started them"
    finally:
        for pid in filter(_is_rank, ranks):
            os.kill(pid, signal.SIGKILL)
        if agent.poll() is None:
            agent.kill()
            agent.wait()


def test_a_checkpoint_left_half_written_is_not_resumed_from(tmp_path):
    folder = tmp_path / "ckpt"
    (folder / "step_3").mkdir(parents=True)
    (folder / "step_7.incomplete").mkdir()
    assert latest_step(folder) == 3
    remove_incomplete(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["step_3"]


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA GPU: the nccl path and CUDA streams are only exercised on a GPU machine",
)
def test_the_nccl_path_runs_on_gpus(tmp_path):  # pragma: no cover - no GPU on CI
    config = write(tmp_path, "job", make_config("1f1b", 1, torch.cuda.device_count(), 1, 4))
    outcome = run(config, steps=2, verify=True)
    assert outcome.verified
