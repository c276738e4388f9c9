"""A model job on the embedded engine: one trial budget spread over a model's tasks.

The model job and its task jobs are stored like the service's (`tuner.db.model_jobs`, owner
`LOCAL_OWNER`), and its rounds are planned the same way (`tuner.model.rounds.gradient_plan`);
here this process runs each round's task job itself through the one job path
(`tuner.search.Tuner`). Run the same command again after an interruption and it goes on where
it stopped: the latest model job of the same tasks, target and space is resumed (its budget set
to the new `trials`), a round cut short goes on from its committed records. Tasks already tuned
on this target start from what they have.

A task never ends the model job: a task the `tir` checks refuse (`vet_tasks`) is left out of it
with its reason, and a task job that fails is recorded FAILED with its error, and the other tasks
go on; the summary lists both (`ModelSummary.untuned`), and `build` gives them relax's default
loops.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from ..core.errors import JobHandedOff, TunefarmError
from ..db import model_jobs
from ..db.jobs import LOCAL_OWNER, JobOptions
from ..db.store import Store
from ..measure import MeasureOptions, Measurer
from ..search import Progress, Tuner, TuneRequest
from ..search.task import CanonicalTarget, ResolvedTask, TaskResolver
from ..workloads import Workload, parse_spec, prime_parser
from .pipeline import ModelTask
from .rounds import gradient_plan

_log = logging.getLogger(__name__)


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
    name: str = "model"
    max_trials_per_task: int | None = None  # no task gets more (None: the scheduler decides)


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
class Untuned:
    """A task without a tuned schedule, and why (the build gives it relax's default loops)."""

    name: str
    weight: int
    reason: str


@dataclass(frozen=True)
class ModelSummary:
    model_id: str  # "" when no task could be tuned
    trials: int
    rounds: int
    first_estimate_s: float | None
    estimate_s: float | None
    wall_s: float
    stop_reason: str
    tasks: list[TaskProgress]
    untuned: list[Untuned] = field(default_factory=list)


def vet_tasks(tasks: list[ModelTask]) -> tuple[list[ModelTask], list[Workload], list[Untuned]]:
    """(the tasks the `tir` checks accept, their PrimFuncs as `tir` workloads (what the service
    is sent), the others with the reason)."""
    kept: list[ModelTask] = []
    workloads: list[Workload] = []
    refused: list[Untuned] = []
    texts = [t.func.script() for t in tasks]
    prime_parser(texts)
    for t, text in zip(tasks, texts, strict=True):
        try:
            wl = parse_spec({"op": "tir", "tvmscript": text})
        except TunefarmError as exc:
            _log.warning("model task %s refused: %s", t.name, exc)
            refused.append(Untuned(t.name, t.weight, f"refused: {exc}"))
            continue
        kept.append(t)
        workloads.append(wl)
    return kept, workloads, refused


def progress(model: model_jobs.ModelRow, message: str) -> ModelProgress:
    return ModelProgress(model.spent, model.trials, model.estimate_s, tasks_of(model),
                         message)


def tasks_of(model: model_jobs.ModelRow) -> list[TaskProgress]:
    return [TaskProgress(t.name, t.weight, t.workload_key, t.prior_trials + t.trials, t.best_s)
            for t in model.tasks]


def first_estimate(model: model_jobs.ModelRow) -> float | None:
    return next((e for _, e in model.estimates if e is not None), None)


def _untuned(model: model_jobs.ModelRow, errors: dict[str, str]) -> list[Untuned]:
    """The model's tasks that have no valid record on the target, with the reason."""
    out = []
    for t in model.tasks:
        if t.best_s is not None:
            continue
        why = errors.get(t.name) or (
            "not measured (the budget went to other tasks)" if t.trials == 0
            else f"no valid program in {t.trials} trials ({t.space})")
        out.append(Untuned(t.name, t.weight, why))
    return out


class ModelTuner:
    """Tunes a model's tasks with one `Measurer` (the embedded engine's, here)."""

    def __init__(self, store: Store, measurer: Measurer, *,
                 on_progress: Callable[[ModelProgress], None] | None = None,
                 on_trial: Callable[[int, str, Progress], None] | None = None) -> None:
        """`on_progress` after each round; `on_trial(round, task name, progress)` after each
        trial of a round (its task job's progress, as `Tuner` reports it)."""
        self.store, self.measurer = store, measurer
        self._resolved: dict[str, ResolvedTask] = {}  # workload key -> its task (`_create`)
        self.on_progress = on_progress or (lambda _p: None)
        self.on_trial = on_trial or (lambda _r, _n, _p: None)

    def run(self, req: ModelRequest) -> ModelSummary:
        t0 = time.monotonic()
        tasks, workloads, refused = vet_tasks(req.tasks)
        if not tasks:
            return ModelSummary("", 0, 0, None, None, time.monotonic() - t0,
                                "no task could be tuned", [], refused)
        req = replace(req, tasks=tasks)
        model = self._create(req, workloads)
        self.on_progress(progress(model, "resuming" if model.spent else "starting"))

        def time_left(_started: datetime | None) -> float | None:
            budget = req.wall_budget_s
            return None if budget is None else budget - (time.monotonic() - t0)

        tuner = Tuner(self.store, self.measurer)
        rounds = 0
        errors: dict[str, str] = {}  # task name -> why its task job failed
        while True:
            step = model_jobs.advance(self.store, model.id, gradient_plan, time_left_s=time_left)
            if step.job_id is None:
                break
            job = self.store.get_job(step.job_id)
            model = model_jobs.get_model(self.store, model.id)
            task = next((t for t in model.tasks if t.job_id == step.job_id), None)
            if job is None or task is None:
                raise TunefarmError(f"model job {model.id}: no task job {step.job_id!r}")
            tuner.on_progress = functools.partial(self.on_trial, rounds + 1, task.name)
            try:
                # the task's space as its model job stored it (a resumed model keeps its own)
                resolved = replace(self._resolved[workloads[task.idx].key], space=task.space)
                summary = tuner.run(TuneRequest(
                    workload=resolved.workload, target=req.target, trials=job.trials,
                    device_key=req.device_key, space=resolved.space, batch_size=req.batch_size,
                    seed=req.seed, options=req.options, job_id=job.id, task=resolved))
                done = f"+{summary.measured_now} trials ({summary.stop_reason})"
            except (JobHandedOff, KeyboardInterrupt):
                raise
            except Exception as exc:  # the task job is FAILED (Tuner.run); the others go on
                _log.warning("model task %s failed: %s: %s", task.name, type(exc).__name__, exc)
                errors[task.name] = f"failed: {type(exc).__name__}: {exc}"[:500]
                done = f"failed ({type(exc).__name__}); the other tasks go on"
            rounds += 1
            model = model_jobs.get_model(self.store, model.id)
            self.on_progress(progress(model, f"{task.name}: {done}"))
        model = model_jobs.get_model(self.store, model.id)
        return ModelSummary(model.id, model.spent, rounds, first_estimate(model),
                            model.estimate_s, time.monotonic() - t0, model.message,
                            tasks_of(model), refused + _untuned(model, errors))

    def _create(self, req: ModelRequest, workloads: list[Workload]) -> model_jobs.ModelRow:
        """The model job of `req` (resumed if this machine ran it before)."""
        resolved = TaskResolver(self.store).tasks(
            workloads, CanonicalTarget.of(req.target), req.device_key, req.space)
        self._resolved = {r.workload.key: r for r in resolved}
        tasks = [model_jobs.NewTask(t.name, t.weight, r.workload_id, r.workload.key, r.space)
                 for t, r in zip(req.tasks, resolved, strict=True)]
        return model_jobs.create_model(self.store, model_jobs.NewModel(
            name=req.name, owner=LOCAL_OWNER, target=resolved[0].target_ref, space=req.space,
            trials=req.trials,
            round_trials=req.round_trials, options=JobOptions(req.batch_size, req.seed),
            tasks=tasks, resume=True, max_trials_per_task=req.max_trials_per_task))
