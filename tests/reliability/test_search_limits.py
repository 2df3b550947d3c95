"""A search that runs too long, takes too much memory or dies is failed with the reason
and is not retried into a crash loop (issue 16, the 345-byte request that took the server
down 3 times): searches run in search processes with a wall-clock and a memory limit, the
server stays up, and the next search gets a new process.

The misbehaving searches are in ``_searches.py``; the planner's own requests are the tiny
CPU example."""

from __future__ import annotations

import os
import signal
import time

import pytest
from sqlalchemy import select

from api.core.db import Database
from api.store.models import Job
from tests.integration.conftest import assert_problem, example, wait_until

SEARCHES = "tests.reliability._searches"


def _job_of(database_url: str, plan_id: str) -> tuple[str, int]:
    database = Database(database_url)
    try:
        with database.session() as session:
            job = session.scalars(select(Job).where(Job.plan_id == plan_id)).one()
            return job.status, job.attempts
    finally:
        database.dispose()


@pytest.mark.parametrize(
    ("function", "limits", "reason"),
    [
        ("endless", {"job_timeout_s": 2.0}, "took longer than this server's limit of 2 s"),
        ("hoarding", {"job_memory_mb": 1024}, "memory limit of 1,024 MB"),
        ("killed", {}, "killed by signal SIGKILL; it may have run out of memory"),
    ],
)
def test_a_search_over_its_limits_fails_once_with_the_reason(
    make_client, database_url, function, limits, reason
):
    client = make_client(search_function=f"{SEARCHES}:{function}", plan_wait_s=30.0, **limits)
    started = time.monotonic()
    answer = client.post("/v1/plans", json=example("tiny-cpu"))
    problem = assert_problem(answer, 422, reason)
    assert problem["type"].endswith("search-limit-exceeded")
    assert time.monotonic() - started < 25  # the limit stopped it, not the wait
    plan_id = problem["instance"].rsplit("/", 1)[-1]
    assert _job_of(database_url, plan_id) == ("failed", 1)
    # Not put back in the queue: several polls later it is still failed after one attempt.
    time.sleep(1.0)
    assert _job_of(database_url, plan_id) == ("failed", 1)
    assert client.get(f"/v1/plans/{plan_id}").json()["status"] == "failed"
    assert client.get("/healthz").status_code == 200  # the server is up


def test_the_next_search_gets_a_new_process(make_client, database_url):
    """After a search process was killed at its wall-clock limit, a new one takes the next
    search (here the same endless function: it too is stopped, by a process of its own)."""
    client = make_client(search_function=f"{SEARCHES}:endless", plan_wait_s=30.0, job_timeout_s=1.0)
    first = client.post("/v1/plans", json=example("tiny-cpu"))
    assert first.status_code == 422
    request = example("tiny-cpu")
    request["training"]["global_batch_size"] *= 2  # another request: another search
    second = client.post("/v1/plans", json=request)
    assert_problem(second, 422, "took longer than this server's limit of 1 s")
    assert wait_until(lambda: client.get("/healthz").status_code == 200)


def _search_process(client):
    """The search process of the client's only planner thread that is running a search."""
    processes = client.app.state.stagewright.runner._searcher._processes
    assert wait_until(lambda: len(processes) == 1)
    return next(iter(processes.values())).popen


def test_ctrl_c_in_the_servers_terminal_does_not_fail_the_running_search(make_client, database_url):
    """Ctrl-C in the terminal of `stagewright serve` sends SIGINT to every process of the
    foreground group, the search processes too. Each printed a KeyboardInterrupt
    traceback, and a busy one died before the server began to stop: its plan was failed
    for good with "killed by signal SIGINT; it may have run out of memory". The server
    owns its search processes' lifetime: they run in a process group of their own, which
    the terminal's signals do not reach."""
    client = make_client(
        search_function=f"{SEARCHES}:endless", planner_threads=1, job_timeout_s=60.0
    )
    accepted = client.post("/v1/plans", params={"wait_s": 0}, json=example("tiny-cpu"))
    assert accepted.status_code == 202
    plan_id = accepted.json()["id"]
    assert wait_until(lambda: _job_of(database_url, plan_id)[0] == "running")
    process = _search_process(client)
    assert os.getpgid(process.pid) != os.getpgid(0)  # the terminal's SIGINT misses it
    time.sleep(0.5)
    assert process.poll() is None
    assert _job_of(database_url, plan_id) == ("running", 1)


