"""Matching the memory-bound families by structure (as `schedules/match.py` matches GEMMs): any
PrimFunc, an op spec's or one relax produced (int32 or int64 indices, any names), read off the
root's child blocks.

- `match_activation` (`ActivationMatch`): a chain of elementwise and injective blocks (spatial
  iterators only, each storing at exactly its iterators: relax's reshapes, broadcasts, scalings)
  around one activation block `Y[idx] = f(X[idx])`, f in erf, tanh or sigmoid, over float32 whose
  last dimension is the output's (relax's standalone GELU, `reshape → x·½(1 + erf(x/√2)) →
  reshape`: LLVM calls libm once per element for f);
- `match_softmax` (`SoftmaxMatch`): topi's softmax over the last axis (a max reduction, exp(x -
  max), a sum reduction, exp / sum, in this order, over any number of leading row dimensions),
  then any number of plain copies to the output's shape (relax's `broadcast_to` to the same
  shape).

Every block name must be unique: the templates look blocks up by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from schedules.match import (
    COMM_REDUCE,
    DATA_PAR,
    NoMatch,
    cached_match,
    child_blocks,
    is_var,
    loads,
)
from tuner.core.tvm_api import PrimFunc, SBlock, buffer_dtype, func_params, tvm
from tuner.workloads import Workload

ACTIVATION_FNS = ("erf", "tanh", "sigmoid")  # those with a polynomial intrinsic


@dataclass(frozen=True)
class ActivationMatch:
    act: str  # the activation block's name
    fn: str  # erf, tanh or sigmoid
    input_block: str | None  # the block computing the activation's input (None: a parameter)
    # trailing blocks, after the one that follows the activation, each of which copies (reshapes)
    # the block before it or computes each element from that one's element alone (the cast to
    # bf16 of a bf16 model's GEMM input): relax's reshape back, then the cast
    copy_out: int
    row: int  # extent of the output's last dimension (the activation's too)


@dataclass(frozen=True)
class SoftmaxMatch:
    max_block: str
    exp_block: str
    sum_block: str
    norm_block: str
    copies: int  # plain copies after the normalisation
    row_dims: int  # leading dimensions
    rows: int  # their product
    last_rows: int  # the extent of the last of them
    cols: int  # the reduced (last) dimension


def activation_of(block: Any, fns: tuple[str, ...] = ACTIVATION_FNS) -> str | None:
    """`f` when the block's body is `Y[idx] = f(X[idx])` in float32 for f in `fns`."""
    store = block.body
    call: Any = getattr(store, "value", None)
    fn = str(getattr(getattr(call, "op", None), "name", "")).rsplit(".", 1)[-1]
    if fn not in fns or len(call.args) != 1 or store.buffer.dtype != "float32":
        return None
    load = call.args[0]
    same = (isinstance(load, tvm.ir.TensorLoad) and len(load.indices) == len(store.indices)
            and all(a.same_as(b) for a, b in zip(load.indices, store.indices, strict=True)))
    return fn if same else None


def _stores_at_iterators(b: SBlock) -> bool:
    st, its = b.body, [iv.var for iv in b.iter_vars]
    return (isinstance(st, tvm.tirx.BufferStore) and len(st.indices) == len(its)
            and all(map(is_var, st.indices, its)))


def _spatial(b: SBlock) -> bool:
    return b.init is None and all(int(iv.iter_type) == DATA_PAR for iv in b.iter_vars) \
        and all(isinstance(iv.dom.extent, tvm.tirx.IntImm) for iv in b.iter_vars)


def _unique_names(blocks: list[SBlock]) -> bool:
    names = [b.name_hint for b in blocks]
    return len(set(names)) == len(names)


def match_activation_func(func: PrimFunc) -> ActivationMatch | NoMatch:
    blocks = child_blocks(func)
    if not blocks:
        return NoMatch("the function has no blocks")
    if not _unique_names(blocks):
        return NoMatch("two blocks share a name")
    for b in blocks:
        if not _spatial(b) or not _stores_at_iterators(b):
            return NoMatch(f"block {b.name_hint} is not elementwise or injective (a reduction, "
                           "or a store at other indices)")
    acts = [(n, f) for n, b in enumerate(blocks) if (f := activation_of(b))]
    if len(acts) != 1:
        return NoMatch("no activation block (erf, tanh or sigmoid of one float32 load)"
                       if not acts else "more than one activation block")
    at, fn = acts[0]
    params = list(func_params(func))
    outputs = [b for b in blocks if any(b.body.buffer.same_as(p) for p in params)]
    if len(outputs) != 1 or not outputs[0].same_as(blocks[-1]):
        return NoMatch("the last block is not the one block writing an output")
    out = blocks[-1].body.buffer
    act = blocks[at].body.buffer
    if str(out.dtype) not in ("float32", "bfloat16"):  # bf16: cast for a bf16 GEMM's input
        return NoMatch("the output is not float32 (nor bfloat16)")
    row = int(out.shape[-1])
    if int(act.shape[-1]) != row:
        return NoMatch(f"the activation's last dimension ({int(act.shape[-1])}) is not the "
                       f"output's ({row})")
    src = blocks[at].body.value.args[0].source
    producer = next((b for b in blocks[:at] if b.body.buffer.same_as(src)), None)
    if producer is None and not any(src.same_as(p) for p in params):
        return NoMatch("the activation's input is neither an input nor computed before it")
    copy_out = 0
    while at < len(blocks) - 2 - copy_out and _copies(blocks[-1 - copy_out],
                                                      blocks[-2 - copy_out]):
        copy_out += 1
    return ActivationMatch(blocks[at].name_hint, fn,
                           None if producer is None else producer.name_hint, copy_out, row)


