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


EXAMPLES = ROOT / "baselines" / "examples.json"
CONFIG_HEADER = "best config (t/p/d/mb/recompute/schedule)"


def _table(out: str) -> list[list[str]]:
    """The body rows of the (first) table in ``out``, each a list of stripped cells."""
    return [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines() if "│" in line]


def _expected_rows(path: Path) -> list[list[str]]:
    """Each scenario of an unchanged baseline as the table shows it, every column, written
    from the recorded answers: the same numbers before and after the arrow."""
    rows = []
    for scenario in json.loads(path.read_text())["scenarios"]:
        e, c = scenario["expected"], scenario["expected"]["config"]
        config = "/".join(
            str(c[k]) for k in ("t", "p", "d", "micro_batch_size", "recompute", "schedule")
        )
        rate, peak = f"{e['samples_per_s']:.3f}", f"{e['peak_memory_gib']:.2f}"
        note = "throughput +0.00%, peak memory +0.00%"
        rows.append(
            [
                scenario["name"],
                "ok",
                f"{rate} -> {rate}",
                "+0.00%",
                f"{peak} -> {peak}",
                config,
                note,
            ]
        )
    return rows


# The columns left out at each width, worked out by hand from the widths of the whole
# values (scenario 22, status 6, samples/s 16, throughput 6, peak 14, config 23, note at
# least 24), the headers (one line: config 41, throughput 10; a word a line: config 29) and
# 3 characters per column of padding and rule, plus one: all seven fit whole headers in
# 155, a word a line 143, without the change 130, without the note too 103, then 71.
_LEFT_OUT = {
    60: ["throughput", "note", CONFIG_HEADER],
    80: ["throughput", "note", CONFIG_HEADER],
    100: ["throughput", "note", CONFIG_HEADER],
    120: ["throughput", "note"],
    160: [],
    200: [],
}


@pytest.mark.parametrize("width", sorted(_LEFT_OUT))
def test_the_table_fits_the_terminal_and_cuts_no_value(capsys, monkeypatch, width):
    """At 80 columns the configuration was broken mid-word ("2/2/2/1/n | one/v-zb",
    "s | elective/"). As plan's tables, the table keeps every value whole, leaves out the
    columns that do not fit (the throughput change first, then the note, then the
    configuration) and says which; only a scenario's name and a note wrap, at spaces."""
    monkeypatch.setenv("COLUMNS", str(width))
    code, out, _ = run(capsys, "regress", str(EXAMPLES))
    assert code == 0 and "…" not in out
    table = [line for line in out.splitlines() if line[:1] in "┏┃┡│└"]
    assert max(len(line) for line in table) <= width
    headers = ["scenario", "status", "samples/s", "throughput", "peak GiB", CONFIG_HEADER, "note"]
    shown = [i for i, h in enumerate(headers) if h not in _LEFT_OUT[width]]
    expected = [[row[i] for i in shown] for row in _expected_rows(EXAMPLES)]
    rows = _table(out)
    wrapping = [j for j, i in enumerate(shown) if headers[i] in ("scenario", "note")]
    # Every other cell is whole on its row's first line (empty on the lines a wrap adds)...
    first_lines = [r for r in rows if any(c for j, c in enumerate(r) if j not in wrapping)]
    assert [[c for j, c in enumerate(r) if j not in wrapping] for r in first_lines] == [
        [c for j, c in enumerate(r) if j not in wrapping] for r in expected
    ]
    # ...and a wrapped one is its value's words, in order.
    for j in wrapping:
        assert " ".join(c for r in rows if (c := r[j])) == " ".join(r[j] for r in expected)
    if _LEFT_OUT[width]:
        left_out = ", ".join(_LEFT_OUT[width])
        assert f"  ({left_out} left out to fit {width} columns: a wider terminal" in out
    else:
        assert "left out" not in out


