"""The XGBoost cost model: predicts the normalized throughput of a scheduled program from its
features, so the evolutionary search measures what is likely fast.

Features are MetaSchedule's `PerStoreFeature` (164 per buffer store), pooled to a fixed vector
(sum and max over the stores, plus the store count) so records of any workload can train one model
per target. The pooled vector is stored with every record in SQL.

A job's model has two parts: the farm's model of the target (`base`, a booster trained on every
record the farm measured there and updated incrementally: `tuner.search.farm_model`), frozen,
and the job's own booster, refitted after every batch on the rows of this workload only (its
history and the job's measurements), starting from the base model's margin, which counts less
with every row of the job's own (none after `trust_rows`: by then the job knows its workload
better than any other workload can tell). A batch's training costs what the workload holds,
never what the farm holds.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import xgboost as xgb

from tuner.core.tvm_api import derived_object, ms, structural_hash
from tuner.search import observe

log = logging.getLogger(__name__)

RAW_DIM = 164
FEATURE_DIM = 2 * RAW_DIM + 1
FEATURE_CACHE_SIZE = 1 << 14  # pooled vectors kept by program hash (1.3 KB each)
# below this many rows one thread trains faster: 64 rows, 160 rounds took 0.3 s with 1 thread and
# 3.3 s with 2 (OpenMP waiting) on a busy 2-core machine
SMALL_TRAINING_SET = 4096


def pool_features(rows: np.ndarray) -> np.ndarray:
    """(n_stores, 164) -> (329,) float32: signed-log of the sum, the max, and log2 of the count."""
    rows = np.asarray(rows, dtype=np.float64).reshape(-1, RAW_DIM)
    if rows.shape[0] == 0:
        return np.zeros(FEATURE_DIM, dtype=np.float32)
    s = rows.sum(axis=0)
    pooled = np.concatenate([np.sign(s) * np.log2(1.0 + np.abs(s)), rows.max(axis=0),
                             [np.log2(1.0 + rows.shape[0])]])
    return pooled.astype(np.float32)


OBJECTIVES = {"regression": "reg:squarederror", "pairwise": "rank:pairwise",
              "ndcg": "rank:ndcg"}


def xgb_params(objective: str, *, seed: int, nthread: int, light: bool = False
               ) -> dict[str, Any]:
    """XGBoost's parameters; `light`: a job's per-batch booster (shallower trees, coarser
    histograms: its refit after every batch must stay well under a second)."""
    return {"objective": OBJECTIVES[objective], "eta": 0.2, "max_depth": 6 if light else 8,
            "max_bin": 64 if light else 256, "min_child_weight": 1, "subsample": 0.9,
            "colsample_bytree": 0.9, "nthread": nthread, "seed": seed, "verbosity": 0}


def throughput_labels(workload_ids: Sequence[Any], latencies: Sequence[float | None],
                      best: dict[Any, float] | None = None) -> np.ndarray:
    """best latency of the row's workload / its latency (0 for a failure): 1.0 is the fastest.
    `best` (optional) holds bests measured outside these rows."""
    top: dict[Any, float] = defaultdict(lambda: float("inf"))
    top.update(best or {})
    for lat, g in zip(latencies, workload_ids, strict=True):
        if lat is not None and lat > 0:
            top[g] = min(top[g], lat)
    return np.array([0.0 if lat is None or not lat > 0 else top[g] / lat
                     for lat, g in zip(latencies, workload_ids, strict=True)], dtype=np.float32)


def training_matrix(objective: str, x: np.ndarray, y: np.ndarray, groups: np.ndarray,
                    base_margin: np.ndarray | None = None) -> xgb.DMatrix:
    """A DMatrix for `objective`: ranking objectives learn within each workload (query group,
    rows sorted by it) with graded relevance; regression learns the throughput itself."""
    if objective == "regression":
        return xgb.DMatrix(x, label=y, base_margin=base_margin)
    order = np.argsort(groups, kind="stable")
    rel = np.rint(np.clip(y[order], 0.0, 1.0) * 30).astype(np.float32)  # ndcg: 0..30
    return xgb.DMatrix(x[order], label=rel, qid=groups[order],
                       base_margin=None if base_margin is None else base_margin[order])


@derived_object
class XGBCostModel(ms.cost_model.PyCostModel):
    """The farm's model of the target (`base`, frozen) plus the job's own booster on its
    workload's rows (`add`, `fit`), trained from the base model's margin weighted by
    `base_weight`."""

    features_dim = FEATURE_DIM

    def __init__(self, *, seed: int = 0, num_rounds: int = 100, nthread: int = 2,
                 base: xgb.Booster | None = None, objective: str = "regression",
                 trust_rows: int = 48) -> None:
        super().__init__()
        self._extractor = ms.feature_extractor.PerStoreFeature()
        self._rng = np.random.default_rng(seed)
        self._seed = seed
        self._num_rounds = num_rounds
        self._nthread = nthread
        self.base = base
        self.objective = objective
        self.trust_rows = trust_rows
        self._x: list[np.ndarray] = []
        self._lat: list[float | None] = []
        self._group: list[Any] = []
        self._booster: xgb.Booster | None = None
        self._cache: dict[int, np.ndarray] = {}
        self.fit_s = 0.0  # time spent in `fit`, all batches

    # ---- data
    def features(self, context: ms.TuneContext,
                 candidates: Sequence[ms.MeasureCandidate]) -> np.ndarray:
        """Pooled features, one row per candidate. Extraction costs ~10 ms per conv program and
        the evolutionary search scores survivors and repeated mutants again in every iteration
        (then the loop asks again for the picks it measures): programs seen before, by structural
        hash, are not extracted again."""
        if not candidates:
            return np.zeros((0, FEATURE_DIM), dtype=np.float32)
        keys = [structural_hash(c.sch.mod) for c in candidates]
        todo: dict[int, ms.MeasureCandidate] = {}
        for k, c in zip(keys, candidates, strict=True):
            if k not in self._cache:
                todo.setdefault(k, c)
        new = {}
        if todo:
            feats = self._extractor.extract_from(context, list(todo.values()))
            new = {k: pool_features(f.numpy()) for k, f in zip(todo, feats, strict=True)}
        rows = np.stack([new[k] if k in new else self._cache[k] for k in keys])
        if len(self._cache) + len(new) > FEATURE_CACHE_SIZE:
            self._cache.clear()
        self._cache.update(new)
        return rows

    def add(self, x: np.ndarray, latencies: Sequence[float | None], group: int) -> None:
        """Add measured programs: `latencies[i]` is None for a failed one."""
        for row, lat in zip(np.asarray(x, dtype=np.float32).reshape(-1, FEATURE_DIM), latencies,
                            strict=True):
            self._x.append(row)
            self._lat.append(lat if (lat is not None and lat > 0) else None)
            self._group.append(group)

    @property
    def size(self) -> int:
        return len(self._x)

    @property
    def trained(self) -> bool:
        """False while neither the farm's model nor the job's has anything to go on:
        predictions are random numbers until then."""
        return self._booster is not None or self.base is not None

    @property
    def base_weight(self) -> float:
        """How much the farm's model counts beside the job's own rows: fully with none, less
        with each row, not at all from `trust_rows` on (the job's measurements weigh more)."""
        if self.base is None:
            return 0.0
        return max(0.0, 1.0 - len(self._x) / self.trust_rows)

    def _margin(self, x: np.ndarray) -> np.ndarray | None:
        weight = self.base_weight
        if self.base is None or weight <= 0.0:
            return None
        return weight * np.asarray(self.base.predict(xgb.DMatrix(x), output_margin=True),
                                   dtype=np.float32)

    def fit(self) -> None:
        """Refit the job's booster on the job's rows (the base model stays as it is)."""
        t0 = time.perf_counter()
        y = throughput_labels(self._group, self._lat)
        if len(y) < 2 or float(y.max()) <= 0.0:
            self._booster = None
            return
        x = np.stack(self._x)
        groups = np.array([hash(g) for g in self._group], dtype=np.int64)
        dtrain = training_matrix(self.objective, x, y, groups, self._margin(x))
        nthread = 1 if len(y) < SMALL_TRAINING_SET else self._nthread
        params = xgb_params(self.objective, seed=self._seed, nthread=nthread, light=True)
        self._booster = xgb.train(params, dtrain, num_boost_round=self._num_rounds)
        secs = time.perf_counter() - t0
        self.fit_s += secs
        observe.fitted("job", secs)

    def predict_features(self, x: np.ndarray) -> np.ndarray:
        """Scores (larger: faster); for the regression objective, the predicted throughput
        relative to the workload's best."""
        if self._booster is None and self.base is None:
            return self._rng.random(len(x))
        if self._booster is None:
            assert self.base is not None
            out = self.base.predict(xgb.DMatrix(x))
        else:
            out = self._booster.predict(xgb.DMatrix(x, base_margin=self._margin(x)))
        out = np.asarray(out, dtype=np.float64)
        return np.clip(out, 0.0, None) if self.objective == "regression" else out

    def predicted_latency(self, x: np.ndarray, best_s: float | None) -> list[float | None]:
        """Each row's predicted latency: the workload's best so far over the predicted relative
        throughput (regression models only; None before there is a best or a model)."""
        if best_s is None or not self.trained or self.objective != "regression":
            return [None] * len(x)
        return [best_s / float(sc) if sc > 1e-6 else None for sc in self.predict_features(x)]

    # ---- MetaSchedule's CostModel interface (the evolutionary search calls predict)
    def predict(self, context: ms.TuneContext,
                candidates: list[ms.MeasureCandidate]) -> np.ndarray:
        if not self.trained:
            return self._rng.random(len(candidates))
        return self.predict_features(self.features(context, candidates))

    def update(self, context: ms.TuneContext, candidates: list[ms.MeasureCandidate],
               results: list[ms.runner.RunnerResult]) -> None:
        lats = []
        for r in results:
            secs = [float(s) for s in (r.run_secs or [])]
            lats.append(float(np.median(secs)) if secs and r.error_msg is None else None)
        self.add(self.features(context, candidates), lats, group=id(context))
        self.fit()

    def save(self, path: str) -> None:
        if self._booster is not None:
            self._booster.save_model(path)

    def load(self, path: str) -> None:
        self._booster = xgb.Booster()
        self._booster.load_model(path)
