"""The tuner's metrics (workers/service_metrics.py) and the metrics endpoint
(tuner/core/telemetry.py):
the queue gauges read from real Redis at scrape time (and a scrape that still answers while
Redis is down), the trial counters of the farm measurer, the cost-model fit histogram, and the
endpoint's paths and token."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import kill_group, start_private_redis
from tests.support.fakefarm import FakeWorker, make_inputs, make_job
from tuner.core.errors import TunefarmError
from tuner.core.telemetry import serve_metrics
from tuner.db import Store
from tuner.measure import Invalidity
from tuner.measure.remote import RemoteMeasurer
from tuner.queue import Keys, streams
from workers import service_metrics as metrics

pytestmark = pytest.mark.timeout(60)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} of a Prometheus text exposition."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(text_or_samples: Any, name: str, **labels: str) -> float | None:
    got = samples(text_or_samples) if isinstance(text_or_samples, str) else text_or_samples
    return got.get((name, tuple(sorted(labels.items()))))


def _scrape(collector: Any) -> str:
    reg = CollectorRegistry()
    reg.register(collector)
    return generate_latest(reg).decode()


def _now_ms(r: redis.Redis) -> int:
    secs, micros = r.time()  # type: ignore[misc]
    return int(secs) * 1000 + int(micros) // 1000


def test_queue_gauges_are_read_from_redis_at_scrape_time(r: redis.Redis, keys: Keys) -> None:
    stream = keys.measure("dk")
    streams.ensure_group(r, stream, Keys.WORKERS_GROUP)
    old = _now_ms(r) - 5000  # the oldest entry was enqueued 5 s ago (by its id)
    r.xadd(stream, {"input": "a"}, id=f"{old}-0")
    streams.enqueue(r, stream, {"input": "b"})
    streams.enqueue(r, stream, {"input": "c"})
    assert len(streams.read_new(r, stream, Keys.WORKERS_GROUP, "w1", count=1)) == 1
    streams.enqueue(r, keys.measure("nogroup"), {"input": "d"})  # nobody leased from it yet
    for i in range(2):
        r.xadd(keys.dead("dk"), {"input": str(i), "reason": "poison"})
    streams.enqueue(r, keys.jobs, {"job_id": "j1"})
    r.set(f"{keys.prefix}measure:not-a-stream", "x")  # a key of another type is not a queue

    got = samples(_scrape(metrics.QueueCollector(r, keys)))
    assert value(got, "tunefarm_queue_up") == 1
    assert value(got, "tunefarm_queue_depth", device_key="dk") == 3
    assert value(got, "tunefarm_queue_leased", device_key="dk") == 1
    age = value(got, "tunefarm_queue_oldest_age_seconds", device_key="dk")
    assert age is not None and 4.5 <= age < 60
    assert value(got, "tunefarm_queue_depth", device_key="nogroup") == 1
    assert value(got, "tunefarm_queue_leased", device_key="nogroup") == 0
    assert value(got, "tunefarm_queue_dead_letters", device_key="dk") == 2
    assert value(got, "tunefarm_queue_dead_letters", device_key="nogroup") == 0
    assert value(got, "tunefarm_job_queue_depth") == 1
    jobs_age = value(got, "tunefarm_job_queue_oldest_age_seconds")
    assert jobs_age is not None and 0 <= jobs_age < 60
    assert value(got, "tunefarm_queue_depth", device_key="not-a-stream") is None

    r.delete(stream)  # drained: an empty stream answers 0, not a stale age
    streams.ensure_group(r, stream, Keys.WORKERS_GROUP)
    got = samples(_scrape(metrics.QueueCollector(r, keys)))
    assert value(got, "tunefarm_queue_depth", device_key="dk") == 0
    assert value(got, "tunefarm_queue_oldest_age_seconds", device_key="dk") == 0


@pytest.fixture
def doomed_redis(tmp_path: Path) -> Iterator[tuple[Any, str]]:
    proc, url = start_private_redis(tmp_path)
    try:
        yield proc, url
    finally:
        kill_group(proc)


def test_a_scrape_answers_while_redis_is_down(doomed_redis: tuple[Any, str]) -> None:
    proc, url = doomed_redis
    keys = Keys("scrape-test:")
    client = metrics.scrape_client(url)
    streams.enqueue(client, keys.measure("dk"), {"input": "x"})
    reg = CollectorRegistry()
    reg.register(metrics.QueueCollector(client, keys))
    server = serve_metrics(reg, "127.0.0.1", 0)
    try:
        up = httpx.get(server.url, timeout=10)
        assert up.status_code == 200
        assert value(up.text, "tunefarm_queue_up") == 1
        assert value(up.text, "tunefarm_queue_depth", device_key="dk") == 1
        kill_group(proc)  # Redis goes away
        t0 = time.monotonic()
        down = httpx.get(server.url, timeout=10)
        assert down.status_code == 200, down.text
        assert time.monotonic() - t0 < 5
        assert value(down.text, "tunefarm_queue_up") == 0
        assert "tunefarm_queue_depth" not in down.text  # no stale values
    finally:
        server.close()
        client.close()


def test_the_endpoint_serves_only_metrics_and_checks_its_token() -> None:
    reg = CollectorRegistry()
    server = serve_metrics(reg, "127.0.0.1", 0, token="s3cret")
    base = f"http://127.0.0.1:{server.port}"
    try:
        assert httpx.get(base + "/").status_code == 404
        assert httpx.get(base + "/metrics").status_code == 401
        assert httpx.get(base + "/metrics",
                         headers={"Authorization": "Bearer nope"}).status_code == 401
        ok = httpx.get(base + "/metrics", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and ok.headers["content-type"].startswith("text/plain")
    finally:
        server.close()
    busy = serve_metrics(reg, "127.0.0.1", 0)
    try:  # a port in use is an error naming it, not a silent process without metrics
        with pytest.raises(TunefarmError, match=f"cannot serve metrics on 127.0.0.1:{busy.port}"):
            serve_metrics(reg, "127.0.0.1", busy.port)
    finally:
        busy.close()


def _count(name: str, **labels: str) -> float:
    return value(generate_latest(metrics.REGISTRY).decode(), name, **labels) or 0.0


def test_the_farm_measurer_counts_trials_and_losses(r: redis.Redis, keys: Keys, store: Store,
                                                    redis_url: str) -> None:
    a, b, c = make_inputs(make_job(store), 3)
    ok0 = _count("tunefarm_tuner_trials_total", device_key="dev", invalidity="ok")
    dead0 = _count("tunefarm_tuner_trials_lost_total", device_key="dev", reason="dead_letter")
    m = RemoteMeasurer(r, keys, "dev", store=store, queue_wait_s=20.0, lease_s=1.0, poll_s=0.05,
                       counters=metrics)
    assert value(generate_latest(metrics.REGISTRY).decode(), "tunefarm_tuner_trials_total",
                 device_key="dev", invalidity="run_error") is not None  # present from the start
    m.prepare([a, b])
    with FakeWorker(redis_url, keys, store,
                    behaviour=lambda i: "dead" if i.trial_id == a.trial_id else None):
        assert m.measure_one(a).invalidity is Invalidity.WORKER_LOST
        assert m.measure_one(b).ok
    assert _count("tunefarm_tuner_trials_total", device_key="dev", invalidity="ok") == ok0 + 1
    assert _count("tunefarm_tuner_trials_lost_total", device_key="dev",
                  reason="dead_letter") == dead0 + 1
    timeouts0 = _count("tunefarm_tuner_trials_lost_total", device_key="dev", reason="timeout")
    quick = RemoteMeasurer(r, keys, "dev", store=store, queue_wait_s=0.2, lease_s=1.0,
                           poll_s=0.05, counters=metrics)
    assert quick.measure_one(c).invalidity is Invalidity.WORKER_LOST  # nobody measures it
    assert _count("tunefarm_tuner_trials_lost_total", device_key="dev",
                  reason="timeout") == timeouts0 + 1


def test_cost_model_fits_are_timed(r: redis.Redis, keys: Keys) -> None:
    from tuner.search.costmodel import FEATURE_DIM, XGBCostModel

    metrics.install(r, keys)
    before = _count("tunefarm_cost_model_fit_seconds_count", model="job")
    model = XGBCostModel(seed=0, num_rounds=5)
    rng = np.random.default_rng(0)
    model.add(rng.random((12, FEATURE_DIM)), [float(x) for x in rng.random(12) + 0.1], group=1)
    model.fit()
    assert _count("tunefarm_cost_model_fit_seconds_count", model="job") == before + 1
    assert _count("tunefarm_cost_model_fit_seconds_sum", model="job") > 0
