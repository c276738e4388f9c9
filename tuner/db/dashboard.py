"""Read-only queries behind the dashboard (`/ui`): a job's measurements as columns (the live
chart and the records table draw thousands of them, so no traces), and the best record of every
workload on every target with its speed-up over the first candidate measured there."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ..core.importance import knob_importance
from ..core.measurements import Invalidity, gflops
from . import tables as m
from .store import Store

POINT_COLUMNS = ("trial_id", "latency_s", "gflops", "invalidity", "worker", "worker_name",
                 "build_s", "predicted_s", "measured_at")
MAX_POINTS = 100_000  # a job's budget is capped far below this (Settings.max_trials_per_job)


def job_points(store: Store, job_id: str, flops: int) -> dict[str, Any]:
    """The job's records in the order they were stored, one list per column of
    `POINT_COLUMNS` (compact: ~60 bytes a record against ~2 kB with its trace); `knobs`, one
    list per knob name (None where a record does not name it), and `knob_importance`, each
    knob's ω² over the valid records (`tuner.core.importance`)."""
    q = (select(m.Record.trial_id, m.Record.median_s, m.Record.invalidity, m.Record.worker,
                m.Worker.name, m.Record.build_s, m.Record.predicted_s, m.Record.measured_at,
                m.Record.knobs_json)
         .outerjoin(m.Worker, m.Worker.id == m.Record.worker)
         .where(m.Record.job_id == job_id).order_by(m.Record.id).limit(MAX_POINTS))
    cols: dict[str, Any] = {c: [] for c in POINT_COLUMNS}
    named: list[dict[str, Any]] = []
    with store.session() as s:
        for trial_id, median_s, invalidity, worker, name, build_s, predicted_s, at, knobs in \
                s.execute(q):
            named.append(json.loads(knobs or "{}"))
            cols["trial_id"].append(trial_id)
            cols["latency_s"].append(median_s)
            cols["gflops"].append(gflops(flops, median_s))
            cols["invalidity"].append(invalidity)
            cols["worker"].append(worker)
            cols["worker_name"].append(name)  # None: not a registered worker (an RPC board)
            cols["build_s"].append(build_s)
            cols["predicted_s"].append(predicted_s)
            cols["measured_at"].append(at.isoformat())
    names = list(dict.fromkeys(n for k in named for n in k))
    cols["knobs"] = {n: [k.get(n) for k in named] for n in names}
    cols["knob_importance"] = knob_importance(
        cols["knobs"], cols["latency_s"], [i == Invalidity.OK.value for i in cols["invalidity"]])
    return cols


def points_csv(points: dict[str, Any]) -> str:
    """`job_points` as CSV: its columns, then one per knob (lists as JSON). A text cell that a
    spreadsheet would read as a formula (=, +, -, @ first) gets a leading apostrophe."""
    knobs: dict[str, list[Any]] = points["knobs"]
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow([*POINT_COLUMNS, *knobs])

    def cell(v: object) -> object:
        if isinstance(v, list):
            return json.dumps(v)
        if isinstance(v, str) and v[:1] in ("=", "+", "-", "@", "\t", "\r"):
            return "'" + v
        return "" if v is None else v

    for i in range(len(points["trial_id"])):
        w.writerow([cell(points[c][i]) for c in POINT_COLUMNS]
                   + [cell(col[i]) for col in knobs.values()])
    return out.getvalue()


@dataclass(frozen=True)
class BestRow:
    """The best valid record of a workload on a target (and device key)."""

    workload_key: str
    op: str
    description: str
    target: dict[str, Any]
    device_key: str
    records: int  # measured there, valid or not
    valid: int
    best_s: float
    best_gflops: float | None
    best_trial_id: str
    first_s: float  # the first valid candidate measured there
    speedup: float  # first_s / best_s
    last_measured_at: str
    task_names: tuple[str, ...] = ()  # of the model tasks with this PrimFunc (`best_table`)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


MAX_TASK_NAMES = 3  # per row: a PrimFunc met in many models is named by its first few tasks


