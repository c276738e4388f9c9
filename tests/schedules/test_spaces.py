"""Every template: random points of its space build and compute the right answer; the registry
describes spaces as JSON and picks the right one per workload and target."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from schedules import registry
from tests.support import guarded
from tests.support.targets import RUN_X86
from tuner.core import tvm_api as tv
from tuner.core.errors import SpecError
from tuner.workloads import parse_spec

X86 = tv.make_target(RUN_X86)

# small shapes of each op that x86 templates serve
SMALL = {
    "matmul": [{"op": "matmul", "shape": [24, 48, 40]}, {"op": "matmul", "shape": [64, 32, 16]}],
    "dense": [{"op": "dense", "shape": [16, 64, 24]}],
    "batch_matmul": [{"op": "batch_matmul", "shape": [3, 8, 32, 20]}],
    "dense_int8": [{"op": "dense_int8", "shape": [16, 64, 32]}],
    "softmax": [{"op": "softmax", "shape": [8, 64]}],
    "conv2d": [{"op": "conv2d", "shape": [1, 16, 10, 10, 32, 3, 3], "padding": 1},
               {"op": "conv2d", "shape": [1, 16, 11, 11, 16, 3, 3], "stride": 2, "dilation": 2},
               {"op": "conv2d", "shape": [1, 16, 10, 10, 32, 3, 3], "padding": 1,
                "layout": "NHWC"}],
    "depthwise_conv2d": [{"op": "depthwise_conv2d", "shape": [1, 16, 12, 12, 3, 3], "padding": 1}],
}


def sample_points(space: Any, workload: Any, target: Any, n: int) -> list[Any]:
    """What the search does: replay each design space with fresh random decisions, then the
    space's postprocessors. Points the postprocessors reject are the space's own constraints."""
    ctx = tv.tune_context(workload.mod(), target, space=space,
                          strategy=tv.ms.search_strategy.ReplayTrace(), seed=7, num_threads=1)
    out = []
    for d, design in enumerate(ctx.generate_design_space()):
        for seed in range(1, n + 1):
            sch = tv.Schedule(workload.mod(), seed=seed * 31 + d)
            tv.Trace(design.trace.insts, {}).apply_to_schedule(sch, remove_postproc=True)
            if all(pp.apply(sch) for pp in ctx.space_generator.postprocs):
                out.append(sch)
    return out


def check_outputs(sch: Any, workload: Any, target: Any) -> None:
    rt = tv.compile_module(sch.mod, target)  # the whole program: weight packing included
    inputs = workload.make_inputs(3)
    dev = tv.tvm.cpu(0)
    args = [tv.tvm.runtime.tensor(a, dev) for a in inputs]
    outs = guarded.outputs([(s, d) for _, s, d in workload.arg_specs()[len(inputs):]], dev)
    rt["main"](*args, *(o.tensor for o in outs))
    rtol, atol = workload.tolerance()
    for got, ref in zip(outs, workload.reference(inputs), strict=True):
        np.testing.assert_allclose(got.numpy(), ref, rtol=rtol, atol=atol)


def _x86_cases() -> list[tuple[str, dict[str, Any]]]:
    cases = []
    for name in registry.space_names():
        t = registry.TEMPLATES.get(name)
        if t is None:
            continue
        for op in t.ops:
            for spec in SMALL.get(op, []):
                if t.applies(parse_spec(spec), X86):
                    cases.append((name, spec))
    return cases


@pytest.mark.parametrize(("name", "spec"), _x86_cases(),
                         ids=lambda v: v if isinstance(v, str) else v["op"])
def test_random_points_of_the_space_build_and_are_correct(name: str, spec: dict[str, Any]) -> None:
    wl = parse_spec(spec)
    points = sample_points(registry.space_generator(name, wl, X86), wl, X86, n=6)
    assert len(points) >= 6, "the space's constraints reject almost everything"
    for sch in points:
        check_outputs(sch, wl, X86)


def test_a_trace_replays_to_the_same_program() -> None:
    wl = parse_spec(SMALL["dense"][0])
    (sch, *_) = sample_points(registry.space_generator("gemm-x86", wl, X86), wl, X86, n=1)
    again = tv.apply_trace(wl.mod(), tv.trace_to_json(sch.trace))
    assert tv.structural_equal(again.mod, sch.mod)


def test_default_space_prefers_a_template_and_falls_back_to_auto() -> None:
    matmul = parse_spec({"op": "matmul", "shape": [64, 64, 64]})
    assert registry.resolve("default", matmul, X86) == "gemm-x86"
    # no template for fp64 GEMM: the generated space serves it
    wl64 = parse_spec({"op": "matmul", "shape": [64, 64, 64], "dtype": "float64"})
    assert registry.resolve("default", wl64, X86) == "auto"
    arm = tv.make_target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]})
    assert "gemm-x86" not in registry.spaces_for(matmul, arm)


# a GEMM into a function-level buffer, then scaled out: gemm-x86 matches it by structure, but
# its space fails on it ("... is an output block"); the default must not be that template
GEMM_INTO_BUFFER = """from tvm.script import tirx as T

