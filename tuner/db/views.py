"""What users see of the stored rows: one pydantic model per resource, built from its row.

These are the JSON shapes of the REST API's responses (`api.schemas` re-exports them for the
OpenAPI document) and of the CLI's JSON output (`tunefarm best`, `tunefarm records --json`):
every field a response carries is declared here, and only here. A model is built from the
immutable row (`tuner.db.rows`, `tuner.db.workers.WorkerRow`) plus what the row does not hold
(`JobStats`, a record's workload and target), never from live ORM objects; this module runs no
SQL (`tuner.db.jobs.job_view`, `tuner.interop.records` gather the inputs). Timestamps are ISO 8601
text
(`datetime.isoformat`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, field_validator

from ..core.measurements import gbps, gflops, memory_bound
from .rows import JobRow, RecordRow

if TYPE_CHECKING:
    from ..core.config import Settings
    from .model_jobs import ModelRow
    from .workers import WorkerRow


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t is not None else None


# --- jobs ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobStats:
    """What a job's view needs beyond its row: its workload and target, and its progress."""

    workload_key: str
    workload: dict[str, Any]  # the spec
    flops: int
    target: dict[str, Any]
    device_key: str
    trials_done: int  # records that count against the budget (worker_lost ones do not)
    best_trial_id: str | None = None
    best_s: float | None = None
    task_name: str | None = None  # a model's task job: the task's name
    nbytes: int = 0  # the workload's parameters' bytes (0: not known)


class BestSoFar(BaseModel):
    trial_id: str
    latency_s: float | None
    gflops: float | None
    gbps: float | None = Field(default=None, description=(
        "The workload's parameters' bytes over the latency: GB/s, for a memory-bound job."))


class JobPublic(BaseModel):
    """A job as its owner (or an admin) sees it: `workload` is the full spec, TVMScript text
    included; the API shows a job to no one else."""

    id: str
    owner: str
    state: str
    workload_key: str
    workload: dict[str, Any]
    target: dict[str, Any]
    device_key: str
    space: str
    trials: int
    trials_done: int
    wall_budget_s: float | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    best: BestSoFar | None = None
    error: str | None = None
    message: str | None = Field(default=None, description=(
        "Why a running job makes no progress now, e.g. no live worker of its device key."))
    model_id: str | None = Field(default=None, description="The model job it is a task of.")
    task_name: str | None = Field(default=None, description=(
        "A model's task job: the task's name (relax's name of its PrimFunc, e.g. "
        "fused_matmul_add_relu)."))
    nbytes: int = Field(default=0, description=(
        "Bytes of the workload's parameters, read or written once: the least a run moves "
        "(0: not known)."))
    memory_bound: bool = Field(default=False, description=(
        "Its flops per byte are under the board's balance (peak GFLOPS over peak GB/s where "
        "both are declared, else 4): its roof is the memory bandwidth, so read GB/s."))
    emulated: bool = Field(default=False, description=(
        "Its device key is an emulated board's: latencies are emulation's, not a real "
        "board's; outputs are verified there all the same."))
    created_at: str
    updated_at: str
    started_at: str | None = None
    finished_at: str | None = None

    @classmethod
    def from_row(cls, row: JobRow, stats: JobStats,
                 settings: Settings | None = None) -> JobPublic:
        from ..core.config import get_settings

        best = None
        if stats.best_trial_id is not None:
            best = BestSoFar(trial_id=stats.best_trial_id, latency_s=stats.best_s,
                             gflops=gflops(stats.flops, stats.best_s),
                             gbps=gbps(stats.nbytes, stats.best_s))
        settings = settings or get_settings()
        balance = settings.balance(stats.device_key)
        bound = memory_bound(stats.flops, stats.nbytes, balance)
        return cls(
            id=row.id, owner=row.owner, state=str(row.state), workload_key=stats.workload_key,
            workload=stats.workload, target=stats.target, device_key=stats.device_key,
            space=row.space, trials=row.trials, trials_done=stats.trials_done,
            wall_budget_s=row.wall_budget_s, options=row.options, best=best, error=row.error,
            message=row.message if not row.state.is_terminal else None,
            model_id=row.model_id, task_name=stats.task_name, nbytes=stats.nbytes,
            memory_bound=bound, emulated=settings.emulated(stats.device_key),
            created_at=row.created_at.isoformat(),
            updated_at=row.updated_at.isoformat(),
            started_at=_iso(row.started_at), finished_at=_iso(row.finished_at))


