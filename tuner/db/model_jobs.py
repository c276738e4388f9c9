"""Model jobs: one trial budget spread over the task jobs of a model's PrimFuncs, one round at a
time, the same way for the embedded CLI (`tunefarm tune-model`) and the service (POST
/v1/models). The SQL lives here; which task gets the next round is a pure decision made by the
caller's `Plan` (`tuner.model.rounds`, the gradient-based task scheduler).

- A model job (`m.ModelJob`) lists its tasks (`m.ModelTask`: a registered `tir` workload, its
  call count as weight, its resolved space). A task gets a task job (`m.Job`, `model_id` set,
  owned like the model) at its first round; each later round raises that job's trial budget by
  the round's trials and reopens it (SUCCEEDED -> QUEUED). Task jobs run through the one job
  path (`tuner.search.Tuner`): service tuners claim them like any job, the embedded CLI runs
  them itself (lease owner `LOCAL_OWNER`: no service tuner takes them).
- `advance` is the one step, on the locked model row: while a task job is active it returns
  that job (a round in flight, which survives a killed tuner like any job); otherwise it learns
  the finished round (its trials, the target's best of the task), asks the plan, and starts the
  next round or ends the model job. It is idempotent and safe to call from any process at any
  time: after a task job ends (the tuner that ran it), on a poll (`stalled`), at submission.
- The budget counts the trials of this model's task jobs (worker_lost records excluded); a task
  tuned on the target before counts its earlier trials as history only (`prior_trials`).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import and_, exists, func, select
from sqlalchemy.orm import Session

from ..core.errors import NotFound
from ..core.measurements import Invalidity
from . import cursor as cursors
from . import tables as m
from .jobs import ACTIVE, LOCAL_OWNER, JobOptions, job_key
from .rows import TargetRef
from .store import Store
from .tables import JobState, utcnow

K = TypeVar("K")
V = TypeVar("V")

_OK, _LOST = Invalidity.OK.value, Invalidity.WORKER_LOST.value


@dataclass(frozen=True)
class NewTask:
    name: str
    weight: int  # calls per run of the model
    workload_id: int
    workload_key: str
    space: str  # resolved for this workload and target


PER_TASK_CAP = "max_trials_per_task"  # the key of the model's options that stores the cap


@dataclass(frozen=True)
class NewModel:
    name: str
    owner: str  # LOCAL_OWNER: the embedded CLI runs its task jobs
    target: TargetRef
    space: str  # as requested (each task stores its resolved space)
    trials: int
    round_trials: int
    options: JobOptions
    tasks: list[NewTask]
    wall_budget_s: float | None = None
    idempotency_key: str | None = None
    request_hash: str | None = None
    resume: bool = False  # the latest model job of the same key and owner, budget `trials`
    max_trials_per_task: int | None = None  # no task's job gets more (MetaSchedule's cap)

    @property
    def model_key(self) -> str:
        parts = [[t.workload_key, t.weight] for t in self.tasks]
        text = json.dumps([parts, self.target.key, self.space], separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class TaskRow:
    idx: int
    name: str
    weight: int
    workload_id: int
    workload_key: str
    space: str
    job_id: str | None
    job_state: JobState | None
    trials: int  # measured by this model's task job
    prior_trials: int  # on the target before this model job
    best_s: float | None  # the target's best valid record of the workload
    history: list[tuple[int, float | None]]  # (prior + trials, best) after each round
    done: bool
    error: str | None = None  # its task job's error, when that job failed

    @property
    def untuned(self) -> bool:
        """Finished without a valid record: the build gives it relax's default loops."""
        return self.done and self.best_s is None


@dataclass(frozen=True)
class ModelRow:
    id: str
    name: str
    owner: str
    target_id: int
    target_json: str
    device_key: str
    space: str
    trials: int
    round_trials: int
    options: dict[str, Any]
    wall_budget_s: float | None
    state: JobState
    message: str
    error: str | None
    estimates: list[tuple[int, float | None]]  # (trials spent, Σ weight × best) over time
    request_hash: str | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    tasks: list[TaskRow]

    @property
    def spent(self) -> int:
        return sum(t.trials for t in self.tasks)

    @property
    def estimate_s(self) -> float | None:
        """The model's latency as its tasks' best records say now: Σ weight × best (None while
        a task has no valid record)."""
        if any(t.best_s is None for t in self.tasks):
            return None
        return sum(t.weight * (t.best_s or 0.0) for t in self.tasks)


