"""``stagewright simulate`` as a person and a script use it."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import _build_parser, main
from planner.schedules import SCHEDULE_NAMES, generate, schedule_family
from planner.simulate import Durations, simulate


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_json_output_is_the_contract(capsys):
    code, out, err = run(
        capsys,
        "simulate",
        "--schedule",
        "1f1b",
        "--devices",
        "4",
        "--microbatches",
        "8",
        "--f",
        "1",
        "--b",
        "0.6",
        "--w",
        "0.4",
        "--json",
    )
    assert code == 0 and err == ""
    data = json.loads(out)
    assert set(data) == {"makespan", "bubble_fraction", "peak_activation_fraction", "devices"}
    assert data["makespan"] == pytest.approx(11 * 2)
    assert data["bubble_fraction"] == pytest.approx(3 / 11)
    assert data["peak_activation_fraction"] == pytest.approx([1.0, 0.75, 0.5, 0.25])
    assert len(data["devices"]) == 4


def test_comm_is_added_to_every_cross_device_edge(capsys):
    args = [
        "simulate",
        "--schedule",
        "gpipe",
        "--devices",
        "3",
        "--microbatches",
        "1",
        "--f",
        "1",
        "--b",
        "1",
        "--json",
    ]
    _, out, _ = run(capsys, *args)
    _, out_comm, _ = run(capsys, *args, "--comm", "0.25")
    # One micro-batch crosses 2 edges forward and 2 backward.
    assert json.loads(out_comm)["makespan"] == pytest.approx(json.loads(out)["makespan"] + 1.0)


def test_text_output_shows_a_timeline(capsys):
    code, out, _ = run(
        capsys,
        "simulate",
        "--schedule",
        "v-half",
        "--devices",
        "4",
        "--microbatches",
        "8",
        "--f",
        "1",
        "--b",
        "1",
        "--w",
        "1",
        "--width",
        "60",
    )
    assert code == 0
    assert "bubble fraction" in out
    rows = [line for line in out.splitlines() if line.startswith("dev ")]
    assert len(rows) == 4
    assert all(len(row.split("|")[1]) == 60 for row in rows)
    assert {"F", "B", "W"} <= set(rows[0])


def test_per_stage_times_are_accepted(capsys):
    code, out, _ = run(
        capsys,
        "simulate",
        "--schedule",
        "1f1b",
        "--devices",
        "2",
        "--microbatches",
        "2",
        "--f",
        "1,2",
        "--b",
        "2,4",
        "--json",
    )
    assert code == 0
    assert json.loads(out)["devices"][1]["busy"] == pytest.approx(12)


def test_no_overlap_with_a_transfer_time_blocks_the_device(capsys):
    """With --transfer above 0, --no-overlap is taken and does what the simulator does with
    blocking transfers (its own Durations, not the command line)."""
    args = ["simulate", "--schedule", "bpipe", "--devices", "4", "--microbatches", "8"]
    args += ["--f", "1", "--b", "2", "--transfer", "0.5", "--json"]
    code, overlapping, err = run(capsys, *args)
    assert code == 0, err
    code, blocking, err = run(capsys, *args, "--no-overlap")
    assert code == 0 and err == ""
    expected = simulate(
        generate("bpipe", 4, 8), Durations(1.0, 2.0, transfer=0.5, overlap_transfers=False)
    )
    assert json.loads(blocking) == expected.to_contract()
    assert json.loads(blocking)["makespan"] > json.loads(overlapping)["makespan"]


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--schedule", "interleaved", "--devices", "4", "--microbatches", "6"],
            "multiple of the number of devices",
        ),
        (["--schedule", "1f1b", "--devices", "4", "--microbatches", "0"], "at least 1"),
        (
            ["--schedule", "1f1b", "--devices", "2", "--microbatches", "2", "--comm", "-1"],
            "comm time",
        ),
        (
            ["--schedule", "1f1b", "--devices", "4", "--microbatches", "4", "--f", "1,2"],
            "got 2 values for 4 stages",
        ),
        (
            ["--schedule", "v-half", "--devices", "4", "--microbatches", "4", "--chunks", "2"],
            "--chunks does not apply to v-half (it takes no parameter)",
        ),
        (
            ["--schedule", "interleaved", "--devices", "4", "--microbatches", "4", "--batches"]
            + ["3"],
            "--batches does not apply to interleaved (it takes --chunks)",
        ),
        # Issue 13's must-shows: a limit below every schedule of the family names the
        # smallest feasible one; a limit on a schedule without one is refused.
        (
            ["--schedule", "v-adaptive", "--devices", "8", "--microbatches", "32"]
            + ["--memory-limit", "0.2"],
            "the smallest feasible memory_limit is 0.5 (8 of 16 stage activations)",
        ),
        (
            ["--schedule", "zb-adaptive", "--devices", "8", "--microbatches", "32"]
            + ["--memory-limit", "0.1"],
            "smallest feasible memory_limit is 0.125",
        ),
        (
            ["--schedule", "v-half", "--devices", "8", "--microbatches", "32"]
            + ["--memory-limit", "0.5"],
            "--memory-limit does not apply to v-half",
        ),
        (
            ["--schedule", "1f1b-v", "--devices", "8", "--microbatches", "32"]
            + ["--memory-limit", "0.7"],
            "--memory-limit does not apply to 1f1b-v",
        ),
        (
            ["--schedule", "v-adaptive", "--devices", "8", "--microbatches", "32"],
            "v-adaptive needs --memory-limit",
        ),
        # An infinite limit was a traceback (OverflowError converting it to an integer).
        (
            ["--schedule", "v-adaptive", "--devices", "4", "--microbatches", "8"]
            + ["--memory-limit", "inf"],
            "v-adaptive: memory_limit must be a finite number, got inf",
        ),
        (
            ["--schedule", "zb-adaptive", "--devices", "4", "--microbatches", "8"]
            + ["--memory-limit", "nan"],
            "zb-adaptive: memory_limit must be a finite number, got nan",
        ),
        # Transfers exist only where activations move (BPipe): once accepted and ignored.
        (
            ["--schedule", "1f1b", "--devices", "4", "--microbatches", "8", "--transfer", "0.5"],
            "--transfer does not apply to 1f1b: only schedules that move activations between "
            "devices have EVICT/LOAD transfers (bpipe, bpipe-interleaved); leave it out",
        ),
        (
            ["--schedule", "v-zb", "--devices", "4", "--microbatches", "8", "--no-overlap"],
            "--no-overlap does not apply to v-zb",
        ),
        # Blocking transfers of no time block nothing: once accepted, and the same timeline
        # as without --no-overlap.
        (
            ["--schedule", "bpipe", "--devices", "4", "--microbatches", "8", "--no-overlap"],
            "--no-overlap needs --transfer above 0: it makes bpipe's EVICT/LOAD transfers "
            "block the device for the time they take, and at --transfer 0 (the default) they "
            "take none, so it would change nothing; give --transfer (the time of one EVICT or "
            "LOAD) too, or leave --no-overlap out",
        ),
        (
            ["--schedule", "bpipe-interleaved", "--devices", "4", "--microbatches", "8"]
            + ["--no-overlap", "--transfer", "0"],
            "--no-overlap needs --transfer above 0: it makes bpipe-interleaved's",
        ),
    ],
)
def test_bad_input_is_one_line_with_what_to_change(capsys, args, message):
    full = ["simulate", "--f", "1", "--b", "1", *args]
    code, out, err = run(capsys, *full)
    assert code == 2 and out == ""
    assert message in err and "Traceback" not in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["simulate", "--schedule", "vhalf", "--devices", "2", "--microbatches", "2"],
            "stagewright simulate: error: argument --schedule: invalid choice: 'vhalf'",
        ),
        (["profile", "--precision", "fp8"], "argument --precision: invalid choice: 'fp8'"),
        (["plann"], "stagewright: error: argument COMMAND: invalid choice: 'plann'"),
        # An argument no command takes is reported by the command it was given to (argparse
        # left it to the top parser, whose help says nothing of it).
        (
            ["profiles", "load", "--bogus"],
            "stagewright profiles load: error: unrecognized arguments: --bogus "
            "(see stagewright profiles load --help)",
        ),
        (
            ["simulate", "--schedule", "1f1b", "--devices", "2", "--microbatches", "2"]
            + ["--f", "1", "--b", "1", "extra"],
            "stagewright simulate: error: unrecognized arguments: extra",
        ),
    ],
)
def test_what_the_parser_refuses_is_one_line_too(capsys, args, message):
    """argparse printed its whole usage block above the error; --help still shows it."""
    with pytest.raises(SystemExit) as info:
        main(args)
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert message in err and "usage:" not in err
    assert err.count("\n") == 1 and "--help)" in err


def test_a_split_backward_schedule_without_w_says_its_w_passes_take_0(capsys):
    base = ["simulate", "--devices", "4", "--microbatches", "8", "--f", "1", "--b", "1"]
    code, out, err = run(capsys, *base, "--schedule", "v-zb")
    assert code == 0 and out.startswith("schedule v-zb")
    assert err == (
        "stagewright simulate: note: --w not given: v-zb splits the backward and its W passes "
        "(weight gradients) take 0 here; give --w TW to time them\n"
    )
    assert run(capsys, *base, "--schedule", "v-zb", "--w", "1")[2] == ""
    assert run(capsys, *base, "--schedule", "1f1b")[2] == ""  # B + W run as one backward


def test_a_schedule_larger_than_the_memory_is_refused_before_it_is_built(capsys, monkeypatch):
    """`--microbatches 100000000` (a mistyped 1000) built 850 million actions for minutes,
    until the kernel killed the process for want of memory. 1F1B makes 2 actions a
    micro-batch a device plus its sends and receives: 8.5 per cell here."""
    import cli.main
    import planner.schedules

    def must_not_build(*args, **kwargs):
        raise AssertionError("the schedule was built")

    monkeypatch.setattr(cli.main, "generate", must_not_build)
    args = ["simulate", "--schedule", "1f1b", "--devices", "4", "--f", "1", "--b", "2"]
    code, out, err = run(capsys, *args, "--microbatches", "100000000")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "about 850,000,000 actions" in err and "lower --microbatches or --devices" in err
    assert planner.schedules.schedule_actions("1f1b", 4, 100_000_000) == 850_000_000
    # Against what this machine has: a schedule that fits in 1 GiB is built, one that
    # does not is refused with both figures.
    monkeypatch.setattr(cli.main, "_available_memory", lambda: 2**30)
    code, _, err = run(capsys, *args, "--microbatches", "200000")  # 1.7 M actions, 1.1 GiB
    assert code == 2 and "needs about 1.1 GiB, more than the 1.0 GiB" in err
    monkeypatch.undo()
    monkeypatch.setattr(cli.main, "_available_memory", lambda: 2**30)
    assert run(capsys, *args, "--microbatches", "1000")[0] == 0


def test_the_memory_refusal_counts_one_device_in_the_singular(capsys, monkeypatch):
    """simulate's headers say '1 device'; its memory refusal said '1f1b on 1 devices'."""
    import cli.main

    monkeypatch.setattr(cli.main, "_available_memory", lambda: 2**30)
    args = ["simulate", "--schedule", "1f1b", "--devices", "1", "--f", "1", "--b", "2"]
    code, _, err = run(capsys, *args, "--microbatches", "10000000")
    assert code == 2 and "1f1b on 1 device with 10000000 micro-batches is about" in err


