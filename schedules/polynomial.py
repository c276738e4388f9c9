"""Vector arithmetic the tensor intrinsics are written with (`schedules/intrinsics.py`,
`schedules/row_intrinsics.py`): `let` (a value bound once) and `vexp`, a polynomial exp of a float32
vector expression (the Cephes polynomial topi.fast_exp uses: range reduction to 2^n * e^f,
|f| <= ln2/2, degree-7 polynomial, a two-constant (Cody-Waite) ln2; relative error < 3e-7 over
[-87.3, 88.72], 0 below -88.38, e^88.72 above 88.72, NaN not propagated). `pin_source` keeps a
module's source for TVMScript's later parses.
"""

from __future__ import annotations

import linecache
from collections.abc import Callable

from tuner.core.tvm_api import Expr, expr_dtype, tvm

T = tvm.script.tirx


def pin_source(path: str) -> None:
    """TVMScript parses a function from its source file (through `linecache`) when the factory
    runs, which in a long-running worker may be days after this import. Keep the source as it was
    imported (an entry without mtime is never invalidated): an upgrade of the file on disk must
    not shift the lines a later parse reads ("Function must be decorated")."""
    lines = linecache.getlines(path)
    if lines:
        linecache.cache[path] = (sum(map(len, lines)), None, lines, path)


_EXP_HI, _EXP_LO = 88.72, -88.3762626647949  # e^88.72 < FLT_MAX
_LOG2E = 1.44269504088896341
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4
_P = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
      5.0000001201e-1)


def vexp(x: Expr, lanes: int) -> Expr:
    """exp of a float32 vector expression: the polynomial described above."""
    def bc(c: float) -> Expr:
        return T.broadcast(T.float32(c), lanes)

    def body(x: tvm.tirx.Var) -> Expr:
        # n <= 127: 2^n stays a normal float (x near 88.72 has n = 128, f ~ -ln2/2 + ln2)
        return let(T.min(T.floor(x * bc(_LOG2E) + bc(0.5)), bc(127.0)), lambda n: let(
            x - n * bc(_LN2_HI) - n * bc(_LN2_LO), lambda f: (
                (((((bc(_P[0]) * f + bc(_P[1])) * f + bc(_P[2])) * f + bc(_P[3])) * f
                  + bc(_P[4])) * f + bc(_P[5])) * f * f + f + bc(1.0))
            * T.reinterpret(T.shift_left(T.Cast(f"int32x{lanes}", n)
                                         + T.broadcast(T.int32(127), lanes),
                                         T.broadcast(T.int32(23), lanes)),
                            dtype=f"float32x{lanes}")))

    return let(T.max(T.min(x, bc(_EXP_HI)), bc(_EXP_LO)), body)


def let(value: Expr, body: Callable[[tvm.tirx.Var], Expr]) -> tvm.tirx.Let:
    """`body(v)` with v bound to `value` once (a Let): a value used several times is computed
    once, and the expression stays a tree of linear size for codegen."""
    dtype = getattr(value, "dtype", None) or expr_dtype(value)
    var = tvm.tirx.Var("v", dtype)
    return tvm.tirx.Let(var, value, body(var))


