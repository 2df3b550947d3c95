"""``stagewright regress``: one test per exit reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.main import main
from cli.regress import update_baseline

ROOT = Path(__file__).resolve().parents[2]
TINY = json.loads((ROOT / "examples" / "tiny-cpu.json").read_text())


def _baseline(tmp_path: Path, **scenario_fields) -> Path:
    data = {
        "format": "stagewright.baseline/1",
        "tolerance_pct": 1.0,
        "scenarios": [{"name": "tiny", "request": TINY, **scenario_fields}],
    }
    data = update_baseline(data)
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(data))
    return path


def _edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data["scenarios"][0])
    path.write_text(json.dumps(data))


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_unchanged_scenarios_pass(capsys, tmp_path):
    code, out, _ = run(capsys, "regress", str(_baseline(tmp_path)))
    assert code == 0
    assert "all 1 scenarios within tolerance" in out


def test_the_table_fits_the_terminal_and_loses_nothing(capsys, tmp_path, monkeypatch):
    """COLUMNS=80 (no terminal): the table is 80 wide, as plan's is, and the best
    configuration is wrapped, not cut to an ellipsis."""
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run(capsys, "regress", str(_baseline(tmp_path)))
    assert code == 0
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "…" not in out
    recorded = json.loads(_baseline(tmp_path).read_text())["scenarios"][0]["expected"]["config"]
    cells = "".join(line.split("│")[6].strip() for line in out.splitlines() if line.count("│") == 8)
    assert cells.startswith(f"{recorded['t']}/{recorded['p']}/{recorded['d']}/")
    assert cells.endswith(recorded["schedule"])


def test_a_throughput_drop_beyond_the_tolerance_fails(capsys, tmp_path):
    path = _baseline(tmp_path)
    # Pretend the baseline was 5% faster than today's prediction.
    _edit(path, lambda s: s["expected"].update(samples_per_s=s["expected"]["samples_per_s"] * 1.05))
    code, out, _ = run(capsys, "regress", str(path))
    assert code == 1 and "slower" in out
    # ...and a 6% tolerance lets it through.
    code, out, _ = run(capsys, "regress", str(path), "--tolerance", "6")
    assert code == 0


def test_a_scenario_that_no_longer_fits_fails(capsys, tmp_path):
    path = _baseline(tmp_path)

    def shrink(scenario):  # the same model on far too little memory: nothing fits
        scenario["request"]["model"].update(
            hidden_size=8192, num_attention_heads=64, num_layers=64, vocab_size=50000
        )

    _edit(path, shrink)
    code, out, _ = run(capsys, "regress", str(path), "--json")
    data = json.loads(out)
    assert code == 1
    assert data["scenarios"][0]["status"] == "infeasible"


def test_a_changed_best_configuration_fails_unless_allowed(capsys, tmp_path):
    path = _baseline(tmp_path)
    _edit(path, lambda s: s["expected"]["config"].update(schedule="gpipe", t=4))
    code, out, _ = run(capsys, "regress", str(path), "--json")
    assert code == 1
    assert json.loads(out)["scenarios"][0]["status"] == "config changed"
    _edit(path, lambda s: s.update(allow_config_change=True))
    code, _, _ = run(capsys, "regress", str(path))
    assert code == 0


def test_a_best_that_changes_only_its_chunks_per_device_is_a_changed_configuration(
    capsys, tmp_path
):
    request = json.loads(json.dumps(TINY))
    request["model"]["num_layers"] = 16
    request["search"].update(schedules=["interleaved"], num_chunks=[2])
    path = tmp_path / "baseline.json"
    scenario = {"name": "chunks", "request": request}
    data = update_baseline({"format": "stagewright.baseline/1", "scenarios": [scenario]})
    assert "num_chunks" not in data["scenarios"][0]["expected"]["config"]  # the default, 2
    path.write_text(json.dumps(data))
    # Searching four chunks too: the best keeps its t, p, d, micro-batch and schedule, v = 4.
    _edit(path, lambda s: s["request"]["search"].update(num_chunks=[2, 4]))
    code, out, _ = run(capsys, "regress", str(path), "--json")
    (outcome,) = json.loads(out)["scenarios"]
    assert code == 1 and outcome["status"] == "config changed", outcome
    assert "num_chunks default -> 4" in outcome["message"]
    # ...and the other way: a baseline of v = 4 that is now the default.
    assert run(capsys, "regress", str(path), "--update")[0] == 0
    _edit(path, lambda s: s["request"]["search"].update(num_chunks=[2]))
    code, out, _ = run(capsys, "regress", str(path), "--json", "--tolerance", "50")
    (outcome,) = json.loads(out)["scenarios"]
    assert code == 1 and "num_chunks 4 -> default" in outcome["message"], outcome


def test_update_records_todays_answers(capsys, tmp_path):
    path = _baseline(tmp_path)
    _edit(path, lambda s: s["expected"].update(samples_per_s=1e9))
    code, out, _ = run(capsys, "regress", str(path), "--update")
    assert code == 0 and "updated" in out
    code, _, _ = run(capsys, "regress", str(path))
    assert code == 0


@pytest.mark.parametrize(
    "content, message",
    [
        ("{", "is not JSON"),
        ('{"format": "x"}', "is not a stagewright baseline"),
        ('{"format": "stagewright.baseline/1", "scenarios": []}', "has no scenarios"),
        (
            '{"format": "stagewright.baseline/1", "scenarios": [{"name": "a"}]}',
            "needs a name and a request",
        ),
    ],
)
def test_a_bad_baseline_is_a_one_line_error(capsys, tmp_path, content, message):
    path = tmp_path / "b.json"
    path.write_text(content)
    code, out, err = run(capsys, "regress", str(path))
    assert code == 2 and message in err and err.count("\n") == 1


def test_the_sample_baseline_of_the_examples_passes(capsys):
    code, out, _ = run(capsys, "regress", str(ROOT / "baselines" / "examples.json"))
    assert code == 0, out


def test_the_sample_baseline_is_current(capsys):
    """A change to the cost model that moves a scenario's prediction, either way, re-accepts
    the baseline in the same change (``regress --update``, saying why in the commit): a
    baseline left behind silently uses up the tolerance a real regression would need."""
    code, out, _ = run(capsys, "regress", str(ROOT / "baselines" / "examples.json"), "--json")
    assert code == 0, out
    for scenario in json.loads(out)["scenarios"]:
        assert abs(scenario["change_pct"]) < 0.01, scenario["message"]
        assert scenario["peak_gib"] == scenario["baseline_peak_gib"], scenario["name"]
