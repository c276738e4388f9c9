"""Matching by structure (schedules/match.py): the GEMM and conv2d templates serve any PrimFunc
whose blocks are a GEMM or a direct convolution with an elementwise epilogue, as relax sends
them, and their programs are correct."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from bench import fused as relax_tasks
from schedules import registry
from schedules.match import INT8, GemmMatch, NoMatch, match_gemm_func
from schedules.match_conv import (
    ConvMatch,
    DepthwiseMatch,
    match_conv_func,
    match_depthwise_func,
)
from tests.schedules.test_spaces import X86, check_outputs, sample_points
from tests.support import guarded
from tuner.core import prepack
from tuner.core import tvm_api as tv
from tuner.core.prepack import PADDED_PREPROC, PREPROC
from tuner.measure.packing import Packer
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
    assert g.dtype == "float32"


def test_an_int8_gemm_with_its_requantization_is_matched() -> None:
    # relax: matmul (operands cast to int32), cast to float32, multiply, round, clip, cast
    g = match_gemm_func(relax_tasks.int8_linear(32, 48, 64))
    assert isinstance(g, GemmMatch) and (g.m, g.n, g.k, g.epilogue) == (32, 48, 64, 5)
    assert g.dtype == INT8 and g.weight_axes == "kj"
    g = match_gemm_func(parse_spec({"op": "dense_int8", "shape": [8, 32, 16]}).prim_func())
    assert isinstance(g, GemmMatch) and g.dtype == INT8 and g.layout == "dense"


@pytest.mark.parametrize(("func", "why"), [
    (lambda: parse_spec({"op": "softmax", "shape": [4, 64]}).prim_func(), "reduction"),
    (lambda: parse_spec({"op": "conv2d", "shape": [1, 3, 8, 8, 4, 3, 3]}).prim_func(),
     "reduction"),
    (lambda: parse_spec({"op": "matmul", "shape": [8, 8, 8], "dtype": "float64"}).prim_func(),
     "float32"),
    (lambda: _transposed_a(), "transposed A"),
    (lambda: _int8_gemm("int16", "int8"), "neither float32, uint8 x int8"),
    (lambda: _int8_gemm("int8", "uint8"), "activations [*batch, i, k] are not the uint8"),
    (lambda: _int8_gemm("uint8", "int32", cast_b=False), "one GEMM operand is cast"),
])
def test_what_is_not_served_says_why(func: Any, why: str) -> None:
    got = match_gemm_func(func())
    assert isinstance(got, NoMatch) and why in got.reason, got


def _int8_gemm(a_dtype: str, b_dtype: str, *, cast_b: bool = True) -> Any:
    """C[i, j] int32 += A[i, k] * B[k, j], each cast to int32 (or B not cast)."""
    from tuner.core.tvm_api import te

    a = te.placeholder((16, 32), a_dtype, name="A")
    b = te.placeholder((32, 48), b_dtype, name="B")
    k = te.reduce_axis((0, 32), name="k")
    c = te.compute((16, 48), lambda i, j: te.sum(
        a[i, k].astype("int32") * (b[k, j].astype("int32") if cast_b else b[k, j]), axis=k),
        name="C")
    return te.create_prim_func([a, b, c])


def _transposed_a() -> Any:
    from tuner.core.tvm_api import te

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
    (256, 170, 8, None, False),      # N = 170: 11 vectors, padded to 12 (2-vector kernels fit)
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
        # root, packing, init, update, write-back (+ the copy of x padded to 8 rows); GELU: the
        # blocks before the erf or tanh, its tensorized block and the blocks after it, and no
        # libm call left
        staged = 3 * (act in ("gelu", "gelu_tanh", "silu"))
        assert text.count("T.sblock(") == (5 + (m % 4 != 0 and m % 6 != 0) + staged), text
        # N off the grid: the packing pads, and is marked for tunefarm's split, not TVM's
        marks = [sch.get(b).annotations for b in sch.get_child_blocks(sch.get_sblock("root"))]
        marker = PADDED_PREPROC if n % 16 else PREPROC
        assert sum(marker in a for a in marks) == 1
        assert "T.erf(" not in text and "T.tanh(" not in text and "T.sigmoid(" not in text
        check_outputs(sch, wl, X86)
        check_kernel(sch, wl)


def check_kernel(sch: Any, wl: Any) -> None:
    """The kernel a measurer times (`tuner.core.prepack.kernel`), on the weights packed as the
    program's own packing packs them (`tuner.measure.packing.Packer`), computes the reference."""
    dev = tv.tvm.cpu(0)
    inputs = wl.make_inputs(5)
    kernel = prepack.kernel(sch.mod)
    assert tv.param_specs(kernel) != [(s, d) for _, s, d in wl.arg_specs()]  # weights packed
    args = Packer(inputs, wl.arg_specs()).kernel_inputs(sch.mod, X86, dev)
    outs = guarded.outputs([(s, d) for _, s, d in wl.arg_specs()[wl.num_inputs:]], dev)
    tv.compile_module(kernel, X86)["main"](*args, *(o.tensor for o in outs))
    rtol, atol = wl.tolerance()
    for got, ref in zip(outs, wl.reference(inputs), strict=True):
        np.testing.assert_allclose(got.numpy(), ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize(("n", "padded"), [
    (1024, 1024), (1000, 1008), (520, 528), (777, 800), (170, 192), (70, 80), (100, 112)])
def test_n_off_the_grid_is_padded_so_that_2_vector_micro_kernels_fit_where_it_costs_little(
        n: int, padded: int) -> None:
    """777 columns are 49 vectors, which only a 1-vector micro-kernel divides: padded to 50.
    Below 11 vectors the extra one would cost more than 1/11 of the columns: 70 stays at 5."""
    from schedules.gemm import GemmX86

    wl = parse_spec({"op": "matmul", "shape": [384, n, 64]})
    assert GemmX86().knob_extents(wl)["nv"] * 16 == padded
    space = registry.space_generator("gemm-x86", wl, X86)
    for sch in sample_points(space, wl, X86, n=1):  # the packed weight's [N/16, K, 16] panels
        assert f"({padded // 16}, 64, 16)" in sch.mod.script()


@pytest.mark.parametrize(("spec", "space"), [
    ({"op": "matmul", "shape": [1, 1024, 768]}, "auto"),  # a GEMV: rows padded to 8 lose
    ({"op": "dense", "shape": [3, 64, 48]}, "auto"),
    ({"op": "matmul", "shape": [4, 1024, 768]}, "gemm-x86"),
    ({"op": "batch_matmul", "shape": [4, 1, 32, 16]}, "auto"),  # a weight per batch: M = 1
])
def test_gemv_like_gemms_are_left_to_the_generated_space(spec: dict[str, Any],
                                                          space: str) -> None:
    wl = parse_spec(spec)
    assert registry.resolve("default", wl, X86) == space
    why = registry.TEMPLATES["gemm-x86"].why_not(wl, X86)
    assert (why is None) == (space == "gemm-x86"), why


def test_the_padded_weight_is_packed_apart_from_the_timed_kernel() -> None:
    """N off the grid: the packing pads (`if_then_else(j < N, w, 0)`), which TVM's
    RemoveWeightLayoutRewriteBlock refuses (so it is not marked for it); `tuner.core.prepack.kernel`
    splits it off as relax does,
    so the kernel timed (and built by tunefarm's pipeline) takes the packed weight and packs
    nothing. Built for znver4, not run: any CPU can check it."""
    from tests.support.targets import ZNVER4

    wl = parse_spec({"op": "matmul", "shape": [256, 1000, 64]})
    target = tv.make_target(ZNVER4)
    for sch in sample_points(registry.space_generator("gemm-x86", wl, target), wl, target, n=2):
        # MetaSchedule's view (its search, its features): a packing of every call
        assert tv.param_specs(tv.strip_layout_rewrite(sch.mod))[1] == ((64, 1000), "float32")
        kernel = prepack.kernel(sch.mod)
        assert tv.param_specs(kernel) == [((256, 64), "float32"), ((63, 64, 16), "float32"),
                                          ((256, 1000), "float32")]
        text = kernel.script()
        assert "if_then_else" not in text and text.count("T.sblock(") == 4, text  # root, init,
        # update, write-back
        asm = tv.compile_module(kernel, target).inspect_source("asm")
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
    assert "not a row max" in by_name["softmax-x86"]["reason"]  # matched by structure too
    assert "not elementwise" in by_name["activation-x86"]["reason"]

    odd = tmp_path / "odd.py"  # N = 40: off the 16-lane grid, padded
    odd.write_text(relax_tasks.linear(256, 40, 48).script())
    got = CliRunner().invoke(app, ["spaces", "--tvmscript", str(odd)])
    gemm = {s["name"]: s for s in json.loads(got.output)}["gemm-x86"]
    assert gemm["applies"] and gemm["knobs"]["nv"]["choices"] == [3, 1], gemm  # 48 / 16 = 3
    odd.write_text(relax_tasks.linear(2, 40, 48).script())
    got = CliRunner().invoke(app, ["spaces", "--tvmscript", str(odd)])
    reason = {s["name"]: s["reason"] for s in json.loads(got.output)}["gemm-x86"]
    assert reason.startswith("M=2 < 4 rows (a GEMV-like GEMM)"), reason
    soft = CliRunner().invoke(app, ["spaces", "softmax", "--shape", "4,64"])
    reason = {s["name"]: s["reason"] for s in json.loads(soft.output)}["gemm-x86"]
    assert "reduction" in reason


# --- conv2d --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("spec", "layout", "out", "padded"), [
    ({"op": "conv2d", "shape": [1, 8, 10, 10, 32, 3, 3], "padding": 1}, "NCHW", (1, 32, 10, 10),
     True),
    ({"op": "conv2d", "shape": [2, 8, 10, 9, 32, 3, 3], "layout": "NHWC", "stride": 2}, "NHWC",
     (2, 32, 4, 4), False),
])
def test_conv_op_specs_are_matched_by_their_blocks(spec: dict[str, Any], layout: str,
                                                   out: tuple[int, ...], padded: bool) -> None:
    m = match_conv_func(parse_spec(spec).prim_func())
    assert isinstance(m, ConvMatch), m
    assert (m.layout, m.out, m.c, m.padded, m.epilogue) == (layout, out, 8, padded, 0)


