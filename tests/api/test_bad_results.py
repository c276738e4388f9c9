"""Catalogue of forged and bad result posts (POST /v1/workers/{id}/results): each answered with
its documented status and `code` as application/problem+json, and nothing written: no record,
no "record" event, the trial not stamped used, and GET /v1/best unchanged.

Before each case, one legitimate result (1 ms) of job A is posted, so the best exists. Jobs A
and B share a workload and a target; job C has another workload, job D another device key (so
another target row). `mine` is a worker of device key "local" registered with the `worker`
token (the caller unless a case says otherwise), `elsewhere` one of device key "other" with the
same token. A forged result claims 1e-12 s: had it been taken, it would be the new best."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from tests.api.conftest import MATMUL, SUBMIT, bearer, confirmation_body, result_body
from tuner.db import tables as m
from tuner.db.tokens import create_token

pytestmark = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
PROBLEM = "application/problem+json"
FAST = 1e-12
# a trace other than the issued one (which is the unscheduled program's, "[[], []]")
FORGED_TRACE = '[[["GetSBlock", [], ["C", "main"], ["b0"]]], []]'


@dataclass
class Env:
    client: Any
    ctx: Any
    jobs: dict[str, dict[str, Any]]
    workers: dict[str, str]  # name -> worker id
    headers: dict[str, dict[str, str]]  # "worker", "other_worker", "user"

    def body(self, job: str = "A", **kw: Any) -> dict[str, Any]:
        """A result for a fresh trial of `job` (issued to its device key unless issue=False)."""
        kw.setdefault("latency_s", FAST)
        return result_body(self.ctx, self.jobs[job], **kw)


@dataclass
class Post:
    body: dict[str, Any] | str  # a str is sent as raw JSON text
    worker: str = "mine"  # a name in Env.workers, else the literal id
    caller: str = "worker"


def _with(body: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(body))
    *parents, last = path.split(".")
    node = out
    for p in parents:
        node = node[p]
    node[last] = value
    return out


def _latencies(env: Env, values: list[Any]) -> Post:
    return Post(_with(env.body(), "result.latencies_s", values))


def _latency_text(env: Env, token: str) -> Post:
    """A body whose first latency is the bare JSON token (NaN, Infinity, ...)."""
    text = json.dumps(_with(env.body(), "result.latencies_s", [123.0, 1e-3]))
    return Post(text.replace("[123.0, ", f"[{token}, "))


def _expired(env: Env) -> Post:
    body = env.body()
    with env.ctx.store.session() as s:
        s.get(m.IssuedTrial, body["input"]["trial_id"]).expires_at = (
            m.utcnow() - timedelta(seconds=1))
    return Post(body)


def _other_jobs_trial(env: Env) -> Post:
    """Job B's issued trial, posted as a result of job A."""
    return Post(_with(env.body("B"), "input.context.job_id", env.jobs["A"]["id"]))


def _other_workload(env: Env) -> Post:
    body, c = env.body("A"), env.ctx.store.get_job(env.jobs["C"]["id"])
    body = _with(body, "input.context.workload_id", c.workload_id)
    return Post(_with(body, "input.workload_key", env.jobs["C"]["workload_key"]))


def _other_target(env: Env) -> Post:
    d = env.ctx.store.get_job(env.jobs["D"]["id"])
    return Post(_with(env.body("A"), "input.context.target_id", d.target_id))


def _used_trial(env: Env) -> Post:
    """A trial answered with 2 ms, posted again with 1e-12 s."""
    body = env.body(latency_s=2e-3)
    assert env.client.post(f"/v1/workers/{env.workers['mine']}/results", json=body,
                           headers=env.headers["worker"]).json()["inserted"] is True
    return Post(_with(body, "result.latencies_s", [FAST]))


def _lost_attempt(env: Env, *, issue: bool, invalidity: str = "worker_lost") -> Post:
    """A failed attempt `<trial_id[:20]>-lost-<hex>` at a trial (issued or not)."""
    body = env.body(issue=issue, latency_s=None, invalidity=invalidity)
    tid = body["input"]["trial_id"][:20] + "-lost-0a1b"
    return Post(_with(_with(body, "input.trial_id", tid), "result.trial_id", tid))


