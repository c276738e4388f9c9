"""The `tir` op: an arbitrary PrimFunc submitted as (vetted) TVMScript text.

Spec: `{"op": "tir", "tvmscript": "<text>", "num_outputs": 1}`; the last `num_outputs` params
are outputs. The key is `tir-<identity hash>` (`identity.py`: the structural hash of the
function's normal form, so the user's names, the global symbol, int64 vs int32 indices and
`layout_free_buffers` do not change it; shapes, dtypes and the body do). The function is kept with
int32 indices where that is exact (`identity.narrow_index`): what is tuned, stored and replayed.

Besides the vetting in `tvmscript.py` (and the parse in a child process), the parsed function
must: have only buffer params with constant shapes and supported dtypes, use only for-loops with
constant extents (total iteration count, whatever the loops compute, <= max_iterations and
max_ops; a T.vectorized loop at most MAX_VECTORIZED_EXTENT, a T.unroll loop at most
MAX_UNROLL_EXTENT iterations, nested unrolls at most MAX_UNROLLED_COPIES copies of their body),
allocate no buffer (nor any buffer dimension) past max_tensor_elements and no more than
max_tensor_elements elements in all its alloc_buffer / sblock_alloc_buffer together, carry only
known function attrs, take no loop bound from a value read from a buffer, index a buffer by such
a value only inside its extent (a gather's index is clamped into the buffer first,
`bounds.clamp_data_dependent`, as topi's `take` does in clip mode), pass TVM's static
out-of-bounds checker (`s_tir.analysis.OOBChecker`: an access proven outside), and have every
access proven inside its buffer (`bounds.unproven_access`: an index form the analyser cannot
bound is refused, not trusted). The reference runs the function on this host, and measurers
run its schedules.

flops: TVM's estimator `tvm.s_tir.analysis.estimate_tir_flops` (counts arithmetic ops per
loop iteration; a plain copy counts 0). If the estimator fails, the loop iteration count is used.
Reference: the UNSCHEDULED function built for {"kind": "llvm"} and run here (outputs start as
zeros), on `Workload.make_inputs`, which draws the float inputs a division reads as its divisor
from ±[0.5, 1] instead of [-1, 1] (relax's batch norm divides by a per-channel constant; one
near 0 would amplify a reordered sum's rounding past any tolerance). Tolerance: exact for
integer/bool outputs; for floats `float_tolerance` with the reduction length estimated as flops /
(2 * output elements).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.config import get_settings
from ..core.errors import SpecError
from .base import ArgSpec, OpDef, float_tolerance, is_int
from .bounds import (
    clamp_data_dependent,
    dependent_vars,
    depends_on_data,
    proven_in_range,
    unproven_access,
)
from .tvmscript import FIELD, check_dims, param_buffers, parse_python, parse_tvmscript
from .tvmscript_rules import MAX_UNROLL_EXTENT, MAX_UNROLLED_COPIES, MAX_VECTORIZED_EXTENT

if TYPE_CHECKING:
    from ..core.tvm_api import Buffer, Expr, IRModule, PrimFunc, Stmt, tvm

SUPPORTED_DTYPES = ("bfloat16", "float16", "float32", "float64", "int8", "int16", "int32", "int64",
                    "uint8", "uint16", "uint32", "uint64", "bool")
# op_pattern: relax's fusion class of the function (an integer), on every task it extracts
ALLOWED_FUNC_ATTRS = frozenset({"global_symbol", "tirx.noalias", "s_tir", "layout_free_buffers",
                                "op_pattern"})


@dataclass(frozen=True)
class ParsedTir:
    spec: dict[str, Any]
    func: PrimFunc
    key: str
    args: list[ArgSpec]
    flops: int
    description: str
    tolerance: tuple[float, float]
    divisors: tuple[int, ...]  # float inputs read as a divisor: `Workload.make_inputs`


def _const(expr: Expr, what: str) -> int:
    if not hasattr(expr, "value") or not is_int(getattr(expr, "value", None)):
        raise SpecError(f"{what} must be a constant, got {expr}", field=FIELD)
    return int(expr.value)


def _check_buffer(buf: Buffer, limit: int) -> int:
    """The element count of `buf`; SpecError past `limit` (for the whole buffer, or any one
    dimension: a (0, 2**40) buffer holds nothing but indexes far), or for a symbolic shape."""
    from ..core.tvm_api import buffer_shape

    dims = [_const(d, f"the shape of buffer {buf.name}") for d in buffer_shape(buf)]
    check_dims(str(buf.name), dims, limit)
    if math.prod(dims) > limit:
        raise SpecError(f"buffer {buf.name} {dims} has {math.prod(dims)} elements; the limit is "
                        f"{limit}", field=FIELD)
    return math.prod(dims)


def _check_compact(buf: Buffer, how: str) -> None:
    """SpecError for a buffer laid out other than compactly from its start (strides, an element
    offset): its indices no longer say which memory it touches, so no bound on them is a bound
    on the memory."""
    from ..core.tvm_api import buffer_elem_offset, buffer_strides

    offset = buffer_elem_offset(buf)
    if len(buffer_strides(buf)) or not (hasattr(offset, "value") and int(offset.value) == 0):
        raise SpecError(f"{how} {buf.name} has strides "
                        f"{list(buffer_strides(buf))} or an element offset "
                        f"{offset}: only compact buffers (no strides, elem_offset 0) are "
                        "allowed", field=FIELD)


def _check_loop(node: tvm.tirx.For) -> int:
    """The constant extent of a For; SpecError past the vectorize/unroll caps."""
    from ..core.tvm_api import tvm

    extent = _const(node.extent, "every loop extent")
    kind = int(node.kind)
    if kind == int(tvm.tirx.ForKind.VECTORIZED) and extent > MAX_VECTORIZED_EXTENT:
        raise SpecError(f"T.vectorized loop {node.loop_var} has extent {extent}; the limit is "
                        f"{MAX_VECTORIZED_EXTENT}", field=FIELD)
    if kind == int(tvm.tirx.ForKind.UNROLLED) and extent > MAX_UNROLL_EXTENT:
        raise SpecError(f"T.unroll loop {node.loop_var} has extent {extent}; the limit is "
                        f"{MAX_UNROLL_EXTENT}", field=FIELD)
    return extent


def _count_iterations(stmt: Stmt, limit: int) -> int:
    """Sum over leaf statements of the product of the enclosing loop extents (whatever the leaf
    computes: a loop of no arithmetic runs too); checks loops (the product of nested unrolls:
    the code they expand to), and allocations (each buffer, and their total) on the way."""
    from ..core.tvm_api import tvm

    tirx = tvm.tirx
    cap = get_settings().max_tensor_elements
    total = allocated = 0
    stack = [(stmt, 1, 1)]  # (node, iterations around it, unrolled copies of it)
    while stack:
        node, mult, unrolled = stack.pop()
        if node is None:
            continue
        if isinstance(node, tirx.While):
            raise SpecError("while loops are not allowed", field=FIELD)
        if isinstance(node, tirx.For):
            extent = max(_check_loop(node), 0)
            mult *= extent
            if int(node.kind) == int(tirx.ForKind.UNROLLED):
                unrolled *= extent
                if unrolled > MAX_UNROLLED_COPIES:
                    raise SpecError(f"nested T.unroll loops around {node.loop_var} expand to "
                                    f"{unrolled} copies of their body; the limit is "
                                    f"{MAX_UNROLLED_COPIES}", field=FIELD)
        keys = [str(k) for k in (getattr(node, "annotations", None) or {})]
        if isinstance(node, tirx.AttrStmt):
            keys.append(str(node.attr_key))
        if any(k.startswith("pragma") for k in keys):  # pragma_import_llvm links LLVM IR text
            raise SpecError(f"pragma annotations are not allowed: {keys}", field=FIELD)
        bufs = list(getattr(node, "alloc_buffers", None) or ())
        for view in getattr(node, "match_buffers", None) or ():
            _check_compact(view.buffer, "match_buffer")
        if isinstance(node, tirx.DeclBuffer):
            _check_compact(node.buffer, "decl_buffer")
            _check_buffer(node.buffer, cap)
        if isinstance(node, tirx.AllocBuffer):
            bufs.append(node.buffer)
        for buf in bufs:
            _check_compact(buf, "alloc_buffer")
        for buf in bufs:
            allocated += _check_buffer(buf, cap)
            if allocated > cap:
                raise SpecError(f"the function allocates more than {cap} buffer elements in all "
                                "(alloc_buffer / sblock_alloc_buffer together; the limit is "
                                "max_tensor_elements)", field=FIELD)
        children = list(getattr(node, "seq", None) or ())
        children += [getattr(node, a, None) for a in ("block", "init", "body", "then_case",
                                                      "else_case")]
        children = [c for c in children if c is not None]
        if not children:
            total += mult
            if total > limit:
                raise SpecError(f"the loops run more than {limit:.3g} iterations "
                                "(max_iterations)", field=FIELD)
        stack.extend((c, mult, unrolled) for c in children)
    return total


def check_data_independent(body: Stmt) -> None:
    """SpecError naming the buffer when a buffer index (of a load or a store) or a buffer region
    depends on a value read from a buffer, directly or through a variable bound to one (a
    Bind/let, a block iterator's binding), and is not provably inside the buffer (what
    `bounds.clamp_data_dependent` makes of a gather), or when a loop bound depends on one. Such
    an index is unchecked by the static out-of-bounds checker: the kernel could read or write
    anywhere."""
    from ..core.tvm_api import buffer_shape, tvm, tvm_ffi

    tirx, load_t = tvm.tirx, tvm.ir.TensorLoad
    nodes: list[Expr | Stmt] = []
    tvm_ffi.structural_walk(body, [((load_t, tirx.BufferStore, tirx.For, tvm.ir.TensorRegion),
                                    nodes.append)])
    tainted = dependent_vars(body)

    def unbounded(index: Expr, dim: Expr) -> bool:
        return depends_on_data(index, tainted) and not (
            hasattr(dim, "value") and proven_in_range(index, 0, int(dim.value) - 1))

    def refuse(what: str) -> SpecError:
        return SpecError(f"data-dependent indexing is not allowed: {what} depends on a value "
                         "read from a buffer and is not kept inside the buffer", field=FIELD)

    for n in nodes:  # accesses first: their message names the buffer
        if isinstance(n, load_t | tirx.BufferStore):
            buf = n.source if isinstance(n, load_t) else n.buffer
            if any(unbounded(i, d) for i, d in zip(n.indices, buffer_shape(buf), strict=False)):
                raise refuse(f"an index of buffer {getattr(buf, 'name', buf)}")
    for n in nodes:
        if isinstance(n, tirx.For) and (depends_on_data(n.min, tainted)
                                        or depends_on_data(n.extent, tainted)):
            raise refuse(f"the bounds of loop {n.loop_var}")
        if isinstance(n, tvm.ir.TensorRegion):
            for r, d in zip(n.region, buffer_shape(n.source), strict=False):
                if depends_on_data(r.extent, tainted) or unbounded(r.min, d):
                    raise refuse(f"a region [{r.min}, {r.min} + {r.extent}) of buffer "
                                 f"{getattr(n.source, 'name', n.source)}")


def _flops(mod: IRModule, iterations: int) -> int:
    from ..core.tvm_api import tvm

    try:
        return round(float(tvm.s_tir.analysis.estimate_tir_flops(mod)))
    except Exception:  # the estimator rejects some constructs: fall back to iterations
        return iterations


def parse_tir(spec: dict[str, Any]) -> ParsedTir:
    from ..core.tvm_api import func_body, func_params, tvm
    from .identity import identity_hash, narrow_index

    unknown = sorted(set(spec) - {"op", "tvmscript", "num_outputs"})
    if unknown:
        raise SpecError(f"unknown field(s) {', '.join(unknown)} for op tir (fields: op, "
                        "tvmscript, num_outputs)", field=unknown[0])
    if "tvmscript" not in spec:
        raise SpecError("op tir needs the TVMScript text of one @T.prim_func", field=FIELD)
    nout = 1 if spec.get("num_outputs") is None else spec["num_outputs"]
    if not is_int(nout) or int(nout) < 1:
        raise SpecError(f"must be a positive integer, got {nout!r}", field="num_outputs")
    nout = int(nout)
    # a gather's index read from a buffer is clamped into the buffer (`bounds`): what is keyed,
    # checked, tuned and run from here on
    func = clamp_data_dependent(parse_tvmscript(spec["tvmscript"]))
    bad_attrs = sorted(set(func.attrs.keys()) - ALLOWED_FUNC_ATTRS) if func.attrs else []
    if bad_attrs:
        raise SpecError(f"function attribute(s) {', '.join(bad_attrs)} not allowed (allowed: "
                        f"{', '.join(sorted(ALLOWED_FUNC_ATTRS))})", field=FIELD)
    if nout > len(func_params(func)):
        raise SpecError(f"num_outputs={nout} but the function has "
                        f"{len(func_params(func))} parameters", field="num_outputs")
    args: list[ArgSpec] = []
    for name, shape, dtype in param_buffers(func):
        if dtype not in SUPPORTED_DTYPES:
            raise SpecError(f"buffer {name} has dtype {dtype}; supported: "
                            f"{', '.join(SUPPORTED_DTYPES)}", field=FIELD)
        args.append((name, tuple(shape), dtype))
    limits = get_settings()
    iterations = _count_iterations(func_body(func), int(min(limits.max_ops, limits.max_iterations)))
    check_data_independent(func_body(func))
    mod = tvm.IRModule({"main": func})
    try:
        tvm.s_tir.analysis.OOBChecker()(mod)
    except Exception as exc:  # ScheduleError "... Error message: Out of bounds memory access ..."
        msg = next((ln.split("Error message:", 1)[1].strip() for ln in str(exc).splitlines()
                    if "Error message:" in ln), "a buffer access may be out of bounds")
        raise SpecError(f"out-of-bounds check failed: {msg}"[:300], field=FIELD) from None
    unproven = unproven_access(func)  # proven in bounds, or refused
    if unproven is not None:
        raise SpecError(f"out-of-bounds check failed: an access is not proven inside its "
                        f"buffer: {unproven}"[:400], field=FIELD)
    # relax spells indices int64; the tuned (and stored) form is int32 where that is exact
    func = narrow_index(func)
    mod = tvm.IRModule({"main": func})
    flops = _flops(mod, iterations)
    if flops > limits.max_ops:
        raise SpecError(f"{flops:.3g} operations exceed the limit {limits.max_ops:.3g}",
                        field=FIELD)
    canon = {"op": "tir", "tvmscript": spec["tvmscript"], "num_outputs": nout}
    key = f"tir-{identity_hash(mod)}"
    return ParsedTir(canon, func, key, args, flops, _description(spec["tvmscript"], args, nout),
                     _tolerance(args[-nout:], flops), _divisors(func, args[:len(args) - nout]))


def _divisors(func: PrimFunc, inputs: list[ArgSpec]) -> tuple[int, ...]:
    """The float inputs that some division reads in its divisor (relax's batch norm divides by
    a per-channel constant): drawn away from zero by `Workload.make_inputs`, since a divisor
    near 0 turns the kernel's own rounding (a reordered sum) into a wrong answer."""
    from ..core.tvm_api import func_body, func_params, tvm, tvm_ffi

    divs: list[tvm.tirx.Div] = []
    tvm_ffi.structural_walk(func_body(func), [((tvm.tirx.Div,), divs.append)])
    loads: list[tvm.ir.TensorLoad] = []
    for d in divs:
        tvm_ffi.structural_walk(d.b, [((tvm.ir.TensorLoad,), loads.append)])
    # buffer parameters (TVM 0.27: no buffer_map)
    params = list(func_params(func))[:len(inputs)]
    return tuple(i for i, (p, (_, _, dt)) in enumerate(zip(params, inputs, strict=True))
                 if dt.startswith("float") and any(ld.source.same_as(p) for ld in loads))


