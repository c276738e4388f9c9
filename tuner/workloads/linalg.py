"""Matrix ops and softmax: matmul, dense, batch_matmul, dense_int8, softmax.

References are numpy, computed in float64 (int64 for int8) and cast to the output dtype, so they
do not share code or rounding with TVM.

matmul and dense also take dtype "bfloat16": bf16 inputs, products and sums in float32, a float32
output (as a bf16 matrix unit or `vdpbf16ps` computes them; the inputs are exact in float64).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.errors import SpecError
from .base import FLOAT_DTYPES, ArgSpec, OpDef, float_tolerance, integer_tolerance

GEMM_DTYPES = (*FLOAT_DTYPES, "bfloat16")


def _f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def _out(dtype: str) -> str:
    """The output (and accumulation) dtype of a GEMM of `dtype` inputs."""
    return "float32" if dtype == "bfloat16" else dtype


# --- matmul: A[M,K] x B[K,N] -> C[M,N] ----------------------------------------------------------


def _matmul_args(spec: dict[str, Any]) -> list[ArgSpec]:
    m, n, k = spec["shape"]
    dt = spec["dtype"]
    return [("A", (m, k), dt), ("B", (k, n), dt), ("C", (m, n), _out(dt))]


def _matmul_compute(spec: dict[str, Any]) -> list[Any]:
    from ..core.tvm_api import te

    m, n, k = spec["shape"]
    dt = spec["dtype"]
    a = te.placeholder((m, k), dt, name="A")
    b = te.placeholder((k, n), dt, name="B")
    r = te.reduce_axis((0, k), name="k")
    # B is the weight (a model constant): layout-free, so a schedule may pack it at compile time,
    # as topi marks dense's and batch_matmul's weights
    if dt == "bfloat16":
        c = te.compute((m, n), lambda i, j: te.sum(
            a[i, r].astype("float32") * b[r, j].astype("float32"), axis=r), name="C",
            attrs={"layout_free_placeholders": [b]})
    else:
        c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C",
                       attrs={"layout_free_placeholders": [b]})
    return [a, b, c]


def _matmul_ref(spec: dict[str, Any], inputs: list[np.ndarray]) -> list[np.ndarray]:
    a, b = inputs
    return [(_f64(a) @ _f64(b)).astype(_out(spec["dtype"]))]


def _mnk_flops(spec: dict[str, Any]) -> int:
    m, n, k = spec["shape"]
    return 2 * m * n * k


def _k_tolerance(spec: dict[str, Any]) -> tuple[float, float]:
    return float_tolerance(_out(spec["dtype"]), spec["shape"][-1])


MATMUL = OpDef(
    name="matmul", shape_doc="M,N,K: A[M,K] x B[K,N] -> C[M,N]", shape_names=("M", "N", "K"),
    default_dtype="float32", dtypes=GEMM_DTYPES,
    doc="Matrix multiply C = A @ B with B a constant weight (layout-free: a schedule may pack it "
        "at compile time); accumulates in the input dtype (bfloat16: in float32, C float32).",
    inputs_doc=("A[M,K]", "B[K,N]"), outputs_doc=("C[M,N]",),
    args=_matmul_args, compute=_matmul_compute, reference=_matmul_ref, flops=_mnk_flops,
    tolerance=_k_tolerance,
)


# --- dense: X[M,K] x W[N,K]^T -> Y[M,N] ---------------------------------------------------------


def _dense_args(spec: dict[str, Any]) -> list[ArgSpec]:
    m, n, k = spec["shape"]
    dt = spec["dtype"]
    return [("X", (m, k), dt), ("W", (n, k), dt), ("Y", (m, n), _out(dt))]


def _dense_compute(spec: dict[str, Any]) -> list[Any]:
    from ..core.tvm_api import te, topi

    m, n, k = spec["shape"]
    dt = spec["dtype"]
    x = te.placeholder((m, k), dt, name="X")
    w = te.placeholder((n, k), dt, name="W")
    return [x, w, topi.nn.dense(x, w, out_dtype=_out(dt))]


def _dense_ref(spec: dict[str, Any], inputs: list[np.ndarray]) -> list[np.ndarray]:
    x, w = inputs
    return [(_f64(x) @ _f64(w).T).astype(_out(spec["dtype"]))]


DENSE = OpDef(
    name="dense", shape_doc="M,N,K: X[M,K] x W[N,K]^T -> Y[M,N]", shape_names=("M", "N", "K"),
    default_dtype="float32", dtypes=GEMM_DTYPES,
    doc="Fully connected layer without bias (topi.nn.dense): Y = X @ W.T (bfloat16: products "
        "and sums in float32, Y float32).",
    inputs_doc=("X[M,K]", "W[N,K]"), outputs_doc=("Y[M,N]",),
    args=_dense_args, compute=_dense_compute, reference=_dense_ref, flops=_mnk_flops,
    tolerance=_k_tolerance,
)


# --- batch_matmul (NT): A[B,M,K] x B[B,N,K]^T -> C[B,M,N] ---------------------------------------


def _bmm_args(spec: dict[str, Any]) -> list[ArgSpec]:
    b, m, n, k = spec["shape"]
    dt = spec["dtype"]
    return [("A", (b, m, k), dt), ("B", (b, n, k), dt), ("C", (b, m, n), dt)]


def _bmm_compute(spec: dict[str, Any]) -> list[Any]:
    from ..core.tvm_api import te, topi

    b, m, n, k = spec["shape"]
    dt = spec["dtype"]
    x = te.placeholder((b, m, k), dt, name="A")
    y = te.placeholder((b, n, k), dt, name="B")
    return [x, y, topi.nn.batch_matmul(x, y, out_dtype=dt)]


def _bmm_ref(spec: dict[str, Any], inputs: list[np.ndarray]) -> list[np.ndarray]:
    a, b = inputs
    return [np.matmul(_f64(a), _f64(b).transpose(0, 2, 1)).astype(spec["dtype"])]


def _bmm_flops(spec: dict[str, Any]) -> int:
    b, m, n, k = spec["shape"]
    return 2 * b * m * n * k


BATCH_MATMUL = OpDef(
    name="batch_matmul", shape_doc="B,M,N,K: A[B,M,K] x B[B,N,K]^T -> C[B,M,N]",
    shape_names=("B", "M", "N", "K"), default_dtype="float32", dtypes=FLOAT_DTYPES,
    doc="Batched matmul with the second operand transposed (NT, topi.nn.batch_matmul).",
    inputs_doc=("A[B,M,K]", "B[B,N,K]"), outputs_doc=("C[B,M,N]",),
    args=_bmm_args, compute=_bmm_compute, reference=_bmm_ref, flops=_bmm_flops,
    tolerance=_k_tolerance,
)


# --- dense_int8: X[M,K] uint8 x W[N,K]^T int8 -> Y[M,N] int32 -----------------------------------

INT8_MAX_K = (2**31 - 1) // (255 * 128)  # largest K whose sum cannot overflow int32


def _dense_int8_check(spec: dict[str, Any]) -> None:
    k = spec["shape"][2]
    if k > INT8_MAX_K:
        raise SpecError(f"K={k} can overflow the int32 accumulator (255*128*K > 2^31-1); "
                        f"K must be <= {INT8_MAX_K}", field="shape[2]")


def _dense_int8_args(spec: dict[str, Any]) -> list[ArgSpec]:
    m, n, k = spec["shape"]
    return [("X", (m, k), "uint8"), ("W", (n, k), "int8"), ("Y", (m, n), "int32")]


def _dense_int8_compute(spec: dict[str, Any]) -> list[Any]:
    from ..core.tvm_api import te, topi

    m, n, k = spec["shape"]
    x = te.placeholder((m, k), "uint8", name="X")
    w = te.placeholder((n, k), "int8", name="W")
    return [x, w, topi.nn.dense(x, w, out_dtype="int32")]


def _dense_int8_ref(spec: dict[str, Any], inputs: list[np.ndarray]) -> list[np.ndarray]:
    x, w = inputs
    return [(x.astype(np.int64) @ w.astype(np.int64).T).astype(np.int32)]


DENSE_INT8 = OpDef(
    name="dense_int8", shape_doc="M,N,K: X[M,K] uint8 x W[N,K]^T int8 -> Y[M,N] int32",
    shape_names=("M", "N", "K"), default_dtype="int8", dtypes=("int8",),
    doc="Quantized dense: uint8 activations times int8 weights, int32 accumulation "
        "(topi.nn.dense(X, W, out_dtype='int32')). dtype is fixed ('int8'); checked exactly. "
        "flops counts integer multiply-adds (2*M*N*K).",
    inputs_doc=("X[M,K] uint8", "W[N,K] int8"), outputs_doc=("Y[M,N] int32",),
    args=_dense_int8_args, compute=_dense_int8_compute, reference=_dense_int8_ref,
    flops=_mnk_flops, tolerance=lambda spec: integer_tolerance(), check=_dense_int8_check,
)


# --- softmax over the last axis -----------------------------------------------------------------


def _softmax_args(spec: dict[str, Any]) -> list[ArgSpec]:
    rows, cols = spec["shape"]
    dt = spec["dtype"]
    return [("x", (rows, cols), dt), ("y", (rows, cols), dt)]


def _softmax_compute(spec: dict[str, Any]) -> list[Any]:
    from ..core.tvm_api import te, topi

    x = te.placeholder(tuple(spec["shape"]), spec["dtype"], name="x")
    return [x, topi.nn.softmax(x, axis=-1)]


def _softmax_ref(spec: dict[str, Any], inputs: list[np.ndarray]) -> list[np.ndarray]:
    x = _f64(inputs[0])
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return [(e / e.sum(axis=-1, keepdims=True)).astype(spec["dtype"])]


def _softmax_flops(spec: dict[str, Any]) -> int:
    rows, cols = spec["shape"]
    return 5 * rows * cols  # max, subtract, exp, sum, divide


def _softmax_tolerance(spec: dict[str, Any]) -> tuple[float, float]:
    # outputs lie within a factor e^2 of 1/cols (inputs in [-1, 1]): the relative error decides
    rtol = 1e-9 if spec["dtype"] == "float64" else 1e-4
    return rtol, rtol * 1e-2 / spec["shape"][1]


SOFTMAX = OpDef(
    name="softmax", shape_doc="rows,cols: softmax of x[rows,cols] over cols -> y[rows,cols]",
    shape_names=("rows", "cols"), default_dtype="float32", dtypes=("float32", "float64"),
    doc="Softmax over the last axis (topi.nn.softmax). flops counts 5 ops per element. "
        "float16 is not offered: its sum over a long row loses all precision.",
    inputs_doc=("x[rows,cols]",), outputs_doc=("y[rows,cols]",),
    args=_softmax_args, compute=_softmax_compute, reference=_softmax_ref, flops=_softmax_flops,
    tolerance=_softmax_tolerance,
)
