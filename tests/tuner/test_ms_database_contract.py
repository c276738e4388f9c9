"""TunefarmDatabase keeps the contract of MetaSchedule's built-in databases.

The project's own tests of what TVM's `test_meta_schedule_database.py` checks of a database
(round trip, has_workload, top-k order and validity, reload, union databases, the query kinds,
`Database.current()`, the three module equalities), most of them differential: the same calls
on TVM's `MemoryDatabase` and on a `TunefarmDatabase` must give the same answers. Each test runs
on a fresh SQLite file and on PostgreSQL.
"""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuner.core.tvm_api import (
    Schedule,
    host_target_dict,
    make_target,
    ms,
    structural_equal,
    te,
    tvm,
)
from tuner.db import Store
from tuner.db.ms_lookup import module_hash
from tuner.interop.ms_database import FAILED_RUN_S, TunefarmDatabase
from tuner.measure import Invalidity

LLVM = {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}
N = 32


def _matmul_then(epilogue: str | None, n: int = N) -> Any:
    """C = A·B, then relu(C) or C + E (a fused task; the block named after it), one PrimFunc."""
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    if epilogue is None:
        return tvm.IRModule({"main": te.create_prim_func([a, b, c])})
    if epilogue == "relu":
        d = te.compute((n, n), lambda i, j: te.max(c[i, j], tvm.tirx.const(0.0, "float32")),
                       name="relu")
        return tvm.IRModule({"main": te.create_prim_func([a, b, d])})
    e = te.placeholder((n, n), name="E")
    d = te.compute((n, n), lambda i, j: c[i, j] + e[i, j], name="add")
    return tvm.IRModule({"main": te.create_prim_func([a, b, e, d])})


def _tiled(mod: Any, block: str = "C", lanes: int = 8, epilogue: str | None = None) -> Any:
    """A real schedule of the matmul `block` (tiles, reorder, a vectorized inner loop), the
    `epilogue` block, if named, computed under its tiles."""
    sch = Schedule(mod)
    i, j, kk = sch.get_loops(sch.get_sblock(block))
    i0, i1 = sch.split(i, [None, 4])
    j0, j1 = sch.split(j, [None, lanes])
    sch.reorder(i0, j0, kk, i1, j1)
    sch.vectorize(j1)
    if epilogue is not None:
        sch.reverse_compute_at(sch.get_sblock(epilogue), j0)
    return sch


def _record(db: Any, mod: Any, trace: Any, run_secs: list[float] | None,
            target: Any = None) -> Any:
    return ms.database.TuningRecord(
        trace, db.commit_workload(mod), run_secs, target or make_target(LLVM),
        ms.arg_info.ArgInfo.from_prim_func(mod["main"]))


def _commit_all(dbs: tuple[Any, ...], mod: Any, trace: Any,
                runs: list[list[float] | None]) -> None:
    """The same records, in the same order, into each database."""
    for db in dbs:
        for secs in runs:
            db.commit_tuning_record(_record(db, mod, trace, secs))


def _secs(records: list[Any]) -> list[list[float] | None]:
    return [None if r.run_secs is None else [float(x) for x in r.run_secs] for r in records]


@pytest.fixture
def tf(store: Store) -> TunefarmDatabase:
    return TunefarmDatabase(store)


def test_a_record_round_trips(tf: Any) -> None:
    mod = _matmul_then(None)
    rec = _record(tf, mod, _tiled(mod).trace, [1.5, 2.5, 1.8])
    tf.commit_tuning_record(rec)
    (got,) = tf.get_top_k(tf.commit_workload(mod), 3)
    assert str(got.trace) == str(rec.trace) and str(got.run_secs) == str(rec.run_secs)
    assert str(got.target) == str(rec.target)
    assert structural_equal(got.workload.mod, rec.workload.mod)
    assert [str(a.as_json()) for a in got.args_info] == [str(a.as_json()) for a in rec.args_info]
    again = ms.database.TuningRecord.from_json(got.as_json(), got.workload)
    assert str(again.trace) == str(rec.trace)


def test_has_workload_and_a_missing_workload(tf: Any) -> None:
    mod, other = _matmul_then(None), _matmul_then("relu")
    tf.commit_tuning_record(_record(tf, mod, _tiled(mod).trace, [1.5]))
    assert len(tf) == 1 and tf.has_workload(mod) and not tf.has_workload(other)
    assert tf.get_top_k(tf.commit_workload(other), 3) == []


