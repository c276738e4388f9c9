"""Matching by structure: which expert family a PrimFunc belongs to, read off its blocks.

A compiler sends `fused_matmul_add_gelu`, not "matmul": what makes a function a GEMM is its
block, not its name. `match_gemm` reads the root's child blocks of any PrimFunc (an op spec's or
one relax produced; int32 or int64 indices; any names) and answers with a `GemmMatch` or, when it
does not match, the reason (`NoMatch`), which `tunefarm spaces --tvmscript` prints:

- one GEMM block first: spatial iterators then one reduction iterator k, body
  `C[*b, i, j] = C[*b, i, j] + A[*b, i, k] * W[...]` (either factor order), init `C = 0`, where W
  is indexed `[*b, k, j]` (matmul), `[*b, j, k]` (dense: the weight transposed) or without the batch
  iterators (broadcast); all float32, or (`dtype` INT8) C int32 = uint8 A times int8 W, each
  factor cast to int32 (`dense-int8-vnni`'s GEMMs: the op spec, relax's int8 matmul), or (`dtype`
  BF16) C float32 = bf16 A times bf16 W, each factor cast to float32 (`dense-bf16-avx512`'s);
- then any number of elementwise epilogue blocks (bias, residual add, relu, gelu in erf or tanh
  form, scaling, casts): spatial iterators over C's shape, one store at exactly its iterators, and
  loads either of an earlier block's result at exactly its iterators or of a parameter at a
  subset of its iterators (a broadcast bias), or at 0 on a dimension of extent 1 (relax's
  [1, C, 1, 1] constants); every result but the last is a scratch buffer.

The template folds the epilogue into one block (`compute_inline`) and then into the GEMM's
register write-back (`reverse_compute_inline`): no separate pass over memory.

`schedules/match_conv.py` does the same for convolutions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from tuner.core.tvm_api import (
    Expr,
    PrimFunc,
    buffer_shape,
    expr_dtype,
    func_body,
    func_params,
    tvm,
    tvm_ffi,
)
from tuner.workloads import Workload

DATA_PAR, COMM_REDUCE = 0, 2  # tvm.tirx.IterVar kinds
INT8 = "uint8*int8->int32"  # GemmMatch.dtype of a quantized GEMM (dense-int8-vnni's)
BF16 = "bfloat16*bfloat16->float32"  # GemmMatch.dtype of a bf16 GEMM (dense-bf16-avx512's)
M = TypeVar("M")  # what a matcher answers (`cached_match`)


@dataclass(frozen=True)
class GemmMatch:
    block: int  # index of the GEMM block among the root's child blocks (0: it is the first)
    batch: int  # batch dimensions of C
    batch_size: int  # their product
    m: int
    n: int
    k: int
    weight: int  # index of the weight among the GEMM block's reads
    weight_axes: str  # the weight's dims in order, of "b" (batch), "j" (N) and "k" (K)
    epilogue: int  # elementwise blocks after the GEMM
    dtype: str = "float32"  # or INT8 (uint8 A x int8 W, each cast to int32, C int32) or BF16

    @property
    def layout(self) -> str:
        return "dense" if self.weight_axes.endswith("jk") else "matmul"

    @property
    def shared_weight(self) -> bool:
        """A batch whose weight has no batch dimensions (`x[b, m, k] · w[k, n]`): the batch and
        M are one dimension of batch_size * m rows."""
        return self.batch > 0 and "b" not in self.weight_axes


@dataclass(frozen=True)
class NoMatch:
    reason: str


def child_blocks(func: PrimFunc) -> list[Any]:
    """The root block's child blocks in program order (none nested deeper is expected)."""
    found: list[Any] = []
    body = func_body(func)
    tvm_ffi.structural_walk(body, [((tvm.s_tir.SBlockRealize,), found.append)])
    root = body.block if isinstance(body, tvm.s_tir.SBlockRealize) else None
    return [r.block for r in found if root is None or not r.block.same_as(root)]


def is_var(e: Expr, var: Expr | None) -> bool:
    return isinstance(e, tvm.tirx.Var) and e.same_as(var)


def unit_dim(index: Expr, extent: Expr) -> bool:
    """Index 0 of a dimension of extent 1: how relax broadcasts a [1, C, 1, 1] bias."""
    return (isinstance(index, tvm.tirx.IntImm) and int(index.value) == 0
            and isinstance(extent, tvm.tirx.IntImm) and int(extent.value) == 1)


