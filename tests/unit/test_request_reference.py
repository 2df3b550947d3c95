"""docs/request-reference.md is generated from the models and kept current, names every
field of the request and every column the CLI prints, and its recipe for adding a GPU
works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cli.reference_doc import reference
from cli.render import BY_SCHEDULE_COLUMNS, DEVICE_COLUMNS, RANKED_COLUMNS
from planner.specs import PlanRequest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "request-reference.md"


def test_the_committed_reference_is_current():
    assert DOC.read_text(encoding="utf-8") == reference(), (
        "docs/request-reference.md is stale: run "
        "`python -m cli.reference_doc > docs/request-reference.md`"
    )


def test_every_request_field_has_a_row():
    text = DOC.read_text(encoding="utf-8")
    schema = PlanRequest.model_json_schema()
    for group, ref in schema["properties"].items():
        spec = schema["$defs"][ref["$ref"].rsplit("/", 1)[1]]
        for name in spec["properties"]:
            assert f"| `{group}.{name}` |" in text, f"{group}.{name}"


def test_every_cli_column_is_explained(capsys, monkeypatch):
    from cli.main import main

    monkeypatch.setenv("COLUMNS", "250")  # every header on one line
    main(["plan", str(REPO / "examples" / "tiny-cpu.json")])
    out = capsys.readouterr().out
    text = DOC.read_text(encoding="utf-8")
    for header, _ in (*RANKED_COLUMNS, *DEVICE_COLUMNS, *BY_SCHEDULE_COLUMNS):
        assert header in out  # the column is printed ...
        escaped = header.replace("|", "\\|")
        assert f"| {escaped} |" in text  # ... and explained


def test_adding_your_own_gpu_as_the_reference_says(tmp_path):
    bundled = json.loads((REPO / "profiles" / "hardware.json").read_text())
    mine = {**bundled["hardware"][0], "name": "my-gpu", "usable_memory_gib": 60.0}
    (tmp_path / "hardware.json").write_text(
        json.dumps({"format": bundled["format"], "hardware": [mine]})
    )
    request = json.loads((REPO / "examples" / "gpt3-13b-8xa100.json").read_text())
    request["cluster"]["gpu"] = "my-gpu"
    path = tmp_path / "request.json"
    path.write_text(json.dumps(request))
    env = {**os.environ, "STAGEWRIGHT_PROFILES": str(tmp_path), "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "plan", str(path), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["request"]["cluster"]["gpu"] == "my-gpu"
    assert plan["best"]["predicted"]["peak_memory_gib"] <= 60.0
