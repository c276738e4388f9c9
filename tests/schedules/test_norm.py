"""Row normalisations matched by structure (`schedules/match_norm.py`) and served by `norm-x86`:
relax's layer norm and RMS norm, built here from small relax models, over 2-D and 3-D inputs
(int64 indices), with rows on and off the vector grid; what the matcher does not serve says
why."""

from __future__ import annotations

from typing import Any

import pytest

from bench import fused as relax_tasks
from schedules import registry
from schedules.base import vector_lanes
from schedules.match import NoMatch
from schedules.match_norm import COLUMN, ELEMENTWISE, ROW, SUM, NormMatch, match_norm_func
from schedules.norm import ACCUMULATORS
from tests.schedules.test_spaces import X86, check_outputs, sample_points
from tuner.core import tvm_api as tv
from tuner.workloads import parse_spec


def tir(func: Any) -> Any:
    return parse_spec({"op": "tir", "tvmscript": func.script()})


@pytest.mark.parametrize(("shape", "kind", "spaces"), [
    ((16, 64), "layer_norm", 3),       # 64 = 4 x 16 lanes: 1, 2 or 4 accumulators
    ((3, 5, 48), "layer_norm", 1),     # 15 rows over two dimensions, 48 = 3 x 16 lanes
    ((2, 7, 32), "rms_norm", 2),       # relax's casts and copies around the RMS norm
    ((32, 32), "layer_norm", 2),       # as many rows as columns: the mean is per row, gamma
                                       # and beta per column
])
def test_relax_normalisations_get_the_norm_template(shape: tuple[int, ...], kind: str,
                                                    spaces: int) -> None:
    func = relax_tasks.norm(shape, kind)
    m = match_norm_func(func)
    assert isinstance(m, NormMatch), m
    assert (m.row_dims, m.last_rows, m.cols) == (len(shape) - 1, shape[-2], shape[-1])
    kinds = dict(m.kinds)
    if kind == "layer_norm":
        assert kinds == {"x_sum": SUM, "x_mean": ROW, "x_var_sum": SUM,
                         "T_layer_norm": ELEMENTWISE}, kinds
    else:
        assert len(m.named(SUM)) == 1 and len(m.named(ROW)) == 1 and len(m.named(COLUMN)) == 1
    wl = tir(func)
    assert registry.resolve("default", wl, X86) == "norm-x86"
    tpl = registry.TEMPLATES["norm-x86"]
    assert [v["accumulators"] for v in tpl.design_variants(wl)] == ["1", "2", "4"][:spaces]
    points = sample_points(registry.space_generator("norm-x86", wl, X86), wl, X86, n=2)
    assert len(points) == 2 * spaces
    for sch in points:
        text = sch.mod.script()
        # every elementwise block folded: the output's block reads the input itself
        assert all(f'T.sblock("{n}")' not in text for n in m.named(ELEMENTWISE)[:-1]), text
        assert "T.vectorized" in text and "T.parallel" in text
        assert "pragma_auto_unroll_max_step" not in text  # the unroll knob is off the grid's
        check_outputs(sch, wl, X86)


def test_the_norm_space_lists_its_knobs() -> None:
    wl = tir(relax_tasks.norm((8, 128), "rms_norm"))
    knobs = registry.TEMPLATES["norm-x86"].knobs(wl)
    assert knobs["rows"]["kind"] == "perfect_tile" and knobs["rows"]["extent"] == 8, knobs
    assert knobs["accumulators"]["choices"] == ["1", "2", "4"]
    assert knobs["normalise"]["choices"] == ["vector"]  # "loop" and "peeled" too off the 4 grid
    assert knobs["unroll"]["choices"] == [0, 512]


def _softmax() -> Any:
    return relax_tasks.softmax((4, 32))


def _gelu() -> Any:
    (func,) = relax_tasks.tasks({"x": (16, 32)}, {}, lambda bb, x:
                                relax_tasks.op("nn.gelu")(x)).values()
    return func


