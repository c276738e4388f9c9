"""Catalogue of bad worker queue requests (lease, renew, ack, dead-letter): each answered with its
documented status and `code` as application/problem+json, and nothing written (the queue entry,
its holder and the dead letters stay as they were).

Two workers of device key "dev" are registered: `{mine}` with the `worker` token (the caller
unless a case says otherwise) and `{theirs}` with another worker token, which holds the one
queued entry `{entry}`."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.conftest import bearer
from tuner.db.tokens import create_token
from tuner.measure import MeasureInput
from tuner.queue import Keys, streams

pytestmark = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
PROBLEM = "application/problem+json"
DEV = "dev"
BIG = str(2**64)
LEASE = {"max": 1, "wait_s": 0}


def _lease(body: Any, **kw: Any) -> dict[str, Any]:
    return {"path": "/v1/workers/{mine}/lease", "json": body, **kw}


def _ack(body: Any, **kw: Any) -> dict[str, Any]:
    return {"path": "/v1/workers/{mine}/ack", "json": body, **kw}


# (id, request, expected_status, expected_code); a request is
# {"path", "json" | "content", optional "as" ("worker" | "user" | "none")}
CASES: list[tuple[str, dict[str, Any], int, str]] = [
    ("lease-as-another-tokens-worker",
     {"path": "/v1/workers/{theirs}/lease", "json": LEASE}, 403, "forbidden"),
    ("renew-as-another-tokens-worker",
     {"path": "/v1/workers/{theirs}/renew", "json": {"entry_ids": ["{entry}"]}}, 403,
     "forbidden"),
    ("ack-as-another-tokens-worker",
     {"path": "/v1/workers/{theirs}/ack", "json": {"entry_ids": ["{entry}"]}}, 403, "forbidden"),
    ("dead-letter-as-another-tokens-worker",
     {"path": "/v1/workers/{theirs}/dead-letter",
      "json": {"entry_ids": ["{entry}"], "reason": "mine now"}}, 403, "forbidden"),
    ("lease-for-an-unknown-worker",
     {"path": "/v1/workers/" + "f" * 32 + "/lease", "json": LEASE}, 404, "not_found"),
    ("lease-with-a-user-token", _lease(LEASE, **{"as": "user"}), 403, "forbidden"),
    ("lease-without-a-token", _lease(LEASE, **{"as": "none"}), 401, "unauthorized"),
    ("entry-id-not-a-stream-id", _ack({"entry_ids": ["abc"]}), 422, "validation_error"),
    ("entry-id-ms-at-2**64", _ack({"entry_ids": [BIG + "-0"]}), 422, "validation_error"),
    ("entry-id-seq-at-2**64", _ack({"entry_ids": ["0-" + BIG]}), 422, "validation_error"),
    ("entry-id-three-parts", _ack({"entry_ids": ["1-2-3"]}), 422, "validation_error"),
    ("entry-id-negative", _ack({"entry_ids": ["-1-0"]}), 422, "validation_error"),
    ("entry-id-too-many-digits", _ack({"entry_ids": ["1" * 30 + "-0"]}), 422,
     "validation_error"),
    ("entry-id-trailing-newline", _ack({"entry_ids": ["1-0\n"]}), 422, "validation_error"),
    ("entry-id-special-id", _ack({"entry_ids": [">"]}), 422, "validation_error"),
    ("entry-id-an-integer", _ack({"entry_ids": [1]}), 422, "validation_error"),
    ("entry-ids-empty", _ack({"entry_ids": []}), 422, "validation_error"),
    ("entry-ids-over-64", _ack({"entry_ids": [f"1-{i}" for i in range(65)]}), 422,
     "validation_error"),
    ("entry-ids-not-a-list", _ack({"entry_ids": "1-0"}), 422, "validation_error"),
    ("entry-ids-missing", _ack({}), 422, "validation_error"),
    ("renew-unknown-field",
     {"path": "/v1/workers/{mine}/renew", "json": {"entry_ids": ["1-0"], "all": True}}, 422,
     "validation_error"),
    ("lease-max-zero", _lease({"max": 0}), 422, "validation_error"),
    ("lease-max-over-64", _lease({"max": 65}), 422, "validation_error"),
    ("lease-max-a-string", _lease({"max": "10"}), 422, "validation_error"),
    ("lease-max-true", _lease({"max": True}), 422, "validation_error"),
    ("lease-max-a-fraction", _lease({"max": 1.5}), 422, "validation_error"),
    ("lease-wait-over-10-s", _lease({"max": 1, "wait_s": 10.5}), 422, "validation_error"),
    ("lease-wait-negative", _lease({"max": 1, "wait_s": -1}), 422, "validation_error"),
    ("lease-wait-a-string", _lease({"max": 1, "wait_s": "1"}), 422, "validation_error"),
    ("lease-wait-nan", {"path": "/v1/workers/{mine}/lease",
                        "content": '{"max": 1, "wait_s": NaN}'}, 422, "validation_error"),
    ("lease-unknown-field", _lease({"max": 1, "stream": "tunefarm:jobs"}), 422,
     "validation_error"),
    ("lease-body-not-an-object", _lease([1]), 422, "validation_error"),
    ("lease-malformed-json",
     {"path": "/v1/workers/{mine}/lease", "content": '{"max": 1'}, 400, "malformed_json"),
    ("dead-letter-empty-reason",
     {"path": "/v1/workers/{mine}/dead-letter", "json": {"entry_ids": ["1-0"], "reason": ""}},
     422, "validation_error"),
    ("dead-letter-reason-too-long",
     {"path": "/v1/workers/{mine}/dead-letter",
      "json": {"entry_ids": ["1-0"], "reason": "x" * 2001}}, 422, "validation_error"),
    ("dead-letter-without-reason",
     {"path": "/v1/workers/{mine}/dead-letter", "json": {"entry_ids": ["1-0"]}}, 422,
     "validation_error"),
    ("worker-id-bad-characters", {"path": "/v1/workers/a.b/lease", "json": LEASE}, 422,
     "validation_error"),
    ("worker-id-too-long", {"path": "/v1/workers/" + "a" * 65 + "/lease", "json": LEASE}, 422,
     "validation_error"),
]


def _register(client: Any, token: str, name: str) -> str:
    resp = client.post("/v1/workers", headers=bearer(token),
                       json={"name": name, "device_key": DEV, "target": {"kind": "llvm"}})
    assert resp.status_code == 201, resp.text
    return str(resp.json()["id"])


def _snapshot(ctx: Any) -> tuple[Any, ...]:
    """The measure stream's entries and holders and the dead letters."""
    r, stream = ctx.sync_redis, ctx.keys.measure(DEV)
    pending = r.xpending_range(stream, Keys.WORKERS_GROUP, min="-", max="+", count=100)
    return (r.xrange(stream), [(p["message_id"], p["consumer"]) for p in pending],
            r.xrange(ctx.keys.dead(DEV)))


