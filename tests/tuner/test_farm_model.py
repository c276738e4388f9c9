"""The farm's cost model of a target (`tuner.search.farm_model`), on SQLite and PostgreSQL, with
synthetic records whose throughput is a known function of their features: it is persisted and
versioned in SQL, used by another process, updated incrementally close to what a full refit
learns, never trained on worker_lost records, and shared with new device keys of its target."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tuner.db import Store
from tuner.db import cost_models as cm
from tuner.db.rows import TargetRef
from tuner.db.store import NewRecord
from tuner.measure import Invalidity
from tuner.search import farm_model
from tuner.search.costmodel import FEATURE_DIM, XGBCostModel
from tuner.search.farm_model import FarmModelConfig, ranking_metrics

TARGET = '{"kind":"llvm","mcpu":"znver4"}'
W = np.zeros(FEATURE_DIM, dtype=np.float32)
W[[3, 50, 170]] = [1.5, -1.0, 0.8]  # throughput depends on three features
CFG = FarmModelConfig(full_rounds=60, incremental_rounds=30, min_new=8)


def _x(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.normal(size=(n, FEATURE_DIM)).astype(np.float32)


def _latency(x: np.ndarray, wid: int) -> np.ndarray:
    """Throughput is a smooth function of the features (the same on every workload), scaled
    per workload: what a transferable model can learn."""
    return (1e-3 * wid) / (1.0 + np.exp(x @ W))


def _add(store: Store, tref: TargetRef, wid: int, x: np.ndarray, *, tag: str,
         invalidity: Invalidity = Invalidity.OK) -> None:
    lat = _latency(x, wid)
    store.add_records([NewRecord(
        trial_id=f"{tag}-{wid}-{i}", workload_id=wid, target_id=tref.id, space="s",
        cand_hash=f"{i:032x}", trace_json="[]", invalidity=invalidity, tvm_version="t",
        latencies=[float(v)], median_s=float(v) if invalidity is Invalidity.OK else None,
        features=row.tobytes()) for i, (row, v) in enumerate(zip(x, lat, strict=True))])


def _workloads(store: Store, n: int) -> list[int]:
    return [store.ensure_workload(key=f"w{i}", op="tir", spec_json="{}", shash=str(i),
                                  mod_json="", description="", flops=1) for i in range(n)]


@pytest.fixture
def tref(store: Store) -> TargetRef:
    return store.ensure_target(TARGET, "board-a")


def test_versions_are_persisted_and_used_by_another_process(store: Store, tref: TargetRef,
                                                            tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for wid in _workloads(store, 4):
        _add(store, tref, wid, _x(rng, 40), tag="a")
    first = farm_model.refresh(store, tref, cfg=CFG)
    assert first is not None and first.version == 1 and first.full and first.rows == 160
    probe = _x(np.random.default_rng(7), 5)
    store_dir = str(tmp_path / "probe.npy")
    np.save(store_dir, probe)
    script = textwrap.dedent(f"""
        import numpy as np
        from tuner.db import Store
        from tuner.search import farm_model
        store = Store({store.url!r})
        tref = store.get_target({tref.id})
        booster, stored = farm_model.load(store, tref)
        x = np.load({store_dir!r})
        import xgboost as xgb
        print(stored.version, *booster.predict(xgb.DMatrix(x)).tolist())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out[0] == "1"
    mine = XGBCostModel(base=farm_model.load(store, tref)[0]).predict_features(probe)
    np.testing.assert_allclose(np.array(out[1:], dtype=np.float64), mine, rtol=1e-6)


def test_an_update_learns_only_what_is_new_and_is_scored_on_it_first(
        store: Store, tref: TargetRef) -> None:
    rng = np.random.default_rng(1)
    wids = _workloads(store, 6)
    for wid in wids[:3]:
        _add(store, tref, wid, _x(rng, 80), tag="a")
    v1 = farm_model.refresh(store, tref, cfg=CFG)
    assert farm_model.refresh(store, tref, cfg=CFG) is None  # nothing new
    for wid in wids[3:]:
        _add(store, tref, wid, _x(rng, 80), tag="b")
    v2 = farm_model.refresh(store, tref, cfg=CFG)
    assert v1 is not None and v2 is not None
    assert v2.version == 2 and not v2.full and v2.rows == 480
    assert v2.last_record_id > v1.last_record_id
    # v1 scored the new workloads before v2 learned them: held-out accuracy, well above chance
    assert v2.metrics["workloads"] == 3 and v2.metrics["kendall_tau"] > 0.3, v2.metrics


