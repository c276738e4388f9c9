"""`tuner.model.canonical`: an RMS norm spelled out as decoders write it in PyTorch
(`power → mean → add → rsqrt → multiply → multiply`) becomes one `R.nn.rms_norm`, one task that
`norm-x86` serves, a 1-D convolution a 2-D one of height 1 that the conv2d templates serve, and
an explicit zero pad before a convolution its own padding, each with the same result; any other
spelling is left as it was. Real relax, real builds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from schedules.registry import resolve
from tuner.core.tvm_api import make_target, relax, structural_equal, tvm
from tuner.model.canonical import Conv1dAsConv2d, FoldZeroPadIntoConv, RecogniseRmsNorm
from tuner.model.job import vet_tasks
from tuner.model.pipeline import extract, partition

TARGET = {"kind": "llvm", "mcpu": "x86-64-v3", "num-cores": 1}
SHAPE = (1, 8, 64)
EPS = 1e-6


def c(v: float, dtype: str = "float32") -> Any:
    return relax.const(v, dtype)


def _module(square: str = "power", eps: Any = None, axis: int = -1, weight_len: int = 64,
            order: str = "x*inv", dtype: str = "float32") -> Any:
    """`w * (x * rsqrt(mean(x², axis, keepdims) + eps))`, as relax's frontend imports Llama's
    RMS norm, with the variations a test asks for."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(SHAPE, dtype))
    w = relax.Var("w", relax.TensorType((weight_len,), dtype))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            sq = bb.emit(relax.op.power(x, c(2.0, dtype)) if square == "power"
                         else relax.op.multiply(x, x) if square == "product"
                         else relax.op.power(x, c(3.0, dtype)))
            mean = bb.emit(relax.op.mean(sq, axis=[axis], keepdims=True))
            inv = bb.emit(relax.op.rsqrt(bb.emit(relax.op.add(mean, c(EPS, dtype) if eps is None
                                                               else eps))))
            normed = bb.emit(relax.op.multiply(x, inv) if order == "x*inv"
                             else relax.op.multiply(inv, x))
            out = bb.emit_output(relax.op.multiply(w, normed) if order == "x*inv"
                                 else relax.op.multiply(normed, w))
        bb.emit_func_output(out)
    return bb.get()


def _ops(mod: Any) -> list[str]:
    found: list[str] = []
    relax.analysis.post_order_visit(
        mod["main"], lambda e: found.append(str(e.op.name)) if isinstance(e, relax.Call)
        and hasattr(e.op, "name") else None)
    return found


