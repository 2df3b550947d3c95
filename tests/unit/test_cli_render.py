"""``stagewright plan`` in a terminal: tables that fit its width, rejections summarised by
reason, the chosen schedule drawn with --timeline, and out-of-memory hints that never
suggest what the request already does."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from cli.main import main
from planner.assemble import no_fit_hint
from planner.schedules import generate
from planner.simulate import Durations, simulate
from planner.specs import CandidateConfig, PlanRequest

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "tiny-cpu.json"
BOX = "┏┃┡│└┗━─╇┳┻┯┷"


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _table_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line[:1] in BOX]


def _write(tmp_path: Path, data: dict[str, Any]) -> str:
    path = tmp_path / "request.json"
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize("columns", [80, 120, 200])
def test_tables_fit_the_terminal_width(capsys, monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    code, out, _ = _run(capsys, "plan", str(TINY), "--all")
    assert code == 0
    lines = _table_lines(out)
    assert lines and max(len(line) for line in lines) <= columns
    if columns >= 120:  # wide enough: one line per ranked candidate, none wrapped
        _, plan_json, _ = _run(capsys, "plan", str(TINY), "--json")
        ranked = len(json.loads(plan_json)["candidates"])
        start = next(i for i, line in enumerate(lines) if line.startswith("┡"))
        rows = []
        for line in lines[start + 1 :]:
            if line.startswith("└"):
                break
            rows.append(line)
        assert len(rows) == ranked


@pytest.mark.parametrize("columns", [60, 80, 200])
def test_a_narrow_terminal_leaves_columns_out_and_says_so_rather_than_cutting_values(
    capsys, monkeypatch, columns
):
    monkeypatch.setenv("COLUMNS", str(columns))
    _, plan_json, _ = _run(capsys, "plan", str(TINY), "--json")
    ranked = json.loads(plan_json)["candidates"]
    code, out, _ = _run(capsys, "plan", str(TINY), "--all")
    assert code == 0
    lines = _table_lines(out)
    assert max(len(line) for line in lines) <= columns
    assert not any("…" in line for line in lines)  # no value (or header) cut short
    start = next(i for i, line in enumerate(lines) if line.startswith("┡"))
    rows = lines[start + 1 : start + 1 + len(ranked)]
    for row, candidate in zip(rows, ranked, strict=True):
        cells = [c.strip() for c in row.strip("│").split("│")]
        assert f"{candidate['predicted']['iteration_time_s']:.3f}" in cells
        schedule = candidate["config"]["schedule"]
        stale = candidate["semantics"] == "stale"  # labelled where it is ranked
        assert (f"{schedule} (stale)" if stale else schedule) in cells
    dropped = re.findall(r"^  \((.+) left out to fit (\d+) columns", out, flags=re.M)
    if columns >= 200:
        assert dropped == []
    else:
        assert dropped and all(int(width) == columns for _, width in dropped)
        assert "samples/s" in dropped[0][0]  # the ranked table's first to go


def test_all_summarises_rejections_by_reason_before_the_rows(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    _, plan_json, _ = _run(capsys, "plan", str(TINY), "--json", "--all")
    reasons = [r["reason"] for r in json.loads(plan_json)["rejected"]]
    _, out, _ = _run(capsys, "plan", str(TINY), "--all")
    summary_at = out.index(f"rejected ({len(reasons):,}) by reason")
    rows_at = out.index(f"every rejected configuration ({len(reasons):,})")
    assert summary_at < rows_at
    summary = out[summary_at:rows_at]
    counted = {}
    for line in summary.splitlines():
        cells = [c.strip() for c in line.strip("│").split("│")]
        if len(cells) == 2 and cells[0].replace(",", "").isdigit():
            counted[cells[1]] = int(cells[0].replace(",", ""))
    # Grouped by the reason's head with its numbers blanked (a hand-written grouping).
    expected = Counter()
    for reason in reasons:
        head = reason.split(":")[0].split(";")[0].split("(")[0]
        expected[re.sub(r"\b\d+(\.\d+)?\b", "n", head).strip()] += 1
    assert counted == dict(expected)
    assert sum(counted.values()) == len(reasons)


def test_timeline_draws_the_chosen_schedule_with_a_legend(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("COLUMNS", "100")
    data = json.loads(TINY.read_text())
    data["search"] = {"schedules": ["1f1b"], "micro_batch_sizes": [1], "top_k": 1}
    data["cluster"].update(gpus_per_node=4)
    data["model"]["num_layers"] = 64  # deep enough that a pipeline pays off
    path = _write(tmp_path, data)
    _, plan_json, _ = _run(capsys, "plan", path, "--json")
    best = json.loads(plan_json)["best"]["config"]
    code, out, _ = _run(capsys, "plan", path, "--timeline")
    assert code == 0
    rows = re.findall(r"^dev (\d+) +\|([^|]+)\|$", out, flags=re.M)
    assert [int(d) for d, _ in rows] == list(range(best["p"]))
    width = len(rows[0][1])
    assert all(len(r) == width for _, r in rows) and width <= 100
    # Each device's idle columns match the simulated idle share of its schedule (1F1B with
    # equal stages: device d waits d forwards at the start).
    schedule = generate("1f1b", best["p"], best["num_microbatches"])
    result = simulate(schedule, Durations(forward=1.0, backward=2.0))
    if best["p"] > 1:
        assert rows[0][1][0] == "F" and rows[-1][1][0] == "."
    for (_, row), stats in zip(rows, result.devices, strict=True):
        idle = row.count(".") / width
        assert idle == pytest.approx(1 - stats.busy / result.makespan, abs=0.15)
    legend = next(line for line in out.splitlines() if line.startswith("legend: "))
    drawn = set("".join(r for _, r in rows)) - {"."}
    assert {item.split(" ")[0] for item in legend[8:].split("   ")} == drawn | {"."}


def test_timeline_refuses_json(capsys):
    code, out, err = _run(capsys, "plan", str(TINY), "--timeline", "--json")
    assert code == 2 and out == ""
    assert "leave out --json" in err


def _request(**changes: Any) -> PlanRequest:
    data = json.loads(TINY.read_text())
    for key, value in changes.items():
        group, name = key.split("__")
        data.setdefault(group, {})[name] = value
    return PlanRequest.model_validate(data)


def test_the_no_fit_hint_leaves_out_what_is_already_on():
    everything = _request(
        search__recompute=["none", "full"],
        search__micro_batch_sizes=[1, 2],
        training__distributed_optimizer=True,
        training__sequence_parallel=True,
        training__flash_attention=True,
    )
    hint = no_fit_hint(everything)
    for already in ("recompute", "micro_batch_sizes", "distributed_optimizer", "sequence", "flash"):
        assert already not in hint
    assert "more GPUs" in hint
    nothing = _request(
        search__recompute=["none"],
        search__micro_batch_sizes=[4],
        training__distributed_optimizer=False,
        training__sequence_parallel=False,
        training__flash_attention=False,
    )
    hint = no_fit_hint(nothing)
    for missing in ("recompute", "micro_batch_sizes", "distributed_optimizer", "sequence", "flash"):
        assert missing in hint


def test_the_no_fit_hint_offers_no_saving_the_cluster_cannot_use(capsys, monkeypatch, tmp_path):
    # GPT-3 13B on one GPU: t = d = 1 is the only split, so sequence parallelism (which
    # splits over t) and the distributed optimizer (which shards over d) change nothing;
    # the hint offers what would: more GPUs, full recomputation, micro-batch 1, flash.
    monkeypatch.setenv("COLUMNS", "400")
    data = json.loads((REPO / "examples" / "gpt3-13b-8xa100.json").read_text())
    data["cluster"].update(num_nodes=1, gpus_per_node=1)
    data["training"].update(distributed_optimizer=False, sequence_parallel=False)
    data["search"].update(schedules=["1f1b"], recompute=["none"], micro_batch_sizes=[8])
    code, out, _ = _run(capsys, "plan", _write(tmp_path, data))
    assert code == 1
    hint = next(line for line in out.splitlines() if "No configuration fits" in line)
    for useful in ("more GPUs", "recompute", "micro_batch_sizes", "flash_attention"):
        assert useful in hint
    assert "sequence_parallel" not in hint and "distributed_optimizer" not in hint
    # On 8 GPUs the same request may split both ways: both are offered.
    data["cluster"].update(gpus_per_node=8)
    data["model"].update(num_layers=400)  # too big for 8 GPUs either way
    code, out, _ = _run(capsys, "plan", _write(tmp_path, data))
    assert code == 1
    hint = next(line for line in out.splitlines() if "No configuration fits" in line)
    assert "sequence_parallel" in hint and "distributed_optimizer" in hint


def test_the_printed_hint_is_the_requests(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("COLUMNS", "400")  # the hint on one line
    data = json.loads((REPO / "examples" / "gpt3-13b-8xa100.json").read_text())
    data["cluster"].update(num_nodes=1, gpus_per_node=1)
    data["search"].update(schedules=["1f1b"], recompute=["full"])
    code, out, _ = _run(capsys, "plan", _write(tmp_path, data))
    assert code == 1
    assert "No configuration fits" in out
    hint = next(line for line in out.splitlines() if "No configuration fits" in line)
    assert "more GPUs" in hint and "recompute" not in hint


@pytest.mark.parametrize(
    ("search", "training", "expected", "hint"),
    [
        # Every configuration refused by the runtime or the pipeline length: not memory.
        ({"schedules": ["v-zb"], "runtime": "megatron"}, {}, "No configuration can run:", False),
        # A context-parallel degree no split of 4 GPUs takes: nothing to search.
        (
            {"schedules": ["1f1b"], "context_parallel": [16]},
            {"flash_attention": True},
            "No configuration to search:",
            False,
        ),
    ],
)
def test_an_empty_plan_says_why_without_blaming_memory_when_memory_was_not_why(
    capsys, monkeypatch, tmp_path, search, training, expected, hint
):
    monkeypatch.setenv("COLUMNS", "400")
    data = json.loads(TINY.read_text())
    data["search"] = {**search, "micro_batch_sizes": [1]}
    data["training"].update(training)
    code, out, _ = _run(capsys, "plan", _write(tmp_path, data))
    assert code == 1
    assert expected in out
    assert "fits in memory" not in out and ("may help" in out) == hint
    if "context_parallel" in search:
        assert "note: context-parallel degree 16 not searched" in out


def test_the_plan_says_what_of_the_space_it_did_not_search(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("COLUMNS", "200")
    data = json.loads(TINY.read_text())
    data["training"]["global_batch_size"] = 13  # only mb 1 with d 1 divides it
    data["search"]["micro_batch_sizes"] = [1, 2, 4]
    code, out, _ = _run(capsys, "plan", _write(tmp_path, data))
    assert code == 0
    notes = [line for line in out.splitlines() if line.startswith("  note: ")]
    assert notes[0].startswith("  note: micro-batch sizes 2, 4 not searched")
    assert notes[1].startswith("  note: data-parallel degrees 2, 4 not searched")


def test_the_device_columns_add_up_to_the_span_and_the_step_adds_sync_and_the_optimizer(
    capsys, monkeypatch
):
    from planner.costmodel import PlanContext, price
    from planner.costmodel.evaluate import estimate
    from planner.profiles import default_store

    monkeypatch.setenv("COLUMNS", "200")
    request = PlanRequest.model_validate_json(
        (REPO / "examples" / "gpt3-96b-32xa100.json").read_text()
    )
    code, out, _ = _run(capsys, "plan", str(REPO / "examples" / "gpt3-96b-32xa100.json"))
    assert code == 0
    line = next(line for line in out.splitlines() if "the pipeline's span" in line)
    span, step, rest = map(float, re.findall(r"(\d+\.\d+) s", line))
    _, plan_json, _ = _run(
        capsys, "plan", str(REPO / "examples" / "gpt3-96b-32xa100.json"), "--json"
    )
    best = json.loads(plan_json)["best"]
    # Priced again here: the simulated span, and the data-parallel sync and optimizer step.
    ctx = PlanContext.from_store(request, default_store())
    priced = price(ctx, estimate(ctx, CandidateConfig.model_validate(best["config"])))
    assert span == pytest.approx(priced.makespan_s, abs=1e-3)
    assert rest == pytest.approx(priced.data_parallel_s + priced.optimizer_s, abs=2e-3)
    assert step == pytest.approx(best["predicted"]["iteration_time_s"], abs=1e-3)
    for row in best["breakdown"]:
        assert row["compute_s"] + row["bubble_s"] == pytest.approx(priced.makespan_s, rel=1e-6)
        assert row["communication_s"] <= row["compute_s"] + row["bubble_s"]


def test_a_best_candidate_only_megatron_runs_prints_no_torchrun_line(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    path = REPO / "examples" / "llama3-8b-8xh100.json"
    _, plan_json, _ = _run(capsys, "plan", str(path), "--json")
    best = json.loads(plan_json)["best"]
    assert "stagewright" not in best["runtimes"]  # context parallelism: Megatron-LM only
    _, out, _ = _run(capsys, "plan", str(path))
    line = next(line for line in out.splitlines() if line.startswith("  torchrun:"))
    assert "executor.worker" not in line
    assert best["runtime_limits"]["stagewright"] in line


def test_a_timeline_of_one_device_says_it_in_the_singular(capsys, tmp_path):
    data = json.loads(TINY.read_text())
    data["cluster"].update(gpus_per_node=1)
    data["training"]["global_batch_size"] = 1
    code, out, _ = _run(capsys, "plan", _write(tmp_path, data), "--timeline")
    assert code == 0
    assert re.search(r"^schedule [a-z0-9-]+: 1 device, 1 micro-batch$", out, flags=re.M), out
