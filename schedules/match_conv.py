"""Matching convolutions by structure (as `schedules/match.py` matches GEMMs): any PrimFunc, an op
spec's or one relax produced (int32 or int64 indices, any names), whose root's child blocks are

- optionally one block writing the convolution's data from an input (topi's and relax's
  `pad_temp`: a padding, or a plain copy when there is none);
- a direct 2-D convolution block, float32, `out[...] += data[...] · kernel[...]` from 0:
  - `match_conv` (`ConvMatch`): 4 spatial and 3 reduction iterators, NCHW
    `out[n, o, y, x] += data[n, c, y·s + r·d, x·s + q·d] · kernel[o, c, r, q]` or NHWC
    `out[n, y, x, o] += data[n, y·s + r·d, x·s + q·d, c] · kernel[r, q, c, o]`, any stride s and
    dilation d;
  - `match_depthwise` (`DepthwiseMatch`): NCHW with one kernel [C, 1, KH, KW] per channel, as
    topi's `depthwise_conv2d_nchw` (`out[n, c, y, x] += data[n, c, ...] · kernel[c, 0, r, q]`, 2
    reductions) or relax's legalization of a conv2d with groups = channels (`group_conv2d_nchw`:
    a third reduction over the group's one input channel, `data[n, c + k, ...]`);
- then the elementwise epilogue `schedules.match` describes (bias, batch norm's per-channel
  subtract, divide, multiply, add on [1, C, 1, 1] constants, a residual add, relu, clip).

The templates (`schedules/conv.py`) fold the epilogue into their register tile's write-back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from schedules.match import (
    COMM_REDUCE,
    DATA_PAR,
    NoMatch,
    cached_match,
    child_blocks,
    epilogue_problem,
    is_var,
)
from tuner.core.tvm_api import (
    Expr,
    PrimFunc,
    SBlock,
    buffer_dtype,
    const_shape,
    func_params,
    tvm,
    tvm_ffi,
)
from tuner.workloads import Workload


@dataclass(frozen=True)
class ConvMatch:
    block: str  # the convolution block's name (unique among the root's child blocks)
    pad: str | None  # the block writing the data from the input (padding, or a plain copy)
    padded: bool  # whether that block pads (its output is larger than the input)
    layout: str  # "NCHW" (kernel [O, C, KH, KW]) or "NHWC" (kernel [KH, KW, C, O])
    out: tuple[int, int, int, int]  # (N, O, OH, OW), whatever the layout
    c: int
    epilogue: int  # elementwise blocks after the convolution


@dataclass(frozen=True)
class DepthwiseMatch:
    block: str
    pad: str | None
    padded: bool
    out: tuple[int, int, int, int]  # (N, C, OH, OW)
    group_reduction: bool  # relax's form: a reduction of extent 1 before the window's two
    epilogue: int


R = TypeVar("R")  # what `_convolution`'s `read` finds in a convolution block

# iterators of each layout's conv block, in order, and the indices of its data and kernel reads
_CONV_LAYOUTS = {
    "NCHW": ("nfyxcrs", ("n", "c", "yr", "xs"), "fcrs"),
    "NHWC": ("nyxfrsc", ("n", "yr", "xs", "c"), "rscf"),
}


def _vars_of(expr: Expr) -> list[tvm.tirx.Var]:
    out: list[tvm.tirx.Var] = []
    tvm_ffi.structural_walk(expr, [((tvm.tirx.Var,), out.append)])
    return out


def _reads_only(index: Expr, main: Expr, other: Expr | None) -> bool:
    """An index of the `main` iterator and possibly `other` only: a window's y·stride +
    r·dilation (or y·stride when the window is 1 wide), or a group's channel c + k."""
    found = _vars_of(index)
    return (any(x.same_as(main) for x in found)
            and all(x.same_as(main) or x.same_as(other) for x in found))


