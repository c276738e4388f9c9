"""GEMM templates for 64-bit ARM (AArch64) CPUs, cross-compiled: NEON fp32 and int8 dot products.

`dense-neon-aarch64` (fp32 `dense` X·Wᵀ and `matmul` A·B): a register-blocked NEON micro-kernel.
Both templates match by structure (`schedules/match.py`, as the x86 ones): the op specs, and any
PrimFunc whose first block is the GEMM (a relax task, int64 indices, weight [N, K] or [K, N]),
its elementwise blocks after it (bias, activation, requantization) folded into the write-back.

- the weight (W[N, K] of `dense`, B[K, N] of `matmul`: layout-free buffers, i.e. model
  constants) is packed into [N/4, K, 4] panels by a `meta_schedule.layout_rewrite_preproc` block,
  paid once at compile time (the timed kernel takes the packed weight): the 4 fp32 lanes of one q
  register for one k are contiguous, and one panel is a single sequential stream along k. The
  panel width is fixed (4 lanes), so the layout never depends on a knob;
- an mr × (nv·4) accumulator tile lives in registers (a `local` cache written back after the
  whole reduction); per k step: mr scalars of X/A, nv 4-lane vectors of the weight, mr·nv `fmla
  v.4s` (LLVM picks the by-element or the broadcast form);
- knobs: M into [parallel, middle, mr ≤ 8], N/4 into [parallel, middle, nv ≤ 4], K into
  [outer, unrolled ≤ 8], explicit unroll depth. The outer M×N tiles are fused and parallel.

`dense-int8-sdot-aarch64` (`dense_int8`: X uint8 · W int8 → int32): the dot-product (SDOT family)
micro-kernel. Which instruction is exact for uint8 × int8:

- `sdot` (int8 × int8) would read X ≥ 128 as negative, `udot` (uint8 × uint8) would read W < 0 as
  ≥ 128, so TVM's registered `dot_4x4_i8i8s32_sdot` / `dot_4x4_u8u8u32_udot` do not fit (and
  tensorize refuses them: their description's dtypes differ from the workload's);
- `usdot` (FEAT_I8MM, Armv8.6-A: unsigned × signed bytes, int32 accumulation, exact) is the one
  instruction that computes exactly this op. TVM registers no usdot intrinsic, so tunefarm
  registers `dot_4x4_u8i8s32_usdot` (C[4] int32 += A[4] uint8 · B[4, 4] int8 with
  `llvm.aarch64.neon.usdot.v4i32.v16i8(acc, u8x16, s8x16)`) and the template tensorizes with it;
- so the template applies only to targets with `i8mm` (e.g. mcpu neoverse-n2 / neoverse-v1 or
  mattr `+i8mm`). On a dotprod-only core such as Neoverse N1 there is no exact dot instruction for
  uint8 × int8 (an sdot kernel needs X − 128 and a per-column correction, i.e. another compute, not
  a schedule); there LLVM's own vectorizer emits exact `ushll/sshll + smlal` code and the
  "auto" space serves the op. (LLVM also picks `usdot` on its own for a plain scalar k loop with
  `+i8mm`, but then the reduction order and register blocking are LLVM's, not the template's.)

The int8 weight is packed into [N/4, K/4, 4, 4] tiles (a `layout_rewrite_preproc` block): one
16-byte tile = 4 output columns × 4 consecutive k, exactly the B operand of one `usdot`, which the
intrinsic loads as one contiguous `int8x16` (tensorize does not check contiguity, the packing
guarantees it). Knobs as for fp32: [parallel, middle, mr ≤ 8] rows, [parallel, middle, nv ≤ 4]
4-column groups, K/4 into [outer, unrolled ≤ 8], unroll depth.

The usdot intrinsics live in schedules/intrinsics.py, registered on first use like the others.

No ARM machine here: tests/schedules/test_cross.py builds traces covering every knob value for
AArch64 and looks for `fmla v*.4s` / `usdot` in the assembly; the fp32 schedules and the int8 loop
nest without its tensorize step also run on the x86 host against numpy; where qemu-user and an
AArch64 gcc are installed, the AArch64 kernels themselves (usdot included) run under
`qemu-aarch64 -cpu max` against numpy.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING

from schedules.base import StructuralTemplate, finish_register_tile, fold_epilogue, pack_weight
from schedules.intrinsics import USDOT_LOCAL_INTRIN, use
from schedules.knobs import Categorical, PerfectTile, knob_table
from schedules.match import INT8, GemmMatch, match_gemm, plain_gemm
from tuner.core.tvm_api import reorder
from tuner.workloads import Workload

if TYPE_CHECKING:
    from tuner.core.tvm_api import LoopRV, SBlockRV, Schedule, Target

LANES = 4  # fp32 / int32 lanes of a 128-bit NEON register
DOT_K = 4  # bytes per lane that one usdot reduces
UNROLL = Categorical((0, 16, 64), probs=(0.2, 0.4, 0.4),
                     doc="explicit unroll depth (meta_schedule.unroll_explicit)")


def is_aarch64(target: Target) -> bool:
    triple = str(target.attrs.get("mtriple", "") or "")
    return target.kind.name == "llvm" and triple.startswith(("aarch64", "arm64"))


def has_feature(target: Target, feature: str) -> bool:
    from tuner.core.tvm_api import tvm_ffi

    return bool(tvm_ffi.get_global_func("target.llvm_cpu_has_feature")(feature, target))


class _NeonGemm(StructuralTemplate):
    """The register-blocked micro-kernel both AArch64 templates share: the weight packed (by the
    template's `_pack`), then M into [parallel, middle, mr], N/4 into [parallel, middle, nv], the
    reduction into [outer, unrolled], the outer tiles fused and parallel."""

    dtype: str = "float32"  # the GemmMatch.dtype it serves

    @abstractmethod
    def _pack(self, sch: Schedule, blk: SBlockRV, g: GemmMatch) -> None:
        """Read the weight of `blk` through its packed copy (`pack_weight`)."""

    @abstractmethod
    def _why_not_target(self, target: Target, g: GemmMatch) -> str | None:
        """None if the AArch64 `target` has the instructions and `g` their divisibility."""

    def why_not(self, workload: Workload, target: Target) -> str | None:
        g = plain_gemm(workload, self.dtype, self.dtype)
        if isinstance(g, str):
            return g
        if not is_aarch64(target):
            return "not an AArch64 LLVM target"
        return self._why_not_target(target, g)

    def _sample_unroll(self, sch: Schedule) -> None:
        sch.annotate(sch.get_sblock("root"), "meta_schedule.unroll_explicit",
                     self.sample(sch, "unroll"))

    def _micro_kernel(self, sch: Schedule, workload: Workload, *, dot: bool) -> LoopRV:
        """The loop nest; `dot`: K split by DOT_K first (the usdot lanes, returned innermost).
        The GEMM is the workload's first block matched by structure (`match_gemm`: an op spec, or
        a relax task with int64 indices); elementwise blocks after it (bias, activation,
        requantization) fold into the accumulators' write-back."""
        g = match_gemm(workload)
        assert isinstance(g, GemmMatch), g
        blk = sch.get_child_blocks(sch.get_sblock("root"))[g.block]
        self._pack(sch, blk, g)
        self._sample_unroll(sch)
        blocks = sch.get_child_blocks(sch.get_sblock("root"))  # the packing block came first
        blk = blocks[g.block + 1]
        epilogue = fold_epilogue(sch, blocks[g.block + 2:])
        i, j, k = sch.get_loops(blk)
        i0, i1, i2 = self.split(sch, "tile_m", i)
        jo, jl = sch.split(j, [None, LANES])
        j0, j1, j2 = self.split(sch, "tile_n", jo)
        if dot:
            ko, k4 = sch.split(k, [None, DOT_K])
            k0, k1 = self.split(sch, "tile_k", ko)
            reorder(sch, i0, j0, i1, j1, k0, k1, i2, j2, jl, k4)
        else:
            k0, k1 = self.split(sch, "tile_k", k)
            reorder(sch, i0, j0, i1, j1, k0, k1, i2, j2, jl)
        finish_register_tile(sch, blk, parallel=[i0, j0], acc_at=j1, unrolled=[k1, i2, j2],
                             vector=None if dot else jl, k0=k0, lanes=LANES, epilogue=epilogue)
        return jl


