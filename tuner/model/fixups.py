"""Rewrites of relax that let TVM 0.27 compile what its frontends produce, applied in the model
pipeline before legalization (`tuner.model.pipeline.partition`), so extraction and build see
the same tasks.

- `BoolCompare`: a comparison of two bool tensors (`equal`, `less_equal`, ...: GPT-2's and
  Llama's attention masks in `transformers` 5 compare bool masks) legalizes into a PrimFunc that
  TVM's LLVM code generator refuses ("Check failed: t.MatchesCode(kDLFloat)", or an FCmp on
  i1 that fails LLVM's verifier). The operands are compared as int8 instead: the same truth
  table, since a bool is 0 or 1.
- A cumulative sum of a bool tensor (`transformers`' position ids from a mask) is a bool tensor
  in TVM's frontend, whose LLVM code generator then fails the same way; PyTorch sums bools as
  int64, and so does the rewrite.

and one rewrite of arithmetic that TVM leaves to libm:

- `SmallPower`: `power(x, 2.0)`, `power(x, 3.0)` and `power(x, 4.0)` of a float tensor as
  products (`x·x`, `x·x·x`, `(x·x)·(x·x)`). Legalized as is, `power` calls libm's `powf` once per
  element, which LLVM does not vectorize without fast-math: GPT-2's GELU
  (`0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, `torch.pow(x, 3.0)`) took 2.3 ms over
  128×3072 on 2 Xeon cores, 27% of the layer's kernels; Llama's, Qwen2's, Mistral's and T5's
  RMS norms square with `pow(2)`. A product differs from `powf` by at most an ulp or two, as
  PyTorch's inductor computes it too.
"""

from __future__ import annotations

from typing import cast

from ..core.tvm_api import Expr, IRModule, relax, tvm

_COMPARISONS = frozenset(f"relax.{op}" for op in (
    "equal", "not_equal", "less", "less_equal", "greater", "greater_equal"))


def dtype_of(expr: Expr) -> str | None:
    """The dtype of a relax expression's tensor, or None."""
    dtype = getattr(getattr(expr, "ty", None), "dtype", None)
    return None if dtype is None else str(dtype)


@relax.expr_functor.mutator
class _BoolCompare(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> Expr:
        call = cast(relax.Call, super().visit_call_(call))  # relax's mutator rebuilds a Call
        name = getattr(call.op, "name", "")
        if name == "relax.cumsum" and dtype_of(call.args[0]) == "bool":
            return relax.Call(call.op, [relax.op.astype(call.args[0], "int64")], call.attrs)
        if name not in _COMPARISONS:
            return call
        dtypes = [dtype_of(a) for a in call.args]
        if "bool" not in dtypes:
            return call
        args = [relax.op.astype(a, "int8") if dt == "bool" else a
                for a, dt in zip(call.args, dtypes, strict=True)]
        return relax.Call(call.op, args, call.attrs)


SMALL_POWERS = (2.0, 3.0, 4.0)


def scalar_value(expr: Expr) -> float | None:
    """The value of a relax scalar constant (float or int), else None."""
    data = getattr(expr, "value", None) if isinstance(expr, tvm.ir.expr.Constant) else None
    if data is None or not hasattr(data, "numpy") or data.numpy().size != 1:
        return None
    return float(data.numpy().reshape(()))


def _small_power(expr: Expr) -> int | None:
    """The exponent when `expr` is a scalar constant 2, 3 or 4 (float or int), else None."""
    value = scalar_value(expr)
    return int(value) if value in SMALL_POWERS else None


@relax.expr_functor.mutator
class _SmallPower(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> Expr:
        call = cast(relax.Call, super().visit_call_(call))  # relax's mutator rebuilds a Call
        if getattr(call.op, "name", "") != "relax.power":
            return call
        x, n = call.args[0], _small_power(call.args[1])
        if n is None or not (dtype_of(x) or "").startswith("float"):
            return call
        if n == 2:
            return relax.op.multiply(x, x)
        square = self.builder_.emit(relax.op.multiply(x, x))
        return relax.op.multiply(square, x if n == 3 else square)


def mutate_functions(mutator: relax.PyExprMutator, mod: IRModule) -> IRModule:
    """`mod` with every relax function rewritten by `mutator` (a PyExprMutator made on `mod`)."""
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            # a relax function is mutated into a relax function
            mutator.builder_.update_func(gv, cast(relax.Function, mutator.visit_expr(func)))
    return mutator.builder_.get()


@tvm.transform.module_pass(opt_level=0, name="TunefarmBoolCompare")
class BoolCompare:
    """The module pass: every relax function's comparisons and cumulative sums of bool tensors
    made on integers."""

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        return mutate_functions(_BoolCompare(mod), mod)


@tvm.transform.module_pass(opt_level=0, name="TunefarmSmallPower")
class SmallPower:
    """The module pass: every `power` of a float tensor by a constant 2, 3 or 4 as products."""

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        return mutate_functions(_SmallPower(mod), mod)