def test_unparseable_time_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as info:
        main(
            [
                "simulate",
                "--schedule",
                "1f1b",
                "--devices",
                "2",
                "--microbatches",
                "2",
                "--f",
                "fast",
                "--b",
                "1",
            ]
        )
    assert info.value.code == 2
    assert "not a number" in capsys.readouterr().err


def test_installed_console_script_runs():
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli.main",
            "simulate",
            "--schedule",
            "2bw",
            "--devices",
            "2",
            "--microbatches",
            "2",
            "--f",
            "1",
            "--b",
            "2",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout)["makespan"] > 0


def _commands(parser: argparse.ArgumentParser, path: str = "stagewright"):
    """Every (sub)command's parser with its command line, depth first."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, f"{path} {name}")


def _option(command: str, flag: str) -> argparse.Action:
    parsers = dict(_commands(_build_parser()))
    (action,) = [a for a in parsers[command]._actions if flag in a.option_strings]
    return action


def test_every_argument_of_every_command_is_described():
    """`stagewright profile --help` listed --micro-batch-size and --repeats bare."""
    bare = [
        f"{path} {'/'.join(action.option_strings) or action.dest}"
        for path, parser in _commands(_build_parser())
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction | argparse._SubParsersAction)
        and not action.help
    ]
    assert bare == []


@pytest.mark.parametrize(
    ("flag", "parameter"), [("--chunks", "num_chunks"), ("--batches", "num_batches")]
)
def test_a_schedule_parameters_help_names_every_schedule_that_takes_it(flag, parameter):
    """--chunks was described for interleaved only; bpipe-interleaved takes it too."""
    described = _option("stagewright simulate", flag).help or ""
    listed = re.search(r"\(([^;)]*); default", described)
    assert listed is not None, described
    taking = [n for n in SCHEDULE_NAMES if schedule_family(n).has_parameter(parameter)]
    assert listed.group(1).split(", ") == taking


def test_run_verify_help_says_the_reference_computes_in_the_runs_precision():
    """The reference computes in the run's precision (executor.reference), not in fp32."""
    described = _option("stagewright run", "--verify").help or ""
    assert "in the run's precision" in described and "fp32" not in described


