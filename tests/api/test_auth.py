"""Bearer tokens and scopes: user, worker, admin."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
SUBMIT = {"workload": {"op": "matmul", "shape": [64, 64, 64]}, "trials": 4}
PROBLEM = "application/problem+json"


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


BAD_HEADERS: list[dict[str, str]] = [
    {}, {"Authorization": "Bearer tf_not_a_real_token"}, {"Authorization": "Basic dXNlcjpwdw=="},
    {"Authorization": "Bearer"},
]
ENDPOINTS = [("POST", "/v1/jobs"), ("GET", "/v1/jobs"), ("GET", "/v1/jobs/x/events"),
             ("GET", "/v1/best?workload=x"), ("GET", "/v1/spaces/matmul"), ("POST", "/v1/workers"),
             ("GET", "/v1/workers"), ("POST", "/v1/workers/w/results")]


def test_no_or_bad_token_is_401(client: Any, tokens: dict[str, str]) -> None:
    for headers in BAD_HEADERS:
        for method, path in ENDPOINTS:
            resp = client.request(method, path, headers=headers, json=SUBMIT)
            assert resp.status_code == 401, (method, path, headers, resp.text)
            assert resp.headers["content-type"] == PROBLEM
            assert resp.json()["code"] == "unauthorized"
            assert resp.headers["www-authenticate"].startswith("Bearer")


def test_worker_token_cannot_submit(client: Any, worker: dict[str, str]) -> None:
    resp = client.post("/v1/jobs", json=SUBMIT, headers=worker)
    assert resp.status_code == 403 and resp.json()["code"] == "forbidden"
    assert client.get("/v1/jobs", headers=worker).status_code == 403


def test_user_token_cannot_post_results(client: Any, user: dict[str, str],
                                        submit: Callable[..., dict[str, Any]],
                                        result_for: Callable[..., dict[str, Any]]) -> None:
    job = submit(user, SUBMIT)
    resp = client.post("/v1/workers/w/results", json=result_for(job), headers=user)
    assert resp.status_code == 403 and resp.json()["code"] == "forbidden"
    reg = client.post("/v1/workers", headers=user, json={
        "name": "w", "target": {"kind": "llvm"}})
    assert reg.status_code == 403


def test_admin_can_do_both(client: Any, admin: dict[str, str],
                           submit: Callable[..., dict[str, Any]],
                           result_for: Callable[..., dict[str, Any]]) -> None:
    job = submit(admin, SUBMIT)
    resp = client.post("/v1/workers/w/results", json=result_for(job), headers=admin)
    assert resp.status_code == 200 and resp.json()["inserted"] is True
    assert client.get("/v1/workers", headers=admin).status_code == 200


def test_worker_and_user_can_read_best_and_spaces(client: Any, user: dict[str, str],
                                                  worker: dict[str, str]) -> None:
    spec = json.dumps(SUBMIT["workload"])
    for headers in (user, worker):
        assert client.get("/v1/spaces/matmul", headers=headers).status_code == 200
        resp = client.get("/v1/best", params={"workload": spec}, headers=headers)
        assert resp.status_code == 404 and resp.json()["code"] == "not_found"
    assert client.get("/v1/workers", headers=worker).status_code == 403


def test_revoked_token_is_refused_after_the_cache(client: Any, ctx: Any, tokens: dict[str, str]
                                                  ) -> None:
    from tuner.db.tokens import revoke_token, verify_token

    token = tokens["user"]
    assert client.get("/v1/jobs", headers=_auth(token)).status_code == 200
    revoke_token(ctx.store, verify_token(ctx.store, token).token_id)
    ctx.tokens.clear()  # the in-process cache keeps a token for ttl_s; expire it now
    resp = client.get("/v1/jobs", headers=_auth(token))
    assert resp.status_code == 401
    assert "revoked" in resp.json()["detail"]  # the holder of the real token may know why


def test_health_endpoints_need_no_token(client: Any) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 200
    assert client.get("/metrics").status_code == 200
    assert client.get("/v1/openapi.json").status_code == 200

