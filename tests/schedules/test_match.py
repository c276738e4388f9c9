"""Matching by structure (schedules/match.py): the GEMM template serves any PrimFunc whose blocks
are a GEMM with an elementwise epilogue, as relax sends them, and its programs are correct."""

from __future__ import annotations

from typing import Any

import pytest

from bench import fused as relax_tasks
from schedules import registry
from schedules.match import GemmMatch, NoMatch, match_gemm_func
from tests.schedules.test_spaces import X86, check_outputs, sample_points
from tuner.workloads import parse_spec


def tir(func: Any) -> Any:
    return parse_spec({"op": "tir", "tvmscript": func.script()})


def test_off_grid_op_specs_are_padded_and_correct() -> None:
    for spec in ({"op": "matmul", "shape": [7, 32, 9]}, {"op": "dense", "shape": [257, 40, 33]},
                 {"op": "batch_matmul", "shape": [3, 5, 32, 16]}):
        wl = parse_spec(spec)
        assert registry.resolve("default", wl, X86) == "gemm-x86"
        for sch in sample_points(registry.space_generator("gemm-x86", wl, X86), wl, X86, n=2):
            check_outputs(sch, wl, X86)


@pytest.mark.parametrize(("spec", "layout", "batch"), [
    ({"op": "matmul", "shape": [64, 48, 32]}, "matmul", 0),
    ({"op": "dense", "shape": [64, 48, 32]}, "dense", 0),
    ({"op": "batch_matmul", "shape": [2, 64, 48, 32]}, "dense", 1),
])
def test_op_specs_are_matched_by_their_blocks(spec: dict[str, Any], layout: str,
                                              batch: int) -> None:
    g = match_gemm_func(parse_spec(spec).prim_func())
    assert isinstance(g, GemmMatch) and (g.m, g.n, g.k) == (64, 48, 32)
    assert g.layout == layout and g.batch == batch and g.epilogue == 0


def test_relax_tasks_with_epilogues_are_matched() -> None:
    g = match_gemm_func(relax_tasks.linear(32, 48, 64, "gelu"))  # matmul, add, gelu (erf): 6
    assert isinstance(g, GemmMatch) and (g.m, g.n, g.k, g.epilogue) == (32, 48, 64, 6)
    assert g.layout == "matmul"  # FoldConstant transposed the bound weight: [K, N]
    g = match_gemm_func(relax_tasks.matmul((2, 32, 64), (64, 48)))  # broadcast weight
    assert isinstance(g, GemmMatch) and g.batch == 1 and g.weight_axes == "kj"


@pytest.mark.parametrize(("func", "why"), [
    (lambda: parse_spec({"op": "softmax", "shape": [4, 64]}).prim_func(), "reduction"),
    (lambda: parse_spec({"op": "conv2d", "shape": [1, 3, 8, 8, 4, 3, 3]}).prim_func(),
     "reduction"),
    (lambda: parse_spec({"op": "matmul", "shape": [8, 8, 8], "dtype": "float64"}).prim_func(),
     "float32"),
    (lambda: _transposed_a(), "transposed A"),
])
def test_what_is_not_served_says_why(func: Any, why: str) -> None:
    got = match_gemm_func(func())
    assert isinstance(got, NoMatch) and why in got.reason, got


def _transposed_a() -> Any:
    from tuner.tvm_api import te

    a, b = te.placeholder((64, 32), name="A"), te.placeholder((64, 48), name="B")
    r = te.reduce_axis((0, 64), name="k")
    c = te.compute((32, 48), lambda i, j: te.sum(a[r, i] * b[r, j], axis=r), name="C")
    return te.create_prim_func([a, b, c])