def best_table(store: Store, *, limit: int = 200, op: str | None = None,
               names_of: str | None = None, every_owner: bool = False) -> list[BestRow]:
    """Workload × target pairs with a best that may be served (`Store.best(served=True)`: a
    worker's record once confirmed, at its confirmed latency), most recently measured first.
    A row of a model's PrimFunc is named by its tasks in the model jobs of owner `names_of`
    (of every owner with `every_owner`; unnamed with neither): names are the owner's, like jobs."""
    ok = Invalidity.OK.value
    r = m.Record
    served = (r.invalidity == ok) & r.trust.in_(m.SERVED_TRUST)
    latency = func.coalesce(r.confirmed_s, r.median_s)
    candidate = r.trust != m.Trust.CONFIRMATION.value  # a confirmation measured one again
    groups = (select(r.workload_id, r.target_id, func.count().filter(candidate).label("n"),
                     func.count().filter((r.invalidity == ok) & candidate).label("valid"),
                     func.min(r.id).filter((r.invalidity == ok) & candidate).label("first_id"),
                     func.min(latency).filter(served).label("best_s"),
                     func.max(r.measured_at).label("last"))
              .group_by(r.workload_id, r.target_id)
              .having(func.min(latency).filter(served).is_not(None)))
    if op is not None:
        groups = groups.where(r.workload_id.in_(select(m.Workload.id).where(m.Workload.op == op)))
    groups = groups.order_by(func.max(r.measured_at).desc()).limit(limit)
    out: list[BestRow] = []
    with store.session() as s:
        rows = s.execute(groups).all()
        if not rows:
            return out
        wids = {row.workload_id for row in rows}
        tids = {row.target_id for row in rows}
        firsts = {row.first_id for row in rows}
        workloads = {w.id: w for w in s.scalars(select(m.Workload).where(m.Workload.id.in_(wids)))}
        targets = {t.id: t for t in s.scalars(select(m.Target).where(m.Target.id.in_(tids)))}
        first_s = {i: v for i, v in s.execute(select(r.id, r.median_s).where(r.id.in_(firsts)))}
        names = _task_names(s, wids, names_of, every_owner)
        best_of = {(row.workload_id, row.target_id): row.best_s for row in rows}
        best_ids: dict[tuple[int, int], str] = {}
        for wid, tid, median_s, trial_id in s.execute(
                select(r.workload_id, r.target_id, latency, r.trial_id)
                .where(served, r.workload_id.in_(wids), r.target_id.in_(tids),
                       latency.in_(set(best_of.values())))
                .order_by(r.id)):
            if best_of.get((wid, tid)) == median_s:
                best_ids.setdefault((wid, tid), trial_id)
        for row in rows:
            w, t = workloads[row.workload_id], targets[row.target_id]
            best_s = float(row.best_s)
            first = float(first_s.get(row.first_id) or best_s)
            out.append(BestRow(
                workload_key=w.key, op=w.op, description=w.description,
                target=json.loads(t.target_json), device_key=t.device_key, records=int(row.n),
                valid=int(row.valid or 0), best_s=best_s, best_gflops=gflops(w.flops, best_s),
                best_trial_id=best_ids.get((row.workload_id, row.target_id), ""),
                first_s=first, speedup=first / best_s, last_measured_at=row.last.isoformat(),
                task_names=names.get(row.workload_id, ())))
    return out


def _task_names(s: Session, wids: set[int], owner: str | None,
                every_owner: bool) -> dict[int, tuple[str, ...]]:
    if owner is None and not every_owner:
        return {}
    q = (select(m.ModelTask.workload_id, m.ModelTask.name).distinct()
         .where(m.ModelTask.workload_id.in_(wids)))
    if not every_owner:
        q = q.join(m.ModelJob, m.ModelJob.id == m.ModelTask.model_id).where(
            m.ModelJob.owner == owner)
    found: dict[int, list[str]] = {}
    for wid, name in s.execute(q.order_by(m.ModelTask.workload_id, m.ModelTask.name)):
        found.setdefault(wid, []).append(name)
    return {wid: tuple(ns[:MAX_TASK_NAMES]) for wid, ns in found.items()}
