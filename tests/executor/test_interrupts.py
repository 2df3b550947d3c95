"""Ctrl-C (SIGINT to the terminal's process group) or SIGTERM during a run, through the
emitted one-node script and through ``stagewright run``: one line saying the run was
interrupted and what it leaves, the shell's status for the signal (128 + its number), no
traceback from torchrun or any rank, every process gone, and the checkpoints completed before
the signal kept."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from planner.launch.torchrun import RUN_INTERRUPTED_NOTE
from tests.executor.conftest import VENV_BIN
from tests.executor.test_launch_scripts import _emit, _folder_of
from tests.unit.helpers import kill_group, signal_until_gone

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads process groups in /proc"
)


def _pipeline_candidate(tmp_path: Path) -> Path:
    """The folder of the emitted (t, p, d) = (1, 2, 1) candidate: two ranks that send each
    other activations, so a rank stopping mid-step leaves its peer waiting."""
    emitted = _emit(
        tmp_path,
        {"num_nodes": 1, "gpus_per_node": 2},
        {"schedules": ["1f1b"], "recompute": ["none"]},
    )
    return _folder_of(emitted, t=1, p=2, d=1)


def _interrupt_once_training(
    command: list[str], checkpoints: Path, sent: signal.Signals
) -> tuple[int, str]:
    """Start ``command`` in a process group of its own, as a terminal starts it; once its
    first checkpoint is complete (the ranks are training), send ``sent`` to the group. Its
    exit status and stderr; every process of the group must be gone within 30 s."""
    process = subprocess.Popen(
        command,
        env={**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        started = time.monotonic()
        while not (checkpoints / "step_0").exists():
            assert process.poll() is None, process.communicate()[1][-3000:]
            assert time.monotonic() - started < 240, "no checkpoint within 240 s"
            time.sleep(0.1)
    except BaseException:
        kill_group(process)
        raise
    err, _ = signal_until_gone(process, sent, within=30)
    return process.returncode, err


def _assert_quiet(err: str) -> None:
    for noise in ("Traceback", "KeyboardInterrupt", "SignalException", "death signal"):
        assert noise not in err, err[-3000:]


def test_ctrl_c_stops_the_emitted_script_with_one_line_and_status_130(tmp_path):
    folder = _pipeline_candidate(tmp_path)
    checkpoints = tmp_path / "ckpt"
    status, err = _interrupt_once_training(
        [
            "bash",
            str(folder / "run-node0.sh"),
            "--steps",
            "100000",
            "--checkpoint-dir",
            str(checkpoints),
            "--checkpoint-every",
            "1",
        ],
        checkpoints,
        signal.SIGINT,
    )
    assert status == 128 + signal.SIGINT, err[-3000:]
    _assert_quiet(err)
    assert err.splitlines()[-1] == (
        f"{folder}/run-node0.sh: interrupted (SIGINT); torchrun stopped its ranks and ended"
        + RUN_INTERRUPTED_NOTE
    )
    assert not (folder / "stagewright-run" / "run-report.json").exists()
    assert (checkpoints / "step_0").is_dir()


@pytest.mark.parametrize("sent", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_stagewright_run_stopped_by_a_signal_says_so_in_one_line(tmp_path, sent):
    folder = _pipeline_candidate(tmp_path)
    checkpoints = tmp_path / "ckpt"
    status, err = _interrupt_once_training(
        [
            "stagewright",
            "run",
            str(folder / "executor-config.json"),
            "--steps",
            "100000",
            "--out",
            str(tmp_path / "out"),
            "--checkpoint-dir",
            str(checkpoints),
        ],
        checkpoints,
        sent,
    )
    assert status == 128 + sent, err[-3000:]
    assert err.splitlines() == [
        f"stagewright run: interrupted ({sent.name}); the run did not finish: no run report "
        f"was written; checkpoints completed in {checkpoints} are kept, and a run started "
        "again resumes from the newest"
    ]
    assert not (tmp_path / "out" / "run-report.json").exists()
    assert (checkpoints / "step_0").is_dir()
