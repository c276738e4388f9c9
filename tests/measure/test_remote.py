"""RemoteMeasurer against real Redis and SQL, with a fake worker thread (queue logic only)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
import redis

from tests.support.fakefarm import FakeWorker, make_inputs, make_job, ok_result
from tests.support.targets import RUN_X86
from tuner.db import Store
from tuner.measure import Invalidity, MeasureResult
from tuner.measure.remote import Interrupted, RemoteMeasurer
from tuner.queue import Keys, streams

pytestmark = pytest.mark.timeout(60)


def _measurer(r: redis.Redis, keys: Keys, store: Store, **kw: object) -> RemoteMeasurer:
    kw.setdefault("queue_wait_s", 20.0)
    kw.setdefault("lease_s", 1.0)
    kw.setdefault("poll_s", 0.05)
    return RemoteMeasurer(r, keys, "dev", store=store, **kw)  # type: ignore[arg-type]


def test_batch_is_measured_by_the_farm(r: redis.Redis, keys: Keys, store: Store,
                                       redis_url: str) -> None:
    job = make_job(store)
    inputs = make_inputs(job, 4)
    m = _measurer(r, keys, store)
    m.prepare(inputs)
    assert r.xlen(keys.measure("dev")) == 4  # the whole batch is queued before any waiting
    with FakeWorker(redis_url, keys, store) as w:
        results = [m.measure_one(inp) for inp in inputs]
    assert [res.trial_id for res in results] == [inp.trial_id for inp in inputs]
    for inp, res in zip(inputs, results, strict=True):
        want = ok_result(inp)
        assert res.ok and res.latencies_s == pytest.approx(want.latencies_s)
        assert res.worker == "fake"
    assert sorted(w.seen) == sorted(i.trial_id for i in inputs)
    assert m.requeued == 0
    assert r.xlen(keys.measure("dev")) == 0  # acked and deleted


def test_failed_kernels_come_back_as_data(r: redis.Redis, keys: Keys, store: Store,
                                          redis_url: str) -> None:
    (inp,) = make_inputs(make_job(store), 1)
    bad = MeasureResult.failure(inp.trial_id, Invalidity.BUILD_ERROR, "boom", worker="fake")
    m = _measurer(r, keys, store)
    with FakeWorker(redis_url, keys, store, behaviour=lambda i: bad):
        res = m.measure_one(inp)  # without prepare(): enqueued on demand
    assert res.invalidity is Invalidity.BUILD_ERROR and res.error_msg == "boom"


def test_dead_lettered_trial_is_worker_lost_at_once(r: redis.Redis, keys: Keys, store: Store,
                                                   redis_url: str) -> None:
    a, b = make_inputs(make_job(store), 2)
    m = _measurer(r, keys, store)
    m.prepare([a, b])
    with FakeWorker(redis_url, keys, store,
                    behaviour=lambda i: "dead" if i.trial_id == a.trial_id else None):
        t0 = time.monotonic()
        ra = m.measure_one(a)
        rb = m.measure_one(b)
    assert ra.invalidity is Invalidity.WORKER_LOST and "poison" in (ra.error_msg or "")
    assert time.monotonic() - t0 < 10
    assert rb.ok
    assert store.record(a.trial_id) is None  # the measurer writes nothing itself


def test_no_worker_within_queue_wait_is_worker_lost(r: redis.Redis, keys: Keys,
                                                     store: Store) -> None:
    (inp,) = make_inputs(make_job(store), 1)
    m = _measurer(r, keys, store, queue_wait_s=0.5)
    t0 = time.monotonic()  # the wait counts from when the trial was enqueued (in prepare)
    m.prepare([inp])
    res = m.measure_one(inp)
    assert 0.5 <= time.monotonic() - t0 < 5
    assert res.invalidity is Invalidity.WORKER_LOST
    assert "no worker for device key 'dev'" in (res.error_msg or "")


def test_interrupt_and_shutdown(r: redis.Redis, keys: Keys, store: Store) -> None:
    a, b = make_inputs(make_job(store), 2)
    reason: list[str] = []
    m = _measurer(r, keys, store, interrupt=lambda: reason[0] if reason else None)
    m.prepare([a, b])
    threading.Timer(0.3, lambda: reason.append("cancelled")).start()
    res = m.measure_one(a)
    assert res.invalidity is Invalidity.WORKER_LOST and "cancelled" in (res.error_msg or "")
    stop = threading.Event()
    stop.set()
    m2 = _measurer(r, keys, store, shutdown=stop)
    with pytest.raises(Interrupted):
        m2.measure_one(b)
    assert m.discard() == 1  # b is still queued: withdrawn
    assert r.xlen(keys.measure("dev")) == 1  # m2 enqueued b on its own


def test_entry_lost_to_a_flush_is_enqueued_again(private_redis_url: str, store: Store) -> None:
    r = streams.connect(private_redis_url)
    keys = Keys("flush:")
    try:
        inputs = make_inputs(make_job(store), 3)
        m = _measurer(r, keys, store, lease_s=0.3)
        m.prepare(inputs)
        r.flushall()  # before any worker saw them
        with FakeWorker(private_redis_url, keys, store) as w:
            results = [m.measure_one(inp) for inp in inputs]
        assert all(res.ok for res in results)
        assert m.requeued == 3
        assert sorted(w.seen) == sorted(i.trial_id for i in inputs)
    finally:
        r.close()


def test_flush_while_a_worker_holds_the_entry(private_redis_url: str, store: Store) -> None:
    """A worker crashed holding the entry, then Redis was wiped: another worker measures it."""
    r = streams.connect(private_redis_url)
    keys = Keys("flush:")
    try:
        (inp,) = make_inputs(make_job(store), 1)
        m = _measurer(r, keys, store, lease_s=0.3)
        m.prepare([inp])
        streams.ensure_group(r, keys.measure("dev"), Keys.WORKERS_GROUP)
        assert streams.read_new(r, keys.measure("dev"), Keys.WORKERS_GROUP, "crashed")
        done = threading.Event()
        out: list[MeasureResult] = []
        t = threading.Thread(target=lambda: (out.append(m.measure_one(inp)), done.set()))
        t.start()
        time.sleep(0.2)
        r.flushall()
        with FakeWorker(private_redis_url, keys, store):
            assert done.wait(15)
        t.join(5)
        assert out[0].ok and m.requeued == 1
    finally:
        r.close()


def test_the_tuner_never_writes_a_record_the_farm_committed(
        r: redis.Redis, keys: Keys, store: Store, redis_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One writer per record: in the service the API's results endpoint (here the fake worker)
    commits each trial; the search loop, measuring through RemoteMeasurer (commits_records),
    reads the result back and writes nothing for it."""
    from tests.support.search import small_search
    from tuner.measure import MeasureOptions
    from tuner.search import Tuner, TuneRequest
    from tuner.workloads import parse_spec

    small_search(monkeypatch)
    writers: list[tuple[str, threading.Thread]] = []
    add = store.add_records

    def spy(records: Any) -> int:
        writers.extend((rec.trial_id, threading.current_thread()) for rec in records)
        return add(records)

    from tuner.db import trials

    commit = trials.commit_result

    def commit_spy(st: Store, rec: Any, *args: Any, **kw: Any) -> bool:
        writers.append((rec.trial_id, threading.current_thread()))
        return commit(st, rec, *args, **kw)

    monkeypatch.setattr(store, "add_records", spy)
    monkeypatch.setattr(trials, "commit_result", commit_spy)
    req = TuneRequest(workload=parse_spec({"op": "matmul", "shape": [16, 16, 16]}),
                      target={**RUN_X86, "num-cores": 1}, trials=6,
                      device_key="dev", space="gemm-x86", batch_size=3,
                      options=MeasureOptions(num_threads=1))
    m = _measurer(r, keys, store)
    assert m.commits_records
    with FakeWorker(redis_url, keys, store) as w:
        summary = Tuner(store, m).run(req)
    rows = store.records(job_id=summary.job_id)
    assert summary.trials_done == len(rows) == 6
    assert sorted(w.seen) == sorted(row.trial_id for row in rows)
    assert Counter(tid for tid, _ in writers) == {row.trial_id: 1 for row in rows}
    assert all(thread is w.thread for _, thread in writers)  # the farm wrote them all


