"""Where each config's report and checkpoints go when one torchrun runs several configs."""

from __future__ import annotations

from pathlib import Path

from executor.worker import run_folders, run_names


def test_distinct_file_names_name_the_folders():
    assert run_names([Path("a/base.json"), Path("b/bigger.json")]) == ["base", "bigger"]


def test_repeated_file_names_take_their_folder_names():
    # What `stagewright plan --emit` writes: one executor-config.json per candidate folder.
    paths = [Path("launch/candidate-1/executor-config.json"), Path("launch/candidate-2/x.json")]
    paths.append(Path("launch/candidate-2/executor-config.json"))
    assert run_names(paths) == [
        "candidate-1-executor-config",
        "candidate-2-x",
        "candidate-2-executor-config",
    ]


def test_names_that_still_repeat_take_their_position(tmp_path):
    # Two plans emitted side by side both have a candidate-1 folder; the same file named
    # twice is two runs too, each with its own report.
    first = tmp_path / "plan-a" / "candidate-1" / "executor-config.json"
    second = tmp_path / "plan-b" / "candidate-1" / "executor-config.json"
    assert run_names([first, second, first]) == [
        "1-candidate-1-executor-config",
        "2-candidate-1-executor-config",
        "3-candidate-1-executor-config",
    ]


def test_each_of_several_configs_reports_and_checkpoints_in_its_own_folder():
    out, saved = Path("runs"), Path("shared/ckpt")
    one = [Path("candidate-1/executor-config.json")]
    assert run_folders(one, out, saved) == [(out, saved)]
    several = [*one, Path("candidate-2/executor-config.json")]
    assert run_folders(several, out, saved) == [
        (out / "candidate-1-executor-config", saved / "candidate-1-executor-config"),
        (out / "candidate-2-executor-config", saved / "candidate-2-executor-config"),
    ]
    # Without --checkpoint-dir nothing is checkpointed, whatever the number of configs.
    assert [ckpt for _, ckpt in run_folders(several, out, None)] == [None, None]
