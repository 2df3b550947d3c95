"""Measured runs and calibration through REST and the CLI, on SQLite and PostgreSQL: runs go
in whole files or not at all, with errors naming rows and columns; calibrate stores a new
revision that plans then use."""

from __future__ import annotations

import copy
import csv
import datetime as dt
import fcntl
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from api.store.profiles_io import stored_profiles
from cli.main import main
from planner.measurement_files import CSV_COLUMNS
from planner.plan import plan
from planner.profiles import BUNDLED_PROFILES, default_store
from planner.specs import PlanRequest
from tests.integration.conftest import assert_problem, example, reset, wait_done

BUNDLED_RUNS = 48  # profiles/measurements/a100-sxm-80g-public.json
RUN: dict[str, Any] = {
    "model": {
        "name": "tiny",
        "num_layers": 4,
        "hidden_size": 256,
        "num_attention_heads": 8,
        "seq_length": 128,
        "vocab_size": 1000,
    },
    "cluster": {"gpu": "cpu", "num_nodes": 1, "gpus_per_node": 4},
    "training": {"global_batch_size": 8, "precision": "fp32"},
    "config": {
        "t": 1,
        "p": 4,
        "d": 1,
        "micro_batch_size": 1,
        "recompute": "none",
        "schedule": "1f1b",
    },
    "measured": {"kind": "step", "step_time_s": 0.5},
    "source": "a test run",
    "measured_on": "2026-01-05",
}