@dataclass(frozen=True)
class RoundState:
    """What a plan decides from: the budget, the time left and every task's state."""

    trials: int
    round_trials: int
    spent: int
    time_left_s: float | None
    tasks: list[TaskRow]
    max_trials_per_task: int | None = None  # trials of this model job per task, at most


@dataclass(frozen=True)
class Decision:
    """Start a round of `start` with `step` trials, or end the model job (`finish`)."""

    estimate_s: float | None
    start: int | None = None
    step: int = 0
    finish: JobState | None = None
    message: str = ""


Plan = Callable[[RoundState], Decision]


@dataclass(frozen=True)
class Advanced:
    job_id: str | None  # the task job to run now (a round started or in flight); None: ended
    started: bool  # a new round was started by this call


def create_model(store: Store, new: NewModel, *,
                 guard: Callable[[Session], None] | None = None) -> ModelRow:
    """Insert a QUEUED model job with its tasks (or return the owner's earlier one: the same
    `idempotency_key`, or with `resume` the latest of the same key, its budget set to
    `new.trials` and reopened if it had finished). `guard` runs in the inserting transaction
    before a new row is inserted (`tuner.db.jobs.Quotas.guard`)."""
    now = utcnow()
    with store.session() as s:
        row = None
        if new.idempotency_key is not None:
            row = s.scalar(select(m.ModelJob).where(
                m.ModelJob.owner == new.owner, m.ModelJob.idempotency_key == new.idempotency_key))
        elif new.resume:
            row = s.scalar(select(m.ModelJob).where(
                m.ModelJob.owner == new.owner, m.ModelJob.model_key == new.model_key)
                .order_by(m.ModelJob.created_at.desc()).limit(1).with_for_update())
            if row is not None:
                _reopen(s, row, new.trials, now)
        if row is None:
            if guard is not None:
                guard(s)
            row = _insert(s, new, now)
        s.flush()
        model_id = row.id
    return get_model(store, model_id)


def _reopen(s: Session, row: m.ModelJob, trials: int, now: datetime) -> None:
    """Resume a model job with budget `trials`: a finished one runs again, and a round whose
    task job was interrupted (Ctrl-C fails it) goes on."""
    row.trials, row.updated_at = trials, now
    if JobState(row.state) in (JobState.SUCCEEDED, JobState.FAILED):
        row.move_to(JobState.RUNNING, now=now, reopen=True)
        row.error = None
    for task in s.scalars(select(m.ModelTask).where(m.ModelTask.model_id == row.id,
                                                    m.ModelTask.round_from >= 0)):
        job = s.get(m.Job, task.job_id) if task.job_id else None
        if job is not None and job.state in (JobState.FAILED.value, JobState.CANCELLED.value):
            job.move_to(JobState.QUEUED, now=now, reopen=True)
            job.lease_owner = LOCAL_OWNER if row.owner == LOCAL_OWNER else None


def _insert(s: Session, new: NewModel, now: datetime) -> m.ModelJob:
    row = m.ModelJob(
        id=uuid.uuid4().hex, model_key=new.model_key, name=new.name, owner=new.owner,
        target_id=new.target.id, space=new.space, trials=new.trials,
        round_trials=new.round_trials, options_json=json.dumps(
            {**new.options.as_json(), **({PER_TASK_CAP: new.max_trials_per_task}
                                         if new.max_trials_per_task else {})}),
        wall_budget_s=new.wall_budget_s, state=JobState.QUEUED.value, message="queued",
        estimates_json="[]", idempotency_key=new.idempotency_key,
        request_hash=new.request_hash, created_at=now, updated_at=now)
    s.add(row)
    s.flush()
    for idx, t in enumerate(new.tasks):
        prior, best = _on_target(s, t.workload_id, new.target.id)
        s.add(m.ModelTask(model_id=row.id, idx=idx, name=t.name, weight=t.weight,
                          workload_id=t.workload_id, space=t.space, prior_trials=prior,
                          history_json=json.dumps([[prior, best]] if prior else []),
                          round_from=-1, done=False))
    return row


def _on_target(s: Session, workload_id: int, target_id: int) -> tuple[int, float | None]:
    """(trials, best valid median) the target already holds of a workload."""
    n, best = s.execute(
        select(func.count(), func.min(m.Record.median_s).filter(m.Record.invalidity == _OK))
        .where(m.Record.workload_id == workload_id, m.Record.target_id == target_id,
               m.Record.invalidity != _LOST)).one()
    return int(n), best