@pytest.mark.parametrize(
    "options, message",
    [
        # Each was ignored without a word.
        (
            ["--checkpoint-every", "5"],
            "--checkpoint-every applies only with --checkpoint-dir DIR",
        ),
        (
            ["--database-url", "sqlite:///runs.db"],
            "nothing is recorded without --record; add --record or leave --database-url out",
        ),
        # NaN was a ValueError traceback after torchrun had started; 0 or less made every
        # rank time out at once.
        (["--timeout", "nan"], "--timeout must be a positive number of seconds, got nan"),
        (["--timeout", "0"], "--timeout must be a positive number of seconds, got 0.0"),
        (["--lr", "inf"], "--lr must be a finite number, got inf"),
        # Refused by the worker only after torchrun had started its ranks.
        (
            ["--checkpoint-dir", "ck", "--checkpoint-every", "-1"],
            "--checkpoint-every must be 0 (never) or a number of steps, got -1",
        ),
    ],
)
def test_run_refuses_options_it_would_ignore_or_fail_on_before_starting(
    capsys, tmp_path, monkeypatch, options, message
):
    import executor.launcher

    def must_not_start(*args, **kwargs):
        raise AssertionError("torchrun was started")

    monkeypatch.setattr(executor.launcher.subprocess, "Popen", must_not_start)
    monkeypatch.chdir(tmp_path)
    config = _executor_config(tmp_path)
    code, out, err = run(capsys, "run", str(config), "--steps", "1", *options)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith("stagewright run: error: ") and message in err


