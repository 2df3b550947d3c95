"""The several-node launch scripts take the rendezvous timeout from RDZV_TIMEOUT: checked
before torchrun starts, passed to torchrun's static rendezvous as ``--rdzv-conf
timeout=SECONDS``, said in the line that precedes the wait, and named again after torchrun
when the wait ran out; and on Ctrl-C or SIGTERM they end torchrun, whether it is waiting or
running ranks. Run with bash against a stand-in ``torchrun`` that prints its arguments and
what it is told to print, or, for the signals, one that acts as torchrun does on them
(tests/executor/test_launch_scripts.py runs the real one)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from functools import cache
from pathlib import Path

import pytest

from planner.launch.files import launch_files
from planner.launch.torchrun import RUN_INTERRUPTED_NOTE, STOP_GRACE
from planner.plan import plan
from planner.specs import PlanRequest
from tests.unit.helpers import kill_group, signal_until_gone

REQUEST = {
    "model": {
        "name": "tiny",
        "num_layers": 4,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "seq_length": 32,
        "vocab_size": 128,
    },
    "cluster": {"gpu": "cpu", "num_nodes": 2, "gpus_per_node": 2},
    "training": {"global_batch_size": 8, "precision": "fp32", "distributed_optimizer": False},
    "search": {"schedules": ["1f1b"], "recompute": ["none"], "micro_batch_sizes": [1]},
}

# Prints its arguments on stdout, STUB_STDERR on stderr, and exits with STUB_EXIT.
_TORCHRUN = textwrap.dedent(
    """\
    #!/usr/bin/env bash
    echo "torchrun $*"
    printf '%s' "${STUB_STDERR:-}" >&2
    exit "${STUB_EXIT:-0}"
    """
)
# torch 2.13's last lines when the static rendezvous runs out: on node 0, and on the others.
NODE0_TIMED_OUT = (
    "torch.distributed.DistStoreError: Timed out after 4 seconds waiting for clients. "
    "1/2 clients joined.\n"
)
NODE1_TIMED_OUT = (
    "torch.distributed.DistNetworkError: The client socket has timed out after 3000ms while "
    "trying to connect to (10.0.0.1, 29500).\n"
)
HINT = "the 2 nodes did not all meet at 10.0.0.1:29500 within RDZV_TIMEOUT="


def _note(name: str) -> str:
    """What the script says after "interrupted": the executor's scripts add what the
    interrupted run leaves; Megatron-LM's say nothing of it."""
    return RUN_INTERRUPTED_NOTE if name.startswith("run-node") else ""


@cache
def _scripts() -> dict[str, str]:
    """run-node0.sh and megatron-node1.sh of a 2-node plan's first candidate."""
    files = {f.path: f.content for f in launch_files(plan(PlanRequest.model_validate(REQUEST)))}
    return {name: files[f"candidate-1/{name}"] for name in ("run-node0.sh", "megatron-node1.sh")}


def _prepare(
    tmp_path: Path, name: str, torchrun: str = _TORCHRUN, **env: str
) -> tuple[list[str], dict[str, str]]:
    """The command that runs the script ``name`` with ``torchrun`` as torchrun, and its
    environment."""
    folder = tmp_path / "candidate"
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(_scripts()[name])
    stub = tmp_path / "bin"
    stub.mkdir(exist_ok=True)
    (stub / "torchrun").write_text(torchrun)
    (stub / "torchrun").chmod(0o755)
    (tmp_path / "megatron").mkdir(exist_ok=True)
    (tmp_path / "megatron" / "pretrain_gpt.py").touch()
    environment = {
        "PATH": f"{stub}{os.pathsep}{os.defpath}",
        "MASTER_ADDR": "10.0.0.1",
        "MEGATRON_LM": str(tmp_path / "megatron"),
        **env,
    }
    return ["bash", str(folder / name), "--steps", "2"], environment


