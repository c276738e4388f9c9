"""A worker holds only the API URL and its token: it leases, renews, acknowledges and
dead-letters its queue entries through the API (`api.work`), which acts only on the entries of
the worker the token registered. Redis with a password works for the API and the tuner through
TUNEFARM_REDIS_URL."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.conftest import _reset_pg, kill_group
from tests.e2e.farm import TARGET, Farm, free_port
from tuner.db import Store
from tuner.db.tokens import create_token
from tuner.measure import Invalidity, MeasureInput
from tuner.queue import Keys, mark_cancelled, streams

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[2]
DEV = "work-dev"


# --------------------------------------------------------------------------- fixtures
@pytest.fixture
def passworded_redis(tmp_path: Path) -> Iterator[str]:
    """A private `redis-server --requirepass pw` in its own process group: its URL carries the
    password (`redis://:pw@127.0.0.1:PORT/0`)."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not on PATH")
    port = free_port()
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--requirepass", "pw", "--save", "",
         "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"redis://:pw@127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with redis.Redis.from_url(url, socket_connect_timeout=0.2) as r:
                    r.ping()
                break
            except (redis.RedisError, OSError):
                assert time.monotonic() < deadline, "redis-server did not start in 10 s"
                time.sleep(0.05)
        yield url
    finally:
        kill_group(proc)


@pytest.fixture
def app(pg_url: str, redis_url: str, redis_prefix: str) -> Iterator[Any]:
    """The API app (TestClient) on PostgreSQL and the shared Redis, with a short lease and two
    deliveries before an entry is dead-lettered."""
    from fastapi.testclient import TestClient

    from api.app import create_app
    from tuner.core.config import Settings

    _reset_pg(pg_url)
    settings = Settings(database_url=pg_url, redis_url=redis_url, redis_prefix=redis_prefix,
                        lease_s=0.3, max_deliveries=2)
    with TestClient(create_app(settings)) as c:
        yield c


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _register(app: Any, name: str) -> tuple[str, dict[str, str]]:
    """A worker of DEV registered with a fresh worker token: (worker id, its headers)."""
    headers = _bearer(create_token(app.app.state.ctx.store, "worker", name))
    resp = app.post("/v1/workers", json={"name": name, "device_key": DEV,
                                         "target": {"kind": "llvm"}}, headers=headers)
    assert resp.status_code == 201, resp.text
    return str(resp.json()["id"]), headers


def _input(n: int, **kw: Any) -> MeasureInput:
    return MeasureInput(trial_id=f"trial-{n}", workload_key="matmul-work",
                        workload_spec={"op": "matmul", "shape": [16, 16, 16]},
                        target={"kind": "llvm"}, trace_json="[]",
                        context={"job_id": kw.pop("job_id", "job-a"), "cand_hash": f"{n:016x}"},
                        **kw)


def _enqueue(ctx: Any, *raw: str) -> list[str]:
    return [streams.enqueue(ctx.sync_redis, ctx.keys.measure(DEV), {"input": x}) for x in raw]


def _call(app: Any, worker_id: str, action: str, headers: dict[str, str],
          **body: Any) -> Any:
    resp = app.post(f"/v1/workers/{worker_id}/{action}", json=body, headers=headers)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _pending(ctx: Any) -> dict[str, str]:
    """entry id -> the consumer (worker id) holding it."""
    rows = ctx.sync_redis.xpending_range(ctx.keys.measure(DEV), Keys.WORKERS_GROUP, min="-",
                                         max="+", count=100)
    return {str(r["message_id"]): str(r["consumer"]) for r in rows}