def test_at_80_columns_a_failures_note_is_printed_under_the_table(capsys, tmp_path, monkeypatch):
    """The note column is left out at 80 columns (a CI log's width when it is no terminal),
    so the reason a scenario failed is said under the table, one line a scenario."""
    data = json.loads(EXAMPLES.read_text())
    data["scenarios"][0]["expected"]["peak_memory_gib"] = 10.0  # recorded: 63.329
    path = tmp_path / "examples.json"
    path.write_text(json.dumps(data))
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run(capsys, "regress", str(path))
    assert code == 1
    lines = out.splitlines()
    left_out = next(i for i, line in enumerate(lines) if "left out to fit 80 columns" in line)
    assert lines[left_out + 1 :] == [
        "  gpt3-13b on 8 A100: predicted peak memory rose 533.29% (tolerance 1%)",
        "1 of 4 scenarios regressed",
    ]
    assert _table(out)[0] == [
        "gpt3-13b on 8 A100",
        "more memory",
        "8.621 -> 8.621",
        "10.00 -> 63.33",
    ]


def test_a_changed_configuration_is_shown_whole_or_left_out(capsys, tmp_path, monkeypatch):
    path = _baseline(tmp_path, allow_config_change=True)
    recorded = json.loads(path.read_text())["scenarios"][0]["expected"]["config"]
    _edit(path, lambda s: s["expected"]["config"].update(schedule="gpipe", t=4))
    now = "/".join(
        str(recorded[k]) for k in ("t", "p", "d", "micro_batch_size", "recompute", "schedule")
    )
    before = now.split("/")
    before[0], before[5] = "4", "gpipe"
    change = f"{'/'.join(before)} -> {now}"
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run(capsys, "regress", str(path))
    assert code == 0 and _table(out)[0][5] == change
    # At 80 columns it is left out, and the allowed change is said under the table.
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run(capsys, "regress", str(path))
    assert code == 0 and change not in out and len(_table(out)[0]) == 4
    assert "  tiny: throughput +0.00%, peak memory " in out
    assert "not checked: another configuration, as allowed" in out


def test_a_throughput_drop_beyond_the_tolerance_fails(capsys, tmp_path):
    path = _baseline(tmp_path)
    # Pretend the baseline was 5% faster than today's prediction.
    _edit(path, lambda s: s["expected"].update(samples_per_s=s["expected"]["samples_per_s"] * 1.05))
    code, out, _ = run(capsys, "regress", str(path))
    assert code == 1 and "slower" in out
    # ...and a 6% tolerance lets it through.
    code, out, _ = run(capsys, "regress", str(path), "--tolerance", "6")
    assert code == 0


def test_a_peak_memory_rise_beyond_the_tolerance_fails(capsys, tmp_path):
    """A baseline whose peak memory was far below today's passed as "within tolerance"
    (peak memory was recorded and shown, never compared)."""
    path = _baseline(tmp_path)
    today = json.loads(path.read_text())["scenarios"][0]["expected"]["peak_memory_gib"]
    # Pretend the same configuration needed 5% less memory when the baseline was written.
    _edit(path, lambda s: s["expected"].update(peak_memory_gib=today / 1.05))
    code, out, _ = run(capsys, "regress", str(path), "--json")
    answer = json.loads(out)
    (outcome,) = answer["scenarios"]
    assert code == 1 and answer["failed"] == 1
    assert outcome["status"] == "more memory", outcome
    assert outcome["peak_change_pct"] == pytest.approx(5.0)
    assert outcome["message"] == "predicted peak memory rose 5.00% (tolerance 1%)"
    code, out, _ = run(capsys, "regress", str(path))
    assert code == 1 and "1 of 1 scenarios regressed" in out
    # ...and a 6% tolerance lets it through.
    code, out, _ = run(capsys, "regress", str(path), "--json", "--tolerance", "6")
    assert code == 0 and json.loads(out)["scenarios"][0]["status"] == "ok"


def test_a_peak_memory_fall_beyond_the_tolerance_is_an_improvement(capsys, tmp_path):
    path = _baseline(tmp_path)
    today = json.loads(path.read_text())["scenarios"][0]["expected"]["peak_memory_gib"]
    _edit(path, lambda s: s["expected"].update(peak_memory_gib=today * 1.25))  # 1/1.25: -20%
    code, out, _ = run(capsys, "regress", str(path), "--json")
    (outcome,) = json.loads(out)["scenarios"]
    assert code == 0 and outcome["status"] == "improved", outcome
    assert outcome["peak_change_pct"] == pytest.approx(-20.0)
    assert outcome["message"] == "throughput +0.00%, peak memory -20.00%"


