"""/v1/workers: register, heartbeat, list, and idempotent result posts."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)


def _register(client: Any, worker: dict[str, str], **over: Any) -> Any:
    from tuner.core import tvm_api as tv

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
    assert "redis_prefix" not in reg  # workers never see Redis
    hb = client.post(f"/v1/workers/{reg['id']}/heartbeat", headers=worker,
                     json={"state": "busy", "measured": 7, "failures": 1, "infra_failures": 0})
    assert hb.status_code == 200, hb.text
    assert hb.json()["state"] == "busy" and hb.json()["measured"] == 7
    listed = client.get("/v1/workers", headers=user).json()
    assert [(w["id"], w["name"], w["state"]) for w in listed] == [(reg["id"], "board-1", "busy")]
    assert listed[0]["target"]["kind"] == "llvm" and listed[0]["capabilities"] == {"threads": 2}


def test_worker_responses_carry_every_declared_field(client: Any, worker: dict[str, str],
                                                     user: dict[str, str]) -> None:
    """GET /v1/workers and the heartbeat answer with exactly the fields WorkerPublic declares,
    and WorkerPublic declares every field of the row (and the computed throughput)."""
    import dataclasses

    from api.schemas import WorkerPublic
    from tuner.db.workers import WorkerRow

    declared = set(WorkerPublic.model_fields)
    assert {f.name for f in dataclasses.fields(WorkerRow)} | {"throughput_per_min"} == declared
    reg = _register(client, worker).json()
    hb = client.post(f"/v1/workers/{reg['id']}/heartbeat", headers=worker,
                     json={"state": "busy", "measured": 6, "failures": 0, "infra_failures": 0})
    assert set(hb.json()) == declared
    listed = client.get("/v1/workers", headers=user).json()
    assert [set(w) for w in listed] == [declared]
    throughput = listed[0]["throughput_per_min"]
    assert isinstance(throughput, float) and 0 < throughput <= 6 * 60  # 6 in at least 1 s


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
        ("record", {"trial_id": tid, "invalidity": "ok", "latency_s": pytest.approx(1e-3),
                    "worker": "w1", "worker_name": "w1",
                    "build_s": body["result"].get("build_s"),
                    "predicted_s": None, "knobs": {}})]


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


def test_a_worker_is_bound_to_the_token_that_registered_it(
        client: Any, ctx: Any, worker: dict[str, str], admin: dict[str, str],
        user: dict[str, str], submit: Callable[..., dict[str, Any]],
        make_result: Callable[..., dict[str, Any]]) -> None:
    """Another worker token can neither heartbeat nor post results as the worker (403); an
    admin can; the record names the worker that posted."""
    from tests.api.conftest import bearer
    from tuner.db.tokens import create_token

    reg = _register(client, worker).json()
    other = bearer(create_token(ctx.store, "worker", name="worker-2"))
    hb = {"state": "idle"}
    resp = client.post(f"/v1/workers/{reg['id']}/heartbeat", json=hb, headers=other)
    assert resp.status_code == 403 and resp.json()["code"] == "forbidden"
    assert client.post(f"/v1/workers/{reg['id']}/heartbeat", json=hb,
                       headers=admin).status_code == 200
    job = submit(user)
    body = make_result(ctx, job)
    resp = client.post(f"/v1/workers/{reg['id']}/results", json=body, headers=other)
    assert resp.status_code == 403 and resp.json()["code"] == "forbidden"
    assert ctx.store.count_records() == 0
    resp = client.post(f"/v1/workers/{reg['id']}/results", json=body, headers=worker)
    assert resp.status_code == 200 and resp.json()["inserted"] is True
    rec = ctx.store.record(body["input"]["trial_id"])
    assert rec is not None and rec.worker == reg["id"]
    resp = client.post("/v1/workers/not%20an%20id/heartbeat", json=hb, headers=worker)
    assert resp.status_code == 422 and resp.json()["code"] == "validation_error"


def test_a_failed_attempt_is_recorded_without_using_the_trial(
        client: Any, ctx: Any, worker: dict[str, str], user: dict[str, str],
        submit: Callable[..., dict[str, Any]], result_for: Callable[..., dict[str, Any]]) -> None:
    """What the agent posts when its board died (worker_lost, under `<id[:20]>-lost-<hex>`) is
    recorded; the trial's real result is still accepted afterwards."""
    job = submit(user)
    real = result_for(job, latency_s=1e-3)
    tid = real["input"]["trial_id"]
    attempt = f"{tid[:20]}-lost-0123abcd"
    lost = _mutate(_mutate(_mutate(real, "input.trial_id", attempt), "result.trial_id", attempt),
                   "result.invalidity", "worker_lost")
    lost["result"].update(latencies_s=[], error_msg="the board died")
    resp = client.post("/v1/workers/w1/results", json=lost, headers=worker)
    assert resp.status_code == 200 and resp.json()["inserted"] is True, resp.text
    resp = client.post("/v1/workers/w1/results", json=real, headers=worker)
    assert resp.status_code == 200 and resp.json()["inserted"] is True, resp.text
    assert sorted(r.trial_id for r in ctx.store.records(job_id=job["id"])) == sorted([tid, attempt])


