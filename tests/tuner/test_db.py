"""The SQL tuning database (tuner.db), on SQLite and on a real PostgreSQL."""

from __future__ import annotations

import hashlib
import threading
from datetime import UTC
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text

from tuner.core.errors import Conflict, DatabaseError, NotFound
from tuner.db import JobState, NewRecord, Store, normalize_url, target_key
from tuner.db.engine import UPGRADE_COMMAND, alembic_config
from tuner.db.tables import Base
from tuner.measure import Invalidity

TARGET = '{"kind": "llvm", "mcpu": "znver5", "num-cores": 2, "keys": ["cpu"]}'


def _workload(store: Store, key: str = "matmul-64", shash: str = "00112233aabbccdd") -> int:
    return store.ensure_workload(key=key, op="matmul", spec_json='{"n":64}', shash=shash,
                                 mod_json="{}", description="64x64 matmul", flops=2 * 64**3)


def _rec(trial: str, wid: int, tid: int, *, inv: Invalidity = Invalidity.OK,
         median: float | None = 1e-3, cand: str | None = None, job: str | None = None,
         features: bytes | None = b"\0\0\x80?") -> NewRecord:
    lat = [median, median] if median is not None else []
    return NewRecord(trial_id=trial, workload_id=wid, target_id=tid, space="default",
                     cand_hash=cand or trial, trace_json="[[], []]", invalidity=inv,
                     tvm_version="test", job_id=job, decisions=[[1, "SamplePerfectTile", [4, 16]]],
                     latencies=lat, median_s=median, features=features)


@pytest.fixture
def ids(store: Store) -> tuple[int, int]:
    return _workload(store), store.ensure_target(TARGET, "local").id


# --- schema -------------------------------------------------------------------------------


def test_migrations_from_zero_match_models(db_url: str) -> None:
    with Store(db_url, auto_upgrade=False) as s:
        assert s.current_revision() is None
        s.upgrade()
        assert s.current_revision() == s.head_revision() == "0009"
        s.upgrade()  # idempotent
        with s.engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}),
                                    Base.metadata)
        assert diff == []
        cfg = alembic_config(s.url)
        with s.engine.begin() as conn:  # downgrade works too, and upgrading again
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "base")
        assert s.current_revision() is None
        s.upgrade()
        assert s.current_revision() == "0009"


def test_upgrading_to_0004_fills_in_the_mean_of_stored_records(db_url: str) -> None:
    with Store(db_url, auto_upgrade=False) as s:
        s.upgrade("0003")
        now = "2026-01-01 00:00:00+00:00"
        with s.engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO workloads (key, op, spec_json, shash, mod_json, description, flops,"
                f" created_at) VALUES ('w', 'tir', '{{}}', '0', '', '', 0, '{now}')")
            conn.exec_driver_sql("INSERT INTO targets (key, target_json, device_key, created_at)"
                                 f" VALUES ('t', '{{}}', 'local', '{now}')")
            for trial, lat in (("a", "[1.0, 2.0, 6.0]"), ("b", "[]")):
                conn.exec_driver_sql(
                    "INSERT INTO records (trial_id, workload_id, target_id, space, cand_hash,"
                    " trace_json, decisions_json, latencies_json, invalidity, tvm_version,"
                    f" created_at, measured_at) VALUES ('{trial}', 1, 1, 's', 'c', '[]', '[]',"
                    f" '{lat}', 'ok', 'v', '{now}', '{now}')")
        s.upgrade()
        assert {r.trial_id: r.mean_s for r in s.records()} == {"a": 3.0, "b": None}


def test_out_of_date_schema_names_the_fix(db_url: str) -> None:
    with Store(db_url, auto_upgrade=False) as s:  # opening does not fail: the CLI must upgrade
        with pytest.raises(DatabaseError, match=UPGRADE_COMMAND) as info:
            s.count_records()
        assert UPGRADE_COMMAND == "tunefarm db upgrade" and "0009" in str(info.value)
        s.upgrade()
        assert s.count_records() == 0


