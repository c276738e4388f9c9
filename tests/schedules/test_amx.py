"""`dense-bf16-amx` and `dense-int8-amx`: bf16 and int8 GEMMs on AMX tiles, matched by structure,
chosen by the target's amx-bf16 / amx-int8 features. The assembly is checked cross-compiled for a
Sapphire Rapids on every x86 machine; the kernels run where the CPU has AMX and the kernel grants
the tile state."""

from __future__ import annotations

from collections import Counter

import pytest

from schedules import registry
from schedules.amx import has_amx
from schedules.amx_intrinsics import kernel_ir
from schedules.match import GemmMatch, match_gemm
from schedules.registry import TEMPLATES, describe
from tests.schedules.test_int8 import sample
from tests.schedules.test_spaces import check_outputs, sample_points
from tuner.core import tvm_api as tv
from tuner.measure import Invalidity, MeasureInput, MeasureOptions
from tuner.measure.sandbox import _Prepared, measure_one
from tuner.workloads import parse_spec

SPR = {"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2}  # AMX-BF16 and AMX-INT8
ZEN4 = {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}  # AVX512-BF16 and VNNI, no AMX
host_has_amx = has_amx(tv.make_target("host"), "bf16")
needs_amx = pytest.mark.skipif(not host_has_amx, reason="this CPU has no AMX, or the kernel does "
                                                        "not grant its tile state")


def gemm(op: str, m: int, n: int, k: int, dtype: str | None = "bfloat16"):
    return parse_spec({"op": op, "shape": [m, n, k], **({"dtype": dtype} if dtype else {})})


def test_chosen_before_the_avx512_templates_where_the_target_has_amx() -> None:
    spr, zen4 = tv.make_target(SPR), tv.make_target(ZEN4)
    bf, i8 = gemm("dense", 64, 96, 128), gemm("dense_int8", 64, 96, 128, None)
    assert registry.resolve("default", bf, spr) == "dense-bf16-amx"
    assert registry.resolve("default", i8, spr) == "dense-int8-amx"
    assert registry.resolve("default", bf, zen4) == "dense-bf16-avx512"
    assert registry.resolve("default", i8, zen4) == "dense-int8-vnni"
    assert "no AMX-BF16" in TEMPLATES["dense-bf16-amx"].why_not(bf, zen4)
    assert "not uint8 x int8" in TEMPLATES["dense-int8-amx"].why_not(bf, spr)
    # off the tile grid: the AVX-512 templates serve it
    odd = gemm("dense", 24, 96, 128)
    assert "M=24" in TEMPLATES["dense-bf16-amx"].why_not(odd, spr)
    assert registry.resolve("default", odd, spr) == "dense-bf16-avx512"
    assert "K=96 not of 64" in TEMPLATES["dense-int8-amx"].why_not(
        gemm("dense_int8", 32, 32, 96, None), spr)
    m = gemm("matmul", 32, 64, 96)
    assert isinstance(match_gemm(m), GemmMatch) and registry.resolve("default", m, spr) \
        == "dense-bf16-amx"


def test_design_spaces_take_the_largest_micro_kernel_and_chunks_that_divide_k() -> None:
    tpl = TEMPLATES["dense-bf16-amx"]
    variants = tpl.design_variants(gemm("dense", 1024, 1024, 1024))
    assert {v["micro"] for v in variants} == {"2x2"}
    assert sorted({v["k_chunk"] for v in variants}) == ["1024", "256", "512"]
    assert len(variants) == 12  # x two loop orders x X as is or copied into tiles
    assert {v["a_layout"] for v in variants} == {"tiles", "rows"}
    assert {v["micro"] for v in tpl.design_variants(gemm("dense", 48, 64, 768))} == {"1x2"}
    assert {v["k_chunk"] for v in tpl.design_variants(gemm("dense", 32, 32, 768))} \
        == {"768", "256"}
    assert {v["k_chunk"] for v in tpl.design_variants(gemm("dense", 32, 32, 4128))} == {"1376"}
    knobs = describe("dense-bf16-amx", gemm("dense", 64, 96, 128))["knobs"]
    assert knobs["rows"]["extent"] == 2 and knobs["cols"]["extent"] == 3
    assert knobs["micro"]["choices"] == ["2x2"]


@pytest.mark.parametrize(("kind", "op", "dtype", "instr"), [
    ("bf16", "dense", "bfloat16", "tdpbf16ps"), ("int8", "dense_int8", None, "tdpbusd")])
def test_the_kernel_keeps_its_accumulators_in_tiles(kind: str, op: str, dtype: str | None,
                                                    instr: str) -> None:
    """Cross-compiled for a Sapphire Rapids (any x86 machine builds it): a tile config, the 2 x 2
    block's four tile products per step of K, and C's four tiles stored once per call (once per
    chunk of K: LLVM unrolls the chunk's steps), and the tile state requested (arch_prctl)."""
    w = gemm(op, 64, 64, 256, dtype)
    (sch,) = sample(w, 1, 3, f"dense-{kind}-amx", spec=SPR)
    asm = tv.compile_module(sch.mod, tv.make_target(SPR)).inspect_source("asm")
    ops = Counter(ln.split()[0] for ln in (x.strip() for x in asm.splitlines()) if ln)
    steps = 256 // (32 if kind == "bf16" else 64)
    assert ops[instr] >= 4 * steps and ops[instr] == steps * ops["tilestored"], ops
    assert ops["tileloadd"] >= ops[instr]  # 2 A + 2 B tiles a step, C's tiles once a call
    assert ops["ldtilecfg"] >= 1 and ops["syscall"] >= 1
    assert "tunefarm_amx_granted" in asm


def test_two_kernels_of_one_module_import_the_micro_kernel_each() -> None:
    """A relax model's library holds every task's kernel: each call imports the micro-kernel
    (TVM makes it always-inline), and its signature is i32 offsets whatever the index type."""
    ir = kernel_ir("bf16", 2, 2)
    assert "define i32 @tunefarm_amx_bf16_2x2(ptr %c0, i32 %oc32" in ir
    assert ir.count("llvm.x86.tdpbf16ps.internal(i16 16") == 4
    tv_mod = tv.tvm.IRModule()
    for i, (m, n) in enumerate(((64, 64), (32, 64))):
        (sch,) = sample(gemm("dense", m, n, 256), 1, i, "dense-bf16-amx", spec=SPR)
        tv_mod[f"k{i}"] = sch.mod["main"].with_attr("global_symbol", f"k{i}")
    asm = tv.compile_module(tv_mod, tv.make_target(SPR)).inspect_source("asm")
    assert asm.count("tdpbf16ps") >= 8


@needs_amx
@pytest.mark.parametrize(("op", "shape", "dtype"), [("dense", (64, 96, 128), "bfloat16"),
                                                    ("matmul", (32, 64, 96), "bfloat16"),
                                                    ("dense", (48, 32, 1024), "bfloat16"),
                                                    ("dense_int8", (64, 96, 128), None),
                                                    ("dense_int8", (32, 48, 512), None)])
def test_sampled_candidates_match_numpy(op: str, shape: tuple[int, int, int],
                                        dtype: str | None) -> None:
    w = gemm(op, *shape, dtype)
    target = tv.make_target("host")
    name = registry.resolve("default", w, target)
    assert name.endswith("-amx"), name
    points = sample_points(registry.space_generator(name, w, target), w, target, n=2)
    assert len(points) == 2 * len(TEMPLATES[name].design_variants(w))
    for sch in points:
        check_outputs(sch, w, target)


@needs_amx
def test_the_sandbox_times_it_on_the_prepacked_weight_and_verifies_it() -> None:
    w = gemm("dense_int8", 32, 64, 128, None)
    target = tv.host_target_dict()
    (sch,) = sample(w, 1, 5, "dense-int8-amx", spec=target)
    inp = MeasureInput(trial_id="amx", workload_key=w.key, workload_spec=w.spec, target=target,
                       trace_json=tv.trace_to_json(sch.trace),
                       options=MeasureOptions(repeats=1, min_repeat_ms=1.0))
    res = measure_one(inp, _Prepared(w.spec), lambda msg: None)
    assert res.invalidity == Invalidity.OK, res.error_msg
    assert res.max_abs_err == 0


@needs_amx
def test_a_bf16_linear_with_bias_and_a_cast_back_runs_folded_per_tile() -> None:
    from tuner.core.tvm_api import te, topi

    x = te.placeholder((32, 128), "bfloat16", name="x")
    wt = te.placeholder((64, 128), "bfloat16", name="w")
    b = te.placeholder((64,), "float32", name="b")
    out = topi.cast(topi.add(topi.nn.dense(x, wt, out_dtype="float32"), b), "bfloat16")
    wl = parse_spec({"op": "tir", "tvmscript": te.create_prim_func([x, wt, b, out]).script()})
    target = tv.make_target("host")
    assert registry.resolve("default", wl, target) == "dense-bf16-amx"
    for sch in sample_points(registry.space_generator("dense-bf16-amx", wl, target), wl, target,
                             n=1):
        check_outputs(sch, wl, target)


def test_the_host_target_reports_amx_only_where_the_kernel_grants_it() -> None:
    feats = tv.tvm_ffi.get_global_func("tvm.codegen.llvm.GetHostCPUFeatures")()
    cpuid = bool(feats.get("amx-bf16", False)) if hasattr(feats, "get") else False
    host = tv.make_target("host")
    assert has_amx(host, "bf16") == (cpuid and tv.amx_granted())
    if cpuid and tv.amx_granted():  # even where LLVM's model of the CPU has no AMX
        assert has_amx(host, "int8")
