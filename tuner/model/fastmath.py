"""`fast_math`: GELU's erf and tanh computed by polynomial approximations that vectorize
(TVM's `topi.fast_erf` and `topi.fast_tanh`) instead of one scalar libm call per element.

Legalized as is, `R.nn.gelu` calls `erff` per element and `R.nn.gelu_tanh` `tanhf`: on a BERT
layer the GELU task alone took as long as its three GEMMs together. This pass rewrites both into
elementwise relax ops around `erf`/`tanh`, then those into the fast approximations (relative
error about 1e-6 in float32). It changes the numbers slightly, so it is an option of
`tunefarm tune-model` and `tunefarm build` (`--fast-math`), never a default, and both must agree:
the tasks tuned are the tasks built.
"""

from __future__ import annotations

import math

from ..core.tvm_api import Expr, IRModule, relax, topi, tvm
from .fixups import mutate_functions


@relax.expr_functor.mutator
class _FastGelu(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> Expr:
        op = getattr(call.op, "name", "")
        if op not in ("relax.nn.gelu", "relax.nn.gelu_tanh", "relax.erf", "relax.tanh"):
            return super().visit_call_(call)
        x = self.visit_expr(call.args[0])
        dtype = getattr(getattr(x, "ty", None), "dtype", None)
        if dtype not in ("float32", "float16"):
            return super().visit_call_(call)
        bb = self.builder_

        def c(v: float) -> Expr:
            return relax.const(v, dtype)

        if op == "relax.erf":
            return bb.call_te(topi.fast_erf, x)
        if op == "relax.tanh":
            return bb.call_te(topi.fast_tanh, x)
        if op == "relax.nn.gelu":  # x · (½ + ½·erf(x/√2))
            inner = bb.call_te(topi.fast_erf, bb.emit(relax.op.multiply(x, c(1 / math.sqrt(2)))))
        else:  # x · (½ + ½·tanh(√(2/π)·(x + 0.044715·x³)))
            cube = bb.emit(relax.op.multiply(bb.emit(relax.op.multiply(x, x)), x))
            arg = bb.emit(relax.op.add(x, bb.emit(relax.op.multiply(cube, c(0.044715)))))
            inner = bb.call_te(topi.fast_tanh,
                               bb.emit(relax.op.multiply(arg, c(math.sqrt(2 / math.pi)))))
        half = bb.emit(relax.op.add(c(0.5), bb.emit(relax.op.multiply(inner, c(0.5)))))
        return relax.op.multiply(x, half)


@tvm.transform.module_pass(opt_level=0, name="TunefarmFastGelu")
class FastGelu:
    """The module pass: every relax function's GELU, erf and tanh made fast."""

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        return mutate_functions(_FastGelu(mod), mod)
