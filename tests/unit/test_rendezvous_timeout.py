"""The several-node launch scripts take the rendezvous timeout from RDZV_TIMEOUT: checked
before torchrun starts, passed to torchrun's static rendezvous as ``--rdzv-conf
timeout=SECONDS``, said in the line that precedes the wait, and named again after torchrun
when the wait ran out. Run with bash against a stand-in ``torchrun`` that prints its
arguments and what it is told to print (tests/executor/test_launch_scripts.py runs the real
one)."""

from __future__ import annotations

import os
import subprocess
import textwrap
from functools import cache
from pathlib import Path

import pytest

from planner.launch.files import launch_files
from planner.plan import plan
from planner.specs import PlanRequest

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


@cache
def _scripts() -> dict[str, str]:
    """run-node0.sh and megatron-node1.sh of a 2-node plan's first candidate."""
    files = {f.path: f.content for f in launch_files(plan(PlanRequest.model_validate(REQUEST)))}
    return {name: files[f"candidate-1/{name}"] for name in ("run-node0.sh", "megatron-node1.sh")}


def _run(tmp_path: Path, name: str, **env: str) -> subprocess.CompletedProcess[str]:
    folder = tmp_path / "candidate"
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(_scripts()[name])
    stub = tmp_path / "bin"
    stub.mkdir(exist_ok=True)
    (stub / "torchrun").write_text(_TORCHRUN)
    (stub / "torchrun").chmod(0o755)
    (tmp_path / "megatron").mkdir(exist_ok=True)
    (tmp_path / "megatron" / "pretrain_gpt.py").touch()
    environment = {
        "PATH": f"{stub}{os.pathsep}{os.defpath}",
        "MASTER_ADDR": "10.0.0.1",
        "MEGATRON_LM": str(tmp_path / "megatron"),
        **env,
    }
    return subprocess.run(
        ["bash", str(folder / name), "--steps", "2"],
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
