"""``stagewright run`` and ``stagewright profile`` as a person runs them: the report next to
the prediction, every bad input with a clear error and a non-zero exit, and ``--verify``
failing on a mismatch with the rank, stage and tensor named."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import main
from executor.launcher import run, torchrun_command
from executor.reporting import REPORT_FILE
from planner.launch import ExecutorConfig
from tests.executor.configs import TINY, make_config, write
from tests.executor.conftest import torchrun

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("job")
    return write(folder, "job", make_config("bpipe", 1, 2, 1, 4, precision="bf16"))


def test_run_prints_each_rank_next_to_the_prediction(capsys, job, tmp_path):
    code = main(["run", str(job), "--steps", "2", "--verify", "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == 0
    assert "step time: measured" in out and "predicted" in out and "on cpu" in out
    assert "verify: passed" in out
    assert out.endswith(f"report: {(tmp_path / 'out' / 'run-report.json').resolve()}\n")
    data = json.loads((tmp_path / "out" / "run-report.json").read_text())
    assert data["format"] == "stagewright.run-report/1"
    assert data["num_steps"] == 2 and len(data["ranks"]) == 2
    for rank in data["ranks"]:
        assert rank["peak_saved_activation_bytes"] > 0
        assert rank["predicted_saved_activation_bytes"] > 0


def test_run_json_says_on_stderr_where_the_report_is(capsys, job, tmp_path):
    """With --json stdout is the report itself; the path of its file was not printed."""
    out = tmp_path / "out"
    assert main(["run", str(job), "--steps", "1", "--json", "--out", str(out)]) == 0
    printed, err = capsys.readouterr()
    assert json.loads(printed)["format"] == "stagewright.run-report/1"
    assert err == f"stagewright run: report: {(out / REPORT_FILE).resolve()}\n"


def test_the_worker_ends_with_where_its_report_is(job):
    """The emitted run-node scripts run the worker from the candidate's folder, so the
    default ./stagewright-run lands beside the config, not where the script was started;
    the worker says where when it finishes."""
    command = torchrun_command(2, "-m", "executor.worker", job.name, "--steps", "1")
    done = subprocess.run(
        command,
        cwd=job.parent,
        capture_output=True,
        text=True,
        env={**os.environ, "GLOO_SOCKET_IFNAME": "lo"},
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    written = job.parent / "stagewright-run" / REPORT_FILE
    assert written.exists()
    assert done.stdout.endswith(f"\nreport: {written.resolve()}\n")


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda tmp: tmp / "missing.json", "cannot read"),
        (lambda tmp: tmp, "cannot read"),  # a folder, not a file
        # Unreadable as text (as root, permissions cannot make a file unreadable here).
        (lambda tmp: _bytes(tmp, b"\xff\xfe{"), "cannot read"),
        (lambda tmp: _text(tmp, "{not json"), "is not a valid executor config"),
        (lambda tmp: _text(tmp, '{"format": "stagewright.executor-config/1"}'), "plan again"),
        (lambda tmp: EXAMPLES / "tiny-cpu.json", "is a plan request, not an executor config"),
    ],
    ids=["missing", "a folder", "not UTF-8", "not JSON", "older format", "a plan request"],
)
def test_a_config_that_cannot_be_used_is_a_one_line_error(capsys, tmp_path, make, message):
    assert main(["run", str(make(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_the_workers_verify_help_says_the_reference_computes_in_the_runs_precision(capsys):
    """run-node0.sh passes its arguments to the worker, whose --verify said "fp32 reference"
    while the reference computes in the run's precision (executor.reference)."""
    from executor.worker import _parse

    with pytest.raises(SystemExit):
        _parse(["--help"])
    described = " ".join(capsys.readouterr().out.split())
    assert "reference computing in the run's precision" in described
    assert "fp32" not in described


def _text(folder, content: str):
    path = folder / "config.json"
    path.write_text(content)
    return path


def _bytes(folder, content: bytes):
    path = folder / "config.json"
    path.write_bytes(content)
    return path


def test_a_config_for_another_world_size_is_refused(capsys, job, tmp_path):
    assert main(["run", str(job), "--nproc", "3"]) == 2
    assert "--nproc 3 does not match" in capsys.readouterr().err
    # Started by torchrun with the wrong number of ranks: the worker says so before any
    # process group exists.
    done = torchrun([job], 1, tmp_path / "out")
    assert done.returncode != 0
    assert "runs t x p x d = 1 x 2 x 1 = 2 ranks, but torchrun started 1" in done.stderr


