"""`dense-int8-vnni` and `dense-int8-avx2`: every sampled configuration is exact, the kernel uses
vpdpbusd (vpmaddwd without VNNI) on a weight packed at compile time, and the trap the packing
avoids (tensorizing the unpacked weight) is caught by the farm's verification. No tuning runs:
candidates are sampled from the space. The AVX2 kernels run on every x86 CI machine."""

from __future__ import annotations

import numpy as np
import pytest

from schedules import int8
from schedules.dot_intrinsics import VNNI_16x4_LLVM22
from schedules.registry import TEMPLATES, describe
from tests.support import guarded
from tests.support.targets import AVX2_X86
from tuner.core import tvm_api as tv
from tuner.measure import Invalidity, MeasureInput, MeasureOptions
from tuner.measure.sandbox import _Prepared, measure_one
from tuner.workloads import parse_spec

TARGET = {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}

# building for znver4 works on any x86 host; running needs the instructions
_HOST = tv.make_target("host")
needs_vnni = pytest.mark.skipif(not int8.has_vnni(_HOST),
                                reason="this CPU has no AVX512-VNNI: the kernels cannot run")


def workload(m: int, n: int, k: int):
    return parse_spec({"op": "dense_int8", "shape": [m, n, k]})


def sample(w, count: int, seed: int, tname: str = "dense-int8-vnni",
           spec: dict = TARGET) -> list:
    """`count` random candidates of the template's space, postprocessed as the search does."""
    target = tv.make_target(spec)
    tpl = TEMPLATES[tname]
    ctx = tv.tune_context(w.mod(), target, space=tpl.space(w, target), strategy="replay-trace",
                          seed=seed, num_threads=1)
    ctx.pre_tuning(max_trials=count, num_trials_per_iter=count,
                   design_spaces=ctx.generate_design_space())
    cands = ctx.generate_measure_candidates()
    ctx.post_tuning()
    return [c.sch for c in cands]


def run_full(w, mod, spec: dict = TARGET) -> np.ndarray:
    """Build `mod` as is (weight packing included) and run it on the workload's inputs."""
    x, wt = w.make_inputs(0)
    dev = tv.tvm.cpu(0)
    (out,) = guarded.outputs([(w.arg_specs()[-1][1], "int32")], dev)
    tv.compile_module(mod, tv.make_target(spec))["main"](
        tv.tvm.runtime.tensor(x, dev), tv.tvm.runtime.tensor(wt, dev), out.tensor)
    return out.numpy()


def test_registered_and_applies() -> None:
    w = workload(32, 64, 64)
    tpl = TEMPLATES["dense-int8-vnni"]
    assert tpl.applies(w, tv.make_target(TARGET))
    # no VNNI (Skylake-X has AVX-512 but not VNNI), not x86, or N/K not multiples of 16/4
    assert not tpl.applies(w, tv.make_target({"kind": "llvm", "mcpu": "skylake-avx512",
                                              "num-cores": 2}))
    assert not tpl.applies(w, tv.make_target({"kind": "llvm", "mtriple": "aarch64-linux-gnu",
                                              "num-cores": 2}))
    assert not tpl.applies(workload(32, 40, 64), tv.make_target(TARGET))
    assert not tpl.applies(workload(32, 64, 66), tv.make_target(TARGET))
    assert not tpl.applies(parse_spec({"op": "softmax", "shape": [4, 16]}),
                           tv.make_target(TARGET))
    knobs = describe("dense-int8-vnni", w)["knobs"]
    assert {"rows", "vectors", "k_block", "order", "parallel", "unroll"} <= set(knobs)
    assert knobs["vectors"]["extent"] == 4


@needs_vnni
@pytest.mark.parametrize(("shape", "count", "seed"), [((32, 64, 64), 16, 0),
                                                       ((6, 48, 20), 6, 1),
                                                       ((1, 16, 4), 2, 2)])