def with_(run: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A copy of ``run`` with ``section.field`` changes."""
    out = copy.deepcopy(run)
    for dotted, value in changes.items():
        *path, leaf = dotted.split(".")
        target = out
        for part in path:
            target = target[part]
        target[leaf] = value
    return out


def test_post_and_list_measured_runs(client):
    second = with_(RUN, **{"measured": {"kind": "pass", "forward_ms": 2.0, "backward_ms": 3.0}})
    created = client.post("/v1/measurements", json={"runs": [RUN, second]})
    assert created.status_code == 201, created.text
    ids = created.json()["ids"]
    assert created.json() == {"created": 2, "unchanged": 0, "restored": 0, "ids": ids}
    again = client.post("/v1/measurements", json={"runs": [second]})
    assert again.status_code == 200 and again.json() == {
        "created": 0,
        "unchanged": 1,
        "restored": 0,
        "ids": ids[1:],
    }

    listed = client.get("/v1/measurements", params={"gpu": "cpu"}).json()
    assert listed["total"] == 2 and [r["id"] for r in listed["items"]] == ids
    first = listed["items"][0]
    assert first["origin"] == "api" and first["measured_on"] == "2026-01-05"
    assert first["measured"] == {**RUN["measured"], "mfu": None, "peak_memory_gib": None}
    assert first["config"] == {
        **RUN["config"],
        "layers_per_stage": None,
        "recompute_per_stage": None,
        "memory_limit": None,
    }
    assert (first["model"]["name"], first["cluster"], first["source"]) == (
        "tiny",
        RUN["cluster"],
        "a test run",
    )
    everything = client.get("/v1/measurements").json()
    assert everything["total"] == BUNDLED_RUNS + 2
    page = client.get("/v1/measurements", params={"gpu": "a100-sxm-80g", "limit": 5, "offset": 40})
    assert page.json()["total"] == BUNDLED_RUNS and len(page.json()["items"]) == 5
    by_model = client.get("/v1/measurements", params={"model": "gpt3-134b"}).json()
    assert by_model["total"] == 15 + 1  # Table 7's 134B rows and Table 3's 134B pass
    by_source = client.get("/v1/measurements", params={"source": "v-SHAPE paper"}).json()
    assert by_source["total"] == 9
    assert_problem(client.get("/v1/measurements", params={"limit": 0}), 422)
    assert_problem(client.get("/v1/measurements", params={"gpu": "Not A Name"}), 422)


@pytest.mark.parametrize("needle", ["_", "%", "a_test", "100%"])
def test_the_source_filter_matches_its_text_not_sql_wildcards(client, needle):
    """?source=_ listed every run (LIKE's any-one-character), ?source=% too, unlike
    `stagewright calibrate --source`, which matches the text."""
    runs = [with_(RUN, source="a test run"), with_(RUN, source="100% of a_test's steps")]
    assert client.post("/v1/measurements", json={"runs": runs}).status_code == 201
    listed = client.get("/v1/measurements", params={"gpu": "cpu", "source": needle}).json()
    expected = [r["source"] for r in runs if needle.lower() in r["source"].lower()]
    assert [r["source"] for r in listed["items"]] == expected
    assert listed["total"] == len(expected)


def test_bad_runs_are_refused_whole_naming_the_run_and_field(client):
    before = client.get("/v1/measurements").json()["total"]
    mismatch = with_(RUN, **{"config.p": 2})
    body = assert_problem(client.post("/v1/measurements", json={"runs": [RUN, mismatch]}), 422)
    assert body["errors"][0]["loc"][:3] == ["body", "runs", 1]
    assert "t*p*d = 1*2*1 = 2 but the cluster has 4 GPUs" in body["errors"][0]["msg"]
    unknown = with_(RUN, **{"cluster.gpu": "tpu-v9", "measured.step_time_s": 0.7})
    assert_problem(
        client.post("/v1/measurements", json={"runs": [RUN, unknown]}),
        422,
        "runs[1]: field cluster.gpu: unknown GPU 'tpu-v9'; known hardware profiles: a100-40g",
    )
    negative = with_(RUN, **{"measured.step_time_s": -1})
    body = assert_problem(client.post("/v1/measurements", json={"runs": [negative]}), 422)
    assert body["errors"][0]["loc"] == ["body", "runs", 0, "measured", "step", "step_time_s"]
    cannot = with_(
        RUN,
        **{
            "config.schedule": "interleaved",
            "model.num_layers": 8,
            "training.global_batch_size": 6,  # 6 micro-batches: not a multiple of p = 4
        },
    )
    assert_problem(
        client.post("/v1/measurements", json={"runs": [cannot]}),
        422,
        "runs[0]: the planner cannot price this configuration",
    )
    assert client.get("/v1/measurements").json()["total"] == before  # nothing stored


def _utc_today() -> dt.date:
    return dt.datetime.now(dt.UTC).date()


def test_a_run_dated_after_today_is_refused_and_tomorrow_is_taken(client):
    """A run measured in 2030 was stored. A date after today is refused, naming the run and
    field, and one that cannot be read says the form to write; UTC's tomorrow is taken (it
    is today east of UTC)."""
    before = client.get("/v1/measurements").json()["total"]
    later = _utc_today() + dt.timedelta(days=400)
    future = with_(RUN, measured_on=later.isoformat(), **{"measured.step_time_s": 0.61})
    assert_problem(
        client.post("/v1/measurements", json={"runs": [RUN, future]}),
        422,
        f"runs[1]: field measured_on: {later} is after today: a measurement cannot postdate "
        "the day it is stored",
        "give the date it was measured, as YYYY-MM-DD",
    )
    garbled = with_(RUN, measured_on="05/01/2026")
    body = assert_problem(client.post("/v1/measurements", json={"runs": [garbled]}), 422)
    assert body["errors"][0]["loc"] == ["body", "runs", 0, "measured_on"]
    assert body["errors"][0]["msg"] == (
        "'05/01/2026' is not a date (invalid character in year); write it as YYYY-MM-DD, e.g. "
        "2026-01-05"
    )
    assert client.get("/v1/measurements").json()["total"] == before  # nothing stored
    tomorrow = _utc_today() + dt.timedelta(days=1)
    taken = with_(RUN, measured_on=tomorrow.isoformat(), **{"measured.step_time_s": 0.62})
    created = client.post("/v1/measurements", json={"runs": [taken]})
    assert created.status_code == 201, created.text
    (run_id,) = created.json()["ids"]
    assert client.get(f"/v1/measurements/{run_id}").json()["measured_on"] == tomorrow.isoformat()


def test_a_plan_measurement_is_also_a_measured_run(client):
    request = example("tiny-cpu")
    plan = wait_done(client, client.post("/v1/plans", json=request).json()["id"])
    reported = client.post(f"/v1/plans/{plan['id']}/measurements", json={"step_time_s": 0.42})
    assert reported.status_code == 201, reported.text
    (run,) = client.get("/v1/measurements", params={"source": plan["id"]}).json()["items"]
    assert run["origin"] == "plan" and run["measurement_id"] == reported.json()["id"]
    assert run["measured"]["step_time_s"] == 0.42
    assert reported.json()["measured_run_id"] == run["id"]
    assert reported.json()["not_calibrated_because"] is None
    assert client.get(f"/v1/measurements/{run['id']}").json() == run
    best = plan["candidates"][0]["config"]
    assert {k: run["config"][k] for k in ("t", "p", "d", "schedule", "layers_per_stage")} == {
        k: best[k] for k in ("t", "p", "d", "schedule", "layers_per_stage")
    }


def test_a_plan_measurement_calibration_cannot_use_says_why_in_the_answer(client):
    """A step time 1000 times the prediction (milliseconds sent as seconds) was stored as a
    measurement and answered 201 like any other, while the store refused it as a measured
    run in a log line only: the client believed calibration would learn from it."""
    plan = wait_done(client, client.post("/v1/plans", json=example("tiny-cpu")).json()["id"])
    predicted = plan["candidates"][0]["predicted"]["iteration_time_s"]
    url = f"/v1/plans/{plan['id']}/measurements"
    in_ms = predicted * 1000  # the step time in milliseconds, given as seconds
    reported = client.post(url, json={"step_time_s": in_ms})
    assert reported.status_code == 201, reported.text
    answer = reported.json()
    assert answer["step_time_s"] == in_ms and answer["measured_run_id"] is None
    why = answer["not_calibrated_because"]
    assert why.startswith(f"measurement {answer['id']}: field measured.step_time_s: ")
    assert f"if it is in milliseconds, give {predicted:.4g}" in why
    assert client.get("/v1/measurements", params={"source": plan["id"]}).json()["total"] == 0

    # Sent again in seconds, it is a run; the same report twice is one run, named by both.
    right = [client.post(url, json={"step_time_s": predicted}).json() for _ in range(2)]
    (run,) = client.get("/v1/measurements", params={"source": plan["id"]}).json()["items"]
    assert [r["measured_run_id"] for r in right] == [run["id"], run["id"]]
    assert [r["not_calibrated_because"] for r in right] == [None, None]
    assert run["measurement_id"] == right[0]["id"]  # the run links to the first

    # The plan's list says the same of each, from what was stored.
    assert client.get(url).json() == [answer, *right]


# -- the command line -------------------------------------------------------------------------


def cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def write_csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, CSV_COLUMNS)
    writer.writeheader()
    for run in rows:
        flat = {}
        for column in CSV_COLUMNS:
            value: Any = run
            for part in column.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            flat[column] = "" if value is None else value
        writer.writerow(flat)
    path.write_text(buffer.getvalue())
    return path


# A date after today whatever the day the tests run (the rule's edge is a unit test's).
FAR_AHEAD = (dt.datetime.now(dt.UTC).date() + dt.timedelta(days=400)).isoformat()


def count(capsys, url: str) -> int:
    code, out, _ = cli(capsys, "measurements", "list", "--json", "--database-url", url)
    assert code == 0
    total: int = json.loads(out)["total"]
    return total


def test_cli_adds_csv_and_json_and_lists_them_back(database_url, tmp_path, capsys):
    reset(database_url)
    good = write_csv(tmp_path / "runs.csv", [RUN, with_(RUN, **{"measured.step_time_s": 0.6})])
    code, out, err = cli(capsys, "measurements", "add", str(good), "--database-url", database_url)
    assert code == 0, err
    assert "runs.csv: 2 run(s) stored, 0 already stored" in out
    code, out, _ = cli(
        capsys, "measurements", "list", "--gpu", "cpu", "--csv", "--database-url", database_url
    )
    exported = tmp_path / "exported.csv"
    exported.write_text(out)
    as_json = tmp_path / "runs.json"
    as_json.write_text(json.dumps({"runs": [with_(RUN, **{"measured.step_time_s": 0.7})]}))
    code, out, _ = cli(
        capsys, "measurements", "add", str(exported), str(as_json), "--database-url", database_url
    )
    assert code == 0
    assert "exported.csv: 0 run(s) stored, 2 already stored" in out  # the round trip is exact
    assert "runs.json: 1 run(s) stored" in out
    code, out, _ = cli(
        capsys, "measurements", "list", "--gpu", "cpu", "--database-url", database_url
    )
    assert out.startswith("3 run(s)") and "step 0.7 s" in out
    # A profiled pass lists to four figures (a profiler's times are long floats); the
    # store keeps them exact, as the CSV export shows.
    timed = {"kind": "pass", "forward_ms": 8.738654999999707, "backward_ms": 10.068746000000184}
    as_json.write_text(json.dumps({"runs": [with_(RUN, measured=timed)]}))
    assert cli(capsys, "measurements", "add", str(as_json), "--database-url", database_url)[0] == 0
    code, out, _ = cli(
        capsys, "measurements", "list", "--gpu", "cpu", "--database-url", database_url
    )
    assert "pass of 1 layer(s): F 8.739 B 10.07 W - ms" in out and "8.7386549" not in out
    code, out, _ = cli(
        capsys, "measurements", "list", "--gpu", "cpu", "--csv", "--database-url", database_url
    )
    assert "8.738654999999707" in out


def test_cli_list_export_that_leaves_runs_out_says_so(database_url, capsys):
    """`measurements list --csv > backup.csv` wrote the first 100 runs (the default
    --limit) and nothing said the export was incomplete."""
    reset(database_url)
    total = count(capsys, database_url)
    assert total > 3
    for form in ("--csv", "--json"):
        code, out, err = cli(
            capsys, "measurements", "list", form, "--limit", "3", "--database-url", database_url
        )
        assert code == 0
        assert err == (
            f"stagewright measurements list: 3 of {total} run(s) written (from 0); "
            f"--limit {total} writes them all\n"
        )
    code, out, err = cli(
        capsys,
        "measurements",
        "list",
        "--csv",
        "--limit",
        str(total),
        "--database-url",
        database_url,
    )
    assert code == 0 and err == "" and len(out.splitlines()) == total + 1


def test_cli_list_of_hardware_without_runs_names_the_hardware_with_runs(
    database_url, tmp_path, capsys
):
    """`measurements list --gpu nosuchgpu` printed '0 run(s)' and nothing else: a typo
    looked like hardware without runs. A note (stderr: the listing and exports are kept
    as they are) names the hardware that has runs, or says that none has."""
    reset(database_url)  # the bundled runs: all of a100-sxm-80g, none withdrawn
    url = ["--database-url", database_url]
    code, out, err = cli(capsys, "measurements", "list", "--gpu", "nosuchgpu", *url)
    assert code == 0 and out == "0 run(s); showing 0 from 0\n"
    assert err == (
        "stagewright measurements list: note: no run in use is of --gpu 'nosuchgpu'; the runs "
        "in use are of 'a100-sxm-80g'\n"
    )
    code, out, err = cli(capsys, "measurements", "list", "--gpu", "A100", "--json", *url)
    assert code == 0 and json.loads(out) == {"total": 0, "runs": []}
    assert "no run in use is of --gpu 'A100'; the runs in use are of 'a100-sxm-80g'" in err
    code, out, err = cli(
        capsys, "measurements", "list", "--gpu", "a100-sxm-80g", "--withdrawn", *url
    )
    assert code == 0 and out.startswith("0 withdrawn run(s)")
    assert err == (
        "stagewright measurements list: note: no withdrawn run is of --gpu 'a100-sxm-80g'; "
        "there are no withdrawn runs at all\n"
    )
    # A run of cpu, withdrawn: cpu now has withdrawn runs and none in use.
    added = tmp_path / "cpu.json"
    added.write_text(json.dumps([RUN]))
    assert cli(capsys, "measurements", "add", str(added), *url)[0] == 0
    code, out, _ = cli(capsys, "measurements", "list", "--gpu", "cpu", "--json", *url)
    (run_id,) = [item["id"] for item in json.loads(out)["runs"]]
    assert cli(capsys, "measurements", "withdraw", str(run_id), *url)[0] == 0
    code, out, err = cli(capsys, "measurements", "list", "--gpu", "cpu", *url)
    assert code == 0 and out.startswith("0 run(s)")
    assert err == (
        "stagewright measurements list: note: no run in use is of --gpu 'cpu'; the runs in "
        "use are of 'a100-sxm-80g'; 'cpu' has withdrawn runs, which --withdrawn lists\n"
    )
    code, out, err = cli(capsys, "measurements", "list", "--gpu", "nosuchgpu", "--withdrawn", *url)
    assert err.endswith(
        "no withdrawn run is of --gpu 'nosuchgpu'; the withdrawn runs are of 'cpu'\n"
    )
    # Hardware with runs that other filters leave out: nothing to say of the hardware.
    code, out, err = cli(
        capsys, "measurements", "list", "--gpu", "a100-sxm-80g", "--model", "nosuch", *url
    )
    assert code == 0 and out.startswith("0 run(s)") and err == ""


def test_cli_list_takes_any_limit_and_offset(database_url, capsys):
    """A --limit or --offset beyond SQL's 64-bit integers was an OverflowError traceback."""
    reset(database_url)
    total = count(capsys, database_url)
    huge = str(10**20)
    code, out, err = cli(
        capsys, "measurements", "list", "--limit", huge, "--database-url", database_url
    )
    assert code == 0 and out.startswith(f"{total} run(s); showing {total} from 0"), err
    code, out, err = cli(
        capsys, "measurements", "list", "--offset", huge, "--database-url", database_url
    )
    assert code == 0 and out.startswith(f"{total} run(s); showing 0 from {huge}"), err


@pytest.mark.skipif(not hasattr(fcntl, "F_SETPIPE_SZ"), reason="pipe sizes are set on Linux")
def test_cli_list_into_a_pipe_closed_after_the_first_line_ends_quietly(tmp_path):
    """`stagewright measurements list --csv | head -1`: the reader closes the pipe while the
    command still has rows to write; it ends without a traceback and with SIGPIPE's status."""
    read_end, write_end = os.pipe()
    # A pipe of one page, smaller than the bundled runs' CSV (about 16 KB): the command must
    # write after the reader has gone, whatever the scheduling.
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    command = [sys.executable, "-m", "cli.main", "measurements", "list", "--csv"]
    url = f"sqlite:///{tmp_path / 'pipe.db'}"
    with os.fdopen(read_end, "rb") as reader:
        process = subprocess.Popen(
            [*command, "--database-url", url],
            stdout=write_end,
            stderr=subprocess.PIPE,
            cwd=tmp_path,
        )
        os.close(write_end)
        assert reader.readline().startswith(b"model.name,")
    _, err = process.communicate(timeout=120)
    assert err.decode() == ""
    assert process.returncode == 141


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (
            {"measured.step_time_s": -2},
            "row 2 (line 3): column measured.step_time_s: Input should be greater than 0",
        ),
        (
            {"measured.step_time_s": "inf"},
            "row 2 (line 3): column measured.step_time_s: Input should be a finite number",
        ),
        ({"config.d": 2}, "row 2 (line 3): config t*p*d = 1*4*2 = 8 but the cluster has 4 GPUs"),
        ({"cluster.gpu": "tpu-v9"}, "row 2 (line 3): column cluster.gpu: unknown GPU 'tpu-v9'"),
        (
            {"config.recompute": "some"},
            "row 2 (line 3): column config.recompute: Input should be 'none', 'selective'",
        ),
        # Units: 500 ms written as seconds was stored, 3,367 times the prediction (0.1485 s),
        # and a forward pass of 2 ms written in seconds 1,876 times under it.
        (
            {"measured.step_time_s": 500},
            "row 2 (line 3): column measured.step_time_s: 500 s is 3367x the cost model's "
            "prediction for this configuration on cpu (0.1485 s); if it is in milliseconds, "
            "give 0.5",
        ),
        (
            {"measured": {"kind": "pass", "forward_ms": 0.002}},
            "row 2 (line 3): column measured.forward_ms: 0.002 ms is 1/1876 of the cost "
            "model's prediction for this configuration on cpu (3.752 ms); if it is in "
            "seconds, give 2",
        ),
        # Dates: one after today was stored, one unreadable said 'invalid character in year'.
        (
            {"measured_on": FAR_AHEAD},
            f"row 2 (line 3): column measured_on: {FAR_AHEAD} is after today: a measurement "
            "cannot postdate the day it is stored (the latest date taken is ",
        ),
        (
            {"measured_on": "01/05/2026"},
            "row 2 (line 3): column measured_on: '01/05/2026' is not a date (invalid character "
            "in year); write it as YYYY-MM-DD, e.g. 2026-01-05",
        ),
    ],
)
def test_cli_refuses_a_bad_file_whole_naming_row_and_column(
    database_url, tmp_path, capsys, change, needle
):
    reset(database_url)
    before = count(capsys, database_url)
    bad = write_csv(tmp_path / "bad.csv", [RUN, with_(RUN, **change)])
    code, out, err = cli(capsys, "measurements", "add", str(bad), "--database-url", database_url)
    assert code == 2 and out == ""
    assert err.startswith("stagewright measurements: error: ") and needle in err
    assert "nothing stored" in err
    assert count(capsys, database_url) == before  # the good first row was not stored either


