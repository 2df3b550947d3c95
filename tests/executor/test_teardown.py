"""How a rank leaves: ``_leave_together`` frees every process group while the interpreter is
still whole, so no gloo thread is left running into Python's finalization (where their
teardown made a rank abort with exit -6, rarely, after the report was written).

Each case runs in a fresh interpreter, as a rank does: what a process has imported before
its process group exists decides what keeps that group alive. One rank, gloo, a file store;
the gloo threads are counted by the names torch gives them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the executor tests need torch (make test installs it)")
pytestmark = pytest.mark.skipif(
    not Path("/proc/self/task").is_dir(), reason="counts threads through /proc (Linux)"
)

# As in a run: the worker module is imported first, then the group is made, then the
# optimizer (torch.optim imports torch._dynamo, which imports torch.distributed.nn, whose
# functions take the default group as a default argument), and a subgroup is held by objects
# in a reference cycle, as Comm's and StageWeights' groups are held through RankRunner.
_RANK = textwrap.dedent(
    """
    import json, os, sys
    from executor.worker import _leave_together
    import torch
    import torch.distributed as dist

    def gloo_threads():
        names = []
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        return sorted(n for n in names if "gloo" in n)

    dist.init_process_group("gloo", init_method=sys.argv[1], rank=0, world_size=1)
    torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1)

    class Holder:
        pass

    holder = Holder()
    holder.group = dist.new_group([0])
    holder.me = holder
    x = torch.ones(4)
    dist.all_reduce(x, group=holder.group)
    kept = holder.group if sys.argv[2] == "keep" else None
    del holder
    before = gloo_threads()
    _leave_together(0, 1, 30.0)
    print(json.dumps({"before": before, "after": gloo_threads()}), flush=True)
    os._exit(0)  # as the worker ends: a kept group's threads never meet the finalization
    """
)


def _leave(tmp_path: Path, mode: str) -> dict[str, object]:
    store = tmp_path / f"store-{mode}"
    done = subprocess.run(
        [sys.executable, "-c", _RANK, f"file://{store}", mode],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_leaving_joins_every_gloo_thread_before_the_interpreter_ends(tmp_path):
    result = _leave(tmp_path, "drop")
    assert "pt_gloo_runloop" in result["before"]  # the groups did run threads of their own
    assert result["after"] == []


def test_a_group_still_referenced_keeps_its_threads_until_the_process_ends(tmp_path):
    # Why the worker ends with os._exit: these threads would otherwise be torn down in the
    # interpreter's finalization. The rank still leaves (the store meetings do not hang).
    result = _leave(tmp_path, "keep")
    assert "pt_gloo_runloop" in result["after"]
