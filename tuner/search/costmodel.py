"""The XGBoost cost model: predicts the normalized throughput of a scheduled program from its
features, so the evolutionary search measures what is likely fast.

Features are MetaSchedule's `PerStoreFeature` (164 per buffer store), pooled to a fixed vector
(sum and max over the stores, plus the store count) so records of any workload can train one model
per target. The pooled vector is stored with every record in SQL: a new job for any shape or op on
the same target starts from a model trained on everything the farm measured there, instead of
MetaSchedule's 100 random samples of warm-up.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import xgboost as xgb

from tuner.tvm_api import derived_object, ms, structural_hash

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


@derived_object
class XGBCostModel(ms.cost_model.PyCostModel):
    """Regression on min-latency / latency within each workload (failures count as 0)."""

    features_dim = FEATURE_DIM

    def __init__(self, *, seed: int = 0, num_rounds: int = 160, nthread: int = 2) -> None:
        super().__init__()
        self._extractor = ms.feature_extractor.PerStoreFeature()
        self._rng = np.random.default_rng(seed)
        self._seed = seed
        self._num_rounds = num_rounds
        self._nthread = nthread
        self._x: list[np.ndarray] = []
        self._lat: list[float | None] = []
        self._group: list[Any] = []
        self._booster: xgb.Booster | None = None
        self._cache: dict[int, np.ndarray] = {}

    # ---- data
    def features(self, context: Any, candidates: Sequence[Any]) -> np.ndarray:
        """Pooled features, one row per candidate. Extraction costs ~10 ms per conv program and
        the evolutionary search scores survivors and repeated mutants again in every iteration
        (then the loop asks again for the picks it measures): programs seen before, by structural
        hash, are not extracted again."""
        if not candidates:
            return np.zeros((0, FEATURE_DIM), dtype=np.float32)
        keys = [structural_hash(c.sch.mod) for c in candidates]
        todo: dict[int, Any] = {}
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

    def add(self, x: np.ndarray, latencies: Sequence[float | None], group: Any) -> None:
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
        """False until `fit` had data to learn from: predictions are random numbers until then."""
        return self._booster is not None

    def _targets(self) -> np.ndarray:
        best: dict[Any, float] = defaultdict(lambda: float("inf"))
        for lat, g in zip(self._lat, self._group, strict=True):
            if lat is not None:
                best[g] = min(best[g], lat)
        return np.array([0.0 if lat is None else best[g] / lat
                         for lat, g in zip(self._lat, self._group, strict=True)], dtype=np.float32)

    def fit(self) -> None:
        y = self._targets()
        if len(y) < 2 or float(y.max()) <= 0.0:
            self._booster = None
            return
        dtrain = xgb.DMatrix(np.stack(self._x), label=y)
        params = {"objective": "reg:squarederror", "eta": 0.2, "max_depth": 8,
                  "min_child_weight": 1, "subsample": 0.9, "colsample_bytree": 0.9,
                  "nthread": 1 if len(y) < SMALL_TRAINING_SET else self._nthread,
                  "seed": self._seed, "verbosity": 0}
        self._booster = xgb.train(params, dtrain, num_boost_round=self._num_rounds)

    def predict_features(self, x: np.ndarray) -> np.ndarray:
        if self._booster is None:
            return self._rng.random(len(x))
        return np.clip(self._booster.predict(xgb.DMatrix(x)), 0.0, None).astype(np.float64)

    # ---- MetaSchedule's CostModel interface (the evolutionary search calls predict)
    def predict(self, context: Any, candidates: list[Any]) -> np.ndarray:
        if self._booster is None:
            return self._rng.random(len(candidates))
        return self.predict_features(self.features(context, candidates))

    def update(self, context: Any, candidates: list[Any], results: list[Any]) -> None:
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
