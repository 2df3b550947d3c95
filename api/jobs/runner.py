"""Background searches: a bounded pool of planner threads fed from the ``jobs`` table.

POST /v1/plans stores a queued job and hands its id to this process's pool; the request
then waits a little for the result. Every process also polls the table: it takes back jobs
whose process died (no heartbeat within the lease, or a process id on this host that no
longer runs) and picks up queued jobs while it has idle threads. A job in progress when a
server stops is therefore run again at the next start; a clean shutdown puts its jobs back
in the queue at once, without counting the interrupted run as an attempt; after
``job_max_attempts`` interrupted runs a job fails for good.

Each planner thread (``planner_threads``) hands its search to a search process of its own
(``api.jobs.search``): CPU-bound planning never holds the server's interpreter, and a search
over the wall-clock or memory limit fails with the reason instead of taking the server
down. The search prices with the profile snapshot the plan was admitted on.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from api import problems
from api.core.config import Settings
from api.core.db import Database, is_unavailable, storage_trouble
from api.jobs.search import Searcher, SearchOutcome
from api.metrics import Metrics
from api.store import crud
from api.store.snapshots import find_snapshot

__all__ = ["JobOutcome", "JobRunner", "plan_summary", "worker_name"]

log = logging.getLogger("stagewright.jobs")

_STOP = ""  # queue sentinel: not a job id


@dataclass(frozen=True)
class JobOutcome:
    """How a job this process ran ended: 'done' or 'failed' (the plan row has the rest)."""

    plan_id: str
    status: str


def worker_name() -> str:
    """host:pid:token. The token tells this process from an earlier one with the same pid."""
    return f"{socket.gethostname()[:120]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def dead_workers_on_this_host(workers: list[str], me: str) -> list[str]:
    """Workers that cannot be running: same host, and their pid is gone (or is ours with
    another token, i.e. an earlier life of this process id)."""
    host, pid, _ = me.split(":")
    dead = []
    for worker in workers:
        parts = worker.rsplit(":", 2)
        if len(parts) != 3 or parts[0] != host or worker == me:
            continue
        try:
            other = int(parts[1])
        except ValueError:
            continue
        if other == int(pid) or not _pid_alive(other):
            dead.append(worker)
    return dead


def plan_summary(result: dict[str, Any]) -> dict[str, Any]:
    """What GET /v1/plans lists of a finished plan (without loading the whole result)."""
    best = result.get("best") or {}
    return {"best_config": best.get("config"), "best_predicted": best.get("predicted")}


class JobRunner:
    """N planner threads and one poller thread for this process."""

    def __init__(
        self,
        *,
        database: Database,
        settings: Settings,
        metrics: Metrics,
        searcher: Searcher,
    ) -> None:
        self._db = database
        self._settings = settings
        self._metrics = metrics
        self._searcher = searcher
        self.worker = worker_name()
        self._queue: queue.Queue[str] = queue.Queue()
        self._lock = threading.Lock()
        self._futures: dict[str, Future[JobOutcome | None]] = {}
        self._running: dict[str, str] = {}  # job id -> claim
        self._busy = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []
        self._last_poll_error = 0.0

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._searcher.start(self._settings.planner_threads)
        for i in range(self._settings.planner_threads):
            thread = threading.Thread(
                target=self._work, args=(i,), name=f"stagewright-planner-{i}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        poller = threading.Thread(target=self._poll, name="stagewright-jobs", daemon=True)
        poller.start()
        self._threads.append(poller)

    def stop(self) -> None:
        """Stop taking work and hand running jobs back to the queue. A search in progress is
        stopped (its process killed); threads idle or between database calls end within a
        second. The claims are taken before the threads end: a thread that stops its
        search forgets its claim, and a job finished meanwhile is no longer 'running', so
        releasing it changes nothing."""
        self._stop.set()
        self._wake.set()
        with self._lock:
            claims = list(self._running.values())
        for _ in range(self._settings.planner_threads):
            self._queue.put(_STOP)  # wakes idle workers at once
        deadline = time.monotonic() + 2.0
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if claims:
            try:
                with self._db.session() as session:
                    released = crud.release_jobs(session=session, claims=claims)
                log.info("released %d running job(s) back to the queue", released)
            except Exception as exc:  # the lease will expire instead
                log.warning("could not release running jobs (%s); they resume after the lease", exc)
        with self._lock:
            for future in self._futures.values():
                if not future.done():
                    future.set_result(None)
            self._futures.clear()
        self._searcher.close()

    # -- submitting ------------------------------------------------------------------------

    def submit(self, job_id: str) -> Future[JobOutcome | None]:
        """Queue a job here; the future resolves when this process has run it (None when
        another process took it, or this one is stopping)."""
        with self._lock:
            future = self._futures.get(job_id)
            if future is None:
                future = Future()
                self._futures[job_id] = future
                self._queue.put(job_id)
        return future

    def future(self, job_id: str) -> Future[JobOutcome | None] | None:
        """The future of a job this process has queued or runs, else None."""
        with self._lock:
            return self._futures.get(job_id)

    @property
    def in_progress(self) -> int:
        with self._lock:
            return len(self._running)

    # -- threads ---------------------------------------------------------------------------

    def _work(self, slot: int) -> None:
        while not self._stop.is_set():
            try:
                job_id = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            if job_id == _STOP or self._stop.is_set():
                break
            with self._lock:
                self._busy += 1
            outcome: JobOutcome | None = None
            try:
                outcome = self._run(slot, job_id)
            except Exception as exc:  # a job must never kill its thread
                log.exception("job %s: unexpected error outside the search: %s", job_id, exc)
            finally:
                with self._lock:
                    self._busy -= 1
                    future = self._futures.pop(job_id, None)
                if future is not None and not future.done():
                    future.set_result(outcome)

    def _run(self, slot: int, job_id: str) -> JobOutcome | None:
        if self._stop.is_set():
            return None
        with self._db.session() as session:
            claimed = crud.claim_job(session=session, job_id=job_id, worker=self.worker)
            snapshot = (
                None
                if claimed is None
                else find_snapshot(session=session, gpu=claimed.gpu, revision=claimed.revision)
            )
        if claimed is None:
            return None
        with self._lock:
            self._running[job_id] = claimed.claim
        started = time.perf_counter()
        try:
            result, error = self._search(slot, claimed, snapshot)
            if self._stop.is_set():  # stop() has handed the job back to the queue
                return None
            if result is None and error is None:  # interrupted from outside: run it again
                with self._db.session() as session:
                    _, failed = crud.requeue_interrupted(
                        session=session,
                        claim=claimed.claim,
                        max_attempts=self._settings.job_max_attempts,
                        interrupted=problems.search_interrupted_body,
                    )
                if failed:
                    log.warning(
                        "job %s (plan %s): interrupted %d times, the limit; failed for good",
                        claimed.job_id,
                        claimed.plan_id,
                        self._settings.job_max_attempts,
                    )
                self._wake.set()  # the poller hands it to a thread without waiting
                return None
            with self._db.session() as session:
                stored = crud.finish_job(
                    session=session,
                    claimed=claimed,
                    result=result,
                    summary=None if result is None else plan_summary(result),
                    error=error,
                )
        except Exception as exc:
            if not is_unavailable(exc):
                raise  # a bug: its traceback, even if its message mentions a disk
            # Leave it 'running' without heartbeats: the lease expires and it runs again.
            fix = storage_trouble(exc)
            if fix is not None:  # a full disk is the operator's to mend, not a bug's traceback
                log.error(
                    "job %s (plan %s): could not store its result (%s); %s: the job runs "
                    "again once its lease of %g s expires",
                    job_id,
                    claimed.plan_id,
                    str(exc).splitlines()[0],
                    fix,
                    self._settings.job_lease_s,
                )
                return None
            log.warning("job %s: database unavailable, the job will run again: %s", job_id, exc)
            return None
        finally:
            with self._lock:
                self._running.pop(job_id, None)
        if not stored:
            return None
        status = "done" if error is None else "failed"
        self._metrics.job_finished(status, time.perf_counter() - started)
        return JobOutcome(plan_id=claimed.plan_id, status=status)

    def _search(
        self, slot: int, claimed: crud.Claimed, snapshot: Any
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """The plan's JSON, or the problem to store on the plan instead."""
        instance = f"/v1/plans/{claimed.plan_id}"
        if snapshot is None:
            return None, problems.search_refused_body(
                f"the profiles of revision {claimed.revision} of {claimed.gpu!r} this plan "
                "was admitted on are gone; submit the request again",
                instance,
            )
        outcome: SearchOutcome = self._searcher.search(slot, claimed.request, snapshot, self._stop)
        if outcome.kind == "done" and outcome.plan is not None:
            return {**outcome.plan, "id": claimed.plan_id}, None
        if outcome.kind == "refused":
            return None, problems.search_refused_body(outcome.detail, instance)
        if outcome.kind == "limit":
            log.warning("job %s (plan %s): %s", claimed.job_id, claimed.plan_id, outcome.detail)
            return None, problems.search_over_limit_body(outcome.detail, instance)
        if outcome.kind in ("stopped", "interrupted"):
            # Not stored: stop() has put the job back in the queue, or _run puts it back.
            return None, None
        error_id = uuid.uuid4().hex[:12]
        log.error("job %s (plan %s) failed: error id %s", claimed.job_id, claimed.plan_id, error_id)
        return None, problems.search_bug_body(error_id, instance)

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                self._poll_once()
            except Exception as exc:
                now = time.monotonic()
                if now - self._last_poll_error > 30:  # once per 30 s while the DB is away
                    log.warning("job poller: %s", str(exc).splitlines()[0] if str(exc) else exc)
                    self._last_poll_error = now
            self._wake.wait(self._settings.job_poll_s)
            self._wake.clear()

    def _poll_once(self) -> None:
        with self._lock:
            claims = list(self._running.values())
        with self._db.session() as session:
            crud.heartbeat(session=session, claims=claims)
            dead = dead_workers_on_this_host(crud.running_workers(session=session), self.worker)
            requeued, failed = crud.requeue_orphans(
                session=session,
                lease_s=self._settings.job_lease_s,
                max_attempts=self._settings.job_max_attempts,
                interrupted=problems.search_interrupted_body,
                dead_workers=dead,
            )
            if requeued or failed:
                log.info("took back %d orphaned job(s); %d failed for good", requeued, failed)
            with self._lock:
                idle = self._settings.planner_threads - self._busy - self._queue.qsize()
                mine = list(self._futures)
            if idle <= 0:
                return
            for job_id in crud.queued_job_ids(session=session, limit=idle, exclude=mine):
                self.submit(job_id)