def test_an_out_folder_that_cannot_be_written_is_refused(capsys, job, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["run", str(job), "--out", str(blocker / "out")]) == 2
    assert "cannot write to" in capsys.readouterr().err
    done = torchrun([job], 2, blocker / "out")
    assert done.returncode != 0 and "cannot write to" in done.stderr


def test_verify_fails_naming_rank_stage_and_tensor(
    capsys, job, tmp_path, monkeypatch, corrupting_env
):
    monkeypatch.setenv("PYTHONPATH", corrupting_env["PYTHONPATH"])
    monkeypatch.setenv("STAGEWRIGHT_TEST_CORRUPT", "1")
    code = main(["run", str(job), "--steps", "1", "--verify", "--out", str(tmp_path / "o")])
    captured = capsys.readouterr()
    assert code == 1
    assert "verification failed" in captured.err
    assert "verify: FAILED" in captured.out
    assert "mismatch: rank 1 stage 1 gradient blocks." in captured.out
    assert "mismatch: rank 0" not in captured.out


def test_verify_of_2bw_names_the_batch_and_weight_version_of_a_gradient(tmp_path, corrupting_env):
    """2BW takes its first two batches' gradients at the initial weights (version 0); with
    rank 0's gradients scaled, --verify names both batches on rank 0's stage, at version 0,
    and nothing on rank 1 (its inputs come from the initial weights, which are right)."""
    config = write(tmp_path, "stale", make_config("2bw", 1, 2, 1, 2))
    outcome = run(
        config,
        steps=3,
        verify=True,
        env={**corrupting_env, "STAGEWRIGHT_TEST_CORRUPT": "0"},
        out_dir=tmp_path / "out",
    )
    check = outcome.report.verification
    assert check is not None and not check.passed
    assert {m.kind for m in check.mismatches} == {"gradient"}
    assert {(m.rank, m.stage, m.weight_version) for m in check.mismatches} == {(0, 0, 0)}
    assert {m.tensor[-9:] for m in check.mismatches} == {"(batch 0)", "(batch 1)"}
    assert "gradients of the first two batches" in check.compared


def test_verify_of_a_resumed_2bw_run_checks_the_batches_it_resumed_with(tmp_path):
    """Resumed two steps in (t = 2, SGD), a 2BW run's first two batches are taken at the
    weights it resumed from; the reference reaches them by replaying the first run (SGD's
    update is linear in the gradient, so the replay matches up to rounding) and the
    gradients agree."""
    config = write(tmp_path, "stale", make_config("2bw", 2, 2, 1, 2, optimizer="sgd"))
    folder = tmp_path / "checkpoints"
    first = run(config, steps=2, checkpoint_dir=folder, checkpoint_every=2, out_dir=tmp_path / "a")
    assert first.report.num_steps == 2
    resumed = run(
        config,
        steps=4,
        verify=True,
        checkpoint_dir=folder,
        checkpoint_every=2,
        out_dir=tmp_path / "b",
    )
    assert resumed.report.first_step == 2
    check = resumed.report.verification
    assert check is not None and check.passed, check
    assert "taken at the weights of step 2" in check.compared and check.checked > 0
    assert "Adam" not in check.compared


def test_profile_writes_a_point_the_planner_reads(capsys, tmp_path):
    model = tmp_path / "model.json"
    model.write_text(json.dumps({"model": TINY}))
    code = main(
        ["profile", str(model), "--out", str(tmp_path / "profiles"), "--repeats", "1", "--json"]
    )
    assert code == 0
    point = json.loads(capsys.readouterr().out)["point"]
    assert point["activation_bytes"] > 0 and point["forward_ms"] > 0
    assert len(list((tmp_path / "profiles" / "layers").glob("*.json"))) == 1
    code = (
        "from planner.profiles import JsonProfileStore; store = JsonProfileStore.load(); "
        "print(sum(1 for p in store.layer_points('cpu') if p.activation_bytes))"
    )
    found = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"STAGEWRIGHT_PROFILES": str(tmp_path / "profiles"), "PATH": "/usr/bin:/bin"},
        check=True,
    )
    assert found.stdout.strip() == "1"


