"""Jobs: how one is created, how its state changes, the leases that tell which tuner process
runs it, and how users page through jobs and their records.

- Creation: `create_job` is the one entry point, for the embedded CLI and the REST API alike;
  it enforces the per-owner quotas (`Quotas`) so that no front end can skip them.
- Ownership: every job has an `owner` (the principal that submitted it; `LOCAL_OWNER` for the
  embedded CLI). Idempotency keys are scoped per owner; `list_jobs(owner=...)` lists one
  owner's jobs (the API decides who may see what).
- State: `m.Job.move_to` is the one place a job's state changes, on a locked row; it is applied
  by `Store.set_job_state` (a transition) and `request_cancel` (a cancel request).
- Leases: `claim`, `renew` and `release` change only the lease fields, never the state (a
  terminal state frees the lease, in `move_to`). A lease is judged by the database clock
  (PostgreSQL's `now()`; SQLite, one host, uses this host's): a tuner renews its lease while it
  works; a job whose lease expired (its tuner died) is claimed by another tuner, which resumes it
  from the committed records. Jobs the embedded CLI runs (`tunefarm tune`) carry the owner
  `LOCAL_OWNER` and are never claimed by service tuners. Claiming is fair across owners: the
  owner with the fewest jobs held by tuners goes first, then the oldest job.
- Views: `job_view` and `records_page` build the `tuner.db.views` models users see.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, func, or_, select, text
from sqlalchemy.orm import Session, aliased

from ..core.errors import NotFound, QuotaExceeded
from ..core.measurements import Invalidity
from . import cursor as cursors
from . import tables as m
from .rows import JobRow, TargetRef
from .store import Store
from .tables import JobState, utcnow
from .views import JobPublic, JobStats, RecordPublic

if TYPE_CHECKING:
    from ..core.config import Settings

LOCAL_OWNER = m.LOCAL_LEASE  # owner and lease_owner of jobs run by the embedded CLI (no tuner
# takes them, whatever their state)
ACTIVE = (JobState.QUEUED.value, JobState.RUNNING.value, JobState.CANCELLING.value)


def job_key(workload_key: str, target_key: str, space: str) -> str:
    """What makes jobs "the same job": one workload on one target+device in one resolved space
    (the embedded CLI resumes the latest job of a key)."""
    return hashlib.sha256(f"{workload_key}|{target_key}|{space}".encode()).hexdigest()[:32]


@dataclass(frozen=True)
class JobOptions:
    """A job's search options, resolved once against the settings when the job is created and
    stored with it (`JobRow.options`): the same request stores the same options, whether it
    came from `tunefarm tune` or POST /v1/jobs."""

    batch_size: int
    seed: int
    early_stop: int | None = None  # stop after this many measured trials without a new best

    @classmethod
    def from_settings(cls, settings: Settings, *, batch_size: int | None = None,
                      seed: int | None = None, early_stop: int | None = None) -> JobOptions:
        """Explicit values win; else the settings' defaults (`Settings.job_batch_size`,
        `Settings.job_seed`)."""
        return cls(settings.job_batch_size(batch_size), settings.job_seed(seed), early_stop)

    @classmethod
    def from_stored(cls, options: dict[str, Any], settings: Settings) -> JobOptions:
        """The options of a stored job (a key missing from an older row: the settings')."""
        return cls.from_settings(settings, batch_size=options.get("batch_size"),
                                 seed=options.get("seed"), early_stop=options.get("early_stop"))

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"batch_size": self.batch_size, "seed": self.seed}
        if self.early_stop is not None:
            out["early_stop"] = self.early_stop
        return out


@dataclass(frozen=True)
class NewJob:
    """A request for a job, as `create_job` takes it (workload and target already registered,
    the space already resolved to a template name)."""

    workload_id: int
    workload_key: str
    target: TargetRef
    space: str
    trials: int
    options: JobOptions
    wall_budget_s: float | None = None
    state: JobState = JobState.QUEUED
    lease_owner: str | None = None  # LOCAL_OWNER: run by the embedded CLI, never by a tuner
    idempotency_key: str | None = None  # scoped to `owner`
    request_hash: str | None = None  # of the request that carried `idempotency_key`
    resume: bool = False  # return the latest job of the same job key instead (budget: `trials`)
    owner: str = LOCAL_OWNER  # the submitting principal (`Principal.owner`); CLI: LOCAL_OWNER

    @property
    def job_key(self) -> str:
        return job_key(self.workload_key, self.target.key, self.space)


