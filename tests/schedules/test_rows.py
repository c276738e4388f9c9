"""The memory-bound families matched by structure (`schedules/match_rows.py`): relax's standalone
activations (`activation-x86`) and its softmax over [batch, heads, rows, cols] with a copy after it
(`softmax-x86`), built here from small relax models: matched, served by the template (no libm call
left, correct outputs), or told why not."""

from __future__ import annotations

from typing import Any

import pytest

from bench import fused as relax_tasks
from schedules import registry
from schedules.match import NoMatch
from schedules.match_rows import (
    ActivationMatch,
    SoftmaxMatch,
    match_activation_func,
    match_softmax_func,
)
from tests.schedules.test_spaces import X86, check_outputs, sample_points
from tuner.core import tvm_api as tv
from tuner.workloads import parse_spec


def tir(func: Any) -> Any:
    return parse_spec({"op": "tir", "tvmscript": func.script()})


@pytest.mark.parametrize(("shape", "act", "fn"), [
    ((32, 96), "gelu", "erf"),         # BERT's GELU between two reshapes
    ((8, 4, 48), "gelu_tanh", "tanh"),
    ((16, 64), "silu", "sigmoid"),     # x · sigmoid(x): x read before and after the activation
    ((2, 80), "tanh", "tanh"),         # the activation reads the input (no block before it)
    ((6, 40), "gelu", "erf"),          # a row of 8-lane vectors only (Whisper's 3,000 frames)
])
def test_the_activation_template_serves_relax_activations(shape: tuple[int, ...], act: str,
                                                          fn: str) -> None:
    func = relax_tasks.activation(shape, act)
    m = match_activation_func(func)
    assert isinstance(m, ActivationMatch) and m.fn == fn and m.row == shape[-1], m
    wl = tir(func)
    assert registry.resolve("default", wl, X86) == "activation-x86"
    points = sample_points(registry.space_generator("activation-x86", wl, X86), wl, X86, n=3)
    assert len(points) == 3
    for sch in points:
        text = sch.mod.script()
        assert f"T.{fn}(" not in text, text  # the polynomial, no libm call per element
        check_outputs(sch, wl, X86)


def test_an_activation_writing_the_output_is_tensorized_in_place() -> None:
    """`R.tanh(x)` alone: one block, the activation itself writes the output."""
    (func,) = relax_tasks.tasks({"x": (4, 64)}, {}, lambda bb, x:
                                relax_tasks.op("tanh")(x)).values()
    wl = tir(func)
    assert registry.resolve("default", wl, X86) == "activation-x86"
    for sch in sample_points(registry.space_generator("activation-x86", wl, X86), wl, X86, n=2):
        assert "T.tanh(" not in sch.mod.script()
        check_outputs(sch, wl, X86)


def test_a_gelu_cast_to_bf16_for_the_next_gemm_is_served() -> None:
    """A bf16 model's GELU (`tune-model --dtype bfloat16`): reshape, GELU, reshape back, then
    the cast to bf16 of the next linear layer's input, one task; both trailing blocks folded
    the other way into the activation's chain, the cast stored per vector."""
    shape = (32, 96)

    def body(bb: Any, x: Any) -> Any:
        y = bb.emit(relax_tasks.op("reshape")(x, (1, *shape)))
        y = bb.emit(relax_tasks.op("reshape")(bb.emit(relax_tasks.op("nn.gelu")(y)), shape))
        return relax_tasks.op("astype")(y, "bfloat16")

    (func,) = relax_tasks.tasks({"x": shape}, {}, body).values()
    m = match_activation_func(func)
    assert isinstance(m, ActivationMatch) and m.fn == "erf" and m.copy_out == 2, m
    wl = tir(func)
    assert wl.arg_specs()[-1][2] == "bfloat16"
    assert registry.resolve("default", wl, X86) == "activation-x86"
    for sch in sample_points(registry.space_generator("activation-x86", wl, X86), wl, X86, n=2):
        assert "T.erf(" not in sch.mod.script()
        check_outputs(sch, wl, X86)


def _transposed_gelu(add: bool) -> Any:
    def body(bb: Any, x: Any, y: Any) -> Any:
        t = relax_tasks.op("permute_dims")(bb.emit(relax_tasks.op("nn.gelu")(x)), [1, 0])
        return relax_tasks.op("add")(bb.emit(t), y) if add else t

    (func,) = relax_tasks.tasks({"x": (32, 32), "y": (32, 32)}, {}, body).values()
    return func


def _gelu_to_heads() -> Any:
    def body(bb: Any, x: Any) -> Any:
        return relax_tasks.op("reshape")(bb.emit(relax_tasks.op("nn.gelu")(x)), (32, 2, 16))

    (func,) = relax_tasks.tasks({"x": (32, 32)}, {}, body).values()
    return func


