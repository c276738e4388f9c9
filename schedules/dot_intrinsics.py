"""Dot-product intrinsics of the packed GEMM templates on x86 (`schedules/int8.py`,
`schedules/bf16.py`): one vector instruction multiplies a broadcast group of A by a packed
[lanes, group] tile of the weight and adds each lane's group of products into its accumulator.

    dot_16x4_vnni_llvm22   C[16] int32 += A[4] uint8 . B[16, 4] int8      vpdpbusd (AVX512-VNNI)
    dot_8x2_u8i8s32_avx2   C[8] int32 += A[2] uint8 . B[8, 2] int8        vpmaddwd (AVX2)
    dot_16x2_bf16_avx512   C[16] float32 += A[2] bf16 . B[16, 2] bf16     vdpbf16ps (AVX512-BF16)

`schedules/intrinsics.py` registers them by name (`use`, `register_for_trace`) like its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from schedules.polynomial import pin_source
from tuner.core.tvm_api import PrimFunc, tvm

T = tvm.script.tirx  # `from tvm.script import tirx as T`, without importing tvm here
pin_source(__file__)

# name -> () -> (description, implementation) PrimFuncs
DOT_FACTORIES: dict[str, Callable[[], tuple[Any, Any]]] = {}


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


def dot_u8i8_desc(lanes: int, group: int, scope: str = "global") -> PrimFunc:
    """The description the int8 dot-product intrinsics share: C[lanes] int32 (in `scope`) +=
    A[group] uint8 . B[lanes, group] int8, lane i taking row i of B."""

    @T.prim_func(s_tir=True)
    def desc(a_h: T.handle, b_h: T.handle, c_h: T.handle) -> None:
        A = T.match_buffer(a_h, (group,), "uint8", offset_factor=1)
        B = T.match_buffer(b_h, (lanes, group), "int8", offset_factor=1)
        C = T.match_buffer(c_h, (lanes,), "int32", offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:group], B[0:lanes, 0:group])
            T.writes(C[0:lanes])
            for i in T.serial(0, lanes):
                for k in T.serial(0, group):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vi, vk], "int32")

    return desc


def _vnni_intrin() -> tuple[Any, Any]:
    @T.prim_func(s_tir=True)
    def impl(a_h: T.handle, b_h: T.handle, c_h: T.handle) -> None:
        A = T.match_buffer(a_h, (4,), "uint8", offset_factor=1)
        B = T.match_buffer(b_h, (16, 4), "int8", offset_factor=1)
        C = T.match_buffer(c_h, (16,), "int32", offset_factor=1)
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

    return dot_u8i8_desc(16, 4), impl


DOT_FACTORIES[VNNI_16x4_LLVM22] = _vnni_intrin


# --- AVX2: C[8] int32 += A[2] uint8 . B[8, 2] int8, exactly (one vpmaddwd on 256-bit registers) --
#
# Without VNNI the u8 x i8 products are widened to int16 first: vpmaddwd multiplies 16 int16
# pairs and adds each pair into an int32 lane, exact for u8 x i8 (|a*b| <= 32640). vpmaddubsw
# (u8 x i8 straight to int16 pair sums) would be one step shorter but saturates: 255*127*2 does
# not fit int16. Lane i of C takes B[i, 0:2], so B must be 16 CONSECUTIVE bytes, the weight
# packed [N/8, K/2, 8, 2] (schedules/int8.py); A's two bytes are broadcast to the 8 lanes.

PMADDWD_8x2_AVX2 = "dot_8x2_u8i8s32_avx2"


def _pmaddwd_intrin() -> tuple[Any, Any]:
    @T.prim_func(s_tir=True)
    def impl(a_h: T.handle, b_h: T.handle, c_h: T.handle) -> None:
        A = T.match_buffer(a_h, (2,), "uint8", offset_factor=1)
        B = T.match_buffer(b_h, (8, 2), "int8", offset_factor=1)
        C = T.match_buffer(c_h, (8,), "int32", offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:8], A[0:2], B[0:8, 0:2])
            T.writes(C[0:8])
            # one expression: named temporaries would become workspace allocations
            C[T.ramp(T.int32(0), 1, 8)] = C.vload([0], dtype="int32x8") + T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id("llvm.x86.avx2.pmadd.wd"),
                # A's 2 bytes as 2 int16 (one int32), broadcast to the 8 lanes
                T.reinterpret(T.broadcast(T.reinterpret(T.Cast("int16x2", A.vload([0], "uint8x2")),
                                                        dtype="int32"), 8), dtype="int16x16"),
                T.Cast("int16x16", B.vload([0, 0], dtype="int8x16")),
                dtype="int32x8")

    return dot_u8i8_desc(8, 2), impl


DOT_FACTORIES[PMADDWD_8x2_AVX2] = _pmaddwd_intrin


# --- AVX512-BF16: C[16] float32 += A[2] bf16 . B[16, 2] bf16 (one vdpbf16ps) ------------------
#
# vdpbf16ps adds to each fp32 lane i the two products A[0]*B[i, 0] + A[1]*B[i, 1] (bf16 inputs,
# exact products, fp32 sums; denormal inputs and results flushed to zero). LLVM 22 declares it
# on <32 x bfloat> operands, a type no TVM expression has: TVM's BF16ComputeLegalize widens every
# bf16 value a call takes to float32, and BF16StorageLegalize stores bf16 as uint16. So:
# - A's two bf16 and B's 32 are loaded by TVM and reinterpreted as int32 (a `reinterpret` is the
#   one call the legalizer leaves alone): an i32 broadcast to 16 lanes, and <16 x i32>;
# - the call goes through a small LLVM function imported into the kernel (`BF16_IMPORT`, by the
#   template's `pragma_import_llvm` annotation of a loop; LLVM inlines it) that bitcasts those to
#   <32 x bfloat> and calls the instruction;
# - the function also takes A's and B's data pointers, unused: an opaque use of a buffer keeps
#   BF16ComputeLegalize from turning an internal bf16 buffer (the packed weight, when the packing
#   runs inside the program) into a float32 one, which the reinterpret would misread.
# The loads are TVM's (with its alias information), so LLVM keeps the rows x vectors
# accumulators in registers across k; loading through pointers inside the LLVM function instead
# made it store every accumulator after every step (it could not prove C apart from A and B).
#
# TRAP (as for VNNI): B's tile is read as 32 CONSECUTIVE bf16; the weight must be packed
# [N/16, K/2, 16, 2] (schedules/bf16.py).

BF16_16x2_AVX512 = "dot_16x2_bf16_avx512"
BF16_CALL = "tunefarm_dpbf16ps_16x2"
BF16_IMPORT = f"""
define <16 x float> @{BF16_CALL}(<16 x float> %c, <16 x i32> %a, <16 x i32> %b, ptr %a_data,
                                 ptr %b_data) alwaysinline {{
  %a_bf16 = bitcast <16 x i32> %a to <32 x bfloat>
  %b_bf16 = bitcast <16 x i32> %b to <32 x bfloat>
  %r = call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> %c, <32 x bfloat> %a_bf16,
                                                            <32 x bfloat> %b_bf16)
  ret <16 x float> %r
}}
declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)
"""


def _bf16_intrin() -> tuple[Any, Any]:
    @T.prim_func(s_tir=True)
    def desc(a_h: T.handle, b_h: T.handle, c_h: T.handle) -> None:
        A = T.match_buffer(a_h, (2,), "bfloat16", offset_factor=1)
        B = T.match_buffer(b_h, (16, 2), "bfloat16", offset_factor=1)
        C = T.match_buffer(c_h, (16,), "float32", offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:16], A[0:2], B[0:16, 0:2])
            T.writes(C[0:16])
            for i in T.serial(0, 16):
                for k in T.serial(0, 2):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.Cast("float32", A[vk]) * T.Cast("float32", B[vi, vk])

    @T.prim_func(s_tir=True)
    def impl(a_h: T.handle, b_h: T.handle, c_h: T.handle) -> None:
        A = T.match_buffer(a_h, (2,), "bfloat16", offset_factor=1)
        B = T.match_buffer(b_h, (16, 2), "bfloat16", offset_factor=1)
        C = T.match_buffer(c_h, (16,), "float32", offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:16], A[0:2], B[0:16, 0:2])
            T.writes(C[0:16])
            C[T.ramp(T.int32(0), 1, 16)] = T.call_pure_extern(
                "float32x16", BF16_CALL, C.vload([0], dtype="float32x16"),
                T.broadcast(T.reinterpret(A.vload([0], "bfloat16x2"), dtype="int32"), 16),
                T.reinterpret(B.vload([0, 0], dtype="bfloat16x32"), dtype="int32x16"),
                A.data, B.data)

    return desc, impl


DOT_FACTORIES[BF16_16x2_AVX512] = _bf16_intrin