@dataclass(frozen=True)
class Quotas:
    """Per-owner limits on what a job creation may add: jobs queued or running (CANCELLING
    included) at once, trials of one job, and trials of all the owner's queued or running jobs.
    Over one: `QuotaExceeded` (the API's 429 with `Retry-After: retry_after_s`)."""

    max_queued_jobs: int
    max_trials_per_job: int
    max_queued_trials: int
    retry_after_s: float = 30.0

    @classmethod
    def from_settings(cls, settings: Settings) -> Quotas:
        return cls(settings.max_queued_jobs, settings.max_trials_per_job,
                   settings.max_queued_trials)

    def check_job(self, trials: int) -> None:
        """The limit on one job, before any SQL."""
        if trials > self.max_trials_per_job:
            raise QuotaExceeded(f"trials: {trials} is more than the {self.max_trials_per_job} "
                                "trials one job may have", retry_after=self.retry_after_s)

    def guard(self, dialect: str, owner: str, trials: int) -> Callable[[Session], None]:
        """The check `Store.create_job` runs inside its inserting transaction: on PostgreSQL
        it first takes a per-owner transaction lock, so concurrent requests of one owner are
        counted one after the other (SQLite serializes writers itself)."""

        def check(s: Session) -> None:
            if dialect == "postgresql":
                s.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _owner_lock(owner)})
            self._check_owner(s, owner, trials)

        return check

    def precheck(self, store: Store, owner: str, trials: int) -> None:
        """Every limit as the owner's jobs stand now (read only), so that a front end refuses
        before it writes anything (a workload, a target); `guard` checks again, atomically."""
        self.check_job(trials)
        self.precheck_owner(store, owner, trials)

    def precheck_new(self, store: Store, owner: str, trials: int, idempotency_key: str | None,
                     *, model: bool = False) -> None:
        """`precheck` (`precheck_owner` for a model job) before anything is parsed, unless
        the request replays an Idempotency-Key the owner already used (its answer is the job
        made then, and costs no quota)."""
        if idempotency_key is not None and key_used(store, owner, idempotency_key, model=model):
            return
        if model:
            self.precheck_owner(store, owner, trials)
        else:
            self.precheck(store, owner, trials)

    def precheck_owner(self, store: Store, owner: str, trials: int) -> None:
        """The owner's limits only (a model job: its budget spans many task jobs)."""
        with store.session() as s:
            self._check_owner(s, owner, trials)

    def _check_owner(self, s: Session, owner: str, trials: int) -> None:
        """A model job counts as one job with its whole budget (its task jobs do not count)."""
        jobs, queued = s.execute(
            select(func.count(), func.coalesce(func.sum(m.Job.trials), 0))
            .where(m.Job.owner == owner, m.Job.state.in_(ACTIVE), m.Job.model_id.is_(None))
        ).one()
        models, model_trials = s.execute(
            select(func.count(), func.coalesce(func.sum(m.ModelJob.trials), 0))
            .where(m.ModelJob.owner == owner, m.ModelJob.state.in_(ACTIVE))).one()
        jobs, queued = jobs + models, int(queued) + int(model_trials)
        if jobs + 1 > self.max_queued_jobs:
            raise QuotaExceeded(
                f"{owner!r} has {jobs} queued or running jobs, the most one owner may have "
                f"is {self.max_queued_jobs}: wait for one to finish or cancel one",
                retry_after=self.retry_after_s)
        if int(queued) + trials > self.max_queued_trials:
            raise QuotaExceeded(
                f"{owner!r} has {int(queued)} trials queued or running; {trials} more would "
                f"pass the limit of {self.max_queued_trials}", retry_after=self.retry_after_s)


def _owner_lock(owner: str) -> int:
    """A 64-bit advisory lock id of one owner's job creations."""
    return int.from_bytes(hashlib.sha256(f"jobs-of:{owner}".encode()).digest()[:8], "big",
                          signed=True)


def key_used(store: Store, owner: str, idempotency_key: str, *, model: bool = False) -> bool:
    """Whether `owner` already made a job (a model job) with this Idempotency-Key."""
    table = m.ModelJob if model else m.Job
    with store.session() as s:
        n = s.scalar(select(func.count()).select_from(table).where(
            table.owner == owner, table.idempotency_key == idempotency_key))
        return bool(n)