@pytest.mark.parametrize(("func", "why"), [
    (lambda: relax_tasks.linear(16, 32, 16, "gelu"), "not elementwise"),
    (lambda: relax_tasks.activation((16, 32), "relu"), "no activation block"),
    (lambda: _gelu_to_heads(), "last dimension"),
])
def test_what_the_activation_matcher_does_not_serve_says_why(func: Any, why: str) -> None:
    got = match_activation_func(func())
    assert isinstance(got, NoMatch) and why in got.reason, got


def test_a_transposed_copy_is_folded_into_the_block_before_it() -> None:
    """GELU then a transpose: the copy is folded into the block before it
    (`reverse_compute_inline`), which stores transposed; the activation keeps its own order."""
    wl = tir(_transposed_gelu(add=False))
    assert registry.resolve("default", wl, X86) == "activation-x86"
    for sch in sample_points(registry.space_generator("activation-x86", wl, X86), wl, X86, n=2):
        check_outputs(sch, wl, X86)


def test_a_transposed_read_is_left_to_the_generated_space() -> None:
    """GELU, a transpose, then an add: matched (every block is elementwise or injective), but each
    output vector needs a column of the GELU; the dry run of `why_not` says so, and the default
    space is MetaSchedule's."""
    wl = tir(_transposed_gelu(add=True))
    assert isinstance(match_activation_func(wl.prim_func()), ActivationMatch)
    why = registry.TEMPLATES["activation-x86"].why_not(wl, X86)
    assert why is not None and ("per vector" in why or "elements of the activation" in why), why
    assert registry.resolve("default", wl, X86) == "auto"


def test_an_activation_row_off_the_8_grid_is_left_to_the_generated_space() -> None:
    wl = tir(relax_tasks.activation((4, 36), "gelu"))
    assert isinstance(match_activation_func(wl.prim_func()), ActivationMatch)
    why = registry.TEMPLATES["activation-x86"].why_not(wl, X86)
    assert why == "the last dimension (36) is not a multiple of 8", why
    assert registry.resolve("default", wl, X86) == "auto"


@pytest.mark.parametrize(("mcpu", "why"), [
    ("znver3", None),  # AVX2: each 16-lane vector computed as two halves
    ("skylake-avx512", None),
    ("nehalem", "not an x86 LLVM target with AVX2 or AVX-512"),  # SSE4.2: 4 lanes
])
def test_the_activation_template_wants_avx2_or_avx512(mcpu: str, why: str | None) -> None:
    """Found on a Zen 3 (AVX2): relax's GELU over 128x3072 (fused suite F17) fell to the
    generated space, one libm erff call per element, and ran 5x slower than PyTorch; with the
    template it ran 2x faster (bench/RESULTS.md Run AL)."""
    wl = tir(relax_tasks.activation((32, 96), "gelu"))
    target = tv.make_target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
    assert registry.TEMPLATES["activation-x86"].why_not(wl, target) == why
    assert registry.resolve("default", wl, target) == ("auto" if why else "activation-x86")


@pytest.mark.parametrize("shape", [(1, 4, 16, 32), (3, 24, 48), (10, 64),
                                   (1, 2, 6, 197), (5, 17)])  # off the 4 grid: whole rows
def test_relax_softmax_with_a_copy_gets_the_softmax_template(shape: tuple[int, ...]) -> None:
    func = relax_tasks.softmax(shape)
    m = match_softmax_func(func)
    assert isinstance(m, SoftmaxMatch), m
    assert (m.row_dims, m.last_rows, m.cols) == (len(shape) - 1, shape[-2], shape[-1])
    wl = tir(func)
    assert registry.resolve("default", wl, X86) == "softmax-x86"
    points = sample_points(registry.space_generator("softmax-x86", wl, X86), wl, X86, n=3)
    assert len(points) == 6  # two design spaces (norm: reciprocal, divide)
    for sch in points:
        text = sch.mod.script()
        assert "T.exp(" not in text and 'T.sblock("T_broadcast_to")' not in text, text
        check_outputs(sch, wl, X86)


def test_the_softmax_op_spec_is_matched_by_its_blocks() -> None:
    m = match_softmax_func(parse_spec({"op": "softmax", "shape": [6, 48]}).prim_func())
    assert isinstance(m, SoftmaxMatch) and (m.rows, m.cols, m.copies) == (6, 48, 0)


def _layer_norm() -> Any:
    (func,) = relax_tasks.tasks({"x": (16, 32)}, {"g": (32,), "b": (32,)}, lambda bb, x, g, b:
                                relax_tasks.op("nn.layer_norm")(x, g, b, axes=[-1])).values()
    return func


@pytest.mark.parametrize(("func", "why"), [
    (lambda: relax_tasks.linear(16, 32, 16), "fewer than four blocks"),
    (lambda: _layer_norm(), "not a row max"),
    (lambda: relax_tasks.activation((16, 32), "gelu"), "not spatial iterators followed by"),
])
def test_what_the_softmax_matcher_does_not_serve_says_why(func: Any, why: str) -> None:
    got = match_softmax_func(func())
    assert isinstance(got, NoMatch) and why in got.reason, got
