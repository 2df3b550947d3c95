"""Prometheus metrics in the text exposition format (version 0.0.4), without a client library.

Counters and histograms are per server process (as with any multi-process Prometheus
target, scrape each process or sum them); job counts by status come from the database at
scrape time and so cover every process.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping

from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["CONTENT_TYPE", "Metrics", "MetricsMiddleware"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_JOB_BUCKETS = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: Mapping[str, str]) -> str:
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs.items()) + "}"


class _Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.total = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.total += 1
        self.sum += value
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1

    def lines(self, name: str, labels: Mapping[str, str]) -> Iterable[str]:
        for bound, count in zip(self.buckets, self.counts, strict=True):
            yield f"{name}_bucket{_labels({**labels, 'le': repr(bound)})} {count}"
        yield f"{name}_bucket{_labels({**labels, 'le': '+Inf'})} {self.total}"
        yield f"{name}_sum{_labels(labels)} {self.sum}"
        yield f"{name}_count{_labels(labels)} {self.total}"


class Metrics:
    """Thread-safe counters and histograms of one process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, str, str], int] = defaultdict(int)
        self._latency: dict[tuple[str, str], _Histogram] = {}
        self._cache: dict[str, int] = {"hit": 0, "miss": 0}
        self._jobs_finished: dict[str, int] = defaultdict(int)
        self._job_seconds = _Histogram(_JOB_BUCKETS)
        self._started = time.time()

    def request(self, method: str, route: str, status: int, seconds: float) -> None:
        with self._lock:
            self._requests[(method, route, str(status))] += 1
            hist = self._latency.get((method, route))
            if hist is None:
                hist = self._latency[(method, route)] = _Histogram(_LATENCY_BUCKETS)
            hist.observe(seconds)

    def cache(self, hit: bool) -> None:
        with self._lock:
            self._cache["hit" if hit else "miss"] += 1

    def job_finished(self, status: str, seconds: float) -> None:
        with self._lock:
            self._jobs_finished[status] += 1
            self._job_seconds.observe(seconds)

    def render(
        self,
        *,
        jobs: Mapping[str, int] | None,
        database_up: bool,
        in_progress: int,
        deletions_heard: bool,
    ) -> str:
        out: list[str] = []

        def family(name: str, kind: str, help_text: str) -> None:
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")

        with self._lock:
            family("stagewright_http_requests_total", "counter", "HTTP requests answered.")
            for (method, route, status), n in sorted(self._requests.items()):
                labels = {"method": method, "route": route, "status": status}
                out.append(f"stagewright_http_requests_total{_labels(labels)} {n}")
            family(
                "stagewright_http_request_duration_seconds",
                "histogram",
                "Time to answer an HTTP request.",
            )
            for (method, route), hist in sorted(self._latency.items()):
                out.extend(
                    hist.lines(
                        "stagewright_http_request_duration_seconds",
                        {"method": method, "route": route},
                    )
                )
            family(
                "stagewright_plan_cache_total",
                "counter",
                "Plan requests answered from the store (hit) or searched (miss).",
            )
            for result, n in sorted(self._cache.items()):
                out.append(f"stagewright_plan_cache_total{_labels({'result': result})} {n}")
            family("stagewright_jobs_finished_total", "counter", "Searches this process ran.")
            for status, n in sorted(self._jobs_finished.items()):
                out.append(f"stagewright_jobs_finished_total{_labels({'status': status})} {n}")
            family("stagewright_job_duration_seconds", "histogram", "Time of one search.")
            out.extend(self._job_seconds.lines("stagewright_job_duration_seconds", {}))
        family("stagewright_jobs_in_progress", "gauge", "Searches running in this process.")
        out.append(f"stagewright_jobs_in_progress {in_progress}")
        family("stagewright_jobs", "gauge", "Jobs in the database by status (all processes).")
        for status, n in sorted((jobs or {}).items()):
            out.append(f"stagewright_jobs{_labels({'status': status})} {n}")
        family("stagewright_database_up", "gauge", "1 if the database answered this scrape.")
        out.append(f"stagewright_database_up {1 if database_up else 0}")
        family(
            "stagewright_plan_deletions_heard",
            "gauge",
            "1 while this process hears plan deletions from PostgreSQL (cached plans are "
            "then served without a database round trip); 0 on SQLite or when not listening.",
        )
        out.append(f"stagewright_plan_deletions_heard {1 if deletions_heard else 0}")
        family("stagewright_start_time_seconds", "gauge", "Unix time this process started.")
        out.append(f"stagewright_start_time_seconds {self._started}")
        return "\n".join(out) + "\n"


# Labels come from closed sets, so no client can grow /metrics: the methods HTTP defines
# (anything else is "other"), the app's route templates (anything else is "unmatched"),
# and the status codes.
_METHODS = frozenset(
    {"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE"}
)


class MetricsMiddleware:
    """Counts every request by method, route template (not the raw path, which would make
    one series per plan id) and status, each from a closed set."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            method = scope["method"] if scope["method"] in _METHODS else "other"
            self.metrics.request(method, _route(scope), status, time.perf_counter() - started)


def _route(scope: Scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    if isinstance(path, str):
        return path
    app = scope.get("app")
    for candidate in getattr(app, "routes", ()):
        match, _ = candidate.matches(scope)
        if match == Match.FULL:
            return str(getattr(candidate, "path", "unmatched"))
    return "unmatched"