def create_job(store: Store, new: NewJob, *, settings: Settings | None = None) -> JobRow:
    """The one way a job comes to exist, for every front end: `tunefarm tune` (embedded: owner
    and lease_owner `LOCAL_OWNER`, resuming the latest job of its key unless `--fresh`) and POST
    /v1/jobs (QUEUED, owned by the submitting principal, with an optional Idempotency-Key).

    Quotas (`Quotas`, from `settings`, default `get_settings()`) apply to every job but the
    embedded CLI's (lease_owner `LOCAL_OWNER`: the operator's own machine): over a limit,
    `QuotaExceeded` and nothing is written. With `new.resume`, the latest job of the same job key
    and owner is returned instead of a new one, its trial budget set to `new.trials` (its stored
    options are kept; reopening a finished job is the search loop's transition). With an
    `idempotency_key` this owner already used, the job of that earlier request is returned
    unchanged (no quota counted): compare its `request_hash` to detect a conflict."""
    key = new.job_key
    if new.resume:
        latest = store.latest_job(key, owner=new.owner)
        if latest is not None:
            if latest.trials != new.trials:
                store.update_job_trials(latest.id, new.trials)
            if new.lease_owner == LOCAL_OWNER and latest.lease_owner != LOCAL_OWNER:
                store.hold_locally(latest.id)  # stored before local leases outlived a run
            job = store.get_job(latest.id)
            if job is None:  # deleted between the two reads
                raise NotFound(f"no job {latest.id!r}")
            return job
    guard = None
    if new.lease_owner != LOCAL_OWNER:
        if settings is None:
            from ..core.config import get_settings

            settings = get_settings()
        quotas = Quotas.from_settings(settings)
        quotas.check_job(new.trials)
        guard = quotas.guard(store.dialect, new.owner, new.trials)
    return store.create_job(
        job_key=key, workload_id=new.workload_id, target_id=new.target.id, space=new.space,
        trials=new.trials, options=new.options.as_json(), state=new.state,
        idempotency_key=new.idempotency_key, request_hash=new.request_hash,
        wall_budget_s=new.wall_budget_s, lease_owner=new.lease_owner, owner=new.owner,
        guard=guard)


def request_cancel(store: Store, job_id: str) -> JobRow:
    """Cancel: a queued job is cancelled at once, a running one becomes CANCELLING (its tuner
    stops after the current candidate); a finished or cancelling job is left as it is. The move
    is `m.Job.move_to`, like every state change."""
    with store.session() as s:
        job = s.get(m.Job, job_id, with_for_update=True)
        if job is None:
            raise NotFound(f"no job {job_id!r}")
        to = {JobState.QUEUED: JobState.CANCELLED,
              JobState.RUNNING: JobState.CANCELLING}.get(JobState(job.state))
        if to is not None:
            job.move_to(to, now=utcnow())
            s.flush()
        return JobRow.of(job)

def _db_now(s: Session, dialect: str) -> datetime:
    if dialect == "postgresql":
        now = s.scalar(select(func.now()))
        assert now is not None
        return now
    return utcnow()


def claim(store: Store, owner: str, lease_s: float, *, job_id: str | None = None) -> JobRow | None:
    """Take one active job whose lease is free or expired; None if there is none. Fair across
    job owners: the job of the owner with the fewest jobs now leased by tuners goes first, then
    the oldest (so one owner's long queue does not starve another's single job)."""
    with store.session() as s:
        now = _db_now(s, store.dialect)
        held = aliased(m.Job)
        leased = and_(held.lease_owner.is_not(None), held.lease_owner != LOCAL_OWNER,
                      held.lease_expires_at >= now)
        running = (select(func.count()).select_from(held)
                   .where(held.owner == m.Job.owner, held.state.in_(ACTIVE), leased)
                   .correlate(m.Job).scalar_subquery())
        free = or_(m.Job.lease_owner.is_(None),
                   and_(m.Job.lease_owner != LOCAL_OWNER,
                        or_(m.Job.lease_expires_at.is_(None), m.Job.lease_expires_at < now)))
        q = (select(m.Job).where(m.Job.state.in_(ACTIVE), free)
             .order_by(running, m.Job.created_at, m.Job.id).limit(1)
             .with_for_update(skip_locked=True, of=m.Job))
        if job_id is not None:
            q = q.where(m.Job.id == job_id)
        job = s.scalar(q)
        if job is None:
            return None
        job.lease_owner, job.lease_expires_at = owner, now + timedelta(seconds=lease_s)
        s.flush()
        return JobRow.of(job)


