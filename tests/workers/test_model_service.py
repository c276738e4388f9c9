"""Model jobs on the service: tuner processes (threads here) run the rounds of a model job as
ordinary task jobs against real Redis and SQL, measured by a fake worker thread. No process has
to drive the model: the tuner that ends a round starts the next one, and any tuner's poll starts
a round that is due (a tuner that died between two rounds loses nothing)."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from tests.support.fakefarm import FakeWorker
from tests.support.tasks import TASKS
from tests.workers.test_tuner_service import TARGET, _run, _run_in_thread
from tuner.core import tvm_api as tv
from tuner.db import Store
from tuner.db import model_jobs as mj
from tuner.db.catalog import register_workload
from tuner.db.jobs import JobOptions
from tuner.db.tables import JobState
from tuner.model.rounds import BUDGET_SPENT, gradient_plan
from tuner.queue import Keys
from tuner.workloads import parse_spec

pytestmark = pytest.mark.timeout(240)


def _model(store: Store, trials: int = 8) -> mj.ModelRow:
    """What POST /v1/models stores (its first round not started: the tuners start it)."""
    tref = store.ensure_target(tv.canonical_target_json(tv.make_target(TARGET)), "dev")
    tasks = []
    for t in TASKS:
        wl = parse_spec({"op": "tir", "tvmscript": t["tvmscript"]})
        tasks.append(mj.NewTask(str(t["name"]), int(t["weight"]),  # type: ignore[call-overload]
                                register_workload(store, wl), wl.key, "default"))
    return mj.create_model(store, mj.NewModel(
        name="mlp", owner="alice", target=tref, space="default", trials=trials,
        round_trials=4, options=JobOptions(4, 0), tasks=tasks))


def _wait(store: Store, model_id: str, timeout: float = 180.0) -> mj.ModelRow:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = mj.get_model(store, model_id)
        if row.state.is_terminal:
            return row
        time.sleep(0.2)
    raise AssertionError(f"model job {model_id} did not end: {mj.get_model(store, model_id)}")


def test_a_tuner_runs_every_round_of_a_model_job(store: Store, r: redis.Redis, keys: Keys,
                                                 redis_url: str) -> None:
    model = _model(store)
    stop = threading.Event()
    with FakeWorker(redis_url, keys, store):
        t = _run_in_thread(store, redis_url, keys, stop)
        try:
            row = _wait(store, model.id)
        finally:
            stop.set()
            t.join(30)
    assert row.state is JobState.SUCCEEDED and row.message == BUDGET_SPENT, row
    # the relu's space holds a single program: one trial, then no more rounds; the rest of the
    # budget went to the matmul
    matmul, relu = row.tasks
    assert relu.trials == 1 and relu.done and matmul.trials == 7 and row.spent == 8
    for task in row.tasks:  # one task job each, SUCCEEDED, of the model's owner
        job = store.get_job(task.job_id)  # type: ignore[arg-type]
        assert job is not None and job.state is JobState.SUCCEEDED and job.owner == "alice"
        assert job.model_id == model.id and task.best_s is not None
    assert row.estimates[-1][1] is not None


def test_a_round_left_by_a_dead_tuner_is_started_by_the_next_poll(
        store: Store, r: redis.Redis, keys: Keys, redis_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from workers.tuner_service import TunerService

    model = _model(store, trials=8)
    first = mj.advance(store, model.id, gradient_plan).job_id
    with FakeWorker(redis_url, keys, store):
        with monkeypatch.context() as patch:  # this tuner dies before it advances the model
            patch.setattr(TunerService, "_advance_model", lambda _self, _model_id: None)
            assert _run(store, redis_url, keys, once=True) == 1
        job = store.get_job(first)  # type: ignore[arg-type]
        assert job is not None and job.state is JobState.SUCCEEDED and job.trials == 4
        assert mj.stalled(store) == [model.id]
        assert _run(store, redis_url, keys, once=True) == 1  # its poll starts the next round
        assert all(t.job_id is not None for t in mj.get_model(store, model.id).tasks)
        for _ in range(4):  # the rounds left, one tuner poll each
            if mj.get_model(store, model.id).state.is_terminal:
                break
            _run(store, redis_url, keys, once=True)
    row = mj.get_model(store, model.id)
    assert row.state is JobState.SUCCEEDED and row.spent == 8, row
