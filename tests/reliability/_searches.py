"""Search functions that misbehave, for the search processes of test_search_limits.py
(``tests.reliability._searches:NAME``, imported by ``api.jobs.worker``)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any


def endless(request: Any, store: Any) -> Any:
    """Never answers: the server's wall-clock limit must stop it."""
    time.sleep(3600)


def hoarding(request: Any, store: Any) -> Any:
    """Takes memory until the process's limit refuses more."""
    hoard = []
    while True:
        hoard.append(bytearray(64 * 2**20))  # zero-filled: really taken


def killed(request: Any, store: Any) -> Any:
    """Dies as the kernel's out-of-memory killer would end it."""
    os.kill(os.getpid(), signal.SIGKILL)
