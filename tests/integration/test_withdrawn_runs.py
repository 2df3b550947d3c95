"""Withdrawing a measured run, on SQLite and PostgreSQL: the run is kept (calibration
records name the runs they used) but left out of lists and of calibration; adding it again
restores it, loading the bundled runs does not."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from api.core.db import Database
from api.store.profiles import load_bundled_profiles
from planner.profiles import BUNDLED_PROFILES
from tests.integration.conftest import assert_problem, reset
from tests.integration.test_measured_runs import BUNDLED_RUNS, FIT, RUN, cli, with_

PUBLIC_RUNS = BUNDLED_PROFILES / "measurements" / "a100-sxm-80g-public.json"


def _post(client: Any, *runs: dict[str, Any]) -> list[int]:
    created = client.post("/v1/measurements", json={"runs": list(runs)})
    assert created.status_code == 201, created.text
    ids: list[int] = created.json()["ids"]
    return ids


def _recent(stamp: str) -> bool:
    """A timestamp of the last minute, as the API writes it (UTC)."""
    when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return timedelta(0) <= datetime.now(UTC) - when < timedelta(minutes=1)


# -- REST -------------------------------------------------------------------------------------


def test_a_withdrawn_run_leaves_the_lists_and_is_listed_as_withdrawn(client):
    wrong, right = _post(client, RUN, with_(RUN, **{"measured.step_time_s": 0.6}))
    answer = client.delete(f"/v1/measurements/{wrong}", params={"reason": "the time was in ms"})
    assert answer.status_code == 200, answer.text
    withdrawn = answer.json()
    assert withdrawn["id"] == wrong and withdrawn["measured"]["step_time_s"] == 0.5
    assert withdrawn["withdrawn_reason"] == "the time was in ms"
    assert _recent(withdrawn["withdrawn_at"])

    in_use = client.get("/v1/measurements", params={"gpu": "cpu"}).json()
    assert [r["id"] for r in in_use["items"]] == [right] and in_use["total"] == 1
    assert in_use["items"][0]["withdrawn_at"] is None
    assert in_use["items"][0]["withdrawn_reason"] is None
    assert client.get("/v1/measurements").json()["total"] == BUNDLED_RUNS + 1

    listed = client.get("/v1/measurements", params={"withdrawn": "true"}).json()
    assert listed["total"] == 1 and listed["items"] == [withdrawn]
    # The other filters apply to the withdrawn runs too.
    other = client.get("/v1/measurements", params={"withdrawn": "true", "gpu": "a100-sxm-80g"})
    assert other.json()["total"] == 0
    head = client.head("/v1/measurements", params={"withdrawn": "true"})
    assert head.status_code == 200 and head.content == b""


def test_one_run_is_read_by_its_id_in_use_or_withdrawn(client):
    """GET /v1/measurements/{id} was 405: a run named by a calibration or a log line could
    be found only by paging through the lists, and a withdrawn one only in the other list."""
    kept, dropped = _post(client, RUN, with_(RUN, **{"measured.step_time_s": 0.6}))
    listed = client.get("/v1/measurements", params={"gpu": "cpu"}).json()["items"]
    for item in listed:
        answer = client.get(f"/v1/measurements/{item['id']}")
        assert answer.status_code == 200, answer.text
        assert answer.json() == item
    withdrawn = client.delete(f"/v1/measurements/{dropped}", params={"reason": "in ms"}).json()
    answer = client.get(f"/v1/measurements/{dropped}").json()
    assert answer == withdrawn and answer["withdrawn_reason"] == "in ms"
    assert answer["measured"]["step_time_s"] == 0.6 and _recent(answer["withdrawn_at"])
    assert client.get(f"/v1/measurements/{kept}").json()["withdrawn_at"] is None
    head = client.head(f"/v1/measurements/{dropped}")
    assert head.status_code == 200 and head.content == b""


def test_reading_one_run_takes_the_same_token_as_the_list(make_client):
    client = make_client(api_tokens="ci:write:w; dash:read:r")
    created = client.post(
        "/v1/measurements", json={"runs": [RUN]}, headers={"Authorization": "Bearer w"}
    )
    (run_id,) = created.json()["ids"]
    for path in ("/v1/measurements", f"/v1/measurements/{run_id}"):
        assert_problem(client.get(path), 401)
        assert_problem(client.get(path, headers={"Authorization": "Bearer nope"}), 401)
        assert client.get(path, headers={"Authorization": "Bearer r"}).status_code == 200


def test_withdrawing_again_keeps_the_first_withdrawal(client):
    (run_id,) = _post(client, RUN)
    first = client.delete(f"/v1/measurements/{run_id}", params={"reason": "wrong config"})
    again = client.delete(f"/v1/measurements/{run_id}", params={"reason": "another reason"})
    assert again.status_code == 200 and again.json() == first.json()
    assert client.delete(f"/v1/measurements/{run_id}").json() == first.json()
    assert client.get("/v1/measurements", params={"withdrawn": "true"}).json()["total"] == 1

    (other,) = _post(client, with_(RUN, **{"measured.step_time_s": 0.7}))
    unexplained = client.delete(f"/v1/measurements/{other}")
    assert unexplained.status_code == 200 and unexplained.json()["withdrawn_reason"] is None


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_a_run_that_is_not_there_is_a_404_naming_it(client, method):
    (run_id,) = _post(client, RUN)
    for missing in (987654, 2**31, 2**70):  # beyond PostgreSQL's INTEGER too: no 500
        assert_problem(
            client.request(method, f"/v1/measurements/{missing}"),
            404,
            f"no measured run has id {missing}",
            "?withdrawn=true",
        )
    assert_problem(client.request(method, "/v1/measurements/0"), 422)
    assert_problem(client.request(method, "/v1/measurements/first"), 422)
    url = f"/v1/measurements/{run_id}"
    assert_problem(client.request(method, url, params={"why": "typo"}), 422, "unknown query")
    # Nothing of that withdrew it.
    assert client.get("/v1/measurements", params={"gpu": "cpu"}).json()["total"] == 1


def test_a_bad_reason_withdraws_nothing(client):
    (run_id,) = _post(client, RUN)
    url = f"/v1/measurements/{run_id}"
    for reason in ("", "   ", "x" * 501, "a\x00b"):
        assert_problem(client.delete(url, params={"reason": reason}), 422, "reason")
    assert_problem(client.delete(f"{url}?reason=a&reason=b"), 422, "given 2 times")
    assert client.get("/v1/measurements", params={"gpu": "cpu"}).json()["total"] == 1


def test_posting_a_withdrawn_run_again_restores_it(client):
    (run_id,) = _post(client, RUN)
    assert client.delete(f"/v1/measurements/{run_id}").status_code == 200
    restored = client.post("/v1/measurements", json={"runs": [RUN]})
    assert restored.status_code == 200, restored.text
    assert restored.json() == {"created": 0, "unchanged": 0, "restored": 1, "ids": [run_id]}
    (listed,) = client.get("/v1/measurements", params={"gpu": "cpu"}).json()["items"]
    assert listed["id"] == run_id and listed["withdrawn_at"] is None
    assert listed["withdrawn_reason"] is None
    assert client.get("/v1/measurements", params={"withdrawn": "true"}).json()["total"] == 0
    again = client.post("/v1/measurements", json={"runs": [RUN]})
    assert again.json() == {"created": 0, "unchanged": 1, "restored": 0, "ids": [run_id]}


def test_withdrawing_needs_the_write_scope(make_client):
    client = make_client(api_tokens="ci:write:w; dash:read:r")
    write = {"Authorization": "Bearer w"}
    created = client.post("/v1/measurements", json={"runs": [RUN]}, headers=write)
    (run_id,) = created.json()["ids"]
    url = f"/v1/measurements/{run_id}"
    assert_problem(client.delete(url), 401)
    assert_problem(client.delete(url, headers={"Authorization": "Bearer r"}), 403, "'write'")
    listed = client.get("/v1/measurements", params={"gpu": "cpu"}, headers=write).json()
    assert listed["total"] == 1  # still in use
    assert client.delete(url, headers=write).status_code == 200


# -- the bundled runs -------------------------------------------------------------------------


def test_loading_the_bundled_runs_does_not_restore_a_withdrawn_one(database_url, tmp_path, capsys):
    """`stagewright profiles load` (and `serve`, at every start) loads the bundled runs
    again: a withdrawn bundled run stays withdrawn; adding the file by hand restores it."""
    reset(database_url)
    url = ["--database-url", database_url]
    code, out, _ = cli(capsys, "measurements", "list", "--json", "--limit", "1", *url)
    bundled = json.loads(out)["runs"][0]
    assert code == 0 and bundled["origin"] == "bundled"
    code, _, err = cli(
        capsys, "measurements", "withdraw", str(bundled["id"]), "--reason", "a typo", *url
    )
    assert code == 0, err
    code, out, err = cli(capsys, "profiles", "load", *url)
    assert code == 0, err
    assert (
        f"measured runs: 0 added, {BUNDLED_RUNS} already stored (1 of them withdrawn, kept out)"
        in out
    )
    database = Database(database_url)  # what `serve` loads at every start
    try:
        with database.session() as session:
            report = load_bundled_profiles(session=session)
    finally:
        database.dispose()
    assert (report.runs_created, report.runs_unchanged) == (0, BUNDLED_RUNS)
    assert report.runs_withdrawn == 1
    code, out, _ = cli(capsys, "measurements", "list", "--withdrawn", "--json", *url)
    (still,) = json.loads(out)["runs"]
    assert still["id"] == bundled["id"] and still["withdrawn_reason"] == "a typo"

    code, out, err = cli(capsys, "measurements", "add", str(PUBLIC_RUNS), *url)
    assert code == 0, err
    assert (
        f"{PUBLIC_RUNS}: 0 run(s) stored, {BUNDLED_RUNS - 1} already stored, 1 restored "
        "(withdrawn before, in use again)"
    ) in out
    code, out, _ = cli(capsys, "measurements", "list", "--withdrawn", "--json", *url)
    assert json.loads(out)["total"] == 0


# -- calibration ------------------------------------------------------------------------------


def _fit(capsys: Any, url: list[str]) -> dict[str, Any]:
    fit = [*FIT, "--model", "gpt3-96b", "--keep-outliers", "--dry-run", "--json"]
    code, out, err = cli(capsys, "calibrate", *fit, *url)
    assert code == 0, err
    result: dict[str, Any] = json.loads(out)
    return result


def _gemm(fit: dict[str, Any]) -> float:
    value: float = next(p["value"] for p in fit["parameters"] if p["name"] == "gemm_efficiency")
    return value


def test_calibrate_leaves_a_withdrawn_run_out(database_url, tmp_path, capsys):
    """A run that pulls the fit (a bundled GPT-3 96B row at half its MFU, as a wrong unit
    would make it), withdrawn: the fit is again what it was without it."""
    reset(database_url)
    url = ["--database-url", database_url]
    before = _fit(capsys, url)
    public = json.loads(PUBLIC_RUNS.read_text())
    first = public["runs"][0] if isinstance(public, dict) else public[0]
    assert first["model"]["name"] == "gpt3-96b" and "mfu" in first["measured"]
    slow = with_(
        first, **{"measured.mfu": first["measured"]["mfu"] / 2, "source": "a mislabelled run"}
    )
    path = tmp_path / "slow.json"
    path.write_text(json.dumps([slow]))
    assert cli(capsys, "measurements", "add", str(path), *url)[0] == 0
    pulled = _fit(capsys, url)
    (slow_id,) = set(pulled["runs_used"]) - set(before["runs_used"])
    assert _gemm(pulled) < _gemm(before) - 0.01  # half the MFU: slower GEMMs fit it

    code, out, err = cli(capsys, "measurements", "withdraw", str(slow_id), *url)
    assert code == 0, err
    after = _fit(capsys, url)
    assert after["runs_used"] == before["runs_used"] and slow_id not in after["held_out"]["runs"]
    assert _gemm(after) == _gemm(before)
    assert after["rms_log_error"] == before["rms_log_error"]
    assert after["withdrawn"] == [slow_id] and before["withdrawn"] == []
    code, text, _ = cli(capsys, "calibrate", *FIT, "--model", "gpt3-96b", "--dry-run", *url)
    assert (
        f"withdrawn (not fitted): 1 run(s) (id {slow_id}); `stagewright measurements list "
        "--withdrawn --gpu a100-sxm-80g` says when and why"
    ) in text


def test_calibrating_a_gpu_whose_runs_are_all_withdrawn_says_so(database_url, tmp_path, capsys):
    reset(database_url)
    url = ["--database-url", database_url]
    path = tmp_path / "runs.json"
    path.write_text(json.dumps([RUN]))
    assert cli(capsys, "measurements", "add", str(path), *url)[0] == 0
    code, out, _ = cli(capsys, "measurements", "list", "--gpu", "cpu", "--json", *url)
    (run,) = json.loads(out)["runs"]
    assert cli(capsys, "measurements", "withdraw", str(run["id"]), *url)[0] == 0
    code, _, err = cli(capsys, "calibrate", "--hardware", "cpu", *url)
    assert code == 2 and err.count("\n") == 1
    assert (
        "no measured runs of 'cpu' in use: all 1 stored are withdrawn (`stagewright "
        "measurements list --withdrawn --gpu cpu` lists them; adding one again with "
        "`stagewright measurements add FILE` restores it) (runs are stored for 'a100-sxm-80g')"
    ) in err


# -- the command line -------------------------------------------------------------------------


def test_cli_withdraws_lists_and_restores_a_run(database_url, tmp_path, capsys):
    reset(database_url)
    url = ["--database-url", database_url]
    path = tmp_path / "runs.json"
    path.write_text(json.dumps([RUN, with_(RUN, **{"measured.step_time_s": 0.6})]))
    assert cli(capsys, "measurements", "add", str(path), *url)[0] == 0
    code, out, _ = cli(capsys, "measurements", "list", "--gpu", "cpu", "--json", *url)
    wrong, right = (r["id"] for r in json.loads(out)["runs"])

    code, out, err = cli(
        capsys, "measurements", "withdraw", str(wrong), "--reason", "wrong unit", *url
    )
    assert code == 0, err
    assert out.startswith(
        f"measured run {wrong} (tiny on cpu t1 p4 d1 mb1 none 1f1b [a test run]) withdrawn "
    )
    assert "UTC: wrong unit; calibrate leaves it out" in out and out.count("\n") == 1

    code, out, _ = cli(capsys, "measurements", "list", "--gpu", "cpu", *url)
    assert out.startswith("1 run(s); showing 1 from 0\n") and f"\n{right:>5} cpu" in out
    code, out, _ = cli(capsys, "measurements", "list", "--withdrawn", *url)
    lines = out.splitlines()
    assert lines[0] == "1 withdrawn run(s); showing 1 from 0"
    assert lines[1].startswith(f"{wrong:>5} cpu") and "step 0.5 s" in lines[1]
    assert lines[2].lstrip().startswith("withdrawn ") and lines[2].endswith(" UTC: wrong unit")
    code, out, _ = cli(capsys, "measurements", "list", "--withdrawn", "--json", *url)
    (listed,) = json.loads(out)["runs"]
    assert listed["withdrawn_reason"] == "wrong unit" and _recent(listed["withdrawn_at"])
    code, out, _ = cli(capsys, "measurements", "list", "--withdrawn", "--csv", *url)
    exported = tmp_path / "withdrawn.csv"
    exported.write_text(out)

    code, out, _ = cli(capsys, "measurements", "withdraw", str(wrong), "--reason", "other", *url)
    assert code == 0 and f"measured run {wrong} (" in out
    assert "was already withdrawn " in out and "UTC: wrong unit; nothing changed" in out

    # The CSV of the withdrawn runs, added again, puts them back.
    code, out, _ = cli(capsys, "measurements", "add", str(exported), *url)
    assert code == 0
    assert (
        "withdrawn.csv: 0 run(s) stored, 0 already stored, 1 restored (withdrawn before, in "
        "use again)"
    ) in out
    code, out, _ = cli(capsys, "measurements", "list", "--gpu", "cpu", *url)
    assert out.startswith("2 run(s)")


@pytest.mark.parametrize("action", ["withdraw", "show"])
def test_cli_withdraw_or_show_of_a_missing_run_is_one_line_naming_it(database_url, capsys, action):
    reset(database_url)
    url = ["--database-url", database_url]
    for missing in ("987654", "0", "-3", str(2**63)):
        code, out, err = cli(capsys, "measurements", action, missing, *url)
        assert code == 2 and out == "" and err.count("\n") == 1, err
        assert f"no measured run has id {missing} in " in err
        assert "`stagewright measurements list` shows the ids" in err


def test_cli_shows_one_run_in_use_or_withdrawn(database_url, tmp_path, capsys):
    reset(database_url)
    url = ["--database-url", database_url]
    source = "a run whose source is longer than the sixty characters a list line shows of it"
    path = tmp_path / "runs.json"
    path.write_text(json.dumps([with_(RUN, source=source)]))
    assert cli(capsys, "measurements", "add", str(path), *url)[0] == 0
    code, out, _ = cli(capsys, "measurements", "list", "--gpu", "cpu", "--json", *url)
    (listed,) = json.loads(out)["runs"]
    run_id = str(listed["id"])

    code, out, err = cli(capsys, "measurements", "show", run_id, "--json", *url)
    assert code == 0, err
    assert json.loads(out) == listed
    code, out, err = cli(capsys, "measurements", "show", run_id, *url)
    assert code == 0 and out.count("\n") == 1, out
    assert out.startswith(f"{run_id:>5} cpu") and "step 0.5 s" in out
    assert out.endswith(f"[{source}]\n")  # whole, where the list cuts it at 60 characters
    code, line, _ = cli(capsys, "measurements", "list", "--gpu", "cpu", *url)
    assert f"[{source[:60]}]" in line and source not in line

    assert cli(capsys, "measurements", "withdraw", run_id, "--reason", "in ms", *url)[0] == 0
    code, out, _ = cli(capsys, "measurements", "show", run_id, *url)
    first, second = out.splitlines()
    assert first.startswith(f"{run_id:>5} cpu")
    assert second.lstrip().startswith("withdrawn ") and second.endswith(" UTC: in ms")
    code, out, _ = cli(capsys, "measurements", "show", run_id, "--json", *url)
    shown = json.loads(out)
    assert shown["withdrawn_reason"] == "in ms" and _recent(shown["withdrawn_at"])
    assert {k: v for k, v in shown.items() if not k.startswith("withdrawn")} == {
        k: v for k, v in listed.items() if not k.startswith("withdrawn")
    }


def test_recording_a_withdrawn_run_again_says_restored(database_url, capsys):
    """`stagewright run --record` / `profile --record` of a run identical to a withdrawn one
    restores it, and said "already stored" as if nothing had changed."""
    from api.store.profiles_io import store_measured_run
    from planner.measurements import MeasuredRun

    reset(database_url)
    run = MeasuredRun.model_validate(RUN)
    first = store_measured_run(database_url, run)
    assert first.endswith(", stored)")
    run_id = int(first.rpartition("(measured run ")[2].split(",")[0])
    url = ["--database-url", database_url]
    assert cli(capsys, "measurements", "withdraw", str(run_id), *url)[0] == 0
    again = store_measured_run(database_url, run)
    assert again.endswith(f"(measured run {run_id}, restored: it was withdrawn)")
    assert store_measured_run(database_url, run).endswith(f"{run_id}, already stored)")