def test_cli_stores_the_files_it_is_given_together_or_not_at_all(database_url, tmp_path, capsys):
    """`measurements add good.json typo.json` said only 'typo.json: nothing stored ...',
    as if good.json had been stored; and when the second file's problem was found by the
    store (an unknown GPU), the first one had been. Now no file is stored and the error
    says so, naming the files stored with it."""
    reset(database_url)
    url = ["--database-url", database_url]
    before = count(capsys, database_url)
    good = tmp_path / "good.json"
    good.write_text(json.dumps([RUN]))
    more = tmp_path / "more.json"
    more.write_text(json.dumps([with_(RUN, **{"measured.step_time_s": 0.6})]))
    typo = tmp_path / "typo.json"
    typo.write_text(json.dumps([with_(RUN, **{"config.recompute": "some"})]))
    code, out, err = cli(capsys, "measurements", "add", str(good), str(typo), *url)
    assert code == 2 and out == ""
    assert err == (
        "stagewright measurements: error: no file was stored (the files of one `measurements "
        f"add` are stored together or not at all; {good} was not stored either): {typo}: 1 "
        "problem(s): row 1: field config.recompute: Input should be 'none', 'selective' or "
        "'full'\n"
    )
    assert count(capsys, database_url) == before
    # Found by the store, after the first file was checked and written in the transaction.
    tpu = tmp_path / "tpu.json"
    tpu.write_text(json.dumps([with_(RUN, **{"cluster.gpu": "tpu-v9"})]))
    code, out, err = cli(capsys, "measurements", "add", str(good), str(tpu), str(more), *url)
    assert code == 2 and out == ""
    assert err.startswith(
        "stagewright measurements: error: no file was stored (the files of one `measurements "
        f"add` are stored together or not at all; {good}, {more} were not stored either): "
        f"{tpu}: 1 problem(s): row 1: field cluster.gpu: unknown GPU 'tpu-v9'; known hardware "
    )
    assert count(capsys, database_url) == before
    # Every refused file is named, each with its own problems.
    missing = tmp_path / "missing.csv"
    code, _, err = cli(
        capsys, "measurements", "add", str(typo), str(good), str(missing), str(tpu), *url
    )
    assert code == 2
    assert err.startswith(
        "stagewright measurements: error: no file was stored (the files of one `measurements "
        f"add` are stored together or not at all; {good}, {tpu} were not stored either): "
        f"{typo}: 1 problem(s): row 1: field config.recompute: "
    )
    assert err.endswith(f"; cannot read {missing}: No such file or directory\n")
    assert count(capsys, database_url) == before
    # Without the bad file the others go in, each file reported.
    code, out, err = cli(capsys, "measurements", "add", str(good), str(more), *url)
    assert code == 0, err
    assert out.splitlines()[0].startswith(f"{good}: 1 run(s) stored, 0 already stored")
    assert out.splitlines()[1].startswith(f"{more}: 1 run(s) stored, 0 already stored")
    assert count(capsys, database_url) == before + 2


