"""The farm's cost model of a target: one XGBoost booster per target (target + device key),
versioned in SQL (`tuner.db.cost_models`), that every job on the target loads at start.

- `load`: the latest version of the target, else of the same target under another device key
  (a new board class of a known CPU starts from its family's model): one row read, whatever
  the size of the database.
- `refresh`: an incremental update from the records stored since the latest version, learnt
  beside `rehearsal` times as many older rows picked at random (the cost of an update follows
  what is new): the current trees' leaf values are refitted, then more trees are added; a full
  refit on the newest
  `max_rows` rows when there is no version yet, when asked (`tunefarm model train --full`) or
  every `full_every` versions (incremental trees pile up). Called by the search loop after each
  job and by `tunefarm model train`; never on a job's per-batch path. Before it learns from new
  rows, the current version is scored on them (they are held out: it never saw them): Kendall
  τ of its ranking within each workload, and whether the measured best is its top-1 / top-5.
- Labels are each record's throughput relative to the best of its workload on the target;
  worker_lost records never train it (`tuner.db.cost_models` leaves them out), a kernel that
  failed to build or run is a throughput of 0.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import xgboost as xgb

from tuner.core.config import get_settings
from tuner.db import cost_models as cm
from tuner.db.rows import TargetRef
from tuner.db.store import Store
from tuner.search import observe
from tuner.search.costmodel import (
    FEATURE_DIM,
    throughput_labels,
    training_matrix,
    xgb_params,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FarmModelConfig:
    objective: str = "regression"
    full_rounds: int = 160
    incremental_rounds: int = 24  # trees one update adds
    min_new: int = 64  # new rows before an update is worth it
    max_rows: int = 200_000  # a full refit learns from the newest this many rows
    max_new: int = 50_000  # an update reads at most this many new rows
    rehearsal: int = 2  # older rows an update learns beside each new one
    full_every: int = 25  # versions; a full refit after this many incremental ones
    nthread: int = 2
    seed: int = 0


DEFAULT = FarmModelConfig()


def booster_of(stored: cm.StoredModel) -> xgb.Booster:
    booster = xgb.Booster()
    booster.load_model(bytearray(stored.booster))
    return booster


def load(store: Store, tref: TargetRef) -> tuple[xgb.Booster | None, cm.StoredModel | None]:
    """The model a job on `tref` starts from: its target's latest version, else its family's;
    (None, None) when the farm has none."""
    stored = cm.latest(store, tref.id) or cm.family_latest(store, tref.id)
    if stored is None or stored.feature_dim != FEATURE_DIM:
        return None, None
    return booster_of(stored), stored


def ranking_metrics(scores: np.ndarray, y: np.ndarray, groups: np.ndarray) -> dict[str, Any]:
    """How well `scores` rank the measured throughput `y` within each group (workload) with at
    least two valid rows: mean Kendall τ, and the share of groups whose measured best is the
    top-1 / among the top-5 scored."""
    taus, top1, top5 = [], [], []
    for g in np.unique(groups):
        idx = np.flatnonzero(groups == g)
        if np.count_nonzero(y[idx] > 0) < 2:
            continue
        s, t = scores[idx], y[idx]
        taus.append(kendall_tau(s, t))
        order = np.argsort(-s, kind="stable")
        best = int(np.argmax(t))
        top1.append(best in order[:1])
        top5.append(best in order[:5])
    if not taus:
        return {}
    return {"kendall_tau": float(np.mean(taus)), "top1": float(np.mean(top1)),
            "top5": float(np.mean(top5)), "workloads": len(taus), "rows": len(y)}


def kendall_tau(a: np.ndarray, b: np.ndarray) -> float:
    """Kendall's τ-b of two score vectors (O(n²): held-out groups are small)."""
    da = np.sign(a[:, None] - a[None, :])
    db = np.sign(b[:, None] - b[None, :])
    upper = np.triu_indices(len(a), k=1)
    x, y = da[upper], db[upper]
    n_a, n_b = np.count_nonzero(x), np.count_nonzero(y)
    if n_a == 0 or n_b == 0:
        return 0.0
    return float(np.sum(x * y) / np.sqrt(float(n_a) * float(n_b)))


