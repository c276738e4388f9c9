"""End to end, as a farm runs: `tunefarm serve`, a tuner process and two worker processes on a
private redis-server and PostgreSQL. A job submitted over REST is tuned, its records land in SQL,
`GET /v1/best` returns the best trace, and that trace replays in TVM to the measured kernel."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.e2e.farm import TARGET, Farm, running_farm
from tuner.db import Store
from tuner.measure import Invalidity

pytestmark = pytest.mark.slow


@pytest.fixture
def farm(pg_url: str, private_redis_url: str, tmp_path: Path) -> Iterator[Farm]:
    with running_farm(pg_url, private_redis_url, tmp_path) as f:
        yield f


def _wait_terminal(client: Any, job_id: str, timeout: float, farm: Farm) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get_job(job_id)
        if job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
            return job
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} did not finish in {timeout} s\n{farm.logs()}")


def test_job_over_rest_is_tuned_by_two_workers_and_best_replays(farm: Farm, pg_url: str) -> None:
    from tuner.core import tvm_api as tv
    from tuner.workloads import parse_spec

    farm.start_tuner()
    farm.start_worker("w1")
    farm.start_worker("w2")
    client = farm.client()
    spec = {"op": "matmul", "shape": [64, 64, 64]}
    job = client.submit_job({"workload": spec, "target": TARGET, "device_key": "e2e",
                             "trials": 8, "batch_size": 4})
    assert job["state"] == "QUEUED" and job["trials"] == 8

    # follow the live events; reconnecting with the last id misses nothing
    first: list[tuple[str, str, dict[str, Any]]] = []
    for ev in client.events(job["id"]):
        first.append(ev)
        if len(first) == 3 or (ev[1] == "state" and ev[2]["state"] in ("SUCCEEDED", "FAILED")):
            break
    rest = list(client.events(job["id"], last_event_id=first[-1][0]))
    replay = list(client.events(job["id"]))
    assert [e[0] for e in first + rest] == [e[0] for e in replay], "an event was lost or repeated"
    assert replay[-1][1] == "state" and replay[-1][2]["state"] == "SUCCEEDED", farm.logs()

    final = _wait_terminal(client, job["id"], 30, farm)
    assert final["state"] == "SUCCEEDED" and final["trials_done"] == 8, final
    store = Store(pg_url)
    recs = store.records(job_id=job["id"])
    assert len(recs) == 8 and len({r.trial_id for r in recs}) == 8
    assert len({r.cand_hash for r in recs}) == 8  # no candidate measured twice
    assert all(r.invalidity is Invalidity.OK for r in recs), [r.error_msg for r in recs]
    workers = {w["id"]: w for w in farm.client(farm.admin_token).list_workers()}
    assert len(workers) == 2 and {r.worker for r in recs} <= set(workers) | {
        r.worker for r in recs if r.worker and not r.worker.startswith("w")}

    best = client.best(json.dumps(spec), json.dumps(TARGET), "e2e")
    # served: the fastest record a second measurement confirmed, at the slower of the two
    confirmed = [r for r in recs if r.trust == "confirmed"]
    assert confirmed and all(store.record(f"{r.trial_id}-confirm") for r in confirmed)
    for r in confirmed:  # measured again by the other live worker
        again = store.record(f"{r.trial_id}-confirm")
        assert again is not None and again.worker != r.worker, (r.worker, again.worker)
    fastest = min(confirmed, key=lambda r: r.served_s or 1e9)
    assert best["trial_id"] == fastest.trial_id and best["latency_s"] == fastest.served_s
    assert fastest.served_s == max(fastest.median_s or 0,  # type: ignore[union-attr]
                                   store.record(f"{fastest.trial_id}-confirm").median_s or 0)
    # the trace replays in TVM to exactly the measured kernel, and that kernel is correct
    wl = parse_spec(spec)
    sch = tv.apply_trace(wl.mod(), json.dumps(best["trace"]))
    assert f"{tv.structural_hash(sch.mod):016x}" == fastest.cand_hash
    lib = tv.compile_module(sch.mod, tv.make_target(TARGET))
    inputs = wl.make_inputs(seed=0)
    outputs = [np.zeros(shape, dtype) for _, shape, dtype in wl.arg_specs()[wl.num_inputs:]]
    dev = tv.tvm.cpu()
    bufs = [tv.tvm.runtime.tensor(a, dev) for a in inputs + outputs]
    lib(*bufs)
    rtol, atol = wl.tolerance()
    for got, want in zip(bufs[len(inputs):], wl.reference(inputs), strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=rtol, atol=atol)
    store.close()


def test_cancel_stops_a_running_job(farm: Farm, pg_url: str) -> None:
    farm.start_tuner()
    farm.start_worker("w1")
    client = farm.client()
    job = client.submit_job({"workload": {"op": "matmul", "shape": [64, 64, 64]}, "target": TARGET,
                             "device_key": "e2e", "trials": 400, "batch_size": 4})
    for _id, kind, data in client.events(job["id"]):
        if kind == "record" or (kind == "progress" and data.get("done", 0) >= 1):
            break
    assert client.cancel_job(job["id"])["state"] in ("CANCELLING", "CANCELLED")
    assert client.cancel_job(job["id"])["state"] in ("CANCELLING", "CANCELLED")  # idempotent
    final = _wait_terminal(client, job["id"], 60, farm)
    assert final["state"] == "CANCELLED" and final["trials_done"] < 400, final


def _cli(farm: Farm, *args: str) -> Any:
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "tuner", *args],
                          env={**farm.env, "TUNEFARM_TOKEN": farm.user_token, "COLUMNS": "200"},
                          capture_output=True, text=True, timeout=120, check=False)


def test_service_jobs_from_the_cli_submit_list_cancel_follow(farm: Farm) -> None:
    """`submit --no-follow` prints the id alone; `jobs`, `cancel` and `follow` work on it (no
    tuner runs: the job waits, queued, until it is cancelled)."""
    sub = _cli(farm, "submit", "matmul", "--shape", "64,64,64", "--trials", "8",
               "--device-key", "e2e", "--target", json.dumps(TARGET), "--no-follow")
    assert sub.returncode == 0, sub.stderr
    (job_id,) = sub.stdout.split()  # stdout: the id, nothing else (scripts read it)
    assert "watch it at" in sub.stderr and job_id in sub.stderr
    assert "no live worker serves device key 'e2e'" in sub.stderr  # none started
    listed = _cli(farm, "jobs", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [json.loads(line)["id"] for line in listed.stdout.splitlines()] == [job_id]
    table = _cli(farm, "jobs", "--state", "QUEUED")
    assert job_id in table.stdout and "QUEUED" in table.stdout, table.stdout
    cancelled = _cli(farm, "cancel", job_id)
    assert cancelled.returncode == 0 and "CANCELLED" in cancelled.stdout, cancelled.stderr
    followed = _cli(farm, "follow", job_id)  # an ended job: how it ended, exit 1 (not succeeded)
    assert followed.returncode == 1 and "CANCELLED: 0/8 trials" in followed.stdout, followed
    unknown = _cli(farm, "follow", "f" * 32)
    assert unknown.returncode == 2 and "not_found" in unknown.stderr + unknown.stdout, unknown