def test_cli_names_missing_and_unknown_columns(tmp_path, capsys):
    path = tmp_path / "few.csv"
    path.write_text("model.name,config.tee\nx,1\n")
    code, _, err = cli(capsys, "measurements", "add", str(path), "--database-url", "sqlite://")
    assert code == 2
    assert "few.csv, header: missing column(s) model.num_layers" in err
    assert "unknown column(s) config.tee" in err


def test_cli_calls_an_empty_file_empty(tmp_path, capsys):
    """An empty CSV said 'header: missing column(s) ...' with all 18 required columns."""
    path = tmp_path / "empty.csv"
    path.write_text("")
    code, out, err = cli(capsys, "measurements", "add", str(path), "--database-url", "sqlite://")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(
        f"stagewright measurements: error: {path} is empty; a measurements CSV needs a header "
        "line of column names (field paths; these 18 are required: model.name, "
    )
    assert "missing column" not in err
    assert err.endswith(
        ", source) and then one line per run; `stagewright measurements list --csv` writes a "
        "file of this form\n"
    )


# Two parameters keep the fits quick: one the runs inform, one they cannot (no run measured
# memory).
FIT = [
    "--hardware",
    "a100-sxm-80g",
    "--parameter",
    "gemm_efficiency",
    "--parameter",
    "workspace_gib",
]


