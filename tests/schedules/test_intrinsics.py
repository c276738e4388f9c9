"""The activation intrinsics GEMM epilogues tensorize with (erf, tanh, sigmoid over 16 lanes):
their polynomial implementations against the exact functions, over the range that matters and
beyond it."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from schedules.intrinsics import ACTIVATIONS, activation_f32, use
from tests.support.targets import RUN_X86
from tuner.core import tvm_api as tv

N = 16 * 1024


def _exact(fn: str, x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    if fn == "erf":
        return np.vectorize(math.erf)(x64)
    if fn == "tanh":
        return np.tanh(x64)
    return 1.0 / (1.0 + np.exp(-x64))


def _kernel(fn: str, lanes: int = 16) -> Any:
    x = tv.te.placeholder((N,), "float32", name="x")
    y = tv.te.compute((N,), lambda i: getattr(tv.tvm.tirx, fn)(x[i]), name="y")
    sch = tv.Schedule(tv.te.create_prim_func([x, y]))
    _, lane = sch.split(sch.get_loops(sch.get_sblock("y"))[0], [None, lanes])
    sch.tensorize(lane, use(activation_f32(fn, lanes)))
    return sch, tv.compile_module(sch.mod, tv.make_target(RUN_X86))


@pytest.mark.parametrize("lanes", [16, 8])
@pytest.mark.parametrize("fn", ACTIVATIONS)
def test_activation_intrinsics_match_the_exact_functions(fn: str, lanes: int) -> None:
    sch, rt = _kernel(fn, lanes)
    assert f"T.{fn}(" not in sch.mod.script()  # the polynomial replaced the call
    rng = np.random.default_rng(0)
    x = np.concatenate([np.linspace(-6, 6, N // 2), rng.normal(0, 3, N // 4),
                        rng.uniform(-1e-3, 1e-3, N // 8), [0.0, -0.0, 1e-30, -1e-30, 20.0,
                                                          -20.0, 90.0, -90.0],
                        np.full(N // 8 - 8, 0.05)]).astype(np.float32)
    dev = tv.tvm.cpu(0)
    out = tv.tvm.runtime.tensor(np.zeros(N, np.float32), dev)
    rt["main"](tv.tvm.runtime.tensor(x, dev), out)
    exact = _exact(fn, x)
    err = np.abs(out.numpy().astype(np.float64) - exact)
    assert err.max() < (4e-7 if fn == "erf" else 5e-7), (fn, float(err.max()),
                                                         float(x[err.argmax()]))
    if fn == "erf":  # the rational form keeps its relative precision everywhere, 0 included
        nonzero = x != 0
        rel = err[nonzero] / np.abs(exact[nonzero])
        assert rel.max() < 4e-7, float(rel.max())
        assert out.numpy()[x == 0].tolist() == [0.0, 0.0]
    # erf and tanh near 0 (about proportional to x there): their relative precision holds
    if fn != "sigmoid":
        small = np.abs(x) < 1e-3
        rel = err[small] / np.maximum(np.abs(_exact(fn, x[small])), 1e-30)
        assert rel.max() < 1e-5, (fn, float(rel.max()))


@pytest.mark.parametrize(("kind", "n", "lanes"), [("max", 197, 16), ("sum", 197, 16),
                                                  ("sum", 17, 16), ("max", 129, 8),
                                                  ("sum", 4095, 16)])
def test_whole_row_reductions_count_every_element_once(kind: str, n: int, lanes: int) -> None:
    """S[r] = max/sum of X[r, 0:n], tensorized a row at a time: the partial last vector
    overlaps the one before it, and its lanes already counted must not count twice."""
    from schedules.row_intrinsics import ROW_MAX, ROW_SUM

    rows = 6
    x = tv.te.placeholder((rows, n), "float32", name="x")
    k = tv.te.reduce_axis((0, n), name="k")
    red = tv.te.max if kind == "max" else tv.te.sum
    s = tv.te.compute((rows,), lambda r: red(x[r, k], axis=k), name="s")
    sch = tv.Schedule(tv.te.create_prim_func([x, s]))
    name = (ROW_MAX if kind == "max" else ROW_SUM).format(lanes=lanes, n=n)
    sch.tensorize(sch.get_loops(sch.get_sblock("s"))[-1], use(name))
    rt = tv.compile_module(sch.mod, tv.make_target(RUN_X86))
    data = np.random.default_rng(n).normal(0, 1, (rows, n)).astype(np.float32)
    data[0] = 1.0  # a count: each element once, none twice
    data[1, -1] = 50.0  # the maximum in the partial vector's last lane
    data[2, 0] = 60.0  # and in the first vector
    dev = tv.tvm.cpu(0)
    out = tv.tvm.runtime.tensor(np.zeros(rows, np.float32), dev)
    rt["main"](tv.tvm.runtime.tensor(data, dev), out)
    want = data.max(1) if kind == "max" else data.astype(np.float64).sum(1)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-4)
    if kind == "sum":
        assert out.numpy()[0] == n


def test_a_trace_registers_the_whole_row_intrinsics_it_names_within_bounds() -> None:
    from schedules.intrinsics import register_for_trace

    def known(name: str) -> bool:
        return tv.tvm.s_tir.TensorIntrin.get(name, allow_missing=True) is not None

    register_for_trace('["Tensorize", "row_sum_f32x8_n203", "exp_sub_f32x8_n203", '
                       '"div_bcast_div_f32x8_n203"]')
    assert known("row_sum_f32x8_n203") and known("exp_sub_f32x8_n203")
    assert known("div_bcast_div_f32x8_n203")
    # a stored trace is input: a row too long, a multiple of the lanes, or lanes TVM's
    # templates never use build nothing (the replay then reports the missing intrinsic)
    register_for_trace('"row_max_f32x16_n999999999" "row_max_f32x16_n64" "row_max_f32x5_n17"')
    assert not any(known(n) for n in ("row_max_f32x16_n999999999", "row_max_f32x16_n64",
                                      "row_max_f32x5_n17"))
    with pytest.raises(KeyError, match="no tunefarm intrinsic"):
        use("row_max_f32x16_n64")


LAZY_X86 = r"""
import sys
from tuner.measure.sandbox import warm_imports
warm_imports()  # what a build or measuring process imports before its first candidate
from schedules.intrinsics import register_for_trace
from tuner.core import tvm_api as tv
from tuner.workloads import parse_spec