def loads(expr: Expr) -> list[tvm.ir.TensorLoad]:
    out: list[tvm.ir.TensorLoad] = []
    tvm_ffi.structural_walk(expr, [((tvm.ir.TensorLoad,), out.append)])
    return out


def _operand(e: Any) -> Any:
    """The load under an int32 or float32 cast (how an int8 or bf16 GEMM widens its operands),
    or `e` itself."""
    if isinstance(e, tvm.tirx.Cast) \
            and str(expr_dtype(e)) in ("int32", "float32"):
        return e.value
    return e


def _gemm_dtype(c: Any, a: Any, w: Any, init: Any, cast: bool) -> str | None:
    """GemmMatch.dtype of C = init; C += A * W (A, W loads, `cast`: each under an int32 cast)."""
    types = [str(x.source.dtype) for x in (a, w)]
    if not cast and str(c.dtype) == "float32" and types == ["float32"] * 2 \
            and isinstance(init, tvm.tirx.FloatImm) and float(init.value) == 0.0:
        return "float32"
    if cast and str(c.dtype) == "int32" and sorted(types) == ["int8", "uint8"] \
            and isinstance(init, tvm.tirx.IntImm) and int(init.value) == 0:
        return INT8
    if cast and str(c.dtype) == "float32" and types == ["bfloat16"] * 2 \
            and isinstance(init, tvm.tirx.FloatImm) and float(init.value) == 0.0:
        return BF16
    return None


def _gemm_block(b: Any) -> tuple[int, int, int, int, int, int, str, str] | str:
    """(batch, batch size, m, n, k, weight read index, weight axes, dtype) of a GEMM block, or
    why it is not one."""
    kinds = [int(iv.iter_type) for iv in b.iter_vars]
    if len(kinds) < 3 or kinds[-1] != COMM_REDUCE or any(k != DATA_PAR for k in kinds[:-1]):
        return "its first block is not spatial iterators followed by one reduction"
    st, init = b.body, b.init
    if not isinstance(st, tvm.tirx.BufferStore) or not isinstance(init, tvm.tirx.BufferStore):
        return "the reduction block is not one store with an init"
    ext = [iv.dom.extent for iv in b.iter_vars]
    if not all(isinstance(e, tvm.tirx.IntImm) for e in ext):
        return "an iterator has a symbolic extent"
    *bat, iv, jv, kv = [iv.var for iv in b.iter_vars]
    spatial = [*bat, iv, jv]
    if len(st.indices) != len(spatial) or not all(map(is_var, st.indices, spatial)):
        return "the reduction does not store C at its spatial iterators"
    if not (isinstance(init.value, tvm.tirx.FloatImm | tvm.tirx.IntImm)
            and float(init.value.value) == 0.0):
        return "the reduction does not start from 0"
    v = st.value
    if not (isinstance(v, tvm.tirx.Add) and isinstance(v.b, tvm.tirx.Mul)
            and isinstance(v.a, tvm.ir.TensorLoad) and v.a.source.same_as(st.buffer)
            and all(map(is_var, v.a.indices, spatial))
            and isinstance(_operand(v.b.a), tvm.ir.TensorLoad)
            and isinstance(_operand(v.b.b), tvm.ir.TensorLoad)):
        return "the reduction is not C += A * B"
    cast = isinstance(v.b.a, tvm.tirx.Cast)
    if cast != isinstance(v.b.b, tvm.tirx.Cast):
        return "one GEMM operand is cast (widened) and the other is not"
    dtype = _gemm_dtype(st.buffer, _operand(v.b.a), _operand(v.b.b), init.value, cast)
    if dtype is None:
        return ("the GEMM is neither float32, uint8 x int8 widened to int32 nor bfloat16 "
                "widened to float32 (the operands a GEMM template serves)")
    named = [*(("b", x) for x in bat), ("i", iv), ("j", jv), ("k", kv)]

    # "bik" for A[b, i, k]; None for any other index
    def axes(load: tvm.ir.TensorLoad) -> str | None:
        out = ""
        for e in load.indices:
            hit = [c for c, x in named if is_var(e, x)]
            if len(hit) != 1:
                return None
            out += hit[0]
        return out

    want_a = "b" * len(bat) + "ik"
    a, w = _operand(v.b.a), _operand(v.b.b)
    a_axes, w_axes = axes(a), axes(w)
    if a_axes != want_a:
        a_axes, w_axes, a, w = w_axes, a_axes, w, a
    if a_axes != want_a:
        return "no operand is indexed [*batch, i, k] (a transposed A is not served)"
    batch_prefix = "b" * len(bat)
    if w_axes not in {batch_prefix + "kj", batch_prefix + "jk", "kj", "jk"}:
        return "the other operand is not indexed [*batch, k, j] or [*batch, j, k]"
    if w_axes.startswith("b") and any(not is_var(e, x) for e, x in zip(w.indices, bat,
                                                                        strict=False)):
        return "the weight's batch dimensions are not C's, in order"
    reads = [r.source for r in b.reads]
    idx = [i for i, r in enumerate(reads) if r.same_as(w.source)]
    if len(idx) != 1 or w.source.same_as(a.source):
        return "the weight is not one distinct read of the block"
    dims = [int(e.value) for e in ext]
    if dtype == INT8 and (str(a.source.dtype), str(w.source.dtype)) != ("uint8", "int8"):
        return "an int8 GEMM's activations [*batch, i, k] are not the uint8 operand"
    return len(bat), math.prod(dims[:-3]), dims[-3], dims[-2], dims[-1], idx[0], w_axes, dtype


