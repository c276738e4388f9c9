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
from typing import Any

__all__ = ["clamp_data_dependent", "dependent_vars", "depends_on_data", "proven_in_range"]


def _tvm() -> tuple[Any, Any]:
    from ..tvm_api import tvm, tvm_ffi

    return tvm, tvm_ffi


def dependent_vars(body: Any) -> set[int]:
    """The hashes of the variables bound (Bind, Let, a block iterator's binding) to a value that
    depends on a buffer's contents, transitively."""
    tvm, tvm_ffi = _tvm()
    tirx = tvm.tirx
    bindings: list[tuple[Any, Any]] = []

    def bind(n: Any) -> None:
        if isinstance(n, tirx.Bind | tirx.Let):
            bindings.append((n.var, n.value))
        else:
            bindings.extend((iv.var, v) for iv, v in zip(n.block.iter_vars, n.iter_values,
                                                         strict=False))

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


def depends_on_data(expr: Any, tainted: set[int]) -> bool:
    """Whether `expr` reads a buffer or a variable in `tainted`."""
    tvm, tvm_ffi = _tvm()
    found: list[bool] = []

    def seen(x: Any) -> None:
        if isinstance(x, tvm.ir.TensorLoad) or hash(x) in tainted:
            found.append(True)

    tvm_ffi.structural_walk(expr, [((tvm.ir.TensorLoad, tvm.tirx.Var), seen)])
    return bool(found)


def proven_in_range(expr: Any, lo: int, hi: int) -> bool:
    """Whether the analyser proves `lo <= expr <= hi` from the expression alone."""
    tvm, _ = _tvm()
    bound = tvm.sym.Analyzer().const_int_bound(expr)
    return int(bound.min_value) >= lo and int(bound.max_value) <= hi


def _extent(dim: Any) -> int | None:
    return int(dim.value) if hasattr(dim, "value") else None


def _clamp(index: Any, upper: int) -> Any:
    """`index` clamped into [0, upper] (its own dtype)."""
    tvm, _ = _tvm()
    tirx = tvm.tirx
    dt = str(index.ty.dtype)
    return tirx.max(tirx.min(index, tirx.const(upper, dt)), tirx.const(0, dt))


def clamp_data_dependent(func: Any) -> Any:
    """`func` with every data-dependent index the analyser cannot bound clamped into its
    buffer's extent (see the module docstring); `func` itself when there is none."""
    tvm, tvm_ffi = _tvm()
    tainted = dependent_vars(func.body)

    def fixed(index: Any, upper: int | None) -> Any:
        if upper is None or upper < 0 or not depends_on_data(index, tainted) \
                or proven_in_range(index, 0, upper):
            return index
        return _clamp(index, upper)

    def load(n: Any) -> Any:
        shape = n.source.shape
        idx = [fixed(i, None if (e := _extent(d)) is None else e - 1)
               for i, d in zip(n.indices, shape, strict=False)]
        changed = any(not a.same_as(b) for a, b in zip(idx, n.indices, strict=True))
        return tvm.tirx.BufferLoad(n.source, idx) if changed else n

    def store(n: Any) -> Any:
        shape = n.buffer.shape
        idx = [fixed(i, None if (e := _extent(d)) is None else e - 1)
               for i, d in zip(n.indices, shape, strict=False)]
        changed = any(not a.same_as(b) for a, b in zip(idx, n.indices, strict=True))
        return tvm.tirx.BufferStore(n.buffer, n.value, idx) if changed else n

    def region(n: Any) -> Any:
        ranges = []
        for r, d in zip(n.region, n.source.shape, strict=False):
            ext, size = _extent(r.extent), _extent(d)
            upper = None if ext is None or size is None else size - ext
            start = fixed(r.min, upper)
            ranges.append(r if start.same_as(r.min) else tvm.ir.Range.from_min_extent(
                start, r.extent))
        changed = any(not a.same_as(b) for a, b in zip(ranges, n.region, strict=True))
        return tvm.ir.TensorRegion(n.source, ranges, n.ty) if changed else n

    callbacks: list[tuple[Any, Callable[[Any], Any]]] = [
        (tvm.ir.TensorLoad, load), (tvm.tirx.BufferStore, store), (tvm.ir.TensorRegion, region)]
    body = tvm_ffi.structural_map(func.body, callbacks)
    return func if body.same_as(func.body) else func.with_body(body)