def test_worker_lost_records_never_train_it(store: Store, tref: TargetRef) -> None:
    rng = np.random.default_rng(2)
    wids = _workloads(store, 2)
    _add(store, tref, wids[0], _x(rng, 40), tag="a")
    v1 = farm_model.refresh(store, tref, cfg=CFG)
    assert v1 is not None and v1.rows == 40
    _add(store, tref, wids[1], _x(rng, 40), tag="lost", invalidity=Invalidity.WORKER_LOST)
    assert len(cm.rows_after(store, tref.id, 0, dim=FEATURE_DIM)) == 40
    assert farm_model.refresh(store, tref, cfg=CFG) is None  # nothing to learn
    full = farm_model.refresh(store, tref, full=True, cfg=CFG)
    assert full is not None and full.rows == 40  # a refit leaves them out too
    # a kernel that failed is a throughput of 0, not left out
    _add(store, tref, wids[1], _x(rng, 10), tag="fail", invalidity=Invalidity.RUN_ERROR)
    rows = cm.rows_after(store, tref.id, full.last_record_id, dim=FEATURE_DIM)
    assert len(rows) == 10 and np.isnan(rows.median_s).all()


# what is checked is the model's ranking, not the storage (the versions' storage runs on both
# backends above and below): one backend
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("per_workload", [60, 200])
def test_incremental_updates_rank_like_a_full_refit(store: Store, tref: TargetRef,
                                                    per_workload: int) -> None:
    """Tolerance: on held-out workloads, the mean Kendall τ (within each workload, against the
    true throughput) of the model updated twice incrementally is within 0.2 of a full refit on
    the same records. Measured: 0.62 vs 0.64 at 60 rows per workload, 0.56 vs 0.72 at 200: the
    trees learnt first keep their structure (refits every `full_every` versions bound that)."""
    import xgboost as xgb

    rng = np.random.default_rng(3)
    wids = _workloads(store, 12)
    for wid in wids[:4]:
        _add(store, tref, wid, _x(rng, per_workload), tag="a")
    assert farm_model.refresh(store, tref, cfg=CFG) is not None
    for step in range(2):
        for wid in wids[4 + 4 * step: 8 + 4 * step]:
            _add(store, tref, wid, _x(rng, per_workload), tag=f"b{step}")
        update = farm_model.refresh(store, tref, cfg=CFG)
        assert update is not None and not update.full
    incremental = farm_model.booster_of(cm.latest(store, tref.id))  # type: ignore[arg-type]
    rows = cm.newest_rows(store, tref.id, 10_000, dim=FEATURE_DIM)
    full = farm_model.train(rows, farm_model.labels(store, tref, rows), CFG)
    x = _x(np.random.default_rng(99), 300)
    groups = np.repeat(np.arange(10), 30)
    truth = 1.0 / _latency(x, 5)
    tau_inc = ranking_metrics(incremental.predict(xgb.DMatrix(x)), truth, groups)
    tau_full = ranking_metrics(full.predict(xgb.DMatrix(x)), truth, groups)
    assert tau_full["kendall_tau"] > 0.5, tau_full
    assert abs(tau_inc["kendall_tau"] - tau_full["kendall_tau"]) <= 0.2, (tau_inc, tau_full)


def test_a_new_device_key_starts_from_its_familys_model(store: Store, tref: TargetRef) -> None:
    rng = np.random.default_rng(4)
    _add(store, tref, _workloads(store, 1)[0], _x(rng, 30), tag="a")
    saved = farm_model.refresh(store, tref, cfg=CFG)
    other = store.ensure_target(TARGET, "board-b")
    booster, stored = farm_model.load(store, other)
    assert booster is not None and stored is not None and stored.id == saved.id  # type: ignore[union-attr]
    elsewhere = store.ensure_target('{"kind":"llvm","mcpu":"skylake"}', "board-a")
    assert farm_model.load(store, elsewhere) == (None, None)


