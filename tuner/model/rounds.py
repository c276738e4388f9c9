"""The plan of a model job's rounds: which task gets the next round, or why the model job ends.
`tuner.db.model_jobs.advance` asks it on the locked model row; the embedded CLI and the service
share it. Pure logic: the gradient-based task scheduler (`GradientScheduler`) restored from the
stored rounds of each task."""

from __future__ import annotations

from ..db.model_jobs import Decision, RoundState
from ..db.tables import JobState
from .scheduler import GradientScheduler, TaskState

BUDGET_SPENT = "budget spent"
WALL_BUDGET = "wall-clock budget reached"
EXHAUSTED = "every task's space is exhausted"


def gradient_plan(state: RoundState) -> Decision:
    """Start the next round where weight × expected latency gain per trial is largest; end the
    model job when the budget or the wall-clock budget is spent, or no task can gain. A task
    whose job has had `max_trials_per_task` trials gets no more (MetaSchedule's per-task cap:
    equal budgets in a comparison)."""
    cap = state.max_trials_per_task
    sched = GradientScheduler.restore([
        TaskState(t.weight, t.prior_trials + t.trials, t.best_s, list(t.history),
                  t.done or (cap is not None and t.trials >= cap))
        for t in state.tasks])
    estimate = sched.estimate_s()
    if state.spent >= state.trials:
        return Decision(estimate, finish=JobState.SUCCEEDED, message=BUDGET_SPENT)
    if state.time_left_s is not None and state.time_left_s <= 0:
        return Decision(estimate, finish=JobState.SUCCEEDED, message=WALL_BUDGET)
    i = sched.pick()
    if i is None:
        failed = all(t.job_state is JobState.FAILED for t in state.tasks)
        hopeless = [t.name for j, t in enumerate(state.tasks) if sched.hopeless(j)]
        message = "every task job failed" if failed else EXHAUSTED + (
            f" or has had its {cap} trials" if cap is not None else "") + (
            f"; given up without a valid program: {', '.join(hopeless)}" if hopeless else "")
        return Decision(estimate, finish=JobState.FAILED if failed else JobState.SUCCEEDED,
                        message=message)
    step = min(state.round_trials, state.trials - state.spent,
               *([cap - state.tasks[i].trials] if cap is not None else []))
    return Decision(estimate, start=i, step=step,
                    message=f"{state.tasks[i].name}: a round of {step} trials")
