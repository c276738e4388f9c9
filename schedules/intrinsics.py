"""Tensor intrinsics tunefarm's templates tensorize with, registered on import.

Workers import this module before replaying traces, so a record that tensorizes with one of
these intrinsics replays anywhere. (TVM's own registry is loaded lazily, see tuner.tvm_api.)

TVMScript needs the source file, so the intrinsics live here; importing costs two TVMScript
parses (a few ms) on top of `import tvm`.
"""

from __future__ import annotations

from tuner.tvm_api import tvm

T = tvm.script.tirx  # `from tvm.script import tirx as T`, without importing tvm here
TensorIntrin = tvm.s_tir.TensorIntrin

# --- VNNI: C[16] int32 += A[4] uint8 . B[16, 4] int8 (one vpdpbusd on 512-bit registers) -------
#
# TVM's own `dot_16x4_vnni` passes <16 x i32> operands to llvm.x86.avx512.vpdpbusd.512, which
# since LLVM 21 takes (<16 x i32>, <64 x i8>, <64 x i8>): it fails to compile with the LLVM 22 in
# the 0.27 wheel. This variant reinterprets the operands as u8x64 / i8x64 (TVM_NOTES §4b).
#
# TRAP: the implementation loads B as 64 CONSECUTIVE bytes, and `tensorize` does not check that
# the matched 16x4 tile is contiguous. Tensorizing a plain [N, K] weight compiles and gives wrong
# results; the weight must be packed [N/16, K/4, 16, 4] (see schedules/int8.py).

VNNI_16x4_LLVM22 = "dot_16x4_vnni_llvm22"


@T.prim_func(s_tir=True)
def dot_16x4_u8i8i32_desc(
    A: T.Buffer((4,), "uint8", offset_factor=1),
    B: T.Buffer((16, 4), "int8", offset_factor=1),
    C: T.Buffer((16,), "int32", offset_factor=1),
) -> None:
    with T.sblock("root"):
        T.reads(C[0:16], A[0:4], B[0:16, 0:4])
        T.writes(C[0:16])
        for i in T.serial(0, 16):
            for k in T.serial(0, 4):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vi, vk], "int32")


@T.prim_func(s_tir=True)
def dot_16x4_u8i8i32_vnni_llvm22(
    A: T.Buffer((4,), "uint8", offset_factor=1),
    B: T.Buffer((16, 4), "int8", offset_factor=1),
    C: T.Buffer((16,), "int32", offset_factor=1),
) -> None:
    with T.sblock("root"):
        T.reads(C[0:16], A[0:4], B[0:16, 0:4])
        T.writes(C[0:16])
        A_i32 = T.reinterpret(A.vload([0], "uint8x4"), dtype="int32")  # 4 x u8 -> one i32
        A_u8x64 = T.reinterpret(T.broadcast(A_i32, 16), dtype="uint8x64")  # ... to 16 lanes
        B_i8x64 = B.vload([0, 0], dtype="int8x64")
        C_i32x16 = C.vload([0], dtype="int32x16")
        C[T.ramp(T.int32(0), 1, 16)] = T.call_llvm_pure_intrin(
            T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"),
            C_i32x16, A_u8x64, B_i8x64, dtype="int32x16")


TensorIntrin.register(VNNI_16x4_LLVM22, dot_16x4_u8i8i32_desc, dot_16x4_u8i8i32_vnni_llvm22,
                      override=True)
