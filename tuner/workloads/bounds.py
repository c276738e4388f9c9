"""Accesses indexed by data, kept inside their buffers.

A gather (`take`, `gather`, embedding lookups, `index_select`: what relax legalizes them into)
reads a buffer at an index that is itself read from a buffer. No analysis can bound such an index
from the program: it is whatever the input holds. So every access whose index depends on a value
read from a buffer (directly, or through a variable bound to one) and that the analyser cannot
prove inside `[0, extent)` is rewritten to a clamped index, `max(min(i, extent - 1), 0)` (topi's
`take` in `clip` mode); a buffer region's start is clamped the same way. The rewrite is applied
before a function is keyed, tuned or built (`parse_tir` for an untrusted workload, the model
pipeline for every task of a model), so the reference, the tuned kernel and the model's library
compute the same thing: the same values for in-range indices, and no access outside a buffer for
any other. It is idempotent: a clamped index is proven in range and left alone.

`dependent_vars` and `depends_on_data` are the taint analysis `tir.check_data_independent` uses
too (loop bounds that depend on data are refused there, not clamped).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from ..core import tvm_api as tv

__all__ = ["clamp_data_dependent", "dependent_vars", "depends_on_data", "proven_in_range"]


def _tvm() -> tuple[ModuleType, ModuleType]:
    from ..core.tvm_api import tvm, tvm_ffi

    return tvm, tvm_ffi


def dependent_vars(body: tv.Stmt) -> set[int]:
    """The hashes of the variables bound (Bind, Let, a block iterator's binding) to a value that
    depends on a buffer's contents, transitively."""
    tvm, tvm_ffi = _tvm()
    tirx = tvm.tirx
    bindings: list[tuple[tv.tvm.tirx.Var, tv.Expr]] = []

    def bind(n: tv.tvm.tirx.Bind | tv.tvm.tirx.Let | tv.tvm.s_tir.SBlockRealize) -> None:
        if isinstance(n, tirx.Bind | tirx.Let):
            bindings.append((n.var, n.value))
        else:
            bindings.extend((iv.var, v) for iv, v in zip(
                cast("tv.tvm.s_tir.SBlockRealize", n).block.iter_vars,
                cast("tv.tvm.s_tir.SBlockRealize", n).iter_values, strict=False))

    tvm_ffi.structural_walk(body, [((tirx.Bind, tirx.Let, tvm.s_tir.SBlockRealize), bind)])
    tainted: set[int] = set()
    changed = True
    while changed:  # a variable bound to a load, or to a variable bound to one, ...
        changed = False
        for var, value in bindings:
            if hash(var) not in tainted and depends_on_data(value, tainted):
                tainted.add(hash(var))
                changed = True
    return tainted


def depends_on_data(expr: tv.Expr, tainted: set[int]) -> bool:
    """Whether `expr` reads a buffer or a variable in `tainted`."""
    tvm, tvm_ffi = _tvm()
    found: list[bool] = []

    def seen(x: tv.Expr) -> None:
        if isinstance(x, tvm.ir.TensorLoad) or hash(x) in tainted:
            found.append(True)

    tvm_ffi.structural_walk(expr, [((tvm.ir.TensorLoad, tvm.tirx.Var), seen)])
    return bool(found)


def proven_in_range(expr: tv.Expr, lo: int, hi: int) -> bool:
    """Whether the analyser proves `lo <= expr <= hi` from the expression alone."""
    tvm, _ = _tvm()
    bound = tvm.sym.Analyzer().const_int_bound(expr)
    return int(bound.min_value) >= lo and int(bound.max_value) <= hi


def _extent(dim: tv.Expr) -> int | None:
    return int(dim.value) if hasattr(dim, "value") else None


def _clamp(index: tv.Expr, upper: int) -> tv.Expr:
    """`index` clamped into [0, upper] (its own dtype)."""
    from ..core.tvm_api import expr_dtype

    tvm, _ = _tvm()
    tirx = tvm.tirx
    dt = str(expr_dtype(index))
    return tirx.max(tirx.min(index, tirx.const(upper, dt)), tirx.const(0, dt))


def clamp_data_dependent(func: tv.PrimFunc) -> tv.PrimFunc:
    """`func` with every data-dependent index the analyser cannot bound clamped into its
    buffer's extent (see the module docstring); `func` itself when there is none."""
    from ..core.tvm_api import buffer_shape, func_body

    tvm, tvm_ffi = _tvm()
    tainted = dependent_vars(func_body(func))

    def fixed(index: tv.Expr, upper: int | None) -> tv.Expr:
        if upper is None or upper < 0 or not depends_on_data(index, tainted) \
                or proven_in_range(index, 0, upper):
            return index
        return _clamp(index, upper)

    def indices(n: tv.tvm.ir.TensorLoad | tv.tvm.tirx.BufferStore,
                buf: tv.Expr) -> list[tv.Expr] | None:
        """The access's indices with the unbounded data-dependent ones clamped; None: as is."""
        idx = [fixed(i, None if (e := _extent(d)) is None else e - 1)
               for i, d in zip(n.indices, buffer_shape(buf), strict=False)]
        return idx if any(not a.same_as(b) for a, b in zip(idx, n.indices, strict=True)) else None

    def load(n: tv.tvm.ir.TensorLoad) -> tv.Expr:
        idx = indices(n, n.source)
        return n if idx is None else tvm.tirx.BufferLoad(n.source, idx)

    def store(n: tv.tvm.tirx.BufferStore) -> tv.Stmt:
        idx = indices(n, n.buffer)
        return n if idx is None else tvm.tirx.BufferStore(n.buffer, n.value, idx)

    def region(n: tv.tvm.ir.TensorRegion) -> tv.Expr:
        ranges = []
        for r, d in zip(n.region, buffer_shape(n.source), strict=False):
            ext, size = _extent(r.extent), _extent(d)
            upper = None if ext is None or size is None else size - ext
            start = fixed(r.min, upper)
            ranges.append(r if start.same_as(r.min) else tvm.ir.Range.from_min_extent(
                start, r.extent))
        changed = any(not a.same_as(b) for a, b in zip(ranges, n.region, strict=True))
        return tvm.ir.TensorRegion(n.source, ranges, n.ty) if changed else n

    callbacks: list[tuple[Any, Callable[[Any], Any]]] = [
        (tvm.ir.TensorLoad, load), (tvm.tirx.BufferStore, store), (tvm.ir.TensorRegion, region)]
    body = tvm_ffi.structural_map(func_body(func), callbacks)
    return func if body.same_as(func_body(func)) else func.with_body(body)


def unproven_access(func: tv.PrimFunc) -> str | None:
    """The first buffer access of `func` that the analyser cannot prove inside its buffer
    (`0 <= index < extent` in every dimension), described for an error message; None when every
    access is proven. The function is lowered first (init blocks, blocks and their predicates,
    match_buffer views: every access then names the buffer it really touches, its indices in
    terms of loop variables), and each access is proven from the loop ranges, the let bindings
    and the conditions that guard it (`if`, `T.if_then_else`; a `T.Select` evaluates both of its
    sides, so it guards nothing). An index form the analyser cannot bound (`bitwise_xor`, shifts,
    a float-to-int cast, an overflowing product) is therefore refused, never trusted."""
    from ..core.tvm_api import buffer_shape

    tvm, tvm_ffi = _tvm()
    tirx = tvm.tirx
    try:
        mod = tvm.transform.Sequential([
            tvm.s_tir.transform.LowerInitBlock(), tvm.s_tir.transform.ConvertBlocksToOpaque(),
            tvm.s_tir.transform.LowerMatchBuffer(), tvm.s_tir.transform.LowerOpaqueBlock(),
            tirx.transform.ConvertSSA()])(tvm.IRModule({"main": func}))
    except Exception as exc:  # a form TVM's own lowering refuses is not proven either
        return f"the function cannot be lowered to check its accesses ({_first_line(exc)})"
    an = tvm.sym.Analyzer()
    found: list[str] = []
    if_then_else = tvm.ir.Op.get("prim.if_then_else")

    def check(buf: tv.Buffer, indices: list[tv.Expr]) -> None:
        if found:
            return
        shape = list(buffer_shape(buf))
        if len(indices) != len(shape):
            found.append(f"{buf.name} indexed with {len(indices)} indices, it has "
                         f"{len(shape)} dimensions")
            return
        for dim, (index, extent) in enumerate(zip(indices, shape, strict=True)):
            lo, hi = _lanes(index, tirx)
            try:
                proven = (an.can_prove(lo >= 0)  # type: ignore[operator]
                          and an.can_prove(hi < extent))  # type: ignore[operator]
            except Exception:  # e.g. a constant the simplifier folds past its dtype's range
                proven = False
            if not proven:
                found.append(f"{buf.name}[{', '.join(str(i) for i in indices)}] (dimension {dim}"
                             f": {index} within [0, {extent}) is not proven)")
                return

    def guarded(mutator: tv.tvm_ffi.StructuralMutator, cond: tv.Expr, then: tv.Stmt | tv.Expr,
                other: tv.Stmt | tv.Expr | None) -> None:
        mutator.mutate(cond)
        # simplified: the analyser takes `x < 64` as a bound on x, but not `!(64 <= x)`
        with an.constraint_scope(an.simplify(cond)):
            mutator.mutate(then)
        if other is not None:
            with an.constraint_scope(an.simplify(tirx.Not(cond))):
                mutator.mutate(other)

    def on_for(n: tv.tvm.tirx.For, mutator: tv.tvm_ffi.StructuralMutator) -> tv.tvm.tirx.For:
        an.bind(n.loop_var, tvm.ir.Range.from_min_extent(n.min, n.extent), allow_override=True)
        mutator.default_mutate(n)
        return n

    def on_bind(n: tv.tvm.tirx.Bind | tv.tvm.tirx.Let,
                mutator: tv.tvm_ffi.StructuralMutator) -> tv.tvm.tirx.Bind | tv.tvm.tirx.Let:
        mutator.mutate(n.value)
        an.bind(n.var, n.value, allow_override=True)
        mutator.default_mutate(n)
        return n

    def on_if(n: tv.tvm.tirx.IfThenElse,
              mutator: tv.tvm_ffi.StructuralMutator) -> tv.tvm.tirx.IfThenElse:
        guarded(mutator, n.condition, n.then_case, n.else_case)
        return n

    def on_call(n: tv.tvm.ir.Call, mutator: tv.tvm_ffi.StructuralMutator) -> tv.tvm.ir.Call:
        if n.op.same_as(if_then_else):
            guarded(mutator, n.args[0], n.args[1], n.args[2])
        else:
            mutator.default_mutate(n)
        return n

    def on_load(n: tv.tvm.ir.TensorLoad,
                mutator: tv.tvm_ffi.StructuralMutator) -> tv.tvm.ir.TensorLoad:
        check(cast("tv.Buffer", n.source), n.indices)
        mutator.default_mutate(n)
        return n

    def on_store(n: tv.tvm.tirx.BufferStore,
                 mutator: tv.tvm_ffi.StructuralMutator) -> tv.tvm.tirx.BufferStore:
        check(n.buffer, n.indices)
        mutator.default_mutate(n)
        return n

    try:
        tvm_ffi.structural_mutate(mod["main"].body, [
            (tirx.For, on_for), ((tirx.Bind, tirx.Let, tirx.LetStmt), on_bind),
            (tirx.IfThenElse, on_if), (tvm.ir.Call, on_call), (tvm.ir.TensorLoad, on_load),
            (tirx.BufferStore, on_store)])
    except Exception as exc:  # the analyser itself failed: nothing is proven
        return f"the accesses cannot be analysed ({_first_line(exc)})"
    return found[0] if found else None


def _lanes(index: tv.Expr, tirx: ModuleType) -> tuple[tv.Expr, tv.Expr]:
    """The lowest and highest lane of an index (a vector index: a Ramp or a Broadcast)."""
    if isinstance(index, tirx.Ramp):
        last = index.base + index.stride * (index.lanes - 1)
        return tirx.min(index.base, last), tirx.max(index.base, last)
    if isinstance(index, tirx.Broadcast):
        return index.value, index.value
    return index, index


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return (lines[0] if lines else type(exc).__name__)[:200]