def test_every_trial_is_issued_before_it_is_enqueued(r: redis.Redis, keys: Keys,
                                                      store: Store) -> None:
    """prepare() and an unprepared measure_one() issue each trial in SQL for the measurer's
    device key (the API accepts results only for issued trials), valid at least as long as
    the measurer waits; issuing again (a re-enqueue) keeps one row per trial."""
    from datetime import timedelta

    from tuner.db import trials
    from tuner.db.tables import utcnow

    job = make_job(store)
    a, b = make_inputs(job, 2)
    m = _measurer(r, keys, store, queue_wait_s=0.3, trial_ttl_s=120)
    m.prepare([a, a])
    row = trials.issued(store, a.trial_id)
    assert row is not None and row.device_key == "dev" and row.job_id == job.id
    assert row.expires_at > utcnow() + timedelta(seconds=100)
    assert trials.issued(store, b.trial_id) is None
    assert m.measure_one(b).invalidity is Invalidity.WORKER_LOST  # nobody measures it
    assert trials.issued(store, b.trial_id) is not None
    m.prepare([b])
    assert r.xlen(keys.measure("dev")) == 2
    m.discard()


def test_a_new_best_is_measured_again_before_it_is_returned(r: redis.Redis, keys: Keys,
                                                           store: Store, redis_url: str) -> None:
    """A valid result that would become the workload's served best is measured again as its
    confirmation trial (issued with `confirms`, enqueued with the worker to avoid) before
    measure_one returns; a result slower than the served best is not."""
    from tuner.db import trials
    from tuner.measure.remote import confirmation_id

    job = make_job(store)
    first, slower = make_inputs(job, 2)
    m = _measurer(r, keys, store, confirm=True)
    slow_result = MeasureResult(slower.trial_id, Invalidity.OK, latencies_s=(1.0, 1.0, 1.0))
    with FakeWorker(redis_url, keys, store,
                    behaviour=lambda i: slow_result if i.trial_id == slower.trial_id
                    else None) as w:
        res = m.measure_one(first)
        assert res.ok
        cid = confirmation_id(first.trial_id)
        assert w.seen == [first.trial_id, cid]  # measured again before it was returned
        issued = trials.issued(store, cid)
        assert issued is not None and issued.confirms == first.trial_id
        assert m.measure_one(slower).ok
    assert w.seen == [first.trial_id, cid, slower.trial_id]  # not faster: no confirmation
