"""bf16 and int8 GEMMs on Intel AMX (Sapphire Rapids and later Xeons): `dense-bf16-amx`,
`dense-int8-amx`.

    Y[M, N] float32 = X[M, K] bf16 . W[N, K]^T bf16       (tdpbf16ps: fp32 products and sums)
    Y[M, N] int32 = X[M, K] uint8 . W[N, K]^T int8        (tdpbusd)

Matched by structure like the AVX-512 templates they stand before (`dense-bf16-avx512`,
`dense-int8-vnni`): the op specs `dense`/`matmul` with dtype bfloat16 and `dense_int8`, and any
PrimFunc whose first block is that GEMM (weight [N, K] or [K, N]) followed by elementwise blocks,
folded into each parallel tile's write-back. Chosen by the target's `amx-bf16` / `amx-int8`
features; the host target reports them only where the kernel grants the tile state
(`tuner.core.tvm_api.host_target_dict`).

The weight is packed once at compile time to the AVX-512 templates' layout [N/16, K/g, 16, g]
(g = 2 for bf16, 4 for int8): a B tile (16 rows of g-element groups x 16 columns) is then 1,024
contiguous bytes. The micro-kernel (`schedules/amx_intrinsics.py`) keeps MR x NR accumulator
tiles in tile registers over a chunk of K; the loop nest around it:

    parallel over a prefix of (i0, j0)            <- knob "parallel"
      k0                                          <- K / k_chunk passes (design space)
        [X's rows of the cache block, this chunk, copied in tile order]   <- "a_layout" tiles
        i1, j1  (or j1, i1: "order")              <- the cache block, in micro-kernels
          [16 MR x 16 NR x k_chunk]               <- one call: tiles loaded, k_chunk/32 (64)
                                                     tile steps, tiles stored

X read as it is, a tile's 16 rows lie a row of X apart (4 KiB for K = 2048 in bf16: 16 pages
per tile load); copied, each tile is 1,024 contiguous bytes. Timed with the copy's cost left
out (X's loads made contiguous in the kernel, same bytes), the tile-order X ran 1.27x faster on
2048³ and 1.15x on 1024³ (Sapphire Rapids, 2 cores): the copy is the design space "tiles". With
its cost, it won on 2048³ only (bench/RESULTS.md, Run BK): each parallel column block copies
its rows again.

The block's accumulators are zeroed above k0 (RewriteReductionBlock's init, a 2-D loop LLVM
vectorizes); each call loads its C tiles and stores them back, once per chunk of K.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from schedules.amx_intrinsics import KINDS, MICRO, intrin_name
from schedules.base import StructuralTemplate, cpu_postprocs, fold_epilogue, is_x86
from schedules.int8 import PARALLEL, pack_weight
from schedules.intrinsics import use
from schedules.knobs import Categorical, DesignSpace, Fixed, Knob, PerfectTile, knob_table
from schedules.match import BF16, INT8, GemmMatch, match_gemm, plain_gemm
from tuner.core.tvm_api import Schedule, Target, ms, reorder, tvm_ffi
from tuner.workloads import Workload

CHUNKS = ("2048", "1024", "768", "512", "256")  # K elements per micro-kernel call
MAX_CHUNKS = 3  # design spaces of k_chunk per workload: the largest that divide K
ORDERS = ("ij", "ji")
A_LAYOUTS = ("tiles", "rows")  # X copied into tile order per cache block, or read as is


def has_amx(target: Target, kind: str) -> bool:
    feature = "amx-bf16" if kind == "bf16" else "amx-int8"
    return bool(tvm_ffi.get_global_func("target.llvm_cpu_has_feature")(feature, target))


def _knobs(kind: str) -> Mapping[str, Knob]:
    g = 2 if kind == "bf16" else 4
    step = KINDS[kind][3]
    return knob_table(
        micro=DesignSpace(tuple(f"{r}x{c}" for r, c in MICRO),
                          doc="MR x NR accumulator tiles (16 x 16 each) of the micro-kernel: the "
                              "largest that divides M/16 x N/16 (2 x 2 fills the 8 tile "
                              "registers: 4 C, 2 A, 2 B)"),
        k_chunk=DesignSpace(CHUNKS, doc=f"K elements per micro-kernel call (a multiple of {step}:"
                                        " one tile step): C's tiles are loaded and stored once "
                                        "per chunk; the largest that divide K"),
        order=DesignSpace(ORDERS, doc="order of the cache-block loops (i1 j1 or j1 i1)"),
        a_layout=DesignSpace(A_LAYOUTS,
                             doc="X as it is (a tile's 16 rows a row of X apart), or copied per "
                                 "cache block and chunk of K into tiles [16 MR i1 / 16, "
                                 f"k_chunk/{step}, 16, {step}] (each tile 1,024 contiguous "
                                 "bytes)"),
        rows=PerfectTile(2, of="M/(16 MR)",
                         doc="micro-kernel rows = i0 x i1: i1 = rows of a cache block, "
                             "i0 = parallel row blocks"),
        cols=PerfectTile(2, of="N/(16 NR)",
                         doc="micro-kernel columns = j0 x j1: j1 = columns of a cache block, "
                             "j0 = parallel column blocks"),
        parallel=Categorical(PARALLEL,
                             doc="max extent of the parallel loop fused from (i0, j0)"),
        layout=Fixed(f"packed weight Wp[N/16, K/{g}, 16, {g}]",
                     doc="packed by a layout_rewrite_preproc block (one B tile = 1,024 "
                         "contiguous bytes); fixed so that traces replay with any decisions"),
    )


class AmxGemm(StructuralTemplate):
    """The AMX GEMM for the operands `kind` ("bf16" or "int8", schedules/amx_intrinsics.KINDS)."""

    ops = ("dense", "matmul", "dense_int8", "tir")
    tensorize = True
    population_size = 32
    kind: str
    dtype: str
    operands: str

    def why_not(self, workload: Workload, target: Target) -> str | None:
        g = plain_gemm(workload, self.dtype, self.operands)
        if isinstance(g, str):
            return g
        if not is_x86(target):
            return "not an x86 LLVM target"
        if not has_amx(target, self.kind):
            return f"the target has no AMX-{self.kind.upper()} (amx-{self.kind} in mattr)"
        step = KINDS[self.kind][3]
        if g.m % 16 or g.n % 16 or g.k % step:
            return f"M={g.m} and N={g.n} are not multiples of 16 or K={g.k} not of {step}"
        return None

    def design_variants(self, workload: Workload) -> list[dict[str, Any]]:
        g = match_gemm(workload)
        assert isinstance(g, GemmMatch)
        mr, nr = next((r, c) for r, c in MICRO if (g.m // 16) % r == 0 and (g.n // 16) % c == 0)
        step = KINDS[self.kind][3]
        chunks = [c for c in CHUNKS if int(c) <= g.k and g.k % int(c) == 0 and int(c) % step == 0]
        if not chunks:  # none listed divides K: its largest divisor of whole tile steps
            chunks = [str(max(c for c in range(step, min(g.k, 2048) + 1, step) if g.k % c == 0))]
        chunks = chunks[:MAX_CHUNKS]
        return [{"micro": f"{mr}x{nr}", "k_chunk": c, "order": o, "a_layout": a}
                for c in chunks for o in ORDERS for a in A_LAYOUTS]

    def knob_extents(self, workload: Workload) -> dict[str, int]:
        g = match_gemm(workload)
        assert isinstance(g, GemmMatch)
        mr, nr = (int(x) for x in self.design_variants(workload)[0]["micro"].split("x"))
        return {"rows": g.m // (16 * mr), "cols": g.n // (16 * nr)}

    def schedule(self, sch: Schedule, workload: Workload, target: Target, *, micro: str,
                 k_chunk: str, order: str, a_layout: str) -> None:
        g = match_gemm(workload)
        assert isinstance(g, GemmMatch), g
        mr, nr = (int(x) for x in micro.split("x"))
        chunk = int(k_chunk)
        block, *epilogue = sch.get_child_blocks(sch.get_sblock("root"))[g.block:]
        epi = fold_epilogue(sch, epilogue)
        step = KINDS[self.kind][3]
        ap = None
        if a_layout == "tiles":  # X's rows of a chunk copied into whole tiles, in tile order
            ap = sch.cache_read(block, 1 - g.weight, "global")
            sch.transform_layout(ap, ("write", 0),
                                 lambda r, k: (r // 16, k // step, r % 16, k % step))
        pack_weight(sch, block, g.weight, g.weight_axes[-2:], lanes=16,
                    group=2 if self.kind == "bf16" else 4)
        i, j, k = sch.get_loops(block)
        i, ii = sch.split(i, [None, 16 * mr])
        j, jj = sch.split(j, [None, 16 * nr])
        k0, kk = sch.split(k, [None, chunk])
        i0, i1 = self.split(sch, "rows", i)
        j0, j1 = self.split(sch, "cols", j)
        mid = (i1, j1) if order == "ij" else (j1, i1)
        reorder(sch, i0, j0, k0, *mid, ii, jj, kk)
        if ap is not None:  # per parallel tile and chunk of K: the rows its cache block reads
            sch.compute_at(ap, k0, preserve_unit_loops=True)
            _, lanes = sch.split(sch.get_loops(ap)[-1], [None, step])  # 64 bytes
            sch.vectorize(lanes)
        if epi is not None:  # after the tile's last k0 pass: its accumulators are complete
            sch.reverse_compute_at(epi, j0, preserve_unit_loops=True)
            _, lanes = sch.split(sch.get_loops(epi)[-1], [None, 16])
            sch.vectorize(lanes)
        inner = sch.blockize(ii)
        sch.annotate(inner, "meta_schedule.auto_tensorize",
                     use(intrin_name(self.kind, mr, nr, chunk, packed_a=ap is not None)))
        root = sch.get_sblock("root")
        sch.annotate(root, "meta_schedule.parallel", self.sample(sch, "parallel"))

    def postprocs(self, target: Target) -> list[ms.postproc.Postproc]:
        # the init zeroes a 2-D block of C (RewriteTensorize vectorizes one loop only); LLVM
        # turns it into vector stores itself
        return [*cpu_postprocs(), ms.postproc.RewriteTensorize(vectorize_init_loop=False)]

    def mutators(self, target: Target) -> dict[ms.mutator.Mutator, float]:
        return {ms.mutator.MutateTileSize(): 1.0}


class DenseBF16AMX(AmxGemm):
    name = "dense-bf16-amx"
    target = "x86-64 with AMX-BF16"
    kind, dtype, operands = "bf16", BF16, "bfloat16 x bfloat16 -> float32"
    description = ("bfloat16 x bfloat16 -> float32 dense or matmul on AMX: weight packed once to "
                   "[N/16, K/2, 16, 2] (layout-rewrite preproc, not timed), a micro-kernel of "
                   "MR x NR 16 x 16 fp32 tiles kept in tile registers over a chunk of K "
                   "(tdpbf16ps, an imported LLVM function), a cache block of micro-kernels, "
                   "parallel outer tiles, an elementwise epilogue per tile. Needs M, N % 16 == 0 "
                   "and K % 32 == 0.")
    KNOBS = _knobs("bf16")


class DenseInt8AMX(AmxGemm):
    name = "dense-int8-amx"
    target = "x86-64 with AMX-INT8"
    kind, dtype, operands = "int8", INT8, "uint8 x int8 -> int32"
    description = ("uint8 x int8 -> int32 dense on AMX: weight packed once to [N/16, K/4, 16, 4] "
                   "(layout-rewrite preproc, not timed), a micro-kernel of MR x NR 16 x 16 int32 "
                   "tiles kept in tile registers over a chunk of K (tdpbusd, an imported LLVM "
                   "function), a cache block of micro-kernels, parallel outer tiles, an "
                   "elementwise epilogue (requantization) per tile. Needs M, N % 16 == 0 and "
                   "K % 64 == 0.")
    KNOBS = _knobs("int8")
