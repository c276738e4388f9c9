"""GEMM family on x86 with AVX-512 (fp32): any PrimFunc whose block structure is a GEMM with an
elementwise epilogue (`schedules/match.py`): the op specs matmul, dense (X·Wᵀ), batch_matmul
(A·Bᵀ), and what relax fuses (`fused_matmul_add`, `fused_matmul_add_gelu`, int64 indices, any
names), submitted as `tir`.

The classic register-blocked micro-kernel:

- the weight (B of matmul, W of dense, the second operand of batch_matmul: layout-free buffers,
  i.e. model constants) is packed into [N/16, K, 16] panels by a
  `meta_schedule.layout_rewrite_preproc` block, so each 16-lane vector of the micro-kernel is one
  contiguous zmm load, k steps are 64 bytes apart (no 4 KiB-stride set conflicts in L1), and the
  packing is paid once at compile time (the timed kernel takes the packed weight; relax's
  SplitLayoutRewritePreproc does the same in a pipeline);
- an mr × (nv·16) accumulator tile lives in registers (a `local` cache written back after the
  whole reduction): mr rows broadcast from A/X, nv zmm vectors of the weight per k step;
- the epilogue blocks are folded into one and inlined into the accumulator's write-back: bias,
  residual and activation are applied to the register tile on its way to memory; an erf or tanh
  (GELU) or a sigmoid (SiLU) is instead its own pass over the tile (over the output when M is
  padded), tensorized with a polynomial (TVM calls a scalar libm function per lane), between
  the folded blocks before and after it;
- any shape: N off the 16-lane grid is padded with zero weight columns in the packing (to whole
  vectors, one more where their count leaves only 1-vector micro-kernels: `_padding`), and the
  write-back is predicated. Such a packing is no plain copy, which MetaSchedule's search cannot
  split off, so it is marked for tunefarm's split instead (`tuner.core.prepack`): measured and built
  by tunefarm it too runs once, at compile time (300×1000×300 on a 2-core Xeon: 276 → 315
  GFLOPS); in a pipeline without that split it runs in the kernel. An M with no 4/6/8-row
  divisor (a prime, say) is padded to 8 rows by a copy of x;
- knobs: the tiling of M into [outer, middle, mr], of N/16 into [outer, middle, nv], of K into
  [outer, unroll]; loop order of the middle loops (two design spaces); explicit unroll depth.
  The outer M×N tiles (and the batch) are fused and run in parallel.

The layout never depends on a knob (traces replay with new decisions but fixed layouts).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from schedules.base import (
    StructuralTemplate,
    finish_register_tile,
    fold_epilogue,
    is_x86,
    pack_weight,
    padding_of,
)
from schedules.intrinsics import activation_f32, use
from schedules.knobs import Categorical, DesignSpace, PerfectTile, divides, knob_table
from schedules.match import GemmMatch, match_gemm
from schedules.match_rows import activation_of
from tuner.core.tvm_api import fuse, reorder
from tuner.workloads import Workload

if TYPE_CHECKING:
    from collections.abc import Callable

    from tuner.core.tvm_api import Expr, SBlock, SBlockRV, Schedule, Target, tvm

LANES = 16  # fp32 lanes of a zmm register
# fewer rows than this: the generated space. A GEMV-like GEMM pads its rows to a micro-kernel's
# 8 (2-core Xeon, 64 trials, the template against the generated space: 1×1024×768 35 µs against
# 14, 2×1024×768 35 against 18, 4×1024×768 21 against 26; with N off the grid, 1×1000×768 46
# against 24, 4×1000×768 274 GFLOPS against 165, 16×1000×300 300 against 184)
MIN_ROWS = 4
# activations in an epilogue computed by a polynomial intrinsic (schedules/intrinsics.py) rather
# than one libm call per lane: relax's GELU 128×768→3072 went from 5.9 to 2.7 ms, its tanh form
# 64×256→1024 from 351 to 150 µs (Zen 4, 64 trials). Sigmoid (SiLU) measured no faster on a Zen 4
# (100×300→512: 201 µs with libm's expf, 204 with the intrinsic), where the FMAs bound it; on a
# Zen 5, with twice the FMA throughput, the expf calls did: 115 → 72.5 µs (bench/RESULTS.md Run V)
EPILOGUE_ACTIVATIONS = ("erf", "tanh", "sigmoid")


class GemmX86(StructuralTemplate):
    name = "gemm-x86"
    target = "x86-64 (AVX-512 or AVX2)"
    ops = ("matmul", "dense", "batch_matmul", "tir")
    description = ("register-blocked AVX-512 micro-kernel (mr x nv*16 accumulators), weight packed "
                   "in [N/16, K, 16] panels at compile time, parallel outer tiles")
    KNOBS = knob_table(
        # mr rows x nv vectors of accumulators: 4x4, 8x2, 4x3, ... fit the 32 zmm registers
        mr=Categorical((4, 8, 6, 2), probs=(0.45, 0.3, 0.1, 0.15), fits=divides, fallback=1,
                       doc="rows per micro-kernel (those dividing M)"),
        nv=Categorical((4, 2, 3, 1), probs=(0.35, 0.35, 0.15, 0.15), fits=divides, fallback=1,
                       doc="16-lane vectors per row of the micro-kernel (those dividing N/16)"),
        tile_m=PerfectTile(2, max_innermost=64, of="M/mr",
                           doc="M/mr split into [parallel, middle]"),
        tile_n=PerfectTile(2, max_innermost=64, of="N/16/nv",
                           doc="N/(16 nv) split into [parallel, middle]"),
        unroll_k=Categorical((4, 8, 2, 16), probs=(0.4, 0.3, 0.2, 0.1), fits=divides, fallback=1,
                             doc="K steps unrolled inside the micro-kernel (those dividing K)"),
        order=DesignSpace(("m-outer", "n-outer"), doc="order of the middle M and N loops"),
        unroll=Categorical((0, 16, 64), probs=(0.2, 0.4, 0.4),
                           doc="explicit unroll depth (meta_schedule.unroll_explicit)"),
    )

    def why_not(self, workload: Workload, target: Target) -> str | None:
        g = match_gemm(workload)
        if not isinstance(g, GemmMatch):
            return g.reason
        if g.dtype != "float32":
            return f"a {g.dtype} GEMM, not float32 (an int8 or bf16 template serves it)"
        if not is_x86(target):
            return "not an x86 LLVM target"
        rows = g.m * g.batch_size if g.shared_weight else g.m
        if rows < MIN_ROWS:
            return (f"M={rows} < {MIN_ROWS} rows (a GEMV-like GEMM): padded to a micro-kernel's "
                    "8 rows it is slower than the generated space's kernels")
        return None

    def knob_extents(self, workload: Workload) -> dict[str, int]:
        g = match_gemm(workload)
        assert isinstance(g, GemmMatch)
        pm, pn = _padding(g)
        m = _round_up(g.m, pm)
        return {"mr": m * g.batch_size if g.shared_weight else m,
                "nv": _round_up(g.n, pn) // LANES, "unroll_k": g.k}

    def schedule(self, sch: Schedule, workload: Workload, target: Target, *,
                 order: str) -> None:
        g = match_gemm(workload)
        assert isinstance(g, GemmMatch), g
        root = sch.get_sblock("root")
        blk = sch.get_child_blocks(root)[g.block]
        pm, pn = _padding(g)
        wpad = None
        if (pm, pn) != (1, 1):  # off the grid: padded to it (zero rows of x, columns of w)
            sch.pad_einsum(blk, [1] * g.batch + [pm, pn, 1])
            if pn > 1:  # the padded weight: folded into the packing below
                wpad = padding_of(sch, blk, g.weight)
        pack_weight(sch, blk, g.weight, _panels(g.weight_axes), wpad)
        sch.annotate(root, "meta_schedule.unroll_explicit", self.sample(sch, "unroll"))
        # the blocks looked up again (the packing block came first): stored traces of op specs
        # have these two instructions here
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        at = g.block + 1 if wpad is None and pm == 1 else _position(sch, blocks, blk)
        blk = blocks[at]
        rest = blocks[at + 1:]  # the epilogue; with padding, the unpadding copy first
        # an activation among them (EPILOGUE_ACTIVATIONS; not yet with N padded) is its own
        # block, tensorized over the register tile; the blocks before it fold into one, those
        # after it into another, each a vector pass over the tile
        act = _activation_at(sch, rest) if pn == 1 else None
        staged: list[SBlockRV] = []
        if act is not None:
            before, after = rest[:act], rest[act + 1:]
            for b in [*before[:-1], *after[:-1]]:
                sch.compute_inline(b)
            staged = [*before[-1:], rest[act], *after[-1:]]
        epilogue = fold_epilogue(sch, rest) if act is None else None
        *batch, i, j, k = sch.get_loops(blk)
        if g.shared_weight:  # x[b, m, k] · w[k, n]: batch_size * m rows of one GEMM
            i, batch = fuse(sch, *batch, i), []
        m, n16 = (int(cast("tvm.tirx.IntImm", cast("tvm.tirx.For", sch.get(i)).extent)),
                  int(cast("tvm.tirx.IntImm", cast("tvm.tirx.For", sch.get(j)).extent)) // LANES)
        mr = self.sample(sch, "mr", extent=m)
        nv = self.sample(sch, "nv", extent=n16)
        i_rest, i2 = sch.split(i, [None, mr])
        i0, i1 = self.split(sch, "tile_m", i_rest)
        jo, jl = sch.split(j, [None, LANES])
        j_rest, j2 = sch.split(jo, [None, nv])
        j0, j1 = self.split(sch, "tile_n", j_rest)
        k_extent = cast("tvm.tirx.IntImm", cast("tvm.tirx.For", sch.get(k)).extent)
        k0, k1 = sch.split(k, [None, self.sample(sch, "unroll_k", extent=int(k_extent))])
        middle = [i1, j1] if order == "m-outer" else [j1, i1]
        reorder(sch, *batch, i0, j0, *middle, k0, k1, i2, j2, jl)
        finish_register_tile(sch, blk, parallel=[*batch, i0, j0], acc_at=middle[-1],
                             unrolled=[k1, i2, j2], vector=jl, k0=k0, lanes=LANES,
                             epilogue=epilogue)
        for b in staged:  # all moved first: a tensorized block is no longer a producer
            if pm == 1:
                sch.reverse_compute_at(b, middle[-1], preserve_unit_loops=True)
        for b in staged:
            if pm > 1:  # M padded: under the tile its row predicate would stop `tensorize`, so
                # a parallel pass over the output (relax's GELU 50×384→1536: 0.94 → 0.31 ms)
                sch.parallel(sch.get_loops(b)[0])
            _, lanes = sch.split(sch.get_loops(b)[-1], [None, LANES])
            fn = _activation_fn(sch, b)
            if fn is None:
                sch.vectorize(lanes)
            else:
                sch.tensorize(lanes, use(activation_f32(fn)))


def _padding(g: GemmMatch) -> tuple[int, int]:
    """(multiple of M, multiple of N) the GEMM is padded to: N to whole 16-lane vectors; M to 8
    rows when no micro-kernel height (4, 6, 8) divides it (a prime M would get 1-row kernels).

    N off the grid whose vector count has no factor 2 or 3 (49 for N = 777) would leave only
    1-vector micro-kernels, which load a weight vector and broadcast a row for every FMA: on a
    core with two full 512-bit FMA pipes (Intel) that bounds them by the loads. One more zero
    vector (N to a multiple of 32) lets 2-vector kernels fit: 384×777×512 on a 2-core Xeon,
    best kernels timed side by side, 256 GFLOPS padded to 784, 287 to 800 (279 to 832). On a Zen
    4, whose FMA pipes take a zmm in two halves, Run K measured it neutral (196 against 200).
    From 11 vectors up, so the extra one costs at most 1/11 more columns."""
    rows = g.m * g.batch_size if g.shared_weight else g.m
    pm = 1 if any(rows % d == 0 for d in (4, 6, 8)) or g.shared_weight else 8
    if g.n % LANES == 0:
        return pm, 1
    vectors = _round_up(g.n, LANES) // LANES
    return pm, 2 * LANES if vectors >= 11 and vectors % 2 and vectors % 3 else LANES


def _activation_fn(sch: Schedule, block: SBlockRV) -> str | None:
    """`fn` when the block is `Y[idx] = fn(X[idx])` for an activation with an intrinsic."""
    return activation_of(cast("SBlock", sch.get(block)), EPILOGUE_ACTIVATIONS)


def _activation_at(sch: Schedule, blocks: list[SBlockRV]) -> int | None:
    """The position of the first activation block among the epilogue's blocks, if any."""
    return next((n for n, b in enumerate(blocks) if _activation_fn(sch, b)), None)


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def _position(sch: Schedule, blocks: list[SBlockRV], blk: SBlockRV) -> int:
    target = sch.get(blk)
    return next(n for n, b in enumerate(blocks)
                if cast("SBlock", sch.get(b)).same_as(target))


def _panels(axes: str) -> Callable[..., tuple[Expr, ...]]:
    """The index map packing a weight whose dims are `axes` ("kj", "jk", "bjk", ...) into
    [*batch, N/16, K, 16] panels."""
    jpos, kpos = axes.index("j"), axes.index("k")
    bpos = [p for p, c in enumerate(axes) if c == "b"]

    def panels(*idx: tvm.tirx.Var) -> tuple[Expr, ...]:
        return (*(idx[p] for p in bpos), idx[jpos] // LANES, idx[kpos], idx[jpos] % LANES)

    return panels
