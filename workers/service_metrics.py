"""Prometheus metrics of a tuner process (`tunefarm tuner --metrics-port N`), in one registry
(`REGISTRY`) served by `start` at http://host:N/metrics:

    tunefarm_tuner_jobs_running                     gauge    a job is running here (0 or 1)
    tunefarm_tuner_jobs_total{state}                counter  jobs that ended here, by final state
    tunefarm_tuner_job_reclaims_total               counter  job wake-ups taken over from a tuner
                                                             that stopped renewing them
    tunefarm_tuner_trials_total{device_key,invalidity}  counter  measurements the farm returned
                                                             to this tuner's search loops
    tunefarm_tuner_trials_lost_total{device_key,reason} counter  trials given up on: dead_letter
                                                             (the farm dead-lettered it), timeout
                                                             (no worker within queue_wait_s),
                                                             abandoned (job cancelled / budget)
    tunefarm_cost_model_fit_seconds{model}          histogram  one cost-model fit: model="job"
                                                             (a job's booster, after each batch)
                                                             or "farm" (the target's model)
    tunefarm_queue_* / tunefarm_job_queue_*         gauges   read from Redis at scrape time
                                                             (`QueueCollector`)

The counters are module-level (one tuner per process); the search reports its fits through
`tuner.search.observe`, which `start` subscribes to.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import redis
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from redis.backoff import NoBackoff
from redis.retry import Retry

from tuner.core.config import Settings
from tuner.core.telemetry import LabelCap, MetricsServer, serve_configured
from tuner.db.rows import JobRow
from tuner.db.tables import JobState
from tuner.measure import Invalidity
from tuner.queue import Keys, streams
from tuner.search import observe

log = logging.getLogger(__name__)

FIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
MAX_DEVICE_KEYS = 64  # label values of device_key, per metric family and process
SCAN_COUNT = 1000  # keys per SCAN step when listing the queues at scrape time
LOST_REASONS = ("dead_letter", "timeout", "abandoned")
FIT_MODELS = ("job", "farm")

REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)  # process_cpu_seconds_total, process_resident_memory_bytes..

JOBS_RUNNING = Gauge("tunefarm_tuner_jobs_running", "Jobs this tuner is running now (0 or 1)",
                     registry=REGISTRY)
JOBS_ENDED = Counter("tunefarm_tuner_jobs", "Jobs that reached a final state on this tuner, by "
                     "state", ["state"], registry=REGISTRY)
JOB_RECLAIMS = Counter("tunefarm_tuner_job_reclaims", "Job wake-up entries this tuner took over "
                       "from a tuner that held them past the job lease (Redis lease reclaims)",
                       registry=REGISTRY)
TRIALS = Counter("tunefarm_tuner_trials", "Measurements the farm returned to this tuner's search "
                 "loops, by device key and invalidity (worker_lost: not measured)",
                 ["device_key", "invalidity"], registry=REGISTRY)
TRIALS_LOST = Counter("tunefarm_tuner_trials_lost", "Trials this tuner gave up waiting for, by "
                      "device key and reason: dead_letter (the farm dead-lettered it), timeout "
                      "(no worker finished it within queue_wait_s), abandoned (job cancelled or "
                      "out of budget)", ["device_key", "reason"], registry=REGISTRY)
FIT_SECONDS = Histogram("tunefarm_cost_model_fit_seconds", "Time of one cost-model fit: "
                        "model=job (a job's own booster, after each batch) or farm (the "
                        "target's farm model)", ["model"], buckets=FIT_BUCKETS,
                        registry=REGISTRY)

_device_key = LabelCap(MAX_DEVICE_KEYS)
for _state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED):
    JOBS_ENDED.labels(str(_state))
for _model in FIT_MODELS:
    FIT_SECONDS.labels(_model)


def device_key_seen(device_key: str) -> str:
    """The device key's label value; its trial counters start at 0 (so rate() has a start)."""
    key = _device_key(device_key)
    for inv in Invalidity:
        TRIALS.labels(key, str(inv))
    for reason in LOST_REASONS:
        TRIALS_LOST.labels(key, reason)
    return key


