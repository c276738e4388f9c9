"""POST/GET /v1/models and cancel, against the real PostgreSQL and Redis: a model job is vetted
task by task, counted as one job by the quotas, starts its first round at once, and is its
owner's alone."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.tasks import TASKS

pytestmark = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
PROBLEM = "application/problem+json"
TARGET = {"kind": "llvm", "num-cores": 1}
BODY = {"name": "mlp", "tasks": TASKS, "target": TARGET, "trials": 8, "round_trials": 4,
        "batch_size": 4}


def _post(client: Any, headers: dict[str, str], body: dict[str, Any] | None = None,
          key: str | None = None) -> Any:
    h = {**headers, **({"Idempotency-Key": key} if key else {})}
    return client.post("/v1/models", json=body or BODY, headers=h)


def test_a_model_job_starts_its_first_round(client: Any, ctx: Any, user: dict[str, str],
                                            redis_client: Any) -> None:
    resp = _post(client, user)
    assert resp.status_code == 202, resp.text
    model = resp.json()
    assert resp.headers["location"] == f"/v1/models/{model['id']}"
    assert model["state"] == "RUNNING" and model["trials"] == 8 and model["trials_done"] == 0
    assert [t["name"] for t in model["tasks"]] == ["fused_matmul", "relu"]
    assert [t["weight"] for t in model["tasks"]] == [2, 1]
    assert model["estimate_s"] is None and model["estimates"] == [[0, None]]
    # the heaviest task gets the first round: an ordinary QUEUED job of the owner, woken up
    first = model["tasks"][0]
    assert first["state"] == "QUEUED" and model["tasks"][1]["job_id"] is None
    job = client.get(f"/v1/jobs/{first['job_id']}", headers=user).json()
    assert job["model_id"] == model["id"] and job["trials"] == 4 and job["state"] == "QUEUED"
    assert job["task_name"] == "fused_matmul"  # the jobs list and page name the task
    listed_jobs = client.get("/v1/jobs", headers=user).json()["items"]
    assert [j["task_name"] for j in listed_jobs] == ["fused_matmul"]
    assert job["workload"]["op"] == "tir" and job["owner"] == "test-user"
    assert [e[1] for e in redis_client.xrange(ctx.keys.jobs)] == [{"job_id": first["job_id"]}]
    got = client.get(resp.headers["location"], headers=user)
    assert got.status_code == 200 and got.json()["id"] == model["id"]
    listed = client.get("/v1/models", headers=user).json()["items"]
    assert [m["id"] for m in listed] == [model["id"]]


def test_model_jobs_are_listed_a_page_at_a_time(client: Any, user: dict[str, str]) -> None:
    made = [_post(client, user, {**BODY, "name": f"m{i}", "trials": 8 + i}).json()["id"]
            for i in range(5)]
    seen, cursor, pages = [], None, 0
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        resp = client.get("/v1/models", params=params, headers=user)
        assert resp.status_code == 200, resp.text
        page = resp.json()
        seen += [m["id"] for m in page["items"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == made[::-1] and pages == 3  # newest first, each once
    bad = client.get("/v1/models", params={"cursor": "not-a-cursor"}, headers=user)
    assert bad.status_code == 400 and bad.json()["code"] == "bad_cursor"


def test_a_bad_task_is_a_422_naming_it_and_stores_nothing(client: Any, ctx: Any,
                                                          user: dict[str, str]) -> None:
    bad = {**BODY, "tasks": [TASKS[0], {**TASKS[1], "tvmscript": "import os\nos.system('x')"}]}
    resp = _post(client, user, bad)
    assert resp.status_code == 422 and resp.headers["content-type"] == PROBLEM, resp.text
    assert resp.json()["field"] == "tasks.1.tvmscript" and resp.json()["code"] == "invalid_spec"
    assert client.get("/v1/models", headers=user).json()["items"] == []
    assert client.get("/v1/jobs", headers=user).json()["items"] == []


@pytest.mark.parametrize("change,field", [
    ({"tasks": []}, "tasks"),
    ({"tasks": [{**TASKS[0], "weight": 0}]}, "weight"),
    ({"tasks": [{**TASKS[0], "name": "../etc"}]}, "name"),
    ({"tasks": [{**TASKS[0], "extra": 1}]}, "extra"),
    ({"trials": "8"}, "trials"),
    ({"round_trials": 0}, "round_trials"),
    ({"target": {"kind": "no-such-kind"}}, "target"),
])
def test_bad_bodies_are_422s(client: Any, user: dict[str, str], change: dict[str, Any],
                             field: str) -> None:
    resp = _post(client, user, {**BODY, **change})
    assert resp.status_code == 422 and resp.headers["content-type"] == PROBLEM, resp.text
    assert field in resp.text


def test_idempotency_key(client: Any, user: dict[str, str], redis_client: Any, ctx: Any) -> None:
    first = _post(client, user, key="m-1")
    again = _post(client, user, key="m-1")
    assert first.status_code == 202 and again.json()["id"] == first.json()["id"]
    assert len(redis_client.xrange(ctx.keys.jobs)) == 1  # one first round
    other = _post(client, user, {**BODY, "trials": 9}, key="m-1")
    assert other.status_code == 422 and other.json()["code"] == "idempotency_conflict"


def test_another_owner_sees_nothing_and_an_admin_everything(
        client: Any, ctx: Any, user: dict[str, str], admin: dict[str, str]) -> None:
    from tests.api.conftest import bearer
    from tuner.db.tokens import create_token

    model = _post(client, user).json()
    other = bearer(create_token(ctx.store, "user", name="someone-else"))
    for method, path in (("GET", ""), ("POST", "/cancel")):
        resp = client.request(method, f"/v1/models/{model['id']}{path}", headers=other)
        assert resp.status_code == 404, resp.text
    assert client.get("/v1/models", headers=other).json()["items"] == []
    assert client.get(f"/v1/models/{model['id']}", headers=admin).status_code == 200


def test_cancel_cancels_the_round_in_flight(client: Any, user: dict[str, str]) -> None:
    model = _post(client, user).json()
    resp = client.post(f"/v1/models/{model['id']}/cancel", headers=user)
    assert resp.status_code == 202 and resp.json()["state"] == "CANCELLED"
    job = client.get(f"/v1/jobs/{model['tasks'][0]['job_id']}", headers=user).json()
    assert job["state"] == "CANCELLED"
    again = client.post(f"/v1/models/{model['id']}/cancel", headers=user)
    assert again.status_code == 202 and again.json()["state"] == "CANCELLED"


def test_a_model_job_counts_as_one_job_with_its_budget(client: Any, api_settings: Any,
                                                      user: dict[str, str]) -> None:
    api_settings.max_queued_jobs = 2
    api_settings.max_queued_trials = 20
    assert _post(client, user).status_code == 202  # 1 job, 8 trials (its task job not counted)
    over = _post(client, user, {**BODY, "trials": 13})  # 8 + 13 > 20
    assert over.status_code == 429 and over.json()["code"] == "quota_exceeded"
    assert "retry-after" in over.headers
    assert _post(client, user, {**BODY, "trials": 12}).status_code == 202  # 2 jobs, 20 trials
    third = client.post("/v1/jobs", json={"workload": {"op": "matmul", "shape": [16, 16, 16]},
                                          "target": TARGET, "trials": 1}, headers=user)
    assert third.status_code == 429, third.text
