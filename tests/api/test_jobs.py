"""POST/GET /v1/jobs, cancel, records: against the real PostgreSQL and Redis."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
PROBLEM = "application/problem+json"
MATMUL = {"op": "matmul", "shape": [128, 128, 128]}
SUBMIT = {"workload": MATMUL, "target": "host", "trials": 16}
Submit = Callable[..., dict[str, Any]]


def test_submit_minimal_body(client: Any, ctx: Any, user: dict[str, str], redis_client: Any
                             ) -> None:
    resp = client.post("/v1/jobs", json=SUBMIT, headers=user)
    assert resp.status_code == 202, resp.text
    job = resp.json()
    assert resp.headers["location"] == f"/v1/jobs/{job['id']}"
    assert resp.headers["retry-after"] == "2"
    assert job["state"] == "QUEUED" and job["trials"] == 16 and job["trials_done"] == 0
    assert job["workload"]["op"] == "matmul" and job["workload"]["shape"] == [128, 128, 128]
    # "host" is this machine's CPU, made explicit
    from tuner.core import tvm_api as tv

    assert job["target"]["mcpu"] == tv.host_target_dict()["mcpu"]
    assert job["space"] != "default"  # resolved to a concrete space
    # stored in SQL, queued for the tuners, announced on the job's event stream
    assert ctx.store.get_job(job["id"]).state == "QUEUED"
    entries = redis_client.xrange(ctx.keys.jobs)
    assert [e[1] for e in entries] == [{"job_id": job["id"]}]
    events = redis_client.xrange(ctx.keys.events(job["id"]))
    assert [(f["event"], json.loads(f["data"])["state"]) for _, f in events] == [
        ("state", "QUEUED")]
    got = client.get(resp.headers["location"], headers=user)
    assert got.status_code == 200 and got.json() == job


def test_submit_options_are_stored(client: Any, ctx: Any, user: dict[str, str],
                                   submit: Submit) -> None:
    job = submit(user, {**SUBMIT, "batch_size": 8, "seed": 3, "wall_budget_s": 60,
                                "early_stop": 32, "space": "auto", "device_key": "board-a"})
    row = ctx.store.get_job(job["id"])
    assert row.options == {"batch_size": 8, "seed": 3, "early_stop": 32}
    assert row.wall_budget_s == 60 and row.space == "auto" and job["device_key"] == "board-a"


def test_idempotent_submit(client: Any, ctx: Any, user: dict[str, str], redis_client: Any
                           ) -> None:
    headers = {**user, "Idempotency-Key": "key-1"}
    first = client.post("/v1/jobs", json=SUBMIT, headers=headers)
    again = client.post("/v1/jobs", json=SUBMIT, headers=headers)
    assert first.status_code == 202 and again.status_code in (200, 202)
    assert again.json()["id"] == first.json()["id"]
    assert len(redis_client.xrange(ctx.keys.jobs)) == 1  # enqueued once
    other = client.post("/v1/jobs", json={**SUBMIT, "trials": 17}, headers=headers)
    assert other.status_code == 422
    assert other.headers["content-type"] == PROBLEM
    assert other.json()["code"] == "idempotency_conflict"
    fresh = client.post("/v1/jobs", json=SUBMIT, headers={**user, "Idempotency-Key": "key-2"})
    assert fresh.status_code == 202 and fresh.json()["id"] != first.json()["id"]


def _ids(page: dict[str, Any]) -> list[str]:
    return [j["id"] for j in page["items"]]


def test_list_with_cursor_and_state(client: Any, user: dict[str, str], submit: Submit) -> None:
    made = [submit(user, {**SUBMIT, "trials": 10 + i})["id"] for i in range(5)]
    client.post(f"/v1/jobs/{made[0]}/cancel", headers=user)
    seen: list[str] = []
    cursor = None
    for _ in range(5):
        params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = client.get("/v1/jobs", params=params, headers=user).json()
        assert len(page["items"]) <= 2
        seen += _ids(page)
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == made[::-1]  # newest first, each once
    queued = client.get("/v1/jobs", params={"state": "QUEUED"}, headers=user).json()
    assert set(_ids(queued)) == set(made[1:]) and queued["next_cursor"] is None
    cancelled = client.get("/v1/jobs", params={"state": "CANCELLED"}, headers=user).json()
    assert _ids(cancelled) == [made[0]]
    bad = client.get("/v1/jobs", params={"state": "NOPE"}, headers=user)
    assert bad.status_code == 422 and bad.json()["code"] == "validation_error"
    bad = client.get("/v1/jobs", params={"cursor": "garbage!"}, headers=user)
    assert bad.status_code == 400 and bad.headers["content-type"] == PROBLEM
    assert bad.json()["code"] == "bad_cursor"


def test_cancel_is_idempotent(client: Any, ctx: Any, user: dict[str, str], redis_client: Any,
                              submit: Submit) -> None:
    job = submit(user)
    first = client.post(f"/v1/jobs/{job['id']}/cancel", headers=user)
    assert first.status_code == 202 and first.json()["state"] == "CANCELLED"
    again = client.post(f"/v1/jobs/{job['id']}/cancel", headers=user)
    assert again.status_code == 202 and again.json()["state"] == "CANCELLED"
    assert redis_client.get(ctx.keys.cancelled(job["id"])) == "1"
    states = [json.loads(f["data"])["state"]
              for _, f in redis_client.xrange(ctx.keys.events(job["id"]))]
    assert states == ["QUEUED", "CANCELLED"]  # one event per change


def test_cancel_running_job_becomes_cancelling(client: Any, ctx: Any, user: dict[str, str],
                                               submit: Submit) -> None:
    job = submit(user)
    ctx.store.set_job_state(job["id"], "RUNNING")
    resp = client.post(f"/v1/jobs/{job['id']}/cancel", headers=user)
    assert resp.status_code == 202 and resp.json()["state"] == "CANCELLING"


def test_records_listing(client: Any, user: dict[str, str], worker: dict[str, str],
                         submit: Submit, result_for: Callable[..., dict[str, Any]]) -> None:
    job = submit(user)
    posted = []
    for i in range(5):
        body = result_for(job, latency_s=1e-3 * (i + 1),
                           invalidity="ok" if i % 2 == 0 else "run_error")
        assert client.post("/v1/workers/w1/results", json=body, headers=worker).status_code == 200
        posted.append(body["input"]["trial_id"])
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = client.get(f"/v1/jobs/{job['id']}/records", params=params, headers=user).json()
        items += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [r["trial_id"] for r in items] == posted
    assert [r["invalidity"] for r in items] == ["ok", "run_error", "ok", "run_error", "ok"]
    assert items[0]["latency_s"] == pytest.approx(1e-3) and items[0]["worker"] == "w1"
    assert items[0]["workload_key"] == job["workload_key"]
    got = client.get(f"/v1/jobs/{job['id']}", headers=user).json()
    assert got["trials_done"] == 5 and got["best"]["trial_id"] == posted[0]


@pytest.mark.parametrize("path", ["/v1/jobs/{}", "/v1/jobs/{}/records", "/v1/jobs/{}/events"])
def test_unknown_job_is_404(client: Any, user: dict[str, str], path: str) -> None:
    resp = client.get(path.format("0" * 32), headers=user)
    assert resp.status_code == 404
    assert resp.headers["content-type"] == PROBLEM
    body = resp.json()
    assert body["code"] == "not_found" and body["status"] == 404 and "0" * 32 in body["detail"]
    cancel = client.post("/v1/jobs/nope/cancel", headers=user)
    assert cancel.status_code == 404 and cancel.json()["code"] == "not_found"


@pytest.mark.parametrize("content, code, status, field", [
    ('{"workload": {"op": "matmul", "shape": [8,8,8]},', "malformed_json", 400, None),
    (json.dumps({"workload": {"op": "nope"}}), "invalid_spec", 422, "op"),
    (json.dumps({"workload": {"op": "matmul", "shape": [1 << 20] * 3}}), "invalid_spec", 422,
     "shape"),
    (json.dumps({"workload": MATMUL, "target": {"kind": "llvm", "mcpu": "notacpu"}}),
     "invalid_target", 422, "target.mcpu"),
    (json.dumps({"workload": MATMUL, "target": "llvm -mcpu=skylake"}), "invalid_target", 422,
     "target"),
    (json.dumps({"workload": MATMUL, "trials": 0}), "validation_error", 422, None),
    (json.dumps({"workload": MATMUL, "space": "no-such-space"}), "invalid_spec", 422, "space"),
    (json.dumps({"workload": MATMUL, "surprise": 1}), "validation_error", 422, None),
    (json.dumps([1, 2]), "validation_error", 422, None),
])
def test_submit_problems(client: Any, ctx: Any, user: dict[str, str], content: str, code: str,
                         status: int, field: str | None) -> None:
    resp = client.post("/v1/jobs", content=content,
                       headers={**user, "Content-Type": "application/json"})
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == PROBLEM
    body = resp.json()
    assert body["code"] == code and body["status"] == status
    assert body["type"].endswith(code) and body["title"] and body["detail"]
    assert "Traceback" not in resp.text
    if field is not None:
        assert body["field"] == field
    if code == "validation_error":
        assert body["errors"] and all("loc" in e and "msg" in e for e in body["errors"])
    assert client.get("/v1/jobs", headers=user).json()["items"] == []  # nothing was created


def test_responses_carry_exactly_the_declared_fields(
        client: Any, user: dict[str, str], worker: dict[str, str], submit: Submit,
        result_for: Callable[..., dict[str, Any]]) -> None:
    """A job and its records answer with the fields JobPublic / RecordPublic declare, no more
    (a field the view builds but does not declare would be dropped silently), no fewer."""
    from api.schemas import JobPublic, RecordPublic

    job = submit(user)
    assert set(job) == set(JobPublic.model_fields)
    assert job["options"] == {"batch_size": 16, "seed": 0}  # resolved from the settings
    body = result_for(job, latency_s=2e-3)
    assert client.post("/v1/workers/w1/results", json=body, headers=worker).status_code == 200
    items = client.get(f"/v1/jobs/{job['id']}/records", headers=user).json()["items"]
    assert [set(r) for r in items] == [set(RecordPublic.model_fields)]
    assert items[0]["noisy"] is False  # 1 % spread, under TUNEFARM_NOISE_CV
    assert items[0]["gflops"] == pytest.approx(2 * 128**3 / 2e-3 / 1e9, rel=0.05)
    got = client.get(f"/v1/jobs/{job['id']}", headers=user).json()
    assert set(got) == set(JobPublic.model_fields) and set(got["best"]) == {
        "trial_id", "latency_s", "gflops", "gbps"}


@pytest.mark.parametrize("cursor", [
    "garbage!", "x" * 201, "Y2Fy", "cjEyMzQ1Njc4OTAxMjM0NTY3ODkwMTIzNDU2Nzg5", "ci0x", "w6k",
    "r1", "cjk5OTk5OTk5OTk5OTk5OTk5OTk5OTk5OTk5OTk5OTk5OQ", "A" * 5000,
])
def test_bad_record_cursor_is_a_400(client: Any, user: dict[str, str], submit: Submit,
                                    cursor: str) -> None:
    """Not base64, too long, "car", an id past 64 bits, a negative id, "é", not UTF-8 inside,
    a huge integer, far too long: a 400 `bad_cursor` problem, never a 500."""
    job = submit(user)
    resp = client.get(f"/v1/jobs/{job['id']}/records", params={"cursor": cursor}, headers=user)
    assert resp.status_code == 400, resp.text
    assert resp.headers["content-type"] == PROBLEM
    assert resp.json()["code"] == "bad_cursor" and resp.json()["field"] == "cursor"


@pytest.mark.parametrize("cursor", [
    "MjAyNHxhYmM", "fGFiYw", "bm8tc2VwYXJhdG9y", "A" * 600,
    "MDAwMS0wMS0wMVQwMDowMDowMCswNTowMHxhYmM", "MjAyNC0wMS0wMXxhAGI",
])
def test_bad_job_cursor_is_a_400(client: Any, user: dict[str, str], cursor: str) -> None:
    """A bad date, an empty date, no separator, too long, a date before year 1 in UTC, a NUL in
    the job id: a 400 `bad_cursor` problem."""
    resp = client.get("/v1/jobs", params={"cursor": cursor}, headers=user)
    assert resp.status_code == 400, resp.text
    assert resp.headers["content-type"] == PROBLEM
    assert resp.json()["code"] == "bad_cursor"