def test_relax_conv_tasks_with_epilogues_are_matched() -> None:
    m = match_conv_func(relax_tasks.conv2d(1, 8, 12, 32, 3, pad=1, epilogue="bn_res_relu"))
    assert isinstance(m, ConvMatch), m  # subtract, divide, multiply, add, add, relu
    assert (m.layout, m.out, m.padded, m.epilogue) == ("NCHW", (1, 32, 12, 12), True, 6)
    # without padding relax still writes the data through a block of its own: a plain copy
    m = match_conv_func(relax_tasks.conv2d(1, 16, 14, 32, 1, stride=2))
    assert isinstance(m, ConvMatch) and m.pad is not None and not m.padded, m
    assert (m.out, m.epilogue) == ((1, 32, 7, 7), 2)


@pytest.mark.parametrize(("func", "why"), [
    (lambda: parse_spec({"op": "depthwise_conv2d", "shape": [1, 8, 8, 8, 3, 3]}).prim_func(),
     "followed by 3 reductions"),
    (lambda: parse_spec({"op": "matmul", "shape": [8, 8, 8]}).prim_func(),
     "followed by 3 reductions"),
    (lambda: relax_tasks.conv2d(1, 8, 8, 8, 3, depthwise=True), "operands are not"),
    (lambda: parse_spec({"op": "conv2d", "shape": [1, 8, 8, 8, 16, 3, 3],
                         "dtype": "float64"}).prim_func(), "float32"),
])
def test_what_the_conv_matcher_does_not_serve_says_why(func: Any, why: str) -> None:
    got = match_conv_func(func())
    assert isinstance(got, NoMatch) and why in got.reason, got