def _accumulation(b: SBlock, reductions: tuple[int, ...]) -> tuple[Any, Any, Any] | str:
    """(output store, first factor, second factor) of a block of 4 spatial iterators and one of
    `reductions` reduction iterators computing out += x · y from 0 in float32, or why not."""
    kinds = [int(iv.iter_type) for iv in b.iter_vars]
    if not any(kinds == [DATA_PAR] * 4 + [COMM_REDUCE] * r for r in reductions):
        return (f"its block is not 4 spatial iterators followed by "
                f"{' or '.join(map(str, reductions))} reductions")
    st, init = b.body, b.init
    if not isinstance(st, tvm.tirx.BufferStore) or not isinstance(init, tvm.tirx.BufferStore):
        return "the reduction block is not one store with an init"
    if not all(isinstance(iv.dom.extent, tvm.tirx.IntImm) for iv in b.iter_vars):
        return "an iterator has a symbolic extent"
    its = [iv.var for iv in b.iter_vars]
    if len(st.indices) != 4 or not all(map(is_var, st.indices, its[:4])):
        return "the reduction does not store its output at its spatial iterators"
    if not (isinstance(init.value, tvm.tirx.FloatImm) and float(init.value.value) == 0.0):
        return "the reduction does not start from 0"
    v = st.value
    if not (isinstance(v, tvm.tirx.Add) and isinstance(v.b, tvm.tirx.Mul)
            and isinstance(v.a, tvm.ir.TensorLoad) and v.a.source.same_as(st.buffer)
            and isinstance(v.b.a, tvm.ir.TensorLoad) and isinstance(v.b.b, tvm.ir.TensorLoad)):
        return "the reduction is not out += data * kernel"
    if any(str(buffer_dtype(x)) != "float32" for x in (st.buffer, v.b.a.source, v.b.b.source)):
        return "a convolution operand is not float32"
    return st, v.b.a, v.b.b


def _conv_block(b: SBlock) -> tuple[str, Any] | str:
    """(layout, data buffer) of a conv2d block, or why it is not one."""
    got = _accumulation(b, (3,))
    if isinstance(got, str):
        return got
    _, x, y = got
    its = [iv.var for iv in b.iter_vars]
    for layout, (order, data_axes, kernel_axes) in _CONV_LAYOUTS.items():
        named = dict(zip(order, its, strict=True))
        for data, kernel in ((x, y), (y, x)):
            if len(kernel.indices) != 4 or len(data.indices) != 4 or not all(
                    is_var(e, named[a]) for e, a in zip(kernel.indices, kernel_axes, strict=True)):
                continue
            if all(is_var(e, named[a]) if len(a) == 1 else _reads_only(e, *(named[c] for c in a))
                   for e, a in zip(data.indices, data_axes, strict=True)):
                return layout, data.source
    return ("the reduction's operands are not data[n, c, y·s + r·d, x·s + q·d] and "
            "kernel[o, c, r, q] (NCHW) or data[n, y, x, c] and kernel[r, q, c, o] (NHWC)")


def _depthwise_block(b: SBlock) -> tuple[bool, Any] | str:
    """(whether it has relax's group reduction, data buffer) of a depthwise block, or why not."""
    got = _accumulation(b, (2, 3))
    if isinstance(got, str):
        return got
    st, x, y = got
    its = [iv.var for iv in b.iter_vars]
    group = len(its) == 7
    if group and int(cast(tvm.tirx.IntImm, b.iter_vars[4].dom.extent)) != 1:
        return ("more than one input channel per output channel: a dense or grouped "
                "convolution, not a depthwise one")
    n, f, yv, xv = its[:4]
    k = its[4] if group else None
    r, q = its[-2:]
    for data, kernel in ((x, y), (y, x)):
        kshape = [int(d) for d in kernel.source.shape]
        if len(kernel.indices) != 4 or len(data.indices) != 4 or kshape[1] != 1:
            continue
        second = kernel.indices[1]
        if not (is_var(kernel.indices[0], f) and is_var(kernel.indices[2], r)
                and is_var(kernel.indices[3], q)
                and (is_var(second, k) if group else isinstance(second, tvm.tirx.IntImm))):
            continue
        if is_var(data.indices[0], n) and _reads_only(data.indices[1], f, k) \
                and _reads_only(data.indices[2], yv, r) and _reads_only(data.indices[3], xv, q) \
                and int(data.source.shape[1]) == int(st.buffer.shape[1]):
            return group, data.source
    return ("the reduction's operands are not data[n, c, y·s + r·d, x·s + q·d] and one kernel "
            "[C, 1, KH, KW] per channel")


