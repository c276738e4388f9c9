"""The farm's cost models in SQL: versions of one XGBoost booster per target (target + device
key), and the training rows they learn from, read by record id so that an update reads only what
landed since the last version. What a model is and how it is trained lives in
`tuner.search.farm_model`; this module only stores and reads."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import Row, Select, func, select
from sqlalchemy.exc import IntegrityError

from ..core.measurements import Invalidity
from . import tables as m
from .store import Store

# (record id, workload id, features, median_s, invalidity): what `_rows` selects
_Training = tuple[int, int, bytes | None, float | None, str]

_LOST = Invalidity.WORKER_LOST.value


@dataclass(frozen=True)
class StoredModel:
    id: int
    target_id: int
    version: int
    objective: str
    feature_dim: int
    rows: int
    last_record_id: int
    full: bool
    booster: bytes
    metrics: dict[str, Any]
    train_s: float
    created_at: datetime

    @classmethod
    def of(cls, r: m.CostModel) -> StoredModel:
        return cls(r.id, r.target_id, r.version, r.objective, r.feature_dim, r.rows,
                   r.last_record_id, r.full, bytes(r.booster), json.loads(r.metrics_json),
                   r.train_s, r.created_at)


@dataclass(frozen=True)
class TrainingRows:
    """Records of one target as the cost model learns them: infrastructure failures
    (worker_lost) and records without features are never among them."""

    ids: np.ndarray  # int64, ascending
    workload_ids: np.ndarray  # int64
    features: np.ndarray  # (n, dim) float32
    median_s: np.ndarray  # float64; NaN for a failed kernel

    def __len__(self) -> int:
        return len(self.ids)

    def latencies(self) -> list[float | None]:
        """Each row's median latency; None for a failed kernel."""
        return [None if np.isnan(v) else float(v) for v in self.median_s]

    def __add__(self, other: TrainingRows) -> TrainingRows:
        return TrainingRows(np.concatenate([self.ids, other.ids]),
                            np.concatenate([self.workload_ids, other.workload_ids]),
                            np.concatenate([self.features, other.features]),
                            np.concatenate([self.median_s, other.median_s]))


def latest(store: Store, target_id: int) -> StoredModel | None:
    with store.session() as s:
        row = s.scalar(select(m.CostModel).where(m.CostModel.target_id == target_id)
                       .order_by(m.CostModel.version.desc()).limit(1))
        return StoredModel.of(row) if row is not None else None


def family_latest(store: Store, target_id: int) -> StoredModel | None:
    """The newest model of another device key with the same target: a board class the farm has
    not measured yet starts from its CPU family's model."""
    with store.session() as s:
        tjson = s.scalar(select(m.Target.target_json).where(m.Target.id == target_id))
        row = s.scalar(select(m.CostModel).join(m.Target, m.Target.id == m.CostModel.target_id)
                       .where(m.Target.target_json == tjson, m.CostModel.target_id != target_id)
                       .order_by(m.CostModel.created_at.desc()).limit(1))
        return StoredModel.of(row) if row is not None else None


def save(store: Store, *, target_id: int, version: int, objective: str, feature_dim: int,
         rows: int, last_record_id: int, full: bool, booster: bytes, metrics: dict[str, Any],
         train_s: float) -> StoredModel | None:
    """Store a version; None when another process stored that version first (its update
    wins: this one is dropped, never merged)."""
    try:
        with store.session() as s:
            row = m.CostModel(target_id=target_id, version=version, objective=objective,
                              feature_dim=feature_dim, rows=rows, last_record_id=last_record_id,
                              full=full, booster=booster, metrics_json=json.dumps(metrics),
                              train_s=train_s)
            s.add(row)
            s.flush()
            return StoredModel.of(row)
    except Exception as exc:  # the session wraps IntegrityError in DatabaseError
        if isinstance(exc.__cause__, IntegrityError):
            return None
        raise


def _rows(store: Store, target_id: int, *, dim: int, after_id: int = 0,
          workload_id: int | None = None, newest: int | None = None,
          limit: int | None = None) -> TrainingRows:
    """Training rows of the target (of one workload), after record `after_id`: the first
    `limit`, or the `newest` n; oldest first."""
    q = (select(m.Record.id, m.Record.workload_id, m.Record.features, m.Record.median_s,
                m.Record.invalidity)
         .where(m.Record.target_id == target_id, m.Record.id > after_id,
                m.Record.features.is_not(None), m.Record.invalidity != _LOST))
    if workload_id is not None:
        q = q.where(m.Record.workload_id == workload_id)
    if newest is not None:
        q = q.order_by(m.Record.id.desc()).limit(newest)
    else:
        q = q.order_by(m.Record.id).limit(limit)
    return _convert(_fetch(store, q, dim), dim)


def _fetch(store: Store, q: Select[*_Training], dim: int) -> list[Row[*_Training]]:
    with store.session() as s:
        got = [r for r in s.execute(q) if r[2] is not None and len(r[2]) == 4 * dim]
    got.sort(key=lambda r: r[0])
    return got