# --------------------------------------------------------------------------- the protocol
def test_lease_hands_out_checked_inputs_only(app: Any) -> None:
    ctx = app.app.state.ctx
    wid, headers = _register(app, "w1")
    good = _input(0)
    mark_cancelled(ctx.sync_redis, ctx.keys, "job-gone")
    ids = _enqueue(ctx, good.to_json(), "not json", _input(1, artifact="/tmp/x.so").to_json(),
                   json.dumps({**json.loads(good.to_json()), "options": {"repeats": "5"}}),
                   _input(2, job_id="job-gone").to_json())
    entries = _call(app, wid, "lease", headers, max=5, wait_s=0)["entries"]
    assert [(e["entry_id"], e["deliveries"]) for e in entries] == [(ids[0], 1)]
    assert MeasureInput.from_json(json.dumps(entries[0]["input"])) == good
    dead = ctx.sync_redis.xrange(ctx.keys.dead(DEV))
    assert len(dead) == 3 and all("not a valid MeasureInput" in f["reason"] for _, f in dead)
    assert "artifact" in dead[1][1]["reason"] and "options.repeats" in dead[2][1]["reason"]
    assert _pending(ctx) == {ids[0]: wid}  # the cancelled job's entry was acknowledged
    assert ctx.sync_redis.xlen(ctx.keys.measure(DEV)) == 1
    assert _call(app, wid, "lease", headers, max=5, wait_s=0)["entries"] == []


def test_lease_waits_for_a_new_entry(app: Any) -> None:
    ctx = app.app.state.ctx
    wid, headers = _register(app, "w1")
    timer = threading.Timer(0.5, _enqueue, args=(ctx, _input(0).to_json()))
    t0 = time.monotonic()
    timer.start()
    try:
        entries = _call(app, wid, "lease", headers, max=1, wait_s=8)["entries"]
    finally:
        timer.join()
    assert len(entries) == 1 and 0.4 < time.monotonic() - t0 < 5


def test_renew_ack_and_dead_letter_act_only_on_the_workers_own_entries(app: Any) -> None:
    ctx = app.app.state.ctx
    a, ha = _register(app, "a")
    b, hb = _register(app, "b")
    e1, e2 = _enqueue(ctx, _input(1).to_json(), _input(2).to_json())
    assert [e["entry_id"] for e in _call(app, a, "lease", ha, max=1, wait_s=0)["entries"]] == [e1]
    assert [e["entry_id"] for e in _call(app, b, "lease", hb, max=1, wait_s=0)["entries"]] == [e2]
    # b cannot keep, acknowledge or drop a's entry
    assert _call(app, b, "renew", hb, entry_ids=[e1, e2])["entry_ids"] == [e2]
    assert _call(app, b, "ack", hb, entry_ids=[e1])["entry_ids"] == []
    assert _call(app, b, "dead-letter", hb, entry_ids=[e1], reason="x")["entry_ids"] == []
    assert _pending(ctx) == {e1: a, e2: b}
    # a lease outlives its holder's silence while renewed
    for _ in range(4):
        time.sleep(0.15)
        assert _call(app, a, "renew", ha, entry_ids=[e1])["entry_ids"] == [e1]
        assert _call(app, b, "renew", hb, entry_ids=[e2])["entry_ids"] == [e2]
    assert _call(app, b, "lease", hb, max=2, wait_s=0)["entries"] == []  # nothing to reclaim
    assert _call(app, a, "ack", ha, entry_ids=[e1, e1, "1-0"])["entry_ids"] == [e1]
    assert _call(app, b, "dead-letter", hb, entry_ids=[e2], reason="rejected")["entry_ids"] == [e2]
    assert _pending(ctx) == {} and ctx.sync_redis.xlen(ctx.keys.measure(DEV)) == 0
    ((_, dead),) = ctx.sync_redis.xrange(ctx.keys.dead(DEV))
    assert dead["reason"] == f"worker {b}: rejected"
    ((_, lost),) = ctx.sync_redis.xrange(ctx.keys.lost("job-a"))
    assert lost["trial_id"] == "trial-2"


def test_an_abandoned_entry_is_reclaimed_then_dead_lettered(app: Any) -> None:
    ctx = app.app.state.ctx
    a, ha = _register(app, "a")
    b, hb = _register(app, "b")
    (e1,) = _enqueue(ctx, _input(1).to_json())
    assert len(_call(app, a, "lease", ha, max=1, wait_s=0)["entries"]) == 1
    time.sleep(0.4)  # a stops renewing: past the lease (0.3 s), b takes it over
    (got,) = _call(app, b, "lease", hb, max=1, wait_s=0)["entries"]
    assert (got["entry_id"], got["deliveries"]) == (e1, 2)
    assert _call(app, a, "renew", ha, entry_ids=[e1])["entry_ids"] == []  # a lost it
    assert _call(app, a, "ack", ha, entry_ids=[e1])["entry_ids"] == []
    time.sleep(0.4)  # b dies too: a third delivery is over max_deliveries (2)
    assert _call(app, a, "lease", ha, max=1, wait_s=0)["entries"] == []
    ((_, dead),) = ctx.sync_redis.xrange(ctx.keys.dead(DEV))
    assert dead["deliveries"] == "3" and "max 2" in dead["reason"]
    assert _pending(ctx) == {}