@pytest.mark.parametrize(("c", "hw", "o", "k", "kw"), [
    (8, 10, 24, 3, {"pad": 1}),                              # bias + relu
    (16, 14, 40, 3, {"pad": 1, "epilogue": "bn_res_relu"}),  # batch norm, a residual input
    (8, 10, 24, 1, {"layout": "NHWC"}),
    (32, 7, 20, 3, {"pad": 1, "stride": 2, "epilogue": "none"}),
])
def test_output_channels_off_the_16_grid_are_padded(c: int, hw: int, o: int, k: int,
                                                     kw: dict[str, Any]) -> None:
    """O off the grid: zero filters pad it to whole 16-channel blocks (in the kernel's
    packing, split off as for the GEMM's padded weight), the write-back predicated."""
    wl = tir(relax_tasks.conv2d(2 if o == 20 else 1, c, hw, o, k, **kw))
    name = "conv2d-nhwc-x86" if kw.get("layout") == "NHWC" else "conv2d-nchwc-x86"
    assert registry.resolve("default", wl, X86) == name
    points = sample_points(registry.space_generator(name, wl, X86), wl, X86, n=1)
    assert points
    for sch in points:
        marks = [sch.get(b).annotations for b in sch.get_child_blocks(sch.get_sblock("root"))]
        assert sum(PADDED_PREPROC in a for a in marks) == 1
        check_outputs(sch, wl, X86)
        check_kernel(sch, wl)


