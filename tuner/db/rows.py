"""Plain, immutable values the Store hands out and takes in (never live ORM objects)."""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from ..core.measurements import Invalidity, MeasureInput, MeasureResult
from . import tables as m


def mean_of(samples: Sequence[float] | None) -> float | None:
    """The mean of the samples as MetaSchedule ranks records (summed in order, then divided),
    None without samples."""
    if not samples:
        return None
    total = 0.0
    for x in samples:
        total += float(x)
    return total / len(samples)


@dataclass(frozen=True)
class TargetRef:
    id: int
    key: str
    target_json: str
    device_key: str

    @classmethod
    def of(cls, row: m.Target) -> TargetRef:
        return cls(row.id, row.key, row.target_json, row.device_key)


@dataclass(frozen=True)
class WorkloadRow:
    id: int
    key: str
    op: str
    spec_json: str
    shash: str
    mod_json: str
    description: str
    flops: int
    created_at: datetime
    nbytes: int = 0  # the parameters' bytes: the least a run moves (0: not known)

    @classmethod
    def of(cls, row: m.Workload) -> WorkloadRow:
        return cls(row.id, row.key, row.op, row.spec_json, row.shash, row.mod_json,
                   row.description, row.flops, row.created_at, row.nbytes or 0)


@dataclass(frozen=True)
class JobRow:
    id: str
    job_key: str
    workload_id: int
    target_id: int
    space: str
    trials: int
    state: m.JobState
    options: dict[str, Any]
    error: str | None
    idempotency_key: str | None
    request_hash: str | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None
    wall_budget_s: float | None = None
    owner: str = "local"  # the principal that submitted it (`tuner.db.jobs.LOCAL_OWNER`: the CLI)
    model_id: str | None = None  # the model job it is a task of
    message: str | None = None  # why it waits now (`Store.set_job_message`)

    @classmethod
    def of(cls, row: m.Job) -> JobRow:
        return cls(row.id, row.job_key, row.workload_id, row.target_id, row.space, row.trials,
                   m.JobState(row.state), json.loads(row.options_json), row.error,
                   row.idempotency_key, row.request_hash, row.created_at, row.updated_at,
                   row.started_at, row.finished_at, row.lease_owner, row.lease_expires_at,
                   row.wall_budget_s, row.owner, row.model_id, row.message)


