"""The worker (what the emitted scripts' torchrun line runs) refuses the run options
``stagewright run`` refuses, with the same words (one function checks both), before its rank
joins any group: one line and status 2, not a c10d error blamed on the peers, and not an
option ignored without a word."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import main


def _config(tmp_path: Path) -> Path:
    from planner.launch.files import launch_files
    from planner.plan import plan
    from planner.specs import PlanRequest

    request = {
        "model": {
            "name": "tiny-gpt",
            "num_layers": 2,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "seq_length": 32,
            "vocab_size": 128,
        },
        "cluster": {"gpu": "cpu", "num_nodes": 1, "gpus_per_node": 1},
        "training": {"global_batch_size": 2, "precision": "fp32"},
        "search": {"schedules": ["1f1b"], "recompute": ["none"], "micro_batch_sizes": [1]},
    }
    files = {f.path: f.content for f in launch_files(plan(PlanRequest.model_validate(request)))}
    path = tmp_path / "executor-config.json"
    path.write_text(files["candidate-1/executor-config.json"])
    return path


@pytest.mark.parametrize(
    "options",
    [
        ["--timeout", "0"],
        ["--timeout", "-5"],
        ["--checkpoint-every", "2"],
        ["--checkpoint-dir", "ck", "--checkpoint-every", "-1"],
        ["--lr", "nan"],
    ],
)
def test_the_worker_refuses_what_stagewright_run_refuses_in_the_same_words(
    tmp_path, capsys, monkeypatch, options
):
    monkeypatch.chdir(tmp_path)
    config = _config(tmp_path)
    assert main(["run", str(config), *options]) == 2
    said = capsys.readouterr().err
    assert said.startswith("stagewright run: error: ") and said.count("\n") == 1, said
    done = subprocess.run(
        [sys.executable, "-m", "executor.worker", str(config), *options],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr == said.replace("stagewright run: error: ", "executor.worker: error: ")
    assert not (tmp_path / "ck").exists() and not (tmp_path / "stagewright-run").exists()
