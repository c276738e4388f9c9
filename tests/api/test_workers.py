"""/v1/workers: register, heartbeat, list, and idempotent result posts."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)


def _register(client: Any, worker: dict[str, str], **over: Any) -> Any:
    from tuner import tvm_api as tv

    body = {"name": "board-1", "device_key": "local", "target": tv.host_target_dict(),
            "capabilities": {"threads": 2}, "tvm_version": "0.27.0", "hostname": "h1", **over}
    return client.post("/v1/workers", json=body, headers=worker)


def test_register_heartbeat_list(client: Any, api_settings: Any, worker: dict[str, str],
                                 user: dict[str, str]) -> None:
    resp = _register(client, worker)
    assert resp.status_code == 201, resp.text
    reg = resp.json()
    assert reg["lease_s"] == api_settings.lease_s
    assert reg["heartbeat_s"] == api_settings.heartbeat_s
    assert reg["max_deliveries"] == api_settings.max_deliveries
    assert reg["redis_prefix"] == api_settings.redis_prefix
    hb = client.post(f"/v1/workers/{reg['id']}/heartbeat", headers=worker,
                     json={"state": "busy", "measured": 7, "failures": 1, "infra_failures": 0})
    assert hb.status_code == 200, hb.text
    assert hb.json()["state"] == "busy" and hb.json()["measured"] == 7
    listed = client.get("/v1/workers", headers=user).json()
    assert [(w["id"], w["name"], w["state"]) for w in listed] == [(reg["id"], "board-1", "busy")]
    assert listed[0]["target"]["kind"] == "llvm" and listed[0]["capabilities"] == {"threads": 2}


def test_heartbeat_problems(client: Any, worker: dict[str, str]) -> None:
    resp = client.post("/v1/workers/nope/heartbeat", json={"state": "idle"}, headers=worker)
    assert resp.status_code == 404 and resp.json()["code"] == "not_found"
    reg = _register(client, worker).json()
    bad = client.post(f"/v1/workers/{reg['id']}/heartbeat", json={"state": "asleep"},
                      headers=worker)
    assert bad.status_code == 422 and bad.json()["code"] == "validation_error"


def test_register_problems(client: Any, worker: dict[str, str]) -> None:
    bad = _register(client, worker, target={"kind": "llvm", "mcpu": "notacpu"})
    assert bad.status_code == 422 and bad.json()["code"] == "invalid_target"
    bad = _register(client, worker, device_key="has space")
    assert bad.status_code == 422 and bad.json()["code"] == "validation_error"


def test_result_post_is_idempotent(client: Any, ctx: Any, user: dict[str, str],
                                   worker: dict[str, str], redis_client: Any,
                                   submit: Callable[..., dict[str, Any]],
                                   result_for: Callable[..., dict[str, Any]]) -> None:
    job = submit(user)
    body = result_for(job, latency_s=1e-3)
    tid = body["input"]["trial_id"]
    first = client.post("/v1/workers/w1/results", json=body, headers=worker)
    again = client.post("/v1/workers/w1/results", json=body, headers=worker)
    assert first.status_code == again.status_code == 200
    assert first.json() == {"trial_id": tid, "inserted": True}
    assert again.json() == {"trial_id": tid, "inserted": False}
    rec = ctx.store.record(tid)
    assert rec is not None and rec.job_id == job["id"] and rec.worker == "w1"
    assert rec.median_s == pytest.approx(1e-3) and rec.invalidity == "ok"
    assert len(ctx.store.records(job_id=job["id"])) == 1
    events = [(f["event"], json.loads(f["data"]))
              for _, f in redis_client.xrange(ctx.keys.events(job["id"]))]
    assert [e for e in events if e[0] == "record"] == [
        ("record", {"trial_id": tid, "invalidity": "ok", "latency_s": pytest.approx(1e-3)})]


def _mutate(body: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(body))
    *parents, last = path.split(".")
    node = out
    for p in parents:
        node = node[p]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return out


@pytest.mark.parametrize("path, value", [
    ("result.trial_id", "other"),
    ("input.context", None),
    ("input.context.workload_id", 999999),
    ("input.context.target_id", 999999),
    ("input.context.job_id", "0" * 32),
    ("input.context.cand_hash", ...),
    ("result.invalidity", "exploded"),
    ("result.latencies_s", ["fast"]),
    ("input.trace_json", ...),
    ("input.surprise", 1),
])
def test_bad_result_is_422(client: Any, ctx: Any, user: dict[str, str], worker: dict[str, str],
                           submit: Callable[..., dict[str, Any]],
                           result_for: Callable[..., dict[str, Any]], path: str, value: Any
                           ) -> None:
    job = submit(user)
    body = _mutate(result_for(job), path, value)
    resp = client.post("/v1/workers/w1/results", json=body, headers=worker)
    assert resp.status_code == 422, resp.text
    assert resp.json()["code"] == "validation_error" and "Traceback" not in resp.text
    assert ctx.store.records(job_id=job["id"]) == []
