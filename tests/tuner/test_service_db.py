"""The service's tables on both backends: job state machine, cancellation, leases, listing,
tokens and workers."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tuner.core.errors import Conflict, NotFound, SpecError
from tuner.db import JobState, Store, jobs, tokens, workers


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
        store.set_job_state(queued.id, JobState.RUNNING)

    job = _job(store, ids)
    store.set_job_state(job.id, JobState.RUNNING)
    assert jobs.request_cancel(store, job.id).state is JobState.CANCELLING
    assert jobs.request_cancel(store, job.id).state is JobState.CANCELLING
    with pytest.raises(Conflict):
        store.set_job_state(job.id, JobState.SUCCEEDED)  # a cancel cannot turn into success
    done = store.set_job_state(job.id, JobState.CANCELLED)
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
    store.set_job_state(second.id, JobState.RUNNING)
    finished = store.set_job_state(second.id, JobState.SUCCEEDED)
    assert finished.lease_owner is None  # terminal states free the lease
    assert jobs.claim(store, "tuner-e", 30, job_id=second.id) is None
    assert jobs.claim(store, "tuner-e", 30, job_id=local.id) is None


def test_list_jobs_cursor_and_filter(store: Store, ids: tuple[int, int]) -> None:
    made = [_job(store, ids) for _ in range(5)]
    store.set_job_state(made[1].id, JobState.RUNNING)
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
    d = jobs.job_view(store, made[0]).model_dump()
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
        from tuner.db import tables as m
        assert all(tok not in (r.token_hash, r.name) for r in s.query(m.Token))
    tokens.revoke_token(store, p.token_id)
    assert tokens.verify_token(store, tok) is None
    with pytest.raises(SpecError, match="scope"):
        tokens.create_token(store, "root")


def test_workers_register_heartbeat_and_go_offline(store: Store) -> None:
    w = workers.register_worker(store, name="w1", device_key="znver5",
                                target_json='{"kind":"llvm"}',
                                capabilities={"vnni": True}, tvm_version="0.27", hostname="h")
    assert w.state == "idle" and w.target == {"kind": "llvm"} and w.capabilities == {"vnni": True}
    hb = workers.heartbeat(store, w.id, state="busy", measured=3, failures=1, infra_failures=0)
    assert hb.state == "busy" and hb.measured == 3 and hb.last_seen_at >= w.last_seen_at
    assert [x.state for x in workers.list_workers(store, stale_after_s=60)] == ["busy"]
    time.sleep(0.3)
    assert [x.state for x in workers.list_workers(store, stale_after_s=0.1)] == ["offline"]
    with pytest.raises(NotFound, match="register"):
        workers.heartbeat(store, "nope", state="idle", measured=0, failures=0, infra_failures=0)


def test_cursors_round_trip_and_reject_what_was_not_handed_out() -> None:
    from datetime import UTC, datetime

    from tuner.db import cursor

    when = datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    assert cursor.parse_job_cursor(cursor.job_cursor(when, "ab" * 16)) == (when, "ab" * 16)
    assert cursor.parse_record_cursor(cursor.record_cursor(12345)) == 12345
    biggest = cursor.MAX_RECORD_ID
    assert cursor.parse_record_cursor(cursor.record_cursor(biggest)) == biggest
    bad = [cursor.record_cursor(biggest + 1), cursor.encode("r"), cursor.encode("r-1"),
           cursor.encode("r" + "9" * 5000), cursor.encode("x12"), cursor.encode("r١٢"),
           "A" * (cursor.MAX_CURSOR_CHARS + 4), "", "%%%", "w6k"]
    for text in bad:
        with pytest.raises(SpecError, match="cursor"):
            cursor.parse_record_cursor(text)
    for text in [cursor.encode("no separator"), cursor.encode("|id"),
                 cursor.encode(f"{when.isoformat()}|"), cursor.encode("yesterday|id"),
                 cursor.encode(f"{when.isoformat()}|{'x' * 65}"), cursor.record_cursor(3)]:
        with pytest.raises(SpecError, match="cursor"):
            cursor.parse_job_cursor(text)


def test_records_page_is_keyset_paginated(store: Store, ids: tuple[int, int]) -> None:
    from tuner.db.rows import NewRecord

    job = _job(store, ids)
    store.add_records([NewRecord(
        trial_id=f"t{i}", job_id=job.id, workload_id=ids[0], target_id=ids[1], space="s",
        cand_hash=f"c{i}", trace_json="[]", invalidity="ok", tvm_version="x",
        latencies=[1e-3, 1.3e-3], median_s=1e-3, cv=0.2 if i == 1 else 0.01) for i in range(3)])
    first, nxt = jobs.records_page(store, job, limit=2)
    assert [r.trial_id for r in first] == ["t0", "t1"] and nxt is not None
    assert [r.noisy for r in first] == [False, True]  # cv 0.2 > TUNEFARM_NOISE_CV 0.1
    assert first[0].gflops == pytest.approx(2 / 1e-3 / 1e9)
    rest, nxt = jobs.records_page(store, job, limit=2, cursor=nxt)
    assert [r.trial_id for r in rest] == ["t2"] and nxt is None
