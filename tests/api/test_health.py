"""/healthz, /readyz, /metrics, the OpenAPI document, and errors nobody planned for."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)


def test_health_ready_metrics(client: Any, user: dict[str, str],
                              submit: Callable[..., dict[str, Any]]) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["checks"] == {"sql": "ok", "redis": "ok"}
    job = submit(user)
    client.get(f"/v1/jobs/{job['id']}", headers=user)
    text = client.get("/metrics").text
    assert 'tunefarm_jobs{state="QUEUED"} 1.0' in text
    assert "tunefarm_records 0.0" in text
    assert ('tunefarm_http_requests_total{method="GET",route="/v1/jobs/{job_id}",status="200"} 1.0'
            in text)
    assert 'tunefarm_http_request_duration_seconds_bucket{le="0.005",method="POST",' \
           'route="/v1/jobs"}' in text


def test_openapi_document(client: Any) -> None:
    doc = client.get("/v1/openapi.json").json()
    paths = set(doc["paths"])
    assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/cancel",
            "/v1/jobs/{job_id}/records", "/v1/jobs/{job_id}/events", "/v1/best",
            "/v1/spaces/{op}", "/v1/workers", "/v1/workers/{worker_id}/heartbeat",
            "/v1/workers/{worker_id}/results"} <= paths
    assert "HTTPBearer" in doc["components"]["securitySchemes"]


def test_spaces(client: Any, user: dict[str, str]) -> None:
    spaces = client.get("/v1/spaces/matmul", headers=user).json()
    names = [s["name"] for s in spaces]
    assert names[-1] == "auto" and len(names) >= 2
    everything = client.get("/v1/spaces", headers=user).json()
    assert set(names) <= {s["name"] for s in everything}
    unknown = client.get("/v1/spaces/nope", headers=user)
    assert unknown.status_code == 404 and unknown.json()["code"] == "not_found"


def test_unexpected_errors_are_500_without_details(api_settings: Any, user: dict[str, str],
                                                   client: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi.testclient import TestClient

    import tuner.db.jobs
    from tuner.core.errors import DatabaseError

    def boom(*a: Any, **kw: Any) -> Any:
        raise RuntimeError("secret internals")

    monkeypatch.setattr(tuner.db.jobs, "list_jobs", boom)
    quiet = TestClient(client.app, raise_server_exceptions=False)
    resp = quiet.get("/v1/jobs", headers=user)
    assert resp.status_code == 500
    assert resp.headers["content-type"] == "application/problem+json"
    assert resp.json()["code"] == "internal_error"
    assert "secret" not in resp.text and "Traceback" not in resp.text

    def db_down(*a: Any, **kw: Any) -> Any:
        raise DatabaseError("connection refused to postgresql://admin:pw@db")

    monkeypatch.setattr(tuner.db.jobs, "list_jobs", db_down)
    resp = client.get("/v1/jobs", headers=user)
    assert resp.status_code == 503 and resp.json()["code"] == "database_error"
    assert "pw" not in resp.text


def test_redis_outage(api_settings: Any, submit_body: dict[str, Any]) -> None:
    """SQL is the truth: with Redis down, jobs are still accepted (tuners claim them from SQL),
    results are committed and /readyz says what is wrong."""
    import socket

    from fastapi.testclient import TestClient

    from api.app import create_app
    from tuner.db.tokens import create_token

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = api_settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{port}/0"})
    with TestClient(create_app(settings)) as c:
        token = create_token(c.app.state.ctx.store, "admin")
        headers = {"Authorization": f"Bearer {token}"}
        ready = c.get("/readyz")
        assert ready.status_code == 503 and ready.json()["code"] == "unavailable"
        assert ready.json()["checks"]["sql"] == "ok" and ready.json()["checks"]["redis"] != "ok"
        resp = c.post("/v1/jobs", json=submit_body, headers=headers)
        assert resp.status_code == 202, resp.text
        best = c.get("/v1/best", params={"workload": json.dumps(submit_body["workload"])},
                     headers=headers)
        assert best.status_code == 404 and best.json()["code"] == "not_found"