# the M split both AArch64 GEMM micro-kernels share
TILE_M = PerfectTile(3, max_innermost=8,
                     doc="M split into [parallel, middle, mr]; mr rows per micro-kernel")


class DenseNeonAarch64(_NeonGemm):
    name = "dense-neon-aarch64"
    target = "AArch64 (NEON)"
    ops = ("dense", "matmul", "tir")
    description = ("AArch64 NEON fp32 micro-kernel: mr x nv*4 accumulators in q registers "
                   "(fmla .4s), weight packed in [N/4, K, 4] panels at compile time, "
                   "parallel outer tiles")
    KNOBS = knob_table(
        tile_m=TILE_M,
        tile_n=PerfectTile(3, max_innermost=4, of="N/4",
                           doc="N/4 vectors split into [parallel, middle, nv]; nv q registers "
                               "per row"),
        tile_k=PerfectTile(2, max_innermost=8, doc="K split into [outer, unrolled inner]"),
        unroll=UNROLL,
    )

    def _why_not_target(self, target: Target, g: GemmMatch) -> str | None:
        if not has_feature(target, "neon"):
            return "the target has no NEON"
        return None if g.n % LANES == 0 else f"N={g.n} is not a multiple of {LANES}"

    def _pack(self, sch: Schedule, blk: SBlockRV, g: GemmMatch) -> None:
        if g.weight_axes.endswith("kj"):  # B[K, N] (matmul)
            pack_weight(sch, blk, g.weight, lambda k, j: (j // LANES, k, j % LANES))
        else:  # W[N, K]
            pack_weight(sch, blk, g.weight, lambda j, k: (j // LANES, k, j % LANES))

    def schedule(self, sch: Schedule, workload: Workload, target: Target) -> None:
        self._micro_kernel(sch, workload, dot=False)


class DenseInt8SdotAarch64(_NeonGemm):
    name = "dense-int8-sdot-aarch64"
    target = "AArch64 with +i8mm"
    ops = ("dense_int8", "tir")
    dtype = INT8
    description = ("AArch64 uint8 x int8 -> int32 dense tensorized with usdot (FEAT_I8MM, the "
                   "exact mixed-sign member of the SDOT family): mr x nv int32x4 accumulators, "
                   "weight packed in [N/4, K/4, 4, 4] tiles at compile time; needs +i8mm")
    KNOBS = knob_table(
        tile_m=TILE_M,
        tile_n=PerfectTile(3, max_innermost=4, of="N/4",
                           doc="N/4 column groups split into [parallel, middle, nv]; nv "
                               "int32x4 accumulators per row"),
        tile_k=PerfectTile(2, max_innermost=8, of="K/4",
                           doc="K/4 usdot steps split into [outer, unrolled inner]"),
        unroll=UNROLL,
    )

    def _why_not_target(self, target: Target, g: GemmMatch) -> str | None:
        if not has_feature(target, "i8mm"):
            return "the target has no i8mm (usdot)"
        if g.n % LANES or g.k % DOT_K:
            return f"N={g.n} is not a multiple of {LANES} or K={g.k} not of {DOT_K}"
        return None

    def _pack(self, sch: Schedule, blk: SBlockRV, g: GemmMatch) -> None:
        if g.weight_axes.endswith("kj"):  # W[K, N] (relax's matmul by a bound weight)
            pack_weight(sch, blk, g.weight,
                        lambda k, j: (j // LANES, k // DOT_K, j % LANES, k % DOT_K))
        else:
            pack_weight(sch, blk, g.weight,
                        lambda j, k: (j // LANES, k // DOT_K, j % LANES, k % DOT_K))

    def schedule(self, sch: Schedule, workload: Workload, target: Target) -> None:
        # the 4x4 dot product (j4, k4) tensorized with usdot; without this step the same loop
        # nest runs on any CPU (how tests/schedules/test_cross.py checks its indexing on x86)
        sch.tensorize(self._micro_kernel(sch, workload, dot=True), use(USDOT_LOCAL_INTRIN))