# (id, forge(env) -> Post, expected_status, expected_code)
CASES: list[tuple[str, Callable[[Env], Post], int, str]] = [
    ("unknown-trial", lambda e: Post(e.body(issue=False)), 409, "unknown_trial"),
    ("expired-trial", _expired, 409, "unknown_trial"),
    ("another-jobs-trial", _other_jobs_trial, 409, "trial_mismatch"),
    ("wrong-workload", _other_workload, 409, "trial_mismatch"),
    ("wrong-target", _other_target, 409, "trial_mismatch"),
    ("wrong-device-key", lambda e: Post(e.body(), worker="elsewhere"), 409, "trial_mismatch"),
    ("issued-to-another-device-key", lambda e: Post(e.body(device_key="other")), 409,
     "trial_mismatch"),
    ("wrong-cand-hash", lambda e: Post(_with(e.body(), "input.context.cand_hash", "f" * 16)),
     409, "trial_mismatch"),
    ("used-trial-different-latency", _used_trial, 409, "trial_used"),
    ("forged-trace", lambda e: Post(_with(e.body(), "input.trace_json", FORGED_TRACE)), 409,
     "trial_mismatch"),
    ("forged-decisions", lambda e: Post(_with(e.body(), "input.context.decisions",
                                              [[0, "SampleCategorical", 1]])), 409,
     "trial_mismatch"),
    ("forged-features", lambda e: Post(_with(e.body(), "input.context.features_b64",
                                             "AACAPwAAgD8=")), 409, "trial_mismatch"),
    ("forged-space", lambda e: Post(_with(e.body(), "input.context.space", "auto")), 409,
     "trial_mismatch"),
    ("forged-tvm-version", lambda e: Post(_with(e.body(), "input.context.tvm_version", "x")),
     409, "trial_mismatch"),
    ("forged-prediction", lambda e: Post(_with(e.body(), "input.context.predicted_s", 1e-3)),
     409, "trial_mismatch"),
    ("forged-knobs", lambda e: Post(_with(e.body(), "input.context.knobs", {"mr": 8})), 409,
     "trial_mismatch"),
    ("knobs-not-an-object", lambda e: Post(_with(e.body(), "input.context.knobs", [8])), 422,
     "validation_error"),
    ("knob-value-an-object", lambda e: Post(_with(e.body(), "input.context.knobs",
                                                  {"mr": {"eval": 1}})), 422, "validation_error"),
    ("knob-name-too-long", lambda e: Post(_with(e.body(), "input.context.knobs",
                                                {"m" * 65: 1})), 422, "validation_error"),
    ("prediction-not-a-number", lambda e: Post(_with(e.body(), "input.context.predicted_s",
                                                     "fast")), 422, "validation_error"),
    ("prediction-negative", lambda e: Post(_with(e.body(), "input.context.predicted_s", -1.0)),
     422, "validation_error"),
    ("lost-attempt-at-an-unissued-trial", lambda e: _lost_attempt(e, issue=False), 409,
     "unknown_trial"),
    ("lost-attempt-id-for-a-run-error",
     lambda e: _lost_attempt(e, issue=True, invalidity="run_error"), 409, "unknown_trial"),
    ("latency-zero", lambda e: _latencies(e, [0.0, 1e-3]), 422, "validation_error"),
    ("latency-negative", lambda e: _latencies(e, [-1e-3]), 422, "validation_error"),
    ("latency-nan", lambda e: _latency_text(e, "NaN"), 422, "validation_error"),
    ("latency-inf", lambda e: _latency_text(e, "Infinity"), 422, "validation_error"),
    ("latency-minus-inf", lambda e: _latency_text(e, "-Infinity"), 422, "validation_error"),
    ("latency-huge-integer", lambda e: _latency_text(e, "1" + "0" * 400), 422,
     "validation_error"),
    ("latency-true", lambda e: _latencies(e, [True]), 422, "validation_error"),
    ("latency-a-string", lambda e: _latencies(e, ["0.001"]), 422, "validation_error"),
    ("latencies-too-many", lambda e: _latencies(e, [1e-3] * 1001), 422, "validation_error"),
    ("ok-without-latencies", lambda e: _latencies(e, []), 422, "validation_error"),
    ("build-s-negative", lambda e: Post(_with(e.body(), "result.build_s", -1)), 422,
     "validation_error"),
    ("another-tokens-worker", lambda e: Post(e.body(), caller="other_worker"), 403,
     "forbidden"),
    ("unknown-worker", lambda e: Post(e.body(), worker="f" * 32), 404, "not_found"),
    ("user-token", lambda e: Post(e.body(), caller="user"), 403, "forbidden"),
    # an issued trial answered faster than any device could: no single worker sets a best
    ("implausible-latency", lambda e: Post(e.body()), 422, "implausible_latency"),
]