def epilogue_problem(blocks: list[Any], c_shape: list[int], written: list[Any],
                     outputs: list[Any], what: str = "GEMM") -> str | None:
    """Why the blocks after the `what` block are not an elementwise epilogue, or None."""
    for n, b in enumerate(blocks):
        if any(int(iv.iter_type) != DATA_PAR for iv in b.iter_vars) or b.init is not None:
            return f"block {b.name_hint} after the {what} is not elementwise"
        dims = [iv.dom.extent for iv in b.iter_vars]
        if [int(d.value) if isinstance(d, tvm.tirx.IntImm) else -1 for d in dims] != c_shape:
            return f"block {b.name_hint} after the {what} does not span its output's shape"
        st, its = b.body, [iv.var for iv in b.iter_vars]
        if not isinstance(st, tvm.tirx.BufferStore) or len(st.indices) != len(its) \
                or not all(map(is_var, st.indices, its)):
            return f"block {b.name_hint} does not store at its iterators"
        for ld in loads(st.value):
            earlier = any(ld.source.same_as(x) for x in written)
            exact = len(ld.indices) == len(its) and all(map(is_var, ld.indices, its))
            subset = all(any(is_var(e, x) for x in its) or unit_dim(e, d) for e, d in zip(
                ld.indices, buffer_shape(ld.source), strict=True))
            if (earlier and not exact) or not subset:
                return (f"block {b.name_hint} reads {cast(tvm.tirx.Buffer, ld.source).name} "
                        "at other indices")
        last = n == len(blocks) - 1
        if any(st.buffer.same_as(p) for p in outputs) != last:
            return f"block {b.name_hint}: only the last epilogue block may write an output"
        written.append(st.buffer)
    return None


def match_gemm_func(func: PrimFunc) -> GemmMatch | NoMatch:
    blocks = child_blocks(func)
    if not blocks:
        return NoMatch("the function has no blocks")
    got = _gemm_block(blocks[0])
    if isinstance(got, str):
        return NoMatch(got)
    batch, batch_size, m, n, k, weight, w_axes, dtype = got
    params = list(func_params(func))
    c = blocks[0].body.buffer
    rest = blocks[1:]
    if rest and any(c.same_as(p) for p in params):
        return NoMatch("the GEMM's result is an output and also feeds an epilogue")
    if not rest and not any(c.same_as(p) for p in params):
        return NoMatch("the GEMM's result is not an output")
    why = epilogue_problem(rest, [int(d) for d in c.shape], [c], params)
    if why is not None:
        return NoMatch(why)
    return GemmMatch(0, batch, batch_size, m, n, k, weight, w_axes, len(rest), dtype)


def match_gemm(workload: Workload) -> GemmMatch | NoMatch:
    """`match_gemm_func` of the workload's PrimFunc, cached on the workload."""
    return cached_match(workload, "match:gemm", match_gemm_func)


def cached_match(workload: Workload, key: str, match: Callable[[PrimFunc], M]) -> M:
    if key not in workload._cache:
        workload._cache[key] = match(workload.prim_func())
    return workload._cache[key]


def plain_gemm(workload: Workload, dtype: str, operands: str) -> GemmMatch | str:
    """The workload's GEMM when it is an unbatched one of `dtype` operands (a GemmMatch.dtype,
    said `operands` in words), else why not: what the packed-weight templates serve."""
    g = match_gemm(workload)
    if not isinstance(g, GemmMatch):
        return g.reason
    if g.dtype != dtype:
        return f"a {g.dtype} GEMM, not {operands}"
    if g.batch:
        return f"a batched {operands} GEMM (only [M, K] x [K, N] is served)"
    return g
