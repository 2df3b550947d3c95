"""Where a search runs: in a search process of its own (the service), or inline (tests).

:class:`ProcessSearch` keeps one long-lived ``api.jobs.worker`` process per planner thread
and sends it one search at a time. The search cannot block the server's event loop (it
holds no lock of the server's interpreter), cannot take more than the memory limit
(RLIMIT_AS in the process), and is killed at the wall-clock limit; a process that died or
was killed is replaced for the next search. :class:`InlineSearch` calls a planner function
on the calling thread (what tests inject); it has no limits.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import ValidationError

from api.jobs.worker import read_message, write_message
from api.profile_snapshot import Snapshot
from planner.errors import StagewrightError
from planner.specs import STORED, Plan, PlanRequest

__all__ = [
    "InlineSearch",
    "Planner",
    "ProcessSearch",
    "SearchOutcome",
    "Searcher",
]

log = logging.getLogger("stagewright.jobs")

Planner = Callable[[PlanRequest, Any], Plan]
_POLL_S = 0.25  # how often a waiting thread checks whether the server is stopping
# Signals that stop processes from outside (a service manager stopping every process of
# the service, a closed terminal): an interruption, not something the search did. The
# kernel ends a process over its memory with SIGKILL, never with these.
_STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT})


@dataclass(frozen=True)
class SearchOutcome:
    """How a search ended. ``kind``: 'done' (``plan`` is the Plan's JSON), 'refused' (the
    planner said why the request cannot be planned), 'limit' (over the wall-clock or
    memory limit), 'bug' (anything else; details in the log), 'stopped' (the server is
    stopping; the job goes back to the queue), 'interrupted' (the search process was
    stopped from outside the server, e.g. by a service manager stopping every process:
    the job runs again, as after a crash)."""

    kind: str
    plan: dict[str, Any] | None = None
    detail: str = ""


class Searcher(Protocol):
    def search(
        self, slot: int, request: dict[str, Any], snapshot: Snapshot, stopping: threading.Event
    ) -> SearchOutcome: ...

    def start(self, slots: int) -> None: ...

    def close(self) -> None: ...


class InlineSearch:
    """Runs ``planner(request, store)`` on the calling thread: for tests and embedding."""

    def __init__(self, planner: Planner) -> None:
        self._planner = planner

    def search(
        self, slot: int, request: dict[str, Any], snapshot: Snapshot, stopping: threading.Event
    ) -> SearchOutcome:
        try:
            parsed = PlanRequest.model_validate(request, context={STORED: True})
        except ValidationError as exc:
            return SearchOutcome(
                "refused",
                detail=f"the stored request is not valid for this version of stagewright: "
                f"{exc.errors()[0]['msg']}; submit it again",
            )
        try:
            plan = self._planner(parsed, snapshot.store())
        except StagewrightError as exc:
            return SearchOutcome("refused", detail=str(exc))
        except Exception:
            log.exception("the planner failed")
            return SearchOutcome("bug")
        return SearchOutcome("done", plan=_as_json(plan))

    def start(self, slots: int) -> None:
        return None

    def close(self) -> None:
        return None


def _as_json(plan: Plan) -> dict[str, Any]:
    import json

    data: dict[str, Any] = json.loads(plan.model_dump_json())
    return data


class _Process:
    """One ``api.jobs.worker`` child and its pipes."""

    def __init__(self, function: str, memory_mb: int) -> None:
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "api.jobs.worker", function, str(memory_mb)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            # A process group of its own: Ctrl-C in the server's terminal (SIGINT to its
            # foreground group) stops the server, which stops its search processes itself;
            # reaching them too, it printed their tracebacks and failed a running search
            # as "killed by signal SIGINT; it may have run out of memory".
            process_group=0,
        )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.popen.kill()
        self.popen.wait()
        for stream in (self.popen.stdin, self.popen.stdout):
            if stream is not None:
                stream.close()

    def died(self) -> str:
        code = self.popen.wait()
        if code < 0:
            return f"the search process was killed by signal {signal.Signals(-code).name}"
        return f"the search process exited with status {code}"

    def stopped_from_outside(self) -> bool:
        return -self.popen.wait() in _STOP_SIGNALS


class ProcessSearch:
    """Searches in worker processes, one per planner thread (``slot``), with limits."""

    def __init__(
        self, *, function: str, memory_mb: int, timeout_s: float, at_start: bool = True
    ) -> None:
        self.function = function
        self.memory_mb = memory_mb
        self.timeout_s = timeout_s
        self.at_start = at_start
        self._processes: dict[int, _Process] = {}
        self._lock = threading.Lock()

    def start(self, slots: int) -> None:
        """Start the search processes now (``at_start``), so the first search does not
        wait for one to start."""
        if self.at_start:
            for slot in range(slots):
                self._process(slot)

    def _process(self, slot: int) -> _Process:
        with self._lock:
            process = self._processes.get(slot)
            if process is None or not process.alive():
                process = self._processes[slot] = _Process(self.function, self.memory_mb)
            return process

    def _retire(self, slot: int, process: _Process) -> None:
        process.kill()
        with self._lock:
            if self._processes.get(slot) is process:
                del self._processes[slot]

    def search(
        self, slot: int, request: dict[str, Any], snapshot: Snapshot, stopping: threading.Event
    ) -> SearchOutcome:
        process = self._process(slot)
        assert process.popen.stdin is not None and process.popen.stdout is not None
        try:
            write_message(process.popen.stdin, {"request": request, "snapshot": snapshot.to_json()})
        except (BrokenPipeError, OSError):
            detail = process.died()
            self._retire(slot, process)
            return SearchOutcome("bug", detail=detail)
        deadline = time.monotonic() + self.timeout_s
        stdout = process.popen.stdout
        while True:
            if stopping.is_set():
                self._retire(slot, process)
                return SearchOutcome("stopped")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._retire(slot, process)
                return SearchOutcome(
                    "limit",
                    detail=f"the search took longer than this server's limit of "
                    f"{self.timeout_s:g} s and was stopped; search fewer schedules, "
                    "micro-batch sizes or GPUs, or ask for fewer candidates",
                )
            ready, _, _ = select.select([stdout], [], [], min(_POLL_S, remaining))
            if ready:
                break
        answer = read_message(stdout)
        if answer is None:  # the process died: out of memory killed, or crashed
            detail = process.died()
            self._retire(slot, process)
            if process.stopped_from_outside():
                log.warning("search process %s; the job will run again", detail)
                return SearchOutcome("interrupted", detail=detail)
            log.warning("search process %s", detail)
            return SearchOutcome(
                "limit",
                detail=f"{detail}; it may have run out of memory ({self._memory_hint()})",
            )
        if answer["outcome"] == "memory":
            self._retire(slot, process)
            return SearchOutcome("limit", detail=self._memory_hint())
        if answer["outcome"] == "bug":
            log.error("the planner failed:\n%s", answer.get("traceback", ""))
            return SearchOutcome("bug")
        if answer["outcome"] == "refused":
            return SearchOutcome("refused", detail=str(answer["detail"]))
        return SearchOutcome("done", plan=answer["plan"])

    def _memory_hint(self) -> str:
        return (
            f"the search needed more than this server's memory limit of {self.memory_mb:,} MB "
            "per search; search fewer schedules or GPUs, or ask for fewer candidates"
        )

    def close(self) -> None:
        with self._lock:
            processes = list(self._processes.items())
            self._processes.clear()
        for _, process in processes:
            process.kill()
