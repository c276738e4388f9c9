"""The op registry: `OPS[name] -> OpDef`."""

from __future__ import annotations

from .base import OpDef
from .conv import CONV2D, DEPTHWISE_CONV2D
from .linalg import BATCH_MATMUL, DENSE, DENSE_INT8, MATMUL, SOFTMAX
from .tir import TIR

OPS: dict[str, OpDef] = {
    op.name: op
    for op in (MATMUL, DENSE, BATCH_MATMUL, CONV2D, DEPTHWISE_CONV2D, SOFTMAX, DENSE_INT8, TIR)
}


def describe_ops() -> dict[str, dict]:
    """`{op: OpDef.describe()}` for every op (the REST API's catalogue)."""
    return {name: op.describe() for name, op in OPS.items()}