@T.prim_func(s_tir=True)
def main(A: T.Buffer((64, 64), "float32"), B: T.Buffer((64, 64), "float32"),
         D: T.Buffer((64, 64), "float32")):
    T.func_attr({"global_symbol": "main", "tirx.noalias": True})
    C = T.alloc_buffer((64, 64), "float32")
    for i, j, k in T.grid(64, 64, 64):
        with T.sblock("C"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]
    for i, j in T.grid(64, 64):
        with T.sblock("D"):
            vi, vj = T.axis.remap("SS", [i, j])
            D[vi, vj] = C[vi, vj] * T.float32(2)
"""


def test_default_skips_a_template_that_cannot_generate_its_space() -> None:
    wl = parse_spec({"op": "tir", "tvmscript": GEMM_INTO_BUFFER})
    assert registry.spaces_for(wl, X86)[0] == "gemm-x86"
    assert not registry.generates("gemm-x86", wl, X86)
    assert registry.resolve("default", wl, X86) == "auto"
    with pytest.raises(SpecError, match="no design space"):  # asked for by name: the reason
        ctx = tv.tune_context(wl.mod(), X86, space=registry.space_generator("gemm-x86", wl, X86),
                              strategy=registry.search_strategy("gemm-x86"), seed=0,
                              num_threads=1)
        tv.design_spaces(ctx)


def test_bad_space_names_are_refused_with_the_known_ones() -> None:
    wl = parse_spec({"op": "softmax", "shape": [4, 8]})
    with pytest.raises(SpecError, match=r"unknown space 'nope'.*auto"):
        registry.resolve("nope", wl, X86)
    with pytest.raises(SpecError, match="does not apply"):
        registry.resolve("gemm-x86", wl, X86)


def test_spaces_describe_themselves_as_json() -> None:
    for name in registry.space_names():
        if name == "default":
            continue
        d = registry.describe(name)
        json.dumps(d)
        assert d["name"] == name and d["kind"] in ("template", "generated")
        for knob in d["knobs"].values():
            assert knob["kind"] and knob["doc"]
    ops = {s["name"] for s in registry.describe_op("dense")}
    assert {"gemm-x86", "auto"} <= ops


def test_the_search_is_sized_by_the_space() -> None:
    """A template sets its evolutionary search's population and generations; the generated space
    keeps MetaSchedule's defaults."""
    registry.space_names()
    for name, tmpl in registry.TEMPLATES.items():
        s = registry.search_strategy(name)
        assert (s.population_size, s.genetic_num_iters) == (tmpl.population_size,
                                                            tmpl.genetic_iters)
    auto = registry.search_strategy("auto")
    assert (auto.population_size, auto.genetic_num_iters) == (512, 4)