def test_sampled_candidates_are_exact(shape: tuple[int, int, int], count: int, seed: int) -> None:
    w = workload(*shape)
    ref = w.reference(w.make_inputs(0))[0]
    schs = sample(w, count, seed)
    assert len(schs) == count
    for sch in schs:
        decisions = tv.trace_decisions(sch.trace)
        np.testing.assert_array_equal(run_full(w, sch.mod), ref, err_msg=str(decisions))


def test_sampled_register_budget() -> None:
    """No sampled micro-kernel spills: rows x vectors accumulators + one weight tile per vector
    fit the 32 zmm registers."""
    for sch in sample(workload(128, 768, 64), 24, 3):
        rows, vectors = (d[2][-1] for d in tv.trace_decisions(sch.trace)[:2])
        assert rows * vectors + vectors <= TEMPLATES["dense-int8-vnni"].registers == 32


def test_kernel_uses_vpdpbusd_on_packed_weight() -> None:
    w = workload(32, 64, 64)
    sch = sample(w, 1, 4)[0]
    kernel = tv.strip_layout_rewrite(sch.mod)
    # the timed kernel takes the weight pre-packed (the packing block is emptied)
    assert tv.param_specs(kernel) == [((32, 64), "uint8"), ((4, 16, 16, 4), "int8"),
                                      ((32, 64), "int32")]
    asm = tv.compile_module(kernel, tv.make_target(TARGET)).inspect_source("asm")
    assert "vpdpbusd" in asm
    # and the trace (what the database stores) replays to the same program
    replayed = tv.apply_trace(w.mod(), tv.trace_to_json(sch.trace))
    assert tv.structural_equal(replayed.mod, sch.mod)


@pytest.mark.parametrize(("tname", "spec"), [("dense-int8-vnni", TARGET),
                                           ("dense-int8-avx2", AVX2_X86)])
def test_zeroing_is_rows_by_columns_and_the_register_tile_unrolled(tname: str,
                                                                   spec: dict) -> None:
    """The accumulators' zeroing, split off above the k loop with copies of the cache block's
    loops, is one loop over rows around one over columns (then the vector), none unrolled: with
    the register tile's unrolled copies in it, LLVM took seconds to compile it
    (`FinishCacheBlock`). The update's register tile (rows x vectors) is unrolled, and the trace
    replays to the same program without the postproc."""
    serial, parallel, vectorized, unrolled = 0, 1, 2, 3  # tirx.ForKind
    w = workload(128, 256, 64)
    for sch in sample(w, 6, 7, tname, spec):
        rows, vectors = (d[2][-1] for d in tv.trace_decisions(sch.trace)[:2])
        init = [(int(sch.get(lp).extent), int(sch.get(lp).kind))
                for lp in sch.get_loops(sch.get_sblock("T_matmul_NT_o_init"))]
        # the parallel tiles (j0 stays a serial loop when i0 alone is parallel), rows, columns
        assert [k for _, k in init] in ([parallel, serial, serial],
                                        [parallel, serial, serial, serial]), init
        assert [int(sch.get(lp).kind) for lp in sch.get_loops(sch.get_sblock(
            "T_matmul_NT_init"))] == [vectorized]
        update = [(int(sch.get(lp).extent), int(sch.get(lp).kind))
                  for lp in sch.get_loops(sch.get_sblock("T_matmul_NT_o_update"))]
        assert update[-2:] == [(rows, unrolled), (vectors, unrolled)], update
        assert unrolled not in [k for _, k in update[:-2]]
        assert int8.LOOP_ROLE not in sch.mod.script()
        replayed = tv.apply_trace(w.mod(), tv.trace_to_json(sch.trace))
        assert tv.structural_equal(replayed.mod, sch.mod)


def unpacked_vnni(w):
    """The trap: the same micro-kernel tensorized on the plain [N, K] weight. `tensorize` accepts
    it (it does not check that the 16x4 tile is contiguous), it compiles, and it reads 64
    consecutive bytes of ONE weight row where the intrinsic expects 16 rows x 4."""
    sch = tv.Schedule(w.mod())
    block = sch.get_sblock("T_matmul_NT")
    i, j, k = sch.get_loops(block)
    i0, i1 = sch.split(i, [None, 2])
    j0, j1 = sch.split(j, [None, 16])
    k0, k1 = sch.split(k, [None, 4])
    sch.reorder(i0, j0, k0, i1, j1, k1)
    sch.decompose_reduction(block, k0)
    sch.tensorize(j1, VNNI_16x4_LLVM22)
    return sch


