"""The service's modules: curated exports, and the layering (planner knows nothing of it)."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

MODULES = [
    "api.app",
    "api.core.config",
    "api.core.db",
    "api.deps",
    "api.hashing",
    "api.jobs",
    "api.jobs.runner",
    "api.jobs.search",
    "api.jobs.worker",
    "api.http_protocol",
    "api.openapi",
    "api.profile_snapshot",
    "api.state",
    "api.services",
    "api.services.plans",
    "api.services.measurements",
    "api.services.measured_runs",
    "api.services.launches",
    "api.services.timelines",
    "api.services.hardware",
    "api.services.profiles",
    "api.services.simulate",
    "api.services.health",
    "api.store.snapshots",
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
    service's subcommands, and torch only for the executor's."""
    code = (
        "import sys, cli.main\n"
        "names = ('fastapi', 'sqlalchemy', 'uvicorn', 'alembic', 'torch')\n"
        "print(','.join(m for m in names if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


ROUTES = sorted((REPO / "api" / "routes").glob("*.py"))


@pytest.mark.parametrize("path", ROUTES, ids=lambda p: p.name)
def test_routes_only_parse_call_and_answer(path):
    """A route module holds no use case: it does not reach the store or the database, and
    runs no blocking work on the event loop (every route is ``async`` and calls the
    services through ``offload``)."""
    tree = ast.parse(path.read_text())
    imported = {
        node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
    } | {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    assert not {m for m in imported if m.startswith(("api.store", "sqlalchemy", "api.core.db"))}
    sync_routes = [
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        and any("router." in ast.unparse(d) for d in node.decorator_list)
    ]
    assert sync_routes == [], f"{path.name}: {sync_routes} run on FastAPI's thread pool"


def test_problem_documents_are_built_in_one_place():
    """Only api/problems.py writes a problem's fields; everything else asks it."""
    for path in (REPO / "api").rglob("*.py"):
        if path.name == "problems.py":
            continue
        text = path.read_text()
        assert not re.search(r"urn:stagewright:problem:[a-z]", text), path
        assert "problem_body(" not in text, path
