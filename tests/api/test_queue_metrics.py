"""The API runs the measurement queue for the workers, so its /metrics counts the queue's lease
reclaims and dead letters (by device key, and by reason for dead letters)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.api.conftest import bearer
from tuner.measure import MeasureInput
from tuner.queue import streams

pytestmark = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
DEV = "metrics-dev"
LEASE = {"max": 1, "wait_s": 0}


@pytest.fixture
def fast_client(api_settings: Any) -> Iterator[Any]:
    """The app with a 0.2 s lease and at most 2 deliveries of an entry."""
    from fastapi.testclient import TestClient

    from api.app import create_app

    settings = api_settings.model_copy(update={"lease_s": 0.2, "max_deliveries": 2})
    with TestClient(create_app(settings)) as c:
        yield c


def _value(text: str, name: str, **labels: str) -> float | None:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return None


def test_reclaims_and_dead_letters_are_counted(fast_client: Any) -> None:
    from tuner.db.tokens import create_token

    client = fast_client
    ctx = client.app.state.ctx
    headers = bearer(create_token(ctx.store, "worker", name="metrics"))
    a, b = (client.post("/v1/workers", headers=headers, json={
        "name": n, "device_key": DEV, "target": {"kind": "llvm"}}).json()["id"] for n in "ab")

    def lease(worker: str) -> list[dict[str, Any]]:
        resp = client.post(f"/v1/workers/{worker}/lease", json=LEASE, headers=headers)
        assert resp.status_code == 200, resp.text
        return list(resp.json()["entries"])

    inp = MeasureInput(trial_id="t0", workload_key="k", workload_spec={"op": "matmul"},
                       target={"kind": "llvm"}, trace_json="[]", context={"job_id": "j"})
    stream = ctx.keys.measure(DEV)
    entry = streams.enqueue(ctx.sync_redis, stream, {"input": inp.to_json()})
    assert [e["deliveries"] for e in lease(a)] == [1]
    time.sleep(0.3)  # a lets the lease lapse: b gets the entry (reclaimed), then a again (poison)
    assert [(e["entry_id"], e["deliveries"]) for e in lease(b)] == [(entry, 2)]
    time.sleep(0.3)
    assert lease(a) == []  # delivered 3 times (max 2): dead-lettered
    streams.enqueue(ctx.sync_redis, stream, {"input": "not json"})
    assert lease(a) == []  # not a MeasureInput: dead-lettered
    held = streams.enqueue(ctx.sync_redis, stream, {"input": inp.to_json()})
    assert [e["entry_id"] for e in lease(b)] == [held]
    dropped = client.post(f"/v1/workers/{b}/dead-letter", headers=headers,
                          json={"entry_ids": [held], "reason": "cannot read it"})
    assert dropped.json()["entry_ids"] == [held]
    assert ctx.sync_redis.xlen(ctx.keys.dead(DEV)) == 3

    text = client.get("/metrics").text
    assert _value(text, "tunefarm_lease_reclaims_total", device_key=DEV) == 1
    for reason in ("max_deliveries", "invalid_input", "worker"):
        assert _value(text, "tunefarm_dead_letters_total", device_key=DEV, reason=reason) == 1
