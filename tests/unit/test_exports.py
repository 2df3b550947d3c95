"""Public names: every package lists what it exports, and every listed name exists."""

from __future__ import annotations

import importlib

import pytest

MODULES = [
    "planner.errors",
    "planner.json_input",
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
    "cli",
    "cli.main",
    "cli.extras",
    "cli.executor_commands",
    "cli.measurement_commands",
    "cli.regress_command",
    "cli.regress",
    "cli.render",
    "cli.render_timeline",
    "cli.plots",
    "cli.calibration_report",
    "cli.reference_doc",
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


# Which of the project's packages each package may import: the arrows point down (planner at
# the bottom; cli on top, reaching api and executor only inside the commands that need them).
_MAY_IMPORT = {
    "planner": set(),
    "executor": {"planner"},
    "api": {"planner"},
    "cli": {"planner", "api", "executor"},
}


def _imported_packages(path):
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            yield node.lineno, name.partition(".")[0]


@pytest.mark.parametrize("package", sorted(_MAY_IMPORT))
def test_packages_import_only_the_packages_below_them(package):
    """planner/ never imports api/, cli/ or executor/; api/ and executor/ never import cli/
    nor each other. Every import counts, lazy ones inside functions included."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    files = sorted((root / package).rglob("*.py"))
    assert files
    wrong = [
        f"{path.relative_to(root)}:{line} imports {imported}"
        for path in files
        for line, imported in _imported_packages(path)
        if imported in _MAY_IMPORT and imported not in _MAY_IMPORT[package] | {package}
    ]
    assert wrong == []