def get_model(store: Store, model_id: str) -> ModelRow:
    with store.session() as s:
        row = s.get(m.ModelJob, model_id)
        if row is None:
            raise NotFound(f"no model job {model_id!r}")
        return _row(s, row, _tasks(s, row))


def list_models(store: Store, *, owner: str | None = None, limit: int = 50,
                cursor: str | None = None) -> tuple[list[ModelRow], str | None]:
    """Newest first (of one `owner`, else everyone's): a page and the next page's cursor."""
    q = cursors.newest_first(select(m.ModelJob), m.ModelJob.created_at, m.ModelJob.id, cursor,
                             limit)
    if owner is not None:
        q = q.where(m.ModelJob.owner == owner)
    with store.session() as s:
        return cursors.page([_row(s, r, _tasks(s, r)) for r in s.scalars(q)], limit)


def stalled(store: Store) -> list[str]:
    """Active service model jobs with no active task job: their next round is due (the tuner
    that ended the last round may have died before it advanced the model)."""
    busy = exists().where(m.Job.model_id == m.ModelJob.id, m.Job.state.in_(ACTIVE))
    with store.session() as s:
        return list(s.scalars(select(m.ModelJob.id).where(
            m.ModelJob.state.in_(ACTIVE), m.ModelJob.owner != LOCAL_OWNER, ~busy)))


def cancel_model(store: Store, model_id: str) -> tuple[ModelRow, list[str]]:
    """Cancel a model job (idempotent): it is CANCELLED at once; returns it and its active task
    jobs, which the caller cancels like any job (`tuner.db.jobs.request_cancel`)."""
    with store.session() as s:
        row = s.get(m.ModelJob, model_id, with_for_update=True)
        if row is None:
            raise NotFound(f"no model job {model_id!r}")
        if not JobState(row.state).is_terminal:
            row.move_to(JobState.CANCELLED, now=utcnow())
            row.message = "cancelled"
        active = list(s.scalars(select(m.Job.id).where(m.Job.model_id == model_id,
                                                        m.Job.state.in_(ACTIVE))))
    return get_model(store, model_id), active


def advance(store: Store, model_id: str, plan: Plan, *,
            time_left_s: Callable[[datetime | None], float | None] | None = None) -> Advanced:
    """One step of a model job (see the module doc). `time_left_s(started_at)`: seconds left
    of its wall budget (default: `wall_budget_s` counted from the model job's start)."""
    with store.session() as s:
        row = s.get(m.ModelJob, model_id, with_for_update=True)
        if row is None:
            raise NotFound(f"no model job {model_id!r}")
        if JobState(row.state).is_terminal:
            return Advanced(None, False)
        tasks = _tasks(s, row)
        active = [t for t in tasks if t.job_state is not None and t.job_state.value in ACTIVE]
        if active:
            return Advanced(active[0].job_id, False)
        orm = {t.idx: t for t in s.scalars(select(m.ModelTask).where(
            m.ModelTask.model_id == model_id))}
        for t in tasks:
            _close_round(s, orm[t.idx], t)
        tasks = _tasks(s, row)
        now = utcnow()
        left = (time_left_s or _wall_left(row, now))(row.started_at)
        spent = sum(t.trials for t in tasks)
        cap = json.loads(row.options_json).get(PER_TASK_CAP)
        d = plan(RoundState(row.trials, row.round_trials, spent, left, tasks,
                            int(cap) if cap else None))
        estimates = json.loads(row.estimates_json)
        if not estimates or estimates[-1] != [spent, d.estimate_s]:
            row.estimates_json = json.dumps([*estimates, [spent, d.estimate_s]])
        row.message, row.updated_at = d.message[:2000], now
        if row.state == JobState.QUEUED.value:
            row.move_to(JobState.RUNNING, now=now)
        if d.start is None:
            row.move_to(d.finish or JobState.SUCCEEDED, now=now)
            return Advanced(None, False)
        job_id = _open_round(store, s, row, orm[d.start], tasks[d.start], d.step, left, now)
        return Advanced(job_id, True)


def _wall_left(row: m.ModelJob, now: datetime) -> Callable[[datetime | None], float | None]:
    def left(started: datetime | None) -> float | None:
        if row.wall_budget_s is None:
            return None
        return row.wall_budget_s - ((now - started).total_seconds() if started else 0.0)

    return left