def test_a_slower_answer_that_needs_more_memory_says_both(capsys, tmp_path):
    path = _baseline(tmp_path)
    _edit(
        path,
        lambda s: s["expected"].update(
            samples_per_s=s["expected"]["samples_per_s"] * 1.25,  # today: 1/1.25, -20%
            peak_memory_gib=s["expected"]["peak_memory_gib"] / 2,  # today: +100%
        ),
    )
    code, out, _ = run(capsys, "regress", str(path), "--json")
    (outcome,) = json.loads(out)["scenarios"]
    assert code == 1 and outcome["status"] == "slower"
    assert outcome["message"] == (
        "predicted throughput fell 20.00% (tolerance 1%); "
        "predicted peak memory rose 100.00% (tolerance 1%)"
    )


def test_an_allowed_other_configuration_is_not_held_to_the_recorded_memory(capsys, tmp_path):
    """A scenario that lets the best configuration change lets the planner trade memory
    for speed: another configuration's peak is reported, not compared."""
    path = _baseline(tmp_path, allow_config_change=True)
    _edit(
        path,
        lambda s: s["expected"].update(
            peak_memory_gib=s["expected"]["peak_memory_gib"] / 2,
            config={**s["expected"]["config"], "schedule": "gpipe"},
        ),
    )
    code, out, _ = run(capsys, "regress", str(path), "--json")
    (outcome,) = json.loads(out)["scenarios"]
    assert code == 0 and outcome["status"] == "ok", outcome
    assert outcome["peak_change_pct"] == pytest.approx(100.0)
    assert outcome["message"] == (
        "throughput +0.00%, peak memory +100.00%, not checked: another configuration, as allowed"
    )


def test_a_baseline_without_a_recorded_peak_memory_still_passes(capsys, tmp_path):
    """peak_memory_gib is optional: a baseline written without it is checked as before and
    told how to record it."""
    path = _baseline(tmp_path)
    _edit(path, lambda s: s["expected"].pop("peak_memory_gib"))
    code, out, _ = run(capsys, "regress", str(path), "--json")
    (outcome,) = json.loads(out)["scenarios"]
    assert code == 0 and outcome["status"] == "ok"
    assert outcome["baseline_peak_gib"] is None and outcome["peak_change_pct"] is None
    assert outcome["message"] == "throughput +0.00%, peak memory not recorded (--update records it)"


def test_the_table_shows_the_peak_memory_baseline_to_now(capsys, tmp_path, monkeypatch):
    """The QA case: the 13B scenario of the sample baseline recorded at 10 GiB, where the
    planner predicts (and the sample baseline records) 63.329 GiB."""
    data = json.loads((ROOT / "baselines" / "examples.json").read_text())
    scenario = data["scenarios"][0]
    assert scenario["name"] == "gpt3-13b on 8 A100"
    assert scenario["expected"]["peak_memory_gib"] == 63.329
    scenario["expected"]["peak_memory_gib"] = 10.0
    path = tmp_path / "examples.json"
    path.write_text(json.dumps(data))
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run(capsys, "regress", str(path))
    assert code == 1 and "1 of 4 scenarios regressed" in out
    row = next(line for line in out.splitlines() if "gpt3-13b on 8 A100" in line)
    assert "more memory" in row and "10.00 -> 63.33" in row
    code, out, _ = run(capsys, "regress", str(path), "--json")
    outcome = json.loads(out)["scenarios"][0]
    assert outcome["peak_change_pct"] == pytest.approx(533.29)  # 63.329 / 10 - 1
    assert outcome["message"] == "predicted peak memory rose 533.29% (tolerance 1%)"


def _shrink(scenario):  # the same model on far too little memory: nothing fits
    scenario["request"]["model"].update(
        hidden_size=8192, num_attention_heads=64, num_layers=64, vocab_size=50000
    )


def test_a_scenario_that_no_longer_fits_fails(capsys, tmp_path):
    path = _baseline(tmp_path)
    _edit(path, _shrink)
    code, out, _ = run(capsys, "regress", str(path), "--json")
    data = json.loads(out)
    assert code == 1
    assert data["scenarios"][0]["status"] == "infeasible"