# --- model jobs ----------------------------------------------------------------------------


class ModelTaskPublic(BaseModel):
    """One task of a model job: a PrimFunc called `weight` times per run of the model."""

    name: str
    weight: int
    workload_key: str
    space: str
    job_id: str | None = Field(description="Its task job, once it had a round.")
    state: str | None = Field(description="Its task job's state (None: no round yet).")
    trials_done: int = Field(description="Measured by this model job.")
    prior_trials: int = Field(description="Measured on this target before this model job.")
    best_s: float | None = Field(description="The target's best latency of this PrimFunc.")
    done: bool = Field(description="No more rounds: its space gave nothing new, or it failed.")
    untuned: bool = Field(default=False, description=(
        "Done without a valid record: a build gives it relax's default loops."))
    error: str | None = Field(default=None, description="Why its task job failed, if it did.")


class ModelPublic(BaseModel):
    """A model job as its owner (or an admin) sees it: its budget, the estimated model latency
    (Σ weight × best task latency) after each round, and every task's progress."""

    id: str
    owner: str
    name: str
    state: str
    target: dict[str, Any]
    device_key: str
    space: str
    trials: int
    trials_done: int
    round_trials: int
    wall_budget_s: float | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    estimate_s: float | None = Field(
        description="Σ weight × best task latency now; None until every task has a valid "
                    "record.")
    estimates: list[tuple[int, float | None]] = Field(
        description="(trials spent, estimate) after each round: the latency falling.")
    message: str
    error: str | None = None
    tasks: list[ModelTaskPublic]
    created_at: str
    updated_at: str
    started_at: str | None = None
    finished_at: str | None = None

    @classmethod
    def from_row(cls, row: ModelRow) -> ModelPublic:
        return cls(
            id=row.id, owner=row.owner, name=row.name, state=str(row.state),
            target=json.loads(row.target_json), device_key=row.device_key, space=row.space,
            trials=row.trials, trials_done=row.spent, round_trials=row.round_trials,
            wall_budget_s=row.wall_budget_s, options=row.options,
            estimate_s=row.estimate_s,
            estimates=row.estimates, message=row.message, error=row.error,
            tasks=[ModelTaskPublic(
                name=t.name, weight=t.weight, workload_key=t.workload_key, space=t.space,
                job_id=t.job_id, state=str(t.job_state) if t.job_state else None,
                trials_done=t.trials, prior_trials=t.prior_trials, best_s=t.best_s,
                done=t.done, untuned=t.untuned, error=t.error) for t in row.tasks],
            created_at=row.created_at.isoformat(), updated_at=row.updated_at.isoformat(),
            started_at=_iso(row.started_at), finished_at=_iso(row.finished_at))


# --- records -------------------------------------------------------------------------------


