"""2-D convolutions: conv2d (NCHW or NHWC) and depthwise_conv2d (NCHW).

The shape lists logical sizes in the same order for both layouts; `layout` decides how the data,
kernel and output tensors are laid out. stride/padding/dilation are canonical [h, w] pairs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ..core.config import get_settings
from ..core.errors import SpecError
from .base import (
    DILATION,
    FLOAT_DTYPES,
    PADDING,
    STRIDE,
    ArgSpec,
    OpDef,
    ParamDef,
    float_tolerance,
)

LAYOUT = ParamDef("layout", "choice", "NCHW",
                  "NCHW: data[N,C,H,W], kernel[O,C,KH,KW]; NHWC: data[N,H,W,C], kernel[KH,KW,C,O]",
                  choices=("NCHW", "NHWC"))
DW_LAYOUT = ParamDef("layout", "choice", "NCHW", "only NCHW: data[N,C,H,W], kernel[C,1,KH,KW]",
                     choices=("NCHW",))


def out_size(size: int, k: int, stride: int, pad: int, dil: int) -> int:
    return (size + 2 * pad - dil * (k - 1) - 1) // stride + 1


def _check_window(spec: dict[str, Any], h: int, w: int, kh: int, kw: int, kh_idx: int) -> None:
    """The dilated kernel must fit in the padded input (else the output is empty), and the padded
    input (a real tensor in the topi compute) must respect max_tensor_elements."""
    n, c = spec["shape"][:2]
    (ph, pw), (dh, dw) = spec["padding"], spec["dilation"]
    for axis, size, k, p, d, idx in (("height", h, kh, ph, dh, kh_idx),
                                     ("width", w, kw, pw, dw, kh_idx + 1)):
        if d * (k - 1) + 1 > size + 2 * p:
            raise SpecError(
                f"kernel {axis} {k} (dilated to {d * (k - 1) + 1}) is larger than the padded input "
                f"{axis} {size}+2*{p}={size + 2 * p}: the output would be empty",
                field=f"shape[{idx}]")
    padded = n * c * (h + 2 * ph) * (w + 2 * pw)
    limit = get_settings().max_tensor_elements
    if padded > limit:
        raise SpecError(f"the padded input has {padded} elements; the limit "
                        f"(max_tensor_elements) is {limit}", field="padding")


def _patches(data: np.ndarray, spec: dict[str, Any], oh: int, ow: int, kh: int, kw: int,
             nchw: bool) -> Iterator[tuple[int, int, np.ndarray]]:
    """Yield (i, j, window) with window = padded input at kernel tap (i, j), strided to OHxOW."""
    (sh, sw), (ph, pw), (dh, dw) = spec["stride"], spec["padding"], spec["dilation"]
    pads = [(0, 0), (0, 0), (ph, ph), (pw, pw)] if nchw else [(0, 0), (ph, ph), (pw, pw), (0, 0)]
    x = np.pad(np.asarray(data, dtype=np.float64), pads)
    for i in range(kh):
        for j in range(kw):
            ys = slice(i * dh, i * dh + sh * (oh - 1) + 1, sh)
            xs = slice(j * dw, j * dw + sw * (ow - 1) + 1, sw)
            yield i, j, (x[:, :, ys, xs] if nchw else x[:, ys, xs, :])


# --- conv2d ----------------------------------------------------------------------------------


def _conv_dims(spec: dict[str, Any]) -> tuple[int, ...]:
    n, c, h, w, o, kh, kw = spec["shape"]
    (sh, sw), (ph, pw), (dh, dw) = spec["stride"], spec["padding"], spec["dilation"]
    return n, c, h, w, o, kh, kw, out_size(h, kh, sh, ph, dh), out_size(w, kw, sw, pw, dw)


def _conv_check(spec: dict[str, Any]) -> None:
    n, c, h, w, o, kh, kw = spec["shape"]
    _check_window(spec, h, w, kh, kw, 5)


def _conv_args(spec: dict[str, Any]) -> list[ArgSpec]:
    n, c, h, w, o, kh, kw, oh, ow = _conv_dims(spec)
    dt = spec["dtype"]
    if spec["layout"] == "NHWC":
        return [("data", (n, h, w, c), dt), ("kernel", (kh, kw, c, o), dt),
                ("output", (n, oh, ow, o), dt)]
    return [("data", (n, c, h, w), dt), ("kernel", (o, c, kh, kw), dt),
            ("output", (n, o, oh, ow), dt)]


def _conv_compute(spec: dict[str, Any]) -> list[Any]:
    from ..core.tvm_api import te, topi

    (_, dshape, dt), (_, kshape, _), _ = _conv_args(spec)
    data = te.placeholder(dshape, dt, name="data")
    kernel = te.placeholder(kshape, dt, name="kernel")
    fn = topi.nn.conv2d_nhwc if spec["layout"] == "NHWC" else topi.nn.conv2d_nchw
    out = fn(data, kernel, list(spec["stride"]), list(spec["padding"]), list(spec["dilation"]),
             out_dtype=dt)
    return [data, kernel, out]


def _conv_ref(spec: dict[str, Any], inputs: list[np.ndarray]) -> list[np.ndarray]:
    data, kernel = inputs
    n, c, h, w, o, kh, kw, oh, ow = _conv_dims(spec)
    nchw = spec["layout"] == "NCHW"
    k = np.asarray(kernel, dtype=np.float64)
    out = np.zeros((n, o, oh, ow) if nchw else (n, oh, ow, o))
    for i, j, win in _patches(data, spec, oh, ow, kh, kw, nchw):
        if nchw:
            out += np.einsum("nchw,oc->nohw", win, k[:, :, i, j])
        else:
            out += np.einsum("nhwc,co->nhwo", win, k[i, j])
    return [out.astype(spec["dtype"])]


def _conv_flops(spec: dict[str, Any]) -> int:
    n, c, h, w, o, kh, kw, oh, ow = _conv_dims(spec)
    return 2 * n * o * oh * ow * c * kh * kw


def _conv_tolerance(spec: dict[str, Any]) -> tuple[float, float]:
    _, c, _, _, _, kh, kw = spec["shape"]
    return float_tolerance(spec["dtype"], c * kh * kw)


CONV2D = OpDef(
    name="conv2d",
    shape_doc="N,C,H,W,O,KH,KW: batch, input channels, height, width, output channels, kernel "
              "height, kernel width (logical sizes, same order for both layouts)",
    shape_names=("N", "C", "H", "W", "O", "KH", "KW"), default_dtype="float32",
    dtypes=FLOAT_DTYPES, params=(LAYOUT, STRIDE, PADDING, DILATION),
    doc="2-D convolution (topi.nn.conv2d_nchw / conv2d_nhwc), symmetric zero padding. "
        "Output size: (H + 2*pad - dilation*(KH-1) - 1) // stride + 1.",
    inputs_doc=("data: NCHW [N,C,H,W] / NHWC [N,H,W,C]",
                "kernel: NCHW [O,C,KH,KW] / NHWC [KH,KW,C,O]"),
    outputs_doc=("output: NCHW [N,O,OH,OW] / NHWC [N,OH,OW,O]",),
    args=_conv_args, compute=_conv_compute, reference=_conv_ref, flops=_conv_flops,
    tolerance=_conv_tolerance, check=_conv_check,
)


# --- depthwise_conv2d (NCHW) -----------------------------------------------------------------


def _dw_dims(spec: dict[str, Any]) -> tuple[int, ...]:
    n, c, h, w, kh, kw = spec["shape"]
    (sh, sw), (ph, pw), (dh, dw) = spec["stride"], spec["padding"], spec["dilation"]
    return n, c, h, w, kh, kw, out_size(h, kh, sh, ph, dh), out_size(w, kw, sw, pw, dw)


def _dw_check(spec: dict[str, Any]) -> None:
    n, c, h, w, kh, kw = spec["shape"]
    _check_window(spec, h, w, kh, kw, 4)


def _dw_args(spec: dict[str, Any]) -> list[ArgSpec]:
    n, c, h, w, kh, kw, oh, ow = _dw_dims(spec)
    dt = spec["dtype"]
    return [("data", (n, c, h, w), dt), ("kernel", (c, 1, kh, kw), dt),
            ("output", (n, c, oh, ow), dt)]


def _dw_compute(spec: dict[str, Any]) -> list[Any]:
    from ..core.tvm_api import te, topi

    (_, dshape, dt), (_, kshape, _), _ = _dw_args(spec)
    data = te.placeholder(dshape, dt, name="data")
    kernel = te.placeholder(kshape, dt, name="kernel")
    out = topi.nn.depthwise_conv2d_nchw(data, kernel, list(spec["stride"]),
                                        list(spec["padding"]), list(spec["dilation"]),
                                        out_dtype=dt)
    return [data, kernel, out]


def _dw_ref(spec: dict[str, Any], inputs: list[np.ndarray]) -> list[np.ndarray]:
    data, kernel = inputs
    n, c, h, w, kh, kw, oh, ow = _dw_dims(spec)
    k = np.asarray(kernel, dtype=np.float64)
    out = np.zeros((n, c, oh, ow))
    for i, j, win in _patches(data, spec, oh, ow, kh, kw, True):
        out += win * k[None, :, 0, i, j, None, None]
    return [out.astype(spec["dtype"])]


def _dw_flops(spec: dict[str, Any]) -> int:
    n, c, h, w, kh, kw, oh, ow = _dw_dims(spec)
    return 2 * n * c * oh * ow * kh * kw


def _dw_tolerance(spec: dict[str, Any]) -> tuple[float, float]:
    kh, kw = spec["shape"][4:]
    return float_tolerance(spec["dtype"], kh * kw)


DEPTHWISE_CONV2D = OpDef(
    name="depthwise_conv2d",
    shape_doc="N,C,H,W,KH,KW: batch, channels, height, width, kernel height, kernel width "
              "(NCHW; channel multiplier 1)",
    shape_names=("N", "C", "H", "W", "KH", "KW"), default_dtype="float32",
    dtypes=FLOAT_DTYPES, params=(DW_LAYOUT, STRIDE, PADDING, DILATION),
    doc="Depthwise 2-D convolution (topi.nn.depthwise_conv2d_nchw), symmetric zero padding.",
    inputs_doc=("data[N,C,H,W]", "kernel[C,1,KH,KW]"), outputs_doc=("output[N,C,OH,OW]",),
    args=_dw_args, compute=_dw_compute, reference=_dw_ref, flops=_dw_flops,
    tolerance=_dw_tolerance, check=_dw_check,
)