def test_an_update_that_records_no_answer_says_so(capsys, tmp_path):
    """--update on a scenario where nothing fits printed only "updated ...: 1 scenarios",
    and every check after it failed."""
    path = _baseline(tmp_path)
    _edit(path, _shrink)
    code, out, err = run(capsys, "regress", str(path), "--update")
    assert code == 0 and "updated" in out
    assert "nothing fits in 'tiny', so no answer is recorded" in err
    assert "expected" not in json.loads(path.read_text())["scenarios"][0]
    # The check after it fails, saying what it is: nothing regressed, nothing was recorded.
    code, out, _ = run(capsys, "regress", str(path))
    assert code == 1 and "regressed" not in out
    assert "1 of 1 fit nothing and have no recorded answer" in out


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
        ('{"format": "x"}', 'its "format" is "x", not "stagewright.baseline/1"; name a baseline'),
        ('{"scenarios": []}', 'has no "format"; add "format": "stagewright.baseline/1" at its'),
        ("[1]", "is not a stagewright baseline; name a baseline file, or start one: write {"),
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


SKELETON = '{"format": "stagewright.baseline/1", "scenarios": [{"name": "NAME", "request": {...}}]}'


def _follow(message: str, name: str, request: dict) -> str:
    """The baseline a message's skeleton describes, with ``request`` for its ``{...}``."""
    skeleton = message[message.index('{"format"') :].split("]}", 1)[0] + "]}"
    return skeleton.replace('"NAME"', json.dumps(name)).replace("{...}", json.dumps(request))


def test_a_missing_baseline_says_how_to_start_one(capsys, tmp_path):
    """It said only "cannot read ...: No such file or directory"."""
    path = tmp_path / "ours.json"
    code, out, err = run(capsys, "regress", str(path))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"cannot read {path}: no such file; check the path, or start a baseline there: " in err
    assert f"write {SKELETON} to it with a plan request (what stagewright plan reads)" in err
    assert "baselines/examples.json in stagewright's repository is one to copy" in err
    assert err.endswith(f"then record its answers with stagewright regress {path} --update\n")
    # Doing what it says gives a baseline that checks.
    path.write_text(_follow(err, "tiny", TINY))
    assert run(capsys, "regress", str(path), "--update")[0] == 0
    code, out, _ = run(capsys, "regress", str(path))
    assert code == 0 and "all 1 scenarios within tolerance" in out


def test_update_of_a_missing_baseline_says_it_needs_the_scenarios(capsys, tmp_path):
    """--update cannot make a baseline up: it records the answers of the scenarios the
    file names, so it says how to write them and creates nothing."""
    path = tmp_path / "ours.json"
    code, out, err = run(capsys, "regress", str(path), "--update")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert (
        f"cannot read {path}: no such file; --update records the answers of the scenarios a "
        f"baseline names, so a new baseline starts with them: write {SKELETON} to it" in err
    )
    assert err.endswith("then run this again\n")
    assert list(tmp_path.iterdir()) == []


def test_a_plan_request_given_for_a_baseline_says_how_to_make_it_a_scenario(capsys, tmp_path):
    """It said the request "is not a stagewright baseline (expected "format": ...)"."""
    request = ROOT / "examples" / "tiny-cpu.json"
    code, out, err = run(capsys, "regress", str(request))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"{request} is a plan request, not a baseline; to check its answer in CI" in err
    skeleton = SKELETON.replace('"NAME"', '"tiny-cpu"')
    assert f"write {skeleton} to NEW.json with the contents of tiny-cpu.json for {{...}}" in err
    assert "baselines/examples.json in stagewright's repository is one to copy" in err
    assert err.endswith("then record its answers with stagewright regress NEW.json --update\n")
    path = tmp_path / "NEW.json"
    path.write_text(_follow(err, "tiny-cpu", TINY))
    assert run(capsys, "regress", str(path), "--update")[0] == 0
    assert run(capsys, "regress", str(path))[0] == 0


def test_a_folder_or_an_unreadable_baseline_says_what_to_change(capsys, tmp_path, monkeypatch):
    code, _, err = run(capsys, "regress", str(tmp_path))
    assert code == 2 and err.endswith(
        f"cannot read {tmp_path}: it is a folder; name the baseline file in it\n"
    )
    path = _baseline(tmp_path)

    def refuse(self, encoding=None):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_text", refuse)
    code, _, err = run(capsys, "regress", str(path))
    assert code == 2 and err.endswith(
        f"cannot read {path}: permission denied; make the file readable\n"
    )


