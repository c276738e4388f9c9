"""Per-owner quotas (queued jobs, trials per job, queued trials) and per-principal request
rates: over a limit, a 429 problem+json with Retry-After, and nothing is created."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from tests.api.conftest import SUBMIT, bearer

PG = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
PROBLEM = "application/problem+json"
Limited = Callable[..., AbstractContextManager[tuple[Any, dict[str, str], dict[str, str]]]]


@pytest.fixture
def limited(api_settings: Any) -> Limited:
    """limited(**settings) -> a context of (client, alice's headers, bob's headers) of an app
    whose settings carry the given limits."""

    @contextmanager
    def run(**limits: Any) -> Iterator[tuple[Any, dict[str, str], dict[str, str]]]:
        from fastapi.testclient import TestClient

        from api.app import create_app
        from tuner.db.tokens import create_token

        with TestClient(create_app(api_settings.model_copy(update=limits))) as c:
            store = c.app.state.ctx.store  # type: ignore[attr-defined]
            yield (c, bearer(create_token(store, "user", name="alice")),
                   bearer(create_token(store, "user", name="bob")))

    return run


def _over(resp: Any, code: str = "quota_exceeded") -> dict[str, Any]:
    assert resp.status_code == 429, resp.text
    assert resp.headers["content-type"] == PROBLEM
    assert int(resp.headers["retry-after"]) >= 1
    body: dict[str, Any] = resp.json()
    assert body["code"] == code and body["status"] == 429
    return body


def _workloads(client: Any) -> int:
    from sqlalchemy import func, select

    from tuner.db import tables as m

    with client.app.state.ctx.store.session() as s:
        return int(s.scalar(select(func.count()).select_from(m.Workload)) or 0)


def _jobs(client: Any, headers: dict[str, str]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = client.get("/v1/jobs", headers=headers).json()["items"]
    return items


@PG
def test_queued_jobs_per_owner(limited: Limited, redis_client: Any) -> None:
    with limited(max_queued_jobs=2) as (c, alice, bob):
        first = c.post("/v1/jobs", json=SUBMIT, headers=alice).json()
        c.post("/v1/jobs", json={**SUBMIT, "trials": 8}, headers=alice)
        enqueued = len(redis_client.xrange(c.app.state.ctx.keys.jobs))
        workloads = _workloads(c)
        over = {**SUBMIT, "trials": 9, "workload": {"op": "matmul", "shape": [96, 96, 96]}}
        body = _over(c.post("/v1/jobs", json=over, headers=alice))
        assert "alice" in body["detail"] and "2" in body["detail"]
        assert _workloads(c) == workloads  # refused before its workload was registered
        assert len(_jobs(c, alice)) == 2  # nothing created, nothing enqueued
        assert len(redis_client.xrange(c.app.state.ctx.keys.jobs)) == enqueued
        assert c.post("/v1/jobs", json=SUBMIT, headers=bob).status_code == 202  # per owner
        c.post(f"/v1/jobs/{first['id']}/cancel", headers=alice)  # a finished job frees a slot
        assert c.post("/v1/jobs", json=SUBMIT, headers=alice).status_code == 202


@PG
def test_a_running_job_counts_and_an_idempotent_replay_does_not(limited: Limited) -> None:
    with limited(max_queued_jobs=1) as (c, alice, _):
        key = {**alice, "Idempotency-Key": "once"}
        job = c.post("/v1/jobs", json=SUBMIT, headers=key).json()
        c.app.state.ctx.store.set_job_state(job["id"], "RUNNING")
        _over(c.post("/v1/jobs", json=SUBMIT, headers=alice))
        again = c.post("/v1/jobs", json=SUBMIT, headers=key)  # the same request: its job
        assert again.status_code == 202 and again.json()["id"] == job["id"]


@PG
def test_trials_per_job_and_queued_trials(limited: Limited) -> None:
    with limited(max_trials_per_job=100, max_queued_trials=150) as (c, alice, bob):
        body = _over(c.post("/v1/jobs", json={**SUBMIT, "trials": 101}, headers=alice))
        assert "100" in body["detail"]
        assert c.post("/v1/jobs", json={**SUBMIT, "trials": 100}, headers=alice).status_code == 202
        _over(c.post("/v1/jobs", json={**SUBMIT, "trials": 51}, headers=alice))
        assert c.post("/v1/jobs", json={**SUBMIT, "trials": 50}, headers=alice).status_code == 202
        assert [j["trials"] for j in _jobs(c, alice)] == [50, 100]
        assert c.post("/v1/jobs", json={**SUBMIT, "trials": 100}, headers=bob).status_code == 202


@PG
def test_request_rate_per_principal(limited: Limited) -> None:
    with limited(rate_per_s=0.5, rate_burst=3) as (c, alice, bob):
        for _ in range(3):
            assert c.get("/v1/jobs", headers=alice).status_code == 200
        _over(c.get("/v1/jobs", headers=alice), "rate_limited")
        _over(c.post("/v1/jobs", json=SUBMIT, headers=alice), "rate_limited")
        assert _jobs(c, bob) == []  # bob has a bucket of his own; nothing was created
        assert c.get("/healthz").status_code == 200  # unauthenticated probes are not counted


def test_token_bucket() -> None:
    from api.ratelimit import RateLimiter

    rl = RateLimiter(rate_per_s=2.0, burst=2)
    assert rl.take("a", now=0.0) == 0 and rl.take("a", now=0.0) == 0
    assert rl.take("a", now=0.0) == pytest.approx(0.5)  # empty: refills 2/s
    assert rl.take("b", now=0.0) == 0  # another principal
    assert rl.take("a", now=0.5, peek=True) == 0  # a peek takes nothing
    assert rl.take("a", now=0.5) == 0 and rl.take("a", now=0.5) > 0
    assert rl.take("a", now=100.0) == 0 and rl.take("a", now=100.0) == 0  # never above burst
    assert rl.take("a", now=100.0) > 0
    assert RateLimiter(rate_per_s=0, burst=1).take("a") == 0  # 0: no limit


@PG
def test_the_embedded_cli_is_not_limited(store: Any) -> None:
    """create_job enforces quotas for every front end but the embedded CLI (`tunefarm tune`)."""
    from tuner.core.config import Settings
    from tuner.core.errors import QuotaExceeded
    from tuner.db import jobs as jobs_db
    from tuner.db import register_workload
    from tuner.workloads import parse_spec

    wl = parse_spec(dict(SUBMIT["workload"]))  # type: ignore[call-overload]
    new = jobs_db.NewJob(workload_id=register_workload(store, wl), workload_key=wl.key,
                         target=store.ensure_target('{"kind": "llvm"}', "local"), space="s",
                         trials=10, options=jobs_db.JobOptions(batch_size=2, seed=1))
    tight = Settings(max_queued_jobs=1, max_trials_per_job=5, max_queued_trials=5)
    for _ in range(2):  # the CLI's own jobs
        jobs_db.create_job(store, replace(new, lease_owner=jobs_db.LOCAL_OWNER),
                           settings=tight)
    with pytest.raises(QuotaExceeded) as exc:
        jobs_db.create_job(store, new, settings=tight)  # a service job of the same owner
    assert exc.value.code == "quota_exceeded" and exc.value.retry_after > 0


@PG
def test_tokens_of_one_principal_share_its_rate(limited: Limited) -> None:
    """The rate is the principal's (the token name), not a token's: a second token of the same
    name does not double it."""
    from tuner.db.tokens import create_token

    with limited(rate_per_s=0.5, rate_burst=3) as (c, alice, _):
        alice2 = bearer(create_token(c.app.state.ctx.store, "user", name="alice"))
        for headers in (alice, alice2, alice):
            assert c.get("/v1/jobs", headers=headers).status_code == 200
        _over(c.get("/v1/jobs", headers=alice2), "rate_limited")


@PG
def test_refused_tokens_are_limited_per_address_before_any_lookup(
        limited: Limited, monkeypatch: pytest.MonkeyPatch) -> None:
    """Guessing tokens: past AUTH_FAILURES_BURST refusals from one address, it gets 429 without
    a token lookup, its next requests too until the bucket refills."""
    from api import ratelimit
    from api.ratelimit import AUTH_FAILURES_BURST

    # the buckets' clock stands still: on a loaded machine, 0.2 s between two requests refills
    # one refusal (AUTH_FAILURES_PER_S), and the 429 this test expects would become a 401
    monkeypatch.setattr(ratelimit, "time", SimpleNamespace(monotonic=lambda: 1000.0))
    with limited() as (c, alice, _):
        refused = 0
        while (resp := c.get("/v1/jobs", headers=bearer(f"tf_guess{refused}"))).status_code == 401:
            refused += 1
            assert refused <= AUTH_FAILURES_BURST, "refusals are not limited"
        assert refused == AUTH_FAILURES_BURST
        _over(resp, "rate_limited")
        store = c.app.state.ctx.store
        lookups: list[str] = []
        real = type(store).session

        def counting(self: Any) -> Any:
            lookups.append("session")
            return real(self)

        type(store).session = counting  # type: ignore[method-assign]
        try:
            body = _over(c.get("/v1/jobs", headers=bearer("tf_guess-next")), "rate_limited")
            assert "address" in body["detail"]
            assert lookups == []  # refused before the token was looked up
        finally:
            type(store).session = real  # type: ignore[method-assign]
        _over(c.get("/v1/jobs", headers=alice), "rate_limited")  # the same address
