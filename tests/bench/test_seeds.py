"""The model suite's tuner seeds (bench/seeds.py): every seed tunes both tuners once, on the same
model, each in its own databases, and a tuner's figure is the median over its seeds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import seeds


def test_seeds_are_distinct_integers() -> None:
    assert seeds.parse("0, 1,2") == [0, 1, 2]
    for bad in ("", "0,x", "1,1"):
        with pytest.raises(SystemExit, match="--seeds"):
            seeds.parse(bad)
    assert seeds.label("tunefarm", 4, [4]) == "tunefarm"
    assert seeds.label("tunefarm", 4, [0, 4]) == "tunefarm@4"
    assert seeds.tuner_of("metaschedule@4") == "metaschedule"
    assert (seeds.work_suffix(0, [0, 4]), seeds.work_suffix(4, [0, 4])) == ("", "-seed4")


def test_a_tuner_is_the_median_of_its_seeds_and_a_wrong_build_is_named() -> None:
    timing: dict[str, dict[str, Any]] = {
        "tunefarm@0": {"median_s": 0.012}, "tunefarm@1": {"median_s": 0.010},
        "tunefarm@2": {"median_s": 0.011},
        "metaschedule@0": {"median_s": 0.020},
        "metaschedule@1": {"median_s": 0.001, "status": "wrong"},
        "pytorch": {"median_s": 0.5}}
    tf = seeds.aggregate(timing, "tunefarm")
    assert tf is not None
    assert (tf["median_s"], tf["min_s"], tf["max_s"], tf["failed"]) == (0.011, 0.010, 0.012, [])
    ms = seeds.aggregate(timing, "metaschedule")
    assert ms is not None and ms["median_s"] == 0.020 and ms["failed"] == ["metaschedule@1"]
    assert seeds.aggregate(timing, "nothing") is None
    result = {"timing": timing, "seeds": {"tunefarm": tf, "metaschedule": ms}}
    assert seeds.median_s(result, "tunefarm") == 0.011
    assert seeds.spread(result, "tunefarm") == " (3 seeds: 10.000-12.000 ms)"
    assert "1 without a correct build" in seeds.spread(result, "metaschedule")
    single = {"timing": {"tunefarm": {"median_s": 0.003}}}
    assert seeds.median_s(single, "tunefarm") == 0.003 and seeds.spread(single, "tunefarm") == ""


def test_each_seed_tunes_both_tuners_on_the_same_model(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-layer model at two trials per task, two seeds: two tuned builds, each checked
    against PyTorch and timed in the one run; tunefarm's jobs carry their seed (MetaSchedule's
    seed reaching `tune_relax`: test_model_baselines.py; left out here for its ~12 s a seed)."""
    torch = pytest.importorskip("torch")
    from bench import model_suite as models
    from bench.__main__ import parse_args
    from tuner.db import Store
    from tuner.db.jobs import list_jobs

    class Tiny(torch.nn.Module):
        def __init__(self, n: int) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(n, n)

        def forward(self, x: Any) -> Any:
            return torch.relu(self.fc(x))

        def inputs(self) -> tuple[Any, ...]:
            return (torch.randn(8, self.fc.in_features),)

    monkeypatch.setitem(models.SCALES, "small", {"tiny": {"n": 32}})
    monkeypatch.setattr(models, "_models", lambda torch: {"tiny": Tiny})
    argv = ["--suite", "models", "--scale", "small", "--trials", "2", "--seeds", "3,5",
            "--no-torch", "--skip-ms", "--rounds", "1", "--min-ms", "1", "--out", str(tmp_path)]
    assert models.run_models(parse_args(argv)) == 0
    r = json.loads((tmp_path / "models.json").read_text())["tiny"]
    tuned = {"tunefarm@3", "tunefarm@5"}
    assert set(r["tuning"]) == tuned
    assert all(r["timing"][k]["status"] == "ok" for k in tuned)
    for seed, work in ((3, "work-tiny-small"), (5, "work-tiny-small-seed5")):
        jobs, _ = list_jobs(Store(f"sqlite:///{tmp_path / work / 'tunefarm.db'}"))
        assert jobs and {j.options["seed"] for j in jobs} == {seed}
    assert r["seeds"]["tunefarm"]["seeds"] == 2 and r["seeds"]["tunefarm"]["median_s"] > 0
    assert r["seeds"]["metaschedule"] is None
    assert "2 seeds" in (tmp_path / "models.md").read_text()
    # built again from the two seeds' databases, nothing tuned again
    assert models.run_models(parse_args([*argv, "--reuse-tuning"])) == 0
    again = json.loads((tmp_path / "models.json").read_text())["tiny"]
    assert again["tuning"] == r["tuning"] and set(again["seeds"]["tunefarm"]["per_seed_s"]) == {
        "tunefarm@3", "tunefarm@5"}
    with pytest.raises(SystemExit, match="no earlier run of tiny"):
        models.run_models(parse_args([*argv[:7], "3,7", *argv[8:], "--reuse-tuning"]))