def _executor_config(folder) -> str:
    """A one-rank candidate's executor config of the tiny model."""
    from planner.launch.files import launch_files
    from planner.plan import plan
    from planner.specs import PlanRequest

    repo = Path(__file__).resolve().parents[2]
    request = json.loads((repo / "examples" / "tiny-cpu.json").read_text())
    request["cluster"]["gpus_per_node"] = 1
    request["search"]["schedules"] = ["1f1b"]
    files = launch_files(plan(PlanRequest.model_validate(request)))
    (config,) = [f for f in files if f.path == "candidate-1/executor-config.json"]
    path = folder / "executor-config.json"
    path.write_text(config.content)
    return str(path)


@pytest.mark.parametrize(
    "change, options, message",
    [
        # The field was not named: "(Input should be greater than or equal to 1)".
        (
            lambda m: m.update(num_layers=0),
            [],
            "vocab_size: num_layers: Input should be greater than or equal to 1",
        ),
        (lambda m: m.update(layers=8), [], "layers: Extra inputs are not permitted"),
        # A file as --out was a NotADirectoryError traceback, after the layer was timed.
        (lambda m: None, ["--out", "a-file"], "--out a-file: that is a file, not a folder"),
        # A GPU no hardware profile names: the point was saved where no plan reads it, or
        # the store refused it once the layer had been timed.
        (
            lambda m: None,
            ["--gpu", "nope", "--out", "points"],
            "--gpu: unknown GPU 'nope'; known hardware profiles: a100-40g, a100-sxm-80g, cpu",
        ),
        (
            lambda m: None,
            ["--gpu", "nope", "--database-url", "sqlite:///points.db"],
            "unknown GPU 'nope'; known hardware profiles: a100-40g, a100-sxm-80g, cpu",
        ),
        # A GPU's profile: the layer is timed on this machine's CPU, and the point, filed
        # under a100-sxm-80g, re-ranked that GPU's plans with CPU times.
        (
            lambda m: None,
            ["--gpu", "a100-sxm-80g", "--precision", "bf16", "--out", "points"],
            "--gpu a100-sxm-80g: ",
        ),
    ],
)
def test_profile_says_what_to_change_before_measuring(
    capsys, tmp_path, monkeypatch, change, options, message
):
    import executor.profiler

    def must_not_measure(*args, **kwargs):
        raise AssertionError("the layer was timed")

    monkeypatch.setattr(executor.profiler, "profile_layer", must_not_measure)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("")
    request = json.loads(
        (Path(__file__).resolve().parents[2] / "examples" / "tiny-cpu.json").read_text()
    )
    change(request["model"])
    (tmp_path / "model.json").write_text(json.dumps(request))
    code, out, err = run(capsys, "profile", "model.json", *options)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith("stagewright profile: error: ") and message in err