def test_a_worker_token_acts_only_as_its_own_worker(app: Any) -> None:
    ctx = app.app.state.ctx
    a, ha = _register(app, "a")
    b, hb = _register(app, "b")
    (e1,) = _enqueue(ctx, _input(1).to_json())
    assert len(_call(app, a, "lease", ha, max=1, wait_s=0)["entries"]) == 1
    for action, body in (("lease", {"max": 1, "wait_s": 0}), ("renew", {"entry_ids": [e1]}),
                         ("ack", {"entry_ids": [e1]}),
                         ("dead-letter", {"entry_ids": [e1], "reason": "x"})):
        resp = app.post(f"/v1/workers/{a}/{action}", json=body, headers=hb)
        assert resp.status_code == 403, resp.text
        assert resp.headers["content-type"] == "application/problem+json"
        assert resp.json()["code"] == "forbidden"
    assert _pending(ctx) == {e1: a}
    admin = _bearer(create_token(ctx.store, "admin", "ops"))
    assert _call(app, a, "ack", admin, entry_ids=[e1])["entry_ids"] == [e1]  # admin acts as any


# --------------------------------------------------------------------------- a real farm
def _worker_env(farm: Farm) -> dict[str, str]:
    """The test's environment without any TUNEFARM_ setting, plus the worker's token: no
    database URL, no Redis URL."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEFARM_")}
    return {**env, "TUNEFARM_TOKEN": farm.worker_token,
            "TUNEFARM_DATA_DIR": str(farm.workdir / "worker-data")}


@pytest.mark.slow
def test_a_worker_with_only_the_api_and_a_token_completes_a_job(
        pg_url: str, passworded_redis: str, tmp_path: Path) -> None:
    anonymous = redis.Redis.from_url(passworded_redis.replace(":pw@", ""),
                                     socket_connect_timeout=2)
    with pytest.raises(redis.AuthenticationError):  # the password is required
        anonymous.ping()
    anonymous.close()
    _reset_pg(pg_url)
    farm = Farm(db_url=pg_url, redis_url=passworded_redis, workdir=tmp_path)
    try:
        farm.start_api()
        farm.start_tuner()
        with open(tmp_path / "solo.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tuner", "worker", "--device-key", "e2e", "--target",
                 json.dumps(TARGET), "--name", "solo", "--api", farm.api_url],
                env=_worker_env(farm), stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, cwd=str(ROOT))
        farm.procs["solo"] = proc
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
        assert not [v for v in environ if v.startswith((b"TUNEFARM_DATABASE", b"TUNEFARM_REDIS"))]

        client = farm.client()
        job = client.submit_job({"workload": {"op": "matmul", "shape": [64, 64, 64]},
                                 "target": TARGET, "device_key": "e2e", "trials": 8,
                                 "batch_size": 4})
        deadline = time.monotonic() + 120
        while client.get_job(job["id"])["state"] not in ("SUCCEEDED", "FAILED", "CANCELLED"):
            assert time.monotonic() < deadline, f"not finished in 120 s\n{farm.logs()}"
            assert proc.poll() is None, farm.logs()
            time.sleep(0.5)
        final = client.get_job(job["id"])
        assert final["state"] == "SUCCEEDED" and final["trials_done"] == 8, farm.logs()
        (worker,) = farm.client(farm.admin_token).list_workers()
        assert worker["name"] == "solo"
        store = Store(pg_url)
        try:
            recs = store.records(job_id=job["id"])
        finally:
            store.close()
        assert len(recs) == 8 and all(r.invalidity is Invalidity.OK for r in recs), \
            [r.error_msg for r in recs]
        assert {r.worker for r in recs} == {worker["id"]}
        proc.send_signal(signal.SIGTERM)  # drains and exits 0
        assert proc.wait(timeout=60) == 0, farm.logs()
    finally:
        farm.stop()
