"""A job never waits in silence: while its trials wait on the farm, the tuner says why (no
live worker of the device key; every one quarantined), and a key without a live worker for
TUNEFARM_NO_WORKER_TIMEOUT_S ends the job with that reason. Real SQL and Redis."""

from __future__ import annotations

import time

import pytest
import redis

from tests.support.fakefarm import make_inputs, make_job
from tuner.db import Store
from tuner.db import tables as m
from tuner.db import workers as workers_db
from tuner.measure.remote import RemoteMeasurer
from tuner.measure.watch import NoLiveWorker, WorkerWatch
from tuner.queue import Keys

pytestmark = pytest.mark.timeout(60)


def _register(store: Store, name: str, state: str = "idle") -> str:
    w = workers_db.register_worker(store, name=name, device_key="dev", target_json="{}",
                                   capabilities={}, tvm_version="t", hostname="h")
    with store.session() as s:
        s.get(m.Worker, w.id).state = state  # type: ignore[union-attr]
    return w.id


def test_the_reason_a_job_waits_follows_the_workers(store: Store) -> None:
    said: list[str | None] = []
    now = [0.0]
    watch = WorkerWatch(store, "dev", said.append, give_up_s=100, stale_after_s=30,
                        every_s=1, clock=lambda: now[0])
    watch.check()
    assert said == ["waiting: no live worker of device key 'dev'"]
    wid = _register(store, "q", state="quarantined")
    now[0] += 2
    watch.check()
    assert said[-1] == "waiting: every worker of device key 'dev' is quarantined (1 of them)"
    _register(store, "ok")
    now[0] += 0.5
    watch.check()  # asked again only every `every_s`
    assert len(said) == 2
    now[0] += 1
    watch.check()
    assert said[-1] is None  # a live worker: no reason to wait
    with store.session() as s:  # the live one went silent: stale, so not serving
        for w in s.query(m.Worker).filter(m.Worker.id != wid):
            w.last_seen_at = m.utcnow().replace(year=2000)
    now[0] += 1
    watch.check()
    assert said[-1].startswith("waiting: every worker")  # type: ignore[union-attr]
    watch.close()
    assert said[-1] is None


def test_no_live_worker_for_the_timeout_ends_the_wait(r: redis.Redis, keys: Keys,
                                                      store: Store) -> None:
    job = make_job(store)
    (inp,) = make_inputs(job, 1)
    said: list[str | None] = []

    def report(why: str | None) -> None:
        said.append(why)
        store.set_job_message(job.id, why)

    watch = WorkerWatch(store, "dev", report, give_up_s=0.5, stale_after_s=30, every_s=0.1)
    measurer = RemoteMeasurer(r, keys, "dev", store=store, queue_wait_s=20, lease_s=1,
                              poll_s=0.05, watch=watch)
    measurer.prepare([inp])
    t0 = time.monotonic()
    with pytest.raises(NoLiveWorker, match=r"no live worker of device key .dev. for 0\.5 s"):
        measurer.measure_one(inp)
    assert time.monotonic() - t0 < 5
    row = store.get_job(job.id)
    assert row is not None and row.message == "waiting: no live worker of device key 'dev'"