@pytest.mark.parametrize("t", [2, 4])
def test_profile_of_a_tensor_parallel_shard_keeps_what_one_rank_keeps(capsys, tmp_path, t):
    """`profile --t` times one rank's shard on its own (no group, collectives skipped). Its
    last stage keeps what one rank of Megatron-LM's vocabulary-parallel cross-entropy keeps,
    counted by hand for TINY (s 32, b 1, h 64, V 128, fp32): the final norm's input and its
    per-token mean and rstd, the output layer's input, the softmax of this rank's V / t
    logits, the shifted target ids (int64) and which fell outside the slice (bool). The
    planner then prices the t-way candidates of that shape (without sequence parallelism, as
    profiled) from the point. (It failed with IndexError: the shard's V / t logits were
    handed the whole vocabulary's targets.)"""
    model = tmp_path / "model.json"
    model.write_text(json.dumps({"model": TINY}))
    folder = tmp_path / "profiles"
    code = main(
        ["profile", str(model), "--t", str(t), "--out", str(folder), "--repeats", "1", "--json"]
    )
    assert code == 0, capsys.readouterr().err
    point = json.loads(capsys.readouterr().out)["point"]
    sb, h, vocab = 32 * 1, 64, 128
    norm_input = output_input = 4 * sb * h
    norm_stats = 2 * 4 * sb
    softmax = 4 * sb * (vocab // t)
    ids, outside = 8 * sb, sb
    assert point["t"] == t
    assert point["last_stage_extra_bytes"] == (
        norm_input + norm_stats + output_input + softmax + ids + outside
    )
    from planner.costmodel.timing import layer_times
    from planner.profiles import BUNDLED_PROFILES, JsonProfileStore
    from planner.specs import ModelSpec, TrainingSpec

    store = JsonProfileStore.load(BUNDLED_PROFILES, folder)
    times = layer_times(
        list(store.layer_points("cpu")),
        store.hardware("cpu"),
        ModelSpec.model_validate(TINY),
        TrainingSpec(global_batch_size=1, precision="fp32", sequence_parallel=False),
        1,
        t,
        "none",
    )
    assert times.origin == "measured"
    assert times.forward == pytest.approx(point["forward_ms"] / 1e3)


def test_profile_into_the_service_store(capsys, tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    assert main(["profiles", "load", "--database-url", url]) == 0
    model = tmp_path / "model.json"
    model.write_text(json.dumps(TINY))
    capsys.readouterr()
    assert main(["profile", str(model), "--database-url", url, "--repeats", "1"]) == 0
    assert "stored in" in capsys.readouterr().out
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    with engine.connect() as connection:
        rows = connection.execute(
            text("SELECT COUNT(*) FROM layer_profiles WHERE gpu = 'cpu'")
        ).scalar_one()
    engine.dispose()
    assert rows == 1


def test_profile_needs_a_destination(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("STAGEWRIGHT_PROFILES", raising=False)
    model = tmp_path / "model.json"
    model.write_text(json.dumps(TINY))
    assert main(["profile", str(model), "--repeats", "1"]) == 2
    assert "say where to store the point" in capsys.readouterr().err


def test_run_and_profile_record_measured_runs_that_calibrate_reads(capsys, job, tmp_path):
    """`--record` stores what the executor measured as measured runs of the hardware it ran
    on (cpu here): the run's step time, the profiled layer's passes; calibrate fits them."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    code = main(
        [
            "run",
            str(job),
            "--steps",
            "2",
            "--out",
            str(tmp_path / "o"),
            "--record",
            "--database-url",
            url,
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and re.search(r"recorded in sqlite:.*\(measured run \d+, stored\)", out)
    report = json.loads((tmp_path / "o" / "run-report.json").read_text())
    model = tmp_path / "model.json"
    model.write_text(json.dumps(TINY))
    code = main(
        [
            "profile",
            str(model),
            "--out",
            str(tmp_path / "p"),
            "--repeats",
            "1",
            "--record",
            "--database-url",
            url,
        ]
    )
    assert code == 0 and "recorded in" in capsys.readouterr().out
    assert main(["measurements", "list", "--gpu", "cpu", "--json", "--database-url", url]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [r["origin"] for r in runs] == ["executor", "executor"]
    step, passes = runs[0], runs[1]
    assert step["measured"]["step_time_s"] == report["measured"]["step_time_s"]
    assert step["config"]["schedule"] == report["config"]["schedule"] == "bpipe"
    assert step["cluster"] == {"gpu": "cpu", "num_nodes": 1, "gpus_per_node": 2}
    assert passes["measured"]["kind"] == "pass" and passes["measured"]["forward_ms"] > 0
    code = main(
        [
            "calibrate",
            "--hardware",
            "cpu",
            "--parameter",
            "gemm_efficiency",
            "--dry-run",
            "--database-url",
            url,
        ]
    )
    assert code == 0 and "fitted to 2 measured run(s)" in capsys.readouterr().out


def test_record_needs_two_steps(capsys, job):
    assert main(["run", str(job), "--steps", "1", "--record"]) == 2
    assert "--record needs at least 2 steps" in capsys.readouterr().err


def test_a_rank_whose_verify_fails_exits_with_status_3(job, tmp_path, corrupting_env):
    """The worker ends with os._exit(status) (executor/worker.py): the mismatch's status 3
    must still reach torchrun, which names each failed rank's exit code."""
    done = torchrun(
        [job],
        2,
        tmp_path / "o",
        "--steps",
        "1",
        "--verify",
        env={**corrupting_env, "STAGEWRIGHT_TEST_CORRUPT": "1"},
    )
    assert done.returncode != 0
    assert "verify: FAILED" in done.stdout
    assert re.search(r"exitcode\s*:\s*3\b", done.stderr), done.stderr[-2000:]


def test_record_on_cpu_needs_a_core_per_rank(capsys, job, monkeypatch):
    """A CPU run's ranks sharing fewer cores took turns, and its step time (contention, not
    a device's speed) was recorded for calibrate to fit as the cpu profile's: refused before
    torchrun starts, naming both counts."""
    import executor.launcher

    def must_not_start(*args, **kwargs):
        raise AssertionError("torchrun was started")

    monkeypatch.setattr(executor.launcher.subprocess, "run", must_not_start)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert main(["run", str(job), "--steps", "2", "--record"]) == 2
    err = capsys.readouterr().err
    assert "--record on CPU needs a core per rank: this run's 2 ranks would share 1 CPU(s)" in err
    assert "at most 1 device(s)" in err


def test_a_checkpoint_already_at_the_last_step_is_refused_with_nothing_to_do(capsys, job, tmp_path):
    """Run again with a checkpoint folder that holds the last step: the ranks resumed, took
    no step and failed on an empty list of step times (StatisticsError), leaving a report of
    0 steps. Now it is refused before any rank starts (stagewright run), or before any rank
    joins (the worker, as the emitted run-node scripts start it), and no report is written."""
    folder = tmp_path / "ck"
    first = run(job, steps=2, checkpoint_dir=folder, checkpoint_every=1, out_dir=tmp_path / "a")
    assert first.report.num_steps == 2
    capsys.readouterr()
    again = tmp_path / "b"
    argv = ["run", str(job), "--steps", "2", "--checkpoint-dir", str(folder), "--out", str(again)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        f"stagewright run: error: nothing to do: the checkpoint in {folder} is already at step "
        "2 (asked for --steps 2); give more --steps or another --checkpoint-dir\n"
    )
    assert not (again / REPORT_FILE).exists()
    done = torchrun([job], 2, again, "--steps", "1", "--checkpoint-dir", str(folder), timeout=120)
    assert done.returncode != 0
    assert "executor.worker: error: nothing to do" in done.stderr
    assert "asked for --steps 1" in done.stderr
    assert "StatisticsError" not in done.stderr and "rank 0: stopped" not in done.stderr
    assert not (again / REPORT_FILE).exists()


def test_a_config_whose_schedule_name_is_not_its_actions_is_refused_before_any_rank(
    capsys, tmp_path
):
    """An interleaved config renamed "1f1b" (actions kept) ran and was reported as 1f1b;
    with --record it then died on a ValidationError traceback. It is refused in one line
    before torchrun starts, and nothing is written."""
    config = ExecutorConfig.model_validate(make_config("interleaved", 1, 2, 1, 4))
    data = config.materialized().model_dump(mode="json")
    data["schedule"]["name"] = "1f1b"
    path = write(tmp_path, "renamed", data)
    out = tmp_path / "out"
    code = main(
        ["run", str(path), "--steps", "2", "--record", "--out", str(out)]
        + ["--database-url", f"sqlite:///{tmp_path / 'runs.db'}"]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("stagewright run: error: ")
    assert "schedule.name is '1f1b', but its actions place 4 stages on 2 devices" in err
    assert not out.exists() and not (tmp_path / "runs.db").exists()
