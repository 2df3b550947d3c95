"""Load on the REST service over loopback: requests/s and p50/p99 latency of plan requests
answered from the store (cached) and searched (uncached), with 2 server processes.

Starts `stagewright serve --workers 2` on 127.0.0.1 and a free port with a fresh database
(a SQLite file in a temporary folder unless --database-url is given), sends a bounded number
of requests from a few client threads, prints a markdown table, and stops the server.

    .venv/bin/python benchmarks/load.py [--requests 300] [--concurrency 8] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"  # loopback only: this is a benchmark, not a load generator for others


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _start(database_url: str, workers: int, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAGEWRIGHT_")}
    env["STAGEWRIGHT_ACCESS_LOG"] = "false"
    command = [sys.executable, "-m", "api.cli", "serve", "--host", HOST, "--port", str(port)]
    command += ["--workers", str(workers), "--database-url", database_url]
    process = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT
    )
    url = f"http://{HOST}:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server exited:\n{log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    process.kill()
    raise SystemExit(f"the server did not become ready:\n{log.read_text()[-2000:]}")


def _run(
    url: str, bodies: list[dict[str, Any]], concurrency: int, method: Callable[..., Any]
) -> dict[str, Any]:
    """Send every body once, from ``concurrency`` threads with a keep-alive client each."""
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    lock = threading.Lock()
    queue = list(enumerate(bodies))

    def worker() -> None:
        with httpx.Client(base_url=url, timeout=120) as client:
            while True:
                with lock:
                    if not queue:
                        return
                    _, body = queue.pop()
                started = time.perf_counter()
                response = method(client, body)
                elapsed = time.perf_counter() - started
                with lock:
                    latencies.append(elapsed)
                    statuses[response.status_code] += 1

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    latencies.sort()
    return {
        "n": len(latencies),
        "rps": len(latencies) / wall,
        "p50": statistics.median(latencies) * 1e3,
        "p99": latencies[max(0, int(round(0.99 * len(latencies))) - 1)] * 1e3,
        "statuses": dict(sorted(statuses.items())),
    }


def _post_plan(client: httpx.Client, body: dict[str, Any]) -> httpx.Response:
    return client.post("/v1/plans", json=body)


def _get(client: httpx.Client, path: str) -> httpx.Response:
    return client.get(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="requests per workload")
    parser.add_argument("--concurrency", type=int, default=8, help="client threads")
    parser.add_argument("--workers", type=int, default=2, help="server processes")
    parser.add_argument("--request", default=str(REPO / "examples" / "tiny-cpu.json"))
    parser.add_argument("--database-url", default=None, help="default: a fresh SQLite file")
    args = parser.parse_args()
    if not 1 <= args.requests <= 5000:
        raise SystemExit("--requests must be between 1 and 5000 (a bounded benchmark)")
    base = json.loads(Path(args.request).read_text())

    with tempfile.TemporaryDirectory(prefix="stagewright-load-") as tmp:
        folder = Path(tmp)
        database_url = args.database_url or f"sqlite:///{folder / 'load.db'}"
        process, url = _start(database_url, args.workers, folder / "server.log")
        try:
            first = httpx.post(f"{url}/v1/plans", json=base, timeout=120)
            assert first.status_code in (200, 201), first.text
            plan_path = first.headers["location"]
            batch = base["training"]["global_batch_size"]
            uncached = []
            for k in range(args.requests):
                body = json.loads(json.dumps(base))
                # Distinct requests (each a new search): batches the request's sizes divide.
                body["training"]["global_batch_size"] = batch + 4 * (k + 1)
                uncached.append(body)
            rows = [
                (
                    "POST /v1/plans, cached",
                    _run(url, [base] * args.requests, args.concurrency, _post_plan),
                ),
                ("POST /v1/plans, uncached", _run(url, uncached, args.concurrency, _post_plan)),
                (
                    "GET /v1/plans/{id}",
                    _run(url, [plan_path] * args.requests, args.concurrency, _get),
                ),
            ]
        finally:
            process.terminate()
            process.wait(timeout=30)

    cpus = os.cpu_count()
    print(
        f"{args.workers} server processes, {args.concurrency} client threads, {cpus} cores, "
        f"loopback; request: {Path(args.request).name} (uncached: global_batch_size varied)\n"
    )
    print("| workload | requests | req/s | p50 (ms) | p99 (ms) | statuses |")
    print("|---|---|---|---|---|---|")
    for label, r in rows:
        statuses = ", ".join(f"{k}: {v}" for k, v in r["statuses"].items())
        print(
            f"| {label} | {r['n']} | {r['rps']:.1f} | {r['p50']:.1f} | {r['p99']:.1f} "
            f"| {statuses} |"
        )


if __name__ == "__main__":
    main()
