from tvm.script import tirx as T

# TVM 0.27's dialect: `tirx` (not `tir`), blocks are `T.sblock`, and a function with blocks is
# declared `@T.prim_func(s_tir=True)`. This one is a GEMM with a ReLU epilogue, 256x256x256:
#   tunefarm spaces --tvmscript bench/example_kernel.py      # gemm-x86 matches (an epilogue)
#   tunefarm tune tir --tvmscript bench/example_kernel.py --trials 32


@T.prim_func(s_tir=True)
def main(A: T.Buffer((256, 256), "float32"), B: T.Buffer((256, 256), "float32"),
         D: T.Buffer((256, 256), "float32")):
    T.func_attr({"global_symbol": "main", "tirx.noalias": True})
    C = T.sblock_alloc_buffer((256, 256), "float32")
    for i, j, k in T.grid(256, 256, 256):
        with T.sblock("C"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]
    for i, j in T.grid(256, 256):
        with T.sblock("D"):
            vi, vj = T.axis.remap("SS", [i, j])
            D[vi, vj] = T.max(C[vi, vj], T.float32(0))
