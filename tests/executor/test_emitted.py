"""The heart of launching: plan a tiny model on the cpu profile, emit the launch artefacts,
and run them on 4 gloo ranks, for every schedule, with recompute none, selective and full, in
bf16. Each run is compared with the single-process reference: every micro-batch's loss of
every step (the later steps depend on the earlier updates, so this checks the gradients and
the optimizer too), and each rank's saved activations with the planner's prediction.

The emitted torchrun line is run exactly as the plan wrote it (only MASTER_ADDR set, and PATH
to the installed stagewright) on one node, through the run-node script with ``--verify``, and
through two nodes' scripts. That line is the same text for every schedule (it names the
folder's ``executor-config.json``; only the node layout changes it), which the tests assert:
what a schedule changes is the config. So the other schedules' emitted configs run together
under one torchrun of the same worker, one job instead of ten (each 4-rank job spends about
ten CPU-seconds importing torch)."""

from __future__ import annotations

import io
import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from cli.main import main
from executor.reference import reference_run
from executor.worker import run_names
from planner.launch import ExecutorConfig, RunReport
from tests.executor.conftest import VENV_BIN, one_multinode_job_at_a_time, report, torchrun

MODEL = {
    "name": "tiny-gpt",
    "num_layers": 8,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "seq_length": 32,
    "vocab_size": 128,
}
# (schedule, recompute, nodes, through the launch script with --verify, model layers): every
# schedule once, each recompute mode on at least two schedules; a covering set, not the 24-run
# cross product (each run is a 4-rank job).
LINES = [  # each run by its own emitted line or scripts, exactly as printed
    ("gpipe", "none", 1, False, 8),
    ("1f1b", "selective", 1, True, 8),
    ("2bw", "full", 2, True, 8),
]
SHARED = [  # their emitted configs, run together under one torchrun with --verify
    ("interleaved", "full", 1, True, 8),
    ("bpipe", "selective", 2, True, 8),
    ("v-min", "full", 1, True, 8),
    ("v-half", "none", 1, True, 8),
    ("v-zb", "selective", 1, True, 8),
    ("1f1b-v", "none", 1, True, 8),
    ("bpipe-interleaved", "selective", 1, True, 8),
    # Stages that hold no layer: 6 layers over V-ZB's 8 stages leave the embedding and the
    # output layer alone on rank 0 (the V-shape paper's layout, §4.1); 3 over 1F1B's 4 leave
    # rank 0 only the embedding, with the other ranks' layers recomputed.
    ("v-zb", "none", 1, True, 6),
    ("1f1b", "full", 1, True, 3),
    # Four chunks per device (search.num_chunks [4]): 16 stages of one layer on 4 ranks.
    ("interleaved", "none", 1, True, 16, 4),
]
STEPS = 3  # what the worker runs when the line does not say
LATER_REL = 1e-3