@needs_vnni
def test_unpacked_tensorization_is_caught_as_wrong() -> None:
    w = workload(8, 32, 16)
    sch = unpacked_vnni(w)
    assert "vpdpbusd" in tv.compile_module(sch.mod, tv.make_target(TARGET)).inspect_source("asm")
    ref = w.reference(w.make_inputs(0))[0]
    assert not np.array_equal(run_full(w, sch.mod), ref)
    # the farm's sandbox verifies every candidate against the numpy reference: a wrong answer
    opts = MeasureOptions(repeats=1, min_repeat_ms=1.0)
    bad = MeasureInput(trial_id="unpacked", workload_key=w.key, workload_spec=w.spec,
                       target=TARGET, trace_json=tv.trace_to_json(sch.trace), options=opts)
    res = measure_one(bad, _Prepared(w.spec), lambda msg: None)
    assert res.invalidity == Invalidity.WRONG_ANSWER, res.error_msg
    # while a packed candidate of the template passes and is timed on the pre-packed weight
    good = MeasureInput(trial_id="packed", workload_key=w.key, workload_spec=w.spec,
                        target=TARGET, trace_json=tv.trace_to_json(sample(w, 1, 5)[0].trace),
                        options=opts)
    res = measure_one(good, _Prepared(w.spec), lambda msg: None)
    assert res.invalidity == Invalidity.OK, res.error_msg
    assert res.max_abs_err == 0.0


def test_relax_int8_gemm_with_requantization_gets_the_template() -> None:
    """Matched by structure: relax's int8 matmul of a bound weight ([K, N]), int64 indices, its
    requantization (cast, scale, round, clip, cast to int8) folded in per tile; float32 GEMMs and
    batched int8 ones are not this template's."""
    from bench import fused as relax_tasks
    from schedules import registry
    from tests.schedules.test_spaces import X86, check_outputs, sample_points

    wl = parse_spec({"op": "tir", "tvmscript": relax_tasks.int8_linear(32, 64, 48).script()})
    target = tv.make_target(TARGET)
    assert registry.resolve("default", wl, target) == "dense-int8-vnni"
    assert "not float32" in TEMPLATES["gemm-x86"].why_not(wl, target)
    floats = parse_spec({"op": "tir", "tvmscript": relax_tasks.linear(32, 64, 48).script()})
    assert "not uint8 x int8" in TEMPLATES["dense-int8-vnni"].why_not(floats, target)
    assert TEMPLATES["dense-int8-vnni"].knobs(wl)["vectors"]["extent"] == 4
    if not int8.has_vnni(X86):
        return  # the rest runs the kernels
    points = sample_points(registry.space_generator("dense-int8-vnni", wl, X86), wl, X86, n=3)
    assert len(points) == 6  # two design spaces (loop orders)
    for sch in points:
        text = sch.mod.script()
        assert "vpdpbusd" in text and text.count("T.sblock(\"compute") == 1, text
        check_outputs(sch, wl, X86)  # exact: the output is int8


# --- dense-int8-avx2: the same GEMM without VNNI --------------------------------------------