def trial_measured(device_key: str, invalidity: Invalidity) -> None:
    TRIALS.labels(_device_key(device_key), str(invalidity)).inc()


def trial_lost(device_key: str, reason: str) -> None:
    TRIALS_LOST.labels(_device_key(device_key), reason).inc()


def job_ended(row: JobRow | None) -> JobRow | None:
    """Count a job that `TunerService.run_job` left in a final state; returns `row`."""
    if row is not None and row.state.is_terminal:
        JOBS_ENDED.labels(str(row.state)).inc()
    return row


def _observe_fit(model: str, seconds: float) -> None:
    FIT_SECONDS.labels(model if model in FIT_MODELS else "other").observe(seconds)


# --------------------------------------------------------------------------- Redis, at scrape
def _age_s(entry_id: str | None, now_ms: int) -> float:
    """Age of a stream entry from its id (`<ms>-<seq>`), by the Redis clock; 0 without one."""
    if not entry_id:
        return 0.0
    return max(0.0, (now_ms - int(str(entry_id).split("-", 1)[0])) / 1000.0)


class QueueCollector(Collector):
    """Queue depth and age per device key, read from Redis when scraped:

        tunefarm_queue_depth{device_key}            measurements not yet acknowledged (waiting
                                                    or leased by a worker)
        tunefarm_queue_leased{device_key}           of those, delivered to a worker (pending)
        tunefarm_queue_oldest_age_seconds{device_key}  age of the oldest of them (0: none)
        tunefarm_queue_dead_letters{device_key}     dead-lettered measurements kept (the stream
                                                    is capped near 10,000; 0 before the first)
        tunefarm_job_queue_depth                    job wake-ups not yet acknowledged
        tunefarm_job_queue_oldest_age_seconds       age of the oldest of them
        tunefarm_queue_up                           1 when Redis answered this scrape, else 0

    A scrape never fails on Redis: when it cannot be read, only tunefarm_queue_up (0) is
    answered. Device keys are found by SCAN (at most MAX_DEVICE_KEYS of them)."""

    def __init__(self, r: redis.Redis, keys: Keys) -> None:
        self.r, self.keys = r, keys

    def describe(self) -> Iterator[Any]:
        return iter(())  # values come from Redis at scrape time only

    def collect(self) -> Iterator[Any]:
        up = GaugeMetricFamily("tunefarm_queue_up", "1 when Redis answered the queue reads of "
                               "this scrape, else 0")
        try:
            families = self._read()
        except (redis.RedisError, OSError, ValueError) as exc:
            log.warning("metrics: cannot read the queues from Redis: %s", exc)
            up.add_metric([], 0.0)
            yield up
            return
        up.add_metric([], 1.0)
        yield up
        yield from families

    def _device_keys(self) -> tuple[list[str], list[str]]:
        """Device keys of the measurement streams (`Keys.measure`) and of the dead-letter streams
        (`Keys.dead`), sorted, at most MAX_DEVICE_KEYS of each: one SCAN of the prefix."""
        heads = {kind: f"{self.keys.prefix}{kind}:" for kind in ("measure", "dead")}
        found: dict[str, set[str]] = {kind: set() for kind in heads}
        for name in self.r.scan_iter(match=_glob_escape(self.keys.prefix) + "*",
                                     count=SCAN_COUNT, _type="stream"):
            for kind, head in heads.items():
                if str(name).startswith(head) and len(found[kind]) < MAX_DEVICE_KEYS:
                    found[kind].add(str(name)[len(head):])
        for kind, keys in found.items():
            if len(keys) >= MAX_DEVICE_KEYS:
                log.warning("metrics: %d or more %s queues; only %d are reported", MAX_DEVICE_KEYS,
                            kind, MAX_DEVICE_KEYS)
        return sorted(found["measure"]), sorted(found["dead"])

    def _read(self) -> list[GaugeMetricFamily]:
        r = self.r
        secs, micros = r.time()
        now_ms = int(secs) * 1000 + int(micros) // 1000
        measure, dead_only = self._device_keys()
        # every device key with a queue has a dead-letter count (0 before its first one)
        dead = sorted(set(measure) | set(dead_only))
        pipe = r.pipeline(transaction=False)
        for dk in measure:
            stream = self.keys.measure(dk)
            pipe.xlen(stream)
            pipe.xrange(stream, count=1)
            pipe.xpending(stream, Keys.WORKERS_GROUP)
        for dk in dead:
            pipe.xlen(self.keys.dead(dk))
        pipe.xlen(self.keys.jobs)
        pipe.xrange(self.keys.jobs, count=1)
        replies = pipe.execute(raise_on_error=False)
        for reply in replies:  # NOGROUP: nobody leased from that stream yet (nothing pending)
            if isinstance(reply, Exception) and not str(reply).startswith("NOGROUP"):
                raise reply

        depth = GaugeMetricFamily("tunefarm_queue_depth", "Measurements queued for the workers "
                                  "of a device key and not yet acknowledged (waiting or leased)",
                                  labels=["device_key"])
        leased = GaugeMetricFamily("tunefarm_queue_leased", "Queued measurements delivered to a "
                                   "worker and not yet acknowledged", labels=["device_key"])
        age = GaugeMetricFamily("tunefarm_queue_oldest_age_seconds", "Age of the oldest "
                                "unacknowledged measurement of a device key (0: none)",
                                labels=["device_key"])
        dead_letters = GaugeMetricFamily("tunefarm_queue_dead_letters", "Dead-lettered "
                                         "measurements kept in the dead-letter stream of a device "
                                         "key (capped near 10,000)", labels=["device_key"])
        it = iter(replies)
        for dk in measure:
            n, first, pending = next(it), next(it), next(it)
            depth.add_metric([dk], float(n))
            age.add_metric([dk], _age_s(first[0][0] if first else None, now_ms))
            held = pending.get("pending", 0) if isinstance(pending, dict) else 0
            leased.add_metric([dk], float(held or 0))
        for dk in dead:
            dead_letters.add_metric([dk], float(next(it)))
        jobs_n, jobs_first = next(it), next(it)
        jobs = GaugeMetricFamily("tunefarm_job_queue_depth", "Job wake-up entries not yet "
                                 "acknowledged (queued jobs, and jobs a tuner is running)")
        jobs.add_metric([], float(jobs_n))
        jobs_age = GaugeMetricFamily("tunefarm_job_queue_oldest_age_seconds", "Age of the oldest "
                                     "unacknowledged job wake-up entry (0: none)")
        jobs_age.add_metric([], _age_s(jobs_first[0][0] if jobs_first else None, now_ms))
        return [depth, leased, age, dead_letters, jobs, jobs_age]


