"""The plan's torch-pipelining.csv runs on torch.distributed.pipelining's own runtime.

A tiny model is planned on two cpu ranks for one schedule of each placement the CSV
expresses (one stage per rank, loop, V), with a recompute mode each and the executor's
dropout on; the command the emitted README gives for the candidate is run exactly as
written, in its folder. torch's ``_PipelineScheduleRuntime`` loads the CSV and drives the
executor's stages through it; ``--verify`` compares the first step's gradients and losses
with the single-process reference, and the test compares every printed step's mean loss
with the reference's (the second step depends on the first step's gradients and update).
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from cli.main import main as cli_main
from executor.inputs import read_config
from executor.reference import reference_run
from executor.torch_pipelining import EXIT_BAD_INPUT
from executor.torch_pipelining import main as runner_main
from tests.executor.configs import TINY
from tests.executor.conftest import VENV_BIN

MODEL = TINY  # hidden 64, 8 layers, 4 heads, sequence 32, vocabulary 128
CASES = [("1f1b", "selective"), ("interleaved", "none"), ("v-zb", "full")]
LATER_REL = 1e-3  # Adam magnifies rounding of near-zero gradients (executor.verify)


def _emit(folder: Path, schedule: str, recompute: str, precision: str = "fp32") -> Path:
    """``stagewright plan --emit`` of the case; the folder of its (t, p, d) = (1, 2, 1)
    candidate."""
    request = {
        "model": MODEL,
        "cluster": {"gpu": "cpu", "num_nodes": 1, "gpus_per_node": 2},
        "training": {
            "global_batch_size": 4,
            "precision": precision,
            "optimizer": "adam",
            "distributed_optimizer": False,
            "sequence_parallel": False,
        },
        "search": {
            "schedules": [schedule],
            "recompute": [recompute],
            "micro_batch_sizes": [1],
            "top_k": 100,
        },
    }
    (folder / "request.json").write_text(json.dumps(request))
    with redirect_stdout(io.StringIO()):
        assert cli_main(["plan", str(folder / "request.json"), "--emit", str(folder / "out")]) == 0
    return next(
        path.parent
        for path in sorted((folder / "out").glob("candidate-*/candidate.json"))
        if (lambda c: (c["t"], c["p"], c["d"]))(json.loads(path.read_text())["config"]) == (1, 2, 1)
    )


def _readme_command(candidate: Path) -> str:
    """The command the emitted README gives for this candidate's CSV."""
    readme = (candidate.parent / "README.md").read_text()
    entry = readme.split(f"- {candidate.name}:", 1)[1].split("\n- candidate-", 1)[0]
    found = re.search(r"`(torchrun [^`]*executor\.torch_pipelining[^`]*)`", entry)
    assert found, entry
    return found.group(1)


@pytest.mark.parametrize("schedule, recompute", CASES, ids=[c[0] for c in CASES])
def test_the_emitted_csv_runs_on_torchs_runtime_like_one_process(
    tmp_path: Path, schedule: str, recompute: str
) -> None:
    candidate = _emit(tmp_path, schedule, recompute)
    command = _readme_command(candidate)
    assert command == (
        "torchrun --standalone --nproc-per-node=2 -m executor.torch_pipelining "
        "executor-config.json torch-pipelining.csv --verify"
    )
    config = read_config(candidate / "executor-config.json")
    assert config.ir.name == schedule and config.dropout > 0
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=candidate,
        env={"PATH": f"{VENV_BIN}{os.pathsep}{os.defpath}"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "verify passed" in done.stdout, done.stdout
    printed = [float(x) for x in re.findall(r"step \d+: mean loss (\S+)", done.stdout)]
    _, losses = reference_run(config, [1, 1])
    expected = [sum(step) / len(step) for step in losses]
    assert len(printed) == 2
    assert printed[0] == pytest.approx(expected[0], rel=1e-6)
    assert printed[1] == pytest.approx(expected[1], rel=LATER_REL)


def test_a_config_the_runner_cannot_compare_is_refused_with_what_to_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    candidate = _emit(tmp_path, "1f1b", "none", precision="bf16")
    config, csv = candidate / "executor-config.json", candidate / "torch-pipelining.csv"
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert runner_main([str(config), str(csv)]) == EXIT_BAD_INPUT
    assert "precision bf16" in capsys.readouterr().err
    # And the README does not offer the runner for it.
    assert "executor.torch_pipelining" not in (candidate.parent / "README.md").read_text()


def test_the_wrong_number_of_ranks_and_a_missing_csv_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    candidate = _emit(tmp_path, "1f1b", "none")
    config = candidate / "executor-config.json"
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert runner_main([str(config), str(candidate / "torch-pipelining.csv")]) == EXIT_BAD_INPUT
    assert "--nproc-per-node=2" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert runner_main([str(config), str(candidate / "missing.csv")]) == EXIT_BAD_INPUT
    assert "missing.csv" in capsys.readouterr().err
