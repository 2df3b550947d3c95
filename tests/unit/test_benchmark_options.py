"""The benchmarks without options answer ``--help`` with what they measure instead of
running (some take minutes), and refuse an argument they do not know rather than ignore it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
WITHOUT_OPTIONS = [
    "cpsat_vs_grid",
    "llama3_405b_published",
    "megatron_fig16",
    "residual_terms",
    "schedules",
    "vshape_table5",
]


def _run(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / f"{name}.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("name", WITHOUT_OPTIONS)
def test_help_prints_the_docstring_and_runs_nothing(name: str) -> None:
    result = _run(name, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: benchmarks/{name}.py [-h]")
    # The docstring's command line is in the help; no table row (every benchmark's output
    # is a markdown table) was printed.
    assert f"python benchmarks/{name}.py" in result.stdout
    assert "|---" not in result.stdout


def test_an_unknown_argument_is_refused_with_usage() -> None:
    result = _run("megatron_fig16", "--batch", "512")
    assert result.returncode == 2
    assert result.stdout == ""
    assert "unrecognized arguments: --batch 512" in result.stderr
