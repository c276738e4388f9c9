"""Metrics from every process, scraped over HTTP from a running farm: `tunefarm serve`, a tuner
(`tunefarm tuner --metrics-port`) and a worker (`tunefarm worker --metrics-port`) tune a small
job; then each process's /metrics answers every tunefarm metric, with counts that match the
trials measured, and the tuner and worker logs are JSON lines carrying the job and trial ids
(TUNEFARM_LOG_FORMAT=json)."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.farm import TARGET, Farm, free_port, running_farm
from tuner.db import Store
from tuner.measure import Invalidity

pytestmark = pytest.mark.slow

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

# family -> the samples it must answer (each metric of the tuner and the worker)
TUNER_METRICS = {
    "tunefarm_queue_up": "gauge", "tunefarm_queue_depth": "gauge",
    "tunefarm_queue_leased": "gauge", "tunefarm_queue_oldest_age_seconds": "gauge",
    "tunefarm_queue_dead_letters": "gauge", "tunefarm_job_queue_depth": "gauge",
    "tunefarm_job_queue_oldest_age_seconds": "gauge", "tunefarm_tuner_jobs_running": "gauge",
    "tunefarm_tuner_jobs": "counter", "tunefarm_tuner_job_reclaims": "counter",
    "tunefarm_tuner_trials": "counter", "tunefarm_tuner_trials_lost": "counter",
    "tunefarm_cost_model_fit_seconds": "histogram",
}
WORKER_METRICS = {
    "tunefarm_worker_measurements": "counter", "tunefarm_worker_build_seconds": "histogram",
    "tunefarm_worker_run_seconds": "histogram", "tunefarm_worker_reclaimed_entries": "counter",
    "tunefarm_worker_dead_letters": "counter",
}


def scrape(url: str) -> tuple[dict[str, str], Samples]:
    """({family: type}, {(sample, labels): value}) of a /metrics answer."""
    resp = httpx.get(url, timeout=10)
    assert resp.status_code == 200, resp.text
    types, samples = {}, {}
    for fam in text_string_to_metric_families(resp.text):
        types[fam.name] = fam.type
        assert not [s.name for s in fam.samples if s.name.endswith("_created")], fam.name
        for s in fam.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return types, samples


def get(samples: Samples, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    assert key in samples, f"no sample {name}{labels}"
    return samples[key]


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name` over the series whose labels include `labels`."""
    return sum(v for (n, lab), v in samples.items()
               if n == name and set(labels.items()) <= set(lab))


def json_lines(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):  # build processes may print plain lines of their own
            out.append(json.loads(line))
    return out


@pytest.fixture
def farm(pg_url: str, private_redis_url: str, tmp_path: Path) -> Any:
    with running_farm(pg_url, private_redis_url, tmp_path) as f:
        yield f


