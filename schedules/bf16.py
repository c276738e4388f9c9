"""bf16 GEMMs on x86 with AVX512-BF16 (Zen 4/5, Cooper Lake and later Xeons): `dense-bf16-avx512`.

    Y[M, N] float32 = X[M, K] bf16 . W[N, K]^T bf16       (products and sums in float32)

Matched by structure (`schedules/match.py`, GemmMatch.dtype BF16): the op specs `dense` and
`matmul` with dtype bfloat16, and any PrimFunc whose first block is that GEMM (each operand cast
to float32, C float32) with the weight [N, K] or [K, N], followed by elementwise blocks (bias,
activation, a cast back to bf16), folded into the tile's write-back.

The template is `dense-int8-vnni`'s (schedules/int8.py: the weight packed once by a
layout-rewrite preproc block, a register-blocked micro-kernel of rows x 16-lane accumulators,
k blocking, parallel outer tiles) with the instruction `vdpbf16ps`: each fp32 lane adds two bf16
products, so the weight is packed Wp[N/16, K/2, 16, 2] (each 16x2 tile 32 consecutive bf16, one
zmm) and X's two bf16 of a k step are broadcast as one 32-bit word. Twice fp32 FMA's FLOP per
instruction, half its bytes per operand: `bench/peak.c` built with -mavx512bf16 gives the peak.

The instruction is reached through an LLVM function the kernel imports (the intrinsic
`dot_16x2_bf16_avx512`, schedules/dot_intrinsics.py, says why); the import is a
`pragma_import_llvm` annotation of the k0 loop (not of the root block, which relax's
SplitLayoutRewritePreproc rebuilds without its annotations), so a stored trace carries it and
replays anywhere.
"""

from __future__ import annotations

from schedules.dot_intrinsics import BF16_IMPORT, BF16_16x2_AVX512
from schedules.int8 import PackedDotGemm, packed_dot_knobs
from schedules.match import BF16
from tuner.core.tvm_api import Target, tvm_ffi


def has_avx512_bf16(target: Target) -> bool:
    return bool(tvm_ffi.get_global_func("target.llvm_cpu_has_feature")("avx512bf16", target))


class DenseBF16AVX512(PackedDotGemm):
    name = "dense-bf16-avx512"
    ops = ("dense", "matmul", "tir")
    target = "x86-64 with AVX512-BF16"
    description = ("bfloat16 x bfloat16 -> float32 dense or matmul on AVX512-BF16: weight packed "
                   "once to [N/16, K/2, 16, 2] (layout-rewrite preproc, not timed), "
                   "register-blocked micro-kernel of rows x 16-lane fp32 accumulators tensorized "
                   f"with vdpbf16ps ({BF16_16x2_AVX512}, an imported LLVM function), k blocking, "
                   "parallel outer tiles, an elementwise epilogue per tile. Needs N % 16 == 0 "
                   "and K % 2 == 0.")
    lanes, group, registers, intrin = 16, 2, 32, BF16_16x2_AVX512
    dtype, operands, llvm_import = BF16, "bfloat16 x bfloat16 -> float32", BF16_IMPORT
    KNOBS = packed_dot_knobs(lanes, group, "fp32")

    def _why_not_target(self, target: Target) -> str | None:
        return None if has_avx512_bf16(target) else "the target has no AVX512-BF16"