class RecordPublic(BaseModel):
    """One measured trial. `noisy`: its samples vary more than TUNEFARM_NOISE_CV."""

    trial_id: str
    job_id: str | None
    workload_key: str
    target: dict[str, Any] | None
    device_key: str | None
    space: str
    invalidity: str
    error_msg: str | None
    latency_s: float | None
    latencies_s: list[float]
    cv: float | None
    noisy: bool
    gflops: float | None
    decisions: list[Any]
    knobs: dict[str, Any] = Field(default_factory=dict, description=(
        "The candidate's knob values by name, as `GET /v1/spaces` names a template's knobs (a "
        "categorical knob's chosen value, a tile's factors); positional names (\"tile 0\") "
        "for MetaSchedule's generated space; empty for records measured before knobs were "
        "named."))
    trace: Any
    worker: str | None
    build_s: float | None
    tvm_version: str
    measured_at: str
    predicted_s: float | None = Field(
        default=None, description="The cost model's predicted latency when it was picked.")
    trust: str = Field(default="local", description=(
        "local: measured by a process holding the database; farm: a worker's, served as a best "
        "only once confirmed; confirmed: a second measurement agreed (served at the slower "
        "median, confirmed_s); refuted: the second measurement failed; confirmation: that "
        "second measurement."))
    confirms: str | None = Field(default=None, description=(
        "On a confirmation: the trial it measured again."))
    confirmed_s: float | None = Field(default=None, description=(
        "On a confirmed record: the slower median of it and its confirmation."))
    emulated: bool = Field(default=False, description=(
        "Measured on an emulated board (TUNEFARM_EMULATED_KEYS, e.g. qemu-aarch64): its "
        "output was verified there, its latency is emulation's and says nothing about a real "
        "board."))

    @staticmethod
    def fields_of(row: RecordRow, *, workload_key: str, flops: int,
                  target_json: str | None = None, device_key: str | None = None,
                  noise_cv: float | None = None) -> dict[str, Any]:
        """The RecordPublic fields of a row (subclasses add their own to these)."""
        from ..core.config import get_settings

        if noise_cv is None:
            noise_cv = get_settings().noise_cv
        return {
            "trial_id": row.trial_id, "job_id": row.job_id, "workload_key": workload_key,
            "target": json.loads(target_json) if target_json else None, "device_key": device_key,
            "space": row.space, "invalidity": str(row.invalidity), "error_msg": row.error_msg,
            "latency_s": row.median_s, "latencies_s": row.latencies or [], "cv": row.cv,
            "noisy": row.cv is not None and row.cv > noise_cv,
            "gflops": gflops(flops, row.median_s), "decisions": row.decisions, "knobs": row.knobs,
            "trace": json.loads(row.trace_json), "worker": row.worker, "build_s": row.build_s,
            "tvm_version": row.tvm_version, "measured_at": row.measured_at.isoformat(),
            "predicted_s": row.predicted_s, "trust": row.trust, "confirms": row.confirms,
            "confirmed_s": row.confirmed_s,
            "emulated": bool(device_key) and get_settings().emulated(str(device_key)),
        }

    @classmethod
    def from_row(cls, row: RecordRow, *, workload_key: str, flops: int,
                 target_json: str | None = None, device_key: str | None = None,
                 noise_cv: float | None = None) -> RecordPublic:
        return cls(**cls.fields_of(row, workload_key=workload_key, flops=flops,
                                   target_json=target_json, device_key=device_key,
                                   noise_cv=noise_cv))


class ListedRecord(RecordPublic):
    """A record in a listing across workloads (`tunefarm records`): with its workload's
    description."""

    workload: str


def shared_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """A workload spec as views shared between owners show it: a "tir" spec without its
    TVMScript text (only the jobs' owners and admins see that, in `JobPublic`), with its op,
    `num_outputs` and a `tvmscript_omitted` flag; other specs unchanged."""
    if spec.get("op") != "tir" or "tvmscript" not in spec:
        return spec
    return {**{k: v for k, v in spec.items() if k != "tvmscript"}, "tvmscript_omitted": True}


class BestPublic(RecordPublic):
    """The best record of a workload on a target: with the workload spec and the schedule as
    Python (`tuner.interop.records.best_record`, GET /v1/best). Shared by every user: a "tir"
    workload's
    TVMScript text is left out (`shared_spec`)."""

    workload: dict[str, Any]
    schedule_python: str

    @field_validator("workload")
    @classmethod
    def _shared(cls, spec: dict[str, Any]) -> dict[str, Any]:
        return shared_spec(spec)


# --- workers -------------------------------------------------------------------------------


class WorkerPublic(BaseModel):
    """A registered worker. `throughput_per_min`: measurements per minute since it registered."""

    id: str
    name: str
    device_key: str
    target: dict[str, Any]
    capabilities: dict[str, Any]
    tvm_version: str
    hostname: str
    state: str
    measured: int
    failures: int
    infra_failures: int
    registered_at: str
    last_seen_at: str
    throughput_per_min: float

    @classmethod
    def from_row(cls, row: WorkerRow) -> WorkerPublic:
        return cls(
            id=row.id, name=row.name, device_key=row.device_key, target=row.target,
            capabilities=row.capabilities, tvm_version=row.tvm_version, hostname=row.hostname,
            state=row.state, measured=row.measured, failures=row.failures,
            infra_failures=row.infra_failures, registered_at=row.registered_at.isoformat(),
            last_seen_at=row.last_seen_at.isoformat(), throughput_per_min=row.throughput_per_min)
