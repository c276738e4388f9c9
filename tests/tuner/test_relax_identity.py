"""One identity with relax: the PrimFunc relax legalization writes for a computation (int64
indices, its own names, no `layout_free_buffers`) has the identity of the op spec that makes the
same computation, and a pipeline building a relax model through `MetaScheduleApplyDatabase` with
`TunefarmDatabase` gets the schedule `tunefarm tune` found."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tuner.core.tvm_api import make_target, ms, shash_hex, tvm
from tuner.workloads import parse_spec
from tuner.workloads.identity import identity_hash, normal_form, same_computation

REPO = Path(__file__).resolve().parents[2]


def relax_matmul_task(m: int, n: int, k: int, *, dtype: str = "float32") -> Any:
    """The PrimFunc relax extracts for `R.matmul(x[m,k], w[k,n])`, legalized."""
    from tvm import relax

    from bench.fused import model

    mod = model({"x": (m, k), "w": (k, n)}, lambda bb, x, w: relax.op.matmul(x, w), dtype)
    (task,) = ms.relax_integration.extract_tasks(relax.transform.LegalizeOps()(mod),
                                                 make_target("host"))
    return task.dispatched[0]["main"]


@pytest.mark.parametrize("shape", [(512, 512, 512), (100, 1000, 300), (1, 64, 7)])
def test_relax_matmul_has_the_identity_of_the_op_spec(shape: tuple[int, int, int]) -> None:
    func = relax_matmul_task(*shape)
    assert "int64" in func.script()  # what relax sends: int64 loops and shapes
    spec = parse_spec({"op": "matmul", "shape": list(shape)})
    assert shash_hex(tvm.IRModule({"main": func})) != shash_hex(spec.mod())  # spelled otherwise
    assert identity_hash(func) == spec.shash()
    assert same_computation(func, spec.mod())
    other = parse_spec({"op": "matmul", "shape": [shape[0], shape[1], shape[2] + 1]})
    assert not same_computation(func, other.mod()) and identity_hash(func) != other.shash()
    dense = parse_spec({"op": "dense", "shape": list(shape)})  # X·Wᵀ: another computation
    assert identity_hash(func) != dense.shash()


def test_normal_form_keeps_what_changes_the_computation() -> None:
    func = relax_matmul_task(64, 64, 64)
    norm = normal_form(func)["main"]
    assert "int64" not in norm.script() and dict(norm.attrs)["global_symbol"] == "main"
    assert identity_hash(relax_matmul_task(64, 64, 64, dtype="float16")) != identity_hash(func)


def test_int64_data_keeps_int64_indices() -> None:
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def scale(a: T.Buffer((T.int64(8),), "int64"), b: T.Buffer((T.int64(8),), "int64")) -> None:
        for i in range(T.int64(8)):
            with T.sblock("b"):
                vi = T.axis.spatial(T.int64(8), i)
                b[vi] = a[vi] * T.int64(3000000000)

    assert "int64(8)" in normal_form(scale)["main"].script()  # TVM's narrowing refuses it
    assert identity_hash(scale) == identity_hash(scale.with_attr("global_symbol", "other"))


def test_a_submitted_relax_function_is_keyed_and_tuned_as_int32() -> None:
    func = relax_matmul_task(32, 48, 16)
    w = parse_spec({"op": "tir", "tvmscript": func.script()})
    spec = parse_spec({"op": "matmul", "shape": [32, 48, 16]})
    assert w.key == f"tir-{spec.shash()}" and w.shash() == spec.shash()
    assert "int64" not in w.prim_func().script()  # traces are recorded on the int32 spelling


def _commit(db: Any, mod: Any, sch: Any, target: Any, secs: float) -> None:
    db.commit_tuning_record(ms.database.TuningRecord(
        trace=sch.trace, workload=db.commit_workload(mod), run_secs=[secs], target=target,
        args_info=ms.arg_info.ArgInfo.from_prim_func(mod["main"])))


def test_a_record_of_another_spelling_is_answered_only_if_it_replays(store: Any) -> None:
    from tuner.core.tvm_api import Schedule, structural_equal
    from tuner.interop.ms_database import TunefarmDatabase

    target = make_target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})
    spec = parse_spec({"op": "matmul", "shape": [64, 64, 64]})
    relax_mod = tvm.IRModule({"main": relax_matmul_task(64, 64, 64)})
    db = TunefarmDatabase(store)
    by_name = Schedule(spec.mod())  # names the op spec's block "C": relax's is "matmul"
    _, j, _ = by_name.get_loops(by_name.get_sblock("C"))
    by_name.vectorize(by_name.split(j, [None, 16])[1])
    _commit(db, spec.mod(), by_name, target, 1e-5)
    assert db.has_workload(relax_mod)
    assert db.query_tuning_record(relax_mod, target, "matmul") is None  # cannot replay: none
    assert db.query_tuning_record(spec.mod(), target, "main") is not None  # its own spelling

    nameless = Schedule(spec.mod())  # the block found by position: replays onto both
    blk = nameless.get_child_blocks(nameless.get_sblock("root"))[0]
    _, j, _ = nameless.get_loops(blk)
    nameless.vectorize(nameless.split(j, [None, 8])[1])
    _commit(db, spec.mod(), nameless, target, 2e-5)  # slower, but the one that replays
    rec = db.query_tuning_record(relax_mod, target, "matmul")
    assert rec is not None and structural_equal(rec.workload.mod, relax_mod)
    assert [float(x) for x in rec.run_secs] == pytest.approx([2e-5])
    sch = db.query_schedule(relax_mod, target, "matmul")
    assert sch is not None and "int64" in sch.mod.script()  # replayed onto relax's function


# The Done-when check of issue 11, small: tune with the CLI, then build a relax model in a fresh
# process through MetaScheduleApplyDatabase + TunefarmDatabase.
APPLY = r"""
import json, sys
import numpy as np
from tvm import relax
from tuner.db import Store
from tuner.interop.ms_database import TunefarmDatabase
from tuner.core.tvm_api import make_target, ms, structural_equal, trace_to_json, tvm
from schedules.registry import replay
from bench.fused import model