def test_calibrate_stores_a_new_revision_that_plans_use(database_url, capsys):
    reset(database_url)
    url = ["--database-url", database_url]
    code, out, err = cli(capsys, "calibrate", *FIT, "--dry-run", *url)
    assert code == 0, err
    assert f"fitted to {BUNDLED_RUNS} measured run(s)" in out and "dry run: nothing stored" in out
    assert "workspace_gib" in out and "uninformed: no run depends on it; kept" in out
    code, out, _ = cli(capsys, "calibrate", *FIT, "--json", *url)
    fit = json.loads(out)
    assert fit["stored"]["revision"] == 2 and fit["base_revision"] == 1
    assert (
        fit["stored"]["num_runs"] == BUNDLED_RUNS and len(fit["stored"]["run_ids"]) == BUNDLED_RUNS
    )
    status = {p["name"]: p["status"] for p in fit["parameters"]}
    assert status["workspace_gib"] == "uninformed" and status["memory_efficiency"] == "held"
    efficiency = next(p for p in fit["parameters"] if p["name"] == "gemm_efficiency")
    assert efficiency["status"] == "fitted" and efficiency["value"] != efficiency["start"]
    assert fit["rms_log_error"] <= fit["rms_log_error_before"]

    request = example("gpt3-96b-32xa100")
    with stored_profiles(database_url) as store:
        calibrated = store.hardware("a100-sxm-80g")
        assert calibrated.parameter("gemm_efficiency") == efficiency["value"]
        # Uninformed by step times: left at the bundled profile's value.
        bundled_a100 = default_store().hardware("a100-sxm-80g")
        assert calibrated.parameter("workspace_gib") == bundled_a100.parameter("workspace_gib")
        assert calibrated.calibration is not None and calibrated.calibration.revision == 2
        ours = plan(PlanRequest.model_validate(request), store)
    bundled = plan(PlanRequest.model_validate(request), default_store())
    assert ours.best is not None and bundled.best is not None
    assert ours.best.predicted.iteration_time_s != bundled.best.predicted.iteration_time_s


