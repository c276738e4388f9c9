"""Tensor intrinsics tunefarm's templates tensorize with, registered on first use.

TVMScript needs the source file, so the intrinsics live here, as factories: parsing their
TVMScript costs ~1.2 s, which a build or measuring process pays only for the intrinsics a trace
names. A template tensorizes with `use(NAME)`, which registers NAME once and returns it;
whoever replays a stored trace goes through `schedules.registry.replay`, which registers what
the trace names (`register_for_trace`). TVM's own WMMA intrinsics (`tvm.s_tir.tensor_intrin.cuda`,
~8 s) and the two x86 dots MetaSchedule's default CPU rules name (`...tensor_intrin.x86`,
0.25-0.45 s) are loaded the same way, by name.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable
from typing import Any

from schedules.amx_intrinsics import AMX_PATTERNS
from schedules.dot_intrinsics import DOT_FACTORIES, dot_u8i8_desc
from schedules.polynomial import let as _let
from schedules.polynomial import pin_source
from schedules.polynomial import vexp as _vexp
from schedules.row_intrinsics import ROW_PATTERNS
from tuner.core.tvm_api import Expr, load_tensor_intrins, tvm

T = tvm.script.tirx  # `from tvm.script import tirx as T`, without importing tvm here
TensorIntrin = tvm.s_tir.TensorIntrin


pin_source(__file__)

# name -> () -> (description, implementation) PrimFuncs
_FACTORIES: dict[str, Callable[[], tuple[Any, Any]]] = dict(DOT_FACTORIES)  # x86 dot products
# families of names with parameters (whole-row intrinsics: schedules/row_intrinsics.py): a regex
# over the name -> (match -> (description, implementation), or None for parameters out of range)
_PATTERNS = [*ROW_PATTERNS, *AMX_PATTERNS]
# TVM's own intrinsics (a pattern of their names) -> the tvm.s_tir.tensor_intrin module that
# registers them (x86: the two dots MetaSchedule's default CPU rules tensorize with)
_TVM_MODULES = {re.compile(r"wmma_\w+"): "cuda", re.compile(r"dot_16x4_(vnni|avx512)"): "x86"}


def use(name: str) -> str:
    """Register tunefarm's intrinsic `name` (once per process) and return it:
    `sch.tensorize(loop, use(NAME))`."""
    if TensorIntrin.get(name, allow_missing=True) is None:
        TensorIntrin.register(name, *_factory(name)())
    return name


def _factory(name: str) -> Callable[[], tuple[Any, Any]]:
    if name in _FACTORIES:
        return _FACTORIES[name]
    for pattern, make in _PATTERNS:
        if (m := pattern.fullmatch(name)) and (made := make(m)) is not None:
            return lambda: made
    raise KeyError(f"no tunefarm intrinsic is named {name!r}")


def register_for_trace(trace_json: str) -> None:
    """Register every intrinsic a trace (JSON) names, so that it replays in this process. A name
    stands in the JSON as a Tensorize attribute or, JSON-quoted again, as the value of an
    `auto_tensorize` annotation: look for it as a whole word."""
    words = set(re.findall(r"\w+", trace_json))
    for name in words.intersection(_FACTORIES):
        use(name)
    for word in words:
        if any(pattern.fullmatch(word) for pattern, _ in _PATTERNS):
            with contextlib.suppress(KeyError):  # out of range: the replay says what is missing
                use(word)
    for pattern, module in _TVM_MODULES.items():
        if any(pattern.fullmatch(w) for w in words):
            load_tensor_intrins(module)


def register_all() -> list[str]:
    """Register every tunefarm intrinsic in this process and return their names: what a stock
    TVM process needs before it replays records exported with `tunefarm db export --format
    metaschedule` whose traces tensorize with them (`softmax-x86`, `activation-x86`, the
    GELU/SiLU pass of `gemm-x86`, `dense-int8-vnni`, `dense-int8-avx2`, `dense-bf16-avx512`, the
    aarch64 templates).
    The whole-row and AMX intrinsics have sizes in their names: `register_for_trace` registers
    those a trace names."""
    return [use(name) for name in sorted(_FACTORIES)]


# --- fast exp: Y[l] = exp(X[l] - M[0]) over `lanes` fp32 lanes --------------------------------
#
# The description is the body of topi.nn.softmax's T_softmax_exp block, so `tensorize` maps that
# block's vector loop onto it. LLVM lowers a vector `T.exp` to one libm `expf` call per lane (about
# 2.5 ns each here); this implementation is `vexp` (schedules/polynomial.py, which gives its
# accuracy and range). NaN does not propagate (the clamp turns it into e^88.72), so a softmax row
# holding NaN, +inf, or only -inf is not the NaN row numpy gives. Finite rows and -inf entries
# (masks) are handled: e^-inf = 0.

EXP_SUB_F32 = "exp_sub_f32x{lanes}"  # .format(lanes=16)


def _exp_sub_intrin(lanes: int) -> tuple[object, object]:
    vec = f"float32x{lanes}"

    @T.prim_func(s_tir=True)
    def desc(x_h: T.handle, m_h: T.handle, y_h: T.handle) -> None:
        X = T.match_buffer(x_h, (lanes,), "float32", offset_factor=1)
        M = T.match_buffer(m_h, (1,), "float32", offset_factor=1)
        Y = T.match_buffer(y_h, (lanes,), "float32", offset_factor=1)
        with T.sblock("root"):
            T.reads(X[0:lanes], M[0:1])
            T.writes(Y[0:lanes])
            for j in T.serial(0, lanes):
                with T.sblock("exp"):
                    vj = T.axis.remap("S", [j])
                    Y[vj] = T.exp(X[vj] - M[0])

    @T.prim_func(s_tir=True)
    def impl(x_h: T.handle, m_h: T.handle, y_h: T.handle) -> None:
        X = T.match_buffer(x_h, (lanes,), "float32", offset_factor=1)
        M = T.match_buffer(m_h, (1,), "float32", offset_factor=1)
        Y = T.match_buffer(y_h, (lanes,), "float32", offset_factor=1)
        with T.sblock("root"):
            T.reads(X[0:lanes], M[0:1])
            T.writes(Y[0:lanes])
            Y[T.ramp(T.int32(0), 1, lanes)] = _vexp(X.vload([0], vec) - T.broadcast(M[0], lanes),
                                                    lanes)

    return desc, impl


for _lanes in (4, 8, 16):
    _FACTORIES[EXP_SUB_F32.format(lanes=_lanes)] = functools.partial(_exp_sub_intrin, _lanes)


# --- activations: Y[l] = f(X[l]) for f in erf, tanh, sigmoid, over 16 fp32 lanes ------------------
#
# The bodies of the blocks relax legalizes GELU (erf or tanh form) and SiLU into; a GEMM epilogue
# tensorizes these blocks (schedules/gemm.py: EPILOGUE_ACTIVATIONS), and so does a standalone
# activation (schedules/activation.py), instead of making one libm call per lane:
# - erf: x P(x^2) / Q(x^2) on x clamped to [-4, 4] (erf(4) is 1 in float32), P and Q of degree 5,
#   Q(0) = 1; no exp, no branch: 2 clamps, 10 FMAs, 2 multiplies and a division per vector. The
#   coefficients are a weighted least-squares fit of erf's relative error (bench/fit_erf.py):
#   2.5e-8 in exact arithmetic, < 4e-7 absolute once evaluated in float32, and relative precision
#   near 0 comes with the form (erf(x) ~ x P(0));
# - tanh, on `_vexp`: (1 - e) / (1 + e) with e = e^(-2|x|), sign of x; |x| < 0.1 by its odd Taylor
#   series to x^5 (the form above loses relative precision there); absolute error < 5e-7
#   against np.tanh (tests/schedules/test_intrinsics.py);
# - sigmoid, on `_vexp`: 1 / (1 + e^-x).
# NaN does not propagate (the clamps turn it into a number), as with the softmax exp.

ACTIVATIONS = ("erf", "tanh", "sigmoid")
_ERF_CLAMP = 4.0
# P(t) = sum P[i] t^i, Q likewise (python -m bench.fit_erf prints them)
_ERF_P = (1.1283791394319225, 0.193543174643546, 0.0531014611655348,
          0.003883254697983378, 0.00028456237721283473, 1.986775816173987e-06)
_ERF_Q = (1.0, 0.5048557291888569, 0.11534918776765365,
          0.015207072172589554, 0.0011855467660172169, 3.7419925979704333e-05)


def _activation(fn: str, x: Expr, lanes: int) -> Expr:
    def bc(c: float) -> tvm.tirx.Broadcast:
        return T.broadcast(T.float32(c), lanes)

    def horner(coefs: tuple[float, ...], t: tvm.tirx.Var) -> Expr:
        poly = bc(coefs[-1])
        for c in coefs[-2::-1]:
            poly = poly * t + bc(c)
        return poly

    if fn == "sigmoid":
        return bc(1.0) / (bc(1.0) + _vexp(bc(0.0) - x, lanes))
    if fn == "erf":
        return _let(T.max(T.min(x, bc(_ERF_CLAMP)), bc(-_ERF_CLAMP)), lambda c: _let(
            c * c, lambda t: c * horner(_ERF_P, t) / horner(_ERF_Q, t)))

    # tanh(|x|) with the sign of x
    def odd(x: tvm.tirx.Var, a: tvm.tirx.Var, a2: tvm.tirx.Var) -> Expr:
        big = _let(_vexp(bc(-2.0) * a, lanes), lambda e: (bc(1.0) - e) / (bc(1.0) + e))
        small = a * (bc(1.0) + a2 * (bc(-1.0 / 3.0) + a2 * bc(2.0 / 15.0)))
        return _let(T.Select(a < bc(0.1), small, big),
                    lambda y: T.Select(x < bc(0.0), bc(0.0) - y, y))

    return _let(x, lambda x: _let(T.max(x, bc(0.0) - x),
                                  lambda a: _let(a * a, lambda a2: odd(x, a, a2))))


def _activation_intrin(fn: str, lanes: int = 16) -> tuple[object, object]:
    vec = f"float32x{lanes}"
    f = getattr(T, fn)

    @T.prim_func(s_tir=True)
    def desc(x_h: T.handle, y_h: T.handle) -> None:
        X = T.match_buffer(x_h, (lanes,), "float32", offset_factor=1)
        Y = T.match_buffer(y_h, (lanes,), "float32", offset_factor=1)
        with T.sblock("root"):
            T.reads(X[0:lanes])
            T.writes(Y[0:lanes])
            for j in T.serial(0, lanes):
                with T.sblock("activation"):
                    vj = T.axis.remap("S", [j])
                    Y[vj] = f(X[vj])

    @T.prim_func(s_tir=True)
    def impl(x_h: T.handle, y_h: T.handle) -> None:
        X = T.match_buffer(x_h, (lanes,), "float32", offset_factor=1)
        Y = T.match_buffer(y_h, (lanes,), "float32", offset_factor=1)
        with T.sblock("root"):
            T.reads(X[0:lanes])
            T.writes(Y[0:lanes])
            Y[T.ramp(T.int32(0), 1, lanes)] = _activation(fn, X.vload([0], vec), lanes)

    return desc, impl


def activation_f32(fn: str, lanes: int = 16) -> str:
    """The intrinsic of `fn` ("erf", "tanh" or "sigmoid") over `lanes` floats: 16, or 8 for rows
    that are a multiple of 8 but not of 16."""
    return f"{fn}_f32x{lanes}"


for _fn in ACTIVATIONS:
    for _lanes in (16, 8):
        _FACTORIES[activation_f32(_fn, _lanes)] = functools.partial(_activation_intrin, _fn,
                                                                    lanes=_lanes)


# --- normalize: Y[l] = E[l] / S[0] as E[l] * (1 / S[0]) ---------------------------------------
#
# The body of topi.nn.softmax's T_softmax_norm block. One scalar division per vector instead of a
# vector division per vector (vdivps is the slowest op of a softmax row); the result differs from
# the division by at most ~1.5 ulp (relative error < 2e-7).

DIV_BCAST_F32 = "div_bcast_recip_f32x{lanes}"  # .format(lanes=16)


def _div_bcast_intrin(lanes: int) -> tuple[object, object]:
    vec = f"float32x{lanes}"

    @T.prim_func(s_tir=True)
    def desc(e_h: T.handle, s_h: T.handle, y_h: T.handle) -> None:
        E = T.match_buffer(e_h, (lanes,), "float32", offset_factor=1)
        S = T.match_buffer(s_h, (1,), "float32", offset_factor=1)
        Y = T.match_buffer(y_h, (lanes,), "float32", offset_factor=1)
        with T.sblock("root"):
            T.reads(E[0:lanes], S[0:1])
            T.writes(Y[0:lanes])
            for j in T.serial(0, lanes):
                with T.sblock("norm"):
                    vj = T.axis.remap("S", [j])
                    Y[vj] = E[vj] / S[0]

    @T.prim_func(s_tir=True)
    def impl(e_h: T.handle, s_h: T.handle, y_h: T.handle) -> None:
        E = T.match_buffer(e_h, (lanes,), "float32", offset_factor=1)
        S = T.match_buffer(s_h, (1,), "float32", offset_factor=1)
        Y = T.match_buffer(y_h, (lanes,), "float32", offset_factor=1)
        with T.sblock("root"):
            T.reads(E[0:lanes], S[0:1])
            T.writes(Y[0:lanes])
            Y[T.ramp(T.int32(0), 1, lanes)] = E.vload([0], vec) * T.broadcast(
                T.float32(1.0) / S[0], lanes)

    return desc, impl


for _lanes in (4, 8, 16):
    _FACTORIES[DIV_BCAST_F32.format(lanes=_lanes)] = functools.partial(_div_bcast_intrin, _lanes)


# --- usdot (AArch64 FEAT_I8MM): C[4] int32 += A[4] uint8 . B[4, 4] int8 (schedules/arm.py) ------

USDOT_INTRIN = "dot_4x4_u8i8s32_usdot"  # accumulator C in "global" scope
USDOT_LOCAL_INTRIN = "dot_4x4_u8i8s32_usdot_local"  # accumulator C in "local" scope (registers)


def _usdot_intrin(acc_scope: str) -> tuple[Any, Any]:
    """C[4] int32 += A[4] uint8 . B[4, 4] int8 (row i of B: output column i's 4 weights) as one
    `usdot Vd.4s, Vn.16b, Vm.16b` (Vn unsigned, Vm signed; LLVM's operand order: acc, u8, s8)."""

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (4,), "uint8", offset_factor=1)
        B = T.match_buffer(b, (4, 4), "int8", offset_factor=1)
        C = T.match_buffer(c, (4,), "int32", offset_factor=1, scope=acc_scope)
        with T.sblock("root"):
            T.reads(C[0:4], A[0:4], B[0:4, 0:4])
            T.writes(C[0:4])
            # one expression: named temporaries would become workspace allocations
            C[T.ramp(T.int32(0), 1, 4)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id("llvm.aarch64.neon.usdot.v4i32.v16i8"),
                C.vload([0], dtype="int32x4"),
                # the 4 bytes of A, broadcast to the 4 lanes (= the 4 output columns)
                T.reinterpret(T.broadcast(T.reinterpret(A.vload([0], "uint8x4"), dtype="int32"), 4),
                              dtype="uint8x16"),
                B.vload([0, 0], dtype="int8x16"),  # 16 contiguous bytes: needs the packing
                dtype="int32x4")

    return dot_u8i8_desc(4, 4, acc_scope), impl


_FACTORIES[USDOT_INTRIN] = lambda: _usdot_intrin("global")
_FACTORIES[USDOT_LOCAL_INTRIN] = lambda: _usdot_intrin("local")

