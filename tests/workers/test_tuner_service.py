"""run_tuner / TunerService against real Redis and SQL: the real search loop on a tiny matmul,
measured by a fake worker thread (records with made-up latencies)."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
import redis

from tests.support.fakefarm import FakeWorker
from tuner.core import tvm_api as tv
from tuner.core.config import Settings
from tuner.db import Store
from tuner.db import jobs as jobdb
from tuner.db import tables as models
from tuner.db.tables import JobState
from tuner.measure import Invalidity
from tuner.queue import Keys, streams
from tuner.workloads import parse_spec
from workers.tuner_service import run_tuner, tune_request

pytestmark = pytest.mark.timeout(180)

SPEC = {"op": "matmul", "shape": [16, 16, 16]}
TARGET = {"kind": "llvm", "num-cores": 1}


def _settings(**kw: Any) -> Settings:
    base: dict[str, Any] = {"job_lease_s": 1.5, "lease_s": 1.0, "queue_wait_s": 30.0,
                            "num_threads": 1, "batch_size": 4, "min_repeat_ms": 1.0, "repeats": 1}
    base.update(kw)
    return Settings(**base)


def submit(store: Store, r: redis.Redis, keys: Keys, *, trials: int = 4,
           wall_budget_s: float | None = None, batch_size: int = 4, space: str = "default") -> str:
    """What POST /v1/jobs does: the workload and target rows, a QUEUED job, a wake-up entry."""
    wl = parse_spec(SPEC)
    wid = store.ensure_workload(key=wl.key, op=wl.op, spec_json=json.dumps(wl.spec, sort_keys=True),
                                shash=wl.shash(), mod_json=tv.save_json(wl.mod()),
                                description=wl.description, flops=int(wl.flops))
    tref = store.ensure_target(tv.canonical_target_json(tv.make_target(TARGET)), "dev")
    job = store.create_job(job_key=f"k{time.monotonic_ns()}", workload_id=wid, target_id=tref.id,
                           space=space, trials=trials, wall_budget_s=wall_budget_s,
                           options={"batch_size": batch_size, "seed": 0})
    streams.enqueue(r, keys.jobs, {"job_id": job.id})
    return job.id


def _events(r: redis.Redis, keys: Keys, job_id: str) -> list[tuple[str, dict[str, Any]]]:
    return [(f["event"], json.loads(f["data"])) for _, f in r.xrange(keys.events(job_id))]


def _run(store: Store, redis_url: str, keys: Keys, **kw: Any) -> int:
    kw.setdefault("settings", _settings())
    return run_tuner(store_url=store.url, redis_url=redis_url, prefix=keys.prefix, poll_s=0.2, **kw)


def _measured(store: Store, job_id: str) -> int:
    return sum(1 for x in store.records(job_id=job_id) if x.invalidity != Invalidity.WORKER_LOST)


def test_tune_request_from_the_job_row(store: Store, r: redis.Redis, keys: Keys) -> None:
    job = store.get_job(submit(store, r, keys, trials=7, batch_size=3))
    assert job is not None
    req = tune_request(store, job, _settings(num_threads=None))
    assert req.job_id == job.id and req.trials == 7 and req.batch_size == 3
    assert req.device_key == "dev" and req.workload.spec == parse_spec(SPEC).spec
    assert req.target["kind"] == "llvm" and req.options.num_threads == 1  # target num-cores


def test_tuner_claims_and_runs_a_job(store: Store, r: redis.Redis, keys: Keys,
                                     redis_url: str) -> None:
    job_id = submit(store, r, keys, trials=4)
    with FakeWorker(redis_url, keys, store) as w:
        assert _run(store, redis_url, keys, once=True) == 1
    job = store.get_job(job_id)
    assert job is not None and job.state is JobState.SUCCEEDED, job
    assert job.lease_owner is None
    assert _measured(store, job_id) == 4 and len(w.trials) == 4
    evs = _events(r, keys, job_id)
    assert evs[0] == ("state", {"state": "RUNNING"})
    assert evs[-1] == ("state", {"state": "SUCCEEDED"})
    assert [d["done"] for e, d in evs if e == "progress"][-1] == 4
    # the job was claimed from SQL first; the next poll reads its stale wake-up and drops it
    assert _run(store, redis_url, keys, once=True) == 0
    assert r.xlen(keys.jobs) == 0 and r.xpending(keys.jobs, Keys.TUNERS_GROUP)["pending"] == 0


def test_job_of_a_dead_tuner_is_resumed_after_its_lease(store: Store, r: redis.Redis, keys: Keys,
                                                        redis_url: str) -> None:
    job_id = submit(store, r, keys, trials=2)
    with FakeWorker(redis_url, keys, store):
        assert _run(store, redis_url, keys, once=True) == 1
        assert _measured(store, job_id) == 2
        # a tuner took the extended job, measured nothing more, and died holding its lease
        store.update_job_trials(job_id, 4)
        store.set_job_state(job_id, JobState.RUNNING, reopen=True)
        assert jobdb.claim(store, "dead-tuner", 1.0, job_id=job_id) is not None
        assert _run(store, redis_url, keys, once=True) == 0  # the lease still holds
        assert store.get_job(job_id).state is JobState.RUNNING  # type: ignore[union-attr]
        time.sleep(1.1)
        assert _run(store, redis_url, keys, once=True) == 1
    job = store.get_job(job_id)
    assert job is not None and job.state is JobState.SUCCEEDED
    assert _measured(store, job_id) == 4  # resumed from the two committed records


def _run_in_thread(store: Store, redis_url: str, keys: Keys, stop: threading.Event,
                   **kw: Any) -> threading.Thread:
    t = threading.Thread(target=_run, args=(store, redis_url, keys),
                         kwargs={"stop_event": stop, **kw}, daemon=True)
    t.start()
    return t


def _wait_for(cond: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_cancel_stops_a_running_job(store: Store, r: redis.Redis, keys: Keys,
                                    redis_url: str) -> None:
    job_id = submit(store, r, keys, trials=40)
    stop = threading.Event()
    with FakeWorker(redis_url, keys, store, delay_s=0.3):
        t = _run_in_thread(store, redis_url, keys, stop)
        _wait_for(lambda: _measured(store, job_id) >= 1)
        assert jobdb.request_cancel(store, job_id).state is JobState.CANCELLING
        _wait_for(lambda: store.get_job(job_id).state is JobState.CANCELLED, 15)  # type: ignore[union-attr]
        _wait_for(lambda: ("state", {"state": "CANCELLED"}) in _events(r, keys, job_id), 15)
        stop.set()
        t.join(30)
    assert not t.is_alive()
    assert _measured(store, job_id) < 40
    assert r.get(keys.cancelled(job_id)) == "1"
    assert r.xlen(keys.measure("dev")) == 0  # its queued trials were withdrawn
    assert store.get_job(job_id).lease_owner is None  # type: ignore[union-attr]


def test_stopping_the_tuner_leaves_the_job_to_another(store: Store, r: redis.Redis, keys: Keys,
                                                      redis_url: str) -> None:
    job_id = submit(store, r, keys, trials=6)
    stop = threading.Event()
    with FakeWorker(redis_url, keys, store, delay_s=0.3):
        t = _run_in_thread(store, redis_url, keys, stop)
        _wait_for(lambda: _measured(store, job_id) >= 1)
        stop.set()
        t.join(30)
        assert not t.is_alive()
        job = store.get_job(job_id)
        assert job is not None and job.state is JobState.RUNNING and job.lease_owner is None
        assert _run(store, redis_url, keys, once=True) == 1  # another tuner finishes it at once
    job = store.get_job(job_id)
    assert job is not None and job.state is JobState.SUCCEEDED
    # the trial a worker was measuring when the tuner stopped may land after the resume began
    assert 6 <= _measured(store, job_id) <= 7


def test_wall_budget_stops_the_job(store: Store, r: redis.Redis, keys: Keys,
                                   redis_url: str) -> None:
    job_id = submit(store, r, keys, trials=40, wall_budget_s=0.5)
    with FakeWorker(redis_url, keys, store, delay_s=0.2):
        assert _run(store, redis_url, keys, once=True) == 1
    job = store.get_job(job_id)
    assert job is not None and job.state is JobState.SUCCEEDED
    assert 1 <= _measured(store, job_id) < 40


def test_a_job_that_cannot_run_fails_and_the_tuner_goes_on(store: Store, r: redis.Redis,
                                                            keys: Keys, redis_url: str) -> None:
    bad = submit(store, r, keys, space="no-such-space")
    good = submit(store, r, keys, trials=2)
    with FakeWorker(redis_url, keys, store):
        assert _run(store, redis_url, keys, once=True) == 1
        assert _run(store, redis_url, keys, once=True) == 1
    job = store.get_job(bad)
    assert job is not None and job.state is JobState.FAILED and "no-such-space" in (job.error or "")
    assert _events(r, keys, bad)[-1][1]["state"] == "FAILED"
    assert store.get_job(good).state is JobState.SUCCEEDED  # type: ignore[union-attr]


def test_tuner_polls_sql_when_the_stream_lost_the_job(private_redis_url: str, store: Store) -> None:
    r = streams.connect(private_redis_url)
    keys = Keys("wipe:")
    try:
        job_id = submit(store, r, keys, trials=2)
        r.flushall()  # the wake-up entry is gone; SQL still has the job
        with FakeWorker(private_redis_url, keys, store):
            assert _run(store, private_redis_url, keys, once=True) == 1
        assert store.get_job(job_id).state is JobState.SUCCEEDED  # type: ignore[union-attr]
    finally:
        r.close()


def test_claims_are_fair_across_owners(store: Store, r: redis.Redis, keys: Keys) -> None:
    """Three queued jobs of owner A, then one of owner B: the second claim takes B's job (A
    already has one running), the third goes back to A's oldest waiting job."""
    made = {}
    for name in ("a1", "a2", "a3", "b1"):
        made[name] = submit(store, r, keys)
        with store.session() as s:  # what POST /v1/jobs stores for the principal
            s.get(models.Job, made[name]).owner = "owner-" + name[0]
    order = [jobdb.claim(store, f"tuner-{i}", 30) for i in range(4)]
    assert [j.id if j else None for j in order] == [made[n] for n in ("a1", "b1", "a2", "a3")]
    assert order[1] is not None and order[1].owner == "owner-b"


