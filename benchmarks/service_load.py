"""Load on the REST service over loopback: requests/s and p50/p99 latency for 1 and 2 server
processes on SQLite and PostgreSQL, plan reads cached and uncached, and /healthz while a
heavy search runs.

For each backend and worker count, `stagewright serve` is started on 127.0.0.1 with a fresh
database (a SQLite file in a temporary folder; a new schema on the PostgreSQL server of
--postgres-url, dropped afterwards) and measured:

- GET /v1/plans/{id}, cached: a done plan read again and again (the server keeps done
  plans' JSON; on PostgreSQL deletions are pushed to it, on SQLite each read checks the
  plan still exists);
- GET /v1/plans/{id}, uncached: the same with STAGEWRIGHT_PLAN_CACHE_MB=0 (each read loads
  and encodes the plan);
- POST /v1/plans, answered from the store: the identical request again (200, cache hit);
- POST /v1/plans, searched: distinct requests, each a new search (Python client);
- GET /healthz, one client, while GPT-3 175B on 1,024 GPUs is refined with CP-SAT.

Plan reads are measured after one uncounted second of the same reads (every server process
up and serving).

The first three use `wrk` (Debian: apt-get install wrk) when it is installed, else a Python
client with keep-alive connections. The load client runs on the same machine as the server
(on a 2-core machine they share the cores); figures are noisy when other work runs.

    .venv/bin/python benchmarks/service_load.py [--backends sqlite,postgresql] \
        [--workers 1,2] [--duration 10] [--connections 8]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

REPO = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"  # loopback only: this is a benchmark, not a load generator for others
TINY = json.loads((REPO / "examples" / "tiny-cpu.json").read_text())
HEAVY = json.loads((REPO / "examples" / "gpt3-175b-1024xa100.json").read_text())
HEAVY["search"] = {**HEAVY["search"], "method": "cpsat", "time_limit_s": 20.0}
PG_URL = os.environ.get(
    "STAGEWRIGHT_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def _database(backend: str, folder: Path, pg_url: str) -> Iterator[str]:
    if backend == "sqlite":
        yield f"sqlite:///{folder / f'load-{uuid.uuid4().hex[:6]}.db'}"
        return
    schema = f"sw_load_{uuid.uuid4().hex[:10]}"
    admin = create_engine(pg_url, connect_args={"connect_timeout": 3})
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        url = make_url(pg_url).update_query_dict({"options": f"-csearch_path={schema}"})
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


@contextmanager
def _server(database_url: str, workers: int, log: Path, env: dict[str, str]) -> Iterator[str]:
    port = _free_port()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("STAGEWRIGHT_")}
    environ.update({"STAGEWRIGHT_ACCESS_LOG": "false", **env})
    command = [sys.executable, "-m", "cli.main", "serve", "--host", HOST, "--port", str(port)]
    command += ["--workers", str(workers), "--database-url", database_url]
    with log.open("ab") as out:
        process = subprocess.Popen(command, cwd=REPO, env=environ, stdout=out, stderr=out)
    url = f"http://{HOST}:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if process.poll() is not None:
                raise SystemExit(f"the server exited:\n{log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"the server did not become ready:\n{log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


def _percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[max(0, min(len(sorted_values) - 1, round(q * len(sorted_values)) - 1))]


def _summary(latencies: list[float], wall: float, statuses: Counter[int]) -> dict[str, Any]:
    latencies.sort()
    return {
        "n": len(latencies),
        "rps": len(latencies) / wall,
        "p50": statistics.median(latencies) * 1e3,
        "p99": _percentile(latencies, 0.99) * 1e3,
        "statuses": dict(sorted(statuses.items())),
    }


_WRK_LATENCY = re.compile(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$", re.M)
_UNIT = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def _wrk(
    url: str, path: str, body: dict[str, Any] | None, connections: int, seconds: int
) -> dict[str, Any]:
    """wrk with ``connections`` keep-alive connections on 2 threads for ``seconds``."""
    command = ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--latency", url + path]
    script = None
    if body is not None:
        script = tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False)
        payload = json.dumps(body).replace("\\", "\\\\").replace("'", "\\'")
        script.write(
            "wrk.method = 'POST'\n"
            f"wrk.body = '{payload}'\n"
            "wrk.headers['Content-Type'] = 'application/json'\n"
        )
        script.close()
        command[1:1] = ["-s", script.name]
    try:
        output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    finally:
        if script is not None:
            os.unlink(script.name)
    latency = {q: float(v) * _UNIT[unit] for q, v, unit in _WRK_LATENCY.findall(output)}
    requests = int(re.search(r"(\d+) requests in", output).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    errors = re.search(r"Socket errors: (.*)", output)
    statuses = {"2xx": requests - (int(bad.group(1)) if bad else 0)}
    if bad:
        statuses["other"] = int(bad.group(1))
    if errors:
        statuses["socket errors: " + errors.group(1)] = 1
    return {
        "n": requests,
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1)),  # type: ignore[union-attr]
        "p50": latency["50"],
        "p99": latency["99"],
        "statuses": statuses,
    }


def _python_load(
    url: str, calls: list[Callable[[httpx.Client], httpx.Response]], connections: int
) -> dict[str, Any]:
    """Each call once, from ``connections`` threads with a keep-alive client each."""
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    lock = threading.Lock()
    pending = list(calls)

    def worker() -> None:
        with httpx.Client(base_url=url, timeout=120) as client:
            while True:
                with lock:
                    if not pending:
                        return
                    call = pending.pop()
                started = time.perf_counter()
                response = call(client)
                elapsed = time.perf_counter() - started
                with lock:
                    latencies.append(elapsed)
                    statuses[response.status_code] += 1

    threads = [threading.Thread(target=worker) for _ in range(connections)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return _summary(latencies, time.perf_counter() - started, statuses)


def _repeat(
    url: str, path: str, body: dict[str, Any] | None, connections: int, seconds: int, use_wrk: bool
) -> dict[str, Any]:
    if use_wrk:
        return _wrk(url, path, body, connections, seconds)
    # Without wrk: a fixed number of requests, about what the Python client sends in time.
    count = 200 * seconds

    def call(client: httpx.Client) -> httpx.Response:
        return client.get(path) if body is None else client.post(path, json=body)

    return _python_load(url, [call] * count, connections)


def _healthz_during_search(url: str) -> dict[str, Any]:
    """GET /healthz from one client, one request after the other, while a heavy search runs
    in the server's search process."""
    submitted = httpx.post(f"{url}/v1/plans?wait_s=0", json=HEAVY, timeout=60)
    assert submitted.status_code in (200, 201, 202), submitted.text
    location = submitted.headers["location"]
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    with httpx.Client(base_url=url, timeout=30) as client:
        deadline = time.monotonic() + 60
        while client.get(location).json()["status"] == "queued" and time.monotonic() < deadline:
            time.sleep(0.05)
        started = time.perf_counter()
        for _ in range(500):
            t0 = time.perf_counter()
            statuses[client.get("/healthz").status_code] += 1
            latencies.append(time.perf_counter() - t0)
        wall = time.perf_counter() - started
        running = client.get(location).json()["status"] == "running"
    summary = _summary(latencies, wall, statuses)
    summary["search_still_running"] = running
    return summary


