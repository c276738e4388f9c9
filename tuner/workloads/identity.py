"""A PrimFunc's identity: what stays when the spelling that does not change the computation goes.

A compiler does not send the PrimFunc `tunefarm tune matmul` builds: relax legalization writes the
same GEMM with `T.int64` loops and shapes, its own buffer and block names, no
`layout_free_buffers` attribute (unless the weight is bound), and no global symbol. The normal
form erases exactly those differences:

- index dtype: loops, shapes and indices narrowed to int32 (TVM's `ForceNarrowIndexToInt32`)
  when every buffer and every loop fits int32; a function too big for that, or with a buffer of
  int64 data, keeps its int64;
- function attributes: only `tirx.noalias` (what the compiler may assume) and `s_tir` (the body
  is schedulable TIR) are kept, the global symbol is "main"; `layout_free_buffers` and the rest
  are dropped;
- names of buffers, variables and blocks: structural equality ignores them already.

`identity_hash` (16 hex digits) is the structural hash of the normal form: the `shash` a workload
row stores, how `TunefarmDatabase` finds the records of a module whatever its spelling, and the
`tir-<hash>` key of a submitted function. Two functions with the same normal form compute the same
thing on the same argument shapes, so a schedule of one is valid for the other's calls.
"""

from __future__ import annotations

from typing import cast

from ..core.tvm_api import (
    IRModule,
    PrimFunc,
    buffer_shape,
    func_body,
    func_params,
    module_functions,
    shash_hex,
    structural_equal,
    tvm,
    tvm_ffi,
)

KEPT_ATTRS = frozenset({"tirx.noalias", "s_tir"})
INT32_MAX = 2**31 - 1


def _prim_func(mod_or_func: IRModule | PrimFunc) -> PrimFunc:
    if isinstance(mod_or_func, tvm.IRModule):
        funcs = [f for f in module_functions(mod_or_func).values()
                 if isinstance(f, tvm.tirx.PrimFunc)]
        if len(funcs) != 1:
            raise ValueError(f"the module holds {len(funcs)} PrimFuncs, not one")
        return funcs[0]
    return mod_or_func


def _fits_int32(func: PrimFunc) -> bool:
    """Every buffer's element count and every loop extent is a constant below 2**31."""
    loops: list[tvm.tirx.For] = []
    tvm_ffi.structural_walk(func_body(func), [((tvm.tirx.For,), loops.append)])
    if not all(isinstance(f.extent, tvm.tirx.IntImm) and f.extent.value <= INT32_MAX
               for f in loops):
        return False

    # 0.27: a buffer parameter is a Var whose type is a BufferType
    for p in func_params(func):
        if not isinstance(getattr(p, "ty", None), tvm.tirx.BufferType):
            continue
        n = 1
        for d in buffer_shape(p):
            if not isinstance(d, tvm.tirx.IntImm):
                return False
            n *= int(d.value)
        if n > INT32_MAX:
            return False
    return True


def narrow_index(func: PrimFunc) -> PrimFunc:
    """`func` with int32 loops, shapes and indices where they were int64, when everything fits
    int32 and no buffer holds int64 data (TVM's pass refuses those: they stay as they are)."""
    if not _fits_int32(func):
        return func
    try:
        return tvm.tirx.transform.ForceNarrowIndexToInt32()(tvm.IRModule({"main": func}))["main"]
    except RuntimeError:  # InternalError: an int64 data buffer, whose indices stay int64
        return func


def normal_form(mod_or_func: IRModule | PrimFunc) -> IRModule:
    """`IRModule({"main": f'})` where f' is the normal form of the module's one PrimFunc."""
    func = _prim_func(mod_or_func)
    for key in list(func.attrs.keys()) if func.attrs is not None else []:
        if key not in KEPT_ATTRS:
            func = cast(PrimFunc, func.without_attr(key))
    return tvm.IRModule(
        {"main": narrow_index(cast(PrimFunc, func.with_attr("global_symbol", "main")))})


def identity_hash(mod_or_func: IRModule | PrimFunc) -> str:
    """16 hex digits: the structural hash of `normal_form(mod_or_func)`."""
    return shash_hex(normal_form(mod_or_func))


def same_computation(a: IRModule | PrimFunc, b: IRModule | PrimFunc) -> bool:
    """Whether two modules (or PrimFuncs) have structurally equal normal forms."""
    return structural_equal(normal_form(a), normal_form(b))