def test_calibrate_stores_nothing_when_no_parameter_moves(database_url, capsys):
    """QA found `--parameter workspace_gib` (which no step time depends on) stored revision
    after revision, each equal to the last, each recorded as a calibration."""
    reset(database_url)
    url = ["--database-url", database_url]
    code, out, err = cli(
        capsys, "calibrate", "--hardware", "a100-sxm-80g", "--parameter", "workspace_gib", *url
    )
    assert (code, out) == (2, "")
    assert err.count("\n") == 1
    assert (
        f"nothing stored: the fit to {BUNDLED_RUNS} measured run(s) of 'a100-sxm-80g' moved "
        "no parameter (workspace_gib is uninformed: no run's prediction depends on it), so a "
        "new revision would equal revision 1."
    ) in err
    with stored_profiles(database_url) as store:
        unchanged = store.hardware("a100-sxm-80g")
    assert unchanged.calibration is None  # still the loaded revision, not a calibrated one
    # A dry run still shows the fit, and a fit that moves a parameter still stores.
    code, out, _ = cli(
        capsys,
        "calibrate",
        "--hardware",
        "a100-sxm-80g",
        "--parameter",
        "workspace_gib",
        "--dry-run",
        *url,
    )
    assert code == 0 and "uninformed: no run depends on it; kept" in out
    code, out, _ = cli(capsys, "calibrate", *FIT, "--json", *url)
    assert code == 0 and json.loads(out)["stored"]["revision"] == 2


def test_loading_a_folder_over_a_calibrated_profile_says_the_fit_is_dropped(
    database_url, tmp_path, capsys
):
    """QA loaded its own a100-sxm-80g into a calibrated store: the revision it replaced
    was calibrated and the new one is not, without a word."""
    reset(database_url)
    url = ["--database-url", database_url]
    code, out, _ = cli(capsys, "calibrate", *FIT, "--json", *url)
    assert code == 0 and json.loads(out)["stored"]["revision"] == 2
    entries = json.loads((BUNDLED_PROFILES / "hardware.json").read_text())["hardware"]
    (a100,) = [e for e in entries if e["name"] == "a100-sxm-80g"]
    (tmp_path / "hardware.json").write_text(
        json.dumps({"hardware": [{**a100, "usable_memory_gib": 40.0}]})
    )
    code, out, err = cli(capsys, "profiles", "load", str(tmp_path), *url)
    assert code == 0, err
    assert f"your profiles ({tmp_path}): 0 created, 1 updated, 0 unchanged" in out
    assert (
        "warning: a100-sxm-80g: your folder's profile replaced revision 2, which was "
        "calibrated; plans now use the folder's parameters, not the fitted ones"
    ) in err
    with stored_profiles(database_url) as store:
        replaced = store.hardware("a100-sxm-80g")
    assert replaced.usable_memory_gib == 40.0 and replaced.calibration is None
    # Loaded again, nothing calibrated is replaced: no warning.
    code, _, err = cli(capsys, "profiles", "load", str(tmp_path), *url)
    assert code == 0 and "warning" not in err


