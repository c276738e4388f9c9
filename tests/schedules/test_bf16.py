"""`dense-bf16-avx512`: bf16 GEMMs (fp32 products and sums) matched by structure, chosen by the
target's AVX512-BF16, tensorized with vdpbf16ps on a weight packed at compile time. Candidates are
sampled from the space (no tuning). The assembly is checked cross-compiled on every x86 machine;
the kernels run where the CPU has AVX512-BF16 (Zen 4/5, Cooper Lake and later Xeons)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from schedules import registry
from schedules.bf16 import has_avx512_bf16
from schedules.match import BF16, GemmMatch, match_gemm
from schedules.registry import TEMPLATES, describe
from tests.schedules.test_int8 import sample
from tests.schedules.test_spaces import check_outputs, sample_points
from tuner.core import tvm_api as tv
from tuner.measure import Invalidity, MeasureInput, MeasureOptions
from tuner.measure.sandbox import _Prepared, measure_one
from tuner.workloads import parse_spec

NAME = "dense-bf16-avx512"
TARGET = {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}  # has AVX512-BF16
SKYLAKE = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}  # AVX-512 without BF16
needs_bf16 = pytest.mark.skipif(not has_avx512_bf16(tv.make_target("host")),
                                reason="this CPU has no AVX512-BF16: the kernels cannot run")


def bf16(op: str, m: int, n: int, k: int):
    return parse_spec({"op": op, "shape": [m, n, k], "dtype": "bfloat16"})


def test_the_op_specs_take_bf16_inputs_and_give_float32() -> None:
    w = bf16("dense", 8, 32, 16)
    x, wt = w.make_inputs(0)
    assert x.dtype == np.dtype("bfloat16") and wt.shape == (32, 16)
    assert np.abs(x.astype(np.float32)).max() <= 1.0
    assert [a[2] for a in w.arg_specs()] == ["bfloat16", "bfloat16", "float32"]
    (ref,) = w.reference([x, wt])
    assert ref.dtype == np.float32
    np.testing.assert_allclose(ref, x.astype(np.float64) @ wt.astype(np.float64).T, rtol=1e-6)
    assert w.key != parse_spec({"op": "dense", "shape": [8, 32, 16]}).key
    m = bf16("matmul", 8, 32, 16)
    assert [a[1] for a in m.arg_specs()] == [(8, 16), (16, 32), (8, 32)]


def test_matched_by_structure_and_chosen_by_the_targets_features() -> None:
    target = tv.make_target(TARGET)
    tpl = TEMPLATES[NAME]
    for op, layout in (("dense", "dense"), ("matmul", "matmul")):
        w = bf16(op, 32, 64, 48)
        g = match_gemm(w)
        assert isinstance(g, GemmMatch) and g.dtype == BF16 and g.layout == layout
        assert registry.resolve("default", w, target) == NAME
    w = bf16("dense", 32, 64, 48)
    assert "no AVX512-BF16" in tpl.why_not(w, tv.make_target(SKYLAKE))
    assert registry.resolve("default", w, tv.make_target(SKYLAKE)) == "auto"
    assert "not float32" in TEMPLATES["gemm-x86"].why_not(w, target)
    assert "not uint8 x int8" in TEMPLATES["dense-int8-vnni"].why_not(w, target)
    fp32 = parse_spec({"op": "dense", "shape": [32, 64, 48]})
    assert "not bfloat16 x bfloat16" in tpl.why_not(fp32, target)
    assert "not a multiple of 16" in tpl.why_not(bf16("dense", 32, 40, 48), target)
    assert "K=7 not of 2" in tpl.why_not(bf16("dense", 32, 64, 7), target)
    knobs = describe(NAME, w)["knobs"]
    assert knobs["vectors"]["extent"] == 4 and knobs["k_block"]["extent"] == 24


def test_the_kernel_is_vdpbf16ps_with_accumulators_in_registers() -> None:
    """Cross-compiled for a Zen 4 (any x86 machine builds it): one vdpbf16ps per accumulator and
    k step, and between two of them no store (an accumulator written back to memory every step
    is what loading the operands inside the imported LLVM function did)."""
    w = bf16("dense", 64, 128, 64)
    (sch,) = sample(w, 1, 3, NAME)
    rows, vectors = (d[2][-1] for d in tv.trace_decisions(sch.trace)[:2])
    asm = tv.compile_module(sch.mod, tv.make_target(TARGET)).inspect_source("asm")
    assert asm.count("vdpbf16ps") >= rows * vectors
    lines = [ln.strip() for ln in asm.splitlines()]
    hot = [i for i, ln in enumerate(lines) if ln.startswith("vdpbf16ps")]
    between = lines[hot[0]:hot[rows * vectors - 1]]
    assert not [ln for ln in between if re.match(r"vmov\w*\s+%zmm\d+, -?\d*\(", ln)], between


@needs_bf16
@pytest.mark.parametrize(("op", "shape", "seed"), [("dense", (32, 64, 48), 0),
                                                   ("dense", (6, 48, 22), 1),
                                                   ("matmul", (24, 32, 40), 2)])
def test_sampled_candidates_match_numpy(op: str, shape: tuple[int, int, int], seed: int) -> None:
    w = bf16(op, *shape)
    target = tv.make_target("host")
    points = sample_points(registry.space_generator(NAME, w, target), w, target, n=2)
    assert len(points) == 4  # two design spaces (loop orders), two samples each
    for sch in points:
        check_outputs(sch, w, target)


@needs_bf16
def test_the_sandbox_times_it_on_the_prepacked_weight_and_verifies_it() -> None:
    w = bf16("dense", 16, 64, 32)
    (sch,) = sample(w, 1, 5, NAME)
    inp = MeasureInput(trial_id="bf16", workload_key=w.key, workload_spec=w.spec, target=TARGET,
                       trace_json=tv.trace_to_json(sch.trace),
                       options=MeasureOptions(repeats=1, min_repeat_ms=1.0))
    res = measure_one(inp, _Prepared(w.spec), lambda msg: None)
    assert res.invalidity == Invalidity.OK, res.error_msg
    assert res.max_abs_err is not None and res.max_abs_err < 1e-5


def bf16_linear():
    """A bf16 model's linear layer as one `tir` workload: the GEMM, a float32 bias, the cast of
    the result back to bf16."""
    from tuner.core.tvm_api import te, topi

    x = te.placeholder((24, 64), "bfloat16", name="x")
    wt = te.placeholder((48, 64), "bfloat16", name="w")
    b = te.placeholder((48,), "float32", name="b")
    out = topi.cast(topi.add(topi.nn.dense(x, wt, out_dtype="float32"), b), "bfloat16")
    return parse_spec({"op": "tir", "tvmscript": te.create_prim_func([x, wt, b, out]).script()})


def test_a_bf16_linear_with_bias_and_a_cast_back_is_matched() -> None:
    wl = bf16_linear()
    assert [a[2] for a in wl.arg_specs()] == ["bfloat16", "bfloat16", "float32", "bfloat16"]
    g = match_gemm(wl)
    assert isinstance(g, GemmMatch) and g.dtype == BF16 and g.epilogue == 2
    assert registry.resolve("default", wl, tv.make_target(TARGET)) == NAME
    assert wl.tolerance()[0] == 1e-2  # a bf16 output: one rounding


@needs_bf16
def test_a_bf16_linear_with_bias_and_a_cast_back_runs_folded_per_tile() -> None:
    wl = bf16_linear()
    target = tv.make_target("host")
    points = sample_points(registry.space_generator(NAME, wl, target), wl, target, n=1)
    assert points
    for sch in points:
        text = sch.mod.script()  # bias and cast: one block computed per tile, no separate pass
        assert text.count('T.sblock("compute') == 1 and "T_add" not in text, text
        check_outputs(sch, wl, target)
