"""ARCHITECTURE.md stays current: every room and every module a newcomer reads is named in it,
so that adding one without describing it fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "ARCHITECTURE.md"
ROOMS = ("planner", "cli", "api", "executor", "profiles", "migrations", "tests", "benchmarks")


def _named() -> set[str]:
    """Every `code span` of the document's prose (fenced blocks left out), and each word
    inside one."""
    prose = re.sub(r"^```.*?^```", "", DOC.read_text(encoding="utf-8"), flags=re.S | re.M)
    spans = re.findall(r"`([^`]+)`", prose)
    return set(spans) | {word for span in spans for word in span.split()}


def _public_modules(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.py") if not p.name.startswith("_") and p.is_file())


def _subpackages(folder: Path) -> list[str]:
    return sorted(f"{p.parent.name}/" for p in folder.glob("*/__init__.py"))


def test_every_room_is_named():
    named = _named()
    for room in ROOMS:
        assert (REPO / room).is_dir(), f"{room}/ is gone: update ARCHITECTURE.md"
        assert f"{room}/" in named, f"ARCHITECTURE.md does not describe {room}/"


def test_no_room_is_missing_from_the_list():
    """A new top-level code package is a new room: it belongs in ROOMS and in the document."""
    packages = {p.parent.name for p in REPO.glob("*/__init__.py")}
    assert packages <= set(ROOMS)


@pytest.mark.parametrize(
    "folder",
    ["planner", "planner/costmodel", "planner/launch", "planner/search", "cli", "executor"],
)
def test_every_module_is_named(folder):
    named = _named()
    missing = [m for m in _public_modules(REPO / folder) if m not in named]
    assert missing == [], f"ARCHITECTURE.md does not say what {folder}/{missing} hold"


@pytest.mark.parametrize("folder", ["planner", "api", "tests"])
def test_every_subpackage_is_named(folder):
    named = _named()
    missing = [p for p in _subpackages(REPO / folder) if p not in named]
    assert missing == [], f"ARCHITECTURE.md does not describe {folder}/{missing}"