SORTING = [[7.0, 8.0, 9.0], [1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [1.1, 1.2, 600.0],
           [1.0, 100.0, 6.0], [4.0, 9.0, 8.0]]


def test_records_rank_by_mean_run_time_and_survive_a_reload(store: Store) -> None:
    mod = _matmul_then(None)
    trace = _tiled(mod).trace
    tf, mem = TunefarmDatabase(store), ms.database.MemoryDatabase()
    _commit_all((tf, mem), mod, trace, SORTING)
    expect = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]  # means 2 and 5; [1.1, 1.2, 600] has median 1.2
    assert _secs(mem.get_top_k(mem.commit_workload(mod), 2)) == expect
    assert _secs(tf.get_top_k(tf.commit_workload(mod), 2)) == expect
    with Store(store.url) as again:  # a new process's view of the same database
        fresh = TunefarmDatabase(again)
        assert _secs(fresh.get_top_k(fresh.commit_workload(mod), 2)) == expect
        by_median = TunefarmDatabase(again, ranking="median")  # tunefarm's rule, asked for
        assert _secs(by_median.get_top_k(by_median.commit_workload(mod), 1)) == [SORTING[3]]
    with pytest.raises(ValueError, match="ranking"):
        TunefarmDatabase(store, ranking="fastest")  # type: ignore[arg-type]


TOP_K_RUNS = [[1.5, 4.5], [], [0.0, 2.0], None, [2.0], [3.0, 1e10], [1e10]]


@pytest.mark.parametrize("k", [0, 1, 4, 5, 7])
def test_top_k_validity_and_order_match_memory_database(store: Store, k: int) -> None:
    mod = _matmul_then(None)
    trace = _tiled(mod).trace
    tf, mem = TunefarmDatabase(store), ms.database.MemoryDatabase()
    _commit_all((tf, mem), mod, trace, TOP_K_RUNS)
    want = [[0.0, 2.0], [2.0], [1.5, 4.5], [3.0, 1e10]][:k]
    assert _secs(mem.get_top_k(mem.commit_workload(mod), k)) == want
    assert _secs(tf.get_top_k(tf.commit_workload(mod), k)) == want
    assert len(tf) == len(mem) == len(TOP_K_RUNS)  # the invalid ones are kept all the same
    assert _secs(tf.get_all_tuning_records()) == _secs(mem.get_all_tuning_records())


def test_a_negative_top_k_is_refused(tf: Any) -> None:
    mod = _matmul_then(None)
    with pytest.raises(ValueError, match="non-negative"):
        tf.get_top_k(tf.commit_workload(mod), -1)


def test_what_is_committed_is_kept_as_committed(tf: Any, store: Store) -> None:
    mod = _matmul_then(None)
    rec = _record(tf, mod, _tiled(mod).trace, [3.0, 1e10])
    tf.commit_tuning_record(rec)
    tf.commit_tuning_record(rec)  # the same record twice: two records, as in TVM
    for secs in (None, [], [1e10], [2e9]):
        tf.commit_tuning_record(_record(tf, mod, _tiled(mod).trace, secs))
    assert len(tf) == 6
    assert _secs(tf.get_all_tuning_records()) == [[3.0, 1e10], [3.0, 1e10], None, [], [1e10],
                                                  [2e9]]
    assert _secs(tf.get_top_k(tf.commit_workload(mod), 10)) == [[2e9], [3.0, 1e10],
                                                                 [3.0, 1e10]]
    rows = store.records()
    assert [r.invalidity for r in rows] == [Invalidity.OK] * 2 + [Invalidity.RUN_ERROR] * 3 + [
        Invalidity.OK]
    assert rows[0].median_s == 3.0 and rows[0].mean_s == pytest.approx((3.0 + 1e10) / 2)


def test_an_empty_trace_never_wins(tf: Any) -> None:
    mod = _matmul_then(None)
    target = make_target(LLVM)
    mem = ms.database.MemoryDatabase()
    sch = _tiled(mod)
    for db in (tf, mem):
        db.commit_tuning_record(_record(db, mod, sch.trace, [1.0]))
        db.commit_tuning_record(_record(db, mod, Schedule(mod).trace, [0.2]))  # faster, empty
        rec = db.query(mod, target, workload_name="main", kind="record")
        assert rec is not None and _secs([rec]) == [[1.0]]
        got = db.query(mod, target, workload_name="main", kind="schedule")
        assert got is not None and structural_equal(got.mod, sch.mod)
        ir = db.query(mod, target, workload_name="main", kind="ir_module")
        assert ir is not None and structural_equal(ir, sch.mod)