def test_every_process_serves_its_metrics(farm: Farm, pg_url: str, tmp_path: Path) -> None:
    tuner_port, worker_port = free_port(), free_port()
    farm.start("tuner", "tuner", "--metrics-port", str(tuner_port), TUNEFARM_LOG_FORMAT="json")
    farm.start_worker("w1", "--metrics-port", str(worker_port), TUNEFARM_LOG_FORMAT="json")
    tuner_url = f"http://127.0.0.1:{tuner_port}/metrics"
    worker_url = f"http://127.0.0.1:{worker_port}/metrics"
    client = farm.client()
    job = client.submit_job({"workload": {"op": "matmul", "shape": [64, 64, 64]},
                             "target": TARGET, "device_key": "e2e", "trials": 8})
    deadline = time.monotonic() + 90
    tuner: Samples = {}
    while time.monotonic() < deadline:  # the tuner counts the job once run_job returns
        state = client.get_job(job["id"])["state"]
        assert state not in ("FAILED", "CANCELLED"), farm.logs()
        if state == "SUCCEEDED":
            tuner_types, tuner = scrape(tuner_url)
            # the job's wake-up entry is acknowledged after its end is committed (at least
            # once): a scrape right after SUCCEEDED may still count it
            if get(tuner, "tunefarm_tuner_jobs_total", state="SUCCEEDED") == 1 \
                    and get(tuner, "tunefarm_job_queue_depth") == 0:
                break
        time.sleep(0.5)
    else:
        raise AssertionError(f"job {job['id']} did not finish in 90 s\n{farm.logs()}")
    store_after = Store(pg_url)
    recs = store_after.records(job_id=job["id"])
    assert len(recs) == 8 and all(r.invalidity is Invalidity.OK for r in recs), \
        [r.error_msg for r in recs]
    by_invalidity = Counter(str(r.invalidity) for r in recs)
    # a new best is measured again (its confirmation, a record outside the job's trials)
    confirmations = [c for r in recs if (c := store_after.record(f"{r.trial_id}-confirm"))]
    measured = by_invalidity + Counter(str(c.invalidity) for c in confirmations)

    # the tuner: every metric, queue gauges for the job's device key, trials and fits counted
    for name, kind in TUNER_METRICS.items():
        assert tuner_types.get(name) == kind, (name, tuner_types.get(name))
    assert get(tuner, "tunefarm_queue_up") == 1
    assert get(tuner, "tunefarm_queue_depth", device_key="e2e") == 0  # all acknowledged
    assert get(tuner, "tunefarm_queue_leased", device_key="e2e") == 0
    assert get(tuner, "tunefarm_queue_oldest_age_seconds", device_key="e2e") == 0
    assert get(tuner, "tunefarm_queue_dead_letters", device_key="e2e") == 0
    assert get(tuner, "tunefarm_job_queue_depth") == 0
    assert get(tuner, "tunefarm_tuner_jobs_running") == 0
    assert get(tuner, "tunefarm_tuner_job_reclaims_total") == 0
    for inv in Invalidity:
        assert get(tuner, "tunefarm_tuner_trials_total", device_key="e2e",
                   invalidity=str(inv)) == by_invalidity.get(str(inv), 0)
    assert total(tuner, "tunefarm_tuner_trials_lost_total", device_key="e2e") == 0
    assert get(tuner, "tunefarm_cost_model_fit_seconds_count", model="job") > 0
    assert get(tuner, "tunefarm_cost_model_fit_seconds_sum", model="job") > 0

    # the worker: one measurement, one build and one run per trial
    worker_types, worker = scrape(worker_url)
    for name, kind in WORKER_METRICS.items():
        assert worker_types.get(name) == kind, (name, worker_types.get(name))
    for inv in Invalidity:
        assert get(worker, "tunefarm_worker_measurements_total", device_key="e2e",
                   invalidity=str(inv)) == measured.get(str(inv), 0)
    n = 8 + len(confirmations)
    assert get(worker, "tunefarm_worker_build_seconds_count", device_key="e2e") == n
    assert get(worker, "tunefarm_worker_run_seconds_count", device_key="e2e") == n
    assert get(worker, "tunefarm_worker_build_seconds_sum", device_key="e2e") > 0
    assert get(worker, "tunefarm_worker_run_seconds_sum", device_key="e2e") > 0
    assert get(worker, "tunefarm_worker_reclaimed_entries_total", device_key="e2e") == 0
    assert get(worker, "tunefarm_worker_dead_letters_total", device_key="e2e") == 0

    # the API: requests, and jobs and records read from SQL
    api_types, api = scrape(f"{farm.api_url}/metrics")
    assert api_types["tunefarm_http_requests"] == "counter"
    assert api_types["tunefarm_http_request_duration_seconds"] == "histogram"
    assert get(api, "tunefarm_jobs", state="SUCCEEDED") == 1
    assert get(api, "tunefarm_records") == n
    assert total(api, "tunefarm_http_requests_total", route="/v1/workers/{worker_id}/results",
                 status="200") == n
    store_after.close()

    # JSON logs: the tuner's lines of the job carry its id, the worker's of a trial both ids
    tuner_logs = json_lines(tmp_path / "tuner.log")
    assert tuner_logs and all({"ts", "level", "logger", "message"} <= set(x) for x in tuner_logs)
    assert any(x.get("job_id") == job["id"] and "runs job" in x["message"] for x in tuner_logs)
    trials = {r.trial_id for r in recs}
    measured = [x for x in json_lines(tmp_path / "w1.log") if x.get("trial_id") in trials]
    assert {x["trial_id"] for x in measured} == trials, farm.log("w1")
    assert all(x.get("job_id") == job["id"] for x in measured)
