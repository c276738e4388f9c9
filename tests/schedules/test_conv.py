"""Convolution templates (schedules/conv.py): random traces of every design space build and match
the numpy reference for small shapes (both conv2d layouts, stride 2, dilation 2, padding), with
AVX-512's 16-lane blocks where this CPU has them and AVX2's 8-lane blocks everywhere; the weight
packing is a layout-rewrite preproc block; `applies()` refuses what a template cannot serve.

No tuning runs: each case samples a few random traces and builds them (fast)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from schedules import registry
from schedules.registry import TEMPLATES
from tests.support import guarded
from tests.support.targets import AVX2_X86, HOST_AVX512, RUN_X86, ZNVER4
from tuner.core import tvm_api as tv
from tuner.workloads import parse_spec

TARGET_SPEC = RUN_X86
NCHWC, NHWC, DW = "conv2d-nchwc-x86", "conv2d-nhwc-x86", "depthwise-nchw-x86"


@pytest.fixture(scope="module")
def target() -> Any:
    registry.space_names()  # load the families
    return tv.make_target(TARGET_SPEC)


def _run(mod: Any, target: Any, inputs: list[np.ndarray], out_shapes: list[tuple[Any, ...]]
         ) -> list[np.ndarray]:
    rt = tv.compile_module(mod, target)
    dev = tv.tvm.cpu(0)
    outs = guarded.outputs(out_shapes, dev)
    rt["main"](*(tv.tvm.runtime.tensor(a, dev) for a in inputs), *(o.tensor for o in outs))
    return [o.numpy() for o in outs]


def _check_random_traces(tname: str, spec: dict[str, Any], target: Any, seeds: list[int]) -> int:
    """Every design space of `tname` for a few random seeds: build the whole program (packing
    included) and compare with the reference. Returns the number of programs checked."""
    w = parse_spec(spec)
    tmpl = TEMPLATES[tname]
    assert tmpl.applies(w, target)
    inputs = w.make_inputs(0)
    ref = w.reference(inputs)
    rtol, atol = w.tolerance()
    outs = [(s, d) for _, s, d in w.arg_specs()[w.num_inputs:]]
    checked = 0
    for seed in seeds:
        spaces = tmpl.apply(tv.Schedule(w.mod(), seed=seed), w, target)
        assert spaces, "a template yields at least one design space"
        for idx, sch in enumerate(spaces):
            (got,) = _run(sch.mod, target, inputs, outs)
            np.testing.assert_allclose(got, ref[0], rtol=rtol, atol=atol,
                                       err_msg=f"{tname} seed {seed} space {idx}: "
                                               f"{tv.trace_decisions(sch.trace)}")
            checked += 1
    return checked


CONV_CASES = [
    # shape [N, C, H, W, O, KH, KW], params
    ([1, 8, 10, 10, 32, 3, 3], {"padding": [1, 1]}),
    ([2, 5, 11, 9, 16, 3, 2], {"stride": [2, 2], "padding": [1, 0]}),
    ([1, 6, 13, 12, 16, 3, 3], {"dilation": [2, 2], "padding": [2, 1]}),
    ([1, 7, 9, 9, 48, 1, 1], {}),
    ([1, 4, 12, 10, 16, 5, 3], {"stride": [2, 1], "dilation": [1, 2], "padding": [2, 2]}),
]


@pytest.mark.parametrize("layout,tname", [("NCHW", NCHWC), ("NHWC", NHWC)])
@pytest.mark.parametrize("shape,params", CONV_CASES)
def test_conv2d_random_traces_match_reference(layout: str, tname: str, shape: list[int],
                                              params: dict[str, Any], target: Any) -> None:
    spec = {"op": "conv2d", "shape": shape, "layout": layout, **params}
    # design spaces: 2 reduction orders x 3 placements of the padded input (1: inlined, when
    # there is no padding)
    n_spaces = 2 * (3 if any(params.get("padding", [0, 0])) else 1)
    assert _check_random_traces(tname, spec, target, seeds=[1, 7]) == 2 * n_spaces


@pytest.mark.parametrize("layout,tname", [("NCHW", NCHWC), ("NHWC", NHWC)])
@pytest.mark.parametrize("shape,params", [CONV_CASES[0], CONV_CASES[1]])
def test_conv2d_at_8_lanes_random_traces_match_reference(layout: str, tname: str,
                                                         shape: list[int],
                                                         params: dict[str, Any]) -> None:
    """AVX2: the kernel packed in blocks of 8 channels, each 16-channel block of the register
    tile two ymm registers, the narrower column tiles."""
    spec = {"op": "conv2d", "shape": shape, "layout": layout, **params}
    n_spaces = 2 * (3 if any(params.get("padding", [0, 0])) else 1)
    assert _check_random_traces(tname, spec, tv.make_target(AVX2_X86), seeds=[1, 7]) \
        == 2 * n_spaces


def test_column_tile_is_narrower_with_16_vector_registers() -> None:
    """OW = 14 admits 7 or 14 columns with AVX-512's 32 registers (x ocv zmm); with AVX2's 16,
    where a 16-channel block takes two, 2 or 7: the choices the design space samples, and the
    ones `tunefarm spaces` shows."""
    w = parse_spec({"op": "conv2d", "shape": [1, 16, 14, 14, 32, 3, 3], "padding": [1, 1]})
    tmpl = TEMPLATES[NCHWC]

    def ow_choices(spec: dict[str, Any], wl: Any = w) -> list[int]:
        (sch,) = tmpl.apply(tv.Schedule(wl.mod(), seed=1), wl, tv.make_target(spec), pad="row",
                            order="c-outer")
        cands = [i.attrs[0] for i in sch.trace.insts if i.kind.name == "SampleCategorical"]
        return [int(c) for c in cands[0]]  # tile_ow is the first categorical knob

    assert ow_choices(ZNVER4) == [7, 14]
    assert ow_choices(AVX2_X86) == [2, 3, 4, 5, 6, 7]  # any width: the last tile partial
    knob = tmpl.knobs(w)["tile_ow"]
    assert knob["choices"] == [7, 14] and knob["choices_narrow"] == [2, 3, 4, 5, 6, 7]
    # output channels off the 16 grid (padded): OW's divisors only, sampled and shown
    padded = parse_spec({"op": "conv2d", "shape": [1, 16, 14, 14, 24, 3, 3], "padding": [1, 1]})
    assert ow_choices(AVX2_X86, padded) == [2, 7]
    assert tmpl.knobs(padded)["tile_ow"]["choices_narrow"] == [2, 7]


@pytest.mark.parametrize("layout,tname", [("NCHW", NCHWC), ("NHWC", NHWC)])
@pytest.mark.parametrize("pad", ["row", "tile", "inline"])
@pytest.mark.parametrize("o", [32, 24])
def test_column_tiles_that_do_not_divide_ow_are_peeled_and_correct(layout: str, tname: str,
                                                                   pad: str, o: int) -> None:
    """AVX2: a column tile of any width from 2 to 7 over OW = 10; the last tile of 3, 4, 6 or 7
    columns is partial (a predicate), and the tile loop carries the hint that peels it off. With
    the output channels padded (24), the divisors of OW only: there TVM drops the column guard
    of the write-back (`schedules/conv.py`). The outputs are guarded: a write past their end
    fails the test."""
    w = parse_spec({"op": "conv2d", "shape": [1, 8, 10, 10, o, 3, 3], "padding": [1, 1],
                    "layout": layout})
    target = tv.make_target(AVX2_X86)
    tmpl = TEMPLATES[tname]
    (design,) = tmpl.apply(tv.Schedule(w.mod(), seed=1), w, target, pad=pad, order="c-outer")
    tile_ow = next(i for i in design.trace.insts if i.kind.name == "SampleCategorical")
    widths = [int(c) for c in tile_ow.attrs[0]]
    assert widths == ([2, 3, 4, 5, 6, 7] if o % 16 == 0 else [2, 5])
    inputs = w.make_inputs(0)
    ref = w.reference(inputs)
    rtol, atol = w.tolerance()
    outs = [(s, d) for _, s, d in w.arg_specs()[w.num_inputs:]]
    for choice, width in enumerate(widths):
        sch = tv.Schedule(w.mod(), seed=1)
        tv.Trace(design.trace.insts, {tile_ow: choice}).apply_to_schedule(sch,
                                                                          remove_postproc=True)
        text = sch.mod.script()
        assert ("pragma_loop_partition_hint" in text) == (o % 16 == 0)
        assert ("T.where(xx_0 * " in text) == (10 % width != 0), text
        (got,) = _run(sch.mod, target, inputs, outs)
        np.testing.assert_allclose(got, ref[0], rtol=rtol, atol=atol,
                                   err_msg=f"{pad}: {width} columns")


@pytest.mark.parametrize("shape,params", [
    ([1, 8, 10, 10, 3, 3], {"padding": [1, 1]}),
    ([2, 5, 11, 9, 3, 2], {"stride": [2, 2], "padding": [1, 0]}),
    ([1, 6, 13, 12, 3, 3], {"dilation": [2, 2], "padding": [2, 2]}),
    ([1, 3, 20, 17, 5, 5], {"stride": [1, 2], "dilation": [2, 1], "padding": [0, 2]}),
    ([1, 4, 9, 34, 3, 3], {}),
])
def test_depthwise_random_traces_match_reference(shape: list[int], params: dict[str, Any],
                                                 target: Any) -> None:
    spec = {"op": "depthwise_conv2d", "shape": shape, **params}
    n_spaces = 3 if any(params.get("padding", [0, 0])) else 1
    assert _check_random_traces(DW, spec, target, seeds=[1, 5, 9]) == 3 * n_spaces


@pytest.mark.parametrize("spec,lanes", [(RUN_X86, 16 if HOST_AVX512 else 8), (AVX2_X86, 8)],
                         ids=["run_x86", "avx2"])
@pytest.mark.parametrize("layout,tname", [("NCHW", NCHWC), ("NHWC", NHWC)])
def test_kernel_is_packed_by_a_preproc_block_and_the_timed_kernel_takes_it(
        layout: str, tname: str, spec: dict[str, Any], lanes: int) -> None:
    """What tuner.measure.sandbox does: replay the trace JSON, strip the layout-rewrite block,
    run the kernel with the weight packed by hand: in blocks of one vector register of output
    channels (16 with AVX-512, 8 with AVX2)."""
    target = tv.make_target(spec)
    blocks = 32 // lanes
    # NCHW [O/L, C, KH, KW, L]; NHWC [O/L, KH, KW, C, L]
    packed = (blocks, 8, 3, 3, lanes) if layout == "NCHW" else (blocks, 3, 3, 8, lanes)
    w = parse_spec({"op": "conv2d", "shape": [1, 8, 9, 9, 32, 3, 3], "layout": layout,
                    "padding": [1, 1]})
    sch = TEMPLATES[tname].apply(tv.Schedule(w.mod(), seed=3), w, target)[0]
    annotated = [b for b in sch.get_child_blocks(sch.get_sblock("root"))
                 if "meta_schedule.layout_rewrite_preproc" in sch.get(b).annotations]
    assert len(annotated) == 1
    replayed = tv.apply_trace(w.mod(), tv.trace_to_json(sch.trace))
    assert tv.structural_equal(replayed.mod, sch.mod)
    kernel_mod = tv.strip_layout_rewrite(replayed.mod)
    (_, dshape, dt), (_, kshape, _), (_, oshape, _) = w.arg_specs()
    assert tv.param_specs(kernel_mod) == [(dshape, dt), (packed, dt), (oshape, dt)]
    data, kernel = w.make_inputs(1)
    if layout == "NCHW":  # [O, C, KH, KW] -> [O/L, C, KH, KW, L]
        kp = kernel.reshape(blocks, lanes, 8, 3, 3).transpose(0, 2, 3, 4, 1)
    else:  # [KH, KW, C, O] -> [O/L, KH, KW, C, L]
        kp = kernel.reshape(3, 3, 8, blocks, lanes).transpose(3, 0, 1, 2, 4)
    (got,) = _run(kernel_mod, target, [data, np.ascontiguousarray(kp)], [(oshape, dt)])
    rtol, atol = w.tolerance()
    np.testing.assert_allclose(got, w.reference([data, kernel])[0], rtol=rtol, atol=atol)


def test_space_generates_every_design_space_and_postprocessing_succeeds(target: Any) -> None:
    """The MetaSchedule space (ScheduleFn): one design space per structural variant, the
    postprocessors accept them, and the sampled knobs are sampling instructions."""
    for tname, spec, n_spaces in [
        (NCHWC, {"op": "conv2d", "shape": [1, 8, 8, 8, 16, 3, 3], "padding": [1, 1]}, 6),
        (NHWC, {"op": "conv2d", "shape": [1, 8, 8, 8, 16, 3, 3], "layout": "NHWC"}, 2),
        (DW, {"op": "depthwise_conv2d", "shape": [1, 8, 8, 8, 3, 3], "padding": [1, 1]}, 3),
    ]:
        w = parse_spec(spec)
        tmpl = TEMPLATES[tname]
        ctx = tv.tune_context(w.mod(), target, space=tmpl.space(w, target),
                              strategy="replay-trace", seed=1, num_threads=1)
        spaces = ctx.generate_design_space()
        assert len(spaces) == n_spaces
        # the search replays each design space with new decisions; replaying must leave the
        # workload's (cached) module untouched (TVM 0.27 rewrites it in place when a schedule
        # starts with a root-block annotation)
        before = tv.structural_hash(w.mod())
        for space in spaces:
            for seed in (2, 3):
                space.trace.apply_to_schedule(tv.Schedule(w.mod(), seed=seed), remove_postproc=True,
                                              decision_provider=lambda *_: None)
        assert tv.structural_hash(w.mod()) == before
        kinds = {k for _, k, _ in tv.trace_decisions(spaces[0].trace)}
        assert kinds == {"SamplePerfectTile", "SampleCategorical"}
        sch = spaces[-1]
        for proc in ctx.space_generator.postprocs:
            assert proc.apply(sch), f"{tname}: postproc {proc} failed"
        inputs = w.make_inputs(0)
        (got,) = _run(sch.mod, target, inputs, [(s, d) for _, s, d in w.arg_specs()[2:]])
        rtol, atol = w.tolerance()
        np.testing.assert_allclose(got, w.reference(inputs)[0], rtol=rtol, atol=atol)
        json.dumps(tmpl.describe(w))  # knobs are plain JSON


def test_applies_only_where_the_template_can_serve(target: Any) -> None:
    def w(op: str, shape: list[int], **kw: Any) -> Any:
        return parse_spec({"op": op, "shape": shape, **kw})

    nchw = w("conv2d", [1, 8, 8, 8, 32, 3, 3])
    nhwc = w("conv2d", [1, 8, 8, 8, 32, 3, 3], layout="NHWC")
    assert TEMPLATES[NCHWC].applies(nchw, target) and not TEMPLATES[NCHWC].applies(nhwc, target)
    assert TEMPLATES[NHWC].applies(nhwc, target) and not TEMPLATES[NHWC].applies(nchw, target)
    # output channels not a multiple of 16: padded with zero filters to whole blocks
    for layout, tname in (("NCHW", NCHWC), ("NHWC", NHWC)):
        odd = w("conv2d", [1, 8, 8, 8, 24, 3, 3], layout=layout)
        assert [t for t in (NCHWC, NHWC, DW) if TEMPLATES[t].applies(odd, target)] == [tname]
    # float16 is not what these fp32 micro-kernels compute
    assert not TEMPLATES[NCHWC].applies(w("conv2d", [1, 8, 8, 8, 32, 3, 3], dtype="float16"),
                                        target)
    dw = w("depthwise_conv2d", [1, 8, 8, 8, 3, 3])
    assert TEMPLATES[DW].applies(dw, target)
    assert not TEMPLATES[DW].applies(nchw, target) and not TEMPLATES[NCHWC].applies(dw, target)
    assert not TEMPLATES[DW].applies(w("matmul", [16, 16, 16]), target)
    arm = tv.make_target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "num-cores": 2})
    assert not any(TEMPLATES[t].applies(x, arm) for t, x in ((NCHWC, nchw), (NHWC, nhwc), (DW, dw)))
    # each op/layout has exactly one of these templates (the one "default" prefers); elsewhere
    # none applies and the registry falls back to "auto"
    for x, tname in ((nchw, NCHWC), (nhwc, NHWC), (dw, DW)):
        assert [t for t in (NCHWC, NHWC, DW) if TEMPLATES[t].applies(x, target)] == [tname]
