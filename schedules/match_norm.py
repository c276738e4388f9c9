"""Matching row normalisations by structure: layer norm, RMS norm and their relatives, as relax
legalizes them (`R.nn.layer_norm`, `R.nn.rms_norm`: int64 indices, casts, copies), read off the
root's child blocks.

`match_norm` (`NormMatch`) accepts a PrimFunc whose blocks are each one of
- a row sum: `S[*rows] += f(...)` over the last dimension (layer norm's sum and sum of squared
  deviations, RMS norm's sum of squares);
- a per-row value: spatial over the rows only (the mean, the reciprocal square root);
- elementwise over [*rows, cols] (casts, squares, the normalisation itself, copies);
- a per-column vector: spatial over the columns only (relax's cast of gamma),
with at least one row sum, every load at the block's own iterators in their order (a transpose
is something else), and the last block the one that writes the output, float32 [*rows, cols].
A max reduction is not a row sum: softmax is `match_softmax`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

from schedules.match import (
    COMM_REDUCE,
    DATA_PAR,
    NoMatch,
    cached_match,
    child_blocks,
    is_var,
    loads,
)
from tuner.core.tvm_api import (
    Expr,
    PrimFunc,
    SBlock,
    buffer_dtype,
    buffer_shape,
    const_shape,
    func_params,
    tvm,
)
from tuner.workloads import Workload

SUM, ROW, ELEMENTWISE, COLUMN = "sum", "row", "elementwise", "column"


@dataclass(frozen=True)
class NormMatch:
    kinds: tuple[tuple[str, str], ...]  # (block name, kind) in program order
    row_dims: int  # leading dimensions
    rows: int  # their product
    last_rows: int  # the extent of the last of them
    cols: int  # the reduced (last) dimension

    def named(self, kind: str) -> list[str]:
        return [name for name, k in self.kinds if k == kind]


def _extents(b: SBlock) -> list[int] | None:
    if not all(isinstance(iv.dom.extent, tvm.tirx.IntImm) for iv in b.iter_vars):
        return None
    return [int(cast(tvm.tirx.IntImm, iv.dom.extent)) for iv in b.iter_vars]


def _in_order(b: SBlock, expr: Expr) -> bool:
    """Every load in `expr` indexes with plain iterators of `b`, in the block's order."""
    its = [iv.var for iv in b.iter_vars]
    for ld in loads(expr):
        pos = [next((n for n, v in enumerate(its) if v.same_as(i)), -1) for i in ld.indices]
        if -1 in pos or pos != sorted(pos) or len(set(pos)) != len(pos):
            return False
    return True


def _kind(b: SBlock, rows: list[int], cols: int) -> str | None:
    """The block's kind for a [*rows, cols] normalisation, or None."""
    ext, st = _extents(b), b.body
    if ext is None or not isinstance(st, tvm.tirx.BufferStore):
        return None
    its = [iv.var for iv in b.iter_vars]
    kinds = [int(iv.iter_type) for iv in b.iter_vars]
    if kinds and kinds[-1] == COMM_REDUCE:
        v = st.value
        if not (ext == [*rows, cols] and all(k == DATA_PAR for k in kinds[:-1])
                and b.init is not None and isinstance(v, tvm.tirx.Add)
                and isinstance(v.a, tvm.ir.TensorLoad) and v.a.source.same_as(st.buffer)
                and _at(st.indices, its[:-1]) and _at(v.a.indices, its[:-1])
                and _in_order(b, v.b)):
            return None
        return SUM
    if b.init is not None or any(k != DATA_PAR for k in kinds) or not _at(st.indices, its) \
            or not _in_order(b, st.value):
        return None
    if ext == [*rows, cols]:
        return ELEMENTWISE
    return ROW if ext == rows else COLUMN if ext == [cols] else None


def _at(indices: list[Expr], its: list[tvm.tirx.Var]) -> bool:
    return len(indices) == len(its) and all(map(is_var, indices, its))


def match_norm_func(func: PrimFunc) -> NormMatch | NoMatch:
    blocks = child_blocks(func)
    if len(blocks) < 2:
        return NoMatch("fewer than two blocks: not a row normalisation")
    names = [b.name_hint for b in blocks]
    if len(set(names)) != len(names):
        return NoMatch("two blocks share a name")
    out = blocks[-1].body
    params = list(func_params(func))
    if not isinstance(out, tvm.tirx.BufferStore) or not any(out.buffer.same_as(p)
                                                            for p in params):
        return NoMatch("the last block does not write an output")
    if str(buffer_dtype(out.buffer)) != "float32" or len(buffer_shape(out.buffer)) < 2:
        return NoMatch("the output is not a float32 tensor of rows")
    shape = const_shape(out.buffer)
    rows, cols = shape[:-1], shape[-1]
    kinds: list[tuple[str, str]] = []
    per_row: list[Any] = []  # the buffers of row sums and per-row values
    for b in blocks:
        kind = _kind(b, rows, cols)
        if kind in (ROW, COLUMN) and rows == [cols]:  # [n, n]: a per-row value derives from
            # a row sum, a per-column vector (gamma) does not
            reads = [ld.source for ld in loads(b.body.value)]
            kind = ROW if any(r.same_as(w) for r in reads for w in per_row) else COLUMN
        if kind in (SUM, ROW):
            per_row.append(b.body.buffer)
        if kind is None:
            return NoMatch(f"block {b.name_hint} is not a row sum, a per-row value, elementwise "
                           f"over the {shape} output or a per-column vector, with loads in "
                           "its iterators' order")
        kinds.append((b.name_hint, kind))
    if kinds[-1][1] != ELEMENTWISE:
        return NoMatch("the last block is not elementwise")
    if not any(k == SUM for _, k in kinds):
        return NoMatch("no row sum: not a normalisation")
    if len([b for b in blocks if any(b.body.buffer.same_as(p) for p in params)]) != 1:
        return NoMatch("more than one block writes an output")
    return NormMatch(tuple(kinds), len(rows), math.prod(rows), rows[-1], cols)


def match_norm(workload: Workload) -> NormMatch | NoMatch:
    """`match_norm_func` of the workload's PrimFunc, cached on the workload."""
    return cached_match(workload, "match:norm", match_norm_func)