@pytest.mark.parametrize("sent", [signal.SIGTERM, signal.SIGHUP])
def test_a_search_process_stopped_from_outside_is_run_again_not_failed(
    make_client, database_url, sent
):
    """systemd stops a service by sending SIGTERM to each of its processes, the search
    processes included; a hang-up ends them with the terminal. Such a death is an
    interruption, as a crash of the server is: the job runs again (an attempt counted),
    instead of failing with "it may have run out of memory"."""
    client = make_client(
        search_function=f"{SEARCHES}:endless",
        planner_threads=1,
        job_timeout_s=60.0,
        job_lease_s=1.0,
    )
    accepted = client.post("/v1/plans", params={"wait_s": 0}, json=example("tiny-cpu"))
    plan_id = accepted.json()["id"]
    assert wait_until(lambda: _job_of(database_url, plan_id)[0] == "running")
    first = _search_process(client)
    first.send_signal(sent)
    assert wait_until(lambda: _job_of(database_url, plan_id) == ("running", 2), timeout_s=20)
    assert client.get(f"/v1/plans/{plan_id}").json()["status"] == "running"


def test_a_search_process_whose_server_died_ends_quietly():
    """After the server was killed (SIGKILL, the OOM killer), its search process finished
    the search in hand and ended with a BrokenPipeError traceback in the server's log when
    it answered. It ends quietly now: nobody is left to answer."""
    import subprocess
    import sys

    from api.jobs.worker import write_message

    worker = subprocess.Popen(
        [sys.executable, "-m", "api.jobs.worker", f"{SEARCHES}:endless", "1024"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert worker.stdin is not None and worker.stdout is not None
    worker.stdout.close()  # the server is gone: no reader of the answer
    write_message(worker.stdin, {"request": {}, "snapshot": {}})  # answered at once: a bug
    worker.stdin.close()
    assert worker.stderr is not None
    err = worker.stderr.read()
    worker.wait(timeout=60)
    worker.stderr.close()
    assert worker.returncode == 0 and err == b"", err.decode()[-2000:]


def test_a_result_the_full_disk_cannot_hold_is_said_and_the_job_runs_again(
    make_client, database_url, monkeypatch, caplog
):
    """A search whose result could not be written (the database's disk full) ended in a
    traceback "unexpected error outside the search" and, after its lease, ran again the
    same way until it failed for good as "interrupted". The log now says what failed and
    what the operator must check; once there is room, the job's next run stores its plan."""
    import sqlite3

    from sqlalchemy.exc import OperationalError

    from api.store import crud

    real_finish = crud.finish_job
    full = {"disk": True}

    def finish_job(**kwargs):  # type: ignore[no-untyped-def]
        if full["disk"]:
            raise OperationalError(
                "UPDATE jobs ...", {}, sqlite3.OperationalError("database or disk is full")
            )
        return real_finish(**kwargs)

    monkeypatch.setattr(crud, "finish_job", finish_job)
    client = make_client(planner_threads=1, job_lease_s=1.0)
    caplog.set_level("ERROR", logger="stagewright.jobs")
    accepted = client.post("/v1/plans", params={"wait_s": 0}, json=example("tiny-cpu"))
    plan_id = accepted.json()["id"]
    assert wait_until(lambda: "could not store its result" in caplog.text, timeout_s=30)
    assert plan_id in caplog.text and "check the free space" in caplog.text
    assert "Traceback" not in caplog.text and "unexpected error" not in caplog.text
    assert client.get(f"/v1/plans/{plan_id}").json()["status"] in ("queued", "running")
    full["disk"] = False  # the operator made room
    assert wait_until(
        lambda: client.get(f"/v1/plans/{plan_id}").json()["status"] == "done", timeout_s=60
    )


def test_a_bug_that_mentions_space_is_not_taken_for_a_full_disk(make_client, monkeypatch, caplog):
    """The full-disk line is for the database's failures alone: a bug of ours whose message
    happened to hold "space" or "disk" (a namespace, a key) was logged as "could not store
    its result; check the free space" and swallowed, its traceback lost."""
    from api.store import crud

    def finish_job(**kwargs):  # type: ignore[no-untyped-def]
        raise KeyError("the summary has no 'namespace'")

    monkeypatch.setattr(crud, "finish_job", finish_job)
    client = make_client(planner_threads=1, job_lease_s=60.0)
    caplog.set_level("ERROR", logger="stagewright.jobs")
    client.post("/v1/plans", params={"wait_s": 0}, json=example("tiny-cpu"))
    assert wait_until(lambda: "unexpected error" in caplog.text, timeout_s=30)
    assert "could not store its result" not in caplog.text
    assert "Traceback" in caplog.text and "namespace" in caplog.text
