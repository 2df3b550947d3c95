"""Public names: every package lists what it exports, and every listed name exists."""

from __future__ import annotations

import importlib

import pytest

MODULES = [
    "planner.errors",
    "planner.schedules",
    "planner.simulate",
    "planner.specs",
    "planner.profiles",
    "planner.placement",
    "planner.launch",
    "planner.costmodel",
    "planner.costmodel.parameters",
    "planner.measurements",
    "planner.measurement_files",
    "planner.calibrate",
    "planner.search",
    "planner.plan",
    "planner.assemble",
]


@pytest.mark.parametrize("name", MODULES)
def test_all_lists_existing_public_names(name):
    module = importlib.import_module(name)
    exported = module.__all__
    assert exported == sorted(set(exported), key=exported.index)  # no duplicates
    for item in exported:
        assert hasattr(module, item), f"{name}.__all__ names {item}, which is missing"
        assert not item.startswith("_")


def test_planner_imports_nothing_from_the_web_the_database_or_torch():
    """planner/ stays pure: importing all of it pulls in no torch, FastAPI or SQLAlchemy."""
    import subprocess
    import sys

    code = (
        "import sys, planner.search, planner.simulate, planner.launch\n"
        "print(','.join(m for m in ('torch', 'fastapi', 'sqlalchemy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
