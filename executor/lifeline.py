"""A rank ends when the torchrun agent that started it ends, however the agent ended.

torchrun starts each rank in a session of its own and stops its ranks itself when it is asked
to stop (SIGTERM, SIGINT). Killed with SIGKILL (an out-of-memory kill, a scheduler's hard
kill, ``kill -9``) it cannot: its ranks were left running, holding their ports, memory and
devices, and blocking the next job. :func:`end_with_parent` asks Linux to kill this process
when its parent goes. Standard library only: the worker calls it before importing torch, so
that the stretch in which a dying agent goes unnoticed is Python's start-up, not torch's
import as well.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

__all__ = ["EXIT_ORPHANED", "PARENT_DEATH_SIGNAL", "end_quietly_on_stop_signals", "end_with_parent"]

EXIT_ORPHANED = 1  # the run failed: the agent that would collect it is gone
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

# SIGKILL, not SIGTERM. The worker does nothing on SIGTERM that SIGKILL skips (it keeps the
# default action; a checkpoint is written under a ".incomplete" name and renamed last, so a
# killed rank leaves none that looks complete), and nobody reads its output once torchrun is
# gone. SIGTERM can be held up where SIGKILL cannot: a stopped rank (SIGSTOP, a debugger)
# keeps it pending until it is continued, and once anything in the rank installs a Python
# handler for it, the handler runs only when the main thread comes back from the C++ call it
# is in, which for a rank stuck in a gloo or NCCL collective is the collective's timeout.
PARENT_DEATH_SIGNAL = signal.SIGKILL


def end_with_parent() -> None:
    """Make the kernel send :data:`PARENT_DEATH_SIGNAL` to this process when its parent ends;
    when the parent has already ended, say so on stderr and exit with :data:`EXIT_ORPHANED`.

    Linux ties the signal to the thread that started this process, not to its process:
    torchrun starts its ranks from the thread that then waits for them, so the two end
    together. Elsewhere nothing is done: macOS has no parent-death signal (a thread in every
    rank watching its parent would be needed, for a platform torch runs distributed jobs on
    only for development), and Windows ends a process tree only through job objects, which
    torchrun does not use; there a killed torchrun still leaves its ranks running.
    """
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    # prctl is variadic: pass every argument as the unsigned long the kernel reads.
    args = (PARENT_DEATH_SIGNAL, 0, 0, 0)
    if libc.prctl(ctypes.c_int(_PR_SET_PDEATHSIG), *map(ctypes.c_ulong, args)) != 0:
        error = ctypes.get_errno()
        sys.stderr.write(
            f"executor.worker: warning: this rank would outlive a killed torchrun "
            f"(prctl(PR_SET_PDEATHSIG) failed: {os.strerror(error)})\n"
        )
        return
    # The parent may have ended before the call above, which then watches the process that
    # adopted this one: the parent recorded before it is gone if the parent id has changed.
    if os.getppid() != parent:
        sys.stderr.write(
            f"executor.worker: error: torchrun (pid {parent}) ended before this rank "
            "started; nothing would collect its work, so it stops\n"
        )
        sys.stderr.flush()
        os._exit(EXIT_ORPHANED)


def end_quietly_on_stop_signals() -> None:
    """End this process at once, without a word, on SIGINT and SIGTERM: the kernel's default
    action for both, not Python's KeyboardInterrupt (a traceback from every rank on Ctrl-C)
    or a Python handler (which runs only once the main thread is back from the C++ call it is
    in: a collective's timeout for a rank waiting on a peer).

    Nothing is lost that a handler would keep: a checkpoint is written under an
    ".incomplete" name and renamed last, the report only once every rank has finished. Who
    stopped the run says so: torchrun (it sends its ranks the signal it got), the emitted
    launch scripts, ``stagewright run``."""
    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, signal.SIG_DFL)