def test_union_databases_take_it_like_any_database(tf: Any) -> None:
    mod = _matmul_then(None)
    target = make_target(LLVM)
    trace = _tiled(mod).trace
    mem = ms.database.MemoryDatabase()
    tf.commit_tuning_record(_record(tf, mod, trace, [1.0]))
    mem.commit_tuning_record(_record(mem, mod, trace, [0.5]))

    def best(db: Any) -> float:
        rec = db.query_tuning_record(mod, target, "main")
        return float(rec.run_secs[0])

    assert best(tf) == 1.0
    assert best(ms.database.UnionDatabase(tf, mem)) == 0.5
    assert best(ms.database.OrderedUnionDatabase(tf, mem)) == 1.0
    assert best(ms.database.OrderedUnionDatabase(mem, tf)) == 0.5


def test_it_is_the_current_database_inside_with(tf: Any) -> None:
    with tf:
        assert ms.database.Database.current().same_as(tf)


@pytest.mark.parametrize("mode", ["structural", "ignore-tensor", "anchor-block"])
def test_commit_workload_under_each_module_equality(store: Store, mode: str) -> None:
    tf = TunefarmDatabase(store, module_equality=mode)
    mod = _matmul_then("relu")
    wl = tf.commit_workload(mod)
    assert tf.commit_workload(_matmul_then("relu")).same_as(wl)
    mem = ms.database.MemoryDatabase(module_equality=mode)
    mem.commit_workload(mod)
    add = _matmul_then("add")
    assert tf.has_workload(add) == mem.has_workload(add) == (mode == "anchor-block")
    assert module_hash(mod, mode) == f"{int(mem.commit_workload(mod).as_json()[0]):016x}"
    with pytest.raises(ValueError, match="module_equality"):
        TunefarmDatabase(store, module_equality="names")


def test_reads_are_scoped_to_the_device_key(store: Store) -> None:
    mod = _matmul_then(None)
    trace = _tiled(mod).trace
    board_a, board_b = TunefarmDatabase(store, "board-a"), TunefarmDatabase(store, "board-b")
    board_a.commit_tuning_record(_record(board_a, mod, trace, [1.0]))
    for secs in ([2.0], [3.0]):
        board_b.commit_tuning_record(_record(board_b, mod, trace, secs))
    assert (len(board_a), len(board_b), len(TunefarmDatabase(store, None))) == (1, 2, 3)
    assert _secs(board_a.get_top_k(board_a.commit_workload(mod), 5)) == [[1.0]]
    assert _secs(board_b.get_all_tuning_records()) == [[2.0], [3.0]]
    assert board_b.query_tuning_record(mod, make_target(LLVM), "main").run_secs[0].value == 2.0
    every = TunefarmDatabase(store, None)
    assert _secs(every.get_top_k(every.commit_workload(mod), 5)) == [[1.0], [2.0], [3.0]]


def test_queries_are_per_target_unless_asked_otherwise(tf: Any, store: Store) -> None:
    mod = _matmul_then(None)
    tf.commit_tuning_record(_record(tf, mod, _tiled(mod).trace, [1.0]))
    other = make_target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})
    assert tf.query_tuning_record(mod, other, "main") is None
    assert ms.database.MemoryDatabase().query_tuning_record(mod, other, "main") is None
    anywhere = TunefarmDatabase(store, any_target=True)
    assert anywhere.query_tuning_record(mod, other, "main") is not None


RUNS = st.one_of(st.none(), st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 2e9, FAILED_RUN_S]),
                                     max_size=3))


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(runs=st.lists(st.tuples(RUNS, st.booleans()), max_size=8), k=st.integers(0, 9))
def test_any_sequence_of_commits_reads_back_as_memory_database_does(
        store: Store, runs: list[tuple[list[float] | None, bool]], k: int) -> None:
    mod = _matmul_then(None)
    tiled, empty = _tiled(mod).trace, Schedule(mod).trace
    tf = TunefarmDatabase(store, f"ex-{uuid.uuid4().hex[:8]}")  # a device of its own
    mem = ms.database.MemoryDatabase()
    for db in (tf, mem):
        for secs, is_empty in runs:
            db.commit_tuning_record(_record(db, mod, empty if is_empty else tiled, secs))
    assert len(tf) == len(mem)
    assert _secs(tf.get_all_tuning_records()) == _secs(mem.get_all_tuning_records())
    top_tf, top_mem = tf.get_top_k(tf.commit_workload(mod), k), mem.get_top_k(
        mem.commit_workload(mod), k)
    assert _secs(top_tf) == _secs(top_mem)
    assert [str(r.trace) for r in top_tf] == [str(r.trace) for r in top_mem]


