"""api.client.Client against the app served by a real uvicorn (in a thread of this process)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

PG = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
SUBMIT = {"workload": {"op": "matmul", "shape": [128, 128, 128]}, "target": "host", "trials": 16}


@pytest.fixture
def live(live_server: tuple[str, Any]) -> tuple[str, Any, dict[str, str]]:
    """(base_url, ApiContext, tokens by scope)."""
    from tuner.db.tokens import create_token

    url, app = live_server
    ctx = app.state.ctx
    return url, ctx, {s: create_token(ctx.store, s) for s in ("user", "worker")}


@PG
def test_jobs_and_events(live: tuple[str, Any, dict[str, str]], redis_client: Any) -> None:
    from api.client import Client
    from tuner.queue import events

    url, ctx, tokens = live
    with Client(url, tokens["user"]) as c:
        job = c.submit_job(SUBMIT, idempotency_key="k1")
        assert c.submit_job(SUBMIT, idempotency_key="k1")["id"] == job["id"]
        assert c.get_job(job["id"])["state"] == "QUEUED"
        assert [j["id"] for j in c.list_jobs(state="QUEUED")["items"]] == [job["id"]]

        def tuner() -> None:  # what the tuner process publishes, while the client listens
            time.sleep(0.3)
            events.publish(redis_client, ctx.keys, job["id"], "state", {"state": "RUNNING"})
            events.publish(redis_client, ctx.keys, job["id"], "progress", {"done": 1, "total": 16})
            events.publish(redis_client, ctx.keys, job["id"], "state", {"state": "SUCCEEDED"})

        t = threading.Thread(target=tuner)
        t.start()
        got = list(c.events(job["id"]))
        t.join()
        assert [(e[1], e[2].get("state", e[2].get("done"))) for e in got] == [
            ("state", "QUEUED"), ("state", "RUNNING"), ("progress", 1), ("state", "SUCCEEDED")]
        # resuming after the second event replays only what followed it
        assert [e[0] for e in c.events(job["id"], last_event_id=got[1][0])] == \
            [e[0] for e in got[2:]]
        assert c.records(job["id"]) == {"items": [], "next_cursor": None}
        assert [s["name"] for s in c.spaces("matmul")][-1] == "auto"


@PG
def test_cancel_and_errors(live: tuple[str, Any, dict[str, str]]) -> None:
    from api.client import ApiError, Client

    url, _, tokens = live
    with Client(url, tokens["user"]) as c:
        job = c.submit_job(SUBMIT)
        assert c.cancel_job(job["id"])["state"] == "CANCELLED"
        with pytest.raises(ApiError) as err:
            c.get_job("missing")
        assert (err.value.status, err.value.code) == (404, "not_found")
        with pytest.raises(ApiError) as err:
            c.submit_job({**SUBMIT, "workload": {"op": "nope"}})
        assert (err.value.status, err.value.code) == (422, "invalid_spec")
        with pytest.raises(ApiError) as err:
            c.best(SUBMIT["workload"])
        assert err.value.code == "not_found"
    with Client(url, tokens["worker"]) as w, pytest.raises(ApiError) as err:
        w.submit_job(SUBMIT)
    assert (err.value.status, err.value.code) == (403, "forbidden")


@PG
def test_worker_calls(live: tuple[str, Any, dict[str, str]],
                      make_result: Callable[..., dict[str, Any]]) -> None:
    from api.client import Client
    from tests.api.conftest import confirmation_body
    from tuner.core import tvm_api as tv
    from tuner.measure import MeasureInput, MeasureResult

    url, ctx, tokens = live
    with Client(url, tokens["user"]) as u, Client(url, tokens["worker"]) as w:
        job = u.submit_job(SUBMIT)
        reg = w.register_worker(name="b1", device_key="local", target=tv.host_target_dict(),
                                tvm_version="0.27", hostname="h")
        assert reg["lease_s"] > 0
        assert w.heartbeat(reg["id"], state="busy", measured=1)["state"] == "busy"
        body = make_result(ctx, job, latency_s=1e-3)
        inp = MeasureInput.from_json(json.dumps(body["input"]))
        res = MeasureResult.from_json(json.dumps(body["result"]))
        assert w.post_result(reg["id"], inp, res) == {"trial_id": inp.trial_id, "inserted": True}
        assert w.post_result(reg["id"], inp, res)["inserted"] is False
        conf = confirmation_body(ctx, body)  # served once a second measurement confirms it
        assert w.post_result(reg["id"], MeasureInput.from_json(json.dumps(conf["input"])),
                             MeasureResult.from_json(json.dumps(conf["result"])))["inserted"]
        best = w.best(SUBMIT["workload"], "host")
        assert best["trial_id"] == inp.trial_id and best["worker"] == reg["id"]
        assert [x["id"] for x in u.list_workers()] == [reg["id"]]
        assert u.records(job["id"])["items"][0]["trial_id"] == inp.trial_id


def test_unreachable_api_is_retried_then_unavailable() -> None:
    import socket

    from api.client import ApiError, Client

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    with Client(f"http://127.0.0.1:{port}", "tf_x", retries=2, backoff_s=0.05) as c, \
            pytest.raises(ApiError) as err:
        c.get_job("x")
    assert (err.value.status, err.value.code) == (0, "unavailable") and err.value.transient
    assert 0.1 <= time.monotonic() - start < 5  # two retries with backoff happened
