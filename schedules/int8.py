"""int8 GEMMs on x86: `dense-int8-vnni` (AVX512-VNNI) and `dense-int8-avx2` (AVX2, no VNNI).

    Y[M, N] int32 = X[M, K] uint8 . W[N, K]^T int8           (topi.nn.dense, out_dtype int32)

Matched by structure (`schedules/match.py`, GemmMatch.dtype INT8): the op spec `dense_int8`, and
any PrimFunc whose first block is that GEMM with the weight [N, K] or [K, N] (relax's
`R.matmul(x, w, out_dtype="int32")` of a bound weight comes as [K, N]), int32 or int64 indices,
followed by elementwise blocks (a requantization: cast, scale, round, clip, cast to int8). Those
are folded into one block computed per parallel tile, right after the tile's accumulators are
complete (not a separate pass over the output), vectorized over 16 columns.

The weight is packed INSIDE the program into a FIXED layout Wp[N/16, K/4, 16, 4] (cache_read of W
+ transform_layout), and that block is annotated `meta_schedule.layout_rewrite_preproc`: it is the
compile-time packing of a constant weight (TVM's layout-free buffers, as MetaSchedule's
RewriteLayout does). The sandbox times the kernel on the pre-packed weight and verifies the whole
program, packing included. The layout never depends on a sampled knob: a trace replays
`transform_layout` with its recorded index map, whatever the new tile decisions are.

Every 16x4 tile Wp[j, k] is 64 contiguous bytes, the operand of one `vpdpbusd` (intrinsic
`dot_16x4_vnni_llvm22`, schedules/intrinsics.py). Tensorizing the unpacked W would compile and run
fast but be WRONG: tensorize does not check that a tile is contiguous (TVM_NOTES §4b).

Without VNNI, `dense-int8-avx2` is the same template at half the width: Wp[N/8, K/2, 8, 2], each
8x2 tile 16 contiguous bytes widened to int16 and multiplied with `vpmaddwd` (intrinsic
`dot_8x2_u8i8s32_avx2`: exact, where `vpmaddubsw` would saturate), 8-lane ymm accumulators and
16 registers. Below, read 8 for 16 and 2 for 4.

Loop nest (the micro-kernel keeps rows x accumulators zmm registers live across k1):

    parallel over a prefix of (i0, j0)          <- knob "parallel": max parallel extent
      k0                                        <- k blocking (k0 x k1 = K/4)
        i1, j1  (or j1, i1: "order")
          k1
            i2 (unrolled)                       <- rows of the micro-kernel
              j2 (unrolled)                     <- 16-lane accumulators per row
                vpdpbusd (16 lanes x 4 k)

Reduction decomposition, tensorization and the init's vectorization are done by the
postprocessors (RewriteReductionBlock, RewriteTensorize) after parallel is applied, the order TVM
requires. The init (the zeroing of a whole i1 x j1 cache block, above k0) gets copies of the
block's loops; FinishCacheBlock then makes it rows x columns and unrolls i2, j2 in the update
only. Sampled micro-kernels that would spill (rows x vectors accumulators + one
weight tile per vector > 32 zmm) are rejected by the RegisterBudget postprocessor.

Measured for 128x768x768 (shared 2-core Zen 5, rough): a 32-trial search found 77.9 us (1.94
TOPS, 4 rows x 4 vectors, no k blocking) at a quiet moment, vs PyTorch's 89 us baseline; on one
core ~175 us (~80% of the VNNI peak), the same as torch._int_mm timed in the same process.
"""

from __future__ import annotations

import functools
from abc import abstractmethod
from collections.abc import Mapping
from typing import Any, cast

from schedules.base import (
    StructuralTemplate,
    cpu_postprocs,
    fold_epilogue,
    is_x86,
    vector_lanes,
)
from schedules.dot_intrinsics import PMADDWD_8x2_AVX2, VNNI_16x4_LLVM22
from schedules.intrinsics import use
from schedules.knobs import Categorical, DesignSpace, Fixed, Knob, PerfectTile, knob_table
from schedules.match import INT8, GemmMatch, match_gemm, plain_gemm
from tuner.core.tvm_api import SBlockRV, Schedule, Target, Trace, derived_object, ms, reorder
from tuner.workloads import Workload

MAX_ROWS = 8  # rows of the micro-kernel
MAX_VECS = 8  # vector accumulators per row (16 lanes with VNNI, 8 with AVX2)
PARALLEL = (2, 4, 8, 16, 64, 256)  # max extent of the fused parallel loop (2 cores)
# pragma_auto_unroll_max_step on the outer loops. Not MetaSchedule's 512 as well: F22 (relax's int8
# linear 128x768->768 + requantize, 2-core Xeon with VNNI, 64 trials, two seeds) built those 2.4x
# slower (0.44-0.48 s against 0.18-0.26), the search drew them for 25-29 of 64 trials, and none was
# the fastest (best 122.9 and 125.3 us against 121.4 and 118.8): the job took 31 s, 26 without
UNROLL = (0, 16, 64)
ORDERS = ("ij", "ji")  # order of the cache-block loops; one design space each