url, m, n, k = sys.argv[1], *map(int, sys.argv[2:5])
target = make_target("host")
mod = model({"x": (m, k), "w": (k, n)}, lambda bb, x, w: relax.op.matmul(x, w))
mod = relax.transform.LegalizeOps()(mod)
db = TunefarmDatabase(Store(url))
(task,) = ms.relax_integration.extract_tasks(mod, target)
rec = db.query_tuning_record(task.dispatched[0], target, task.task_name)
with target, db:
    applied = relax.transform.MetaScheduleApplyDatabase()(mod)
(name,) = [gv.name_hint for gv, f in applied.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
func = applied[name]
expected = replay(task.dispatched[0], trace_to_json(rec.trace)).mod["main"]
vm = relax.VirtualMachine(tvm.compile(applied, target=target), tvm.cpu())
rng = np.random.default_rng(0)
a = rng.uniform(-1, 1, (m, k)).astype("float32")
b = rng.uniform(-1, 1, (k, n)).astype("float32")
got = vm["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b)).numpy()
print(json.dumps({
    "has_workload": db.has_workload(task.dispatched[0]),
    "scheduled": bool(func.attrs.get("tirx.is_scheduled", False)),
    "record_of_the_query": structural_equal(rec.workload.mod, task.dispatched[0]),
    "same_as_replayed_record": structural_equal(func.body, expected.body),
    "max_err": float(np.abs(got - a.astype("float64") @ b.astype("float64")).max()),
}))
"""


@pytest.mark.slow
def test_tuned_matmul_is_found_and_applied_by_relax(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tf.db'}"
    m = n = k = 128
    tune = subprocess.run(
        [sys.executable, "-m", "tuner", "tune", "matmul", "--shape", f"{m},{n},{k}",
         "--trials", "8", "--db", url],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert tune.returncode == 0, tune.stdout[-2000:] + tune.stderr[-2000:]
    run = subprocess.run([sys.executable, "-c", APPLY, url, str(m), str(n), str(k)], cwd=REPO,
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["has_workload"] and got["scheduled"] and got["record_of_the_query"], got
    assert got["same_as_replayed_record"], got  # the tuned schedule, not relax's naive loops
    assert got["max_err"] < 1e-3, got
    timed = subprocess.run([sys.executable, "-m", "bench.relax_apply", "--n", str(m), "--db", url],
                           cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert timed.returncode == 0, timed.stderr[-3000:]
    assert timed.stdout.count("found True") == 2, timed.stdout  # weight a parameter, and bound


def test_a_workload_another_process_commits_later_is_found(store: Any) -> None:
    from tuner.core.tvm_api import Schedule
    from tuner.interop.ms_database import TunefarmDatabase

    target = make_target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})
    spec = parse_spec({"op": "matmul", "shape": [32, 32, 32]})
    relax_mod = tvm.IRModule({"main": relax_matmul_task(32, 32, 32)})
    reader, writer = TunefarmDatabase(store), TunefarmDatabase(store)
    assert not reader.has_workload(relax_mod) and not reader.has_workload(spec.mod())
    sch = Schedule(spec.mod())  # a one-instruction trace (an empty one is no valid record)
    sch.get_child_blocks(sch.get_sblock("root"))
    _commit(writer, spec.mod(), sch, target, 1e-5)  # after the reader looked
    assert reader.has_workload(relax_mod) and reader.has_workload(spec.mod())
    assert reader.query_tuning_record(relax_mod, target, "matmul") is not None


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_relax_conv2d_has_the_identity_of_the_op_spec(layout: str) -> None:
    from tvm import relax

    from bench.fused import tasks

    spec = {"op": "conv2d", "shape": [1, 16, 14, 14, 32, 3, 3], "padding": 1, "layout": layout}
    if layout == "NCHW":
        ins, consts = {"x": (1, 16, 14, 14)}, {"w": (32, 16, 3, 3)}
        kw: dict[str, Any] = {}
    else:
        ins, consts = {"x": (1, 14, 14, 16)}, {"w": (3, 3, 16, 32)}
        kw = {"data_layout": "NHWC", "kernel_layout": "HWIO"}
    (func,) = tasks(ins, consts, lambda bb, x, w: relax.op.nn.conv2d(x, w, padding=1, **kw),
                    bind=False).values()
    assert identity_hash(func) == parse_spec(spec).shash()


SOFTMAX = r"""
import sys
import numpy as np
from tvm import relax
from bench.fused import model
from tuner.db import Store
from tuner.interop.ms_database import TunefarmDatabase
from tuner.core.tvm_api import make_target, tvm

target = make_target("host")
cols = int(sys.argv[2])
mod = relax.transform.LegalizeOps()(
    model({"x": (64, cols)}, lambda bb, x: relax.op.nn.softmax(x, axis=-1)))
db = TunefarmDatabase(Store(sys.argv[1]))
with target, db:
    mod = relax.transform.MetaScheduleApplyDatabase()(mod)
(func,) = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
assert func.attrs.get("tirx.is_scheduled", False), "the softmax record was not applied"
x = np.random.default_rng(0).uniform(-4, 4, (64, cols)).astype("float32")
got = relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())["main"](
    tvm.runtime.tensor(x)).numpy()
e = np.exp(x.astype("float64") - x.max(axis=-1, keepdims=True))
print(float(np.abs(got - e / e.sum(axis=-1, keepdims=True)).max()))
"""


@pytest.mark.slow
@pytest.mark.parametrize("cols", [128, 197])
def test_a_record_naming_tensor_intrinsics_is_applied_in_a_fresh_relax_process(
        tmp_path: Path, cols: int) -> None:
    # softmax-x86 tensorizes with tunefarm's own intrinsics: a process that only imports
    # TunefarmDatabase must still be able to replay its records; rows of 197 use the whole-row
    # intrinsics, whose names carry the row length
    url = f"sqlite:///{tmp_path / 'tf.db'}"
    tune = subprocess.run([sys.executable, "-m", "tuner", "tune", "softmax", "--shape",
                           f"64,{cols}", "--trials", "4", "--db", url],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert tune.returncode == 0, tune.stdout[-2000:] + tune.stderr[-2000:]
    run = subprocess.run([sys.executable, "-c", SOFTMAX, url, str(cols)], cwd=REPO,
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    assert float(run.stdout.strip().splitlines()[-1]) < 1e-5
