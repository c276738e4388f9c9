"""`softmax-x86`: every sampled configuration matches the reference within the op's tolerance
(also for wide-range and masked rows), the polynomial exp replaces libm's scalar `expf`, and the
exp intrinsic's accuracy is what schedules/intrinsics.py claims. No tuning runs."""

from __future__ import annotations

import numpy as np
import pytest

from schedules.intrinsics import DIV_BCAST_F32, EXP_SUB_F32
from schedules.registry import TEMPLATES, describe
from schedules.softmax import softmax_lanes
from tests.support import guarded
from tuner.core import tvm_api as tv
from tuner.workloads import parse_spec

TARGET = {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}

_HAS = tv.tvm_ffi.get_global_func("target.llvm_cpu_has_feature")
needs_avx512 = pytest.mark.skipif(not _HAS("avx512f", tv.make_target("host")),
                                  reason="this CPU has no AVX-512: znver4 kernels cannot run")


def workload(rows: int, cols: int, dtype: str = "float32"):
    return parse_spec({"op": "softmax", "shape": [rows, cols], "dtype": dtype})


def sample(w, count: int, seed: int) -> list:
    """`count` random candidates of the template's space, postprocessed as the search does."""
    target = tv.make_target(TARGET)
    tpl = TEMPLATES["softmax-x86"]
    ctx = tv.tune_context(w.mod(), target, space=tpl.space(w, target), strategy="replay-trace",
                          seed=seed, num_threads=1)
    ctx.pre_tuning(max_trials=count, num_trials_per_iter=count,
                   design_spaces=ctx.generate_design_space())
    cands = ctx.generate_measure_candidates()
    ctx.post_tuning()
    return [c.sch for c in cands]


def run(w, rt, x: np.ndarray) -> np.ndarray:
    dev = tv.tvm.cpu(0)
    (out,) = guarded.outputs([(x.shape, "float32")], dev)
    rt["main"](tv.tvm.runtime.tensor(x, dev), out.tensor)
    return out.numpy()


def assert_close(w, got: np.ndarray, x: np.ndarray, what: str) -> None:
    ref = w.reference([x])[0]
    rtol, atol = w.tolerance()
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol, err_msg=what)


def test_registered_and_applies() -> None:
    target = tv.make_target(TARGET)
    tpl = TEMPLATES["softmax-x86"]
    assert tpl.applies(workload(1536, 128), target)
    assert softmax_lanes(48, target) == 16
    assert softmax_lanes(24, target) == 8
    assert softmax_lanes(20, target) == 4
    assert tpl.applies(workload(5, 18), target)  # off the 4 grid: whole-row intrinsics
    assert "not between one vector (16) and" in tpl.why_not(workload(5, 14), target)
    assert not tpl.applies(workload(2, 4099), target)  # beyond the longest whole row
    assert not tpl.applies(workload(8, 16, "float64"), target)
    assert not tpl.applies(workload(8, 16), tv.make_target(
        {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "num-cores": 2}))
    assert not tpl.applies(parse_spec({"op": "dense_int8", "shape": [4, 16, 16]}), target)
    knobs = describe("softmax-x86", workload(64, 128))["knobs"]
    assert {"rows", "unroll", "norm"} <= set(knobs)


@needs_avx512
@pytest.mark.parametrize(("shape", "count", "seed"), [((64, 128), 12, 0), ((6, 48), 6, 1),
                                                       ((5, 24), 4, 2), ((7, 20), 4, 3),
                                                       ((6, 18), 12, 4), ((3, 197), 4, 5)])
def test_sampled_candidates_match_reference(shape: tuple[int, int], count: int,
                                            seed: int) -> None:
    w = workload(*shape)
    x = w.make_inputs(0)[0]
    # rows of every kind: the workload's inputs, a wide range (exp underflows to 0 for most
    # entries), and masked entries (-inf, as attention masks do)
    wide = (x * 60.0).astype("float32")
    masked = x.copy()
    masked[:, ::3] = -np.inf
    schs = sample(w, count, seed)
    assert len(schs) == count
    norms = set()
    for sch in schs:
        what = str(tv.trace_decisions(sch.trace))
        rt = tv.compile_module(sch.mod, tv.make_target(TARGET))
        for inputs in (x, wide, masked):
            assert_close(w, run(w, rt, inputs), inputs, what)
        norms.add("vmulps" in rt.inspect_source("asm") and "vdivps" not in
                  rt.inspect_source("asm"))
    if count >= 12:
        assert norms == {True, False}  # both design spaces (reciprocal, divide) were sampled


