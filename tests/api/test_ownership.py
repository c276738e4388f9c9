"""Jobs belong to the token that submitted them: another user can neither list, read, follow nor
cancel them (a 404, as for a job that does not exist), nor learn their id through an
Idempotency-Key; admins see every job. GET /v1/best stays shared, without TVMScript text."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.api.conftest import SUBMIT, bearer

PG = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
PROBLEM = "application/problem+json"
Submit = Callable[..., dict[str, Any]]


@pytest.fixture
def alice(ctx: Any) -> dict[str, str]:
    from tuner.db.tokens import create_token

    return bearer(create_token(ctx.store, "user", name="alice"))


@pytest.fixture
def bob(ctx: Any) -> dict[str, str]:
    from tuner.db.tokens import create_token

    return bearer(create_token(ctx.store, "user", name="bob"))


def _ids(client: Any, headers: dict[str, str], **params: Any) -> list[str]:
    resp = client.get("/v1/jobs", params=params, headers=headers)
    assert resp.status_code == 200, resp.text
    return [j["id"] for j in resp.json()["items"]]


def _is_missing(resp: Any, job_id: str) -> None:
    """Exactly the answer for a job that does not exist."""
    assert resp.status_code == 404, resp.text
    assert resp.headers["content-type"] == PROBLEM
    body = resp.json()
    assert body["code"] == "not_found" and body["detail"] == f"no job {job_id!r}"


@PG
def test_another_user_can_neither_list_read_follow_nor_cancel(
        client: Any, ctx: Any, alice: dict[str, str], bob: dict[str, str],
        admin: dict[str, str], submit: Submit) -> None:
    job = submit(alice)
    jid = job["id"]
    assert job["owner"] == "alice" and ctx.store.get_job(jid).owner == "alice"
    mine = submit(bob, {**SUBMIT, "trials": 8})
    assert _ids(client, alice) == [jid]
    assert _ids(client, bob) == [mine["id"]]
    assert _ids(client, bob, state="QUEUED") == [mine["id"]]
    for path in (f"/v1/jobs/{jid}", f"/v1/jobs/{jid}/records", f"/v1/jobs/{jid}/events"):
        _is_missing(client.get(path, headers=bob), jid)
    _is_missing(client.post(f"/v1/jobs/{jid}/cancel", headers=bob), jid)
    assert ctx.store.get_job(jid).state == "QUEUED"  # not cancelled
    # the owner reads and follows it as before
    assert client.get(f"/v1/jobs/{jid}", headers=alice).json()["id"] == jid
    assert client.get(f"/v1/jobs/{jid}/records", headers=alice).status_code == 200
    # an admin sees and cancels both
    assert set(_ids(client, admin)) == {jid, mine["id"]}
    assert client.get(f"/v1/jobs/{mine['id']}", headers=admin).json()["owner"] == "bob"
    cancelled = client.post(f"/v1/jobs/{jid}/cancel", headers=admin)
    assert cancelled.status_code == 202 and cancelled.json()["state"] == "CANCELLED"


@PG
def test_idempotency_keys_are_per_owner(client: Any, ctx: Any, alice: dict[str, str],
                                        bob: dict[str, str]) -> None:
    first = client.post("/v1/jobs", json=SUBMIT, headers={**alice, "Idempotency-Key": "k-1"})
    assert first.status_code == 202
    a_id = first.json()["id"]
    # Bob reusing Alice's key (same body, then another body) makes his own jobs
    same = client.post("/v1/jobs", json=SUBMIT, headers={**bob, "Idempotency-Key": "k-1"})
    assert same.status_code == 202, same.text
    assert same.json()["id"] != a_id and a_id not in same.text
    assert same.json()["owner"] == "bob"
    other = client.post("/v1/jobs", json={**SUBMIT, "trials": 9},
                        headers={**alice, "Idempotency-Key": "k-2"})
    b_other = client.post("/v1/jobs", json=SUBMIT, headers={**bob, "Idempotency-Key": "k-2"})
    assert b_other.status_code == 202 and other.json()["id"] not in b_other.text
    # each owner's replay still returns that owner's job
    again = client.post("/v1/jobs", json=SUBMIT, headers={**bob, "Idempotency-Key": "k-1"})
    assert again.json()["id"] == same.json()["id"]
    replay = client.post("/v1/jobs", json=SUBMIT, headers={**alice, "Idempotency-Key": "k-1"})
    assert replay.json()["id"] == a_id
    # a conflict names only the caller's own job
    clash = client.post("/v1/jobs", json={**SUBMIT, "trials": 5},
                        headers={**bob, "Idempotency-Key": "k-1"})
    assert clash.status_code == 422 and clash.json()["code"] == "idempotency_conflict"
    assert a_id not in clash.text and same.json()["id"] in clash.text
    assert sorted(_ids(client, alice)) == sorted([a_id, other.json()["id"]])


@PG
@pytest.mark.parametrize("key", ["", "   ", "\t", "x" * 201, "caf\u00e9"])
def test_bad_idempotency_key_is_a_422(client: Any, user: dict[str, str], key: str) -> None:
    resp = client.post("/v1/jobs", json=SUBMIT,
                       headers={**user, "Idempotency-Key": key.encode()})
    assert resp.status_code == 422, resp.text
    assert resp.headers["content-type"] == PROBLEM
    assert resp.json()["code"] == "validation_error"
    assert _ids(client, user) == []


@PG
def test_tvmscript_is_shown_to_its_owner_only(client: Any, alice: dict[str, str],
                                              bob: dict[str, str], admin: dict[str, str],
                                              submit: Submit) -> None:
    from tuner.workloads.tir import TIR_EXAMPLE

    spec = {"op": "tir", "tvmscript": TIR_EXAMPLE, "num_outputs": 1}
    job = submit(alice, {"workload": spec, "target": "host", "trials": 4})
    assert job["workload"]["tvmscript"] == TIR_EXAMPLE
    assert client.get(f"/v1/jobs/{job['id']}", headers=admin).json()["workload"] == job["workload"]
    _is_missing(client.get(f"/v1/jobs/{job['id']}", headers=bob), job["id"])
    assert "def scale" not in client.get("/v1/jobs", headers=bob).text


def test_shared_views_of_a_workload_omit_the_tvmscript() -> None:
    """The best record (GET /v1/best, shared by every user) shows a tir spec without its text."""
    from tuner.db.views import BestPublic, shared_spec

    tir = {"op": "tir", "tvmscript": "secret", "num_outputs": 1}
    assert shared_spec(tir) == {"op": "tir", "num_outputs": 1, "tvmscript_omitted": True}
    matmul = {"op": "matmul", "shape": [8, 8, 8]}
    assert shared_spec(matmul) == matmul
    fields: dict[str, Any] = dict.fromkeys(BestPublic.model_fields)
    fields.update(trial_id="t", workload_key="k", space="s", invalidity="ok", latencies_s=[],
                  noisy=False, decisions=[], knobs={}, tvm_version="x", measured_at="now",
                  schedule_python="", workload=tir, trust="local", emulated=False)
    assert "secret" not in BestPublic.model_validate(fields).model_dump_json()
