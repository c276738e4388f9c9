"""Kernels that misbehave on purpose, as TVMScript, for the tests of the measurement sandbox, the
RPC boards and the farm."""

from __future__ import annotations

import textwrap

HEADER = "from tvm.script import tirx as T\n\n@T.prim_func(s_tir=True)\n"

# a data-dependent gather (inputs are uniform in [-1, 1]): indices reach +-1e9, far outside A,
# which no static bounds check can see; the kernel segfaults at run time
CRASH = HEADER + textwrap.dedent('''\
    def main(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for i in range(16):
            with T.sblock("B"):
                vi = T.axis.spatial(16, i)
                B[vi] = A[T.Cast("int32", A[vi] * T.float32(1000000000.0))]
    ''')

# effectively endless (1.6e11 iterations)
HANG = HEADER + textwrap.dedent('''\
    def main(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for i, j, k in T.grid(16, 100000, 100000):
            with T.sblock("B"):
                vi, vj, vk = T.axis.remap("SRR", [i, j, k])
                with T.init():
                    B[vi] = T.float32(0)
                B[vi] = B[vi] + A[vi] * T.float32(1.0000001)
    ''')
