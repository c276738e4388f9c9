"""Fixtures of the API tests: an app on the real PostgreSQL (a fresh schema per test) and Redis
(a random key prefix per test), tokens of each scope, and helpers to fake a measured trial."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

MATMUL = {"op": "matmul", "shape": [128, 128, 128]}
SUBMIT = {"workload": MATMUL, "target": "host", "trials": 16}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # the API suite keeps every test short: a hung stream must fail, not stall the run
    for item in items:
        if "tests/api/" in str(item.fspath).replace("\\", "/") and not item.get_closest_marker(
                "timeout"):
            item.add_marker(pytest.mark.timeout(60))


@pytest.fixture
def api_settings(db_url: str, redis_url: str, redis_prefix: str) -> Any:
    from tuner.core.config import Settings

    return Settings(database_url=db_url, redis_url=redis_url, redis_prefix=redis_prefix,
                    heartbeat_s=1.0)


@pytest.fixture
def client(api_settings: Any) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    from api.app import create_app

    with TestClient(create_app(api_settings)) as c:
        yield c


@pytest.fixture
def ctx(client: Any) -> Any:
    """The running app's ApiContext (store, redis, keys)."""
    return client.app.state.ctx


@pytest.fixture
def tokens(ctx: Any) -> dict[str, str]:
    from tuner.db.tokens import create_token

    return {scope: create_token(ctx.store, scope, name=f"test-{scope}")
            for scope in ("user", "worker", "admin")}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def user(tokens: dict[str, str]) -> dict[str, str]:
    return bearer(tokens["user"])


@pytest.fixture
def worker(tokens: dict[str, str]) -> dict[str, str]:
    return bearer(tokens["worker"])


@pytest.fixture
def admin(tokens: dict[str, str]) -> dict[str, str]:
    return bearer(tokens["admin"])


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[Any]:
    import redis

    r = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=5)
    yield r
    r.close()


@pytest.fixture
def submit_body() -> dict[str, Any]:
    """The minimal job request (a fresh copy per test)."""
    return json.loads(json.dumps(SUBMIT))


@pytest.fixture
def submit(client: Any) -> Callable[..., dict[str, Any]]:
    """submit(headers, body=None) -> the job of a 202 POST /v1/jobs."""

    def run(headers: dict[str, str], body: dict[str, Any] | None = None,
            **kw: Any) -> dict[str, Any]:
        resp = client.post("/v1/jobs", json=body or SUBMIT, headers=headers, **kw)
        assert resp.status_code == 202, resp.text
        out: dict[str, Any] = resp.json()
        return out

    return run


POSTING_WORKERS = ("w", "w1")  # the worker ids the API tests post results as (`result_for`)


@pytest.fixture
def result_for(ctx: Any, tokens: dict[str, str]) -> Callable[..., dict[str, Any]]:
    """result_for(job, latency_s=..., invalidity=...) -> a worker's result post body, for a
    trial issued to the job's device key. The workers "w" and "w1" exist (registered with the
    `worker` token, on that device key) so tests can post as them."""
    from tuner.db import tables as m
    from tuner.db.tokens import verify_token

    token = verify_token(ctx.store, tokens["worker"])
    assert token is not None

    def make(job: dict[str, Any], **kw: Any) -> dict[str, Any]:
        j = ctx.store.get_job(job["id"])
        tref = ctx.store.get_target(j.target_id)
        with ctx.store.session() as s:
            for wid in POSTING_WORKERS:
                if s.get(m.Worker, wid) is None:
                    s.add(m.Worker(id=wid, name=wid, device_key=tref.device_key,
                                   target_json=tref.target_json, capabilities_json="{}",
                                   tvm_version="test", hostname="test", state="idle",
                                   measured=0, failures=0, infra_failures=0,
                                   registered_at=m.utcnow(), last_seen_at=m.utcnow(),
                                   token_id=token.token_id))
        return result_body(ctx, job, **kw)

    return make


@pytest.fixture
def make_result() -> Callable[..., dict[str, Any]]:
    """make_result(ctx, job, **kw): result_for for another app's context (e.g. live_server);
    the trial is issued, posting workers are not made."""
    return result_body


