"""TunefarmDatabase: MetaSchedule's database interface over the SQL store, per target."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tuner.core.tvm_api import (
    Schedule,
    canonical_target_json,
    make_target,
    ms,
    save_json,
    structural_equal,
    te,
    tvm,
)
from tuner.db import Store
from tuner.interop.ms_database import TunefarmDatabase, shash_hex
from tuner.measure import Invalidity
from tuner.workloads.identity import identity_hash

ZNVER5 = {"kind": "llvm", "mcpu": "znver5", "num-cores": 2}
SKYLAKE = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}


def matmul(n: int = 64) -> Any:
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})


@pytest.fixture(scope="module")
def hand_schedule() -> tuple[Any, Any]:
    mod = matmul()
    sch = Schedule(mod)
    i, j, k = sch.get_loops(sch.get_sblock("C"))
    _, ji = sch.split(j, [None, 16])
    sch.vectorize(ji)
    sch.reorder(i, k)
    return mod, sch


def _record(db: Any, mod: Any, sch: Any, target: Any, run_secs: list[float]) -> Any:
    wl = db.commit_workload(mod)
    return ms.database.TuningRecord(trace=sch.trace, workload=wl, run_secs=run_secs,
                                    target=target,
                                    args_info=ms.arg_info.ArgInfo.from_prim_func(mod["main"]))


def test_compile_tir_returns_the_committed_schedule_for_its_target_only(
        db_url: str, hand_schedule: tuple[Any, Any]) -> None:
    mod, sch = hand_schedule
    znver5, skylake = make_target(ZNVER5), make_target(SKYLAKE)
    with Store(db_url) as store:
        db = TunefarmDatabase(store)
        assert not db.has_workload(mod) and len(db) == 0
        rec = _record(db, mod, sch, znver5, [2e-5, 1e-5, 3e-5])
        assert db.has_workload(mod) and db.commit_workload(mod).same_as(rec.workload)
        db.commit_tuning_record(rec)
        assert len(db) == 1

        got = ms.tir_integration.compile_tir(db, mod, znver5)
        assert got is not None and structural_equal(got.mod, sch.mod)
        assert ms.tir_integration.compile_tir(db, mod, skylake) is None  # built-in query: a hit
        assert db.query_tuning_record(mod, znver5, "main") is not None
        assert db.query_schedule(mod, tvm.target.Target(znver5, host=znver5), "main") is not None
        assert TunefarmDatabase(store, device_key="board-1").query_schedule(
            mod, znver5, "main") is None  # same target JSON, another device

        (row,) = store.records()
        assert row.invalidity is Invalidity.OK and row.median_s == pytest.approx(2e-5)
        assert row.latencies == pytest.approx([2e-5, 1e-5, 3e-5]) and row.cv is not None
        assert row.cand_hash == shash_hex(sch.mod) and row.space == "metaschedule"
        wl_row = store.get_workload(row.workload_id)
        assert wl_row is not None and wl_row.op == "tir"
        assert wl_row.key == f"tir-{identity_hash(mod)}"
        assert wl_row.flops == 2 * 64**3
        tgt = store.get_target(row.target_id)
        assert tgt is not None and tgt.target_json == canonical_target_json(znver5)

        top = db.get_top_k(db.commit_workload(mod), 5)
        assert len(top) == 1 and [float(s) for s in top[0].run_secs] == pytest.approx(
            [2e-5, 1e-5, 3e-5])
        assert len(db.get_all_tuning_records()) == 1

    with Store(db_url) as reopened:  # a new Store on the same URL still finds it
        db2 = TunefarmDatabase(reopened)
        got = ms.tir_integration.compile_tir(db2, mod, make_target(ZNVER5))
        assert got is not None and structural_equal(got.mod, sch.mod)
        assert ms.tir_integration.compile_tir(db2, mod, make_target(SKYLAKE)) is None


def test_failed_runs_and_target_bound_views(db_url: str, hand_schedule: tuple[Any, Any]) -> None:
    mod, sch = hand_schedule
    znver5, skylake = make_target(ZNVER5), make_target(SKYLAKE)
    with Store(db_url) as store:
        db = TunefarmDatabase(store)
        db.commit_tuning_record(_record(db, mod, sch, skylake, [1e10]))  # MetaSchedule: failed
        assert len(db) == 1 and db.query_tuning_record(mod, skylake, "main") is None
        (row,) = store.records()
        assert row.invalidity is Invalidity.RUN_ERROR and row.median_s is None
        assert row.latencies == [1e10]  # kept as committed

        plain = Schedule(mod)  # a barely scheduled program, slower, on znver5
        plain.get_sblock("C")
        db.commit_tuning_record(_record(db, mod, plain, znver5, [5e-4]))
        bound = TunefarmDatabase(store, target=skylake)
        assert len(bound) == 1 and bound.get_top_k(bound.commit_workload(mod), 3) == []
        top = TunefarmDatabase(store, target=znver5).get_top_k(db.commit_workload(mod), 3)
        assert len(top) == 1


def test_workloads_stored_by_other_components_are_matched(
        store: Store, hand_schedule: tuple[Any, Any]) -> None:
    mod, _ = hand_schedule
    wid = store.ensure_workload(key="matmul-64-f32", op="matmul", spec_json=json.dumps({"n": 64}),
                                shash=shash_hex(mod), mod_json=save_json(mod),
                                description="matmul", flops=2 * 64**3)
    db = TunefarmDatabase(store)
    assert db.has_workload(matmul())  # a fresh but structurally equal module
    db.commit_workload(matmul())
    assert [w.id for w in store.workload_by_shash(shash_hex(mod))] == [wid]  # no duplicate
    assert not db.has_workload(matmul(32))