@pytest.mark.parametrize(("m", "n", "k", "act", "residual"), [
    (32, 48, 64, None, False),       # fused_matmul_add: bias
    (24, 32, 40, "relu", False),
    (16, 64, 24, "gelu", True),      # gelu (erf) then a residual add of a second input
    (32, 16, 16, "gelu_tanh", False),
    (8, 32, 32, "silu", False),
    (13, 32, 24, "relu", False),     # off the grid: M prime (padded to 16 rows)
    (13, 32, 24, "gelu", False),     # the same with GELU: its passes over the whole output
    (256, 40, 24, "relu", False),    # N = 40, padded to 48
    (197, 32, 20, None, True),       # M prime, a residual
])
def test_the_gemm_template_serves_fused_relax_tasks(m: int, n: int, k: int, act: str | None,
                                                   residual: bool) -> None:
    wl = tir(relax_tasks.linear(m, n, k, act, residual=residual))
    assert registry.resolve("default", wl, X86) == "gemm-x86"
    points = sample_points(registry.space_generator("gemm-x86", wl, X86), wl, X86, n=3)
    assert len(points) >= 3
    for sch in points:
        text = sch.mod.script()
        # root, packing, init, update, write-back (+ the copy of x padded to 8 rows); N off the
        # grid: the packing's vectors inside N peeled from the last one (a common block holding
        # two partitions of one block each); GELU: the blocks before the erf or tanh, its
        # tensorized block and the blocks after it, and no libm call left
        peeled = n % 16 != 0
        staged = 3 * (act in ("gelu", "gelu_tanh"))
        assert text.count("T.sblock(") == (5 + (m % 4 != 0 and m % 6 != 0) + 4 * peeled
                                          + staged), text
        assert text.count("_partition\")") == 2 * peeled
        assert "T.erf(" not in text and "T.tanh(" not in text
        check_outputs(sch, wl, X86)


def test_the_padded_weight_is_packed_with_plain_vector_loads() -> None:
    """N off the grid: the packing's `if_then_else(j < N, w, 0)` covers only the last vector
    (loop_partition); over all of them LLVM emitted masked gathers (vgatherqps), which cost
    384×777×512 a quarter of its speed. Built for znver4, not run: any CPU can check it."""
    from tests.support.targets import ZNVER4
    from tuner import tvm_api as tv

    wl = parse_spec({"op": "matmul", "shape": [256, 1000, 64]})  # 96 gathers unpeeled
    target = tv.make_target(ZNVER4)
    for sch in sample_points(registry.space_generator("gemm-x86", wl, target), wl, target, n=2):
        asm = tv.compile_module(sch.mod, target).inspect_source("asm")
        assert "vfmadd" in asm and "vgather" not in asm


def test_spaces_says_which_families_match_a_tvmscript_file_and_why_not(tmp_path: Any) -> None:
    import json

    from typer.testing import CliRunner

    from tuner.cli import app

    ffn = tmp_path / "ffn.py"
    ffn.write_text(relax_tasks.linear(16, 32, 48, "gelu").script())
    got = CliRunner().invoke(app, ["spaces", "--tvmscript", str(ffn)])
    assert got.exit_code == 0, got.output
    by_name = {s["name"]: s for s in json.loads(got.output)}
    assert by_name["gemm-x86"]["applies"] and by_name["gemm-x86"]["knobs"]["mr"]
    assert by_name["auto"]["applies"]
    assert "softmax" in by_name["softmax-x86"]["reason"]

    odd = tmp_path / "odd.py"  # N = 40: off the 16-lane grid, padded when M >= 256
    odd.write_text(relax_tasks.linear(256, 40, 48).script())
    got = CliRunner().invoke(app, ["spaces", "--tvmscript", str(odd)])
    gemm = {s["name"]: s for s in json.loads(got.output)}["gemm-x86"]
    assert gemm["applies"] and gemm["knobs"]["nv"]["choices"] == [3, 1], gemm  # 48 / 16 = 3
    odd.write_text(relax_tasks.linear(16, 40, 48).script())
    got = CliRunner().invoke(app, ["spaces", "--tvmscript", str(odd)])
    reason = {s["name"]: s["reason"] for s in json.loads(got.output)}["gemm-x86"]
    assert reason.startswith("N=40 is off the 16-lane grid and M=16 < 256"), reason
    soft = CliRunner().invoke(app, ["spaces", "softmax", "--shape", "4,64"])
    reason = {s["name"]: s["reason"] for s in json.loads(soft.output)}["gemm-x86"]
    assert "reduction" in reason