def _close_round(s: Session, orm: m.ModelTask, t: TaskRow) -> None:
    """Learn a finished round: its trials and the best after it; a round that measured nothing
    new, stopped short or did not succeed ends the task's rounds."""
    if orm.round_from < 0 or t.job_id is None:
        return
    history = json.loads(orm.history_json)
    history.append([t.prior_trials + t.trials, t.best_s])
    job = s.get(m.Job, t.job_id)
    short = job is None or t.trials < job.trials or job.state != JobState.SUCCEEDED.value
    orm.history_json, orm.done = json.dumps(history), orm.done or short or (
        t.trials <= orm.round_from)
    orm.round_from = -1


def _open_round(store: Store, s: Session, row: m.ModelJob, orm: m.ModelTask, t: TaskRow,
                step: int, left: float | None, now: datetime) -> str:
    """Give task `t` a round of `step` trials: its task job, created or reopened (its id)."""
    lease_owner = LOCAL_OWNER if row.owner == LOCAL_OWNER else None
    orm.round_from = t.trials
    job = s.get(m.Job, orm.job_id) if orm.job_id is not None else None
    if job is None:
        tkey = s.scalar(select(m.Target.key).where(m.Target.id == row.target_id)) or ""
        made = store.create_job(
            job_key=job_key(t.workload_key, tkey, t.space), workload_id=t.workload_id,
            target_id=row.target_id, space=t.space, trials=step,
            options=json.loads(row.options_json), owner=row.owner, lease_owner=lease_owner,
            wall_budget_s=None if left is None else max(1.0, left), model_id=row.id, session=s)
        orm.job_id = made.id
        return made.id
    job.trials = t.trials + step
    job.move_to(JobState.QUEUED, now=now, reopen=True)
    job.lease_owner = lease_owner
    # the runner counts a job's wall budget from its first start: the model's time left, from
    # now, counted from there
    if left is not None:  # a new job starts now: `left` itself, above
        began = job.started_at or now
        job.wall_budget_s = max(1.0, left + (now - began).total_seconds())
    return job.id


def _tasks(s: Session, row: m.ModelJob) -> list[TaskRow]:
    tasks = list(s.scalars(select(m.ModelTask).where(m.ModelTask.model_id == row.id)
                           .order_by(m.ModelTask.idx)))
    wids = [t.workload_id for t in tasks]
    keys = {i: k for i, k in s.execute(select(m.Workload.id, m.Workload.key)
                                       .where(m.Workload.id.in_(wids)))}
    best = _pairs(s.execute(
        select(m.Record.workload_id, func.min(m.Record.median_s))
        .where(m.Record.workload_id.in_(wids), m.Record.target_id == row.target_id,
               m.Record.invalidity == _OK, m.Record.median_s.is_not(None))
        .group_by(m.Record.workload_id)))
    jobs = {j.id: j for j in s.scalars(select(m.Job).where(m.Job.model_id == row.id))}
    done = _pairs(s.execute(
        select(m.Record.job_id, func.count()).where(
            and_(m.Record.job_id.in_(list(jobs)), m.Record.invalidity != _LOST))
        .group_by(m.Record.job_id)))
    out = []
    for t in tasks:
        job = jobs.get(t.job_id) if t.job_id else None
        out.append(TaskRow(
            t.idx, t.name, t.weight, t.workload_id, keys.get(t.workload_id, ""), t.space,
            t.job_id, JobState(job.state) if job is not None else None,
            int(done.get(t.job_id, 0)) if t.job_id else 0, t.prior_trials,
            best.get(t.workload_id), [(int(n), b) for n, b in json.loads(t.history_json)],
            t.done, job.error if job is not None and job.state == JobState.FAILED else None))
    return out


def _pairs(rows: Iterable[tuple[K, V]]) -> dict[K, V]:
    return {k: v for k, v in rows}


def _row(s: Session, row: m.ModelJob, tasks: list[TaskRow]) -> ModelRow:
    target = s.get(m.Target, row.target_id)
    return ModelRow(
        row.id, row.name, row.owner, row.target_id, target.target_json if target else "{}",
        target.device_key if target else "", row.space, row.trials, row.round_trials,
        json.loads(row.options_json), row.wall_budget_s, JobState(row.state), row.message,
        row.error, [(int(n), e) for n, e in json.loads(row.estimates_json)], row.request_hash,
        row.created_at, row.updated_at, row.started_at, row.finished_at, tasks)
