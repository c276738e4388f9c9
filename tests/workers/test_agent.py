"""workers.agent against the real API (`tunefarm serve` in its own process group), Redis and
SQL. The worker talks only to the API (lease, renew, ack, dead-letter, results, heartbeats);
the tests enqueue and inspect Redis as the tuner would. The measurer is a fake (the queue
protocol is the point; LocalMeasurer has its own tests and the e2e test runs the real one)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import pytest
import redis

from api.client import Client, wait_ready
from tests.support.fakes import FakeMeasurer, FlakyBoard
from tests.support.targets import RUN_X86
from tuner.db import Store, trials
from tuner.db import workers as workerdb
from tuner.db.tokens import create_token
from tuner.measure import Invalidity, MeasureInput
from tuner.queue import Keys, streams
from workers.agent import run_worker

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
DEV = "agent-dev"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Api:
    """`python -m tuner serve` on a free port; stop() kills its process group."""

    def __init__(self, db_url: str, redis_url: str, prefix: str, workdir: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "TUNEFARM_DATABASE_URL": db_url, "TUNEFARM_REDIS_URL": redis_url,
                    "TUNEFARM_REDIS_PREFIX": prefix, "TUNEFARM_LEASE_S": "0.6",
                    "TUNEFARM_HEARTBEAT_S": "0.3", "TUNEFARM_MAX_DELIVERIES": "3",
                    "TUNEFARM_DATA_DIR": str(workdir / "data")}
        self.log = workdir / "api.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tuner", "serve", "--host", "127.0.0.1", "--port",
                 str(self.port)], env=self.env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, cwd=str(ROOT))
        proc = self.proc
        assert wait_ready(self.url, alive=lambda: proc.poll() is None), \
            f"API not ready in 60 s: {self.log.read_text()[-3000:]}"

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=20)
            self.proc = None


@pytest.fixture
def db_url(pg_url: str) -> str:
    """PostgreSQL only (as a farm runs; the agent never touches SQL, so one backend is enough):
    the session's database with every table dropped."""
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    from tuner.db.tables import Base

    engine = create_engine(pg_url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            Base.metadata.drop_all(conn)
            conn.exec_driver_sql("DROP TABLE IF EXISTS alembic_version")
    finally:
        engine.dispose()
    return pg_url


@pytest.fixture
def api(store: Store, redis_url: str, redis_prefix: str, tmp_path: Path) -> Iterator[Api]:
    a = Api(store.url, redis_url, redis_prefix, tmp_path)
    a.start()
    try:
        yield a
    finally:
        a.stop()


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    client = streams.connect(redis_url)
    yield client
    client.close()


def _inputs(store: Store, n: int) -> list[MeasureInput]:
    wid = store.ensure_workload(key="matmul-agent", op="matmul",
                                spec_json=json.dumps({"op": "matmul", "shape": [16, 16, 16]}),
                                shash="0", mod_json="{}")
    tref = store.ensure_target('{"kind": "llvm", "num-cores": 1}', DEV)
    job = store.create_job(job_key=f"agent{time.monotonic_ns()}", workload_id=wid,
                           target_id=tref.id, space="default", trials=n)
    out = []
    for i in range(n):
        ctx = {"job_id": job.id, "workload_id": wid, "target_id": tref.id, "space": "default",
               "cand_hash": f"{i:016x}", "decisions": [], "features_b64": None,
               "tvm_version": "test"}
        out.append(MeasureInput(trial_id=f"{job.id[:12]}{i:04x}", workload_key="matmul-agent",
                                workload_spec={"op": "matmul", "shape": [16, 16, 16]},
                                target={"kind": "llvm"}, trace_json="[]", context=ctx))
    trials.issue(store, out, DEV, ttl_s=600)  # as the tuner does before it enqueues them
    return out


class Worker:
    """run_worker in a thread with a FakeMeasurer."""

    def __init__(self, api: Api, store: Store, **kw: Any) -> None:
        self.stop = threading.Event()
        self.fake: FakeMeasurer | None = None
        fake_kw = kw.pop("fake", {})
        fake_cls = kw.pop("fake_cls", FakeMeasurer)
        self.rc: list[int] = []
        token = create_token(store, "worker", "agent-test")

        def factory(worker_id: str) -> FakeMeasurer:
            self.fake = fake_cls(worker_id, **fake_kw)
            return self.fake

        self.thread = threading.Thread(target=lambda: self.rc.append(run_worker(
            api_url=api.url, token=token, device_key=DEV,
            target={"kind": "llvm", "num-cores": 1}, name="w-test", stop_event=self.stop,
            measurer_factory=factory, **kw)), daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        _wait(lambda: self.fake is not None, 30)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive()


def _wait(cond: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _scrubbed(env: dict[str, str]) -> dict[str, str]:
    """`env` without the database and Redis URLs: a worker needs only the API and its token."""
    return {k: v for k, v in env.items()
            if k not in ("TUNEFARM_DATABASE_URL", "TUNEFARM_REDIS_URL", "TUNEFARM_REDIS_PREFIX")}


def _enqueue(r: redis.Redis, keys: Keys, inputs: list[MeasureInput]) -> list[str]:
    return [streams.enqueue(r, keys.measure(DEV), {"input": i.to_json()}) for i in inputs]


def test_worker_measures_posts_and_acks(api: Api, store: Store, r: redis.Redis,
                                        redis_prefix: str) -> None:
    keys = Keys(redis_prefix)
    inputs = _inputs(store, 3)
    bad = inputs[1].trial_id
    with Worker(api, store, fake={"outcome": {bad: Invalidity.RUN_ERROR}}) as w:
        _enqueue(r, keys, inputs)
        _wait(lambda: all(store.record(i.trial_id) for i in inputs))
        _wait(lambda: r.xlen(keys.measure(DEV)) == 0)  # acked (and deleted) after the 200
        (row,) = workerdb.list_workers(store)
        _wait(lambda: workerdb.list_workers(store)[0].measured == 3, 10)  # heartbeats
    assert w.rc == [0] and w.fake is not None and w.fake.closed
    rec = store.record(bad)
    assert rec is not None and rec.invalidity is Invalidity.RUN_ERROR
    assert rec.worker == row.id and row.device_key == DEV and row.name == "w-test"
    assert store.record(inputs[0].trial_id).ok  # type: ignore[union-attr]
    final = workerdb.get_worker(store, row.id)
    assert final is not None and final.state == "offline" and final.failures == 1
    assert r.xpending(keys.measure(DEV), Keys.WORKERS_GROUP)["pending"] == 0


def test_result_is_acked_only_after_the_api_took_it(api: Api, store: Store, r: redis.Redis,
                                                    redis_prefix: str) -> None:
    keys = Keys(redis_prefix)
    (inp,) = _inputs(store, 1)
    with Worker(api, store, fake={"delay_s": 0.5}) as w:
        _enqueue(r, keys, [inp])
        _wait(lambda: w.fake is not None and w.fake.started.is_set())
        api.stop()  # the API goes down while the worker measures the entry it leased
        _wait(lambda: w.fake is not None and w.fake.measured == [inp.trial_id])
        time.sleep(1.5)  # posting fails and is retried; the entry stays pending, not acked
        assert store.record(inp.trial_id) is None
        pend = r.xpending(keys.measure(DEV), Keys.WORKERS_GROUP)
        assert pend["pending"] == 1
        api.start()  # same port
        _wait(lambda: store.record(inp.trial_id) is not None)
        _wait(lambda: r.xpending(keys.measure(DEV), Keys.WORKERS_GROUP)["pending"] == 0)
    assert w.fake is not None and w.fake.measured == [inp.trial_id]  # measured once


def test_reclaims_a_dead_workers_entries_and_dead_letters_poison(
        api: Api, store: Store, r: redis.Redis, redis_prefix: str) -> None:
    keys = Keys(redis_prefix)
    stream, group = keys.measure(DEV), Keys.WORKERS_GROUP
    orphan, poison = _inputs(store, 2)
    streams.ensure_group(r, stream, group)
    _enqueue(r, keys, [orphan, poison])
    assert len(streams.read_new(r, stream, group, "dead-worker", count=2)) == 2
    for i in range(3):  # poison killed three workers already
        time.sleep(0.02)
        r.xclaim(stream, group, f"dead-{i}", min_idle_time=0,
                 message_ids=[r.xrange(stream)[1][0]])
    with Worker(api, store) as w:
        _wait(lambda: store.record(orphan.trial_id) is not None)
        _wait(lambda: r.xlen(keys.dead(DEV)) == 1)
    assert w.fake is not None and w.fake.measured == [orphan.trial_id]
    (_, dead), = r.xrange(keys.dead(DEV))
    assert json.loads(dead["input"])["trial_id"] == poison.trial_id
    assert dead["deliveries"] == "5" and "max 3" in dead["reason"]
    job_id = (poison.context or {})["job_id"]
    (_, lost), = r.xrange(keys.lost(job_id))
    assert lost["trial_id"] == poison.trial_id
    assert store.record(poison.trial_id) is None
    assert r.xpending(stream, group)["pending"] == 0


def test_skips_cancelled_jobs_and_leaves_infrastructure_failures(
        api: Api, store: Store, r: redis.Redis, redis_prefix: str) -> None:
    keys = Keys(redis_prefix)
    stream, group = keys.measure(DEV), Keys.WORKERS_GROUP
    a, b = _inputs(store, 2)
    cancelled = _inputs(store, 1)[0]
    r.set(keys.cancelled((cancelled.context or {})["job_id"]), "1", ex=60)
    with Worker(api, store, fake={"outcome": {b.trial_id: Invalidity.WORKER_LOST}}) as w:
        _enqueue(r, keys, [cancelled, a, b])
        _wait(lambda: store.record(a.trial_id) is not None)
        _wait(lambda: w.fake is not None and w.fake.measured.count(b.trial_id) >= 1)
    assert w.fake is not None and cancelled.trial_id not in w.fake.measured
    assert store.record(cancelled.trial_id) is None
    # the lost measurement was not posted (its trial id stays free) and not acked
    assert store.record(b.trial_id) is None
    (pending,) = r.xpending_range(stream, group, min="-", max="+", count=10)
    assert json.loads(r.xrange(stream, min=pending["message_id"],
                               max=pending["message_id"])[0][1]["input"])["trial_id"] == b.trial_id


def test_infrastructure_failures_are_recorded_retried_and_quarantine_the_worker(
        api: Api, store: Store, r: redis.Redis, redis_prefix: str) -> None:
    keys = Keys(redis_prefix)
    a, b = _inputs(store, 2)
    with Worker(api, store, fake_cls=FlakyBoard, fake={"lost": 3},
                quarantine_after=3, probe_s=0.2) as w:
        board = w.fake
        assert isinstance(board, FlakyBoard)
        _enqueue(r, keys, [a])
        # a fails twice (measured again at once, then left); b's first failure makes 3 in a row
        _wait(lambda: board.measured.count(a.trial_id) == 2)
        _enqueue(r, keys, [b])
        _wait(lambda: board.probes >= 2)  # quarantined: probing, taking no work
        assert b.trial_id in board.measured and store.record(b.trial_id) is None
        admin = Client(api.url, create_token(store, "admin", "agent-test"))
        _wait(lambda: [x["state"] for x in admin.list_workers()] == ["quarantined"])
        admin.close()
        board.healthy.set()  # re-admitted; a and b come back after the lease (reclaim)
        _wait(lambda: store.record(a.trial_id) is not None and store.record(b.trial_id) is not None,
              60)
    lost = [rec for rec in store.records() if rec.invalidity is Invalidity.WORKER_LOST]
    assert len(lost) == 3 and all("-lost-" in rec.trial_id for rec in lost)
    assert store.record(a.trial_id).ok and store.record(b.trial_id).ok  # type: ignore[union-attr]


def test_stop_drains_the_current_candidate(api: Api, store: Store, r: redis.Redis,
                                           redis_prefix: str) -> None:
    keys = Keys(redis_prefix)
    first, second = _inputs(store, 2)
    w = Worker(api, store, fake={"delay_s": 1.0}, concurrency=2)
    _enqueue(r, keys, [first, second])  # both queued before the worker reads
    with w:
        _wait(lambda: w.fake is not None and w.fake.started.is_set())
        w.stop.set()  # SIGTERM in the CLI: finish this candidate, post it, ack it, exit
        w.thread.join(30)
    assert w.rc == [0]
    assert w.fake is not None and w.fake.prepared == [[first.trial_id, second.trial_id]]
    assert w.fake.measured == [first.trial_id]
    assert store.record(first.trial_id) is not None and store.record(second.trial_id) is None
    # the second entry is left pending: another worker reclaims it after the lease
    pend = r.xpending_range(keys.measure(DEV), Keys.WORKERS_GROUP, min="-", max="+", count=10)
    assert len(pend) == 1


@pytest.mark.slow
def test_worker_process_measures_for_real_and_drains_on_sigterm(
        api: Api, store: Store, r: redis.Redis, redis_prefix: str, tmp_path: Path) -> None:
    """`tunefarm worker` as a process: a real candidate is built and timed in the sandbox
    (TVM_NUM_THREADS = the target's num-cores), posted, acked; SIGTERM exits 0."""
    from tuner.core import tvm_api as tv
    from tuner.measure import MeasureOptions
    from tuner.workloads import parse_spec

    target = dict(RUN_X86)
    wl = parse_spec({"op": "matmul", "shape": [16, 16, 16]})
    wid = store.ensure_workload(key=wl.key, op=wl.op, spec_json=json.dumps(wl.spec), shash="0",
                                mod_json="{}", flops=int(wl.flops))
    tref = store.ensure_target(json.dumps(target), DEV)
    job = store.create_job(job_key="real", workload_id=wid, target_id=tref.id, space="default",
                           trials=1)
    ctx = {"job_id": job.id, "workload_id": wid, "target_id": tref.id, "space": "default",
           "cand_hash": "0" * 16, "decisions": [], "features_b64": None, "tvm_version": "test"}
    inp = MeasureInput(trial_id="real-trial-0", workload_key=wl.key, workload_spec=wl.spec,
                       target=target, trace_json=tv.trace_to_json(tv.Schedule(wl.mod()).trace),
                       options=MeasureOptions(min_repeat_ms=2, repeats=3, num_threads=2),
                       context=ctx)
    trials.issue(store, [inp], DEV, ttl_s=600)
    token = create_token(store, "worker", "real")
    log_path = tmp_path / "worker.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tuner", "worker", "--device-key", DEV, "--target",
             json.dumps(target), "--name", "real", "--api", api.url],
            env={**_scrubbed(api.env), "TUNEFARM_TOKEN": token}, stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True, cwd=str(ROOT))
    try:
        streams.enqueue(r, Keys(redis_prefix).measure(DEV), {"input": inp.to_json()})
        _wait(lambda: store.record(inp.trial_id) is not None or proc.poll() is not None, 100)
        rec = store.record(inp.trial_id)
        assert rec is not None, log_path.read_text()[-3000:]
        assert rec.invalidity is Invalidity.OK, rec.error_msg
        assert len(rec.latencies) == 3 and rec.median_s and rec.median_s > 0
        (w,) = workerdb.list_workers(store)
        assert rec.worker == w.id and w.name == "real"
        _wait(lambda: r.xpending(Keys(redis_prefix).measure(DEV), Keys.WORKERS_GROUP)["pending"]
              == 0, 10)
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log_path.read_text()[-3000:]
        final = workerdb.get_worker(store, w.id)
        assert final is not None and final.state == "offline" and final.measured == 1
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=20)