def labels(store: Store, tref: TargetRef, rows: cm.TrainingRows) -> np.ndarray:
    """Each row's throughput relative to the best of its workload on the target (all records)."""
    wids = [int(w) for w in rows.workload_ids]
    return throughput_labels(wids, rows.latencies(), cm.workload_best(store, tref.id, wids))


def train(rows: cm.TrainingRows, y: np.ndarray, cfg: FarmModelConfig, *,
          prev: xgb.Booster | None = None) -> xgb.Booster:
    """A new booster for `rows`, or `prev` updated with them: its trees' leaf values refitted
    on `rows` (XGBoost's refresh updater: the structure learnt before stays, its outputs follow
    the data), then `incremental_rounds` more trees."""
    t0 = time.perf_counter()
    dtrain = training_matrix(cfg.objective, rows.features, y, rows.workload_ids)
    params = xgb_params(cfg.objective, seed=cfg.seed, nthread=1 if len(y) < 4096 else cfg.nthread)
    if prev is None:
        booster = xgb.train(params, dtrain, num_boost_round=cfg.full_rounds)
    else:
        refreshed = xgb.train({**params, "process_type": "update", "updater": "refresh",
                               "refresh_leaf": True}, dtrain,
                              num_boost_round=prev.num_boosted_rounds(), xgb_model=prev)
        booster = xgb.train(params, dtrain, num_boost_round=cfg.incremental_rounds,
                            xgb_model=refreshed)
    observe.fitted("farm", time.perf_counter() - t0)
    return booster


def refresh(store: Store, tref: TargetRef, *, full: bool = False,
            cfg: FarmModelConfig = DEFAULT) -> cm.StoredModel | None:
    """Bring the target's model up to date (see the module doc); the new version, or None when
    there was nothing (enough) to learn or another process stored that version first."""
    if get_settings().emulated(tref.device_key):  # emulation's latencies train no model
        return None
    t0 = time.perf_counter()
    prev = cm.latest(store, tref.id)
    if prev is not None and (prev.objective != cfg.objective
                             or prev.feature_dim != FEATURE_DIM):
        full = True  # a model of other labels or features: start over
    if prev is not None and not full and prev.version % cfg.full_every == 0:
        full = True
    metrics: dict[str, Any] = {}
    if full or prev is None:
        rows = cm.newest_rows(store, tref.id, cfg.max_rows, dim=FEATURE_DIM)
        if len(rows) < 2:
            return None
        y = labels(store, tref, rows)
        if float(y.max()) <= 0.0:
            return None
        booster, learned = train(rows, y, cfg), len(rows)
    else:
        rows = cm.rows_after(store, tref.id, prev.last_record_id, dim=FEATURE_DIM,
                             limit=cfg.max_new)
        if len(rows) < cfg.min_new:
            return None
        y = labels(store, tref, rows)
        old = booster_of(prev)
        metrics = ranking_metrics(np.asarray(old.predict(xgb.DMatrix(rows.features))), y,
                                  rows.workload_ids)
        # the new trees learn the new rows beside as many older ones (rehearsal: without them
        # they would fit the new workloads at the old ones' expense)
        older = cm.sample_before(store, tref.id, prev.last_record_id,
                                 cfg.rehearsal * len(rows), dim=FEATURE_DIM, seed=prev.version)
        both = older + rows
        booster = train(both, labels(store, tref, both), cfg, prev=old)
        learned = prev.rows + len(rows)
    version = 1 if prev is None else prev.version + 1
    saved = cm.save(store, target_id=tref.id, version=version, objective=cfg.objective,
                    feature_dim=FEATURE_DIM, rows=learned,
                    last_record_id=int(rows.ids.max()), full=full or prev is None,
                    booster=bytes(booster.save_raw("ubj")), metrics=metrics,
                    train_s=time.perf_counter() - t0)
    if saved is not None:
        log.info("cost model of target %s: version %d (%s, %d rows, %.2f s) %s", tref.key,
                 version, "full" if saved.full else "incremental", len(rows), saved.train_s,
                 metrics)
    return saved


def refresh_after_job(store: Store, tref: TargetRef) -> None:
    """What the search loop does after a job: an incremental update (a failure is logged, never
    the job's)."""
    try:
        refresh(store, tref)
    except Exception:
        log.exception("cannot update the cost model of target %s", tref.key)
