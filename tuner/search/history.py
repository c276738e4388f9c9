"""What a search starts from: the tuning database's history of the workload on the target. The
fastest records of the space seed the evolutionary search's population; every record measured on
the target (any workload) trains the cost model before the first batch."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from schedules.registry import replay
from tuner import tvm_api as tv
from tuner.db.rows import RecordRow, TargetRef
from tuner.db.store import Store
from tuner.measure import Invalidity
from tuner.search.costmodel import XGBCostModel

log = logging.getLogger(__name__)


def seed_database(store: Store, wid: int, tref: TargetRef, mod: Any, target: Any, space: str,
                  top_k: int) -> Any:
    """A MetaSchedule MemoryDatabase holding the `top_k` fastest records of this workload and
    space on this target, for the search's initial population."""
    db = tv.ms.database.MemoryDatabase()
    token = db.commit_workload(mod)
    args_info = tv.ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    for row in seed_records(store, wid, tref, space, top_k):
        try:
            sch = replay(mod, row.trace_json)
        except Exception as exc:  # a trace from another TVM version: skip it
            log.debug("record %s does not replay here: %s", row.trial_id, exc)
            continue
        db.commit_tuning_record(tv.ms.database.TuningRecord(
            trace=sch.trace, workload=token, run_secs=[row.median_s], target=target,
            args_info=args_info))
    return db


def seed_records(store: Store, wid: int, tref: TargetRef, space: str,
                 top_k: int) -> list[RecordRow]:
    """The `top_k` fastest valid records of this space. A trace of another space never seeds the
    search: its mutators expect this space's instructions (MetaSchedule fails inside
    `generate_measure_candidates` on one)."""
    limit = top_k
    while True:
        rows = store.best(wid, tref.id, k=limit)
        mine = [r for r in rows if r.space == space]
        if len(mine) >= top_k or len(rows) < limit:
            return mine[:top_k]
        limit *= 4


def trained_cost_model(store: Store, tref: TargetRef, seed: int) -> XGBCostModel:
    """An XGBoost cost model trained on every record measured on the target (grouped by
    workload); untrained when the target has no history."""
    model = XGBCostModel(seed=seed)
    for wid, feats, median_s, inv in store.training_rows(tref.id):
        x = np.frombuffer(feats, dtype=np.float32)
        if x.size == model.features_dim:
            model.add(x[None, :], [median_s if inv == Invalidity.OK else None], group=wid)
    model.fit()
    return model
