"""``stagewright run``: launch an executor config under torchrun on this machine.

Checks the inputs first (the config reads and validates, ``--nproc`` matches its t x p x d,
the output folder can be written), then runs ``python -m torch.distributed.run
--nproc-per-node N -m executor.worker CONFIG`` on loopback and reads the run report rank 0
wrote (:mod:`planner.launch.report`): measured figures of every rank next to the planner's
prediction, which the config carries. Ctrl-C or SIGTERM ends the run (torchrun and its ranks)
and raises :class:`RunInterrupted`, whose message is the one line to say.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from executor.inputs import check_run_options, check_steps_left, check_writable, read_config
from executor.reporting import REPORT_FILE
from planner.errors import StagewrightError
from planner.launch import RunReport
from planner.launch.torchrun import STOP_GRACE

__all__ = [
    "ExecutorError",
    "RunInterrupted",
    "RunOutcome",
    "failure_reasons",
    "run",
    "torchrun_command",
]


class ExecutorError(StagewrightError):
    """The distributed run failed; the message carries the ranks' own one-line reasons."""


class RunInterrupted(ExecutorError):
    """The run was stopped by a signal (Ctrl-C, SIGTERM) before it finished."""

    def __init__(self, signum: int, checkpoint_dir: Path | None) -> None:
        self.signum = signum
        kept = (
            f"; checkpoints completed in {checkpoint_dir} are kept, and a run started again "
            "resumes from the newest"
            if checkpoint_dir is not None
            else ""
        )
        super().__init__(
            f"interrupted ({signal.Signals(signum).name}); the run did not finish: no run "
            f"report was written{kept}"
        )


class _Stop(Exception):  # noqa: N818 - not an error: how a signal ends the wait for torchrun
    pass


@dataclass(frozen=True)
class RunOutcome:
    report: RunReport
    out_dir: Path
    stdout: str
    stderr: str

    @property
    def verified(self) -> bool:
        return self.report.verification is None or self.report.verification.passed


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


_RANK_LINE = re.compile(r"^(?:rank \d+: .*|executor\.worker: error: .*)$", re.MULTILINE)
# torchrun's own failure summary, one block per failed process: the rank and how it ended.
# A rank killed by a signal prints nothing itself, and torchrun may stop the other ranks
# before they report the lost peer, so this block can be the only place that names it.
_TORCHRUN_FAILURE = re.compile(
    r"^\s*rank\s*:\s*(\d+)\b.*\n\s*exitcode\s*:\s*(-?\d+)[^\n]*?(?:\((SIG\w+)\))?\s*$",
    re.MULTILINE,
)


def failure_reasons(stderr: str) -> list[str]:
    """One line per reason a run failed, read from its stderr: first the ranks torchrun saw
    fail (``rank 1 exited with code -9 (SIGKILL)``), then the first four of the ranks' own
    ``rank N: ...`` lines; the last three lines of stderr when neither is there."""
    seen = [
        f"rank {rank} exited with code {code}" + (f" ({signal})" if signal else "")
        for rank, code, signal in _TORCHRUN_FAILURE.findall(stderr)
    ]
    reasons = list(dict.fromkeys(seen)) + list(dict.fromkeys(_RANK_LINE.findall(stderr)))[:4]
    return reasons or stderr.strip().splitlines()[-3:]


def run(
    config_path: Path,
    *,
    nproc: int | None = None,
    steps: int = 3,
    verify: bool = False,
    timeout_s: float = 60.0,
    checkpoint_dir: Path | None = None,
    checkpoint_every: int | None = None,
    lr: float | None = None,
    out_dir: Path | None = None,
    env: dict[str, str] | None = None,
) -> RunOutcome:
    """Run the config with one process per rank and return its report (also when
    ``--verify`` found a mismatch: check :attr:`RunOutcome.verified`). With
    ``checkpoint_dir``, a checkpoint every ``checkpoint_every`` steps (0 or None: only after
    the last)."""
    # The worker checks the same (one function), but only once torchrun has started it.
    check_run_options(
        steps=steps,
        timeout_s=timeout_s,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every,
        lr=lr,
    )
    config = read_config(config_path, lr)
    world = config.world_size
    if nproc is not None and nproc != world:
        raise StagewrightError(
            f"{config_path} runs t x p x d = {world} ranks; --nproc {nproc} does not match "
            f"(leave --nproc out or pass {world})"
        )
    out = out_dir or Path(tempfile.mkdtemp(prefix="stagewright-run-"))
    check_writable(out)
    if checkpoint_dir is not None:
        check_writable(checkpoint_dir)
        # Before any rank starts: resumed at its last step, the run would take no step, and
        # its report would have none to time.
        check_steps_left(checkpoint_dir, steps)
    (out / REPORT_FILE).unlink(missing_ok=True)
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
        command += ["--checkpoint-dir", str(checkpoint_dir)]
        command += ["--checkpoint-every", str(checkpoint_every or 0)]
    environment = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", **(env or {})}
    # A bounded wait (at most a week): a job whose ranks all hang is stopped by the worker
    # timeouts first. Past it, subprocess.run kills torchrun with SIGKILL, and its ranks end
    # with it (executor.lifeline).
    limit = min(120 + timeout_s * 3 + steps * 60, 7 * 24 * 3600)
    done = _run_torchrun(command, environment, limit, checkpoint_dir)
    # Rank 0 writes the report only once every rank has finished its steps: a report means
    # the run completed (a failed --verify makes the ranks, and so torchrun, exit non-zero).
    report_path = out / REPORT_FILE
    if not report_path.exists():
        reasons = failure_reasons(done.stderr)
        raise ExecutorError(f"the run failed (exit {done.returncode}): " + " | ".join(reasons))
    report = RunReport.model_validate_json(report_path.read_text())
    return RunOutcome(report, out, done.stdout, done.stderr)


def _run_torchrun(
    command: list[str], environment: dict[str, str], limit: float, checkpoint_dir: Path | None
) -> subprocess.CompletedProcess[str]:
    """Run torchrun to its end, at most ``limit`` seconds. On SIGINT or SIGTERM (Ctrl-C
    reaches the whole process group; a scheduler or ``kill`` may reach this process alone),
    torchrun gets SIGTERM, which it stops its ranks on (they end on it too, at once and
    quietly), and SIGKILL if it has not ended STOP_GRACE s later; then :class:`RunInterrupted`
    says so, instead of a KeyboardInterrupt traceback, or torchrun's SignalException read as
    the run's failure."""
    got: list[int] = []

    def stop(signum: int, _frame: object) -> None:
        got.append(signum)
        if len(got) == 1:
            raise _Stop

    before = {}
    if threading.current_thread() is threading.main_thread():  # only it can take signals
        before = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    process = None
    try:
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment
        )
        try:
            out, err = process.communicate(timeout=limit)
        except subprocess.TimeoutExpired as exc:
            process.kill()
            process.communicate()
            raise ExecutorError(
                f"the run did not finish within {limit:.0f} s and was stopped"
            ) from exc
        if got:  # came as torchrun ended: its output tells of the signal, not of the run
            raise _Stop
        return subprocess.CompletedProcess(command, process.returncode, out, err)
    except _Stop:
        if process is not None:
            _end(process)
        raise RunInterrupted(got[0], checkpoint_dir) from None
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)


def _end(process: subprocess.Popen[str]) -> None:
    """End torchrun: SIGTERM, then SIGKILL after STOP_GRACE s (its ranks end with it,
    executor.lifeline); what it prints meanwhile is read and dropped."""
    if process.poll() is None:
        process.terminate()
    try:
        process.communicate(timeout=STOP_GRACE)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
