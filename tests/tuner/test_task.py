"""The setup before a job, written once (`tuner.search.task`): a `ResolvedTask` is made where a
job starts and handed down, so nothing registers a workload or resolves a space twice for one
job. Real SQLite and PostgreSQL stores; the space resolution is counted where it happens."""

from __future__ import annotations

from typing import Any

import pytest

from schedules import registry
from tests.support.search import Synthetic
from tuner.core.errors import SpecError, TunefarmError
from tuner.db import Store
from tuner.measure.replay import ReplayMeasurer
from tuner.model.job import ModelRequest, ModelTuner
from tuner.model.pipeline import ModelTask
from tuner.search import Tuner, TuneRequest
from tuner.search.task import CanonicalTarget, TaskResolver
from tuner.workloads import parse_spec
from tuner.workloads.identity import identity_hash

TARGET = {"kind": "llvm", "mcpu": "x86-64-v3", "num-cores": 1}
DENSE = {"op": "dense", "shape": [16, 32, 16]}
WIDE = {"op": "dense", "shape": [16, 64, 16]}


@pytest.fixture
def resolutions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every space resolution, by workload key."""
    seen: list[str] = []
    real = registry.resolve

    def counting(name: str, wl: Any, target: Any) -> str:
        seen.append(wl.key)
        return real(name, wl, target)

    monkeypatch.setattr(registry, "resolve", counting)
    return seen


def test_a_task_is_registered_stored_and_resolved(store: Store) -> None:
    wl = parse_spec(DENSE)
    task = TaskResolver(store).task(wl, CanonicalTarget.of(TARGET), "dev", "default")
    assert task.space == registry.resolve("default", wl, task.target.target) != "default"
    assert store.get_workload(task.workload_id).key == wl.key  # type: ignore[union-attr]
    assert task.target_ref.device_key == task.device_key == "dev"
    assert task.target.as_dict["mcpu"] == "x86-64-v3"
    assert CanonicalTarget.of(task.target.json).json == task.target.json  # canonical: a fixpoint


def test_a_space_that_does_not_apply_fails_before_any_row(store: Store) -> None:
    good, bad = parse_spec(DENSE), parse_spec({"op": "softmax", "shape": [4, 64]})
    with pytest.raises(SpecError, match="gemm-x86"):
        TaskResolver(store).tasks([good, bad], CanonicalTarget.of(TARGET), "dev", "gemm-x86")
    assert store.workload_by_key(good.key) is None


def test_a_model_resolves_each_task_once(store: Store, resolutions: list[str]) -> None:
    """`tune-model` made each task's setup twice (the model job, then the loop of each round);
    the rounds now take the task the model job made."""
    funcs = [parse_spec(DENSE).prim_func(), parse_spec(WIDE).prim_func()]
    tasks = [ModelTask(f"t{i}", f.with_attr("global_symbol", "main"), i + 1, identity_hash(f))
             for i, f in enumerate(funcs)]
    req = ModelRequest(name="m", tasks=tasks, target=TARGET, trials=8, round_trials=4,
                       batch_size=4)
    summary = ModelTuner(store, ReplayMeasurer(fallback=Synthetic())).run(req)
    assert summary.trials == 8
    assert len(resolutions) == 2 and len(set(resolutions)) == 2, resolutions


def test_a_request_that_carries_its_task_is_not_resolved_again(
        store: Store, resolutions: list[str]) -> None:
    wl = parse_spec(DENSE)
    task = TaskResolver(store).task(wl, CanonicalTarget.of(TARGET), "local", "default")
    resolutions.clear()
    summary = Tuner(store, ReplayMeasurer(fallback=Synthetic())).run(TuneRequest(
        workload=wl, target=TARGET, trials=4, batch_size=4, space=task.space, task=task))
    assert summary.trials_done == 4 and resolutions == []
    with pytest.raises(TunefarmError, match="not its workload"):
        Tuner(store, ReplayMeasurer(fallback=Synthetic())).run(TuneRequest(
            workload=parse_spec(WIDE), target=TARGET, trials=4, task=task))