def test_avx2_template_serves_what_vnni_does_not() -> None:
    """AVX2 without VNNI (Haswell, Zen 3, and Skylake-X: AVX-512 but no VNNI) gets
    `dense-int8-avx2`; a VNNI target only `dense-int8-vnni`; N must be a multiple of 8, K even."""
    from schedules import registry

    avx2 = TEMPLATES["dense-int8-avx2"]
    w = workload(32, 40, 6)  # N = 40 and K = 6: off VNNI's grid, on this one's
    for spec in (AVX2_X86, {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}):
        assert avx2.applies(w, tv.make_target(spec)), spec
        assert registry.resolve("default", workload(32, 64, 64), tv.make_target(spec)) \
            == "dense-int8-avx2"
    assert "dense-int8-vnni serves it" in avx2.why_not(w, tv.make_target(TARGET))
    assert "no AVX2" in avx2.why_not(w, tv.make_target({"kind": "llvm", "mcpu": "nehalem"}))
    assert "not an x86" in avx2.why_not(w, tv.make_target(
        {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "num-cores": 2}))
    target = tv.make_target(AVX2_X86)
    assert "not a multiple of 8" in avx2.why_not(workload(32, 36, 6), target)
    assert "K=7 not of 2" in avx2.why_not(workload(32, 40, 7), target)
    knobs = describe("dense-int8-avx2", workload(32, 64, 64))["knobs"]
    assert knobs["vectors"]["extent"] == 8 and knobs["k_block"]["extent"] == 32


@pytest.mark.parametrize(("shape", "count", "seed"), [((32, 64, 64), 12, 0),
                                                       ((6, 40, 22), 6, 1),
                                                       ((1, 8, 2), 2, 2)])
def test_avx2_sampled_candidates_are_exact(shape: tuple[int, int, int], count: int,
                                           seed: int) -> None:
    """Exact on the full u8 x i8 range (the inputs span [0, 256) x [-128, 128): vpmaddubsw's
    int16 pair sums would saturate on them, vpmaddwd's int32 ones cannot)."""
    w = workload(*shape)
    ref = w.reference(w.make_inputs(0))[0]
    schs = sample(w, count, seed, "dense-int8-avx2", AVX2_X86)
    assert len(schs) == count
    for sch in schs:
        rows, vectors = (d[2][-1] for d in tv.trace_decisions(sch.trace)[:2])
        assert rows * vectors + vectors <= 16  # the 16 ymm registers
        np.testing.assert_array_equal(run_full(w, sch.mod, AVX2_X86), ref,
                                      err_msg=str(tv.trace_decisions(sch.trace)))


def test_avx2_kernel_uses_vpmaddwd_on_packed_weight_and_the_sandbox_times_it() -> None:
    w = workload(32, 64, 64)
    sch = sample(w, 1, 4, "dense-int8-avx2", AVX2_X86)[0]
    kernel = tv.strip_layout_rewrite(sch.mod)
    assert tv.param_specs(kernel) == [((32, 64), "uint8"), ((8, 32, 8, 2), "int8"),
                                      ((32, 64), "int32")]
    asm = tv.compile_module(kernel, tv.make_target(AVX2_X86)).inspect_source("asm")
    assert "vpmaddwd" in asm and "vpmaddubsw" not in asm and "zmm" not in asm
    opts = MeasureOptions(repeats=1, min_repeat_ms=1.0)
    inp = MeasureInput(trial_id="avx2", workload_key=w.key, workload_spec=w.spec,
                       target=AVX2_X86, trace_json=tv.trace_to_json(sch.trace), options=opts)
    res = measure_one(inp, _Prepared(w.spec), lambda msg: None)
    assert res.invalidity == Invalidity.OK, res.error_msg
    assert res.max_abs_err == 0.0


def test_avx2_relax_int8_gemm_with_requantization() -> None:
    from bench import fused as relax_tasks
    from schedules import registry
    from tests.schedules.test_spaces import check_outputs, sample_points

    wl = parse_spec({"op": "tir", "tvmscript": relax_tasks.int8_linear(32, 64, 48).script()})
    target = tv.make_target(AVX2_X86)
    assert registry.resolve("default", wl, target) == "dense-int8-avx2"
    points = sample_points(registry.space_generator("dense-int8-avx2", wl, target), wl, target,
                           n=2)
    assert len(points) == 4  # two design spaces (loop orders)
    for sch in points:
        text = sch.mod.script()
        assert "pmadd.wd" in text and text.count("T.sblock(\"compute") == 1, text
        check_outputs(sch, wl, target)  # exact: the output is int8
