"""The service's tables on both backends: job state machine, cancellation, leases, listing,
tokens and workers."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tuner.db import JobState, Store
from tuner.db import jobs, tokens, workers
from tuner.errors import Conflict, NotFound, SpecError


@pytest.fixture
def ids(store: Store) -> tuple[int, int]:
    wid = store.ensure_workload(key="matmul-k", op="matmul", spec_json="{}", shash="0" * 16,
                                mod_json="{}", flops=2)
    return wid, store.ensure_target('{"kind": "llvm"}', "local").id


def _job(store: Store, ids: tuple[int, int], **kw: Any) -> Any:
    return store.create_job(job_key="jk", workload_id=ids[0], target_id=ids[1], space="s",
                            trials=4, **kw)


def test_state_machine_and_cancel(store: Store, ids: tuple[int, int]) -> None:
    queued = _job(store, ids)
    assert jobs.request_cancel(store, queued.id).state is JobState.CANCELLED  # at once
    assert jobs.request_cancel(store, queued.id).state is JobState.CANCELLED  # idempotent
    with pytest.raises(Conflict):
        jobs.transition(store, queued.id, JobState.RUNNING)

    job = _job(store, ids)
    jobs.transition(store, job.id, JobState.RUNNING)
    assert jobs.request_cancel(store, job.id).state is JobState.CANCELLING
    assert jobs.request_cancel(store, job.id).state is JobState.CANCELLING
    with pytest.raises(Conflict):
        jobs.transition(store, job.id, JobState.SUCCEEDED)  # a cancel cannot turn into success
    done = jobs.transition(store, job.id, JobState.CANCELLED)
    assert done.state is JobState.CANCELLED and done.finished_at is not None
    with pytest.raises(NotFound):
        jobs.request_cancel(store, "nope")


def test_claim_renew_release_and_expiry(store: Store, ids: tuple[int, int]) -> None:
    local = _job(store, ids, lease_owner=jobs.LOCAL_OWNER)  # a CLI job: never claimed
    first = _job(store, ids)
    second = _job(store, ids)
    a = jobs.claim(store, "tuner-a", 30)
    assert a is not None and a.id == first.id and a.lease_owner == "tuner-a"
    b = jobs.claim(store, "tuner-b", 0.5)
    assert b is not None and b.id == second.id
    assert jobs.claim(store, "tuner-c", 30) is None  # all leased
    assert jobs.renew(store, first.id, "tuner-a", 30) and not jobs.renew(store, first.id, "x", 30)
    time.sleep(0.8)  # tuner-b died: its lease expires and another tuner takes the job over
    c = jobs.claim(store, "tuner-c", 30)
    assert c is not None and c.id == second.id and not jobs.renew(store, second.id, "tuner-b", 30)
    jobs.release(store, first.id, "tuner-a")
    assert jobs.claim(store, "tuner-d", 30, job_id=first.id) is not None
    jobs.transition(store, second.id, JobState.RUNNING)
    finished = jobs.transition(store, second.id, JobState.SUCCEEDED)
    assert finished.lease_owner is None  # terminal states free the lease
    assert jobs.claim(store, "tuner-e", 30, job_id=second.id) is None
    assert jobs.claim(store, "tuner-e", 30, job_id=local.id) is None


def test_list_jobs_cursor_and_filter(store: Store, ids: tuple[int, int]) -> None:
    made = [_job(store, ids) for _ in range(5)]
    jobs.transition(store, made[1].id, JobState.RUNNING)
    seen, cursor = [], None
    while True:
        page, cursor = jobs.list_jobs(store, limit=2, cursor=cursor)
        seen += [j.id for j in page]
        if cursor is None:
            break
    assert seen == [j.id for j in reversed(made)]  # newest first, nothing missed or repeated
    running, nxt = jobs.list_jobs(store, state="RUNNING")
    assert [j.id for j in running] == [made[1].id] and nxt is None
    with pytest.raises(SpecError, match="cursor"):
        jobs.list_jobs(store, cursor="garbage!")
    d = jobs.job_dict(store, made[0])
    assert d["state"] == "QUEUED" and d["trials_done"] == 0 and d["best"] is None
    assert d["workload_key"] == "matmul-k" and d["device_key"] == "local"


def test_tokens_are_hashed_scoped_and_revocable(store: Store) -> None:
    tok = tokens.create_token(store, "worker", name="rack-1")
    assert tok.startswith("tf_") and len(tok) > 30
    p = tokens.verify_token(store, tok)
    assert p is not None and p.scope is tokens.Scope.WORKER and p.name == "rack-1"
    assert tokens.verify_token(store, tok + "x") is None
    assert p.scope.allows(tokens.Scope.WORKER) and not p.scope.allows(tokens.Scope.USER)
    assert tokens.Scope.ADMIN.allows(tokens.Scope.USER)
    with store.session() as s:  # only the hash is stored
        from tuner.db import models as m
        assert all(tok not in (r.token_hash, r.name) for r in s.query(m.Token))
    tokens.revoke_token(store, p.token_id)
    assert tokens.verify_token(store, tok) is None
    with pytest.raises(SpecError, match="scope"):
        tokens.create_token(store, "root")


def test_workers_register_heartbeat_and_go_offline(store: Store) -> None:
    w = workers.register_worker(store, name="w1", device_key="znver5", target_json='{"kind":"llvm"}',
                                capabilities={"vnni": True}, tvm_version="0.27", hostname="h")
    assert w.state == "idle" and w.target == {"kind": "llvm"} and w.capabilities == {"vnni": True}
    hb = workers.heartbeat(store, w.id, state="busy", measured=3, failures=1, infra_failures=0)
    assert hb.state == "busy" and hb.measured == 3 and hb.last_seen_at >= w.last_seen_at
    assert [x.state for x in workers.list_workers(store, stale_after_s=60)] == ["busy"]
    time.sleep(0.3)
    assert [x.state for x in workers.list_workers(store, stale_after_s=0.1)] == ["offline"]
    with pytest.raises(NotFound, match="register"):
        workers.heartbeat(store, "nope", state="idle", measured=0, failures=0, infra_failures=0)
