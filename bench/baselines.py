"""PyTorch (CPU) and numpy implementations of the suite's ops, the natural call for each.

Each factory takes the workload and its numpy inputs and returns (fn, note) where `fn()` computes
the output (returned as an array or tensor), or None with a reason when the library has no such
op. Inputs are converted once, outside the timed calls; `out=` is used where the library offers
it (numpy.matmul, torch.matmul), as the TVM kernels also write into preallocated outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

Factory = tuple[Callable[[], Any] | None, str]


def numpy_impl(wl: Any, inputs: list[np.ndarray]) -> Factory:
    op, spec = wl.op, wl.spec
    if spec.get("dtype") == "bfloat16":
        return None, "numpy has no bf16 arithmetic (ml_dtypes' bf16 is a storage type)"
    if op == "matmul":
        a, b = inputs
        c = np.empty((a.shape[0], b.shape[1]), a.dtype)
        return (lambda: np.matmul(a, b, out=c)), "np.matmul(A, B, out=C)"
    if op == "dense":
        x, w = inputs
        y = np.empty((x.shape[0], w.shape[0]), x.dtype)
        return (lambda: np.matmul(x, w.T, out=y)), "np.matmul(X, W.T, out=Y)"
    if op == "batch_matmul":
        a, b = inputs
        c = np.empty((a.shape[0], a.shape[1], b.shape[1]), a.dtype)
        bt = b.transpose(0, 2, 1)
        return (lambda: np.matmul(a, bt, out=c)), "np.matmul(A, B.transpose(0,2,1), out=C)"
    if op == "dense_int8":
        x, w = inputs
        y = np.empty((x.shape[0], w.shape[0]), np.int32)
        return ((lambda: np.matmul(x, w.T, dtype=np.int32, out=y)),
                "np.matmul(X, W.T, dtype=int32): no BLAS for integers")
    if op == "softmax":
        (x,) = inputs

        def softmax() -> np.ndarray:
            e = np.exp(x - x.max(axis=-1, keepdims=True))
            e /= e.sum(axis=-1, keepdims=True)
            return e

        return softmax, "exp(x - max) / sum, in the input dtype"
    if op in ("conv2d", "depthwise_conv2d"):
        return None, "numpy has no convolution"
    return None, f"no numpy implementation of {op} ({spec.get('op')})"


def torch_impl(wl: Any, inputs: list[np.ndarray], torch: Any,
               model: dict[str, Any] | None = None) -> Factory:
    import torch.nn.functional as F

    if model is not None:  # a relax task of the fused suite: the model's op sequence
        from .fused import torch_fn

        return torch_fn(model, inputs, torch)
    op, spec = wl.op, wl.spec
    t = [tensor(a, torch) for a in inputs]
    if spec.get("dtype") == "bfloat16":  # oneDNN's bf16 GEMM; its output is bf16
        if op == "matmul":
            a, b = t
            return (lambda: torch.matmul(a, b)), "torch.matmul(A, B) in bf16 (a bf16 output)"
        if op == "dense":
            x, w = t
            return (lambda: F.linear(x, w)), "F.linear(X, W) in bf16 (a bf16 output)"
    if op == "matmul":
        a, b = t
        c = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype)
        return (lambda: torch.matmul(a, b, out=c)), "torch.matmul(A, B, out=C)"
    if op == "dense":
        x, w = t
        return (lambda: F.linear(x, w)), "torch.nn.functional.linear(X, W)"
    if op == "batch_matmul":
        a, b = t
        bt = b.transpose(1, 2)
        return (lambda: torch.bmm(a, bt)), "torch.bmm(A, B.transpose(1, 2))"
    if op in ("conv2d", "depthwise_conv2d"):
        if spec.get("layout", "NCHW") != "NCHW":
            return None, f"layout {spec['layout']}: only NCHW is compared"
        d, k = t
        groups = d.shape[1] if op == "depthwise_conv2d" else 1
        kw = {"stride": tuple(spec["stride"]), "padding": tuple(spec["padding"]),
              "dilation": tuple(spec["dilation"]), "groups": groups}
        name = "F.conv2d" + (f"(groups={groups})" if groups > 1 else "")
        return (lambda: F.conv2d(d, k, **kw)), name
    if op == "dense_int8":
        return _torch_int8(t, torch)
    if op == "softmax":
        (x,) = t
        return (lambda: torch.softmax(x, dim=-1)), "torch.softmax(x, dim=-1)"
    return None, f"no PyTorch implementation of {op}"


def torch_tolerance(wl: Any) -> tuple[float, float] | None:
    """The check of PyTorch's output where it is not the workload's: a bf16 GEMM's output is
    bf16 in PyTorch (one rounding of the float32 sums), float32 in tunefarm's op spec."""
    from tuner.workloads.base import float_tolerance

    if wl.spec.get("dtype") == "bfloat16" and wl.op in ("matmul", "dense"):
        return float_tolerance("bfloat16", wl.spec["shape"][-1])
    return None


def tensor(a: np.ndarray, torch: Any) -> Any:
    """A numpy array as a CPU tensor of PyTorch's own memory (an ml_dtypes bfloat16 array by its
    bits: torch does not read ml_dtypes' dtype). Copied, not shared: numpy's buffers are 16-byte
    aligned, torch's 64, and oneDNN's AMX GEMM ran 2x slower on the numpy buffers (bf16 1024³
    on a Sapphire Rapids: 3.10 against 1.58 ms, the same data cloned)."""
    a = np.ascontiguousarray(a)
    if a.dtype == np.dtype("bfloat16"):
        return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16).clone()
    return torch.from_numpy(a).clone()


def _torch_int8(t: list[Any], torch: Any) -> Factory:
    """u8 x s8 -> s32, exactly. torch 2.13's `torch._int_mm` accepts a uint8 left operand on CPU
    (oneDNN u8s8s32). If it refuses, use s8 x s8 on X-128 plus the weight compensation
    128*sum_k W[n,k] (precomputed once, like packed weights), which is also exact."""
    x, w = t
    wt = w.t()
    try:
        torch._int_mm(x, wt)  # probe: raises where uint8 is not supported
        return (lambda: torch._int_mm(x, wt)), "torch._int_mm(X_u8, W.t()) -> int32"
    except (RuntimeError, TypeError):
        pass
    comp = 128 * w.to(torch.int32).sum(dim=1)

    def shifted() -> Any:
        return torch._int_mm((x.to(torch.int16) - 128).to(torch.int8), wt) + comp

    return shifted, "torch._int_mm(X_u8 - 128 as int8, W.t()) + 128*rowsum(W)"
