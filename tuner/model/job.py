"""A model job on the embedded engine: one trial budget spread over a model's tasks.

Each task is an ordinary `tir` workload tuned through the one job path (`tuner.search.Tuner`,
which resumes the latest job of the same workload, target and space), one round of
`round_trials` at a time, in the order `GradientScheduler` picks. The budget counts every trial
the tasks' jobs hold: run the same command again after an interruption and it goes on where it
stopped; tasks already tuned on this target start with what they have.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from schedules.registry import resolve

from ..db.engine import target_key
from ..db.jobs import LOCAL_OWNER, job_key
from ..db.store import Store
from ..measure import Invalidity, MeasureOptions, Measurer
from ..search import Tuner, TuneRequest
from ..tvm_api import canonical_target_json, make_target
from ..workloads import Workload, parse_spec
from .pipeline import ModelTask
from .scheduler import GradientScheduler


@dataclass(frozen=True)
class ModelRequest:
    tasks: list[ModelTask]
    target: dict[str, Any]
    trials: int  # for the whole model
    device_key: str = "local"
    space: str = "default"
    round_trials: int = 16  # trials per round (one task)
    batch_size: int = 16
    seed: int = 0
    options: MeasureOptions = field(default_factory=MeasureOptions)
    wall_budget_s: float | None = None  # no new round starts after this long


@dataclass(frozen=True)
class TaskProgress:
    name: str
    weight: int
    workload_key: str
    trials: int
    best_s: float | None


@dataclass(frozen=True)
class ModelProgress:
    trials: int  # spent, all tasks
    total: int
    estimate_s: float | None  # Σ weight × best latency (None: a task has no valid record yet)
    tasks: list[TaskProgress]
    message: str = ""


@dataclass(frozen=True)
class ModelSummary:
    trials: int
    rounds: int
    first_estimate_s: float | None
    estimate_s: float | None
    wall_s: float
    stop_reason: str
    tasks: list[TaskProgress]


class ModelTuner:
    """Tunes a model's tasks with one `Measurer` (the embedded engine's, here)."""

    def __init__(self, store: Store, measurer: Measurer, *,
                 on_progress: Callable[[ModelProgress], None] | None = None) -> None:
        self.store, self.measurer = store, measurer
        self.on_progress = on_progress or (lambda _p: None)

    def run(self, req: ModelRequest) -> ModelSummary:
        t0 = time.monotonic()
        target = make_target(req.target)
        workloads = [parse_spec({"op": "tir", "tvmscript": t.func.script()}) for t in req.tasks]
        warm = [self._held(req, wl, target) for wl in workloads]
        sched = GradientScheduler([t.weight for t in req.tasks], warm=warm)
        first = sched.estimate_s()
        tuner = Tuner(self.store, self.measurer)
        rounds, stop = 0, "budget spent"
        self._report(req, workloads, sched, "starting")
        while True:
            spent = sum(t.trials for t in sched.tasks)
            if spent >= req.trials:
                break
            if req.wall_budget_s is not None and time.monotonic() - t0 >= req.wall_budget_s:
                stop = "wall-clock budget reached"
                break
            i = sched.pick()
            if i is None:
                stop = "every task's space is exhausted"
                break
            task = sched.tasks[i]
            step = min(req.round_trials, req.trials - spent)
            summary = tuner.run(TuneRequest(
                workload=workloads[i], target=req.target, trials=task.trials + step,
                device_key=req.device_key, space=req.space, batch_size=req.batch_size,
                seed=req.seed, options=req.options))
            gained = summary.trials_done - task.trials
            sched.update(i, summary.trials_done, summary.best_s,
                         exhausted=gained <= 0 or summary.trials_done < task.trials + step)
            rounds += 1
            if first is None:
                first = sched.estimate_s()
            self._report(req, workloads, sched,
                         f"{req.tasks[i].name}: +{gained} trials ({summary.stop_reason})")
        return ModelSummary(sum(t.trials for t in sched.tasks), rounds, first,
                            sched.estimate_s(), time.monotonic() - t0, stop,
                            self._tasks(req, workloads, sched))

    def _held(self, req: ModelRequest, wl: Workload, target: Any) -> tuple[int, float | None]:
        """(trials, best latency) the task's job already holds on this target."""
        tref = self.store.target_by_key(target_key(canonical_target_json(target),
                                                   req.device_key))
        row = self.store.workload_by_key(wl.key)
        if tref is None or row is None:
            return 0, None
        job = self.store.latest_job(job_key(wl.key, tref.key, resolve(req.space, wl, target)),
                                    owner=LOCAL_OWNER)
        trials = 0 if job is None else sum(
            1 for r in self.store.records(job_id=job.id) if r.invalidity != Invalidity.WORKER_LOST)
        best = self.store.best(row.id, tref.id, k=1)
        return trials, best[0].median_s if best else None

    def _tasks(self, req: ModelRequest, workloads: list[Workload],
               sched: GradientScheduler) -> list[TaskProgress]:
        return [TaskProgress(t.name, t.weight, wl.key, s.trials, s.best_s)
                for t, wl, s in zip(req.tasks, workloads, sched.tasks, strict=True)]

    def _report(self, req: ModelRequest, workloads: list[Workload], sched: GradientScheduler,
                message: str) -> None:
        self.on_progress(ModelProgress(sum(t.trials for t in sched.tasks), req.trials,
                                       sched.estimate_s(), self._tasks(req, workloads, sched),
                                       message))
