"""Whole-row intrinsics: one softmax step over a row of `n` float32, for rows that no vector width
divides (ViT's 197 tokens, Llama's 129).

`softmax-x86` splits a row into vectors, reduces with rfactor and tensorizes 16 lanes at a time.
Off the grid, that split leaves a predicate on the partial vector, and TVM 0.27 loses it: a block
moved by `compute_at` gets its loops back without the predicate (the reduction then reads past
the row), and the blocks `loop_partition` makes declare regions over the whole buffer, which
`tensorize` rejects. So off the grid, each of the four steps tensorizes a whole row instead, and
the intrinsic body handles the partial vector without a predicate:

- `row_max_f32x{lanes}_n{n}`, `row_sum_f32x{lanes}_n{n}`: S[0] = max (sum) of S[0] and X[0:n].
  Up to 4 independent vector accumulators, then a halving tree of shuffles. The last, partial
  vector is X[n - lanes : n] with the lanes already counted replaced by the reduction's identity
  (a select, no mask register needed);
- `exp_sub_f32x{lanes}_n{n}`: Y = exp(X - M[0]) by the polynomial of `schedules/polynomial.py`;
- `div_bcast_{recip|div}_f32x{lanes}_n{n}`: Y = E / S[0], as a multiplication by the reciprocal or
  as a division (the two design spaces of softmax-x86).
The elementwise two write the last vector at X[n - lanes : n] again: those lanes overlap the
previous vector and get the same values, so no lane is outside the row.

Everything is one expression per vector (no local buffers: a buffer allocated in a parallel
loop's body costs a workspace allocation per row). The body grows with n, so n is bounded
(`MAX_ROW`): a name read back from a stored trace cannot make this process build a huge one.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

from schedules.polynomial import let, pin_source, vexp
from tuner.core.tvm_api import Expr, tvm, vload

T = tvm.script.tirx
pin_source(__file__)

ROW_MAX = "row_max_f32x{lanes}_n{n}"
ROW_SUM = "row_sum_f32x{lanes}_n{n}"
ROW_EXP_SUB = "exp_sub_f32x{lanes}_n{n}"
ROW_DIV = "div_bcast_{how}_f32x{lanes}_n{n}"  # how: "recip" or "div"
MAX_ROW = 4096  # the longest row: 256 vector loads per reduction at 16 lanes
LANES = (4, 8, 16)
ACCUMULATORS = 4


def _bc(value: Expr | int, lanes: int) -> tvm.tirx.Broadcast:
    return tvm.tirx.Broadcast(value, lanes)  # type: ignore[arg-type]  # TVM converts ints


def _reduce(x: tvm.tirx.Buffer, n: int, lanes: int, combine: Callable[[Expr, Expr], Expr],
            identity: Expr) -> Expr:
    """combine over x[0:n] (a Buffer) as one scalar expression."""
    vec = f"float32x{lanes}"
    full = n // lanes
    loads = [vload(x, [v * lanes], vec) for v in range(full)]
    if n % lanes:
        covered = lanes - n % lanes  # lanes of the last vector the previous ones hold
        loads.append(tvm.tirx.Select(
            tvm.tirx.Ramp(0, 1, lanes) >= _bc(covered, lanes),  # type: ignore[arg-type]
            vload(x, [n - lanes], vec), _bc(identity, lanes)))
    chains = loads[:ACCUMULATORS]
    for v, load in enumerate(loads[ACCUMULATORS:], start=ACCUMULATORS):
        chains[v % ACCUMULATORS] = combine(chains[v % ACCUMULATORS], load)
    while len(chains) > 1:
        chains = [combine(*chains[c:c + 2]) if c + 1 < len(chains) else chains[c]
                  for c in range(0, len(chains), 2)]
    acc, width = chains[0], lanes
    while width > 1:
        width //= 2
        acc = let(acc, functools.partial(_halves, combine, width))
    return acc


def _halves(combine: Callable[[Expr, Expr], Expr], width: int, v: Expr) -> Expr:
    """combine(low half, high half) of a vector of 2 * width lanes."""
    return combine(tvm.tirx.Shuffle([v], list(range(width))),  # type: ignore[arg-type]
                   tvm.tirx.Shuffle([v], list(range(width, 2 * width))))  # type: ignore[arg-type]


def _combiner(kind: str) -> tuple[Callable[[Any, Any], Any], Any]:
    if kind == "max":
        return T.max, T.min_value("float32")
    return (lambda a, b: a + b), T.float32(0.0)


def _reduce_intrin(kind: str, lanes: int, n: int) -> tuple[Any, Any]:
    combine, identity = _combiner(kind)

    @T.prim_func(s_tir=True)
    def desc(x_h: T.handle, s_h: T.handle) -> None:
        X = T.match_buffer(x_h, (n,), "float32", offset_factor=1)
        S = T.match_buffer(s_h, (1,), "float32", offset_factor=1)
        with T.sblock("root"):
            T.reads(X[0:n])
            T.writes(S[0:1])
            for k in T.serial(0, n):
                with T.sblock("row"):
                    vk = T.axis.remap("R", [k])
                    T.reads(S[0], X[vk])
                    T.writes(S[0])
                    with T.init():
                        S[0] = identity
                    S[0] = combine(S[0], X[vk])

    @T.prim_func(s_tir=True)
    def impl(x_h: T.handle, s_h: T.handle) -> None:
        X = T.match_buffer(x_h, (n,), "float32", offset_factor=1)
        S = T.match_buffer(s_h, (1,), "float32", offset_factor=1)
        with T.sblock("root"):
            T.reads(X[0:n])
            T.writes(S[0:1])
            S[0] = combine(S[0], _reduce(X, n, lanes, combine, identity))

    return desc, impl


def _elementwise_intrin(scalar: Callable[[Any, Any], Any], vector: Callable[[Any, Any], Any],
                        lanes: int, n: int) -> tuple[Any, Any]:
    """Y[j] = scalar(X[j], S[0]) over a row, as `vector` on lanes-wide loads (the last one at
    n - lanes, overlapping the one before it)."""
    vec, full = f"float32x{lanes}", n // lanes

    @T.prim_func(s_tir=True)
    def desc(x_h: T.handle, s_h: T.handle, y_h: T.handle) -> None:
        X = T.match_buffer(x_h, (n,), "float32", offset_factor=1)
        S = T.match_buffer(s_h, (1,), "float32", offset_factor=1)
        Y = T.match_buffer(y_h, (n,), "float32", offset_factor=1)
        with T.sblock("root"):
            T.reads(X[0:n], S[0:1])
            T.writes(Y[0:n])
            for j in T.serial(0, n):
                with T.sblock("row"):
                    vj = T.axis.remap("S", [j])
                    Y[vj] = scalar(X[vj], S[0])

    @T.prim_func(s_tir=True)
    def impl(x_h: T.handle, s_h: T.handle, y_h: T.handle) -> None:
        X = T.match_buffer(x_h, (n,), "float32", offset_factor=1)
        S = T.match_buffer(s_h, (1,), "float32", offset_factor=1)
        Y = T.match_buffer(y_h, (n,), "float32", offset_factor=1)
        with T.sblock("root"):
            T.reads(X[0:n], S[0:1])
            T.writes(Y[0:n])
            for v in T.serial(0, full):
                Y[T.ramp(v * lanes, 1, lanes)] = vector(X.vload([v * lanes], vec), S[0])
            Y[T.ramp(n - lanes, 1, lanes)] = vector(X.vload([n - lanes], vec), S[0])

    return desc, impl


def _exp_sub_intrin(lanes: int, n: int) -> tuple[Any, Any]:
    """Y = exp(X - M[0]): softmax's exp block."""
    return _elementwise_intrin(
        lambda x, m: T.exp(x - m),
        lambda x, m: vexp(x - T.broadcast(m, lanes), lanes), lanes, n)


