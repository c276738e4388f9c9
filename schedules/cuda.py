"""Tensor-core GEMM for NVIDIA GPUs (sm_70+), cross-compiled: fp16 `dense` with WMMA 16×16×16.

`dense-wmma-cuda`: Y[M, N] = X[M, K] · W[N, K]ᵀ in float16, tensorized with TVM's registered
`wmma_*` intrinsics (`tvm.s_tir.tensor_intrin.cuda`, loaded through `tuner.core.tvm_api`):

- grid: blockIdx.y × blockIdx.x over block tiles of (wm·fm·16) × (wn·fn·16) outputs; a block has
  wm × wn warps (threadIdx.y, the fused warp grid; threadIdx.x = the 32 lanes of a warp, which
  execute each wmma op together); each warp owns fm × fn accumulator fragments (16×16, contiguous
  rows/columns of the block tile);
- per k step of kf·16: the X and W tiles are staged in shared memory by all threads (cooperative,
  vectorized fetch: `meta_schedule.cooperative_fetch`, which the `RewriteCooperativeFetch`
  postprocessor turns into threadIdx.y/threadIdx.x/vector loops), rows padded (storage_align
  32/8) against bank conflicts; then per 16-wide k slice each warp loads fm `matrix_a` and fn
  `matrix_b` fragments (`wmma_load_16x16x16_f16_a_shared`, `..._b_trans_shared`: W[N, K] is B in
  column-major) and issues fm·fn `wmma_sync_16x16x16_f16f16f16_trans` (mma.sync);
- accumulators start with `wmma_fill_16x16x16_f16` and are stored straight to Y with
  `wmma_store_16x16x16_f16_global`.

Accumulation is float16 (`wmma_sync_..._f16f16f16`), which is what the workload's dense computes
for float16 (topi.nn.dense with out_dtype float16 sums in float16), so the schedule does not
change the arithmetic; an f32-accumulating variant would be more accurate but is a different
compute (the tolerance of fp16 workloads already assumes fp16 accumulation).

Knobs (every combination is valid for the workload, none changes a layout):
- warps_m, warps_n: categorical in {1, 2, 4}, restricted per workload to values that divide
  (M/16)/L (L = lcm of the fragment counts ≤ 4 that divide M/16), so any frag choice fits;
- frags_m, frags_n: fragments per warp along M/N (perfect tile of M/16, N/16, innermost ≤ 4);
- tile_k: K/16 into [outer, kf ≤ 2] (kf·16 = the k depth staged in shared memory per step);
- vector_a, vector_b: fp16 lanes per thread in the cooperative fetch (1, 2, 4, 8);
- unroll: explicit unroll depth.
Bounds: ≤ 16 warps (512 threads), shared memory ≤ 2·256·40·2 B = 40 KiB (< 48 KiB static). The
largest point (4×4 warps, 4×4 fragments, kf = 2) compiles with ptxas for sm_80 to 128 registers
per thread, no spills: 512 × 128 = the 64 Ki registers a block may use, so it still launches.

Needs M, N, K multiples of 16. The PyPI TVM wheel has no CUDA runtime: the tests build the CUDA
C source and compile it to PTX with nvcc (`wmma.mma.sync` in the PTX); nothing runs on a GPU here.
"""

from __future__ import annotations

import math

from schedules.base import Template
from schedules.knobs import Categorical, PerfectTile, knob_table
from tuner.core.tvm_api import Schedule, Target, fuse, load_tensor_intrins, ms, reorder
from tuner.workloads import Workload

FRAG = 16  # wmma m16n16k16
MAX_FRAGS = 4  # fragments per warp along M or N
MAX_KF = 2  # 16-wide k slices per shared-memory stage
WARP_CHOICES = (1, 2, 4)
VECTOR_CHOICES = (1, 2, 4, 8)  # fp16 lanes: 8 = 16 bytes
UNROLL_CHOICES = (0, 16, 64, 512)

LOAD_A = "wmma_load_16x16x16_f16_a_shared"
LOAD_B = "wmma_load_16x16x16_f16_b_trans_shared"
SYNC = "wmma_sync_16x16x16_f16f16f16_trans"
FILL = "wmma_fill_16x16x16_f16"
STORE = "wmma_store_16x16x16_f16_global"


def cuda_arch(target: Target) -> int:
    """70 for sm_70, ...; 0 when the target names no arch."""
    arch = str(target.attrs.get("arch", "") or "")
    digits = "".join(ch for ch in arch.removeprefix("sm_") if ch.isdigit())
    return int(digits) if digits else 0