def result_body(ctx: Any, job: dict[str, Any], *, latency_s: float | None = 1e-3,
                invalidity: str = "ok", trial_id: str | None = None,
                trace_json: str | None = None, issue: bool = True,
                device_key: str | None = None,
                knobs: dict[str, Any] | None = None) -> dict[str, Any]:
    """A worker's result post for `job`, with a real, replayable trace of its workload (and
    the candidate's `knobs` in its context, when given); its trial is issued
    (`tuner.db.trials.issue`) to `device_key` (default: the job's) unless `issue` is False."""
    from tuner.db import trials
    from tuner.measure import Invalidity, MeasureInput, MeasureResult

    j = ctx.store.get_job(job["id"])
    trial_id = trial_id or uuid.uuid4().hex
    inp = MeasureInput(
        trial_id=trial_id, workload_key=job["workload_key"], workload_spec=job["workload"],
        target=job["target"], trace_json=trace_json or trivial_trace(job["workload"]),
        context={"job_id": job["id"], "workload_id": j.workload_id, "target_id": j.target_id,
                 "space": job["space"], "cand_hash": uuid.uuid4().hex[:16],
                 "decisions": [], "features_b64": None, "tvm_version": "test",
                 **({"knobs": knobs} if knobs is not None else {})})
    if issue:
        dkey = device_key or ctx.store.get_target(j.target_id).device_key
        trials.issue(ctx.store, [inp], dkey, ttl_s=600)
    lat = (latency_s, latency_s * 1.01, latency_s * 0.99) if latency_s else ()
    res = MeasureResult(trial_id=trial_id, invalidity=Invalidity(invalidity), latencies_s=lat,
                        error_msg=None if invalidity == "ok" else "boom")
    return {"input": json.loads(inp.to_json()), "result": json.loads(res.to_json())}


def confirmation_body(ctx: Any, body: dict[str, Any], *, latency_s: float | None = None,
                      invalidity: str = "ok") -> dict[str, Any]:
    """The post of the confirmation of the result `body` (its trial issued as the tuner's
    `RemoteMeasurer` issues it: the same input, `<trial>-confirm`, context `confirms`), with
    `latency_s` (default: the original's median) or a failure."""
    from tuner.db import trials
    from tuner.measure import Invalidity, MeasureInput, MeasureResult
    from tuner.measure.remote import confirmation_of

    inp = MeasureInput.from_json(json.dumps(body["input"]))
    cinp = confirmation_of(inp)
    issued = trials.issued(ctx.store, inp.trial_id)
    assert issued is not None
    trials.issue(ctx.store, [cinp], issued.device_key, ttl_s=600, avoid=issued.holder)
    lat = latency_s or sorted(body["result"]["latencies_s"])[1]
    res = MeasureResult(trial_id=cinp.trial_id, invalidity=Invalidity(invalidity),
                        latencies_s=(lat, lat * 1.01, lat * 0.99) if invalidity == "ok" else (),
                        error_msg=None if invalidity == "ok" else "boom")
    return {"input": json.loads(cinp.to_json()), "result": json.loads(res.to_json())}


@pytest.fixture
def confirm(ctx: Any, client: Any, tokens: dict[str, str]) -> Callable[..., dict[str, Any]]:
    """confirm(body, latency_s=None, invalidity="ok", as_worker="w") -> the record of the
    confirmation of the posted result `body`, posted by another worker (so GET /v1/best
    serves the original, at the slower of the two medians)."""

    def run(body: dict[str, Any], *, as_worker: str = "w", **kw: Any) -> dict[str, Any]:
        post = confirmation_body(ctx, body, **kw)
        resp = client.post(f"/v1/workers/{as_worker}/results", json=post,
                           headers=bearer(tokens["worker"]))
        assert resp.status_code == 200, resp.text
        out: dict[str, Any] = resp.json()
        return out

    return run


_TRACES: dict[str, str] = {}


def trivial_trace(spec: dict[str, Any]) -> str:
    """The trace of an unscheduled schedule of the workload (replays anywhere)."""
    from tuner.core import tvm_api as tv
    from tuner.workloads import parse_spec

    key = json.dumps(spec, sort_keys=True)
    if key not in _TRACES:
        _TRACES[key] = tv.trace_to_json(tv.Schedule(parse_spec(spec).mod()).trace)
    return _TRACES[key]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def live_server(api_settings: Any) -> Iterator[tuple[str, Any]]:
    """The app under a real uvicorn in a background thread: (base_url, app)."""
    import uvicorn

    from api.app import create_app

    app = create_app(api_settings)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="on", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            pytest.fail("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(timeout=15)