def _convert(got: list[Row[*_Training]], dim: int) -> TrainingRows:
    feats = (np.frombuffer(b"".join(bytes(r[2] or b"") for r in got), dtype=np.float32)
             .reshape(len(got), dim) if got else np.zeros((0, dim), np.float32))
    return TrainingRows(
        np.array([r[0] for r in got], dtype=np.int64),
        np.array([r[1] for r in got], dtype=np.int64), feats,
        np.array([r[3] if r[4] == Invalidity.OK.value and r[3] else np.nan for r in got],
                 dtype=np.float64))


def rows_after(store: Store, target_id: int, after_id: int, *, dim: int,
               limit: int | None = None) -> TrainingRows:
    """The target's training rows stored after record `after_id`, oldest first."""
    return _rows(store, target_id, dim=dim, after_id=after_id, limit=limit)


def newest_rows(store: Store, target_id: int, n: int, *, dim: int) -> TrainingRows:
    """The target's `n` newest training rows (a full refit's sample), oldest first."""
    return _rows(store, target_id, dim=dim, newest=n)


def workload_rows(store: Store, target_id: int, workload_id: int, n: int, *,
                  dim: int) -> TrainingRows:
    """The `n` newest training rows of one workload on the target (a job's own history)."""
    return _rows(store, target_id, dim=dim, workload_id=workload_id, newest=n)


def sample_before(store: Store, target_id: int, before_id: int, n: int, *, dim: int,
                  seed: int = 0) -> TrainingRows:
    """About `n` training rows of the target picked at random among records up to `before_id`
    (by random ids: index lookups, no scan of the table)."""
    if n <= 0 or before_id <= 0:
        return _rows(store, target_id, dim=dim, limit=0)
    rng = np.random.default_rng(seed)
    ids = sorted({int(i) for i in rng.integers(1, before_id + 1, size=min(before_id, 4 * n))})
    q = (select(m.Record.id, m.Record.workload_id, m.Record.features, m.Record.median_s,
                m.Record.invalidity)
         .where(m.Record.id.in_(ids), m.Record.target_id == target_id,
                m.Record.features.is_not(None), m.Record.invalidity != _LOST))
    return _convert(_fetch(store, q, dim)[:n], dim)


def workload_best(store: Store, target_id: int, workload_ids: list[int]) -> dict[int, float]:
    """The best valid median of each workload on the target (over all its records)."""
    if not workload_ids:
        return {}
    with store.session() as s:
        rows = s.execute(
            select(m.Record.workload_id, func.min(m.Record.median_s))
            .where(m.Record.target_id == target_id,
                   m.Record.workload_id.in_(sorted(set(workload_ids))),
                   m.Record.invalidity == Invalidity.OK.value, m.Record.median_s > 0)
            .group_by(m.Record.workload_id))
        return {int(w): float(b) for w, b in rows if b is not None}


def space_relatives(store: Store, target_id: int, space: str, *, exclude: int, flops: float,
                    limit: int) -> list[int]:
    """Up to `limit` other workloads tuned in the space `space` on the target, those of the
    nearest amount of work (`flops`, by ratio) first. Reads the jobs of the space, not the
    records table."""
    with store.session() as s:
        found = [(int(w), int(f or 0)) for w, f in s.execute(
            select(m.Job.workload_id, m.Workload.flops)
            .join(m.Workload, m.Workload.id == m.Job.workload_id)
            .where(m.Job.target_id == target_id, m.Job.space == space,
                   m.Job.workload_id != exclude)
            .group_by(m.Job.workload_id, m.Workload.flops))]

    def distance(f: int) -> float:
        return abs(math.log(f / flops)) if f > 0 and flops > 0 else math.inf

    found.sort(key=lambda wf: (distance(wf[1]), wf[0]))
    return [wid for wid, _ in found[:limit]]


@dataclass(frozen=True)
class ModelStatus:
    target_id: int
    target_json: str
    device_key: str
    records: int  # training rows the target holds now
    model: StoredModel | None  # its latest version
    versions: int


def status(store: Store) -> list[ModelStatus]:
    """Every target with records or a model: its latest model version and how far behind."""
    with store.session() as s:
        counts = {int(t): int(n) for t, n in s.execute(
            select(m.Record.target_id, func.count()).where(
                m.Record.features.is_not(None), m.Record.invalidity != _LOST)
            .group_by(m.Record.target_id))}
        versions = {int(t): int(n) for t, n in s.execute(
            select(m.CostModel.target_id, func.count()).group_by(m.CostModel.target_id))}
        targets = list(s.scalars(select(m.Target).where(
            m.Target.id.in_(set(counts) | set(versions))).order_by(m.Target.id)))
        info = [(t.id, t.target_json, t.device_key) for t in targets]
    return [ModelStatus(tid, tjson, dkey, counts.get(tid, 0), latest(store, tid),
                        versions.get(tid, 0)) for tid, tjson, dkey in info]