def test_calibrate_reports_held_out_runs_and_errors(database_url, capsys):
    reset(database_url)
    url = ["--database-url", database_url]
    code, out, _ = cli(capsys, "calibrate", *FIT, "--model", "gpt3-96b", "--dry-run", *url)
    assert code == 0
    assert "fitted to 20 measured run(s)" in out  # Table 7's 19 rows of 96B, Table 3's pass
    assert f"held out (not fitted): {BUNDLED_RUNS - 20} run(s)" in out
    assert "model gpt3-134b" in out
    code, _, err = cli(capsys, "calibrate", "--hardware", "cpu", *url)
    assert code == 2 and "no measured runs of 'cpu' (0 stored); add some with" in err
    assert "(runs are stored for 'a100-sxm-80g')" in err


def test_calibrate_filters_that_match_no_run_name_what_is_stored(database_url, capsys):
    """`--model gpt-96b` (a typo) matched none of the 48 stored runs and the error advised
    adding runs; it names the stored models (or sources) instead."""
    reset(database_url)
    url = ["--database-url", database_url]
    code, _, err = cli(capsys, "calibrate", *FIT, "--model", "gpt-96b", "--dry-run", *url)
    assert code == 2 and err.count("\n") == 1
    assert (
        f"no measured runs of 'a100-sxm-80g' match the filters ({BUNDLED_RUNS} stored): no run "
        "is of --model 'gpt-96b'; the stored models are 'gpt3-134b', 'gpt3-13b', 'gpt3-96b', "
        "'vshape-21b', 'vshape-38.5b', 'vshape-9.6b'\n"
    ) in err
    assert "measurements add" not in err
    code, _, err = cli(capsys, "calibrate", *FIT, "--source", "Narayanan", "--dry-run", *url)
    assert code == 2 and "measurements add" not in err
    assert "no run's source contains --source 'Narayanan'; the stored sources begin " in err
    assert "'BPipe (Kim et al., ICML 2023), Appendix'..." in err
    assert '"V-shape paper (Qi et al., \'Pipeline Para"...' in err
    code, _, err = cli(
        capsys, "calibrate", *FIT, "--model", "gpt3-96b", "--source", "V-shape", *url
    )
    assert code == 2
    assert "no run of --model 'gpt3-96b' has a source containing 'V-shape'; their sources" in err
    assert "V-shape paper" not in err.partition("their sources")[2]
    code, _, err = cli(capsys, "calibrate", "--hardware", "tpu-v9", *url)
    assert code == 2 and "unknown GPU 'tpu-v9'" in err
    code, _, err = cli(
        capsys, "calibrate", "--hardware", "a100-sxm-80g", "--parameter", "gemm", *url
    )
    assert code == 2 and "unknown cost-model parameter 'gemm'" in err


def test_a_run_stored_concurrently_is_counted_not_duplicated(database_url, monkeypatch):
    """Two writers adding the same run: the one that loses the race (its look-up found
    nothing, its insert meets the other's row) counts it as already stored, and the rest of
    its write goes on."""
    from api.core.db import Database
    from api.store import measured_runs
    from planner.measurement_files import ParsedRun
    from planner.measurements import MeasuredRun

    reset(database_url)
    first = MeasuredRun.model_validate(RUN)
    second = MeasuredRun.model_validate(with_(RUN, **{"measured.step_time_s": 0.9}))
    database = Database(database_url)
    try:
        with database.session() as session:
            stored = measured_runs.add_runs(
                session=session, runs=[ParsedRun("row 1", first)], origin="api", name="a"
            )
            session.commit()
        real = measured_runs._stored
        missed: list[str] = []

        def look_up_too_early(session, key):  # the other writer had not committed yet
            if not missed:
                missed.append(key)
                return None
            return real(session, key)

        monkeypatch.setattr(measured_runs, "_stored", look_up_too_early)
        with database.session() as session:
            report = measured_runs.add_runs(
                session=session,
                runs=[ParsedRun("row 1", first), ParsedRun("row 2", second)],
                origin="api",
                name="b",
            )
            session.commit()
        assert (report.created, report.unchanged) == (1, 1)
        assert report.ids[0] == stored.ids[0]
    finally:
        database.dispose()


def test_the_service_plans_with_the_calibrated_revision(client, database_url, capsys):
    """A plan asked for again after a calibration is not answered from the cache: the
    hardware revision is part of its key, and the new plan is priced with the fit."""
    request = example("gpt3-96b-32xa100")
    before = wait_done(client, client.post("/v1/plans", json=request).json()["id"])
    assert before["hardware_revision"] == 1
    code, _, err = cli(capsys, "calibrate", *FIT, "--database-url", database_url)
    assert code == 0, err
    after = wait_done(client, client.post("/v1/plans", json=request).json()["id"])
    assert after["id"] != before["id"] and after["hardware_revision"] == 2
    assert after["best"]["predicted"] != before["best"]["predicted"]
    shown = client.get("/v1/hardware/a100-sxm-80g").json()
    assert shown["revision"] == 2 and shown["calibration"]["revision"] == 2
    assert set(shown["parameters"]) == {"gemm_efficiency"}  # workspace_gib: uninformed, kept


