"""The SQL behind `TunefarmDatabase` (`tuner.interop.ms_database`): records as MetaSchedule's
`Database` interface sees them, scoped by target or device key and ranked by the mean or the
median run time, and workload hashes under MetaSchedule's module equalities.

A record is valid here when its invalidity is "ok" and it has the ranking statistic: records
committed through MetaSchedule are marked ok exactly when TVM's `TuningRecord.IsValid` holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, TypeVarTuple

from sqlalchemy import Select, func, select

from ..core.measurements import Invalidity
from . import tables as m
from .rows import RecordRow, WorkloadRow
from .store import Store

Ranking = Literal["mean", "median"]
RANKINGS: tuple[Ranking, ...] = ("mean", "median")
_Ts = TypeVarTuple("_Ts")


def _scoped(q: Select[*_Ts], *, workload_ids: Sequence[int] | None,
            target_id: int | None, device_key: str | None) -> Select[*_Ts]:
    if workload_ids is not None:
        q = q.where(m.Record.workload_id.in_(list(workload_ids)))
    if target_id is not None:
        q = q.where(m.Record.target_id == target_id)
    elif device_key is not None:
        q = q.where(m.Record.target_id.in_(
            select(m.Target.id).where(m.Target.device_key == device_key)))
    return q


def scoped_records(store: Store, *, workload_ids: Sequence[int] | None = None,
                   target_id: int | None = None, device_key: str | None = None,
                   ranking: Ranking | None = None, limit: int | None = None) -> list[RecordRow]:
    """Records of these workloads (all with None) on one target, else on every target of one
    device key (every target with None). With `ranking`: only valid records a best may be
    served from (`models.SERVED_TRUST`: a worker's record once confirmed), fastest first by
    that statistic (ties in commit order); without: every record in commit order."""
    q = _scoped(select(m.Record), workload_ids=workload_ids, target_id=target_id,
                device_key=device_key)
    if ranking is not None:
        col = m.Record.mean_s if ranking == "mean" else m.Record.median_s
        q = (q.where(m.Record.invalidity == Invalidity.OK.value, col.is_not(None),
                     m.Record.trust.in_(m.SERVED_TRUST))
             .order_by(col.asc(), m.Record.id))
    else:
        q = q.order_by(m.Record.id)
    if limit is not None:
        q = q.limit(int(limit))
    with store.session() as s:
        return [RecordRow.of(r) for r in s.scalars(q)]


def count_scoped(store: Store, *, target_id: int | None = None,
                 device_key: str | None = None) -> int:
    """How many records (valid or not) `scoped_records` would list without a ranking."""
    q = _scoped(select(func.count()).select_from(m.Record), workload_ids=None,
                target_id=target_id, device_key=device_key)
    with store.session() as s:
        return int(s.scalar(q) or 0)


def workloads_with_hash(store: Store, mode: str, h: str) -> list[WorkloadRow]:
    """The workloads whose hash under module equality `mode` is `h`, oldest first."""
    q = (select(m.Workload).join(m.WorkloadHash, m.WorkloadHash.workload_id == m.Workload.id)
         .where(m.WorkloadHash.mode == mode, m.WorkloadHash.hash == h).order_by(m.Workload.id))
    with store.session() as s:
        return [WorkloadRow.of(r) for r in s.scalars(q)]


def unhashed_workloads(store: Store, mode: str, limit: int = 200) -> list[WorkloadRow]:
    """Workloads that have no hash under `mode` yet (at most `limit`, oldest first)."""
    hashed = select(m.WorkloadHash.workload_id).where(m.WorkloadHash.mode == mode)
    q = (select(m.Workload).where(m.Workload.id.not_in(hashed)).order_by(m.Workload.id)
         .limit(limit))
    with store.session() as s:
        return [WorkloadRow.of(r) for r in s.scalars(q)]


def put_hashes(store: Store, mode: str, hashes: Mapping[int, str]) -> None:
    """Store workloads' hashes under `mode` (a hash already stored is kept: it cannot differ)."""
    if not hashes:
        return
    if store.dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert  # type: ignore[assignment]
    values = [{"workload_id": wid, "mode": mode, "hash": h} for wid, h in hashes.items()]
    with store.session() as s:
        s.execute(insert(m.WorkloadHash).values(values)
                  .on_conflict_do_nothing(index_elements=["workload_id", "mode"]))