def test_wall_budget_counts_from_the_start_not_the_submission(
        store: Store, r: redis.Redis, keys: Keys, redis_url: str) -> None:
    """A job queued for an hour still gets its whole budget once it runs."""
    job_id = submit(store, r, keys, trials=40, wall_budget_s=0.8)
    with store.session() as s:
        s.get(models.Job, job_id).created_at = models.utcnow() - timedelta(hours=1)
    with FakeWorker(redis_url, keys, store, delay_s=0.2):
        assert _run(store, redis_url, keys, once=True) == 1
    job = store.get_job(job_id)
    assert job is not None and job.state is JobState.SUCCEEDED and job.started_at is not None
    assert 1 <= _measured(store, job_id) < 40


def test_the_worker_gets_the_job_deadline() -> None:
    """Each input's run deadline is capped to the job's wall time left (1 s at least)."""
    from dataclasses import replace as dc_replace

    from tuner.measure import MeasureInput, MeasureOptions
    from workers.tuner_service import MIN_RUN_TIMEOUT_S, _Deadlined

    class Inner:
        commits_records = True

        def __init__(self) -> None:
            self.prepared: list[MeasureInput] = []

        def prepare(self, inputs: list[MeasureInput]) -> None:
            self.prepared += inputs

    left: list[float | None] = [None]
    inner = Inner()
    m = _Deadlined(inner, lambda: left[0])  # type: ignore[arg-type]
    inp = MeasureInput(trial_id="t", workload_key="w", workload_spec={}, target={},
                       trace_json="[]", options=MeasureOptions(run_timeout_s=30.0))
    assert m.capped(inp) is inp  # no budget
    left[0] = 5.0
    m.prepare([inp])
    assert inner.prepared[0].options.run_timeout_s == pytest.approx(5.0)
    assert inner.prepared[0].options.build_timeout_s == inp.options.build_timeout_s
    left[0] = -3.0
    assert m.capped(inp).options.run_timeout_s == MIN_RUN_TIMEOUT_S
    short = dc_replace(inp, options=MeasureOptions(run_timeout_s=0.5))
    assert m.capped(short) is short  # already shorter
