"""benchmarks/profile_vzb.py runs each rank under a cProfile wrapper that dumps the rank's
stats when it ends. stagewright's worker ends every rank with os._exit (no interpreter
teardown), which skips a ``finally``: the stats must still be written, and the rank's exit
status kept. (Without that the benchmark stopped with FileNotFoundError on the first
stagewright rank's stats.)"""

from __future__ import annotations

import pstats
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.helpers import load_benchmark

WRAPPER = load_benchmark("profile_vzb")._WRAPPER


def _run(tmp_path: Path, body: str) -> tuple[int, Path]:
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text(WRAPPER)
    target = tmp_path / "target.py"
    target.write_text("def busy():\n    return sum(i * i for i in range(20000))\n" + body)
    done = subprocess.run(
        [sys.executable, str(wrapper), str(tmp_path / "sw"), str(target)],
        env={"RANK": "1", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    return done.returncode, tmp_path / "sw.rank1.prof"


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ("import os\nbusy()\nos._exit(3)\n", 3),  # as stagewright's worker ends
        ("busy()\n", 0),  # a script that returns, as torch's worker does
    ],
    ids=["os._exit", "return"],
)
def test_the_wrapper_writes_the_ranks_stats_however_it_ends(tmp_path, body, status):
    code, stats_file = _run(tmp_path, body)
    assert code == status
    names = {name for (_, _, name) in pstats.Stats(str(stats_file)).stats}  # type: ignore[attr-defined]
    assert "busy" in names
