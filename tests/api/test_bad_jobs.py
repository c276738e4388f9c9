"""Catalogue of bad job requests (ownership, idempotency keys, quotas, scopes, HTTP hygiene:
body limit, strict types, cursors, event ids, the metrics token): each answered with its
documented status and `code` as application/problem+json, and nothing written.

Every case runs against a job of another user ("alice"); the caller is the `user` token unless
the case says otherwise. `{victim}` in a path is alice's job id."""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.api.conftest import SUBMIT, bearer

pytestmark = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
PROBLEM = "application/problem+json"

MB = 1 << 20
UNKNOWN_JOB = "/v1/jobs/" + "f" * 32


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _with(**fields: str) -> str:
    """The minimal job request with `fields` spliced in as raw JSON text (NaN, Infinity...)."""
    return json.dumps(SUBMIT)[:-1] + "".join(f', "{k}": {v}' for k, v in fields.items()) + "}"


# (id, request, expected_status, expected_code); a request is
# {"method", "path", optional "as" ("user" | "worker" | "admin" | "none"), "json" | "content" |
#  "padded" (a valid request padded to this many bytes) | "chunked" (the same, sent chunked),
#  "headers", "params", "settings" (overrides: the request goes to an app with them), "field"
#  (a validation error's detail names it first)}
CASES: list[tuple[str, dict[str, Any], int, str]] = [
    ("read-another-users-job", {"method": "GET", "path": "/v1/jobs/{victim}"}, 404, "not_found"),
    ("records-of-another-users-job",
     {"method": "GET", "path": "/v1/jobs/{victim}/records"}, 404, "not_found"),
    ("follow-another-users-job",
     {"method": "GET", "path": "/v1/jobs/{victim}/events"}, 404, "not_found"),
    ("cancel-another-users-job",
     {"method": "POST", "path": "/v1/jobs/{victim}/cancel"}, 404, "not_found"),
    ("cancel-unknown-job", {"method": "POST", "path": "/v1/jobs/" + "f" * 32 + "/cancel"}, 404,
     "not_found"),
    ("empty-idempotency-key",
     {"method": "POST", "path": "/v1/jobs", "json": SUBMIT, "headers": {"Idempotency-Key": ""}},
     422, "validation_error"),
    ("blank-idempotency-key",
     {"method": "POST", "path": "/v1/jobs", "json": SUBMIT,
      "headers": {"Idempotency-Key": "   "}}, 422, "validation_error"),
    ("idempotency-key-too-long",
     {"method": "POST", "path": "/v1/jobs", "json": SUBMIT,
      "headers": {"Idempotency-Key": "k" * 201}}, 422, "validation_error"),
    ("idempotency-key-control-character",
     {"method": "POST", "path": "/v1/jobs", "json": SUBMIT,
      "headers": {"Idempotency-Key": "a\x7fb"}}, 422, "validation_error"),
    ("trials-over-the-per-job-quota",
     {"method": "POST", "path": "/v1/jobs", "json": {**SUBMIT, "trials": 20_001}}, 429,
     "quota_exceeded"),
    ("trials-over-the-schema-bound",
     {"method": "POST", "path": "/v1/jobs", "json": {**SUBMIT, "trials": 100_001}}, 422,
     "validation_error"),
    ("submit-without-a-token",
     {"method": "POST", "path": "/v1/jobs", "json": SUBMIT, "as": "none"}, 401, "unauthorized"),
    ("submit-with-a-worker-token",
     {"method": "POST", "path": "/v1/jobs", "json": SUBMIT, "as": "worker"}, 403, "forbidden"),
    ("list-jobs-with-a-worker-token",
     {"method": "GET", "path": "/v1/jobs", "as": "worker"}, 403, "forbidden"),
    ("negative-wall-budget",
     {"method": "POST", "path": "/v1/jobs", "json": {**SUBMIT, "wall_budget_s": -1}}, 422,
     "validation_error"),
    ("owner-field-in-the-body",
     {"method": "POST", "path": "/v1/jobs", "json": {**SUBMIT, "owner": "alice"}}, 422,
     "validation_error"),
    ("truncated-json",
     {"method": "POST", "path": "/v1/jobs", "content": json.dumps(SUBMIT)[:-3]}, 400,
     "malformed_json"),
    # HTTP hygiene: the body limit (1 MiB), strict types, cursors, event ids, the metrics token
    ("body-of-26-mb", {"method": "POST", "path": "/v1/jobs", "padded": 26 * MB}, 413,
     "payload_too_large"),
    ("chunked-body-over-the-limit",
     {"method": "POST", "path": "/v1/jobs", "chunked": 2 * MB}, 413, "payload_too_large"),
    ("trials-as-a-string",
     {"method": "POST", "path": "/v1/jobs", "json": {**SUBMIT, "trials": "10"},
      "field": "trials"}, 422, "validation_error"),
    ("trials-as-a-boolean",
     {"method": "POST", "path": "/v1/jobs", "json": {**SUBMIT, "trials": True},
      "field": "trials"}, 422, "validation_error"),
    ("wall-budget-infinity",
     {"method": "POST", "path": "/v1/jobs", "content": _with(wall_budget_s="Infinity"),
      "field": "wall_budget_s"}, 422, "validation_error"),
    ("wall-budget-nan",
     {"method": "POST", "path": "/v1/jobs", "content": _with(wall_budget_s="NaN"),
      "field": "wall_budget_s"}, 422, "validation_error"),
    ("wall-budget-1e999",
     {"method": "POST", "path": "/v1/jobs", "content": _with(wall_budget_s="1e999"),
      "field": "wall_budget_s"}, 422, "validation_error"),
    ("nan-inside-the-workload",
     {"method": "POST", "path": "/v1/jobs",
      "content": '{"workload": {"op": "matmul", "shape": [NaN, 128, 128]}}',
      "field": "workload"}, 422, "validation_error"),
    ("workload-nested-too-deep",
     {"method": "POST", "path": "/v1/jobs",
      "json": {**SUBMIT, "workload": {"op": "matmul", "x": json.loads("[" * 40 + "]" * 40)}},
      "field": "workload"}, 422, "validation_error"),
    ("unknown-field",
     {"method": "POST", "path": "/v1/jobs", "json": {**SUBMIT, "priority": 9},
      "field": "priority"}, 422, "validation_error"),
    ("seed-past-int64",
     {"method": "POST", "path": "/v1/jobs", "json": {**SUBMIT, "seed": 1 << 63},
      "field": "seed"}, 422, "validation_error"),
    ("batch-size-over-the-bound",
     {"method": "POST", "path": "/v1/jobs", "json": {**SUBMIT, "batch_size": 4097},
      "field": "batch_size"}, 422, "validation_error"),
    ("body-not-utf-8",
     {"method": "POST", "path": "/v1/jobs", "content": b"\xff\xfe" + json.dumps(SUBMIT).encode()},
     400, "malformed_json"),
    ("job-cursor-garbage", {"method": "GET", "path": "/v1/jobs", "params": {"cursor": "!!"}},
     400, "bad_cursor"),
    ("job-cursor-huge", {"method": "GET", "path": "/v1/jobs", "params": {"cursor": "A" * 5000}},
     400, "bad_cursor"),
    ("job-cursor-year-zero",
     {"method": "GET", "path": "/v1/jobs",
      "params": {"cursor": _b64("0001-01-01T00:00:00+05:00|abc")}}, 400, "bad_cursor"),
    ("record-cursor-past-int64",
     {"method": "GET", "path": "/v1/jobs/{victim}/records", "as": "admin",
      "params": {"cursor": _b64("r" + "9" * 19)}}, 400, "bad_cursor"),
    ("record-cursor-negative",
     {"method": "GET", "path": "/v1/jobs/{victim}/records", "as": "admin",
      "params": {"cursor": _b64("r-1")}}, 400, "bad_cursor"),
    ("last-event-id-past-2-64",
     {"method": "GET", "path": UNKNOWN_JOB + "/events",
      "headers": {"Last-Event-ID": f"{1 << 64}-0"}}, 400, "bad_event_id"),
    ("after-not-an-event-id",
     {"method": "GET", "path": UNKNOWN_JOB + "/events", "params": {"after": "1-2-3"}}, 400,
     "bad_event_id"),
    ("nul-in-the-url", {"method": "GET", "path": "/v1/best", "params": {"workload": "a\x00b"}},
     422, "validation_error"),
    ("metrics-without-the-token",
     {"method": "GET", "path": "/metrics", "as": "none", "settings": {"metrics_token": "m-s3"}},
     401, "unauthorized"),
    ("metrics-with-an-api-token",
     {"method": "GET", "path": "/metrics", "as": "admin", "settings": {"metrics_token": "m-s3"}},
     401, "unauthorized"),
]


