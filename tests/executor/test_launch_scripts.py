"""The emitted launch scripts run as an operator runs them: from another folder, with only
what the files say to set. Megatron-LM's script is run against a stand-in ``pretrain_gpt.py``
that checks what Megatron-LM's ``validate_args`` checks of the environment; the several-node
executor scripts are run as two "nodes" on this machine, with the operator's mistakes."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from cli.main import main
from planner.launch.torchrun import RUN_INTERRUPTED_NOTE
from tests.executor.conftest import VENV_BIN, one_multinode_job_at_a_time
from tests.unit.helpers import kill_group, signal_until_gone

MODEL = {
    "name": "tiny-gpt",
    "num_layers": 4,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "seq_length": 32,
    "vocab_size": 128,
}


def _emit(tmp_path: Path, cluster: dict[str, Any], search: dict[str, Any], **training: Any) -> Path:
    request = {
        "model": MODEL,
        "cluster": {"gpu": "cpu", **cluster},
        "training": {
            "global_batch_size": 8,
            "precision": "fp32",
            "optimizer": "adam",
            "distributed_optimizer": False,
            "sequence_parallel": False,
            **training,
        },
        "search": {"micro_batch_sizes": [1], "top_k": 100, **search},
    }
    path = tmp_path / "request.json"
    path.write_text(json.dumps(request))
    emitted = tmp_path / "launch"
    assert main(["plan", str(path), "--emit", str(emitted)]) == 0
    return emitted


def _folder_of(emitted: Path, **wanted: int) -> Path:
    for path in sorted(emitted.glob("candidate-*/candidate.json")):
        config = json.loads(path.read_text())["config"]
        if all(config[k] == v for k, v in wanted.items()):
            return path.parent
    raise AssertionError(f"no candidate with {wanted}")


# What Megatron-LM's megatron/training/arguments.py (validate_args, at the commit
# planner.launch.megatron checks against) asserts of the environment before training: on GPUs
# before Blackwell, tensor or context parallelism needs CUDA_DEVICE_MAX_CONNECTIONS=1,
# with or without sequence parallelism.
_PRETRAIN_GPT = textwrap.dedent(
    """
    import json, os, sys

    args = sys.argv[1:]
    value = lambda flag, default: int(args[args.index(flag) + 1]) if flag in args else default
    tp = value("--tensor-model-parallel-size", 1)
    cp = value("--context-parallel-size", 1)
    if (tp > 1 or cp > 1) and os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1":
        sys.exit("AssertionError: Using tensor model parallelism or context parallelism "
                 "require setting the environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1")
    with open(os.environ["STUB_OUT"] + "." + os.environ["RANK"], "w") as out:
        json.dump({"args": args, "cwd": os.getcwd()}, out)
    """
)


def test_the_megatron_script_runs_from_another_folder_with_tensor_parallelism(tmp_path):
    """t = 2 without sequence parallelism (Megatron-LM still wants one CUDA connection), the
    script started from the operator's folder with MEGATRON_LM relative to it."""
    emitted = _emit(
        tmp_path,
        {"num_nodes": 1, "gpus_per_node": 2},
        {"schedules": ["1f1b"], "recompute": ["none"]},
    )
    folder = _folder_of(emitted, t=2, p=1, d=1)
    operator = tmp_path / "operator"
    (operator / "megatron").mkdir(parents=True)
    (operator / "megatron" / "pretrain_gpt.py").write_text(_PRETRAIN_GPT)
    stub_out = tmp_path / "ran"
    env = {"PATH": f"{VENV_BIN}{os.pathsep}{os.defpath}", "MEGATRON_LM": "megatron"}
    done = subprocess.run(
        ["bash", str(folder / "megatron-node0.sh")],
        cwd=operator,
        env={**env, "STUB_OUT": str(stub_out)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    expected = (folder / "megatron-args.txt").read_text().split()
    for rank in range(2):
        ran = json.loads(Path(f"{stub_out}.{rank}").read_text())
        assert ran["args"][: len(expected)] == expected
        assert ran["args"][len(expected) :][:1] == ["--mock-data"]

    # A MEGATRON_LM without pretrain_gpt.py: one line that says what to change.
    missing = subprocess.run(
        ["bash", str(folder / "megatron-node0.sh")],
        cwd=operator,
        env={**env, "MEGATRON_LM": "elsewhere"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert missing.returncode != 0
    assert "MEGATRON_LM" in missing.stderr and "pretrain_gpt.py" in missing.stderr
    assert missing.stderr.count("\n") == 1, missing.stderr


# ------------------------------------------------------------- two nodes on this machine
def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start_node(
    folder: Path, node: int, cwd: Path, *args: str, own_group: bool = False, **env: str
) -> subprocess.Popen[str]:
    """``bash run-node<node>.sh ARGS`` as an operator starts it on that node: from its own
    working folder, with MASTER_ADDR (and whatever else ``env`` says) set; with
    ``own_group``, in a process group of its own, as a terminal starts a command."""
    environment = {
        "PATH": f"{VENV_BIN}{os.pathsep}{os.defpath}",
        "MASTER_ADDR": "127.0.0.1",
        **env,
    }
    return subprocess.Popen(
        ["bash", str(folder / f"run-node{node}.sh"), *args],
        cwd=cwd,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=own_group,
    )


def _finish(process: subprocess.Popen[str], timeout: float = 300) -> tuple[int, str, str]:
    """The node's exit status and output; a node still running after ``timeout`` seconds
    has hung, which is a failure (its processes are stopped first)."""
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(process)
        raise
    return process.returncode, out, err


def _stop(process: subprocess.Popen[str]) -> None:
    """End a node's script and torchrun under it (torchrun stops its ranks on SIGTERM)."""
    for child in subprocess.run(
        ["pgrep", "-P", str(process.pid)], capture_output=True, text=True, check=False
    ).stdout.split():
        os.kill(int(child), 15)
    process.terminate()
    process.communicate(timeout=60)


@pytest.fixture
def two_nodes(tmp_path: Path) -> Path:
    """A tiny plan for 2 nodes x 2 CPU "GPUs": the folder of its (t, p, d) = (1, 2, 2) 1F1B
    candidate."""
    emitted = _emit(
        tmp_path,
        {"num_nodes": 2, "gpus_per_node": 2},
        {"schedules": ["1f1b"], "recompute": ["none"]},
    )
    return _folder_of(emitted, t=1, p=2, d=2)


def test_two_nodes_meet_on_the_port_master_port_names(two_nodes, tmp_path):
    """The port torchrun's rendezvous uses on node 0 is taken (another job there): both
    nodes given MASTER_PORT, as a cluster's job environment gives it, run and verify."""
    # The lock: the emitted-line tests' several-node runs use 29500 (they set no MASTER_PORT).
    with one_multinode_job_at_a_time(), socket.socket() as other_job:
        # A two-node job that ended on 29500 just before (another test file, on the other
        # test worker) leaves connections in TIME-WAIT there for about a minute, which a
        # plain bind refuses; SO_REUSEADDR binds past those, and a listener still refuses it.
        other_job.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other_job.bind(("", 29500))
        other_job.listen()
        port = str(_free_port())
        nodes = [
            _start_node(two_nodes, n, tmp_path, "--steps", "2", "--verify", MASTER_PORT=port)
            for n in range(2)
        ]
        done = [_finish(node) for node in nodes]
    for node, (status, _, err) in enumerate(done):
        assert status == 0, err[-3000:]
        # Said before torchrun's silent wait for the other node: which node, and where.
        assert f"node {node} of 2: waiting until all 2 nodes" in err
        assert f"meeting at 127.0.0.1:{port} " in err
    assert "verify: passed" in done[0][1]
    assert (two_nodes / "stagewright-run" / "run-report.json").is_file()


def test_a_node_whose_peers_never_start_gives_up_after_rdzv_timeout(two_nodes, tmp_path):
    """Node 0 started alone, and (on another port) node 1 alone: with RDZV_TIMEOUT=3 each
    torchrun gives up after 3 s of waiting (torch says how long it waited), not after
    torchrun's 15 minutes, and the script's last line says what to do."""
    timeout = 3
    ports = [str(_free_port()) for _ in range(2)]
    with one_multinode_job_at_a_time():
        started = time.monotonic()
        alone = [
            _start_node(two_nodes, n, tmp_path, MASTER_PORT=ports[n], RDZV_TIMEOUT=str(timeout))
            for n in range(2)
        ]
        done = [_finish(node, timeout=120) for node in alone]
        elapsed = time.monotonic() - started
    # torch's words for the wait that ran out, on node 0 (seconds) and node 1 (milliseconds).
    waited = [
        (r"Timed out after (\d+) seconds waiting for clients\. 1/2 clients joined\.", 1),
        (r"The client socket has timed out after (\d+)ms while trying to connect", 1000),
    ]
    for node, ((status, out, err), (pattern, per_second)) in enumerate(
        zip(done, waited, strict=True)
    ):
        assert status != 0 and out == "", err[-3000:]
        assert f"node {node} of 2: waiting until all 2 nodes" in err
        assert f"(torchrun gives up after {timeout} s;" in err
        found = re.search(pattern, err)
        assert found, err[-3000:]
        assert timeout <= int(found[1]) / per_second <= timeout + 2
        assert err.splitlines()[-1].endswith(
            f"run-node{node}.sh: node {node} of 2: the 2 nodes did not all meet at "
            f"127.0.0.1:{ports[node]} within RDZV_TIMEOUT={timeout} s; start every node's "
            "script within that time, each with MASTER_ADDR set to node 0's address (reachable "
            "from every node) and the same MASTER_PORT, or set RDZV_TIMEOUT to wait longer"
        )
    # Each waits its 3 s once torch is imported (seconds on a busy 2-core machine), node 1
    # also one retry's delay: far from the default's 900 s.
    assert elapsed < 60


def test_a_node_whose_copy_of_the_config_is_broken_says_so_and_node_0_stops(two_nodes, tmp_path):
    """Node 1 has its own copy of the folder, with the config cut short: node 1 says what is
    wrong with it (not only node 0's rank 0 may print), and node 0's ranks, which never see
    node 1's ranks join, stop within --timeout with one line each, not a traceback."""
    node1 = tmp_path / "node1-disk"
    shutil.copytree(two_nodes, node1)
    config = node1 / "executor-config.json"
    config.write_text(config.read_text()[:100])
    port = str(_free_port())
    started = time.monotonic()
    nodes = [
        _start_node(folder, n, tmp_path, "--timeout", "10", MASTER_PORT=port)
        for n, folder in enumerate([two_nodes, node1])
    ]
    (status0, _, err0), (status1, _, err1) = (_finish(node, timeout=120) for node in nodes)
    assert status1 != 0 and status0 != 0
    assert "executor.worker: error: executor-config.json is not a valid executor config" in err1
    stopped = [line for line in err0.splitlines() if line.startswith("rank ")]
    assert sorted(line.split(":")[0] for line in stopped) == ["rank 0", "rank 1"], err0[-3000:]
    for line in stopped:
        assert "not every rank joined within --timeout 10s" in line, line
    assert "executor/worker.py" not in err0  # no traceback of a rank
    assert time.monotonic() - started < 90


def test_a_checkpoint_folder_the_nodes_do_not_share_is_refused_before_training(two_nodes, tmp_path):
    """Each node with its own copy of the folder and a relative --checkpoint-dir: node 1's
    ranks would write their shards on node 1's disk, which rank 0 never sees when it marks a
    checkpoint complete (a job that "succeeds" with checkpoints missing half the weights,
    and a resume where the nodes disagree on the step). Refused before the first step."""
    node1 = tmp_path / "node1-disk"
    shutil.copytree(two_nodes, node1)
    port = str(_free_port())
    args = ("--steps", "2", "--checkpoint-dir", "ckpt", "--checkpoint-every", "1")
    nodes = [
        _start_node(folder, n, tmp_path, *args, "--timeout", "20", MASTER_PORT=port)
        for n, folder in enumerate([two_nodes, node1])
    ]
    (status0, _, err0), (status1, _, err1) = (_finish(node, timeout=120) for node in nodes)
    assert (status0, status1) != (0, 0), "a run whose checkpoints miss node 1's shards"
    assert "is not one folder every node shares: ranks 2, 3 do not see" in err0, err0[-3000:]
    assert "is not one folder every node shares" in err1, err1[-3000:]
    assert not list((two_nodes / "ckpt").glob("step_*"))
    assert not list((node1 / "ckpt").glob("step_*"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads process groups in /proc")
@pytest.mark.parametrize("sent", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_node_waiting_for_the_others_stops_on_ctrl_c_or_sigterm(two_nodes, tmp_path, sent):
    """Node 0 alone, in a process group of its own as a terminal starts it, waiting for node 1
    with RDZV_TIMEOUT=120. The signal Ctrl-C sends that group (SIGINT), or a scheduler's
    (SIGTERM), ends every process in it within seconds, not when the wait runs out: a
    blocking wait in torch's C++ that Python's KeyboardInterrupt does not break. The script
    exits with 128 + the signal's number and says what it was doing."""
    timeout = 120
    port = _free_port()
    node = _start_node(
        two_nodes, 0, tmp_path, own_group=True, MASTER_PORT=str(port), RDZV_TIMEOUT=str(timeout)
    )
    try:
        # torchrun waits once its rendezvous store listens on the port (a connection that
        # sends nothing does not count as a node).
        started = time.monotonic()
        while time.monotonic() - started < 90:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert node.poll() is None, node.communicate()[1][-3000:]
            time.sleep(0.2)
        else:
            raise AssertionError("torchrun never listened on MASTER_PORT")
        time.sleep(0.5)
    except BaseException:
        kill_group(node)
        raise
    err, ended = signal_until_gone(node, sent, within=15)
    assert ended < 15 < timeout
    assert node.returncode == 128 + sent
    assert err.splitlines()[-1].endswith(
        f"run-node0.sh: node 0 of 2: interrupted ({sent.name}) while waiting for the other "
        f"nodes at 127.0.0.1:{port}; torchrun stopped. Scripts already started on the other "
        "nodes wait up to their RDZV_TIMEOUT for this one: stop them too, or start this one "
        "again" + RUN_INTERRUPTED_NOTE
    )
    assert "did not all meet" not in err