def _glob_escape(text: str) -> str:
    """`text` matched literally by a Redis glob pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


# --------------------------------------------------------------------------- the endpoint
_queue_collector: QueueCollector | None = None
_remove_fit_observer = None


def scrape_client(redis_url: str) -> redis.Redis:
    """A Redis client for scrapes: short timeouts and no retries (a scrape answers promptly
    even while Redis is down)."""
    return streams.connect(redis_url, socket_connect_timeout=1, socket_timeout=2,
                           retry=Retry(NoBackoff(), 0), health_check_interval=0)


def install(r: redis.Redis, keys: Keys) -> None:
    """Read the queues of `keys` from `r` at scrape time, and time the cost-model fits of this
    process (idempotent: a second call replaces the first's Redis client and keys)."""
    global _queue_collector, _remove_fit_observer
    if _queue_collector is None:
        _queue_collector = QueueCollector(r, keys)
        REGISTRY.register(_queue_collector)
    else:
        _queue_collector.r, _queue_collector.keys = r, keys
    if _remove_fit_observer is None:
        _remove_fit_observer = observe.on_fit(_observe_fit)


def start(settings: Settings, port: int | None = None, host: str | None = None) -> \
        MetricsServer | None:
    """Serve the tuner's metrics (`tuner.core.telemetry.serve_configured`), its queue gauges read
    from TUNEFARM_REDIS_URL; None when off."""
    if not (settings.metrics_port if port is None else port):
        return None
    install(scrape_client(settings.redis_url), Keys(settings.redis_prefix))
    return serve_configured(REGISTRY, settings, port, host)