@dataclass(frozen=True)
class NewRecord:
    """One measured trial to store. `trial_id` makes writing it idempotent."""

    trial_id: str
    workload_id: int
    target_id: int
    space: str
    cand_hash: str
    trace_json: str
    invalidity: Invalidity | str
    tvm_version: str
    job_id: str | None = None
    decisions: list[Any] = field(default_factory=list)
    # every sample, seconds; None only for a MetaSchedule record committed with run_secs None
    latencies: list[float] | None = field(default_factory=list)
    median_s: float | None = None
    cv: float | None = None
    error_msg: str | None = None
    worker: str | None = None
    build_s: float | None = None
    features: bytes | None = None  # float32 bytes for the cost model
    measured_at: datetime | None = None  # None: now
    predicted_s: float | None = None  # the cost model's prediction when it was picked
    knobs: dict[str, Any] = field(default_factory=dict)  # {knob name: value}: `check_knobs`

    @classmethod
    def from_measurement(cls, inp: MeasureInput, res: MeasureResult) -> NewRecord:
        """The record of a measured input; `inp.context` supplies what the result lacks."""
        ctx = inp.context
        if not ctx:
            raise ValueError(f"measure input {inp.trial_id} has no record context")
        feats = ctx.get("features_b64")
        return cls(
            trial_id=res.trial_id, job_id=ctx.get("job_id"), workload_id=int(ctx["workload_id"]),
            target_id=int(ctx["target_id"]), space=str(ctx["space"]),
            cand_hash=str(ctx["cand_hash"]), trace_json=inp.trace_json,
            invalidity=res.invalidity, tvm_version=str(ctx["tvm_version"]),
            decisions=list(ctx.get("decisions") or []), latencies=list(res.latencies_s),
            median_s=res.median_s, cv=res.cv, error_msg=res.error_msg, worker=res.worker,
            build_s=res.build_s, features=base64.b64decode(feats) if feats else None,
            predicted_s=_predicted(ctx.get("predicted_s")), knobs=check_knobs(ctx.get("knobs")))

    def input_digest(self) -> str:
        """sha256 of what the record takes from its MeasureInput (job, workload, target, space,
        candidate, trace, decisions, features, TVM version): what a worker may not change in the
        input it posts back (`tuner.db.trials` compares it with the issued trial's)."""
        bound: list[Any] = [
            self.job_id, self.workload_id, self.target_id, self.space, self.cand_hash,
            self.trace_json, self.tvm_version, self.decisions,
            self.features.hex() if self.features is not None else None]
        if self.predicted_s is not None:
            bound.append(self.predicted_s)
        if self.knobs:
            bound.append({"knobs": self.knobs})
        text = json.dumps(bound, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def columns(self, now: datetime) -> dict[str, Any]:
        return {
            "trial_id": self.trial_id, "job_id": self.job_id, "workload_id": self.workload_id,
            "target_id": self.target_id, "space": self.space, "cand_hash": self.cand_hash,
            "trace_json": self.trace_json, "decisions_json": json.dumps(self.decisions),
            "knobs_json": json.dumps(self.knobs),
            "latencies_json": json.dumps(None if self.latencies is None
                                         else [float(x) for x in self.latencies]),
            "median_s": self.median_s, "mean_s": mean_of(self.latencies), "cv": self.cv,
            "invalidity": Invalidity(self.invalidity).value, "error_msg": self.error_msg,
            "worker": self.worker, "build_s": self.build_s,
            "features": bytes(self.features) if self.features is not None else None,
            "tvm_version": self.tvm_version, "created_at": now,
            "measured_at": self.measured_at or now, "predicted_s": self.predicted_s,
        }


def _predicted(value: object) -> float | None:
    """A context's predicted latency: None, or a finite number > 0 (else ValueError)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            0 < float(value) < math.inf):
        raise ValueError(f"predicted_s must be a finite number > 0, not {value!r}")
    return float(value)


MAX_KNOBS, MAX_KNOB_NAME, MAX_TILE_PARTS = 64, 64, 16


def _knob_value(v: object) -> bool:
    if isinstance(v, bool) or v is None:
        return v is None
    if isinstance(v, int | float):
        return math.isfinite(v)
    if isinstance(v, str):
        return len(v) <= MAX_KNOB_NAME
    return (isinstance(v, list) and len(v) <= MAX_TILE_PARTS
            and all(isinstance(x, int) and not isinstance(x, bool) for x in v))


def check_knobs(value: object) -> dict[str, Any]:
    """A context's knob values (`schedules.naming`): {} when absent, else a dict of at most
    MAX_KNOBS names (text, at most MAX_KNOB_NAME characters) to a number, a short text or a
    perfect tile's factors (a list of integers); anything else is a ValueError."""
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > MAX_KNOBS:
        raise ValueError(f"knobs must be an object of at most {MAX_KNOBS} knob values")
    for name, v in value.items():
        if not isinstance(name, str) or not 0 < len(name) <= MAX_KNOB_NAME:
            raise ValueError(f"a knob name must be text of 1 to {MAX_KNOB_NAME} characters")
        if not _knob_value(v):
            raise ValueError(f"knob {name!r}: a value must be a finite number, a short text "
                             f"or a list of at most {MAX_TILE_PARTS} integers")
    return dict(value)


@dataclass(frozen=True)
class RecordRow:
    id: int
    trial_id: str
    job_id: str | None
    workload_id: int
    target_id: int
    space: str
    cand_hash: str
    trace_json: str
    decisions: list[Any]
    latencies: list[float] | None  # None: committed through MetaSchedule with run_secs None
    median_s: float | None
    mean_s: float | None
    cv: float | None
    invalidity: Invalidity
    error_msg: str | None
    worker: str | None
    build_s: float | None
    features: bytes | None
    tvm_version: str
    created_at: datetime
    measured_at: datetime
    predicted_s: float | None = None
    trust: str = m.Trust.LOCAL.value  # `tuner.db.tables.Trust`
    confirms: str | None = None  # a confirmation: the trial it measured again
    confirmed_s: float | None = None  # a confirmed farm record: the slower median of the two
    knobs: dict[str, Any] = field(default_factory=dict)  # {knob name: value}

    @property
    def ok(self) -> bool:
        return self.invalidity is Invalidity.OK

    @property
    def served_s(self) -> float | None:
        """The latency a best is served at: the confirmed one when there is one."""
        return self.confirmed_s if self.confirmed_s is not None else self.median_s

    @classmethod
    def of(cls, r: m.Record) -> RecordRow:
        return cls(r.id, r.trial_id, r.job_id, r.workload_id, r.target_id, r.space, r.cand_hash,
                   r.trace_json, json.loads(r.decisions_json), json.loads(r.latencies_json),
                   r.median_s, r.mean_s, r.cv, Invalidity(r.invalidity), r.error_msg, r.worker,
                   r.build_s, r.features, r.tvm_version, r.created_at, r.measured_at,
                   r.predicted_s, r.trust, r.confirms, r.confirmed_s,
                   json.loads(r.knobs_json or "{}"))


@dataclass(frozen=True)
class MeasuredRow:
    """What dedup needs to know about an already measured candidate."""

    trial_id: str
    invalidity: Invalidity
    median_s: float | None
    latencies: list[float]


class TrainingRow(NamedTuple):
    workload_id: int
    features: bytes
    median_s: float | None
    invalidity: Invalidity