def _around(func: PrimFunc, blocks: list[Any], at: int, data: tvm.tirx.Buffer
            ) -> tuple[str | None, bool, int] | NoMatch:
    """(data block's name, whether it pads, epilogue blocks) of the convolution block `at`, or
    why what comes before or after it is not served."""
    params = list(func_params(func))
    pad = None
    if at == 1:
        b = blocks[0]
        st, its = b.body, [iv.var for iv in b.iter_vars]
        if any(int(iv.iter_type) != DATA_PAR for iv in b.iter_vars) or b.init is not None \
                or not isinstance(st, tvm.tirx.BufferStore) or not st.buffer.same_as(data) \
                or len(st.indices) != len(its) or not all(map(is_var, st.indices, its)):
            return NoMatch(f"block {b.name_hint} before the convolution does not write its data")
        if any(not any(r.source.same_as(p) for p in params) for r in b.reads):
            return NoMatch(f"block {b.name_hint} before the convolution reads more than an input")
        pad = b.name_hint
    elif at > 1:
        return NoMatch("more than one block before the convolution")
    elif not any(data.same_as(p) for p in params):
        return NoMatch("the convolution's data is neither an input nor padded from one")
    names = [b.name_hint for b in blocks]
    if len(set(names)) != len(names):
        return NoMatch("two blocks share a name")
    out = blocks[at].body.buffer
    rest = blocks[at + 1:]
    if rest and any(out.same_as(p) for p in params):
        return NoMatch("the convolution's result is an output and also feeds an epilogue")
    if not rest and not any(out.same_as(p) for p in params):
        return NoMatch("the convolution's result is not an output")
    why = epilogue_problem(rest, [int(d) for d in out.shape], [out], params, "convolution")
    if why is not None:
        return NoMatch(why)
    padded = pad is not None and const_shape(data) != const_shape(blocks[0].reads[0].source)
    return pad, padded, len(rest)


def _convolution(func: PrimFunc, read: Callable[[Any], tuple[R, Any] | str]
                 ) -> tuple[Any, tuple[R, Any], tuple[str | None, bool, int]] | NoMatch:
    """(the convolution block, what `read` (`_conv_block` or `_depthwise_block`) finds in it,
    `_around` of it), or why `func` is not such a convolution."""
    blocks = child_blocks(func)
    at = next((n for n, b in enumerate(blocks) if b.init is not None), None)
    if at is None:
        return NoMatch("the function has no reduction block")
    got = read(blocks[at])
    if isinstance(got, str):
        return NoMatch(got)
    around = _around(func, blocks, at, got[1])
    return around if isinstance(around, NoMatch) else (blocks[at], got, around)


def match_conv_func(func: PrimFunc) -> ConvMatch | NoMatch:
    m = _convolution(func, _conv_block)
    if isinstance(m, NoMatch):
        return m
    conv, (layout, _), (pad, padded, epilogue) = m
    ext = [int(iv.dom.extent) for iv in conv.iter_vars]
    out = (ext[0], ext[1], ext[2], ext[3]) if layout == "NCHW" else \
        (ext[0], ext[3], ext[1], ext[2])
    c = ext[4] if layout == "NCHW" else ext[6]
    return ConvMatch(conv.name_hint, pad, padded, layout, out, c, epilogue)


def match_depthwise_func(func: PrimFunc) -> DepthwiseMatch | NoMatch:
    m = _convolution(func, _depthwise_block)
    if isinstance(m, NoMatch):
        return m
    conv, (group, _), (pad, padded, epilogue) = m
    n, c, oh, ow = (int(iv.dom.extent) for iv in conv.iter_vars[:4])
    return DepthwiseMatch(conv.name_hint, pad, padded, (n, c, oh, ow), group, epilogue)


def match_conv(workload: Workload) -> ConvMatch | NoMatch:
    """`match_conv_func` of the workload's PrimFunc, cached on the workload."""
    return cached_match(workload, "match:conv", match_conv_func)


def match_depthwise(workload: Workload) -> DepthwiseMatch | NoMatch:
    """`match_depthwise_func` of the workload's PrimFunc, cached on the workload."""
    return cached_match(workload, "match:depthwise", match_depthwise_func)