def _measure(
    backend: str, workers: int, args: argparse.Namespace, folder: Path, use_wrk: bool
) -> list[tuple[str, dict[str, Any]]]:
    rows: list[tuple[str, dict[str, Any]]] = []
    log = folder / f"server-{backend}-{workers}.log"
    for cached in (True, False):
        env = {} if cached else {"STAGEWRIGHT_PLAN_CACHE_MB": "0"}
        with (
            _database(backend, folder, args.postgres_url) as db,
            _server(db, workers, log, env) as url,
        ):
            first = httpx.post(f"{url}/v1/plans?wait_s=30", json=TINY, timeout=120)
            assert first.status_code == 201, first.text
            path = first.headers["location"]
            label = "cached" if cached else "uncached"
            # One second of the same reads first, not counted: readiness is one /healthz
            # answered by one process, and the other may still be starting (imports, its
            # first collection) when the measured run begins.
            _repeat(url, path, None, args.connections, 1, use_wrk)
            rows.append(
                (
                    f"GET /v1/plans/{{id}}, {label}",
                    _repeat(url, path, None, args.connections, args.duration, use_wrk),
                )
            )
            if not cached:
                continue
            rows.append(
                (
                    "POST /v1/plans, from the store",
                    _repeat(url, "/v1/plans", TINY, args.connections, args.duration, use_wrk),
                )
            )
            searched = []
            for k in range(args.searches):
                body = json.loads(json.dumps(TINY))
                body["training"]["global_batch_size"] = 16 + 4 * (k + 1)
                searched.append(
                    lambda client, body=body: client.post("/v1/plans?wait_s=30", json=body)
                )
            rows.append(("POST /v1/plans, searched", _python_load(url, searched, 4)))
            rows.append(("GET /healthz during a 175B search", _healthz_during_search(url)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--workers", default="1,2", help="server process counts")
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk workload")
    parser.add_argument("--connections", type=int, default=8, help="keep-alive connections")
    parser.add_argument("--searches", type=int, default=40, help="distinct searched requests")
    parser.add_argument("--postgres-url", default=PG_URL, help="a schema is made here")
    parser.add_argument("--client", choices=("auto", "wrk", "python"), default="auto")
    args = parser.parse_args()
    if not 1 <= args.duration <= 120 or not 1 <= args.searches <= 500:
        raise SystemExit("--duration 1..120 and --searches 1..500 (a bounded benchmark)")
    use_wrk = args.client == "wrk" or (args.client == "auto" and shutil.which("wrk") is not None)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(backends) - {"sqlite", "postgresql"}
    if unknown:
        raise SystemExit(f"--backends: {sorted(unknown)} unknown; use sqlite and/or postgresql")
    worker_counts = [int(w) for w in args.workers.split(",")]

    print(
        f"{os.cpu_count()} cores shared by server and client; load client: "
        f"{'wrk -t2' if use_wrk else 'Python httpx threads'}, {args.connections} keep-alive "
        f"connections, {args.duration} s per workload; request: tiny-cpu.json; load average "
        f"at start {os.getloadavg()[0]:.1f}\n"
    )
    print("| backend | workers | workload | requests | req/s | p50 (ms) | p99 (ms) | statuses |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="stagewright-load-") as tmp:
        for backend in backends:
            for workers in worker_counts:
                for label, r in _measure(backend, workers, args, Path(tmp), use_wrk):
                    statuses = ", ".join(f"{k}: {v}" for k, v in r["statuses"].items())
                    if r.get("search_still_running") is False:
                        statuses += " (the search ended before the last probe)"
                    print(
                        f"| {backend} | {workers} | {label} | {r['n']} | {r['rps']:.1f} "
                        f"| {r['p50']:.1f} | {r['p99']:.1f} | {statuses} |",
                        flush=True,
                    )
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
