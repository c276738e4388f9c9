"""The API on the single-host SQLite backend: the main flow works there too."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def test_flow_on_sqlite(client: Any, user: dict[str, str], worker: dict[str, str],
                        submit: Callable[..., dict[str, Any]],
                        result_for: Callable[..., dict[str, Any]],
                        confirm: Callable[..., Any]) -> None:
    job = submit(user)
    again = client.post("/v1/jobs", json={"workload": job["workload"], "trials": 16},
                        headers={**user, "Idempotency-Key": "s1"})
    assert again.status_code == 202
    body = result_for(job, latency_s=1e-3)
    assert client.post("/v1/workers/w/results", json=body, headers=worker).json()["inserted"]
    confirm(body, as_worker="w1")
    best = client.get("/v1/best", params={"workload": json.dumps(job["workload"])}, headers=user)
    assert best.status_code == 200 and best.json()["trial_id"] == body["input"]["trial_id"]
    assert client.post(f"/v1/jobs/{job['id']}/cancel", headers=user).json()["state"] == \
        "CANCELLED"
    with client.stream("GET", f"/v1/jobs/{job['id']}/events", headers=user) as resp:
        lines = [ln for ln in resp.iter_lines() if ln.startswith("event: ")]
    assert lines == ["event: state", "event: record", "event: state"]
    assert client.get("/readyz").status_code == 200
