"""Whole models in bf16 (`tune-model --dtype bfloat16`, and `build` with the same option): the
model's linear layers computed on bf16 operands, products and sums in float32, on the GEMM
templates' bf16 path (`dense-bf16-avx512`, schedules/bf16.py).

`MatmulsInBF16` rewrites, before legalization (`tuner.model.pipeline.partition`), every
`matmul(x, w)` of float32 tensors whose `w` is a model constant (or a transpose or reshape of
one: how PyTorch's `Linear` comes from its exporter) into

    matmul(astype(x, bfloat16), astype(w, bfloat16), out_dtype="float32")

The weight's cast folds at compile time (FoldConstant): the library holds bf16 weights, half
the bytes of fp32 ones. The activation's cast is elementwise: FuseOps joins it to the task that
produces `x` (a layer norm's or an activation's epilogue) or leaves it a task of its own.

Everything else stays float32, as PyTorch's CPU autocast leaves it: normalisation statistics,
softmax, residual adds, and the attention's batch matmuls of two activations (no bf16 template
serves a batched GEMM yet, and relax's default bf16 loops are slower than fp32 ones). Unlike
autocast, a matmul's output stays float32 (autocast rounds it to bf16 before the next op).
"""

from __future__ import annotations

from typing import Any, cast

from ..core.tvm_api import Expr, IRModule, relax, tvm
from . import DTYPES
from .fixups import dtype_of, mutate_functions

# ops that hand on a constant's values rearranged: the weight of `x @ w.T` or of a reshaped `w`
_VIEWS = frozenset({"relax.permute_dims", "relax.reshape", "relax.squeeze",
                    "relax.expand_dims"})


@relax.expr_functor.mutator
class _MatmulsInBF16(relax.PyExprMutator):
    def _is_weight(self, expr: Expr | None) -> bool:
        """A constant, or a view of one through bindings of this function."""
        for _ in range(8):
            if isinstance(expr, tvm.ir.expr.Constant):
                return True
            if isinstance(expr, relax.Var):
                expr = self.lookup_binding(expr)
            elif isinstance(expr, relax.Call) and getattr(expr.op, "name", "") in _VIEWS:
                expr = expr.args[0]
            else:
                return False
        return False

    def visit_call_(self, call: relax.Call) -> Expr:
        call = cast(relax.Call, super().visit_call_(call))  # relax's mutator rebuilds a Call
        if getattr(call.op, "name", "") != "relax.matmul":
            return call
        x, w = call.args
        if dtype_of(x) != "float32" or dtype_of(w) != "float32" or not self._is_weight(w):
            return call
        return relax.op.matmul(relax.op.astype(x, "bfloat16"), relax.op.astype(w, "bfloat16"),
                               out_dtype="float32")


@tvm.transform.module_pass(opt_level=0, name="TunefarmMatmulsInBF16")
class MatmulsInBF16:
    """The module pass: every matmul by a constant weight on bf16 operands, float32 sums."""

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        return mutate_functions(_MatmulsInBF16(mod), mod)


def dtype_passes(dtype: str) -> list[Any]:
    """The passes that put a float32 model in `dtype` (one of `DTYPES`)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: a model is tuned in one of {', '.join(DTYPES)}")
    return [MatmulsInBF16()] if dtype == "bfloat16" else []