def test_calibrate_leaves_out_and_lists_the_runs_it_cannot_explain(database_url, capsys):
    reset(database_url)
    url = ["--database-url", database_url]
    only = ["--model", "gpt3-96b", "--parameter", "gemm_efficiency"]
    fit_only = [*FIT[:2], *only, "--parameter", "collective_efficiency"]
    code, out, err = cli(capsys, "calibrate", *fit_only, "--json", *url)
    assert code == 0, err
    fit = json.loads(out)
    steps = [q for q in fit["quantities"] if q["quantity"] == "step_time_s"]
    out_of_fit = [q for q in fit["quantities"] if q["excluded"]]
    assert out_of_fit and all(q["quantity"] == "step_time_s" for q in out_of_fit)
    # Left out: every one further from the step times' median error than any kept one.
    centre = sorted(q["log_error_after"] for q in steps)[len(steps) // 2]
    kept = [abs(q["log_error_after"] - centre) for q in steps if not q["excluded"]]
    assert min(abs(q["log_error_after"] - centre) for q in out_of_fit) > max(kept)
    # The stored record names them, by run id.
    assert [(e["run_id"], e["quantity"]) for e in fit["stored"]["excluded"]] == [
        (q["run_id"], q["quantity"]) for q in out_of_fit
    ]
    with stored_profiles(database_url) as store:
        record = store.hardware("a100-sxm-80g").calibration
        assert record is not None and len(record.excluded) == len(out_of_fit)
    code, text, _ = cli(capsys, "calibrate", *fit_only, "--dry-run", *url)
    assert f"{len(out_of_fit)} left out as outliers" in text
    for q in out_of_fit:
        assert f"run {q['run_id']} step_time_s: measured" in text.split("left out as")[-1]
    # --keep-outliers fits them all, and the fit is worse over the runs it fits.
    keep = ["--keep-outliers", "--dry-run", "--json"]
    code, out, _ = cli(capsys, "calibrate", *fit_only, *keep, *url)
    every = json.loads(out)
    assert not any(q["excluded"] for q in every["quantities"]) and every["stored"] is None
    assert every["rms_log_error"] > fit["rms_log_error"]


def test_an_unknown_gpu_is_said_once_and_a_profile_folders_copy_is_named(
    database_url, tmp_path, capsys, monkeypatch
):
    """Seven runs of a GPU the store lacks repeated the whole 'unknown GPU ...; known
    hardware profiles: ...' sentence seven times; and a profile copied into a
    STAGEWRIGHT_PROFILES folder (which plans read) was not mentioned: the store does not
    read those folders, so the user must load it."""
    reset(database_url)
    before = count(capsys, database_url)
    cpu = default_store().hardware("cpu")
    folder = tmp_path / "mine"
    folder.mkdir()
    bundled = json.loads((BUNDLED_PROFILES / "hardware.json").read_text())
    entry = next(h for h in bundled["hardware"] if h["name"] == cpu.name)
    (folder / "hardware.json").write_text(
        json.dumps({"format": bundled["format"], "hardware": [{**entry, "name": "lab-cpu"}]})
    )
    monkeypatch.setenv("STAGEWRIGHT_PROFILES", str(folder))
    lab = [with_(RUN, **{"cluster.gpu": "lab-cpu", "config.micro_batch_size": mb}) for mb in (1, 2)]
    bad = write_csv(
        tmp_path / "bad.csv", [RUN, *lab, with_(lab[0], **{"config.t": 2, "config.p": 2})]
    )
    code, out, err = cli(capsys, "measurements", "add", str(bad), "--database-url", database_url)
    assert code == 2 and out == ""
    assert err.count("unknown GPU 'lab-cpu'") == 1 and err.count("known hardware profiles") == 1
    assert "row 2 (line 3): column cluster.gpu: unknown GPU 'lab-cpu'" in err
    assert "the same GPU in 2 more run(s): row 3 (line 4), row 4 (line 5)" in err
    assert f"'lab-cpu' is in {folder / 'hardware.json'} (STAGEWRIGHT_PROFILES)" in err
    assert count(capsys, database_url) == before
    # The command the error names loads it, after which the same runs are stored.
    assert f"load it first with `stagewright profiles load {folder}`" in err
    assert cli(capsys, "profiles", "load", str(folder), "--database-url", database_url)[0] == 0
    good = write_csv(tmp_path / "good.csv", [RUN, *lab])
    assert cli(capsys, "measurements", "add", str(good), "--database-url", database_url)[0] == 0
    assert count(capsys, database_url) == before + 3  # RUN and the two lab runs


def test_a_run_repeated_in_a_file_is_not_called_already_stored(database_url, tmp_path, capsys):
    """A file with the same row twice, into a store without it, said '1 run(s) stored, 1
    already stored': the second copy was never in the store before."""
    reset(database_url)
    twice = write_csv(tmp_path / "twice.csv", [RUN, RUN, with_(RUN, source="other")])
    code, out, err = cli(capsys, "measurements", "add", str(twice), "--database-url", database_url)
    assert code == 0, err
    assert (
        "twice.csv: 2 run(s) stored, 0 already stored, 1 repeated in the file (stored once) (in"
        in out
    )
    code, out, err = cli(capsys, "measurements", "add", str(twice), "--database-url", database_url)
    assert "twice.csv: 0 run(s) stored, 2 already stored, 1 repeated in the file" in out