def _request(
    schedule: str, recompute: str, nodes: int, layers: int, chunks: int | None = None
) -> dict[str, object]:
    return {
        "model": {**MODEL, "num_layers": layers},
        "cluster": {"gpu": "cpu", "num_nodes": nodes, "gpus_per_node": 4 // nodes},
        "training": {
            "global_batch_size": 8,
            "precision": "bf16",
            "optimizer": "adam",
            "distributed_optimizer": False,
            "sequence_parallel": False,
        },
        "search": {
            "schedules": [schedule],
            "allow_stale_weights": schedule == "2bw",
            "recompute": [recompute],
            "micro_batch_sizes": [1],
            "top_k": 100,
            **({} if chunks is None else {"num_chunks": [chunks]}),
        },
    }


def _run_nodes(folder: Path, commands: list[str]) -> list[subprocess.CompletedProcess[str]]:
    env = {"PATH": f"{VENV_BIN}{os.pathsep}{os.defpath}", "MASTER_ADDR": "127.0.0.1"}
    started = [
        subprocess.Popen(
            ["bash", "-c", command],
            cwd=folder,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for command in commands
    ]
    done = []
    for process in started:
        out, err = process.communicate(timeout=600)
        done.append(subprocess.CompletedProcess(process.args, process.returncode, out, err))
    return done


def _case_id(case: tuple[object, ...]) -> str:
    name = str(case[0])
    if case[4] != MODEL["num_layers"]:
        name += f"-{case[4]}-layers"
    if len(case) > 5:
        name += f"-{case[5]}-chunks"
    return name


def _emit(folder: Path, case: tuple[Any, ...]) -> Path:
    """Plan the case with ``stagewright plan --emit`` into ``folder``; the candidate folder of
    the (t, p, d) = (1, 4, 1) configuration, checked for its layer split and its lines."""
    schedule, recompute, nodes, _, layers, *rest = case
    chunks = rest[0] if rest else None
    request_file = folder / "request.json"
    request_file.write_text(json.dumps(_request(schedule, recompute, nodes, layers, chunks)))
    emitted = folder / "launch"
    with redirect_stdout(io.StringIO()):
        assert main(["plan", str(request_file), "--emit", str(emitted)]) == 0
    candidate_folder = next(
        path.parent
        for path in sorted(emitted.glob("candidate-*/candidate.json"))
        if (lambda c: (c["t"], c["p"], c["d"]) == (1, 4, 1))(json.loads(path.read_text())["config"])
    )
    candidate = json.loads((candidate_folder / "candidate.json").read_text())
    split = candidate["config"]["layers_per_stage"]
    if chunks is not None:  # the candidate, its executor config and the run: v chunks
        assert candidate["config"]["num_chunks"] == chunks and len(split) == 4 * chunks
    assert sum(split) == layers and (min(split) == 0) == (layers < len(split)), split
    # The line the LINES cases run as printed, for every case with as many nodes.
    assert candidate["launch"]["torchrun"] == _printed_lines(nodes), candidate["launch"]
    return candidate_folder


def _printed_lines(nodes: int) -> list[str]:
    target = "-m executor.worker executor-config.json"
    if nodes == 1:
        return [f"torchrun --standalone --nproc-per-node=4 {target}"]
    return [
        f"torchrun --nnodes={nodes} --node-rank={node} --nproc-per-node={4 // nodes} "
        f"--master-addr=$MASTER_ADDR --master-port=${{MASTER_PORT:-29500}} "
        f"--rdzv-conf=timeout=${{RDZV_TIMEOUT:-900}} {target}"
        for node in range(nodes)
    ]


@pytest.mark.parametrize("case", LINES, ids=[_case_id(c) for c in LINES])
def test_the_emitted_torchrun_line_runs_and_trains_like_one_process(tmp_path, case):
    _, _, nodes, script, *_ = case
    folder = _emit(tmp_path, case)
    lines = _printed_lines(nodes)
    if script:  # the script holds the very line; extra arguments go to the executor
        for node, line in enumerate(lines):
            assert line + ' "$@"' in (folder / f"run-node{node}.sh").read_text()
        commands = [f"bash run-node{node}.sh --verify" for node in range(nodes)]
    else:
        commands = lines
    with one_multinode_job_at_a_time() if nodes > 1 else _nothing():
        done = _run_nodes(folder, commands)
    for result in done:
        assert result.returncode == 0, result.stderr[-3000:]
    assert "step time: measured" in done[0].stdout
    _check_run(folder, report(folder / "stagewright-run"), case)


@pytest.fixture(scope="module")
def shared_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, RunReport]]:
    """The SHARED cases' emitted configs, run one after the other under one torchrun with
    ``--verify``: each case's candidate folder and report."""
    root = tmp_path_factory.mktemp("shared")
    folders = {}
    for case in SHARED:
        (root / _case_id(case)).mkdir()
        folders[_case_id(case)] = _emit(root / _case_id(case), case)
    configs = [folder / "executor-config.json" for folder in folders.values()]
    out = root / "runs"
    done = torchrun(configs, 4, out, "--verify")
    assert done.returncode == 0, done.stderr[-3000:]
    # Every emitted config is executor-config.json, in folders that repeat their names too
    # (candidate-N of each plan): each run gets a folder of its own nonetheless.
    names = run_names(configs)
    assert len(set(names)) == len(configs)
    assert done.stdout.count("report: ") == len(configs)
    return {
        case: (folder, report(out / name))
        for (case, folder), name in zip(folders.items(), names, strict=True)
    }


@pytest.mark.parametrize("case", SHARED, ids=[_case_id(c) for c in SHARED])
def test_each_emitted_config_trains_like_one_process(shared_runs, case):
    folder, run = shared_runs[_case_id(case)]
    _check_run(folder, run, case)


def _check_run(folder: Path, run: RunReport, case: tuple[Any, ...]) -> None:
    """The run of the case's emitted config against the reference and the prediction."""
    schedule, recompute, _, verified, _, *rest = case
    chunks = rest[0] if rest else None
    config = ExecutorConfig.model_validate_json((folder / "executor-config.json").read_text())
    assert run.num_steps == STEPS and len(run.ranks) == 4
    assert run.config.schedule == schedule and run.config.precision == "bf16"
    if chunks is not None:
        assert config.ir.num_stages == 4 * chunks
        assert [len(config.ir.stages_of(d)) for d in range(4)] == [chunks] * 4
    assert {mode for stage in run.config.recompute_per_stage for mode in stage.as_dict()} == {
        recompute
    }
    if verified:
        assert run.verification is not None and run.verification.passed
        assert run.verification.checked > 0

    # Every loss of every step, against one process training the same model the same way.
    # The first step computes exactly what the reference computes. Later steps start from
    # weights Adam updated: a schedule sums the micro-batches' fp32 gradients in its own
    # order, and where a gradient is zero up to rounding (the key bias: softmax ignores it)
    # Adam turns that rounding into a full-size step, so the losses then agree to LATER_REL.
    segments = [STEPS] if run.continuous else [1] * STEPS
    _, expected = reference_run(config, segments)
    last = config.ir.num_stages - 1
    m = config.num_microbatches
    for rank in (r for r in run.ranks if last in r.stages):
        for step in rank.steps:
            mine = expected[step.step][rank.dp * m : (rank.dp + 1) * m]
            rel = 1e-6 if step.step == 0 else LATER_REL
            assert step.losses == pytest.approx(mine, rel=rel), (rank.rank, step.step)

    # What the planner priced is what ran: saved activations per rank within 1%.
    assert run.predicted is not None and run.measured.step_time_s is not None
    for rank in run.ranks:
        predicted = rank.predicted_saved_activation_bytes
        assert predicted is not None
        assert rank.peak_saved_activation_bytes == pytest.approx(predicted, rel=0.01), rank


@contextmanager
def _nothing() -> Iterator[None]:
    yield
