"""Model jobs in SQL (`tuner.db.model_jobs`) planned by the gradient task scheduler
(`tuner.model.rounds`), on SQLite and PostgreSQL: rounds are ordinary task jobs, started one at
a time, reopened with a larger budget, and the budget counts only what this model measured."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tuner.core import tvm_api as tv
from tuner.db import Store
from tuner.db import model_jobs as mj
from tuner.db.catalog import register_workload
from tuner.db.jobs import LOCAL_OWNER, JobOptions, claim
from tuner.db.store import NewRecord
from tuner.db.tables import JobState
from tuner.measure import Invalidity
from tuner.model.rounds import BUDGET_SPENT, EXHAUSTED, WALL_BUDGET, gradient_plan
from tuner.workloads import parse_spec

TARGET = {"kind": "llvm", "num-cores": 1}
SPECS = [{"op": "matmul", "shape": [16, 16, 16]}, {"op": "matmul", "shape": [8, 8, 8]}]


def _model(store: Store, *, owner: str = "alice", trials: int = 12, round_trials: int = 4,
           wall_budget_s: float | None = None, resume: bool = False,
           max_trials_per_task: int | None = None) -> mj.ModelRow:
    tref = store.ensure_target(tv.canonical_target_json(tv.make_target(TARGET)), "dev")
    tasks = []
    for i, spec in enumerate(SPECS):
        wl = parse_spec(spec)
        tasks.append(mj.NewTask(f"task{i}", 2 - i, register_workload(store, wl), wl.key, "s"))
    return mj.create_model(store, mj.NewModel(
        name="m", owner=owner, target=tref, space="default", trials=trials,
        round_trials=round_trials, options=JobOptions(4, 0), tasks=tasks,
        wall_budget_s=wall_budget_s, resume=resume, max_trials_per_task=max_trials_per_task))


def _measure(store: Store, job_id: str, n: int, latency: float, *,
             invalidity: Invalidity = Invalidity.OK, finish: bool = True) -> None:
    """What a tuner does with a round: n records, then the job SUCCEEDED."""
    job = store.get_job(job_id)
    assert job is not None
    start = len(store.records(job_id=job_id))
    store.add_records([NewRecord(
        trial_id=f"{job_id}-{start + k}", job_id=job_id, workload_id=job.workload_id,
        target_id=job.target_id, space=job.space, cand_hash=f"{start + k:032x}",
        trace_json="[]", invalidity=invalidity, tvm_version="t", latencies=[latency],
        median_s=latency if invalidity is Invalidity.OK else None) for k in range(n)])
    if not finish:
        return
    store.set_job_state(job_id, JobState.RUNNING)
    store.set_job_state(job_id, JobState.SUCCEEDED)


def test_rounds_spend_the_budget_one_task_job_each(store: Store) -> None:
    model = _model(store)
    first = mj.advance(store, model.id, gradient_plan)
    assert first.started and first.job_id is not None
    # a round in flight is returned again, not doubled
    assert mj.advance(store, model.id, gradient_plan) == mj.Advanced(first.job_id, False)
    job = store.get_job(first.job_id)
    assert job is not None and job.trials == 4 and job.model_id == model.id
    assert job.owner == "alice" and job.lease_owner is None  # service tuners may claim it
    assert mj.get_model(store, model.id).tasks[0].job_id == first.job_id  # the heaviest first

    _measure(store, first.job_id, 4, 2e-3)
    second = mj.advance(store, model.id, gradient_plan)
    assert second.started and second.job_id not in (None, first.job_id)  # the other task
    _measure(store, second.job_id, 4, 1e-3)  # type: ignore[arg-type]
    third = mj.advance(store, model.id, gradient_plan)
    assert third.started and third.job_id in (first.job_id, second.job_id)
    reopened = store.get_job(third.job_id)  # type: ignore[arg-type]
    assert reopened is not None and reopened.state is JobState.QUEUED and reopened.trials == 8
    _measure(store, third.job_id, 4, 0.5e-3)  # type: ignore[arg-type]

    assert mj.advance(store, model.id, gradient_plan) == mj.Advanced(None, False)
    done = mj.get_model(store, model.id)
    assert done.state is JobState.SUCCEEDED and done.message == BUDGET_SPENT
    assert done.spent == 12 and sorted(t.trials for t in done.tasks) == [4, 8]
    # the estimate after each round: unknown until both tasks measured, then falling
    est = [e for _, e in done.estimates]
    assert est[0] is None and est[1] is None and est[2] is not None and est[-1] < est[2]


def test_no_task_gets_more_than_the_per_task_cap(store: Store) -> None:
    """With MetaSchedule's per-task cap (equal budgets in a comparison): a round never takes a
    task past it, a capped task gets no more rounds, and the model ends with budget left."""
    model = _model(store, trials=40, round_trials=4, max_trials_per_task=6)
    spent: dict[str, int] = {}
    while (a := mj.advance(store, model.id, gradient_plan)).started:
        assert a.job_id is not None
        job = store.get_job(a.job_id)
        assert job is not None
        step = job.trials - spent.get(a.job_id, 0)
        assert step in (4, 2)  # a round of 4, then the 2 left under the cap
        _measure(store, a.job_id, step, 1e-3 / (1 + job.trials))  # always improving
        spent[a.job_id] = job.trials
    done = mj.get_model(store, model.id)
    assert sorted(t.trials for t in done.tasks) == [6, 6] and done.spent == 12
    assert done.state is JobState.SUCCEEDED and done.message.startswith(EXHAUSTED)


def test_worker_lost_records_do_not_count_and_a_failed_task_stops(store: Store) -> None:
    model = _model(store, trials=40)
    a = mj.advance(store, model.id, gradient_plan).job_id
    assert a is not None
    _measure(store, a, 3, 1.0, invalidity=Invalidity.WORKER_LOST, finish=False)
    _measure(store, a, 4, 1e-3)
    b = mj.advance(store, model.id, gradient_plan).job_id
    assert b is not None and b != a
    store.set_job_state(b, JobState.RUNNING)
    store.set_job_state(b, JobState.FAILED, error="boom")
    row = mj.get_model(store, model.id)
    assert row.spent == 4  # worker_lost: not a trial
    nxt = mj.advance(store, model.id, gradient_plan)
    assert nxt.job_id == a  # the failed task gets no more rounds
    tasks = mj.get_model(store, model.id).tasks
    assert [t.done for t in tasks] == [False, True]
    # the failed task is untuned, with its reason (what the dashboard's model page shows)
    assert [t.untuned for t in tasks] == [False, True] and tasks[1].error == "boom"
    assert tasks[0].error is None


def test_a_task_whose_round_measures_nothing_new_is_done(store: Store) -> None:
    model = _model(store, trials=40)
    a = mj.advance(store, model.id, gradient_plan).job_id
    _measure(store, a, 2, 1e-3)  # type: ignore[arg-type]  # stopped short: space exhausted
    b = mj.advance(store, model.id, gradient_plan).job_id
    _measure(store, b, 1, 1e-3)  # type: ignore[arg-type]
    end = mj.advance(store, model.id, gradient_plan)
    assert end.job_id is None
    row = mj.get_model(store, model.id)
    assert row.state is JobState.SUCCEEDED and row.message == EXHAUSTED and row.spent == 3


def test_wall_budget_ends_the_model_between_rounds(store: Store) -> None:
    model = _model(store, wall_budget_s=3600)
    a = mj.advance(store, model.id, gradient_plan).job_id
    job = store.get_job(a)  # type: ignore[arg-type]
    assert job is not None and job.wall_budget_s is not None and job.wall_budget_s <= 3600
    _measure(store, a, 4, 1e-3)  # type: ignore[arg-type]
    end = mj.advance(store, model.id, gradient_plan, time_left_s=lambda _started: 0.0)
    row = mj.get_model(store, model.id)
    assert end.job_id is None and row.message == WALL_BUDGET and row.spent == 4


def test_local_task_jobs_are_never_claimed_and_resume_reopens_an_interrupted_round(
        store: Store) -> None:
    model = _model(store, owner=LOCAL_OWNER, resume=True)
    a = mj.advance(store, model.id, gradient_plan).job_id
    assert a is not None and store.get_job(a).lease_owner == LOCAL_OWNER  # type: ignore[union-attr]
    assert claim(store, "tuner-1", 5.0) is None
    assert mj.stalled(store) == []  # the CLI drives its own model jobs
    store.set_job_state(a, JobState.RUNNING)
    store.set_job_state(a, JobState.FAILED, error="interrupted")  # Ctrl-C
    again = _model(store, owner=LOCAL_OWNER, resume=True, trials=16)
    assert again.id == model.id and again.trials == 16
    assert mj.advance(store, model.id, gradient_plan) == mj.Advanced(a, False)  # goes on
    assert store.get_job(a).state is JobState.QUEUED  # type: ignore[union-attr]


def test_a_task_tuned_before_starts_from_its_history(store: Store) -> None:
    first = _model(store, owner="bob")
    a = mj.advance(store, first.id, gradient_plan).job_id
    _measure(store, a, 4, 1e-3)  # type: ignore[arg-type]
    mj.cancel_model(store, first.id)
    later = _model(store, owner="bob")
    assert later.id != first.id
    t0 = later.tasks[0]
    assert t0.prior_trials == 4 and t0.trials == 0 and t0.best_s == 1e-3
    assert t0.history == [(4, 1e-3)]
    # the untuned task goes first: the tuned one counts as having had its first round
    b = mj.advance(store, later.id, gradient_plan).job_id
    assert mj.get_model(store, later.id).tasks[1].job_id == b


def test_stalled_lists_service_models_without_a_round_in_flight(store: Store) -> None:
    model = _model(store)
    assert mj.stalled(store) == [model.id]  # created, first round not started
    mj.advance(store, model.id, gradient_plan)
    assert mj.stalled(store) == []


def test_estimates_are_json_in_sql(store: Store) -> None:
    model = _model(store)
    mj.advance(store, model.id, gradient_plan)
    with store.session() as s:
        from tuner.db import tables as m

        raw: Any = s.get(m.ModelJob, model.id)
        assert json.loads(raw.estimates_json) == [[0, None]]


@pytest.mark.parametrize("owner", ["alice"])
def test_cancel_returns_the_round_in_flight(store: Store, owner: str) -> None:
    model = _model(store, owner=owner)
    a = mj.advance(store, model.id, gradient_plan).job_id
    row, active = mj.cancel_model(store, model.id)
    assert row.state is JobState.CANCELLED and active == [a]
    assert mj.advance(store, model.id, gradient_plan) == mj.Advanced(None, False)


def test_a_task_without_a_valid_program_is_given_up_after_three_rounds(store: Store) -> None:
    # every candidate of task0 is a wrong answer (ResNet's 512-channel task was, before its
    # divisor was drawn away from 0): it must not take the whole budget
    model = _model(store, trials=40)
    rounds = []
    while (step := mj.advance(store, model.id, gradient_plan)).job_id is not None:
        job = store.get_job(step.job_id)
        assert job is not None
        first = job.workload_id == mj.get_model(store, model.id).tasks[0].workload_id
        rounds.append(0 if first else 1)
        if first:
            _measure(store, step.job_id, 4, 1.0, invalidity=Invalidity.WRONG_ANSWER)
        else:
            _measure(store, step.job_id, 4, 1e-3 / len(rounds))  # keeps improving
    assert rounds.count(0) == 3 and rounds.count(1) == 7, rounds  # 40 trials: 10 rounds of 4
    row = mj.get_model(store, model.id)
    assert row.state is JobState.SUCCEEDED and row.message == BUDGET_SPENT and row.spent == 40


def test_a_model_job_changes_state_only_as_its_state_machine_allows() -> None:
    """`ModelJob.move_to` is `Job.move_to`'s machine: time stamps, reopening, a refusal."""
    from tuner.core.errors import Conflict
    from tuner.db import tables as m

    t0, t1, t2 = (m.utcnow() for _ in range(3))
    row = m.ModelJob(id="mj", state=JobState.QUEUED.value)
    row.move_to(JobState.RUNNING, now=t0)
    assert (row.state, row.started_at, row.finished_at) == ("RUNNING", t0, None)
    row.move_to(JobState.CANCELLED, now=t1)
    assert (row.state, row.started_at, row.finished_at) == ("CANCELLED", t0, t1)
    with pytest.raises(Conflict, match="model job mj is CANCELLED"):
        row.move_to(JobState.RUNNING, now=t2)
    row.move_to(JobState.RUNNING, now=t2, reopen=True)
    assert (row.state, row.started_at, row.finished_at) == ("RUNNING", t0, None)