@needs_avx512
def test_fast_exp_replaces_libm() -> None:
    w = workload(64, 128)
    sch = sample(w, 1, 4)[0]
    asm = tv.compile_module(sch.mod, tv.make_target(TARGET)).inspect_source("asm")
    assert "expf" not in asm  # a vector T.exp becomes one libm expf call per lane
    assert "vrndscaleps" in asm  # the polynomial's floor, on zmm registers
    # the unscheduled function calls expf: the rewrite is the schedule's, not the workload's
    plain = tv.compile_module(w.mod(), tv.make_target(TARGET)).inspect_source("asm")
    assert "expf" in plain
    replayed = tv.apply_trace(w.mod(), tv.trace_to_json(sch.trace))
    assert tv.structural_equal(replayed.mod, sch.mod)


def _exp_kernel(lanes: int, rows: int):
    """Y[i, l] = exp(X[i, l] - M[i]) tensorized with the fast exp intrinsic."""
    te = tv.te
    x = te.placeholder((rows, lanes), name="X")
    m = te.placeholder((rows,), name="M")
    y = te.compute((rows, lanes), lambda i, j: te.exp(x[i, j] - m[i]), name="Y")
    sch = tv.Schedule(te.create_prim_func([x, m, y]))
    _, j = sch.get_loops(sch.get_sblock("Y"))
    sch.tensorize(j, EXP_SUB_F32.format(lanes=lanes))
    return tv.compile_module(sch.mod, tv.make_target(TARGET))


@needs_avx512
@pytest.mark.parametrize("lanes", [4, 8, 16])
def test_fast_exp_accuracy(lanes: int) -> None:
    rows = 2048
    m = np.linspace(-1, 1, rows).astype("float32")
    x = (np.linspace(-87.3, 88.72, rows * lanes).astype("float32").reshape(rows, lanes)
         + m[:, None]).astype("float32")
    dev = tv.tvm.cpu(0)
    y = tv.tvm.runtime.empty((rows, lanes), "float32", dev)
    _exp_kernel(lanes, rows)["main"](tv.tvm.runtime.tensor(x, dev),
                                     tv.tvm.runtime.tensor(m, dev), y)
    arg = (x - m[:, None]).astype(np.float64)  # the float32 difference the kernel takes exp of
    ref = np.exp(arg)
    rel = np.abs(y.numpy() - ref) / ref
    assert rel.max() < 5e-7
    assert rel[(arg >= -2) & (arg <= 0)].max() < 2e-7
    # out of range: 0 below, saturated (finite) above
    for vals in ([-np.inf, -1000.0, -88.5, 89.0], [1000.0, np.inf, 0.0, 1.0]):
        edge = np.resize(np.array(vals, "float32"), (2, lanes))
        out = tv.tvm.runtime.empty(edge.shape, "float32", dev)
        _exp_kernel(lanes, 2)["main"](tv.tvm.runtime.tensor(edge, dev),
                                      tv.tvm.runtime.tensor(np.zeros(2, "float32"), dev), out)
        got = out.numpy()
        assert np.all(np.isfinite(got))
        assert np.all(got[edge < -88.4] == 0.0)
        np.testing.assert_allclose(got[edge > 88.72], np.exp(np.float32(88.72)), rtol=1e-6)
        np.testing.assert_allclose(got[np.abs(edge) <= 1], np.exp(edge[np.abs(edge) <= 1]),
                                   rtol=2e-7)


@needs_avx512
def test_reciprocal_norm_intrinsic_is_close_to_division() -> None:
    te = tv.te
    e = te.placeholder((64, 16), name="E")
    s = te.placeholder((64,), name="S")
    y = te.compute((64, 16), lambda i, j: e[i, j] / s[i], name="Y")
    sch = tv.Schedule(te.create_prim_func([e, s, y]))
    _, j = sch.get_loops(sch.get_sblock("Y"))
    sch.tensorize(j, DIV_BCAST_F32.format(lanes=16))
    rt = tv.compile_module(sch.mod, tv.make_target(TARGET))
    rng = np.random.default_rng(0)
    ev = rng.uniform(0, 1, (64, 16)).astype("float32")
    sv = rng.uniform(1, 128, 64).astype("float32")
    dev = tv.tvm.cpu(0)
    out = tv.tvm.runtime.empty((64, 16), "float32", dev)
    rt["main"](tv.tvm.runtime.tensor(ev, dev), tv.tvm.runtime.tensor(sv, dev), out)
    np.testing.assert_allclose(out.numpy(), ev / sv[:, None], rtol=3e-7, atol=0)
