"""The schedule registry: every entry tells the truth about its generator, and outside
planner/schedules a schedule name is data, never a branch."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from planner.errors import ScheduleConfigError
from planner.schedules import (
    SCHEDULE_NAMES,
    ActionKind,
    families,
    generate,
    schedule_family,
)
from planner.simulate import Durations, simulate
from tests.unit.helpers import generate_any

ROOT = Path(__file__).resolve().parents[2]
CONTRACT_NAMES = ("gpipe", "1f1b", "interleaved", "bpipe", "v-min", "v-half", "v-zb", "2bw")


def _microbatches(name: str, p: int) -> int:
    return 2 * p if schedule_family(name).microbatches_multiple_of_devices else 2 * p + 1


def test_the_contract_names_come_first_in_their_order():
    assert SCHEDULE_NAMES[: len(CONTRACT_NAMES)] == CONTRACT_NAMES
    assert len(set(SCHEDULE_NAMES)) == len(SCHEDULE_NAMES)


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_the_entry_describes_what_its_generator_builds(name):
    family = schedule_family(name)
    p = 8
    schedule = generate_any(name, p, _microbatches(name, p))
    assert schedule.name == name
    assert schedule.stage_devices == family.stage_devices(p)
    assert schedule.num_stages == family.num_stages(p)
    assert schedule.split_backward == family.split_backward
    assert bool(schedule.count(ActionKind.B, ActionKind.W)) == family.split_backward
    assert bool(schedule.count(ActionKind.EVICT, ActionKind.LOAD)) == family.transfers
    versions = {a.version for _, _, a in schedule.iter_actions() if a.version is not None}
    # A family that keeps one weight copy never steps to a new version inside a run.
    assert (len(versions) > 0) == (family.weight_versions > 1)
    assert (family.semantics == "stale") == (family.weight_versions > 1)
    assert "stagewright" in family.runtimes
    assert family.title and family.citation and family.memory_rule


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_the_search_never_offers_what_the_generator_refuses(name):
    """``problem`` (why the search skips a point) covers every refusal of the generator;
    it may be stricter (a pipeline of one device gains nothing from interleaving)."""
    family = schedule_family(name)
    for p in (1, 2, 3, 4):
        for m in (1, 2, 3, 4, 6, 8):
            problem = family.problem(p, m)
            if problem is None:
                generate_any(name, p, m)
            else:
                assert name in problem


def test_stale_families_are_the_ones_that_update_with_old_gradients():
    """PipeDream-2BW's 1-stale update: its simulated step has no flush, so a third batch
    costs less than a whole flushed batch; every synchronous family flushes."""
    stale = [f.name for f in families() if f.semantics == "stale"]
    assert stale == ["2bw"]
    assert all(f.flush_per_batch for f in families() if f.semantics == "synchronous")
    two = simulate(generate("2bw", 4, 8, num_batches=2), Durations(1.0, 2.0)).makespan
    three = simulate(generate("2bw", 4, 8, num_batches=3), Durations(1.0, 2.0)).makespan
    one_batch = simulate(generate("1f1b", 4, 8), Durations(1.0, 2.0)).makespan
    assert three - two < one_batch


def test_parameters_a_family_does_not_take_are_refused():
    with pytest.raises(ScheduleConfigError, match="v-half has no parameter num_chunks"):
        generate("v-half", 4, 8, num_chunks=2)
    with pytest.raises(ScheduleConfigError, match="its parameters: none"):
        generate("1f1b", 4, 8, num_batches=2)
    with pytest.raises(ScheduleConfigError, match="num_chunks must be a whole number"):
        generate("interleaved", 4, 8, num_chunks=2.5)
    assert generate("interleaved", 4, 8, num_chunks=3).num_stages == 12


def test_unknown_names_list_the_known_ones():
    with pytest.raises(ScheduleConfigError, match="unknown schedule 'zb-h9'; choose one of 'gp"):
        schedule_family("zb-h9")


# ----------------------------------------------------------------- names are data outside
def _product_files() -> list[Path]:
    """planner/ (outside the registry's package), api/, executor/ and cli/."""
    files = []
    for package in ("planner", "api", "executor", "cli"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if not path.is_relative_to(ROOT / "planner" / "schedules"):
                files.append(path)
    return files


def _example_spans(tree: ast.Module) -> list[tuple[int, int]]:
    """Module-level ``*EXAMPLES`` assignments: OpenAPI example requests, data by nature."""
    spans = []
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id.endswith("EXAMPLES") for t in targets):
                spans.append((node.lineno, node.end_lineno or node.lineno))
    return spans


def _names_in(source: str) -> list[tuple[int, str]]:
    """(line, name) of every schedule name in ``source`` outside ``*EXAMPLES``."""
    names = set(SCHEDULE_NAMES)
    tree = ast.parse(source)
    examples = _example_spans(tree)
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and node.value in names
        and not any(a <= node.lineno <= b for a, b in examples)
    ]


def test_product_code_never_names_a_schedule():
    """Outside planner/schedules a schedule name is data: no comparison, no lookup table
    keyed by names, no default spelled out. Ask ``schedule_family(name)`` instead (its
    ``BASELINE_SCHEDULE`` for the reference schedule)."""
    offenders = [
        f"{path.relative_to(ROOT)}:{line} {name!r}"
        for path in _product_files()
        for line, name in _names_in(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []


def test_the_scan_sees_branches_and_tables_but_not_examples():
    source = (
        'EXAMPLES = {"v-half": {"schedule": "v-half"}}\n'
        'if config.schedule == "bpipe":\n'
        '    idle = {"v-zb": 0.1}["v-zb"]\n'
    )
    assert _names_in(source) == [(2, "bpipe"), (3, "v-zb"), (3, "v-zb")]


def test_the_dashboard_lists_the_registry_not_its_own_names():
    """The form's schedules come from the request schema (whose enum is the registry's);
    the only names in the dashboard's scripts are the form's starting selection."""
    scripts = {
        path.name: path.read_text(encoding="utf-8")
        for path in (ROOT / "api" / "static").glob("*.js")
    }
    named = [
        (name, line.strip())
        for name, script in scripts.items()
        for line in script.splitlines()
        if any(f'"{n}"' in line for n in SCHEDULE_NAMES)
    ]
    assert len(named) == 1
    assert named[0][0] == "form.js" and named[0][1].startswith("search: { schedules: [")
    assert 'api("/openapi.json")' in scripts["form.js"]
