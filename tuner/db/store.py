"""The tuning database: one `Store` over SQLite (default) or PostgreSQL.

Every public method runs in its own short transaction through `Store.session()`, which commits,
rolls back, and turns SQLAlchemy errors into `tuner.core.errors.DatabaseError` exactly once. The
schema
is managed by the Alembic migrations shipped in this package (`Store.upgrade()`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from alembic import command
from alembic.runtime.migration import MigrationContext
from alembic.util import CommandError
from sqlalchemy import ColumnElement, func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from ..core.errors import DatabaseError, NotFound
from ..core.measurements import Invalidity
from . import tables as m
from .engine import (
    PG_MIGRATION_LOCK,
    UPGRADE_COMMAND,
    alembic_config,
    canonical_json_text,
    head_revision,
    known_revisions,
    make_engine,
    normalize_url,
    safe_url,
    target_key,
    wrap_error,
)
from .rows import JobRow, MeasuredRow, NewRecord, RecordRow, TargetRef, TrainingRow, WorkloadRow
from .tables import JobState, utcnow

if TYPE_CHECKING:
    from sqlalchemy.dialects.postgresql import Insert as PgInsert
    from sqlalchemy.dialects.sqlite import Insert as SqliteInsert

T = TypeVar("T")
_CHUNK = 500  # rows per INSERT (SQLite allows 32766 bound parameters)


class Store:
    """Workloads, targets, jobs and measured records in one SQL database."""

    def __init__(self, url: str | None = None, *, auto_upgrade: bool = True) -> None:
        if url is None:
            from ..core.config import get_settings

            url = get_settings().resolved_database_url()
        self.url = normalize_url(url)
        self.safe_url = safe_url(self.url)
        self.engine, self.dialect = make_engine(self.url)
        self.auto_upgrade = auto_upgrade
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._schema_ok = False
        if auto_upgrade:
            self._check_schema()

    def __repr__(self) -> str:
        return f"Store({self.safe_url!r})"

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------
    # schema

    def head_revision(self) -> str | None:
        return head_revision()

    def current_revision(self) -> str | None:
        """The schema revision stored in the database (None: no schema yet)."""
        try:
            with self.engine.connect() as conn:
                return MigrationContext.configure(conn).get_current_revision()
        except SQLAlchemyError as exc:
            raise wrap_error(exc, self.safe_url) from exc

    def upgrade(self, revision: str = "head") -> None:
        """`alembic upgrade head`, programmatically; safe when two processes race to do it."""
        cfg = alembic_config(self.url)
        try:
            with self.engine.begin() as conn:  # SQLite: BEGIN IMMEDIATE serializes migrators
                if self.dialect == "postgresql":
                    conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({PG_MIGRATION_LOCK})")
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, revision)
        except SQLAlchemyError as exc:
            raise wrap_error(exc, self.safe_url) from exc
        except CommandError as exc:
            raise DatabaseError(f"cannot upgrade {self.safe_url} to {revision!r}: {exc}") from exc
        self._schema_ok = False

    def _check_schema(self) -> None:
        if self._schema_ok:
            return
        current, head = self.current_revision(), head_revision()
        if current != head:
            if current is not None and current not in known_revisions():
                raise DatabaseError(
                    f"the database {self.safe_url} has schema revision {current!r}, which this "
                    "tunefarm does not know (written by a newer tunefarm?); upgrade tunefarm")
            if not self.auto_upgrade:
                state = "has no tunefarm schema" if current is None else f"is at revision {current}"
                raise DatabaseError(
                    f"the database {self.safe_url} {state} but this tunefarm needs revision "
                    f"{head}: run `{UPGRADE_COMMAND}`")
            self.upgrade()
        self._schema_ok = True

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A transaction: commits on success, rolls back on error; SQLAlchemy errors become
        `DatabaseError` (once: nested use does not wrap twice)."""
        self._check_schema()
        s = self._sessions()
        try:
            yield s
            s.commit()
        except SQLAlchemyError as exc:
            s.rollback()
            raise wrap_error(exc, self.safe_url) from exc
        except BaseException:
            s.rollback()
            raise
        finally:
            s.close()

    def _insert(self, model: type[m.Base]) -> PgInsert | SqliteInsert:
        if self.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            return pg_insert(model)
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(model)

    # ---------------------------------------------------------------------------------------
    # workloads and targets

    def ensure_workload(self, *, key: str, op: str, spec_json: str, shash: str, mod_json: str,
                        description: str = "", flops: int = 0, nbytes: int = 0) -> int:
        """The id of workload `key`, inserted if missing (race-free across processes)."""
        values = dict(key=key, op=op, spec_json=spec_json, shash=shash, mod_json=mod_json,
                      description=description, flops=int(flops), nbytes=int(nbytes),
                      created_at=utcnow())
        query = select(m.Workload.id).where(m.Workload.key == key)
        with self.session() as s:
            wid = s.scalar(query)
            if wid is None:
                s.execute(self._insert(m.Workload).values(values)
                          .on_conflict_do_nothing(index_elements=["key"]))
                wid = s.scalar(query)
            return int(_written(wid, f"workload {key}"))

    def ensure_target(self, target_json: str, device_key: str = "local") -> TargetRef:
        target_json = canonical_json_text(target_json)
        key = target_key(target_json, device_key)
        query = select(m.Target).where(m.Target.key == key)
        with self.session() as s:
            row = s.scalar(query)
            if row is None:
                s.execute(self._insert(m.Target).values(
                    key=key, target_json=target_json, device_key=device_key, created_at=utcnow())
                    .on_conflict_do_nothing(index_elements=["key"]))
                row = s.scalar(query)
            return TargetRef.of(_written(row, f"target {key}"))

    def workload_by_key(self, key: str) -> WorkloadRow | None:
        with self.session() as s:
            row = s.scalar(select(m.Workload).where(m.Workload.key == key))
            return WorkloadRow.of(row) if row else None

    def get_workload(self, workload_id: int) -> WorkloadRow | None:
        with self.session() as s:
            row = s.get(m.Workload, workload_id)
            return WorkloadRow.of(row) if row else None

    def op_specs(self) -> list[tuple[str, str]]:
        """(key, spec JSON) of every workload defined by an op spec (not `tir`)."""
        with self.session() as s:
            return [(k, j) for k, j in s.execute(
                select(m.Workload.key, m.Workload.spec_json).where(m.Workload.op != "tir")
                .order_by(m.Workload.id))]

    def workload_by_shash(self, shash: str) -> list[WorkloadRow]:
        with self.session() as s:
            rows = s.scalars(select(m.Workload).where(m.Workload.shash == shash)
                             .order_by(m.Workload.id))
            return [WorkloadRow.of(r) for r in rows]

    def target_by_key(self, key: str) -> TargetRef | None:
        with self.session() as s:
            row = s.scalar(select(m.Target).where(m.Target.key == key))
            return TargetRef.of(row) if row else None

    def get_target(self, target_id: int) -> TargetRef | None:
        with self.session() as s:
            row = s.get(m.Target, target_id)
            return TargetRef.of(row) if row else None

    # ---------------------------------------------------------------------------------------
    # jobs

    def create_job(self, *, job_key: str, workload_id: int, target_id: int, space: str,
                   trials: int, options: dict[str, Any] | None = None,
                   state: JobState = JobState.QUEUED, idempotency_key: str | None = None,
                   request_hash: str | None = None, wall_budget_s: float | None = None,
                   lease_owner: str | None = None, owner: str = "local",
                   guard: Callable[[Session], None] | None = None,
                   model_id: str | None = None, session: Session | None = None) -> JobRow:
        """Insert a job row for `owner`. With an `idempotency_key` that `owner` already used,
        the existing job is returned unchanged (compare its `request_hash` to detect a
        conflicting request). `guard` runs inside the inserting transaction before the insert
        (not for an idempotent replay): it may lock and count (quotas) and raise to refuse.
        `session`: insert in the caller's transaction (a model job's task job, `model_id`, is
        created in the transaction that holds its model job locked).

        The storage primitive: the CLI and the API create jobs through
        `tuner.db.jobs.create_job`, which resolves the job key, the options and resumption; a
        model job's rounds (`tuner.db.model_jobs`) create its task jobs here directly (the
        model job's quota was counted when it was created)."""
        now = utcnow()
        values = dict(id=uuid.uuid4().hex, job_key=job_key, workload_id=workload_id,
                      target_id=target_id, space=space, trials=int(trials),
                      state=JobState(state).value, options_json=json.dumps(options or {}),
                      idempotency_key=idempotency_key, request_hash=request_hash,
                      wall_budget_s=wall_budget_s, lease_owner=lease_owner, owner=owner,
                      created_at=now, updated_at=now, model_id=model_id,
                      started_at=now if JobState(state) is JobState.RUNNING else None)
        same_key = select(m.Job).where(m.Job.owner == owner,
                                       m.Job.idempotency_key == idempotency_key)
        with nullcontext(session) if session is not None else self.session() as s:
            if idempotency_key is not None and (row := s.scalar(same_key)) is not None:
                return JobRow.of(row)
            if guard is not None:
                guard(s)
            stmt = self._insert(m.Job).values(values)
            if idempotency_key is None:
                s.execute(stmt)
                row = s.get(m.Job, values["id"])
            else:
                s.execute(stmt.on_conflict_do_nothing(
                    index_elements=["owner", "idempotency_key"]))
                row = s.scalar(same_key)
            return JobRow.of(_written(row, f"job {values['id']}"))

    def get_job(self, job_id: str) -> JobRow | None:
        with self.session() as s:
            row = s.get(m.Job, job_id)
            return JobRow.of(row) if row else None

    def latest_job(self, job_key: str, *, owner: str | None = None) -> JobRow | None:
        """The newest job of `job_key` (of `owner`, if given)."""
        q = select(m.Job).where(m.Job.job_key == job_key)
        if owner is not None:
            q = q.where(m.Job.owner == owner)
        with self.session() as s:
            row = s.scalar(q.order_by(m.Job.created_at.desc()).limit(1))
            return JobRow.of(row) if row else None

    def set_job_state(self, job_id: str, state: JobState | str, *, error: str | None = None,
                      reopen: bool = False) -> JobRow:
        """Move a job to `state` (the transition entry point; cancel requests go through
        `tuner.db.jobs.request_cancel`). Both apply `m.Job.move_to` to the locked row, the one
        place job states change: `Conflict` when `JobState.can_become` forbids the move."""
        state = JobState(state)
        with self.session() as s:
            job = s.get(m.Job, job_id, with_for_update=True)
            if job is None:
                raise NotFound(f"no job {job_id!r}")
            job.move_to(state, now=utcnow(), error=error, reopen=reopen)
            s.flush()
            return JobRow.of(job)

    def set_job_message(self, job_id: str, message: str | None) -> None:
        """Why the running job waits now (None: it does not)."""
        with self.session() as s:
            job = s.get(m.Job, job_id, with_for_update=True)
            if job is not None and job.message != message:
                job.message = None if message is None else message[:500]

    def hold_locally(self, job_id: str) -> None:
        """The job is the embedded CLI's again: no service tuner claims it."""
        with self.session() as s:
            job = s.get(m.Job, job_id, with_for_update=True)
            if job is None:
                raise NotFound(f"no job {job_id!r}")
            job.lease_owner, job.lease_expires_at = m.LOCAL_LEASE, None

    def update_job_trials(self, job_id: str, trials: int) -> None:
        with self.session() as s:
            job = s.get(m.Job, job_id, with_for_update=True)
            if job is None:
                raise NotFound(f"no job {job_id!r}")
            job.trials, job.updated_at = int(trials), utcnow()

    # ---------------------------------------------------------------------------------------
    # records

    def add_records(self, records: Sequence[NewRecord]) -> int:
        """Insert in one transaction; trial_ids already stored are skipped (also when the same
        batch is written concurrently). Returns how many rows were newly inserted."""
        now = utcnow()
        rows: dict[str, dict[str, Any]] = {}
        for rec in records:
            rows.setdefault(rec.trial_id, rec.columns(now))
        values = list(rows.values())
        inserted = 0
        with self.session() as s:
            for i in range(0, len(values), _CHUNK):
                stmt = (self._insert(m.Record).values(values[i:i + _CHUNK])
                        .on_conflict_do_nothing(index_elements=["trial_id"])
                        .returning(m.Record.id))
                inserted += len(s.execute(stmt).all())
        return inserted

    @staticmethod
    def _filters(job_id: str | None, workload_id: int | None,
                 target_id: int | None) -> list[ColumnElement[bool]]:
        out: list[ColumnElement[bool]] = []
        if job_id is not None:
            out.append(m.Record.job_id == job_id)
        if workload_id is not None:
            out.append(m.Record.workload_id == workload_id)
        if target_id is not None:
            out.append(m.Record.target_id == target_id)
        return out

    def count_records(self, *, job_id: str | None = None, workload_id: int | None = None,
                      target_id: int | None = None) -> int:
        with self.session() as s:
            return int(s.scalar(select(func.count()).select_from(m.Record)
                                .where(*self._filters(job_id, workload_id, target_id))) or 0)

    def records(self, *, workload_id: int | None = None, target_id: int | None = None,
                job_id: str | None = None, only_ok: bool = False, limit: int | None = None,
                order: Literal["id", "median", "newest"] = "id",
                after_id: int | None = None) -> list[RecordRow]:
        """Records matching the filters; order "median" puts the fastest first, no-median last;
        "newest" the last written first. `after_id`: only records stored after that one (record
        ids grow: with order "id" this is keyset pagination)."""
        q = select(m.Record).where(*self._filters(job_id, workload_id, target_id))
        if after_id is not None:
            q = q.where(m.Record.id > after_id)
        if only_ok:
            q = q.where(m.Record.invalidity == Invalidity.OK.value, m.Record.median_s.is_not(None))
        if order == "median":
            q = q.order_by(m.Record.median_s.asc().nulls_last(), m.Record.id)
        elif order == "id":
            q = q.order_by(m.Record.id)
        elif order == "newest":
            q = q.order_by(m.Record.id.desc())
        else:
            raise ValueError(f"order must be 'id', 'median' or 'newest', not {order!r}")
        if limit is not None:
            q = q.limit(int(limit))
        with self.session() as s:
            return [RecordRow.of(r) for r in s.scalars(q)]

    def record(self, trial_id: str) -> RecordRow | None:
        """The record of one trial, or None."""
        with self.session() as s:
            row = s.scalar(select(m.Record).where(m.Record.trial_id == trial_id))
            return RecordRow.of(row) if row else None

    def has_measurement(self, rec: NewRecord) -> bool:
        """Whether `rec`'s measurement is stored under any trial id: a record of the same
        workload, target and sampled decisions with the same latency samples (a failure: with
        none valid). An imported copy of it adds nothing."""
        cols = rec.columns(utcnow())
        same = (m.Record.median_s.is_(None) if rec.median_s is None
                else m.Record.latencies_json == cols["latencies_json"])
        with self.session() as s:
            return s.scalar(select(m.Record.id).where(
                m.Record.workload_id == rec.workload_id, m.Record.target_id == rec.target_id,
                m.Record.decisions_json == cols["decisions_json"], same).limit(1)) is not None

    def best(self, workload_id: int, target_id: int, k: int = 1, *,
             served: bool = False) -> list[RecordRow]:
        """The k fastest valid records (invalidity ok), lowest median first. `served`: only
        those a best may be served from (`models.SERVED_TRUST`: a farm record once a second
        measurement confirmed it), ranked by the latency served (`RecordRow.served_s`)."""
        if not served:
            return self.records(workload_id=workload_id, target_id=target_id, only_ok=True,
                                limit=k, order="median")
        latency = func.coalesce(m.Record.confirmed_s, m.Record.median_s)
        q = (select(m.Record)
             .where(*self._filters(None, workload_id, target_id),
                    m.Record.invalidity == Invalidity.OK.value, m.Record.median_s.is_not(None),
                    m.Record.trust.in_(m.SERVED_TRUST))
             .order_by(latency.asc(), m.Record.id).limit(int(k)))
        with self.session() as s:
            return [RecordRow.of(r) for r in s.scalars(q)]

    def measured(self, workload_id: int, target_id: int) -> dict[str, MeasuredRow]:
        """Already measured candidates by cand_hash (for dedup). worker_lost records are left out:
        the candidate was never really measured and should be tried again. With several records
        for a candidate, a valid one wins (the fastest)."""
        q = (select(m.Record.cand_hash, m.Record.trial_id, m.Record.invalidity, m.Record.median_s,
                    m.Record.latencies_json)
             .where(m.Record.workload_id == workload_id, m.Record.target_id == target_id,
                    m.Record.invalidity != Invalidity.WORKER_LOST.value)
             .order_by(m.Record.id))
        out: dict[str, MeasuredRow] = {}
        with self.session() as s:
            for cand, trial, inv, median, lat in s.execute(q):
                row = MeasuredRow(trial, Invalidity(inv), median, json.loads(lat) or [])
                if cand not in out or _better(row, out[cand]):
                    out[cand] = row
        return out

    def training_rows(self, target_id: int) -> list[TrainingRow]:
        """(workload_id, features, median_s, invalidity) of records with features; infrastructure
        failures (worker_lost) never train the model."""
        q = (select(m.Record.workload_id, m.Record.features, m.Record.median_s,
                    m.Record.invalidity)
             .where(m.Record.target_id == target_id, m.Record.features.is_not(None),
                    m.Record.invalidity != Invalidity.WORKER_LOST.value)
             .order_by(m.Record.id))
        with self.session() as s:
            return [TrainingRow(w, bytes(f or b""), med, Invalidity(inv))
                    for w, f, med, inv in s.execute(q)]


def _written(row: T | None, what: str) -> T:
    """A row this transaction just wrote (or found): None means it vanished under us."""
    if row is None:
        raise DatabaseError(f"{what} was not found right after it was written")
    return row


def _better(a: MeasuredRow, b: MeasuredRow) -> bool:
    a_ok = a.invalidity is Invalidity.OK and a.median_s is not None
    b_ok = b.invalidity is Invalidity.OK and b.median_s is not None
    if a_ok != b_ok:
        return a_ok
    return a_ok and b_ok and a.median_s < b.median_s  # type: ignore[operator]