# the field a 409 names
FIELDS = {"unknown-trial": "input.trial_id", "expired-trial": "input.trial_id",
          "lost-attempt-at-an-unissued-trial": "input.trial_id",
          "lost-attempt-id-for-a-run-error": "input.trial_id",
          "another-jobs-trial": "input.context.job_id",
          "wrong-workload": "input.context.workload_id",
          "wrong-target": "input.context.target_id", "wrong-device-key": "device_key",
          "issued-to-another-device-key": "device_key",
          "wrong-cand-hash": "input.context.cand_hash", "used-trial-different-latency": "result",
          "forged-trace": "input", "forged-decisions": "input", "forged-features": "input",
          "forged-space": "input", "forged-tvm-version": "input", "forged-prediction": "input",
          "forged-knobs": "input", "knobs-not-an-object": "input.context.knobs",
          "knob-value-an-object": "input.context.knobs",
          "knob-name-too-long": "input.context.knobs",
          "prediction-not-a-number": "input.context.predicted_s",
          "prediction-negative": "input.context.predicted_s"}


@pytest.fixture
def env(client: Any, ctx: Any, tokens: dict[str, str], user: dict[str, str],
        worker: dict[str, str], submit: Callable[..., dict[str, Any]]) -> Env:
    from tuner.core import tvm_api as tv

    jobs = {"A": submit(user), "B": submit(user),
            "C": submit(user, {**SUBMIT, "workload": {**MATMUL, "shape": [64, 64, 64]}}),
            "D": submit(user, {**SUBMIT, "device_key": "other"})}
    workers = {}
    for name, dkey in (("mine", "local"), ("elsewhere", "other")):
        resp = client.post("/v1/workers", headers=worker, json={
            "name": name, "device_key": dkey, "target": tv.host_target_dict(),
            "tvm_version": "test", "hostname": "h"})
        assert resp.status_code == 201, resp.text
        workers[name] = resp.json()["id"]
    headers = {"worker": worker, "user": user,
               "other_worker": bearer(create_token(ctx.store, "worker", name="worker-2"))}
    return Env(client, ctx, jobs, workers, headers)


def _post(env: Env, post: Post) -> Any:
    wid = env.workers.get(post.worker, post.worker)
    kw: dict[str, Any] = ({"content": post.body, "headers": {
        **env.headers[post.caller], "Content-Type": "application/json"}}
        if isinstance(post.body, str) else {"json": post.body, "headers": env.headers[post.caller]})
    return env.client.post(f"/v1/workers/{wid}/results", **kw)


def _written(env: Env) -> tuple[int, int, int]:
    """(records, record events of job A, trials stamped used)."""
    with env.ctx.store.session() as s:
        used = s.query(m.IssuedTrial).filter(m.IssuedTrial.used_at.is_not(None)).count()
    events = [f for _, f in env.ctx.sync_redis.xrange(env.ctx.keys.events(env.jobs["A"]["id"]))
              if f.get("event", f.get(b"event")) in ("record", b"record")]
    return env.ctx.store.count_records(), len(events), used


def _best(env: Env) -> tuple[str, float]:
    resp = env.client.get("/v1/best", params={"workload": json.dumps(MATMUL)},
                          headers=env.headers["user"])
    assert resp.status_code == 200, resp.text
    return resp.json()["trial_id"], resp.json()["latency_s"]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_result(env: Env, case: tuple[str, Callable[[Env], Post], int, str]) -> None:
    name, forge, status, code = case
    legit = env.body(latency_s=1e-3)
    ok = _post(env, Post(legit))
    assert ok.status_code == 200 and ok.json()["inserted"] is True, ok.text
    confirmed = _post(env, Post(confirmation_body(env.ctx, legit)))  # served once confirmed
    assert confirmed.status_code == 200, confirmed.text
    post = forge(env)
    before, best = _written(env), _best(env)
    resp = _post(env, post)
    assert (resp.status_code, resp.headers["content-type"]) == (status, PROBLEM), resp.text
    assert resp.json()["code"] == code and "Traceback" not in resp.text
    if name in FIELDS:
        assert resp.json()["field"] == FIELDS[name]
    elif status == 422:
        assert resp.json()["field"].startswith("result.")
    assert _written(env) == before  # no record, no event, no trial used
    assert _best(env) == best and best[0] == legit["input"]["trial_id"]
    assert math.isclose(best[1], 1e-3, rel_tol=0.02)
