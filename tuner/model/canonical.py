"""Operators put in the form the expert templates serve: relax passes of the model pipeline
(`tuner.model.pipeline.partition`, before legalization) that rewrite what a frontend produces
into an equal computation whose task a template is written for. Matched with relax's dataflow
pattern language; anything the checks below do not accept stays as it was (a correct task, on
MetaSchedule's generated space).

- `RecogniseRmsNorm`: the RMS norm of Llama, Qwen2, Mistral, T5 and most decoders written in
  PyTorch (`x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)`, then `weight * ...`)
  reaches relax as `power → mean → add → rsqrt → multiply → multiply`. Legalized as is, it is two
  tasks (the square alone, then a reduction over a kept unit dimension and four elementwise
  blocks) that no template matches. As `R.nn.rms_norm(x, weight, axes=[-1], epsilon=eps)` it is
  one task, legalized by topi into the sum of squares, the reciprocal square root and the scaled
  product that `norm-x86` schedules: the same arithmetic (`x * rsqrt(sum(x·x) / n + eps) *
  weight`) in the input's float type. Float32 tensors, the last axis, a scalar constant `eps`
  and a weight of the normalised axis' length only.
- `Conv1dAsConv2d`: a 1-D convolution (`nn.Conv1d`: Whisper's and wav2vec's stems, NCW) as the
  2-D convolution of height 1 it is, `squeeze(conv2d(expand_dims(x, 2), expand_dims(w, 2)), 2)`
  with the same strides, padding, dilation and groups on the width. The conv2d task is the one
  the conv2d templates serve; the dimension of one added and removed is a reshape, which relax
  runs as a view of the same memory. NCW data and OIW weights of constant shapes only.
- `FoldZeroPadIntoConv`: an explicit zero `pad` before a 2-D convolution (TensorFlow's "same"
  padding as `transformers`' MobileNetV2 and EfficientNet apply it, `F.pad` then a convolution
  without padding) as the convolution's own padding. Fused as is, the pad joins the task of the
  convolution that produced its input (MobileNetV2: conv, batch norm, ReLU6, then the next
  depthwise convolution's pad, a task whose output is larger than the convolution's), which no
  conv template matches; folded, each convolution pads its own input as relax legalizes it. A
  constant zero pad of the spatial dimensions only (NCHW or NHWC).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.tvm_api import Expr, IRModule, relax, tvm
from .fixups import dtype_of, scalar_value

Rewriter = Callable[[Expr, Any], Expr]


def _shape(expr: Expr) -> list[int] | None:
    """The constant shape of a relax tensor expression, else None."""
    shape = getattr(getattr(expr, "ty", None), "shape", None)
    try:
        return None if shape is None else [int(d) for d in shape]
    except TypeError:  # a symbolic dimension
        return None


def _rms_norm() -> tuple[Any, Rewriter]:
    """The pattern of a spelled-out RMS norm, and its rewriter."""
    dpl = relax.dpl
    x, w, two, eps = dpl.wildcard(), dpl.wildcard(), dpl.is_const(), dpl.is_const()
    square = dpl.is_op("relax.power")(x, two) | dpl.is_op("relax.multiply")(x, x)
    mean = dpl.is_op("relax.mean")(square)
    inv = dpl.is_op("relax.rsqrt")(dpl.is_op("relax.add")(mean, eps))
    normed = dpl.is_op("relax.multiply")(x, inv) | dpl.is_op("relax.multiply")(inv, x)
    out = dpl.is_op("relax.multiply")(w, normed) | dpl.is_op("relax.multiply")(normed, w)

    def rewrite(orig: Expr, m: Any) -> Expr:
        data, weight = m[x], m[w]
        shape = _shape(data)
        if shape is None or dtype_of(data) != "float32" or dtype_of(weight) != "float32" \
                or _shape(weight) != shape[-1:] or _shape(orig) != shape:
            return orig
        if two in m and scalar_value(m[two]) != 2.0:
            return orig
        attrs = m[mean].attrs
        axes = [int(a) for a in attrs.axis] if attrs.axis is not None else []
        epsilon = scalar_value(m[eps])
        if not attrs.keepdims or axes not in ([-1], [len(shape) - 1]) or epsilon is None:
            return orig
        return relax.op.nn.rms_norm(data, weight, axes=[-1], epsilon=epsilon)

    return out, rewrite


def _conv1d() -> tuple[Any, Rewriter]:
    """The pattern of a 1-D convolution, and its rewriter into a 2-D one of height 1."""
    dpl = relax.dpl
    pattern = dpl.is_op("relax.nn.conv1d")(dpl.wildcard(), dpl.wildcard())

    def rewrite(orig: Any, m: Any) -> Expr:
        data, weight = orig.args
        a = orig.attrs
        if (str(a.data_layout), str(a.kernel_layout), str(a.out_layout)) != ("NCW", "OIW", "NCW") \
                or _shape(data) is None or _shape(weight) is None or _shape(orig) is None:
            return orig
        conv = relax.op.nn.conv2d(
            relax.op.expand_dims(data, 2), relax.op.expand_dims(weight, 2),
            strides=(1, int(a.strides[0])), padding=(0, int(a.padding[0]), 0, int(a.padding[1])),
            dilation=(1, int(a.dilation[0])), groups=int(a.groups),
            out_dtype=None if a.out_dtype is None else str(a.out_dtype))
        return relax.op.squeeze(conv, [2])

    return pattern, rewrite


def _zero_pad_conv() -> tuple[Any, Rewriter]:
    """The pattern of a 2-D convolution of an explicitly zero-padded input, and its rewriter."""
    dpl = relax.dpl
    x = dpl.wildcard()
    pad = dpl.is_op("relax.nn.pad")(x)
    pattern = dpl.is_op("relax.nn.conv2d")(pad, dpl.wildcard())

    def rewrite(orig: Any, m: Any) -> Expr:
        a, p = orig.attrs, m[pad].attrs
        layout = str(a.data_layout)
        widths = [int(v) for v in p.pad_width]
        if layout not in ("NCHW", "NHWC") or str(p.pad_mode) != "constant" \
                or float(p.pad_value) != 0.0 or len(widths) != 8:
            return orig
        h, w = layout.index("H"), layout.index("W")
        if any(widths[2 * d] or widths[2 * d + 1] for d in range(4) if d not in (h, w)):
            return orig  # a pad of the batch or the channels
        top, left, bottom, right = (int(v) for v in a.padding)
        padding = (top + widths[2 * h], left + widths[2 * w], bottom + widths[2 * h + 1],
                   right + widths[2 * w + 1])
        return relax.op.nn.conv2d(
            m[x], orig.args[1], strides=a.strides, padding=padding, dilation=a.dilation,
            groups=int(a.groups), data_layout=layout, kernel_layout=str(a.kernel_layout),
            out_layout=str(a.out_layout), out_dtype=None if a.out_dtype is None
            else str(a.out_dtype))

    return pattern, rewrite


class _Rewrite:
    """A module pass that rewrites every relax function with one pattern and its rewriter."""

    make: Callable[[], tuple[Any, Rewriter]]

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        pattern, rewrite = type(self).make()
        changed = False
        for gv, func in list(mod.functions_items()):
            if isinstance(func, relax.Function):
                new = relax.dpl.rewrite_call(pattern, rewrite, func)
                if not new.same_as(func):
                    mod.update_func(gv, new)
                    changed = True
        return relax.transform.Normalize()(mod) if changed else mod


@tvm.transform.module_pass(opt_level=0, name="TunefarmRecogniseRmsNorm")
class RecogniseRmsNorm(_Rewrite):
    """Every RMS norm spelled out as `power → mean → add → rsqrt → multiply → multiply`
    (float32, the last axis) as one `R.nn.rms_norm`."""

    make = staticmethod(_rms_norm)


@tvm.transform.module_pass(opt_level=0, name="TunefarmConv1dAsConv2d")
class Conv1dAsConv2d(_Rewrite):
    """Every 1-D convolution (NCW, OIW) as a 2-D one of height 1."""

    make = staticmethod(_conv1d)


@tvm.transform.module_pass(opt_level=0, name="TunefarmFoldZeroPadIntoConv")
class FoldZeroPadIntoConv(_Rewrite):
    """Every constant zero pad of a 2-D convolution's spatial dimensions as its own padding."""

    make = staticmethod(_zero_pad_conv)