def _div_intrin(how: str, lanes: int, n: int) -> tuple[Any, Any]:
    """Y = E / S[0]: softmax's normalisation, by the reciprocal ("recip") or divided ("div")."""
    if how == "recip":
        def vector(e: tvm.ir.ExprWithOp, s: Expr) -> Expr:
            return e * T.broadcast(T.float32(1.0) / s, lanes)
    else:
        def vector(e: tvm.ir.ExprWithOp, s: Expr) -> Expr:
            return e / T.broadcast(s, lanes)
    return _elementwise_intrin(lambda e, s: e / s, vector, lanes, n)


def row_fits(n: int, lanes: int) -> bool:
    """Whether the whole-row intrinsics exist for rows of n at `lanes`: at least one vector, at
    most MAX_ROW, and not a multiple of the lanes (those rows take the split vector loops)."""
    return lanes in LANES and lanes <= n <= MAX_ROW and n % lanes != 0


def _sized(make: Callable[..., tuple[Any, Any]]) -> Callable[[re.Match[str]], Any]:
    def build(m: re.Match[str]) -> tuple[Any, Any] | None:
        *args, lanes, n = m.groups()
        if not row_fits(int(n), int(lanes)):
            return None
        return make(*args, int(lanes), int(n))
    return build


# name families `schedules/intrinsics.py` registers: regex -> (match -> (desc, impl) or None)
ROW_PATTERNS: list[tuple[re.Pattern[str], Callable[[re.Match[str]], tuple[Any, Any] | None]]] = [
    (re.compile(r"row_(max|sum)_f32x(\d+)_n(\d+)"), _sized(_reduce_intrin)),
    (re.compile(r"exp_sub_f32x(\d+)_n(\d+)"), _sized(_exp_sub_intrin)),
    (re.compile(r"div_bcast_(recip|div)_f32x(\d+)_n(\d+)"), _sized(_div_intrin)),
]
