"""The ``Dockerfile`` and ``docker-compose.yml`` read against the code (no Docker engine
runs in the tests): the image's dependency stage installs with only what is copied before
it, and every ``STAGEWRIGHT_*`` variable they set is a setting the service reads."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from api.core.config import Settings
from tests.integration.conftest import REPO

DOCKERFILE = REPO / "Dockerfile"
COMPOSE = REPO / "docker-compose.yml"


def _instructions() -> list[tuple[str, str]]:
    """(instruction, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def test_the_images_dependency_stage_installs_without_the_code(tmp_path: Path) -> None:
    """The stage before the code is copied, run as written in a folder holding only what it
    copied, with pip told to install nothing new (everything is in this environment) and
    to fetch nothing. It installed the project from stub packages, but pyproject.toml
    names 20 package folders: setuptools stopped at "package directory 'planner/costmodel'
    does not exist", so `docker build` (and `docker compose up --build`) failed."""
    stage: list[tuple[str, str]] = []
    for word, rest in _instructions():
        if word == "COPY" and rest.split()[0] == "planner":
            break
        stage.append((word, rest))
    context = tmp_path / "app"
    context.mkdir()
    pip = f"{shlex.quote(sys.executable)} -m pip"
    dry = f"{pip} install --dry-run --no-index --no-build-isolation"
    for word, rest in stage:
        if word == "COPY":
            *sources, _ = rest.split()
            for source in sources:
                shutil.copy(REPO / source, context / source)
        elif word == "RUN" and "pip" in rest:
            command = re.sub(r"(?<![/\w])python\b", shlex.quote(sys.executable), rest)
            command = re.sub(r"\bpip uninstall\b[^&]*", "true ", command)
            command = re.sub(r"\bpip install\b", dry, command)
            done = subprocess.run(
                ["bash", "-c", command],
                cwd=context,
                capture_output=True,
                text=True,
                check=False,
                timeout=300,
            )
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]


def test_the_image_and_compose_set_only_settings_that_exist() -> None:
    known = {f"STAGEWRIGHT_{name.upper()}" for name in Settings.model_fields}
    for path in (DOCKERFILE, COMPOSE):
        named = set(re.findall(r"\bSTAGEWRIGHT_[A-Z_]+", path.read_text()))
        assert named and named <= known, (path.name, named - known)
