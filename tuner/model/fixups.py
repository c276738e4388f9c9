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
"""

from __future__ import annotations

from typing import Any

from ..core.tvm_api import relax, tvm

_COMPARISONS = frozenset(f"relax.{op}" for op in (
    "equal", "not_equal", "less", "less_equal", "greater", "greater_equal"))


def _dtype(expr: Any) -> str | None:
    dtype = getattr(getattr(expr, "ty", None), "dtype", None)
    return None if dtype is None else str(dtype)


@relax.expr_functor.mutator
class _BoolCompare(relax.PyExprMutator):  # type: ignore[misc]
    def visit_call_(self, call: Any) -> Any:
        call = super().visit_call_(call)
        name = getattr(call.op, "name", "")
        if name == "relax.cumsum" and _dtype(call.args[0]) == "bool":
            return relax.Call(call.op, [relax.op.astype(call.args[0], "int64")], call.attrs)
        if name not in _COMPARISONS:
            return call
        dtypes = [_dtype(a) for a in call.args]
        if "bool" not in dtypes:
            return call
        args = [relax.op.astype(a, "int8") if dt == "bool" else a
                for a, dt in zip(call.args, dtypes, strict=True)]
        return relax.Call(call.op, args, call.attrs)


def mutate_functions(mutator: Any, mod: Any) -> Any:
    """`mod` with every relax function rewritten by `mutator` (a PyExprMutator made on `mod`)."""
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return mutator.builder_.get()


@tvm.transform.module_pass(opt_level=0, name="TunefarmBoolCompare")
class BoolCompare:
    """The module pass: every relax function's comparisons and cumulative sums of bool tensors
    made on integers."""

    def transform_module(self, mod: Any, ctx: Any) -> Any:
        return mutate_functions(_BoolCompare(mod), mod)
