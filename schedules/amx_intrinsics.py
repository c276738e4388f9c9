"""AMX micro-kernels of `schedules/amx.py`: a block of MR x NR accumulator tiles, kept in tile
registers over a chunk of K, as one tensor intrinsic per (operands, MR, NR, chunk).

    amx_bf16_{MR}x{NR}_k{KC}  C[16MR, 16NR] float32 += A[16MR, KC] bf16 . Bp[NR, KC/2, 16, 2] bf16
    amx_int8_{MR}x{NR}_k{KC}  C[16MR, 16NR] int32 += A[16MR, KC] uint8 . Bp[NR, KC/4, 16, 4] int8

An AMX tile register holds 16 rows of 64 bytes; `tdpbf16ps` (`tdpbusd` for u8 x s8) adds the
product of an A tile (16 rows x 64 bytes of K) and a B tile (16 rows of K pairs (quads) x 16
columns: the weight packed [N/16, K/g, 16, g], the layout of the AVX-512 templates, where one
tile's 16 rows are 1,024 contiguous bytes) to a 16 x 16 32-bit C tile. With 8 tile registers the
largest block is 2 x 2: four C tiles, two A tiles and two B tiles per step of K.

The accumulators must stay in tile registers across K, which no TVM expression can say (a tile
is not a vector). So the intrinsic is a call of an LLVM function (`kernel_ir`, imported into the
kernel's module by a `pragma_import_llvm` attribute around the call itself: every call brings
what it calls, in an op's kernel and in a relax model's library alike) that loads the C tiles,
runs the whole chunk's loop over K with x86_amx values, and stores them; LLVM's tile passes
insert the tile configuration (`ldtilecfg`) on entry. The function asks the kernel for the tile
state itself, once per process (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: without
it the first tile instruction faults), so a built library needs nothing from its host process.

Buffers are passed as data pointer, element offset and row stride: `tvm_access_ptr` of a bf16
buffer does not survive TVM's bf16 legalization (stored as uint16, its type annotation widened to
float32). The desc indexes the packed weight as the workload does after `pack_weight`
(`Bp[j // 16, k // g, j % 16, k % g]`), so tensorize matches the packed GEMM block directly.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from schedules.polynomial import pin_source
from tuner.core.tvm_api import Expr, tvm

T = tvm.script.tirx  # `from tvm.script import tirx as T`, without importing tvm here
pin_source(__file__)

# operands -> (A dtype, B dtype, C dtype, K elements per 64-byte tile row, tile instruction)
KINDS = {"bf16": ("bfloat16", "bfloat16", "float32", 32, "tdpbf16ps"),
         "int8": ("uint8", "int8", "int32", 64, "tdpbusd")}
MICRO = ((2, 2), (2, 1), (1, 2), (1, 1))  # MR x NR tiles of C, largest first
MAX_CHUNK = 4096  # K elements per call, at most


def intrin_name(kind: str, mr: int, nr: int, chunk: int, packed_a: bool = False) -> str:
    return f"amx_{kind}_{mr}x{nr}_k{chunk}" + ("_pa" if packed_a else "")


def kernel_name(kind: str, mr: int, nr: int) -> str:
    return f"tunefarm_amx_{kind}_{mr}x{nr}"


def kernel_ir(kind: str, mr: int, nr: int) -> str:
    """LLVM IR of `kernel_name(kind, mr, nr)`(c, c_offset, c_stride, a, ..., b, ..., steps):
    C[16mr, 16nr] += A . Bp over `steps` tile steps of K, in tile registers. TVM imports it
    always-inline and available-externally: each call is inlined, so a call must match its
    signature exactly (i32 offsets and strides, whatever the PrimFunc's index type; an i32
    result, as `call_extern("int32")` declares it), else LLVM keeps the call and drops the
    body ("undefined symbol" when the library loads)."""
    a_bytes = 2 if kind == "bf16" else 1
    c_ty = "float" if kind == "bf16" else "i32"
    op = KINDS[kind][4]
    tiles = [(i, j) for i in range(mr) for j in range(nr)]
    lines = [
        "@tunefarm_amx_granted = weak global i8 0",
        f"define i32 @{kernel_name(kind, mr, nr)}(ptr %c0, i32 %oc32, i32 %sc32, "
        "ptr %a0, i32 %oa32, i32 %sa32, i32 %sa_step32, i32 %sa_tile32, ptr %b0, i32 %ob32, "
        "i32 %sb32, i32 %steps32) {",
        "entry:",
        *(f"  %{v} = sext i32 %{v}32 to i64" for v in
          ("oc", "sc", "oa", "sa", "sa_step", "sa_tile", "ob", "sb", "steps")),
        f"  %c = getelementptr {c_ty}, ptr %c0, i64 %oc",
        f"  %a = getelementptr i{8 * a_bytes}, ptr %a0, i64 %oa",
        f"  %b = getelementptr i{8 * a_bytes}, ptr %b0, i64 %ob",
        "  %ldc = mul i64 %sc, 4",
        f"  %lda = mul i64 %sa, {a_bytes}",
        f"  %astep = mul i64 %sa_step, {a_bytes}",
        f"  %atile = mul i64 %sa_tile, {a_bytes}",
        f"  %ldb = mul i64 %sb, {a_bytes}",  # bytes from one 16-column block of Bp to the next
        "  %granted = load atomic i8, ptr @tunefarm_amx_granted monotonic, align 1",
        "  %ok = icmp ne i8 %granted, 0",
        "  br i1 %ok, label %go, label %grant",
        "grant:",  # arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): syscall 158
        '  %r = call i64 asm sideeffect "syscall", "={rax},{rax},{rdi},{rsi},~{rcx},~{r11},'
        '~{memory}"(i64 158, i64 4131, i64 18)',
        "  store atomic i8 1, ptr @tunefarm_amx_granted monotonic, align 1",
        "  br label %go",
        "go:",
    ]
    for i in range(mr):
        lines += [f"  %ra{i} = mul i64 %atile, {i}",
                  f"  %pa{i} = getelementptr i8, ptr %a, i64 %ra{i}"]
    for j in range(nr):
        lines += [f"  %rb{j} = mul i64 %ldb, {j}",
                  f"  %pb{j} = getelementptr i8, ptr %b, i64 %rb{j}"]
    for i, j in tiles:
        lines += [f"  %rc{i}{j} = mul i64 %ldc, {16 * i}",
                  f"  %oc{i}{j} = add i64 %rc{i}{j}, {64 * j}",
                  f"  %pc{i}{j} = getelementptr i8, ptr %c, i64 %oc{i}{j}",
                  f"  %c{i}{j} = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 64, "
                  f"ptr %pc{i}{j}, i64 %ldc)"]
    lines += ["  br label %loop", "loop:", "  %kk = phi i64 [0, %go], [%kn, %loop]"]
    lines += [f"  %acc{i}{j} = phi x86_amx [%c{i}{j}, %go], [%n{i}{j}, %loop]" for i, j in tiles]
    lines += ["  %ka = mul i64 %kk, %astep", "  %kb = mul i64 %kk, 1024"]
    for i in range(mr):
        lines += [f"  %qa{i} = getelementptr i8, ptr %pa{i}, i64 %ka",
                  f"  %ta{i} = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 64, "
                  f"ptr %qa{i}, i64 %lda)"]
    for j in range(nr):
        lines += [f"  %qb{j} = getelementptr i8, ptr %pb{j}, i64 %kb",
                  f"  %tb{j} = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 64, "
                  f"ptr %qb{j}, i64 64)"]
    lines += [f"  %n{i}{j} = call x86_amx @llvm.x86.{op}.internal(i16 16, i16 64, i16 64, "
              f"x86_amx %acc{i}{j}, x86_amx %ta{i}, x86_amx %tb{j})" for i, j in tiles]
    lines += ["  %kn = add i64 %kk, 1", "  %done = icmp eq i64 %kn, %steps",
              "  br i1 %done, label %exit, label %loop", "exit:"]
    lines += [f"  call void @llvm.x86.tilestored64.internal(i16 16, i16 64, ptr %pc{i}{j}, "
              f"i64 %ldc, x86_amx %n{i}{j})" for i, j in tiles]
    lines += ["  ret i32 0", "}",
              "declare x86_amx @llvm.x86.tileloadd64.internal(i16, i16, ptr, i64)",
              f"declare x86_amx @llvm.x86.{op}.internal(i16, i16, i16, x86_amx, x86_amx, "
              "x86_amx)",
              "declare void @llvm.x86.tilestored64.internal(i16, i16, ptr, i64, x86_amx)"]
    return "\n".join(lines) + "\n"


def _intrin(kind: str, mr: int, nr: int, chunk: int, packed_a: bool) -> tuple[Any, Any]:
    a_dt, b_dt, c_dt, step, _ = KINDS[kind]
    g = 2 if kind == "bf16" else 4  # K elements per 32-bit lane of a B tile row
    rows, cols, fn = 16 * mr, 16 * nr, kernel_name(kind, mr, nr)
    ir = kernel_ir(kind, mr, nr)
    # A as the workload holds it [rows, chunk], or packed by the template to tiles
    # [rows/16, K/step, 16, step] (each tile step 1,024 contiguous bytes)
    a_shape = (mr, chunk // step, 16, step) if packed_a else (rows, chunk)

    def a_at(vi: tvm.tirx.Var, vk: tvm.tirx.Var) -> tuple[Expr, ...]:
        return (vi // 16, vk // step, vi % 16, vk % step) if packed_a else (vi, vk)

    a_region = (slice(0, mr), slice(0, chunk // step), slice(0, 16), slice(0, step)) \
        if packed_a else (slice(0, rows), slice(0, chunk))

    @T.prim_func(s_tir=True)
    def desc(a_h: T.handle, b_h: T.handle, c_h: T.handle) -> None:
        A = T.match_buffer(a_h, a_shape, a_dt, offset_factor=1)
        B = T.match_buffer(b_h, (nr, chunk // g, 16, g), b_dt, offset_factor=1)
        C = T.match_buffer(c_h, (rows, cols), c_dt, offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:rows, 0:cols], A[a_region], B[0:nr, 0:chunk // g, 0:16, 0:g])
            T.writes(C[0:rows, 0:cols])
            for i, j, k in T.grid(rows, cols, chunk):
                with T.sblock("update"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    C[vi, vj] = C[vi, vj] + T.Cast(c_dt, A[a_at(vi, vk)]) * T.Cast(
                        c_dt, B[vj // 16, vk // g, vj % 16, vk % g])

    sa = T.int32()
    a_strides = [sa, 16 * step, step, 1] if packed_a else [sa, 1]
    # A's strides in elements for the kernel: rows of a tile, tile steps along K, tiles
    a_args = ((T.int32(step), T.int32(16 * step), T.Cast("int32", sa)) if packed_a else
              (T.Cast("int32", sa), T.int32(step), T.Cast("int32", sa * 16)))

    @T.prim_func(s_tir=True)
    def impl(a_h: T.handle, b_h: T.handle, c_h: T.handle) -> None:
        sb = T.int32()
        sc = T.int32()
        A = T.match_buffer(a_h, a_shape, a_dt, offset_factor=1, strides=a_strides)
        B = T.match_buffer(b_h, (nr, chunk // g, 16, g), b_dt, offset_factor=1,
                           strides=[sb, 16 * g, g, 1])
        C = T.match_buffer(c_h, (rows, cols), c_dt, offset_factor=1, strides=[sc, 1])
        with T.sblock("root"):
            T.reads(C[0:rows, 0:cols], A[a_region], B[0:nr, 0:chunk // g, 0:16, 0:g])
            T.writes(C[0:rows, 0:cols])
            with T.attr(0, "pragma_import_llvm", ir):  # the kernel's LLVM function, here
                T.evaluate(T.call_extern(
                    "int32", fn, C.data, T.Cast("int32", C.elem_offset), T.Cast("int32", sc),
                    A.data, T.Cast("int32", A.elem_offset), *a_args,
                    B.data, T.Cast("int32", B.elem_offset), T.Cast("int32", sb),
                    T.int32(chunk // step)))

    return desc, impl


def _from_name(m: re.Match[str]) -> tuple[Any, Any] | None:
    kind, mr, nr, chunk = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))
    if (mr, nr) not in MICRO or chunk % KINDS[kind][3] or not 0 < chunk <= MAX_CHUNK:
        return None
    return _intrin(kind, mr, nr, chunk, packed_a=m.group(5) is not None)


# the name family `schedules/intrinsics.py` registers: regex -> (match -> (desc, impl) or None)
AMX_PATTERNS: list[tuple[re.Pattern[str], Callable[[re.Match[str]], tuple[Any, Any] | None]]] = [
    (re.compile(r"amx_(bf16|int8)_(\d)x(\d)_k(\d+)(_pa)?"), _from_name),
]