def warp_choices(tiles: int) -> list[int]:
    """Warp counts along one axis of `tiles` 16-wide fragments that fit every frag choice."""
    lcm = 1
    for f in range(1, MAX_FRAGS + 1):
        if tiles % f == 0:
            lcm = math.lcm(lcm, f)
    return [w for w in WARP_CHOICES if (tiles // lcm) % w == 0]


def fits_warps(warps: int, tiles: int) -> bool:
    """A `Categorical.fits` rule: `warps` along an axis of `tiles` fragments fits every frag
    choice (see `warp_choices`)."""
    return warps in warp_choices(tiles)


class DenseWmmaCuda(Template):
    name = "dense-wmma-cuda"
    target = "CUDA sm_70+"
    ops = ("dense",)
    description = ("CUDA tensor cores (sm_70+): fp16 dense with wmma 16x16x16 fragments "
                   "(fp16 accumulation), shared-memory staging, warp/block tiling")
    KNOBS = knob_table(
        warps_m=Categorical(WARP_CHOICES, fits=fits_warps,
                            doc="warps per block along M (threadIdx.y = warps_m * warps_n); "
                                "values that divide (M/16)/lcm(frag choices)"),
        warps_n=Categorical(WARP_CHOICES, fits=fits_warps, doc="warps per block along N"),
        frags_m=PerfectTile(2, max_innermost=MAX_FRAGS, of="M/16",
                            doc="16x16 accumulator fragments per warp along M"),
        frags_n=PerfectTile(2, max_innermost=MAX_FRAGS, of="N/16",
                            doc="16x16 accumulator fragments per warp along N"),
        tile_k=PerfectTile(2, max_innermost=MAX_KF, of="K/16",
                           doc="K/16 into [outer, kf]; kf*16 k per shared-memory stage"),
        vector_a=Categorical(VECTOR_CHOICES,
                             doc="fp16 lanes per thread staging X into shared memory"),
        vector_b=Categorical(VECTOR_CHOICES,
                             doc="fp16 lanes per thread staging W into shared memory"),
        unroll=Categorical(UNROLL_CHOICES,
                           doc="explicit unroll depth (meta_schedule.unroll_explicit)"),
    )

    def applies(self, workload: Workload, target: Target) -> bool:
        spec = workload.spec
        return (workload.op in self.ops and spec.get("dtype") == "float16"
                and target.kind.name == "cuda" and cuda_arch(target) >= 70
                and all(d % FRAG == 0 for d in spec["shape"]))

    def knob_extents(self, workload: Workload) -> dict[str, int]:
        m, n, _ = workload.spec["shape"]
        return {"warps_m": m // FRAG, "warps_n": n // FRAG}

    def postprocs(self, target: Target) -> list[ms.postproc.Postproc]:
        procs = [ms.postproc.DisallowDynamicLoop(), ms.postproc.RewriteCooperativeFetch(),
                 ms.postproc.RewriteParallelVectorizeUnroll(),
                 ms.postproc.RewriteReductionBlock()]
        # RewriteUnboundBlock and VerifyGPUCode need the limits in the target (a tag such as
        # "nvidia/nvidia-a100" has them; {"kind": "cuda", "arch": "sm_80"} does not, and a
        # TuneContext would refuse it). The template binds every block itself and stays within
        # 512 threads and 40 KiB of shared memory, so they are checks here, not needed rewrites.
        if all(k in target.attrs for k in ("max_shared_memory_per_block",
                                           "max_threads_per_block")):
            procs += [ms.postproc.RewriteUnboundBlock(), ms.postproc.VerifyGPUCode()]
        return procs

    def mutators(self, target: Target) -> dict[ms.mutator.Mutator, float]:
        return {ms.mutator.MutateTileSize(): 0.9, ms.mutator.MutateUnroll(): 0.1}

    def schedule(self, sch: Schedule, workload: Workload, target: Target) -> None:
        load_tensor_intrins("cuda")  # registers the wmma_* intrinsics
        m, n, _ = workload.spec["shape"]
        root = sch.get_sblock("root")
        (blk,) = sch.get_child_blocks(root)
        sch.annotate(root, "meta_schedule.unroll_explicit", self.sample(sch, "unroll"))

        i, j, k = sch.get_loops(blk)
        i_o, i_t = sch.split(i, [None, FRAG])
        j_o, j_t = sch.split(j, [None, FRAG])
        k_o, k_t = sch.split(k, [None, FRAG])
        tiles = []
        for axis, loop, extent in (("m", i_o, m // FRAG), ("n", j_o, n // FRAG)):
            warps = self.sample(sch, f"warps_{axis}", extent=extent)
            frags = self.tile(sch, f"frags_{axis}", loop)[1]
            tiles.append(sch.split(loop, [None, warps, frags]))  # [block, warp, frag]
        (i_b, i_w, i_f), (j_b, j_w, j_f) = tiles
        k0, k1 = self.split(sch, "tile_k", k_o)
        reorder(sch, i_b, j_b, i_w, j_w, k0, k1, i_f, j_f, i_t, j_t, k_t)
        sch.bind(i_b, "blockIdx.y")
        sch.bind(j_b, "blockIdx.x")
        warp = fuse(sch, i_w, j_w)
        sch.bind(warp, "threadIdx.y")
        # the wmma ops run on whole warps: threadIdx.x (32 lanes) for the cooperative fetch
        sch.annotate(blk, "warp_execution", 1)

        a_shared = sch.cache_read(blk, 0, "shared")
        b_shared = sch.cache_read(blk, 1, "shared")
        a_frag = sch.cache_read(blk, 0, "wmma.matrix_a")
        b_frag = sch.cache_read(blk, 1, "wmma.matrix_b")
        acc = sch.cache_write(blk, 0, "wmma.accumulator")
        sch.reverse_compute_at(acc, warp)
        for frag, intrin in ((a_frag, LOAD_A), (b_frag, LOAD_B)):
            sch.compute_at(frag, k1)
            rows, _ = sch.get_loops(frag)[-2:]
            _, rows_t = sch.split(rows, [None, FRAG])
            sch.tensorize(rows_t, intrin)

        for stage, knob in ((a_shared, "vector_a"), (b_shared, "vector_b")):
            sch.compute_at(stage, k0)
            sch.storage_align(stage, 0, axis=-2, factor=32, offset=8)
            fuse(sch, *sch.get_loops(stage)[-2:])
            sch.annotate(stage, "meta_schedule.cooperative_fetch", self.sample(sch, knob))
        init = sch.decompose_reduction(blk, k0)
        sch.tensorize(sch.get_loops(init)[-2], FILL)
        sch.tensorize(i_t, SYNC)
        rows, cols = sch.get_loops(acc)[-2:]
        rows_o, rows_t = sch.split(rows, [None, FRAG])
        cols_o, cols_t = sch.split(cols, [None, FRAG])
        reorder(sch, rows_o, cols_o, rows_t, cols_t)
        sch.tensorize(rows_t, STORE)