def test_every_command_warns_of_a_variable_that_names_no_setting(monkeypatch, capsys):
    """A misspelt STAGEWRIGHT_PROFILE (the planner reads STAGEWRIGHT_PROFILES) was ignored
    without a word by every command but serve."""
    monkeypatch.setenv("STAGEWRIGHT_PROFILE", "points")
    code, out, err = run(
        capsys,
        *["simulate", "--schedule", "1f1b", "--devices", "2", "--microbatches", "2"],
        *["--f", "1", "--b", "1", "--json"],
    )
    assert code == 0 and json.loads(out)["makespan"] == 6.0
    assert err == (
        "stagewright simulate: warning: STAGEWRIGHT_PROFILE is not a stagewright setting "
        "(did you mean STAGEWRIGHT_PROFILES?); it is ignored\n"
    )


def test_width_with_json_is_refused_and_sets_the_timeline_otherwise(capsys):
    """--width with --json was ignored: the JSON has no timeline."""
    args = ["simulate", "--schedule", "1f1b", "--devices", "2", "--microbatches", "2"]
    args += ["--f", "1", "--b", "1"]
    code, out, err = run(capsys, *args, "--json", "--width", "50")
    assert (code, out) == (2, "")
    assert err == (
        "stagewright simulate: error: --width sets the text timeline's columns, which --json "
        "does not print; leave one of them out\n"
    )
    widths = {}
    for width in ([], ["--width", "40"]):
        code, out, _ = run(capsys, *args, *width)
        assert code == 0
        widths[len(width)] = max(len(line) for line in out.splitlines())
    assert widths[0] > widths[2]  # the default (100 columns) is wider than 40


def test_plot_with_times_per_stage_of_another_pipeline_is_refused_before_simulating(
    capsys, tmp_path, monkeypatch
):
    """The figure sweeps V schedules, two stages a device: four times for 1F1B's four
    stages were reported as "forward times: got 4 values for 8 stages", which did not say
    that the 8 stages were the plot's."""
    import cli.main

    def must_not_simulate(*args, **kwargs):
        raise AssertionError("simulated before refusing")

    monkeypatch.setattr(cli.main, "simulate", must_not_simulate)
    figure = tmp_path / "sweep.svg"
    code, out, err = run(
        capsys,
        *["simulate", "--schedule", "1f1b", "--devices", "4", "--microbatches", "8"],
        *["--f", "1,2,3,4", "--b", "2", "--plot", str(figure)],
    )
    assert (code, out) == (2, "") and not figure.exists()
    assert err == (
        "stagewright simulate: error: --plot sweeps V schedules, 2 stages a device: --f needs "
        "one time or 8 (one per V stage), got 4; give one number, or plot with a V schedule "
        "as --schedule\n"
    )


def test_a_single_device_and_micro_batch_are_said_in_the_singular(capsys):
    """The headers read "1 devices, 1 stages, 1 micro-batches"."""
    args = ["simulate", "--schedule", "1f1b", "--f", "1", "--b", "1"]
    code, out, _ = run(capsys, *args, "--devices", "1", "--microbatches", "1")
    assert code == 0 and out.startswith("schedule 1f1b: 1 device, 1 stage, 1 micro-batch\n")
    code, out, _ = run(capsys, *args, "--devices", "2", "--microbatches", "3")
    assert out.startswith("schedule 1f1b: 2 devices, 2 stages, 3 micro-batches\n")


@pytest.mark.parametrize("gpu_here", [None, "NVIDIA A100-SXM4-80GB"])
def test_profile_refuses_a_gpu_profile_whatever_gpu_this_machine_has(monkeypatch, gpu_here):
    """The profiler times on the CPU: a GPU's hardware profile is refused without a GPU and
    with one (named, since it is not used); the cpu profile is accepted either way."""
    torch = pytest.importorskip("torch")
    from executor.profiler import device_problem

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu_here is not None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: gpu_here)
    assert device_problem("cpu") is None
    problem = device_problem("a100-sxm-80g")
    assert problem is not None and problem.startswith("--gpu a100-sxm-80g: ")
    assert "profile with --gpu cpu" in problem and "\n" not in problem
    if gpu_here is None:
        assert "there is no GPU here" in problem
    else:
        assert f"not on this machine's GPU ({gpu_here})" in problem