@pytest.mark.parametrize(
    "change, message",
    [
        # Each was a traceback (TypeError, KeyError, ZeroDivisionError, AssertionError).
        (lambda s: s.update(tolerance_pct="x"), "tolerance_pct: Input should be a valid number"),
        (lambda s: s.update(name=3), "scenario 0: name: Input should be a valid string"),
        (lambda s: s.update(expected="x"), "expected: Input should be a valid dictionary"),
        (lambda s: s["expected"].pop("samples_per_s"), "expected.samples_per_s: Field required"),
        (lambda s: s["expected"].update(samples_per_s=0), "samples_per_s: Input should be greater"),
        (lambda s: s["expected"].update(peak_memory_gib=0), "peak_memory_gib: Input should be gre"),
        (lambda s: s["expected"].update(config=None), "expected.config: Input should be a valid"),
        (lambda s: s["expected"]["config"].pop("t"), "expected.config.t: Field required"),
        # Each was silently wrong: a NaN or negative tolerance, a NaN rate and "no" passed or
        # failed every check, a misspelt key was ignored.
        (lambda s: s.update(tolerance_pct=-5), "tolerance_pct: Input should be greater than"),
        (lambda s: s.update(tolerance_pct=float("nan")), "tolerance_pct: Input should be a finite"),
        (lambda s: s["expected"].update(samples_per_s=float("nan")), "should be a finite number"),
        (lambda s: s.update(allow_config_change="no"), "allow_config_change: Input should be a"),
        (lambda s: s.update(allow_config_changes=True), "allow_config_changes: Extra inputs"),
        (lambda s: s["expected"]["config"].update(t="1"), "config.t: Input should be a valid int"),
    ],
)
def test_a_bad_scenario_is_a_one_line_error_naming_it(capsys, tmp_path, change, message):
    path = _baseline(tmp_path)
    _edit(path, change)
    code, out, err = run(capsys, "regress", str(path))
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert message in err and "Traceback" not in err, err
    assert "instance of" not in err


def test_a_scenario_tolerance_of_null_is_the_files(capsys, tmp_path):
    path = _baseline(tmp_path, tolerance_pct=None)
    code, out, err = run(capsys, "regress", str(path), "--json")
    assert code == 0, err
    assert json.loads(out)["scenarios"][0]["tolerance_pct"] == 1.0


@pytest.mark.parametrize("flag", [["--tolerance", "5"], ["--json"]])
def test_update_refuses_an_option_it_would_ignore(capsys, tmp_path, flag):
    path = _baseline(tmp_path)
    before = path.read_text()
    code, out, err = run(capsys, "regress", str(path), "--update", *flag)
    assert code == 2 and out == "" and f"leave out {flag[0]}" in err
    assert path.read_text() == before


def test_an_update_that_cannot_be_written_keeps_the_baseline(capsys, tmp_path, monkeypatch):
    """A read-only baseline ended --update in a PermissionError traceback; a write that
    fails half-way would have left a truncated file."""
    path = _baseline(tmp_path)
    _edit(path, lambda s: s["expected"].update(samples_per_s=1e9))
    before = path.read_text()

    def refuse(self, target):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "replace", refuse)
    code, out, err = run(capsys, "regress", str(path), "--update")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "cannot rewrite" in err and "Permission denied" in err and "nothing was changed" in err
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["baseline.json"]


def test_a_baseline_with_a_byte_order_mark_reads(capsys, tmp_path):
    path = _baseline(tmp_path)
    path.write_text(path.read_text(), encoding="utf-8-sig")
    code, _, err = run(capsys, "regress", str(path))
    assert code == 0, err


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


def test_a_scenario_without_a_recorded_answer_fails_until_recorded(capsys, tmp_path):
    """A scenario added without --update passed ("all 1 scenarios within tolerance") on
    every run, never compared with anything."""
    path = _baseline(tmp_path)
    _edit(path, lambda s: s.pop("expected"))
    code, out, _ = run(capsys, "regress", str(path), "--json")
    answer = json.loads(out)
    (outcome,) = answer["scenarios"]
    assert code == 1 and answer["failed"] == 1
    assert outcome["status"] == "new" and "--update" in outcome["message"]
    code, out, _ = run(capsys, "regress", str(path))
    assert code == 1 and "0 of 1" not in out
    assert "1 of 1 without a recorded answer (--update)" in out and "regressed" not in out
    assert run(capsys, "regress", str(path), "--update")[0] == 0
    code, out, _ = run(capsys, "regress", str(path))
    assert code == 0 and "all 1 scenarios within tolerance" in out
