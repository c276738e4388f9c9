"""Two small PrimFuncs, as the tasks of a model job (`POST /v1/models`, `tuner.db.model_jobs`)."""

from __future__ import annotations

import textwrap

from tests.kernels import HEADER

MATMUL = HEADER + textwrap.dedent('''\
    def main(A: T.Buffer((16, 16), "float32"), B: T.Buffer((16, 16), "float32"),
             C: T.Buffer((16, 16), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for i, j, k in T.grid(16, 16, 16):
            with T.sblock("C"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    C[vi, vj] = T.float32(0)
                C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]
    ''')

RELU = HEADER + textwrap.dedent('''\
    def main(A: T.Buffer((16, 32), "float32"), B: T.Buffer((16, 32), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for i, j in T.grid(16, 32):
            with T.sblock("B"):
                vi, vj = T.axis.remap("SS", [i, j])
                B[vi, vj] = T.max(A[vi, vj], T.float32(0))
    ''')

TASKS = [{"name": "fused_matmul", "weight": 2, "tvmscript": MATMUL},
         {"name": "relu", "weight": 1, "tvmscript": RELU}]