@pytest.mark.parametrize(("c", "hw", "o", "k", "stride", "pad", "epilogue", "layout"), [
    (8, 10, 32, 3, 1, 1, "bias_relu", "NCHW"),
    (3, 20, 16, 7, 2, 3, "bn_relu", "NCHW"),      # a stem: 3 channels, 7×7, stride 2
    (16, 9, 32, 1, 2, 0, "bn", "NCHW"),           # a 1×1 downsample: the data block is a copy
    (16, 8, 16, 3, 1, 1, "bn_res_relu", "NCHW"),  # batch norm's four steps, a residual, relu
    (8, 7, 16, 3, 1, 1, "none", "NCHW"),
    (8, 10, 32, 3, 1, 1, "bn_res_relu", "NHWC"),
    (16, 9, 16, 1, 2, 0, "bias_relu", "NHWC"),
])
def test_the_conv_template_serves_fused_relax_tasks(c: int, hw: int, o: int, k: int, stride: int,
                                                    pad: int, epilogue: str, layout: str) -> None:
    wl = tir(relax_tasks.conv2d(1, c, hw, o, k, stride=stride, pad=pad, epilogue=epilogue,
                                layout=layout))
    name = "conv2d-nchwc-x86" if layout == "NCHW" else "conv2d-nhwc-x86"
    assert registry.resolve("default", wl, X86) == name
    points = sample_points(registry.space_generator(name, wl, X86), wl, X86, n=2)
    # 2 reduction orders x 3 placements of the padded input; a plain copy is only inlined
    assert len(points) == 2 * 2 * (3 if pad else 1)
    for sch in points:
        text = sch.mod.script()
        # every epilogue block folded into the register tile's write-back: no pass over memory
        assert 'T.sblock("T_' not in text and 'T.sblock("compute")' not in text, text
        check_outputs(sch, wl, X86)