def _description(text: str, args: list[ArgSpec], nout: int) -> str:
    import ast

    name = next((n.name for n in parse_python(text).body if isinstance(n, ast.FunctionDef)),
                "main")

    def fmt(a: ArgSpec) -> str:
        return f"{a[0]}[{','.join(str(d) for d in a[1])}] {a[2]}"

    ins = ", ".join(fmt(a) for a in args[:len(args) - nout])
    outs = ", ".join(fmt(a) for a in args[len(args) - nout:])
    return f"tir {name}({ins}) -> {outs}"


def _tolerance(outs: list[ArgSpec], flops: int) -> tuple[float, float]:
    floats = {dt for _, _, dt in outs if dt.startswith("float") or dt == "bfloat16"}
    if not floats:
        return 0.0, 0.0
    out_elems = sum(math.prod(shape) for _, shape, _ in outs)
    reduction = max(1, flops // max(1, 2 * out_elems))
    worst = next(dt for dt in ("bfloat16", "float16", "float32", "float64") if dt in floats)
    return float_tolerance(worst, reduction)


def output_fill(shape: tuple[int, ...], dtype: str, fill: str = "zeros") -> np.ndarray:
    """An output buffer before a kernel runs: zeros, or a sentinel no kernel computes by
    accident (NaN; near the top of an integer type) that shows every element it left unwritten.
    Booleans have no sentinel: zeros."""
    if fill == "zeros" or dtype == "bool":
        return np.zeros(shape, dtype=dtype)
    if dtype.startswith(("int", "uint")):
        return np.full(shape, np.iinfo(dtype).max - 3, dtype=dtype)
    return np.full(shape, np.nan, dtype=dtype)


def run_reference(mod: IRModule, args: list[ArgSpec], inputs: list[np.ndarray],
                  fill: str = "zeros") -> list[np.ndarray]:
    """Build `mod` unscheduled for {"kind": "llvm"}, run it on `inputs` with its outputs filled
    as `output_fill` says, return the outputs."""
    from ..core.tvm_api import tvm

    ex = tvm.compile(mod, target={"kind": "llvm"})  # type: ignore[arg-type]
    dev = tvm.cpu()
    outs = [tvm.runtime.tensor(output_fill(tuple(shape), dt, fill), dev)
            for _, shape, dt in args[len(inputs):]]
    # np.array, not np.ascontiguousarray: that one makes a 0-d input (a scalar index) 1-d
    ex["main"](*[tvm.runtime.tensor(np.array(x, order="C"), dev) for x in inputs], *outs)
    return [o.numpy() for o in outs]


class TirOpDef(OpDef):
    """The registry entry of `tir`: fields tvmscript and num_outputs instead of shape/dtype."""

    @property
    def fields(self) -> tuple[str, ...]:
        return ("op", "tvmscript", "num_outputs")

    def describe(self) -> dict[str, Any]:
        return {
            "op": self.name,
            "doc": self.doc,
            "fields": {
                "tvmscript": {"doc": "TVMScript text of one @T.prim_func",
                              "limit_bytes": get_settings().max_tvmscript_bytes},
                "num_outputs": {"doc": "how many trailing parameters are outputs",
                                "default": 1},
            },
            "inputs": list(self.inputs_doc),
            "outputs": list(self.outputs_doc),
            "example": self.example(),
        }

    def example(self) -> dict[str, Any]:
        return {"op": "tir", "tvmscript": TIR_EXAMPLE, "num_outputs": 1}

    def prim_func(self, spec: dict[str, Any]) -> PrimFunc:
        return parse_tir(spec).func


TIR_EXAMPLE = (
    "from tvm.script import tirx as T\n\n"
    "@T.prim_func(s_tir=True)\n"
    "def scale(A: T.Buffer((16, 16), \"float32\"), B: T.Buffer((16, 16), \"float32\")):\n"
    "    T.func_attr({\"tirx.noalias\": True})\n"
    "    for i, j in T.grid(16, 16):\n"
    "        with T.sblock(\"B\"):\n"
    "            vi, vj = T.axis.remap(\"SS\", [i, j])\n"
    "            B[vi, vj] = A[vi, vj] * T.float32(2)\n"
)

TIR = TirOpDef(
    name="tir", shape_doc="(none: shapes come from the buffer parameters of the TVMScript)",
    shape_names=(), default_dtype=None, dtypes=SUPPORTED_DTYPES,
    doc="An arbitrary PrimFunc as TVMScript text ('from tvm.script import tirx as T' is "
        "optional). Fields: tvmscript (the text of one @T.prim_func whose parameters are "
        "T.Buffer with constant shapes), num_outputs (default 1: the last num_outputs "
        "parameters are outputs). Only plain TIR is accepted (no extern/packed calls, no raw "
        "pointers, no while loops, no out-of-bounds accesses). flops from TVM's "
        "estimate_tir_flops; the reference runs the unscheduled function on the CPU.",
    inputs_doc=("the first len(params) - num_outputs parameters",),
    outputs_doc=("the last num_outputs parameters",),
)