def _copies(b: Any, prev: Any) -> bool:
    """`b` copies `prev`'s result (at any indices: a reshape), or computes each element from
    `prev`'s element at its own iterators alone (a cast)."""
    value, its = b.body.value, [iv.var for iv in b.iter_vars]
    if isinstance(value, tvm.ir.TensorLoad):
        return bool(value.source.same_as(prev.body.buffer))
    reads = loads(value)
    return bool(reads) and all(r.source.same_as(prev.body.buffer) and len(r.indices) == len(its)
                               and all(map(is_var, r.indices, its)) for r in reads)


def match_activation(workload: Workload) -> ActivationMatch | NoMatch:
    """`match_activation_func` of the workload's PrimFunc, cached on the workload."""
    return cached_match(workload, "match:activation", match_activation_func)


def _row_reduction(b: SBlock, combine: str) -> tvm.ir.TensorLoad | str:
    """The input load of `R[*rows] = combine(R[*rows], X[*rows, k])`, or why the block is not
    that reduction over its last iterator."""
    kinds = [int(iv.iter_type) for iv in b.iter_vars]
    if len(kinds) < 2 or kinds[-1] != COMM_REDUCE or any(k != DATA_PAR for k in kinds[:-1]):
        return f"block {b.name_hint} is not spatial iterators followed by one reduction"
    st, its = b.body, [iv.var for iv in b.iter_vars]
    if not isinstance(st, tvm.tirx.BufferStore) or b.init is None \
            or len(st.indices) != len(its) - 1 or not all(map(is_var, st.indices, its[:-1])):
        return f"block {b.name_hint} does not store a row's result at its row iterators"
    v = st.value
    op = {"max": tvm.tirx.Max, "sum": tvm.tirx.Add}[combine]
    if not (isinstance(v, op) and isinstance(v.a, tvm.ir.TensorLoad)
            and v.a.source.same_as(st.buffer) and isinstance(v.b, tvm.ir.TensorLoad)
            and len(v.b.indices) == len(its) and all(map(is_var, v.b.indices, its))):
        return f"block {b.name_hint} is not a row {combine}"
    return v.b


def match_softmax_func(func: PrimFunc) -> SoftmaxMatch | NoMatch:
    blocks = child_blocks(func)
    if len(blocks) < 4:
        return NoMatch("fewer than four blocks: not a softmax")
    if not _unique_names(blocks):
        return NoMatch("two blocks share a name")
    mx, ex, sm, nm, *copies = blocks
    x = _row_reduction(mx, "max")
    if isinstance(x, str):
        return NoMatch(x)
    e = _row_reduction(sm, "sum")
    if isinstance(e, str):
        return NoMatch(e)
    for b in (ex, nm, *copies):
        if not _spatial(b) or not _stores_at_iterators(b):
            return NoMatch(f"block {b.name_hint} is not elementwise")
    its = [iv.var for iv in ex.iter_vars]
    v = ex.body.value
    if not (isinstance(v, tvm.ir.Call)
            and str(v.op.name).endswith(".exp")  # type: ignore[attr-defined]
            and isinstance(v.args[0], tvm.tirx.Sub)
            and isinstance(v.args[0].a, tvm.ir.TensorLoad)
            and v.args[0].a.source.same_as(x.source) and all(map(is_var, v.args[0].a.indices, its))
            and isinstance(v.args[0].b, tvm.ir.TensorLoad)
            and v.args[0].b.source.same_as(mx.body.buffer)
            and all(map(is_var, v.args[0].b.indices, its[:-1]))):
        return NoMatch(f"block {ex.name_hint} is not exp(x - row max)")
    if not e.source.same_as(ex.body.buffer):
        return NoMatch(f"block {sm.name_hint} does not sum the exponentials")
    its = [iv.var for iv in nm.iter_vars]
    v = nm.body.value
    if not (isinstance(v, tvm.tirx.Div) and isinstance(v.a, tvm.ir.TensorLoad)
            and v.a.source.same_as(ex.body.buffer) and all(map(is_var, v.a.indices, its))
            and isinstance(v.b, tvm.ir.TensorLoad) and v.b.source.same_as(sm.body.buffer)
            and all(map(is_var, v.b.indices, its[:-1]))):
        return NoMatch(f"block {nm.name_hint} is not exp / row sum")
    prev = nm.body.buffer
    for b in copies:
        ld, its = b.body.value, [iv.var for iv in b.iter_vars]
        if not (isinstance(ld, tvm.ir.TensorLoad) and ld.source.same_as(prev)
                and len(ld.indices) == len(its) and all(map(is_var, ld.indices, its))):
            return NoMatch(f"block {b.name_hint} after the softmax is not a plain copy")
        prev = b.body.buffer
    params = list(func_params(func))
    if not any(prev.same_as(p) for p in params) or not any(x.source.same_as(p) for p in params):
        return NoMatch("the softmax does not read an input and write an output")
    if any(str(buffer_dtype(buf)) != "float32" for buf in (x.source, prev)):
        return NoMatch("the softmax is not float32")
    shape = [int(d) for d in prev.shape]
    return SoftmaxMatch(mx.name_hint, ex.name_hint, sm.name_hint, nm.name_hint, len(copies),
                        len(shape) - 1, math.prod(shape[:-1]), shape[-2], shape[-1])


def match_softmax(workload: Workload) -> SoftmaxMatch | NoMatch:
    """`match_softmax_func` of the workload's PrimFunc, cached on the workload."""
    return cached_match(workload, "match:softmax", match_softmax_func)
