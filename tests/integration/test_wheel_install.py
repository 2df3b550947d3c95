"""``pip install .`` (not editable) installs everything the commands read.

The test builds a wheel from a copy of the checkout (``pip wheel --no-build-isolation``, with
the setuptools of this environment and no index), installs it with ``pip install --target``
into a temporary folder, and runs the installed code there: ``PYTHONPATH`` puts that folder
before the editable install's import hook, the working directory is a temporary folder
outside the checkout, and each run first checks that ``planner``, ``api`` and ``cli`` were
imported from the installed copy, or the test would prove nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "tiny-cpu.json"
PACKAGES = ("planner", "api", "executor", "cli")
# Top-level data folders of the checkout and where a wheel carries them (pyproject.toml).
DATA = {"profiles": "planner/_data/profiles", "migrations": "api/_data/migrations"}
# What a copy of the checkout leaves out: environments, caches, earlier builds, databases.
_NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".*_cache",
    ".hypothesis", ".test-artifacts", "stagewright.db*",
)  # fmt: skip

pytestmark = pytest.mark.slow

# Run in the installed copy: where the code came from, then the data it found.
_WHERE = """
import json, sys
import api, cli, planner
from api.core.db import MIGRATIONS
from api.routes.dashboard import STATIC
from planner.profiles import BUNDLED_PROFILES
print(json.dumps({
    "modules": [m.__file__ for m in (planner, api, cli)],
    "data": [str(BUNDLED_PROFILES), str(MIGRATIONS), str(STATIC)],
}))
"""

# The installed application's dashboard page and one of its scripts (no lifespan: no
# database is needed to serve them).
_DASHBOARD = """
from fastapi.testclient import TestClient
from api.app import create_app
client = TestClient(create_app())
page = client.get("/")
script = client.get("/static/app.js")
print(page.status_code, script.status_code, page.headers["content-type"], "<title>" in page.text)
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The wheel, the folder it is installed in, and an empty working folder."""
    top = tmp_path_factory.mktemp("wheel")
    source, wheels, site, work = top / "src", top / "wheels", top / "site", top / "work"
    # A copy: building in the checkout would leave build/ there, whose stale files a later
    # build would pack.
    shutil.copytree(REPO, source, ignore=_NOT_SOURCE)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    built = subprocess.run(
        [*pip, "wheel", str(source), "--no-deps", "--no-build-isolation", "--no-index"]
        + ["-w", str(wheels)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    [wheel] = wheels.glob("stagewright-*.whl")
    done = subprocess.run(
        [*pip, "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    work.mkdir()
    shutil.copy(TINY, work / TINY.name)
    return {"source": source, "wheel": wheel, "site": site, "work": work}


def run_installed(installed: dict[str, Path], *args: str) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in the working folder with the installed copy first on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAGEWRIGHT_")}
    env |= {"PYTHONPATH": str(installed["site"]), "COLUMNS": "200", "PYTHONSAFEPATH": "1"}
    return subprocess.run(
        [sys.executable, *args],
        cwd=installed["work"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_wheel_holds_every_module_and_data_file_of_the_checkout(installed):
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    source = installed["source"]
    expected = {
        str(path.relative_to(source))
        for package in PACKAGES
        for path in (source / package).rglob("*")
        if path.is_file()
    }
    for folder, inside in DATA.items():
        expected |= {
            f"{inside}/{path.relative_to(source / folder)}"
            for path in (source / folder).rglob("*")
            if path.is_file()
        }
    assert sorted(expected - names) == []
    # No new top-level names (a package called `profiles` or `migrations` would clash).
    top = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert top == set(PACKAGES)


def test_the_installed_copy_is_what_runs(installed):
    done = run_installed(installed, "-c", _WHERE)
    assert done.returncode == 0, done.stderr
    where = json.loads(done.stdout)
    site = installed["site"].resolve()
    for path in where["modules"] + where["data"]:
        assert Path(path).resolve().is_relative_to(site), path
    assert [Path(p).resolve() for p in where["data"]] == [
        site / "planner" / "_data" / "profiles",
        site / "api" / "_data" / "migrations",
        site / "api" / "static",
    ]


def test_plan_finds_the_bundled_hardware_profiles(installed):
    done = run_installed(installed, "-m", "cli.main", "plan", TINY.name)
    assert done.returncode == 0, done.stderr
    assert "best candidate" in done.stdout


def test_profiles_load_runs_the_migrations_and_loads_the_bundled_data(installed):
    url = f"sqlite:///{installed['work'] / 'store.db'}"
    done = run_installed(installed, "-m", "cli.main", "profiles", "load", "--database-url", url)
    assert done.returncode == 0, done.stderr
    # e.g. "profiles: 12 created, 0 updated, 0 unchanged; measured runs: 9 added, 0 already
    # stored": hardware.json and the measurement sets were read.
    assert done.stdout.startswith("profiles: "), done.stdout
    assert " 0 created" not in done.stdout and "measured runs: 0 added" not in done.stdout


def test_the_dashboard_is_served_from_the_installed_copy(installed):
    done = run_installed(installed, "-c", _DASHBOARD)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["200", "200", "text/html;", "charset=utf-8", "True"]
