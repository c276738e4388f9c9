"""Tuning curves: the best latency found so far against trials and against wall time, for
tunefarm and MetaSchedule, written into the run's JSON for `python -m bench report`.

A point is `[trials, wall_s, latency_s]`: after `trials` measured candidates and `wall_s` seconds
of tuning, the best latency so far. For a model the latency is the tuner's estimate of the
whole model, Σ weight × best latency of each task (None until every task has a valid
candidate), which is what both tuners minimise; the timed build is the figure to compare, the
curve shows how each tuner got there.

- tunefarm, one workload: read back from its database (records in commit order, each stamped);
  a model: the progress reports of `ModelTuner` (one per trial).
- MetaSchedule: `Stamps`, a measure callback added to MetaSchedule's default ones, stamps each
  batch with its wall time and its candidates' mean latency (MetaSchedule's ranking), and each
  task's weight from the task scheduler. The stamp is when the task scheduler takes the batch's
  results in (`JoinRunningTask`), which is when MetaSchedule's search learns them: with one
  batch per task (32 trials per task at 32 per iteration) that is at the end of the tuning.
"""

from __future__ import annotations

import math
import sqlite3
import time
from pathlib import Path
from typing import Any

Point = list[float | None]  # [trials, wall_s, latency_s or None]
INVALID_S = 1e9  # MetaSchedule records a failed candidate with run_secs 1e10


def best_so_far(batches: list[tuple[float, int, float, list[float]]],
                n_tasks: int | None = None) -> list[Point]:
    """Points from batches `(wall_s, task, weight, latencies)` in the order their results came
    back: one point per batch (its candidates were measured together), after it, the Σ weight ×
    best of each task, None until every task (`n_tasks`; default: every task seen so far) has a
    valid candidate: a sum over some of a model's tasks is no estimate of the model. A failed
    candidate's latency is `inf`."""
    best: dict[int, float] = {}
    weights: dict[int, float] = {}
    points: list[Point] = []
    n = 0
    for wall, task, weight, lats in batches:
        weights[task] = weight
        n += len(lats)
        for lat in lats:
            if math.isfinite(lat) and lat < best.get(task, math.inf):
                best[task] = lat
        known = len(best) == max(len(weights), n_tasks or 0)
        points.append([n, wall, sum(weights[t] * best[t] for t in weights) if known else None])
    return points


def tunefarm_db_curve(db: Path) -> list[Point]:
    """One workload's curve from tunefarm's SQLite database (`bench.tune.tune_tunefarm`):
    confirmations (`confirms`) are not trials."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT median_s, invalidity, created_at FROM records "
                           "WHERE confirms IS NULL ORDER BY id").fetchall()
    finally:
        con.close()
    if not rows:
        return []
    t0 = _stamp(rows[0][2])
    return best_so_far([(_stamp(at) - t0, 0, 1.0,
                         [med if ok == "ok" and med is not None else math.inf])
                        for med, ok, at in rows])


def _stamp(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(str(text)).timestamp()


def stamps() -> Any:
    """A MetaSchedule measure callback that keeps `(wall_s, task, weight, latencies)` per batch
    in its `batches` (wall time from its creation); pass `[*MeasureCallback.create("default"),
    cb]` as `measure_callbacks`, which keeps MetaSchedule's own callbacks (database, cost
    model, artifacts)."""
    from tvm.ir.utils import derived_object

    from tuner.core.tvm_api import ms

    @derived_object
    class Stamps(ms.measure_callback.PyMeasureCallback):
        def __init__(self) -> None:
            self.t0 = time.monotonic()
            self.batches: list[tuple[float, int, float, list[float]]] = []
            self.n_tasks = 0

        def apply(self, task_scheduler: Any, task_id: int, measure_candidates: Any,
                  builder_results: Any, runner_results: Any) -> None:
            try:
                weight = float(task_scheduler.tasks_[task_id].task_weight)
                self.n_tasks = len(task_scheduler.tasks_)
            except (AttributeError, IndexError):
                weight = 1.0
            lats = []
            for b, r in zip(builder_results, runner_results, strict=False):
                secs = [float(x) for x in (r.run_secs or [])]
                mean = sum(secs) / len(secs) if secs else math.inf
                bad = b.error_msg is not None or r.error_msg is not None or mean >= INVALID_S
                lats.append(math.inf if bad else mean)
            self.batches.append((time.monotonic() - self.t0, int(task_id), weight, lats))

    return Stamps()


def callbacks(cb: Any) -> list[Any]:
    """MetaSchedule's default measure callbacks and `cb`."""
    from tuner.core.tvm_api import ms

    return [*ms.measure_callback.MeasureCallback.create("default"), cb]