@pytest.mark.parametrize("case, request_, status, code", CASES, ids=[c[0] for c in CASES])
def test_bad_work_request(client: Any, ctx: Any, tokens: dict[str, str], case: str,
                          request_: dict[str, Any], status: int, code: str) -> None:
    mine = _register(client, tokens["worker"], "mine")
    other = create_token(ctx.store, "worker", name="other")
    theirs = _register(client, other, "theirs")
    inp = MeasureInput(trial_id="t0", workload_key="k", workload_spec={"op": "matmul"},
                       target={"kind": "llvm"}, trace_json="[]", context={"job_id": "j"})
    entry = streams.enqueue(ctx.sync_redis, ctx.keys.measure(DEV), {"input": inp.to_json()})
    resp = client.post(f"/v1/workers/{theirs}/lease", json=LEASE, headers=bearer(other))
    assert [e["entry_id"] for e in resp.json()["entries"]] == [entry], resp.text
    before = _snapshot(ctx)

    who = request_.get("as", "worker")
    headers = {} if who == "none" else bearer(tokens[who])
    names = {"mine": mine, "theirs": theirs, "entry": entry}
    kw: dict[str, Any] = {}
    if "json" in request_:
        body = request_["json"]
        if isinstance(body, dict) and body.get("entry_ids") == ["{entry}"]:
            body = {**body, "entry_ids": [entry]}
        kw["json"] = body
    else:
        kw["content"] = request_["content"]
        headers["Content-Type"] = "application/json"
    resp = client.post(request_["path"].format(**names), headers=headers, **kw)
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == PROBLEM
    body = resp.json()
    assert body["code"] == code and body["status"] == status and body["detail"]
    assert _snapshot(ctx) == before  # nothing leased, renewed, acknowledged or dead-lettered