def test_only_the_worker_holding_a_trials_lease_may_answer_it(
        client: Any, ctx: Any, user: dict[str, str], worker: dict[str, str],
        submit: Callable[..., dict[str, Any]], result_for: Callable[..., dict[str, Any]]) -> None:
    from tuner.db import trials
    from tuner.queue import streams

    job = submit(user)
    body = result_for(job, latency_s=1e-3)  # issued to the job's device key; w and w1 exist
    tid = body["input"]["trial_id"]
    # the trial's entry, as the tuner enqueues it, leased through the API by w
    stream = ctx.keys.measure(ctx.store.get_target(ctx.store.get_job(job["id"]).target_id)
                              .device_key)
    streams.enqueue(ctx.sync_redis, stream, {"input": json.dumps(body["input"])})
    leased = client.post("/v1/workers/w/lease", json={"max": 1, "wait_s": 0}, headers=worker)
    assert [e["input"]["trial_id"] for e in leased.json()["entries"]] == [tid], leased.text
    assert trials.issued(ctx.store, tid).holder == "w"  # type: ignore[union-attr]
    # w1, of the same device key and token, answers w's trial: refused, nothing written
    stolen = client.post("/v1/workers/w1/results", json=body, headers=worker)
    assert stolen.status_code == 409, stolen.text
    assert stolen.headers["content-type"] == "application/problem+json"
    assert stolen.json()["code"] == "not_lease_holder" and ctx.store.record(tid) is None
    ok = client.post("/v1/workers/w/results", json=body, headers=worker)
    assert ok.status_code == 200 and ok.json()["inserted"] is True
    rec = ctx.store.record(tid)
    assert rec is not None and rec.worker == "w"


def test_a_confirmation_goes_to_another_live_worker(
        client: Any, ctx: Any, user: dict[str, str], worker: dict[str, str],
        submit: Callable[..., dict[str, Any]], result_for: Callable[..., dict[str, Any]]
        ) -> None:
    """The confirmation of a trial w1 measured is held back from w1 while w is live (parked),
    and w's next lease takes it; with w gone, w1 measures it itself."""
    from tests.api.conftest import confirmation_body
    from tuner.db import tables as m
    from tuner.queue import streams

    job = submit(user)
    dkey = ctx.store.get_target(ctx.store.get_job(job["id"]).target_id).device_key
    stream = ctx.keys.measure(dkey)

    def lease(wid: str) -> list[str]:
        got = client.post(f"/v1/workers/{wid}/lease", json={"max": 4, "wait_s": 0},
                          headers=worker)
        assert got.status_code == 200, got.text
        return [e["input"]["trial_id"] for e in got.json()["entries"]]

    for alive in (True, False):
        body = result_for(job, latency_s=1e-3)
        streams.enqueue(ctx.sync_redis, stream, {"input": json.dumps(body["input"])})
        assert lease("w1") == [body["input"]["trial_id"]]
        assert client.post("/v1/workers/w1/results", json=body, headers=worker).status_code == 200
        conf = confirmation_body(ctx, body)  # issued with avoid = w1, the first trial's holder
        cid = conf["input"]["trial_id"]
        with ctx.store.session() as s:  # w is live (seen now) or gone (seen an hour ago)
            s.get(m.Worker, "w").last_seen_at = m.utcnow() - (
                dt.timedelta(0) if alive else dt.timedelta(hours=1))
        streams.enqueue(ctx.sync_redis, stream, {"input": json.dumps(conf["input"]),
                                                 "avoid": "w1"})
        if alive:
            assert lease("w1") == []  # parked for w
            assert ctx.sync_redis.hgetall(ctx.keys.parked(dkey))
            assert lease("w") == [cid]
            assert not ctx.sync_redis.hgetall(ctx.keys.parked(dkey))
            poster = "w"
        else:
            assert lease("w1") == [cid]  # no other live worker: a fresh sandbox of w1
            poster = "w1"
        done = client.post(f"/v1/workers/{poster}/results", json=conf, headers=worker)
        assert done.status_code == 200, done.text
        assert ctx.store.record(body["input"]["trial_id"]).trust == "confirmed"


def test_a_latency_past_the_device_keys_declared_peak_is_implausible(
        client: Any, ctx: Any, user: dict[str, str], worker: dict[str, str],
        submit: Callable[..., dict[str, Any]], result_for: Callable[..., dict[str, Any]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With a peak declared for the device key (TUNEFARM_PEAK_GFLOPS), a result above 16x it is
    a 422 naming that peak, far below the global bound; one under it is stored."""
    from api.results import PEAK_MARGIN

    job = submit(user)
    dkey = ctx.store.get_target(ctx.store.get_job(job["id"]).target_id).device_key
    monkeypatch.setattr(ctx, "settings", ctx.settings.model_copy(
        update={"peak_gflops": {dkey: 100.0}}))
    flops = 2 * 128**3
    too_fast = result_for(job, latency_s=flops / (100e9 * PEAK_MARGIN * 3))  # 3x past the bound
    resp = client.post("/v1/workers/w1/results", json=too_fast, headers=worker)
    assert resp.status_code == 422 and resp.json()["code"] == "implausible_latency", resp.text
    assert "100 GFLOPS declared for device key" in resp.json()["detail"]
    assert ctx.store.record(too_fast["input"]["trial_id"]) is None
    fast = result_for(job, latency_s=flops / (100e9 * PEAK_MARGIN / 3))  # within it
    assert client.post("/v1/workers/w1/results", json=fast, headers=worker).status_code == 200