def test_auto_upgrade_and_settings_url(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.core.config import get_settings

    monkeypatch.setenv("TUNEFARM_DATABASE_URL", f"sqlite:///{tmp_path}/sub/dir/t.db")
    get_settings.cache_clear()
    try:
        with Store() as s:
            assert s.current_revision() == "0009" and (tmp_path / "sub/dir/t.db").exists()
            with s.engine.connect() as conn:
                assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
                assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    finally:
        get_settings.cache_clear()


def test_normalize_url() -> None:
    assert normalize_url("postgresql://u:p@h:5/db") == "postgresql+psycopg://u:p@h:5/db"
    assert normalize_url("postgres://u@h/db") == "postgresql+psycopg://u@h/db"
    assert normalize_url("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"
    with pytest.raises(DatabaseError, match="unsupported"):
        Store("mysql://u@h/db")


def test_database_errors_are_wrapped(store: Store, ids: tuple[int, int]) -> None:
    wid, tid = ids
    with pytest.raises(DatabaseError, match="database error"):  # foreign keys are enforced
        store.add_records([_rec("t-orphan", wid + 1000, tid)])
    assert store.count_records() == 0
    with pytest.raises(DatabaseError), store.session() as s:
        s.execute(text("SELECT * FROM no_such_table"))


# --- workloads and targets ------------------------------------------------------------------


def test_ensure_workload_and_target_are_idempotent(store: Store) -> None:
    wid = _workload(store)
    assert _workload(store) == wid
    assert _workload(store, key="other", shash="00112233aabbccdd") != wid
    row = store.workload_by_key("matmul-64")
    assert row is not None and (row.id, row.op, row.flops) == (wid, "matmul", 2 * 64**3)
    assert store.get_workload(wid) == row
    assert [w.key for w in store.workload_by_shash("00112233aabbccdd")] == ["matmul-64", "other"]
    assert store.workload_by_key("nope") is None and store.workload_by_shash("f" * 16) == []

    t1 = store.ensure_target(TARGET, "local")
    t2 = store.ensure_target('{"num-cores":2,"keys":["cpu"],"mcpu":"znver5","kind":"llvm"}',
                             "local")
    assert t1 == t2  # the JSON is canonicalized
    canon = '{"keys":["cpu"],"kind":"llvm","mcpu":"znver5","num-cores":2}'
    assert t1.target_json == canon and t1.device_key == "local"
    assert t1.key == hashlib.sha256(f"{canon}|local".encode()).hexdigest()[:16]
    assert t1.key == target_key(canon, "local")
    board = store.ensure_target(TARGET, "board-7")
    assert board.id != t1.id and store.target_by_key(board.key) == board
    assert store.get_target(t1.id) == t1 and store.target_by_key("0" * 16) is None


def test_concurrent_ensure_workload(db_url: str, store: Store) -> None:
    stores = [Store(db_url) for _ in range(2)]
    try:
        for round_ in range(3):
            barrier, got = threading.Barrier(2), list[int]()

            def work(s: Store, key: str = f"race-{round_}", barrier: threading.Barrier = barrier,
                     got: list[int] = got) -> None:
                barrier.wait()
                got.append(_workload(s, key=key))

            _run_threads(work, stores)
            assert len(got) == 2 and got[0] == got[1]
    finally:
        for s in stores:
            s.close()


# --- records -------------------------------------------------------------------------------


def test_add_records_is_idempotent(store: Store, ids: tuple[int, int]) -> None:
    wid, tid = ids
    batch = [_rec(f"t{i}", wid, tid, median=1e-3 * (i + 1)) for i in range(3)]
    assert store.add_records(batch) == 3
    assert store.add_records(batch) == 0
    assert store.add_records([*batch, _rec("t3", wid, tid), _rec("t3", wid, tid)]) == 1
    assert store.add_records([]) == 0
    assert store.count_records() == 4 == store.count_records(workload_id=wid, target_id=tid)
    rows = store.records(workload_id=wid)
    assert [r.trial_id for r in rows] == ["t0", "t1", "t2", "t3"]
    r0 = rows[0]
    assert r0.latencies == [1e-3, 1e-3] and r0.decisions == [[1, "SamplePerfectTile", [4, 16]]]
    assert r0.invalidity is Invalidity.OK and r0.features == b"\0\0\x80?"
    assert r0.measured_at.tzinfo is not None


def test_concurrent_add_records_one_row_per_trial(db_url: str, store: Store,
                                                  ids: tuple[int, int]) -> None:
    wid, tid = ids
    stores = [Store(db_url) for _ in range(2)]
    try:
        for round_ in range(4):
            batch = [_rec(f"r{round_}-{i}", wid, tid) for i in range(20)]
            barrier, inserted = threading.Barrier(2), list[int]()

            def work(s: Store, batch: list[NewRecord] = batch,
                     barrier: threading.Barrier = barrier, inserted: list[int] = inserted) -> None:
                barrier.wait()
                inserted.append(s.add_records(batch))

            _run_threads(work, stores)
            assert sum(inserted) == 20, inserted
        assert store.count_records() == 80
    finally:
        for s in stores:
            s.close()


def _run_threads(fn: Any, stores: list[Store]) -> None:
    errors: list[BaseException] = []

    def wrapped(s: Store) -> None:
        try:
            fn(s)
        except BaseException as exc:  # re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=wrapped, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors


def test_best_and_measured_ignore_failures(store: Store, ids: tuple[int, int]) -> None:
    wid, tid = ids
    other_t = store.ensure_target(TARGET, "board-2").id
    store.add_records([
        _rec("a", wid, tid, median=3e-3, cand="ca"),
        _rec("b", wid, tid, median=1e-3, cand="cb"),
        _rec("c", wid, tid, median=2e-3, cand="cc"),
        _rec("d", wid, tid, inv=Invalidity.WRONG_ANSWER, median=1e-6, cand="cd"),
        _rec("e", wid, tid, inv=Invalidity.BUILD_ERROR, median=None, cand="ca"),
        _rec("f", wid, tid, inv=Invalidity.WORKER_LOST, median=None, cand="cf"),
        _rec("g", wid, other_t, median=1e-9, cand="cg"),  # another target
    ])
    assert [r.trial_id for r in store.best(wid, tid)] == ["b"]
    assert [r.trial_id for r in store.best(wid, tid, k=5)] == ["b", "c", "a"]
    assert [r.trial_id for r in store.best(wid, other_t, k=5)] == ["g"]
    assert store.best(wid + 99, tid) == []
    ordered = store.records(workload_id=wid, target_id=tid, order="median")
    assert [r.trial_id for r in ordered] == ["d", "b", "c", "a", "e", "f"]  # NULL medians last
    assert [r.trial_id for r in store.records(target_id=tid, only_ok=True, limit=2)] == ["a", "b"]

    m = store.measured(wid, tid)
    assert set(m) == {"ca", "cb", "cc", "cd"}  # worker_lost was never really measured
    assert m["ca"].trial_id == "a" and m["ca"].invalidity is Invalidity.OK  # ok beats a failure
    assert m["cd"].invalidity is Invalidity.WRONG_ANSWER and m["cb"].latencies == [1e-3, 1e-3]


def test_training_rows_exclude_worker_lost(store: Store, ids: tuple[int, int]) -> None:
    wid, tid = ids
    store.add_records([
        _rec("ok", wid, tid, median=1e-3),
        _rec("fail", wid, tid, inv=Invalidity.RUN_TIMEOUT, median=None),
        _rec("lost", wid, tid, inv=Invalidity.WORKER_LOST, median=None),
        _rec("nofeat", wid, tid, features=None),
    ])
    rows = store.training_rows(tid)
    assert [(r.workload_id, r.features, r.median_s, r.invalidity) for r in rows] == [
        (wid, b"\0\0\x80?", 1e-3, Invalidity.OK), (wid, b"\0\0\x80?", None, Invalidity.RUN_TIMEOUT)]
    w, f, med, inv = rows[0]  # unpacks like a tuple
    assert (w, med) == (wid, 1e-3)
    assert store.training_rows(tid + 99) == []


# --- jobs ----------------------------------------------------------------------------------


def test_jobs_state_and_timestamps(store: Store, ids: tuple[int, int]) -> None:
    wid, tid = ids
    job = store.create_job(job_key="jk", workload_id=wid, target_id=tid, space="default",
                           trials=64, options={"seed": 1})
    assert len(job.id) == 32 and job.state is JobState.QUEUED and job.options == {"seed": 1}
    assert job.created_at.tzinfo is UTC and job.started_at is None and job.finished_at is None
    assert store.get_job(job.id) == job and store.get_job("missing") is None

    running = store.set_job_state(job.id, JobState.RUNNING)
    assert running.state is JobState.RUNNING and running.started_at is not None
    assert running.updated_at >= job.updated_at and running.finished_at is None
    store.update_job_trials(job.id, 128)
    store.add_records([_rec("j1", wid, tid, job=job.id), _rec("j2", wid, tid, job=job.id),
                       _rec("x", wid, tid)])
    assert store.count_records(job_id=job.id) == 2
    assert [r.trial_id for r in store.records(job_id=job.id)] == ["j1", "j2"]

    failed = store.set_job_state(job.id, "FAILED", error="boom")
    assert failed.state is JobState.FAILED and failed.error == "boom" and failed.trials == 128
    assert failed.finished_at is not None and failed.finished_at >= failed.started_at
    assert failed.started_at == running.started_at
    with pytest.raises(Conflict, match="FAILED; it cannot become QUEUED"):
        store.set_job_state(job.id, JobState.QUEUED)  # the state machine holds
    with pytest.raises(Conflict):
        store.set_job_state(job.id, JobState.RUNNING)  # only a reopen runs a finished job again
    reopened = store.set_job_state(job.id, JobState.RUNNING, reopen=True)
    assert reopened.finished_at is None and reopened.started_at == running.started_at
    with pytest.raises(NotFound):
        store.set_job_state("missing", JobState.RUNNING)
    with pytest.raises(NotFound):
        store.update_job_trials("missing", 1)
    with pytest.raises(ValueError):
        store.set_job_state(job.id, "DONE")

    newer = store.create_job(job_key="jk", workload_id=wid, target_id=tid, space="default",
                             trials=8, options={}, state=JobState.RUNNING)
    assert newer.started_at is not None
    assert store.latest_job("jk") == newer and store.latest_job("nope") is None


def test_job_idempotency_key(store: Store, ids: tuple[int, int]) -> None:
    wid, tid = ids
    kw: dict[str, Any] = dict(job_key="jk", workload_id=wid, target_id=tid, space="s", trials=4,
                              options={}, idempotency_key="req-1", request_hash="h1")
    first = store.create_job(**kw)
    again = store.create_job(**{**kw, "request_hash": "h2"})
    assert again == first and again.request_hash == "h1"  # caller compares the hash
    other = store.create_job(**{**kw, "idempotency_key": "req-2"})
    assert other.id != first.id
