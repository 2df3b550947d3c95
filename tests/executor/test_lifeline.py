"""executor.lifeline on its own, in small processes without torch: a process that called
end_with_parent ends when its parent is killed with SIGKILL, also when it ignores SIGTERM;
one whose parent has already gone stops at once and says why. (test_failures.py checks the
same with torchrun and its ranks.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from executor.lifeline import EXIT_ORPHANED

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's"
)

# The child: ties itself to its parent, then ignores SIGTERM and says its pid.
_CHILD = textwrap.dedent(
    """
    import os, signal, time
    from executor.lifeline import end_with_parent

    end_with_parent()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(os.getpid(), flush=True)
    time.sleep(120)
    """
)
# The parent: starts the child in a session of its own (as torchrun starts a rank) and waits.
_PARENT = textwrap.dedent(
    """
    import subprocess, sys
    subprocess.Popen([sys.executable, "-c", sys.argv[1]], start_new_session=True).wait()
    """
)


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped by whoever adopted it."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_child_ends_when_its_parent_is_killed():
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, _CHILD], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        assert _alive(child)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        killed = time.monotonic()
        while _alive(child) and time.monotonic() - killed < 5:
            time.sleep(0.02)
        assert not _alive(child), "the child outlived its killed parent"
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)
        parent.stdout.close()


def test_a_child_whose_parent_is_already_gone_stops_and_says_so():
    """The parent ended before the call: the kernel would then watch whoever adopted the
    child, so the parent id changing across the call is what tells (here made to change)."""
    orphan = textwrap.dedent(
        """
        import os
        from executor import lifeline

        ids = iter([4242, 1])
        lifeline.os.getppid = lambda: next(ids)
        lifeline.end_with_parent()
        print("still running")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", orphan], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == EXIT_ORPHANED
    assert done.stdout == ""
    assert "torchrun (pid 4242) ended before this rank started" in done.stderr