def test_a_batch_norm_near_zero_is_no_wrong_answer() -> None:
    """ResNet-18's last stage (512 channels, 3×3, 7×7): with its batch norm's divisor drawn in
    [-1, 1] like any input, a channel divided by ~0.003 turned every schedule's reordered sum into
    a wrong answer (1 element of 25,088, 0.027 against a tolerance of 0.0046), and a model job
    spent its budget on a task that could never pass. Divisors are drawn from ±[0.5, 1]."""
    from tuner.measure.evaluate import check

    wl = tir(relax_tasks.conv2d(1, 512, 7, 512, 3, pad=1, epilogue="bn_res_relu"))
    (sch,) = sample_points(registry.space_generator("conv2d-nchwc-x86", wl, X86), wl, X86,
                           n=1)[:1]
    rt = tv.compile_module(sch.mod, X86)
    inputs = wl.make_inputs(0)  # what a worker checks against
    dev = tv.tvm.cpu(0)
    out = tv.tvm.runtime.tensor(np.zeros(wl.arg_specs()[-1][1], "float32"), dev)
    rt["main"](*(tv.tvm.runtime.tensor(a, dev) for a in inputs), out)
    ok, err, why = check([out.numpy()], wl.reference(inputs), *wl.tolerance())
    assert ok, why


# --- depthwise conv2d ----------------------------------------------------------------------------

def test_depthwise_op_specs_and_relax_grouped_convs_are_matched() -> None:
    spec = parse_spec({"op": "depthwise_conv2d", "shape": [1, 8, 10, 10, 3, 3], "padding": 1})
    m = match_depthwise_func(spec.prim_func())  # topi's block: 2 reductions, kernel[c, 0, r, q]
    assert isinstance(m, DepthwiseMatch) and not m.group_reduction, m
    assert (m.out, m.padded, m.epilogue) == ((1, 8, 10, 10), True, 0)
    # relax: a conv2d with groups = channels, a third reduction over one channel, data[n, c + k]
    m = match_depthwise_func(relax_tasks.conv2d(1, 32, 14, 32, 3, stride=2, pad=1,
                                                epilogue="bn_relu6", depthwise=True))
    assert isinstance(m, DepthwiseMatch) and m.group_reduction, m
    assert (m.out, m.padded, m.epilogue) == ((1, 32, 7, 7), True, 5)


@pytest.mark.parametrize(("func", "why"), [
    (lambda: relax_tasks.conv2d(1, 8, 8, 16, 3), "more than one input channel"),  # dense
    (lambda: _grouped(), "more than one input channel"),  # 4 groups of 4 channels
])
def test_what_the_depthwise_matcher_does_not_serve_says_why(func: Any, why: str) -> None:
    got = match_depthwise_func(func())
    assert isinstance(got, NoMatch) and why in got.reason, got


def _grouped() -> Any:
    from tvm import relax

    (func,) = relax_tasks.tasks({"x": (1, 16, 8, 8)}, {"w": (16, 4, 3, 3)}, lambda bb, x, w:
                                relax.op.nn.conv2d(x, w, groups=4)).values()
    return func


@pytest.mark.parametrize(("c", "hw", "k", "stride", "pad", "epilogue"), [
    (32, 14, 3, 2, 1, "bn_relu6"),  # MobileNet's: batch norm, relu6 (a clip)
    (16, 9, 3, 1, 1, "none"),
    (16, 12, 5, 1, 2, "bias_relu"),
    (8, 10, 3, 1, 0, "bias"),       # no padding: relax's data block is a plain copy
])
def test_the_depthwise_template_serves_fused_relax_tasks(c: int, hw: int, k: int, stride: int,
                                                         pad: int, epilogue: str) -> None:
    wl = tir(relax_tasks.conv2d(1, c, hw, c, k, stride=stride, pad=pad, epilogue=epilogue,
                                depthwise=True))
    assert registry.resolve("default", wl, X86) == "depthwise-nchw-x86"
    points = sample_points(registry.space_generator("depthwise-nchw-x86", wl, X86), wl, X86, n=2)
    assert len(points) == 2 * (3 if pad else 1)  # 3 placements of the padded input
    for sch in points:
        text = sch.mod.script()
        assert 'T.sblock("T_' not in text and 'T.sblock("compute")' not in text, text
        check_outputs(sch, wl, X86)
