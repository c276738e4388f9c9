"""GET /v1/best: the Redis-cached best record, invalidated by a faster result; a worker's
record is served only once a second measurement confirmed it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
MATMUL = {"op": "matmul", "shape": [128, 128, 128]}
SPEC = json.dumps(MATMUL)


def _best(client: Any, headers: dict[str, str], **params: str) -> Any:
    return client.get("/v1/best", params={"workload": SPEC, **params}, headers=headers)


def _post(client: Any, worker: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
    resp = client.post("/v1/workers/w1/results", json=body, headers=worker)
    assert resp.status_code == 200, resp.text
    out: dict[str, Any] = resp.json()
    return out


def test_best_lifecycle(client: Any, ctx: Any, user: dict[str, str], worker: dict[str, str],
                        redis_client: Any, submit: Callable[..., dict[str, Any]],
                        result_for: Callable[..., dict[str, Any]],
                        confirm: Callable[..., Any]) -> None:
    from tuner.db.engine import target_key

    first = _best(client, user)
    assert first.status_code == 404 and first.json()["code"] == "not_found"
    job = submit(user)
    slow = result_for(job, latency_s=2e-3)
    _post(client, worker, slow)
    assert _best(client, user).status_code == 404  # one worker's word is not served
    confirm(slow)
    got = _best(client, user)
    assert got.status_code == 200, got.text  # the cached "none yet" was dropped
    rec = got.json()
    assert rec["trial_id"] == slow["input"]["trial_id"]
    assert rec["latency_s"] == pytest.approx(2e-3) and rec["gflops"] > 0
    assert rec["workload_key"] == job["workload_key"] and rec["workload"] == job["workload"]
    assert isinstance(rec["trace"], list) and isinstance(rec["schedule_python"], str)
    tkey = target_key(ctx.resolver.target("host").json, "local")
    cached = redis_client.get(ctx.keys.best(job["workload_key"], tkey))
    assert json.loads(cached.partition(".")[2])["trial_id"] == rec["trial_id"]

    # a slower or failed record keeps the cache; a faster one replaces it
    _post(client, worker, result_for(job, latency_s=5e-3))
    _post(client, worker, result_for(job, invalidity="run_error", latency_s=None))
    assert redis_client.get(ctx.keys.best(job["workload_key"], tkey)) == cached
    fast = result_for(job, latency_s=1e-3)
    _post(client, worker, fast)
    confirm(fast)
    assert _best(client, user).json()["trial_id"] == fast["input"]["trial_id"]

    # by workload key, and with the target spelled out, it is the same record
    explicit = json.dumps(job["target"])
    by_key = _best(client, user, workload=job["workload_key"], target=explicit)
    assert by_key.status_code == 200 and by_key.json()["trial_id"] == fast["input"]["trial_id"]
    # another device key has no record
    assert _best(client, user, device_key="board-b").status_code == 404


def test_an_entry_written_into_redis_by_another_is_not_served(
        client: Any, ctx: Any, user: dict[str, str], worker: dict[str, str], redis_client: Any,
        submit: Callable[..., dict[str, Any]], result_for: Callable[..., dict[str, Any]],
        confirm: Callable[..., Any]) -> None:
    from tuner.db.engine import target_key

    job = submit(user)
    body = result_for(job, latency_s=1e-3)
    _post(client, worker, body)
    confirm(body)
    real = _best(client, user).json()
    key = ctx.keys.best(job["workload_key"], target_key(ctx.resolver.target("host").json, "local"))
    forged = {**real, "latency_s": 1e-12, "schedule_python": "import os; os.system('id')"}
    for entry in (json.dumps(forged),  # unsigned, as the cache held it before
                  "0" * 64 + "." + json.dumps(forged),  # a made-up signature
                  redis_client.get(key).partition(".")[0] + "." + json.dumps(forged)):  # moved
        redis_client.set(key, entry)
        got = _best(client, user)
        assert got.status_code == 200 and got.json() == real, entry[:80]
        assert "os.system" not in redis_client.get(key)  # overwritten with the signed truth
    # a forged "no record" is not served either
    redis_client.set(key, "null")
    assert _best(client, user).json() == real


def test_best_survives_a_redis_flush_of_its_key(client: Any, ctx: Any, user: dict[str, str],
                                                worker: dict[str, str], redis_client: Any,
                                                submit: Callable[..., dict[str, Any]],
                                                result_for: Callable[..., dict[str, Any]],
                                                confirm: Callable[..., Any]) -> None:
    job = submit(user)
    body = result_for(job, latency_s=1e-3)
    _post(client, worker, body)
    confirm(body)
    assert _best(client, user).status_code == 200
    for key in redis_client.scan_iter(match=ctx.keys.best("*", "*")):
        redis_client.delete(key)
    again = _best(client, user)
    assert again.status_code == 200 and again.json()["trial_id"] == body["input"]["trial_id"]


def test_a_workers_result_is_served_as_posted_without_confirmations(
        client: Any, ctx: Any, user: dict[str, str], worker: dict[str, str],
        submit: Callable[..., Any], result_for: Callable[..., dict[str, Any]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """TUNEFARM_CONFIRM_BEST=0 (a farm whose workers are all trusted): served as posted."""
    monkeypatch.setattr(ctx, "settings", ctx.settings.model_copy(update={"confirm_best": False}))
    job = submit(user)
    body = result_for(job, latency_s=1e-3)
    _post(client, worker, body)
    assert _best(client, user).json()["trust"] == "local"


def test_no_single_worker_sets_a_best(client: Any, ctx: Any, user: dict[str, str],
                                      worker: dict[str, str], submit: Callable[..., Any],
                                      result_for: Callable[..., dict[str, Any]],
                                      confirm: Callable[..., Any]) -> None:
    """A worker's too-fast (but plausible) latency is not served until a second measurement by
    another worker confirms it, and then at the slower of the two medians; a failed second
    measurement refutes it for good; both records are kept."""
    job = submit(user)
    honest = result_for(job, latency_s=1e-3)
    _post(client, worker, honest)
    assert _best(client, user).status_code == 404  # one worker's word is not served
    confirm(honest, latency_s=1.1e-3)
    served = _best(client, user).json()
    assert served["trial_id"] == honest["input"]["trial_id"] and served["trust"] == "confirmed"
    assert served["latency_s"] == pytest.approx(1.1e-3)  # the slower median of the two
    assert served["gflops"] == pytest.approx(2 * 128**3 / 1.1e-3 / 1e9, rel=1e-6)

    liar = result_for(job, latency_s=1e-6)  # w1 claims a 1000x faster kernel
    _post(client, worker, liar)
    assert _best(client, user).json()["trial_id"] == honest["input"]["trial_id"]
    confirm(liar, latency_s=1.05e-3)  # w measures it again: a bit faster than the honest best
    served = _best(client, user).json()
    assert served["trial_id"] == liar["input"]["trial_id"]
    assert served["latency_s"] == pytest.approx(1.05e-3)  # never the liar's 1e-6
    tid = liar["input"]["trial_id"]
    rows = {r.trial_id: r for r in ctx.store.records()}
    assert rows[tid].median_s == pytest.approx(1e-6) and rows[tid].confirmed_s == pytest.approx(
        1.05e-3)  # both samples kept
    assert rows[f"{tid}-confirm"].trust == "confirmation" and rows[f"{tid}-confirm"].confirms == tid
    assert rows[f"{tid}-confirm"].worker == "w" and rows[tid].worker == "w1"
    assert rows[f"{tid}-confirm"].job_id is None  # kept, but none of the job's trials

    refuted = result_for(job, latency_s=5e-4)
    _post(client, worker, refuted)
    confirm(refuted, invalidity="wrong_answer")
    assert _best(client, user).json()["trial_id"] == tid
    assert ctx.store.record(refuted["input"]["trial_id"]).trust == "refuted"
    # the listing shows each record's standing
    listed = client.get(f"/v1/jobs/{job['id']}/records", headers=user).json()
    trusts = {r["trial_id"]: r["trust"] for r in listed["items"]}
    assert trusts[tid] == "confirmed" and trusts[refuted["input"]["trial_id"]] == "refuted"


@pytest.mark.parametrize("params, status, code", [
    ({"target": '{"kind": "llvm", "mcpu": "notacpu"}'}, 422, "invalid_target"),
    ({"target": "cuda -arch=sm_80"}, 422, "invalid_target"),
    ({"workload": '{"op": "matmul", "shape": [8, 8'}, 422, "invalid_spec"),
    ({"workload": '{"op": "nope"}'}, 422, "invalid_spec"),
    ({"workload": "matmul-0000000000000000"}, 404, "not_found"),
    ({"device_key": "bad key!"}, 422, "validation_error"),
])
def test_best_problems(client: Any, user: dict[str, str], params: dict[str, str], status: int,
                       code: str) -> None:
    resp = _best(client, user, **params)
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == "application/problem+json"
    assert resp.json()["code"] == code


def test_best_needs_the_workload(client: Any, user: dict[str, str]) -> None:
    resp = client.get("/v1/best", headers=user)
    assert resp.status_code == 422 and resp.json()["code"] == "validation_error"
