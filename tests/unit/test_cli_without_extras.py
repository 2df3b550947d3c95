"""``pip install stagewright`` without extras: the planner's commands run, and a command that
needs an extra says which one to install.

Each test runs the CLI in a fresh interpreter whose import system refuses the service's and
the executor's distributions, as on a machine where they were never installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.plan import plan
from planner.specs import PlanRequest

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "tiny-cpu.json"

# Top-level modules of the `service` and `executor` extras (pyproject.toml).
SERVICE = ("fastapi", "fastapi_offline", "starlette", "uvicorn", "sqlalchemy", "alembic")
SERVICE += ("psycopg", "httpx")
UNINSTALLED = (*SERVICE, "torch")

# Runs `stagewright ARGS...` with the names unimportable. A meta-path finder placed first
# answers every import of those names (and their submodules) as pip's absence would.
_BOOTSTRAP = """
import sys

UNINSTALLED = frozenset({names!r})
loaded = UNINSTALLED & {{name.partition(".")[0] for name in sys.modules}}
assert not loaded, f"imported before the CLI started: {{sorted(loaded)}}"


class Uninstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in UNINSTALLED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, Uninstalled())
from cli.main import main

sys.exit(main(sys.argv[1:]))
"""


def bootstrap(uninstalled: tuple[str, ...] = UNINSTALLED) -> str:
    return _BOOTSTRAP.format(names=tuple(sorted(uninstalled)))


def stagewright(
    *args: str, uninstalled: tuple[str, ...] = UNINSTALLED
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", bootstrap(uninstalled), *args],
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_modules_really_are_unimportable():
    """The bootstrap works: importing any of the names fails in the child."""
    code = bootstrap().replace(
        "from cli.main import main\n\nsys.exit(main(sys.argv[1:]))",
        "import importlib\n"
        "for name in sorted(UNINSTALLED):\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ModuleNotFoundError as exc:\n"
        "        print(exc.name)\n",
    )
    assert code != bootstrap()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == sorted(UNINSTALLED)


def test_simulate_prints_the_1f1b_makespan():
    """1F1B on p devices with m micro-batches, forward f and backward b per stage and no
    communication takes (m + p - 1)(f + b): every device runs m forwards and m backwards,
    and the last backward of stage 0 starts after m + p - 1 slots of f + b."""
    m, p, f, b = 8, 4, 1.0, 2.0
    done = stagewright(
        "simulate",
        "--schedule",
        "1f1b",
        "--devices",
        str(p),
        "--microbatches",
        str(m),
        "--f",
        str(f),
        "--b",
        str(b),
        "--w",
        "0",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["makespan"] == pytest.approx((m + p - 1) * (f + b))
    assert result["bubble_fraction"] == pytest.approx((p - 1) / (m + p - 1))
    assert result["peak_activation_fraction"] == pytest.approx([1.0, 0.75, 0.5, 0.25])
    assert [d["busy"] for d in result["devices"]] == pytest.approx([m * (f + b)] * p)


def test_plan_prints_the_plan_the_planner_makes():
    """Without the extras, `plan` answers exactly what the planner answers in this (full)
    environment: the same ranked configurations and predictions, and the same summary."""
    expected = plan(PlanRequest.model_validate_json(TINY.read_text())).model_dump(mode="json")
    assert expected["candidates"], "the tiny example plans at least one candidate"

    as_json = stagewright("plan", str(TINY), "--json")
    assert as_json.returncode == 0, as_json.stderr
    got = json.loads(as_json.stdout)
    assert [c["config"] for c in got["candidates"]] == [c["config"] for c in expected["candidates"]]
    assert [c["predicted"] for c in got["candidates"]] == [
        c["predicted"] for c in expected["candidates"]
    ]

    as_text = stagewright("plan", str(TINY))
    assert as_text.returncode == 0, as_text.stderr
    stats = expected["stats"]
    assert f"{stats['evaluated']} configurations, {stats['feasible']} fit" in as_text.stdout
    assert "best candidate: per pipeline device" in as_text.stdout


@pytest.mark.parametrize(
    ("args", "extra"),
    [
        (["serve"], "service"),
        (["profiles", "load"], "service"),
        (["measurements", "list"], "service"),
        (["plan", "examples/tiny-cpu.json", "--database-url", "sqlite://"], "service"),
        (["regress", "baselines/examples.json", "--database-url", "sqlite://"], "service"),
        (["run", "executor-config.json"], "executor"),
        (["profile", "examples/tiny-cpu.json"], "executor"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else value,
)
def test_a_command_that_needs_an_extra_names_it(args, extra):
    check_names_the_extra(stagewright(*args), args[0], extra)


def test_run_record_names_the_service_extra_before_running(tmp_path):
    """With torch but without the service, `run --record` stops before starting any rank
    (the config does not even exist), instead of failing after the run."""
    done = stagewright(
        "run", str(tmp_path / "missing.json"), "--steps", "2", "--record", uninstalled=SERVICE
    )
    check_names_the_extra(done, "run", "service")


def check_names_the_extra(done: subprocess.CompletedProcess[str], command: str, extra: str):
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr  # one line, no traceback
    assert lines[0].startswith(f"stagewright {command}: error: ")
    assert f"install it with pip install 'stagewright[{extra}]'" in lines[0]
    missing = lines[0].split(" needs ")[1].split(":")[0]
    assert missing in UNINSTALLED
