"""A rank that dies or hangs stops the job with a clear error within the timeout; restarting
resumes from the last checkpoint and ends where an uninterrupted run ends."""

from __future__ import annotations

import time

import pytest
import torch

from executor.launcher import ExecutorError, run
from tests.executor.configs import make_config, write
from tests.executor.conftest import reports, torchrun


def test_a_rank_that_dies_stops_the_job_and_a_restart_resumes(tmp_path):
    config = write(tmp_path, "job", make_config("1f1b", 1, 2, 1, 4))
    checkpoints = tmp_path / "ckpt"
    started = time.perf_counter()
    with pytest.raises(ExecutorError) as failure:
        run(
            config,
            steps=3,
            timeout_s=15,
            checkpoint_dir=checkpoints,
            checkpoint_every=1,
            env={"STAGEWRIGHT_FAIL_AT": "1:1"},
            out_dir=tmp_path / "first",
        )
    assert time.perf_counter() - started < 90
    assert "rank" in str(failure.value)
    # The restart picks up after the checkpoint of step 0 and finishes steps 1 and 2.
    resumed = run(
        config,
        steps=3,
        timeout_s=15,
        checkpoint_dir=checkpoints,
        checkpoint_every=1,
        out_dir=tmp_path / "second",
    )
    assert all(r["first_step"] == 1 for r in resumed.ranks)
    assert [s["step"] for s in resumed.ranks[0]["steps"]] == [1, 2]
    # ...and ends with the weights of a run that never failed.
    done = torchrun([config], 2, tmp_path / "straight", "--steps", "3", "--dump-weights")
    assert done.returncode == 0, done.stderr[-2000:]
    again = torchrun(
        [config],
        2,
        tmp_path / "resumed-weights",
        "--steps",
        "3",
        "--dump-weights",
        "--checkpoint-dir",
        str(checkpoints),
    )
    assert again.returncode == 0, again.stderr[-2000:]
    for rank in range(2):
        straight = torch.load(tmp_path / "straight" / f"rank{rank}.weights.pt")
        resumed_weights = torch.load(tmp_path / "resumed-weights" / f"rank{rank}.weights.pt")
        for name, value in straight.items():
            torch.testing.assert_close(resumed_weights[name], value)
    assert reports(tmp_path / "resumed-weights", None, 2)[0]["first_step"] == 3


def test_a_rank_that_hangs_makes_the_others_stop_within_the_timeout(tmp_path):
    config = write(tmp_path, "job", make_config("1f1b", 1, 2, 1, 4))
    started = time.perf_counter()
    with pytest.raises(ExecutorError) as failure:
        run(
            config,
            steps=2,
            timeout_s=8,
            env={"STAGEWRIGHT_HANG_AT": "1:0"},
            out_dir=tmp_path / "out",
        )
    elapsed = time.perf_counter() - started
    assert elapsed < 90, elapsed
    assert "rank 0: stopped" in str(failure.value)


def test_a_config_for_another_world_size_is_refused(tmp_path):
    config = write(tmp_path, "job", make_config("1f1b", 1, 2, 1, 4))
    with pytest.raises(Exception, match="--nproc 3 does not match"):
        run(config, nproc=3)


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA GPU: the nccl path and CUDA streams are only exercised on a GPU machine",
)
def test_the_nccl_path_runs_on_gpus(tmp_path):  # pragma: no cover - no GPU on CI
    config = write(tmp_path, "job", make_config("1f1b", 1, torch.cuda.device_count(), 1, 4))
    result = run(config, steps=1, verify=True)
    assert all(r["verify"]["max_grad_error"] < 1e-4 for r in result.ranks)
