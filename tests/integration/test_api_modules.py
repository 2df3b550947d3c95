"""The service's modules: curated exports, and the layering (planner knows nothing of it)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

MODULES = [
    "api.app",
    "api.core.config",
    "api.core.db",
    "api.deps",
    "api.hashing",
    "api.jobs",
    "api.limits",
    "api.metrics",
    "api.problems",
    "api.schemas",
    "api.security",
    "api.service",
    "api.store",
    "api.store.crud",
    "api.store.models",
    "api.store.profiles",
    "api.store.profiles_io",
    "api.routes.plans",
    "api.routes.simulate",
    "api.routes.hardware",
    "api.routes.profiles",
    "api.routes.health",
]


@pytest.mark.parametrize("name", MODULES)
def test_all_lists_existing_public_names(name):
    module = importlib.import_module(name)
    exported = module.__all__
    assert len(exported) == len(set(exported))
    for item in exported:
        assert hasattr(module, item), f"{name}.__all__ names {item}, which is missing"
        assert not item.startswith("_")


def test_the_command_line_loads_no_web_stack_until_serve():
    """`stagewright plan` stays quick: the CLI imports FastAPI and SQLAlchemy only for the
    service's subcommands."""
    code = (
        "import sys, api.cli\n"
        "print(','.join(m for m in ('fastapi', 'sqlalchemy', 'uvicorn') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
