"""What the dashboard reads: the page and its modules (served by the API, locked down by CSP),
GET /v1/whoami, a job's points, the best-schedule table GET /v1/workloads, and the jobs list's
op and owner filters, with their scopes and ownership."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from tests.api.conftest import SUBMIT, bearer

Submit = Callable[..., dict[str, Any]]
ResultFor = Callable[..., dict[str, Any]]
IMPORT = re.compile(r'^import .* from "(\.{1,2}/[^"]+)";$', re.M)


def _post(client: Any, worker: dict[str, str], body: dict[str, Any]) -> None:
    resp = client.post("/v1/workers/w/results", json=body, headers=worker)
    assert resp.status_code == 200, resp.text


def test_the_page_and_every_module_it_imports_are_served_with_a_strict_policy(
        client: Any) -> None:
    page = client.get("/ui")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert "<script>" not in page.text  # no inline script: the CSP would refuse it
    root = client.get("/", follow_redirects=False)
    assert root.status_code == 307 and root.headers["location"] == "/ui"
    # walk the module graph from the page: every import resolves, as JavaScript
    todo = re.findall(r'(?:src|href)="(/ui/static/[^"]+)"', page.text)
    seen: set[str] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        resp = client.get(path)
        assert resp.status_code == 200, path
        assert resp.headers["x-content-type-options"] == "nosniff"
        if path.endswith(".js"):
            assert resp.headers["content-type"].startswith("text/javascript"), path
            base = path.rsplit("/", 1)[0]
            for rel in IMPORT.findall(resp.text):
                parts = f"{base}/{rel}".split("/")
                out: list[str] = []
                for part in parts:
                    if part == "..":
                        out.pop()
                    elif part != ".":
                        out.append(part)
                todo.append("/".join(out))
    assert {"/ui/static/app.js", "/ui/static/chart.js", "/ui/static/pages/job.js"} <= seen
    assert client.get("/ui/static/../../app.py").status_code == 404


def test_whoami_names_the_token_and_the_declared_peaks(client: Any, tokens: dict[str, str],
                                                      api_settings: Any) -> None:
    api_settings.peak_gflops = {"local": 230.0}
    for scope in ("user", "worker", "admin"):
        resp = client.get("/v1/whoami", headers=bearer(tokens[scope]))
        assert resp.status_code == 200, resp.text
        me = resp.json()
        assert me["scope"] == scope and me["name"] == me["owner"] == f"test-{scope}"
        assert me["peak_gflops"] == {"local": 230.0}
    missing = client.get("/v1/whoami")
    assert missing.status_code == 401 and missing.json()["code"] == "unauthorized"


def test_points_are_the_jobs_records_as_columns_for_its_owner_only(
        client: Any, ctx: Any, user: dict[str, str], worker: dict[str, str], admin: dict[str, str],
        tokens: dict[str, str], submit: Submit, result_for: ResultFor) -> None:
    from tuner.db.tokens import create_token

    job = submit(user)
    bodies = [result_for(job, latency_s=2e-3), result_for(job, invalidity="run_error",
                                                          latency_s=None),
              result_for(job, latency_s=1e-3)]
    for body in bodies:
        _post(client, worker, body)
    resp = client.get(f"/v1/jobs/{job['id']}/points", headers=user)
    assert resp.status_code == 200, resp.text
    pts = resp.json()
    m, n, k = SUBMIT["workload"]["shape"]
    assert pts["flops"] == 2 * m * n * k
    assert pts["trial_id"] == [b["input"]["trial_id"] for b in bodies]
    assert pts["invalidity"] == ["ok", "run_error", "ok"]
    assert pts["latency_s"][0] == pytest.approx(2e-3) and pts["latency_s"][1] is None
    assert pts["gflops"][2] == pytest.approx(pts["flops"] / pts["latency_s"][2] / 1e9)
    assert pts["worker"] == ["w", "w", "w"] and pts["worker_name"] == ["w", "w", "w"]
    assert "trace" not in pts
    assert client.get(f"/v1/jobs/{job['id']}/points", headers=admin).status_code == 200
    other = bearer(create_token(ctx.store, "user", name="someone-else"))
    hidden = client.get(f"/v1/jobs/{job['id']}/points", headers=other)
    assert hidden.status_code == 404 and hidden.json()["code"] == "not_found"
    assert client.get(f"/v1/jobs/{job['id']}/points", headers=worker).status_code == 403


def test_a_memory_bound_job_is_measured_in_gb_per_s(client: Any, user: dict[str, str],
                                                    worker: dict[str, str], submit: Submit,
                                                    result_for: ResultFor,
                                                    api_settings: Any) -> None:
    soft = submit(user, {**SUBMIT, "workload": {"op": "softmax", "shape": [64, 128]}})
    mm = submit(user)  # 128^3 matmul (SUBMIT): 21 flop per byte
    for job in (soft, mm):
        _post(client, worker, result_for(job, latency_s=2e-3))
    got = client.get(f"/v1/jobs/{soft['id']}", headers=user).json()
    assert got["nbytes"] == 2 * 64 * 128 * 4 and got["memory_bound"] is True
    assert got["best"]["gbps"] == pytest.approx(got["nbytes"] / 2e-3 / 1e9, rel=0.02)
    pts = client.get(f"/v1/jobs/{soft['id']}/points", headers=user).json()
    assert pts["nbytes"] == got["nbytes"] and pts["memory_bound"] is True
    mine = client.get(f"/v1/jobs/{mm['id']}", headers=user).json()
    assert mine["memory_bound"] is False and mine["nbytes"] == 3 * 128 * 128 * 4
    # the board's declared balance decides: on one of 40 flop per byte the matmul is
    # memory-bound
    api_settings.peak_gflops, api_settings.peak_gbps = {"local": 400.0}, {"local": 10.0}
    assert client.get(f"/v1/jobs/{mm['id']}", headers=user).json()["memory_bound"] is True
    me = client.get("/v1/whoami", headers=user).json()
    assert me["peak_gbps"] == {"local": 10.0}


def test_points_name_each_records_knobs_with_their_importance_and_download_as_csv(
        client: Any, user: dict[str, str], worker: dict[str, str], submit: Submit,
        result_for: ResultFor) -> None:
    job = submit(user)
    # latency follows `mr` exactly (with repeats of each value), `unroll` only by chance
    rows = [({"mr": mr, "unroll": u, "tile_m": [2, mr]}, 1e-3 * mr)
            for mr, u in [(2, 0), (2, 16), (4, 0), (4, 16), (8, 0), (8, 16)]]
    bodies = [result_for(job, latency_s=lat, knobs=k) for k, lat in rows]
    bodies.append(result_for(job))  # a record measured before knobs were named
    for body in bodies:
        _post(client, worker, body)
    pts = client.get(f"/v1/jobs/{job['id']}/points", headers=user).json()
    assert list(pts["knobs"]) == ["mr", "unroll", "tile_m"]
    assert pts["knobs"]["mr"] == [2, 2, 4, 4, 8, 8, None]
    assert pts["knobs"]["tile_m"][0] == [2, 2]
    imp = pts["knob_importance"]
    assert imp["mr"] == pytest.approx(1.0, abs=0.01)  # it alone sets the latency
    assert imp["unroll"] == 0.0  # it explains nothing beyond chance
    assert imp["tile_m"] == pytest.approx(imp["mr"])  # its second factor is mr
    record = client.get(f"/v1/jobs/{job['id']}/records", headers=user).json()["items"][0]
    assert record["knobs"] == rows[0][0]

    resp = client.get(f"/v1/jobs/{job['id']}/points.csv", headers=user)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/csv")
    assert "attachment" in resp.headers["content-disposition"]
    table = list(csv.DictReader(io.StringIO(resp.text)))
    assert [r["trial_id"] for r in table] == pts["trial_id"]
    assert table[0]["mr"] == "2" and json.loads(table[0]["tile_m"]) == [2, 2]
    assert table[-1]["mr"] == ""  # no knobs named
    assert client.get(f"/v1/jobs/{job['id']}/points.csv", headers=worker).status_code == 403


def test_the_best_table_gives_each_workloads_best_and_its_speedup_over_the_first(
        client: Any, user: dict[str, str], worker: dict[str, str], submit: Submit,
        result_for: ResultFor, confirm: Callable[..., Any]) -> None:
    assert client.get("/v1/workloads", headers=user).json() == []
    job = submit(user)
    first = result_for(job, latency_s=4e-3)
    best = result_for(job, latency_s=1e-3)
    for body in (result_for(job, invalidity="build_error", latency_s=None), first, best,
                 result_for(job, latency_s=3e-3)):
        _post(client, worker, body)
    assert client.get("/v1/workloads", headers=user).json() == []  # no best confirmed yet
    confirm(best)  # a second measurement (not counted as one of the records below)
    resp = client.get("/v1/workloads", headers=worker)  # shared: any reader
    assert resp.status_code == 200, resp.text
    (row,) = resp.json()
    assert row["workload_key"] == job["workload_key"] and row["op"] == "matmul"
    assert row["target"] == job["target"] and row["device_key"] == job["device_key"]
    assert (row["records"], row["valid"]) == (4, 3)
    assert row["best_s"] == pytest.approx(1e-3) and row["first_s"] == pytest.approx(4e-3)
    assert row["speedup"] == pytest.approx(4.0)
    assert row["best_trial_id"] == best["input"]["trial_id"]
    assert row["best_gflops"] == pytest.approx(2 * 128**3 / 1e-3 / 1e9, rel=1e-6)
    assert "tvmscript" not in str(row) and "owner" not in row
    assert client.get("/v1/workloads", params={"op": "conv2d"}, headers=user).json() == []
    assert len(client.get("/v1/workloads", params={"op": "matmul"}, headers=user).json()) == 1
    bad = client.get("/v1/workloads", params={"op": "matmul'; --"}, headers=user)
    assert bad.status_code == 422 and bad.headers["content-type"] == "application/problem+json"


def test_a_models_primfunc_is_named_by_its_owners_tasks_only(
        client: Any, ctx: Any, user: dict[str, str], worker: dict[str, str],
        admin: dict[str, str], result_for: ResultFor, confirm: Callable[..., Any]) -> None:
    from tests.support.tasks import TASKS
    from tuner.db.tokens import create_token

    body = {"name": "mlp", "tasks": TASKS, "target": {"kind": "llvm", "num-cores": 1},
            "trials": 8, "round_trials": 4, "batch_size": 4}
    resp = client.post("/v1/models", json=body, headers=user)
    assert resp.status_code == 202, resp.text
    job = client.get(f"/v1/jobs/{resp.json()['tasks'][0]['job_id']}", headers=user).json()
    posted = result_for(job, latency_s=1e-4)
    _post(client, worker, posted)
    confirm(posted)

    def names(headers: dict[str, str]) -> list[list[str]]:
        got = client.get("/v1/workloads", headers=headers)
        assert got.status_code == 200, got.text
        return [row["task_names"] for row in got.json()]

    assert names(user) == [["fused_matmul"]]  # the dashboard's row says what it is in the model
    assert names(admin) == [["fused_matmul"]]
    other = bearer(create_token(ctx.store, "user", name="someone-else"))
    assert names(other) == [[]] and names(worker) == [[]]  # the row is shared, the names not


def test_jobs_filter_by_op_and_an_admin_by_owner(client: Any, ctx: Any, user: dict[str, str],
                                                admin: dict[str, str], submit: Submit) -> None:
    from tuner.db.tokens import create_token

    carol = bearer(create_token(ctx.store, "user", name="carol"))
    mine = submit(user)
    conv = submit(user, {**SUBMIT, "workload": {"op": "conv2d", "shape": [1, 8, 16, 16, 8, 3, 3]},
                         "trials": 4})
    hers = submit(carol, {**SUBMIT, "trials": 8})

    def ids(headers: dict[str, str], **params: str) -> list[str]:
        resp = client.get("/v1/jobs", params=params, headers=headers)
        assert resp.status_code == 200, resp.text
        return [j["id"] for j in resp.json()["items"]]

    assert ids(user, op="matmul") == [mine["id"]]
    assert ids(user, op="conv2d") == [conv["id"]]
    assert ids(admin, op="matmul") == [hers["id"], mine["id"]]
    assert ids(admin, owner="carol") == [hers["id"]]
    assert ids(admin, owner="carol", op="conv2d") == []
    assert ids(user, owner="test-user", op="matmul") == [mine["id"]]
    assert ids(user, owner="carol") == []  # not an error, and nothing of carol's
    bad = client.get("/v1/jobs", params={"op": "Mat Mul"}, headers=user)
    assert bad.status_code == 422