def _run(mod: Any, *args: np.ndarray) -> np.ndarray:
    with make_target(TARGET):
        mod = relax.transform.LegalizeOps()(mod)
    exe = tvm.compile(mod, target=make_target(TARGET))
    vm = relax.VirtualMachine(exe, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


def _inputs(dtype: str = "float32") -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return (rng.standard_normal(SHAPE).astype(dtype),
            rng.standard_normal(SHAPE[-1:]).astype(dtype))


@pytest.mark.parametrize("square,order", [("power", "x*inv"), ("product", "x*inv"),
                                          ("power", "inv*x")])
def test_a_spelled_out_rms_norm_becomes_one_operator_with_the_same_result(
        square: str, order: str) -> None:
    mod = _module(square, order=order)
    rewritten = RecogniseRmsNorm()(mod)
    assert _ops(rewritten) == ["relax.nn.rms_norm"], rewritten.script()
    x, w = _inputs()
    want = w * (x / np.sqrt((x.astype("float64") ** 2).mean(-1, keepdims=True) + EPS))
    np.testing.assert_allclose(_run(rewritten, x, w), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_run(mod, x, w), want, rtol=1e-5, atol=1e-5)


OTHERS: dict[str, Callable[[], Any]] = {
    "a cube": lambda: _module("cube"),
    "over another axis": lambda: _module(axis=1, weight_len=64),
    "a weight that is not the row's": lambda: _module(weight_len=1),
    "eps not a constant": lambda: _module(eps=relax.op.zeros((), "float32")),
    "in float64": lambda: _module(dtype="float64"),
}


@pytest.mark.parametrize("what", sorted(OTHERS))
def test_anything_else_is_left_as_it_was(what: str) -> None:
    mod = OTHERS[what]()
    rewritten = RecogniseRmsNorm()(mod)
    assert "relax.nn.rms_norm" not in _ops(rewritten)
    assert structural_equal(rewritten, mod)


def test_the_model_pipeline_makes_it_one_task_that_norm_x86_serves() -> None:
    tasks = extract(partition(_module(), TARGET), TARGET)
    kept, workloads, refused = vet_tasks(tasks)
    assert refused == [] and len(kept) == 1, [t.name for t in tasks]
    assert resolve("default", workloads[0], make_target(TARGET)) == "norm-x86"


def _conv1d_module(stride: int, padding: tuple[int, int], dilation: int, groups: int,
                   layout: str = "NCW") -> Any:
    """`nn.Conv1d(16, 8, 3, ...)` over 40 frames, as relax's frontend imports it."""
    bb = relax.BlockBuilder()
    shape = (1, 16, 40) if layout == "NCW" else (1, 40, 16)
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    w = relax.Var("w", relax.TensorType((8, 16 // groups, 3), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.conv1d(x, w, strides=stride, padding=padding,
                                                    dilation=dilation, groups=groups,
                                                    data_layout=layout))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("stride,padding,dilation,groups",
                         [(1, (1, 1), 1, 1), (2, (1, 1), 1, 1), (1, (2, 0), 2, 1),
                          (3, (0, 2), 1, 4)])
def test_a_1d_convolution_becomes_a_2d_one_with_the_same_result(
        stride: int, padding: tuple[int, int], dilation: int, groups: int) -> None:
    mod = _conv1d_module(stride, padding, dilation, groups)
    rewritten = Conv1dAsConv2d()(mod)
    assert "relax.nn.conv1d" not in _ops(rewritten)
    assert _ops(rewritten).count("relax.nn.conv2d") == 1
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 16, 40)).astype("float32")
    w = rng.standard_normal((8, 16 // groups, 3)).astype("float32")
    want = _run(mod, x, w)
    assert want.shape[:2] == (1, 8) and np.abs(want).max() > 1e-3
    np.testing.assert_allclose(_run(rewritten, x, w), want, rtol=1e-5, atol=1e-5)


def test_a_1d_convolution_in_another_layout_is_left_as_it_was() -> None:
    mod = _conv1d_module(1, (1, 1), 1, 1, layout="NWC")
    assert structural_equal(Conv1dAsConv2d()(mod), mod)


def test_the_1d_convolutions_task_is_served_by_a_conv2d_template() -> None:
    tasks = extract(partition(_conv1d_module(2, (1, 1), 1, 1), TARGET), TARGET)
    kept, workloads, refused = vet_tasks(tasks)
    spaces = {t.name: resolve("default", wl, make_target(TARGET))
              for t, wl in zip(kept, workloads, strict=True)}
    assert refused == [] and "conv2d-nchwc-x86" in spaces.values(), spaces


def _padded_conv_module(pad_width: list[int], layout: str = "NCHW", value: float = 0.0,
                        mode: str = "constant", groups: int = 1, relu: bool = False) -> Any:
    """`conv2d(pad(x))` (3×3, stride 2), as relax imports TensorFlow-style "same" padding;
    `relu`: after a ReLU, as MobileNetV2's next depthwise convolution reads its input."""
    bb = relax.BlockBuilder()
    shape = (1, 8, 15, 15) if layout == "NCHW" else (1, 15, 15, 8)
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    wshape = (8, 8 // groups, 3, 3) if layout == "NCHW" else (3, 3, 8 // groups, 8)
    w = relax.Var("w", relax.TensorType(wshape, "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(x)) if relu else x
            p = bb.emit(relax.op.nn.pad(y, pad_width, pad_mode=mode, pad_value=value))
            out = bb.emit_output(relax.op.nn.conv2d(
                p, w, strides=2, padding=(1, 0, 0, 1), groups=groups, data_layout=layout,
                kernel_layout="OIHW" if layout == "NCHW" else "HWIO"))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("pad_width,layout,groups", [
    ([0, 0, 0, 0, 0, 1, 0, 1], "NCHW", 1),   # TensorFlow's "same" for a stride 2
    ([0, 0, 0, 0, 1, 1, 1, 1], "NCHW", 8),   # a depthwise convolution's own padding
    ([0, 0, 2, 0, 1, 0, 0, 0], "NHWC", 1)])  # NHWC: the pad's axes 1 and 2
def test_a_zero_pad_before_a_convolution_becomes_its_padding_with_the_same_result(
        pad_width: list[int], layout: str, groups: int) -> None:
    mod = _padded_conv_module(pad_width, layout, groups=groups)
    rewritten = FoldZeroPadIntoConv()(mod)
    assert _ops(rewritten) == ["relax.nn.conv2d"], rewritten.script()
    rng = np.random.default_rng(2)
    x, w = (rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32")
            for p in mod["main"].params)
    want = _run(mod, x, w)
    assert np.abs(want).max() > 1e-3
    np.testing.assert_allclose(_run(rewritten, x, w), want, rtol=1e-5, atol=1e-5)


PADS: dict[str, Callable[[], Any]] = {
    "a pad of the batch": lambda: _padded_conv_module([1, 0, 0, 0, 1, 1, 1, 1]),
    "a pad of ones": lambda: _padded_conv_module([0, 0, 0, 0, 1, 1, 1, 1], value=1.0),
    "a reflecting pad": lambda: _padded_conv_module([0, 0, 0, 0, 1, 1, 1, 1], mode="reflect"),
}


@pytest.mark.parametrize("what", sorted(PADS))
def test_any_other_pad_is_left_as_it_was(what: str) -> None:
    mod = PADS[what]()
    assert structural_equal(FoldZeroPadIntoConv()(mod), mod)


def test_a_relu_and_the_next_convolutions_pad_no_longer_make_one_task_no_template_serves() -> None:
    tasks = extract(partition(_padded_conv_module([0, 0, 0, 0, 1, 1, 1, 1], groups=8,
                                                  relu=True), TARGET), TARGET)
    kept, workloads, refused = vet_tasks(tasks)
    spaces = {t.name: resolve("default", wl, make_target(TARGET))
              for t, wl in zip(kept, workloads, strict=True)}
    assert refused == [] and "depthwise-nchw-x86" in spaces.values(), spaces
    assert not any("pad" in name for name in spaces), spaces