def renew(store: Store, job_id: str, owner: str, lease_s: float) -> bool:
    """Extend `owner`'s lease on the job; False when it no longer holds it."""
    with store.session() as s:
        job = s.get(m.Job, job_id, with_for_update=True)
        if job is None or job.lease_owner != owner:
            return False
        job.lease_expires_at = _db_now(s, store.dialect) + timedelta(seconds=lease_s)
        return True


def release(store: Store, job_id: str, owner: str) -> None:
    with store.session() as s:
        job = s.get(m.Job, job_id, with_for_update=True)
        if job is not None and job.lease_owner == owner:
            job.lease_owner = job.lease_expires_at = None


def list_jobs(store: Store, *, state: JobState | str | None = None, limit: int = 50,
              cursor: str | None = None, owner: str | None = None, op: str | None = None
              ) -> tuple[list[JobRow], str | None]:
    """Newest first (of one `owner`, else of everyone; of one workload `op`, else of all);
    returns a page and the cursor of the next page (None: last page)."""
    q = cursors.newest_first(select(m.Job), m.Job.created_at, m.Job.id, cursor, limit)
    if owner is not None:
        q = q.where(m.Job.owner == owner)
    if state is not None:
        q = q.where(m.Job.state == JobState(state).value)
    if op is not None:
        q = q.where(m.Job.workload_id.in_(select(m.Workload.id).where(m.Workload.op == op)))
    with store.session() as s:
        return cursors.page([JobRow.of(r) for r in s.scalars(q)], limit)


def job_stats(store: Store, job: JobRow) -> JobStats:
    """A job's workload, target and progress: trials done (worker_lost records do not count)
    and its best valid record so far."""
    ok = Invalidity.OK.value
    with store.session() as s:
        w = s.get(m.Workload, job.workload_id)
        t = s.get(m.Target, job.target_id)
        if w is None or t is None:
            raise NotFound(f"job {job.id} names a workload or target that does not exist")
        done = s.scalar(select(func.count()).select_from(m.Record).where(
            m.Record.job_id == job.id, m.Record.invalidity != Invalidity.WORKER_LOST.value)) or 0
        best = s.execute(
            select(m.Record.trial_id, m.Record.median_s)
            .where(m.Record.job_id == job.id, m.Record.invalidity == ok,
                   m.Record.median_s.is_not(None))
            .order_by(m.Record.median_s, m.Record.id).limit(1)).first()
        task = None if job.model_id is None else s.scalar(
            select(m.ModelTask.name).where(m.ModelTask.job_id == job.id).limit(1))
        return JobStats(
            workload_key=w.key, workload=json.loads(w.spec_json), flops=w.flops,
            nbytes=w.nbytes or 0,
            target=json.loads(t.target_json), device_key=t.device_key, trials_done=int(done),
            best_trial_id=None if best is None else best[0],
            best_s=None if best is None else best[1], task_name=task)


def job_view(store: Store, job: JobRow, settings: Settings | None = None) -> JobPublic:
    """The public view of a job: its request, state, progress and best record so far
    (`settings`: whose declared peaks say whether it is memory-bound; default the process's)."""
    return JobPublic.from_row(job, job_stats(store, job), settings)


def records_page(store: Store, job: JobRow, *, limit: int,
                 cursor: str | None = None) -> tuple[list[RecordPublic], str | None]:
    """A job's records in the order they were stored, `limit` at a time (keyset pagination);
    returns a page and the cursor of the next page (None: last page)."""
    after = cursors.parse_record_cursor(cursor) if cursor else None
    rows = store.records(job_id=job.id, after_id=after, order="id", limit=limit + 1)
    w, t = store.get_workload(job.workload_id), store.get_target(job.target_id)
    if w is None or t is None:
        raise NotFound(f"job {job.id} names a workload or target that does not exist")
    nxt = cursors.record_cursor(rows[limit - 1].id) if len(rows) > limit else None
    items = [RecordPublic.from_row(r, workload_key=w.key, flops=w.flops,
                                   target_json=t.target_json, device_key=t.device_key)
             for r in rows[:limit]]
    return items, nxt
