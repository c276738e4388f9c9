"""What a search starts from: the tuning database's history of the workload on the target. The
fastest records of the space seed the evolutionary search's population; the cost model starts
from the farm's model of the target (`tuner.search.farm_model`) and the workload's own records."""

from __future__ import annotations

import logging
from typing import cast

from schedules.registry import replay
from tuner.core import tvm_api as tv
from tuner.core.config import get_settings
from tuner.db import cost_models
from tuner.db.rows import RecordRow, TargetRef
from tuner.db.store import Store
from tuner.search import farm_model
from tuner.search.costmodel import FEATURE_DIM, XGBCostModel

log = logging.getLogger(__name__)


def seed_database(store: Store, wid: int, tref: TargetRef, mod: tv.IRModule, target: tv.Target,
                  space: str, top_k: int) -> tv.ms.database.MemoryDatabase:
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
            # a replayed schedule is traced; `seed_records` gives valid records: with a median
            trace=cast(tv.Trace, sch.trace), workload=token, run_secs=[cast(float, row.median_s)],
            target=target,
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


JOB_HISTORY_ROWS = 256  # of the workload's newest records, in the job's own model


def trained_cost_model(store: Store, tref: TargetRef, wid: int, seed: int,
                       cfg: farm_model.FarmModelConfig = farm_model.DEFAULT) -> XGBCostModel:
    """The cost model a job on workload `wid` starts from: the farm's model of the target
    (trained now, once, if the target has records but no model yet), and the job's own booster
    fitted on the workload's newest records. Untrained when the target has no history."""
    base, stored = None, None
    if get_settings().emulated(tref.device_key):  # emulation's latencies train no model
        return XGBCostModel(seed=seed, objective=cfg.objective)
    if get_settings().cost_model_transfer:
        base, stored = farm_model.load(store, tref)
        if base is None:
            stored = farm_model.refresh(store, tref, full=True, cfg=cfg)
            base = farm_model.booster_of(stored) if stored is not None else None
    model = XGBCostModel(seed=seed, base=base,
                         objective=stored.objective if stored is not None else cfg.objective)
    rows = cost_models.workload_rows(store, tref.id, wid, JOB_HISTORY_ROWS, dim=FEATURE_DIM)
    if len(rows):
        model.add(rows.features, rows.latencies(), group=wid)
        model.fit()
    return model