def test_a_version_stored_twice_keeps_the_first(store: Store, tref: TargetRef) -> None:
    kw = dict(target_id=tref.id, version=1, objective="regression", feature_dim=FEATURE_DIM,
              rows=1, last_record_id=1, full=True, booster=b"x", metrics={}, train_s=0.0)
    assert cm.save(store, **kw) is not None  # type: ignore[arg-type]
    assert cm.save(store, **{**kw, "booster": b"y"}) is None  # type: ignore[arg-type]
    assert cm.latest(store, tref.id).booster == b"x"  # type: ignore[union-attr]


def test_ranking_metrics() -> None:
    y = np.array([1.0, 0.5, 0.25, 0.0, 1.0, 0.5])
    groups = np.array([0, 0, 0, 0, 1, 1])
    perfect = ranking_metrics(y, y, groups)
    assert perfect["kendall_tau"] == pytest.approx(1.0) and perfect["top1"] == 1.0
    reversed_ = ranking_metrics(-y, y, groups)
    assert reversed_["kendall_tau"] == pytest.approx(-1.0) and reversed_["top1"] == 0.0
    assert reversed_["top5"] == 1.0 and perfect["workloads"] == 2


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_model_status_and_train_commands(store: Store, tref: TargetRef) -> None:
    rng = np.random.default_rng(5)
    wids = _workloads(store, 2)
    _add(store, tref, wids[0], _x(rng, 40), tag="a")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tuner", "model", *args, "--db", store.url],
                              capture_output=True, text=True, timeout=300, check=False,
                              env={**os.environ, "COLUMNS": "200"})  # one line per row

    before = cli("status")
    assert before.returncode == 0 and "llvm znver4 [board-a]" in before.stdout, before.stdout
    assert " 40 " in before.stdout and "v1" not in before.stdout
    trained = cli("train")
    assert trained.returncode == 0 and "version 1 (full, 40 rows" in trained.stdout, trained
    _add(store, tref, wids[1], _x(rng, 70), tag="b")
    again = cli("train")
    assert "version 2 (incremental, 110 rows" in again.stdout, again.stdout
    status = cli("status")
    assert "v2 incremental, 110 rows, regression" in status.stdout, status.stdout
    assert "(1 workloads)" in status.stdout  # held-out accuracy of v1 on the new workload
    ranked = cli("train", "--objective", "pairwise")
    assert "version 3 (full" in ranked.stdout, ranked.stdout  # another objective: a refit
    bad = cli("train", "--objective", "lasso")
    assert bad.returncode != 0 and "unknown objective 'lasso'" in bad.stdout + bad.stderr


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_jobs_own_rows_outweigh_the_farms_model(store: Store, tref: TargetRef) -> None:
    """The job's model is the farm's with no rows of its own, and its own alone from
    `trust_rows` on (the farm's margin weighs 1 - rows / trust_rows in between)."""
    rng = np.random.default_rng(6)
    _add(store, tref, _workloads(store, 1)[0], _x(rng, 60), tag="a")
    base = farm_model.booster_of(farm_model.refresh(store, tref, cfg=CFG))  # type: ignore[arg-type]
    probe = _x(rng, 8)
    model = XGBCostModel(base=base, trust_rows=48)
    assert model.trained and model.base_weight == 1.0
    import xgboost as xgb

    np.testing.assert_allclose(model.predict_features(probe),
                               np.clip(base.predict(xgb.DMatrix(probe)), 0, None), rtol=1e-6)
    own = _x(rng, 24)
    model.add(own, [float(v) for v in _latency(own, 9)], group="mine")
    model.fit()
    assert model.base_weight == pytest.approx(0.5)
    model.add(_x(rng, 24), [1e-3] * 24, group="mine")
    model.fit()
    assert model.base_weight == 0.0
    alone = XGBCostModel(trust_rows=48)
    alone._x, alone._lat, alone._group = model._x, model._lat, model._group
    alone.fit()
    np.testing.assert_allclose(model.predict_features(probe), alone.predict_features(probe))
    assert model.predicted_latency(probe, best_s=None) == [None] * 8
    assert all(p is None or p > 0 for p in model.predicted_latency(probe, best_s=1e-3))
