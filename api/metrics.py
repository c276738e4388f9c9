"""Prometheus metrics: request counts and latency by route (a pure ASGI middleware, cheap enough
for the hot GET /v1/best path), jobs by state / records total read from SQL at scrape time, and
the measurement queue's lease reclaims and dead letters, which happen here: the API runs the
queue for the workers (`api.work`).

Each app has its own `CollectorRegistry`, so several apps (tests) can live in one process.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tuner.core.telemetry import LabelCap
from tuner.db import stats
from tuner.db.store import Store

from .asgi import HttpMiddleware

log = logging.getLogger(__name__)

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    def __init__(self, store: Store | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("tunefarm_http_requests_total", "HTTP requests answered",
                                ["method", "route", "status"], registry=self.registry)
        self.latency = Histogram("tunefarm_http_request_duration_seconds",
                                 "Time to answer an HTTP request (to the response start)",
                                 ["method", "route"], buckets=BUCKETS, registry=self.registry)
        self.reclaims = Counter("tunefarm_lease_reclaims", "Measurement entries handed to "
                                "another worker after the worker holding them let the lease "
                                "lapse", ["device_key"], registry=self.registry)
        self.dead_letters = Counter("tunefarm_dead_letters", "Measurement entries moved to the "
                                    "dead-letter stream, by reason: max_deliveries (reclaimed "
                                    "too often), invalid_input (not a valid MeasureInput), "
                                    "worker (the worker gave up on it)",
                                    ["device_key", "reason"], registry=self.registry)
        self.device_key = LabelCap(64)
        self.store = store
        self.registry.register(_SqlCollector(self))

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(method, route, str(status)).inc()
        self.latency.labels(method, route).observe(seconds)

    def reclaimed(self, device_key: str, n: int = 1) -> None:
        self.reclaims.labels(self.device_key(device_key)).inc(n)

    def dead_lettered(self, device_key: str, reason: str, n: int = 1) -> None:
        self.dead_letters.labels(self.device_key(device_key), reason).inc(n)


class _SqlCollector(Collector):
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def describe(self) -> Iterator[Any]:
        return iter(())  # values come from SQL at scrape time only

    def collect(self) -> Iterator[Any]:
        store = self.metrics.store
        if store is None:
            return
        jobs = GaugeMetricFamily("tunefarm_jobs", "Jobs by state", labels=["state"])
        records = GaugeMetricFamily("tunefarm_records", "Measured records stored")
        try:
            counts = stats.counts(store)
        except Exception as exc:  # a scrape must not fail on a database outage
            log.warning("metrics: cannot read SQL: %s", exc)
            return
        for state, n in counts.jobs_by_state.items():
            jobs.add_metric([state], float(n))
        records.add_metric([], float(counts.records))
        yield jobs
        yield records


class MetricsMiddleware(HttpMiddleware):
    """Times each HTTP request to its response start; labels it with the route template
    (`/v1/jobs/{job_id}`), never the raw path, so label cardinality stays bounded."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        super().__init__(app)
        self.metrics = metrics

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = time.perf_counter()
        status = 500
        observed = False

        def observe() -> None:
            nonlocal observed
            if observed:
                return
            observed = True
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            self.metrics.observe(scope["method"], path, status, time.perf_counter() - start)

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                observe()
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            observe()
