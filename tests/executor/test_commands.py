"""``stagewright run`` and ``stagewright profile`` as a person runs them."""

from __future__ import annotations

import json
import subprocess
import sys

from api.cli import main
from tests.executor.configs import TINY, make_config, write


def test_run_prints_each_rank_next_to_the_prediction(capsys, tmp_path):
    config = write(tmp_path, "job", make_config("bpipe", 1, 2, 1, 4))
    code = main(["run", str(config), "--steps", "2", "--verify", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    data = json.loads(out)
    assert data["world_size"] == 2
    for row in data["ranks"]:
        assert row["verify"]["max_grad_error"] < 1e-5
        assert row["peak_activation_bytes"] > 0
        assert row["predicted_activation_bytes"] > 0
        assert row["step_s"] >= row["busy_s"] >= 0


def test_run_with_the_wrong_number_of_ranks_is_a_one_line_error(capsys, tmp_path):
    config = write(tmp_path, "job", make_config("1f1b", 1, 2, 1, 4))
    code = main(["run", str(config), "--nproc", "4"])
    err = capsys.readouterr().err
    assert code == 2 and "--nproc 4 does not match" in err and err.count("\n") == 1


def test_profile_writes_a_point_the_planner_reads(capsys, tmp_path):
    model = tmp_path / "model.json"
    model.write_text(json.dumps({"model": TINY}))
    code = main(
        ["profile", str(model), "--out", str(tmp_path / "profiles"), "--repeats", "1", "--json"]
    )
    assert code == 0
    stored = json.loads(capsys.readouterr().out)
    point = stored["point"]
    assert point["activation_bytes"] > 0 and point["forward_ms"] > 0
    files = list((tmp_path / "profiles" / "layers").glob("*.json"))
    assert len(files) == 1
    # The planner finds the point through STAGEWRIGHT_PROFILES.
    code = (
        "import json, sys; from planner.profiles import JsonProfileStore; "
        "store = JsonProfileStore.load(); "
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