def has_vnni(target: Target) -> bool:
    from tuner.core.tvm_api import tvm_ffi

    return bool(tvm_ffi.get_global_func("target.llvm_cpu_has_feature")("avx512vnni", target))


def pack_weight(sch: Schedule, block: SBlockRV, read: int = 1, axes: str = "jk", *,
                lanes: int = 16, group: int = 4) -> SBlockRV:
    """cache_read the weight of `block` (its read `read`, indexed [N, K] for axes "jk", [K, N]
    for "kj") into the fixed packed layout [N/lanes, K/group, lanes, group] and mark the copy as
    the compile-time weight packing (dropped from the timed kernel by
    `tuner.core.prepack.kernel`)."""
    wp = sch.cache_read(block, read, "global")
    if axes == "jk":
        sch.transform_layout(wp, ("write", 0),
                             lambda n, k: (n // lanes, k // group, n % lanes, k % group))
    else:
        sch.transform_layout(wp, ("write", 0),
                             lambda k, n: (n // lanes, k // group, n % lanes, k % group))
    sch.annotate(wp, "meta_schedule.layout_rewrite_preproc", True)
    return wp


@derived_object
class RegisterBudget(ms.postproc.PyPostproc):
    """Rejects a sampled micro-kernel whose live vector registers (rows x vectors accumulators
    plus the `vectors` weight tiles of a k step) exceed the register file: such kernels spill
    (4 x 8 measured 2.5x slower than 4 x 6 with AVX-512's 32 zmm). Reads the first two
    perfect-tile decisions of the trace (rows, then vectors: the order `PackedDotGemm.schedule`
    samples them in); adds no instruction, so records replay without it."""

    def __init__(self, registers: int = 32) -> None:
        super().__init__()
        self.registers = registers

    def _initialize_with_tune_context(self, context: ms.TuneContext) -> None:
        pass

    def apply(self, sch: Schedule) -> bool:
        trace = cast(Trace, sch.trace)  # the search's schedules are traced
        tiles = [trace.decisions[inst] for inst in trace.insts
                 if inst.kind.name == "SamplePerfectTile"]
        if len(tiles) < 2:
            return True
        rows, vectors = int(tiles[0][-1]), int(tiles[1][-1])
        return rows * vectors + vectors <= self.registers

    def clone(self) -> ms.postproc.Postproc:
        return cast(ms.postproc.Postproc, RegisterBudget(self.registers))


class _Unchecked:
    """A schedule whose methods skip TVM's Python type check (`type_checked`: about 0.1 ms a call,
    inspect.signature binding). A postproc runs on every candidate the evolutionary search
    samples: FinishCacheBlock's ~50 checked calls made each of F22's proposals 0.9 s slower
    (2-core Xeon, 4 proposals: 8.0 -> 11.7 s)."""

    def __init__(self, sch: Schedule) -> None:
        self._sch = sch

    def __getattr__(self, name: str) -> Any:
        method = getattr(type(self._sch), name, None)
        if not callable(method):  # a property (mod, trace, ...) or an instance attribute
            return getattr(self._sch, name)
        return functools.partial(getattr(method, "__wrapped__", method), self._sch)


LOOP_ROLE = "tunefarm.cache_block_loop"  # rows, rows_unrolled, cols, cols_unrolled


@derived_object
class FinishCacheBlock(ms.postproc.PyPostproc):
    """Unrolls the micro-kernel's loops (`LOOP_ROLE` "*_unrolled") in the update, and makes the
    accumulators' zeroing one loop over the cache block's rows around one over its columns.

    `RewriteReductionBlock` splits the zeroing off above the k loop with copies of every loop of
    the cache block, unrolled ones included: thousands of vector stores in a 4-deep nest. LLVM
    took 2-6 s to compile those of a 64 x 256 int32 block (AVX2, a 2 x 4 register tile), against
    0.1 s for the rest of the kernel; as rows x columns it takes 0.08 s. Its instructions are in
    the trace: records replay without this postproc."""

    def _initialize_with_tune_context(self, context: ms.TuneContext) -> None:
        pass

    def apply(self, sch: Any) -> bool:
        sch = _Unchecked(sch)
        blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
        while blocks:
            block = blocks.pop()
            blocks.extend(sch.get_child_blocks(block))
            roles = {str(sch.get(loop).annotations[LOOP_ROLE]): loop
                     for loop in sch.get_loops(block) if LOOP_ROLE in sch.get(loop).annotations}
            for loop in roles.values():
                sch.unannotate(loop, LOOP_ROLE)
            if not sch.get(block).name_hint.endswith("_init"):
                for role, loop in roles.items():
                    if role.endswith("_unrolled"):
                        sch.unroll(loop)
            elif len(roles) == 4:
                sch.reorder(roles["rows"], roles["rows_unrolled"], roles["cols"],
                            roles["cols_unrolled"])
                sch.fuse(roles["rows"], roles["rows_unrolled"])
                sch.fuse(roles["cols"], roles["cols_unrolled"])
        return True

    def clone(self) -> ms.postproc.Postproc:
        return cast(ms.postproc.Postproc, FinishCacheBlock())


def packed_dot_knobs(lanes: int, group: int, acc: str = "int32") -> Mapping[str, Knob]:
    packed = f"packed weight Wp[N/{lanes}, K/{group}, {lanes}, {group}]"
    return knob_table(
        # sampled in this order: RegisterBudget reads the first two perfect tiles as (rows, vectors)
        rows=PerfectTile(3, max_innermost=MAX_ROWS, of="M",
                         doc="M = i0 x i1 x i2: i2 = rows of the micro-kernel, i1 = rows of a "
                             "cache block, i0 = parallel row blocks"),
        vectors=PerfectTile(3, max_innermost=MAX_VECS, of=f"N/{lanes}",
                            doc=f"N/{lanes} = j0 x j1 x j2: j2 = {lanes}-lane {acc} accumulators "
                                "per row (i2 x j2 registers live), j1 = column tiles of a cache "
                                "block, j0 = parallel column blocks"),
        k_block=PerfectTile(2, of=f"K/{group}",
                            doc=f"K/{group} = k0 x k1: k1 = groups of {group} reduced per pass "
                                "over the accumulators (k blocking), k0 = passes"),
        order=DesignSpace(ORDERS, doc="order of the cache-block loops (i1 j1 or j1 i1)"),
        parallel=Categorical(PARALLEL,
                             doc="max extent of the parallel loop fused from the outer spatial "
                                 "tiles (i0, j0): the parallel granularity (i0 alone is "
                                 "parallel when i0 x j0 exceeds it)"),
        unroll=Categorical(UNROLL, doc="pragma_auto_unroll_max_step (explicit) on the outer "
                                       "loops; the micro-kernel's i2, j2 are always unrolled"),
        layout=Fixed(packed, doc="packed by a layout_rewrite_preproc block; fixed so that "
                                 "traces replay with any tile decisions"),
    )


class PackedDotGemm(StructuralTemplate):
    """The register-blocked GEMM on a packed weight, parametrized by the dot-product
    instruction: `lanes` accumulators per register, `group` products summed per lane,
    `registers` vector registers, the tensor intrinsic `intrin`, the operands `dtype` (a
    GemmMatch.dtype: INT8 here, BF16 in schedules/bf16.py), and LLVM IR the intrinsic calls
    (`llvm_import`, imported by the k0 loop's `pragma_import_llvm`), if any."""

    ops: tuple[str, ...] = ("dense_int8", "tir")
    tensorize = True  # RewriteTensorize tensorizes the blockized update, vectorizes the init
    # a quarter of the default population: side by side, the best kernels of 64 trials were as
    # fast at 64 as at 128 (F22, P7, two seeds each; the job 8–12% shorter: bench/RESULTS.md,
    # Run AS), and at 32 as at 64 (F22, four seeds each on a VNNI Xeon: 102 against 103 µs on
    # average, the job 12.2 against 13.3 s: Run AX)
    population_size = 32
    lanes: int
    group: int
    registers: int
    intrin: str
    dtype: str = INT8
    operands = "uint8 x int8 -> int32"
    llvm_import: str | None = None

    @abstractmethod
    def _why_not_target(self, target: Target) -> str | None:
        """None if `target` (x86) has the instruction, else why not."""

    def why_not(self, workload: Workload, target: Target) -> str | None:
        g = plain_gemm(workload, self.dtype, self.operands)
        if isinstance(g, str):
            return g
        why = self._why_not_target(target) if is_x86(target) else "not an x86 LLVM target"
        if why:
            return why
        if g.n % self.lanes or g.k % self.group:
            return f"N={g.n} is not a multiple of {self.lanes} or K={g.k} not of {self.group}"
        return None

    def knob_extents(self, workload: Workload) -> dict[str, int]:
        g = match_gemm(workload)
        assert isinstance(g, GemmMatch)
        return {"rows": g.m, "vectors": g.n // self.lanes, "k_block": g.k // self.group}

    def schedule(self, sch: Schedule, workload: Workload, target: Target, *,
                 order: str) -> None:
        g = match_gemm(workload)
        assert isinstance(g, GemmMatch), g
        block, *epilogue = sch.get_child_blocks(sch.get_sblock("root"))[g.block:]
        epi = fold_epilogue(sch, epilogue)
        pack_weight(sch, block, g.weight, g.weight_axes[-2:], lanes=self.lanes, group=self.group)
        i, j, k = sch.get_loops(block)
        j, j16 = sch.split(j, [None, self.lanes])
        k, k4 = sch.split(k, [None, self.group])
        i0, i1, i2 = self.split(sch, "rows", i)
        j0, j1, j2 = self.split(sch, "vectors", j)
        k0, k1 = self.split(sch, "k_block", k)  # innermost up to the whole K/4
        mid = (i1, j1) if order == "ij" else (j1, i1)
        reorder(sch, i0, j0, k0, *mid, k1, i2, j2, j16, k4)
        if self.llvm_import:  # the intrinsic's LLVM function, imported into the kernel's module
            # by the k0 loop: the root block is rebuilt by relax's SplitLayoutRewritePreproc
            # (its annotations lost), and the parallel postproc fuses the loops above k0
            sch.annotate(k0, "pragma_import_llvm", self.llvm_import)
        # the micro-kernel's i2, j2 are unrolled by `FinishCacheBlock`, after the postprocs
        # split off the accumulators' zeroing (which copies the loops it sits in)
        for loop, role in ((i1, "rows"), (i2, "rows_unrolled"), (j1, "cols"),
                           (j2, "cols_unrolled")):
            sch.annotate(loop, LOOP_ROLE, role)
        if epi is not None:  # after the tile's last k0 pass: its accumulators are complete
            sch.reverse_compute_at(epi, j0, preserve_unit_loops=True)
            _, lanes = sch.split(sch.get_loops(epi)[-1], [None, self.lanes])
            sch.vectorize(lanes)
        # the lanes x group (j16, k4) tile becomes one block that RewriteTensorize maps onto the
        # dot-product instruction
        inner = sch.blockize(j16)
        sch.annotate(inner, "meta_schedule.auto_tensorize", use(self.intrin))
        root = sch.get_sblock("root")
        sch.annotate(root, "meta_schedule.parallel", self.sample(sch, "parallel"))
        sch.annotate(root, "meta_schedule.unroll_explicit", self.sample(sch, "unroll"))

    def postprocs(self, target: Target) -> list[ms.postproc.Postproc]:
        return [cast(ms.postproc.Postproc, RegisterBudget(self.registers)),
                *cpu_postprocs(tensorize=True), cast(ms.postproc.Postproc, FinishCacheBlock())]

    def mutators(self, target: Target) -> dict[ms.mutator.Mutator, float]:
        # MutateParallel rewrites a constant `meta_schedule.parallel` value (it fails on a sampled
        # one); here the parallel extent is a sampled categorical, resampled with the population
        return {ms.mutator.MutateTileSize(): 0.9, ms.mutator.MutateUnroll(): 0.1}


class DenseInt8VNNI(PackedDotGemm):
    name = "dense-int8-vnni"
    target = "x86-64 with AVX512-VNNI"
    description = ("uint8 x int8 -> int32 dense on AVX512-VNNI: weight packed once to "
                   "[N/16, K/4, 16, 4] (layout-rewrite preproc, not timed), register-blocked "
                   "micro-kernel of rows x 16-lane accumulators tensorized with vpdpbusd "
                   f"({VNNI_16x4_LLVM22}), k blocking, parallel outer tiles, an elementwise "
                   "epilogue (requantization) per tile. Needs N % 16 == 0 and K % 4 == 0.")
    lanes, group, registers, intrin = 16, 4, 32, VNNI_16x4_LLVM22
    KNOBS = packed_dot_knobs(lanes, group)

    def _why_not_target(self, target: Target) -> str | None:
        return None if has_vnni(target) else "the target has no AVX512-VNNI"


class DenseInt8AVX2(PackedDotGemm):
    name = "dense-int8-avx2"
    target = "x86-64 with AVX2, no VNNI"
    description = ("uint8 x int8 -> int32 dense on AVX2 without VNNI: weight packed once to "
                   "[N/8, K/2, 8, 2], register-blocked micro-kernel of rows x 8-lane accumulators "
                   f"tensorized with vpmaddwd on int16-widened operands ({PMADDWD_8x2_AVX2}, "
                   "exact), k blocking, parallel outer tiles, an elementwise epilogue "
                   "(requantization) per tile. Needs N % 8 == 0 and K % 2 == 0.")
    lanes, group, registers, intrin = 8, 2, 16, PMADDWD_8x2_AVX2
    KNOBS = packed_dot_knobs(lanes, group)

    def _why_not_target(self, target: Target) -> str | None:
        if has_vnni(target):
            return "the target has AVX512-VNNI: dense-int8-vnni serves it"
        return None if vector_lanes(target, 32) >= 8 else "the target has no AVX2"
