"""SQLAlchemy ORM models of the tuning database.

The schema is owned by the Alembic migrations in `migrations/versions/`; keep both in sync
(`tests/tuner/test_db.py` compares them).
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from ..core.errors import Conflict

# Named constraints: Alembic's batch mode (SQLite) needs names to alter or drop them later.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite drops the offset on the way in)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# lease_owner (and owner) of the jobs the embedded CLI runs: no service tuner claims them, in
# any state (`tuner.db.jobs.LOCAL_OWNER`)
LOCAL_LEASE = "local"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Trust(StrEnum):
    """Whether a record may be served as a best (`Store.best(served=True)`, GET /v1/best): LOCAL
    records come from a process that holds the database (the CLI, MetaSchedule's commits, an
    import) and are served as measured; FARM records come from a worker through the API and are
    served only once CONFIRMED by a second measurement (at the slower of the two medians);
    CONFIRMATION records are those second measurements (never served themselves); a FARM record
    whose confirmation failed is REFUTED (never served)."""

    LOCAL = "local"
    FARM = "farm"
    CONFIRMED = "confirmed"
    REFUTED = "refuted"
    CONFIRMATION = "confirmation"


SERVED_TRUST = (Trust.LOCAL.value, Trust.CONFIRMED.value)


class JobState(StrEnum):
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLING = "CANCELLING"
    CANCELLED = "CANCELLED"

    @property
    def is_terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)

    def can_become(self, to: JobState, *, reopen: bool = False) -> bool:
        """The job state machine (enforced by `Job.move_to`): QUEUED -> RUNNING -> SUCCEEDED |
        FAILED, cancel through CANCELLING -> CANCELLED; `reopen` lets a finished job run again
        (RUNNING: the CLI resumes and extends jobs; QUEUED: a model job's next round of a task)."""
        if to is self:
            return True
        if reopen and self.is_terminal and to in (JobState.RUNNING, JobState.QUEUED):
            return True
        return to in _TRANSITIONS[self]


_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.RUNNING, JobState.CANCELLED, JobState.FAILED}),
    JobState.RUNNING: frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLING,
                                 JobState.CANCELLED}),
    JobState.CANCELLING: frozenset({JobState.CANCELLED, JobState.FAILED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


class Workload(Base):
    __tablename__ = "workloads"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    op: Mapped[str] = mapped_column(String(32))
    spec_json: Mapped[str] = mapped_column(Text)  # canonical JSON of the workload spec
    shash: Mapped[str] = mapped_column(String(16), index=True)  # 16-hex structural hash
    mod_json: Mapped[str] = mapped_column(Text)  # tvm.ir.save_json(IRModule)
    description: Mapped[str] = mapped_column(Text, default="")
    flops: Mapped[int] = mapped_column(BigInteger, default=0)
    # bytes of its parameters, read or written once: the least one run moves (0: not known)
    nbytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Target(Base):
    __tablename__ = "targets"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    target_json: Mapped[str] = mapped_column(Text)
    device_key: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        # an idempotency key is the owner's: another owner's use of the same key is unrelated
        UniqueConstraint("owner", "idempotency_key"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # uuid4 hex
    job_key: Mapped[str] = mapped_column(String(64), index=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"))
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id"))
    space: Mapped[str] = mapped_column(String(64))
    trials: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), index=True)
    options_json: Mapped[str] = mapped_column(Text, default="{}")
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # why a running job makes no progress now (e.g. no live worker of its device key), or None
    message: Mapped[str | None] = mapped_column(String(500), nullable=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    request_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # service: the tuner process running the job holds a lease judged by the database clock
    lease_owner: Mapped[str | None] = mapped_column(String(128), nullable=True)
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    wall_budget_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    # the principal (token name) that submitted the job; LOCAL_OWNER for the embedded CLI
    owner: Mapped[str] = mapped_column(String(128), default="local", index=True)
    # a task job of a model job (`ModelJob`): its rounds are started by `tuner.model.rounds`
    model_id: Mapped[str | None] = mapped_column(ForeignKey("model_jobs.id"), nullable=True,
                                                 index=True)

    def move_to(self, to: JobState, *, now: datetime, error: str | None = None,
                reopen: bool = False) -> None:
        """The one place a job's state changes, on a row the caller holds locked (FOR UPDATE):
        the move must be allowed by `JobState.can_become` (else `Conflict`). RUNNING stamps
        started_at (the first time), terminal states stamp finished_at and free the lease,
        others clear finished_at; `error` (if given) is stored. Callers:
        `Store.set_job_state` (a transition), `tuner.db.jobs.request_cancel` (a cancel) and a
        model job's rounds (`tuner.db.model_jobs`: a task job reopened)."""
        _move(self, "job", JobState(self.state).can_become(to, reopen=reopen), to, now, error)
        if to.is_terminal and self.lease_owner != LOCAL_LEASE:  # a CLI job stays the CLI's
            self.lease_owner = self.lease_expires_at = None


def _move(row: Job | ModelJob, kind: str, allowed: bool, to: JobState, now: datetime,
          error: str | None) -> None:
    """A job's or a model job's state change, once it is `allowed`: the time stamps and the
    error, as `Job.move_to` says."""
    if not allowed:
        raise Conflict(f"{kind} {row.id} is {JobState(row.state)}; it cannot become {to}")
    row.state, row.updated_at = to.value, now
    if to is JobState.RUNNING and row.started_at is None:
        row.started_at = now
    row.finished_at = now if to.is_terminal else None
    if error is not None:
        row.error = error


class ModelJob(Base):
    """A model job: one trial budget spread over the task jobs (`Job.model_id`) of a model's
    extracted PrimFuncs, one round at a time (`tuner.model.rounds`). Its state uses `JobState`."""

    __tablename__ = "model_jobs"
    __table_args__ = (UniqueConstraint("owner", "idempotency_key"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # uuid4 hex
    model_key: Mapped[str] = mapped_column(String(64), index=True)  # tasks + target + space
    name: Mapped[str] = mapped_column(String(128), default="")
    owner: Mapped[str] = mapped_column(String(128), index=True)
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id"))
    space: Mapped[str] = mapped_column(String(64))
    trials: Mapped[int] = mapped_column(Integer)  # of the whole model
    round_trials: Mapped[int] = mapped_column(Integer)
    options_json: Mapped[str] = mapped_column(Text, default="{}")  # the task jobs' JobOptions
    wall_budget_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    state: Mapped[str] = mapped_column(String(16), index=True)
    message: Mapped[str] = mapped_column(Text, default="")
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    estimates_json: Mapped[str] = mapped_column(Text, default="[]")  # [[trials, estimate_s]]
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    request_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)

    def move_to(self, to: JobState, *, now: datetime, error: str | None = None,
                reopen: bool = False) -> None:
        """The one place a model job's state changes (the row locked): `Job.move_to`'s state
        machine and time stamps; a model job holds no lease."""
        _move(self, "model job", JobState(self.state).can_become(to, reopen=reopen), to, now,
              error)


class ModelTask(Base):
    """One distinct PrimFunc of a model job, called `weight` times per run of the model."""

    __tablename__ = "model_tasks"

    model_id: Mapped[str] = mapped_column(ForeignKey("model_jobs.id"), primary_key=True)
    idx: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    weight: Mapped[int] = mapped_column(Integer)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"))
    space: Mapped[str] = mapped_column(String(64))  # resolved, as its task job's
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id"), nullable=True)
    prior_trials: Mapped[int] = mapped_column(Integer, default=0)  # on the target before
    history_json: Mapped[str] = mapped_column(Text, default="[]")  # [[trials, best_s]] per round
    round_from: Mapped[int] = mapped_column(Integer, default=-1)  # its open round began at; -1
    done: Mapped[bool] = mapped_column(Boolean, default=False)  # no more rounds


class Record(Base):
    __tablename__ = "records"
    __table_args__ = (
        Index("ix_records_workload_target_cand", "workload_id", "target_id", "cand_hash"),
        Index("ix_records_workload_target_invalidity_median",
              "workload_id", "target_id", "invalidity", "median_s"),
        Index("ix_records_workload_target_invalidity_mean",
              "workload_id", "target_id", "invalidity", "mean_s"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    trial_id: Mapped[str] = mapped_column(String(64), unique=True)
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id"), nullable=True, index=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"))
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id"))
    space: Mapped[str] = mapped_column(String(64))
    cand_hash: Mapped[str] = mapped_column(String(32))
    trace_json: Mapped[str] = mapped_column(Text)
    decisions_json: Mapped[str] = mapped_column(Text, default="[]")
    # {knob name: value} of the candidate, named as `tunefarm spaces` names the knobs
    # (schedules/naming.py); "{}" where unnamed (records from before, MetaSchedule's commits)
    knobs_json: Mapped[str] = mapped_column(Text, default="{}", server_default="{}")
    # every sample, seconds, as measured or committed ("null": committed with run_secs None)
    latencies_json: Mapped[str] = mapped_column(Text, default="[]")
    median_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    mean_s: Mapped[float | None] = mapped_column(Float, nullable=True)  # MetaSchedule's ranking
    cv: Mapped[float | None] = mapped_column(Float, nullable=True)
    invalidity: Mapped[str] = mapped_column(String(16))  # tuner.measure.Invalidity
    error_msg: Mapped[str | None] = mapped_column(Text, nullable=True)
    worker: Mapped[str | None] = mapped_column(String(128), nullable=True)
    build_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    features: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)  # float32 bytes
    # the cost model's prediction when the search picked it: the workload's best latency then,
    # over the predicted throughput relative to it (None: no best yet, or no trained model)
    predicted_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    # `Trust`; a confirmation's `confirms` names the trial it measured again; a confirmed farm
    # record's `confirmed_s` is the slower median of the two (what GET /v1/best serves)
    trust: Mapped[str] = mapped_column(String(16), default=Trust.LOCAL.value,
                                       server_default=Trust.LOCAL.value)
    confirms: Mapped[str | None] = mapped_column(String(64), nullable=True)
    confirmed_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    tvm_version: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    measured_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class CostModel(Base):
    """One version of the farm's cost model of a target (target + device key): an XGBoost
    booster trained on the target's records up to `last_record_id`, updated incrementally
    (`tuner.search.farm_model`). Every job on the target starts from the latest version."""

    __tablename__ = "cost_models"
    __table_args__ = (UniqueConstraint("target_id", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    objective: Mapped[str] = mapped_column(String(32))
    feature_dim: Mapped[int] = mapped_column(Integer)
    rows: Mapped[int] = mapped_column(Integer)  # records it has learned from, in all
    last_record_id: Mapped[int] = mapped_column(Integer)  # records.id high-water mark
    full: Mapped[bool] = mapped_column(Boolean)  # a full refit (else an incremental update)
    booster: Mapped[bytes] = mapped_column(LargeBinary)  # XGBoost's UBJSON model
    metrics_json: Mapped[str] = mapped_column(Text, default="{}")  # held-out accuracy
    train_s: Mapped[float] = mapped_column(Float, default=0.0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class WorkloadHash(Base):
    """A workload's hash under one of MetaSchedule's module equalities ("ignore-tensor",
    "anchor-block"; "structural" is `Workload.shash`), filled in as a `TunefarmDatabase` using
    that equality first needs it: how it finds the stored workloads equal to a module."""

    __tablename__ = "workload_hashes"
    __table_args__ = (Index("ix_workload_hashes_mode_hash", "mode", "hash"),)

    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"), primary_key=True)
    mode: Mapped[str] = mapped_column(String(16), primary_key=True)
    hash: Mapped[str] = mapped_column(String(16))


class Token(Base):
    """An API bearer token; only its sha256 is stored."""

    __tablename__ = "tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128), default="")
    scope: Mapped[str] = mapped_column(String(16))  # user | worker | admin
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # a worker token bound to a device key registers workers of that key only
    device_key: Mapped[str | None] = mapped_column(String(64), nullable=True)


class Worker(Base):
    """A registered measurement worker (one per process, next to its board)."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), default="")
    device_key: Mapped[str] = mapped_column(String(64), index=True)
    target_json: Mapped[str] = mapped_column(Text)
    capabilities_json: Mapped[str] = mapped_column(Text, default="{}")
    tvm_version: Mapped[str] = mapped_column(String(64), default="")
    hostname: Mapped[str] = mapped_column(String(255), default="")
    state: Mapped[str] = mapped_column(String(16), default="idle")
    measured: Mapped[int] = mapped_column(Integer, default=0)
    failures: Mapped[int] = mapped_column(Integer, default=0)
    infra_failures: Mapped[int] = mapped_column(Integer, default=0)
    registered_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # the token that registered it: only that token may act as this worker
    token_id: Mapped[int | None] = mapped_column(Integer, nullable=True)


class IssuedTrial(Base):
    """A candidate the tuner handed to the farm: the API accepts one result for it, from a worker
    of its device key holding its lease, before `expires_at`, and only then (`used_at` stamps
    the result)."""

    __tablename__ = "issued_trials"

    trial_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"))
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id"))
    device_key: Mapped[str] = mapped_column(String(64))
    cand_hash: Mapped[str] = mapped_column(String(32))
    input_sha256: Mapped[str] = mapped_column(String(64))  # NewRecord.input_digest()
    issued_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    used_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # the worker the API last handed the trial's queue entry to (None: not leased through the
    # API): only it may answer the trial
    holder: Mapped[str | None] = mapped_column(String(128), nullable=True)
    # a confirmation trial: the trial it measures again, and the worker that measured that one
    # (the API hands it to another worker of the key when one is live)
    confirms: Mapped[str | None] = mapped_column(String(64), nullable=True)
    avoid: Mapped[str | None] = mapped_column(String(128), nullable=True)