def loaded():
    return "tvm.s_tir.tensor_intrin.x86" in sys.modules

seen = [loaded()]
register_for_trace('["Tensorize", "dot_16x4_vnni_llvm22"]')  # tunefarm's own VNNI dot
seen.append(loaded())
register_for_trace('["Tensorize", "dot_16x4_vnni"]')  # TVM's, as the default x86 rules name it
seen.append(loaded() and tv.tvm.s_tir.TensorIntrin.get("dot_16x4_vnni", allow_missing=True)
            is not None)
print(seen)
w = parse_spec({"op": "dense_int8", "shape": [32, 64, 64]})
ctx = tv.tune_context(w.mod(), tv.make_target({"kind": "llvm", "mcpu": "znver4"}),
                      space="post-order-apply", strategy="replay-trace", seed=0, num_threads=1)
print(any("dot_16x4_vnni" in str(s.trace) for s in ctx.generate_design_space()))
"""


def test_tvm_x86_intrinsics_load_only_where_a_trace_or_the_default_rules_name_them() -> None:
    # parsing them costs every build and measuring process 0.25-0.45 s of its start; MetaSchedule's
    # default x86 rules fail without them ("TensorIntrin 'dot_16x4_vnni' is not registered")
    repo = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, "-c", LAZY_X86], cwd=repo, capture_output=True,
                         text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["[False,", "False,", "True]", "True"]
