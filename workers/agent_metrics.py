"""Prometheus metrics of a worker process (`tunefarm worker --metrics-port N`), in one registry
(`REGISTRY`) served by `start` at http://host:N/metrics. Every series is labelled with the
worker's device key (one per process):

    tunefarm_worker_measurements_total{device_key,invalidity}  counter  candidates measured, by
                                            outcome: rate() is measurements per second, the
                                            invalidity != "ok" series are the failures
    tunefarm_worker_build_seconds{device_key}  histogram  compile time of one candidate (as
                                            the measurer reports it: the parallel build pool's,
                                            or the sandbox's)
    tunefarm_worker_run_seconds{device_key}    histogram  time to measure one candidate on the
                                            board (`Measurer.measure_one`: load, verify, time;
                                            the build too for a measurer that builds inline);
                                            candidates that failed to build or were lost are
                                            left out
    tunefarm_worker_reclaimed_entries_total{device_key}  counter  leased entries another worker
                                            held past the lease (the API reclaimed them for us)
    tunefarm_worker_dead_letters_total{device_key}  counter  entries this worker dead-lettered
                                            (unreadable, or the API rejected their result)

`Metered` wraps the worker's measurer and `MeteredClient` its API client, so the agent's loop
is measured without knowing it.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector

from api.client import Client
from tuner.core.config import Settings
from tuner.core.telemetry import LabelCap, MetricsServer, serve_configured
from tuner.measure import Invalidity, MeasureInput, Measurer, MeasureResult

BUILD_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
RUN_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

# outcomes of candidates the board never ran: no run time
NOT_RUN = (Invalidity.WORKER_LOST, Invalidity.BUILD_ERROR, Invalidity.BUILD_TIMEOUT)

REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)  # process_cpu_seconds_total, process_resident_memory_bytes..

MEASUREMENTS = Counter("tunefarm_worker_measurements", "Candidates this worker measured, by "
                       "device key and invalidity (ok, or why the candidate failed)",
                       ["device_key", "invalidity"], registry=REGISTRY)
BUILD_SECONDS = Histogram("tunefarm_worker_build_seconds", "Compile time of one candidate",
                          ["device_key"], buckets=BUILD_BUCKETS, registry=REGISTRY)
RUN_SECONDS = Histogram("tunefarm_worker_run_seconds", "Time to measure one built candidate "
                        "on the board (load, verify, time)", ["device_key"],
                        buckets=RUN_BUCKETS, registry=REGISTRY)
RECLAIMED = Counter("tunefarm_worker_reclaimed_entries", "Leased entries that another worker "
                    "had held past the lease (reclaimed by the API for this worker)",
                    ["device_key"], registry=REGISTRY)
DEAD_LETTERS = Counter("tunefarm_worker_dead_letters", "Entries this worker dead-lettered "
                       "(unreadable, or the API rejected their result)", ["device_key"],
                       registry=REGISTRY)

_device_key = LabelCap(64)  # one per worker process (tests run several in one)


def device_key_label(device_key: str) -> str:
    """The device key's label value; its series start at 0 (so rate() has a start)."""
    key = _device_key(device_key)
    for inv in Invalidity:
        MEASUREMENTS.labels(key, str(inv))
    BUILD_SECONDS.labels(key)
    RUN_SECONDS.labels(key)
    RECLAIMED.labels(key)
    DEAD_LETTERS.labels(key)
    return key


class Metered(Measurer):
    """A measurer whose every measurement is counted and timed (see the module doc)."""

    def __init__(self, inner: Measurer, device_key: str) -> None:
        self.inner = inner
        self.key = device_key_label(device_key)

    def prepare(self, inputs: list[MeasureInput]) -> None:
        self.inner.prepare(inputs)

    def measure_one(self, inp: MeasureInput) -> MeasureResult:
        t0 = time.perf_counter()
        res = self.inner.measure_one(inp)
        observe(self.key, res, time.perf_counter() - t0)
        return res

    def probe(self) -> bool:
        return self.inner.probe()

    def close(self) -> None:
        self.inner.close()


def observe(key: str, res: MeasureResult, measure_s: float) -> None:
    """One measurement of `res` that took `measure_s` (wall time of `measure_one`)."""
    MEASUREMENTS.labels(key, str(res.invalidity)).inc()
    if res.build_s is not None:
        BUILD_SECONDS.labels(key).observe(res.build_s)
    if res.invalidity not in NOT_RUN:
        RUN_SECONDS.labels(key).observe(measure_s)


class MeteredClient(Client):
    """The worker's API client, counting the entries it leases that were reclaimed from another
    worker, and the entries it dead-letters."""

    def __init__(self, *args: Any, device_key: str, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.key = device_key_label(device_key)

    def lease(self, worker_id: str, *, max_entries: int = 1,
              wait_s: float = 1.0) -> list[dict[str, Any]]:
        entries = super().lease(worker_id, max_entries=max_entries, wait_s=wait_s)
        reclaimed = sum(1 for e in entries if isinstance(e, dict) and _int(e.get("deliveries")) > 1)
        if reclaimed:
            RECLAIMED.labels(self.key).inc(reclaimed)
        return entries

    def dead_letter(self, worker_id: str, entry_ids: list[str], reason: str) -> list[str]:
        dropped = super().dead_letter(worker_id, entry_ids, reason)
        if dropped:
            DEAD_LETTERS.labels(self.key).inc(len(dropped))
        return dropped


def _int(v: Any) -> int:
    try:
        return int(v or 1)
    except (TypeError, ValueError):
        return 1


def start(settings: Settings, port: int | None = None, host: str | None = None) -> \
        MetricsServer | None:
    """Serve the worker's metrics (`tuner.core.telemetry.serve_configured`); None when off."""
    return serve_configured(REGISTRY, settings, port, host)