def _norm_over_first_axis() -> Any:
    (func,) = relax_tasks.tasks({"x": (16, 32)}, {"g": (16,), "b": (16,)}, lambda bb, x, g, b:
                                relax_tasks.op("nn.layer_norm")(x, g, b, axes=[0])).values()
    return func


@pytest.mark.parametrize(("func", "why"), [
    (_softmax, "block T_softmax_maxelem is not a row sum"),  # a max is softmax's
    (_gelu, "no row sum"),  # elementwise only
    (lambda: relax_tasks.linear(16, 32, 16), "is not a row sum, a per-row value"),
    (_norm_over_first_axis, "is not a row sum, a per-row value"),
])
def test_what_the_norm_matcher_does_not_serve_says_why(func: Any, why: str) -> None:
    got = match_norm_func(func())
    assert isinstance(got, NoMatch) and why in got.reason, got


@pytest.mark.parametrize(("shape", "kind", "by_width"), [
    # partial sums: the row's largest divisor up to 1, 2 and 4 vectors' lanes, one design space
    # per distinct count at 16 lanes; a narrower target fills those spaces with its own counts
    ((4, 30), "layer_norm", {16: (15, 30), 8: (6, 15)}),
    ((2, 3, 18), "rms_norm", {16: (9, 18), 8: (6, 9)}),  # over two row dimensions
    ((3, 22), "layer_norm", {16: (11, 22), 8: (2, 11)}),
    ((2, 54), "rms_norm", {16: (9, 27, 54), 8: (6, 9, 27)}),
])
def test_rows_off_the_vector_grid_keep_the_template_in_odd_vectors(
        shape: tuple[int, ...], kind: str, by_width: dict[int, tuple[int, ...]]) -> None:
    width = vector_lanes(X86, 32)  # the CI machine's CPU varies: AVX-512 or AVX2
    if width not in by_width:
        pytest.skip(f"no expected partial counts for {width} lanes")
    counts = by_width[width]
    wl = tir(relax_tasks.norm(shape, kind))
    assert registry.resolve("default", wl, X86) == "norm-x86"
    tpl = registry.TEMPLATES["norm-x86"]
    out = match_norm_func(wl.prim_func()).kinds[-1][0]
    variants = tpl.design_variants(wl)
    assert [(v["accumulators"], v["normalise"]) for v in variants
            if v["sums"] == "divisors"] == [
        (acc, form) for acc in ("1", "2", "4")[:len(counts)]
        for form in ("vector", "loop", "peeled")]
    points = sample_points(registry.space_generator("norm-x86", wl, X86), wl, X86, n=2)
    assert len(points) == 2 * len(variants)  # two per design space, in the order of the variants
    for i, sch in enumerate(points):
        v = variants[i // 2]
        if v["sums"] == "tail":  # test_row_sums_off_the_grid_can_take_a_predicated_tail
            continue
        text = sch.mod.script()
        # the row sums' partials: one rfactor block of the variant's count, no halving tree
        assert "_rf" in text and "_rf_rf" not in text, text
        assert "T.parallel" in text and "pragma_auto_unroll_max_step" in text, text
        partials = counts[ACCUMULATORS.index(v["accumulators"])]
        assert (f"T.vectorized({partials})" in text
                or f"T.vectorized(T.int64({partials}))" in text), (partials, text)
        # ... and the normalisation: the whole row as one vector, a loop left to LLVM, or
        # vectors of the target's width, the last one partial and peeled off
        *_, steps, row = (sch.get(lp) for lp in sch.get_loops(sch.get_sblock(out)))
        vectorized = row.kind == tv.tvm.tirx.ForKind.VECTORIZED
        if v["normalise"] == "peeled":
            assert vectorized and int(row.extent) == width, (v, text)
            assert int(steps.extent) == -(-shape[-1] // width), (v, text)
            assert steps.annotations.get("pragma_loop_partition_hint") == 1, (v, text)
        else:
            assert int(row.extent) == shape[-1]
            assert vectorized == (v["normalise"] == "vector"), (v, text)
        check_outputs(sch, wl, X86)


@pytest.mark.parametrize(("shape", "kind", "tails"), [
    ((2, 54), "rms_norm", ("1", "2")),     # 16 or 32 partial sums over a row of 54
    ((2, 3, 18), "rms_norm", ("1",)),      # two row dimensions; 32 partials exceed the row
    ((4, 130), "layer_norm", ("1", "2")),  # two sums, the second reads the mean
    ((3, 2, 30), "layer_norm", ("1",)),
    ((4, 64), "rms_norm", ()),             # on the grid: whole vectors anyway
])
def test_row_sums_off_the_grid_can_take_a_predicated_tail(
        shape: tuple[int, ...], kind: str, tails: tuple[str, ...]) -> None:
    wl = tir(relax_tasks.norm(shape, kind))
    tpl = registry.TEMPLATES["norm-x86"]
    variants = tpl.design_variants(wl)
    assert tuple(v["accumulators"] for v in variants if v["sums"] == "tail") == tails
    assert all(v["normalise"] == "vector" for v in variants if v["sums"] == "tail")
    width = vector_lanes(X86, 32)
    points = sample_points(registry.space_generator("norm-x86", wl, X86), wl, X86, n=2)
    assert len(points) == 2 * len(variants)
    for i, sch in enumerate(points):
        v = variants[i // 2]
        if v["sums"] != "tail":
            continue
        text = sch.mod.script()
        partials = width * int(v["accumulators"])
        sums = len(match_norm_func(wl.prim_func()).named(SUM))
        # each sum a parallel pass in whole vectors, the last one predicated and peeled off;
        # then the normalisation, a pass of the same kind
        assert text.count("_rf = T.sblock_alloc_buffer") == sums, text
        assert text.count("T.where(") == sums + 1, text
        assert (f"T.vectorized({partials})" in text
                or f"T.vectorized(T.int64({partials}))" in text), (partials, text)
        assert text.count("pragma_loop_partition_hint") == sums + 1, text
        assert text.count("T.parallel") == sums + 1, text
        assert "pragma_auto_unroll_max_step" in text, text
        check_outputs(sch, wl, X86)  # a predicate lost would read past the row


@pytest.mark.parametrize(("shape", "kind", "tails"), [
    ((4, 37), "layer_norm", ("1", "2")),   # a prime: no divisor form, 16 or 32 partials
    ((2, 3, 29), "rms_norm", ("1",)),      # two row dimensions; 32 partials exceed the row
    ((3, 121), "layer_norm", ("1", "2")),  # 11 x 11: no divisor from 2 to 8 (AVX2's width)
])
def test_rows_without_a_small_divisor_take_the_tail_form_only(
        shape: tuple[int, ...], kind: str, tails: tuple[str, ...]) -> None:
    wl = tir(relax_tasks.norm(shape, kind))
    assert registry.resolve("default", wl, X86) == "norm-x86"
    variants = registry.TEMPLATES["norm-x86"].design_variants(wl)
    assert [(v["sums"], v["accumulators"]) for v in variants] == [("tail", a) for a in tails]
    points = sample_points(registry.space_generator("norm-x86", wl, X86), wl, X86, n=2)
    assert len(points) == 2 * len(tails)
    for sch in points:
        assert "T.where(" in sch.mod.script()
        check_outputs(sch, wl, X86)


def test_short_rows_of_a_prime_length_are_left_to_the_generated_space() -> None:
    wl = tir(relax_tasks.norm((4, 13), "layer_norm"))
    assert isinstance(match_norm_func(wl.prim_func()), NormMatch)
    why = registry.TEMPLATES["norm-x86"].why_not(wl, X86)
    assert why == ("the row length (13) has no divisor from 2 to 8 and is no longer than one "
                   "16-lane vector")
    assert registry.resolve("default", wl, X86) == "auto"