def _run(tmp_path: Path, name: str, **env: str) -> subprocess.CompletedProcess[str]:
    command, environment = _prepare(tmp_path, name, **env)
    return subprocess.run(
        command,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("name", ["run-node0.sh", "megatron-node1.sh"])
@pytest.mark.parametrize("given, seconds", [(None, "900"), ("", "900"), ("42", "42")])
def test_the_timeout_reaches_torchrun_and_the_waiting_line(tmp_path, name, given, seconds):
    done = _run(tmp_path, name, **({} if given is None else {"RDZV_TIMEOUT": given}))
    assert done.returncode == 0, done.stderr
    # torchrun's stdout stays on stdout, its arguments as the script gave them.
    called = done.stdout.splitlines()
    assert len(called) == 1 and f" --rdzv-conf=timeout={seconds} " in called[0]
    assert called[0].endswith(" --steps 2")
    assert f"(torchrun gives up after {seconds} s; RDZV_TIMEOUT=SECONDS sets that)" in done.stderr
    assert HINT not in done.stderr


@pytest.mark.parametrize("given", ["abc", "0", "-5", "1.5", "90s", "10000000", "1 2"])
def test_a_timeout_that_is_not_whole_seconds_is_refused_before_torchrun(tmp_path, given):
    done = _run(tmp_path, "run-node0.sh", RDZV_TIMEOUT=given)
    assert done.returncode == 2
    assert done.stdout == ""  # torchrun never ran
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"run-node0.sh: RDZV_TIMEOUT={given} is not a number of seconds; set RDZV_TIMEOUT" in (
        done.stderr
    )
    assert "(e.g. RDZV_TIMEOUT=1800)" in done.stderr


@pytest.mark.parametrize(
    "name, last_line", [("run-node0.sh", NODE0_TIMED_OUT), ("megatron-node1.sh", NODE1_TIMED_OUT)]
)
def test_a_wait_that_ran_out_is_said_after_torchrun_in_the_scripts_words(tmp_path, name, last_line):
    traceback = "Traceback (most recent call last):\n  File ...\n" + last_line
    done = _run(tmp_path, name, RDZV_TIMEOUT="3", STUB_STDERR=traceback, STUB_EXIT="1")
    assert done.returncode == 1  # torchrun's status
    lines = done.stderr.splitlines()
    assert "\n".join(lines[-4:-1]) + "\n" == traceback  # passed on unchanged, in order
    node = name[-4]
    assert lines[-1].endswith(
        f"/{name}: node {node} of 2: {HINT}3 s; start every node's script within that time, "
        "each with MASTER_ADDR set to node 0's address (reachable from every node) and the "
        "same MASTER_PORT, or set RDZV_TIMEOUT to wait longer"
    )


def test_another_failure_is_not_taken_for_a_wait_that_ran_out(tmp_path):
    said = "rank 1: stopped: RuntimeError: boom (a peer died, hung past --timeout 60s)"
    done = _run(tmp_path, "run-node0.sh", STUB_STDERR=said, STUB_EXIT="1")
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == said  # its last line, without a newline, kept
    assert HINT not in done.stderr


# ------------------------------------------------------------------- Ctrl-C and SIGTERM
# Acts as torchrun 2.13 does on the signals. Waiting for the other nodes (the default), it
# is in a C++ call that Python's SIGINT handler does not interrupt: SIGINT changes nothing,
# and SIGTERM, which it has no handler for yet, ends it (STUB_IGNORE_TERM: it ignores that
# too, as a torchrun started with SIGTERM ignored would). Running ranks (STUB_RANKS), it has
# a child process and handlers for both, which stop the child and exit 1 half a second later
# (torch 2.13's torchrun took 0.9-2.4 s from the signal to its end here, even with its ranks
# gone within milliseconds). It writes each signal it handles to STUB_LOG, and "ready" on
# stdout once it is in either state.
_SIGNALLED_TORCHRUN = f"""#!{sys.executable}
import os, signal, subprocess, sys, time

def note(signum, frame):
    with open(os.environ["STUB_LOG"], "a") as log:
        log.write(signal.Signals(signum).name + "\\n")

if os.environ.get("STUB_RANKS"):
    rank = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )

    def stop(signum, frame):
        note(signum, frame)
        rank.kill()
        rank.wait()
        time.sleep(0.5)
        sys.exit(1)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
else:
    signal.signal(signal.SIGINT, note)
    if os.environ.get("STUB_IGNORE_TERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(60)
"""
WAITING_SAID = (
    " while waiting for the other nodes at 10.0.0.1:29500; torchrun stopped. Scripts already "
    "started on the other nodes wait up to their RDZV_TIMEOUT for this one: stop them too, "
    "or start this one again"
)


def _interrupt(
    tmp_path: Path, name: str, sent: signal.Signals, *, whole_group: bool = True, **env: str
) -> tuple[int, str, float, list[str]]:
    """Start the script in a process group of its own, as a terminal starts a command, with
    the stand-in torchrun; once that is ready, send ``sent`` to the group (a terminal's
    Ctrl-C, a scheduler stopping the job) or to the script alone. The script's status, its
    stderr, the seconds from the signal until the script and everything in its group had
    ended, and the signals torchrun handled."""
    log = tmp_path / "signals.log"
    command, environment = _prepare(tmp_path, name, _SIGNALLED_TORCHRUN, STUB_LOG=str(log), **env)
    script = subprocess.Popen(
        command,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert script.stdout is not None
        assert script.stdout.readline() == "ready\n"
    except BaseException:
        kill_group(script)
        raise
    err, ended = signal_until_gone(script, sent, 3 * STOP_GRACE, whole_group=whole_group)
    handled = log.read_text().split() if log.exists() else []
    return script.returncode, err, ended, handled


linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"),
    reason="the scripts tell a waiting torchrun from one running ranks through /proc",
)


@linux_only
@pytest.mark.parametrize("name", ["run-node0.sh", "megatron-node1.sh"])
def test_a_signal_to_the_script_alone_ends_a_waiting_torchrun_at_once(tmp_path, name):
    """SIGINT to the script only (not its group, so torchrun does not get it): the script
    sends torchrun SIGTERM straight away, which a waiting torchrun ends on."""
    status, err, ended, handled = _interrupt(tmp_path, name, signal.SIGINT, whole_group=False)
    assert status == 128 + signal.SIGINT
    assert handled == []  # torchrun got nothing it could handle: SIGTERM ended it
    assert ended < STOP_GRACE / 2
    assert err.splitlines()[-1] == (
        f"{tmp_path}/candidate/{name}: node {name[-4]} of 2: interrupted (SIGINT)"
        + WAITING_SAID
        + _note(name)
    )


@linux_only
def test_a_waiting_torchrun_that_does_not_end_on_sigterm_is_killed(tmp_path):
    """Ctrl-C while torchrun waits, and torchrun ignores SIGTERM as well: SIGKILL after
    STOP_GRACE seconds (no rank exists yet that it could leave behind)."""
    status, err, ended, handled = _interrupt(
        tmp_path, "run-node0.sh", signal.SIGINT, STUB_IGNORE_TERM="1"
    )
    assert status == 128 + signal.SIGINT
    assert handled == ["SIGINT"]  # the terminal's; the script's SIGTERM was ignored
    assert STOP_GRACE <= ended < STOP_GRACE + 3
    assert err.splitlines()[-1] == (
        f"{tmp_path}/candidate/run-node0.sh: node 0 of 2: interrupted (SIGINT) while waiting "
        "for the other nodes at 10.0.0.1:29500; torchrun did not end within "
        f"{STOP_GRACE} s of SIGTERM and was killed with SIGKILL" + RUN_INTERRUPTED_NOTE
    )


@linux_only
@pytest.mark.parametrize("name", ["run-node0.sh", "megatron-node1.sh"])
@pytest.mark.parametrize("sent", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_torchrun_running_ranks_gets_one_signal_from_the_group_not_a_second(tmp_path, name, sent):
    """Once torchrun runs ranks it stops them on the signal the whole group got; a second
    one from the script during that shutdown would cut it short (the ranks it has not
    stopped yet left behind), so the script only waits for it."""
    status, err, ended, handled = _interrupt(tmp_path, name, sent, STUB_RANKS="1")
    assert status == 128 + sent
    assert handled == [sent.name]
    assert ended < STOP_GRACE / 2
    assert err.splitlines()[-1] == (
        f"{tmp_path}/candidate/{name}: node {name[-4]} of 2: interrupted ({sent.name}); "
        "torchrun stopped its ranks and ended" + _note(name)
    )


@linux_only
def test_sigterm_to_the_script_alone_reaches_torchrun_running_ranks_after_the_grace(tmp_path):
    """SIGTERM to the script only (a container runtime stopping its first process, ``kill``
    of the script's pid): torchrun did not get it, so it is still running STOP_GRACE
    seconds later, and the script sends it SIGTERM, which it stops its ranks on."""
    status, err, ended, handled = _interrupt(
        tmp_path, "run-node0.sh", signal.SIGTERM, whole_group=False, STUB_RANKS="1"
    )
    assert status == 128 + signal.SIGTERM
    assert handled == ["SIGTERM"]
    assert STOP_GRACE <= ended < STOP_GRACE + 3
    assert err.splitlines()[-1].endswith(
        "run-node0.sh: node 0 of 2: interrupted (SIGTERM); torchrun stopped its ranks and ended"
        + RUN_INTERRUPTED_NOTE
    )