def _snapshot(ctx: Any) -> list[tuple[str, str, str, int]]:
    """Every job's id, owner, state and trials: what a bad request must leave as it was."""
    from sqlalchemy import select

    from tuner.db import tables as m

    with ctx.store.session() as s:
        return [tuple(r) for r in s.execute(
            select(m.Job.id, m.Job.owner, m.Job.state, m.Job.trials).order_by(m.Job.id))]


def _padded(size: int) -> bytes:
    text = json.dumps(SUBMIT).encode()
    return text + b" " * (size - len(text))


def _chunks(size: int) -> Iterator[bytes]:
    body = _padded(size)
    for i in range(0, len(body), 64 * 1024):
        yield body[i:i + 64 * 1024]


def _body(request_: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    if "json" in request_:
        return {"json": request_["json"]}
    for key, make in (("content", lambda v: v), ("padded", _padded), ("chunked", _chunks)):
        if key in request_:
            headers["Content-Type"] = "application/json"
            return {"content": make(request_[key])}
    return {}


@pytest.mark.parametrize("case, request_, status, code", CASES, ids=[c[0] for c in CASES])
def test_bad_job_request(client: Any, ctx: Any, tokens: dict[str, str], submit: Any,
                         api_settings: Any, case: str, request_: dict[str, Any], status: int,
                         code: str) -> None:
    from fastapi.testclient import TestClient

    from api.app import create_app
    from tuner.db.tokens import create_token

    victim = submit(bearer(create_token(ctx.store, "user", name="alice")))["id"]
    before = _snapshot(ctx)
    who = request_.get("as", "user")
    headers = {} if who == "none" else bearer(tokens[who])
    headers.update(request_.get("headers", {}))
    kw = _body(request_, headers)
    with contextlib.ExitStack() as stack:
        if "settings" in request_:
            app = create_app(api_settings.model_copy(update=request_["settings"]))
            client = stack.enter_context(TestClient(app))
        resp = client.request(request_["method"], request_["path"].format(victim=victim),
                              headers=headers, params=request_.get("params"), **kw)
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == PROBLEM
    body = resp.json()
    assert body["code"] == code and body["status"] == status and body["detail"]
    if "field" in request_:  # a validation error names the field first
        assert body["detail"].startswith(request_["field"] + ":"), body["detail"]
    if "{victim}" not in request_["path"]:
        assert victim not in resp.text
    elif code == "not_found":  # the answer for a job that does not exist
        assert body["detail"] == f"no job {victim!r}"
    if status == 429:
        assert int(resp.headers["retry-after"]) >= 1
    assert _snapshot(ctx) == before  # nothing created, cancelled or changed