def test_a_trace_of_the_anchor_block_alone_replays_onto_another_epilogue(store: Store) -> None:
    relu, add = _matmul_then("relu"), _matmul_then("add")
    target = make_target(LLVM)
    db = TunefarmDatabase(store, module_equality="anchor-block")
    db.commit_tuning_record(_record(db, relu, _tiled(relu).trace, [1e-5]))
    rec = db.query_tuning_record(add, target, "main")  # it names only block "C": replayed
    assert rec is not None and structural_equal(rec.workload.mod, add)


def test_anchor_block_lets_another_epilogue_reuse_a_schedule(store: Store) -> None:
    relu, add = _matmul_then("relu"), _matmul_then("add")
    target = make_target(host_target_dict())  # built and run below
    tuned = _tiled(relu, epilogue="relu")  # the trace names block "relu"
    TunefarmDatabase(store).commit_tuning_record(
        _record(TunefarmDatabase(store), relu, tuned.trace, [1e-5], target))

    assert TunefarmDatabase(store).query_tuning_record(add, target, "main") is None
    anchor = TunefarmDatabase(store, module_equality="anchor-block")
    assert anchor.has_workload(add)
    (top,) = anchor.get_top_k(anchor.commit_workload(add), 3)
    assert structural_equal(top.workload.mod, relu)  # TVM's answer: the record as stored
    rec = anchor.query_tuning_record(add, target, "main")
    assert rec is not None and structural_equal(rec.workload.mod, relu)
    sch = anchor.query_schedule(add, target, "main")  # the anchor trace applied to `add`
    assert sch is not None and "E" in sch.mod.script()

    rng = np.random.default_rng(0)
    a, b, e = (rng.standard_normal((N, N)).astype("float32") for _ in range(3))
    lib = tvm.compile(sch.mod, target=target)
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(x, dev) for x in (a, b, e)]
    out = tvm.runtime.tensor(np.zeros((N, N), "float32"), dev)
    lib["main"](*args, out)
    np.testing.assert_allclose(out.numpy(), a @ b + e, rtol=1e-4, atol=1e-4)


def test_relax_builds_a_fused_task_with_the_schedule_of_another_epilogue(store: Store) -> None:
    """The reason for "anchor-block": a schedule tuned for relax's `fused_matmul_relu` serves
    the `fused_matmul_add` of another model through `MetaScheduleApplyDatabase`."""
    from tvm import relax

    from bench.fused import fuse, model, tasks

    m = n = k = 64
    target = make_target(host_target_dict())
    (task,) = tasks({"x": (m, k), "w": (k, n)}, {},
                    lambda bb, x, w: relax.op.nn.relu(relax.op.matmul(x, w))).values()
    sch = _tiled(task, "matmul", 16, epilogue="compute")  # relax's name for the relu block
    writer = TunefarmDatabase(store)
    writer.commit_tuning_record(_record(writer, tvm.IRModule({"main": task}), sch.trace, [1e-5],
                                        target))

    other = fuse()(model({"x": (m, k), "w": (k, n), "b": (n,)},
                         lambda bb, x, w, b: relax.op.add(relax.op.matmul(x, w), b)))
    scheduled = {}
    for mode in ("structural", "anchor-block"):
        with target, TunefarmDatabase(store, module_equality=mode):
            applied = relax.transform.MetaScheduleApplyDatabase()(other)
        (func,) = [f for f in applied.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
        scheduled[mode] = bool(func.attrs.get("tirx.is_scheduled", False))
    assert scheduled == {"structural": False, "anchor-block": True}
    assert "T.vectorized(T.int64(16))" in func.script()  # the tuned tiles

    vm = relax.VirtualMachine(tvm.compile(applied, target=target), tvm.cpu())
    rng = np.random.default_rng(0)
    x, w = (rng.uniform(-1, 1, (64, 64)).astype("float32") for _ in range(2))
    b = rng.uniform(-1, 1, (64,)).astype("float32")
    got = vm["main"](*(tvm.runtime.tensor(v) for v in (x, w, b))).numpy()
    np.testing.assert_allclose(got, x @ w + b, rtol=1e-4, atol=1e-4)
